"""Keep a long-lived process's memory in check: large buffers reused while a job moves data,
given back to the operating system once it is idle, and what is alive at startup kept out of
the cyclic GC's reach.

glibc serves blocks over its mmap threshold with mappings of their own, returned to the OS when
freed: each 10 MB input a head or node relayed was a new mapping, and the kernel's page faults
filling it cost more than copying the bytes (a third of a node's CPU when results of 10 MB went
through it). Below the threshold, blocks come from the heap and are reused, but glibc keeps what
is freed there. So heads and nodes keep large blocks in the heap while they work
(`keep_large_blocks`) and give the heap's free pages back when they go idle (`give_back_memory`).
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import threading
from typing import Any

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers
M_MMAP_THRESHOLD = -3
LARGE_BLOCK_BYTES = 32 * 1024 * 1024  # glibc's largest mmap threshold: a 200 MB input still gets its own mapping
TRIM_ABOVE_BYTES = 64 * 1024 * 1024  # free memory at the heap's top past this goes back at once


@functools.cache
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: a client imports this module too, and never needs it

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):  # musl and others: no mallopt, and none of this either
        return None
    return libc


def keep_large_blocks() -> bool:
    """Serve blocks up to LARGE_BLOCK_BYTES from the heap (Linux with glibc; elsewhere nothing
    changes), so that the buffers of large inputs and results are reused, not mapped anew."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)
                and libc.mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE_BYTES))


def give_back_memory() -> bool:
    """Return the heap's free pages to the operating system (after a job, while idle)."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


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


class JobCollections:
    """While a client runs jobs, its cyclic GC collects less often (GC_THRESHOLDS at least), and
    its large buffers are reused from the heap (`keep_large_blocks`) until the last job ends.

    A job makes a few short-lived lists and tuples per input and result: with Python's default
    thresholds a million-input job set off ~2,500 collections, twenty of them full ones over the
    whole program, about a third of the client's CPU. With these, almost none run: what a job
    makes is freed as it goes, and never piles up to 20,000 objects. The user's own thresholds
    come back when the last job of the process ends, unless something changed them meanwhile;
    a program that turned automatic collection off (threshold 0) keeps it off.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs = 0
        self._saved: tuple[int, int, int] | None = None  # the thresholds before the first job
        self._ours: tuple[int, int, int] | None = None  # the ones set while jobs run

    @property
    def jobs_running(self) -> int:
        return self._jobs

    def forked(self) -> None:
        """In a child forked while jobs ran: those jobs are the parent's. Start afresh, with the
        program's thresholds back (and a lock no other thread of the parent may be holding)."""
        self._lock = threading.Lock()
        if self._jobs and self._saved is not None and gc.get_threshold() == self._ours:
            gc.set_threshold(*self._saved)
        self._jobs = 0
        self._saved = self._ours = None

    def job_started(self) -> None:
        with self._lock:
            self._jobs += 1
            if self._jobs > 1:
                return
            # A job's large inputs and results are reused from the heap (the state glibc itself
            # reaches once it has freed a block of 32 MB); the last job's end gives them back.
            keep_large_blocks()
            saved = gc.get_threshold()
            if saved[0] == 0:
                self._saved = self._ours = None
                return
            ours = (max(saved[0], GC_THRESHOLDS[0]), max(saved[1], GC_THRESHOLDS[1]), max(saved[2], GC_THRESHOLDS[2]))
            gc.set_threshold(*ours)
            self._saved, self._ours = saved, ours

    def job_ended(self) -> None:
        with self._lock:
            self._jobs -= 1
            if self._jobs > 0:
                return
            give_back_memory()
            if self._saved is None:
                return
            if gc.get_threshold() == self._ours:  # else the program set its own meanwhile: keep them
                gc.set_threshold(*self._saved)
            self._saved = self._ours = None


JOB_COLLECTIONS = JobCollections()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=JOB_COLLECTIONS.forked)
