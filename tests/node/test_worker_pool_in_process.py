"""A node's worker pool and dispatcher in this process, with real worker processes: calls run
and their results wait for the sender, a worker killed mid-call is replaced and its calls run
again, closing the pool leaves no worker behind, and a pool's GPUs stay with its workers through
deaths and shrinking."""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable

import cloudpickle
import psutil

from burla.node.dispatcher import Dispatcher
from burla.node.gpus import ENV_VISIBLE, Gpus
from burla.node.workers.worker_pool import WorkerPool
from burla.protocol import wire
from burla.protocol.values.packed_inputs import PackedInputs
from tests.support import functions
from tests.support.helpers import result_value
from tests.support.in_process import until

cloudpickle.register_pickle_by_value(functions)


class Node:
    """A pool bound to a dispatcher, as NodeService binds them."""

    def __init__(self, workers: int, gpus: Gpus = Gpus(None, 0)) -> None:
        env = {k: v for k, v in os.environ.items() if k != ENV_VISIBLE}
        self.pool = WorkerPool(workers, env, gpus)
        self.dispatcher = Dispatcher(lambda: self.pool.workers, lambda: None, "node-p", "host-p",
                                     capacity=lambda: self.pool.size)
        self.exits: list[int | None] = []

    async def __aenter__(self) -> Node:
        await self.pool.start()
        self.pool.bind(self.dispatcher.on_report, self._on_exit, lambda _: self.dispatcher.pump())
        await until(lambda: self.pool.alive_count() == self.pool.size, "the workers to be ready")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.close()

    def _on_exit(self, worker, exit_code: int | None) -> None:
        self.exits.append(exit_code)
        self.dispatcher.on_worker_exit(worker, exit_code)

    def run(self, job_id: str, function: Callable, inputs: list) -> None:
        self.dispatcher.assign(wire.AssignJob(job_id, "f", cloudpickle.dumps(function), self.pool.size, None, None,
                                              b"", {}, 0))
        self.dispatcher.add_inputs(job_id, PackedInputs.of([[i, pickle.dumps(x)] for i, x in enumerate(inputs)]))

    def results(self, job_id: str) -> dict[int, object]:
        job = self.dispatcher.jobs[job_id]
        return {index: result_value(ok, payload)
                for part in job.out_results for index, ok, payload in part.items() if ok}


async def test_calls_run_on_the_pools_workers_and_their_results_wait_for_the_sender():
    async with Node(2) as node:
        node.run("j", functions.double, list(range(200)))
        await until(lambda: sum(p.count for p in node.dispatcher.jobs["j"].out_results) == 200, "200 results")
        assert node.results("j") == {i: 2 * i for i in range(200)}
        assert node.exits == []


async def test_a_worker_killed_mid_call_is_replaced_and_its_calls_run_again():
    async with Node(2) as node:
        node.run("j", functions.sleep_then_return, [(i, 0.3) for i in range(8)])
        await until(lambda: any(w.current_index() >= 0 for w in node.pool.workers), "a call to start")
        victim = next(w for w in node.pool.workers if w.current_index() >= 0)
        os.kill(victim.pid, signal.SIGKILL)
        await until(lambda: sum(p.count for p in node.dispatcher.jobs["j"].out_results) == 8, "every result")
        assert node.results("j") == {i: i for i in range(8)}  # the killed call ran again, once in all
        assert node.exits == [-signal.SIGKILL]
        # Its replacement, and a fresh worker beyond the two the job took (for the next tenant's job).
        await until(lambda: node.pool.alive_count() == 3, "a replacement worker")
        assert victim not in node.pool.workers
        assert [w.tenant for w in node.pool.workers].count(None) == 1


async def test_closing_the_pool_leaves_no_worker_running():
    async with Node(2) as node:
        pids = [w.pid for w in node.pool.workers]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _visible_gpus(pool: WorkerPool) -> list[str]:
    """What each worker computing sees, read from its process's environment."""
    seen = []
    for worker in pool.computing():
        environ = psutil.Process(worker.pid).environ()
        seen.append(environ.get(ENV_VISIBLE, "unset"))
    return sorted(seen)


async def test_each_gpu_stays_with_one_worker_however_its_workers_die():
    """Workers killed together, twice over: their replacements get the GPUs they freed (a pool
    that started one before the GPU came back would leave GPU calls nowhere to run)."""
    async with Node(3, Gpus("A100_40G", 2)) as node:
        assert _visible_gpus(node.pool) == ["", "0", "1"]
        for _ in range(2):
            victims = list(node.pool.workers)
            for victim in victims:
                os.kill(victim.pid, signal.SIGKILL)
            gone = set(victims)
            await until(lambda: node.pool.alive_count() == 3 and not gone & set(node.pool.workers),  # noqa: B023
                        "three replacement workers")
            assert sorted(w.gpu is not None for w in node.pool.computing()) == [False, True, True]
            assert _visible_gpus(node.pool) == ["", "0", "1"]


async def test_a_shrinking_pool_keeps_its_gpu_workers():
    async with Node(3, Gpus("A100_40G", 2)) as node:
        node.pool.resize(2)
        await until(lambda: len(node.pool.workers) == 2, "the extra worker to retire")
        assert _visible_gpus(node.pool) == ["0", "1"]
