"""Headers that name a separate voxel file (MetaImage ``ElementDataFile``, NRRD ``data file``) must not make the grader
read outside the submission folder (``rexmle_grade.io.check_data_file_reference``, called by every volume read)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from rexmle_grade.errors import InvalidSubmissionError
from rexmle_grade.io import read_volume

VOXELS = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)


def write_plain(path: Path) -> None:
    sitk.WriteImage(sitk.GetImageFromArray(VOXELS), str(path), useCompression=False)


@pytest.mark.parametrize("suffix", [".mha", ".nrrd", ".nii.gz"])
def test_single_file_volumes_are_read(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"mask{suffix}"
    write_plain(path)
    assert np.array_equal(read_volume(path).array, VOXELS)


def test_detached_metaimage_beside_the_header_is_read(tmp_path: Path) -> None:
    header = tmp_path / "mask.mhd"
    write_plain(header)  # SimpleITK writes mask.mhd + mask.raw
    assert "ElementDataFile = mask.raw" in header.read_text()
    assert np.array_equal(read_volume(header).array, VOXELS)


@pytest.mark.parametrize("reference", ["{outside}", "../outside/mask.raw", "LIST"])
def test_metaimage_reading_elsewhere_is_rejected(tmp_path: Path, reference: str) -> None:
    (tmp_path / "outside").mkdir()
    outside = tmp_path / "outside" / "plain.mhd"
    write_plain(outside)
    folder = tmp_path / "submission"
    folder.mkdir()
    text = outside.read_text().replace("ElementDataFile = plain.raw",
                                       f"ElementDataFile = {reference.format(outside=outside.with_suffix('.raw'))}")
    (folder / "evil.mha").write_text(text)
    with pytest.raises(InvalidSubmissionError, match="reads its voxels from"):
        read_volume(folder / "evil.mha")


def test_metaimage_symlinked_data_file_is_rejected(tmp_path: Path) -> None:
    outside = tmp_path / "plain.mhd"
    write_plain(outside)
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "plain.raw").symlink_to(tmp_path / "plain.raw")
    (folder / "evil.mhd").write_text(outside.read_text())
    with pytest.raises(InvalidSubmissionError, match="reads its voxels from"):
        read_volume(folder / "evil.mhd")


def test_nrrd_data_file_outside_is_rejected(tmp_path: Path) -> None:
    raw = tmp_path / "voxels.raw"
    raw.write_bytes(VOXELS.tobytes())
    folder = tmp_path / "submission"
    folder.mkdir()
    header = ("NRRD0004\ntype: uint8\ndimension: 3\nsizes: 4 3 2\nencoding: raw\n"
              f"data file: {raw}\n\n")
    (folder / "evil.nrrd").write_text(header)
    with pytest.raises(InvalidSubmissionError, match="reads its voxels from"):
        read_volume(folder / "evil.nrrd")
    (folder / "voxels.raw").write_bytes(VOXELS.tobytes())
    (folder / "beside.nrrd").write_text(header.replace(str(raw), "voxels.raw"))
    assert np.array_equal(read_volume(folder / "beside.nrrd").array, VOXELS)


def test_metaimage_without_data_line_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "broken.mha"
    path.write_text("ObjectType = Image\nNDims = 3\n")
    with pytest.raises(InvalidSubmissionError, match="no ElementDataFile"):
        read_volume(path)
