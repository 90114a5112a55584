"""Agreement between the judge, the detectors and human raters: Cohen's kappa per factor and overall.

Human labels are a CSV file (one or several; a spreadsheet saves it), one row per rater x run x factor:

```csv
rater,run,factor,demonstrated,node,quote,note
ana,isles22.aide.s0.3f2a9c1b7e,post_processing,yes,4,"labels, n = ndimage.label(mask)",keeps the largest lesion
```

``demonstrated`` is yes/no (true/false, 1/0); ``node`` and ``quote`` are the evidence the rater relied on (optional
for "no"); ``run`` is a run id or a unique start of one. The raters ``judge`` and ``detectors`` are the analysis's
own; a detector rates only the factors it covers (and only where it applies), the judge only the factors it gave a
verdict on (errors and unjudged factors are left out). Every pair of raters is compared on the items both rated.

Kappa is undefined when the expected agreement is 1 (both raters gave one and the same answer throughout); the
row then says so and gives the raw agreement. The 95% interval is a bootstrap over runs (items of one run are drawn
together), 1,000 replicates, fixed seed; it is left out when fewer than half the replicates define kappa.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from rexmle_agents.analysis.records import AnalysisManifest, HumanLabel, RunAnalysis
from rexmle_grade.csvsafe import SafeDictWriter
from rexmle_grade.errors import UnknownNameError, UserInputError

JUDGE, DETECTORS = "judge", "detectors"
REQUIRED_COLUMNS = ("rater", "run", "factor", "demonstrated")
OPTIONAL_COLUMNS = ("node", "quote", "note")
_YES, _NO = {"yes", "y", "true", "1"}, {"no", "n", "false", "0"}
Item = tuple[str, str]  # (run id, factor)


class KappaRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    factor: str  # a factor id, or "all" (every factor pooled)
    rater_a: str
    rater_b: str
    n: int
    agreement: float | None
    kappa: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    prevalence_a: float | None = None  # share of items rater a called demonstrated
    prevalence_b: float | None = None
    note: str = ""


class Disagreement(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    run: str
    factor: str
    rater_a: str
    rater_b: str
    a: bool
    b: bool
    evidence_a: str
    evidence_b: str


class AgreementReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    raters: list[str]
    items: dict[str, int]  # rater -> items rated
    rows: list[KappaRow]
    disagreements: list[Disagreement]
    unmatched: list[str]  # labels whose run is not in the analysis
    rubric_version: str | None
    judge_model: str | None
    prompt_version: str | None


def _parse_bool(value: str, where: str) -> bool:
    text = value.strip().lower()
    if text in _YES:
        return True
    if text in _NO:
        return False
    raise UserInputError(f"{where}: demonstrated must be yes or no, got {value!r}",
                         hint="use yes/no, true/false or 1/0")


def read_labels(paths: Sequence[Path], factor_ids: Sequence[str]) -> list[HumanLabel]:
    """Every label of the CSV files at ``paths``, checked: columns, factor ids, yes/no, one label per rater x run x
    factor, and no rater named like the analysis's own (judge, detectors)."""
    labels: list[HumanLabel] = []
    seen: dict[tuple[str, str, str], str] = {}
    for path in paths:
        try:
            handle = path.open(newline="", encoding="utf-8-sig")
        except OSError as exc:
            raise UserInputError(f"cannot read the label file {path}: {exc.strerror}",
                                 hint="pass a CSV file with columns " + ",".join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)) \
                from None
        with handle:
            reader = csv.DictReader(handle)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise UserInputError(f"{path} lacks the column(s) {', '.join(missing)}",
                                     hint="the header is " + ",".join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS))
            for number, row in enumerate(reader, start=2):
                where = f"{path}:{number}"
                rater = (row.get("rater") or "").strip()
                if rater in (JUDGE, DETECTORS) or not rater:
                    raise UserInputError(f"{where}: rater {rater!r} is not allowed",
                                         hint=f"name human raters other than {JUDGE!r} and {DETECTORS!r}")
                factor = (row.get("factor") or "").strip()
                if factor not in factor_ids:
                    raise UnknownNameError("factor", factor, factor_ids)
                node_text = (row.get("node") or "").strip()
                if node_text and not node_text.lstrip("-").isdigit():
                    raise UserInputError(f"{where}: node must be a node number, got {node_text!r}")
                try:
                    label = HumanLabel(rater=rater, run=(row.get("run") or "").strip(), factor=factor,
                                       demonstrated=_parse_bool(row.get("demonstrated") or "", where),
                                       node=int(node_text) if node_text else None, quote=row.get("quote") or "",
                                       note=row.get("note") or "")
                except ValidationError as exc:
                    raise UserInputError(f"{where}: {exc.errors()[0]['msg']}") from None
                key = (label.rater, label.run, label.factor)
                if key in seen:
                    raise UserInputError(f"{where}: {label.rater} labels {label.factor} of {label.run} twice "
                                         f"(also at {seen[key]})", hint="keep one label per rater, run and factor")
                seen[key] = where
                labels.append(label)
    return labels


def rater_verdicts(analyses: Sequence[RunAnalysis], labels: Sequence[HumanLabel]) \
        -> tuple[dict[str, dict[Item, bool]], dict[str, dict[Item, str]], list[str]]:
    """Each rater's verdicts by (run, factor), the evidence behind each, and the labels naming no analysed run."""
    verdicts: dict[str, dict[Item, bool]] = defaultdict(dict)
    evidence: dict[str, dict[Item, str]] = defaultdict(dict)
    for analysis in analyses:
        for v in analysis.verdicts:
            if not v.judged:
                continue
            rater = JUDGE if v.source == "judge" else DETECTORS
            verdicts[rater][(analysis.run_id, v.factor)] = v.demonstrated
            evidence[rater][(analysis.run_id, v.factor)] = "; ".join(
                f"node {q.node}: {q.quote}" + ("" if q.verified else " [not verified]") for q in v.evidence)
    ids = [a.run_id for a in analyses]
    unmatched = []
    for label in labels:
        matches = [label.run] if label.run in ids else [r for r in ids if label.run and r.startswith(label.run)]
        if len(matches) != 1:
            unmatched.append(f"{label.rater}: {label.run or '(no run)'} ({label.factor})")
            continue
        run = matches[0]
        verdicts[label.rater][(run, label.factor)] = label.demonstrated
        evidence[label.rater][(run, label.factor)] = (f"node {label.node}: {label.quote}" if label.quote else "") + \
            (f" ({label.note})" if label.note else "")
    return dict(verdicts), dict(evidence), unmatched


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """Cohen's kappa of two raters' yes/no answers on the same items; None when undefined (no items, or expected
    agreement 1)."""
    n = len(a)
    if n == 0 or n != len(b):
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pa, pb = sum(a) / n, sum(b) / n
    expected = pa * pb + (1 - pa) * (1 - pb)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1 - expected)


def _bootstrap(pairs_by_run: Mapping[str, list[tuple[bool, bool]]], replicates: int, seed: int) \
        -> tuple[float | None, float | None]:
    import numpy as np

    runs = list(pairs_by_run)
    if len(runs) < 2 or replicates <= 0:
        return None, None
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(replicates):
        drawn = [pair for i in rng.integers(0, len(runs), len(runs)) for pair in pairs_by_run[runs[i]]]
        kappa = cohen_kappa([x for x, _ in drawn], [y for _, y in drawn])
        if kappa is not None:
            values.append(kappa)
    if len(values) < replicates / 2:
        return None, None
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def _row(factor: str, a: str, b: str, items: list[tuple[Item, bool, bool]], replicates: int, seed: int) -> KappaRow:
    if not items:
        return KappaRow(factor=factor, rater_a=a, rater_b=b, n=0, agreement=None, kappa=None,
                        note="no item rated by both")
    xs, ys = [x for _, x, _ in items], [y for _, _, y in items]
    kappa = cohen_kappa(xs, ys)
    by_run: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for (run, _factor), x, y in items:
        by_run[run].append((x, y))
    low, high = _bootstrap(by_run, replicates, seed) if kappa is not None else (None, None)
    note = ""
    if kappa is None:
        note = "kappa undefined: both raters gave one and the same answer on every item"
    elif len(items) < 10:
        note = "fewer than 10 items: too few to trust"
    return KappaRow(factor=factor, rater_a=a, rater_b=b, n=len(items),
                    agreement=sum(x == y for x, y in zip(xs, ys, strict=True)) / len(items), kappa=kappa,
                    ci_low=low, ci_high=high, prevalence_a=sum(xs) / len(xs), prevalence_b=sum(ys) / len(ys),
                    note=note)


def agreement_report(analyses: Sequence[RunAnalysis], labels: Sequence[HumanLabel], factor_ids: Sequence[str],
                     manifest: AnalysisManifest | None = None, *, replicates: int = 1000,
                     seed: int = 0) -> AgreementReport:
    """Kappa per factor and overall for every pair of raters (judge, detectors, each human)."""
    verdicts, evidence, unmatched = rater_verdicts(analyses, labels)
    humans = sorted(r for r in verdicts if r not in (JUDGE, DETECTORS))
    raters = [r for r in (JUDGE, DETECTORS) if r in verdicts] + humans
    rows: list[KappaRow] = []
    disagreements: list[Disagreement] = []
    for a, b in itertools.combinations(raters, 2):
        common = sorted(set(verdicts[a]) & set(verdicts[b]), key=lambda item: (factor_ids.index(item[1])
                                                                                if item[1] in factor_ids else 99,
                                                                                item[0]))
        items = [(item, verdicts[a][item], verdicts[b][item]) for item in common]
        for factor in factor_ids:
            rows.append(_row(factor, a, b, [i for i in items if i[0][1] == factor], replicates, seed))
        rows.append(_row("all", a, b, items, replicates, seed))
        disagreements += [Disagreement(run=item[0], factor=item[1], rater_a=a, rater_b=b, a=x, b=y,
                                       evidence_a=evidence[a].get(item, ""), evidence_b=evidence[b].get(item, ""))
                          for item, x, y in items if x != y]
    judge = manifest.judge if manifest is not None else None
    return AgreementReport(raters=raters, items={r: len(v) for r, v in verdicts.items()}, rows=rows,
                           disagreements=disagreements, unmatched=unmatched,
                           rubric_version=manifest.rubric_version if manifest is not None else None,
                           judge_model=judge.model if judge is not None else None,
                           prompt_version=judge.prompt_version if judge is not None else None)


def to_csv(report: AgreementReport) -> str:
    """The kappa rows as CSV text (one row per factor x pair of raters, and "all")."""
    buffer = io.StringIO()
    writer = SafeDictWriter(buffer, fieldnames=list(KappaRow.model_fields))
    writer.writeheader()
    for row in report.rows:
        writer.writerow(row.model_dump())
    return buffer.getvalue()
