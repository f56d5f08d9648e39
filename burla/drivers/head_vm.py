"""The head VM `burla deploy` boots: what the cloud is given (no secret: the deploying machine's
SSH key for the head's cluster, the machine's shape) and the command that starts the head on it
once the deploying machine has set it up over SSH (`burla.drivers.deploy`).

The head listens on every interface; nodes reach it at its private address (read on the VM when
the head starts), clients at its public one. Both pin its certificate, so the name in the URL
does not matter. It runs under systemd where the image has it (restarted if it stops, started
again after a reboot), else under burla's own supervisor.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from burla.drivers.bootstrap import CONFIG_DIR, ENV_DIR, HOME_DIR, WHEELHOUSE_DIR, shell_words

HEAD_PORT = 5001
ROLE_TAG = "burla-role"
EXTRAS = {"ec2": "aws", "gce": "gcp", "azure": "azure"}
HEAD_CERT = "head-cert.pem"  # the head's own certificate and key, in ~/.burla
HEAD_KEY = "head-key.pem"
HEAD_ENV = "head.env"
HEAD_LOG = "head.log"
HEAD_PID = "head-supervisor.pid"
UNIT = "burla-head.service"


@dataclass(frozen=True)
class HeadMachine:
    name: str
    ssh_public_key: str  # authorised through the cloud's own key mechanism
    machine_type: str | None = None
    region: str | None = None
    disk_gb: int | None = None
    environment: dict[str, str] = field(default_factory=dict)  # cloud settings the head's driver reads (no secret)
    port: int = HEAD_PORT
    python_version: str | None = None


def serve_arguments(driver_name: str, head: HeadMachine, wheelhouse: bool) -> list[str]:
    """`burla head serve ...` on the VM ($B is ~/.burla, $PRIVATE its private address)."""
    serve = ["head", "serve", "--host", "0.0.0.0", "--port", str(head.port), "--tls-cert", f"$B/{HEAD_CERT}",
             "--tls-key", f"$B/{HEAD_KEY}", "--driver", driver_name, "--url", f"https://$PRIVATE:{head.port}",
             "--node-link", "direct", "--keep-nodes"]  # nodes in its network reach it directly, and outlive restarts
    if head.region:
        serve += ["--region", head.region]
    if wheelhouse:
        serve += ["--node-wheelhouse", f"$B/{WHEELHOUSE_DIR}"]  # the wheels the deploying machine uploaded
    return serve


_OURS = re.compile(r"^(\$B/[\w./-]+|https://\$PRIVATE:\d+)$")


def unit_words(parts: list[str]) -> str:
    """ExecStart's arguments, written through an unquoted here-document: our own `$B/...` paths and
    the `$PRIVATE` URL are expanded as it is written; every other part is single-quoted."""
    return " ".join(part if _OURS.match(part) else shlex.quote(part) for part in parts)


def start_command(driver_name: str, head: HeadMachine, wheelhouse: bool) -> str:
    """Write the head's environment file and start it: under systemd where the image runs it,
    else detached under `burla head supervise`. Running it again restarts the head."""
    for key, value in head.environment.items():
        if "\n" in key or "\n" in value or "=" in key:
            raise ValueError(f"environment value for {key!r} can't go in an environment file")
    burla = f"$B/{ENV_DIR}/bin/burla"
    arguments = serve_arguments(driver_name, head, wheelhouse)
    # KEY='value' lines: read the same by systemd's EnvironmentFile and by `. head.env`.
    environment = [f"BURLA_CONFIG_DIR='$B/{CONFIG_DIR}'",
                   *(f"{k}={shlex.quote(v)}" for k, v in head.environment.items())]
    return "\n".join([
        "set -eu",
        f'B="$HOME/{HOME_DIR}"',
        'cd "$B"',
        'as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }',
        "PRIVATE=$(hostname -I | cut -d' ' -f1)",
        '[ -n "$PRIVATE" ] || { echo "this VM reports no private address (hostname -I)" >&2; exit 1; }',
        f"(umask 077; : > {HEAD_ENV})",
        *(f"echo {shell_words([line])} >> {HEAD_ENV}" for line in environment),
        "if [ -d /run/systemd/system ] && as_root true 2>/dev/null; then",
        f"  as_root tee /etc/systemd/system/{UNIT} >/dev/null <<UNIT",
        "[Unit]",
        "Description=burla head",
        "After=network-online.target",
        "Wants=network-online.target",
        "[Service]",
        "User=$(id -un)",
        f"EnvironmentFile=$B/{HEAD_ENV}",
        f"ExecStart={unit_words([burla, *arguments])}",
        "Restart=always",
        "RestartSec=5",
        "[Install]",
        "WantedBy=multi-user.target",
        "UNIT",
        "  as_root systemctl daemon-reload",
        f"  as_root systemctl enable {UNIT}",
        f"  as_root systemctl restart {UNIT}",
        "  echo started under systemd",
        "else",
        f'  if [ -f {HEAD_PID} ] && kill -0 "$(cat {HEAD_PID})" 2>/dev/null; then',
        f'    kill "$(cat {HEAD_PID})"; sleep 2',
        "  fi",
        f"  set -a; . ./{HEAD_ENV}; set +a",
        f"  setsid nohup {shell_words([burla, 'head', 'supervise', '--', *arguments[2:]])} >> {HEAD_LOG} 2>&1 "
        "< /dev/null &",
        f"  echo $! > {HEAD_PID}",
        "  echo started under the burla supervisor",
        "fi",
    ])
