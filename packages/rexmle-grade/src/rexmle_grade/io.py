"""Safe reading of submission and answer files.

Everything a grader reads from a submission goes through here, so that:

* a path in a submission CSV can never point outside the submission folder (absolute paths, ``..`` parts and
  symlinks that resolve elsewhere are rejected);
* oversized, truncated or malformed files, decompression bombs and NaN/inf values become an
  :class:`InvalidSubmissionError` with a message, never a crash or a huge allocation;
* a MetaImage or NRRD header cannot make SimpleITK read voxels from another file outside the submission (headers
  are parsed as MetaIO and teem parse them), and a 2-D image is decoded by the decoder its suffix names;
* geometry (size, spacing, origin, direction) is read from the header before any voxel is decoded.

Conventions: 3-D images are read with SimpleITK. :attr:`Volume.array` is SimpleITK's numpy view, axes ``(z, y, x)``;
:attr:`Geometry.size` and :attr:`Geometry.spacing` are in SimpleITK order ``(x, y, z)``. 2-D images have
``Geometry.size == (width, height)`` and arrays of shape ``(height, width)``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import struct
import zlib
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from rexmle_grade.errors import InvalidSubmissionError

MiB = 1024 * 1024
MAX_CSV_BYTES = 64 * MiB
MAX_JSON_BYTES = 64 * MiB
MAX_JSON_VALUES = 5_000_000  # a dense PUMA nuclei file holds about a million
MAX_FILE_BYTES = 2048 * MiB
MAX_DECODED_BYTES = 4096 * MiB
MAX_IMAGE_PIXELS_2D = 400_000_000

#: the header fields of a 3-D image beyond its size, and how far a prediction's may differ from the test image's
HEADER_FIELDS = ("spacing", "origin", "direction")
HEADER_TOLERANCES = {"spacing": 1e-4, "origin": 1e-3, "direction": 1e-4}

VOLUME_SUFFIXES = (".nii.gz", ".nii", ".mha", ".mhd", ".nrrd", ".seg.nrrd")
IMAGE_2D_SUFFIXES = (".png", ".tif", ".tiff", ".bmp", ".jpg", ".jpeg")


def full_suffix(path: str | os.PathLike[str]) -> str:
    """The suffix including double extensions rexmle cares about (``.nii.gz``, ``.seg.nrrd``), lower-case."""
    name = Path(path).name.lower()
    for double in (".nii.gz", ".seg.nrrd"):
        if name.endswith(double):
            return double
    return Path(name).suffix


def resolve_inside(base_dir: Path, relative: str, *, what: str = "path") -> Path:
    """Resolve ``relative`` against ``base_dir`` and prove the result stays inside it (symlinks followed).

    Raises :class:`InvalidSubmissionError` for empty, absolute, drive-letter or ``..`` paths, for paths that do not
    exist, and for anything that resolves (through symlinks) outside ``base_dir``.
    """
    text = str(relative).strip()
    if not text:
        raise InvalidSubmissionError(f"{what} is empty")
    if "\x00" in text:
        raise InvalidSubmissionError(f"{what} {text!r} contains a NUL byte")
    posix = PurePosixPath(text.replace("\\", "/"))
    if posix.is_absolute() or (len(text) > 1 and text[1] == ":"):
        raise InvalidSubmissionError(
            f"{what} {text!r} is absolute; paths must be relative to the submission folder"
        )
    if ".." in posix.parts:
        raise InvalidSubmissionError(f"{what} {text!r} contains '..'; paths must stay inside the submission folder")
    base = base_dir.resolve()
    candidate = base.joinpath(*posix.parts)
    try:
        resolved = candidate.resolve(strict=True)
    except FileNotFoundError:
        raise InvalidSubmissionError(f"{what} {text!r} does not exist in the submission folder") from None
    except (OSError, RuntimeError) as exc:  # symlink loops and the like
        raise InvalidSubmissionError(f"{what} {text!r} cannot be resolved: {exc}") from None
    if not resolved.is_relative_to(base):
        raise InvalidSubmissionError(f"{what} {text!r} resolves outside the submission folder (via a symlink)")
    if not resolved.is_file():
        raise InvalidSubmissionError(f"{what} {text!r} is not a regular file")
    return resolved


def check_file_size(path: Path, limit: int, *, what: str) -> int:
    size = path.stat().st_size
    if size > limit:
        raise InvalidSubmissionError(
            f"{what} {path.name!r} is {size / MiB:.1f} MiB; the limit is {limit / MiB:.0f} MiB"
        )
    if size == 0:
        raise InvalidSubmissionError(f"{what} {path.name!r} is empty (0 bytes)")
    return size


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def read_json(path: Path, *, what: str = "JSON file", limit: int = MAX_JSON_BYTES) -> Any:
    """Parse a JSON file; NaN/Infinity literals, bad encodings, oversize files and documents of more than
    :data:`MAX_JSON_VALUES` values are invalid."""
    check_file_size(path, limit, what=what)
    with path.open("rb") as fh:
        data = fh.read()
    # every value but the first follows a ',' or opens a container: counting them bounds the parsed objects, which
    # cost up to 20 times their text ('[],' is 3 bytes, a Python list 56)
    values = data.count(b",") + data.count(b"[") + data.count(b"{")
    if values > MAX_JSON_VALUES:
        raise InvalidSubmissionError(f"{what} {path.name!r} holds about {values} values; the limit is "
                                     f"{MAX_JSON_VALUES}")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidSubmissionError(f"{what} {path.name!r} is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidSubmissionError(f"{what} {path.name!r} is nested too deeply to be a valid document") from None


@dataclass(frozen=True)
class Geometry:
    """Voxel grid of an image. 3-D: SimpleITK order (x, y, z). 2-D: size = (width, height), no spacing."""

    size: tuple[int, ...]
    spacing: tuple[float, ...] | None = None
    origin: tuple[float, ...] | None = None
    direction: tuple[float, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if v is not None else None) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Geometry:
        def tup(key: str, cast: type) -> tuple | None:
            value = data.get(key)
            return None if value is None else tuple(cast(v) for v in value)

        size = tup("size", int)
        if size is None:
            raise ValueError("geometry needs a 'size'")
        return cls(size=size, spacing=tup("spacing", float), origin=tup("origin", float),
                   direction=tup("direction", float))

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        """Shape of the numpy array SimpleITK/PIL produce for this grid (axes reversed)."""
        return tuple(reversed(self.size))

    def mismatches(self, other: Geometry, *, fields: Collection[str] = HEADER_FIELDS,
                   reference: str = "the test image") -> list[str]:
        """Human-readable differences of ``other`` (what arrived) from ``self`` (what is expected): the size, then
        the header ``fields`` among :data:`HEADER_FIELDS` (each within its :data:`HEADER_TOLERANCES`)."""
        problems: list[str] = []
        if tuple(other.size) != tuple(self.size):
            problems.append(f"size {list(other.size)} but {reference} has size {list(self.size)}")
            return problems
        for name in HEADER_FIELDS:
            if name not in fields:
                continue
            tol = HEADER_TOLERANCES[name]
            want, got = getattr(self, name), getattr(other, name)
            if want is None or got is None:
                continue
            if len(want) != len(got) or any(abs(a - b) > tol for a, b in zip(want, got, strict=True)):
                shown = [round(v, 6) for v in got]
                expected = [round(v, 6) for v in want]
                problems.append(f"{name} {shown} but {reference} has {name} {expected} (tolerance {tol})")
        return problems

    def with_header_of(self, other: Geometry, fields: Collection[str]) -> Geometry:
        """This grid with the header ``fields`` copied from ``other`` (as ITK's ``CopyInformation`` does)."""
        return replace(self, **{name: getattr(other, name) for name in fields})


@dataclass
class Volume:
    """A 3-D image: ``array`` axes (z, y, x); geometry in SimpleITK order."""

    array: np.ndarray
    geometry: Geometry
    #: header fields of the file that differed from the expected grid and were replaced by it (see read_volume)
    header_differences: tuple[str, ...] = ()

    @property
    def spacing_zyx(self) -> tuple[float, float, float]:
        sx, sy, sz = self.geometry.spacing or (1.0, 1.0, 1.0)
        return (sz, sy, sx)


def _sitk():
    import SimpleITK as sitk  # imported lazily: only 3-D graders need it

    return sitk


MAX_HEADER_BYTES = 1 * MiB
# every ASCII control character but TAB: C readers and Python disagree on where lines containing them end
_CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_METAIMAGE_FIELD = re.compile(r"([^=:]*)[=:](.*)")  # MetaIO ends a key at the first '=' or ':'
_PLAIN_DATA_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_NRRD_DATA_FILE_FIELDS = frozenset({"datafile"})  # teem accepts "data file" and "datafile", in any case


def _header_lines(path: Path) -> list[bytes]:
    """The first :data:`MAX_HEADER_BYTES` of a text header split as MetaIO and teem split them: at LF, with a CR
    before it dropped. Python's ``splitlines`` also breaks at form feeds, NEL and others, which the C readers do
    not: a field hidden behind such a byte would escape the checks below, so those lines are refused instead."""
    with path.open("rb") as fh:
        return [line.removesuffix(b"\r") for line in fh.read(MAX_HEADER_BYTES).split(b"\n")]


def check_data_file_reference(path: Path, *, what: str = "image") -> None:
    """MetaImage (``ElementDataFile``) and NRRD (``data file``) headers may name other files to read voxels from,
    anywhere on the machine; allow only the header's own data or a plain file name that resolves (symlinks
    followed) beside the header.

    The header is parsed strictly, as the C readers would see it: every line before the voxel data must be a
    well-formed field without control characters (MetaImage ``Key = value`` with a value on the same line; NRRD
    ``field: value``, ``key:=value``, ``#`` comments, ending at an empty line). Anything else is refused, because
    MetaIO and teem read such lines differently from any simple check (a value may continue on the next line,
    ``:`` also separates MetaImage keys, ``LIST`` makes the following lines file names...).
    """
    suffix = full_suffix(path)
    if suffix in (".mha", ".mhd"):
        _check_metaimage_header(path, what)
    elif suffix in (".nrrd", ".seg.nrrd", ".nhdr"):
        _check_nrrd_header(path, what)


def _header_problem(path: Path, what: str, number: int, message: str) -> InvalidSubmissionError:
    return InvalidSubmissionError(f"{what} {path.name!r}: header line {number} {message}; write the file with "
                                  "SimpleITK (or another standard writer) and keep its voxels inside it")


def _check_metaimage_header(path: Path, what: str) -> None:
    for number, line in enumerate(_header_lines(path), start=1):
        if not line.strip(b" \t"):
            continue  # MetaIO skips blank lines
        if _CONTROL_BYTES.search(line):
            raise _header_problem(path, what, number, "contains control characters")
        field = _METAIMAGE_FIELD.fullmatch(line.decode("latin-1"))
        key, value = (field[1].strip(" \t"), field[2].strip(" \t")) if field else ("", "")
        if not key or not value:
            # MetaIO would take the next line as this field's value (or skip it): the two readings differ
            raise _header_problem(path, what, number, "is not a 'Key = value' field")
        if key.lower() == "elementdatafile":
            if value.upper() != "LOCAL":
                _check_data_file_name(path, what, value)
            return  # the voxels follow
    raise InvalidSubmissionError(f"{what} {path.name!r} has no ElementDataFile line in its first "
                                 f"{MAX_HEADER_BYTES // MiB} MiB: not a MetaImage file")


def _check_nrrd_header(path: Path, what: str) -> None:
    lines = _header_lines(path)
    if not lines[0].startswith(b"NRRD"):
        raise InvalidSubmissionError(f"{what} {path.name!r} does not start with a NRRD magic line: not a NRRD file")
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            return  # end of the header
        if _CONTROL_BYTES.search(line):
            raise _header_problem(path, what, number, "contains control characters")
        text = line.decode("latin-1")
        if text.startswith("#") or ":=" in text:
            continue  # comment, or key/value pair (teem tests for ':=' first)
        name, separator, value = text.partition(": ")
        if not separator:
            raise _header_problem(path, what, number, "is neither a 'field: value' line nor a comment")
        if "".join(name.split()).lower() in _NRRD_DATA_FILE_FIELDS:
            _check_data_file_name(path, what, value.strip(" \t"))
    raise InvalidSubmissionError(f"{what} {path.name!r} has no end of header in its first "
                                 f"{MAX_HEADER_BYTES // MiB} MiB: not a NRRD file")


def _check_data_file_name(path: Path, what: str, value: str) -> None:
    """A data file named in a header: a plain existing file name beside the header, never ``LIST`` (whose following
    lines name further files) nor a pattern."""
    target = path.parent / value
    if (_PLAIN_DATA_FILE.fullmatch(value) and value.upper() != "LIST" and target.is_file()
            and target.resolve().is_relative_to(path.parent.resolve())):
        return
    raise InvalidSubmissionError(
        f"{what} {path.name!r} reads its voxels from {value!r}; store the voxels in the file itself "
        "(e.g. a single-file .mha or .nii.gz)"
    )


def read_volume_geometry(path: Path, *, what: str = "image") -> tuple[Geometry, str, int]:
    """Header-only read: (geometry, pixel type name, components per pixel)."""
    check_data_file_reference(path, what=what)
    sitk = _sitk()
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        reader.ReadImageInformation()
    except RuntimeError as exc:
        raise InvalidSubmissionError(f"{what} {path.name!r} is not a readable 3-D image: {_first_line(exc)}") from None
    dim = reader.GetDimension()
    if dim != 3:
        raise InvalidSubmissionError(f"{what} {path.name!r} has {dim} dimensions; a 3-D image is expected")
    geometry = Geometry(
        size=tuple(int(v) for v in reader.GetSize()),
        spacing=tuple(float(v) for v in reader.GetSpacing()),
        origin=tuple(float(v) for v in reader.GetOrigin()),
        direction=tuple(float(v) for v in reader.GetDirection()),
    )
    pixel = sitk.GetPixelIDValueAsString(reader.GetPixelID())
    return geometry, pixel, int(reader.GetNumberOfComponents())


def read_volume(path: Path, *, what: str = "image", expected: Geometry | None = None,
                integer: bool = False, checked: Collection[str] = HEADER_FIELDS) -> Volume:
    """Read a 3-D image safely.

    The header is checked first (3-D, one component, decoded size under the limit, size and the ``checked`` header
    fields equal to ``expected``), then the voxels are decoded. Header fields that are not ``checked`` and differ
    from ``expected`` are replaced by the expected ones (the volume is placed on the expected grid) and listed in
    :attr:`Volume.header_differences`. ``integer=True`` requires an integer pixel type (label maps). Non-finite
    voxels are rejected.
    """
    sitk = _sitk()
    geometry, pixel, components = read_volume_geometry(path, what=what)
    if components != 1:
        raise InvalidSubmissionError(f"{what} {path.name!r} has {components} components per voxel; expected 1")
    problems = expected.mismatches(geometry, fields=checked) if expected is not None else []
    if problems:
        raise InvalidSubmissionError([f"{what} {path.name!r}: {p}" for p in problems])
    ignored = [name for name in HEADER_FIELDS if name not in checked]
    differences = tuple(expected.mismatches(geometry, fields=ignored)) if expected is not None else ()
    if differences:
        geometry = geometry.with_header_of(expected, ignored)
    n_voxels = math.prod(geometry.size)
    if n_voxels * 8 > MAX_DECODED_BYTES:
        raise InvalidSubmissionError(f"{what} {path.name!r} declares {n_voxels} voxels, beyond the size limit")
    if integer and "float" in pixel.lower():
        raise InvalidSubmissionError(
            f"{what} {path.name!r} stores {pixel} voxels; label maps must use an integer type (e.g. uint8)"
        )
    if full_suffix(path) in (".nii", ".nii.gz"):
        check_nifti_complete(path, what=what)
    try:
        image = sitk.ReadImage(str(path))
    except RuntimeError as exc:
        raise InvalidSubmissionError(f"{what} {path.name!r} cannot be decoded (truncated or corrupt?): "
                                     f"{_first_line(exc)}") from None
    array = sitk.GetArrayFromImage(image)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise InvalidSubmissionError(f"{what} {path.name!r} contains NaN or infinite values")
    return Volume(array=array, geometry=geometry, header_differences=differences)


NIFTI_READ_CHUNK = 4 * MiB


def _nifti_data_end(header: bytes) -> int | None:
    """Where the voxels of a single-file NIfTI-1 image end according to its header (None: no NIfTI-1 header, left
    to the reader to refuse; SimpleITK reads no NIfTI-2)."""
    for order in "<>":
        if len(header) < 348 or struct.unpack_from(order + "i", header)[0] != 348:
            continue
        dims = struct.unpack_from(order + "8h", header, 40)
        bitpix = struct.unpack_from(order + "h", header, 72)[0]
        offset = struct.unpack_from(order + "f", header, 108)[0]
        n_dims = dims[0]
        if not 1 <= n_dims <= 7 or min(dims[1:n_dims + 1]) < 1 or bitpix < 1 or not math.isfinite(offset):
            return None
        # niftilib starts the voxels of a single file at byte 352 at the earliest, whatever the header says
        return max(int(offset), 352) + math.prod(dims[1:n_dims + 1]) * bitpix // 8
    return None


def check_nifti_complete(path: Path, *, what: str = "image") -> None:
    """Refuse a NIfTI file holding fewer voxel bytes than its header announces: ITK's reader silently returns a
    partly filled image for a truncated ``.nii`` or ``.nii.gz``. A ``.nii.gz`` is inflated in chunks (never whole)
    up to the announced end."""
    with path.open("rb") as fh:
        compressed = fh.read(2) == b"\x1f\x8b"  # ITK also reads an uncompressed file named .nii.gz
    try:
        with gzip.open(path, "rb") if compressed else path.open("rb") as fh:
            header = fh.read(352)
            end = _nifti_data_end(header)
            if end is None:
                return
            available = len(header) if compressed else path.stat().st_size
            while compressed and available < end:
                chunk = fh.read(min(NIFTI_READ_CHUNK, end - available))
                if not chunk:
                    break
                available += len(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise InvalidSubmissionError(f"{what} {path.name!r} is truncated or corrupt: {exc}") from None
    if available < end:
        raise InvalidSubmissionError(f"{what} {path.name!r} is truncated: its header announces {end} bytes of header "
                                     f"and voxels, the file holds {available}")


# the one Pillow decoder each suffix may use: Pillow otherwise picks a decoder from the content
PIL_FORMATS = {".png": ("PNG",), ".bmp": ("BMP",), ".jpg": ("JPEG",), ".jpeg": ("JPEG",)}


def read_image_2d(path: Path, *, what: str = "image", expected_size: Sequence[int] | None = None,
                  integer: bool = False, allow_channels: bool = False) -> np.ndarray:
    """Read a 2-D image (TIFF via tifffile, others via Pillow) safely; returns (height, width[, channels])."""
    suffix = full_suffix(path)
    check_file_size(path, MAX_FILE_BYTES, what=what)
    try:
        if suffix in (".tif", ".tiff"):
            import tifffile

            with tifffile.TiffFile(path) as tif:
                page = tif.pages.first
                if tif.pages.is_multipage:  # checked without walking the whole page chain
                    raise InvalidSubmissionError(f"{what} {path.name!r} holds several images (pages); a single "
                                                 "2-D image is expected")
                shape = tuple(int(v) for v in page.shape)
                _check_2d_shape(path, shape, what, allow_channels, expected_size)
                array = page.asarray()
        else:
            from PIL import Image

            with Image.open(path, formats=PIL_FORMATS.get(suffix)) as img:
                if getattr(img, "n_frames", 1) != 1:
                    raise InvalidSubmissionError(f"{what} {path.name!r} holds {img.n_frames} frames; a single 2-D "
                                                 "image is expected")
                width, height = img.size
                _check_2d_shape(path, (height, width), what, allow_channels, expected_size)
                img.load()
                array = np.asarray(img)
    except InvalidSubmissionError:
        raise
    except Exception as exc:  # decoder errors of any kind mean an unreadable file, never a grader bug
        raise InvalidSubmissionError(f"{what} {path.name!r} cannot be read as an image: {_first_line(exc)}") from None
    if array.ndim == 3 and not allow_channels:
        raise InvalidSubmissionError(
            f"{what} {path.name!r} has shape {list(array.shape)}; a single-channel 2-D image is expected"
        )
    if array.ndim not in (2, 3):
        raise InvalidSubmissionError(f"{what} {path.name!r} has shape {list(array.shape)}; a 2-D image is expected")
    if expected_size is not None:
        width, height = expected_size
        if array.shape[:2] != (height, width):
            raise InvalidSubmissionError(
                f"{what} {path.name!r} is {array.shape[1]}x{array.shape[0]} (width x height); "
                f"the test image is {width}x{height}"
            )
    if integer and array.dtype.kind not in "iub":
        raise InvalidSubmissionError(f"{what} {path.name!r} has {array.dtype} pixels; an integer type is expected")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise InvalidSubmissionError(f"{what} {path.name!r} contains NaN or infinite values")
    return array


def _check_2d_shape(path: Path, shape: tuple[int, ...], what: str, allow_channels: bool,
                    expected_size: Sequence[int] | None) -> None:
    """Header checks before any pixel is decoded (so a decompression bomb is refused unread)."""
    if len(shape) < 2:
        raise InvalidSubmissionError(f"{what} {path.name!r} has shape {list(shape)}; a 2-D image is expected")
    if expected_size is not None and (shape[1], shape[0]) != tuple(expected_size):
        raise InvalidSubmissionError(
            f"{what} {path.name!r} is {shape[1]}x{shape[0]} (width x height); "
            f"the test image is {expected_size[0]}x{expected_size[1]}"
        )
    pixels = shape[0] * shape[1]
    if pixels > MAX_IMAGE_PIXELS_2D:
        raise InvalidSubmissionError(f"{what} {path.name!r} declares {pixels} pixels, beyond the size limit")
    if len(shape) > 2 and not allow_channels and shape[-1] > 1:
        raise InvalidSubmissionError(
            f"{what} {path.name!r} has shape {list(shape)}; a single-channel 2-D image is expected"
        )


def check_labels(array: np.ndarray, allowed: Sequence[int] | frozenset[int], *, what: str, name: str) -> None:
    """Reject label values outside ``allowed`` (listing the offending values)."""
    present = np.unique(array)
    bad = sorted(int(v) for v in present if int(v) not in allowed or v != int(v))
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        raise InvalidSubmissionError(
            f"{what} {name!r} contains label values {shown}; allowed values are {sorted(allowed)}"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # ITK messages carry the useful sentence last
    return (lines[-1] if lines else type(exc).__name__)[:300]


def write_volume(path: Path, array: np.ndarray, geometry: Geometry) -> None:
    """Write a (z, y, x) array with the given geometry (format from the suffix); used by tasks and tests."""
    sitk = _sitk()
    image = sitk.GetImageFromArray(array)
    if geometry.spacing is not None:
        image.SetSpacing(geometry.spacing)
    if geometry.origin is not None:
        image.SetOrigin(geometry.origin)
    if geometry.direction is not None:
        image.SetDirection(geometry.direction)
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(image, str(path), useCompression=True)
