"""How inputs go to a node in a push: framed (`frames`) and never fewer than is worth a frame
(`least_push`)."""

from __future__ import annotations

from burla.head.records import Assignment
from burla.protocol.framing import Payload
from burla.protocol.limits import BATCH_ITEMS
from burla.protocol.packed_inputs import PackedInputs

MAX_PUSH_BYTES = 4 * 1024 * 1024  # inputs per InputBatch frame to a node, unless one is bigger


def frames(indices: list[int], data: list[Payload]) -> list[PackedInputs]:
    """Inputs pushed to a node, packed in frames of at most BATCH_ITEMS inputs and about
    MAX_PUSH_BYTES (a frame ends with the input that reaches it). An input of MAX_PUSH_BYTES or
    more goes in a frame of its own: the node hands it to a worker, or a thief, as it came,
    without copying it out of a frame that other inputs keep alive."""
    if len(indices) <= BATCH_ITEMS and sum(map(len, data)) < MAX_PUSH_BYTES:
        return [PackedInputs.of_lists(indices, data)] if indices else []
    frames: list[PackedInputs] = []
    start = size = 0
    for position, item in enumerate(data):
        if len(item) >= MAX_PUSH_BYTES and position > start:
            frames.append(PackedInputs.of_lists(indices[start:position], data[start:position]))
            start, size = position, 0
        size += len(item)
        if size >= MAX_PUSH_BYTES or position + 1 - start >= BATCH_ITEMS:
            frames.append(PackedInputs.of_lists(indices[start:position + 1], data[start:position + 1]))
            start, size = position + 1, 0
    if start < len(indices):
        frames.append(PackedInputs.of_lists(indices[start:], data[start:]))
    return frames


def least_push(assignment: Assignment) -> int:
    """The fewest inputs worth a push to a node: its workers' worth, or a quarter of its credit if
    that is more (up to a frame's worth). A node asks for about 0.1 s of calls ahead, in chunks of
    at least a quarter of that (burla.node.dispatcher.NodeJob.credit_due), so a large credit means
    short calls: there, pushes of a few inputs each would cost a frame per handful of calls on
    both sides."""
    return max(assignment.slots, min(assignment.credit // 4, BATCH_ITEMS))
