"""Envelope encryption for crypto-shredding (AES-256-GCM, `cryptography`).

Three levels, so that destroying one key makes exactly what it guarded
unreadable, wherever copies of the ciphertext went (topics, replays, dead
letters, backups):

* master keys (KEKs), held outside Kafka: a key ring file of `id:base64`
  lines, the first the current one. Rotation adds a line on top: new keys
  are wrapped under it, old ones still unwrap under theirs;
* a user key per user, wrapped under a master key (`reflect forget --user`
  destroys it: every key below it is then unreadable too);
* a data key per episode and per belief, wrapped under its user's key (an
  erasure destroys the episode's).

A wrapped key and a sealed text each carry the id of the key that sealed
them, their nonce (96 random bits: a key seals few texts, far below GCM's
limit) and the ciphertext with its tag; the associated data binds the
ciphertext to its key id and its record, so a sealed text copied onto
another record does not open.
"""

from __future__ import annotations

import base64
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12


class SealingError(ValueError):
    """A key ring or a sealed value that cannot be used: named, never guessed around."""


class RingMismatch(SealingError):
    """A key wrapped under a master key this ring lacks: the configuration is
    at fault, not the record (every worker and writer needs the same ring),
    so what waits on it is retried, never dead-lettered."""
    retriable = True


@dataclass(frozen=True)
class Sealed:
    """Ciphertext under key `kid`, as it travels (JSON-safe)."""
    kid: str
    nonce: str  # base64
    data: str  # base64: ciphertext and tag

    def to_dict(self) -> dict[str, str]:
        return {"kid": self.kid, "nonce": self.nonce, "data": self.data}

    @classmethod
    def of(cls, raw: dict) -> "Sealed":
        try:
            return cls(str(raw["kid"]), str(raw["nonce"]), str(raw["data"]))
        except (KeyError, TypeError):
            raise SealingError("a sealed value needs kid, nonce and data") from None


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def seal(key: bytes, kid: str, plaintext: bytes, context: str) -> Sealed:
    """`plaintext` under `key`; `context` (the record it belongs to) must be given again to open it."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    data = AESGCM(key).encrypt(nonce, plaintext, _aad(kid, context))
    return Sealed(kid, _b64(nonce), _b64(data))


def open_sealed(key: bytes, sealed: Sealed, context: str) -> bytes:
    try:
        return AESGCM(key).decrypt(_unb64(sealed.nonce), _unb64(sealed.data), _aad(sealed.kid, context))
    except (InvalidTag, ValueError):
        raise SealingError(f"the value sealed under {sealed.kid} does not open here (another key, another "
                           "record, or altered)") from None


class KeyRing:
    """The master keys: `id:base64` lines (32-byte keys), the first current."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise SealingError("a key ring holds at least one master key")
        for kid, key in keys:
            if len(key) != KEY_BYTES or not kid or ":" in kid:
                raise SealingError(f"master key {kid!r}: an id without ':' and {KEY_BYTES} bytes of key")
        self.keys = dict(keys)
        self.current = keys[0][0]

    @classmethod
    def parse(cls, text: str, where: str = "the key ring") -> "KeyRing":
        keys = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip() and not line.lstrip().startswith("#"):
                kid, sep, raw = line.strip().partition(":")
                try:
                    keys.append((kid, base64.b64decode(raw, validate=True)))
                except ValueError:
                    raise SealingError(f"{where}, line {n}: not id:base64") from None
                if not sep:
                    raise SealingError(f"{where}, line {n}: not id:base64")
        return cls(keys)

    @classmethod
    def load(cls, path: Path, create: bool = False) -> "KeyRing":
        """The ring in `path`; made there with one new key when `create` (the
        embedded default: the file is the master key's only copy, so back it
        up apart from the data it unlocks)."""
        if not path.exists():
            if not create:
                raise SealingError(f"no master key ring at {path} (REFLECT_MASTER_KEYS)")
            path.parent.mkdir(parents=True, exist_ok=True)
            made = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"k-{secrets.token_hex(4)}:{_b64(new_key())}\n")  # an id of its own: a mismatch is named
                out.flush()
                os.fsync(out.fileno())
            try:  # whole, or not at all: two processes that make it at once read the one that won
                os.link(made, path)
            except FileExistsError:
                pass
            finally:
                made.unlink()
        return cls.parse(path.read_text(), str(path))

    def wrap(self, key: bytes, kid: str) -> Sealed:
        """Data or user key `kid`, wrapped under the current master key."""
        return seal(self.keys[self.current], self.current, key, f"key:{kid}")

    def unwrap(self, wrapped: Sealed, kid: str) -> bytes:
        if wrapped.kid not in self.keys:
            raise RingMismatch(f"a key is wrapped under master key {wrapped.kid}, which this ring "
                               f"({', '.join(self.keys)}) lacks: every worker and writer needs the same ring "
                               "(REFLECT_MASTER_KEYS)")
        return open_sealed(self.keys[wrapped.kid], wrapped, f"key:{kid}")


def wrap_under(parent: bytes, parent_kid: str, key: bytes, kid: str) -> Sealed:
    """A data key wrapped under its user's key."""
    return seal(parent, parent_kid, key, f"key:{kid}")


def unwrap_under(parent: bytes, wrapped: Sealed, kid: str) -> bytes:
    return open_sealed(parent, wrapped, f"key:{kid}")


def _aad(kid: str, context: str) -> bytes:
    return f"{kid}\n{context}".encode()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)
