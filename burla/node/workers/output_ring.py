"""Whether a worker's output pipes got anything, told by a read of memory instead of a syscall.

A worker asks after every call whether the call wrote to fd 1 or fd 2 (`output_capture`). An
`epoll_wait` with no timeout answers in about 0.25 µs here, a seventh of a no-op call. On Linux,
an io_uring one-shot poll on each pipe posts a completion into a ring the worker has mapped as
soon as the pipe turns readable; the worker then compares two words of that ring (its tail and
its head) and enters the kernel only when they differ: after output, to drain the pipes and
arm the polls again.

When is a completion visible? A write by the worker's own thread (Python's, or a C extension's)
wakes the poll inside that write, and the kernel posts the completion before the write returns:
the poll's wake-up is task work for the worker's thread, run on its way back to user space.
Another thread's or a child process's write interrupts the worker's thread to post it, as a
signal would (a call that waits for its child is woken by it). A pipe wakes its poll when it
goes from empty to not empty; polls are armed only on drained pipes, and an arm on a pipe that
is readable completes at once.

Where io_uring is missing, refused (`kernel.io_uring_disabled`, seccomp) or fails later, the
capture uses `epoll` as before: nothing depends on the ring but the speed of the common case.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys
from collections.abc import Sequence

_SYS_IO_URING_SETUP = 425  # the same number on every architecture (the new, shared syscall table)
_SYS_IO_URING_ENTER = 426
_IORING_OP_POLL_ADD = 6
_IORING_FEAT_SINGLE_MMAP = 1
_IORING_OFF_SQES = 0x10000000
_POLLIN = 0x0001
_PARAMS = struct.Struct("10I" + "7IIQ" + "7IIQ")  # struct io_uring_params: 120 bytes
_SQE = struct.Struct("=BBHiQQIIQ24x")  # opcode, flags, ioprio, fd, off, addr, len, poll32_events, user_data
_CQE_BYTES = 16
_ENTRIES = 4


class RingUnavailable(OSError):
    """io_uring can't be used here: the capture polls with epoll."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


class OutputRing:
    """One-shot io_uring polls on a set of pipes: `view[tail] != view[head]` after one of them
    turned readable, until `rearm()` (call it with the pipes drained)."""

    def __init__(self, fds: Sequence[int]) -> None:
        if not sys.platform.startswith("linux"):
            raise RingUnavailable("io_uring is Linux's")
        self._libc = _libc()
        params = bytearray(_PARAMS.size)
        fd = self._libc.syscall(_SYS_IO_URING_SETUP, ctypes.c_uint(_ENTRIES),
                                (ctypes.c_char * len(params)).from_buffer(params))
        if fd < 0:
            raise RingUnavailable(ctypes.get_errno(), f"io_uring_setup: {os.strerror(ctypes.get_errno())}")
        self._fd = fd
        try:
            self._map(_PARAMS.unpack(params))
        except Exception:
            os.close(fd)
            raise
        self._fds = list(fds)
        self.broken = False
        self._submit(self._fds)

    def _map(self, params: tuple) -> None:
        sq_entries, cq_entries, _, _, _, features = params[:6]
        sq_head, sq_tail, sq_mask, _, _, _, sq_array = params[10:17]
        cq_head, cq_tail, cq_mask, _, _, cq_cqes = params[19:25]
        if not features & _IORING_FEAT_SINGLE_MMAP:  # kernels before 5.4: not worth a second path
            raise RingUnavailable("io_uring without one mapping for both rings")
        size = max(sq_array + 4 * sq_entries, cq_cqes + _CQE_BYTES * cq_entries)
        self._rings = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._sqes = mmap.mmap(self._fd, _SQE.size * sq_entries, mmap.MAP_SHARED,
                               mmap.PROT_READ | mmap.PROT_WRITE, offset=_IORING_OFF_SQES)
        self.view = memoryview(self._rings).cast("I")  # the ring's words: a read is a load, no syscall
        self.head, self.tail = cq_head // 4, cq_tail // 4
        self._sq = (sq_head // 4, sq_tail // 4, self.view[sq_mask // 4], sq_array // 4, sq_entries)
        self._cq_mask, self._cqes = self.view[cq_mask // 4], cq_cqes

    def fired(self) -> bool:
        view = self.view
        return view[self.tail] != view[self.head]

    def rearm(self) -> None:
        """Take the completions and arm their pipes' polls again (after draining the pipes). On a
        failure the completions stay, so `fired()` stays true, and `broken` says to poll otherwise."""
        view = self.view
        head, tail = view[self.head], view[self.tail]
        fds = []
        while head != tail:
            at = self._cqes + _CQE_BYTES * (head & self._cq_mask)
            (user_data,) = struct.unpack_from("Q", self._rings, at)
            fds.append(int(user_data))
            head = (head + 1) & 0xFFFFFFFF
        try:
            self._submit([fd for fd in fds if fd in self._fds])
        except OSError:
            self.broken = True
            return
        view[self.head] = head

    def _submit(self, fds: list[int]) -> None:
        if not fds:
            return
        head_at, tail_at, mask, array_at, entries = self._sq
        view = self.view
        tail = view[tail_at]
        if (tail - view[head_at]) & 0xFFFFFFFF > entries - len(fds):
            raise OSError("io_uring submission queue full")
        for fd in fds:
            slot = tail & mask
            _SQE.pack_into(self._sqes, slot * _SQE.size, _IORING_OP_POLL_ADD, 0, 0, fd, 0, 0, 0, _POLLIN, fd)
            view[array_at + slot] = slot
            tail = (tail + 1) & 0xFFFFFFFF
        view[tail_at] = tail  # x86 and arm64 kernels read it with acquire semantics after the syscall
        done = self._libc.syscall(_SYS_IO_URING_ENTER, self._fd, len(fds), 0, 0, None, 0)
        if done != len(fds):
            raise OSError(ctypes.get_errno(), f"io_uring_enter submitted {done} of {len(fds)}")

    def close(self) -> None:
        self.view.release()
        self._rings.close()
        self._sqes.close()
        os.close(self._fd)
