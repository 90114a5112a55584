"""The ``heuristic`` baseline: each task's simple heuristic (:mod:`rexmle_baselines.heuristics`) as a baseline, so
``rexmle baselines run heuristic --task T`` and calibration place it beside the trained ones. Nothing is trained,
so its four configurations are one and the same, and it runs without torch."""

from __future__ import annotations

import dataclasses
import shutil
from typing import Any, ClassVar

from rexmle_baselines.base import Baseline, BaselineContext, publish_submission, register_baseline

_ONLY: dict[str, Any] = {"deterministic": True}


@register_baseline
class HeuristicBaseline(Baseline):
    name: ClassVar[str] = "heuristic"
    extra: ClassVar[str] = ""  # numpy, scipy and scikit-image: the package's own dependencies
    requires: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ("a threshold, an image statistic or the mean training label per task, fitted on "
                                  "the training data (no network, no torch): the floor between the sample "
                                  "submission and a trained model")
    trains: ClassVar[bool] = False
    configs: ClassVar[dict[str, dict[str, Any]]] = {"quick": _ONLY, "budget": _ONLY, "full": _ONLY, "smoke": _ONLY}

    def supports(self, task_id: str, grader_id: str) -> bool:
        from rexmle_baselines.heuristics import heuristics

        return task_id in heuristics()

    def run(self, ctx: BaselineContext) -> None:
        from rexmle_baselines.heuristics import heuristics

        heuristic = heuristics()[ctx.task_id]
        ctx.log(f"heuristic: {heuristic.summary}")
        ctx.measurements["heuristic"] = heuristic.summary
        staging = ctx.work_dir / "heuristic-submission"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        heuristic.run(dataclasses.replace(ctx, out_dir=staging))  # the same measurements dict
        publish_submission(staging, ctx.out_dir)
