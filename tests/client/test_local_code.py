"""The user's local modules travel with the job: workers that can't import them still run them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from burla.protocol.replication.local_code import collect, install

CLIENT = textwrap.dedent("""
    import sys
    sys.path.insert(0, ".")
    import helpers_here
    from mypkg.ops import square
    from burla import remote_parallel_map
    print(remote_parallel_map(helpers_here.triple, [1, 2], spinner=False))
    print(remote_parallel_map(square, [3], spinner=False))
""")


def _project(tmp_path, version: int):
    (tmp_path / "helpers_here.py").write_text(f"def triple(x):\n    return {version} * x\n")
    (tmp_path / "mypkg").mkdir(exist_ok=True)
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "ops.py").write_text(
        "from mypkg.util import twice\n\ndef square(x):\n    return twice(x) // 2 * x\n")
    (tmp_path / "mypkg" / "util.py").write_text("def twice(x):\n    return 2 * x\n")
    (tmp_path / "client.py").write_text(CLIENT)


def test_local_modules_and_packages_are_shipped_and_imported(cluster, tmp_path):
    _project(tmp_path, 3)
    # The client runs in the project directory; the cluster's workers run elsewhere.
    done = subprocess.run([sys.executable, "client.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **cluster.env()))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["[3, 6]", "[9]"]
    # A changed module is shipped again, and workers drop the old version after each job.
    _project(tmp_path, 5)
    done = subprocess.run([sys.executable, "client.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **cluster.env()))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2] == "[5, 10]"


def test_installed_and_standard_modules_are_not_shipped():
    import json

    import aiohttp.web

    assert collect(json.dumps) == b""  # the standard library
    assert collect(aiohttp.web.json_response) == b""  # an installed package


def test_install_refuses_paths_outside_its_directory(tmp_path):
    import io
    import zipfile

    import pytest

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("../escape.py", "x = 1\n")
    with pytest.raises(ValueError, match="outside"):
        install(buffer.getvalue(), str(tmp_path / "job"))


def test_a_local_package_whose_name_starts_with_burla_is_shipped(tmp_path, monkeypatch):
    import importlib
    import io
    import zipfile

    (tmp_path / "burla_lookalike").mkdir()
    (tmp_path / "burla_lookalike" / "__init__.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lookalike = importlib.import_module("burla_lookalike")
    try:
        namespace = {"burla_lookalike": lookalike}
        exec("def uses_it(x):\n    return burla_lookalike.triple(x)\n", namespace)
        shipped = zipfile.ZipFile(io.BytesIO(collect(namespace["uses_it"]))).namelist()
        assert shipped == ["burla_lookalike/__init__.py"]  # only burla's own modules stay behind
    finally:
        sys.modules.pop("burla_lookalike", None)


def test_shipped_modules_leave_nothing_behind_once_the_cluster_stops(tmp_path):
    from burla.config import ENV_CONFIG_DIR, ENV_TOKEN
    from tests.conftest import launch_head, wait_for_nodes

    scratch = tmp_path / "scratch"  # the cluster's temporary directory: where workers unpack modules
    scratch.mkdir()
    config_dir = tmp_path / "config"
    head = launch_head(["head", "serve", "--port", "0", "--local-nodes", "1", "--local-node-workers", "2"],
                       {ENV_CONFIG_DIR: str(config_dir), ENV_TOKEN: "test-token", "TMPDIR": str(scratch)}, config_dir)
    try:
        wait_for_nodes(head, 1)
        # A job with no modules to ship leaves nothing in the node's directory for them but its lock.
        done = subprocess.run([sys.executable, "-c", "from burla import remote_parallel_map\n"
                               "print(remote_parallel_map(abs, [-1, 2], spinner=False))"],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, **head.env()))
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "[1, 2]"
        [own] = [path for path in scratch.iterdir() if path.name.startswith("burla-")]
        assert own.name.startswith("burla-node-code-") and [path.name for path in own.iterdir()] == [".lock"]
        project = tmp_path / "project"
        project.mkdir()
        _project(project, 3)
        done = subprocess.run([sys.executable, "client.py"], cwd=project, capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, **head.env()))
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-2:] == ["[3, 6]", "[9]"]
        # Where a call found them (a worker may be gone by now, its copy with it): under the node's
        # temporary directory, or this test checks nothing.
        (project / "where.py").write_text(
            "import helpers_here\nfrom burla import remote_parallel_map\n\n"
            "def where(x):\n    return helpers_here.__file__\n\n"
            "print(remote_parallel_map(where, [0], spinner=False)[0])\n")
        done = subprocess.run([sys.executable, "where.py"], cwd=project, capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, **head.env()))
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1].startswith(str(scratch)), done.stdout
    finally:
        head.stop()
    assert not [path.name for path in scratch.iterdir() if path.name.startswith("burla-")]
