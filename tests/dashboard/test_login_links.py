"""Signed dashboard links and sessions: only the token's holder makes them, each for one path,
until it expires; a job's link opens that job's read-only session, as often as it is opened."""

from __future__ import annotations

from burla.web.auth import Sessions
from burla.web.login_links import LINK_TTL_S, SESSION_TTL_S, SignedSessions, check_link_code, link_code


def test_a_link_code_opens_only_its_path_until_it_expires():
    code = link_code("token", "/jobs/a", now=1000.0)
    assert check_link_code("token", "/jobs/a", code, now=1000.0 + LINK_TTL_S - 1)
    assert check_link_code("token", "/jobs/a", code, now=1000.0 + LINK_TTL_S + 1) is None  # expired
    assert check_link_code("token", "/jobs/b", code, now=1000.0) is None  # another page
    assert check_link_code("other-token", "/jobs/a", code, now=1000.0) is None  # another cluster
    expires, _, signature = code.partition(".")
    assert check_link_code("token", "/jobs/a", f"{int(expires) + 3600}.{signature}", now=1000.0) is None
    for garbage in ("", ".", "x.y", "1.", "9" * 40 + ".abc", "1000.\udcff", "².x"):
        assert check_link_code("token", "/jobs/a", garbage, now=0.0) is None
    for spelling in (f"0{expires}", f"+{expires}", "".join(chr(ord(c) + 0xFF10 - 48) for c in expires)):
        assert check_link_code("token", "/jobs/a", f"{spelling}.{signature}", now=1000.0) is None  # canonical only


def test_sessions_are_signed_and_expire():
    sessions = SignedSessions("token")
    value = sessions.new(now=0.0)
    assert sessions.valid(value, now=SESSION_TTL_S - 1)
    assert not sessions.valid(value, now=SESSION_TTL_S + 1)
    assert not SignedSessions("other-token").valid(value, now=0.0)
    expires, nonce, signature = value.split(".")
    assert not sessions.valid(f"{expires}.{nonce}x.{signature}", now=0.0)
    for garbage in (None, "", "..", "1.a.", "x" * 500, "².x.y", f"0{expires}.{nonce}.{signature}"):
        assert not sessions.valid(garbage, now=0.0)
    job = sessions.new(now=0.0, job_id="job-1.x")
    assert sessions.session(job, now=0.0).job_id == "job-1.x" and sessions.session(value, now=0.0).job_id is None
    expires, nonce, scope, signature = job.split(".")
    assert sessions.session(f"{expires}.{nonce}.{signature}", now=0.0) is None  # the scope can't be cut off


def test_a_jobs_link_opens_that_jobs_session_until_it_expires_as_often_as_it_is_opened():
    sessions = Sessions("token")
    code = link_code("token", "/jobs/a")
    first, second = sessions.redeem_link("/jobs/a", code, "a"), sessions.redeem_link("/jobs/a", code, "a")
    assert first and second and sessions.session(first).job_id == "a" and sessions.session(second).job_id == "a"
    assert sessions.redeem_link("/jobs/b", code, "b") is None  # another job's page
