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

The difficulty ladder of every task (issue 36): per task, on its ``realistic`` mirror (``--ladder-difficulties``),
the sample submission, the task's simple heuristic (``rexmle baselines run heuristic``) and its trained quick rung
(:mod:`rexmle_baselines.ladder`), each graded on the hidden test labels by the task's grader with its validation
metric; the drafts-only control comes from the scaffold runs where they were made (``--tasks``). With ``--keep DIR``
each measured ladder is stored in DIR and read back by a later invocation instead of measured again, so the table
can be filled task by task.

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

CASES = {"ldct-iqa": 150, "isles22": 22}
PRIMARY = {"ldct-iqa": "score", "isles22": "dice"}
PRESETS = {  # agent, config: every preset at its own defaults, the control without debug or improve
    "no-search": ("aide", {"debug_prob": 0.0, "num_drafts": 1000}),
    "aide": ("aide", {"num_drafts": 3}),
    "mcts": ("mcts", {"num_drafts": 3}),
    "rdloop": ("rdloop", {}),
    "evo": ("evo", {"population_size": 3}),
}

# ---- the scripts the realistic-style model writes ------------------------------------------------------------------

LDCT = r'''# LEVEL {level}
import csv, os
from pathlib import Path
import numpy as np
import tifffile
from scipy import ndimage, stats

LEVEL = {level}
data = Path("../data")
out = Path(os.environ["SUBMISSION_DIR"])
sample = os.environ.get("SAMPLE") == "1"


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
data = Path("../data")
out = Path(os.environ["SUBMISSION_DIR"])
sample = os.environ.get("SAMPLE") == "1"


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
with (out / "submission.csv").open("w", newline="") as handle:
    writer = csv.writer(handle)
    writer.writerow(["case_id", "predicted_mask_path"])
    for row in rows:
        writer.writerow([row["case_id"], row["predicted_mask_path"]])
'''

# first-draft bugs, as (name, what the buggy script has instead of the right text, the right text)
BUGS = {
    "ldct-iqa": [("column", 'r["image_id"] + ".tif"', 'r["label_id"] + ".tif"'),
                 ("suffix", '(i + ".tif")', '(i + ".tiff")'),
                 ("folder", 'out / "submission.csv"', 'Path("submission.csv")')],
    "isles22": [("channel", 'f"{case}_0001.nii.gz"', 'f"{case}_adc.nii.gz"'),
                ("folder", 'out / row["predicted_mask_path"]', 'Path(row["predicted_mask_path"])'),
                ("column", 'load("test", row["case_id"])', 'load("test", row["id"])')],
}
_LEVEL = re.compile(r"# LEVEL (\d)(?: BUG (\w+))?")
_METRIC = re.compile(r"VALIDATION_METRIC:\s*(-?[0-9.]+(?:e-?\d+)?)")


def script(task: str, level: int, bug: str | None = None) -> str:
    text = (LDCT if task == "ldct-iqa" else ISLES).replace("{level}", str(level))
    if bug is not None:
        _, right, wrong = next(b for b in BUGS[task] if b[0] == bug)
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
            bugs = [b[0] for b in BUGS[self.task]]
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
                    bug = BUGS[self.task][0][0] if self.improvements_to_level2 == 1 else None
            return _answer(f"Move to method level {level}.", script(self.task, level, bug))
        if heading.startswith("# Review one execution"):
            execution = prompt.split("## Execution", 1)[1].split("##", 1)[0]
            found = _METRIC.search(prompt.split("## Output (tail)", 1)[1])
            validation = prompt.split("## Submission check", 1)[1].split("##", 1)[0]
            ok = "exit status 0" in execution and "valid" in validation and "invalid" not in validation
            metric = float(found.group(1)) if found else None
            return _tool(call, "submit_review", {"is_bug": not ok or metric is None, "metric": metric,
                                                 "metric_name": PRIMARY[self.task], "is_task_metric": True,
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


def grade(task: str, root: Path, submission: Path) -> dict[str, Any]:
    entry = evaluate_submission(resolve_target(task, root), submission)
    return {"valid": entry.valid_submission, "score": entry.metrics.get(PRIMARY[task]),
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
            "score": entry.metrics.get(PRIMARY[task]) if entry else None,
            "percentile": entry.percentile if entry else None, "seconds": time.monotonic() - started,
            "level": level, "chosen_by": final.get("chosen_by", "")}


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
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("rexmle_agents.models.base").setLevel(logging.ERROR)  # "scripted/model has no price"
    with tempfile.TemporaryDirectory(prefix="rexmle-bench-synthetic-") as tmp:
        base = args.keep or Path(tmp)
        rows = []
        for task in ([] if args.no_scaffolds else args.tasks.split(",")):
            for difficulty in args.difficulties.split(","):
                root = base / f"data-{difficulty}"
                prepare_task(get_task(task), task_dirs(get_task(task), root), synthetic=True, cases=CASES[task],
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
                    result = run_preset(task, root, base / f"runs-{difficulty}", preset, args.nodes, args.exec_timeout)
                    rows.append((task, difficulty, preset, result, sample, baseline, baseline_name))
                    print(f"{task} {difficulty} {preset}: {fmt(result['score'])} (level {result['level']}, "
                          f"{result['seconds']:.0f} s)", flush=True)
        metric = {t: PRIMARY[t] for t in PRIMARY}
        if rows:
            print(f"\n| task | difficulty | preset | final {'/'.join(metric[t] for t in args.tasks.split(','))} | "
                  "level | vs sample | vs quick baseline | percentile |")
            print("|---|---|---|---|---|---|---|---|")
        for task, difficulty, preset, result, sample, baseline, baseline_name in rows:
            score = result["score"]
            vs_sample = None if score is None or sample["score"] is None else score - sample["score"]
            vs_base = None if score is None or baseline["score"] is None else score - baseline["score"]
            print(f"| {task} | {difficulty} | {preset} | {fmt(score)} | {result['level']} | "
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
