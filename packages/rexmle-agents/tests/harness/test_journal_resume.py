"""The journal file and what a resumed run reads back from it: torn and corrupt lines, the attempts, time and steps
of earlier attempts, the steps a crash left open, the usage totals, and the snapshot a run submits."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from pathlib import Path

import pytest
from pydantic import BaseModel

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.runner import agent_choice, choose_final, journal_state
from rexmle_grade.errors import RexmleError

# ---- the journal file -------------------------------------------------------------------------------------------


def test_each_event_is_one_line_with_kind_time_step_and_data(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    first = journal.append("step_started", step=3, note="é", where=Path("a/b"), ids=(1, 2), tags={"x"})
    second = journal.append("run_started")
    lines = journal.path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and "é" in lines[0]  # not escaped
    assert json.loads(lines[0]) == {"kind": "step_started", "time": first["time"], "step": 3, "note": "é",
                                    "where": "a/b", "ids": [1, 2], "tags": ["x"]}
    assert first["where"] == Path("a/b") and first["step"] == 3  # the event as given is returned
    assert "step" not in second and set(second) == {"kind", "time"}
    assert journal.events() == [json.loads(line) for line in lines]
    assert oct(journal.path.stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_models_are_journalled_as_json_and_unknown_objects_are_refused(tmp_path: Path) -> None:
    class Point(BaseModel):
        x: int
        when: dt.date

    journal = Journal(tmp_path / "journal.jsonl")
    journal.append("point", value=Point(x=1, when=dt.date(2025, 1, 2)))
    assert journal.events()[0]["value"] == {"x": 1, "when": "2025-01-02"}
    with pytest.raises(TypeError, match="cannot journal a object"):
        journal.append("bad", value=object())
    assert len(journal.events()) == 1  # nothing half-written


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    payload = "x" * 5000

    def write(worker: int) -> None:
        for i in range(25):
            journal.append("event", worker=worker, i=i, payload=payload)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    events = journal.events()
    assert len(events) == 100 and all(e["payload"] == payload for e in events)


def test_each_event_is_forced_to_disk_before_append_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append("run_started")
    synced: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        synced.append((info.st_ino, info.st_size))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    journal.append("step_started", step=1)
    info = journal.path.stat()
    assert synced == [(info.st_ino, info.st_size)]  # the journal file, once the new line was written


def test_appending_leaves_no_file_open(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append("run_started")
    before = len(os.listdir("/proc/self/fd"))
    for step in range(20):
        journal.append("step_started", step=step)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_missing_journal_has_no_events_and_needs_no_repair(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "absent.jsonl")
    assert journal.events() == [] and journal.repair() == 0
    assert not journal.path.exists()


def test_a_torn_last_line_is_skipped_and_cut_before_the_next_append(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append("one")
    journal.append("two")
    intact = journal.path.read_bytes()
    with journal.path.open("ab") as handle:
        handle.write(b'{"kind": "three", "ti')
    assert [e["kind"] for e in journal.events()] == ["one", "two"]
    assert journal.repair() == len(b'{"kind": "three", "ti')
    assert journal.path.read_bytes() == intact
    assert journal.repair() == 0  # a journal ending with a newline is left alone
    journal.append("four")
    assert [e["kind"] for e in journal.events()] == ["one", "two", "four"]


def test_a_journal_torn_in_its_first_line_is_emptied(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.path.write_bytes(b'{"kind": "run_sta')
    assert journal.events() == []
    assert journal.repair() == 17 and journal.path.read_bytes() == b""
    journal.path.write_bytes(b"")
    assert journal.repair() == 0


def test_blank_lines_are_ignored(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.path.write_text('{"kind": "a", "time": 1}\n\n   \n{"kind": "b", "time": 2}\n')
    assert [e["kind"] for e in journal.events()] == ["a", "b"]


def test_a_corrupt_line_before_the_last_is_an_error_naming_the_line(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.path.write_text('{"kind": "a", "time": 1}\nnot json\n{"kind": "b", "time": 2}\n')
    with pytest.raises(RexmleError, match="line 2 is not a journal event") as caught:
        journal.events()
    assert "start the run afresh" in (caught.value.hint or "")


@pytest.mark.parametrize("line", ['["kind"]', '{"time": 1}', '"text"'])
def test_a_line_that_is_not_an_event_object_is_an_error(tmp_path: Path, line: str) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.path.write_text(f'{{"kind": "a", "time": 1}}\n{line}\n')
    with pytest.raises(RexmleError, match="line 2 has no 'kind': not a rexmle journal"):
        journal.events()


def test_iterating_reads_events_lazily_in_order(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    for kind in ("a", "b", "c"):
        journal.append(kind)
    events = journal.iter_events()
    assert next(events)["kind"] == "a"
    assert [e["kind"] for e in events] == ["b", "c"]


# ---- resuming: what earlier attempts left ----------------------------------------------------------------------


def totals(calls: int, cost: float) -> dict[str, object]:
    return {"calls": calls, "cost_usd": cost, "usage": {"input_tokens": 10 * calls, "output_tokens": calls}}


def test_a_fresh_run_has_no_attempts_time_or_steps() -> None:
    state = journal_state([], {})
    assert (state.attempts, state.consumed_s, state.steps_started, state.open_steps) == (0, 0.0, 0, ())
    assert state.run_totals.calls == 0 and state.steps_finished == 0


def test_attempts_time_and_steps_of_earlier_attempts_are_added_up() -> None:
    events = [
        {"kind": "run_started", "time": 100.0},
        {"kind": "step_started", "time": 101.0, "step": 1},
        {"kind": "step_finished", "time": 110.0, "step": 1},
        {"kind": "step_started", "time": 111.0, "step": 2},  # the crash came during step 2
        {"kind": "model_call", "time": "1970-01-01T00:02:00+00:00", "run_totals": totals(2, 0.5)},  # t = 120
        {"kind": "run_resumed", "time": 500.0},
        {"kind": "step_interrupted", "time": 500.5, "step": 2},
        {"kind": "step_started", "time": 501.0, "step": 3},
        {"kind": "step_finished", "time": 530.0, "step": 3},
        {"kind": "step_started", "time": 531.0, "step": 4},
        {"kind": "snapshot", "time": 540.0},
    ]
    state = journal_state(events, {})
    assert state.attempts == 2
    assert state.consumed_s == pytest.approx((120.0 - 100.0) + (540.0 - 500.0))  # the gap between attempts is free
    assert state.steps_started == 4
    assert state.open_steps == (4,)  # step 2 was closed as interrupted; step 4 is left open by this crash
    assert state.steps_finished == 2  # steps 1 and 3: an interrupted step does not count against the step limit
    assert state.run_totals.calls == 2 and state.run_totals.cost_usd == 0.5


def test_the_status_heartbeat_wins_when_it_saw_more_time_than_the_journal() -> None:
    events = [{"kind": "run_started", "time": 10.0}, {"kind": "step_started", "time": 12.0, "step": 1}]
    assert journal_state(events, {"elapsed_s": 30.5}).consumed_s == 30.5
    assert journal_state(events, {"elapsed_s": 1.0}).consumed_s == 2.0
    assert journal_state(events, {"elapsed_s": None}).consumed_s == 2.0


def test_events_without_a_time_do_not_move_the_clock() -> None:
    events = [{"kind": "run_started", "time": 10.0}, {"kind": "step_started", "time": 15.0, "step": 1},
              {"kind": "note"}]
    assert journal_state(events, {}).consumed_s == 5.0


def test_events_before_any_attempt_started_or_without_any_time_cost_no_time() -> None:
    assert journal_state([{"kind": "note", "time": 50.0}, {"kind": "note", "time": 80.0}], {}).consumed_s == 0.0
    untimed = [{"kind": "run_started"}, {"kind": "step_started", "step": 1}]
    state = journal_state(untimed, {})
    assert (state.attempts, state.consumed_s, state.steps_started, state.open_steps) == (1, 0.0, 1, (1,))


def test_a_clock_that_went_backwards_costs_no_negative_time() -> None:
    events = [{"kind": "run_started", "time": 100.0}, {"kind": "note", "time": 90.0},
              {"kind": "run_resumed", "time": 200.0}, {"kind": "note", "time": 210.0}]
    assert journal_state(events, {}).consumed_s == 10.0


def test_the_latest_run_totals_are_kept() -> None:
    events = [{"kind": "run_started", "time": 0.0},
              {"kind": "model_call", "time": 1.0, "run_totals": totals(1, 0.1)},
              {"kind": "model_call", "time": 2.0, "run_totals": totals(3, 0.4)}]
    state = journal_state(events, {})
    assert state.run_totals.calls == 3 and state.run_totals.usage.input_tokens == 30


def test_open_steps_are_those_started_and_never_closed() -> None:
    events = [{"kind": "run_started", "time": 0.0}]
    for step in (1, 2, 3):
        events.append({"kind": "step_started", "time": float(step), "step": step})
    events.append({"kind": "step_finished", "time": 4.0, "step": 2})
    state = journal_state(events, {})
    assert state.open_steps == (1, 3) and state.steps_started == 3


# ---- the final submission --------------------------------------------------------------------------------------


def snapshot(name: str, *, valid: bool = True, score: float | None = None) -> dict[str, object]:
    event: dict[str, object] = {"kind": "snapshot", "snapshot": name, "valid": valid}
    if score is not None:
        event["selection"] = {"score": score}
    return event


def test_without_snapshots_there_is_nothing_to_submit() -> None:
    assert choose_final([]) is None and agent_choice([]) is None


def test_the_latest_snapshot_is_submitted_when_none_is_valid() -> None:
    assert choose_final([snapshot("a", valid=False), snapshot("b", valid=False)]) == "b"


def test_the_latest_valid_snapshot_beats_a_later_invalid_one() -> None:
    assert choose_final([snapshot("a"), snapshot("b"), snapshot("c", valid=False)]) == "b"


def test_the_agents_own_last_choice_beats_the_latest_valid_snapshot() -> None:
    events = [snapshot("a"), {"kind": "final_selected", "snapshot": "a"}, snapshot("b"),
              {"kind": "final_selected", "snapshot": "b"}, snapshot("c")]
    assert choose_final(events) == "b" and agent_choice(events) == "b"


def test_the_best_valid_snapshot_on_the_selection_split_wins_over_the_agents_choice() -> None:
    events = [snapshot("a", score=2.5), snapshot("b", score=1.5), snapshot("c", score=3.0),
              snapshot("d", valid=False, score=1.0), {"kind": "final_selected", "snapshot": "c"}]
    assert choose_final(events) == "b"  # lowest mean position; an invalid one never counts
    assert agent_choice(events) == "c"


def test_among_equal_selection_scores_the_latest_wins() -> None:
    events = [snapshot("a", score=2.0), snapshot("b", score=2.0), snapshot("c", score=4.0)]
    assert choose_final(events) == "b"
    assert choose_final([snapshot("a", score=0.0), snapshot("b", score=1.0)]) == "a"  # a score of 0 still counts


def test_an_attempt_under_a_second_counts_its_own_time_and_a_clock_stepped_back_counts_nothing() -> None:
    events = [{"kind": "run_started", "time": 10.0}, {"kind": "step_started", "time": 10.3, "step": 1},
              {"kind": "run_resumed", "time": 50.0}, {"kind": "snapshot", "time": 52.0}]
    assert journal_state(events, {}).consumed_s == pytest.approx(0.3 + 2.0)
    stepped_back = [{"kind": "run_started", "time": 10.0}, {"kind": "step_started", "time": 9.0, "step": 1},
                    {"kind": "run_resumed", "time": 50.0}, {"kind": "snapshot", "time": 52.0}]
    assert journal_state(stepped_back, {}).consumed_s == pytest.approx(2.0)
    # the attempt still running counts the same way
    assert journal_state(events[:2], {}).consumed_s == pytest.approx(0.3)
    assert journal_state(events[:1], {}).consumed_s == 0.0  # just started
    assert journal_state(stepped_back[:2], {}).consumed_s == 0.0
