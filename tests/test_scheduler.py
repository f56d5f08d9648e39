"""The head's scheduling rules, on pure state."""

from __future__ import annotations

import pytest

from burla import wire
from burla.errors import NoCompatibleNodes, NoNodes, ProtocolError
from burla.head.scheduler import RUNNING, NodeRecord, Scheduler


def node(node_id="n1", slots=4, cpus=4, ram_gb=16.0, gpu=None, gpu_count=0, image=None, region="local", python="3.11"):
    return NodeRecord(node_id, "http://x", slots, cpus, ram_gb, gpu, gpu_count, image, region, python, "0.1.0")


def spec(job_id="j", n=10, **kw):
    values = dict(func_cpu=None, func_ram=None, func_gpu=None, image=None, grow=False, max_parallelism=None,
                  detach=False, raise_errors=True, region=None, disk_gb=None, parent_job_id=None,
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
    assert [(j.job_id, p) for j, p in joins] == [("j", 4)]


def test_parallelism_follows_cpu_and_ram_per_call():
    s = Scheduler()
    s.add_node(node(slots=8, cpus=8, ram_gb=16))
    assert s.admit(spec("a", func_cpu=2)).assignments["n1"].parallelism == 4
    assert s.admit(spec("b", func_ram=5)).assignments["n1"].parallelism == 3
    assert s.admit(spec("c")).assignments["n1"].parallelism == 8


def test_max_parallelism_is_split_across_nodes():
    s = Scheduler()
    s.add_node(node("a", slots=4))
    s.add_node(node("b", slots=4))
    job = s.admit(spec(max_parallelism=5))
    assert sorted(a.parallelism for a in job.assignments.values()) == [1, 4]
    s.add_node(node("c", slots=4))  # a late node only gets what the cap leaves
    assert "c" not in job.assignments


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


def test_gpu_nodes_match_gpu_jobs():
    s = Scheduler()
    s.add_node(node(gpu="A100", gpu_count=2, slots=8))
    assert s.admit(spec(func_gpu="a100")).assignments["n1"].parallelism == 2


def test_plan_respects_credit_and_splits_fairly():
    s = Scheduler()
    s.add_node(node("a"))
    s.add_node(node("b"))
    job = s.admit(spec(n=10))
    s.add_inputs(job, [[i, b"x"] for i in range(10)])
    assert s.plan() == []  # no credit yet
    s.grant("a", "j", 100)
    s.grant("b", "j", 3)
    pushes = s.plan()
    sent = {node_id: [i for i, _ in items] for node_id, _, items in pushes}
    assert len(sent["b"]) == 3 and len(sent["a"]) == 7
    assert sorted(sent["a"] + sent["b"]) == list(range(10))


def test_results_are_kept_once_per_index():
    s = Scheduler()
    s.add_node(node())
    job = s.admit(spec(n=2))
    s.add_inputs(job, [[0, b"x"], [1, b"y"]])
    s.grant("n1", "j", 10)
    s.plan()
    assert len(s.record_results("n1", job, [[0, True, b"r"], [0, True, b"again"], [9, True, b"out of range"]])) == 1
    assert job.n_done == 1


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
    from burla.head.scheduler import MAX_NODE_LOSSES

    s = Scheduler()
    job = None
    for attempt in range(MAX_NODE_LOSSES):
        s.add_node(node(f"n{attempt}"))
        if job is None:
            job = s.admit(spec(n=1))
            s.add_inputs(job, [[0, b"x"]])
        s.grant(f"n{attempt}", "j", 1)
        assert s.plan() == [(f"n{attempt}", "j", [[0, b"x"]])]
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
    s.record_steal("n1", job, "n2", [3])
    assert not job.pending and job.n_done == 1
