"""The local cache of pretrained weights: fetched once, outside any sandbox, then only read.

``rexmle baselines fetch-weights NAME...`` downloads the named weights (ImageNet backbones experts start from)
into a cache folder (``--weights-dir``, ``$REXMLE_WEIGHTS_DIR`` or ``<data>/weights``) and records each file's
SHA-256, size and source in the folder's ``weights.json``. A baseline whose ``pretrained`` parameter names a cache
entry (``--set pretrained=resnet50.tv2_in1k``) reads that file after checking its SHA-256 against the manifest,
and records name and checksum in its run; nothing is ever downloaded during a run (the sandbox has no network, and
``HF_HUB_OFFLINE=1`` stays set). ``pretrained`` may also be a path to a local weights file.

The sources are torchvision's ImageNet checkpoints, whose file names carry the first hex digits of their SHA-256
(torchvision's own convention), so a download is checked against that prefix; the full SHA-256 is recorded when the
file is first fetched and checked on every later use. ``add_local_weights`` registers a file that is already on
disk under a name (a machine without network, a test).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rexmle_grade.errors import ConfigurationError, RexmleError, UserInputError

MANIFEST = "weights.json"
WEIGHTS_DIR_VARIABLE = "REXMLE_WEIGHTS_DIR"
CHUNK = 1 << 20


@dataclass(frozen=True)
class WeightsSource:
    name: str          # timm's name of the pretrained model (architecture.tag)
    architecture: str  # the timm model the file loads into
    url: str
    sha256_prefix: str | None  # what the published file name promises about its SHA-256
    description: str

    @property
    def file_name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


KNOWN_WEIGHTS: dict[str, WeightsSource] = {source.name: source for source in (
    WeightsSource("resnet50.tv2_in1k", "resnet50", "https://download.pytorch.org/models/resnet50-11ad3fa6.pth",
                  "11ad3fa6", "ResNet-50, torchvision ImageNet-1k V2 recipe (top-1 80.9%)"),
    WeightsSource("resnet34.tv_in1k", "resnet34", "https://download.pytorch.org/models/resnet34-b627a593.pth",
                  "b627a593", "ResNet-34, torchvision ImageNet-1k (top-1 73.3%)"),
    WeightsSource("resnet18.tv_in1k", "resnet18", "https://download.pytorch.org/models/resnet18-f37072fd.pth",
                  "f37072fd", "ResNet-18, torchvision ImageNet-1k (top-1 69.8%)"),
)}


class WeightsEntry(BaseModel):
    """One file of the cache, as ``weights.json`` records it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    architecture: str
    file: str  # relative to the cache folder
    sha256: str
    size: int
    source: str  # the URL it came from, or "local:<path>"
    fetched_at: str


def default_weights_dir() -> Path:
    """``$REXMLE_WEIGHTS_DIR``, else ``<data dir>/weights``."""
    if os.environ.get(WEIGHTS_DIR_VARIABLE):
        return Path(os.environ[WEIGHTS_DIR_VARIABLE])
    from rexmle_grade.settings import data_dir

    return data_dir() / "weights"


def read_manifest(folder: Path) -> dict[str, WeightsEntry]:
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    try:
        items = json.loads(path.read_text())
        return {item["name"]: WeightsEntry.model_validate(item) for item in items}
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"the weights manifest {path} is damaged: {exc}",
                                 hint="delete it and fetch the weights again") from None


def _write_manifest(folder: Path, entries: Mapping[str, WeightsEntry]) -> None:
    path = folder / MANIFEST
    partial = path.with_name(f".{MANIFEST}.partial")
    partial.write_text(json.dumps([e.model_dump() for _, e in sorted(entries.items())], indent=1) + "\n")
    os.replace(partial, path)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _download(url: str, target: Path, log: Callable[[str], None]) -> None:
    partial = target.with_name(target.name + ".part")
    with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as fh:
        total = int(response.headers.get("Content-Length") or 0)
        done = 0
        while chunk := response.read(CHUNK):
            fh.write(chunk)
            done += len(chunk)
            if total and done % (32 * CHUNK) < CHUNK:
                log(f"  {target.name}: {done / 2**20:.0f} / {total / 2**20:.0f} MiB")
    os.replace(partial, target)


def fetch_weights(names: Sequence[str], folder: Path, *, sources: Mapping[str, WeightsSource] | None = None,
                  log: Callable[[str], None] | None = None) -> list[WeightsEntry]:
    """Download each named weights file into ``folder`` (kept if already there with its recorded checksum) and
    record it in the manifest; a file whose SHA-256 does not start with its published prefix is refused."""
    known = dict(KNOWN_WEIGHTS if sources is None else sources)
    say = log or (lambda line: None)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserInputError(f"unknown weights {unknown}", hint="known: " + ", ".join(sorted(known)))
    folder.mkdir(parents=True, exist_ok=True)
    entries = read_manifest(folder)
    fetched = []
    for name in names:
        source = known[name]
        target = folder / source.file_name
        existing = entries.get(name)
        if existing is not None and target.is_file() and sha256_of(target) == existing.sha256:
            say(f"{name}: already in {folder} (sha256 {existing.sha256[:16]}...)")
            fetched.append(existing)
            continue
        say(f"{name}: downloading {source.url}")
        try:
            _download(source.url, target, say)
        except OSError as exc:
            raise RexmleError(f"could not download {source.url}: {exc}",
                              hint="fetch weights on a machine with network access, then copy the folder "
                                   "(or register a local copy with --file)") from None
        digest = sha256_of(target)
        if source.sha256_prefix and not digest.startswith(source.sha256_prefix):
            target.unlink()
            raise RexmleError(f"{source.url} has SHA-256 {digest}, but its name promises {source.sha256_prefix}...",
                              hint="the download is corrupt or was replaced; try again")
        entry = WeightsEntry(name=name, architecture=source.architecture, file=target.name, sha256=digest,
                             size=target.stat().st_size, source=source.url, fetched_at=_now())
        entries[name] = entry
        _write_manifest(folder, entries)
        say(f"{name}: {entry.size / 2**20:.1f} MiB, sha256 {digest}")
        fetched.append(entry)
    return fetched


def add_local_weights(name: str, file: Path, folder: Path, *, architecture: str | None = None) -> WeightsEntry:
    """Copy a weights file that is already on this machine into the cache under ``name`` (a known name, or any
    name with ``architecture``) and record its checksum."""
    source = KNOWN_WEIGHTS.get(name)
    arch = architecture or (source.architecture if source else None)
    if arch is None:
        raise UserInputError(f"{name!r} is not a known weights name, so its architecture must be given",
                             hint="pass --architecture (the timm model name, e.g. resnet50)")
    if not file.is_file():
        raise UserInputError(f"weights file {file} does not exist")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (source.file_name if source else f"{name}{''.join(file.suffixes) or '.pth'}")
    if file.resolve() != target.resolve():
        shutil.copyfile(file, target)
    digest = sha256_of(target)
    if source and source.sha256_prefix and not digest.startswith(source.sha256_prefix):
        raise RexmleError(f"{file} has SHA-256 {digest}, not the {source.sha256_prefix}... of {name}",
                          hint="is it the right file?")
    entries = read_manifest(folder)
    entry = WeightsEntry(name=name, architecture=arch, file=target.name, sha256=digest, size=target.stat().st_size,
                         source=f"local:{file}", fetched_at=_now())
    entries[name] = entry
    _write_manifest(folder, entries)
    return entry


def is_cache_name(value: Any) -> bool:
    """Whether a ``pretrained`` value names a cache entry rather than a file (no path separator, no suffix of a
    weights file)."""
    if not value:
        return False
    text = str(value)
    return "/" not in text and not text.endswith((".pth", ".pt", ".bin", ".safetensors", ".ckpt"))


def required_weights(params: Mapping[str, Any]) -> list[str]:
    """The cache names a config's parameters use (what must be fetched before a sandboxed run)."""
    value = params.get("pretrained")
    return [str(value)] if is_cache_name(value) else []


@dataclass(frozen=True)
class ResolvedWeights:
    path: Path
    name: str
    sha256: str


def resolve_weights(value: Any, folder: Path | None, *, architecture: str) -> ResolvedWeights:
    """The file a ``pretrained`` parameter means: a cache entry (checked against its recorded SHA-256 and
    architecture) or a local file (checksummed for the record)."""
    if not is_cache_name(value):
        path = Path(str(value))
        if not path.is_file():
            raise UserInputError(f"pretrained weights {str(path)!r} do not exist",
                                 hint="pass a local checkpoint file (--set pretrained=/path/model.pth) or a cache "
                                      "name fetched with `rexmle baselines fetch-weights`; weights are never "
                                      "downloaded during a run")
        return ResolvedWeights(path, str(path), sha256_of(path))
    name = str(value)
    folder = folder or default_weights_dir()
    entry = read_manifest(folder).get(name)
    fetch = f"run `rexmle baselines fetch-weights {name}` (with network, before the run)"
    if entry is None:
        raise ConfigurationError(f"weights {name!r} are not in the weights cache {folder}",
                                 hint=f"{fetch}, or point --weights-dir at the cache that has them")
    path = folder / entry.file
    if not path.is_file():
        raise ConfigurationError(f"weights {name!r} are recorded in {folder / MANIFEST} but {path} is missing",
                                 hint=fetch)
    digest = sha256_of(path)
    if digest != entry.sha256:
        raise ConfigurationError(f"weights file {path} has SHA-256 {digest}, the cache recorded {entry.sha256}",
                                 hint=f"the file changed since it was fetched: {fetch} again")
    if entry.architecture != architecture:
        raise UserInputError(f"weights {name!r} are for {entry.architecture}, the model is {architecture}",
                             hint=f"--set model={entry.architecture}, or other weights")
    return ResolvedWeights(path, name, digest)
