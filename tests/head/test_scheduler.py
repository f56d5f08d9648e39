"""The head's scheduling rules, on pure state."""

from __future__ import annotations

import random
import zlib

import pytest

from burla.config import MAX_CALLS_PER_SLOT
from burla.errors import NoCompatibleNodes, NoNodes, ProtocolError
from burla.head.scheduling.eligibility import can_join, ineligibility
from burla.head.scheduling.held_inputs import adopt_held, mark_client_held
from burla.head.scheduling.records import RUNNING, JobRecord, NodeRecord
from burla.head.scheduling.scheduler import Scheduler
from burla.head.scheduling.steals import record_steal
from burla.protocol import limits, wire
from burla.protocol.values.packed_inputs import PackedInputs, gather
from burla.protocol.values.packed_results import pack_indices, unpack_indices


def node(node_id="n1", slots=4, cpus=4, ram_gb=16.0, gpu=None, gpu_count=0, image=None, region="local", python="3.11"):
    return NodeRecord(node_id, "http://x", slots, cpus, ram_gb, gpu, gpu_count, image, region, python, "0.1.0")


def held_bytes(job: JobRecord, node_id: str) -> dict[int, bytes]:
    """What the head keeps of each input in flight on a node: its bytes, should the node be lost."""
    inflight = job.assignments[node_id].inflight
    return dict(gather(inflight.items()).items()) if inflight else {}


def spec(job_id="j", n=10, **kw):
    values = dict(func_cpu=None, func_ram=None, func_gpu=None, image=None, grow=False, max_parallelism=None,
                  detach=False, raise_errors=True, region=None, disk_gb=None, parent_job_id=None,
                  retries=0, timeout=None,
                  client_version="0.1.0", python_version="3.11.7", local_code=b"", packages={})
    values.update(kw)
    return wire.OpenJob(job_id, "f", b"fn", n, **values)


def test_no_nodes_at_all():
    with pytest.raises(NoNodes, match="burla node join"):
        Scheduler().admit(spec())


def test_booting_nodes_let_the_job_wait():
    s = Scheduler()
    s.booting_ids.add("booting-node")
    job = s.admit(spec())
    assert job.status == RUNNING and not job.assignments
    joins = s.add_node(node())
    assert [(j.job_id, p) for j, p in joins] == [("j", 10)]  # up to its 10 inputs (calls that wait share CPUs)
    assert job.assignments["n1"].slots == 4 and job.assignments["n1"].credit == 8  # credited as its slots


def test_parallelism_follows_cpu_and_ram_per_call():
    s = Scheduler()
    s.add_node(node(slots=8, cpus=8, ram_gb=16))
    assert s.admit(spec("a", func_cpu=2)).assignments["n1"].parallelism == 4
    assert s.admit(spec("b", func_ram=5)).assignments["n1"].parallelism == 3
    # func_cpu="dynamic": up to MAX_CALLS_PER_SLOT per slot, the node decides how many run.
    assert s.admit(spec("c", n=1000)).assignments["n1"].parallelism == 8 * MAX_CALLS_PER_SLOT
    assert s.admit(spec("d", n=1000, func_ram=0.5)).assignments["n1"].parallelism == 32


def test_a_job_takes_a_slot_per_input_at_most_and_up_to_its_inputs_on_each_node():
    s = Scheduler()
    for node_id in "abc":
        s.add_node(node(node_id, slots=2))
    job = s.admit(spec(n=3))
    assert sorted((a.parallelism, a.slots) for a in job.assignments.values()) == [(3, 1), (3, 2)]


def test_max_parallelism_gives_every_node_its_slots_before_more_on_one():
    s = Scheduler()
    s.add_node(node("a", slots=2))
    s.add_node(node("b", slots=2))
    job = s.admit(spec(n=100, max_parallelism=6))
    assert sorted((a.parallelism, a.slots) for a in job.assignments.values()) == [(2, 2), (4, 2)]


def test_capped_jobs_started_together_spread_over_the_least_loaded_nodes():
    # Fails on the previous code: both landed on the same node (ordered by ceiling, not load).
    s = Scheduler()
    s.add_node(node("a", slots=2))
    s.add_node(node("b", slots=2))
    first = s.admit(spec("first", n=10, max_parallelism=2))
    second = s.admit(spec("second", n=10, max_parallelism=2))
    assert len(first.assignments) == len(second.assignments) == 1
    assert set(first.assignments) != set(second.assignments)


def test_shares_over_many_nodes_add_up_to_the_caps_and_a_lost_nodes_share_moves():
    # The running totals that replaced a sum per node (admitting on N nodes was O(N²)) keep the
    # same caps: max_parallelism in all, a slot per input, a lost node's share to one left out.
    s = Scheduler()
    for number in range(300):
        s.add_node(node(f"n{number:03}", slots=4))
    job = s.admit(spec(n=10_000, max_parallelism=1001))
    shares = [(a.parallelism, a.slots) for a in job.assignments.values()]
    assert len(shares) == 251 and sum(p for p, _ in shares) == 1001 and sum(t for _, t in shares) == 1001
    few = s.admit(spec("few", n=30))
    assert sum(a.slots for a in few.assignments.values()) == 30 and len(few.assignments) == 8
    lost = next(iter(job.assignments))
    s.remove_node(lost)
    kept = set(job.assignments)
    [(joined, parallelism)] = s.top_up(job)
    assert joined != lost and joined not in kept and parallelism == 4
    assert sum(a.parallelism for a in job.assignments.values()) == 1001


def test_a_node_back_with_inputs_it_kept_running_joins_their_job_past_the_cap():
    s = Scheduler()
    s.booting_ids.update({"a", "b"})
    job = s.admit(spec(n=6, max_parallelism=2))
    s.booting_ids.clear()
    s.add_node(node("b", slots=2))  # back first: it takes the whole cap
    assert (job.assignments["b"].parallelism, job.assignments["b"].slots) == (2, 2)
    assert [j.job_id for j, _ in s.add_node(node("a", slots=2), holding={"j"})] == ["j"]
    assert (job.assignments["a"].parallelism, job.assignments["a"].slots) == (2, 2)
    assert s.add_node(node("c", slots=2)) == []  # holding nothing: only what the cap leaves


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(func_gpu="A100"), "func_gpu='A100'"),
        (dict(image="img:1"), "image='img:1'"),
        (dict(region="eu-west-1"), "region='eu-west-1'"),
        (dict(func_cpu=64), "func_cpu=64"),
        (dict(python_version="3.12.1"), "Python 3.12"),
    ],
)
def test_ineligible_nodes_are_explained(kw, words):
    s = Scheduler()
    s.add_node(node())
    with pytest.raises(NoCompatibleNodes, match=words.replace("(", r"\(").replace(".", r"\.")):
        s.admit(spec(**kw))


@pytest.mark.parametrize("cloud, grow, hint", [
    (None, False, "burla config set cloud aws"),
    (None, True, "burla config set cloud aws"),  # grow=True on a local cluster boots nothing: say why
    ("aws", False, "pass grow=True to boot A100 GPU nodes on aws"),
])
def test_what_to_do_fits_the_cluster_and_the_call(cloud, grow, hint):
    # Fails on the previous code: it said "use grow=True on a cloud cluster" whatever the case.
    s = Scheduler()
    s.cloud = cloud
    s.add_node(node())
    with pytest.raises(NoCompatibleNodes) as caught:
        s.admit(spec(func_gpu="A100", grow=grow))
    assert hint in str(caught.value) and "cloud cluster" not in str(caught.value)


def test_no_nodes_on_a_cloud_cluster_suggests_grow():
    s = Scheduler()
    s.cloud = "gcp"
    with pytest.raises(NoNodes, match="pass grow=True to boot what the job needs on gcp"):
        s.admit(spec())


def test_a_node_without_an_image_runs_python_of_its_interpreter():
    # As the user guide has it: a node without an image stands for python:3.X of its Python.
    s = Scheduler()
    s.add_node(node(python="3.11"))
    assert s.admit(spec("a", image="python:3.11")).assignments
    assert s.admit(spec("b", image="python:3.11-slim")).assignments
    with pytest.raises(NoCompatibleNodes, match=r"the nodes run python:3\.11"):
        s.admit(spec("c", image="python:3.12"))


def test_gpu_nodes_match_gpu_jobs():
    s = Scheduler()
    s.add_node(node(gpu="A100", gpu_count=2, slots=8))
    assert s.admit(spec(func_gpu="a100")).assignments["n1"].parallelism == 2


def test_plan_respects_credit_and_splits_fairly():
    s = Scheduler()
    s.add_node(node("a", slots=1))
    s.add_node(node("b", slots=1))
    job = s.admit(spec(n=10))
    s.add_inputs(job, [[i, b"x"] for i in range(10)])
    first = s.plan()  # a node's first window (two inputs per worker) needs no credit message
    assert {node_id: len(items) for node_id, _, items in first} == {"a": 2, "b": 2}
    assert s.plan() == []  # and then nothing more until it asks
    s.grant("a", "j", 100)
    s.grant("b", "j", 1)
    pushes = s.plan()
    sent = {node_id: [i for i, _ in items] for node_id, _, items in pushes}
    assert len(sent["b"]) == 1 and len(sent["a"]) == 5
    everything = [i for _, _, items in first + pushes for i, _ in items]
    assert sorted(everything) == list(range(10))


def two_node_job(n: int) -> tuple[Scheduler, JobRecord]:
    """A job of `n` inputs on nodes "a" and "b" of a slot each, planned once before any input."""
    s = Scheduler()
    s.add_node(node("a", slots=1))
    s.add_node(node("b", slots=1))
    job = s.admit(spec(n=n))
    s.plan()
    s.take_withdrawn()
    return s, job


def test_no_credit_is_held_back_while_inputs_wait():
    # Two nodes that granted more than is left: each credit takes only a share of what is
    # pending, and what it keeps back is withdrawn (the node asks again), never left sitting on
    # the head while inputs wait (the nodes would count on it and never ask: the job would hang).
    s, job = two_node_job(12)
    s.add_inputs(job, [[i, b"x"] for i in range(12)])
    s.grant("a", "j", 20)
    pushed = s.plan_for("a", "j")
    assert sum(len(items) for _, _, items in pushed) == 6 and len(job.pending) == 6
    assert s.take_withdrawn() == [("a", "j", 16)]  # its first window (2) and the 20, less the 6
    assert job.assignments["a"].credit == 0
    s.grant("b", "j", 20)
    s.plan_for("b", "j")
    s.grant("a", "j", 16)
    s.plan_for("a", "j")
    while job.pending:  # each node asks again for what was withdrawn, until nothing waits
        for node_id, _, inputs in s.take_withdrawn():
            s.grant(node_id, "j", inputs)
            s.plan_for(node_id, "j")
    assert sorted(i for a in job.assignments.values() for i in a.inflight) == list(range(12))


def test_a_plan_spreads_an_upload_without_withdrawing_credit():
    # An upload batch spread over two nodes whose credit exceeds it: each takes its share and the
    # rest of its credit stays for the next batch (nothing waits beside it). Withdrawing it would
    # cost a CreditWithdrawn and a Credit per node and batch.
    s, job = two_node_job(12_000)
    s.grant("a", "j", 5_000)
    s.grant("b", "j", 5_000)
    s.add_inputs(job, [[i, b"x"] for i in range(4_096)])
    pushed = s.plan()
    assert {node_id: len(items) for node_id, _, items in pushed} == {"a": 2_048, "b": 2_048}
    assert s.take_withdrawn() == [] and not job.pending
    assert job.assignments["a"].credit == job.assignments["b"].credit == 5_002 - 2_048
    # More than both can take: each fills its credit, nothing is withdrawn, the rest waits for
    # the nodes to ask.
    s.add_inputs(job, [[i, b"x"] for i in range(4_096, 12_000)])
    pushed = s.plan()
    assert sum(len(items) for _, _, items in pushed) == 2 * (5_002 - 2_048)
    assert s.take_withdrawn() == [] and len(job.pending) == 12_000 - 4_096 - 2 * (5_002 - 2_048)
    assert job.assignments["a"].credit == job.assignments["b"].credit == 0


def uploaded_two_node_job(n: int, uploaded: int) -> tuple[Scheduler, JobRecord]:
    """A two-node job with its first `uploaded` inputs planned: each node took its first window
    (two inputs) and has no credit left; the rest wait for a node to ask."""
    s, job = two_node_job(n)
    s.add_inputs(job, [[i, b"x"] for i in range(uploaded)])
    s.plan()
    assert len(job.pending) == uploaded - 4 and s.take_withdrawn() == []
    return s, job


def pushed_count(pushed: list) -> int:
    return sum(len(items) for _, _, items in pushed)


def test_a_node_asking_takes_a_remainder_too_small_to_keep_for_the_others():
    # Its share of the 1,796 waiting (898) is less than a quarter of its credit (1,000), and what
    # that would leave for the other node (796) is less again: it takes all of them, where keeping
    # 796 back would cost it a withdrawal and a credit message to take them a moment later.
    s, job = uploaded_two_node_job(3_000, 1_800)
    s.grant("a", "j", 4_000)
    assert pushed_count(s.plan_for("a", "j")) == 1_796 and not job.pending
    assert s.take_withdrawn() == [] and job.assignments["a"].credit == 4_000 - 1_796


def test_a_remainder_worth_a_push_stays_for_the_other_node():
    # 1,498 left after its share of 2,996 is more than its least push: they stay, and the
    # asker's credit beside them is withdrawn (it asks again if its window has room).
    s, job = uploaded_two_node_job(5_000, 3_000)
    s.grant("a", "j", 4_000)
    assert pushed_count(s.plan_for("a", "j")) == 1_498 and len(job.pending) == 1_498
    assert s.take_withdrawn() == [("a", "j", 4_000 - 1_498)]
    # More than a frame's worth waiting: a push is one frame's worth, the rest stays, though less
    # than that push.
    s, job = uploaded_two_node_job(20_000, 8_000)
    s.grant("a", "j", limits.MAX_NODE_WINDOW)
    assert pushed_count(s.plan_for("a", "j")) == limits.BATCH_ITEMS and len(job.pending) == 7_996 - limits.BATCH_ITEMS
    assert s.take_withdrawn() == [("a", "j", limits.MAX_NODE_WINDOW - limits.BATCH_ITEMS)]
    # Credit for less than its share: it is all spent, nothing is withdrawn.
    s, job = uploaded_two_node_job(3_000, 1_800)
    s.grant("a", "j", 500)
    assert pushed_count(s.plan_for("a", "j")) == 500 and len(job.pending) == 1_296
    assert s.take_withdrawn() == [] and job.assignments["a"].credit == 0


def test_after_a_plan_no_credit_is_left_beside_waiting_inputs():
    # Whatever the nodes granted and the upload holds: after a plan either nothing waits or
    # every node's credit is spent (a plan withdraws nothing, so this is what keeps a job from
    # waiting on credit its nodes count on).
    rng = random.Random(11)
    for _ in range(300):
        s = Scheduler()
        nodes = [f"n{i}" for i in range(rng.randint(1, 5))]
        for node_id in nodes:
            s.add_node(node(node_id, slots=rng.randint(1, 8)))
        job = s.admit(spec(n=20_000))
        s.plan()
        for node_id in nodes:
            if rng.random() < 0.8:
                s.grant(node_id, "j", rng.choice([0, 1, rng.randint(1, 50), rng.randint(1, 9_000)]))
        uploaded = rng.randint(1, 12_000)
        s.add_inputs(job, [[i, b"x"] for i in range(uploaded)])
        pushed = s.plan()
        assert s.take_withdrawn() == []
        assert not job.pending or all(a.credit == 0 for a in job.assignments.values())
        sent = sorted(i for _, _, part in pushed for i, _ in part)
        assert sent == sorted(i for a in job.assignments.values() for i in a.inflight)
        assert len(sent) + len(job.pending) == uploaded


def test_a_node_asking_for_many_inputs_gets_them_in_few_frames():
    # A node asks for about 0.1 s of calls: a large credit means short calls, and pushes of its
    # fair share (here 12 inputs) would cost a frame each way per dozen calls. It takes a
    # quarter of its credit at once, and never more than a frame's worth per push.
    s = Scheduler()
    for node_id in ("a", "b", "c", "d"):
        s.add_node(node(node_id, slots=1))
    job = s.admit(spec(n=20_000))
    s.plan()
    s.take_withdrawn()
    s.add_inputs(job, [[i, b"x"] for i in range(50)])
    s.grant("a", "j", 2_000)
    pushed = s.plan_for("a", "j")
    assert [len(items) for _, _, items in pushed] == [50]
    s.add_inputs(job, [[i, b"x"] for i in range(50, 8_050)])  # a fair share is 2,000 of these
    s.grant("b", "j", 80_000)
    pushed = s.plan_for("b", "j")
    assert [len(items) for _, _, items in pushed] == [limits.BATCH_ITEMS]
    s.grant("c", "j", 3_000)  # a quarter of its credit is less than its share: the share goes
    pushed = s.plan_for("c", "j")
    assert [len(items) for _, _, items in pushed] == [-(-(8_000 - limits.BATCH_ITEMS) // 4)]


def test_results_are_kept_once_per_index():
    s = Scheduler()
    s.add_node(node())
    job = s.admit(spec(n=2))
    s.add_inputs(job, [[0, b"x"], [1, b"y"]])
    s.grant("n1", "j", 10)
    s.plan()
    assert len(s.record_results("n1", job, [[0, True, b"r"], [0, True, b"again"], [9, True, b"out of range"]])) == 1
    assert job.n_done == 1


def test_the_upload_prefix_stops_at_the_first_input_missing():
    s = Scheduler()
    s.add_node(node())
    job = s.admit(spec(n=10))
    s.add_inputs(job, [[0, b"x"], [1, b"x"]])
    assert job.upload_prefix == 2
    s.add_inputs(job, [[2, b"x"], [5, b"x"]])  # starts at the prefix, with a gap
    assert job.upload_prefix == 3
    s.add_inputs(job, [[3, b"x"], [4, b"x"]])  # a run that closes the gap
    assert job.upload_prefix == 6


def test_a_batch_of_results_with_a_repeat_counts_each_input_once():
    s = Scheduler()
    s.add_node(node())
    job = s.admit(spec(n=6, raise_errors=False))
    s.add_inputs(job, [[i, b"x"] for i in range(6)])
    s.grant("n1", "j", 10)
    s.plan()
    assert len(s.record_results("n1", job, [[0, True, b"r"], [1, False, b"e"]])) == 2
    # A repeat of an earlier result, and a repeat inside the batch: each input counts once.
    fresh = s.record_results("n1", job, [[2, True, b"r"], [1, True, b"again"], [3, True, b"r"], [3, False, b"e"]])
    assert [item[0] for item in fresh] == [2, 3] and (job.n_done, job.n_failed) == (4, 1)
    assert bytes(job.done) == bytes([1, 1, 1, 1, 0, 0]) and sorted(job.assignments["n1"].inflight) == [4, 5]
    fresh = s.record_results("n1", job, [[5, False, b"e"], [4, True, b"r"]])
    assert [item[0] for item in fresh] == [5, 4] and (job.n_done, job.n_failed) == (6, 2)
    assert not job.assignments["n1"].inflight


def test_inputs_in_any_order_are_queued_in_that_order_and_pushed_in_slices():
    s = Scheduler()
    s.add_node(node())
    job = s.admit(spec(n=10))
    s.add_inputs(job, [[i, bytes([i])] for i in (4, 5, 6)])  # a run that is not the first
    assert job.upload_prefix == 0
    s.add_inputs(job, [[i, bytes([i])] for i in (0, 3, 1)])  # out of order, and 2 is still missing
    assert job.upload_prefix == 2  # a client that comes back sends again from the first input missing
    s.add_inputs(job, [[i, bytes([i])] for i in (2, 7)])
    assert job.upload_prefix == 8 and [i for i, _ in job.pending] == [4, 5, 6, 0, 3, 1, 2, 7]
    with pytest.raises(ProtocolError, match="twice"):
        s.add_inputs(job, [[8, b"x"], [9, b"x"], [7, b"x"]])
    job.assignments["n1"].credit = 5
    pushed = [item for _, _, items in s.plan_for("n1", "j") for item in items]
    assert pushed == [(i, bytes([i])) for i in (4, 5, 6, 0, 3)]  # across the first two chunks
    assert sorted(job.assignments["n1"].inflight) == [0, 3, 4, 5, 6] and len(job.pending) == 3


def test_lost_node_requeues_what_it_held_first():
    s = Scheduler()
    s.add_node(node("a"))
    job = s.admit(spec(n=4))
    s.add_inputs(job, [[i, b"x"] for i in range(4)])
    s.grant("a", "j", 2)
    s.plan()
    s.record_results("a", job, [[0, True, b"r"]])
    s.remove_node("a")
    assert [i for i, _ in job.pending] == [1, 2, 3]


def test_bad_input_indices_are_protocol_errors():
    s = Scheduler()
    s.add_node(node())
    job = s.admit(spec(n=2))
    with pytest.raises(ProtocolError, match="outside"):
        s.add_inputs(job, [[5, b"x"]])
    with pytest.raises(ProtocolError, match="twice"):
        s.add_inputs(job, [[0, b"x"], [0, b"x"]])


def test_duplicate_job_id_is_refused():
    s = Scheduler()
    s.add_node(node())
    s.admit(spec())
    with pytest.raises(ProtocolError, match="already in use"):
        s.admit(spec())


def test_an_input_on_too_many_lost_nodes_is_given_up():
    from burla.head.scheduling.scheduler import MAX_NODE_LOSSES

    s = Scheduler()
    job = None
    for attempt in range(MAX_NODE_LOSSES):
        s.add_node(node(f"n{attempt}"))
        if job is None:
            job = s.admit(spec(n=1))
            s.add_inputs(job, [[0, b"x"]])
        s.grant(f"n{attempt}", "j", 1)
        pushed = [(node_id, job_id, part.items()) for node_id, job_id, part in s.plan()]
        assert pushed == [(f"n{attempt}", "j", [(0, b"x")])]
        [(affected, given_up)] = s.remove_node(f"n{attempt}")
        if attempt < MAX_NODE_LOSSES - 1:
            assert given_up == [] and [i for i, _ in job.pending] == [0]
        else:
            assert given_up == [0] and not job.pending


def test_an_ended_job_keeps_its_counts_but_not_its_per_input_state():
    s = Scheduler()
    s.add_node(node())
    job = s.admit(spec(n=1000, local_code=b"z" * 1000, packages={"numpy": "2.0"}))
    s.add_inputs(job, [[i, b"x" * 100] for i in range(1000)])
    s.grant("n1", "j", 10)
    s.plan()
    s.record_results("n1", job, [[0, True, b"r"]])
    assert s.finish(job, "CANCELED", "enough") == ["n1"]
    assert (job.status, job.n_done, job.n_inputs, job.spec.function_name) == ("CANCELED", 1, 1000, "f")
    assert not job.pending and not job.seen and not job.done and not job.assignments["n1"].inflight
    assert (job.spec.function_bytes, job.spec.local_code, job.spec.packages) == (b"", b"", {})
    # What was still on its way changes nothing now.
    s.add_inputs(job, [[5, b"late"]])
    assert s.record_results("n1", job, [[1, True, b"late"]]) == []
    record_steal("n1", job, "n2", [3])
    assert not job.pending and job.n_done == 1


def _restored(nodes=("a", "b"), n=6):
    s = Scheduler()
    job = s.restore(spec(n=n))
    for node_id in nodes:
        s.add_node(node(node_id, slots=2))
    return s, job


def _inputs(indices):
    return [[i, f"x{i}".encode()] for i in indices]


def test_a_node_back_after_a_restart_keeps_what_it_holds():
    s, job = _restored()
    adopt_held(job, "a", [0, 1, 2])
    assert job.node_held == {0: "a", 1: "a", 2: "a"}
    mark_client_held(job, zlib.compress(bytes(6)))  # the client has no result yet and uploads all six
    s.add_inputs(job, _inputs(range(6)))
    assert held_bytes(job, "a") == {0: b"x0", 1: b"x1", 2: b"x2"}  # bytes in case "a" dies
    assert [item[0] for item in job.pending] == [3, 4, 5] and job.received == 6 and not job.node_held
    s.grant("a", "j", 10)
    s.grant("b", "j", 10)
    pushed = {(node_id, item[0]) for node_id, _, items in s.plan() for item in items}
    assert {index for _, index in pushed} == {3, 4, 5}  # what "a" holds is not pushed again


def test_after_a_restart_an_input_a_node_finished_since_the_client_said_what_it_holds_is_not_queued_again():
    # Fails on the previous code: the returning node's results came between the client's ResumeJob
    # and its upload, and the upload queued those inputs again (a large input's placeholder then
    # waited on a node for bytes its client no longer kept: the job hung).
    s, job = _restored()
    adopt_held(job, "a", [0, 1, 2])
    mark_client_held(job, zlib.compress(bytes(6)))  # the client has no result yet
    s.record_results("a", job, [[1, True, b"r1"], [2, True, b"r2"]])  # the node's, kept while the head was away
    s.add_inputs(job, _inputs(range(6)))  # the client uploads all it lacks, as it said
    assert held_bytes(job, "a") == {0: b"x0"}
    assert [item[0] for item in job.pending] == [3, 4, 5]


def test_inputs_queued_again_go_back_to_the_node_that_holds_them():
    s = Scheduler()
    s.add_node(node("a", slots=2))
    job = s.admit(spec(n=4))
    s.add_inputs(job, _inputs(range(4)))
    s.grant("a", "j", 4)
    s.plan()
    s.remove_node("a")  # its connection dropped: its inputs are queued again
    assert [item[0] for item in job.pending] == [0, 1, 2, 3] and job.node_losses == {0: 1, 1: 1, 2: 1, 3: 1}
    s.add_node(node("a", slots=2))
    adopt_held(job, "a", [1, 3])  # it came back still holding two of them
    assert [item[0] for item in job.pending] == [0, 2]
    assert held_bytes(job, "a") == {1: b"x1", 3: b"x3"} and job.node_losses == {0: 1, 2: 1}


def test_a_node_back_may_say_it_holds_only_inputs_it_was_given():
    # Fails on the previous code: a returning node could name any queued input of a job it can
    # run, or another node's, and its results for them were taken.
    s = Scheduler()
    s.add_node(node("a", slots=2))
    s.add_node(node("b", slots=2))
    job = s.admit(spec(n=8))
    s.add_inputs(job, _inputs(range(8)))
    s.grant("a", "j", 2)
    s.grant("b", "j", 2)
    s.plan()
    given_to_a = set(job.assignments["a"].inflight)
    assert given_to_a and len(given_to_a) < 8
    s.remove_node("a")
    s.add_node(node("a", slots=2))
    adopt_held(job, "a", list(range(8)))  # it claims every input of the job
    assert set(job.assignments["a"].inflight) == given_to_a
    elsewhere = {item[0] for item in job.pending} | set(job.assignments["b"].inflight)
    assert elsewhere == set(range(8)) - given_to_a  # what it was never given stays queued or on "b"
    # Once taken up again, what it was given is spent: claiming again takes nothing.
    s.remove_node("a")
    s.add_node(node("a", slots=2))
    job.lost_holdings.clear()
    adopt_held(job, "a", list(range(8)))
    assert held_bytes(job, "a") == {}


def test_after_a_restart_a_node_back_is_believed_for_a_window_at_most():
    s, job = _restored(n=limits.MAX_NODE_WINDOW + 10)
    adopt_held(job, "a", list(range(limits.MAX_NODE_WINDOW + 10)))
    assert len(job.node_held) == limits.MAX_NODE_WINDOW


def test_held_inputs_of_a_lost_holder_are_queued_when_uploaded():
    s, job = _restored()
    adopt_held(job, "a", [0, 1])
    s.remove_node("a")
    assert not job.node_held
    mark_client_held(job, zlib.compress(bytes(6)))
    s.add_inputs(job, _inputs(range(6)))
    assert [item[0] for item in job.pending] == list(range(6))


def test_results_before_the_client_is_back_are_merged_with_what_it_holds():
    s, job = _restored()
    adopt_held(job, "a", [0, 1, 2])
    s.record_results("a", job, [[1, True, b"r1"], [2, False, b"e2"]])
    assert job.n_done == 2 and job.n_failed == 1
    held, states = mark_client_held(job, zlib.compress(bytes([1, 0, 0, 0, 2, 0])))  # the client has 0 and 4 (failed)
    assert held == 2 and states == bytes([1, 0, 0, 0, 2, 0])
    assert (job.n_done, job.n_failed, job.upload_prefix) == (4, 2, 3)
    s.add_inputs(job, _inputs([0, 1, 2, 3, 4, 5]))  # sending again what it lacks results for is fine
    assert [item[0] for item in job.pending] == [3, 5] and held_bytes(job, "a") == {}
    assert job.node_held == {}


def test_a_held_input_stolen_before_its_bytes_arrive_follows_the_thief():
    s, job = _restored()
    adopt_held(job, "a", [0, 1])
    record_steal("b", job, "a", [1])
    mark_client_held(job, zlib.compress(bytes(6)))
    s.add_inputs(job, _inputs([0, 1]))
    assert held_bytes(job, "a") == {0: b"x0"} and held_bytes(job, "b") == {1: b"x1"}


def test_a_restored_job_pushes_nothing_while_it_waits_for_its_nodes():
    s, job = _restored()
    job.waits_for_nodes = True
    mark_client_held(job, zlib.compress(bytes(6)))
    s.add_inputs(job, _inputs(range(6)))
    s.grant("a", "j", 10)
    assert s.plan() == []
    job.waits_for_nodes = False
    assert sum(len(items) for _, _, items in s.plan()) == 6


def test_register_node_held_indices_must_be_packed():
    bad = wire.RegisterNode("n", "u", 1, 1, 1.0, None, 0, None, "r", "3.11", "0", "b", b"", [["j", b"\x00\x01\x02"]])
    with pytest.raises(ProtocolError, match="packed"):
        wire.decode(bad.encode(), wire.NODE_OPENING)
    assert unpack_indices(pack_indices([0, 5, 2**32 - 1])) == [0, 5, 2**32 - 1]


def _on(host, node_id, **kw):
    record = node(node_id, **kw)
    record.host_id = host
    return record


def test_inputs_go_by_file_only_when_every_node_shares_the_clients_machine():
    s = Scheduler()
    s.add_node(_on("laptop", "a"))
    job = s.admit(spec(job_id="by-file", client_host="laptop"))
    assert job.spec.client_host == "laptop"
    # A node of another machine that joins later does not take this job (it could not open the files).
    assert s.add_node(_on("vm", "b")) == []
    assert set(job.assignments) == {"a"}
    # With that node there, the next job's inputs go inline, and it runs on both.
    mixed = s.admit(spec(job_id="inline", client_host="laptop"))
    assert mixed.spec.client_host == "" and set(mixed.assignments) == {"a", "b"}


def test_inputs_go_inline_while_a_node_boots():
    s = Scheduler()
    s.add_node(_on("laptop", "a"))
    s.booting_ids.add("booting-vm")
    assert s.admit(spec(client_host="laptop")).spec.client_host == ""


def test_a_clients_machine_is_no_requirement_for_growth_or_errors():
    # Growth counts the ready capacity with `ineligibility`: a node elsewhere still counts (a
    # by-file job only stays on its machine once admitted, through `can_join`).
    elsewhere = _on("vm", "b")
    by_file = spec(client_host="laptop")
    assert ineligibility(elsewhere, by_file) is None
    assert not can_join(elsewhere, by_file) and can_join(_on("laptop", "a"), by_file)


def test_a_large_input_is_pushed_in_a_frame_of_its_own():
    from burla.head.scheduling.input_queue import MAX_PUSH_BYTES, InputQueue

    sizes = [10, MAX_PUSH_BYTES // 2, MAX_PUSH_BYTES, 10, MAX_PUSH_BYTES + 1, MAX_PUSH_BYTES // 2, MAX_PUSH_BYTES // 2]
    queue = InputQueue()
    queue.append(PackedInputs.of([[i, b"x" * size] for i, size in enumerate(sizes)]))
    frames = queue.take(len(sizes))
    assert [part.index_list() for part in frames] == [[0, 1], [2], [3], [4], [5, 6]]
    assert [len(part.data) for part in frames[1:4]] == sizes[2:5]


def test_a_node_is_believed_only_for_results_of_inputs_it_holds():
    # Fails on the previous code: any node's result was taken for any input of any job.
    s, job = uploaded_two_node_job(10, 10)
    on_a = sorted(job.assignments["a"].inflight)
    on_b = sorted(job.assignments["b"].inflight)
    assert on_a and on_b
    # Node b answers for a's inputs (packed, as the common case; then decoded): neither is taken.
    assert not s.record_successes("b", job, pack_indices(on_a))
    assert s.record_results("b", job, [[i, True, b"forged"] for i in on_a]) == []
    assert job.n_done == 0 and sorted(job.assignments["a"].inflight) == on_a
    # A node the job was never given to is not believed either.
    assert s.record_results("stranger", job, [[on_a[0], True, b"forged"]]) == []
    # Its own results are, and a mixed frame keeps only its own.
    assert s.record_successes("a", job, pack_indices(on_a[:1]))
    taken = s.record_results("b", job, [[on_b[0], True, b"ok"], [on_a[1], True, b"forged"]])
    assert [item[0] for item in taken] == [on_b[0]] and job.n_done == 2


def test_a_nodes_credit_never_exceeds_what_a_node_could_hold():
    # Fails on the previous code: a node asking for 10**12 inputs was pushed the whole queue.
    s, job = two_node_job(100_000)
    s.grant("a", "j", 10**12)
    assert job.assignments["a"].credit == limits.MAX_NODE_WINDOW
