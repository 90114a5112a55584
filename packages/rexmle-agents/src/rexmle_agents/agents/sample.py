"""``sample``: submits the task's sample submission, copied inside the sandbox (a floor for every report, and the
cheapest end-to-end check of a set-up)."""

from __future__ import annotations

from typing import ClassVar

from rexmle_agents.harness.agent import BaseAgent, register_agent
from rexmle_agents.harness.context import RunContext
from rexmle_grade.errors import RexmleError


@register_agent
class SampleAgent(BaseAgent):
    name: ClassVar[str] = "sample"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = "copies the task's public sample submission (no model; a floor and a set-up check)"

    def run(self, ctx: RunContext) -> None:
        if any(e.get("step_kind") == "copy_sample" and e.get("status") == "ok" for e in ctx.finished_steps()):
            return  # a resumed run whose work is done
        with ctx.step("copy_sample") as step:
            ws = ctx.workspace
            result = ctx.execute(f"cp -R {ws}/data/sample_submission/. {ws}/submission/", label="copy")
            step.result["exit_code"] = result.exit_code
            if not result.ok:
                raise RexmleError(f"copying the sample submission failed: {result.stderr_tail[-500:]}")
            snapshot = ctx.snapshot_submission("sample submission")
            ctx.select_final(snapshot, reason="the only candidate")
