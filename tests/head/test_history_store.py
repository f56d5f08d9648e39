"""The history store on its own: batching, reads, retention, schema changes."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time

import pytest

from burla.head.history.store import SCHEMA_VERSION, History
from burla.head.history.writer import HistoryWriter
from burla.protocol.views import JobView


def _view(job_id: str, started_at: float, status: str = "COMPLETED", reason: str = "", end_kind: str = "") -> JobView:
    return JobView.from_json({"job_id": job_id, "parent_job_id": None, "function_name": "f", "status": status,
                              "reason": reason, "n_inputs": 3, "n_done": 3, "n_failed": 0, "started_at": started_at,
                              "ended_at": started_at + 1, "end_kind": end_kind})


async def test_rows_wait_in_memory_until_a_flush(tmp_path):
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    try:
        history.job(_view("j1", time.time()), {})
        history.output("j1", [[0, 1, "a\n"], [2, 1, "c\n"], [0, 2, "b\n"]])
        with sqlite3.connect(tmp_path / "h.db") as raw:
            assert raw.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0  # not on the hot path
        assert [r["text"] for r in await history.output_of("j1", 0)] == ["a\n", "b\n"]  # a read flushes first
        assert [m["input_index"] for m in await history.search_output("j1", "c", 10)] == [2]
        assert (await history.get_job("j1"))["status"] == "COMPLETED"
    finally:
        await history.close()


async def test_retention_prunes_old_jobs_and_their_rows(tmp_path):
    history = History(tmp_path / "h.db", retention_days=1)
    await history.open()
    try:
        old = time.time() - 3 * 86400
        history.job(_view("old", old), {})
        history.output("old", [[0, 1, "x\n"]])
        history.job(_view("new", time.time()), {})
        await history.flush()
        await history.prune()
        assert [j["job_id"] for j in await history.list_jobs()] == ["new"]
        assert await history.output_of("old", 0) == []
    finally:
        await history.close()


async def test_running_jobs_of_a_stopped_head_are_marked_failed(tmp_path):
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    history.job(_view("j", time.time(), status="RUNNING"), {})
    await history.close()
    again = History(tmp_path / "h.db", retention_days=30)
    await again.open()
    try:
        job = await again.get_job("j")
        assert job["status"] == "FAILED" and "head restarted" in job["reason"]
    finally:
        await again.close()


async def test_a_history_of_another_schema_is_kept_aside(tmp_path):
    with sqlite3.connect(tmp_path / "h.db") as raw:
        raw.execute("CREATE TABLE call_output (job_id TEXT, input_index INTEGER)")
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    try:
        history.output("j", [[0, 1, "x\n"]])
        assert [r["text"] for r in await history.output_of("j", 0)] == ["x\n"]
    finally:
        await history.close()
    assert len(list(tmp_path.glob("h.db.v0-*"))) == 1
    with sqlite3.connect(tmp_path / "h.db") as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_a_history_of_the_previous_schema_is_migrated_in_place(tmp_path):
    with sqlite3.connect(tmp_path / "h.db") as raw:
        raw.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, parent_job_id TEXT, function_name TEXT NOT NULL, "
                    "status TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', n_inputs INTEGER NOT NULL, "
                    "n_done INTEGER NOT NULL DEFAULT 0, n_failed INTEGER NOT NULL DEFAULT 0, started_at REAL NOT NULL, "
                    "ended_at REAL, arguments TEXT NOT NULL)")
        raw.execute("INSERT INTO jobs VALUES ('old', NULL, 'f', 'COMPLETED', '', 1, 1, 0, ?, NULL, '{}')",
                    (time.time(),))
        raw.execute("PRAGMA user_version=2")
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    try:
        assert (await history.get_job("old"))["end_kind"] == ""
    finally:
        await history.close()
    assert not list(tmp_path.glob("h.db.v*"))


async def test_failures_of_the_schema_before_where_calls_failed_are_kept(tmp_path):
    with sqlite3.connect(tmp_path / "h.db") as raw:
        raw.execute("CREATE TABLE call_failures (job_id TEXT NOT NULL, input_index INTEGER NOT NULL, "
                    "exception_type TEXT NOT NULL, message TEXT NOT NULL, traceback TEXT NOT NULL, at REAL NOT NULL, "
                    "PRIMARY KEY (job_id, input_index))")
        raw.execute("INSERT INTO call_failures VALUES ('old', 3, 'ValueError', 'bad', 'Traceback', 1.0)")
        raw.execute("PRAGMA user_version=3")
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    try:
        [failure] = await history.failures_of("old")
        assert (failure["input_index"], failure["node_id"], failure["host"], failure["worker_pid"]) == (3, "", "", 0)
    finally:
        await history.close()
    assert not list(tmp_path.glob("h.db.v*"))


async def test_a_kept_job_that_ended_keeps_its_error_kind(tmp_path):
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    history.job_opened("d", b"opening")
    history.job(_view("d", time.time(), status="FAILED", reason="input 2 raised", end_kind="CallFailed"),
                {})
    await history.close()
    again = History(tmp_path / "h.db", retention_days=30)
    await again.open()
    try:
        [kept] = await again.kept_jobs()
        assert (kept.status, kept.end_kind, kept.reason) == ("FAILED", "CallFailed", "input 2 raised")
    finally:
        await again.close()


async def test_a_read_while_the_writer_is_mid_write_sees_those_rows(tmp_path):
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    try:
        history.output("j1", [[0, 1, "a\n"]])
        writing = asyncio.create_task(history.flush())
        await asyncio.sleep(0)  # the write has taken the rows and is on its first statement
        assert [r["text"] for r in await history.output_of("j1", 0)] == ["a\n"]
        await writing
    finally:
        await history.close()


async def test_rows_of_a_failed_write_are_written_by_the_next_one_once(tmp_path):
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    confirmed = []
    try:
        history.output("j1", [[0, 1, "a\n"]])
        history.node_event("n1", "registered")
        history.after_flush(lambda: confirmed.append(True))
        with sqlite3.connect(tmp_path / "h.db") as raw:  # the write fails on its last tables
            raw.execute("ALTER TABLE node_events RENAME TO node_events_aside")
        with pytest.raises(sqlite3.Error):
            await history.flush()
        assert confirmed == []  # nothing is confirmed by a write that did not land
        history.output("j1", [[0, 1, "b\n"]])
        with sqlite3.connect(tmp_path / "h.db") as raw:
            raw.execute("ALTER TABLE node_events_aside RENAME TO node_events")
        await history.flush()
        assert confirmed == [True]
        assert [r["text"] for r in await history.output_of("j1", 0)] == ["a\n", "b\n"]  # once each, in order
        assert [e["event"] for e in await history.node_events_of("n1")] == ["registered"]
    finally:
        await history.close()


async def test_while_writes_fail_samples_and_output_wait_only_up_to_a_bound(tmp_path, monkeypatch):
    monkeypatch.setattr("burla.head.history.store.KEEP_AFTER_FAILED_WRITES", 5)
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    try:
        for i in range(8):
            history.node_sample("n1", 1.0, 2.0, 0.0, 0.0, 1, i)
        history.output("j1", [[i, 1, f"{i}\n"] for i in range(8)])
        history.node_event("n1", "registered")
        with sqlite3.connect(tmp_path / "h.db") as raw:
            raw.execute("ALTER TABLE node_events RENAME TO node_events_aside")
        with pytest.raises(sqlite3.Error):
            await history.flush()
        with sqlite3.connect(tmp_path / "h.db") as raw:
            raw.execute("ALTER TABLE node_events_aside RENAME TO node_events")
        await history.flush()
        with sqlite3.connect(tmp_path / "h.db") as raw:
            assert raw.execute("SELECT count(*) FROM node_samples").fetchone()[0] == 5  # the newest
        kept = [row["text"] for i in range(8) for row in await history.output_of("j1", i)]
        assert kept == [f"{i}\n" for i in range(3, 8)]  # the newest
        assert [e["event"] for e in await history.node_events_of("n1")] == ["registered"]  # never dropped
    finally:
        await history.close()


async def test_a_flush_whose_caller_is_cancelled_still_writes_its_rows_once(tmp_path):
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    confirmed = []
    try:
        history.output("j1", [[0, 1, "a\n"]])
        history.after_flush(lambda: confirmed.append("first"))
        reader = asyncio.create_task(history.flush())  # say, a page read whose browser went away
        await asyncio.sleep(0)  # the write has taken the rows and is on the writer's thread
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        history.output("j1", [[0, 1, "b\n"]])
        await history.flush()
        assert confirmed == ["first"]
        assert [r["text"] for r in await history.output_of("j1", 0)] == ["a\n", "b\n"]  # once each, in order
    finally:
        await history.close()


async def test_a_cancelled_flush_holds_the_next_one_until_its_write_has_settled(tmp_path, monkeypatch):
    # Two writes fail in a row (a full disk) while the first one's caller was cancelled: the
    # second must not take rows until the first's are put back, or they would end up behind it.
    monkeypatch.setattr("burla.head.history.store.FLUSH_EVERY_S", 3600.0)  # only this test's flushes
    history = History(tmp_path / "h.db", retention_days=30)
    await history.open()
    gate = threading.Event()
    write = HistoryWriter._write

    def full_disk(self, rows):
        gate.wait(30)
        raise sqlite3.OperationalError("database or disk is full")

    try:
        monkeypatch.setattr(HistoryWriter, "_write", full_disk)
        history.output("j1", [[0, 1, "first\n"]])
        reader = asyncio.create_task(history.flush())
        await asyncio.sleep(0.1)  # its write waits at the gate, on the writer's thread
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        history.output("j1", [[0, 1, "second\n"]])
        second = asyncio.create_task(history.flush())
        await asyncio.sleep(0.1)
        assert not second.done()  # it waits for the first write to settle
        gate.set()
        with contextlib.suppress(sqlite3.Error):
            await second
        monkeypatch.setattr(HistoryWriter, "_write", write)
        await history.flush()
        assert [r["text"] for r in await history.output_of("j1", 0)] == ["first\n", "second\n"]
    finally:
        gate.set()
        await history.close()
