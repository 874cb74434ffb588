"""Who may call which route for which user: signed per-user tokens.

A credential is either the shared `REFLECT_API_TOKEN` (an admin credential for
every user, as before) or a JWT verified with PyJWT: HS256 with
`REFLECT_AUTH_SECRET`, or RS256/ES256 with the PEM public key in
`REFLECT_AUTH_PUBLIC_KEY_FILE`; a second ("previous") secret or key is accepted
at the same time, so keys rotate without a flag day. Its claims:

- `users`: user ids, or prefix patterns that end at a delimiter (`acme:*`
  covers `acme:1`, never `acme2`; `*` alone: every user);
- `scope`: space-separated `read`, `write`, `admin` (none implies another);
- `exp`: required; an expired token is refused like a forged one (401), and
  so is one that lives longer than `REFLECT_AUTH_MAX_TTL`;
- `aud`, `iss`: checked when `REFLECT_AUTH_AUDIENCE`, `REFLECT_AUTH_ISSUER`
  are set;
- `jti`: the id a token is revoked by (streams/worker/revocations.py).

Everything that decides is a pure function over plain data (`credential_of`,
`need_of`, `refusal`); the guard middleware (streams/http/routes/common.py) is the
only I/O. An algorithm is chosen by the key, never by the token: an HS256
token is checked only against secrets and an RS256/ES256 token only against
public keys of that type, so a public key can never be used as an HMAC secret.
"""

from __future__ import annotations

import hmac
import ipaddress
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

from processors.tenants import DELIMITERS

SCOPES = ("read", "write", "admin")
LEEWAY = 30  # seconds of clock skew tolerated on exp/nbf/iat between the minting host and a worker
OPEN = frozenset({"/healthz", "/livez"})  # probes carry no credentials and learn only readiness
USER_ROUTES = "/v1/users/{user_id}"


class AuthError(Exception):
    """A refused request: 401 (no valid credential) or 403 (valid, not granted)."""

    def __init__(self, status: int, message: str, field: str | None = None, scope: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.scope = status, message, field, scope


@dataclass(frozen=True)
class Grant:
    """What a verified credential allows: these users, these scopes."""
    users: tuple[str, ...]
    scopes: frozenset[str]
    subject: str = ""

    def covers(self, user_id: str) -> bool:
        return any(user_id.startswith(p[:-1]) if p.endswith("*") else user_id == p for p in self.users)


SHARED = Grant(("*",), frozenset(SCOPES), "shared REFLECT_API_TOKEN")


@dataclass(frozen=True)
class Key:
    """One verification key and the one algorithm it accepts."""
    algorithm: str  # HS256, RS256 or ES256
    material: Any  # the secret (bytes) or a cryptography public key


class Revocations:
    """Token ids revoked before their expiry, each kept until then: what the
    revocations topic holds, as this worker has read it."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def add(self, jti: str, expires: float, now: float) -> None:
        self._until = {j: e for j, e in self._until.items() if e + LEEWAY > now}  # expired tokens fail anyway
        if expires + LEEWAY > now:
            self._until[jti] = max(expires, self._until.get(jti, expires))

    def __contains__(self, jti: object) -> bool:
        return jti in self._until

    def __len__(self) -> int:
        return len(self._until)


@dataclass(frozen=True)
class Keys:
    """Every credential a worker accepts, and the rules a token must meet;
    no credential means auth is off."""
    shared_token: str | None = None
    signing: tuple[Key, ...] = ()
    audience: str | None = None
    issuer: str | None = None
    max_ttl: int = 0  # seconds; 0: no limit
    revoked: Revocations = field(default_factory=Revocations)

    @property
    def configured(self) -> bool:
        return bool(self.shared_token or self.signing)


@dataclass(frozen=True)
class Need:
    """What a route asks of the caller: a scope, and the user it touches (if any).
    scope None: any valid credential (a route that does not exist answers 404
    only to a caller who could have called something)."""
    scope: str | None
    per_user: bool = False  # the route's {user_id} must be one the credential grants


# --------------------------------------------------------------- keys from settings

def algorithm_of(public_key) -> str:
    """RS256 for RSA keys, ES256 for EC keys on P-256; anything else is refused
    at start-up rather than accepting tokens nobody can verify."""
    if isinstance(public_key, rsa.RSAPublicKey):
        return "RS256"
    if isinstance(public_key, ec.EllipticCurvePublicKey) and public_key.curve.name == "secp256r1":
        return "ES256"
    raise ValueError("expected an RSA or an EC P-256 public key (PEM)")


def public_key_from(path: str):
    try:
        return load_pem_public_key(Path(path).read_bytes())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a PEM public key: {exc}") from None


def keys_of(settings) -> Keys:
    """The worker's keys from its settings (files read once, at start)."""
    signing = [Key("HS256", str(s).encode()) for s in (settings.auth_secret, settings.auth_previous_secret) if s]
    for path in (settings.auth_public_key_file, settings.auth_previous_public_key_file):
        if path:
            public = public_key_from(path)
            signing.append(Key(algorithm_of(public), public))
    return Keys(str(settings.api_token) if settings.api_token else None, tuple(signing), settings.auth_audience,
                settings.auth_issuer, settings.auth_max_ttl)


# --------------------------------------------------------------- credentials

def bearer_of(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer …` header (the scheme is
    case-insensitive, RFC 7235), else None."""
    scheme, _, given = (header or "").strip().partition(" ")
    return given.strip() or None if scheme.lower() == "bearer" else None


def grant_of(claims: Mapping[str, Any]) -> Grant:
    """The grant a token's verified claims carry; 401 if they are not well formed
    (a token that grants nothing clearly is refused, not read generously)."""
    users, scope = claims.get("users"), claims.get("scope")
    if not isinstance(users, list) or not users or not all(valid_pattern(u) for u in users):
        raise AuthError(401, "the token's `users` claim must be a non-empty list of user ids or prefix* patterns")
    open_ended = next((u for u in users if not delimited(u)), None)
    if open_ended is not None:
        raise AuthError(401, f"the token's pattern {open_ended[:64]!r} has no delimiter before its `*`: "
                             f"{UNDELIMITED}")
    words = scope.split() if isinstance(scope, str) else None
    if not words or not set(words) <= set(SCOPES):
        raise AuthError(401, f"the token's `scope` claim must be space-separated words of {', '.join(SCOPES)}")
    return Grant(tuple(users), frozenset(words), str(claims.get("sub", "")))


def valid_pattern(pattern: Any) -> bool:
    """A user id, or a prefix followed by one `*` at the end."""
    return isinstance(pattern, str) and 0 < len(pattern) <= 256 and "*" not in pattern[:-1]


UNDELIMITED = (f"a prefix must end at one of {' '.join(DELIMITERS)} (`acme:*` covers `acme:1`; `acme*` would "
               "also cover `acme2`)")


def delimited(pattern: str) -> bool:
    """A user id, `*` alone, or a prefix that ends at a delimiter before its `*`."""
    return not pattern.endswith("*") or pattern == "*" or pattern[-2:-1] in DELIMITERS


def credential_of(header: str | None, keys: Keys) -> Grant:
    """The grant of the request's bearer credential; AuthError(401) if there is
    none, or it is expired, badly signed or malformed."""
    token = bearer_of(header)
    if token is None:
        raise AuthError(401, "a bearer token is required (Authorization: Bearer <token>)")
    # Constant time: the answer's timing tells nothing about how much of a guess was right.
    if keys.shared_token and hmac.compare_digest(token.encode(), keys.shared_token.encode()):
        return SHARED
    try:
        algorithm = jwt.get_unverified_header(token).get("alg")
    except jwt.PyJWTError:
        raise AuthError(401, "the token is neither the shared token nor a well-formed JWT") from None
    candidates = [k for k in keys.signing if k.algorithm == algorithm]
    if not candidates:
        raise AuthError(401, f"tokens signed with {algorithm!r} are not accepted here")
    expired = False
    for key in candidates:  # the current key, then the previous one (rotation)
        try:
            claims = jwt.decode(token, key.material, algorithms=[key.algorithm], leeway=LEEWAY,
                                audience=keys.audience, issuer=keys.issuer, options=_required(keys))
        except jwt.ExpiredSignatureError:
            expired = True  # signed by this key but too old: no other key makes it valid
            break
        except jwt.InvalidSignatureError:
            continue
        except jwt.PyJWTError as exc:
            raise AuthError(401, f"the token is not valid: {exc}") from None
        problem = lifetime_problem(claims, keys.max_ttl, time.time()) or revoked_problem(claims, keys.revoked)
        if problem:
            raise AuthError(401, problem)
        return grant_of(claims)
    raise AuthError(401, "the token has expired" if expired else "the token's signature does not verify")


def _required(keys: Keys) -> dict[str, Any]:
    """PyJWT's options: `exp` always; `aud` and `iss` when the worker names them."""
    required = ["exp", *(["aud"] if keys.audience else []), *(["iss"] if keys.issuer else [])]
    return {"require": required, "verify_aud": keys.audience is not None}


def lifetime_problem(claims: Mapping[str, Any], max_ttl: int, now: float) -> str | None:
    """Why a token lives too long: from `iat` (or now, without one) to `exp`."""
    start = claims.get("iat") if isinstance(claims.get("iat"), (int, float)) else now
    if max_ttl and claims["exp"] - start > max_ttl + LEEWAY:
        return (f"the token lives {int(claims['exp'] - start)} s, longer than this worker accepts "
                f"({max_ttl} s, REFLECT_AUTH_MAX_TTL)")
    return None


def revoked_problem(claims: Mapping[str, Any], revoked: Revocations) -> str | None:
    jti = claims.get("jti")
    return "the token has been revoked" if isinstance(jti, str) and jti in revoked else None


# --------------------------------------------------------------- routes

def need_of(method: str, route: str | None) -> Need | None:
    """What a route (its template, e.g. /v1/users/{user_id}/beliefs) asks for;
    None for the open probes. A user's routes: reading needs `read`, anything
    else `write`, for that user. Everything else — /v1/admin/*, /v1/reasoner,
    /metrics (it names topics and partitions), Faust's own pages (table
    contents by key) — needs `admin`. Unknown paths: any valid credential."""
    if route in OPEN:
        return None
    if route is None:
        return Need(None)
    if route == USER_ROUTES or route.startswith(USER_ROUTES + "/"):
        return Need("read" if method in ("GET", "HEAD") else "write", per_user=True)
    return Need("admin")


def refusal(grant: Grant, need: Need, user_id: str | None) -> AuthError | None:
    """Why this grant may not do what the route needs (403), or None."""
    if need.scope is not None and need.scope not in grant.scopes:
        return AuthError(403, f"this token's scope ({' '.join(sorted(grant.scopes))}) does not include "
                              f"{need.scope!r}", scope=need.scope)
    if need.per_user and (user_id is None or not grant.covers(user_id)):
        return AuthError(403, "this token does not grant access to this user", "user_id", need.scope)
    return None


def sees_details(header: str | None, keys: Keys) -> bool:
    """Whether an open probe may say more than its status (stage errors,
    partitions): to an admin credential, or to anyone when auth is off."""
    if not keys.configured:
        return True
    try:
        return "admin" in credential_of(header, keys).scopes
    except AuthError:
        return False


# --------------------------------------------------------------- minting

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds_of(ttl: str) -> int:
    """'90s', '15m', '1h', '30d' or plain seconds."""
    raw = ttl.strip().lower()
    unit = DURATION_UNITS.get(raw[-1:]) if raw[-1:].isalpha() else 1
    number = raw[:-1] if raw[-1:].isalpha() else raw
    if unit is None or not number.isdigit() or int(number) < 1:
        raise ValueError(f"expected a duration such as 90s, 15m, 1h or 30d, got {ttl!r}")
    return int(number) * unit


def claims_for(users: Iterable[str], scope: str, ttl_seconds: int, now: float, subject: str = "",
               max_ttl: int = 0, audience: str | None = None, issuer: str | None = None) -> dict[str, Any]:
    """The claims of a new token, with a `jti` to revoke it by; ValueError
    naming what is wrong (a token the workers would refuse is never minted)."""
    users = [u.strip() for u in users if u.strip()]
    if not users or not all(valid_pattern(u) for u in users):
        raise ValueError("--users: user ids or prefix* patterns, comma-separated")
    open_ended = next((u for u in users if not delimited(u)), None)
    if open_ended is not None:
        raise ValueError(f"--users: {open_ended!r}: {UNDELIMITED}")
    words = scope.split()
    if not words or not set(words) <= set(SCOPES):
        raise ValueError(f"--scope: space-separated words of {', '.join(SCOPES)}")
    if max_ttl and ttl_seconds > max_ttl:
        raise ValueError(f"--ttl: {ttl_seconds} s is longer than the workers accept ({max_ttl} s, "
                         "REFLECT_AUTH_MAX_TTL)")
    claims = {"users": users, "scope": " ".join(dict.fromkeys(words)), "iat": int(now),
              "exp": int(now) + ttl_seconds, "jti": uuid.uuid4().hex}
    named = {"sub": subject, "aud": audience, "iss": issuer}
    return {**claims, **{k: v for k, v in named.items() if v}}


def mint(claims: Mapping[str, Any], secret: str | None = None, private_key_pem: bytes | None = None) -> str:
    """A signed token: RS256/ES256 with a PEM private key, else HS256 with the secret."""
    if private_key_pem is not None:
        private = load_pem_private_key(private_key_pem, password=None)
        return jwt.encode(dict(claims), private, algorithm=algorithm_of(private.public_key()))
    if not secret:
        raise ValueError("no signing key: set REFLECT_AUTH_SECRET or pass --private-key")
    return jwt.encode(dict(claims), str(secret), algorithm="HS256")


def revocation_of(token_or_jti: str, expires_at: str | None = None) -> dict[str, Any]:
    """The body of `POST /v1/admin/revocations`: a token gives its own jti and
    exp (read, not verified: revoking a forged token is harmless)."""
    if token_or_jti.count(".") != 2:
        return {"jti": token_or_jti, **({"expires_at": expires_at} if expires_at else {})}
    try:
        claims = jwt.decode(token_or_jti, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise ValueError(f"not a JWT: {exc}") from None
    if not isinstance(claims.get("jti"), str):
        raise ValueError("this token has no jti claim: it cannot be revoked alone (rotate its signing key)")
    exp = claims.get("exp")
    if expires_at is None and isinstance(exp, (int, float)):
        expires_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp))
    return {"jti": claims["jti"], **({"expires_at": expires_at} if expires_at else {})}


# --------------------------------------------------------------- fail closed

def loopback(host: str) -> bool:
    """Whether a bind address is reachable only from this machine."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name may resolve to anything: treat it as exposed


def exposure_problem(settings) -> str | None:
    """Why this worker must not start: its API listens beyond loopback with no
    credential configured, so anyone who reaches the port reads every user."""
    configured = settings.api_token or settings.auth_secret or settings.auth_public_key_file
    if loopback(settings.web_host) or configured or settings.insecure_no_auth:
        return None
    return (f"refusing to start: the HTTP API would listen on {settings.web_host} (REFLECT_WEB_HOST / "
            "--web-host) with no authentication. Set REFLECT_AUTH_SECRET (--auth-secret) or "
            "REFLECT_AUTH_PUBLIC_KEY_FILE (--auth-public-key-file) for per-user tokens, or REFLECT_API_TOKEN "
            "(--api-token) for one admin token; or bind 127.0.0.1; or, knowingly, REFLECT_INSECURE_NO_AUTH=true "
            "(--insecure-no-auth)")
