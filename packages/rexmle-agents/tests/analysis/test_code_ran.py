"""Code counts as evidence only where it ran: a script that crashed counts up to the line its traceback names (in
each function on the traceback, with what that code calls), a script that exited 0 counts whole, one that never got
going counts not at all; quotes and detector hits say which rule decided. The tracebacks are real: the scripts are
run here by the same Python, under the file name the scaffold engine gives them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from rexmle_agents.analysis.detectors import detect
from rexmle_agents.analysis.evidence import NodeText, Output, RunText, _step_files
from rexmle_agents.analysis.factors import load_rubrics

RUBRIC = load_rubrics().label
CT = "low-dose abdominal CT (single slices)"


def executed(tmp_path: Path, code: str, node_id: int = 3, *, earlier: tuple[Output, ...] = ()) -> NodeText:
    """A scaffold node whose code was really run as ``node_<id>.py``, with its real output and exit status."""
    name = f"node_{node_id:04d}.py"
    (tmp_path / name).write_text(code, encoding="utf-8")
    done = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)
    text = done.stdout.rstrip() + (f"\n--- stderr ---\n{done.stderr.rstrip()}" if done.stderr.strip() else "")
    final = Output(name=f"step0003-node{node_id}", exit_code=done.returncode, stopped_by=None, seconds=0.1, text=text)
    return NodeText(id=node_id, stage="improve", parent=None, code=code, outputs=(*earlier, final),
                    files=((name, 1),))


CRASHES_MIDWAY = textwrap.dedent("""\
    import random

    def augment(image):
        if random.random() < 0.5:
            image = image[::-1]
        return image

    def keep_largest(mask):
        labels, count = ndimage.label(mask)
        return labels == 1

    class Net:
        def forward(self, x):
            return x

    def main():
        data = [augment([1, 2, 3]) for _ in range(4)]
        model = Net()
        print("training on", len(data))
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        predictions = [keep_largest(p) for p in data]
        best_threshold = max(thresholds, key=lambda t: score(t))

    if __name__ == "__main__":
        main()
    """)


def test_a_crashed_script_counts_up_to_its_traceback_line_and_what_that_code_called(tmp_path) -> None:
    node = executed(tmp_path, CRASHES_MIDWAY)
    assert node.outputs[-1].exit_code == 1 and "line 20, in main" in node.outputs[-1].text
    run = RunText(run_id="r", nodes=(node,))
    before = run.verify(3, 'print("training on", len(data))')
    assert before.verified and "crashed at line 20" in before.rule
    after = run.verify(3, "predictions = [keep_largest(p) for p in data]")
    assert not after.verified and "not in the part of it that ran" in after.problem
    assert "crashed at line 20" in after.problem and after.rule == before.rule
    # called before the crash: the helper's body and the class's methods ran (or could have)
    assert run.verify(3, "image = image[::-1]").verified
    assert run.verify(3, "def forward(self, x):").verified
    # called only after the crash: its body never ran
    assert not run.verify(3, "labels, count = ndimage.label(mask)").verified
    # a quote cannot bridge the line that did not run
    assert not run.verify(3, "labels, count = ndimage.label(mask) return labels == 1").verified


def test_detectors_read_only_the_code_that_ran_and_say_by_which_rule(tmp_path) -> None:
    crashed = RunText(run_id="r", nodes=(executed(tmp_path, CRASHES_MIDWAY),))
    verdicts = {v.factor: v for v in detect(crashed, CT, RUBRIC)}
    # keep_largest (connected components) and the threshold search sit after the crash
    assert not verdicts["post_processing"].demonstrated
    assert not verdicts["hyperparameter_search"].demonstrated
    assert "node(s) 3 counted only up to where its run crashed" in verdicts["post_processing"].reason
    # the random flip ran before it
    assert verdicts["data_augmentation"].demonstrated
    assert "crashed at line 20" in verdicts["data_augmentation"].reason
    assert all("crashed at line 20" in q.rule for q in verdicts["data_augmentation"].evidence)

    fixed = "\n".join(line for line in CRASHES_MIDWAY.splitlines() if "raise RuntimeError" not in line).replace(
        "ndimage.label(mask)", "(mask, 1)").replace("best_threshold = max(thresholds, key=lambda t: score(t))",
                                                    "print(len(predictions))")
    clean = RunText(run_id="r", nodes=(executed(tmp_path, fixed),))
    ok = {v.factor: v for v in detect(clean, CT, RUBRIC)}["data_augmentation"]
    assert ok.demonstrated and "exited 0" in ok.reason and "exited 0" in ok.evidence[0].rule


def test_a_crash_deep_in_a_helper_counts_the_callers_up_to_their_calls(tmp_path) -> None:
    code = textwrap.dedent("""\
        def load():
            return [1, 2, 3]

        def train(data):
            total = sum(data)
            return total / 0

        def report(value):
            print("searched grid, best", value)

        rows = load()
        print("loaded rows:", len(rows))
        score = train(rows)
        report(score)
        print("never printed at all")
        """)
    run = RunText(run_id="r", nodes=(executed(tmp_path, code),))
    assert run.verify(3, "total = sum(data)").verified  # in train, before the line that raised
    assert run.verify(3, "return [1, 2, 3]").verified  # load() was called before the crash and returned
    assert run.verify(3, 'print("loaded rows:", len(rows))').verified
    assert not run.verify(3, 'print("searched grid, best", value)').verified  # report() is called after it
    assert not run.verify(3, 'print("never printed at all")').verified


def test_the_final_execution_decides_not_an_earlier_failed_sample_run(tmp_path) -> None:
    failed_sample = Output(name="step0003-node3-sample", exit_code=1, stopped_by=None, seconds=0.1,
                           text='Traceback (most recent call last):\n  File "node_0003.py", line 1, in <module>\n'
                                "KeyError: 'x'")
    code = "import json\nprint(json.dumps({'fold': 1}))\nlabels = sorted([3, 1, 2], key=lambda v: -v)\n"
    node = executed(tmp_path, code, earlier=(failed_sample,))
    quote = RunText(run_id="r", nodes=(node,)).verify(3, "labels = sorted([3, 1, 2], key=lambda v: -v)")
    assert quote.verified and "exited 0" in quote.rule


def test_a_syntax_error_a_timeout_or_a_lost_traceback_count_no_code(tmp_path) -> None:
    broken = executed(tmp_path, "x = compute_features(\nmodel = fit(x)\n")
    assert broken.outputs[-1].exit_code == 1
    assert broken.reach.lines == frozenset() and "does not parse" in broken.reach.rule
    quote = RunText(run_id="r", nodes=(broken,)).verify(3, "model = fit(x)")
    assert not quote.verified and "not in the part of it that ran" in quote.problem

    timed_out = NodeText(id=4, stage="draft", parent=None, code="for epoch in range(10**9):\n    model.fit(x)\n",
                         outputs=(Output(name="n4", exit_code=None, stopped_by="timeout", seconds=3600.0,
                                         text="epoch 1 loss 0.3\n"),), files=(("node_0004.py", 1),))
    assert timed_out.reach.lines == frozenset() and "names no line of the script" in timed_out.reach.rule
    run = RunText(run_id="r", nodes=(timed_out,))
    assert run.verify(4, "epoch 1 loss 0.3").verified  # its output is still evidence
    assert not run.verify(4, "for epoch in range(10**9):").verified

    library_only = NodeText(id=5, stage="draft", parent=None, code="import torch\nmodel = build()\n", outputs=(
        Output(name="n5", exit_code=1, stopped_by=None, seconds=1.0,
               text='  File "/usr/lib/python3/site-packages/torch/nn/modules/module.py", line 1501, in _call_impl\n'
                    "RuntimeError: boom"),), files=(("node_0005.py", 1),))
    assert library_only.reach.lines == frozenset()


def test_step_agents_files_are_matched_by_name() -> None:
    train = "import prep\nmodel_a = prep.VALUE + 1\nraise SystemExit(f'failed after {model_a}')\nmodel_b = fit_b(x)\n"
    code = "# prep.py\nVALUE = compute_value()\n\n\n# train.py\n" + train  # as results.trajectory joins them
    files = _step_files(code)
    assert files == (("prep.py", 2), ("train.py", 6))
    crash = Output(name="s1", exit_code=1, stopped_by=None, seconds=1.0,
                   text='Traceback (most recent call last):\n  File "/w/train.py", line 3, in <module>\n'
                        "    raise SystemExit\nSystemExit: failed after 2")
    run = RunText(run_id="r", nodes=(NodeText(id=1, stage="step", parent=None, code=code, outputs=(crash,),
                                              files=files),))
    assert run.verify(1, "model_a = prep.VALUE + 1").verified
    assert not run.verify(1, "model_b = fit_b(x)").verified
    assert not run.verify(1, "VALUE = compute_value()").verified  # prep.py is named by no frame


def test_a_judge_quoting_code_after_the_crash_is_unverified_not_demonstrated(tmp_path, make_judge) -> None:
    from rexmle_agents.analysis.evidence import TaskBrief
    from rexmle_agents.models import ModelResponse, ToolCall, Usage

    run = RunText(run_id="r", nodes=(executed(tmp_path, CRASHES_MIDWAY),))
    quote = {"node": 3, "quote": "predictions = [keep_largest(p) for p in data]"}
    answer = ModelResponse(tool_calls=(ToolCall(id="c1", name="submit_verdict", arguments={
        "demonstrated": True, "evidence": [quote], "reason": "keeps the largest component"}),),
        usage=Usage(input_tokens=10, output_tokens=10), finish_reason="tool_calls")
    judge = make_judge([answer])
    verdict = judge.judge(run, load_rubrics().get("post_processing"), TaskBrief(task_id="t"))
    assert verdict.status == "unverified" and not verdict.demonstrated
    assert "not in the part of it that ran" in verdict.reason and "crashed at line 20" in verdict.evidence[0].rule
    assert "crashed at line 20" in run.chunks()[0].text  # the judge is told which part ran
