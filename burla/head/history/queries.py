"""What the head's history answers: jobs, failed calls, call output, node events and samples,
the nodes connected when the head last stopped, and saved settings. Each read first writes what
was recorded so far, so it sees everything (History, head/history/store.py, does the writing; it also
reads back the jobs kept across a restart, beside what keeps them)."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite

from burla.protocol.values.packed_results import read_timings, unpack_indices

HEAD_STOPPED = "head stopped"  # a node event: connected when the head stopped (it is expected back)


CALLS_KEPT_FOR_JOBS = 4  # jobs whose decoded call records stay in memory between reads


class HistoryQueries:
    """The reading half of History, which provides the connection and `flush`."""

    _db: aiosqlite.Connection | None
    _ready: asyncio.Event
    flush: Callable[[], Awaitable[None]]
    _calls_read: OrderedDict[str, tuple[int, dict[int, dict[str, Any]]]]  # job -> (last rowid read, calls)

    async def _rows(self, sql: str, args: tuple = ()) -> list[dict[str, Any]]:
        await self._ready.wait()
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

    async def failures_of(self, job_id: str, limit: int = 1000, offset: int = 0, first_index: int = 0,
                          last_index: int | None = None) -> list[dict[str, Any]]:
        """A page of a job's failed calls by input index, optionally within an index range."""
        last = (1 << 62) if last_index is None else last_index
        return await self._rows(
            "SELECT input_index, exception_type, message, traceback, at, node_id, host, worker_pid FROM call_failures "
            "WHERE job_id = ? "
            "AND input_index BETWEEN ? AND ? ORDER BY input_index LIMIT ? OFFSET ?",
            (job_id, first_index, last, limit, offset))

    async def count_failures(self, job_id: str) -> int:
        rows = await self._rows("SELECT COUNT(*) AS n FROM call_failures WHERE job_id = ?", (job_id,))
        return int(rows[0]["n"])

    async def search_output(self, job_id: str, text: str, limit: int) -> list[dict[str, Any]]:
        """Chunks any call of the job printed that contain `text`, by input index."""
        escaped = json.dumps(text)[1:-1]  # chunks are stored JSON-encoded
        pattern = "%" + escaped.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = await self._rows(
            "SELECT at, chunks FROM call_output WHERE job_id = ? AND chunks LIKE ? ESCAPE '\\' ORDER BY rowid",
            (job_id, pattern))
        matches = [
            {"input_index": index, "stream": stream, "text": chunk, "at": row["at"]}
            for row in rows for index, stream, chunk in json.loads(row["chunks"]) if text in chunk
        ]
        matches.sort(key=lambda m: m["input_index"])  # stable: each call's chunks stay in order
        return matches[:limit]

    async def output_of(self, job_id: str, input_index: int) -> list[dict[str, Any]]:
        rows = await self._rows(
            "SELECT at, chunks FROM call_output WHERE job_id = ? AND min_index <= ? AND max_index >= ? ORDER BY rowid",
            (job_id, input_index, input_index))
        return [
            {"stream": stream, "text": chunk, "at": row["at"]}
            for row in rows for index, stream, chunk in json.loads(row["chunks"]) if index == input_index
        ]

    async def machine_events(self, started_event: str) -> list[dict[str, Any]]:
        """Every event of the nodes that have a `started_event` (machines), in time order."""
        return await self._rows(
            "SELECT node_id, event, detail, at FROM node_events WHERE node_id IN "
            "(SELECT node_id FROM node_events WHERE event = ?) ORDER BY at", (started_event,))

    async def node_events_of(self, node_id: str, limit: int = 500) -> list[dict[str, Any]]:
        return await self._rows(
            "SELECT event, detail, at FROM node_events WHERE node_id = ? ORDER BY at DESC LIMIT ?", (node_id, limit))

    async def calls_of(self, job_id: str) -> list[dict[str, Any]]:
        """Every recorded call of a job (history keeps its first 100,000): input index, when it
        started, how long it ran, node, worker pid, tries, and whether it succeeded; by index.
        Only batches not read before are read and decoded: the job page asks every second."""
        cache = self._calls_read
        last, calls = cache.pop(job_id, (0, {}))
        batches = await self._rows("SELECT rowid, node_id, indices, failed, timings, tries FROM call_batches "
                                   "WHERE job_id = ? AND rowid > ? ORDER BY rowid", (job_id, last))
        for batch in batches:
            last = batch["rowid"]
            failed = set(unpack_indices(batch["failed"]))
            tries = {int(k): v for k, v in json.loads(batch["tries"]).items()} if batch["tries"] else {}
            for index, (started, seconds, pid) in zip(unpack_indices(batch["indices"]), read_timings(batch["timings"])):
                calls[index] = {"input_index": index, "started_at": started, "seconds": seconds,
                                "node_id": batch["node_id"], "worker_pid": pid, "attempts": tries.get(index, 0) + 1,
                                "ok": index not in failed}
        cache[job_id] = (last, calls)
        while len(cache) > CALLS_KEPT_FOR_JOBS:
            cache.popitem(last=False)
        return [calls[index] for index in sorted(calls)]

    async def events_between(self, node_id: str, events: tuple[str, ...], since: float, until: float
                             ) -> list[dict[str, Any]]:
        marks = ", ".join("?" * len(events))
        return await self._rows(
            f"SELECT event, detail, at FROM node_events WHERE node_id = ? AND event IN ({marks}) AND at >= ? "
            "AND at <= ? ORDER BY at", (node_id, *events, since, until))

    async def samples_of(self, node_id: str, since: float, until: float) -> list[dict[str, Any]]:
        return await self._rows(
            "SELECT at, cpu_percent, mem_percent, net_sent_bps, net_recv_bps, workers_alive, running, gpu_percent, "
            "gpu_mem_percent FROM node_samples "
            "WHERE node_id = ? AND at >= ? AND at <= ? ORDER BY at", (node_id, since, until))

    async def job_progress_of(self, job_id: str) -> list[dict[str, Any]]:
        return await self._rows(
            "SELECT at, n_done, n_failed, running FROM job_samples WHERE job_id = ? ORDER BY at", (job_id,))

    async def nodes_connected_at_stop(self) -> list[str]:
        """Nodes whose last event says they were connected when the head last stopped (registered,
        or still there when it stopped): they come back by themselves, with what they kept running."""
        rows = await self._rows(
            "SELECT node_id, event FROM node_events AS e WHERE at = "
            "(SELECT MAX(at) FROM node_events WHERE node_id = e.node_id)")
        return sorted({row["node_id"] for row in rows if row["event"] in ("registered", HEAD_STOPPED)})

    async def nodes_seen(self) -> list[str]:
        rows = await self._rows("SELECT DISTINCT node_id FROM node_events")
        return [row["node_id"] for row in rows]

    async def load_settings(self) -> dict[str, Any] | None:
        rows = await self._rows("SELECT data FROM settings WHERE id = 1")
        return json.loads(rows[0]["data"]) if rows else None


def summarize_calls(calls: list[dict[str, Any]], job_started_at: float) -> dict[str, Any]:
    """Over a job's recorded calls: how many, the share that succeeded, and the 50th, 95th and 99th
    percentiles of how long a call ran and of how long after the job opened it started."""
    count = len(calls)
    stats: dict[str, Any] = {"recorded": count,
                             "success_rate": sum(call["ok"] for call in calls) / count if count else None}
    for name, values in (("latency_s", sorted(call["seconds"] for call in calls)),
                         ("queue_wait_s", sorted(max(0.0, call["started_at"] - job_started_at) for call in calls))):
        stats[name] = {label: values[int(share * (count - 1))] if count else None
                       for label, share in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}
    return stats
