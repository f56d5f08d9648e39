"""Faster second boots: once a VM had to install the node runtime (a Python with this build and
its dependencies), the head bakes a private image of that runtime in the background, and later
VMs of the same key (build, Python, image family, architecture) boot from it and skip the
install.

Baking never touches a node: a builder VM, the smallest of the node's machine family, is booted, set up with the
bootstrap alone (no token, no certificate, no node), scrubbed (`bootstrap.scrub_script`: nothing
of a cluster stays, and a power-off timer is armed in case this head dies), imaged by the cloud,
and deleted. It carries the cluster's tags, so `burla cluster stop`, a stopping head and the next
head's sweep delete it like any VM of the cluster. Drivers that can bake say so through
`Driver.bake_key`; `BURLA_BAKE_IMAGES=0` turns baking off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from burla.drivers.base import BakedImage, BootRequest, VmAddress
from burla.drivers.ssh.bootstrap import SCRIPT_FILE, PackageSource, install_script, installed_tag, remote, scrub_script
from burla.drivers.ssh.host_keys import verified_connection
from burla.drivers.ssh.login import SshLogin, completed_output, upload_setup
from burla.errors import BootstrapFailed, CloudRefused
from burla.process.loop_supervisor import end_tasks

log = logging.getLogger(__name__)

BUILDER_PREFIX = "burla-bake"
ADDRESS_POLL_S = 3.0
BUILDER_POWER_OFF_S = 3600.0  # a builder its head never deleted powers itself off after this long
LOOKUP_TTL_S = 60.0  # how long a baked-image lookup's answer serves boots
FAILED_LOOKUP_TTL_S = 10.0  # how long a failed lookup's "none" serves them
# How a create call says its image does not exist: EC2 InvalidAMIID.NotFound "The image id '[ami-…]'
# does not exist"; Compute Engine "The resource 'projects/…/global/images/…' was not found"; Azure
# NotFound "The Image '/subscriptions/…/images/…' cannot be found" (ResourceNotFound "… was not found").
MISSING_IMAGE_SIGNS = ("does not exist", "was not found", "cannot be found", "NotFound")
BAKE_WAIT_S = 1800.0  # the longest an image may take to become available
BAKE_POLL_S = 5.0
NodeEvent = Callable[[str, str, str], None]  # (node id, kind, detail)


@dataclasses.dataclass
class BakeSettings:
    login: SshLogin  # the cluster's key; the user is each builder's image's
    wheel: Path  # this build
    packages: PackageSource
    public_key: str  # the cluster's, authorised on builders as on nodes
    deadline_s: float  # to set a builder up, as for a node
    tunnel: bool  # a head outside the cloud network dials public addresses


def image_key(build: str, python: str, family: str, architecture: str) -> str:
    """What a baked image serves: a build, for a Python major.minor, on an image family and CPU
    architecture, in the characters every cloud takes in image names and labels (lowercase
    letters, digits, `-` and `_`), e.g. `0-2-0-c18313333c8f7d18-py311-al2023-x86_64`."""
    return re.sub(r"[^a-z0-9_-]", "-", f"{build}-py{python.replace('.', '')}-{family}-{architecture}".lower())[:63]


async def until_available(poll: Callable[[], Awaitable[BakedImage]], what: str, wait_s: float = BAKE_WAIT_S,
                          every_s: float = BAKE_POLL_S) -> BakedImage:
    """Poll an image being made until the cloud says it is available; a final failure state, or
    `wait_s` passing, is a CloudRefused naming `what`."""
    deadline = time.monotonic() + wait_s
    while True:
        baked = await poll()
        if baked.state == "available":
            return baked
        if baked.state in ("failed", "invalid", "error") or time.monotonic() > deadline:
            raise CloudRefused(f"{what} ended {baked.state}")
        await asyncio.sleep(every_s)


class BakedLookup:
    """The newest baked image of each key, as a lookup last found it (None: none), remembered for
    `ttl_s`: the VMs of one grow boot from one answer (one list call, not one per VM), and images
    another head bakes are seen within `ttl_s`. A lookup that fails answers None (the stock image
    serves) for `failed_ttl_s`, so the VMs of a grow don't each wait on the same failing call. An
    image deleted meanwhile (by `burla cloud images delete` in another process, say) is dropped when
    a boot is refused for it (`refused`), and that boot goes on from the stock image. Thread-safe
    (drivers boot from a pool); one lookup per key at a time."""

    def __init__(self, ttl_s: float = LOOKUP_TTL_S, clock: Callable[[], float] = time.monotonic,
                 failed_ttl_s: float = FAILED_LOOKUP_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.failed_ttl_s = failed_ttl_s
        self._clock = clock
        self._found: dict[str, tuple[float, str | None]] = {}  # key -> (good until, image)
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._generation = 0  # moved on by each forget: a lookup begun before it keeps its answer to itself

    def find(self, key: str | None, look: Callable[[str], str | None]) -> str | None:
        if key is None:
            return None
        with self._lock:
            key_lock = self._locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                known = self._found.get(key)
                generation = self._generation
            if known is not None and self._clock() < known[0]:
                return known[1]
            try:
                found, good_for = look(key), self.ttl_s
            except Exception as e:  # noqa: BLE001 - e.g. no permission to list images: the stock image serves
                log.warning("could not look for a baked image: %s", e)
                found, good_for = None, self.failed_ttl_s
            with self._lock:
                if generation == self._generation:
                    self._found[key] = (self._clock() + good_for, found)
            return found

    def remember(self, key: str, image: str) -> None:
        """This head just baked `image` for `key`: boots use it from now on."""
        with self._lock:
            self._found[key] = (self._clock() + self.ttl_s, image)

    def forget(self) -> None:
        """An image was deleted: every key is looked up again, and lookups under way when it was
        deleted are not kept."""
        with self._lock:
            self._found.clear()
            self._generation += 1

    def refused(self, message: str) -> str | None:
        """A boot was refused with the cloud's `message`: if it says a baked image this lookup
        served does not exist (any more), that image is forgotten and returned (the boot may go on
        from the stock image); else None."""
        if not any(sign in message for sign in MISSING_IMAGE_SIGNS):
            return None
        with self._lock:
            served = {image for _, image in self._found.values() if image is not None}
        gone = next((image for image in served if image.rsplit("/", 1)[-1] in message), None)
        if gone is not None:
            self.forget()
        return gone


class ImageBaker:
    """Bakes at most one image per key per head, one builder at a time per key."""

    def __init__(self, inner: Any, settings: BakeSettings, event: NodeEvent) -> None:
        self.inner = inner  # the cloud driver (ThreadedCloudDriver)
        self.settings = settings
        self.event = event
        self._keys: set[tuple[str, str]] = set()  # (key, region) asked (baked, being baked, found baked) here
        self._tasks: set[asyncio.Task] = set()

    def after_setup(self, request: BootRequest, installed: bool) -> None:
        """A node VM was set up: if it had to install the runtime, bake an image for its key."""
        if not installed or request.image is not None:
            return
        task = asyncio.create_task(self._bake(request), name="bake-image")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _bake(self, request: BootRequest) -> None:
        try:
            key = await self.inner.bake_key(request)
            region = self.inner.image_region(request)
            if key is None or (key, region) in self._keys:
                return
            self._keys.add((key, region))
            if any(image.key == key and image.region == region and image.state == "available"
                   for image in await self.inner.baked_images()):
                return
        except Exception as e:  # noqa: BLE001 - baking is an optimisation: boots go on from the stock image
            log.warning("could not look for a baked image: %s", e)
            return
        builder = f"{BUILDER_PREFIX}-{secrets.token_hex(4)}"
        try:
            machine_type = await self.inner.builder_machine_type(request)
        except Exception as e:  # noqa: BLE001 - the node's own type serves
            log.warning("could not find a small machine of the family to bake on: %s", e)
            machine_type = request.machine_type
        build = dataclasses.replace(request, count=1, node_ids=(builder,), spot=False, machine_type=machine_type,
                                    ssh_public_key=self.settings.public_key, power_off_after_s=BUILDER_POWER_OFF_S)
        self.event(builder, "bake", f"baking an image of the node runtime for {key} on builder VM {builder}")
        started = time.monotonic()
        booted = False
        try:
            await self.inner.boot(build)
            booted = True
            await self._set_up(builder, build)
            baked = await self.inner.bake(builder, key)
            self.event(builder, "bake", f"image {baked.image_id} ({baked.name}) is available after "
                                        f"{time.monotonic() - started:.0f} s; later VMs for {key} boot from it")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - told, and the next head tries again
            self._keys.discard((key, region))
            self.event(builder, "bake", f"baking failed: {type(e).__name__}: {e}")
            log.warning("baking an image for %s failed: %s", key, e)
        finally:
            if booted:  # deleted even while this head stops (the task is cancelled then)
                await asyncio.shield(self._delete(builder))

    async def _delete(self, builder: str) -> None:
        try:
            await self.inner.delete(builder)
        except Exception as e:  # noqa: BLE001 - its power-off timer and the next head's sweep remain
            log.error("could not delete image builder %s: %s", builder, e)

    async def _set_up(self, builder: str, request: BootRequest) -> None:
        """The bootstrap alone (no token), then the scrub, over SSH."""
        settings = self.settings
        deadline = time.monotonic() + settings.deadline_s
        address = await self._address(builder, deadline)
        login = dataclasses.replace(settings.login, user=self.inner.login_user(builder))
        connection = await verified_connection(lambda: login.connect_until(address, deadline, None, lambda _: None),
                                               lambda: self.inner.reported_host_keys(builder), deadline,
                                               f"image builder {builder}", address, lambda _: None)
        try:
            script = install_script(request.python_version, settings.packages)
            await upload_setup(connection, settings.wheel, settings.packages, script,
                               installed_tag(request.python_version), {}, request.python_version)
            for step, command in (("bootstrap", f"bash {remote(SCRIPT_FILE)}"),
                                  ("scrub", scrub_script(BUILDER_POWER_OFF_S, self.inner.image_preparation))):
                result = await connection.run(command, timeout=max(30.0, deadline - time.monotonic()))
                if result.exit_status != 0:
                    tail = "\n".join(completed_output(result).splitlines()[-15:])
                    raise BootstrapFailed(f"the builder's {step} exited with {result.exit_status}: {tail}")
        finally:
            connection.close()

    async def _address(self, builder: str, deadline: float) -> str:
        while True:
            found: VmAddress | None = await self.inner.address(builder)
            if found is not None and (found.public or found.private):
                chosen = (found.public or found.private) if self.settings.tunnel else (found.private or found.public)
                return chosen or ""
            if time.monotonic() > deadline:
                raise BootstrapFailed("the builder VM never got a network address")
            await asyncio.sleep(ADDRESS_POLL_S)

    async def close(self) -> None:
        await end_tasks(log, *self._tasks)
