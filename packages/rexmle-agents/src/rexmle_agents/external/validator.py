"""``python -m rexmle_agents.external.validator --port 5000 --files-dir DIR``: the submission-format validator an
original agent posts to, served inside the sandbox on its own loopback (started by the forwarder before the agent).

ML-Master checks every good node's CSV with ``POST /validate`` (a multipart form whose ``file`` field is the CSV;
header ``exp-id``) after ``GET /health``, and reads ``is_valid`` and ``result`` from the JSON answer. Here the
answer comes from ``rexmle grade validate`` (public information only; the sandbox's ``REXMLE_GRADER_ID`` and
``REXMLE_PUBLIC_DIR`` name the task). The CSV is checked in a fresh folder beside the files it names: they are
hard-linked from ``--files-dir`` (the agent's submission folder), never copied or followed as links.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any

MAX_CSV_BYTES = 256 * 2**20
_LOCK = threading.Lock()  # one validation at a time: they read the same files


def _posted_file(content_type: str, body: bytes) -> bytes | None:
    """The ``file`` field of a multipart/form-data body (or the whole body when it is not multipart)."""
    if not content_type.startswith("multipart/"):
        return body
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "file":
            return part.get_payload(decode=True)
    return None


def _link_named_files(csv_bytes: bytes, files_dir: Path, folder: Path) -> None:
    """Hard-link every regular file the CSV names (relative paths inside ``files_dir``) into ``folder``."""
    import csv
    import io

    rows = csv.reader(io.StringIO(csv_bytes.decode("utf-8", errors="replace")))
    next(rows, None)
    for row in rows:
        for cell in row:
            rel = PurePosixPath(cell.strip())
            if not cell.strip() or rel.is_absolute() or ".." in rel.parts or len(rel.parts) > 32:
                continue
            source = files_dir.joinpath(*rel.parts)
            target = folder.joinpath(*rel.parts)
            try:
                if source.is_file() and not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    # the name itself: a link stays a link, and validation refuses it
                    os.link(source, target, follow_symlinks=False)
            except OSError:
                continue


def validate_csv(csv_bytes: bytes, files_dir: Path, scratch: Path, task: str) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="validate-", dir=scratch))
    try:
        (folder / "submission.csv").write_bytes(csv_bytes)
        _link_named_files(csv_bytes, files_dir, folder)
        rexmle = Path(sys.executable).with_name("rexmle")
        command = [str(rexmle), "grade", "validate", task, str(folder)] if rexmle.exists() else \
            [sys.executable, "-m", "rexmle_grade.cli", "grade", "validate", task, str(folder)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        text = (done.stdout + done.stderr).strip()
        if done.returncode not in (0, 1):
            return {"error": "the validator could not run", "details": text[-4000:]}
        return {"is_valid": done.returncode == 0, "result": text[-8000:]}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("rexmle validator: " + (format % args) + "\n")

    def _json(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/health":
            self._json(200, {"status": "running"})
        else:
            self._json(404, {"error": "not found", "details": self.path})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/validate":
            self._json(404, {"error": "not found", "details": self.path})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_CSV_BYTES:
            self._json(400, {"error": "bad request", "details": f"a body of 1 to {MAX_CSV_BYTES} bytes is expected"})
            return
        data = _posted_file(self.headers.get("Content-Type", ""), self.rfile.read(length))
        if data is None:
            self._json(400, {"error": "bad request", "details": "no `file` field in the form"})
            return
        with _LOCK:
            answer = validate_csv(data, self.server.files_dir, self.server.scratch, self.server.task)
        self._json(500 if "error" in answer else 200, answer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rexmle_agents.external.validator", description=__doc__)
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--files-dir", type=Path, required=True, help="the agent's submission folder")
    parser.add_argument("--scratch", type=Path, default=None, help="a folder on the same file system")
    parser.add_argument("--task", default=os.environ.get("REXMLE_TASK_ID", ""))
    args = parser.parse_args(argv)
    if not args.task:
        print("error: no task: run inside a rexmle sandbox or pass --task", file=sys.stderr)
        return 2
    scratch = args.scratch or args.files_dir.parent / ".rexmle-validate"
    scratch.mkdir(parents=True, exist_ok=True)
    args.files_dir.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _Handler)
    server.files_dir, server.scratch, server.task = args.files_dir, scratch, args.task
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
