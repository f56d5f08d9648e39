"""Large inputs passed by file when the client and the nodes share a machine, inline otherwise."""

from __future__ import annotations

import os
import pytest

from burla import remote_parallel_map
from burla.input_files import INPUT_FILE_MIN_BYTES, REFERENCE_PREFIX, InputFiles, files_root, host_id, load_input
from burla.serialization import dumps
from tests import functions
from tests.cluster_runner import LocalCluster
from tests.helpers import environment

BIG = INPUT_FILE_MIN_BYTES * 2


def test_large_inputs_go_by_file_and_each_file_goes_with_its_result(cluster):
    inputs = [b"a" * BIG, b"b" * BIG, b"c" * BIG, b"small"]
    seen = remote_parallel_map(functions.input_files_seen, inputs, spinner=False)
    assert [size for size, _, _ in seen] == [len(data) for data in inputs]
    # The first input travels with the opening, before the head says files are fine; the other
    # large ones are files while their calls run; small ones always travel inline.
    assert seen[0][2] is None or "0" not in seen[0][2]
    for index in (1, 2):
        assert str(index) in seen[index][2]
    assert "3" not in (seen[3][2] or [])
    root = files_root()
    assert root is not None and not [d for d in root.iterdir() if d.name.startswith(f"{os.getpid()}.")]


def test_a_node_on_another_machine_gets_its_inputs_inline(tmp_path):
    # A node that sees other files (here: another input-file directory) has another host id, so
    # the job's inputs go inline and the job runs on both nodes.
    with LocalCluster(tmp_path / "cluster", nodes=1, workers=1) as cluster, environment(**cluster.env()):
        cluster.add_node("elsewhere", env={"BURLA_INPUT_FILES_DIR": str(tmp_path / "other-machine")})
        cluster.wait_for_nodes(2)
        inputs = [bytes([i]) * BIG for i in range(12)]
        seen = remote_parallel_map(functions.input_files_seen, inputs, spinner=False)
    assert [size for size, _, _ in seen] == [BIG] * 12
    assert {root for _, root, _ in seen} == {str(files_root()), str(tmp_path / "other-machine" / f"burla-inputs-{os.getuid()}")}
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


def test_files_of_clients_that_died_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("BURLA_INPUT_FILES_DIR", str(tmp_path))
    root = files_root()
    abandoned = root / "999999999.some-job"  # no such process
    abandoned.mkdir()
    (abandoned / "3").write_bytes(b"x")
    files = InputFiles(root, "mine")
    assert not abandoned.exists() and files.directory.exists()
    reference = files.write(7, dumps([1, 2, 3]))
    assert reference.startswith(REFERENCE_PREFIX) and load_input(reference) == [1, 2, 3]
    files.done(7)
    with pytest.raises(FileNotFoundError, match="passed by file"):
        load_input(reference)
    files.close()
    assert not files.directory.exists()


def test_inline_inputs_load_as_before():
    assert load_input(dumps({"a": 1})) == {"a": 1}
