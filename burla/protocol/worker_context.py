"""What code running inside a worker can tell its node.

A call that starts a nested `remote_parallel_map` and waits for it is not using its core; the
node lends that slot to another worker meanwhile, so parents waiting on children never hold
every slot hostage (no deadlock however deep the nesting).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

_notify: Callable[[bool], None] | None = None


def set_notifier(notify: Callable[[bool], None] | None) -> None:
    global _notify
    _notify = notify


@contextlib.contextmanager
def waiting_on_children() -> Iterator[None]:
    """Mark this worker as waiting (not computing) for the duration of the block."""
    notify = _notify
    if notify is None:  # not inside a worker
        yield
        return
    notify(True)
    try:
        yield
    finally:
        notify(False)
