"""The key store of crypto-shredding (streams/keys.py) on the test broker:
a key made by one store opens in another, a destroyed one (or its user's)
opens nowhere once the topic is read again, and other users' keys are
untouched."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import uuid
from dataclasses import replace

import pytest

from streams.adapters.sealing import KeyRing, SealingError, new_key, open_sealed, seal
from streams.broker import free_port
from streams.keys import FRESH, KeyStore, KeyUnknown, scope_of
from streams.topics import ensure_key_topic
from support.runs import make_settings

pytestmark = [pytest.mark.integration, pytest.mark.broker]


def test_keys_open_across_stores_until_destroyed_and_forget_takes_a_users_keys(broker, tmp_path):
    settings = make_settings(broker.url, tmp_path)
    topic = f"keys-{uuid.uuid4().hex[:8]}"
    ring = KeyRing.load(tmp_path / "master.keys", create=True)

    async def scenario() -> None:
        assert await ensure_key_topic(settings, topic) == "created"
        assert await ensure_key_topic(settings, topic) == "exists"
        async with KeyStore(settings, ring, topic) as one:
            made = {(u, e): await one.new("episode", u, e) for u in ("ana", "ben") for e in ("e1", "e2")}
            again, _ = await one.new("episode", "ana", "e1")  # a retried seal: a second version, not a rewrite
            sealed = {k: seal(key, kid, f"{k} says SECRET".encode(), "/".join(k)) for k, (kid, key) in made.items()}
        assert len({scope_of(kid)[:2] for kid, _ in made.values()}) == 2 and again != made["ana", "e1"][0]

        async with KeyStore(settings, ring, topic) as other:  # a fresh store reads them off the topic
            for k, (kid, _) in made.items():
                assert open_sealed(await other.key(kid), sealed[k], "/".join(k)) == f"{k} says SECRET".encode()
            assert sorted(scope_of(kid)[2] for kid in await other.destroy("episode", "ana", "e1")) == ["e1", "e1"]
            assert await other.key(made["ana", "e1"][0]) is None and await other.key(again) is None
            assert await other.key(made["ana", "e2"][0]) is not None

        rotated = KeyRing.parse(f"k2:{base64.b64encode(new_key()).decode()}\n" + (tmp_path / "master.keys").read_text())
        async with KeyStore(settings, rotated, topic) as later:  # rotated: the old user keys still unwrap
            assert await later.key(made["ana", "e1"][0]) is None  # destroyed on the log, not in a cache
            assert await later.key(made["ben", "e1"][0]) is not None
            await later.destroy("user", "ana")
            assert await later.key(made["ana", "e2"][0]) is None
            carl, _ = await later.new("episode", "carl", "e1")
            assert later.wrapped[later.wrapped[carl].kid].kid == "k2"  # carl's user key: under the new master
        async with KeyStore(settings, ring, topic) as fresh:
            assert await fresh.key(made["ana", "e2"][0]) is None  # forgotten: every key of the user
            assert await fresh.key(made["ben", "e2"][0]) is not None  # another user: untouched
            with pytest.raises(SealingError, match="k2"):  # a ring without the key carl's was wrapped under
                await fresh.key(carl)

    asyncio.run(scenario())


def test_a_worker_whose_ring_cannot_open_the_key_topic_refuses_to_start_naming_the_setting(settings, worker, tmp_path):
    """Two workers on data dirs of their own, each with the default ring it
    made there: the second would dead-letter or stall on every sealed record
    the first wrote; it stops at start instead, and says what to set."""
    first = replace(settings, master_keys=None, data_dir=str(tmp_path / "a"))
    w = worker(first)
    w.client.record("ann", "an episode sealed under ann's key", 0.5)  # ann's user key, under the first ring
    second = replace(first, data_dir=str(tmp_path / "b"), web_port=free_port())
    done = subprocess.run([sys.executable, "-m", "streams.cli", "worker"], env=second.child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "master_keys" in done.stderr and "REFLECT_MASTER_KEYS" in done.stderr
    assert w.alive()


def test_a_key_the_topic_never_held_is_unknown_not_destroyed(broker, tmp_path):
    """Read on another key topic (or a lost one), a sealed record must stop its
    reader, never read as erased; a destroyed key stays destroyed for a
    reader that comes after the topic's compaction (its marker is its last record)."""
    settings = make_settings(broker.url, tmp_path)
    topic, other = f"keys-{uuid.uuid4().hex[:8]}", f"keys-{uuid.uuid4().hex[:8]}"
    ring = KeyRing.load(tmp_path / "master.keys", create=True)

    async def scenario() -> None:
        for name in (topic, other):
            await ensure_key_topic(settings, name)
        async with KeyStore(settings, ring, topic) as one:
            kid, _ = await one.new("episode", "ann", "e1")
            gone, _ = await one.new("episode", "ann", "e2")
            await one.destroy("episode", "ann", "e2")
        async with KeyStore(settings, ring, topic) as later:
            assert await later.key(gone) is None and await later.key(kid) is not None
        async with KeyStore(settings, ring, other) as elsewhere:
            with pytest.raises(KeyUnknown, match=other):
                await elsewhere.key(kid)
    asyncio.run(scenario())


def test_a_writer_stops_sealing_under_a_user_key_another_store_destroyed(broker, tmp_path):
    """A forget in the worker; an API elsewhere that still holds the user's
    key: within FRESH seconds it seals under a new version of it, whose
    keys open, instead of one that reads as erased."""
    settings = make_settings(broker.url, tmp_path)
    topic = f"keys-{uuid.uuid4().hex[:8]}"
    ring = KeyRing.load(tmp_path / "master.keys", create=True)

    async def scenario() -> None:
        await ensure_key_topic(settings, topic)
        async with KeyStore(settings, ring, topic) as api, KeyStore(settings, ring, topic) as worker:
            before, _ = await api.new("episode", "ana", "e1")
            old_user_key = api.wrapped[before].kid
            await worker.fetch([before])
            await worker.destroy("user", "ana")
            deadline = asyncio.get_running_loop().time() + 5 + 2 * FRESH
            while True:  # sealing on as an API would: each key under the user key it holds
                kid, _ = await api.new("episode", "ana", "e2")
                await worker.fetch([kid])
                if await worker.key(kid) is not None:
                    break
                assert asyncio.get_running_loop().time() < deadline, "still sealing under the destroyed user key"
            assert api.wrapped[kid].kid != old_user_key and await worker.key(before) is None

    asyncio.run(scenario())
