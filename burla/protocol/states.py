"""The states a job, a node and a machine can be in, and the kinds a job can end with.

They are `StrEnum`s: each member is its own name as a string, which is how it travels on the
wire, sits in history's database and shows in the API, so those stay plain text.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import TypeVar

log = logging.getLogger("burla")


class JobStatus(StrEnum):
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


class NodeStatus(StrEnum):
    """What a registered node reports: idle, or running calls."""

    READY = "READY"
    RUNNING = "RUNNING"


class MachineState(StrEnum):
    """What a driver says of a machine it manages."""

    BOOTING = "BOOTING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"


class BootStage(StrEnum):
    """How far a booting machine has come, in order; a machine that registers has joined."""

    REQUESTED = "requested"  # the cloud accepted the boot
    RUNNING = "running"  # the VM has a network address
    SSH = "ssh"  # the head is logging in
    INSTALLING = "installing"  # the build is uploaded and the bootstrap runs
    STARTING = "starting"  # the node is started and has not registered yet


class EndKind(StrEnum):
    """Why a job ended that did not complete: the name of the `burla.errors` class a client raises
    for it (tests check each names one). COMPLETED jobs end with NONE."""

    NONE = ""
    CALL_FAILED = "CallFailed"  # a call raised, and the job stopped at its first failure (raise_errors)
    JOB_FAILED = "JobFailed"
    JOB_CANCELED = "JobCanceled"
    CLUSTER_SHUTDOWN = "ClusterShutdown"  # the cluster was stopped under it
    CLUSTER_RESTARTED = "ClusterRestarted"  # the cluster was restarted under it
    NO_NODES = "NoNodes"
    NO_COMPATIBLE_NODES = "NoCompatibleNodes"
    NODE_DISCONNECTED = "NodeDisconnected"


S = TypeVar("S", JobStatus, NodeStatus, MachineState, EndKind)


def parse_state(kind: type[S], text: str | None, default: S) -> S:
    """A state read back from text written by this or another burla version (history, an API
    answer): `default` for one this version does not know, so one odd row can't break a listing."""
    try:
        return kind(text) if text else default
    except ValueError:
        log.warning("unknown %s %r; reading it as %s", kind.__name__, text, default)
        return default
