"""Burla beside its peers: the same workloads with each tool, in one run, printed as one JSON line.

Rows (each measured for every tool that is installed; the others are listed under "skipped"):
  noop_us_per_call                10,000 no-op calls on a warm pool: microseconds per call (median of 3 runs);
                                  ProcessPoolExecutor with chunksize=1 and with chunksize=100
  sleep_10ms_s                    1,000 calls of time.sleep(0.01) on cores() workers: seconds (median of 3 runs);
                                  burla also with its default, where calls that wait share CPUs
  sleep_10ms_efficiency           ideal / actual, where ideal = 1,000 x 10 ms / cores()
  numpy_10mb_relative_throughput  100 numpy arrays of 10 MB, each summed: throughput over ProcessPoolExecutor's (1.00)
  warm_single_call_ms             a job of one call on a warm pool: milliseconds (median of 20)
  cold_start_s                    a fresh `python -c` process, from import to the first result of one call
                                  (best of 3); burla starts its own embedded cluster from a private config directory
  between_machines_mb_s           100 x 10 MB inputs, and results, through a node that does not share the client's
                                  input files (burla's path between machines: transfer.py, one round), beside a plain
                                  socket relay through the same four processes; the peers move them through shared
                                  memory on one machine, so they have no such row here

Tools, each with cores() worker processes: burla (a warm local cluster), concurrent.futures.ProcessPoolExecutor,
joblib (loky backend), Ray (ray.util.multiprocessing.Pool) and Dask (distributed.LocalCluster with Client.map).
Install the peers with `pip install 'burla[bench]'`. A tool that raises is reported under "errors"; the run goes on.

Run:
  python3 benchmarks/peers.py [--quick] [--only burla,process_pool,joblib,ray,dask]
--quick divides every count (calls, arrays, repeats) by 100, minimum 1: a smoke test that takes seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import compile_burla, cores, median_time, noop, private_config, sleep_10ms, warm_local_cluster

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCHMARKS_DIR.parent
INSTALL_HINT = "pip install 'burla[bench]'"
ARRAY_ELEMENTS = 1_250_000  # float64: 10 MB
SLEEP_S = 0.01
COLD_START_TIMEOUT_S = 300.0
COLD_START_MARKER = "COLD_START_S"
HEAD_STOP_WAIT_S = 10.0

Function = Callable[[Any], Any]
MapRun = Callable[[Function, list[Any]], list[Any]]


@dataclass(frozen=True)
class Sizes:
    noop_calls: int = 10_000
    sleep_calls: int = 1_000
    arrays: int = 100
    run_repeats: int = 3
    latency_repeats: int = 20
    cold_start_repeats: int = 3

    def divided(self, by: int) -> Sizes:
        return Sizes(*(max(1, count // by) for count in dataclasses.astuple(self)))


@dataclass(frozen=True)
class WarmPool:
    """One tool's running pool: `map` returns results in input order, `call` runs a single call as its own job."""

    map: MapRun
    call: Callable[[Function, Any], Any]
    noop_maps: dict[str, MapRun] = field(default_factory=dict)  # the no-op row's settings, when there are several
    sleep_maps: dict[str, MapRun] = field(default_factory=dict)  # the sleep row's settings, when there are several


@dataclass(frozen=True)
class Tool:
    name: str
    modules: tuple[str, ...]
    open_pool: Callable[[], AbstractContextManager[WarmPool]]
    cold_start_code: str


@dataclass
class Report:
    rows: dict[str, dict[str, float]] = field(default_factory=lambda: {
        "noop_us_per_call": {}, "sleep_10ms_s": {}, "sleep_10ms_efficiency": {},
        "numpy_10mb_relative_throughput": {}, "warm_single_call_ms": {}, "cold_start_s": {},
        "between_machines_mb_s": {},
    })
    numpy_seconds: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def add_error(self, tool: str, error: BaseException) -> None:
        text = f"{type(error).__name__}: {error}"
        self.errors[tool] = f"{self.errors[tool]}; {text}" if tool in self.errors else text


def sum_array(array: Any) -> float:
    return float(array.sum())


# --- the tools' pools ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def burla_pool() -> Iterator[WarmPool]:
    from burla import remote_parallel_map

    def run(function: Function, inputs: list[Any]) -> list[Any]:
        return remote_parallel_map(function, inputs, spinner=False)

    def one_call_per_cpu(function: Function, inputs: list[Any]) -> list[Any]:
        return remote_parallel_map(function, inputs, func_cpu=1, spinner=False)

    with warm_local_cluster():
        # Sleeping calls: like for like (a call per CPU, as the others run them), and by default
        # (calls that wait share CPUs: the node runs more of them than it has CPUs).
        yield WarmPool(map=run, call=lambda function, value: run(function, [value])[0],
                       sleep_maps={"burla": one_call_per_cpu, "burla (default: sharing CPUs)": run})


@contextlib.contextmanager
def process_pool() -> Iterator[WarmPool]:
    with ProcessPoolExecutor(max_workers=cores()) as executor:
        def run(function: Function, inputs: list[Any], chunksize: int = 1) -> list[Any]:
            return list(executor.map(function, inputs, chunksize=chunksize))

        yield WarmPool(
            map=run,
            call=lambda function, value: executor.submit(function, value).result(),
            noop_maps={
                "process_pool_chunksize1": run,
                "process_pool_chunksize100": functools.partial(run, chunksize=100),
            },
        )


@contextlib.contextmanager
def joblib_pool() -> Iterator[WarmPool]:
    from joblib import Parallel, delayed
    from joblib.externals.loky import get_reusable_executor

    try:
        with Parallel(n_jobs=cores(), backend="loky") as parallel:
            def run(function: Function, inputs: list[Any]) -> list[Any]:
                return parallel(delayed(function)(value) for value in inputs)

            yield WarmPool(map=run, call=lambda function, value: run(function, [value])[0])
    finally:
        get_reusable_executor().shutdown(wait=True)  # loky keeps its workers for the next Parallel otherwise


@contextlib.contextmanager
def ray_pool() -> Iterator[WarmPool]:
    import ray
    from ray.util.multiprocessing import Pool

    ray.init(num_cpus=cores(), include_dashboard=False, log_to_driver=False)
    try:
        pool = Pool(cores())
        try:
            yield WarmPool(
                map=lambda function, inputs: pool.map(function, inputs),
                call=lambda function, value: pool.apply(function, (value,)),
            )
        finally:
            pool.terminate()
    finally:
        ray.shutdown()


@contextlib.contextmanager
def dask_pool() -> Iterator[WarmPool]:
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=cores(), threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        client = Client(cluster)
        try:
            yield WarmPool(
                map=lambda function, inputs: client.gather(client.map(function, inputs, pure=False)),
                call=lambda function, value: client.submit(function, value, pure=False).result(),
            )
        finally:
            client.close()
    finally:
        cluster.close()


# --- cold start: import to the first result in a fresh interpreter ------------------------------------------------

BURLA_COLD_START = """
import time
start = time.perf_counter()
import burla
def f(x):
    return x + 1
assert burla.remote_parallel_map(f, [1], spinner=False) == [2]
print("COLD_START_S", time.perf_counter() - start, flush=True)
"""

PROCESS_POOL_COLD_START = """
import time
start = time.perf_counter()
from concurrent.futures import ProcessPoolExecutor
def f(x):
    return x + 1
with ProcessPoolExecutor(max_workers={cores}) as pool:
    assert pool.submit(f, 1).result() == 2
    print("COLD_START_S", time.perf_counter() - start, flush=True)
"""

JOBLIB_COLD_START = """
import time
start = time.perf_counter()
from joblib import Parallel, delayed
def f(x):
    return x + 1
assert Parallel(n_jobs={cores}, backend="loky")([delayed(f)(1)]) == [2]
print("COLD_START_S", time.perf_counter() - start, flush=True)
from joblib.externals.loky import get_reusable_executor
get_reusable_executor().shutdown(wait=True)
"""

RAY_COLD_START = """
import time
start = time.perf_counter()
import ray
from ray.util.multiprocessing import Pool
ray.init(num_cpus={cores}, include_dashboard=False, log_to_driver=False)
def f(x):
    return x + 1
pool = Pool({cores})
assert pool.apply(f, (1,)) == 2
print("COLD_START_S", time.perf_counter() - start, flush=True)
pool.terminate()
ray.shutdown()
"""

DASK_COLD_START = """
import time
start = time.perf_counter()
from dask.distributed import Client, LocalCluster
def f(x):
    return x + 1
cluster = LocalCluster(n_workers={cores}, threads_per_worker=1, processes=True, dashboard_address=None)
client = Client(cluster)
assert client.submit(f, 1).result() == 2
print("COLD_START_S", time.perf_counter() - start, flush=True)
client.close()
cluster.close()
"""


def fresh_interpreter_seconds(code: str) -> float:
    """Run `python -c code` in its own session; whatever it leaves running in that session is stopped after."""
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=COLD_START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_session(process.pid)
        process.communicate()
        raise RuntimeError(f"no result within {COLD_START_TIMEOUT_S:.0f} s") from None
    stop_session(process.pid)
    for line in stdout.splitlines():
        if line.startswith(COLD_START_MARKER):
            return float(line.split()[1])
    raise RuntimeError(f"exited with code {process.returncode}: {last_lines(stderr)}")


def stop_session(session_id: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session_id, signal.SIGTERM)


def last_lines(text: str, count: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-count:])


def stop_recorded_head(config_dir: Path) -> None:
    """Stop a head that advertised itself in this config directory (an embedded head stops with its client)."""
    from burla.config import HeadRecord

    record = HeadRecord.read(config_dir)
    if record is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + HEAD_STOP_WAIT_S
    while time.monotonic() < deadline:
        try:
            os.kill(record.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def burla_cold_start_seconds() -> float:
    """One sample on a fresh config directory, so the client starts (and then stops) its own embedded cluster."""
    with private_config() as config_dir:
        try:
            return fresh_interpreter_seconds(BURLA_COLD_START)
        finally:
            stop_recorded_head(config_dir)


def cold_start_seconds(tool: Tool, repeats: int) -> float:
    if tool.name == "burla":
        compile_burla()  # as installing it does; the peers are installed packages with their bytecode
        return min(burla_cold_start_seconds() for _ in range(repeats))
    code = tool.cold_start_code.format(cores=cores())
    return min(fresh_interpreter_seconds(code) for _ in range(repeats))


# --- the workloads ----------------------------------------------------------------------------------------------------


def checked(run: MapRun, function: Function, inputs: list[Any], expected: list[Any]) -> Callable[[], None]:
    def run_and_check() -> None:
        results = run(function, inputs)
        if list(results) != expected:
            raise RuntimeError(f"{getattr(function, '__name__', function)} returned wrong results")

    return run_and_check


def measure_noop(tool: Tool, pool: WarmPool, sizes: Sizes, report: Report) -> None:
    inputs = list(range(sizes.noop_calls))
    for label, run in (pool.noop_maps or {tool.name: pool.map}).items():
        seconds = median_time(checked(run, noop, inputs, inputs), sizes.run_repeats)
        report.rows["noop_us_per_call"][label] = round(seconds / len(inputs) * 1e6, 1)


def measure_sleep(tool: Tool, pool: WarmPool, sizes: Sizes, report: Report) -> None:
    inputs = list(range(sizes.sleep_calls))
    ideal = len(inputs) * SLEEP_S / cores()
    for label, run in (pool.sleep_maps or {tool.name: pool.map}).items():
        seconds = median_time(checked(run, sleep_10ms, inputs, inputs), sizes.run_repeats)
        report.rows["sleep_10ms_s"][label] = round(seconds, 3)
        report.rows["sleep_10ms_efficiency"][label] = round(ideal / seconds, 3)


@functools.cache
def numpy_arrays(count: int) -> tuple[list[Any], list[float]]:
    """Distinct 10 MB arrays and their exact sums (every partial sum is an integer well below 2**53)."""
    import numpy

    arrays = [numpy.full(ARRAY_ELEMENTS, float(index)) for index in range(count)]
    return arrays, [float(index * ARRAY_ELEMENTS) for index in range(count)]


def measure_numpy(tool: Tool, pool: WarmPool, sizes: Sizes, report: Report) -> None:
    if not numpy_installed():
        return
    import numpy

    small = [numpy.ones(8) for _ in range(cores())]
    checked(pool.map, sum_array, small, [8.0] * len(small))()  # numpy imported in every worker before timing
    arrays, sums = numpy_arrays(sizes.arrays)
    report.numpy_seconds[tool.name] = median_time(checked(pool.map, sum_array, arrays, sums), sizes.run_repeats)


def measure_warm_single_call(tool: Tool, pool: WarmPool, sizes: Sizes, report: Report) -> None:
    def one_call() -> None:
        if pool.call(noop, 1) != 1:
            raise RuntimeError("a single call returned a wrong result")

    report.rows["warm_single_call_ms"][tool.name] = round(median_time(one_call, sizes.latency_repeats) * 1e3, 3)


WORKLOADS = (measure_noop, measure_sleep, measure_numpy, measure_warm_single_call)


def measure_tool(tool: Tool, sizes: Sizes, report: Report) -> None:
    try:
        with tool.open_pool() as pool:
            checked(pool.map, noop, list(range(4 * cores())), list(range(4 * cores())))()  # workers up
            for workload in WORKLOADS:
                workload(tool, pool, sizes, report)
    except Exception as error:
        report.add_error(tool.name, error)
    try:
        report.rows["cold_start_s"][tool.name] = round(cold_start_seconds(tool, sizes.cold_start_repeats), 3)
    except Exception as error:
        report.add_error(tool.name, RuntimeError(f"cold start: {error}"))


def measure_between_machines(sizes: Sizes, report: Report) -> None:
    """burla's inline path and its anchor (transfer.py in a process of its own, one round)."""
    env = {**os.environ, "ROUNDS": "1", "COUNT": str(sizes.arrays)}
    finished = subprocess.run([sys.executable, str(BENCHMARKS_DIR / "transfer.py")], env=env, capture_output=True,
                              text=True, timeout=COLD_START_TIMEOUT_S * 4)
    if finished.returncode:
        raise RuntimeError(f"transfer.py failed: {last_lines(finished.stderr)}")
    measured = json.loads(finished.stdout.strip().splitlines()[-1])
    row = report.rows["between_machines_mb_s"]
    for direction in ("inputs", "results"):
        row[f"burla {direction}"] = measured["burla_inline_mb_s"][direction]
        row[f"plain relay {direction}"] = measured["plain_relay_mb_s"][direction]


def finish_numpy_row(report: Report) -> None:
    if not numpy_installed():
        report.skipped["numpy_10mb_relative_throughput"] = f"numpy not installed ({INSTALL_HINT})"
        return
    baseline = report.numpy_seconds.get("process_pool")
    if baseline is None:
        report.skipped["numpy_10mb_relative_throughput"] = "no ProcessPoolExecutor baseline (include process_pool)"
        return
    for name, seconds in report.numpy_seconds.items():
        report.rows["numpy_10mb_relative_throughput"][name] = round(baseline / seconds, 2)


# --- running ----------------------------------------------------------------------------------------------------------

TOOLS = (
    Tool("burla", ("burla",), burla_pool, BURLA_COLD_START),
    Tool("process_pool", (), process_pool, PROCESS_POOL_COLD_START),
    Tool("joblib", ("joblib",), joblib_pool, JOBLIB_COLD_START),
    Tool("ray", ("ray",), ray_pool, RAY_COLD_START),
    Tool("dask", ("dask", "distributed"), dask_pool, DASK_COLD_START),
)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def numpy_installed() -> bool:
    return installed("numpy")


def prepare_worker_environment() -> None:
    """Workers of every tool (and the cold-start interpreters) import burla and benchmarks/ from this checkout."""
    entries = [str(BENCHMARKS_DIR), str(REPO_DIR)]
    if os.environ.get("PYTHONPATH"):
        entries.append(os.environ["PYTHONPATH"])
    os.environ["PYTHONPATH"] = os.pathsep.join(entries)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """What the tools and their worker processes print goes to stderr, so stdout holds only the JSON line."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def parse_arguments() -> argparse.Namespace:
    names = [tool.name for tool in TOOLS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="divide every count by 100 (minimum 1)")
    parser.add_argument("--only", default=",".join(names), help=f"comma-separated tools out of {','.join(names)}")
    arguments = parser.parse_args()
    arguments.only = [name.strip() for name in arguments.only.split(",") if name.strip()]
    unknown = sorted(set(arguments.only) - set(names))
    if unknown:
        parser.error(f"unknown tools {unknown}; choose from {names}")
    return arguments


def run(selected: list[str], sizes: Sizes) -> Report:
    report = Report()
    for tool in TOOLS:
        if tool.name not in selected:
            report.skipped[tool.name] = "not selected (--only)"
        elif not all(installed(module) for module in tool.modules):
            report.skipped[tool.name] = f"not installed ({INSTALL_HINT})"
        else:
            measure_tool(tool, sizes, report)
    if "burla" in selected:
        try:
            measure_between_machines(sizes, report)
        except Exception as error:
            report.add_error("burla", RuntimeError(f"between machines: {error}"))
    finish_numpy_row(report)
    return report


def main() -> None:
    arguments = parse_arguments()
    sizes = Sizes().divided(100) if arguments.quick else Sizes()
    prepare_worker_environment()
    with stdout_to_stderr():
        report = run(arguments.only, sizes)
    print(json.dumps({
        "benchmark": "peers",
        "cores": cores(),
        "quick": arguments.quick,
        "rows": report.rows,
        "skipped": report.skipped,
        "errors": report.errors,
    }))


if __name__ == "__main__":
    main()
