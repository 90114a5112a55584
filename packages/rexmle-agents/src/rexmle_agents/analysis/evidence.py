"""What a run did, as evidence: each node's (or step's) code and execution outputs from the journal, quote checking,
and chunks for the judge.

Only what the run *did* is evidence: the code the agent wrote and what running it printed. The agent's plans,
the scaffold's reviews, hypotheses and lessons (its summaries of itself) are left out. A quote is verified when,
with runs of whitespace collapsed, it is a substring of one of the execution outputs of the node it names, or of
that node's code if the code ran and the quote is not (mostly) a comment: what a comment claims is not evidence.

Chunks: a run is rendered node by node and cut into chunks of at most ``max_chars`` characters; a node longer
than that is split across chunks by lines, so nothing is ever dropped. Each chunk is judged on its own and a
factor is demonstrated if any chunk proves it.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import tokenize
from dataclasses import dataclass

from rexmle_agents.analysis.records import Quote
from rexmle_agents.results.loader import RunRecord
from rexmle_agents.results.trajectory import Trajectory, trajectory
from rexmle_grade.errors import RexmleError

MIN_QUOTE_CHARS = 10  # shorter quotes ("np.flip(") prove nothing about a practice
DEFAULT_CHUNK_CHARS = 48_000  # about 12k tokens of code and output per call


def normalise(text: str) -> str:
    """Runs of whitespace (spaces, tabs, newlines) as one space, ends stripped."""
    return " ".join(text.split())


def code_lines(code: str) -> list[tuple[str, str]]:
    """(line without its comment, original line) for each line of Python ``code``; code that does not tokenise (a
    syntax error, a fragment) loses its ``#`` comments by a simpler rule."""
    try:
        comments: dict[int, int] = {}
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.start[1]
        return [(line[:comments[i + 1]] if i + 1 in comments else line, line)
                for i, line in enumerate(code.splitlines())]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return [(_COMMENT.sub("", line), line) for line in code.splitlines()]


_COMMENT = re.compile(r"(^|\s)#.*$")


@dataclass(frozen=True)
class Output:
    name: str
    exit_code: int | None
    stopped_by: str | None
    seconds: float
    text: str  # stdout tail, then stderr tail


@dataclass(frozen=True)
class NodeText:
    id: int
    stage: str
    parent: int | None
    code: str
    outputs: tuple[Output, ...]

    @property
    def ran(self) -> bool:
        return bool(self.outputs)

    def render(self) -> str:
        after = "" if self.parent is None else f" · after node {self.parent}"
        lines = [f"===== node {self.id} · {self.stage}{after} ====="]
        if self.code:
            state = "ran" if self.ran else "never ran: it cannot be evidence"
            lines += [f"----- code of node {self.id} ({state}) -----", self.code.rstrip("\n")]
        for out in self.outputs:
            how = f"stopped by {out.stopped_by}" if out.stopped_by else f"exit {out.exit_code}"
            lines += [f"----- output of node {self.id}, {out.name} ({how}, {out.seconds:.1f} s) -----",
                      out.text.rstrip("\n") or "(no output)"]
        lines.append(f"===== end of node {self.id} =====")
        return "\n".join(lines)


@dataclass(frozen=True)
class Chunk:
    index: int
    total: int
    nodes: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class RunText:
    """A run's nodes with code or output, in journal order, and the digest of that content."""

    run_id: str
    nodes: tuple[NodeText, ...]

    @property
    def digest(self) -> str:
        content = [[n.id, n.code, [[o.name, o.exit_code, o.stopped_by, o.text] for o in n.outputs]]
                   for n in self.nodes]
        return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode("utf-8")).hexdigest()

    def node(self, node_id: int | None) -> NodeText | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def verify(self, node_id: int | None, quote: str) -> Quote:
        """Whether ``quote`` is in the code (that ran) or an output of node ``node_id``."""
        wanted = normalise(quote)
        if len(wanted) < MIN_QUOTE_CHARS:
            return Quote(node=node_id, quote=quote, verified=False,
                         problem=f"shorter than {MIN_QUOTE_CHARS} characters: too short to prove anything")
        node = self.node(node_id)
        if node is None:
            known = ", ".join(str(n.id) for n in self.nodes[:20]) or "none"
            return Quote(node=node_id, quote=quote, verified=False,
                         problem=f"the run has no node {node_id} with code or output (nodes: {known})")
        if wanted in normalise(node.code):
            if not node.ran:
                return Quote(node=node_id, quote=quote, verified=False,
                             problem=f"in the code of node {node_id}, which never ran")
            said = normalise("\n".join(_COMMENT.sub("", line) for line in quote.splitlines()))
            if len(said) < MIN_QUOTE_CHARS or said not in normalise("\n".join(c for c, _ in code_lines(node.code))):
                return Quote(node=node_id, quote=quote, verified=False,
                             problem="it is (mostly) a comment: comments are not evidence of what code does")
            return Quote(node=node_id, quote=quote, verified=True, where="code")
        if any(wanted in normalise(out.text) for out in node.outputs):
            return Quote(node=node_id, quote=quote, verified=True, where="output")
        elsewhere = [n.id for n in self.nodes if n.id != node_id and (
            (n.ran and wanted in normalise(n.code)) or any(wanted in normalise(o.text) for o in n.outputs))]
        hint = f" (it is in node {elsewhere[0]}; evidence must name its own node)" if elsewhere else ""
        return Quote(node=node_id, quote=quote, verified=False,
                     problem=f"not found in the code or output of node {node_id}{hint}")

    def chunks(self, max_chars: int = DEFAULT_CHUNK_CHARS) -> list[Chunk]:
        """The run cut into chunks of at most ``max_chars`` characters (a larger node split by lines)."""
        if max_chars < 1000:
            raise ValueError(f"chunks of {max_chars} characters are too small to judge anything (at least 1000)")
        pieces: list[tuple[int, str]] = []
        for node in self.nodes:
            text = node.render()
            if len(text) <= max_chars:
                pieces.append((node.id, text))
                continue
            parts = _split_lines(text, max_chars - 100)
            for number, part in enumerate(parts, start=1):
                pieces.append((node.id, f"(node {node.id}, part {number} of {len(parts)})\n{part}"))
        grouped: list[tuple[list[int], list[str]]] = []
        size = 0
        for node_id, text in pieces:
            if not grouped or size + len(text) + 2 > max_chars:
                grouped.append(([], []))
                size = 0
            ids, texts = grouped[-1]
            if node_id not in ids:
                ids.append(node_id)
            texts.append(text)
            size += len(text) + 2
        return [Chunk(index=i, total=len(grouped), nodes=tuple(ids), text="\n\n".join(texts))
                for i, (ids, texts) in enumerate(grouped)]


def _split_lines(text: str, limit: int) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.split("\n"):
        while len(line) > limit:  # a minified line: cut hard
            head, line = line[:limit], line[limit:]
            if current:
                parts.append("\n".join(current))
                current, size = [], 0
            parts.append(head)
        if current and size + len(line) + 1 > limit:
            parts.append("\n".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        parts.append("\n".join(current))
    return parts


def run_text(run: RunRecord, path: Trajectory | None = None) -> RunText:
    """The nodes of ``run`` that hold code or execution output, read from its journal (or its trajectory)."""
    path = path or trajectory(run)
    nodes = []
    for node in path.nodes:
        outputs = tuple(Output(name=e.name, exit_code=e.exit_code, stopped_by=e.stopped_by, seconds=e.seconds,
                               text=e.output_tail) for e in node.executions)
        if node.code.strip() or outputs:
            nodes.append(NodeText(id=node.id, stage=node.stage, parent=node.parent, code=node.code, outputs=outputs))
    return RunText(run_id=run.run_id, nodes=tuple(nodes))


@dataclass(frozen=True)
class TaskBrief:
    """What the judge is told about the task (never the agent, the model or the score: the judge is blind to them)."""

    task_id: str
    title: str = ""
    modality: str = ""
    dim: str = ""
    task_type: str = ""

    def describe(self) -> str:
        facts = ", ".join(x for x in (self.modality and f"modality: {self.modality}",
                                      self.dim and f"{self.dim} images", self.task_type and f"task: {self.task_type}")
                          if x)
        return f"{self.title or self.task_id} ({facts})" if facts else (self.title or self.task_id)


@functools.cache
def task_brief(task_id: str) -> TaskBrief:
    """From the installed task registry; a task it does not know is named only."""
    try:
        from rexmle_tasks.registry import get_task

        meta = get_task(task_id).meta
    except RexmleError:  # a removed plug-in task: judged without its facts
        return TaskBrief(task_id=task_id)
    return TaskBrief(task_id=task_id, title=meta.title, modality=meta.modality, dim=meta.dim,
                     task_type=str(meta.task_type))
