"""While a client runs jobs its cyclic GC collects less often, and the program's own thresholds
come back when the last job ends (unless it changed them meanwhile, or turned collection off)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from burla.process_memory import GC_THRESHOLDS, JobCollections
from tests import functions
from tests.helpers import wait_until


@pytest.fixture
def python_defaults() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_thresholds_rise_while_jobs_run_and_come_back_after_the_last(python_defaults):
    collections = JobCollections()
    collections.job_started()
    assert gc.get_threshold() == GC_THRESHOLDS
    collections.job_started()  # a second job at once (another thread)
    collections.job_ended()
    assert gc.get_threshold() == GC_THRESHOLDS
    collections.job_ended()
    assert gc.get_threshold() == (700, 10, 10)


def test_higher_thresholds_of_the_program_are_kept(python_defaults):
    gc.set_threshold(50_000, 5, 100)
    collections = JobCollections()
    collections.job_started()
    assert gc.get_threshold() == (50_000, 10, 100)
    collections.job_ended()
    assert gc.get_threshold() == (50_000, 5, 100)


def test_a_program_that_changes_them_meanwhile_keeps_its_change(python_defaults):
    collections = JobCollections()
    collections.job_started()
    gc.set_threshold(1_000, 10, 10)
    collections.job_ended()
    assert gc.get_threshold() == (1_000, 10, 10)


def test_collection_turned_off_stays_off(python_defaults):
    gc.set_threshold(0)
    collections = JobCollections()
    collections.job_started()
    assert gc.get_threshold()[0] == 0
    collections.job_ended()
    assert gc.get_threshold()[0] == 0


def test_a_real_job_raises_them_while_it_runs_and_restores_them(python_defaults, client):
    seen = [gc.get_threshold() for _ in client.remote_parallel_map(functions.double, range(4), generator=True,
                                                                      spinner=False)]
    assert seen and all(threshold == GC_THRESHOLDS for threshold in seen)
    wait_until(lambda: gc.get_threshold() == (700, 10, 10), what="the thresholds to come back after the job")


def test_a_child_forked_while_a_job_runs_starts_afresh(python_defaults):
    import os

    from burla.process_memory import JOB_COLLECTIONS

    JOB_COLLECTIONS.job_started()
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the parent's job is not its own
            ok = gc.get_threshold() == (700, 10, 10)
            JOB_COLLECTIONS.job_started()
            ok = ok and gc.get_threshold() == GC_THRESHOLDS
            JOB_COLLECTIONS.job_ended()
            ok = ok and gc.get_threshold() == (700, 10, 10)
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as answer:
            assert answer.read() == b"1"
        os.waitpid(pid, 0)
        assert gc.get_threshold() == GC_THRESHOLDS  # the parent's job still runs
    finally:
        JOB_COLLECTIONS.job_ended()
    assert gc.get_threshold() == (700, 10, 10)
