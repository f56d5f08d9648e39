"""The head and nodes hold up against hostile jobs, clients and token holders."""

from __future__ import annotations

import ast
import base64
import http.client
import json
import os
import urllib.parse
from pathlib import Path

import pytest

from burla import RemoteError, remote_parallel_map
from tests import functions
from tests.conftest import own_head
from tests.helpers import get_json

HEAD_PACKAGE = Path(__file__).resolve().parent.parent / "burla" / "head"
PICKLE_MODULES = {"pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib", "burla.serialization"}
LOADERS = {"loads", "load", "Unpickler"}


def test_no_module_of_the_head_can_unpickle():
    offences = []
    for path in sorted(HEAD_PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                offences += [f"{path.name}: import {a.name}" for a in node.names if a.name in PICKLE_MODULES]
            elif isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                names = {a.name for a in node.names}
                if module in PICKLE_MODULES or module.endswith(".serialization") or names & LOADERS \
                        or names & {"serialization", "pickle"}:
                    offences.append(f"{path.name}: from {module} import {', '.join(sorted(names))}")
    assert not offences, offences


def test_a_failure_payload_that_is_a_pickle_runs_nowhere(tmp_path, monkeypatch):
    # Fails on the code before typed error records: the head's history unpickled every failure.
    marker = tmp_path / "loaded-by"
    with own_head(tmp_path, monkeypatch) as head:
        with pytest.raises(RemoteError, match="could not be read"):
            remote_parallel_map(functions.fail_with_a_planted_pickle, [str(marker)], spinner=False)
        [job] = get_json(head, "/v1/jobs")["jobs"]
        errors = get_json(head, f"/v1/jobs/{job['job_id']}/failures")["failures"]
        assert errors and errors[0]["exception_type"] == "unknown"
    assert not marker.exists(), f"code ran in pid {marker.read_text()}"


# --- who may call: tokens, cookies, origins --------------------------------------------------


def _request(url: str, method: str = "GET", path: str = "/", headers: dict | None = None,
             body: bytes | None = None) -> tuple[int, dict, bytes]:
    """One raw HTTP request (header values go out as the bytes given, latin-1)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _session_cookie(head) -> str:
    status, _, body = _request(head.url, "POST", "/v1/login-link?next=/jobs",
                               {"Authorization": f"Bearer {head.token}"}, b"{}")
    assert status == 200, body
    login = urllib.parse.urlsplit(json.loads(body)["url"])
    status, headers, _ = _request(head.url, "GET", f"{login.path}?{login.query}")
    assert status == 302 and headers["location"] == "/jobs"
    return headers["set-cookie"].split(";", 1)[0]


def test_an_authorization_header_that_is_not_utf8_is_a_401_not_a_500(cluster):
    # Fails on the previous code: encoding the surrogate-escaped header raised inside the middleware.
    [node] = get_json(cluster, "/v1/cluster")["nodes"]
    for base in (cluster.url, node["url"]):
        for value in ("Bearer \xff", "Bearer \xc3\x28", "\xff\xfe"):
            status, _, body = _request(base, "GET", "/v1/state" if base != cluster.url else "/v1/cluster",
                                       {"Authorization": value})
            assert status == 401 and json.loads(body)["error"] == "Unauthorized", (base, value, body)


def test_a_session_cookie_reads_but_only_the_heads_own_pages_can_write(cluster):
    # Fails on the previous code: any page could POST with the cookie, and open a WebSocket with it.
    cookie = _session_cookie(cluster)
    own_origin = cluster.url
    assert _request(cluster.url, "GET", "/v1/cluster", {"Cookie": cookie})[0] == 200
    assert _request(cluster.url, "GET", "/jobs", {"Cookie": cookie})[0] == 200
    settings = json.dumps({"quantity": 0}).encode()
    refused = [
        {"Cookie": cookie},  # a plain form POST from anywhere
        {"Cookie": cookie, "Origin": own_origin},  # no CSRF header
        {"Cookie": cookie, "X-Burla-CSRF": "1", "Origin": "http://127.0.0.1:1"},  # another port, same host
        {"Cookie": cookie, "X-Burla-CSRF": "1"},  # no Origin at all
    ]
    for headers in refused:
        status, _, body = _request(cluster.url, "POST", "/v1/shutdown", headers, b"{}")
        assert status == 403 and b"X-Burla-CSRF" in body, (headers, body)
        status, _, body = _request(cluster.url, "POST", "/v1/settings", {**headers, "Content-Type": "application/json"},
                                   settings)
        assert status == 403, (headers, body)
    allowed = {"Cookie": cookie, "X-Burla-CSRF": "1", "Origin": own_origin, "Content-Type": "application/json"}
    status, _, body = _request(cluster.url, "POST", "/v1/settings", allowed, json.dumps({}).encode())
    assert status == 200, body
    upgrade = {"Cookie": cookie, "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(), "Origin": own_origin}
    for path in ("/v1/jobs/ws", "/v1/nodes/ws"):
        status, _, body = _request(cluster.url, "GET", path, upgrade)
        assert status == 403 and b"WebSocket" in body, (path, body)
    assert get_json(cluster, "/health")["ok"]  # and the head is still up


@pytest.mark.parametrize("target", ["/%09/evil.example", "/%0a/evil.example", "/%5Cevil.example",
                                    "//evil.example", "https://evil.example", "/\\evil.example"])
def test_redirects_after_login_stay_on_the_head(cluster, target):
    # Fails on the previous code for tab and newline: browsers strip them, making //evil.example.
    status, _, body = _request(cluster.url, "POST", f"/v1/login-link?next={target}",
                               {"Authorization": f"Bearer {cluster.token}"}, b"{}")
    assert status == 400 and b"next must be a path" in body
    status, _, body = _request(cluster.url, "POST", "/v1/login-link", {"Authorization": f"Bearer {cluster.token}"}, b"{}")
    login = urllib.parse.urlsplit(json.loads(body)["url"])
    code = urllib.parse.parse_qs(login.query)["code"][0]
    status, headers, _ = _request(cluster.url, "GET", f"/login?code={code}&next={target}")
    assert status == 302 and headers["location"] == "/"
