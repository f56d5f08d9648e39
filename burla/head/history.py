"""The head's history in SQLite (WAL): jobs, failed calls, call output, node events and samples.

The head's memory is the live truth; this is what survives a restart. Writes never happen on
the hot path: event handlers append rows to in-memory buffers, and one flusher task writes
them in a single transaction every half second (sooner when a buffer grows large). Rows older
than the retention are pruned at start-up and hourly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pickle
import time
from pathlib import Path
from typing import Any

import aiosqlite

log = logging.getLogger("burla.head")

FLUSH_EVERY_S = 0.5
FLUSH_AT_ROWS = 20_000
PRUNE_EVERY_S = 3600.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    parent_job_id TEXT,
    function_name TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    n_inputs INTEGER NOT NULL,
    n_done INTEGER NOT NULL DEFAULT 0,
    n_failed INTEGER NOT NULL DEFAULT 0,
    started_at REAL NOT NULL,
    ended_at REAL,
    arguments TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_started ON jobs (started_at);
CREATE INDEX IF NOT EXISTS jobs_parent ON jobs (parent_job_id);
CREATE TABLE IF NOT EXISTS call_failures (
    job_id TEXT NOT NULL,
    input_index INTEGER NOT NULL,
    exception_type TEXT NOT NULL,
    message TEXT NOT NULL,
    traceback TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (job_id, input_index)
);
CREATE TABLE IF NOT EXISTS call_output (
    job_id TEXT NOT NULL,
    input_index INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    text TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS call_output_call ON call_output (job_id, input_index);
CREATE TABLE IF NOT EXISTS node_events (
    node_id TEXT NOT NULL,
    event TEXT NOT NULL,
    detail TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS node_events_node ON node_events (node_id, at);
CREATE TABLE IF NOT EXISTS node_samples (
    node_id TEXT NOT NULL,
    at REAL NOT NULL,
    cpu_percent REAL NOT NULL,
    mem_percent REAL NOT NULL,
    workers_alive INTEGER NOT NULL,
    running INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS node_samples_node ON node_samples (node_id, at);
CREATE TABLE IF NOT EXISTS job_samples (
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    n_done INTEGER NOT NULL,
    n_failed INTEGER NOT NULL,
    running INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS job_samples_job ON job_samples (job_id, at);
CREATE TABLE IF NOT EXISTS settings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    data TEXT NOT NULL
);
"""

JOB_COLUMNS = ("job_id", "parent_job_id", "function_name", "status", "reason", "n_inputs", "n_done", "n_failed",
               "started_at", "ended_at", "arguments")


class History:
    def __init__(self, path: Path, retention_days: float) -> None:
        self.path = path
        self.retention_s = retention_days * 86400
        self._db: aiosqlite.Connection | None = None
        self._jobs: dict[str, tuple] = {}  # latest row per job, upserted at the next flush
        self._failures: list[tuple] = []
        self._output: list[tuple] = []
        self._events: list[tuple] = []
        self._samples: list[tuple] = []
        self._job_samples: list[tuple] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    # --- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.execute("PRAGMA synchronous=NORMAL")
        await self._db.executescript(SCHEMA)
        # Jobs that were running when the previous head stopped can't resume: say so.
        await self._db.execute(
            "UPDATE jobs SET status='FAILED', reason='the head restarted while the job ran', ended_at=? "
            "WHERE status='RUNNING'",
            (time.time(),),
        )
        await self._db.commit()
        await self.prune()
        self._task = asyncio.create_task(self._flush_loop(), name="history-writer")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._db is not None:
            await asyncio.shield(self.flush())  # the final writes must land
            await self._db.close()
            self._db = None

    # --- recording (synchronous, cheap: rows wait in memory) -----------------------------

    def job(self, view: dict, arguments: dict) -> None:
        """Record a job's current state (its row is replaced at the next flush)."""
        row = (view["job_id"], view["parent_job_id"], view["function_name"], view["status"], view["reason"],
               view["n_inputs"], view["n_done"], view["n_failed"], view["started_at"], view["ended_at"],
               json.dumps(arguments))
        self._jobs[view["job_id"]] = row
        self._poke(1)

    def failures(self, job_id: str, results: list) -> None:
        now = time.time()
        for index, ok, payload in results:
            if ok:
                continue
            try:
                record = pickle.loads(payload)
                row = (job_id, index, record["type"], record["message"], record["traceback"], now)
            except Exception:  # a payload we can't read is still a failure worth listing
                row = (job_id, index, "unknown", "the error could not be read", "", now)
            self._failures.append(row)
        self._poke(len(results))

    def output(self, job_id: str, items: list) -> None:
        now = time.time()
        self._output.extend((job_id, index, stream, text, now) for index, stream, text in items)
        self._poke(len(items))

    def node_event(self, node_id: str, event: str, detail: str = "") -> None:
        self._events.append((node_id, event, detail, time.time()))
        self._poke(1)

    def node_sample(self, node_id: str, cpu_percent: float, mem_percent: float, workers_alive: int,
                    running: int) -> None:
        self._samples.append((node_id, time.time(), cpu_percent, mem_percent, workers_alive, running))
        self._poke(1)

    def job_sample(self, job_id: str, n_done: int, n_failed: int, running: int) -> None:
        self._job_samples.append((job_id, time.time(), n_done, n_failed, running))

    def _poke(self, rows: int) -> None:
        if len(self._output) + len(self._failures) > FLUSH_AT_ROWS:
            self._wake.set()

    # --- writing -------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        last_prune = time.monotonic()
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FLUSH_EVERY_S)
            self._wake.clear()
            try:
                await self.flush()
                if time.monotonic() - last_prune > PRUNE_EVERY_S:
                    last_prune = time.monotonic()
                    await self.prune()
            except aiosqlite.Error as e:  # a full disk must not take the head down
                log.error("history write failed: %s", e)

    async def flush(self) -> None:
        db = self._db
        if db is None:
            return
        jobs, self._jobs = list(self._jobs.values()), {}
        failures, self._failures = self._failures, []
        output, self._output = self._output, []
        events, self._events = self._events, []
        samples, self._samples = self._samples, []
        job_samples, self._job_samples = self._job_samples, []
        if not (jobs or failures or output or events or samples or job_samples):
            return
        placeholders = ", ".join("?" * len(JOB_COLUMNS))
        await db.executemany(f"INSERT OR REPLACE INTO jobs ({', '.join(JOB_COLUMNS)}) VALUES ({placeholders})", jobs)
        await db.executemany("INSERT OR REPLACE INTO call_failures VALUES (?, ?, ?, ?, ?, ?)", failures)
        await db.executemany("INSERT INTO call_output VALUES (?, ?, ?, ?, ?)", output)
        await db.executemany("INSERT INTO node_events VALUES (?, ?, ?, ?)", events)
        await db.executemany("INSERT INTO node_samples VALUES (?, ?, ?, ?, ?, ?)", samples)
        await db.executemany("INSERT INTO job_samples VALUES (?, ?, ?, ?, ?)", job_samples)
        await db.commit()

    async def prune(self) -> None:
        if self._db is None:
            return
        cutoff = time.time() - self.retention_s
        old = "SELECT job_id FROM jobs WHERE started_at < ? AND status != 'RUNNING'"
        await self._db.execute(f"DELETE FROM call_output WHERE job_id IN ({old})", (cutoff,))
        await self._db.execute(f"DELETE FROM call_failures WHERE job_id IN ({old})", (cutoff,))
        await self._db.execute(f"DELETE FROM job_samples WHERE job_id IN ({old})", (cutoff,))
        await self._db.execute("DELETE FROM jobs WHERE started_at < ? AND status != 'RUNNING'", (cutoff,))
        await self._db.execute("DELETE FROM node_events WHERE at < ?", (cutoff,))
        await self._db.execute("DELETE FROM node_samples WHERE at < ?", (cutoff,))
        await self._db.commit()

    # --- reading -------------------------------------------------------------------------

    async def _rows(self, sql: str, args: tuple = ()) -> list[dict[str, Any]]:
        assert self._db is not None
        await self.flush()  # a read sees everything recorded so far
        async with self._db.execute(sql, args) as cursor:
            names = [c[0] for c in cursor.description]
            return [dict(zip(names, row)) for row in await cursor.fetchall()]

    async def list_jobs(self, status: str | None = None, limit: int = 50, parent: str | None = None
                        ) -> list[dict[str, Any]]:
        conditions, args = [], []
        if status:
            conditions.append("status = ?")
            args.append(status)
        if parent:
            conditions.append("parent_job_id = ?")
            args.append(parent)
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        rows = await self._rows(f"SELECT * FROM jobs {where} ORDER BY started_at DESC LIMIT ?", (*args, limit))
        for row in rows:
            row["arguments"] = json.loads(row["arguments"])
        return rows

    async def get_job(self, job_id: str) -> dict[str, Any] | None:
        rows = await self._rows("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
        if not rows:
            return None
        rows[0]["arguments"] = json.loads(rows[0]["arguments"])
        return rows[0]

    async def failures_of(self, job_id: str, limit: int = 1000) -> list[dict[str, Any]]:
        return await self._rows(
            "SELECT input_index, exception_type, message, traceback, at FROM call_failures WHERE job_id = ? "
            "ORDER BY input_index LIMIT ?", (job_id, limit))

    async def output_of(self, job_id: str, input_index: int) -> list[dict[str, Any]]:
        return await self._rows(
            "SELECT stream, text, at FROM call_output WHERE job_id = ? AND input_index = ? ORDER BY rowid",
            (job_id, input_index))

    async def search_output(self, job_id: str, text: str, limit: int) -> list[dict[str, Any]]:
        pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return await self._rows(
            "SELECT input_index, stream, text, at FROM call_output WHERE job_id = ? AND text LIKE ? ESCAPE '\\' "
            "ORDER BY input_index, rowid LIMIT ?", (job_id, pattern, limit))

    async def node_events_of(self, node_id: str, limit: int = 500) -> list[dict[str, Any]]:
        return await self._rows(
            "SELECT event, detail, at FROM node_events WHERE node_id = ? ORDER BY at DESC LIMIT ?", (node_id, limit))

    async def samples_of(self, node_id: str, since: float, until: float) -> list[dict[str, Any]]:
        return await self._rows(
            "SELECT at, cpu_percent, mem_percent, workers_alive, running FROM node_samples "
            "WHERE node_id = ? AND at >= ? AND at <= ? ORDER BY at", (node_id, since, until))

    async def job_progress_of(self, job_id: str) -> list[dict[str, Any]]:
        return await self._rows(
            "SELECT at, n_done, n_failed, running FROM job_samples WHERE job_id = ? ORDER BY at", (job_id,))

    async def nodes_seen(self) -> list[str]:
        rows = await self._rows("SELECT DISTINCT node_id FROM node_events")
        return [row["node_id"] for row in rows]

    async def load_settings(self) -> dict[str, Any] | None:
        rows = await self._rows("SELECT data FROM settings WHERE id = 1")
        return json.loads(rows[0]["data"]) if rows else None

    async def save_settings(self, data: dict[str, Any]) -> None:
        assert self._db is not None
        await self._db.execute("INSERT OR REPLACE INTO settings VALUES (1, ?)", (json.dumps(data),))
        await self._db.commit()
