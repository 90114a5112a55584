"""Failure analysis from the journal alone: why runs ended, how each step ended (error types, the validator's reason
for an invalid submission), where the time went, whether the final submission was valid."""

from __future__ import annotations

import pytest

from rexmle_agents.analysis.failures import classify_output, run_failures


@pytest.mark.parametrize(("output", "stopped_by", "exit_code", "kind"), [
    ("Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", None, 1, "cuda_oom"),
    ("RuntimeError: CUDA error: out of memory", None, 1, "cuda_oom"),
    ("ModuleNotFoundError: No module named 'monai'", None, 1, "import_error"),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x512 and 256x10)", None, 1, "shape_mismatch"),
    ("ValueError: operands could not be broadcast together with shapes (3,4) (5,)", None, 1, "shape_mismatch"),
    ("RuntimeError: Error(s) in loading state_dict: size mismatch for fc.weight", None, 1, "shape_mismatch"),
    ("epoch 3", "timeout", None, "timeout"),
    ("", "memory", None, "host_oom"),
    ("", "signal:9", None, "killed"),
    ("urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>", None, 1, "network"),
    ("FileNotFoundError: [Errno 2] No such file or directory: '../data/train.csv'", None, 1, "file_not_found"),
    ("  File \"a.py\", line 3\n    def f(\nSyntaxError: '(' was never closed", None, 1, "syntax_error"),
    ("Traceback (most recent call last):\nKeyError: 'quality'", None, 1, "exception:KeyError"),
    ("Segmentation fault", None, 139, "nonzero_exit"),
    ("VALIDATION_METRIC: 0.7", None, 0, "ok"),
])
def test_error_types(output, stopped_by, exit_code, kind) -> None:
    assert classify_output(output, stopped_by, exit_code)[0] == kind


def test_the_last_exception_decides_not_a_warning_printed_earlier() -> None:
    output = "ImportWarning: could not import lightgbm, falling back\n...\nValueError: all input arrays must have " \
             "the same shape"
    assert classify_output(output, None, 1) == ("shape_mismatch", "ValueError: all input arrays must have the same "
                                                                  "shape")


def test_a_run_that_failed_every_way(example_runs) -> None:
    failures = run_failures(example_runs["isles-failures"])
    # no node validated: the run submitted its marked fallback, the task's sample submission, which does
    assert failures.end == "finished" and failures.final_valid is True and failures.final_source == "grade"
    journal = (example_runs["isles-failures"].run_dir / "journal.jsonl").read_text()
    assert "FALLBACK: no node produced a submission that validated" in journal
    outcomes = [(o.outcome, o.error_type) for o in failures.outcomes]
    assert outcomes == [("crashed", "network"), ("invalid_submission", "invalid_submission"), ("crashed", "timeout")]
    assert "missing" in failures.outcomes[1].detail  # the validator's own reason
    assert failures.crashed == 2 and failures.invalid == 1 and failures.executed == 3
    assert failures.error_types == {"network": 1, "invalid_submission": 1, "timeout": 1}


def test_crashes_then_a_valid_submission(example_runs) -> None:
    plain = run_failures(example_runs["ldct-plain"])
    assert [o.error_type for o in plain.outcomes] == ["import_error", None]
    assert plain.final_valid is True and plain.crashed == 1
    seg = run_failures(example_runs["isles-threshold"])
    assert seg.outcomes[0].error_type == "shape_mismatch"


def test_time_is_split_between_code_model_calls_and_the_rest(example_runs) -> None:
    for run in example_runs.values():
        f = run_failures(run)
        assert f.time_s > 0 and f.exec_s > 0
        assert f.idle_s == pytest.approx(max(0.0, f.time_s - f.exec_s - f.model_s))
    slow = run_failures(example_runs["isles-failures"])
    assert slow.exec_s >= 4.0  # the training that ran into its 4 s limit
