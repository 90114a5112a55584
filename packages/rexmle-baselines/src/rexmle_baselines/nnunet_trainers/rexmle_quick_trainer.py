"""``nnUNetTrainerRexmleQuick``: nnU-Net's own trainer, shortened for CPU runs of a few minutes.

Found by nnU-Net through the ``nnUNet_extTrainer`` environment variable (this folder); the installed package is
never modified. Epochs and iterations come from ``REXMLE_NNUNET_EPOCHS`` / ``REXMLE_NNUNET_ITERATIONS`` because
nnU-Net builds trainers with a fixed signature; ``REXMLE_SEED`` seeds random, numpy and torch (nnU-Net itself
does not), which makes CPU runs with in-process data loading (``nnUNet_n_proc_DA=0``) repeatable.
Mirroring (augmentation and test-time) is off, and the final full-image validation is skipped: the baseline
predicts the test images itself.
"""

import os
import random

import numpy as np
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer


class nnUNetTrainerRexmleQuick(nnUNetTrainer):
    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")) -> None:
        seed = int(os.environ.get("REXMLE_SEED", "0"))
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = int(os.environ.get("REXMLE_NNUNET_EPOCHS", "2"))
        self.num_iterations_per_epoch = int(os.environ.get("REXMLE_NNUNET_ITERATIONS", "10"))
        self.num_val_iterations_per_epoch = max(1, self.num_iterations_per_epoch // 5)
        self.save_every = self.num_epochs + 1  # only the final checkpoint is written

    def configure_rotation_dummyDA_mirroring_and_inital_patch_size(self):
        rotation, dummy_2d, initial_patch_size, _ = super().configure_rotation_dummyDA_mirroring_and_inital_patch_size()
        self.inference_allowed_mirroring_axes = None
        return rotation, dummy_2d, initial_patch_size, None

    def perform_actual_validation(self, save_probabilities: bool = False) -> None:
        self.print_to_log_file("rexmle quick trainer: full-image validation skipped")
