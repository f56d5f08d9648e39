"""Stand-ins for cloud VMs: each an SSH server on 127.0.0.1 (asyncssh's) whose commands run in a
home directory of its own with a clean environment, so the head's real bootstrap runs through it:
SFTP uploads, the install from the uploaded wheel, the supervised node, the remote port forward.
The farms that give a cloud API's instances their stand-ins are in `tests.support.clouds.vm_farms`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

SHIMS = {
    # Cloud images let the login user run root commands through passwordless sudo...
    # (STANDIN_NO_SUDO: an image whose login user has no such right, as sudo -n answers then.)
    "sudo": '#!/bin/sh\n[ -n "$STANDIN_NO_SUDO" ] && { echo "sudo: a password is required" >&2; exit 1; }\n'
            '[ "$1" = "-n" ] && shift\nSTANDIN_ROOT=1 exec "$@"\n',
    # ...and that user is not root (even when the tests run as root): root is what sudo gives.
    "id": '#!/bin/sh\nif [ "$1" = -u ] && [ "$STANDIN_ROOT" != 1 ]; then echo 1000; else exec /usr/bin/id "$@"; fi\n',
    # Powering off: recorded; the farm turns it into what the cloud does on shutdown.
    "shutdown": '#!/bin/sh\necho "$@" >> "$HOME/../powered-off"\n',
    # The VM's network is this machine's loopback: its private address is 127.0.0.1.
    "hostname": '#!/bin/sh\nif [ "$1" = "-I" ]; then echo 127.0.0.1; else exec /bin/hostname "$@"; fi\n',
}


@dataclass(frozen=True)
class StandinImage:
    """What a stock cloud image offers the bootstrap, as far as it matters to it."""

    name: str
    python_minor: str | None  # the minor version its python3 is (None: the tests' own interpreter's)
    venv_package: str | None  # what the package manager must install before `python3 -m venv` works
    package_manager: str  # "apt-get" or "dnf"
    gpu_driver: bool = False  # has the NVIDIA driver: nvidia-smi lists the machine's GPUs
    azure_agent: bool = False  # has Azure's Linux guest agent (waagent), as Azure's images do


# Amazon Linux 2023 ships Python 3.9 with venv, and dnf.
#   https://docs.aws.amazon.com/linux/al2023/ug/python.html
# Debian 12 ships Python 3.11; venv's ensurepip is in the python3-venv package, not installed.
#   https://packages.debian.org/bookworm/python3-venv
# Ubuntu 24.04 ships Python 3.12, without python3-venv likewise.
#   https://packages.ubuntu.com/noble/python3-venv
AL2023 = StandinImage("al2023", "3.9", None, "dnf")
DEBIAN_12 = StandinImage("debian-12", "3.11", "python3-venv", "apt-get")
UBUNTU_2404 = StandinImage("ubuntu-24.04", "3.12", "python3-venv", "apt-get")
# AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023): AL2023 with the driver.
#   https://docs.aws.amazon.com/dlami/latest/devguide/aws-deep-learning-base-gpu-ami-amazon-linux-2023.html
DLAMI_BASE = StandinImage("dlami-base-al2023", "3.9", None, "dnf", gpu_driver=True)
# Google's Deep Learning VM image (Ubuntu 22.04, Python 3.10) with the NVIDIA driver installed.
#   https://cloud.google.com/deep-learning-vm/docs/images
GCE_DLVM = StandinImage("gce-dlvm-ubuntu-2204", "3.10", "python3-venv", "apt-get", gpu_driver=True)
# Microsoft's Ubuntu-HPC 22.04 image for Azure GPU sizes, with the NVIDIA driver and CUDA.
#   https://learn.microsoft.com/azure/virtual-machines/configure
AZURE_UBUNTU_HPC = StandinImage("azure-ubuntu-hpc-2204", "3.10", "python3-venv", "apt-get", gpu_driver=True,
                                azure_agent=True)
# Ubuntu 24.04 as Canonical publishes it on Azure: with the guest agent (walinuxagent).
#   https://learn.microsoft.com/azure/virtual-machines/extensions/agent-linux
AZURE_UBUNTU_2404 = StandinImage("azure-ubuntu-24.04", "3.12", "python3-venv", "apt-get", azure_agent=True)
# Azure's guest agent, as far as imaging goes: `-deprovision` readies the machine to be generalized
# (host keys, hostname, leases go) and `-deprovision+user` also deletes the last provisioned user
# and its home directory; root only. https://learn.microsoft.com/azure/virtual-machines/linux/capture-image-resource
_WAAGENT = ('#!/bin/sh\n[ "$STANDIN_ROOT" = 1 ] || { echo "waagent: must be run as root" >&2; exit 1; }\n'
            'case "$*" in *-deprovision+user*) rm -rf "$HOME" && mkdir "$HOME";; *-deprovision*) ;; '
            '*) exit 0;; esac\ntouch "$HOME/../deprovisioned"\n')

_NO_ENSUREPIP = "raise ModuleNotFoundError(\"No module named 'ensurepip'\")\n"
_DEBIAN_VENV_ERROR = ("The virtual environment was not created successfully because ensurepip is not\n"
                      "available.  On Debian/Ubuntu systems, you need to install the python3-venv\n"
                      "package using the following command.\n\n    apt install python3-venv\n")


def find_python(minor: str) -> str | None:
    """An interpreter of this minor version on this machine (PATH, then pyenv's versions), if any."""
    import glob
    import shutil
    import subprocess

    if f"{sys.version_info[0]}.{sys.version_info[1]}" == minor:
        return sys.executable
    found = shutil.which(f"python{minor}")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return found
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        for candidate in sorted(glob.glob(f"{root}/versions/{minor}.*/bin/python{minor}"), reverse=True):
            return candidate
    return None


class LoopThread:
    """An event loop in a daemon thread, for servers the (synchronous) tests keep running."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vm-standins", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _forward_request(vm: StandinVm, conn: asyncssh.SSHServerConnection, host: str, port: int) -> Any:
    """A VM's sshd answering a remote forward request (RFC 4254 §7.1 "tcpip-forward")."""
    if vm.refuse_forwards:
        vm.refuse_forwards -= 1 if vm.refuse_forwards > 0 else 0
        return False  # SSH_MSG_REQUEST_FAILURE
    if host not in ("127.0.0.1", "localhost"):  # remote forwards on the VM's loopback only
        return False
    return _open_forward(vm, conn, host, port)


async def _open_forward(vm: StandinVm, conn: asyncssh.SSHServerConnection, host: str, port: int) -> Any:
    """The forward's listener, as asyncssh opens it for `True`; why one could not be opened is
    kept, as sshd logs it (asyncssh only answers the request's failure)."""
    try:
        listener = await conn.forward_local_port(host, port, host, port)
    except OSError as e:
        vm.forward_failures.append(f"{host}:{port}: {e!r}")
        print(f"stand-in VM {vm.name}: remote forward {host}:{port} failed: {e!r}", file=sys.stderr, flush=True)
        raise
    vm.forward_ports.setdefault(conn, []).append(listener.get_port())
    return listener


class StandinVm:
    def __init__(self, root: Path, authorized_key: str, name: str, environment: dict[str, str] | None = None,
                 login_user: str | None = None, image: StandinImage | None = None, gpus: tuple[str, ...] = ()) -> None:
        self.root = root
        self.gpus = gpus  # the machine's GPUs (what nvidia-smi names them), seen only with the driver
        self.image = image  # None: python3 is the tests' own interpreter, with venv
        self.login_user = login_user  # the only user the image created (None: any name logs in)
        self.extra_environment = environment or {}  # what the VM's own identity provides (a role's credentials)
        self.name = name
        self.home = root / "home"
        self.shims = root / "shims"
        self.home.mkdir(parents=True, exist_ok=True)
        self.shims.mkdir(parents=True, exist_ok=True)
        self.installed = root / "installed"  # what the VM's package manager installed, one file each
        self.installed.mkdir(exist_ok=True)
        self.python = sys.executable
        self.uv_pythons: Path | None = None
        self.units = root / "units"  # systemd's transient units: NAME.pid while pending, NAME.stopped
        self.units.mkdir(exist_ok=True)
        shims = {**SHIMS, **self._systemd_shims()}
        if image is not None:
            shims.update(self._image_shims(image))
        for shim, text in shims.items():
            (self.shims / shim).write_text(text)
            (self.shims / shim).chmod(0o755)
        self.authorized_key = authorized_key
        self.public_key = asyncssh.import_public_key(authorized_key)
        # How many remote forward requests (RFC 4254 §7.1 "tcpip-forward") its sshd refuses before
        # it grants one: a port it could not bind, a busy daemon. -1: every one, as sshd does with
        # `AllowTcpForwarding no` or `local` (sshd_config(5); the default is yes).
        self.refuse_forwards = 0
        self.forward_failures: list[str] = []  # remote forwards granted whose listener could not be opened
        self.forward_ports: dict[asyncssh.SSHServerConnection, list[int]] = {}  # each connection's forwards
        self.stale_forwards: list[socket.socket] = []  # ports of dropped connections it has not noticed
        self.refused_users: list[str] = []
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self.logins: list[str] = []  # user names that logged in
        self.commands: list[str] = []
        self.children: set[subprocess.Popen] = set()  # commands running now
        # Threads that wait on commands: a tunnel's command runs as long as its tunnel.
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix=f"vm-{name}")
        self.port = 0
        self._server: asyncssh.SSHAcceptor | None = None

    def snapshot(self, into: Path) -> None:
        """What imaging this VM's disk keeps: its home directory and what its package manager
        installed (shims and timers belong to the running machine)."""
        for part in ("home", "installed"):
            shutil.copytree(self.root / part, into / part, symlinks=True, dirs_exist_ok=True)
        (into / "imaged-root").write_text(str(self.root))

    def restore(self, snapshot: Path) -> None:
        """This VM's disk made from an image: the snapshot's files. On a cloud every VM of an image
        has the same paths; here each VM has its own root, so text files and links naming the
        imaged VM's root are made to name this one (compiled and binary files keep theirs)."""
        old = (snapshot / "imaged-root").read_text()
        for part in ("home", "installed"):
            shutil.copytree(snapshot / part, self.root / part, symlinks=True, dirs_exist_ok=True)
        for path in self.home.rglob("*"):
            if path.is_symlink():
                target = os.readlink(path)
                if old in target:
                    path.unlink()
                    path.symlink_to(target.replace(old, str(self.root)))
            elif path.is_file() and path.suffix not in (".pyc", ".so") and path.stat().st_size < 4_000_000:
                data = path.read_bytes()
                if old.encode() not in data:
                    continue
                try:
                    text = data.decode()
                except UnicodeDecodeError:
                    continue
                path.write_text(text.replace(old, str(self.root)))

    def _systemd_shims(self) -> dict[str, str]:
        """`systemd-run --unit=U --on-active=Ns CMD` runs CMD after N s unless `systemctl stop
        U.timer` came first; both as root only, as on the images."""
        root_only = '[ "$STANDIN_ROOT" = 1 ] || { echo "Failed: Access denied" >&2; exit 4; }\n'
        run = ("#!/bin/sh\n" + root_only + "unit=run; delay=0\n"
               'while [ $# -gt 0 ]; do case "$1" in --unit=*) unit="${1#--unit=}";; '
               '--on-active=*) delay="${1#--on-active=}"; delay="${delay%s}";; -*) ;; *) break;; esac; shift; done\n'
               'program=$(basename "$1"); shift\n'
               f'( sleep "$delay"; [ -e "{self.units}/$unit.stopped" ] || "$program" "$@" ) '
               '>/dev/null 2>&1 </dev/null &\n'
               f'echo $! > "{self.units}/$unit.pid"\n')
        control = ("#!/bin/sh\n" + root_only +
                   f'if [ "$1" = stop ]; then touch "{self.units}/${{2%.timer}}.stopped"; fi\n')
        return {"systemd-run": run, "systemctl": control}

    async def run_user_data(self, script: str) -> None:
        """What cloud-init (or the guest agent) does at first boot: run the user data as root."""
        child = await asyncio.create_subprocess_exec(
            "/bin/bash", "-c", script, cwd="/", env={**self.environment(), "STANDIN_ROOT": "1"},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        await child.wait()

    def _image_shims(self, image: StandinImage) -> dict[str, str]:
        """The image's python3 (its own minor version where this machine has one, without ensurepip
        until its venv package is installed) and its package manager, which installs as root only."""
        self.python = find_python(image.python_minor or "") or sys.executable
        guard = ""
        if image.venv_package:
            blocked = self.root / "without-ensurepip"
            (blocked / "ensurepip").mkdir(parents=True, exist_ok=True)
            (blocked / "ensurepip" / "__init__.py").write_text(_NO_ENSUREPIP)
            marker = self.installed / image.venv_package
            guard = (f'if [ ! -e "{marker}" ]; then\n'
                     f'  case " $* " in *" -m venv "*) printf %s "{_DEBIAN_VENV_ERROR}"; exit 1;; esac\n'
                     f'  export PYTHONPATH="{blocked}"\n'
                     "fi\n")
        manager = (
            "#!/bin/sh\n"
            f'[ "$STANDIN_ROOT" = 1 ] || {{ echo "{image.package_manager}: permission denied (are you root?)" >&2; '
            "exit 100; }\n"
            'case "$*" in *install*) ;; *) exit 0;; esac\n'
            'skip=0; for word in "$@"; do [ $skip = 1 ] && { skip=0; continue; }; case "$word" in -o) skip=1;; '
            '-*|install) ;; *) '
            f'echo "installed $word" >> "{self.root}/package-log"; touch "{self.installed}/$word";; esac; done\n')
        if find_python(image.python_minor or "") is not None and self.python != sys.executable:
            # uv fetches a Python of the client's version on a real VM; here (no network) it finds
            # one where it looks, on PATH, as if fetched already.
            self.uv_pythons = self.root / "uv-pythons"
            self.uv_pythons.mkdir(exist_ok=True)
            minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
            link = self.uv_pythons / f"python{minor}"
            if not link.exists():
                link.symlink_to(sys.executable)
        shims = {"python3": f"#!/bin/sh\n{guard}exec {self.python} \"$@\"\n", image.package_manager: manager}
        if image.azure_agent:
            shims["waagent"] = _WAAGENT
        if image.gpu_driver and self.gpus:
            names = "".join(f"{name}\\n" for name in self.gpus)
            usage = "0, 0, 15360\\n" * len(self.gpus)
            shims["nvidia-smi"] = (f'#!/bin/sh\ncase "$*" in *--query-gpu=name*) printf "{names}";; '
                                   f'*--query-gpu=*) printf "{usage}";; *) echo "NVIDIA-SMI 550";; esac\n')
        return shims

    def authorized_keys(self) -> set[bytes]:
        """The keys ~/.ssh/authorized_keys authorises now (sshd's AuthorizedKeysFile, read per login)."""
        try:
            lines = (self.home / ".ssh" / "authorized_keys").read_text().splitlines()
        except OSError:
            return set()
        keys = set()
        for line in lines:
            if line.strip() and not line.startswith("#"):
                with contextlib.suppress(ValueError, asyncssh.KeyImportError):
                    keys.add(asyncssh.import_public_key(line.strip()).public_data)
        return keys

    @property
    def powered_off(self) -> bool:
        return (self.root / "powered-off").exists()

    async def start(self) -> int:
        # cloud-init's first boot of an instance: the cloud's key in the login user's authorized_keys
        # (this sshd reads that file at each login, as sshd does: a scrubbed builder takes no login).
        (self.home / ".ssh").mkdir(mode=0o700, exist_ok=True)
        (self.home / ".ssh" / "authorized_keys").write_text(self.authorized_key + "\n")
        vm = self

        class Server(asyncssh.SSHServer):
            def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                self._conn = conn
                vm.connections.add(conn)

            def connection_lost(self, exc: Exception | None) -> None:
                vm.connections.discard(self._conn)
                vm.forward_ports.pop(self._conn, None)

            def begin_auth(self, username: str) -> bool:
                vm.logins.append(username)
                return True

            def public_key_auth_supported(self) -> bool:
                return True

            def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
                # sshd: a user the image does not have is refused whatever key it offers.
                if vm.login_user is not None and username != vm.login_user:
                    vm.refused_users.append(username)
                    return False
                return key.public_data in vm.authorized_keys()

            def server_requested(self, listen_host: str, listen_port: int) -> Any:
                return _forward_request(vm, self._conn, listen_host, listen_port)

            def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
                return dest_host in ("127.0.0.1", "localhost")  # local forwards to the VM's loopback (sshd's default)

        self._server = await asyncssh.create_server(
            Server, "127.0.0.1", 0, server_host_keys=[self.host_key],
            process_factory=self._run, sftp_factory=lambda channel: asyncssh.SFTPServer(channel, chroot=self.home),
            encoding=None, allow_scp=False,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def environment(self) -> dict[str, str]:
        # An image's VM sees its own python3 only (and uv's Python); otherwise the tests' interpreter's.
        own = [str(self.uv_pythons)] if self.uv_pythons else []
        if self.image is None:
            own = [str(Path(sys.executable).parent)]
        path = os.pathsep.join([str(self.shims), *own, "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        # No package index: what the VM installs must come from what its head uploads.
        return {"HOME": str(self.home), "PATH": path, "LANG": "C.UTF-8", "PIP_NO_INDEX": "1",
                "USER": self.logins[-1] if self.logins else "root", **self.extra_environment}

    async def _run(self, process: asyncssh.SSHServerProcess) -> None:
        command = process.command or "true"
        self.commands.append(command)
        # A plain process waited on in threads, not an asyncio subprocess: a session cut while its
        # command runs (the VM deleted mid-bootstrap) leaves no pipe transport behind, and the
        # command itself (its own process group) dies with the VM. Its input is the session's, as
        # sshd gives it: a command may read it until the client sends EOF or goes away.
        child = subprocess.Popen(["/bin/bash", "-c", command], cwd=self.home, env=self.environment(),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
        self.children.add(child)
        loop = asyncio.get_running_loop()
        feeding = asyncio.create_task(self._feed(process, child))
        try:
            assert child.stdout is not None and child.stderr is not None
            await asyncio.gather(self._relay(child.stdout, process.stdout), self._relay(child.stderr, process.stderr))
            await loop.run_in_executor(self._threads, child.wait)
        finally:
            self.children.discard(child)
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
            for pipe in (child.stdin, child.stdout, child.stderr):
                with contextlib.suppress(OSError):
                    pipe.close()  # type: ignore[union-attr]
        with contextlib.suppress(OSError, asyncssh.Error):  # the client may be gone
            process.exit(child.returncode or 0)

    async def _relay(self, source: Any, sink: asyncssh.SSHWriter) -> None:
        """A command's output to its session as it comes, as sshd sends it."""
        loop = asyncio.get_running_loop()
        while chunk := await loop.run_in_executor(self._threads, source.read1, 65536):
            with contextlib.suppress(OSError, asyncssh.Error):  # the client may be gone; read on to the end
                sink.write(chunk)

    async def _feed(self, process: asyncssh.SSHServerProcess, child: subprocess.Popen) -> None:
        """The session's input into the command's, closed at the session's EOF."""
        assert child.stdin is not None
        loop = asyncio.get_running_loop()
        try:
            while data := await process.stdin.read(65536):
                await loop.run_in_executor(self._threads, child.stdin.write, data)
                await loop.run_in_executor(self._threads, child.stdin.flush)
        except (OSError, asyncssh.Error):
            pass  # the command stopped reading, or the session was cut
        finally:
            with contextlib.suppress(OSError):
                child.stdin.close()

    async def drop_connections(self, hold_forwards: bool = False) -> int:
        """Cut every SSH connection (as a network failure would); returns how many there were.
        hold_forwards: the sshd has not noticed (a client gone silent is only found out by its
        ClientAlive or TCP keepalives, sshd_config(5)), so the ports its remote forwards listen on
        stay taken."""
        connections = list(self.connections)
        held = [port for connection in connections for port in self.forward_ports.get(connection, [])]
        for connection in connections:
            connection.abort()
        for port in held if hold_forwards else ():
            self.stale_forwards.append(await _take_port(port))
        return len(connections)

    def node_process(self, timeout: float = 60.0):
        """The VM's `burla node join` process (the supervisor's child), as a psutil.Process."""
        import psutil

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError, psutil.Error):
                supervisor = psutil.Process(int((self.home / ".burla" / "supervisor.pid").read_text().strip()))
                for child in supervisor.children():
                    if "join" in child.cmdline():
                        return child
            time.sleep(0.1)
        raise TimeoutError(f"no node process on {self.name}")

    def kill_processes(self) -> None:
        """Everything the VM runs dies with it (each supervisor's session and its children)."""
        for pid_file in [*(self.home / ".burla").glob("*.pid"), *self.units.glob("*.pid")]:
            with contextlib.suppress(FileNotFoundError, ValueError):
                _kill_tree(int(pid_file.read_text().strip()))
        for child in list(self.children):  # commands still running over SSH
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)

    async def close_ssh(self) -> None:
        """Nothing listens on port 22 any more (the VM itself runs on)."""
        await self.drop_connections()
        for stale in self.stale_forwards:
            stale.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def stop(self) -> None:
        await self.close_ssh()
        self.kill_processes()
        # Each killed command's session ends (its output read to the end, the process reaped, its
        # pipes closed) before the VM is gone.
        deadline = time.monotonic() + 10
        while self.children and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._threads.shutdown(wait=False)



def _kill_tree(pid: int) -> None:
    """A process group (a supervisor's session), or else a process and its children (a timer's
    subshell, which leads no group)."""
    import psutil

    try:
        os.killpg(pid, signal.SIGKILL)
        return
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process = psutil.Process(pid)
        family = [*process.children(recursive=True), process]
    except psutil.Error:
        return
    for member in family:
        with contextlib.suppress(psutil.Error):
            member.kill()


async def _take_port(port: int, timeout: float = 10.0) -> socket.socket:
    """A listening socket on 127.0.0.1:port, once whatever held it let it go."""
    deadline = time.monotonic() + timeout
    while True:
        taken = socket.socket()
        # Connections it forwarded may linger in TIME_WAIT on the port; no other socket listens there.
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", port))
            taken.listen()
            return taken
        except OSError:
            taken.close()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
