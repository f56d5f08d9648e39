"""Cold start: `import burla` to the first result of a one-input job on a fresh embedded cluster.

burla's modules are compiled to bytecode first, as an installed package's are.

Each sample runs in a new interpreter (nothing cached in memory) beside the same measurement
for ProcessPoolExecutor: import to first result of one call.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import compile_burla

REPEATS = 5

BURLA = """
import time
start = time.perf_counter()
import burla
def f(x):
    return x + 1
assert burla.remote_parallel_map(f, [1], spinner=False) == [2]
print(time.perf_counter() - start)
"""

POOL = """
import time
start = time.perf_counter()
from concurrent.futures import ProcessPoolExecutor
def f(x):
    return x + 1
if __name__ == "__main__":
    with ProcessPoolExecutor() as pool:
        assert pool.submit(f, 1).result() == 2
        print(time.perf_counter() - start)
"""


def sample(code: str, env: dict[str, str]) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(code)
    try:
        done = subprocess.run([sys.executable, script.name], env=env, capture_output=True, text=True, check=True)
    finally:
        os.unlink(script.name)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    compile_burla()
    with tempfile.TemporaryDirectory(prefix="burla-bench-") as config:
        env = dict(os.environ, BURLA_CONFIG_DIR=config)
        env.pop("BURLA_CLUSTER_DASHBOARD_URL", None)
        env.pop("BURLA_CLUSTER_TOKEN", None)
        sample(BURLA, env)  # first run writes the token and warms the OS file cache
        burla = [sample(BURLA, env) for _ in range(REPEATS)]
        pool = [sample(POOL, env) for _ in range(REPEATS)]
    print(json.dumps({
        "benchmark": "cold_start",
        "repeats": REPEATS,
        "burla_s": round(statistics.median(burla), 3),
        "process_pool_s": round(statistics.median(pool), 3),
        "target_s": 1.5,
    }))


if __name__ == "__main__":
    main()
