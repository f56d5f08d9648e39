"""What the user sees while a job runs: remote prints, live, and a one-line progress display.

The progress line is drawn only on a TTY (and only with spinner=True). Remote output is
written above it, so the line never tears what a call printed.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from burla.protocol.states import BootStage
from burla.protocol.wire import STDERR


def booting_stages(stages: dict[str, int]) -> str:
    """How many booting machines are at each stage, furthest first: " (2 installing, 1 ssh)"."""
    order = [str(stage) for stage in BootStage]
    known = sorted((stage for stage in stages if stage in order), key=order.index, reverse=True)
    return f" ({', '.join(f'{stages[stage]} {stage}' for stage in known)})" if known else ""

REDRAW_EVERY_S = 0.1


class Display:
    def __init__(
        self, total: int, show_progress: bool, stdout: TextIO | None = None, stderr: TextIO | None = None
    ) -> None:
        self.total = total
        self._out = stdout or sys.stdout
        self._err = stderr or sys.stderr
        self._enabled = show_progress and _is_tty(self._out)
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._line_shown = False
        self.done = 0
        self.failed = 0
        self.running = 0
        self.booting = 0  # nodes still booting that the job waits for
        self.stages: dict[str, int] = {}  # of those, how many are at each boot stage
        self.held_back = ""  # why the job's nodes run fewer of its calls than they could (said once)
        self._said_held_back = False

    def announce(self, text: str) -> None:
        """A line for the person running the job (its dashboard page), on stderr."""
        self._clear()
        self._err.write(f"[burla] {text}\n")
        self._err.flush()

    def output(self, items: list) -> None:
        """Write what remote calls printed, each chunk to the stream it was written to."""
        if not items:
            return
        self._clear()
        for _index, stream, text in items:
            target = self._err if stream == STDERR else self._out
            target.write(text)
        self._out.flush()
        self._err.flush()
        self._draw(force=True)

    def progress(self, done: int, failed: int, running: int, booting: int = 0,
                 stages: dict[str, int] | None = None, held_back: str = "") -> None:
        self.done, self.failed, self.running = max(self.done, done), max(self.failed, failed), running
        self.booting = booting
        self.stages = stages or {}
        if held_back and not self._said_held_back:
            self.announce(held_back)  # once per job (its figures change with every state), on a terminal or not
            self._said_held_back = True
        self.held_back = held_back
        self._draw()

    def count_results(self, count: int, failed: int) -> None:
        self.done += count
        self.failed += failed
        self._draw()

    def finish(self) -> None:
        if self._enabled and self._line_shown:
            self.running = 0
            self._draw(force=True)
            self._out.write("\n")
            self._out.flush()
            self._line_shown = False

    def _clear(self) -> None:
        if self._enabled and self._line_shown:
            self._out.write("\r\x1b[2K")
            self._line_shown = False

    def _draw(self, force: bool = False) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < REDRAW_EVERY_S:
            return
        self._last_draw = now
        elapsed = now - self._started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.done}/{self.total} done"]
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.booting and not self.running:
            parts.append(f"waiting for {self.booting} booting node{'s' if self.booting > 1 else ''}"
                         + booting_stages(self.stages))
        else:
            parts.append(f"{self.running} running")
        if self.held_back:
            parts.append("fewer at once: machine busy")
        parts.append(f"{rate:,.1f}/s")
        parts.append(f"{elapsed:.1f}s")
        self._out.write("\r\x1b[2K[burla] " + " · ".join(parts))
        self._out.flush()
        self._line_shown = True


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
