"""The synthetic vessel tree: anatomy that the official checks accept, variants, ROI boxes, file formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from rexmle_grade.errors import TaskDataMissingError
from rexmle_grade.graders.topbrain import valid_neighbours
from rexmle_grade.graders.topcow import edge_lists, parse_edges
from rexmle_grade.metrics.boxes import VoxelBox, crop_slices_zyx, parse_roi_txt
from rexmle_grade.metrics.topology import betti0, label_adjacency, skeleton
from rexmle_tasks.families import topbrain, topcow
from rexmle_tasks.families.vessels import (
    CT_ANGIOGRAPHY,
    TOF_MR_ANGIOGRAPHY,
    TOPBRAIN_LABEL_NAMES,
    TOPCOW_LABEL_MAP,
    CowVariant,
    edges_yaml,
    find_release_root,
    head_tissues,
    make_patient,
    render_vessels,
    roi_box,
    roi_text,
    synthesize_image,
    thicken_vanishing_labels,
    topbrain_label_map,
)

# (left, right) label pairs of TopCoW
COW_TWINS = ((3, 2), (6, 4), (7, 5), (9, 8), (12, 11))


def patients(n: int, seed: int = 101):
    return [(k, make_patient(np.random.default_rng([seed, k]))) for k in range(n)]


def test_left_vessels_lie_at_larger_x_than_their_right_twins() -> None:
    """LPS+: the official left-right flip check compares median x of L- and R- labels."""
    for k, patient in patients(6):
        frame = topcow.FRAMES["ct"].sample(np.random.default_rng(k))
        labels = render_vessels(patient, frame, TOPCOW_LABEL_MAP).labels
        for left, right in COW_TWINS:
            if (labels == left).any() and (labels == right).any():
                assert np.median(np.nonzero(labels == left)[2]) > np.median(np.nonzero(labels == right)[2])
        # the x axis spans right (0) to left (1) of the head: the right ICA is in the left half of the array
        assert np.median(np.nonzero(labels == 4)[2]) < labels.shape[2] / 2 < np.median(np.nonzero(labels == 6)[2])


def test_topbrain_labels_touch_only_valid_neighbours_and_stay_in_one_piece() -> None:
    """A perfect prediction must score neighbor_error 0, B0 error 0 and clDice 1 on the synthetic ground truth."""
    for k, patient in patients(8):
        for modality in ("ct", "mr"):
            frame = topbrain.FRAMES[modality].sample(np.random.default_rng([k, 7]))
            labels = render_vessels(patient, frame, topbrain_label_map(modality)).labels
            thicken_vanishing_labels(labels)
            valid = valid_neighbours(modality)
            names = TOPBRAIN_LABEL_NAMES[modality]
            for label, touching in label_adjacency(labels).items():
                assert touching <= valid[label], (k, modality, names[label], [names[t] for t in touching])
                mask = labels == label
                assert betti0(mask) == 1, (k, modality, names[label])
                assert skeleton(mask).any(), (k, modality, names[label])


def test_the_edge_lists_derived_from_each_rendered_mask_match_the_patient_variant() -> None:
    """The task-3 YAML and the task-1 masks (inside the ROI) agree, for the CTA and the MRA grid of a patient."""
    for k, patient in patients(10):
        expected = {region: tuple(flags.values()) for region, flags in patient.variant.edge_lists().items()}
        for modality in ("ct", "mr"):
            rng = np.random.default_rng([k, 3])
            frame = topcow.FRAMES[modality].sample(rng)
            labels = render_vessels(patient, frame, TOPCOW_LABEL_MAP).labels
            crop = labels[crop_slices_zyx(roi_box(patient, frame, rng), frame.grid.size)]
            present = {int(v) for v in np.unique(crop) if v}
            assert edge_lists(present, label_adjacency(crop)) == expected, (k, modality)


def test_variants_follow_anatomy_and_all_occur() -> None:
    variants = [CowVariant.sample(np.random.default_rng(k)) for k in range(400)]
    assert not all(v.acom for v in variants)
    assert any(v.third_a2 for v in variants)
    assert sum(v.third_a2 for v in variants) < 0.15 * len(variants)  # rare
    for side in (0, 1):
        assert not all(v.pcom[side] for v in variants)
        assert not all(v.a1[side] for v in variants)
        assert not all(v.p1[side] for v in variants)
    for v in variants:
        assert v.acom or not v.third_a2
        assert any(v.a1), "an ACA needs at least one A1"
        assert all(v.acom for side in (0, 1) if not v.a1[side]), "an ACA without A1 is fed through the Acom"
        assert all(v.pcom[side] for side in (0, 1) if not v.p1[side]), "a PCA without P1 is fed through its Pcom"


def test_edge_lists_name_the_segments_per_side() -> None:
    variant = CowVariant(acom=True, third_a2=False, a1=(False, True), p1=(True, False), pcom=(False, True))
    assert variant.edge_lists() == {
        "anterior": {"L-A1": 1, "Acom": 1, "3rd-A2": 0, "R-A1": 0},
        "posterior": {"L-Pcom": 1, "L-P1": 0, "R-P1": 1, "R-Pcom": 0},
    }


def test_roi_box_encloses_the_cow_core_inside_the_image() -> None:
    for k, patient in patients(6):
        rng = np.random.default_rng(k)
        frame = topcow.FRAMES["mr"].sample(rng)
        labels = render_vessels(patient, frame, TOPCOW_LABEL_MAP).labels
        box = roi_box(patient, frame, rng)
        assert all(lo >= 0 for lo in box.location)
        assert all(end < n for end, n in zip(box.end, frame.grid.size, strict=True))
        inside = np.zeros(labels.shape, dtype=bool)
        inside[crop_slices_zyx(box, frame.grid.size)] = True
        for label in (8, 9, 10):  # the communicating arteries lie wholly inside the CoW box
            assert not (labels == label)[~inside].any()
        for label in (4, 6, 5, 7):  # ICAs and MCAs leave it
            assert (labels == label)[~inside].any()


def test_roi_text_is_the_release_format_and_parses_with_the_official_rule() -> None:
    box = VoxelBox(location=(201, 233, 57), size=(96, 84, 40))
    text = roi_text(box, final_newline=True)
    assert text == "--- ROI Meta Data ---\nSize (Voxels): 96 84 40\nLocation (Voxels): 201 233 57\n"
    assert roi_text(box, final_newline=False) == text[:-1]
    assert parse_roi_txt(text) == parse_roi_txt(text[:-1]) == box


def test_edges_yaml_is_the_release_format_in_any_key_order() -> None:
    edges = {"anterior": {"L-A1": 1, "Acom": 1, "3rd-A2": 0, "R-A1": 1},
             "posterior": {"L-Pcom": 0, "L-P1": 1, "R-P1": 1, "R-Pcom": 1}}
    order = {"anterior": ("3rd-A2", "Acom", "R-A1", "L-A1"), "posterior": ("R-Pcom", "L-P1", "L-Pcom", "R-P1")}
    text = edges_yaml(edges, order)
    assert text == ("anterior:\n    3rd-A2:  0\n    Acom:    1\n    R-A1:    1\n    L-A1:    1\n"
                    "posterior:\n    R-Pcom:  1\n    L-P1:    1\n    L-Pcom:  0\n    R-P1:    1\n")
    assert parse_edges(yaml.safe_load(text), "yml") == {"anterior": (1, 1, 0, 1), "posterior": (0, 1, 1, 1)}


@pytest.mark.parametrize(("contrast", "modality"), [(CT_ANGIOGRAPHY, "ct"), (TOF_MR_ANGIOGRAPHY, "mr")])
def test_vessels_are_brighter_than_brain_in_both_modalities(contrast, modality) -> None:
    patient = make_patient(np.random.default_rng(5))
    frame = topcow.FRAMES[modality].sample(np.random.default_rng(6))
    rendering = render_vessels(patient, frame, TOPCOW_LABEL_MAP)
    image = synthesize_image(rendering, frame, contrast, np.random.default_rng(7))
    assert image.dtype == np.int16 and image.shape == rendering.labels.shape
    tissues = head_tissues(frame)
    brain = image[(tissues == 3) & (rendering.artery == 0) & (rendering.vein == 0)]
    vessel = image[rendering.labels > 0]
    assert np.median(vessel) > np.median(brain) + 10 * brain.std()
    if modality == "ct":
        assert np.median(image[tissues == 2]) > np.percentile(vessel, 99)  # bone outshines contrast


def test_the_same_patient_renders_identically_and_differs_between_patients() -> None:
    frame = topcow.FRAMES["ct"].sample(np.random.default_rng(0))
    first = render_vessels(make_patient(np.random.default_rng(1)), frame, TOPCOW_LABEL_MAP).labels
    again = render_vessels(make_patient(np.random.default_rng(1)), frame, TOPCOW_LABEL_MAP).labels
    other = render_vessels(make_patient(np.random.default_rng(2)), frame, TOPCOW_LABEL_MAP).labels
    assert np.array_equal(first, again) and not np.array_equal(first, other)


@pytest.mark.parametrize("layout", ["top", "moved-up", "doubled"])
def test_the_release_root_is_found_in_each_unpacked_layout(tmp_path: Path, layout: str) -> None:
    top = "TopBrain_Data_Release_Batches1n2_081425"
    root = {"top": tmp_path / top, "moved-up": tmp_path, "doubled": tmp_path / top / top}[layout]
    for sub in ("imagesTr_topbrain_ct", "labelsTr_topbrain_ct"):
        (root / sub).mkdir(parents=True)
    assert find_release_root(tmp_path, top, ("imagesTr_topbrain_ct", "labelsTr_topbrain_ct")) == root
    with pytest.raises(TaskDataMissingError, match="imagesTr_topbrain_mr"):
        find_release_root(tmp_path, top, ("imagesTr_topbrain_mr",))
