"""The client's side of one job, on a background thread with its own event loop.

It opens the job over one WebSocket, streams inputs up within the head's window, prints
remote output as it arrives, acknowledges result batches, and hands results to the user's
thread through a queue, so the user's thread only ever waits on that queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
import time
import zlib
from collections.abc import Sequence
from typing import Any

from burla.client.direct_sender import DirectSender
from burla.client.local_cluster import ClusterHandle
from burla.client.loop import ClientLoop, client_loop
from burla.client.progress import Display
from burla.client.results import ALL_IN, AllIn, Outcome, take_results
from burla.client.upload import Uploader
from burla.errors import (
    HeadUnreachable,
    JobCanceled,
    JobFailed,
    JobNotFound,
    NodeDisconnected,
    ProtocolError,
    Unauthorized,
    error_from_wire,
)
from burla.process.memory import JOB_COLLECTIONS
from burla.protocol import limits, wire
from burla.protocol.states import EndKind, JobStatus
from burla.protocol.values.input_files import files_root
from burla.web.login_links import LINK_PARAM, link_code
from burla.web.scoped_tokens import is_scoped, job_secret

RECONNECT_FOR_S = 60.0  # after a cut, keep trying to resume the job this long
RECONNECT_DELAY_S = 0.2
HEARTBEAT_S = 5.0  # a silently dead connection is noticed within about this
CANCEL_WAIT_S = 5.0
# Result batches are acknowledged together (the head keeps a batch until then, to send it again
# after a cut): once this many, or this many bytes, wait, or this long after the last
# acknowledgement when the next batch comes; the last results at once, as the job ends on it.
ACK_AFTER_BATCHES = 8
ACK_AFTER_BYTES = 4 * 2**20
ACK_AFTER_S = 0.05


_END = object()


class _ConnectionLost(Exception):
    """The connection to the head dropped; the job may still be resumed."""


class JobRunner:
    def __init__(
        self,
        cluster: ClusterHandle,
        job_id: str,
        display: Display,
        opening: wire.OpenJob | None = None,
        inputs: Sequence[Any] = (),
        in_order: bool = False,
        secret: str | None = None,
    ) -> None:
        """Run a new job (`opening` given) or collect an existing one's results (`opening` None,
        with the job's `secret` if this client heard it when it opened the job).
        With `in_order` (a new job), the values go straight into `results`, in input order, and
        only failures (then ALL_IN) go through `outcomes`: a hand-over per batch to the caller's
        thread, and its loop over every outcome, were a good part of a short call's client cost."""
        self.cluster = cluster
        self.job_id = job_id
        self.opening = opening
        self.n_inputs = opening.n_inputs if opening is not None else 0
        # A detaching client only uploads: the head keeps every result for get_results.
        self._detaching = opening is not None and opening.detach
        self.display = display
        self.outcomes: queue.SimpleQueue = queue.SimpleQueue()  # Outcome lists, then _END
        self.results: list[Any] | None = [None] * self.n_inputs if in_order and opening is not None else None
        self.error: BaseException | None = None  # why the job ended early, if it did
        self.uploaded = threading.Event()
        self.opened = threading.Event()  # the head accepted or resumed the job; n_inputs is known
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ws = None
        self._cancel_reason: str | None = None
        self._ended = threading.Event()
        self._last_ack_sent = threading.Event()  # every result is here and the head was told so
        self._side_tasks: set[asyncio.Future] = set()
        self._session_over = False  # set on the loop once `_run` stops taking side tasks
        self._received = bytearray(self.n_inputs)  # per index: result handed over yet?
        self.upload = Uploader(job_id, inputs, self._received, display, self._detaching)
        self.direct = DirectSender(job_id, self.upload.direct_pending, self.upload.pickled_input,
                                   lambda msg: self._send(self._ws, msg), client_loop,
                                   lambda index: index < len(self._received) and self._received[index] != 0)
        self._remaining = self.n_inputs
        self._acked_seq = 0  # the last result batch taken (acknowledged, or soon)
        self._unacked_batches = self._unacked_bytes = 0
        self._last_ack_at = 0.0
        self._frame_bytes = 0  # of the frame read last
        self._closing = False
        self._shared: ClientLoop | None = None
        self._lost_at: float | None = None  # when the connection to the head dropped, while it is down
        # What resuming the job takes: JobAccepted says it; a cluster token's holder derives it.
        self._secret = secret or ("" if is_scoped(cluster.token) else job_secret(cluster.token, job_id))

    @property
    def secret(self) -> str:  # what resuming this job takes (heard from the head when the job opened)
        return self._secret

    def start(self) -> None:
        """Run the job on this process's client loop (shared by its jobs)."""
        self._shared = client_loop()
        self._loop = self._shared.loop
        JOB_COLLECTIONS.job_started()  # until `_main` ends
        try:
            self._shared.submit(self._main())
        except BaseException:
            JOB_COLLECTIONS.job_ended()
            raise

    async def _main(self) -> None:
        try:
            await self._run()
        except BaseException as e:  # anything unexpected still ends the job for the caller
            if self.error is None:
                self.error = e
        finally:
            JOB_COLLECTIONS.job_ended()
            self._ended.set()
            self._last_ack_sent.set()
            self.uploaded.set()
            self.opened.set()
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
        """The caller is done. With every result handed over, wait for the last acknowledgement to
        be sent; the loop closes the connection by itself (it outlives this call). Otherwise stop
        listening (the head then ends the job) and wait briefly for that."""
        loop = self._loop
        if loop is None or self._ended.is_set():
            return
        if self.opened.is_set() and self._remaining == 0:
            # Only the last acknowledgement is still to go (it follows the results at once): a
            # process that ends with os._exit would otherwise leave its job to be cancelled.
            self._last_ack_sent.wait(CANCEL_WAIT_S)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._request_close)
        self._ended.wait(CANCEL_WAIT_S)

    def _request_cancel(self, reason: str) -> None:
        self._cancel_reason = reason
        if self._ws is not None and not self._ws.closed:
            self._side_task(self._ws.send_bytes(wire.CancelJob(self.job_id, reason).encode()))

    def _request_close(self) -> None:
        self._closing = True
        if self._ws is not None:
            self._side_task(self._ws.close())

    def _side_task(self, coroutine) -> None:
        """Run a one-off send on the loop; `_run` awaits whatever is left before it returns."""
        if self._session_over:  # a close or cancel that arrives after the end: nothing to send
            coroutine.close()
            return
        task = asyncio.ensure_future(coroutine)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # --- the session ---------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._session()
        finally:
            self._session_over = True
            for task in list(self._side_tasks):
                with contextlib.suppress(Exception):
                    await task
            await self.direct.close()
            self.upload.close_files()

    async def _session(self) -> None:
        """Open the job, then keep it going across connection cuts until it ends."""
        opened = self.opening is None  # collecting results: resume from the start
        first_batch = [] if opened else self.upload.first_batch()
        assert self._shared is not None
        session = self._shared.session(self.cluster.cert)
        kept = self._shared.connections(self.cluster.url, self.cluster.token, self.cluster.cert)
        # Collecting a job's results takes a new connection: a kept one may still carry late
        # frames of an earlier collection of the same job, which its job id can't tell apart.
        reuse = self.opening is not None
        while True:
            ws = await kept.take() if reuse else None
            reused = ws is not None
            if ws is None:
                try:
                    ws = await self._connect(session)
                except _ConnectionLost as e:
                    if not opened or not self.opened.is_set():
                        raise HeadUnreachable(f"can't reach the head at {self.cluster.url}: {e}") from None
                    self._give_up_if_too_long()
                    await asyncio.sleep(RECONNECT_DELAY_S)
                    continue
            self._ws = ws
            try:
                try:
                    await self._over(ws, opened, first_batch)
                except BaseException:
                    with contextlib.suppress(Exception):
                        await ws.close()
                    raise
                # Every result is in and acknowledged: the connection serves this process's next job.
                done = self._remaining == 0 and self.opened.is_set() and not self._detaching
                if not (done and not self._closing and self._cancel_reason is None and kept.give_back(ws)):
                    with contextlib.suppress(Exception):
                        await ws.close()
                return
            except _ConnectionLost:
                if reused and not self.opened.is_set():
                    reuse = False  # a kept connection that had just closed: open a new one
                    continue
                opened = opened or self.opened.is_set()
                first_batch = []
                if self._cancel_reason is not None:
                    raise JobCanceled(f"job {self.job_id} canceled: {self._cancel_reason}") from None
                if self._closing:
                    return
                if not self.opened.is_set():
                    raise HeadUnreachable(f"the head at {self.cluster.url} dropped the connection") from None
                self._lost_at = self._lost_at or time.monotonic()
                self._give_up_if_too_long()
                await asyncio.sleep(RECONNECT_DELAY_S)

    async def _over(self, ws, opened: bool, first_batch: list) -> None:
        """The job over one connection: opened (or resumed) on it, then run until it ends."""
        if not opened:
            assert self.opening is not None
            if self._cancel_reason is not None:  # canceled while it connected: never opened
                raise JobCanceled(f"job {self.job_id} canceled: {self._cancel_reason}")
            if self._closing:  # the caller left while it connected
                return
            # The first inputs go in the opening's frame: a short job does not wait a round trip
            # before its inputs leave, and a small one is one frame.
            await self._send(ws, self.opening.replace(first_inputs=first_batch) if first_batch else self.opening)
            early = self.upload.first_batch_sent(first_batch)
            _, window = await self._expect_opening(ws, wire.JobAccepted)
            start = early
            if self._cancel_reason is not None:  # canceled while the head answered
                await self._send(ws, wire.CancelJob(self.job_id, self._cancel_reason))
        else:
            # What this client already has, for a head that restarted and lost count.
            held = zlib.compress(self._received, 1) if self.opening is not None else b""
            await self._send(ws, wire.ResumeJob(self.job_id, self._acked_seq, held, self._secret))
            try:
                start, window = await self._expect_opening(ws, wire.JobResumed)
            except JobNotFound:
                if self.opening is None:
                    raise
                raise JobFailed(
                    f"the head at {self.cluster.url} no longer knows job {self.job_id} (it "
                    f"restarted while this client was reconnecting); {self._remaining} of "
                    f"{self.n_inputs} results are missing. Run the job again."
                ) from None
        self._lost_at = None
        await self._exchange(ws, start, window)

    def _give_up_if_too_long(self) -> None:
        if self._lost_at is not None and time.monotonic() - self._lost_at > RECONNECT_FOR_S:
            raise NodeDisconnected(
                f"lost the connection to the head at {self.cluster.url} and could not resume job "
                f"{self.job_id} within {RECONNECT_FOR_S:.0f} s; {self._remaining} of "
                f"{self.n_inputs} results are missing"
            )

    async def _connect(self, session):
        import aiohttp

        from burla.client.head_check import prove_if_local
        from burla.web import ws_bulk

        headers = {"Authorization": f"Bearer {self.cluster.token}"}
        try:
            await prove_if_local(session, self.cluster.url, self.cluster.token)  # before the token goes there
            ws = await session.ws_connect(
                f"{self.cluster.url}/v1/jobs/ws", headers=headers, max_msg_size=limits.MAX_FRAME_BYTES,
                heartbeat=HEARTBEAT_S,
            )
            ws_bulk.install_client(ws, limits.MAX_FRAME_BYTES)  # large frames read with one copy
            return ws
        except aiohttp.WSServerHandshakeError as e:
            if e.status == 401:
                raise Unauthorized(
                    f"{self.cluster.url} refused the cluster token; set BURLA_CLUSTER_TOKEN to the token of "
                    "that head."
                ) from None
            raise _ConnectionLost(f"HTTP {e.status}") from None
        except aiohttp.ClientConnectorCertificateError as e:
            from burla.web.tls import CERT_FIX

            raise HeadUnreachable(f"{self.cluster.url} presented a certificate this client does not trust "
                                  f"({e.certificate_error}); {CERT_FIX}.") from None
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise _ConnectionLost(str(e) or type(e).__name__) from None

    async def _expect_opening(self, ws, kind: type) -> tuple[int, tuple[int, int]]:
        msg = await self._next_message(ws)
        if isinstance(msg, wire.ErrorReply):
            raise error_from_wire(msg.kind, msg.message)
        if isinstance(msg, wire.JobEnded):
            raise error_from_wire(msg.kind, f"job {self.job_id} ended {msg.status}: {msg.reason}")
        if not isinstance(msg, kind):
            raise ProtocolError(f"the head answered with {type(msg).__name__}, expected {kind.__name__}")
        if isinstance(msg, wire.JobAccepted):
            self._secret = msg.job_secret
            self.display.announce(f"job {self.job_id}: {self._job_link()}")
            root = files_root() if msg.inputs_by_file else None
            if root is not None:
                self.upload.use_files(root)
            self.upload.direct = msg.direct_inputs
        if isinstance(msg, wire.JobResumed) and not self.opened.is_set():
            self.n_inputs = msg.n_inputs  # collecting a job this process did not start
            self._received = bytearray(msg.n_inputs)
            self.upload = Uploader(self.job_id, (), self._received, self.display, detaching=False)
            self._remaining = msg.n_inputs
            self.display.total = msg.n_inputs
        self.opened.set()
        assert isinstance(msg, (wire.JobAccepted, wire.JobResumed))
        start = 0 if isinstance(msg, wire.JobAccepted) else msg.inputs_received
        return start, (msg.window_inputs, msg.window_bytes)

    def _job_link(self) -> str:
        """The job's page. A client holding the cluster token signs the link so that it signs a
        browser in to that job (read-only), as Jupyter's links do; a job's token can't sign one."""
        url = f"{self.cluster.url}/jobs/{self.job_id}"
        if is_scoped(self.cluster.token):
            return url
        return f"{url}?{LINK_PARAM}={link_code(self.cluster.token, f'/jobs/{self.job_id}')}"

    async def _next_message(self, ws) -> wire.Message:
        import aiohttp

        while True:
            try:
                frame = await ws.receive()
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                raise _ConnectionLost(str(e)) from None
            if frame.type != aiohttp.WSMsgType.BINARY:
                break
            msg = wire.decode(frame.data, wire.HEAD_TO_CLIENT)
            self._frame_bytes = len(frame.data)
            if getattr(msg, "job_id", self.job_id) == self.job_id:
                return msg
            # A late frame of the job this connection carried before (it was kept for this one).
        if frame.type in (
            aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR
        ):
            raise _ConnectionLost(f"connection closed ({frame.type.name})")
        raise ProtocolError(f"unexpected {frame.type.name} frame from the head")

    async def _exchange(self, ws, start: int, window: tuple[int, int]) -> None:
        """Upload from `start` and receive until the job ends or the connection drops."""
        self.upload.resume(start, window)
        detaching = self._detaching
        if start >= self.n_inputs and not detaching:  # every input is up (a small job's went with its opening)
            self.uploaded.set()
            await self._receive(ws)
            return
        uploader = asyncio.create_task(self._upload(ws, start))
        receiver = asyncio.create_task(self._receive(ws, collect=not detaching))
        try:
            await asyncio.wait(
                (uploader, receiver), return_when=asyncio.FIRST_COMPLETED if detaching else asyncio.FIRST_EXCEPTION
            )
            if detaching and uploader.done() and not uploader.cancelled() and uploader.exception() is None:
                return  # the job runs on; its results wait on the head for get_results
            error = uploader.exception() if uploader.done() and not uploader.cancelled() else None
            if error is not None:
                if isinstance(error, _ConnectionLost):
                    raise error
                # An input that can't be sent ends the job; say why, not "canceled".
                with contextlib.suppress(Exception):
                    await ws.send_bytes(wire.CancelJob(self.job_id, str(error)).encode())
                raise error
            await receiver
        finally:
            for task in (uploader, receiver):
                task.cancel()
            for task in (uploader, receiver):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _send(self, ws, msg: wire.Message) -> None:
        import aiohttp

        from burla.web import ws_bulk

        try:
            await ws_bulk.send_bulk(ws, msg.encode_parts())
        except (aiohttp.ClientError, OSError, RuntimeError) as e:
            raise _ConnectionLost(str(e)) from None

    async def _upload(self, ws, start: int) -> None:
        await self.upload.upload(functools.partial(self._send, ws), start)
        self.uploaded.set()

    async def _receive(self, ws, collect: bool = True) -> None:
        """Take results, output and progress; with collect=False (detaching) leave results be."""
        display = self.display
        while True:
            try:
                msg = await self._next_message(ws)
            except _ConnectionLost:
                if self._remaining == 0:
                    return
                raise
            if isinstance(msg, wire.ResultBatch):
                if collect and await self._on_results(ws, msg):
                    return  # the last acknowledgement completes the job on the head: no need to hear JobEnded
            elif isinstance(msg, wire.OutputBatch):
                display.output(msg.items)
            elif isinstance(msg, wire.Progress):
                display.progress(msg.done, msg.failed, msg.running, msg.booting, msg.stages, msg.held_back)
            elif isinstance(msg, wire.JobEnded):
                self._on_end(msg)
                return
            elif isinstance(msg, wire.ErrorReply):
                raise error_from_wire(msg.kind, msg.message)
            elif isinstance(msg, (wire.UploadDirect, wire.DirectOffer)):
                self.direct.on_upload(msg)
            elif isinstance(msg, wire.InputsKept) and msg.count >= self.n_inputs:
                self.upload.kept.set()

    async def _on_results(self, ws, msg: wire.ResultBatch) -> bool:
        """Hand a batch of results over, then acknowledge it; True once every result is in."""
        taken, outcomes, failed = take_results(msg.items, self._received, self.results,
                                               self.opening.packages if self.opening else {}, msg.values(),
                                               self.direct.arrived)
        # Hand the results over before acknowledging them: once acked, the head forgets them.
        self.display.count_results(len(taken), failed)
        self.upload.results_in(taken)
        self._remaining -= len(taken)
        if self._remaining == 0:
            self.upload.close_files()  # before the caller has its results: nothing is left behind then
        if outcomes:
            self.outcomes.put(outcomes)
        if self._remaining == 0 and self.results is not None:
            self.outcomes.put(ALL_IN)
        self._acked_seq = max(self._acked_seq, msg.seq)
        self._unacked_batches += 1
        self._unacked_bytes += self._frame_bytes
        now = time.monotonic()
        # A detached job's collector acknowledges only once it holds every result: what the head
        # forgets once acknowledged would be lost to the next collector should this one stop early.
        if self._remaining == 0 or (self.opening is not None and (
                self._unacked_batches >= ACK_AFTER_BATCHES or self._unacked_bytes >= ACK_AFTER_BYTES
                or now - self._last_ack_at >= ACK_AFTER_S)):
            await self._send(ws, wire.ResultAck(self.job_id, self._acked_seq))
            self._unacked_batches = self._unacked_bytes = 0
            self._last_ack_at = now
        if self._remaining == 0:
            self._last_ack_sent.set()
            return True
        return False

    def _on_end(self, msg: wire.JobEnded) -> None:
        """The job ended: fine if it completed (or a failed call's exception is in the outcomes)."""
        if msg.status == JobStatus.COMPLETED or (msg.kind == EndKind.CALL_FAILED and self._remaining < self.n_inputs):
            return
        if msg.kind == EndKind.JOB_CANCELED and self._cancel_reason is not None:
            raise JobCanceled(f"job {self.job_id} canceled: {self._cancel_reason}")
        raise error_from_wire(msg.kind, f"job {self.job_id} ended {msg.status}: {msg.reason}")

    # --- for the user's thread -----------------------------------------------------------

    def next_outcomes(self, timeout: float = 0.25) -> list[Outcome] | AllIn | None:
        """The next batch of outcomes; [] on timeout; ALL_IN (with `results`) once every value is
        in the list; None once the job thread has ended."""
        try:
            item = self.outcomes.get(timeout=timeout)
        except queue.Empty:
            return []
        return None if item is _END else item

