"""burla: run one Python function over many inputs on every CPU you have.

    from burla import remote_parallel_map
    results = remote_parallel_map(process, inputs)

Heavy modules load on first use so that `import burla` stays fast, in the user's process and
in every worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from burla._version import __version__
from burla.errors import (
    BurlaError,
    CallExited,
    CallTimeout,
    ClusterRestarted,
    ClusterShutdown,
    DetachRequiresDeployedCluster,
    FunctionTooBig,
    HeadNotVerified,
    InputTooBig,
    InvalidArgument,
    JobCanceled,
    JobFailed,
    JobNotFound,
    NoCompatibleNodes,
    NodeDisconnected,
    NoNodes,
    OutOfMemory,
    RemoteError,
    Unauthorized,
    UnpicklableFunction,
    UnpicklableInput,
    VersionMismatch,
    WorkerCrashed,
)

if TYPE_CHECKING:
    from burla.client.api import Client, get_cluster_dashboard_url, get_results, remote_parallel_map

__all__ = [
    "__version__",
    "remote_parallel_map",
    "get_cluster_dashboard_url",
    "get_results",
    "Client",
    "BurlaError",
    "DetachRequiresDeployedCluster",
    "FunctionTooBig",
    "HeadNotVerified",
    "InputTooBig",
    "InvalidArgument",
    "JobCanceled",
    "ClusterShutdown",
    "ClusterRestarted",
    "CallExited",
    "CallTimeout",
    "JobFailed",
    "JobNotFound",
    "NoCompatibleNodes",
    "NoNodes",
    "NodeDisconnected",
    "OutOfMemory",
    "RemoteError",
    "Unauthorized",
    "UnpicklableFunction",
    "UnpicklableInput",
    "VersionMismatch",
    "WorkerCrashed",
]


def __getattr__(name: str) -> Any:
    if name in ("remote_parallel_map", "get_cluster_dashboard_url", "get_results", "Client"):
        from burla.client import api

        return getattr(api, name)
    raise AttributeError(f"module 'burla' has no attribute {name!r}")
