"""Environment replication: a node whose Python lacks a package the client has installs it
(offline, from a local wheel directory) before the job runs, and only once."""

from __future__ import annotations

import contextlib
import json
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


# Writes a pure-Python wheel: what a build backend does, in a few lines (no build tools needed).
WHEEL_WRITER = """
def write_wheel(directory, module, name, version, source):
    import base64, hashlib, os, zipfile
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\\nGenerator: tests\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\\n".join(record + [f"{info}/RECORD,,"]) + "\\n"
    filename = f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, filename), "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    return filename
"""
_namespace: dict = {}
exec(WHEEL_WRITER, _namespace)
write_wheel = _namespace["write_wheel"]


@pytest.fixture(scope="session")
def wheel_dir(tmp_path_factory) -> Path:
    """A wheel of a package that exists nowhere but here."""
    wheels = tmp_path_factory.mktemp("wheels")
    write_wheel(str(wheels), "burla_demo_pkg", "burla-demo-pkg", "1.2.3",
                "__version__ = '1.2.3'\n\ndef answer():\n    return 42\n")
    return wheels


def _venv(path: Path) -> Path:
    """A new virtual environment that also sees this test run's packages (burla and pip among them:
    its own pip would cost a few CPU-seconds of ensurepip per environment and change nothing)."""
    import site
    import sysconfig

    _run(sys.executable, "-m", "venv", "--without-pip", str(path))
    python = path / "bin" / "python"
    purelib = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    inherited = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], str(REPO)]
    (Path(purelib) / "inherited.pth").write_text("\n".join(dict.fromkeys(inherited)) + "\n")
    return python


@contextlib.contextmanager
def _cluster(tmp_path: Path, wheel_dir: Path, node_finds: Path, client_gets: str = "burla-demo-pkg",
             node_index: str | None = None, node_options: tuple[str, ...] = (), node_env: dict[str, str] | None = None
             ) -> Iterator[tuple[Path, dict[str, str]]]:
    """A client environment with the demo package (installed as `client_gets` says), and a head with
    one node whose separate environment lacks it and may install only from `node_finds`, or from
    the index at `node_index`. Yields the client's Python and environment."""
    client_python = _venv(tmp_path / "client-env")
    _run(str(client_python), "-m", "pip", "install", "--no-index", "--find-links", str(wheel_dir), client_gets)
    node_python = _venv(tmp_path / "node-env")
    head = start_head(tmp_path / "config", local_nodes=0)
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(node_finds), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               "UV_NO_INDEX": "1", "UV_FIND_LINKS": str(node_finds)}  # pip or uv, whichever the node uses
    if node_index is not None:
        offline = {"PIP_INDEX_URL": node_index, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "UV_INDEX_URL": node_index,
                   "PIP_FIND_LINKS": "", "UV_FIND_LINKS": ""}
    node = subprocess.Popen(
        [str(node_python), "-m", "burla", "node", "join", "--head", head.url, "--workers", "1", *node_options],
        env=dict(os.environ, BURLA_CLUSTER_TOKEN=head.token, **offline, **(node_env or {})), cwd=REPO,
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


@contextlib.contextmanager
def _recording_server(directory: Path) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 serving `directory` (404 for anything else); yields its URL and
    the paths asked of it."""
    import functools
    import http.server
    import threading

    asked: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            super().do_GET()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def test_a_package_from_a_direct_url_reaches_the_node_from_that_url_never_by_name_from_an_index(tmp_path, wheel_dir):
    # Fails on the previous code: the node asked its index for burla-demo-pkg==1.2.3 by name, and
    # whoever published that name there would have run code on every node.
    empty = tmp_path / "empty-index"
    empty.mkdir()
    with _recording_server(wheel_dir) as (files, fetched), _recording_server(empty) as (index, asked_index):
        wheel_url = f"{files}/burla_demo_pkg-1.2.3-py3-none-any.whl"
        with _cluster(tmp_path, wheel_dir, empty, client_gets=f"burla-demo-pkg @ {wheel_url}",
                      node_index=f"{index}/simple") as (client_python, env):
            done = _run(str(client_python), "client.py", cwd=tmp_path, env=env)
    assert done.stdout.strip().splitlines()[-1] == "[('1.2.3', 42)]"
    assert f"installing 1 package(s) on this node: burla-demo-pkg @ {wheel_url}#sha256=" in done.stderr
    assert fetched.count("/burla_demo_pkg-1.2.3-py3-none-any.whl") >= 2  # the client's install, then the node's
    assert not [path for path in asked_index if "demo" in path], asked_index


SOME_CALLS_IMPORT_IT = textwrap.dedent("""
    import sys
    from burla import remote_parallel_map

    def uses_the_package(x):
        if x:
            import burla_demo_pkg
        return x

    results = remote_parallel_map(uses_the_package, [0, 1], raise_errors=False, spinner=False)
    print(results[0])
    print("".join(getattr(results[1], "__notes__", [])), type(results[1]).__name__)
""")


def test_a_package_the_node_cannot_get_fails_only_the_calls_that_import_it_naming_it(tmp_path, wheel_dir):
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    with _cluster(tmp_path, wheel_dir, node_finds=empty) as (client_python, env):
        (tmp_path / "some.py").write_text(SOME_CALLS_IMPORT_IT)
        done = _run(str(client_python), "some.py", cwd=tmp_path, env=env)
        first, failed = done.stdout.strip().splitlines()[-2:]
        assert first == "0"  # the call that doesn't import it runs
        assert failed.endswith("ModuleNotFoundError")
        assert ("[burla] burla_demo_pkg comes from the package burla-demo-pkg here; the node was asked to install "
                "it and could not") in failed
        assert "this node could not install burla-demo-pkg==1.2.3" in done.stderr  # said once, why included
        again = _run(str(client_python), "some.py", cwd=tmp_path, env=env)
        assert "installing" not in again.stderr  # not tried again for every job


EDITABLE_CLIENT = textwrap.dedent("""
    from burla import remote_parallel_map
    import burla_editable_demo

    def uses_it(x):
        return burla_editable_demo.triple(x)

    print(remote_parallel_map(uses_it, [1, 2], spinner=False))
    print(remote_parallel_map(uses_it, [3], spinner=False))
""")


def _install_editable(python: Path, project: Path, name: str, version: str) -> None:
    """What `pip install -e` leaves in an environment (written directly: no build backend needed):
    a .pth putting the project on sys.path, and a dist-info whose direct_url.json (PEP 610) says
    editable."""
    purelib = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                   .stdout.strip())
    (purelib / f"__editable__.{name}-{version}.pth").write_text(f"{project}\n")
    dist_info = purelib / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist_info / "INSTALLER").write_text("pip\n")
    (dist_info / "direct_url.json").write_text(json.dumps({"url": f"file://{project}", "dir_info": {"editable": True}}))


def test_an_editable_project_travels_as_local_code_with_one_warning(tmp_path, wheel_dir):
    project = tmp_path / "editable-project"
    (project / "burla_editable_demo").mkdir(parents=True)
    (project / "burla_editable_demo" / "__init__.py").write_text("def triple(x):\n    return 3 * x\n")
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    with _cluster(tmp_path, wheel_dir, node_finds=empty) as (client_python, env):
        _install_editable(client_python, project, "burla-editable-demo", "0.1")
        (tmp_path / "editable.py").write_text(EDITABLE_CLIENT)
        done = _run(str(client_python), "editable.py", cwd=tmp_path, env=env)
        assert done.stdout.strip().splitlines()[-2:] == ["[3, 6]", "[9]"]
        warnings = [line for line in done.stderr.splitlines() if "won't install" in line]
        assert len(warnings) == 1 and "burla-editable-demo (editable from" in warnings[0]
        assert "burla-editable-demo==" not in done.stderr  # the node never tried to install it


def test_the_environment_is_read_again_after_an_installation(tmp_path, monkeypatch):
    from burla.protocol.replication.environment import environment_changed, installed_distributions

    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    environment_changed()
    try:
        (tmp_path / "first_pkg-1.0.dist-info").mkdir()
        assert installed_distributions() == (("first-pkg", "1.0"),)
        (tmp_path / "second_pkg-2.0.dist-info").mkdir()  # what an installer just wrote
        assert installed_distributions() == (("first-pkg", "1.0"),)  # read once, not per job
        environment_changed()
        assert installed_distributions() == (("first-pkg", "1.0"), ("second-pkg", "2.0"))
    finally:
        monkeypatch.undo()
        environment_changed()


def test_only_index_installs_travel_by_name(tmp_path, monkeypatch):
    from burla.protocol.replication.environment import direct_references, environment_changed, not_installable_by_name
    from burla.protocol.validation import packages_problem

    digest = "ab" * 32
    records = {
        "from_index-1.0": None,
        "pinned_url-2.0": {"url": "https://files.example/pinned_url-2.0-py3-none-any.whl",
                           "archive_info": {"hashes": {"sha256": digest}}},
        "old_pip_url-2.1": {"url": "https://files.example/old.whl#egg=x", "archive_info": {"hash": f"sha256={digest}"}},
        "unpinned_url-3.0": {"url": "https://files.example/unpinned.whl", "archive_info": {}},
        "from_git-4.0": {"url": "https://git.example/repo", "vcs_info": {"vcs": "git", "commit_id": "abc"}},
        "from_path-5.0": {"url": "file:///src/thing", "dir_info": {}},
    }
    for name, record in records.items():
        (tmp_path / f"{name}.dist-info").mkdir()
        if record is not None:
            (tmp_path / f"{name}.dist-info" / "direct_url.json").write_text(json.dumps(record))
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    environment_changed()
    try:
        references = direct_references()
        skipped = not_installable_by_name()
    finally:
        monkeypatch.undo()
        environment_changed()
    assert references == {
        "pinned-url": f"2.0 @ https://files.example/pinned_url-2.0-py3-none-any.whl#sha256={digest}",
        "old-pip-url": f"2.1 @ https://files.example/old.whl#sha256={digest}",
    }
    assert set(skipped) == {"unpinned-url", "from-git", "from-path"}
    assert "no sha256" in skipped["unpinned-url"]
    assert packages_problem(references) is None
    # What a node is asked for can't smuggle an installer option or a second requirement in.
    for bad in ("2.0 @ --index-url=https://evil.example", f"2.0 @ https://x.example/a b#sha256={digest}",
                "2.0 @ https://x.example/a.whl", f"2.0 @ file:///etc/x#sha256={digest}"):
        assert packages_problem({"pinned-url": bad}) is not None, bad


SOURCE_ONLY_CLIENT = textwrap.dedent("""
    from burla import remote_parallel_map

    def uses_it(x):
        import burla_src_pkg
        return burla_src_pkg.VALUE + x

    print(remote_parallel_map(uses_it, [1], raise_errors=False, spinner=False))
""")

# An in-tree build backend with no build requirements (so pip builds it offline), which leaves a
# mark where BURLA_TEST_BUILD_MARKER says: building a source distribution runs its code.
BACKEND = WHEEL_WRITER + """
import os

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    marker = os.environ.get("BURLA_TEST_BUILD_MARKER")
    if marker:
        open(marker, "w").write("built here")
    return write_wheel(wheel_directory, "burla_src_pkg", "burla-src-pkg", "0.1", "VALUE = 10\\n")
"""


def _write_sdist(directory: Path) -> None:
    import io
    import tarfile

    files = {"PKG-INFO": "Metadata-Version: 2.1\nName: burla-src-pkg\nVersion: 0.1\n",
             "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
             "backend.py": BACKEND}
    with tarfile.open(directory / "burla_src_pkg-0.1.tar.gz", "w:gz") as sdist:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"burla_src_pkg-0.1/{name}")
            info.size = len(data)
            sdist.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("allowed", [False, True])
def test_nodes_install_wheels_only_unless_allowed_to_build_from_source(tmp_path, allowed):
    # Fails on the previous code: a node built the source distribution (running its code) by default.
    client_wheels, node_finds = tmp_path / "client-wheels", tmp_path / "node-finds"
    client_wheels.mkdir()
    node_finds.mkdir()
    write_wheel(str(client_wheels), "burla_src_pkg", "burla-src-pkg", "0.1", "VALUE = 10\n")
    _write_sdist(node_finds)  # all the node's index has of it
    marker = tmp_path / "built-on-the-node"
    with _cluster(tmp_path, client_wheels, node_finds, client_gets="burla-src-pkg",
                  node_options=("--allow-source-builds",) if allowed else (),
                  node_env={"BURLA_TEST_BUILD_MARKER": str(marker)}) as (client_python, env):
        (tmp_path / "source_only.py").write_text(SOURCE_ONLY_CLIENT)
        done = _run(str(client_python), "source_only.py", cwd=tmp_path, env=env)
    last = done.stdout.strip().splitlines()[-1]
    if allowed:
        assert last == "[11]" and marker.exists()
    else:
        assert not marker.exists(), "the node ran the source distribution's build"
        assert "ModuleNotFoundError" in last
        assert "this node could not install burla-src-pkg==0.1" in done.stderr


def test_extra_package_indexes_are_named_once_without_their_credentials(tmp_path, monkeypatch):
    from burla.protocol.replication.package_indexes import extra_index_hosts, extra_index_urls, extra_index_warning

    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://mirror.example/simple\n"
                      "[install]\nextra-index-url = https://pypi.org/simple https://other.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://builder:s3cret@private.example/simple")
    monkeypatch.setenv("UV_INDEX", "internal=https://uv-index.example/simple")
    extra_index_urls.cache_clear()
    try:
        hosts = extra_index_hosts()
    finally:
        monkeypatch.undo()
        extra_index_urls.cache_clear()
    assert hosts == ("mirror.example", "other.example", "private.example", "uv-index.example")
    warning = extra_index_warning(hosts)
    assert warning is not None and "private.example" in warning and "s3cret" not in warning
    assert extra_index_warning(()) is None


async def test_a_source_distribution_by_url_is_not_built_without_leave():
    # Fails without the check: pip builds an sdist given by URL despite --only-binary :all:.
    from burla.node.packages import Environment

    said: list[str] = []
    url = "https://files.example/burla_src_pkg-0.1.tar.gz#sha256=" + "0" * 64
    failed = await Environment(source_builds=False).install({"burla-src-pkg": f"0.1 @ {url}"}, said.append)
    assert list(failed) == [f"burla-src-pkg @ {url}"]
    assert "installs wheels only" in failed[f"burla-src-pkg @ {url}"] and "--allow-source-builds" in "".join(said)


def _private_index(root: Path, wheel: Path) -> Path:
    """A PEP 503 index (served from `root`) offering `wheel`, linked with its sha256."""
    import hashlib

    page = root / "simple" / "burla-demo-pkg"
    page.mkdir(parents=True)
    (root / "files").mkdir()
    (root / "files" / wheel.name).write_bytes(wheel.read_bytes())
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (page / "index.html").write_text(f'<a href="/files/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    return root


@pytest.mark.parametrize("the_nodes_index_serves", ["the same wheel", "an impostor of the same name"])
def test_a_package_an_extra_index_offers_installs_on_a_node_only_as_that_indexs_file(tmp_path, wheel_dir,
                                                                                      the_nodes_index_serves):
    # Fails on the previous code: the node installed burla-demo-pkg==1.2.3 by name from its own index,
    # whatever was published there under that name.
    wheel = wheel_dir / "burla_demo_pkg-1.2.3-py3-none-any.whl"
    private = _private_index(tmp_path / "private", wheel)
    nodes_files = tmp_path / "nodes-index"
    nodes_files.mkdir()
    if the_nodes_index_serves == "the same wheel":
        (nodes_files / wheel.name).write_bytes(wheel.read_bytes())
    else:
        write_wheel(str(nodes_files), "burla_demo_pkg", "burla-demo-pkg", "1.2.3",
                    "__version__ = '1.2.3'\n\ndef answer():\n    return 'impostor'\n")
    with _recording_server(private) as (index, asked), \
            _cluster(tmp_path, wheel_dir, node_finds=nodes_files) as (client_python, env):
        env = {**env, "PIP_EXTRA_INDEX_URL": f"{index}/simple", "BURLA_CONFIG_DIR": str(tmp_path / "client-config")}
        (tmp_path / "some.py").write_text(SOME_CALLS_IMPORT_IT)
        done = _run(str(client_python), "some.py", cwd=tmp_path, env=env)
    assert "/simple/burla-demo-pkg/" in asked  # the client asked its extra index
    assert "burla-demo-pkg==1.2.3 (pinned to the digests of the client's extra index)" in done.stderr
    first, second = done.stdout.strip().splitlines()[-2:]
    assert first == "0"
    if the_nodes_index_serves == "the same wheel":
        assert second.endswith(" int"), done.stdout  # it imported: the call returned its input
    else:
        assert second.endswith("ModuleNotFoundError"), done.stdout  # the impostor was refused, never imported
        assert "this node could not install burla-demo-pkg==1.2.3" in done.stderr


def test_index_pins_read_pep_691_json_send_credentials_as_basic_auth_and_are_cached(tmp_path):
    import base64
    import http.server
    import threading

    from burla.protocol.replication.index_pins import CACHE_FILE, file_version, pin_to_indexes

    seen: list[tuple[str, str]] = []
    digest = "ab" * 32

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization", "")))
            if self.path != "/simple/private-pkg/":
                self.send_error(404)
                return
            body = json.dumps({"files": [
                {"filename": "private_pkg-2.0-py3-none-any.whl", "hashes": {"sha256": digest}},
                {"filename": "private_pkg-1.0-py3-none-any.whl", "hashes": {"sha256": "cd" * 32}},
                {"filename": "private-pkg-2.0.tar.gz", "hashes": {"sha256": "not a digest"}},
            ]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://builder:s3cret@127.0.0.1:{server.server_address[1]}/simple"
        packages = {"private-pkg": "2.0", "public-pkg": "1.0", "by-url": "1.0 @ https://x/y.whl#sha256=" + "0" * 64}
        pinned = pin_to_indexes(packages, (url,), tmp_path)
        assert pinned == {**packages, "private-pkg": f"2.0#sha256={digest}"}
        assert {path for path, _ in seen} == {"/simple/private-pkg/", "/simple/public-pkg/"}
        assert all(auth == "Basic " + base64.b64encode(b"builder:s3cret").decode() for _, auth in seen)
        assert "s3cret" not in (tmp_path / CACHE_FILE).read_text()
        seen.clear()
        assert pin_to_indexes(packages, (url,), tmp_path) == pinned and not seen  # a day's answers are kept
    finally:
        server.shutdown()
        server.server_close()
    assert file_version("private_pkg-2.0-py3-none-any.whl", "private-pkg") == "2.0"
    assert file_version("other_pkg-2.0-py3-none-any.whl", "private-pkg") is None
    assert file_version("private-pkg-2.0.tar.gz", "private-pkg") == "2.0"


def test_a_hash_pinned_package_is_a_requirements_file_line_for_the_node():
    from burla.node.packages import requirement, shown, wanted_version
    from burla.protocol.validation import packages_problem

    entry = f"2.0#sha256={'ab' * 32},{'cd' * 32}"
    assert packages_problem({"private-pkg": entry}) is None
    assert packages_problem({"private-pkg": "2.0#sha256=ab --index-url http://x"}) is not None
    line = requirement("private-pkg", entry)
    assert line == f"private-pkg==2.0 --hash=sha256:{'ab' * 32} --hash=sha256:{'cd' * 32}"
    assert wanted_version(entry) == "2.0" and shown(line).startswith("private-pkg==2.0 (pinned")
