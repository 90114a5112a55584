"""Cerebral vessels shared by the TopCoW and TopBrain families: a synthetic artery/vein tree, its images, ROI boxes
and variant edge lists, and the preparation both families share.

TopCoW labels the 13 Circle-of-Willis (CoW) segments of head CTA/MRA scans, TopBrain 40 (CTA) or 42 (MRA) brain
vessels of the same patients. One anatomical model serves both: a :class:`Patient` is a list of named vessel
segments (TopBrain's names, the finest split) with centreline polylines in *head coordinates*; a task renders it
through its own label map (segment name -> label, missing = visible but unlabelled) onto its own voxel grid.

Head coordinates h = (x, y, z) in [0, 1]^3 follow LPS+: x grows toward the patient's Left, y toward Posterior,
z toward Superior. A :class:`Frame` maps a window of head coordinates linearly onto voxel indices (i, j, k) in
SimpleITK order with an identity direction, so every right-side vessel (x < 0.5) lies at smaller i than its left
twin, which the official left-right flip check relies on. Numpy arrays are (z, y, x), as SimpleITK returns them.

How the tree stays anatomically valid:

* a branch starts at a vertex of its parent's polyline, so parent and branch touch (26-neighbourhood);
* vessels are painted distal first and trunks last, so a trunk keeps its calibre at a branching point and the
  branch shows only outside it (the carotid terminus bulges, which keeps the MCA and ACA roots apart);
* vessels that must not touch are kept apart by the template geometry: the tests check TopBrain's table of valid
  neighbours and the TopCoW edge lists on many patients;
* centreline vertices sit on voxel centres, and :func:`thicken_vanishing_labels` coats the rare label that Lee
  thinning would delete, so a perfect prediction scores per-class clDice 1.

Variants drawn per patient: missing Acom, missing Pcom, missing A1 (that ACA is fed through the Acom), missing P1
("fetal" PCA fed through its Pcom), a rare third A2 (label 15), and occasionally missing small side branches. The
edge-list YAML states these variants; the ROI box encloses the CoW landmarks of the rendered grid.

Both families also write a ``realistic`` mirror (section "the realistic mirror" at the end): the same files, names and
labels, with the confounders of real scans (variant rates, hypoplastic communicating arteries, head pose, field of
view placement and zoom, thick slices, skull-base bone, venous filling, site-dependent contrast, TOF saturation).
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

import numpy as np
from scipy import ndimage

from rexmle_grade.errors import TaskDataMissingError, UserInputError
from rexmle_grade.grader import ANSWERS_CSV, TestManifest
from rexmle_grade.graders.topcow import EDGE_KEYS
from rexmle_grade.io import Geometry
from rexmle_grade.metrics.boxes import VoxelBox
from rexmle_grade.metrics.topology import skeleton
from rexmle_tasks.base import PrepareContext, TaskFamily
from rexmle_tasks.families.synth2d import copy_file, write_csv
from rexmle_tasks.families.synth3d import Grid, image_geometry, render, to_int16, write_archive

Point = tuple[float, float, float]
SIDES = ("R", "L")
ID_COLUMN = "image_id"
IMAGE_SUFFIX = "_0000.nii.gz"  # nnU-Net channel suffix of the release's image files

# ---- anatomy template ----------------------------------------------------------------------------------------
# Right-hemisphere control points (head coordinates); the left ones are their mirror images (x -> 1 - x).
_SIDE_POINTS: dict[str, Point] = {
    # internal carotid artery from the skull base to its terminus; its branches start at its vertices
    "ica0": (0.36, 0.40, 0.00), "ica1": (0.345, 0.35, 0.14), "ica2": (0.355, 0.37, 0.24),
    "oa_root": (0.358, 0.385, 0.265), "pcom_root": (0.365, 0.41, 0.30), "acha_root": (0.37, 0.42, 0.33),
    "ica_t": (0.38, 0.44, 0.40),
    # middle cerebral artery
    "m1_mid": (0.30, 0.455, 0.435), "m1_end": (0.22, 0.47, 0.43),
    "m2_mid": (0.15, 0.48, 0.51), "m2_end": (0.12, 0.50, 0.61),
    "m3_mid": (0.12, 0.55, 0.68), "m3_end": (0.16, 0.60, 0.76),
    # anterior cerebral artery; a1_end is the A1/A2 junction where the Acom joins
    "a1_end": (0.445, 0.37, 0.44), "a2_mid": (0.445, 0.28, 0.52), "a2_end": (0.45, 0.21, 0.62),
    "a3_mid": (0.452, 0.215, 0.72), "a3_end": (0.455, 0.30, 0.80),
    # posterior cerebral artery; p1_end is the P1/P2 junction where the Pcom joins
    "p1_end": (0.42, 0.545, 0.41), "p2_mid": (0.36, 0.60, 0.425), "p2_end": (0.33, 0.70, 0.45),
    "p3_mid": (0.345, 0.80, 0.48), "p3_end": (0.40, 0.90, 0.52),
    "pcom_mid": (0.40, 0.50, 0.37),
    # vertebral artery and the cerebellar arteries
    "va0": (0.43, 0.67, 0.03), "pica_root": (0.45, 0.635, 0.06),
    "pica_mid": (0.39, 0.64, 0.09), "pica_end": (0.35, 0.71, 0.12),
    "aica_mid": (0.43, 0.60, 0.21), "aica_end": (0.37, 0.64, 0.20),
    "sca_mid": (0.44, 0.575, 0.335), "sca_bend": (0.38, 0.62, 0.33), "sca_end": (0.35, 0.68, 0.32),
    # anterior choroidal and ophthalmic arteries
    "acha_mid": (0.35, 0.51, 0.335), "acha_end": (0.33, 0.58, 0.36),
    "oa_gap": (0.35, 0.30, 0.30), "oa_mid": (0.34, 0.24, 0.31), "oa_end": (0.32, 0.14, 0.30),
    # external carotid artery and its branches
    "eca0": (0.27, 0.38, 0.00), "eca1": (0.24, 0.33, 0.10), "eca_t": (0.21, 0.30, 0.17),
    "sta_mid": (0.14, 0.32, 0.28), "sta_bend": (0.10, 0.36, 0.45), "sta_end": (0.11, 0.40, 0.60),
    "maxa_mid": (0.25, 0.20, 0.15), "maxa_end": (0.31, 0.11, 0.14),
    "mma_mid": (0.21, 0.21, 0.26), "mma_end": (0.16, 0.24, 0.40),
    # deep veins
    "bvr0": (0.36, 0.47, 0.50), "bvr1": (0.37, 0.56, 0.515), "bvr2": (0.42, 0.63, 0.535),
    "icv0": (0.485, 0.44, 0.56), "icv1": (0.485, 0.56, 0.565),
}
_MIDLINE_POINTS: dict[str, Point] = {
    "ba0": (0.5, 0.60, 0.12), "aica_root": (0.5, 0.585, 0.22), "sca_root": (0.5, 0.57, 0.34),
    "ba_tip": (0.5, 0.56, 0.40),
    "acom_mid": (0.5, 0.37, 0.44),
    "t2_mid": (0.5, 0.28, 0.525), "t2_end": (0.5, 0.215, 0.62), "t3_mid": (0.5, 0.225, 0.72),
    "t3_end": (0.5, 0.30, 0.79),
    "vog0": (0.5, 0.66, 0.56), "vog1": (0.5, 0.72, 0.58), "sts_mid": (0.5, 0.775, 0.62), "sts_end": (0.5, 0.82, 0.645),
    "sss0": (0.5, 0.13, 0.76), "sss1": (0.5, 0.33, 0.96), "sss2": (0.5, 0.65, 0.95), "sss3": (0.5, 0.86, 0.78),
}


@dataclass(frozen=True)
class _Template:
    """One vessel of the template. ``{s}`` in the name stands for the side; a path point is a side point of that
    side, an explicit ``R:``/``L:`` side point, or a midline point. Sided templates are instantiated per side."""

    name: str
    path: tuple[str, ...]
    radius: float  # voxels, before the patient's calibre factor
    vein: bool = False

    @property
    def sided(self) -> bool:
        return "{s}" in self.name or any(p in _SIDE_POINTS for p in self.path)


# Trunks first: painting runs backwards through this list (see the module docstring).
_TEMPLATES = (
    _Template("BA", ("ba0", "aica_root", "sca_root", "ba_tip"), 1.8),
    _Template("{s}-VA", ("va0", "pica_root", "ba0"), 1.7),
    _Template("{s}-ICA", ("ica0", "ica1", "ica2", "oa_root", "pcom_root", "acha_root", "ica_t"), 2.0),
    # the carotid terminus bulges where the MCA and ACA leave it, which also keeps the two apart
    _Template("{s}-ICA", ("ica_t", "ica_t"), 2.6),
    _Template("{s}-ECA", ("eca0", "eca1", "eca_t"), 1.5),
    _Template("{s}-M1", ("ica_t", "m1_mid", "m1_end"), 1.6),
    _Template("{s}-A1A2", ("ica_t", "a1_end", "a2_mid", "a2_end"), 1.4),
    _Template("{s}-P1P2", ("ba_tip", "p1_end", "p2_mid", "p2_end"), 1.4),
    _Template("Acom", ("R:a1_end", "acom_mid", "L:a1_end"), 1.1),
    _Template("{s}-Pcom", ("pcom_root", "pcom_mid", "p1_end"), 1.1),
    _Template("{s}-SCA", ("sca_root", "sca_mid", "sca_bend", "sca_end"), 1.0),
    _Template("{s}-AICA", ("aica_root", "aica_mid", "aica_end"), 1.0),
    _Template("{s}-PICA", ("pica_root", "pica_mid", "pica_end"), 1.0),
    _Template("{s}-AChA", ("acha_root", "acha_mid", "acha_end"), 1.0),
    # the OA's first millimetres: labelled OA in TopBrain MRA, left unlabelled in CTA, whose table of valid
    # neighbours gives the OA none (so its label must not reach the ICA)
    _Template("{s}-OA-origin", ("oa_root", "oa_gap"), 1.0),
    _Template("{s}-OA", ("oa_gap", "oa_mid", "oa_end"), 1.0),
    _Template("{s}-M2", ("m1_end", "m2_mid", "m2_end"), 1.3),
    _Template("{s}-A3", ("a2_end", "a3_mid", "a3_end"), 1.2),
    _Template("{s}-P3P4", ("p2_end", "p3_mid", "p3_end"), 1.2),
    _Template("3rd-A2", ("acom_mid", "t2_mid", "t2_end"), 1.1),
    _Template("3rd-A3", ("t2_end", "t3_mid", "t3_end"), 1.0),
    _Template("{s}-M3", ("m2_end", "m3_mid", "m3_end"), 1.0),
    _Template("{s}-STA", ("eca_t", "sta_mid", "sta_bend", "sta_end"), 1.1),
    _Template("{s}-MaxA", ("eca_t", "maxa_mid", "maxa_end"), 1.2),
    _Template("{s}-MMA", ("maxa_mid", "mma_mid", "mma_end"), 1.0),
    _Template("SSS", ("sss0", "sss1", "sss2", "sss3"), 2.0, vein=True),
    _Template("VoG", ("vog0", "vog1"), 1.8, vein=True),
    _Template("StS", ("vog1", "sts_mid", "sts_end"), 1.6, vein=True),
    _Template("ICVs", ("icv0", "icv1", "vog0"), 1.2, vein=True),
    _Template("{s}-BVR", ("bvr0", "bvr1", "bvr2", "vog0"), 1.1, vein=True),
)
# small branches that some patients lack (any side, independently)
_OPTIONAL_BRANCHES = ("SCA", "AICA", "PICA", "AChA", "OA")
_ROI_LANDMARKS = ("R:ica_t", "L:ica_t", "R:a1_end", "L:a1_end", "acom_mid", "R:p1_end", "L:p1_end", "ba_tip",
                  "R:pcom_root", "L:pcom_root")

# Label names of the two TopBrain tracks (CoWBenchmark/TopBrain_Eval_Metrics, topbrain25_eval/constants.py).
TOPBRAIN_COMMON_LABELS = (
    "BA", "R-P1P2", "L-P1P2", "R-ICA", "R-M1", "L-ICA", "L-M1", "R-Pcom", "L-Pcom", "Acom", "R-A1A2", "L-A1A2",
    "R-A3", "L-A3", "3rd-A2", "3rd-A3", "R-M2", "R-M3", "L-M2", "L-M3", "R-P3P4", "L-P3P4", "R-VA", "L-VA", "R-SCA",
    "L-SCA", "R-AICA", "L-AICA", "R-PICA", "L-PICA", "R-AChA", "L-AChA", "R-OA", "L-OA",
)
TOPBRAIN_LABEL_NAMES: dict[str, dict[int, str]] = {
    "ct": dict(enumerate((*TOPBRAIN_COMMON_LABELS, "VoG", "StS", "ICVs", "R-BVR", "L-BVR", "SSS"), start=1)),
    "mr": dict(enumerate((*TOPBRAIN_COMMON_LABELS, "R-ECA", "L-ECA", "R-STA", "L-STA", "R-MaxA", "L-MaxA", "R-MMA",
                          "L-MMA"), start=1)),
}


def topbrain_label_map(modality: str) -> dict[str, int]:
    """Vessel name -> TopBrain label of one track (the OA's origin belongs to the OA only where it may touch the
    ICA, i.e. in MRA)."""
    labels = {name: label for label, name in TOPBRAIN_LABEL_NAMES[modality].items()}
    if modality == "mr":
        labels.update({f"{s}-OA-origin": labels[f"{s}-OA"] for s in SIDES})
    return labels


# TopCoW labels whole arteries: the distal TopBrain segments join their parent's label; the rest stays unlabelled.
TOPCOW_LABEL_MAP: dict[str, int] = {
    "BA": 1, "R-P1P2": 2, "R-P3P4": 2, "L-P1P2": 3, "L-P3P4": 3, "R-ICA": 4, "R-M1": 5, "R-M2": 5, "L-ICA": 6,
    "L-M1": 7, "L-M2": 7, "R-Pcom": 8, "L-Pcom": 9, "Acom": 10, "R-A1A2": 11, "R-A3": 11, "L-A1A2": 12, "L-A3": 12,
    "3rd-A2": 15, "3rd-A3": 15,
}


# ---- patients --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CowVariant:
    """Which optional CoW segments a patient has; per-side tuples are (right, left)."""

    acom: bool
    third_a2: bool
    a1: tuple[bool, bool]
    p1: tuple[bool, bool]
    pcom: tuple[bool, bool]

    @classmethod
    def sample(cls, rng: np.random.Generator) -> CowVariant:
        acom = bool(rng.random() < 0.85)
        third_a2 = acom and bool(rng.random() < 0.08)
        # an A1 can be missing only when the Acom feeds that ACA, and never on both sides
        missing_a1 = int(rng.integers(2)) if acom and rng.random() < 0.12 else None
        pcom = (bool(rng.random() < 0.6), bool(rng.random() < 0.6))
        # a missing P1 ("fetal" PCA) needs the Pcom of that side
        p1 = (not (pcom[0] and rng.random() < 0.15), not (pcom[1] and rng.random() < 0.15))
        return cls(acom=acom, third_a2=third_a2, a1=(missing_a1 != 0, missing_a1 != 1), p1=p1, pcom=pcom)

    def edge_lists(self) -> dict[str, dict[str, int]]:
        """The TopCoW task-3 annotation: {"anterior": {L-A1, Acom, 3rd-A2, R-A1}, "posterior": {...}} of 0/1."""
        present = {
            "L-A1": self.a1[1], "Acom": self.acom, "3rd-A2": self.third_a2, "R-A1": self.a1[0],
            "L-Pcom": self.pcom[1], "L-P1": self.p1[1], "R-P1": self.p1[0], "R-Pcom": self.pcom[0],
        }
        return {region: {key: int(present[key]) for key in keys} for region, keys in EDGE_KEYS.items()}


@dataclass(frozen=True)
class Vessel:
    name: str
    path: tuple[Point, ...]  # centreline vertices in head coordinates, proximal first
    radius: float  # voxels
    vein: bool


@dataclass(frozen=True)
class Patient:
    variant: CowVariant
    vessels: tuple[Vessel, ...]  # trunks first
    landmarks: Mapping[str, Point]  # every control point by qualified name ("R:ica_t", "ba_tip", ...)


def make_patient(rng: np.random.Generator) -> Patient:
    """A random patient: variant, absent side branches, calibre and a slightly moved, scaled and jittered tree."""
    variant = CowVariant.sample(rng)
    points = _jittered_points(rng)
    calibre = rng.uniform(0.92, 1.08)
    absent = _absent_vessels(rng, variant, 0.08)
    return _assemble(variant, points, absent, lambda name, radius: max(1.0, radius * calibre))


def _absent_vessels(rng: np.random.Generator, variant: CowVariant, branch_missing: float) -> set[str]:
    """Names of the template vessels this patient lacks: optional side branches (each with probability
    ``branch_missing``) and the CoW segments its variant leaves out."""
    absent = {f"{side}-{branch}" for side in SIDES for branch in _OPTIONAL_BRANCHES if rng.random() < branch_missing}
    absent |= {f"{side}-OA-origin" for side in SIDES if f"{side}-OA" in absent}
    if not variant.acom:
        absent.add("Acom")
    if not variant.third_a2:
        absent |= {"3rd-A2", "3rd-A3"}
    absent |= {f"{side}-Pcom" for side, has in zip(SIDES, variant.pcom, strict=True) if not has}
    return absent


def _assemble(variant: CowVariant, points: Mapping[str, Point], absent: set[str],
              radius_of: Callable[[str, float], float]) -> Patient:
    """The patient's vessels from the template: ``radius_of(name, template radius)`` gives each calibre."""
    vessels = []
    for template in _TEMPLATES:
        for side in SIDES if template.sided else ("",):
            name = template.name.replace("{s}", side)
            if name in absent:
                continue
            path = list(template.path)
            # a missing A1/P1 leaves the ACA/PCA starting at its junction with the Acom/Pcom
            if name.endswith(("-A1A2", "-P1P2")):
                proximal = variant.a1 if name.endswith("-A1A2") else variant.p1
                if not proximal[SIDES.index(side)]:
                    path = path[1:]
            coords = tuple(points[_qualified(p, side)] for p in path)
            vessels.append(Vessel(name=name, path=coords, radius=radius_of(name, template.radius),
                                  vein=template.vein))
    return Patient(variant=variant, vessels=tuple(vessels), landmarks=dict(points))


def _qualified(point: str, side: str) -> str:
    if point in _MIDLINE_POINTS or ":" in point:
        return point
    return f"{side}:{point}"


def _jittered_points(rng: np.random.Generator, *, scale_range: float = 0.04, shift_range: float = 0.015,
                     jitter_sd: float = 0.004) -> dict[str, Point]:
    """Every control point after a per-patient scaling and shift about the head centre plus a small jitter."""
    centre = np.array([0.5, 0.5, 0.45])
    scale = rng.uniform(1.0 - scale_range, 1.0 + scale_range, 3)
    shift = rng.uniform(-shift_range, shift_range, 3)
    template: dict[str, Point] = dict(_MIDLINE_POINTS)
    for name, (x, y, z) in _SIDE_POINTS.items():
        template[f"R:{name}"] = (x, y, z)
        template[f"L:{name}"] = (1.0 - x, y, z)
    out = {}
    for name, point in template.items():
        jitter = np.clip(rng.normal(0.0, jitter_sd, 3), -2 * jitter_sd, 2 * jitter_sd)
        moved = centre + scale * (np.asarray(point) - centre) + shift + jitter
        out[name] = (float(moved[0]), float(moved[1]), float(moved[2]))
    return out


# ---- grids and rendering -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FrameSpec:
    """How a scanner of one kind images the head: the head-coordinate window it covers and the ranges from which a
    case's voxel counts and spacings (mm) are drawn (x and y share the in-plane spacing)."""

    fov_lo: Point
    fov_hi: Point
    size_lo: tuple[int, int, int]
    size_hi: tuple[int, int, int]  # inclusive
    inplane_mm: tuple[float, float]
    slice_mm: tuple[float, float]

    def sample(self, rng: np.random.Generator) -> Frame:
        size = tuple(int(rng.integers(lo, hi + 1)) for lo, hi in zip(self.size_lo, self.size_hi, strict=True))
        inplane = round(float(rng.uniform(*self.inplane_mm)), 6)
        spacing = (inplane, inplane, round(float(rng.uniform(*self.slice_mm)), 6))
        # scanners put the origin anywhere; centre the grid near the physical origin with a random offset
        origin = tuple(round(-(n - 1) * s / 2 + float(rng.uniform(-15, 15)), 3)
                       for n, s in zip(size, spacing, strict=True))
        grid = Grid(size=size, spacing=spacing, origin=origin)  # type: ignore[arg-type]
        return Frame(grid=grid, fov_lo=self.fov_lo, fov_hi=self.fov_hi)


@dataclass(frozen=True)
class Frame:
    """A voxel grid and the window of head coordinates it covers (corner voxel centres on the window's corners)."""

    grid: Grid
    fov_lo: Point
    fov_hi: Point
    #: (x, y, z) length of a voxel step in in-plane voxels: a thick-slice scan has z > 1, and vessel radii (in
    #: in-plane voxels) then span fewer slices; the easy mirror's voxels are treated as cubes
    voxel_scale: tuple[float, float, float] = (1.0, 1.0, 1.0)

    def to_voxel(self, points: np.ndarray) -> np.ndarray:
        """Head coordinates (n, 3) -> continuous voxel indices (n, 3) in (x, y, z) order."""
        lo, hi = np.asarray(self.fov_lo), np.asarray(self.fov_hi)
        return (np.asarray(points, dtype=float) - lo) / (hi - lo) * (np.asarray(self.grid.size) - 1)

    def head_coords(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Head coordinates of the voxel centres as open arrays broadcastable to the (z, y, x) shape."""
        x, y, z = (np.linspace(lo, hi, n) for lo, hi, n in zip(self.fov_lo, self.fov_hi, self.grid.size, strict=True))
        return x[None, None, :], y[None, :, None], z[:, None, None]


@dataclass(frozen=True)
class Rendering:
    labels: np.ndarray  # uint8 (z, y, x)
    artery: np.ndarray  # float32 (z, y, x): fraction of each voxel inside an artery (partial volume)
    vein: np.ndarray  # float32 (z, y, x): the same for veins


def render_vessels(patient: Patient, frame: Frame, label_map: Mapping[str, int]) -> Rendering:
    """Rasterise the patient's vessels: a voxel belongs to a vessel when its centre lies within the vessel radius of
    the centreline; labels come from ``label_map`` (absent names stay unlabelled but still show in the image)."""
    shape = frame.grid.shape
    labels = np.zeros(shape, dtype=np.uint8)
    fractions = {False: np.zeros(shape, dtype=np.float32), True: np.zeros(shape, dtype=np.float32)}
    size = np.asarray(frame.grid.size)
    for vessel in reversed(patient.vessels):
        vertices = np.rint(frame.to_voxel(np.asarray(vessel.path)))
        lo = np.maximum(np.floor(vertices.min(axis=0) - vessel.radius - 1), 0).astype(int)
        hi = np.minimum(np.ceil(vertices.max(axis=0) + vessel.radius + 2), size).astype(int)
        if np.any(hi <= lo):
            continue  # outside this field of view
        box = tuple(slice(int(a), int(b)) for a, b in zip(lo[::-1], hi[::-1], strict=True))
        distance = _distance_to_polyline(vertices, lo, hi, frame.voxel_scale)
        label = label_map.get(vessel.name, 0)
        if label:
            labels[box][distance <= vessel.radius] = label
        # voxels whose centre is within the radius are at least half inside: fraction = radius + 0.5 - distance
        inside = np.clip(vessel.radius + 0.5 - distance, 0.0, 1.0).astype(np.float32)
        np.maximum(fractions[vessel.vein][box], inside, out=fractions[vessel.vein][box])
    return Rendering(labels=labels, artery=fractions[False], vein=fractions[True])


def _distance_to_polyline(vertices: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                          scale: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """Distance (in-plane voxels) from each voxel centre of the box [lo, hi) (x, y, z) to the polyline, as a
    (z, y, x) array; ``scale`` stretches the axes of anisotropic voxels."""
    x = np.arange(lo[0], hi[0], dtype=np.float32)[None, None, :]
    y = np.arange(lo[1], hi[1], dtype=np.float32)[None, :, None]
    z = np.arange(lo[2], hi[2], dtype=np.float32)[:, None, None]
    if scale != (1.0, 1.0, 1.0):
        factors = np.asarray(scale, dtype=np.float32)
        x, y, z = x * factors[0], y * factors[1], z * factors[2]
        vertices = vertices * factors
    best = np.full((hi[2] - lo[2], hi[1] - lo[1], hi[0] - lo[0]), np.inf, dtype=np.float32)
    for a, b in itertools.pairwise(vertices):
        ab = b - a
        length2 = max(float(ab @ ab), 1e-12)
        t = np.clip(((x - a[0]) * ab[0] + (y - a[1]) * ab[1] + (z - a[2]) * ab[2]) / length2, 0.0, 1.0)
        d2 = (x - a[0] - t * ab[0]) ** 2 + (y - a[1] - t * ab[1]) ** 2 + (z - a[2] - t * ab[2]) ** 2
        np.minimum(best, d2, out=best)
    return np.sqrt(best)


def thicken_vanishing_labels(labels: np.ndarray, attempts: int = 3) -> None:
    """Grow each label whose skeleton is empty by one voxel (6-neighbourhood) into the background, in place, until
    it has a skeleton (at most ``attempts`` times).

    Lee thinning, which per-class clDice uses, deletes some small shapes entirely (rods two voxels thick, short
    stubs); such a label would score clDice 0 even against an identical prediction.
    """
    for index, box in enumerate(ndimage.find_objects(labels)):
        if box is None:
            continue
        padded = tuple(slice(max(0, s.start - attempts), s.stop + attempts) for s in box)
        region = labels[padded]
        mask = region == index + 1
        for _ in range(attempts):
            if skeleton(mask).any():
                break
            mask = ndimage.binary_dilation(mask) & ((region == 0) | mask)
            region[mask] = index + 1

# ---- images ----------------------------------------------------------------------------------------------------
AIR, SCALP, SKULL, BRAIN = range(4)
_HEAD_CENTRE = (0.5, 0.5, 0.45)
_HEAD_RADII = (0.48, 0.49, 0.62)


@dataclass(frozen=True)
class Contrast:
    """Intensities of one modality: tissue means, vessel brightness range, noise and bias."""

    tissue: Mapping[int, float]
    artery: tuple[float, float]  # drawn per case
    vein_ratio: tuple[float, float] | None  # vein brightness relative to arteries; None: veins are not seen
    noise_sd: tuple[float, float]
    bias: float
    magnitude: bool  # MR magnitude images: Rician noise, non-negative


CT_ANGIOGRAPHY = Contrast(tissue={AIR: -1000.0, SCALP: 20.0, SKULL: 1100.0, BRAIN: 35.0}, artery=(280.0, 420.0),
                          vein_ratio=(0.75, 0.9), noise_sd=(8.0, 16.0), bias=0.0, magnitude=False)
# time-of-flight MRA: inflowing arterial blood is bright, veins and bone are dark
TOF_MR_ANGIOGRAPHY = Contrast(tissue={AIR: 0.0, SCALP: 260.0, SKULL: 30.0, BRAIN: 170.0}, artery=(520.0, 760.0),
                              vein_ratio=None, noise_sd=(8.0, 16.0), bias=0.15, magnitude=True)


def head_tissues(frame: Frame) -> np.ndarray:
    """Tissue map of an ellipsoidal head: brain inside a skull shell inside a thin scalp, air around it."""
    x, y, z = frame.head_coords()
    q = np.sqrt(sum(((c - m) / r) ** 2 for c, m, r in zip((x, y, z), _HEAD_CENTRE, _HEAD_RADII, strict=True)))
    tissue = np.full(frame.grid.shape, AIR, dtype=np.uint8)
    tissue[q <= 1.03] = SCALP
    tissue[q <= 0.99] = SKULL
    tissue[q <= 0.92] = BRAIN
    return tissue


def synthesize_image(rendering: Rendering, frame: Frame, contrast: Contrast, rng: np.random.Generator) -> np.ndarray:
    """An int16 angiogram: head tissues with texture and bias, vessels blended in by partial volume, then noise."""
    base = render(head_tissues(frame), contrast.tissue, rng, noise_sd=0.0, texture=0.05, bias=contrast.bias,
                  background=None)
    artery_value = rng.uniform(*contrast.artery)
    fraction, vessel_value = rendering.artery, np.float32(artery_value)
    if contrast.vein_ratio is not None:
        vein_wins = rendering.vein > rendering.artery
        fraction = np.where(vein_wins, rendering.vein, fraction)
        vessel_value = np.where(vein_wins, np.float32(artery_value * rng.uniform(*contrast.vein_ratio)), vessel_value)
    image = base.astype(np.float32) * (1.0 - fraction) + vessel_value * fraction
    sd = np.float32(rng.uniform(*contrast.noise_sd))
    noise = sd * rng.standard_normal(image.shape, dtype=np.float32)
    if contrast.magnitude:
        image = np.hypot(image + noise, sd * rng.standard_normal(image.shape, dtype=np.float32))
    else:
        image += noise
    return to_int16(image)


# ---- CoW region of interest and edge lists -----------------------------------------------------------------------
def roi_box(patient: Patient, frame: Frame, rng: np.random.Generator) -> VoxelBox:
    """The CoW ROI of one scan: the box around the CoW landmarks with a margin of 2-4 voxels per face (as an
    annotator would draw it), clipped to the image."""
    vertices = frame.to_voxel(np.asarray([patient.landmarks[name] for name in _ROI_LANDMARKS]))
    lo = np.floor(vertices.min(axis=0)).astype(int) - rng.integers(2, 5, 3)
    hi = np.ceil(vertices.max(axis=0)).astype(int) + rng.integers(2, 5, 3)
    lo = np.maximum(lo, 0)
    hi = np.minimum(hi, np.asarray(frame.grid.size) - 1)
    return VoxelBox(location=tuple(int(v) for v in lo), size=tuple(int(v) for v in hi - lo + 1))


def roi_text(box: VoxelBox, *, final_newline: bool) -> str:
    """The release's ROI file format: a header line, the sizes, then the minimum corner, in voxels (x y z)."""
    text = ("--- ROI Meta Data ---\n"
            f"Size (Voxels): {' '.join(map(str, box.size))}\n"
            f"Location (Voxels): {' '.join(map(str, box.location))}")
    return text + "\n" if final_newline else text


def edges_yaml(edges: Mapping[str, Mapping[str, int]], key_order: Mapping[str, Sequence[str]]) -> str:
    """The release's edge-list YAML (section lines, then four-space indented ``key: value`` lines); the key order
    within a section varies between real files, so it is a parameter."""
    lines = []
    for region, keys in key_order.items():
        lines.append(f"{region}:")
        lines += [f"    {key + ':':<9}{edges[region][key]}" for key in keys]
    return "\n".join(lines) + "\n"


def shuffled_edge_keys(rng: np.random.Generator) -> dict[str, tuple[str, ...]]:
    return {region: tuple(str(k) for k in rng.permutation(list(keys))) for region, keys in EDGE_KEYS.items()}


# ---- preparation shared by both families ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Annotation:
    """One kind of per-case annotation file of a release: where prepared copies go and their suffix."""

    kind: str  # "label", "roi", "edges"
    folder: str  # folder name under train/ (public) and private/
    suffix: str
    answer_column: str  # the grader's answers.csv column when it is a test answer


LABEL = Annotation("label", "labels", ".nii.gz", "label_path")
ROI = Annotation("roi", "roi", ".txt", "roi_path")
EDGES = Annotation("edges", "edges", ".yml", "edges_path")


@dataclass(frozen=True)
class ReleaseCase:
    """One annotated case of a release: its image and whichever annotation files exist for it."""

    image: Path
    annotations: Mapping[str, Path]  # Annotation.kind -> file


def find_release_root(raw: Path, top: str, required: Sequence[str]) -> Path:
    """The folder holding the release's ``required`` sub-folders: ``raw/<top>`` as the zip unpacks, ``raw`` itself
    when the top folder's content was moved up (the original release does that), or ``raw/<top>/<top>`` when the
    zip was unpacked into a folder named after it."""
    candidates = (raw / top, raw, raw / top / top)
    for folder in candidates:
        if all((folder / sub).is_dir() for sub in required):
            return folder
    tried = ", ".join(str(c) for c in candidates)
    raise TaskDataMissingError(f"cannot find the release folders {list(required)} (looked in {tried})",
                               hint="the download looks incomplete or unpacked elsewhere; re-run with --force")


def publish(ctx: PrepareContext, cases: Mapping[str, ReleaseCase], answers: Sequence[Annotation]) -> TestManifest:
    """Write the prepared layout shared by the TopCoW and TopBrain tasks.

    public/: ``train/images/<id>_0000.nii.gz`` with every annotation the release has for each training case
    (``train/labels/<id>.nii.gz``, ``train/roi/<id>.txt``, ``train/edges/<id>.yml``), and
    ``test/images/<id>_0000.nii.gz``. private/: the test cases' ``answers`` annotations under the same folder names
    and ``answers.csv``. Files are copied byte for byte.
    """
    for case_id in ctx.split.train:
        case = cases[case_id]
        copy_file(case.image, ctx.public / "train" / "images" / f"{case_id}{IMAGE_SUFFIX}")
        for annotation in (LABEL, ROI, EDGES):
            source = case.annotations.get(annotation.kind)
            if source is not None:
                copy_file(source, ctx.public / "train" / annotation.folder / f"{case_id}{annotation.suffix}")
    rows = []
    geometry: dict[str, Geometry] = {}
    for case_id in ctx.split.test:
        case = cases[case_id]
        image = copy_file(case.image, ctx.public / "test" / "images" / f"{case_id}{IMAGE_SUFFIX}")
        geometry[case_id] = image_geometry(image)
        row = [case_id]
        for annotation in answers:  # the families list only cases that have their task's answers
            relative = f"{annotation.folder}/{case_id}{annotation.suffix}"
            copy_file(case.annotations[annotation.kind], ctx.private / relative)
            row.append(relative)
        rows.append(row)
    write_csv(ctx.private / ANSWERS_CSV, [ID_COLUMN, *(a.answer_column for a in answers)], rows)
    return TestManifest(ids=tuple(ctx.split.test), geometry=geometry)


def patient_number(case_id: str) -> str:
    """``topcow_ct_001`` -> ``001``: CT and MR scans with one number belong to one patient."""
    return case_id.rsplit("_", 1)[-1]


class VesselReleaseFamily(TaskFamily):
    """Base of the TopCoW and TopBrain families: one release zip of numbered patients, mirrored synthetically, whose
    cases are split by patient so that a patient's CT and MR scans never straddle train and test."""

    competition: ClassVar[str]  # as messages name it
    archive: ClassVar[str]
    patient_ids: ClassVar[tuple[str, ...]]
    patients_counted_as: ClassVar[str]  # how the release counts its patients, for the --cases message
    #: (folder, *, patients, seed, realistic): the synthetic release tree
    release_writer: ClassVar[Callable[..., None]]
    synthetic_difficulties = ("easy", "realistic")

    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        count = len(self.patient_ids)
        if not 1 <= cases <= count:
            raise UserInputError(f"{self.competition} has {count} {self.patients_counted_as}; cannot mirror {cases}",
                                 hint=f"choose --cases between 1 and {count}")
        write_archive(downloads / self.archive,
                      partial(self.release_writer, patients=self.patient_ids[:cases], seed=seed,
                              realistic=difficulty == "realistic"))

    def case_ids(self, raw: Path) -> list[str]:
        return sorted(self.release_cases(raw))

    def split_group(self, case_id: str) -> str:
        return patient_number(case_id)

    @abstractmethod
    def release_cases(self, raw: Path) -> dict[str, ReleaseCase]:
        """The task's cases in the unpacked release under ``raw``, by case id."""


def rng_for(seed: int, *keys: int) -> np.random.Generator:
    """A generator that depends only on the seed and the keys (family, patient, modality), never on how many cases
    are written, so the first N synthetic cases are the same whatever N is."""
    return np.random.default_rng([seed, *keys])



# ---- the realistic mirror -------------------------------------------------------------------------------------------
# What makes real TopCoW/TopBrain scans hard for a threshold and an atlas (EXPERT_REPORTS.md §1-2, DATA_LAYOUTS.md §1):
#
# * anatomy: CoW variants are common (missing or hypoplastic communicating arteries, missing A1/P1, a third A2), and
#   the communicating arteries are often hypoplastic, a voxel or less across, so partial volume dims them; calibres
#   and tortuosity differ between patients;
# * pose and field of view: heads are tilted (pitch up to about 12 degrees, roll and yaw up to about 7), scanners
#   centre and zoom the field of view differently, so the CoW sits at a different place of each image, and slices are
#   thicker than the in-plane spacing (anisotropic voxels; TopCoW's one measured grid is 508 x 585 x 189);
# * CTA: contrast timing differs by site (arteries 220-520 HU), venous filling (veins up to as bright as arteries),
#   dense skull-base bone right beside the CoW (anterior clinoid processes beside the carotid terminus, dorsum sellae
#   and clivus behind the basilar tip, petrous bone around the carotid canal) whose partial-volume rims (the
#   point-spread function blurs every edge) take arterial values, and noise that differs between scanners;
# * TOF-MRA: the unnormalised scale differs between sites by a factor of about 2, a strong coil bias field, bright
#   orbital and scalp fat (short T1), imperfect venous saturation, and distal arteries losing signal as inflowing
#   spins saturate (fainter with height above the circle).
#
# Sizes stay close to the easy mirror's (about 52-72 voxels a side) so that a small 3-D network learns the mirror in
# CPU minutes; labels, file names and formats are those of the easy mirror.
BONE, FAT = 4, 5  # tissue codes beside AIR, SCALP, SKULL, BRAIN
# skull-base bone near the circle, in anatomical head coordinates: (centre, radii), right side mirrored for the left
_SKULL_BASE_SIDED = (((0.395, 0.375, 0.345), (0.022, 0.03, 0.018)),  # anterior clinoid process
                     ((0.33, 0.44, 0.16), (0.07, 0.05, 0.035)),  # petrous apex around the carotid canal
                     ((0.30, 0.12, 0.33), (0.05, 0.04, 0.03)))  # orbital roof
_SKULL_BASE_MIDLINE = (((0.5, 0.565, 0.335), (0.03, 0.012, 0.035)),  # dorsum sellae
                       ((0.5, 0.64, 0.19), (0.025, 0.03, 0.11)))  # clivus
_ORBITS = (((0.32, 0.10, 0.28), (0.06, 0.05, 0.045)),)  # orbital fat, bright on TOF-MRA


@dataclass(frozen=True)
class HeadPose:
    """How a head lies in one scanner: a rotation about the head centre, then a shift (head coordinates)."""

    rotation: np.ndarray  # (3, 3), applied to (x, y, z) column vectors
    shift: np.ndarray  # (3,)

    @classmethod
    def sample(cls, rng: np.random.Generator) -> HeadPose:
        pitch, roll, yaw = np.radians(rng.uniform(-1, 1, 3) * (12.0, 6.0, 7.0))
        about_x = np.array([[1, 0, 0], [0, np.cos(pitch), -np.sin(pitch)], [0, np.sin(pitch), np.cos(pitch)]])
        about_y = np.array([[np.cos(roll), 0, np.sin(roll)], [0, 1, 0], [-np.sin(roll), 0, np.cos(roll)]])
        about_z = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]])
        return cls(rotation=about_z @ about_y @ about_x, shift=rng.uniform(-0.03, 0.03, 3))

    def apply(self, points: np.ndarray) -> np.ndarray:
        """Anatomical head coordinates (n, 3) -> where the scanner sees them."""
        centre = np.asarray(_HEAD_CENTRE)
        return (np.asarray(points, dtype=float) - centre) @ self.rotation.T + centre + self.shift

    def anatomical(self, frame: Frame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Anatomical head coordinates of every voxel centre of ``frame``, as three full (z, y, x) arrays."""
        x, y, z = np.broadcast_arrays(*frame.head_coords())
        seen = np.stack([x, y, z], axis=-1) - np.asarray(_HEAD_CENTRE) - self.shift
        anatomy = seen @ self.rotation + np.asarray(_HEAD_CENTRE)  # the inverse rotation is the transpose
        return anatomy[..., 0], anatomy[..., 1], anatomy[..., 2]

    def seen(self, patient: Patient) -> Patient:
        """The patient as this scanner sees it (vessels and landmarks moved)."""
        def move(path: Sequence[Point]) -> tuple[Point, ...]:
            return tuple((float(a), float(b), float(c)) for a, b, c in self.apply(np.asarray(path)))

        vessels = tuple(Vessel(v.name, move(v.path), v.radius, v.vein) for v in patient.vessels)
        names = list(patient.landmarks)
        moved = move([patient.landmarks[n] for n in names])
        return Patient(variant=patient.variant, vessels=vessels, landmarks=dict(zip(names, moved, strict=True)))


def sample_realistic_variant(rng: np.random.Generator) -> CowVariant:
    """CoW variants at about the rates angiography series report (Acom absent or unseen in about a quarter of
    scans, one or both Pcoms absent in most, a missing A1 in about one in eight, a fetal PCA in about one in five
    sides with a Pcom, a third A2 in about one in ten)."""
    acom = bool(rng.random() < 0.75)
    third_a2 = acom and bool(rng.random() < 0.1)
    missing_a1 = int(rng.integers(2)) if acom and rng.random() < 0.13 else None
    pcom = (bool(rng.random() < 0.55), bool(rng.random() < 0.55))
    p1 = (not (pcom[0] and rng.random() < 0.2), not (pcom[1] and rng.random() < 0.2))
    return CowVariant(acom=acom, third_a2=third_a2, a1=(missing_a1 != 0, missing_a1 != 1), p1=p1, pcom=pcom)


HYPOPLASTIC = ("Acom", "R-Pcom", "L-Pcom")  # the segments that are often thread-like


def make_realistic_patient(rng: np.random.Generator) -> Patient:
    """A patient of the realistic mirror: variants at realistic rates, hypoplastic communicating arteries (radius
    0.6-0.8 voxel: the centreline voxels only, dim by partial volume), wider calibre and shape differences: every
    branch point and bend moves on its own by about 0.02 head units (1.6 voxels, clipped at twice that), some 8 %
    of the circle's width, as segment lengths and branching positions differ between real patients by several
    millimetres of a circle 40-50 mm wide (the easy mirror's 0.004 left every patient the atlas's copy)."""
    variant = sample_realistic_variant(rng)
    points = _jittered_points(rng, scale_range=0.12, shift_range=0.02, jitter_sd=0.02)
    calibre = rng.uniform(0.88, 1.12)
    absent = _absent_vessels(rng, variant, 0.12)
    thin = {name for name in HYPOPLASTIC if rng.random() < 0.35}
    per_vessel = {template.name.replace("{s}", side): float(rng.uniform(0.9, 1.1))
                  for template in _TEMPLATES for side in SIDES}

    def radius_of(name: str, radius: float) -> float:
        if name in thin:
            return float(rng.uniform(0.6, 0.8))
        return max(0.9, radius * calibre * per_vessel.get(name, 1.0))

    return _assemble(variant, points, absent, radius_of)


@dataclass(frozen=True)
class RealisticFrames:
    """How the scanners of one modality frame the head in the realistic mirror: the easy mirror's window, moved by
    up to ``window_shift`` and zoomed by ``zoom`` per case, on grids of ``size_lo``-``size_hi`` voxels whose slices
    are ``slice_ratio`` times the in-plane spacing."""

    base: FrameSpec
    window_shift: float
    zoom: tuple[float, float]
    slice_ratio: tuple[float, float]

    def sample(self, rng: np.random.Generator) -> Frame:
        lo, hi = np.asarray(self.base.fov_lo), np.asarray(self.base.fov_hi)
        centre = (lo + hi) / 2 + rng.uniform(-self.window_shift, self.window_shift, 3)
        zoom = float(rng.uniform(*self.zoom))
        ratio = float(rng.uniform(*self.slice_ratio))
        nx = int(rng.integers(self.base.size_lo[0], self.base.size_hi[0] + 1))
        ny = int(rng.integers(self.base.size_lo[1], self.base.size_hi[1] + 1))
        # The spacing is what the field of view and the voxel count make it, as in a real scanner: one head unit is
        # always the same number of millimetres, so a zoomed-in scan has finer voxels and resampling every scan to
        # one spacing gives every head one scale. x and y share the in-plane step; slices are ``ratio`` steps apart,
        # so a thick-slice scan covers the window's height with fewer slices.
        step = (hi[0] - lo[0]) * zoom / (nx - 1)
        nz = max(24, round((hi[2] - lo[2]) * zoom / (step * ratio)) + 1)
        size = (nx, ny, nz)
        extent = np.array([nx - 1, ny - 1, (nz - 1) * ratio]) * step
        fov_lo, fov_hi = centre - extent / 2, centre + extent / 2
        inplane = round(step * self.mm_per_head_unit, 6)
        spacing = (inplane, inplane, round(step * ratio * self.mm_per_head_unit, 6))
        origin = tuple(round(-(n - 1) * s / 2 + float(rng.uniform(-15, 15)), 3)
                       for n, s in zip(size, spacing, strict=True))
        grid = Grid(size=size, spacing=spacing, origin=origin)  # type: ignore[arg-type]
        return Frame(grid=grid, fov_lo=tuple(float(v) for v in fov_lo),  # type: ignore[arg-type]
                     fov_hi=tuple(float(v) for v in fov_hi),  # type: ignore[arg-type]
                     voxel_scale=(1.0, 1.0, ratio))

    @property
    def mm_per_head_unit(self) -> float:
        """Millimetres per head-coordinate unit: the scanner kind's middle in-plane spacing at its middle field of
        view and voxel count (the heads are scaled down with the grids, so this is not a real head's size)."""
        voxels = (self.base.size_lo[0] + self.base.size_hi[0]) / 2
        nominal_step = (self.base.fov_hi[0] - self.base.fov_lo[0]) / (voxels - 1)
        return float(np.mean(self.base.inplane_mm)) / nominal_step


def _ellipsoid(ax: np.ndarray, ay: np.ndarray, az: np.ndarray, centre: Point, radii: Point) -> np.ndarray:
    return ((ax - centre[0]) / radii[0]) ** 2 + ((ay - centre[1]) / radii[1]) ** 2 + \
        ((az - centre[2]) / radii[2]) ** 2 <= 1.0


def realistic_tissues(frame: Frame, pose: HeadPose) -> tuple[np.ndarray, np.ndarray]:
    """Tissue map of the posed head (the easy mirror's shells plus skull-base bone and orbital fat) and the
    anatomical height of every voxel (for TOF saturation)."""
    ax, ay, az = pose.anatomical(frame)
    q = np.sqrt(sum(((c - m) / r) ** 2 for c, m, r in zip((ax, ay, az), _HEAD_CENTRE, _HEAD_RADII, strict=True)))
    tissue = np.full(frame.grid.shape, AIR, dtype=np.uint8)
    tissue[q <= 1.03] = SCALP
    tissue[q <= 0.99] = SKULL
    tissue[q <= 0.92] = BRAIN
    for (x, y, z), radii in _SKULL_BASE_SIDED:
        for cx in (x, 1.0 - x):
            tissue[_ellipsoid(ax, ay, az, (cx, y, z), radii)] = BONE
    for centre, radii in _SKULL_BASE_MIDLINE:
        tissue[_ellipsoid(ax, ay, az, centre, radii)] = BONE
    for (x, y, z), radii in _ORBITS:
        for cx in (x, 1.0 - x):
            tissue[_ellipsoid(ax, ay, az, (cx, y, z), radii) & (tissue != BONE)] = FAT
    return tissue, az


def realistic_angiogram(rendering: Rendering, frame: Frame, pose: HeadPose, modality: str,
                        rng: np.random.Generator) -> np.ndarray:
    """An int16 CTA (``ct``, Hounsfield units) or TOF-MRA (``mr``) of the realistic mirror (see the section's
    comment for the confounders)."""
    tissue, height = realistic_tissues(frame, pose)
    if modality == "ct":
        artery = rng.uniform(220.0, 520.0)
        lut = {AIR: -1000.0, SCALP: 20.0, SKULL: rng.uniform(900.0, 1400.0), BRAIN: rng.uniform(28.0, 45.0),
               BONE: rng.uniform(650.0, 1300.0), FAT: -90.0}
        vein = artery * rng.uniform(0.55, 1.0)
        noise_sd, bias, texture = rng.uniform(8.0, 28.0), 0.0, 0.08
    else:
        scale = rng.uniform(0.6, 1.6)
        lut = {AIR: 0.0, SCALP: 300.0 * scale * rng.uniform(0.8, 1.3), SKULL: 30.0 * scale, BRAIN: 170.0 * scale,
               BONE: 25.0 * scale, FAT: 170.0 * scale * rng.uniform(1.6, 2.4)}
        artery = 170.0 * scale * rng.uniform(2.6, 4.4)
        vein = artery * rng.uniform(0.0, 0.3)  # imperfect venous saturation
        noise_sd, bias, texture = 170.0 * scale * rng.uniform(0.04, 0.09), 0.35, 0.08
    base = render(tissue, lut, rng, noise_sd=0.0, texture=texture, bias=bias, background=None).astype(np.float32)
    # the scanner's point-spread function: bone and skull edges pass through the arteries' values
    base = ndimage.gaussian_filter(base, 0.8)
    arterial = np.full(tissue.shape, artery, dtype=np.float32)
    if modality == "mr":
        # inflowing spins saturate: arteries fade with height above the circle of Willis
        fade = rng.uniform(0.25, 0.55)
        arterial *= (1.0 - fade * np.clip((height - 0.42) / 0.45, 0.0, 1.0)).astype(np.float32)
    vein_wins = rendering.vein > rendering.artery
    fraction = np.where(vein_wins, rendering.vein, rendering.artery)
    vessel = np.where(vein_wins, np.float32(vein), arterial)
    image = base * (1.0 - fraction) + vessel * fraction
    sd = np.float32(noise_sd)
    noise = sd * rng.standard_normal(image.shape, dtype=np.float32)
    if modality == "mr":
        image = np.hypot(image + noise, sd * rng.standard_normal(image.shape, dtype=np.float32))
    else:
        image += noise
    return to_int16(image)
