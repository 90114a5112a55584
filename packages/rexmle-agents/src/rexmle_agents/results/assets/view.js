// rexmle view: draws the group table and each run's page from the JSON inlined in this file.
// Run data is only ever inserted as text (textContent), never parsed as markup.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("rexmle-data").textContent);
  const app = document.getElementById("app");
  const crumb = document.getElementById("crumb");
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "onclick") node.addEventListener("click", value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    return node;
  }

  const pct = (v) => (v === null || v === undefined ? "-" : (100 * v).toFixed(1) + "%");
  const num = (v, digits) => (v === null || v === undefined ? "-" : Number(v).toFixed(digits === undefined ? 2 : digits));
  const money = (v) => (v === null || v === undefined ? "-" : "$" + Number(v).toFixed(4));
  // costs come as text from the report ("unknown (3 uncosted calls)" when a call had no price, never $0.00)
  const costText = (text, v) => (text === null || text === undefined ? money(v) : text);
  function duration(s) {
    if (s === null || s === undefined) return "-";
    if (s >= 3600) return (s / 3600).toFixed(2) + " h";
    if (s >= 60) return (s / 60).toFixed(1) + " min";
    return Number(s).toFixed(1) + " s";
  }

  function table(columns, rows, numeric) {
    const head = el("tr", {}, columns.map((c) => el("th", {}, c)));
    const body = rows.map((cells) =>
      el("tr", {}, cells.map((cell, i) => el("td", { class: numeric && numeric[i] ? "num" : null }, cell))));
    return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
  }

  function facts(pairs) {
    return el("dl", { class: "facts" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }

  // ---- group page ------------------------------------------------------------------------------------------
  function groupPage() {
    const group = DATA.group;
    crumb.textContent = "group";
    app.replaceChildren(el("h1", {}, DATA.title));
    for (const kind of group.kinds) {
      app.appendChild(el("h2", {}, kind.data + " data"));
      if (kind.banner) app.appendChild(el("div", { class: "banner" }, kind.banner));
      const columns = [...group.group_by, "data", "runs", "missing", "valid", "mean pct ± s.e.", "95% CI", "median",
        "medals", "normalised", "cost/run"];
      const mark = (on) => (on ? " " + group.few_data_mark : "");
      const rows = kind.rows.map((row) => [...row.keys, kind.data, String(row.runs), String(row.missing), pct(row.valid),
        pct(row.mean) + (row.se === null ? "" : " ± " + pct(row.se) + mark(row.se_few)),
        row.ci[0] === null ? "-" : "[" + pct(row.ci[0]) + ", " + pct(row.ci[1]) + "]" + mark(row.ci_few), pct(row.median),
        String(row.medals), num(row.normalised), costText(row.cost_text, row.cost)]);
      app.appendChild(table(columns, rows, columns.map((_, i) => i > group.group_by.length)));
      for (const row of kind.rows) {
        if (row.warnings.length) app.appendChild(el("p", { class: "muted" }, group.few_data_mark + " " + row.keys.join("/") + ": " + row.warnings.join("; ")));
      }
      app.appendChild(el("h2", {}, "per task (mean percentile, valid rate, raw primary metric, normalised; each seed links to its run)"));
      const taskRows = kind.rows.map((row) => [...row.keys, kind.data, ...kind.tasks.map((task) => taskCell(row.tasks[task]))]);
      app.appendChild(table([...group.group_by, "data", ...kind.tasks], taskRows));
    }
    app.appendChild(el("h2", {}, "leaderboards"));
    app.appendChild(table(["task", "human rows", "teams", "caveat"], group.caveats.map((c) =>
      [c.task_id, c.board_rows === null ? "none" : String(c.board_rows),
        c.board_teams === null ? "-" : String(c.board_teams), c.note])));
    if ((group.task_notes || []).length) {
      app.appendChild(el("h2", {}, "task versions, expert bound, known issues"));
      app.appendChild(el("ul", {}, group.task_notes.map((line) => el("li", {}, line))));
    }
    app.appendChild(el("h2", {}, "rules"));
    app.appendChild(el("ul", {}, Object.entries(group.rules).map(([k, v]) => el("li", {}, el("b", {}, k + ": "), v))));
    if (group.refused.length) {
      app.appendChild(el("div", { class: "problems" }, "refused folders: ",
        group.refused.map((r) => el("div", {}, r.run_dir + ": " + r.reason))));
    }
  }

  function taskCell(cell) {
    if (!cell) return "-";
    const head = (cell.mean === null ? "n/a" : pct(cell.mean)) + " (" + pct(cell.valid) + "); " + cell.raw +
      (cell.normalised === null ? "" : "; normalised " + num(cell.normalised)) + " ";
    const links = cell.runs.map((run) => el("a", {
      class: "run" + (run.valid ? "" : " invalid"), href: "#run=" + encodeURIComponent(run.id),
      title: run.id + ": " + run.state + ", percentile " + pct(run.pct),
    }, "s" + run.seed));
    return el("span", {}, head, links);
  }

  // ---- run page --------------------------------------------------------------------------------------------
  function runPage(run) {
    crumb.textContent = "run " + run.id;
    const children = [el("h1", {}, run.task + " · " + run.agent + (run.model !== "-" ? " · " + run.model : "") +
      " · seed " + run.seed)];
    if (run.banner) children.push(el("div", { class: "banner" }, run.banner));
    if (run.problems.length) {
      children.push(el("div", { class: "problems" }, "not read (breaks the run format): ",
        run.problems.map((p) => el("div", {}, p))));
    }
    const status = run.status;
    children.push(facts([
      ["run", run.id], ["folder", run.dir], ["state", status.state + (status.limit ? " (limit: " + status.limit + ")" : "")],
      ["why it ended", status.reason || "-"], ["attempts", String(status.attempts)],
      ["started / finished", (status.started_at || "-") + " / " + (status.finished_at || "-")],
      ["config", run.config], ["sandbox", run.sandbox + (run.selection_k ? ", selection split K=" + run.selection_k : "")],
      ["hardware", status.hardware ? status.hardware.cpus + " CPUs (" + status.hardware.cpu_model + "), " +
        status.hardware.memory_gb + " GB, " + status.hardware.gpus + " GPU(s) " + status.hardware.gpu_names.join(", ") : "-"],
    ]));
    children.push(el("h2", {}, "budgets"));
    children.push(table(["budget", "used", "limit", ""], run.budgets.map((b) => {
      const used = b.name === "time" ? duration(b.used) : b.name === "cost" ? costText(b.text, b.used) : num(b.used, 0);
      const limit = b.limit === null ? "none" : b.name === "time" ? duration(b.limit) : b.name === "cost" ? money(b.limit) : num(b.limit, 0);
      const share = b.limit && b.used !== null ? Math.min(1, b.used / b.limit) : 0;
      const bar = el("span", { class: "barbox" }, el("span", { class: "bar", style: "width:" + (120 * share).toFixed(0) + "px" }));
      return [b.name, used, limit, el("span", {}, bar, b.limit ? pct(share) : "")];
    })));
    children.push(el("h2", {}, run.tree.kind === "tree" ? "search tree (" + run.tree.nodes.length + " nodes)" :
      "trajectory (" + run.tree.nodes.length + " steps)"));
    children.push(el("div", { class: "legend" },
      [["valid", "var(--ok)"], ["buggy", "var(--bug)"], ["pending", "var(--pending)"], ["other", "var(--plain)"]].map(
        ([name, colour]) => el("span", {}, el("span", { class: "dot", style: "background:" + colour }), name)),
      el("span", {}, el("span", { class: "dot", style: "border:3px solid var(--final)" }), "final (submitted)")));
    const detail = el("div", { class: "detail", id: "node-detail" }, el("p", { class: "muted" }, "click a node"));
    children.push(el("div", { class: "layout" }, el("div", { class: "treebox" }, drawTree(run, detail)), detail));
    if (run.capabilities) children.push(...capabilitySection(run, detail));
    if (run.tree.knowledge.length) {
      children.push(el("h2", {}, "knowledge log"));
      children.push(table(["outcome", "entry"], run.tree.knowledge.map((k) => [String(k.outcome || ""), JSON.stringify(k)])));
    }
    children.push(el("h2", {}, "model calls (" + run.model_calls_total + ")"));
    if (run.model_calls_total > run.model_calls.length) {
      children.push(el("p", { class: "muted" }, "first " + run.model_calls.length + " shown; all are in " + run.dir + "/journal.jsonl"));
    }
    children.push(table(["t (s)", "step", "model", "input", "output", "cost", "seconds", "retry s"],
      run.model_calls.map((c) => [num(c.time, 1), c.step === null ? "-" : String(c.step), c.model,
        c.known ? String(c.input) : "unknown", c.known ? String(c.output) : "unknown", c.cost === null ? "unknown (no price)" : money(c.cost), num(c.seconds, 1), num(c.retry, 1)]),
      [true, true, false, true, true, true, true, true]));
    children.push(el("h2", {}, "final grade"));
    children.push(gradeSection(run.grade));
    app.replaceChildren(...children);
    const final = run.tree.nodes.find((n) => n.final);
    if (final) showNode(run, final, detail);
  }

  function nodeClass(node) {
    let cls = "node";
    if (node.status === "pending" || node.status === "running") cls += " pending";
    else if (node.buggy) cls += " buggy";
    else if (node.valid) cls += " valid";
    if (node.final) cls += " final";
    return cls;
  }

  function drawTree(run, detail) {
    const tree = run.tree;
    const root = svg("svg", { id: "tree", width: tree.width, height: tree.height, viewBox: "0 0 " + tree.width + " " + tree.height });
    const byId = new Map(tree.nodes.map((n) => [n.id, n]));
    for (const node of tree.nodes) {
      const parent = byId.get(node.parent);
      if (parent) root.appendChild(svg("line", { class: "edge", x1: parent.x, y1: parent.y, x2: node.x, y2: node.y }));
    }
    for (const node of tree.nodes) {
      const circle = svg("circle", { class: nodeClass(node), cx: node.x, cy: node.y, r: 10, "data-node": node.id });
      const title = svg("title", {});
      title.textContent = node.stage + " " + node.id + (node.metric === null ? "" : ": " + node.metric);
      circle.appendChild(title);
      circle.addEventListener("click", () => showNode(run, node, detail));
      root.appendChild(circle);
      const label = svg("text", { x: node.x + 12, y: node.y + 4 });
      label.textContent = String(node.id);
      root.appendChild(label);
    }
    return root;
  }

  function showNode(run, node, detail) {
    for (const circle of document.querySelectorAll("svg .node.selected")) circle.classList.remove("selected");
    const circle = document.querySelector('svg .node[data-node="' + node.id + '"]');
    if (circle) circle.classList.add("selected");
    const parts = [el("h2", {}, (run.tree.kind === "tree" ? "node " : "step ") + node.id + " · " + node.stage +
      (node.parent === null || node.parent === undefined ? "" : " (after " + node.parent + ")") + (node.final ? " · FINAL" : ""))];
    parts.push(facts([
      ["metric", node.metric === null ? "-" : num(node.metric, 6) + (node.lower_is_better === null ? "" :
        node.lower_is_better ? " (lower is better)" : " (higher is better)")],
      ["status", node.status + (node.buggy ? " · BUGGY: " + (node.bug_reason || "failed") : node.valid ? " · valid" : "")],
      ["snapshot", node.snapshot || "-"],
      ["selection score", node.selection ? "K=" + node.selection.k + ", mean position " + num(node.selection.score) +
        ", percentile " + pct(node.selection.percentile) : "-"],
      ["step", node.step === null ? "-" : String(node.step)], ["time", duration(node.seconds)],
      ["model calls", String(node.calls)], ["tokens", String(node.tokens)], ["cost", costText(node.cost_text, node.cost)],
    ]));
    for (const [name, text] of [["hypothesis", node.hypothesis], ["plan", node.plan], ["review", node.analysis], ["lesson", node.lesson]]) {
      if (text) parts.push(el("h2", {}, name), el("pre", { class: "text" }, text));
    }
    const quoted = run.capabilities ? run.capabilities.evidence[String(node.id)] || [] : [];
    if (quoted.length) {
      parts.push(el("h2", {}, "capability evidence quoted from this " + (run.tree.kind === "tree" ? "node" : "step")));
      parts.push(el("ul", { class: "evidence" }, quoted.map((q) => el("li", { class: q.verified ? "verified" : "unverified" },
        el("b", {}, q.factor), " (" + q.source + (q.verified ? ", found in its " + q.where : ", NOT found: " + q.problem) + ")",
        el("pre", { class: "text" }, q.quote)))));
    }
    parts.push(el("h2", {}, "code"), el("pre", { id: "node-code" }, node.code || "(no code)"));
    for (const run_ of node.executions) {
      parts.push(el("h2", {}, "execution " + run_.name + ": " + (run_.stopped_by ? "stopped by " + run_.stopped_by :
        "exit " + run_.exit) + ", " + duration(run_.seconds)));
      parts.push(el("pre", { class: "output" }, run_.output || "(no output)"));
      if (run_.logs.length) parts.push(el("p", { class: "muted" }, "full output: " + run_.logs.join(", ")));
    }
    detail.replaceChildren(...parts);
  }

  // the verdicts of `rexmle analyse` on each success factor; a node number shows that node and what it quoted
  function capabilitySection(run, detail) {
    const caps = run.capabilities;
    const byId = new Map(run.tree.nodes.map((n) => [n.id, n]));
    const links = (ids) => el("span", {}, ids.map((id) => byId.has(id) ? el("a", { href: "#", class: "run",
      onclick: (event) => { event.preventDefault(); showNode(run, byId.get(id), detail); } }, String(id)) : String(id)));
    const rows = caps.factors.map((f) => [f.name, f.judge || "-", f.detector || "-", links(f.nodes)]);
    return [el("h2", {}, "success factors (rexmle analyse: " + caps.judge + ", rubric " + caps.rubric_version + ")"),
      table(["factor", "judge", "detector", "evidence in nodes"], rows)];
  }

  function gradeSection(grade) {
    if (!grade) return el("p", {}, "not graded (yet)");
    const box = el("div", {});
    box.appendChild(facts([
      ["status", grade.status], ["percentile", pct(grade.percentile)],
      ["mean position", grade.score === null ? "-" : num(grade.score) + " of " + grade.board_rows + " rows"],
      ["medal", grade.medal || "none"], ["above median", grade.above_median ? "yes" : "no"],
      ["rank if inserted", grade.inserted_rank === null ? "-" : String(grade.inserted_rank)],
    ]));
    const metrics = Object.entries(grade.metrics);
    if (metrics.length) {
      box.appendChild(table(["metric", "value", "position"], metrics.map(([k, v]) =>
        [k, num(v, 6), grade.positions && grade.positions[k] !== undefined ? String(grade.positions[k]) : "-"]), [false, true, true]));
    }
    for (const problem of grade.problems) box.appendChild(el("div", { class: "problems" }, problem));
    if (grade.error) box.appendChild(el("pre", {}, grade.error));
    if (grade.per_case.length) {
      box.appendChild(el("h2", {}, "per case" + (grade.cases_total > grade.per_case.length ?
        " (first " + grade.per_case.length + " of " + grade.cases_total + ")" : "")));
      const columns = [...new Set(grade.per_case.flatMap((c) => Object.keys(c)))];
      box.appendChild(table(columns, grade.per_case.map((c) => columns.map((k) => {
        const v = c[k];
        if (v === undefined || v === null) return "-";
        if (typeof v === "number") return num(v, 4);
        return typeof v === "object" ? JSON.stringify(v) : String(v);
      }))));
    }
    return box;
  }

  // ---- routing ---------------------------------------------------------------------------------------------
  function route() {
    const match = /^#run=(.+)$/.exec(window.location.hash);
    const ids = Object.keys(DATA.runs);
    if (match && DATA.runs[decodeURIComponent(match[1])]) {
      runPage(DATA.runs[decodeURIComponent(match[1])]);
    } else if (DATA.group) {
      groupPage();
    } else if (ids.length) {
      runPage(DATA.runs[ids[0]]);
    } else {
      app.replaceChildren(el("p", {}, "no runs"));
    }
    window.scrollTo(0, 0);
  }
  document.getElementById("home").addEventListener("click", (event) => {
    event.preventDefault();
    window.location.hash = "";
    route();
  });
  window.addEventListener("hashchange", route);
  route();
})();
