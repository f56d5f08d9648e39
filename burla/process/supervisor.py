"""The supervisor a cloud VM's node (or a deployed head without systemd) runs under: it restarts
the process when it crashes, and for a node powers the VM off when the node is done for good,
so no VM outlives its purpose.

For a node:
- exiting because its head was unreachable past `--orphan-timeout` (exit 6), refused (exit 2:
  wrong build or version; 3: wrong token), or told to stop (exit 0) means done: the supervisor
  powers the VM off (clouds delete it on shutdown where they can);
- any other exit is a crash: started again with backoff; one that keeps crashing for the whole
  orphan timeout is done too.
A head is restarted whenever it exits, except on a usage error (exit 2).
SIGTERM or SIGINT to the supervisor stops the child (a node then tells its head it is leaving)
and ends the supervisor without powering off.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("burla.process.supervisor")

NODE_DONE_EXIT_CODES = frozenset({0, 2, 3, 6})
HEAD_DONE_EXIT_CODES = frozenset({2})
HEALTHY_RUN_S = 60.0  # a run this long resets the backoff and the crash clock
MAX_BACKOFF_S = 30.0
POWER_OFF = ["shutdown", "-h", "now"]


@dataclass(frozen=True)
class SupervisorSettings:
    join_args: tuple[str, ...]
    orphan_timeout_s: float
    image: str | None = None  # run the node inside this container image (host network)
    gpus: bool = False


def node_command(settings: SupervisorSettings) -> list[str]:
    join = ["node", "join", *settings.join_args]
    if settings.image is None:
        return [sys.executable, "-m", "burla", *join]
    # The node runs in the image's own Python with the head's build installed from the uploaded
    # wheel; ~/.burla is mounted at the same path so every file path stays valid.
    home = os.path.dirname(os.path.dirname(os.path.dirname(sys.executable)))  # ~/.burla/env/bin/python
    from burla.process.build import BUILD_DIR, wheel_name

    inner = (f"python3 -m pip install --quiet --disable-pip-version-check {shlex.quote(home)}/{BUILD_DIR}/"
             f"{wheel_name()} && exec python3 -m burla " + " ".join(shlex.quote(p) for p in join))
    as_root = [] if os.geteuid() == 0 else ["sudo", "-n", "-E"]  # the login user may not be in group docker
    docker = [*as_root, "docker", "run", "--rm", "--network", "host", "-v", f"{home}:{home}", "-e",
              "BURLA_CONFIG_DIR"]
    if settings.gpus:
        docker += ["--gpus", "all"]  # needs the NVIDIA container toolkit on GPU images
    return [*docker, settings.image, "sh", "-c", inner]


def power_off() -> None:
    """Shut the machine down (as root, or through passwordless sudo as cloud images allow)."""
    command = POWER_OFF if os.geteuid() == 0 else ["sudo", "-n", *POWER_OFF]
    log.info("powering this machine off: %s", " ".join(command))
    try:
        subprocess.run(command, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.error("could not power off (%s); the head deletes this machine when it sees it", e)


def supervise_node(settings: SupervisorSettings) -> int:
    return supervise(node_command(settings), NODE_DONE_EXIT_CODES, power_off, settings.orphan_timeout_s)


def supervise_head(serve_args: tuple[str, ...]) -> int:
    return supervise([sys.executable, "-m", "burla", "head", "serve", *serve_args], HEAD_DONE_EXIT_CODES, None, None)


def supervise(command: list[str], done_codes: frozenset[int], when_done: Callable[[], None] | None,
              give_up_after_s: float | None) -> int:
    """Run `command` until it exits with a done code (then `when_done`), restarting it otherwise."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s supervisor %(levelname)s %(message)s")
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum: int, _frame) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    backoff = 1.0
    crashing_since: float | None = None
    while not stopping:
        started = time.monotonic()
        child = subprocess.Popen(command)
        code = child.wait()
        if stopping:
            return 0
        ran = time.monotonic() - started
        if code in done_codes:
            log.info("done (exit %d)", code)
            if when_done is not None:
                when_done()
            return code
        if ran >= HEALTHY_RUN_S:
            backoff, crashing_since = 1.0, None
        crashing_since = crashing_since or time.monotonic()  # when this run of crashes began
        if give_up_after_s is not None and time.monotonic() - crashing_since > give_up_after_s:
            log.error("kept crashing for %.0f s; giving up", time.monotonic() - crashing_since)
            if when_done is not None:
                when_done()
            return code
        log.warning("exited with %d after %.1f s; starting again in %.0f s", code, ran, backoff)
        deadline = time.monotonic() + backoff
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.2)
        backoff = min(backoff * 2, MAX_BACKOFF_S)
    return 0
