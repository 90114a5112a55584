"""Re-gradable result bundles: ``rexmle bundle runs/GROUP -o bundle.tar.zst`` and ``rexmle bundle verify``.

A bundle holds what a maintainer needs to re-grade and audit a group's results, and nothing of the workspace:
per run its ``spec.json``, ``status.json`` (hardware, usage), ``journal.jsonl``, ``grade.json``, ``cluster.json``
and the selection split's secret when there are, ``final/`` (the chosen submission and its code) and, with
``--cassettes``, ``cassette.jsonl`` (every model call). ``manifest.json`` lists every member with its size and
SHA-256, and per run the versions, the hardware and the bundled grade.

Verification re-grades each run's final submission with the local graders and private data (the grading code the
runner uses, :func:`rexmle_agents.harness.runner.grade_run`), compares the outcome with the bundled grade, checks
every member against the manifest, and counts each result row's seeds (a claim needs at least
:data:`MIN_CLAIM_SEEDS`; fewer is stated, not an error). Any difference makes ``verify`` exit 1.

A bundle is untrusted input: it is read as a stream, and a member that is not a regular file or folder (a link, a
device), whose name is absolute, climbs out with ``..`` or repeats an earlier name, or that is larger than
:data:`MAX_MEMBER_BYTES` (or the bundle's total than :data:`MAX_TOTAL_BYTES`, counted as bytes are written, never from
headers) is refused before anything of it is used. The compression follows the file name: ``.tar.zst`` (the
``zstandard`` package) or ``.tar.gz``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import math
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict, Field

from rexmle_agents.results.loader import (
    CLUSTER_FILE,
    GRADE_FILE,
    JOURNAL_FILE,
    SPEC_FILE,
    STATUS_FILE,
    RunRecord,
    load_run,
    load_runs,
)
from rexmle_grade.errors import RexmleError, UserInputError
from rexmle_grade.report import ReportEntry
from rexmle_grade.settings import rexmle_versions

BUNDLE_FORMAT = 1
MANIFEST = "manifest.json"
RUNS_PREFIX = "runs"
CASSETTE_FILE = "cassette.jsonl"
FINAL_DIR = "final"
MIN_CLAIM_SEEDS = 3
MAX_MEMBER_BYTES = 4 << 30
MAX_TOTAL_BYTES = 32 << 30
MAX_MEMBERS = 200_000
SUFFIXES = {".tar.zst": "zst", ".tar.gz": "gz", ".tgz": "gz"}
# what must agree between a bundled grade and a fresh one (paths and timings differ by nature)
COMPARED_FIELDS = ("task_version", "status", "valid_submission", "percentile", "positions", "gold_medal",
                   "silver_medal", "bronze_medal", "above_median", "leaderboard_version", "synthetic")


class BundleError(UserInputError):
    """A bundle that cannot be made or must not be read (unsafe member, too large, wrong format)."""


class BundledFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    size: int
    sha256: str


class BundledRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    task_id: str
    task_version: str
    agent: str
    model: str
    config: str
    time_limit_s: float
    seed: int
    variant: str
    state: str
    rexmle_versions: dict[str, str]
    hardware: dict[str, Any] | None
    grade: ReportEntry | None


class BundleManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = "rexmle-result-bundle"
    format: int = BUNDLE_FORMAT
    created_at: str = Field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    created_by: dict[str, str] = Field(default_factory=rexmle_versions)
    group: str
    cassettes: bool
    runs: list[BundledRun]
    files: list[BundledFile]
    refused: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# packing


def compression_of(path: Path) -> str:
    for suffix, kind in SUFFIXES.items():
        if path.name.endswith(suffix):
            if kind == "zst":
                _zstandard()
            return kind
    raise BundleError(f"{path.name}: a bundle is named *.tar.zst or *.tar.gz, not {''.join(path.suffixes) or 'that'}",
                      hint="e.g. -o bundle.tar.zst")


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError:
        raise BundleError("a .tar.zst bundle needs the zstandard package",
                          hint="pip install zstandard, or name the bundle *.tar.gz") from None
    return zstandard


def _run_files(run_dir: Path, *, cassettes: bool) -> Iterator[tuple[str, Path]]:
    """(name inside the run, path) of what a bundle carries; only regular files, never a link. A run with a
    selection split carries its secret: without it the re-grade would draw other test cases."""
    from rexmle_tasks.selection import SELECTION_SECRET_FILE

    for name in (SPEC_FILE, STATUS_FILE, JOURNAL_FILE, GRADE_FILE, CLUSTER_FILE, SELECTION_SECRET_FILE,
                 *((CASSETTE_FILE,) if cassettes else ())):
        path = run_dir / name
        if path.is_file() and not path.is_symlink():
            yield name, path
    final = run_dir / FINAL_DIR
    if final.is_dir() and not final.is_symlink():
        for root, dirs, files in os.walk(final):  # os.walk does not follow links to folders
            dirs.sort()
            for name in sorted(files):
                path = Path(root, name)
                if path.is_file() and not path.is_symlink():
                    yield path.relative_to(run_dir).as_posix(), path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _bundled_run(run: RunRecord) -> BundledRun:
    spec = run.spec
    hardware = run.status.hardware.model_dump(mode="json") if run.status.hardware is not None else None
    return BundledRun(run_id=run.run_id, task_id=spec.task_id, task_version=spec.task_version, agent=spec.agent,
                      model=",".join(f"{r}={m}" for r, m in sorted(spec.models.items())) or "-",
                      config=json.dumps(spec.agent_config, sort_keys=True), time_limit_s=spec.limits.time_limit_s,
                      seed=spec.seed, variant=run.variant, state=run.status.state,
                      rexmle_versions=dict(spec.rexmle_versions), hardware=hardware, grade=run.grade)


def pack_bundle(group_dir: Path, out: Path, *, cassettes: bool = False) -> BundleManifest:
    """Write the bundle of every run under ``group_dir`` to ``out`` (see the module docstring)."""
    kind = compression_of(out)
    runs = load_runs([group_dir])
    if not runs.runs:
        raise BundleError(f"no readable run folders under {group_dir}",
                          hint="; ".join(f"{p}: {why}" for p, why in runs.refused) or "pass runs/<group>/")
    members: list[tuple[str, Path]] = []
    for run in sorted(runs.runs, key=lambda r: r.run_id):
        members += [(f"{RUNS_PREFIX}/{run.run_id}/{name}", path)
                    for name, path in _run_files(run.run_dir, cassettes=cassettes)]
    manifest = BundleManifest(group=Path(group_dir).resolve().name, cassettes=cassettes,
                              runs=[_bundled_run(r) for r in sorted(runs.runs, key=lambda r: r.run_id)],
                              files=[BundledFile(path=name, size=path.stat().st_size, sha256=_sha256(path))
                                     for name, path in members],
                              refused=[f"{p}: {why}" for p, why in runs.refused])
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    with _open_for_writing(partial, kind) as raw, tarfile.open(fileobj=raw, mode="w|") as tar:
        body = (manifest.model_dump_json(indent=1) + "\n").encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime, info.mode = len(body), int(dt.datetime.now().timestamp()), 0o644
        tar.addfile(info, io.BytesIO(body))
        for name, path in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = path.stat().st_size, int(path.stat().st_mtime), 0o644
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    partial.replace(out)
    return manifest


@contextlib.contextmanager
def _open_for_writing(path: Path, kind: str) -> Iterator[IO[bytes]]:
    with path.open("wb") as handle:
        if kind == "gz":
            import gzip

            with gzip.GzipFile(fileobj=handle, mode="wb", mtime=0) as stream:
                yield stream  # type: ignore[misc]
        else:
            with _zstandard().ZstdCompressor(level=10).stream_writer(handle, closefd=False) as stream:
                yield stream


# ---------------------------------------------------------------------------------------------------------------
# safe reading


@contextlib.contextmanager
def _open_for_reading(path: Path) -> Iterator[IO[bytes]]:
    kind = compression_of(path)
    with path.open("rb") as handle:
        if kind == "gz":
            import gzip

            with gzip.GzipFile(fileobj=handle, mode="rb") as stream:
                yield stream  # type: ignore[misc]
        else:
            with _zstandard().ZstdDecompressor().stream_reader(handle) as stream:
                yield stream


def safe_member_name(name: str) -> PurePosixPath:
    """The member's path inside the extraction folder; raises :class:`BundleError` for anything that could leave
    it or is not plain."""
    pure = PurePosixPath(name)
    if not name or "\\" in name or "\x00" in name or pure.is_absolute() or any(p in ("..", "") for p in pure.parts) \
            or name.startswith("/"):
        raise BundleError(f"bundle member {name!r} has an unsafe name (absolute, '..', or odd characters)",
                          hint="the bundle was not made by `rexmle bundle` or was altered; it is not extracted")
    return PurePosixPath(*[p for p in pure.parts if p != "."])


def extract_bundle(bundle: Path, into: Path, *, max_member: int = MAX_MEMBER_BYTES,
                   max_total: int = MAX_TOTAL_BYTES) -> BundleManifest:
    """Extract ``bundle`` into the empty folder ``into``, refusing it whole at the first unsafe member (see the
    module docstring); returns its manifest."""
    into.mkdir(parents=True, exist_ok=True)
    root = into.resolve()
    seen: set[PurePosixPath] = set()
    total = 0
    with _open_for_reading(bundle) as stream:
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for count, member in enumerate(tar, start=1):
                    if count > MAX_MEMBERS:
                        raise BundleError(f"{bundle.name} holds more than {MAX_MEMBERS} members")
                    rel = safe_member_name(member.name)
                    if rel in seen:
                        raise BundleError(f"bundle member {member.name!r} appears twice (a later copy would replace "
                                          "the one checked)")
                    seen.add(rel)
                    target = root.joinpath(*rel.parts)
                    if member.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    if not member.isfile():
                        what = "a symbolic link" if member.issym() else "a hard link" if member.islnk() else \
                            "not a regular file"
                        raise BundleError(f"bundle member {member.name!r} is {what}; bundles hold regular files only",
                                          hint="the bundle was not made by `rexmle bundle` or was altered")
                    if member.size > max_member:
                        raise BundleError(f"bundle member {member.name!r} declares {member.size} bytes, more than "
                                          f"the {max_member} allowed")
                    for parent in reversed(target.relative_to(root).parents[:-1]):
                        folder = root / parent
                        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                            raise BundleError(f"bundle member {member.name!r} would be written through "
                                              f"{parent.as_posix()!r}, which is not a folder")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    if source is None:
                        raise BundleError(f"bundle member {member.name!r} has no content")
                    written = 0
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                    with os.fdopen(os.open(target, flags, 0o644), "wb") as handle:
                        while block := source.read(1 << 20):
                            written += len(block)
                            total += len(block)
                            if written > max_member or total > max_total:
                                raise BundleError(f"{bundle.name} is larger than allowed ({max_member} bytes a "
                                                  f"member, {max_total} in all); it is not read further")
                            handle.write(block)
        except (tarfile.TarError, EOFError, OSError) as exc:
            if isinstance(exc, FileExistsError):
                raise BundleError(f"bundle member {exc.filename} is written twice") from None
            raise BundleError(f"{bundle.name} is not a readable bundle: {exc}",
                              hint="make it with `rexmle bundle runs/<group> -o NAME.tar.zst`") from None
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise BundleError(f"{bundle.name} has no {MANIFEST}", hint="make it with `rexmle bundle`")
    try:
        return BundleManifest.model_validate_json(manifest_path.read_bytes())
    except ValueError as exc:
        raise BundleError(f"{bundle.name}'s {MANIFEST} is not a bundle manifest: {exc}") from None


# ---------------------------------------------------------------------------------------------------------------
# verification


@dataclass
class RunCheck:
    run_id: str
    differences: list[str] = field(default_factory=list)
    regraded: ReportEntry | None = None


@dataclass
class SeedCount:
    row: str
    seeds: list[int]

    @property
    def enough(self) -> bool:
        return len(self.seeds) >= MIN_CLAIM_SEEDS


@dataclass
class Verification:
    manifest: BundleManifest
    runs: list[RunCheck]
    files: list[str]  # members that differ from the manifest (or are missing / unlisted)
    seeds: list[SeedCount]

    @property
    def differences(self) -> int:
        return len(self.files) + sum(len(r.differences) for r in self.runs)

    def lines(self) -> list[str]:
        out = [f"bundle of group {self.manifest.group}: {len(self.runs)} run(s), made {self.manifest.created_at} by "
               + ", ".join(f"{k} {v}" for k, v in sorted(self.manifest.created_by.items()))]
        out += [f"file: {problem}" for problem in self.files]
        for run in self.runs:
            out += [f"{run.run_id}: {d}" for d in run.differences] or [f"{run.run_id}: re-graded identical"]
        for count in self.seeds:
            note = "" if count.enough else f" (fewer than {MIN_CLAIM_SEEDS}: not enough for a claim)"
            out.append(f"seeds of {count.row}: {len(count.seeds)} {count.seeds}{note}")
        out.append(f"{self.differences} difference(s)" if self.differences else "no differences")
        return out


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def compare_grades(bundled: ReportEntry, fresh: ReportEntry) -> list[str]:
    """What differs between a bundled grade and a fresh one, one line each."""
    differences = [f"{name}: bundled {getattr(bundled, name)!r}, re-graded {getattr(fresh, name)!r}"
                   for name in COMPARED_FIELDS if not _close(getattr(bundled, name), getattr(fresh, name))]
    for metric in sorted(set(bundled.metrics) | set(fresh.metrics)):
        old, new = bundled.metrics.get(metric), fresh.metrics.get(metric)
        if not _close(old, new):
            differences.append(f"metric {metric}: bundled {old!r}, re-graded {new!r}")
    return differences


def _check_files(root: Path, manifest: BundleManifest) -> list[str]:
    problems = []
    listed = {f.path: f for f in manifest.files}
    for name, entry in listed.items():
        path = root.joinpath(*safe_member_name(name).parts)
        if not path.is_file():
            problems.append(f"{name} is listed in the manifest but not in the bundle")
        elif path.stat().st_size != entry.size or _sha256(path) != entry.sha256:
            problems.append(f"{name} differs from the manifest's checksum (altered after packing)")
    for path in sorted((root / RUNS_PREFIX).rglob("*")) if (root / RUNS_PREFIX).is_dir() else []:
        name = path.relative_to(root).as_posix()
        if path.is_file() and name not in listed:
            problems.append(f"{name} is in the bundle but not in its manifest")
    return problems


def _regrade(run_dir: Path, data_root: Path | None) -> ReportEntry:
    from rexmle_agents.harness.paths import RunPaths
    from rexmle_agents.harness.runner import grade_run

    spec = load_run(run_dir).spec
    if data_root is not None:
        spec = spec.model_copy(update={"data_root": str(data_root)})
    return grade_run(spec, RunPaths(run_dir))


def _seed_counts(manifest: BundleManifest) -> list[SeedCount]:
    rows: dict[str, set[int]] = {}
    for run in manifest.runs:
        row = (f"{run.agent} {run.model} config={run.config} budget={run.time_limit_s:g}s on {run.task_id} "
               f"{run.task_version} ({run.variant})")
        rows.setdefault(row, set()).add(run.seed)
    return [SeedCount(row=row, seeds=sorted(seeds)) for row, seeds in sorted(rows.items())]


def verify_bundle(bundle: Path, *, data_root: Path | None = None, work_dir: Path | None = None) -> Verification:
    """Extract ``bundle`` safely, check its members against the manifest, re-grade every run with the local
    graders and private data (``data_root``: where the tasks are prepared here, default the runs' own), and count
    each row's seeds."""
    with tempfile.TemporaryDirectory(prefix="rexmle-bundle-", dir=work_dir) as tmp:
        root = Path(tmp)
        manifest = extract_bundle(bundle, root)
        files = _check_files(root, manifest)
        checks = []
        for run in manifest.runs:
            check = RunCheck(run_id=run.run_id)
            run_dir = root / RUNS_PREFIX / safe_member_name(run.run_id).as_posix()
            bundled = _bundled_grade(run_dir)
            if bundled is None:
                check.differences.append("no grade.json in the bundle: nothing to compare")
            try:
                check.regraded = _regrade(run_dir, data_root)
            except RexmleError as exc:
                check.differences.append(f"could not be re-graded here: {exc.message}"
                                         + (f" ({exc.hint})" if exc.hint else ""))
            if bundled is not None and check.regraded is not None:
                check.differences += compare_grades(bundled, check.regraded)
            if run.grade is not None and bundled is not None and compare_grades(run.grade, bundled):
                check.differences.append("the manifest's grade and grade.json disagree")
            checks.append(check)
        return Verification(manifest=manifest, runs=checks, files=files, seeds=_seed_counts(manifest))


def _bundled_grade(run_dir: Path) -> ReportEntry | None:
    path = run_dir / GRADE_FILE
    if not path.is_file():
        return None
    try:
        return ReportEntry.model_validate_json(path.read_bytes())
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------------------------
# the verb


def bundle_command(
    target: Annotated[list[str], typer.Argument(
        metavar="GROUP | verify BUNDLE", help="A group folder (runs/<group>) to pack, or `verify BUNDLE`.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="The bundle to write (*.tar.zst or *.tar.gz).")]
    = None,
    cassettes: Annotated[bool, typer.Option("--cassettes", help="Include every run's model calls (cassette.jsonl).")]
    = False,
    data_root: Annotated[Path | None, typer.Option(
        help="verify: where the tasks are prepared here (default: the data folder each run used).")] = None,
) -> None:
    """Pack a group's results into a re-gradable bundle, or verify one (re-grade every run; exit 1 on any
    difference)."""
    from rich.console import Console
    from rich.text import Text

    console = Console()
    if target[0] == "verify" and len(target) == 2:
        result = verify_bundle(Path(target[1]), data_root=data_root)
        for line in result.lines():
            console.print(Text(line))
        if result.differences:
            raise typer.Exit(1)
        return
    if len(target) != 1 or out is None:
        raise UserInputError(f"rexmle bundle {' '.join(target)}: expected one group folder and -o BUNDLE, or "
                             "`verify BUNDLE`", hint="rexmle bundle runs/GROUP -o bundle.tar.zst")
    manifest = pack_bundle(Path(target[0]), out, cassettes=cassettes)
    console.print(Text(f"{out}: {len(manifest.runs)} run(s), {len(manifest.files)} file(s)"
                       + (f"; {len(manifest.refused)} folder(s) refused" if manifest.refused else "")))
