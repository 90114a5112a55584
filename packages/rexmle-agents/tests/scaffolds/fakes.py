"""A scripted stand-in for the models the scaffolds call, and the scripts it "writes" for the LDCT-IQA task.

The fake model recognises each operator by its prompt's first heading, hands out the scripts in the order a test
asks for, and reviews an execution the way a careful model would: from the exit status and the printed
``VALIDATION_METRIC`` line, always through a tool call. Loaded by path (pytest's importlib mode) by conftest.py and
by the subprocess of the resume test.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Sequence

from rexmle_agents.models import Message, ModelResponse, ToolCall, ToolSpec

# A tiny model as an agent would write it: quality falls with noise, so a linear fit of the score on a noise
# estimate beats the constant sample submission. ALPHA changes between "improvements" so metrics differ.
GOOD_SCRIPT = '''
import csv, os
from pathlib import Path
import numpy as np
import tifffile

ALPHA = {alpha}
data = Path("../data")
out = Path(os.environ["SUBMISSION_DIR"])
sample = os.environ.get("SAMPLE") == "1"

def features(path):
    image = tifffile.imread(path).astype(float)
    residual = image[1:, :] - image[:-1, :]
    return [1.0, float(np.log(np.median(np.abs(residual)) + 1e-6)), float(image.std())]

rows = list(csv.DictReader((data / "train" / "labels.csv").open()))
if sample:
    rows = rows[:6]
x = np.array([features(data / "train" / "images" / (r["image_id"] + ".tif")) for r in rows])
y = np.array([float(r["quality_score"]) for r in rows])
cut = max(2, len(rows) * 2 // 3)
def fit(a, b):
    return np.linalg.solve(a.T @ a + ALPHA * np.eye(a.shape[1]), a.T @ b)
w = fit(x[:cut], y[:cut])
pred = x[cut:] @ w
corr = float(np.corrcoef(pred, y[cut:])[0, 1]) if len(pred) > 1 and pred.std() > 0 else 0.0
print("VALIDATION_METRIC:", round(corr if corr == corr else 0.0, 6))
w = fit(x, y)
test_ids = [r["image_id"] for r in csv.DictReader((data / "sample_submission" / "submission.csv").open())]
with (out / "submission.csv").open("w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(["image_id", "quality_score"])
    for case in test_ids:
        value = float(np.clip(np.array(features(data / "test" / "images" / (case + ".tif"))) @ w, 0, 4))
        writer.writerow([case, round(value, 4)])
'''
CRASH_SCRIPT = "import csv\nraise RuntimeError('the model forgot to load the data')\n"
SLOW_SCRIPT = "import time\nprint('training forever', flush=True)\ntime.sleep(600)\n"
NO_CODE = "I would train a gradient-boosted regressor on texture features."

_METRIC = re.compile(r"VALIDATION_METRIC:\s*(-?[0-9.]+(?:e-?\d+)?)")


def good(alpha: float = 1.0) -> str:
    return GOOD_SCRIPT.replace("{alpha}", repr(alpha))


def answer(plan: str, code: str) -> str:
    return f"{plan}\n\n```python\n{code}```\n"


class FakeModel:
    """A function of the request, for ``ScriptedBackend``: drafts from ``drafts`` in turn, good scripts for debug and
    improve (each improvement a slightly different ridge penalty), reviews through ``submit_review``."""

    def __init__(self, drafts: Sequence[str], *, debug: str | None = None, review_without_tool: int = 0,
                 feedback_without_decision: int = 0) -> None:
        self.drafts = list(drafts)
        self.debug = debug
        self.review_without_tool = review_without_tool  # the first N reviews forget the tool call
        self.feedback_without_decision = feedback_without_decision  # the first N feedbacks leave out replace_best
        self.counts: dict[str, int] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: object) -> ModelResponse | str:
        prompt = messages[-1].content
        if messages[-1].role == "user" and "did not give a usable call" in prompt:
            prompt = next(m.content for m in messages if m.role == "user")
        kind = self._kind(prompt)
        with self._lock:
            number = self.counts.get(kind, 0)
            self.counts[kind] = number + 1
            call_id = f"call-{next(self._ids)}"
        if kind == "draft":
            return answer(f"Draft {number}: a linear fit on noise features.", self.drafts[number % len(self.drafts)])
        if kind in ("debug", "revise"):
            return answer("Fix: load the data properly.", self.debug or good(0.5))
        if kind == "improve":
            return answer("Change the ridge penalty.", good(0.1 * (number + 2)))
        if kind == "review":
            if number < self.review_without_tool:
                return "It looks fine to me."
            return self._review(prompt, call_id)
        if kind == "hypothesise":
            return _tool(call_id, "propose_hypothesis", {"hypothesis": f"A noise feature predicts quality ({number})",
                                                         "rationale": "low dose adds noise"})
        if kind == "critique":
            return _tool(call_id, "submit_code_review", {"ready": True, "feedback": ""})
        decision = {} if number < self.feedback_without_decision else {"replace_best": True}
        return _tool(call_id, "submit_feedback", {"supported": True, "observations": "it ran",
                                                  "lesson": f"lesson {number}", **decision})

    @staticmethod
    def _kind(prompt: str) -> str:
        for heading, kind in (("# Your job: a first solution", "draft"), ("# Your job: fix", "debug"),
                              ("# Your job: improve", "improve"), ("# Review one execution", "review"),
                              ("# Your job: propose the next hypothesis", "hypothesise"),
                              ("# Your job: review a script", "critique"), ("# Your job: revise", "revise")):
            if prompt.lstrip().startswith(heading):
                return kind
        return "feedback"

    @staticmethod
    def _review(prompt: str, call_id: str) -> ModelResponse:
        execution = prompt.split("## Execution", 1)[1]
        match = _METRIC.search(prompt.split("## Output (tail)", 1)[1])
        ok = "exit status 0" in execution.split("##", 1)[0]
        metric = float(match.group(1)) if match else None
        return _tool(call_id, "submit_review", {"is_bug": not ok or metric is None, "metric": metric,
                                                "metric_name": "score", "is_task_metric": True,
                                                "summary": "reviewed by the fake"})


def _tool(call_id: str, name: str, arguments: dict[str, object]) -> ModelResponse:
    return ModelResponse(tool_calls=(ToolCall(id=call_id, name=name, arguments=arguments),), model="scripted/model",
                         finish_reason="tool_calls")
