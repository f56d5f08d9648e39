"""Every route of a head and its node, fuzzed with malformed and random requests: never a 5xx, a
dropped connection or a WebSocket closed as an internal error, and afterwards the cluster still
runs a job and the head's memory has not run away.

`--fuzz-requests N` sets how many requests go out (2,000 by default); the seed is fixed, so a
failure replays with the same requests.
"""

from __future__ import annotations

import random
import re

import psutil
import pytest

from tests.conftest import own_head, wait_for_nodes
from tests.security.fuzz import run
from tests.support import functions

SEED = 20_240_917
MAX_RSS_GROWTH = 150 * 2**20
LOG_TROUBLE = re.compile(r"Traceback|Error handling request|Unhandled exception|Task exception|ERROR")


@pytest.mark.timeout(600)
def test_every_route_survives_fuzzing(tmp_path, request):
    requests = request.config.getoption("--fuzz-requests")
    with own_head(tmp_path) as head:
        [node] = wait_for_nodes(head, 1)
        head_process = psutil.Process(head.process.pid)
        rss_before = head_process.memory_info().rss
        log_start = head.log_path.stat().st_size

        summary = run(head, node["url"], random.Random(SEED), requests)
        print(summary.report())

        problems = [f"finding {finding}" for finding in summary.findings]
        try:
            results = head.client().remote_parallel_map(functions.double, range(10), spinner=False)
            if results != [x * 2 for x in range(10)]:
                problems.append(f"the job after fuzzing returned {results}")
        except Exception as e:  # reported with everything else below
            problems.append(f"the job after fuzzing failed: {type(e).__name__}: {e}")
        rss_after = head_process.memory_info().rss
        print(f"head RSS {rss_before / 2**20:.0f} MB before, {rss_after / 2**20:.0f} MB after")
        if rss_after - rss_before >= MAX_RSS_GROWTH:
            problems.append(f"the head's RSS grew from {rss_before / 2**20:.0f} MB to {rss_after / 2**20:.0f} MB")
        with open(head.log_path, "rb") as log:
            log.seek(log_start)
            trouble = [line for line in log.read().decode(errors="replace").splitlines() if LOG_TROUBLE.search(line)]

    assert summary.requests == requests
    assert not problems, (
        f"{len(problems)} problem(s) after {summary.requests} requests in {summary.seconds:.1f} s "
        f"(seed {SEED}):\n" + "\n".join(problems)
        + "\nhead and node log lines from the run:\n" + "\n".join(trouble[:200])
    )
