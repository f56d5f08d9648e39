"""What the suite needs to run in parallel (pytest-xdist, its worker count set in setup.cfg):
tests that measure how busy the machine is run alone, work every worker would repeat is done
once, and what workers count is joined on the controller.

- **Alone.** A test marked `exclusive` (the node's governor judging the CPUs idle, say) takes a
  lock every other test shares: it starts once the tests running then have ended, and no test
  starts while it runs. A turnstile in front of the shared lock keeps a waiting exclusive test
  from being passed by ever new shared holders (flock has no writer preference).
- **Once.** `built_once(root, name, build)` runs `build(directory)` in one worker and lets the
  others wait for it and use what it made (a wheelhouse, a virtual environment).
- **Joined.** Each worker sends its fault ledger to the controller when it ends
  (`config.workeroutput`), which adds the rows up.

Without xdist (`-p no:xdist`, `-n 0`) the locks are taken by the one process and cost nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

EXCLUSIVE_MARK = "exclusive"


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every worker of this run shares (xdist gives each worker a folder in it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine_share(root: Path, exclusive: bool) -> Iterator[None]:
    """Hold the machine for one test: shared with other tests, or (`exclusive`) alone."""
    turnstile, machine = root / "machine.turnstile", root / "machine.lock"
    if exclusive:
        with _locked(turnstile, fcntl.LOCK_EX), _locked(machine, fcntl.LOCK_EX):
            yield
        return
    with _locked(turnstile, fcntl.LOCK_EX):
        pass  # waits here while an exclusive test waits for, or holds, the machine
    with _locked(machine, fcntl.LOCK_SH):
        yield


def built_once(root: Path, name: str, build: Callable[[Path], object]) -> Path:
    """`root/name`, made by `build` in whichever worker comes first; the others wait for it."""
    target = root / name
    with _locked(root / f"{name}.lock", fcntl.LOCK_EX):
        done = target / ".built"
        if not done.exists():
            target.mkdir(parents=True, exist_ok=True)
            build(target)
            done.write_text("")
    return target


def merge_ledgers(into: dict[str, dict], other: dict[str, dict]) -> None:
    """Add a worker's fault-ledger rows to the controller's (counts add, errors are unioned)."""
    for scenario, row in other.items():
        mine = into.setdefault(scenario, {"trials": 0, "inputs": 0, "lost": 0, "duplicates": 0,
                                          "ended_with_error": 0, "errors": []})
        for key in ("trials", "inputs", "lost", "duplicates", "ended_with_error"):
            mine[key] += row[key]
        mine["errors"] += [error for error in row["errors"] if error not in mine["errors"]]
