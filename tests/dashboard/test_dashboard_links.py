"""Links that mean what they say, against a real head: a job's printed link opens that job and its
nested jobs read-only, as often as it is opened until it expires, and nothing else; a full
session comes only from `burla dashboard`'s one-time code, which no restart and no other spelling
brings back; a malformed cookie or link is a 401, never a 500."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest

from burla.web.login_links import link_code
from tests.conftest import REPO, run_client, start_head, wait_for_nodes
from tests.support.helpers import PRELUDE


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # the 302 and its Set-Cookie are what the tests read
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _get(url: str, cookie: str | None = None, method: str = "GET", headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None,
                                     headers={**({"Cookie": f"burla_session={cookie}"} if cookie else {}),
                                              **(headers or {})})
    try:
        with _OPENER.open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def _session_from(url: str) -> str | None:
    """The session cookie a sign-in link sets (None: refused)."""
    status, headers, _ = _get(url)
    if status != 302:
        return None
    return re.search(r"burla_session=([^;]+)", headers["Set-Cookie"]).group(1)


def _full_link(head) -> str:
    request = urllib.request.Request(f"{head.url}/v1/login-link?next=/", data=b"{}", method="POST",
                                     headers=head.headers())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["url"]


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    """A head with a finished parent job (one call that opened a nested job) and another job."""
    config_dir = tmp_path_factory.mktemp("links") / "config"
    head = start_head(config_dir, workers=2)
    try:
        wait_for_nodes(head, 1)
        done = run_client(PRELUDE + "print(remote_parallel_map(functions.nested_sum, [3], spinner=False))\n"
                          "print(remote_parallel_map(functions.double, [1], spinner=False))\n", head.env())
        assert done.returncode == 0, done.stderr
        links = re.findall(r"\[burla\] job (\S+): (\S+)", done.stderr)
        (parent, _), (other, _) = links[0], links[-1]  # the nested job's link is printed in between
        request = urllib.request.Request(f"{head.url}/v1/jobs?limit=50", headers=head.headers())
        with urllib.request.urlopen(request, timeout=10) as response:
            [child] = [j["job_id"] for j in json.load(response)["jobs"] if j.get("parent_job_id") == parent]
        yield head, dict(links)[parent], parent, child, other
    finally:
        head.stop()


def test_a_jobs_link_opens_that_job_and_its_nested_jobs_read_only_as_often_as_needed(nested):
    head, link, parent, child, other = nested
    first, second = _session_from(link), _session_from(link)  # opened twice: both sign in
    assert first and second
    for path in (f"/jobs/{parent}", f"/v1/jobs/{parent}", f"/v1/jobs/{child}", f"/v1/jobs/{child}/calls",
                 f"/jobs/{child}", f"/v1/jobs/{parent}/output?search=x", "/static/app.js"):
        status, _, body = _get(head.url + path, first)
        assert status == 200, (path, body)
    for path in (f"/v1/jobs/{other}", "/v1/jobs", "/v1/settings", "/v1/cluster", "/v1/nodes/n/events", "/v1/usage"):
        status, _, body = _get(head.url + path, first)
        assert status == 403 and f"reads job {parent}" in body, (path, status, body)
    assert _get(f"{head.url}/settings", first)[0] == 401  # a page beyond the job: how to sign in
    writes = {"X-Burla-CSRF": "1", "Origin": head.url, "Content-Type": "application/json"}
    for path in (f"/v1/jobs/{parent}/cancel", "/v1/settings", "/v1/cluster/stop", "/v1/login-link"):
        assert _get(head.url + path, first, "POST", writes)[0] == 403, path


def test_a_full_session_link_opens_once_in_one_spelling_and_not_after_a_restart(tmp_path):
    config_dir = tmp_path / "config"
    head = start_head(config_dir, workers=1)
    try:
        link = _full_link(head)
        session = _session_from(link)
        assert session and _get(f"{head.url}/v1/settings", session)[0] == 200  # a full session
        assert _session_from(link) is None  # once
        unused = _full_link(head)
        head.stop()
        head = start_head(config_dir, workers=1)  # same token: sessions hold, codes do not
        assert _get(f"{head.url}/v1/settings", session)[0] == 200
        assert _session_from(link.replace(link.split("/login")[0], head.url)) is None
        assert _session_from(unused.replace(unused.split("/login")[0], head.url)) is None
        # A job's link, in any other spelling of its expiry, opens nothing.
        code = link_code(head.token, "/jobs/some-job")
        expires, _, signature = code.partition(".")
        fullwidth = "".join(chr(ord(c) - ord("0") + 0xFF10) for c in expires)
        arabic = "".join(chr(ord(c) - ord("0") + 0x0660) for c in expires)
        for spelling in (f"0{expires}", f"00{expires}", f"+{expires}", f" {expires}", fullwidth, arabic,
                         f"{expires}.0"):
            quoted = urllib.parse.quote(f"{spelling}.{signature}")
            status, _, body = _get(f"{head.url}/jobs/some-job?login={quoted}")
            assert status == 401 and "Set-Cookie" not in body, spelling
        assert _session_from(f"{head.url}/jobs/some-job?login={code}")  # the canonical one does
    finally:
        head.stop()


def test_malformed_cookies_and_links_are_401_never_500(nested):
    head = nested[0]
    for cookie in ("².x.y", "1.x", "9" * 13 + ".n.s", "1e9.n.s", "٣٣٣٣٣٣٣٣٣٣.n.s", "..", "x" * 5000, "1.n.@@@.s"):
        for path in ("/v1/jobs", "/jobs", "/"):
            status, _, body = _get(head.url + path, urllib.parse.quote(cookie))
            assert status == 401, (cookie, path, status, body[:200])
    for code in ("².x", "1.", ".", "٣.x", "\udcff"):
        status, _, _ = _get(f"{head.url}/jobs/x?login={urllib.parse.quote(code, errors='surrogatepass')}")
        assert status == 401, code
    assert "Traceback" not in head.log()


def test_a_scripts_job_link_keeps_opening_after_the_script_ends(tmp_path):
    # Fails on the previous code: a script with no head running started one that died with it, so
    # the link it printed led nowhere once it ended.
    from burla.config import ENV_BACKGROUND_HEAD, ENV_CONFIG_DIR, ENV_HEAD_URL, ENV_TOKEN, HeadRecord

    config_dir = tmp_path / "config"
    env = {ENV_CONFIG_DIR: str(config_dir), ENV_HEAD_URL: "", ENV_TOKEN: "", ENV_BACKGROUND_HEAD: "1"}
    done = run_client(PRELUDE + "print(remote_parallel_map(functions.double, [3], spinner=False))\n", env)
    try:
        assert done.returncode == 0 and "[6]" in done.stdout, done.stderr
        assert "started a background head" in done.stderr and "burla head stop" in done.stderr
        [(job_id, link)] = re.findall(r"\[burla\] job (\S+): (\S+)", done.stderr)
        record = HeadRecord.read(config_dir)
        assert record is not None and link.startswith(record.url)
        for _ in range(2):  # the script is gone; its link opens the job, as often as needed
            session = _session_from(link)
            assert session and _get(f"{record.url}/v1/jobs/{job_id}", session)[0] == 200
        again = run_client(PRELUDE + "print(remote_parallel_map(functions.double, [4], spinner=False))\n", env)
        assert "[8]" in again.stdout and "started a background head" not in again.stderr  # the same head, warm
    finally:
        subprocess.run([sys.executable, "-m", "burla", "head", "stop"], env={**os.environ, **env}, cwd=REPO,
                       capture_output=True, timeout=400)


def test_scripts_started_together_share_one_background_head(tmp_path):
    """Three first scripts at once, with no token yet: one starts the head, all agree on its token."""
    from burla.config import ENV_BACKGROUND_HEAD, ENV_CONFIG_DIR, ENV_HEAD_URL, ENV_TOKEN, HeadRecord

    config_dir = tmp_path / "config"
    env = {**os.environ, ENV_CONFIG_DIR: str(config_dir), ENV_HEAD_URL: "", ENV_TOKEN: "", ENV_BACKGROUND_HEAD: "1"}
    script = PRELUDE + "print(remote_parallel_map(functions.double, [5], spinner=False))\n"
    clients = [subprocess.Popen([sys.executable, "-c", script], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        outputs = [client.communicate(timeout=120) for client in clients]
        assert all("[10]" in out for out, _ in outputs), "\n---\n".join(out + err for out, err in outputs)
        assert sum("started a background head" in err for _, err in outputs) == 1  # the others found it
        assert HeadRecord.read(config_dir) is not None
    finally:
        subprocess.run([sys.executable, "-m", "burla", "head", "stop"], env=env, cwd=REPO, capture_output=True,
                       timeout=400)
