"""While a client runs jobs its cyclic GC collects less often, and the program's own thresholds
come back when the last job ends (unless it changed them meanwhile, or turned collection off)."""

from __future__ import annotations

import functools
import gc
import os
import threading
from collections.abc import Iterator

import pytest

from burla.process.memory import GC_THRESHOLDS, JOB_COLLECTIONS, JobCollections
from tests.support import functions
from tests.support.helpers import wait_until


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


@pytest.fixture
def no_job_running(python_defaults) -> None:
    """This process's own JOB_COLLECTIONS with no job: jobs of earlier tests may still be ending
    (a client retries a lost head for a minute), and the thresholds are its to set only after."""
    wait_until(lambda: JOB_COLLECTIONS.jobs_running == 0, timeout=100, what="earlier tests' jobs to end")
    gc.set_threshold(700, 10, 10)


def test_a_real_job_raises_them_while_it_runs_and_restores_them(no_job_running, client):
    results: list = []

    def run() -> None:
        results.extend(client.remote_parallel_map(functools.partial(functions.sleep_then_return, seconds=2), [1],
                                                  spinner=False))

    job = threading.Thread(target=run, daemon=True)
    job.start()
    wait_until(lambda: gc.get_threshold() == GC_THRESHOLDS, what="the thresholds to rise while the job runs")
    job.join(60)
    assert results == [1]
    wait_until(lambda: gc.get_threshold() == (700, 10, 10), what="the thresholds to come back after the job")


def test_a_child_forked_while_a_job_runs_starts_afresh(no_job_running):
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
