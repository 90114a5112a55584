"""``tools/gpu_slurm_check.py`` without GPUs, so the check a GPU machine runs cannot rot where none are: a run given
no GPU through SLURM sees none in its sandbox, and a GPU request the node cannot grant is refused with SLURM's
reason. (With GPUs, the same tool checks that a run sees exactly the GPU SLURM granted: docs/gpu/.)"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[4]


def test_the_gpu_check_through_slurm_holds_without_gpus(capsys) -> None:
    spec = importlib.util.spec_from_file_location("gpu_slurm_check", ROOT / "tools" / "gpu_slurm_check.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "tools"))  # as when it is run as a script: gpu_check.py lies next to it
    try:
        spec.loader.exec_module(tool)
        before = {name: os.environ.get(name) for name in ("SLURM_CONF", "PYTHONPATH")}
        code = tool.main(["--no-gpus"])
    finally:
        sys.path.remove(str(ROOT / "tools"))
    said = capsys.readouterr().out
    if code == 2 and ("SLURM is not installed" in said or "could not start" in said):
        if os.environ.get("CI"):  # CI installs the packages: there a missing cluster is a failure
            pytest.fail(said.strip())
        pytest.skip(said.strip())
    assert code == 0, said
    assert "the run with --gpus-per-run 0: state finished; job" in said and '"nodes": []' in said
    assert "0 SLURM_* variables" in said and "SLURM refused the job array" in said and "--gres=gpu:1" in said
    assert {name: os.environ.get(name) for name in ("SLURM_CONF", "PYTHONPATH")} == before  # left as found
