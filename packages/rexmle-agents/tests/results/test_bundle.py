"""Re-gradable result bundles: a bundle of real sandboxed runs re-verifies identical; a tampered grade or submission
is reported (exit 1); a bundle that tries to write outside its folder, plant a link or overflow is refused whole."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.results.bundle import (
    MANIFEST,
    BundleError,
    extract_bundle,
    pack_bundle,
    verify_bundle,
)
from rexmle_grade.cli import main

from .conftest import TASK, needs_bwrap

pytestmark = needs_bwrap


@pytest.fixture(scope="module")
def three_seeds(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/b/: the sample agent on synthetic LDCT-IQA, seeds 0, 1 and 2, each graded by the harness."""
    runs = tmp_path_factory.mktemp("bundle-runs")
    for seed in (0, 1, 2):
        outcome = execute_run(build_spec(TASK, agent="sample", data_root=data_root, group="b", seed=seed), runs)
        assert outcome.state == "finished" and outcome.grade is not None, outcome.reason
    return runs / "b"


def repack(folder: Path, out: Path) -> Path:
    """A bundle folder packed again as a .tar.gz, as someone altering a bundle would."""
    with tarfile.open(out, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=path.relative_to(folder).as_posix())
    return out


def rewrite_manifest_entry(folder: Path, member: str) -> None:
    """Bring the manifest's checksum in line with an altered member, so only the re-grade can notice."""
    import hashlib

    manifest = json.loads((folder / MANIFEST).read_text())
    for entry in manifest["files"]:
        if entry["path"] == member:
            data = (folder / member).read_bytes()
            entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_a_bundle_of_a_group_re_verifies_identical(three_seeds: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bundle.tar.zst"
    assert main(["bundle", str(three_seeds), "-o", str(out)]) == 0
    with out.open("rb") as handle:
        assert handle.read(4) == b"\x28\xb5\x2f\xfd"  # the zstd frame magic: compressed as the name says
    result = verify_bundle(out)
    assert result.differences == 0, result.lines()
    assert len(result.runs) == 3 and all(r.regraded is not None and r.regraded.valid_submission for r in result.runs)
    # what a maintainer needs to audit: versions, hardware, spec, status, journal, the final submission
    manifest = result.manifest
    assert all(r.rexmle_versions and r.hardware and r.task_version for r in manifest.runs)
    names = {f.path.split("/", 2)[2] for f in manifest.files}
    assert {"spec.json", "status.json", "journal.jsonl", "grade.json", "final/submission/submission.csv"} <= names
    assert not any(n.startswith("workspace") or n == "cassette.jsonl" for n in names)  # cassettes only when asked
    [row] = result.seeds
    assert row.seeds == [0, 1, 2] and row.enough
    capsys.readouterr()
    assert main(["bundle", "verify", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "re-graded identical" in text and "no differences" in text and "not enough for a claim" not in text


def test_fewer_than_three_seeds_are_stated_and_gz_follows_the_name(three_seeds: Path, tmp_path: Path) -> None:
    group = tmp_path / "two"
    for run_dir in sorted(three_seeds.iterdir())[:2]:
        if (run_dir / "spec.json").is_file():
            shutil.copytree(run_dir, group / run_dir.name, symlinks=True)
    out = pack_bundle(group, tmp_path / "two.tar.gz", cassettes=True)
    assert (tmp_path / "two.tar.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert out.cassettes
    result = verify_bundle(tmp_path / "two.tar.gz")
    assert result.differences == 0
    [row] = result.seeds
    assert len(row.seeds) == 2 and not row.enough
    assert any("fewer than 3: not enough for a claim" in line for line in result.lines())


def test_a_tampered_grade_is_reported(three_seeds: Path, tmp_path: Path, capsys) -> None:
    bundle = pack_bundle(three_seeds, tmp_path / "b.tar.zst") and tmp_path / "b.tar.zst"
    folder = tmp_path / "open"
    manifest = extract_bundle(bundle, folder)
    run_id = manifest.runs[0].run_id
    member = f"runs/{run_id}/grade.json"
    grade = json.loads((folder / member).read_text())
    grade["metrics"]["score"] = grade["metrics"]["score"] + 0.5
    grade["percentile"] = 1.0
    (folder / member).write_text(json.dumps(grade))
    rewrite_manifest_entry(folder, member)
    altered = repack(folder, tmp_path / "altered.tar.gz")
    result = verify_bundle(altered)
    differences = {r.run_id: r.differences for r in result.runs}
    assert any(d.startswith("metric score: bundled") for d in differences[run_id])
    assert any(d.startswith("percentile: bundled 1.0") for d in differences[run_id])
    assert all(not d for r, d in differences.items() if r != run_id)
    capsys.readouterr()
    assert main(["bundle", "verify", str(altered)]) == 1
    assert "re-graded" in capsys.readouterr().out


def test_a_tampered_submission_is_reported(three_seeds: Path, tmp_path: Path) -> None:
    pack_bundle(three_seeds, tmp_path / "b.tar.zst")
    folder = tmp_path / "open"
    manifest = extract_bundle(tmp_path / "b.tar.zst", folder)
    run_id = manifest.runs[1].run_id
    member = f"runs/{run_id}/final/submission/submission.csv"
    lines = (folder / member).read_text().splitlines()
    # a submission that was not the one graded: its scores follow the row order instead of the sample's constant
    lines = [lines[0], *(f"{line.split(',')[0]},{i % 5}" for i, line in enumerate(lines[1:]))]
    (folder / member).write_text("\n".join(lines) + "\n")
    # with the manifest left alone the checksum catches it; with the manifest rewritten, the re-grade does
    result = verify_bundle(repack(folder, tmp_path / "a.tar.gz"))
    assert result.files == [f"{member} differs from the manifest's checksum (altered after packing)"]
    rewrite_manifest_entry(folder, member)
    result = verify_bundle(repack(folder, tmp_path / "b.tar.gz"))
    assert result.files == []
    [check] = [r for r in result.runs if r.run_id == run_id]
    assert any(d.startswith("metric ") for d in check.differences), check.differences


def malicious(out: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    with tarfile.open(out, "w:gz") as tar:
        body = json.dumps({"group": "g", "cassettes": False, "runs": [], "files": []}).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
        if member.isfile():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    return out


@pytest.mark.parametrize("name", ["../escaped", "runs/../../escaped", "/tmp/absolute-escaped", "runs/a\\..\\b"])
def test_a_member_that_climbs_out_is_refused(tmp_path: Path, name: str) -> None:
    bundle = malicious(tmp_path / "evil.tar.gz", tarfile.TarInfo(name))
    with pytest.raises(BundleError, match="unsafe name"):
        extract_bundle(bundle, tmp_path / "into")
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/absolute-escaped").exists()


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE])
def test_a_link_or_special_member_is_refused(tmp_path: Path, kind: bytes) -> None:
    member = tarfile.TarInfo("runs/r/final/submission/submission.csv")
    member.type = kind
    member.linkname = "/etc/passwd"
    bundle = malicious(tmp_path / "link.tar.gz", member)
    with pytest.raises(BundleError, match="regular files only"):
        extract_bundle(bundle, tmp_path / "into")
    assert not (tmp_path / "into" / "runs" / "r" / "final" / "submission" / "submission.csv").exists()
    # and the verb says so instead of re-grading anything
    assert main(["bundle", "verify", str(bundle)]) != 0


def test_a_member_over_the_size_bound_is_refused_as_it_is_read(tmp_path: Path) -> None:
    bundle = malicious(tmp_path / "big.tar.gz", tarfile.TarInfo("runs/r/journal.jsonl"), data=b"y" * 5000)
    with pytest.raises(BundleError, match="more than the 4096 allowed"):
        extract_bundle(bundle, tmp_path / "a", max_member=4096)
    with pytest.raises(BundleError, match="larger than allowed"):
        extract_bundle(bundle, tmp_path / "b", max_total=4096)


def test_a_repeated_member_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "twice.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for data in (b"{}", b"{}"):
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match="appears twice"):
        extract_bundle(out, tmp_path / "into")
