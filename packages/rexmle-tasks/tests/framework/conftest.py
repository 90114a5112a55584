"""Fixtures for the framework tests: a tiny task of our own (family + grader + task folder) and a loopback server
that imitates Zenodo's records API and file downloads (with Range support and injectable faults).

The toy task keeps these tests independent of the real families and graders: a "case" is a text file holding one
number (the image) and a label file holding twice that number; the grader scores a predicted value per case by
mean absolute error.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import socket
import threading
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rexmle_grade import grader as grader_module
from rexmle_grade.grader import (
    ANSWERS_CSV,
    CaseInput,
    Direction,
    Grader,
    MetricSpec,
    TestManifest,
    read_answers,
    write_submission_csv,
)
from rexmle_grade.schema import FileColumn, SubmissionSchema, ValueColumn
from rexmle_tasks import base, registry
from rexmle_tasks.base import PrepareContext, Task, TaskFamily
from rexmle_tasks.metadata import load_metadata

TOY_ID = "toy-task"
TOY_RECORD = "424242"
TOY_ARCHIVE = "toy_data.zip"
TOY_SEED = 73019251


class ToyGrader(Grader):
    grader_id = TOY_ID
    title = "toy regression"
    schema = SubmissionSchema(id_column="case_id", columns=(ValueColumn("score", float, "predicted value"),))
    metrics = (MetricSpec("mae", Direction.LOWER_BETTER, "mean absolute error", best=0.0),)
    answer_columns = ("label_path",)
    conventions = ("the toy task's only convention",)

    def load_prediction(self, case: CaseInput, column: FileColumn) -> Any:
        raise NotImplementedError("the toy schema has no file columns")

    def score_case(self, case: CaseInput) -> dict[str, Any]:
        truth = float(case.answer_path("label_path").read_text())
        return {"abs_error": abs(float(case.row["score"]) - truth)}

    def aggregate(self, cases: Sequence[Mapping[str, Any]], private_dir: Path) -> dict[str, float]:
        return {"mae": float(np.mean([c["abs_error"] for c in cases]))}

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        answers = read_answers(private_dir, self)
        write_submission_csv(dest, self.schema, [
            {"case_id": i, "score": (private_dir / answers[i]["label_path"]).read_text().strip()}
            for i in TestManifest.read(public_dir).ids])

    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        write_submission_csv(dest, self.schema,
                             [{"case_id": i, "score": "0.0"} for i in TestManifest.read(public_dir).ids])


def write_zip(path: Path, members: Mapping[str, bytes]) -> None:
    """A byte-identical archive for the same members (fixed timestamps, sorted order)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            zf.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), members[name])


class ToyFamily(TaskFamily):
    name = "toy"

    def write_synthetic_download(self, downloads: Path, *, cases: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        members = {}
        for i in range(1, cases + 1):
            value = round(float(rng.uniform(0, 10)), 4)
            members[f"toy_data/images/case_{i:03d}.txt"] = f"{value}\n".encode()
            members[f"toy_data/labels/case_{i:03d}.txt"] = f"{2 * value}\n".encode()
        write_zip(downloads / TOY_ARCHIVE, members)

    def case_ids(self, raw: Path) -> list[str]:
        return sorted(p.stem for p in (raw / "toy_data" / "labels").glob("*.txt"))

    def prepare(self, ctx: PrepareContext) -> TestManifest:
        images, labels = ctx.raw / "toy_data" / "images", ctx.raw / "toy_data" / "labels"
        (ctx.public / "train" / "images").mkdir(parents=True)
        (ctx.public / "test" / "images").mkdir(parents=True)
        (ctx.private / "labels").mkdir(parents=True)
        with (ctx.public / "train" / "labels.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["case_id", "score"])
            for case in ctx.split.train:
                shutil.copy(images / f"{case}.txt", ctx.public / "train" / "images" / f"{case}.txt")
                writer.writerow([case, (labels / f"{case}.txt").read_text().strip()])
        with (ctx.private / ANSWERS_CSV).open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["case_id", "label_path"])
            for case in ctx.split.test:
                shutil.copy(images / f"{case}.txt", ctx.public / "test" / "images" / f"{case}.txt")
                shutil.copy(labels / f"{case}.txt", ctx.private / "labels" / f"{case}.txt")
                writer.writerow([case, f"labels/{case}.txt"])
        return TestManifest(ids=tuple(ctx.split.test))


TOY_YAML = f"""\
id: {{task_id}}
title: "Toy task"
competition: "Toy challenge: framework tests"
year: 2024
url: https://toy.example.org
licence: CC0
modality: text
dim: 2d
task_type: regression
grader: {TOY_ID}
family: toy
raw_group: {{raw_group}}
data_sources:
  - kind: zenodo
    record: "{TOY_RECORD}"
    files:
      - name: {TOY_ARCHIVE}
cases: {{{{total: 10, train: 8, test: 2}}}}
split: {{{{seed: {TOY_SEED}, test_fraction: 0.2}}}}
leaderboard:
  source_url: https://toy.example.org
  via: "made up for the framework tests"
  retrieved: 2026-11-22
  phase: "final test phase"
synthetic_cases: 10
version: "1.0.0"
"""

TOY_DESCRIPTION = """\
# Toy task

Predict twice the number in each `test/images/<id>.txt`; {{n_train}} training cases, {{n_test}} test cases.

## Evaluation
{{metrics}}

Conventions:
{{conventions}}

## Submission format
{{submission_format}}
"""

TOY_LEADERBOARD = """\
rank,team,mean_position,mae,mae_position
1,alpha,1.0,0.5,1.0
2,beta,2.0,1.5,2.0
3,gamma,3.0,4.0,3.0
"""


def write_task_folder(root: Path, task_id: str, *, raw_group: str | None = None) -> Path:
    folder = root / task_id
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(TOY_YAML.format(task_id=task_id, raw_group=raw_group or "null"))
    (folder / "description.md").write_text(TOY_DESCRIPTION)
    (folder / "leaderboard.csv").write_text(TOY_LEADERBOARD)
    return folder


@dataclass
class ToyWorld:
    """The toy task, installed in the registries for one test; ``add`` installs more toy tasks."""

    task: Task
    folders: list[Path]
    monkeypatch: pytest.MonkeyPatch
    root: Path

    def add(self, task_id: str, *, raw_group: str | None = None) -> Task:
        folder = write_task_folder(self.root, task_id, raw_group=raw_group)
        self.folders.append(folder)
        registry.all_tasks.cache_clear()
        return Task(meta=load_metadata(folder / "task.yaml"), folder=folder)

    def replace(self, task: Task) -> None:
        """Make the registry return ``task`` (e.g. with other data sources) for its id."""
        tasks = {**registry.all_tasks(), task.id: task}
        self.monkeypatch.setattr(registry, "all_tasks", lambda: tasks)


@pytest.fixture
def toy(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[ToyWorld]:
    grader_module._load_all()  # the real graders first, so that ours is simply one more
    monkeypatch.setitem(grader_module._REGISTRY, TOY_ID, ToyGrader)
    monkeypatch.setitem(base._FAMILIES, ToyFamily.name, ToyFamily)
    root = tmp_path_factory.mktemp("challenges")
    folders = [write_task_folder(root, TOY_ID)]
    real_folders = registry._task_folders
    monkeypatch.setattr(registry, "_task_folders", lambda: [*real_folders(), *folders])
    registry.all_tasks.cache_clear()
    world = ToyWorld(task=registry.get_task(TOY_ID), folders=folders, monkeypatch=monkeypatch, root=root)
    yield world
    monkeypatch.undo()  # before clearing the cache: a test may have replaced all_tasks itself
    registry.all_tasks.cache_clear()


# ---- loopback Zenodo ------------------------------------------------------------------------------------------
@dataclass
class Fault:
    """What the server does instead of answering normally (once per queued fault)."""

    status: int | None = None  # answer with this status and an empty body
    headers: dict[str, str] = field(default_factory=dict)
    drop_after: int | None = None  # send this many body bytes, then cut the connection
    corrupt: bool = False  # serve the file with its first byte changed
    ignore_range: bool = False  # answer 200 with the whole file even when a Range was asked for


@dataclass
class FakeZenodo:
    base_url: str
    records: dict[str, dict[str, bytes]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)  # other paths (figshare, plain URLs)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    published_md5: dict[tuple[str, str], str] = field(default_factory=dict)  # override what the API claims

    def add_record(self, record: str, files: Mapping[str, bytes]) -> None:
        self.records[record] = dict(files)

    def file_path(self, record: str, name: str) -> str:
        return f"/api/records/{record}/files/{name}/content"

    def url(self, path: str) -> str:
        return self.base_url + path

    def fail(self, path: str, *, times: int = 1, **fault: Any) -> None:
        """The next ``times`` requests for ``path`` misbehave as :class:`Fault` ``(**fault)`` says."""
        self.faults.setdefault(path, []).extend(Fault(**fault) for _ in range(times))

    def file_requests(self, record: str, name: str) -> list[str | None]:
        return [rng for path, rng in self.requests if path == self.file_path(record, name)]

    def record_json(self, record: str) -> dict[str, Any]:
        return {"id": int(record), "files": [
            {"key": name, "size": len(data),
             "checksum": "md5:" + self.published_md5.get((record, name), hashlib.md5(data).hexdigest()),
             "links": {"self": self.url(self.file_path(record, name))}}
            for name, data in self.records[record].items()]}

    def content(self, path: str) -> bytes | None:
        for record, files in self.records.items():
            for name, data in files.items():
                if path == self.file_path(record, name):
                    return data
        return self.blobs.get(path)


def _make_handler(server_state: FakeZenodo) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def _send(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            wanted = self.headers.get("Range")
            server_state.requests.append((path, wanted))
            queue = server_state.faults.get(path) or []
            fault = queue.pop(0) if queue else Fault()
            if fault.status is not None:
                self._send(fault.status, b"", fault.headers)
                return
            record = path.removeprefix("/api/records/")
            if path.startswith("/api/records/") and record in server_state.records:
                self._send(200, json.dumps(server_state.record_json(record)).encode(),
                           {"Content-Type": "application/json"})
                return
            data = server_state.content(path)
            if data is None:
                self._send(404, b"not found")
                return
            if fault.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start = 0
            if wanted and not fault.ignore_range:
                start = int(wanted.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    return
            body = data[start:]
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if fault.drop_after is not None:
                self.wfile.write(body[:fault.drop_after])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


@pytest.fixture
def zenodo(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeZenodo]:
    """A loopback Zenodo; ``$REXMLE_ZENODO_URL`` points at it for the test."""
    state = FakeZenodo(base_url="")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(state))
    server.daemon_threads = True
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    monkeypatch.setenv("REXMLE_ZENODO_URL", state.base_url)
    yield state
    server.shutdown()
    server.server_close()
    thread.join()
