"""``python -m rexmle_agents.validate [SUBMISSION_DIR]``: check a submission from inside the sandbox.

It uses public information only (the task's public folder, mounted read-only at ``/workspace/data``), needs no
network and no server, and prints every problem. The harness sets ``REXMLE_GRADER_ID`` and ``REXMLE_PUBLIC_DIR``
in the sandbox; outside one, pass ``--grader`` and ``--public-dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rexmle_agents.validate", description=__doc__.splitlines()[0])
    parser.add_argument("submission", nargs="?", default=None, help="default: <workspace>/submission")
    parser.add_argument("--grader", default=os.environ.get("REXMLE_GRADER_ID"))
    parser.add_argument("--public-dir", default=os.environ.get("REXMLE_PUBLIC_DIR"))
    args = parser.parse_args(argv)
    if not args.grader or not args.public_dir:
        print("error: no task known: run inside a rexmle sandbox, or pass --grader and --public-dir", file=sys.stderr)
        return 2
    from rexmle_grade.errors import RexmleError
    from rexmle_grade.grader import get_grader
    from rexmle_grade.validation import validate_submission

    workspace = os.environ.get("REXMLE_WORKSPACE", ".")
    folder = Path(args.submission or Path(workspace) / "submission")
    try:
        report = validate_submission(get_grader(args.grader), folder, Path(args.public_dir), deep=True)
    except RexmleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if report.ok:
        print(f"valid: {report.n_rows} rows, every test case present, every file readable")
        return 0
    print(f"INVALID submission in {folder}: {len(report.problems)} problem(s)")
    for problem in report.problems:
        print(f"  - {problem}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
