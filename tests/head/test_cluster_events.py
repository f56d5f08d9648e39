"""The head's Cluster driven message by message (no processes: the frames it
would send are read from its links)."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from burla.errors import HeadUnreachable, ProtocolError
from burla.head.cluster import Cluster
from burla.head.history.store import KeptJob
from burla.head.links import NodeLink
from burla.head.scheduling.records import COMPLETED, RUNNING
from burla.protocol import wire
from burla.protocol.states import EndKind
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.packed_results import PackedResults, pack_indices, pack_items, untimed
from burla.web.scoped_tokens import job_secret
from tests.head.test_scheduler import spec


class RecordingSocket:
    """Stands in for a WebSocket the head writes to: it keeps the frames."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    async def send_bytes(self, data: bytes) -> None:
        self.frames.append(data)

    async def close(self) -> None:
        pass


def _results(items: list) -> wire.NodeResults:
    """A node's frame of these results ([[index, ok, payload], ...]) for job "j"."""
    return wire.NodeResults.of("j", PackedResults.of(items), 0)


def _resume(job_id: str, acked_seq: int, held: bytes, cluster: Cluster) -> wire.ResumeJob:
    """The job's client coming back, with the job's secret."""
    return wire.ResumeJob(job_id, acked_seq, held, job_secret(cluster.token, job_id))


def _register(cluster: Cluster, node_id: str, held: list) -> NodeLink:
    link = NodeLink(node_id, RecordingSocket())
    msg = wire.RegisterNode(node_id, "http://x", 2, 2, 4.0, None, 0, None, "local", "3.11.7", cluster.version,
                            cluster.build, b"", held)
    cluster.node_registered(msg, link, b"")
    return link


@pytest.mark.asyncio
async def test_results_a_returning_node_sends_again_do_not_count_twice():
    cluster = Cluster("0.1.0")
    opening = spec(n=4, raise_errors=False)
    cluster.recovery.restore_jobs([KeptJob(opening.encode(), None, RUNNING, "", "", [], [])])
    _register(cluster, "a", [["j", pack_indices([0, 1, 2, 3])]])
    job = cluster.scheduler.jobs["j"]
    # The node finished 0, 1 and 2 while the head was away; the client already got 0 and 1.
    cluster.on_node_message("a", _results([[0, True, b"r0"], [1, True, b"r1"], [2, True, b"r2"]]))
    _, link, _ = cluster.resume_job(_resume("j", 1, zlib.compress(bytes([1, 1, 0, 0])), cluster))
    assert link.acked == 2
    socket = RecordingSocket()
    link.attach(socket)
    for _ in range(20):
        await asyncio.sleep(0)
    batches = [wire.decode(frame, wire.HEAD_TO_CLIENT) for frame in socket.frames]
    sent = [item[0] for batch in batches if isinstance(batch, wire.ResultBatch) for item in batch.items]
    assert sent == [2]
    cluster.ack(job, max(b.seq for b in batches if isinstance(b, wire.ResultBatch)))
    assert link.acked == 3 and job.status == RUNNING  # input 3 is still out
    cluster.on_node_message("a", _results([[3, True, b"r3"]]))
    for _ in range(20):
        await asyncio.sleep(0)
    cluster.ack(job, max(b.seq for b in (wire.decode(f, wire.HEAD_TO_CLIENT) for f in socket.frames)
                         if isinstance(b, wire.ResultBatch)))
    assert link.acked == 4 and job.status == COMPLETED
    await link.detach(socket, 0.0)


def _pushed(link: NodeLink) -> list[int]:
    """Input indices the head has queued for this node's connection."""
    return [item[0] for frame in link._frames for msg in [wire.decode(frame, wire.HEAD_TO_NODE)]
            if isinstance(msg, wire.InputBatch) for item in msg.part().items()]


def _open(cluster: Cluster, n: int) -> tuple:
    """Job "j" of `n` inputs, every one uploaded: (its record, its client link)."""
    job, link = cluster.open_job(spec(n=n, raise_errors=False))
    cluster.add_inputs(job, PackedInputs.of([[i, f"x{i}".encode()] for i in range(n)]))
    return job, link


async def _told(socket: RecordingSocket, kind: type) -> list:
    """The messages of this kind a client link has sent on `socket`, once its writer has run."""
    for _ in range(20):
        await asyncio.sleep(0)
    told = [wire.decode(frame, wire.HEAD_TO_CLIENT) for frame in socket.frames]
    return [msg for msg in told if isinstance(msg, kind)]


@pytest.mark.asyncio
async def test_a_node_back_before_its_old_connection_ended_keeps_its_job_and_its_inputs():
    cluster = Cluster("0.1.0")
    first = _register(cluster, "a", [])
    _open(cluster, 4)
    assert sorted(_pushed(first)) == [0, 1, 2, 3]
    # It reconnects holding 0 and 1 (2 and 3 were lost on the old connection) before the head saw
    # the old one end: the job goes on, and only 2 and 3 are sent again.
    second = _register(cluster, "a", [["j", pack_indices([0, 1])]])
    job = cluster.scheduler.jobs["j"]
    assert job.status == RUNNING
    assert sorted(_pushed(second)) == [2, 3]
    assert sorted(job.assignments["a"].inflight) == [0, 1, 2, 3]


@pytest.mark.asyncio
async def test_what_a_reconnecting_node_holds_is_not_pushed_to_another_node():
    cluster = Cluster("0.1.0")
    first = _register(cluster, "a", [])
    _open(cluster, 4)
    other = _register(cluster, "b", [])
    assert sorted(_pushed(first)) == [0, 1, 2, 3] and _pushed(other) == []
    _register(cluster, "a", [["j", pack_indices([0, 1, 2, 3])]])
    assert _pushed(other) == []


@pytest.mark.asyncio
async def test_a_stopping_head_refuses_new_jobs():
    cluster = Cluster("0.1.0")
    _register(cluster, "a", [])
    await cluster.shut_down()
    with pytest.raises(HeadUnreachable, match="stopping"):
        _open(cluster, 2)


def _sent(link: NodeLink, kind: type) -> list:
    return [msg for frame in link._frames for msg in [wire.decode(frame, wire.HEAD_TO_NODE)] if isinstance(msg, kind)]


@pytest.mark.asyncio
async def test_a_one_call_job_goes_to_one_node_and_moves_when_that_node_is_lost():
    cluster = Cluster("0.1.0")
    links = {"a": _register(cluster, "a", []), "b": _register(cluster, "b", [])}
    _open(cluster, 1)
    [chosen] = [node_id for node_id, link in links.items() if _sent(link, wire.AssignJob)]
    other = "b" if chosen == "a" else "a"
    assert _pushed(links[chosen]) == [0] and _pushed(links[other]) == []
    cluster.node_dropped(chosen)  # its connection closed: the job must not wait on it alone
    job = cluster.scheduler.jobs["j"]
    assert job.status == RUNNING and list(job.assignments) == [other]
    assert _sent(links[other], wire.AssignJob) and _pushed(links[other]) == [0]


@pytest.mark.asyncio
async def test_a_node_whose_process_ended_before_its_connection_did_is_lost_at_once():
    # On a busy machine the local driver can see the node's exit before the head reads the end
    # of its connection: the job must not then wait for a node that cannot rejoin.
    cluster = Cluster("0.1.0")
    _register(cluster, "a", [])
    _open(cluster, 2)
    cluster.node_boot_failed("a", "node process exited with code -9")
    assert _ended(cluster, "j")[0] == RUNNING  # its connection is still open
    cluster.node_dropped("a")
    status, kind, reason = _ended(cluster, "j")
    assert (status, kind) == ("FAILED", "NodeDisconnected") and "inputs have no result" in reason
    assert not cluster.rejoining and "a" not in cluster.booting_ids and not cluster.exited


@pytest.mark.asyncio
async def test_inputs_carried_in_the_opening_are_not_kept_as_part_of_the_job():
    # A restarted head takes a job up from the spec it keeps: inputs there would be taken twice.
    cluster = Cluster("0.1.0")
    link = _register(cluster, "a", [])
    job, _ = cluster.open_job(spec(job_id="j", n=2, first_inputs=[[0, b"a"]]))
    assert job.spec.first_inputs == [] and wire.decode(job.spec.encode()).first_inputs == []
    assert job.received == 1 and _pushed(link) == [0]  # they are the job's inputs, pushed at once


def _ended(cluster: Cluster, job_id: str) -> tuple[str, str, str]:
    job = cluster.scheduler.jobs[job_id]
    return job.status, job.end_kind, job.reason


@pytest.mark.asyncio
async def test_a_job_admitted_while_its_only_candidate_booted_ends_when_that_node_cannot_run_it():
    cluster = Cluster("0.1.0")
    cluster.expect_nodes(["a"])
    cluster.open_job(spec(job_id="gpu", n=2, func_gpu="H100"))  # waits: "a" may have one
    assert _ended(cluster, "gpu")[0] == RUNNING
    _register(cluster, "a", [])  # it has no GPU
    status, kind, reason = _ended(cluster, "gpu")
    assert (status, kind) == ("FAILED", "NoCompatibleNodes") and "func_gpu='H100'" in reason


@pytest.mark.asyncio
async def test_a_job_waits_while_another_node_boots_and_ends_when_that_one_fails():
    cluster = Cluster("0.1.0")
    cluster.expect_nodes(["a", "b"])
    cluster.open_job(spec(job_id="gpu", n=2, func_gpu="H100"))
    _register(cluster, "a", [])
    assert _ended(cluster, "gpu")[0] == RUNNING  # "b" may still have one
    cluster.node_boot_failed("b", "its VM was deleted")
    assert _ended(cluster, "gpu")[:2] == ("FAILED", "NoCompatibleNodes")


@pytest.mark.asyncio
async def test_a_by_file_job_whose_machine_has_no_node_left_ends_though_other_machines_have_nodes():
    cluster = Cluster("0.1.0")
    here = wire.RegisterNode("here", "http://x", 2, 2, 4.0, None, 0, None, "local", "3.11.7", cluster.version,
                             cluster.build, b"", [], "client-machine")
    cluster.node_registered(here, NodeLink("here", RecordingSocket()), b"")
    cluster.open_job(spec(job_id="files", n=2, client_host="client-machine"))
    assert cluster.scheduler.jobs["files"].spec.client_host == "client-machine"  # inputs go by file
    elsewhere = wire.RegisterNode("far", "http://y", 2, 2, 4.0, None, 0, None, "local", "3.11.7", cluster.version,
                                  cluster.build, b"", [], "another-machine")
    cluster.node_registered(elsewhere, NodeLink("far", RecordingSocket()), b"")
    cluster.node_dropped("here")  # it may come back for a while
    assert _ended(cluster, "files")[0] == RUNNING
    cluster.node_boot_failed("here", "not back within the node deadline", "did not come back")
    status, kind, reason = _ended(cluster, "files")
    assert (status, kind) == ("FAILED", "NoCompatibleNodes") and "files on the client's machine" in reason


@pytest.mark.asyncio
async def test_a_job_waiting_for_booting_nodes_says_so_to_its_client_and_in_its_view():
    import io

    from burla.client.progress import Display

    cluster = Cluster("0.1.0")
    cluster.expect_nodes(["a", "b"])
    job, link = cluster.open_job(spec(job_id="w", n=2))
    assert cluster.job_view(job).waiting_for_booting_nodes == 2
    socket = RecordingSocket()
    link.attach(socket)
    cluster.clients.send_progress(job, link)
    progress = await _told(socket, wire.Progress)
    assert progress and progress[-1].booting == 2

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    display = Display(2, True, stdout=terminal, stderr=io.StringIO())
    display.progress(0, 0, 0, progress[-1].booting)
    assert "waiting for 2 booting nodes" in terminal.getvalue()
    _register(cluster, "a", [])
    assert cluster.job_view(job).waiting_for_booting_nodes == 0  # it has a node now
    await link.detach(socket, 0.0)


def _held_results(link) -> list:
    items = []
    for count, packed in link.results:
        items.extend(wire.decode(b"".join(wire.result_batch_parts("j", 0, count, [packed])), wire.HEAD_TO_CLIENT).items)
    return items


@pytest.mark.asyncio
async def test_a_nodes_results_reach_the_client_once_whether_passed_on_packed_or_sorted_out():
    cluster = Cluster("0.1.0")
    _register(cluster, "a", [])
    job, link = _open(cluster, 5)
    first = _results([[0, True, b"r0"], [1, True, b"r1"]])
    cluster.on_node_message("a", first)
    assert link.results[0][1] is first.packed  # passed on as the node packed it
    # A repeat beside a new one, then a failure: both are sorted out result by result.
    cluster.on_node_message("a", _results([[1, True, b"again"], [2, True, b"r2"]]))
    cluster.on_node_message("a", _results([[3, False, b"e3"]]))
    assert _held_results(link) == [[0, True, b"r0"], [1, True, b"r1"], [2, True, b"r2"], [3, False, b"e3"]]
    assert (job.n_done, job.n_failed) == (4, 1)


@pytest.mark.asyncio
async def test_packed_results_that_are_not_what_their_indices_name_change_nothing():
    cluster = Cluster("0.1.0")
    _register(cluster, "a", [])
    job, link = _open(cluster, 3)
    cluster.on_node_message("a", _results([[0, True, b"r0"]]))
    # Input 0 again (so not passed on packed), packed as if it were input 2.
    lying = wire.NodeResults("j", pack_indices([0]), b"", pack_items([[2, True, b"r2"]]), 0, untimed(1))
    with pytest.raises(ProtocolError, match="other results than its indices name"):
        cluster.on_node_message("a", lying)
    assert _held_results(link) == [[0, True, b"r0"]] and job.n_done == 1


@pytest.mark.asyncio
async def test_a_restarted_heads_batches_of_a_detached_job_are_numbered_after_what_its_collector_acked():
    # Fails on the code before: the restarted head numbered them from 1 again, so a collector
    # that had acknowledged up to 40 and resumed again would acknowledge batches it never had.
    cluster = Cluster("0.1.0")
    opening = spec(n=3, detach=True, raise_errors=False)
    kept = [[0, True, b"r0"], [1, True, b"r1"]]
    cluster.recovery.restore_jobs([KeptJob(opening.encode(), None, RUNNING, "", EndKind.NONE, [[2, b"x"]], kept)])
    _, link, _ = cluster.resume_job(_resume("j", 40, b"", cluster))
    socket = RecordingSocket()
    link.attach(socket)
    batches = await _told(socket, wire.ResultBatch)
    assert [item for batch in batches for item in batch.items] == kept
    assert all(batch.seq > 40 for batch in batches)
    await link.detach(socket, 0.0)


@pytest.mark.asyncio
async def test_a_client_whose_last_acknowledgement_was_lost_completes_its_job_when_it_resumes():
    # Fails on the code before: the head counted the resumed acknowledgement but left the job
    # running, so the client waited for an end that never came (and the job ended CANCELED).
    cluster = Cluster("0.1.0")
    _register(cluster, "a", [])
    job, link = _open(cluster, 2)
    first = RecordingSocket()
    link.attach(first)
    cluster.on_node_message("a", _results([[0, True, b"r0"], [1, True, b"r1"]]))
    [batch] = await _told(first, wire.ResultBatch)
    await link.detach(first, 0.0)  # the connection went with the acknowledgement on it
    _, resumed, _ = cluster.resume_job(_resume("j", batch.seq, zlib.compress(bytes([1, 1])), cluster))
    assert job.status == COMPLETED
    second = RecordingSocket()
    resumed.attach(second)
    ends = await _told(second, wire.JobEnded)
    assert [(m.status, m.kind) for m in ends] == [(COMPLETED, EndKind.NONE)]
    await resumed.detach(second, 0.0)


def _node_told(link: NodeLink, kind: type) -> list:
    """The messages of this kind the head has queued for a node's connection, in order."""
    told = [wire.decode(frame, wire.HEAD_TO_NODE) for frame in link._frames]
    return [msg for msg in told if isinstance(msg, kind)]


def test_nodes_hear_once_when_every_input_of_a_job_is_on_them():
    # Fails on the previous code (nothing said it): a node counted its unfilled credit as inputs
    # still to come, and cut a multi-node job's last batches too big for even shares.
    cluster = Cluster("0.1.0")
    links = [_register(cluster, "a", []), _register(cluster, "b", [])]
    job, _ = cluster.open_job(spec(n=2_000, raise_errors=False))
    cluster.add_inputs(job, PackedInputs.of([[i, b"x"] for i in range(1_000)]))
    for node_id in ("a", "b"):
        cluster.on_node_message(node_id, wire.Credit("j", 5_000))
    assert not job.pending and not any(_node_told(link, wire.InputsPushed) for link in links)  # more to upload
    cluster.add_inputs(job, PackedInputs.of([[i, b"x"] for i in range(1_000, 2_000)]))
    assert not job.pending and job.all_pushed
    for link in links:
        assert _node_told(link, wire.InputsPushed) == [wire.InputsPushed("j")]
        kinds = [type(wire.decode(frame, wire.HEAD_TO_NODE)) for frame in link._frames]
        assert kinds.index(wire.InputsPushed) > max(i for i, k in enumerate(kinds) if k is wire.InputBatch)
    # A node lost: its inputs go to the other one, which already knows there are no more.
    cluster.node_lost("b")
    assert len(_node_told(links[0], wire.InputsPushed)) == 1


def test_a_node_that_joins_after_every_input_was_pushed_hears_it_with_its_share():
    cluster = Cluster("0.1.0")
    a, b, c = (_register(cluster, node_id, []) for node_id in "abc")
    job, _ = _open(cluster, 4)  # two calls a node: two of the three nodes take it
    assert sorted(job.assignments) == ["a", "b"]
    for node_id in job.assignments:
        cluster.on_node_message(node_id, wire.Credit("j", 10))
    assert job.all_pushed and not _node_told(c, wire.InputsPushed)
    cluster.node_lost("b")  # its share, and its inputs, go to the node left out
    kinds = [type(wire.decode(frame, wire.HEAD_TO_NODE)) for frame in c._frames]
    assert kinds[:2] == [wire.AssignJob, wire.InputsPushed] and wire.InputBatch in kinds


def test_a_job_on_one_node_costs_no_frame_to_say_so():
    cluster = Cluster("0.1.0")
    a = _register(cluster, "a", [])
    job, _ = _open(cluster, 2)
    assert job.all_pushed and _pushed(a) == [0, 1] and not _node_told(a, wire.InputsPushed)
