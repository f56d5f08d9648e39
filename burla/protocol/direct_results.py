"""Large results sent straight from the node that made them to the client, past the head
(DESIGN.md §3, "large results straight to their client").

Where a job allows it (`OpenJob.direct_results`: not detached, whose results the head keeps),
a head that passes a node's results of DIRECT_MIN_BYTES or more on to the client offers the
client that node (`DirectOffer`: its address and a grant signed with its key, where the client
can reach it, as for direct inputs). The client opens its connection to the node (or already
has one, for the job's large inputs), and the node tells its workers so (`RunCalls.direct_results`).
A worker then reports each successful result of DIRECT_MIN_BYTES or more apart
(`WorkerReport.direct`), with a placeholder (burla.protocol.direct_inputs') in its place among
the others. The node sends those results to the client (`DirectResults`), and only once the
client's receipt came does it report the worker's results to the head, placeholders and all:
a head that has a result's record has a client that holds its bytes, so a node lost before the
receipt loses no result (the head runs its input again, as any input in flight there). The client
unpickles each as it comes, and puts the value in its placeholder's place as it takes the head's
results. Where the connection
fails, the node sends what is still unreceipted through the head, each placeholder replaced by
its bytes (`restored`). Failures (error records) always go through the head, which lists them.
"""

from __future__ import annotations

from typing import Any

from burla.errors import ProtocolError
from burla.protocol.direct_inputs import DIRECT_MIN_BYTES, is_placeholder, placeholder
from burla.protocol.framing import Payload
from burla.protocol.values.packed_inputs import PackedInputs, pack_uints
from burla.protocol.values.packed_results import PackedResults
from burla.protocol.values.pickle_parts import PickleParts
from burla.protocol.values.serialization import loads


def split_large(results: list) -> tuple[list, PackedInputs | None]:
    """A worker's results ([[index, ok, payload], ...]) with each successful pickle of
    DIRECT_MIN_BYTES or more (bytes, or PickleParts) replaced by a placeholder, and those pickles
    (None: there is none). The pickles are not copied: they go to the node as parts of the
    report's frame."""
    direct: list[tuple[int, bytes]] = []
    kept = results
    for position, (index, ok, payload) in enumerate(results):
        if ok is True and len(payload) >= DIRECT_MIN_BYTES:
            if kept is results:
                kept = list(results)
            kept[position] = [index, True, placeholder(len(payload))]
            direct.append((index, payload))
    if not direct:
        return results, None
    indices = [index for index, _ in direct]
    payloads = [payload for _, payload in direct]
    # A pickle made in parts (a worker's large buffers as they are) goes as its parts.
    parts = [part for payload in payloads for part in (payload.parts if type(payload) is PickleParts else (payload,))]
    return kept, PackedInputs(pack_uints(indices), pack_uints(list(map(len, payloads))),
                              PickleParts(parts))  # type: ignore[arg-type]


def restored(part: PackedResults, direct: PackedInputs) -> PackedResults:
    """A worker's report as it would have been without the split: each placeholder replaced by the
    result it stands for (for the head's path, where the client's connection failed)."""
    payloads = dict(direct.items())
    items = part.items("WorkerReport")
    for item in items:
        if item[1] is True and is_placeholder(item[2]):
            item[2] = bytes(payloads.pop(item[0]))
    if payloads:
        raise ProtocolError("a worker's report sent results apart that its placeholders do not name")
    failed = bool(part.failed)
    return PackedResults.of_calls(items, part.timings, part.indices, failed, None)


class NotUnpickled:
    """What came straight for a result that does not unpickle here: the error, for its place."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def arrived_value(data: Payload) -> Any:
    """A result that came straight, unpickled as it comes: the frame it came in goes back to its
    connection for the next one (a frame kept until the head's record came was a new buffer, and
    its page faults, per result)."""
    try:
        return loads(data)
    except Exception as e:
        return NotUnpickled(e)


def value_of(index: int, payload: Payload, arrived: dict[int, Any]) -> Any:
    """The value a client takes for a pickled result: the one that came straight from its node if
    `payload` is a placeholder (no longer kept in `arrived` then), else `payload` unpickled."""
    if not is_placeholder(payload):
        return loads(payload)
    try:
        value = arrived.pop(index)
    except KeyError:
        raise ProtocolError(f"the result of input {index} was sent straight to this client, which did not get "
                            "it") from None
    if type(value) is NotUnpickled:
        raise value.error
    return value
