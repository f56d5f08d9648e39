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
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from burla.config import ENV_INPUT_FILES_DIR
from burla.process.locked_dirs import make_locked, remove_abandoned
from burla.protocol.values.pickle_parts import PickleParts

INPUT_FILE_MIN_BYTES = 1024 * 1024  # below this, the bytes travel inline (a file costs more than it saves)
REFERENCE_PREFIX = b"\x00burla-input-file:"  # never the start of a pickle (those begin with 0x80)
_HOST_ID_FILE = "host-id"
_roots: dict[str | None, Path | None] = {}  # BURLA_INPUT_FILES_DIR -> the directory found for it
_host_ids: dict[Path, str] = {}  # per directory (tests point processes at different ones)


def files_root() -> Path | None:
    """This user's directory for input files, or None if no private one can be had here (found
    once per setting: every job and every large input asks)."""
    chosen = os.environ.get(ENV_INPUT_FILES_DIR)
    if chosen not in _roots:
        _roots[chosen] = _find_root(chosen)
    return _roots[chosen]


def _find_root(chosen: str | None) -> Path | None:
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
    try:
        fd, candidate = tempfile.mkstemp(dir=root, prefix=f".{_HOST_ID_FILE}.")
    except OSError:
        return ""
    try:
        try:
            os.write(fd, os.urandom(16).hex().encode())
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(candidate, path)  # the first writer wins; everyone reads the winner's id
        return path.read_text().strip()
    except OSError:
        return ""
    finally:
        with contextlib.suppress(OSError):
            os.unlink(candidate)


def is_reference(data: bytes | memoryview) -> bool:
    return data[:1] == b"\x00" and bytes(data[:len(REFERENCE_PREFIX)]) == REFERENCE_PREFIX


@contextlib.contextmanager
def mapped_input(data: bytes | memoryview) -> Iterator[bytes | memoryview]:
    """An input's pickle: `data` itself, or its file mapped in memory when `data` is a reference
    (`path` relative to this machine's files_root(), resolved there and nowhere else)."""
    if not is_reference(data):
        yield data
        return
    root = files_root()
    relative = bytes(data[len(REFERENCE_PREFIX):]).decode(errors="replace")
    path = (root / relative).resolve() if root is not None else None
    if path is None or root is None or path.parent.parent != root.resolve():
        raise FileNotFoundError(f"this input was passed by file as {relative!r}, which is not in this machine's "
                                "input-file directory")
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
                yield view
            finally:
                view.release()
    finally:
        os.close(fd)


_swept: set[Path] = set()  # roots this process has cleared of abandoned job directories


class InputFiles:
    """A client's files for one job: written as inputs go out, removed as their results come back.

    The job's directory holds a lock file this process keeps locked: a directory whose lock can
    be taken belongs to a client that is gone (process ids don't tell, across containers). It is
    made with the first file: most jobs have no input large enough, and making and removing it
    was a tenth of a warm single-call job's client time."""

    def __init__(self, root: Path, job_id: str) -> None:
        if root not in _swept:  # the first job here that may pass files clears what dead clients left
            _swept.add(root)
            with contextlib.suppress(OSError):  # a root that went away: files fail later, and go inline
                remove_abandoned(root)
        self.root = root
        self.directory = root / f"{os.getpid()}.{job_id}"
        self._lock_fd = -1
        self._closed = False
        self._paths: dict[int, Path] = {}

    def _make_directory(self) -> None:
        """Raises OSError if it can't be made (then no file is written)."""
        remove_abandoned(self.root)
        self._lock_fd = make_locked(self.directory)

    def write(self, index: int, data: bytes | PickleParts) -> bytes:
        """Keep an input's pickle in a file; returns the reference to send in its place. An input
        written before (sent again after a head restart) keeps its file: a worker may be reading it."""
        path = self._paths.get(index)
        if path is None:
            if self._closed:
                raise FileNotFoundError(f"the input files of job {self.directory.name} were removed")
            if self._lock_fd < 0:
                self._make_directory()
            path = self.directory / str(index)
            partial = self.directory / f".{index}.partial"
            try:
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    for part in data.parts if isinstance(data, PickleParts) else (data,):
                        view = memoryview(part).cast("B")
                        while view:
                            view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
                os.replace(partial, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    partial.unlink()
                raise
            self._paths[index] = path
        return REFERENCE_PREFIX + f"{self.directory.name}/{index}".encode()

    @property
    def written(self) -> bool:
        """Whether any input's file is still here."""
        return bool(self._paths)

    def done(self, index: int) -> None:
        """The input's result is here: its file is no longer needed."""
        path = self._paths.pop(index, None)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def close(self) -> None:
        self._closed = True
        self._paths.clear()
        if self._lock_fd < 0:
            return  # never made (or closed already)
        shutil.rmtree(self.directory, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = -1
