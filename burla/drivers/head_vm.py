"""The head VM `burla deploy` boots: what it is given and the first-boot script that makes it a
head serving https under systemd (restarted if it stops, started again after a reboot).

The head listens on every interface; nodes reach it at its private address (written into the
unit at boot, since it is only known then), clients at its public one. Both pin its certificate,
so the name in the URL does not matter.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from burla._version import __version__
from burla.drivers.cloud import NODE_ENV_DIR, python_environment

HEAD_DIR = "/opt/burla-head"
HEAD_PORT = 5001
ROLE_TAG = "burla-role"
EXTRAS = {"ec2": "aws", "gce": "gcp", "azure": "azure"}


@dataclass(frozen=True)
class HeadMachine:
    name: str
    token: str
    cert_pem: str
    key_pem: str
    machine_type: str | None = None
    region: str | None = None
    disk_gb: int | None = None
    environment: dict[str, str] = field(default_factory=dict)  # cloud settings the head's driver reads
    port: int = HEAD_PORT
    python_version: str | None = None


def head_script(head: HeadMachine, driver_name: str) -> str:
    serve = [f"{NODE_ENV_DIR}/bin/burla", "head", "serve", "--host", "0.0.0.0", "--port", str(head.port),
             "--tls-cert", f"{HEAD_DIR}/head-cert.pem", "--tls-key", f"{HEAD_DIR}/head-key.pem", "--driver",
             driver_name]
    if head.region:
        serve += ["--region", head.region]
    environment = {"BURLA_CLUSTER_TOKEN": head.token, "BURLA_CONFIG_DIR": HEAD_DIR, **head.environment}
    for key, value in environment.items():
        if "\n" in value or "\n" in key:
            raise ValueError(f"environment value for {key} spans lines")
    return "\n".join([
        "#!/bin/bash",
        f"# burla {__version__} head bootstrap",
        "set -euo pipefail",
        *python_environment(head.python_version, f"burla[{EXTRAS[driver_name]}]=={__version__}"),
        f"install -d -m 700 {HEAD_DIR}",
        f"cat > {HEAD_DIR}/head-cert.pem <<'BURLA_HEAD_CERT'", head.cert_pem.strip(), "BURLA_HEAD_CERT",
        f"(umask 077; cat > {HEAD_DIR}/head-key.pem <<'BURLA_HEAD_KEY'", head.key_pem.strip(), "BURLA_HEAD_KEY", ")",
        f"(umask 077; cat > {HEAD_DIR}/env <<'BURLA_HEAD_ENV'",
        *(f"{key}={value}" for key, value in environment.items()),
        "BURLA_HEAD_ENV", ")",
        f'echo "BURLA_HEAD_PRIVATE_URL=https://$(hostname -I | cut -d" " -f1):{head.port}" >> {HEAD_DIR}/env',
        "cat > /etc/systemd/system/burla-head.service <<'BURLA_HEAD_UNIT'",
        "[Unit]",
        "Description=burla head",
        "After=network-online.target",
        "Wants=network-online.target",
        "[Service]",
        f"EnvironmentFile={HEAD_DIR}/env",
        "ExecStart=" + " ".join(shlex.quote(part) for part in serve) + " --url ${BURLA_HEAD_PRIVATE_URL}",
        "Restart=always",
        "RestartSec=5",
        "[Install]",
        "WantedBy=multi-user.target",
        "BURLA_HEAD_UNIT",
        "systemctl daemon-reload",
        "systemctl enable --now burla-head.service",
        "",
    ])
