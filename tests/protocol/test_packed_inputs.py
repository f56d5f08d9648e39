"""Packed runs of inputs: what a node queues from the head and cuts its workers' batches from."""

from __future__ import annotations

import pickle

import pytest

from burla.node.workers.worker_pool import Batch
from burla.protocol.values.packed_inputs import InputRuns, PackedInputs, join


def _items(indices) -> list[tuple[int, bytes]]:
    return [(i, pickle.dumps("x" * (i % 7))) for i in indices]


def test_a_run_packs_and_unpacks_its_inputs():
    items = _items(range(10)) + [(99, b"")]
    part = PackedInputs.of(items)
    assert part.count == len(part) == 11
    assert part.items() == items and list(part) == items
    assert part.index_list() == [i for i, _ in items]
    assert part.arguments() == [data for _, data in items]
    assert PackedInputs.of([]).items() == [] and PackedInputs.of([]).arguments() == []


def test_batches_are_cut_from_the_front_and_steals_from_the_back_in_order():
    runs = InputRuns()
    runs.append(PackedInputs.of(_items(range(0, 5))))
    runs.append(PackedInputs.of(_items(range(5, 12))))
    assert len(runs) == 12
    assert runs.take(3).items() == _items(range(0, 3))
    assert runs.take(4).items() == _items(range(3, 7))  # across two runs
    assert runs.take_last(2).items() == _items(range(10, 12))
    assert runs.index_list() == [7, 8, 9]
    runs.prepend(PackedInputs.of(_items([1, 2])))  # back from a lost worker: they go first
    assert len(runs) == 5 and runs.index_list() == [1, 2, 7, 8, 9]
    assert runs.take_last(10).items() == _items([1, 2, 7, 8, 9])
    assert len(runs) == 0 and not runs and runs.take(3).count == 0


def test_a_whole_run_goes_as_it_came():
    part = PackedInputs.of(_items(range(4)))
    runs = InputRuns()
    runs.append(part)
    assert runs.take(100) is part


@pytest.mark.parametrize("cuts", [[1, 1, 1, 1], [3, 1], [2, 2], [4]])
def test_a_batch_counts_results_reported_in_its_order(cuts):
    items = _items(range(20, 24))
    batch = Batch("j", PackedInputs.of(items), 0.0)
    done = 0
    for cut in cuts:
        assert batch.next_index() == items[done][0]
        assert batch.took_results(PackedInputs.of(items[done:done + cut]).indices) == cut
        done += cut
        assert batch.left == 4 - done and batch.remaining_items() == items[done:]
    assert batch.next_index() == -1 and batch.remaining_indices() == []


def test_a_batch_takes_results_out_of_its_order_one_by_one():
    items = _items(range(6))
    batch = Batch("j", PackedInputs.of(items), 0.0)
    assert batch.took_results(PackedInputs.of([items[0]]).indices) == 1
    assert batch.took_results(PackedInputs.of([items[3], items[1]]).indices) == 2
    assert batch.remaining_items() == [items[2], items[4], items[5]]
    assert batch.took_results(PackedInputs.of([items[3]]).indices) == 0  # a repeat frees nothing
    assert batch.left == 3


def test_join_keeps_the_order():
    a, b = PackedInputs.of(_items(range(3))), PackedInputs.of(_items(range(3, 5)))
    assert join([a, b]).items() == _items(range(5))
    assert join([a]) is a


def test_a_take_stops_before_the_input_that_would_pass_its_bytes_but_takes_one_however_big():
    items = [(0, b"a" * 10), (1, b"b" * 10), (2, b"c" * 100), (3, b"d" * 5)]
    runs = InputRuns()
    runs.append(PackedInputs.of(items[:2]))
    runs.append(PackedInputs.of(items[2:]))
    assert runs.take(10, max_bytes=25).items() == items[:2]
    assert runs.take(10, max_bytes=25).items() == [items[2]]  # alone, over the bytes
    assert runs.take(10, max_bytes=25).items() == [items[3]]
    runs.append(PackedInputs.of(items))
    assert runs.take_all().items() == items  # everything, whatever it weighs


def test_a_run_lets_go_of_its_bytes_once_most_of_them_are_taken():
    # Found by review: a stolen or dispatched large input stayed alive in its run for as long as
    # a small input of the same push was queued.
    big = b"x" * 1_000_000
    runs = InputRuns()
    runs.append(PackedInputs.of([(0, b"a"), (1, b"b"), (2, big)]))
    assert runs.take_last(1).data == big
    [run] = runs._runs
    assert len(run.part.data) == 2 and run.part.items() == [(0, b"a"), (1, b"b")]
    alone = PackedInputs.of([(5, big)])
    runs.append(alone)
    assert runs.take_last(1) is alone  # a whole run goes as it came


def test_a_steal_takes_from_the_back_within_the_bytes_but_one_however_big():
    # Found by review: a thief's share had no byte bound, and a grant of several large inputs was
    # more than the thief could read.
    items = [(0, b"a" * 10), (1, b"b" * 100), (2, b"c" * 10), (3, b"d" * 5)]
    runs = InputRuns()
    runs.append(PackedInputs.of(items[:2]))
    runs.append(PackedInputs.of(items[2:]))
    assert runs.take_last(10, max_bytes=20).items() == items[2:]
    assert runs.take_last(10, max_bytes=20).items() == [items[1]]  # alone, over the bytes
    assert runs.take_last(10, max_bytes=20).items() == [items[0]]
    assert len(runs) == 0
