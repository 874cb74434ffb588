"""The key store of crypto-shredding (streams/keys.py) on the test broker:
a key made by one store opens in another, a destroyed one (or its user's)
opens nowhere once the topic is read again, and other users' keys are
untouched."""

from __future__ import annotations

import asyncio
import base64
import uuid

import pytest

from streams.adapters.sealing import KeyRing, SealingError, new_key, open_sealed, seal
from streams.keys import KeyStore, scope_of
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
