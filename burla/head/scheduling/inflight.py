"""Which of a job's inputs are in flight on which of its nodes (sent, result not in yet), and where
each one's bytes are, should its node be lost.

Every input of a job has a holder number in one array (`Holders`): 0 while it is queued on the
head, done or not uploaded yet, else the number of the node's share (`InFlight`) it went to. A
share keeps the frames it was sent, in push order. Pushing a run of inputs and marking a run of
results done are then a few array operations at C speed whatever the run's length, where a dict
entry per input in flight had cost the head a fifth of its time per no-op call. The frames are
looked into only on the rare paths: a failed call tried again, a steal, a node lost, or a node
back after a head restart.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from itertools import repeat

from burla.protocol.values.packed_inputs import PackedInputs, run_first, unpack_uints

_NONE = array("I", [0])
_PRUNE_FLOOR = 64  # frames a share keeps before it looks through them all for those it can drop


class Holders:
    """Per input of one job, the number of the share holding it in flight (0: none)."""

    __slots__ = ("numbers", "_shares", "_next")

    def __init__(self) -> None:
        self.numbers = array("I")
        self._shares: dict[int, InFlight] = {}
        self._next = 1

    def cover(self, end: int) -> None:
        """Make room for inputs up to `end - 1` (none of them held)."""
        have = len(self.numbers)
        if end > have:
            self.numbers.frombytes(bytes(self.numbers.itemsize * (end - have)))

    def new_share(self) -> InFlight:
        """What a node newly given the job holds: nothing yet."""
        share = InFlight(self, self._next)
        self._shares[self._next] = share
        self._next += 1
        return share

    def holder(self, index: int) -> int:
        numbers = self.numbers
        return numbers[index] if 0 <= index < len(numbers) else 0

    def set(self, index: int, number: int) -> None:
        """Input `index` is in flight on share `number` now (0: on none)."""
        if index < 0:
            raise ValueError(f"input index {index} is negative")
        numbers = self.numbers
        if index >= len(numbers):
            self.cover(index + 1)
        before = numbers[index]
        if before == number:
            return
        if before:
            self._shares[before].count -= 1
        if number:
            self._shares[number].count += 1
        numbers[index] = number

    def clear(self) -> None:
        """The job ended: nothing of it is in flight any more."""
        self.numbers = array("I")
        for share in self._shares.values():
            share.forget()
        self._shares.clear()

    def _drop(self, number: int) -> None:
        self._shares.pop(number, None)


class InFlight:
    """The inputs of one job in flight on one node, and the frames they went in."""

    __slots__ = ("_holders", "number", "count", "_sent", "_sequence", "_indexed", "_lookup", "_prune_at")

    def __init__(self, holders: Holders, number: int) -> None:
        self._holders = holders
        self.number = number
        self.count = 0
        # (sequence, first, end, frame): inputs first..end-1 went in `frame`; first -1: all the
        # frame's inputs, which are not one run. The oldest go once none of their inputs is held
        # (`_forget_front`), any other once none is held here (`_prune`).
        self._sent: deque[tuple[int, int, int, PackedInputs]] = deque()
        self._sequence = 0  # entries made so far
        self._indexed = 0  # `_lookup` covers the entries made before this one
        # Input index -> a frame with its bytes (rare paths), built as they ask; emptied whenever
        # frames go, so it names none that went.
        self._lookup: dict[int, PackedInputs] = {}
        self._prune_at = _PRUNE_FLOOR

    def __len__(self) -> int:
        return self.count

    def __contains__(self, index: object) -> bool:
        return type(index) is int and self._holders.holder(index) == self.number

    def __iter__(self) -> Iterator[int]:
        return iter(self.held())

    def add_run(self, frame: PackedInputs) -> None:
        """A frame pushed to the node: each of its inputs is in flight here."""
        numbers = self._holders.numbers
        first = run_first(frame.indices)
        count = frame.count
        end = first + count
        if 0 <= first and end <= len(numbers) and numbers[first:end] == _NONE * count:
            numbers[first:end] = array("I", [self.number]) * count  # the common case: at C speed
            self.count += count
        else:
            first = end = -1
            for index in unpack_uints(frame.indices):
                self._holders.set(index, self.number)
        self._remember(first, end, frame)

    def add(self, index: int, frame: PackedInputs) -> None:
        """One input in flight here now (stolen from a peer, or kept across a head restart),
        its bytes in `frame`."""
        self._holders.set(index, self.number)
        self._remember(index, index + 1, frame)

    def holds(self, first: int, end: int) -> bool:
        """Whether inputs first..end-1 are all in flight here."""
        numbers = self._holders.numbers
        return 0 <= first < end <= len(numbers) and numbers[first:end] == array("I", [self.number]) * (end - first)

    def release(self, spans: list[tuple[int, int]]) -> None:
        """Results of these runs of inputs ([first, end), each `holds`) came: none of them is in
        flight any more."""
        numbers = self._holders.numbers
        for first, end in spans:
            numbers[first:end] = _NONE * (end - first)  # at C speed
            self.count -= end - first
        self._forget_front()

    def release_each(self, indices: list[int]) -> bool:
        """Results of these inputs came (not runs; no index twice among them): if every one was
        in flight here, none is any more (True); else nothing changes (False)."""
        numbers = self._holders.numbers
        if not indices or min(indices) < 0 or max(indices) >= len(numbers):
            return False
        if not all(map(self.number.__eq__, map(numbers.__getitem__, indices))):  # at C speed
            return False
        deque(map(numbers.__setitem__, indices, repeat(0)), maxlen=0)
        self.count -= len(indices)
        self._forget_front()
        return True

    def take(self, index: int) -> PackedInputs | None:
        """Input `index` is in flight here no more (tried again, stolen): the frame with its bytes,
        or None if it was not in flight here."""
        if index not in self:
            return None
        frame = self._frame_of(index)
        self._holders.set(index, 0)
        return frame

    def held(self) -> dict[int, PackedInputs]:
        """Each input in flight here, with a frame that has its bytes, in the order they were sent."""
        numbers, number = self._holders.numbers, self.number
        size = len(numbers)
        found: dict[int, PackedInputs] = {}
        for _, first, end, frame in self._sent:
            for index in range(first, end) if first >= 0 else unpack_uints(frame.indices):
                if index < size and numbers[index] == number and index not in found:
                    found[index] = frame
        return found

    def items(self) -> list[tuple[int, PackedInputs]]:
        return list(self.held().items())

    def close(self) -> dict[int, PackedInputs]:
        """The node is gone: what was in flight on it (as `held`), in flight nowhere now."""
        held = self.held()
        numbers = self._holders.numbers
        deque(map(numbers.__setitem__, held, repeat(0)), maxlen=0)
        self._holders._drop(self.number)
        self.forget()
        return held

    def forget(self) -> None:
        """Keep nothing (the job ended, or the node is gone)."""
        self.count = 0
        self._sent.clear()
        self._lookup.clear()
        self._indexed = self._sequence

    def _remember(self, first: int, end: int, frame: PackedInputs) -> None:
        self._sent.append((self._sequence, first, end, frame))
        self._sequence += 1
        if len(self._sent) > self._prune_at:
            self._prune()

    def _forget_front(self) -> None:
        """Drop the oldest entries none of whose inputs are held any more: results mostly come in
        the order inputs went, so this keeps the entries near what is in flight."""
        sent, numbers = self._sent, self._holders.numbers
        dropped = False
        while sent:
            _, first, end, _ = sent[0]
            if first < 0 or numbers[first:end] != _NONE * (end - first):
                break
            sent.popleft()
            dropped = True
        if dropped and self._lookup:  # a rare path asks again: what is in flight is indexed anew
            self._lookup.clear()
            self._indexed = sent[0][0] if sent else self._sequence

    def _prune(self) -> None:
        """Drop every entry none of whose inputs is held here any more. Called when the entries
        have doubled since the last time, so each entry is looked at a bounded number of times."""
        numbers, number = self._holders.numbers, self.number
        kept: deque[tuple[int, int, int, PackedInputs]] = deque()
        for entry in self._sent:
            _, first, end, frame = entry
            if first >= 0:
                holds = number in numbers[first:end]
            else:
                holds = any(map(number.__eq__, map(self._holders.holder, unpack_uints(frame.indices))))
            if holds:
                kept.append(entry)
        self._sent = kept
        self._lookup.clear()  # it may name frames just dropped
        self._indexed = kept[0][0] if kept else self._sequence
        self._prune_at = 2 * len(kept) + _PRUNE_FLOOR

    def _frame_of(self, index: int) -> PackedInputs | None:
        """A frame with input `index`'s bytes, indexing the entries made since the last call."""
        lookup = self._lookup
        frame = lookup.get(index)
        if frame is None and self._indexed < self._sequence:
            new = []
            for entry in reversed(self._sent):
                if entry[0] < self._indexed:
                    break
                new.append(entry)
            for _, first, end, sent in reversed(new):
                lookup.update(zip(range(first, end) if first >= 0 else unpack_uints(sent.indices), repeat(sent)))
            self._indexed = self._sequence
            frame = lookup.get(index)
        return frame
