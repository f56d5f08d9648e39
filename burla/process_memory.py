"""Give freed large buffers back to the operating system at once.

glibc serves blocks over its mmap threshold with their own mappings, returned to the OS when
freed, but it raises that threshold (up to 32 MB) each time such a block is freed. After one
big input, every later 10 MB input then comes from the heap, and a head that relayed
100 x 10 MB inputs stayed 230 MB above idle. Fixing the threshold stops the drift.
"""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
LARGE_BLOCK_BYTES = 1024 * 1024


def release_large_blocks() -> bool:
    """Pin the mmap threshold at 1 MB (Linux with glibc; elsewhere nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt, and no such drift either
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES))
