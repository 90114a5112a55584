"""The held-out selection split (``rexmle_tasks.selection``): carving with a secret, the shuffled names, the agent
view's leak checks, the grading views and ``restrict_submission``, on real families (2-D, 3-D, grouped) and on the
framework's toy task."""

from __future__ import annotations

import csv
import hashlib
import hmac
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from rexmle_grade.errors import ConfigurationError, RexmleError, TaskDataMissingError, UserInputError
from rexmle_grade.evaluate import evaluate_submission
from rexmle_grade.grader import ANSWERS_CSV, TestManifest, read_answers
from rexmle_grade.report import ReportEntry
from rexmle_grade.schema import SUBMISSION_CSV
from rexmle_grade.targets import GradingTarget
from rexmle_tasks import base
from rexmle_tasks.base import PrepareContext, Task
from rexmle_tasks.check import answer_fingerprints, token_pattern
from rexmle_tasks.grading import resolve_grading_target
from rexmle_tasks.pipeline import PreparedInfo, build_prepared, prepare_task, task_dirs
from rexmle_tasks.registry import get_task
from rexmle_tasks.selection import (
    FIXED_MTIME,
    SELECTION_MARKER,
    SelectionSplit,
    check_selection,
    prepare_selection,
    publish_shuffled,
    restrict_submission,
    restrict_view,
    selection_groups,
    shuffled_names,
)
from rexmle_tasks.splits import Split, file_checksums

from .conftest import ToyFamily, ToyGrader
from .selection_guesses import guesses

#: (task, synthetic cases, k): a 2-D task with an official test set (fixed split), a 3-D one, one whose family
#: groups cases (TopCoW splits by patient). ldct-iqa's correlations need several distinct scores: k=4.
TASKS = [("ldct-iqa", 12, 4), ("isles22", 6, 2), ("topcow-track1-task1", 6, 2)]
TASK_IDS = [t for t, _, _ in TASKS]
SECRET = b"selection-secret-of-these-tests!"  # the harness draws one per run; pinned here to reuse the folders


@dataclass(frozen=True)
class Built:
    task: Task
    info: PreparedInfo
    ordinary: GradingTarget
    selection: SelectionSplit
    root: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Built]:
    """``built(task_id)``: the task prepared synthetically and its selection split, made once per module."""
    root = tmp_path_factory.mktemp("selection-data")
    cache: dict[str, Built] = {}

    def get(task_id: str) -> Built:
        if task_id not in cache:
            _, cases, k = next(t for t in TASKS if t[0] == task_id)
            task = get_task(task_id)
            info = prepare_task(task, task_dirs(task, root), synthetic=True, cases=cases)
            cache[task_id] = Built(task, info, resolve_grading_target(task_id, root),
                                   prepare_selection(task_id, k, root, secret=SECRET), root)
        return cache[task_id]

    return get


def _split_doc(public: Path) -> dict:
    return json.loads((public / "split_manifest.json").read_text())


def _grade(target: GradingTarget, submission: Path) -> ReportEntry:
    return evaluate_submission(target, submission)


def _assert_best(task: Task, entry: ReportEntry) -> None:
    assert entry.valid_submission, entry.problems
    for metric in task.grader.metrics:
        if metric.best is not None:
            assert entry.metrics[metric.name] == pytest.approx(metric.best, abs=1e-9), metric.name


# ---- real families ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_selection_cases_leave_training_and_join_the_test_inputs(built, task_id: str) -> None:
    b = built(task_id)
    s = b.selection
    ordinary_doc, agent_doc = _split_doc(b.ordinary.public_dir), _split_doc(s.agent_public)
    carved = {s.case_of(name) for name in s.selection_ids}
    assert len(carved) >= s.k
    assert carved <= set(ordinary_doc["train_ids"])  # carved from the agent's training data
    assert {s.case_of(name) for name in s.test_ids} == set(ordinary_doc["test_ids"])
    assert not carved & set(agent_doc["train_ids"])
    assert agent_doc["train_ids"] == sorted(set(ordinary_doc["train_ids"]) - carved)
    # the names shown are the ids an unshuffled view would show: they say nothing of which data is under them
    assert list(TestManifest.read(s.agent_public).ids) == sorted({*s.test_ids, *s.selection_ids}) == \
        sorted({*ordinary_doc["test_ids"], *carved})
    assert list(TestManifest.read(s.selection.public_dir).ids) == list(s.selection_ids)
    for target, ids in ((s.selection, s.selection_ids), (s.test, s.test_ids)):
        assert sorted(read_answers(target.private_dir, b.task.grader)) == sorted(ids)
    # the task's own leak checks on the agent view, plus the selection's: nothing of the K labels is reachable
    assert check_selection(s) == []
    seed = str(b.task.meta.split.seed)
    for path in s.agent_public.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".csv", ".md", ".txt"):
            assert seed not in path.read_text(errors="ignore"), path
    family = b.task.family()
    groups = {family.split_group(i) for i in carved}
    assert not groups & {family.split_group(i) for i in agent_doc["train_ids"]}


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_each_name_carries_its_cases_inputs_and_answers(built, task_id: str) -> None:
    """The data under a shown name is the data of the case behind it: the test inputs, byte for byte, and the answers
    (a real test case's as the ordinary task holds them)."""
    b = built(task_id)
    s = b.selection
    ordinary_answers = answer_fingerprints(b.task, b.ordinary.private_dir)
    shown_answers = answer_fingerprints(b.task, s.agent_private)
    for name in s.test_ids:
        assert shown_answers[name] == ordinary_answers[s.case_of(name)]
    pattern = token_pattern(s.cases)
    compared = 0
    for path in (s.agent_public / "test").rglob("*"):
        rel = path.relative_to(s.agent_public).as_posix()
        hit = pattern.search(rel) if path.is_file() else None
        if hit is not None and hit.group(0) in s.test_ids:  # a real test case: in the ordinary task's test inputs
            origin = b.ordinary.public_dir / (rel[:hit.start()] + s.case_of(hit.group(0)) + rel[hit.end():])
            assert path.read_bytes() == origin.read_bytes(), rel
            compared += 1
    assert compared >= len(s.test_ids)
    # every file and folder of the agent view has the same modification time
    assert {p.stat().st_mtime for p in s.agent_public.rglob("*")} == {FIXED_MTIME}


def carved_of(s: SelectionSplit) -> set[str]:
    return {s.case_of(name) for name in s.selection_ids}


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_gold_from_agent_private_is_valid_and_best_on_both_views(built, task_id: str, tmp_path: Path) -> None:
    b = built(task_id)
    s = b.selection
    gold = tmp_path / "gold"
    b.task.grader.write_gold_submission(s.agent_private, s.agent_public, gold)
    id_column = b.task.grader.schema.id_column
    for name, target, ids in (("select", s.selection, s.selection_ids), ("test", s.test, s.test_ids)):
        _assert_best(b.task, _grade(target, restrict_submission(gold, ids, tmp_path / name, id_column=id_column)))
    # the combined submission is not a submission for either view: it has rows of cases the view does not list
    assert not _grade(s.test, gold).valid_submission


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_restricted_sample_submission_grades_valid_on_both_views(built, task_id: str, tmp_path: Path) -> None:
    s = built(task_id).selection
    sample = s.agent_public / "sample_submission"
    for name, target, ids in (("select", s.selection, s.selection_ids), ("test", s.test, s.test_ids)):
        restricted = restrict_submission(sample, ids, tmp_path / name)
        entry = _grade(target, restricted)
        assert entry.valid_submission, entry.problems
        assert sorted(p.relative_to(restricted).as_posix() for p in restricted.rglob("*") if p.is_file()) == \
            sorted(p.relative_to(target.public_dir / "sample_submission").as_posix()
                   for p in (target.public_dir / "sample_submission").rglob("*") if p.is_file())


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_test_view_grades_like_the_ordinary_task(built, task_id: str, tmp_path: Path) -> None:
    b = built(task_id)
    s = b.selection
    assert s.test_ids == TestManifest.read(s.test.public_dir).ids
    assert sorted(s.case_of(n) for n in s.test_ids) == list(TestManifest.read(b.ordinary.public_dir).ids)
    grader = b.task.grader
    grader.write_gold_submission(b.ordinary.private_dir, b.ordinary.public_dir, tmp_path / "ordinary")
    grader.write_gold_submission(s.agent_private, s.agent_public, tmp_path / "combined")
    restricted = restrict_submission(tmp_path / "combined", s.test_ids, tmp_path / "restricted",
                                     id_column=grader.schema.id_column)
    ordinary, view = _grade(b.ordinary, tmp_path / "ordinary"), _grade(s.test, restricted)
    assert ordinary.valid_submission and view.valid_submission
    assert view.metrics.keys() == ordinary.metrics.keys()
    for name, value in ordinary.metrics.items():
        assert view.metrics[name] == pytest.approx(value, abs=1e-9, nan_ok=True), name
    assert (view.score, view.gold_medal) == (ordinary.score, ordinary.gold_medal)
    assert (s.test.leaderboard, s.selection.leaderboard) == (b.ordinary.leaderboard, b.ordinary.leaderboard)


def test_selection_is_deterministic_for_a_secret_and_cached(built) -> None:
    b = built("isles22")
    s = b.selection
    marker = s.root / SELECTION_MARKER
    stamp = marker.stat().st_mtime_ns
    again = prepare_selection("isles22", s.k, b.root, secret=SECRET)
    assert again == s and marker.stat().st_mtime_ns == stamp  # reused, not rebuilt
    other = prepare_selection("isles22", s.k + 1, b.root, secret=SECRET)
    assert other.root != s.root and other.k == s.k + 1 and len(other.selection_ids) == s.k + 1
    forced = prepare_selection("isles22", s.k, b.root, secret=SECRET, force=True)
    assert (forced.selection_ids, forced.cases) == (s.selection_ids, s.cases) and marker.stat().st_mtime_ns != stamp
    # no secret: a new one, so another folder and (almost always: 6 cases give ~1 in 144 repeats) another split
    fresh = [prepare_selection("isles22", s.k, b.root) for _ in range(3)]
    assert s.root not in {f.root for f in fresh} and len({f.root for f in fresh}) == 3
    assert any(f.cases != s.cases for f in fresh)
    assert not list(s.root.parent.glob("*.partial"))


def test_concurrent_builds_wait_for_each_other(built) -> None:
    """Runs of a batch start together: each process forces a rebuild of the same split, none sees a half-built one."""
    b = built("isles22")
    code = ("import json, sys; from pathlib import Path; from rexmle_tasks.selection import prepare_selection; "
            f"print(json.dumps(prepare_selection('isles22', 3, Path(sys.argv[1]), secret={SECRET!r}, "
            "force=True).selection_ids))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(b.root)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    assert len({out for out, _ in outputs}) == 1
    s = prepare_selection("isles22", 3, b.root, secret=SECRET)
    assert list(s.selection_ids) == json.loads(outputs[0][0]) and check_selection(s) == []
    assert not list(s.root.parent.glob("*.partial"))


def test_k_must_leave_a_training_group(built, tmp_path: Path) -> None:
    b = built("isles22")
    n_groups = len(_split_doc(b.ordinary.public_dir)["train_ids"])  # isles22: one case per group
    with pytest.raises(UserInputError, match=f"{n_groups} training group") as info:
        prepare_selection("isles22", n_groups, b.root)
    assert f"between 1 and {n_groups - 1}" in str(info.value)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(UserInputError, match=">= 1"):
            prepare_selection("isles22", bad, b.root)  # type: ignore[arg-type]
    assert not list((b.root / "isles22").glob(f"selection-{n_groups}-*"))


def test_unprepared_task_names_the_prepare_command(tmp_path: Path) -> None:
    with pytest.raises(TaskDataMissingError) as info:
        prepare_selection("ldct-iqa", 2, tmp_path)
    assert "rexmle prepare ldct-iqa" in str(info.value)


# ---- toy task: the hash rule, groups, staleness, crash safety -----------------------------------------------------


class PairedToyFamily(ToyFamily):
    """The toy family with cases grouped in pairs (case_001+case_002, ...), like two scans of one patient."""

    def split_group(self, case_id: str) -> str:
        return f"pair{(int(case_id.rsplit('_', 1)[1]) + 1) // 2}"


def test_selection_follows_the_documented_keyed_hash_rule(toy, tmp_path: Path) -> None:
    prepare_task(toy.task, task_dirs(toy.task, tmp_path), synthetic=True)
    s = prepare_selection("toy-task", 3, tmp_path, secret=SECRET)
    train = _split_doc(task_dirs(toy.task, tmp_path).public)["train_ids"]
    expected = sorted(train, key=lambda i: hmac.new(SECRET, f"group:3\0{i}".encode(), hashlib.sha256).hexdigest())[:3]
    assert sorted(carved_of(s)) == sorted(expected) == sorted(selection_groups(train, secret=SECRET, k=3))
    names = shuffled_names([*s.test_ids, *s.selection_ids], SECRET)
    assert s.cases == {shown: case for case, shown in names.items()}


def test_groups_never_straddle_training_and_selection(toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(base._FAMILIES, ToyFamily.name, PairedToyFamily)
    prepare_task(toy.task, task_dirs(toy.task, tmp_path), synthetic=True)  # 10 cases = 5 pairs: 1 test, 4 train
    s = prepare_selection("toy-task", 2, tmp_path)
    family = PairedToyFamily(toy.task.meta)
    assert len(s.selection_ids) == 4 and len({family.split_group(i) for i in carved_of(s)}) == 2
    train = _split_doc(s.agent_public)["train_ids"]
    assert len(train) == 4 and not {family.split_group(i) for i in train} & {family.split_group(i)
                                                                             for i in carved_of(s)}
    with pytest.raises(UserInputError, match="4 training group"):
        prepare_selection("toy-task", 4, tmp_path)
    assert check_selection(s) == []


def test_selection_is_rebuilt_when_the_task_is_prepared_again(toy, tmp_path: Path) -> None:
    dirs = task_dirs(toy.task, tmp_path)
    prepare_task(toy.task, dirs, synthetic=True, cases=10)
    first = prepare_selection("toy-task", 2, tmp_path, secret=SECRET)
    prepare_task(toy.task, dirs, synthetic=True, cases=12, force=True)
    second = prepare_selection("toy-task", 2, tmp_path, secret=SECRET)
    assert sorted(second.case_of(n) for n in second.test_ids) == list(TestManifest.read(dirs.public).ids)
    assert len(_split_doc(second.agent_public)["train_ids"]) + len(second.selection_ids) + len(second.test_ids) == 12
    assert first.root == second.root


def test_raw_replaced_since_preparation_is_refused(toy, tmp_path: Path) -> None:
    dirs = task_dirs(toy.task, tmp_path)
    prepare_task(toy.task, dirs, synthetic=True)
    (dirs.raw / "toy_data" / "labels" / "case_001.txt").unlink()  # one case less: another split
    with pytest.raises(TaskDataMissingError, match="raw/ was replaced") as info:
        prepare_selection("toy-task", 2, tmp_path)
    assert "rexmle prepare toy-task --force --synthetic" in str(info.value)


def test_failed_build_leaves_the_previous_selection(toy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare_task(toy.task, task_dirs(toy.task, tmp_path), synthetic=True)
    before = prepare_selection("toy-task", 2, tmp_path, secret=SECRET)
    sums = file_checksums(before.root)

    def broken(self, ctx: PrepareContext) -> TestManifest:
        (ctx.public / "half-written.txt").write_text("x")
        raise RexmleError("the raw data is broken")

    monkeypatch.setattr(ToyFamily, "prepare", broken)
    with pytest.raises(RexmleError, match="broken"):
        prepare_selection("toy-task", 2, tmp_path, secret=SECRET, force=True)
    assert file_checksums(before.root) == sums
    assert not list(before.root.parent.glob("*.partial"))


def test_check_finds_a_selection_label_in_the_agent_view(toy, tmp_path: Path) -> None:
    prepare_task(toy.task, task_dirs(toy.task, tmp_path), synthetic=True)
    s = prepare_selection("toy-task", 2, tmp_path)
    assert check_selection(s) == []
    case = s.selection_ids[0]
    label = f"labels/{s.case_of(case)}.txt"  # the private files keep the names of their cases
    (s.agent_public / "train" / "extra").mkdir()
    (s.agent_public / "train" / "extra" / f"{case}.txt").write_bytes((s.selection.private_dir / label).read_bytes())
    (s.agent_public / SELECTION_MARKER).write_text("{}")
    problems = "\n".join(check_selection(s))
    assert f"train/extra/{case}.txt has the same bytes as private/{label}" in problems
    assert f"agent/public/{SELECTION_MARKER} is a grading file" in problems


def test_answers_shared_by_cases_cannot_be_restricted(toy, tmp_path: Path) -> None:
    public, private = tmp_path / "public", tmp_path / "private"
    public.mkdir()
    (private / "labels").mkdir(parents=True)
    TestManifest(ids=("a", "b")).write(public)
    ToyGrader().write_sample_submission(public, public / "sample_submission")
    (private / "labels" / "all.txt").write_text("1\n")
    (private / ANSWERS_CSV).write_text("case_id,label_path\na,labels/all.txt\nb,labels/all.txt\n")
    with pytest.raises(ConfigurationError, match="one file"):
        restrict_view(ToyGrader(), public, private, ["a"], tmp_path / "v" / "public", tmp_path / "v" / "private")


# ---- restrict_submission --------------------------------------------------------------------------------------


def _rows(submission: Path) -> list[list[str]]:
    with (submission / SUBMISSION_CSV).open(newline="") as fh:
        return list(csv.reader(fh))


def test_restricted_submission_keeps_only_the_named_rows_and_files(built, tmp_path: Path) -> None:
    b = built("isles22")
    s = b.selection
    gold = tmp_path / "gold"
    b.task.grader.write_gold_submission(s.agent_private, s.agent_public, gold)
    (gold / "notes.txt").write_text("not named by any row")
    out = restrict_submission(gold, s.selection_ids, tmp_path / "out")
    rows = _rows(out)
    assert rows[0] == _rows(gold)[0] and [r[0] for r in rows[1:]] == list(s.selection_ids)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted([SUBMISSION_CSV, *(r[1] for r in rows[1:])])


def test_restricting_never_repairs_an_invalid_submission(built, tmp_path: Path) -> None:
    b = built("isles22")
    s = b.selection
    gold = tmp_path / "gold"
    b.task.grader.write_gold_submission(s.agent_private, s.agent_public, gold)
    rows = _rows(gold)
    dropped, moved = s.selection_ids[0], s.test_ids[0]
    # a missing selection row stays missing; a path leading out of the folder stays out of it
    moved_row = next(r for r in rows if r[0] == moved)
    outside = tmp_path / "outside.nii.gz"
    (gold / moved_row[1]).rename(outside)
    with (gold / SUBMISSION_CSV).open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerows([row if row[0] != moved else [moved, f"../{outside.name}"]
                          for row in rows if row[0] != dropped])
    entry = _grade(s.selection, restrict_submission(gold, s.selection_ids, tmp_path / "select"))
    assert not entry.valid_submission and any(dropped in p for p in entry.problems)
    entry = _grade(s.test, restrict_submission(gold, s.test_ids, tmp_path / "test"))
    assert not entry.valid_submission and any(".." in p for p in entry.problems)
    # a missing folder stays missing, unreadable text is copied unchanged
    assert _grade(s.test, restrict_submission(tmp_path / "none", s.test_ids, tmp_path / "m")).status == "missing"
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / SUBMISSION_CSV).write_bytes(b"\xff\xfe\x00garbage")
    out = restrict_submission(binary, s.test_ids, tmp_path / "b")
    assert (out / SUBMISSION_CSV).read_bytes() == b"\xff\xfe\x00garbage"
    assert not _grade(s.test, out).valid_submission
    with pytest.raises(UserInputError, match="not an empty folder"):
        restrict_submission(gold, s.test_ids, tmp_path / "b")


def test_id_column_is_found_by_name(tmp_path: Path) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / SUBMISSION_CSV).write_text("score,case_id\n1.0,a\n2.0,b\n3.0\n")
    out = restrict_submission(sub, ["b"], tmp_path / "out", id_column="case_id")
    assert _rows(out) == [["score", "case_id"], ["2.0", "b"], ["3.0"]]  # a malformed row is kept: still invalid
    first = restrict_submission(sub, ["2.0"], tmp_path / "first")  # default: the header's first column
    assert _rows(first)[1] == ["2.0", "b"]


# ---- nothing public singles out the selection cases ---------------------------------------------------------------
#: ldct-iqa with 60 cases: 20 official test cases + 10 carved = 30 test inputs; a blind guess of 10 hits 3.3 on average
GUESS_CASES, GUESS_K, GUESS_SECRETS = 60, 10, 6


def test_no_public_trace_singles_out_the_selection_cases(tmp_path: Path) -> None:
    """Every guess an agent can make from its public folder and the installed package (:mod:`.selection_guesses`)
    finds the selection cases no better than chance over several run secrets, while the same guesses on a view
    without shuffled names find all of them."""
    task = get_task("ldct-iqa")
    prepare_task(task, task_dirs(task, tmp_path), synthetic=True, cases=GUESS_CASES)
    overlaps: dict[str, list[int]] = {}
    for _ in range(GUESS_SECRETS):
        s = prepare_selection("ldct-iqa", GUESS_K, tmp_path)  # a fresh secret, as every run draws
        assert check_selection(s) == []
        truth = set(s.selection_ids)
        for heuristic, guess in guesses(s.agent_public, "ldct-iqa", GUESS_K).items():
            assert len(set(guess)) == GUESS_K, heuristic
            overlaps.setdefault(heuristic, []).append(len(truth & set(guess)))
    n_inputs = len(s.selection_ids) + len(s.test_ids)
    chance = GUESS_K * GUESS_K / n_inputs
    for heuristic, hits in overlaps.items():  # the mean of 6 blind guesses has a standard error of 0.5
        assert sum(hits) / len(hits) <= chance + 2.5, (heuristic, hits, chance)
    # the control: the same view published under the cases' own names gives the selection away
    carved = carved_of(s)
    agent_split = Split(train=tuple(_split_doc(s.agent_public)["train_ids"]),
                        test=tuple(sorted(s.case_of(n) for n in s.cases)))
    staging, plain = tmp_path / "staging", tmp_path / "plain"
    for folder in (staging / "public", staging / "private", plain / "public", plain / "private"):
        folder.mkdir(parents=True)
    dirs = task_dirs(task, tmp_path)
    build_prepared(task, task.family(), agent_split, staging / "public", staging / "private", raw=dirs.raw)
    publish_shuffled(task, agent_split, {i: i for i in agent_split.test}, staging / "public", staging / "private",
                     plain / "public", plain / "private")
    found = guesses(plain / "public", "ldct-iqa", GUESS_K)
    assert max(len(carved & set(g)) for g in found.values()) == GUESS_K
