"""The client's config files: read again only when they change (a client reads them before every job)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from burla.config import (
    ClientSettings,
    Deployment,
    HeadRecord,
    load_or_create_token,
    read_config_file,
    read_token,
    write_private_file,
)


def _counting_reads(monkeypatch) -> list[Path]:
    reads: list[Path] = []
    read_text = Path.read_text

    def counted(self: Path, *args, **kwargs) -> str:
        reads.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    return reads


def test_an_unchanged_file_is_read_once_and_every_change_is_seen(tmp_path, monkeypatch):
    monkeypatch.setattr("burla.config.RACY_S", -1.0)  # as if every file had been written long ago
    reads = _counting_reads(monkeypatch)
    path = tmp_path / "cluster_token"
    write_private_file(path, "first\n")
    assert read_token(tmp_path) == "first"
    assert read_token(tmp_path) == "first"
    assert reads == [path]
    write_private_file(path, "secnd\n")  # replaced whole, same size: a new inode
    assert read_token(tmp_path) == "secnd"
    with open(path, "w") as f:  # edited in place, same size
        f.write("third\n")
    info = os.stat(path)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))  # as a later edit would stamp it
    assert read_token(tmp_path) == "third"
    assert len(reads) == 3
    path.unlink()
    assert read_token(tmp_path) is None
    with pytest.raises(FileNotFoundError):
        read_config_file(path)


def test_a_file_changed_moments_ago_is_read_every_time(tmp_path, monkeypatch):
    # Within a tick of the filesystem's clock an edit in place can keep the file's times and size.
    reads = _counting_reads(monkeypatch)
    path = tmp_path / "cluster_token"
    write_private_file(path, "first\n")
    assert read_token(tmp_path) == "first"
    with open(path, "r+") as f:  # same size, same inode, maybe the same times
        f.write("again\n")
    assert read_token(tmp_path) == "again"
    assert len(reads) == 2


def test_settings_and_the_head_record_follow_their_files(tmp_path, monkeypatch):
    monkeypatch.setenv("BURLA_CONFIG_DIR", str(tmp_path))
    for name in ("BURLA_CLUSTER_DASHBOARD_URL", "BURLA_CLUSTER_TOKEN", "BURLA_HEAD_CERT", "BURLA_CLOUD"):
        monkeypatch.delenv(name, raising=False)
    write_private_file(tmp_path / "cluster_token", "local-token\n")
    assert ClientSettings.resolve().head_url is None
    deployment = Deployment("aws", "head-1", "https://head.example.com", str(tmp_path / "head.pem"), "deployed-token")
    deployment.write(tmp_path)
    settings = ClientSettings.resolve()
    assert (settings.head_url, settings.token, settings.head_cert) == (
        "https://head.example.com", "deployed-token", str(tmp_path / "head.pem"))
    Deployment.remove(tmp_path)
    settings = ClientSettings.resolve()
    assert (settings.head_url, settings.token, settings.head_cert) == (None, "local-token", None)
    HeadRecord("http://127.0.0.1:5001", 111).write(tmp_path)
    assert HeadRecord.read(tmp_path) == HeadRecord("http://127.0.0.1:5001", 111)
    HeadRecord("http://127.0.0.1:5002", 222).write(tmp_path)  # a new head, same length
    assert HeadRecord.read(tmp_path) == HeadRecord("http://127.0.0.1:5002", 222)


def test_clients_that_make_the_token_at_once_all_get_the_same_one(tmp_path):
    """Scripts started together each find no token; they must agree on one, or the head one of
    them starts refuses the others (a replace-on-write let the last writer win)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with context.Pool(6) as pool:
        tokens = pool.map(load_or_create_token, [tmp_path] * 24)
    assert len(set(tokens)) == 1 and read_token(tmp_path) == tokens[0]
    assert [p.name for p in tmp_path.iterdir()] == ["cluster_token"]  # no temporary file left behind
    assert (tmp_path / "cluster_token").stat().st_mode & 0o777 == 0o600


def test_a_file_written_without_replace_keeps_what_was_there(tmp_path):
    path = tmp_path / "cluster_token"
    assert write_private_file(path, "first\n", replace=False)
    assert not write_private_file(path, "second\n", replace=False)
    assert read_token(tmp_path) == "first"
