"""What the head keeps of inputs in flight (burla.head.scheduling.inflight), checked against a plain model:
a dict of which share holds each input. Also `run_first`, which the fast paths rest on, and
`mark_fresh` on a node's results in parts."""

from __future__ import annotations

import random
import zlib

import pytest

from burla.head.scheduling.inflight import Holders, InFlight
from burla.head.scheduling.records import Assignment, JobRecord, mark_fresh
from burla.protocol.values.packed_inputs import PackedInputs, gather, pack_uints, run_first
from tests.head.test_scheduler import spec


def _is_run(indices: list[int]) -> bool:
    return bool(indices) and indices == list(range(indices[0], indices[0] + len(indices)))


def test_run_first_agrees_with_a_plain_check():
    rng = random.Random(7)
    for _ in range(3000):
        length = rng.choice([1, 2, 3, 17, 255, 256, 257, 1000, 4096, 4097, 5000])
        first = rng.choice([0, 1, 255, 65535, 2**24 - 3, 2**32 - length, rng.randrange(2**32 - length)])
        indices = list(range(first, first + length))
        change = rng.random()
        if change < 0.2 and length > 1:
            a, b = rng.sample(range(length), 2)
            indices[a], indices[b] = indices[b], indices[a]
        elif change < 0.4:
            at = rng.randrange(length)
            indices[at] = (indices[at] + rng.choice([1, -1, 2**31, 2**32 - 1])) % 2**32
        elif change < 0.5 and length > 1:
            indices[rng.randrange(1, length)] = indices[0]
        expected = indices[0] if _is_run(indices) else -1
        assert run_first(pack_uints(indices)) == expected, (first, length, change)
    assert run_first(b"") == -1 and run_first(b"\x00\x00\x00") == -1
    # A word that wraps past 2**32 - 1 is no run, though the integers would carry into place.
    assert run_first(pack_uints([2**32 - 1, 0, 2])) == -1


def _frame(indices: list[int]) -> PackedInputs:
    return PackedInputs.of_lists(indices, [f"args {i}".encode() for i in indices])


def _bytes_of(index: int, frame: PackedInputs | None) -> bytes:
    assert frame is not None
    return bytes(gather([(index, frame)]).data)


class _Model:
    """Shares of one job's inputs, and the dict they must agree with."""

    def __init__(self, rng: random.Random, n: int, shares: int) -> None:
        self.rng = rng
        self.holders = Holders()
        self.holders.cover(n)
        self.shares = [self.holders.new_share() for _ in range(shares)]
        self.holder: dict[int, InFlight] = {}
        self.queued = list(range(n))

    def check(self) -> None:
        for share in self.shares:
            mine = sorted(i for i, s in self.holder.items() if s is share)
            assert len(share) == len(mine) and sorted(share) == mine
            held = share.held()
            assert sorted(held) == mine
            assert all(_bytes_of(i, frame) == f"args {i}".encode() for i, frame in held.items())

    def push(self) -> None:
        if not self.queued:
            return
        share = self.rng.choice(self.shares)
        count = min(len(self.queued), self.rng.randint(1, 40))
        if self.rng.random() < 0.7:
            taken, self.queued = self.queued[:count], self.queued[count:]  # runs, mostly
        else:
            taken = self.rng.sample(self.queued, count)
            self.queued = [i for i in self.queued if i not in set(taken)]
        share.add_run(_frame(taken))
        self.holder.update(dict.fromkeys(taken, share))

    def answer(self) -> None:
        share = self.rng.choice(self.shares)
        mine = sorted(i for i, s in self.holder.items() if s is share)
        if not mine:
            return
        start = self.rng.randrange(len(mine))
        some = mine[start:start + self.rng.randint(1, 200)]
        if self.rng.random() < 0.2:  # a result of an input held elsewhere
            some = some + [self.rng.choice(list(self.holder))]
            if len(set(some)) != len(some):
                return  # twice: mark_fresh finds that before it asks
        honest = all(self.holder.get(i) is share for i in some)
        if _is_run(some) and self.rng.random() < 0.7:
            assert share.holds(some[0], some[-1] + 1) == honest
            if honest:
                share.release([(some[0], some[-1] + 1)])
        else:
            assert share.release_each(some) == honest
        if honest:
            for i in some:
                del self.holder[i]

    def move(self) -> None:
        """A steal, or a failed try queued again."""
        if not self.holder:
            return
        index = self.rng.choice(list(self.holder))
        donor = self.holder[index]
        frame = donor.take(index)
        assert _bytes_of(index, frame) == f"args {index}".encode()
        assert donor.take(index) is None
        del self.holder[index]
        if self.rng.random() < 0.5:
            thief = self.rng.choice(self.shares)
            thief.add(index, frame)  # type: ignore[arg-type]
            self.holder[index] = thief
        else:
            self.queued.append(index)

    def lose(self) -> None:
        share = self.rng.choice(self.shares)
        mine = {i for i, s in self.holder.items() if s is share}
        held = share.close()
        assert set(held) == mine
        assert all(_bytes_of(i, frame) == f"args {i}".encode() for i, frame in held.items())
        for i in mine:
            del self.holder[i]
        self.queued.extend(sorted(mine))
        self.shares.remove(share)
        self.shares.append(self.holders.new_share())
        assert all(self.holders.holder(i) == 0 for i in mine)


@pytest.mark.parametrize("seed", range(6))
def test_shares_agree_with_a_dict_of_holders(seed):
    rng = random.Random(seed)
    model = _Model(rng, 5000, 3)
    steps = [model.push] * 4 + [model.answer] * 5 + [model.move] * 2 + [model.lose] * 1 * (seed % 2)
    for step in range(1000):
        rng.choice(steps)()
        if step % 20 == 0:
            model.check()
    model.check()


def _share(inputs: int) -> InFlight:
    """A node's share of a job of this many inputs, holding none yet."""
    holders = Holders()
    holders.cover(inputs)
    return holders.new_share()


def test_a_share_keeps_few_frames_while_results_come_in_order():
    share = _share(100_000)
    for first in range(0, 100_000, 10):
        share.add_run(_frame(list(range(first, first + 10))))
        if first >= 50:
            done = first - 50
            assert share.holds(done, done + 10)
            share.release([(done, done + 10)])
    assert len(share) == 50 and len(share._sent) <= 6
    # Results out of order: the frames still held stay; the others go when the share looks through them all.
    for first in range(100_000 - 50, 100_000, 10):
        share.release_each(list(range(first, first + 10))[::-1])
    assert len(share) == 0 and len(share._sent) <= 1


def test_a_share_drops_only_frames_it_holds_nothing_of():
    # Each frame keeps one input in flight, not its first: the oldest can't go, so the share
    # looks through them all, again and again as they double, and must keep every one.
    rng = random.Random(3)
    share = _share(10_000)
    kept = set()
    for first in range(0, 10_000, 10):
        frame = list(range(first, first + 10)) if first % 20 else rng.sample(range(first, first + 10), 10)
        share.add_run(_frame(frame))
        keep = first + rng.randrange(1, 10)
        kept.add(keep)
        assert share.release_each([i for i in frame if i != keep])
    assert sorted(share) == sorted(kept) and len(share._sent) < 2 * len(kept) + 100
    for index in rng.sample(sorted(kept), 50):
        assert _bytes_of(index, share.take(index)) == f"args {index}".encode()
        kept.discard(index)
    held = share.close()
    assert sorted(held) == sorted(kept)
    assert all(_bytes_of(i, frame) == f"args {i}".encode() for i, frame in held.items())


def test_the_rare_paths_table_keeps_no_frame_that_went():
    # A steady job where a try runs again now and then: what the table names stays near what is
    # in flight, not everything pushed since the share last ran empty.
    share = _share(100_000)
    for first in range(0, 50_000, 100):
        share.add_run(_frame(list(range(first, first + 100))))
        if first >= 300:
            done = first - 300
            if done % 1000 == 0:  # one input of the oldest frame fails and is queued again
                assert _bytes_of(done, share.take(done)) == f"args {done}".encode()
                assert share.release_each(list(range(done + 1, done + 100)))
            else:
                share.release([(done, done + 100)])
    assert len(share) == 300 and len(share._sent) <= 4 and len(share._lookup) <= 400
    assert all(_bytes_of(i, share.take(i)) == f"args {i}".encode() for i in (49_700, 49_999))


def test_a_resumed_jobs_holders_cover_its_inputs():
    from burla.head.scheduling.held_inputs import mark_client_held

    job = JobRecord(spec(n=1000))
    job.restored = True
    mark_client_held(job, zlib.compress(bytes(1000)))
    assert len(job.holders.numbers) >= 1000
    share = Assignment.first(job.holders, 2, 2).inflight
    share.add_run(_frame(list(range(200, 300))))
    assert share.holds(200, 300) and share._sent[0][1] == 200  # kept as a run
    with pytest.raises(ValueError, match="negative"):
        job.holders.set(-1, share.number)


def test_an_ended_job_holds_nothing():
    holders = Holders()
    share = holders.new_share()
    share.add_run(_frame([0, 1, 2]))
    holders.clear()
    assert len(share) == 0 and 1 not in share and share.take(1) is None and not share.holds(0, 3)


def _job_with(pushed: dict[str, list[int]], n: int = 200) -> tuple[JobRecord, dict[str, Assignment]]:
    job = JobRecord(spec(n=n))
    job.cover(n)
    shares = {}
    for node_id, indices in pushed.items():
        shares[node_id] = job.assignments[node_id] = Assignment.first(job.holders, 2, 2)
        shares[node_id].inflight.add_run(_frame(indices))
    return job, shares


def test_results_in_parts_are_marked_run_by_run():
    job, shares = _job_with({"a": list(range(0, 128)), "b": list(range(128, 200))})
    a = shares["a"]
    # Two workers' reports in one frame, the second worker's first: two runs.
    parts = list(range(64, 100)) + list(range(0, 41))
    assert mark_fresh(job, a, pack_uints(parts), pack_uints([36, 41]))
    assert job.n_done == 77 and bytes(job.done[:128]) == bytes([1] * 41 + [0] * 23 + [1] * 36 + [0] * 28)
    assert sorted(a.inflight) == list(range(41, 64)) + list(range(100, 128))
    # Told as one part, the same kind of frame is sorted into one run, or checked input by input.
    assert mark_fresh(job, a, pack_uints(list(range(50, 64)) + list(range(41, 50))))
    assert mark_fresh(job, a, pack_uints([127, 100, 120]))
    assert job.n_done == 77 + 23 + 3


@pytest.mark.parametrize("parts, runs", [
    (list(range(0, 10)) + list(range(5, 15)), [10, 10]),  # parts overlap: an input twice
    (list(range(120, 140)), [20]),  # inputs 128.. are another node's
    (list(range(0, 10)) + [150], [10, 1]),  # one of them is
    (list(range(0, 10)) + [3], [11]),  # not a run, and an input twice
    (list(range(0, 10)) + [200], [11]),  # past the job's inputs
])
def test_results_a_node_may_not_give_change_nothing(parts, runs):
    job, shares = _job_with({"a": list(range(0, 128)), "b": list(range(128, 200))})
    assert not mark_fresh(job, shares["a"], pack_uints(parts), pack_uints(runs))
    assert job.n_done == 0 and not any(job.done) and len(shares["a"].inflight) == 128


@pytest.mark.parametrize("runs", [[4, 4], [0, 10], [3, 3, 4], [20]])
def test_parts_are_only_a_hint(runs):
    # The indices are what is checked: parts that do not cut them into runs cost a slower look.
    job, shares = _job_with({"a": list(range(0, 128))})
    assert mark_fresh(job, shares["a"], pack_uints([5, 6, 7, 0, 1, 2, 3, 4, 8, 9]), pack_uints(runs))
    assert job.n_done == 10 and bytes(job.done[:11]) == bytes([1] * 10 + [0])
