"""Large payloads through the SSH tunnel of the cloud path: 100 x 10 MB inputs and 100 x 10 MB
results between a client and a node on a cloud VM that a laptop head reaches over SSH, beside
the physical anchor for that chain.

The VM is the tests' stand-in (an SSH server on 127.0.0.1 in front of a home directory of its
own): EC2 is moto, and the head boots the VM, uploads its build and starts the node through the
real bootstrap, then the node reaches the head over the tunnel's remote port forward, as on a
real cloud. The tunnel is carried by OpenSSH's client, a process of the head's, and then, with a
cluster of its own, by asyncssh in the head's process (TUNNEL_CLIENTS). The client's inputs
travel inline (it has an input-file directory of its own, which the node does not share). The
client is a process of its own, as the user's program is: the VM's SSH server runs in this
script's process, which does nothing else while payloads move. Beside the MB/s, the CPU seconds
per GB of each of burla's processes: client, head, the tunnel's client, the VM's SSH server,
node and worker.

The anchors move the same bytes with nothing else done to them: a plain relay chain (client ->
relay -> relay -> worker, as in transfer.py), and client -> [SSH forward -> SSH server] -> relay
-> worker, the forward being an asyncssh client or OpenSSH's `ssh -L`, the server the same
asyncssh one as the stand-in VM's, with the ciphers burla's tunnels prefer. Each figure is the
median of ROUNDS (default 3).

Run: python3 transfer_tunnel.py (needs the test dependencies: moto, asyncssh; and OpenSSH's client).
CLIENT_PYTHON names the user's interpreter (default: this one; the packages it has and the VM lacks
are tried on the VM during the warm-up job, outside the figures), WHEELHOUSE a directory of the
wheels the VMs install from (default: made from this environment, as the tests' is).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
from transfer import COUNT, SIZE, TOTAL_MB, anchor_chain_mb_s, anchor_mb_s, start_hop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from burla.drivers.ssh.login import TUNNEL_CIPHERS  # noqa: E402
from burla.drivers.ssh.tunnel import find_ssh_program  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "3"))
CLIENT_PYTHON = os.environ.get("CLIENT_PYTHON", sys.executable)
# What carries the head's tunnels, each measured with a cluster of its own (`burla head serve --tunnel-client`).
TUNNEL_CLIENTS = os.environ.get("TUNNEL_CLIENTS", "openssh,asyncssh").split(",")

# The SSH server of the anchor (the VM's): no authentication, direct TCP forwards allowed.
SSH_SERVER = textwrap.dedent("""
    import asyncio, asyncssh, sys

    class Server(asyncssh.SSHServer):
        def begin_auth(self, username):
            return False

        def connection_requested(self, dest_host, dest_port, orig_host, orig_port):
            return True

    async def main():
        key = asyncssh.generate_private_key("ssh-ed25519")
        server = await asyncssh.listen("127.0.0.1", 0, server_factory=Server, server_host_keys=[key])
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")

# The head's side of the anchor: an asyncssh client forwarding a local port to `host:port` as
# seen from the SSH server.
SSH_FORWARD = textwrap.dedent("""
    import asyncio, asyncssh, sys

    async def main():
        ssh_port, target_port = int(sys.argv[1]), int(sys.argv[2])
        async with asyncssh.connect("127.0.0.1", ssh_port, known_hosts=None, username="bench",
                                    client_keys=None, agent_path=None,
                                    encryption_algs=sys.argv[3].split(",")) as connection:
            listener = await connection.forward_local_port("127.0.0.1", 0, "127.0.0.1", target_port)
            print(listener.get_port(), flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
""")


# The user's program: warms the cluster up, then runs each workload named on its stdin and answers
# with its wall seconds and its own CPU seconds.
CLIENT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from transfer import SIZE, payload_size, workloads
    from burla import remote_parallel_map

    remote_parallel_map(payload_size, [bytes(SIZE)] * 4, spinner=False)  # workers up, code warm
    jobs = workloads()
    print("ready", flush=True)
    for line in sys.stdin:
        cpu, started = time.process_time(), time.perf_counter()
        jobs[line.strip()]()
        print(json.dumps([time.perf_counter() - started, time.process_time() - cpu]), flush=True)
""")


class Client:
    """The client's process, given the cluster's environment."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen([CLIENT_PYTHON, "-c", CLIENT, str(Path(__file__).resolve().parent)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, **env})
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the client exited with {self.process.wait(60)}")
        return line.strip()

    def run(self, name: str) -> tuple[float, float]:
        """(wall seconds, the client's CPU seconds) of one workload."""
        assert self.process.stdin is not None
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()
        wall, cpu = json.loads(self._line())
        return wall, cpu

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(60)


def cluster_cpu(head_pid: int, vm_root: Path) -> dict[str, float]:
    """CPU seconds so far of the head, its tunnels' OpenSSH clients, the VMs' SSH servers (this
    process) and the VMs' nodes and
    workers (the processes running the runtime installed under `vm_root`: their supervisor
    detaches them from the SSH server that started them)."""
    def seconds(process: psutil.Process, reaped: bool = False) -> float:
        """Its CPU seconds, and with `reaped` those of its children it has waited for."""
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            return 0.0
        return times.user + times.system + (times.children_user + times.children_system if reaped else 0.0)

    head = psutil.Process(head_pid)
    cpu = collections.Counter({"head": seconds(head), "vm_sshd": seconds(psutil.Process())})
    for child in head.children():  # the tunnels' OpenSSH clients
        with contextlib.suppress(psutil.Error):
            if child.name() == "ssh":
                cpu["tunnel"] += seconds(child)
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or ())
        if str(vm_root) not in command:
            continue
        if "node join" in command:
            cpu["node"] += seconds(process)
        elif "burla.node.workers.fork_server" in command:
            # Its workers come and go (one tenant each): those gone count through the server that reaped them.
            cpu["worker"] += seconds(process, reaped=True)
        elif "burla.node.workers.worker" in command:
            cpu["worker"] += seconds(process)
    return dict(cpu)


def _start(source: str, *arguments: str) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, "-c", source, *arguments], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(10)
        raise RuntimeError("an anchor process failed to start")
    return process, int(line)


def _start_openssh_forward(ssh_port: int, target_port: int) -> tuple[subprocess.Popen, int]:
    """`ssh -L` to the anchor's SSH server, as burla's tunnel client is started (no user
    configuration, the tunnels' ciphers), forwarding a local port to `target_port`."""
    with socket.socket() as probe:  # a free port for the forward to listen on
        probe.bind(("127.0.0.1", 0))
        local_port = probe.getsockname()[1]
    ssh = find_ssh_program()
    assert ssh is not None
    process = subprocess.Popen(
        [ssh, "-v", "-N", "-T", "-F", "none", "-p", str(ssh_port), "-l", "bench", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ExitOnForwardFailure=yes",
         "-o", f"Ciphers={','.join(TUNNEL_CIPHERS)}", "-L", f"127.0.0.1:{local_port}:127.0.0.1:{target_port}",
         "127.0.0.1"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        if "new port-listener" in line:  # listening (it says "Local forwarding listening" before listen())
            # Its debug output goes on for as long as it runs: read it, or the client blocks.
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, local_port
    process.wait(10)
    raise RuntimeError(f"ssh -L failed to start (exit {process.returncode})")


def ssh_anchor_mb_s(direction: str, forward: str) -> float:
    """MB/s of COUNT payloads through client -> [forward -> SSH server] -> relay -> worker, the
    forward being an asyncssh client or OpenSSH's."""
    worker, worker_port = start_hop("worker")
    relay, relay_port = start_hop("relay", str(worker_port))
    server, ssh_port = _start(SSH_SERVER)
    if forward == "openssh":
        client, forward_port = _start_openssh_forward(ssh_port, relay_port)
    else:
        client, forward_port = _start(SSH_FORWARD, str(ssh_port), str(relay_port), ",".join(TUNNEL_CIPHERS))
    try:
        return anchor_chain_mb_s(forward_port, direction)[0]
    finally:
        for process in (client, server, relay, worker):
            process.kill()
            process.wait()


BOOT_ROUNDS = 3  # `cluster start`s per wave, each booting again what failed to
STALL_S = 240  # a wave none of whose booting VMs registered this long is measured as it is


class TunnelledCluster:
    """A head on this machine whose nodes run on stand-in EC2 VMs it booted and reaches over SSH."""

    def __init__(self, root: Path, vms: int = 1, machine_type: str = "m7i.large", wave: int | None = None,
                 tunnel_client: str = "auto") -> None:
        """Boot `vms` stand-in VMs, `wave` at a time if given: each VM installs the runtime, which
        takes seconds of CPU, so on a small machine a hundred at once would not all be set up
        within the boot deadline (`SshSettings.boot_deadline_s`, 900 s)."""
        import boto3
        import moto.server as moto_server
        import pytest

        from tests.conftest import start_head
        from tests.support.clouds.fake_ec2 import Ec2Rules
        from tests.support.clouds.vm_farms import MotoVmFarm
        from tests.support.wheelhouse import build_wheelhouse

        given = os.environ.get("WHEELHOUSE")
        wheelhouse = Path(given) if given else build_wheelhouse(root / "wheelhouse")
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ENDPOINT_URL_EC2=endpoint, AWS_ACCESS_KEY_ID="testing",
                          AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
        os.environ.pop("AWS_PROFILE", None)
        self.patches = pytest.MonkeyPatch()
        rules = Ec2Rules(vcpu_quotas={"L-1216C47A": 1000, "L-DB2E81BA": 0, "L-417A185B": 0})
        rules.install(self.patches)
        rules.publish_images()
        ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
        self.farm = MotoVmFarm(ec2, root / "vms", rules=rules)
        self.head = start_head(root / "config", local_nodes=0, workers=None, extra=[
            "--driver", "ec2", "--node-wheelhouse", str(wheelhouse), "--ssh-address-map", str(self.farm.map_path),
            "--tunnel-client", tunnel_client])
        self.env = {"BURLA_CLUSTER_DASHBOARD_URL": self.head.url, "BURLA_CLUSTER_TOKEN": self.head.token,
                    "BURLA_CONFIG_DIR": str(self.head.config_dir)}
        cli_env = {**os.environ, **self.env}
        try:
            # Nodes stay however long the last VMs take to boot (a cloud node idle 600 s goes by default).
            for count in range(wave or vms, vms + (wave or vms), wave or vms):
                count = min(count, vms)
                # A VM that failed to boot (the head says why in its log) is booted again by the next start;
                # one that stalls (its stand-in never answers) is left to the head's boot deadline.
                for _ in range(BOOT_ROUNDS):
                    for command in (["settings", "update", "--quantity", str(count), "--machine-type", machine_type,
                                     "--inactivity-timeout", "86400"],
                                    ["cluster", "start"]):
                        subprocess.run([sys.executable, "-m", "burla", *command], env=cli_env, check=True,
                                       capture_output=True)
                    if self._wait_for_nodes(count) != "failed":
                        break
            self.registered = len(self._cluster()["nodes"])
        except BaseException:  # interrupted or timed out while booting: stop what runs already
            self.stop()
            raise

    def _cluster(self) -> dict:
        """GET /v1/cluster, asked again while the head is too busy to answer (a hundred VMs
        installing at once leave it little of this machine)."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{self.head.url}/v1/cluster",
                                         headers={"Authorization": f"Bearer {self.head.token}"})
        for _ in range(9):
            try:
                return json.load(urllib.request.urlopen(request, timeout=60))
            except (TimeoutError, urllib.error.URLError):
                time.sleep(5)
        return json.load(urllib.request.urlopen(request, timeout=60))

    def _wait_for_nodes(self, count: int) -> str:
        """Wait until `count` nodes registered ("all"), none is booting any more ("failed"), or
        none registered for STALL_S while some still boot ("stalled")."""
        registered, progress_at = -1, time.monotonic()
        while True:
            cluster = self._cluster()
            if len(cluster.get("nodes", [])) >= count:
                return "all"
            if not cluster.get("booting"):
                return "failed"
            if len(cluster["nodes"]) != registered:
                registered, progress_at = len(cluster["nodes"]), time.monotonic()
            elif time.monotonic() - progress_at > STALL_S:
                return "stalled"
            time.sleep(0.5)

    def head_state(self, window_s: int) -> dict:
        """GET /v1/head: the head's CPU seconds so far and its loop lag over the last `window_s`."""
        import urllib.request

        request = urllib.request.Request(f"{self.head.url}/v1/head?window_s={window_s}",
                                         headers={"Authorization": f"Bearer {self.head.token}"})
        return json.load(urllib.request.urlopen(request, timeout=60))

    def stop(self) -> None:
        self.head.stop()
        self.farm.close()
        self.server.stop()
        self.patches.undo()


Measured = tuple[dict[str, list[float]], dict[str, collections.Counter]]


def measure_burla(tunnel_client: str, names: list[str]) -> Measured:
    """MB/s per round and CPU seconds per role of each workload, through tunnels carried by
    `tunnel_client`."""
    mb_s: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, collections.Counter] = {name: collections.Counter() for name in names}
    with tempfile.TemporaryDirectory(prefix="burla-bench-") as directory:
        root = Path(directory)
        (root / "client-input-files").mkdir()
        cluster = TunnelledCluster(root, tunnel_client=tunnel_client)
        try:
            # The client's own input-file directory: the VM's node can't open its files, so inputs go inline.
            client = Client({**cluster.env, "BURLA_INPUT_FILES_DIR": str(root / "client-input-files")})
            try:
                for _ in range(ROUNDS):
                    for name in names:
                        before = cluster_cpu(cluster.head.process.pid, root / "vms")
                        wall, client_cpu = client.run(name)
                        after = cluster_cpu(cluster.head.process.pid, root / "vms")
                        mb_s[name].append(TOTAL_MB / wall)
                        cpu[name]["client"] += client_cpu
                        for role, seconds in after.items():
                            cpu[name][role] += seconds - before.get(role, 0.0)
            finally:
                client.close()
        finally:
            cluster.stop()
    return mb_s, cpu


def main() -> None:
    # A tunnelled VM's node gets its inputs through the head whatever the client's setting (the head
    # offers no address its connection did not come from): transfer.py's second inputs job is the same here.
    names = ["inputs", "results"]
    clients = TUNNEL_CLIENTS if find_ssh_program() is not None else ["asyncssh"]
    burla = {client: measure_burla(client, names) for client in clients}
    anchors: dict[str, dict[str, list[float]]] = {
        anchor: {name: [] for name in names} for anchor in ("plain", *clients)}
    for _ in range(ROUNDS):
        for name in names:
            anchors["plain"][name].append(anchor_mb_s(name)[0])
            for client in clients:
                anchors[client][name].append(ssh_anchor_mb_s(name, client))

    def median(values: list[float]) -> float:
        return statistics.median(values)

    gb = TOTAL_MB / 1024
    print(json.dumps({
        "benchmark": "transfer_tunnel",
        "cores": os.cpu_count(),
        "rounds": ROUNDS,
        "payloads": f"{COUNT} x {SIZE // 2**20} MB",
        "burla_through_tunnel_mb_s": {client: {name: round(median(v), 1) for name, v in mb_s.items()}
                                      for client, (mb_s, _) in burla.items()},
        "relay_over_ssh_forward_mb_s": {client: {name: round(median(v), 1) for name, v in anchors[client].items()}
                                        for client in clients},
        "plain_relay_mb_s": {name: round(median(v), 1) for name, v in anchors["plain"].items()},
        # The target: burla's tunnel (by default OpenSSH's client) against the asyncssh chain.
        "burla_over_asyncssh_relay": {client: {name: round(median(v) / median(anchors["asyncssh"][name]), 3)
                                               for name, v in mb_s.items()} for client, (mb_s, _) in burla.items()},
        "burla_over_same_client_relay": {client: {name: round(median(v) / median(anchors[client][name]), 3)
                                                  for name, v in mb_s.items()} for client, (mb_s, _) in burla.items()},
        "burla_cpu_s_per_gb": {client: {name: {role: round(seconds / ROUNDS / gb, 3) for role, seconds in c.items()}
                                        for name, c in cpu.items()} for client, (_, cpu) in burla.items()},
        "target_burla_over_asyncssh_relay": 0.8,
    }))


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    sys.exit(main())
