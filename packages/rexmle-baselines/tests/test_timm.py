"""The timm baselines: ``timm-regress`` on LDCT-IQA and ``timm-cls`` on TopCoW task 3, quick runs on synthetic tasks
that must validate, grade and beat the sample submission; divergence and bad weights paths stop with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_baselines.api import run_baseline
from rexmle_baselines.base import TrainingDivergedError
from rexmle_grade.errors import UserInputError

pytest.importorskip("timm")


def test_timm_regress_quick_scores_ldct_slices_better_than_the_constant_sample(prepared, tmp_path: Path) -> None:
    public = prepared.public("ldct-iqa", cases=24)
    run = run_baseline("timm-regress", "ldct-iqa", public_dir=public, out=tmp_path / "sub", work_dir=tmp_path / "w")
    assert run.valid, run.problems
    metrics = prepared.beats_sample("ldct-iqa", run.submission_dir)
    assert metrics["score"] > 1.5  # noise level is learnable: |PLCC| + |SROCC| + |KROCC| well above chance


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["topcow-track1-task3", "topcow-track2-task3"])
def test_timm_cls_quick_classifies_topcow_variants_better_than_the_sample(task_id: str, prepared,
                                                                         tmp_path: Path) -> None:
    public = prepared.public(task_id, cases=24)
    run = run_baseline("timm-cls", task_id, public_dir=public, out=tmp_path / "sub", work_dir=tmp_path / "w")
    assert run.valid, run.problems
    prepared.beats_sample(task_id, run.submission_dir)


def test_a_huge_learning_rate_stops_with_the_epoch_and_last_finite_loss(prepared, tmp_path: Path) -> None:
    public = prepared.public("ldct-iqa", cases=24)
    with pytest.raises(TrainingDivergedError, match=r"at epoch \d+") as caught:
        run_baseline("timm-regress", "ldct-iqa", public_dir=public, work_dir=tmp_path / "w",
                     overrides={"lr": 1e30, "epochs": 4})
    assert caught.value.epoch >= 1


def test_a_missing_local_weights_file_is_refused_without_download(prepared, tmp_path: Path) -> None:
    public = prepared.public("ldct-iqa", cases=24)
    with pytest.raises(UserInputError, match="do not exist"):
        run_baseline("timm-regress", "ldct-iqa", public_dir=public, work_dir=tmp_path / "w",
                     overrides={"pretrained": str(tmp_path / "absent.safetensors")})


# ---- LDCT windowing and the weights cache --------------------------------------------------------------------------
def test_released_slices_in_unit_range_are_not_windowed_again_and_hu_slices_are() -> None:
    import numpy as np

    from rexmle_baselines.timm_models import HOUNSFIELD, HU_WINDOW, UNIT, ct_scale, ct_to_unit

    released = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(8, 8)
    assert ct_scale([released]) == UNIT
    assert np.array_equal(ct_to_unit(released, UNIT), released)  # the release is windowed already: kept as it is
    assert len(np.unique(ct_to_unit(released, UNIT))) == 64  # (windowed twice, it would collapse into a sliver)
    hu = np.array([[-1000.0, HU_WINDOW[0]], [40.0, 1500.0]], dtype=np.float32)
    assert ct_scale([hu]) == HOUNSFIELD
    assert ct_to_unit(hu, HOUNSFIELD).tolist() == [[0.0, 0.0], [0.5, 1.0]]


def test_the_window_is_decided_once_for_the_data_set(tmp_path) -> None:
    """Issue 37 item 15: one windowed slice that overshoots [0, 1] a little (1.01) is clipped like its data set,
    not taken for Hounsfield units and squeezed into a sliver of the range."""
    import numpy as np
    import tifffile

    from rexmle_baselines.timm_models import read_ldct_slices

    slices = [np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(8, 8) for _ in range(3)]
    slices[1] = slices[1] * 1.01  # resampling overshoot
    paths = []
    for index, values in enumerate(slices):
        paths.append(tmp_path / f"{index}.tif")
        tifffile.imwrite(paths[-1], values)
    read = read_ldct_slices(paths)
    assert read.shape == (3, 8, 8) and float(read[1].max()) == 1.0
    assert len(np.unique(read[1])) > 60  # kept its grey levels (windowed as HU it would collapse to one or two)
    hu = [np.full((4, 4), -1000.0, dtype=np.float32), np.full((4, 4), 40.0, dtype=np.float32)]
    for index, values in enumerate(hu):
        tifffile.imwrite(tmp_path / f"hu{index}.tif", values)
    assert read_ldct_slices([tmp_path / "hu0.tif", tmp_path / "hu1.tif"])[:, 0, 0].tolist() == [0.0, 0.5]


def test_the_synthetic_mirror_writes_what_the_release_writes(prepared) -> None:
    import tifffile

    image = tifffile.imread(next((prepared.public("ldct-iqa", cases=24) / "train" / "images").glob("*.tif")))
    assert image.dtype.kind == "f" and image.min() >= 0.0 and image.max() <= 1.0
    assert (image == 0.0).mean() > 0.2  # air saturated by the soft-tissue window, as reported for the release


def _local_weights(tmp_path: Path, name: str = "resnet10t-local.pth") -> Path:
    import timm
    import torch

    path = tmp_path / name
    torch.save(timm.create_model("resnet10t", pretrained=False, num_classes=7).state_dict(), path)
    return path


def test_cached_weights_are_loaded_checked_and_recorded(tmp_path: Path) -> None:
    import torch

    from rexmle_baselines.base import BaselineContext
    from rexmle_baselines.timm_models import create_backbone
    from rexmle_baselines.weights import add_local_weights, read_manifest
    from rexmle_grade.errors import ConfigurationError

    cache = tmp_path / "cache"
    entry = add_local_weights("resnet10t.local", _local_weights(tmp_path), cache, architecture="resnet10t")
    assert read_manifest(cache)["resnet10t.local"] == entry
    params = {"model": "resnet10t", "pretrained": "resnet10t.local"}
    ctx = BaselineContext(task_id="ldct-iqa", grader_id="ldct-iqa", public_dir=tmp_path, out_dir=tmp_path,
                          work_dir=tmp_path, config="full", params=params, device="cpu", seed=0,
                          log=lambda line: None, weights_dir=cache)
    model = create_backbone(params, in_chans=1, num_classes=1, ctx=ctx)
    saved = torch.load(cache / entry.file)
    assert torch.allclose(model.layer1[0].conv1.weight, saved["layer1.0.conv1.weight"])  # loaded, not random
    assert ctx.measurements["weights"] == {"resnet10t.local": entry.sha256}
    with pytest.raises(UserInputError, match="are for resnet10t"):
        create_backbone({**params, "model": "resnet18"}, in_chans=1, num_classes=1, ctx=ctx)
    (cache / entry.file).write_bytes(b"tampered")
    with pytest.raises(ConfigurationError, match="the cache recorded"):
        create_backbone(params, in_chans=1, num_classes=1, ctx=ctx)
    with pytest.raises(ConfigurationError, match="are not in the weights cache") as info:
        create_backbone({"model": "resnet50", "pretrained": "resnet50.tv2_in1k"}, in_chans=1, num_classes=1, ctx=ctx)
    assert "rexmle baselines fetch-weights resnet50.tv2_in1k" in (info.value.hint or "")


def test_fetch_weights_checks_the_published_checksum_prefix(tmp_path: Path) -> None:
    from rexmle_baselines.weights import WeightsSource, fetch_weights, read_manifest, sha256_of
    from rexmle_grade.errors import RexmleError

    source_file = _local_weights(tmp_path, "served.pth")
    digest = sha256_of(source_file)
    served = tmp_path / f"resnet10t-{digest[:8]}.pth"
    source_file.rename(served)
    good = WeightsSource("r10t.test", "resnet10t", served.as_uri(), digest[:8], "test weights")
    (entry,) = fetch_weights(["r10t.test"], tmp_path / "cache", sources={good.name: good})
    assert entry.sha256 == digest and read_manifest(tmp_path / "cache")["r10t.test"].source == served.as_uri()
    assert fetch_weights(["r10t.test"], tmp_path / "cache", sources={good.name: good}) == [entry]  # kept, not fetched
    bad = WeightsSource("r10t.bad", "resnet10t", served.as_uri(), "00000000", "corrupt")
    with pytest.raises(RexmleError, match="its name promises 00000000"):
        fetch_weights(["r10t.bad"], tmp_path / "cache2", sources={bad.name: bad})
    assert not list((tmp_path / "cache2").glob("*.pth"))


def test_the_fetch_weights_command_registers_a_local_file(tmp_path: Path, capsys) -> None:
    from rexmle_baselines.weights import read_manifest
    from rexmle_grade.cli import main

    path = _local_weights(tmp_path)
    assert main(["baselines", "fetch-weights", "mine", "--file", str(path), "--architecture", "resnet10t",
                 "--weights-dir", str(tmp_path / "cache")]) == 0
    assert read_manifest(tmp_path / "cache")["mine"].architecture == "resnet10t"
    assert main(["baselines", "fetch-weights", "no-such-weights", "--weights-dir", str(tmp_path / "c")]) == 2
    assert "unknown weights" in capsys.readouterr().err


def test_budget_and_full_start_from_imagenet_weights_and_ensemble_folds() -> None:
    from rexmle_baselines.base import get_baseline
    from rexmle_baselines.weights import KNOWN_WEIGHTS, required_weights

    for name in ("timm-regress", "timm-cls", "detector"):
        for config in ("budget", "full"):
            params = get_baseline(name).configs[config]
            assert required_weights(params) == ["resnet50.tv2_in1k"], (name, config)
            assert KNOWN_WEIGHTS["resnet50.tv2_in1k"].architecture == params["model"]
        assert required_weights(get_baseline(name).configs["quick"]) == []  # quick: nothing to fetch
    assert get_baseline("timm-regress").configs["full"]["folds"] == 5


def test_a_fold_ensemble_runs_end_to_end_at_toy_size_on_a_cpu(prepared, tmp_path: Path) -> None:
    """full's code path (folds ensembled, a pretrained local backbone) shrunk to the quick network."""
    import timm
    import torch

    weights = tmp_path / "resnet10t-local.pth"
    torch.save(timm.create_model("resnet10t", pretrained=False).state_dict(), weights)
    run = run_baseline("timm-regress", "ldct-iqa", public_dir=prepared.public("ldct-iqa", cases=24),
                       out=tmp_path / "sub", work_dir=tmp_path / "w", config="full", allow_cpu=True,
                       overrides={"model": "resnet10t", "pretrained": str(weights), "folds": 2, "epochs": 1,
                                  "batch_size": 8})
    assert run.valid, run.problems
    assert run.measurements["models_in_ensemble"] == 2 and set(run.measurements["epochs_run"]) == {"fold 0", "fold 1"}
