"""Inputs packed as they travel: from the client to the head, the head to a node, the node to
a worker.

A run of inputs is three byte strings: their indices (4 bytes each), the sizes of their pickled
arguments (4 bytes each) and those arguments end to end. The head takes a run apart into lists
at C speed; a node queues what the head pushes as it came and cuts its workers' batches out of
it by slicing, where a list per input cost it a decode, a check, a queue operation and an encode
per input (most of a node's work per no-op call). Only a worker takes the arguments apart, one
slice per call.
"""

from __future__ import annotations

import struct
import sys
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from operator import itemgetter
from typing import TypeVar

from burla.errors import ProtocolError
from burla.protocol.framing import Message
from burla.protocol.limits import BATCH_ITEMS
from burla.protocol.values.pickle_parts import PickleParts

_UINT = struct.Struct("<I")  # an input index (below MAX_INPUTS < 2**32), or a pickle's size (at most 200 MB)
UINT_BYTES = _UINT.size
# What a worker's batch carries at most (more only for a single larger input): a frame to a worker
# has limits, and a worker holds its batch's arguments while it runs them.
MAX_RUN_BYTES = 8 * 1024 * 1024
_index_of = itemgetter(0)
_data_of = itemgetter(1)


def pack_uints(values: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def unpack_uints(packed: bytes | memoryview) -> tuple[int, ...]:
    return struct.unpack(f"<{len(packed) // _UINT.size}I", packed)


def _run_keys(count: int) -> tuple[int, int]:
    """What `run_first` compares with for runs of `count` indices: sum(2**(32k)) and
    sum(k * 2**(32k)) over k < count."""
    return int.from_bytes(_UINT.pack(1) * count, "little"), int.from_bytes(pack_uints(range(count)), "little")


_KEYED = BATCH_ITEMS  # a frame's most: runs up to this long cut these keys to their length
_KEYS = _run_keys(_KEYED)


def _keys(count: int) -> tuple[int, int]:
    if count > _KEYED:
        return _run_keys(count)
    mask = (1 << (32 * count)) - 1
    return _KEYS[0] & mask, _KEYS[1] & mask


def run_first(packed: bytes | memoryview) -> int:
    """The first index if these packed indices are a run (first, first + 1, first + 2, ... in
    order), else -1. At C speed, with no object per index: read as one little-endian integer, the
    run of n indices from `first` is first * sum(2**(32k)) + sum(k * 2**(32k)), so a conversion,
    a product and a comparison tell. (Words can't carry: a run past 2**32 - 1 needs more bytes.)"""
    count = len(packed) // _UINT.size
    if not count or len(packed) % _UINT.size:
        return -1
    ones, steps = _keys(count)
    first: int = _UINT.unpack_from(packed)[0]
    return first if int.from_bytes(packed, "little") == first * ones + steps else -1


class PackedInputs:
    """A run of inputs: `indices`, `sizes` and `data` as the module docstring says."""

    __slots__ = ("indices", "sizes", "data")

    def __init__(self, indices: bytes, sizes: bytes, data: bytes | memoryview) -> None:
        self.indices = indices
        self.sizes = sizes
        self.data = data

    @classmethod
    def of(cls, items: Sequence[Sequence]) -> PackedInputs:
        """From [[input_index, pickled_args], ...]."""
        return cls.of_lists(list(map(_index_of, items)), list(map(_data_of, items)))

    @classmethod
    def of_lists(cls, indices: Sequence[int], data: Sequence[bytes | memoryview | PickleParts]) -> PackedInputs:
        return cls.of_segments(pack_uints(indices), pack_uints(list(map(len, data))), data)

    @classmethod
    def of_segments(cls, indices: bytes, sizes: bytes,
                    segments: Sequence[bytes | memoryview | PickleParts]) -> PackedInputs:
        """From packed indices and sizes, and the arguments in segments (an input's, or a run's end
        to end). One segment goes as it is: a view of the frame it came in is not copied, nor the
        parts of a client's input pickled in parts (they are sent one after another)."""
        if len(segments) == 1:
            joined = segments[0]
        else:
            joined = b"".join([part for s in segments for part in (s.parts if isinstance(s, PickleParts) else (s,))])
        return cls(indices, sizes, joined)  # type: ignore[arg-type]

    @property
    def count(self) -> int:
        return len(self.indices) // _UINT.size

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[int, bytes | memoryview]]:
        return iter(self.items())

    def index_list(self) -> list[int]:
        return list(unpack_uints(self.indices))

    def arguments(self) -> list[bytes | memoryview]:
        """Each input's pickled arguments, in order (sliced at C speed)."""
        ends = list(accumulate(unpack_uints(self.sizes)))
        data = self.data
        return list(map(data.__getitem__, map(slice, [0, *ends[:-1]], ends)))

    def items(self) -> list[tuple[int, bytes | memoryview]]:
        """[(input_index, pickled_args), ...]: for the rare paths (a lost worker, a steal)."""
        return list(zip(unpack_uints(self.indices), self.arguments()))

    def check(self, name: str, max_count: int) -> None:
        """Raise ProtocolError unless the three parts agree (at most `max_count` inputs)."""
        if len(self.indices) % _UINT.size or len(self.sizes) != len(self.indices):
            raise ProtocolError(f"{name} must list a 4-byte index and a 4-byte size per input")
        if self.count > max_count:
            raise ProtocolError(f"{name} carries more than {max_count} inputs")
        if sum(unpack_uints(self.sizes)) != len(self.data):
            raise ProtocolError(f"{name}.data is not as long as its sizes add up to")


class InputRuns:
    """Packed runs of one job's inputs queued on a node, taken from the front in slices (a
    worker's batch) or from the back (what a peer steals). Only a run's indices and sizes are
    unpacked, once, when it is queued; its arguments stay as they came until a slice of them
    goes to a worker."""

    __slots__ = ("_runs", "_count", "_compact")

    def __init__(self, compact: bool = True) -> None:
        self._runs: list[_Run] = []  # few: one per push from the head, in order
        self._count = 0
        # Whether a run mostly taken copies out its rest (see _Run). Not where what was taken
        # stays alive anyway, holding its frame: on the head, until each input's result is in.
        self._compact = compact

    def __len__(self) -> int:
        return self._count

    def bytes_held(self) -> int:
        """The bytes of the runs it keeps (a run partly taken is kept whole until compacted)."""
        return sum(len(run.part.data) for run in self._runs)

    def append(self, part: PackedInputs) -> None:
        if part.count:
            self._runs.append(_Run(part))
            self._count += part.count

    def prepend(self, part: PackedInputs) -> None:
        """Inputs that go first (back from a lost worker or a thief that never took them)."""
        if part.count:
            self._runs.insert(0, _Run(part))
            self._count += part.count

    def take(self, count: int, max_bytes: int = MAX_RUN_BYTES) -> PackedInputs:
        """Up to `count` inputs from the front, no more of them than `max_bytes` of arguments hold
        (but always one, however big)."""
        return self._take(count, max_bytes, from_back=False)

    def take_last(self, count: int, max_bytes: int = MAX_RUN_BYTES) -> PackedInputs:
        """Up to `count` inputs from the back, in their order, within `max_bytes` as `take`."""
        return self._take(count, max_bytes, from_back=True)

    def _take(self, count: int, max_bytes: int, from_back: bool) -> PackedInputs:
        end = -1 if from_back else 0
        parts: list[PackedInputs] = []
        while count > 0 and self._runs:
            run = self._runs[end]
            part = run.take(count, max_bytes, at_least_one=not parts, from_back=from_back, compact=self._compact)
            if not part.count:
                break  # the next input would not fit
            count -= part.count
            max_bytes -= len(part.data)
            self._count -= part.count
            parts.append(part)
            if not run.left:
                del self._runs[end]
        if from_back:
            parts.reverse()
        return join(parts)

    def index_list(self) -> list[int]:
        return [index for run in self._runs for index in unpack_uints(run.part.indices[
            UINT_BYTES * run.start:UINT_BYTES * run.end])]

    def items(self) -> list[tuple[int, bytes | memoryview]]:
        """[(input_index, pickled_args), ...] of what is queued, in order: for the rare paths."""
        return [item for run in self._runs for item in run.remaining().items()]

    def take_all(self) -> PackedInputs:
        return self.take(self._count, max_bytes=sys.maxsize)

    def clear(self) -> None:
        self._runs.clear()
        self._count = 0


class _Run:
    """One packed run and the part of it still queued: inputs [start, end), their arguments at
    data [data_start, data_end). Once most of its bytes are taken, what is left is copied out,
    so that a large input taken from it is not kept alive by the inputs still queued. Its
    arguments' sizes are unpacked only when a take cuts it (what is left is taken whole, or does
    not fit), its indices never."""

    __slots__ = ("part", "_sizes", "start", "end", "data_start", "data_end")

    def __init__(self, part: PackedInputs) -> None:
        self._reset(part)

    def _reset(self, part: PackedInputs) -> None:
        self.part = part
        self._sizes: tuple[int, ...] | None = None
        self.start, self.end = 0, part.count
        self.data_start, self.data_end = 0, len(part.data)

    @property
    def sizes(self) -> tuple[int, ...]:
        if self._sizes is None:
            self._sizes = unpack_uints(self.part.sizes)
        return self._sizes

    @property
    def left(self) -> int:
        return self.end - self.start

    def remaining(self) -> PackedInputs:
        return self._slice(self.start, self.end, self.data_start, self.data_end)

    def take(self, count: int, max_bytes: int, at_least_one: bool, from_back: bool,
             compact: bool = True) -> PackedInputs:
        """Up to `count` inputs from the front (or the back) of what is left, as many as fit in
        `max_bytes` of arguments (at least one if `at_least_one`)."""
        if count >= self.left and self.data_end - self.data_start <= max_bytes:  # all that is left: no sizes to add
            part = self._slice(self.start, self.end, self.data_start, self.data_end)
            self.start, self.data_start = self.end, self.data_end
        elif from_back:
            first = max(self.start, self.end - count)
            taken, size = _fitting(self.sizes[first:self.end][::-1], max_bytes, at_least_one)
            start, data_start = self.end - taken, self.data_end - size
            part = self._slice(start, self.end, data_start, self.data_end)
            self.end, self.data_end = start, data_start
        else:
            last = min(self.end, self.start + count)
            taken, size = _fitting(self.sizes[self.start:last], max_bytes, at_least_one)
            stop, data_stop = self.start + taken, self.data_start + size
            part = self._slice(self.start, stop, self.data_start, data_stop)
            self.start, self.data_start = stop, data_stop
        if compact:
            self._compact()
        return part

    def _slice(self, start: int, stop: int, data_start: int, data_stop: int) -> PackedInputs:
        part = self.part
        if start == 0 and stop == self.part.count:
            return part  # the whole run, as it came: no copy
        size = UINT_BYTES
        return PackedInputs(part.indices[start * size:stop * size], part.sizes[start * size:stop * size],
                            part.data[data_start:data_stop])

    def _compact(self) -> None:
        if self.left and (self.data_end - self.data_start) * 2 < len(self.part.data):
            rest = self.remaining()
            if type(rest.data) is memoryview:  # a view would keep the whole frame it came in alive
                rest.data = bytes(rest.data)
            self._reset(rest)


def _fitting(sizes: Sequence[int], max_bytes: int, at_least_one: bool) -> tuple[int, int]:
    """How many of these arguments, taken in order, fit in `max_bytes` (at least one if
    `at_least_one`), and their bytes together."""
    size = sum(sizes)
    if size <= max_bytes:
        return len(sizes), size
    ends = list(accumulate(sizes))
    fit = max(bisect_right(ends, max_bytes), 1 if at_least_one else 0)
    return fit, ends[fit - 1] if fit else 0


def gather(wanted: Iterable[tuple[int, PackedInputs]]) -> PackedInputs:
    """Inputs named with the runs they travelled in ([(input_index, run), ...]), each cut out of
    its run, in the order named: for the rare paths (inputs of a lost node queued again)."""
    places: dict[int, dict[int, tuple[int, int]]] = {}  # id(run) -> index -> its arguments' span
    indices: list[int] = []
    data: list[bytes | memoryview] = []
    for index, run in wanted:
        spans = places.get(id(run))
        if spans is None:
            ends = list(accumulate(unpack_uints(run.sizes)))
            spans = places[id(run)] = dict(zip(unpack_uints(run.indices), zip([0, *ends[:-1]], ends)))
        start, end = spans[index]
        indices.append(index)
        data.append(run.data[start:end])
    return PackedInputs.of_lists(indices, data) if indices else PackedInputs(b"", b"", b"")


def join(parts: Sequence[PackedInputs]) -> PackedInputs:
    if len(parts) == 1:
        return parts[0]
    return PackedInputs(b"".join(p.indices for p in parts), b"".join(p.sizes for p in parts),
                        b"".join(p.data for p in parts))


_Carrier = TypeVar("_Carrier", bound="CarriesInputs")


class CarriesInputs(Message):
    """A message whose fields are a job id and a run of its inputs (`PackedInputs`' three parts)."""

    __slots__ = ()
    job_id: str  # declared again by each message: `message` makes fields of a class's own annotations
    indices: bytes
    sizes: bytes
    data: bytes | memoryview

    @classmethod
    def of(cls: type[_Carrier], job_id: str, part: PackedInputs) -> _Carrier:
        return cls(job_id, part.indices, part.sizes, part.data)  # type: ignore[call-arg]

    def part(self) -> PackedInputs:
        return PackedInputs(self.indices, self.sizes, self.data)

    def validate(self) -> None:
        self.part().check(type(self).__name__, BATCH_ITEMS)
