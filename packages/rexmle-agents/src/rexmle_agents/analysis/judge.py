"""The judge: one model call per factor per chunk of a run, answered through the ``submit_verdict`` tool, every quote
checked against the run.

Messages: the system prompt (``assets/judge_system.md``), then one user turn (``assets/judge.md``) with the task, the
chunk of the run, and the factor's rubric *last*, so the thirteen calls on one chunk share their long prefix (a
provider's prompt cache can serve it). The judge never sees the agent's name, the model, the score or the agent's
summaries of itself.

An answer without a usable call (malformed arguments, no call, a refusal, JSON text instead of the tool) is asked
for again, up to ``max_attempts`` calls; then that chunk is recorded as an error. A model error after the
backend's own retries is recorded the same way. Only the cost budget (``BudgetExceededError``) and a
configuration error stop the judge: :attr:`Judge.stopped` says why, and the pipeline writes what it has.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from importlib import resources
from string import Template
from typing import Any

from rexmle_agents.analysis.evidence import DEFAULT_CHUNK_CHARS, MIN_QUOTE_CHARS, RunText, TaskBrief
from rexmle_agents.analysis.factors import ASSETS, Factor, Rubrics
from rexmle_agents.analysis.records import ChunkAnswer, FactorVerdict, JudgeSettings, Quote
from rexmle_agents.models.base import Model
from rexmle_agents.models.types import FINISH_CONTENT_FILTER, GenerateConfig, Message, ModelResponse, ToolSpec
from rexmle_grade.errors import BudgetExceededError, ConfigurationError, ModelAPIError

# 2: the run text says per node which part of its code ran, and quotes of code are checked against that part only
# (a verdict judged under 1 is not reused)
PROMPT_VERSION = "2"
PROMPT_FILES = ("judge_system.md", "judge.md", "judge_ask_again.md")
MAX_QUOTES = 10
SUBMIT_VERDICT = ToolSpec(
    name="submit_verdict",
    description="Submit the verdict on one practice for the part of the run shown.",
    parameters={
        "type": "object",
        "properties": {
            "demonstrated": {"type": "boolean", "description": "true only if the code that ran or its output shows "
                                                                "the practice"},
            "evidence": {
                "type": "array", "maxItems": MAX_QUOTES,
                "items": {"type": "object",
                          "properties": {"node": {"type": "integer", "description": "the node number"},
                                         "quote": {"type": "string", "minLength": MIN_QUOTE_CHARS,
                                                   "description": "exact text from that node's code or output"}},
                          "required": ["node", "quote"], "additionalProperties": False},
            },
            "reason": {"type": "string", "description": "one or two sentences"},
        },
        "required": ["demonstrated", "evidence", "reason"],
        "additionalProperties": False,
    },
)
_REFUSAL = re.compile(r"^\s*(?:I'?m sorry|I am sorry|I can(?:'|no)t|I won'?t|I am unable|I'm unable|As an AI)",
                      re.IGNORECASE)
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@functools.cache
def _prompts() -> dict[str, str]:
    folder = resources.files(ASSETS)
    return {name: folder.joinpath(name).read_text(encoding="utf-8") for name in PROMPT_FILES}


def prompt_version() -> str:
    """``<PROMPT_VERSION>-<8 hex digits of the prompts' sha256>``: an edit that forgot the bump still shows."""
    digest = hashlib.sha256("\0".join(_prompts()[n] for n in PROMPT_FILES).encode("utf-8")).hexdigest()
    return f"{PROMPT_VERSION}-{digest[:8]}"


def check_verdict(arguments: Mapping[str, Any]) -> str:
    """What is wrong with ``submit_verdict`` arguments ("" when nothing is)."""
    missing = [k for k in ("demonstrated", "evidence", "reason") if k not in arguments]
    if missing:
        return "missing " + ", ".join(missing)
    if not isinstance(arguments["demonstrated"], bool):
        return f"demonstrated must be true or false, not {arguments['demonstrated']!r}"
    if not isinstance(arguments["reason"], str):
        return "reason must be a string"
    evidence = arguments["evidence"]
    if not isinstance(evidence, list):
        return "evidence must be a list of {node, quote} objects"
    for item in evidence:
        if not isinstance(item, Mapping) or not isinstance(item.get("quote"), str):
            return f"each evidence item needs a node and a quote string, got {item!r}"[:300]
        if _node_number(item.get("node")) is None:
            return f"evidence node must be a node number, got {item.get('node')!r}"[:300]
    return ""


def _node_number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def parse_answer(response: ModelResponse) -> tuple[dict[str, Any] | None, str]:
    """The verdict's arguments from a ``submit_verdict`` call (or, failing that, a JSON object in the text), or
    None and what was wrong."""
    calls = [c for c in response.tool_calls if c.name == SUBMIT_VERDICT.name]
    if calls:
        call = calls[0]
        if call.parse_error:
            return None, f"malformed arguments: {call.parse_error}"[:500]
        problem = check_verdict(call.arguments)
        return (None, f"malformed arguments: {problem}") if problem else (dict(call.arguments), "")
    if response.finish_reason == FINISH_CONTENT_FILTER:
        return None, "refused: the provider's content filter stopped the answer"
    if response.tool_calls:
        return None, f"called {', '.join(c.name for c in response.tool_calls)}, not {SUBMIT_VERDICT.name}"
    text = response.text.strip()
    match = _JSON_OBJECT.search(text)
    if match is not None:
        try:
            arguments = json.loads(match.group(0))
        except ValueError as exc:
            return None, f"the text holds no valid JSON verdict ({exc})"
        if isinstance(arguments, dict) and not check_verdict(arguments):
            return arguments, ""
        problem = check_verdict(arguments) if isinstance(arguments, dict) else "not a JSON object"
        return None, f"malformed JSON verdict in the text: {problem}"
    if _REFUSAL.search(text):
        return None, f"refused: {text[:200]!r}"
    return None, f"no call of {SUBMIT_VERDICT.name}" + (f" (answered in text: {text[:120]!r})" if text else "")


class Judge:
    """Judges factors of runs with one :class:`Model` (whose ledger carries the analysis's cost budget)."""

    def __init__(self, model: Model, rubrics: Rubrics, *, chunk_chars: int = DEFAULT_CHUNK_CHARS,
                 max_attempts: int = 3, temperature: float | None = None) -> None:
        if max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {max_attempts}")
        self.model = model
        self.rubrics = rubrics
        self.config = GenerateConfig(temperature=temperature)
        self.settings = JudgeSettings(model=model.name, prompt_version=prompt_version(),
                                      rubric_version=rubrics.label, chunk_chars=chunk_chars,
                                      max_attempts=max_attempts, temperature=temperature)
        self.stopped: str = ""  # why judging stopped (the budget, a configuration error); "" while it may go on
        self.stop_error: BudgetExceededError | ConfigurationError | None = None

    def judge(self, run: RunText, factor: Factor, task: TaskBrief) -> FactorVerdict:
        """The verdict on ``factor`` over every chunk of ``run``; once :attr:`stopped`, factors are ``not_run``."""
        common = {"run_id": run.run_id, "factor": factor.id, "source": "judge", "judge": self.settings,
                  "rubric_version": self.settings.rubric_version, "evidence_digest": run.digest}
        if self.stopped:
            return FactorVerdict(status="not_run", demonstrated=False, reason=f"not judged: {self.stopped}", **common)
        chunks = run.chunks(self.settings.chunk_chars)
        if not chunks:
            return FactorVerdict(status="not_demonstrated", demonstrated=False,
                                 reason="the run holds no code or execution output to judge", **common)
        answers: list[ChunkAnswer] = []
        for chunk in chunks:
            messages = [Message.system(_prompts()["judge_system.md"]),
                        Message.user(Template(_prompts()["judge.md"]).substitute(
                            task=task.describe(), part=f"part {chunk.index + 1} of {chunk.total}",
                            scope=("Other parts of the run are judged separately: judge only what is shown here."
                                   if chunk.total > 1 else "This is the whole run."),
                            run_text=chunk.text, rubric=factor.rubric_text(), factor_id=factor.id))]
            try:
                answers.append(self._ask(run, chunk.index, list(chunk.nodes), messages))
            except (BudgetExceededError, ConfigurationError) as exc:
                self.stopped, self.stop_error = exc.message, exc
                break
        return self._verdict(answers, len(chunks), common)

    def _ask(self, run: RunText, index: int, nodes: list[int], messages: list[Message]) -> ChunkAnswer:
        conversation = list(messages)
        tokens_in = tokens_out = 0
        cost: float | None = 0.0
        problem = ""
        for attempt in range(1, self.settings.max_attempts + 1):
            try:
                response = self.model.generate(conversation, tools=[SUBMIT_VERDICT], config=self.config)
            except BudgetExceededError as exc:
                if attempt == 1:
                    raise
                self.stopped, self.stop_error = exc.message, exc
                problem = f"stopped by the cost budget after {attempt - 1} unusable answer(s): {problem}"
                break
            except ConfigurationError:
                raise
            except ModelAPIError as exc:
                problem = f"model error: {exc.message}"[:500]
                break
            tokens_in += response.usage.input_tokens
            tokens_out += response.usage.output_tokens
            cost = None if cost is None or response.cost_usd is None else cost + response.cost_usd
            arguments, problem = parse_answer(response)
            if arguments is not None:
                evidence = [run.verify(_node_number(item["node"]), item["quote"])
                            for item in arguments["evidence"][:MAX_QUOTES]]
                return ChunkAnswer(index=index, nodes=nodes, claimed=arguments["demonstrated"], evidence=evidence,
                                   reason=arguments["reason"].strip()[:2000], attempts=attempt,
                                   input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost)
            conversation.append(response.message)
            for call in response.tool_calls:  # every tool call is answered before the next user turn
                conversation.append(Message.tool(call.id, f"not accepted: {problem}"))
            conversation.append(Message.user(Template(_prompts()["judge_ask_again.md"]).substitute(problem=problem)))
        else:
            problem = f"no usable verdict after {self.settings.max_attempts} call(s): {problem}"
        return ChunkAnswer(index=index, nodes=nodes, claimed=None, error=problem, attempts=attempt,
                           input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost)

    def _verdict(self, answers: list[ChunkAnswer], total: int, common: dict[str, Any]) -> FactorVerdict:
        proving = [a for a in answers if a.claimed and any(q.verified for q in a.evidence)]
        unverified = [a for a in answers if a.claimed and not any(q.verified for q in a.evidence)]
        errors = [a for a in answers if a.claimed is None]
        evidence: list[Quote] = sorted((q for a in answers for q in a.evidence), key=lambda q: not q.verified)
        if proving:
            status, reason = "demonstrated", " ".join(a.reason for a in proving[:2])
        elif errors or len(answers) < total:
            if len(answers) < total and not errors:
                status, reason = "not_run", f"stopped after {len(answers)} of {total} chunk(s): {self.stopped}"
            else:
                status, reason = "error", "; ".join(f"chunk {a.index + 1}: {a.error}" for a in errors[:3])
        elif unverified:
            problems = "; ".join(q.problem for a in unverified for q in a.evidence[:2]) or "no quote given"
            status, reason = "unverified", f"claimed, but no quote was found in the run ({problems}): " + \
                unverified[0].reason
        else:
            status, reason = "not_demonstrated", " ".join(a.reason for a in answers[:2])
        return FactorVerdict(status=status, demonstrated=status == "demonstrated", evidence=evidence,
                             reason=reason[:4000], chunks=answers, unverified_claims=len(unverified), **common)
