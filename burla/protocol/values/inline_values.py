"""Small plain values travel as msgpack, not as pickles.

An input that is an int, float, bool, None or a short str travels as `INPUT_MARK` followed by the
value's msgpack (pickles start with 0x80 and input-file references with 0x00, so the first byte
tells them apart). A worker decodes a whole batch of such inputs with one msgpack call: entries
end to end behind an array header of twice their count are the array [None, value, None, value,
...], since the mark is msgpack's nil. Per input that is about a tenth of what `pickle.loads`
cost, and the client's `packb` half of `pickle.dumps`.

A call's result that is such a value travels in its result's place itself, beside the ok-code
`VALUE` (True: a pickle, False: an error record): the worker's frame packs it with every other
result at C speed and the client's decoding of the frame already yields it. No per-result
pickling on either side.

Nodes and the head never look inside an input; the head checks results' shapes (`check_results`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import compress, count, repeat
from operator import add, itemgetter, not_
from typing import Any, Final

import msgpack

from burla.errors import ProtocolError

INPUT_MARK: Final = 0xC0  # msgpack's nil: see the module's docstring
_MARK_BYTES: Final = bytes((INPUT_MARK,))
VALUE: Final = 2  # a result's ok-code: the call succeeded and its payload is its value itself
# Strings longer than this are pickled: a long one would make frames' string limits loose.
MAX_STR_CHARS: Final = 256
MAX_STR_BYTES: Final = 4 * MAX_STR_CHARS  # in UTF-8
INLINE_TYPES: Final = frozenset({int, float, bool, type(None), str})
# A batch of inputs is decoded in one call only while it is this small (a batch of pickles of a
# few MB is not parsed as msgpack to find that out).
_BATCH_DECODE_MAX_BYTES = 1 << 20
pack_value = msgpack.Packer(use_bin_type=True).pack  # one value's msgpack (a Packer resets after each)


def pack_input(value: Any) -> bytes | None:
    """The input as INPUT_MARK and its msgpack, or None if it is not such a value (pickle it)."""
    tp = type(value)
    if tp not in INLINE_TYPES or (tp is str and len(value) > MAX_STR_CHARS):
        return None
    try:
        return _MARK_BYTES + pack_value(value)
    except (OverflowError, UnicodeEncodeError):  # an int past 64 bits; a str with lone surrogates
        return None



def pack_run(values: Sequence[Any], start: int, end: int) -> tuple[bytes, array]:
    """`pack_input` of each value of the longest run from `values[start]` (up to `end`) that all
    travel so, end to end, and each one's size: found and encoded at C speed, where a Python loop
    over a no-op job's inputs was a third of the client's CPU per call. Empty if `values[start]`
    is not such a value."""
    run = values[start:end]
    kinds = set(map(type, run))
    if not kinds <= INLINE_TYPES:  # up to the first that is not
        run = run[:next(compress(count(), map(not_, map(INLINE_TYPES.__contains__, map(type, run)))))]
    if str in kinds:  # up to the first str too long to go inline
        run = run[:next((at for at, value in enumerate(run) if type(value) is str and len(value) > MAX_STR_CHARS),
                        len(run))]
    if run and (kinds == _INTS and 0 <= min(run) and max(run) < 1 << 64 or kinds == _FLOATS):
        return _pack_numbers(run, kinds)
    try:
        packed = list(map(pack_value, run))
    except (OverflowError, UnicodeEncodeError):  # an int past 64 bits, a lone surrogate: up to it
        packed = []
        for value in run:
            try:
                packed.append(pack_value(value))
            except (OverflowError, UnicodeEncodeError):
                break
    if not packed:
        return b"", array("I")
    return _MARK_BYTES + _MARK_BYTES.join(packed), array("I", map(add, map(len, packed), repeat(1)))


_INTS: Final = {int}
_FLOATS: Final = {float}
# An entry's size (its mark and its msgpack) by a non-negative int's bit length: a positive fixint
# up to 7 bits, then uint 8, 16, 32 and 64 (1, 2, 3, 5 and 9 bytes after the mark).
_INT_ENTRY_SIZES: Final = bytes(2 if bits <= 7 else 3 if bits <= 8 else 4 if bits <= 16 else 6 if bits <= 32 else 10
                                for bits in range(65)) + bytes(256 - 65)
_FLOAT_ENTRY_SIZE: Final = 10  # the mark and a float 64


def _pack_numbers(run: Sequence[Any], kinds: set[type]) -> tuple[bytes, array]:
    """`pack_run` of a run of non-negative ints (each below 2**64) or of floats, in one msgpack call:
    the array [None, v0, None, v1, ...] is the entries end to end behind its header (the mark is
    msgpack's nil), and each one's size follows from its value's bit length (a float's is fixed)."""
    interleaved = [None] * (2 * len(run))
    interleaved[1::2] = run
    packed = pack_value(interleaved)
    items = len(interleaved)
    data = packed[1 if items < 16 else 3 if items < 1 << 16 else 5:]  # past the array's header
    if kinds == _FLOATS:
        return data, array("I", (_FLOAT_ENTRY_SIZE,)) * len(run)
    return data, array("I", array("B", bytes(map(int.bit_length, run)).translate(_INT_ENTRY_SIZES)))


def unpack_input(data: bytes | memoryview) -> Any:
    """One input `pack_input` made."""
    return msgpack.unpackb(data[1:], raw=False)


def unpack_inputs(data: bytes | memoryview, count: int) -> list | None:
    """The values of a batch of `count` inputs whose entries (`data`, end to end) are all
    `pack_input`'s, decoded in one msgpack call; None if any is not (decode them one by one)."""
    if not count or len(data) > _BATCH_DECODE_MAX_BYTES or data[0] != INPUT_MARK:
        return None
    try:
        decoded = msgpack.unpackb(b"\xdd" + (2 * count).to_bytes(4, "big") + data, raw=False)
    except Exception:  # a pickle among them parsed as msgpack: anything can happen, and is dropped
        return None
    # Each entry is exactly a mark and one value, so a parse from the first entry's start meets
    # every entry's start at an even position; an entry that does not begin with the mark (a
    # pickle's 0x80 is an empty map, a file reference's 0x00 the int 0) is not nil there.
    if type(decoded) is not list or decoded[0::2].count(None) != count:
        return None
    return decoded[1::2]



def check_results(name: str, items: list) -> None:
    """Every item is [input_index, ok, payload]: ok True or False with bytes (a pickle, an error
    record), or VALUE with a plain value. Types match exactly (bool is not int here)."""
    if set(map(type, items)) - {list}:
        raise ProtocolError(f"{name} items must be arrays of 3 values")
    if set(map(len, items)) == {3} and _common_shapes(items):
        return
    inline = INLINE_TYPES
    try:
        for index, ok, payload in items:  # once per result: the common shapes first
            if type(index) is not int:
                raise ProtocolError(f"{name} item's input index has type {type(index).__name__}, expected int")
            if ok is True or ok is False:
                if type(payload) is not bytes and type(payload) is not memoryview:
                    raise ProtocolError(f"{name} item's payload has type {type(payload).__name__}, expected bytes")
            elif type(ok) is int and ok == VALUE:
                if type(payload) not in inline:
                    raise ProtocolError(f"{name} item's value has type {type(payload).__name__}, "
                                        f"expected one of int, float, bool, None, str")
                if type(payload) is str and len(payload) > MAX_STR_CHARS:
                    raise ProtocolError(f"{name} item's value is a str longer than {MAX_STR_CHARS} characters")
            else:
                raise ProtocolError(f"{name} item's ok-code is {ok!r}: expected true, false or {VALUE}")
    except ValueError:  # an item of another length
        raise ProtocolError(f"{name} items must be arrays of 3 values") from None


def value_columns(name: str, items: list) -> tuple[tuple, tuple] | None:
    """`check_results`; and where every result is a value that travelled as itself (ok-code VALUE:
    a no-op's or a number's, the common case), their indices and values, as two tuples made in
    one transposition at C speed: the client takes the values from there, with no other pass per
    result. None where any result is another kind (checked all the same)."""
    # The first result's ok-code tells a frame of pickles or failures at once: no transposition.
    if items and set(map(type, items)) == {list} and len(items[0]) > 1 and type(items[0][1]) is int:
        try:
            indices, oks, values = zip(*items, strict=True)
        except ValueError:  # an item of another length: check_results says which
            pass
        else:
            if set(map(type, indices)) == {int} and set(map(type, oks)) == {int} and oks.count(VALUE) == len(oks):
                kinds = set(map(type, values))
                if kinds <= _SHORT_INLINE_TYPES or (
                        kinds <= INLINE_TYPES and max(len(v) for v in values if type(v) is str) <= MAX_STR_CHARS):
                    return indices, values
    check_results(name, items)
    return None


_index_of = itemgetter(0)
_ok_of = itemgetter(1)
_payload_of = itemgetter(2)
_SHORT_INLINE_TYPES: Final = INLINE_TYPES - {str}  # values with no length to check
_PAYLOAD_TYPES: Final = frozenset({bytes, memoryview})


def _common_shapes(items: list) -> bool:
    """Whether these results, arrays of 3, take one of the common shapes, checked at C speed:
    every index an int, and every ok-code VALUE with values other than str, or every one True
    with bytes. False says nothing: `check_results` then looks at each item."""
    if set(map(type, map(_index_of, items))) != {int}:
        return False
    oks, ok_types = set(map(_ok_of, items)), set(map(type, map(_ok_of, items)))
    payload_types = set(map(type, map(_payload_of, items)))
    if ok_types == {int} and oks == {VALUE}:
        return payload_types <= _SHORT_INLINE_TYPES
    return ok_types == {bool} and oks == {True} and payload_types <= _PAYLOAD_TYPES


def stored_result(ok: bool | int, payload: Any) -> tuple[int, bytes]:
    """A result as an ok-code and bytes, as a head keeps a detached job's results: an inline value
    as its msgpack."""
    if type(ok) is int and ok == VALUE:
        return VALUE, pack_value(payload)
    return int(ok), bytes(payload)


def loaded_result(ok: int, data: bytes) -> tuple[bool | int, Any]:
    """What `stored_result` stored, as the ok-code and payload it was."""
    if ok == VALUE:
        return VALUE, msgpack.unpackb(data, raw=False)
    return bool(ok), data
