"""What a process forked from a burla process (a local node, a worker, the fork server) does
first: drop the parent's descriptors it must not hold, read nothing from the parent's stdin,
take the signal handling and environment a started process would have."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

CHILD_DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def flush_before_fork() -> None:
    """What this process buffered would otherwise be written again by each child."""
    sys.stdout.flush()
    sys.stderr.flush()


def start_child(close: tuple[int, ...], env: dict[str, str]) -> None:
    """In a freshly forked child: close `close` (the parent's own descriptors), stdin from
    /dev/null, default handlers for the signals burla processes handle, and `env` as its
    environment."""
    for fd in close:
        with contextlib.suppress(OSError):
            os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for sig in CHILD_DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(env)
