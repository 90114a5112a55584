"""Focused tests of the submission-reading fixes found by the cross-grader security suite
(``test_security_submissions.py``): one test (or parametrised family) per fix, on tiny files written here.

* MetaImage / NRRD headers are parsed as MetaIO and teem parse them, so no header can make SimpleITK read voxels
  from a file outside the submission (separator ':', TAB, form feeds, NEL, ``LIST``...);
* truncated NIfTI files are refused (SimpleITK returns a partly filled image for them);
* a 2-D prediction is one image: multi-page TIFFs and animated PNGs are refused, and the decoder follows the suffix;
* JSON documents with millions of values are refused before parsing, and a document full of wrong entries yields a
  short problem list with short messages;
* TopCoW box coordinates are bounded, YAML documents are small and may not nest deeply;
* value problems of 3-D masks name the case.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

import rexmle_grade.io as rio
from rexmle_grade.errors import InvalidSubmissionError
from rexmle_grade.grader import CaseInput
from rexmle_grade.io import Geometry, check_data_file_reference, read_image_2d, read_json, read_volume, write_volume

GRID = Geometry(size=(4, 3, 2), spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0),
                direction=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0))
N_VOXELS = 4 * 3 * 2


@pytest.fixture
def decoy(tmp_path: Path) -> Path:
    """Voxels in a folder outside the 'submission': reading them would be the leak."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "secret.raw"
    path.write_bytes(bytes([1]) * N_VOXELS)
    return path


@pytest.fixture
def submission(tmp_path: Path) -> Path:
    folder = tmp_path / "submission"
    folder.mkdir()
    return folder


MHA_FIELDS = ("ObjectType = Image\nNDims = 3\nDimSize = 4 3 2\nElementType = MET_UCHAR\nElementSpacing = 1 1 1\n"
              "Offset = 0 0 0\nTransformMatrix = 1 0 0 0 1 0 0 0 1\n")
NRRD_FIELDS = ("NRRD0004\ntype: uint8\ndimension: 3\nspace: left-posterior-superior\nsizes: 4 3 2\n"
               "space directions: (1,0,0) (0,1,0) (0,0,1)\nspace origin: (0,0,0)\nendian: little\nencoding: raw\n")

# headers that make MetaIO / teem read the decoy; "{decoy}" is replaced by its absolute path
LEAKING_HEADERS = {
    "mha_absolute": ("x.mha", MHA_FIELDS + "ElementDataFile = {decoy}\n"),
    "mha_colon_separator": ("x.mha", MHA_FIELDS + "ElementDataFile: {decoy}\nElementDataFile = LOCAL\n"),
    "mha_tab_before_separator": ("x.mha", MHA_FIELDS + "ElementDataFile\t= {decoy}\nElementDataFile = LOCAL\n"),
    "mha_nel_hides_the_real_field": ("x.mha", MHA_FIELDS + "Comment = x\x85ElementDataFile = LOCAL\n"
                                              "ElementDataFile = {decoy}\n"),
    "mha_value_on_the_next_line": ("x.mha", MHA_FIELDS + "AnatomicalOrientation =\nElementDataFile = LOCAL\n"
                                            "ElementDataFile = {decoy}\n"),
    "mha_key_without_separator": ("x.mha", MHA_FIELDS + "ObjectType\nElementDataFile = LOCAL\n"
                                           "ElementDataFile = {decoy}\n"),
    "mha_cr_inside_a_line": ("x.mha", MHA_FIELDS + "Comment = x\rElementDataFile = LOCAL\n"
                                      "ElementDataFile = {decoy}\n"),
    "mha_list": ("x.mha", MHA_FIELDS.replace("Offset", "ElementNumberOfChannels = 1\nOffset")
                 + "ElementDataFile = LIST\n{decoy}\n{decoy}\n"),
    "nrrd_absolute": ("x.nrrd", NRRD_FIELDS + "data file: {decoy}\n\n"),
    "nrrd_form_feeds_look_like_the_end": ("x.nrrd", NRRD_FIELDS + "content: x\x0c\x0c\ndata file: {decoy}\n\n"),
    "nrrd_nel_looks_like_the_end": ("x.nrrd", NRRD_FIELDS + "content: x\x85\x85\ndata file: {decoy}\n\n"),
    "nrrd_vertical_tab_in_a_comment": ("x.nrrd", NRRD_FIELDS + "#\x0b\ndata file: {decoy}\n\n"),
    "nrrd_datafile_spelling": ("x.nrrd", NRRD_FIELDS + "DataFile: {decoy}\n\n"),
    "nrrd_list": ("x.nrrd", NRRD_FIELDS + "data file: LIST\n{decoy}\n{decoy}\n"),
    "seg_nrrd_absolute": ("x.seg.nrrd", NRRD_FIELDS + "data file: {decoy}\n\n"),
}


@pytest.mark.parametrize("name", list(LEAKING_HEADERS))
def test_headers_naming_outside_voxels_are_refused_before_any_decoding(name: str, submission: Path,
                                                                       decoy: Path) -> None:
    file_name, text = LEAKING_HEADERS[name]
    path = submission / file_name
    path.write_bytes(text.format(decoy=decoy).encode("latin-1") + bytes(N_VOXELS))
    (submission / "LIST").write_bytes(b"x")  # a file of that name beside the header must not make LIST pass
    with pytest.raises(InvalidSubmissionError):
        check_data_file_reference(path, what="mask")
    with pytest.raises(InvalidSubmissionError):
        read_volume(path, what="mask", expected=GRID, integer=True)


def test_the_header_check_stops_what_simpleitk_would_do(submission: Path, decoy: Path) -> None:
    """Why the check matters: handed to SimpleITK directly, the ':' header reads the decoy's voxels."""
    path = submission / "x.mha"
    path.write_bytes(LEAKING_HEADERS["mha_colon_separator"][1].format(decoy=decoy).encode() + bytes(N_VOXELS))
    assert (sitk.GetArrayFromImage(sitk.ReadImage(str(path))) == 1).all()


def test_a_data_file_beside_the_header_is_still_accepted(submission: Path) -> None:
    voxels = np.arange(N_VOXELS, dtype=np.uint8)
    (submission / "x.raw").write_bytes(voxels.tobytes())
    for name, text in (("x.mha", MHA_FIELDS + "ElementDataFile = x.raw\n"),
                       ("x.nrrd", NRRD_FIELDS + "data file: x.raw\n\n")):
        (submission / name).write_text(text)
        volume = read_volume(submission / name, what="mask", expected=GRID, integer=True)
        assert volume.array.ravel().tolist() == voxels.tolist()


def test_a_data_file_beside_the_header_that_links_outside_is_refused(submission: Path, decoy: Path) -> None:
    (submission / "x.raw").symlink_to(decoy)
    (submission / "x.mha").write_text(MHA_FIELDS + "ElementDataFile = x.raw\n")
    with pytest.raises(InvalidSubmissionError, match=r"reads its voxels from 'x\.raw'"):
        check_data_file_reference(submission / "x.mha")


@pytest.mark.parametrize("suffix", [".mha", ".nrrd", ".seg.nrrd"])
@pytest.mark.parametrize("compress", [False, True])
def test_files_written_by_simpleitk_with_odd_metadata_pass(tmp_path: Path, suffix: str, compress: bool) -> None:
    array = np.arange(N_VOXELS, dtype=np.uint8).reshape(2, 3, 4)
    image = sitk.GetImageFromArray(array)
    for key, value in (("0008|0060", "CT"), ("my key", "a: b = c"), ("ITK:thing", "x:=y")):
        image.SetMetaData(key, value)
    path = tmp_path / f"x{suffix}"
    sitk.WriteImage(image, str(path), useCompression=compress)
    assert (read_volume(path, expected=GRID, integer=True).array == array).all()


def test_crlf_and_comment_lines_in_hand_written_headers_pass(tmp_path: Path) -> None:
    voxels = bytes(range(N_VOXELS))
    (tmp_path / "x.mha").write_bytes((MHA_FIELDS + "ElementDataFile = LOCAL\n").replace("\n", "\r\n").encode()
                                     + voxels)
    (tmp_path / "x.nrrd").write_bytes(NRRD_FIELDS.replace("type:", "# written by hand\nkey:=value\ntype:").encode()
                                      + b"\n" + voxels)
    for name in ("x.mha", "x.nrrd"):
        assert read_volume(tmp_path / name, expected=GRID, integer=True).array.ravel().tolist() == list(voxels)


# ---- truncated NIfTI --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
@pytest.mark.parametrize("keep", [0.5, 0.95])
def test_truncated_nifti_is_refused(tmp_path: Path, suffix: str, keep: float) -> None:
    rng = np.random.default_rng(1)
    array = rng.integers(0, 2, size=(20, 30, 40), dtype=np.uint8)  # random: gzip cannot shrink it to nothing
    grid = Geometry(size=(40, 30, 20), spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0), direction=GRID.direction)
    whole = tmp_path / f"whole{suffix}"
    write_volume(whole, array, grid)
    data = whole.read_bytes()
    cut = tmp_path / f"cut{suffix}"
    cut.write_bytes(data[: int(len(data) * keep)])
    assert (read_volume(whole, expected=grid, integer=True).array == array).all()
    with pytest.raises(InvalidSubmissionError, match="truncated"):
        read_volume(cut, what="mask", expected=grid, integer=True)


def test_uncompressed_and_big_endian_nifti_pass(tmp_path: Path) -> None:
    import nibabel as nib

    array = np.arange(N_VOXELS, dtype=np.int16).reshape(4, 3, 2)  # nibabel order (x, y, z)
    header = nib.Nifti1Header(endianness=">")
    header.set_data_dtype(">i2")
    image = nib.Nifti1Image(array, np.diag([-1.0, -1.0, 1.0, 1.0]), header=header)
    nib.save(image, tmp_path / "big.nii")
    assert (tmp_path / "big.nii").read_bytes()[:4] == (348).to_bytes(4, "big")
    (tmp_path / "plain.nii.gz").write_bytes((tmp_path / "big.nii").read_bytes())  # not gzipped despite the name
    for name in ("big.nii", "plain.nii.gz"):
        assert read_volume(tmp_path / name, expected=GRID, integer=True).array.transpose(2, 1, 0).tolist() == \
            array.tolist()
    truncated = tmp_path / "short.nii"
    truncated.write_bytes((tmp_path / "big.nii").read_bytes()[:-1])
    with pytest.raises(InvalidSubmissionError, match="truncated"):
        read_volume(truncated, expected=GRID, integer=True)


def test_a_gzip_stream_cut_in_the_middle_is_refused_without_inflating_it_whole(tmp_path: Path) -> None:
    header = bytearray(352)
    header[0:4] = (348).to_bytes(4, "little")
    header[40:56] = np.array([3, 4, 3, 2, 1, 1, 1, 1], "<i2").tobytes()
    header[70:74] = np.array([2, 8], "<i2").tobytes()
    header[76:108] = np.array([1] * 4 + [0] * 4, "<f4").tobytes()
    header[108:112] = np.array([352], "<f4").tobytes()
    header[344:348] = b"n+1\0"
    path = tmp_path / "x.nii.gz"
    path.write_bytes(gzip.compress(bytes(header) + bytes(N_VOXELS - 1)))  # one voxel short
    with pytest.raises(InvalidSubmissionError, match="truncated"):
        rio.check_nifti_complete(path)


# ---- 2-D images ---------------------------------------------------------------------------------------------------
def _png_bytes(array: np.ndarray, **save: object) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", **save)
    return buffer.getvalue()


def test_multi_page_tiff_and_animated_png_are_refused(tmp_path: Path) -> None:
    import tifffile
    from PIL import Image

    frame = np.zeros((6, 5), np.uint8)
    tifffile.imwrite(tmp_path / "pages.tif", np.stack([frame] * 3), photometric="minisblack")
    frames = [Image.fromarray(frame + k) for k in range(3)]
    frames[0].save(tmp_path / "anim.png", save_all=True, append_images=frames[1:])
    for name, pattern in (("pages.tif", "several images"), ("anim.png", "3 frames")):
        with pytest.raises(InvalidSubmissionError, match=pattern):
            read_image_2d(tmp_path / name, expected_size=(5, 6), integer=True)
    tifffile.imwrite(tmp_path / "one.tif", frame)
    (tmp_path / "one.png").write_bytes(_png_bytes(frame))
    for name in ("one.tif", "one.png"):
        assert read_image_2d(tmp_path / name, expected_size=(5, 6), integer=True).shape == (6, 5)


def test_the_suffix_decides_the_decoder(tmp_path: Path) -> None:
    import tifffile
    from PIL import Image

    frame = np.full((6, 5), 7, np.uint8)
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, frame)
    (tmp_path / "tiff_inside.png").write_bytes(buffer.getvalue())
    (tmp_path / "png_inside.tif").write_bytes(_png_bytes(frame))
    Image.fromarray(frame).save(tmp_path / "gif_inside.png", format="GIF")
    for name in ("tiff_inside.png", "png_inside.tif", "gif_inside.png"):
        with pytest.raises(InvalidSubmissionError, match="cannot be read as an image"):
            read_image_2d(tmp_path / name, expected_size=(5, 6), integer=True)


def test_gray_prediction_reader_also_follows_the_suffix(tmp_path: Path) -> None:
    import tifffile

    from rexmle_grade.graders._images2d import read_gray8_prediction
    from rexmle_grade.schema import FileColumn, FileKind

    column = FileColumn("enhanced_image_path", FileKind.GRAY_IMAGE, "{id}.png", (".png",), "gray")
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, np.full((6, 5), 7, np.uint8))  # mode L once decoded: only the format is wrong
    (tmp_path / "a.png").write_bytes(buffer.getvalue())
    case = CaseInput(case_id="a", row={"enhanced_image_path": "a.png"}, submission_dir=tmp_path, answer={},
                     private_dir=tmp_path, geometry=Geometry(size=(5, 6)))
    with pytest.raises(InvalidSubmissionError, match="enhanced_image_path of 'a'"):
        read_gray8_prediction(case, column)


# ---- JSON ------------------------------------------------------------------------------------------------------
def test_json_with_too_many_values_is_refused_before_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rio, "MAX_JSON_VALUES", 1000)
    path = tmp_path / "x.json"
    path.write_text(json.dumps([0] * 1000))  # 999 commas and one bracket: 1000 values, at the limit
    assert len(read_json(path)) == 1000
    path.write_text(json.dumps([[]] * 500))  # 499 commas and 501 brackets: counted as 1000 too
    assert len(read_json(path)) == 500
    path.write_text(json.dumps([0] * 1001))
    parsed: list[str] = []
    monkeypatch.setattr(rio.json, "loads", lambda *a, **k: parsed.append("parsed"))
    with pytest.raises(InvalidSubmissionError, match="about 1001 values; the limit is 1000"):
        read_json(path, what="predictions")
    assert not parsed


def test_a_document_of_wrong_entries_gives_a_short_problem_list() -> None:
    from rexmle_grade.graders._images2d import MAX_LISTED_PER_FILE
    from rexmle_grade.graders.dentex import parse_boxes
    from rexmle_grade.graders.puma import parse_multiple_polygons

    for parse, document in ((parse_boxes, [0] * 100_000),
                            (parse_multiple_polygons, {"polygons": [0] * 100_000})):
        with pytest.raises(InvalidSubmissionError) as caught:
            parse(document, "predictions of 'a'")
        problems = caught.value.problems
        assert len(problems) == MAX_LISTED_PER_FILE + 1
        assert problems[0] == "predictions of 'a' [0] is a int; expected an object" or "polygons[0]" in problems[0]
        assert problems[-1] == f"... and more problems in predictions of 'a' (checking stopped after " \
                               f"{MAX_LISTED_PER_FILE})"


def test_huge_values_are_abbreviated_in_problem_messages() -> None:
    from rexmle_grade.graders.dentex import parse_boxes
    from rexmle_grade.graders.puma import parse_multiple_polygons
    from rexmle_grade.graders.topcow import parse_box_json

    giant = list(range(100_000))
    box = {"bbox": giant, "category_id_1": giant, "category_id_2": 0, "category_id_3": 0, "score": giant}
    attempts = [lambda: parse_boxes([box], "p"),
                lambda: parse_multiple_polygons({"polygons": [{"name": giant, "path_points": [], "score": giant}]},
                                                "p"),
                lambda: parse_box_json({"size": giant, "location": [0, 0, 0]}, "p")]
    for attempt in attempts:
        with pytest.raises(InvalidSubmissionError) as caught:
            attempt()
        assert all(len(p) < 300 for p in caught.value.problems), caught.value.problems


# ---- TopCoW documents ---------------------------------------------------------------------------------------------
def test_topcow_box_coordinates_are_bounded() -> None:
    from rexmle_grade.graders.topcow import MAX_VOXEL_INDEX, parse_box_json

    assert parse_box_json({"size": [MAX_VOXEL_INDEX] * 3, "location": [-MAX_VOXEL_INDEX] * 3}, "p").size[0] == \
        MAX_VOXEL_INDEX
    for bad in (MAX_VOXEL_INDEX + 1, 10**400):
        with pytest.raises(InvalidSubmissionError, match="magnitude at most"):
            parse_box_json({"size": [bad, 1, 1], "location": [0, 0, 0]}, "p")
        with pytest.raises(InvalidSubmissionError, match="magnitude at most"):
            parse_box_json({"size": [1, 1, 1], "location": [0, -bad, 0]}, "p")


def test_topcow_yaml_documents_are_small_and_shallow(tmp_path: Path) -> None:
    from rexmle_grade.graders.topcow import MAX_YAML_BYTES, read_edge_document

    deep = tmp_path / "deep.yml"
    deep.write_text("[" * 3000 + "]" * 3000)
    with pytest.raises(InvalidSubmissionError, match="nested too deeply"):
        read_edge_document(deep, "edges of 'a'")
    big = tmp_path / "big.yml"
    big.write_text("anterior: " + "x" * MAX_YAML_BYTES)
    with pytest.raises(InvalidSubmissionError, match="limit"):
        read_edge_document(big, "edges of 'a'")
    fine = tmp_path / "fine.yml"
    fine.write_text("anterior: {L-A1: 1}\n")
    assert read_edge_document(fine, "edges of 'a'") == {"anterior": {"L-A1": 1}}


# ---- 3-D masks: value problems name the case ---------------------------------------------------------------------
def test_value_problems_of_3d_masks_name_the_case(tmp_path: Path) -> None:
    from rexmle_grade.grader import get_grader

    grader = get_grader("isles22")
    column = grader.schema.file_columns[0]
    array = np.zeros((2, 3, 4), np.int16)
    array[0, 0, 0] = -1
    write_volume(tmp_path / "mask.nii.gz", array, GRID)
    case = CaseInput(case_id="sub-1", row={column.name: "mask.nii.gz"}, submission_dir=tmp_path, answer={},
                     private_dir=tmp_path, geometry=GRID)
    with pytest.raises(InvalidSubmissionError) as caught:
        grader.load_prediction(case, column)
    assert caught.value.problems[0].startswith("case 'sub-1': predicted_mask_path 'mask.nii.gz' contains negative")


MALFORMED_PREPARED = {
    "not_json": "{task_id: isles22",
    "not_an_object": "[1, 2]",
    "missing_keys": json.dumps({"task_id": "isles22"}),
    "wrong_type": json.dumps({"task_id": "isles22", "task_version": "1", "synthetic": True, "n_train": "many",
                              "n_test": 2, "split_digest": "x", "prepared_at": "now"}),
}


def _rexmle(*args: str, data_env: Path | None = None) -> tuple[int, str, str]:
    """The real `rexmle` command in a child process (wide console, so that one line stays one line)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "REXMLE_DATA_DIR"}
    env["COLUMNS"] = "500"
    if data_env is not None:
        env["REXMLE_DATA_DIR"] = str(data_env)
    done = subprocess.run([sys.executable, "-m", "rexmle_grade.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("kind", list(MALFORMED_PREPARED))
def test_malformed_prepared_json_is_a_one_line_error(kind: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "isles22").mkdir(parents=True)
    (data / "isles22" / "prepared.json").write_text(MALFORMED_PREPARED[kind])
    submission = tmp_path / "submission"
    submission.mkdir()
    code, _, err = _rexmle("grade", "run", "isles22", str(submission), "--data-dir", str(data))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "prepared.json is malformed" in lines[0] and "--force" in lines[0], err


def test_data_dir_after_the_sub_command_is_used(tmp_path: Path) -> None:
    code, out, err = _rexmle("tasks", "info", "isles22", "--data-dir", str(tmp_path / "after"),
                             data_env=tmp_path / "env")
    assert code == 0, err
    assert str(tmp_path / "after" / "isles22") in out and str(tmp_path / "env") not in out
