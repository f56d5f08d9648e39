"""The benchmark scripts still import (they share helpers with the package and the tests, which
change under them), and the one that needs no cluster runs and prints its JSON line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(path.stem for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_benchmark_imports(name):
    done = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=BENCHMARKS, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_worker_loop_benchmark_prints_its_json_line():
    done = subprocess.run([sys.executable, "worker_loop.py"], cwd=BENCHMARKS, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stderr.strip().splitlines()[-1])  # stdout is captured by the worker loop itself
    assert result["benchmark"] == "worker_loop" and result["us_per_call"] > 0
