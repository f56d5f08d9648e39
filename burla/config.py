"""Settings, resolved once at each process's edge and passed down as frozen dataclasses.

Only this module reads `BURLA_*` environment variables and the files in the user config
directory; everything else receives a settings object.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_CONFIG_DIR = "BURLA_CONFIG_DIR"
ENV_HEAD_URL = "BURLA_CLUSTER_DASHBOARD_URL"
ENV_TOKEN = "BURLA_CLUSTER_TOKEN"
ENV_PARENT_JOB = "BURLA_PARENT_JOB_ID"
# What a job's calls hold instead of the cluster token: it opens jobs nested in that job and reads
# that job's tree (burla.web.scoped_tokens). Workers never see BURLA_CLUSTER_TOKEN.
ENV_JOB_TOKEN = "BURLA_JOB_TOKEN"
ENV_NODE_ID = "BURLA_NODE_ID"  # set for a node's workers: a failed call says where it ran
ENV_CODE_ROOT = "BURLA_CODE_ROOT"  # set for a node's workers: where they unpack shipped modules (the node removes it)
ENV_CLOUD = "BURLA_CLOUD"
# "0" (or `burla config set background_head false`): a script with no head running starts one for
# itself that stops with it, instead of a background head that outlives it.
ENV_BACKGROUND_HEAD = "BURLA_BACKGROUND_HEAD"
# "0" (or `burla config set direct_inputs false`): large inputs always go through the head, never
# straight to the node that runs them (burla.protocol.direct_inputs).
ENV_DIRECT_INPUTS = "BURLA_DIRECT_INPUTS"
# "0" (or `burla config set direct_results false`): large results always come through the head,
# never straight from the node that made them (burla.protocol.direct_results).
ENV_DIRECT_RESULTS = "BURLA_DIRECT_RESULTS"
_NO = ("0", "false", "no", "off")
ENV_HEAD_CERT = "BURLA_HEAD_CERT"
ENV_NODE_INDEX_URL = "BURLA_NODE_INDEX_URL"
ENV_NODE_WHEELHOUSE = "BURLA_NODE_WHEELHOUSE"
ENV_SSH_ADDRESS_MAP = "BURLA_SSH_ADDRESS_MAP"
ENV_INPUT_FILES_DIR = "BURLA_INPUT_FILES_DIR"  # where large inputs go by file (default: /dev/shm or the temp dir)
CLIENT_CONFIG_FILE = "config.json"

TOKEN_FILE = "cluster_token"
HEAD_STATE_FILE = "head.json"
DEPLOYMENT_FILE = "deployment.json"
DEFAULT_HEAD_PORT = 5001

# Limits that are part of the public contract (see the user guide).
MAX_FUNCTION_BYTES = 100 * 1024 * 1024
# func_cpu="dynamic": a node may run up to this many calls per slot (worker per CPU) while they
# leave its CPUs idle (they wait on sleep, the network or a disk). See burla/node/governor.py.
MAX_CALLS_PER_SLOT = 8
MAX_INPUT_BYTES = 200 * 1024 * 1024
# func_ram's range, in GB: far beyond any machine above, and below a megabyte a call's share
# of a machine's memory stops meaning anything (and node RAM over it stops being a number).
MIN_RAM_GB_PER_CALL = 0.001
MAX_RAM_GB_PER_CALL = 1_000_000.0


def config_dir(environ: os._Environ | dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    override = env.get(ENV_CONFIG_DIR)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_config_dir("burla"))


def private_dir(path: Path) -> Path:
    """Create (or tighten) a directory only its owner can list and enter (0700): the config
    directory holds the token, keys and job history."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """Create (or tighten) a file only its owner can read and write (0600)."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
    return path


def write_private_file(path: Path, text: str, replace: bool = True) -> bool:
    """Write a file only its owner can read (0600), atomically. With `replace=False` an existing
    file is kept (no reader ever sees a half-written one either way); returns whether it wrote."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    if replace:
        os.replace(tmp, path)
        return True
    try:
        os.link(tmp, path)  # fails if the file exists: unlike rename, link never replaces
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


# path -> (what identifies the file's version, its text): see read_config_file.
_TEXTS: dict[Path, tuple[tuple[int, int, int, int], str]] = {}
# A file changed this recently is read every time: a filesystem's clock ticks coarsely (a few
# ms, up to seconds), so an edit in place within a tick of a read would keep its times and size.
RACY_S = 2.0


def read_config_file(path: Path) -> str:
    """A config file's text (raises FileNotFoundError or NotADirectoryError as reading would).

    A client reads several of these before every job; a file whose inode, size and change times
    are those of its last read, and which had not changed for RACY_S before that read, is not
    read again (files here are replaced whole, with a new inode; an edit in place changes its
    times)."""
    info = os.stat(path)
    version = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    cached = _TEXTS.get(path)
    if cached is not None and cached[0] == version:
        return cached[1]
    text = path.read_text()
    if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > RACY_S * 1e9:
        _TEXTS[path] = (version, text)
    else:
        _TEXTS.pop(path, None)
    return text


def load_or_create_token(directory: Path) -> str:
    """The machine's cluster token: read from the config directory, created there if absent."""
    path = directory / TOKEN_FILE
    try:
        token = read_config_file(path).strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    if not write_private_file(path, token + "\n", replace=False):
        return read_config_file(path).strip()  # a client started at the same moment made it first
    return token


def read_token(directory: Path) -> str | None:
    try:
        return read_config_file(directory / TOKEN_FILE).strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_client_config(directory: Path) -> dict:
    """`burla config set` values (config.json in the config directory); {} if none."""
    try:
        data = json.loads(read_config_file(directory / CLIENT_CONFIG_FILE))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Deployment:
    """A head `burla deploy` started in the user's cloud; clients use it unless told otherwise."""

    cloud: str
    head_id: str  # the head VM's name in the cloud
    head_url: str  # its public https URL
    head_cert: str  # the file holding its own certificate, which clients pin
    token: str
    region: str | None = None

    @classmethod
    def read(cls, directory: Path) -> Deployment | None:
        try:
            data = json.loads(read_config_file(directory / DEPLOYMENT_FILE))
            return cls(**{k: data[k] for k in ("cloud", "head_id", "head_url", "head_cert", "token")},
                       region=data.get("region"))
        except (FileNotFoundError, NotADirectoryError, ValueError, KeyError, TypeError):
            return None

    def write(self, directory: Path) -> None:
        import dataclasses

        write_private_file(directory / DEPLOYMENT_FILE, json.dumps(dataclasses.asdict(self), indent=2))

    @staticmethod
    def remove(directory: Path) -> None:
        try:
            (directory / DEPLOYMENT_FILE).unlink()
        except FileNotFoundError:
            pass


_UNREAD: Any = object()


def head_cert_file(directory: Path, deployment: Deployment | None = _UNREAD) -> str | None:
    """The certificate clients pin for their head: BURLA_HEAD_CERT, else the deployment's
    (`deployment`: the one read already, None if there is none)."""
    if deployment is _UNREAD:
        deployment = Deployment.read(directory)
    return os.environ.get(ENV_HEAD_CERT) or (deployment.head_cert if deployment else None)


@dataclass(frozen=True)
class HeadRecord:
    """What a long-lived head advertises in the config directory so clients can reuse it."""

    url: str
    pid: int

    @classmethod
    def read(cls, directory: Path) -> HeadRecord | None:
        try:
            data = json.loads(read_config_file(directory / HEAD_STATE_FILE))
            return cls(url=str(data["url"]), pid=int(data["pid"]))
        except (FileNotFoundError, NotADirectoryError, ValueError, KeyError, TypeError):
            return None

    def write(self, directory: Path) -> None:
        write_private_file(directory / HEAD_STATE_FILE, json.dumps({"url": self.url, "pid": self.pid}))

    @staticmethod
    def remove_if_owned(directory: Path, pid: int) -> None:
        record = HeadRecord.read(directory)
        if record is not None and record.pid == pid:
            try:
                (directory / HEAD_STATE_FILE).unlink()
            except FileNotFoundError:
                pass


@dataclass(frozen=True)
class ClientSettings:
    config_dir: Path
    head_url: str | None  # explicit head (env); None means "find or start a local one"
    token: str | None
    parent_job_id: str | None
    cloud: str | None = None  # where heads this client starts boot nodes (None: this machine)
    head_cert: str | None = None  # an https head's pinned certificate (BURLA_HEAD_CERT)
    background_head: bool = True  # with no head running, start one that outlives this process
    direct_inputs: bool = True  # large inputs may go straight to their nodes, where the head allows
    direct_results: bool = True  # large results may come straight from their nodes, where the head allows

    @classmethod
    def resolve(cls) -> ClientSettings:
        directory = config_dir()
        cloud = os.environ.get(ENV_CLOUD) or read_client_config(directory).get("cloud")
        head_url = os.environ.get(ENV_HEAD_URL) or None
        token = os.environ.get(ENV_TOKEN) or os.environ.get(ENV_JOB_TOKEN)
        deployment = Deployment.read(directory)
        if head_url is None and deployment is not None:  # the head `burla deploy` started
            head_url, token = deployment.head_url, token or deployment.token
        token = token or read_token(directory)
        return cls(
            config_dir=directory,
            head_url=head_url.rstrip("/") if head_url else None,
            token=token,
            parent_job_id=os.environ.get(ENV_PARENT_JOB) or None,
            cloud=cloud if isinstance(cloud, str) else None,
            head_cert=head_cert_file(directory, deployment),
            background_head=_switch(ENV_BACKGROUND_HEAD, "background_head", directory),
            direct_inputs=_switch(ENV_DIRECT_INPUTS, "direct_inputs", directory),
            direct_results=_switch(ENV_DIRECT_RESULTS, "direct_results", directory),
        )


def _switch(env: str, key: str, directory: Path) -> bool:
    """A setting that is on unless its environment variable (or else the config file) says no."""
    value = os.environ.get(env)
    if value is None:
        value = str(read_client_config(directory).get(key, "true"))
    return value.strip().lower() not in _NO


@dataclass(frozen=True)
class HeadSettings:
    host: str
    port: int | None  # None: the default port if free, else an ephemeral one
    token: str
    config_dir: Path
    local_nodes: int = 0
    local_node_workers: int | None = None
    advertise: bool = True  # write head.json so clients reuse this head
    ready_fd: int | None = None  # write "URL\n" here once serving
    lifeline_fd: int | None = None  # exit when this pipe reaches EOF (the parent died)
    node_deadline_s: float = 30.0  # a node silent this long is dropped
    history_path: Path | None = Path("history.db")  # None: keep no history
    history_retention_days: float = 30.0
    inactivity_timeout_s: float | None = None  # remove nodes idle this long (None: keep them)
    client_deadline_s: float = 10.0  # a job's client may be away this long before it is cancelled
    boot_deadline_s: float = 900.0  # a node not registered this long after its driver started it is deleted
    version: str = ""
    cloud: Any = None  # the cloud driver's config (e.g. drivers.ec2.Ec2Config); None: local nodes only
    tls_cert: Path | None = None  # serve https with this certificate and key
    tls_key: Path | None = None
    public_url: str | None = None  # how clients and nodes reach this head ("{port}": the bound port)
    keep_nodes: bool = False  # leave cloud VMs running when this head stops (else it deletes them)
    node_link: str = "tunnel"  # cloud nodes reach the head through an SSH tunnel, or "direct" at its URL
    orphan_timeout_s: float = 600.0  # a cloud node that can't reach its head this long powers its VM off
    node_index_url: str | None = None  # where VMs get burla's dependencies (default: pip's own index)
    node_wheelhouse: Path | None = None  # or only from these wheels, uploaded to every VM
    ssh_address_map: Path | None = None  # JSON {vm address: "host:port"} to dial instead (stand-in VMs)
    tunnel_program: str | None = None  # OpenSSH's client carrying the tunnels (None: asyncssh, in the head)
    header_timeout_s: float = 30.0  # a connection must send a whole request head within this
    max_open_jobs: int = 4096  # jobs running at once (burla.head.budget)
    max_client_connections: int = 4096  # job connections per credential
    max_tree_jobs: int = 256  # open jobs nested under one top-level job (burla.head.budget)
    max_tree_mb: int = 512  # bytes those may hold on the head


@dataclass(frozen=True)
class NodeSettings:
    head_url: str
    token: str
    workers: int
    node_id: str
    host: str = "127.0.0.1"
    cpus: int = 1
    ram_gb: float = 1.0
    gpu: str | None = None
    gpu_count: int = 0
    image: str | None = None
    region: str = "local"
    lifeline_fd: int | None = None
    python_version: str = field(default_factory=lambda: f"{sys.version_info[0]}.{sys.version_info[1]}")
    version: str = ""
    register_deadline_s: float = 60.0  # give up if the head can't be reached for this long
    port: int = 0  # the node's HTTP port (peers steal through it); 0 picks a free one
    advertise_url: str | None = None  # the URL peers should use, if not http://host:port
    advertise_host: str | None = None  # the address peers should use with the bound port (a VM's private one)
    memory_budget_gb: float = 1.0  # what all workers together may use before calls are stopped
    steal_ack_timeout_s: float = 5.0  # a transfer not acknowledged this long returns to its donor
    head_cert: str | None = None  # the head's pinned certificate (an https head with a self-signed one)
    head_url_file: str | None = None  # re-read before each connection: the head URL now (a moved SSH tunnel)
    host_id: str = ""  # input_files.host_id() where workers can open clients' input files ("" in a container)
    source_builds: bool = False  # replicating a client's packages may build source distributions (runs their code)
