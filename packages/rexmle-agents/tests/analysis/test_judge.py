"""The judge through a scripted backend: expected verdicts on the example runs, quotes that are not in the run
rejected, malformed answers and refusals asked again and then recorded as errors (never raised), chunks, and a
judge that sees neither the agent, the model nor the agent's summaries."""

from __future__ import annotations

import re

from rexmle_agents.analysis.evidence import TaskBrief, run_text, task_brief
from rexmle_agents.analysis.examples import ExampleJudge
from rexmle_agents.analysis.factors import load_rubrics
from rexmle_agents.analysis.judge import prompt_version
from rexmle_agents.models import ModelResponse, ToolCall, Usage
from rexmle_agents.results.trajectory import trajectory
from rexmle_grade.errors import ModelAPIError

RUBRICS = load_rubrics()


def call(demonstrated: bool, evidence: list[dict], reason: str = "because", *, parse_error: str | None = None) \
        -> ModelResponse:
    arguments = {} if parse_error else {"demonstrated": demonstrated, "evidence": evidence, "reason": reason}
    return ModelResponse(tool_calls=(ToolCall(id="c1", name="submit_verdict", arguments=arguments,
                                              parse_error=parse_error),),
                         usage=Usage(input_tokens=2000, output_tokens=100), finish_reason="tool_calls")


def judge_one(make_judge, run, factor: str, script, **options):
    judge = make_judge(script, **options)
    text = run_text(run)
    return judge, judge.judge(text, RUBRICS.get(factor), task_brief(run.spec.task_id))


def test_the_scripted_judge_gives_the_expected_verdicts(example_runs, make_judge) -> None:
    expected = {("ldct-rich", "data_augmentation"): "demonstrated",
                ("ldct-plain", "data_augmentation"): "not_demonstrated",
                ("isles-threshold", "post_processing"): "demonstrated",
                ("ldct-plain", "post_processing"): "not_demonstrated",
                ("ldct-rich", "heterogeneous_ensembles"): "demonstrated",
                ("isles-failures", "heterogeneous_ensembles"): "not_demonstrated",
                ("ldct-rich", "seed_fold_ensembles"): "unverified"}  # the example judge paraphrases this one
    for (name, factor), status in expected.items():
        _judge, verdict = judge_one(make_judge, example_runs[name], factor, ExampleJudge())
        assert verdict.status == status, (name, factor, verdict.reason)
        assert verdict.demonstrated is (status == "demonstrated")
        assert verdict.judge is not None and verdict.judge.model == "scripted/judge"
        assert verdict.judge.prompt_version == prompt_version() and verdict.rubric_version == RUBRICS.label
        if status == "demonstrated":
            assert any(q.verified for q in verdict.evidence)
        if status == "unverified":
            assert verdict.unverified_claims == 1 and not any(q.verified for q in verdict.evidence)


def test_a_run_without_code_or_output_costs_no_call(make_judge, code_run) -> None:
    judge = make_judge([])
    verdict = judge.judge(code_run(), RUBRICS.get("data_augmentation"), TaskBrief(task_id="ldct-iqa"))
    assert verdict.status == "not_demonstrated" and not verdict.chunks
    assert judge.model.backend.requests == []


def test_a_quote_that_is_not_in_the_run_is_rejected(example_runs, make_judge) -> None:
    invented = "train_transforms = Compose([RandFlipd(keys=['image'], prob=0.5)])"
    _judge, verdict = judge_one(make_judge, example_runs["ldct-plain"], "data_augmentation",
                                [call(True, [{"node": 1, "quote": invented}])])
    assert verdict.status == "unverified" and not verdict.demonstrated
    assert verdict.evidence[0].quote == invented and "not found" in verdict.evidence[0].problem
    # the same claim with a real quote from the wrong node is rejected too, naming the right node
    real = "w = np.linalg.solve(x.T @ x + np.eye(3), x.T @ y)"
    _judge, verdict = judge_one(make_judge, example_runs["ldct-plain"], "data_augmentation",
                                [call(True, [{"node": 0, "quote": real}])])
    assert verdict.status == "unverified" and "it is in node 1" in verdict.evidence[0].problem


def test_malformed_answers_are_asked_again(example_runs, make_judge) -> None:
    good = call(True, [{"node": "1", "quote": "labels, count = ndimage.label(mask)"}])
    judge, verdict = judge_one(make_judge, example_runs["isles-threshold"], "post_processing",
                               ["I think so. {demonstrated: maybe", call(False, [], parse_error="not JSON: {"), good])
    assert verdict.status == "demonstrated" and verdict.chunks[0].attempts == 3
    assert verdict.chunks[0].input_tokens == 4000  # every attempt is counted (the text answer reported none)
    third = judge.model.backend.requests[2][0]
    assert third[-1].role == "user" and "could not be used" in third[-1].content
    assert any(m.role == "tool" and "not accepted" in m.content for m in third)  # the bad call was answered


def test_refusals_and_model_errors_are_recorded_as_errors_never_raised(example_runs, make_judge) -> None:
    refusal = ModelResponse(text="I'm sorry, but I can't help with evaluating this.", usage=Usage(input_tokens=10))
    judge, verdict = judge_one(make_judge, example_runs["ldct-rich"], "data_augmentation", [refusal] * 3)
    assert verdict.status == "error" and not verdict.demonstrated and "refused" in verdict.reason
    assert verdict.chunks[0].attempts == 3 and judge.stopped == ""
    _judge, verdict = judge_one(make_judge, example_runs["ldct-rich"], "data_augmentation",
                                [ModelAPIError("scripted/judge: HTTP 400 from the provider: bad request")])
    assert verdict.status == "error" and "HTTP 400" in verdict.reason


def test_a_json_answer_in_text_is_accepted(example_runs, make_judge) -> None:
    text = 'Here is my verdict:\n```json\n{"demonstrated": true, "evidence": [{"node": 1, "quote": ' \
           '"labels, count = ndimage.label(mask)"}], "reason": "small components are removed"}\n```'
    _judge, verdict = judge_one(make_judge, example_runs["isles-threshold"], "post_processing", [text])
    assert verdict.status == "demonstrated"


def test_long_runs_are_judged_in_chunks_and_any_chunk_proves(example_runs, make_judge) -> None:
    def flips_only(messages, tools, config):  # proves the factor only from the chunk that holds the flip
        prompt = messages[1].content
        found = re.search(r"===== node (\d+) [^\n]*\n(?:(?!===== end)[\s\S])*?image = np\.fliplr\(image\)", prompt)
        return call(bool(found), [{"node": int(found.group(1)), "quote": "image = np.fliplr(image)"}] if found else [])

    run = example_runs["ldct-rich"]
    judge, verdict = judge_one(make_judge, run, "data_augmentation", flips_only, chunk_chars=2500)
    chunks = run_text(run).chunks(2500)
    assert len(chunks) >= 3 and len(verdict.chunks) == len(chunks) == len(judge.model.backend.requests)
    assert verdict.status == "demonstrated"
    assert sum(1 for c in verdict.chunks if c.claimed) < len(chunks)  # not every chunk showed it
    assert all(len(c.text) <= 2500 for c in chunks)


def test_the_judge_sees_neither_agent_nor_model_nor_the_agents_own_summaries(example_runs, make_judge) -> None:
    run = example_runs["ldct-rich"]
    judge, _verdict = judge_one(make_judge, run, "data_augmentation", ExampleJudge())
    system, user = judge.model.backend.requests[0][0]
    prompt = system.content + user.content
    for secret in (run.run_id, "aide", run.spec.models["code"], "seed"):
        assert secret not in prompt, secret
    for node in trajectory(run).nodes:
        assert node.plan not in prompt and node.analysis not in prompt
    assert user.content.index("</run>") < user.content.index("Data augmentation")  # the rubric comes last
