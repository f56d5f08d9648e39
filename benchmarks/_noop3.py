"""One round: 10,000 no-op calls, median of 7 runs, for the burla on sys.path, and joblib."""
import json, sys, statistics, time
from _common import noop, warm_local_cluster
import peers
inputs = list(range(10_000))
def med(run):
    run(); ts = []
    for _ in range(7):
        t = time.perf_counter(); out = run(); ts.append(time.perf_counter() - t)
        assert out == inputs
    return round(statistics.median(ts) / len(inputs) * 1e6, 2)
which = sys.argv[1]
if which == "joblib":
    with peers.joblib_pool() as pool:
        print(json.dumps({"joblib": med(lambda: pool.map(noop, inputs))}))
else:
    from burla import remote_parallel_map
    with warm_local_cluster():
        print(json.dumps({which: med(lambda: remote_parallel_map(noop, inputs, spinner=False))}))
