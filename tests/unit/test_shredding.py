"""Sealed episodes (streams/shredding.py): what goes on the log holds no text,
opens under its own key on its own record only, and reads as erased once
its key is gone."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from schemas import (ContractError, EpisodeRecorded, EpisodeRetracted, ReflectionChallenged, ReflectionCreated,
                     ReflectionCycleCompleted, decode)
from streams.adapters.sealing import KeyRing, SealingError, new_key
from streams.shredding import erased, open_event, opener, seal_event

PHRASE = "the heron-lantern code is 7741"


def episode(**fields) -> EpisodeRecorded:
    return EpisodeRecorded(user_id="ana", episode_id="e1", text=PHRASE, importance=0.4, source="chat",
                           metadata={"where": PHRASE}, **fields)


def test_a_sealed_episode_on_the_log_holds_ids_not_text_and_opens_to_what_was_recorded():
    key, record = new_key(), episode()
    sealed = seal_event(record, "episode\0ana\0e1\0v1", key)
    wire = sealed.encode()
    assert PHRASE.encode() not in wire and b"chat" not in wire and b"heron" not in wire
    back = decode(wire)
    assert (back.user_id, back.episode_id, back.importance, back.text) == ("ana", "e1", 0.4, "")
    assert open_event(back, key) == record


def test_a_sealed_text_moved_onto_another_record_or_under_another_key_does_not_open():
    key = new_key()
    sealed = seal_event(episode(), "k", key)
    with pytest.raises(SealingError):
        open_event(dataclasses.replace(sealed, episode_id="e2"), key)  # another episode
    with pytest.raises(SealingError):
        open_event(dataclasses.replace(sealed, user_id="bob"), key)  # another user's
    with pytest.raises(SealingError):
        open_event(sealed, new_key())


def test_an_episode_whose_key_is_gone_reads_as_its_erasure():
    sealed = seal_event(episode(), "k", new_key())
    gone = open_event(sealed, None)
    assert gone == erased(sealed)
    assert isinstance(gone, EpisodeRetracted) and (gone.episode_id, gone.reason, gone.event_id) == (
        "e1", "erasure", sealed.event_id)


def test_the_contract_refuses_text_beside_a_sealed_one_naming_the_field():
    sealed = seal_event(episode(), "k", new_key())
    with pytest.raises(ContractError) as refused:
        dataclasses.replace(sealed, text="in clear too").encode()
    assert refused.value.field == "sealed"
    with pytest.raises(ContractError) as refused:
        dataclasses.replace(sealed, sealed={"kid": "k"}).encode()
    assert refused.value.field.startswith("sealed")


def test_a_reader_without_keys_refuses_a_sealed_episode_and_passes_the_rest():
    sealed, clear = seal_event(episode(), "k", new_key()), episode()
    open_one = asyncio.run(opener(None, [sealed, clear]))
    assert open_one(clear) is clear
    with pytest.raises(ContractError) as refused:
        open_one(sealed)
    assert refused.value.field == "sealed"


def test_two_processes_making_the_default_ring_at_once_read_the_same_one(tmp_path):
    path, rings = tmp_path / "master.keys", []
    threads = [threading.Thread(target=lambda: rings.append(KeyRing.load(path, create=True))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({tuple(r.keys.items()) for r in rings}) == 1 and len(rings) == 8
    assert [p.name for p in tmp_path.iterdir()] == ["master.keys"]  # no half-made file left


def test_a_beliefs_text_and_question_travel_sealed_and_an_erased_belief_reads_as_nothing():
    belief = ReflectionCreated(user_id="ana", reflection_id="b1", cycle_id="c1", text=PHRASE, question="why?",
                               evidence_ids=("e1", "e2"), depth=1, importance=0.5, confidence=0.5, reasoner="offline",
                               prompt_version="offline-v1")
    key = new_key()
    sealed = seal_event(belief, "k", key)
    wire = sealed.encode()
    assert PHRASE.encode() not in wire and b"why?" not in wire and b'"e1"' in wire  # its evidence stays in clear
    assert open_event(decode(wire), key) == belief
    assert open_event(decode(wire), None) is None


def test_a_cycles_questions_and_notes_travel_sealed_and_once_erased_it_keeps_its_counts():
    cycle = ReflectionCycleCompleted(user_id="ana", cycle_id="c1", why="threshold", questions=(PHRASE,), kept=0,
                                     dropped=1, duration_ms=1.0, outcome="empty", reasoner="offline",
                                     usage={"calls": 1, "input_tokens": 9, "output_tokens": 9},
                                     drops=({"reason": "depth", "text": PHRASE},), read_ids=("e1", "e2"))
    key = new_key()
    wire = seal_event(cycle, "k", key).encode()
    assert b"heron" not in wire and b'"read_ids":["e1","e2"]' in wire
    assert open_event(decode(wire), key) == cycle
    erased_cycle = open_event(decode(wire), None)
    assert (erased_cycle.questions, erased_cycle.drops, erased_cycle.dropped) == ((), None, 1)
    erased_cycle.encode()  # what is left is a valid event


def test_a_challenges_reason_travels_sealed_and_once_erased_it_keeps_its_verdict():
    challenge = ReflectionChallenged(user_id="ana", cycle_id="ana:challenge:1", reflection_id="r1",
                                     challenger_ids=("e7", "e8"), outcome="ok", reasoner="anthropic",
                                     usage={"calls": 1, "input_tokens": 9, "output_tokens": 9}, duration_ms=1.0,
                                     verdict="contradicted", cited_ids=("e7",), status="superseded",
                                     reason=f"the user now skips {PHRASE}")
    key = new_key()
    wire = seal_event(challenge, "k", key).encode()
    assert b"heron" not in wire and b'"verdict":"contradicted"' in wire
    assert open_event(decode(wire), key) == challenge
    left = open_event(decode(wire), None)
    assert (left.reason, left.verdict, left.status) == (None, "contradicted", "superseded")
    left.encode()
    with pytest.raises(ContractError, match="sealed"):  # a reason beside a sealed one
        decode(wire.replace(b'"verdict"', b'"reason":"x","verdict"'))
    # A challenge that failed says nothing in clear: neither text is required.
    decode(dataclasses.replace(challenge, reason=None).encode())
