"""Progress of running runs, read from their folders while they grow: steps, time, best metric, cost, and the epoch
a training baseline printed; the demo's bar per run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rich.console import Console

from rexmle_agents.demo import follow_epochs
from rexmle_agents.results.live import LiveRuns, live_table


def test_a_growing_journal_is_followed_line_by_line(agent_runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "g" / agent_runs["aide"].name
    shutil.copytree(agent_runs["aide"], run)
    journal = (run / "journal.jsonl").read_bytes()
    lines = journal.splitlines(keepends=True)
    events = [json.loads(line) for line in lines]
    cut = next(i for i, e in enumerate(events) if e["kind"] == "step_finished" and e["step"] == 3) + 1
    (run / "journal.jsonl").write_bytes(b"".join(lines[:cut]) + lines[cut][:25])  # a line still being written
    (run / "status.json").write_text(json.dumps({"state": "running", "steps": 2}))
    watch = LiveRuns([(run, 120.0, 5)])
    live = watch.poll()[0]
    assert (live.state, live.steps) == ("running", 3)
    scored = [e["score"] for e in events[:cut] if e["kind"] == "snapshot" and e["valid"]]
    assert live.best == max(scored) and live.model_calls == sum(e["kind"] == "model_call" for e in events[:cut])
    assert 0 < live.elapsed() < 10**6
    (run / "journal.jsonl").write_bytes(journal)
    (run / "status.json").write_bytes((agent_runs["aide"] / "status.json").read_bytes())
    live = watch.poll()[0]
    assert (live.state, live.steps) == ("finished", 5)
    assert live.best == max(e["score"] for e in events if e["kind"] == "snapshot" and e["valid"])
    console = Console(width=160, record=True)
    console.print(live_table([live]))
    text = console.export_text()
    assert live.run_id in text and "5/5" in text and "/ 2.0m" in text


def test_a_baselines_epochs_make_a_bar_per_run(tmp_path: Path) -> None:
    run = tmp_path / "g" / "isles22.baseline.s0.abc"
    (run / "logs" / "exec").mkdir(parents=True)
    name = "step0001-exec001-monai-seg"
    events = [{"kind": "run_started", "time": 1.0, "consumed_s": 0.0},
              {"kind": "step_started", "time": 1.0, "step": 1, "step_kind": "baseline",
               "info": {"baseline": "monai-seg", "config": "quick"}},
              {"kind": "exec_started", "time": 1.0, "step": 1, "name": name}]
    (run / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "logs" / "exec" / f"{name}.stderr").write_text("epoch 1/40: loss 0.9\nepoch 8/40: loss 0.5\n")
    watch = LiveRuns([(run, 1800.0, None)])
    live = watch.poll()[0]
    assert live.baseline == "monai-seg (quick)" and live.epoch == (8, 40)
    console = Console(width=160, record=True, force_terminal=False)
    import rexmle_agents.demo as demo

    original, demo.console = demo.console, console
    try:
        with follow_epochs(watch, interval_s=0.05):
            pass
    finally:
        demo.console = original
    assert "isles22 baseline (monai-seg (quick)): epoch 8/40 · running" in console.export_text()
