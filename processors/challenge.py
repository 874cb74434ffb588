"""The contradiction gate and the offline reasoner's challenge verdict, pure.

**Gate.** Each new episode is scored against the user's live beliefs by
meaning: the cosine to the belief's text, or to the nearest evidence it
cites, whichever is higher (`bearings`). Only beliefs that already held when
the episode happened can be challenged by it: an episode can tell that the
world changed since, not before. An episode at or above the threshold joins
the belief's open challenge (`gather`: many episodes make one challenge);
the open challenges that have their quorum of challengers (`quorum_of`:
more for a well-supported belief) are asked for as soon as one reaches it —
a point of the log, never of batch boundaries, so a replay in other batches
asks the same challenges; the others wait for more. The gate reads only episodes, never beliefs, so
what a challenge cycle writes cannot ask for another challenge: no loops.

**Verdict (offline, heuristic).** The offline reasoner cannot read meaning;
it decides by rules over words, and says so (`heuristic: true`):

1. *unrelated* — the challenger shares fewer than two subject terms (stemmed
   content words of the belief and its evidence): the gate's false alarm.
2. *refined* — a qualifier cue ("except", "only for", "unless", "but not"…):
   the belief still holds, narrower.
3. *contradicted* / *holds* by choices — "X over Y", "X instead of Y",
   "from Y to X", "back to X", "stopped using Y", "no longer wants Y"… name
   what is chosen and what rejected; a challenger that chooses what the
   belief's side rejects (or rejects what it chooses) contradicts it, one
   that chooses the same supports it.
4. *contradicted* by a reversal cue ("no longer", "switched", "stopped",
   "anymore", "gave up", "changed her mind", "for the first time"…) or by
   a negated subject term the belief's side never negates ("wrote no test").
5. *holds* otherwise.

Several challengers: each is judged alone and the majority of those
related decides; a tie holds (no supersede on an even split). Its accuracy on
the labeled set `processors/data/challenge_verdicts.tsv` is measured by
tests/pipeline/test_challenge.py (see processors/README.md).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

VERDICTS = ("holds", "refined", "contradicted", "unrelated")
LABELED = Path(__file__).with_name("data") / "challenge_verdicts.tsv"

# Gate threshold per embedder (REFLECT_CHALLENGE_MIN_SCORE overrides): MiniLM put
# contradicting and supporting episodes of the polars story at 0.82–0.91 to the
# nearest evidence and unrelated ones of the same user at 0.13–0.49; feature
# hashing sees shared words only (0.29–0.58 against 0.18–0.29 there).
GATE_SCORE = {"minilm": 0.6, "hashing": 0.32}


@dataclass(frozen=True)
class Answer:
    """A reasoner's verdict on one challenge. `cited`: 1-based numbers of the
    challengers it rests on; `statement`: the successor's text (refined,
    contradicted), or empty when the new evidence supports none."""
    verdict: str
    cited: tuple[int, ...]
    statement: str = ""
    reason: str = ""
    heuristic: bool = False


# ------------------------------------------------------------------------ gate

MAX_PENDING = 64  # beliefs a user's open challenges name at most (the strongest kept)
MAX_CHALLENGERS = 16  # challengers one challenge names at most (the newest kept)


@dataclass(frozen=True)
class Challenge:
    reflection_id: str
    challenger_ids: tuple[str, ...]
    similarity: float
    occurred_at: str  # the newest challenger's valid time: when the challenge happens


def bearings(episodes: Sequence[Mapping[str, Any]], vectors, beliefs: Sequence[Mapping[str, Any]],
             belief_vectors: Mapping[str, Any], evidence_vectors: Mapping[str, Any]) -> list[dict[str, float]]:
    """Per episode: belief id → how much the episode bears on it, the cosine
    to the belief's text or to the closest evidence it cites, whichever is
    higher; only beliefs that held when the episode happened. Exact (no
    top-k cut), so it depends on the beliefs and vectors alone."""
    import numpy as np

    from schemas import parse_time

    out: list[dict[str, float]] = [{} for _ in episodes]
    if not beliefs or not len(episodes):
        return out
    query = np.asarray(vectors, dtype=np.float32)
    for belief in beliefs:
        rid = belief["reflection_id"]
        cited = [e for e in belief.get("evidence_ids", ()) if e in evidence_vectors]
        rows = ([belief_vectors[rid]] if rid in belief_vectors else []) + [evidence_vectors[e] for e in cited]
        if not rows:
            continue
        scores = query @ np.asarray(rows, dtype=np.float32).T  # episodes × (text, evidence...)
        held_from = parse_time(belief["occurred_at"])
        for i, episode in enumerate(episodes):
            if parse_time(episode["occurred_at"]) < held_from or episode["id"] in cited:
                continue
            out[i][rid] = round(float(scores[i].max()), 6)
    return out


SUPPORT_PER_CHALLENGER = 2  # a belief resting on 2n pieces of evidence waits for n challengers


def quorum_of(belief: Mapping[str, Any], quorum: int) -> int:
    """Challengers a belief waits for: `quorum`, more for a well-supported
    one — a belief resting on thirty episodes is not reconsidered at every
    third mention, and a change that overturns it says so more than once."""
    support = int(belief.get("support") or len(belief.get("evidence_ids", ())))
    return min(MAX_CHALLENGERS, max(quorum, -(-support // SUPPORT_PER_CHALLENGER)))


def gather(pending: Sequence[Mapping[str, Any]], episodes: Sequence[Mapping[str, Any]],
           scores: Sequence[Mapping[str, float]], threshold: float,
           quorums: Mapping[str, int]) -> tuple[tuple[dict[str, Any], ...], int]:
    """Fold episodes, in stream order, into the user's open challenges (one per
    belief: many episodes bearing on it make one challenge). Returns them and
    how many episodes were folded: the fold stops after the first episode
    that brings a belief to its quorum of challengers (`quorums`, by belief),
    where the challenges that reached theirs are asked for — the next
    episodes are judged against what they decide."""
    held = {p["id"]: dict(p, by=list(p["by"])) for p in pending}
    for n, (episode, bearing) in enumerate(zip(episodes, scores), start=1):
        closing = False
        for rid in sorted(r for r, s in bearing.items() if s >= threshold):
            entry = held.setdefault(rid, {"id": rid, "by": [], "score": -1.0, "at": episode["occurred_at"]})
            if episode["id"] not in entry["by"]:
                entry["by"] = (entry["by"] + [episode["id"]])[-MAX_CHALLENGERS:]
            entry["score"], entry["at"] = max(entry["score"], bearing[rid]), episode["occurred_at"]
            entry["need"] = quorums.get(rid, entry.get("need", 1))
            closing |= due(entry)
        if closing:
            return _bounded(held), n
    return _bounded(held), len(episodes)


def due(entry: Mapping[str, Any]) -> bool:
    """An open challenge that has its quorum of challengers."""
    return len(entry["by"]) >= entry.get("need", 1)


def _bounded(held: Mapping[str, dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    kept = sorted(held.values(), key=lambda p: (-len(p["by"]), -p["score"], p["id"]))[:MAX_PENDING]
    return tuple(sorted(kept, key=lambda p: p["id"]))


def closed(pending: Sequence[Mapping[str, Any]]) -> list[Challenge]:
    """The challenges the open ones that reached their quorum become, most challengers first."""
    ordered = sorted((p for p in pending if due(p)), key=lambda p: (-len(p["by"]), -p["score"], p["id"]))
    return [Challenge(p["id"], tuple(p["by"]), p["score"], p["at"]) for p in ordered]


# --------------------------------------------------------------- offline verdict

_WORD = re.compile(r"[a-z][a-z0-9_+#.-]*[a-z0-9+#]|[a-z]")
_STOP = frozenset("""
a about after again all also always an and another any are as at back be because been before being both but by
can could did do does doing done during each every for from further had has have having her here hers him his
how i if in into is it its itself just like made make many more most much must my new now of off on once only
or other our out over own same she should so some such than that the their them then there these they this
those through to too under until up very was we were what when where which while who why will with would you
your user users agent episode said says asked asks told tells today yesterday often together team again
not no never nothing without none changed longer
""".split())  # the last line: negation and the offline statements' own words, which say nothing of a subject
FUNCTION_WORDS = _STOP  # also never a place word (extractive.place_words)
_CHOOSE = (  # (pattern, group of the chosen term, group of the rejected term)
    (re.compile(r"\b(\w+) (?:over|instead of|rather than|in place of|in favou?r of)\b( \w+)?"), 1, 2),
    (re.compile(r"\bfrom (\w+)(?: \w+)? to (\w+)"), 2, 1),
    (re.compile(r"\breplac(?:e|ed|es|ing) (\w+) with (\w+)"), 2, 1),
    (re.compile(r"\b(?:back|return(?:ed|s)?|switch(?:ed|es)?|mov(?:ed|es)|went|go(?:es|ing)?) (?:back )?to (\w+)"),
     1, None),
    (re.compile(r"\b(?:prefers?|preferred|chose|chooses|picks?|picked|favou?rs?|likes?|wants?|uses?) (\w+)"), 1, None),
    (re.compile(r"\b(?:stop(?:ped|s)?(?: using)?|quit|dropp(?:ed)?|drops?|abandon(?:ed|s)?|ditch(?:ed|es)?"
                r"|gave up(?: on)?|give up(?: on)?|no longer (?:wants?|uses?|likes?|prefers?)|away from"
                r"|(?:does not|doesn t|did not|didn t) (?:want|use|like)|dislikes?|hates?) (\w+)"), None, 1),
)
_REFINE = re.compile(r"\b(except|unless|only (for|when|if|on|in|with)|but not|apart from|other than|as long as"
                     r"|with the exception|but only|just for|limited to|mostly|at least for)\b")
_REVERSAL = re.compile(r"\b(no longer|not anymore|any ?more|stopped|stop|switched|switch(es)? back|went back|"
                       r"gone back|go back|gave up|give up|changed (his|her|their|my) mind|reversed|"
                       r"for the first time|now (prefers?|wants?|uses?|likes?)|instead|abandoned|dropped|"
                       r"ditched|quit|lifted|relaxed|scrapped|retired)\b")
_NEGATION = re.compile(r"(not|no|never|nothing|without|cannot|off|refus\w*|declin\w*|postpon\w*|avoid\w*|"
                       r"skip\w*|delay\w*)")
_CONDITION = frozenset(("until", "unless", "before", "till"))  # "would not retry until…": a condition, not a denial


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9+# ]+", " ", text.lower().replace("'", " "))


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def subject_terms(text: str) -> set[str]:
    return {_stem(w) for w in _plain(text).split() if w not in _STOP and len(w) > 2}


def choices(text: str) -> tuple[set[str], set[str]]:
    """(chosen, rejected) stemmed terms a text names; a term both chosen and
    rejected ("no longer wants polars" holds "wants polars") is rejected."""
    plain, chosen, rejected = _plain(text), set[str](), set[str]()
    for pattern, pick, drop in _CHOOSE:
        for match in pattern.finditer(plain):
            for group, into in ((pick, chosen), (drop, rejected)):
                word = (match.group(group) or "").strip() if group else ""
                if word and word not in _STOP and len(word) > 2:
                    into.add(_stem(word))
    return chosen - rejected, rejected


def _negated(text: str) -> set[str]:
    """Stemmed content terms within three words after a negation ("no test",
    "without reading the logs", "would not retry")."""
    words = _plain(text).split()
    out = set()
    for i, word in enumerate(words):
        if _NEGATION.fullmatch(word) or (word in ("won", "doesn", "don", "didn", "isn", "wasn", "can")
                                         and i + 1 < len(words) and words[i + 1] == "t"):
            if _CONDITION & set(words[i + 1:i + 8]):
                continue
            out |= {_stem(w) for w in words[i + 1:i + 4] if w not in _STOP and len(w) > 2}
    return out


def judge_one(belief: str, evidence: Sequence[str], challenger: str) -> tuple[str, str]:
    """(verdict, why) for one challenger."""
    side = [belief, *evidence]
    # The subject: the belief's own terms, and those most of its evidence shares
    # (a term of two evidence texts out of thirty is a detail, not the subject).
    common = max(2, (len(evidence) + 1) // 2) if len(evidence) > 1 else 1
    subject = subject_terms(belief) | {t for t, n in Counter(t for e in evidence for t in subject_terms(e)).items()
                                      if n >= common}
    shared = subject & subject_terms(challenger)
    if len(shared) < 2:
        return "unrelated", f"shares {len(shared)} subject term(s)"
    plain = _plain(challenger)
    cue = _REFINE.search(plain)
    if cue:
        return "refined", f"qualifier {cue.group(0)!r}"
    held_chosen, held_rejected = Counter[str](), Counter[str]()
    for text in side:
        chosen, rejected = choices(text)
        held_chosen.update(chosen)
        held_rejected.update(rejected)
    chosen, rejected = choices(challenger)
    held = {t for t in held_chosen if held_chosen[t] > held_rejected[t]}
    spurned = {t for t in held_rejected if held_rejected[t] > held_chosen[t]}
    if (chosen & spurned) or (rejected & held):
        return "contradicted", f"chooses {sorted(chosen & spurned) or '-'}, rejects {sorted(rejected & held) or '-'}"
    if (chosen & held) or (rejected & spurned):
        return "holds", f"chooses {sorted(chosen & held) or '-'}, rejects {sorted(rejected & spurned) or '-'}"
    cue = _REVERSAL.search(plain)
    if cue:
        return "contradicted", f"reversal {cue.group(0)!r}"
    # A negated subject term the belief's side never negates ("wrote no test"
    # against "writes a failing test first"); a phrasing the evidence shares
    # ("would not retry until the logs…") is support, not a change.
    denied = (_negated(challenger) & subject) - {t for text in side for t in _negated(text)}
    if denied:
        return "contradicted", f"negates {sorted(denied)}"
    return "holds", "same subject, no change cue"


def offline_verdict(belief: str, evidence: Sequence[str], challengers: Sequence[str]) -> Answer:
    """The offline reasoner's verdict over all challengers (the majority, ties
    to the change), citing the challengers that agree with it."""
    each = [judge_one(belief, evidence, c) for c in challengers]
    counts = Counter(v for v, _ in each)
    change = counts["contradicted"] + counts["refined"]
    if change > counts["holds"]:  # a tie holds: a belief is not superseded on an even split
        verdict = "contradicted" if counts["contradicted"] >= counts["refined"] else "refined"
        agree = {"contradicted", "refined"}
    elif counts["holds"]:
        verdict, agree = "holds", {"holds"}
    else:
        verdict, agree = "unrelated", {"unrelated"}
    cited = tuple(i for i, (v, _) in enumerate(each, start=1) if v in agree)
    reason = "; ".join(f"{i}: {v} ({why})" for i, (v, why) in enumerate(each, start=1))[:2000]
    statement = successor_text(verdict, belief, [challengers[i - 1] for i in cited])
    return Answer(verdict, cited, statement, reason, heuristic=True)


def successor_text(verdict: str, belief: str, cited: Sequence[str]) -> str:
    """What the offline reasoner states in the superseded belief's place: the
    choice the cited challengers name, else the terms they share."""
    if verdict not in ("refined", "contradicted") or not cited:
        return ""
    chosen, rejected = Counter[str](), Counter[str]()
    for text in cited:
        c, r = choices(text)
        chosen.update(c)
        rejected.update(r)
    terms = _recurring(cited)
    if verdict == "refined":
        words = _surface(cited)
        qualifier = ", ".join(words.get(t, t) for t in terms[:4]) or "the newer records"
        return f"Refined: {belief.strip()[:1000]} Qualified by: {qualifier}."
    now = [t for t, _ in sorted(chosen.items(), key=lambda tc: (-tc[1], tc[0]))][:2]
    before = [t for t, _ in sorted(rejected.items(), key=lambda tc: (-tc[1], tc[0])) if t not in now][:2]
    words = _surface(cited)
    if now and before:
        return (f"Changed: now {' and '.join(words.get(t, t) for t in now)} rather than "
                f"{' and '.join(words.get(t, t) for t in before)}.")
    return f"Changed: {', '.join(words.get(t, t) for t in terms[:4]) or 'the newer records'} (no longer as before)."


def _surface(texts: Iterable[str]) -> dict[str, str]:
    """Stem → the word the texts use most for it (ties: alphabetical)."""
    seen = Counter(w for text in texts for w in _plain(text).split() if w not in _STOP and len(w) > 2)
    out: dict[str, str] = {}
    for word, _ in sorted(seen.items(), key=lambda wc: (-wc[1], wc[0])):
        out.setdefault(_stem(word), word)
    return out


def _recurring(texts: Iterable[str]) -> list[str]:
    texts = list(texts)
    counts = Counter(t for text in texts for t in sorted(subject_terms(text)))
    floor = 2 if len(texts) > 1 else 1
    return [t for t, n in sorted(counts.items(), key=lambda tc: (-tc[1], tc[0])) if n >= floor]


# ------------------------------------------------------------------ measured


def labeled(path: Path = LABELED) -> list[tuple[str, list[str], str, str]]:
    """(belief, evidence, challenger, label) of the labeled set, in file order."""
    groups: dict[str, dict[str, Any]] = {}
    rows = []
    for line in path.read_text("utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        group, role, label, text = line.split("\t")
        entry = groups.setdefault(group, {"belief": "", "evidence": []})
        if role == "belief":
            entry["belief"] = text
        elif role == "evidence":
            entry["evidence"].append(text)
        else:
            rows.append((group, text, label))
    return [(groups[g]["belief"], groups[g]["evidence"], text, label) for g, text, label in rows]


def labeled_accuracy(path: Path = LABELED) -> dict[str, Any]:
    """The offline verdict (one challenger at a time) against the labels."""
    rows = labeled(path)
    hits: Counter = Counter()
    totals: Counter = Counter()
    for belief, evidence, challenger, label in rows:
        totals[label] += 1
        hits[label] += judge_one(belief, evidence, challenger)[0] == label
    return {"n": len(rows), "accuracy": round(sum(hits.values()) / len(rows), 3),
            "per_label": {k: round(hits[k] / totals[k], 3) for k in sorted(totals)},
            "counts": dict(sorted(totals.items()))}


if __name__ == "__main__":
    import json

    print(json.dumps(labeled_accuracy(), indent=2))
