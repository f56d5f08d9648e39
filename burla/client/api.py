"""The public API: remote_parallel_map, get_results and get_cluster_dashboard_url, each a thin
wrapper over a `Client` whose settings are resolved from the environment."""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from burla.client.local_cluster import background_head, connect, running_local_head
from burla.client.tracebacks import user_facing, user_facing_iterator
from burla.config import ClientSettings
from burla.errors import InvalidArgument
from burla.protocol.job_options import JobOptions

if TYPE_CHECKING:
    from burla.protocol import wire


class Client:
    """One cluster to run jobs on, its settings resolved once.

    `Client()` finds the cluster as `remote_parallel_map` does (BURLA_CLUSTER_DASHBOARD_URL, the
    head `burla deploy` started, this machine's running head, or a new background head);
    `Client(head_url, token)` names a head outright, whatever the environment says. Its
    certificate (an https head) is `head_cert`, else the one configured for this machine.
    """

    def __init__(self, head_url: str | None = None, token: str | None = None, head_cert: str | None = None,
                 settings: ClientSettings | None = None) -> None:
        if head_url is not None and (not isinstance(head_url, str) or not head_url.startswith(("http://", "https://"))):
            raise InvalidArgument(f"head_url must be an http:// or https:// URL, got {head_url!r}")
        self._head_url = head_url.rstrip("/") if head_url is not None else None
        self._token = token
        self._head_cert = head_cert
        self._given = settings
        self._resolved: ClientSettings | None = None

    @property
    def settings(self) -> ClientSettings:
        """Resolved on first use (a job with no inputs reads no configuration), then kept."""
        if self._resolved is None:
            base = self._given or ClientSettings.resolve()
            self._resolved = dataclasses.replace(
                base, head_url=self._head_url or base.head_url, token=self._token or base.token,
                head_cert=self._head_cert or base.head_cert)
        return self._resolved

    @user_facing
    def remote_parallel_map(
        self,
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
        retries: int = 0,
        timeout: float | None = None,
    ) -> list[Any] | Iterator[Any]:
        """`burla.remote_parallel_map` on this client's cluster."""
        if not callable(function_):
            raise InvalidArgument(f"function_ must be callable, got {type(function_).__name__}")
        options = JobOptions.checked(
            func_cpu=func_cpu, func_ram=func_ram, func_gpu=func_gpu, image=image, grow=grow,
            max_parallelism=max_parallelism, detach=detach, raise_errors=raise_errors, region=region, disk_gb=disk_gb,
            retries=retries, timeout=timeout)
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
            raise InvalidArgument(f"inputs must be a list (or other iterable) of inputs, got {type(inputs).__name__}")
        inputs = inputs if isinstance(inputs, list) else list(inputs)
        if not inputs:
            return iter(()) if generator else []
        settings = self.settings
        opened: list[wire.OpenJob] = []

        def prepare() -> None:
            # While an embedded head starts: most of what a cold client does before a job is
            # importing and pickling, and the head's start is the longer wait.
            from burla.client import session
            from burla.protocol.replication import environment

            environment.prefetch()
            opened.append(session.opening(_job_id(function_), function_, _name(function_), len(inputs),
                                          dataclasses.replace(options, parent_job_id=settings.parent_job_id),
                                          direct_inputs=settings.direct_inputs,
                                          direct_results=settings.direct_results))

        cluster = connect(settings, allow_embedded=not options.detach, meanwhile=prepare)
        from burla.client import session

        try:
            results = session.run(cluster, opened[0], inputs, spinner, generator)
        except BaseException:
            cluster.close()
            raise
        return user_facing_iterator(results) if generator else results

    @user_facing
    def get_results(self, job_id: str, generator: bool = False, raise_errors: bool = True,
                    spinner: bool = True) -> Any:
        """`burla.get_results` on this client's cluster."""
        if not isinstance(job_id, str) or not job_id:
            raise InvalidArgument(
                "job_id must be a job's id (printed by remote_parallel_map(detach=True) in \"Done uploading inputs! "
                f"Job JOB_ID\", or listed by `burla jobs list`), got {job_id!r}")
        cluster = connect(self.settings, allow_embedded=False)
        from burla.client import session

        results = session.collect(cluster, job_id, spinner, generator, raise_errors)
        return user_facing_iterator(results) if generator else results

    def dashboard_url(self) -> str:
        """`burla.get_cluster_dashboard_url` for this client's cluster."""
        settings = self.settings
        if settings.head_url:
            return settings.head_url
        from burla.config import load_or_create_token

        token = settings.token or load_or_create_token(settings.config_dir)
        url = running_local_head(settings, token)
        if url is not None:
            return url
        return background_head(settings, token).url


@user_facing
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
    retries: int = 0,
    timeout: float | None = None,
) -> list[Any] | Iterator[Any]:
    """Call `function_` once per input, in parallel on every CPU of the cluster.

    Each input is one call: a tuple is unpacked into positional arguments (nest it,
    `[((1, 2),)]`, to pass one tuple). Returns the results **in input order**, or with
    `generator=True` an iterator yielding them as they complete. A call's exception is
    re-raised here with its original type, the remote traceback and `exc.burla_input_index`;
    with `raise_errors=False` the exception object stands in that input's place instead.
    Whatever calls print appears here live. With no cluster configured, a local cluster is
    started on this machine for the job and stopped after. With `detach=True`, once every input
    is uploaded it prints "Done uploading inputs! Job JOB_ID ..."; from then on the job runs on
    if this process ends (collect it with `get_results`), and a process that stays gets its results.
    Ctrl-C cancels the job (a detached one runs on once uploaded) and raises KeyboardInterrupt.
    `retries=N` runs a call that raised (or timed out) again up to N times; `timeout=SECONDS`
    stops a call that runs longer (its worker is replaced) and fails it with CallTimeout.
    (`Client(head_url, token).remote_parallel_map` runs on a head named outright.)
    """
    return Client().remote_parallel_map(
        function_, inputs, func_cpu=func_cpu, func_ram=func_ram, func_gpu=func_gpu, image=image, grow=grow,
        max_parallelism=max_parallelism, detach=detach, generator=generator, raise_errors=raise_errors,
        spinner=spinner, region=region, disk_gb=disk_gb, retries=retries, timeout=timeout,
    )


@user_facing
def get_results(job_id: str, generator: bool = False, raise_errors: bool = True, spinner: bool = True) -> Any:
    """Collect the results of a job started with `detach=True` (in input order, or as an iterator).

    The head keeps a detached job's results until they are collected; this waits for calls
    still running. Raises `JobNotFound` if the head has no results for that job (it never ran
    there, or they were collected already). Ctrl-C stops waiting and leaves the job running.
    """
    return Client().get_results(job_id, generator=generator, raise_errors=raise_errors, spinner=spinner)


def get_cluster_dashboard_url() -> str:
    """The URL of this machine's cluster head, starting one in the background if none runs.

    A head started here keeps running after this process exits (with one local node), so
    later jobs start warm and job pages stay up.
    """
    return Client().dashboard_url()


# --- argument checks ---------------------------------------------------------------------


def _name(function_: Any) -> str:
    return getattr(function_, "__name__", None) or type(function_).__name__


def _job_id(function_: Any) -> str:
    token = base64.urlsafe_b64encode(uuid.uuid4().bytes[:9]).decode()
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in _name(function_))[:60] or "job"
    return f"{name}-{token}"

