"""``nnUNetTrainerRexmle``: nnU-Net's own trainer, with the few settings the rexmle configurations change.

Found by nnU-Net through the ``nnUNet_extTrainer`` environment variable (this folder); the installed package is
never modified. nnU-Net builds trainers with a fixed signature, so the settings come from the JSON file named by
``REXMLE_NNUNET_SETTINGS`` (written by the ``nnunet`` baseline into its work folder; :func:`read_settings`):

- ``epochs``, ``iterations``, ``val_iterations``: nnU-Net's 1000 x 250 (50 validation batches) in ``full``;
- ``mirror``: mirroring augmentation and mirror test-time augmentation (off for tasks whose labels tell left from
  right: the allowed mirror axes saved in the checkpoint are then None, so no predictor mirrors either);
- ``final_validation``: the full-image validation of the fold (needed by nnU-Net's post-processing search);
- ``seed`` and ``deterministic`` (cuDNN's deterministic kernels instead of its autotuned ones);
- ``deadline`` (a ``time.time()`` value), ``reserve_s`` and ``time_aware``: with a deadline, the epochs are
  re-planned after each one. A time-aware run stretches or shrinks its schedule (and the poly learning-rate decay)
  to the epochs that fit before ``deadline - reserve_s``; any other run stops early when the next epoch would not
  fit, and says so in the training log and in ``rexmle_trainer.json`` (epochs run, seconds per epoch, peak GPU
  memory), which the baseline records. Under a deadline the latest checkpoint is saved about every 10 minutes
  (nnU-Net: every 50 epochs), since the run may be killed by an execution limit and resumed (``--c``).
"""

import json
import os
import random
import time

import numpy as np
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

SETTINGS_VARIABLE = "REXMLE_NNUNET_SETTINGS"
REPORT_FILE = "rexmle_trainer.json"
DEFAULTS = {"epochs": 1000, "iterations": 250, "val_iterations": 50, "mirror": True, "final_validation": True,
            "seed": 0, "deterministic": False, "deadline": None, "reserve_s": 0.0, "time_aware": False}


def read_settings() -> dict:
    """nnU-Net's defaults, updated from the file ``REXMLE_NNUNET_SETTINGS`` names (when set)."""
    settings = dict(DEFAULTS)
    path = os.environ.get(SETTINGS_VARIABLE)
    if path:
        with open(path) as fh:
            given = json.load(fh)
        unknown = sorted(set(given) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"unknown rexmle trainer settings {unknown} in {path}")
        settings.update(given)
    return settings


def steady_epoch_seconds(seconds: list[float]) -> float | None:
    """Seconds an epoch takes once running: the first epoch also pays for torch.compile and cuDNN autotuning
    (46 s of a 3-D smoke's 46.2 s on an H200), so it counts only when it is the only one."""
    if not seconds:
        return None
    return float(np.mean(seconds[1:] if len(seconds) > 1 else seconds))


def affordable_epochs(done: int, seconds_per_epoch: float, seconds_left: float) -> int:
    """Epochs in total when ``done`` are finished and the rest must fit into ``seconds_left``."""
    return done + max(0, int(seconds_left // max(seconds_per_epoch, 1e-9)))


class nnUNetTrainerRexmle(nnUNetTrainer):
    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")) -> None:
        self.rexmle = read_settings()
        seed = int(self.rexmle["seed"])
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = int(self.rexmle["epochs"])
        self.num_iterations_per_epoch = int(self.rexmle["iterations"])
        self.num_val_iterations_per_epoch = int(self.rexmle["val_iterations"])
        self.rexmle_epoch_seconds: list[float] = []
        self.rexmle_stopped_early = False

    def configure_rotation_dummyDA_mirroring_and_inital_patch_size(self):
        rotation, dummy_2d, initial_patch_size, mirror_axes = \
            super().configure_rotation_dummyDA_mirroring_and_inital_patch_size()
        if not self.rexmle["mirror"]:
            mirror_axes = None
            self.inference_allowed_mirroring_axes = None  # saved in the checkpoint: predictors never mirror
        return rotation, dummy_2d, initial_patch_size, mirror_axes

    def on_train_start(self):
        super().on_train_start()
        # run_training turns cuDNN's autotuner on just before training: the setting decides
        torch.backends.cudnn.deterministic = bool(self.rexmle["deterministic"])
        torch.backends.cudnn.benchmark = not self.rexmle["deterministic"]
        self.print_to_log_file(f"rexmle settings: {self.rexmle}")

    def _replan(self) -> None:
        """After an epoch: the epochs that still fit before the deadline (see the module docstring)."""
        deadline = self.rexmle["deadline"]
        if deadline is None or not self.rexmle_epoch_seconds:
            return
        done = self.current_epoch
        per_epoch = float(np.mean(self.rexmle_epoch_seconds))
        left = float(deadline) - float(self.rexmle["reserve_s"]) - time.time()
        affordable = affordable_epochs(done, per_epoch, left)
        # a run under a deadline may be killed by an execution limit and resumed: lose at most ~10 minutes
        self.save_every = int(np.clip(600 // max(per_epoch, 1e-9), 1, 50))
        if self.rexmle["time_aware"]:
            planned = max(done, min(int(self.rexmle["epochs"]), affordable))
            if planned != self.num_epochs:
                self.print_to_log_file(f"rexmle time budget: {planned} epochs of {per_epoch:.1f} s fit")
                self.num_epochs = planned
                self.lr_scheduler.max_steps = planned  # the poly decay reaches 0 at the new end
        elif affordable < self.num_epochs:
            self.print_to_log_file(f"rexmle: the deadline stops training after epoch {max(done, affordable)} of "
                                   f"{self.num_epochs}")
            self.num_epochs = max(done, affordable)
            self.rexmle_stopped_early = True

    def run_training(self):
        # nnU-Net's loop, but re-reading num_epochs after every epoch (nnU-Net fixes the range once)
        self.on_train_start()
        while self.current_epoch < self.num_epochs:
            started = time.time()
            self.on_epoch_start()
            self.on_train_epoch_start()
            train_outputs = [self.train_step(next(self.dataloader_train))
                             for _ in range(self.num_iterations_per_epoch)]
            self.on_train_epoch_end(train_outputs)
            with torch.no_grad():
                self.on_validation_epoch_start()
                val_outputs = [self.validation_step(next(self.dataloader_val))
                               for _ in range(self.num_val_iterations_per_epoch)]
                self.on_validation_epoch_end(val_outputs)
            self.on_epoch_end()
            self.rexmle_epoch_seconds.append(time.time() - started)
            self._replan()
        self.on_train_end()
        self._write_report()

    def _write_report(self) -> None:
        peak = torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None
        report = {"epochs_run": self.current_epoch, "epochs_planned": int(self.rexmle["epochs"]),
                  "iterations_per_epoch": self.num_iterations_per_epoch, "stopped_early": self.rexmle_stopped_early,
                  "seconds_per_epoch": steady_epoch_seconds(self.rexmle_epoch_seconds),
                  "first_epoch_seconds": self.rexmle_epoch_seconds[0] if self.rexmle_epoch_seconds else None,
                  "peak_gpu_memory_gb": None if peak is None else round(peak, 3)}
        with open(os.path.join(self.output_folder, REPORT_FILE), "w") as fh:
            json.dump(report, fh, indent=1)

    def perform_actual_validation(self, save_probabilities: bool = False) -> None:
        if not self.rexmle["final_validation"]:
            self.print_to_log_file("rexmle: full-image validation skipped (final_validation is off)")
            return
        super().perform_actual_validation(save_probabilities)
