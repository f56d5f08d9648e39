"""Taking a job's results on the client: each input's first result only, decoded, into the
caller's list (values in input order) or as outcomes for the caller's thread."""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Final

from burla.errors import RemoteError
from burla.protocol.environment import missing_package_note
from burla.protocol.inline_values import VALUE
from burla.protocol.serialization import loads, unpack_error

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


def take_results(items: list, received: bytearray, results: list[Any] | None,
                 packages: dict[str, str]) -> tuple[list[int], list[Outcome], int]:
    """The results not taken before (the head may resend): their indices, the outcomes for the
    caller's thread (each one, or with `results` only the failures: values go into the list),
    and how many failed. `packages` (the client's) explains a failure to import on a node."""
    if results is not None and items:
        taken_run = _take_run_of_values(items, received, results)
        if taken_run is not None:
            return taken_run, [], 0
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
                        payload = loads(payload)
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
    return taken, outcomes, failed


_index_of = itemgetter(0)
_ok_of = itemgetter(1)
_payload_of = itemgetter(2)


def _take_run_of_values(items: list, received: bytearray, results: list[Any]) -> list[int] | None:
    """The common case at C speed: a run of results, in index order, none taken before, each a
    value that travelled as itself (`inline_values`): they go into the list with one slice.
    Returns their indices, or None (nothing changed) for `take_results`' loop to sort out."""
    first, count = items[0][0], len(items)
    end = first + count
    if not (type(first) is int and 0 <= first and end <= len(received) and items[-1][0] == end - 1):
        return None
    if list(map(_ok_of, items)).count(VALUE) != count or received.count(NOT_TAKEN, first, end) != count:
        return None
    indices = list(map(_index_of, items))
    if indices != list(range(first, end)):
        return None
    results[first:end] = map(_payload_of, items)
    received[first:end] = bytes((TAKEN_VALUE,)) * count
    return indices


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
