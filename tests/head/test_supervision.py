"""Background loops outlive their own crashes, and a stopping head runs every cleanup step.

The loop supervisor alone first; then a real head app and a real node service in this process
(workers are processes of their own), talking over WebSockets on 127.0.0.1: an exception is
injected into every loop of both, each is logged with its traceback and runs again, the head's
reaper still declares a frozen node dead, a job still runs, and a failing shutdown step does
not stop history from being written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import subprocess
import sys

import aiohttp
import pytest

from burla.config import ENV_TOKEN
from burla.drivers.local import LocalDriver
from burla.process.loop_supervisor import LoopSupervisor, run_every_step
from tests.support.functions import double
from tests.support.in_process import InProcessCluster, cluster_of, in_process_cluster, supervisor_of, until

log = logging.getLogger("tests.supervision")


# --- the supervisor alone ----------------------------------------------------------------


async def test_a_crashing_loop_is_logged_with_its_traceback_and_runs_again(caplog):
    lives = []

    async def flaky() -> None:
        lives.append(len(lives))
        if len(lives) <= 2:
            raise ValueError(f"bug number {len(lives)}")
        await asyncio.Event().wait()  # the third life runs until cancelled

    supervisor = LoopSupervisor(log, first_backoff_s=0.01)
    supervisor.start("flaky", flaky)
    await until(lambda: len(lives) == 3 and supervisor.view()[0]["running"], "the third life")
    assert supervisor.restarts() == {"flaky": 2}
    [view] = supervisor.view()
    assert view["last_error"] == "ValueError: bug number 2"
    crashes = [r for r in caplog.records if "background loop 'flaky' crashed" in r.getMessage()]
    assert len(crashes) == 2
    assert all(r.exc_info and r.exc_info[0] is ValueError for r in crashes)
    await supervisor.close()
    assert supervisor.view()[0]["running"] is False


async def test_backoff_doubles_while_a_loop_keeps_crashing_and_is_capped():
    slept: list[float] = []

    async def recording_sleep(seconds: float) -> None:  # the backoff's clock: recorded, not waited
        slept.append(seconds)
        await asyncio.sleep(0)

    async def broken() -> None:
        raise RuntimeError("always")

    supervisor = LoopSupervisor(log, first_backoff_s=0.1, max_backoff_s=0.5, sleep=recording_sleep)
    supervisor.start("broken", broken)
    await until(lambda: len(slept) >= 6, "six restarts")
    await supervisor.close()
    assert slept[:6] == [0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
    assert supervisor.restarts()["broken"] >= 6


async def test_a_loop_that_ends_by_itself_is_not_started_again_and_close_cancels_the_rest():
    ended = asyncio.Event()
    cancelled = asyncio.Event()

    async def once() -> None:
        ended.set()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    supervisor = LoopSupervisor(log)
    supervisor.start("once", once)
    supervisor.start("forever", forever)
    await ended.wait()
    await until(lambda: supervisor.view()[1]["running"], "the forever loop")
    await supervisor.close()
    assert cancelled.is_set()
    assert supervisor.restarts() == {"once": 0, "forever": 0}


async def test_the_supervisor_refuses_what_it_cannot_do():
    supervisor = LoopSupervisor(log)

    async def idle() -> None:
        await asyncio.Event().wait()

    supervisor.start("idle", idle)
    with pytest.raises(ValueError, match="already supervised"):
        supervisor.start("idle", idle)
    with pytest.raises(KeyError, match="no supervised loop named 'other'"):
        supervisor.inject_fault("other", RuntimeError("x"))
    await supervisor.close()
    with pytest.raises(RuntimeError, match="closing"):
        supervisor.start("late", idle)


async def test_every_shutdown_step_runs_even_when_one_fails(caplog):
    ran = []

    async def step(name: str, fail: bool = False) -> None:
        ran.append(name)
        if fail:
            raise OSError(f"{name} broke")

    failed = await run_every_step(log, [("a", lambda: step("a")), ("b", lambda: step("b", fail=True)),
                                        ("c", lambda: step("c"))])
    assert ran == ["a", "b", "c"]
    assert failed == ["b"]
    assert any("shutdown step 'b' failed" in r.getMessage() and r.exc_info for r in caplog.records)


# --- a real head and node ----------------------------------------------------------------


class DriverWhoseCloseFails(LocalDriver):
    """The local driver, except that closing it fails (the shutdown step under test)."""

    async def close(self) -> None:
        await super().close()
        raise OSError("the driver could not close (injected)")


async def _get(cluster: InProcessCluster, path: str) -> dict:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {cluster.token}"}) as session:
        async with session.get(f"{cluster.url}{path}") as response:
            assert response.status == 200, await response.text()
            return await response.json()


def _run_job(cluster: InProcessCluster, inputs: list[int]) -> list[int]:
    return cluster.client().remote_parallel_map(double, inputs, spinner=False)


async def test_every_loop_of_a_head_and_a_node_runs_again_after_an_injected_crash(tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    async with in_process_cluster(tmp_path, node_deadline_s=3.0) as cluster:
        head_loops = supervisor_of(cluster.app)
        node_loops = cluster.service.loops
        assert set(head_loops.names()) == {"progress", "loop-monitor", "idle-collector", "reaper", "steal-hints",
                                           "inactivity", "boot-watch", "client-reaper"}
        assert set(node_loops.names()) >= {"memory-guard", "cpu-guard", "governor"}
        everyone = [(head_loops, name) for name in head_loops.names()]
        everyone += [(node_loops, name) for name in node_loops.names()]
        for supervisor, name in everyone:
            supervisor.inject_fault(name, RuntimeError(f"injected into {name}"))
        await until(lambda: all(s.restarts()[n] == 1 and next(v for v in s.view() if v["name"] == n)["running"]
                                 for s, n in everyone), "every loop to run again")
        for _, name in everyone:
            [record] = [r for r in caplog.records if f"background loop {name!r} crashed" in r.getMessage()]
            assert record.exc_info is not None and str(record.exc_info[1]) == f"injected into {name}"
        state = await _get(cluster, "/v1/cluster")
        assert {loop["name"]: loop["restarts"] for loop in state["loops"]} == dict.fromkeys(head_loops.names(), 1)
        assert all(loop["running"] and loop["last_error"].startswith("RuntimeError: injected")
                   for loop in state["loops"])

        # The loops do their work after their restart: a job runs, and a frozen node is reaped.
        assert await asyncio.to_thread(_run_job, cluster, list(range(20))) == [2 * x for x in range(20)]
        frozen = subprocess.Popen([sys.executable, "-m", "burla", "node", "join", "--head", cluster.url,
                                   "--workers", "1", "--node-id", "node-frozen"], env={**os.environ,
                                                                                     ENV_TOKEN: cluster.token},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await until(lambda: "node-frozen" in cluster_of(cluster.app).scheduler.nodes, "the second node")
            frozen.send_signal(signal.SIGSTOP)
            await until(lambda: "node-frozen" not in cluster_of(cluster.app).scheduler.nodes,
                         "the reaper to declare the frozen node dead")
        finally:
            frozen.kill()
            frozen.wait(30)


async def test_a_failing_shutdown_step_leaves_the_rest_to_run_and_history_is_written(tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    async with in_process_cluster(tmp_path, driver=DriverWhoseCloseFails()) as cluster:
        assert await asyncio.to_thread(_run_job, cluster, [1, 2, 3]) == [2, 4, 6]
        [job_id] = cluster_of(cluster.app).scheduler.jobs
    assert any("shutdown step 'local driver' failed" in r.getMessage() for r in caplog.records)
    with sqlite3.connect(cluster.history_path) as db:  # history was flushed and closed after the failure
        [(status, n_done)] = db.execute("SELECT status, n_done FROM jobs WHERE job_id = ?", (job_id,)).fetchall()
    assert (status, n_done) == ("COMPLETED", 3)
