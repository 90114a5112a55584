"""Packaging rules: dependencies flow grade <- tasks <- agents/baselines, and heavy deep-learning packages are only
ever optional extras of rexmle-baselines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "torchvision", "monai", "nnunetv2", "timm", "diffusers"}


def requirements(package: str) -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}

    extras = {k: names(v) for k, v in project.get("optional-dependencies", {}).items()}
    return names(project["dependencies"]), extras


@pytest.mark.parametrize("package", ["rexmle-grade", "rexmle-tasks", "rexmle-agents", "rexmle-baselines"])
def test_no_heavy_core_dependency(package: str) -> None:
    core, _ = requirements(package)
    assert not core & HEAVY, f"{package} needs {core & HEAVY} unconditionally; make it an extra"


def test_dependencies_flow_one_way() -> None:
    assert not {d for d in requirements("rexmle-grade")[0] if d.startswith("rexmle")}
    assert {d for d in requirements("rexmle-tasks")[0] if d.startswith("rexmle")} == {"rexmle-grade"}
    for upper in ("rexmle-agents", "rexmle-baselines"):
        assert {d for d in requirements(upper)[0] if d.startswith("rexmle")} <= {"rexmle-grade", "rexmle-tasks"}


def test_torch_is_pinned_for_every_install() -> None:
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert "torch==2.14.1" in pins and "torchvision==0.29.1" in pins
    assert "PIP_CONSTRAINT" in (ROOT / "tools" / "setup.sh").read_text()


@pytest.mark.network
def test_grade_alone_resolves_without_torch(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--report", str(report), str(ROOT / "packages" / "rexmle-grade")], check=True, timeout=600)
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "rexmle-grade" in names and not names & HEAVY
