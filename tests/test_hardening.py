"""The head and nodes hold up against hostile jobs, clients and token holders."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from burla import RemoteError, remote_parallel_map
from tests import functions
from tests.conftest import own_head
from tests.helpers import get_json

HEAD_PACKAGE = Path(__file__).resolve().parent.parent / "burla" / "head"
PICKLE_MODULES = {"pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib", "burla.serialization"}
LOADERS = {"loads", "load", "Unpickler"}


def test_no_module_of_the_head_can_unpickle():
    offences = []
    for path in sorted(HEAD_PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                offences += [f"{path.name}: import {a.name}" for a in node.names if a.name in PICKLE_MODULES]
            elif isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                names = {a.name for a in node.names}
                if module in PICKLE_MODULES or module.endswith(".serialization") or names & LOADERS \
                        or names & {"serialization", "pickle"}:
                    offences.append(f"{path.name}: from {module} import {', '.join(sorted(names))}")
    assert not offences, offences


def test_a_failure_payload_that_is_a_pickle_runs_nowhere(tmp_path, monkeypatch):
    # Fails on the code before typed error records: the head's history unpickled every failure.
    marker = tmp_path / "loaded-by"
    with own_head(tmp_path, monkeypatch) as head:
        with pytest.raises(RemoteError, match="could not be read"):
            remote_parallel_map(functions.fail_with_a_planted_pickle, [str(marker)], spinner=False)
        [job] = get_json(head, "/v1/jobs")["jobs"]
        errors = get_json(head, f"/v1/jobs/{job['job_id']}/failures")["failures"]
        assert errors and errors[0]["exception_type"] == "unknown"
    assert not marker.exists(), f"code ran in pid {marker.read_text()}"
