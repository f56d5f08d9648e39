"""A job's inputs waiting on the head for a node, kept as the chunks they arrived in.

An upload batch of the client is queued as one chunk: a list of its indices and a list of its
pickled arguments, from which pushes to nodes take slices. Per input, that costs the head a
few list slots instead of a tuple and two deque operations; and the cyclic GC, which tracks
every tuple until its next young collection, sees a handful of lists instead of an object per
queued input (at a few hundred thousand inputs a second, those visits were most of its pauses).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter

from burla.protocol.framing import Payload

_index_of = itemgetter(0)
_data_of = itemgetter(1)


class _Chunk:
    __slots__ = ("indices", "data", "start")

    def __init__(self, indices: list[int], data: list[Payload]) -> None:
        self.indices = indices
        self.data = data
        self.start = 0  # what comes before was taken


class InputQueue:
    __slots__ = ("_chunks", "_count")

    def __init__(self) -> None:
        self._chunks: deque[_Chunk] = deque()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[int, Payload]]:
        for chunk in self._chunks:
            yield from zip(chunk.indices[chunk.start:], chunk.data[chunk.start:])

    def extend(self, items: Sequence[Sequence]) -> None:
        """Queue [index, data] pairs at the back, in order."""
        if items:
            self.extend_lists(list(map(_index_of, items)), list(map(_data_of, items)))

    def extend_lists(self, indices: list[int], data: list[Payload]) -> None:
        """Queue inputs at the back, given as their indices and their data (lists this queue keeps)."""
        if indices:
            self._chunks.append(_Chunk(indices, data))
            self._count += len(indices)

    def extend_front(self, items: Sequence[tuple[int, Payload]]) -> None:
        """Queue pairs at the front, in order (inputs coming back from a lost node go first)."""
        if items:
            self._chunks.appendleft(_Chunk([index for index, _ in items], [data for _, data in items]))
            self._count += len(items)

    def take(self, count: int) -> tuple[list[int], list[Payload]]:
        """Up to `count` inputs from the front: their indices and their data."""
        chunks = self._chunks
        if not chunks or count <= 0:
            return [], []
        chunk = chunks[0]
        end = chunk.start + count
        if end < len(chunk.indices):  # the common case: a slice of the first chunk
            indices, data = chunk.indices[chunk.start:end], chunk.data[chunk.start:end]
            chunk.data[chunk.start:end] = [None] * count  # type: ignore[list-item]  # the chunk lets go of them
            chunk.start = end
            self._count -= count
            return indices, data
        indices, data = [], []
        while chunks and len(indices) < count:
            chunk = chunks[0]
            end = chunk.start + count - len(indices)
            indices += chunk.indices[chunk.start:end]
            data += chunk.data[chunk.start:end]
            if end >= len(chunk.indices):
                chunks.popleft()
            else:
                chunk.data[chunk.start:end] = [None] * (end - chunk.start)  # type: ignore[list-item]
                chunk.start = end
        self._count -= len(indices)
        return indices, data

    def keep(self, pairs: Iterable[tuple[int, Payload]]) -> None:
        """Replace the contents with `pairs` (a filtered iteration over this queue)."""
        kept = list(pairs)
        self.clear()
        self.extend(kept)

    def clear(self) -> None:
        self._chunks.clear()
        self._count = 0
