"""Directories that belong to a living process (burla.process.locked_dirs): a sweep removes only
those whose owner died, killed or not, and a node killed with SIGKILL leaves its directory of
shipped modules to the next node on the machine."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from burla.process.locked_dirs import LOCK_FILE, ORPHAN_UNLOCKED_S, make_locked, remove_abandoned
from tests.cluster_runner import LocalCluster
from tests.support.helpers import wait_until

HOLDER = """
import sys, time
from pathlib import Path
from burla.process.locked_dirs import make_locked
make_locked(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(600)
"""


def _holder(directory: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "locked"
    return process


def test_a_sweep_removes_only_the_directories_of_owners_that_died(tmp_path):
    alive, killed = tmp_path / "x-alive", tmp_path / "x-killed"
    holders = [_holder(alive), _holder(killed)]
    try:
        assert stat.S_IMODE(alive.stat().st_mode) == 0o700 and (alive / LOCK_FILE).exists()
        (killed / "module.py").write_text("x = 1")
        unlocked = tmp_path / "x-without-lock"  # someone else's way of using the name: left alone
        unlocked.mkdir()
        other = tmp_path / "y-dead"  # not ours to sweep, whatever its lock says
        other.mkdir()
        (other / LOCK_FILE).write_bytes(b"")
        (tmp_path / "x-link").symlink_to(other)
        half_made, fresh_half_made = tmp_path / ".x-crashed.making", tmp_path / ".x-being-made.making"
        half_made.mkdir()
        fresh_half_made.mkdir()
        old = time.time() - ORPHAN_UNLOCKED_S - 1
        os.utime(half_made, (old, old))
        ours = lambda name: name.startswith("x-")  # noqa: E731
        assert remove_abandoned(tmp_path, ours) == 1  # the crash's leftover; both owners live
        assert alive.exists() and killed.exists() and not half_made.exists() and fresh_half_made.exists()
        holders[1].send_signal(signal.SIGKILL)
        holders[1].wait(60)
        assert remove_abandoned(tmp_path, ours) == 1
        assert not killed.exists() and alive.exists()
        assert unlocked.exists() and other.exists() and (tmp_path / "x-link").is_symlink()
    finally:
        for holder in holders:
            holder.kill()
            holder.wait(60)
            assert holder.stdout is not None
            holder.stdout.close()
    assert remove_abandoned(tmp_path, lambda name: name.startswith("x-")) == 1 and not alive.exists()


def test_a_directory_is_made_locked_and_its_lock_is_not_inherited_across_exec(tmp_path):
    directory = tmp_path / "d"
    fd = make_locked(directory)
    try:
        # A child started by exec (as a node's fork server is) does not hold it.
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.1)"], check=True, close_fds=False)
        assert remove_abandoned(tmp_path) == 0 and directory.exists()
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)
    assert remove_abandoned(tmp_path) == 1 and not directory.exists()


def _code_roots(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("burla-node-code-*"))


def test_a_node_killed_leaves_its_directory_of_shipped_modules_to_the_next_node(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with LocalCluster(tmp_path / "cluster", nodes=0, workers=1) as cluster:
        first = cluster.add_node("node-a", env={"TMPDIR": str(tmp)})
        wait_until(lambda: len(_code_roots(tmp)) == 1, timeout=60, what="the first node's directory")
        [first_root] = _code_roots(tmp)
        assert (first_root / LOCK_FILE).exists()
        first.send_signal(signal.SIGKILL)
        first.wait(60)
        assert first_root.exists()  # nothing of the node ran to remove it
        cluster.add_node("node-b", env={"TMPDIR": str(tmp)})
        wait_until(lambda: first_root not in _code_roots(tmp) and len(_code_roots(tmp)) == 1, timeout=60,
                   what="the second node's directory, the first one's gone")
