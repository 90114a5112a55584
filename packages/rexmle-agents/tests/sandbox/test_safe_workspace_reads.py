"""Reading and copying out of a workspace (an external agent's logs, its tree file) without following links."""

from __future__ import annotations

import os
from pathlib import Path

from rexmle_agents.safe_workspace import CopyLimits, Workspace


def planted(tmp_path: Path) -> tuple[Workspace, Path]:
    ws = tmp_path / "ws"
    (ws / "logs" / "sub" / "deeper").mkdir(parents=True)
    (ws / "logs" / "a.txt").write_text("a")
    (ws / "logs" / "sub" / "b.txt").write_text("bb")
    (ws / "logs" / "sub" / "deeper" / "c.txt").write_text("ccc")
    canary = tmp_path / "canary"
    canary.write_text("host")
    os.symlink(canary, ws / "logs" / "link.txt")
    os.symlink(tmp_path, ws / "logs" / "dirlink")
    os.mkfifo(ws / "logs" / "fifo")
    return Workspace(ws), canary


def copied(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_copy_out_takes_the_regular_files_of_a_tree_and_refuses_links_and_special_files(tmp_path: Path) -> None:
    fs, canary = planted(tmp_path)
    got = fs.copy_out("logs", tmp_path / "out")
    assert copied(tmp_path / "out") == ["a.txt", "sub/b.txt", "sub/deeper/c.txt"]
    reasons = "\n".join(got.refused)
    assert got.n_refused == 3 and "'link.txt' is a symbolic link" in reasons and "'fifo' is a FIFO" in reasons
    assert "'dirlink' is a symbolic link" in reasons and not (tmp_path / "out" / "dirlink").exists()  # not entered
    assert (got.files, got.bytes) == (3, 6) and canary.read_text() == "host"


def test_copy_out_is_bounded_in_depth_files_and_bytes(tmp_path: Path) -> None:
    fs, _ = planted(tmp_path)
    got = fs.copy_out("logs", tmp_path / "o1", limits=CopyLimits(max_depth=1))
    assert copied(tmp_path / "o1") == ["a.txt", "sub/b.txt"] and "nested deeper than 1" in "\n".join(got.refused)
    got = fs.copy_out("logs", tmp_path / "o2", limits=CopyLimits(max_files=2))
    assert got.files == 2 and "more than 2 files" in "\n".join(got.refused)
    got = fs.copy_out("logs", tmp_path / "o3", limits=CopyLimits(max_total_bytes=3))
    assert got.bytes <= 3 and "would bring" in "\n".join(got.refused)


def test_copy_out_of_one_file_and_of_what_is_not_there(tmp_path: Path) -> None:
    fs, _ = planted(tmp_path)
    fs.copy_out("logs/sub/b.txt", tmp_path / "one")
    assert copied(tmp_path / "one") == ["b.txt"]
    got = fs.copy_out("logs/dirlink/canary", tmp_path / "none")
    assert got.folder is None and "does not exist" in got.refused[0]


def test_read_bytes_and_stat_never_follow_links(tmp_path: Path) -> None:
    fs, _ = planted(tmp_path)
    assert fs.read_bytes("logs/a.txt", max_bytes=10) == b"a"
    assert fs.read_bytes("logs/link.txt", max_bytes=10) is None  # a link to a host file
    assert fs.read_bytes("logs/fifo", max_bytes=10) is None  # and no hang on a FIFO
    assert fs.read_bytes("logs/sub/b.txt", max_bytes=1) is None  # over the bound
    assert fs.read_bytes("logs/dirlink/canary", max_bytes=10) is None  # through a linked folder
    assert fs.stat("logs/link.txt") is not None and fs.stat("logs/dirlink/canary") is None
