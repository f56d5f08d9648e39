"""The driver interface: how a head boots, lists and deletes the machines its nodes run on.

A driver starts machines that end up running `burla node join --head URL` with the cluster
token (local processes directly; cloud VMs once the head set them up over SSH, see
`burla.drivers.ssh.driver`); the node then registers with the head by itself. The head owns every
driver call.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from burla.drivers.catalog import MachineType
from burla.protocol.states import BootStage, MachineState


@dataclass(frozen=True)
class BootRequest:
    count: int
    head_url: str
    token: str
    workers: int | None = None  # per node; None means one per CPU
    machine_type: str | None = None
    region: str | None = None
    disk_gb: int | None = None
    image: str | None = None
    spot: bool = False
    gpu: str | None = None
    gpu_count: int = 0
    node_ids: tuple[str, ...] = ()  # names for the nodes (else the driver picks them)
    python_version: str | None = None  # major.minor for the nodes' Python (None: the head's)
    head_cert: str | None = None  # PEM of the head's own certificate, which nodes pin (https heads)
    ssh_public_key: str | None = None  # the cluster's key (OpenSSH form), authorised through the cloud
    power_off_after_s: float | None = None  # a VM not set up by then powers itself off (its user data)

    def ids(self, prefix: str) -> list[str]:
        import secrets

        return list(self.node_ids) or [f"{prefix}-{secrets.token_hex(4)}" for _ in range(self.count)]


@dataclass(frozen=True)
class NodeHandle:
    node_id: str
    driver: str
    state: MachineState
    detail: str = ""


@dataclass(frozen=True)
class VmAddress:
    """Where a VM is reachable: its public address (from outside its network) and private one."""

    public: str | None
    private: str | None


@dataclass(frozen=True)
class QuotaRoom:
    """A cloud quota on vCPUs and how much of it is in use (a region's, for one kind of machine)."""

    name: str  # as the cloud names it
    limit: int
    used: int
    how_to_raise: str  # a sentence: where, or which command

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)

    def sentence(self) -> str:
        return (f"the quota {self.name!r} is {self.limit} vCPUs, {self.used} of them in use; to raise it, "
                f"{self.how_to_raise}")


@dataclass(frozen=True)
class CloudCheck:
    """One thing `burla cloud check` verified: credentials, a permission, a quota, the SSH path..."""

    OK: ClassVar[str] = "ok"
    WARN: ClassVar[str] = "warn"  # may still work; the detail says what could not be told
    FAIL: ClassVar[str] = "fail"  # booting would fail: `fix` says what to do

    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class BakedImage:
    """A private image of the node runtime (a Python with this build installed) in the user's
    account, which later VMs of the same key boot from instead of installing it."""

    image_id: str
    name: str
    key: str  # build, Python, base image and architecture it serves (see Driver.bake_key)
    created: str  # as the cloud states it
    state: str  # the cloud's word: available, pending...
    region: str = ""  # where it serves, if images are regional in a driver that boots in several (Azure)


BootFailed = Callable[[str, str], None]  # (node_id, why)


class Driver(abc.ABC):
    name: str
    on_this_machine = False  # its nodes run where the head runs (they share its input-file directory)
    on_boot_failed: BootFailed | None = None  # told of a machine that can't become a node (it is deleted)

    @abc.abstractmethod
    async def boot(self, request: BootRequest) -> list[str]:
        """Start `request.count` machines; returns their node ids at once, before they register."""

    @abc.abstractmethod
    async def list_nodes(self) -> list[NodeHandle]:
        """The machines this driver started for this cluster that still exist."""

    @abc.abstractmethod
    async def delete(self, node_id: str) -> bool:
        """Stop one machine; returns False if this driver has no such machine."""

    def boot_stage(self, node_id: str) -> BootStage:
        """How far a booting machine has come (drivers that set machines up say more)."""
        return BootStage.REQUESTED

    def boot_problem(self, node_id: str) -> str | None:
        """Why a booting machine is not (yet) a node, when the driver knows; None otherwise."""
        return None

    async def boot_log(self, node_id: str) -> str:
        """What the machine printed while booting (its console), for history; "" if unknown."""
        return ""

    async def check(self, machine_type: str | None = None) -> list[CloudCheck]:
        """What `burla cloud check` verifies before VMs boot (nothing for machines of this host)."""
        return []

    @property
    def region(self) -> str:
        """The region this driver boots in ("" for machines of this host)."""
        return ""

    async def machine_types(self) -> list[MachineType]:
        """Every machine type the region offers this account, as the cloud's API lists them
        (uncached: `burla.drivers.machine_catalog` keeps them); none for machines of this host."""
        return []

    async def quota_room(self, machine_type: str, spot: bool) -> QuotaRoom | None:
        """The vCPU quota this machine type counts against and its use; None when there is none
        or it can't be read (then the cloud's refusal at boot says it)."""
        return None

    async def bake_key(self, request: BootRequest) -> str | None:
        """What a baked image for VMs booted for `request` is keyed by; None when this driver (or
        this request: a container image, a user's own machine image) does not bake."""
        return None

    async def builder_machine_type(self, request: BootRequest) -> str | None:
        """The machine an image builder for `request`'s VMs boots, where they boot: a small one of
        their family (same architecture, same image) with fewer vCPUs than theirs, so baking bills
        little and leaves the quota to the job; their own type where there is none."""
        return request.machine_type

    async def reported_host_keys(self, node_id: str) -> list[str]:
        """The VM's SSH host keys as the cloud reports them (burla.drivers.ssh.host_keys); [] until it
        does. A first SSH connection is kept only if its server presents one of them."""
        return []

    async def reported_head_host_keys(self, name: str) -> list[str]:
        """The SSH host keys of the head VM `name` (`burla deploy`) as the cloud reports them."""
        return []

    def image_region(self, request: BootRequest) -> str:
        """Where an image baked for `request` serves, when the cloud's images are regional and this
        driver boots in several regions (Azure: `BakedImage.region`); "" where one image serves
        every boot of the driver (GCE images are global, an EC2 driver boots in one region)."""
        return ""

    async def baked_images(self) -> list[BakedImage]:
        """The baked images in the user's account (every cluster's: they hold no secret)."""
        return []

    async def bake(self, node_id: str, key: str) -> BakedImage:
        """Image the VM of `node_id` (set up and scrubbed), tagged with `key`; returns once the
        image is available."""
        raise NotImplementedError(f"{self.name} does not bake images")

    async def delete_baked_image(self, image_id: str) -> bool:
        """Delete a baked image and its snapshots; False if there is no such baked image."""
        return False

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the driver's resources. Cloud machines outlive their head (their nodes join the
        next one); the local driver stops its node processes, which can't."""
