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

import cloudpickle  # noqa: E402

# Each benchmark measures the heads it starts itself: a script's head stops with it (no background
# head outlives a run, and no sample finds one an earlier sample left warm).
os.environ.setdefault("BURLA_BACKGROUND_HEAD", "0")

# Workers load these functions by value (like a user's __main__), from any working directory.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def noop(x):
    return x


def sleep_10ms(x):
    time.sleep(0.01)
    return x


def timed_sleep_10ms(x):
    """time.sleep(0.01), returning how long it took: the time the call itself spent, beside the
    wall time of the job (a sleep overshoots its 10 ms by a machine-dependent margin)."""
    start = time.perf_counter()
    time.sleep(0.01)
    return time.perf_counter() - start


def wait_1s(x):
    time.sleep(1.0)
    return x


def spin(seconds):
    """Burn about `seconds` of CPU."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return seconds


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _set_variable(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set (or, with None, unset) environment variables for the block, then restore them. The
    benchmarks measure what a user runs, `burla.remote_parallel_map` finding its cluster the way
    the user's would: through the environment."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            _set_variable(key, value)
        yield
    finally:
        for key, value in saved.items():
            _set_variable(key, value)


@contextlib.contextmanager
def private_config() -> Iterator[Path]:
    """Point burla at a fresh config directory so no other head on this machine is used."""
    with tempfile.TemporaryDirectory(prefix="burla-bench-") as directory, environment(
        BURLA_CONFIG_DIR=directory, BURLA_CLUSTER_DASHBOARD_URL=None, BURLA_CLUSTER_TOKEN=None
    ):
        yield Path(directory)


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


def compile_burla() -> None:
    """Compile burla's modules to bytecode, as installing a package does (pip compiles at install).
    An editable install where PYTHONDONTWRITEBYTECODE=1 is set never gets any, and each process
    of a cold start (client, head, node) would compile its ~12,000 lines again."""
    import compileall

    import burla

    compileall.compile_dir(str(Path(burla.__file__).parent), quiet=1)


def median_time(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
