"""Farms of stand-in VMs (`tests.support.clouds.vm_standin`) behind a cloud API: a `VmFarm` watches the API
(moto's EC2, the recorded-API fakes of Compute Engine and Azure); each instance that starts running
gets a stand-in that authorises the public key the cloud put on the instance (an EC2 key pair,
`ssh-keys` metadata, `linuxConfiguration.ssh`), and the address map the head dials through
(`BURLA_SSH_ADDRESS_MAP`) points the instance's addresses at it. A deleted instance's stand-in is
stopped with everything it runs; a stand-in whose machine is shut down from inside (`shutdown -h
now`, as the node supervisor does) gets what that cloud does on shutdown.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from tests.support.clouds.fake_azure import gpus_of_size
from tests.support.clouds.fake_ec2 import CANONICAL, DEBIAN, DLAMI_OWNER, login_user_of, machine_gpus
from tests.support.clouds.vm_standin import (
    AL2023,
    AZURE_UBUNTU_2404,
    AZURE_UBUNTU_HPC,
    DEBIAN_12,
    DLAMI_BASE,
    GCE_DLVM,
    UBUNTU_2404,
    LoopThread,
    StandinImage,
    StandinVm,
)


@dataclass(frozen=True)
class VmRecord:
    """What a cloud API says of one of its VMs, as much as a stand-in needs."""

    instance_id: str
    node_id: str
    running: bool
    gone: bool  # terminated, stopped or deleted
    addresses: tuple[str, ...]
    authorized_key: str  # the public key the cloud authorised on the VM ("" if none)
    login_user: str | None = None  # the user the VM's image accepts (None: any)
    image: StandinImage | None = None  # what its image offers the bootstrap (None: the tests' Python)
    user_data: str = ""  # the script the VM runs as root at first boot
    gpus: tuple[str, ...] = ()  # the machine type's GPUs, as nvidia-smi would name them
    ssh_allowed: bool = True  # the cloud's firewall lets this machine reach its port 22
    restore: Path | None = None  # the snapshot its disk is made from (a VM of a baked image)


class VmFarm:
    """Stand-in VMs for the instances a cloud API (moto, a recorded-API fake) says are running.
    Subclasses read the API's instances and do what the cloud does when a VM shuts itself down."""

    def __init__(self, root: Path, authorize: bool = True, answer: bool = True,
                 vm_environment: dict[str, str] | None = None, host_keys: str = "reported",
                 refuse_forwards: int = 0) -> None:
        self.root = root
        self.refuse_forwards = refuse_forwards  # each VM's sshd refuses this many remote forwards (see StandinVm)
        # What the cloud reports of a VM's SSH host key once it booted: its own ("reported"),
        # another one ("impostor": someone else answers at its address), or nothing ("unreported").
        self.host_keys = host_keys
        self.vm_environment = vm_environment or {}
        self.map_path = root / "ssh-address-map.json"
        self.authorize = authorize  # False: the VM refuses the cluster's key
        self.answer = answer  # False: nothing listens on the VM's port 22
        self.vms: dict[str, StandinVm] = {}  # instance id -> stand-in
        self.retired: dict[str, StandinVm] = {}  # instance id -> a stopped stand-in (its disk stays for imaging)
        self.node_ids: dict[str, str] = {}  # instance id -> burla node id
        self.powered_off: list[str] = []  # instance ids whose machine shut itself down
        self._gone: set[str] = set()
        self._loop = LoopThread()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        self.map_path.write_text("{}")
        self._thread = threading.Thread(target=self._watch, name="vm-farm", daemon=True)
        self._thread.start()

    def _records(self) -> list[VmRecord]:
        raise NotImplementedError

    def _shut_down(self, record: VmRecord) -> None:
        """The VM powered itself off: what the cloud does then (terminate, stop)."""
        raise NotImplementedError

    def _report_host_key(self, record: VmRecord, key: str) -> None:
        """Where the cloud shows the VM's SSH host key (`key`, an OpenSSH public key line)."""
        raise NotImplementedError

    def vm(self, node_id: str, timeout: float = 60.0) -> StandinVm:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for instance_id, found in self.node_ids.items():
                    if found == node_id and instance_id in self.vms:
                        return self.vms[instance_id]
            time.sleep(0.1)
        raise TimeoutError(f"no stand-in VM for node {node_id}")

    def _watch(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self._poll()
            except Exception as e:  # noqa: BLE001 - the API restarting between tests; keep watching
                print(f"vm farm: {type(e).__name__}: {e}", file=sys.stderr)

    def _poll(self) -> None:
        records = self._records()
        for record in records:
            vm = self.vms.get(record.instance_id)
            if record.running and vm is None and record.instance_id not in self._gone:
                self._start(record)
            elif vm is not None and record.gone:
                self._retire(record.instance_id)
            elif vm is not None and vm.powered_off:
                self._shut_down(record)
                # Recorded once the cloud has acted, so a test that sees it may check the outcome.
                self.powered_off.append(record.instance_id)
                self._retire(record.instance_id)
        listed = {record.instance_id for record in records}
        for instance_id in [i for i in list(self.vms) if i not in listed]:
            self._retire(instance_id)  # deleted from the API altogether

    def _start(self, record: VmRecord) -> None:
        key = record.authorized_key
        if not self.authorize or not key:
            key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
        vm = StandinVm(self.root / record.instance_id, key, record.instance_id, self.vm_environment,
                       record.login_user, record.image, record.gpus)
        if record.restore is not None:
            vm.restore(record.restore)
        vm.refuse_forwards = self.refuse_forwards
        port = self._loop.run(vm.start())
        if self.host_keys != "unreported":  # cloud-init prints the keys it made (or the cloud has another's)
            key = vm.host_key if self.host_keys == "reported" else asyncssh.generate_private_key("ssh-ed25519")
            self._report_host_key(record, key.export_public_key().decode().strip())
        if record.user_data:
            self._loop.run(vm.run_user_data(record.user_data))
        if not self.answer or not record.ssh_allowed:
            self._loop.run(vm.close_ssh())
            port = _closed_port()
        with self._lock:
            self.vms[record.instance_id] = vm
            self.node_ids[record.instance_id] = record.node_id
            mapping = json.loads(self.map_path.read_text())
            mapping.update({address: f"127.0.0.1:{port}" for address in record.addresses if address})
            partial = self.map_path.with_suffix(".tmp")
            partial.write_text(json.dumps(mapping))
            partial.replace(self.map_path)

    def _retire(self, instance_id: str) -> None:
        with self._lock:
            vm = self.vms.pop(instance_id, None)
            self._gone.add(instance_id)
            if vm is not None:
                self.retired[instance_id] = vm
        if vm is not None:
            self._loop.run(vm.stop())

    def drop_connections(self, hold_forwards: bool = False) -> int:
        with self._lock:
            vms = list(self.vms.values())
        return sum(self._loop.run(vm.drop_connections(hold_forwards)) for vm in vms)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for instance_id in list(self.vms):
            self._retire(instance_id)
        self._loop.close()


class MotoVmFarm(VmFarm):
    """EC2 in moto: the key is the instance's key pair's; a shutdown terminates the instance when it
    was started with InstanceInitiatedShutdownBehavior=terminate, else stops it, as EC2 does."""

    def __init__(self, ec2: Any, root: Path, rules: Any = None, **options: Any) -> None:
        self.ec2 = ec2
        # AMI id -> its disk, the image it was made from, and that image's login user
        self.baked: dict[str, tuple[Path | None, StandinImage | None, str | None]] = {}
        super().__init__(root, **options)
        if rules is not None:  # CreateImage copies the imaged VM's disk (tests.support.clouds.fake_ec2.Ec2Rules)
            rules.image_made.append(self._imaged)

    def _report_host_key(self, record: VmRecord, key: str) -> None:
        from tests.support.clouds.fake_ec2 import Ec2Rules

        Ec2Rules.current.consoles[record.instance_id] = cloud_init_console(key)

    def _imaged(self, instance_id: str, image_id: str) -> None:
        with self._lock:
            vm = self.vms.get(instance_id)
        if vm is None:
            return
        into = self.root / "images" / image_id
        vm.snapshot(into)
        self.baked[image_id] = (into, vm.image, vm.login_user)

    def _records(self) -> list[VmRecord]:
        reservations = self.ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["burla-cluster"]}])
        records = []
        for instance in (i for r in reservations["Reservations"] for i in r["Instances"]):
            state = instance["State"]["Name"]
            key, user, image, user_data, gpus, restore = "", None, None, "", (), None
            if state == "running" and instance["InstanceId"] not in self.vms and instance.get("KeyName"):
                pairs = self.ec2.describe_key_pairs(KeyNames=[instance["KeyName"]], IncludePublicKey=True)
                key = pairs["KeyPairs"][0]["PublicKey"]
                user = login_user_of(self.ec2, instance["ImageId"])
                owner = (self.ec2.describe_images(ImageIds=[instance["ImageId"]])["Images"] or [{}])[0].get("OwnerId")
                image = {DEBIAN: DEBIAN_12, CANONICAL: UBUNTU_2404, DLAMI_OWNER: DLAMI_BASE}.get(owner or "", AL2023)
                restore, image, user = self.baked.get(instance["ImageId"], (None, image, user))
                gpus = machine_gpus(instance["InstanceType"])
                given = self.ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
                user_data = base64.b64decode(given.get("UserData", {}).get("Value") or "").decode()
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            records.append(VmRecord(
                instance["InstanceId"], tags.get("burla-node-id") or tags.get("Name", ""), state == "running",
                state in ("shutting-down", "terminated", "stopping", "stopped"),
                (instance.get("PublicIpAddress"), instance.get("PrivateIpAddress")), key, user, image, user_data,
                gpus, restore=restore))
        return records

    def _shut_down(self, record: VmRecord) -> None:
        behaviour = self.ec2.describe_instance_attribute(InstanceId=record.instance_id,
                                                         Attribute="instanceInitiatedShutdownBehavior")
        if behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate":
            self.ec2.terminate_instances(InstanceIds=[record.instance_id])
        else:
            self.ec2.stop_instances(InstanceIds=[record.instance_id])


class GceVmFarm(VmFarm):
    """Compute Engine's recorded-API fake: the key comes from the `ssh-keys` metadata; a guest
    shutdown leaves the instance TERMINATED (stopped), as Compute Engine does."""

    def __init__(self, fake: Any, root: Path, **options: Any) -> None:
        self.fake = fake
        # image name -> its disk, the image it was made from, and that image's login user
        self.baked: dict[str, tuple[Path | None, StandinImage | None, str | None]] = {}
        super().__init__(root, **options)
        fake.image_made.append(self._imaged)  # images.insert copies the VM's disk

    def _imaged(self, instance_id: str, image_name: str) -> None:
        with self._lock:
            vm = self.vms.get(instance_id)
        if vm is not None:
            into = self.root / "images" / image_name
            vm.snapshot(into)
            self.baked[image_name] = (into, vm.image, vm.login_user)

    def _records(self) -> list[VmRecord]:
        records = []
        for instance in list(self.fake.instances.values()):
            items = {i["key"]: i["value"] for i in instance.get("metadata", {}).get("items", [])}
            # `user:key`: the guest agent creates that user for the key (the only one it accepts),
            # unless OS Login is on for the VM (instance metadata overrides the project's), which makes
            # it ignore ssh-keys. https://cloud.google.com/compute/docs/oslogin/set-up-oslogin
            user, _, key = items.get("ssh-keys", "").partition(":")
            oslogin = items.get("enable-oslogin", self.fake.project_metadata.get("enable-oslogin", "FALSE"))
            if oslogin.upper() == "TRUE":
                user, key = "", ""
            interface = instance["networkInterfaces"][0]
            addresses = (interface.get("networkIP"), *(a.get("natIP") for a in interface.get("accessConfigs", [])))
            source = instance.get("sourceImage", "")
            # VPC firewall rules: ingress is denied unless a rule allows it (tcp:22 from anywhere,
            # to the instance's network tags or to every instance). https://cloud.google.com/firewall/docs/firewalls
            tags = set(instance.get("tags", {}).get("items", []))
            ssh_allowed = any(_opens_ssh(rule, tags) for rule in list(self.fake.firewalls.values()))
            image = (GCE_DLVM if "/deeplearning-platform-release/" in source else UBUNTU_2404 if "ubuntu" in source
                     else DEBIAN_12 if "debian-12" in source else None)
            restore, image, _ = self.baked.get(source.rsplit("/", 1)[-1], (None, image, None))
            records.append(VmRecord(instance["id"], instance.get("labels", {}).get("burla-node-id") or instance["name"],
                                    instance["status"] == "RUNNING", instance["status"] == "TERMINATED",
                                    addresses, key, user or None, image, items.get("startup-script", ""),
                                    gpus=self.fake.gpus_of(instance), ssh_allowed=ssh_allowed, restore=restore))
        return records

    def _shut_down(self, record: VmRecord) -> None:
        for instance in list(self.fake.instances.values()):
            if instance["id"] == record.instance_id:
                instance["status"] = "TERMINATED"

    def _report_host_key(self, record: VmRecord, key: str) -> None:
        """The guest agent writes the keys as guest attributes, where the metadata enables them."""
        for where, instance in list(self.fake.instances.items()):
            if instance["id"] == record.instance_id and self.fake.guest_attributes_enabled(instance):
                kind, body = key.split()[:2]
                self.fake.guest_attributes[where] = [(kind, body)]


class AzureVmFarm(VmFarm):
    """Azure Resource Manager's recorded-API fake: the key comes from `linuxConfiguration.ssh`; a
    guest shutdown leaves the VM stopped (still allocated), as Azure does."""

    def __init__(self, fake: Any, root: Path, **options: Any) -> None:
        self.fake = fake
        # image name -> its disk, the image it was made from, and whether its guest was deprovisioned
        self.baked: dict[str, tuple[Path, StandinImage | None, bool]] = {}
        super().__init__(root, **options)
        fake.image_made.append(self._imaged)  # an image copies its (deallocated) VM's disk

    def _imaged(self, vm_id: str, image_name: str) -> None:
        with self._lock:
            vm = self.vms.get(vm_id) or self.retired.get(vm_id)
        if vm is not None:
            into = self.root / "images" / image_name
            vm.snapshot(into)
            self.baked[image_name] = (into, vm.image, (vm.root / "deprovisioned").exists())

    def _records(self) -> list[VmRecord]:
        records = []
        for (subscription, group, name), machine in list(self.fake.machines.items()):
            keys = machine["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]
            reference = machine["properties"].get("storageProfile", {}).get("imageReference", {})
            public = self.fake.public_ips.get((subscription, group, f"{name}-ip"), {})
            nic = self.fake.network_interfaces.get((subscription, group, f"{name}-nic"), {})
            addresses = (public.get("properties", {}).get("ipAddress"),
                         nic.get("properties", {}).get("ipConfigurations", [{}])[0].get("properties", {}).get(
                             "privateIPAddress"))
            image, restore, provisions = _AZURE_IMAGES.get(reference.get("publisher", "")), None, True
            if "id" in reference:  # a managed image: its VM's disk. One whose guest was not deprovisioned
                # never finishes provisioning (OSProvisioningTimedOut): nothing answers on port 22.
                # https://learn.microsoft.com/troubleshoot/azure/virtual-machines/linux/linux-vm-provisioning-timeout
                restore, image, provisions = self.baked.get(reference["id"].rsplit("/", 1)[-1], (None, None, False))
            records.append(VmRecord(machine["properties"]["vmId"], machine.get("tags", {}).get("burla-node-id") or name,
                                    self.fake.power_states.get((subscription, group, name)) == "running",
                                    self.fake.power_states.get((subscription, group, name)) != "running", addresses,
                                    keys[0]["keyData"] if keys else "",
                                    machine["properties"]["osProfile"].get("adminUsername"), image,
                                    base64.b64decode(self.fake.custom_data.get(name) or "").decode(),
                                    gpus=gpus_of_size(machine["properties"]["hardwareProfile"]["vmSize"]),
                                    ssh_allowed=provisions, restore=restore))
        return records

    def _shut_down(self, record: VmRecord) -> None:
        for key, machine in list(self.fake.machines.items()):
            if machine["properties"]["vmId"] == record.instance_id:
                self.fake.power_states[key] = "stopped"  # still allocated: billed until deleted

    def _report_host_key(self, record: VmRecord, key: str) -> None:
        for (_, _, name), machine in list(self.fake.machines.items()):
            if machine["properties"]["vmId"] == record.instance_id:
                self.fake.serial_logs[name] = cloud_init_console(key)


def cloud_init_console(key: str) -> str:
    """What cloud-init's keys_to_console prints at the end of a first boot: fingerprints, then the
    public keys between markers (cloudinit.readthedocs.io/en/latest/reference/modules.html#keys-to-console)."""
    kind, body = key.split()[:2]
    digest = base64.b64encode(hashlib.sha256(base64.b64decode(body)).digest()).decode().rstrip("=")
    return ("<14>Dec  4 00:00:00 cloud-init: #############################################################\n"
            "<14>Dec  4 00:00:00 cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
            f"<14>Dec  4 00:00:00 cloud-init: 256 SHA256:{digest} root@standin (ED25519)\n"
            "<14>Dec  4 00:00:00 cloud-init: -----END SSH HOST KEY FINGERPRINTS-----\n"
            "<14>Dec  4 00:00:00 cloud-init: #############################################################\n"
            f"-----BEGIN SSH HOST KEY KEYS-----\n{kind} {body} root@standin\n-----END SSH HOST KEY KEYS-----\n"
            "[   21.000000] cloud-init[1101]: Cloud-init v. 24.1 finished\n")


def _opens_ssh(rule: dict, tags: set[str]) -> bool:
    targets = set(rule.get("targetTags", []))
    opens = any(a.get("IPProtocol") in ("tcp", "all") and (not a.get("ports") or any(
        port == "22" or ("-" in port and int(port.split("-")[0]) <= 22 <= int(port.split("-")[1]))
        for port in a["ports"])) for a in rule.get("allowed", []))
    return opens and "0.0.0.0/0" in rule.get("sourceRanges", []) and (not targets or bool(targets & tags))


_AZURE_IMAGES = {"Canonical": AZURE_UBUNTU_2404, "microsoft-dsvm": AZURE_UBUNTU_HPC}  # by publisher


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when this returns: nothing answers there
