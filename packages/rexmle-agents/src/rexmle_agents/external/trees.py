"""An original agent's own node tree, converted into the node records rexmle's scaffolds journal.

AIDE (``aideml``) saves its whole search after every node as ``journal.json``: ``{"nodes": [...], "node2parent":
{...}, ...}``, a list of nodes (plan, code, the terminal output, execution time, exception type, the review's
analysis, ``metric: {value, maximize}``, is_buggy, creation time ``ctime``, ``step``: its index) and ``node2parent``
(node id -> parent id, in node order). ML-Master versions that save a journal use the same layout (its virtual
root, stage ``root``, is left out). Each node becomes a :class:`rexmle_agents.scaffolds.node.Node`, so the run's
tree is read by reports, the viewer and the capability analysis exactly like a scaffold's.

The file is rewritten whole after every node, so reading it whole every time costs the harness quadratic time and
memory over a run. :class:`AideJournalReader` reads it incrementally instead: it remembers where the last node it
parsed ends (and the bytes just before that point, to notice a file that was rewritten differently), parses only the
node records after it, one at a time, and finds the new nodes' parents in the last entries of ``node2parent``, read
backwards from the end of the file. Every text field is bounded on import (a marker says what was cut), a node
record larger than :data:`MAX_NODE_BYTES` is skipped without being parsed (its id, metric and bug flag are taken
from its edges), and the whole file has a size cap.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from rexmle_agents.safe_workspace import RegularFile, Workspace
from rexmle_agents.scaffolds.node import ExecSummary, Node, NodeStatus

OUTPUT_TAIL_CHARS = 4000
MAX_CODE_CHARS = 100_000  # a node's code kept on import (AIDE's scripts are a few kB)
MAX_TEXT_CHARS = 20_000  # plan and analysis
MAX_NODE_BYTES = 16 * 2**20  # one node record parsed at once; a larger one is skipped, not parsed
DEFAULT_MAX_TREE_BYTES = 64 * 2**20  # the tree file's size cap
DEFAULT_MAX_NODES = 5000  # nodes imported per run
MAX_REREADS = 8  # full re-reads of a file rewritten other than by appending, before the import gives up
_CHUNK = 1 << 20
_ANCHOR_BYTES = 64
_HEAD = re.compile(rb'\A\s*\{\s*"nodes"\s*:\s*\[')
_SPACE = b" \t\r\n"
_PAIR = re.compile(rb'"([^"\\]{1,256})":"([^"\\]{1,256})"')
# the small top-level fields of a node record too large to parse, matched where a top-level string begins
_FIELDS = {
    "id": re.compile(rb'"id":"([^"\\]{1,256})"'),
    "step": re.compile(rb'"step":(\d{1,9})[,}]'),
    "metric": re.compile(rb'"metric":\{"value":(-?[0-9.eE+-]+|null|NaN|-?Infinity),"maximize":(true|false|null)\}'),
    "is_buggy": re.compile(rb'"is_buggy":(true|false)'),
}
_STRING_STOP = re.compile(rb'["\\]')
_STRUCTURE = re.compile(rb'["{}\[\]]')


@dataclass(frozen=True)
class ForeignNode:
    """One node as the original agent recorded it (text fields already bounded)."""

    key: str  # the agent's own node id
    index: int  # its position in the agent's journal (AIDE: ``step``)
    parent: str | None
    plan: str
    code: str
    output: str  # the tail of its terminal output
    exec_seconds: float
    exception: str | None
    analysis: str
    metric: float | None
    maximize: bool | None
    is_buggy: bool
    created: float | None  # Unix seconds


class TreeFormatError(ValueError):
    """The file is not a tree of the expected format."""


class TreeIncomplete(TreeFormatError):
    """The file is being rewritten (it ended, or changed, while it was read): read it again later."""


class TreeLimitError(TreeFormatError):
    """The tree is over one of the import's bounds; the message is the reason the import stops."""


def clip_head(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[rexmle: {len(text) - limit} more characters of this {what} were not imported]"


def _output_tail(term: Any) -> str:
    """The last :data:`OUTPUT_TAIL_CHARS` characters of AIDE's output (a list of pieces), joined from the end."""
    pieces = term if isinstance(term, list) else [term]
    kept: list[str] = []
    size = total = 0
    for piece in reversed(pieces):
        text = str(piece)
        total += len(text)
        if size < OUTPUT_TAIL_CHARS:
            kept.append(text)
            size += len(text)
    tail = "".join(reversed(kept))[-OUTPUT_TAIL_CHARS:]
    return tail if total <= OUTPUT_TAIL_CHARS else f"[rexmle: the first {total - len(tail)} characters were " \
        f"not imported]\n{tail}"


def _finite(value: object) -> float | None:
    """The metric as a float; a NaN or infinite one (AIDE writes ``NaN`` into its JSON) is no metric."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return number if math.isfinite(number) else None


def foreign_node(item: Any, position: int, parent: str | None) -> ForeignNode | None:
    """The node of one record of the ``nodes`` list (None for a virtual root or a record that is no node)."""
    if not isinstance(item, dict) or item.get("stage") == "root":
        return None
    metric = item.get("metric") or {}
    value = metric.get("value") if isinstance(metric, dict) else None
    maximize = metric.get("maximize") if isinstance(metric, dict) else None
    term = item.get("_term_out") or item.get("term_out") or []
    exception = item.get("exc_type")
    exec_time = item.get("exec_time")
    return ForeignNode(
        key=str(item.get("id", position))[:256],
        index=int(item["step"]) if isinstance(item.get("step"), int) else position, parent=parent,
        plan=clip_head(str(item.get("plan") or ""), MAX_TEXT_CHARS, "plan"),
        code=clip_head(str(item.get("code") or ""), MAX_CODE_CHARS, "code"),
        output=_output_tail(term), exec_seconds=_finite(exec_time) or 0.0,
        exception=None if exception is None else str(exception)[:200],
        analysis=clip_head(str(item.get("analysis") or ""), MAX_TEXT_CHARS, "analysis"),
        metric=_finite(value), maximize=maximize if isinstance(maximize, bool) else None,
        is_buggy=bool(item.get("is_buggy", True)),
        created=_finite(item.get("ctime")),
    )


def parse_aide_journal(data: bytes) -> list[ForeignNode]:
    """Every node of a whole journal file (the fallback for files not laid out as AIDE writes them)."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise TreeFormatError(f"not JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list):
        raise TreeFormatError("no list of nodes")
    parents = raw.get("node2parent") or {}
    if not isinstance(parents, dict):
        parents = {}
    nodes = []
    for position, item in enumerate(raw["nodes"]):
        key = str(item.get("id", position)) if isinstance(item, dict) else ""
        node = foreign_node(item, position, _text_or_none(parents.get(key)))
        if node is not None:
            nodes.append(node)
    known = {n.key for n in nodes}  # a parent that is not a node (ML-Master's virtual root) makes a draft
    ordered = sorted(nodes, key=lambda n: n.index)
    return [n if n.parent in known else dataclasses.replace(n, parent=None) for n in ordered]


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class TreeRead:
    """What one read of the tree file found."""

    nodes: list[ForeignNode]  # the nodes not seen before, in the file's order, parents resolved
    version: tuple[int, int, int]  # (inode, size, mtime_ns) of the file as read
    newest: str | None  # the key of the last node in that version
    bytes_read: int
    skipped: tuple[str, ...] = ()  # why a node record was imported without being parsed


class AideJournalReader:
    """Reads the new nodes of an AIDE-layout ``journal.json`` each time it changed (see the module docstring).

    ``bytes_read`` counts every byte read: for a file that only grows at its end, as AIDE's does, it stays within a
    small multiple of the file's final size however often the file is read. Not thread-safe: one importer uses it.
    """

    def __init__(self, *, max_bytes: int, max_node_bytes: int = MAX_NODE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.max_node_bytes = max_node_bytes
        self.known: set[str] = set()
        self.bytes_read = 0
        self.rereads = 0
        self._offset: int | None = None  # just after the last parsed record of the nodes list
        self._anchor = b""  # the bytes that end there, as last read
        self._parented: str | None = None  # the newest known node with a parent
        self._newest: str | None = None
        self._version: tuple[int, int, int] | None = None
        self._short: tuple[int, int, int] | None = None  # a version seen shorter than the nodes already read

    def read(self, fs: Workspace, rel: str) -> TreeRead | None:
        """The nodes added since the last read; None when the file is missing or not a regular file. Raises
        :class:`TreeIncomplete` (read again later), :class:`TreeLimitError` (stop importing) or
        :class:`TreeFormatError`."""
        with fs.reading(rel) as handle:
            if handle is None:
                return None
            before = handle.status()
            version = (before.st_ino, before.st_size, before.st_mtime_ns)
            if version == self._version:
                return TreeRead([], version, self._newest, 0)
            if before.st_size > self.max_bytes:
                raise TreeLimitError(f"{rel} is {before.st_size} bytes, over the import's cap of {self.max_bytes} "
                                     "bytes (--agent-config tree_max_bytes=N raises it)")
            pass_ = _Pass(self, handle, version)
            try:
                nodes, skipped = pass_.run()
            finally:
                self.bytes_read += pass_.bytes_read
            after = handle.status()
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise TreeIncomplete("the file changed while it was read")
        self._offset, self._anchor, self._version = pass_.offset, pass_.anchor, version
        self._newest = pass_.newest if pass_.newest is not None else self._newest
        for node in nodes:
            self.known.add(node.key)
            if node.parent is not None:
                self._parented = node.key
        return TreeRead(nodes, version, self._newest, pass_.bytes_read, tuple(skipped))


class _Pass:
    """One read of the file: the new node records after the remembered offset, then their parents."""

    def __init__(self, reader: AideJournalReader, handle: RegularFile, version: tuple[int, int, int]) -> None:
        self.reader = reader
        self.handle = handle
        self.version = version
        self.size = version[1]
        grown = self.size - (reader._version[1] if reader._version is not None else 0)
        self.first_read = min(_CHUNK, grown + 1024 if grown >= 0 else _CHUNK)
        self.bytes_read = 0
        self.offset: int | None = reader._offset
        self.anchor = reader._anchor
        self.newest: str | None = None

    def _read(self, offset: int, count: int) -> bytes:
        data = self.handle.read(offset, count)
        self.bytes_read += len(data)
        return data

    def run(self) -> tuple[list[ForeignNode], list[str]]:
        start = self._start()
        if start is None:
            return self._whole(), []
        records, skipped, end = self._records(start)
        seen = set(self.reader.known)
        fresh = [key for key, _, _ in records if key not in seen]
        parents = self._parents(end, fresh) if fresh else {}
        nodes: list[ForeignNode] = []
        for key, node, _ in records:
            parent = parents.get(key)
            if node.key in seen:
                continue
            node = dataclasses.replace(node, parent=parent if parent in seen else None)
            seen.add(node.key)
            nodes.append(node)
        return nodes, skipped

    def _start(self) -> int | None:
        """Where the new records begin; None when the file must be read whole (not AIDE's layout)."""
        reader = self.reader
        if not self._read(max(0, self.size - 16), 16).rstrip(_SPACE).endswith(b"}"):
            raise TreeIncomplete("the file does not end its JSON object (being written)")
        if self.offset is not None and self.offset > self.size and reader._short != self.version:
            reader._short = self.version  # shorter than before: being written, unless it stays so
            raise TreeIncomplete("the file is shorter than the nodes already read")
        if (self.offset is not None and self.offset <= self.size
                and self._read(self.offset - len(self.anchor), len(self.anchor)) == self.anchor):
            return self.offset
        match = _HEAD.match(self._read(0, 256))
        if self.offset is not None or (match is None and reader._version is not None):
            # rewritten other than by appending (or not in AIDE's layout): read again from its start
            self.offset, self.anchor = None, b""
            reader.rereads += 1
            if reader.rereads > MAX_REREADS:
                raise TreeLimitError(f"the tree file was rewritten other than by appending nodes {reader.rereads} "
                                     "times (or is not laid out as AIDE writes it); each time it must be read again "
                                     "whole, so the import stops")
        return None if match is None else match.end()

    def _whole(self) -> list[ForeignNode]:
        nodes = parse_aide_journal(self._read(0, self.size))
        self.offset, self.anchor = None, b""
        if nodes:
            self.newest = nodes[-1].key
        known = self.reader.known
        return [n for n in nodes if n.key not in known]

    def _records(self, start: int) -> tuple[list[tuple[str, ForeignNode, int]], list[str], int]:
        """The nodes of the records from ``start`` to the end of the nodes list: (key, node without its parent,
        position), notes on skipped records, and the offset where the list ends."""
        decoder = json.JSONDecoder()
        records: list[tuple[str, ForeignNode, int]] = []
        skipped: list[str] = []
        base, window = start, b""
        text, cursor = "", 0
        position = len(self.reader.known)
        while True:
            while cursor < len(window) and window[cursor] in _SPACE + b",":
                cursor += 1
            if cursor >= len(window):
                base, window, text, cursor = self._more(base, window, cursor)
                continue
            if window[cursor] == ord("]"):
                return records, skipped, base + cursor
            if window[cursor] != ord("{"):
                raise TreeFormatError(f"expected a node record at byte {base + cursor}")
            try:
                item, end = decoder.raw_decode(text, cursor)
            except ValueError:
                if len(window) - cursor < self.reader.max_node_bytes:
                    base, window, text, cursor = self._more(base, window, cursor)
                    continue
                node, end_at = self._skip(base + cursor, position)
                skipped.append(f"node record at byte {base + cursor} is {end_at - base - cursor} bytes, over "
                               f"{self.reader.max_node_bytes}: imported from its id, metric and bug flag only")
                records.append((node.key, node, position))
                self._advance(end_at)
                base, window, text, cursor = end_at, b"", "", 0
                self.newest = node.key
                position += 1
                continue
            raw = window[cursor:end]
            if not raw.isascii():  # read as Latin-1 for the byte offsets; the strings are UTF-8
                item = json.loads(raw.decode("utf-8", errors="replace"))
            node = foreign_node(item, position, None)  # at once: only the bounded fields are kept
            if node is not None:
                records.append((node.key, node, position))
                self.newest = node.key
            position += 1
            cursor = end
            self.offset, self.anchor = base + end, window[max(0, end - _ANCHOR_BYTES):end]

    def _advance(self, end_at: int) -> None:
        self.offset = end_at
        self.anchor = self._read(max(0, end_at - _ANCHOR_BYTES), min(end_at, _ANCHOR_BYTES))

    def _more(self, base: int, window: bytes, cursor: int) -> tuple[int, bytes, str, int]:
        """The window with the consumed part dropped and at least as much again read after it."""
        base, window = base + cursor, window[cursor:]
        at = base + len(window)
        if at >= self.size:
            raise TreeIncomplete(f"the file ends at byte {self.size} inside its list of nodes")
        # the first read is about as large as the file grew (the new records and parent entries), then it doubles
        window += self._read(at, max(self.first_read if not window else _CHUNK, len(window)))
        return base, window, window.decode("latin-1"), 0

    def _skip(self, start: int, position: int) -> tuple[ForeignNode, int]:
        """A node record too large to parse: its end (found by scanning strings and brackets) and a node made from
        its small top-level fields (id, step, metric, bug flag), read where the scan saw them begin."""
        strings: list[int] = []
        end = _scan_value(self._read, start, self.size, strings)
        fields: dict[str, re.Match[bytes]] = {}
        for offset in strings:
            window = self._read(offset, 320)
            for name, pattern in _FIELDS.items():
                match = pattern.match(window)
                if match is not None and name not in fields:
                    fields[name] = match
        metric = fields.get("metric")
        value, maximize = (metric.group(1), metric.group(2)) if metric else (b"null", b"null")
        try:
            number = _finite(float(value)) if value != b"null" else None
        except ValueError:
            number = None
        buggy = fields.get("is_buggy")
        node = ForeignNode(
            key=fields["id"].group(1).decode("utf-8", errors="replace") if "id" in fields
            else f"rexmle-skipped-at-{start}",
            index=int(fields["step"].group(1)) if "step" in fields else position, parent=None, plan="",
            code=f"[rexmle: this node's record is {end - start} bytes, over the import's per-node cap; its code "
                 "was not imported]",
            output="", exec_seconds=0.0, exception=None, analysis="", metric=number,
            maximize={b"true": True, b"false": False}.get(maximize),
            is_buggy=buggy is None or buggy.group(1) == b"true", created=None)
        return node, end

    def _parents(self, list_end: int, keys: list[str]) -> dict[str, str]:
        """The parents of ``keys`` from the ``node2parent`` entries after the nodes list, read backwards from the
        end of the file until the entry of the newest node already known with a parent (the entries are in node
        order), or the end of the nodes list, is reached."""
        wanted = set(keys)
        stop = self.reader._parented
        width = 256 + 160 * len(keys)
        while True:
            low = max(list_end, self.size - width)
            found: dict[str, str] = {}
            complete = low == list_end
            for match in _PAIR.finditer(self._read(low, self.size - low)):
                child = match.group(1).decode("utf-8", errors="replace")
                if child == stop:
                    complete = True
                if child in wanted:
                    found[child] = match.group(2).decode("utf-8", errors="replace")
            if complete or len(found) == len(wanted):
                return found
            width *= 2


def _scan_value(read: Any, start: int, size: int, strings: list[int]) -> int:
    """The offset just after the JSON object starting at ``start``, found without decoding it; ``strings`` gets
    where its first top-level strings begin (its keys and string values)."""
    depth, in_string, at = 0, False, start
    while at < size:
        chunk = read(at, _CHUNK)
        index, limit = 0, len(chunk)
        while True:
            match = (_STRING_STOP if in_string else _STRUCTURE).search(chunk, index)
            if match is None:
                index = limit
                break
            char, index = match.group(), match.end()
            if in_string:
                if char == b"\\":
                    if index >= limit:  # the escaped character is in the next chunk: read again from the backslash
                        index -= 1
                        break
                    index += 1
                else:
                    in_string = False
            elif char == b'"':
                in_string = True
                if depth == 1 and len(strings) < 64:
                    strings.append(at + index - 1)
            elif char in (b"{", b"["):
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    return at + index
        if index == 0:
            break
        at += index
    raise TreeIncomplete(f"the file ends at byte {size} inside a node record")


def bug_reason(node: ForeignNode) -> str:
    if node.exception:
        return f"the script raised {node.exception}"
    if node.metric is None:
        return "no validation metric was reported"
    return "the agent's review found a bug" if node.is_buggy else ""


def to_node(node: ForeignNode, *, node_id: int, parent_id: int | None, parent: Node | None, step: int | None,
            snapshot: str | None, snapshot_valid: bool) -> Node:
    """The rexmle node record of ``node`` (``parent``: the already converted parent, for the stage)."""
    stage = "draft" if parent is None else ("debug" if parent.is_buggy else "improve")
    depth = parent.debug_depth + 1 if parent is not None and stage == "debug" else 0
    timed_out = node.exception == "TimeoutError"
    execution = ExecSummary(exit_code=None if timed_out else (1 if node.exception else 0),
                            stopped_by="timeout" if timed_out else None,
                            output_tail=node.output, seconds=round(node.exec_seconds, 3))
    return Node(id=node_id, stage=stage, parent=parent_id, status=NodeStatus.DONE.value, plan=node.plan,
                code=node.code, execution=execution, analysis=node.analysis,
                metric=None if node.is_buggy else node.metric,
                lower_is_better=None if node.maximize is None else not node.maximize, is_buggy=node.is_buggy,
                bug_reason=bug_reason(node), submission_valid=snapshot_valid, snapshot_id=snapshot,
                debug_depth=depth, step=step)
