"""Playing a cloud VM on this machine: run what its first-boot script would run (the node join,
or the head under systemd), with the files it would write put in a temporary directory."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from burla.config import ENV_TOKEN
from tests.conftest import REPO, Head, launch_head


def heredoc(script: str, marker: str) -> str:
    """The body of the script's `<<'MARKER'` here-document."""
    match = re.search(rf"<<'{marker}'\n(.*?)\n{marker}\n", script, re.S)
    assert match, f"no {marker} here-document in the script"
    return match.group(1)


def boot_from_startup_script(script: str, workers: int = 1) -> subprocess.Popen:
    """A node VM: its `burla node join` line, with the token it exports and the head certificate it
    writes (if any) in a temporary file."""
    token = re.search(r"^export BURLA_CLUSTER_TOKEN=(.+)$", script, re.M).group(1)
    join = shlex.split(re.search(r"^exec (.+)$", script, re.M).group(1))
    assert join[0] == "/opt/burla/bin/burla" and join[1:3] == ["node", "join"], join
    join[join.index("--host") + 1] = "127.0.0.1"  # a VM listens on its network; here, loopback only
    if "--head-cert" in join:
        cert = Path(tempfile.mkdtemp()) / "head-cert.pem"
        cert.write_text(heredoc(script, "BURLA_HEAD_CERT") + "\n")
        join[join.index("--head-cert") + 1] = str(cert)
    env = dict(os.environ, **{ENV_TOKEN: shlex.split(token)[0]})
    return subprocess.Popen([sys.executable, "-m", "burla", *join[1:], "--workers", str(workers)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def head_from_script(script: str, directory: Path) -> tuple[list[str], dict[str, str]]:
    """A head VM: the `burla head serve` command of its systemd unit and the environment file it
    writes, with its certificate, key and config directory under `directory`, listening on
    127.0.0.1 at a free port instead of every interface at the fixed one."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "head-cert.pem").write_text(heredoc(script, "BURLA_HEAD_CERT") + "\n")
    (directory / "head-key.pem").write_text(heredoc(script, "BURLA_HEAD_KEY") + "\n")
    environment = dict(line.split("=", 1) for line in heredoc(script, "BURLA_HEAD_ENV").splitlines())
    environment["BURLA_CONFIG_DIR"] = str(directory)
    exec_start = re.search(r"^ExecStart=(.+) --url \$\{BURLA_HEAD_PRIVATE_URL\}$", script, re.M).group(1)
    command = shlex.split(exec_start)
    assert command[:3] == ["/opt/burla/bin/burla", "head", "serve"], command
    for flag, value in (("--host", "127.0.0.1"), ("--port", "0"), ("--tls-cert", str(directory / "head-cert.pem")),
                        ("--tls-key", str(directory / "head-key.pem"))):
        command[command.index(flag) + 1] = value
    return command[1:], environment


def start_played_head(script: str, directory: Path) -> Head:
    """Run the head VM's head here and wait until it serves (its URL is https://127.0.0.1:PORT)."""
    command, environment = head_from_script(script, directory)
    return launch_head(command, environment, directory)
