"""Small plain values travel as msgpack, not pickles (`burla.protocol.values.inline_values`): each one comes
back exactly as it went, of exactly its type; values msgpack can't carry are pickled after all;
a batch mixing kinds is decoded one by one; and results' shapes are checked where they are read."""

from __future__ import annotations

import math
import pickle
import random

import pytest

from burla.errors import ProtocolError
from burla.protocol.values.inline_values import (
    INPUT_MARK,
    MAX_STR_CHARS,
    VALUE,
    check_results,
    pack_input,
    pack_run,
    unpack_input,
    unpack_inputs,
    value_columns,
)
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.packed_results import LARGE_PAYLOADS, PackedResults, pack_items
from tests.support import functions
from tests.support.helpers import result_value

INLINE = [0, 1, -1, 127, 128, 255, 256, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, True, False, None, 0.0, -0.0, 1.5,
          math.inf, -math.inf, "", "x", "é" * MAX_STR_CHARS, "日本"]
PICKLED = [2**64, -(2**63) - 1, 10**30, "x" * (MAX_STR_CHARS + 1), "\ud800", b"bytes", complex(1, 2), [1, 2],
           {"a": 1}, frozenset({1}), 1 + 0j]


def _same(a, b) -> bool:
    """Equal and of the same type (True is not 1 here; NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    return a == b and (type(a) is not float or math.copysign(1, a) == math.copysign(1, b))


@pytest.mark.parametrize("value", INLINE + [math.nan])
def test_small_plain_values_pack_and_come_back_of_the_same_type(value):
    data = pack_input(value)
    assert data is not None and data[0] == INPUT_MARK
    assert _same(unpack_input(data), value)
    assert _same(unpack_inputs(data, 1)[0], value)


@pytest.mark.parametrize("value", PICKLED)
def test_values_msgpack_cannot_carry_exactly_are_left_to_pickle(value):
    assert pack_input(value) is None


def test_a_batch_of_inline_inputs_decodes_in_one_call():
    values = INLINE * 20
    part = PackedInputs.of_lists(list(range(len(values))), [pack_input(v) for v in values])
    decoded = unpack_inputs(part.data, part.count)
    assert decoded is not None and all(map(_same, decoded, values))


def test_a_run_of_plain_values_packs_as_each_would_up_to_the_first_that_is_not():
    """`pack_run` is `pack_input` of each value from `start` until the first one `pack_input`
    leaves to pickle (or `end`), end to end, with each one's size: random mixtures, many seeds."""
    for seed in range(400):
        rng = random.Random(seed)
        values = [rng.choice(INLINE if rng.random() < 0.9 else PICKLED) for _ in range(rng.randint(1, 60))]
        start = rng.randrange(len(values))
        end = rng.randint(start, len(values))
        expected = []
        for value in values[start:end]:
            if pack_input(value) is None:
                break
            expected.append(pack_input(value))
        data, sizes = pack_run(values, start, end)
        assert (data, list(sizes)) == (b"".join(expected), list(map(len, expected))), seed


def test_a_run_of_numbers_alone_packs_as_each_would():
    """Runs of only ints or only floats take one msgpack call (`_pack_numbers`): the same entries
    and sizes as each packed alone, across every size boundary of msgpack's ints and of its
    arrays' headers; a negative int or one past 64 bits sends the run the general way."""
    rng = random.Random(3)
    edges = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
    pools = [edges, [rng.randrange(2**64) for _ in range(50)], [0.0, -0.0, 1.5, float("inf"), float("nan"), -2.5e300],
             edges + [-1], edges + [-33, -2**40], edges + [2**64]]
    for length in (1, 7, 8, 9, 100, 32767, 32768, 32769):
        for pool in pools:
            values = [rng.choice(pool) for _ in range(length)]
            expected = []
            for value in values:
                if pack_input(value) is None:
                    break
                expected.append(pack_input(value))
            data, sizes = pack_run(values, 0, len(values))
            assert data == b"".join(expected) and list(sizes) == list(map(len, expected)), (length, pool[:3])


def _entry(rng: random.Random, value) -> bytes:
    kind = rng.random()
    if kind < 0.7 and pack_input(value) is not None:
        return pack_input(value)
    if kind < 0.85:
        return pickle.dumps(value, 5)
    return b"\x00burla-input-file:" + rng.randbytes(rng.randint(0, 40))  # a file reference's first byte


def test_batches_mixing_kinds_are_never_misread():
    """A batch with any entry that is not inline falls back to one entry at a time (None); an
    all-inline batch decodes to exactly its values. Random mixtures, many seeds."""
    for seed in range(400):
        rng = random.Random(seed)
        values = [rng.choice(INLINE + PICKLED) for _ in range(rng.randint(1, 40))]
        entries = [_entry(rng, v) for v in values]
        decoded = unpack_inputs(b"".join(entries), len(entries))
        all_inline = all(e[0] == INPUT_MARK for e in entries)
        if all_inline:
            assert decoded is not None and all(map(_same, decoded, values)), seed
        else:
            assert decoded is None, seed


def test_batches_too_large_or_empty_are_decoded_one_by_one():
    assert unpack_inputs(b"", 0) is None
    big = [pack_input("x" * MAX_STR_CHARS)] * 5000  # > 1 MB of entries
    assert unpack_inputs(b"".join(big), len(big)) is None


def test_results_with_inline_values_pack_beside_pickles_small_and_large():
    large = pickle.dumps(b"p" * LARGE_PAYLOADS)  # takes pack_items' path that writes each payload itself
    for items in ([[0, VALUE, 7], [1, True, pickle.dumps(8)], [2, False, b"err"], [3, VALUE, "s"]],
                  [[0, VALUE, None], [1, True, large], [2, VALUE, 1.5], [3, VALUE, True]]):
        part = PackedResults.of(items)
        assert part.items() == items
        assert [type(p) for _, _, p in part.items()] == [type(p) for _, _, p in items]
        assert [result_value(ok, p) for _, ok, p in part.items() if ok] == \
            [pickle.loads(p) if ok is True else p for _, ok, p in items if ok]


@pytest.mark.parametrize("value", [2**64, "\ud800"])
def test_an_inline_value_msgpack_refuses_fails_the_packing_loudly(value):
    """The worker then pickles those results (see the end-to-end test below)."""
    with pytest.raises((OverflowError, UnicodeEncodeError)):
        pack_items([[0, VALUE, value]])


@pytest.mark.parametrize("items, words", [
    ([[0, VALUE, b"x"]], "value has type bytes"),
    ([[0, VALUE, [1]]], "value has type list"),
    ([[0, 3, 1]], "ok-code is 3"),
    ([[0, 2.0, 1]], "ok-code is 2.0"),
    ([[0, True, 5]], "payload has type int, expected bytes"),
    ([[True, True, b""]], "index has type bool"),
    ([[0, True]], "arrays of 3 values"),
    ([(0, True, b"")], "arrays of 3 values"),
])
def test_results_of_the_wrong_shape_are_refused(items, words):
    with pytest.raises(ProtocolError, match=words):
        check_results("ResultBatch", items)
    with pytest.raises(ProtocolError, match=words):
        value_columns("ResultBatch", items)


def _well_shaped(item: list) -> bool:
    """Whether one result item is of a shape `check_results` takes, written out plainly."""
    if type(item) is not list or len(item) != 3 or type(item[0]) is not int:
        return False
    ok, payload = item[1], item[2]
    if ok is True or ok is False:
        return type(payload) in (bytes, memoryview)
    if type(ok) is int and ok == VALUE:
        return type(payload) in (int, float, bool, type(None)) or (type(payload) is str
                                                                   and len(payload) <= MAX_STR_CHARS)
    return False


def test_a_batch_is_refused_exactly_when_one_of_its_results_is_of_the_wrong_shape():
    # Mostly batches of one common shape (the ones checked at C speed), with one odd item or none.
    rng = random.Random(13)
    odd = [[0, VALUE, b"x"], [0, 2.0, 1], [0, True, 5], [True, True, b""], [1.0, VALUE, 1], [0, VALUE, [1]],
           [0, 1, b"x"], [0, VALUE, "x" * (MAX_STR_CHARS + 1)], [0, False, 3], [0, True], [0, VALUE, 1, 2],
           [0, VALUE, "ok"], [0, False, b"err"], [0, True, memoryview(b"p")], [0, VALUE, None], [0, VALUE, False]]
    for _ in range(2000):
        common = rng.choice([lambda i: [i, VALUE, rng.choice([i, 1.5, True, None])], lambda i: [i, True, b"p"]])
        items = [common(i) for i in range(rng.randint(1, 30))]
        if rng.random() < 0.7:
            items.insert(rng.randrange(len(items) + 1), list(rng.choice(odd)))
        if all(map(_well_shaped, items)):
            check_results("ResultBatch", items)
            # The client's check: columns exactly where every result is a value.
            columns = value_columns("ResultBatch", items)
            if all(type(ok) is int for _, ok, _ in items):
                assert columns == (tuple(i for i, _, _ in items), tuple(v for _, _, v in items))
            else:
                assert columns is None
        else:
            with pytest.raises(ProtocolError):
                check_results("ResultBatch", items)
            with pytest.raises(ProtocolError):
                value_columns("ResultBatch", items)


def test_result_value_refuses_a_failure():
    with pytest.raises(ValueError):
        result_value(False, b"")


def test_every_kind_of_value_crosses_a_real_cluster_exactly(client):
    """Inputs and results through a real head, node and workers: inline values, values pickled
    after all (an int past 64 bits, a lone surrogate), and a batch mixing both."""
    values = INLINE + [math.nan] + [v for v in PICKLED if type(v) not in (list, dict)]
    results = client.remote_parallel_map(functions.identity, values, spinner=False)
    assert len(results) == len(values)
    assert all(_same(result[0], value) for result, value in zip(results, values)), list(zip(results, values))
    grown = client.remote_parallel_map(functions.beyond_inline, list(range(300)), spinner=False)
    assert grown == [functions.beyond_inline(x) for x in range(300)]
    assert all(type(g) is type(functions.beyond_inline(x)) for g, x in zip(grown, range(300)))

