"""Small helpers the test modules share."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator

# A client script's opening: test helpers are pickled by value, like a user's __main__.
PRELUDE = (
    "import cloudpickle\n"
    "from burla import remote_parallel_map\n"
    "from tests import functions\n"
    "cloudpickle.register_pickle_by_value(functions)\n"
)


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


def use_head(monkeypatch, head) -> None:
    """Point this test process's burla client at `head` (has .url, .token, .config_dir)."""
    from burla.config import ENV_CONFIG_DIR, ENV_HEAD_URL, ENV_TOKEN

    monkeypatch.setenv(ENV_HEAD_URL, head.url)
    monkeypatch.setenv(ENV_TOKEN, head.token)
    monkeypatch.setenv(ENV_CONFIG_DIR, str(head.config_dir))


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set (or, with None, unset) environment variables for the block, then restore them."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value



def client_env(head) -> dict[str, str]:
    return dict(os.environ, BURLA_CLUSTER_DASHBOARD_URL=head.url, BURLA_CLUSTER_TOKEN=head.token,
                BURLA_CONFIG_DIR=str(head.config_dir))


def start_client(python, head, script: str, cwd) -> subprocess.Popen:
    """Run a client script with `python` (a user's environment) against `head`; it prints JSON lines."""
    import textwrap

    return subprocess.Popen([str(python), "-c", textwrap.dedent(script)], env=client_env(head), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_client(client: subprocess.Popen, timeout: float = 200) -> list:
    """The JSON lines a client script printed, once it exits successfully."""
    out, err = client.communicate(timeout=timeout)
    assert client.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def run_client_in(python, head, script: str, cwd, timeout: float = 200) -> list:
    return finish_client(start_client(python, head, script, cwd), timeout)
