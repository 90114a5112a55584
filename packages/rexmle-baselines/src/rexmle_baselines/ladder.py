"""The difficulty ladder of a synthetic mirror: the sample submission, the task's simple heuristic and a trained
quick baseline, each graded on the mirror's hidden test labels by the task's own grader (issue 36).

A mirror separates agents only where the rungs stand apart: the sample below the heuristic, the heuristic clearly
below the trained baseline. :func:`measure_ladder` prepares the mirror (or reuses a prepared one) and measures the
rungs asked for; the realistic-mirror tests and ``tools/bench_synthetic.py`` both read the ladder from here. Values
are the grader's validation metric (:attr:`rexmle_grade.grader.Grader.validation_metric`), turned so that higher is
better for the comparison (:attr:`Rung.score`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rexmle_grade.grader import Direction, TestManifest, get_grader

RUNGS = ("sample", "heuristic", "baseline")


@dataclass(frozen=True)
class Rung:
    name: str         # "sample", "heuristic" or the trained baseline's name
    metric: str       # the validation metric's name
    value: float      # as the grader reports it (nan when the submission was invalid)
    higher_better: bool
    valid: bool
    percentile: float | None
    seconds: float

    @property
    def score(self) -> float:
        """The value turned so that higher is better (an invalid submission is -inf)."""
        if not self.valid or self.value != self.value:
            return float("-inf")
        return self.value if self.higher_better else -self.value


@dataclass
class Ladder:
    task_id: str
    difficulty: str
    cases: int  # test cases graded
    rungs: dict[str, Rung] = field(default_factory=dict)

    def ordered(self, margin: float = 0.0) -> bool:
        """Whether each measured rung beats the one below by more than ``margin`` (in the metric's units)."""
        scores = [self.rungs[name].score for name in self._order() if name in self.rungs]
        return all(upper - lower > margin for lower, upper in itertools.pairwise(scores))

    def _order(self) -> list[str]:
        return ["sample", "heuristic", *[n for n in self.rungs if n not in ("sample", "heuristic")]]


def prepare_mirror(task_id: str, data_root: Path, *, difficulty: str = "realistic", cases: int | None = None,
                   seed: int = 0, secret: bytes | str | None = None) -> Path:
    """Prepare (or reuse) the synthetic mirror of ``task_id`` under ``data_root``; returns its public folder."""
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    task = get_task(task_id)
    dirs = task_dirs(task, data_root)
    prepare_task(task, dirs, synthetic=True, cases=cases, seed=seed, difficulty=difficulty, secret=secret)
    return dirs.public


def measure_ladder(task_id: str, data_root: Path, *, difficulty: str = "realistic", cases: int | None = None,
                   seed: int = 0, secret: bytes | str | None = None, rungs: Sequence[str] = RUNGS,
                   baseline: str | None = None, config: str = "quick", work_root: Path | None = None,
                   log: Callable[[str], None] | None = None) -> Ladder:
    """Measure ``rungs`` of ``task_id``'s mirror. ``baseline``: the trained rung (default: the one the task's
    heuristic names, else the preferred quick baseline that is installed), run with ``config`` and the heuristic's
    ``ladder_overrides``."""
    from rexmle_baselines.api import run_baseline
    from rexmle_baselines.base import preferred_baseline
    from rexmle_grade.evaluate import evaluate_submission
    from rexmle_grade.targets import resolve_target

    say = log or (lambda line: None)
    public = prepare_mirror(task_id, data_root, difficulty=difficulty, cases=cases, seed=seed, secret=secret)
    target = resolve_target(task_id, data_root)
    metric = get_grader(target.grader_id).validation_metric
    ladder = Ladder(task_id=task_id, difficulty=difficulty, cases=len(TestManifest.read(public).ids))

    def grade(name: str, submission: Path, seconds: float) -> None:
        entry = evaluate_submission(target, submission)
        value = float(entry.metrics.get(metric.name, float("nan"))) if entry.valid_submission else float("nan")
        ladder.rungs[name] = Rung(name=name, metric=metric.name, value=value,
                                  higher_better=metric.direction is Direction.HIGHER_BETTER,
                                  valid=bool(entry.valid_submission), percentile=entry.percentile,
                                  seconds=round(seconds, 2))
        say(f"{task_id} ({difficulty}) {name}: {metric.name} {value:.4f} in {seconds:.1f} s")

    if "sample" in rungs:
        grade("sample", public / "sample_submission", 0.0)
    from rexmle_baselines.heuristics import heuristics

    heuristic = heuristics().get(task_id)
    overrides = dict(heuristic.ladder_overrides) if heuristic is not None and baseline is None else {}
    trained = baseline or (heuristic.ladder_baseline if heuristic is not None else None)
    trained = trained or preferred_baseline(task_id, config)
    names = (["heuristic"] if "heuristic" in rungs else []) + ([trained] if "baseline" in rungs else [])
    for name in names:
        work = None if work_root is None else work_root / task_id / difficulty / name
        started = time.perf_counter()
        run = run_baseline(name, task_id, public_dir=public, work_dir=work, config=config, device="cpu", seed=seed,
                           log=say, overrides=overrides if name == trained else None)
        grade(name, run.submission_dir, time.perf_counter() - started)
    return ladder
