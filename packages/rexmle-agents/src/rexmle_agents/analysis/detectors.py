"""Deterministic detectors: where code alone can decide part of a factor, it decides before any model is asked.

Each detector reads the code that ran (comments removed, so a ``# TODO: augment`` proves nothing; a script that
crashed counts only up to its traceback's line, by the rules of :class:`rexmle_agents.analysis.evidence.Reach`)
and sometimes the outputs, and returns a verdict with the lines it matched as evidence. A detector covers a
stated *part* of its factor (its ``scope``): "not found" means that part was not seen, not that the factor is
absent. Their verdicts are reported beside the judge's and every disagreement is listed.

* ``augmentation`` (data_augmentation): augmentation transforms (MONAI ``Rand*``, torchvision/torchio ``Random*``,
  albumentations, Keras ``ImageDataGenerator`` ranges), a hand-written mixup, or numpy/torch/scipy/OpenCV flips,
  rotations and shifts next to a random draw;
* ``seed_fold_ensemble`` (seed_fold_ensembles): a loop (or comprehension) over folds or seeds and predictions
  averaged in the same code;
* ``cc_morphology`` (post_processing): connected-component or morphology operations (scipy, scikit-image, cc3d,
  OpenCV, SimpleITK, MONAI), also called by the bare names a script imported from ``scipy.ndimage``/``skimage``;
* ``search_loop`` (hyperparameter_search): a search library (scikit-learn, scikit-optimize, Optuna, Ray Tune,
  hyperopt, keras-tuner), or a loop or comprehension over a grid of values (literals, ``itertools.product``, a
  log/lin space, a named grid, a number of trials) with the best one kept;
* ``external_fetch`` (external_data): downloads or pretrained weights requested (timm, torchvision, Keras,
  open_clip, segmentation_models_pytorch, Hugging Face, gdown, MONAI bundles), in code whose run did not fail on
  the network;
* ``ct_mr_preprocessing`` (domain_knowledge): CT, a Hounsfield window (clipping, WL/WW, torchio clamps, DICOM
  rescale) or resampling; MR, per-volume z-scoring or percentile clipping, bias correction or resampling (CT and MR
  tasks only).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rexmle_agents.analysis.evidence import NodeText, RunText
from rexmle_agents.analysis.failures import classify_output
from rexmle_agents.analysis.records import FactorVerdict, Quote

DETECTORS_VERSION = "2"  # 2: code counts only where it ran; the common forms of each practice (issue 37)


@dataclass(frozen=True)
class Detector:
    name: str
    factor: str
    scope: str
    find: Callable[[RunText, str], list[tuple[int, str]]]  # (run, modality) -> [(node, line)] or [] when not found
    applies: Callable[[str], bool] = lambda modality: True


def _ran(run: RunText) -> list[NodeText]:
    return [n for n in run.nodes if n.ran and n.code and n.reach.lines != frozenset()]


def _first(node: NodeText, pattern: re.Pattern[str]) -> str | None:
    return next((orig.strip() for code, orig in node.ran_lines() if pattern.search(code)), None)


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
    # torchio's Random* transforms not listed above
    r"|\bRandom(?:ElasticDeformation|BiasField|Motion|Ghosting|Spike|Blur|Swap|Anisotropy|LabelsToImage)\s*\("
    # albumentations (imported as A) names without a Random prefix
    r"|\bA\.(?:Rotate|SafeRotate|Affine|PiecewiseAffine|Transpose|Flip|Downscale|Blur|MotionBlur|MedianBlur|CLAHE"
    r"|Sharpen|Perspective|ChannelShuffle|ISONoise|Posterize)\s*\("
    # Keras' ImageDataGenerator arguments that augment (0, None or False do not)
    r"|\b(?:rotation|width_shift|height_shift|zoom|shear|brightness|channel_shift)_range\s*=\s*(?!0\b|0\.0\b|None\b)"
    r"|\b(?:horizontal|vertical)_flip\s*=\s*True\b"
    # a hand-written mixup: the mixing weight drawn from a Beta distribution
    r"|\blam(?:bda)?\w*\s*=.*\b[Bb]eta\s*\("
)
# geometric changes that augment when a random draw decides them (the same line or the three before it)
_GEOMETRIC = re.compile(r"\b(?:np|numpy|torch)\.(?:flip|fliplr|flipud|rot90)\s*\(|\.flip\s*\(|\[\s*::\s*-1\s*\]"
                        r"|\[\s*:\s*,\s*::\s*-1\s*\]"
                        r"|\b(?:ndimage|ndi)\.(?:rotate|shift|zoom|affine_transform|map_coordinates)\s*\("
                        r"|\btransform\.(?:rotate|warp|rescale)\s*\(|\bcv2\.(?:warpAffine|flip|rotate)\s*\("
                        r"|\b(?:TF|F)\.(?:rotate|hflip|vflip|affine)\s*\(")
_RANDOM_DRAW = re.compile(r"\brandom\b|\brng\b|\.rand(?:int|n)?\s*\(|\.(?:uniform|choice|integers|normal)\s*\(")


def _augmentation(run: RunText, modality: str) -> list[tuple[int, str]]:
    for node in _ran(run):
        line = _first(node, _AUGMENT_CALL)
        if line:
            return [(node.id, line)]
        lines = node.ran_lines()
        for i, (code, orig) in enumerate(lines):
            if _GEOMETRIC.search(code) and any(_RANDOM_DRAW.search(c) for c, _ in lines[max(0, i - 3):i + 1]):
                return [(node.id, orig.strip())]
    return []


# ---------------------------------------------------------------------------------------------------------------
# seed / fold ensembles

_FOLD_LOOP = re.compile(r"^\s*for\b.*\b(?:folds?|seeds?|splits?)\b.*\bin\b"
                        r"|^\s*for\b.*\bin\b.*(?:\b(?:K|Stratified|Group)Fold\s*\(|\b\w*(?:kf|cv|fold)\w*\.split\s*\("
                        r"|\b\w*(?:seeds|folds|SEEDS|FOLDS)\w*\b|\b\w*(?:fold|seed)_?models?\b|array_split\s*\()"
                        # the same loop as a comprehension: [fit(s).predict(x) for s in SEEDS]
                        r"|[\[(]\s*\S.*\bfor\s+[\w\s,()]+\bin\s+(?:enumerate\s*\(\s*)?(?:\w*(?:folds?|seeds?)\w*\b"
                        r"|\w*(?:kf|cv|fold)\w*\.split\s*\(|range\s*\(\s*\w*(?:folds?|seeds?|splits?)\w*\s*\))",
                        re.IGNORECASE)
_AVERAGE = re.compile(r"\b(?:np|torch)\.(?:mean|average|median)\s*\(\s*"
                      r"(?:(?:np|torch)\.(?:stack|array|vstack)\s*\(\s*)?\[?\s*\w*(?:pred|prob|logit|output|outs|test|ens)\w*"
                      # the mean of a comprehension of predictions: np.mean([m.predict(x) for m in fold_models], 0)
                      r"|\b(?:np|torch)\.(?:mean|average|median)\s*\(\s*(?:(?:np|torch)\.(?:stack|array)\s*\(\s*)?\[\s*"
                      r"[\w.]*(?:predict\w*|infer\w*|forward|model\w*|net\w*)\s*\("
                      r"|\b(?:np|torch)\.stack\s*\(.*\)\s*\.mean\s*\("
                      r"|\bsum\s*\(\s*\w*(?:pred|prob|logit|output)\w*\s*\)\s*/\s*len\s*\("
                      r"|/=?\s*(?:len\s*\(\s*\w*(?:fold|seed|model|pred|prob|logit|output)\w*\s*\)"
                      r"|n_?(?:folds|seeds|models|splits)\b|N_(?:FOLDS|SEEDS|MODELS|SPLITS)\b)", re.IGNORECASE)


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
    r"|\bmorphology\.(?:binary_\w+|remove_small_\w+|opening|closing|erosion|dilation|area_opening|area_closing)\s*\("
    r"|\bregionprops(?:_table)?\s*\(|\bclear_border\s*\(|\bwatershed\s*\(|\bfill_voids\.fill\s*\("
    r"|\bcv2\.findContours\s*\(|\bsitk\.Binary(?:Opening|Closing|Erode|Dilate)\w*\s*\("
)
# ``from scipy.ndimage import label`` (or skimage's): then a bare ``label(...)`` is a connected-component call too
_CC_MODULES = re.compile(r"^\s*from\s+(?:scipy\.ndimage(?:\.\w+)?|skimage\.(?:measure|morphology|segmentation)|cc3d)"
                         r"\s+import\s+(?:\(([^)]*)\)|([^\n#]*))", re.MULTILINE)
_CC_NAMES = frozenset({"label", "binary_opening", "binary_closing", "binary_erosion", "binary_dilation",
                       "binary_fill_holes", "remove_small_objects", "remove_small_holes", "opening", "closing",
                       "erosion", "dilation", "area_opening", "area_closing", "clear_border", "watershed",
                       "regionprops", "connected_components", "largest_k"})


def _imported_cc(code: str) -> re.Pattern[str] | None:
    """A pattern of bare calls of the connected-component and morphology functions ``code`` imports by name."""
    names = set()
    for match in _CC_MODULES.finditer(code):
        for item in (match.group(1) or match.group(2)).replace("\n", ",").split(","):
            parts = item.split()
            if parts and parts[0] in _CC_NAMES:
                names.add(parts[-1] if len(parts) == 3 and parts[1] == "as" else parts[0])
    if not names:
        return None
    return re.compile(r"(?<![\w.])(?:" + "|".join(sorted(map(re.escape, names))) + r")\s*\(")


def _cc_morphology(run: RunText, modality: str) -> list[tuple[int, str]]:
    for node in _ran(run):
        line = _first(node, _CC_MORPHOLOGY)
        imported = _imported_cc("\n".join(code for code, _ in node.ran_lines()))
        if line is None and imported is not None:
            line = next((orig.strip() for code, orig in node.ran_lines()
                         if imported.search(code) and not code.lstrip().startswith(("from ", "import "))), None)
        if line:
            return [(node.id, line)]
    return []


# ---------------------------------------------------------------------------------------------------------------
# hyper-parameter search

_SEARCH_API = re.compile(r"\boptuna\.create_study\s*\(|\.suggest_(?:float|int|categorical|loguniform|uniform)\s*\("
                         r"|\bstudy\.optimize\s*\(|\bLightGBMTuner\w*\s*\("
                         r"|\b(?:GridSearchCV|RandomizedSearchCV|HalvingGridSearchCV|HalvingRandomSearchCV|BayesSearchCV"
                         r"|TuneSearchCV|TuneGridSearchCV|ParameterGrid|ParameterSampler)\s*\("
                         r"|\btune\.(?:run|Tuner|grid_search)\s*\(|\bfmin\s*\("
                         r"|\b(?:gp|forest|gbrt)_minimize\s*\(|\bkt\.(?:RandomSearch|Hyperband|BayesianOptimization"
                         r"|GridSearch)\s*\(")
# what a grid of hyper-parameter values is iterated as: literal numbers, a product, a log/lin space, a named grid
_GRID = (r"(?:[\[(]\s*[-+]?\.?\d[\w.+-]*\s*,\s*[-+]?\.?\d|(?:itertools\.)?product\s*\("
         r"|np\.(?:logspace|linspace|geomspace)\s*\(|\w*(?:grid|space|candidates|alphas|lrs|params|settings|configs"
         r"|learning_rates|lambdas|gammas|penalties|depths|combos|combinations)\b|range\s*\(\s*\w*(?:trial|search)\w*\s*\))")
_GRID_LOOP = re.compile(r"^\s*for\s+[A-Za-z_][\w\s,()]*\bin\s+" + _GRID
                        # the loop as a comprehension: scores = [cv_score(a) for a in alphas]
                        + r"|[\[({]\s*\S.*\bfor\s+[A-Za-z_][\w\s,()]*\bin\s+" + _GRID, re.IGNORECASE)
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
                    r"|\bpretrained\s*=\s*(?:True\b|[\"'](?!none[\"'])\w)"  # timm/torchvision; open_clip's tag names
                    r"|\bweights\s*=\s*(?:\w+_Weights\.|[\"'](?:DEFAULT|(?i:imagenet)))"  # torchvision; Keras
                    r"|\bencoder_weights\s*=\s*[\"']\w"  # segmentation_models_pytorch
                    r"|\bgdown\.download\w*\s*\(|\bbundle\.download\s*\(|\bkaggle\s+(?:datasets|competitions)\s+download"
                    r"|\bdownload_\w*(?:weights|checkpoint|pretrained)\w*\s*\(")


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
                        r"|\bwindow_?(?:level|width|center|centre|min|max)\w*\s*=|\bHU_?\w*\s*=|\bhounsfield"
                        r"|\b(?:WL|WW|window)\s*=\s*[\[(]?\s*-?\d"  # WL, WW = 40, 400; window = (-160, 240)
                        r"|\bout_min\s*=\s*-\s*\d{3,4}|\bin_min_max\s*=\s*\(\s*-\s*\d{3,4}"  # torchio Clamp, Rescale
                        r"|[<>]=?\s*-\s*\d{3,4}(?:\.\d*)?\s*\]\s*=\s*-?\s*\d"  # img[img < -1000] = -1000
                        r"|\bRescale(?:Slope|Intercept)\b",  # DICOM pixel values to Hounsfield units
                        re.IGNORECASE)
_RESAMPLE = re.compile(r"\bSpacingd?\s*\(|\b(?:sitk|tio)\.Resample\s*\(|\bResampleImageFilter\s*\("
                       r"|\bSetOutputSpacing\s*\(|\bresample\w*\s*\(|\bzoom\s*\(.*\b(?:spacing|zooms|pixdim)\b")
_MR_NORMALISE = re.compile(r"\bNormalizeIntensityd?\s*\(|\bZNormalization\s*\(|\bN4BiasFieldCorrection\w*\s*\("
                           r"|\bHistogramStandardization\s*\(|\bn4_bias_field_correction\s*\("
                           r"|\b(?:ZScore|WhiteStripe|FCM|Nyul|KDE)Normali[sz]e\s*\("  # intensity-normalization
                           r"|\bScaleIntensityRangePercentilesd?\s*\("
                           r"|\bclip\s*\(\s*(\w+)\s*,\s*np\.percentile\s*\(\s*\1\b"  # per-volume percentile clipping
                           r"|\(\s*(\w+)\s*-\s*np\.mean\s*\(\s*\2\b[^)]*\)\s*\)\s*/\s*\(?\s*np\.std\s*\(\s*\2\b"
                           r"|\(\s*(\w+)(?:\[[^\]]*\])?\s*-\s*\3(?:\[[^\]]*\])?\.mean\s*\(\s*\)\s*\)\s*/\s*\(?\s*"
                           r"\3(?:\[[^\]]*\])?\.std\s*\(")


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
        if proven:
            shown = next(q for q in evidence if q.verified)
            reason = f"found: {detector.scope} (node {shown.node}: {shown.rule or 'its output'})"
        else:
            partial = [n.id for n in run.nodes if n.ran and n.code and n.reach.lines is not None]
            reason = f"not found: {detector.scope}" + (
                f" (the code of node(s) {', '.join(map(str, partial[:10]))}{' ...' if len(partial) > 10 else ''} "
                "counted only up to where its run crashed, or not at all)" if partial else "")
        verdicts.append(FactorVerdict(
            status="demonstrated" if proven else "not_demonstrated", demonstrated=proven, evidence=evidence,
            reason=reason, **common))
    return verdicts
