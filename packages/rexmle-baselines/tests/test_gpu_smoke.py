"""The GPU smoke path: each family's ``smoke`` config (the ``full`` networks, patches, batches and sampler steps
with only epochs/iterations/folds cut) on a synthetic task, in its own process, must write a valid submission
within its time limit. Marked ``gpu`` (opt in with ``-m gpu``) and skipped without a CUDA device; on a bare GPU
machine ``tools/gpu_smoke.sh`` installs what is missing and runs the same runs with a summary table.

Without a GPU only the plumbing is checked here: the extrapolation from a smoke's seconds per step and the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_baselines.base import cuda_available
from rexmle_baselines.smoke import SMOKE_RUNS, SmokeRun, extrapolate, markdown, run_one, steady_seconds_per_step

LIMIT_S = 600  # one run; all of them together take a few minutes on one H100-class GPU (the design target)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU here: the smoke configs are sized for one "
                                                 "(tools/gpu_smoke.sh runs them on a GPU machine)")
@pytest.mark.parametrize("run", SMOKE_RUNS, ids=[f"{r.baseline}-{r.task_id}" for r in SMOKE_RUNS])
def test_the_smoke_config_writes_a_valid_submission_on_a_gpu(run: SmokeRun, tmp_path: Path) -> None:
    result = run_one(run, tmp_path / "data", tmp_path / "out", limit_s=LIMIT_S, device="cuda")
    assert not result["timed_out"], f"over {LIMIT_S} s: see {tmp_path / 'out'}"
    assert result["valid"], (result["problems"], (tmp_path / "out" / f"{run.baseline}.{run.task_id}" /
                                                  "output.log").read_text()[-3000:])
    assert result["seconds_per_step"] and result["peak_gpu_memory_gb"]


def test_smoke_measurements_extrapolate_to_the_real_datasets_size() -> None:
    run = SmokeRun("monai-seg", "topcow-track1-task1", 8, "test")
    record = {"measurements": {"seconds_per_step": {"model": 0.5}}}
    estimate = extrapolate(record, run)
    # TopCoW has 100 training cases: 400 epochs (40k steps rule) x 100 steps of batch 2, at 0.5 s a step
    assert estimate["real_training_cases"] == 100 and estimate["full_steps"] == 40_000
    assert estimate["full_gpu_hours_estimate"] == pytest.approx(40_000 * 0.5 / 3600, abs=0.01)
    assert estimate["budget_gpu_hours_estimate"] == pytest.approx(5.56, abs=0.01)  # under 12 h: the same
    nnunet = extrapolate({"measurements": {"seconds_per_step": {"fold 0": 0.2}}}, SMOKE_RUNS[0])
    assert nnunet["full_steps"] == 5 * 1000 * 250 and nnunet["budget_gpu_hours_estimate"] == 12.0
    assert extrapolate({}, run)["full_gpu_hours_estimate"] is None
    # the folds of one network count by the warm one; different networks by their mean
    assert steady_seconds_per_step({"fold 0": 4.69586, "fold 1": 0.03215}) == pytest.approx(0.03215)
    assert steady_seconds_per_step({"quadrant": 0.1, "enumeration": 0.2, "diagnosis": 0.3}) == pytest.approx(0.2)


def test_the_smoke_table_labels_estimates_as_estimates() -> None:
    result = {"baseline": "unet-enhance", "task_id": "usenhance", "valid": True, "timed_out": False, "seconds": 42.0,
              "peak_gpu_memory_gb": 3.5, "seconds_per_step": {"model": 0.1}, "full_gpu_hours_estimate": 0.83,
              "budget_gpu_hours_estimate": 0.83}
    table = markdown([result], "NVIDIA H100")
    assert "(measured)" in table and "(estimates, not measurements)" in table and "| unet-enhance | usenhance | yes" \
        in table


def test_the_step_clock_leaves_the_first_step_out(monkeypatch) -> None:
    """The first optimiser step pays for CUDA's start and cuDNN autotuning: the steady seconds per step, which the
    estimates extrapolate, are those after it; the first step's own seconds are recorded beside them."""
    from rexmle_baselines import base

    now = iter([100.0, 102.5, 112.5])  # start, after the first step (2.5 s), when recorded: 10 s for 4 more steps
    monkeypatch.setattr(base.time, "monotonic", lambda: next(now))
    clock = base.StepClock()
    for _ in range(5):
        clock.tick()
    assert clock.seconds_per_step() == pytest.approx(2.5)
    assert clock.first_step_s == pytest.approx(2.5)
    now = iter([0.0, 3.0, 3.0])  # one step of 3 s: its own time, warm-up and all
    single = base.StepClock()
    assert single.seconds_per_step() is None  # no step yet
    single.tick()
    assert single.seconds_per_step() == pytest.approx(3.0)
