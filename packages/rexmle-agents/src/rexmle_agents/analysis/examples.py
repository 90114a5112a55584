"""Labelled example runs, so that ``rexmle analyse`` and ``rexmle analyse agreement`` can be tried offline.

Five real run folders, made by the real harness in bubblewrap on synthetic data with scripted models (no language
model was involved), ship in ``assets/example_runs.json`` (spec, status, grade and journal of each run; a journal
keeps only the last saved search tree, which is all that readers use). Two sets of human labels
(``assets/example_labels.csv``) were written by rexmle's developers from the rubrics; they exist to exercise the
agreement command and say nothing about any judge.

* ``ldct-plain`` (aide, ldct-iqa): an import error, then a ridge regression on noise features;
* ``ldct-rich`` (aide, ldct-iqa, seed 1): HU window and flip augmentation; then 5 folds x (ridge + k-NN) averaged,
  a penalty search by the challenge's score, rounding to the labels' grid, a feature cache;
* ``isles-threshold`` (aide, isles22): stacks FLAIR with DWI (shape mismatch); then DWI z-scored in the brain, a
  DWI/ADC threshold, small components removed, per-case Dice printed worst first;
* ``isles-failures`` (rdloop, isles22): a download of weights (no network), a submission missing a case, a training
  that runs out of time;
* ``ldct-sample`` (sample, ldct-iqa): no code, the sample submission.

``rexmle analyse examples OUT`` unpacks them, analyses them with :class:`ExampleJudge` (a scripted stand-in that
matches keywords, recorded as the judge ``scripted/example-judge``: it makes the mistakes a careless judge makes,
such as counting a failed download as external data) and prints the agreement table.
``python -m rexmle_agents.analysis.examples --write`` makes the runs again (needs bubblewrap) and rewrites the
bundle; the labels then need checking by hand if node numbers changed.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rexmle_agents.analysis.factors import ASSETS
from rexmle_agents.models.types import Message, ModelResponse, ToolCall, ToolSpec, Usage
from rexmle_grade.errors import UserInputError

EXAMPLE_GROUP = "examples"
# pins the synthetic mirrors of the example runs (public: these runs are examples, never results)
EXAMPLE_SECRET = "rexmle-example-runs"
BUNDLE_FILE = "example_runs.json"
LABELS_FILE = "example_labels.csv"
EXAMPLE_JUDGE = "scripted/example-judge"
RUN_FILES = ("spec.json", "status.json", "grade.json", "journal.jsonl")

# ---------------------------------------------------------------------------------------------------------------
# the code the scripted agents "write" (run for real in the sandbox)

LDCT_IMPORT_ERROR = '''import csv
from pathlib import Path

import lightgbm as lgb
import numpy as np

data = Path("../data")
rows = list(csv.DictReader((data / "train" / "labels.csv").open()))
print("training a gradient-boosted regressor on", len(rows), "slices")
'''

LDCT_PLAIN = '''import csv
import os
from pathlib import Path

import numpy as np
import tifffile

data = Path("../data")
out = Path(os.environ["SUBMISSION_DIR"])


def features(path):
    image = tifffile.imread(path).astype(float)
    residual = image[1:, :] - image[:-1, :]
    return [1.0, float(np.log(np.median(np.abs(residual)) + 1e-6)), float(image.std())]


rows = list(csv.DictReader((data / "train" / "labels.csv").open()))
x = np.array([features(data / "train" / "images" / (r["image_id"] + ".tif")) for r in rows])
y = np.array([float(r["quality_score"]) for r in rows])
cut = len(rows) * 2 // 3
w = np.linalg.solve(x[:cut].T @ x[:cut] + np.eye(3), x[:cut].T @ y[:cut])
pred = x[cut:] @ w
corr = float(np.corrcoef(pred, y[cut:])[0, 1]) if pred.std() > 0 else 0.0
print("VALIDATION_METRIC:", round(corr, 6))
w = np.linalg.solve(x.T @ x + np.eye(3), x.T @ y)
test_ids = [r["image_id"] for r in csv.DictReader((data / "sample_submission" / "submission.csv").open())]
with (out / "submission.csv").open("w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(["image_id", "quality_score"])
    for case in test_ids:
        value = float(np.clip(np.array(features(data / "test" / "images" / (case + ".tif"))) @ w, 0, 4))
        writer.writerow([case, round(value, 4)])
'''

_LDCT_WINDOW = '''

def to_hu(image):
    # the slices are stored as (HU + 1024) / 4096
    return image.astype(float) * 4096.0 - 1024.0


def features(image):
    soft = np.clip(to_hu(image), -160, 240)  # abdominal soft-tissue window
    residual = soft[1:, :] - soft[:-1, :]
    return [1.0, float(np.log(np.median(np.abs(residual)) + 1e-6)), float(soft.std())]


def augment(image):
    if rng.random() < 0.5:
        image = np.fliplr(image)
    if rng.random() < 0.5:
        image = np.flipud(image)
    return image
'''

LDCT_WINDOW_FLIPS = '''import csv
import os
from pathlib import Path

import numpy as np
import tifffile

data = Path("../data")
out = Path(os.environ["SUBMISSION_DIR"])
rng = np.random.default_rng(0)
''' + _LDCT_WINDOW + '''

rows = list(csv.DictReader((data / "train" / "labels.csv").open()))
images = {r["image_id"]: tifffile.imread(data / "train" / "images" / (r["image_id"] + ".tif")) for r in rows}
cut = len(rows) * 2 // 3
x, y = [], []
for r in rows[:cut]:
    for _ in range(4):
        x.append(features(augment(images[r["image_id"]])))
        y.append(float(r["quality_score"]))
x, y = np.array(x), np.array(y)
w = np.linalg.solve(x.T @ x + np.eye(3), x.T @ y)
xv = np.array([features(images[r["image_id"]]) for r in rows[cut:]])
yv = np.array([float(r["quality_score"]) for r in rows[cut:]])
pred = xv @ w
corr = float(np.corrcoef(pred, yv)[0, 1]) if pred.std() > 0 else 0.0
print("VALIDATION_METRIC:", round(corr, 6))
test_ids = [r["image_id"] for r in csv.DictReader((data / "sample_submission" / "submission.csv").open())]
with (out / "submission.csv").open("w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(["image_id", "quality_score"])
    for case in test_ids:
        value = np.array(features(tifffile.imread(data / "test" / "images" / (case + ".tif")))) @ w
        writer.writerow([case, round(float(np.clip(value, 0, 4)), 4)])
'''

LDCT_ENSEMBLE = '''import csv
import os
from pathlib import Path

import numpy as np
import tifffile
from scipy import stats

data = Path("../data")
out = Path(os.environ["SUBMISSION_DIR"])
cache = Path("features.npz")
rng = np.random.default_rng(0)
N_FOLDS = 5
ALPHAS = (0.01, 0.1, 1.0, 10.0)
''' + _LDCT_WINDOW + '''

def challenge_score(pred, truth):
    # the leaderboard's score: |PLCC| + |SROCC| + |KROCC| over all slices
    parts = (stats.pearsonr(pred, truth)[0], stats.spearmanr(pred, truth)[0], stats.kendalltau(pred, truth)[0])
    return float(sum(abs(np.nan_to_num(p)) for p in parts))


def fit(x, y, alpha):
    return np.linalg.solve(x.T @ x + alpha * np.eye(x.shape[1]), x.T @ y)


def knn(x_train, y_train, x_new, k=3):
    distance = ((x_new[:, None, 1:] - x_train[None, :, 1:]) ** 2).sum(-1)
    return y_train[np.argsort(distance, axis=1)[:, :k]].mean(axis=1)


rows = list(csv.DictReader((data / "train" / "labels.csv").open()))
images = {r["image_id"]: tifffile.imread(data / "train" / "images" / (r["image_id"] + ".tif")) for r in rows}
blank = [case for case, image in images.items() if float(image.std()) < 1e-6]
print("blank slices dropped:", blank)
rows = [r for r in rows if r["image_id"] not in blank]
y_all = np.array([float(r["quality_score"]) for r in rows])
if cache.exists():
    x_all = np.load(cache)["x"]
else:
    x_all = np.array([features(images[r["image_id"]]) for r in rows])
    np.savez(cache, x=x_all)
folds = np.array_split(rng.permutation(len(rows)), N_FOLDS)


def augmented(indices):
    x = [features(augment(images[rows[i]["image_id"]])) for i in indices for _ in range(4)]
    return np.array(x), np.repeat(y_all[indices], 4)


best_alpha, best_score = None, -np.inf
for alpha in ALPHAS:
    oof = np.zeros(len(rows))
    for fold in range(N_FOLDS):
        train = np.concatenate([f for k, f in enumerate(folds) if k != fold])
        x_train, y_train = augmented(train)
        oof[folds[fold]] = x_all[folds[fold]] @ fit(x_train, y_train, alpha)
    score = challenge_score(oof, y_all)
    print(f"alpha {alpha}: cross-validated challenge score {score:.4f}")
    if score > best_score:
        best_alpha, best_score = alpha, score
print("VALIDATION_METRIC:", round(best_score, 6))

test_ids = [r["image_id"] for r in csv.DictReader((data / "sample_submission" / "submission.csv").open())]
x_test = np.array([features(tifffile.imread(data / "test" / "images" / (case + ".tif"))) for case in test_ids])
test_preds = []
for fold in range(N_FOLDS):
    train = np.concatenate([f for k, f in enumerate(folds) if k != fold])
    x_train, y_train = augmented(train)
    ridge = x_test @ fit(x_train, y_train, best_alpha)
    near = knn(x_train, y_train, x_test)
    test_preds.append((ridge + near) / 2)  # two model families: ridge regression and k nearest neighbours
pred = np.mean(test_preds, axis=0)
pred = np.round(np.clip(pred, 0, 4) / 0.2) * 0.2  # the labels lie on a 0.2 grid
with (out / "submission.csv").open("w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(["image_id", "quality_score"])
    for case, value in zip(test_ids, pred):
        writer.writerow([case, round(float(value), 4)])
'''

ISLES_STACK_FLAIR = '''from pathlib import Path

import nibabel as nib
import numpy as np

data = Path("../data")
cases = sorted(p.name[: -len(".nii.gz")] for p in (data / "train" / "labels").glob("*.nii.gz"))
case = cases[0]
dwi = nib.load(data / "train" / "images" / f"{case}_0000.nii.gz").get_fdata()
flair = nib.load(data / "train" / "flair" / f"{case}_flair.nii.gz").get_fdata()
x = np.stack([dwi, flair])  # DWI and FLAIR as two input channels
print("input", x.shape)
'''

ISLES_THRESHOLD = '''import csv
import os
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

data = Path("../data")
out = Path(os.environ["SUBMISSION_DIR"])
MIN_VOXELS = 3


def segment(case, split):
    dwi_image = nib.load(data / split / "images" / f"{case}_0000.nii.gz")
    dwi = dwi_image.get_fdata()
    adc = nib.load(data / split / "images" / f"{case}_0001.nii.gz").get_fdata()
    brain = dwi > 0  # the volumes are skull-stripped: the brain is where DWI is non-zero
    z = (dwi - dwi[brain].mean()) / (dwi[brain].std() + 1e-6)
    # acute infarcts are bright on DWI and dark on ADC
    mask = (z > 2.5) & (adc < np.percentile(adc[brain], 30)) & brain
    labels, count = ndimage.label(mask)
    sizes = ndimage.sum(mask, labels, range(1, count + 1))
    keep = np.isin(labels, 1 + np.flatnonzero(sizes >= MIN_VOXELS))
    return keep.astype(np.uint8), dwi_image


def dice(a, b):
    total = a.sum() + b.sum()
    return 1.0 if total == 0 else 2.0 * (a & b).sum() / total


cases = sorted(p.name[: -len(".nii.gz")] for p in (data / "train" / "labels").glob("*.nii.gz"))
results = []
for case in cases:
    pred, _ = segment(case, "train")
    truth = nib.load(data / "train" / "labels" / f"{case}.nii.gz").get_fdata() > 0
    results.append((dice(pred > 0, truth), int(truth.sum()), case))
print("worst cases first (dice, lesion voxels):")
for value, volume, case in sorted(results)[:3]:
    print(f"  {case}: dice {value:.3f}, lesion {volume} voxels")
print("VALIDATION_METRIC:", round(float(np.mean([r[0] for r in results])), 6))

rows = list(csv.DictReader((data / "sample_submission" / "submission.csv").open()))
(out / "predictions").mkdir()
with (out / "submission.csv").open("w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(["case_id", "predicted_mask_path"])
    for row in rows:
        case = row["case_id"]
        pred, reference = segment(case, "test")
        image = nib.Nifti1Image(pred, reference.affine, reference.header)
        image.set_data_dtype(np.uint8)
        nib.save(image, out / "predictions" / f"{case}_pred.nii.gz")
        writer.writerow([case, f"predictions/{case}_pred.nii.gz"])
'''

ISLES_DOWNLOAD = '''import urllib.request
from pathlib import Path

WEIGHTS = "https://example.org/isles22/nnunet_fold0.pth"
Path("weights").mkdir(exist_ok=True)
urllib.request.urlretrieve(WEIGHTS, "weights/fold0.pth")  # pretrained stroke-lesion weights
print("pretrained weights loaded")
'''

ISLES_ONE_CASE = '''import csv
import os
from pathlib import Path

import nibabel as nib
import numpy as np

data = Path("../data")
out = Path(os.environ["SUBMISSION_DIR"])
rows = list(csv.DictReader((data / "sample_submission" / "submission.csv").open()))
(out / "predictions").mkdir()
first = rows[0]["case_id"]
reference = nib.load(data / "test" / "images" / f"{first}_0000.nii.gz")
image = nib.Nifti1Image(np.zeros(reference.shape, np.uint8), reference.affine, reference.header)
image.set_data_dtype(np.uint8)
nib.save(image, out / "predictions" / f"{first}_pred.nii.gz")
with (out / "submission.csv").open("w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(["case_id", "predicted_mask_path"])
    writer.writerow([first, f"predictions/{first}_pred.nii.gz"])
print("VALIDATION_METRIC:", 0.0)
'''

ISLES_SLOW = '''import time

print("training a 3-D U-Net from scratch", flush=True)
for epoch in range(1000):
    time.sleep(1)
    print(f"epoch {epoch}", flush=True)
'''


@dataclass(frozen=True)
class ExampleRun:
    name: str
    task: str
    agent: str
    config: dict[str, Any] = field(default_factory=dict)
    drafts: tuple[str, ...] = ()
    debugs: tuple[str, ...] = ()
    improves: tuple[str, ...] = ()
    exec_timeout_s: float = 60.0
    seed: int = 0  # runs of one agent on one task differ by seed (the run id does not hash the scripts)


EXAMPLES: tuple[ExampleRun, ...] = (
    ExampleRun("ldct-plain", "ldct-iqa", "aide", {"num_drafts": 1, "debug_prob": 1.0, "max_nodes": 2},
               drafts=(LDCT_IMPORT_ERROR,), debugs=(LDCT_PLAIN,)),
    ExampleRun("ldct-rich", "ldct-iqa", "aide", {"num_drafts": 1, "debug_prob": 1.0, "max_nodes": 2},
               drafts=(LDCT_WINDOW_FLIPS,), improves=(LDCT_ENSEMBLE,), seed=1),
    ExampleRun("isles-threshold", "isles22", "aide", {"num_drafts": 1, "debug_prob": 1.0, "max_nodes": 2},
               drafts=(ISLES_STACK_FLAIR,), debugs=(ISLES_THRESHOLD,)),
    ExampleRun("isles-failures", "isles22", "rdloop", {"max_nodes": 3, "max_debug_depth": 2},
               drafts=(ISLES_DOWNLOAD,), debugs=(ISLES_ONE_CASE, ISLES_SLOW), exec_timeout_s=4.0),
    ExampleRun("ldct-sample", "ldct-iqa", "sample"),
)

# ---------------------------------------------------------------------------------------------------------------
# the scripted model that plays the scaffolds' model roles

_METRIC = re.compile(r"VALIDATION_METRIC:\s*(-?[0-9.]+(?:e-?\d+)?)")
_HEADINGS = (("# Your job: a first solution", "draft"), ("# Your job: fix", "debug"),
             ("# Your job: improve", "improve"),
             ("# Review one execution", "review"), ("# Your job: propose the next hypothesis", "hypothesise"))


def _tool(call_id: str, name: str, arguments: dict[str, Any], model: str) -> ModelResponse:
    return ModelResponse(tool_calls=(ToolCall(id=call_id, name=name, arguments=arguments),), model=model,
                         finish_reason="tool_calls")


class ScriptedCoder:
    """A function of the request for ``ScriptedBackend``: hands out an example's scripts by operator (drafts, debug
    fixes, improvements, in order) and reviews executions from their exit status and metric line, by tool call."""

    def __init__(self, example: ExampleRun, name: str = "scripted/model") -> None:
        self.example = example
        self.name = name
        self.counts: dict[str, int] = {}

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: object) -> ModelResponse:
        prompt = next(m.content for m in reversed(messages) if m.role == "user")
        kind = next((k for heading, k in _HEADINGS if prompt.lstrip().startswith(heading)), "feedback")
        number = self.counts.get(kind, 0)
        self.counts[kind] = number + 1
        call_id = f"call-{sum(self.counts.values())}"
        scripts = {"draft": self.example.drafts, "debug": self.example.debugs, "improve": self.example.improves}
        if kind in scripts:
            options = scripts[kind] or self.example.drafts
            code = options[min(number, len(options) - 1)]
            return ModelResponse(text=f"Plan {kind} {number}.\n\n```python\n{code}```\n", model=self.name)
        if kind == "review":
            execution = prompt.split("## Execution", 1)[1].split("##", 1)[0]
            found = _METRIC.search(prompt.rsplit("## Output (tail)", 1)[-1])
            ok = "exit status 0" in execution and "the submission is valid" in prompt
            return _tool(call_id, "submit_review", {"is_bug": not ok or found is None,
                                                    "metric": float(found.group(1)) if found else None,
                                                    "lower_is_better": False, "summary": "scripted review"},
                         self.name)
        if kind == "hypothesise":
            return _tool(call_id, "propose_hypothesis", {"hypothesis": f"pretrained weights help ({number})",
                                                         "rationale": "little training data"}, self.name)
        return _tool(call_id, "submit_feedback", {"supported": False, "observations": "scripted",
                                                  "lesson": f"lesson {number}", "replace_best": False}, self.name)


# ---------------------------------------------------------------------------------------------------------------
# the scripted judge of the examples (and of the tests)

_FACTOR_ASKED = re.compile(r"demonstrate the practice `(\w+)`")
_NODE_BLOCK = re.compile(r"^===== node (\d+) · .*?^===== end of node \1 =====$", re.MULTILINE | re.DOTALL)
_SECTION = re.compile(r"^----- (code|output) of node \d+ \(([^)]*)\)", re.MULTILINE)
# what the example judge takes for each factor: a line of code or output matching the pattern (its mistake is on
# purpose: a failed download is not external data)
KEYWORDS: dict[str, re.Pattern[str]] = {
    "failure_analysis": re.compile(r"worst cases", re.IGNORECASE),
    "metric_aware_design": re.compile(r"stats\.spearmanr"),
    "domain_knowledge": re.compile(r"soft-tissue window|\bbrain\]\.mean|bright on DWI", re.IGNORECASE),
    "fast_iteration": re.compile(r"np\.load\(cache\)"),
    "data_augmentation": re.compile(r"np\.flip(?:lr|ud)\("),
    "expert_priors": re.compile(r"& brain\b"),
    "data_curation": re.compile(r"blank slices dropped|rows = \[r for r in rows if"),
    "post_processing": re.compile(r"ndimage\.label\(|np\.round\("),
    "heterogeneous_ensembles": re.compile(r"\(ridge \+ near\) / 2"),
    "external_data": re.compile(r"urlretrieve\(|pretrained=True"),
    "seed_fold_ensembles": re.compile(r"test_preds\.append\("),
    "hyperparameter_search": re.compile(r"for alpha in ALPHAS"),
}
PARAPHRASED = {"seed_fold_ensembles": "the test predictions of the five folds are averaged"}


class ExampleJudge:
    """A keyword-matching stand-in for a judge model (for ``ScriptedBackend``): it quotes the first line of code that
    ran (or of output) matching the factor's keyword. Deliberately imperfect, to show what the checks catch and
    what they cannot: it paraphrases instead of quoting for seed/fold ensembles (the quote check rejects that), it
    answers in prose once per data-curation question (asked again, it answers properly), and its keywords count a
    failed download as external data (a verified quote, a wrong verdict: only agreement with people finds that)."""

    def __init__(self, name: str = EXAMPLE_JUDGE) -> None:
        self.name = name

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: object) -> ModelResponse:
        prompt = messages[1].content if len(messages) > 1 else ""
        asked = _FACTOR_ASKED.search(prompt)
        factor = asked.group(1) if asked else ""
        usage = Usage(input_tokens=sum(len(m.content) for m in messages) // 4, output_tokens=60)
        if factor == "data_curation" and len(messages) == 2:
            return ModelResponse(text="Probably yes: the data look curated.", usage=usage, model=self.name)
        evidence = []
        pattern = KEYWORDS.get(factor)
        for match in _NODE_BLOCK.finditer(prompt if pattern else ""):
            node = int(match.group(1))
            for line in _lines_that_count(match.group(0)):
                if pattern is not None and pattern.search(line) and len(line.strip()) >= 10:
                    evidence.append({"node": node, "quote": line.strip()})
                    break
            if evidence:
                break
        if evidence and factor in PARAPHRASED:
            evidence = [{"node": evidence[0]["node"], "quote": PARAPHRASED[factor]}]
        arguments = {"demonstrated": bool(evidence), "evidence": evidence,
                     "reason": f"matched {pattern.pattern!r}" if evidence and pattern else "no matching line"}
        return ModelResponse(tool_calls=(ToolCall(id=f"verdict-{factor}", name="submit_verdict",
                                                  arguments=arguments),),
                             usage=usage, model=self.name, finish_reason="tool_calls")


def _lines_that_count(block: str) -> list[str]:
    """The lines of a rendered node's code that ran, and of its outputs."""
    lines: list[str] = []
    sections = list(_SECTION.finditer(block))
    for i, section in enumerate(sections):
        end = sections[i + 1].start() if i + 1 < len(sections) else block.rfind("===== end of node")
        if section.group(1) == "code" and not section.group(2).startswith(("ran", "what ran")):
            continue
        lines += block[section.end():end].splitlines()[1:]
    return lines


# ---------------------------------------------------------------------------------------------------------------
# making, packing and unpacking the example runs


def make_example_runs(runs_dir: Path, data_root: Path, *, sandbox: str = "bwrap",
                      names: Sequence[str] | None = None) -> list[Path]:
    """Run the examples (all, or those ``names``) through the real harness, preparing their synthetic tasks under
    ``data_root`` first."""
    chosen = [e for e in EXAMPLES if names is None or e.name in names]
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.harness.spec import Limits
    from rexmle_agents.models import Model, RetryPolicy, ScriptedBackend
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    for task_id in sorted({e.task for e in chosen}):
        task = get_task(task_id)
        # the shipped runs are references: their data (and so their run ids and verdicts) must come back the same
        prepare_task(task, task_dirs(task, data_root), synthetic=True, cases=10, seed=0, force=False,
                     secret=EXAMPLE_SECRET)
    made = []
    for example in chosen:
        limits = Limits(time_limit_s=300, exec_timeout_s=example.exec_timeout_s)
        scaffold = example.agent != "sample"
        spec = build_spec(example.task, agent=example.agent, agent_config=dict(example.config),
                          models={"code": "scripted/model"} if scaffold else None, seed=example.seed,
                          limits=limits,
                          sandbox=sandbox, data_root=data_root, group=EXAMPLE_GROUP)
        models = {"code": Model(ScriptedBackend(ScriptedCoder(example)), retry=RetryPolicy(max_attempts=1))} \
            if scaffold else None
        outcome = execute_run(spec, runs_dir, models=models, grace_s=5.0)
        made.append(outcome.run_dir)
    return made


def pack(run_dirs: Sequence[Path]) -> dict[str, Any]:
    """The shipped form of run folders: their records, each journal keeping per key only the last full agent state
    and the deltas saved after it (what :meth:`Tree.from_states` folds)."""
    runs = []
    for run_dir in run_dirs:
        files = {}
        for name in RUN_FILES:
            path = run_dir / name
            if path.is_file():
                text = path.read_text(encoding="utf-8")
                files[name] = _compact_journal(text) if name == "journal.jsonl" else text
        runs.append({"run_id": run_dir.name, "files": files})
    return {"format": 1, "group": EXAMPLE_GROUP, "runs": runs}


def _compact_journal(text: str) -> str:
    lines = text.splitlines()
    saved: dict[str, list[tuple[int, bool]]] = {}  # key -> (line number, is a delta) of each state saved
    for number, line in enumerate(lines):
        if line.startswith(('{"kind": "agent_state"', '{"kind":"agent_state"')):
            event = json.loads(line)
            state = event.get("state")
            saved.setdefault(event["key"], []).append((number, isinstance(state, dict) and bool(state.get("delta"))))
    keep: set[int] = set()
    for states in saved.values():
        full = max((i for i, (_, delta) in enumerate(states) if not delta), default=0)
        keep.update(number for number, _ in states[full:])
    return "".join(line + "\n" for number, line in enumerate(lines)
                   if number in keep or not line.startswith(('{"kind": "agent_state"', '{"kind":"agent_state"')))


def unpack(dest: Path) -> Path:
    """The shipped example runs as run folders under ``dest/examples/``; returns that group folder."""
    bundle = json.loads(resources.files(ASSETS).joinpath(BUNDLE_FILE).read_text(encoding="utf-8"))
    group = dest / bundle["group"]
    for run in bundle["runs"]:
        folder = group / run["run_id"]
        if folder.exists() and not (folder / "spec.json").is_file():
            raise UserInputError(f"{folder} exists and is not a run folder", hint="unpack the examples elsewhere")
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in run["files"].items():
            (folder / name).write_text(text, encoding="utf-8")
    return group


def example_labels(dest: Path) -> Path:
    """The shipped human labels, copied to ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(resources.files(ASSETS).joinpath(LABELS_FILE).read_bytes())
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rexmle_agents.analysis.examples --write [--keep DIR]``: make the example runs again and rewrite
    the shipped bundle."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--write" not in args:
        print(main.__doc__)
        return 2
    keep = Path(args[args.index("--keep") + 1]) if "--keep" in args else None
    work = Path(tempfile.mkdtemp(prefix="rexmle-examples-"))
    try:
        made = make_example_runs(work / "runs", work / "data")
        target = Path(str(resources.files(ASSETS).joinpath(BUNDLE_FILE)))
        target.write_text(json.dumps(pack(made), indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {target} ({target.stat().st_size / 1e3:.0f} kB): " + ", ".join(p.name for p in made))
        if keep is not None:
            shutil.copytree(work / "runs", keep, dirs_exist_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
