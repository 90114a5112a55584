"""TopCoW 2024 (Zenodo 15692630): six tasks on one release, shared raw folder ``topcow-shared/raw``.

Real download (DATA_LAYOUTS.md §1): ``TopCoW2024_Data_Release.zip`` unpacks to::

    TopCoW2024_Data_Release/
      License.txt
      imagesTr/               topcow_{ct,mr}_NNN_0000.nii.gz   head CTA / TOF-MRA, LPS+, int16
      cow_seg_labelsTr/       topcow_{ct,mr}_NNN.nii.gz        labels 0-12 and 15
      roi_loc_labelsTr/       topcow_{ct,mr}_NNN.txt           CoW ROI box ("--- ROI Meta Data ---", size, location)
      antpos_edges_labelsTr/  topcow_{ct,mr}_NNN.yml           anterior/posterior edge lists (0/1)

125 patients numbered 001-090 and 131-165, each scanned with CTA and MRA (same number = same patient). Case ids
are the label stems (``topcow_ct_001``); the split groups cases by patient number, and all six tasks share one
split seed, so a patient is a test case in all of them or in none.

Synthetic mirrors: ``easy`` and ``realistic`` (``--difficulty realistic``: the confounders listed in
:mod:`rexmle_tasks.families.vessels`, on grids of about 52-72 voxels a side with thick slices, so that a small 3-D
network trains on them in CPU minutes; same files and labels).

Task options (task.yaml): ``modality`` ``ct`` (track 1) or ``mr`` (track 2); ``task`` ``seg`` (task 1: label
map, scored inside the hidden ROI), ``roi`` (task 2: ROI box) or ``edges`` (task 3: edge lists).

Prepared layout (every task gets all training annotations, as the challenge's participants did):
``public/train/images/<id>_0000.nii.gz``, ``public/train/{labels,roi,edges}/<id>.{nii.gz,txt,yml}``,
``public/test/images/<id>_0000.nii.gz``; ``private/`` holds the test answers of the task (task 1: ``labels/`` and
``roi/``; task 2: ``roi/``; task 3: ``edges/``) and ``answers.csv``.
"""

from __future__ import annotations

from pathlib import Path

from rexmle_grade.errors import ConfigurationError
from rexmle_grade.grader import TestManifest
from rexmle_grade.io import write_volume
from rexmle_tasks.base import PrepareContext, register_family
from rexmle_tasks.families.vessels import (
    CT_ANGIOGRAPHY,
    EDGES,
    IMAGE_SUFFIX,
    LABEL,
    ROI,
    TOF_MR_ANGIOGRAPHY,
    TOPCOW_LABEL_MAP,
    Annotation,
    FrameSpec,
    HeadPose,
    RealisticFrames,
    ReleaseCase,
    VesselReleaseFamily,
    edges_yaml,
    find_release_root,
    make_patient,
    make_realistic_patient,
    publish,
    realistic_angiogram,
    render_vessels,
    rng_for,
    roi_box,
    roi_text,
    shuffled_edge_keys,
    synthesize_image,
)
from rexmle_tasks.metadata import TaskMetadata

ARCHIVE = "TopCoW2024_Data_Release.zip"
TOP_FOLDER = "TopCoW2024_Data_Release"
IMAGES = "imagesTr"
RELEASE_FOLDERS = {LABEL.kind: "cow_seg_labelsTr", ROI.kind: "roi_loc_labelsTr", EDGES.kind: "antpos_edges_labelsTr"}
PATIENT_IDS = tuple(f"{n:03d}" for n in (*range(1, 91), *range(131, 166)))
MODALITIES = ("ct", "mr")
TASK_ANSWERS: dict[str, tuple[Annotation, ...]] = {"seg": (LABEL, ROI), "roi": (ROI,), "edges": (EDGES,)}

# synthetic mirror: head-coordinate windows and grids (CTA covers the skull base to the vertex region; the
# TOF-MRA slab is thinner), intensities per modality, and random-stream keys
FRAMES = {
    "ct": FrameSpec(fov_lo=(0.10, 0.08, 0.00), fov_hi=(0.90, 0.92, 0.78), size_lo=(60, 60, 44), size_hi=(70, 70, 50),
                    inplane_mm=(0.35, 0.55), slice_mm=(0.5, 1.0)),
    "mr": FrameSpec(fov_lo=(0.12, 0.10, 0.12), fov_hi=(0.88, 0.90, 0.72), size_lo=(60, 60, 40), size_hi=(70, 70, 46),
                    inplane_mm=(0.25, 0.45), slice_mm=(0.4, 0.8)),
}
CONTRASTS = {"ct": CT_ANGIOGRAPHY, "mr": TOF_MR_ANGIOGRAPHY}
REALISTIC_FRAMES = {modality: RealisticFrames(spec, window_shift=0.09, zoom=(0.88, 1.12), slice_ratio=(1.0, 1.8))
                    for modality, spec in FRAMES.items()}
FAMILY_KEY = 1
REALISTIC_KEY = 36  # the realistic mirror's random streams are apart from the easy one's
MODALITY_KEYS = {"ct": 1, "mr": 2}
EDGE_ORDER_KEY = 3
LICENCE = """TopCoW 2024 data release (synthetic mirror written by rexmle; no real patient data).

The real release's License.txt grants the opendata.swiss terms of use: open use; the source must be provided;
commercial use requires permission of the data owner (University Hospital Zurich).
"""


def write_release(folder: Path, *, patients: tuple[str, ...], seed: int, realistic: bool = False) -> None:
    """The synthetic release tree: both modalities of every patient, with labels, ROI txt and edge YAML
    (``realistic``: the realistic mirror of :mod:`rexmle_tasks.families.vessels`, same layout)."""
    top = folder / TOP_FOLDER
    top.mkdir(parents=True)
    (top / "License.txt").write_text(LICENCE)
    for folder_name in RELEASE_FOLDERS.values():
        (top / folder_name).mkdir()
    family_keys = (FAMILY_KEY, REALISTIC_KEY) if realistic else (FAMILY_KEY,)
    for patient_id in patients:
        number = int(patient_id)
        make = make_realistic_patient if realistic else make_patient
        patient = make(rng_for(seed, *family_keys, number))
        # the CTA and MRA files of one patient carry the same edge list, written identically
        edges = edges_yaml(patient.variant.edge_lists(), shuffled_edge_keys(rng_for(seed, *family_keys, number,
                                                                                    EDGE_ORDER_KEY)))
        for modality in MODALITIES:
            rng = rng_for(seed, *family_keys, number, MODALITY_KEYS[modality])
            case_id = f"topcow_{modality}_{patient_id}"
            if realistic:
                frame = REALISTIC_FRAMES[modality].sample(rng)
                pose = HeadPose.sample(rng)
                seen = pose.seen(patient)
                rendering = render_vessels(seen, frame, TOPCOW_LABEL_MAP)
                image = realistic_angiogram(rendering, frame, pose, modality, rng)
            else:
                frame = FRAMES[modality].sample(rng)
                seen = patient
                rendering = render_vessels(patient, frame, TOPCOW_LABEL_MAP)
                image = synthesize_image(rendering, frame, CONTRASTS[modality], rng)
            geometry = frame.grid.geometry
            write_volume(top / IMAGES / f"{case_id}{IMAGE_SUFFIX}", image, geometry)
            write_volume(top / RELEASE_FOLDERS[LABEL.kind] / f"{case_id}{LABEL.suffix}", rendering.labels, geometry)
            box = roi_box(seen, frame, rng)
            # one official ROI file lacks the final newline; the mirror writes both forms
            (top / RELEASE_FOLDERS[ROI.kind] / f"{case_id}{ROI.suffix}").write_text(
                roi_text(box, final_newline=bool(rng.random() < 0.7)))
            (top / RELEASE_FOLDERS[EDGES.kind] / f"{case_id}{EDGES.suffix}").write_text(edges)


@register_family
class TopCowFamily(VesselReleaseFamily):
    name = "topcow"
    competition = "TopCoW"
    archive = ARCHIVE
    patient_ids = PATIENT_IDS
    patients_counted_as = "patients"
    release_writer = staticmethod(write_release)

    def __init__(self, meta: TaskMetadata) -> None:
        super().__init__(meta)
        self.modality = str(self.options.get("modality"))
        self.task = str(self.options.get("task"))
        if self.modality not in MODALITIES or self.task not in TASK_ANSWERS:
            raise ConfigurationError(
                f"task {meta.id!r}: TopCoW options must be modality in {list(MODALITIES)} and task in "
                f"{list(TASK_ANSWERS)}, got {dict(self.options)}", hint="fix options in its task.yaml")
        self.answers = TASK_ANSWERS[self.task]

    # ---- raw data ---------------------------------------------------------------------------------------------
    def release_cases(self, raw: Path) -> dict[str, ReleaseCase]:
        """This modality's cases that carry the annotations the task is scored on, with all their annotations."""
        root = find_release_root(raw, TOP_FOLDER, (IMAGES, *(RELEASE_FOLDERS[a.kind] for a in self.answers)))
        cases = {}
        for image in sorted((root / IMAGES).glob(f"topcow_{self.modality}_*{IMAGE_SUFFIX}")):
            case_id = image.name[: -len(IMAGE_SUFFIX)]
            found = {a.kind: root / RELEASE_FOLDERS[a.kind] / f"{case_id}{a.suffix}" for a in (LABEL, ROI, EDGES)}
            annotations = {kind: path for kind, path in found.items() if path.is_file()}
            if all(a.kind in annotations for a in self.answers):
                cases[case_id] = ReleaseCase(image=image, annotations=annotations)
        return cases

    # ---- preparation ------------------------------------------------------------------------------------------
    def prepare(self, ctx: PrepareContext) -> TestManifest:
        return publish(ctx, self.release_cases(ctx.raw), self.answers)
