"""Submission schemas: what a grader expects, declared once.

A task's agent-facing description, the sample submission and validation are all derived from the grader's
:class:`SubmissionSchema`, so they can never disagree.

Every submission is a folder holding ``submission.csv`` (one row per test case) and the prediction files that
its path columns name, relative to the folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

SUBMISSION_CSV = "submission.csv"


class FileKind(str, Enum):
    """What a prediction file holds; decides how it is read and checked."""

    LABEL_VOLUME = "label_volume"  # 3-D integer label map on the test image's voxel grid
    LABEL_IMAGE = "label_image"  # 2-D integer class map, same size as the test image
    INSTANCE_IMAGE = "instance_image"  # 2-D integer instance map (0 background, one id per object)
    GRAY_IMAGE = "gray_image"  # 2-D 8-bit grayscale image
    JSON = "json"  # a JSON document whose structure the grader checks

    @property
    def is_image(self) -> bool:
        return self is not FileKind.JSON


@dataclass(frozen=True)
class FileColumn:
    """A CSV column holding the relative path of one prediction file per case."""

    name: str
    kind: FileKind
    path_template: str  # e.g. "predictions/{id}.nii.gz": where the sample submission puts files
    suffixes: tuple[str, ...]  # accepted file suffixes, lower-case, e.g. (".nii.gz",)
    description: str
    labels: tuple[int, ...] | None = None  # allowed values for label/instance kinds (None: any non-negative)
    match_geometry: bool = True  # must have the test image's size (and spacing/origin/direction in 3-D)

    def path_for(self, case_id: str) -> str:
        return self.path_template.format(id=case_id)


@dataclass(frozen=True)
class ValueColumn:
    """A CSV column holding a value per case (a score, or a constant such as the modality)."""

    name: str
    dtype: type  # float, int or str
    description: str
    choices: tuple[str, ...] | None = None  # allowed values (strings as written in the CSV)
    example: str | None = None


Column = FileColumn | ValueColumn


@dataclass(frozen=True)
class SubmissionSchema:
    id_column: str
    columns: tuple[Column, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def column_names(self) -> list[str]:
        return [self.id_column, *(c.name for c in self.columns)]

    @property
    def file_columns(self) -> list[FileColumn]:
        return [c for c in self.columns if isinstance(c, FileColumn)]

    @property
    def value_columns(self) -> list[ValueColumn]:
        return [c for c in self.columns if isinstance(c, ValueColumn)]

    def example_row(self, case_id: str) -> dict[str, str]:
        row = {self.id_column: case_id}
        for col in self.columns:
            if isinstance(col, FileColumn):
                row[col.name] = col.path_for(case_id)
            else:
                row[col.name] = col.example or (col.choices[0] if col.choices else "0.0")
        return row

    def to_markdown(self, example_ids: list[str]) -> str:
        """The submission-format section of a task description."""
        lines = [
            "Write a folder containing `submission.csv` and the files it names (paths relative to that folder; "
            "absolute paths, `..` and links leading outside the folder are rejected).",
            "",
            f"`submission.csv` has exactly these columns, one row per test case, every test id exactly once: "
            f"{', '.join(f'`{n}`' for n in self.column_names)}.",
            "",
            "| column | content |",
            "|---|---|",
            f"| `{self.id_column}` | test case id, as listed in the sample submission |",
        ]
        for col in self.columns:
            if isinstance(col, FileColumn):
                accepted = ", ".join(f"`{s}`" for s in col.suffixes)
                extra = ""
                if col.labels is not None:
                    extra = f" Allowed values: {', '.join(map(str, col.labels))}."
                if col.match_geometry and col.kind.is_image:
                    extra += " Same size (and, for 3-D, spacing, origin and direction) as the test image."
                cell = (f"relative path of a {col.kind.value.replace('_', ' ')} file ({accepted}), "
                        f"e.g. `{col.path_template}`. {col.description}{extra}")
            else:
                choices = f" One of: {', '.join(f'`{c}`' for c in col.choices)}." if col.choices else ""
                cell = f"{col.dtype.__name__} value. {col.description}{choices}"
            escaped = cell.replace("|", "\\|")  # a literal | would end the table cell
            lines.append(f"| `{col.name}` | {escaped} |")
        if example_ids:
            lines += ["", "Example (first rows):", "", "```csv", ",".join(self.column_names)]
            for case_id in example_ids[:3]:
                row = self.example_row(case_id)
                lines.append(",".join(row[n] for n in self.column_names))
            lines.append("```")
        for note in self.notes:
            lines += ["", note]
        return "\n".join(lines)
