"""Event contracts: records round-trip, validate against the schema files (checked
here by an independent validator, jsonschema), and malformed payloads are
rejected with an error that names the field."""

from __future__ import annotations

import json
from dataclasses import fields

import jsonschema
import orjson
import pytest
from hypothesis import given, settings, strategies as st
from referencing import Registry, Resource

import schemas
from schemas import ContractError, decode, from_dict

T = "2026-12-01T09:30:00.123456Z"
EXAMPLES = [
    schemas.EpisodeRecorded(user_id="alice", text="the deploy failed on auth", importance=0.7,
                            source="chat", metadata={"pr": 17, "labels": ["auth"]}),
    schemas.EpisodeRetracted(user_id="alice", episode_id="ep-1", reason="erasure"),
    schemas.ReflectionRequested(user_id="alice", cycle_id="c-1", why="revalidation",
                                reflection_id="r-1", evidence_ids=("ep-1", "ep-2")),
    schemas.ReflectionCreated(user_id="alice", reflection_id="r-1", cycle_id="c-1",
                              text="alice's reverted PRs all touched auth", evidence_ids=("ep-1", "ep-2"),
                              depth=1, importance=0.8, confidence=0.6, reasoner="offline",
                              prompt_version="insights-v1", question="what breaks?", support=2),
    schemas.ReflectionReinforced(user_id="alice", reflection_id="r-1", cycle_id="c-2",
                                 evidence_ids=("ep-1", "ep-2", "ep-3"), added_evidence_ids=("ep-3",),
                                 confidence=0.7, similarity=0.93, support=3),
    schemas.ReflectionInvalidated(user_id="alice", reflection_id="r-2", cause="ep-1",
                                  path=("ep-1", "r-1", "r-2"), status="invalid", invalid_at=T, expired_at=T),
    schemas.ReflectionCycleCompleted(user_id="alice", cycle_id="c-1", why="threshold",
                                     questions=("q1", "q2", "q3"), kept=2, dropped=1, duration_ms=12.5,
                                     outcome="ok", reasoner="offline",
                                     usage={"calls": 4, "input_tokens": 0, "output_tokens": 0}),
    schemas.ChallengeRequested(user_id="alice", cycle_id="alice:challenge:1", reflection_id="r-1",
                               challenger_ids=("ep-7", "ep-8"), similarity=0.71, sequence=4),
    schemas.ReflectionChallenged(user_id="alice", cycle_id="alice:challenge:1", reflection_id="r-1",
                                 challenger_ids=("ep-7", "ep-8"), outcome="ok", reasoner="offline",
                                 usage={"calls": 0, "input_tokens": 0, "output_tokens": 0}, duration_ms=1.5,
                                 verdict="contradicted", cited_ids=("ep-7", "ep-8"), successor_id="r-9",
                                 status="superseded", heuristic=True, reason="1: contradicted"),
    schemas.ReflectionStaled(user_id="alice", reflection_id="r-1", stale=True, supported_at=T, horizon_days=30.0,
                             cause="ep-9"),
    schemas.InvalidationRequested(user_id="alice", episode_id="ep-3", reason="incorrect", retraction_id="ev-12",
                                  sequence=5, position=311),
    schemas.GateRequested(user_id="alice", episodes=({"id": "ep-8", "occurred_at": T, "position": 312},),
                          recent=({"id": "ep-7", "occurred_at": T, "kind": "episode"},), sequence=6, position=312),
    schemas.ErasureCompleted(user_id="alice", erasure_id="ev-12", episode_id="ep-3", episodes=("ep-3",),
                             beliefs=("r-1", "r-2")),
    schemas.UserForgotten(user_id="alice", sequence=7, position=313),
]


def schema_validator(kind: str) -> jsonschema.Draft202012Validator:
    docs = [json.loads(schemas.schema_text(n)) for n in ("envelope", *schemas.EVENT_TYPES)]
    registry = Registry().with_resources((d["$id"], Resource.from_contents(d)) for d in docs)
    doc = next(d for d in docs if d["$id"].endswith(":" + kind))
    return jsonschema.Draft202012Validator(doc, registry=registry)


def test_every_event_type_has_a_record_a_schema_file_and_an_example():
    assert sorted(schemas.RECORDS) == sorted(schemas.EVENT_TYPES) == sorted(e.TYPE for e in EXAMPLES)
    for kind in schemas.EVENT_TYPES:
        jsonschema.Draft202012Validator.check_schema(json.loads(schemas.schema_text(kind)))


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.TYPE)
def test_record_round_trips_and_validates_against_its_schema_file(event):
    raw = event.encode()
    assert decode(raw) == event
    data = orjson.loads(raw)
    schema_validator(event.TYPE).validate(data)
    assert data["type"] == event.TYPE and data["schema_version"] == 1
    required = json.loads(schemas.schema_text("envelope"))["required"]
    assert all(k in data for k in required)


@pytest.mark.parametrize("event", [e for e in EXAMPLES if "support" in e.to_dict()], ids=lambda e: e.TYPE)
def test_support_is_optional_and_counts_at_least_the_citation_floor(event):
    before = {k: v for k, v in event.to_dict().items() if k != "support"}  # written before support existed
    assert from_dict(before).support is None
    for bad in (1, 2.5, "3", -4):
        with pytest.raises(ContractError) as err:
            from_dict({**event.to_dict(), "support": bad})
        assert err.value.field == "support"


def test_unknown_optional_fields_are_tolerated_for_forward_compatibility():
    data = {**EXAMPLES[0].to_dict(), "added_in_a_later_minor": True}
    assert from_dict(data) == EXAMPLES[0]


# ------------------------------------------------------------------ malformed payloads

def valid_episode() -> dict:
    return schemas.EpisodeRecorded(user_id="u", episode_id="e", text="some text", importance=0.5).to_dict()


REQUIRED = ["event_id", "type", "schema_version", "user_id", "occurred_at", "recorded_at",
            "episode_id", "text", "importance"]
WRONG_TYPES = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(),
                        st.lists(st.integers(), max_size=2),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@given(st.sampled_from(REQUIRED))
def test_missing_field_is_named(name):
    data = valid_episode()
    del data[name]
    with pytest.raises(ContractError) as err:
        from_dict(data)
    assert err.value.field == name


@given(st.sampled_from(["event_id", "user_id", "occurred_at", "episode_id", "text", "importance",
                        "source", "metadata"]), WRONG_TYPES)
def test_wrong_type_is_named(name, value):
    expected_ok = {"importance": (int, float), "metadata": (dict,)}.get(name, (str,))
    if isinstance(value, expected_ok) and not isinstance(value, bool):
        return  # not a wrong type for this field
    data = {**valid_episode(), name: value}
    with pytest.raises(ContractError) as err:
        from_dict(data)
    assert err.value.field == name


@given(st.one_of(st.floats(max_value=-1e-9, allow_nan=False), st.floats(min_value=1.000001, allow_nan=False),
                 st.just(float("nan"))))
def test_importance_outside_unit_interval_is_named(value):
    with pytest.raises(ContractError) as err:
        from_dict({**valid_episode(), "importance": value})
    assert err.value.field == "importance"


@given(st.integers(min_value=16001, max_value=40000))
def test_oversized_text_is_named(size):
    with pytest.raises(ContractError) as err:
        from_dict({**valid_episode(), "text": "x" * size})
    assert err.value.field == "text"


@settings(max_examples=60)
@given(st.sampled_from(["text", "user_id", "episode_id", "source"]),
       st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b)))
def test_non_utf8_bytes_on_the_wire_are_named(name, junk):
    data = {**valid_episode(), "source": "chat", name: "MARK"}
    raw = orjson.dumps(data).replace(b'"MARK"', b'"' + junk.replace(b'"', b"").replace(b"\\", b"") + b'"')
    if _is_utf8(raw):
        return
    with pytest.raises(ContractError) as err:
        decode(raw)
    assert err.value.field in (name, schemas.PAYLOAD)
    if b"\\" not in junk and b'"' not in junk and not any(b < 0x20 for b in junk):
        assert err.value.field == name


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_anything_but_a_contract_error(raw):
    try:
        event = decode(raw)
    except ContractError as err:
        assert err.field
    else:
        assert isinstance(event, schemas.Event)


def test_future_schema_version_and_unknown_type_are_named():
    for patch, name in (({"schema_version": 2}, "schema_version"), ({"type": "EpisodeEdited"}, "type")):
        with pytest.raises(ContractError) as err:
            from_dict({**valid_episode(), **patch})
        assert err.value.field == name


def test_bad_timestamp_and_nested_bad_text_are_named():
    with pytest.raises(ContractError) as err:
        from_dict({**valid_episode(), "occurred_at": "2026-02-30T00:00:00Z"})
    assert err.value.field == "occurred_at"
    with pytest.raises(ContractError) as err:
        from_dict({**valid_episode(), "metadata": {"note": ["ok", "bad \udcff"]}})
    assert err.value.field == "metadata.note[1]"


def test_publish_side_rejects_before_sending():
    with pytest.raises(ContractError) as err:
        schemas.EpisodeRecorded(user_id="", text="t", importance=0.5).encode()
    assert err.value.field == "user_id"
    with pytest.raises(ContractError) as err:
        schemas.ReflectionCreated(user_id="u", reflection_id="r", cycle_id="c", text="t", evidence_ids=("only-one",),
                                  depth=1, importance=0.5, confidence=0.5, reasoner="x",
                                  prompt_version="v").encode()
    assert err.value.field == "evidence_ids"


def test_records_and_schema_files_list_the_same_fields():
    for kind, cls in schemas.RECORDS.items():
        doc = json.loads(schemas.schema_text(kind))
        envelope = json.loads(schemas.schema_text("envelope"))
        in_schema = set(doc["properties"]) | set(envelope["properties"])
        in_record = {f.name for f in fields(cls)} | {"type"}
        assert in_schema == in_record, kind
