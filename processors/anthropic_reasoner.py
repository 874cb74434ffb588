"""The Anthropic reasoner: steps 2 and 4 of the loop on Claude, through the SDK.

Statements go to the model as delimited data under a system prompt that says
so (processors/prompts/*.md, versioned by PROMPT_VERSION); the answer is asked
for through a forced tool and, failing that, read from a JSON text answer.
Whatever the model answers, `reflection.judge` still decides what is kept:
only in-range citations of the evidence shown, at least the citation floor.
Anything that cannot be read raises ReasonerError, which fails the cycle
(reported in its audit event) and never the worker.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

import orjson

from processors.reasoners import Usage
from processors.reflection import Insight

PROMPT_VERSION = "anthropic-v1"
PROMPTS = Path(__file__).with_name("prompts")
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
_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


class ReasonerError(Exception):
    """The model's answer could not be used (or the API could not be reached)."""


def numbered(statements: Sequence[str]) -> str:
    # Angle brackets are escaped so a statement cannot close the data block.
    lines = (f"{i}. {s.replace('<', '‹').replace('>', '›')}" for i, s in enumerate(statements, start=1))
    return "<statements>\n" + "\n".join(lines) + "\n</statements>"


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
    prompt_version = PROMPT_VERSION

    def __init__(self, client, model: str, max_tokens: int = 1024) -> None:
        self.client, self.model, self.max_tokens = client, model, max_tokens

    @classmethod
    def from_settings(cls, settings) -> "AnthropicReasoner":
        import anthropic

        key = os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ValueError("the anthropic reasoner needs ANTHROPIC_API_KEY (or use --reasoner offline)")
        # The SDK reads ANTHROPIC_BASE_URL itself; it retries 429/5xx/529 with backoff.
        client = anthropic.Anthropic(api_key=key, max_retries=settings.reasoner_retries,
                                     timeout=settings.reasoner_timeout)
        return cls(client, settings.anthropic_model)

    def _ask(self, prompt: str, n: int, data: str, tool: dict) -> tuple[dict[str, Any], Usage]:
        import anthropic

        system = (PROMPTS / prompt).read_text().replace("{n}", str(n))
        try:
            answer = self.client.messages.create(
                model=self.model, max_tokens=self.max_tokens,
                # The stable prefix (system prompt, tools) is cached across calls.
                system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
                tools=[tool], tool_choice={"type": "tool", "name": tool["name"]},
                messages=[{"role": "user", "content": data}])
        except anthropic.APIError as exc:
            raise ReasonerError(f"{type(exc).__name__}: {exc}") from None
        used = answer.usage
        usage = Usage(1, used.input_tokens, used.output_tokens, getattr(used, "cache_read_input_tokens", 0) or 0)
        return answer_json(answer.content, tool["name"]), usage

    def questions(self, statements: Sequence[str], n: int = 3,
                  importance: Sequence[float] | None = None) -> tuple[list[str], Usage]:
        data, usage = self._ask("questions.md", n, numbered(statements), QUESTIONS_TOOL)
        questions = data.get("questions")
        if not isinstance(questions, list):
            raise ReasonerError("answer has no list of questions")
        return [q.strip()[:2000] for q in questions if isinstance(q, str) and q.strip()][:n], usage

    def insights(self, question: str, statements: Sequence[str], n: int = 5) -> tuple[list[Insight], Usage]:
        safe_question = question.replace("<", "‹").replace(">", "›")
        data, usage = self._ask("insights.md", n, f"Question: {safe_question}\n{numbered(statements)}",
                                INSIGHTS_TOOL)
        items = data.get("insights")
        if not isinstance(items, list):
            raise ReasonerError("answer has no list of insights")
        out = []
        for item in items[:n]:
            if isinstance(item, dict) and isinstance(item.get("text"), str) and isinstance(item.get("citations"), list):
                cited = tuple(c for c in item["citations"] if isinstance(c, int) and not isinstance(c, bool))
                out.append(Insight(item["text"].strip(), cited))
        return out, usage
