"""Real clusters for the tests: heads, nodes and workers as processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import cloudpickle
import pytest

from burla.client.api import Client
from burla.config import (
    ENV_BACKGROUND_HEAD,
    ENV_CLOUD,
    ENV_CONFIG_DIR,
    ENV_HEAD_CERT,
    ENV_HEAD_URL,
    ENV_PARENT_JOB,
    ENV_TOKEN,
    ClientSettings,
)
from tests.support import functions
from tests.support.parallel import (
    EXCLUSIVE_MARK,
    MachineShare,
    built_once,
    longest_first,
    merge_ledgers,
    plain_nodeid,
    recorded_durations,
    shared_root,
    write_durations,
)

# Workers load test helpers by value, like functions from a user's __main__.
cloudpickle.register_pickle_by_value(functions)

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0

# A script here keeps its head to itself (a background head per test would outlive the test);
# the tests of the background default give their script BURLA_BACKGROUND_HEAD=1.
os.environ.setdefault(ENV_BACKGROUND_HEAD, "0")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fuzz-requests", type=int, default=2000,
                     help="how many requests tests/security/test_fuzz.py sends to a head and its node")
    parser.addoption("--record-durations", action="store_true",
                     help="write how long each test took to tests/durations.json (the order the next runs use)")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups it marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first, grouped as xdist should hand them out (tests.support.parallel)."""
    longest_first(items, recorded_durations())


DURATIONS: dict[str, float] = {}  # a test's setup, call and teardown, with --record-durations


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid = plain_nodeid(report.nodeid)
    DURATIONS[nodeid] = DURATIONS.get(nodeid, 0.0) + report.duration


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test holds its share of the machine from its setup to its teardown, or the whole of it
    when marked `exclusive` (tests.support.parallel). Outside pytest-timeout's clock: waiting for
    the machine is no test's time."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    global MACHINE_SHARE
    if MACHINE_SHARE is None:
        MACHINE_SHARE = MachineShare(shared_root(item.config._tmp_path_factory))  # type: ignore[attr-defined]
    exclusive = item.get_closest_marker(EXCLUSIVE_MARK) is not None
    next_exclusive = nextitem is not None and nextitem.get_closest_marker(EXCLUSIVE_MARK) is not None
    with MACHINE_SHARE.held(exclusive, next_exclusive):
        yield


MACHINE_SHARE: MachineShare | None = None  # this worker's hold on the machine


@pytest.fixture(scope="session", autouse=True)
def _isolated_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Isolate the tests from this machine's burla configuration: BURLA_CONFIG_DIR names an empty
    directory of the session's own (never the user's config directory, its token, deployment or
    running head), and no head URL, token, certificate, cloud or parent job comes from the shell.

    No test reaches a head through this: tests name their head outright (`Head.client()`,
    `Head.env()` for subprocesses). Under tests.cluster_runner (`tox -e cluster`, which sets
    BURLA_TEST_CLUSTER=1) the head URL, token and config directory it set are left as they are:
    tests/end_to_end/test_multinode.py reads them to find that cluster.
    """
    with pytest.MonkeyPatch.context() as patch:
        if os.environ.get("BURLA_TEST_CLUSTER") != "1":
            patch.setenv(ENV_CONFIG_DIR, str(tmp_path_factory.mktemp("isolated-config")))
            patch.delenv(ENV_HEAD_URL, raising=False)
            patch.delenv(ENV_TOKEN, raising=False)
        for name in (ENV_HEAD_CERT, ENV_CLOUD, ENV_PARENT_JOB):
            patch.delenv(name, raising=False)
        yield


@pytest.fixture(autouse=True)
def _no_ssh_beyond_loopback(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Heads started by tests dial VMs only through an address map (stand-in VMs on 127.0.0.1);
    one with no entries unless a test gives its own, so no test ever dials a cloud address."""
    if "BURLA_SSH_ADDRESS_MAP" not in os.environ:
        empty = tmp_path_factory.getbasetemp() / "empty-ssh-address-map.json"
        if not empty.exists():
            empty.write_text("{}")
        monkeypatch.setenv("BURLA_SSH_ADDRESS_MAP", str(empty))


@dataclass
class Head:
    url: str
    token: str
    process: subprocess.Popen
    config_dir: Path
    log_path: Path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def settings(self, **changes: object) -> ClientSettings:
        """Client settings naming this head outright (its URL, token and config directory), with
        `changes` (e.g. `head_url=proxy.url`, `head_cert=...`); nothing comes from the environment."""
        settings = ClientSettings(config_dir=self.config_dir, head_url=self.url, token=self.token, parent_job_id=None)
        return replace(settings, **changes)  # type: ignore[arg-type]

    def client(self, **changes: object) -> Client:
        """A burla client for this head (see `settings`)."""
        return Client(settings=self.settings(**changes))

    def env(self) -> dict[str, str]:
        """The environment a client or CLI subprocess needs to use this head."""
        return {ENV_HEAD_URL: self.url, ENV_TOKEN: self.token, ENV_CONFIG_DIR: str(self.config_dir)}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_head(config_dir: Path, local_nodes: int = 1, workers: int | None = 2, token: str = "test-token",
               extra: list[str] | None = None) -> Head:
    """Start `burla head serve` on an ephemeral port and wait until it serves."""
    command = ["head", "serve", "--port", "0", "--local-nodes", str(local_nodes)]
    if workers is not None:
        command += ["--local-node-workers", str(workers)]
    return launch_head(command + (extra or []), {ENV_CONFIG_DIR: str(config_dir), ENV_TOKEN: token}, config_dir)


def launch_head(arguments: list[str], environment: dict[str, str], config_dir: Path) -> Head:
    """Run `burla <arguments>` (a head serve command) with this environment, wait until it serves."""
    config_dir.mkdir(parents=True, exist_ok=True)
    log_path = config_dir / f"head-{len(list(config_dir.glob('head-*.log')))}.log"
    read_fd, write_fd = os.pipe()
    env = {**os.environ, **environment}
    env.pop(ENV_HEAD_URL, None)
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "burla", *arguments, "--ready-fd", str(write_fd)], env=env,
                                   pass_fds=(write_fd,), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as ready:
        line = ready.readline().decode().strip()
    if not line:
        process.wait(10)
        raise RuntimeError(f"head failed to start:\n{log_path.read_text()}")
    return Head(line, env[ENV_TOKEN], process, config_dir, log_path)


def wait_for_nodes(head: Head, count: int, timeout: float = START_TIMEOUT_S) -> list[dict]:
    import json
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(f"{head.url}/v1/cluster", headers=head.headers())
        with urllib.request.urlopen(request, timeout=5) as response:
            nodes = json.load(response)["nodes"]
        ready = [n for n in nodes if n["workers_alive"] >= 1]
        if len(ready) >= count:
            return ready
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ready)} of {count} nodes ready after {timeout} s:\n{head.log()}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """One head with one local node of two workers, shared by the tests that only run jobs."""
    config_dir = tmp_path_factory.mktemp("cluster-config")
    head = start_head(config_dir)
    try:
        wait_for_nodes(head, 1)  # inside: a head whose node never came is stopped all the same
        yield head
    finally:
        head.stop()


@pytest.fixture
def client(cluster: Head) -> Client:
    """A burla client for the shared `cluster`."""
    return cluster.client()


@pytest.fixture
def fresh_config(tmp_path: Path) -> Path:
    """A config directory with no head in it (see `embedded_client`)."""
    return tmp_path / "config"


@pytest.fixture
def embedded_client(fresh_config: Path) -> Client:
    """A client with no head configured (config directory `fresh_config`): it must start its own,
    embedded (stopped with the client, as BURLA_BACKGROUND_HEAD=0 has it)."""
    return Client(settings=ClientSettings(config_dir=fresh_config, head_url=None, token=None, parent_job_id=None,
                                          background_head=False))


def run_client(script: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a client script in its own process (as a user would) and return what it printed."""
    return subprocess.run([sys.executable, "-c", script], env=dict(os.environ, **env), capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


# --- the fault-injection ledger ------------------------------------------------------------

FAULT_LEDGER: dict[str, dict] = {}
SCENARIO_WIDTH = 48


def record_fault_trial(scenario: str, inputs: int, delivered: list[int] | None, ended_with: str = "") -> None:
    """Count one trial: which input indices were delivered, or the clear error the job ended with."""
    row = FAULT_LEDGER.setdefault(
        scenario, {"trials": 0, "inputs": 0, "lost": 0, "duplicates": 0, "ended_with_error": 0, "errors": []}
    )
    row["trials"] += 1
    row["inputs"] += inputs
    if delivered is None:
        row["ended_with_error"] += 1
        if ended_with not in row["errors"]:
            row["errors"].append(ended_with)
        return
    row["lost"] += len(set(range(inputs)) - set(delivered))
    row["duplicates"] += len(delivered) - len(set(delivered))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if MACHINE_SHARE is not None:
        MACHINE_SHARE.release()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its trials go to the controller
        workeroutput["fault_ledger"] = json.dumps(FAULT_LEDGER)
    elif session.config.getoption("record_durations"):  # the controller hears every worker's reports
        write_durations(DURATIONS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    merge_ledgers(FAULT_LEDGER, json.loads(getattr(node, "workeroutput", {}).get("fault_ledger", "{}")))


def pytest_terminal_summary(terminalreporter) -> None:
    if not FAULT_LEDGER:
        return
    terminalreporter.section("fault injection")
    header = f"{'scenario':{SCENARIO_WIDTH}} {'trials':>6} {'inputs':>7} {'lost':>5} {'dupes':>5} {'clear errors':>12}"
    terminalreporter.write_line(header)
    for scenario, row in FAULT_LEDGER.items():
        terminalreporter.write_line(
            f"{scenario:{SCENARIO_WIDTH}} {row['trials']:6d} {row['inputs']:7d} {row['lost']:5d} "
            f"{row['duplicates']:5d} {row['ended_with_error']:12d}"
        )
    artifacts = REPO / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "fault-report.json").write_text(json.dumps(FAULT_LEDGER, indent=2))


@contextlib.contextmanager
def own_head(tmp_path: Path, local_nodes: int = 1, **start: object) -> Iterator[Head]:
    """A head (and its local nodes) for one test; the test's client is `head.client()`."""
    head = start_head(tmp_path / "config", local_nodes=local_nodes, **start)  # type: ignore[arg-type]
    try:
        if local_nodes:
            wait_for_nodes(head, local_nodes)
        yield head
    finally:
        head.stop()


@pytest.fixture
def ec2_rules(monkeypatch):
    """What EC2 refuses (architectures, vCPU quotas, capacity per zone), taught to the moto server
    of `moto`; tests change its limits as they need (`tests.support.clouds.fake_ec2`)."""
    from tests.support.clouds.fake_ec2 import Ec2Rules

    rules = Ec2Rules()
    rules.install(monkeypatch)
    return rules


@pytest.fixture
def moto(monkeypatch, ec2_rules):
    """A moto EC2 + IAM + Service Quotas server on 127.0.0.1 that refuses what EC2 refuses
    (`ec2_rules`), reached through AWS's endpoint variables; yields a boto3 EC2 client for it."""
    import boto3
    import moto.server as moto_server

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10).close()
    ec2_rules.publish_images()
    for key, value in {"AWS_ENDPOINT_URL_EC2": endpoint, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    # Heads bake an image after a first boot (a builder VM more): the tests of baking turn it on.
    monkeypatch.setenv("BURLA_BAKE_IMAGES", "0")
    try:
        yield boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
    finally:
        server.stop()


@pytest.fixture
def filled(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each read a large WebSocket frame's filler (burla.web.ws_bulk) took into the
    frame's own buffer, in this test."""
    from burla.web import ws_bulk

    reads: list[int] = []
    real = ws_bulk._FrameFiller.buffer_updated

    def counting(self: ws_bulk._FrameFiller, nbytes: int) -> None:
        reads.append(nbytes)
        real(self, nbytes)

    monkeypatch.setattr(ws_bulk._FrameFiller, "buffer_updated", counting)
    return reads


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """burla's dependencies as wheels, made once from this environment (stand-in VMs install from it)."""
    from tests.support.wheelhouse import build_wheelhouse

    return built_once(shared_root(tmp_path_factory), "wheelhouse", build_wheelhouse)


@pytest.fixture(scope="session")
def client_venv(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's virtual environment with only burla in it (installed from the running build and the
    wheelhouse, offline); returns its Python. Jobs from it carry a package set VMs can reproduce."""
    return built_once(shared_root(tmp_path_factory), "client-venv",
                      lambda root: _user_venv(root, wheelhouse, "")) / "env" / "bin" / "python"


def _user_venv(root: Path, wheelhouse: Path, extras: str) -> None:
    """A virtual environment in `root/env` with burla (and `extras`) installed from the running
    build and the wheelhouse, offline."""
    from burla.process.build import build_wheel

    subprocess.run([sys.executable, "-m", "venv", str(root / "env")], check=True)
    subprocess.run([str(root / "env" / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "--no-index", "--find-links", str(wheelhouse),
                    f"{build_wheel(root / 'build')}{extras}"], check=True)


@pytest.fixture(scope="session")
def aws_client_venv(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's environment with `burla[aws]`: its embedded heads can boot EC2 VMs."""
    return built_once(shared_root(tmp_path_factory), "aws-client-venv",
                      lambda root: _user_venv(root, wheelhouse, "[aws]")) / "env" / "bin" / "python"
