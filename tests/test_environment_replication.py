"""Environment replication: a node whose Python lacks a package the client has installs it
(offline, from a local wheel directory) before the job runs, and only once."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, start_head, wait_for_nodes

CLIENT = textwrap.dedent("""
    from burla import remote_parallel_map

    def uses_the_package(x):
        import burla_demo_pkg
        return burla_demo_pkg.__version__, burla_demo_pkg.answer() + x

    print(remote_parallel_map(uses_the_package, [0], spinner=False))
""")


def _run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory) -> Path:
    """A wheel of a package that exists nowhere but here (written directly: no build tools needed)."""
    import base64
    import hashlib
    import zipfile

    wheels = tmp_path_factory.mktemp("wheels")
    files = {
        "burla_demo_pkg/__init__.py": "__version__ = '1.2.3'\n\ndef answer():\n    return 42\n",
        "burla_demo_pkg-1.2.3.dist-info/METADATA": "Metadata-Version: 2.1\nName: burla-demo-pkg\nVersion: 1.2.3\n",
        "burla_demo_pkg-1.2.3.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append("burla_demo_pkg-1.2.3.dist-info/RECORD,,")
    files["burla_demo_pkg-1.2.3.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(wheels / "burla_demo_pkg-1.2.3-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return wheels


def _venv(path: Path) -> Path:
    """A new virtual environment that also sees this test run's packages (burla among them)."""
    import site
    import sysconfig

    _run(sys.executable, "-m", "venv", str(path))
    python = path / "bin" / "python"
    purelib = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    inherited = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], str(REPO)]
    (Path(purelib) / "inherited.pth").write_text("\n".join(dict.fromkeys(inherited)) + "\n")
    return python


@contextlib.contextmanager
def _cluster(tmp_path: Path, wheel_dir: Path, node_finds: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A client environment with the demo package, and a head with one node whose separate environment
    lacks it and may install only from `node_finds`. Yields the client's Python and environment."""
    client_python = _venv(tmp_path / "client-env")
    _run(str(client_python), "-m", "pip", "install", "--no-index", "--find-links", str(wheel_dir), "burla-demo-pkg")
    node_python = _venv(tmp_path / "node-env")
    head = start_head(tmp_path / "config", local_nodes=0)
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(node_finds), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               "UV_NO_INDEX": "1", "UV_FIND_LINKS": str(node_finds)}  # pip or uv, whichever the node uses
    node = subprocess.Popen(
        [str(node_python), "-m", "burla", "node", "join", "--head", head.url, "--workers", "1"],
        env=dict(os.environ, BURLA_CLUSTER_TOKEN=head.token, **offline), cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_nodes(head, 1)
        (tmp_path / "client.py").write_text(CLIENT)
        yield client_python, dict(os.environ, BURLA_CLUSTER_DASHBOARD_URL=head.url, BURLA_CLUSTER_TOKEN=head.token)
    finally:
        node.terminate()
        node.wait(15)
        head.stop()


def test_a_node_installs_what_the_client_has_and_it_lacks(wheel_dir, tmp_path):
    with _cluster(tmp_path, wheel_dir, node_finds=wheel_dir) as (client_python, env):
        first = _run(str(client_python), "client.py", cwd=tmp_path, env=env)
        assert first.stdout.strip().splitlines()[-1] == "[('1.2.3', 42)]"
        assert "installing 1 package(s) on this node: burla-demo-pkg==1.2.3" in first.stderr  # streamed back
        second = _run(str(client_python), "client.py", cwd=tmp_path, env=env)
        assert second.stdout.strip().splitlines()[-1] == "[('1.2.3', 42)]"
        assert "installing" not in second.stderr  # the same packages install nothing the second time


def test_a_package_the_node_cannot_get_fails_the_job_clearly(tmp_path, wheel_dir):
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    with _cluster(tmp_path, wheel_dir, node_finds=empty) as (client_python, env):
        done = subprocess.run([str(client_python), "client.py"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode != 0
        assert "InstallFailed" in done.stderr and "burla-demo-pkg==1.2.3" in done.stderr
