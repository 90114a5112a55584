"""A scripted loopback model for R&D-Agent 1.0.0's data_science loop on the synthetic LDCT-IQA task.

It answers each stage as a capable model would, recognising the stage by a string of that stage's prompt
(rdagent's prompt yaml files, noted beside each stage) and replying in the form rdagent parses there:

- scenario analysis (scenarios/data_science/scen/prompts.yaml ``competition_description_template``): JSON facts;
- problem identification (proposal/exp_gen/prompts_v2.yaml ``scenario_problem`` / ``feedback_problem``): a JSON
  object of named problems;
- hypothesis generation (``hypothesis_gen``): one hypothesis per named problem, with numeric evaluation scores;
- task design (``task_gen``): ``{"description": ...}`` (rexmle gives rdagent a model name LiteLLM does not know,
  so rdagent takes its prompts without a response schema);
- CoSTEER coding of main.py (components/coder/data_science/pipeline/prompts.yaml ``pipeline_coder``): a Python
  block; its evaluation (``pipeline_eval``): the DSCoderFeedback JSON, accepting only code whose debug run
  succeeded (rdagent reports that in the prompt);
- the runner's evaluation (scenarios/data_science/dev/runner/prompts.yaml ``DSCoSTEER_eval``): accepting only a
  full run that succeeded (the baseline's first full run is accepted, so its debugger (``DSCoSTEER``) never asks);
- the experiment feedback (scenarios/data_science/dev/prompts.yaml ``exp_feedback``): "Replace Best Result".

The first experiment's main.py fits a line from each slice's pixel standard deviation to the training scores,
writes submission.csv (every test id, the task's two columns) and scores.csv (rdagent's ``ensemble`` row under the
metric's name), so rdagent records it as its SOTA (its ``sota_exp_to_submit``). Every later experiment's main.py
trains for an hour (its debug run too), so rdagent is still busy with its second experiment when the run's deadline
comes, the first experiment still its best; should a debug run end first (rdagent's own debug timeout), it failed
and is rejected, and the next attempt trains again.

A prompt of no known stage is answered with text rdagent cannot parse and kept in ``unknown`` (the test asserts
there is none). Every prompt can be written to a folder (``record_dir``) to read what rdagent sent.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.models import ModelResponse, Usage

METRIC = "score"  # the task's ranked metric; rdagent names the scores.csv column after the scenario's "Metric Name"
BASELINE_MARK = "rexmle scripted baseline"  # in the first experiment's main.py: the test finds its workspace by it
LONG_MARK = "rexmle scripted long experiment"

SCENARIO = {
    "Task Type": "Regression", "Data Type": "Image",
    "Brief Description": "No-reference quality scores (0-4) of low-dose CT slices",
    "Dataset Description": "train/images/<id>.tif single-channel float TIFF slices with train/labels.csv "
                           "(image_id, quality_score); test/images/<id>.tif to score",
    "Submission Specifications": "submission.csv with columns image_id, quality_score: one row per test image",
    "Submission channel number to each sample": 1,
    "Metric Evaluation": "|PLCC| + |SROCC| + |KROCC| between predicted and radiologist scores over all test slices",
    "Metric Name": METRIC, "Metric Direction": True, "Longer time limit required": False,
}

BASELINE_MAIN = '''"""rexmle scripted baseline: a line from each slice's pixel noise (std) to its score."""
import argparse
import csv
import time
from pathlib import Path

import numpy as np
from PIL import Image

parser = argparse.ArgumentParser()
parser.add_argument("--debug", action="store_true")
args = parser.parse_args()
started = time.time()
root = Path("./workspace_input")


def noise(path):
    return float(np.asarray(Image.open(path), dtype=np.float64).std())


def ranks(values):
    return np.argsort(np.argsort(values)).astype(float)


def correlation(a, b):
    if np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return abs(float(np.corrcoef(a, b)[0, 1]))


def kendall(a, b):
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    signs = [np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) for i, j in pairs]
    return abs(float(np.mean(signs))) if signs else 0.0


with open(root / "train" / "labels.csv", newline="") as handle:
    labels = {row["image_id"]: float(row["quality_score"]) for row in csv.DictReader(handle)}
train_ids = sorted(labels)
x = np.array([noise(root / "train" / "images" / f"{i}.tif") for i in train_ids])
y = np.array([labels[i] for i in train_ids])
slope, intercept = np.polyfit(x, y, 1)
fitted = slope * x + intercept
validation = correlation(fitted, y) + correlation(ranks(fitted), ranks(y)) + kendall(fitted, y)
print(f"training slices: {len(train_ids)}; {METRIC_NAME} on them: {validation:.4f}")

test_ids = sorted(p.stem for p in (root / "test" / "images").glob("*.tif"))
with open("submission.csv", "w", newline="") as handle:
    writer = csv.writer(handle)
    writer.writerow(["image_id", "quality_score"])
    for image_id in test_ids:
        writer.writerow([image_id, f"{slope * noise(root / 'test' / 'images' / f'{image_id}.tif') + intercept:.6f}"])
with open("scores.csv", "w", newline="") as handle:
    writer = csv.writer(handle)
    writer.writerow(["", METRIC_NAME])
    writer.writerow(["ensemble", f"{validation:.6f}"])
print(f"wrote submission.csv ({len(test_ids)} test slices) and scores.csv")
if args.debug:
    elapsed = time.time() - started
    print(f"debug_time: {elapsed:.2f}")
    print(f"estimated_time: {elapsed * 10:.2f}")
'''.replace("METRIC_NAME", repr(METRIC))

# Every later experiment: a long training run (an hour per attempt, in its debug run too), so that rdagent is busy
# in its second experiment (CoSTEER's debug run of main.py) when the run's deadline comes, as in a 12-hour run.
LONG_MAIN = '''"""{mark} (attempt {number}): a texture model trained for an hour."""
import time

for epoch in range(3600):
    time.sleep(1)
    if epoch % 30 == 0:
        print(f"epoch {{epoch}}: training the texture model", flush=True)
'''


def _problem_names(prompt: str) -> list[str]:
    """The problem names the hypothesis prompt lists (``## 1. name``): the answer must use exactly these keys."""
    return re.findall(r"^## \d+\. (.+?)\s*$", prompt, re.MULTILINE)


class RDAgentScript:
    """The model function (``answer(messages, tools, config)``) for ``run_external``; thread-safe (rdagent's
    calls come one at a time, but the relay serves each on its own thread)."""

    def __init__(self, record_dir: Path | None = None) -> None:
        self.record_dir = record_dir
        self.calls: Counter[str] = Counter()  # stage -> calls answered
        self.sota_accepted = False  # set once the experiment feedback has replaced the best result
        self.unknown: list[str] = []  # the start of every prompt no stage recognised
        self._lock = threading.Lock()
        self._stages: Sequence[tuple[str, tuple[str, ...], Callable[[str], str]]] = (
            ("scenario", ("extracts structured information from unstructured text",), self._scenario),
            ("exp_feedback", ("You are an advanced assistant analyzing results in data-driven R&D",),
             self._exp_feedback),
            ("runner_eval", ("# Current Code base", "## Stdout of code execution and testing"), self._runner_eval),
            ("pipeline_eval", ("## Task Specification for Code Structure",), self._pipeline_eval),
            ("pipeline_coder", ("generate robust, debuggable, and iteration-friendly code",), self._pipeline_coder),
            ("task_gen", ("The user is iteratively developing a Kaggle competition solution",), self._task_gen),
            ("hypothesis_gen", ("The user is iteratively improving a Kaggle competition implementation",),
             self._hypothesis_gen),
            ("problem", ("The user is improving a Kaggle competition implementation iteratively",), self._problems),
        )

    # ---- the model function ------------------------------------------------------------------------------
    def __call__(self, messages: Any, tools: Any, config: Any) -> ModelResponse:
        prompt = "\n\n".join(f"===== {m.role} =====\n{m.content}" for m in messages)
        stage, handler = next(((name, handler) for name, markers, handler in self._stages
                               if all(marker in prompt for marker in markers)), ("unknown", None))
        with self._lock:
            self.calls[stage] += 1
            number = sum(self.calls.values())
            if handler is None:
                self.unknown.append(prompt[:400])
        if self.record_dir is not None:
            (self.record_dir / f"{number:04d}-{stage}.txt").write_text(prompt)
        text = handler(prompt) if handler is not None else "This request is not one the script knows."
        return ModelResponse(text=text, usage=Usage(input_tokens=len(prompt) // 4, output_tokens=len(text) // 4))

    # ---- the stages ---------------------------------------------------------------------------------------
    def _scenario(self, prompt: str) -> str:
        return json.dumps(SCENARIO)

    def _problems(self, prompt: str) -> str:
        if not self.sota_accepted:
            return json.dumps({"Noise level predicts quality": {
                "problem": "No model maps a slice's noise to its quality score yet.",
                "reason": "Lower dose means more noise and lower ratings, the strongest signal in the data."}})
        return json.dumps({"Texture beyond noise": {
            "problem": "The noise statistic misses streak artefacts that radiologists also rate.",
            "reason": "Slices of equal noise can differ in artefacts and so in their scores."}})

    def _hypothesis_gen(self, prompt: str) -> str:
        names = _problem_names(prompt) or ["Noise level predicts quality"]
        scores = {key: 8 for key in ("alignment_score", "impact_score", "novelty_score", "feasibility_score",
                                     "risk_reward_balance_score")}
        return json.dumps({name: {
            "reason": "Quality ratings fall with dose, and dose shows as noise.", "component": "Model",
            "hypothesis": "A linear model of the pixel standard deviation predicts the quality score.",
            "evaluation": scores} for name in names})

    def _task_gen(self, prompt: str) -> str:
        if not self.sota_accepted:
            return json.dumps({"description": "Read train/labels.csv and the training slices, fit a line from each "
                                              "slice's pixel standard deviation to its score, report the training "
                                              f"{METRIC} in scores.csv and write submission.csv for every test "
                                              "slice."})
        return json.dumps({"description": "Train a texture model on the slices for an hour and predict the test "
                                          "slices with it."})

    def _pipeline_coder(self, prompt: str) -> str:
        if not self.sota_accepted:
            return f"The pipeline:\n```python\n{BASELINE_MAIN}\n```\n"
        # each attempt differs: rdagent refuses code equal to the former
        code = LONG_MAIN.format(mark=LONG_MARK, number=self.calls["pipeline_coder"])
        return f"The pipeline:\n```python\n{code}\n```\n"

    def _pipeline_eval(self, prompt: str) -> str:
        ran = "Code ran successfully." in prompt
        return json.dumps({
            "execution": "The debug run succeeded." if ran else "The debug run failed; see its output.",
            "return_checking": "submission.csv and scores.csv are written in the required format." if ran
            else "No submission was written.",
            "code": "[Code analysis] A small, readable baseline." if ran else "[Code analysis] The code exits early.",
            "final_decision": ran})

    def _runner_eval(self, prompt: str) -> str:
        ran = "The code executed successfully." in prompt
        return json.dumps({
            "execution": "The full run succeeded." if ran else "The full run failed.",
            "return_checking": "The submission is valid." if ran else "No valid submission.",
            "code": "Readable and within the time limit.", "acceptable": ran,
            "hyperparameter_tuning_suggestion": "", "hyperparameter_tuning_decision": False})

    def _exp_feedback(self, prompt: str) -> str:
        with self._lock:  # only the first experiment ever runs to completion: it becomes the best
            replace, self.sota_accepted = not self.sota_accepted, True
        return json.dumps({
            "Observations": "The noise baseline ran and scored on the training slices.",
            "Feedback for Hypothesis": "Supported: noise tracks the quality ratings.",
            "New Hypothesis": "Texture features could add the artefacts' effect.",
            "Reasoning": "The first complete pipeline with a valid submission.",
            "Code Change Summary": "A linear model of the pixel standard deviation.",
            "Evaluation Aligned With Task": "yes", "Replace Best Result": "yes" if replace else "no",
            "EDA Improvement": "no", "Acceptable": "yes"})
