"""rexmle-grade and rexmle-tasks must never import torch (or any other heavy deep-learning package)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_grade_and_tasks_never_import_torch() -> None:
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import rexmle_grade, rexmle_grade.cli
        from rexmle_grade.grader import grader_ids, get_grader
        for gid in grader_ids():
            get_grader(gid)
        import rexmle_tasks
        from rexmle_tasks.registry import all_tasks
        for info in pkgutil.walk_packages(rexmle_tasks.__path__, "rexmle_tasks."):
            importlib.import_module(info.name)
        for task in all_tasks().values():
            task.family()
            task.grader
        for info in pkgutil.walk_packages(rexmle_grade.__path__, "rexmle_grade."):
            importlib.import_module(info.name)
        heavy_names = ("torch", "torchvision", "monai", "nnunetv2", "timm", "diffusers")
        heavy = sorted(m for m in heavy_names if m in sys.modules)
        print("HEAVY", heavy)
        sys.exit(1 if heavy else 0)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
