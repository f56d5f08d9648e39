"""A large value pickled without a copy of its large buffers.

`pickle.dumps` copies every byte string it meets into an output buffer of its own, made anew for
each pickle: for a 10 MB `bytes` input that ran at 2 GB/s here, mostly in the page faults of the
fresh buffer, and it was the largest part of a client's CPU per GB of large inputs. A Pickler
writing to a file instead hands each byte string of FRAME_SIZE_TARGET (64 KB) or more to the
file's `write` as the object itself (a `bytes`, a `bytearray`, or the PickleBuffer of a NumPy
array). `_PartsWriter` keeps those as they are, so the pickle is a list of parts: the pickler's
framing and small pieces, and the value's own large buffers. The parts are copied once, where
they are sent: into the client's masked WebSocket frame, or into an input file.

The parts refer to the user's objects until they are sent; the upload sends each input as soon
as it is pickled, while the user's `remote_parallel_map` call still runs.
"""

from __future__ import annotations

import pickle
from typing import Any

DIRECT_MIN_BYTES = 64 * 1024  # the pickler hands buffers this big to `write` whole (FRAME_SIZE_TARGET)
LIKELY_LARGE_BYTES = 1024 * 1024  # a value holding a buffer this big is pickled in parts


class PickleParts:
    """A pickle as the parts its pickler wrote, to be sent or written one after another."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list[bytes | memoryview]) -> None:
        self.parts = parts
        self.size = sum(part.nbytes if isinstance(part, memoryview) else len(part) for part in parts)

    def __len__(self) -> int:
        return self.size

    def joined(self) -> bytes:
        return b"".join(self.parts)


class _PartsWriter:
    """The file a Pickler writes to: small writes gathered into one part, large ones kept whole."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self._small = bytearray()

    def write(self, data: Any) -> int:
        view = memoryview(data)
        size = view.nbytes
        if size < DIRECT_MIN_BYTES:
            self._small += view
            return size
        if self._small:
            self.parts.append(bytes(self._small))
            self._small.clear()
        self.parts.append(data if type(data) is bytes else view.cast("B"))
        return size

    def finish(self) -> list[bytes | memoryview]:
        if self._small:
            self.parts.append(bytes(self._small))
            self._small.clear()
        return self.parts


def likely_large(value: Any) -> bool:
    """Whether `value`, or an item of it if it is a short tuple or list, is a buffer of
    LIKELY_LARGE_BYTES or more (bytes, bytearray, memoryview, or anything with `nbytes`, as NumPy
    arrays have): the cases where pickling in parts saves a copy. Cheap: it looks, never pickles."""
    if type(value) in (tuple, list):
        return len(value) <= 16 and any(map(_large_buffer, value))
    return _large_buffer(value)


def _large_buffer(value: Any) -> bool:
    kind = type(value)
    if kind is bytes or kind is bytearray:
        return len(value) >= LIKELY_LARGE_BYTES
    if kind is memoryview:
        return value.nbytes >= LIKELY_LARGE_BYTES
    if kind.__module__ == "builtins":
        return False
    try:
        size = getattr(value, "nbytes", None)
    except Exception:  # a property of the user's that fails: it is pickled the plain way
        return False
    return isinstance(size, int) and size >= LIKELY_LARGE_BYTES


def dumps_in_parts(value: Any, pickler: type[pickle.Pickler], protocol: int) -> bytes | PickleParts:
    """`value` pickled with `pickler` (pickle's or cloudpickle's) in parts; as plain bytes when
    there is nothing large in it after all."""
    writer = _PartsWriter()
    pickler(writer, protocol=protocol).dump(value)
    parts = writer.finish()
    if len(parts) == 1 and type(parts[0]) is bytes:
        return parts[0]
    pickled = PickleParts(parts)
    return pickled.joined() if pickled.size < LIKELY_LARGE_BYTES else pickled
