"""The client's JobRunner against a real head and node in this process: outcomes arrive in
batches with their input indices, a cancel ends the job on the head with its reason, and jobs in
a row share one connection."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import cloudpickle

from burla.client import runner as runner_module
from burla.client import session
from burla.client.local_cluster import ClusterHandle
from burla.client.progress import Display
from burla.client.runner import JobRunner
from burla.errors import JobCanceled
from burla.head.cluster import Cluster
from burla.head.keys import OPEN_SOCKETS
from burla.protocol import limits, wire
from burla.protocol.states import JobStatus
from tests.support import functions
from tests.support.in_process import InProcessCluster, cluster_of, in_process_cluster, until

cloudpickle.register_pickle_by_value(functions)

OPTIONS = session.JobOptions(func_cpu=None, func_ram=None, func_gpu=None, image=None, grow=False,
                                 max_parallelism=None, detach=False, raise_errors=False, region=None, disk_gb=None,
                                 parent_job_id=None)


def _runner(cluster: InProcessCluster, job_id: str, function, inputs: list) -> JobRunner:
    spec = session.opening(job_id, function, function.__name__, len(inputs), OPTIONS)
    display = Display(len(inputs), show_progress=False, stdout=io.StringIO(), stderr=io.StringIO())
    runner = JobRunner(ClusterHandle(cluster.url, cluster.token), job_id, display, opening=spec, inputs=inputs)
    runner.start()
    return runner


def _drain(runner: JobRunner) -> list:
    """Every outcome batch until the runner ends (blocking: run in a thread)."""
    batches = []
    while True:
        batch = runner.next_outcomes(timeout=0.25)
        if batch is None:
            return batches
        if batch:
            batches.append(batch)
        if sum(len(b) for b in batches) >= runner.n_inputs:
            runner.close()
            return batches


async def test_outcomes_arrive_in_batches_with_their_indices_and_failures_in_place(tmp_path):
    async with in_process_cluster(tmp_path) as cluster:
        runner = _runner(cluster, "outcomes-1", functions.fail_on, list(range(10)))
        batches = await asyncio.to_thread(_drain, runner)
        outcomes = sorted((o for batch in batches for o in batch), key=lambda o: o[0])
        assert [index for index, _, _ in outcomes] == list(range(10))
        assert [ok for _, ok, _ in outcomes] == [i != 3 for i in range(10)]
        _, _, error = outcomes[3]
        assert isinstance(error, ValueError) and error.burla_input_index == 3
        assert runner.error is None
        await until(lambda: cluster_of(cluster.app).scheduler.jobs["outcomes-1"].status == JobStatus.COMPLETED,
                    "the job to complete on the head")


async def test_a_cancel_ends_the_job_on_the_head_with_its_reason(tmp_path):
    async with in_process_cluster(tmp_path) as cluster:
        runner = _runner(cluster, "cancel-1", functions.sleep_then_return, [(i, 30) for i in range(4)])
        await until(lambda: runner.opened.is_set(), "the job to open")
        await asyncio.to_thread(runner.cancel, "enough")
        job = cluster_of(cluster.app).scheduler.jobs["cancel-1"]
        await until(lambda: job.status == JobStatus.CANCELED, "the job to be canceled")
        assert job.reason == "enough"
        await asyncio.to_thread(_drain, runner)
        assert isinstance(runner.error, JobCanceled) and "enough" in str(runner.error)


async def test_jobs_in_a_row_share_one_connection_to_the_head(tmp_path):
    async with in_process_cluster(tmp_path) as cluster:
        sockets = cluster.app[OPEN_SOCKETS]
        node_link = set(sockets)
        job_connections = []
        for number in range(3):
            runner = _runner(cluster, f"row-{number}", functions.double, list(range(50)))
            batches = await asyncio.to_thread(_drain, runner)
            assert sorted(v for batch in batches for _, _, v in batch) == [2 * i for i in range(50)]
            job_connections.append(set(sockets) - node_link)
        [first, *rest] = job_connections
        assert len(first) == 1 and all(c == first for c in rest)  # the same WebSocket carried all three


async def test_result_batches_are_acknowledged_together_and_the_last_at_once(tmp_path, monkeypatch):
    # Fails on the previous code, which answered every batch with an acknowledgement of its own.
    # The clock stands still, so only the count of batches waiting (and the job's end) calls one.
    monkeypatch.setattr("burla.client.runner.time", SimpleNamespace(monotonic=lambda: 1000.0))
    acks: list[int] = []
    acknowledge = Cluster.ack
    monkeypatch.setattr(Cluster, "ack", lambda self, job, seq: (acks.append(seq), acknowledge(self, job, seq)))
    n = 20 * limits.BATCH_ITEMS  # at least 20 batches of results
    async with in_process_cluster(tmp_path) as cluster:
        runner = _runner(cluster, "acks-1", functions.double, list(range(n)))
        batches = await asyncio.to_thread(_drain, runner)
        assert sorted(v for batch in batches for _, _, v in batch) == [2 * i for i in range(n)]
        await until(lambda: cluster_of(cluster.app).scheduler.jobs["acks-1"].status == JobStatus.COMPLETED,
                    "the job to complete on the head")
    sent = runner._acked_seq  # the head numbers its batches from 1
    assert sent >= 20 and acks[-1] == sent
    assert len(acks) <= sent // runner_module.ACK_AFTER_BATCHES + 2, (len(acks), sent)


async def test_a_node_takes_the_heads_word_that_every_input_is_pushed(tmp_path):
    # The node's side of InputsPushed (a one-node job is not sent it: the head says it here).
    async with in_process_cluster(tmp_path) as cluster:
        runner = _runner(cluster, "pushed-1", functions.sleep_then_return, [(i, 30) for i in range(2)])
        node_job = None

        def assigned() -> bool:
            nonlocal node_job
            node_job = cluster.service.dispatcher.jobs.get("pushed-1")
            return node_job is not None

        await until(assigned, "the node to take the job")
        assert not node_job.all_pushed
        cluster_of(cluster.app).node_links["node-inproc"].send(wire.InputsPushed("pushed-1"))
        await until(lambda: node_job.all_pushed, "the node to hear every input is pushed")
        await asyncio.to_thread(runner.cancel, "enough")
        await asyncio.to_thread(_drain, runner)
