"""The Anthropic reasoner: steps 2 and 4 of the loop on Claude, through the SDK.

Statements go to the model as delimited data under a system prompt that says
so (streams/adapters/prompts/*.md, or the set REFLECT_PROMPTS names, each
versioned by a hash of its files: streams/adapters/prompt_sets.py); the answer is asked
for through a forced tool and, failing that, read from a JSON text answer.
Whatever the model answers, `reflection.judge` still decides what is kept:
only in-range citations of the evidence shown, at least the citation floor.
Anything that cannot be read raises ReasonerError, which fails the cycle
(reported in its audit event) and never the worker.

Batched mode (the default) asks for the insights of all a cycle's questions in
one call: 2 calls per cycle instead of 1 + one per question.

The insight prompts show each statement's day (`[Fri 2026-06-12] …`), so a
belief can say how often and over what period, as the offline reasoner's
do, and a model can see a pattern in the days themselves.
"""

from __future__ import annotations

import os
import re
from datetime import date
from pathlib import Path
from typing import Any, Sequence

import orjson

from processors.challenge import Answer
from processors.ports import Usage
from processors.reflection import Insight
from streams.adapters.prompt_sets import PACKAGED, checked, version_of

PROMPT_VERSION = version_of(PACKAGED)  # the packaged prompts' (streams/adapters/prompt_sets.py)
QUESTIONS_TOOL = {
    "name": "record_questions",
    "description": "Record the salient questions.",
    "input_schema": {"type": "object", "required": ["questions"], "properties": {
        "questions": {"type": "array", "items": {"type": "string"}}}},
}
INSIGHTS_TOOL = {
    "name": "record_insights",
    "description": "Record the insights, each with the statement numbers it cites.",
    "input_schema": {"type": "object", "required": ["insights"], "properties": {
        "insights": {"type": "array", "items": {
            "type": "object", "required": ["text", "citations"], "properties": {
                "text": {"type": "string"},
                "citations": {"type": "array", "items": {"type": "integer"}}}}}}},
}
BATCH_TOOL = {
    "name": "record_insights",
    "description": "Record the insights, each with the question it answers and the statement numbers it cites.",
    "input_schema": {"type": "object", "required": ["insights"], "properties": {
        "insights": {"type": "array", "items": {
            "type": "object", "required": ["question", "text", "citations"], "properties": {
                "question": {"type": "integer"},
                "text": {"type": "string"},
                "citations": {"type": "array", "items": {"type": "integer"}}}}}}},
}
VERDICT_TOOL = {
    "name": "record_verdict",
    "description": "Record whether the belief still holds, the newer statements it rests on, and what holds now.",
    "input_schema": {"type": "object", "required": ["verdict", "citations"], "properties": {
        "verdict": {"type": "string", "enum": ["holds", "refined", "contradicted", "unrelated"]},
        "citations": {"type": "array", "items": {"type": "integer"}},
        "statement": {"type": "string"},
        "reason": {"type": "string"}}},
}
# USD per million tokens: input, output, cache write (5 min), cache read — the
# public list prices of 2026; REFLECT_ANTHROPIC_PRICE overrides them.
PRICES = {
    "claude-haiku-4-5": (1.0, 5.0, 1.25, 0.10),
    "claude-sonnet-4-5": (3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4": (3.0, 15.0, 3.75, 0.30),
    "claude-opus-4-5": (5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": (15.0, 75.0, 18.75, 1.50),
    "claude-opus-4": (15.0, 75.0, 18.75, 1.50),
    "claude-3-5-haiku": (0.80, 4.0, 1.0, 0.08),
}
_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


class ReasonerError(Exception):
    """The model's answer could not be used, or (unavailable=True) the API did
    not answer even after the SDK's retries — what the circuit breaker counts."""

    def __init__(self, message: str, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


def price_of(model: str, override: tuple[float, ...] | None = None) -> tuple[float, ...] | None:
    """Prices of a model id (dated ids such as claude-haiku-4-5-20251001 included)."""
    if override:
        return override
    known = [name for name in PRICES if model == name or model.startswith(name + "-")]
    return PRICES[max(known, key=len)] if known else None


def usage_of(used, price: tuple[float, ...] | None) -> Usage:
    """One call's Usage from the API's usage block."""
    read = getattr(used, "cache_read_input_tokens", 0) or 0
    write = getattr(used, "cache_creation_input_tokens", 0) or 0
    tokens = (used.input_tokens, used.output_tokens, write, read)
    cost = None if price is None else sum(t * p for t, p in zip(tokens, price)) / 1e6
    return Usage(1, used.input_tokens, used.output_tokens, read, write, cost)


def _insight(item: Any) -> Insight | None:
    if isinstance(item, dict) and isinstance(item.get("text"), str) and isinstance(item.get("citations"), list):
        return Insight(item["text"].strip(), tuple(c for c in item["citations"] if _is_int(c)))
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _escaped(text: str) -> str:
    # A statement can neither close its block nor start a line that looks like
    # another numbered statement.
    return " ".join(text.replace("<", "‹").replace(">", "›").split())


def numbered(statements: Sequence[str]) -> str:
    return _block("statements", statements)


IMPORTANCE = re.compile(r"^\[(\d+(?:\.\d+)?)\] ")


def weighed(statements: Sequence[str], importance: Sequence[float] | None) -> list[str]:
    """Each statement with its importance in front, `[0.62] …`, as the
    questions prompt reads them (short: it is paid for on every cycle)."""
    if importance is None:
        return list(statements)
    return [f"[{w:.2f}] {s}" for s, w in zip(statements, importance)]


DAY = re.compile(r"^\[[A-Z][a-z]{2} (\d{4}-\d{2}-\d{2})\] ")


def dated(statements: Sequence[str], dates: Sequence[str] | None) -> list[str]:
    """Each statement with the day it occurred in front, `[Fri 2026-06-12] …`
    (from ISO times; a statement without one goes as it is)."""
    if dates is None:
        return list(statements)
    return [f"[{date.fromisoformat(d[:10]).strftime('%a')} {d[:10]}] {s}" if d else s
            for s, d in zip(statements, dates)]


FOUND = re.compile(r" \[found: ([0-9, –]+)\]$")


def with_found(question: str, found: Sequence[int]) -> str:
    """A batched question with the statements found for it, in the order they
    were retrieved, runs of consecutive numbers as ranges: `… [found: 1–8, 12]`.
    Without it the model (and the stand-in) sees every question's evidence as
    one list, and a group of two said as one question's evidence found it is
    said from a different pool: the demo's Friday pair was said by its weaker
    member (cosine 0.41 to the pattern, under the score's 0.45) only there."""
    runs: list[list[int]] = []
    for k in found:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    said = ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)
    return f"{question} [found: {said}]"


def found_of(line: str) -> tuple[str, list[int] | None]:
    """A batched question as `with_found` wrote it: its text and the statement
    numbers found for it (None when it names none)."""
    named = FOUND.search(line)
    if not named:
        return line, None
    numbers: list[int] = []
    for part in named.group(1).split(", "):
        low, _, high = part.partition("–")
        numbers += range(int(low), int(high or low) + 1)
    return line[:named.start()], numbers


def _block(tag: str, items: Sequence[str]) -> str:
    lines = (f"{i}. {_escaped(s)}" for i, s in enumerate(items, start=1))
    return f"<{tag}>\n" + "\n".join(lines) + f"\n</{tag}>"


def answer_json(content: Sequence[Any], tool: str) -> dict[str, Any]:
    """The tool's input, else a JSON object from the text (fenced or bare)."""
    for block in content:
        if getattr(block, "type", None) == "tool_use" and block.name == tool and isinstance(block.input, dict):
            return block.input
    text = "".join(getattr(b, "text", "") for b in content if getattr(b, "type", None) == "text").strip()
    fenced = _FENCED.search(text)
    candidate = fenced.group(1) if fenced else text[text.find("{"):text.rfind("}") + 1]
    try:
        data = orjson.loads(candidate)
    except orjson.JSONDecodeError:
        raise ReasonerError(f"answer is neither a {tool} call nor JSON: {text[:200]!r}") from None
    if not isinstance(data, dict):
        raise ReasonerError("answer JSON is not an object")
    return data


class AnthropicReasoner:
    name = "anthropic"
    dated = True  # the reflector passes when each statement occurred: the insight prompts show the day

    def __init__(self, client, model: str, max_tokens: int = 1024, batched: bool = True,
                 price: tuple[float, ...] | None = None, prompts: Path = PACKAGED) -> None:
        self.client, self.model, self.max_tokens, self.batched = client, model, max_tokens, batched
        self.price = price_of(model, price)
        self.prompts = checked(prompts)
        self.prompt_version = version_of(prompts)

    @classmethod
    def from_settings(cls, settings) -> "AnthropicReasoner":
        import anthropic

        key = os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ValueError("the anthropic reasoner needs ANTHROPIC_API_KEY (or use --reasoner offline)")
        # The SDK reads ANTHROPIC_BASE_URL itself; it retries 429/5xx/529 with backoff.
        client = anthropic.Anthropic(api_key=key, max_retries=settings.reasoner_retries,
                                     timeout=settings.reasoner_timeout)
        return cls(client, settings.anthropic_model, batched=settings.reasoner_batch == "batched",
                   price=settings.anthropic_price, prompts=Path(settings.prompts) if settings.prompts else PACKAGED)

    def _ask(self, prompt: str, n: int, data: str, tool: dict, max_tokens: int) -> tuple[dict[str, Any], Usage]:
        import anthropic

        system = (self.prompts / prompt).read_text().replace("{n}", str(n))
        try:
            answer = self.client.messages.create(
                model=self.model, max_tokens=max_tokens,
                # The stable prefix (system prompt, tools) is cached across calls.
                system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
                tools=[tool], tool_choice={"type": "tool", "name": tool["name"]},
                messages=[{"role": "user", "content": data}])
        except anthropic.APIError as exc:
            raise ReasonerError(f"{type(exc).__name__}: {exc}", unavailable=True) from None
        return answer_json(answer.content, tool["name"]), usage_of(answer.usage, self.price)

    def questions(self, statements: Sequence[str], n: int = 3,
                  importance: Sequence[float] | None = None) -> tuple[list[str], Usage]:
        data, usage = self._ask("questions.md", n, numbered(weighed(statements, importance)), QUESTIONS_TOOL,
                                self.max_tokens)
        questions = data.get("questions")
        if not isinstance(questions, list):
            raise ReasonerError("answer has no list of questions")
        return [q.strip()[:2000] for q in questions if isinstance(q, str) and q.strip()][:n], usage

    def insights(self, question: str, statements: Sequence[str], n: int = 5,
                 dates: Sequence[str] | None = None) -> tuple[list[Insight], Usage]:
        data, usage = self._ask("insights.md", n,
                                f"Question: {_escaped(question)}\n{numbered(dated(statements, dates))}",
                                INSIGHTS_TOOL, self.max_tokens)
        return [i for i in map(_insight, _items(data)[:n]) if i], usage

    def insights_for(self, questions: Sequence[str], statements: Sequence[str], n: int = 5,
                     found: Sequence[Sequence[int]] | None = None,
                     dates: Sequence[str] | None = None) -> tuple[list[tuple[int, Insight]], Usage]:
        """`found`: per question, the numbers (1-based, in the order retrieved) of
        the statements its evidence step found; each question names them."""
        asked = [with_found(q, f) for q, f in zip(questions, found)] if found is not None else questions
        data, usage = self._ask("insights_batch.md", n,
                                f"{_block('questions', asked)}\n{numbered(dated(statements, dates))}",
                                BATCH_TOOL, self.max_tokens * len(questions))
        out, per_question = [], [0] * len(questions)
        for item in _items(data):
            insight, asked = _insight(item), item.get("question") if isinstance(item, dict) else None
            # The question number is the model's word too: out of range, the insight is dropped.
            if insight and _is_int(asked) and 1 <= asked <= len(questions) and per_question[asked - 1] < n:
                per_question[asked - 1] += 1
                out.append((asked - 1, insight))
        return out, usage


    def verdict(self, belief: str, evidence: Sequence[str], challengers: Sequence[str]) -> tuple[Answer, Usage]:
        """A challenge cycle's verdict through a forced tool; what the model
        cites is checked by the challenge cycle (processors/challenger.py)."""
        data = f"<belief>\n{_escaped(belief)}\n</belief>\n{_block('evidence', evidence)}\n{numbered(challengers)}"
        answer, usage = self._ask("challenge.md", 1, data, VERDICT_TOOL, self.max_tokens)
        verdict, citations = answer.get("verdict"), answer.get("citations")
        if not isinstance(verdict, str) or not isinstance(citations, list):
            raise ReasonerError("answer has no verdict and list of citations")
        statement, reason = answer.get("statement"), answer.get("reason")
        return Answer(verdict.strip(), tuple(c for c in citations if _is_int(c)),
                      statement.strip()[:16000] if isinstance(statement, str) else "",
                      reason.strip()[:2000] if isinstance(reason, str) else ""), usage


def _items(data: dict[str, Any]) -> list[Any]:
    items = data.get("insights")
    if not isinstance(items, list):
        raise ReasonerError("answer has no list of insights")
    return items
