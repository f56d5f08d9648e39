"""Large inputs pickled in parts (burla/protocol/values/pickle_parts.py): the parts joined are a pickle
of the value, its large buffers are the user's own objects (no copy), small values and values
with nothing large in them pickle as before, and a batch that mixes them travels intact."""

from __future__ import annotations

import pickle
import random

import numpy as np

from burla.protocol import wire
from burla.protocol.framing import decode
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.pickle_parts import LIKELY_LARGE_BYTES, PickleParts, likely_large
from burla.protocol.values.serialization import dumps_input

MB = 1024 * 1024


class _Broken:
    """Its nbytes fails: it is pickled the plain way, as before."""

    @property
    def nbytes(self) -> int:
        raise RuntimeError("no size here")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Broken)


class _Sized:
    """Says it is large (nbytes) but pickles small: it goes as plain bytes."""

    nbytes = 10 * MB

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Sized)


def _loads(pickled: bytes | PickleParts):
    return pickle.loads(pickled.joined() if isinstance(pickled, PickleParts) else pickled)


def test_a_large_bytes_input_is_its_own_object_between_the_pickles_framing():
    value = random.Random(1).randbytes(3 * MB)
    pickled = dumps_input(value)
    assert isinstance(pickled, PickleParts)
    assert any(part is value for part in pickled.parts)  # not copied
    assert len(pickled) == len(pickled.joined()) and _loads(pickled) == value


def test_a_numpy_arrays_memory_is_a_part_as_it_is():
    array = np.arange(MB, dtype=np.float64)  # 8 MB
    pickled = dumps_input((array, "label", 3))
    assert isinstance(pickled, PickleParts)
    large = [part for part in pickled.parts if len(part) >= MB]
    assert len(large) == 1 and np.shares_memory(np.frombuffer(large[0], dtype=np.float64), array)
    loaded = _loads(pickled)
    assert loaded[1:] == ("label", 3) and np.array_equal(loaded[0], array)


def test_values_with_nothing_large_pickle_as_plain_bytes():
    for value in [b"x" * (LIKELY_LARGE_BYTES - 1), (1, 2, "three"), [b"a"] * 100, _Sized(), _Broken(),
                  bytearray(10), np.zeros(10)]:
        pickled = dumps_input(value)
        assert type(pickled) is bytes, value
        loaded = pickle.loads(pickled)
        assert np.array_equal(loaded, value) if isinstance(value, np.ndarray) else loaded == value
    assert not likely_large([b"x" * (2 * MB)] * 17)  # a long list is not looked through
    assert likely_large([1, bytearray(2 * MB)]) and likely_large(memoryview(bytes(2 * MB)))


def test_a_batch_mixing_parts_and_bytes_travels_intact():
    rng = random.Random(2)
    values = [rng.randbytes(2 * MB), b"small", rng.randbytes(MB + 5), np.ones(300_000)]
    pickled = [dumps_input(value) for value in values]
    assert [type(p) for p in pickled] == [PickleParts, bytes, PickleParts, PickleParts]
    for batch in ([pickled[0]], pickled):  # a large input alone keeps its parts; a batch joins them
        message = wire.InputBatch.of("job", PackedInputs.of_lists(list(range(len(batch))), batch))
        frame = b"".join(bytes(part) for part in message.encode_parts())
        received = decode(frame, wire.CLIENT_TO_HEAD)
        got = [pickle.loads(bytes(argument)) for argument in received.part().arguments()]
        for value, loaded in zip(values, got):
            assert np.array_equal(loaded, value) if isinstance(value, np.ndarray) else loaded == value
    alone = wire.InputBatch.of("job", PackedInputs.of_lists([0], [pickled[0]])).encode_parts()
    assert any(part is values[0] for part in alone)  # sent from the user's bytes, not a copy
