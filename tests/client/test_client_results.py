"""The client takes each input's first result only, whichever way a batch of them comes: each run of
values in index order goes into the caller's list with one slice, anything else one by one, and
the upload window frees exactly what was out."""

from __future__ import annotations

import io
import pickle
import random

from burla.client.progress import Display
from burla.client.results import MAX_RUNS, NOT_TAKEN, TAKEN_FAILURE, TAKEN_VALUE, index_runs, take_results
from burla.client.upload import Uploader
from burla.protocol import wire
from burla.protocol.values.inline_values import VALUE, value_columns
from burla.protocol.values.serialization import pack_error


def _run(rng: random.Random, n: int) -> list:
    first = rng.randrange(-2, n)
    return [[i, VALUE, i * 10] for i in range(first, min(n + 2, first + rng.randint(1, 40)))]


def _batch(rng: random.Random, n: int) -> list:
    """A batch as the head sends it: a run of values in order or several joined (a worker's report
    each, in any order, some overlapping), sometimes out of order, repeated, out of range, pickled,
    or failed."""
    items = _run(rng, n)
    if rng.random() < 0.5:
        for _ in range(rng.choice((1, 2, 3, 80))):
            items += _run(rng, n)
    shape = rng.random()
    if shape < 0.15:
        rng.shuffle(items)
    elif shape < 0.3 and items:
        items[rng.randrange(len(items))] = [items[0][0], True, pickle.dumps(items[0][0] * 10)]
    elif shape < 0.4 and items:
        index = items[-1][0]
        items[-1] = [index, False, pack_error(ValueError(f"input {index} failed"))]
    elif shape < 0.5:
        items.append(list(items[0]))  # the head sent one again
    return items


def _expected(batches: list, n: int) -> tuple[list, bytearray]:
    """What taking them one by one, first result per input, leaves in the list."""
    results: list = [None] * n
    received = bytearray(n)
    for items in batches:
        for index, ok, payload in items:
            if 0 <= index < n and not received[index]:
                received[index] = TAKEN_VALUE if ok else TAKEN_FAILURE
                results[index] = "failed" if not ok else payload if ok == VALUE else pickle.loads(payload)
    return results, received


def test_every_input_keeps_its_first_result_whatever_the_batches_look_like():
    for seed in range(300):
        rng = random.Random(seed)
        n = rng.randint(1, 120)
        batches = [_batch(rng, n) for _ in range(rng.randint(1, 12))]
        results: list = [None] * n
        received = bytearray(n)
        taken_all: list[int] = []
        for items in batches:
            items = [list(item) for item in items]
            taken, outcomes, failed = take_results(items, received, results, {}, value_columns("t", items))
            assert len(set(taken)) == len(taken) and not set(taken) & set(taken_all), seed
            assert failed == sum(1 for index, ok, _ in outcomes if not ok)
            taken_all += taken
        expected, expected_received = _expected(batches, n)
        assert received == expected_received, seed
        got = ["failed" if isinstance(value, BaseException) else value for value in results]
        assert got == expected, seed


def _take(items: list, received: bytearray, results: list) -> tuple:
    """As the client takes a frame's results: with their columns where all are values."""
    taken, outcomes, failed = take_results(items, received, results, {}, value_columns("t", items))
    return list(taken), outcomes, failed


def test_a_run_of_values_fills_the_list_and_marks_them_taken():
    results: list = [None] * 6
    received = bytearray(6)
    taken, outcomes, failed = _take([[1, VALUE, "a"], [2, VALUE, 2.5], [3, VALUE, None]], received, results)
    assert (taken, outcomes, failed) == ([1, 2, 3], [], 0)
    assert results == [None, "a", 2.5, None, None, None] and received == bytearray([0, 1, 1, 1, 0, 0])
    # The same run again (sent twice by the head): nothing is taken twice, nothing changes.
    assert _take([[1, VALUE, "x"], [2, VALUE, "y"]], received, results) == ([], [], 0)
    assert results[1:3] == ["a", 2.5]
    # A run that reaches past the job, or holds one already taken, is sorted out one by one.
    assert _take([[4, VALUE, 4], [5, VALUE, 5], [6, VALUE, 6]], received, results)[0] == [4, 5]
    assert received.count(NOT_TAKEN) == 1


def test_runs_joined_in_one_batch_each_fill_their_part_of_the_list():
    results: list = [None] * 10
    received = bytearray(10)
    items = [[i, VALUE, i] for i in (6, 7, 8, 0, 1, 2, 3, 9)]  # three workers' reports, in any order
    assert _take(items, received, results) == ([6, 7, 8, 0, 1, 2, 3, 9], [], 0)
    assert results == [0, 1, 2, 3, None, None, 6, 7, 8, 9] and received.count(TAKEN_VALUE) == 8
    # Two runs that overlap (a result sent again) take each input once, the first result only.
    results, received = [None] * 10, bytearray(10)
    items = [[i, VALUE, "first"] for i in (2, 3, 4)] + [[i, VALUE, "again"] for i in (4, 5)]
    assert _take(items, received, results)[0] == [2, 3, 4, 5]
    assert results[2:6] == ["first", "first", "first", "again"]


def _spans_by_hand(indices: list) -> list:
    spans, at = [], 0
    for k in range(1, len(indices) + 1):
        if k == len(indices) or indices[k] != indices[k - 1] + 1:
            spans.append((at, indices[at], k - at))
            at = k
    return spans


def test_indices_are_cut_into_their_runs_whatever_order_the_runs_come_in():
    rng = random.Random(5)
    # Runs in their own place misled by later ones (blocks 1 and 2 swapped), and random shapes.
    assert index_runs([*range(5), *range(10, 15), *range(5, 10), *range(15, 20)]) == [
        (0, 0, 5), (5, 10, 5), (10, 5, 5), (15, 15, 5)]
    for _ in range(3000):
        blocks, start = [], rng.randrange(-3, 5)
        for _ in range(rng.randint(1, 8)):
            length = rng.randint(1, 9)
            blocks.append(list(range(start, start + length)))
            start += length + rng.choice((0, 0, 1, 5, -length - 3))
        rng.shuffle(blocks)
        indices = [i for block in blocks for i in block]
        if rng.random() < 0.2 and len(indices) > 2:  # not runs at all, in places
            indices[rng.randrange(len(indices))] = rng.randrange(-5, 60)
        expected = _spans_by_hand(indices)
        assert index_runs(indices) == expected and index_runs(tuple(indices)) == expected, indices
    assert index_runs(list(range(0, 2 * (MAX_RUNS + 1), 2))) is None  # too many runs: one by one


def test_a_frame_of_values_is_taken_by_its_runs_from_the_columns_found_as_it_was_checked():
    items = [[i, VALUE, i] for i in (*range(4, 8), *range(0, 4), *range(12, 16))]
    msg = wire.decode(wire.ResultBatch("j", 1, items).encode(), wire.HEAD_TO_CLIENT)
    assert isinstance(msg, wire.ResultBatch)
    columns = msg.values()
    assert columns == (tuple(i for i, _, _ in items), tuple(v for _, _, v in items))
    results: list = [None] * 16
    received = bytearray(16)
    taken, outcomes, failed = take_results(msg.items, received, results, {}, columns)
    assert taken is columns[0] and (outcomes, failed) == ([], 0)  # the runs' path, not the loop
    assert results == [*range(8), None, None, None, None, *range(12, 16)]
    # A frame with a pickle among its values, and one built here: no columns, or found when asked.
    mixed = wire.decode(wire.ResultBatch("j", 2, [[0, VALUE, 1], [1, True, b"p"]]).encode(), wire.HEAD_TO_CLIENT)
    assert isinstance(mixed, wire.ResultBatch) and mixed.values() is None
    assert wire.ResultBatch("j", 3, [[0, VALUE, 1]]).values() == ((0,), (1,))


def _uploader(n: int) -> Uploader:
    display = Display(n, show_progress=False, stdout=io.StringIO(), stderr=io.StringIO())
    return Uploader("j", list(range(n)), bytearray(n), display, False)


def test_results_free_exactly_the_window_their_inputs_took():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 60)
        uploader = _uploader(n)
        out = {i: rng.randint(1, 1000) for i in range(n) if rng.random() < 0.8}
        for index, size in out.items():
            uploader.sizes[index] = size
        uploader.outstanding_inputs, uploader.outstanding_bytes = len(out), sum(out.values())
        indices = list(range(n))
        rng.shuffle(indices)
        while indices:
            cut = rng.randint(1, len(indices))
            chunk, indices = indices[:cut], indices[cut:]
            if rng.random() < 0.5:
                chunk.sort()  # a run, mostly
            if rng.random() < 0.2:
                chunk += chunk[:rng.randint(0, len(chunk))]  # some again: freed once
            uploader.results_in(chunk)
            gone = set(chunk)
            for index in gone:
                out.pop(index, None)
            assert uploader.outstanding_inputs == len(out) and uploader.outstanding_bytes == sum(out.values())
            assert all(uploader.sizes[i] == (out.get(i, 0)) for i in range(n))
