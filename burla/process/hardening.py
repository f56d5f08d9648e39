"""Keeping a process's memory from the other processes of its user.

A process of the same user may ptrace another and read its `/proc/<pid>/mem` and `environ`:
a call running as the node's user could read the cluster token out of the head, the node or
the client. A process marked non-dumpable (`PR_SET_DUMPABLE` 0, prctl(2)) has its `/proc/<pid>`
files owned by root and fails the kernel's ptrace access check for everyone but root (and a
sandboxed call is never root): no attach, no memory, no environment, no core dump. The mark
survives fork (a forked child starts marked) and is cleared by execve, so every process that
holds a secret marks itself once, early: the head, the node, the worker fork server and the
client.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """The C library, loaded once, with errno kept for each call."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


def refuse_inspection() -> bool:
    """Mark this process non-dumpable; returns whether it is now (False where the system has no
    such mark: not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    if libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return False
    return is_inspectable() is False


def is_inspectable() -> bool | None:
    """Whether processes of this user may ptrace this one (None: unknown here)."""
    if not sys.platform.startswith("linux"):
        return None
    state = libc().prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    return None if state < 0 else state != 0

