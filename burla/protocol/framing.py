"""How a wire message is framed and checked: the `Message` base and its `message` decorator,
per-channel limits, and `decode`, which turns a frame into its typed message or raises
`ProtocolError` naming what is wrong. The messages themselves are in `burla.protocol.wire`."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast, dataclass_transform

import msgpack

from burla.errors import ProtocolError
from burla.protocol.values.pickle_parts import PickleParts

_Checker = Callable[[Any], bool]


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_int(value: Any) -> bool:
    # Within 64 bits signed, like every integer the head stores (SQLite's INTEGER) or sends on.
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def _is_float(value: Any) -> bool:
    # NaN and infinities are refused at the edge: nothing downstream (JSON views, the scheduler's
    # arithmetic) has to think about them.
    return _is_int(value) or (type(value) is float and math.isfinite(value))


_SIMPLE: dict[str, _Checker] = {
    "int": _is_int,
    "float": _is_float,
    "bool": lambda v: type(v) is bool,
    "str": lambda v: type(v) is str,
    "bytes": lambda v: type(v) is bytes,
    "memoryview": lambda v: type(v) is memoryview,
    "list": lambda v: type(v) is list,
    "dict": lambda v: type(v) is dict,
}


def _checker_for(annotation: str) -> _Checker:
    """A type check from a field's annotation text ("int", "str | None", "list"...).

    Annotations are read as text (this module uses postponed evaluation) rather than through
    typing.get_type_hints, which costs every process that imports this module tens of ms.
    """
    names = [part.strip() for part in annotation.split("|")]
    allows_none = "None" in names
    checks = []
    for name in names:
        if name == "None":
            continue
        base = name.split("[", 1)[0]
        if base not in _SIMPLE:
            raise TypeError(f"unsupported wire field type {annotation!r}")
        checks.append(_SIMPLE[base])
    if len(checks) == 1 and not allows_none:
        return checks[0]

    def check_union(value: Any) -> bool:
        return (allows_none and value is None) or any(check(value) for check in checks)

    return check_union


# Bulk frames: a message whose bulk fields (annotated `bytes | memoryview`: the payloads of
# inputs and results) hold BULK_MIN_BYTES or more travels as BULK_MARK, the length of its header
# (4 bytes), its header (the msgpack array of a plain frame, with each bulk field's length in the
# field's place) and then those fields' bytes, end to end. Nothing packs or unpacks the payloads:
# a sender writes them as they are, a receiver takes them as views of the frame it received, and
# a head or node that passes them on writes those views. 0xC1 is the one byte msgpack never uses,
# so no plain frame starts with it.
BULK_MARK = b"\xc1"
BULK_MIN_BYTES = 64 * 1024
_HEADER_LENGTH = struct.Struct("<I")
Payload = bytes | memoryview  # a bulk field's value: a view of the frame it came in, or bytes


class Message:
    """Base of all wire messages. Subclasses are made by `message`: slotted classes with a TAG,
    built without the dataclasses machinery (which cost every process ~25 ms at import)."""

    __slots__ = ()
    TAG: ClassVar[int]
    FIELDS: ClassVar[tuple[str, ...]]
    BULK: ClassVar[tuple[int, ...]]  # positions of the fields that may travel outside the header
    _checkers: ClassVar[tuple[_Checker, ...]]

    def encode(self) -> bytes:
        if not self.BULK:  # most messages: one packb, as before bulk frames
            return msgpack.packb([self.TAG, *(getattr(self, f) for f in self.FIELDS)], use_bin_type=True)
        parts = self.encode_parts()
        return parts[0] if len(parts) == 1 else b"".join(parts)  # type: ignore[return-value]

    def encode_parts(self) -> list[Payload]:
        """The frame in parts, to be written one after the other: the bulk fields' bytes are
        parts of their own, never copied into a buffer (one part for a plain frame)."""
        values = [getattr(self, f) for f in self.FIELDS]
        if self.BULK:
            blobs = [values[i] for i in self.BULK]
            if sum(map(len, blobs)) >= BULK_MIN_BYTES:
                for i in self.BULK:
                    values[i] = len(values[i])
                header = msgpack.packb([self.TAG, *values], use_bin_type=True)
                parts: list[Payload] = [BULK_MARK + _HEADER_LENGTH.pack(len(header)) + header]
                for blob in blobs:  # a client's input pickled in parts (pickle_parts) goes as its parts
                    if isinstance(blob, PickleParts):
                        parts.extend(blob.parts)
                    else:
                        parts.append(blob)
                return parts
            for i in self.BULK:
                if isinstance(values[i], PickleParts):
                    values[i] = values[i].joined()
        return [msgpack.packb([self.TAG, *values], use_bin_type=True)]

    def validate(self) -> None:
        """Deeper checks of list items; called after the field types passed."""

    def replace(self, **changes: Any) -> Any:
        """A copy with some fields changed (messages are never changed in place)."""
        values = {name: getattr(self, name) for name in self.FIELDS}
        unknown = set(changes) - set(values)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        values.update(changes)
        return type(self)(**values)


REGISTRY: dict[int, type[Message]] = {}
M = TypeVar("M", bound=Message)


def _methods(name: str, fields: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, Any]:
    """__init__, __eq__ and __repr__ for a message with these fields, compiled in one go."""
    parameters = ", ".join(f"{f}=_defaults[{f!r}]" if f in defaults else f for f in fields)
    assignments = "".join(f"\n    self.{f} = {f}" for f in fields) or "\n    pass"
    mine = "(" + "".join(f"self.{f}, " for f in fields) + ")"
    theirs = "(" + "".join(f"other.{f}, " for f in fields) + ")"
    shown = ", ".join(f"{f}={{self.{f}!r}}" for f in fields)
    source = (
        f"def __init__(self, {parameters}):{assignments}\n"
        f"def __eq__(self, other):\n"
        f"    if other.__class__ is not self.__class__:\n        return NotImplemented\n"
        f"    return {mine} == {theirs}\n"
        f"def __repr__(self):\n    return f'{name}({shown})'\n"
    )
    namespace: dict[str, Any] = {"_defaults": defaults}
    exec(source, namespace)  # noqa: S102 - source built from this module's own field names
    return {key: namespace[key] for key in ("__init__", "__eq__", "__repr__")}


@dataclass_transform(eq_default=True, frozen_default=True)
def message(tag: int) -> Callable[[type[M]], type[M]]:
    def register(cls: type[M]) -> type[M]:
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        fields = tuple(annotations)
        defaults = {f: cls.__dict__[f] for f in fields if f in cls.__dict__}
        body = {key: value for key, value in cls.__dict__.items()
                if key not in fields and key not in ("__dict__", "__weakref__")}
        # CACHED: slots a message fills as it is checked (never sent, compared or shown)
        body.update(_methods(cls.__name__, fields, defaults), __slots__=fields + cls.__dict__.get("CACHED", ()),
                    __hash__=None)
        cls = cast("type[M]", type(cls.__name__, cls.__bases__, body))
        cls.TAG = tag
        cls.FIELDS = fields
        cls.BULK = tuple(i for i, f in enumerate(fields) if "memoryview" in annotations[f])
        cls._checkers = tuple(_checker_for(annotations[f]) for f in fields)
        if tag in REGISTRY:
            raise RuntimeError(f"duplicate wire tag {tag}")
        REGISTRY[tag] = cls
        return cls

    return register


@dataclass(frozen=True)
class Limits:
    """What one frame on a channel may hold. Strings and bytes cost memory in proportion to the
    frame, but arrays and maps of tiny items cost ~60 bytes per byte sent: their lengths, and the
    items of all of them together, are bounded so that no frame can make a peer balloon."""

    max_array_len: int
    max_map_len: int
    max_str_len: int
    max_bin_len: int
    max_items: int  # array items plus map entries, over the whole frame


class Channel:
    """One direction of one link: which messages it carries and how big their frames may be."""

    def __init__(self, name: str, messages: tuple[type[Message], ...], limits: Limits) -> None:
        self.name = name
        self.messages = messages
        self.limits = limits


class ItemBudget:
    """msgpack hooks that count the items of every array and map as the frame is decoded."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.left = self.limit = limit

    def array(self, items: list) -> list:
        self.left -= len(items)
        if self.left < 0:
            raise ValueError(f"over {self.limit} array items and map entries in one frame")
        return items

    def map(self, entries: dict) -> dict:
        self.left -= len(entries)
        if self.left < 0:
            raise ValueError(f"over {self.limit} array items and map entries in one frame")
        return entries


DEFAULT_LIMITS = Limits(max_array_len=10_000, max_map_len=10_000, max_str_len=1 << 20, max_bin_len=1 << 20,
                        max_items=100_000)


def decode(data: bytes | bytearray | memoryview, allowed: Channel | tuple[type[Message], ...] | None = None) -> Message:
    """Decode one frame into its message, or raise ProtocolError saying what is wrong. A bulk
    frame's payload fields are views of `data`, which they keep alive."""
    limits = allowed.limits if isinstance(allowed, Channel) else DEFAULT_LIMITS
    if len(data) >= VIEWS_FROM_BYTES and data[:1] == b"\x94":
        as_views = _decoded_as_views(data, allowed, limits)
        if as_views is not None:
            return as_views
    bulk_at, header = _bulk_header(data)
    frame = _unpack(header, limits)
    if type(frame) is not list or not frame or type(frame[0]) is not int:
        raise ProtocolError("frame must be a msgpack array [tag, fields...]")
    cls = REGISTRY.get(frame[0])
    if cls is None:
        raise ProtocolError(f"unknown message tag {frame[0]}")
    if not _allows(allowed, cls):
        raise ProtocolError(f"{cls.__name__} is not accepted on this channel")
    values = frame[1:]
    if len(values) != len(cls.FIELDS):
        raise ProtocolError(f"{cls.__name__} needs {len(cls.FIELDS)} fields, got {len(values)}")
    if bulk_at >= 0:
        _take_bulk(cls, values, memoryview(data), bulk_at, limits)
    for name, check, value in zip(cls.FIELDS, cls._checkers, values):
        if not check(value):
            raise ProtocolError(f"{cls.__name__}.{name} has the wrong type ({type(value).__name__})")
    msg = cls(*values)
    msg.validate()
    return msg


VIEWS_FROM_BYTES = 64 * 1024  # frames from which a message with `decode_views` reads its payloads as views


def _decoded_as_views(data: bytes | bytearray | memoryview, allowed: Channel | tuple[type[Message], ...] | None,
                      limits: Limits) -> Message | None:
    """A 3-field message (0x94) whose class reads its payloads as views of the frame, if it can."""
    viewer = getattr(REGISTRY.get(data[1]), "decode_views", None)
    if viewer is None or not _allows(allowed, viewer.__self__):
        return None
    return viewer(memoryview(data), limits)


def _bulk_header(data: bytes | bytearray | memoryview) -> tuple[int, bytes | bytearray | memoryview]:
    """(where a bulk frame's payloads start, its header); (-1, data) for a plain frame."""
    if data[:1] != BULK_MARK:
        return -1, data
    if len(data) < 1 + _HEADER_LENGTH.size:
        raise ProtocolError("bulk frame is shorter than its header's length")
    bulk_at = 1 + _HEADER_LENGTH.size + _HEADER_LENGTH.unpack_from(data, 1)[0]
    if bulk_at > len(data):
        raise ProtocolError("bulk frame is shorter than its header")
    return bulk_at, memoryview(data)[1 + _HEADER_LENGTH.size:bulk_at]


def _allows(allowed: Channel | tuple[type[Message], ...] | None, cls: type[Message]) -> bool:
    return allowed is None or cls in (allowed.messages if isinstance(allowed, Channel) else allowed)


def _unpack(data: bytes | bytearray | memoryview, limits: Limits) -> Any:
    hooks = {}
    if len(data) > limits.max_items:  # every item takes a byte: smaller frames can't exceed the budget
        budget = ItemBudget(limits.max_items)
        hooks = {"list_hook": budget.array, "object_hook": budget.map}
    try:
        return msgpack.unpackb(
            data, raw=False, use_list=True, strict_map_key=False, max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len, max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len,
            max_ext_len=0, **hooks,
        )
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"frame is not valid msgpack or is over this channel's limits "
                            f"({type(e).__name__}: {e})") from None


def _take_bulk(cls: type[Message], values: list, view: memoryview, at: int, limits: Limits) -> None:
    """Put the views of a bulk frame's payloads in their fields' places (where the header has
    their lengths)."""
    if not cls.BULK:
        raise ProtocolError(f"{cls.__name__} has no bulk fields")
    for i in cls.BULK:
        length = values[i]
        if type(length) is not int or not 0 <= length <= limits.max_bin_len:
            raise ProtocolError(f"{cls.__name__}.{cls.FIELDS[i]} must be a length within this channel's limits "
                                f"in a bulk frame's header")
        if at + length > len(view):
            raise ProtocolError(f"bulk frame is shorter than {cls.__name__}.{cls.FIELDS[i]}'s length")
        values[i] = view[at:at + length]
        at += length
    if at != len(view):
        raise ProtocolError(f"bulk frame has {len(view) - at} bytes past its fields")


def _items_match(items: list, shape: tuple[type, ...]) -> bool:
    """The fast check of the common shapes. Unpacking checks each item's length; the items' own
    types are gathered at C speed first, since a msgpack map of two keys would unpack too."""
    kinds = set(map(type, items))
    if kinds and kinds != {list}:
        return False
    try:
        if len(shape) == 2:
            first, second = shape
            for a, b in items:
                if type(a) is not first or type(b) is not second:
                    return False
            return True
        if len(shape) == 3:
            first, second, third = shape
            for a, b, c in items:
                if type(a) is not first or type(b) is not second or type(c) is not third:
                    return False
            return True
    except ValueError:  # an item of another length
        pass
    return False


def check_items(name: str, items: list, shape: tuple[type, ...]) -> None:
    """Every item is a list of exactly these types (bool is not int here: types match exactly).
    The common shapes are checked without an inner loop: this runs for every input and result."""
    if _items_match(items, shape):
        return
    width = len(shape)
    for item in items:  # slow path: find what is wrong, and say so
        if type(item) is not list or len(item) != width:
            raise ProtocolError(f"{name} items must be arrays of {width} values")
        for value, tp in zip(item, shape):
            if type(value) is not tp:
                raise ProtocolError(f"{name} item field has type {type(value).__name__}, expected {tp.__name__}")
