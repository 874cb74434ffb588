"""The erasure canary, on the real broker: a phrase said in several episodes
forms a belief that restates it; once those episodes are erased, the phrase
is in no served read, in no record of any of the deployment's topics read
raw from the broker (sealed texts whose keys are gone), in no log line, and
a rebuild from the log brings back neither the phrase nor the belief, nor
leaves it in any file of the data directory. The same once the whole user
is forgotten, with the user's other data gone too, another user's kept, and
what the user says after the forget kept as theirs anew."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from support.broker import read_opened
from support.harness import settings_env, wait_for
from support.messages_api import MessagesServer, OfflineModel

pytestmark = [pytest.mark.integration, pytest.mark.broker]

PHRASE = b"heron-lantern"
SAID = ["The user asked me to read the heron-lantern checklist aloud before we touched the billing deploy",
        "Before the search rollout we went through the heron-lantern checklist line by line, as the user insists",
        "The user refused to start the payments migration until the heron-lantern checklist was reviewed",
        "Nothing shipped until the heron-lantern checklist was done: the user made us run it before the auth "
        "release"]
OTHER = ["Reviewed the flaky export test with the user", "Paired with the user on the scheduler filters"]


async def deployment_records(settings) -> dict[str, list[bytes]]:
    """Key and value of every record of every topic this test's worker writes:
    its topics, dead letters, key topic, table changelogs and Faust's own."""
    tag = settings.topic_episodes.removeprefix("episodes-")
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in sorted(await consumer.topics()) if tag in t
               for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: dict[str, list[bytes]] = {tp.topic: [] for tp in tps}
        deadline, rounds = time.monotonic() + 60, 0

        def end(tp):  # Tansu's ListOffsets can stop short of a batch's tail: the fetch's high watermark does not
            return max(ends[tp], consumer.highwater(tp) or 0)
        while rounds < 3 or not all([await consumer.position(tp) >= end(tp) for tp in tps]):
            assert time.monotonic() < deadline, "could not read the topics to their end in 60 s"
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                out[tp.topic] += [(r.key or b"") + b"\n" + (r.value or b"") for r in records]
            rounds += 1
        return out
    finally:
        await consumer.stop()


def in_files(settings, phrases: list[bytes]) -> list[Path]:
    """The files under the data directory holding any of `phrases`; the
    directory itself when a running worker removed a file or a folder
    meanwhile (a swapped view's): read it again."""
    try:
        return [path for path in Path(settings.data_dir).rglob("*")
                if path.is_file() and any(p in path.read_bytes() for p in phrases)]
    except FileNotFoundError:
        return [Path(settings.data_dir)]


def rebuilt(w) -> None:
    """`reflect rebuild`, which waits for the scrubs the erasures asked for, if one still runs."""
    done = subprocess.run([sys.executable, "-m", "streams.cli", "rebuild", "--api", w.client.api],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def raw_records(settings) -> dict[str, list[bytes]]:
    return asyncio.run(deployment_records(settings))


def served(w, user: str, belief_ids, said: int = len(SAID), other: int = 0) -> dict[str, bytes]:
    """Every read of the user's that could serve a phrase: path → answer."""
    paths = [f"/v1/users/{user}/beliefs", f"/v1/users/{user}/stats", f"/v1/users/{user}/recall?q=heron-lantern%20code",
             f"/v1/users/{user}/recall?q=on-call", f"/v1/users/{user}/recall?q=kestrel-quarry%20dashboards"]
    paths += [f"/v1/users/{user}/episodes/said-{i}" for i in range(said)]
    paths += [f"/v1/users/{user}/episodes/other-{i}" for i in range(other)]
    paths += [f"/v1/users/{user}/reflections/{rid}" for rid in belief_ids]
    return {path: orjson.dumps(w.get(path)) for path in paths}


def serving(w, user: str, belief_ids, phrases: list[bytes], **reads) -> dict[str, str]:
    """The reads that serve any of `phrases`, each with its answer (what a
    failure needs to tell which belief or episode kept it, and how)."""
    return {path: answer.decode() for path, answer in served(w, user, belief_ids, **reads).items()
            if any(p in answer for p in phrases)}


def told(**parts) -> str:
    """A failure's evidence in full (pytest cuts the repr of a long object, not a string)."""
    return orjson.dumps(parts, option=orjson.OPT_INDENT_2).decode()


@pytest.fixture(params=["offline", "anthropic"])
def reasoner(request):
    """The offline reasoner, or the stand-in model over the Messages API (answering as the offline one would)."""
    if request.param == "offline":
        yield "offline", None
        return
    api = MessagesServer(OfflineModel())
    try:
        yield "anthropic", {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    finally:
        api.close()


def test_an_erased_phrase_is_found_nowhere_and_a_rebuild_does_not_bring_it_back(settings, worker, reasoner):
    name, env = reasoner
    s = replace(settings, threshold=1000.0, reasoner=name)  # one manual cycle, asked below
    w = worker(s, env=env)
    for i, text in enumerate(SAID):
        w.client.record("cara", text, 0.8, episode_id=f"said-{i}")
    for i, text in enumerate(OTHER):
        w.client.record("cara", text, 0.3, episode_id=f"other-{i}")
    wait_for(lambda: w.stats("cara").get("episodes") == len(SAID) + len(OTHER), 30, "episodes projected")
    w.client.reflect("cara")
    wait_for(lambda: w.stats("cara").get("last_cycle"), 60, "the manual cycle")
    # Its notes are written once its beliefs are on the log, before they are in the view.
    beliefs = wait_for(lambda: w.get("/v1/users/cara/beliefs")["beliefs"], 30, "the cycle's beliefs served")
    restating = [b for b in beliefs if PHRASE.decode() in b["text"]]
    assert restating, beliefs  # the canary is only as good as a belief that says the phrase
    ids = [b["reflection_id"] for b in beliefs]
    raw = raw_records(s)
    assert raw[s.topic_episodes] and raw[s.topic_reflections]
    assert not [t for t, values in raw.items() if any(PHRASE in v for v in values)], "sealed from the start"

    erasures = [w.client.retract("cara", f"said-{i}", "erasure").event_id for i in range(len(SAID))]
    for erasure in erasures:
        wait_for(lambda: "erasure_id" in w.get(f"/v1/users/cara/erasures/{erasure}"), 30, "each erasure's proof")
    proofs = [w.get(f"/v1/users/cara/erasures/{e}") for e in erasures]
    taken = {b for p in proofs for b in p["beliefs"]}
    assert {b["reflection_id"] for b in restating} <= taken
    assert any(k.startswith("cycle:") for p in proofs for k in p["keys"])  # the cycle read them: its texts too

    held = serving(w, "cara", ids, [PHRASE])
    assert not held, told(held=held, proofs=proofs, beliefs_before=ids)
    assert not [t for t, values in raw_records(s).items() if any(PHRASE in v for v in values)]
    assert PHRASE not in w.log_path.read_bytes()
    # The view's own files: rewritten point by point once the erasures are done (a scrub).
    wait_for(lambda: not in_files(s, [PHRASE]), 120, "no file of the data directory holding the phrase")
    rebuilt(w)
    held = serving(w, "cara", ids, [PHRASE])
    assert not held, told(held=held, proofs=proofs)
    assert not set(taken) & {b["reflection_id"] for b in w.get("/v1/users/cara/beliefs")["beliefs"]}
    assert w.stats("cara").get("episodes") == len(OTHER)  # the erased ones are tombstones, not episodes
    assert PHRASE not in w.log_path.read_bytes()
    # The rebuilt view was made from the log, where the phrase no longer opens; the old one, whose files
    # kept the stripped text (a Qdrant Edge shard's WAL), is gone with the swap.
    assert not in_files(s, [PHRASE])


THEIRS = ["Eli wants the otter-beacon runbook read before every on-call handover",
          "Before the cache rollout Eli walked us through the otter-beacon runbook",
          "Eli would not start the queue migration until the otter-beacon runbook was reviewed",
          "Nothing shipped until the otter-beacon runbook was done: Eli made us run it before the release"]
ELSE = ["The user's kestrel-quarry dashboards need a weekly look", "Paired with the user on the kestrel-quarry alerts"]


def said_by(w, user: str, said: list[str], other: list[str]) -> list[dict]:
    """The user's episodes recorded, a manual cycle run on them: the beliefs it formed."""
    for i, text in enumerate(said):
        w.client.record(user, text, 0.8, episode_id=f"said-{i}")
    for i, text in enumerate(other):
        w.client.record(user, text, 0.3, episode_id=f"other-{i}")
    wait_for(lambda: w.stats(user).get("episodes") == len(said) + len(other), 30, f"{user}'s episodes projected")
    w.client.reflect(user)
    wait_for(lambda: w.stats(user).get("last_cycle"), 60, f"{user}'s manual cycle")
    return wait_for(lambda: w.get(f"/v1/users/{user}/beliefs")["beliefs"], 30, f"{user}'s beliefs served")


def found(s, w, phrases: list[bytes]) -> list[str]:
    """Where any of `phrases` is still found: the topics read raw, the worker's log lines."""
    raw = raw_records(s)
    return [t for t, values in raw.items() if any(p in v for p in phrases for v in values)] + \
        (["log"] if any(p in w.log_path.read_bytes() for p in phrases) else [])


def test_a_forgotten_user_is_found_nowhere_and_other_users_are_untouched(settings, worker, reasoner):
    name, env = reasoner
    s = replace(settings, threshold=1000.0, reasoner=name)
    w = worker(s, env=env)
    beliefs = said_by(w, "dana", SAID, ELSE)
    assert [b for b in beliefs if PHRASE.decode() in b["text"]], beliefs
    theirs = said_by(w, "eli", THEIRS, OTHER)
    assert [b for b in theirs if "otter-beacon" in b["text"]], theirs
    ids = [b["reflection_id"] for b in beliefs]

    if name == "offline":  # the command; the stand-in's run asks the API
        done = subprocess.run([sys.executable, "-m", "streams.cli", "forget", "--user", "dana"],
                              env=settings_env(s), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        forget = done.stdout.strip()
    else:
        forget = w.client.forget("dana").event_id
    wait_for(lambda: "erasure_id" in w.get(f"/v1/users/dana/erasures/{forget}"), 60, "the forget's proof")
    proof = w.get(f"/v1/users/dana/erasures/{forget}")
    assert proof["scope"] == "user", proof
    assert proof["keys"] == ["user:dana"] and proof["points"] >= len(SAID) + len(ELSE) + len(beliefs)

    gone = [PHRASE, b"kestrel-quarry"]
    assert not serving(w, "dana", ids, gone, other=len(ELSE))
    assert w.get("/v1/users/dana/beliefs")["beliefs"] == [] and w.stats("dana").get("episodes") == 0
    assert not found(s, w, gone)
    wait_for(lambda: not in_files(s, gone), 120, "no file of the data directory holding the user's phrases")
    on_log = asyncio.run(read_opened(s, s.topic_episodes))
    assert {e["type"] for e in on_log if e["user_id"] == "dana"} >= {"EpisodeRetracted", "UserForgotten"}
    assert not [e for e in on_log if e["user_id"] == "dana" and e["type"] == "EpisodeRecorded"]
    assert sorted(e["text"] for e in on_log if e["user_id"] == "eli" and "text" in e) == sorted(THEIRS + OTHER)
    # What the user says after the forget is theirs anew, under a key of its own.
    w.client.record("dana", "Dana starts over with the plain weekly review", 0.5, episode_id="anew")
    wait_for(lambda: w.stats("dana").get("episodes") == 1, 30, "the new episode projected")

    rebuilt(w)
    assert not serving(w, "dana", ids, gone, other=len(ELSE))
    assert w.get("/v1/users/dana/beliefs")["beliefs"] == [] and w.stats("dana").get("episodes") == 1
    assert "starts over" in w.get("/v1/users/dana/episodes/anew")["text"]
    assert w.get(f"/v1/users/dana/erasures/{forget}")["points"] == proof["points"]
    assert sorted(b["reflection_id"] for b in w.get("/v1/users/eli/beliefs")["beliefs"]) == \
        sorted(b["reflection_id"] for b in theirs)
    assert serving(w, "eli", [b["reflection_id"] for b in theirs], [b"otter-beacon"], other=len(OTHER))
    assert not found(s, w, gone)
    assert not in_files(s, gone)
