"""Directories that belong to a living process: each holds a lock file its owner keeps locked.

The kernel frees a flock when its holder dies, killed or not, so whoever comes next removes
only the directories whose lock is free. Process ids would not tell: they are reused, and
processes in containers sharing the directory each number their own. Used for a client's
input files (`protocol/values/input_files.py`) and a node's directory of shipped modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

LOCK_FILE = ".lock"
MAKING_SUFFIX = ".making"
ORPHAN_UNLOCKED_S = 60.0  # a directory without its lock file this old is a leftover


def make_locked(directory: Path) -> int:
    """Make `directory` (0700) with a lock file this process holds; returns the lock's file
    descriptor (closing it, or dying, frees the directory to the next sweep). It is made under a
    dot-name and renamed once locked, so a sweep never sees it unlocked. Raises OSError if it
    can't be made."""
    making = directory.parent / f".{directory.name}{MAKING_SUFFIX}"
    making.mkdir(mode=0o700)
    lock_fd = -1
    try:
        # Not inherited across exec: a process started from this one must not keep it locked.
        lock_fd = os.open(making / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        os.rename(making, directory)
    except OSError:
        if lock_fd >= 0:
            os.close(lock_fd)
        shutil.rmtree(making, ignore_errors=True)
        raise
    return lock_fd


def remove_abandoned(parent: Path, ours: Callable[[str], bool] = lambda name: True) -> int:
    """Remove the directories in `parent` named as `ours` accepts whose owner is gone (their lock
    is free), and those left while being made (no lock, older than ORPHAN_UNLOCKED_S). Only this
    user's own directories with a lock file, never through a symbolic link. Returns how many went."""
    removed = 0
    uid = os.getuid()
    for entry in os.scandir(parent):
        making = entry.name.startswith(".") and entry.name.endswith(MAKING_SUFFIX)
        name = entry.name[1:-len(MAKING_SUFFIX)] if making else entry.name
        if not ours(name) or (entry.name.startswith(".") and not making):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            # A directory without a lock file that is not being made is someone else's: left alone.
            fd = -1 if making else os.open(os.path.join(entry.path, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        if fd < 0:
            # Being made (under a dot-name until it is locked), or left by a crash meanwhile.
            with contextlib.suppress(OSError):
                if time.time() - entry.stat(follow_symlinks=False).st_mtime > ORPHAN_UNLOCKED_S:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed += 1
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its owner is alive
        else:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        finally:
            os.close(fd)
    return removed
