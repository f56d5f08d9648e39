"""Small helpers the test modules share."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

# A client script's opening: test helpers are pickled by value, like a user's __main__.
PRELUDE = (
    "import cloudpickle\n"
    "from burla import remote_parallel_map\n"
    "from tests.support import functions\n"
    "cloudpickle.register_pickle_by_value(functions)\n"
)


def require_openssh() -> None:
    """Tests of tunnels carried by OpenSSH's client skip without one, with a reason; where CI sets
    BURLA_REQUIRE_OPENSSH=1 (it installs openssh-client) a missing client is a failure."""
    if shutil.which("ssh") is not None:
        return
    if os.environ.get("BURLA_REQUIRE_OPENSSH") == "1":
        pytest.fail("these tests need OpenSSH's client: apt-get install -y openssh-client")
    pytest.skip("no ssh program; `apt-get install -y openssh-client` runs these")


def wait_until(predicate: Callable[[], object], timeout: float = 60.0, what: str = "condition") -> None:
    """Poll until `predicate()` is true; generous deadlines, never a bare sleep in a test."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        time.sleep(0.05)


def get_json(head, path: str) -> dict:
    """GET a head endpoint with the head's token (`head` has .url and .token)."""
    request = urllib.request.Request(head.url + path, headers={"Authorization": f"Bearer {head.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def post_json(head, path: str, body: dict) -> dict:
    """POST JSON to a head endpoint with the head's token."""
    request = urllib.request.Request(head.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {head.token}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def client_env(head) -> dict[str, str]:
    """The environment of a client subprocess that uses `head` (has .url, .token and .config_dir)."""
    return dict(os.environ, BURLA_CLUSTER_DASHBOARD_URL=head.url, BURLA_CLUSTER_TOKEN=head.token,
                BURLA_CONFIG_DIR=str(head.config_dir))


def start_client(python, head, script: str, cwd) -> subprocess.Popen:
    """Run a client script with `python` (a user's environment) against `head`; it prints JSON lines."""
    import textwrap

    return subprocess.Popen([str(python), "-c", textwrap.dedent(script)], env=client_env(head), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_grow_job(python, head, cwd, n: int) -> subprocess.Popen:
    """A client job of `n` calls with grow=True: it prints its results as one JSON line."""
    return start_client(python, head, f"""
        import json
        from burla import remote_parallel_map
        print(json.dumps(remote_parallel_map(abs, [-i for i in range({n})], grow=True, spinner=False)))
    """, cwd)


def start_gpu_job(python, head, cwd, gpu: str) -> subprocess.Popen:
    """A client job of one call with func_gpu and grow=True: it prints the GPUs its call saw
    (CUDA_VISIBLE_DEVICES) as one JSON line."""
    return start_client(python, head, f"""
        import json, os
        from burla import remote_parallel_map
        seen = remote_parallel_map(lambda x: os.environ.get("CUDA_VISIBLE_DEVICES"), [0], func_gpu={gpu!r},
                                   grow=True, spinner=False)
        print(json.dumps(seen))
    """, cwd)


def finish_client(client: subprocess.Popen, timeout: float = 200) -> list:
    """The JSON lines a client script printed, once it exits successfully."""
    out, err = client.communicate(timeout=timeout)
    assert client.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def run_client_in(python, head, script: str, cwd, timeout: float = 200) -> list:
    return finish_client(start_client(python, head, script, cwd), timeout)


REPO = Path(__file__).resolve().parents[2]
DETACHED = re.compile(r"Done uploading inputs! Job (\S+) runs on")
# A client process that freezes as it says its inputs are up (its stderr, then SIGSTOP), before it
# could go on to collect; start_detached then kills it.
WALKS_AWAY = (
    "import os, re, signal, sys\n"
    "class _WalksAway:\n"
    f"    said = re.compile({DETACHED.pattern!r})\n"
    "    def __init__(self, stream):\n"
    "        self._stream, self._pending = stream, ''\n"
    "    def write(self, text):\n"
    "        written = self._stream.write(text)\n"
    "        *lines, self._pending = (self._pending + text).split('\\n')\n"
    "        if any(self.said.search(line) for line in lines):  # that line is whole\n"
    "            self._stream.flush()\n"
    "            os.kill(os.getpid(), signal.SIGSTOP)\n"
    "        return written\n"
    "    def __getattr__(self, name):\n"
    "        return getattr(self._stream, name)\n"
    "sys.stderr = _WalksAway(sys.stderr)\n"
)


def start_detached(call: str, env: dict[str, str], timeout: float = 120) -> str:
    """Run `remote_parallel_map(..., detach=True)` (the expression `call`, after PRELUDE) in a client
    process, and kill that process as soon as it says its inputs are up, as a user who walks
    away would; returns the job's id, read from that message. The process stops itself (SIGSTOP)
    as it writes that message: a process that stays collects the results itself, and a short job's
    would be collected in the moment before the kill lands."""
    import sys

    script = PRELUDE + WALKS_AWAY + f"{call}\n"
    client = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ, **env), cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    # A client that stopped without saying so would leave readline waiting: killed, its pipe ends.
    watchdog = threading.Timer(timeout, client.kill)
    watchdog.start()
    try:
        assert client.stderr is not None
        while time.monotonic() < deadline:
            line = client.stderr.readline()
            if not line:
                break
            lines.append(line)
            found = DETACHED.search(line)
            if found:
                return found.group(1)
        raise AssertionError("the client never said its inputs were up:\n" + "".join(lines))
    finally:
        watchdog.cancel()
        client.kill()
        client.wait(60)
        if client.stderr is not None:
            client.stderr.close()


def result_value(ok: bool | int, payload: object) -> object:
    """A successful result's value as a client takes it: the value itself (VALUE), or its pickle
    unpickled (True). The head never unpickles: this lives with the tests, not in burla.protocol."""
    import pickle

    from burla.protocol.values.inline_values import VALUE

    if ok is True:
        return pickle.loads(payload)  # type: ignore[arg-type]
    if type(ok) is int and ok == VALUE:
        return payload
    raise ValueError(f"not a successful result's ok-code: {ok!r}")
