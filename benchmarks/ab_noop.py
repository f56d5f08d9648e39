import json, statistics, sys, time
from _common import noop, warm_local_cluster
from warm_latency import _cpu_s, _processes
from burla import remote_parallel_map
N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
R = int(sys.argv[2]) if len(sys.argv) > 2 else 15
inputs = list(range(N))
with warm_local_cluster():
    for _ in range(2):
        remote_parallel_map(noop, inputs, spinner=False)
    procs = _processes()
    before = {k: _cpu_s(v) for k, v in procs.items()}
    walls = []
    for _ in range(R):
        t = time.perf_counter(); remote_parallel_map(noop, inputs, spinner=False); walls.append(time.perf_counter() - t)
    cpu = {k: round((_cpu_s(v) - before[k]) / (N * R) * 1e6, 2) for k, v in procs.items()}
print(json.dumps({"median_us": round(statistics.median(walls) / N * 1e6, 2), "min_us": round(min(walls) / N * 1e6, 2), "cpu": cpu, "cpu_sum": round(sum(cpu.values()), 2)}))
