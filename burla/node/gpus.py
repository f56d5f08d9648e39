"""The NVIDIA GPUs of this machine, as `nvidia-smi` lists them, and which one each worker sees.

A node offers its GPUs as one model and a count (the catalog's names: A100_40G, H100_80G, T4).
Each of its first `count` workers is given one GPU through CUDA_VISIBLE_DEVICES and the others
none, so a call of a job with func_gpu, which runs only on a worker with a GPU, has one GPU of
its own.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from dataclasses import dataclass

from burla.drivers.catalog import model_of_reported

QUERY_TIMEOUT_S = 10.0
ENV_VISIBLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Gpus:
    model: str | None  # None: no GPU
    count: int


def detect() -> Gpus:
    """This machine's NVIDIA GPUs; none when nvidia-smi is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return Gpus(None, 0)
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return Gpus(None, 0)
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []
    if not names:
        return Gpus(None, 0)
    return Gpus(model_of_reported(names[0]), len(names))


async def read_usage() -> tuple[float, float] | None:
    """(utilisation %, memory used %) over all GPUs, from nvidia-smi; None if it can't tell."""
    try:
        process = await asyncio.create_subprocess_exec(
            "nvidia-smi", "--query-gpu=utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL)
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(process.communicate(), QUERY_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        return None
    if process.returncode != 0:
        return None
    utilisation, used, total = [], 0.0, 0.0
    for line in out.decode(errors="replace").splitlines():
        fields = [field.strip() for field in line.split(",")]
        try:
            utilisation.append(float(fields[0]))
            used += float(fields[1])
            total += float(fields[2])
        except (ValueError, IndexError):
            continue  # "[N/A]" on some boards
    if not utilisation:
        return None
    return sum(utilisation) / len(utilisation), (100.0 * used / total if total > 0 else 0.0)
