"""Deterministic detectors: on the example runs (real harness runs whose code does or does not augment, ensemble,
post-process, search, fetch or window), and on code made here for the cases a detector must not be fooled by."""

from __future__ import annotations

import pytest

from rexmle_agents.analysis.detectors import DETECTED_FACTORS, detect
from rexmle_agents.analysis.evidence import run_text
from rexmle_agents.analysis.factors import load_rubrics

CT = "low-dose abdominal CT (single slices)"
MR = "MRI (DWI b=1000, ADC, FLAIR)"
RUBRIC = load_rubrics().label
FOUND = {  # example -> the factors its detectors must find (every other detected factor must not be found)
    "ldct-plain": set(),
    "ldct-rich": {"data_augmentation", "seed_fold_ensembles", "hyperparameter_search", "domain_knowledge"},
    "isles-threshold": {"post_processing", "domain_knowledge"},
    "isles-failures": set(),  # its download failed: no network in the sandbox
    "ldct-sample": set(),
}


def verdicts_of(run, modality):
    return {v.factor: v for v in detect(run, modality, RUBRIC)}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_detectors_find_what_the_example_code_does_and_nothing_else(example_runs, name) -> None:
    run = example_runs[name]
    modality = MR if run.spec.task_id == "isles22" else CT
    verdicts = verdicts_of(run_text(run), modality)
    assert set(verdicts) == set(DETECTED_FACTORS)
    found = {f for f, v in verdicts.items() if v.demonstrated}
    assert found == FOUND[name]
    for factor in found:  # evidence is quoted from code that ran, and checked like the judge's
        assert verdicts[factor].evidence and all(q.verified and q.where == "code" for q in verdicts[factor].evidence)
        assert verdicts[factor].detector and verdicts[factor].detector_version


def test_clipping_predictions_into_range_is_not_post_processing(example_runs) -> None:
    text = run_text(example_runs["ldct-plain"])
    assert "np.clip(" in text.nodes[-1].code
    assert not verdicts_of(text, CT)["post_processing"].demonstrated


def test_comments_and_code_that_never_ran_prove_nothing(code_run) -> None:
    run = code_run({"code": "# TODO: RandFlipd(keys=['image'], prob=0.5) and a 5-fold ensemble\nprint('hi')\n"},
                   {"code": "from scipy import ndimage\nlabels, n = ndimage.label(mask)\n", "ran": False})
    verdicts = verdicts_of(run, CT)
    assert not verdicts["data_augmentation"].demonstrated
    assert not verdicts["post_processing"].demonstrated


@pytest.mark.parametrize(("code", "factor", "expected"), [
    ("t = Compose([RandFlipd(keys=['image'], prob=0.5), RandGaussianNoised(keys=['image'])])\n",
     "data_augmentation", True),
    ("aug = transforms.RandomHorizontalFlip(p=0.5)\n", "data_augmentation", True),
    ("image = np.fliplr(image)  # test-time flip, no random draw\n", "data_augmentation", False),
    ("rng = np.random.default_rng()\nmodel = np.random.RandomState(0)\n", "data_augmentation", False),
    ("for fold in range(5):\n    scores.append(train(fold))\nprint(np.mean(fold_dice))\n", "seed_fold_ensembles",
     False),
    ("for seed in SEEDS:\n    preds.append(fit(seed).predict(x))\nfinal = np.mean(preds, axis=0)\n",
     "seed_fold_ensembles", True),
    ("for epoch in range(100):\n    loss = step()\n    best_loss = min(best_loss, loss)\n", "hyperparameter_search",
     False),
    ("for lr in [1e-3, 3e-4, 1e-4]:\n    score = run(lr)\n    if score > best:\n        best = score\n",
     "hyperparameter_search", True),
    ("study = optuna.create_study(direction='maximize')\n", "hyperparameter_search", True),
    ("mask = remove_small_objects(mask, 10)\n", "post_processing", True),
    ("x = np.clip(image, -1, 1)\n", "domain_knowledge", False),
    ("x = np.clip(image, -1000, 400)\n", "domain_knowledge", True),
])
def test_detector_patterns(code_run, code, factor, expected) -> None:
    assert verdicts_of(code_run({"code": code}), CT)[factor].demonstrated is expected


def test_a_download_counts_only_when_its_run_did_not_fail_on_the_network(code_run) -> None:
    code = "import timm\nmodel = timm.create_model('convnext_tiny', pretrained=True)\n"
    failed = code_run({"code": code, "exit_code": 1,
                       "output": "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name "
                                 "resolution>"})
    cached = code_run({"code": code, "output": "fine-tuning convnext_tiny\nVALIDATION_METRIC: 0.8"})
    assert not verdicts_of(failed, CT)["external_data"].demonstrated
    assert verdicts_of(cached, CT)["external_data"].demonstrated


def test_the_ct_mr_detector_applies_to_ct_and_mr_only(code_run) -> None:
    run = code_run({"code": "x = (img - img.mean()) / img.std()\n"})
    assert verdicts_of(run, "H&E histopathology (melanoma ROIs)")["domain_knowledge"].status == "not_applicable"
    assert verdicts_of(run, MR)["domain_knowledge"].demonstrated  # per-volume z-score: MR practice
    assert not verdicts_of(run, CT)["domain_knowledge"].demonstrated  # not a Hounsfield window
