"""Signed dashboard links and sessions: only the token's holder makes them, each for one path,
until it expires."""

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
    for garbage in ("", ".", "x.y", "1.", "9" * 40 + ".abc", "1000.\udcff"):
        assert check_link_code("token", "/jobs/a", garbage, now=0.0) is None


def test_sessions_are_signed_and_expire():
    sessions = SignedSessions("token")
    value = sessions.new(now=0.0)
    assert sessions.valid(value, now=SESSION_TTL_S - 1)
    assert not sessions.valid(value, now=SESSION_TTL_S + 1)
    assert not SignedSessions("other-token").valid(value, now=0.0)
    expires, nonce, signature = value.split(".")
    assert not sessions.valid(f"{expires}.{nonce}x.{signature}", now=0.0)
    for garbage in (None, "", "..", "1.a.", "x" * 500):
        assert not sessions.valid(garbage, now=0.0)


def test_a_link_is_taken_once_per_head():
    sessions = Sessions("token")
    code = link_code("token", "/jobs/a")
    session = sessions.redeem_link("/jobs/a", code)
    assert session is not None and sessions.valid(session)
    assert sessions.redeem_link("/jobs/a", code) is None
    assert sessions.redeem_link("/jobs/b", link_code("token", "/jobs/a")) is None
