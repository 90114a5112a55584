"""The instructions an agent gets (``workspace/instructions.md``): benchmark rules, the task's public description,
the hardware, the limits, the sandbox's rules and the validation command. The template is package data."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from string import Template
from typing import TYPE_CHECKING, Any

from rexmle_agents.harness.spec import RunSpec

if TYPE_CHECKING:
    from rexmle_agents.harness.context import TaskInfo
    from rexmle_agents.sandbox.base import Sandbox


def human_duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def render_instructions(spec: RunSpec, task: TaskInfo, sandbox: Sandbox, hardware: Mapping[str, Any]) -> str:
    template = Template(resources.files("rexmle_agents.prompts").joinpath("instructions.md").read_text("utf-8"))
    limits = spec.limits
    steps = "" if limits.max_steps is None else f" or {limits.max_steps} steps"
    gpus = hardware.get("gpus") or 0
    hw = (f"- {hardware.get('cpus')} CPU core(s), {hardware.get('memory_gb')} GB memory, "
          + (f"{gpus} GPU(s) (CUDA_VISIBLE_DEVICES is set)" if gpus else "no GPU: train on the CPU"))
    network = ("There is no network: nothing can be downloaded (no packages, no pretrained weights, no data "
               "sets); use the installed Python packages.")
    return template.substitute(
        title=task.title, task_id=task.task_id, workspace=sandbox.workspace_path, network=network,
        exec_timeout=human_duration(limits.exec_timeout_s), time_limit=human_duration(limits.time_limit_s),
        steps_rule=steps, hardware=hw, description=task.description.strip(),
    )
