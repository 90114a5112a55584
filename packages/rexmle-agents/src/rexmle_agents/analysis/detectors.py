"""Deterministic detectors: where code alone can decide part of a factor, it decides before any model is asked.

Each detector reads the code of the nodes that ran (comments removed, so a ``# TODO: augment`` proves nothing)
and sometimes their outputs, and returns a verdict with the lines it matched as evidence. A detector covers a
stated *part* of its factor (its ``scope``): "not found" means that part was not seen, not that the factor is
absent. Their verdicts are reported beside the judge's and every disagreement is listed.

* ``augmentation`` (data_augmentation): augmentation transforms (MONAI ``Rand*``, torchvision ``Random*``,
  albumentations), or numpy/torch flips and rotations next to a random draw;
* ``seed_fold_ensemble`` (seed_fold_ensembles): a loop over folds or seeds and predictions averaged in the same code;
* ``cc_morphology`` (post_processing): connected-component or morphology operations (scipy, scikit-image, cc3d,
  OpenCV, SimpleITK, MONAI);
* ``search_loop`` (hyperparameter_search): a search library, or a loop over a grid of values with the best one kept;
* ``external_fetch`` (external_data): downloads or pretrained weights requested, in code whose run did not fail on
  the network;
* ``ct_mr_preprocessing`` (domain_knowledge): CT, a Hounsfield window or resampling; MR, per-volume z-scoring, bias
  correction or resampling (CT and MR tasks only).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rexmle_agents.analysis.evidence import NodeText, RunText, code_lines
from rexmle_agents.analysis.failures import classify_output
from rexmle_agents.analysis.records import FactorVerdict, Quote

DETECTORS_VERSION = "1"


@dataclass(frozen=True)
class Detector:
    name: str
    factor: str
    scope: str
    find: Callable[[RunText, str], list[tuple[int, str]]]  # (run, modality) -> [(node, line)] or [] when not found
    applies: Callable[[str], bool] = lambda modality: True


def _ran(run: RunText) -> list[NodeText]:
    return [n for n in run.nodes if n.ran and n.code]


def _first(node: NodeText, pattern: re.Pattern[str]) -> str | None:
    return next((orig.strip() for code, orig in code_lines(node.code) if pattern.search(code)), None)


# ---------------------------------------------------------------------------------------------------------------
# data augmentation

_AUGMENT_CALL = re.compile(
    r"\bRand[A-Z]\w*\s*\("  # MONAI: RandFlipd, RandAffined, RandGaussianNoised, ...
    r"|\bRandom(?:Horizontal|Vertical)?Flip\w*\s*\("
    r"|\bRandom(?:Rotation|Rotate90|Rotate|ResizedCrop|Crop|Affine|Perspective|Erasing|Scale|Gamma|Brightness\w*"
    r"|Contrast|Noise|AdjustSharpness|Equalize|AutoContrast|Invert|Posterize|Solarize|Grayscale|Apply|Choice"
    r"|Order|SizedCrop|GridShuffle)\s*\("
    r"|\b(?:ColorJitter|GaussianBlur|GaussNoise|ElasticTransform|GridDistortion|OpticalDistortion|ShiftScaleRotate"
    r"|HorizontalFlip|VerticalFlip|CoarseDropout|HueSaturationValue|TrivialAugmentWide|RandAugment|AutoAugment"
    r"|AugMix|MixUp|CutMix|HEDJitter|StainAugment\w*)\s*\("
)
_FLIP = re.compile(r"\b(?:np|numpy|torch)\.(?:flip|fliplr|flipud|rot90)\s*\(|\.flip\s*\(|\[\s*::\s*-1\s*\]"
                   r"|\[\s*:\s*,\s*::\s*-1\s*\]")
_RANDOM_DRAW = re.compile(r"\brandom\b|\brng\b|\.rand(?:int|n)?\s*\(|\.(?:uniform|choice|integers|normal)\s*\(")


def _augmentation(run: RunText, modality: str) -> list[tuple[int, str]]:
    for node in _ran(run):
        line = _first(node, _AUGMENT_CALL)
        if line:
            return [(node.id, line)]
        lines = code_lines(node.code)
        for i, (code, orig) in enumerate(lines):
            if _FLIP.search(code) and any(_RANDOM_DRAW.search(c) for c, _ in lines[max(0, i - 3):i + 1]):
                return [(node.id, orig.strip())]
    return []


# ---------------------------------------------------------------------------------------------------------------
# seed / fold ensembles

_FOLD_LOOP = re.compile(r"^\s*for\b.*\b(?:folds?|seeds?|splits?)\b.*\bin\b"
                        r"|^\s*for\b.*\bin\b.*(?:\b(?:K|Stratified|Group)Fold\s*\(|\b\w*(?:kf|cv|fold)\w*\.split\s*\("
                        r"|\b\w*(?:seeds|folds|SEEDS|FOLDS)\w*\b|array_split\s*\()", re.IGNORECASE)
_AVERAGE = re.compile(r"\bnp\.(?:mean|average|median)\s*\(\s*(?:np\.stack\s*\(\s*)?\[?\s*\w*(?:pred|prob|logit|output"
                      r"|outs|test|ens)\w*"
                      r"|\b(?:np|torch)\.stack\s*\(.*\)\s*\.mean\s*\("
                      r"|/=?\s*(?:len\s*\(\s*\w*(?:fold|seed|model)\w*\s*\)|n_?(?:folds|seeds|models|splits)\b"
                      r"|N_(?:FOLDS|SEEDS|MODELS|SPLITS)\b)", re.IGNORECASE)


def _seed_fold_ensemble(run: RunText, modality: str) -> list[tuple[int, str]]:
    for node in _ran(run):
        loop, average = _first(node, _FOLD_LOOP), _first(node, _AVERAGE)
        if loop and average:
            return [(node.id, loop), (node.id, average)]
    return []


# ---------------------------------------------------------------------------------------------------------------
# post-processing: connected components and morphology

_CC_MORPHOLOGY = re.compile(
    r"\b(?:ndimage|ndi)\.(?:label|binary_(?:opening|closing|erosion|dilation|fill_holes)|grey_(?:opening|closing))\s*\("
    r"|\bmeasure\.label\s*\(|\bremove_small_(?:objects|holes)\s*\(|\bcc3d\.\w+\s*\(|\bconnected_components\w*\s*\("
    r"|\bbinary_(?:opening|closing|fill_holes)\s*\("
    r"|\bcv2\.(?:connectedComponents\w*|morphologyEx|erode|dilate)\s*\("
    r"|\b(?:KeepLargestConnectedComponent|RemoveSmallObjects|FillHoles)d?\s*\("
    r"|\bsitk\.(?:ConnectedComponent|RelabelComponent|BinaryMorphological\w+|BinaryFillhole)\s*\("
    r"|\blargest_(?:connected_)?component\w*\s*\("
    r"|\bmorphology\.(?:binary_\w+|remove_small_\w+|opening|closing|erosion|dilation)\s*\("
)


def _cc_morphology(run: RunText, modality: str) -> list[tuple[int, str]]:
    for node in _ran(run):
        line = _first(node, _CC_MORPHOLOGY)
        if line:
            return [(node.id, line)]
    return []


# ---------------------------------------------------------------------------------------------------------------
# hyper-parameter search

_SEARCH_API = re.compile(r"\boptuna\.create_study\s*\(|\.suggest_(?:float|int|categorical|loguniform|uniform)\s*\("
                         r"|\b(?:GridSearchCV|RandomizedSearchCV|HalvingGridSearchCV|HalvingRandomSearchCV"
                         r"|ParameterGrid|ParameterSampler)\s*\(|\btune\.(?:run|Tuner|grid_search)\s*\(|\bfmin\s*\(")
_GRID_LOOP = re.compile(r"^\s*for\s+[A-Za-z_][\w\s,()]*\bin\s+(?:[\[(]\s*[-+]?\.?\d[\w.+-]*\s*,\s*[-+]?\.?\d"
                        r"|(?:itertools\.)?product\s*\(|np\.(?:logspace|linspace|geomspace)\s*\("
                        r"|\w*(?:grid|space|candidates|alphas|lrs|params|settings|configs)\b)", re.IGNORECASE)
_KEEP_BEST = re.compile(r"\bbest\w*\s*=|\b(?:max|min)\s*\(.*\bkey\s*=|\.arg(?:max|min)\s*\(|\bsorted\s*\(.*\bkey\s*=",
                        re.IGNORECASE)


def _search_loop(run: RunText, modality: str) -> list[tuple[int, str]]:
    for node in _ran(run):
        api = _first(node, _SEARCH_API)
        if api:
            return [(node.id, api)]
        loop, best = _first(node, _GRID_LOOP), _first(node, _KEEP_BEST)
        if loop and best:
            return [(node.id, loop), (node.id, best)]
    return []


# ---------------------------------------------------------------------------------------------------------------
# external data and pretrained weights

_FETCH = re.compile(r"\burl(?:open|retrieve)\s*\(|\brequests\.(?:get|post)\s*\(|\bhttpx\.(?:get|stream)\s*\("
                    r"|\b(?:wget|curl)\b[^\n]*https?://|\b(?:hf_hub_download|snapshot_download|from_pretrained"
                    r"|load_state_dict_from_url|download_url_to_file|load_dataset)\s*\(|\btorch\.hub\.load\s*\("
                    r"|\bpretrained\s*=\s*True\b|\bweights\s*=\s*(?:\w+_Weights\.|[\"'](?:DEFAULT|IMAGENET))")


def _external_fetch(run: RunText, modality: str) -> list[tuple[int, str]]:
    for node in _ran(run):
        line = _first(node, _FETCH)
        if line is None:
            continue
        fine = [o for o in node.outputs if o.exit_code == 0 and o.stopped_by is None
                and classify_output(o.text, None, None)[0] != "network"]
        if fine:
            return [(node.id, line)]
    return []


# ---------------------------------------------------------------------------------------------------------------
# CT / MR pre-processing (the part of domain knowledge code can see)

_CT = re.compile(r"\bCT|\bCTA\b|computed tomography", re.IGNORECASE)
_MR = re.compile(r"\bMR|\bMRI\b|\bMRA\b|magnetic resonance", re.IGNORECASE)
_HU_WINDOW = re.compile(r"\bclip\s*\([^,]*,\s*(?:a_min\s*=\s*)?-\s*\d{3,4}(?:\.\d*)?\s*,|\ba_min\s*=\s*-\s*\d{3,4}"
                        r"|\bwindow_?(?:level|width|center|centre|min|max)\w*\s*=|\bHU_?\w*\s*=|\bhounsfield",
                        re.IGNORECASE)
_RESAMPLE = re.compile(r"\bSpacingd?\s*\(|\bsitk\.Resample\s*\(|\bResampleImageFilter\s*\(|\bSetOutputSpacing\s*\("
                       r"|\bresample\w*\s*\(|\bzoom\s*\(.*\b(?:spacing|zooms|pixdim)\b")
_MR_NORMALISE = re.compile(r"\bNormalizeIntensityd?\s*\(|\bZNormalization\s*\(|\bN4BiasFieldCorrection\w*\s*\("
                           r"|\bHistogramStandardization\s*\("
                           r"|\(\s*(\w+)(?:\[[^\]]*\])?\s*-\s*\1(?:\[[^\]]*\])?\.mean\s*\(\s*\)\s*\)\s*/\s*\(?\s*"
                           r"\1(?:\[[^\]]*\])?\.std\s*\(")


def is_ct(modality: str) -> bool:
    return bool(_CT.search(modality))


def is_mr(modality: str) -> bool:
    return bool(_MR.search(modality))


def _ct_mr_preprocessing(run: RunText, modality: str) -> list[tuple[int, str]]:
    patterns = ([_HU_WINDOW] if is_ct(modality) else []) + ([_MR_NORMALISE] if is_mr(modality) else []) + [_RESAMPLE]
    for node in _ran(run):
        for pattern in patterns:
            line = _first(node, pattern)
            if line:
                return [(node.id, line)]
    return []


DETECTORS: tuple[Detector, ...] = (
    Detector("augmentation", "data_augmentation",
             "augmentation transforms of MONAI, torchvision or albumentations, or flips/rotations next to a random "
             "draw, in code that ran", _augmentation),
    Detector("seed_fold_ensemble", "seed_fold_ensembles",
             "a loop over folds or seeds and an average of predictions in the code of one node that ran",
             _seed_fold_ensemble),
    Detector("cc_morphology", "post_processing",
             "connected-component or morphology operations in code that ran (other post-processing, such as "
             "rounding or tuned thresholds, is left to the judge)", _cc_morphology),
    Detector("search_loop", "hyperparameter_search",
             "a search library, or a loop over a grid of values with the best one kept, in code that ran",
             _search_loop),
    Detector("external_fetch", "external_data",
             "downloads or pretrained weights requested in code whose run ended without a network error",
             _external_fetch),
    Detector("ct_mr_preprocessing", "domain_knowledge",
             "CT: a Hounsfield window or resampling; MR: per-volume z-scoring, bias correction or resampling; in code "
             "that ran (CT and MR tasks only; the rest of domain knowledge is left to the judge)",
             _ct_mr_preprocessing, applies=lambda modality: is_ct(modality) or is_mr(modality)),
)
DETECTED_FACTORS = tuple(d.factor for d in DETECTORS)


def detect(run: RunText, modality: str, rubric_version: str, factors: tuple[str, ...] | None = None) \
        -> list[FactorVerdict]:
    """Every detector's verdict on ``run`` (of the factors asked for), evidence verified like the judge's."""
    verdicts = []
    for detector in DETECTORS:
        if factors is not None and detector.factor not in factors:
            continue
        common = {"run_id": run.run_id, "factor": detector.factor, "source": "detector",
                  "rubric_version": rubric_version, "detector": detector.name,
                  "detector_version": DETECTORS_VERSION, "evidence_digest": run.digest}
        if not detector.applies(modality):
            verdicts.append(FactorVerdict(status="not_applicable", demonstrated=False,
                                          reason=f"does not apply to {modality or 'this modality'}: {detector.scope}",
                                          **common))
            continue
        found = detector.find(run, modality)
        evidence: list[Quote] = [run.verify(node, line) for node, line in found]
        proven = any(q.verified for q in evidence)
        verdicts.append(FactorVerdict(
            status="demonstrated" if proven else "not_demonstrated", demonstrated=proven, evidence=evidence,
            reason=("found: " if proven else "not found: ") + detector.scope, **common))
    return verdicts
