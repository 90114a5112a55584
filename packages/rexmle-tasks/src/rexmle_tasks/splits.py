"""Deterministic train/test splits and split manifests.

Split rule (documented, machine-independent, stable when cases are added): every case id gets the key
``sha256(f"{seed}:{group}")`` where ``group`` is the id itself unless the family groups cases (e.g. by patient);
groups are sorted by key and the first ``ceil(test_fraction * n_groups)`` groups form the test set. The seed lives
in the task's metadata inside the package, never in ``public/``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Split:
    train: tuple[str, ...]
    test: tuple[str, ...]

    @property
    def digest(self) -> str:
        """sha256 of the split (ids only): two machines with the same digest hold the same split."""
        payload = json.dumps({"train": sorted(self.train), "test": sorted(self.test)}, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()


def make_split(ids: Sequence[str], *, seed: int, test_fraction: float,
               group_of: Callable[[str], str] | None = None) -> Split:
    if len(set(ids)) != len(ids):
        raise ValueError("case ids are not unique")
    group_of = group_of or (lambda i: i)
    groups = sorted({group_of(i) for i in ids}, key=lambda g: hashlib.sha256(f"{seed}:{g}".encode()).hexdigest())
    if len(groups) < 2:
        raise ValueError(f"cannot split {len(ids)} case(s) in {len(groups)} group(s) into train and test")
    n_test = min(len(groups) - 1, max(1, math.ceil(test_fraction * len(groups))))
    test_groups = set(groups[:n_test])
    test = tuple(sorted(i for i in ids if group_of(i) in test_groups))
    train = tuple(sorted(i for i in ids if group_of(i) not in test_groups))
    return Split(train=train, test=test)


def file_digests(path: Path, algorithms: Sequence[str] = ("sha256",), chunk: int = 1 << 20) -> dict[str, str]:
    """{algorithm: hex digest} of a file read once (several algorithms cost one pass over a large archive)."""
    hashers = {name: hashlib.new(name, usedforsecurity=False) for name in algorithms}
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            for h in hashers.values():
                h.update(block)
    return {name: h.hexdigest() for name, h in hashers.items()}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    return file_digests(path, ("sha256",), chunk)["sha256"]


def file_checksums(root: Path, exclude: Iterable[str] = ()) -> dict[str, str]:
    """{relative posix path: sha256} of every regular file under ``root`` (sorted)."""
    skip = set(exclude)
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.relative_to(root).as_posix() not in skip
    }


def tree_digest(root: Path) -> str:
    """One sha256 over every regular file under ``root``: its relative posix path and the sha256 of its bytes, in
    path order. The preparation's own records (``.rexmle-*``: the source, the extraction, the synthetic secret) are
    left out, so two mirrors drawn alike digest alike whatever their secret file or bookkeeping says."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and not path.name.startswith(".rexmle"):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + bytes.fromhex(sha256_file(path)))
    return digest.hexdigest()
