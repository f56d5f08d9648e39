"""The client's side of one job, on a background thread with its own event loop.

It opens the job over one WebSocket, streams inputs up within the head's window, prints
remote output as it arrives, acknowledges result batches, and hands results to the user's
thread through a queue, so the user's thread only ever waits on that queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from burla import wire
from burla.config import MAX_INPUT_BYTES
from burla.errors import (
    HeadUnreachable,
    InputTooBig,
    JobCanceled,
    NodeDisconnected,
    ProtocolError,
    RemoteError,
    Unauthorized,
    UnpicklableInput,
    error_from_wire,
)
from burla.local_cluster import ClusterHandle
from burla.progress import Display
from burla.serialization import dumps, loads, unpack_error

UPLOAD_BATCH_BYTES = 1024 * 1024
UPLOAD_BATCH_ITEMS = 4096
CANCEL_WAIT_S = 5.0


@dataclass(frozen=True)
class Outcome:
    index: int
    ok: bool
    value: Any  # the result, or the exception the call raised


_END = object()


class JobRunner:
    def __init__(self, cluster: ClusterHandle, spec: wire.OpenJob, inputs: Sequence[Any], display: Display) -> None:
        self.cluster = cluster
        self.spec = spec
        self.inputs = inputs
        self.display = display
        self.outcomes: queue.SimpleQueue = queue.SimpleQueue()  # Outcome lists, then _END
        self.error: BaseException | None = None  # why the job ended early, if it did
        self.uploaded = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ws = None
        self._cancel_reason: str | None = None
        self._ended = threading.Event()
        self._window_inputs = 1
        self._window_bytes = 0
        self._outstanding_inputs = 0
        self._outstanding_bytes = 0
        self._sizes: dict[int, int] = {}  # uploaded inputs whose results are still out
        self._window_open = asyncio.Event()
        self._side_tasks: set[asyncio.Future] = set()
        self._thread = threading.Thread(target=self._thread_main, name=f"burla-job-{spec.job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as e:  # anything unexpected still ends the job for the caller
            if self.error is None:
                self.error = e
        finally:
            self._ended.set()
            self.uploaded.set()
            self.outcomes.put(_END)

    def cancel(self, reason: str) -> None:
        """Ask the head to cancel the job (from any thread) and wait briefly for it to end."""
        loop = self._loop
        if loop is None or self._ended.is_set():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._request_cancel, reason)
        self._ended.wait(CANCEL_WAIT_S)

    def close(self) -> None:
        """Stop listening (the caller has what it needs); the head then ends the job."""
        loop = self._loop
        if loop is not None and not self._ended.is_set():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._request_close)
            self._ended.wait(CANCEL_WAIT_S)

    def _request_cancel(self, reason: str) -> None:
        self._cancel_reason = reason
        if self._ws is not None and not self._ws.closed:
            self._side_task(self._ws.send_bytes(wire.CancelJob(self.spec.job_id, reason).encode()))

    def _request_close(self) -> None:
        if self._ws is not None:
            self._side_task(self._ws.close())

    def _side_task(self, coroutine) -> None:
        """Run a one-off send on the loop; `_run` awaits whatever is left before it returns."""
        task = asyncio.ensure_future(coroutine)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # --- the session ---------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._session()
        finally:
            for task in list(self._side_tasks):
                with contextlib.suppress(Exception):
                    await task

    async def _session(self) -> None:
        import aiohttp

        self._loop = asyncio.get_running_loop()
        headers = {"Authorization": f"Bearer {self.cluster.token}"}
        async with aiohttp.ClientSession() as session:
            try:
                ws = await session.ws_connect(
                    f"{self.cluster.url}/v1/jobs/ws", headers=headers, max_msg_size=wire.MAX_FRAME_BYTES,
                    heartbeat=None,
                )
            except aiohttp.WSServerHandshakeError as e:
                if e.status == 401:
                    raise Unauthorized(
                        f"{self.cluster.url} refused the cluster token; set BURLA_CLUSTER_TOKEN to the "
                        "token of that head."
                    ) from None
                raise HeadUnreachable(f"{self.cluster.url} refused the job connection (HTTP {e.status})") from None
            except (aiohttp.ClientError, OSError) as e:
                raise HeadUnreachable(f"can't reach the head at {self.cluster.url}: {e}") from None
            self._ws = ws
            async with ws:
                await ws.send_bytes(self.spec.encode())
                accepted = await self._receive_accept(ws)
                uploader = asyncio.create_task(self._upload(ws, accepted))
                receiver = asyncio.create_task(self._receive(ws))
                try:
                    await asyncio.wait((uploader, receiver), return_when=asyncio.FIRST_EXCEPTION)
                    if uploader.done() and not uploader.cancelled() and uploader.exception() is not None:
                        # An input that can't be sent ends the job; say why, not "canceled".
                        with contextlib.suppress(Exception):
                            await ws.send_bytes(wire.CancelJob(self.spec.job_id, str(uploader.exception())).encode())
                        raise uploader.exception()
                    await receiver
                finally:
                    for task in (uploader, receiver):
                        task.cancel()
                    for task in (uploader, receiver):
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task

    async def _receive_accept(self, ws) -> wire.JobAccepted:
        msg = await self._next_message(ws)
        if isinstance(msg, wire.ErrorReply):
            raise error_from_wire(msg.kind, msg.message)
        if not isinstance(msg, wire.JobAccepted):
            raise ProtocolError(f"the head answered OpenJob with {type(msg).__name__}")
        return msg

    async def _next_message(self, ws) -> wire.Message | None:
        import aiohttp

        frame = await ws.receive()
        if frame.type == aiohttp.WSMsgType.BINARY:
            return wire.decode(frame.data, wire.HEAD_TO_CLIENT)
        if frame.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
            return None
        if frame.type == aiohttp.WSMsgType.ERROR:
            return None
        raise ProtocolError(f"unexpected {frame.type.name} frame from the head")

    async def _upload(self, ws, accepted: wire.JobAccepted) -> None:
        """Pickle and send inputs while the window allows; the window frees as results return."""
        self._window_inputs = accepted.window_inputs
        self._window_bytes = accepted.window_bytes
        job_id = self.spec.job_id
        batch: list = []
        batch_bytes = 0
        for index, value in enumerate(self.inputs):
            try:
                data = dumps(value)
            except Exception as e:
                raise UnpicklableInput(index, f"{type(e).__name__}: {e}") from e
            if len(data) > MAX_INPUT_BYTES:
                raise InputTooBig(index, len(data), MAX_INPUT_BYTES)
            while self._outstanding_inputs and (
                self._outstanding_inputs >= self._window_inputs
                or self._outstanding_bytes + len(data) > self._window_bytes
            ):
                if batch:
                    await ws.send_bytes(wire.InputBatch(job_id, batch).encode())
                    batch, batch_bytes = [], 0
                self._window_open.clear()
                await self._window_open.wait()
            self._outstanding_inputs += 1
            self._outstanding_bytes += len(data)
            self._sizes[index] = len(data)
            batch.append([index, data])
            batch_bytes += len(data)
            if batch_bytes >= UPLOAD_BATCH_BYTES or len(batch) >= UPLOAD_BATCH_ITEMS:
                await ws.send_bytes(wire.InputBatch(job_id, batch).encode())
                batch, batch_bytes = [], 0
        if batch:
            await ws.send_bytes(wire.InputBatch(job_id, batch).encode())
        self.uploaded.set()

    def _free_window(self, indices: list[int]) -> None:
        sizes = self._sizes
        for index in indices:
            size = sizes.pop(index, None)
            if size is not None:
                self._outstanding_inputs -= 1
                self._outstanding_bytes -= size
        self._window_open.set()

    async def _receive(self, ws) -> None:
        remaining = self.spec.n_inputs
        display = self.display
        while True:
            msg = await self._next_message(ws)
            if msg is None:
                if self._cancel_reason is not None:
                    raise JobCanceled(f"job {self.spec.job_id} canceled: {self._cancel_reason}")
                if remaining == 0:
                    return
                raise NodeDisconnected(
                    f"lost the connection to the head at {self.cluster.url} with {remaining} of "
                    f"{self.spec.n_inputs} results outstanding"
                )
            if isinstance(msg, wire.ResultBatch):
                outcomes = [self._outcome(index, ok, payload) for index, ok, payload in msg.items]
                await ws.send_bytes(wire.ResultAck(self.spec.job_id, msg.seq).encode())
                self._free_window([o.index for o in outcomes])
                for outcome in outcomes:
                    display.count_result(outcome.ok)
                remaining -= len(outcomes)
                self.outcomes.put(outcomes)
            elif isinstance(msg, wire.OutputBatch):
                display.output(msg.items)
            elif isinstance(msg, wire.Progress):
                display.progress(msg.done, msg.failed, msg.running)
            elif isinstance(msg, wire.JobEnded):
                if msg.status == "COMPLETED" or (msg.kind == "CallFailed" and not self.spec.detach):
                    return  # a failed call's exception is already in the outcomes
                if msg.kind == "JobCanceled" and self._cancel_reason is not None:
                    raise JobCanceled(f"job {self.spec.job_id} canceled: {self._cancel_reason}")
                raise error_from_wire(msg.kind, f"job {self.spec.job_id} ended {msg.status}: {msg.reason}")
            elif isinstance(msg, wire.ErrorReply):
                raise error_from_wire(msg.kind, msg.message)

    def _outcome(self, index: int, ok: bool, payload: bytes) -> Outcome:
        if not ok:
            return Outcome(index, False, unpack_error(payload, index))
        try:
            return Outcome(index, True, loads(payload))
        except Exception as e:
            error: BaseException = RemoteError(
                type(e).__name__, f"the result of input {index} can't be unpickled here: {e}"
            )
            error.burla_input_index = index  # type: ignore[attr-defined]
            return Outcome(index, False, error)

    # --- for the user's thread -----------------------------------------------------------

    def next_outcomes(self, timeout: float = 0.25) -> list[Outcome] | None:
        """The next batch of outcomes; [] on timeout; None once the job thread has ended."""
        try:
            item = self.outcomes.get(timeout=timeout)
        except queue.Empty:
            return []
        return None if item is _END else item

