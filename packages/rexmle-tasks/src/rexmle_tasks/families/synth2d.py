"""Helpers shared by the 2-D families: byte-stable archives, image encoding, header reads, drawing primitives.

The synthetic mirrors must be byte-identical for a given seed, so archives are written with a fixed member
timestamp and permissions, and images are encoded without metadata that varies between runs.
"""

from __future__ import annotations

import csv
import io
import shutil
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image
from scipy import ndimage

from rexmle_grade.errors import TaskDataMissingError
from rexmle_tasks.base import DOWNLOADS

MAC_RESOURCE_FOLDER = "__MACOSX"
# the earliest timestamp a zip member can carry; any fixed value keeps archives byte-stable
ZIP_TIMESTAMP = (1980, 1, 1, 0, 0, 0)
TIFF_SUFFIXES = (".tif", ".tiff")


def find_in_raw(root: Path, pattern: str) -> list[Path]:
    """Paths below ``root`` whose name matches ``pattern`` (any depth), sorted; the archives in ``downloads/`` and
    the macOS resource forks that zips made on a Mac carry (``__MACOSX/``, ``._*``) are left out."""
    found = []
    for path in sorted(root.rglob(pattern)):
        parts = path.relative_to(root).parts
        if parts[0] != DOWNLOADS and MAC_RESOURCE_FOLDER not in parts and not path.name.startswith("._"):
            found.append(path)
    return found


def files_with_suffix(folder: Path, suffixes: Sequence[str]) -> list[Path]:
    """The regular files of ``folder`` (not below it) with one of ``suffixes`` (any case), sorted."""
    return sorted(p for p in folder.iterdir()
                  if p.suffix.lower() in suffixes and not p.name.startswith("._") and p.is_file())


def write_zip(path: Path, members: Iterable[tuple[str, bytes]]) -> Path:
    """Write a deflated zip with an entry for every parent folder, fixed timestamps and permissions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    seen_dirs: set[str] = set()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            parts = name.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                folder = "/".join(parts[:depth]) + "/"
                if folder not in seen_dirs:
                    seen_dirs.add(folder)
                    info = zipfile.ZipInfo(folder, date_time=ZIP_TIMESTAMP)
                    info.external_attr = (0o40755 << 16) | 0x10
                    zf.writestr(info, b"")
            info = zipfile.ZipInfo(name, date_time=ZIP_TIMESTAMP)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return path


def encode_image(array: np.ndarray, suffix: str) -> bytes:
    """Encode a (H, W) or (H, W, C) array as PNG, BMP, TIFF or JPEG bytes (format from ``suffix``)."""
    suffix = suffix.lower()
    buffer = io.BytesIO()
    if suffix in TIFF_SUFFIXES:
        photometric = "rgb" if array.ndim == 3 else "minisblack"
        extra = {"extrasamples": ["unassalpha"]} if array.ndim == 3 and array.shape[2] == 4 else {}
        tifffile.imwrite(buffer, array, photometric=photometric, metadata=None, **extra)
        return buffer.getvalue()
    formats = {".png": "PNG", ".bmp": "BMP", ".jpg": "JPEG", ".jpeg": "JPEG"}
    if suffix not in formats:
        raise ValueError(f"cannot encode images as {suffix!r}; known: {sorted(formats) + list(TIFF_SUFFIXES)}")
    Image.fromarray(array).save(buffer, format=formats[suffix])
    return buffer.getvalue()


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) of a 2-D image file, from its header (TIFF via tifffile, others via Pillow)."""
    try:
        if path.suffix.lower() in TIFF_SUFFIXES:
            with tifffile.TiffFile(path) as tif:
                shape = tif.pages[0].shape
            return int(shape[1]), int(shape[0])
        with Image.open(path) as img:
            width, height = img.size
        return int(width), int(height)
    except (OSError, ValueError, IndexError) as exc:
        raise TaskDataMissingError(f"cannot read the image header of {path}: {exc}",
                                   hint="the file looks truncated; re-run the preparation with --force") from None


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> Path:
    """A CSV table (e.g. ``private/answers.csv``: the grader's id column and answer columns, one row per case)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def copy_file(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest


def to_uint8(values: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def smooth_noise(rng: np.random.Generator, shape: tuple[int, ...], sigma: float) -> np.ndarray:
    """Gaussian-filtered white noise rescaled to zero mean and unit standard deviation."""
    field = ndimage.gaussian_filter(rng.standard_normal(shape), sigma)
    return (field - field.mean()) / (field.std() + 1e-12)


def ellipse_mask(shape: tuple[int, int], centre: tuple[float, float], radii: tuple[float, float],
                 angle: float = 0.0) -> np.ndarray:
    """Boolean mask of a filled ellipse; ``centre`` and ``radii`` are (row, col), ``angle`` in radians."""
    rows, cols = np.ogrid[: shape[0], : shape[1]]
    dr, dc = rows - centre[0], cols - centre[1]
    cos, sin = np.cos(angle), np.sin(angle)
    u = dr * cos + dc * sin
    v = -dr * sin + dc * cos
    return (u / radii[0]) ** 2 + (v / radii[1]) ** 2 <= 1.0


def blob_outline(rng: np.random.Generator, centre: tuple[float, float], radius: float, *, vertices: int = 12,
                 wobble: float = 0.2) -> list[tuple[float, float]]:
    """A closed, smooth random polygon around ``centre`` (x, y) as a list of (x, y) vertices, rounded to 0.1 px;
    the first vertex is repeated at the end, as GeoJSON rings are. The radius varies with a few low harmonics, so
    ``wobble`` is the relative size of the bumps."""
    angles = np.linspace(0, 2 * np.pi, vertices, endpoint=False) + rng.uniform(0, 2 * np.pi)
    radii = np.full(vertices, float(radius))
    for harmonic in (2, 3, 4):
        radii += radius * wobble / harmonic * rng.uniform(-1, 1) * np.cos(harmonic * angles + rng.uniform(0, 6.3))
    ring = [(round(float(centre[0] + r * np.cos(a)), 1), round(float(centre[1] + r * np.sin(a)), 1))
            for a, r in zip(angles, radii, strict=True)]
    return [*ring, ring[0]]
