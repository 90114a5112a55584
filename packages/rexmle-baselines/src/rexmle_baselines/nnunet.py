"""The ``nnunet`` baseline: nnU-Net v2 (the ``nnunetv2`` package, run through its own entry points).

Steps, all under ``work_dir``: the task's public data -> nnU-Net's raw dataset (``dataset.json``,
``imagesTr/{case}_{channel:04d}.nii.gz``, ``labelsTr/{case}.nii.gz``, ``imagesTs``; geometry kept) ->
``plan_and_preprocess`` -> ``train`` (trainer, configuration and folds by name) -> ``predict`` -> the task's
submission through :mod:`rexmle_baselines.convert`.

``quick`` trains the shipped ``nnUNetTrainerRexmleQuick`` (nnU-Net's trainer with 2 epochs of a few iterations and
no mirroring; found through ``nnUNet_extTrainer``) on fold ``all`` with the 3-D patch capped at 32 voxels per
axis; ``full`` is nnU-Net's default recipe (``nnUNetTrainer``, 1000 epochs, 5 folds, ensembled).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rexmle_baselines.base import Baseline, BaselineContext, check_loss, register_baseline
from rexmle_baselines.convert import SegmentationIO, segmentation_grader_ids, segmentation_io
from rexmle_grade.errors import ConfigurationError, RexmleError, require_module
from rexmle_grade.io import Geometry, write_volume

FILE_ENDING = ".nii.gz"
DATASET_ID = 501  # one dataset per work folder, so a fixed id never collides
TRAINERS_DIR = Path(__file__).parent / "nnunet_trainers"
CT_GRADERS = ("topcow-track1-task1", "topcow-track1-task2", "topcow-track1-task3", "topbrain-track1", "seg_a")


def dataset_name(task_id: str) -> str:
    return f"Dataset{DATASET_ID:03d}_{re.sub(r'[^A-Za-z0-9]+', '', task_id.title())}"


def channel_names(io: SegmentationIO, grader_id: str, n_channels: int) -> dict[str, str]:
    """nnU-Net's channel names pick the normalisation: ``CT`` clips and scales by the foreground's intensities,
    anything else is z-scored per image."""
    if grader_id in CT_GRADERS:
        return {str(c): "CT" for c in range(n_channels)}
    if io.dim == 2 and n_channels == 3:
        return {"0": "R", "1": "G", "2": "B"}
    if grader_id == "isles22":
        return {"0": "DWI", "1": "ADC"}
    return {str(c): "MRI" if io.dim == 3 else "image" for c in range(n_channels)}


def _write(path: Path, array: np.ndarray, geometry: Geometry) -> None:
    if array.ndim == 2:  # 2-D: a 2-D NIfTI with unit spacing, which nnU-Net's SimpleITKIO reads as 2-D
        import SimpleITK as sitk

        path.parent.mkdir(parents=True, exist_ok=True)
        sitk.WriteImage(sitk.GetImageFromArray(array), str(path), useCompression=True)
    else:
        write_volume(path, array, geometry)


def write_raw_dataset(io: SegmentationIO, raw_dir: Path, task_id: str, grader_id: str) -> Path:
    """Write the task as nnU-Net raw dataset ``raw_dir/Dataset501_<Task>``; returns that folder."""
    folder = raw_dir / dataset_name(task_id)
    n_channels = None
    training = io.training_cases()
    for subset, cases in (("Tr", training), ("Ts", io.test_cases())):
        for case in cases:
            image, geometry = io.read_image(case)
            if n_channels is None:
                n_channels = image.shape[0]
            if image.shape[0] != n_channels:
                raise ConfigurationError(f"case {case.case_id!r} has {image.shape[0]} channels, others {n_channels}",
                                         hint="every case of an nnU-Net dataset needs the same channels")
            for channel, values in enumerate(image):
                _write(folder / f"images{subset}" / f"{case.case_id}_{channel:04d}{FILE_ENDING}", values, geometry)
            if subset == "Tr":
                _write(folder / "labelsTr" / f"{case.case_id}{FILE_ENDING}", io.read_label(case), geometry)
    dataset = {
        "channel_names": channel_names(io, grader_id, n_channels or 1),
        "labels": dict(io.labels),
        "numTraining": len(training),
        "file_ending": FILE_ENDING,
        "name": task_id,
    }
    (folder / "dataset.json").write_text(json.dumps(dataset, indent=1) + "\n")
    return folder


def read_raw_case(folder: Path, case_id: str, *, subset: str = "Tr") -> tuple[np.ndarray, Geometry, np.ndarray | None]:
    """Read one case back from an nnU-Net raw dataset: (channels-first image, geometry, label or None)."""
    import SimpleITK as sitk

    n_channels = len(json.loads((folder / "dataset.json").read_text())["channel_names"])
    images = [sitk.ReadImage(str(folder / f"images{subset}" / f"{case_id}_{c:04d}{FILE_ENDING}"))
              for c in range(n_channels)]
    first = images[0]
    geometry = Geometry(size=tuple(first.GetSize()), spacing=tuple(first.GetSpacing()),
                        origin=tuple(first.GetOrigin()), direction=tuple(first.GetDirection()))
    label_path = folder / f"labels{subset}" / f"{case_id}{FILE_ENDING}"
    label = sitk.GetArrayFromImage(sitk.ReadImage(str(label_path))) if label_path.is_file() else None
    return np.stack([sitk.GetArrayFromImage(i) for i in images]), geometry, label


def read_predictions(folder: Path, case_ids: Sequence[str]) -> dict[str, np.ndarray]:
    import SimpleITK as sitk

    predictions = {}
    for case_id in case_ids:
        path = folder / f"{case_id}{FILE_ENDING}"
        if not path.is_file():
            raise RexmleError(f"nnU-Net wrote no prediction for test case {case_id!r} into {folder}",
                              hint="see the predict step's output above")
        predictions[case_id] = sitk.GetArrayFromImage(sitk.ReadImage(str(path)))
    return predictions


def cap_patch_size(plans_file: Path, configuration: str, cap: int) -> list[int]:
    """Shrink the planned patch of ``configuration`` to at most ``cap`` voxels per axis (kept a multiple of the
    network's total stride on that axis), editing nnU-Net's plans file as its documentation allows for manual
    changes; preprocessing does not depend on the patch, so nothing has to be redone."""
    plans = json.loads(plans_file.read_text())
    settings = plans["configurations"][configuration]
    strides = settings["architecture"]["arch_kwargs"]["strides"]
    patch = []
    for axis, size in enumerate(settings["patch_size"]):
        step = int(np.prod([stride[axis] for stride in strides]))
        patch.append(max(step, min(size, cap) // step * step))
    settings["patch_size"] = patch
    plans_file.write_text(json.dumps(plans, indent=1) + "\n")
    return patch


TRAIN_LOSS = re.compile(r"train_loss\s+(\S+)")
EPOCH = re.compile(r"Epoch (\d+)")


def check_training_log(text: str) -> None:
    """Raise :class:`TrainingDivergedError` if an epoch of nnU-Net's training log has a non-finite train loss."""
    epoch, last_finite = 0, None
    for line in text.splitlines():
        if match := EPOCH.search(line):
            epoch = int(match[1])
        elif match := TRAIN_LOSS.search(line):
            last_finite = check_loss(float(match[1]), epoch=epoch, last_finite=last_finite)


def _entry(module: str, function: str, args: Sequence[str], env: Mapping[str, str], log, what: str) -> None:
    """Run one nnU-Net entry point in a fresh interpreter (as its console script would), streaming its output."""
    command = [sys.executable, "-c", f"import sys; from {module} import {function}; sys.exit({function}())",
               *args]
    log(f"nnU-Net {what}: {' '.join(args)}")
    process = subprocess.Popen(command, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in process.stdout or ():
        line = line.rstrip()
        if line:
            log(line)
            tail = [*tail[-19:], line]
    if process.wait() != 0:
        raise RexmleError(f"nnU-Net {what} failed (exit code {process.returncode}); last output:\n  "
                          + "\n  ".join(tail), hint="see the full output above; rerun with --work-dir to keep files")


@register_baseline
class NnUNetBaseline(Baseline):
    name: ClassVar[str] = "nnunet"
    extra: ClassVar[str] = "nnunet"
    requires: ClassVar[tuple[str, ...]] = ("torch", "nnunetv2")
    description: ClassVar[str] = ("nnU-Net v2 (nnunetv2): plan, preprocess, train and predict; 3-D and 2-D "
                                  "segmentation, with cells, nuclei, ROI boxes and CoW variants derived from it")
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {"configuration": "auto", "trainer": "nnUNetTrainerRexmleQuick", "folds": "all", "epochs": 2,
                  "iterations": 8, "patch_cap_3d": 32, "tta": False},
        # epochs / iterations are read by the quick trainer only: nnUNetTrainer runs its own 1000 x 250
        "full": {"configuration": "auto", "trainer": "nnUNetTrainer", "folds": "0,1,2,3,4", "epochs": 1000,
                 "iterations": 250, "patch_cap_3d": None, "tta": True},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id in segmentation_grader_ids()

    def run(self, ctx: BaselineContext) -> None:
        require_module("torch", extra=self.extra, package="rexmle-baselines")
        require_module("nnunetv2", extra=self.extra, package="rexmle-baselines")
        params = ctx.params
        io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
        configuration = str(params["configuration"])
        if configuration == "auto":
            configuration = "3d_fullres" if io.dim == 3 else "2d"
        folds = [f.strip() for f in str(params["folds"]).split(",") if f.strip()]
        raw, preprocessed, results = (ctx.work_dir / n for n in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"))
        # nnU-Net's own (lower-case) variable names; one process per step on small CPUs (ENVIRONMENT.md)
        processes = os.environ.get("nnUNet_def_n_proc", "1")  # noqa: SIM112
        data_augmentation = os.environ.get("nnUNet_n_proc_DA", "0" if ctx.device == "cpu" else "8")  # noqa: SIM112
        env = {**os.environ, "nnUNet_raw": str(raw), "nnUNet_preprocessed": str(preprocessed),
               "nnUNet_results": str(results), "nnUNet_extTrainer": str(TRAINERS_DIR), "nnUNet_def_n_proc": processes,
               "REXMLE_NNUNET_EPOCHS": str(params["epochs"]), "REXMLE_NNUNET_ITERATIONS": str(params["iterations"]),
               "PYTHONHASHSEED": str(ctx.seed), "REXMLE_SEED": str(ctx.seed)}
        if ctx.device == "cpu":
            env["nnUNet_compile"] = "f"  # torch.compile costs minutes on CPU and gains nothing at this size
        ctx.log(f"writing the nnU-Net raw dataset under {raw}")
        folder = write_raw_dataset(io, raw, ctx.task_id, ctx.grader_id)
        plan = ["-d", str(DATASET_ID), "-c", configuration, "-np", processes, "-npfp", "1",
                "--verify_dataset_integrity"]
        _entry("nnunetv2.experiment_planning.plan_and_preprocess_entrypoints", "plan_and_preprocess_entry", plan,
               env, ctx.log, "plan and preprocess")
        if params.get("patch_cap_3d") is not None and configuration.startswith("3d"):
            patch = cap_patch_size(preprocessed / folder.name / "nnUNetPlans.json", configuration,
                                   int(params["patch_cap_3d"]))
            ctx.log(f"patch size capped at {patch}")
        train_env = {**env, "nnUNet_n_proc_DA": data_augmentation}  # not for preprocessing: 0 crashes it there
        for fold in folds:
            _entry("nnunetv2.run.run_training", "run_training_entry",
                   [str(DATASET_ID), configuration, fold, "-tr", str(params["trainer"]), "-device", ctx.device],
                   train_env, ctx.log, f"train fold {fold}")
            for log_file in sorted((results / folder.name).rglob(f"fold_{fold}/training_log_*.txt")):
                check_training_log(log_file.read_text())
        prediction_dir = ctx.work_dir / "nnunet_predictions"
        predict = ["-i", str(folder / "imagesTs"), "-o", str(prediction_dir), "-d", str(DATASET_ID), "-c",
                   configuration, "-tr", str(params["trainer"]), "-f", *folds, "-device", ctx.device, "-npp", "1",
                   "-nps", "1", "--disable_progress_bar"]
        if not params.get("tta", True):
            predict.append("--disable_tta")
        _entry("nnunetv2.inference.predict_from_raw_data", "predict_entry_point", predict, env, ctx.log, "predict")
        ctx.log("converting the predictions into the task's submission")
        io.write_submission(read_predictions(prediction_dir, [c.case_id for c in io.test_cases()]), ctx.out_dir)
