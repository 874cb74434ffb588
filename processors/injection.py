"""Text that tries to be an instruction, told apart from text about a user.

Episode text is data, and so is belief text (a model wrote it from episode
text). Two pure functions keep it that way wherever it goes next:

- `instruction_cue` names the instruction-shaped part of a text, if any: an
  order to the agent reading it ("ignore previous instructions", "you must",
  "from now on"), a role marker or chat-template token ("SYSTEM:",
  "<|im_start|>", "[INST]"), a delimiter of the prompt it would sit in, or
  an exfiltration request. The reflector drops a belief that carries one
  (processors/reflection.screen); the prompt block withholds one.
- `neutralised` renders a text so it cannot leave its line or its block:
  one line, no control or invisible characters, no angle brackets or
  backtick fences, as a quoted string.

The cues are written over a normalised form (NFKC, lower case, punctuation
as spaces), so "Ignore, previous: instructions" and full-width letters match
too. A belief about what the user wants ("the user wants logs before a
retry") matches none: they address the agent, not describe the user.
"""

from __future__ import annotations

import re
import unicodedata

_INVISIBLE = re.compile(r"[\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")
_WORD_CUES: tuple[tuple[str, str], ...] = tuple((name, pattern) for name, pattern in (
    ("override of instructions",
     r"\b(ignore|disregard|forget|override|bypass|skip)( \w+){0,4} (instructions?|rules|prompts?|directions"
     r"|guidelines|guardrails|polic(y|ies)|context|messages?)\b"),
    ("new instructions", r"\b(new|updated|real|actual|hidden|secret) (instructions?|orders|directives?|task)\b"),
    ("system prompt", r"\b(system|developer|hidden) (prompt|message|instructions?)\b"),
    ("order to the agent", r"\b(you|assistant|agent|model|ai)( \w+){0,2} (must|shall|should"
                           r"|have to|are required to|need to|will now|are now|are to)\b"),
    ("role change", r"\b(act as|pretend (to be|you are)|roleplay|from now on|jailbreak|developer mode"
                    r"|debug mode|dan mode|god mode)\b"),
    ("instruction to the reader",
     r"\b(do not|don t|never) (tell|reveal|mention|inform|warn|let) (the )?(user|anyone)\b"),
    ("exfiltration", r"\b(send|forward|upload|post|email|leak|share|exfiltrate|print|reveal|dump)( \w+){0,5} "
                     r"(passwords?|credentials?|api keys?|tokens?|secrets?|private keys?|ssh keys?"
                     r"|every (statement|user|record))\b"),
    ("citation order", r"\bcite( \w+){0,3} (episodes?|statements?|everything|all)\b"),
))
_RAW_CUES: tuple[tuple[str, re.Pattern], ...] = (
    ("role marker", re.compile(r"(^|[\n\r.!?;>\]}]\s*)(system|assistant|user|human|ai|developer|tool)\s*:",
                               re.I)),
    ("chat template token", re.compile(r"<\|[^|>]{0,40}\|>|\[/?inst\]|<</?sys>>|^\s*#{2,}\s*(instruction|system)",
                                       re.I | re.M)),
    ("prompt delimiter", re.compile(r"</?\s*(system|assistant|user|instructions?|statements?|questions?"
                                    r"|observations?|user_observations|context|prompt)\s*>", re.I)),
)
_COMPILED = tuple((name, re.compile(pattern)) for name, pattern in _WORD_CUES)


def folded(text: str) -> str:
    """Lower case words separated by single spaces: what the word cues read."""
    plain = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text)).lower()
    return " ".join(re.sub(r"[^\w]+", " ", plain).split())


def instruction_cue(text: str) -> str | None:
    """The kind of instruction-shaped text in `text`, or None if it reads as data."""
    raw = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))
    for name, pattern in _RAW_CUES:
        if pattern.search(raw):
            return name
    words = folded(text)
    for name, pattern in _COMPILED:
        if pattern.search(words):
            return name
    return None


_BRACKETS = str.maketrans({"<": "‹", ">": "›", "`": "'", "\\": "/", '"': "'"})


def neutralised(text: str, limit: int = 600) -> str:
    """One quoted line that cannot close its block or open another: control,
    invisible and line-breaking characters become spaces, angle brackets and
    backticks lose their meaning, quotes cannot end the quotation."""
    plain = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))
    plain = "".join(" " if unicodedata.category(ch)[0] in "CZ" and ch != " " else ch for ch in plain)
    line = " ".join(plain.translate(_BRACKETS).split())
    return '"' + (line if len(line) <= limit else line[:limit - 1] + "…") + '"'
