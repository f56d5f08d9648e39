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

from burla.drivers.ssh.bootstrap import CONFIG_DIR, ENV_DIR, HOME_DIR, WHEELHOUSE_DIR

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


_OURS = re.compile(r"^(\$B/[\w./-]+|https://\$PRIVATE:\d+)$")  # the parts the VM's shell fills in
_OUR_VARIABLES = re.compile(r"(\$B|\$PRIVATE|\$USER_NAME)")
_PLAIN = re.compile(r"[A-Za-z0-9_./:=@+-]+")  # needs no quoting for systemd


class Expanded(str):
    """A piece of a line the VM's shell expands as it writes it ($B, $PRIVATE, $USER_NAME)."""


Pieces = list[str]  # literal text, and Expanded pieces


def _ours(part: str) -> Pieces:
    """`part` as pieces: our own `$B/...` paths and `https://$PRIVATE:port` expand on the VM;
    anything else (a region, a project name) is literal."""
    if not _OURS.match(part):
        return [part]
    return [Expanded(piece) if _OUR_VARIABLES.fullmatch(piece) else piece
            for piece in _OUR_VARIABLES.split(part) if piece]


def shell_word(pieces: Pieces) -> str:
    """One shell word that is `pieces` verbatim, the Expanded ones expanded (and nothing else:
    no `$( )`, backquote or `$` in a literal piece is ever run)."""
    return "".join(f'"{piece}"' if isinstance(piece, Expanded) else shlex.quote(piece) for piece in pieces) or "''"


def systemd_argument(part: str) -> Pieces:
    """An ExecStart argument that systemd passes on as it is: literal ones double-quoted, with
    systemd's own expansions escaped (`%` specifiers and `$` variables; systemd.service(5),
    "Command lines")."""
    if _OURS.match(part):
        return _ours(part)
    if _PLAIN.fullmatch(part):
        return [part]
    escaped = part.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return [f'"{escaped}"']


def unit_lines(burla: str, arguments: list[str]) -> list[Pieces]:
    """The systemd unit that runs the head, line by line."""
    exec_start: Pieces = ["ExecStart="]
    for index, part in enumerate([burla, *arguments]):
        exec_start += ([" "] if index else []) + systemd_argument(part)
    return [["[Unit]"], ["Description=burla head"], ["After=network-online.target"], ["Wants=network-online.target"],
            ["[Service]"], ["User=", Expanded("$USER_NAME")], ["EnvironmentFile=", Expanded("$B"), f"/{HEAD_ENV}"],
            exec_start, ["Restart=always"], ["RestartSec=5"], ["[Install]"], ["WantedBy=multi-user.target"]]


def start_command(driver_name: str, head: HeadMachine, wheelhouse: bool) -> str:
    """Write the head's environment file and start it: under systemd where the image runs it,
    else detached under `burla head supervise`. Running it again restarts the head. Every line is
    written with printf from quoted words: nothing in a setting is expanded or run by the shell."""
    for key, value in head.environment.items():
        if "\n" in key or "\n" in value or "=" in key or not key:
            raise ValueError(f"environment value for {key!r} can't go in an environment file")
    burla = f"$B/{ENV_DIR}/bin/burla"
    arguments = serve_arguments(driver_name, head, wheelhouse)
    # KEY='value' lines: read the same by systemd's EnvironmentFile and by `. head.env`.
    environment: list[Pieces] = [["BURLA_CONFIG_DIR='", Expanded("$B"), f"/{CONFIG_DIR}'"],
                                 *([f"{k}={shlex.quote(v)}"] for k, v in head.environment.items())]
    supervise = " ".join(shell_word(_ours(part)) for part in [burla, "head", "supervise", "--", *arguments[2:]])
    return "\n".join([
        "set -eu",
        f'B="$HOME/{HOME_DIR}"',
        'cd "$B"',
        'as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }',
        "PRIVATE=$(hostname -I | cut -d' ' -f1)",
        '[ -n "$PRIVATE" ] || { echo "this VM reports no private address (hostname -I)" >&2; exit 1; }',
        "USER_NAME=$(id -un)",
        f"(umask 077; printf '%s\\n' {' '.join(shell_word(line) for line in environment)} > {HEAD_ENV})",
        "if [ -d /run/systemd/system ] && as_root true 2>/dev/null; then",
        f"  printf '%s\\n' {' '.join(shell_word(line) for line in unit_lines(burla, arguments))} "
        f"| as_root tee /etc/systemd/system/{UNIT} >/dev/null",
        "  as_root systemctl daemon-reload",
        f"  as_root systemctl enable {UNIT}",
        f"  as_root systemctl restart {UNIT}",
        "  echo started under systemd",
        "else",
        f'  if [ -f {HEAD_PID} ] && kill -0 "$(cat {HEAD_PID})" 2>/dev/null; then',
        f'    kill "$(cat {HEAD_PID})"; sleep 2',
        "  fi",
        f"  set -a; . ./{HEAD_ENV}; set +a",
        f"  setsid nohup {supervise} >> {HEAD_LOG} 2>&1 < /dev/null &",
        f"  echo $! > {HEAD_PID}",
        "  echo started under the burla supervisor",
        "fi",
    ])
