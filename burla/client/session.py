"""A job from the client's side once its cluster is found: the opening frame (the pickled
function, its local code and packages), the runner that keeps the job's connection, and the
results handed to the caller.

`burla.client.api` imports this while an embedded head starts (or right away with a running
head), not before: these imports are a third of a cold client's work before it can start
the head, and the head's start is the longest part of a cold job.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sys
from collections.abc import Callable, Generator, Iterator
from operator import itemgetter
from typing import Any

from burla._version import __version__
from burla.client.local_cluster import ClusterHandle
from burla.client.progress import Display
from burla.client.results import AllIn, Outcome
from burla.client.runner import JobRunner
from burla.config import MAX_FUNCTION_BYTES
from burla.errors import FunctionTooBig, JobCanceled
from burla.protocol import wire
from burla.protocol.job_options import JobOptions
from burla.protocol.replication import local_code
from burla.protocol.replication.environment import client_packages, not_replicated_warning
from burla.protocol.values import input_files
from burla.protocol.values.serialization import dumps_function
from burla.protocol.worker_context import waiting_on_children

_ok_of = itemgetter(1)


def opening(job_id: str, function_: Callable[..., Any], name: str, n_inputs: int, options: JobOptions,
            direct_inputs: bool = True, direct_results: bool = True) -> wire.OpenJob:
    """The frame that opens the job; raises FunctionTooBig or UnpicklableFunction."""
    function_bytes = dumps_function(function_)
    if len(function_bytes) > MAX_FUNCTION_BYTES:
        raise FunctionTooBig(
            f"{name} is {len(function_bytes) / 2**20:.1f} MB pickled; the limit is "
            f"{MAX_FUNCTION_BYTES // 2**20} MB. It references large objects from its enclosing scope: pass "
            "them as inputs, or load them inside the function."
        )
    return wire.OpenJob(
        job_id=job_id,
        function_name=name,
        function_bytes=function_bytes,
        n_inputs=n_inputs,
        **options.fields(),
        client_version=__version__,
        python_version=f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}",
        local_code=local_code.collect(function_),
        packages=client_packages(),
        # A detached job's inputs must outlive this process: they travel inline.
        client_host="" if options.detach else input_files.host_id(),
        direct_inputs=direct_inputs and not options.detach,  # large inputs straight to their nodes, where allowed
        direct_results=direct_results and not options.detach,  # and large results straight from them
        reuse_key=b"" if options.detach else reuse_key(),
    )


_process_secret = secrets.token_bytes(32)


def _new_process_secret() -> None:
    global _process_secret
    _process_secret = secrets.token_bytes(32)


os.register_at_fork(after_in_child=_new_process_secret)  # a forked process is another client


def reuse_key() -> bytes:
    """Which earlier jobs' workers this job's calls may run in: this process's own (a model its
    calls loaded stays loaded for its next job). Nobody else can make it (this process's secret is
    in it), so a node never runs another client's call in a process that ran this one's."""
    return hmac.new(_process_secret, b"burla worker reuse", hashlib.sha256).digest()[:wire.REUSE_KEY_BYTES]


def run(cluster: ClusterHandle, spec: wire.OpenJob, inputs: list[Any], spinner: bool,
        generator: bool) -> list[Any] | Iterator[Any]:
    """Open the job and hand back its results. A detached job is collected like any other once its
    inputs are up and "Done uploading inputs!" is printed; should this process end (or Ctrl-C)
    after that, the job runs on and the head keeps its results for `get_results`."""
    display = Display(len(inputs), show_progress=spinner)
    warning = not_replicated_warning()
    if warning is not None:
        display.announce(warning)
    runner = JobRunner(cluster, spec.job_id, display, opening=spec, inputs=inputs,
                       in_order=not (generator or spec.detach))
    runner.start()
    if spec.detach:
        _wait(runner.uploaded, runner)  # Ctrl-C meanwhile cancels the job
        if runner.error is not None:
            raise runner.error
        try:
            print(f"Done uploading inputs! Job {runner.job_id} runs on at {cluster.url} even if this process "
                  f"ends (collect it then with `burla jobs results {runner.job_id}`)", file=sys.stderr)
            runner.close()
            runner.display.finish()
            return collect(cluster, spec.job_id, spinner, generator, spec.raise_errors, runner.secret)
        except KeyboardInterrupt:  # wherever it lands once the inputs are up: the job runs on
            _say_it_runs_on(spec.job_id)
            raise
    if generator:
        return _results_as_completed(runner, cluster, spec.raise_errors, cancel_on_interrupt=True)
    return _results_in_order(runner, cluster, spec.raise_errors, cancel_on_interrupt=True)


def collect(cluster: ClusterHandle, job_id: str, spinner: bool, generator: bool,
            raise_errors: bool, secret: str | None = None) -> list[Any] | Iterator[Any]:
    """The results of a detached job, collected from the head (Ctrl-C leaves the job running)."""
    runner = JobRunner(cluster, job_id, Display(0, show_progress=spinner), secret=secret)
    runner.start()
    if generator:
        return _results_as_completed(runner, cluster, raise_errors, cancel_on_interrupt=False)
    return _results_in_order(runner, cluster, raise_errors, cancel_on_interrupt=False)


def _results_in_order(runner: JobRunner, cluster: ClusterHandle, raise_errors: bool,
                      cancel_on_interrupt: bool) -> list[Any]:
    batches = _outcome_batches(runner, cluster, raise_errors, cancel_on_interrupt)
    try:
        _wait(runner.opened, runner, cancel_on_interrupt)
    except BaseException:
        batches.close()
        raise
    if runner.results is not None:  # the job's thread fills it: only failures come through here
        for _ in batches:
            pass
        return runner.results
    results: list[Any] = [None] * runner.n_inputs
    for batch in batches:  # a batch at a time: a generator step per result was most of this thread's time
        for index, _ok, value in batch:
            results[index] = value
    return results


def _results_as_completed(runner: JobRunner, cluster: ClusterHandle, raise_errors: bool,
                          cancel_on_interrupt: bool) -> Iterator[Any]:
    for batch in _outcome_batches(runner, cluster, raise_errors, cancel_on_interrupt):
        for _index, _ok, value in batch:
            yield value


def _wait(event, runner: JobRunner, cancel_on_interrupt: bool = True) -> None:
    """Wait for a runner event; Ctrl-C cancels the job (or leaves a detached one running) and
    raises KeyboardInterrupt, as it would without burla."""
    try:
        while not event.wait(0.25):
            pass
    except KeyboardInterrupt:
        _interrupted(runner, cancel_on_interrupt)
        raise


def _interrupted(runner: JobRunner, cancel: bool) -> None:
    if cancel:
        runner.cancel("Ctrl-C in the client")
        print(f"[burla] job {runner.job_id} canceled (Ctrl-C)", file=sys.stderr)
    else:
        _say_it_runs_on(runner.job_id)


_said_runs_on: set[str] = set()


def _say_it_runs_on(job_id: str) -> None:
    """Tell the user, once, how to collect a detached job this process stops waiting for."""
    if job_id not in _said_runs_on:
        _said_runs_on.add(job_id)
        print(f"[burla] job {job_id} runs on (detached); collect its results with `burla jobs results {job_id}` "
              f"or burla.get_results({job_id!r})", file=sys.stderr)


def _outcome_batches(runner: JobRunner, cluster: ClusterHandle, raise_errors: bool, cancel_on_interrupt: bool
                     ) -> Generator[list[Outcome], None, None]:
    with waiting_on_children():  # inside a worker: lend this slot while the nested job runs
        yield from _collect(runner, cluster, raise_errors, cancel_on_interrupt)


def _collect(runner: JobRunner, cluster: ClusterHandle, raise_errors: bool,
             cancel_on_interrupt: bool) -> Generator[list[Outcome], None, None]:
    """Outcomes as they arrive, in batches; with raise_errors, the first failed one raises (after
    the outcomes before it in its batch)."""
    received = 0
    try:
        while not (runner.opened.is_set() and received >= runner.n_inputs and runner.error is None):
            batch = runner.next_outcomes()
            if batch is None:
                break
            if isinstance(batch, AllIn):  # the failures, if any, came before
                received = runner.n_inputs
                continue
            if not batch:
                continue
            received += len(batch)
            if raise_errors and not all(map(_ok_of, batch)):  # at C speed: most batches have no failure
                failed = next((position for position, (_, ok, _) in enumerate(batch) if not ok), None)
                if failed is not None:
                    if failed:
                        yield batch[:failed]
                    _, _, error = batch[failed]
                    raise error
            yield batch
        if runner.error is not None:
            raise runner.error
        if received < runner.n_inputs:
            raise JobCanceled(f"job {runner.job_id} ended with {runner.n_inputs - received} results missing")
    except KeyboardInterrupt:
        _interrupted(runner, cancel_on_interrupt)
        raise
    finally:
        runner.close()
        runner.display.finish()
        cluster.close()


