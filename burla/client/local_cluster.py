"""Finding a head for the client: the configured one, a running local one, or a new one.

Order: `BURLA_CLUSTER_DASHBOARD_URL`; else a long-lived head this machine advertises in the
config directory (started by `burla head serve`, `get_cluster_dashboard_url()` or an earlier
script) if it answers; else a new background head with one local node, which outlives this
process so its job links keep working (one at a time: a lock in the config directory); or, with
`BURLA_BACKGROUND_HEAD=0`, an embedded head started for this job and stopped after.
"""

from __future__ import annotations

import atexit
import os
import select
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from burla.client import head_check
from burla.config import ENV_CONFIG_DIR, ENV_TOKEN, ClientSettings, HeadRecord, load_or_create_token, private_dir
from burla.drivers.registry import BY_CLOUD
from burla.errors import DetachRequiresDeployedCluster, HeadUnreachable, InvalidArgument, Unauthorized
from burla.process.hardening import refuse_inspection
from burla.web import head_proof

HEAD_START_TIMEOUT_S = 60.0
HEAD_STOP_WAIT_S = 10.0


@dataclass
class ClusterHandle:
    url: str
    token: str
    cert: str | None = None  # the head's pinned certificate (https heads with a self-signed one)
    embedded: EmbeddedHead | None = None  # set when this process started the head for one job

    def close(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()


class EmbeddedHead:
    """A head this client started; it stops when `stop()` closes its lifeline (or we exit).

    A head that booted cloud VMs deletes them as it stops, which can take minutes: it runs in a
    session of its own and is left to finish (it exits by itself), never killed at the client's
    exit, so the script's end does not leave VMs billed."""

    def __init__(self, process: subprocess.Popen, lifeline_fd: int | None, log_path: Path,
                 outlives_client: bool = False) -> None:
        self.process = process
        self._lifeline_fd = lifeline_fd
        self.log_path = log_path
        self.outlives_client = outlives_client

    def stop(self) -> None:
        if self._lifeline_fd is not None:
            os.close(self._lifeline_fd)
            self._lifeline_fd = None
            if self.outlives_client:
                return
            # Reap it at exit rather than now: the caller has its results already.
            if not _stopping_heads:
                atexit.register(_reap_stopping_heads)
            _stopping_heads.append(self.process)


_stopping_heads: list[subprocess.Popen] = []


def _reap_stopping_heads() -> None:
    for process in _stopping_heads:
        try:
            process.wait(HEAD_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    _stopping_heads.clear()


def head_is_healthy(url: str, timeout: float = 1.0, cert: str | None = None, token: str | None = None) -> bool:
    """Whether a head answers at `url`. With `token`, it must also prove it holds that token
    (client/head_check.py): raises HeadNotVerified if something answers without the proof."""
    import http.client  # here: a cold client that starts its own head never asks

    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or "127.0.0.1"
    nonce = head_proof.new_nonce()
    connection: http.client.HTTPConnection | None = None
    try:
        if parsed.scheme == "https":
            from burla.web.tls import client_context

            connection = http.client.HTTPSConnection(host, parsed.port, timeout=timeout, context=client_context(cert))
        else:
            connection = http.client.HTTPConnection(host, parsed.port, timeout=timeout)
        connection.request("GET", "/health" if token is None else head_check.challenge_path(token, nonce))
        response = connection.getresponse()
        body = response.read(4096)
    except (OSError, http.client.HTTPException):
        return False  # nothing answers there
    finally:
        if connection is not None:
            connection.close()
    if token is not None:
        head_check.check_answer(url, token, nonce, response.status, body)
    return response.status == 200


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


HEALTHY_FOR_S = 5.0  # a local head that answered /health this recently, and still runs, is not asked again
_last_healthy: dict[tuple[str, int, str], float] = {}


def running_local_head(settings: ClientSettings, token: str) -> str | None:
    """The URL of the long-lived head the config directory records, if it runs and proves it
    holds `token`; None if none runs. Raises HeadNotVerified if its port answers without proof."""
    record = HeadRecord.read(settings.config_dir)
    if record is None or not _pid_alive(record.pid):
        return None
    key = (record.url, record.pid, token)
    if time.monotonic() - _last_healthy.get(key, -HEALTHY_FOR_S) < HEALTHY_FOR_S:
        return record.url  # back-to-back jobs: its process is still there, skip the round trip
    if not head_is_healthy(record.url, cert=settings.head_cert, token=token):
        return None
    _last_healthy[key] = time.monotonic()
    return record.url


def connect(settings: ClientSettings, allow_embedded: bool = True,
            meanwhile: Callable[[], None] = lambda: None) -> ClusterHandle:
    """The cluster this job should run on, starting an embedded one if there is none.

    `meanwhile` (and the import of the HTTP client, on the client loop) runs while an embedded
    head starts, not before: on two cores, work that competes with the head's start delays it."""

    refuse_inspection()  # this process is about to hold a cluster token: calls of its user can't read it

    def prepare() -> None:
        from burla.client.loop import client_loop  # here: asyncio's import would delay a cold head's start

        client_loop().prepare(settings.head_cert)
        meanwhile()

    if settings.head_url:
        prepare()
        if not settings.token:
            raise Unauthorized(
                f"{settings.head_url} needs the cluster token: set BURLA_CLUSTER_TOKEN or put it in "
                f"{settings.config_dir / 'cluster_token'}."
            )
        return ClusterHandle(settings.head_url, settings.token, settings.head_cert)
    token = settings.token or load_or_create_token(settings.config_dir)
    url = running_local_head(settings, token)
    if url is not None:
        prepare()
        return ClusterHandle(url, token, settings.head_cert)
    if settings.background_head:
        return background_head(settings, token, meanwhile=prepare)
    if not allow_embedded:
        raise DetachRequiresDeployedCluster(
            "detach=True needs a head that outlives this process, and BURLA_BACKGROUND_HEAD=0 (or "
            "`burla config set background_head false`) keeps heads to their script. Start one with "
            "`python -c \"import burla; print(burla.get_cluster_dashboard_url())\"` or "
            "`burla head serve --local-nodes 1`, or point BURLA_CLUSTER_DASHBOARD_URL at a deployed head."
        )
    return start_head(settings, token, embedded=True, meanwhile=prepare)


BACKGROUND_IDLE_S = 600  # a background head's local node goes after this long without a job (it comes back for one)


def background_head(settings: ClientSettings, token: str,
                    meanwhile: Callable[[], None] = lambda: None) -> ClusterHandle:
    """This machine's background head: the running one, or one started now. Clients that start
    at once wait on one lock in the config directory, so only the first starts a head."""
    import fcntl

    private_dir(settings.config_dir)
    with open(settings.config_dir / "head.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        url = running_local_head(settings, token)
        if url is not None:
            meanwhile()
            return ClusterHandle(url, token, settings.head_cert)
        handle = start_head(settings, token, embedded=False, meanwhile=meanwhile)
    print(f"[burla] started a background head at {handle.url}: it outlives this script, so job links keep "
          "working and later jobs start warm. `burla head stop` stops it; BURLA_BACKGROUND_HEAD=0 keeps a head "
          "to its script.", file=sys.stderr)
    return handle


def start_head(settings: ClientSettings, token: str, embedded: bool,
               meanwhile: Callable[[], None] = lambda: None) -> ClusterHandle:
    """Start a head with one local node; embedded heads live only as long as their client."""
    log_dir = settings.config_dir / "logs"
    private_dir(log_dir)
    log_path = log_dir / ("embedded-head.log" if embedded else "head.log")
    ready_read, ready_write = os.pipe()
    command = [sys.executable, "-m", "burla", "head", "serve", "--ready-fd", str(ready_write)]
    if settings.cloud is None:
        command += ["--local-nodes", "1", "--driver", "local"]
    elif settings.cloud in BY_CLOUD:
        command += ["--driver", BY_CLOUD[settings.cloud].name]  # nodes boot in the user's account
    else:
        raise InvalidArgument(
            f"cloud {settings.cloud!r} has no driver in this burla version; run `burla config set cloud aws`, "
            "or unset it to run on this machine."
        )
    pass_fds = [ready_write]
    lifeline_write = None
    if embedded:
        lifeline_read, lifeline_write = os.pipe()
        os.set_inheritable(lifeline_write, False)
        command += ["--port", "0", "--ephemeral", "--lifeline-fd", str(lifeline_read)]
        pass_fds.append(lifeline_read)
    elif settings.cloud is None:
        command += ["--inactivity-timeout", str(BACKGROUND_IDLE_S)]
    env = dict(os.environ)
    env[ENV_TOKEN] = token
    env[ENV_CONFIG_DIR] = str(settings.config_dir)  # the client's, even one it was given, not read from here
    env.pop("BURLA_CLUSTER_DASHBOARD_URL", None)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            command, env=env, pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=log_file, start_new_session=not embedded or settings.cloud is not None,
        )
    for fd in pass_fds:
        os.close(fd)
    try:
        meanwhile()
        url = _read_ready_line(ready_read, process, log_path)
    except BaseException:
        if lifeline_write is not None:
            os.close(lifeline_write)
        process.kill()
        raise
    finally:
        os.close(ready_read)
    handle = ClusterHandle(url, token)
    if embedded:
        handle.embedded = EmbeddedHead(process, lifeline_write, log_path, outlives_client=settings.cloud is not None)
    return handle


def _read_ready_line(fd: int, process: subprocess.Popen, log_path: Path) -> str:
    deadline = time.monotonic() + HEAD_START_TIMEOUT_S
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HeadUnreachable(f"the local head did not start within {HEAD_START_TIMEOUT_S:.0f} s; see {log_path}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            process.wait()
            raise HeadUnreachable(
                f"the local head exited with code {process.returncode} before serving; its log is {log_path}:\n"
                + _tail(log_path)
            )
        data += chunk
    return data.decode().strip()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
