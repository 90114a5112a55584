#!/usr/bin/env python
"""Mutation testing of rexmle's core modules: do their tests fail when the logic is wrong?

One small change at a time is made to a module (a flipped comparison, a constant off by one, a deleted statement, a
negated condition, a replaced return value, a swapped boolean or arithmetic operator, a dropped term, min/max or
any/all swapped); then that module's covering tests run. A mutant is *killed* when they fail, *timed out* when they
run past the limit (counted as detected), and *survives* when they pass: a behaviour no test pins down.

Modules, their covering tests and an optional restriction to some functions are listed in
``tools/mutation_modules.toml``; mutants that cannot change behaviour are listed, one reason each, in
``tools/mutation_equivalent.txt`` and are not run.

Isolation: the tool never writes to the working tree it is started from. It copies the repository's files (tracked
and untracked-but-not-ignored, as ``git ls-files`` lists them; no ``.venv``, no ``.git``) into a private temporary
folder, runs pytest there with that copy's ``packages/*/src`` folders first on ``PYTHONPATH`` (ahead of the editable
installs, which point at the working tree), and checks before it starts that the modules import from the copy. Each
mutated file is restored byte for byte in a ``finally`` (checked), no byte code is written (no stale ``.pyc`` can
outlive a mutant), and the copy is deleted at the end (``--keep`` keeps it).

    tools/mutation.sh ranking validation            # 40 sampled mutants each (seed 0)
    tools/mutation.sh core --count 60 --seed 3      # every module of the table
    tools/mutation.sh mcts --all --json out.json    # every mutant, and a machine-readable report
    tools/mutation.sh ranking --list                # the mutants that would run, without running them
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
MODULES_FILE = ROOT / "tools" / "mutation_modules.toml"
EQUIVALENT_FILE = ROOT / "tools" / "mutation_equivalent.txt"
REASON_SEPARATOR = "  ## "
SHOWN_CHARS = 120


# ---------------------------------------------------------------------------------------------------------------
# mutants


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to the repository root
    line: int
    kind: str
    before: str
    after: str
    start: int  # byte offsets of the replaced span in the original file
    end: int
    replacement: str

    @property
    def key(self) -> str:
        return f"{self.path}:{self.line}: {self.before} -> {self.after}"

    def apply(self, source: bytes) -> bytes:
        return source[:self.start] + self.replacement.encode("utf-8") + source[self.end:]


_COMPARE_SWAPS: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.LtE, ast.GtE), ast.LtE: (ast.Lt, ast.Gt), ast.Gt: (ast.GtE, ast.LtE), ast.GtE: (ast.Gt, ast.Lt),
    ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,), ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,), ast.NotIn: (ast.In,),
}
_BINOP_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
    ast.LShift: ast.RShift, ast.RShift: ast.LShift,
}
_CALL_SWAPS = {"min": "max", "max": "min", "any": "all", "all": "any"}
_DELETABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise, ast.Continue, ast.Break, ast.Delete)


def _shown(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _is_docstring(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def _is_type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


class _Collector:
    """Walks a module and lists (node, replacement, kind, context) for every point it may change: statements and
    expressions inside function bodies and function defaults (of ``functions`` only, when given); module and class
    level constants are configuration, not logic. ``context`` is the node shown in the report (a constant is shown
    with the expression around it)."""

    def __init__(self, functions: set[str] | None) -> None:
        self.functions = functions
        self.found: list[tuple[ast.AST, ast.AST, str, ast.AST]] = []

    def module(self, tree: ast.Module) -> None:
        self._body(tree.body, scope="", selected=self.functions is None, active=False)

    # statements ---------------------------------------------------------------------------------------------
    def _body(self, body: list[ast.stmt], scope: str, selected: bool, active: bool) -> None:
        for statement in body:
            self._statement(statement, scope, selected, active)

    def _statement(self, node: ast.stmt, scope: str, selected: bool, active: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Pass)) or _is_docstring(node):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{scope}.{node.name}" if scope else node.name
            named = self.functions is not None and (name in self.functions or node.name in self.functions)
            chosen = selected or named
            if isinstance(node, ast.ClassDef):
                self._body(node.body, name, chosen, active=False)
            else:
                for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
                    self._expression(default, chosen)
                self._body(node.body, name, chosen, active=chosen)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            return
        if active:
            self._statement_mutations(node)
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "decorator_list", "type_comment"):
                continue
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                self._body(value, scope, selected, active)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.excepthandler):
                        self._body(item.body, scope, selected, active)
                    elif isinstance(item, ast.withitem):
                        self._expression(item.context_expr, active)
                    elif isinstance(item, ast.expr) and name != "targets":
                        self._expression(item, active)
            elif isinstance(value, ast.expr) and name != "target":
                self._expression(value, active)

    def _statement_mutations(self, node: ast.stmt) -> None:
        if isinstance(node, _DELETABLE) and not (isinstance(node, ast.AnnAssign) and node.value is None):
            self._add(node, ast.Pass(), "statement deleted")
        if isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            self._add(node, ast.Return(value=ast.Constant(value=None)), "return value replaced")
        if isinstance(node, (ast.If, ast.While, ast.Assert)):
            self._negation(node.test)

    def _add(self, node: ast.AST, new: ast.AST, kind: str, context: ast.AST | None = None) -> None:
        self.found.append((node, new, kind, context or node))

    # expressions --------------------------------------------------------------------------------------------
    def _negation(self, test: ast.expr) -> None:
        # a single comparison is already flipped by the comparison mutations; a double negation would be noise
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            return
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return
        self._add(test, ast.UnaryOp(op=ast.Not(), operand=test), "condition negated")

    def _expression(self, node: ast.expr, active: bool, parent: ast.expr | None = None) -> None:
        if isinstance(node, ast.JoinedStr):  # positions inside f-strings are unreliable before Python 3.12
            return
        if active:
            self._expression_mutations(node, parent)
        for name, value in ast.iter_fields(node):
            if isinstance(node, ast.Lambda) and name == "args":
                continue
            items = value if isinstance(value, list) else [value]
            for item in items:
                if isinstance(item, ast.expr):
                    self._expression(item, active, node)
                elif isinstance(item, ast.comprehension):
                    self._expression(item.iter, active, node)
                    for condition in item.ifs:
                        if active:
                            self._negation(condition)
                        self._expression(condition, active, node)
                elif isinstance(item, ast.keyword):
                    self._expression(item.value, active, node)

    def _expression_mutations(self, node: ast.expr, parent: ast.expr | None) -> None:
        if isinstance(node, ast.Compare):
            for index, op in enumerate(node.ops):
                for swap in _COMPARE_SWAPS.get(type(op), ()):
                    ops = list(node.ops)
                    ops[index] = swap()
                    self._add(node, ast.Compare(left=node.left, ops=ops, comparators=node.comparators),
                              "comparison changed")
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAPS:
            self._add(node, ast.BinOp(left=node.left, op=_BINOP_SWAPS[type(node.op)](), right=node.right),
                      "operator changed")
            if isinstance(node.op, (ast.Add, ast.Sub)):
                self._add(node, node.left, "term dropped")
        elif isinstance(node, ast.BoolOp):
            other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            self._add(node, ast.BoolOp(op=other, values=node.values), "boolean operator changed")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            self._add(node, node.operand, "unary operator removed")
        elif isinstance(node, ast.IfExp):
            self._negation(node.test)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALL_SWAPS:
            swapped = ast.Call(func=ast.Name(id=_CALL_SWAPS[node.func.id], ctx=ast.Load()), args=node.args,
                               keywords=node.keywords)
            self._add(node, swapped, "function swapped")
        elif isinstance(node, ast.Constant) and not isinstance(node.value, (str, bytes)) and node.value is not None:
            value = node.value
            if isinstance(value, bool):
                new = ast.Constant(value=not value)
            elif isinstance(value, int):
                new = ast.Constant(value=value + 1)
            elif isinstance(value, float):
                new = ast.Constant(value=value + 1.0)
            else:
                return
            self._add(node, new, "constant changed", parent)


def _shown_with(context: ast.AST, old: ast.AST, new: ast.AST) -> str:
    """``context`` shown with ``old`` (one of its descendants) replaced by ``new``."""
    for holder in ast.walk(context):
        for name, value in ast.iter_fields(holder):
            if value is old:
                setattr(holder, name, new)
                try:
                    return _shown(context)
                finally:
                    setattr(holder, name, old)
            if isinstance(value, list) and any(item is old for item in value):
                index = next(i for i, item in enumerate(value) if item is old)
                value[index] = new
                try:
                    return _shown(context)
                finally:
                    value[index] = old
    return _shown(new)


def _line_offsets(source: bytes) -> list[int]:
    offsets = [0]
    for line in source.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


def generate_mutants(path: Path, relative: str, functions: set[str] | None = None) -> tuple[list[Mutant], int]:
    """Every mutant of ``path`` (within ``functions`` when given) that compiles, in source order; and how many of
    the candidates did not compile (dropped)."""
    source = path.read_bytes()
    tree = ast.parse(source, filename=relative)
    collector = _Collector(functions)
    collector.module(tree)
    offsets = _line_offsets(source)
    mutants: list[Mutant] = []
    seen: set[tuple[int, int, str]] = set()
    broken = 0
    for node, new, kind, context in collector.found:
        start = offsets[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
        end = offsets[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        if isinstance(new, ast.stmt):
            replacement = ast.unparse(new)
        else:  # parentheses keep the replacement's grouping wherever it lands
            replacement = f"({ast.unparse(new)})"
        if context is node:
            before, after = _shown(node), _shown(new)
        else:
            before, after = _shown(context), _shown_with(context, node, new)
        if before == after or (start, end, replacement) in seen:
            continue
        seen.add((start, end, replacement))
        mutant = Mutant(path=relative, line=node.lineno, kind=kind, before=before,  # type: ignore[attr-defined]
                        after=after, start=start, end=end, replacement=replacement)
        try:
            compile(mutant.apply(source), relative, "exec", dont_inherit=True)
        except SyntaxError:
            broken += 1
            continue
        mutants.append(mutant)
    mutants.sort(key=lambda m: (m.start, m.end, m.kind, m.after))
    # the same change twice on a line (two equal constants): the later ones are told apart by their occurrence
    occurrences: dict[str, int] = {}
    for index, mutant in enumerate(mutants):
        occurrences[mutant.key] = occurrences.get(mutant.key, 0) + 1
        if occurrences[mutant.key] > 1:
            mutants[index] = replace(mutant, after=f"{mutant.after} [occurrence {occurrences[mutant.key]}]")
    return mutants, broken


def sample(mutants: list[Mutant], count: int | None, seed: int, label: str) -> list[Mutant]:
    """``count`` mutants drawn with a generator seeded by ``seed`` and the module (all when ``count`` is None)."""
    if count is None or count >= len(mutants):
        return list(mutants)
    chosen = random.Random(f"{seed}:{label}").sample(range(len(mutants)), count)
    return [mutants[i] for i in sorted(chosen)]


# ---------------------------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class Target:
    name: str
    file: str
    tests: tuple[str, ...]
    functions: frozenset[str] | None = None
    core: bool = True


def load_targets(path: Path = MODULES_FILE) -> dict[str, Target]:
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    targets = {}
    for name, entry in raw.items():
        functions = entry.get("functions")
        targets[name] = Target(name=name, file=entry["file"], tests=tuple(entry["tests"]),
                               functions=frozenset(functions) if functions else None, core=entry.get("core", True))
    return targets


def resolve_targets(names: list[str], targets: dict[str, Target]) -> list[Target]:
    chosen: list[Target] = []
    for name in names:
        if name in ("core", "all"):
            chosen.extend(t for t in targets.values() if t.core or name == "all")
            continue
        by_file = [t for t in targets.values() if t.file == name or t.file == name.removeprefix("./")]
        if name in targets:
            chosen.append(targets[name])
        elif by_file:
            chosen.extend(by_file)
        else:
            raise SystemExit(f"mutation: unknown module {name!r}; known: {', '.join(targets)} (or 'core', 'all'); "
                             f"add it with its covering tests to {MODULES_FILE.relative_to(ROOT)}")
    unique = {t.name: t for t in chosen}
    return list(unique.values())


@dataclass(frozen=True)
class Equivalent:
    key: str
    reason: str


def load_equivalents(path: Path = EQUIVALENT_FILE) -> dict[str, Equivalent]:
    """``path:line: before -> after  ## reason`` lines; blank lines and lines starting with ``#`` are ignored."""
    equivalents: dict[str, Equivalent] = {}
    if not path.exists():
        return equivalents
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        key, separator, reason = line.partition(REASON_SEPARATOR)
        if not separator or not reason.strip():
            raise SystemExit(f"mutation: {path.name} line {number} has no reason: expected "
                             f"'path:line: before -> after{REASON_SEPARATOR}why it cannot change behaviour'")
        equivalents[key.strip()] = Equivalent(key.strip(), reason.strip())
    return equivalents


# ---------------------------------------------------------------------------------------------------------------
# the private copy and the test runs


def repository_files(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files (read-only git query); a plain walk when git is unavailable."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout
        return sorted({name for name in listed.decode().split("\0") if name})
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and not skip.intersection(p.relative_to(root).parts))


def make_copy(root: Path) -> Path:
    copy = Path(tempfile.mkdtemp(prefix="rexmle-mutation-"))
    for name in repository_files(root):
        source = root / name
        if not source.is_file() or source.is_symlink():
            continue
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return copy


def test_environment(copy: Path) -> dict[str, str]:
    sources = sorted(str(p) for p in (copy / "packages").glob("*/src") if p.is_dir())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*sources, *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(name, "1")
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def check_imports_from_copy(copy: Path, env: dict[str, str], targets: list[Target]) -> None:
    modules = []
    for target in targets:
        parts = Path(target.file).with_suffix("").parts
        if "src" in parts:
            modules.append(".".join(parts[parts.index("src") + 1:]))
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    print(importlib.import_module(name).__file__)\n"
    found = subprocess.run([sys.executable, "-c", code, *modules], cwd=copy, env=env, capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"mutation: the modules do not import from the private copy:\n{found.stderr}")
    for module, file in zip(modules, found.stdout.split(), strict=True):
        if not Path(file).resolve().is_relative_to(copy.resolve()):
            raise SystemExit(f"mutation: {module} imports from {file}, not from the private copy {copy}; "
                             "is PYTHONPATH overridden by a .pth file or a non-editable install?")


@dataclass
class TestRun:
    outcome: str  # passed | failed | timeout | error
    seconds: float
    output: str = ""


def run_tests(copy: Path, env: dict[str, str], tests: tuple[str, ...], timeout_s: float | None) -> TestRun:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header",
               f"--basetemp={copy / '.mutation-tmp'}", *tests]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return TestRun("timeout", time.monotonic() - started)
    except BaseException:
        _kill_group(process)
        raise
    seconds = time.monotonic() - started
    text = output.decode("utf-8", "replace")
    outcome = {0: "passed", 1: "failed", 2: "failed"}.get(process.returncode, "error")
    return TestRun(outcome, seconds, text)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextlib.contextmanager
def mutated(file: Path, content: bytes) -> Iterator[None]:
    """Write ``content`` to ``file`` for the duration of a block, then restore the original bytes (checked)."""
    original = file.read_bytes()
    try:
        file.write_bytes(content)
        yield
    finally:
        file.write_bytes(original)
        if file.read_bytes() != original:
            raise SystemExit(f"mutation: could not restore {file}")


# ---------------------------------------------------------------------------------------------------------------
# one module


@dataclass
class ModuleResult:
    name: str
    file: str
    total_mutants: int
    sampled: int
    not_compiling: int
    killed: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    survived: list[str] = field(default_factory=list)
    equivalent: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def detected(self) -> int:
        return len(self.killed) + len(self.timed_out)

    @property
    def scored(self) -> int:
        return self.detected + len(self.survived)

    @property
    def score(self) -> float | None:
        return self.detected / self.scored if self.scored else None


def run_module(target: Target, copy: Path, env: dict[str, str], args: argparse.Namespace,
               equivalents: dict[str, Equivalent], used: set[str]) -> ModuleResult:
    file = copy / target.file
    mutants, broken = generate_mutants(file, target.file, set(target.functions) if target.functions else None)
    chosen = sample(mutants, None if args.all else args.count, args.seed, target.name)
    result = ModuleResult(target.name, target.file, len(mutants), len(chosen), broken)
    print(f"\n== {target.name}: {target.file}" + (f" ({', '.join(sorted(target.functions))})"
                                                   if target.functions else ""), flush=True)
    print(f"   {len(chosen)} of {len(mutants)} mutants" + ("" if args.all else f" (seed {args.seed})")
          + f"; tests: {' '.join(target.tests)}", flush=True)
    if args.list:
        for mutant in chosen:
            mark = "  [equivalent]" if mutant.key in equivalents else ""
            print(f"   {mutant.key}  ({mutant.kind}){mark}")
        used.update(m.key for m in chosen if m.key in equivalents)
        return result
    tests = tuple(t for t in target.tests if (copy / t.split("::")[0]).exists())
    if len(tests) < len(target.tests):
        print(f"   WARNING: covering tests not found, left out: {sorted(set(target.tests) - set(tests))}")
    if not tests:
        raise SystemExit(f"mutation: none of the covering tests of {target.name} exists")
    baseline = run_tests(copy, env, tests, timeout_s=None)
    if baseline.outcome != "passed":
        raise SystemExit(f"mutation: the covering tests of {target.name} fail without any mutant; fix them first:\n"
                         f"{baseline.output[-3000:]}")
    timeout_s = args.timeout_factor * baseline.seconds + 10.0
    print(f"   unmutated tests pass in {baseline.seconds:.1f} s; limit per mutant {timeout_s:.0f} s", flush=True)
    for number, mutant in enumerate(chosen, start=1):
        if mutant.key in equivalents:
            used.add(mutant.key)
            result.equivalent.append(mutant.key)
            continue
        source = file.read_bytes()
        with mutated(file, mutant.apply(source)):
            run = run_tests(copy, env, tests, timeout_s)
        bucket = {"failed": result.killed, "timeout": result.timed_out, "passed": result.survived,
                  "error": result.errors}[run.outcome]
        bucket.append(mutant.key)
        if args.verbose or run.outcome in ("passed", "error"):
            print(f"   [{number}/{len(chosen)}] {run.outcome:8} {run.seconds:5.1f} s  {mutant.key}", flush=True)
    return result


def print_summary(results: list[ModuleResult]) -> None:
    print("\n== summary (score: killed + timed out, of the mutants that are not equivalent)")
    for r in results:
        score = "n/a" if r.score is None else f"{r.detected}/{r.scored} = {100 * r.score:.1f}%"
        print(f"{r.name:18} killed {len(r.killed):3}  timed out {len(r.timed_out):2}  survived {len(r.survived):3}  "
              f"equivalent {len(r.equivalent):2}  errors {len(r.errors)}  score {score}")
    survivors = [key for r in results for key in r.survived]
    if survivors:
        print("\nsurvivors (file:line before -> after):")
        for key in survivors:
            print(f"  {key}")
    errors = [key for r in results for key in r.errors]
    if errors:
        print("\nmutants whose test run neither passed nor failed (pytest internal error or no tests collected):")
        for key in errors:
            print(f"  {key}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="+", help="names from tools/mutation_modules.toml, their files, 'core' or "
                                                   "'all'")
    parser.add_argument("--count", "-n", type=int, default=40, help="mutants sampled per module (default 40)")
    parser.add_argument("--all", action="store_true", help="every mutant of each module (no sampling)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--timeout-factor", type=float, default=3.0,
                        help="a mutant times out after this many times the unmutated tests' time, plus 10 s")
    parser.add_argument("--fail-under", type=float, default=None, metavar="PERCENT",
                        help="exit 1 when a module's score is below this")
    parser.add_argument("--list", action="store_true", help="list the sampled mutants without running them")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the private copy (its path is printed)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every mutant's outcome")
    args = parser.parse_args(argv)

    targets = resolve_targets(args.modules, load_targets())
    equivalents = load_equivalents()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally blocks restore and clean up
    copy = make_copy(ROOT)
    print(f"private copy: {copy}", flush=True)
    results: list[ModuleResult] = []
    used: set[str] = set()
    try:
        env = test_environment(copy)
        check_imports_from_copy(copy, env, targets)
        for target in targets:
            results.append(run_module(target, copy, env, args, equivalents, used))
    finally:
        if args.keep:
            print(f"kept the private copy: {copy}")
        else:
            shutil.rmtree(copy, ignore_errors=True)
    if args.list:
        return 0
    print_summary(results)
    checked = {r.file for r in results}
    stale = [key for key in equivalents if key.split(":", 1)[0] in checked and key not in used]
    if stale and args.all:
        print("\nentries of mutation_equivalent.txt that match no mutant any more (update their line or remove them):")
        for key in stale:
            print(f"  {key}")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "score": r.score} for r in results], indent=2) + "\n")
    if args.fail_under is not None and any(r.score is not None and 100 * r.score < args.fail_under for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
