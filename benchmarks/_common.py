"""Shared helpers: a private config directory and a warm local cluster for one benchmark run."""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def noop(x):
    return x


def sleep_10ms(x):
    time.sleep(0.01)
    return x


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@contextlib.contextmanager
def private_config() -> Iterator[Path]:
    """Point burla at a fresh config directory so no other head on this machine is used."""
    saved = {k: os.environ.get(k) for k in ("BURLA_CONFIG_DIR", "BURLA_CLUSTER_DASHBOARD_URL", "BURLA_CLUSTER_TOKEN")}
    with tempfile.TemporaryDirectory(prefix="burla-bench-") as directory:
        os.environ["BURLA_CONFIG_DIR"] = directory
        os.environ.pop("BURLA_CLUSTER_DASHBOARD_URL", None)
        os.environ.pop("BURLA_CLUSTER_TOKEN", None)
        try:
            yield Path(directory)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@contextlib.contextmanager
def warm_local_cluster() -> Iterator[str]:
    """A local head and node (the embedded cluster's processes), kept running across jobs."""
    import burla
    from burla.config import HeadRecord

    with private_config() as directory:
        url = burla.get_cluster_dashboard_url()
        record = HeadRecord.read(directory)
        try:
            burla.remote_parallel_map(noop, list(range(100)), spinner=False)  # workers up, code warm
            yield url
        finally:
            if record is not None:
                os.kill(record.pid, signal.SIGTERM)
                for _ in range(200):
                    try:
                        os.kill(record.pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.05)


def median_time(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
