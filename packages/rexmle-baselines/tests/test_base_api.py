"""The baseline interface: registry, seeds, devices, divergence, caches, and run_baseline's refusals."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import ClassVar

import pytest

from rexmle_baselines import base
from rexmle_baselines.api import merge_params, run_baseline
from rexmle_baselines.base import (
    Baseline,
    BaselineContext,
    TrainingDivergedError,
    check_loss,
    cuda_available,
    get_baseline,
    isolate_caches,
    resolve_device,
)
from rexmle_baselines.nnunet import check_training_log
from rexmle_grade.errors import ConfigurationError, UnknownNameError, UserInputError


def test_unknown_baseline_names_the_close_match() -> None:
    with pytest.raises(UnknownNameError, match="unknown baseline 'nnunte'") as info:
        get_baseline("nnunte")
    assert "nnunet" in (info.value.hint or "")


def test_check_loss_passes_finite_losses_and_stops_at_nan_with_epoch_and_last_finite() -> None:
    assert check_loss(0.5, epoch=0, last_finite=None) == 0.5
    with pytest.raises(TrainingDivergedError, match=r"at epoch 3; the last finite loss was 0\.25") as info:
        check_loss(math.nan, epoch=3, last_finite=0.25)
    assert info.value.epoch == 3 and info.value.last_finite == 0.25
    with pytest.raises(TrainingDivergedError, match="no finite loss before it"):
        check_loss(math.inf, epoch=0, last_finite=None)


def test_nnunet_training_log_with_a_nan_epoch_diverges() -> None:
    log = "\n".join(["t: Epoch 0", "t: train_loss 0.81", "t: Epoch 1", "t: train_loss -0.2", "t: Epoch 2",
                     "t: train_loss nan", "t: val_loss nan"])
    with pytest.raises(TrainingDivergedError, match=r"epoch 2; the last finite loss was -0\.2"):
        check_training_log(log)
    check_training_log("t: Epoch 0\nt: train_loss 0.5\n")


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no CUDA GPU"):
        resolve_device("cuda")
    assert resolve_device("cpu") == "cpu"


def test_isolate_caches_points_every_cache_into_the_work_folder(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("TORCH_HOME", "HF_HOME", "MPLCONFIGDIR", "XDG_CACHE_HOME", "nnUNet_raw", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    isolate_caches(tmp_path)
    for variable in ("TORCH_HOME", "HF_HOME", "MPLCONFIGDIR", "XDG_CACHE_HOME", "nnUNet_raw"):
        assert Path(os.environ[variable]).is_relative_to(tmp_path) and Path(os.environ[variable]).is_dir()
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_overrides_are_typed_like_the_defaults_and_unknown_keys_refused() -> None:
    defaults = {"epochs": 2, "lr": 0.01, "tta": False, "folds": "all", "target": None}
    params = merge_params(defaults, {"epochs": "5", "lr": "1e-3", "tta": "true", "target": "0.5"})
    assert params == {"epochs": 5, "lr": 0.001, "tta": True, "folds": "all", "target": "0.5"}
    with pytest.raises(UserInputError, match="unknown parameter 'epoch'"):
        merge_params(defaults, {"epoch": "5"})
    with pytest.raises(UserInputError, match="expected a int"):
        merge_params(defaults, {"epochs": "many"})


class _NeedsAMissingModule(Baseline):
    name: ClassVar[str] = "needs-missing"
    extra: ClassVar[str] = "imaginary"
    requires: ClassVar[tuple[str, ...]] = ("rexmle_no_such_module",)
    description: ClassVar[str] = "test double"
    configs: ClassVar[dict] = {"quick": {}, "full": {}}

    def supports(self, task_id: str, grader_id: str) -> bool:
        return True

    def run(self, ctx: BaselineContext) -> None:
        raise AssertionError("must not run without its modules")


def test_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch, prepared) -> None:
    monkeypatch.setitem(base._REGISTRY, _NeedsAMissingModule.name, _NeedsAMissingModule)
    with pytest.raises(ConfigurationError, match="rexmle_no_such_module") as info:
        run_baseline("needs-missing", "ravir", public_dir=prepared.public("ravir", cases=4))
    assert "pip install 'rexmle-baselines[imaginary]'" in (info.value.hint or "")


def test_a_task_without_that_baseline_lists_the_ones_it_has() -> None:
    with pytest.raises(UserInputError, match="does not cover task 'dentex'") as info:
        run_baseline("nnunet", "dentex")
    assert "detector" in (info.value.hint or "")


class _NeedsNothing(Baseline):
    """Covers every task and needs no module, so the refusals below do not depend on installed extras."""

    name: ClassVar[str] = "needs-nothing"
    extra: ClassVar[str] = "none"
    requires: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = "test double"
    configs: ClassVar[dict] = {"quick": {}, "full": {}}

    def supports(self, task_id: str, grader_id: str) -> bool:
        return True

    def run(self, ctx: BaselineContext) -> None:
        raise AssertionError("the refusals come first")


@pytest.fixture
def needs_nothing(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(base._REGISTRY, _NeedsNothing.name, _NeedsNothing)
    return _NeedsNothing.name


def test_unprepared_task_names_the_prepare_command(needs_nothing: str, tmp_path: Path) -> None:
    from rexmle_grade.errors import TaskDataMissingError

    with pytest.raises(TaskDataMissingError, match="not prepared") as info:
        run_baseline(needs_nothing, "ravir", data_root=tmp_path)
    assert "rexmle prepare ravir" in (info.value.hint or "")


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
def test_run_with_cuda_but_no_gpu_stops_before_work(needs_nothing: str, prepared) -> None:
    with pytest.raises(ConfigurationError, match="no CUDA GPU"):
        run_baseline(needs_nothing, "ravir", public_dir=prepared.public("ravir", cases=4), device="cuda")


def test_an_out_folder_holding_other_files_is_never_emptied(needs_nothing: str, prepared, tmp_path: Path) -> None:
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    with pytest.raises(UserInputError, match="refusing to empty it"):
        run_baseline(needs_nothing, "ravir", public_dir=prepared.public("ravir", cases=4), out=tmp_path)
    assert keep.read_text() == "mine"
