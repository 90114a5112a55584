"""Import cost of an AIDE-layout journal.json grown node by node: the incremental reader against a whole-file parse.

AIDE rewrites its whole tree after every node. This writes such a file step by step (``--nodes`` nodes, about
``--node-kb`` kB each, ``--per-step`` nodes per rewrite) into a folder and, after every rewrite, reads the new nodes
with :class:`rexmle_agents.external.trees.AideJournalReader` and, separately, parses the whole file as the harness
did before (``parse_aide_journal``). Prints the total and the slowest read of each, bytes read, and the peak memory
one whole parse of the final file takes.

    .venv/bin/python tools/bench_tree_import.py --nodes 3000 --per-step 50
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

from rexmle_agents.external.trees import AideJournalReader, parse_aide_journal
from rexmle_agents.safe_workspace import Workspace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--per-step", type=int, default=50)
    parser.add_argument("--node-kb", type=float, default=4.0)
    args = parser.parse_args()
    lines = [f"epoch {i // 40}, batch {i % 40}, loss 0.{i:06d}\n" for i in range(int(args.node_kb * 1024 / 32))]
    root = Path(tempfile.mkdtemp(prefix="rexmle-bench-tree-"))
    fs, path = Workspace(root), root / "journal.json"
    reader = AideJournalReader(max_bytes=1 << 30)
    records: list[str] = []
    parents: dict[str, str] = {}
    ids: list[str] = []
    incremental, whole, whole_bytes, slowest = 0.0, 0.0, 0, [0.0, 0.0]
    data = b""
    while len(records) < args.nodes:
        for _ in range(args.per_step):
            key = uuid.uuid4().hex
            if ids and len(ids) % 7:
                parents[key] = ids[len(ids) // 2]
            ids.append(key)
            records.append(json.dumps({"code": "x = 1\n" * 150, "plan": "p", "step": len(records), "id": key,
                                       "ctime": time.time(), "_term_out": lines, "exec_time": 1.0, "exc_type": None,
                                       "analysis": "a", "metric": {"value": 0.5, "maximize": True},
                                       "is_buggy": False}, separators=(",", ":")))
        data = ('{"nodes":[' + ",".join(records) + '],"node2parent":' + json.dumps(parents, separators=(",", ":"))
                + ',"__version":"2"}').encode()
        path.write_bytes(data)
        started = time.perf_counter()
        reader.read(fs, "journal.json")
        took = time.perf_counter() - started
        incremental, slowest[0] = incremental + took, max(slowest[0], took)
        started = time.perf_counter()
        parse_aide_journal(path.read_bytes())
        took = time.perf_counter() - started
        whole, slowest[1], whole_bytes = whole + took, max(slowest[1], took), whole_bytes + len(data)
    tracemalloc.start()
    parse_aide_journal(path.read_bytes())
    peak_whole = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    fresh = AideJournalReader(max_bytes=1 << 30)
    fresh.read(fs, "journal.json")
    peak_incremental = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    steps = -(-args.nodes // args.per_step)
    print(f"{len(records)} nodes, final file {len(data) / 2**20:.1f} MiB, rewritten {steps} times")
    print(f"incremental: {incremental:.2f} s in all, slowest read {slowest[0] * 1000:.1f} ms, "
          f"{reader.bytes_read / 2**20:.1f} MiB read; one read of the whole file from scratch: "
          f"{peak_incremental / 2**20:.0f} MiB peak (the nodes it returns included)")
    print(f"whole-file parse: {whole:.2f} s in all, slowest {slowest[1] * 1000:.1f} ms, "
          f"{whole_bytes / 2**20:.0f} MiB read; one parse of the final file: {peak_whole / 2**20:.0f} MiB peak")


if __name__ == "__main__":
    main()
