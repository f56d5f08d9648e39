"""A laptop head with VMs it reaches over SSH: what each tunnel costs the head idle, and the
head's CPU per call and loop lag during no-op jobs, at a given number of stand-in VMs.

`--vms N` stand-in EC2 VMs (moto; each an SSH server on 127.0.0.1 running a real node after the
real bootstrap, which installs the runtime from the uploaded wheelhouse) are booted by a real head
through the `ec2` driver; each node reaches the head over its VM's SSH remote port forward. Then:
idle, the head's CPU over IDLE_S seconds (per tunnel: that over N) and its loop lag p99; and over
JOBS jobs of CALLS no-op calls, the head's CPU per call and its loop lag p99 during them. Run at
two sizes and compare: what grows faster than the VMs do is what to fix.

Run: python3 tunnel_scale.py --vms 10 (each VM is a node with its workers on this machine). Every
node first installs the distributions the client has and it lacks (as on a real cloud): from an
environment with extras (the peers of `.[bench]`), the first job waits for each VM to install them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import environment, noop
from transfer_tunnel import TunnelledCluster

IDLE_S = 20
JOBS = 3
CALLS = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=10)
    parser.add_argument("--machine-type", default="m7i.large")
    arguments = parser.parse_args()
    from burla import remote_parallel_map

    with tempfile.TemporaryDirectory(prefix="burla-bench-") as directory:
        started = time.perf_counter()
        cluster = TunnelledCluster(Path(directory), vms=arguments.vms, machine_type=arguments.machine_type)
        booted_s = time.perf_counter() - started
        try:
            with environment(**cluster.env):
                remote_parallel_map(noop, list(range(1000)), spinner=False)  # every node warm
                time.sleep(3)
                before = cluster.head_state(IDLE_S)["cpu_s"]
                time.sleep(IDLE_S)
                idle = cluster.head_state(IDLE_S)
                idle_cpu = (idle["cpu_s"] - before) / IDLE_S
                seconds = []
                cpu_before = cluster.head_state(1)["cpu_s"]
                job_started = time.monotonic()
                for _ in range(JOBS):
                    begun = time.perf_counter()
                    remote_parallel_map(noop, list(range(CALLS)), spinner=False)
                    seconds.append(time.perf_counter() - begun)
                during = cluster.head_state(max(1, math.ceil(time.monotonic() - job_started)))
        finally:
            cluster.stop()
    print(json.dumps({
        "benchmark": "tunnel_scale",
        "cores": os.cpu_count(),
        "vms": arguments.vms,
        "boot_and_register_s": round(booted_s, 1),
        "idle_head_cpu_percent": round(idle_cpu * 100, 2),
        "idle_head_cpu_percent_per_tunnel": round(idle_cpu * 100 / arguments.vms, 3),
        "idle_loop_lag_ms": idle["loop_lag_ms"],
        "calls_per_job": CALLS,
        "job_us_per_call": round(min(seconds) / CALLS * 1e6, 2),
        "head_cpu_us_per_call": round((during["cpu_s"] - cpu_before) / (JOBS * CALLS) * 1e6, 2),
        "jobs_loop_lag_ms": during["loop_lag_ms"],
        "head_rss_mb": during["rss_mb"],
    }))


if __name__ == "__main__":
    sys.exit(main())
