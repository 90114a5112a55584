"""What the judge sees of a run, and how its quotes are checked: only code that ran and outputs, never the agent's
summaries of itself; quotes verbatim (whitespace aside) in the node they name; chunks that drop nothing."""

from __future__ import annotations

from rexmle_agents.analysis.evidence import MIN_QUOTE_CHARS, run_text
from rexmle_agents.results.trajectory import trajectory


def test_the_run_text_is_code_and_outputs_never_plans_or_reviews(example_runs) -> None:
    run = example_runs["ldct-rich"]
    nodes = trajectory(run).nodes
    assert any(n.plan for n in nodes) and any(n.analysis for n in nodes)  # the scaffold recorded both ...
    text = "\n".join(c.text for c in run_text(run).chunks())
    for node in nodes:  # ... and neither reaches the judge
        assert node.plan not in text and node.analysis not in text
        assert node.code.strip().splitlines()[0] in text
    assert "VALIDATION_METRIC:" in text  # the outputs do


def test_quotes_are_verified_in_the_node_they_name_whitespace_aside(code_run) -> None:
    run = code_run({"code": "x = load()\nmodel = fit(x,\n            alpha=0.1)\n", "output": "fold 1: dice 0.71\n"},
                   {"code": "print('other node')\n"})
    assert run.verify(0, "model = fit(x, alpha=0.1)").verified  # line breaks and indents do not matter
    assert run.verify(0, "fold 1: dice 0.71").where == "output"
    wrong_node = run.verify(1, "model = fit(x, alpha=0.1)")
    assert not wrong_node.verified and "it is in node 0" in wrong_node.problem
    assert not run.verify(0, "model = fit(x, alpha=1.0)").verified  # not verbatim
    assert not run.verify(7, "model = fit(x, alpha=0.1)").verified  # no such node
    assert "too short" in run.verify(0, "x = load()"[: MIN_QUOTE_CHARS - 1]).problem


def test_comments_and_code_that_never_ran_are_not_evidence(code_run) -> None:
    run = code_run({"code": "y = predict(x)  # keep only the largest connected component\nk = 1  # remove specks\n"},
                   {"code": "labels, n = ndimage.label(mask)\n", "ran": False})
    comment = run.verify(0, "# keep only the largest connected component")
    assert not comment.verified and "comment" in comment.problem
    assert not run.verify(0, "k = 1  # remove specks").verified  # the code in it is too short to prove anything
    # a line quoted whole, comment included, is verified by its code (what the comment claims is the judge's call)
    assert run.verify(0, "y = predict(x)  # keep only the largest connected component").verified
    never = run.verify(1, "labels, n = ndimage.label(mask)")
    assert not never.verified and "never ran" in never.problem


def test_a_long_run_is_cut_into_chunks_that_drop_nothing(code_run) -> None:
    body = "".join(f"value_{i} = compute({i})  # step {i}\n" for i in range(400))  # about 14,000 characters
    run = code_run({"code": body}, {"code": "print('small node')\n"}, {"code": body.replace("value", "other")})
    chunks = run.chunks(5000)
    assert len(chunks) > 3 and all(len(c.text) <= 5000 for c in chunks)
    joined = "\n".join(c.text for c in chunks)
    for i in range(400):  # every line of every node is in some chunk
        assert f"value_{i} = compute({i})" in joined and f"other_{i} = compute({i})" in joined
    assert {n for c in chunks for n in c.nodes} == {0, 1, 2}
    assert [c.index for c in chunks] == list(range(len(chunks))) and {c.total for c in chunks} == {len(chunks)}


def test_the_digest_changes_with_the_content(code_run) -> None:
    assert code_run({"code": "a = 1\n"}).digest != code_run({"code": "a = 2\n"}).digest
    assert code_run({"code": "a = 1\n"}).digest == code_run({"code": "a = 1\n"}).digest
