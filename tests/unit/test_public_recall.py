"""The public recall benchmark (tests/benchmarks/public_recall.py) can tell a
real retriever from a stub: its parser keeps the annotated evidence, and its
scorer gives the evidence itself 1.0 and a fixed or random answer next to 0.
No embedder, no view: seconds. With the REALTALK files at hand it checks them too."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import realtalk  # noqa: E402
from retrieval_quality import score  # noqa: E402


def raw_conversation(sessions: int = 4, per_session: int = 50, seed: int = 3) -> dict:
    """A conversation in REALTALK's layout: turns with dia ids, one with a photo,
    questions whose evidence is written the ways the real files write it."""
    rng = random.Random(seed)
    raw: dict = {"name": {"speaker_1": "Ana", "speaker_2": "Bo"}}
    for s in range(1, sessions + 1):
        raw[f"session_{s}_date_time"] = f"0{s}.01.2024, 10:00:00"
        raw[f"session_{s}"] = [{"clean_text": f"message {s}-{i} about topic {rng.randrange(99)}",
                                "speaker": "Ana" if i % 2 else "Bo", "dia_id": f"D{s}:{i}",
                                "date_time": f"0{s}.01.2024, 10:{i:02d}:00"} for i in range(1, per_session + 1)]
    raw["session_1"][2]["blip_caption"] = "a dog on a beach"
    raw["qa"] = [{"question": f"question {n}?", "answer": "x", "category": 1 + n % 3,
                  "evidence": [f"D{2 + n % 3}:{5 + n}", f"D{2 + n % 3}:{20 + n};D{2 + n % 3}:{30 + n}"]}
                 for n in range(20)]
    raw["qa"] += [{"question": "ranged?", "answer": "x", "category": 2, "evidence": ["D3:40-D3:42", "D4:7."]},
                  {"question": "unanswerable?", "answer": "x", "category": 1, "evidence": ["D9:1"]},
                  {"question": "none?", "answer": "x", "category": 3, "evidence": []}]
    return raw


def as_rows(conv: realtalk.Conversation) -> list[dict]:
    return [{"type": q.type, "q": q.text, "evidence": set(q.evidence)} for q in conv.questions]


def recall_at_10(answers: list[list[str]], rows: list[dict]) -> float:
    return score({"m": answers}, [{**r, "type": "all"} for r in rows])["m"]["all"]["r@10"]


def test_the_parser_keeps_turns_times_and_every_written_form_of_evidence():
    conv = realtalk.conversation("c7", "Chat_7_Ana_Bo", raw_conversation())
    assert len(conv.turns) == 200 and conv.turns[0].id == "c7-D1:1"
    assert conv.turns[0].occurred_at == "2024-01-01T10:01:00Z"
    assert conv.turns[2].text.endswith("[photo: a dog on a beach]") and conv.turns[2].text.startswith("Ana: ")
    ranged = next(q for q in conv.questions if q.text == "ranged?")
    assert ranged.evidence == {"c7-D3:40", "c7-D3:41", "c7-D3:42", "c7-D4:7"}
    assert {q.type for q in conv.questions} == {"multi-hop", "temporal", "commonsense"}
    assert len(conv.questions) == 21 and conv.dropped_questions == 2 and conv.dropped_evidence == 1
    assert realtalk.evidence_ids(["D5:12;D5:16", "D1:2, D1:3", "D2:9."]) == ["D5:12", "D5:16", "D1:2", "D1:3", "D2:9"]


def test_the_scorer_tells_the_evidence_from_a_fixed_or_random_answer():
    conv = realtalk.conversation("c1", "synthetic", raw_conversation())
    rows, turn_ids = as_rows(conv), [t.id for t in conv.turns]
    rng = random.Random(11)
    oracle = [sorted(r["evidence"]) for r in rows]
    fixed = [turn_ids[:10] for _ in rows]  # the same ten turns whatever the question
    drawn = [rng.sample(turn_ids, 10) for _ in rows]
    assert recall_at_10(oracle, rows) == 1.0
    assert recall_at_10(fixed, rows) == 0.0
    assert recall_at_10(drawn, rows) < 0.15
    half = [sorted(r["evidence"])[:1] + turn_ids[:9] for r in rows]  # one evidence turn of each question found
    assert 0.3 < recall_at_10(half, rows) < 1.0


def test_blob_ids_are_gits():
    assert realtalk.blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


def test_missing_data_is_named_not_guessed(tmp_path):
    with pytest.raises(realtalk.DataMissing, match="REFLECT_REALTALK"):
        realtalk.locate(tmp_path)


def test_the_real_files_when_at_hand():
    try:
        convs = realtalk.load()
    except realtalk.DataMissing:
        pytest.skip("REALTALK is not on this machine (tests/benchmarks/realtalk.py says where it is read from)")
    assert [len(c.turns) for c in convs] == [476, 453, 422, 410, 1548, 1511, 1162, 1044, 1256, 662]
    assert sum(len(c.questions) for c in convs) == 705
    rows = [r for c in convs for r in as_rows(c)]
    turn_ids = {c.id: [t.id for t in c.turns] for c in convs}
    users = [c.id for c in convs for _ in c.questions]
    rng = random.Random(5)
    assert recall_at_10([sorted(r["evidence"]) for r in rows], rows) == 1.0
    assert recall_at_10([rng.sample(turn_ids[u], 10) for u in users], rows) < 0.05
