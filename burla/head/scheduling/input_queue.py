"""A job's inputs waiting on the head for a node, kept packed as the client sent them.

An upload batch of the client is queued as the run it came in (`PackedInputs`: its indices,
sizes and arguments end to end), and a push to a node is a slice of it: a few byte-string
slices per frame, nothing per input. Taking each run apart into an object per input had cost
the head a slice, a list slot and a join again per input, most of its work per no-op call.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from burla.protocol.framing import Payload
from burla.protocol.limits import BATCH_ITEMS
from burla.protocol.values.packed_inputs import InputRuns, PackedInputs

MAX_PUSH_BYTES = 4 * 1024 * 1024  # inputs per InputBatch frame to a node, unless one is bigger


class InputQueue:
    __slots__ = ("_runs",)

    def __init__(self) -> None:
        # Not compacted: a run's inputs taken stay in flight, holding what they were cut from anyway.
        self._runs = InputRuns(compact=False)

    def __len__(self) -> int:
        return len(self._runs)

    def bytes_held(self) -> int:
        return self._runs.bytes_held()

    def __iter__(self) -> Iterator[tuple[int, Payload]]:
        return iter(self._runs.items())

    def append(self, part: PackedInputs) -> None:
        """Queue a run of inputs at the back."""
        self._runs.append(part)

    def prepend(self, part: PackedInputs) -> None:
        """Queue a run at the front (inputs coming back from a lost node, or to be tried again)."""
        self._runs.prepend(part)

    def take(self, count: int) -> list[PackedInputs]:
        """Up to `count` inputs from the front, as the frames they go to a node in: at most
        BATCH_ITEMS inputs and MAX_PUSH_BYTES of arguments each. An input of MAX_PUSH_BYTES or
        more goes in a frame of its own: the node hands it to a worker, or a thief, as it came,
        without copying it out of a frame that other inputs keep alive."""
        frames = []
        runs = self._runs
        while count > 0 and runs:
            frame = runs.take(min(count, BATCH_ITEMS), MAX_PUSH_BYTES)
            count -= frame.count
            frames.append(frame)
        return frames

    def keep(self, pairs: Iterable[tuple[int, Payload]]) -> None:
        """Replace the contents with `pairs` (a filtered iteration over this queue)."""
        kept = list(pairs)
        self.clear()
        if kept:
            self.append(PackedInputs.of(kept))

    def clear(self) -> None:
        self._runs.clear()
