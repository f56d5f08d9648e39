"""How late the head's event loop runs: every handler's time delays every other frame.

A task sleeps a short interval and records how much later than asked it woke. The lag's
percentiles over a recent window say how loaded the head's single loop is (GET /v1/head).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque

import psutil

TICK_S = 0.05
KEEP_S = 600.0


class LoopMonitor:
    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=int(KEEP_S / TICK_S))  # (monotonic, lag s)
        self._process = psutil.Process(os.getpid())

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(TICK_S)
            woke = loop.time()
            self._samples.append((time.monotonic(), max(0.0, woke - asked - TICK_S)))

    def lag_ms(self, window_s: float) -> dict:
        """Percentiles of the loop's lag over the last `window_s` seconds, in milliseconds."""
        since = time.monotonic() - window_s
        lags = sorted(lag for at, lag in self._samples if at >= since)
        if not lags:
            return {"window_s": window_s, "samples": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}

        def percentile(q: float) -> float:
            return round(lags[min(len(lags) - 1, int(q * len(lags)))] * 1000, 2)

        return {"window_s": window_s, "samples": len(lags), "p50": percentile(0.5), "p99": percentile(0.99),
                "max": round(lags[-1] * 1000, 2)}

    def view(self, window_s: float) -> dict:
        times = self._process.cpu_times()
        return {
            "pid": self._process.pid,
            "cpu_s": round(times.user + times.system, 3),
            "rss_mb": round(self._process.memory_info().rss / 2**20, 1),
            "loop_lag_ms": self.lag_ms(window_s),
        }
