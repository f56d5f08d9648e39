"""The head's history in SQLite (WAL): jobs, failed calls, call output, node events and samples.

The head's memory is the live truth; this is what survives a restart. Writes never happen on
the hot path: event handlers append rows to in-memory buffers, and one flusher task writes
them in a single transaction every half second (sooner when a buffer grows large). Rows older
than the retention are pruned at start-up and hourly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiosqlite

from burla.config import private_dir, private_file
from burla.errors import ProtocolError
from burla.head.history.queries import HistoryQueries
from burla.head.history.schema import (
    MIGRATIONS,
    SCHEMA,
    SCHEMA_VERSION,
)
from burla.head.history.writer import HistoryWriter, Rows
from burla.protocol import wire
from burla.protocol.states import EndKind, JobStatus, parse_state
from burla.protocol.values.inline_values import loaded_result, stored_result

if TYPE_CHECKING:
    from burla.protocol.views import JobView

log = logging.getLogger("burla.head")

FLUSH_EVERY_S = 0.5
FLUSH_AT_ROWS = 20_000
KEEP_AFTER_FAILED_WRITES = 100_000  # output chunks, and samples, kept for the next write when one fails
PRUNE_EVERY_S = 3600.0




async def _one_row(cursor: aiosqlite.Cursor) -> Any:
    row = await cursor.fetchone()
    if row is None:
        raise sqlite3.DatabaseError("a query that always returns a row returned none")
    return row


@dataclass
class KeptJob:
    """A job a restarted head takes up: its OpenJob frame, how it stood, and (detached) what was kept."""

    opening: bytes
    started_at: float | None
    status: JobStatus
    reason: str
    end_kind: EndKind  # the error kind it ended with, if it ended (detached, not yet collected)
    inputs: list  # [[index, data], ...] without a result yet
    results: list  # [[index, ok, payload], ...] not yet collected


class History(HistoryQueries):
    keeps = True  # a Recorder that writes down what it is told

    def __init__(self, path: Path, retention_days: float) -> None:
        self.path = path
        self.retention_s = retention_days * 86400
        self._db: aiosqlite.Connection | None = None  # reads (and opening the database)
        self._writer: HistoryWriter | None = None  # every write after that
        self._jobs: dict[str, tuple] = {}  # latest row per job, upserted at the next flush
        self._failures: list[tuple] = []
        self._calls: list[tuple] = []  # per-call records as results brought them (Rows.calls)
        self._calls_read: OrderedDict = OrderedDict()  # decoded call records of the jobs read last
        self._call_rows = 0
        self._output: dict[str, list] = {}  # job id -> [[index, stream, text], ...] since the last flush
        self._events: list[tuple] = []
        self._samples: list[tuple] = []
        self._job_samples: list[tuple] = []
        self._live: dict[str, bytes | None] = {}  # job id -> its opening frame (None: it ended)
        self._kept_inputs: list[tuple] = []  # (job id, index, data) of detached jobs
        self._kept_results: list[tuple] = []  # (job id, index, ok, payload) of detached jobs
        self._output_rows = 0
        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._closing = False
        self._after_flush: list[Callable[[], None]] = []  # run once what was recorded before is written
        self._ready = asyncio.Event()  # set once the database is open; reads wait for it
        self._task: asyncio.Task | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def _private_files(self) -> None:
        """History holds every job's output and errors: 0600. SQLite gives its -wal and -shm
        files the database's mode; older ones are tightened too."""
        private_file(self.path)
        for suffix in ("-wal", "-shm", "-journal"):
            companion = self.path.with_name(self.path.name + suffix)
            if companion.exists():
                private_file(companion)

    async def open(self) -> None:
        """Open (or create) the database. Rows recorded before it is open wait in memory."""
        private_dir(self.path.parent)
        self._private_files()
        self._db = await aiosqlite.connect(self.path)
        async with self._db.execute("PRAGMA user_version") as cursor:
            (version,) = await _one_row(cursor)
        async with self._db.execute("SELECT count(*) FROM sqlite_master") as cursor:
            (tables,) = await _one_row(cursor)
        if tables and version in MIGRATIONS:
            for statement in MIGRATIONS[version]:
                try:
                    await self._db.execute(statement)
                except sqlite3.OperationalError as e:
                    if "no such table" not in str(e):
                        raise  # a table that is missing is made whole by SCHEMA below
            version = SCHEMA_VERSION
        if tables and version != SCHEMA_VERSION:  # written by another burla version: keep it aside
            await self._db.close()
            aside = self.path.with_name(f"{self.path.name}.v{version}-{int(time.time())}")
            self.path.rename(aside)
            log.warning("history at %s has schema %d, not %d; moved it to %s", self.path, version, SCHEMA_VERSION,
                        aside)
            self._private_files()
            self._db = await aiosqlite.connect(self.path)
        await self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        async with self._db.execute("PRAGMA journal_mode=WAL") as cursor:
            (mode,) = await _one_row(cursor)
        if str(mode).lower() != "wal":  # reads then wait for writes (and writes for reads)
            log.warning("history at %s can't use SQLite's WAL journal (it uses %s here)", self.path, mode)
        await self._db.execute("PRAGMA synchronous=NORMAL")
        await self._db.executescript(SCHEMA)
        # Jobs that were running when the previous head stopped and were not kept to be taken up
        # again (no history of their opening: a crash right as they opened) can't resume: say so.
        await self._db.execute(
            "UPDATE jobs SET status='FAILED', reason='the head restarted while the job ran', ended_at=? "
            "WHERE status='RUNNING' AND job_id NOT IN (SELECT job_id FROM live_jobs)",
            (time.time(),),
        )
        await self._db.commit()
        self._writer = HistoryWriter(self.path)
        await self._writer.open()
        await self.prune()
        self._ready.set()
        self._task = asyncio.create_task(self._flush_loop(), name="history-writer")

    async def close(self) -> None:
        if self._task is not None:
            # Let the writer finish the write it may be in (cancelling it mid-commit could leave
            # rows both committed and queued again), then write what is left.
            self._closing = True
            self._wake.set()
            await self._task
            self._task = None
        if self._writer is not None:
            await asyncio.shield(self.flush())  # the final writes must land
            await self._writer.close()
            self._writer = None
        if self._db is not None:
            await self._db.close()
            self._db = None

    # --- recording (synchronous, cheap: rows wait in memory) -----------------------------

    def job(self, view: JobView, arguments: dict) -> None:
        """Record a job's current state (its row is replaced at the next flush)."""
        row = (view.job_id, view.parent_job_id, view.function_name, str(view.status), view.reason, view.n_inputs,
               view.n_done, view.n_failed, view.started_at, view.ended_at, json.dumps(arguments), str(view.end_kind))
        self._jobs[view.job_id] = row
        self._poke(1)

    def failures(self, job_id: str, results: list) -> None:
        now = time.time()
        for index, ok, payload in results:
            if ok:
                continue
            try:
                record = wire.read_error(payload)  # typed fields only: the head never unpickles
                row = (job_id, index, record.qualified_name, record.message, record.traceback, now, record.node_id,
                       record.host, record.worker_pid)
            except ProtocolError:  # a payload we can't read is still a failure worth listing
                row = (job_id, index, "unknown", "the error could not be read", "", now, "", "", 0)
            self._failures.append(row)
        self._poke(len(results))

    def job_opened(self, job_id: str, opening: bytes) -> None:
        """A running job's OpenJob frame, kept until it ends so a restarted head can take it up
        (written at once, not at the next periodic flush: a crash may come any moment)."""
        self._live[job_id] = opening
        self._wake.set()

    def job_closed(self, job_id: str) -> None:
        """The job ended (or, detached, was collected): forget its opening and what was kept."""
        self._live[job_id] = None
        self._kept_inputs = [row for row in self._kept_inputs if row[0] != job_id]
        self._kept_results = [row for row in self._kept_results if row[0] != job_id]
        self._poke(1)

    def keep_inputs(self, job_id: str, items: list) -> None:
        """A detached job's inputs: written at once, as its client may already be gone."""
        self._kept_inputs.extend((job_id, index, data) for index, data in items)
        self._wake.set()

    def keep_results(self, job_id: str, items: list) -> None:
        self._kept_results.extend((job_id, index, *stored_result(ok, payload)) for index, ok, payload in items)
        self._poke(len(items))

    async def kept_jobs(self) -> list[KeptJob]:
        """Jobs that were running (or, detached, not yet collected) when the head last stopped,
        with the inputs and results kept for detached ones."""
        rows = await self._rows(
            "SELECT live_jobs.job_id, live_jobs.opening, jobs.started_at, jobs.status, jobs.reason, jobs.end_kind "
            "FROM live_jobs LEFT JOIN jobs ON jobs.job_id = live_jobs.job_id")
        kept = []
        for row in rows:
            inputs = await self._rows("SELECT input_index, data FROM kept_inputs WHERE job_id = ? "
                                      "ORDER BY input_index", (row["job_id"],))
            results = await self._rows("SELECT input_index, ok, payload FROM kept_results WHERE job_id = ? "
                                       "ORDER BY input_index", (row["job_id"],))
            kept.append(KeptJob(
                bytes(row["opening"]), row["started_at"], parse_state(JobStatus, row["status"], JobStatus.RUNNING),
                row["reason"] or "", parse_state(EndKind, row["end_kind"], EndKind.NONE),
                [[r["input_index"], bytes(r["data"])] for r in inputs],
                [[r["input_index"], *loaded_result(r["ok"], bytes(r["payload"]))] for r in results],
            ))
        return kept

    def output(self, job_id: str, items: list) -> None:
        self._output.setdefault(job_id, []).extend(items)
        self._output_rows += len(items)
        self._poke(len(items))

    def node_event(self, node_id: str, event: str, detail: str = "") -> None:
        self._events.append((node_id, event, detail, time.time()))
        self._poke(1)

    def calls(self, job_id: str, node_id: str, indices: bytes, failed: bytes, timings: bytes,
              tries: dict[int, int] | None) -> None:
        """Per-call records of these results (packed as they came: the rows are made when written)."""
        self._calls.append((job_id, node_id, indices, failed, timings, json.dumps(tries) if tries else ""))
        self._call_rows += len(indices) // 4
        self._poke(0)

    def node_sample(self, node_id: str, cpu_percent: float, mem_percent: float, net_sent_bps: float,
                    net_recv_bps: float, workers_alive: int, running: int, gpu_percent: float = 0.0,
                    gpu_mem_percent: float = 0.0) -> None:
        self._samples.append((node_id, time.time(), cpu_percent, mem_percent, net_sent_bps, net_recv_bps,
                              workers_alive, running, gpu_percent, gpu_mem_percent))
        self._poke(1)

    def job_sample(self, job_id: str, n_done: int, n_failed: int, running: int) -> None:
        self._job_samples.append((job_id, time.time(), n_done, n_failed, running))

    def _poke(self, rows: int) -> None:
        waiting = (self._output_rows + len(self._failures) + len(self._kept_inputs) + len(self._kept_results)
                   + self._call_rows)
        if waiting > FLUSH_AT_ROWS:
            self._wake.set()

    # --- writing -------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        last_prune = time.monotonic()
        while not self._closing:
            with contextlib.suppress(TimeoutError):  # not wait_for: 3.11's may swallow a cancel
                async with asyncio.timeout(FLUSH_EVERY_S):
                    await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return  # close() writes what is left
            try:
                await self.flush()
                if time.monotonic() - last_prune > PRUNE_EVERY_S:
                    last_prune = time.monotonic()
                    await self.prune()
            except sqlite3.Error as e:  # a full disk must not take the head down
                log.error("history write failed: %s", e)

    def after_flush(self, callback: Callable[[], None]) -> None:
        """Call `callback` once everything recorded so far is committed (a crash can't lose it)."""
        self._after_flush.append(callback)
        self._wake.set()

    async def flush(self) -> None:
        """Write everything recorded so far. One write at a time: a read that flushes while the
        writer task is mid-write waits for it, so it sees those rows too."""
        if self._writer is None or not self._ready.is_set():
            return  # not open yet: rows keep waiting in memory
        await self._flush_lock.acquire()
        # From here the lock is held until this write settles (`_written` releases it), even if
        # the caller is cancelled meanwhile: a later flush must not take rows before this one's
        # are written or put back, or rows would be put back behind newer ones.
        writer = self._writer
        if writer is None:  # closed while this waited: the rows stay in memory
            self._flush_lock.release()
            return
        callbacks, self._after_flush = self._after_flush, []
        rows = self._take_rows()
        try:
            if not rows:  # nothing to write: what was recorded before is written already
                for callback in callbacks:
                    callback()
                self._flush_lock.release()
                return
            written = writer.write(rows)
        except BaseException:
            if rows:
                self._put_back(rows)
                self._after_flush[:0] = callbacks
            self._flush_lock.release()
            raise
        written.add_done_callback(functools.partial(self._written, rows, callbacks))
        await asyncio.shield(written)  # a cancelled caller leaves the write to finish and settle

    def _written(self, rows: Rows, callbacks: list[Callable[[], None]], written: asyncio.Future) -> None:
        try:
            if written.cancelled() or written.exception() is not None:
                # Nothing of this write is kept (it was rolled back): its rows wait for the next one.
                self._put_back(rows)
                self._after_flush[:0] = callbacks  # confirmed only by a later write that lands
                return
            for callback in callbacks:
                callback()
        finally:
            self._flush_lock.release()

    def _take_rows(self) -> Rows:
        rows = Rows(list(self._jobs.values()), self._failures, self._output, self._events, self._samples,
                     self._job_samples, self._live, self._kept_inputs, self._kept_results, self._calls)
        self._jobs, self._failures, self._output, self._events, self._samples = {}, [], {}, [], []
        self._job_samples, self._live, self._kept_inputs, self._kept_results, self._calls = [], {}, [], [], []
        self._output_rows = self._call_rows = 0
        return rows

    def _put_back(self, rows: Rows) -> None:
        """Rows of a failed write wait again, older than anything recorded since. What jobs need
        (their state, kept inputs and results, failures, node events) is all kept; output and
        samples only up to KEEP_AFTER_FAILED_WRITES rows each, so a disk that stays full can't
        make the head's memory grow without end."""
        for row in rows.jobs:
            self._jobs.setdefault(row[0], row)  # a newer state recorded meanwhile wins
        self._failures[:0] = rows.failures
        room = max(0, KEEP_AFTER_FAILED_WRITES - self._output_rows)
        dropped = 0
        for job_id, chunks in rows.output.items():
            kept = chunks[-room:] if room else []
            dropped += len(chunks) - len(kept)
            room -= len(kept)
            if kept:
                self._output[job_id] = kept + self._output.get(job_id, [])
                self._output_rows += len(kept)
        self._events[:0] = rows.events
        for name in ("samples", "job_samples"):
            waiting, failed = getattr(self, f"_{name}"), getattr(rows, name)
            room = max(0, KEEP_AFTER_FAILED_WRITES - len(waiting))
            again = failed[-room:] if room else []
            dropped += len(failed) - len(again)
            waiting[:0] = again
        if dropped:
            log.warning("history: %d output chunks and samples dropped while writes fail", dropped)
        for job_id, opening in rows.live.items():
            self._live.setdefault(job_id, opening)
        self._kept_inputs[:0] = rows.kept_inputs
        self._kept_results[:0] = rows.kept_results
        if self._call_rows < KEEP_AFTER_FAILED_WRITES:  # per-call records are a courtesy: bounded like output
            self._calls[:0] = rows.calls
            self._call_rows += sum(len(batch[2]) // 4 for batch in rows.calls)

    async def prune(self) -> None:
        writer = self._writer
        if writer is None:
            return
        async with self._flush_lock:  # one transaction at a time
            await writer.prune(time.time() - self.retention_s)

    async def save_settings(self, data: dict[str, Any]) -> None:
        await self._ready.wait()
        assert self._writer is not None
        async with self._flush_lock:  # one transaction at a time
            await self._writer.save_settings(data)
