"""How many inputs go to a node in a push: never fewer than is worth a frame (`least_push`); the
frames are cut by `InputQueue.take`."""

from __future__ import annotations

from burla.head.scheduling.records import Assignment
from burla.protocol.limits import BATCH_ITEMS


def least_push(assignment: Assignment) -> int:
    """The fewest inputs worth a push to a node: its workers' worth, or a quarter of its credit if
    that is more (up to a frame's worth). A node asks for about 0.1 s of calls ahead, in chunks of
    at least a quarter of that (burla.node.dispatcher.NodeJob.credit_due), so a large credit means
    short calls: there, pushes of a few inputs each would cost a frame per handful of calls on
    both sides."""
    return max(assignment.slots, min(assignment.credit // 4, BATCH_ITEMS))
