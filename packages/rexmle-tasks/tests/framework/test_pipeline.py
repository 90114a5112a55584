"""The framework core: splits, metadata, safe extraction, descriptions, registry and prepare_task."""

from __future__ import annotations

import hashlib
import json
import math
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from rexmle_grade.errors import DownloadError, RexmleError, UnknownNameError, UserInputError
from rexmle_grade.grader import TestManifest
from rexmle_grade.settings import TaskDirs
from rexmle_tasks import registry
from rexmle_tasks.base import PrepareContext, Task, safe_extract_zip
from rexmle_tasks.description import render_description
from rexmle_tasks.metadata import DataSource, RemoteFile, load_metadata
from rexmle_tasks.pipeline import (
    PREPARED_MARKER,
    RAW_SOURCE_MARKER,
    SPLIT_MANIFEST,
    prepare_task,
    prepared_info,
    task_dirs,
)
from rexmle_tasks.splits import Split, file_checksums, make_split

# ---- splits -------------------------------------------------------------------------------------------------


def test_split_follows_the_documented_hash_rule() -> None:
    ids = [f"case_{i:02d}" for i in range(10)]
    by_key = sorted(ids, key=lambda i: hashlib.sha256(f"7:{i}".encode()).hexdigest())
    split = make_split(ids, seed=7, test_fraction=0.25)
    assert split.test == tuple(sorted(by_key[:3]))  # ceil(0.25 * 10) = 3
    assert split.train == tuple(sorted(by_key[3:]))
    assert make_split(list(reversed(ids)), seed=7, test_fraction=0.25) == split  # input order is irrelevant
    assert make_split(ids, seed=8, test_fraction=0.25) != split


def test_split_keeps_groups_together_and_both_sides_non_empty() -> None:
    ids = [f"p{p}_{scan}" for p in range(6) for scan in ("a", "b")]
    split = make_split(ids, seed=1, test_fraction=0.3, group_of=lambda i: i.split("_")[0])
    test_patients = {i.split("_")[0] for i in split.test}
    assert not test_patients & {i.split("_")[0] for i in split.train}
    assert len(test_patients) == math.ceil(0.3 * 6) and len(split.test) == 2 * len(test_patients)
    tiny = make_split(["a", "b"], seed=0, test_fraction=0.9)
    assert len(tiny.test) == 1 and len(tiny.train) == 1
    with pytest.raises(ValueError, match="not unique"):
        make_split(["a", "a", "b"], seed=0, test_fraction=0.5)
    with pytest.raises(ValueError, match="cannot split"):
        make_split(["a", "b"], seed=0, test_fraction=0.5, group_of=lambda i: "one")


def test_split_digest_depends_on_membership_only() -> None:
    a = Split(train=("x", "y"), test=("z",))
    assert a.digest == Split(train=("y", "x"), test=("z",)).digest
    assert a.digest != Split(train=("x", "z"), test=("y",)).digest


def test_file_checksums_are_relative_and_skip_links(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_bytes(b"a")
    (tmp_path / "link.txt").symlink_to(tmp_path / "sub" / "a.txt")
    assert file_checksums(tmp_path) == {"sub/a.txt": hashlib.sha256(b"a").hexdigest()}
    assert file_checksums(tmp_path, exclude=["sub/a.txt"]) == {}


# ---- metadata -----------------------------------------------------------------------------------------------


def test_metadata_errors_name_the_file_and_field(toy) -> None:
    folder = toy.task.folder
    text = (folder / "task.yaml").read_text()
    (folder / "task.yaml").write_text(text.replace("dim: 2d", "dim: 4d"))
    with pytest.raises(RexmleError) as info:
        load_metadata(folder / "task.yaml")
    assert "dim" in str(info.value) and str(folder / "task.yaml") in str(info.value)
    (folder / "task.yaml").write_text(text.replace("id: toy-task", "id: other-task"))
    with pytest.raises(RexmleError, match="lives in folder 'toy-task'"):
        load_metadata(folder / "task.yaml")


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "zenodo"}, "needs 'record'"),
    ({"kind": "figshare", "url": "https://figshare.com/a"}, "exactly one 'files'"),
    ({"kind": "url", "files": [{"name": "a.zip"}]}, "needs 'url'"),
    ({"kind": "gdrive", "instructions": "get it"}, "needs 'files'"),
    ({"kind": "manual", "files": [{"name": "a.zip"}]}, "'instructions'"),
    ({"kind": "zenodo", "record": "1", "files": [{"name": "../a.zip"}]}, "plain file name"),
    ({"kind": "zenodo", "record": "1", "files": [{"name": "a.zip", "md5": "XYZ"}]}, "md5"),
    ({"kind": "zenodo", "record": "1", "optional": True}, "only a gdrive or manual source can be optional"),
])
def test_data_source_rules(kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DataSource.model_validate(kwargs)


def test_valid_figshare_source_names_its_archive() -> None:
    source = DataSource(kind="figshare", url="https://figshare.com/a", files=(RemoteFile(name="avt_dataset.zip"),))
    assert source.files[0].name == "avt_dataset.zip"


# ---- extraction ---------------------------------------------------------------------------------------------


def _zip(path: Path, members: dict[str, bytes], *, symlink: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, "/etc/passwd")
    return path


def test_safe_extract_keeps_the_tree(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "a.zip", {"Top/imagesTr/x.nii.gz": b"x", "Top/License.txt": b"l"})
    safe_extract_zip(archive, tmp_path / "raw")
    assert (tmp_path / "raw" / "Top" / "imagesTr" / "x.nii.gz").read_bytes() == b"x"


@pytest.mark.parametrize("members, symlink, message", [
    ({"../evil.txt": b"x"}, None, "outside the archive root"),
    ({"ok.txt": b"x"}, "link", "symbolic link"),
])
def test_safe_extract_refuses_escapes(tmp_path: Path, members: dict, symlink: str | None, message: str) -> None:
    archive = _zip(tmp_path / "a.zip", members, symlink=symlink)
    with pytest.raises(DownloadError, match=message):
        safe_extract_zip(archive, tmp_path / "raw")
    assert not (tmp_path / "evil.txt").exists()


def test_safe_extract_reports_a_broken_archive(tmp_path: Path) -> None:
    (tmp_path / "a.zip").write_bytes(b"not a zip")
    with pytest.raises(DownloadError, match="not a valid zip"):
        safe_extract_zip(tmp_path / "a.zip", tmp_path / "raw")


# ---- descriptions and registry --------------------------------------------------------------------------------


def test_description_fills_every_placeholder(toy) -> None:
    text = render_description(toy.task, TestManifest(ids=("case_001", "case_002")), n_train=8)
    assert "{{" not in text
    assert "8 training cases, 2 test cases" in text
    assert "`mae`" in text and "the toy task's only convention" in text and "case_001,0.0" in text


def test_description_rejects_unknown_placeholders_and_appends_the_format(toy) -> None:
    folder = toy.task.folder
    (folder / "description.md").write_text("# Toy\n{{n_test}} cases.\n")
    text = render_description(toy.task, TestManifest(ids=("case_001",)), n_train=8)
    assert text.startswith("# Toy\n1 cases.") and "## Submission format" in text and "`case_id`" in text
    (folder / "description.md").write_text("# Toy\n{{n_tests}}\n")
    with pytest.raises(RexmleError, match="n_tests"):
        render_description(toy.task, TestManifest(ids=("case_001",)), n_train=8)


def test_registry_names_close_matches(toy) -> None:
    assert registry.get_task("toy-task").meta.family == "toy"
    with pytest.raises(UnknownNameError) as info:
        registry.get_task("toy-tsk")
    assert "toy-task" in str(info.value)


# ---- prepare_task ---------------------------------------------------------------------------------------------


def test_prepare_writes_public_private_and_manifests(toy, tmp_path: Path) -> None:
    dirs = task_dirs(toy.task, tmp_path)
    info = prepare_task(toy.task, dirs, synthetic=True, cases=6, seed=3)
    assert (info.n_train, info.n_test, info.synthetic, info.cases, info.seed) == (4, 2, True, 6, 3)
    assert sorted(p.name for p in dirs.public.iterdir()) == [
        "description.md", "sample_submission", "split_manifest.json", "test", "test_manifest.json", "train"]
    manifest = json.loads((dirs.public / SPLIT_MANIFEST).read_text())
    assert manifest["split_digest"] == info.split_digest
    assert manifest["sha256"] == file_checksums(dirs.public, exclude=[SPLIT_MANIFEST])
    assert list(TestManifest.read(dirs.public).ids) == manifest["test_ids"]
    assert sorted(p.name for p in (dirs.private / "labels").iterdir()) == [f"{i}.txt" for i in manifest["test_ids"]]
    assert not list(dirs.root.glob("*.partial"))


def test_prepare_is_deterministic_for_a_secret_and_seed(toy, tmp_path: Path) -> None:
    a = prepare_task(toy.task, task_dirs(toy.task, tmp_path / "a"), synthetic=True, seed=5, secret=b"pinned")
    b = prepare_task(toy.task, task_dirs(toy.task, tmp_path / "b"), synthetic=True, seed=5, secret=b"pinned")
    c = prepare_task(toy.task, task_dirs(toy.task, tmp_path / "c"), synthetic=True, seed=5)  # a drawn secret
    assert a.split_digest == b.split_digest == c.split_digest  # the split hangs on the case ids only
    archive = Path("raw", "downloads", "toy_data.zip")
    data = {name: (tmp_path / name / "toy-task" / archive).read_bytes() for name in "abc"}
    assert data["a"] == data["b"] != data["c"]


def test_prepared_task_is_reused_and_a_different_request_needs_force(toy, tmp_path: Path) -> None:
    dirs = task_dirs(toy.task, tmp_path)
    first = prepare_task(toy.task, dirs, synthetic=True, cases=6)
    assert prepare_task(toy.task, dirs, synthetic=True, cases=6) == first  # nothing redone
    with pytest.raises(UserInputError, match="6 cases") as info:
        prepare_task(toy.task, dirs, synthetic=True, cases=8)
    assert "--force" in str(info.value)
    with pytest.raises(UserInputError, match="synthetic data"):
        prepare_task(toy.task, dirs, synthetic=False)
    again = prepare_task(toy.task, dirs, synthetic=True, cases=8, force=True)
    assert (again.n_train + again.n_test, again.cases) == (8, 8)
    assert json.loads((dirs.raw / RAW_SOURCE_MARKER).read_text())["cases"] == 8


def test_force_replaces_a_shared_raw_folder(toy, tmp_path: Path) -> None:
    first = toy.add("toy-shared-a", raw_group="toyshare")
    second = toy.add("toy-shared-b", raw_group="toyshare")
    dirs_a, dirs_b = task_dirs(first, tmp_path), task_dirs(second, tmp_path)
    assert dirs_a.raw == dirs_b.raw == tmp_path / "toyshare-shared" / "raw"
    prepare_task(first, dirs_a, synthetic=True, cases=6)
    assert prepare_task(second, dirs_b, synthetic=True, cases=6).split_digest == prepared_info(dirs_a).split_digest
    with pytest.raises(UserInputError, match="--force"):
        prepare_task(second, dirs_b, synthetic=True, cases=9, force=False)
    info = prepare_task(second, dirs_b, synthetic=True, cases=9, force=True)
    assert info.n_train + info.n_test == 9


def test_failed_prepare_leaves_the_previous_preparation(toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = task_dirs(toy.task, tmp_path)
    before = prepare_task(toy.task, dirs, synthetic=True)
    public_before = file_checksums(dirs.public)
    family_class = type(toy.task.family())

    def broken(self, ctx: PrepareContext) -> TestManifest:
        (ctx.public / "half-written.txt").write_text("x")
        raise RexmleError("the raw data is broken")

    monkeypatch.setattr(family_class, "prepare", broken)
    with pytest.raises(RexmleError, match="broken"):
        prepare_task(toy.task, dirs, synthetic=True, force=True)
    assert prepared_info(dirs) == before
    assert file_checksums(dirs.public) == public_before
    assert not list(dirs.root.glob("*.partial"))


def test_family_returning_other_test_ids_is_caught(toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    family_class = type(toy.task.family())
    real_prepare = family_class.prepare

    def reordered(self, ctx: PrepareContext) -> TestManifest:
        return TestManifest(ids=tuple(reversed(real_prepare(self, ctx).ids)))

    monkeypatch.setattr(family_class, "prepare", reordered)
    dirs = task_dirs(toy.task, tmp_path)
    with pytest.raises(RuntimeError, match=r"ctx\.split\.test"):
        prepare_task(toy.task, dirs, synthetic=True)
    assert not (dirs.root / PREPARED_MARKER).exists() and not dirs.public.exists()


def test_task_dirs_follow_the_data_root(toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REXMLE_DATA_DIR", str(tmp_path / "env"))
    assert task_dirs(toy.task) == TaskDirs.for_task("toy-task", root=tmp_path / "env")
    assert task_dirs(toy.task, tmp_path / "x").public == tmp_path / "x" / "toy-task" / "public"
    assert isinstance(toy.task, Task)
