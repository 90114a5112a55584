"""Packaging rules: dependencies flow grade <- tasks <- agents/baselines, and heavy deep-learning packages are only
ever optional extras of rexmle-baselines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "torchvision", "monai", "nnunetv2", "timm", "diffusers"}


def requirements(package: str) -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}

    extras = {k: names(v) for k, v in project.get("optional-dependencies", {}).items()}
    return names(project["dependencies"]), extras


@pytest.mark.parametrize("package", ["rexmle-grade", "rexmle-tasks", "rexmle-agents", "rexmle-baselines"])
def test_no_heavy_core_dependency(package: str) -> None:
    core, _ = requirements(package)
    assert not core & HEAVY, f"{package} needs {core & HEAVY} unconditionally; make it an extra"


def test_dependencies_flow_one_way() -> None:
    assert not {d for d in requirements("rexmle-grade")[0] if d.startswith("rexmle")}
    assert {d for d in requirements("rexmle-tasks")[0] if d.startswith("rexmle")} == {"rexmle-grade"}
    for upper in ("rexmle-agents", "rexmle-baselines"):
        assert {d for d in requirements(upper)[0] if d.startswith("rexmle")} <= {"rexmle-grade", "rexmle-tasks"}


def test_torch_is_pinned_for_every_install() -> None:
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert "torch==2.14.1" in pins and "torchvision==0.29.1" in pins
    assert "PIP_CONSTRAINT" in (ROOT / "tools" / "setup.sh").read_text()


@pytest.mark.network
def test_grade_alone_resolves_without_torch(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--report", str(report), str(ROOT / "packages" / "rexmle-grade")], check=True, timeout=600)
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "rexmle-grade" in names and not names & HEAVY


# ---------------------------------------------------------------------------------------------------------------
# Declared dependencies: every package imports only what it declares, and every `rexmle` verb loads with exactly the
# lightweight install's dependency closure (the four packages without extras).

PACKAGES = ("rexmle-grade", "rexmle-tasks", "rexmle-agents", "rexmle-baselines")


def _imports(package: str) -> dict[str, set[str]]:
    """Top-level module name -> the source files of ``package`` that import it (module level or lazily)."""
    import ast

    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "packages" / package / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("package", PACKAGES)
def test_every_import_is_declared(package: str) -> None:
    """An import of a third-party module must name a distribution the package declares (core, or an extra for
    lazily imported optional features): relying on another package's dependencies breaks when that one changes
    (typer stopped depending on click, and `rexmle analyse` vanished from installs without the torch extras)."""
    from importlib.metadata import packages_distributions

    core, extras = requirements(package)
    declared = {_canonical(n) for n in core | set().union(*extras.values(), set())}
    owners = packages_distributions()
    undeclared = {}
    for module, files in _imports(package).items():
        if module in sys.stdlib_module_names or module.startswith(("rexmle_", "_")) or module == "__future__":
            continue
        # an optional module that is not installed here (pyarrow) is matched by its own name
        dists = {_canonical(d) for d in owners.get(module, [])} or {_canonical(module)}
        if not dists & declared:
            undeclared[module] = (sorted(files), f"provided by {sorted(dists)}")
    assert not undeclared, f"{package} imports modules its pyproject.toml does not declare: {undeclared}"


def test_every_verb_loads_in_the_lightweight_install() -> None:
    """Each verb's module imports, and `rexmle VERB --help` works, with every module outside the dependency closure
    of the lightweight install (the four packages' declared core dependencies, followed through the installed
    distributions' metadata, no extras) made unimportable. The closure starts from the pyproject files here, so a
    dependency dropped from a pyproject fails this test even while an older install still has it."""
    roots, commands = [], {}
    for package in PACKAGES:
        project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
        roots += [r for r in project["dependencies"] if not r.lower().startswith("rexmle")]
        commands.update(project.get("entry-points", {}).get("rexmle.commands", {}))
    code = textwrap.dedent("""
        import importlib.abc, importlib.metadata as md, json, re, sys
        from packaging.requirements import Requirement

        roots, verbs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
        canon = lambda n: re.sub(r"[-_.]+", "-", n).lower()
        allowed, queue = {"rexmle-grade", "rexmle-tasks", "rexmle-agents", "rexmle-baselines"}, list(roots)
        while queue:
            requirement = Requirement(queue.pop())
            name = canon(requirement.name)
            if name in allowed or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
                continue
            allowed.add(name)
            try:
                queue.extend(md.requires(name) or [])
            except md.PackageNotFoundError:
                print("MISSING", name)
        blocked = {module for module, dists in md.packages_distributions().items()
                   if not {canon(d) for d in dists} & allowed and module not in sys.stdlib_module_names}

        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, fullname, path=None, target=None):
                if fullname.split(".")[0] in blocked:
                    raise ModuleNotFoundError(f"{fullname} is not in the lightweight install", name=fullname)
                return None

        sys.meta_path.insert(0, Refuse())
        import importlib
        failures = []
        for verb, target in sorted(verbs.items()):
            module, _, attribute = target.partition(":")
            try:
                getattr(importlib.import_module(module), attribute)
            except Exception as exc:
                failures.append(f"{verb} ({target}): {type(exc).__name__}: {exc}")
        from rexmle_grade.cli import main
        for verb in sorted(verbs):
            try:
                code = main([verb, "--help"])
            except SystemExit as exc:
                code = exc.code
            if code not in (0, None):
                failures.append(f"rexmle {verb} --help exited {code}")
        print(json.dumps(failures))
        sys.exit(1 if failures else 0)
    """)
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(roots), json.dumps(commands)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    assert "could not load rexmle command" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
def test_lightweight_install_in_a_fresh_venv(tmp_path: Path) -> None:
    """The real thing (needs the package index): a new venv with the four packages and no extras, every verb's
    --help."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {**os.environ, "PIP_CONSTRAINT": str(ROOT / "constraints.txt"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    *(str(ROOT / "packages" / p) for p in PACKAGES)], check=True, timeout=1800, env=env)
    verbs = set()
    for package in PACKAGES:
        project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
        verbs |= set(project.get("entry-points", {}).get("rexmle.commands", {}))
    for verb in sorted(verbs):
        proc = subprocess.run([str(venv / "bin" / "rexmle"), verb, "--help"], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0 and "could not load" not in proc.stderr, (verb, proc.stderr[-2000:])
