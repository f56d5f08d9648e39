"""The suite's own parallel run (tests.support.parallel): an exclusive test waits for the tests
running, and a test that comes after it waits for it; work is built once however many workers
ask; the workers' fault ledgers add up."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.support.helpers import wait_until
from tests.support.parallel import built_once, machine_share, merge_ledgers


def _waiting_on(path: Path) -> bool:
    """Whether a lock request waits on this file (Linux lists each waiter after a `->` in
    /proc/locks, with the file's device and inode)."""
    inode = f":{path.stat().st_ino} "
    return any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


def test_an_exclusive_test_waits_for_the_running_ones_and_holds_back_the_next(tmp_path):
    order: list[str] = []
    release_first = threading.Event()

    def hold(name: str, exclusive: bool, until: threading.Event | None = None) -> None:
        with machine_share(tmp_path, exclusive):
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
        with machine_share(tmp_path, exclusive=False):
            inside.wait()  # both in at once, or this times out

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not inside.broken


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
