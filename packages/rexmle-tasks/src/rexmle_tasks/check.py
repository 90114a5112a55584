"""Leak checks of a prepared task: nothing in ``public/`` may reveal the test labels.

:func:`check_task` lists every problem it finds (an empty list means clean):

* **links**: ``public/`` holds no symbolic links. One into ``private/`` or out of ``public/`` is a way to the
  labels; one that stays inside is refused too, because copying ``public/`` into an agent's workspace breaks it.
* **copies of private files**: no file in ``public/`` has the bytes of a file in ``private/``. A public file that
  names a training case is that case's own data (small label files of different cases can be identical, e.g. the
  same vessel variant), and the sample submission is made from public information only; both are exempt.
* **test ids**: test case ids appear only in the test inputs (any path with a part whose name starts with
  ``test``, or nnU-Net's ``imagesTs``), ``test_manifest.json``, ``split_manifest.json``, ``description.md`` and
  ``sample_submission/``. Elsewhere they may not appear in a path, nor in the text of an index file (csv, tsv,
  json, txt, yml, yaml).
* **split seed**: the split seed is not in the public manifests or the description (a seed of fewer than four
  digits is too common a number to search for; a JSON key mentioning ``seed`` always counts).
* **task files**: no public file is named like a leaderboard, the answers or the task metadata, or has the bytes
  of the task's ``leaderboard.csv`` / ``task.yaml`` or of the grader's source.
* **manifests**: the split manifests' checksums match the files, their digest matches the ids and
  ``prepared.json``, train and test ids are disjoint, ``test_manifest.json`` lists exactly the split's test ids (in
  order), and ``private/answers.csv`` has exactly one row per test id.
* **regeneration** (synthetic data; :func:`check_regeneration`): the installed generators, run with what an agent
  can know (each seed of :data:`REGENERATE_SEEDS` and the recorded one, the recorded cases and difficulty; the seed
  alone as the generator seed, as before synthetic secrets, or mixed with an empty secret), do not reproduce the
  private test labels: a problem when an attempt reproduces a case's answer together with its test inputs (images
  never match by chance), or the answers of every test case when there are :data:`ALL_LABELS_MIN_CASES` or more
  (coarse labels, such as scores in steps of 0.2, match between unrelated cases often, but not ten in a row).
"""

from __future__ import annotations

import csv
import hashlib
import inspect
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from rexmle_grade.grader import ANSWERS_CSV, TEST_MANIFEST, TestManifest, read_answers
from rexmle_grade.settings import TaskDirs
from rexmle_grade.validation import summarise
from rexmle_tasks.base import Task
from rexmle_tasks.pipeline import (
    DESCRIPTION,
    SAMPLE_SUBMISSION,
    SPLIT_MANIFEST,
    PreparedInfo,
    build_prepared,
    generator_seed,
    require_prepared,
)
from rexmle_tasks.splits import Split, file_checksums, make_split, sha256_file

INDEX_SUFFIXES = (".csv", ".tsv", ".json", ".txt", ".yml", ".yaml")
MAX_INDEX_BYTES = 16 * 1024 * 1024  # larger text files are data (e.g. polygons), not case lists
_ID_FILES = (TEST_MANIFEST, SPLIT_MANIFEST, DESCRIPTION)
_GRADING_FILE_NAMES = frozenset({ANSWERS_CSV, "task.yaml", "prepared.json"})
#: the seeds :func:`check_regeneration` tries besides the recorded one (an agent's first guesses: the default and
#: the next ones)
REGENERATE_SEEDS = (0, 1, 2)
#: from this many test cases on, all labels matching is a regeneration even without the inputs (coarse labels, e.g.
#: scores in steps of 0.2, match between unrelated cases often, but not ten in a row)
ALL_LABELS_MIN_CASES = 10


def check_task(task: Task, dirs: TaskDirs, *, regenerate: bool = True) -> list[str]:
    """Every leak or inconsistency found in ``task``'s prepared folders (see module docstring). ``regenerate=False``
    leaves out :func:`check_regeneration` (views of an already checked preparation)."""
    info = require_prepared(task, dirs)
    split_doc, problems = _read_split_manifest(dirs.public)
    if split_doc is None:
        return problems
    split = Split(train=tuple(split_doc.get("train_ids", ())), test=tuple(split_doc.get("test_ids", ())))
    public_sums = file_checksums(dirs.public)
    private_sums = file_checksums(dirs.private)
    problems += summarise(check_links(dirs.public, dirs.private))
    problems += summarise(check_private_copies(public_sums, private_sums, split.train))
    problems += summarise(check_test_ids(dirs.public, split.test))
    problems += check_seed(dirs.public, task.meta.split.seed)
    problems += check_task_files(task, public_sums)
    problems += check_known_issues(task, dirs.public)
    problems += _check_manifests(task, dirs, split, split_doc, info.split_digest, public_sums, private_sums)
    if regenerate:
        problems += check_regeneration(task, dirs, info, split)
    return problems


def check_regeneration(task: Task, dirs: TaskDirs, info: PreparedInfo, split: Split,
                       seeds: Sequence[int] = REGENERATE_SEEDS) -> list[str]:
    """Regenerate a synthetic task from public information and the installed code (see module docstring)."""
    if not info.synthetic or info.cases is None:
        return []
    family = task.family()
    actual = answer_fingerprints(task, dirs.private)
    inputs = input_fingerprints(dirs.public, actual)
    extra = {"difficulty": info.difficulty} if info.difficulty not in (None, "easy") else {}
    problems = []
    for seed in sorted({*seeds, *([] if info.seed is None else [info.seed])}):
        for guess, generator in (("the seed alone", seed), ("an empty secret", generator_seed(b"", seed))):
            with tempfile.TemporaryDirectory(prefix="rexmle-regenerate-") as tmp:
                raw, public, private = Path(tmp, "raw"), Path(tmp, "public"), Path(tmp, "private")
                (raw / "downloads").mkdir(parents=True)
                family.write_synthetic_download(raw / "downloads", cases=info.cases, seed=generator, **extra)
                family.extract(raw / "downloads", raw)
                public.mkdir()
                private.mkdir()
                # split as prepare_task splits: its test ids are the ones whose answers a forger would have
                build_prepared(task, family, family.fixed_split(raw) or make_split(
                    family.case_ids(raw), seed=task.meta.split.seed, test_fraction=task.meta.split.test_fraction,
                    group_of=family.split_group), public, private, raw=raw)
                again = answer_fingerprints(task, private)
                inputs_again = input_fingerprints(public, again)
            same = sorted(i for i in split.test if i in again and again[i] == actual.get(i))
            with_inputs = [i for i in same if inputs.get(i) and inputs_again.get(i) == inputs[i]]
            if with_inputs or len(same) == len(split.test) >= ALL_LABELS_MIN_CASES:
                problems.append(
                    f"regenerating the synthetic data with seed {seed} ({guess} as the generator seed) reproduces "
                    f"the private labels of {len(same)} of {len(split.test)} test case(s)"
                    f"{f' (and the inputs of {len(with_inputs)})' if with_inputs else ''}; prepare it again with "
                    f"`rexmle prepare {task.id} --synthetic --force` (the mirror then gets a secret)")
    return problems


def input_fingerprints(public: Path, cases: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """{test id: sha256 of every test input file that names it}: images do not match by chance, so identical
    inputs with identical labels are a regeneration even on a handful of cases."""
    pattern = token_pattern(cases)
    found: dict[str, list[str]] = {}
    if pattern is None:
        return {}
    for path in sorted(public.rglob("*")):
        rel = path.relative_to(public).as_posix()
        if not path.is_file() or rel in _ID_FILES or _in_sample_submission(rel) or not may_name_test_ids(rel):
            continue
        hit = pattern.search(rel)
        if hit:
            found.setdefault(hit.group(0), []).append(sha256_file(path))
    return {case: tuple(sums) for case, sums in found.items()}


def answer_fingerprints(task: Task, private: Path) -> dict[str, tuple[str, ...]]:
    """{test id: its answer columns}, a column naming a file under ``private/`` standing for that file's sha256."""
    root = private.resolve()
    fingerprints = {}
    for case_id, row in read_answers(private, task.grader).items():
        values = []
        for column in task.grader.answer_columns:
            value = row.get(column) or ""
            path = (private / value).resolve() if value else None
            if path is not None and path.is_relative_to(root) and path.is_file():
                value = "sha256:" + sha256_file(path)
            values.append(value)
        fingerprints[case_id] = tuple(values)
    return fingerprints


# ---- the individual checks ----------------------------------------------------------------------------------
def check_links(public: Path, private: Path) -> list[str]:
    problems = []
    public_root, private_root = public.resolve(), private.resolve()
    for folder, dirnames, filenames in os.walk(public):
        for name in sorted(dirnames + filenames):
            path = Path(folder, name)
            if not path.is_symlink():
                continue
            target = path.resolve()
            where = ("into private/" if target.is_relative_to(private_root)
                     else "out of public/" if not target.is_relative_to(public_root) else "inside public/")
            rel = path.relative_to(public).as_posix()
            problems.append(f"public/{rel} is a symbolic link {where} ({os.readlink(path)}); public/ must hold "
                            "real files")
    return problems


def check_private_copies(public_sums: Mapping[str, str], private_sums: Mapping[str, str],
                         train_ids: Iterable[str]) -> list[str]:
    by_hash: dict[str, list[str]] = {}
    for rel, digest in private_sums.items():
        by_hash.setdefault(digest, []).append(rel)
    empty = hashlib.sha256(b"").hexdigest()
    names_train_case = token_pattern(train_ids)
    problems = []
    for rel, digest in public_sums.items():
        if digest == empty or digest not in by_hash or _in_sample_submission(rel):
            continue
        if names_train_case is not None and names_train_case.search(rel):
            continue
        problems.append(f"public/{rel} has the same bytes as private/{by_hash[digest][0]}")
    return problems


def check_test_ids(public: Path, test_ids: Iterable[str]) -> list[str]:
    pattern = token_pattern(test_ids)
    if pattern is None:
        return []
    problems = []
    for path in sorted(public.rglob("*")):
        rel = path.relative_to(public).as_posix()
        if not path.is_file() or may_name_test_ids(rel):
            continue
        hit = pattern.search(rel)
        if hit:
            problems.append(f"public/{rel} is not a test input but names test case {hit.group(0)!r}")
            continue
        mentioned = _ids_in_index_file(path, pattern)
        if mentioned:
            problems.append(f"public/{rel} mentions test case(s) {', '.join(repr(i) for i in mentioned[:5])}"
                            f"{' ...' if len(mentioned) > 5 else ''}")
    return problems


def check_seed(public: Path, seed: int) -> list[str]:
    text_pattern = re.compile(rf"(?<![0-9.]){seed}(?![0-9])") if len(str(abs(seed))) >= 4 else None
    problems = []
    for name in _ID_FILES:
        path = public / name
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if text_pattern is not None and text_pattern.search(text):
            problems.append(f"public/{name} contains the split seed {seed}")
        elif name.endswith(".json") and any(key and "seed" in s.lower() for s, key in _json_walk(json.loads(text))):
            problems.append(f"public/{name} has a key naming a seed")
    return problems


def check_task_files(task: Task, public_sums: Mapping[str, str]) -> list[str]:
    known: dict[str, str] = {}
    for name in ("task.yaml", task.meta.leaderboard.file if task.meta.leaderboard else "leaderboard.csv"):
        if (task.folder / name).is_file():
            known[sha256_file(task.folder / name)] = f"the task's {name}"
    source = inspect.getsourcefile(type(task.grader))
    if source:
        known[sha256_file(Path(source))] = f"the grader's source {Path(source).name}"
    problems = []
    for rel, digest in public_sums.items():
        name = PurePosixPath(rel).name.lower()
        if digest in known:
            problems.append(f"public/{rel} is a copy of {known[digest]}")
        elif "leaderboard" in name or name in _GRADING_FILE_NAMES:
            problems.append(f"public/{rel} is named like a grading file ({name}); it does not belong in public/")
    return problems


def check_known_issues(task: Task, public: Path) -> list[str]:
    """The task's known issues are for the people reading results; an agent told that test labels are public
    upstream has been told where to look, so no text file in public/ may quote one."""
    texts = [issue.text for issue in task.meta.known_issues]
    problems = []
    for path in sorted(public.rglob("*")):
        if not texts or path.is_symlink() or not path.is_file() or path.suffix.lower() not in _TEXT_SUFFIXES \
                or path.stat().st_size > _MAX_TEXT_BYTES:
            continue
        content = path.read_text(encoding="utf-8", errors="replace")
        problems += [f"public/{path.relative_to(public).as_posix()} quotes the task's known issue {text[:60]!r}..."
                     for text in texts if text in content]
    return problems


_TEXT_SUFFIXES = {".md", ".txt", ".json", ".yaml", ".yml", ".csv"}
_MAX_TEXT_BYTES = 4 << 20  # description files are small; a large CSV of ids cannot hold a sentence worth scanning


# ---- manifests ------------------------------------------------------------------------------------------------
def _read_split_manifest(public: Path) -> tuple[dict[str, Any] | None, list[str]]:
    path = public / SPLIT_MANIFEST
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, [f"public/{SPLIT_MANIFEST} is missing; prepare the task again with --force"]
    except ValueError as exc:
        return None, [f"public/{SPLIT_MANIFEST} is not valid JSON ({exc}); prepare the task again with --force"]
    return doc, []


def _check_manifests(task: Task, dirs: TaskDirs, split: Split, split_doc: Mapping[str, Any], prepared_digest: str,
                     public_sums: dict[str, str], private_sums: dict[str, str]) -> list[str]:
    problems = []
    if split_doc.get("split_digest") != split.digest:
        problems.append(f"public/{SPLIT_MANIFEST}: its split_digest does not match its train/test ids")
    if split.digest != prepared_digest:
        problems.append(f"public/{SPLIT_MANIFEST} holds split {split.digest[:12]} but prepared.json records "
                        f"{prepared_digest[:12]}")
    overlap = sorted(set(split.train) & set(split.test))
    if overlap:
        problems.append(f"{len(overlap)} case(s) are both train and test: {', '.join(overlap[:10])}")
    for side, folder, sums in (("public", dirs.public, public_sums), ("private", dirs.private, private_sums)):
        recorded = _read_checksums(folder, side, problems)
        if recorded is not None:
            actual = {k: v for k, v in sums.items() if k != SPLIT_MANIFEST}
            problems += summarise(_compare_checksums(side, recorded, actual))
    manifest_ids = list(TestManifest.read(dirs.public).ids)
    if manifest_ids != list(split.test):
        problems.append(f"public/{TEST_MANIFEST} lists {len(manifest_ids)} ids that differ from the split's "
                        f"{len(split.test)} test ids (or their order)")
    answer_ids = set(read_answers(dirs.private, task.grader))
    if answer_ids != set(split.test):
        missing, extra = sorted(set(split.test) - answer_ids), sorted(answer_ids - set(split.test))
        problems.append(f"private/{ANSWERS_CSV} does not cover exactly the test ids (missing {missing[:5]}, "
                        f"extra {extra[:5]})")
    return problems


def _read_checksums(folder: Path, side: str, problems: list[str]) -> dict[str, str] | None:
    try:
        return dict(json.loads((folder / SPLIT_MANIFEST).read_text())["sha256"])
    except (FileNotFoundError, ValueError, KeyError, TypeError) as exc:
        problems.append(f"{side}/{SPLIT_MANIFEST} has no readable checksums ({type(exc).__name__}: {exc})")
        return None


def _compare_checksums(side: str, recorded: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    problems = [f"{side}/{rel} is listed in {SPLIT_MANIFEST} but missing"
                for rel in sorted(set(recorded) - set(actual))]
    problems += [f"{side}/{rel} is not listed in {SPLIT_MANIFEST}" for rel in sorted(set(actual) - set(recorded))]
    problems += [f"{side}/{rel} changed since preparation (sha256 differs from {SPLIT_MANIFEST})"
                 for rel in sorted(set(recorded) & set(actual)) if recorded[rel] != actual[rel]]
    return problems


# ---- helpers --------------------------------------------------------------------------------------------------
def token_pattern(ids: Iterable[str]) -> re.Pattern[str] | None:
    """Matches any of ``ids`` as a whole token: not inside a longer name or number (``D1`` is not in ``D10``)."""
    unique = sorted({i for i in ids if i}, key=len, reverse=True)
    if not unique:
        return None
    return re.compile(r"(?<![A-Za-z0-9.])(?:" + "|".join(map(re.escape, unique)) + r")(?![A-Za-z0-9])")


def may_name_test_ids(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    if rel in _ID_FILES or parts[0] == SAMPLE_SUBMISSION:
        return True
    return any(p.lower().startswith("test") or p.lower() == "imagests" for p in parts)


def _in_sample_submission(rel: str) -> bool:
    return PurePosixPath(rel).parts[0] == SAMPLE_SUBMISSION


def _ids_in_index_file(path: Path, pattern: re.Pattern[str]) -> list[str]:
    if path.suffix.lower() not in INDEX_SUFFIXES or path.stat().st_size > MAX_INDEX_BYTES:
        return []
    text = path.read_text(errors="replace")
    if path.suffix.lower() == ".json":
        try:
            strings: Iterable[str] = (s for s, _ in _json_walk(json.loads(text)))
        except ValueError:
            strings = [text]
    elif path.suffix.lower() in (".csv", ".tsv"):
        strings = (cell for row in csv.reader(text.splitlines(), delimiter="\t" if path.suffix == ".tsv" else ",")
                   for cell in row)
    else:
        strings = [text]
    found: dict[str, None] = {}
    for s in strings:
        for hit in pattern.finditer(s):
            found[hit.group(0)] = None
    return list(found)


def _json_walk(node: Any) -> Iterator[tuple[str, bool]]:
    """Every string of a JSON document as (string, is_key); numbers are values, never case ids."""
    if isinstance(node, str):
        yield node, False
    elif isinstance(node, dict):
        for key, value in node.items():
            yield str(key), True
            yield from _json_walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _json_walk(item)
