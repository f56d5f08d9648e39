"""Large inputs sent straight to the node that runs them, past the head (DESIGN.md §3, "large
inputs straight to their node").

Where the head allows it (`JobAccepted.direct_inputs`), the client uploads an input of
DIRECT_MIN_BYTES or more as a *placeholder*: a mark byte and the input's size, five bytes in all.
The head queues, pushes, requeues and counts placeholders as it does any input, so scheduling,
credit, node losses and restarts stay as they are. When it pushes placeholders to a node it tells
the client where they went (`UploadDirect`, with a grant the head signed with that node's key),
and the client sends their bytes to that node itself (`DirectInputs`), or through the head
(`DirectFallback`, passed on as `DirectFill`) where it can't reach the node. The node opens the
client's connection only with that grant, before it reads a byte. A node keeps the
placeholders it was pushed aside, as awaited, until their bytes come, and queues them then.

A placeholder begins with 0x01: never the start of a pickle (0x80), of an inline value (0xC0)
or of an input-file reference (0x00).
"""

from __future__ import annotations

import struct
from itertools import accumulate

from burla.protocol.values.packed_inputs import UINT_BYTES, PackedInputs, pack_uints, unpack_uints

DIRECT_MIN_BYTES = 1024 * 1024  # below this, an input travels through the head (a round trip costs more)
# How a client opens its connection to a node: the head's upload grant (hex) and its expiry (the
# head's wall clock, seconds), as UploadDirect gave them.
GRANT_HEADER = "X-Burla-Upload-Grant"
EXPIRES_HEADER = "X-Burla-Upload-Expires"
_PLACEHOLDER = struct.Struct("<BI")  # the mark and the input's real size
PLACEHOLDER_BYTES = _PLACEHOLDER.size
_MARK = 0x01
_PLACEHOLDER_SIZE = pack_uints([PLACEHOLDER_BYTES])  # how a placeholder's size reads among a run's sizes


def placeholder(size: int) -> bytes:
    """What travels through the head in the place of an input of `size` bytes."""
    return _PLACEHOLDER.pack(_MARK, size)


def is_placeholder(data: bytes | memoryview) -> bool:
    return len(data) == PLACEHOLDER_BYTES and data[0] == _MARK


def real_size(data: bytes | memoryview) -> int:
    """The size of the input a placeholder stands for."""
    return int(_PLACEHOLDER.unpack(data)[1])


def placeholders_in(part: PackedInputs) -> list[tuple[int, int]]:
    """(input index, real size) of each placeholder in a run of inputs. At C speed when there is
    none: a placeholder's size is found among the sizes first, and only such entries are read."""
    sizes = part.sizes
    at = sizes.find(_PLACEHOLDER_SIZE)
    if at < 0:
        return []
    ends: list[int] | None = None
    indices: tuple[int, ...] = ()
    found: list[tuple[int, int]] = []
    data = part.data
    while at >= 0:
        if at % UINT_BYTES == 0:  # a size of its own, not the bytes of two neighbours
            if ends is None:
                ends = list(accumulate(unpack_uints(sizes)))
                indices = unpack_uints(part.indices)
            position = at // UINT_BYTES
            start = ends[position] - PLACEHOLDER_BYTES
            entry = data[start:ends[position]]
            if entry[0] == _MARK:
                found.append((indices[position], real_size(entry)))
        at = sizes.find(_PLACEHOLDER_SIZE, at + 1)
    return found


def without(part: PackedInputs, placeholders: list[tuple[int, int]]) -> PackedInputs:
    """The inputs of `part` but these placeholders (as `placeholders_in` found them)."""
    left_out = {index for index, _ in placeholders}
    kept = [(index, data) for index, data in part.items() if index not in left_out]
    return PackedInputs.of(kept) if kept else PackedInputs(b"", b"", b"")
