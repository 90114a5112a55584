"""Downloads against a loopback Zenodo: checksums, resume, retries, manual sources, progress."""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
from pathlib import Path

import pytest

from rexmle_grade.errors import ChecksumMismatchError, DownloadError, ManualDownloadRequired
from rexmle_tasks.download import PART_SUFFIX, RetryPolicy, _parse_retry_after, fetch_sources, verify_file
from rexmle_tasks.metadata import DataSource, RemoteFile

RECORD = "7960856"
# big enough to arrive in several chunks and to be cut in the middle
ARCHIVE = bytes(range(256)) * 4096 + b"tail"
SIDE_FILE = b"a small side file\n"


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def policy(sleeps: Sleeps) -> RetryPolicy:
    return RetryPolicy(attempts=4, initial_wait=0.01, max_wait=0.02, sleep=sleeps)


@pytest.fixture
def record(zenodo):
    zenodo.add_record(RECORD, {"ISLES-2022.zip": ARCHIVE, "center_ids.xlsx": SIDE_FILE})
    return zenodo


def zenodo_source(*names: str, **pins: str) -> DataSource:
    return DataSource(kind="zenodo", record=RECORD, files=tuple(RemoteFile(name=n, **pins) for n in names))


def test_selected_files_are_downloaded_and_md5_checked(record, tmp_path: Path, policy: RetryPolicy) -> None:
    paths = fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    assert paths == [tmp_path / "ISLES-2022.zip"]
    assert paths[0].read_bytes() == ARCHIVE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ISLES-2022.zip"]  # no side file, no part file
    assert record.requests[0] == (f"/api/records/{RECORD}", None)


def test_empty_file_list_fetches_the_whole_record(record, tmp_path: Path, policy: RetryPolicy) -> None:
    fetch_sources([DataSource(kind="zenodo", record=RECORD)], tmp_path, policy=policy)
    assert (tmp_path / "ISLES-2022.zip").read_bytes() == ARCHIVE
    assert (tmp_path / "center_ids.xlsx").read_bytes() == SIDE_FILE


def test_interrupted_transfer_resumes_with_range(record, tmp_path: Path, policy: RetryPolicy,
                                                 sleeps: Sleeps) -> None:
    record.fail(record.file_path(RECORD, "ISLES-2022.zip"), drop_after=300_000)
    fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    assert (tmp_path / "ISLES-2022.zip").read_bytes() == ARCHIVE
    ranges = record.file_requests(RECORD, "ISLES-2022.zip")
    assert ranges[0] is None and len(ranges) == 2
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 300_000  # only the missing tail was asked for
    assert len(sleeps) == 1
    assert not (tmp_path / f"ISLES-2022.zip{PART_SUFFIX}").exists()


def test_part_file_from_an_earlier_run_is_continued(record, tmp_path: Path, policy: RetryPolicy) -> None:
    (tmp_path / f"ISLES-2022.zip{PART_SUFFIX}").write_bytes(ARCHIVE[:1000])
    fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    assert (tmp_path / "ISLES-2022.zip").read_bytes() == ARCHIVE
    assert record.file_requests(RECORD, "ISLES-2022.zip") == ["bytes=1000-"]


def test_server_ignoring_range_restarts_from_zero(record, tmp_path: Path, policy: RetryPolicy) -> None:
    (tmp_path / f"ISLES-2022.zip{PART_SUFFIX}").write_bytes(b"x" * 1000)
    record.fail(record.file_path(RECORD, "ISLES-2022.zip"), ignore_range=True)
    fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    assert (tmp_path / "ISLES-2022.zip").read_bytes() == ARCHIVE


def test_corrupt_download_is_deleted_and_reported(record, tmp_path: Path, policy: RetryPolicy) -> None:
    record.fail(record.file_path(RECORD, "ISLES-2022.zip"), corrupt=True)
    with pytest.raises(ChecksumMismatchError) as info:
        fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    message = str(info.value)
    assert hashlib.md5(ARCHIVE).hexdigest() in message  # what was expected...
    corrupt = bytes([ARCHIVE[0] ^ 0xFF]) + ARCHIVE[1:]
    assert hashlib.md5(corrupt).hexdigest() in message  # ...and what arrived
    assert list(tmp_path.iterdir()) == []
    fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)  # a second run succeeds
    assert (tmp_path / "ISLES-2022.zip").read_bytes() == ARCHIVE


def test_pinned_sha256_is_checked_too(record, tmp_path: Path, policy: RetryPolicy) -> None:
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        fetch_sources([zenodo_source("ISLES-2022.zip", sha256="0" * 64)], tmp_path, policy=policy)
    fetch_sources([zenodo_source("ISLES-2022.zip", sha256=hashlib.sha256(ARCHIVE).hexdigest())], tmp_path,
                  policy=policy)
    assert (tmp_path / "ISLES-2022.zip").is_file()


def test_pin_that_disagrees_with_the_record_fails_before_downloading(record, tmp_path: Path,
                                                                     policy: RetryPolicy) -> None:
    with pytest.raises(DownloadError, match="record has changed"):
        fetch_sources([zenodo_source("ISLES-2022.zip", md5="0" * 32)], tmp_path, policy=policy)
    assert record.file_requests(RECORD, "ISLES-2022.zip") == []


def test_503_is_retried_then_succeeds(record, tmp_path: Path, policy: RetryPolicy, sleeps: Sleeps) -> None:
    record.fail(record.file_path(RECORD, "ISLES-2022.zip"), status=503, times=2)
    fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    assert (tmp_path / "ISLES-2022.zip").read_bytes() == ARCHIVE
    assert len(sleeps) == 2 and all(0 <= s <= policy.max_wait for s in sleeps)


def test_record_listing_is_retried(record, tmp_path: Path, policy: RetryPolicy, sleeps: Sleeps) -> None:
    record.fail(f"/api/records/{RECORD}", status=502)
    fetch_sources([zenodo_source("center_ids.xlsx")], tmp_path, policy=policy)
    assert (tmp_path / "center_ids.xlsx").read_bytes() == SIDE_FILE and len(sleeps) == 1


def test_retry_after_is_honoured(record, tmp_path: Path, policy: RetryPolicy, sleeps: Sleeps) -> None:
    record.fail(record.file_path(RECORD, "center_ids.xlsx"), status=429, headers={"Retry-After": "7"})
    fetch_sources([zenodo_source("center_ids.xlsx")], tmp_path, policy=policy)
    assert sleeps == [7.0]


def test_retry_after_as_http_date() -> None:
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=30)
    assert 25 <= _parse_retry_after(email.utils.format_datetime(later, usegmt=True)) <= 31
    assert _parse_retry_after("12") == 12.0
    assert _parse_retry_after("soon") is None


def test_404_fails_at_once_with_a_clear_message(record, tmp_path: Path, policy: RetryPolicy,
                                                sleeps: Sleeps) -> None:
    path = record.file_path(RECORD, "ISLES-2022.zip")
    record.fail(path, status=404)
    with pytest.raises(DownloadError) as info:
        fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    assert "HTTP 404" in str(info.value) and path in str(info.value)
    assert sleeps == [] and len(record.file_requests(RECORD, "ISLES-2022.zip")) == 1


def test_persistent_5xx_gives_up_after_the_attempts(record, tmp_path: Path, policy: RetryPolicy) -> None:
    record.fail(record.file_path(RECORD, "ISLES-2022.zip"), status=500, times=policy.attempts)
    with pytest.raises(DownloadError, match=rf"after {policy.attempts} attempt\(s\)"):
        fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    assert len(record.file_requests(RECORD, "ISLES-2022.zip")) == policy.attempts


def test_unusable_url_fails_at_once(tmp_path: Path, policy: RetryPolicy, sleeps: Sleeps) -> None:
    source = DataSource(kind="url", files=(RemoteFile(name="a.zip", url="ftp://example.org/a.zip"),))
    with pytest.raises(DownloadError, match=r"after 1 attempt\(s\)"):
        fetch_sources([source], tmp_path, policy=policy)
    assert sleeps == []


def test_file_missing_from_record_names_what_it_has(record, tmp_path: Path, policy: RetryPolicy) -> None:
    with pytest.raises(DownloadError) as info:
        fetch_sources([zenodo_source("ISLES-2023.zip")], tmp_path, policy=policy)
    assert "ISLES-2023.zip" in str(info.value) and "ISLES-2022.zip" in str(info.value)


def test_complete_verified_file_is_not_fetched_again(record, tmp_path: Path, policy: RetryPolicy) -> None:
    (tmp_path / "ISLES-2022.zip").write_bytes(ARCHIVE)
    fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    assert record.file_requests(RECORD, "ISLES-2022.zip") == []


def test_present_but_wrong_file_is_fetched_again(record, tmp_path: Path, policy: RetryPolicy) -> None:
    (tmp_path / "ISLES-2022.zip").write_bytes(b"an older version")
    fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy)
    assert (tmp_path / "ISLES-2022.zip").read_bytes() == ARCHIVE


def test_figshare_and_url_sources_use_the_named_target(zenodo, tmp_path: Path, policy: RetryPolicy) -> None:
    zenodo.blobs["/ndownloader/articles/14806362/versions/1"] = ARCHIVE
    zenodo.blobs["/files/labels.csv"] = SIDE_FILE
    sources = [
        DataSource(kind="figshare", url=zenodo.url("/ndownloader/articles/14806362/versions/1"),
                   files=(RemoteFile(name="avt_dataset.zip", sha256=hashlib.sha256(ARCHIVE).hexdigest()),)),
        DataSource(kind="url", files=(RemoteFile(name="labels.csv", url=zenodo.url("/files/labels.csv"),
                                                 size=len(SIDE_FILE)),)),
    ]
    paths = fetch_sources(sources, tmp_path, policy=policy)
    assert [p.name for p in paths] == ["avt_dataset.zip", "labels.csv"]
    assert paths[0].read_bytes() == ARCHIVE and paths[1].read_bytes() == SIDE_FILE


def test_manual_source_names_the_file_and_where_to_put_it(tmp_path: Path, policy: RetryPolicy) -> None:
    expected = RemoteFile(name="test_dataset.zip", md5=hashlib.md5(ARCHIVE).hexdigest())
    source = DataSource(kind="gdrive", files=(expected,),
                        instructions="download the LDCTIQAC test set from Google Drive id 1DbZ…")
    with pytest.raises(ManualDownloadRequired) as info:
        fetch_sources([source], tmp_path / "downloads", policy=policy)
    message = str(info.value)
    assert str(tmp_path / "downloads" / "test_dataset.zip") in message and "Google Drive id 1DbZ" in message
    (tmp_path / "downloads" / "test_dataset.zip").write_bytes(b"something else")
    with pytest.raises(ChecksumMismatchError, match="placed by hand"):
        fetch_sources([source], tmp_path / "downloads", policy=policy)
    assert (tmp_path / "downloads" / "test_dataset.zip").exists()  # a user's file is never deleted
    (tmp_path / "downloads" / "test_dataset.zip").write_bytes(ARCHIVE)
    assert fetch_sources([source], tmp_path / "downloads", policy=policy) == [tmp_path / "downloads" /
                                                                             "test_dataset.zip"]


def test_optional_manual_file_may_be_absent(tmp_path: Path, policy: RetryPolicy) -> None:
    source = DataSource(kind="gdrive", optional=True, files=(RemoteFile(name="test_dataset.zip"),),
                        instructions="the official test set, if you have it")
    assert fetch_sources([source], tmp_path, policy=policy) == []
    (tmp_path / "test_dataset.zip").write_bytes(ARCHIVE)
    assert fetch_sources([source], tmp_path, policy=policy) == [tmp_path / "test_dataset.zip"]


def test_manual_files_are_reported_after_the_automatic_downloads(record, tmp_path: Path,
                                                                 policy: RetryPolicy) -> None:
    manual = DataSource(kind="manual", files=(RemoteFile(name="test.zip"),), instructions="ask the organisers")
    with pytest.raises(ManualDownloadRequired):
        fetch_sources([manual, zenodo_source("center_ids.xlsx")], tmp_path, policy=policy)
    assert (tmp_path / "center_ids.xlsx").read_bytes() == SIDE_FILE


@pytest.mark.parametrize("progress", [None, True])
def test_progress_on_a_non_terminal(record, tmp_path: Path, policy: RetryPolicy, progress: bool | None,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    fetch_sources([zenodo_source("ISLES-2022.zip")], tmp_path, policy=policy, progress=progress)
    assert (tmp_path / "ISLES-2022.zip").read_bytes() == ARCHIVE
    captured = capsys.readouterr()
    assert captured.out == ""
    bar = "━"  # rich's bar glyph (log lines may reach stderr too, when a CLI test configured logging earlier)
    if progress is None:  # automatic: no terminal, no bars
        assert bar not in captured.err
    else:  # forced: a final plain rendering, without cursor movements
        assert bar in captured.err and "ISLES-2022.zip" in captured.err and "\x1b[" not in captured.err


def test_verify_file_reports_expected_and_actual(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    assert verify_file(path, size=3, md5=hashlib.md5(b"abc").hexdigest()) == []
    assert verify_file(path, size=4) == ["size 3 bytes, expected 4"]
    assert verify_file(path, md5="0" * 32) == [f"md5 {hashlib.md5(b'abc').hexdigest()}, expected {'0' * 32}"]
