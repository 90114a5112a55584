"""The published run-format schema: one JSON Schema file per record of a run folder and of a group report.

The files ship as package data in ``rexmle_agents/results/schema/`` and are generated from the typed records, which
are also what reads run folders, so the two cannot drift: ``python -m rexmle_agents.results.schemas --check`` fails
when a file differs from the models (a test runs it), ``--write`` regenerates them.

| file | describes |
|---|---|
| ``spec.schema.json`` | ``spec.json`` (:class:`~rexmle_agents.harness.spec.RunSpec`) |
| ``status.schema.json`` | ``status.json`` (:class:`~rexmle_agents.results.records.RunStatus`) |
| ``journal-event.schema.json`` | one line of ``journal.jsonl``: one of the event kinds, chosen by ``kind`` |
| ``grade.schema.json`` | ``grade.json`` (:class:`~rexmle_grade.report.ReportEntry`) |
| ``cluster.schema.json`` | ``cluster.json`` of SLURM runs (:class:`~rexmle_agents.results.records.ClusterRecord`) |
| ``group-report.schema.json`` | ``runs/<group>/report.json`` (:class:`~rexmle_agents.results.report.GroupReport`) |
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from importlib import resources
from typing import Any

from rexmle_agents.harness.spec import RUN_FORMAT_VERSION

SCHEMA_PACKAGE = "rexmle_agents.results.schema"
ID_PREFIX = f"urn:rexmle:run-format:{RUN_FORMAT_VERSION}:"


def _spec() -> dict[str, Any]:
    from rexmle_agents.harness.spec import RunSpec

    return RunSpec.model_json_schema()


def _status() -> dict[str, Any]:
    from rexmle_agents.results.records import RunStatus

    return RunStatus.model_json_schema()


def _journal_event() -> dict[str, Any]:
    from rexmle_agents.results.records import EVENT_ADAPTER

    schema = EVENT_ADAPTER.json_schema()
    schema["title"] = "JournalEvent"
    return schema


def _grade() -> dict[str, Any]:
    from rexmle_grade.report import ReportEntry

    return ReportEntry.model_json_schema()


def _cluster() -> dict[str, Any]:
    from rexmle_agents.results.records import ClusterRecord

    return ClusterRecord.model_json_schema()


def _group_report() -> dict[str, Any]:
    from rexmle_agents.results.report import GroupReport

    return GroupReport.model_json_schema()


SCHEMAS: dict[str, tuple[Callable[[], dict[str, Any]], str]] = {
    "spec": (_spec, "spec.json: what one run is (task, agent, models, seed, limits, resources, sandbox)"),
    "status": (_status, "status.json: where a run stands, what it used and on which hardware"),
    "journal-event": (_journal_event, "one line of journal.jsonl (every event has kind and time, Unix seconds)"),
    "grade": (_grade, "grade.json: the run's final submission graded and ranked against the human board"),
    "cluster": (_cluster, "cluster.json: the SLURM jobs of a run of the SLURM executor, as SLURM reported them"),
    "group-report": (_group_report, "runs/<group>/report.json: every run of a group, the table and its rules"),
}


def schema_text(name: str) -> str:
    """The JSON Schema of ``name`` as generated from the records (what the shipped file must hold)."""
    make, description = SCHEMAS[name]
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"{ID_PREFIX}{name}",
              "description": description, "x-rexmle-run-format": RUN_FORMAT_VERSION, **make()}
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def file_name(name: str) -> str:
    return f"{name}.schema.json"


def load_schema(name: str) -> dict[str, Any]:
    """A shipped schema file, parsed."""
    if name not in SCHEMAS:
        raise KeyError(f"no run-format schema {name!r}; known: {', '.join(SCHEMAS)}")
    return json.loads(resources.files(SCHEMA_PACKAGE).joinpath(file_name(name)).read_text(encoding="utf-8"))


def stale_files() -> list[str]:
    """Shipped files that differ from what the records generate."""
    folder = resources.files(SCHEMA_PACKAGE)
    stale = []
    for name in SCHEMAS:
        path = folder.joinpath(file_name(name))
        if not path.is_file() or path.read_text(encoding="utf-8") != schema_text(name):
            stale.append(file_name(name))
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="regenerate the shipped schema files")
    parser.add_argument("--check", action="store_true", help="exit 1 when a shipped file is out of date")
    args = parser.parse_args(argv)
    if args.write:
        folder = resources.files(SCHEMA_PACKAGE)
        for name in SCHEMAS:
            target = folder.joinpath(file_name(name))
            with resources.as_file(target) as path:
                path.write_text(schema_text(name), encoding="utf-8")
            print(f"wrote {file_name(name)}")
        return 0
    stale = stale_files()
    if stale:
        print("out of date: " + ", ".join(stale) + " (run python -m rexmle_agents.results.schemas --write)")
        return 1
    print(f"run-format schema {RUN_FORMAT_VERSION}: {len(SCHEMAS)} files up to date")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
