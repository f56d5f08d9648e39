"""History's writes, on a thread and a SQLite connection of their own.

A flush is one hop to that thread, whatever it writes. Through aiosqlite every statement and the
commit were a hop each (a queue, a thread wake-up and a wake-up of the event loop), and a warm
single-call job's flush cost the head ~0.5 ms of CPU that way, against ~0.1 ms of SQLite work.
Reads stay on History's aiosqlite connection; WAL lets them run beside a write.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burla.head.history.schema import JOB_COLUMNS


@dataclass
class Rows:
    """What one flush writes, taken out of History's in-memory buffers (put back if the write fails)."""

    jobs: list[tuple]
    failures: list[tuple]
    output: dict[str, list]
    events: list[tuple]
    samples: list[tuple]
    job_samples: list[tuple]
    live: dict[str, bytes | None]
    kept_inputs: list[tuple]
    kept_results: list[tuple]
    # Per-call records as results brought them, one row per result batch: (job_id, node_id, indices,
    # failed, timings, tries as JSON): a row per call cost the head a third of a no-op call's time.
    calls: list[tuple]

    def __bool__(self) -> bool:
        return any((self.jobs, self.failures, self.output, self.events, self.samples, self.job_samples, self.live,
                    self.kept_inputs, self.kept_results, self.calls))


class HistoryWriter:
    """The one thread and connection that write history. Calls run one at a time, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="burla-history-writer")
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        await self._run(self._connect)

    async def close(self) -> None:
        try:
            await self._run(self._disconnect)
        finally:
            self._thread.shutdown(wait=False)  # its last call has returned: the thread ends at once

    def write(self, rows: Rows) -> asyncio.Future[None]:
        """Write `rows` in one transaction (rolled back if any of it fails). The write goes on in
        its thread if the caller stops waiting: its outcome is the future's."""
        return asyncio.get_running_loop().run_in_executor(self._thread, self._write, rows)

    async def prune(self, cutoff: float) -> None:
        await self._run(self._prune, cutoff)

    async def save_settings(self, data: dict[str, Any]) -> None:
        await self._run(self._save_settings, json.dumps(data))

    async def _run(self, function: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, function, *args)

    # --- on the writer's thread ----------------------------------------------------------

    def _connect(self) -> None:
        conn = sqlite3.connect(self.path, check_same_thread=False)
        conn.execute("PRAGMA synchronous=NORMAL")  # per connection; WAL itself is the file's
        self._conn = conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _transaction(self, statements: list[tuple[str, Any]]) -> None:
        conn = self._conn
        if conn is None:
            raise sqlite3.ProgrammingError("history's writer is closed")
        try:
            for sql, values in statements:
                conn.executemany(sql, values)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    def _write(self, rows: Rows) -> None:
        if not rows:
            return
        now = time.time()
        output_rows = [
            (job_id, min(c[0] for c in chunks), max(c[0] for c in chunks), now, json.dumps(chunks))
            for job_id, chunks in rows.output.items()
        ]
        live = rows.live
        closed = [(job_id,) for job_id, opening in live.items() if opening is None]
        placeholders = ", ".join("?" * len(JOB_COLUMNS))
        statements = [
            ("INSERT OR REPLACE INTO live_jobs VALUES (?, ?)",
             [(job_id, opening) for job_id, opening in live.items() if opening is not None]),
            ("INSERT OR IGNORE INTO kept_inputs VALUES (?, ?, ?)", rows.kept_inputs),
            ("INSERT OR IGNORE INTO kept_results VALUES (?, ?, ?, ?)", rows.kept_results),
            ("DELETE FROM kept_inputs WHERE job_id = ? AND input_index = ?",
             [(job_id, index) for job_id, index, _, _ in rows.kept_results]),
            *[(f"DELETE FROM {table} WHERE job_id = ?", closed)
              for table in ("live_jobs", "kept_inputs", "kept_results")],
            (f"INSERT OR REPLACE INTO jobs ({', '.join(JOB_COLUMNS)}) VALUES ({placeholders})", rows.jobs),
            ("INSERT OR REPLACE INTO call_failures VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows.failures),
            ("INSERT INTO call_batches VALUES (?, ?, ?, ?, ?, ?)", rows.calls),
            ("INSERT INTO call_output VALUES (?, ?, ?, ?, ?)", output_rows),
            ("INSERT INTO node_events VALUES (?, ?, ?, ?)", rows.events),
            ("INSERT INTO node_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows.samples),
            ("INSERT INTO job_samples VALUES (?, ?, ?, ?, ?)", rows.job_samples),
        ]
        self._transaction([(sql, values) for sql, values in statements if values])

    def _prune(self, cutoff: float) -> None:
        old = "SELECT job_id FROM jobs WHERE started_at < ? AND status != 'RUNNING'"
        self._transaction([
            (f"DELETE FROM call_output WHERE job_id IN ({old})", [(cutoff,)]),
            (f"DELETE FROM call_failures WHERE job_id IN ({old})", [(cutoff,)]),
            (f"DELETE FROM call_batches WHERE job_id IN ({old})", [(cutoff,)]),
            (f"DELETE FROM job_samples WHERE job_id IN ({old})", [(cutoff,)]),
            ("DELETE FROM jobs WHERE started_at < ? AND status != 'RUNNING'", [(cutoff,)]),
            ("DELETE FROM node_events WHERE at < ?", [(cutoff,)]),
            ("DELETE FROM node_samples WHERE at < ?", [(cutoff,)]),
        ])

    def _save_settings(self, encoded: str) -> None:
        self._transaction([("INSERT OR REPLACE INTO settings VALUES (1, ?)", [(encoded,)])])
