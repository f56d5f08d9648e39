"""Pickling of user functions, inputs, results and exceptions.

User objects are cloudpickle bytes, opaque to everything between the client and the worker.
Plain values take the much faster standard pickle; anything else takes cloudpickle, which
pickles functions and classes from `__main__` by value so workers can load them.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple

import cloudpickle

from burla import errors
from burla.errors import ProtocolError, RemoteError, UnpicklableFunction
from burla.protocol import wire
from burla.protocol.values.pickle_parts import PickleParts, dumps_in_parts, likely_large

PROTOCOL = pickle.HIGHEST_PROTOCOL
_DYNAMIC_CODE = "<dynamic-code>"  # cloudpickle's file name for functions pickled by value
_PLAIN = frozenset({int, float, str, bytes, bool, type(None), complex})


def _is_plain(value: Any) -> bool:
    tp = type(value)
    if tp in _PLAIN:
        return True
    if tp is tuple or tp is list:
        return len(value) <= 16 and all(type(v) in _PLAIN for v in value)
    return False


def dumps(value: Any) -> bytes:
    """Pickle any user value; raises the pickling error unchanged."""
    if _is_plain(value):
        return pickle.dumps(value, PROTOCOL)
    return cloudpickle.dumps(value, PROTOCOL)


def dumps_input(value: Any) -> bytes | PickleParts:
    """Pickle a user's input: in parts where it holds a large buffer (pickle_parts), else as
    `dumps`. Raises the pickling error unchanged."""
    if not likely_large(value):
        return dumps(value)
    return dumps_in_parts(value, pickle.Pickler if _is_plain(value) else cloudpickle.Pickler, PROTOCOL)


def dumps_result(value: Any) -> bytes:
    """Pickle a call's return value in a worker: by reference where that works, else by value."""
    if _is_plain(value):
        return pickle.dumps(value, PROTOCOL)
    try:
        return pickle.dumps(value, PROTOCOL)
    except Exception:
        return cloudpickle.dumps(value, PROTOCOL)


loads = pickle.loads


def dumps_function(function: Callable[..., Any]) -> bytes:
    """Pickle the user's function, naming the culprit when something it references can't be."""
    try:
        return cloudpickle.dumps(function, PROTOCOL)
    except Exception as e:
        culprit = _find_unpicklable_reference(function)
        name = getattr(function, "__qualname__", repr(function))
        where = f" through {culprit}" if culprit else ""
        raise UnpicklableFunction(
            f"Function {name!r} can't be pickled{where}: {type(e).__name__}: {e}. Create objects "
            "such as locks, clients, sockets or open files inside the function instead of "
            "referencing them from the enclosing scope."
        ) from e


def _find_unpicklable_reference(function: Callable[..., Any]) -> str | None:
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    candidates: list[tuple[str, Any]] = []
    for name, cell in zip(code.co_freevars, getattr(function, "__closure__", None) or ()):
        try:
            candidates.append((f"the closure variable {name!r}", cell.cell_contents))
        except ValueError:
            continue
    module_globals = getattr(function, "__globals__", {})
    for name in code.co_names:
        if name in module_globals:
            candidates.append((f"the global {name!r}", module_globals[name]))
    for description, value in candidates:
        try:
            cloudpickle.dumps(value, PROTOCOL)
        except Exception:
            return f"{description} ({type(value).__name__})"
    return None


# --- exceptions ----------------------------------------------------------------------------


def _traceback_dict(tb: TracebackType | None) -> dict | None:
    """tblib's dict of a traceback, with the real file name of functions pickled by value."""
    if tb is None:
        return None
    from tblib import Traceback

    tb_dict = Traceback(tb).as_dict()
    frame_dict: dict | None = tb_dict
    while frame_dict is not None:
        frame = frame_dict["tb_frame"]
        if frame["f_code"]["co_filename"] == _DYNAMIC_CODE and frame["f_globals"].get("__file__"):
            frame["f_code"]["co_filename"] = frame["f_globals"]["__file__"]
        frame_dict = frame_dict["tb_next"]
    return tb_dict


class ErrorOrigin(NamedTuple):
    """Where a call failed: its node, that node's host, and the worker process."""

    node_id: str
    host: str
    worker_pid: int


def pack_error(exc: BaseException, skip_frames: int = 0, origin: ErrorOrigin | None = None) -> bytes:
    """Pack a raised exception for the trip to the client (in a worker or node)."""
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    try:
        tb_dict = _traceback_dict(tb)
        from tblib import Traceback

        shown_tb = Traceback.from_dict(tb_dict).as_traceback() if tb_dict else tb
    except Exception:
        tb_dict, shown_tb = None, tb
    text = "".join(traceback.format_exception(type(exc), exc, shown_tb))
    exc_bytes: bytes | None
    try:
        exc_bytes = cloudpickle.dumps(exc.with_traceback(None), PROTOCOL)
        pickle.loads(exc_bytes)  # custom __init__ signatures can pickle but not unpickle
    except Exception:
        exc_bytes = None
    finally:
        exc.with_traceback(tb)
    record = wire.ErrorRecord(type(exc).__qualname__, type(exc).__module__, str(exc), text, exc_bytes, tb_dict,
                              *(origin or ("", "", 0)))
    try:
        return record.encode()
    except Exception:  # a traceback dict msgpack can't carry: the text still tells the story
        return record.replace(frames=None).encode()


def _rebuild(record: wire.ErrorRecord) -> BaseException | None:
    if record.exception is not None:
        try:
            exc = pickle.loads(record.exception)
            if isinstance(exc, BaseException):
                return exc
        except Exception:
            pass
    if record.module == errors.__name__:  # burla's own errors travel by name (the head never pickles)
        cls = getattr(errors, record.type_name, None)
        if isinstance(cls, type) and issubclass(cls, errors.BurlaError):
            try:
                return cls(record.message)
            except TypeError:
                return None
    return None


def unpack_error(payload: bytes, input_index: int) -> BaseException:
    """Re-create a remote exception with its remote traceback and `burla_input_index`."""
    try:
        record = wire.read_error(payload)
    except ProtocolError as e:
        return RemoteError("burla.errors.ProtocolError", f"a failed call's error could not be read: {e}")
    exc = _rebuild(record)
    if exc is None:
        exc = RemoteError(record.qualified_name, record.message, record.traceback)
    if record.frames:
        try:
            from tblib import Traceback

            exc = exc.with_traceback(Traceback.from_dict(record.frames).as_traceback())
        except Exception:
            pass
    try:
        exc.burla_input_index = input_index  # type: ignore[attr-defined]
        exc.burla_traceback = record.traceback  # type: ignore[attr-defined]
        exc.burla_node_id = record.node_id  # type: ignore[attr-defined]
        exc.burla_host = record.host  # type: ignore[attr-defined]
        exc.burla_worker_pid = record.worker_pid  # type: ignore[attr-defined]
        exc.burla_attempts = record.attempts  # type: ignore[attr-defined]
    except AttributeError:  # exceptions with __slots__
        pass
    exc.add_note(failure_note(input_index, record))  # PEP 678: shown under the traceback
    return exc


def failure_note(input_index: int, record: wire.ErrorRecord) -> str:
    """`[burla] failed on input index N on node NODE (host H, worker pid P)`."""
    if not record.node_id:
        return f"[burla] failed on input index {input_index}"
    details = [f"host {record.host}"] if record.host else []
    if record.worker_pid:
        details.append(f"worker pid {record.worker_pid}")
    where = f" ({', '.join(details)})" if details else ""
    tries = f" after {record.attempts} attempts" if record.attempts > 1 else ""
    return f"[burla] failed on input index {input_index} on node {record.node_id}{where}{tries}"
