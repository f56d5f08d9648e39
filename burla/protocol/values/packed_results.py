"""Results packed as the head sends them to a client: a worker packs its results once, and its
node and the head pass them on as bytes (`PackedResults`), beside their input indices and the
indices of those that failed; frames of them are bounded by `limits`."""

from __future__ import annotations

import struct
import time
from array import array
from collections.abc import Sequence
from operator import itemgetter

import msgpack

from burla.errors import ProtocolError
from burla.protocol.framing import ItemBudget, Payload
from burla.protocol.limits import BATCH_ITEMS, RESULT_FRAME_BYTES
from burla.protocol.values.inline_values import INLINE_TYPES, MAX_STR_BYTES, MAX_STR_CHARS, VALUE, check_results
from burla.protocol.values.packed_inputs import pack_uints, unpack_uints

INDEX = struct.Struct("<I")  # input indices are below MAX_INPUTS < 2**32 (packed as PackedInputs' are)
# Per result, in `PackedResults.timings`: three doubles, when its call started (epoch seconds), how
# long it ran (seconds) and the worker's pid (0: the node answered for it, it never ran).
TIMING_VALUES = 3
TIMING_BYTES = TIMING_VALUES * 8


def untimed(count: int) -> bytes:
    """Timings of results no call produced (a node's own word for inputs): now, no time, no worker."""
    return array("d", (time.time(), 0.0, 0.0) * count).tobytes()


def read_timings(timings: bytes) -> list[tuple[float, float, int]]:
    """(started_at, seconds, worker pid) per result."""
    values = array("d")
    values.frombytes(timings)
    return [(values[i], values[i + 1], int(values[i + 2])) for i in range(0, len(values), TIMING_VALUES)]


def pack_indices(indices: list[int]) -> bytes:
    """Input indices as compact bytes (4 per index) for frames that list many of them."""
    return pack_uints(indices)


def unpack_indices(packed: bytes) -> list[int]:
    return list(unpack_uints(packed))


_index_of = itemgetter(0)
_ok_of = itemgetter(1)
_payload_of = itemgetter(2)


def pack_items(items: Sequence, large: bool | None = None) -> bytes:
    """Items packed as they follow their array's header inside a frame. A head keeps the results
    it relays in this form until they go out in a ResultBatch (`result_batch_parts`): bytes, where
    a tuple per result would have been walked by the cyclic GC. `large`: whether their payloads
    add up to LARGE_PAYLOADS, if the caller knows (None: weighed here). Raises OverflowError or
    UnicodeEncodeError for an inline value msgpack can't pack (`inline_values`)."""
    if large is None:
        try:
            large = payload_bytes(items) >= LARGE_PAYLOADS
        except (LookupError, TypeError):  # not results at all: packb packs them as they are
            large = False
    if large:
        return b"".join(_item_parts(items))  # each payload copied once, where packb copies it twice
    packed = msgpack.packb(items, use_bin_type=True)
    return packed[array_header_bytes(len(items)):]


def payload_bytes(items: Sequence) -> int:
    """What results' payloads weigh in a frame (an inline value as much as its msgpack at most)."""
    payloads = list(map(_payload_of, items))
    try:
        return sum(map(len, payloads))  # the common case: bytes, or short strs
    except TypeError:  # numbers, True, None among them (inline_values)
        if set(map(type, payloads)) <= _NUMBERS:  # only those: at C speed
            return _NUMBER_BYTES * len(payloads)
        return sum(map(_payload_size, payloads))


_NUMBERS = frozenset({int, float, bool, type(None)})
_NUMBER_BYTES = 9  # the most msgpack takes for one of _NUMBERS


def _payload_size(payload: object) -> int:
    kind = type(payload)
    if kind is bytes or kind is memoryview:
        return len(payload)  # type: ignore[arg-type]
    return 5 + 4 * len(payload) if kind is str else _NUMBER_BYTES  # type: ignore[arg-type]


# Payloads from which pack_items writes each item's msgpack itself: packb copies them into its
# buffer and then out of it, and the slice past the array's header copies them once more.
LARGE_PAYLOADS = 64 * 1024
_PACK_INDEX = msgpack.Packer().pack  # an item's index (an int of 64 bits at most, as packb packs it)
_PACK_VALUE = msgpack.Packer(use_bin_type=True).pack


def _item_parts(items: Sequence) -> list:
    """The msgpack of [input_index, ok, payload] per item, in parts: each payload as it is."""
    parts: list = []
    for index, ok, payload in items:
        if type(ok) is int:  # VALUE (True and False are bools)
            parts.append(b"\x93" + _PACK_INDEX(index) + b"\x02" + _PACK_VALUE(payload))
            continue
        size = len(payload)
        length = bytes((0xC4, size)) if size < 256 else struct.pack("!BH", 0xC5, size) if size < 65536 \
            else struct.pack("!BI", 0xC6, size)
        parts.append(b"\x93" + _PACK_INDEX(index) + (b"\xc3" if ok else b"\xc2") + length)
        parts.append(payload)
    return parts


class PackedResults:
    """Results packed as a head sends them to its client (`pack_items`), beside their input indices
    and the indices of those that failed (`pack_indices`; usually empty). Workers pack their
    results so; nodes and the head pass them on without decoding each (a head decodes them only
    to sort out repeats and failures, and checks them then: `items`)."""

    __slots__ = ("indices", "failed", "packed", "timings", "runs")

    def __init__(self, indices: bytes, failed: bytes, packed: Payload, timings: bytes, runs: bytes = b"") -> None:
        self.indices = indices
        self.failed = failed
        self.packed = packed
        self.timings = timings  # TIMING_BYTES per result: when and how long its call ran, and where
        # How many results each part joined here holds, in order (4-byte counts; empty: one part).
        # A worker reports its calls in its batch's order, so a part is mostly a run of indices,
        # which a head checks and marks done at C speed (records.mark_fresh).
        self.runs = runs

    @classmethod
    def of(cls, items: Sequence, timings: bytes | None = None) -> PackedResults:
        """These results ([[input_index, ok, payload], ...]) packed, with their calls' timings
        (None: no call produced them; see `untimed`)."""
        return cls.of_calls(items, untimed(len(items)) if timings is None else timings,
                            pack_indices(list(map(_index_of, items))), not all(map(_ok_of, items)), None)

    @classmethod
    def of_calls(cls, items: Sequence, timings: bytes, indices: bytes, any_failed: bool, large: bool | None
                 ) -> PackedResults:
        """`of`, for results whose maker knows their packed indices, whether any failed and whether
        their payloads are large (a worker, of its calls; None: weighed here): no pass over them
        for each."""
        failed = [item[0] for item in items if not item[1]] if any_failed else []
        return cls(indices, pack_indices(failed), pack_items(items, large), timings)

    @classmethod
    def join(cls, parts: Sequence[PackedResults]) -> PackedResults:
        if len(parts) == 1:
            return parts[0]
        return cls(b"".join(p.indices for p in parts), b"".join(p.failed for p in parts),
                   b"".join(p.packed for p in parts), b"".join(p.timings for p in parts),
                   b"".join(p.runs or INDEX.pack(p.count) for p in parts))

    @property
    def count(self) -> int:
        return len(self.indices) // INDEX.size

    def items(self, name: str = "results") -> list:
        """The results, decoded and checked against the indices and failures they are listed with
        (`name` is the message's, for the error)."""
        indices = unpack_indices(self.indices)
        count = len(indices)
        # Limits as tight as the results allow (an array per result, of three scalars; no str, map
        # or ext), so that a frame that is not what it claims can't make this head balloon.
        budget = ItemBudget(4 * count)
        try:
            items = msgpack.unpackb(array_header(count) + self.packed, raw=False, use_list=True,
                                    max_array_len=max(count, 3), max_map_len=0, max_str_len=MAX_STR_BYTES,
                                    max_ext_len=0, max_bin_len=len(self.packed), list_hook=budget.array)
        except Exception as e:  # msgpack raises several unrelated types on garbage
            raise ProtocolError(f"{name}.packed is not {count} packed results ({type(e).__name__}: {e})") from None
        check_results(name, items)
        if list(map(_index_of, items)) != indices:
            raise ProtocolError(f"{name}.packed holds other results than its indices name")
        if [item[0] for item in items if not item[1]] != unpack_indices(self.failed):
            raise ProtocolError(f"{name}.failed does not name the failed results it holds")
        return items


def check_packed(name: str, indices: bytes, failed: bytes, timings: bytes, runs: bytes = b"") -> None:
    for field, value in (("indices", indices), ("failed", failed)):
        if len(value) % INDEX.size:
            raise ProtocolError(f"{name}.{field} must be packed {INDEX.size}-byte integers")
    if len(indices) > BATCH_ITEMS * INDEX.size:  # what one frame takes in one step of the head's loop
        raise ProtocolError(f"{name} carries more than {BATCH_ITEMS} results")
    if len(timings) != len(indices) // INDEX.size * TIMING_BYTES:
        raise ProtocolError(f"{name}.timings must hold {TIMING_VALUES} doubles per result")
    if len(failed) > len(indices):
        raise ProtocolError(f"{name} lists more failed results than results")
    if runs and (len(runs) % INDEX.size or sum(unpack_uints(runs)) != len(indices) // INDEX.size):
        raise ProtocolError(f"{name}.runs must be packed {INDEX.size}-byte counts adding up to its results")


def item_frames(items: Sequence) -> list[Sequence]:
    """Results in frames of at most BATCH_ITEMS and RESULT_FRAME_BYTES of payloads, unless one
    result is bigger."""
    if len(items) <= BATCH_ITEMS and payload_bytes(items) <= RESULT_FRAME_BYTES:
        return [items] if items else []  # the common case: one frame
    frames, start, size = [], 0, 0
    for end, item in enumerate(items):
        size += _payload_size(item[2])
        if end > start and (end - start >= BATCH_ITEMS or size > RESULT_FRAME_BYTES):
            frames.append(items[start:end])
            start, size = end, _payload_size(item[2])
    frames.append(items[start:])
    return frames


def packed_frames(parts: Sequence[PackedResults]) -> list[PackedResults]:
    """Packed results joined into frames of at most BATCH_ITEMS and about RESULT_FRAME_BYTES (a part
    is never split: workers and nodes pack at most that many): a node's frames, which a head can
    pass on to its client as they are."""
    frames: list[PackedResults] = []
    group: list[PackedResults] = []
    count = size = 0
    for part in parts:
        if group and (count + part.count > BATCH_ITEMS or size + len(part.packed) > RESULT_FRAME_BYTES):
            frames.append(PackedResults.join(group))
            group, count, size = [], 0, 0
        group.append(part)
        count += part.count
        size += len(part.packed)
    if group:
        frames.append(PackedResults.join(group))
    return frames


def array_header_bytes(length: int) -> int:
    return 1 if length < 16 else 3 if length < 65536 else 5


def array_header(length: int) -> bytes:
    if length < 16:
        return bytes((0x90 | length,))
    if length < 65536:
        return struct.pack("!BH", 0xDC, length)
    return struct.pack("!BI", 0xDD, length)


# Reading packed results as views of their frame (`items_as_views`): msgpack's unpackb copies
# each payload out of the frame, which was half of a client's CPU when results were 10 MB each.
_INTS = {0xCC: struct.Struct(">B"), 0xCD: struct.Struct(">H"), 0xCE: struct.Struct(">I"), 0xCF: struct.Struct(">Q"),
         0xD0: struct.Struct(">b"), 0xD1: struct.Struct(">h"), 0xD2: struct.Struct(">i"), 0xD3: struct.Struct(">q")}
_BIN_LENGTHS = {0xC4: struct.Struct(">B"), 0xC5: struct.Struct(">H"), 0xC6: struct.Struct(">I")}
_BOOLS = {0xC2: False, 0xC3: True}


def read_str(view: memoryview, at: int) -> tuple[int, str]:
    """A msgpack str of up to 64 KiB at `at`: (where it ends, the str)."""
    first = view[at]
    if 0xA0 <= first <= 0xBF:
        start, size = at + 1, first & 0x1F
    elif first == 0xD9:
        start, size = at + 2, view[at + 1]
    elif first == 0xDA:
        start, size = at + 3, struct.unpack_from(">H", view, at + 1)[0]
    else:
        raise ValueError("not a short string")
    if start + size > len(view):
        raise ValueError("string past the frame's end")
    return start + size, bytes(view[start:start + size]).decode()


def read_array_header(view: memoryview, at: int) -> tuple[int, int]:
    """A msgpack array's header at `at`: (where its items start, how many)."""
    first = view[at]
    if 0x90 <= first <= 0x9F:
        return at + 1, first & 0x0F
    if first == 0xDC:
        return at + 3, struct.unpack_from(">H", view, at + 1)[0]
    if first == 0xDD:
        return at + 5, struct.unpack_from(">I", view, at + 1)[0]
    raise ValueError("not an array")


def read_int(view: memoryview, at: int) -> tuple[int, int]:
    """The msgpack integer at `at`, and where what follows it starts (ValueError if none is)."""
    first = view[at]
    if first < 0x80:
        return first, at + 1
    if first >= 0xE0:
        return first - 0x100, at + 1
    form = _INTS.get(first)
    if form is None:
        raise ValueError("not an integer")
    return form.unpack_from(view, at + 1)[0], at + 1 + form.size


def _read_inline_value(view: memoryview, at: int) -> tuple[object, int]:
    """The inline value at `at` and where what follows it starts (ValueError if it is not one)."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=_INLINE_MAX_BYTES, max_str_len=MAX_STR_BYTES,
                                max_bin_len=0, max_array_len=0, max_map_len=0, max_ext_len=0)
    unpacker.feed(view[at:at + _INLINE_MAX_BYTES])
    try:
        value = unpacker.unpack()
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ValueError(f"not an inline value: {e}") from None
    if type(value) not in INLINE_TYPES or (type(value) is str and len(value) > MAX_STR_CHARS):
        raise ValueError("not an inline value")
    return value, at + unpacker.tell()


_INLINE_MAX_BYTES = MAX_STR_BYTES + 5  # a str's header is at most 5 bytes


def items_as_views(view: memoryview, at: int, count: int) -> list | None:
    """`count` packed results ([input_index, ok, payload] each, as pack_items packs them) from `at`
    to the end of `view`, each payload a view of it; None if they are not exactly that (the
    caller's msgpack decoding then says what is wrong)."""
    items = []
    end = len(view)
    try:
        for _ in range(count):
            if view[at] != 0x93:
                return None
            index, at = read_int(view, at + 1)
            if view[at] == VALUE:  # a value of its own (inline_values): small, read by msgpack
                value, at = _read_inline_value(view, at + 1)
                items.append([index, VALUE, value])
                continue
            ok = _BOOLS[view[at]]
            length = _BIN_LENGTHS[view[at + 1]]
            at += 2 + length.size
            size = length.unpack_from(view, at - length.size)[0]
            if at + size > end:
                return None
            items.append([index, ok, view[at:at + size]])
            at += size
    except (IndexError, KeyError, ValueError, struct.error):
        return None
    return items if at == end else None
