"""Per-call capture of everything a worker process writes to fd 1 and fd 2.

The worker points its own fd 1 and fd 2 at pipes it reads itself, so output from Python, C
extensions and child processes is caught alike. After each call the main thread drains what
the pipes hold (FIONREAD, no thread hand-off on the hot path) and attributes it to that call;
whether they hold anything it learns from a read of memory where it can (`output_ring`), else
from one `epoll_wait`.
A watchdog thread drains the pipes during long calls so output streams live and a chatty call
never blocks on a full pipe. Draining and switching the current call share one lock, so every
byte is attributed to the call that was running when it was written.
"""

from __future__ import annotations

import codecs
import fcntl
import io
import os
import select
import sys
import termios
import threading
from collections.abc import Callable
from typing import Any

from burla.node.workers.output_ring import OutputRing
from burla.protocol.wire import STDERR, STDOUT

_F_SETPIPE_SZ = 1031  # Linux; a larger pipe lets bursts pass without waking the watchdog
_PIPE_BYTES = 1 << 20
_FIONREAD_BUF = bytearray(4)

OutputItem = list  # [input_index, stream, text]


def _nothing() -> None:
    pass


# Whether Python's streams for fd 1 and 2 (installed by `OutputCapture.install`) were written
# since a call last ended: when not, that call's end flushes nothing. Two flushes of empty
# streams were a sixth of a no-op call's cost in the worker.
_written = [False]


class _TrackedBuffer(io.BufferedWriter):
    """fd 1's or fd 2's binary stream, noting that it was written (`_written`)."""

    def write(self, data: Any) -> int:
        _written[0] = True
        return super().write(data)


class _TrackedText(io.TextIOWrapper):
    """sys.stdout or sys.stderr, line-buffered, noting that it was written (`_written`)."""

    def write(self, text: str) -> int:
        _written[0] = True
        return super().write(text)


def _tracked(stream: Any, fd: int) -> _TrackedText:
    """A line-buffered text stream to `fd` like `stream` (its encoding and errors), tracked."""
    buffer = _TrackedBuffer(io.FileIO(fd, "w", closefd=False))
    return _TrackedText(buffer, encoding=getattr(stream, "encoding", None) or "utf-8",
                        errors=getattr(stream, "errors", None) or "backslashreplace", line_buffering=True)


def _flush(*streams: Any) -> None:
    for stream in dict.fromkeys(streams):  # each once
        try:
            stream.flush()
        except Exception:  # a stream a call put in place that can't flush, or closed
            pass


IDLE_WAKE_S = 1.0


class OutputCapture:
    def __init__(self, on_live_output: Callable[[str, list[OutputItem]], None], interval_s: float = 0.05,
                 use_ring: bool = True) -> None:
        self._on_live_output = on_live_output
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._pipes: list[tuple[int, int, codecs.IncrementalDecoder]] = []
        # One syscall tells whether either pipe holds anything, made after every call: epoll's costs
        # ~60% of poll's on Linux; elsewhere (macOS) poll.
        self._poll: Any = select.epoll() if hasattr(select, "epoll") else select.poll()
        self._use_ring = use_ring
        self._ring: OutputRing | None = None  # io_uring polls on the pipes, where the kernel offers them
        self._pending: list[OutputItem] = []
        self._job_id: str | None = None
        # The input index of the call running now (-1 between calls). The worker sets it without
        # the lock, once per call: a single store the watchdog reads under the lock (see end()).
        self.running = -1
        self._stop = threading.Event()
        self._busy = threading.Event()  # a batch is running: the watchdog streams its output
        self.send_lock = threading.RLock()
        self._watchdog: threading.Thread | None = None
        # Python's streams for fd 1 and 2 once installed (tracked), and the interpreter's own.
        self._streams: tuple[Any, ...] = (None, None)
        self._originals: tuple[Any, ...] = ()
        # Keep a copy of the original stderr for the worker's own fatal diagnostics.
        self.diagnostics_fd = os.dup(2)

    def install(self) -> None:
        for stream, target in ((STDOUT, 1), (STDERR, 2)):
            read_fd, write_fd = os.pipe()
            try:
                fcntl.fcntl(write_fd, _F_SETPIPE_SZ, _PIPE_BYTES)
            except OSError:
                pass
            os.dup2(write_fd, target)
            os.close(write_fd)
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            self._pipes.append((stream, read_fd, decoder))
            self._poll.register(read_fd, select.EPOLLIN if hasattr(select, "epoll") else select.POLLIN)
        if self._use_ring:
            try:
                self._ring = OutputRing([fd for _, fd, _ in self._pipes])
            except OSError:  # RingUnavailable among them: epoll it is
                self._ring = None
        # Line buffering: Python prints reach the pipe at each newline, in order with C output.
        # The streams a call finds are tracked ones (the interpreter's own stay, line-buffered, for
        # whatever kept a reference to them; a call's end flushes those too).
        for original in (sys.stdout, sys.stderr):
            original.flush()
            original.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        self._originals = (sys.stdout, sys.stderr)
        sys.stdout = sys.__stdout__ = _tracked(sys.stdout, 1)  # type: ignore[misc]
        sys.stderr = sys.__stderr__ = _tracked(sys.stderr, 2)  # type: ignore[misc]
        self._streams = (sys.stdout, sys.stderr)
        self._watchdog = threading.Thread(target=self._watch, name="burla-output", daemon=True)
        self._watchdog.start()

    def begin_batch(self, job_id: str) -> None:
        """The calls that follow are this job's (each announced by setting `running`)."""
        with self._lock:
            self._job_id = job_id
        self._busy.set()

    def end_batch(self) -> None:
        """No call runs until the next batch: the watchdog wakes only now and then."""
        self._busy.clear()

    def call_ender(self) -> Callable[[], None]:
        """What the worker calls as each call ends: attribute everything written so far to the
        running call, then clear it.

        After output (the ring fired, or always without the ring), taking the lock waits out a drain
        the watchdog began during the call, so the call's output is all pending before its result
        goes out; the next call's index is set only after this.
        A closure over the lock and the poller (taken once per batch): a method's lookups and calls
        were a third of a no-op call's cost in the worker."""
        acquire, release, poll, drain = self._lock.acquire, self._lock.release, self._poll.poll, self._drain_locked
        ring = self._ring if self._ring is not None and not self._ring.broken else None
        # With the ring, whether the pipes got anything since they were last drained is two loads
        # from memory (see output_ring); without it, one epoll_wait.
        view, tail, head = (ring.view, ring.tail, ring.head) if ring is not None else (None, 0, 0)
        rearm = ring.rearm if ring is not None else _nothing

        out, err = self._streams
        written = _written

        def end() -> None:
            # Python's buffered output first, if there can be any: the streams a call replaced
            # sys.stdout or sys.stderr with are flushed as they are (looked up each time).
            if written[0] or sys.stdout is not out or sys.stderr is not err:
                written[0] = False
                _flush(out, err, sys.stdout, sys.stderr, *self._originals)
            if view is not None and view[tail] == view[head]:
                # No output since the ring was last armed (after a drain), so none for the watchdog
                # to be draining either: nothing to wait out, and no lock to take.
                self.running = -1
                return
            acquire()
            try:
                if view is not None:
                    if view[tail] != view[head]:  # a poll fired: output came (the watchdog may have taken it)
                        drain()
                        rearm()
                elif poll(0):  # nothing, in the common case: the call wrote no output
                    drain()
                self.running = -1
            finally:
                release()

        return end

    def take(self) -> list[OutputItem]:
        with self._lock:
            items, self._pending = self._pending, []
        return items

    def _drain_locked(self) -> None:
        """Read what the pipes hold and attribute it to the running call (the lock is held)."""
        index = self.running
        for stream, fd, decoder in self._pipes:
            fcntl.ioctl(fd, termios.FIONREAD, _FIONREAD_BUF)
            available = int.from_bytes(_FIONREAD_BUF, sys.byteorder)
            if not available:
                continue
            chunks = []
            while available > 0:
                data = os.read(fd, available)
                if not data:
                    break
                chunks.append(data)
                available -= len(data)
            text = decoder.decode(b"".join(chunks))
            if text and index >= 0:
                self._pending.append([index, stream, text])
            elif text:
                # Written between calls (a background thread of an earlier call): keep it visible.
                os.write(self.diagnostics_fd, text.encode(errors="replace"))

    def _watch(self) -> None:
        parent = os.getppid()
        while not self._stop.is_set():
            # Between batches nothing streams: wake once a second (output of a call's leftover
            # thread, a node that died), not every interval (idle workers, spares among them).
            self._busy.wait(IDLE_WAKE_S)
            if self._stop.wait(self._interval_s):
                return
            if os.getppid() != parent:  # the node died; nobody will read our results
                os._exit(3)
            # The send lock keeps live chunks ordered before the call's final report.
            with self.send_lock:
                with self._lock:
                    if self.running >= 0 and self._poll.poll(0):
                        self._drain_locked()
                    job_id = self._job_id
                    if not self._pending or job_id is None:
                        continue
                    items, self._pending = self._pending, []
                try:
                    self._on_live_output(job_id, items)
                except OSError:
                    return

    def close(self) -> None:
        self._stop.set()
        self._busy.set()
        with self._lock:
            ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()
