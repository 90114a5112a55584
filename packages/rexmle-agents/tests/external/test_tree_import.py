"""The import of an external agent's tree is incremental and bounded (issue 31).

A fake agent in a real sandbox grows an AIDE-layout ``journal.json`` step by step to about 16 MiB and thousands of
nodes (rewriting it whole each time, as AIDE does) while it makes model calls through the relay: the harness reads
only what was appended (bytes read stay linear in the file's final size), no model call waits on parsing, the
harness's peak memory grows by far less than a whole parse of the file would take, the node cap ends the import
with a journaled reason while the run goes on and is graded, and a node that wrote no submission of its own is
never snapshotted (issue 34, item 6). The reader itself is checked on files written here: nodes and parents equal
a whole parse, a torn file is read again later, a file rewritten differently is re-read whole a bounded number of
times, an oversized node record is skipped without being parsed, and the size cap is a reason, not a stall.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.external.trees import (
    MAX_CODE_CHARS,
    AideJournalReader,
    TreeIncomplete,
    TreeLimitError,
    parse_aide_journal,
)
from rexmle_agents.models import ModelResponse
from rexmle_agents.safe_workspace import Workspace

STEPS = 60
PER_STEP = 50  # 3000 nodes, about 16 MiB
CAP = 2000  # reached after 40 steps
NO_OWN_SUBMISSION = 30  # the newest node of this step has the best metric of all but writes no submission

FAKE_AGENT = r'''
import json, os, sys, time, urllib.request, uuid
relay, steps, per_step, no_own = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs("work/logs", exist_ok=True)
os.makedirs("work/working", exist_ok=True)
ids = [line.split(",")[0] for line in open("/workspace/data/sample_submission/submission.csv").read().split()[1:]]
lines = ["epoch %d, batch %d, loss 0.%06d\n" % (i // 40, i % 40, i) for i in range(110)]
records, parents, latencies = [], {}, []
def node(index, newest, step):
    key = uuid.uuid4().hex
    good = newest
    metric = (1000.0 if step == no_own else float(step)) if good else None
    code = "import pandas as pd\n" + "x = 1  # padding\n" * 60
    if index == 5:
        code = "# a long script\n" * 20000  # 320 kB: imported cut, with a marker
    record = {"code": code, "plan": "plan of node %d" % index, "step": index, "id": key, "ctime": time.time(),
              "parent": None, "children": [], "_term_out": lines, "exec_time": 1.5, "exc_type": None,
              "exc_info": None, "exc_stack": None, "analysis": "review %d" % index,
              "metric": {"value": metric, "maximize": True if good else None}, "is_buggy": not good}
    if records and index % 7:
        parents[key] = json.loads(records[index // 2])["id"]
    records.append(json.dumps(record, separators=(",", ":")))
for step in range(steps):
    for k in range(per_step):
        node(len(records), k == per_step - 1, step)
    if step != no_own:  # the newest node's own submission (its score column says which step wrote it)
        with open("work/working/submission.csv", "w") as out:
            out.write("image_id,quality_score\n" + "".join("%s,%d\n" % (i, step) for i in ids))
    text = '{"nodes":[' + ",".join(records) + '],"node2parent":' + json.dumps(parents, separators=(",", ":")) \
        + ',"__version":"2"}'
    with open("work/logs/journal.json", "w") as out:  # rewritten in place, like AIDE
        out.write(text)
    body = json.dumps({"model": "rexmle-code", "messages": [{"role": "user", "content": "step %d" % step}]})
    started = time.monotonic()
    request = urllib.request.Request(relay + "/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=600).read()
    latencies.append(time.monotonic() - started)
json.dump({"latencies": latencies, "journal_bytes": len(text)}, open("work/report.json", "w"))
'''


def _memory() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def test_a_large_growing_tree_is_imported_incrementally_and_bounded(aideml_env: Any, run_external: Any,
                                                                    spec_file: Any) -> None:
    path = spec_file(
        seed_python_random=False,
        files={"agent/fake.py": FAKE_AGENT.replace("{", "{{").replace("}", "}}")},
        command=["{python}", "{agent_dir}/fake.py", "{relay_url}", str(STEPS), str(PER_STEP), str(NO_OWN_SUBMISSION)],
        outputs={"submission": "agent/work/working", "snapshot": "per_node",
                 "tree": {"format": "aide-journal", "path": "agent/work/logs/journal.json"}})
    reset = Path("/proc/self/clear_refs")
    try:
        reset.write_text("5")  # the peak (VmHWM) starts again from now
    except OSError:
        pytest.skip("this kernel cannot reset a process's peak memory (/proc/self/clear_refs)")
    before = _memory()
    outcome = run_external("external", lambda *a: ModelResponse(text="ok"), roles=("code",),
                           config={"spec": str(path), "tree_max_nodes": CAP})
    peak_growth = _memory()["VmHWM"] - before["VmRSS"]
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid"
    run_dir = outcome.run_dir
    journal = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    report = json.loads((run_dir / "workspace" / "agent" / "work" / "report.json").read_text())
    size = report["journal_bytes"]
    assert size > 15 * 2**20

    # the node cap ended the import with a reason; the run went on to its end
    stopped = [e for e in journal if e["kind"] == "warning" and "tree stopped" in e["message"]]
    assert len(stopped) == 1 and f"the tree has {CAP} nodes" in stopped[0]["message"]
    assert len(report["latencies"]) == STEPS
    summary = next(e for e in journal if e["kind"] == "log" and e["message"].startswith("imported "))
    assert summary["nodes"] == CAP and summary["import_stopped"]

    # linear: every byte of the file was read about once, although it was rewritten 40 times before the cap
    assert summary["tree_bytes_read"] < 2 * size, summary
    assert summary["rereads"] == 0
    # no model call waited for parsing: the calls' bookkeeping and the agent's own view of its calls are short
    assert summary["longest_call_wait_s"] < 10, summary
    assert max(report["latencies"]) < 30, report["latencies"]
    # the harness's peak memory grew by far less than one whole parse of a 16 MiB journal takes
    print(f"harness peak memory growth {peak_growth / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB tree; "
          f"bytes read {summary['tree_bytes_read'] / 2**20:.1f} MiB; longest call wait "
          f"{summary['longest_call_wait_s']:.3f} s; call latency max {max(report['latencies']):.2f} s")
    assert peak_growth < 150 * 2**20  # the committed whole-file import: 185 MiB here

    # the tree as imported: text fields bounded with a marker, steps and parents kept
    states = [e["state"] for e in journal if e["kind"] == "agent_state" and e.get("key") == "scaffold"]
    from rexmle_agents.scaffolds.tree import Tree

    tree = Tree.from_states(states)
    assert len(tree) == CAP
    assert len(tree[5].code) < MAX_CODE_CHARS + 200 and "were not imported" in tree[5].code
    assert tree[0].execution is not None and len(tree[0].execution.output_tail) <= 4100
    assert sum(1 for n in tree if n.parent is not None) > CAP // 2
    full_states = sum(1 for s in states if not s.get("delta"))
    assert full_states <= 12  # the tree doubles between full states: linear in its size

    # snapshots: the newest node of each step that wrote its own submission; never the node that wrote none
    snapshots = [e for e in journal if e["kind"] == "snapshot"]
    newest_of = {PER_STEP * (s + 1) - 1: s for s in range(CAP // PER_STEP)}
    snapped = {e["metadata"]["node"] for e in snapshots}
    assert snapped <= set(newest_of) and newest_of_step(NO_OWN_SUBMISSION) not in snapped
    assert len(snapped) >= CAP // PER_STEP - 3  # a boundary the importer cannot place is dropped, never guessed
    assert not tree[newest_of_step(NO_OWN_SUBMISSION)].snapshot_id  # metric 1000, but no submission of its own
    final = (run_dir / "final" / "submission" / "submission.csv").read_text().splitlines()
    assert final[1].endswith(f",{CAP // PER_STEP - 1}")  # the best node with its own submission: the last step's


def newest_of_step(step: int) -> int:
    return PER_STEP * (step + 1) - 1


# ---------------------------------------------------------------------------------------------------------------
# the reader on files written here


def _record(index: int, *, code: str = "print(1)\n", buggy: bool = False) -> dict[str, Any]:
    return {"code": code, "plan": f"plan {index}", "step": index, "id": uuid.uuid4().hex, "ctime": time.time(),
            "parent": None, "children": [], "_term_out": [f"line {i}\n" for i in range(30)], "exec_time": 0.5,
            "exc_type": None, "analysis": "ok", "metric": {"value": float(index), "maximize": False},
            "is_buggy": buggy}


def _write(path: Path, nodes: list[dict[str, Any]], parents: dict[str, str]) -> bytes:
    data = json.dumps({"nodes": nodes, "node2parent": parents, "__version": "2"}, separators=(",", ":")).encode()
    path.write_bytes(data)
    return data


def test_the_reader_reads_only_what_was_appended(tmp_path: Path) -> None:
    fs = Workspace(tmp_path)
    reader = AideJournalReader(max_bytes=64 * 2**20)
    nodes: list[dict[str, Any]] = []
    parents: dict[str, str] = {}
    imported = []
    for step in range(200):
        for _ in range(2):
            record = _record(len(nodes), buggy=len(nodes) % 4 == 0)
            if len(nodes) > 3:
                parents[record["id"]] = nodes[len(nodes) // 2]["id"]
            nodes.append(record)
        data = _write(tmp_path / "journal.json", nodes, parents)
        read = reader.read(fs, "journal.json")
        assert read is not None and read.newest == nodes[-1]["id"] and len(read.nodes) == 2, step
        imported += read.nodes
        assert reader.read(fs, "journal.json").nodes == []  # unchanged: nothing read again
    whole = parse_aide_journal(data)
    assert [(n.key, n.parent, n.metric, n.is_buggy, n.output) for n in imported] == \
        [(n.key, n.parent, n.metric, n.is_buggy, n.output) for n in whole]
    # linear: about the file once plus a few kB per read, where whole reads would add up to 100 times the file
    assert reader.bytes_read < 2 * len(data) + 4096 * 200 and reader.rereads == 0
    print(f"bytes read {reader.bytes_read} for a final file of {len(data)} bytes, read 200 times")


def test_a_torn_file_is_read_again_and_a_rewritten_one_whole(tmp_path: Path) -> None:
    fs = Workspace(tmp_path)
    reader = AideJournalReader(max_bytes=64 * 2**20)
    nodes = [_record(i) for i in range(5)]
    data = _write(tmp_path / "journal.json", nodes, {})
    (tmp_path / "journal.json").write_bytes(data[: len(data) // 2])  # caught while AIDE writes it
    with pytest.raises(TreeIncomplete):
        reader.read(fs, "journal.json")
    _write(tmp_path / "journal.json", nodes, {})
    read = reader.read(fs, "journal.json")
    assert read is not None and [n.key for n in read.nodes] == [n["id"] for n in nodes]
    # rewritten otherwise (an old node changed): read again from the start, only the unknown nodes are new
    nodes[1]["plan"] = "changed " * 20
    nodes.append(_record(5))
    _write(tmp_path / "journal.json", nodes, {nodes[5]["id"]: nodes[1]["id"]})
    read = reader.read(fs, "journal.json")
    assert read is not None and [(n.key, n.parent) for n in read.nodes] == [(nodes[5]["id"], nodes[1]["id"])]
    assert reader.rereads == 1


def test_bounds_a_huge_node_and_a_huge_file(tmp_path: Path) -> None:
    fs = Workspace(tmp_path)
    reader = AideJournalReader(max_bytes=8 * 2**20, max_node_bytes=2**20)
    huge = _record(1, code="x = 1\n" * 400_000)  # a 2.4 MB record: skipped, never parsed
    nodes = [_record(0), huge, _record(2, code="y = 2\n" * 30_000)]
    _write(tmp_path / "journal.json", nodes, {nodes[2]["id"]: huge["id"]})
    read = reader.read(fs, "journal.json")
    assert read is not None and [n.key for n in read.nodes] == [n["id"] for n in nodes]
    stub = read.nodes[1]
    assert (stub.metric, stub.maximize, stub.is_buggy) == (1.0, False, False) and "per-node cap" in stub.code
    assert read.nodes[2].parent == huge["id"] and len(read.skipped) == 1
    assert len(read.nodes[2].code) < MAX_CODE_CHARS + 200 and read.nodes[2].code.endswith("were not imported]")
    nodes += [_record(3, code="z\n" * 3_000_000)]
    _write(tmp_path / "journal.json", nodes, {})
    with pytest.raises(TreeLimitError, match="over the import's cap"):
        reader.read(fs, "journal.json")
