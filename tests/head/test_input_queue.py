"""The head keeps a job's inputs packed, as the client sent them: pushes are slices of its runs,
and an input's bytes in flight are found again in the frame it went in."""

from __future__ import annotations

import random

from burla.head.scheduling.input_queue import MAX_PUSH_BYTES, InputQueue
from burla.head.scheduling.scheduler import Scheduler
from burla.protocol import limits
from burla.protocol.values.packed_inputs import PackedInputs, gather, pack_uints
from tests.head.test_scheduler import node, spec


def _argument(index: int, rng: random.Random) -> bytes:
    """An input's bytes: its index and a random tail, so a byte from a neighbour is noticed."""
    return index.to_bytes(4, "little") + rng.randbytes(rng.choice([0, 1, 7, 100, 3000]))


def test_pushes_are_slices_of_the_runs_in_order_within_a_frames_limits():
    rng = random.Random(3)
    queue = InputQueue()
    uploaded = {}
    start = 0
    for size in (5, limits.BATCH_ITEMS + 10, 1, 300):
        items = [[i, _argument(i, rng)] for i in range(start, start + size)]
        uploaded.update(items)
        queue.append(PackedInputs.of(items))
        start += size
    assert len(queue) == start
    taken = []
    for count in (3, 2, 7, limits.BATCH_ITEMS * 2, 10_000):
        frames = queue.take(count)
        assert sum(frame.count for frame in frames) == min(count, len(uploaded) - len(taken))
        for frame in frames:
            frame.check("frame", limits.BATCH_ITEMS)  # indices, sizes and bytes agree; a frame's worth at most
            taken += frame.items()
    assert not len(queue) and queue.take(5) == []
    assert [index for index, _ in taken] == list(range(start))
    assert {index: bytes(data) for index, data in taken} == uploaded


def test_a_frame_stops_before_the_bytes_limit_and_a_large_input_goes_alone():
    queue = InputQueue()
    sizes = [MAX_PUSH_BYTES // 3] * 4 + [MAX_PUSH_BYTES + 5] + [10] * 3
    queue.append(PackedInputs.of([[i, bytes([i]) * size] for i, size in enumerate(sizes)]))
    frames = queue.take(len(sizes))
    assert [frame.index_list() for frame in frames] == [[0, 1, 2], [3], [4], [5, 6, 7]]
    assert all(len(frame.data) <= MAX_PUSH_BYTES for frame in frames if frame.count > 1)


def test_inputs_queued_again_go_first_and_a_filtered_queue_keeps_its_order():
    queue = InputQueue()
    queue.append(PackedInputs.of([[i, b"a%d" % i] for i in range(4)]))
    queue.prepend(PackedInputs.of([[9, b"nine"], [7, b"seven"]]))
    assert list(queue) == [(9, b"nine"), (7, b"seven"), (0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"a3")]
    queue.keep(item for item in queue if item[0] % 2)
    assert list(queue) == [(9, b"nine"), (7, b"seven"), (1, b"a1"), (3, b"a3")] and len(queue) == 4
    queue.clear()
    assert not len(queue) and list(queue) == []


def test_gather_cuts_each_input_out_of_its_run_in_the_order_named():
    rng = random.Random(5)
    runs = []
    for start in (0, 50, 51):
        runs.append(PackedInputs.of([[i, _argument(i, rng)] for i in range(start, start + 50 if start != 50 else 51)]))
    originals = {index: bytes(data) for run in runs for index, data in run.items()}
    named = [(index, run) for run in runs for index in run.index_list()]
    rng.shuffle(named)
    named = named[:60]
    gathered = gather(named)
    gathered.check("gathered", 10_000)
    assert [index for index, _ in gathered.items()] == [index for index, _ in named]
    assert all(bytes(data) == originals[index] for index, data in gathered.items())
    assert gather([]).count == 0


def test_every_input_reaches_a_node_with_its_own_bytes_through_losses_retries_and_steals():
    # Random runs of random sizes, random credit, results that fail and are tried again, nodes
    # lost and coming back, and steals: each push carries each input's own bytes, and each input
    # ends done exactly once.
    for seed in range(40):
        trial = _Trial(random.Random(seed))
        trial.run()
        job = trial.job
        assert sorted(trial.done_once) == list(range(job.n_inputs)), seed
        assert set(trial.done_once.values()) == {1}, seed
        assert not len(job.pending) and not any(a.inflight for a in job.assignments.values())


class _Trial:
    NODES = ("a", "b", "c")

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.s = Scheduler()
        for node_id in self.NODES:
            self.s.add_node(node(node_id, slots=rng.randint(1, 4)))
        self.job = self.s.admit(spec(n=rng.randint(1, 3000), retries=1))
        self.uploaded: dict[int, bytes] = {}
        self.done_once: dict[int, int] = {}

    def run(self) -> None:
        job, rng = self.job, self.rng
        while job.n_done < job.n_inputs:
            step = rng.random()
            if step < 0.25:
                self.upload()
            elif step < 0.5:
                self.grant()
            elif step < 0.8:
                self.answer()
            elif step < 0.88:
                self.steal()
            elif step < 0.93:
                self.lose_a_node()
            if not job.assignments:  # every node lost: they register again
                for node_id in self.NODES:
                    self.s.add_node(node(node_id, slots=2))

    def _count(self, indices: list[int]) -> None:
        for index in indices:
            self.done_once[index] = self.done_once.get(index, 0) + 1

    def upload(self) -> None:
        start = len(self.uploaded)
        end = min(self.job.n_inputs, start + self.rng.randint(1, 700))
        items = [[i, _argument(i, self.rng)] for i in range(start, end)]
        self.uploaded.update(items)
        self.s.add_inputs(self.job, items)

    def grant(self) -> None:
        node_id = self.rng.choice(list(self.job.assignments))
        self.s.grant(node_id, "j", self.rng.randint(1, 500))
        for _, _, frame in self.s.plan_for(node_id, "j") + self.s.plan():
            assert all(bytes(data) == self.uploaded[index] for index, data in frame.items())
        self.s.take_withdrawn()

    def answer(self) -> None:
        """A node answers for some of what it holds: all succeeded (the common case) or a mixture."""
        job, rng = self.job, self.rng
        holders = [node_id for node_id, a in job.assignments.items() if a.inflight]
        if not holders:
            return
        node_id = rng.choice(holders)
        held = list(job.assignments[node_id].inflight)
        first = rng.randrange(len(held))
        answered = held[first:first + rng.randint(1, 300)]
        if rng.random() < 0.6 and self.s.record_successes(node_id, job, pack_uints(answered)):
            self._count(answered)
            return
        items = [[index, rng.random() < 0.8, b"r"] for index in answered]
        self._count([item[0] for item in self.s.record_results(node_id, job, items)])

    def steal(self) -> None:
        from burla.head.scheduling.steals import record_steal

        if len(self.job.assignments) > 1:
            thief, donor = self.rng.sample(list(self.job.assignments), 2)
            moved = list(self.job.assignments[donor].inflight)[-self.rng.randint(0, 20):]
            record_steal(thief, self.job, donor, moved)

    def lose_a_node(self) -> None:
        lost = self.rng.choice(list(self.job.assignments))
        for _, given_up in self.s.remove_node(lost):
            for index in given_up:  # the head's own word: a failure
                self._count([item[0] for item in self.s.record_results(None, self.job, [[index, False, b"gone"]])])
        self.s.add_node(node(lost, slots=self.rng.randint(1, 4)))  # the same machine registers again, empty
