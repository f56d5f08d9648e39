"""The public API: remote_parallel_map and get_cluster_dashboard_url."""

from __future__ import annotations

import base64
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from burla import input_files, local_code, wire
from burla._version import __version__
from burla.config import MAX_FUNCTION_BYTES, ClientSettings
from burla.environment import client_packages, not_replicated_warning
from burla.environment import prefetch as prefetch_environment
from burla.errors import (
    FunctionTooBig,
    InvalidArgument,
    JobCanceled,
)
from burla.job_runner import JobRunner, Outcome
from burla.local_cluster import ClusterHandle, connect, running_local_head, start_head
from burla.node.worker_context import waiting_on_children
from burla.progress import Display
from burla.serialization import dumps_function
from burla.validation import GPU_CHOICES, IMAGE, REGION, matches


def remote_parallel_map(
    function_: Callable[..., Any],
    inputs: Iterable[Any],
    func_cpu: int | str = "dynamic",
    func_ram: int | float | str = "dynamic",
    func_gpu: str | None = None,
    image: str | None = None,
    grow: bool = False,
    max_parallelism: int | None = None,
    detach: bool = False,
    generator: bool = False,
    raise_errors: bool = True,
    spinner: bool = True,
    region: str | None = None,
    disk_gb: int | None = None,
) -> list[Any] | Iterator[Any] | str | None:
    """Call `function_` once per input, in parallel on every CPU of the cluster.

    Each input is one call: a tuple is unpacked into positional arguments (nest it,
    `[((1, 2),)]`, to pass one tuple). Returns the results **in input order**, or with
    `generator=True` an iterator yielding them as they complete. A call's exception is
    re-raised here with its original type, the remote traceback and `exc.burla_input_index`;
    with `raise_errors=False` the exception object stands in that input's place instead.
    Whatever calls print appears here live. With no cluster configured, a local cluster is
    started on this machine for the job and stopped after. With `detach=True` the call returns
    the job id once every input is uploaded and the job runs on without this process.
    """
    cpu = _resources("func_cpu", func_cpu, integer=True)
    ram = _resources("func_ram", func_ram, integer=False)
    _check_options(function_, func_gpu, image, region, disk_gb, max_parallelism)
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise InvalidArgument(f"inputs must be a list (or other iterable) of inputs, got {type(inputs).__name__}")
    inputs = inputs if isinstance(inputs, list) else list(inputs)
    if not inputs:
        return iter(()) if generator else []

    function_bytes = dumps_function(function_)
    if len(function_bytes) > MAX_FUNCTION_BYTES:
        raise FunctionTooBig(
            f"{_name(function_)} is {len(function_bytes) / 2**20:.1f} MB pickled; the limit is "
            f"{MAX_FUNCTION_BYTES // 2**20} MB. It references large objects from its enclosing scope: pass "
            "them as inputs, or load them inside the function."
        )
    settings = ClientSettings.resolve()
    cluster = connect(settings, allow_embedded=not detach, meanwhile=prefetch_environment)
    spec = wire.OpenJob(
        job_id=_job_id(function_),
        function_name=_name(function_),
        function_bytes=function_bytes,
        n_inputs=len(inputs),
        func_cpu=cpu,
        func_ram=ram,
        func_gpu=func_gpu,
        image=image,
        grow=bool(grow),
        max_parallelism=max_parallelism,
        detach=bool(detach),
        raise_errors=bool(raise_errors),
        region=region,
        disk_gb=disk_gb,
        parent_job_id=settings.parent_job_id,
        client_version=__version__,
        python_version=f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}",
        local_code=local_code.collect(function_),
        packages=client_packages(),
        # A detached job's inputs must outlive this process: they travel inline.
        client_host="" if detach else input_files.host_id(),
    )
    display = Display(len(inputs), show_progress=spinner)
    warning = not_replicated_warning()
    if warning is not None:
        display.announce(warning)
    runner = JobRunner(cluster, spec.job_id, display, opening=spec, inputs=inputs)
    runner.start()
    if detach:
        return _detach(runner, cluster)
    if generator:
        return _results_as_completed(runner, cluster, raise_errors)
    return _results_in_order(runner, cluster, raise_errors)


def _results_in_order(runner: JobRunner, cluster: ClusterHandle, raise_errors: bool) -> list[Any]:
    batches = _outcome_batches(runner, cluster, raise_errors)
    try:
        _wait(runner.opened, runner)
    except BaseException:
        batches.close()
        raise
    results: list[Any] = [None] * runner.n_inputs
    for batch in batches:  # a batch at a time: a generator step per result was most of this thread's time
        for index, _ok, value in batch:
            results[index] = value
    return results


def _results_as_completed(runner: JobRunner, cluster: ClusterHandle, raise_errors: bool) -> Iterator[Any]:
    for batch in _outcome_batches(runner, cluster, raise_errors):
        for outcome in batch:
            yield outcome.value


def _wait(event, runner: JobRunner) -> None:
    """Wait for a runner event; Ctrl-C cancels the job."""
    try:
        while not event.wait(0.25):
            pass
    except KeyboardInterrupt:
        runner.cancel("Ctrl-C in the client")
        raise JobCanceled(f"job {runner.job_id} canceled by Ctrl-C") from None


def _outcome_batches(runner: JobRunner, cluster: ClusterHandle, raise_errors: bool) -> Iterator[list[Outcome]]:
    with waiting_on_children():  # inside a worker: lend this slot while the nested job runs
        yield from _collect(runner, cluster, raise_errors)


def _collect(runner: JobRunner, cluster: ClusterHandle, raise_errors: bool) -> Iterator[list[Outcome]]:
    """Outcomes as they arrive, in batches; with raise_errors, the first failed one raises (after
    the outcomes before it in its batch)."""
    received = 0
    try:
        while not (runner.opened.is_set() and received >= runner.n_inputs and runner.error is None):
            batch = runner.next_outcomes()
            if batch is None:
                break
            if not batch:
                continue
            received += len(batch)
            if raise_errors:
                failed = next((position for position, outcome in enumerate(batch) if not outcome.ok), None)
                if failed is not None:
                    if failed:
                        yield batch[:failed]
                    raise batch[failed].value
            yield batch
        if runner.error is not None:
            raise runner.error
        if received < runner.n_inputs:
            raise JobCanceled(f"job {runner.job_id} ended with {runner.n_inputs - received} results missing")
    except KeyboardInterrupt:
        runner.cancel("Ctrl-C in the client")
        raise JobCanceled(f"job {runner.job_id} canceled by Ctrl-C") from None
    finally:
        runner.close()
        runner.display.finish()
        cluster.close()


def _detach(runner: JobRunner, cluster: ClusterHandle) -> str:
    _wait(runner.uploaded, runner)
    if runner.error is not None:
        raise runner.error
    print(f"Done uploading inputs! Job {runner.job_id} runs on at {cluster.url}", file=sys.stderr)
    runner.close()
    return runner.job_id


def get_results(job_id: str, generator: bool = False, raise_errors: bool = True, spinner: bool = True) -> Any:
    """Collect the results of a job started with `detach=True` (in input order, or as an iterator).

    The head keeps a detached job's results until they are collected; this waits for calls
    still running. Raises `JobNotFound` if the head has no results for that job (never ran
    there, already collected, or the head restarted).
    """
    if not isinstance(job_id, str) or not job_id:
        raise InvalidArgument(f"job_id must be the string remote_parallel_map(detach=True) returned, got {job_id!r}")
    settings = ClientSettings.resolve()
    cluster = connect(settings, allow_embedded=False)
    runner = JobRunner(cluster, job_id, Display(0, show_progress=spinner))
    runner.start()
    if generator:
        return _results_as_completed(runner, cluster, raise_errors)
    return _results_in_order(runner, cluster, raise_errors)


def get_cluster_dashboard_url() -> str:
    """The URL of this machine's cluster head, starting one in the background if none runs.

    A head started here keeps running after this process exits (with one local node), so
    later jobs start warm and job pages stay up.
    """
    settings = ClientSettings.resolve()
    if settings.head_url:
        return settings.head_url
    url = running_local_head(settings)
    if url is not None:
        return url
    from burla.config import load_or_create_token

    token = settings.token or load_or_create_token(settings.config_dir)
    return start_head(settings, token, embedded=False).url


# --- argument checks ---------------------------------------------------------------------


def _resources(name: str, value: Any, integer: bool) -> Any:
    if value == "dynamic" or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "a positive integer" if integer else "a positive number"
        raise InvalidArgument(f"{name} must be \"dynamic\" or {kind}, got {value!r}")
    if value <= 0:
        raise InvalidArgument(f"{name} must be positive, got {value!r}")
    return int(value) if integer else float(value)


def _check_options(function_: Any, func_gpu: Any, image: Any, region: Any, disk_gb: Any, max_parallelism: Any) -> None:
    if not callable(function_):
        raise InvalidArgument(f"function_ must be callable, got {type(function_).__name__}")
    if func_gpu is not None and (not isinstance(func_gpu, str) or func_gpu.upper() not in GPU_CHOICES):
        raise InvalidArgument(f"func_gpu must be one of {', '.join(GPU_CHOICES)} or None, got {func_gpu!r}")
    if image is not None and not matches(IMAGE, image):
        raise InvalidArgument(f"image must be a container image reference such as python:3.12-slim or "
                              f"ghcr.io/org/app:1.2 (letters, digits and ._/:@+-, not starting with -), got {image!r}")
    if region is not None and not matches(REGION, region):
        raise InvalidArgument(f"region must be a cloud region name such as us-east-1, us-central1 or eastus, "
                              f"got {region!r}")
    for name, value in (("disk_gb", disk_gb), ("max_parallelism", max_parallelism)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidArgument(f"{name} must be a positive integer or None, got {value!r}")


def _name(function_: Any) -> str:
    return getattr(function_, "__name__", None) or type(function_).__name__


def _job_id(function_: Any) -> str:
    token = base64.urlsafe_b64encode(uuid.uuid4().bytes[:9]).decode()
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in _name(function_))[:60] or "job"
    return f"{name}-{token}"

