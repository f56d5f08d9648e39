"""func_cpu="dynamic": multithreaded calls that wait for cores make the node run fewer at once."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import own_head
from tests.support import functions

# Whether calls wait for cores depends on what else the machine runs: nothing else may run
# meanwhile.
pytestmark = [pytest.mark.exclusive,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux scheduler statistics")]


@pytest.fixture
def head(tmp_path):
    with own_head(tmp_path) as head:
        yield head


def test_calls_waiting_for_cores_lower_parallelism(head):
    assert head.client().remote_parallel_map(functions.busy_threads, [2.0] * 4, spinner=False) == [2.0] * 4
    assert "calls wait for a core" in head.log()


def test_single_threaded_calls_keep_every_slot(head, tmp_path):
    out = tmp_path / "calls"
    out.mkdir()
    inputs = [(str(out), i, 0.5) for i in range(4)]
    head.client().remote_parallel_map(functions.record_interval, inputs, spinner=False)
    assert functions.max_overlap(out) >= 2  # calls that wait may run more than one per worker
    assert "calls wait for a core" not in head.log()


def test_an_integer_func_cpu_is_never_lowered(head):
    assert head.client().remote_parallel_map(functions.busy_threads, [1.5] * 2, func_cpu=1, spinner=False) == [1.5] * 2
    assert "calls wait for a core" not in head.log()
