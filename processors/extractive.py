"""The offline reasoner's pure parts: grouping by meaning, routine, and the sentence.

No I/O and no model: similarity matrices and texts in, groups and sentences
out. Every choice breaks ties by index, so the same statements in the same
order always give the same groups and the same words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from processors.challenge import FUNCTION_WORDS

# This reasoner's beliefs: a statement, then how often and over what period, or
# how many beliefs agree; "(4 times, Jun–Aug)." costs a sentence the least of
# its meaning (MiniLM cosine to the pattern's description, on the sample).
_MONTH = r"[A-Z][a-z]{2}(?: \d{4})?"
BELIEF = re.compile(rf"^(.+?)\s\((?:\d+ times?(?:, {_MONTH}(?:–{_MONTH})?)?|in \d+ beliefs)\)\.$", re.S)
_TOKEN = re.compile(r"\S+")
_WORDISH = re.compile(r"[^\w]+")
GAP = "…"
TEMPLATE = 0.6  # share of a statement's words another repeats, from which both are one template


def belief_text(episodes: int, core: str, dates: Sequence[str] = ()) -> str:
    """What recurs, how often and over what period (when the dates are known)."""
    when = f", {period(dates)}" if dates else ""
    return f"{core.rstrip('. ')} ({episodes} time{'s' if episodes != 1 else ''}{when})."


def beliefs_text(beliefs: int, core: str) -> str:
    """A belief about beliefs: several, formed from different evidence, say this."""
    return f"{core.rstrip('. ')} (in {beliefs} beliefs)."


MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def period(dates: Sequence[str]) -> str:
    """The months an ISO-dated group spans: "Jun", "Jun–Aug", "Dec 2025–Feb 2026"."""
    first, last = min(dates), max(dates)
    (y0, m0), (y1, m1) = (int(first[:4]), int(first[5:7])), (int(last[:4]), int(last[5:7]))
    if (y0, m0) == (y1, m1):
        return MONTHS[m0 - 1]
    if y0 == y1:
        return f"{MONTHS[m0 - 1]}–{MONTHS[m1 - 1]}"
    return f"{MONTHS[m0 - 1]} {y0}–{MONTHS[m1 - 1]} {y1}"


def core_of(statement: str) -> str:
    """What a statement says: a belief of this reasoner without its count, else the text."""
    held = BELIEF.match(statement.strip())
    return (held.group(1) + "." if held else statement).strip()


def is_belief(statement: str) -> bool:
    return BELIEF.match(statement.strip()) is not None


def group(similarity: np.ndarray, cut: float) -> list[list[int]]:
    """Average-linkage grouping: merge the two most similar groups while their
    mean pairwise cosine is at least `cut`. Ties go to the lowest indices
    (numpy's argmax is row-major), so the same input groups the same way."""
    link = similarity.astype(np.float64).copy()
    np.fill_diagonal(link, -np.inf)
    groups: list[list[int] | None] = [[i] for i in range(len(link))]
    while len(link) > 1:
        a, b = divmod(int(np.argmax(link)), len(link))
        if link[a, b] < cut:
            break
        a, b = min(a, b), max(a, b)
        ga, gb = groups[a] or [], groups[b] or []  # both still open: a merged group is None
        merged = (len(ga) * link[a] + len(gb) * link[b]) / (len(ga) + len(gb))  # Lance–Williams, average linkage
        link[a], link[:, a] = merged, merged
        link[a, a] = -np.inf
        link[b], link[:, b] = -np.inf, -np.inf
        groups[a], groups[b] = ga + gb, None
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])


def representative(candidates: Sequence[int], members: Sequence[int], similarity: np.ndarray,
                   copies: Mapping[int, set[int]] | None = None) -> int:
    """The candidate closest on average to the group's other members (read
    with place words as gaps: `without`), not counting its own template's
    copies (`copies[c]`: members that are the same sentence as c with other
    values), which agree with it by their shared wording, not by what
    recurs; ties to the first. Measured on the sample (offline, MiniLM,
    place words in ≥ 3 statements; patterns found on seeds 7 / 8): v2's rule
    (closeness to the members less closeness to the rest of the evidence, so
    that a shared subsystem name would not pick the sentence) 3 / 4 — the
    Friday pattern said as "End of the week again, so the user kept
    geocoding off production until Monday" (cosine 0.41 to the pattern: two
    copies of it in the group) over "the user never ships on Fridays"
    (0.70); v2's rule without the copies' votes 4 / 3; closeness with them
    2 / 2; this 4 / 4. Place words already take the subsystem's name out,
    and what the rest of the evidence holds depends on what else was
    retrieved."""
    def near(c: int) -> float:
        others = [m for m in members if m != c and m not in (copies or {}).get(c, ())]
        return float(similarity[c, others].mean()) if others else 0.0
    return max(candidates, key=lambda c: (near(c), -c))


def cohesion(members: Sequence[int], similarity: np.ndarray) -> float:
    """Mean pairwise cosine of a group's members (1.0 for one member)."""
    if len(members) < 2:
        return 1.0
    inner = similarity[np.ix_(members, members)]
    return float((inner.sum() - np.trace(inner)) / (len(members) * (len(members) - 1)))


def _word(token: str) -> str:
    return _WORDISH.sub("", token.lower())


def words(text: str) -> set[str]:
    """The words a template keeps: numbers and code identifiers are its values."""
    return {w for t in _TOKEN.findall(text) for w in [_word(t)] if w and not is_value(_parts(t)[1])}


def one_template(a: set[str], b: set[str]) -> bool:
    """Two statements are one sentence with different values when either
    repeats most of the other's words."""
    return bool(a and b) and len(a & b) >= TEMPLATE * min(len(a), len(b))


# Statements of a call a word must be in to be tested as a place word, and how
# many of them (the first) are compared without it. Measured on the sample
# (offline, MiniLM; seeds 7 / 8; live beliefs, noise, patterns found): v2
# without place words 42 / 61 beliefs, 25 / 39 noise, 4 and 4 found; a place in
# ≥ 5 statements 39 / 46, 20 / 27, 3 and 4; in ≥ 4: 32 / 40, 15 / 20, 3 and 4;
# in ≥ 3 (with `representative`'s rule): 17 / 25, 5 / 11, 4 and 4. A call's
# evidence is 8 statements a question, so a subsystem that glues is in 3–4 of
# them: geocoding's unrelated work (a retry with backoff, a dashboard panel,
# a test run) sat at MiniLM 0.50–0.65 by the name, 0.22–0.30 without it.
# Feature hashing sees nothing but shared words: without any one of the words
# a few statements share ("revert of PR …: auth …") they are not alike, so
# every such word would be taken for a place; an embedder with no entry reads
# no place words.
PLACE_DF = {"minilm": 3}
PLACE_SAMPLE = 12


def place_words(statements: Sequence[str], vectors_of: Callable[[Sequence[str]], np.ndarray],
                cut: float, df: int) -> frozenset[str]:
    """Words that say where, not what: a subsystem's or a service's name that
    `df` or more statements carry and that is all they share — without it, they
    are not alike (mean cosine under `cut`). Grouping reads the statements
    without these, so one place's unrelated work does not make a theme, and
    a habit groups across the places it shows up. A word that carries a
    meaning ("logs" in statements that are all about reading logs before a
    retry) keeps them alike without it, and stays; function words are never
    tested. `vectors_of` embeds texts (the reasoner's own, remembered)."""
    cores = [core_of(s) for s in statements]
    holding: dict[str, list[int]] = {}
    for i, core in enumerate(cores):
        for w in words(core):
            holding.setdefault(w, []).append(i)
    tested = sorted(w for w, held in holding.items() if len(held) >= df and w.isalpha() and w not in FUNCTION_WORDS)
    read = {w: [without({w}, cores[i]) for i in holding[w][:PLACE_SAMPLE]] for w in tested}
    every = vectors_of([text for w in tested for text in read[w]])  # one call: the embedder batches them
    out, start = set(), 0
    for w in tested:
        vectors, start = every[start:start + len(read[w])], start + len(read[w])
        if cohesion(list(range(len(vectors))), vectors @ vectors.T) < cut:
            out.add(w)
    return frozenset(out)


def without(places: frozenset[str] | set[str], core: str) -> str:
    """A statement as grouping reads it: its place words elided."""
    if not places:
        return core
    return " ".join(GAP if _word(t) in places else t for t in _TOKEN.findall(core))


def routine(texts: Sequence[str]) -> bool:
    """A group is routine when most of its members are one sentence with
    different values as another member (a log line's template): what recurs
    is the wording of a record, not something the user does in different
    ways. A habit is written differently each time it is noticed."""
    sets = [words(t) for t in texts]
    copies = sum(any(one_template(a, b) for j, b in enumerate(sets) if j != i) for i, a in enumerate(sets))
    return len(sets) >= 2 and copies * 2 > len(sets)


_IDENTIFIER = re.compile(r"\d|[/_]|\w\.[a-z]{2,}")  # a number, a path, a snake_case or dotted name
_PUNCTUATED = re.compile(r"^([(\[\"']*)(.*?)([)\]\"':;,.!?]*)$", re.S)


def _parts(token: str) -> tuple[str, str, str]:
    """A token's leading punctuation, its core and its trailing punctuation
    (every part may be empty, so the pattern matches any token)."""
    match = _PUNCTUATED.match(token)
    assert match is not None
    return match.group(1), match.group(2), match.group(3)


def is_value(token: str) -> bool:
    """Which one, not what: numbers and code identifiers (paths, file and
    snake_case names) differ between two records of the same habit."""
    return bool(_IDENTIFIER.search(token))


def generalized(core: str, shared: frozenset[str] = frozenset()) -> str:
    """A statement with its values elided: numbers and code identifiers say
    when and which, not what recurs. A path keeps its leading components
    that the group shares (`shared`, from `shared_parts`): "auth/tokens.py"
    in a group that all touched auth reads "auth/…", which says what the
    group has in common where "…" said nothing. Every other word is kept:
    the sentence stays the one the user's agent wrote."""
    out: list[str] = []
    for token in _TOKEN.findall(core):
        head, value, tail = _parts(token)
        kept = _shared_prefix(value, shared) if is_value(value) else value
        if kept == value:
            out.append(token)
        elif kept:
            out.append(f"{head}{kept}/{GAP}{tail}")
        elif out and out[-1].endswith(GAP) and not head:
            out[-1] += tail
        else:
            out.append(head + GAP + tail)
    return " ".join(out) or core


def _shared_prefix(value: str, shared: frozenset[str]) -> str:
    """The leading path components of `value` that are in `shared`."""
    kept = []
    for part in value.split("/")[:-1]:
        if part.lower() not in shared:
            break
        kept.append(part)
    return "/".join(kept)


def shared_parts(texts: Sequence[str]) -> frozenset[str]:
    """The words, and the components of paths, that at least half of
    `texts` hold: what a group's members have in common, in their words."""
    held: dict[str, int] = {}
    for text in texts:
        parts = {p for t in _TOKEN.findall(text) for p in _word_parts(_parts(t)[1])}
        for p in parts:
            held[p] = held.get(p, 0) + 1
    return frozenset(p for p, n in held.items() if 2 * n >= len(texts))


def _word_parts(value: str) -> set[str]:
    """A token's word, or its path's components that are words."""
    return {w for part in value.split("/") for w in [_word(part)] if w and not is_value(part)}


# Average-linkage cosine at which statements are one theme, per embedder (the
# similarity bands differ: MiniLM puts paraphrases at ~0.5–0.7 and unrelated
# sentences at ~0.2, feature hashing at ~0.45 and ~0.1).
THEME_CUT = {"minilm": 0.45, "hashing": 0.35}
# How much closer than the theme's cut a statement must be to its group's
# representative to be cited. With
# MiniLM, background that shares a pattern's words (another pull request on
# the same auth file) sits at ~0.4–0.65 from a pattern's sentence, the
# pattern's own paraphrases at ~0.5–0.75: a bar above the theme's cut keeps
# most intruders out of what a belief cites (measured on the demo's sample,
# seeds 7 and 8). Feature hashing only sees shared words: no margin.
MEMBER_MARGIN = {"minilm": 0.05, "hashing": 0.0}


def question_about(core: str, usual: bool = False) -> str:
    """A question about a statement (its values elided), or about an earlier
    belief of this reasoner, quoted whole so that its answer can repeat it."""
    return f"How often does this {'routine ' if usual else ''}recur: {core}"


@dataclass(frozen=True)
class Asked:
    about: str  # what the question is about: a statement's words
    usual: bool  # it asks about routine
    belief: str | None  # the earlier belief it quotes, if any


def asked(question: str) -> Asked:
    """What a question of this reasoner asks; any other question is taken as it stands."""
    for usual in (True, False):
        if question.startswith(question_about("", usual)):
            rest = question.removeprefix(question_about("", usual)).strip()
            return Asked(core_of(rest), usual, rest if is_belief(rest) else None)
    return Asked(core_of(question), False, None)


def salient(statements: Sequence[str], similarity: np.ndarray, cut: float, importance: Sequence[float],
            n: int) -> list[tuple[int, bool, int | None]]:
    """The episodes worth a question, at most n, one per theme, each with
    whether it is routine and the earlier belief that already says it (the
    closest within `cut`), if any. First those that are not routine in the
    window (no other statement is the same sentence with other values), then
    those no earlier belief says, then those with the most meaning
    neighbours, then the more important, then the newest. A question about a
    statement that is not routine is answered only by a group that is not
    either: its template's copies are a log format, not a pattern. When only
    routine recurs, routine is what is asked about, and stated."""
    sets = [words(s) for s in statements]
    episodes = [i for i, s in enumerate(statements) if not is_belief(s)]
    beliefs = [i for i, s in enumerate(statements) if is_belief(s)]
    usual = {i: any(one_template(sets[i], sets[j]) for j in episodes if j != i) for i in episodes}
    said = {i: max((b for b in beliefs if similarity[i, b] >= cut), key=lambda b: (similarity[i, b], -b), default=None)
            for i in episodes}
    near = {i: sum(similarity[i, j] >= cut for j in episodes if j != i and usual[j] == usual[i]) for i in episodes}
    ranked = sorted(episodes, key=lambda i: (usual[i], said[i] is not None, -near[i], -importance[i], -i))
    picked: list[int] = []
    for i in ranked:
        if len(picked) < n and all(similarity[i, p] < cut for p in picked):
            picked.append(i)
    return [(i, usual[i], said[i]) for i in picked]


@dataclass(frozen=True)
class Theme:
    members: tuple[int, ...]  # 0-based statement indices, ascending
    first: int  # its representative: an earlier belief among the members if any, else their medoid
    #             (template copies not voting: `representative`)
    cohesion: float  # mean pairwise cosine of the members


def themes(statements: Sequence[str], vectors: np.ndarray, cut: float) -> list[Theme]:
    """Groups of ≥ 2 statements that say the same thing, largest and tightest
    first. An earlier belief in a group is its representative, so a repeat of
    a pattern restates that belief instead of a copy in other words."""
    similarity = vectors @ vectors.T
    out = []
    for members in group(similarity, cut):
        if len(members) < 2:
            continue
        held = [m for m in members if is_belief(statements[m])]
        sets = {m: words(core_of(statements[m])) for m in members}
        copies = {m: {o for o in members if o != m and one_template(sets[m], sets[o])} for m in members}
        out.append(Theme(tuple(members), representative(held or members, members, similarity, copies),
                         round(cohesion(members, similarity), 6)))
    return sorted(out, key=lambda t: (-len(t.members), -t.cohesion, t.members))


