"""The `burla` command through its real entry point."""

from __future__ import annotations

import socket
import subprocess
import sys

from burla._version import __version__


def burla(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "burla", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_help_reads_well():
    done = burla("--help")
    assert done.returncode == 0
    assert "head" in done.stdout and "node" in done.stdout
    assert "worker" not in done.stdout  # internal


def test_head_serve_refuses_a_head_to_talk_to(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "BURLA_CONFIG_DIR": str(tmp_path), "BURLA_CLUSTER_TOKEN": "t"}
    for args in (("head", "serve", "--head", "http://127.0.0.1:9"), ("--head", "http://127.0.0.1:9", "head", "serve")):
        done = burla(*args, "--port", "0", env=env)
        assert done.returncode == 2 and "--head names one to talk to" in done.stderr and "--url" in done.stderr, done


def test_subcommand_help():
    serve = burla("head", "serve", "--help")
    assert serve.returncode == 0 and "--local-nodes" in serve.stdout and "127.0.0.1" in serve.stdout
    join = burla("node", "join", "--help")
    assert join.returncode == 0 and "--head" in join.stdout and "--workers" in join.stdout


def test_version():
    done = burla("--version")
    assert done.returncode == 0 and __version__ in done.stdout


def test_node_join_without_a_token_says_how_to_fix_it(tmp_path):
    import os

    env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
    env.pop("BURLA_CLUSTER_TOKEN", None)
    done = burla("node", "join", "--head", "http://127.0.0.1:9", env=env)
    assert done.returncode == 3
    assert "BURLA_CLUSTER_TOKEN" in done.stderr


def test_node_join_takes_head_and_token_before_the_subcommand_too(tmp_path):
    import os

    env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
    env.pop("BURLA_CLUSTER_TOKEN", None)
    env.pop("BURLA_CLUSTER_DASHBOARD_URL", None)
    done = burla("--head", "http://127.0.0.1:9", "node", "join", env=env)
    assert done.returncode == 3 and "BURLA_CLUSTER_TOKEN" in done.stderr  # past the head: the token is missing


def test_node_join_needs_a_head(tmp_path):
    import os

    env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
    env.pop("BURLA_CLUSTER_DASHBOARD_URL", None)
    done = burla("node", "join", env=env)
    assert done.returncode == 2 and "--head" in done.stderr


def test_head_serve_on_a_busy_port_fails_clearly(tmp_path):
    import os

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
        done = burla("head", "serve", "--port", str(taken.getsockname()[1]), env=env)
    finally:
        taken.close()
    assert done.returncode == 5
    assert "--port 0" in done.stderr


def test_bad_option_values_are_usage_errors():
    done = burla("head", "serve", "--local-nodes", "-3")
    assert done.returncode == 2 and "local-nodes" in done.stderr


def test_head_serve_asked_for_openssh_tunnels_without_ssh_names_the_fix(tmp_path):
    empty = tmp_path / "bin"  # a PATH with no ssh program on it
    empty.mkdir()
    env = {"PATH": str(empty), "BURLA_CONFIG_DIR": str(tmp_path), "BURLA_CLUSTER_TOKEN": "t", "HOME": str(tmp_path)}
    done = burla("head", "serve", "--port", "0", "--tunnel-client", "openssh", env=env)
    assert done.returncode == 2 and "no ssh program on PATH" in done.stderr, done
    assert "--tunnel-client asyncssh" in done.stderr
