"""What the suite needs to run in parallel (pytest-xdist, its worker count set in setup.cfg):
tests that measure how busy the machine is run alone, work every worker would repeat is done
once, and what workers count is joined on the controller.

- **Alone.** A test marked `exclusive` (the node's governor judging the CPUs idle, say) takes a
  lock every other test shares: it starts once the tests running then have ended, and no test
  starts while it runs. A turnstile in front of the shared lock keeps a waiting exclusive test
  from being passed by ever new shared holders (flock has no writer preference).
- **Once.** `built_once(root, name, build)` runs `build(directory)` in one worker and lets the
  others wait for it and use what it made (a wheelhouse, a virtual environment).
- **Longest first.** xdist hands out work units (`--dist loadgroup`: a test, or every test of a
  group) in collection order as workers free up, so the collection is put in order of how long
  each unit took last time (tests/durations.json, written by `--record-durations`): the longest
  start first and the short ones fill the gaps at the end. A module with a module-scoped fixture
  is one unit (its fixture is made once); so are the `exclusive` tests, last, so that the machine
  empties for them once, while only short tests still run.
- **Joined.** Each worker sends its fault ledger to the controller when it ends
  (`config.workeroutput`), which adds the rows up.

Without xdist (`-p no:xdist`, `-n 0`) the locks are taken by the one process and cost nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

EXCLUSIVE_MARK = "exclusive"
EXCLUSIVE_GROUP = "machine-alone"
DURATIONS_FILE = Path(__file__).resolve().parents[1] / "durations.json"
UNKNOWN_DURATION_S = 1.0  # a test new since the file was written
RECORDED_FROM_S = 1.0  # shorter tests are left out of the file (they take the default)


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


class MachineShare:
    """A worker's hold on the machine: shared with other tests, or (`exclusive`) alone. An
    exclusive hold is kept from one exclusive test to the next one of the same worker, so that the
    machine empties once for a run of them, not before each."""

    def __init__(self, root: Path) -> None:
        self._turnstile, self._machine = root / "machine.turnstile", root / "machine.lock"
        self._alone: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def held(self, exclusive: bool, next_exclusive: bool) -> Iterator[None]:
        """Hold the machine for one test (and, alone, for the exclusive test after it)."""
        if exclusive:
            if self._alone is None:
                alone = contextlib.ExitStack()
                alone.enter_context(_locked(self._turnstile, fcntl.LOCK_EX))
                alone.enter_context(_locked(self._machine, fcntl.LOCK_EX))
                self._alone = alone
            try:
                yield
            finally:
                if not next_exclusive:
                    self.release()
            return
        self.release()
        with _locked(self._turnstile, fcntl.LOCK_EX):
            pass  # waits here while an exclusive test waits for, or holds, the machine
        with _locked(self._machine, fcntl.LOCK_SH):
            yield

    def release(self) -> None:
        if self._alone is not None:
            alone, self._alone = self._alone, None
            alone.close()


def recorded_durations() -> dict[str, float]:
    """How long each test took when tests/durations.json was written (none if there is no file)."""
    try:
        return {nodeid: float(seconds) for nodeid, seconds in json.loads(DURATIONS_FILE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def write_durations(durations: dict[str, float]) -> None:
    kept = {nodeid: round(seconds, 1) for nodeid, seconds in sorted(durations.items()) if seconds >= RECORDED_FROM_S}
    DURATIONS_FILE.write_text(json.dumps(kept, indent=0, sort_keys=True) + "\n")


def plain_nodeid(nodeid: str) -> str:
    """A test's id without the `@group` suffix `--dist loadgroup` adds."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def _unit_of(item: pytest.Item) -> str | None:
    """The work unit a test belongs to beyond itself: the exclusive tests', or its module's when the
    module has a module-scoped fixture."""
    if item.get_closest_marker(EXCLUSIVE_MARK) is not None:
        return EXCLUSIVE_GROUP
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is not None:
        for definitions in fixtures.name2fixturedefs.values():
            if any(definition.scope == "module" for definition in definitions):
                return item.nodeid.split("::", 1)[0]
    return None


def longest_first(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Group and order `items` in place for `--dist loadgroup` (see the module's docstring)."""
    units: dict[str, str] = {}
    weights: dict[str, float] = {}
    for item in items:
        group = _unit_of(item)
        unit = group or item.nodeid
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        units[item.nodeid] = unit
        weights[unit] = weights.get(unit, 0.0) + durations.get(item.nodeid, UNKNOWN_DURATION_S)
    weights[EXCLUSIVE_GROUP] = -1.0  # last, whatever it weighs
    position = {item.nodeid: index for index, item in enumerate(items)}
    first: dict[str, int] = {}
    for item in items:
        first.setdefault(units[item.nodeid], position[item.nodeid])

    def key(item: pytest.Item) -> tuple[float, int, int]:
        unit = units[item.nodeid]
        return -weights[unit], first[unit], position[item.nodeid]

    items.sort(key=key)


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
