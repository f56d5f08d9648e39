"""A job's inputs waiting on the head for a node, kept where the cyclic GC does not look.

Indices and pickled arguments sit in two deques of ints and bytes, which the collector does not
track. A tuple per queued input was tracked until the next collection of the young generation
visited it; at a few hundred thousand inputs a second through a head with 1,000 nodes those
visits were the larger part of its GC pauses (tens of milliseconds each).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter

_index_of = itemgetter(0)
_data_of = itemgetter(1)


class InputQueue:
    __slots__ = ("_indices", "_data")

    def __init__(self) -> None:
        self._indices: deque[int] = deque()
        self._data: deque[bytes] = deque()

    def __len__(self) -> int:
        return len(self._indices)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return zip(self._indices, self._data)

    def extend(self, items: Sequence[Sequence]) -> None:
        """Queue [index, data] pairs at the back, in order."""
        self._indices.extend(map(_index_of, items))
        self._data.extend(map(_data_of, items))

    def extend_front(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Queue pairs at the front, in order (inputs coming back from a lost node go first)."""
        self._indices.extendleft(reversed([index for index, _ in items]))
        self._data.extendleft(reversed([data for _, data in items]))

    def pop(self) -> tuple[int, bytes]:
        """The front pair."""
        return self._indices.popleft(), self._data.popleft()

    def keep(self, pairs: Iterable[tuple[int, bytes]]) -> None:
        """Replace the contents with `pairs` (a filtered iteration over this queue)."""
        kept = list(pairs)
        self._indices = deque(map(_index_of, kept))
        self._data = deque(map(_data_of, kept))

    def clear(self) -> None:
        self._indices.clear()
        self._data.clear()
