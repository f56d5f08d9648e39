"""Per-call output capture in a worker: every byte a call writes (Python, fd 1, C, a child, a
thread) is attributed to that call, whether the worker learns of output from its io_uring polls
(`output_ring`) or from epoll; and the ring itself fires on a write and not before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from burla.node.workers.output_ring import OutputRing, RingUnavailable
from tests.conftest import REPO
from tests.support import functions
from tests.support.helpers import get_json

# Run in a process of its own: installing the capture points that process's fd 1 and 2 at pipes.
PROBE = textwrap.dedent("""
    import json, os, sys
    from burla.node.workers.output_capture import OutputCapture
    from tests.support import functions

    live = []  # what the watchdog sends while calls run
    capture = OutputCapture(lambda job_id, items: live.extend(items), use_ring=sys.argv[1] == "ring")
    capture.install()
    capture.begin_batch("job")
    end = capture.call_ender()
    for x in range(int(sys.argv[2])):
        capture.running = x
        functions.writes_its_index(x)
        end()
    got = {}
    with capture.send_lock:
        items = live + capture.take()
    for index, stream, text in items:
        got[index] = got.get(index, "") + text
    report = {"ring": capture._ring is not None, "got": got}
    os.write(capture.diagnostics_fd, json.dumps(report).encode())
""")


def _ring_available() -> bool:
    try:
        OutputRing([]).close()
    except RingUnavailable:
        return False
    return True


@pytest.mark.parametrize("poll_with", ["ring", "epoll"])
def test_each_calls_output_is_its_own_however_it_was_written(poll_with):
    if poll_with == "ring" and not _ring_available():
        pytest.skip("io_uring is not available on this machine")
    calls = 240
    done = subprocess.run([sys.executable, "-c", PROBE, poll_with, str(calls)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stderr)
    assert report["ring"] is (poll_with == "ring")
    got = {int(index): text for index, text in report["got"].items()}
    assert got == {x: functions.written_by(x) for x in range(calls)}


@pytest.mark.skipif(not _ring_available(), reason="io_uring is not available on this machine")
def test_the_ring_fires_once_a_pipe_is_written_and_is_quiet_once_drained_and_rearmed():
    read_out, write_out = os.pipe()
    read_err, write_err = os.pipe()
    ring = OutputRing([read_out, read_err])
    try:
        assert not ring.fired()
        os.write(write_err, b"x")  # this thread's write: posted before the write returns
        assert ring.fired()
        assert os.read(read_err, 10) == b"x"
        ring.rearm()
        assert not ring.fired()
        # A child process's write, seen once the child is waited for.
        subprocess.run([sys.executable, "-c", f"import os; os.write({write_out}, b'y')"], pass_fds=(write_out,),
                       check=True)
        assert ring.fired()
        assert os.read(read_out, 10) == b"y"
        ring.rearm()
        assert not ring.fired()
        # Written between draining and re-arming: the new poll completes at once.
        os.write(write_out, b"z")
        ring.rearm()
        assert ring.fired()
        assert not ring.broken
    finally:
        ring.close()
        for fd in (read_out, write_out, read_err, write_err):
            os.close(fd)


def test_a_jobs_calls_keep_their_own_output_through_a_real_worker(cluster, client):
    calls = 120
    assert client.remote_parallel_map(functions.writes_its_index, range(calls), spinner=False) == list(range(calls))
    job = next(j for j in get_json(cluster, "/v1/jobs?limit=50")["jobs"] if j["function_name"] == "writes_its_index")
    for x in range(calls):
        output = get_json(cluster, f"/v1/jobs/{job['job_id']}/calls/{x}/output")["output"]
        assert "".join(row["text"] for row in output) == functions.written_by(x), x
