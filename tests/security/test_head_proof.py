"""A client proves its local head holds the cluster token before it sends the head anything
secret: a port taken by something else (another user's head, any server) gets no token, and
the client says what holds it."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from burla.config import ENV_BACKGROUND_HEAD, ENV_CONFIG_DIR, ENV_HEAD_URL, ENV_TOKEN, HeadRecord
from burla.web import head_proof
from tests.conftest import REPO
from tests.support.helpers import PRELUDE

TOKEN = "the-users-cluster-token"


class _Impostor(http.server.BaseHTTPRequestHandler):
    """Answers every request as a healthy head would, without the token; keeps what it was sent."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.requestline + "\n" + str(self.headers))
        body = b'{"ok": true, "version": "0.0.0"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def impostor() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (_Impostor,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _client(env: dict[str, str]) -> subprocess.CompletedProcess:
    script = PRELUDE + "print(remote_parallel_map(functions.double, [1], spinner=False))\n"
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_a_recorded_head_whose_port_another_process_took_gets_no_token(impostor, tmp_path):
    url, seen = impostor
    config = tmp_path / "config"
    config.mkdir()
    HeadRecord(url, os.getpid()).write(config)  # the head this directory recorded died; its port is taken
    done = _client({**os.environ, ENV_CONFIG_DIR: str(config), ENV_HEAD_URL: "", ENV_TOKEN: TOKEN,
                    ENV_BACKGROUND_HEAD: "1"})
    assert done.returncode != 0
    assert "HeadNotVerified" in done.stderr and url in done.stderr and "nothing secret was sent" in done.stderr
    assert f"held by pid {os.getpid()}" in done.stderr  # what holds the port, as this machine tells
    assert seen and all(TOKEN not in request for request in seen)
    assert all(request.startswith("GET /health?nonce=") for request in seen)  # the challenge, and nothing else


def test_a_loopback_head_url_that_cannot_prove_the_token_gets_none(impostor, tmp_path):
    url, seen = impostor
    done = _client({**os.environ, ENV_CONFIG_DIR: str(tmp_path / "config"), ENV_HEAD_URL: url, ENV_TOKEN: TOKEN})
    assert done.returncode != 0 and "HeadNotVerified" in done.stderr
    assert seen and all(TOKEN not in request for request in seen)


def test_a_head_answers_the_challenge_only_with_its_own_token(cluster):
    import json
    import urllib.request

    nonce = head_proof.new_nonce()
    with urllib.request.urlopen(f"{cluster.url}/health?nonce={nonce}", timeout=30) as response:
        answer = json.loads(response.read())["proof"]
    assert head_proof.proves(cluster.token, nonce, answer)
    assert not head_proof.proves("another-token", nonce, answer)
    assert not head_proof.proves(cluster.token, head_proof.new_nonce(), answer)  # bound to its nonce
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{cluster.url}/health?nonce={'a' * 500}", timeout=30)
    assert refused.value.code == 400
    refused.value.close()
