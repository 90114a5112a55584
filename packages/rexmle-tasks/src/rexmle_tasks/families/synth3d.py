"""Helpers shared by the 3-D volume families (PANTHER, ISLES'22, SEG.A.): synthetic anatomy and volume files.

Synthetic scenes are drawn in physical millimetres (ellipsoids, lumpy blobs, tapered tubes) and sampled at the
voxel centres of an image grid, so two images of one scene on different grids (ISLES' FLAIR beside its DWI, with
the head moved in between) show the same anatomy. Intensities come from a per-tissue lookup table with texture,
a smooth bias field and noise, so that the labels stay predictable from the image.

Prepare helpers copy volumes byte for byte and make sure every label map lies on its image's voxel grid.
"""

from __future__ import annotations

import csv
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rexmle_grade.errors import InvalidSubmissionError, TaskDataMissingError
from rexmle_grade.grader import ANSWERS_CSV
from rexmle_grade.io import Geometry, read_volume_geometry
from rexmle_tasks.families.synth2d import copy_file, smooth_noise, write_zip

Coords = tuple[np.ndarray, np.ndarray, np.ndarray]  # physical x, y, z (mm), broadcastable to the (z, y, x) shape
IDENTITY_DIRECTION = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)


@dataclass(frozen=True)
class Grid:
    """An axis-aligned voxel grid (identity direction), SimpleITK order (x, y, z)."""

    size: tuple[int, int, int]
    spacing: tuple[float, float, float]
    origin: tuple[float, float, float]

    @classmethod
    def covering(cls, extent_mm: Sequence[float], spacing: Sequence[float],
                 centre: Sequence[float] = (0.0, 0.0, 0.0)) -> Grid:
        """The grid with this spacing whose field of view (at least ``extent_mm``) is centred on ``centre``."""
        size = tuple(max(2, math.ceil(e / s)) for e, s in zip(extent_mm, spacing, strict=True))
        origin = tuple(c - (n - 1) * s / 2 for c, n, s in zip(centre, size, spacing, strict=True))
        return cls(size=size, spacing=tuple(float(s) for s in spacing), origin=origin)  # type: ignore[arg-type]

    @property
    def shape(self) -> tuple[int, int, int]:
        """numpy (z, y, x) shape."""
        return self.size[2], self.size[1], self.size[0]

    @property
    def geometry(self) -> Geometry:
        return Geometry(size=self.size, spacing=self.spacing, origin=self.origin, direction=IDENTITY_DIRECTION)

    def index_box(self, low_mm: Sequence[float], high_mm: Sequence[float]) -> tuple[slice, slice, slice] | None:
        """(z, y, x) slices of the voxels whose centres lie in the physical box, or None if there are none."""
        slices = []
        for lo, hi, o, s, n in zip(low_mm, high_mm, self.origin, self.spacing, self.size, strict=True):
            first, last = max(0, math.ceil((lo - o) / s)), min(n - 1, math.floor((hi - o) / s))
            if first > last:
                return None
            slices.append(slice(first, last + 1))
        return slices[2], slices[1], slices[0]

    def coords(self) -> Coords:
        """Physical coordinates of the voxel centres, as open (broadcastable) arrays."""
        x, y, z = (o + s * np.arange(n) for o, s, n in zip(self.origin, self.spacing, self.size, strict=True))
        return x[None, None, :], y[None, :, None], z[:, None, None]


@dataclass(frozen=True)
class Pose:
    """A rigid movement of the subject between two scans: a turn of ``angle_deg`` about the z axis, then a shift.
    A voxel at physical position p of the second scan sees the scene point R(angle) p + shift."""

    angle_deg: float
    shift_mm: tuple[float, float, float]


@dataclass(frozen=True)
class Ellipsoid:
    """A filled ellipsoid (mm), turned by ``angle_deg`` about the z axis."""

    centre: tuple[float, float, float]
    radii: tuple[float, float, float]
    angle_deg: float = 0.0

    @classmethod
    def of(cls, centre: Sequence[float], radii: Sequence[float], angle_deg: float = 0.0) -> Ellipsoid:
        return cls(tuple(float(c) for c in centre), tuple(float(r) for r in radii),  # type: ignore[arg-type]
                   float(angle_deg))

    def seen_by(self, pose: Pose) -> Ellipsoid:
        """The same ellipsoid in the coordinates of a scan taken after the subject moved by ``pose``."""
        theta = math.radians(pose.angle_deg)
        dx, dy, dz = (c - t for c, t in zip(self.centre, pose.shift_mm, strict=True))
        centre = (math.cos(theta) * dx + math.sin(theta) * dy, -math.sin(theta) * dx + math.cos(theta) * dy, dz)
        return Ellipsoid(centre, self.radii, self.angle_deg - pose.angle_deg)

    def mask(self, grid: Grid) -> np.ndarray:
        """The ellipsoid sampled at the voxel centres of ``grid`` (computed inside its bounding box only)."""
        out = np.zeros(grid.shape, dtype=bool)
        reach = (max(self.radii[:2]), max(self.radii[:2]), self.radii[2])
        box = grid.index_box([c - r for c, r in zip(self.centre, reach, strict=True)],
                             [c + r for c, r in zip(self.centre, reach, strict=True)])
        if box is None:
            return out
        x, y, z = grid.coords()
        dx, dy, dz = x[:, :, box[2]] - self.centre[0], y[:, box[1], :] - self.centre[1], z[box[0]] - self.centre[2]
        if self.angle_deg:
            cos, sin = math.cos(math.radians(self.angle_deg)), math.sin(math.radians(self.angle_deg))
            dx, dy = cos * dx + sin * dy, -sin * dx + cos * dy
        out[box] = (dx / self.radii[0]) ** 2 + (dy / self.radii[1]) ** 2 + (dz / self.radii[2]) ** 2 <= 1.0
        return out


def union(grid: Grid, shapes: Sequence[Ellipsoid]) -> np.ndarray:
    mask = np.zeros(grid.shape, dtype=bool)
    for shape in shapes:
        mask |= shape.mask(grid)
    return mask


def lumpy_blob(rng: np.random.Generator, centre: Sequence[float], radius: float) -> list[Ellipsoid]:
    """An irregular lesion: a few overlapping ellipsoids around ``centre`` (about ``radius`` mm); see :func:`union`."""
    parts = []
    for k in range(int(rng.integers(2, 5))):
        offset = np.zeros(3) if k == 0 else rng.uniform(-0.45, 0.45, 3) * radius
        parts.append(Ellipsoid.of(np.asarray(centre) + offset, radius * rng.uniform(0.55, 1.0, 3),
                                  float(rng.uniform(0, 180))))
    return parts


def tube(grid: Grid, path: np.ndarray, radii: Sequence[float] | np.ndarray) -> np.ndarray:
    """A tube (mm) on ``grid`` along the polyline ``path`` (n, 3) whose radius varies linearly between the n
    ``radii``; each segment is drawn only inside its bounding box, which keeps long vessel trees cheap."""
    radii = np.asarray(radii, dtype=float)
    x, y, z = grid.coords()
    mask = np.zeros(grid.shape, dtype=bool)
    for i in range(len(path) - 1):
        a, b = path[i], path[i + 1]
        seg, ra, rb = b - a, radii[i], radii[i + 1]
        box = grid.index_box(np.minimum(a, b) - max(ra, rb), np.maximum(a, b) + max(ra, rb))
        if box is None:
            continue
        rel = (x[:, :, box[2]] - a[0], y[:, box[1], :] - a[1], z[box[0], :, :] - a[2])
        t = np.clip((rel[0] * seg[0] + rel[1] * seg[1] + rel[2] * seg[2]) / max(float(seg @ seg), 1e-12), 0.0, 1.0)
        dist2 = (rel[0] - t * seg[0]) ** 2 + (rel[1] - t * seg[1]) ** 2 + (rel[2] - t * seg[2]) ** 2
        mask[box] |= dist2 <= (ra + t * (rb - ra)) ** 2
    return mask


def polyline(points: Sequence[Sequence[float]], per_segment: int = 6) -> np.ndarray:
    """A smooth-looking path through ``points``: a quadratic B-spline with ``per_segment`` samples per span."""
    ctrl = np.asarray(points, dtype=float)
    if len(ctrl) < 3:
        return ctrl
    out = [ctrl[0]]
    for i in range(len(ctrl) - 2):
        p0 = ctrl[i] if i == 0 else (ctrl[i] + ctrl[i + 1]) / 2
        p2 = ctrl[i + 2] if i == len(ctrl) - 3 else (ctrl[i + 1] + ctrl[i + 2]) / 2
        for t in np.linspace(0, 1, per_segment + 1)[1:]:
            out.append((1 - t) ** 2 * p0 + 2 * (1 - t) * t * ctrl[i + 1] + t**2 * p2)
    return np.asarray(out)


def render(tissue: np.ndarray, lut: Mapping[int, float], rng: np.random.Generator, *, noise_sd: float,
           texture: float = 0.05, bias: float = 0.1, background: int | None = 0) -> np.ndarray:
    """Intensities of a tissue map: per-tissue mean x (1 + texture) x a smooth bias field + Gaussian noise.

    Voxels of tissue ``background`` (air outside the body, or outside a skull-stripped brain) stay exactly at
    their lookup value, as they do in masked or air-filled regions of real scans; ``None`` adds noise everywhere.
    """
    values = np.zeros(tissue.shape, dtype=np.float64)
    for label, mean in lut.items():
        values[tissue == label] = mean
    bias_field = 1.0 + bias * _smooth_polynomial(rng, tissue.shape)
    out = values * (1.0 + texture * smooth_noise(rng, tissue.shape, 1.0)) * bias_field
    out += noise_sd * rng.standard_normal(tissue.shape)
    if background is not None:
        out[tissue == background] = lut.get(background, 0.0)
    return out


def _smooth_polynomial(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """A slowly varying field within [-1, 1]: a random quadratic polynomial of the normalised voxel position."""
    w, v, u = (np.linspace(-1.0, 1.0, n).reshape([-1 if a == i else 1 for a in range(3)])
               for i, n in enumerate(shape))
    terms = (u, v, w, u * v, v * w, u * w, u * u - 0.5, v * v - 0.5, w * w - 0.5)
    coefficients = rng.uniform(-1.0, 1.0, len(terms))
    field = sum(c * t for c, t in zip(coefficients, terms, strict=True))
    return field / max(float(np.abs(field).max()), 1e-12)


def to_int16(values: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(values), -32768, 32767).astype(np.int16)


def zip_folder(folder: Path, archive: Path) -> Path:
    """Zip every file under ``folder`` (paths relative to it, sorted) into a byte-stable archive."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return write_zip(archive, ((p.relative_to(folder).as_posix(), p.read_bytes()) for p in files))


def write_archive(archive: Path, fill: Callable[[Path], None]) -> Path:
    """Let ``fill`` write a folder tree into a scratch folder, then zip that tree as ``archive``."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".staging-", dir=archive.parent) as scratch:
        fill(Path(scratch))
        return zip_folder(Path(scratch), archive)


# ---- prepare helpers ---------------------------------------------------------------------------------------
def copy_label_on_image_grid(label: Path, image: Path, dest: Path) -> Path:
    """Copy a label map unchanged when its header has exactly ``image``'s voxel grid; otherwise resample it onto
    that grid (nearest neighbour, zero outside): a segmentation saved cropped to its own extent, or a header
    that differs in the last digits, ends up with the image's exact geometry, which graders compare against."""
    if image_geometry(label) == image_geometry(image):
        return copy_file(label, dest)
    import SimpleITK as sitk

    reference = sitk.ReadImage(str(image))
    moving = sitk.ReadImage(str(label))
    resampled = sitk.Resample(moving, reference, sitk.Transform(), sitk.sitkNearestNeighbor, 0.0,
                              moving.GetPixelID())
    for key in moving.GetMetaDataKeys():
        if not key.startswith(("ITK_", "NRRD_")):
            resampled.SetMetaData(key, moving.GetMetaData(key))
    dest.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(resampled, str(dest), useCompression=True)
    return dest


def image_geometry(path: Path) -> Geometry:
    """The voxel grid of a 3-D image or label map of the task data (header only). An unreadable file is a data
    problem, reported as such rather than as an invalid submission."""
    try:
        return read_volume_geometry(path, what="image")[0]
    except InvalidSubmissionError as exc:
        raise TaskDataMissingError(
            f"cannot read the header of {path}: {exc.problems[0]}",
            hint="the file looks truncated or corrupt; re-run the preparation with --force",
        ) from None


def write_answers(private: Path, id_column: str, rows: Sequence[tuple[str, str]]) -> Path:
    """``private/answers.csv``: one (case id, ``label_path`` relative to private/) row per test case."""
    path = private / ANSWERS_CSV
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([id_column, "label_path"])
        writer.writerows(rows)
    return path


def require_folder(candidates: Sequence[Path], what: str) -> Path:
    """The first existing folder of ``candidates``; a clear error naming all of them otherwise."""
    for folder in candidates:
        if folder.is_dir():
            return folder
    tried = ", ".join(str(c) for c in candidates)
    raise TaskDataMissingError(f"cannot find {what} (looked for {tried})",
                               hint="the download looks incomplete or unpacked elsewhere; re-run with --force")
