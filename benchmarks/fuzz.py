"""The fuzzer of tests/security/fuzz/ at length: 20,000 malformed or random requests (by default) over
every route of a head with one local node, as the tests start it. Prints one JSON line: how long
they took, the findings (5xx, dropped connections, WebSockets closed as internal errors), the
answers by status class and the head's RSS before and after."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

from _common import private_config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import psutil

    from tests.conftest import start_head, wait_for_nodes
    from tests.security.fuzz import run

    with private_config(), tempfile.TemporaryDirectory(prefix="burla-bench-fuzz-") as directory:
        head = start_head(Path(directory) / "config", local_nodes=1, workers=2)
        try:
            [node] = wait_for_nodes(head, 1)
            process = psutil.Process(head.process.pid)
            rss_before = process.memory_info().rss
            summary = run(head, node["url"], random.Random(args.seed), args.requests)
            rss_after = process.memory_info().rss
        finally:
            head.stop()
    for finding in summary.findings:
        print(finding, file=sys.stderr)
    print(json.dumps({
        "benchmark": "fuzz",
        "requests": summary.requests,
        "seed": args.seed,
        "seconds": round(summary.seconds, 1),
        "findings": len(summary.findings),
        "distinct_findings": len(summary.distinct_findings()),
        "statuses": summary.by_class(),
        "head_rss_mb_before": round(rss_before / 2**20, 1),
        "head_rss_mb_after": round(rss_after / 2**20, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
