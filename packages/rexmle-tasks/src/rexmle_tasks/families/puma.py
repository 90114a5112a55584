"""PUMA 2024 (melanoma H&E ROIs): tissue segmentation and nuclei detection, tracks 1 and 2.

Download (Zenodo 14869398, shared by the four tasks in ``puma-shared/raw``): three zips, each unpacking to a folder
of its own name (DATA_LAYOUTS.md §4)::

    01_training_dataset_tif_ROIs/training_set_{primary,metastatic}_roi_NNN.tif      RGBA 1024x1024 (one is .tiff)
    01_training_dataset_geojson_tissue/training_set_…_roi_NNN_tissue.geojson
    01_training_dataset_geojson_nuclei/training_set_…_roi_NNN_nuclei.geojson

The ROIs are found wherever they lie under ``raw/`` (an older version of the ROI zip had no top folder, and the
GeoJSON files are sometimes kept loose). Case id = ROI file stem.

Ground truth conversions (ours: the organisers' converted files are not public; metrics/cellseg_puma.md):

* tissue: each feature's ``classification.name`` (``tissue_*``) maps to 0..5; polygons are filled in file order
  with their holes left out and every MultiPolygon part included; a pixel is inside when its centre
  (col + 0.5, row + 0.5) is. Unannotated pixels are 0 (white background). Written as a uint8 TIFF class map.
* nuclei: every feature becomes one polygon of the Grand Challenge "Multiple polygons" JSON, its exterior ring
  without the repeated closing vertex, ``z`` = 0.5; of a MultiPolygon only the largest part is kept (one nucleus,
  one polygon). Track 2 keeps the ten ``nuclei_*`` names; track 1 groups lymphocytes and plasma cells into
  ``nuclei_lymphocyte``, keeps ``nuclei_tumor`` and calls every other class ``nuclei_other``.

Options (task.yaml): ``target`` = ``tissue`` or ``nuclei``; for nuclei ``classes`` = 3 (track 1) or 10 (track 2).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import tifffile
from scipy import ndimage
from skimage.draw import polygon as polygon_pixels

from rexmle_grade.errors import ConfigurationError, TaskDataMissingError
from rexmle_grade.grader import TestManifest
from rexmle_grade.io import Geometry
from rexmle_tasks.base import PrepareContext, TaskFamily, register_family
from rexmle_tasks.families.synth2d import (
    blob_outline,
    copy_file,
    encode_image,
    find_in_raw,
    image_size,
    to_uint8,
    write_csv,
    write_zip,
)

log = logging.getLogger(__name__)

ROI_FOLDER = "01_training_dataset_tif_ROIs"
TISSUE_FOLDER = "01_training_dataset_geojson_tissue"
NUCLEI_FOLDER = "01_training_dataset_geojson_nuclei"
ROI_NAME = re.compile(r"^(training_set_(?:primary|metastatic)_roi_\d+)\.tiff?$", re.IGNORECASE)

#: index = class id of the tissue class map
TISSUE_CLASSES = ("tissue_white_background", "tissue_stroma", "tissue_blood_vessel", "tissue_tumor",
                  "tissue_epidermis", "tissue_necrosis")
NUCLEI_CLASSES = ("nuclei_tumor", "nuclei_lymphocyte", "nuclei_plasma_cell", "nuclei_histiocyte",
                  "nuclei_melanophage", "nuclei_neutrophil", "nuclei_stroma", "nuclei_epithelium",
                  "nuclei_endothelium", "nuclei_apoptosis")
TRACK1_GROUPS = {"nuclei_tumor": "nuclei_tumor", "nuclei_lymphocyte": "nuclei_lymphocyte",
                 "nuclei_plasma_cell": "nuclei_lymphocyte"}  # every other nuclei class -> nuclei_other
PATH_POINT_Z = 0.5

Ring = list[tuple[float, float]]  # (x, y) vertices in ROI pixel coordinates
Polygon = list[Ring]  # exterior ring first, then holes


@dataclass(frozen=True)
class Annotation:
    name: str
    polygons: tuple[Polygon, ...]  # one for a Polygon, several for a MultiPolygon


# ---- reading the real files ------------------------------------------------------------------------------------
def find_rois(raw: Path) -> dict[str, Path]:
    """{ROI stem: image path} for every ``training_set_*_roi_NNN.tif[f]`` under ``raw`` (outside downloads/)."""
    return _unique_files(raw, ROI_NAME, "ROI image")


def find_annotations(raw: Path, kind: str) -> dict[str, Path]:
    """{ROI stem: GeoJSON path} for ``<stem>_<kind>.geojson`` files under ``raw``."""
    pattern = re.compile(rf"^(training_set_(?:primary|metastatic)_roi_\d+)_{kind}\.geojson$", re.IGNORECASE)
    return _unique_files(raw, pattern, f"{kind} GeoJSON")


def _unique_files(raw: Path, pattern: re.Pattern[str], what: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in find_in_raw(raw, "*"):
        match = pattern.match(path.name)
        if not match or not path.is_file():
            continue
        stem = match.group(1)
        if stem in found:
            raise TaskDataMissingError(
                f"two {what} files for {stem!r}: {found[stem]} and {path}",
                hint=f"keep one of them (the archives were probably extracted twice) or delete {raw} and prepare "
                     "again with --force",
            )
        found[stem] = path
    return found


def read_annotations(path: Path, known: Sequence[str]) -> list[Annotation]:
    """The Polygon/MultiPolygon features of a PUMA GeoJSON file, in file order."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TaskDataMissingError(f"cannot read {path}: {exc}", hint="re-extract the GeoJSON archive") from None
    features = doc.get("features") if isinstance(doc, dict) else doc
    if not isinstance(features, list):
        raise TaskDataMissingError(f"{path} is not a GeoJSON FeatureCollection (no 'features' list)")
    annotations = []
    for number, feature in enumerate(features):
        try:
            name = feature["properties"]["classification"]["name"]
            geometry = feature["geometry"]
            kind, coordinates = geometry["type"], geometry["coordinates"]
        except (KeyError, TypeError):
            raise TaskDataMissingError(
                f"feature {number} of {path} lacks geometry.type/coordinates or properties.classification.name"
            ) from None
        if name not in known:
            raise TaskDataMissingError(f"feature {number} of {path} has class {name!r}; expected one of {list(known)}")
        if kind == "Polygon":
            polygons = (_polygon(coordinates),)
        elif kind == "MultiPolygon":
            polygons = tuple(_polygon(part) for part in coordinates)
        else:
            log.warning("skipping feature %d of %s: geometry %s has no area", number, path, kind)
            continue
        annotations.append(Annotation(name=name, polygons=polygons))
    return annotations


def _polygon(rings: list[list[list[float]]]) -> Polygon:
    return [[(float(p[0]), float(p[1])) for p in ring] for ring in rings]


# ---- ground-truth conversions ----------------------------------------------------------------------------------
def ring_mask(ring: Ring, shape: tuple[int, int]) -> np.ndarray:
    """Pixels whose centre (col + 0.5, row + 0.5) lies inside the ring."""
    mask = np.zeros(shape, dtype=bool)
    if len(ring) < 3:
        return mask
    xy = np.asarray(ring, dtype=float)
    rows, cols = polygon_pixels(xy[:, 1] - 0.5, xy[:, 0] - 0.5, shape=shape)
    mask[rows, cols] = True
    return mask


def polygon_mask(polygon: Polygon, shape: tuple[int, int]) -> np.ndarray:
    """The exterior ring's pixels minus those of its holes."""
    mask = ring_mask(polygon[0], shape)
    for hole in polygon[1:]:
        mask &= ~ring_mask(hole, shape)
    return mask


def rasterise_tissue(annotations: Sequence[Annotation], shape: tuple[int, int]) -> np.ndarray:
    """uint8 class map (0..5, see TISSUE_CLASSES); features painted in file order, later ones on top."""
    class_map = np.zeros(shape, dtype=np.uint8)
    for annotation in annotations:
        value = TISSUE_CLASSES.index(annotation.name)
        for polygon in annotation.polygons:
            class_map[polygon_mask(polygon, shape)] = value
    return class_map


def _ring_area(ring: Ring) -> float:
    xy = np.asarray(ring, dtype=float)
    return 0.5 * abs(float(np.dot(xy[:, 0], np.roll(xy[:, 1], -1)) - np.dot(xy[:, 1], np.roll(xy[:, 0], -1))))


def nuclei_document(annotations: Sequence[Annotation], classes: int) -> dict[str, Any]:
    """The "Multiple polygons" JSON of one ROI (see module docstring for the conversion rules)."""
    polygons = []
    for annotation in annotations:
        ring = max((polygon[0] for polygon in annotation.polygons), key=_ring_area)
        if len(ring) > 1 and ring[0] == ring[-1]:
            ring = ring[:-1]
        polygons.append({"name": nuclei_class_name(annotation.name, classes),
                         "path_points": [[x, y, PATH_POINT_Z] for x, y in ring]})
    return {"type": "Multiple polygons", "polygons": polygons, "version": {"major": 1, "minor": 0}}


def nuclei_class_name(name: str, classes: int) -> str:
    return name if classes == 10 else TRACK1_GROUPS.get(name, "nuclei_other")


# ---- the family ------------------------------------------------------------------------------------------------
@register_family
class PumaFamily(TaskFamily):
    name: ClassVar[str] = "puma"

    @property
    def target(self) -> str:
        target = self.options.get("target")
        if target not in ("tissue", "nuclei"):
            raise ConfigurationError(f"task {self.meta.id}: options.target is {target!r}; expected tissue or nuclei")
        return target

    @property
    def nuclei_classes(self) -> int:
        classes = self.options.get("classes")
        if classes not in (3, 10):
            raise ConfigurationError(f"task {self.meta.id}: options.classes is {classes!r}; expected 3 or 10")
        return classes

    def case_ids(self, raw: Path) -> list[str]:
        rois = find_rois(raw)
        labelled = find_annotations(raw, self.target)
        missing = sorted(set(rois) - set(labelled))
        if missing:
            log.warning("%d ROI(s) have no %s annotations and are left out: %s", len(missing), self.target,
                        ", ".join(missing[:5]))
        return sorted(set(rois) & set(labelled))

    def prepare(self, ctx: PrepareContext) -> TestManifest:
        rois = find_rois(ctx.raw)
        geojson = {kind: find_annotations(ctx.raw, kind) for kind in ("tissue", "nuclei")}
        for case_id in ctx.split.train:
            copy_file(rois[case_id], ctx.public / "train" / "images" / f"{case_id}.tif")
            for kind, files in geojson.items():
                if case_id in files:
                    copy_file(files[case_id], ctx.public / "train" / "geojson" / f"{case_id}_{kind}.geojson")
            self._write_target(rois[case_id], geojson[self.target][case_id], ctx.public / "train", case_id)
        answers = []
        geometry = {}
        for case_id in ctx.split.test:
            copy_file(rois[case_id], ctx.public / "test" / "images" / f"{case_id}.tif")
            relative = self._write_target(rois[case_id], geojson[self.target][case_id], ctx.private, case_id)
            answers.append((case_id, relative))
            geometry[case_id] = Geometry(size=image_size(rois[case_id]))
        answer_column = "label_path" if self.target == "tissue" else "nuclei_path"
        write_csv(ctx.private / "answers.csv", ["case_id", answer_column], answers)
        return TestManifest(ids=tuple(ctx.split.test), geometry=geometry)

    def _write_target(self, roi: Path, annotation_file: Path, root: Path, case_id: str) -> str:
        """Write one ROI's converted ground truth under ``root``; returns its path relative to ``root``."""
        if self.target == "tissue":
            width, height = image_size(roi)
            class_map = rasterise_tissue(read_annotations(annotation_file, TISSUE_CLASSES), (height, width))
            relative = f"labels/{case_id}.tif"
            (root / "labels").mkdir(parents=True, exist_ok=True)
            tifffile.imwrite(root / relative, class_map, photometric="minisblack", compression="zlib",
                             metadata=None)
            return relative
        document = nuclei_document(read_annotations(annotation_file, NUCLEI_CLASSES), self.nuclei_classes)
        relative = f"nuclei/{case_id}.json"
        (root / "nuclei").mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(json.dumps(document) + "\n")
        return relative

    # ---- synthetic mirror --------------------------------------------------------------------------------------
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        rois, tissue, nuclei = [], [], []
        for stem, suffix in synthetic_roi_names(cases):
            image, tissue_doc, nuclei_doc = synthetic_roi(rng)
            rois.append((f"{ROI_FOLDER}/{stem}{suffix}", encode_image(image, ".tif")))
            tissue.append((f"{TISSUE_FOLDER}/{stem}_tissue.geojson", _geojson_bytes(tissue_doc)))
            nuclei.append((f"{NUCLEI_FOLDER}/{stem}_nuclei.geojson", _geojson_bytes(nuclei_doc)))
        write_zip(downloads / f"{ROI_FOLDER}.zip", rois)
        write_zip(downloads / f"{TISSUE_FOLDER}.zip", tissue)
        write_zip(downloads / f"{NUCLEI_FOLDER}.zip", nuclei)


# ---- synthetic ROIs --------------------------------------------------------------------------------------------
SYNTHETIC_SIZE = 256  # a quarter of the real 1024: the tissue evaluator's NEAREST resize to 1024 is then exact
TISSUE_RGB = {0: (241, 238, 243), 1: (230, 160, 200), 2: (212, 70, 92), 3: (170, 118, 190), 4: (206, 146, 150),
              5: (196, 186, 176)}
#: nucleus colour (RGB) and radius (px) per class: distinct enough for a colour/size classifier
NUCLEUS_LOOK = {
    "nuclei_tumor": ((88, 36, 128), 5.5), "nuclei_lymphocyte": ((30, 18, 60), 3.0),
    "nuclei_plasma_cell": ((60, 30, 150), 3.5), "nuclei_histiocyte": ((130, 90, 170), 5.0),
    "nuclei_melanophage": ((125, 80, 30), 4.5), "nuclei_neutrophil": ((150, 40, 160), 3.5),
    "nuclei_stroma": ((100, 70, 100), 4.0), "nuclei_epithelium": ((60, 80, 120), 4.5),
    "nuclei_endothelium": ((150, 60, 60), 3.5), "nuclei_apoptosis": ((20, 20, 20), 2.5),
}
#: which nuclei live in which tissue (tissue class id -> candidate classes)
NUCLEI_BY_TISSUE = {
    1: ("nuclei_lymphocyte", "nuclei_plasma_cell", "nuclei_histiocyte", "nuclei_stroma", "nuclei_neutrophil",
        "nuclei_melanophage"),
    2: ("nuclei_endothelium", "nuclei_lymphocyte"),
    3: ("nuclei_tumor", "nuclei_tumor", "nuclei_tumor", "nuclei_apoptosis", "nuclei_melanophage"),
    4: ("nuclei_epithelium",),
    5: ("nuclei_apoptosis", "nuclei_neutrophil"),
}


def synthetic_roi_names(cases: int) -> Iterator[tuple[str, str]]:
    """(stem, suffix): primary and metastatic ROIs numbered separately; the last one is a ``.tiff``."""
    n_primary = math.ceil(cases / 2)
    names = [f"training_set_primary_roi_{i:03d}" for i in range(1, n_primary + 1)]
    names += [f"training_set_metastatic_roi_{i:03d}" for i in range(1, cases - n_primary + 1)]
    for number, stem in enumerate(names):
        yield stem, ".tiff" if number == len(names) - 1 else ".tif"


def _feature(name: str, polygons: list[Polygon], colour: tuple[int, int, int]) -> dict[str, Any]:
    geometry = ({"type": "Polygon", "coordinates": polygons[0]} if len(polygons) == 1
                else {"type": "MultiPolygon", "coordinates": polygons})
    return {"type": "Feature", "geometry": geometry,
            "properties": {"objectType": "annotation", "classification": {"name": name, "color": list(colour)}}}


def _geojson_bytes(features: list[dict[str, Any]]) -> bytes:
    return json.dumps({"type": "FeatureCollection", "features": features}, indent=1).encode()


def _square(x0: float, y0: float, x1: float, y1: float) -> Ring:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]


def synthetic_tissue_features(rng: np.random.Generator) -> list[dict[str, Any]]:
    """Stroma everywhere (with a hole of unannotated background), an epidermis band, tumour nests with necrosis,
    vessels and sometimes an explicit white-background region, in painting order. Every class occurs in every
    ROI, so a perfect prediction reaches the best micro Dice even on a two-ROI synthetic test set."""
    s = float(SYNTHETIC_SIZE)
    hole = blob_outline(rng, (rng.uniform(40, s - 40), rng.uniform(60, s - 40)), rng.uniform(10, 16))
    features = [_feature("tissue_stroma", [[_square(0, 0, s, s), hole]], TISSUE_RGB[1])]
    xs = np.linspace(s, 0, 9)
    lower = [(float(x), round(float(rng.uniform(22, 34)), 1)) for x in xs]
    features.append(_feature("tissue_epidermis", [[[(0.0, 0.0), (s, 0.0), *lower, (0.0, 0.0)]]], TISSUE_RGB[4]))
    centres = [(rng.uniform(70, s - 70), rng.uniform(90, s - 70)) for _ in range(int(rng.integers(1, 3)))]
    nests = [[blob_outline(rng, centre, rng.uniform(36, 52), vertices=24, wobble=0.25)] for centre in centres]
    features.append(_feature("tissue_tumor", nests, TISSUE_RGB[3]))
    features.append(_feature("tissue_necrosis", [[blob_outline(rng, centres[0], rng.uniform(10, 16))]], TISSUE_RGB[5]))
    for _ in range(int(rng.integers(1, 3))):
        vessel = blob_outline(rng, (rng.uniform(20, s - 20), rng.uniform(50, s - 20)), rng.uniform(7, 12))
        features.append(_feature("tissue_blood_vessel", [[vessel]], TISSUE_RGB[2]))
    if rng.random() < 0.5:
        corner = float(rng.uniform(28, 44))
        features.append(_feature("tissue_white_background", [[_square(s - corner, s - corner, s, s)]], TISSUE_RGB[0]))
    return features


def synthetic_roi(rng: np.random.Generator) -> tuple[np.ndarray, list[dict[str, Any]], list[dict[str, Any]]]:
    """One RGBA ROI with its tissue and nuclei GeoJSON features. Colours follow the tissue classes and nuclei
    classes, so both labels are predictable from the image; nuclei mostly belong to the tissue they lie in, and
    every nuclei class occurs in every ROI (the official macro F1 is below 1 for a perfect prediction otherwise)."""
    shape = (SYNTHETIC_SIZE, SYNTHETIC_SIZE)
    tissue_features = synthetic_tissue_features(rng)
    tissue_map = rasterise_tissue(
        [Annotation(f["properties"]["classification"]["name"], _feature_polygons(f)) for f in tissue_features], shape
    )
    palette = np.array([TISSUE_RGB[c] for c in range(len(TISSUE_CLASSES))], dtype=float)
    rgb = palette[tissue_map]
    texture = ndimage.gaussian_filter(rng.standard_normal((*shape, 3)), sigma=(2, 2, 0)) * 14
    rgb += texture * (tissue_map != 0)[..., None] + rng.normal(0, 4, (*shape, 3))
    spacing = 20
    slots = [(y + rng.uniform(-3, 3), x + rng.uniform(-3, 3))
             for y in range(12, SYNTHETIC_SIZE - 8, spacing) for x in range(12, SYNTHETIC_SIZE - 8, spacing)]
    slots = [slots[i] for i in rng.permutation(len(slots))[: int(len(slots) * 0.55)]]
    slots = [(cy, cx) for cy, cx in slots if tissue_map[int(cy), int(cx)] != 0]
    nuclei_features = []
    for number, (cy, cx) in enumerate(slots):
        if number < len(NUCLEI_CLASSES):
            name = NUCLEI_CLASSES[number]
        else:
            candidates = NUCLEI_BY_TISSUE[int(tissue_map[int(cy), int(cx)])]
            name = candidates[int(rng.integers(len(candidates)))]
        colour, radius = NUCLEUS_LOOK[name]
        parts = [[blob_outline(rng, (cx, cy), radius * rng.uniform(0.9, 1.1), vertices=10, wobble=0.15)]]
        if rng.random() < 0.08:  # QuPath sometimes stores a nucleus as a MultiPolygon with a small fragment
            parts.append([blob_outline(rng, (cx + radius + 1.5, cy), 1.2, vertices=6, wobble=0.1)])
        for part in parts:
            rgb[polygon_mask(part, shape)] = np.array(colour) + rng.normal(0, 6, 3)
        nuclei_features.append(_feature(name, parts, colour))
    alpha = np.full((*shape, 1), 255.0)
    return to_uint8(np.concatenate([rgb, alpha], axis=2)), tissue_features, nuclei_features


def _feature_polygons(feature: dict[str, Any]) -> tuple[Polygon, ...]:
    geometry = feature["geometry"]
    parts = [geometry["coordinates"]] if geometry["type"] == "Polygon" else geometry["coordinates"]
    return tuple(_polygon(part) for part in parts)
