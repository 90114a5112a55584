"""Downloading the raw challenge data into ``raw/downloads/``.

Sources (see :class:`rexmle_tasks.metadata.DataSource`):

* ``zenodo``: ``GET {base}/api/records/{record}`` lists the record's ``files`` (``key``, ``size``,
  ``checksum: "md5:..."``, ``links.self``); the task's ``files`` pick some of them by name (none listed: every
  file of the record). ``base`` is ``$REXMLE_ZENODO_URL`` (default ``https://zenodo.org``), so tests and mirrors
  can stand in for Zenodo.
* ``figshare``: the article download URL (``url``) saved under the name of the source's single file entry
  (e.g. SEG.A.'s ``avt_dataset.zip``).
* ``url``: each file from its own ``url``.
* ``gdrive`` / ``manual``: nothing is fetched. A file already in ``downloads/`` is used (and verified when a
  checksum is known); a missing one raises :class:`ManualDownloadRequired` naming the full target path, unless the
  source is ``optional`` (then the instructions are logged and preparation goes on without it).

Every fetched file is

* resumable: bytes go to ``<name>.part``; a later attempt (or a later run) asks only for the rest with an HTTP
  ``Range`` request, and starts over if the server ignores it;
* verified: size, md5 and sha256, whichever are known (from the Zenodo API and/or task.yaml), are checked before
  the part file becomes ``<name>``; a mismatch deletes the part file and raises :class:`ChecksumMismatchError`;
* retried: connection errors, timeouts, HTTP 429 and 5xx, with exponential backoff and full jitter (a
  ``Retry-After`` header wins); other 4xx answers fail at once;
* skipped when ``<name>`` is already there and verifies.

Progress bars (bytes, speed, time left) are drawn on stderr when it is a terminal.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from rexmle_grade.errors import ChecksumMismatchError, DownloadError, ManualDownloadRequired
from rexmle_tasks import __version__
from rexmle_tasks.metadata import DataSource, RemoteFile
from rexmle_tasks.splits import file_digests

log = logging.getLogger(__name__)

ZENODO_URL_ENV = "REXMLE_ZENODO_URL"
DEFAULT_ZENODO_URL = "https://zenodo.org"
PART_SUFFIX = ".part"


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently transient failures are retried (per file, across resumed attempts)."""

    attempts: int = 8
    initial_wait: float = 2.0  # seconds; the backoff ceiling doubles per attempt, the wait is uniform below it
    max_wait: float = 120.0
    max_retry_after: float = 600.0  # a server asking for a longer pause than this gets this
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)


@dataclass(frozen=True)
class FileTarget:
    """One file to fetch into ``downloads/<name>``, with what is known about it."""

    name: str
    url: str
    origin: str  # where it comes from, for messages ("Zenodo record 7960856")
    size: int | None = None
    md5: str | None = None
    sha256: str | None = None


# ---- errors that are worth another attempt ---------------------------------------------------------------------
class _RetryableStatus(Exception):
    def __init__(self, status: int, url: str, retry_after: float | None) -> None:
        self.status = status
        self.retry_after = retry_after
        super().__init__(f"HTTP {status} from {url}")


class _IncompleteTransfer(Exception):
    """The server ended the body early, or gave a range we cannot append (the part file is kept or reset)."""


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.UnsupportedProtocol):
        return False
    return isinstance(exc, (httpx.TransportError, _RetryableStatus, _IncompleteTransfer))


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000" dates parse naive; HTTP dates are UTC
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, (when - dt.datetime.now(dt.timezone.utc)).total_seconds())


def _wait_strategy(policy: RetryPolicy) -> Callable[[RetryCallState], float]:
    backoff = wait_random_exponential(multiplier=policy.initial_wait, max=policy.max_wait)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _RetryableStatus) and exc.retry_after is not None:
            return min(exc.retry_after, policy.max_retry_after)
        return backoff(state)

    return wait


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    wait = state.next_action.sleep if state.next_action else 0.0
    log.warning("attempt %d failed (%s); retrying in %.1f s", state.attempt_number, exc, wait)


def _retrying(policy: RetryPolicy) -> Retrying:
    return Retrying(
        stop=stop_after_attempt(policy.attempts),
        wait=_wait_strategy(policy),
        retry=retry_if_exception(_is_transient),
        sleep=policy.sleep,
        before_sleep=_log_retry,
        reraise=True,
    )


def _check_status(response: httpx.Response, what: str) -> None:
    """Raise a retryable error for 429/5xx and a final :class:`DownloadError` for any other failure status."""
    status = response.status_code
    if status < 400:
        return
    if status == 429 or status >= 500:
        raise _RetryableStatus(status, str(response.url), _parse_retry_after(response.headers.get("Retry-After")))
    hints = {
        401: "the data may need a login or be restricted: download it by hand from the challenge page",
        403: "the data may need a login or be restricted: download it by hand from the challenge page",
        404: "the file or record may have moved; check the task's data source and report it",
    }
    raise DownloadError(f"{what}: {response.url} answered HTTP {status} {response.reason_phrase}",
                        hint=hints.get(status, "check the URL; this error is not retried"))


# ---- verification ------------------------------------------------------------------------------------------------
def verify_file(path: Path, *, size: int | None = None, md5: str | None = None,
                sha256: str | None = None) -> list[str]:
    """What differs between ``path`` and the published size/checksums (empty: it matches all that is known)."""
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        return [f"size {actual_size} bytes, expected {size}"]
    expected = {name: value for name, value in (("md5", md5), ("sha256", sha256)) if value is not None}
    actual = file_digests(path, tuple(expected)) if expected else {}
    return [f"{name} {actual[name]}, expected {value}" for name, value in expected.items() if actual[name] != value]


# ---- planning: what to fetch --------------------------------------------------------------------------------------
def zenodo_base_url() -> str:
    return (os.environ.get(ZENODO_URL_ENV) or DEFAULT_ZENODO_URL).rstrip("/")


def _plain_name(name: str, origin: str) -> str:
    if not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise DownloadError(f"{origin} names a file {name!r} that is not a plain file name; refusing to write it")
    return name


def _agree(pinned: Any, published: Any, what: str, name: str, origin: str) -> Any:
    """The task.yaml pin and the published value must agree where both exist (else the record has changed)."""
    if pinned is not None and published is not None and pinned != published:
        raise DownloadError(f"{origin} publishes {what} {published} for {name}, but the task pins {pinned}",
                            hint="the record has changed since the task was written; report it (nothing was "
                                 "downloaded)")
    return pinned if pinned is not None else published


def zenodo_targets(client: httpx.Client, source: DataSource, policy: RetryPolicy) -> list[FileTarget]:
    """The files of a Zenodo source, as published by the records API."""
    origin = f"Zenodo record {source.record}"
    url = f"{zenodo_base_url()}/api/records/{source.record}"

    def fetch() -> Any:
        response = client.get(url)
        _check_status(response, f"listing {origin}")
        return response.json()

    try:
        record = _retrying(policy)(fetch)
    except ValueError as exc:  # JSON decoding
        raise DownloadError(f"{origin}: {url} did not return JSON ({exc})") from None
    except (httpx.HTTPError, _RetryableStatus) as exc:
        attempts = policy.attempts if _is_transient(exc) else 1
        raise DownloadError(f"could not list {origin} at {url} after {attempts} attempt(s): {exc}",
                            hint="check the network (or $" + ZENODO_URL_ENV + ") and run the command again") from None
    entries = record.get("files") if isinstance(record, dict) else None
    if not isinstance(entries, list):
        raise DownloadError(f"{origin}: {url} lists no files (restricted or unpublished record?)")
    published: dict[str, dict[str, Any]] = {}
    for entry in entries:
        key = _plain_name(str(entry.get("key", "")), origin)
        published[key] = entry
    wanted = source.files or tuple(RemoteFile(name=key) for key in published)
    targets = []
    for remote in wanted:
        entry = published.get(remote.name)
        if entry is None:
            raise DownloadError(f"{origin} has no file {remote.name!r} (it has: {', '.join(sorted(published))})",
                                hint="the record has changed since the task was written; report it")
        algorithm, _, digest = str(entry.get("checksum") or "").partition(":")
        api_md5 = digest.lower() if algorithm.lower() == "md5" and digest else None
        link = (entry.get("links") or {}).get("self") or f"{url}/files/{remote.name}/content"
        targets.append(FileTarget(
            name=remote.name, url=link, origin=origin,
            size=_agree(remote.size, entry.get("size"), "size", remote.name, origin),
            md5=_agree(remote.md5, api_md5, "md5", remote.name, origin),
            sha256=remote.sha256,
        ))
    return targets


def _direct_targets(source: DataSource) -> list[FileTarget]:
    if source.kind == "figshare":
        origin = f"figshare {source.url}"
        return [FileTarget(name=_plain_name(f.name, origin), url=str(source.url), origin=origin, size=f.size,
                           md5=f.md5, sha256=f.sha256) for f in source.files]
    return [FileTarget(name=_plain_name(f.name, str(f.url)), url=str(f.url), origin=str(f.url), size=f.size,
                       md5=f.md5, sha256=f.sha256) for f in source.files]


# ---- transfer ---------------------------------------------------------------------------------------------------
class _Bar:
    """One progress bar (a no-op when progress is off)."""

    def __init__(self, progress: Progress, name: str) -> None:
        self._progress = progress
        self._task: TaskID = progress.add_task(name, total=None)

    def reset(self, total: int | None, completed: int) -> None:
        self._progress.update(self._task, total=total, completed=completed)

    def advance(self, n: int) -> None:
        self._progress.advance(self._task, n)


def _content_range_start(value: str | None) -> int | None:
    """The first byte of ``Content-Range: bytes <start>-<end>/<total>``."""
    if not value or not value.startswith("bytes "):
        return None
    start = value[6:].split("-", 1)[0].strip()
    return int(start) if start.isdigit() else None


def _transfer(client: httpx.Client, target: FileTarget, part: Path, bar: _Bar) -> None:
    """One attempt: append the missing bytes of ``target`` to ``part`` (from the start if it cannot resume)."""
    offset = part.stat().st_size if part.exists() else 0
    if target.size is not None and offset > target.size:
        part.unlink()
        offset = 0
    if target.size is not None and offset == target.size:
        return
    if target.size is not None:
        free = shutil.disk_usage(part.parent).free
        if free < target.size - offset:
            raise DownloadError(
                f"{target.name} needs {target.size - offset} more bytes but {part.parent} has {free} free",
                hint="free some space or choose another data folder with --data-dir / $REXMLE_DATA_DIR")
    # identity encoding: byte offsets must count the file's own bytes, and raw chunks are written as they arrive,
    # so that an interrupted transfer keeps everything received
    headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={offset}-"} if offset else {})}
    with client.stream("GET", target.url, headers=headers) as response:
        if offset and response.status_code == 416:  # our part file is not a prefix the server recognises
            part.unlink()
            raise _IncompleteTransfer(f"the server refused to resume {target.name}; starting over")
        _check_status(response, f"downloading {target.name} ({target.origin})")
        resumed = offset > 0 and response.status_code == 206
        if resumed and _content_range_start(response.headers.get("Content-Range")) != offset:
            part.unlink()
            raise _IncompleteTransfer(f"the server resumed {target.name} at the wrong byte; starting over")
        if not resumed:
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else target.size
        bar.reset(total, offset)
        if resumed:
            log.info("resuming %s at byte %d", target.name, offset)
        with part.open("ab" if resumed else "wb") as fh:
            for chunk in response.iter_raw():
                fh.write(chunk)
                bar.advance(len(chunk))
    if target.size is not None and part.stat().st_size < target.size:
        raise _IncompleteTransfer(f"{target.name}: got {part.stat().st_size} of {target.size} bytes")


def download_file(client: httpx.Client, target: FileTarget, downloads: Path, *, policy: RetryPolicy,
                  bar: _Bar) -> Path:
    """Fetch one file into ``downloads`` (resuming, retrying, verifying); returns its path."""
    final = downloads / target.name
    if final.is_file():
        problems = verify_file(final, size=target.size, md5=target.md5, sha256=target.sha256)
        if not problems:
            log.info("%s is already downloaded and verified", target.name)
            return final
        log.warning("%s is present but does not verify (%s); downloading it again", target.name, "; ".join(problems))
        final.unlink()
    part = final.with_name(final.name + PART_SUFFIX)
    log.info("downloading %s from %s", target.name, target.origin)
    try:
        _retrying(policy)(_transfer, client, target, part, bar)
    except (httpx.HTTPError, _RetryableStatus, _IncompleteTransfer) as exc:
        attempts = policy.attempts if _is_transient(exc) else 1
        raise DownloadError(
            f"could not download {target.name} from {target.url} after {attempts} attempt(s): {exc}",
            hint=f"run the same command again later; it resumes from {part}" if part.exists() else None,
        ) from None
    problems = verify_file(part, size=target.size, md5=target.md5, sha256=target.sha256)
    if problems:
        part.unlink()
        raise ChecksumMismatchError(
            f"{target.name} from {target.origin} does not match its published checksum: {'; '.join(problems)}",
            hint="the corrupt download was deleted; run the command again to fetch it anew (if it fails again, "
                 "the published file has changed: report it)",
        )
    os.replace(part, final)
    return final


# ---- manual sources ------------------------------------------------------------------------------------------
def _manual_problems(source: DataSource, downloads: Path) -> tuple[list[Path], list[str]]:
    """(files in place and verified, one message per missing file); a present but wrong file raises."""
    present, missing = [], []
    for remote in source.files:
        path = downloads / _plain_name(remote.name, f"{source.kind} source")
        if not path.is_file():
            missing.append(f"{remote.name}: {source.instructions}\n    place it at {path}")
            continue
        problems = verify_file(path, size=remote.size, md5=remote.md5, sha256=remote.sha256)
        if problems:
            raise ChecksumMismatchError(
                f"{path} (placed by hand) is not the expected file: {'; '.join(problems)}",
                hint=f"replace it with the right file ({source.instructions})",
            )
        present.append(path)
    return present, missing


# ---- entry point -------------------------------------------------------------------------------------------------
@contextmanager
def _progress(enabled: bool | None) -> Iterator[Progress]:
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=console,
        disable=not (console.is_terminal if enabled is None else enabled),
    ) as progress:
        yield progress


def make_client() -> httpx.Client:
    return httpx.Client(
        follow_redirects=True,
        timeout=httpx.Timeout(30.0, read=120.0),
        headers={"User-Agent": f"rexmle-tasks/{__version__}"},
    )


def fetch_sources(sources: Sequence[DataSource], downloads: Path, *, progress: bool | None = None,
                  policy: RetryPolicy | None = None, client: httpx.Client | None = None) -> list[Path]:
    """Fetch every file of ``sources`` into ``downloads`` (see module docstring); returns their paths.

    Manual files are checked after the automatic downloads, so one run fetches everything it can; then a single
    :class:`ManualDownloadRequired` lists every file still to be placed by hand. ``progress``: None = bars only on a
    terminal.
    """
    policy = policy or RetryPolicy()
    downloads.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    missing: list[str] = []
    own_client = client is None
    http = client or make_client()
    try:
        with _progress(progress) as bars:
            for source in sources:
                if source.kind in ("gdrive", "manual"):
                    present, absent = _manual_problems(source, downloads)
                    paths += present
                    if source.optional:
                        for message in absent:
                            log.info("optional file not present, going on without it: %s", message)
                    else:
                        missing += absent
                    continue
                targets = zenodo_targets(http, source, policy) if source.kind == "zenodo" else _direct_targets(source)
                for target in targets:
                    paths.append(download_file(http, target, downloads, policy=policy, bar=_Bar(bars, target.name)))
    finally:
        if own_client:
            http.close()
    if missing:
        raise ManualDownloadRequired(
            f"{len(missing)} file(s) cannot be downloaded automatically:\n  - " + "\n  - ".join(missing),
            hint="place them there and run the same command again",
        )
    return paths
