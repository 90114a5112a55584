"""A judge whose claims were all rejected must not look like one that found nothing: the unverified share stands
beside every capability table (capabilities.csv, the terminal summary) and in the capability figure, and a factor
where rejected claims outnumber demonstrated runs is flagged."""

from __future__ import annotations

import pandas as pd

from rexmle_agents.analysis import cli
from rexmle_agents.analysis.factors import load_rubrics
from rexmle_agents.analysis.frames import analysis_frames, capability_table
from rexmle_agents.analysis.pipeline import analyse_runs
from rexmle_agents.models import ModelResponse, ToolCall, Usage
from rexmle_agents.results.loader import load_runs

FACTOR = "post_processing"


def claims_everything_quotes_nothing(messages, tools, config) -> ModelResponse:
    """A judge that says yes to every factor with a quote found nowhere in any run."""
    arguments = {"demonstrated": True, "reason": "it post-processes",
                 "evidence": [{"node": 0, "quote": "mask = keep_largest_component(mask, minimum=50)"}]}
    return ModelResponse(tool_calls=(ToolCall(id="v", name="submit_verdict", arguments=arguments),),
                         usage=Usage(input_tokens=100, output_tokens=10), finish_reason="tool_calls")


def test_a_judge_whose_claims_were_all_rejected_is_flagged_in_tables_figure_and_summary(example_group, make_judge,
                                                                                       tmp_path) -> None:
    out = tmp_path / "analysis"
    result = analyse_runs(load_runs([example_group]), out, factors=[load_rubrics().get(FACTOR)],
                          judge=make_judge(claims_everything_quotes_nothing), view=False)
    caps = pd.read_csv(out / "capabilities.csv")
    judge = caps[(caps["factor"] == FACTOR) & (caps["source"] == "judge")]
    assert not judge.empty
    assert (judge["demonstrated"] == 0).all() and (judge["share"] == 0.0).all()  # what alone looks like "nothing"
    assert (judge["unverified"] == judge["judged"]).all() and (judge["unverified_share"] == 1.0).all()
    assert judge["unverified_dominates"].all()
    detector = caps[(caps["factor"] == FACTOR) & (caps["source"] == "detector")]
    assert (detector["unverified"] == 0).all() and not detector["unverified_dominates"].any()

    svg = (out / "figures" / "capability-comparison-synthetic.svg").read_text(encoding="utf-8")
    assert 'id="unverified-0"' in svg and "unverified !" in svg

    with cli.console.capture() as captured:
        cli.print_summary(result)
    text = captured.get()
    assert "u?" in text and "unverified claims outnumber its demonstrated ones" in text


def test_the_unverified_share_is_beside_the_share_and_flags_only_where_rejections_outnumber_proofs() -> None:
    rows = []
    for run, status in enumerate(["demonstrated", "demonstrated", "unverified", "not_demonstrated", "error"]):
        rows.append({"run_id": f"r{run}", "data": "synthetic", "agent": "aide", "model": "m", "task_type": "t",
                     "factor": FACTOR, "source": "judge", "status": status,
                     "demonstrated": status == "demonstrated", "judged": status != "error"})
    for run, status in enumerate(["unverified", "unverified", "demonstrated"]):
        rows.append({"run_id": f"s{run}", "data": "synthetic", "agent": "mcts", "model": "m", "task_type": "t",
                     "factor": FACTOR, "source": "judge", "status": status,
                     "demonstrated": status == "demonstrated", "judged": True})
    table = capability_table(pd.DataFrame(rows)).set_index("agent")
    assert table.loc["aide", "unverified"] == 1 and table.loc["aide", "unverified_share"] == 0.25
    assert not table.loc["aide", "unverified_dominates"]  # two proofs, one rejection
    assert table.loc["mcts", "unverified_share"] == 2 / 3 and table.loc["mcts", "unverified_dominates"]


def test_an_empty_analysis_has_the_same_columns() -> None:
    assert {"unverified_share", "unverified_dominates"} <= set(capability_table(analysis_frames([]).verdicts).columns)
