"""Taking a job's results on the client: each input's first result only, decoded, into the
caller's list (values in input order) or as outcomes for the caller's thread."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from itertools import count as count_from
from operator import ne
from typing import Any, Final

from burla.errors import RemoteError
from burla.protocol.direct_inputs import PLACEHOLDER_BYTES
from burla.protocol.direct_results import value_of
from burla.protocol.replication.environment import missing_package_note
from burla.protocol.values.serialization import loads, unpack_error

# (input index, ok, the result or the exception the call raised). A plain tuple: a million are
# made per million-input job, and a NamedTuple's constructor costs ten times as much.
Outcome = tuple[int, bool, Any]

# What the client holds of each input, one byte per input (sent to a restarted head, compressed,
# as what it already has: anything but NOT_TAKEN counts as taken).
NOT_TAKEN: Final = 0
TAKEN_VALUE: Final = 1
TAKEN_FAILURE: Final = 2


class AllIn:
    """Handed to the caller's thread once every value is in its results list (failures, if any,
    came before as outcomes)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ALL_IN"


ALL_IN: Final = AllIn()


def take_results(items: list, received: bytearray, results: list[Any] | None, packages: dict[str, str],
                 values: tuple[tuple, tuple] | None = None, arrived: dict[int, Any] | None = None
                 ) -> tuple[Sequence[int], list[Outcome], int]:
    """The results not taken before (the head may resend): their indices, the outcomes for the
    caller's thread (each one, or with `results` only the failures: values go into the list),
    and how many failed. `packages` (the client's) explains a failure to import on a node.
    `values`: where every result is a value that travelled as itself, their indices and values
    (ResultBatch.values). `arrived`: the values of large results that came straight from their
    nodes, which a placeholder among `items` stands for (burla.protocol.direct_results)."""
    if results is not None and values is not None:
        taken_runs = _take_runs_of_values(*values, received, results)
        if taken_runs is not None:
            return taken_runs, [], 0
    n_inputs = len(received)
    taken: list[int] = []
    outcomes: list[Outcome] = []
    failed = 0
    for index, ok, payload in items:  # once per result: kept to the bare minimum
        if 0 <= index < n_inputs and not received[index]:
            taken.append(index)
            if ok:
                if ok is True:  # a pickle; else (VALUE) the value itself, decoded with the frame
                    try:
                        payload = (loads(payload) if len(payload) != PLACEHOLDER_BYTES or arrived is None
                                   else value_of(index, payload, arrived))
                    except Exception as e:
                        error = _unpickling_error(index, e)
                        ok = False
                if ok:
                    received[index] = TAKEN_VALUE
                    if results is None:
                        outcomes.append((index, True, payload))
                    else:
                        results[index] = payload
                    continue
            else:
                error = _call_error(index, payload, packages)
            received[index] = TAKEN_FAILURE
            failed += 1
            if results is not None:
                results[index] = error
            outcomes.append((index, False, error))
    _forget_taken(arrived, taken)
    return taken, outcomes, failed


def _forget_taken(arrived: dict[int, Any] | None, taken: list[int]) -> None:
    """What came straight for results taken whole through the head (their receipt was lost) is
    not kept."""
    if arrived:
        for index in taken:
            arrived.pop(index, None)


def _take_runs_of_values(indices: tuple, values: tuple, received: bytearray, results: list[Any]
                         ) -> tuple | None:
    """The common case at C speed: runs of values in index order (a frame holds a run per
    worker's report, as nodes and the head join them), none taken before: each run goes into the
    list with one slice. Returns their indices, or None (nothing changed) for `take_results`' loop
    to sort out."""
    spans = index_runs(indices)
    if spans is None:
        return None
    n_inputs, end_before = len(received), -1
    for _, first, length in sorted(spans, key=_first_of_span):
        # In the job, none taken, no index in two runs (the head may send one again).
        if first < 0 or first < end_before or first + length > n_inputs \
                or received.count(NOT_TAKEN, first, first + length) != length:
            return None
        end_before = first + length
    for at, first, length in spans:
        end = first + length
        results[first:end] = values[at:at + length]
        received[first:end] = bytes((TAKEN_VALUE,)) * length
    return indices


def _first_of_span(span: tuple[int, int, int]) -> int:
    return span[1]


MAX_RUNS = 64  # indices in more, shorter runs are quicker gone through one by one


def index_runs(indices: Sequence[int]) -> list[tuple[int, int, int]] | None:
    """Input indices (a list or a tuple of ints) cut into runs (first, first+1, ...): where each
    starts in `indices`, its first index and its length; None for more than MAX_RUNS runs. Each
    run's end is found by bisection, then the run checked whole at C speed; where indices further
    on misled the bisection (a later run that happens to sit in this one's place), the run ends at
    its first mismatch (the bisection's end is never short of the true one)."""
    spans: list[tuple[int, int, int]] = []
    at, count = 0, len(indices)
    same_kind = tuple if type(indices) is tuple else list
    while at < count:
        if len(spans) == MAX_RUNS:
            return None
        first = indices[at]
        offset = first - at  # indices[k] == k + offset all through the run
        end = count
        if indices[-1] != count - 1 + offset:
            inside, outside = at, count - 1  # indices[inside] is in the run, indices[outside] is not
            while outside - inside > 1:
                middle = (inside + outside) // 2
                if indices[middle] == middle + offset:
                    inside = middle
                else:
                    outside = middle
            end = inside + 1
        run, expected = indices[at:end], same_kind(range(first, end + offset))
        if run != expected:
            end = at + next(compress(count_from(), map(ne, run, expected)))
        spans.append((at, first, end - at))
        at = end
    return spans


def _call_error(index: int, payload: bytes, packages: dict[str, str]) -> BaseException:
    error = unpack_error(payload, index)
    if isinstance(error, ImportError) and error.name:
        note = missing_package_note(error.name, packages)
        if note is not None:
            error.add_note(note)
    return error


def _unpickling_error(index: int, e: Exception) -> BaseException:
    error = RemoteError(type(e).__name__, f"the result of input {index} can't be unpickled here: {e}")
    error.burla_input_index = index  # type: ignore[attr-defined]
    return error
