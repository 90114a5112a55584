"""What every configuration promises, checked without training: the four configs of each baseline, GPU configs
refused on a CPU, ``--device auto``, the cuDNN switch, time budgets (epoch planning, the default 12 h), the
strongest-first preference, lateralised tasks, and atomic publishing of a submission."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import ClassVar

import pytest

from rexmle_baselines import base
from rexmle_baselines.api import run_baseline
from rexmle_baselines.base import (
    CONFIGS,
    DEFAULT_TIME_BUDGET_S,
    Baseline,
    BaselineContext,
    CosineSchedule,
    EpochPlan,
    baseline_names,
    cuda_available,
    get_baseline,
    lateralised_labels,
    preferred_baseline,
    publish_submission,
    resolve_device,
    seed_everything,
)
from rexmle_grade.errors import ConfigurationError


def test_every_baseline_has_the_four_configs_with_the_shared_switches() -> None:
    for name in baseline_names():
        configs = get_baseline(name).configs
        assert set(configs) == set(CONFIGS), name
        if not get_baseline(name).trains:
            assert all(c == configs["quick"] for c in configs.values()), name  # nothing to size: one config
            continue
        assert configs["quick"]["deterministic"] is True, name  # CPU tests stay repeatable
        for config in ("budget", "full", "smoke"):
            assert configs[config]["deterministic"] is False, (name, config)  # cuDNN autotuning on a GPU
        assert configs["budget"]["time_aware"] is True and configs["full"]["time_aware"] is False, name


def test_the_smoke_configs_keep_the_full_networks_and_cut_only_the_length() -> None:
    length = {"epochs", "iterations", "val_iterations", "folds", "steps_per_epoch", "cache_gb", "reserve_s",
              "pretrained", "trainable_layers"}
    for name in (n for n in baseline_names() if get_baseline(n).trains):
        configs = get_baseline(name).configs
        changed = {k for k in configs["full"] if configs["smoke"][k] != configs["full"][k]}
        assert changed <= length, (name, changed - length)
        assert changed & {"epochs", "iterations", "folds"}, name


class _Records(Baseline):
    """Copies the sample submission and keeps the context it was given."""

    name: ClassVar[str] = "records"
    extra: ClassVar[str] = "none"
    requires: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = "test double"
    configs: ClassVar[dict] = {config: {"deterministic": config == "quick", "time_aware": config == "budget"}
                               for config in CONFIGS}
    seen: ClassVar[list[BaselineContext]] = []

    def supports(self, task_id: str, grader_id: str) -> bool:
        return True

    def run(self, ctx: BaselineContext) -> None:
        self.seen.append(ctx)
        shutil.copytree(ctx.public_dir / "sample_submission", ctx.out_dir, dirs_exist_ok=True)


@pytest.fixture
def records(monkeypatch: pytest.MonkeyPatch) -> type[_Records]:
    monkeypatch.setitem(base._REGISTRY, _Records.name, _Records)
    _Records.seen.clear()
    return _Records


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
@pytest.mark.parametrize("config", ["budget", "full", "smoke"])
def test_a_gpu_sized_config_on_a_cpu_is_refused_unless_allowed(config: str, records, prepared) -> None:
    public = prepared.public("ravir", cases=4)
    with pytest.raises(ConfigurationError, match=f"the '{config}' configuration is sized for a GPU") as info:
        run_baseline(records.name, "ravir", public_dir=public, config=config)
    assert "--allow-cpu" in (info.value.hint or "")
    assert run_baseline(records.name, "ravir", public_dir=public, config=config, allow_cpu=True).valid


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
def test_device_auto_is_the_default_and_means_the_cpu_here(records, prepared) -> None:
    assert resolve_device("auto") == "cpu"
    run = run_baseline(records.name, "ravir", public_dir=prepared.public("ravir", cases=4))
    assert run.device == "cpu" and records.seen[-1].device == "cpu" and run.gpu_hours == 0.0
    with pytest.raises(ConfigurationError, match="device must be one of auto, cpu, cuda"):
        resolve_device("gpu")


def test_the_budget_config_gets_twelve_hours_unless_told_and_records_them(records, prepared) -> None:
    public = prepared.public("ravir", cases=4)
    run = run_baseline(records.name, "ravir", public_dir=public, config="budget", allow_cpu=True)
    assert run.time_budget_s == DEFAULT_TIME_BUDGET_S == 12 * 3600
    assert 0 < records.seen[-1].seconds_left() <= DEFAULT_TIME_BUDGET_S
    run = run_baseline(records.name, "ravir", public_dir=public, config="budget", allow_cpu=True, time_budget_s=90)
    assert run.time_budget_s == 90 and records.seen[-1].seconds_left() <= 90
    assert run_baseline(records.name, "ravir", public_dir=public).time_budget_s is None  # quick: no limit


def test_deterministic_cudnn_is_a_switch_and_is_recorded(records, prepared) -> None:
    torch = pytest.importorskip("torch")
    seed_everything(0, deterministic=False)
    assert not torch.backends.cudnn.deterministic and torch.backends.cudnn.benchmark
    seed_everything(0, deterministic=True)
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    run = run_baseline(records.name, "ravir", public_dir=prepared.public("ravir", cases=4), config="full",
                       allow_cpu=True)
    assert run.params["deterministic"] is False and not torch.backends.cudnn.deterministic


def _context(tmp_path: Path, *, deadline: float | None, time_aware: bool, reserve_s: float = 0.0) -> BaselineContext:
    return BaselineContext(task_id="ravir", grader_id="ravir", public_dir=tmp_path, out_dir=tmp_path,
                           work_dir=tmp_path, config="budget", params={"time_aware": time_aware,
                                                                       "reserve_s": reserve_s},
                           device="cpu", seed=0, log=lambda line: None, deadline=deadline)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_time_aware_plan_fits_its_epochs_into_the_time_left(tmp_path: Path, monkeypatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    plan = EpochPlan(_context(tmp_path, deadline=clock.now + 100, time_aware=True, reserve_s=20), epochs=50)
    clock.now += 10  # one epoch took 10 s; 90 s are left, 20 of them kept for predicting: 7 more epochs fit
    assert plan.after_epoch() == 8
    clock.now += 10
    assert plan.after_epoch() == 8
    grown = EpochPlan(_context(tmp_path, deadline=clock.now + 10_000, time_aware=True), epochs=50)
    clock.now += 10
    assert grown.after_epoch() == 50  # never more than the config's epochs


def test_other_plans_only_stop_early_and_say_so(tmp_path: Path, monkeypatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    lines: list[str] = []
    ctx = _context(tmp_path, deadline=clock.now + 35, time_aware=False)
    ctx = BaselineContext(**{**ctx.__dict__, "log": lines.append})
    plan = EpochPlan(ctx, epochs=50)
    clock.now += 10
    assert plan.after_epoch() == 3 and "the deadline stops training after epoch 3 of 50" in lines[-1]
    free = EpochPlan(_context(tmp_path, deadline=None, time_aware=False), epochs=50)
    clock.now += 1000
    assert free.after_epoch() == 50


def test_the_cosine_schedule_can_be_resized_while_training() -> None:
    torch = pytest.importorskip("torch")
    optimiser = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = CosineSchedule(optimiser, total=100)
    schedule.step()
    assert optimiser.param_groups[0]["lr"] > 0.99
    schedule.resize(2)  # the time budget turned out to allow only 2 steps: the next reaches 0
    schedule.step()
    assert optimiser.param_groups[0]["lr"] == pytest.approx(0.0)
    schedule.resize(1)  # never below the steps already taken
    assert schedule.total == 2


def test_publishing_replaces_a_submission_file_by_file_with_the_table_last(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out, staging = tmp_path / "out", tmp_path / "staging"
    (out / "predictions").mkdir(parents=True)
    (out / "submission.csv").write_text("old table\n")
    (out / "predictions" / "a.nii.gz").write_text("old a")
    (staging / "predictions").mkdir(parents=True)
    (staging / "submission.csv").write_text("new table\n")
    (staging / "predictions" / "a.nii.gz").write_text("new a")
    (staging / "predictions" / "b.nii.gz").write_text("new b")
    replaced: list[str] = []
    real_replace = os.replace

    def recording(src: str | Path, dst: str | Path) -> None:
        replaced.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording)
    publish_submission(staging, out)
    assert replaced[-1] == "submission.csv" and sorted(replaced[:-1]) == ["a.nii.gz", "b.nii.gz"]
    assert (out / "submission.csv").read_text() == "new table\n"
    assert (out / "predictions" / "a.nii.gz").read_text() == "new a"
    assert not staging.exists() and not list(out.rglob(".*.partial"))


@pytest.mark.parametrize(("task_id", "config", "expected"), [
    ("isles22", "full", "nnunet"), ("topcow-track1-task3", "full", "nnunet"), ("topbrain-track2", "budget", "nnunet"),
    ("usenhance", "full", "unet-enhance"), ("dentex", "full", "detector"), ("ldct-iqa", "full", "timm-regress"),
    ("isles22", "quick", "monai-seg"), ("topcow-track2-task3", "quick", "timm-cls"),
    ("usenhance", "quick", "unet-enhance"),
])
def test_the_preferred_baseline_is_the_strongest_not_the_first_alphabetically(task_id: str, config: str,
                                                                              expected: str) -> None:
    assert preferred_baseline(task_id, config, installed_only=False) == expected
    assert sorted(base.preferred_baselines(task_id, config)) == sorted(base.baselines_for(task_id))


def test_lateralised_tasks_are_declared_in_the_task_metadata() -> None:
    for task in ("topcow-track1-task1", "topcow-track2-task3", "topbrain-track1", "topbrain-track2", "dentex"):
        assert lateralised_labels(task), task
    for task in ("isles22", "seg_a", "panther-task1", "ravir", "neurips-cellseg", "puma-track1-task1", "usenhance"):
        assert not lateralised_labels(task), task
