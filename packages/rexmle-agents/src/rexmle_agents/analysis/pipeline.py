"""``analyse_runs``: detectors, the judge and the failure analysis over a set of runs, written as they finish.

What lands in the output folder:

* ``runs/<run_id>.json``: :class:`RunAnalysis`, every verdict (judge and detectors) with its evidence, and the
  failure analysis; written as soon as the run is done, so a stopped analysis keeps what it made;
* ``manifest.json``: :class:`AnalysisManifest`, versions, judge, factors, runs, cost, and whether it completed;
* ``verdicts.csv``, ``comparison.csv``, ``runs.csv``, ``steps.csv``: the tidy tables (:mod:`.frames`);
* ``capabilities.csv``, ``failures.csv``: the aggregates per data kind x agent x model x task type;
* ``disagreements.csv``: every run x factor where the judge and a detector disagree, with both evidences;
* ``judge-calls.jsonl``: every model call of the judge (usage, cost), as the run journals record them;
* ``figures/`` (:mod:`.figures`) and ``view.html``: ``rexmle view``'s page of the runs, with each factor's evidence
  next to the node it quotes.

A judge verdict from an earlier analysis in the same folder is reused when the run's content (its digest), the
judge's model, prompt version, rubric version and settings are the same and it was a verdict (not an error or
unjudged): an analysis stopped by its budget continues where it stopped, and paid calls are not made twice.
"""

from __future__ import annotations

import datetime as dt
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rexmle_agents.analysis.detectors import DETECTORS_VERSION, detect
from rexmle_agents.analysis.evidence import run_text, task_brief
from rexmle_agents.analysis.factors import Factor, load_rubrics
from rexmle_agents.analysis.failures import run_failures
from rexmle_agents.analysis.judge import Judge, prompt_version
from rexmle_agents.analysis.records import JUDGED_STATUSES, AnalysisManifest, FactorVerdict, RunAnalysis
from rexmle_agents.models.accounting import UsageTotals
from rexmle_agents.results.loader import RunRecord, RunSet
from rexmle_agents.results.rows import run_row
from rexmle_agents.results.trajectory import trajectory
from rexmle_grade.csvsafe import frame_to_csv
from rexmle_grade.errors import UserInputError
from rexmle_grade.settings import rexmle_versions

MANIFEST_FILE, RUNS_FOLDER, CALLS_FILE = "manifest.json", "runs", "judge-calls.jsonl"
Progress = Callable[[str], None]


@dataclass
class AnalysisResult:
    out: Path
    manifest: AnalysisManifest
    analyses: list[RunAnalysis]
    written: list[Path] = field(default_factory=list)
    figures: dict[str, int] = field(default_factory=dict)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, text: str) -> Path:
    """Written aside and renamed over, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
    return path


def load_analyses(out: Path) -> tuple[AnalysisManifest | None, list[RunAnalysis]]:
    """The manifest (None if there is none) and the run analyses it lists (every one present if no manifest)."""
    if not out.is_dir():
        raise UserInputError(f"{out} is not a folder", hint="pass the folder `rexmle analyse ... -o OUT` wrote")
    manifest = None
    if (out / MANIFEST_FILE).is_file():
        try:
            manifest = AnalysisManifest.model_validate_json((out / MANIFEST_FILE).read_bytes())
        except ValidationError as exc:
            raise UserInputError(f"{out / MANIFEST_FILE} is not an analysis manifest of this rexmle: "
                                 f"{exc.errors()[0]['msg']}", hint="run `rexmle analyse` again into a new folder") \
                from None
    wanted = set(manifest.runs) if manifest is not None else None
    analyses = []
    for path in sorted((out / RUNS_FOLDER).glob("*.json")):
        if wanted is not None and path.stem not in wanted:
            continue
        try:
            analyses.append(RunAnalysis.model_validate_json(path.read_bytes()))
        except ValidationError as exc:
            raise UserInputError(f"{path} is not a run analysis of this rexmle: {exc.errors()[0]['msg']}",
                                 hint="run `rexmle analyse` again into a new folder") from None
    return manifest, analyses


def _previous_verdicts(out: Path) -> dict[tuple[str, str], FactorVerdict]:
    if not (out / RUNS_FOLDER).is_dir():
        return {}
    found = {}
    for path in (out / RUNS_FOLDER).glob("*.json"):
        try:
            analysis = RunAnalysis.model_validate_json(path.read_bytes())
        except ValidationError:  # an older format or a damaged file is simply judged again
            continue
        for verdict in analysis.verdicts:
            if verdict.source == "judge" and verdict.status in JUDGED_STATUSES:
                found[(analysis.run_id, verdict.factor)] = verdict
    return found


def analyse_runs(runs: RunSet, out: Path, *, factors: Sequence[Factor] | None = None, judge: Judge | None = None,
                 reuse: bool = True, max_cost_usd: float | None = None, view: bool = True, figures: bool = True,
                 progress: Progress | None = None) -> AnalysisResult:
    """Analyse every run of ``runs`` into ``out`` (see the module's table); never raises for a judge's bad answer
    or a spent budget: the manifest's ``complete`` and ``stopped`` say how far it got."""
    rubrics = load_rubrics()
    chosen = tuple(factors or rubrics.factors)
    ids = tuple(f.id for f in chosen)
    started = _now()
    previous = _previous_verdicts(out) if reuse and judge is not None else {}
    reused = 0
    analyses: list[RunAnalysis] = []
    for run in sorted(runs.runs, key=lambda r: r.run_id):
        analysis, reused_here = _analyse_run(run, chosen, judge, previous, rubrics.label, progress)
        reused += reused_here
        write_json(out / RUNS_FOLDER / f"{run.run_id}.json", analysis.model_dump_json(indent=1))
        analyses.append(analysis)
    ledger = judge.model.ledger if judge is not None else None
    manifest = AnalysisManifest(
        started_at=started, finished_at=_now(), rexmle_versions=rexmle_versions(), rubric_version=rubrics.label,
        detectors_version=DETECTORS_VERSION, prompt_version=prompt_version() if judge is not None else None,
        judge=judge.settings if judge is not None else None, factors=list(ids),
        runs=[a.run_id for a in analyses],
        refused=[{"run_dir": str(path), "reason": why} for path, why in runs.refused],
        complete=not (judge is not None and judge.stopped), stopped=judge.stopped if judge is not None else "",
        max_cost_usd=max_cost_usd, usage=ledger.totals() if ledger is not None else UsageTotals(),
        reused_verdicts=reused)
    result = AnalysisResult(out=out, manifest=manifest, analyses=analyses)
    result.written += write_reports(analyses, out, chosen)
    if figures:
        from rexmle_agents.analysis.figures import write_figures
        from rexmle_agents.analysis.frames import analysis_frames

        result.figures = write_figures(analysis_frames(analyses), ids, {f.id: f.name for f in rubrics.factors},
                                       out / "figures")
    if view and runs.runs:
        from rexmle_agents.results.view import write_view

        payload = {a.run_id: view_payload(a, rubrics.factors) for a in analyses}
        result.written.append(write_view(runs, out / "view.html", capabilities=payload))
    result.written.append(write_json(out / MANIFEST_FILE, manifest.model_dump_json(indent=1)))
    return result


def _analyse_run(run: RunRecord, factors: Sequence[Factor], judge: Judge | None,
                 previous: dict[tuple[str, str], FactorVerdict], rubric_label: str,
                 progress: Progress | None) -> tuple[RunAnalysis, int]:
    path = trajectory(run)
    text = run_text(run, path)
    row = run_row(run)
    brief = task_brief(run.spec.task_id)
    ids = tuple(f.id for f in factors)
    verdicts = detect(text, brief.modality, rubric_label, ids)
    reused = 0
    if judge is not None:
        for factor in factors:
            earlier = previous.get((run.run_id, factor.id))
            if earlier is not None and earlier.judge == judge.settings and earlier.evidence_digest == text.digest:
                verdicts.append(earlier)
                reused += 1
                continue
            if progress is not None:
                progress(f"{run.run_id}: {factor.id}")
            verdicts.append(judge.judge(text, factor, brief))
    order = {f: i for i, f in enumerate(ids)}
    verdicts.sort(key=lambda v: (order.get(v.factor, len(order)), v.source != "judge"))
    analysis = RunAnalysis(
        run_id=run.run_id, run_dir=str(run.run_dir), group=run.group, task_id=run.spec.task_id,
        task_type=row.task_type, modality=brief.modality, agent=row.agent, model=row.model, config=row.config,
        seed=row.seed, data=row.data, state=run.status.state, evidence_digest=text.digest, nodes=len(text.nodes),
        verdicts=verdicts, failures=run_failures(run, path), problems=list(run.problems))
    return analysis, reused


def disagreement_rows(analyses: Sequence[RunAnalysis]) -> list[dict[str, Any]]:
    """Every run x factor where the judge and a detector both gave a verdict and they differ."""
    rows = []
    for analysis in analyses:
        for verdict in analysis.verdicts:
            if verdict.source != "detector" or not verdict.judged:
                continue
            judged = analysis.verdict(verdict.factor, "judge")
            if judged is None or not judged.judged or judged.demonstrated == verdict.demonstrated:
                continue
            rows.append({"run_id": analysis.run_id, "agent": analysis.agent, "model": analysis.model,
                         "task_id": analysis.task_id, "factor": verdict.factor, "judge": judged.status,
                         "detector": verdict.status, "judge_evidence": _quotes(judged),
                         "detector_evidence": _quotes(verdict), "judge_reason": judged.reason,
                         "detector_rule": verdict.reason})
    return rows


def _quotes(verdict: FactorVerdict) -> str:
    return " | ".join(f"node {q.node}: {q.quote}" + ("" if q.verified else f" [NOT VERIFIED: {q.problem}]")
                      for q in verdict.evidence)


def write_reports(analyses: Sequence[RunAnalysis], out: Path, factors: Sequence[Factor]) -> list[Path]:
    """The tidy tables, the aggregates and the disagreements, as CSV."""
    import pandas as pd

    from rexmle_agents.analysis.frames import analysis_frames, capability_table, failure_table

    frames = analysis_frames(analyses)
    written = frames.write(out)
    for name, frame in (("capabilities", capability_table(frames.verdicts)),
                        ("failures", failure_table(frames.runs, frames.steps)),
                        ("disagreements", pd.DataFrame(disagreement_rows(analyses),
                                                       columns=["run_id", "agent", "model", "task_id", "factor",
                                                                "judge", "detector", "judge_evidence",
                                                                "detector_evidence", "judge_reason",
                                                                "detector_rule"]))):
        path = out / f"{name}.csv"
        frame_to_csv(frame, path)  # agent text in a cell never runs as a spreadsheet formula
        written.append(path)
    return written


def view_payload(analysis: RunAnalysis, factors: Sequence[Factor]) -> dict[str, Any]:
    """What ``rexmle view``'s run page shows of an analysis: each factor's verdicts and the nodes it quotes, and per
    node the quotes taken from it."""
    evidence: dict[str, list[dict[str, Any]]] = defaultdict(list)
    rows = []
    judge_model = next((v.judge.model for v in analysis.verdicts if v.judge is not None), "no judge")
    for factor in factors:
        judged, detected = analysis.verdict(factor.id, "judge"), analysis.verdict(factor.id, "detector")
        if judged is None and detected is None:
            continue
        nodes: set[int] = set()
        for verdict in (v for v in (judged, detected) if v is not None):
            for quote in verdict.evidence:
                if quote.node is not None:
                    nodes.add(quote.node)
                evidence[str(quote.node)].append({"factor": factor.name, "source": verdict.source,
                                                  "quote": quote.quote, "verified": quote.verified,
                                                  "where": quote.where, "problem": quote.problem})
        rows.append({"factor": factor.id, "name": factor.name, "judge": judged.status if judged else None,
                     "detector": detected.status if detected else None, "nodes": sorted(nodes)})
    rubric = next((v.rubric_version for v in analysis.verdicts), "")
    return {"judge": judge_model, "rubric_version": rubric, "factors": rows, "evidence": dict(evidence)}

