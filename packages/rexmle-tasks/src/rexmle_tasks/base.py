"""Tasks and task families.

A *task* is one challenge id: its metadata (``challenges/<id>/task.yaml``), its agent-facing description template
(``challenges/<id>/description.md``), its human leaderboard (``challenges/<id>/leaderboard.csv``) and the grader
named in its metadata. A *family* is the code shared by the tasks of one competition (the six TopCoW tasks share
one download and one preparation routine, parameterised by ``options`` in task.yaml).

Data flow (the same for real and synthetic data):

1. ``raw/downloads/`` receives the archives, either downloaded (:mod:`rexmle_tasks.download`) or written by the
   family's synthetic mirror (:meth:`TaskFamily.write_synthetic_download`) with the real archive names;
2. :meth:`TaskFamily.extract` unpacks them into ``raw/`` exactly as the real archives unpack;
3. :meth:`TaskFamily.case_ids` lists the labelled cases found in ``raw/``; the framework splits them
   deterministically (:mod:`rexmle_tasks.splits`);
4. :meth:`TaskFamily.prepare` writes ``public/`` (train images + labels, test inputs) and ``private/``
   (``answers.csv`` + test labels) and returns the public :class:`TestManifest`;
5. the framework adds the test manifest, the sample submission (from the grader), the description (with the
   submission format generated from the grader's schema) and the split manifests.
"""

from __future__ import annotations

import shutil
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rexmle_grade.errors import DownloadError
from rexmle_grade.grader import Grader, TestManifest, get_grader
from rexmle_tasks.metadata import TaskMetadata
from rexmle_tasks.splits import Split

DOWNLOADS = "downloads"
#: how hard a synthetic mirror is: ``easy`` (clean contrasts, fast tests) or ``realistic`` (the confounders of real
#: data: bias fields, scanner and case intensity variation, distractors, imbalance, small structures, label noise)
DIFFICULTIES = ("easy", "realistic")
MAX_EXTRACTED_BYTES = 200 * 1024**3  # no real archive of ours unpacks to more than this


@dataclass(frozen=True)
class PrepareContext:
    """What a family's ``prepare`` gets."""

    raw: Path
    public: Path
    private: Path
    split: Split
    options: dict[str, Any]


class TaskFamily(ABC):
    """Shared preparation code of one competition's tasks. Subclasses register with :func:`register_family`."""

    name: ClassVar[str]
    #: the synthetic difficulties this family's mirror writes; a family listing ``realistic`` takes
    #: ``difficulty=`` in :meth:`write_synthetic_download`
    synthetic_difficulties: ClassVar[tuple[str, ...]] = ("easy",)

    def __init__(self, meta: TaskMetadata) -> None:
        self.meta = meta
        self.options = dict(meta.options)

    # ---- raw data ---------------------------------------------------------------------------------------------
    @abstractmethod
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int) -> None:
        """Write small synthetic archives into ``downloads`` with the real file names, folder layout inside the
        archives, file formats and label conventions (DATA_LAYOUTS.md), so that ``extract`` + ``prepare`` run
        unchanged. ``cases`` is the number of labelled cases (per modality where a download holds several).
        Families with more than the ``easy`` mirror (:attr:`synthetic_difficulties`) also take ``difficulty``."""

    def extract(self, downloads: Path, raw: Path) -> None:
        """Unpack the archives into ``raw`` as the real ones unpack (default: every ``.zip`` into ``raw``)."""
        for archive in sorted(downloads.glob("*.zip")):
            safe_extract_zip(archive, raw)

    @abstractmethod
    def case_ids(self, raw: Path) -> list[str]:
        """The labelled case ids of this task found in the extracted ``raw`` folder."""

    def split_group(self, case_id: str) -> str:
        """Cases of one group always land on the same side of the split (default: each case alone)."""
        return case_id

    def fixed_split(self, raw: Path) -> Split | None:
        """A split the data itself dictates (an official labelled test set found in ``raw``), used instead of the
        hashed split; ``None`` (the default): the hashed split of :func:`rexmle_tasks.splits.make_split`."""
        return None

    # ---- preparation ------------------------------------------------------------------------------------------
    @abstractmethod
    def prepare(self, ctx: PrepareContext) -> TestManifest:
        """Write public/ and private/ (see module docstring) and return the public test manifest."""


_FAMILIES: dict[str, type[TaskFamily]] = {}


def register_family(cls: type[TaskFamily]) -> type[TaskFamily]:
    if cls.name in _FAMILIES and _FAMILIES[cls.name] is not cls:
        raise ValueError(f"task family {cls.name!r} registered twice")
    _FAMILIES[cls.name] = cls
    return cls


def family_class(name: str) -> type[TaskFamily]:
    import importlib
    import pkgutil

    import rexmle_tasks.families as pkg

    if name not in _FAMILIES:
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{pkg.__name__}.{info.name}")
    if name not in _FAMILIES:
        raise KeyError(f"no task family {name!r} (known: {sorted(_FAMILIES)})")
    return _FAMILIES[name]


@dataclass(frozen=True)
class Task:
    meta: TaskMetadata
    folder: Path  # the package folder challenges/<id>/

    @property
    def id(self) -> str:
        return self.meta.id

    @property
    def grader(self) -> Grader:
        return get_grader(self.meta.grader)

    def family(self) -> TaskFamily:
        return family_class(self.meta.family)(self.meta)

    @property
    def description_template(self) -> str:
        return (self.folder / "description.md").read_text()


def safe_extract_zip(archive: Path, dest: Path, *, on_member: Callable[[str], None] | None = None) -> None:
    """Extract a zip archive refusing absolute paths, ``..`` members, symlinks and zip bombs."""
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            total = sum(m.file_size for m in members)
            if total > MAX_EXTRACTED_BYTES:
                raise DownloadError(f"{archive.name} would unpack to {total} bytes; refusing (limit "
                                    f"{MAX_EXTRACTED_BYTES})")
            for m in members:
                target = (root / m.filename).resolve()
                if not target.is_relative_to(root) or m.filename.startswith(("/", "\\")):
                    raise DownloadError(f"{archive.name} has a member outside the archive root: {m.filename!r}")
                if (m.external_attr >> 16) & 0o170000 == 0o120000:
                    raise DownloadError(f"{archive.name} contains a symbolic link {m.filename!r}; refusing")
            for m in members:
                zf.extract(m, root)
                if on_member:
                    on_member(m.filename)
    except zipfile.BadZipFile as exc:
        raise DownloadError(f"{archive.name} is not a valid zip archive ({exc}); delete it and download again") \
            from None


def reset_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path
