"""Issue 24's story on the real broker, with both reasoners (the Anthropic one
against the stand-in Messages API, tests/support/messages_api.py): eight episodes of
Dana preferring polars over pandas form beliefs; ten saying she went back to
pandas supersede them within the batch that carries them, a successor cites
them, `as_of` shows both sides of the change, `explain` the chain, and the
pinned prompt block no longer carries the old beliefs."""

from __future__ import annotations

import urllib.parse
from dataclasses import replace

import pytest

from processors.challenge import quorum_of
from streams.adapters.factory import make_embedder
from schemas import from_dict, now
from streams.producer import Publisher
from streams.topics import ensure_topics
from support.broker import read_opened
from support.challenge_story import MIN_EPISODES, PANDAS, POLARS, THRESHOLD, USER, episodes
from support.harness import run, wait_for
from support.messages_api import MessagesServer, OfflineModel

pytestmark = pytest.mark.integration


async def publish(settings, events):
    async with Publisher(settings) as p:
        for e in events:
            await p.publish(e)


@pytest.fixture(params=["offline", "anthropic"])
def stack(request, settings, worker):
    # The story is told in other words each time: grouping it takes an embedder that reads meaning.
    s = replace(settings, threshold=THRESHOLD, min_episodes=MIN_EPISODES, challenge="on", embedder="minilm")
    if request.param == "offline":
        run(ensure_topics(s))
        yield s, worker(s), None
        return
    # The stand-in answers as the offline rules would, through the prompts.
    server = MessagesServer(OfflineModel(make_embedder("minilm")))
    try:
        s = replace(s, reasoner="anthropic")
        run(ensure_topics(s))
        yield s, worker(s, env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": server.url}), server
    finally:
        server.close()


def test_polars_to_pandas_supersedes_the_old_beliefs_with_history_and_a_successor(stack):
    s, w, server = stack
    beliefs = lambda query="": w.get(f"/v1/users/{USER}/beliefs?limit=1000{query}")["beliefs"]  # noqa: E731
    explain = lambda rid: w.get(f"/v1/users/{USER}/reflections/{rid}")  # noqa: E731

    run(publish(s, episodes(POLARS, 0, "polars")))
    old = wait_for(lambda: [b for b in beliefs() if b["cycle_id"] == f"{USER}:1"], 60, "the polars beliefs")
    assert all("polars" in b["text"] for b in old)
    before = urllib.parse.quote(now())
    run(publish(s, episodes(PANDAS, 24, "pandas")))

    ids = {b["reflection_id"] for b in old}
    wait_for(lambda: all(explain(r)["belief"]["status"] == "superseded" for r in ids), 60, "the old beliefs superseded")
    pandas = {f"pandas-{i}" for i in range(1, 11)}
    successors = set()
    for rid in ids:
        chain = explain(rid)["chain"]
        assert chain["verdict"] == "contradicted" and chain["successor"]["status"] == "live"
        assert {c["id"] for c in chain["challengers"]} <= pandas
        assert all(c["kind"] == "episode" for c in chain["challengers"])
        successors.add(chain["successor"]["id"])
    [successor] = successors  # one change of mind, one belief saying what holds now
    now_held = explain(successor)
    assert now_held["belief"]["text"] == "Changed: now pandas rather than polars."
    assert now_held["chain"]["supersedes"]["id"] in ids
    assert len(now_held["belief"]["evidence_ids"]) >= 2 and set(now_held["belief"]["evidence_ids"]) <= pandas

    # Within one batch of the contradicting episodes: the first of them, as many as the quorum, made the challenge.
    # (A challenge runs where the gates judge the run, in the requests pipeline: its record is its verdict.)
    reflections = [from_dict(e) for e in run(read_opened(s, s.topic_reflections))]
    verdicts = [e for e in reflections if e.TYPE == "ReflectionChallenged"]
    quorum = quorum_of(explain(verdicts[0].reflection_id)["belief"], s.challenge_quorum)
    assert verdicts[0].challenger_ids == tuple(f"pandas-{i}" for i in range(1, quorum + 1))
    [reasoner] = {e.reasoner for e in verdicts}  # the offline one says what it is: offline-extractive
    assert reasoner.startswith(s.reasoner) and all(e.outcome == "ok" for e in verdicts)
    assert {e.heuristic for e in verdicts} == {s.reasoner == "offline"}  # the offline verdict says it is a heuristic
    if server:
        assert any(r["body"]["tool_choice"]["name"] == "record_verdict" for r in server.requests)
        assert all(e.usage["calls"] == 1 for e in verdicts if e.reflection_id in ids)

    # Bi-temporal: as of before the change, held live; now, superseded (shown only when asked for).
    assert {b["reflection_id"]: b["status"] for b in beliefs(f"&as_of={before}")} == {r: "live" for r in ids}
    served = {b["reflection_id"] for b in beliefs()}
    assert not ids & served and successor in served
    shown = {b["reflection_id"]: b for b in beliefs("&include=superseded")}
    assert all(shown[r]["status"] == "superseded" and shown[r]["superseded_by"] == successor for r in ids)
    later = {b["reflection_id"]: b["status"] for b in beliefs(f"&as_of={urllib.parse.quote(now())}&include=superseded")}
    assert all(later[r] == "superseded" for r in ids)
    assert not ids & {b["reflection_id"] for b in beliefs(f"&as_of={urllib.parse.quote(now())}")}

    prompt = w.get(f"/v1/users/{USER}/beliefs?format=prompt&budget=4000&include=superseded")
    assert "now pandas rather than polars" in prompt["prompt"]
    assert not any(b["text"] in prompt["prompt"] for b in old)  # never pinned again
    assert w.get(f"/v1/users/{USER}/beliefs?include=gone")["error"]["field"] == "include"


def test_a_stale_belief_is_served_only_when_asked_for_and_never_pinned(settings, worker):
    from support.challenge_story import OTHER, spaced

    s = replace(settings, threshold=THRESHOLD, min_episodes=MIN_EPISODES, stale_after_days=30.0, challenge="on",
                embedder="minilm")
    run(ensure_topics(s))
    w = worker(s)
    beliefs = lambda query="": w.get(f"/v1/users/{USER}/beliefs?limit=1000{query}")["beliefs"]  # noqa: E731
    run(publish(s, episodes(POLARS, 0, "polars")))
    old = {b["reflection_id"] for b in wait_for(lambda: beliefs(), 60, "the polars beliefs")}
    before = urllib.parse.quote(now())
    run(publish(s, spaced(OTHER, "other", 22)))  # thirty-one days on in the user's valid time
    # The polars beliefs, and any later one resting only on support as old (hybrid evidence may pick it).
    stale = wait_for(lambda: (lambda got: got if old <= {b["reflection_id"] for b in got} else None)(
        [b for b in beliefs("&include=stale") if b["status"] == "stale"]), 60, "every polars belief stale")
    assert all(b["stale_at"] == "2026-04-02T09:00:00Z" for b in stale)
    assert not old & {b["reflection_id"] for b in beliefs()}  # not served unless asked for
    prompt = w.get(f"/v1/users/{USER}/beliefs?format=prompt&budget=4000&include=stale")
    assert not any(b["text"] in prompt["prompt"] for b in stale)  # never pinned
    assert {b["reflection_id"] for b in beliefs(f"&as_of={before}")} >= old  # held live before
