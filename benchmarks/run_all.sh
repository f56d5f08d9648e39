#!/usr/bin/env bash
# Runs every benchmark; each prints one JSON line.
set -euo pipefail
cd "$(dirname "$0")"
for script in cold_start.py noop_calls.py cpu_per_call.py sleep_calls.py warm_latency.py skewed.py tls_overhead.py vm_setup.py head_memory.py many_inputs.py transfer.py transfer_tunnel.py; do
  python "$script"
done
python head_scale.py --nodes 100 --json
python peers.py  # peers not installed are skipped (pip install -e '.[bench]')
