"""What the cluster asks of whoever keeps its machines (the head's fleet, head/machines/fleet.py)."""

from __future__ import annotations

from typing import Protocol

from burla.protocol import wire
from burla.protocol.states import BootStage


class Machines(Protocol):
    """What the cluster asks of whoever keeps its machines (the head's fleet)."""

    async def ready_for(self, spec: wire.OpenJob) -> None:
        """Before a job is admitted: what planning its machines needs is read (the cloud's list)."""

    def prepare_job(self, spec: wire.OpenJob) -> None:
        """Boot what a new job needs (grow, or restart local nodes removed for idleness)."""

    def remove_machine(self, node_id: str, why: str) -> None:
        """A node that left or went silent: its machine goes (cloud nodes)."""

    def registration_problem(self, msg: wire.RegisterNode) -> str | None:
        """Why a node this head booted can't join as it registers (it lacks its machine's GPUs)."""

    def boot_stage(self, node_id: str) -> BootStage:
        """How far a booting machine has come."""


class NoMachines:
    """Before the fleet is made (and in a cluster without one): nothing to boot or remove."""

    async def ready_for(self, spec: wire.OpenJob) -> None:
        pass

    def prepare_job(self, spec: wire.OpenJob) -> None:
        pass

    def remove_machine(self, node_id: str, why: str) -> None:
        pass

    def registration_problem(self, msg: wire.RegisterNode) -> str | None:
        return None

    def boot_stage(self, node_id: str) -> BootStage:
        return BootStage.REQUESTED
