"""Several workers of one consumer group, each with its own embedded Qdrant
Edge view and data directory, answer every read of every user as one worker
alone over the same log does — through any of them, and on through a worker's
death (issue 22).

A user's reads are answered by the worker that owns the user's partition
(streams/worker/ownership.py): the others forward them. When a worker is killed, the
survivors take its partitions over: they recover its tables, replay what
their own views lack, and meanwhile answer 503 — never a wrong answer.

    python -m pytest tests/integration/test_workers.py -s
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.parse

import pytest

from schemas import EpisodeRetracted
from streams.broker import free_port
from streams.topics import ensure_topics
from support.harness import wait_for
from support.runs import (SHORT_GROUP_TIMEOUTS, Workers, after_a_dead_member, episode_stream, kill, make_settings,
                          publish, users_by_partition)

pytestmark = [pytest.mark.integration, pytest.mark.broker]
PER_USER, QUERY = 40, "why did the auth revert break login"


def history(users) -> list:
    stream, n = episode_stream(users, PER_USER), len(users)
    # Stamped between episodes 29 (09:29) and 30: events in valid-time order (streams/README.md).
    retracted = [EpisodeRetracted(user_id=u, episode_id=f"{u}-6", occurred_at="2026-06-01T09:29:30Z") for u in users]
    return stream[:30 * n] + retracted + stream[30 * n:]


def answer(worker, user: str):
    """What a caller reads of the user through `worker` (the parts that do not
    move with the clock): stats, beliefs with their freshness, and recall's
    top k; the status instead when any read is refused."""
    q = urllib.parse.quote(QUERY)
    reads = [worker.get(f"/v1/users/{user}/{path}") for path in
             ("stats", "beliefs?refresh=concurrent", f"recall?refresh=concurrent&mode=instance&q={q}")]
    refused = [r.get("status") if r else None for r in reads if r is None or "status" in r]
    if refused:
        return ("refused", refused)
    stats, beliefs, recall = reads
    held = sorted((b["reflection_id"], b["text"], tuple(sorted(b["evidence_ids"])), b["status"], b["depth"])
                  for b in beliefs["beliefs"])
    fresh = {k: v for k, v in beliefs["freshness"].items() if k != "waited_ms"}
    # The top k as a set: scores decay with the clock, and two close ones may swap between reads.
    return stats, held, fresh, sorted((r["kind"], r["id"]) for r in recall["results"])


@after_a_dead_member  # noida-db: the survivors rejoined only ~3 min after the SIGKILL (503s meanwhile, none wrong)
def test_three_workers_answer_every_read_as_one_worker_and_go_on_after_one_dies(broker, tmp_path):
    workers = Workers(tmp_path)
    # Edge views (no Qdrant server): each worker holds only its own partitions' points.
    settings = make_settings(broker.url, tmp_path / "w0", threshold=15.0, min_episodes=10, qdrant_url=None,
                             **SHORT_GROUP_TIMEOUTS)
    assert settings.partitions >= 3
    users = users_by_partition(2, settings.partitions)
    asyncio.run(ensure_topics(settings))
    try:
        trio = [workers.start(settings)] + [
            workers.start(dataclasses.replace(settings, web_port=free_port(), data_dir=str(tmp_path / f"w{i}")))
            for i in (1, 2)]
        asyncio.run(publish(settings, history(users)))

        # One worker of another group over the same episodes, with its own
        # output topics: the single-worker answer.
        alone_settings = dataclasses.replace(
            settings, app_id=f"{settings.app_id}-alone", web_port=free_port(), data_dir=str(tmp_path / "alone"),
            topic_requests=f"{settings.topic_requests}-alone", topic_reflections=f"{settings.topic_reflections}-alone")
        asyncio.run(ensure_topics(alone_settings))
        alone = workers.start(alone_settings, name="alone")

        def unsettled() -> dict:
            answers = {u: answer(alone, u) for u in users}
            return {u: a for u, a in answers.items() if a[0] == "refused" or not (
                a[0]["episodes"] == PER_USER - 1 and a[0]["retracted"] == 1 and a[2]["fresh"] and a[1])}
        try:
            wait_for(lambda: not unsettled(), 240, "the single worker settled: every cycle done")
        except AssertionError:
            raise AssertionError(f"the single worker did not settle: {unsettled()}") from None
        reference = {u: answer(alone, u) for u in users}
        assert all(r[1] for r in reference.values()), "every user has beliefs"

        def differing() -> list:
            return [(w.settings.web_port, u, part, got[part], reference[u][part]) for w in trio for u in users
                    for got in [answer(w, u)] for part in range(len(got)) if got[part] != reference[u][part]]
        try:
            wait_for(lambda: not differing(), 240,
                     "every read of every user through every worker equals the single worker's")
        except AssertionError:
            diff = [(port, u, part, sorted(set(got) - set(ref)) if part == 1 else got,
                     sorted(set(ref) - set(got)) if part == 1 else ref) for port, u, part, got, ref in differing()]
            raise AssertionError(f"reads differ from the single worker's (worker, user, part, got, want): "
                                 f"{diff[:3]}") from None
        print(f"{len(users)} users x {len(trio)} workers: every read equals the single worker's")

        kill(trio[0])  # SIGKILL: no leave-group, the broker notices by the session timeout
        survivors, wrong, refused = trio[1:], [], 0
        started = time.monotonic()

        def all_right() -> bool:
            nonlocal refused
            right = True
            for w in survivors:
                for u in users:
                    got = answer(w, u)
                    if got[0] == "refused":
                        assert set(got[1]) <= {503}, f"{u} through {w.settings.web_port}: {got}"
                        refused, right = refused + 1, False
                    elif got != reference[u]:
                        wrong.append((w.settings.web_port, u, got))
                        right = False
            assert not wrong, f"a read answered wrong after the kill: {wrong[0]}"
            return right
        wait_for(all_right, 180, "every read through the survivors right again after the rebalance", every=0.2)
        print(f"after the kill: every read right again in {time.monotonic() - started:.1f} s; "
              f"{refused} reads answered 503 meanwhile, 0 wrong")
        logs = "".join(w.log_path.read_text(errors="replace") for w in survivors)
        assert "caught up partition" in logs, "a survivor replayed a partition it gained into its own view"
    finally:
        workers.stop_all()
