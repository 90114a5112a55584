"""TopBrain 2025 (Zenodo 16878417): whole-brain vessel segmentation, track 1 CTA (40 labels), track 2 MRA (42).

Real download (DATA_LAYOUTS.md §2): ``TopBrain_Data_Release_Batches1n2_081425.zip`` unpacks to::

    TopBrain_Data_Release_Batches1n2_081425/
      License.txt
      imagesTr_topbrain_ct/   topcow_ct_NNN_0000.nii.gz      labelsTr_topbrain_ct/   topcow_ct_NNN.nii.gz
      imagesTr_topbrain_mr/   topcow_mr_NNN_0000.nii.gz      labelsTr_topbrain_mr/   topcow_mr_NNN.nii.gz
      itksnap_labelmap_txt/   labelmap_topbrain_ct.txt (+ an MRA label map; its real name is unknown)

25 cases per modality (MRA ids 001-027 without 009 and 019; TopBrain re-annotated TopCoW scans, hence the
``topcow_`` prefix). Some copies hold the top folder twice (unpacked into a folder named after the zip); some have
its content moved up into ``raw/`` (the original release does that): :func:`find_release_root` accepts all three.
Case ids are the label stems; the split groups cases by patient number.

Synthetic mirrors: ``easy`` and ``realistic`` (``--difficulty realistic``: the confounders listed in
:mod:`rexmle_tasks.families.vessels`, on grids of about 52-72 voxels a side with thick slices, so that a small 3-D
network trains on them in CPU minutes; same files and labels).

Task options (task.yaml): ``modality`` ``ct`` (track 1) or ``mr`` (track 2).

Prepared layout: ``public/train/images/<id>_0000.nii.gz``, ``public/train/labels/<id>.nii.gz``,
``public/test/images/<id>_0000.nii.gz``, ``public/valid_neighbors.json`` (the organisers' table of labels allowed
to touch, which the ``neighbor_error`` metric uses); ``private/labels/<id>.nii.gz`` and ``private/answers.csv``.
"""

from __future__ import annotations

import colorsys
import json
from pathlib import Path

from rexmle_grade.errors import ConfigurationError
from rexmle_grade.grader import TestManifest
from rexmle_grade.graders.topbrain import valid_neighbours
from rexmle_grade.io import write_volume
from rexmle_tasks.base import PrepareContext, register_family
from rexmle_tasks.families.vessels import (
    CT_ANGIOGRAPHY,
    IMAGE_SUFFIX,
    LABEL,
    TOF_MR_ANGIOGRAPHY,
    TOPBRAIN_LABEL_NAMES,
    FrameSpec,
    HeadPose,
    RealisticFrames,
    ReleaseCase,
    VesselReleaseFamily,
    find_release_root,
    make_patient,
    make_realistic_patient,
    publish,
    realistic_angiogram,
    render_vessels,
    rng_for,
    synthesize_image,
    thicken_vanishing_labels,
    topbrain_label_map,
)
from rexmle_tasks.metadata import TaskMetadata

ARCHIVE = "TopBrain_Data_Release_Batches1n2_081425.zip"
TOP_FOLDER = "TopBrain_Data_Release_Batches1n2_081425"
LABEL_MAP_FOLDER = "itksnap_labelmap_txt"
VALID_NEIGHBOURS = "valid_neighbors.json"
MODALITIES = ("ct", "mr")
# the MRA ids of the release; the CTA ids are not published and assumed to be the same
PATIENT_IDS = tuple(f"{n:03d}" for n in range(1, 28) if n not in (9, 19))

# synthetic mirror: whole-head windows (the MRA slab stops below the vertex), intensities, random-stream keys
FRAMES = {
    "ct": FrameSpec(fov_lo=(0.02, 0.02, 0.00), fov_hi=(0.98, 0.98, 1.00), size_lo=(76, 76, 62), size_hi=(84, 84, 68),
                    inplane_mm=(0.35, 0.55), slice_mm=(0.5, 1.0)),
    "mr": FrameSpec(fov_lo=(0.04, 0.04, 0.00), fov_hi=(0.96, 0.96, 0.90), size_lo=(72, 72, 56), size_hi=(80, 80, 62),
                    inplane_mm=(0.25, 0.40), slice_mm=(0.5, 0.7)),
}
CONTRASTS = {"ct": CT_ANGIOGRAPHY, "mr": TOF_MR_ANGIOGRAPHY}
REALISTIC_FRAMES = {modality: RealisticFrames(spec, window_shift=0.04, zoom=(0.92, 1.08), slice_ratio=(1.0, 1.6))
                    for modality, spec in FRAMES.items()}
FAMILY_KEY = 2
REALISTIC_KEY = 36  # the realistic mirror's random streams are apart from the easy one's
MODALITY_KEYS = {"ct": 1, "mr": 2}
LICENCE = """TopBrain 2025 data release, batches 1 and 2 (synthetic mirror written by rexmle; no real patient data).

The real release's licence grants the opendata.swiss terms of use: open use; the source must be provided;
commercial use requires permission of the data owner (University Hospital Zurich).
"""


def images_folder(modality: str) -> str:
    return f"imagesTr_topbrain_{modality}"


def labels_folder(modality: str) -> str:
    return f"labelsTr_topbrain_{modality}"


def itksnap_label_description(names: dict[int, str]) -> str:
    """An ITK-SNAP label description file (index, RGB, opacity, visibility, mesh visibility, quoted name)."""
    lines = [
        "################################################",
        "# ITK-SnAP Label Description File",
        "# File format:",
        "# IDX   -R-  -G-  -B-  -A--  VIS MSH  LABEL",
        "################################################",
        '    0     0    0    0        0  0  0    "Clear Label"',
    ]
    for label, name in names.items():
        # golden-angle hues give neighbouring labels clearly different colours
        red, green, blue = (round(255 * c) for c in colorsys.hsv_to_rgb((label * 0.618034) % 1.0, 0.8, 0.95))
        lines.append(f'{label:>5} {red:>5} {green:>4} {blue:>4}        1  1  1    "{name}"')
    return "\n".join(lines) + "\n"


def write_release(folder: Path, *, patients: tuple[str, ...], seed: int, realistic: bool = False) -> None:
    """The synthetic release tree: CTA and MRA of every patient with their TopBrain label maps (``realistic``: the
    realistic mirror of :mod:`rexmle_tasks.families.vessels`, same layout)."""
    top = folder / TOP_FOLDER
    (top / LABEL_MAP_FOLDER).mkdir(parents=True)
    (top / "License.txt").write_text(LICENCE)
    for modality in MODALITIES:
        (top / LABEL_MAP_FOLDER / f"labelmap_topbrain_{modality}.txt").write_text(
            itksnap_label_description(TOPBRAIN_LABEL_NAMES[modality]))
    label_maps = {modality: topbrain_label_map(modality) for modality in MODALITIES}
    family_keys = (FAMILY_KEY, REALISTIC_KEY) if realistic else (FAMILY_KEY,)
    for patient_id in patients:
        number = int(patient_id)
        patient = (make_realistic_patient if realistic else make_patient)(rng_for(seed, *family_keys, number))
        for modality in MODALITIES:
            rng = rng_for(seed, *family_keys, number, MODALITY_KEYS[modality])
            if realistic:
                frame = REALISTIC_FRAMES[modality].sample(rng)
                pose = HeadPose.sample(rng)
                rendering = render_vessels(pose.seen(patient), frame, label_maps[modality])
                thicken_vanishing_labels(rendering.labels)
                image = realistic_angiogram(rendering, frame, pose, modality, rng)
            else:
                frame = FRAMES[modality].sample(rng)
                rendering = render_vessels(patient, frame, label_maps[modality])
                thicken_vanishing_labels(rendering.labels)
                image = synthesize_image(rendering, frame, CONTRASTS[modality], rng)
            case_id = f"topcow_{modality}_{patient_id}"
            geometry = frame.grid.geometry
            write_volume(top / images_folder(modality) / f"{case_id}{IMAGE_SUFFIX}", image, geometry)
            write_volume(top / labels_folder(modality) / f"{case_id}{LABEL.suffix}", rendering.labels, geometry)


@register_family
class TopBrainFamily(VesselReleaseFamily):
    name = "topbrain"
    competition = "TopBrain"
    archive = ARCHIVE
    patient_ids = PATIENT_IDS
    patients_counted_as = "cases per modality"
    release_writer = staticmethod(write_release)

    def __init__(self, meta: TaskMetadata) -> None:
        super().__init__(meta)
        self.modality = str(self.options.get("modality"))
        if self.modality not in MODALITIES:
            raise ConfigurationError(f"task {meta.id!r}: the TopBrain option modality must be one of "
                                     f"{list(MODALITIES)}, got {self.options.get('modality')!r}",
                                     hint="fix options in its task.yaml")

    # ---- raw data ---------------------------------------------------------------------------------------------
    def release_cases(self, raw: Path) -> dict[str, ReleaseCase]:
        """This modality's images that have a label map."""
        images, labels = images_folder(self.modality), labels_folder(self.modality)
        root = find_release_root(raw, TOP_FOLDER, (images, labels))
        cases = {}
        for image in sorted((root / images).glob(f"*{IMAGE_SUFFIX}")):
            case_id = image.name[: -len(IMAGE_SUFFIX)]
            label = root / labels / f"{case_id}{LABEL.suffix}"
            if label.is_file():
                cases[case_id] = ReleaseCase(image=image, annotations={LABEL.kind: label})
        return cases

    # ---- preparation ------------------------------------------------------------------------------------------
    def prepare(self, ctx: PrepareContext) -> TestManifest:
        manifest = publish(ctx, self.release_cases(ctx.raw), (LABEL,))
        table = {str(label): sorted(allowed) for label, allowed in sorted(valid_neighbours(self.modality).items())}
        (ctx.public / VALID_NEIGHBOURS).write_text(json.dumps(table, indent=1) + "\n")
        return manifest
