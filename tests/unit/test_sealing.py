"""Envelope encryption (streams/adapters/sealing.py): what a key seals opens
only under that key and for that record, and a master key ring rotates."""

from __future__ import annotations

import base64
import dataclasses
import os

import pytest

from streams.adapters.sealing import (KeyRing, SealingError, new_key, open_sealed, seal, unwrap_under,
                                      wrap_under)


def test_a_sealed_text_opens_under_its_key_and_record_only():
    key = new_key()
    sealed = seal(key, "k", "SECRET-4242 sits in the payroll export".encode(), "ana/ep-1")
    assert b"SECRET" not in base64.b64decode(sealed.data)
    assert open_sealed(key, sealed, "ana/ep-1") == b"SECRET-4242 sits in the payroll export"
    for wrong in ((new_key(), sealed, "ana/ep-1"), (key, sealed, "ben/ep-1"),  # another key; another record
                  (key, dataclasses.replace(sealed, kid="other"), "ana/ep-1")):
        with pytest.raises(SealingError):
            open_sealed(*wrong)
    tampered = bytearray(base64.b64decode(sealed.data))
    tampered[0] ^= 1
    with pytest.raises(SealingError):
        open_sealed(key, dataclasses.replace(sealed, data=base64.b64encode(bytes(tampered)).decode()), "ana/ep-1")


def test_a_ring_made_once_is_private_and_a_rotated_one_still_unwraps_the_old_keys(tmp_path):
    path = tmp_path / "master.keys"
    ring = KeyRing.load(path, create=True)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600" and KeyRing.load(path).keys == ring.keys
    user_key = new_key()
    wrapped = ring.wrap(user_key, "user:ana")
    rotated = KeyRing.parse(f"k2:{base64.b64encode(new_key()).decode()}\n" + path.read_text())
    assert rotated.current == "k2" and rotated.unwrap(wrapped, "user:ana") == user_key
    assert rotated.wrap(user_key, "user:ben").kid == "k2"
    with pytest.raises(SealingError, match="lacks"):
        KeyRing.parse(f"k9:{base64.b64encode(new_key()).decode()}").unwrap(wrapped, "user:ana")
    data_key = new_key()
    assert unwrap_under(user_key, wrap_under(user_key, "user:ana", data_key, "episode:ep-1"), "episode:ep-1") == \
        data_key


@pytest.mark.parametrize("text", ["", "k1", "k1:not base64!", f"k1:{base64.b64encode(b'short').decode()}"])
def test_a_ring_that_cannot_be_used_is_refused_by_name(text):
    with pytest.raises(SealingError):
        KeyRing.parse(text)


def test_no_ring_where_one_is_required_is_an_error(tmp_path):
    with pytest.raises(SealingError, match="no master key ring"):
        KeyRing.load(tmp_path / "missing")
