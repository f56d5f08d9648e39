"""Large inputs passed by file when the client and the nodes share a machine, inline otherwise."""

from __future__ import annotations

import os
import pickle
import time

import pytest

from burla.process.locked_dirs import ORPHAN_UNLOCKED_S
from burla.protocol.values.input_files import (
    INPUT_FILE_MIN_BYTES,
    REFERENCE_PREFIX,
    InputFiles,
    files_root,
    host_id,
    mapped_input,
)
from burla.protocol.values.serialization import dumps
from tests.cluster_runner import LocalCluster
from tests.support import functions

BIG = INPUT_FILE_MIN_BYTES * 2


def test_large_inputs_go_by_file_and_each_file_goes_with_its_result(client):
    inputs = [b"a" * BIG, b"b" * BIG, b"c" * BIG, b"small"]
    seen = client.remote_parallel_map(functions.input_files_seen, inputs, spinner=False)
    assert [size for size, _, _ in seen] == [len(data) for data in inputs]
    # Large inputs are files while their calls run (none rides in the opening, which carries only
    # small first inputs); small ones always travel inline.
    for index in (0, 1, 2):
        assert str(index) in seen[index][2]
    assert "3" not in (seen[3][2] or [])
    root = files_root()
    assert root is not None and not [d for d in root.iterdir() if d.name.startswith(f"{os.getpid()}.")]


def test_the_embedded_cluster_passes_large_inputs_by_file(embedded_client):
    # Its node is still booting when the job opens: the head knows it boots on this machine.
    inputs = [b"a" * BIG, b"b" * BIG, b"c" * BIG]
    seen = embedded_client.remote_parallel_map(functions.input_files_seen, inputs, spinner=False)
    assert [size for size, _, _ in seen] == [BIG] * 3
    assert any(files and str(index) in files for index, (_, _, files) in enumerate(seen))


def test_a_node_on_another_machine_gets_its_inputs_inline(tmp_path):
    # A node that sees other files (here: another input-file directory) has another host id, so
    # the job's inputs go inline and the job runs on both nodes.
    with LocalCluster(tmp_path / "cluster", nodes=1, workers=1) as cluster:
        cluster.add_node("elsewhere", env={"BURLA_INPUT_FILES_DIR": str(tmp_path / "other-machine")})
        cluster.wait_for_nodes(2)
        inputs = [(bytes([i]) * BIG, 0.3) for i in range(12)]  # calls long enough for both nodes to get some
        seen = cluster.client().remote_parallel_map(functions.input_files_seen, inputs, spinner=False)
    assert [size for size, _, _ in seen] == [BIG] * 12
    other = tmp_path / "other-machine" / f"burla-inputs-{os.getuid()}"
    assert {root for _, root, _ in seen} == {str(files_root()), str(other)}
    assert all(files is None for _, _, files in seen)  # nothing was kept by file for this job


def test_the_host_id_is_one_per_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("BURLA_INPUT_FILES_DIR", str(tmp_path / "a"))
    first = host_id()
    assert first and host_id() == first
    assert (tmp_path / "a" / f"burla-inputs-{os.getuid()}" / "host-id").read_text() == first
    monkeypatch.setenv("BURLA_INPUT_FILES_DIR", str(tmp_path / "b"))
    assert host_id() not in ("", first)


def test_a_directory_others_can_enter_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("BURLA_INPUT_FILES_DIR", str(tmp_path))
    root = tmp_path / f"burla-inputs-{os.getuid()}"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    assert files_root() is None and host_id() == ""


def _load(reference: bytes):
    with mapped_input(reference) as pickled:
        return pickle.loads(pickled)


def test_files_of_clients_that_died_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("BURLA_INPUT_FILES_DIR", str(tmp_path))
    root = files_root()
    abandoned = root / "1.some-job"  # its lock file is there and nobody holds it: its client is gone
    abandoned.mkdir()
    (abandoned / ".lock").write_bytes(b"")
    (abandoned / "3").write_bytes(b"x")
    being_made = root / ".2.other-job.making"  # another client's, until it is locked and renamed
    being_made.mkdir()
    files = InputFiles(root, "mine")
    # The process's first job here clears what dead clients left; its own directory comes with its first file.
    assert not abandoned.exists() and not files.directory.exists() and being_made.exists()
    old_enough = time.time() - ORPHAN_UNLOCKED_S - 1
    os.utime(being_made, (old_enough, old_enough))  # a crash left it half made
    other = InputFiles(root, "alive")  # a live client's directory, whatever its process id says
    other.write(1, dumps("theirs"))
    abandoned.mkdir()  # another client dies meanwhile
    (abandoned / ".lock").write_bytes(b"")
    reference = files.write(7, dumps([1, 2, 3]))  # making a directory clears them too
    assert not abandoned.exists() and other.directory.exists() and files.directory.exists()
    assert not being_made.exists()
    assert reference == REFERENCE_PREFIX + f"{files.directory.name}/7".encode()  # relative to the root
    assert _load(reference) == [1, 2, 3]
    assert files.write(7, dumps("sent again")) == reference and _load(reference) == [1, 2, 3]  # never rewritten
    files.done(7)
    with pytest.raises(FileNotFoundError, match="passed by file"):
        _load(reference)
    files.close()
    other.close()
    assert not files.directory.exists() and not other.directory.exists()
    with pytest.raises(FileNotFoundError, match="were removed"):
        files.write(8, dumps("after the job"))
    assert not files.directory.exists()
    never_written = InputFiles(root, "small-inputs-only")
    never_written.close()
    assert sorted(path.name for path in root.iterdir() if not path.name.startswith(".")) == []


def test_a_reference_outside_the_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("BURLA_INPUT_FILES_DIR", str(tmp_path))
    (tmp_path / "secret").write_bytes(dumps("no"))
    with pytest.raises(FileNotFoundError, match="not in this machine's input-file directory"):
        _load(REFERENCE_PREFIX + b"../secret")


def test_inline_inputs_load_as_before():
    assert _load(dumps({"a": 1})) == {"a": 1}


def test_a_root_that_went_away_fails_only_the_files(tmp_path):
    # Say a logout cleared /dev/shm under a long-lived client: its next job still opens; its large
    # inputs then can't be files (the uploader sends them inline).
    files = InputFiles(tmp_path / "gone", "job")
    with pytest.raises(OSError):
        files.write(0, dumps(b"x"))
    files.close()
