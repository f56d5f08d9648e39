"""The head's fleet: the cluster settings (how many nodes of what kind) and the driver that boots
and deletes them. `burla cluster start | stop | restart` and `burla settings` land here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from burla.drivers.base import BootRequest, CloudCheck, Driver, QuotaRoom
from burla.drivers.catalog import DEFAULT_MACHINE, MachineType, gpu_model
from burla.drivers.registry import BY_NAME
from burla.errors import CloudRefused, SettingsError
from burla.head.cluster import Cluster
from burla.head.history.store import History
from burla.head.history.usage import MACHINE_STARTED, machine_detail
from burla.head.machines.catalogs import HeadCatalog
from burla.head.machines.cluster_settings import ClusterSettings
from burla.head.machines.grow import Units, growth_sizes, plan_growth, slots_of, smaller_size, within_room
from burla.head.scheduling.eligibility import ineligibility, node_parallelism
from burla.head.scheduling.records import RUNNING
from burla.process.loop_supervisor import end_tasks
from burla.protocol import wire
from burla.protocol.states import BootStage, EndKind, JobStatus, MachineState
from burla.protocol.values import input_files

log = logging.getLogger("burla.head")

GROWN_IDLE_S = 60.0
CLOUD_IDLE_S = 600.0  # cloud nodes from `cluster start` go after this idle time unless configured
DELETE_ON_STOP_S = 900.0  # how long a stopping head spends deleting its VMs (Azure's deletes take minutes)


class Fleet:
    def __init__(self, cluster: Cluster, driver: Driver, history: History | None, head_url: str, token: str,
                 settings: ClusterSettings, config_dir: Path, head_cert: str | None = None) -> None:
        self.cluster = cluster
        self.driver = driver
        self.catalog = HeadCatalog(driver, self.cloud, config_dir)  # the machine types grow picks from
        cluster.scheduler.cloud = self.cloud
        self.history = history
        self.head_url = head_url
        self.token = token
        self.settings = settings
        self.head_cert = head_cert  # PEM nodes pin, when this head serves https with its own certificate
        self.stopped = False  # `cluster stop` was asked: jobs don't boot nodes until `cluster start`
        self.grown: set[str] = set()  # nodes booted by grow=True: removed after a short idle time
        self._booting_slots: dict[str, int] = {}
        self._booting_machines: dict[str, MachineType] = {}
        self._tasks: set[asyncio.Task] = set()
        self.leftovers: dict[str, float] = {}  # VMs an earlier head left -> when this head found them
        self._boots_in_flight = 0  # driver boot calls not yet returned (a stopping head waits for them)
        self._boots_settled = asyncio.Event()
        self._boots_settled.set()
        self._cloud_checked = False  # `burla cloud check` passed for this head (asked before its first grow)

    async def load_saved_settings(self) -> None:
        """Settings saved by an earlier head replace the defaults (once history is open)."""
        saved = await self.history.load_settings() if self.history is not None else None
        if saved:
            try:
                self.settings = self.settings.updated(saved)
            except SettingsError as e:
                log.warning("ignoring saved settings (%s)", e)

    def _request(self, count: int) -> BootRequest:
        s = self.settings
        return BootRequest(count, self.head_url, self.token, s.workers_per_node, s.machine_type, s.region, s.disk_gb,
                           s.image, s.spot, head_cert=self.head_cert)

    @property
    def cloud(self) -> str | None:
        entry = BY_NAME.get(self.driver.name)
        return entry.cloud if entry is not None else None

    async def ready_for(self, spec: wire.OpenJob) -> None:
        """Before a job that grows is admitted: the region's machine list is read (or was)."""
        if spec.grow and self.cloud is not None:
            await self.catalog.ready()

    def prepare_job(self, spec: wire.OpenJob) -> None:
        """Before a job is admitted: grow for it, or start local nodes idleness removed."""
        if spec.grow and self.cloud is not None:
            self._grow(spec)
        elif not self.cluster.scheduler.nodes and not self.cluster.booting_ids and not self.stopped:
            if self.settings.quantity >= 1 and hasattr(self.driver, "boot_now"):
                self.cluster.expect_nodes(self.driver.boot_now(self._request(self.settings.quantity)),
                                          self._host_id_of_booted())

    def _host_id_of_booted(self) -> str:
        """The host id nodes this driver boots will have, where known ahead (on this machine)."""
        return input_files.host_id() if self.driver.on_this_machine else ""

    def _grow(self, spec: wire.OpenJob) -> None:
        """Boot what the job lacks; it starts on ready nodes while the rest boot."""
        scheduler = self.cluster.scheduler
        for node_id in [n for n in self._booting_machines if n not in self.cluster.booting_ids]:
            self._booting_machines.pop(node_id, None)  # registered or failed by now
        self.grown &= set(scheduler.nodes) | self.cluster.booting_ids
        have_slots = sum(
            node_parallelism(node, spec) for node in scheduler.nodes.values()
            if ineligibility(node, spec) is None
        ) + sum(self._booting_slots.get(node_id, 0) for node_id in self.cluster.booting_ids)
        have_vcpus = sum(node.cpus for node in scheduler.nodes.values()) + sum(
            self._booting_machines[n].vcpus for n in self.cluster.booting_ids if n in self._booting_machines)
        have_gpus: dict[str, int] = {}
        for node in scheduler.nodes.values():
            if node.gpu:
                have_gpus[gpu_model(node.gpu)] = have_gpus.get(gpu_model(node.gpu), 0) + node.gpu_count
        s = self.settings
        machines = plan_growth(spec, have_slots, have_vcpus, have_gpus, self.catalog.current(), s.machine_type,
                               s.max_vcpus, s.max_gpus)
        if not machines:
            return
        log.info("growing for job %s: %s", spec.job_id, ", ".join(m.name for m in machines))
        planned = [(self._expect_grown(machine, spec), machine) for machine in machines]
        task = asyncio.create_task(self._boot_growth(spec, planned), name="grow")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _expect_grown(self, machine: MachineType, spec: wire.OpenJob) -> str:
        """A node id for a machine grow will boot; the job counts on its slots from now."""
        [node_id] = BootRequest(1, self.head_url, self.token).ids("burla-node")
        self.cluster.expect_nodes([node_id])
        self.grown.add(node_id)
        self._booting_slots[node_id] = slots_of(machine, spec)
        self._booting_machines[node_id] = machine
        return node_id

    def boot_stage(self, node_id: str) -> BootStage:
        return self.driver.boot_stage(node_id)

    def registration_problem(self, msg: wire.RegisterNode) -> str | None:
        machine = self._booting_machines.get(msg.node_id)
        if machine is None or msg.gpu_count >= machine.gpu_count:
            return None
        return (f"{msg.node_id} was booted as {machine.name} with {machine.gpu_count} {machine.gpu} GPU(s), but "
                f"nvidia-smi on it lists {msg.gpu_count}: its image lacks the NVIDIA driver (or the GPUs failed); "
                "its VM is deleted")

    def _grow_request(self, spec: wire.OpenJob, machine: MachineType, node_id: str) -> BootRequest:
        s = self.settings
        return BootRequest(
            1, self.head_url, self.token, s.workers_per_node, machine.name, spec.region or s.region,
            spec.disk_gb or s.disk_gb, spec.image or s.image, s.spot, machine.gpu, machine.gpu_count,
            node_ids=(node_id,), python_version=".".join(spec.python_version.split(".")[:2]),
            head_cert=self.head_cert)

    async def _boot_growth(self, spec: wire.OpenJob, planned: list[tuple[str, MachineType]]) -> None:
        """Boot a grow plan within the account's quota, falling back to smaller machines when the
        cloud refuses one; the job is told what limited it."""
        problem = await self._cloud_problem(planned[0][1].name)
        if problem is not None:
            for node_id, _ in planned:
                self._not_booted(node_id, problem)
            return
        sizes, units = growth_sizes(spec, self.catalog.current(), self.settings.machine_type)
        asked = sum(units(machine) for _, machine in planned)
        limits: list[str] = []
        room = await self._quota_room(planned[0][1].name)
        if room is not None:
            fitted = within_room([m for _, m in planned], sizes, units, room.free)
            if fitted != [m for _, m in planned]:
                limits.append(room.sentence())
                replanned = [(self._expect_grown(machine, spec), machine) for machine in fitted]
                for node_id, _ in planned:
                    self._not_booted(node_id, f"not booted: {room.sentence()}")
                planned = replanned
        refusals = await asyncio.gather(*(self._boot_grown(spec, node_id, machine, sizes, units)
                                          for node_id, machine in planned))
        limits += [refusal for refusal in refusals if refusal]
        if limits:
            what = "GPUs" if spec.func_gpu is not None else "vCPUs"
            notice = (f"[burla] growing for this job was limited ({asked} {what} planned): "
                      + "; ".join(dict.fromkeys(limits)) + "\n")
            log.warning("job %s: %s", spec.job_id, notice.strip())
            self.cluster.output(wire.OutputBatch(spec.job_id, [[wire.NOT_A_CALL, wire.STDERR, notice]]))

    async def _quota_room(self, machine_type: str) -> QuotaRoom | None:
        """The quota the machine counts against, if it can be read (else the boots' refusals tell)."""
        try:
            return await self.driver.quota_room(machine_type, self.settings.spot)
        except Exception as e:  # e.g. credentials that expired since the cloud check
            log.warning("could not read the vCPU quota for %s: %s", machine_type, e)
            return None

    async def _cloud_problem(self, machine_type: str) -> str | None:
        """`burla cloud check` before this head's first grow: what would make every boot fail
        (credentials, a permission, the image), as one sentence with the fixes. A quota too small
        for this machine is not such a thing: the plan shrinks to it. Asked again until it passes."""
        if self._cloud_checked:
            return None
        try:
            checks = await self.driver.check(machine_type)
        except Exception as e:  # the check is a courtesy: the boots themselves still say what fails
            log.warning("the cloud check could not run: %s", e)
            return None
        failures = [c for c in checks if c.status == CloudCheck.FAIL and c.name != "vCPU quota"]
        if not failures:
            self._cloud_checked = True
            return None
        return "burla cloud check failed: " + "; ".join(
            f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in failures)

    async def _boot_grown(self, spec: wire.OpenJob, node_id: str, machine: MachineType, sizes: list[MachineType],
                          units: Units) -> str | None:
        """Boot one grown machine; on a quota or capacity refusal the next size down, and so on.
        Returns what limited it, if anything did."""
        limit = None
        while True:
            try:
                await self._boot_machines(self._grow_request(spec, machine, node_id))
                self._booting_slots.pop(node_id, None)
                return limit
            except CloudRefused as e:
                self._booting_slots.pop(node_id, None)
                if e.booted:
                    return limit
                limit = str(e)
                if e.kind == CloudRefused.QUOTA:
                    room = await self._quota_room(machine.name)
                    limit = room.sentence() if room is not None else limit
                smaller = smaller_size(sizes, machine, units) if e.kind is not None else None
                if smaller is None:
                    self._not_booted(node_id, f"CloudRefused: {limit}")
                    return limit
                replacement = self._expect_grown(smaller, spec)
                self._not_booted(node_id, f"{e}; trying {smaller.name} instead")
                node_id, machine = replacement, smaller
            except Exception as e:  # the job learns why if no node can run it
                self._not_booted(node_id, f"{type(e).__name__}: {e}")
                return None

    def _not_booted(self, node_id: str, why: str) -> None:
        self._booting_slots.pop(node_id, None)
        self._booting_machines.pop(node_id, None)
        self.grown.discard(node_id)
        self.cluster.node_boot_failed(node_id, why)

    async def boot_watch_loop(self, deadline_s: float) -> None:
        """Delete machines that never became ready, keeping what their console printed, and VMs an
        earlier head left that did not join this one within the same deadline."""
        while True:
            await asyncio.sleep(min(1.0, deadline_s / 4))
            now = time.monotonic()
            for node_id, found in list(self.leftovers.items()):
                if node_id in self.cluster.scheduler.nodes:
                    del self.leftovers[node_id]  # it joined this head
                elif now - found > deadline_s:
                    del self.leftovers[node_id]
                    await self._remove_machine(node_id, f"left by an earlier head; not joined {deadline_s:g} s "
                                                        "after this head started")
            for node_id, since in list(self.cluster.booting_since.items()):
                if node_id not in self.cluster.booting_ids or now - since < deadline_s:
                    continue
                problem = self.driver.boot_problem(node_id)
                await self.give_up_on(node_id, f"not ready {deadline_s:g} s after it was started; deleted"
                                               + (f" ({problem})" if problem else ""))

    def setup_failed(self, node_id: str, problem: str) -> None:
        """The driver could not set a VM up (its bootstrap failed): delete it now, not at the deadline."""
        task = asyncio.create_task(self.give_up_on(node_id, f"could not be set up; deleted ({problem})"),
                                   name=f"give-up-{node_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def give_up_on(self, node_id: str, why: str) -> None:
        """A booting machine won't become a node: keep what its console and setup printed, tell
        the jobs waiting for it, delete it."""
        if node_id not in self.cluster.booting_ids:
            return
        try:
            console = await self.driver.boot_log(node_id)
        except Exception as e:  # the log is a courtesy; the deletion is what matters
            console = f"(console unavailable: {type(e).__name__}: {e})"
        if console:
            self.cluster.record.node_event(node_id, "boot log", console[-100_000:])
        self.cluster.node_boot_failed(node_id, why)
        try:
            await self.driver.delete(node_id)
        except Exception as e:
            log.error("could not delete node %s that failed to boot: %s", node_id, e)

    def idle_timeout(self, node_id: str) -> float | None:
        """Grown nodes go after a short idle time; others after the configured one (on a cloud, ten
        minutes if none is configured: a VM nobody uses should not stay billed)."""
        configured = self.settings.inactivity_timeout_s
        if node_id in self.grown:
            return min(configured, GROWN_IDLE_S) if configured else GROWN_IDLE_S
        if configured is None and self.cloud is not None:
            return CLOUD_IDLE_S
        return configured

    async def _boot_machines(self, request: BootRequest) -> list[str]:
        self._boots_in_flight += 1
        self._boots_settled.clear()
        try:
            booted = await self.driver.boot(request)
        except CloudRefused as e:
            self._started(request, e.booted)  # the rest of the request failed, these bill
            raise
        finally:
            self._boots_in_flight -= 1
            if not self._boots_in_flight:
                self._boots_settled.set()
        self._started(request, booted)
        return booted

    def _started(self, request: BootRequest, node_ids: list[str]) -> None:
        cloud = self.cloud or "local"  # billed from now (burla usage)
        machine_type = request.machine_type or (DEFAULT_MACHINE.get(cloud, "") if self.cloud else "")
        listed = self.catalog.current().lookup(machine_type) if self.cloud else None
        detail = machine_detail(cloud, machine_type, request.region or self.driver.region, request.spot,
                                listed.usd_per_hour if listed is not None else None)
        for node_id in node_ids:
            self.cluster.record.node_event(node_id, MACHINE_STARTED, detail)

    async def sweep_leftovers(self) -> None:
        """At start: VMs of this cluster that an earlier head left (kept with --keep-nodes, or powered
        off by a node that lost its head, which still bills its disk, and on Azure its compute).
        Powered-off ones are deleted now; the rest get the boot deadline to join this head."""
        if self.cloud is None:
            return
        try:
            handles = await self.driver.list_nodes()
        except Exception as e:  # noqa: BLE001 - a courtesy: the next start tries again
            log.error("could not list this cluster's VMs left by an earlier head: %s", e)
            return
        now = time.monotonic()
        for handle in handles:
            if handle.node_id in self.cluster.scheduler.nodes or handle.node_id in self.cluster.booting_ids:
                continue
            if handle.state == MachineState.STOPPED:
                await self._remove_machine(handle.node_id, "found powered off when the head started")
            else:
                self.leftovers.setdefault(handle.node_id, now)

    async def delete_machines(self) -> None:
        """The head is stopping: delete every VM of this cluster (boots in flight finish first)."""
        if self.cloud is None:
            return
        # A VM whose create call is still under way would be missed by the listing below, and
        # nothing would ever set it up to power itself off: let those calls return first.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._boots_settled.wait(), DELETE_ON_STOP_S / 2)
        try:
            listed = {handle.node_id for handle in await asyncio.wait_for(self.driver.list_nodes(), DELETE_ON_STOP_S)}
        except Exception as e:  # noqa: BLE001 - still delete the ones this head knows
            log.error("could not list this cluster's VMs to delete them: %s", e)
            listed = set()
        node_ids = sorted(listed | set(self.cluster.scheduler.nodes) | self.cluster.booting_ids)
        if not node_ids:
            return
        log.info("deleting %d VM(s) as the head stops: %s", len(node_ids), ", ".join(node_ids))
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(self.driver.delete(n) for n in node_ids), return_exceptions=True), DELETE_ON_STOP_S)
        except TimeoutError:
            log.error("deleting VMs took over %.0f s; some may remain: %s", DELETE_ON_STOP_S, ", ".join(node_ids))
            return
        for node_id, result in zip(node_ids, results, strict=True):
            if isinstance(result, BaseException):
                log.error("could not delete the VM of node %s: %s", node_id, result)
            else:
                self.cluster.record.node_event(node_id, "deleted", "the head stopped")

    async def close(self) -> None:
        await end_tasks(log, *self._tasks)

    async def start(self) -> dict[str, Any]:
        self.stopped = False
        have = len(self.cluster.scheduler.nodes) + len(self.cluster.booting_ids)
        missing = max(0, self.settings.quantity - have)
        try:
            booted = await self._boot_machines(self._request(missing)) if missing else []
        except CloudRefused as e:
            self._expect_started(e.booted)
            raise
        self._expect_started(booted)
        return {"booted": booted, "already_running": have, "quantity": self.settings.quantity}

    def _expect_started(self, booted: list[str]) -> None:
        self.cluster.expect_nodes(booted, self._host_id_of_booted())
        for node_id in booted:
            self.cluster.record.node_event(node_id, "booting", f"cluster start via the {self.driver.name} driver")

    async def stop(self, restarting: bool = False) -> dict[str, Any]:
        """Stop every node and VM; running jobs end CANCELED (ClusterShutdown, or ClusterRestarted)."""
        self.stopped = True
        kind, why = ((EndKind.CLUSTER_RESTARTED, "the cluster was restarted") if restarting
                     else (EndKind.CLUSTER_SHUTDOWN, "the cluster was stopped"))
        for job in list(self.cluster.scheduler.jobs.values()):
            if job.status == RUNNING:
                self.cluster.end_job(job, JobStatus.CANCELED, kind, why)
        stopped = []
        for node_id in list(self.cluster.scheduler.nodes):
            link = self.cluster.node_links.get(node_id)
            self.cluster.node_lost(node_id)
            if not await self.driver.delete(node_id) and link is not None:
                link.send(wire.ShutdownNode("the cluster was stopped"))
            stopped.append(node_id)
        for node_id in list(self.cluster.booting_ids):
            await self.driver.delete(node_id)
            self.cluster.booting_ids.discard(node_id)
            self.cluster.booting_since.pop(node_id, None)
            stopped.append(node_id)
        return {"stopped": stopped}

    def remove_machine(self, node_id: str, why: str) -> None:
        """A cloud node left or went silent: delete its VM (local nodes' processes end by themselves)."""
        if self.cloud is None:
            return
        self.grown.discard(node_id)
        task = asyncio.create_task(self._remove_machine(node_id, why), name=f"remove-{node_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _remove_machine(self, node_id: str, why: str) -> None:
        try:
            deleted = await self.driver.delete(node_id)
        except Exception as e:  # the next cluster stop or deploy delete tries again
            log.error("could not delete the machine of node %s (%s): %s", node_id, why, e)
            return
        if deleted:
            self.cluster.record.node_event(node_id, "deleted", f"its machine was deleted ({why})")

    async def delete_node(self, node_id: str) -> bool:
        """Delete a node through whichever driver started it; False if none did."""
        return await self.driver.delete(node_id)

    async def update_settings(self, changes: dict[str, Any]) -> ClusterSettings:
        self.settings = self.settings.updated(changes)
        if self.history is not None:
            await self.history.save_settings(self.settings.to_dict())
        return self.settings
