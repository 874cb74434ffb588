"""Worker-to-worker reads: the worker authenticates itself, never the caller.

A read that reaches a worker that does not own the user is forwarded to the
owner (streams/worker/ownership.py, streams/http/routes/common.py `owned`). The caller's
token never leaves the worker it reached: that worker has already authorized
the caller (the guard), and it forwards the read with a short-lived
*assertion* of its own instead — an HS256 JWT signed with the cluster key:

- `user`: the one user the read is about (the route's `user_id`);
- `scope`: the scope the route needs (`read`);
- `aud`: the owner's canonical URL, `iss`: the entry worker's;
- `iat`, `exp` (`TTL` seconds later), `jti` (used once: `Replays`).

The owner admits it (header `X-Reflect-Assertion`, beside
`X-Reflect-Forwarded`) on the per-user read routes only, and only if it
verifies with the cluster key, is addressed to this worker, names the
route's user and a scope covering the route's need and has not expired.
So whoever joins the consumer group and advertises a URL collects
assertions good for one user's reads on itself for 30 s — never a token.

The cluster key is `REFLECT_CLUSTER_SECRET`, else derived (HKDF-SHA256 with
a fixed info string) from `REFLECT_AUTH_SECRET` or `REFLECT_API_TOKEN`: a
different key from any user token's, and an assertion has its own JWT type
and claims, so an assertion is never a valid user token and a user token
never a valid assertion. With only a public key verifying user tokens there
is nothing shared to derive from: forwarded reads then answer 503 naming
`REFLECT_CLUSTER_SECRET`. With no credential configured (auth off) nothing is
asserted and the owner admits the read as any other.

Between workers with `REFLECT_WEB_TLS_CERT_FILE`, a read is forwarded over
TLS only, the owner's certificate verified against `REFLECT_CLUSTER_CA_FILE`
(else the system's CAs): `client_ssl`, `server_ssl`, `plain_problem`.

Everything that decides is a pure function of its arguments (`cluster_keys`,
`mint`, `verify`, `plain_problem`); the TLS contexts read files, once, at start.
"""

from __future__ import annotations

import ssl
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from yarl import URL

HEADER = "X-Reflect-Assertion"
TYPE = "reflect-forwarded-read+jwt"  # the JWT `typ` of an assertion: a user token has none or "JWT"
ALGORITHM = "HS256"
TTL = 30  # seconds an assertion lives: one forwarded read, with its refresh wait, fits well within it
LEEWAY = 5  # seconds of clock skew tolerated between two workers of one group
MAX_TTL = 60  # a longer-lived assertion is refused, whoever signed it
# Fixed, versioned: changing it changes every worker's derived key (a flag day).
INFO = b"reflect/v1 cluster key: assertions of forwarded reads between workers"
NO_KEY = ("forwarded reads are signed with a cluster key, and with only a public key verifying tokens "
          "(REFLECT_AUTH_PUBLIC_KEY_FILE) there is no shared secret to derive one from: set "
          "REFLECT_CLUSTER_SECRET (32 bytes at least, the same on every worker)")


class Refused(Exception):
    """An assertion that does not admit this request (401)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --------------------------------------------------------------- the cluster key

def derived_key(secret: str) -> bytes:
    """A 32-byte key of its own from a user-token secret: HKDF-SHA256 with a
    fixed info string, so neither key signs what the other verifies."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=INFO).derive(secret.encode())


@dataclass(frozen=True)
class ClusterKeys:
    """What a worker signs assertions with and accepts them under."""
    auth_on: bool  # any credential configured: forwarded reads carry an assertion
    signing: bytes | None = None  # None with auth on: `problem` says why
    verifying: tuple[bytes, ...] = ()  # the current key, then one being rotated out
    problem: str | None = None


def cluster_keys(cluster_secret: str | None, auth_secret: str | None, auth_previous_secret: str | None,
                 api_token: str | None, public_key: bool) -> ClusterKeys:
    """The cluster key from the settings that can give one. Derived from the
    auth secret, the one being rotated out still verifies (its derived key),
    so a rolling rotation does not 401 the reads of workers not restarted yet."""
    if not (auth_secret or api_token or public_key):
        return ClusterKeys(auth_on=False)
    if cluster_secret:
        key = str(cluster_secret).encode()
        return ClusterKeys(True, key, (key,))
    source = auth_secret or api_token
    if not source:
        return ClusterKeys(True, problem=NO_KEY)
    previous = (derived_key(str(auth_previous_secret)),) if auth_secret and auth_previous_secret else ()
    key = derived_key(str(source))
    return ClusterKeys(True, key, (key, *previous))


def cluster_keys_of(settings) -> ClusterKeys:
    return cluster_keys(settings.cluster_secret, settings.auth_secret, settings.auth_previous_secret,
                        settings.api_token, bool(settings.auth_public_key_file))


# --------------------------------------------------------------- assertions

def mint(key: bytes, *, user: str, scope: str, audience: str, issuer: str, now: float, ttl: int = TTL,
         jti: str | None = None) -> str:
    """An assertion that `issuer` authorized a caller to `scope` the `user`, for `audience` only."""
    claims = {"user": user, "scope": scope, "aud": audience, "iss": issuer, "iat": int(now),
              "exp": int(now) + ttl, "jti": jti or uuid.uuid4().hex}
    return jwt.encode(claims, key, algorithm=ALGORITHM, headers={"typ": TYPE})


def verify(token: str, keys: tuple[bytes, ...], *, audience: str, issuer: str, user: str, scope: str,
           now: float) -> dict[str, Any]:
    """The claims of an assertion that admits a `scope` read of `user` on the
    worker at `audience`, forwarded by `issuer`; Refused otherwise."""
    try:
        typ = jwt.get_unverified_header(token).get("typ")
    except jwt.PyJWTError:
        raise Refused("the assertion is not a well-formed JWT") from None
    if typ != TYPE:  # a user token (or anything else) is no assertion, whatever its signature
        raise Refused(f"not an assertion of a forwarded read (typ {typ!r})")
    claims = _signed_claims(token, keys, audience, issuer)
    problem = claims_problem(claims, user, scope, now)
    if problem:
        raise Refused(problem)
    return claims


def _signed_claims(token: str, keys: tuple[bytes, ...], audience: str, issuer: str) -> dict[str, Any]:
    """Signature, audience and issuer by PyJWT; the times by `claims_problem`,
    against the `now` it is given."""
    for key in keys:  # the current key, then the previous one (rotation)
        try:
            return jwt.decode(token, key, algorithms=[ALGORITHM], audience=audience, issuer=issuer,
                              options={"require": ["exp", "iat", "aud", "iss", "jti"], "verify_exp": False,
                                       "verify_iat": False, "verify_nbf": False})
        except jwt.InvalidSignatureError:
            continue
        except jwt.InvalidAudienceError:
            raise Refused("the assertion is addressed to another worker") from None
        except jwt.InvalidIssuerError:
            raise Refused("the assertion was not issued by the worker that forwarded the read") from None
        except jwt.PyJWTError as exc:
            raise Refused(f"the assertion is not valid: {exc}") from None
    raise Refused("the assertion's signature does not verify with the cluster key")


def claims_problem(claims: dict[str, Any], user: str, scope: str, now: float) -> str | None:
    """What is wrong with verified claims for this read, or None."""
    exp, iat = claims.get("exp"), claims.get("iat")
    if not isinstance(exp, int) or not isinstance(iat, int):
        return "the assertion's iat and exp must be integers"
    if exp < now - LEEWAY:
        return "the assertion has expired"
    if iat > now + LEEWAY or exp - iat > MAX_TTL:
        return f"the assertion's lifetime must lie within {MAX_TTL} s of now"
    if claims.get("user") != user:
        return "the assertion names another user"
    granted = claims.get("scope")
    if not isinstance(granted, str) or scope not in granted.split():
        return f"the assertion's scope does not include {scope!r}"
    return None


class Replays:
    """The assertions a worker has admitted, until they expire: each admits
    one read (one captured in flight is not replayed). Bounded: past `most`
    live ones the oldest are forgotten."""

    def __init__(self, most: int = 100_000) -> None:
        self.most, self._seen = most, OrderedDict()  # jti → exp, in the order admitted

    def first_use(self, jti: str, exp: int, now: float) -> bool:
        while self._seen and (next(iter(self._seen.values())) < now - LEEWAY or len(self._seen) >= self.most):
            self._seen.popitem(last=False)
        if jti in self._seen:
            return False
        self._seen[jti] = exp
        return True


# --------------------------------------------------------------- TLS between workers

def plain_problem(owner: str, tls: bool) -> str | None:
    """Why a read must not be forwarded to `owner`: this worker uses TLS and
    the owner advertises plain HTTP (never a fall-back to it)."""
    if tls and URL(owner).scheme != "https":
        return (f"the worker that owns this user advertises {owner}, plain HTTP, and this one forwards reads "
                "over TLS only (REFLECT_WEB_TLS_CERT_FILE / REFLECT_CLUSTER_CA_FILE)")
    return None


def server_ssl(settings) -> ssl.SSLContext | None:
    """The HTTP API's TLS (Faust's web_ssl_context), None for plain HTTP;
    ValueError naming the settings when the files do not make one."""
    if not settings.web_tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(settings.web_tls_cert_file, settings.web_tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"invalid settings web_tls_cert_file / web_tls_key_file: {exc}") from None
    return context


def client_ssl(settings) -> ssl.SSLContext:
    """What verifies the owner's certificate on a forwarded read: the cluster's
    CA bundle, else the system's; host names (and IP addresses) checked."""
    try:
        return ssl.create_default_context(cafile=settings.cluster_ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"invalid setting cluster_ca_file: {exc}") from None


def tls_of(settings) -> bool:
    """Whether this worker forwards over TLS only."""
    return bool(settings.web_tls_cert_file or settings.cluster_ca_file)
