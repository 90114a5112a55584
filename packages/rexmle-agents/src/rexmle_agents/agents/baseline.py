"""``baseline``: runs an expert pipeline of rexmle-baselines inside the sandbox.

The pipeline reads only the public view (``data/``) and writes the submission and its scratch files into the
workspace, exactly as an agent's own code would; the harness then validates, snapshots and grades it. Settings:
``baseline`` (default: the first baseline covering the task), ``config`` (quick | full), ``set`` (parameter
overrides), ``device`` (cpu | cuda; default cuda when the run has GPUs).
"""

from __future__ import annotations

from typing import Any, ClassVar

from rexmle_agents.harness.agent import BaseAgent, register_agent
from rexmle_agents.harness.context import RunContext
from rexmle_grade.errors import ConfigurationError, RexmleError, UserInputError


@register_agent
class BaselineAgent(BaseAgent):
    name: ClassVar[str] = "baseline"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = "runs a rexmle-baselines pipeline (nnU-Net, MONAI, timm, ...) inside the sandbox"
    defaults: ClassVar[dict[str, Any]] = {"baseline": None, "config": "quick", "set": {}, "device": None}

    def run(self, ctx: RunContext) -> None:
        if any(e.get("step_kind") == "baseline" and e.get("status") == "ok" for e in ctx.finished_steps()):
            return
        name = self.config["baseline"] or self._default_baseline(ctx.task.task_id)
        device = self.config["device"] or ("cuda" if ctx.hardware.get("gpus") else "cpu")
        ws = ctx.workspace
        argv = ["python", "-m", "rexmle_baselines", "run", name, "--task", ctx.task.task_id,
                "--public-dir", f"{ws}/data", "--out", f"{ws}/submission", "--work-dir", f"{ws}/working/{name}",
                "--config", str(self.config["config"]), "--device", device, "--seed", str(ctx.spec.seed)]
        for key, value in dict(self.config["set"]).items():
            argv += ["--set", f"{key}={value}"]
        with ctx.step("baseline", baseline=name, config=self.config["config"]) as step:
            result = ctx.execute(argv, label=name)
            step.result.update(exit_code=result.exit_code, stopped_by=result.stopped_by, seconds=result.wall_s)
            if not result.ok:
                raise RexmleError(f"baseline {name!r} failed (exit {result.exit_code}, "
                                  f"{result.stopped_by or 'no limit hit'}): {result.stderr_tail[-1500:]}")
            snapshot = ctx.snapshot_submission(f"baseline {name} ({self.config['config']})",
                                               metadata={"baseline": name, "config": self.config["config"]})
            ctx.select_final(snapshot, reason="the baseline's submission")

    @staticmethod
    def _default_baseline(task_id: str) -> str:
        try:
            from rexmle_baselines.base import baselines_for
        except ImportError as exc:
            raise ConfigurationError("the baseline agent needs rexmle-baselines",
                                     hint="pip install 'rexmle-baselines[all]' -c constraints.txt") from exc
        names = baselines_for(task_id)
        if not names:
            raise UserInputError(f"no baseline covers task {task_id!r}", hint="see `rexmle baselines list`")
        return names[0]
