"""The embedded default, head reuse, several clients at once, Ctrl-C and the progress line."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

import burla
from burla.config import ENV_CONFIG_DIR, ENV_HEAD_URL, ENV_TOKEN, HeadRecord
from tests.conftest import REPO, run_client, start_head, wait_for_nodes
from tests.support.functions import double
from tests.support.helpers import DETACHED, get_json, wait_until

OPENED = re.compile(r"\[burla\] job (\S+): http")

PRELUDE = (
    "import cloudpickle\n"
    "from burla import remote_parallel_map, get_cluster_dashboard_url\n"
    "from tests.support import functions\n"
    "cloudpickle.register_pickle_by_value(functions)\n"
)


def _env(config_dir, **extra) -> dict[str, str]:
    env = {ENV_CONFIG_DIR: str(config_dir), ENV_HEAD_URL: "", ENV_TOKEN: ""}
    env.update(extra)
    return env


def _burla_processes(config_dir) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = process.info["cmdline"] or []
            environ = process.info["environ"] or {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "burla" in " ".join(cmdline) and environ.get(ENV_CONFIG_DIR) == str(config_dir):
            found.append(process)
    return found



def test_embedded_cluster_starts_runs_and_stops(tmp_path):
    config_dir = tmp_path / "config"
    done = run_client(PRELUDE + "print(remote_parallel_map(functions.double, range(20), spinner=False))\n",
                      _env(config_dir))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [x * 2 for x in range(20)]
    assert HeadRecord.read(config_dir) is None  # an embedded head is not advertised
    # Head, node and workers all go away with the client.
    wait_until(lambda: not _burla_processes(config_dir), what="embedded cluster exit")
    log = (config_dir / "logs" / "embedded-head.log").read_text()
    assert "COMPLETED" in log


def test_a_job_no_node_can_run_fails_on_a_fresh_embedded_cluster_instead_of_waiting(tmp_path):
    # The job often opens while the embedded node is still booting (it may have had the GPU);
    # whether it registers before or after, without a GPU the job ends saying why instead of
    # waiting forever (test_cluster_events pins down the ordering that used to hang).
    config_dir = tmp_path / "config"
    done = run_client(PRELUDE + (
        "from burla import NoCompatibleNodes\n"
        "try:\n"
        "    remote_parallel_map(functions.double, [1], func_gpu='H100', spinner=False)\n"
        "except NoCompatibleNodes as e:\n"
        "    print('raised', str(e).replace(chr(10), ' '))\n"
    ), _env(config_dir), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "raised" in done.stdout and "func_gpu='H100'" in done.stdout


def test_running_head_is_reused(tmp_path):
    config_dir = tmp_path / "config"
    head = start_head(config_dir, token="reuse-token")
    try:
        wait_for_nodes(head, 1)
        assert HeadRecord.read(config_dir).url == head.url
        done = run_client(PRELUDE + "print(remote_parallel_map(functions.double, [1, 2], spinner=False))\n",
                          _env(config_dir))
        assert done.returncode == 0, done.stderr
        assert "[2, 4]" in done.stdout
        request = urllib.request.Request(f"{head.url}/v1/cluster", headers=head.headers())
        with urllib.request.urlopen(request) as response:
            jobs = json.load(response)["jobs"]
        assert [j["status"] for j in jobs] == ["COMPLETED"]  # it ran on this head, not a new one
        assert not (config_dir / "logs" / "embedded-head.log").exists()
    finally:
        head.stop()
    assert HeadRecord.read(config_dir) is None  # the head removes its record when it stops


def test_get_cluster_dashboard_url_starts_a_head_that_outlives_the_client(tmp_path):
    config_dir = tmp_path / "config"
    done = run_client(PRELUDE + "print(get_cluster_dashboard_url())\n", _env(config_dir))
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip().splitlines()[-1]
    record = HeadRecord.read(config_dir)
    try:
        assert record is not None and record.url == url
        with urllib.request.urlopen(f"{url}/health") as response:
            assert json.load(response)["ok"] is True
        # The same call again returns the same head; a job there runs warm.
        again = run_client(PRELUDE + "print(get_cluster_dashboard_url())\n"
                           "print(remote_parallel_map(functions.double, [5], spinner=False))\n", _env(config_dir))
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines()[-2:] == [url, "[10]"]
    finally:
        os.kill(record.pid, signal.SIGTERM)
        wait_until(lambda: not _burla_processes(config_dir), what="background head exit")


def _cli(config_dir, *args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "burla", *args], capture_output=True, text=True, timeout=400,
                          env={**os.environ, **_env(config_dir)}, cwd=REPO)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    return done.returncode, json.loads(lines[-1])


def test_a_background_head_that_died_is_absent_to_every_command(tmp_path):
    # Fails on the previous code: `auth status` reported the dead head, `cluster start` said it was
    # unreachable and told the user to run `cluster start`.
    config_dir = tmp_path / "config"
    done = run_client(PRELUDE + "print(get_cluster_dashboard_url())\n", _env(config_dir))
    assert done.returncode == 0, done.stderr
    record = HeadRecord.read(config_dir)
    assert record is not None
    os.kill(record.pid, signal.SIGKILL)  # a crash: it leaves its record behind
    wait_until(lambda: not psutil.pid_exists(record.pid) or psutil.Process(record.pid).status() == "zombie",
               what="the head gone")
    code, doc = _cli(config_dir, "auth", "status")
    assert code == 6 and "no longer running" in doc["error"]["message"] and str(record.pid) in doc["error"]["message"]
    assert HeadRecord.read(config_dir) is None  # its stale record was removed
    try:
        code, doc = _cli(config_dir, "cluster", "start")  # starts a new head, where the old one was
        assert code == 0 and doc["data"]["started_head"] is True, doc
        fresh = HeadRecord.read(config_dir)
        assert fresh is not None and fresh.pid != record.pid
    finally:
        for process in _burla_processes(config_dir):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def test_burla_head_stop_stops_the_background_head_and_its_nodes(tmp_path):
    config_dir = tmp_path / "config"
    done = run_client(PRELUDE + "print(get_cluster_dashboard_url())\n"
                      "print(remote_parallel_map(functions.double, [2], spinner=False))\n", _env(config_dir))
    assert done.returncode == 0, done.stderr
    record = HeadRecord.read(config_dir)
    assert record is not None and len(_burla_processes(config_dir)) >= 2  # the head and its local node
    code, doc = _cli(config_dir, "head", "stop")
    assert code == 0 and doc["data"]["stopped"] is True and doc["data"]["pid"] == record.pid
    assert HeadRecord.read(config_dir) is None
    wait_until(lambda: not _burla_processes(config_dir), what="the head's nodes gone")
    code, doc = _cli(config_dir, "head", "stop")  # nothing left to stop: said, not an error
    assert code == 0 and doc["data"]["stopped"] is False and "no background head" in doc["data"]["note"]


def test_a_head_a_client_starts_keeps_to_the_clients_config_dir(tmp_path):
    given, from_environment = tmp_path / "given", tmp_path / "environment"
    script = PRELUDE + (
        "from pathlib import Path\n"
        "from burla import Client\n"
        "from burla.config import ClientSettings\n"
        f"client = Client(settings=ClientSettings(config_dir=Path({str(given)!r}), head_url=None, token=None,\n"
        "                                         parent_job_id=None))\n"
        "print(client.dashboard_url())\n"
        "print(client.remote_parallel_map(functions.double, [4], spinner=False))\n"
    )
    done = run_client(script, _env(from_environment))
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip().splitlines()[-2]
    record = HeadRecord.read(given)
    try:
        assert record is not None and record.url == url and done.stdout.strip().endswith("[8]")
        assert HeadRecord.read(from_environment) is None
        assert (given / "history.db").exists() and not (from_environment / "history.db").exists()
    finally:
        for directory in (given, from_environment):  # a head that went to the wrong one stops too
            started = HeadRecord.read(directory)
            if started is not None:
                os.kill(started.pid, signal.SIGTERM)
            wait_until(lambda d=directory: not _burla_processes(d), what="background head exit")


def test_several_clients_at_once_each_get_their_own_results(cluster):
    script = PRELUDE + (
        "import sys\n"
        "k = int(sys.argv[1])\n"
        "r = remote_parallel_map(functions.identity, [(k, i) for i in range(300)], spinner=False)\n"
        "assert r == [(k, i) for i in range(300)], r[:5]\n"
        "print('ok', k)\n"
    )
    clients = [
        subprocess.Popen([sys.executable, "-c", script, str(k)], cwd=REPO, env=dict(os.environ, **cluster.env()),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k in range(4)
    ]
    for k, client in enumerate(clients):
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err
        assert f"ok {k}" in out


def test_jobs_share_slots_instead_of_failing(cluster, tmp_path):
    # A long job holds both workers; a second job still gets through.
    script = PRELUDE + (
        "import sys\n"
        "r = remote_parallel_map(functions.sleep_then_return, [(i, float(sys.argv[1])) for i in range(4)], "
        "spinner=False)\n"
        "print(r)\n"
    )
    long_job = subprocess.Popen([sys.executable, "-c", script, "2"], cwd=REPO, env=dict(os.environ, **cluster.env()),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _running_jobs(cluster) >= 1, what="long job running")
        short = run_client(PRELUDE + "print(remote_parallel_map(functions.double, [21], spinner=False))\n",
                           cluster.env())
        assert short.returncode == 0, short.stderr
        assert "[42]" in short.stdout
    finally:
        out, err = long_job.communicate(timeout=120)
    assert long_job.returncode == 0, err
    assert "[0, 1, 2, 3]" in out


def _running_jobs(head) -> int:
    request = urllib.request.Request(f"{head.url}/v1/cluster", headers=head.headers())
    with urllib.request.urlopen(request) as response:
        return sum(1 for j in json.load(response)["jobs"] if j["status"] == "RUNNING" and j["running"] > 0)


def _signal_state(pid: int) -> str:
    """How a process (each of its threads) handles signals, for a failure's message."""
    lines = []
    for status in sorted(Path(f"/proc/{pid}/task").glob("*/status")):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            lines.append(" ".join(f"{key}={fields[key].strip()}" for key in ("Name", "SigBlk", "SigIgn", "SigCgt")
                                  if key in fields))
    return "\n".join(lines)


def _own_job_running(client: subprocess.Popen, cluster) -> str:
    """The id of the job `client` opened, once some of its calls run (another test's job on the shared
    cluster must not stand in for it)."""
    assert client.stderr is not None
    job_id = None
    while job_id is None:
        line = client.stderr.readline()
        assert line, "the client ended before its job opened"
        found = OPENED.search(line)
        job_id = found.group(1) if found else None
    wait_until(lambda: get_json(cluster, f"/v1/jobs/{job_id}")["running"] >= 1, what="its calls running")
    return job_id


def _script(script: str, cluster) -> subprocess.Popen:
    """A client script running against `cluster`, its output read by the test."""
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=dict(os.environ, **cluster.env()),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_cancels_the_job_frees_the_node_and_raises_keyboard_interrupt(cluster):
    # Fails on the previous code: Ctrl-C raised JobCanceled, which `except Exception` swallowed.
    script = PRELUDE + (
        "try:\n"
        "    try:\n"
        "        remote_parallel_map(functions.sleep_then_return, [(i, 60) for i in range(4)], spinner=False)\n"
        "    except Exception as e:\n"
        "        print('swallowed:', type(e).__name__, flush=True)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
    )
    client = _script(script, cluster)
    _own_job_running(client, cluster)
    before = _signal_state(client.pid)
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=60)
    assert "interrupted" in out and "swallowed" not in out, (out, err, client.returncode, before)
    assert "canceled (Ctrl-C)" in err
    # The running calls stopped (they would sleep a minute): the next job runs at once.
    done = run_client(PRELUDE + "print(remote_parallel_map(functions.double, [1, 2, 3, 4], spinner=False))\n",
                      cluster.env(), timeout=30)
    assert "[2, 4, 6, 8]" in done.stdout, done.stderr
    request = urllib.request.Request(f"{cluster.url}/v1/cluster", headers=cluster.headers())
    with urllib.request.urlopen(request) as response:
        statuses = [j["status"] for j in json.load(response)["jobs"] if j["function_name"] == "sleep_then_return"]
    assert statuses and statuses[0] == "CANCELED"


def test_ctrl_c_after_a_detached_jobs_upload_leaves_it_running(cluster):
    script = PRELUDE + (
        "try:\n"
        "    remote_parallel_map(functions.sleep_then_return, [(0, 0.05), (1, 4), (2, 4)], detach=True,\n"
        "                        spinner=False)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
    )
    client = _script(script, cluster)
    assert client.stderr is not None
    job_id = None
    while job_id is None:
        line = client.stderr.readline()
        assert line, "the client ended before its inputs were up"
        found = DETACHED.search(line)
        job_id = found.group(1) if found else None
    # Fails on the previous code: the client had taken (and acknowledged) the first result when it
    # stopped, so the head no longer had it for the next collector.
    wait_until(lambda: get_json(cluster, f"/v1/jobs/{job_id}")["n_done"] >= 1, what="a first result")
    time.sleep(0.5)  # it reaches the waiting client (which then holds it); the test holds either way
    before = _signal_state(client.pid)
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=60)
    assert "interrupted" in out and "runs on (detached)" in err, (out, err, client.returncode, before)
    assert cluster.client().get_results(job_id, spinner=False) == [0, 1, 2]


def _run_in_pty(script: str, env: dict[str, str], timeout: float = 60) -> str:
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, "-c", script], dict(os.environ, **env))
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode(errors="replace")


def test_progress_line_on_a_tty(cluster):
    script = PRELUDE + (
        "import tempfile\n"
        "d = tempfile.mkdtemp()\n"
        "remote_parallel_map(functions.record_interval, [(d, i, 0.3) for i in range(6)])\n"
    )
    shown = _run_in_pty(script, cluster.env())
    assert "[burla] 6/6 done" in shown
    assert "running" in shown and "/s" in shown


def test_no_progress_line_with_spinner_false_on_a_tty(cluster):
    script = PRELUDE + "print(remote_parallel_map(functions.double, [1, 2], spinner=False))\n"
    shown = _run_in_pty(script, cluster.env())
    assert "[2, 4]" in shown and "2/2 done" not in shown
    assert "[burla] job double-" in shown  # the job's page is still announced


def test_the_head_reports_its_own_load(cluster):
    import urllib.error

    from tests.support.helpers import get_json

    wait_until(lambda: get_json(cluster, "/v1/head?window_s=5")["loop_lag_ms"]["samples"] >= 10,
               what="loop samples")
    head = get_json(cluster, "/v1/head?window_s=5")
    assert head["pid"] == cluster.process.pid and head["cpu_s"] > 0 and head["rss_mb"] > 10
    lag = head["loop_lag_ms"]
    assert lag["window_s"] == 5 and 0 <= lag["p50"] <= lag["p99"] <= lag["max"]
    try:
        get_json(cluster, "/v1/head?window_s=0")
        raise AssertionError("window_s=0 was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and "window_s must be between 1 and 600" in json.load(e)["message"]


def test_a_head_starts_its_local_nodes_before_it_imports_its_web_stack():
    # The node boots while the head imports aiohttp (~0.2 s): nothing on the way to `serve` may
    # import it first.
    check = "import sys, burla.cli.head, burla.head.server; print('aiohttp' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_stopping_head_closes_the_connections_clients_keep_open(tmp_path):
    # Fails on the previous code: the head waited out its shutdown timeout for connections kept
    # for a next job and then dropped them without a close frame, and an embedded cluster's
    # script waited those seconds at exit.
    import asyncio

    import aiohttp

    head = start_head(tmp_path / "config", local_nodes=0)

    async def kept_connection_closes() -> tuple[aiohttp.WSMsgType, object]:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{head.url}/v1/jobs/ws", headers=head.headers()) as ws:
                head.process.terminate()
                message = await ws.receive(timeout=60)
                return message.type, message.data

    try:
        kind, code = asyncio.run(kept_connection_closes())
        assert (kind, code) == (aiohttp.WSMsgType.CLOSE, aiohttp.WSCloseCode.GOING_AWAY)
        assert head.process.wait(60) == 0
    finally:
        head.stop()


def test_a_heads_first_local_node_is_forked_from_it_without_its_listening_socket(tmp_path):
    # The head forks its first local nodes once it has imported what they run. A node that kept
    # the head's listening socket would keep its port answering after the head is gone.
    head = start_head(tmp_path / "config", local_nodes=1)
    try:
        wait_for_nodes(head, 1)
        head_process = psutil.Process(head.process.pid)
        [node] = head_process.children()
        assert node.cmdline() == head_process.cmdline()  # forked, not `burla node join`
        port = int(head.url.rsplit(":", 1)[1])
        assert [c for c in head_process.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                and c.laddr.port == port]
        assert not [c for c in node.net_connections("tcp") if c.laddr and c.laddr.port == port]
        assert os.getsid(node.pid) == node.pid  # its own session: stopped as a group, like a started node
        done = run_client(PRELUDE + "print(remote_parallel_map(functions.double, range(6), spinner=False))\n",
                          _env(tmp_path / "config", **{ENV_HEAD_URL: head.url, ENV_TOKEN: head.token}))
        assert json.loads(done.stdout.strip().splitlines()[-1]) == [x * 2 for x in range(6)], done.stderr
    finally:
        head.stop()
    wait_until(lambda: not node.is_running() or node.status() == psutil.STATUS_ZOMBIE, what="the node's exit")


def test_a_client_names_its_head_outright_whatever_the_environment_says(cluster, tmp_path):
    # The environment points elsewhere (a port nothing listens on) and holds a wrong token.
    script = PRELUDE + (
        "from burla import Client\n"
        f"client = Client({cluster.url!r}, {cluster.token!r})\n"
        "print(client.remote_parallel_map(functions.double, [1, 2, 3], spinner=False))\n"
        "print(client.dashboard_url())\n"
    )
    done = run_client(script, _env(tmp_path / "config", **{ENV_HEAD_URL: "http://127.0.0.1:9",
                                                            ENV_TOKEN: "not-the-token"}))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["[2, 4, 6]", cluster.url]
    from burla import Client

    assert Client(cluster.url, cluster.token).dashboard_url() == cluster.url
    with pytest.raises(burla.InvalidArgument, match="head_url must be an http:// or https:// URL"):
        Client("127.0.0.1:5001", cluster.token)
    with pytest.raises(burla.Unauthorized, match="needs the cluster token"):
        Client(cluster.url, settings=_no_token_settings(tmp_path)).remote_parallel_map(double, [1], spinner=False)


def test_the_module_functions_use_the_head_the_environment_names(cluster, tmp_path):
    # burla.remote_parallel_map, get_results and get_cluster_dashboard_url find their head in
    # BURLA_CLUSTER_DASHBOARD_URL and BURLA_CLUSTER_TOKEN (and nothing in this config directory).
    script = PRELUDE + (
        "print(remote_parallel_map(functions.double, [1, 2, 3], detach=True, spinner=False))\n"
        "print(remote_parallel_map(functions.double, [4], spinner=False))\n"
        "print(get_cluster_dashboard_url())\n"
    )
    done = run_client(script, _env(tmp_path / "config", **{ENV_HEAD_URL: cluster.url, ENV_TOKEN: cluster.token}))
    assert done.returncode == 0, done.stderr
    results, again, url = done.stdout.splitlines()[-3:]
    assert (results, again, url) == ("[2, 4, 6]", "[8]", cluster.url)
    from tests.support.helpers import DETACHED, get_json

    [job_id] = DETACHED.findall(done.stderr)
    assert job_id in [job["job_id"] for job in get_json(cluster, "/v1/cluster")["jobs"]]  # it ran on that head
    assert not (tmp_path / "config" / "logs").exists()  # no head was started here


def _no_token_settings(directory):
    from burla.config import ClientSettings

    return ClientSettings(config_dir=directory, head_url=None, token=None, parent_job_id=None)
