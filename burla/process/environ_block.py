"""Taking a secret out of this process's environment for good.

`del os.environ[name]` removes a variable from what this process and the processes it starts
see, but not from the environment block the kernel gave it at exec: /proc/<pid>/environ still
shows it, and so does every process forked from this one (a head's local nodes, a node's
workers), since a fork copies that memory. Erasing it means overwriting the entry in that block
too, as setproctitle does with argv. Linux only; elsewhere only os.environ changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

_ENV_START_FIELD = 50  # of /proc/<pid>/stat, 1-based (proc(5)): where the environment block starts


def _block_bounds() -> tuple[int, int] | None:
    """(start, end) addresses of this process's initial environment block."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # from field 3 on: the name in parentheses may hold spaces
    index = _ENV_START_FIELD - 3
    if len(fields) <= index + 1:
        return None
    return int(fields[index]), int(fields[index + 1])


def erase_variable(name: str) -> bool:
    """Remove `name` from os.environ and overwrite its entry in the initial environment block with
    NUL bytes. True if the block held it and was overwritten."""
    os.environ.pop(name, None)
    if sys.platform != "linux":
        return False
    bounds = _block_bounds()
    if bounds is None:
        return False
    start, end = bounds
    try:
        with open("/proc/self/environ", "rb") as environ:
            block = environ.read()
    except OSError:
        return False
    if len(block) > end - start:
        return False
    prefix = name.encode() + b"="
    erased = False
    offset = 0
    for entry in block.split(b"\0"):
        if entry.startswith(prefix):
            with contextlib.suppress(OSError, ValueError):
                ctypes.memset(start + offset, 0, len(entry))
                erased = True
        offset += len(entry) + 1
    return erased
