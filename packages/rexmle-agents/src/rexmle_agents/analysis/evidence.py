"""What a run did, as evidence: each node's (or step's) code and execution outputs from the journal, quote checking,
and chunks for the judge.

Only what the run *did* is evidence: the code the agent wrote and what running it printed. The agent's plans,
the scaffold's reviews, hypotheses and lessons (its summaries of itself) are left out. A quote is verified when,
with runs of whitespace collapsed, it is a substring of one of the execution outputs of the node it names, or of
the part of that node's code that ran, and the quote is not (mostly) a comment: what a comment claims is not
evidence.

Which code ran (:class:`Reach`), decided by the node's final execution (the one that ran the node's final code):

* it exited 0: the whole script ran;
* it crashed (or the sandbox stopped it) with a traceback naming lines of the script: in each function on the
  traceback, the lines up to the one it names; at module level, up to the line named there (or, when the tail
  lost that frame, up to the first function on the traceback); and, repeatedly, the whole body of every function
  and every method of every class that the code counted so far names. Nested function bodies count only that way;
* it crashed on a syntax error, or without naming a line of the script (a timeout, a traceback cut off, a crash
  in a library the tail shows alone): none of its code counts (its output still does);
* it never ran: none of it.

Every quote of code records the rule (``Quote.rule``), and the run text shown to the judge says it per node.

Chunks: a run is rendered node by node and cut into chunks of at most ``max_chars`` characters; a node longer
than that is split across chunks by lines, so nothing is ever dropped. Each chunk is judged on its own and a
factor is demonstrated if any chunk proves it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import json
import re
import tokenize
from dataclasses import dataclass, field

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
class Reach:
    """Which lines of a node's code ran (1-based; ``None``: all of them), and the rule that decided it."""

    lines: frozenset[int] | None
    rule: str

    def has(self, line: int) -> bool:
        return self.lines is None or line in self.lines


# a frame of a Python traceback, and where a traceback starts (its header, or a syntax error's bare frame)
_FRAME = re.compile(r'^\s*File "([^"\n]+)", line (\d+)', re.MULTILINE)
_TRACEBACK_START = re.compile(r"^Traceback \(most recent call last\):|^\s*File \"[^\"\n]+\", line \d+\s*$",
                              re.MULTILINE)
# the header run_text puts before each file a step-based agent wrote (results.trajectory joins them so)
_FILE_HEADER = re.compile(r"^# (\S+\.py)$")
_LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/lib/python\d|^<")


@dataclass(frozen=True)
class NodeText:
    id: int
    stage: str
    parent: int | None
    code: str
    outputs: tuple[Output, ...]
    # the scripts the code holds: (file name a traceback names, first line of that file in ``code``); empty: the
    # code is one script, and any traceback frame outside installed libraries is taken to be it
    files: tuple[tuple[str, int], ...] = field(default=())

    @property
    def ran(self) -> bool:
        return bool(self.outputs)

    @functools.cached_property
    def reach(self) -> Reach:
        return code_reach(self.code, self.outputs, self.files)

    def ran_lines(self) -> list[tuple[str, str]]:
        """(line without its comment, original line) of each line of the code that ran."""
        reach = self.reach
        return [pair for number, pair in enumerate(code_lines(self.code), start=1) if reach.has(number)]

    def ran_code(self) -> str:
        """The code with every line that did not run replaced by a NUL, so that no quote can span it."""
        reach = self.reach
        return "\n".join(line if reach.has(number) else "\0"
                         for number, line in enumerate(self.code.splitlines(), start=1))

    def render(self) -> str:
        after = "" if self.parent is None else f" · after node {self.parent}"
        lines = [f"===== node {self.id} · {self.stage}{after} ====="]
        if self.code:
            state = (("ran" if self.reach.lines is None else f"what ran: {self.reach.rule}; only that part can be "
                      "evidence") if self.ran else "never ran: it cannot be evidence")
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
            rule = node.reach.rule
            if not node.ran:
                return Quote(node=node_id, quote=quote, verified=False, rule=rule,
                             problem=f"in the code of node {node_id}, which never ran")
            if wanted not in normalise(node.ran_code()):
                return Quote(node=node_id, quote=quote, verified=False, rule=rule,
                             problem=f"in the code of node {node_id}, but not in the part of it that ran ({rule})")
            said = normalise("\n".join(_COMMENT.sub("", line) for line in quote.splitlines()))
            if len(said) < MIN_QUOTE_CHARS or said not in normalise("\n".join(c for c, _ in node.ran_lines())):
                return Quote(node=node_id, quote=quote, verified=False, rule=rule,
                             problem="it is (mostly) a comment: comments are not evidence of what code does")
            return Quote(node=node_id, quote=quote, verified=True, where="code", rule=rule)
        if any(wanted in normalise(out.text) for out in node.outputs):
            return Quote(node=node_id, quote=quote, verified=True, where="output")
        elsewhere = [n.id for n in self.nodes if n.id != node_id and (
            (n.ran and wanted in normalise(n.ran_code())) or any(wanted in normalise(o.text) for o in n.outputs))]
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
            files = (((f"node_{node.id:04d}.py", 1),) if path.kind == "tree" else _step_files(node.code))
            nodes.append(NodeText(id=node.id, stage=node.stage, parent=node.parent, code=node.code, outputs=outputs,
                                  files=files))
    return RunText(run_id=run.run_id, nodes=tuple(nodes))


def _step_files(code: str) -> tuple[tuple[str, int], ...]:
    """The Python files a step wrote, where results.trajectory joined them: a ``# name.py`` line opening the code or
    following an empty line."""
    lines = code.splitlines()
    return tuple((match.group(1), number + 1) for number, line in enumerate(lines, start=1)
                 if (number == 1 or not lines[number - 2].strip()) and (match := _FILE_HEADER.match(line)))


# ---------------------------------------------------------------------------------------------------------------
# which code ran

def code_reach(code: str, outputs: tuple[Output, ...], files: tuple[tuple[str, int], ...] = ()) -> Reach:
    """Which lines of ``code`` ran, by its final execution (see the module's rules)."""
    if not outputs:
        return Reach(frozenset(), "it never ran")
    final = outputs[-1]
    if final.exit_code == 0 and final.stopped_by is None:
        return Reach(None, "its final execution exited 0: all of it ran")
    how = f"stopped by {final.stopped_by}" if final.stopped_by else f"exit {final.exit_code}"
    text = final.text
    start = [m.start() for m in _TRACEBACK_START.finditer(text)]
    tail = text[start[-1]:] if start else text  # the last traceback (a chained exception's is the one that ended it)
    sections = _sections(code, files)
    frames: dict[tuple[int, int], list[int]] = {}  # the script's section -> its frames' lines, outermost first
    for filename, line in _FRAME.findall(tail):
        if (section := _script(filename, sections)) is not None:
            frames.setdefault(sections[section], []).append(int(line))
    if not frames:
        return Reach(frozenset(), f"its final execution ({how}) names no line of the script: none of its code "
                                  "counts as run")
    lines: set[int] = set()
    named = []
    for (first, last), frame_lines in frames.items():
        source = "\n".join(code.splitlines()[first - 1:last])
        try:
            reached = _reached(source, frame_lines)
        except (SyntaxError, ValueError):  # a script that does not parse (or holds NUL bytes) never ran
            continue
        lines.update(first + n - 1 for n in reached)
        named.append(f"line {frame_lines[-1]}")
    if not named:
        return Reach(frozenset(), f"its final execution ({how}) failed before any line ran: the script does not "
                                  "parse (a syntax error)")
    where = ", ".join(named)
    return Reach(frozenset(lines), f"its final execution ({how}) crashed at {where} (traceback): code counts up to "
                                   "that line in each function the traceback names, with the functions and classes "
                                   "that code calls; the rest never ran")


def _sections(code: str, files: tuple[tuple[str, int], ...]) -> dict[str, tuple[int, int]]:
    """File name -> (first, last) line of that file in ``code``; ``""`` for the whole code when no file is known."""
    total = len(code.splitlines())
    if not files:
        return {"": (1, total)}
    starts = sorted(files, key=lambda f: f[1])
    return {name: (first, (starts[i + 1][1] - 3 if i + 1 < len(starts) else total))
            for i, (name, first) in enumerate(starts)}


def _script(filename: str, sections: dict[str, tuple[int, int]]) -> str | None:
    """The section a traceback frame's file is, or None for another file (a library, the interpreter)."""
    if "" in sections:
        return None if _LIBRARY_PATH.search(filename) else ""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    return base if base in sections else None


_Def = ast.FunctionDef | ast.AsyncFunctionDef


def _reached(source: str, frames: list[int]) -> set[int]:
    """Lines of ``source`` that ran before the crash whose traceback names the lines ``frames`` (outermost first)."""
    tree = ast.parse(source)
    functions = [n for n in ast.walk(tree) if isinstance(n, _Def)]
    body = {id(f): set(range(f.body[0].lineno, (f.end_lineno or f.body[-1].lineno) + 1)) for f in functions}
    total = len(source.splitlines())

    def scope_of(line: int) -> _Def | None:
        holding = [f for f in functions if line in body[id(f)]]
        return max(holding, key=lambda f: f.body[0].lineno, default=None)

    def own(scope: _Def | None, upto: int) -> set[int]:
        """Lines of ``scope`` (None: the module) up to ``upto``, without the bodies of functions nested in it."""
        span = set(range(1, total + 1)) if scope is None else body[id(scope)]
        nested = {line for f in functions if f is not scope and body[id(f)] <= span for line in body[id(f)]}
        return {line for line in span - nested if line <= upto}

    reached: set[int] = set()
    on_stack: set[int] = set()
    module_frame = False
    for line in frames:
        scope = scope_of(line)
        module_frame |= scope is None
        if scope is not None:
            on_stack.add(id(scope))
        reached |= own(scope, line)
    if not module_frame:  # the tail lost the module's frame: the module ran at least up to the first function shown
        first = min((f.lineno for f in functions if id(f) in on_stack), default=1)
        reached |= own(None, first)
    named_at: dict[int, set[str]] = {}  # line -> the names and attributes it mentions
    for n in ast.walk(tree):
        if isinstance(n, ast.Name | ast.Attribute):
            named_at.setdefault(n.lineno, set()).add(n.id if isinstance(n, ast.Name) else n.attr)
    callees: dict[str, list[_Def]] = {}  # a name -> the functions it runs when called (a class: its methods)
    for f in functions:
        callees.setdefault(f.name, []).append(f)
    for c in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        callees.setdefault(c.name, []).extend(m for m in c.body if isinstance(m, _Def))
    done: set[int] = set(on_stack)
    new = set(reached)
    while new:  # what newly counted code names runs in full (a function on the traceback only up to its line)
        names = set().union(*(named_at.get(line, set()) for line in new))
        new = set()
        for f in (f for name in names for f in callees.get(name, ()) if id(f) not in done):
            done.add(id(f))
            new |= own(f, total) - reached
        reached |= new
    return reached


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
