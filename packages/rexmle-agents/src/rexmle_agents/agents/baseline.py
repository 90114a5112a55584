"""``baseline``: runs an expert pipeline of rexmle-baselines inside the sandbox.

The pipeline reads only the public view (``data/``) and writes the submission and its scratch files into the
workspace, exactly as an agent's own code would; the harness then validates, snapshots and grades it. Settings:

- ``baseline``: default the strongest baseline for the task and config (rexmle-baselines' explicit preference:
  nnU-Net for segmentation-type tasks with a GPU config, the quick pipelines that beat the sample with ``quick``);
- ``config``: quick | budget | full | smoke; ``set``: parameter overrides;
- ``device``: auto (the run's GPU when it has one) | cpu | cuda; ``allow_cpu``: run a GPU-sized config on a CPU;
- ``weights_dir``: the host's weights cache (default ``$REXMLE_WEIGHTS_DIR`` or ``<data>/weights``). Weights a
  config needs (``pretrained``) are copied from it into the workspace before the run, since the sandbox sees
  neither the cache nor the network; fetch them first with ``rexmle baselines fetch-weights``;
- ``margin_s``: time kept back at the end of the run for collecting the submission.

The pipeline is told the time it has (``--time-budget``): ``budget`` sizes its training to it, the others stop
early rather than overrun it. A resumable pipeline (nnU-Net) gets the run's remaining time: when one execution is cut
by the per-execution limit (``--exec-timeout``) while the run still has time, it is started again with ``--resume``
and continues from its work folder (finished folds and checkpoints kept). Any other pipeline would start again from
nothing, so it runs as one execution limited by the run's remaining time only (not by ``--exec-timeout``): the same
rule as ``rexmle baselines calibrate``, which gives every pipeline the whole budget, so both feed the normaliser
with the same kind of result. Whatever valid submission the pipeline has written by then (nnU-Net writes one as soon
as its first fold is trained) is the run's submission.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from rexmle_agents.harness.agent import BaseAgent, register_agent
from rexmle_agents.harness.context import RunContext
from rexmle_agents.sandbox.base import STOPPED_TIMEOUT
from rexmle_grade.errors import ConfigurationError, RexmleError

CONFIGS = ("quick", "budget", "full", "smoke")
WEIGHTS_IN_WORKSPACE = "working/weights"


def _baselines() -> Any:
    try:
        import rexmle_baselines.base as base
    except ImportError as exc:
        raise ConfigurationError("the baseline agent needs rexmle-baselines",
                                 hint="pip install 'rexmle-baselines[all]' -c constraints.txt") from exc
    return base


@register_agent
class BaselineAgent(BaseAgent):
    name: ClassVar[str] = "baseline"
    version: ClassVar[str] = "2.0.0"
    description: ClassVar[str] = "runs a rexmle-baselines pipeline (nnU-Net, MONAI, timm, ...) inside the sandbox"
    defaults: ClassVar[dict[str, Any]] = {"baseline": None, "config": "quick", "set": {}, "device": "auto",
                                          "allow_cpu": False, "weights_dir": None, "margin_s": 120.0}

    def preflight(self, task_id: str) -> None:
        """Before any run starts: the pipeline the run would use is installed here (the sandbox runs this same
        Python environment), so a missing extra is one line and exit 2, not a run that fails inside the sandbox."""
        base = _baselines()
        config = str(self.config["config"])
        if config not in CONFIGS:
            raise ConfigurationError(f"unknown baseline config {config!r}", hint="configs: " + ", ".join(CONFIGS))
        name = self.config["baseline"] or self.default_baseline(task_id, config)
        baseline = base.get_baseline(name)
        missing = baseline.missing_modules()
        if missing:
            raise ConfigurationError(f"the baseline {name!r} for task {task_id!r} needs {', '.join(missing)}, which "
                                     "is not installed in this Python environment (the sandbox runs the same one)",
                                     hint=f"pip install 'rexmle-baselines[{baseline.extra}]' -c constraints.txt (or "
                                          "bash tools/setup.sh --torch)")

    def run(self, ctx: RunContext) -> None:
        if any(e.get("step_kind") == "baseline" and (e.get("result") or {}).get("submitted")
               for e in ctx.finished_steps()):
            return  # a resumed run whose baseline already finished
        config = str(self.config["config"])
        if config not in CONFIGS:
            raise ConfigurationError(f"unknown baseline config {config!r}", hint="configs: " + ", ".join(CONFIGS))
        name = self.config["baseline"] or self.default_baseline(ctx.task.task_id, config)
        weights = self.stage_weights(ctx, name, config)
        resumable = bool(_baselines().get_baseline(name).resumable)
        attempts = sum(1 for e in ctx.finished_steps() if e.get("step_kind") == "baseline")
        margin = float(self.config["margin_s"])
        while True:
            budget = ctx.remaining().time_s - margin
            if budget <= 0:
                break
            argv = self.command(ctx, name, budget_s=budget, resume=attempts > 0, weights=bool(weights))
            with ctx.step("baseline", baseline=name, config=config, attempt=attempts, weights=weights) as step:
                # a pipeline that cannot resume would start again from nothing: one execution, the whole budget
                result = ctx.execute(argv, label=name, until_deadline=not resumable)
                step.result.update(exit_code=result.exit_code, stopped_by=result.stopped_by, seconds=result.wall_s)
                attempts += 1
                # cut by the per-execution limit while the run has time left: continue where it stopped
                again = (resumable and result.stopped_by == STOPPED_TIMEOUT
                         and ctx.remaining().time_s > 2 * margin)
                if result.ok or not again:
                    self.finish(ctx, name, config, result)
                    step.result["submitted"] = True
                    return
                step.result["resumed_next"] = True
        self.finish(ctx, name, config, None)

    def finish(self, ctx: RunContext, name: str, config: str, result: Any) -> None:
        """Keep what the pipeline wrote: its submission when it validates (also after a limit cut the run short),
        else the error."""
        candidate = ctx.collect_submission()
        if candidate.validation.ok:
            partial = result is None or not result.ok
            label = f"baseline {name} ({config})" + (" (cut short: finished parts)" if partial else "")
            snapshot = ctx.snapshot_submission(label, candidate=candidate,
                                               metadata={"baseline": name, "config": config, "partial": partial})
            ctx.select_final(snapshot, reason="the baseline's submission")
            return
        candidate.discard()
        if result is None:
            raise RexmleError(f"baseline {name!r} had no time left to run", hint="give the run more time")
        raise RexmleError(f"baseline {name!r} failed (exit {result.exit_code}, "
                          f"{result.stopped_by or 'no limit hit'}): {result.stderr_tail[-1500:]}")

    def command(self, ctx: RunContext, name: str, *, budget_s: float, resume: bool, weights: bool) -> list[str]:
        ws = ctx.workspace
        argv = ["python", "-m", "rexmle_baselines", "run", name, "--task", ctx.task.task_id,
                "--public-dir", f"{ws}/data", "--out", f"{ws}/submission", "--work-dir", f"{ws}/working/{name}",
                "--config", str(self.config["config"]), "--device", self.device(ctx), "--seed", str(ctx.spec.seed),
                "--time-budget", f"{int(budget_s)}"]
        if self.config["allow_cpu"]:
            argv.append("--allow-cpu")
        if resume:
            argv.append("--resume")
        if weights:
            argv += ["--weights-dir", f"{ws}/{WEIGHTS_IN_WORKSPACE}"]
        for key, value in dict(self.config["set"]).items():
            argv += ["--set", f"{key}={value}"]
        return argv

    def device(self, ctx: RunContext) -> str:
        device = str(self.config["device"] or "auto")
        if device == "auto":  # the run's own hardware decides, not the harness host's
            return "cuda" if ctx.hardware.get("gpus") else "cpu"
        return device

    @staticmethod
    def default_baseline(task_id: str, config: str = "quick") -> str:
        """The strongest installed baseline for the task in this config (rexmle-baselines' preference table)."""
        return _baselines().preferred_baseline(task_id, config)

    def stage_weights(self, ctx: RunContext, name: str, config: str) -> dict[str, str]:
        """Copy the cached weights the config names into the workspace (the sandbox sees no cache and no network);
        returns name -> SHA-256 of what was copied (journaled with the step)."""
        from rexmle_baselines.api import merge_params
        from rexmle_baselines.weights import (
            MANIFEST,
            default_weights_dir,
            read_manifest,
            required_weights,
            resolve_weights,
        )

        baseline = _baselines().get_baseline(name)
        if config not in baseline.configs:
            raise ConfigurationError(f"baseline {name!r} has no {config!r} configuration")
        params = merge_params(baseline.configs[config], {k: str(v) for k, v in dict(self.config["set"]).items()})
        names = required_weights(params)
        if not names:
            return {}
        cache = Path(self.config["weights_dir"]) if self.config["weights_dir"] else default_weights_dir()
        entries = read_manifest(cache)
        staged = {}
        for weights_name in names:
            resolved = resolve_weights(weights_name, cache, architecture=str(params.get("model", "")))
            entry = entries[weights_name]
            ctx.fs.ensure_dir(WEIGHTS_IN_WORKSPACE)
            ctx.fs.write_bytes(f"{WEIGHTS_IN_WORKSPACE}/{entry.file}", resolved.path.read_bytes())
            staged[weights_name] = resolved.sha256
        ctx.fs.write_text(f"{WEIGHTS_IN_WORKSPACE}/{MANIFEST}",
                          json.dumps([entries[n].model_dump() for n in sorted(staged)], indent=1) + "\n")
        ctx.log(f"weights copied into the workspace: {staged}")
        return staged
