"""The suite's own parallel run (tests.support.parallel): an exclusive test waits for the tests
running, and a test that comes after it waits for it; a worker keeps the machine from one
exclusive test to the next; the longest work units are handed out first, exclusive tests last and
a module with a module-scoped fixture as one unit; work is built once however many workers ask;
the workers' fault ledgers add up."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.support.helpers import wait_until
from tests.support.parallel import (
    EXCLUSIVE_GROUP,
    MachineShare,
    built_once,
    longest_first,
    merge_ledgers,
    plain_nodeid,
)


def _waiting_on(path: Path) -> bool:
    """Whether a lock request waits on this file (Linux lists each waiter after a `->` in
    /proc/locks, with the file's device and inode)."""
    inode = f":{path.stat().st_ino} "
    return any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


def test_an_exclusive_test_waits_for_the_running_ones_and_holds_back_the_next(tmp_path):
    order: list[str] = []
    release_first = threading.Event()

    def hold(name: str, exclusive: bool, until: threading.Event | None = None) -> None:
        with MachineShare(tmp_path).held(exclusive, next_exclusive=False):
            order.append(f"{name} in")
            if until is not None:
                until.wait(30)
            order.append(f"{name} out")

    first = threading.Thread(target=hold, args=("shared", False, release_first))
    first.start()
    wait_until(lambda: order == ["shared in"], what="the first test to hold its share")
    alone = threading.Thread(target=hold, args=("exclusive", True))
    alone.start()
    wait_until(lambda: _waiting_on(tmp_path / "machine.lock"), what="the exclusive test to wait for the machine")
    late = threading.Thread(target=hold, args=("late", False))
    late.start()
    wait_until(lambda: _waiting_on(tmp_path / "machine.turnstile"), what="the later test to wait at the turnstile")
    assert order == ["shared in"]
    release_first.set()
    for thread in (first, alone, late):
        thread.join(30)
    assert order == ["shared in", "shared out", "exclusive in", "exclusive out", "late in", "late out"]


def test_shared_tests_hold_the_machine_together(tmp_path):
    inside = threading.Barrier(2, timeout=30)

    def hold() -> None:
        with MachineShare(tmp_path).held(exclusive=False, next_exclusive=False):
            inside.wait()  # both in at once, or this times out

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not inside.broken


def test_a_worker_keeps_the_machine_from_one_exclusive_test_to_the_next(tmp_path):
    worker, other = MachineShare(tmp_path), MachineShare(tmp_path)
    entered = threading.Event()

    def shared_test() -> None:
        with other.held(exclusive=False, next_exclusive=False):
            entered.set()

    with worker.held(exclusive=True, next_exclusive=True):
        pass
    late = threading.Thread(target=shared_test)
    late.start()
    wait_until(lambda: _waiting_on(tmp_path / "machine.turnstile"), what="a shared test to wait at the turnstile")
    with worker.held(exclusive=True, next_exclusive=False):  # the second exclusive test: no wait, still alone
        assert not entered.is_set()
    late.join(30)
    assert entered.is_set()  # the machine went back once the last exclusive test ended
    worker.release()  # nothing held: a no-op


class _Item:
    """What longest_first reads of a pytest item."""

    def __init__(self, nodeid: str, exclusive: bool = False, module_fixture: bool = False) -> None:
        self.nodeid, self._exclusive, self.marks = nodeid, exclusive, []

        class Definition:
            scope = "module" if module_fixture else "function"

        class Info:
            name2fixturedefs = {"fixture": [Definition()]}

        self._fixtureinfo = Info()

    def get_closest_marker(self, name: str):
        return pytest.mark.exclusive if name == "exclusive" and self._exclusive else None

    def add_marker(self, mark) -> None:
        self.marks.append(mark.mark.args[0])


def test_the_longest_units_go_first_and_the_exclusive_tests_last():
    items = [_Item("a.py::quick"), _Item("a.py::alone_1", exclusive=True), _Item("b.py::slow"),
             _Item("c.py::one", module_fixture=True), _Item("c.py::two", module_fixture=True),
             _Item("a.py::alone_2", exclusive=True), _Item("d.py::new")]
    durations = {"a.py::quick": 0.2, "a.py::alone_1": 50.0, "b.py::slow": 30.0, "c.py::one": 20.0,
                 "c.py::two": 15.0, "a.py::alone_2": 5.0}
    longest_first(items, durations)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == ["c.py::one", "c.py::two", "b.py::slow", "d.py::new", "a.py::quick",
                                               "a.py::alone_1", "a.py::alone_2"]
    assert [item.marks for item in items] == [["c.py"], ["c.py"], [], [], [], [EXCLUSIVE_GROUP], [EXCLUSIVE_GROUP]]


def test_a_grouped_tests_id_is_read_without_its_group():
    assert plain_nodeid("tests/a.py::test_x@machine-alone") == "tests/a.py::test_x"
    assert plain_nodeid("tests/a.py::test_x[user@host]") == "tests/a.py::test_x[user@host]"


def test_work_asked_for_by_several_workers_is_built_once(tmp_path):
    builds: list[Path] = []

    def build(directory: Path) -> None:
        builds.append(directory)
        (directory / "made").write_text("once")

    found = []
    threads = [threading.Thread(target=lambda: found.append(built_once(tmp_path, "thing", build))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert builds == [tmp_path / "thing"] and found == [tmp_path / "thing"] * 4
    assert (tmp_path / "thing" / "made").read_text() == "once"


def test_workers_fault_ledgers_add_up():
    ledger = {"kill a node": {"trials": 1, "inputs": 10, "lost": 0, "duplicates": 0, "ended_with_error": 1,
                              "errors": ["NodeDisconnected"]}}
    merge_ledgers(ledger, {"kill a node": {"trials": 2, "inputs": 20, "lost": 0, "duplicates": 0,
                                           "ended_with_error": 1, "errors": ["NodeDisconnected", "JobFailed"]},
                           "cut the client": {"trials": 1, "inputs": 5, "lost": 0, "duplicates": 0,
                                              "ended_with_error": 0, "errors": []}})
    assert ledger["kill a node"] == {"trials": 3, "inputs": 30, "lost": 0, "duplicates": 0, "ended_with_error": 2,
                                     "errors": ["NodeDisconnected", "JobFailed"]}
    assert ledger["cut the client"]["trials"] == 1
