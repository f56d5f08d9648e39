"""What the cloud drivers (EC2, GCE, Azure) share: the tags that mark a cluster's machines, and
the thread pool libcloud's blocking calls run in (`burla.drivers.registry` names the drivers). (VMs
are set up over SSH by the head: `burla.drivers.ssh.driver`.)

libcloud is blocking and its driver objects are not thread safe (connection state, GCE paging
parameters, zone caches), so every call runs in a dedicated pool with one libcloud driver per
thread (DESIGN.md §2). Cancelling an awaiting task does not stop its thread, so each driver also
sets request timeouts.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from burla.drivers.bake import BakedLookup
from burla.drivers.base import BootRequest, CloudCheck, Driver, VmAddress
from burla.drivers.ssh.host_keys import console_host_keys
from burla.errors import BurlaError, CloudRefused, CloudSetupError

if TYPE_CHECKING:
    from burla.drivers.head_vm import HeadMachine

CLOUD_LIBRARIES = ("libcloud", "botocore")  # what the drivers call the clouds through
CLUSTER_TAG = "burla-cluster"
NODE_TAG = "burla-node-id"
POOL_THREADS = 8

log = logging.getLogger(__name__)


class ThreadedCloudDriver(Driver):
    """A driver whose libcloud calls run in its own pool, one libcloud driver object per thread."""

    ssh_user: str  # the login its VMs' images accept
    image_preparation = ""  # shell lines a scrubbed image builder runs last, as the cloud's imaging needs

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix=f"libcloud-{self.name}")
        self._local = threading.local()
        self.on_boot_failed = None
        self.baked = BakedLookup()  # boots read the newest baked image of their key through it

    @abc.abstractmethod
    def _new_libcloud_driver(self) -> Any:
        """A libcloud driver for the calling thread (runs in the pool)."""

    def login_user(self, node_id: str) -> str:
        """The user this node's VM accepts logins for (its image's)."""
        return self.ssh_user

    def _driver(self) -> Any:
        driver = getattr(self._local, "driver", None)
        if driver is None:
            driver = self._local.driver = self._new_libcloud_driver()
        return driver

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(libcloud driver, *args)` in the pool; what the cloud's API refuses is a CloudRefused
        carrying the cloud's own message."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, lambda: fn(self._driver(), *args))
        except BurlaError:
            raise
        except Exception as e:
            if not type(e).__module__.startswith(CLOUD_LIBRARIES):
                raise
            problem = self._setup_problem(cloud_message(e))
            if problem is not None:
                raise CloudSetupError(problem) from e
            raise CloudRefused(f"{self.name}: {cloud_message(e)}", kind=refusal_kind(e)) from e

    def _setup_problem(self, message: str) -> str | None:
        """A cloud error that is the user's setup (expired credentials), as a sentence with its fix."""
        return None

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- nodes: each call runs in the pool ---------------------------------------------------

    async def boot(self, request: BootRequest) -> list[str]:
        """Start the request's machines; if any fails, a CloudRefused naming the ones that did start
        (they bill from now: the caller keeps track of them)."""
        node_ids = request.ids("burla-node")
        results = await asyncio.gather(*(self._call(self._boot_one_or_stock, request, node_id)
                                         for node_id in node_ids), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            return node_ids
        booted = [node_id for node_id, r in zip(node_ids, results, strict=True) if not isinstance(r, BaseException)]
        first = failures[0]
        if not isinstance(first, Exception) or (not booted and isinstance(first, BurlaError)
                                                and not isinstance(first, CloudRefused)):
            raise first  # a cancellation, or burla's own refusal before the cloud was asked, as it came
        what = f"{len(failures)} of {len(node_ids)} machine(s) of type {request.machine_type or 'the default'}"
        kind = first.kind if isinstance(first, CloudRefused) else None
        raise CloudRefused(f"{what} could not start: {first}", booted, kind) from first

    def _boot_one_or_stock(self, driver: Any, request: BootRequest, node_id: str) -> str:
        """`_boot_one`; when the cloud refuses it because the baked image it chose is gone (deleted
        since it was looked up), once more: the lookup then finds another baked image or none."""
        try:
            return self._boot_one(driver, request, node_id)
        except Exception as e:
            gone = self.baked.refused(cloud_message(e))
            if gone is None:
                raise
            log.warning("baked image %s is gone; %s boots without it", gone, node_id)
        return self._boot_one(driver, request, node_id)

    async def delete(self, node_id: str) -> bool:
        return await self._call(self._delete, node_id)

    async def delete_baked_image(self, image_id: str) -> bool:
        try:
            return await self._call(self._delete_baked, image_id)
        finally:  # after the delete: a lookup that ran meanwhile may have found the image still there
            self.baked.forget()

    def _delete_baked(self, driver: Any, image_id: str) -> bool:
        """Delete a baked image (runs in the pool); False if there is no such one."""
        return False

    async def check(self, machine_type: str | None = None) -> list[CloudCheck]:
        try:
            return await self._call(self._checks, machine_type)
        except CloudSetupError as e:  # no credentials, no project: nothing else can be asked
            return [CloudCheck("credentials", CloudCheck.FAIL, str(e))]
        except CloudRefused as e:
            return [CloudCheck("credentials", CloudCheck.FAIL, str(e), "sign in again with the cloud's CLI")]

    @abc.abstractmethod
    def _checks(self, driver: Any, machine_type: str | None) -> list[CloudCheck]: ...

    async def boot_log(self, node_id: str) -> str:
        return await self._call(self._console, node_id)

    async def reported_host_keys(self, node_id: str) -> list[str]:
        """Those cloud-init printed to the VM's serial console (EC2, Azure; GCE reads guest attributes)."""
        return console_host_keys(await self.boot_log(node_id))

    async def reported_head_host_keys(self, name: str) -> list[str]:
        """The head VM's, as `reported_host_keys` reads a node's."""
        return console_host_keys(await self._call(self._head_console, name))

    def _head_console(self, driver: Any, name: str) -> str:
        """The head VM's serial console output ("" until there is one)."""
        return ""

    async def address(self, node_id: str) -> VmAddress | None:
        """The VM's public and private addresses once it runs; None before."""
        return await self._call(self._address, node_id)

    @abc.abstractmethod
    def _boot_one(self, driver: Any, request: BootRequest, node_id: str) -> str: ...

    @abc.abstractmethod
    def _delete(self, driver: Any, node_id: str) -> bool: ...

    @abc.abstractmethod
    def _console(self, driver: Any, node_id: str) -> str: ...

    @abc.abstractmethod
    def _address(self, driver: Any, node_id: str) -> VmAddress | None: ...

    # --- the head VM of `burla deploy` --------------------------------------------------------

    async def boot_head(self, head: HeadMachine) -> None:
        """Start the head VM: reachable on its port from anywhere (token and TLS guard it), allowed
        to boot and delete this cluster's nodes with the cloud's own credentials for VMs."""
        await self._call(self._boot_head, head)

    async def head_address(self, name: str) -> str | None:
        """The head VM's public IP address, once it has one."""
        return await self._call(self._head_address, name)

    async def delete_head(self, name: str) -> bool:
        return await self._call(self._delete_head, name)

    @abc.abstractmethod
    def _boot_head(self, driver: Any, head: HeadMachine) -> None: ...

    @abc.abstractmethod
    def _head_address(self, driver: Any, name: str) -> str | None: ...

    @abc.abstractmethod
    def _delete_head(self, driver: Any, name: str) -> bool: ...


# How each cloud says "over your quota" and "none left in this zone" (error codes, and the words
# of those that come without one). EC2: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
# Compute Engine: https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability
# Azure: https://learn.microsoft.com/azure/virtual-machines/allocation-failure
QUOTA_SIGNS = ("VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded", "QUOTA_EXCEEDED",
               "quotaExceeded", "QuotaExceeded", "exceeding approved")
CAPACITY_SIGNS = ("InsufficientInstanceCapacity", "InsufficientCapacity", "ZONE_RESOURCE_POOL_EXHAUSTED",
                  "does not have enough resources available", "AllocationFailed", "SkuNotAvailable",
                  "is not supported in your requested Availability Zone")


def first_with_capacity(places: list[Any], attempt: Callable[[Any], Any], name: Callable[[Any], str],
                        what: str) -> Any:
    """`attempt(place)` for each place (zone, subnet) in turn until one has capacity for `what`;
    when none has, a capacity refusal that says what each answered."""
    refused = []
    for place in places:
        try:
            return attempt(place)
        except Exception as e:
            if refusal_kind(e) != CloudRefused.CAPACITY:
                raise
            refused.append(f"{name(place)}: {cloud_message(e)}")
    raise CloudRefused(f"no zone had capacity for {what}: " + "; ".join(refused), kind=CloudRefused.CAPACITY)


def refusal_kind(error: BaseException) -> str | None:
    """CloudRefused.QUOTA, CloudRefused.CAPACITY, or None, from a cloud library's error."""
    words = f"{getattr(error, 'code', '')} {cloud_message(error)}"
    if any(sign in words for sign in QUOTA_SIGNS):
        return CloudRefused.QUOTA
    if any(sign in words for sign in CAPACITY_SIGNS):
        return CloudRefused.CAPACITY
    return None


def cloud_message(error: BaseException) -> str:
    """The cloud's own sentence in a libcloud or botocore error (libcloud's str() is a repr)."""
    value = getattr(error, "value", None)
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        return value["message"]
    message = getattr(error, "message", None)
    return message if isinstance(message, str) and message else str(error)
