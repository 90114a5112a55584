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

Synthetic mirrors: ``easy`` (flat class colours, every class in every ROI) and ``realistic`` (stain and scanner
variation, classes told apart by texture and context, touching nuclei, imbalance, artefacts, coarse annotations; see
"the realistic mirror" below). Both write the real archive names, folders, formats and class names.

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
    ellipse_mask,
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
    synthetic_difficulties: ClassVar[tuple[str, ...]] = ("easy", "realistic")

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
    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int, difficulty: str = "easy") -> None:
        rng = np.random.default_rng(seed)
        rois, tissue, nuclei = [], [], []
        for stem, suffix in synthetic_roi_names(cases):
            if difficulty == "realistic":
                image, tissue_doc, nuclei_doc = realistic_roi(rng, metastatic="metastatic" in stem)
            else:
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


# ---- the realistic mirror ----------------------------------------------------------------------------------------
# What the real PUMA ROIs hold that a colour rule cannot read (DATA_LAYOUTS.md §4, EXPERT_REPORTS.md §4, the dataset
# paper cited there), drawn at a quarter of the real 1024 px (about 0.92 µm per pixel, so the whole 235 µm field of a
# real ROI is kept and the tissue evaluator's nearest-neighbour resize to 1024 stays exact):
#
# * stain and scanner variation: every ROI is rendered by Beer-Lambert from hematoxylin, eosin and melanin
#   concentrations; one of three scanner/site profiles and a per-ROI draw rotate the stain vectors, scale each
#   stain (staining time) and tint the white point, so one tissue has other colours in other ROIs;
# * primary and metastatic ROIs look different: primaries mostly show an epidermis band (with rete ridges and a
#   keratin layer) over dermal stroma with tumour nests; metastases are mostly tumour sheets, more often necrotic,
#   rarely with epidermis; pigmented tumours carry brown melanin that shifts their colour;
# * tissue classes differ by texture and context more than by mean colour: tumour is cytoplasm packed with large
#   nuclei, stroma is fibrous eosin with sparse spindle nuclei, necrosis is smudgy with nuclear debris, a vessel is
#   a lumen of red cells or an empty (white) lumen with an endothelial rim, so "empty lumen" looks like background;
# * nuclei classes share one hematoxylin colour and are told apart by size, shape, chromatin, cytoplasm and the
#   tissue they lie in (tumour nuclei large and vesicular with a nucleolus, lymphocytes small and dark, plasma
#   cells with an eccentric nucleus in pink cytoplasm, histiocytes pale and kidney-shaped, melanophages in brown
#   cytoplasm, neutrophils lobed, fibroblasts and endothelium spindle-shaped, apoptotic bodies dark in a pink halo);
#   the tumour nuclei overlap the histiocytes and epithelium in size; necrotic debris is dark like lymphocytes;
# * touching nuclei: tumour nuclei are packed until they touch, lymphocytes come in aggregates;
# * class imbalance: tumour nuclei dominate (metastatic ROI 001 of the real set: 498 tumour, 119 apoptosis,
#   8 lymphocyte, 3 endothelium of 633), several nuclei classes and necrosis are absent from many ROIs;
# * artefacts: tissue tears (unannotated white), folds (a band of doubled stain), out-of-focus patches;
# * label noise: tissue polygons are drawn coarser than the tissue (every fourth vertex, a pixel or so off),
#   a few nuclei are unlabelled or take a look-alike class, and 1 % are QuPath MultiPolygons.
#
# Sizes: 256 x 256 RGBA ROIs with 200-400 nuclei each; a 16-ROI mirror (12 training, 4 test ROIs with task.yaml's
# split) trains the quick baseline in CPU minutes.
REALISTIC_SIZE = SYNTHETIC_SIZE
STAIN_OD = {"hematoxylin": (0.65, 0.70, 0.29), "eosin": (0.07, 0.99, 0.11), "melanin": (0.27, 0.57, 0.78)}
#: scanner/site profiles: (hematoxylin scale, eosin scale, white-point tint added to R, G, B)
SITES = ((1.0, 1.0, (0.0, 0.0, 0.0)), (1.35, 0.75, (-10.0, -4.0, 6.0)), (0.8, 1.3, (6.0, -6.0, -2.0)))
WHITE, STROMA, VESSEL, TUMOUR, EPIDERMIS, NECROSIS = range(6)  # = TISSUE_CLASSES indices


@dataclass(frozen=True)
class _NucleusLook:
    radius: tuple[float, float]  # semi-major axis range (px)
    aspect: tuple[float, float]  # semi-major / semi-minor range
    hematoxylin: float
    halo: str = ""  # cytoplasm around the nucleus: "", "pink", "foamy", "brown", "eosinophilic"
    nucleolus: float = 0.0  # probability of a dark nucleolus
    lobes: int = 0  # neutrophils: the nucleus is drawn as this many small lobes


REALISTIC_NUCLEI = {
    "nuclei_tumor": _NucleusLook((4.2, 7.0), (1.0, 1.45), 0.55, nucleolus=0.8),
    "nuclei_lymphocyte": _NucleusLook((2.4, 3.4), (1.0, 1.15), 1.25),
    "nuclei_plasma_cell": _NucleusLook((2.6, 3.4), (1.1, 1.3), 1.0, halo="pink"),
    "nuclei_histiocyte": _NucleusLook((4.0, 6.0), (1.3, 1.7), 0.48, halo="foamy"),
    "nuclei_melanophage": _NucleusLook((3.5, 5.0), (1.0, 1.4), 0.6, halo="brown"),
    "nuclei_neutrophil": _NucleusLook((3.0, 3.6), (1.0, 1.2), 1.1, lobes=3),
    "nuclei_stroma": _NucleusLook((5.0, 7.0), (2.8, 4.0), 0.95),
    "nuclei_epithelium": _NucleusLook((3.5, 4.8), (1.1, 1.4), 0.75, nucleolus=0.3),
    "nuclei_endothelium": _NucleusLook((4.0, 5.5), (2.6, 3.6), 1.0),
    "nuclei_apoptosis": _NucleusLook((1.8, 2.8), (1.0, 1.2), 1.6, halo="eosinophilic"),
}
#: which nuclei a tissue holds (weights), and nuclei per pixel of that tissue
NUCLEI_MIX = {
    TUMOUR: ({"nuclei_tumor": 0.86, "nuclei_lymphocyte": 0.05, "nuclei_apoptosis": 0.04, "nuclei_histiocyte": 0.02,
              "nuclei_melanophage": 0.015, "nuclei_plasma_cell": 0.01, "nuclei_neutrophil": 0.005}, 1 / 70),
    STROMA: ({"nuclei_stroma": 0.45, "nuclei_lymphocyte": 0.25, "nuclei_plasma_cell": 0.1, "nuclei_histiocyte": 0.07,
              "nuclei_melanophage": 0.04, "nuclei_neutrophil": 0.03, "nuclei_endothelium": 0.06}, 1 / 420),
    EPIDERMIS: ({"nuclei_epithelium": 0.9, "nuclei_lymphocyte": 0.04, "nuclei_tumor": 0.05,
                 "nuclei_melanophage": 0.01}, 1 / 45),
    NECROSIS: ({"nuclei_apoptosis": 0.45, "nuclei_neutrophil": 0.3, "nuclei_tumor": 0.15, "nuclei_histiocyte": 0.1},
               1 / 260),
}
#: look-alike classes an annotator may pick instead (label noise)
LOOK_ALIKES = {"nuclei_tumor": "nuclei_histiocyte", "nuclei_histiocyte": "nuclei_tumor",
               "nuclei_lymphocyte": "nuclei_plasma_cell", "nuclei_plasma_cell": "nuclei_lymphocyte",
               "nuclei_stroma": "nuclei_endothelium", "nuclei_endothelium": "nuclei_stroma",
               "nuclei_apoptosis": "nuclei_lymphocyte", "nuclei_epithelium": "nuclei_tumor"}


@dataclass(frozen=True)
class _Nucleus:
    name: str
    centre: tuple[float, float]  # (x, y)
    ring: Ring
    look: _NucleusLook
    angle: float


def _ellipse_ring(rng: np.random.Generator, centre: tuple[float, float], radii: tuple[float, float], angle: float,
                  *, vertices: int = 12, wobble: float = 0.08) -> Ring:
    """A closed (x, y) ring around an ellipse with semi-axes ``radii`` turned by ``angle``, slightly irregular."""
    t = np.linspace(0, 2 * np.pi, vertices, endpoint=False)
    scale = 1 + wobble * rng.uniform(-1, 1, vertices)
    u, v = radii[0] * np.cos(t) * scale, radii[1] * np.sin(t) * scale
    xs = centre[0] + u * np.cos(angle) - v * np.sin(angle)
    ys = centre[1] + u * np.sin(angle) + v * np.cos(angle)
    ring = [(round(float(x), 1), round(float(y), 1)) for x, y in zip(xs, ys, strict=True)]
    return [*ring, ring[0]]


def _coarse(rng: np.random.Generator, ring: Ring, step: int = 3) -> Ring:
    """The ring as an annotator draws it: every ``step``-th vertex, each about a pixel off; vertices on the ROI's
    border stay where they are (a ring of few vertices, such as the ROI's square, is kept whole)."""
    if len(ring) < 4 * step:
        return ring
    edge = (0.0, float(REALISTIC_SIZE))
    kept = [(x, y) if x in edge or y in edge else
            (round(x + float(rng.normal(0, 1.0)), 1), round(y + float(rng.normal(0, 1.0)), 1))
            for number, (x, y) in enumerate(ring[:-1]) if number % step == 0 or x in edge or y in edge]
    return [*kept, kept[0]]


def _realistic_layout(rng: np.random.Generator, metastatic: bool) -> list[tuple[int, list[Polygon], dict[str, Any]]]:
    """(tissue class, fine polygons, extras) in painting order; drawn with the epidermis on top, then turned by a
    multiple of 90 degrees so that the skin surface lies on any side."""
    s = float(REALISTIC_SIZE)
    layers: list[tuple[int, list[Polygon], dict[str, Any]]] = []
    tears = [blob_outline(rng, (rng.uniform(30, s - 30), rng.uniform(60, s - 30)), rng.uniform(4, 11), vertices=24,
                          wobble=0.5) for _ in range(int(rng.integers(0, 3)))]
    layers.append((STROMA, [[_square(0, 0, s, s), *tears]], {}))
    top = 0.0
    if rng.random() < (0.1 if metastatic else 0.85):
        thickness, amplitude = rng.uniform(22, 45), rng.uniform(4, 12)
        period, phase = rng.uniform(35, 70), rng.uniform(0, 2 * np.pi)
        xs = np.linspace(s, 0, 33)
        lower = [(round(float(x), 1), round(float(thickness + amplitude * np.sin(2 * np.pi * x / period + phase)), 1))
                 for x in xs]
        layers.append((EPIDERMIS, [[[(0.0, 0.0), (s, 0.0), *lower, (0.0, 0.0)]]], {"thickness": thickness}))
        top = thickness + amplitude
    radius = (55.0, 95.0) if metastatic else (32.0, 60.0)
    nests = []
    for _ in range(int(rng.integers(1, 4))):
        r = float(rng.uniform(*radius))
        centre = (float(rng.uniform(20, s - 20)), float(rng.uniform(min(top + 0.5 * r, s - 30), s - 10)))
        nests.append((centre, r))
        layers.append((TUMOUR, [[blob_outline(rng, centre, r, vertices=40, wobble=0.3)]], {}))
    if rng.random() < (0.6 if metastatic else 0.2):
        centre, r = max(nests, key=lambda nest: nest[1])
        layers.append((NECROSIS, [[blob_outline(rng, centre, r * rng.uniform(0.25, 0.5), vertices=32, wobble=0.35)]],
                       {}))
    for _ in range(int(rng.integers(0, 5))):
        centre = (float(rng.uniform(12, s - 12)), float(rng.uniform(top + 10, s - 8)))
        r = float(rng.uniform(4, 12))
        layers.append((VESSEL, [[_ellipse_ring(rng, centre, (r, r * rng.uniform(0.5, 1.0)), rng.uniform(0, np.pi),
                                               vertices=24)]], {"red_cells": bool(rng.random() < 0.6)}))
    if rng.random() < 0.35:  # the tissue ends inside the ROI: glass, annotated as white background
        depth = rng.uniform(15, 45)
        edge = [(round(float(x), 1), round(float(s - depth + 6 * np.sin(x / 17 + depth)), 1))
                for x in np.linspace(0, s, 33)]
        layers.append((WHITE, [[[*edge, (s, s), (0.0, s), edge[0]]]], {}))
    turns = int(rng.integers(0, 4))
    return [(value, [[_turn(ring, turns) for ring in polygon] for polygon in polygons], extras)
            for value, polygons, extras in layers]


def _turn(ring: Ring, turns: int) -> Ring:
    s = float(REALISTIC_SIZE)
    for _ in range(turns):
        ring = [(round(s - y, 1), x) for x, y in ring]
    return ring


def _oriented_texture(rng: np.random.Generator, shape: tuple[int, int], angle: float) -> np.ndarray:
    """Fibres: noise smoothed along one direction only, turned to ``angle``."""
    fibres = ndimage.gaussian_filter(rng.standard_normal((shape[0] * 2, shape[1] * 2)), (0.8, 7.0))
    fibres = ndimage.rotate(fibres, np.degrees(angle), reshape=False, order=1, mode="reflect")
    h0, w0 = shape[0] // 2, shape[1] // 2
    fibres = fibres[h0:h0 + shape[0], w0:w0 + shape[1]]
    return (fibres - fibres.mean()) / (fibres.std() + 1e-9)


def _place_nuclei(rng: np.random.Generator, true_map: np.ndarray, layers: list[tuple[int, list[Polygon], dict]],
                  fibre_angle: float) -> list[_Nucleus]:
    """Nuclei of every tissue at its density: tumour nuclei packed until they touch, lymphocyte aggregates in the
    stroma, an endothelial rim on each vessel."""
    shape = true_map.shape
    nuclei: list[_Nucleus] = []
    centres = np.zeros((0, 2))
    sizes = np.zeros(0)

    def add(name: str, x: float, y: float, angle: float, packing: float) -> None:
        nonlocal centres, sizes
        look = REALISTIC_NUCLEI[name]
        major = float(rng.uniform(*look.radius))
        if len(sizes) and (np.hypot(*(centres - (x, y)).T) < packing * (sizes + major)).any():
            return
        ring = _ellipse_ring(rng, (x, y), (major, major / rng.uniform(*look.aspect)), angle,
                             wobble=0.2 if name == "nuclei_histiocyte" else 0.08)
        nuclei.append(_Nucleus(name, (x, y), ring, look, angle))
        centres = np.vstack([centres, (x, y)])
        sizes = np.append(sizes, major)

    for _, polygons, extras in layers:  # the endothelial rim of each vessel
        if "red_cells" not in extras:
            continue
        ring = np.asarray(polygons[0][0][:-1])
        centre = ring.mean(axis=0)
        for index in rng.choice(len(ring), size=min(len(ring), int(rng.integers(2, 6))), replace=False):
            x, y = ring[index]
            add("nuclei_endothelium", float(x), float(y), float(np.arctan2(y - centre[1], x - centre[0]) + np.pi / 2),
                0.9)
    stroma = np.argwhere(true_map == STROMA)
    if len(stroma):
        for _ in range(int(rng.integers(0, 4))):  # lymphocyte aggregates (tumour-infiltrating lymphocytes)
            cy, cx = stroma[int(rng.integers(len(stroma)))]
            for _ in range(int(rng.integers(15, 50))):
                x, y = cx + rng.normal(0, 10), cy + rng.normal(0, 10)
                if 0 <= x < shape[1] and 0 <= y < shape[0] and true_map[int(y), int(x)] in (STROMA, TUMOUR):
                    add("nuclei_lymphocyte", float(x), float(y), rng.uniform(0, np.pi), 1.0)
    for tissue, (mix, density) in NUCLEI_MIX.items():
        pixels = np.argwhere(true_map == tissue)
        target = int(len(pixels) * density)
        if not target:
            continue
        names, weights = list(mix), np.array(list(mix.values()))
        chosen = rng.choice(len(names), size=target * 3, p=weights / weights.sum())
        for pick, (y, x) in zip(chosen, pixels[rng.integers(len(pixels), size=target * 3)], strict=True):
            name = names[pick]
            angle = fibre_angle + rng.normal(0, 0.25) if name == "nuclei_stroma" else rng.uniform(0, np.pi)
            add(name, float(x + rng.uniform()), float(y + rng.uniform()), angle,
                0.8 if tissue == TUMOUR else 0.95 if tissue == EPIDERMIS else 1.05)
    return nuclei


def _stains(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(3 x 3 stain OD matrix, per-stain scale, white point) of one ROI: its site's profile and its own jitter."""
    h_scale, e_scale, tint = SITES[int(rng.integers(len(SITES)))]
    vectors = np.array(list(STAIN_OD.values())) + rng.normal(0, 0.05, (3, 3))
    vectors = np.clip(vectors, 0.01, None)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    scale = np.array([h_scale * rng.uniform(0.8, 1.25), e_scale * rng.uniform(0.75, 1.3), rng.uniform(0.8, 1.2)])
    white = rng.uniform(228, 250) + np.array(tint) + rng.uniform(-4, 4, 3)
    return vectors, scale, white


def realistic_roi(rng: np.random.Generator, *, metastatic: bool
                  ) -> tuple[np.ndarray, list[dict[str, Any]], list[dict[str, Any]]]:
    """One RGBA ROI of the realistic mirror with its tissue and nuclei GeoJSON features (see the notes above)."""
    size = REALISTIC_SIZE
    shape = (size, size)
    layers = _realistic_layout(rng, metastatic)
    true_map = rasterise_tissue([Annotation(TISSUE_CLASSES[v], tuple(p)) for v, p, _ in layers], shape)
    tissue_features = [_feature(TISSUE_CLASSES[value], [[_coarse(rng, ring) for ring in polygon]
                                                        for polygon in polygons], TISSUE_RGB[value])
                       for value, polygons, _ in layers]
    fibre_angle = float(rng.uniform(0, np.pi))
    grain = ndimage.gaussian_filter(rng.standard_normal(shape), 1.0)
    grain /= grain.std()
    smudge = ndimage.gaussian_filter(rng.standard_normal(shape), 3.0)
    smudge /= smudge.std()
    fibres = _oriented_texture(rng, shape, fibre_angle)
    hema, eosin, melanin = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    tissue = true_map == STROMA
    eosin[tissue] = np.clip(0.38 * (1 + 0.3 * fibres) - 0.1 * (smudge > 1.0), 0.06, None)[tissue]
    hema[tissue] = 0.04
    tissue = true_map == TUMOUR
    eosin[tissue] = (0.32 + 0.06 * grain)[tissue]
    hema[tissue] = (0.1 + 0.03 * grain)[tissue]
    if rng.random() < 0.4:  # a pigmented tumour
        melanin[tissue] = np.clip(rng.uniform(0.1, 0.35) * (1 + smudge), 0, None)[tissue]
    tissue = true_map == EPIDERMIS
    eosin[tissue] = (0.3 + 0.05 * grain)[tissue]
    hema[tissue] = 0.18
    tissue = true_map == NECROSIS
    eosin[tissue] = (0.28 + 0.08 * smudge)[tissue]
    hema[tissue] = np.clip(0.22 + 0.1 * smudge, 0.05, None)[tissue]
    debris = tissue & (rng.random(shape) < 0.03)
    hema[ndimage.binary_dilation(debris)] = 1.2  # karyorrhectic dust: dark specks no one annotates
    for value, polygons, extras in layers:
        if value != VESSEL:
            continue
        lumen = polygon_mask(polygons[0], shape)
        wall = ndimage.binary_dilation(lumen, iterations=2) & ~lumen
        eosin[wall] = 0.65
        eosin[lumen] = (1.0 + 0.15 * grain)[lumen] if extras["red_cells"] else 0.03
        hema[lumen] = 0.0
    rows, cols = np.mgrid[0:size, 0:size]
    border = np.minimum(np.minimum(rows, cols), np.minimum(size - 1 - rows, size - 1 - cols))
    keratin = (true_map == EPIDERMIS) & (border < 6)  # the skin surface is the ROI edge the band lies on
    eosin[keratin] = (0.75 + 0.1 * fibres)[keratin]
    white = true_map == WHITE
    eosin[white], hema[white], melanin[white] = 0.02, 0.0, 0.0

    nuclei = _place_nuclei(rng, true_map, layers, fibre_angle)
    for nucleus in nuclei:  # cytoplasm first, so that a neighbour's nucleus lies on top of it
        halo = nucleus.look.halo
        if not halo:
            continue
        cx, cy = nucleus.centre
        offset = 1.5 if halo == "pink" else 0.0  # a plasma cell's nucleus sits at one end of its cytoplasm
        ring = _ellipse_ring(rng, (cx + offset * np.cos(nucleus.angle), cy + offset * np.sin(nucleus.angle)),
                             (nucleus.look.radius[1] * 1.9, nucleus.look.radius[1] * 1.5), nucleus.angle)
        region = ring_mask(ring, shape)
        if halo == "pink":
            eosin[region], hema[region] = 0.55, 0.2
        elif halo == "foamy":
            eosin[region], hema[region] = 0.18, 0.05
        elif halo == "brown":
            melanin[region] = (0.7 + 0.3 * grain)[region]
        else:
            eosin[region] = 0.85
    for nucleus in nuclei:
        mask = ring_mask(nucleus.ring, shape)
        if not mask.any():
            continue
        look = nucleus.look
        if look.lobes:
            mask = np.zeros(shape, dtype=bool)
            cx, cy = nucleus.centre
            for lobe in range(look.lobes):
                a = nucleus.angle + 2 * np.pi * lobe / look.lobes
                mask |= ellipse_mask(shape, (cy + 1.6 * np.sin(a), cx + 1.6 * np.cos(a)), (1.5, 1.5))
        chromatin = look.hematoxylin * (1 + 0.15 * grain)
        rim = mask & ~ndimage.binary_erosion(mask)
        hema[mask] = chromatin[mask]
        if look.nucleolus:
            hema[rim] += 0.3  # a vesicular nucleus: chromatin along the membrane
        eosin[mask] *= 0.5
        if rng.random() < look.nucleolus:
            cx, cy = nucleus.centre
            hema[ellipse_mask(shape, (cy + rng.normal(0, 0.8), cx + rng.normal(0, 0.8)), (1.0, 1.0))] = 1.5
    # artefacts: a fold (two layers of tissue) and an out-of-focus patch
    concentrations = np.stack([hema, eosin, melanin], axis=-1)
    if rng.random() < 0.25:
        a, offset = rng.uniform(0, np.pi), rng.uniform(-60, 60)
        band = np.abs((cols - size / 2) * np.cos(a) + (rows - size / 2) * np.sin(a) - offset) < rng.uniform(4, 10)
        concentrations[band & ~white] *= 1.8
    vectors, scale, white_point = _stains(rng)
    optical_density = (concentrations * scale) @ vectors
    rgb = white_point * np.exp(-optical_density)
    rgb = ndimage.gaussian_filter(rgb, (rng.uniform(0.3, 0.9),) * 2 + (0,))
    if rng.random() < 0.3:
        blurred = ndimage.gaussian_filter(rgb, (2.2, 2.2, 0))
        patch = ellipse_mask(shape, tuple(rng.uniform(40, size - 40, 2)), tuple(rng.uniform(25, 60, 2)))
        rgb[patch] = blurred[patch]
    rgb += rng.normal(0, 2.5, rgb.shape)
    nuclei_features = []
    for nucleus in nuclei:
        roll = rng.random()
        if roll < 0.03:  # missed by the annotator
            continue
        name = LOOK_ALIKES.get(nucleus.name, nucleus.name) if roll > 0.96 else nucleus.name
        parts = [[nucleus.ring]]
        if rng.random() < 0.01:
            parts.append([blob_outline(rng, (nucleus.centre[0] + nucleus.look.radius[1] + 2, nucleus.centre[1]), 1.0,
                                       vertices=6, wobble=0.1)])
        nuclei_features.append(_feature(name, parts, NUCLEUS_LOOK[name][0]))
    alpha = np.full((*shape, 1), 255.0)
    return to_uint8(np.concatenate([rgb, alpha], axis=2)), tissue_features, nuclei_features
