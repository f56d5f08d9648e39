"""A head run with --no-history: jobs run and show from live state, nothing is written to disk,
and a job still running when the head stops ends with an error that says why (a head keeps
running jobs across restarts only with history)."""

from __future__ import annotations

import asyncio
import functools

import aiohttp
import cloudpickle
import pytest

from burla.errors import JobFailed
from burla.head.history.recorder import NoRecord
from burla.head.keys import SHUT_DOWN
from burla.protocol.states import JobStatus
from tests.support import functions
from tests.support.in_process import InProcessCluster, cluster_of, in_process_cluster, until

cloudpickle.register_pickle_by_value(functions)


async def _get(cluster: InProcessCluster, path: str) -> dict:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {cluster.token}"}) as session:
        async with session.get(f"{cluster.url}{path}") as response:
            assert response.status == 200, await response.text()
            return await response.json()


async def test_jobs_run_and_show_from_live_state_with_nothing_written(tmp_path):
    async with in_process_cluster(tmp_path, history=False) as cluster:
        assert isinstance(cluster_of(cluster.app).record, NoRecord) and cluster_of(cluster.app).history is None
        run = functools.partial(cluster.client().remote_parallel_map, functions.fail_on, list(range(6)),
                                raise_errors=False, spinner=False)
        results = await asyncio.to_thread(run)
        assert [r for i, r in enumerate(results) if i != 3] == [0, 1, 2, 4, 5]
        assert isinstance(results[3], ValueError)
        [job] = (await _get(cluster, "/v1/jobs"))["jobs"]
        assert (job["function_name"], job["status"], job["n_done"], job["n_failed"]) == ("fail_on", "COMPLETED", 6, 1)
        assert (await _get(cluster, f"/v1/jobs/{job['job_id']}"))["n_inputs"] == 6
        assert (await _get(cluster, "/v1/jobs?status=failed"))["jobs"] == []
        assert [j["job_id"] for j in (await _get(cluster, "/v1/jobs?status=completed&limit=1"))["jobs"]] == \
            [job["job_id"]]
        assert (await _get(cluster, f"/v1/jobs?parent={job['job_id']}"))["jobs"] == []
    assert not list(tmp_path.glob("*.db*")), "a head without history wrote a database"


async def test_a_running_job_fails_clearly_when_a_head_without_history_stops(tmp_path):
    async with in_process_cluster(tmp_path, history=False) as cluster:
        run = functools.partial(cluster.client().remote_parallel_map, functions.sleep_then_return, [1],
                                spinner=False)
        client = asyncio.create_task(asyncio.to_thread(run))
        scheduler = cluster_of(cluster.app).scheduler
        await until(lambda: any(job.running(scheduler.nodes) for job in scheduler.running.values()),
                    "the call to start")
        [job] = scheduler.running.values()
        await cluster.app[SHUT_DOWN]()
        assert job.status == JobStatus.FAILED and "only with history" in job.reason
        with pytest.raises(JobFailed, match="only with history"):
            await asyncio.wait_for(client, 60)
