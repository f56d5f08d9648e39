"""Tracebacks that start at the user's code: an exception that reaches the user through burla
(a call's own, re-raised with its remote traceback, or burla's) loses the frames of burla's
client machinery between the user's call and where it was raised; those say nothing about the
user's code. `BURLA_FULL_TRACEBACKS=1` keeps them (for debugging burla itself)."""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

ENV_FULL_TRACEBACKS = "BURLA_FULL_TRACEBACKS"
_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep

F = TypeVar("F", bound=Callable[..., Any])


def _is_burlas(tb: types.TracebackType) -> bool:
    return tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR)


def without_burla_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback `tb` without the entries of burla's own modules, in order."""
    kept = []
    while tb is not None:
        if not _is_burlas(tb):
            kept.append(tb)
        tb = tb.tb_next
    trimmed: types.TracebackType | None = None
    for entry in reversed(kept):
        trimmed = types.TracebackType(trimmed, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return trimmed


def _trimming() -> bool:
    return os.environ.get(ENV_FULL_TRACEBACKS, "") in ("", "0")


def user_facing(function: F) -> F:
    """Raise what `function` raises with burla's frames taken out of its traceback (the re-raise
    here adds this one frame: where the user's call entered burla)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as e:
            if _trimming():
                raise e.with_traceback(without_burla_frames(e.__traceback__))  # noqa: B904 - itself, chain kept
            raise

    return wrapper  # type: ignore[return-value]


def user_facing_iterator(iterator: Iterable[Any]) -> Iterator[Any]:
    """`iterator`, whose exceptions reach the user as `user_facing` raises them."""
    try:
        yield from iterator
    except Exception as e:
        if _trimming():
            raise e.with_traceback(without_burla_frames(e.__traceback__))  # noqa: B904 - itself, chain kept
        raise
