"""No caller borrows another's credential (issue 33, part 3): a read that
reaches a worker that does not own the user is forwarded to the owner with
the entry worker's short-lived assertion (streams/http/forwarding.py), never the
caller's token, and over TLS between workers when it is configured.

First the pure rules (mint, verify, the cluster key), then real workers of
one consumer group on the test broker: a recording reverse proxy stands
between the entry worker and the owner (the owner advertises the proxy's URL)
and shows what the owner is sent; then workers serving TLS with a
certificate made here.

    python -m pytest tests/integration/test_forwarding.py -s
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import http.server
import ipaddress
import json
import ssl
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from streams import auth
from streams.broker import free_port
from streams.http import forwarding
from streams.topics import ensure_topics
from streams.worker.ownership import partition_of
from support.api import call, pem_pair
from support.harness import Worker, wait_for
from support.runs import SHORT_GROUP_TIMEOUTS, Workers, assigned_partitions, episode_stream, make_settings, publish

SECRET = "s" * 40
TOKEN = "shared-token-" + "0123456789abcdef" * 2
ENTRY, OWNER = "http://10.0.0.1:6066", "http://10.0.0.2:6066"
NOW = 1_800_000_000.0
FORWARDED = "X-Reflect-Forwarded"
STATS = "/v1/users/{}/stats"


# --- pure rules ---------------------------------------------------------------

def cluster(secret: str = SECRET) -> forwarding.ClusterKeys:
    return forwarding.cluster_keys(None, secret, None, None, False)


def assertion(key: bytes | None = None, **claims) -> str:
    given = {"user": "ann", "scope": "read", "audience": OWNER, "issuer": ENTRY, "now": NOW, **claims}
    return forwarding.mint(key or cluster().signing, **given)


def verified(token: str, keys: tuple[bytes, ...] | None = None, **expected) -> dict:
    given = {"audience": OWNER, "issuer": ENTRY, "user": "ann", "scope": "read", "now": NOW + 1, **expected}
    return forwarding.verify(token, keys or cluster().verifying, **given)


def test_a_valid_assertion_verifies():
    claims = verified(assertion())
    assert (claims["user"], claims["scope"], claims["aud"], claims["iss"]) == ("ann", "read", OWNER, ENTRY)
    assert claims["exp"] - claims["iat"] == forwarding.TTL and claims["jti"]
    assert jwt.get_unverified_header(assertion())["typ"] == forwarding.TYPE
    assert verified(assertion(scope="read write"))  # a scope that covers the need


def user_token() -> str:
    return auth.mint(auth.claims_for(["ann"], "read", 3600, NOW), SECRET)


def user_claims_signed_as_an_assertion() -> str:
    """A user token's claims with an assertion's type, signed with the cluster key."""
    claims = auth.claims_for(["ann"], "read", 30, NOW)
    return jwt.encode(claims, cluster().signing, algorithm="HS256", headers={"typ": forwarding.TYPE})


@pytest.mark.parametrize("token, expected, says", [
    (lambda: assertion(), {"audience": ENTRY}, "another worker"),
    (lambda: assertion(), {"issuer": OWNER}, "not issued by"),
    (lambda: assertion(), {"user": "bob"}, "another user"),
    (lambda: assertion(scope="write"), {}, "does not include 'read'"),
    (lambda: assertion(), {"now": NOW + forwarding.TTL + forwarding.LEEWAY + 1}, "expired"),
    (lambda: assertion(ttl=3600), {}, "lifetime"),
    (lambda: assertion(key=cluster("o" * 40).signing), {}, "does not verify"),
    # Signed with the auth secret itself (what a user token is signed with), not the derived key.
    (lambda: assertion(key=SECRET.encode()), {}, "does not verify"),
    (user_token, {}, "not an assertion"),
    (lambda: jwt.encode({"users": ["ann"], "scope": "read", "exp": int(NOW) + 30}, cluster().signing,
                        algorithm="HS256"), {}, "not an assertion"),
    (user_claims_signed_as_an_assertion, {}, "not valid"),
    (lambda: "not-a-jwt", {}, "well-formed"),
], ids=["audience", "issuer", "user", "scope", "expired", "long-lived", "another-key", "auth-secret",
        "user-token", "user-token-cluster-key", "user-claims", "garbage"])
def test_an_assertion_that_does_not_fit_the_read_is_refused(token, expected, says):
    with pytest.raises(forwarding.Refused) as refused:
        verified(token(), **expected)
    assert says in refused.value.message


def test_the_cluster_key_is_no_user_key_and_an_assertion_no_user_token():
    keys = cluster()
    assert keys.auth_on and keys.problem is None and len(keys.signing) == 32
    assert keys.signing not in (SECRET.encode(), TOKEN.encode())
    from_token = forwarding.cluster_keys(None, None, None, TOKEN, False)
    assert from_token.signing == forwarding.derived_key(TOKEN) != keys.signing
    # An explicit cluster secret wins; the auth secret's previous one still verifies (a rolling rotation).
    explicit = forwarding.cluster_keys("c" * 40, SECRET, None, TOKEN, False)
    assert explicit.signing == b"c" * 40 and explicit.verifying == (b"c" * 40,)
    rotating = forwarding.cluster_keys(None, SECRET, "o" * 40, None, False)
    assert verified(assertion(key=cluster("o" * 40).signing), rotating.verifying)
    # Auth off: nothing to assert. Only a public key: no key, and the reason names the setting.
    assert forwarding.cluster_keys(None, None, None, None, False) == forwarding.ClusterKeys(auth_on=False)
    public_only = forwarding.cluster_keys(None, None, None, None, True)
    assert public_only.auth_on and public_only.signing is None and "REFLECT_CLUSTER_SECRET" in public_only.problem
    # An assertion presented as a user token: refused by the worker's user keys (the secret and the shared token).
    user_keys = auth.Keys(TOKEN, (auth.Key("HS256", SECRET.encode()),))
    for presented in (assertion(now=time.time()), assertion(key=forwarding.derived_key(TOKEN), now=time.time())):
        with pytest.raises(auth.AuthError) as refused:
            auth.credential_of(f"Bearer {presented}", user_keys)
        assert refused.value.status == 401


def test_an_assertion_admits_one_read_and_plain_http_is_refused_under_tls():
    replays = forwarding.Replays(most=2)
    assert replays.first_use("a", int(NOW) + 30, NOW) and not replays.first_use("a", int(NOW) + 30, NOW)
    assert replays.first_use("b", int(NOW) + 30, NOW) and replays.first_use("c", int(NOW) + 30, NOW)
    assert forwarding.plain_problem("http://w1:6066", tls=True)
    assert forwarding.plain_problem("https://w1:6066", tls=True) is None
    assert forwarding.plain_problem("http://w1:6066", tls=False) is None


# --- real workers -------------------------------------------------------------

class RecordingProxy:
    """A reverse proxy to one worker that records the headers of every
    request it passes on: what the owner is sent, seen from outside it."""

    def __init__(self, target_port: int) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                proxy.seen.append((self.path, headers))
                upstream = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                try:
                    upstream.request("GET", self.path, headers=headers)
                    answer = upstream.getresponse()
                    body = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status)
                for name in ("Content-Type", "WWW-Authenticate", "Retry-After"):
                    if answer.getheader(name):
                        self.send_header(name, answer.getheader(name))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def read_token(user: str, secret: str = SECRET) -> str:
    return auth.mint(auth.claims_for([user], "read", 600, time.time()), secret)


def status_of(port: int, path: str, **options) -> tuple[int, dict]:
    status, _, body = call(port, "GET", path, **options)
    return status, json.loads(body) if body else {}


def user_of(partitions: set[int], count: int) -> str:
    """A user id on one of `partitions`."""
    return next(f"u{i}" for i in range(10_000) if partition_of(f"u{i}", count) in partitions)


def answered_200(worker, path: str, token: str, **expected) -> dict | None:
    """The body of a read through `worker` once it is 200 and has `expected`, else None."""
    status, body = status_of(worker.settings.web_port, path, token=token)
    return body if status == 200 and all(body.get(k) == v for k, v in expected.items()) else None


def owned_by_first(workers, settings) -> set[int]:
    """The first worker's partitions once the group has settled: every worker
    ready, their partitions disjoint and covering all. Another worker may
    hold none (Faust's assignor leaves a third member of four partitions
    empty at times): it forwards every read, which is what is tested."""
    def split() -> list[set[int]] | None:
        if not all((w.get("/healthz") or {}).get("status") == "ok" for w in workers):
            return None
        sets = [assigned_partitions(w, settings.topic_episodes) for w in workers]
        whole = sum(map(len, sets)) == settings.partitions and set().union(*sets) == set(range(settings.partitions))
        return sets if whole and sets[0] else None
    return wait_for(split, 120, "the group's partitions split, the first worker holding some")[0]


@pytest.mark.integration
@pytest.mark.broker
def test_a_forwarded_read_carries_the_workers_assertion_never_the_callers_token(broker, tmp_path):
    """Three workers of one group: the entry worker (A), the owner (B, behind
    the recording proxy it advertises) and one that verifies tokens with a
    public key only (P), which has no cluster key to sign with."""
    workers = Workers(tmp_path)
    settings = make_settings(broker.url, tmp_path / "a", qdrant_url=None, auth_secret=SECRET, **SHORT_GROUP_TIMEOUTS)
    asyncio.run(ensure_topics(settings))
    owner_port = free_port()
    proxy = RecordingProxy(owner_port)
    private_pem, public_path = pem_pair("ec", tmp_path, "p")
    try:
        # The owner first: it holds every partition until the others join, and keeps some.
        b = workers.start(dataclasses.replace(settings, web_port=owner_port, data_dir=str(tmp_path / "b"),
                                              advertised_url=proxy.url), name="owner")
        a = workers.start(settings, name="entry")
        p = workers.start(dataclasses.replace(settings, web_port=free_port(), data_dir=str(tmp_path / "p"),
                                              auth_secret=None, auth_public_key_file=public_path), name="public")
        user = user_of(owned_by_first([b, a, p], settings), settings.partitions)
        asyncio.run(publish(settings, episode_stream([user], 3)))
        token, path = read_token(user), STATS.format(user)
        direct = wait_for(lambda: answered_200(b, path, token, episodes=3), 60, "the owner holding the episodes")

        # Through the entry worker: the owner's own answer, by way of the proxy.
        forwarded = wait_for(lambda: answered_200(a, path, token), 60, "a read through the entry worker answered")
        assert forwarded["episodes"] == direct["episodes"] == 3 and forwarded["user_id"] == user
        seen = [headers for sent, headers in proxy.seen if sent == path]
        assert seen, "the entry worker forwarded the read to the owner's advertised URL (the proxy)"
        for headers in seen:
            names = {k.lower() for k in headers}
            assert "authorization" not in names, f"the caller's token reached the owner: {headers}"
            assert not any(token in v for v in headers.values())
            assert forwarding.HEADER.lower() in names and FORWARDED.lower() in names
        sent = {k.lower(): v for k, v in seen[-1].items()}
        entry_url = sent[FORWARDED.lower()]
        claims = jwt.decode(sent[forwarding.HEADER.lower()], forwarding.derived_key(SECRET), algorithms=["HS256"],
                            audience=proxy.url)
        assert (claims["user"], claims["scope"], claims["iss"]) == (user, "read", entry_url)
        assert claims["exp"] - claims["iat"] == forwarding.TTL

        # Straight to the owner: only an assertion that fits this read, once.
        def owner_status(headers: dict[str, str], method: str = "GET", target: str = path) -> int:
            return call(b.settings.web_port, method, target, token=None, headers={FORWARDED: entry_url, **headers},
                        body=b"{}" if method == "POST" else None)[0]

        def minted(**claims) -> str:
            given = {"user": user, "scope": "read", "audience": proxy.url, "issuer": entry_url, "now": time.time(),
                     **claims}
            return forwarding.mint(forwarding.derived_key(SECRET), **given)
        good = minted()
        assert owner_status({forwarding.HEADER: good}) == 200
        refusals = {
            "replayed": owner_status({forwarding.HEADER: good}),
            "absent": owner_status({}),
            "forged": owner_status({forwarding.HEADER: forwarding.mint(forwarding.derived_key("f" * 40), user=user,
                                    scope="read", audience=proxy.url, issuer=entry_url, now=time.time())}),
            "the caller's token": owner_status({forwarding.HEADER: token}),
            "to another worker": owner_status({forwarding.HEADER: minted(audience=entry_url)}),
            "another user": owner_status({forwarding.HEADER: minted(user="u-other")}),
            "a write": owner_status({forwarding.HEADER: minted(scope="read write")}, "POST",
                                    f"/v1/users/{user}/episodes"),
            "without X-Reflect-Forwarded": call(b.settings.web_port, "GET", path, token=None,
                                                headers={forwarding.HEADER: minted()})[0],
        }
        assert refusals == {name: 401 for name in refusals}

        # A worker with only a public key cannot sign: 503 naming the setting, and one warning at start.
        es_token = auth.mint(auth.claims_for([user], "read", 600, time.time()), private_key_pem=private_pem)
        def unsigned() -> tuple[int, dict] | None:
            status, body = status_of(p.settings.web_port, path, token=es_token)
            assert status != 200, "a worker with no cluster key forwarded a read"
            return (status, body) if "REFLECT_CLUSTER_SECRET" in body.get("error", {}).get("message", "") else None
        status, body = wait_for(unsigned, 30, "the read through the public-key worker refused, naming the setting")
        assert status == 503, body
        warning = "will fail (503)"
        assert p.log_path.read_text().count(warning) == 1
        assert warning not in a.log_path.read_text() + b.log_path.read_text()
    finally:
        workers.stop_all()
        proxy.close()


# --- TLS between workers ------------------------------------------------------

def self_signed(tmp_path) -> tuple[str, str]:
    """(certificate, key) PEM paths of a self-signed certificate for 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "reflect test worker")])
    now = datetime.now(UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "worker.crt", tmp_path / "worker.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


class TlsWorker(Worker):
    """A worker whose API serves TLS, reached over https with the test's CA."""

    def __init__(self, settings, log_path, ca: str) -> None:
        super().__init__(settings, log_path)
        self.ca = ssl.create_default_context(cafile=ca)

    def read(self, path: str, token: str | None = None) -> tuple[int, dict] | None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            answer = httpx.get(f"https://127.0.0.1:{self.settings.web_port}{path}", headers=headers, verify=self.ca,
                               timeout=15)
        except httpx.HTTPError:
            return None
        return answer.status_code, answer.json() if answer.content else {}

    def get(self, path: str):
        answer = self.read(path, SECRET_TOKEN)
        if answer is None:
            return None
        status, body = answer
        return body if status == 200 else {"status": status, **body}


SECRET_TOKEN = auth.mint(auth.claims_for(["*"], "read write admin", 24 * 3600, time.time()), SECRET)


@pytest.mark.integration
@pytest.mark.broker
def test_workers_forward_over_tls_and_a_certificate_that_does_not_verify_is_a_503(broker, tmp_path):
    """Three workers serving TLS with one self-signed certificate: the owner
    (B), an entry worker that trusts it (A, REFLECT_CLUSTER_CA_FILE) and one
    that has only the system's CAs (C)."""
    cert, key = self_signed(tmp_path)
    settings = make_settings(broker.url, tmp_path / "a", qdrant_url=None, auth_secret=SECRET,
                             web_tls_cert_file=cert, web_tls_key_file=key, cluster_ca_file=cert,
                             **SHORT_GROUP_TIMEOUTS)
    assert settings.canonical_url.startswith("https://")
    asyncio.run(ensure_topics(settings))
    variants = {"owner": {}, "entry": {}, "system-cas": {"cluster_ca_file": None}}  # the owner first, as above
    started: list[TlsWorker] = []
    try:
        for i, (name, changes) in enumerate(variants.items()):
            changed = settings if i == 0 else dataclasses.replace(
                settings, web_port=free_port(), data_dir=str(tmp_path / name), **changes)
            started.append(TlsWorker(changed, tmp_path / f"{name}.log", cert))
            started[-1].start()
        b, a, c = started
        user = user_of(owned_by_first(started, settings), settings.partitions)
        token, path = read_token(user), STATS.format(user)
        wait_for(lambda: (a.read(path, token) or (0,))[0] == 200, 60, "a read through the trusting entry worker")
        assert b.read(path, token) == a.read(path, token)

        def certificate_refused():
            answer = c.read(path, token)
            assert answer is None or answer[0] != 200, "a worker that cannot verify the owner answered for it"
            return answer if answer and "certificate" in answer[1].get("error", {}).get("message", "") else None
        status, body = wait_for(certificate_refused, 60, "the read through the worker with the system's CAs refused")
        assert status == 503 and "REFLECT_CLUSTER_CA_FILE" in body["error"]["message"], body
        assert "does not verify" in c.log_path.read_text()
    finally:
        for worker in started:
            worker.stop()
