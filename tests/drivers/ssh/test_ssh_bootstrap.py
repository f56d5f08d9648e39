"""Cloud VMs set up over SSH, end to end: a head on loopback (a laptop's) boots EC2 instances in
moto, each played by an SSH server on 127.0.0.1 (`tests.support.clouds.vm_standin`); the head uploads its exact
build, the token and the bootstrap over SFTP, installs them with no index from an uploaded
wheelhouse, starts the node under its supervisor, and the node reaches the head through a remote
port forward on that connection. Nothing else plays a part: the node that runs calls imports burla
from the VM's own environment. Clients run from a virtual environment with only burla in it, as a
user's would, so the VMs have nothing more to install."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import stat
import subprocess
import sys

import psutil
import pytest

from burla.web.scoped_tokens import node_token
from tests.conftest import start_head, wait_for_nodes
from tests.support.clouds.vm_farms import MotoVmFarm
from tests.support.helpers import (
    client_env,
    finish_client,
    get_json,
    require_openssh,
    run_client_in,
    start_client,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)


def _instances(ec2, *states: str) -> list[dict]:
    filters = [{"Name": "tag-key", "Values": ["burla-node-id"]}]
    if states:
        filters.append({"Name": "instance-state-name", "Values": list(states)})
    return [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


@pytest.fixture
def farm(moto, tmp_path):
    farm = MotoVmFarm(moto, tmp_path / "vms")
    yield farm
    farm.close()


def _cloud_head(tmp_path, farm, wheelhouse, *extra: str):
    return start_head(tmp_path / "config", local_nodes=0, workers=None, extra=[
        "--driver", "ec2", "--node-wheelhouse", str(wheelhouse), "--ssh-address-map", str(farm.map_path),
        *extra])


def _grown_job_outcome(client_venv, head, tmp_path) -> list:
    """[exception type, message] of a one-call job that asks the head for a node (grow=True)."""
    [outcome] = run_client_in(client_venv, head, """
        import json
        from burla import remote_parallel_map
        try:
            remote_parallel_map(abs, [-1], grow=True, spinner=False)
        except Exception as e:
            print(json.dumps([type(e).__name__, str(e)]))
    """, tmp_path)
    return outcome


def _connections_to_itself(head) -> int:
    """TCP connections the head's process opened to its own port: a tunnel forwarded through a
    loopback socket (a node's connection served on its SSH channel has none)."""
    port = int(head.url.rsplit(":", 1)[1])
    process = psutil.Process(head.process.pid)
    connections = process.net_connections("tcp") if hasattr(process, "net_connections") else process.connections("tcp")
    return sum(1 for c in connections if c.raddr and c.raddr.port == port)


def _tunnel_clients(head_pid: int) -> list[psutil.Process]:
    """The OpenSSH clients carrying a head's tunnels (`ssh ... -R ...`), its children."""
    found = []
    for process in psutil.process_iter(["cmdline", "ppid"]):
        command = process.info["cmdline"] or []
        if command and os.path.basename(command[0]) == "ssh" and "-R" in command and process.info["ppid"] == head_pid:
            found.append(process)
    return found


def _connections_from(process: psutil.Process, port: int) -> int:
    connections = process.net_connections("tcp") if hasattr(process, "net_connections") else process.connections("tcp")
    return sum(1 for c in connections if c.raddr and c.raddr.port == port)


def _cli(head, *args: str) -> dict:
    env = client_env(head)
    if head.url.startswith("https://"):
        env["BURLA_HEAD_CERT"] = str(head.config_dir / "head-cert.pem")
    done = subprocess.run([sys.executable, "-m", "burla", *args], capture_output=True, text=True, timeout=60, env=env)
    return json.loads(done.stdout)


def test_a_laptop_head_sets_up_its_vm_over_ssh_and_runs_jobs_through_the_tunnel(moto, farm, wheelhouse, client_venv,
                                                                                tmp_path):
    require_openssh()
    head = _cloud_head(tmp_path, farm, wheelhouse)
    try:
        assert _cli(head, "settings", "update", "--quantity", "1")["ok"]
        assert _cli(head, "cluster", "start")["ok"]
        [instance] = _instances(moto)
        node_id = {t["Key"]: t["Value"] for t in instance["Tags"]}["burla-node-id"]
        vm = farm.vm(node_id)
        wait_for_nodes(head, 1, timeout=240)

        # The node runs the head's exact build, installed on the VM, not the test's copy.
        [where] = run_client_in(client_venv, head, """
            import json
            from burla import remote_parallel_map
            def where(x):
                import burla
                return burla.__file__
            print(json.dumps(remote_parallel_map(where, [0], spinner=False)))
        """, tmp_path)
        assert where[0].startswith(str(vm.home / ".burla" / "env")), where
        assert set(vm.logins) == {"ec2-user"}  # Amazon Linux's login user, with the imported key
        # It reaches the head through the tunnel: its head URL is the VM's own loopback.
        [node] = get_json(head, "/v1/cluster")["nodes"]
        assert node["node_id"] == node_id
        assert any("node supervise" in c and "--head http://127.0.0.1:" in c for c in vm.commands), vm.commands
        # OpenSSH's client carries the tunnel, in a process of its own: the node's connections come
        # to the head's port from it, as any other connection does.
        [tunnel] = _tunnel_clients(head.process.pid)
        head_port = int(head.url.rsplit(":", 1)[1])
        assert _connections_from(tunnel, head_port) >= 1
        command = tunnel.cmdline()
        assert "-F" in command and command[command.index("-F") + 1] == "none"  # nothing of the user's config
        assert f"HostKeyAlias={node_id}" in command and "StrictHostKeyChecking=yes" in command
        # Peers reach it at its private address, where it listens (the stand-in's machine lacks that
        # address, so there it listens on all of its own: burla.node.listen.bind_address).
        private = instance["PrivateIpAddress"]
        assert any(f"--host {private} " in c and f"--advertise-host {private}" in c for c in vm.commands)
        assert node["url"].startswith(f"https://{private}:")

        # Secrets arrive as private files, never in user data; the key pair is the cluster's. The VM
        # holds its node's own token, never the cluster's: a job's code runs there.
        token_file = vm.home / ".burla" / "config" / "cluster_token"
        assert token_file.read_text().strip() == node_token(head.token, node_id)
        assert head.token not in "".join(p.read_text(errors="replace") for p in vm.home.rglob("*")
                                         if p.is_file() and p.suffix not in (".whl", ".so", ".pyc"))
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE((vm.home / ".burla").stat().st_mode) == 0o700
        user_data = moto.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
        assert head.token not in base64.b64decode(user_data.get("UserData", {}).get("Value", "") or "").decode()
        assert not any(head.token in command for command in vm.commands)
        [key_file] = (head.config_dir / "ssh").glob("burla-*")  # the cluster's key, imported as the key pair
        assert instance["KeyName"].startswith(f"{key_file.name}-")
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        shutdown = moto.describe_instance_attribute(InstanceId=instance["InstanceId"],
                                                    Attribute="instanceInitiatedShutdownBehavior")
        assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        events = get_json(head, f"/v1/nodes/{node_id}/events")["events"]
        assert any(e["event"] == "ssh host key" for e in events), events

        # Cutting the SSH connection mid-job loses nothing: the head reconnects and the node's link
        # resumes. The VM's sshd has not noticed the cut, so the tunnel's port is still taken there:
        # the tunnel comes back on another, which the node reads before it reconnects.
        marker = tmp_path / "first-result"
        client = start_client(client_venv, head, f"""
            import json, pathlib, time
            from burla import remote_parallel_map
            def pause_then_double(x):
                time.sleep(0.3)
                return x * 2
            results = remote_parallel_map(pause_then_double, range(40), spinner=False, generator=True)
            collected = [next(results)]
            pathlib.Path({str(marker)!r}).write_text("1")
            collected += list(results)
            print(json.dumps(sorted(collected)))
        """, tmp_path)
        wait_until(marker.exists, timeout=120, what="the first result")
        head_url_file = vm.home / ".burla" / "head-url"
        first_url = head_url_file.read_text().strip()
        assert farm.drop_connections(hold_forwards=True) >= 1
        [collected] = finish_client(client)
        assert collected == [x * 2 for x in range(40)]
        reconnections = lambda: [e["detail"] for e in get_json(  # noqa: E731
            head, f"/v1/nodes/{node_id}/events")["events"] if "reconnected" in e["detail"]]
        wait_until(lambda: len(reconnections()) >= 1, timeout=60, what="the SSH connection back")
        moved_url = head_url_file.read_text().strip()
        assert moved_url != first_url and reconnections()[0].endswith(f"tunnel on port {moved_url.rsplit(':', 1)[1]}")
        # The tunnel's client killed: the head starts another and the node's link resumes.
        [tunnel] = _tunnel_clients(head.process.pid)
        tunnel.kill()
        wait_until(lambda: len(reconnections()) >= 2, timeout=60, what="the tunnel back after its client was killed")
        [again] = _tunnel_clients(head.process.pid)
        assert again.pid != tunnel.pid
        [tripled] = run_client_in(client_venv, head, """
            import json
            from burla import remote_parallel_map
            print(json.dumps(remote_parallel_map(lambda x: x * 3, range(5), spinner=False)))
        """, tmp_path)
        assert tripled == [0, 3, 6, 9, 12]

        # A stopping head deletes what it booted.
        head.process.send_signal(signal.SIGTERM)
        head.process.wait(150)
        wait_until(lambda: _instances(moto, "terminated"), timeout=60, what="the VM terminated")
    finally:
        head.stop()


def test_a_node_without_its_head_powers_its_vm_off(moto, farm, wheelhouse, tmp_path):
    require_openssh()
    head = _cloud_head(tmp_path, farm, wheelhouse, "--keep-nodes", "--orphan-timeout", "10")
    try:
        assert _cli(head, "settings", "update", "--quantity", "1")["ok"]
        assert _cli(head, "cluster", "start")["ok"]
        wait_for_nodes(head, 1, timeout=240)
        [tunnel] = _tunnel_clients(head.process.pid)
    finally:
        head.process.kill()  # gone without a word: nothing deletes the VM but the VM itself
        head.process.wait(30)
    # The tunnel died with the head: its client's input ended, the VM's command with it, then the
    # client. After the orphan timeout the supervisor shuts the VM down, which EC2 turns into
    # termination.
    wait_until(lambda: not tunnel.is_running() or tunnel.status() == psutil.STATUS_ZOMBIE, timeout=60,
               what="the tunnel's client gone with its head")
    wait_until(lambda: farm.powered_off, timeout=120, what="the VM powered itself off")
    assert _instances(moto, "terminated")


def test_a_new_head_deletes_the_vms_an_earlier_head_left_that_do_not_join_it(moto, farm, wheelhouse, tmp_path):
    first = _cloud_head(tmp_path, farm, wheelhouse, "--keep-nodes")
    try:
        assert _cli(first, "settings", "update", "--quantity", "1")["ok"]
        assert _cli(first, "cluster", "start")["ok"]
        wait_for_nodes(first, 1, timeout=240)
    finally:
        first.stop()  # SIGTERM with --keep-nodes: the VM stays
    assert _instances(moto, "running")
    # The next head of this cluster finds it; through a tunnel that died with the first head it
    # can't join, so it is deleted at this head's boot deadline (long before its orphan timeout).
    second = _cloud_head(tmp_path, farm, wheelhouse, "--boot-deadline", "5")
    try:
        wait_until(lambda: not _instances(moto, "pending", "running"), timeout=120, what="the leftover VM deleted")
        [instance] = _instances(moto)
        node_id = {t["Key"]: t["Value"] for t in instance["Tags"]}["burla-node-id"]
        events = get_json(second, f"/v1/nodes/{node_id}/events")["events"]
        assert any("left by an earlier head" in e["detail"] for e in events), events
    finally:
        second.stop()


@pytest.mark.parametrize("broken, words", [
    ({"authorize": False}, "refused the cluster's SSH key"),
    ({"answer": False}, "nothing answered SSH on port 22"),
    # Someone else answers at the VM's address: its key is not the one cloud-init printed.
    ({"host_keys": "impostor"}, "presented SSH host key ssh-ed25519 SHA256:"),
    ({"host_keys": "unreported"}, "waiting for the cloud to report VM"),
])
def test_a_vm_that_cannot_be_set_up_is_deleted_and_the_job_says_why(moto, tmp_path, wheelhouse, client_venv, broken,
                                                                    words):
    farm = MotoVmFarm(moto, tmp_path / "vms", **broken)
    # Only a VM that never answers waits its deadline out; the others fail at the stage they name,
    # which on a loaded machine can come later than 12 s after the VM was asked for.
    deadline = "12" if broken.get("answer") is False else "30"
    head = _cloud_head(tmp_path, farm, wheelhouse, "--boot-deadline", deadline)
    try:
        outcome = _grown_job_outcome(client_venv, head, tmp_path)
        assert outcome[0] == "NoNodes" and words in outcome[1], outcome
        wait_until(lambda: not _instances(moto, "pending", "running"), timeout=60, what="the VM deleted")
        [instance] = _instances(moto)
        node_id = {t["Key"]: t["Value"] for t in instance["Tags"]}["burla-node-id"]
        logs = _cli(head, "nodes", "logs", node_id)
        assert words in json.dumps(logs), logs
        if "host_keys" in broken:  # nothing secret went to whoever answered
            uploaded = [p for p in (tmp_path / "vms" / instance["InstanceId"]).rglob("*") if p.is_file()
                        and head.token.encode() in p.read_bytes()]
            assert uploaded == [] and "nothing secret" in json.dumps(logs)
    finally:
        head.stop()
        farm.close()


def test_a_refused_remote_forward_is_asked_again_and_a_vm_that_never_grants_one_fails_saying_so(
        moto, tmp_path, wheelhouse, client_venv):
    # Refused twice, then granted (a port the sshd could not bind, a busy daemon): the node joins.
    # Here asyncssh carries the tunnel in the head's own process, as on a machine without OpenSSH's
    # client: a plain-http head serves the node's connection on the SSH channel itself.
    farm = MotoVmFarm(moto, tmp_path / "vms", refuse_forwards=2)
    head = _cloud_head(tmp_path, farm, wheelhouse, "--tunnel-client", "asyncssh")
    try:
        assert _cli(head, "settings", "update", "--quantity", "1")["ok"]
        [node_id] = _cli(head, "cluster", "start")["data"]["booted"]
        wait_for_nodes(head, 1, timeout=240)
        logs = json.dumps(_cli(head, "nodes", "logs", node_id))
        assert logs.count("refused the tunnel's remote port forward") == 2 and "asking again in 2 s" in logs, logs
        assert farm.vm(node_id).refuse_forwards == 0
        assert _tunnel_clients(head.process.pid) == [] and _connections_to_itself(head) == 0
    finally:
        head.stop()
        farm.close()
    # Refused every time (AllowTcpForwarding no): setting the VM up fails saying so, long before the
    # boot deadline, and the job's error names it.
    farm = MotoVmFarm(moto, tmp_path / "vms-refusing", refuse_forwards=-1)
    head = _cloud_head(tmp_path / "second", farm, wheelhouse, "--boot-deadline", "600")
    try:
        outcome = _grown_job_outcome(client_venv, head, tmp_path)
        assert outcome[0] == "NoNodes" and "refused the tunnel's remote port forward (asked 4 times" in outcome[1], \
            outcome
        assert "AllowTcpForwarding" in outcome[1]
    finally:
        head.stop()
        farm.close()


@pytest.mark.parametrize("tunnel_client", ["auto", "asyncssh"])
def test_an_https_head_is_pinned_by_its_nodes_through_the_tunnel(moto, farm, wheelhouse, tmp_path, tunnel_client):
    if tunnel_client == "auto":
        require_openssh()
    head = _cloud_head(tmp_path, farm, wheelhouse, "--tls-self-signed", "--tunnel-client", tunnel_client)
    try:
        assert head.url.startswith("https://127.0.0.1:")
        assert _cli(head, "settings", "update", "--quantity", "1")["ok"]
        [node_id] = _cli(head, "cluster", "start")["data"]["booted"]
        vm = farm.vm(node_id)
        # The node reaches the https head through its tunnel, pinning the certificate it was given.
        wait_until(lambda: _cli(head, "nodes", "list")["data"], timeout=240, what="the node joined")
        pinned = vm.home / ".burla" / "head-cert.pem"
        assert pinned.read_text() == (head.config_dir / "head-cert.pem").read_text()
        [start] = [c for c in vm.commands if "node supervise" in c]
        assert "--head https://127.0.0.1:" in start and '--head-cert "$B"/head-cert.pem' in start
        # A TLS head's tunnel forwards to its port, where asyncio's TLS runs on a real socket: from
        # OpenSSH's client, or without one from the head's own process.
        if tunnel_client == "asyncssh":
            assert _tunnel_clients(head.process.pid) == [] and _connections_to_itself(head) >= 1
        else:
            [tunnel] = _tunnel_clients(head.process.pid)
            assert _connections_from(tunnel, int(head.url.rsplit(":", 1)[1])) >= 1
    finally:
        head.stop()


def test_the_bootstrap_installs_the_uploaded_build_never_burla_by_name():
    from burla.drivers.ssh.bootstrap import PackageSource, install_script
    from burla.process.build import build_hash, wheel_name

    script = install_script("3.12", PackageSource(index_url="https://mirror.example/simple"))
    assert f'"$B/build/{wheel_name()}"' in script and "--index-url https://mirror.example/simple" in script
    assert "burla==" not in script and "pip install burla" not in script
    assert "uv-env/bin/uv venv --quiet --python 3.12 env" in script  # the client's Python, fetched if missing
    assert ("uv-env/bin/uv pip install --quiet --python env/bin/python --index-url https://mirror.example/simple pip "
            f'"$B/build/{wheel_name()}"' in script)  # uv installs the build too, and pip for the node's installs
    assert f"echo '{build_hash()} py3.12' > installed-build" in script  # the build, for that Python
    offline = install_script(None, PackageSource(wheelhouse="/wheels"))
    assert '--no-index --find-links $B/wheelhouse' in offline


def test_the_configured_cloud_then_the_one_signed_in_picks_the_driver(tmp_path):
    from burla.drivers.registry import resolve_driver
    from burla.errors import CloudSetupError

    home = tmp_path / "home"
    environ = {"HOME": str(home)}
    assert resolve_driver(None, None, environ) == "local"  # signed in nowhere: this machine
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text("[default]\naws_access_key_id = A\naws_secret_access_key = B\n")
    assert resolve_driver(None, None, environ) == "ec2"
    assert resolve_driver(None, "gcp", environ) == "gce"  # `burla config set cloud gcp` wins
    assert resolve_driver("local", "gcp", environ) == "local"  # and --driver over both
    with pytest.raises(CloudSetupError, match="signed in to several clouds .aws, azure.*burla config set cloud"):
        resolve_driver(None, None, {**environ, "AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t"})
    with pytest.raises(CloudSetupError, match="not one of aws, gcp, azure"):
        resolve_driver(None, "oracle", environ)


def test_head_serve_with_several_clouds_signed_in_names_the_fix(tmp_path):
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "config").write_text("[default]\nregion = us-east-1\n")
    (home / ".azure").mkdir()
    (home / ".azure" / "azureProfile.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "CLOUDSDK_"))}
    env.update(HOME=str(home), BURLA_CONFIG_DIR=str(tmp_path / "config"))
    env.pop("BURLA_CLOUD", None)
    done = subprocess.run([sys.executable, "-m", "burla", "head", "serve", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "signed in to several clouds (aws, azure)" in done.stderr, done.stderr


def test_missing_permission_to_import_the_key_names_it():
    from burla.drivers.aws.driver import Ec2Config, Ec2Driver
    from burla.errors import CloudSetupError

    class Refusing:  # what libcloud raises when the IAM policy lacks the action
        def list_key_pairs(self):
            raise Exception("UnauthorizedOperation: You are not authorized to perform this operation.")

    driver = Ec2Driver(Ec2Config(region="us-east-1", cluster_id="c1"), credentials=lambda _: ("a", "b", None))
    try:
        with pytest.raises(CloudSetupError, match="ec2:DescribeKeyPairs and ec2:ImportKeyPair"):
            driver._key_pair(Refusing(), "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGSoU burla-c1")
    finally:
        asyncio.run(driver.close())


def test_cloud_nodes_from_cluster_start_go_after_ten_idle_minutes_unless_configured(tmp_path):
    from burla.drivers.local import LocalDriver
    from burla.head.cluster import Cluster
    from burla.head.machines.cluster_settings import ClusterSettings
    from burla.head.machines.fleet import CLOUD_IDLE_S, GROWN_IDLE_S, Fleet

    class CloudLike(LocalDriver):
        name = "ec2"

    fleet = Fleet(Cluster("0"), CloudLike(), None, "http://127.0.0.1:1", "t", ClusterSettings(), tmp_path)
    fleet.grown.add("grown")
    assert (fleet.idle_timeout("started"), fleet.idle_timeout("grown")) == (CLOUD_IDLE_S, GROWN_IDLE_S) == (600, 60)
    fleet.settings = ClusterSettings(inactivity_timeout_s=30)
    assert (fleet.idle_timeout("started"), fleet.idle_timeout("grown")) == (30, 30)
    local = Fleet(Cluster("0"), LocalDriver(), None, "http://127.0.0.1:1", "t", ClusterSettings(), tmp_path)
    assert local.idle_timeout("started") is None  # local nodes stay unless told otherwise
