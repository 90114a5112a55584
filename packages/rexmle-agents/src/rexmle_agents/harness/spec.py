"""The unit of work: :class:`RunSpec` (one agent on one task with one seed), written to ``spec.json``.

A run id is derived from the fields that define what runs (task + version + split + data variant, agent + version +
config, models, seed, limits, resources, sandbox), so re-running the same spec finds the same folder and resumes it.
Package versions and where the data lives are recorded but do not change the id.

The data variant (:func:`data_variant`) says which data the task was prepared from: ``real``, or a synthetic
mirror at its difficulty (``synthetic-easy``, ``synthetic-realistic``). Easy and realistic mirrors of a task share
their case ids and so their split digest: without the variant in the id, a realistic run would resume (or silently
return) an easy run's folder. A ``spec.json`` written before variants were recorded reads as ``unknown``, and its
id is computed as it was then, so such folders keep their ids.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rexmle_grade.errors import UserInputError

# Bumped when the run folder's layout or the journal's meaning changes; older folders are refused, not guessed at.
RUN_FORMAT_VERSION = 1
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$")
_UNIT_S = {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
REAL_VARIANT = "real"
UNKNOWN_VARIANT = "unknown"  # a spec.json written before variants were recorded


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``12h`` or ``1.5d``."""
    if isinstance(text, (int, float)):
        return float(text)
    match = _DURATION.match(text)
    if match is None:
        raise UserInputError(f"{text!r} is not a duration", hint="use seconds or a unit: 90s, 15m, 12h, 1d")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def data_variant(*, synthetic: bool, difficulty: str | None) -> str:
    """``real``, or ``synthetic-<difficulty>`` (a synthetic preparation that records no difficulty is ``easy``: the
    record leaves ``easy`` out, and mirrors made before difficulties existed were easy)."""
    return f"synthetic-{difficulty or 'easy'}" if synthetic else REAL_VARIANT


def data_kind_of(variant: str) -> str:
    """``real``, ``synthetic`` or ``unknown``: what decides whether a result is comparable with the human board."""
    return "synthetic" if variant.startswith("synthetic") else REAL_VARIANT if variant == REAL_VARIANT \
        else UNKNOWN_VARIANT


class Limits(_Frozen):
    """Budgets the harness enforces; ``None`` means unlimited."""

    time_limit_s: float = Field(default=12 * 3600, gt=0)  # total wall-clock of the run (all attempts together)
    exec_timeout_s: float = Field(default=4 * 3600, gt=0)  # one execution in the sandbox
    max_steps: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)
    # Add the time lost to model API retries (rate limits, outages) to the wall-clock budget.
    extend_for_model_retries: bool = False


class Resources(_Frozen):
    """What one run may use; GPUs are assigned by the executor (only their device nodes exist inside the sandbox).
    ``memory_gb`` and ``disk_gb`` left at None get this machine's safe default when the run first starts (see
    :mod:`rexmle_agents.harness.limits`; recorded in the journal, not in the run id)."""

    gpus: int = Field(default=0, ge=0)
    cpus: int | None = Field(default=None, ge=1)
    memory_gb: float | None = Field(default=None, gt=0)
    max_processes: int = Field(default=1024, ge=8)
    max_file_gb: float | None = Field(default=64.0, gt=0)
    disk_gb: float | None = Field(default=None, gt=0)  # bytes the workspace may hold
    max_files: int = Field(default=1_000_000, ge=100)  # entries the workspace may hold
    # bytes the run folder may hold besides the workspace (journal, cassette, logs, snapshots); None: the default
    run_folder_gb: float | None = Field(default=None, gt=0)


class RunSpec(_Frozen):
    """One run: which agent, on which task, with which models, seed, budgets and sandbox."""

    format_version: int = RUN_FORMAT_VERSION
    task_id: str
    task_version: str
    split_digest: str
    data_variant: str = Field(default=UNKNOWN_VARIANT, pattern=r"^(real|unknown|synthetic-[a-z0-9-]+)$",
                              description="the data the task was prepared from: real, synthetic-easy, "
                                          "synthetic-realistic (unknown: written before variants were recorded)")
    data_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$",
                                    description="which synthetic mirror of the variant: a one-way digest of its "
                                                "secret (two mirrors of one task and seed differ by it); none for "
                                                "real data or preparations made before mirrors had secrets")
    agent: str
    agent_version: str
    agent_config: dict[str, Any] = Field(default_factory=dict)
    models: dict[str, str] = Field(default_factory=dict)  # role -> model string
    seed: int = 0
    limits: Limits = Limits()
    resources: Resources = Resources()
    sandbox: str = "bwrap"
    sandbox_image: str | None = None  # apptainer / docker: the image holding Python and the rexmle packages
    allow_unsandboxed: bool = False
    # K > 0: hold out K training groups as a selection split the harness grades candidates on (off by default,
    # as in the paper); the final grade uses the real test cases only
    selection_cases: int = Field(default=0, ge=0)
    group: str = "default"
    # recorded, not part of the id
    data_root: str = ""
    rexmle_versions: dict[str, str] = Field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        legacy = {"data_variant"} if self.data_variant == UNKNOWN_VARIANT else set()  # keeps old folders' ids
        if self.data_digest is None:
            legacy.add("data_digest")
        exclude: dict[str, Any] = dict.fromkeys(("group", "data_root", "rexmle_versions", *legacy), True)
        if self.resources.run_folder_gb is None:  # the default leaves the ids of older specs as they were
            exclude["resources"] = {"run_folder_gb"}
        return self.model_dump(mode="json", exclude=exclude)

    @property
    def run_id(self) -> str:
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:10]
        return f"{self.task_id}.{_slug(self.agent)}.s{self.seed}.{digest}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "agent"
