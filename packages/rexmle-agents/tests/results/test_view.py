"""`rexmle view`: one self-contained HTML file, checked as text and in headless Chromium (Debian's `chromium`,
driven by playwright): no console errors, as many tree nodes drawn as the journal holds, a click shows the node's
code, run text never becomes markup, and a screenshot is written as a test artefact."""

from __future__ import annotations

import os
import re
import shutil
import threading
import urllib.request
from pathlib import Path

import pytest

from rexmle_agents.results.loader import load_run, load_runs
from rexmle_agents.results.report import build_group_report
from rexmle_agents.results.trajectory import NodeView, trajectory
from rexmle_agents.results.view import OUTPUT_CHARS, _node_json, render_html, serve, write_view
from rexmle_grade.cli import main

CHROMIUM = os.environ.get("REXMLE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def artefact_dir(tmp_path: Path) -> Path:
    """Where screenshots go: $REXMLE_TEST_ARTEFACTS when set (CI keeps it), else the test's tmp folder."""
    folder = Path(os.environ.get("REXMLE_TEST_ARTEFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_page_is_one_self_contained_file(group_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["view", str(group_dir), "-o", str(tmp_path / "g.html")]) == 0
    text = (tmp_path / "g.html").read_text()
    assert "view:" in capsys.readouterr().out
    assert not re.search(r"<script[^>]+src=|<link[^>]+stylesheet|@import|https?://(?!www\.w3\.org/2000/svg)", text)
    assert text.count("<script") == 2  # the inline data and the inline script
    # run text goes into the data block escaped: it can neither close the block nor open markup
    assert "</script><script>document.title" not in text and "\\u003c/script>\\u003cscript>document.title" in text


def test_long_outputs_are_cut_with_a_pointer_to_the_full_log() -> None:
    from rexmle_agents.results.trajectory import Execution

    node = NodeView(id=7, parent=None, stage="draft", status="done", step=3, code="print(1)\n")
    node.executions.append(Execution(name="step0003-exec001-node7", exit_code=0, stopped_by=None, seconds=1.0,
                                     output_tail="x" * 10_000 + "END",
                                     log_files=("logs/exec/step0003-exec001-node7.stdout",)))
    shown = _node_json(node, (0.0, 0.0), "/runs/g/r")["executions"][0]["output"]
    assert len(shown) < OUTPUT_CHARS + 200 and shown.endswith("END")
    assert "/runs/g/r/logs/exec/step0003-exec001-node7.stdout" in shown


def test_serve_answers_on_the_loopback(agent_runs: dict[str, Path], tmp_path: Path) -> None:
    page = write_view(load_runs([agent_runs["sample-s0"]]), tmp_path / "v.html")
    server = serve(page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        with urllib.request.urlopen(f"http://{host}:{port}/", timeout=10) as answer:
            assert answer.read() == page.read_bytes()
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (bash tools/setup.sh "
                                                                 "--dev installs it)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (bash tools/setup.sh --dev does it as root)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def open_page(browser, url: str) -> tuple[object, list[str]]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
    page.goto(url)
    return page, errors


def test_the_group_and_run_pages_in_chromium(browser, group_dir: Path, agent_runs: dict[str, Path],
                                             tmp_path: Path) -> None:
    runs = load_runs([group_dir])
    html = tmp_path / "group.html"
    html.write_text(render_html(runs, build_group_report(runs, replicates=50)))
    page, errors = open_page(browser, html.as_uri())
    shots = artefact_dir(tmp_path)
    page.screenshot(path=str(shots / "view-group.png"), full_page=True)
    assert page.locator("a.run").count() == 5  # a link from the table to every run
    assert page.title() != "owned"
    for name, run_dir in agent_runs.items():
        run = load_run(run_dir)
        path = trajectory(run)
        page.goto(f"{html.as_uri()}#run={run.run_id}")
        if path.kind == "tree":  # the journal's nodes: the scaffold's last saved tree
            expected = len(saved_nodes(run))
        else:  # the journal's steps
            expected = len(run.journal().of_kind("step_started"))
        assert page.locator("svg .node").count() == expected >= 1, name
        assert page.locator("svg .node.final").count() == 1, name
    aide = load_run(agent_runs["aide"])
    page.goto(f"{html.as_uri()}#run={aide.run_id}")
    nodes = saved_nodes(aide)
    marked = next(n for n in nodes if "not markup" in n["code"])
    page.locator(f'svg .node[data-node="{marked["id"]}"]').click()
    assert page.locator("#node-code").inner_text().strip() == marked["code"].strip()
    assert page.locator("#node-detail b").count() == 0  # the <b> in the code stayed text
    page.screenshot(path=str(shots / "view-run.png"), full_page=True)
    assert (shots / "view-run.png").stat().st_size > 10_000
    assert errors == [], errors
    assert page.title() != "owned"


def saved_nodes(run) -> list[dict]:
    """The scaffold's tree as its journal holds it (the last full state and the deltas after it, folded)."""
    from rexmle_agents.scaffolds.tree import Tree

    return Tree.from_states(run.journal().states("scaffold")).to_state()["nodes"]


def test_a_single_run_page_in_chromium(browser, agent_runs: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "copy"
    shutil.copytree(agent_runs["rdloop"], target)
    assert main(["view", str(target)]) == 0
    page, errors = open_page(browser, (target / "view.html").as_uri())
    nodes = saved_nodes(load_run(target))
    assert page.locator("svg .node").count() == len(nodes)
    first = nodes[0]
    page.locator(f'svg .node[data-node="{first["id"]}"]').click()
    assert first["code"].strip()[:40] in page.locator("#node-code").inner_text()
    assert "final grade" in page.content() and errors == []
