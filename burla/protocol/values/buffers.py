"""Buffers for large frames, filled by a read or a copy right after they are made.

`bytearray(n)` zero-fills its n bytes, which for a 10 MB frame cost as much as reading the
frame into it. `unfilled` makes one without that pass (CPython's PyByteArray_FromStringAndSize
with no source); whoever asks for one writes every byte before anything reads it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

_FROM_SIZE_BELOW = 1 << 20  # smaller buffers: bytearray's zero-filling costs next to nothing


@functools.cache
def _maker() -> Callable[[bytes | None, int], bytearray] | None:
    if sys.implementation.name != "cpython":
        return None
    import ctypes  # on the first large frame: most clients never need it

    try:
        make = ctypes.pythonapi.PyByteArray_FromStringAndSize
    except AttributeError:
        return None
    make.restype = ctypes.py_object
    make.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    return make


def unfilled(size: int) -> bytearray:
    """A bytearray of `size` bytes whose contents are undefined until written."""
    make = _maker() if size >= _FROM_SIZE_BELOW else None
    return bytearray(size) if make is None else make(None, size)
