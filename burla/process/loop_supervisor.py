"""Background loops that outlive their own bugs, and shutdowns that finish every step.

A head or node runs several loops for its whole life (reaping silent nodes, stealing hints,
memory and CPU guards...). An exception in one used to end it silently for the rest of the
process's life. Under a `LoopSupervisor` a crash is logged with its traceback, counted, and the
loop starts again after a backoff that doubles on repeated crashes (a loop that keeps
crashing at once must not spin) and starts over once it has run a while.

(Processes are restarted by `burla.process.supervisor`; this module restarts loops inside one.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0  # a loop that ran this long before crashing starts again at the first backoff

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


@dataclass
class LoopRecord:
    """What `/v1/cluster` shows of one supervised loop."""

    name: str
    restarts: int = 0
    last_error: str | None = None
    last_crash_at: float | None = None  # wall-clock time of the last crash
    running: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    fault: asyncio.Future[None] | None = field(default=None, repr=False)

    def view(self) -> dict[str, Any]:
        return {"name": self.name, "running": self.running, "restarts": self.restarts,
                "last_error": self.last_error, "last_crash_at": self.last_crash_at}


class LoopSupervisor:
    """Owns background loops: starts each, restarts it when it crashes, cancels all on close.

    `spawn` creates the tasks (a TaskGroup's `create_task`, so that they live in it), by default
    `asyncio.create_task`.
    """

    def __init__(self, log: logging.Logger, spawn: Spawn | None = None, first_backoff_s: float = FIRST_BACKOFF_S,
                 max_backoff_s: float = MAX_BACKOFF_S, healthy_after_s: float = HEALTHY_AFTER_S,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._log = log
        self._sleep = sleep  # the backoff's clock
        self._spawn: Spawn = spawn or asyncio.create_task
        self._first_backoff_s = first_backoff_s
        self._max_backoff_s = max_backoff_s
        self._healthy_after_s = healthy_after_s
        self._loops: dict[str, LoopRecord] = {}
        self._closing = False

    def start(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run `run()` until it returns; each crash is logged and it is called again."""
        if name in self._loops:
            raise ValueError(f"a loop named {name!r} is already supervised")
        if self._closing:
            raise RuntimeError(f"can't start {name!r}: the supervisor is closing")
        record = LoopRecord(name)
        self._loops[name] = record
        record.task = self._spawn(self._keep_running(record, run))
        record.task.set_name(f"supervised-{name}")

    def names(self) -> list[str]:
        return list(self._loops)

    def restarts(self) -> dict[str, int]:
        return {name: record.restarts for name, record in self._loops.items()}

    def view(self) -> list[dict[str, Any]]:
        return [record.view() for record in self._loops.values()]

    def inject_fault(self, name: str, error: Exception) -> None:
        """Make the loop crash with `error` now, as if it had raised it (the supervision's test)."""
        record = self._loops.get(name)
        if record is None:
            raise KeyError(f"no supervised loop named {name!r}; there are {sorted(self._loops)}")
        if record.fault is None or record.fault.done():
            raise RuntimeError(f"the loop {name!r} is not running now")
        record.fault.set_exception(error)

    async def close(self) -> None:
        """Cancel every loop and wait until each has ended."""
        self._closing = True
        tasks = [record.task for record in self._loops.values() if record.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _keep_running(self, record: LoopRecord, run: Callable[[], Awaitable[None]]) -> None:
        backoff = self._first_backoff_s
        while True:
            started = time.monotonic()
            try:
                await self._run_once(record, run)
                return  # it ended by itself: its work is done
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any bug in a loop: logged, counted, restarted
                record.restarts += 1
                record.last_error = f"{type(e).__name__}: {e}"
                record.last_crash_at = time.time()
                if time.monotonic() - started >= self._healthy_after_s:
                    backoff = self._first_backoff_s
                self._log.error("background loop %r crashed (restart %d in %.1f s)", record.name, record.restarts,
                                backoff, exc_info=e)
            await self._sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)

    @staticmethod
    async def _run_once(record: LoopRecord, run: Callable[[], Awaitable[None]]) -> None:
        """One life of the loop, in a task of its own beside a future that a fault injection fails."""
        loop = asyncio.get_running_loop()
        record.fault = loop.create_future()
        inner = asyncio.ensure_future(run())
        record.running = True
        try:
            await asyncio.wait((inner, record.fault), return_when=asyncio.FIRST_COMPLETED)
            if record.fault.done():
                inner.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await inner
                record.fault.result()  # raises the injected error
            await inner
        finally:
            record.running = False
            if not inner.done():
                inner.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await inner
            if not record.fault.done():
                record.fault.cancel()


async def run_every_step(log: logging.Logger, steps: list[tuple[str, Callable[[], Awaitable[object]]]]) -> list[str]:
    """Run shutdown steps in order; one that fails is logged and the rest still run. Returns the
    names of the steps that failed."""
    failed = []
    for name, step in steps:
        try:
            await step()
        except Exception as e:  # noqa: BLE001 - every later step must still run
            failed.append(name)
            log.error("shutdown step %r failed", name, exc_info=e)
    return failed


async def end_tasks(log: logging.Logger, *tasks: asyncio.Task[Any] | None) -> None:
    """Cancel these tasks and wait until they have ended. One that had failed before is logged
    with its traceback instead of vanishing (cancelling it would hide why it stopped)."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    outcomes = await asyncio.gather(*live, return_exceptions=True)
    for task, outcome in zip(live, outcomes):
        if isinstance(outcome, ConnectionError):
            log.debug("task %r ended with its connection: %s", task.get_name(), outcome)  # a peer went away
        elif isinstance(outcome, Exception):
            log.error("task %r had failed", task.get_name(), exc_info=outcome)
