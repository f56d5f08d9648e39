"""func_cpu="dynamic": calls that wait share CPUs (a node runs more of them than it has
workers while its CPUs are idle), CPU-bound calls don't, and explicit limits hold."""

from __future__ import annotations

import pytest

from burla.node.governor import GROW_TO, Sample, grown_size, held_back, shrunk_size
from tests.conftest import own_head
from tests.support import functions
from tests.support.helpers import get_json, wait_until

# The node's governor adds workers only while the machine's CPUs are mostly idle: nothing else
# may run meanwhile (the tests of its rules alone, without a node, run with the others).
alone = pytest.mark.exclusive


@pytest.fixture
def head(tmp_path):
    with own_head(tmp_path, workers=2) as head:
        yield head


def _calls_dir(tmp_path, name: str):
    directory = tmp_path / name
    directory.mkdir()
    return directory


def _workers_alive(head) -> int:
    [node] = get_json(head, "/v1/cluster")["nodes"]
    return node["workers_alive"]


@alone
def test_calls_that_wait_run_more_than_one_per_worker_and_the_extra_workers_retire(head, tmp_path):
    out = _calls_dir(tmp_path, "calls")
    inputs = [(str(out), i, 1.5) for i in range(16)]
    results = head.client().remote_parallel_map(functions.record_interval, inputs, spinner=False)
    assert sorted(results) == list(range(16))
    assert functions.max_overlap(out) > 2  # the node has two workers
    assert "calls leave the CPUs idle" in head.log()
    # Idle again: back to one worker per slot.
    wait_until(lambda: _workers_alive(head) == 2, what="the extra workers to retire")


@alone
def test_max_parallelism_caps_calls_that_wait(head, tmp_path):
    out = _calls_dir(tmp_path, "calls")
    head.client().remote_parallel_map(functions.record_interval, [(str(out), i, 1.0) for i in range(9)],
                                      max_parallelism=3, spinner=False)
    assert functions.max_overlap(out) <= 3


@alone
def test_an_integer_func_cpu_runs_exactly_its_share(head, tmp_path):
    out = _calls_dir(tmp_path, "calls")
    head.client().remote_parallel_map(functions.record_interval, [(str(out), i, 0.6) for i in range(8)], func_cpu=1,
                                      spinner=False)
    assert functions.max_overlap(out) <= 2
    assert "calls leave the CPUs idle" not in head.log()


@alone
def test_cpu_bound_calls_run_one_per_worker(head, tmp_path):
    out = _calls_dir(tmp_path, "calls")
    head.client().remote_parallel_map(functions.spin_interval, [(str(out), i, 0.8) for i in range(6)], spinner=False)
    assert functions.max_overlap(out) <= 2
    assert "calls leave the CPUs idle" not in head.log()


@alone
def test_calls_that_turn_cpu_bound_make_the_node_run_fewer(head, tmp_path):
    # They wait first (the node adds workers), then all keep a CPU busy at once (it backs off).
    out = _calls_dir(tmp_path, "calls")
    inputs = [(str(out), i, 1.5, 1.5) for i in range(16)]
    assert sorted(head.client().remote_parallel_map(functions.spin_interval, inputs, spinner=False)) == list(range(16))
    log = head.log()
    assert "calls leave the CPUs idle" in log and "CPUs saturated" in log


def _sample(**changes) -> Sample:
    values = dict(size=2, busy=2, cpu_per_busy_worker=0.01, machine_cpu=0.1, cpus=2, could_run_more=100,
                  memory_room=100)
    values.update(changes)
    return Sample(**values)


def test_the_governor_grows_only_when_every_worker_waits_on_something_else():
    assert grown_size(_sample(), max_size=16) == 16
    assert grown_size(_sample(could_run_more=3), max_size=16) == 5  # no more than the jobs could use
    assert grown_size(_sample(memory_room=1), max_size=16) == 3
    assert grown_size(_sample(busy=1), max_size=16) == 2  # a worker is idle: nothing is short of workers
    assert grown_size(_sample(cpu_per_busy_worker=0.9), max_size=16) == 2  # CPU-bound calls
    assert grown_size(_sample(machine_cpu=0.7), max_size=16) == 2  # the machine is busy anyway
    assert grown_size(_sample(could_run_more=0), max_size=16) == 2
    assert grown_size(_sample(results_full=True), max_size=16) == 2  # its calls wait on the head
    # Calls using a fifth of a CPU each: about as many as bring the machine to GROW_TO.
    grown = grown_size(_sample(cpu_per_busy_worker=0.2, machine_cpu=0.2), max_size=16)
    assert 2 < grown < 16 and (grown - 2) * 0.2 / 2 <= GROW_TO - 0.2


def test_the_governor_backs_off_to_what_the_cpus_can_take():
    assert shrunk_size(16, 2, machine_cpu=1.0) == int(16 * GROW_TO)
    assert shrunk_size(3, 2, machine_cpu=1.0) == 2
    assert shrunk_size(2, 2, machine_cpu=1.0) == 2  # never below one worker per slot


def test_the_governor_says_why_it_holds_back_calls():
    # Fails on the previous code: a busy machine silently ran fewer calls (3.6 s became 9.7 s).
    assert held_back(_sample()) == ""  # idle machine: it grows instead
    busy = held_back(_sample(machine_cpu=0.97))
    assert busy.startswith("machine 97% busy (96% by other processes)")
    assert held_back(_sample(machine_cpu=0.97, could_run_more=0)) == ""  # nothing waits for a worker
    assert held_back(_sample(machine_cpu=0.97, cpu_per_busy_worker=0.9)) == ""  # calls use their CPUs: none to add


def test_a_held_back_job_is_said_to_its_client_and_kept_for_its_metrics(tmp_path):
    import asyncio

    asyncio.run(_held_back_job(tmp_path))


async def _held_back_job(tmp_path) -> None:
    import time

    import aiohttp

    from burla.protocol import wire
    from tests.security.test_scoped_credentials import _register
    from tests.security.test_security_and_bad_input import open_job

    why = "machine 97% busy (90% by other processes): no extra calls started until it calms down"
    with own_head(tmp_path, local_nodes=0) as head:
        bearer = {"Authorization": f"Bearer {head.token}"}
        async with aiohttp.ClientSession(headers=bearer) as session, \
                session.ws_connect(f"{head.url}/v1/nodes/ws") as node:
            await node.send_bytes(_register("busy-node").encode())
            assert isinstance(wire.decode((await node.receive(timeout=30)).data), wire.NodeRegistered)
            spec = open_job(n_inputs=2)
            async with session.ws_connect(f"{head.url}/v1/jobs/ws") as client:
                await client.send_bytes(spec.encode())
                assert isinstance(wire.decode((await client.receive(timeout=30)).data), wire.JobAccepted)
                state = wire.NodeState("busy-node", "RUNNING", 1, [[spec.job_id, 1, 1, 0]], 97.0, 10.0, 0.0, 0.0,
                                       held_back=why)
                await node.send_bytes(state.encode())
                deadline = time.monotonic() + 60
                said = ""
                while not said and time.monotonic() < deadline:
                    msg = wire.decode((await client.receive(timeout=60)).data)
                    said = msg.held_back if isinstance(msg, wire.Progress) else ""
                assert said == f"node busy-node runs fewer calls at once than it could: {why}"
                wait_until(lambda: get_json(head, f"/v1/jobs/{spec.job_id}/metrics")["held_back"], timeout=60,
                           what="the held-back event kept")
                [event] = get_json(head, f"/v1/jobs/{spec.job_id}/metrics")["held_back"]
                assert event["node_id"] == "busy-node" and event["held_back"] and event["why"] == why


def test_the_progress_line_says_when_calls_are_held_back():
    import io

    from burla.client.progress import Display

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, err = Terminal(), io.StringIO()
    display = Display(10, show_progress=True, stdout=out, stderr=err)
    why = "node n1 runs fewer calls at once than it could: machine 97% busy"
    for busy in (97, 98, 97):
        display.progress(1, 0, 2, held_back=why.replace("97", str(busy)))
        display._draw(force=True)
    assert err.getvalue().count("runs fewer calls at once") == 1  # said once, not at every update
    assert "fewer at once: machine busy" in out.getvalue()
    display.progress(2, 0, 2)
    display._draw(force=True)
    assert not out.getvalue().rsplit("\r", 1)[-1].count("machine busy")
