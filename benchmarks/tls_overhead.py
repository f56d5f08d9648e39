"""What https costs: 10,000 no-op calls against a head serving https (pinned self-signed
certificate) beside the same head serving plain http, interleaved in one run."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import cores, environment, noop, private_config

CALLS = 10_000
ROUNDS = 3


def _timed(url: str, token: str, cert: str | None) -> float:
    from burla import remote_parallel_map

    with environment(BURLA_CLUSTER_DASHBOARD_URL=url, BURLA_CLUSTER_TOKEN=token, BURLA_HEAD_CERT=cert):
        remote_parallel_map(noop, list(range(100)), spinner=False)  # connections and workers warm
        start = time.perf_counter()
        remote_parallel_map(noop, list(range(CALLS)), spinner=False)
        return time.perf_counter() - start


def main() -> None:
    from tests.conftest import start_head, wait_for_nodes

    with private_config(), tempfile.TemporaryDirectory(prefix="burla-bench-tls-") as directory:
        plain = start_head(Path(directory) / "plain", local_nodes=1, workers=None)
        secure = start_head(Path(directory) / "tls", local_nodes=1, workers=None, extra=["--tls-self-signed"])
        try:
            wait_for_nodes(plain, 1)
            cert = str(secure.config_dir / "head-cert.pem")
            times: dict[str, list[float]] = {"http": [], "https": []}
            for _ in range(ROUNDS):
                times["http"].append(_timed(plain.url, plain.token, None))
                times["https"].append(_timed(secure.url, secure.token, cert))
        finally:
            plain.stop()
            secure.stop()
    http, https = (statistics.median(times[k]) for k in ("http", "https"))
    print(json.dumps({
        "benchmark": "tls_overhead",
        "calls": CALLS,
        "cores": cores(),
        "http_us_per_call": round(http / CALLS * 1e6, 1),
        "https_us_per_call": round(https / CALLS * 1e6, 1),
        "https_over_http": round(https / http, 3),
    }))


if __name__ == "__main__":
    sys.exit(main())
