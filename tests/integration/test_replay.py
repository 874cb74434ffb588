"""The replay lab (issue 32): the same log and reasoner give an empty diff,
and a replay without an episode changes exactly the beliefs its retraction
reaches. The pure parts (spec, estimate, diff, the projector's `unseen`)
in-process; the side worker on the real broker."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from processors.accumulator import Trigger
from processors.embedders import HashingEmbedder
from processors.projector import EpisodeProjector, episode_point
from processors.replay import ReplayError, ReplaySpec, diff, estimate, promotion
from processors.ports import GONE, POSITION
from streams.adapters.view.edge import EdgeView
from schemas import EpisodeRecorded, EpisodeRetracted, ReflectionCreated
from streams.adapters.anthropic import PROMPT_VERSION
from streams.adapters.prompt_sets import FILES, PACKAGED, version_of
from streams.client.results import ReflectApiError
from streams.producer import Publisher
from streams.topics import ensure_topics
from streams.worker.replay import bytes_under
from support.harness import run, wait_for
from support.messages_api import MessagesServer, OfflineModel
from support.runs import episode_stream


def belief(rid, evidence, user="ana", text="t", status="live"):
    return {"user_id": user, "reflection_id": rid, "evidence_ids": evidence, "text": text, "status": status}


def test_spec_refuses_what_it_cannot_honour():
    for raw, why in (({"name": "Bad Name"}, "name"), ({"name": "a", "reasoner": "gpt"}, "reasoner"),
                     ({"name": "a", "until": "yesterday"}, "until"), ({"name": "a", "users": "ana"}, "users"),
                     ({"name": "a", "colour": 1}, "unknown"), ({"name": "a", "budget_tokens": -1}, "budget"),
                     ({"name": "a", "prompt_version": "v2"}, "offline reasoner has one"),
                     ({"name": "a", "reasoner": "anthropic", "prompt_version": "../etc"}, "prompt_version")):
        with pytest.raises(ReplayError, match=why):
            ReplaySpec.from_dict(raw)
    assert ReplaySpec.from_dict({"name": "a", "reasoner": "anthropic", "prompt_version": "v2"}).prompt_version == "v2"


def test_spec_keeps_users_and_the_log_until_its_time():
    spec = ReplaySpec.from_dict({"name": "a", "users": ["ana"], "until": "2026-06-01T00:00:00Z"})
    at = spec.until_ts
    assert spec.keeps("ana", at) and not spec.keeps("ana", at + 1) and not spec.keeps("ben", at - 1)


def test_diff_of_the_same_beliefs_is_empty_and_tells_each_change():
    live = [belief("r1", ["e1", "e2"]), belief("r2", ["e3", "e4", "e5"]), belief("r3", ["e6", "e7"]),
            belief("r4", ["e8", "e9"], status="live")]
    assert diff(live, live).to_dict() == {"added": [], "dropped": [], "changed": [], "same": 4}
    side = [belief("r1", ["e1", "e2"]),  # same
            belief("r2b", ["e3", "e4"]),  # r2 without e5: another id, paired by its evidence
            belief("r4", ["e8", "e9"], status="invalidated"),  # same id, status changed
            belief("r5", ["e10", "e11"])]  # new; r3 is gone
    found = diff(live, side)
    assert found.same == 1
    assert [d["reflection_id"] for d in found.dropped] == ["r3"]
    assert [a["reflection_id"] for a in found.added] == ["r5"]
    changed = {c["reflection_id"]: c["before"] for c in found.changed}
    assert changed == {"r2b": {"reflection_id": "r2", "evidence_ids": ["e3", "e4", "e5"]},
                       "r4": {"status": "live"}}


def test_a_belief_citing_a_renamed_belief_is_the_same():
    """Re-derived without e3, r1 has other evidence and so another id; r2,
    which cites it and says the same, only follows the rename."""
    live = [belief("r1", ["e1", "e2", "e3"]), {**belief("r2", ["r1", "r9"]), "depth": 2}, belief("r9", ["e5", "e6"])]
    side = [belief("r1b", ["e1", "e2"]), {**belief("r2b", ["r1b", "r9"]), "depth": 2}, belief("r9", ["e5", "e6"])]
    found = diff(live, side)
    assert found.same == 2 and not found.added and not found.dropped
    assert [(c["reflection_id"], c["before"]) for c in found.changed] == \
        [("r1b", {"reflection_id": "r1", "evidence_ids": ["e1", "e2", "e3"]})]


def test_promotion_logs_what_makes_the_live_view_the_sides():
    created = {rid: ReflectionCreated(user_id="ana", reflection_id=rid, cycle_id="ana:1", text=f"belief {rid}",
                                      evidence_ids=("e1", "e2"), depth=1, importance=0.5, confidence=0.5,
                                      reasoner="offline", prompt_version="v", question="q?")
               for rid in ("r1", "r3")}
    live = [belief("r1", ["e1", "e2"], text="belief r1"), belief("r2", ["e3", "e4"]),
            belief("r9", ["e5", "e6"], status="invalidated")]
    side = [belief("r1", ["e1", "e2"], text="belief r1"), belief("r3", ["e1", "e2"], text="belief r3")]
    events = promotion("lab", live, side, list(created.values()), "2026-06-01T00:00:00Z")
    assert [(type(e).__name__, e.reflection_id) for e in events] == \
        [("ReflectionCreated", "r3"), ("ReflectionInvalidated", "r2")]  # r1 is the same; r9 is gone already
    assert events[1].cause == "replay:lab" and events[1].status == "invalid"
    assert promotion("lab", side, side, list(created.values()), "2026-06-01T00:00:00Z") == []


def test_estimate_counts_the_cycles_the_trigger_asks():
    stream = episode_stream(["ana", "ben"], 40)
    trigger = Trigger(threshold=5.0, min_episodes=5)
    both = estimate(ReplaySpec("a", reasoner="anthropic"), [(e, None) for e in stream], trigger)
    one = estimate(ReplaySpec("a", reasoner="anthropic", users=("ana",)), [(e, None) for e in stream], trigger)
    assert both.users == ["ana", "ben"] and both.episodes == 80 and both.cycles > 0
    assert one.users == ["ana"] and one.cycles * 2 == both.cycles and 0 < one.tokens < both.tokens
    assert estimate(ReplaySpec("a"), [(e, None) for e in stream], trigger).tokens == 0  # offline pays nothing


def test_an_unseen_episode_is_gone_where_it_was_logged(tmp_path):
    """`without`: projected as if retracted at its own position, so no cycle,
    asked before or after it, reads it."""
    embedder = HashingEmbedder()
    view = EdgeView(tmp_path / "view", "reflect", embedder.dim)
    try:
        records = [EpisodeRecorded(user_id="ana", episode_id=f"e{i}", text=f"text {i}", importance=0.5,
                                   occurred_at="2026-06-01T09:00:00Z") for i in range(3)]
        EpisodeProjector(view, embedder, unseen=lambda e: e == "e1").apply(records, [10, 11, 12])
        points = view.get([episode_point(r) for r in records])
        hidden = points[episode_point(records[1])]
        assert hidden[POSITION] == 11 and hidden[GONE] == 11
        assert all(GONE not in points[episode_point(r)] for r in (records[0], records[2]))
        vector = embedder.embed(["text 1"])[0]
        for upto in (10, 11, 12, 100):
            assert "e1" not in {h.payload["episode_id"] for h in view.search("ana", vector, 5, upto=upto)}
    finally:
        view.close()


def test_a_replays_size_counts_what_is_there_while_its_worker_writes(tmp_path):
    """The side worker removes files while a summary sums them (a WAL
    segment, the state's temporary file): one listed, then gone, is not an
    error (CI saw a 500 from GET /v1/admin/replays/NAME that way)."""
    (tmp_path / "shard").mkdir()
    (tmp_path / "shard" / "segment").write_bytes(b"12345")
    assert bytes_under(tmp_path) == 5
    stop = threading.Event()

    def churn():  # what write_state and the WAL do: write a file, then replace or remove it
        while not stop.is_set():
            for i in range(20):
                (tmp_path / "shard" / f"wal-{i}").write_bytes(b"x")
            for i in range(20):
                (tmp_path / "shard" / f"wal-{i}").unlink()

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        sizes = [bytes_under(tmp_path) for _ in range(300)]
    finally:
        stop.set()
        writer.join()
    assert all(5 <= size <= 25 for size in sizes)


# -- the side worker, on the real broker ------------------------------------------------------------------

PER_USER = 60


def logged(settings, events) -> None:
    """`events` on the episodes log (its topics made first)."""
    async def publish():
        await ensure_topics(settings)
        async with Publisher(settings) as p:
            for event in events:
                await p.publish(event)
    run(publish())


def settled(w, users, per_user) -> bool:
    """Every episode in the view and folded (the view leads the accumulator,
    whose requests are not all asked until then), every request done."""
    stats = [w.stats(u) for u in users]
    return all(s.get("episodes", 0) + s.get("retracted", 0) == per_user == s.get("folded")
               and s.get("requests", 0) == s.get("requests_done") for s in stats)


def replayed(client, name: str, timeout: float = 180.0) -> dict:
    wait_for(lambda: client.replay(name)["state"] != "running", timeout, f"replay {name} done")
    found = client.replay(name)
    assert found["state"] == "done", found
    return found


def live_beliefs(client, user: str) -> list:
    return client.request("GET", f"/v1/users/{user}/beliefs", params={"limit": 100}).body["beliefs"]


@pytest.mark.integration
@pytest.mark.broker
def test_replay_same_log_is_empty_and_without_reaches_what_a_retraction_does(settings, worker):
    settings = dataclasses.replace(settings, threshold=15.0, min_episodes=10, max_depth=2)
    users = ["ana", "ben"]
    logged(settings, episode_stream(users, PER_USER))
    w = worker(settings)
    wait_for(lambda: settled(w, users, PER_USER), 120, "every episode projected and every cycle done")
    client = w.client

    started = subprocess.run([sys.executable, "-m", "streams.cli", "replay", "same", "--api", client.api],
                             capture_output=True, text=True, timeout=240)  # the command, followed to its end
    assert started.returncode == 0 and "replay same done" in started.stdout, started
    assert "0 tokens" in started.stderr  # the estimate, printed first: the offline reasoner pays none
    same = replayed(client, "same")
    assert same["progress"]["episodes"] == same["progress"]["episodes_total"] == len(users) * PER_USER
    found = client.replay_diff("same")
    assert found["same"] > 0 and not (found["added"] or found["dropped"] or found["changed"]), found

    cited = live_beliefs(client, "ana")[0]["evidence_ids"][0]
    client.start_replay("without", without=[cited])
    replayed(client, "without")
    without = client.replay_diff("without")
    touched = {d["reflection_id"] for d in without["dropped"]} | \
        {c["before"].get("reflection_id", c["reflection_id"]) for c in without["changed"]}
    assert touched and not without["added"], without
    shown = subprocess.run([sys.executable, "-m", "streams.cli", "diff", "without", "--api", client.api],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and f"lost {cited}" in shown.stdout, shown

    # The live worker's own retraction of that episode, for comparison.
    # The live worker's own retraction of that episode: the beliefs its walk
    # invalidates (no longer live) or weakens (live, the episode lost).
    before = {b["reflection_id"] for u in users for b in live_beliefs(client, u)}
    asked = w.stats("ana")["requests"]
    logged(settings, [EpisodeRetracted(user_id="ana", episode_id=cited, occurred_at="2026-06-01T12:00:00Z")])
    wait_for(lambda: w.stats("ana")["requests"] > asked and settled(w, users, PER_USER), 60, "the walk done")
    after = {b["reflection_id"]: b for u in users for b in live_beliefs(client, u)}
    walked = {r for r in before if r not in after or cited in (after[r].get("lost_evidence_ids") or ())}
    assert walked == touched, (sorted(walked), without)

    assert {r["spec"]["name"] for r in client.replays()} == {"same", "without"}
    client.drop_replay("same")
    assert {r["spec"]["name"] for r in client.replays()} == {"without"}
    assert client.request("POST", "/v1/admin/replays/without/promote").status == 409  # another history


ONE_EACH = "Give at most one insight per question."


class Obedient:
    """The stand-in Messages API answering as the offline model, and doing
    what one prompt line asks: under a system prompt that says ONE_EACH,
    only each answer's first insight (a prompt that makes it find less)."""

    def __init__(self) -> None:
        self.model, self.systems = OfflineModel(), []

    def __call__(self, body: dict) -> tuple[int, dict]:
        status, answer = self.model(body)
        self.systems.append(system := body["system"][0]["text"])
        for block in answer.get("content", ()):
            if ONE_EACH in system and block.get("type") == "tool_use" and "insights" in block.get("input", {}):
                block["input"]["insights"] = block["input"]["insights"][:1]
        return status, answer


def prompt_set(folder, added: str):
    """The packaged prompts, with a line added to the batched insights prompt."""
    folder.mkdir(parents=True)
    for name in FILES:
        (folder / name).write_text((PACKAGED / name).read_text() + (f"\n{added}\n" if name == "insights_batch.md"
                                                                    else ""))
    return folder


@pytest.mark.integration
@pytest.mark.broker
def test_a_replay_under_another_prompt_promoted_is_what_the_live_view_shows(settings, worker):
    """Live cycles on the anthropic path with the packaged prompts; a replay
    under an edited prompt set (chosen by its folder in the worker's prompt
    library) finds less, carries that set's version, and once promoted is
    what the live view shows: afterwards the diff is empty."""
    settings = dataclasses.replace(settings, threshold=15.0, min_episodes=10, reasoner="anthropic")
    users = ["ana", "ben"]
    logged(settings, episode_stream(users, PER_USER))
    model = Obedient()
    api = MessagesServer(model)
    try:
        edited = prompt_set(Path(settings.data_dir) / "prompts" / "one-each", ONE_EACH)
        w = worker(settings, env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})
        wait_for(lambda: settled(w, users, PER_USER), 120, "every episode projected and every cycle done")
        client = w.client
        assert model.systems and not any(ONE_EACH in system for system in model.systems)
        with pytest.raises(ReflectApiError) as unknown:
            client.start_replay("nowhere", reasoner="anthropic", prompt_version="no-such-set")
        assert unknown.value.status == 404 and PROMPT_VERSION in str(unknown.value) and "one-each" in str(unknown.value)

        client.start_replay("terse", reasoner="anthropic", prompt_version="one-each")
        terse = replayed(client, "terse")
        assert terse["prompts"]["version"] == version_of(edited) != PROMPT_VERSION
        assert any(ONE_EACH in system for system in model.systems)  # the side worker asked with the edited set
        before = client.replay_diff("terse")
        assert before["dropped"] or before["changed"], before
        done = client.promote_replay("terse")
        assert done["published"] > 0 and done["invalidated"] > 0
        assert {b["prompt_version"] for u in users for b in live_beliefs(client, u)} >= {version_of(edited)}
        after = client.replay_diff("terse")
        assert not (after["added"] or after["dropped"]), after
        for kept in after["changed"]:  # one id in both: the live log keeps its later reinforcements
            assert kept["reflection_id"] not in {c.get("before", {}).get("reflection_id") for c in after["changed"]}
            assert set(kept["before"]) == {"evidence_ids"} and set(kept["evidence_ids"]) < \
                set(kept["before"]["evidence_ids"]), kept
        assert client.promote_replay("terse")["published"] == 0  # nothing left to publish
    finally:
        api.close()


@pytest.mark.integration
def test_a_replay_whose_side_worker_hangs_fails_and_frees_its_slot(settings, worker):
    """A side worker that makes no progress for REFLECT_REPLAY_STALL seconds
    (here stopped with SIGSTOP) is stopped and its replay marked failed,
    naming the setting; the next replay may start."""
    logged(settings, episode_stream(["ana"], 12))
    w = worker(dataclasses.replace(settings, replay_stall=15.0))
    wait_for(lambda: w.stats("ana").get("episodes") == 12, 60, "every episode in")
    client = w.client
    pid = client.start_replay("hung")["pid"]
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: client.replay("hung")["state"] != "running", 90, "the hung replay given up")
    hung = client.replay("hung")
    assert hung["state"] == "failed" and "REFLECT_REPLAY_STALL" in hung["error"], hung
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
             30, "the side worker gone")
    client.drop_replay("hung")
    client.start_replay("next")
    replayed(client, "next")
