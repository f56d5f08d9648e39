"""What a node tells its head about its machine: CPU and memory use, network bytes per second
sent and received, and GPU use (NodeState)."""

from __future__ import annotations

import asyncio
import time

import psutil

from burla.node.gpus import read_usage as read_gpu_usage

# psutil's readings (about 0.1 ms) are taken at most every MACHINE_READINGS_S: a burst of state
# pushes reuses them.
MACHINE_READINGS_S = 0.5
GPU_READINGS_S = 2.0  # nvidia-smi takes tens of ms a run


class MachineReadings:
    def __init__(self) -> None:
        self._last_network: tuple[float, int, int] = (0.0, 0, 0)
        self._readings: tuple[float, float, float, float] | None = None  # the last machine readings
        self.gpu_usage: tuple[float, float] = (0.0, 0.0)  # GPU utilisation and memory %, when it has GPUs

    def machine(self) -> tuple[float, float, float, float]:
        """CPU and memory percent, bytes per second sent and received by this machine (taken
        again only once MACHINE_READINGS_S has passed)."""
        now = time.monotonic()
        last_at, last_sent, last_recv = self._last_network
        if self._readings is not None and now - last_at < MACHINE_READINGS_S:
            return self._readings
        counters = psutil.net_io_counters()
        self._last_network = (now, counters.bytes_sent, counters.bytes_recv)
        elapsed = now - last_at
        if elapsed <= 0 or last_at == 0.0:
            sent_bps = recv_bps = 0.0
        else:
            sent_bps = (counters.bytes_sent - last_sent) / elapsed
            recv_bps = (counters.bytes_recv - last_recv) / elapsed
        self._readings = (float(psutil.cpu_percent(interval=None)), float(psutil.virtual_memory().percent),
                          sent_bps, recv_bps)
        return self._readings

    async def watch_gpus(self) -> None:
        """GPU utilisation and memory, read with nvidia-smi every GPU_READINGS_S (it is slow)."""
        while True:
            usage = await read_gpu_usage()
            if usage is not None:
                self.gpu_usage = usage
            await asyncio.sleep(GPU_READINGS_S)
