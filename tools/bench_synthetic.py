#!/usr/bin/env python
"""Can the synthetic mirrors tell scaffolds apart? Per task and difficulty (``easy``, ``realistic``): the final test
score of each scaffold preset, driven by a realistic-style scripted model, against the sample submission and the
quick CPU baseline of rexmle-baselines; and a drafts-only control (``no-search``: AIDE's policy with every node a
draft, so nothing is debugged or improved).

The realistic-style model writes real solutions in four levels per task and behaves like the imperfect model
server of issue 21's check: first drafts are the simplest method (an image statistic, a threshold) and some carry
a realistic first-draft bug (a wrong column name, a missing file suffix, the submission written to the wrong
folder); a debug fixes the bug of the script it is shown; an improvement moves the script one level up (the first
improvement to a trained model carries a bug again); a merge takes the higher level of its parents one level up;
an improvement of a script it has improved before tries a bigger step (one more level per earlier try from that
level), as a model that sees its sibling's result would; reviews report the printed metric honestly. The levels:

- LDCT-IQA: 0 the image's standard deviation (one statistic) and a line; 1 multi-scale noise residuals + ridge;
  2 + tissue high-pass, Laplacian and spectral bands; 3 the same features with gradient boosting.
- ISLES'22: 0 one global DWI threshold; 1 per-case normalised DWI and ADC thresholds; 2 a voxel classifier
  (gradient boosting) on bias-corrected multi-scale DWI/ADC and the distance to the brain's edge; 3 + removal of
  one-voxel components and a tuned probability threshold.
- DENTEX: 0 each tooth's mean training box relative to the whole X-ray, with its commonest diagnosis, scored by how
  often it was abnormal; 1 the same in the frame of the X-ray's brightest pixels (the teeth); 2 + each box scored by
  a logistic regression on its contrast, texture and darkness; 3 + the diagnosis from a random forest on the same.
  The validation metric is AP at IoU 0.5 of (quadrant, tooth, diagnosis) boxes on a third of the training X-rays.
- USenhance: 0 the low-quality image as it is; 1 a Gaussian filter of the width with the best training LNCC; 2 a
  least-squares per-pixel blend of Gaussian and median filters of the input; 3 the same features and the local
  standard deviation with gradient boosting.
- Every other segmentation-type task (TopCoW, TopBrain, PANTHER, SEG.A., PUMA, NeurIPS CellSeg, RAVIR; one script
  that reads and writes through ``rexmle_baselines.convert.segmentation_io``, so boxes, edge lists, instances and
  nuclei come out in each task's own format; the validation metric is the mean foreground-class Dice on the last
  third of the training cases): 0 the brightest or darkest fraction of each image is the most common foreground
  class (rule fitted on the training Dice); 1 + each foreground voxel takes the class whose training voxels lie
  nearest on average (normalised coordinates); 2 a voxel classifier (gradient boosting) on multi-scale standardised
  intensities and position; 3 + a coarser scale, gradient magnitude and more boosting rounds.

The difficulty ladder of every task (issue 36): per task, on its ``realistic`` mirror (``--ladder-difficulties``),
the sample submission, the task's simple heuristic (``rexmle baselines run heuristic``) and its trained quick rung
(:mod:`rexmle_baselines.ladder`), each graded on the hidden test labels by the task's grader with its validation
metric; the drafts-only control comes from the scaffold runs where they were made (``--tasks``, on the ladder's
mirror, so ``--tasks T --presets no-search --no-baseline --ladder-tasks T`` fills a row's control). With ``--keep DIR``
each measured ladder and scaffold run is stored in DIR and read back by a later invocation instead of measured
again, so the tables can be filled task by task.

    python tools/bench_synthetic.py [--tasks ldct-iqa,isles22] [--difficulties easy,realistic] [--nodes 8]
        [--presets no-search,aide,mcts,rdloop,evo] [--no-baseline] [--keep DIR]
        [--ladder-tasks all|none|T1,T2] [--ladder-difficulties realistic] [--no-scaffolds]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Message, Model, ModelResponse, RetryPolicy, ScriptedBackend, ToolCall, ToolSpec
from rexmle_grade.evaluate import evaluate_submission
from rexmle_grade.targets import resolve_target
from rexmle_tasks.pipeline import prepare_task, task_dirs
from rexmle_tasks.registry import get_task

CASES = {"ldct-iqa": 150, "isles22": 22}  # other tasks: the mirror's own size at its difficulty
PRESETS = {  # agent, config: every preset at its own defaults, the control without debug or improve
    "no-search": ("aide", {"debug_prob": 0.0, "num_drafts": 1000}),
    "aide": ("aide", {"num_drafts": 3}),
    "mcts": ("mcts", {"num_drafts": 3}),
    "rdloop": ("rdloop", {}),
    "evo": ("evo", {"population_size": 3}),
}

# ---- the scripts the realistic-style model writes ------------------------------------------------------------------
# the submission.csv of every script that predicts the sample submission's rows: those rows, as they are
WRITE_ROWS = '''with (out / "submission.csv").open("w", newline="") as handle:
    writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
'''
# where every script reads, writes, and whether it is the harness's quick sample run
PATHS = '''data = Path("../data")
out = Path(os.environ["SUBMISSION_DIR"])
sample = os.environ.get("SAMPLE") == "1"
'''

LDCT = r'''# LEVEL {level}
import csv, os
from pathlib import Path
import numpy as np
import tifffile
from scipy import ndimage, stats

LEVEL = {level}
{paths}


def read(path):
    return tifffile.imread(path).astype(float)


def features(im):
    if LEVEL == 0:
        return [im.std()]
    values = []
    for s in (0, 1, 2):
        g = ndimage.gaussian_filter(im, s) if s else im
        values.append(np.log(np.median(np.abs(g[1:, :] - g[:-1, :])) + 1e-6))
    if LEVEL >= 2:
        tissue = (im > 0.2) & (im < 0.8)
        ok = tissue.sum() > 20
        hp = im - ndimage.gaussian_filter(im, 2)
        lap = ndimage.laplace(im)
        values.append(np.log(np.median(np.abs(hp[tissue])) + 1e-6) if ok else 0.0)
        values.append(np.log(np.median(np.abs(lap[tissue])) + 1e-6) if ok else 0.0)
        spectrum = np.abs(np.fft.fftshift(np.fft.fft2(im * tissue)))
        yy, xx = np.mgrid[:im.shape[0], :im.shape[1]]
        radius = np.hypot(yy - im.shape[0] / 2, xx - im.shape[1] / 2)
        for low, high in ((5, 15), (15, 30), (30, 48)):
            values.append(np.log(spectrum[(radius >= low) & (radius < high)].mean() + 1e-6))
    return values


def fit(x, y):
    if LEVEL >= 3:
        from sklearn.ensemble import GradientBoostingRegressor
        model = GradientBoostingRegressor(n_estimators=200, max_depth=3, learning_rate=0.05, subsample=0.8,
                                          random_state=0).fit(x, y)
        return model.predict
    a = np.c_[np.ones(len(x)), x]
    w = np.linalg.solve(a.T @ a + 1e-3 * np.eye(a.shape[1]), a.T @ y)
    return lambda z: np.c_[np.ones(len(z)), z] @ w


def score(p, t):
    if np.std(p) == 0:
        return 0.0
    return abs(stats.pearsonr(p, t)[0]) + abs(stats.spearmanr(p, t)[0]) + abs(stats.kendalltau(p, t)[0])


rows = list(csv.DictReader((data / "train" / "labels.csv").open()))
if sample:
    rows = rows[:12]
x = np.array([features(read(data / "train" / "images" / (r["image_id"] + ".tif"))) for r in rows])
y = np.array([float(r["quality_score"]) for r in rows])
cut = len(rows) * 2 // 3
print("VALIDATION_METRIC:", round(score(fit(x[:cut], y[:cut])(x[cut:]), y[cut:]), 4))
predict = fit(x, y)
ids = [r["image_id"] for r in csv.DictReader((data / "sample_submission" / "submission.csv").open())]
test = np.array([features(read(data / "test" / "images" / (i + ".tif"))) for i in ids])
with (out / "submission.csv").open("w", newline="") as handle:
    writer = csv.writer(handle)
    writer.writerow(["image_id", "quality_score"])
    for case, value in zip(ids, np.clip(predict(test), 0, 4)):
        writer.writerow([case, round(float(value), 4)])
'''

ISLES = r'''# LEVEL {level}
import csv, os
from pathlib import Path
import numpy as np
import SimpleITK as sitk
from scipy import ndimage

LEVEL = {level}
{paths}


def load(split, case):
    image = sitk.ReadImage(str(data / split / "images" / f"{case}_0000.nii.gz"))
    adc = sitk.GetArrayFromImage(sitk.ReadImage(str(data / split / "images" / f"{case}_0001.nii.gz")))
    return image, sitk.GetArrayFromImage(image).astype(float), adc.astype(float)


def dice(p, g):
    s = p.sum() + g.sum()
    return 1.0 if s == 0 else 2.0 * (p & g).sum() / s


def normalised(d, a):
    brain = d > 0
    return d / max(np.median(d[brain]), 1e-6), a / max(np.median(a[brain]), 1e-6), brain


def features(d, a):
    nd, na, brain = normalised(d, a)
    columns = []
    weight = np.maximum(ndimage.gaussian_filter(brain.astype(float), 8), 1e-3)
    for x in (nd, na):
        corrected = x / np.maximum(ndimage.gaussian_filter(x * brain, 8) / weight, 1e-3)
        for s in (0, 1, 2):
            columns.append(ndimage.gaussian_filter(corrected, s) if s else corrected)
    columns.append(ndimage.distance_transform_edt(brain))
    return np.stack([c[brain] for c in columns], 1), brain


def train(cases):
    if LEVEL == 0:
        grid = np.linspace(50, 900, 35)
        best = max(grid, key=lambda t: np.mean([dice(d > t, m) for d, a, m in cases]))
        return lambda d, a: d > best
    if LEVEL == 1:
        norm = [(normalised(d, a), m) for d, a, m in cases]
        grid = [(hi, lo) for hi in np.linspace(1.1, 2.6, 16) for lo in np.linspace(0.6, 1.1, 6)]
        hi, lo = max(grid, key=lambda g: np.mean([dice((nd > g[0]) & (na < g[1]) & b, m)
                                                  for (nd, na, b), m in norm]))
        def rule(d, a):
            nd, na, b = normalised(d, a)
            return (nd > hi) & (na < lo) & b
        return rule
    from sklearn.ensemble import HistGradientBoostingClassifier
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for d, a, m in cases:
        x, brain = features(d, a)
        y = m[brain]
        keep = np.flatnonzero(y) if y.any() else np.array([], dtype=int)
        keep = np.concatenate([keep, rng.choice(len(y), min(len(y), 6000), replace=False)])
        xs.append(x[keep])
        ys.append(y[keep])
    model = HistGradientBoostingClassifier(max_iter=150, random_state=0).fit(np.concatenate(xs), np.concatenate(ys))
    threshold = 0.5 if LEVEL == 2 else 0.6

    def predict(d, a):
        x, brain = features(d, a)
        p = np.zeros(d.shape)
        p[brain] = model.predict_proba(x)[:, 1]
        mask = p > threshold
        if LEVEL >= 3:
            labels, n = ndimage.label(mask)
            sizes = ndimage.sum(mask, labels, range(1, n + 1))
            mask = np.isin(labels, [i + 1 for i, s in enumerate(sizes) if s >= 2])
        return mask
    return predict


ids = sorted(p.name[: -len(".nii.gz")] for p in (data / "train" / "labels").glob("*.nii.gz"))
if sample:
    ids = ids[:4]
cases = []
for case in ids:
    _, d, a = load("train", case)
    m = sitk.GetArrayFromImage(sitk.ReadImage(str(data / "train" / "labels" / f"{case}.nii.gz"))) > 0
    cases.append((d, a, m))
cut = max(1, len(cases) * 2 // 3)
model = train(cases[:cut])
print("VALIDATION_METRIC:", round(float(np.mean([dice(model(d, a), m) for d, a, m in cases[cut:]])), 4))
model = train(cases)
rows = list(csv.DictReader((data / "sample_submission" / "submission.csv").open()))
(out / "predictions").mkdir(exist_ok=True)
for row in rows:
    image, d, a = load("test", row["case_id"])
    mask = sitk.GetImageFromArray(model(d, a).astype(np.uint8))
    mask.CopyInformation(image)
    sitk.WriteImage(mask, str(out / row["predicted_mask_path"]), useCompression=True)
{write_rows}
'''

USENHANCE = r'''# LEVEL {level}
import csv, os
from pathlib import Path
import numpy as np
from PIL import Image
from scipy import ndimage

LEVEL = {level}
{paths}


def read(path):
    return np.asarray(Image.open(path).convert("L"), dtype=float) / 255.0


def lncc(p, t, w=7):
    # local normalised cross-correlation in 7x7 windows, each image scaled to [0, 1] first
    p = (p - p.min()) / max(p.max() - p.min(), 1e-9)
    t = (t - t.min()) / max(t.max() - t.min(), 1e-9)
    box = lambda x: ndimage.uniform_filter(x, w, mode="mirror")
    mp, mt = box(p), box(t)
    vp, vt, c = box(p * p) - mp * mp, box(t * t) - mt * mt, box(p * t) - mp * mt
    ok = (vp > 1e-6) & (vt > 1e-6)
    return float(np.mean(c[ok] / np.sqrt(vp[ok] * vt[ok]))) if ok.any() else 0.0


def features(x):
    columns = [x] + [ndimage.gaussian_filter(x, s) for s in (1, 2, 4)] + [ndimage.median_filter(x, 5)]
    if LEVEL >= 3:
        mean = ndimage.uniform_filter(x, 7)
        columns.append(np.sqrt(np.maximum(ndimage.uniform_filter(x * x, 7) - mean * mean, 0)))
    return np.stack([c.ravel() for c in columns], 1)


def train(pairs):
    if LEVEL == 0:
        return lambda x: x
    if LEVEL == 1:
        sigma = max((0.5, 1.0, 1.5, 2.0, 3.0), key=lambda s: np.mean([lncc(ndimage.gaussian_filter(x, s), y)
                                                                       for x, y in pairs]))
        return lambda x: ndimage.gaussian_filter(x, sigma)
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for x, y in pairs:
        keep = rng.choice(x.size, min(x.size, 20000), replace=False)
        xs.append(features(x)[keep])
        ys.append(y.ravel()[keep])
    xs, ys = np.concatenate(xs), np.concatenate(ys)
    if LEVEL == 2:
        a = np.c_[np.ones(len(xs)), xs]
        w = np.linalg.lstsq(a, ys, rcond=None)[0]
        return lambda x: (np.c_[np.ones(x.size), features(x)] @ w).reshape(x.shape)
    from sklearn.ensemble import HistGradientBoostingRegressor
    model = HistGradientBoostingRegressor(max_iter=200, random_state=0).fit(xs, ys)
    return lambda x: model.predict(features(x)).reshape(x.shape)


ids = sorted(p.stem for p in (data / "train" / "high_quality").glob("*.png"))
if sample:
    ids = ids[:4]
pairs = [(read(data / "train" / "low_quality" / f"{i}.png"), read(data / "train" / "high_quality" / f"{i}.png"))
         for i in ids]
cut = max(1, len(pairs) * 2 // 3)
model = train(pairs[:cut])
print("VALIDATION_METRIC:", round(float(np.mean([lncc(model(x), y) for x, y in pairs[cut:]])), 4))
model = train(pairs)
rows = list(csv.DictReader((data / "sample_submission" / "submission.csv").open()))
(out / "enhanced").mkdir(exist_ok=True)
for row in rows:
    enhanced = model(read(data / "test" / "low_quality" / f"{row['image_id']}.png"))
    image = Image.fromarray((np.clip(enhanced, 0, 1) * 255).round().astype(np.uint8), mode="L")
    image.save(out / row["enhanced_image_path"])
{write_rows}
'''

DENTEX = r'''# LEVEL {level}
import csv, json, os
from collections import Counter, defaultdict
from pathlib import Path
import numpy as np
from PIL import Image
from scipy import ndimage

LEVEL = {level}
{paths}
QUADRANT, TOOTH, DIAGNOSIS = "category_id_1", "category_id_2", "category_id_3"


def grey(path):
    return np.asarray(Image.open(path).convert("L"), dtype=float) / 255.0


def frame(image):
    # level 0: the whole X-ray; from level 1: the extent of its brightest pixels (the teeth)
    if LEVEL == 0:
        return 0.0, 0.0, float(image.shape[1]), float(image.shape[0])
    smooth = ndimage.gaussian_filter(image, 1.5)
    rows, cols = np.nonzero(smooth >= np.percentile(smooth, 85))
    x0, x1 = np.percentile(cols, [1, 99])
    y0, y1 = np.percentile(rows, [1, 99])
    return x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)


def place(relative, f):
    x, y, w, h = relative
    return [f[0] + x * (f[2] - f[0]), f[1] + y * (f[3] - f[1]), w * (f[2] - f[0]), h * (f[3] - f[1])]


def inside(image, box):
    x, y, w, h = box
    part = image[max(0, int(y)):max(int(y) + 1, int(y + h)), max(0, int(x)):max(int(x) + 1, int(x + w))]
    if part.size == 0:
        return [0.0, 0.0, 0.0, 0.0]
    edges = ndimage.gaussian_gradient_magnitude(part, 1) if min(part.shape) > 2 else np.zeros(1)
    return [part.mean() - image.mean(), part.std(), (part < np.percentile(image, 40)).mean(), edges.mean()]


def iou(a, b):
    ix = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    union = a[2] * a[3] + b[2] * b[3] - ix * iy
    return ix * iy / union if union > 0 else 0.0


def ap50(predicted, truth):
    # average precision at IoU 0.5 of the (quadrant, tooth, diagnosis) boxes over all held-out X-rays
    ranked = sorted(((p["score"], i, p) for i, ps in predicted.items() for p in ps), key=lambda r: -r[0])
    used, hits = set(), []
    for _, i, p in ranked:
        match = [(iou(p["bbox"], t["bbox"]), k) for k, t in enumerate(truth.get(i, []))
                 if (i, k) not in used and all(t[key] == p[key] for key in (QUADRANT, TOOTH, DIAGNOSIS))]
        best = max(match, default=(0.0, None))
        hits.append(best[0] >= 0.5)
        if best[0] >= 0.5:
            used.add((i, best[1]))
    total = sum(len(t) for t in truth.values())
    if not total or not hits:
        return 0.0
    tp = np.cumsum(hits)
    precision, recall = tp / np.arange(1, len(hits) + 1), tp / total
    return float(np.sum(np.diff(np.concatenate([[0.0], recall])) * np.maximum.accumulate(precision[::-1])[::-1]))


def fit(images, annotations):
    frames = {i: frame(image) for i, image in images.items()}
    boxes, diagnoses, seen = defaultdict(list), defaultdict(Counter), defaultdict(set)
    for a in annotations:
        f = frames[a["image_id"]]
        x, y, w, h = a["bbox"]
        slot = (a[QUADRANT], a[TOOTH])
        boxes[slot].append([(x - f[0]) / (f[2] - f[0]), (y - f[1]) / (f[3] - f[1]), w / (f[2] - f[0]),
                            h / (f[3] - f[1])])
        diagnoses[slot][a[DIAGNOSIS]] += 1
        seen[slot].add(a["image_id"])
    atlas = {slot: (np.mean(b, axis=0), diagnoses[slot].most_common(1)[0][0], len(seen[slot]) / len(images))
             for slot, b in boxes.items()}
    rate = diagnose = None
    if LEVEL >= 2:
        # how abnormal each tooth looks: its atlas box's contrast, texture and darkness against the X-ray's,
        # a logistic regression over (this X-ray, this tooth) pairs of the training set
        from sklearn.linear_model import LogisticRegression
        x, y = [], []
        for i, image in images.items():
            for slot, (relative, _, _) in atlas.items():
                x.append(inside(image, place(relative, frames[i])) + [atlas[slot][2]])
                y.append(int(i in seen[slot]))
        if len(set(y)) > 1:
            rate = LogisticRegression(max_iter=1000, C=1.0).fit(np.array(x), np.array(y))
    if LEVEL >= 3:
        from sklearn.ensemble import RandomForestClassifier
        x, y = [], []
        for a in annotations:
            x.append(inside(images[a["image_id"]], a["bbox"]) + [a[QUADRANT], a[TOOTH]])
            y.append(a[DIAGNOSIS])
        if len(set(y)) > 1:
            diagnose = RandomForestClassifier(n_estimators=200, random_state=0).fit(np.array(x), np.array(y))

    def predict(image):
        f = frame(image)
        slots = list(atlas)
        boxes = [place(atlas[slot][0], f) for slot in slots]
        looks = [inside(image, box) for box in boxes]
        scores = [atlas[slot][2] for slot in slots]
        if rate is not None:
            scores = rate.predict_proba([v + [atlas[slot][2]] for v, slot in zip(looks, slots)])[:, 1]
        labels = [atlas[slot][1] for slot in slots]
        if diagnose is not None:
            labels = diagnose.predict([v + list(slot) for v, slot in zip(looks, slots)])
        return [{"bbox": [round(float(v), 2) for v in box], QUADRANT: int(slot[0]), TOOTH: int(slot[1]),
                 DIAGNOSIS: int(label), "score": round(float(score), 5)}
                for slot, box, label, score in zip(slots, boxes, labels, scores)]
    return predict


doc = json.loads((data / "train" / "annotations.json").read_text())
names = {image["id"]: image["file_name"] for image in doc["images"]}
ids = sorted(names)
if sample:
    ids = ids[:12]
images = {i: grey(data / "train" / "images" / names[i]) for i in ids}
annotations = [a for a in doc["annotations"] if a["image_id"] in images]
cut = max(1, len(ids) * 2 // 3)
model = fit({i: images[i] for i in ids[:cut]}, [a for a in annotations if a["image_id"] in ids[:cut]])
held = {i: model(images[i]) for i in ids[cut:]}
truth = defaultdict(list)
for a in annotations:
    if a["image_id"] in held:
        truth[a["image_id"]].append(a)
print("VALIDATION_METRIC:", round(ap50(held, truth), 4))
model = fit(images, annotations)
rows = list(csv.DictReader((data / "sample_submission" / "submission.csv").open()))
(out / "predictions").mkdir(exist_ok=True)
for row in rows:
    found = model(grey(data / "test" / "images" / f"{row['image_id']}.png"))
    (out / row["predictions_json"]).write_text(json.dumps(found))
{write_rows}
'''

SEGMENTATION = r'''# LEVEL {level}
import os
from pathlib import Path
import numpy as np
from scipy import ndimage
from rexmle_baselines.convert import segmentation_io

LEVEL = {level}
TASK = "{task}"
{paths}
io = segmentation_io(TASK, TASK, data)  # reads the task's images and labels, writes its submission format
classes = max(io.labels.values()) + 1
rng = np.random.default_rng(0)


def standardised(image):
    axes = tuple(range(1, image.ndim))
    low, high = np.percentile(image, [1, 99], axis=axes, keepdims=True)
    return np.clip((image - low) / np.maximum(high - low, 1e-6), -0.5, 1.5)


def dice(p, t):
    """Mean Dice of the foreground classes in either map (one pass: the confusion matrix)."""
    m = np.bincount(p.ravel().astype(np.int64) * classes + t.ravel(), minlength=classes * classes)
    m = m.reshape(classes, classes)
    both, total = np.diag(m)[1:], m.sum(axis=0)[1:] + m.sum(axis=1)[1:]
    return float(np.mean(2.0 * both[total > 0] / total[total > 0])) if (total > 0).any() else 1.0


def brightness(image):
    return ndimage.gaussian_filter(standardised(image).mean(axis=0), 1)


def features(image):
    x = standardised(image)
    scales = (0, 1, 2, 4) if LEVEL >= 3 else (0, 1, 2)
    columns = [ndimage.gaussian_filter(channel, s) if s else channel for channel in x for s in scales]
    if LEVEL >= 3:
        columns += [ndimage.gaussian_gradient_magnitude(channel, 1) for channel in x]
    columns += np.meshgrid(*[np.linspace(0, 1, n) for n in x.shape[1:]], indexing="ij", sparse=False)
    return np.stack([c.ravel() for c in columns], 1).astype(np.float32)


def train(cases):
    counts = np.bincount(np.concatenate([t.ravel() for _, t in cases]), minlength=classes)
    if LEVEL <= 1:
        # one brightness rule: the brightest or darkest fraction of each image is foreground
        fractions = (0.002, 0.005, 0.01, 0.03, 0.1, 0.2, 0.35, 0.5)
        main = int(np.argmax(counts[1:])) + 1

        def mask(b, rule, cut=None):
            return rule[0] * b > (np.quantile(rule[0] * b, 1 - rule[1]) if cut is None else cut)

        scores = {}
        for image, t in cases:
            b = brightness(image)
            for sign in (1, -1):
                for q, cut in zip(fractions, np.quantile(sign * b, [1 - f for f in fractions])):
                    predicted = np.where(mask(b, (sign, q), cut), main, 0)
                    scores[sign, q] = scores.get((sign, q), 0.0) + dice(predicted, t) / len(cases)
        best = max(scores, key=scores.get)
        if LEVEL == 0:
            return lambda image: np.where(mask(brightness(image), best), main, 0).astype(np.uint8)
        # level 1: each foreground voxel takes the class whose training voxels lie nearest on average (an atlas
        # of class centroids in normalised coordinates)
        centroids = np.zeros((classes, cases[0][1].ndim))
        for c in range(1, classes):
            found = [np.argwhere(t == c) / np.asarray(t.shape) for _, t in cases if (t == c).any()]
            centroids[c] = np.concatenate(found).mean(axis=0) if found else np.inf

        def predict(image):
            m = mask(brightness(image), best)
            where = np.argwhere(m) / np.asarray(m.shape)
            out = np.zeros(m.shape, dtype=np.uint8)
            near = ((where[:, None, :] - centroids[None, 1:, :]) ** 2).sum(-1)
            out[m] = np.argmin(near, axis=1) + 1
            return out
        return predict
    from sklearn.ensemble import HistGradientBoostingClassifier
    xs, ys = [], []
    for image, t in cases:
        x, y = features(image), t.ravel()
        keep = [rng.choice(np.flatnonzero(y == c), min(3000, int((y == c).sum())), replace=False)
                for c in range(classes) if (y == c).any()]
        keep = np.concatenate(keep + [rng.choice(len(y), min(len(y), 6000), replace=False)])
        xs.append(x[keep])
        ys.append(y[keep])
    model = HistGradientBoostingClassifier(max_iter=250 if LEVEL >= 3 else 120, random_state=0)
    model.fit(np.concatenate(xs), np.concatenate(ys))

    def predict(image):
        x = features(image)
        labels = np.concatenate([model.predict(x[i:i + 400000]) for i in range(0, len(x), 400000)])
        return labels.reshape(image.shape[1:]).astype(np.uint8)
    return predict


training = io.training_cases()
if sample:
    training = training[:3]
cases = [(io.read_image(case)[0], io.read_label(case)) for case in training]
cut = max(1, len(cases) * 2 // 3)
model = train(cases[:cut])
print("VALIDATION_METRIC:", round(float(np.mean([dice(model(i), t) for i, t in cases[cut:]])), 4))
model = train(cases)
predictions = {case.case_id: model(io.read_image(case)[0]) for case in io.test_cases()}
io.write_submission(predictions, out)
'''

# first-draft bugs, as (name, the right text, what the buggy script has instead)
BUGS = {
    "ldct-iqa": [("column", 'r["image_id"] + ".tif"', 'r["label_id"] + ".tif"'),
                 ("suffix", '(i + ".tif")', '(i + ".tiff")'),
                 ("folder", 'out / "submission.csv"', 'Path("submission.csv")')],
    "isles22": [("channel", 'f"{case}_0001.nii.gz"', 'f"{case}_adc.nii.gz"'),
                ("folder", 'out / row["predicted_mask_path"]', 'Path(row["predicted_mask_path"])'),
                ("column", 'load("test", row["case_id"])', 'load("test", row["id"])')],
}
BUGS["usenhance"] = [("suffix", '/ f"{i}.png"), read(', '/ f"{i}.jpg"), read('),
                     ("folder", 'image.save(out / row["enhanced_image_path"])',
                      'image.save(row["enhanced_image_path"])'),
                     ("column", "row['image_id']", "row['case_id']")]
BUGS["dentex"] = [("suffix", 'f"{row[\'image_id\']}.png"', 'f"{row[\'image_id\']}.jpg"'),
                  ("folder", '(out / row["predictions_json"]).write_text',
                   '(Path(row["predictions_json"])).write_text'),
                  ("key", 'names = {image["id"]: image["file_name"]', 'names = {image["id"]: image["path"]')]
SEGMENTATION_BUGS = [("folder", "io.write_submission(predictions, out)",
                      'io.write_submission(predictions, Path("submission"))'),
                     ("data", "segmentation_io(TASK, TASK, data)", 'segmentation_io(TASK, TASK, data / "train")'),
                     ("split", "for case in io.test_cases()}", "for case in io.training_cases()}")]
_LEVEL = re.compile(r"# LEVEL (\d)(?: BUG (\w+))?")
_METRIC = re.compile(r"VALIDATION_METRIC:\s*(-?[0-9.]+(?:e-?\d+)?)")


def bugs_of(task: str) -> list[tuple[str, str, str]]:
    return BUGS.get(task, SEGMENTATION_BUGS)


def script(task: str, level: int, bug: str | None = None) -> str:
    """The realistic-style model's script for ``task`` at method ``level`` (0-3), with first-draft ``bug``."""
    template = {"ldct-iqa": LDCT, "isles22": ISLES, "usenhance": USENHANCE, "dentex": DENTEX}.get(task,
                                                                                                  SEGMENTATION)
    text = template.replace("{level}", str(level)).replace("{task}", task)
    text = text.replace("{paths}\n", PATHS).replace("{write_rows}\n", WRITE_ROWS)
    if bug is not None:
        _, right, wrong = next(b for b in bugs_of(task) if b[0] == bug)
        assert right in text, (task, bug)
        text = text.replace(right, wrong, 1).replace(f"# LEVEL {level}", f"# LEVEL {level} BUG {bug}", 1)
    return text


class RealisticStyleModel:
    """A function of the request for ``ScriptedBackend`` (see the module docstring)."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.drafts = 0
        self.improvements_to_level2 = 0
        self.improvements_from: dict[int, int] = {}  # level -> improvements asked for from a script of that level
        self.lock = threading.Lock()
        self.calls = 0

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: object) -> ModelResponse | str:
        prompt = next(m.content for m in messages if m.role == "user")
        heading = prompt.lstrip().split("\n", 1)[0]
        with self.lock:
            self.calls += 1
            call = f"call-{self.calls}"
        shown = [(int(m.group(1)), m.group(2)) for m in _LEVEL.finditer(prompt.split("# Earlier attempts")[0]
                                                                        .split("# Other attempts")[0]
                                                                        .split("# Related attempts")[0])]
        if heading.startswith("# Your job: a first solution"):
            with self.lock:
                number = self.drafts
                self.drafts += 1
            bugs = [b[0] for b in bugs_of(self.task)]
            bug = bugs[(number // 2) % len(bugs)] if number % 2 == 0 else None  # every other draft has a bug
            return _answer("A simple first method.", script(self.task, 0, bug))
        if heading.startswith(("# Your job: fix", "# Your job: revise")):
            level = shown[0][0] if shown else 0
            return _answer("Fix the bug the error shows.", script(self.task, level))
        if heading.startswith(("# Your job: improve", "# Your job: merge")):
            start = max((lv for lv, _ in shown), default=0)
            with self.lock:
                tries = self.improvements_from.get(start, 0)
                self.improvements_from[start] = tries + 1
            level = min(3, start + 1 + tries)
            bug = None
            if level == 2:
                with self.lock:
                    self.improvements_to_level2 += 1
                    bug = bugs_of(self.task)[0][0] if self.improvements_to_level2 == 1 else None
            return _answer(f"Move to method level {level}.", script(self.task, level, bug))
        if heading.startswith("# Review one execution"):
            execution = prompt.split("## Execution", 1)[1].split("##", 1)[0]
            found = _METRIC.search(prompt.split("## Output (tail)", 1)[1])
            validation = prompt.split("## Submission check", 1)[1].split("##", 1)[0]
            ok = "exit status 0" in execution and "valid" in validation and "invalid" not in validation
            metric = float(found.group(1)) if found else None
            return _tool(call, "submit_review", {"is_bug": not ok or metric is None, "metric": metric,
                                                 "metric_name": primary(self.task), "is_task_metric": True,
                                                 "summary": "read from the output"})
        if heading.startswith("# Your job: propose the next hypothesis"):
            return _tool(call, "propose_hypothesis", {"hypothesis": "a stronger method", "rationale": "the log"})
        if heading.startswith("# Your job: review a script"):
            failed = "exit status 0" not in prompt.split("## The sample run", 1)[1].split("##", 1)[0]
            return _tool(call, "submit_code_review", {"ready": not failed,
                                                      "feedback": "the sample run failed" if failed else ""})
        if heading.startswith("# Your job: summarise"):
            return "Summary: simple methods first; trained models do better."
        # feedback: honest, the metric as evidence
        outcome = prompt.split("## Outcome", 1)[1].split("##", 1)[0]
        best = prompt.split("## Best result so far", 1)[1].split("##", 1)[0]
        mine, theirs = _metric_in(outcome), _metric_in(best)
        better = mine is not None and (theirs is None or mine > theirs)
        return _tool(call, "submit_feedback", {"supported": better, "observations": "compared the metrics",
                                               "lesson": "higher levels help" if better else "no gain",
                                               "replace_best": better})


def _metric_in(text: str) -> float | None:
    found = re.search(r"validation metric \w* ?(-?[0-9.]+(?:e-?\d+)?)", text)
    return float(found.group(1)) if found else None


def _answer(plan: str, code: str) -> str:
    return f"{plan}\n\n```python\n{code}```\n"


def _tool(call_id: str, name: str, arguments: dict[str, Any]) -> ModelResponse:
    return ModelResponse(tool_calls=(ToolCall(id=call_id, name=name, arguments=arguments),), model="scripted/model",
                         finish_reason="tool_calls")


# ---- the benchmark ------------------------------------------------------------------------------------------------


def primary(task: str) -> str:
    """The task's validation metric: what scripts print, reviews report and the tables show."""
    from rexmle_grade.grader import get_grader

    return get_grader(get_task(task).meta.grader).validation_metric.name


def grade(task: str, root: Path, submission: Path) -> dict[str, Any]:
    entry = evaluate_submission(resolve_target(task, root), submission)
    return {"valid": entry.valid_submission, "score": entry.metrics.get(primary(task)),
            "percentile": entry.percentile}


def quick_baseline(task: str, root: Path, work: Path) -> tuple[str, dict[str, Any], float]:
    from rexmle_baselines.api import run_baseline
    from rexmle_baselines.base import preferred_baseline

    name = preferred_baseline(task, "quick")
    record = work / "baseline.json"
    if record.is_file():  # made by an earlier invocation with --keep: graded again, not trained again
        done = json.loads(record.read_text())
        return done["name"], grade(task, root, work / "submission"), done["seconds"]
    started = time.monotonic()
    run = run_baseline(name, task, data_root=root, config="quick", device="cpu", out=work / "submission",
                       work_dir=work / "work")
    seconds = time.monotonic() - started
    record.write_text(json.dumps({"name": name, "seconds": seconds}))
    return name, grade(task, root, run.submission_dir), seconds


def run_preset(task: str, root: Path, runs: Path, preset: str, nodes: int, exec_timeout: float) -> dict[str, Any]:
    agent, config = PRESETS[preset]
    spec = build_spec(task, agent=agent, agent_config={**config, "max_nodes": nodes, "replayable": True},
                      models={"code": "scripted/model"}, seed=0,
                      limits=Limits(time_limit_s=3600, exec_timeout_s=exec_timeout), sandbox="bwrap",
                      data_root=root, group=f"bench-{preset}")
    model = Model(ScriptedBackend(RealisticStyleModel(task)), retry=RetryPolicy(max_attempts=1))
    started = time.monotonic()
    outcome = execute_run(spec, runs, models={"code": model}, grace_s=5.0)
    entry = outcome.grade
    final = json.loads((outcome.run_dir / "final" / "metadata.json").read_text())
    code = (outcome.run_dir / "final" / "best_solution.py")
    level = _LEVEL.search(code.read_text()).group(1) if code.is_file() else "-"
    return {"valid": bool(entry and entry.valid_submission),
            "score": entry.metrics.get(primary(task)) if entry else None,
            "percentile": entry.percentile if entry else None, "seconds": time.monotonic() - started,
            "level": level, "chosen_by": final.get("chosen_by", ""), "state": outcome.state}


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def ladder_of(task: str, difficulty: str, base: Path, with_baseline: bool) -> dict[str, Any]:
    """The task's ladder on its mirror (stored under ``base`` and read back when there)."""
    from rexmle_baselines.ladder import measure_ladder

    record = base / f"ladder-{task}-{difficulty}.json"
    rungs = ("sample", "heuristic", "baseline") if with_baseline else ("sample", "heuristic")
    if record.is_file():
        done = json.loads(record.read_text())
        if set(rungs) <= {*done["rungs"], *(["baseline"] if done.get("trained") else [])}:
            return done
    started = time.monotonic()
    ladder = measure_ladder(task, base / f"ladder-data-{difficulty}", difficulty=difficulty,
                            cases=CASES.get(task), seed=0, rungs=rungs, work_root=base / "ladder-work")
    trained = next((n for n in ladder.rungs if n not in ("sample", "heuristic")), None)
    done = {"task": task, "difficulty": difficulty, "cases": ladder.cases, "trained": trained,
            "metric": ladder.rungs["sample"].metric, "higher_better": ladder.rungs["sample"].higher_better,
            "rungs": {n: {"value": r.value, "valid": r.valid, "seconds": r.seconds, "score": r.score}
                      for n, r in ladder.rungs.items()},
            "ordered": ladder.ordered(), "seconds": round(time.monotonic() - started, 1)}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(done, indent=1))
    return done


def ladder_table(ladders: list[dict[str, Any]], controls: dict[tuple[str, str], float | None]) -> list[str]:
    lines = ["| task | difficulty | metric | sample | heuristic | quick trained (s) | drafts-only control | "
             "sample < heuristic < trained |", "|---|---|---|---|---|---|---|---|"]
    for done in ladders:
        rungs, trained = done["rungs"], done.get("trained")
        value = {n: (r["value"] if r["valid"] else None) for n, r in rungs.items()}
        arrow = "higher" if done["higher_better"] else "lower"
        trained_cell = "-" if trained is None else (f"{fmt(value[trained])} {trained} "
                                                    f"({rungs[trained]['seconds']:.0f})")
        holds = "yes" if done["ordered"] else "**no**"
        lines.append(f"| {done['task']} | {done['difficulty']} | {done['metric']} ({arrow}) | {fmt(value['sample'])} | "
                     f"{fmt(value['heuristic'])} | {trained_cell} | "
                     f"{fmt(controls.get((done['task'], done['difficulty'])))} | {holds} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="ldct-iqa,isles22")
    parser.add_argument("--difficulties", default="easy,realistic")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--exec-timeout", type=float, default=300.0)
    parser.add_argument("--no-baseline", action="store_true", help="leave the quick baseline out (it needs torch)")
    parser.add_argument("--keep", type=Path, default=None, help="keep data and runs in this folder")
    parser.add_argument("--ladder-tasks", default="all", help="all, none, or task ids for the difficulty ladder")
    parser.add_argument("--ladder-difficulties", default="realistic")
    parser.add_argument("--no-scaffolds", action="store_true", help="measure the ladders only")
    args = parser.parse_args(argv)
    if not args.no_scaffolds:
        from rexmle_baselines.convert import segmentation_grader_ids

        scripted = {"ldct-iqa", "isles22", "usenhance", "dentex", *segmentation_grader_ids()}
        unscripted = [t for t in args.tasks.split(",") if t not in scripted]
        if unscripted:
            parser.error(f"no scripts for {', '.join(unscripted)}: --tasks takes {', '.join(sorted(scripted))}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("rexmle_agents.models.base").setLevel(logging.ERROR)  # "scripted/model has no price"
    with tempfile.TemporaryDirectory(prefix="rexmle-bench-synthetic-") as tmp:
        base = args.keep or Path(tmp)
        rows = []
        for task in ([] if args.no_scaffolds else args.tasks.split(",")):
            for difficulty in args.difficulties.split(","):
                root = base / f"ladder-data-{difficulty}"  # the ladder's mirror: the control sits in its row
                prepare_task(get_task(task), task_dirs(get_task(task), root), synthetic=True, cases=CASES.get(task),
                             seed=0, difficulty=difficulty)
                public = task_dirs(get_task(task), root).public
                sample = grade(task, root, public / "sample_submission")
                baseline_name, baseline = "-", {"score": None, "percentile": None}
                if not args.no_baseline:
                    work = base / f"baseline-{task}-{difficulty}"
                    baseline_name, baseline, seconds = quick_baseline(task, root, work)
                    print(f"{task} {difficulty}: quick baseline {baseline_name} {fmt(baseline['score'])} "
                          f"({seconds:.0f} s)", flush=True)
                for preset in args.presets.split(","):
                    record = base / f"scaffold-{task}-{difficulty}-{preset}-{args.nodes}.json"
                    if record.is_file():  # measured by an earlier invocation with --keep
                        result = json.loads(record.read_text())
                    else:
                        result = run_preset(task, root, base / f"runs-{difficulty}", preset, args.nodes,
                                            args.exec_timeout)
                        if result["state"] != "cancelled":  # an interrupted bench measures nothing: run it again
                            record.write_text(json.dumps(result, indent=1))
                    rows.append((task, difficulty, preset, result, sample, baseline, baseline_name))
                    print(f"{task} {difficulty} {preset}: {fmt(result['score'])} (level {result['level']}, "
                          f"{result['seconds']:.0f} s)", flush=True)
        if rows:
            print("\n| task | difficulty | preset | metric | final | level | vs sample | vs quick baseline | "
                  "percentile |")
            print("|---|---|---|---|---|---|---|---|---|")
        for task, difficulty, preset, result, sample, baseline, baseline_name in rows:
            score = result["score"]
            vs_sample = None if score is None or sample["score"] is None else score - sample["score"]
            vs_base = None if score is None or baseline["score"] is None else score - baseline["score"]
            print(f"| {task} | {difficulty} | {preset} | {primary(task)} | {fmt(score)} | {result['level']} | "
                  f"{fmt(vs_sample, 3):>6} (sample {fmt(sample['score'])}) | "
                  f"{fmt(vs_base, 3)} ({baseline_name} {fmt(baseline['score'])}) | {fmt(result['percentile'], 2)} |")
        controls = {(task, difficulty): result["score"] for task, difficulty, preset, result, *_ in rows
                    if preset == "no-search"}
        from rexmle_tasks.registry import all_tasks

        names = {"all": sorted(all_tasks()), "none": []}.get(args.ladder_tasks, args.ladder_tasks.split(","))
        ladders = []
        for task in names:
            for difficulty in args.ladder_difficulties.split(","):
                done = ladder_of(task, difficulty, base, with_baseline=not args.no_baseline)
                ladders.append(done)
                print(f"ladder {task} {difficulty}: " + ", ".join(f"{n} {fmt(r['value'])}"
                                                                  for n, r in done["rungs"].items()), flush=True)
        if ladders:
            print("\n" + "\n".join(ladder_table(ladders, controls)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
