"""AIDE's data preview, for medical images: the file tree of the task's public folder with sizes, and for one
file of each kind per folder what it holds (CSV: columns, types, row count and a few rows; JSON: its structure;
NIfTI/MetaImage/NRRD: shape, spacing, dtype and value range; PNG/TIFF/JPEG: shape, dtype and value range).

Images are read with rexmle-grade's own readers (the ones graders use), from the harness's copy of the public
folder, never through the agent's workspace. The text is bounded (``max_chars``) so that a large task cannot
crowd out the rest of a prompt.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rexmle_grade.errors import RexmleError
from rexmle_grade.io import VOLUME_SUFFIXES, full_suffix

IMAGE_2D_SUFFIXES = (".png", ".tif", ".tiff", ".jpg", ".jpeg", ".bmp")
FILES_LISTED = 4  # per folder: the first few names; the rest are counted
PREVIEWED_PER_FOLDER = 1  # files of one kind previewed in one folder
MAX_PREVIEWS = 12
CSV_ROWS = 3
CSV_TYPE_ROWS = 200  # rows read to guess each column's type


@dataclass(frozen=True)
class _Folder:
    path: Path
    files: list[Path]
    bytes: int


def data_preview(root: Path, *, max_chars: int = 6000) -> str:
    """The preview of the folder ``root`` (see the module docstring); '' when it does not exist."""
    root = Path(root)
    if not root.is_dir():
        return ""
    folders = list(_walk(root))
    lines = ["Files (sizes on disk):"]
    for folder in folders:
        rel = folder.path.relative_to(root).as_posix()
        name = "./" if rel == "." else f"{rel}/"
        lines.append(f"- {name} {len(folder.files)} file(s), {_size(folder.bytes)}")
        for path in folder.files[:FILES_LISTED]:
            lines.append(f"    {path.name} ({_size(path.stat().st_size)})")
        if len(folder.files) > FILES_LISTED:
            lines.append(f"    ... and {len(folder.files) - FILES_LISTED} more")
    previews = []
    for folder in folders:
        seen: dict[str, int] = {}
        for path in folder.files:
            kind = full_suffix(path)
            if seen.get(kind, 0) >= PREVIEWED_PER_FOLDER or len(previews) >= MAX_PREVIEWS:
                continue
            text = preview_file(path)
            if text:
                seen[kind] = seen.get(kind, 0) + 1
                previews.append(f"{path.relative_to(root).as_posix()}: {text}")
    if previews:
        lines += ["", "A look inside (one file of each kind per folder):", *(f"- {p}" for p in previews)]
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 40].rstrip() + "\n[... preview cut to its limit]"


def preview_file(path: Path) -> str:
    """One line (or a few) on what ``path`` holds; '' for kinds the preview does not open."""
    suffix = full_suffix(path)
    try:
        if suffix == ".csv":
            return _csv(path)
        if suffix == ".json":
            return _json(path)
        if suffix in VOLUME_SUFFIXES:
            return _volume(path)
        if suffix in IMAGE_2D_SUFFIXES:
            return _image_2d(path)
    except (RexmleError, OSError, ValueError, UnicodeDecodeError, csv.Error) as exc:
        return f"could not be read ({exc})"
    return ""


def _walk(root: Path) -> Iterator[_Folder]:
    for here, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        paths = (Path(here) / name for name in names)
        files = sorted(p for p in paths if p.is_file() and not p.is_symlink())
        yield _Folder(Path(here), files, sum(p.stat().st_size for p in files))


def _csv(path: Path) -> str:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            return "an empty CSV file"
        rows = []
        count = 0
        for row in reader:
            count += 1
            if len(rows) < CSV_TYPE_ROWS:
                rows.append(row)
    columns = []
    for i, name in enumerate(header):
        values = [r[i] for r in rows if i < len(r) and r[i] != ""]
        columns.append(f"{name} ({_column_type(values)})")
    shown = "; ".join(", ".join(r) for r in rows[:CSV_ROWS])
    return f"CSV, {count} row(s), columns: {', '.join(columns)}. First rows: {shown or 'none'}"


def _column_type(values: list[str]) -> str:
    if not values:
        return "empty"
    if any(len(v) > 1 and v.startswith("0") and v.isdigit() for v in values):
        return f"identifier text like {values[0]!r}"  # zero-padded ids are names, not numbers
    for kind, cast in (("int", int), ("float", float)):
        try:
            numbers = [cast(v) for v in values]
        except ValueError:
            continue
        return f"{kind} {min(numbers):g}..{max(numbers):g}"
    distinct = sorted(set(values))
    return f"text, {len(distinct)} distinct" + (f": {', '.join(distinct[:5])}" if len(distinct) <= 5 else "")


def _json(path: Path) -> str:
    from rexmle_grade.io import read_json

    doc = read_json(path, what="JSON file")
    return "JSON " + _structure(doc, depth=0)


def _structure(value: object, depth: int) -> str:
    if isinstance(value, dict):
        if depth >= 3 or not value:
            return f"object with {len(value)} key(s)"
        keys = list(value)[:6]
        inner = ", ".join(f"{k!s}: {_structure(value[k], depth + 1)}" for k in keys)
        return "{" + inner + (", ..." if len(value) > 6 else "") + f"}} ({len(value)} keys)"
    if isinstance(value, list):
        return f"list of {len(value)}" + (f" x {_structure(value[0], depth + 1)}" if value and depth < 2 else "")
    return type(value).__name__ if not isinstance(value, str) else "string"


def _volume(path: Path) -> str:
    from rexmle_grade.io import read_volume

    volume = read_volume(path, what="image")
    geometry = volume.geometry
    spacing = "x".join(f"{v:g}" for v in geometry.spacing or ())
    return (f"3-D image, array shape (z, y, x) {list(volume.array.shape)}, spacing (x, y, z) {spacing} mm, "
            f"{_values(volume.array)}")


def _image_2d(path: Path) -> str:
    from rexmle_grade.io import read_image_2d

    array = read_image_2d(path, what="image", allow_channels=True)
    return f"2-D image, array shape {list(array.shape)}, {_values(array)}"


def _values(array: np.ndarray) -> str:
    low, high, mean = float(array.min()), float(array.max()), float(array.mean())
    text = f"dtype {array.dtype}, values {low:.4g}..{high:.4g}, mean {mean:.4g}"
    if array.dtype.kind in "iub":
        distinct = np.unique(array)
        if len(distinct) <= 8:
            text += f", distinct values {[int(v) for v in distinct]}"
    return text


def _size(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    units = ("KB", "MB", "GB")
    power = 1
    while n >= 1024**(power + 1) and power < len(units):
        power += 1
    return f"{n / 1024**power:.1f} {units[power - 1]}"
