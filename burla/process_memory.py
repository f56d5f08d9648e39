"""Keep a long-lived process's memory in check: freed large buffers go back to the operating
system at once, and what is alive at startup is kept out of the cyclic GC's reach.

glibc serves blocks over its mmap threshold with their own mappings, returned to the OS when
freed, but it raises that threshold (up to 32 MB) each time such a block is freed. After one
big input, every later 10 MB input then comes from the heap, and a head that relayed
100 x 10 MB inputs stayed 230 MB above idle. Fixing the threshold stops the drift.
"""

from __future__ import annotations

import ctypes
import gc
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


GC_THRESHOLDS = (20_000, 10, 50)  # Python's default is (700, 10, 10)


def freeze_startup_objects(collect: bool = True) -> None:
    """Move everything alive at startup (modules, classes, the app: hundreds of thousands of
    objects) out of the cyclic GC's reach. A full collection walks every tracked object; with
    them frozen it walks only what jobs hold, which keeps its pauses of the event loop short
    (a node's full collection took 30-40 ms mid-job before). `collect=False` skips the
    collection first, for a process that starts on a cold path."""
    if collect:
        gc.collect()
    gc.freeze()
    # Collect the young generation less often: most of what a frame allocates is gone by then, so
    # less survives into the old generations whose full collections pause the loop longest.
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_inherited_objects() -> None:
    """In a process forked from one that ran a while (a worker, the fork server): what it
    inherited stays out of the cyclic GC's reach. Thresholds stay Python's: user code runs here."""
    gc.freeze()
