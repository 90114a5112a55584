"""What a sandbox shows of the host, what it must hide, and the environment variables commands get.

The Python that runs agent code inside is the harness's own (same interpreter, same venv, the rexmle packages from
their editable source folders), mounted read-only at the same paths, so ``python`` inside behaves as outside. Inside
those trees lie files an agent must never read: the human leaderboards of the tasks and any calibration data of the
baselines. They are covered (:class:`HostView.hidden_files` / ``hidden_dirs``). The task data's ``private/`` (test
labels) and ``raw/`` (the untouched download, labels included) folders are never mounted; if one lies inside a tree
that would be mounted, :func:`host_view` refuses instead of exposing it.

The environment inside is built from nothing: no host variable reaches agent code (no ``*_API_KEY``, no token).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rexmle_agents.sandbox.base import HOME_DIRNAME, SandboxSpec
from rexmle_grade.errors import SandboxError

SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin")
# A minimal /etc: the dynamic loader's cache, user/group names, name resolution order and hosts (no resolv.conf:
# there is no network), TLS certificates, the time zone, fontconfig (matplotlib), and the alternatives symlinks.
ETC_ENTRIES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "hosts", "nsswitch.conf",
               "localtime", "ssl", "ca-certificates", "alternatives", "os-release", "fonts")
# Folders of a task's data that only graders read: test labels and answers, and the untouched download.
FORBIDDEN_DATA_DIRS = ("private", "raw")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TMP_DIRNAME = ".tmp"
_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


@dataclass(frozen=True)
class HostView:
    """The host paths a sandbox mounts read-only at the same place, and the paths inside them it covers."""

    symlinks: tuple[tuple[str, str], ...]  # (target, path) for top-level system symlinks such as /bin -> usr/bin
    ro_paths: tuple[Path, ...]  # files and folders bound read-only at their own path
    hidden_files: tuple[Path, ...]  # covered by an unreadable file
    hidden_dirs: tuple[Path, ...]  # covered by an empty read-only tmpfs


def _inside(path: Path, tree: Path) -> bool:
    return path == tree or path.is_relative_to(tree)


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """The paths with those inside another one dropped (sorted, so parents come first)."""
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: (len(p.parts), str(p))):
        if not any(_inside(path, k) for k in kept):
            kept.append(path)
    return sorted(kept)


def _pth_dirs(site_dir: Path) -> list[Path]:
    """Folders that editable installs add to sys.path: plain lines of ``*.pth`` files and the mappings of
    setuptools' editable finders (``__editable___*_finder.py``)."""
    found: list[Path] = []
    for pth in sorted(site_dir.glob("*.pth")):
        for line in pth.read_text(errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")) and Path(line).is_dir():
                found.append(Path(line))
    for finder in sorted(site_dir.glob("__editable___*_finder.py")):
        for node in ast.parse(finder.read_text(errors="replace")).body:
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "MAPPING"
                    and node.value is not None):
                mapping = ast.literal_eval(node.value)
                found.extend(Path(p).parent for p in mapping.values())
    for record in sorted(site_dir.glob("*.dist-info/direct_url.json")):
        info = json.loads(record.read_text())
        if info.get("dir_info", {}).get("editable") and info.get("url", "").startswith("file://"):
            src = Path(info["url"].removeprefix("file://")) / "src"
            if src.is_dir():
                found.append(src)
    return found


def python_paths() -> list[Path]:
    """The interpreter's installation, the venv, and the source folders of editable installs (resolved)."""
    paths = [Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).resolve().parent]
    for entry in sys.path:
        if entry.endswith("site-packages") and Path(entry).is_dir():
            paths.extend(_pth_dirs(Path(entry)))
    return _outermost(p.resolve() for p in paths if p.exists())


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def secret_paths() -> tuple[list[Path], list[Path]]:
    """(files, folders) shipped inside the installed rexmle packages that agents must not read: every task's human
    leaderboard, and anything named like calibration data in rexmle_baselines."""
    files: list[Path] = []
    dirs: list[Path] = []
    tasks = _package_dir("rexmle_tasks")
    if tasks is not None:
        files.extend(p.resolve() for p in tasks.glob("challenges/*/*leaderboard*") if p.is_file())
    baselines = _package_dir("rexmle_baselines")
    if baselines is not None:
        for path in baselines.rglob("*calibration*"):
            if path.is_dir():
                dirs.append(path.resolve())
            elif path.is_file() and path.suffix not in (".py", ".pyc"):
                files.append(path.resolve())
    return sorted(set(files)), _outermost(dirs)


def data_roots(spec: SandboxSpec) -> list[Path]:
    """Data folders whose tasks' private/raw folders must stay out of reach: the one the spec's data comes from
    (``<root>/<task>/public``) and the configured one (``--data-dir`` / ``$REXMLE_DATA_DIR`` / cache)."""
    from rexmle_grade.settings import data_dir

    roots = [data_dir()]
    data = spec.data.resolve()
    if data.name == "public":
        roots.append(data.parent.parent)
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def forbidden_data_dirs(roots: Iterable[Path], data: Path) -> list[Path]:
    """The private/ and raw/ folders of every task under the data roots, and any private/ folder in or beside the
    spec's data folder (caught when a task's root, or the data root itself, is passed as its data)."""
    found: list[Path] = []
    for root in roots:
        for name in FORBIDDEN_DATA_DIRS:
            found.extend(root.glob(f"*/{name}"))
    for near in (data, data.parent):
        found.extend([near / "private", *near.glob("*/private")])
    return sorted({p.resolve() for p in found if p.is_dir()})


def check_nothing_forbidden(mounted: Iterable[tuple[str, Path]], forbidden: Iterable[Path]) -> None:
    """Refuse a sandbox in which a private/raw data folder would be visible through a mounted (what, tree)."""
    mounted = list(mounted)
    for folder in forbidden:
        for what, tree in mounted:
            if _inside(folder, tree.resolve()):
                raise SandboxError(
                    f"the sandbox would expose {folder} (task data only graders may read): it lies inside the "
                    f"{what} {tree}, which is mounted into the sandbox",
                    hint="keep the data folder (--data-dir / $REXMLE_DATA_DIR) outside the run workspace, the "
                         "Python environment and the task's public/ folder")


def system_view() -> tuple[list[tuple[str, str]], list[Path]]:
    """Top-level system symlinks (merged /usr) and the system files and folders to mount read-only."""
    symlinks: list[tuple[str, str]] = []
    paths: list[Path] = []
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            symlinks.append((os.readlink(path), name))
        elif path.is_dir():
            paths.append(path)
    paths.extend(Path("/etc") / e for e in ETC_ENTRIES if (Path("/etc") / e).exists())
    return symlinks, paths


def host_view(spec: SandboxSpec) -> HostView:
    """Everything an isolating sandbox mounts besides the workspace and the data, checked against the data's
    forbidden folders (SandboxError when one would be exposed)."""
    symlinks, system = system_view()
    python = python_paths()
    mounted = [("workspace", spec.workspace), ("data view", spec.data)]
    mounted += [("extra bind", Path(b.host)) for b in spec.binds]
    mounted += [("system folder", p) for p in system if p.is_dir()]
    mounted += [("Python environment", p) for p in python]
    check_nothing_forbidden(mounted, forbidden_data_dirs(data_roots(spec), spec.data.resolve()))
    files, dirs = secret_paths()
    trees = [p for p in [*system, *python] if p.is_dir()]
    return HostView(
        symlinks=tuple(symlinks),
        ro_paths=tuple([*system, *python]),
        hidden_files=tuple(f for f in files if any(_inside(f, t) for t in trees)),
        hidden_dirs=tuple(d for d in dirs if any(_inside(d, t) for t in trees)),
    )


def system_search_path(variable: str) -> list[str]:
    """The host's entries of a search path (``PATH``, ``LD_LIBRARY_PATH``) that lie inside the system folders a
    sandbox on this host shows read-only: on GPU machines the driver's tools and libraries are often found only
    that way (``/usr/local/nvidia/bin``, ``/usr/local/nvidia/lib64``, ``/usr/local/cuda/bin``). Nothing else of
    the host's environment is kept."""
    roots = [Path(name).resolve() for name in SYSTEM_DIRS if Path(name).is_dir()]
    kept: list[str] = []
    for entry in os.environ.get(variable, "").split(os.pathsep):
        if not entry.startswith("/") or entry in kept:
            continue
        path = Path(entry)
        if path.is_dir() and any(_inside(path.resolve(), root) for root in roots):
            kept.append(entry)
    return kept


def sandbox_env(spec: SandboxSpec, *, workspace: str, tmpdir: str | None = None,
                venv_bin: str | None = None, host_system: bool = False) -> dict[str, str]:
    """The complete environment of commands inside (nothing inherited from the host), ``spec.env`` last.

    ``workspace`` is the workspace as commands see it; ``tmpdir`` the temporary folder (default inside the
    workspace); ``venv_bin`` goes first on PATH when given. ``host_system`` (a sandbox that shows the host's own
    system folders) keeps the host's PATH and LD_LIBRARY_PATH entries inside those folders, after the defaults."""
    home = f"{workspace}/{HOME_DIRNAME}"
    path = [*([venv_bin] if venv_bin else []), *DEFAULT_PATH.split(":")]
    libraries: list[str] = []
    if host_system:
        path += [entry for entry in system_search_path("PATH") if entry not in path]
        libraries = system_search_path("LD_LIBRARY_PATH")
    env = {
        "PATH": ":".join(path),
        "HOME": home,
        "TMPDIR": tmpdir or f"{workspace}/{TMP_DIRNAME}",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "HF_HUB_OFFLINE": "1",
        "MPLCONFIGDIR": f"{home}/.config/matplotlib",
        "XDG_CACHE_HOME": f"{home}/.cache",
        "CUDA_VISIBLE_DEVICES": ",".join(spec.limits.gpus),
        "REXMLE_WORKSPACE": workspace,
    }
    if libraries:
        env["LD_LIBRARY_PATH"] = ":".join(libraries)
    if spec.limits.cpus is not None:
        env.update(dict.fromkeys(_THREAD_VARIABLES, str(spec.limits.cpus)))
    if sys.prefix != sys.base_prefix and venv_bin:
        env["VIRTUAL_ENV"] = sys.prefix
    leaked = sorted(k for k in spec.env if _SECRET_NAME.search(k))
    if leaked:
        raise SandboxError(f"sandbox variables {leaked} look like secrets; agent code must never see one",
                           hint="model calls happen in the harness, outside the sandbox: drop them from spec.env")
    env.update(spec.env)
    return env


def venv_bin() -> str:
    """The venv's bin folder (or the interpreter's), first on PATH inside."""
    return str(Path(sys.prefix) / "bin")
