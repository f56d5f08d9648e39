"""This machine's background head as the CLI sees it: its record (`head.json` in the config
directory) counts only while its process still runs as a burla head. A record whose head is gone
is removed, and the command says so; `burla head stop` stops a running one cleanly."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from burla.config import HEAD_STATE_FILE, HeadRecord

STOP_TIMEOUT_S = 300.0  # a head deletes its VMs before it exits


def runs_a_head(pid: int) -> bool:
    """Whether `pid` is a live `burla head serve` (not a process that took the pid over since)."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        arguments = process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # another user's process: not ours to judge
    return "head" in arguments and "serve" in arguments


def live_head(directory: Path) -> tuple[HeadRecord | None, str]:
    """The background head recorded here if it still runs; else None, and what became of a
    recorded one (its record removed), for the command to say."""
    record = HeadRecord.read(directory)
    if record is None:
        return None, ""
    if runs_a_head(record.pid):
        return record, ""
    HeadRecord.remove_if_owned(directory, record.pid)
    return None, (f"the background head recorded in {directory / HEAD_STATE_FILE} (pid {record.pid}) is no longer "
                  "running; its record was removed")


def stop_head(directory: Path, timeout_s: float = STOP_TIMEOUT_S, force: bool = False) -> dict:
    """Stop this machine's background head as SIGTERM does (its jobs end, its local nodes stop,
    its VMs are deleted) and wait for it to exit; with `force`, SIGKILL it past `timeout_s`."""
    record, note = live_head(directory)
    if record is None:
        return {"stopped": False, "note": note or "no background head runs on this machine"}
    os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while runs_a_head(record.pid):
        if time.monotonic() > deadline:
            if not force:
                return {"stopped": False, "pid": record.pid, "url": record.url,
                        "note": f"still stopping after {timeout_s:g} s (deleting its VMs?); run again with --force "
                                "to kill it"}
            os.kill(record.pid, signal.SIGKILL)
            HeadRecord.remove_if_owned(directory, record.pid)
            return {"stopped": True, "pid": record.pid, "url": record.url, "killed": True}
        time.sleep(0.1)
    HeadRecord.remove_if_owned(directory, record.pid)
    return {"stopped": True, "pid": record.pid, "url": record.url}
