"""The worker process: loads each job's function once and runs calls, one at a time.

Forked by its node's fork server (fork_server, a fresh interpreter), or started as
`python -m burla.node.workers.worker SOCK_FD SHM_FD` where forking isn't possible. It talks to the node only
over the inherited private socketpair (length-prefixed wire frames) and publishes the input
index it is running in a shared 8-byte page, so the node can name the call that was running
if this process dies. Imports stay minimal: this process starts once per slot.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import mmap
import operator
import os
import pickle
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
import traceback
from array import array
from collections.abc import Callable
from itertools import count
from typing import Any

from burla.config import ENV_CODE_ROOT, ENV_JOB_TOKEN, ENV_NODE_ID, ENV_PARENT_JOB
from burla.errors import CallExited
from burla.node.workers.output_capture import OutputCapture
from burla.process.memory import freeze_inherited_objects, give_back_memory, keep_large_blocks
from burla.protocol import wire, worker_context, worker_wire
from burla.protocol.direct_inputs import DIRECT_MIN_BYTES
from burla.protocol.direct_results import split_large
from burla.protocol.framing import Payload
from burla.protocol.replication import local_code
from burla.protocol.values import inline_values
from burla.protocol.values.inline_values import VALUE
from burla.protocol.values.input_files import mapped_input
from burla.protocol.values.packed_inputs import UINT_BYTES, unpack_uints
from burla.protocol.values.packed_results import LARGE_PAYLOADS, TIMING_BYTES, TIMING_VALUES, PackedResults
from burla.protocol.values.pickle_parts import PickleParts, dumps_in_parts, likely_large
from burla.protocol.values.serialization import PROTOCOL, ErrorOrigin, dumps_result, loads, pack_error

# The shared page's slots (worker_wire's layout), written as a memoryview's items: a store,
# where struct's pack_into cost twice as much once per call.
_RUNNING_SLOT = worker_wire.RUNNING_AT // worker_wire.PAGE_SLOT.size
_REPORTING_SLOT = worker_wire.REPORTING_AT // worker_wire.PAGE_SLOT.size
_FLUSH_AFTER_S = 0.002  # results wait at most this long for company before going out
_FLUSH_BYTES = 1 << 20
LARGE_VALUE_BYTES = 1 << 20  # a value this big has its worker give free memory back when the job ends there
_PLAIN_RESULTS = frozenset({int, float, str, bytes, bool, type(None)})  # pickled without checks


class CallCancelled(BaseException):
    """Raised inside a running call when the node cancels its job (SIGUSR1)."""


class _CallFailed(Exception):
    """A call's packed error, on its way from the call to its result."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload


def _decoded_arguments(argument_bytes: Payload) -> Any:
    """An input's arguments as it travelled: a pickle (0x80), a small value (`inline_values`) or a
    reference to its file (0x00)."""
    first = argument_bytes[0]
    if first == inline_values.INPUT_MARK:
        return inline_values.unpack_input(argument_bytes)
    if first == 0:
        with mapped_input(argument_bytes) as pickled:
            return loads(pickled)
    return loads(argument_bytes)


class _LoadFailure:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload


class Worker:
    def __init__(self, sock: socket.socket, shm: mmap.mmap) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb", buffering=1 << 16)
        self._held_large = False  # values of 1 MB or more went through since memory was last given back
        self._results_direct = False  # the running batch's large results go apart (RunCalls.direct_results)
        self._page = memoryview(shm).cast("q")  # worker_wire.PAGE_SLOT's slots; the worker never closes `shm`
        self._functions: dict[str, Callable[..., Any] | _LoadFailure] = {}
        self._job_tokens: dict[str, str] = {}  # job id -> the token its calls open nested jobs with
        self._cancelled_jobs: set[str] = set()
        self._code: tuple[str, str] | None = None  # (digest, directory) of the shipped modules in use
        self._in_call = False
        self._batch_job: str | None = None
        self._cancel_requested = False
        self.capture = OutputCapture(self._send_live_output)
        self._origin = ErrorOrigin(os.environ.get(ENV_NODE_ID, ""), socket.gethostname(), os.getpid())
        # The running batch's call boundaries not yet reported, on the wall clock (perf_counter's
        # readings plus the wall clock at its zero): the first unreported call's start, then each
        # call's end (one append per call; see _timings_of).
        self._marks = array("d")

    # --- framing -------------------------------------------------------------------------

    def _send(self, msg: wire.Message) -> None:
        parts = worker_wire.framed([msg])
        with self.capture.send_lock:
            for part in parts:
                self._sock.sendall(part)
                if len(part) >= LARGE_VALUE_BYTES:
                    self._held_large = True

    def _send_live_output(self, job_id: str, items: list) -> None:
        data = worker_wire.WorkerReport.of(job_id, [], outputs=items, batch_done=False).encode()
        self._sock.sendall(worker_wire.FRAME_HEADER.pack(len(data)) + data)

    def _recv(self) -> wire.Message | None:
        header = self._reader.read(worker_wire.FRAME_HEADER.size)
        if len(header) < worker_wire.FRAME_HEADER.size:
            return None
        (size,) = worker_wire.FRAME_HEADER.unpack(header)
        data = self._reader.read(size)
        if len(data) < size:
            return None
        return wire.decode(data, worker_wire.NODE_TO_WORKER)

    # --- cancellation --------------------------------------------------------------------

    def _on_cancel_signal(self, signum: int, frame: Any) -> None:
        if self._batch_job is None:
            return  # idle: the batch it was meant for already ended
        self._cancel_requested = True
        if self._in_call:
            raise CallCancelled()

    # --- main loop -----------------------------------------------------------------------

    def serve(self) -> None:
        signal.signal(signal.SIGUSR1, self._on_cancel_signal)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal goes to the client
        self.capture.install()
        worker_context.set_notifier(lambda waiting: self._send(worker_wire.WorkerWaiting(waiting)))
        self._send(worker_wire.WorkerReady(os.getpid()))
        while True:
            msg = self._recv()
            if msg is None:
                return
            if isinstance(msg, worker_wire.RunCalls):
                part = msg.part()
                job_id, packed_indices = msg.job_id, msg.indices
                self._results_direct = msg.direct_results
                self._held_large |= len(part.data) >= LARGE_VALUE_BYTES
                values = inline_values.unpack_inputs(part.data, part.count)
                arguments = part.arguments() if values is None else values
                msg = None  # the batch's arguments, taken apart now, are not kept twice while they run
                del part
                self._run_batch(job_id, packed_indices, arguments, values is not None)
            elif isinstance(msg, worker_wire.LoadFunction):
                self._load(msg.job_id, msg.function_bytes, msg.local_code)
                self._job_tokens[msg.job_id] = msg.job_token
            elif isinstance(msg, worker_wire.UnloadFunction):
                self._functions.pop(msg.job_id, None)
                self._job_tokens.pop(msg.job_id, None)
                self._cancelled_jobs.discard(msg.job_id)
                if self._held_large:  # a job that moved large values ended here: its free pages go back
                    self._held_large = False
                    give_back_memory()

    def _load(self, job_id: str, function_bytes: bytes, code: bytes) -> None:
        try:
            importlib.invalidate_caches()  # packages the node just installed are importable
            if code:  # the user's local modules, importable before the function loads
                self._use_local_code(code)
            function = loads(function_bytes)
            if not callable(function):
                raise TypeError(f"the job's function is a {type(function).__name__}, not callable")
            self._functions[job_id] = function
        except BaseException as e:  # a missing module on this node, a broken pickle...
            self._functions[job_id] = _LoadFailure(pack_error(e, origin=self._origin))

    def _use_local_code(self, code: bytes) -> None:
        """Unpack shipped modules, unless the same ones are already in place from an earlier job.

        Modules of a different version are unimported first, so a job never runs stale code.
        """
        digest = hashlib.sha256(code).hexdigest()
        if self._code is not None and self._code[0] == digest:
            return
        if self._code is not None:
            directory = self._code[1]
            for name, module in list(sys.modules.items()):
                if (getattr(module, "__file__", None) or "").startswith(directory + os.sep):
                    del sys.modules[name]
            if directory in sys.path:
                sys.path.remove(directory)
            self.remove_code()
        # Under the node's own directory: what a killed worker leaves, the node removes when it stops.
        directory = tempfile.mkdtemp(prefix="burla-code-", dir=_code_root())
        try:
            local_code.install(code, directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._code = (digest, directory)

    def remove_code(self) -> None:
        """Remove the shipped modules' directory, if any."""
        if self._code is not None:
            shutil.rmtree(self._code[1], ignore_errors=True)
            self._code = None

    def _run_batch(self, job_id: str, packed_indices: bytes, arguments: list, decoded: bool = False) -> None:
        """Run a batch's calls (inputs `packed_indices`); `arguments` are as they travelled, or
        their values if `decoded`."""
        if job_id in self._cancelled_jobs:
            self._send(worker_wire.WorkerReport.of(job_id, [], outputs=[], batch_done=True))
            return
        function = self._functions.get(job_id)
        if isinstance(function, _LoadFailure) or function is None:
            call = self._call_without_function(function)
        else:
            call = self._caller(function, decoded)
        self._batch_job = job_id
        self._cancel_requested = False
        if os.environ.get(ENV_PARENT_JOB) != job_id:
            os.environ[ENV_PARENT_JOB] = job_id  # a nested remote_parallel_map records its parent
            os.environ[ENV_JOB_TOKEN] = self._job_tokens.get(job_id, "")  # and opens it with the job's token
        self.capture.begin_batch(job_id)
        unreported = _NONE_UNREPORTED
        since = time.perf_counter()  # when the calls of the last report began
        try:
            unreported, since = self._run_calls(job_id, packed_indices, arguments, call, since)
        except CallCancelled:  # the signal landed between calls
            self._cancel_requested = True
        finally:
            self._page[_RUNNING_SLOT] = -1
            self._batch_job = None
            self.capture.end_batch()
        if self._cancel_requested:
            self._cancelled_jobs.add(job_id)
            unreported = _NONE_UNREPORTED
            del self._marks[:]
        self._flush(job_id, unreported, True, time.perf_counter() - since)

    def _run_calls(self, job_id: str, packed_indices: bytes, arguments: list,
                   call: Callable[[Any], Any], started: float) -> tuple[_Unreported, float]:
        """Run the batch's calls (from `started`) until done or cancelled; returns the results not
        yet sent and when their calls began. This loop runs once per call: what it does per item
        is kept to the bare minimum."""
        capture, page, clock = self.capture, self._page, time.perf_counter
        end_call = capture.call_ender()
        indices = unpack_uints(packed_indices)
        results: list[list] = []
        pending_bytes = 0
        reported = 0  # the batch's calls before this one have been reported
        any_failed = False
        last = len(indices) - 1
        began = clock()
        # The wall clock at perf_counter's zero: a call's boundary is one monotonic reading plus
        # this, where the report's start times would otherwise be a pass of additions per report.
        wall = time.time() - began
        last_flush = started + wall
        marks = self._marks
        del marks[:]
        marks.append(began + wall)
        for position, index, argument in zip(count(), indices, arguments):
            if self._cancel_requested:
                break
            page[_RUNNING_SLOT] = index
            capture.running = index
            try:
                payload = call(argument)
                ok = True if type(payload) is bytes or type(payload) is PickleParts else VALUE
            except CallCancelled:
                self._cancel_requested = True
                end_call()
                break
            except _CallFailed as failure:
                ok, payload, any_failed = False, failure.payload, True
            except Exception as e:  # the call broke the worker's own error handling (it may patch it)
                ok, payload, any_failed = False, self._plain_error(e), True
            end_call()
            now = clock() + wall
            results.append([index, ok, payload])
            marks.append(now)
            if ok is not VALUE:  # an inline value is small
                pending_bytes += len(payload)
            if position < last:  # the batch's last results go with its end (one frame, not two)
                if now - last_flush > _FLUSH_AFTER_S or pending_bytes > _FLUSH_BYTES:
                    # A node holding back its results (ResultWindow) may keep this report waiting:
                    # that time is no call's, for its timeout (the index stays: a crash here is
                    # still the finished call's).
                    page[_REPORTING_SLOT] = 1
                    self._flush(job_id, _Unreported(results, packed_indices, reported, any_failed, pending_bytes),
                                False, now - last_flush)
                    page[_REPORTING_SLOT] = 0
                    reported += len(results)
                    results = []
                    pending_bytes = 0
                    any_failed = False
                    last_flush = now
        return _Unreported(results, packed_indices, reported, any_failed, pending_bytes), last_flush - wall

    def _caller(self, function: Callable[..., Any], decoded: bool) -> Callable[[Any], Any]:
        """One call: its arguments decoded (unless they are already), the function run. Returns
        its value where it travels as itself (`inline_values`), else its pickle; or raises
        _CallFailed with the packed error (CallCancelled passes)."""
        origin = self._origin
        inline, max_chars = inline_values.INLINE_TYPES, inline_values.MAX_STR_CHARS

        def call(arguments: Any) -> Any:
            self._in_call = True
            try:
                if not decoded:
                    arguments = _decoded_arguments(arguments)
                if type(arguments) is tuple:
                    value = function(*arguments)
                else:
                    value = function(arguments)
            except CallCancelled:
                raise
            except BaseException as e:
                self._in_call = False
                raise _CallFailed(pack_error(_as_call_failure(e), skip_frames=1, origin=origin)) from None
            finally:
                self._in_call = False
            kind = type(value)
            if kind in inline and (kind is not str or len(value) <= max_chars):
                return value
            if self._results_direct and likely_large(value):
                # Straight to the client: its large buffers go to the node as they are (no copy).
                with contextlib.suppress(Exception):  # else pickled the plain way below
                    return dumps_in_parts(value, pickle.Pickler, PROTOCOL)
            if kind in _PLAIN_RESULTS:
                return pickle.dumps(value, PROTOCOL)
            try:
                return dumps_result(value)
            except BaseException as e:
                wrapped = TypeError(f"the call returned a {type(value).__name__} that can't be pickled: {e}")
                raise _CallFailed(pack_error(wrapped, origin=origin)) from None

        return call

    def _call_without_function(self, function: _LoadFailure | None) -> Callable[[Payload], bytes]:
        if function is None:
            payload = pack_error(RuntimeError("this worker was given calls before the job's function"),
                                 origin=self._origin)
        else:
            payload = function.payload

        def fail(argument_bytes: Payload) -> bytes:
            raise _CallFailed(payload)

        return fail

    def _plain_error(self, exc: BaseException) -> bytes:
        """An error record built without pack_error (which failed): its type, message and text."""
        text = "".join(traceback.format_exception(exc))
        return wire.ErrorRecord(type(exc).__qualname__, type(exc).__module__, str(exc), text, None, None,
                                *self._origin).encode()

    def _flush(self, job_id: str, unreported: _Unreported, batch_done: bool, seconds: float) -> None:
        """Report these results, which took `seconds` of calls."""
        results = unreported.results
        with self.capture.send_lock:
            outputs = self.capture.take()
            if results or outputs or batch_done:
                # Packed here: the node, and the head, pass them on as they are.
                timings = _timings_of(self._marks, self._origin[2], len(results)) if results else b""
                indices = unreported.packed_indices()
                large: bool | None = unreported.payload_bytes >= LARGE_PAYLOADS
                direct = None
                if self._results_direct and unreported.payload_bytes >= DIRECT_MIN_BYTES:
                    results, direct = split_large(results)  # straight to the client, through the node
                    large = None if direct is not None else large  # weighed again without them
                try:
                    part = PackedResults.of_calls(results, timings, indices, unreported.any_failed, large)
                except (OverflowError, UnicodeEncodeError):  # an inline value msgpack refused: pickle those
                    results = [[index, True, pickle.dumps(payload, PROTOCOL)] if ok is VALUE else [index, ok, payload]
                               for index, ok, payload in results]
                    part = PackedResults.of_calls(results, timings, indices, unreported.any_failed, None)
                self._send(worker_wire.WorkerReport.of_part(job_id, part, outputs, batch_done, seconds, direct))


class _Unreported:
    """A batch's results not reported yet: those of its calls from position `first` on, their
    payloads' bytes (inline values not counted) and whether any failed."""

    __slots__ = ("results", "batch_indices", "first", "any_failed", "payload_bytes")

    def __init__(self, results: list, batch_indices: bytes, first: int, any_failed: bool, payload_bytes: int) -> None:
        self.results = results
        self.batch_indices = batch_indices
        self.first = first
        self.any_failed = any_failed
        self.payload_bytes = payload_bytes

    def packed_indices(self) -> bytes:
        """The results' input indices, packed: a slice of their batch's (one result per call, in order)."""
        size = UINT_BYTES
        return self.batch_indices[size * self.first:size * (self.first + len(self.results))]


_NONE_UNREPORTED = _Unreported([], b"", 0, False, 0)


def _code_root() -> str | None:
    """The node's directory for shipped modules, made by the first worker that needs it; None
    (the temporary directory itself) without one, or if what is there is not this user's own."""
    root = os.environ.get(ENV_CODE_ROOT)
    if not root:
        return None
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    found = os.lstat(root)
    return root if stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() else None


def _timings_of(marks: array, pid: int, count: int) -> bytes:
    """The first `count` calls' timings as reports carry them (when each started, on the wall
    clock; how long it ran; this worker's pid), from their boundaries on the wall clock: `marks`
    holds the first one's start and then each one's end. Takes them off `marks`, which keeps the
    last end, the next call's start. Built with a few passes at C speed where a tuple per call
    cost more. (A duration is a difference of wall-clock doubles: exact to a quarter of a µs.)"""
    starts, ends = marks[:count], marks[1:count + 1]
    values = array("d", bytes(TIMING_BYTES * count))
    values[0::TIMING_VALUES] = starts
    values[1::TIMING_VALUES] = array("d", map(operator.sub, ends, starts))
    values[2::TIMING_VALUES] = array("d", (float(pid),)) * count
    del marks[:count]
    return values.tobytes()


def _as_call_failure(exc: BaseException) -> BaseException:
    """What a call's exception is to its caller: itself, or for one that would end the program
    where it lands (SystemExit, KeyboardInterrupt), a CallExited saying so, with its traceback."""
    if isinstance(exc, Exception):
        return exc
    if isinstance(exc, SystemExit):
        code = exc.code
        how = "sys.exit()" if code is None else f"sys.exit({code!r})"
        message = f"the call ran {how} (SystemExit): a call's exit is that call's failure, not the program's"
    else:
        message = f"the call raised {type(exc).__name__}: a call's failure, not the program's"
    return CallExited(message).with_traceback(exc.__traceback__)


def serve_worker(sock: socket.socket, shm: mmap.mmap) -> None:
    """Run a worker on its socket to the node until the node closes it; never returns."""
    freeze_inherited_objects()  # what it was forked with, or imported: not the user's objects
    keep_large_blocks()  # a call's large values reuse freed blocks; given back when a job ends here
    worker = Worker(sock, shm)
    code = 0
    try:
        worker.serve()
    except (ConnectionError, BrokenPipeError):
        pass
    except Exception as e:  # the worker's own failure (a frame it can't read): say so, and exit non-zero
        code = 1
        with contextlib.suppress(BaseException):  # nowhere to say it (the node's stderr is gone): just exit
            text = f"burla worker {os.getpid()} failed:\n" + "".join(traceback.format_exception(e))
            os.write(worker.capture.diagnostics_fd, text.encode(errors="replace"))
    finally:
        with contextlib.suppress(BaseException):
            worker.remove_code()
        # Exit without running atexit hooks or joining threads a user function left behind.
        sys.stdout.flush()
        os._exit(code)


def main(argv: list[str]) -> None:
    sock_fd, shm_fd = int(argv[0]), int(argv[1])
    sock = socket.socket(fileno=sock_fd)
    shm = mmap.mmap(shm_fd, mmap.PAGESIZE)
    os.close(shm_fd)
    serve_worker(sock, shm)


if __name__ == "__main__":
    main(sys.argv[1:])
