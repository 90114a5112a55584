"""rexmle's tasks as a Harbor dataset (``rexmle export harbor``), and Harbor trials back as run folders
(``rexmle import harbor``).

Harbor (``harbor run -d DATASET -a AGENT -m MODEL``) runs one agent on one task folder in a container and scores it
with the task's verifier. One exported task is::

    <task_id>/
      task.toml          the agent's timeout, CPUs, memory, storage, GPUs, network off; the verifier runs
                         *separately* (a fresh container of the same image that receives only /workspace/submission)
      instruction.md     the task's public description, the submission contract and the rules
      environment/       Dockerfile (+ docker-compose.yaml when the data is mounted), rexmle/ (rexmle_grade and
                         validate.py, at /opt/rexmle), data/ (the public folder, when copied)
      tests/             test.sh -> verify.py: rexmle's grader on the submission, against private/ (the test
                         labels: the only copy in the task) and the human leaderboard; writes reward.json
                         (reward = the percentile, valid, medal, the metrics) and grade.json (the report entry)
      solution/          solve.sh + submission/: the gold submission made from the labels (Harbor's oracle agent)

The verifier runs in its own container because the agent's container is the agent's: code that ran there could
have replaced the grader. Harbor collects ``/workspace/submission`` (an artifact) and re-materialises it in the
verifier's fresh container; ``tests/`` (the labels) reaches only that container.

Public data up to ``copy_limit_gb`` is copied into the image; larger data is *mounted*: the task gets an
``environment/docker-compose.yaml`` that binds ``$REXMLE_DATA_DIR/<task>/public`` (the folder ``rexmle prepare``
wrote) read-only at ``/workspace/data``, so a user points it at their prepared data by setting that variable
before ``harbor run``.

A trial comes back as a run folder (``spec.json``, ``status.json``, ``journal.jsonl``, ``grade.json``) whose
agent is ``harbor/<agent>``, sandbox ``harbor``, and whose ``agent_config`` and grade labels carry
``origin: harbor`` with the job and trial names, so ``rexmle report`` reads it beside rexmle's own runs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from string import Template
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from rexmle_grade.errors import RexmleError, TaskDataMissingError, UserInputError
from rexmle_grade.settings import DATA_DIR_ENV

#: the Harbor release whose task format this exporter writes (and whose own models the tests validate it with)
HARBOR_VERSION = "0.26.0"
TASK_SCHEMA_VERSION = "1.4"  # harbor.models.task.config.TaskConfig.schema_version of that release
WORKSPACE = "/workspace"  # the same layout as a rexmle run's workspace: data/, working/, submission/
SUBMISSION = f"{WORKSPACE}/submission"
RUNTIME_DIR = "/opt/rexmle"  # rexmle_grade and validate.py inside the image
AGENT_USER = "agent"  # the agent's user in the image; the verifier runs as the image's default (root)
ORIGIN = "harbor"
REWARD_KEYS = ("reward", "percentile", "valid", "medal", "above_median", "fallback_to_sample")
MEDALS = {"gold": 3, "silver": 2, "bronze": 1}
# rexmle_grade's own requirements are installed at the versions installed here; these training packages too,
# where installed (the stack a rexmle run's sandbox offers)
TRAINING_PACKAGES = ("torch", "torchvision", "monai", "timm")
_SKIPPED_PRIVATE = ("synthetic-secret",)  # seeds the synthetic generator; grading never reads it


class HarborError(RexmleError):
    """A task that cannot be exported, or a Harbor job folder that cannot be imported."""


@dataclass(frozen=True)
class ExportOptions:
    """What an exported task asks Harbor for. ``time_limit_s`` is the agent's timeout (rexmle's run budget)."""

    time_limit_s: float = 12 * 3600.0
    cpus: int = 8
    memory_gb: float = 32.0
    gpus: int = 1
    storage_gb: float | None = None  # None: the public data twice over plus 20 GB of working room
    data: Literal["auto", "copy", "mount"] = "auto"
    copy_limit_gb: float = 2.0  # auto: copy public data up to this size, mount anything larger
    base_image: str = "python:3.11-slim"
    pip_install: bool = True  # False: base_image already holds rexmle_grade's requirements (nothing downloaded)
    allowed_hosts: tuple[str, ...] = ()  # non-empty: network "allowlist" (e.g. an agent's model API) instead of off
    verifier_timeout_s: float = 3600.0
    org: str = "rexmle"


@dataclass(frozen=True)
class ExportedTask:
    task_id: str
    folder: Path
    data: Literal["copied", "mounted"]
    public_bytes: int
    private_bytes: int


# ---------------------------------------------------------------------------------------------------------------
# export


def export_tasks(task_ids: Sequence[str], out: str | Path, *, data_root: str | Path | None = None,
                 options: ExportOptions = ExportOptions()) -> list[ExportedTask]:
    """One Harbor task folder per prepared task under ``out`` (a dataset folder ``harbor run -p`` takes)."""
    from rexmle_tasks.pipeline import prepared_info, task_dirs
    from rexmle_tasks.registry import get_task

    missing = [t for t in task_ids if prepared_info(task_dirs(get_task(t), data_root)) is None]
    if missing:
        raise TaskDataMissingError(f"{len(missing)} task(s) are not prepared: {', '.join(missing)}",
                                   hint=f"rexmle prepare {missing[0]} --synthetic (or without --synthetic for the "
                                        "real data), then export again")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [export_task(t, out, data_root=data_root, options=options) for t in task_ids]


def export_task(task_id: str, out: Path, *, data_root: str | Path | None = None,
                options: ExportOptions = ExportOptions()) -> ExportedTask:
    from rexmle_agents.harness.spec import data_variant
    from rexmle_grade.settings import data_dir
    from rexmle_tasks.grading import load_leaderboard
    from rexmle_tasks.pipeline import DESCRIPTION, require_prepared, task_dirs
    from rexmle_tasks.registry import get_task

    task = get_task(task_id)
    dirs = task_dirs(task, data_root)
    info = require_prepared(task, dirs)
    if info.task_version != task.meta.version:
        raise TaskDataMissingError(f"task {task_id!r} was prepared for version {info.task_version}, but version "
                                   f"{task.meta.version} is installed",
                                   hint=f"rexmle prepare {task_id} --force{' --synthetic' if info.synthetic else ''}")
    public_bytes, private_bytes = _size(dirs.public), _size(dirs.private)
    mode = options.data
    if mode == "auto":
        mode = "copy" if public_bytes <= options.copy_limit_gb * 1024**3 else "mount"
    folder = out / task_id
    if folder.exists():
        shutil.rmtree(folder)
    environment, tests, solution = folder / "environment", folder / "tests", folder / "solution"
    for path in (environment, tests, solution):
        path.mkdir(parents=True)

    grader = task.grader
    board = load_leaderboard(task)
    variant = data_variant(synthetic=info.synthetic, difficulty=info.difficulty)
    target = {
        "task_id": task.id, "task_version": task.meta.version, "grader_id": grader.grader_id,
        "task_type": task.meta.task_type, "dim": task.meta.dim, "synthetic": info.synthetic,
        "data_variant": variant, "split_digest": info.split_digest,
        "directions": {m.name: m.direction.value for m in grader.ranked_metrics},
        "leaderboard": "leaderboard.csv" if board is not None else None,
    }
    # the environment: public facts only
    runtime = environment / "rexmle"
    _copy_package("rexmle_grade", runtime / "rexmle_grade")
    (runtime / "validate.py").write_text(VALIDATE_SCRIPT, encoding="utf-8")
    (runtime / "task.json").write_text(json.dumps({"task_id": task.id, "grader_id": grader.grader_id}, indent=1)
                                       + "\n", encoding="utf-8")
    if mode == "copy":
        shutil.copytree(dirs.public, environment / "data", symlinks=False)
    else:
        relative = dirs.public.relative_to(data_dir(data_root)).as_posix()
        (environment / "docker-compose.yaml").write_text(_compose(relative), encoding="utf-8")
    (environment / "Dockerfile").write_text(_dockerfile(options, copy_data=mode == "copy"), encoding="utf-8")

    # the verifier: the only place the labels are
    shutil.copytree(dirs.private, tests / "private", symlinks=False,
                    ignore=shutil.ignore_patterns(*_SKIPPED_PRIVATE))
    if board is not None and task.meta.leaderboard is not None:
        shutil.copy(task.folder / task.meta.leaderboard.file, tests / "leaderboard.csv")
    (tests / "target.json").write_text(json.dumps(target, indent=1) + "\n", encoding="utf-8")
    (tests / "verify.py").write_text(VERIFY_SCRIPT, encoding="utf-8")
    _script(tests / "test.sh", "#!/bin/bash\nset -euo pipefail\n# rexmle's grader on the collected submission; "
                               "the reward and the full grade go to /logs/verifier\n"
                               "exec python3 /tests/verify.py\n")

    # the oracle: the gold submission, made from the labels by the grader itself
    grader.write_gold_submission(dirs.private, dirs.public, solution / "submission")
    _script(solution / "solve.sh", f"#!/bin/bash\nset -euo pipefail\nmkdir -p {SUBMISSION}\n"
                                   f"cp -a /solution/submission/. {SUBMISSION}/\n")

    description = (dirs.public / DESCRIPTION).read_text(encoding="utf-8")
    (folder / "instruction.md").write_text(_instruction(task, description, options, mode), encoding="utf-8")
    storage_gb = options.storage_gb if options.storage_gb is not None else 2 * public_bytes / 1024**3 + 20
    (folder / "task.toml").write_text(_task_toml(task, info, variant, options, mode, storage_gb), encoding="utf-8")
    return ExportedTask(task_id=task.id, folder=folder, data="copied" if mode == "copy" else "mounted",
                        public_bytes=public_bytes, private_bytes=private_bytes)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _copy_package(name: str, dest: Path) -> None:
    import importlib

    source = Path(importlib.import_module(name).__file__ or "").parent
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _script(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


def _pins() -> list[str]:
    """rexmle_grade's requirements and the training packages, at the versions installed here (unpinned where a
    training package is not installed: pip then takes the newest)."""
    names = [re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0] for r in metadata.requires("rexmle-grade") or []
             if "extra ==" not in r]
    pins = []
    for name in [*names, *TRAINING_PACKAGES]:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            if name not in TRAINING_PACKAGES:
                raise HarborError(f"rexmle-grade requires {name}, which is not installed here",
                                  hint="reinstall rexmle-grade with its dependencies") from None
    return pins


def _dockerfile(options: ExportOptions, *, copy_data: bool) -> str:
    pins = " \\\n    ".join(_pins())
    install = (f"RUN pip install --no-cache-dir \\\n    {pins}" if options.pip_install else
               "# rexmle_grade's requirements come with the base image (exported with --no-install):\n#   "
               + " ".join(_pins()))
    data = (f"COPY data/ {WORKSPACE}/data/\nRUN chmod -R a-w {WORKSPACE}/data" if copy_data
            else f"# the public data is mounted read-only at {WORKSPACE}/data (docker-compose.yaml, ${DATA_DIR_ENV})")
    return f"""# rexmle task image: Python with rexmle's grader (validation for the agent, grading for the verifier)
FROM {options.base_image}
{install}
COPY rexmle/ {RUNTIME_DIR}/
ENV PYTHONPATH={RUNTIME_DIR} PYTHONDONTWRITEBYTECODE=1
# the agent works as an unprivileged user: it can neither change the data nor the grader under {RUNTIME_DIR}
# (useradd where the image has it, else the account written directly: minimal images lack the shadow tools)
RUN (useradd --create-home --uid 1000 {AGENT_USER} 2>/dev/null \\
     || (echo "{AGENT_USER}:x:1000:1000::/home/{AGENT_USER}:/bin/sh" >> /etc/passwd \\
         && echo "{AGENT_USER}:x:1000:" >> /etc/group && mkdir -p /home/{AGENT_USER} \\
         && chown 1000:1000 /home/{AGENT_USER})) \\
    && mkdir -p {WORKSPACE}/working {SUBMISSION} {WORKSPACE}/data \\
    && chown {AGENT_USER}:{AGENT_USER} {WORKSPACE}/working {SUBMISSION}
{data}
WORKDIR {WORKSPACE}
"""


def _compose(public_relative: str) -> str:
    # ${VAR:?message}: compose refuses to start, with the message, when the variable is unset
    return f"""# The public data is large, so it is mounted rather than copied into the image: set {DATA_DIR_ENV}
# to the folder `rexmle prepare` wrote (the one holding {public_relative}) before `harbor run`.
services:
  main:
    volumes:
      - "${{{DATA_DIR_ENV}:?set {DATA_DIR_ENV} to your rexmle data folder (see rexmle's README, Running rexmle \
from Harbor)}}/{public_relative}:{WORKSPACE}/data:ro"
"""


_INSTRUCTION = Template("""# rexmle task: $title

You are an autonomous machine-learning engineer taking part in a benchmark. Build the best model you can for the
task below within the limits, and write predictions for every test case as a submission.

## Rules
- The task's public data is in `$workspace/data` (read-only). Work in `$workspace/working`; write the submission
  into `$submission` (`submission.csv` plus the prediction files it names, with paths relative to that folder).
- Test labels are not available to you and never will be: the submission is graded after you finish, in a
  separate container, with the challenge's official metrics, and ranked against the challenge's human
  leaderboard. Do not try to find them.
- $network
- Check your submission at any time with `python $runtime/validate.py` (public information only, every problem
  listed). An invalid submission scores nothing; with no submission at all, the sample submission is graded.
- You have $time_limit in all. When it runs out, the submission present at that moment is graded, so write a
  valid one early.

## Hardware
- $hardware

## Task description

$description
""")


def _instruction(task: Any, description: str, options: ExportOptions, mode: str) -> str:
    from rexmle_agents.harness.instructions import human_duration

    network = ("There is no network: nothing can be downloaded (no packages, no pretrained weights, no data sets); "
               "use the installed Python packages." if not options.allowed_hosts else
               f"The network reaches only {', '.join(options.allowed_hosts)}: nothing else can be downloaded; use "
               "the installed Python packages.")
    hardware = (f"{options.cpus} CPU core(s), {options.memory_gb:g} GB memory, "
                + (f"{options.gpus} GPU(s)" if options.gpus else "no GPU: train on the CPU"))
    return _INSTRUCTION.substitute(title=task.meta.title, workspace=WORKSPACE, submission=SUBMISSION,
                                   runtime=RUNTIME_DIR, network=network, hardware=hardware,
                                   time_limit=human_duration(options.time_limit_s), description=description.strip())


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise HarborError(f"no TOML form for {type(value).__name__} {value!r}")


def _toml_table(name: str, values: Mapping[str, Any]) -> str:
    lines = [f"[{name}]"] + [f"{key} = {_toml_value(v)}" for key, v in values.items() if v is not None]
    return "\n".join(lines)


def _task_toml(task: Any, info: Any, variant: str, options: ExportOptions, mode: str, storage_gb: float) -> str:
    network: dict[str, Any] = {"network_mode": "no-network"}
    if options.allowed_hosts:
        network = {"network_mode": "allowlist", "allowed_hosts": list(options.allowed_hosts)}
    root = (f"schema_version = {_toml_value(TASK_SCHEMA_VERSION)}\nsource = \"rexmle\"\n"
            f"# the verifier's container receives the submission through this artifact\n"
            f"artifacts = {_toml_value([SUBMISSION])}")
    sections = [
        root,
        _toml_table("task", {"name": f"{options.org}/{task.id}", "version": task.meta.version,
                             "description": task.meta.title,
                             "keywords": ["rexmle", task.meta.task_type, task.meta.dim, task.meta.modality]}),
        _toml_table("metadata", {"rexmle_task": task.id, "rexmle_task_version": task.meta.version,
                                 "grader": task.meta.grader, "competition": task.meta.competition,
                                 "data_variant": variant, "split_digest": info.split_digest,
                                 "public_data": "copied" if mode == "copy" else "mounted",
                                 "data_variable": None if mode == "copy" else DATA_DIR_ENV,
                                 "harbor_version": HARBOR_VERSION}),
        _toml_table("verifier", {"timeout_sec": float(options.verifier_timeout_s), "environment_mode": "separate"}),
        _toml_table("agent", {"timeout_sec": float(options.time_limit_s), "user": AGENT_USER}),
        _toml_table("environment", {"build_timeout_sec": 3600.0, "cpus": options.cpus,
                                    "memory_mb": int(options.memory_gb * 1024),
                                    "storage_mb": int(storage_gb * 1024), "gpus": options.gpus,
                                    "workdir": WORKSPACE, **network}),
    ]
    return "\n\n".join(sections) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# the scripts that run inside the containers (rexmle_grade at /opt/rexmle, nothing else of rexmle)

VALIDATE_SCRIPT = '''"""Check a submission (default /workspace/submission) against the task's public facts
(default /workspace/data; no labels): every problem listed."""
import json
import sys
from pathlib import Path

from rexmle_grade.grader import get_grader
from rexmle_grade.validation import validate_submission

facts = json.loads((Path(__file__).parent / "task.json").read_text())
submission = Path(sys.argv[1] if len(sys.argv) > 1 else "/workspace/submission")
data = Path(sys.argv[2] if len(sys.argv) > 2 else "/workspace/data")
report = validate_submission(get_grader(facts["grader_id"]), submission, data)
if report.ok:
    print(f"the submission in {submission} is valid for {facts['task_id']}")
    sys.exit(0)
print(f"the submission in {submission} is NOT valid for {facts['task_id']}:")
for problem in report.problems:
    print(" -", problem)
sys.exit(1)
'''

VERIFY_SCRIPT = '''"""Harbor's verifier for a rexmle task: grade the collected submission with rexmle's grader,
rank it on the human leaderboard, and write /logs/verifier/reward.json (reward = the percentile, 0 to 1; valid;
medal 3/2/1/0; the metrics) and /logs/verifier/grade.json (rexmle's report entry). An empty or missing
submission is replaced by the public sample submission, as rexmle's harness does (fallback_to_sample = 1).

The folders can be moved for a test run on a host: REXMLE_VERIFIER_SUBMISSION, REXMLE_VERIFIER_DATA,
REXMLE_VERIFIER_LOGS."""
import json
import math
import os
import sys
from pathlib import Path

from rexmle_grade.evaluate import evaluate_submission
from rexmle_grade.grader import Direction
from rexmle_grade.ranking import Leaderboard
from rexmle_grade.targets import GradingTarget

TESTS = Path(__file__).resolve().parent
RESERVED = ("reward", "percentile", "valid", "medal", "above_median", "fallback_to_sample")


def main():
    facts = json.loads((TESTS / "target.json").read_text())
    data = Path(os.environ.get("REXMLE_VERIFIER_DATA", "/workspace/data"))
    submission = Path(os.environ.get("REXMLE_VERIFIER_SUBMISSION", "/workspace/submission"))
    logs = Path(os.environ.get("REXMLE_VERIFIER_LOGS", "/logs/verifier"))
    logs.mkdir(parents=True, exist_ok=True)
    fallback = not submission.is_dir() or not any(submission.iterdir())
    if fallback:
        print(f"no submission in {submission}: grading the sample submission")
        submission = data / "sample_submission"
    board = None
    if facts["leaderboard"]:
        directions = {name: Direction(value) for name, value in facts["directions"].items()}
        board = Leaderboard.from_csv(TESTS / facts["leaderboard"], directions, version=facts["task_version"])
    target = GradingTarget(task_id=facts["task_id"], task_version=facts["task_version"],
                           grader_id=facts["grader_id"], public_dir=data, private_dir=TESTS / "private",
                           leaderboard=board, task_type=facts["task_type"], dim=facts["dim"],
                           synthetic=facts["synthetic"])
    labels = {"origin": "harbor", "data_variant": facts["data_variant"], "split_digest": facts["split_digest"]}
    if fallback:
        labels["fallback"] = "sample submission (the agent left none)"
    entry = evaluate_submission(target, submission, labels=labels)
    medal = 3 if entry.gold_medal else 2 if entry.silver_medal else 1 if entry.bronze_medal else 0
    rewards = {"reward": float(entry.percentile or 0.0), "percentile": float(entry.percentile or 0.0),
               "valid": int(entry.valid_submission), "medal": medal, "above_median": int(entry.above_median),
               "fallback_to_sample": int(fallback)}
    for name, value in entry.metrics.items():
        if isinstance(value, (int, float)) and math.isfinite(value):
            rewards["metric_" + name if name in RESERVED else name] = float(value)
    (logs / "grade.json").write_text(entry.model_dump_json(indent=1) + "\\n")
    (logs / "reward.json").write_text(json.dumps(rewards, indent=1) + "\\n")
    print(f"{facts['task_id']}: {entry.status}, percentile {entry.percentile}, medal {medal}")
    for problem in entry.problems[:20]:
        print(" -", problem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


# ---------------------------------------------------------------------------------------------------------------
# import: Harbor trials back as run folders


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _ModelInfo(_Loose):
    name: str
    provider: str | None = None


class _AgentInfo(_Loose):
    name: str
    version: str = ""
    model_info: _ModelInfo | None = None


class _AgentContext(_Loose):
    n_input_tokens: int | None = None
    n_cache_tokens: int | None = None
    n_output_tokens: int | None = None
    cost_usd: float | None = None


class _VerifierResult(_Loose):
    rewards: dict[str, float] | None = None


class _ExceptionInfo(_Loose):
    exception_type: str
    exception_message: str = ""


class _Timing(_Loose):
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None


class _TaskRef(_Loose):
    path: str | None = None


class _TrialConfig(_Loose):
    task: _TaskRef | None = None


class HarborTrial(_Loose):
    """The fields of Harbor's ``TrialResult`` (``<trial>/result.json``) that a run folder needs."""

    task_name: str
    trial_name: str
    trial_uri: str = ""
    agent_info: _AgentInfo
    config: _TrialConfig | None = None
    agent_result: _AgentContext | None = None
    verifier_result: _VerifierResult | None = None
    exception_info: _ExceptionInfo | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    agent_execution: _Timing | None = None


@dataclass
class ImportedTrial:
    trial: str
    run_dir: Path | None
    action: Literal["imported", "replaced", "kept", "refused"]
    problem: str | None = None
    warnings: list[str] = field(default_factory=list)


def trial_folders(job_dir: Path) -> list[Path]:
    """The trial folders of a Harbor job folder (each has a ``result.json`` naming a ``trial_name``), or the one
    trial folder given."""
    if not job_dir.is_dir():
        raise UserInputError(f"{job_dir} is not a folder", hint="give the job folder `harbor run` wrote (under "
                                                                "jobs/), or one trial folder in it")
    if _is_trial(job_dir):
        return [job_dir]
    found = sorted(p for p in job_dir.iterdir() if p.is_dir() and _is_trial(p))
    if not found:
        raise UserInputError(f"{job_dir} holds no Harbor trial (a folder with a result.json that names a "
                             "trial_name)", hint="give the job folder `harbor run` wrote, e.g. jobs/<job name>")
    return found


def _is_trial(folder: Path) -> bool:
    result = folder / "result.json"
    if not result.is_file():
        return False
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and "trial_name" in data


def import_job(job_dir: str | Path, group_dir: str | Path, *, force: bool = False,
               data_root: str | Path | None = None) -> list[ImportedTrial]:
    """Every trial of a Harbor job as a run folder in ``group_dir`` (``runs/<group>``). A trial whose result cannot
    be read is reported, not guessed at; a trial imported before is kept unless ``force``."""
    job_dir, group_dir = Path(job_dir), Path(group_dir)
    imported = []
    for folder in trial_folders(job_dir):
        try:
            imported.append(import_trial(folder, group_dir, job=job_dir.resolve().name, force=force,
                                         data_root=data_root))
        except (HarborError, TaskDataMissingError) as exc:
            imported.append(ImportedTrial(trial=folder.name, run_dir=None, action="refused", problem=exc.message))
    return imported


def import_trial(trial_dir: Path, group_dir: Path, *, job: str, force: bool = False,
                 data_root: str | Path | None = None) -> ImportedTrial:
    from rexmle_agents.harness.journal import Journal
    from rexmle_agents.harness.spec import Limits, RunSpec
    from rexmle_grade.report import ReportEntry
    from rexmle_grade.settings import rexmle_versions

    try:
        trial = HarborTrial.model_validate_json((trial_dir / "result.json").read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        raise HarborError(f"{trial_dir / 'result.json'} is not a Harbor trial result: "
                          f"{'.'.join(map(str, first['loc']))}: {first['msg']}",
                          hint="give the folders Harbor wrote, unchanged") from None
    warnings: list[str] = []
    grade_path = trial_dir / "verifier" / "grade.json"
    grade: ReportEntry | None = None
    if grade_path.is_file():
        try:
            grade = ReportEntry.model_validate_json(grade_path.read_bytes())
        except ValidationError as exc:
            warnings.append(f"verifier/grade.json is not a rexmle grade ({exc.error_count()} problem(s)): left out")
    else:
        warnings.append("no verifier/grade.json: the verifier did not finish, or the task is not a rexmle export")
    task_id, task_version, digest, variant = _task_facts(trial, grade, data_root)
    model = trial.agent_info.model_info
    model_name = None if model is None else (f"{model.provider}/{model.name}" if model.provider else model.name)
    timeout = _timeout(trial_dir)
    group = group_dir.name
    spec = RunSpec(task_id=task_id, task_version=task_version, split_digest=digest, data_variant=variant,
                   agent=f"harbor/{trial.agent_info.name}", agent_version=trial.agent_info.version or "unknown",
                   agent_config={"origin": ORIGIN, "harbor_job": job, "harbor_trial": trial.trial_name,
                                 "harbor_trial_uri": trial.trial_uri},
                   models={"agent": model_name} if model_name else {},
                   limits=Limits(time_limit_s=timeout) if timeout else Limits(), sandbox=ORIGIN, group=group,
                   rexmle_versions=rexmle_versions())
    run_dir = group_dir / spec.run_id
    action = "imported"
    if run_dir.exists():
        if not force:
            return ImportedTrial(trial=trial.trial_name, run_dir=run_dir, action="kept", warnings=warnings)
        shutil.rmtree(run_dir)
        action = "replaced"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(spec.model_dump_json(indent=1) + "\n", encoding="utf-8")

    context = trial.agent_result or _AgentContext()
    started = trial.started_at or (trial.agent_execution.started_at if trial.agent_execution else None)
    finished = trial.finished_at
    elapsed = (finished - started).total_seconds() if started and finished else 0.0
    error = trial.exception_info
    reason = (f"Harbor: {error.exception_type}: {error.exception_message}"[:500] if error
              else "Harbor: the trial finished")
    timed_out = error is not None and "Timeout" in error.exception_type
    state = "timed_out" if timed_out else "failed" if error is not None and grade is None else "finished"
    tokens_in, tokens_out = context.n_input_tokens, context.n_output_tokens
    status = {"format_version": spec.format_version, "state": state, "reason": reason,
              "limit": "time" if timed_out else None, "attempts": 1, "elapsed_s": round(elapsed, 3),
              "run_id": spec.run_id, "task_id": task_id, "agent": spec.agent, "seed": spec.seed,
              "started_at": _iso(started), "updated_at": _iso(finished), "finished_at": _iso(finished),
              "tokens": None if tokens_in is None and tokens_out is None else (tokens_in or 0) + (tokens_out or 0),
              "input_tokens": tokens_in, "output_tokens": tokens_out, "cost_usd": context.cost_usd,
              "final_choice": "the submission Harbor collected at the end of the trial"}
    (run_dir / "status.json").write_text(json.dumps(status, indent=1) + "\n", encoding="utf-8")
    journal = Journal(run_dir / "journal.jsonl")
    when = finished.timestamp() if finished else (started.timestamp() if started else 0.0)
    journal.append("log", message=f"imported from Harbor job {job}, trial {trial.trial_name}", time=when,
                   origin=ORIGIN, rewards=(trial.verifier_result.rewards if trial.verifier_result else None))
    if grade is not None:
        labels = {**grade.labels, "origin": ORIGIN, "agent": spec.agent, "run_id": spec.run_id, "group": group,
                  "harbor_trial": trial.trial_name, "seed": str(spec.seed)}
        if model_name:
            labels["models"] = f"agent={model_name}"
        grade = grade.model_copy(update={"labels": labels})
        (run_dir / "grade.json").write_text(grade.model_dump_json(indent=1) + "\n", encoding="utf-8")
        journal.append("graded", time=when, status=grade.status, percentile=grade.percentile,
                       metrics=dict(grade.metrics))
    return ImportedTrial(trial=trial.trial_name, run_dir=run_dir, action=action, warnings=warnings)


def _task_facts(trial: HarborTrial, grade: Any, data_root: str | Path | None) -> tuple[str, str, str, str]:
    """Task id, version, split digest and data variant: from the verifier's grade, else from the exported task's
    verifier facts (where the trial's task folder still is), else from the task's name and its prepared data here."""
    if grade is not None and grade.labels.get("split_digest"):
        return grade.task_id, grade.task_version, grade.labels["split_digest"], grade.labels.get("data_variant",
                                                                                                  "unknown")
    from rexmle_agents.harness.spec import UNKNOWN_VARIANT, data_variant
    from rexmle_grade.errors import UnknownNameError
    from rexmle_tasks.pipeline import prepared_info, task_dirs
    from rexmle_tasks.registry import get_task

    exported = _exported_facts(trial)
    if exported.get("split_digest") and exported.get("task_id"):
        return (str(exported["task_id"]), str(exported.get("task_version", "")), str(exported["split_digest"]),
                str(exported.get("data_variant", UNKNOWN_VARIANT)))
    name = trial.task_name.split("/")[-1]
    try:
        task = get_task(name)
    except UnknownNameError:
        raise HarborError(f"trial {trial.trial_name} ran task {trial.task_name!r}, which is no rexmle task, and its "
                          "verifier left no rexmle grade", hint="import trials of tasks `rexmle export harbor` "
                                                                "wrote") from None
    info = prepared_info(task_dirs(task, data_root))
    if info is None:
        return task.id, task.meta.version, "unknown", UNKNOWN_VARIANT
    return task.id, info.task_version, info.split_digest, data_variant(synthetic=info.synthetic,
                                                                       difficulty=info.difficulty)


def _exported_facts(trial: HarborTrial) -> dict[str, Any]:
    """What rexmle wrote about the task into its verifier (``tests/target.json``), where the trial's task folder
    still is (empty otherwise)."""
    folder = trial.config.task.path if trial.config and trial.config.task else None
    path = Path(folder) / "tests" / "target.json" if folder else None
    if path is None or not path.is_file():
        return {}
    try:
        facts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return facts if isinstance(facts, dict) else {}


def _timeout(trial_dir: Path) -> float | None:
    """The agent's timeout the trial ran under (its config.json), for the run's time budget."""
    config = trial_dir / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    agent = data.get("agent") if isinstance(data, dict) else None
    value = agent.get("override_timeout_sec") if isinstance(agent, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.timezone.utc).isoformat()


def data_variable_hint() -> str:
    """How a user points mounted tasks at their prepared data (for the CLI's message)."""
    current = os.environ.get(DATA_DIR_ENV)
    return (f"{DATA_DIR_ENV} is {current}" if current else
            f"set {DATA_DIR_ENV} to your rexmle data folder before `harbor run` (the tasks mount its public data)")
