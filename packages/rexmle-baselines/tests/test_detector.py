"""The ``detector`` baseline (torchvision Faster R-CNN per DENTEX label level): a quick run on the synthetic task
must validate, grade and beat the empty sample; a NaN loss stops training with the epoch and the last finite loss;
a backbone torchvision's FPN cannot wrap is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rexmle_baselines.api import run_baseline
from rexmle_baselines.base import TrainingDivergedError
from rexmle_grade.errors import UserInputError

pytest.importorskip("torchvision")
pytest.importorskip("timm")
TASK = "dentex"


def test_detector_quick_finds_abnormal_teeth_the_empty_sample_misses(prepared, tmp_path: Path) -> None:
    public = prepared.public(TASK, cases=10)
    run = run_baseline("detector", TASK, public_dir=public, out=tmp_path / "sub", work_dir=tmp_path / "w")
    assert run.valid, run.problems
    metrics = prepared.beats_sample(TASK, run.submission_dir)
    assert metrics["ap50_mean"] > 0


def test_a_nan_loss_stops_with_the_epoch_and_last_finite_loss(prepared, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision.models.detection import roi_heads

    fastrcnn_loss = roi_heads.fastrcnn_loss
    calls = []

    def finite_then_nan(*args, **kwargs):  # epoch 1 (all 8 training X-rays in one batch) stays finite
        calls.append(1)
        classification, regression = fastrcnn_loss(*args, **kwargs)
        return (classification, regression) if len(calls) <= 1 else (classification * float("nan"), regression)

    monkeypatch.setattr(roi_heads, "fastrcnn_loss", finite_then_nan)
    public = prepared.public(TASK, cases=10)
    with pytest.raises(TrainingDivergedError, match=r"at epoch 2; the last finite loss was \d") as caught:
        run_baseline("detector", TASK, public_dir=public, work_dir=tmp_path / "w",
                     overrides={"epochs": 3, "batch_size": 8})
    assert caught.value.epoch == 2


def test_a_backbone_that_is_not_a_resnet_is_refused(prepared, tmp_path: Path) -> None:
    public = prepared.public(TASK, cases=10)
    with pytest.raises(UserInputError, match="not a timm ResNet"):
        run_baseline("detector", TASK, public_dir=public, work_dir=tmp_path / "w",
                     overrides={"model": "test_efficientnet"})


# ---- memory, flips, the hierarchy and the pretrained backbone, without training ---------------------------------
def test_xrays_are_held_as_one_uint8_channel(prepared) -> None:
    from rexmle_baselines.detector import read_training_set, to_input

    images = read_training_set(prepared.public(TASK, cases=10))
    assert all(im.pixels.dtype == np.uint8 and im.pixels.ndim == 2 for im in images)
    tensor = to_input(images[0].pixels, "cpu")
    assert tuple(tensor.shape) == (3, *images[0].pixels.shape) and float(tensor.max()) <= 1.0


def test_a_horizontal_flip_mirrors_the_boxes_and_swaps_the_quadrants() -> None:
    from rexmle_baselines.detector import QUADRANT, TOOTH, TrainingImage, hflip

    pixels = np.zeros((4, 10), dtype=np.uint8)
    pixels[:, 0] = 255
    image = TrainingImage(pixels, np.array([[1.0, 0.0, 3.0, 2.0]], dtype=np.float32),
                          {QUADRANT: np.array([0]), TOOTH: np.array([5]), "category_id_3": np.array([2])})
    flipped = hflip(image)
    assert flipped.pixels[0, -1] == 255 and flipped.boxes.tolist() == [[7.0, 0.0, 9.0, 2.0]]
    assert flipped.ids[QUADRANT].tolist() == [1] and flipped.ids[TOOTH].tolist() == [5]  # FDI 1x -> 2x, same tooth
    assert [int(hflip(image.__class__(pixels, image.boxes, {**image.ids, QUADRANT: np.array([q])})).ids[QUADRANT][0])
            for q in range(4)] == [1, 0, 3, 2]
    twice = hflip(flipped)
    assert np.array_equal(twice.pixels, pixels) and np.allclose(twice.boxes, image.boxes)


def test_the_tooth_number_is_read_within_the_box_quadrant() -> None:
    from rexmle_baselines.detector import Detection, assign_hierarchically

    box = (10.0, 10.0, 20.0, 30.0)
    quadrants = [Detection((0.0, 0.0, 50.0, 50.0), 2, 0.9)]
    teeth = [Detection((10.0, 10.0, 20.0, 30.0), 0 * 8 + 4, 0.9),  # FDI 15 on exactly this box, wrong quadrant
             Detection((12.0, 12.0, 22.0, 32.0), 2 * 8 + 6, 0.6)]  # FDI 37, in the box's quadrant
    assert assign_hierarchically(box, quadrants, teeth, {"category_id_1": 0, "category_id_2": 0}) == (2, 6)
    # no quadrant box: the quadrant of the best enumeration box decides
    assert assign_hierarchically(box, [], teeth, {"category_id_1": 3, "category_id_2": 1}) == (0, 4)


def test_a_pretrained_backbone_keeps_batchnorm_frozen_and_is_recorded(tmp_path: Path) -> None:
    import timm
    import torch
    from torchvision.ops.misc import FrozenBatchNorm2d

    from rexmle_baselines.base import BaselineContext
    from rexmle_baselines.detector import DentexDetector, build_detector
    from rexmle_baselines.weights import sha256_of

    weights = tmp_path / "resnet10t-local.pth"
    torch.save(timm.create_model("resnet10t", pretrained=False).state_dict(), weights)
    params = {**DentexDetector.configs["quick"], "pretrained": str(weights), "frozen_bn": "auto",
              "trainable_layers": 3}
    ctx = BaselineContext(task_id=TASK, grader_id=TASK, public_dir=tmp_path, out_dir=tmp_path, work_dir=tmp_path,
                          config="quick", params=params, device="cpu", seed=0, log=lambda line: None)
    model = build_detector(params, 4, ctx)
    body = model.backbone.body
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in body.modules())
    assert any(isinstance(m, FrozenBatchNorm2d) or type(m).__name__.startswith("Frozen") for m in body.modules())
    assert not any(p.requires_grad for n, p in body.named_parameters() if n.startswith(("conv1", "layer1")))
    assert any(p.requires_grad for n, p in body.named_parameters() if n.startswith("layer4"))
    assert ctx.measurements["weights"] == {str(weights): sha256_of(weights)}
    scratch = build_detector({**params, "pretrained": None}, 4)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in scratch.backbone.body.modules())


@pytest.mark.slow
def test_the_gpu_recipe_runs_end_to_end_at_toy_size_on_a_cpu(prepared, tmp_path: Path) -> None:
    """full's code path (a pretrained backbone with frozen BatchNorm and stages, flips with the quadrant swap, the
    hierarchical merge) shrunk to the quick network and one epoch: it must write a valid submission."""
    import timm
    import torch

    weights = tmp_path / "resnet10t-local.pth"
    torch.save(timm.create_model("resnet10t", pretrained=False).state_dict(), weights)
    quick = {k: v for k, v in __import__("rexmle_baselines.detector", fromlist=["x"]).DentexDetector.configs[
        "quick"].items() if k in ("min_size", "max_size", "returned_layers", "fpn_channels", "anchor_sizes",
                                  "aspect_ratios", "proposals_per_image", "rois_per_image", "representation_size")}
    run = run_baseline("detector", TASK, public_dir=prepared.public(TASK, cases=10), out=tmp_path / "sub",
                       work_dir=tmp_path / "w", config="full", allow_cpu=True,
                       overrides={**quick, "model": "resnet10t", "pretrained": str(weights), "epochs": 1,
                                  "batch_size": 2})
    assert run.valid, run.problems
    assert run.params["hflip"] and run.params["frozen_bn"] == "auto" and str(weights) in run.measurements["weights"]
    assert set(run.measurements["epochs_run"]) == {"quadrant detector", "enumeration detector", "diagnosis detector"}
