"""The rule cues of a recall question: words that mark it as about one
instance ("when did …", a date, a PR number) or about a pattern ("usually",
"prefer", "every time"), and `classify`, which routes by them alone. The
learned router (processors/router.py) takes their weights as features;
retrieval asks the router, or `classify` when it is not trained."""

from __future__ import annotations

import re

_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_DAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
# (label, pattern, weight). A strong cue weighs 2; a hint that also occurs in the
# other kind of question weighs 1, so a strong cue of the other kind outweighs it.
INSTANCE_CUES = [
    ("when did", r"\bwhen (?:did|was|were)\b", 2),
    ("what did … say", r"\bwhat did\b.*\b(?:say|write|reply|comment|ask|tell|decide|answer)\b", 2),
    ("what did", r"\bwhat did\b", 1),
    ("date", rf"\b(?:on )?{_MONTH} \d{{1,2}}\b|\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}\b", 2),
    ("relative day", rf"\b(?:yesterday|today|tonight|this morning"
                     rf"|last (?:{_DAY}|week|month|night|sprint|release))\b", 2),
    ("ago", r"\b\d+ (?:minutes?|hours?|days?|weeks?) ago\b|\bago\b", 2),
    ("which …", r"\bwhich (?:pr|pull request|commit|branch|deploy|build|release|test|issue|ticket"
                r"|file|job|migration|version)\b", 2),
    ("the time that", r"\bthe (?:time|day|incident|one) (?:that|when)\b", 2),
    ("did … ever", r"\bdid (?:the user|they|he|she|we|you|i|\w+) ever\b", 2),
    ("last/first time", r"\b(?:last|first) time\b", 2),
    ("what happened", r"\bwhat happened\b", 2),
    ("number", r"#\d+|\b(?:pr|issue|ticket|build|run|incident) \d+\b", 2),
    ("who did", r"\bwho (?:merged|approved|reviewed|reverted|broke|wrote|opened|closed|deployed)\b", 2),
    ("past-tense question", r"^\s*(?:\w+ )?(?:did|was|were|had)\b", 1),
]
PATTERN_CUES = [
    ("usually", r"\busually\b", 2), ("always", r"\balways\b", 2), ("never", r"\bnever\b", 2),
    ("tends to", r"\btends? to\b|\btendency\b", 2), ("typically", r"\btypical(?:ly)?\b", 2),
    ("prefer", r"\bprefer(?:s|red|ence|ences)?\b", 2), ("habit", r"\bhabits?\b|\bhabitual(?:ly)?\b", 2),
    ("pattern", r"\bpatterns?\b", 2), ("every time", r"\b(?:every|each) time\b|\bwhenever\b", 2),
    ("generally", r"\bgeneral(?:ly)?\b", 2), ("often", r"\boften\b|\bfrequently\b", 2),
    ("normally", r"\bnormally\b|\bby default\b|\bmost of the time\b|\bas a rule\b", 2),
    ("what does … like/want", r"\bwhat (?:does|do) .*\b(?:like|want|expect|care about|dislike|hate)\b", 2),
    ("likes to", r"\b(?:likes?|wants?|loves?|hates?) to\b|\bdislikes?\b", 1.5),
    ("how does …", r"\bhow (?:does|do)\b", 1.5),
    ("every", r"\bevery\b|\brecurring\b|\brepeatedly\b|\bin the habit\b", 1),
    ("style", r"\b(?:style|conventions?|approach|workflow|rule of thumb)\b", 1),
]
# No cue at all: a present-tense question about the user is general ("what does
# the user do about retries?"); anything else ("the deploy that broke auth")
# names a thing, so look for the thing.
GENERAL = re.compile(r"\b(?:what|how|why|which \w+) (?:does|do|is|are)\b"
                     r"|^\s*(?:does|do|is|are) (?:the user|they|he|she|we)\b")


def cues_in(text: str, cues) -> list[tuple[str, float]]:
    return [(label, weight) for label, pattern, weight in cues if re.search(pattern, text)]


def _named(kind: str, found: list[tuple[str, float]]) -> str:
    return f"{kind} cue{'s' if len(found) > 1 else ''} " + ", ".join(f"'{label}'" for label, _ in found)


def classify(query: str) -> tuple[str, str]:
    """("instance" | "pattern", why): the kind with the heavier matched cues wins;
    a tie, or no cue at all, goes to the GENERAL default."""
    text = query.lower()
    inst, patt = cues_in(text, INSTANCE_CUES), cues_in(text, PATTERN_CUES)
    a, b = sum(w for _, w in inst), sum(w for _, w in patt)
    if a != b:
        route, won, lost, other = ("instance", inst, patt, "pattern") if a > b else ("pattern", patt, inst, "instance")
        return route, _named(route, won) + (f" over {_named(other, lost)}" if lost else "")
    route = "pattern" if GENERAL.search(text) else "instance"
    why = "a general question" if route == "pattern" else "names a specific thing"
    start = f"{_named('instance', inst)} ties {_named('pattern', patt)}" if inst else "no cue"
    return route, f"{start}; default {route} ({why})"
