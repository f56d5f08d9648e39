"""What runs on a VM over SSH to make it a node (or a deployed head): the files the head uploads,
the bootstrap script that installs the head's exact build, and the command that starts the node
under its supervisor.

Everything lives in `~/.burla` of the SSH user (0700), so the same script runs on any image and
on the loopback stand-ins the tests use. Secrets (the token, a head's TLS key) arrive as 0600
files over SFTP, never in user data, metadata or a command line.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import PurePosixPath

from burla.process.build import BUILD_DIR, build_hash, wheel_name

HOME_DIR = ".burla"  # relative to the SSH user's home directory (SFTP's starting directory)
ENV_DIR = "env"
WHEELHOUSE_DIR = "wheelhouse"
CONFIG_DIR = "config"  # BURLA_CONFIG_DIR on the VM: holds cluster_token (0600)
HEAD_CERT_FILE = "head-cert.pem"
HEAD_URL_FILE = "head-url"  # where the node finds its tunnel's port after a reconnect moved it
SCRIPT_FILE = "bootstrap.sh"
NODE_LOG_FILE = "node.log"
SUPERVISOR_PID_FILE = "supervisor.pid"
INSTALLED_MARKER = "installed-build"
ALREADY_INSTALLED = "burla: this build is installed already"  # what the bootstrap prints then


DEAD_MAN_UNIT = "burla-dead-man"  # the systemd timer that powers a VM off unless a head sets it up
# Stops that timer; the bootstrap and every node start run it (a VM set up again after a reboot too).
CANCEL_DEAD_MAN = (f'{{ if [ "$(id -u)" = 0 ]; then systemctl stop {DEAD_MAN_UNIT}.timer; '
                   f'else sudo -n systemctl stop {DEAD_MAN_UNIT}.timer; fi; }} 2>/dev/null || true')


def dead_man_script(seconds: float) -> str:
    """The user data every node VM boots with (run as root by cloud-init or the guest agent): a
    timer that powers the VM off `seconds` after boot unless a head's bootstrap stops it, so a VM
    nobody sets up (its head died, its SSH never answered) does not stay billed. No secret in it."""
    return "\n".join([
        "#!/bin/sh",
        f"# burla: this VM powers itself off {seconds:g} s after boot unless its head sets it up",
        f"systemd-run --unit={DEAD_MAN_UNIT} --on-active={max(1, int(seconds))}s /usr/sbin/shutdown -h now",
        "",
    ])


def this_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


_SHELL_VARIABLES = re.compile(r"(\$B|\$PRIVATE)(?![A-Za-z0-9_])")


def shell_words(parts: list[str]) -> str:
    """A command line for the VM's shell: `$B` (~/.burla) and `$PRIVATE` (the VM's private address)
    are expanded there; everything else is quoted literally."""
    def word(part: str) -> str:
        pieces = _SHELL_VARIABLES.split(part)
        quoted = [f'"{piece}"' if _SHELL_VARIABLES.fullmatch(piece) else shlex.quote(piece)
                  for piece in pieces if piece]
        return "".join(quoted) or "''"

    return " ".join(word(part) for part in parts)


def remote(*parts: str) -> str:
    """A path under ~/.burla, relative to the home directory (how SFTP addresses it)."""
    return str(PurePosixPath(HOME_DIR, *parts))


@dataclass(frozen=True)
class PackageSource:
    """Where a VM gets burla's dependencies: the package index pip is configured with by default,
    a mirror (`index_url`), or only the wheels the head uploads (`wheelhouse`)."""

    index_url: str | None = None
    wheelhouse: str | None = None  # a local directory of wheels, uploaded to every VM

    def pip_flags(self) -> list[str]:
        if self.wheelhouse:
            return ["--no-index", "--find-links", f"$B/{WHEELHOUSE_DIR}"]
        if self.index_url:
            return ["--index-url", shlex.quote(self.index_url)]
        return []


def installed_tag(python_version: str | None, extra: str | None = None) -> str:
    """What INSTALLED_MARKER holds once a build (with an extra) is installed for a Python
    major.minor (a VM booted from a baked image has it already)."""
    major, minor = (python_version or this_python()).split(".")[:2]
    return f"{build_hash()} py{major}.{minor}" + (f" [{extra}]" if extra else "")


# The pip wheel the image's Python bundles for ensurepip, from the first folder that has one:
# CPython's own, where Debian and Ubuntu keep it, the folder a newer CPython names in WHEEL_PKG_DIR.
# Empty if none has one.
_FIND_PIP_WHEEL = (
    "import ensurepip, glob, os.path, sysconfig; "
    "folders = [os.path.join(os.path.dirname(ensurepip.__file__), \"_bundled\"), \"/usr/share/python-wheels\", "
    "sysconfig.get_config_var(\"WHEEL_PKG_DIR\")]; "
    "wheels = [w for f in folders if f for w in sorted(glob.glob(os.path.join(f, \"pip-*.whl\")))]; "
    "print(wheels[0] if wheels else \"\")"
)


def _new_env_function(flags: str) -> list[str]:
    """`new_env DIR REQUIREMENT...`: a venv at DIR with pip and the requirements in it. Where the
    image bundles a pip wheel, pip runs from that wheel and installs itself with the rest in one
    run, where `python3 -m venv` would install and compile pip first (about 4 CPU-seconds); nothing
    is byte-compiled ahead (`--no-compile`): a module compiles when it is first imported, and most
    never are."""
    pip = f"install --quiet --no-compile --disable-pip-version-check {flags}"
    return [
        f"pip_wheel=$(python3 -c {shlex.quote(_FIND_PIP_WHEEL)} 2>/dev/null || true)",
        "new_env() {",
        '  local dir=$1; shift',
        '  if [ -n "$pip_wheel" ]; then',
        '    python3 -m venv --without-pip "$dir"',
        f'    "$dir/bin/python" "$pip_wheel/pip" {pip} "$pip_wheel" "$@"',
        "  else",
        '    python3 -m venv "$dir"',
        f'    "$dir/bin/python" -m pip {pip} "$@"',
        "  fi",
        "}",
    ]


def install_script(python_version: str | None, source: PackageSource, extra: str | None = None,
                   image: str | None = None) -> str:
    """The bootstrap: a Python of this major.minor in ~/.burla/env with the uploaded build in it
    (and for a node that runs in a container `image`: Docker and the image). Skipped when that
    build is already installed for that Python (a reconnect, or a VM from a baked image)."""
    version = python_version or this_python()
    major, minor = version.split(".")[:2]
    tag = shlex.quote(installed_tag(version, extra))
    flags = " ".join(source.pip_flags())
    wheel = f"$B/{BUILD_DIR}/{wheel_name()}"
    requirement = f'"{wheel}[{extra}]"' if extra else f'"{wheel}"'
    return "\n".join([
        "#!/bin/bash",
        f"# burla {build_hash()} bootstrap",
        "set -euo pipefail",
        f'B="$HOME/{HOME_DIR}"',
        'cd "$B"',
        CANCEL_DEAD_MAN,
        f'if [ "$(cat {INSTALLED_MARKER} 2>/dev/null)" = {tag} ]; then echo "{ALREADY_INSTALLED}"; exit 0; fi',
        'as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }',
        # A Python with venv: the image's, or one uv fetches when its major.minor differs.
        "if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then",
        "  if command -v apt-get >/dev/null; then",
        "    as_root apt-get -o DPkg::Lock::Timeout=300 update -q",
        "    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q python3-venv",
        "  elif command -v dnf >/dev/null; then as_root dnf install -y -q python3-pip; fi",
        "fi",
        f"rm -rf {ENV_DIR}",
        *_new_env_function(flags),
        f"if python3 -c 'import sys; sys.exit(sys.version_info[:2] != ({major}, {minor}))'; then",
        f"  new_env {ENV_DIR} {requirement}",
        "else",  # uv finds (or fetches) a Python of the client's version and installs (a tenth of pip's time)
        "  new_env uv-env uv",
        f"  uv-env/bin/uv venv --quiet --python {shlex.quote(f'{major}.{minor}')} {ENV_DIR}",
        # pip too: the node installs jobs' packages with it
        f"  uv-env/bin/uv pip install --quiet --python {ENV_DIR}/bin/python {flags} pip {requirement}",
        "fi",
        *(_container_lines(image) if image else []),
        f"echo {tag} > {INSTALLED_MARKER}",
        "",
    ])


def scrub_script(power_off_after_s: float, preparation: str = "") -> str:
    """Run on an image builder once the bootstrap installed the node runtime, before its disk is
    imaged: nothing of a cluster stays in the image (no token, certificate, logs, or the cluster's
    SSH key: new VMs get their own key from the cloud, and cloud-init makes new host keys per
    instance), the builder powers itself off should its head not delete it, and last the cloud's
    own `preparation` runs (`as_root` is defined for it)."""
    return "\n".join([
        f'B="$HOME/{HOME_DIR}"',
        f'rm -rf "$B/{CONFIG_DIR}" "$B/{HEAD_CERT_FILE}" "$B/{HEAD_URL_FILE}" "$B/{NODE_LOG_FILE}" '
        f'"$B/{SUPERVISOR_PID_FILE}" "$B/{SCRIPT_FILE}" "$B/{WHEELHOUSE_DIR}" "$B/{BUILD_DIR}" "$B/uv-env"',
        '[ ! -f "$HOME/.ssh/authorized_keys" ] || : > "$HOME/.ssh/authorized_keys"',
        'as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }',
        f"as_root systemd-run --unit={DEAD_MAN_UNIT}-builder --on-active={max(1, int(power_off_after_s))}s "
        "/usr/sbin/shutdown -h now",
        *([f"{{ {preparation}; }} || exit 1"] if preparation else []),  # an image it did not prepare fails its VMs
        "sync",
        "echo scrubbed",
    ])


def _container_lines(image: str) -> list[str]:
    """Docker (installed if the image lacks it, usable by the login user) and the job's image."""
    return [
        "if ! command -v docker >/dev/null; then",
        "  if command -v apt-get >/dev/null; then",
        "    as_root apt-get -o DPkg::Lock::Timeout=300 update -q",
        "    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q docker.io",
        "  else as_root dnf install -y -q docker; fi",
        "fi",
        "as_root systemctl start docker",
        f"as_root docker pull --quiet {shlex.quote(image)}",
    ]


def supervise_command(join_args: list[str], orphan_timeout_s: float, image: str | None = None,
                      gpu: bool = False) -> str:
    """A shell command that starts `burla node join` under its supervisor, detached from the SSH
    session, unless a supervisor already runs (a reconnect runs it again)."""
    supervise = [f"$B/{ENV_DIR}/bin/burla", "node", "supervise", "--orphan-timeout", f"{orphan_timeout_s:g}"]
    if image is not None:
        supervise += ["--image", image] + (["--gpus"] if gpu else [])
    supervise += ["--", *join_args]
    quoted = shell_words(supervise)
    return "\n".join([
        f'B="$HOME/{HOME_DIR}"',
        'cd "$B"',
        CANCEL_DEAD_MAN,
        f'if [ -f {SUPERVISOR_PID_FILE} ] && kill -0 "$(cat {SUPERVISOR_PID_FILE})" 2>/dev/null; then',
        "  echo already running; exit 0",
        "fi",
        f'BURLA_CONFIG_DIR="$B/{CONFIG_DIR}" setsid nohup {quoted} >> {NODE_LOG_FILE} 2>&1 < /dev/null &',
        f"echo $! > {SUPERVISOR_PID_FILE}",
        "echo started",
    ])
