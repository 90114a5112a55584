"""The safe workspace module on its own, with what agent code could plant made by plain system calls (no sandbox):
links to host files and folders at every name the harness touches, FIFOs, sockets, hard links, setuid files,
sparse files and trees deeper than the harness walks. What it must do: never follow, densify or leak, and say why."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from rexmle_agents import safe_workspace
from rexmle_agents.safe_workspace import (
    DISCARDED_PREFIX,
    MAX_DEPTH,
    MAX_PATH_CHARS,
    CopyLimits,
    Workspace,
    WorkspaceRefused,
    copy_extents,
    relative_parts,
)

MiB = 1024 * 1024
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving folders to another user needs root (CI has it)")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "submission").mkdir(parents=True)
    (root / "working").mkdir()
    return root


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host folder outside the workspace that planted links point at; it must never change."""
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "canary.txt").write_text("host canary")
    return folder


def host_unchanged(host: Path) -> bool:
    return sorted(p.name for p in host.iterdir()) == ["canary.txt"] and (host / "canary.txt").read_text() == \
        "host canary"


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def nest(base: Path, levels: int, name: str = "d") -> Path:
    deepest = base.joinpath(*[name] * levels)
    deepest.mkdir(parents=True)
    return deepest


def umasked(mode: int) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


def submission(ws: Path, rows: list[str], *, header: str = "case,pred") -> Path:
    sub = ws / "submission"
    lines = [header, *(f"c{i},{name}" for i, name in enumerate(rows))]
    (sub / "submission.csv").write_text("\n".join(lines) + "\n")
    return sub


def collect(ws: Path, dest: Path, limits: CopyLimits | None = None, columns: tuple[str, ...] = ("pred",)):
    return Workspace(ws).collect_submission("submission", dest, file_columns=columns, limits=limits)


def copied_files(dest: Path) -> list[str]:
    return sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())


# ---- relative paths ----------------------------------------------------------------------------------------------


def test_a_relative_path_is_split_into_its_components_without_dots() -> None:
    assert relative_parts("a/./b/c.txt") == ["a", "b", "c.txt"]
    assert relative_parts("x" * MAX_PATH_CHARS) == ["x" * MAX_PATH_CHARS]  # the limit itself is allowed


@pytest.mark.parametrize(("rel", "reason"), [
    ("/etc/passwd", "'/etc/passwd' is absolute"),
    ("", "names no file"),
    ("./.", "names no file"),
    ("a/../../b", "climbs out of its folder"),
    ("a\x00b", "contains a NUL character"),
    ("x" * (MAX_PATH_CHARS + 1), f"is {MAX_PATH_CHARS + 1} characters long; the limit is {MAX_PATH_CHARS}"),
])
def test_paths_that_leave_or_overflow_their_folder_are_refused_with_the_reason(rel: str, reason: str) -> None:
    with pytest.raises(WorkspaceRefused) as caught:
        relative_parts(rel, what="file")
    assert caught.value.message.startswith("file ") and reason in caught.value.message


def test_an_unopenable_workspace_is_refused_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceRefused, match="cannot be opened as a folder") as caught:
        Workspace(tmp_path / "absent").write_text("a.txt", "x")
    assert "pass an existing run folder" in (caught.value.hint or "")


# ---- writing files --------------------------------------------------------------------------------------------------


def test_writing_creates_the_file_and_its_parent_folders(ws: Path) -> None:
    Workspace(ws).write_text("working/nodes/3/script.py", "print('é')\n")
    written = ws / "working" / "nodes" / "3" / "script.py"
    assert written.read_bytes() == "print('é')\n".encode()
    assert stat.S_IMODE(written.stat().st_mode) == umasked(0o644)
    assert os.listdir(written.parent) == ["script.py"]  # no temporary file is left beside it


def test_writing_replaces_an_older_longer_file_whole(ws: Path) -> None:
    fs = Workspace(ws)
    fs.write_bytes("instructions.md", b"a long first version")
    fs.write_bytes("instructions.md", b"short")
    assert (ws / "instructions.md").read_bytes() == b"short"


def test_writing_replaces_a_planted_link_and_never_writes_through_it(ws: Path, host: Path) -> None:
    (ws / "instructions.md").symlink_to(host / "canary.txt")
    Workspace(ws).write_text("instructions.md", "rules")
    assert not (ws / "instructions.md").is_symlink() and (ws / "instructions.md").read_text() == "rules"
    assert host_unchanged(host)


def test_writing_never_changes_the_file_a_planted_hard_link_shares(ws: Path, host: Path) -> None:
    os.link(host / "canary.txt", ws / "working" / "script.py")
    Workspace(ws).write_text("working/script.py", "print(1)")
    assert (ws / "working" / "script.py").read_text() == "print(1)" and host_unchanged(host)


def test_writing_replaces_a_folder_planted_at_the_name(ws: Path) -> None:
    planted = nest(ws / "working" / "script.py", 3)
    (planted / "inside.txt").write_text("x")
    Workspace(ws).write_text("working/script.py", "print(2)")
    assert (ws / "working" / "script.py").read_text() == "print(2)"


def test_writing_below_a_linked_parent_folder_replaces_the_link_with_a_real_folder(ws: Path, host: Path) -> None:
    (ws / "working" / "sub").symlink_to(host, target_is_directory=True)
    Workspace(ws).write_text("working/sub/x.py", "x")
    assert not (ws / "working" / "sub").is_symlink() and (ws / "working" / "sub" / "x.py").read_text() == "x"
    assert host_unchanged(host)


def test_a_name_that_keeps_coming_back_as_a_folder_is_refused_and_the_temporary_file_removed(
        ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Workspace, "_remove_at", lambda self, parent, name, depth: [])  # a process re-creating it
    (ws / "working" / "script.py").mkdir()
    (ws / "working" / "script.py" / "keep").write_text("x")
    with pytest.raises(WorkspaceRefused, match="kept being re-created as a folder"):
        Workspace(ws).write_text("working/script.py", "print(1)")
    assert os.listdir(ws / "working") == ["script.py"]


# ---- folders ------------------------------------------------------------------------------------------------------


def test_ensuring_a_folder_makes_it_and_keeps_what_it_holds(ws: Path) -> None:
    fs = Workspace(ws)
    fs.ensure_dir("working/workers/2")
    (ws / "working" / "workers" / "2" / "keep.txt").write_text("x")
    fs.ensure_dir("working/workers/2")
    assert (ws / "working" / "workers" / "2" / "keep.txt").read_text() == "x"


@pytest.mark.parametrize("planted", ["link", "file", "parent link"])
def test_ensuring_a_folder_replaces_what_was_planted_at_its_name(ws: Path, host: Path, planted: str) -> None:
    if planted == "link":
        (ws / ".home").symlink_to(host, target_is_directory=True)
        rel = ".home"
    elif planted == "file":
        (ws / ".home").write_text("a file")
        rel = ".home"
    else:
        (ws / ".home").symlink_to(host, target_is_directory=True)
        rel = ".home/cache"
    Workspace(ws).ensure_dir(rel)
    made = ws / rel
    assert made.is_dir() and not made.is_symlink() and not (ws / ".home").is_symlink()
    assert host_unchanged(host)


@needs_root
def test_folders_made_for_the_agent_belong_to_the_sandbox_user(ws: Path) -> None:
    owner = (4242, 4243)
    fs = Workspace(ws, owner=owner)
    fs.own_root()
    fs.ensure_dir("working/a/b")
    fs.write_text("working/c/script.py", "x")
    fs.reset_dir("submission")
    for folder in (ws, ws / "working" / "a", ws / "working" / "a" / "b", ws / "working" / "c", ws / "submission"):
        assert (folder.stat().st_uid, folder.stat().st_gid) == owner, folder
    assert (ws / "working").stat().st_uid == os.geteuid()  # an existing parent is left as it is
    assert (ws / "working" / "c" / "script.py").stat().st_uid == os.geteuid()  # files are the harness's
    fs.ensure_dir("working/mine", own=False)
    assert (ws / "working" / "mine").stat().st_uid == owner[0]  # made for the agent, whoever asks
    os.chown(ws / "working" / "a", 0, 0)
    fs.ensure_dir("working/a", own=False)
    assert (ws / "working" / "a").stat().st_uid == 0
    fs.ensure_dir("working/a")
    assert (ws / "working" / "a").stat().st_uid == owner[0]


@needs_root
def test_giving_a_planted_link_never_changes_its_targets_owner(ws: Path, host: Path) -> None:
    (ws / "working" / "out").symlink_to(host, target_is_directory=True)
    Workspace(ws, owner=(4242, 4243)).ensure_dir("working/out")
    assert host.stat().st_uid == os.geteuid() and (ws / "working" / "out").stat().st_uid == 4242


def swap_for_link_after_mkdir(monkeypatch: pytest.MonkeyPatch, target: Path, *, times: int) -> None:
    """Agent code racing the harness: each folder the harness makes is swapped for a link to ``target`` at once
    (the first ``times`` folders)."""
    make, swapped = os.mkdir, []

    def make_then_swap(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        make(path, mode, dir_fd=dir_fd)
        if len(swapped) < times:
            swapped.append(path)
            os.rmdir(path, dir_fd=dir_fd)
            os.symlink(target, path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", make_then_swap)


@needs_root
def test_a_folder_swapped_for_a_link_just_after_it_was_made_gives_away_the_link_never_its_target(
        ws: Path, host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    swap_for_link_after_mkdir(monkeypatch, host, times=1)
    Workspace(ws, owner=(4242, 4243)).ensure_dir("working/out")
    made = ws / "working" / "out"
    assert made.is_dir() and not made.is_symlink() and made.stat().st_uid == 4242
    assert host.stat().st_uid == os.geteuid() and host_unchanged(host)


def test_a_name_that_keeps_being_swapped_for_a_link_is_refused_after_a_few_tries(
        ws: Path, host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    swap_for_link_after_mkdir(monkeypatch, host, times=100)
    with pytest.raises(WorkspaceRefused, match="'out' kept changing while the harness opened it"):
        Workspace(ws).ensure_dir("working/out")
    assert host_unchanged(host)


def recreate_before_mkdir(monkeypatch: pytest.MonkeyPatch, *, times: int) -> None:
    """A running process making the folder (with a file in it) just before the harness does, ``times`` times."""
    make, made = os.mkdir, []

    def made_first(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if len(made) < times:
            made.append(path)
            make(path, mode, dir_fd=dir_fd)
            os.close(os.open(f"{path}/planted", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dir_fd))
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        make(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", made_first)


def test_a_folder_re_created_while_it_is_reset_is_emptied_again(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "submission" / "old.csv").write_text("x")
    recreate_before_mkdir(monkeypatch, times=1)
    assert Workspace(ws).reset_dir("submission") == []
    assert os.listdir(ws / "submission") == []


def test_a_folder_that_keeps_being_re_created_while_it_is_reset_is_refused(ws: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    recreate_before_mkdir(monkeypatch, times=100)
    with pytest.raises(WorkspaceRefused, match="'submission' kept being re-created while the harness emptied it"):
        Workspace(ws).reset_dir("submission")


def test_a_write_the_file_system_refuses_is_raised_and_deletes_nothing(ws: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "instructions.md").write_text("the old rules")

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "rename", read_only)
    with pytest.raises(OSError) as caught:
        Workspace(ws).write_text("instructions.md", "new rules")
    assert caught.value.errno == errno.EROFS and (ws / "instructions.md").read_text() == "the old rules"


def test_resetting_a_folder_deletes_everything_in_it_and_nothing_its_links_point_at(ws: Path, host: Path) -> None:
    sub = ws / "submission"
    nest(sub, 5)
    (sub / "d" / "d" / "f.txt").write_text("x")
    (sub / "link-file").symlink_to(host / "canary.txt")
    (sub / "d" / "link-dir").symlink_to(host, target_is_directory=True)
    os.mkfifo(sub / "d" / "fifo")
    os.link(host / "canary.txt", sub / "hard")
    assert Workspace(ws).reset_dir("submission") == []
    assert sub.is_dir() and os.listdir(sub) == [] and host_unchanged(host)


@pytest.mark.parametrize("planted", ["link", "file", "missing"])
def test_resetting_a_folder_makes_a_real_empty_one_whatever_had_its_name(ws: Path, host: Path, planted: str) -> None:
    target = ws / "working" / "workers" / "1" / "submission"
    target.parent.mkdir(parents=True)
    if planted == "link":
        target.symlink_to(host, target_is_directory=True)
    elif planted == "file":
        target.write_text("a file")
    assert Workspace(ws).reset_dir("working/workers/1/submission") == []
    assert target.is_dir() and not target.is_symlink() and os.listdir(target) == [] and host_unchanged(host)


def test_a_tree_too_deep_to_walk_is_renamed_aside_whole_with_a_note(ws: Path, host: Path) -> None:
    deepest = nest(ws / "working" / "n", MAX_DEPTH + 10)
    (deepest / "link").symlink_to(host, target_is_directory=True)
    notes = Workspace(ws).reset_dir("working/n")
    assert len(notes) == 1 and "could not be deleted" in notes[0] and "nested deeper than" in notes[0]
    aside = [name for name in os.listdir(ws / "working") if name != "n"]
    assert len(aside) == 1 and aside[0].startswith(DISCARDED_PREFIX) and repr(aside[0]) in notes[0]
    assert os.listdir(ws / "working" / "n") == []
    # what lies beyond the walking depth is left as it was, for the run's folder to be deleted with it
    assert (ws / "working" / aside[0]).joinpath(*["d"] * (MAX_DEPTH + 10), "link").is_symlink()
    assert host_unchanged(host)


def test_a_deep_tree_within_the_walking_depth_is_deleted_whole(ws: Path) -> None:
    base = ws / "working" / "n"
    deepest = nest(base, MAX_DEPTH - 3)  # with working/ and n/ the deepest folder is MAX_DEPTH - 1 levels down
    (deepest / "f.txt").write_text("x")
    for level in range(0, MAX_DEPTH - 3, 7):  # files and folders to delete at many levels
        (base.joinpath(*["d"] * level) / f"side{level}").mkdir()
        (base.joinpath(*["d"] * level) / f"file{level}").write_text("x")
    assert Workspace(ws).remove("working/n") == []
    assert os.listdir(ws / "working") == []


@pytest.mark.parametrize("operation", ["remove", "reset_dir", "write_text"])
@pytest.mark.parametrize("level", [1, 2, MAX_DEPTH - 1])
def test_a_tree_down_to_the_walking_depth_is_deleted_and_one_reaching_deeper_is_set_aside(
        tmp_path: Path, operation: str, level: int) -> None:
    """Wherever the tree starts (``level`` folders below the root), folders down to MAX_DEPTH - 1 levels below the
    workspace root are walked and deleted; a tree reaching further is renamed aside whole."""
    top = "/".join(["d"] * (level - 1) + ["t"])
    for deepest, set_aside in ((MAX_DEPTH - 1, False), (MAX_DEPTH, True)):
        root = tmp_path / f"ws-{deepest}"
        (nest(root / top, deepest - level) / "f.txt").write_text("x")
        fs = Workspace(root)
        notes = fs.write_text(top, "x") if operation == "write_text" else getattr(fs, operation)(top)
        parent = (root / top).parent
        aside = [name for name in os.listdir(parent) if name.startswith(DISCARDED_PREFIX)]
        assert len(aside) == int(set_aside), (deepest, aside)
        if operation == "write_text":
            assert (root / top).read_text() == "x"
        else:
            assert len(notes) == int(set_aside)
            assert os.listdir(root / top) == [] if operation == "reset_dir" else not (root / top).exists()


def test_removing_deletes_a_file_a_link_or_a_tree_and_never_what_a_link_points_at(ws: Path, host: Path) -> None:
    fs = Workspace(ws)
    (ws / "working" / "f.txt").write_text("x")
    (ws / "working" / "link").symlink_to(host, target_is_directory=True)
    nest(ws / "working" / "tree", 3)
    (ws / "working" / "tree" / "d" / "inner-link").symlink_to(host / "canary.txt")
    for rel in ("working/f.txt", "working/link", "working/tree", "working/absent"):
        assert fs.remove(rel) == []
    assert os.listdir(ws / "working") == [] and host_unchanged(host)


def test_removing_below_a_linked_or_missing_parent_deletes_nothing(ws: Path, host: Path) -> None:
    (ws / "working" / "out").symlink_to(host, target_is_directory=True)
    fs = Workspace(ws)
    assert fs.remove("working/out/canary.txt") == [] and host_unchanged(host)
    assert fs.remove("absent/folder/file.txt") == []


def test_what_a_path_is_is_told_without_following_links(ws: Path, host: Path) -> None:
    work = ws / "working"
    (work / "file").write_text("x")
    (work / "link").symlink_to(host, target_is_directory=True)
    os.mkfifo(work / "fifo")
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(work / "sock"))
    except OSError:  # the path is too long for a socket address: bind relative to the folder instead
        cwd = os.getcwd()
        os.chdir(work)
        try:
            listener.bind("sock")
        finally:
            os.chdir(cwd)
    listener.close()
    fs = Workspace(ws)
    assert [fs.kind_of(f"working/{name}") for name in ("file", "link", "fifo", "sock", "absent")] == [
        "a regular file", "a symbolic link", "a FIFO", "a socket", None]
    assert fs.kind_of("working") == "a folder"
    assert fs.kind_of("working/link/canary.txt") is None  # a parent that is a link is not a folder of ours
    (nest(ws, MAX_DEPTH) / "f").write_text("x")
    assert fs.kind_of("/".join(["d"] * MAX_DEPTH + ["f"])) == "a regular file"  # MAX_DEPTH folders are opened
    assert fs.kind_of("/".join(["d"] * (MAX_DEPTH + 1) + ["f"])) is None


@needs_root
def test_devices_are_told_apart_and_never_entered(ws: Path) -> None:
    os.mknod(ws / "working" / "char", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.mknod(ws / "working" / "block", stat.S_IFBLK | 0o600, os.makedev(7, 200))
    fs = Workspace(ws)
    assert fs.kind_of("working/char") == fs.kind_of("working/block") == "a device"
    got = fs.collect_submission("working/char", ws / "out", file_columns=[])
    assert got.folder is None and "'char' is a device, not a folder" in got.refused[0]


def test_a_folder_is_empty_only_when_it_is_a_real_folder_with_nothing_in_it_or_missing(ws: Path, host: Path) -> None:
    fs = Workspace(ws)
    (ws / "working" / "hidden").mkdir()
    (ws / "working" / "hidden" / ".x").write_text("")
    (ws / "working" / "file").write_text("x")
    (ws / "working" / "link").symlink_to(host, target_is_directory=True)
    assert fs.is_empty_dir("submission") and fs.is_empty_dir("absent")
    assert fs.is_empty_dir("working/file") and fs.is_empty_dir("working/link")  # not folders of ours
    assert not fs.is_empty_dir("working/hidden") and not fs.is_empty_dir("working")


# ---- collecting a submission -------------------------------------------------------------------------------------


def test_a_submission_copy_holds_the_csv_and_each_named_regular_file_once(ws: Path, tmp_path: Path) -> None:
    sub = submission(ws, ["a.bin", "preds/deeper/b.bin", " a.bin ", "", "preds/c.bin"])
    (sub / "a.bin").write_bytes(b"a" * 10)
    nest(sub / "preds", 1, "deeper")
    (sub / "preds" / "deeper" / "b.bin").write_bytes(b"b" * 20)
    (sub / "preds" / "c.bin").write_bytes(b"c" * 30)
    (sub / "not-named.bin").write_bytes(b"x")
    dest = tmp_path / "copy" / "submission"
    got = collect(ws, dest)
    assert got.folder == dest and got.refused == () and got.n_refused == 0
    assert copied_files(dest) == ["a.bin", "preds/c.bin", "preds/deeper/b.bin", "submission.csv"]
    assert (got.files, got.bytes) == (3, 60)  # each file once; the CSV is not one of the named files
    assert (dest / "submission.csv").read_bytes() == (sub / "submission.csv").read_bytes()
    assert (dest / "preds" / "deeper" / "b.bin").read_bytes() == b"b" * 20


@pytest.mark.parametrize("rows", [["a.bin", "./a.bin"], ["submission.csv", "a.bin"]])
def test_a_file_named_in_two_spellings_or_the_csv_named_as_a_file_is_copied_once(ws: Path, tmp_path: Path,
                                                                                 rows: list[str]) -> None:
    sub = submission(ws, rows)
    (sub / "a.bin").write_bytes(b"a" * 60)
    got = collect(ws, tmp_path / "c" / "s", CopyLimits(max_files=1, max_total_bytes=100))
    assert copied_files(got.folder) == ["a.bin", "submission.csv"] and got.refused == ()  # counted once
    assert (got.folder / "submission.csv").read_bytes() == (sub / "submission.csv").read_bytes()


def test_only_the_file_columns_that_the_header_has_name_files(ws: Path, tmp_path: Path) -> None:
    sub = ws / "submission"
    (sub / "submission.csv").write_text("\ufeffcase , mask ,score\nc0, m.bin ,m.bin\nc1\n")
    (sub / "m.bin").write_bytes(b"m")
    got = collect(ws, tmp_path / "c1" / "s", columns=("mask", "missing"))
    assert copied_files(got.folder) == ["m.bin", "submission.csv"] and got.refused == ()
    got = collect(ws, tmp_path / "c2" / "s", columns=())
    assert copied_files(got.folder) == ["submission.csv"] and got.files == 0


def test_a_csv_that_is_not_utf8_is_copied_alone_for_validation_to_judge(ws: Path, tmp_path: Path) -> None:
    (ws / "submission" / "submission.csv").write_bytes(b"case,pred\nc0,\xff\xfe.bin\n")
    got = collect(ws, tmp_path / "c" / "s")
    assert copied_files(got.folder) == ["submission.csv"] and got.refused == ()


def test_without_a_csv_nothing_is_copied_and_the_reason_is_given(ws: Path, tmp_path: Path) -> None:
    dest = tmp_path / "c" / "s"
    got = collect(ws, dest)
    assert got.folder is None and got.refused == ("submission.csv is missing from the submission folder",)
    assert got.n_refused == 1 and not dest.exists()


@pytest.mark.parametrize(("plant", "start", "end"), [
    ("link", "submission.csv: is a symbolic link; the harness does not follow links", ""),
    ("fifo", "submission.csv: is a FIFO; only regular files are collected", ""),
    ("folder", "submission.csv: is a folder; only regular files are collected", ""),
    ("large", "submission.csv: is 101 bytes (", " allocated); the limit per file is 100"),
])
def test_a_csv_that_is_not_a_small_regular_file_is_refused_and_nothing_is_copied(
        ws: Path, host: Path, tmp_path: Path, plant: str, start: str, end: str) -> None:
    csv_path = ws / "submission" / "submission.csv"
    if plant == "link":
        csv_path.symlink_to(host / "canary.txt")
    elif plant == "fifo":
        os.mkfifo(csv_path)  # opening it must not wait for a writer
    elif plant == "folder":
        csv_path.mkdir()
    else:
        csv_path.write_bytes(b"x" * 101)
    dest = tmp_path / "c" / "s"
    got = collect(ws, dest, CopyLimits(max_csv_bytes=100))
    assert got.folder is None and len(got.refused) == 1 and not dest.exists()
    assert got.refused[0].startswith(start) and got.refused[0].endswith(end)


def test_a_csv_exactly_at_its_size_limit_is_collected(ws: Path, tmp_path: Path) -> None:
    (ws / "submission" / "submission.csv").write_bytes(b"case\n" + b"x" * 95)
    got = collect(ws, tmp_path / "c" / "s", CopyLimits(max_csv_bytes=100), columns=())
    assert got.folder is not None and got.refused == ()


@pytest.mark.parametrize(("plant", "reason"), [
    ("missing", "'submission' does not exist"),
    ("link", "'submission' is a symbolic link, not a folder; the harness does not follow links"),
    ("file", "'submission' is a regular file, not a folder"),
])
def test_a_submission_folder_that_is_not_a_real_folder_is_refused_whole(ws: Path, host: Path, tmp_path: Path,
                                                                        plant: str, reason: str) -> None:
    (ws / "submission").rmdir()
    if plant == "link":
        (host / "submission.csv").write_text("case,pred\n")
        (ws / "submission").symlink_to(host, target_is_directory=True)
    elif plant == "file":
        (ws / "submission").write_text("x")
    got = collect(ws, tmp_path / "c" / "s")
    assert got.folder is None and got.n_refused == 1
    assert got.refused[0].startswith("the submission folder 'submission': ") and reason in got.refused[0]


def test_named_files_the_harness_must_not_follow_or_read_are_refused_each_with_its_reason(
        ws: Path, host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long_name = "x" * 300  # within the path limit, but longer than a file name may be
    sub = submission(ws, ["ok.bin", "link.bin", "hostdir/canary.txt", "fifo.bin", "sock.bin", "absent.bin",
                          "folder.bin", "../escape.bin", "/etc/passwd", long_name, f"{long_name}/f.bin"])
    (sub / "ok.bin").write_bytes(b"ok")
    (sub / "link.bin").symlink_to(host / "canary.txt")
    (sub / "hostdir").symlink_to(host, target_is_directory=True)
    os.mkfifo(sub / "fifo.bin")
    (sub / "folder.bin").mkdir()
    monkeypatch.chdir(sub)  # a socket's path must be short
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("sock.bin")
    try:
        got = collect(ws, tmp_path / "c" / "s")
    finally:
        listener.close()
    assert copied_files(got.folder) == ["ok.bin", "submission.csv"] and (got.files, got.bytes) == (1, 2)
    assert list(got.refused) == [
        "'link.bin' is a symbolic link; the harness does not follow links",
        "'hostdir/canary.txt': the folder 'hostdir' is a symbolic link; the harness does not follow links",
        "'fifo.bin' is a FIFO; only regular files are collected",
        f"'sock.bin' cannot be opened ({os.strerror(errno.ENXIO)})",  # a socket cannot be opened as a file
        "'absent.bin' does not exist",
        "'folder.bin' is a folder; only regular files are collected",
        "file '../escape.bin' climbs out of its folder with '..'",
        "file '/etc/passwd' is absolute; a path relative to its folder is expected",
        f"{long_name!r} cannot be opened ({os.strerror(errno.ENAMETOOLONG)})",
        f"'{long_name}/f.bin': the folder {long_name!r} cannot be opened ({os.strerror(errno.ENAMETOOLONG)})",
    ]
    assert got.n_refused == 10 and host_unchanged(host)


def test_a_refused_first_name_does_not_stop_the_names_after_it(ws: Path, tmp_path: Path) -> None:
    sub = submission(ws, ["../escape.bin", "ok.bin"])
    (sub / "ok.bin").write_bytes(b"ok")
    got = collect(ws, tmp_path / "c" / "s")
    assert copied_files(got.folder) == ["ok.bin", "submission.csv"]
    assert got.refused == ("file '../escape.bin' climbs out of its folder with '..'",)


def test_a_named_file_as_deep_as_the_depth_limit_is_copied_and_one_deeper_is_refused(ws: Path,
                                                                                      tmp_path: Path) -> None:
    at_limit, beyond = "/".join(["d"] * 3 + ["f.bin"]), "/".join(["d"] * 4 + ["f.bin"])
    sub = submission(ws, [at_limit, beyond])
    nest(sub, 4)
    (sub / at_limit).write_bytes(b"f")
    (sub / beyond).write_bytes(b"f")
    got = collect(ws, tmp_path / "c" / "s", CopyLimits(max_depth=3))
    assert copied_files(got.folder) == [at_limit, "submission.csv"]
    assert got.refused == (f"{beyond!r} is nested deeper than 3 folders",)


def test_each_file_and_the_whole_copy_are_bounded_in_bytes_and_exact_limits_pass(ws: Path, tmp_path: Path) -> None:
    sub = submission(ws, ["a.bin", "b.bin", "c.bin", "d.bin"])
    for name, size in (("a.bin", 100), ("b.bin", 101), ("c.bin", 60), ("d.bin", 40)):
        (sub / name).write_bytes(b"x" * size)
    got = collect(ws, tmp_path / "c" / "s", CopyLimits(max_file_bytes=100, max_total_bytes=140))
    assert copied_files(got.folder) == ["a.bin", "d.bin", "submission.csv"] and (got.files, got.bytes) == (2, 140)
    assert got.refused[0].startswith("'b.bin' is 101 bytes (") and got.refused[0].endswith(
        "allocated); the limit per file is 100")
    assert got.refused[1] == "'c.bin' would bring the submission to 160 bytes; the limit is 140"


def test_a_sparse_file_counts_by_its_size_and_its_allocation_within_a_megabyte_slack(ws: Path,
                                                                                       tmp_path: Path) -> None:
    sub = submission(ws, ["sparse.bin", "dense.bin"])
    with open(sub / "sparse.bin", "wb") as handle:
        handle.truncate(8 * MiB)  # 8 MiB apparent, nothing allocated
    (sub / "dense.bin").write_bytes(os.urandom(3 * MiB))
    limits = CopyLimits(max_file_bytes=8 * MiB)
    got = collect(ws, tmp_path / "c" / "s", limits)
    assert got.refused == () and got.bytes == 11 * MiB
    got = collect(ws, tmp_path / "c2" / "s", CopyLimits(max_file_bytes=8 * MiB - 1))
    assert [r.split(" ")[0] for r in got.refused] == ["'sparse.bin'"]  # too large by its size, not its allocation


def test_a_file_preallocated_far_past_its_size_is_refused_by_its_allocation(ws: Path, tmp_path: Path) -> None:
    sub = submission(ws, ["inflated.bin"])
    with open(sub / "inflated.bin", "wb") as handle:
        handle.write(b"x")
        keep_size = 1  # FALLOC_FL_KEEP_SIZE: blocks past the end, the size stays 1 byte
        if ctypes.CDLL(None, use_errno=True).fallocate(handle.fileno(), keep_size, ctypes.c_long(0),
                                                         ctypes.c_long(3 * MiB)) != 0:
            pytest.skip(f"fallocate: {os.strerror(ctypes.get_errno())}")
    on_disk = allocated(sub / "inflated.bin")
    got = collect(ws, tmp_path / "c" / "s", CopyLimits(max_file_bytes=MiB))
    assert got.files == 0 and got.refused == (f"'inflated.bin' is 1 bytes ({on_disk} allocated); the limit per file "
                                              f"is {MiB}",)
    # a megabyte of slack over the limit, not a byte more
    assert collect(ws, tmp_path / "c2" / "s", CopyLimits(max_file_bytes=on_disk - MiB)).files == 1
    assert collect(ws, tmp_path / "c3" / "s", CopyLimits(max_file_bytes=on_disk - MiB - 512)).files == 0


def test_past_the_file_count_limit_every_further_file_is_refused_and_the_reasons_listed_are_bounded(
        ws: Path, tmp_path: Path) -> None:
    names = [f"f{i:02d}.bin" for i in range(30)]
    sub = submission(ws, names)
    for name in names:
        (sub / name).write_bytes(b"x")
    got = collect(ws, tmp_path / "c" / "s", CopyLimits(max_files=5))
    assert got.files == 5 and copied_files(got.folder)[:5] == names[:5]
    assert got.n_refused == 25 and len(got.refused) == 20
    assert got.refused[0] == "'f05.bin': more than 5 files are named; the rest are not copied"


def test_copies_are_plain_files_of_the_harness_holding_the_same_bytes_and_holes(ws: Path, tmp_path: Path) -> None:
    sub = submission(ws, ["setuid.bin", "sparse.bin", "tail-hole.bin"])
    (sub / "setuid.bin").write_bytes(b"suid")
    os.chmod(sub / "setuid.bin", 0o6777)
    with open(sub / "sparse.bin", "wb") as handle:
        handle.truncate(64 * MiB)
        handle.seek(20 * MiB)
        handle.write(b"data in the middle")
    with open(sub / "tail-hole.bin", "wb") as handle:
        handle.write(b"head")
        handle.truncate(5 * MiB)  # ends in a hole: the copy keeps the size
    got = collect(ws, tmp_path / "c" / "s")
    for name in ("setuid.bin", "sparse.bin", "tail-hole.bin", "submission.csv"):
        info = (got.folder / name).lstat()
        assert stat.S_IMODE(info.st_mode) == umasked(0o644) and info.st_uid == os.geteuid(), name
        assert info.st_ino != (sub / name).stat().st_ino
        assert (got.folder / name).read_bytes() == (sub / name).read_bytes(), name
    assert (got.folder / "sparse.bin").stat().st_blocks * 512 < MiB  # holes are not densified
    assert (got.folder / "tail-hole.bin").stat().st_size == 5 * MiB


def test_a_csv_that_grows_after_its_size_was_checked_is_read_only_up_to_that_size(tmp_path: Path) -> None:
    path = tmp_path / "submission.csv"
    path.write_bytes(b"case,pred\n" + b"x" * 30)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert safe_workspace._read_exactly(fd, 10) == b"case,pred\n"
    finally:
        os.close(fd)


def test_a_csv_read_ends_at_the_end_of_a_file_that_shrank_after_its_size_was_checked(tmp_path: Path) -> None:
    path = tmp_path / "submission.csv"
    path.write_bytes(b"case\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert safe_workspace._read_exactly(fd, 100) == b"case\n"
    finally:
        os.close(fd)


def test_a_one_byte_csv_is_collected_whole(ws: Path, tmp_path: Path) -> None:
    (ws / "submission" / "submission.csv").write_bytes(b"x")
    got = collect(ws, tmp_path / "c" / "s", columns=())
    assert (got.folder / "submission.csv").read_bytes() == b"x"


# ---- reading and copying out ----------------------------------------------------------------------------------


def test_a_file_exactly_at_the_read_bound_is_read(ws: Path) -> None:
    (ws / "working" / "tree.json").write_bytes(b"{}")
    fs = Workspace(ws)
    assert fs.read_bytes("working/tree.json", max_bytes=2) == b"{}"
    assert fs.read_bytes("working/tree.json", max_bytes=1) is None


@pytest.fixture
def logs(ws: Path) -> Path:
    """working/logs: files at the top and in two subfolders, an empty subfolder, and a link."""
    top = ws / "working" / "logs"
    for folder in ("a", "b", "empty"):
        (top / folder).mkdir(parents=True)
    (top / "top.txt").write_text("t")
    (top / "a" / "x.txt").write_text("aa")
    (top / "b" / "x.txt").write_text("bbb")
    (top / "link.txt").symlink_to(top / "top.txt")
    return top


def test_copying_out_one_file_makes_the_destination_and_counts_the_file(ws: Path, logs: Path,
                                                                         tmp_path: Path) -> None:
    dest = tmp_path / "not" / "yet" / "there"
    got = Workspace(ws).copy_out("working/logs/a/x.txt", dest)
    assert (got.folder, got.files, got.bytes, got.refused) == (dest, 1, 2, ())
    assert (dest / "x.txt").read_text() == "aa"
    refused = Workspace(ws).copy_out("working/logs/link.txt", tmp_path / "link-copy")
    assert refused.folder == tmp_path / "link-copy" and os.listdir(refused.folder) == []
    assert refused.refused == ("'working/logs/link.txt' is a symbolic link; the harness does not follow links",)


def test_copying_out_a_tree_keeps_its_folders_and_adds_to_an_existing_destination(ws: Path, logs: Path,
                                                                                   tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "earlier.txt").write_text("kept")
    got = Workspace(ws).copy_out("working/logs", dest)
    assert copied_files(dest) == ["a/x.txt", "b/x.txt", "earlier.txt", "top.txt"] and (dest / "empty").is_dir()
    assert (got.files, got.bytes, got.n_refused) == (3, 6, 1)


def test_copying_out_visits_folders_in_name_order(ws: Path, logs: Path, tmp_path: Path) -> None:
    got = Workspace(ws).copy_out("working/logs", tmp_path / "out", limits=CopyLimits(max_files=2))
    assert copied_files(tmp_path / "out") == ["a/x.txt", "top.txt"] and got.files == 2
    assert "'b/x.txt': more than 2 files" in got.refused[-1]


def test_a_copy_out_that_fails_midway_raises_and_leaves_no_descriptor_open(ws: Path, logs: Path,
                                                                           tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "b").write_text("a file where the copy needs a folder")
    before = open_descriptors()
    with pytest.raises(FileExistsError):
        Workspace(ws).copy_out("working/logs", dest)
    assert open_descriptors() == before


# ---- copying extents --------------------------------------------------------------------------------------------


@pytest.fixture
def sparse_source(tmp_path: Path) -> Iterator[tuple[int, bytes, int]]:
    """A file of two data extents larger than a plain-copy chunk and a small one between them, apart by holes of
    tens of MiB: descriptor, its bytes, and the bytes it has allocated."""
    path = tmp_path / "source.bin"
    head, middle, tail = os.urandom(10 * MiB), os.urandom(64 * 1024), os.urandom(9 * MiB + 123)
    with open(path, "wb") as handle:
        handle.write(head)
        handle.seek(30 * MiB)
        handle.write(middle)
        handle.seek(50 * MiB)
        handle.write(tail)
    fd = os.open(path, os.O_RDONLY)
    try:
        content = head + bytes(20 * MiB) + middle + bytes(20 * MiB - len(middle)) + tail
        yield fd, content, os.fstat(fd).st_blocks * 512
    finally:
        os.close(fd)


def copy_to(tmp_path: Path, src: int, size: int) -> tuple[bytes, int]:
    with open(tmp_path / "copy.bin", "wb") as out:
        copy_extents(src, out.fileno(), size)
    return (tmp_path / "copy.bin").read_bytes(), (tmp_path / "copy.bin").stat().st_blocks * 512


def test_an_extent_copy_holds_the_same_bytes_and_no_more_allocation(sparse_source, tmp_path: Path) -> None:
    fd, content, allocated = sparse_source
    data, copied = copy_to(tmp_path, fd, len(content))
    assert data == content and copied <= allocated + MiB


def test_an_extent_copy_stops_at_the_size_it_was_given(sparse_source, tmp_path: Path) -> None:
    fd, content, _ = sparse_source
    data, _ = copy_to(tmp_path, fd, 5 * MiB)  # the end falls inside an extent
    assert data == content[:5 * MiB]
    data, _ = copy_to(tmp_path, fd, 12 * MiB)
    assert data == content[:12 * MiB]
    data, copied = copy_to(tmp_path, fd, 30 * MiB)  # the end falls in the hole
    assert data == content[:30 * MiB] and copied <= 11 * MiB


def test_when_the_kernel_refuses_to_copy_the_plain_copy_keeps_the_holes(sparse_source, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object) -> int:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "copy_file_range", refused)
    fd, content, allocated = sparse_source
    data, copied = copy_to(tmp_path, fd, len(content))
    assert data == content and copied <= allocated + MiB


def test_the_plain_copy_takes_over_where_the_kernel_copy_stopped(sparse_source, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_copy = os.copy_file_range
    calls = []

    def stops_after_one_short_copy(src: int, dst: int, count: int, offset_src: int, offset_dst: int) -> int:
        calls.append(count)
        if len(calls) > 1:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return kernel_copy(src, dst, 3 * MiB + 7, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", stops_after_one_short_copy)
    fd, content, allocated_bytes = sparse_source
    data, copied = copy_to(tmp_path, fd, len(content))
    assert data == content and copied <= allocated_bytes + MiB


def test_a_kernel_copy_that_copies_less_than_asked_is_called_again_for_the_rest(
        sparse_source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_copy = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range", lambda src, dst, count, offset_src, offset_dst: kernel_copy(
        src, dst, min(count, 3 * MiB + 7), offset_src, offset_dst))
    fd, content, allocated_bytes = sparse_source
    data, copied = copy_to(tmp_path, fd, len(content))
    assert data == content and copied <= allocated_bytes + MiB


def test_a_plain_copy_whose_writes_fall_short_writes_the_rest_where_the_last_one_ended(
        sparse_source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object) -> int:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    write_at = os.pwrite
    monkeypatch.setattr(os, "copy_file_range", refused)
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: write_at(fd, data[:MiB + 5], offset))
    fd, content, _ = sparse_source
    data, _ = copy_to(tmp_path, fd, len(content))
    assert data == content


def test_an_error_of_the_copy_itself_is_raised_not_hidden(sparse_source, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(*args: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "copy_file_range", disk_full)
    fd, content, _ = sparse_source
    with pytest.raises(OSError) as caught:
        copy_to(tmp_path, fd, len(content))
    assert caught.value.errno == errno.ENOSPC


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_a_file_that_shrank_after_it_was_sized_is_copied_to_its_end_and_the_copy_has_the_size_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_copy: bool) -> None:
    seek = os.lseek

    def no_holes(fd: int, offset: int, whence: int) -> int:  # so the copy asks for the 10 bytes sized before
        if whence in (os.SEEK_DATA, os.SEEK_HOLE):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return seek(fd, offset, whence)

    def refused(*args: object) -> int:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "lseek", no_holes)
    if not kernel_copy:
        monkeypatch.setattr(os, "copy_file_range", refused)
    (tmp_path / "source.bin").write_bytes(b"abc")
    fd = os.open(tmp_path / "source.bin", os.O_RDONLY)
    try:
        data, _ = copy_to(tmp_path, fd, 10)
    finally:
        os.close(fd)
    assert data == b"abc" + bytes(7)


def test_without_hole_support_the_whole_file_is_copied_as_data(sparse_source, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seek = os.lseek

    def no_holes(fd: int, offset: int, whence: int) -> int:
        if whence in (os.SEEK_DATA, os.SEEK_HOLE):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return seek(fd, offset, whence)

    monkeypatch.setattr(os, "lseek", no_holes)
    fd, content, _ = sparse_source
    data, _ = copy_to(tmp_path, fd, len(content))
    assert data == content


# ---- measuring ----------------------------------------------------------------------------------------------------


def allocated(path: Path) -> int:
    return path.lstat().st_blocks * 512


def test_usage_counts_allocated_bytes_entries_and_depth_without_following_links(ws: Path, host: Path) -> None:
    (host / "big.bin").write_bytes(os.urandom(2 * MiB))
    work = ws / "working"
    (work / "a.bin").write_bytes(os.urandom(300_000))
    with open(work / "sparse.bin", "wb") as handle:
        handle.truncate(1024 * MiB)
    (work / "to-file").symlink_to(host / "big.bin")
    (work / "to-dir").symlink_to(host, target_is_directory=True)
    nest(work / "x", 2)  # working/x/d/d: four levels down
    usage = Workspace(ws).usage()
    paths = [ws / "submission", work, work / "a.bin", work / "sparse.bin", work / "to-file", work / "to-dir",
             work / "x", work / "x" / "d", work / "x" / "d" / "d"]
    assert (usage.bytes, usage.entries, usage.depth, usage.complete) == (sum(map(allocated, paths)), 9, 4, True)
    assert usage.bytes < MiB


def test_usage_leaves_out_skipped_top_level_names_only(ws: Path) -> None:
    nest(ws / "data", 2)
    (ws / "data" / "d" / "big.bin").write_bytes(b"x" * 100_000)
    (ws / "working" / "data").mkdir()
    usage = Workspace(ws).usage(skip=("data",))
    assert usage.entries == 3 and usage.depth == 2  # submission, working, working/data


def test_an_empty_workspace_has_no_usage(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert Workspace(tmp_path / "empty").usage() == safe_workspace.Usage(0, 0, 0, True)


def test_usage_stops_early_past_the_entry_bound_and_says_so(ws: Path) -> None:
    for i in range(3):
        nest(ws / "working" / f"t{i}", 2)
    whole = Workspace(ws).usage()
    assert whole.entries == 11 and whole.complete
    assert Workspace(ws).usage(max_entries=11).complete
    partial = Workspace(ws).usage(max_entries=4)
    assert not partial.complete and 4 < partial.entries < 11


def test_usage_walks_folders_down_to_the_walking_depth_and_says_when_there_are_deeper_ones(tmp_path: Path) -> None:
    within, beyond = tmp_path / "within", tmp_path / "beyond"
    nest(within, MAX_DEPTH - 1)
    nest(beyond, MAX_DEPTH)
    assert Workspace(within).usage() == safe_workspace.Usage(
        sum(allocated(within.joinpath(*["d"] * level)) for level in range(1, MAX_DEPTH)), MAX_DEPTH - 1,
        MAX_DEPTH - 1, True)
    usage = Workspace(beyond).usage()
    assert not usage.complete and usage.entries == MAX_DEPTH and usage.depth >= MAX_DEPTH


# ---- no descriptor outlives an operation -------------------------------------------------------------------------


def test_no_operation_leaves_a_descriptor_open_whether_it_succeeds_or_refuses(ws: Path, host: Path,
                                                                              tmp_path: Path) -> None:
    fs = Workspace(ws)
    sub = submission(ws, ["a/b/ok.bin", "a/link/x", "a/b/absent.bin", "a/b/fifo", "../x"])
    nest(sub / "a", 1, "b")
    (sub / "a" / "b" / "ok.bin").write_bytes(b"ok")
    (sub / "a" / "link").symlink_to(host, target_is_directory=True)
    os.mkfifo(sub / "a" / "b" / "fifo")
    nest(ws / "working" / "deep", MAX_DEPTH + 3)
    (nest(ws / "working" / "tree", 4) / "f.txt").write_text("x")
    before = open_descriptors()
    got = collect(ws, tmp_path / "c" / "s")
    assert got.files == 1 and got.n_refused == 4
    assert not fs.usage(max_entries=5).complete and not fs.usage().complete
    assert fs.reset_dir("working/deep") and fs.remove("working/absent") == [] and fs.remove("working/tree") == []
    assert fs.kind_of("working/x/y") is None and fs.is_empty_dir("working/deep")
    fs.write_text("working/new/script.py", "x")
    fs.ensure_dir("working/link-here")
    with pytest.raises(WorkspaceRefused):
        fs.write_text("working/" + "/".join(["n"] * (MAX_DEPTH + 1)), "x")
    assert open_descriptors() == before
