"""The ``nnunet`` baseline: nnU-Net v2 (the ``nnunetv2`` package, run through its own entry points).

Steps, all under ``work_dir``: the task's public data -> nnU-Net's raw dataset (``dataset.json``,
``imagesTr/{case}_{channel:04d}.nii.gz``, ``labelsTr/{case}.nii.gz``, ``imagesTs``; geometry kept) ->
``plan_and_preprocess`` -> ``train`` (configuration and folds by name) -> ``predict`` -> the task's submission
through :mod:`rexmle_baselines.convert`.

Every configuration trains the shipped ``nnUNetTrainerRexmle`` (nnU-Net's trainer reading epochs, iterations,
mirroring, final validation, seed, cuDNN determinism and the deadline from a settings file; found through
``nnUNet_extTrainer``), so no parameter is silently ignored. ``full`` is nnU-Net's recipe (1000 x 250, 5 folds
ensembled, mirroring, its own post-processing chosen on the cross-validation); ``budget`` trains one model on all
cases with as many of the 1000 epochs as fit the time budget; ``smoke`` is full with 2 x 10 on fold 0; ``quick``
is 2 x 8 with the 3-D patch capped at 32 for CPUs. Tasks whose labels tell left from right (task.yaml
``lateralised_labels``) are never mirrored, neither in training nor at test time.

A submission exists as soon as the first fold is trained (predicted with that fold), and the finished folds'
ensemble replaces it at the end, or earlier when the deadline leaves no time for the next fold. Progress is kept in
``work_dir`` so that a run killed by an execution time limit continues where it stopped (``resume``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rexmle_baselines.base import Baseline, BaselineContext, check_loss, publish_submission, register_baseline
from rexmle_baselines.convert import SegmentationIO, segmentation_grader_ids, segmentation_io
from rexmle_grade.errors import ConfigurationError, RexmleError, UserInputError, require_module
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


REXMLE_TRAINER = "nnUNetTrainerRexmle"
SETTINGS_FILE = "rexmle_nnunet_settings.json"
PROGRESS_FILE = "rexmle_nnunet_progress.json"
TRAINER_REPORT = "rexmle_trainer.json"
# what nnUNetTrainer itself runs: another trainer can only be asked for with these values (it reads no settings)
NNUNET_DEFAULTS = {"epochs": 1000, "iterations": 250, "val_iterations": 50, "final_validation": True,
                   "time_aware": False}


def switch(params: Mapping[str, Any], key: str, *, lateralised: bool) -> bool:
    """A mirroring switch (``auto``: on unless the task's labels are lateralised); mirroring a lateralised task is
    refused, since it makes left and right a coin flip."""
    value = str(params[key]).lower()
    if value not in ("auto", "true", "false"):
        raise UserInputError(f"{key} must be auto, true or false, got {params[key]!r}", hint=f"--set {key}=auto")
    if value == "true" and lateralised:
        raise UserInputError(f"{key}=true on a task whose labels tell left from right (lateralised_labels): a "
                             "mirrored image would swap them", hint=f"--set {key}=auto (off on such tasks)")
    return value == "true" or (value == "auto" and not lateralised)


def trainer_settings(params: Mapping[str, Any], *, lateralised: bool, seed: int) -> dict[str, Any]:
    """The settings ``nnUNetTrainerRexmle`` reads (its ``deadline`` is set per fold)."""
    return {"epochs": int(params["epochs"]), "iterations": int(params["iterations"]),
            "val_iterations": int(params["val_iterations"]),
            "mirror": switch(params, "mirror", lateralised=lateralised),
            "final_validation": bool(params["final_validation"]), "seed": int(seed),
            "deterministic": bool(params["deterministic"]), "deadline": None,
            "reserve_s": float(params["reserve_s"]), "time_aware": bool(params["time_aware"])}


def check_trainer(params: Mapping[str, Any]) -> None:
    """Another trainer than ``nnUNetTrainerRexmle`` reads none of the rexmle settings: refused unless they are
    nnU-Net's own values (never a silently ignored ``--set``)."""
    if str(params["trainer"]) == REXMLE_TRAINER:
        return
    differing = [f"{k}={params[k]}" for k, v in NNUNET_DEFAULTS.items() if params[k] != v]
    if str(params["mirror"]).lower() == "false" or str(params["tta"]).lower() == "false":
        differing.append("mirror/tta off")
    if differing:
        raise UserInputError(f"trainer {params['trainer']!r} would ignore {', '.join(differing)}: only "
                             f"{REXMLE_TRAINER} reads these settings",
                             hint=f"keep --set trainer={REXMLE_TRAINER}, or nnU-Net's defaults with another trainer")


@dataclass
class Progress:
    """What a run has done in its work folder, so that a killed run continues (``rexmle_nnunet_progress.json``)."""

    dataset_written: bool = False
    preprocessed: bool = False
    folds_done: list[str] = field(default_factory=list)
    fold_seconds: dict[str, float] = field(default_factory=dict)
    published: list[str] | None = None  # the folds behind the submission in --out
    postprocessed: bool = False

    @classmethod
    def load(cls, work_dir: Path, *, resume: bool) -> Progress:
        path = work_dir / PROGRESS_FILE
        if resume and path.is_file():
            return cls(**json.loads(path.read_text()))
        return cls()

    def save(self, work_dir: Path) -> None:
        partial = work_dir / f".{PROGRESS_FILE}.partial"
        partial.write_text(json.dumps(asdict(self), indent=1) + "\n")
        os.replace(partial, work_dir / PROGRESS_FILE)


MAX_WORKER_PROCESSES = 8  # nnU-Net's own default for 3-D preprocessing; each worker holds a whole case in memory


def worker_processes() -> int:
    """nnU-Net's worker processes (preprocessing, export, post-processing): ``$nnUNet_def_n_proc`` when set, else
    the CPUs this process may run on (its affinity: a SLURM job's or a sandbox's share, not the host's count), at
    most :data:`MAX_WORKER_PROCESSES`."""
    configured = os.environ.get("nnUNet_def_n_proc", "").strip()  # noqa: SIM112
    if configured:
        if not configured.isdigit() or int(configured) < 1:
            raise UserInputError(f"nnUNet_def_n_proc must be a positive whole number, got {configured!r}",
                                 hint="unset it to size the workers to the run's CPUs")
        return int(configured)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, MAX_WORKER_PROCESSES))


def predict_arguments(folder: Path, output: Path, configuration: str, trainer: str, folds: Sequence[str],
                      device: str, *, tta: bool, processes: str) -> list[str]:
    arguments = ["-i", str(folder / "imagesTs"), "-o", str(output), "-d", str(DATASET_ID), "-c", configuration,
                 "-tr", trainer, "-f", *folds, "-device", device, "-npp", processes, "-nps", processes,
                 "--disable_progress_bar"]
    return arguments if tta else [*arguments, "--disable_tta"]


def next_fold_fits(ctx: BaselineContext, progress: Progress, reserve_s: float) -> bool:
    """Whether one more fold (as long as the mean finished one) fits before the deadline less ``reserve_s``."""
    left = ctx.seconds_left()
    if left is None or not progress.fold_seconds:
        return True
    return float(np.mean(list(progress.fold_seconds.values()))) <= left - reserve_s


@register_baseline
class NnUNetBaseline(Baseline):
    name: ClassVar[str] = "nnunet"
    extra: ClassVar[str] = "nnunet"
    requires: ClassVar[tuple[str, ...]] = ("torch", "nnunetv2")
    resumable: ClassVar[bool] = True  # finished folds and checkpoints survive in the work folder
    description: ClassVar[str] = ("nnU-Net v2 (nnunetv2): plan, preprocess, train and predict; 3-D and 2-D "
                                  "segmentation, with cells, nuclei, ROI boxes and CoW variants derived from it")
    _common: ClassVar[dict[str, Any]] = {"configuration": "auto", "trainer": REXMLE_TRAINER, "mirror": "auto",
                                         "tta": "auto", "final_validation": True, "postprocess": True,
                                         "deterministic": False, "time_aware": False, "reserve_s": 1800.0,
                                         "patch_cap_3d": None, "val_iterations": 50}
    configs: ClassVar[dict[str, dict[str, Any]]] = {
        # CPU minutes: no mirroring and no TTA (8x the prediction time), the patch capped, one model on all cases
        "quick": {**_common, "folds": "all", "epochs": 2, "iterations": 8, "val_iterations": 2, "patch_cap_3d": 32,
                  "mirror": "false", "tta": "false", "final_validation": False, "postprocess": False,
                  "deterministic": True, "reserve_s": 0.0},
        # fits the time budget on one GPU: one model on all training cases, as many of nnU-Net's 1000 epochs as
        # fit (the poly schedule decays over them); cross-validation and its post-processing search would cost
        # four more models
        "budget": {**_common, "folds": "all", "epochs": 1000, "iterations": 250, "final_validation": False,
                   "postprocess": False, "time_aware": True},
        # nnU-Net's recipe: 5 folds x 1000 x 250, ensembled, mirroring (where allowed), post-processing from CV
        "full": {**_common, "folds": "0,1,2,3,4", "epochs": 1000, "iterations": 250},
        # full's plans, patches, batches, augmentation, validation and post-processing; 2 x 10 on fold 0
        "smoke": {**_common, "folds": "0", "epochs": 2, "iterations": 10, "val_iterations": 2, "reserve_s": 0.0},
    }

    def supports(self, task_id: str, grader_id: str) -> bool:
        return grader_id in segmentation_grader_ids()

    def estimated_steps(self, params: Mapping[str, Any], n_train: int) -> int | None:
        folds = [f for f in str(params["folds"]).split(",") if f.strip()]
        return len(folds) * int(params["epochs"]) * int(params["iterations"])  # independent of the dataset size

    def run(self, ctx: BaselineContext) -> None:
        require_module("torch", extra=self.extra, package="rexmle-baselines")
        require_module("nnunetv2", extra=self.extra, package="rexmle-baselines")
        params = ctx.params
        check_trainer(params)
        settings = trainer_settings(params, lateralised=ctx.lateralised, seed=ctx.seed)
        tta = switch(params, "tta", lateralised=ctx.lateralised) and settings["mirror"]
        io = segmentation_io(ctx.task_id, ctx.grader_id, ctx.public_dir)
        configuration = str(params["configuration"])
        if configuration == "auto":
            configuration = "3d_fullres" if io.dim == 3 else "2d"
        folds = [f.strip() for f in str(params["folds"]).split(",") if f.strip()]
        trainer = str(params["trainer"])
        raw, preprocessed, results = (ctx.work_dir / n for n in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"))
        progress = Progress.load(ctx.work_dir, resume=ctx.resume)
        # nnU-Net's own (lower-case) variable names: its worker processes for preprocessing, export and
        # post-processing, sized to the CPUs this run may use unless the user set them
        processes = str(worker_processes())
        data_augmentation = os.environ.get("nnUNet_n_proc_DA", "0" if ctx.device == "cpu" else "8")  # noqa: SIM112
        settings_file = ctx.work_dir / SETTINGS_FILE
        env = {**os.environ, "nnUNet_raw": str(raw), "nnUNet_preprocessed": str(preprocessed),
               "nnUNet_results": str(results), "nnUNet_extTrainer": str(TRAINERS_DIR), "nnUNet_def_n_proc": processes,
               "REXMLE_NNUNET_SETTINGS": str(settings_file), "PYTHONHASHSEED": str(ctx.seed)}
        if ctx.device == "cpu":
            env["nnUNet_compile"] = "f"  # torch.compile costs minutes on CPU and gains nothing at this size
        ctx.log(f"nnU-Net {configuration}, trainer {trainer}, folds {folds}; mirroring "
                f"{'on' if settings['mirror'] else 'off'}, mirror TTA {'on' if tta else 'off'}"
                + (" (lateralised labels)" if ctx.lateralised else ""))
        folder = raw / dataset_name(ctx.task_id)
        if not progress.dataset_written:
            ctx.log(f"writing the nnU-Net raw dataset under {raw}")
            write_raw_dataset(io, raw, ctx.task_id, ctx.grader_id)
            progress.dataset_written = True
            progress.save(ctx.work_dir)
        if not progress.preprocessed:
            plan = ["-d", str(DATASET_ID), "-c", configuration, "-np", processes, "-npfp", processes,
                    "--verify_dataset_integrity"]
            _entry("nnunetv2.experiment_planning.plan_and_preprocess_entrypoints", "plan_and_preprocess_entry", plan,
                   env, ctx.log, "plan and preprocess")
            if params.get("patch_cap_3d") is not None and configuration.startswith("3d"):
                patch = cap_patch_size(preprocessed / folder.name / "nnUNetPlans.json", configuration,
                                       int(params["patch_cap_3d"]))
                ctx.log(f"patch size capped at {patch}")
            progress.preprocessed = True
            progress.save(ctx.work_dir)
        train_env = {**env, "nnUNet_n_proc_DA": data_augmentation}  # not for preprocessing: 0 crashes it there
        output_base = results / folder.name / f"{trainer}__nnUNetPlans__{configuration}"
        reserve_s = float(params["reserve_s"])
        for index, fold in enumerate(folds):
            if fold in progress.folds_done:
                continue
            if progress.folds_done and not next_fold_fits(ctx, progress, reserve_s):
                ctx.log(f"no time left for fold {fold} before the deadline: predicting with folds "
                        f"{progress.folds_done}")
                break
            started = time.monotonic()
            fold_settings = dict(settings)
            left = ctx.seconds_left()
            if left is not None:  # a time-aware run shares the time left among the folds still to train
                share = (left - reserve_s) / (len(folds) - index) + reserve_s if settings["time_aware"] else left
                fold_settings["deadline"] = time.time() + share
            settings_file.write_text(json.dumps(fold_settings, indent=1) + "\n")
            fold_dir = output_base / f"fold_{fold}"
            arguments = [str(DATASET_ID), configuration, fold, "-tr", trainer, "-device", ctx.device]
            if ctx.resume and (fold_dir / "checkpoint_final.pth").is_file():
                arguments.append("--val")  # trained; killed during its final validation
            elif ctx.resume and (fold_dir / "checkpoint_latest.pth").is_file():
                arguments.append("--c")
            if "--val" not in arguments or settings["final_validation"]:
                _entry("nnunetv2.run.run_training", "run_training_entry", arguments, train_env, ctx.log,
                       f"train fold {fold}")
            for log_file in sorted(fold_dir.glob("training_log_*.txt")):
                check_training_log(log_file.read_text())
            self._record(ctx, fold, fold_dir)
            progress.folds_done.append(fold)
            progress.fold_seconds[fold] = time.monotonic() - started
            progress.save(ctx.work_dir)
            last = index == len(folds) - 1
            if not last and (progress.published is None or not next_fold_fits(ctx, progress, reserve_s)):
                # a valid submission as soon as possible, and before a fold the deadline would cut off
                self._predict(ctx, io, folder, configuration, progress, tta=tta, processes=processes, env=env)
        if not progress.folds_done:
            raise RexmleError("no fold could be trained before the deadline",
                              hint="give the run more time (--time-budget) or use fewer folds")
        postprocess = bool(params["postprocess"]) and settings["final_validation"]
        if progress.published != progress.folds_done or (postprocess and not progress.postprocessed):
            self._predict(ctx, io, folder, configuration, progress, tta=tta, processes=processes, env=env,
                          postprocess=postprocess)

    def _record(self, ctx: BaselineContext, fold: str, fold_dir: Path) -> None:
        report_file = fold_dir / TRAINER_REPORT
        if not report_file.is_file():
            return
        report = json.loads(report_file.read_text())
        ctx.measurements.setdefault("folds", {})[fold] = report
        if report.get("seconds_per_epoch") and report.get("iterations_per_epoch"):
            ctx.measurements.setdefault("seconds_per_step", {})[f"fold {fold}"] = round(
                report["seconds_per_epoch"] / report["iterations_per_epoch"], 5)
        if report.get("peak_gpu_memory_gb") is not None:
            ctx.measurements["peak_gpu_memory_gb"] = max(report["peak_gpu_memory_gb"],
                                                         ctx.measurements.get("peak_gpu_memory_gb", 0.0))
        if report.get("stopped_early"):
            ctx.log(f"fold {fold} stopped after {report['epochs_run']} of {report['epochs_planned']} epochs "
                    "(deadline)")

    def _predict(self, ctx: BaselineContext, io: SegmentationIO, folder: Path, configuration: str,
                 progress: Progress, *, tta: bool, processes: str, env: Mapping[str, str],
                 postprocess: bool = False) -> None:
        """Predict the test images with the finished folds' ensemble (and nnU-Net's post-processing when asked),
        and publish the submission into ``out_dir`` (replacing any earlier one file by file)."""
        folds = list(progress.folds_done)
        trainer = str(ctx.params["trainer"])
        predictions = ctx.work_dir / "nnunet_predictions"
        shutil.rmtree(predictions, ignore_errors=True)
        _entry("nnunetv2.inference.predict_from_raw_data", "predict_entry_point",
               predict_arguments(folder, predictions, configuration, trainer, folds, ctx.device, tta=tta,
                                 processes=processes), env, ctx.log, f"predict (folds {', '.join(folds)})")
        if postprocess:
            predictions = self._postprocess(ctx, predictions, configuration, trainer, folds, env, processes)
        ctx.log(f"converting the predictions of folds {folds} into the task's submission")
        staging = ctx.work_dir / "submission_staging"
        shutil.rmtree(staging, ignore_errors=True)
        io.write_submission(read_predictions(predictions, [c.case_id for c in io.test_cases()]), staging)
        publish_submission(staging, ctx.out_dir)
        progress.published = folds
        progress.postprocessed = postprocess
        progress.save(ctx.work_dir)
        ctx.measurements["folds_in_submission"] = folds

    def _postprocess(self, ctx: BaselineContext, predictions: Path, configuration: str, trainer: str,
                     folds: Sequence[str], env: Mapping[str, str], processes: str) -> Path:
        """nnU-Net's post-processing (connected-component removal kept only where it raised the cross-validation
        Dice), chosen on the finished folds' validation and applied to the test predictions."""
        numeric = [f for f in folds if f.isdigit()]
        if not numeric:
            ctx.log("post-processing skipped: it is chosen on cross-validation folds, and none was trained")
            return predictions
        _entry("nnunetv2.evaluation.find_best_configuration", "find_best_configuration_entry_point",
               [str(DATASET_ID), "-c", configuration, "-tr", trainer, "-f", *numeric, "--disable_ensembling",
                "-np", processes], env, ctx.log, "find the post-processing on the cross-validation")
        results = Path(env["nnUNet_results"]) / dataset_name(ctx.task_id)
        information = json.loads((results / "inference_information.json").read_text())["best_model_or_ensemble"]
        plans_file = Path(information["some_plans_file"])
        processed = predictions.with_name("nnunet_predictions_postprocessed")
        shutil.rmtree(processed, ignore_errors=True)
        _entry("nnunetv2.postprocessing.remove_connected_components", "entry_point_apply_postprocessing",
               ["-i", str(predictions), "-o", str(processed), "-pp_pkl_file", information["postprocessing_file"],
                "-np", processes, "-plans_json", str(plans_file), "-dataset_json",
                str(plans_file.with_name("dataset.json"))], env, ctx.log, "apply the post-processing")
        ctx.measurements["postprocessing"] = {"cv_dice_before": information["result_on_crossval_pre_pp"],
                                              "cv_dice_after": information["result_on_crossval_post_pp"]}
        return processed
