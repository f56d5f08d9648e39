"""Wire messages: every type round-trips, and malformed frames fail with a message."""

from __future__ import annotations

import tracemalloc

import msgpack
import pytest

from burla.errors import ProtocolError
from burla.protocol import framing, limits, wire, worker_wire
from burla.protocol.values.inline_values import MAX_STR_BYTES, MAX_STR_CHARS, VALUE
from burla.protocol.values.packed_inputs import PackedInputs, pack_uints
from burla.protocol.values.packed_results import (
    PackedResults,
    array_header_bytes,
    item_frames,
    pack_indices,
    pack_items,
    packed_frames,
    unpack_indices,
    untimed,
)

SAMPLES: list[wire.Message] = [
    wire.OpenJob(
        "j-1", "f", b"fn", 3, None, 2.5, None, None, False, 4, False, True, None, None, None, 2, 30.0, "0.1.0",
        "3.11.7",
        b"",
        {"numpy": "2.0.0"}, "host-id",
    ),
    wire.JobAccepted("j-1", 10, 1024, 1, 2, True),
    wire.ErrorReply("NoNodes", "none", 503),
    wire.Credit("j-1", 5),
    wire.CreditWithdrawn("j-1", 40),
    wire.InputsPushed("j-1"),
    wire.ResultBatch("j-1", 7, [[0, True, b"r"], [1, False, b"e"]]),
    wire.NodeResults.of("j-1", PackedResults.of([[0, True, b"r"], [1, False, b"e"]]), 12),
    wire.ResultAck("j-1", 7),
    wire.OutputBatch("j-1", [[0, wire.STDOUT, "hi\n"]]),
    wire.Progress("j-1", 1, 0, 2, 3),
    wire.Progress("j-1", 0, 0, 0, 5, 3, {"installing": 2, "ssh": 1}),
    wire.CancelJob("j-1", "why"),
    wire.JobEnded("j-1", "FAILED", "NodeDisconnected", "lost"),
    wire.ResumeJob("j-1", 4, b"x\x9c\x03\x00\x00\x00\x00\x01"),
    wire.JobResumed("j-1", 100, 100, 10, 1024),
    wire.RegisterNode("n", "http://127.0.0.1:1", 2, 2, 3.5, None, 0, None, "local", "3.11", "0.1.0", "0.1.0+abc", b"",
                      [["j", pack_indices([0, 7])]], "host-id"),
    wire.InputsKept("j-1", 12),
    wire.NodeRegistered("n", "0.1.0", b"k" * 32),
    wire.AssignJob("j-1", "f", b"fn", 2, 0.5, None, b"zip", {}, 4),
    wire.ReleaseJob("j-1"),
    wire.NodeState("n", "RUNNING", 2, [["j-1", 2, 5, 9]], 50.0, 10.0, 1024.0, 2048.0),
    wire.ShutdownNode("bye"),
    wire.NodeLeaving("stopped by SIGTERM"),
    wire.ErrorRecord("KeyError", "builtins", "missing", "Traceback ...", b"pickled", {"tb_lineno": 3, "tb_next": None}),
    wire.StealHint("j-1", "n2", "https://127.0.0.1:2", b"d" * 32, "n1-ab", 1.8e9, b"g" * 32),
    wire.Stolen("j-1", "n2", [3, 4], "t-1", 1.5, b"g" * 32, b"r" * 32),
    wire.StealRequest("j-1", "t-1", "n1", 8, 1.8e9, b"g" * 32),
    wire.StealGrant("j-1", "t-1", [[3, b"a"]], b"r" * 32),
    wire.StealAck("j-1", "t-1", b"g" * 32),
    worker_wire.WorkerReady(123),
    worker_wire.WorkerWaiting(True),
    worker_wire.LoadFunction("j-1", b"fn", b""),
    worker_wire.RunCalls.of("j-1", PackedInputs.of([[0, b"a"], [5, b"bc"]])),
    wire.InputBatch.of("j-1", PackedInputs.of([[2, b"xyz"], [3, b""]])),
    worker_wire.UnloadFunction("j-1"),
    wire.UploadDirect("j-1", pack_uints([4, 5]), pack_uints([2**21, 2**22]), b"", "n1", "https://127.0.0.1:3",
                      b"d" * 32, 1.8e9, b"g" * 32),
    wire.DirectInputs("j-1", pack_uints([4]), pack_uints([3]), b"abc"),
    wire.DirectReceived("j-1", pack_uints([4]), b"", b""),
    wire.DirectFallback("j-1", pack_uints([5]), pack_uints([2]), b"de", "n1"),
    wire.DirectFill("j-1", pack_uints([5]), pack_uints([2]), b"de"),
    worker_wire.WorkerReport.of("j-1", [[0, True, b"r"]], [[0, wire.STDERR, "x"]], True),
    worker_wire.WorkerReport.of_part("j-1", PackedResults.of([[0, True, b"\x01\x03\x00\x00\x00"]]), [], True, 0.5,
                                     PackedInputs.of([[0, b"big"]])),
    worker_wire.RunCalls("j-1", pack_uints([1]), pack_uints([1]), b"a", True),
    wire.DirectResults("j-1", pack_uints([7]), pack_uints([3]), b"res"),
    wire.DirectResultsReceived("j-1", pack_uints([7])),
    wire.DirectOffer("j-1", "n1", "https://127.0.0.1:3", b"d" * 32, 1.8e9, b"g" * 32),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    assert wire.decode(msg.encode()) == msg


def test_every_registered_message_has_a_sample():
    assert {type(m) for m in SAMPLES} == set(wire.REGISTRY.values())


# Each case's id is its place and its words: a frame with timings holds the clock, which would
# give each collection (an xdist worker's) different ids.
MALFORMED_FRAMES = [
    (b"\xc0\xc1\xc1", "not valid msgpack"),
    (b"", "not valid msgpack"),
    (msgpack.packb({"a": 1}), "msgpack array"),
    (msgpack.packb([]), "msgpack array"),
    (msgpack.packb([999, 1]), "unknown message tag 999"),
    (msgpack.packb([7, "j"]), "needs 2 fields, got 1"),
    (msgpack.packb([7, "j", "not-int"]), "ResultAck.seq has the wrong type"),
    (msgpack.packb([7, "j", True]), "ResultAck.seq has the wrong type"),
    (msgpack.packb([4, "j", [[0, b"x"]]]), "needs 4 fields, got 2"),
    (msgpack.packb([4, "j", [[0]], b"", b""]), "InputBatch.indices has the wrong type"),
    (msgpack.packb([4, "j", b"", b"", "x"]), "InputBatch.data has the wrong type"),
    (wire.InputBatch.of("j", PackedInputs.of([[0, b"x"]])).encode()[:-2], "not valid msgpack"),
    (msgpack.packb([39, "j", pack_indices([0]), b"", pack_items([[0, True, b"r"]]), -1, untimed(1), b""]),
     "credit must not be negative"),
    (msgpack.packb([39, "j", pack_indices([0, 1]), b"", pack_items([[0, True, b"r"], [1, True, b"r"]]), 0,
                    untimed(2), pack_indices([1, 2])]), "runs must be packed 4-byte counts adding up"),
    (msgpack.packb([39, "j", pack_indices([0]), b"", pack_items([[0, True, b"r"]]), 0, untimed(1), b"\x01"]),
     "runs must be packed 4-byte counts"),
    (msgpack.packb([39, "j", b"\x00\x00\x00", b"", b"", 0, b"", b""]), "NodeResults.indices must be packed"),
    (msgpack.packb([39, "j", pack_indices([0]), b"", pack_items([[0, True, b"r"]]), 0, b"\x00" * 8, b""]),
     "timings must hold 3 doubles per result"),
    (msgpack.packb([39, "j", pack_indices([0]), b"\x00", b"", 0, untimed(1), b""]),
     "NodeResults.failed must be packed"),
    (msgpack.packb([39, "j", pack_indices([0]), pack_indices([0, 0]), b"", 0, untimed(1), b""]),
     "more failed results"),
    (msgpack.packb([39, "j", [[0, True, b"r"]], 0]), "needs 7 fields"),
    (msgpack.packb([4, "j", b"\x00\x00\x00", b"\x00\x00\x00", b""]), "a 4-byte index and a 4-byte size"),
    (msgpack.packb([4, "j", pack_indices([0, 1]), pack_indices([1]), b"x"]), "a 4-byte index and"),
    (msgpack.packb([4, "j", pack_indices([0]), pack_indices([2]), b"x"]), "not as long as its sizes"),
    (msgpack.packb([32, "j", pack_indices([0]), pack_indices([1]), b"xy", False]), "RunCalls.data is not as"),
    (msgpack.packb([41, "j", "t", [[-1, b"x"]], b"r"]), "StealGrant input indices must be in"),
    (msgpack.packb([41, "j", "t", [[0, b"x"], [limits.MAX_INPUTS, b"y"]], b"r"]),
     "StealGrant input indices must be in"),
    (msgpack.packb([32, "j", pack_indices([0] * (limits.BATCH_ITEMS + 1)),
                    pack_indices([0] * (limits.BATCH_ITEMS + 1)), b"", False]), "more than 4096 inputs"),
]


@pytest.mark.parametrize("data, words", MALFORMED_FRAMES,
                         ids=[f"{i}-{words}" for i, (_, words) in enumerate(MALFORMED_FRAMES)])
def test_malformed_frames_raise_protocol_error(data, words):
    with pytest.raises(ProtocolError, match=words):
        wire.decode(data)


def _node_results(indices: list, failed: list, items: list) -> wire.NodeResults:
    return wire.NodeResults("j", pack_indices(indices), pack_indices(failed), pack_items(items), 0,
                            untimed(len(indices)))


@pytest.mark.parametrize(
    "part, words",
    [
        (_node_results([0, 1], [], [[0, True, b"r"]]), "not 2 packed results"),
        (_node_results([0], [], [[0, True, b"r"], [1, True, b"r"]]), "not 1 packed results"),
        (wire.NodeResults("j", pack_indices([0]), b"", b"\xc1", 0, untimed(1)), "not 1 packed results"),
        (_node_results([0, 1], [], [[0, True, b"r"], [1, True]]), "NodeResults items must be arrays of 3"),
        (_node_results([0, 1], [], [[0, True, b"r"], {1: 0, b"r": 0}]), "not 2 packed results.*max_map_len"),
        (_node_results([0, 1], [], [[0, True, b"r"], [1, VALUE, "r" * (MAX_STR_BYTES + 1)]]),
         "not 2 packed results.*max_str_len"),
        (_node_results([0, 1], [], [[0, True, b"r"], [1, True, "r"]]), "payload has type str, expected bytes"),
        (_node_results([0, 1], [], [[0, True, b"r"], [1, True, 7]]), "expected bytes"),
        (_node_results([0, 1], [], [[0, True, b"r"], [1, VALUE, b"r"]]), "value has type bytes"),
        (_node_results([0], [], [[0, 1, b"r"]]), "ok-code is 1"),
        (_node_results([0], [], [[0, None, b"r"]]), "ok-code is None"),
        (_node_results([0], [], [["0", True, b"r"]]), "index has type str"),
        (_node_results([0, 2], [], [[0, True, b"r"], [1, True, b"r"]]), "other results than its indices name"),
        (_node_results([0, 1], [], [[0, True, b"r"], [1, False, b"e"]]), "does not name the failed results"),
        (_node_results([0, 1], [0], [[0, True, b"r"], [1, False, b"e"]]), "does not name the failed results"),
    ],
)
def test_packed_results_are_checked_where_they_are_decoded(part, words):
    """Nodes and a head pass packed results on undecoded; where a head decodes them (to sort out
    repeats and failures), they must be the results their indices and failures name."""
    decoded = wire.decode(part.encode(), wire.NODE_TO_HEAD)
    with pytest.raises(ProtocolError, match=words):
        decoded.part().items("NodeResults")


def test_packed_results_that_would_make_a_head_balloon_are_refused_before_they_do():
    # One result "holding" an array of 20M nils: the array limit refuses it as it is read.
    nested = b"\x93\x00\xc3\xdd" + (20_000_000).to_bytes(4, "big") + b"\xc0" * 20_000_000
    part = wire.NodeResults("j", pack_indices([0]), b"", nested, 0, untimed(1))
    with pytest.raises(ProtocolError, match="not 1 packed results"):
        wire.decode(part.encode(), wire.NODE_TO_HEAD).part().items("NodeResults")
    # Arrays of three arrays, twelve deep (531,441 arrays in 800 KB), each within the array limit:
    # the item budget refuses them before they are built (built, they would take some 60 MB).
    bomb = b"\xc0"
    for _ in range(12):
        bomb = b"\x93" + bomb * 3
    part = wire.NodeResults("j", pack_indices([0]), b"", b"\x93\x00\xc3" + bomb, 0, untimed(1)).part()
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="not 1 packed results"):
            part.items("NodeResults")
        assert tracemalloc.get_traced_memory()[1] < 8 * 1024 * 1024
    finally:
        tracemalloc.stop()
    # More results than a frame carries, whatever they are.
    many = pack_indices(list(range(limits.BATCH_ITEMS + 1)))
    with pytest.raises(ProtocolError, match=f"more than {limits.BATCH_ITEMS} results"):
        wire.decode(msgpack.packb([39, "j", many, b"", b"", 0, b"", b""]), wire.NODE_TO_HEAD)
    with pytest.raises(ProtocolError, match=f"more than {limits.BATCH_ITEMS} results"):
        wire.decode(msgpack.packb([34, "j", many, b"", b"", [], True, 0.0, b"", b"", b"", b""]),
                    worker_wire.WORKER_TO_NODE)


def test_packed_results_list_their_indices_and_failures_and_join():
    items = [[5, True, b"r"], [2, False, b"e"], [9, True, b""]]
    part = wire.decode(wire.NodeResults.of("j", PackedResults.of(items), 4).encode(), wire.NODE_TO_HEAD).part()
    assert unpack_indices(part.indices) == [5, 2, 9] and part.count == 3
    assert unpack_indices(part.failed) == [2]
    assert part.items() == items
    assert PackedResults.of([]).items() == [] and PackedResults.of([]).count == 0
    more = PackedResults.of([[7, False, b"f"]])
    assert PackedResults.join([part, more]).items() == items + [[7, False, b"f"]]
    assert unpack_indices(PackedResults.join([part, more]).failed) == [2, 7]


def test_results_are_framed_by_count_and_bytes():
    big = b"x" * (limits.RESULT_FRAME_BYTES // 2 + 1)
    items = [[i, True, big] for i in range(3)]
    assert [len(frame) for frame in item_frames(items)] == [1, 1, 1]
    alone = [[0, True, b"x" * (limits.RESULT_FRAME_BYTES + 1)]]
    assert item_frames(alone) == [alone]  # one larger result goes alone
    many = [[i, True, b""] for i in range(limits.BATCH_ITEMS * 2 + 1)]
    assert [len(frame) for frame in item_frames(many)] == [limits.BATCH_ITEMS, limits.BATCH_ITEMS, 1]
    assert item_frames([]) == []
    # Packed parts are joined up to a frame's worth, never split.
    parts = [PackedResults.of(frame) for frame in item_frames(many)] * 2
    assert [f.count for f in packed_frames(parts)] == [4096, 4096, 1, 4096, 4096, 1]
    assert [f.count for f in packed_frames([PackedResults.of(items[:1])] * 3)] == [1, 1, 1]
    small = [PackedResults.of([[i, True, b"r"]]) for i in range(5)]
    [joined] = packed_frames(small)
    assert [item[0] for item in joined.items()] == [0, 1, 2, 3, 4]


def test_a_worker_report_is_checked_like_a_nodes_results():
    with pytest.raises(ProtocolError, match="WorkerReport.indices must be packed"):
        wire.decode(msgpack.packb([34, "j", b"\x00", b"", b"", [], True, 0.0, b"", b"", b"", b""]),
                    worker_wire.WORKER_TO_NODE)
    with pytest.raises(ProtocolError, match="more failed results"):
        wire.decode(msgpack.packb([34, "j", b"", pack_indices([1]), b"", [], True, 0.0, b"", b"", b"", b""]),
                    worker_wire.WORKER_TO_NODE)
    # Results sent apart: an index and a size each, and the bytes they add up to.
    with pytest.raises(ProtocolError, match="WorkerReport.direct"):
        wire.decode(msgpack.packb([34, "j", b"", b"", b"", [], True, 0.0, b"", pack_indices([1]), b"", b"x"]),
                    worker_wire.WORKER_TO_NODE)
    with pytest.raises(ProtocolError, match="WorkerReport.direct"):
        wire.decode(msgpack.packb([34, "j", b"", b"", b"", [], True, 0.0, b"", pack_indices([1]), pack_indices([5]),
                                   b"x"]), worker_wire.WORKER_TO_NODE)


def test_results_from_a_node_are_node_results():
    """A node's results carry its credit; a client-side ResultBatch is refused from a node."""
    batch = wire.ResultBatch("j", 0, [[0, True, b"r"]])
    with pytest.raises(ProtocolError, match="not accepted on this channel"):
        wire.decode(batch.encode(), wire.NODE_TO_HEAD)
    results = wire.NodeResults.of("j", PackedResults.of([[0, True, b"r"]]), 3)
    assert wire.decode(results.encode(), wire.NODE_TO_HEAD).credit == 3


def test_channels_refuse_messages_of_other_channels():
    with pytest.raises(ProtocolError, match="not accepted on this channel"):
        register = wire.RegisterNode("n", "u", 1, 1, 1.0, None, 0, None, "r", "3.11", "0", "b", b"", [])
        wire.decode(register.encode(), wire.CLIENT_TO_HEAD)


@pytest.mark.parametrize("count", [0, 1, 15, 16, 70_000])
def test_results_packed_in_parts_make_the_frame_a_result_batch_would(count):
    items = [[i, i % 3 != 0, bytes(i % 50)] for i in range(count)]
    cut = count // 3
    parts = [pack_items(items[:cut]), pack_items(items[cut:])]
    frame = b"".join(wire.result_batch_parts("job-7", 9, count, parts))
    assert frame == wire.ResultBatch("job-7", 9, items).encode()
    assert wire.decode(frame, wire.HEAD_TO_CLIENT).items == items


def test_output_indices_and_streams_are_bounded():
    # Fails on the previous code: a node's output index past 64 bits reached history, whose every
    # write failed after it; any other stream than stdout or stderr is refused too.
    for items, words in (([[2**64 - 1, wire.STDOUT, "x"]], "input index"), ([[0, 3, "x"]], "stream"),
                         ([[-2, wire.STDERR, "x"]], "input index")):
        with pytest.raises(ProtocolError, match=words):
            wire.decode(msgpack.packb([wire.OutputBatch.TAG, "j", items]), wire.NODE_TO_HEAD)
    with pytest.raises(ProtocolError, match="input index"):
        wire.decode(wire.OutputBatch("j", [[limits.MAX_INPUTS, wire.STDOUT, "x"]]).encode(), wire.NODE_TO_HEAD)
    ok = wire.OutputBatch("j", [[-1, wire.STDERR, "installing"], [7, wire.STDOUT, "hi"]])
    assert wire.decode(ok.encode(), wire.NODE_TO_HEAD) == ok


def test_a_nodes_counts_are_bounded_far_above_any_job():
    def state(count: int) -> bytes:
        return wire.NodeState("n", "RUNNING", 1, [["j", 1, 0, count]], 1.0, 1.0, 0.0, 0.0).encode()

    assert wire.decode(state(2 * limits.MAX_INPUTS), wire.NODE_TO_HEAD).jobs[0][3] == 2 * limits.MAX_INPUTS
    assert wire.decode(state(2**40), wire.NODE_TO_HEAD).jobs[0][3] == 2**40
    with pytest.raises(ProtocolError, match="counts must be from 0"):
        wire.decode(state(2**40 + 1), wire.NODE_TO_HEAD)


def test_boot_stages_in_progress_are_bounded_and_shown_furthest_first():
    from burla.client.progress import booting_stages

    with pytest.raises(ProtocolError, match="Progress.stages"):
        wire.decode(wire.Progress("j", 0, 0, 0, 0, 1, {"installing": -1}).encode(), wire.HEAD_TO_CLIENT)
    with pytest.raises(ProtocolError, match="Progress.stages"):
        wire.decode(wire.Progress("j", 0, 0, 0, 0, 1, {"x" * 21: 1}).encode(), wire.HEAD_TO_CLIENT)
    assert booting_stages({"ssh": 1, "installing": 2, "requested": 3}) == " (2 installing, 1 ssh, 3 requested)"
    assert booting_stages({}) == ""


def test_an_error_record_an_earlier_build_kept_is_still_read():
    # History keeps detached jobs' results across upgrades: a record without the fields added
    # since (where it failed, how many tries) reads with their defaults.
    record = wire.ErrorRecord("ValueError", "builtins", "bad", "tb", None, None, "n1", "h", 7, 3)
    full = msgpack.unpackb(record.encode())
    older = wire.read_error(msgpack.packb(full[:-4]))
    assert (older.message, older.node_id, older.worker_pid, older.attempts) == ("bad", "", 0, 1)
    for bad in (b"\x95\x01", msgpack.packb(full[:-5]), msgpack.packb([wire.ErrorRecord.TAG, 1, 2, 3, 4, 5, 6])):
        with pytest.raises(ProtocolError):
            wire.read_error(bad)

def _bulk(header: list, *payloads: bytes) -> bytes:
    packed = msgpack.packb(header)
    return b"\xc1" + len(packed).to_bytes(4, "little") + packed + b"".join(payloads)


@pytest.mark.parametrize(
    "data,words",
    [
        (b"\xc1\x00", "shorter than its header's length"),
        (b"\xc1\xff\x00\x00\x00\x90", "shorter than its header"),
        (_bulk([4, "j", pack_indices([0]), pack_indices([3]), 4], b"abc"), "shorter than InputBatch.data's length"),
        (_bulk([4, "j", pack_indices([0]), pack_indices([3]), 3], b"abcd"), "1 bytes past its fields"),
        (_bulk([4, "j", pack_indices([0]), pack_indices([3]), -3], b"abc"), "must be a length"),
        (_bulk([4, "j", pack_indices([0]), pack_indices([3]), b"abc"]), "must be a length"),
        (_bulk([4, "j", pack_indices([0]), pack_indices([2]), 3], b"abc"), "not as long as its sizes"),
        (_bulk([5, "j", 3], b"abc"), "Credit has no bulk fields"),
        (_bulk([4, "j", b"", b""]), "needs 4 fields, got 3"),
    ],
)
def test_malformed_bulk_frames_raise_protocol_error(data, words):
    with pytest.raises(ProtocolError, match=words):
        wire.decode(data)


def test_bulk_frames_carry_payloads_as_views_of_the_frame():
    # Payloads of BULK_MIN_BYTES or more travel after the header, written and read as they are.
    big = bytes(range(256)) * 1024
    msg = wire.InputBatch.of("j", PackedInputs.of([[0, big], [1, b"small"]]))
    parts = msg.encode_parts()
    assert parts[0][:1] == framing.BULK_MARK and parts[1] is msg.data and len(parts) == 2
    frame = msg.encode()
    decoded = wire.decode(frame, wire.CLIENT_TO_HEAD)
    assert decoded == msg
    assert type(decoded.data) is memoryview and decoded.data.obj is frame  # no copy of the payload
    assert decoded.part().arguments() == [big, b"small"]
    # Under the threshold, a plain msgpack frame, as before.
    small = wire.InputBatch.of("j", PackedInputs.of([[0, b"x" * (framing.BULK_MIN_BYTES - 1)]]))
    assert len(small.encode_parts()) == 1 and small.encode()[:1] != framing.BULK_MARK
    assert wire.decode(small.encode()) == small
    # A payload past the channel's bin limit is refused as a plain frame's would be.
    tight = framing.Channel("tight", (wire.InputBatch,), framing.Limits(100, 100, 100, len(big), 1000))
    with pytest.raises(ProtocolError, match="must be a length within"):
        wire.decode(wire.InputBatch.of("j", PackedInputs.of([[0, big + b"x"]])).encode(), tight)


def test_bulk_results_pass_through_a_head_unchanged():
    payload = b"r" * (framing.BULK_MIN_BYTES * 2)
    msg = _node_results([0, 1], [], [[0, True, payload], [1, True, b"s"]])
    decoded = wire.decode(msg.encode(), wire.NODE_TO_HEAD)
    assert type(decoded.packed) is memoryview
    assert decoded.part().items("NodeResults") == [[0, True, payload], [1, True, b"s"]]
    frame = b"".join(wire.result_batch_parts("j", 1, 2, [decoded.packed]))
    assert wire.decode(frame).items == [[0, True, payload], [1, True, b"s"]]



@pytest.mark.parametrize("sizes", [[70_000], [100, 70_000, 0], [300 * i for i in range(300)],
                                   [2**16, 2**16 - 1, 255, 256]])
def test_large_results_pack_as_packb_would(sizes):
    items = [[index * 1_000_003, index % 3 != 1, bytes([index % 256]) * size] for index, size in enumerate(sizes)]
    assert pack_items(items) == msgpack.packb(items, use_bin_type=True)[array_header_bytes(len(items)):]


def test_large_results_reach_a_client_as_views_of_their_frame():
    items = [[0, True, b"x" * 70_000], [5, False, b"e" * 20_000], [2**33, True, b""], [7, True, b"y" * 300]]
    frame = b"".join(wire.result_batch_parts("job-1", 2**40, len(items), [pack_items(items)]))
    msg = wire.decode(frame, wire.HEAD_TO_CLIENT)
    assert msg == wire.ResultBatch("job-1", 2**40, items) == msgpack_decoded(frame)
    assert all(type(payload) is memoryview and payload.obj is frame for _, _, payload in msg.items)
    # Small results: msgpack's decoding, as before.
    small = b"".join(wire.result_batch_parts("j", 1, 100, [pack_items([[i, True, b"s" * 700] for i in range(100)])]))
    assert all(type(payload) is bytes for _, _, payload in wire.decode(small).items)
    # Not accepted on a channel that does not carry it.
    with pytest.raises(ProtocolError, match="ResultBatch is not accepted"):
        wire.decode(frame, wire.CLIENT_TO_HEAD)


def test_large_results_beside_inline_values_still_reach_a_client_as_views():
    items = [[0, True, b"x" * 90_000], [1, VALUE, None], [2, VALUE, 2**64 - 1], [3, VALUE, "é" * 256],
             [4, VALUE, -1.5], [5, VALUE, False], [6, True, b"y" * 40_000]]
    frame = b"".join(wire.result_batch_parts("job-1", 1, len(items), [pack_items(items)]))
    msg = wire.decode(frame, wire.HEAD_TO_CLIENT)
    assert msg == wire.ResultBatch("job-1", 1, items) == msgpack_decoded(frame)
    assert [type(payload) for _, _, payload in msg.items] == [memoryview, type(None), int, str, float, bool, memoryview]


@pytest.mark.parametrize("value", [[1], {"a": 1}, b"bin", "s" * (MAX_STR_BYTES + 1), "s" * (MAX_STR_CHARS + 1)])
def test_large_result_frames_with_a_value_that_is_not_inline_are_refused(value):
    items = [[0, True, b"x" * 90_000], [1, VALUE, value]]
    frame = b"".join(wire.result_batch_parts("job-1", 1, len(items), [msgpack.packb(items, use_bin_type=True)[1:]]))
    with pytest.raises(ProtocolError):
        wire.decode(frame, wire.HEAD_TO_CLIENT)


@pytest.mark.parametrize("damage,words", [
    (lambda f: f[:-1], "not valid msgpack"),
    (lambda f: f + b"\x00", "not valid msgpack"),
    (lambda f: f.replace(b"\x93\x00\xc3", b"\x93\x00\xc0", 1), "ok-code is None"),
    (lambda f: f.replace(b"\x93\x00\xc3", b"\x92\x00\xc3", 1), "not valid msgpack"),
])
def test_damaged_large_result_frames_are_refused_as_before(damage, words):
    frame = b"".join(wire.result_batch_parts("job-1", 3, 2, [pack_items([[0, True, b"x" * 70_000], [1, True, b"y"]])]))
    with pytest.raises(ProtocolError, match=words):
        wire.decode(damage(frame), wire.HEAD_TO_CLIENT)


def msgpack_decoded(frame: bytes) -> wire.ResultBatch:
    tag, *fields = msgpack.unpackb(frame)
    assert tag == wire.ResultBatch.TAG
    return wire.ResultBatch(*fields)
