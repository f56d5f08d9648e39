"""The benchmark scripts still import (they share helpers with the package and the tests, which
change under them); the one that needs no cluster, and small runs of the transfer, tunnel and
head-scale ones, run and print their JSON lines (an import alone had let head_scale.py stay
broken for a while)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.support.helpers import require_openssh

BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_benchmark_imports(name):
    done = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=BENCHMARKS, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_worker_loop_benchmark_prints_its_json_line():
    done = subprocess.run([sys.executable, "worker_loop.py"], cwd=BENCHMARKS, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stderr.strip().splitlines()[-1])  # stdout is captured by the worker loop itself
    assert result["benchmark"] == "worker_loop" and result["us_per_call"] > 0


def _json_line(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_transfer_benchmark_runs_small_and_prints_its_json_line():
    env = {**os.environ, "COUNT": "3", "ROUNDS": "1"}
    result = _json_line(subprocess.run([sys.executable, "transfer.py"], cwd=BENCHMARKS, capture_output=True,
                                       text=True, timeout=300, env=env))
    assert result["benchmark"] == "transfer" and result["payloads"] == "3 x 10 MB"
    for figures in (result["burla_inline_mb_s"], result["plain_relay_mb_s"]):
        assert figures["inputs"] > 0 and figures["results"] > 0
    roles = {"client", "head", "nodes", "workers"}
    assert set(result["burla_cpu_s_per_gb"]["inputs"]) == roles == set(result["plain_relay_cpu_s_per_gb"]["results"])


@pytest.mark.timeout(900)
def test_the_tunnel_transfer_benchmark_runs_small_and_prints_its_json_line(wheelhouse, client_venv):
    require_openssh()
    # The suite's wheelhouse, and a user's environment with only burla in it: nothing for the VM
    # to try installing before the first job.
    env = {**os.environ, "COUNT": "2", "ROUNDS": "1", "WHEELHOUSE": str(wheelhouse), "CLIENT_PYTHON": str(client_venv)}
    result = _json_line(subprocess.run([sys.executable, "transfer_tunnel.py"], cwd=BENCHMARKS, capture_output=True,
                                       text=True, timeout=840, env=env))
    assert result["benchmark"] == "transfer_tunnel"
    # Both carriers of the tunnel, each beside its own anchor and the asyncssh one.
    assert set(result["burla_through_tunnel_mb_s"]) == {"openssh", "asyncssh"} == set(result["burla_cpu_s_per_gb"])
    for carrier in ("openssh", "asyncssh"):
        assert min(result["burla_through_tunnel_mb_s"][carrier].values()) > 0
        assert min(result["relay_over_ssh_forward_mb_s"][carrier].values()) > 0
        # Every process of the chain spent CPU moving the payloads (the client is a process of its own),
        # the tunnel's ssh among them where OpenSSH's client carries it.
        for direction in ("inputs", "results"):
            cpu = result["burla_cpu_s_per_gb"][carrier][direction]
            roles = {"client", "head", "vm_sshd", "node", "worker"} | ({"tunnel"} if carrier == "openssh" else set())
            # psutil counts CPU in clock ticks: two payloads may cost the worker less than one, and the
            # head too where OpenSSH's client carries the tunnel (it then only passes frames on); where
            # the head runs the SSH connection itself, its crypto takes several.
            assert set(cpu) == roles and min(cpu.values()) >= 0 and cpu["vm_sshd"] > 0, cpu
            assert cpu["head"] > 0 if carrier == "asyncssh" else cpu["tunnel"] > 0, cpu


def test_the_head_scale_benchmark_runs_small_and_prints_its_json_line():
    result = _json_line(subprocess.run(
        [sys.executable, "head_scale.py", "--nodes", "3", "--slots", "2", "--calls", "2000", "--idle", "0.5", "--json"],
        cwd=BENCHMARKS, capture_output=True, text=True, timeout=300))
    assert result["benchmark"] == "head_scale"
