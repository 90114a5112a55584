"""Task metadata: ``challenges/<id>/task.yaml``, validated on load."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rexmle_grade.errors import RexmleError

TaskType = Literal[
    "segmentation", "instance_segmentation", "detection", "classification", "regression", "enhancement"
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RemoteFile(_Strict):
    """One file of a download. ``url`` is needed for plain-URL sources; Zenodo files are found by name."""

    name: str
    url: str | None = None
    size: int | None = Field(default=None, ge=0)
    md5: str | None = None
    sha256: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        # the name becomes a path under raw/downloads/, so it must not climb out of it
        if not v or v in (".", "..") or "/" in v or "\\" in v:
            raise ValueError(f"file name {v!r} must be a plain file name (no folders)")
        return v

    @field_validator("md5")
    @classmethod
    def _md5(cls, v: str | None) -> str | None:
        if v is not None and (len(v) != 32 or any(c not in "0123456789abcdef" for c in v)):
            raise ValueError("md5 must be 32 lower-case hex digits")
        return v

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str | None) -> str | None:
        if v is not None and (len(v) != 64 or any(c not in "0123456789abcdef" for c in v)):
            raise ValueError("sha256 must be 64 lower-case hex digits")
        return v


class DataSource(_Strict):
    """Where the raw data comes from.

    kinds: ``zenodo`` (records API, ``record`` id; ``files`` empty = the whole record), ``figshare`` (article
    download URL in ``url``, saved under the name of its one ``files`` entry), ``url`` (each file's ``url``),
    ``gdrive`` / ``manual`` (no automatic download: ``files`` name what must be in ``raw/downloads/`` and
    ``instructions`` tell the user where to get it; ``optional: true`` when the task also works without them).
    """

    kind: Literal["zenodo", "figshare", "url", "gdrive", "manual"]
    record: str | None = None
    url: str | None = None
    files: tuple[RemoteFile, ...] = ()
    instructions: str | None = None
    optional: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> DataSource:
        if self.kind == "zenodo" and not self.record:
            raise ValueError("a zenodo source needs 'record'")
        if self.kind == "figshare" and (not self.url or len(self.files) != 1):
            raise ValueError("a figshare source needs 'url' (the article download URL) and exactly one 'files' "
                             "entry naming the archive it is saved as")
        if self.kind == "url" and not all(f.url for f in self.files):
            raise ValueError("every file of a url source needs 'url'")
        if self.kind in ("gdrive", "manual") and (not self.instructions or not self.files):
            raise ValueError(f"a {self.kind} source needs 'files' (what must be placed in raw/downloads/) and "
                             "'instructions' telling the user where to get them")
        if self.optional and self.kind not in ("gdrive", "manual"):
            raise ValueError("only a gdrive or manual source can be optional (downloads are always fetched)")
        return self


class CaseCounts(_Strict):
    total: int = Field(ge=1)
    train: int = Field(ge=1)
    test: int = Field(ge=1)

    @model_validator(mode="after")
    def _sum(self) -> CaseCounts:
        if self.train + self.test != self.total:
            raise ValueError(f"train ({self.train}) + test ({self.test}) != total ({self.total})")
        return self


class SplitSpec(_Strict):
    """Deterministic train/test split (see :mod:`rexmle_tasks.splits`). Never copied into public/."""

    seed: int
    test_fraction: float = Field(gt=0, lt=1)
    note: str = ""


class LeaderboardInfo(_Strict):
    """Provenance of the human leaderboard shipped with a task."""

    file: str = "leaderboard.csv"
    source_url: str  # the challenge's leaderboard page
    via: str  # where our copy comes from (e.g. the ReX-MLE release file it was taken from)
    retrieved: dt.date  # when it entered rexmle
    phase: str
    notes: str = ""


class ChangelogEntry(_Strict):
    """One version of a task: what changed in its data, split, grading or board (newest first in task.yaml)."""

    version: str
    date: dt.date
    changes: str


KnownIssueKind = Literal["public-test-labels", "patient-isolation", "board", "grading"]


class KnownIssue(_Strict):
    """What a careful user of a task's results must know (shown by ``rexmle tasks info`` and in reports; kept out
    of public/ and of everything an agent sees)."""

    kind: KnownIssueKind
    text: str


class TaskMetadata(_Strict):
    id: str
    title: str
    competition: str
    year: int
    url: str
    licence: str
    modality: str
    dim: Literal["2d", "3d"]
    task_type: TaskType
    grader: str
    family: str
    options: dict[str, Any] = Field(default_factory=dict)
    # True when labels tell the patient's left from right (TopCoW/TopBrain vessel pairs, DENTEX quadrants): a
    # left-right flip then changes the answer, so pipelines must not mirror such images in training or at test
    # time (or must swap the paired labels with the flip, as the DENTEX detector does with quadrants)
    lateralised_labels: bool = False
    raw_group: str | None = None
    data_sources: tuple[DataSource, ...]
    cases: CaseCounts
    split: SplitSpec
    leaderboard: LeaderboardInfo | None = None
    synthetic_cases: int = Field(default=10, ge=4)
    # labelled cases of the realistic mirror when none are asked for (None: synthetic_cases): enough for the quick
    # trained baseline to learn the confounders a heuristic cannot, within CPU minutes (issue 36)
    realistic_cases: int | None = Field(default=None, ge=4)
    # GPU-hours of the published ("full") recipe of the task's preferred expert baseline on one GPU: a planning
    # estimate (rexmle-baselines' README, "Times"), not a measurement. The lite split is chosen from it
    # (rexmle_tasks.lite); None leaves the task out of the lite split.
    full_baseline_gpu_hours: float | None = Field(default=None, gt=0)
    version: str
    changelog: tuple[ChangelogEntry, ...] = ()
    known_issues: tuple[KnownIssue, ...] = ()

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not v or any(c not in "abcdefghijklmnopqrstuvwxyz0123456789-_" for c in v):
            raise ValueError("task ids use lower-case letters, digits, '-' and '_'")
        return v

    @model_validator(mode="after")
    def _changelog_names_the_version(self) -> TaskMetadata:
        if self.changelog and self.changelog[0].version != self.version:
            raise ValueError(f"the changelog's newest entry is version {self.changelog[0].version!r} but the task "
                             f"is version {self.version!r}: add an entry for {self.version!r} at the top")
        return self


def load_metadata(path: Path) -> TaskMetadata:
    """Load and validate a task.yaml; errors name the file and every bad field."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RexmleError(f"cannot read task metadata {path}: {exc}") from None
    try:
        meta = TaskMetadata.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise RexmleError(f"invalid task metadata {path}: {problems}") from None
    if meta.id != path.parent.name:
        raise RexmleError(f"task metadata {path} declares id {meta.id!r} but lives in folder {path.parent.name!r}")
    return meta
