"""Large inputs passed by file between processes of one machine.

When the client and every node of a job run on the same machine (the embedded local cluster, or
`burla head serve --local-nodes N`), an input of INPUT_FILE_MIN_BYTES or more skips the head and
the node altogether: the client writes its pickle to a file in a private directory in memory
(`/dev/shm` where there is one) and sends a reference, which the worker maps and unpickles. The
file is removed once the input's result is back, or when the job ends.

Whether two processes may share such files is decided by construction, not by guessing: each
machine (as a user sees it: same files, same user) keeps a random host id in a file inside the
very directory the inputs go to. A node that reads the same host id as the client reads the
same directory, so it can open the client's files; anything else gets the bytes inline.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from burla.config import ENV_INPUT_FILES_DIR
from burla.processes import pid_alive
from burla.serialization import loads

INPUT_FILE_MIN_BYTES = 1024 * 1024  # below this, the bytes travel inline (a file costs more than it saves)
REFERENCE_PREFIX = b"\x00burla-input-file:"  # never the start of a pickle (those begin with 0x80)
_HOST_ID_FILE = "host-id"
_host_ids: dict[Path, str] = {}  # per directory (tests point processes at different ones)


def files_root() -> Path | None:
    """This user's directory for input files, or None if no private one can be had here."""
    chosen = os.environ.get(ENV_INPUT_FILES_DIR)
    if chosen:
        base = Path(chosen)
    elif os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        base = Path("/dev/shm")  # in memory: nothing is written to a disk
    else:
        base = Path(tempfile.gettempdir())
    root = base / f"burla-inputs-{os.getuid()}"
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(root)
    except OSError:
        return None
    # A shared temporary directory: someone else may have made it first. Only our own, private
    # directory will do.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return root


def host_id() -> str:
    """The id of this machine as this user's processes see it ("" when files can't be shared)."""
    root = files_root()
    if root is None:
        return ""
    if root not in _host_ids:
        _host_ids[root] = _read_or_create_host_id(root)
    return _host_ids[root]


def _read_or_create_host_id(root: Path) -> str:
    path = root / _HOST_ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    except OSError:
        return ""
    candidate = root / f".{_HOST_ID_FILE}.{os.getpid()}"
    try:
        candidate.write_text(secrets.token_hex(16))
        with contextlib.suppress(FileExistsError):
            os.link(candidate, path)  # the first writer wins; everyone reads the winner's id
        return path.read_text().strip()
    except OSError:
        return ""
    finally:
        with contextlib.suppress(OSError):
            candidate.unlink()


def is_reference(data: bytes) -> bool:
    return data[:1] == b"\x00" and data.startswith(REFERENCE_PREFIX)


def load_input(data: bytes) -> Any:
    """Unpickle an input, reading it from its file when it was passed by reference."""
    if not is_reference(data):
        return loads(data)
    path = data[len(REFERENCE_PREFIX):].decode()
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"this input was passed by file at {path}, which is gone: its client ended the job (or removed it)"
        ) from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise EOFError(f"the input file {path} is empty")
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return loads(view)
            finally:
                view.release()
    finally:
        os.close(fd)


class InputFiles:
    """A client's files for one job: written as inputs go out, removed as their results come back."""

    def __init__(self, root: Path, job_id: str) -> None:
        _remove_abandoned(root)
        self.directory = root / f"{os.getpid()}.{job_id}"
        self.directory.mkdir(mode=0o700)
        self._paths: dict[int, Path] = {}

    def write(self, index: int, data: bytes) -> bytes:
        """Keep an input's pickle in a file; returns the reference to send in its place."""
        path = self.directory / str(index)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        self._paths[index] = path
        return REFERENCE_PREFIX + str(path).encode()

    def done(self, index: int) -> None:
        """The input's result is here: its file is no longer needed."""
        path = self._paths.pop(index, None)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def close(self) -> None:
        self._paths.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


def _remove_abandoned(root: Path) -> None:
    """Directories of clients that died without cleaning up (named `pid.job_id`)."""
    for entry in root.iterdir():
        pid, _, job_id = entry.name.partition(".")
        if not (pid.isdigit() and job_id) or pid_alive(int(pid)):
            continue
        shutil.rmtree(entry, ignore_errors=True)
