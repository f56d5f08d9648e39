"""A laptop head with VMs it reaches over SSH: what each tunnel costs the head idle, and the
head's CPU per call and loop lag during no-op jobs, at a given number of stand-in VMs.

`--vms N` stand-in EC2 VMs (moto; each an SSH server on 127.0.0.1 running a real node after the
real bootstrap, which installs the runtime from the uploaded wheelhouse) are booted by a real head
through the `ec2` driver; each node reaches the head over its VM's SSH remote port forward. Then:
idle, the head's CPU over IDLE_S seconds (per tunnel: that over N) and its loop lag p99; and over
JOBS jobs of CALLS no-op calls, the head's CPU per call and its loop lag p99 during them. Where
OpenSSH's client carries the tunnels (`--tunnel-client`), a process of the head's per VM, their
CPU and memory beside the head's. Run at two sizes and compare: what grows faster than the VMs do
is what to fix.

Run: python3 tunnel_scale.py --vms 10 [--client-python PYTHON] (each VM is a node with its workers
on this machine). Every node first installs the distributions the client has and it lacks (as on
a real cloud), so the client runs in an interpreter of its own: given one whose environment holds
burla alone, at the versions of this one (`python3 -m venv env && pip freeze --exclude-editable > c.txt &&
env/bin/pip install -e . -c c.txt`), no VM installs anything. (Where its versions differ, a hundred VMs
install at once on this machine, and the head gets too little of it to answer.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
from transfer_tunnel import TunnelledCluster

IDLE_S = 20
JOBS = 3
CALLS = 10_000


# The jobs, run by the client in an interpreter of its own (`--client-python`): warm every node,
# say so, wait for the word, then time the jobs.
CLIENT = textwrap.dedent(f"""
    import json, sys, time
    from burla import remote_parallel_map

    def noop(x):
        return x

    remote_parallel_map(noop, list(range(1000)), spinner=False)
    print("WARM", flush=True)
    sys.stdin.readline()
    seconds = []
    for _ in range({JOBS}):
        begun = time.perf_counter()
        remote_parallel_map(noop, list(range({CALLS})), spinner=False)
        seconds.append(time.perf_counter() - begun)
    print(json.dumps(seconds), flush=True)
""")


def tunnel_clients(head_pid: int) -> dict[str, float]:
    """The head's tunnel clients (OpenSSH's, a process per VM): how many, their CPU seconds so
    far, and their memory: resident, and their own (USS: what ending them would give back)."""
    totals = {"processes": 0.0, "cpu_s": 0.0, "rss_mb": 0.0, "uss_mb": 0.0}
    for child in psutil.Process(head_pid).children():
        with contextlib.suppress(psutil.Error):
            if child.name() != "ssh":
                continue
            times, memory = child.cpu_times(), child.memory_full_info()
            totals["processes"] += 1
            totals["cpu_s"] += times.user + times.system
            totals["rss_mb"] += memory.rss / 2**20
            totals["uss_mb"] += memory.uss / 2**20
    return totals


def run_jobs(python: str, env: dict[str, str],
             cluster: TunnelledCluster) -> tuple[dict, float, list[float], dict, float, dict[str, float]]:
    """(the head's state after IDLE_S idle, its CPU share then, the jobs' seconds, its state after
    them, its CPU seconds before them, and its tunnel clients' CPU share idle and CPU seconds during
    the jobs)."""
    client = subprocess.Popen([python, "-c", CLIENT], env={**os.environ, **env}, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert client.stdin is not None and client.stdout is not None
    try:
        if client.stdout.readline().strip() != "WARM":
            raise RuntimeError("the client failed before its warm-up job ended")
        time.sleep(3)
        before, tunnels_before = cluster.head_state(IDLE_S)["cpu_s"], tunnel_clients(cluster.head.process.pid)
        time.sleep(IDLE_S)
        idle, tunnels_idle = cluster.head_state(IDLE_S), tunnel_clients(cluster.head.process.pid)
        idle_cpu = (idle["cpu_s"] - before) / IDLE_S
        cpu_before = cluster.head_state(1)["cpu_s"]
        started = time.monotonic()
        client.stdin.write("go\n")
        client.stdin.flush()
        seconds = json.loads(client.stdout.readline())
        during = cluster.head_state(max(1, math.ceil(time.monotonic() - started)))
        during["elapsed_s"] = time.monotonic() - started
        tunnels_after = tunnel_clients(cluster.head.process.pid)
    finally:
        client.kill()
        client.wait()
    tunnels = {**tunnels_idle, "idle_cpu": (tunnels_idle["cpu_s"] - tunnels_before["cpu_s"]) / IDLE_S,
               "jobs_cpu_s": tunnels_after["cpu_s"] - tunnels_idle["cpu_s"]}
    return idle, idle_cpu, seconds, during, cpu_before, tunnels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=10)
    parser.add_argument("--machine-type", default="m7i.large")
    parser.add_argument("--client-python", default=sys.executable,
                        help="the client's interpreter: one whose environment holds burla alone spares every VM "
                             "installing what this one has")
    parser.add_argument("--tunnel-client", choices=["auto", "openssh", "asyncssh"], default="auto",
                        help="what carries the tunnels (burla head serve --tunnel-client)")
    parser.add_argument("--wave", type=int, default=25, help="boot this many VMs at a time (each installs the runtime)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="work in this directory and keep it (the head's and VMs' logs), not a temporary one")
    arguments = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the cluster's VMs and nodes are stopped too

    with contextlib.nullcontext(str(arguments.keep)) if arguments.keep else \
            tempfile.TemporaryDirectory(prefix="burla-bench-") as directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        cluster = TunnelledCluster(Path(directory), vms=arguments.vms, machine_type=arguments.machine_type,
                                   wave=arguments.wave, tunnel_client=arguments.tunnel_client)
        booted_s = time.perf_counter() - started
        try:
            env = {**cluster.env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
            idle, idle_cpu, seconds, during, cpu_before, tunnels = run_jobs(arguments.client_python, env, cluster)
        finally:
            cluster.stop()
    print(json.dumps({
        "benchmark": "tunnel_scale",
        "cores": os.cpu_count(),
        "vms": arguments.vms,
        "vms_registered": cluster.registered,
        "boot_and_register_s": round(booted_s, 1),
        "idle_head_cpu_percent": round(idle_cpu * 100, 2),
        "idle_head_cpu_percent_per_tunnel": round(idle_cpu * 100 / cluster.registered, 3),
        "calls_per_job": CALLS,
        "job_us_per_call": round(min(seconds) / CALLS * 1e6, 2),
        "jobs_s": [round(s, 2) for s in seconds],
        "head_cpu_us_per_call": round((during["cpu_s"] - cpu_before) / (JOBS * CALLS) * 1e6, 2),
        # Less what the head spends idle with these tunnels over as long (keepalives, state pushes):
        # on a machine running a hundred nodes the jobs take long enough for that to dominate.
        "head_cpu_us_per_call_net_of_idle": round(
            (during["cpu_s"] - cpu_before - idle_cpu * during["elapsed_s"]) / (JOBS * CALLS) * 1e6, 2),
        "idle_loop_lag_ms": idle["loop_lag_ms"],
        "jobs_loop_lag_ms": during["loop_lag_ms"],
        "head_rss_mb": during["rss_mb"],
        # OpenSSH's clients, a process per tunnel (none when asyncssh carries them in the head).
        "tunnel_clients": int(tunnels["processes"]),
        "tunnel_clients_idle_cpu_percent": round(tunnels["idle_cpu"] * 100, 2),
        "tunnel_clients_cpu_us_per_call": round(tunnels["jobs_cpu_s"] / (JOBS * CALLS) * 1e6, 2),
        "tunnel_client_rss_mb_each": round(tunnels["rss_mb"] / max(1, tunnels["processes"]), 2),
        "tunnel_client_uss_mb_each": round(tunnels["uss_mb"] / max(1, tunnels["processes"]), 2),
    }))


if __name__ == "__main__":
    sys.exit(main())
