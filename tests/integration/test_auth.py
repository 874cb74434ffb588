"""Per-user credentials (issue 22, items 2 and 3): the pure rules of streams/auth.py,
then a real `reflect worker` behind them — cross-user 403 on every user route,
admin-only routes, expiry, rotation of an HS256 secret and of an ES256/RS256
key, the shared token as admin — and the fail-closed start."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace

import jwt
import orjson
import pytest

from streams.broker import free_port
from streams import auth
from streams.settings import Settings, SettingsError
from support.api import EPISODE, call, error_of, pem_pair
from support.harness import settings_env

SECRET = "s" * 40
PREVIOUS = "p" * 40
SHARED = "shared-token-" + "0123456789abcdef" * 2


def token(users, scope, ttl=3600, secret=SECRET, **extra) -> str:
    now = time.time()
    claims = {"users": users, "scope": scope, "iat": int(now), "exp": int(now) + ttl, **extra}
    return jwt.encode(claims, secret, algorithm="HS256")


def keys(**settings) -> auth.Keys:
    return auth.keys_of(Settings.load(env={}, **settings))


# --- pure rules ---------------------------------------------------------------

@pytest.mark.parametrize("method, route, need", [
    ("GET", "/healthz", None),
    ("GET", "/livez", None),
    ("GET", "/v1/users/{user_id}/beliefs", auth.Need("read", True)),
    ("GET", "/v1/users/{user_id}/recall", auth.Need("read", True)),
    ("GET", "/v1/users/{user_id}/stats", auth.Need("read", True)),
    ("GET", "/v1/users/{user_id}/episodes/{episode_id}", auth.Need("read", True)),
    ("GET", "/v1/users/{user_id}/reflections/{reflection_id}", auth.Need("read", True)),
    ("POST", "/v1/users/{user_id}/episodes", auth.Need("write", True)),
    ("POST", "/v1/users/{user_id}/episodes/{episode_id}/retract", auth.Need("write", True)),
    ("POST", "/v1/users/{user_id}/reflect", auth.Need("write", True)),
    ("GET", "/v1/admin/rebuild", auth.Need("admin")),
    ("POST", "/v1/admin/rebuild", auth.Need("admin")),
    ("GET", "/v1/reasoner", auth.Need("admin")),
    ("GET", "/metrics", auth.Need("admin")),
    ("GET", "/table/{name}/", auth.Need("admin")),  # Faust's own pages
    ("GET", None, auth.Need(None)),  # no route: any valid credential, then 404
])
def test_every_route_needs_its_scope_and_its_user(method, route, need):
    assert auth.need_of(method, route) == need


def test_users_match_by_id_or_prefix_and_scopes_do_not_imply_each_other():
    grant = auth.Grant(("ann", "team-*"), frozenset({"read"}))
    assert grant.covers("ann") and grant.covers("team-7") and grant.covers("team-")
    assert not grant.covers("anne") and not grant.covers("bob") and not grant.covers("tea")
    read_user = auth.Need("read", True)
    assert auth.refusal(grant, read_user, "team-7") is None
    assert auth.refusal(grant, read_user, "bob").status == 403
    assert auth.refusal(grant, auth.Need("write", True), "ann").scope == "write"
    assert auth.refusal(grant, auth.Need("admin"), None).status == 403
    admin_of_ann = auth.Grant(("ann",), frozenset({"admin"}))
    assert auth.refusal(admin_of_ann, auth.Need("admin"), None) is None
    assert auth.refusal(admin_of_ann, read_user, "ann").status == 403  # admin is not read
    assert auth.refusal(auth.SHARED, read_user, "anyone") is None


@pytest.mark.parametrize("claims, says", [
    ({"users": "ann", "scope": "read"}, "users"),
    ({"users": [], "scope": "read"}, "users"),
    ({"users": ["a*b"], "scope": "read"}, "users"),
    ({"users": ["ann"], "scope": "read delete"}, "scope"),
    ({"users": ["ann"], "scope": ""}, "scope"),
    ({"users": ["ann"]}, "scope"),
])
def test_malformed_claims_are_refused_not_read_generously(claims, says):
    with pytest.raises(auth.AuthError) as refused:
        auth.credential_of(f"Bearer {token(**{'users': None, 'scope': None, **claims})}", keys(auth_secret=SECRET))
    assert refused.value.status == 401 and says in refused.value.message


def test_a_prefix_grant_ends_at_a_delimiter():
    acme = auth.credential_of(f"Bearer {token(['acme:*'], 'read')}", keys(auth_secret=SECRET))
    assert acme.covers("acme:1") and not acme.covers("acme2") and not acme.covers("acme")
    for open_ended in ("acme*", "a*"):
        with pytest.raises(auth.AuthError, match="no delimiter before its `\\*`") as refused:
            auth.credential_of(f"Bearer {token(['ann', open_ended], 'read')}", keys(auth_secret=SECRET))
        assert refused.value.status == 401 and "acme2" in refused.value.message
        with pytest.raises(ValueError, match="acme2"):
            auth.claims_for([open_ended], "read", 60, time.time())
    for fine in ("*", "ann", *(f"acme{d}*" for d in "-_/.@:")):
        assert auth.credential_of(f"Bearer {token([fine], 'read')}", keys(auth_secret=SECRET)).users == (fine,)


def test_audience_issuer_lifetime_and_revocation():
    strict = keys(auth_secret=SECRET, auth_audience="reflect-prod", auth_issuer="https://idp.example",
                  auth_max_ttl=3600)
    good = token(["ann"], "read", aud="reflect-prod", iss="https://idp.example", jti="t1")
    assert auth.credential_of(f"Bearer {good}", strict).users == ("ann",)
    for bad, says in ((token(["ann"], "read", aud="reflect-dev", iss="https://idp.example"), "audience"),
                      (token(["ann"], "read", iss="https://idp.example"), "aud"),
                      (token(["ann"], "read", aud="reflect-prod", iss="https://evil.example"), "issuer"),
                      (token(["ann"], "read", aud="reflect-prod"), "iss"),
                      (token(["ann"], "read", ttl=7200, aud="reflect-prod", iss="https://idp.example"),
                       "REFLECT_AUTH_MAX_TTL")):
        with pytest.raises(auth.AuthError, match=f"(?i){says}") as refused:
            auth.credential_of(f"Bearer {bad}", strict)
        assert refused.value.status == 401
    # Without iat, the lifetime counts from now; unconfigured, aud and iss are not checked.
    no_iat = jwt.encode({"users": ["ann"], "scope": "read", "exp": int(time.time()) + 7200}, SECRET, algorithm="HS256")
    with pytest.raises(auth.AuthError, match="REFLECT_AUTH_MAX_TTL"):
        auth.credential_of(f"Bearer {no_iat}", keys(auth_secret=SECRET, auth_max_ttl=3600))
    assert auth.credential_of(f"Bearer {no_iat}", keys(auth_secret=SECRET, auth_max_ttl=0)).users == ("ann",)
    assert auth.credential_of(f"Bearer {good}", keys(auth_secret=SECRET)).users == ("ann",)

    strict.revoked.add("t1", time.time() + 3600, time.time())
    with pytest.raises(auth.AuthError, match="revoked"):
        auth.credential_of(f"Bearer {good}", strict)
    fresh = token(['ann'], 'read', aud='reflect-prod', iss='https://idp.example', jti='t2')
    assert auth.credential_of(f"Bearer {fresh}", strict).users == ("ann",)
    # An expired revocation is forgotten (the token fails on exp anyway); minting honours the limits.
    strict.revoked.add("old", time.time() - 3600, time.time())
    assert "old" not in strict.revoked and len(strict.revoked) == 1
    minted = auth.claims_for(["ann"], "read", 60, time.time(), max_ttl=3600, audience="reflect-prod")
    assert minted["aud"] == "reflect-prod" and len(minted["jti"]) == 32
    with pytest.raises(ValueError, match="REFLECT_AUTH_MAX_TTL"):
        auth.claims_for(["ann"], "read", 7200, time.time(), max_ttl=3600)


def test_credentials_expiry_signature_rotation_and_algorithm_pinning(tmp_path):
    current = keys(auth_secret=SECRET, auth_previous_secret=PREVIOUS, api_token=SHARED)
    assert auth.credential_of(f"Bearer {token(['ann'], 'read')}", current).users == ("ann",)
    assert auth.credential_of(f"bearer {token(['ann'], 'read', secret=PREVIOUS)}", current).scopes == {"read"}
    assert auth.credential_of(f"Bearer {SHARED}", current) == auth.SHARED
    for header, says in ((None, "required"), (f"Basic {SHARED}", "required"),
                         (f"Bearer {token(['ann'], 'read', ttl=-120)}", "expired"),
                         (f"Bearer {token(['ann'], 'read', secret='x' * 40)}", "signature"),
                         (f"Bearer {SHARED[:-1]}x", "well-formed"),
                         ("Bearer " + jwt.encode({"users": ["ann"], "scope": "read"}, SECRET, algorithm="HS256"),
                          "exp"),
                         ("Bearer " + jwt.encode({"users": ["*"], "scope": "admin", "exp": time.time() + 60}, None,
                                                 algorithm="none"), "not accepted")):
        with pytest.raises(auth.AuthError, match=says) as refused:
            auth.credential_of(header, current)
        assert refused.value.status == 401
    # Rotated out: without the previous secret its tokens stop working.
    with pytest.raises(auth.AuthError, match="signature"):
        auth.credential_of(f"Bearer {token(['ann'], 'read', secret=PREVIOUS)}", keys(auth_secret=SECRET))

    # Public keys: each accepts only its own algorithm; the PEM is never an HMAC secret.
    es_private, es_public = pem_pair("ec", tmp_path, "es")
    rs_private, rs_public = pem_pair("rsa", tmp_path, "rs")
    both = keys(auth_public_key_file=es_public, auth_previous_public_key_file=rs_public)
    claims = auth.claims_for(["ann"], "read write", 60, time.time())
    assert jwt.get_unverified_header(auth.mint(claims, private_key_pem=es_private))["alg"] == "ES256"
    es_token = auth.mint(claims, private_key_pem=es_private)
    assert auth.credential_of(f"Bearer {es_token}", both).scopes == {"read", "write"}
    assert auth.credential_of(f"Bearer {auth.mint(claims, private_key_pem=rs_private)}", both).users == ("ann",)
    confused = jwt.encode(claims, SECRET, algorithm="HS256")  # an HS256 token where only keys are configured
    with pytest.raises(auth.AuthError, match="not accepted"):
        auth.credential_of(f"Bearer {confused}", both)
    other_private, _ = pem_pair("ec", tmp_path, "other")
    with pytest.raises(auth.AuthError, match="signature"):
        auth.credential_of(f"Bearer {auth.mint(claims, private_key_pem=other_private)}", both)


def test_auth_settings_are_checked_at_start(tmp_path):
    for env, named in (({"REFLECT_AUTH_SECRET": "short"}, "REFLECT_AUTH_SECRET"),
                       ({"REFLECT_AUTH_PREVIOUS_SECRET": PREVIOUS}, "REFLECT_AUTH_SECRET"),
                       ({"REFLECT_AUTH_PUBLIC_KEY_FILE": str(tmp_path / "none.pem")}, "REFLECT_AUTH_PUBLIC_KEY_FILE"),
                       ({"REFLECT_INSECURE_NO_AUTH": "maybe"}, "REFLECT_INSECURE_NO_AUTH")):
        with pytest.raises(SettingsError, match=named) as bad:
            Settings.load(env=env)
        assert "short" not in str(bad.value)  # a mistyped secret is still a secret
    (tmp_path / "junk.pem").write_text("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
    with pytest.raises(SettingsError, match="REFLECT_AUTH_PUBLIC_KEY_FILE"):
        Settings.load(env={"REFLECT_AUTH_PUBLIC_KEY_FILE": str(tmp_path / "junk.pem")})
    s = Settings.load(env={"REFLECT_AUTH_SECRET": SECRET})
    assert SECRET not in repr(s) and Settings.load(env=s.child_env(base={})) == s


@pytest.mark.parametrize("host, exposed", [("127.0.0.1", False), ("::1", False), ("[::1]", False),
                                           ("localhost", False), ("127.0.0.5", False), ("0.0.0.0", True),
                                           ("::", True), ("10.0.0.4", True), ("reflect.internal", True)])
def test_only_a_loopback_bind_may_run_without_credentials(host, exposed):
    bare = Settings.load(env={"REFLECT_WEB_HOST": host})
    assert (auth.exposure_problem(bare) is not None) == exposed
    for setting in ({"REFLECT_AUTH_SECRET": SECRET}, {"REFLECT_API_TOKEN": SHARED},
                    {"REFLECT_INSECURE_NO_AUTH": "true"}):
        assert auth.exposure_problem(Settings.load(env={"REFLECT_WEB_HOST": host, **setting})) is None


def test_token_mint_prints_a_token_the_worker_accepts(tmp_path):
    env = {"REFLECT_AUTH_SECRET": SECRET, "PATH": "/usr/bin:/bin"}
    minted = subprocess.run([sys.executable, "-m", "streams.cli", "token", "mint", "--users", "ann,team-*",
                             "--scope", "read write", "--ttl", "1h"], env=env, capture_output=True, text=True)
    assert minted.returncode == 0, minted.stderr
    grant = auth.credential_of(f"Bearer {minted.stdout.strip()}", keys(auth_secret=SECRET))
    assert grant.users == ("ann", "team-*") and grant.scopes == {"read", "write"}
    claims = jwt.decode(minted.stdout.strip(), SECRET, algorithms=["HS256"])
    assert claims["exp"] - claims["iat"] == 3600
    es_private, es_public = pem_pair("ec", tmp_path, "mint")
    (tmp_path / "mint.pem").write_bytes(es_private)
    signed = subprocess.run([sys.executable, "-m", "streams.cli", "token", "mint", "--users", "*", "--scope", "admin",
                             "--ttl", "15m", "--private-key", str(tmp_path / "mint.pem")],
                            env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert signed.returncode == 0, signed.stderr
    assert auth.credential_of(f"Bearer {signed.stdout.strip()}", keys(auth_public_key_file=es_public)) == \
        auth.Grant(("*",), frozenset({"admin"}))
    for args, says in ((["--scope", "read delete"], "--scope"), (["--ttl", "soon"], "duration"),
                       (["--users", "a*b"], "--users"), (["--users", "acme*"], "acme2"),
                       (["--ttl", "60d"], "REFLECT_AUTH_MAX_TTL")):
        base = {"--users": "ann", "--scope": "read", "--ttl": "1h"}
        base.update(dict(zip(args[::2], args[1::2])))
        bad = subprocess.run([sys.executable, "-m", "streams.cli", "token", "mint",
                              *[x for kv in base.items() for x in kv]], env=env, capture_output=True, text=True)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    unsigned = subprocess.run([sys.executable, "-m", "streams.cli", "token", "mint", "--users", "ann", "--scope",
                               "read"], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert unsigned.returncode == 2 and "REFLECT_AUTH_SECRET" in unsigned.stderr


# --- a real worker ------------------------------------------------------------

USER_ROUTES = [  # (method, path of ann, body, statuses with a token granting ann)
    ("POST", "/v1/users/{u}/episodes", EPISODE, {202}),
    ("GET", "/v1/users/{u}/episodes/e1", None, {200, 404}),
    ("POST", "/v1/users/{u}/episodes/e1/retract", b'{"reason": "incorrect"}', {202}),
    ("POST", "/v1/users/{u}/reflect", None, {202}),
    ("GET", "/v1/users/{u}/beliefs", None, {200}),
    ("GET", "/v1/users/{u}/beliefs?format=prompt", None, {200}),
    ("GET", "/v1/users/{u}/recall?q=deploys", None, {200}),
    ("GET", "/v1/users/{u}/reflections/r1", None, {404}),
    ("GET", "/v1/users/{u}/stats", None, {200}),
]
ADMIN_ROUTES = [("GET", "/v1/reasoner"), ("GET", "/v1/admin/rebuild"), ("POST", "/v1/admin/rebuild"),
                ("POST", "/v1/admin/revocations"), ("GET", "/metrics"), ("GET", "/table/")]


def test_a_worker_grants_each_token_its_users_and_scopes_only(worker, settings, tmp_path):
    es_private, es_public = pem_pair("ec", tmp_path, "worker")
    worker(env={"REFLECT_AUTH_SECRET": SECRET, "REFLECT_AUTH_PREVIOUS_SECRET": PREVIOUS,
                "REFLECT_AUTH_PUBLIC_KEY_FILE": es_public, "REFLECT_API_TOKEN": SHARED})
    port = settings.web_port
    ann_rw, ann_read = token(["ann"], "read write"), token(["ann"], "read")
    team = token(["team-*"], "read write", secret=PREVIOUS)  # signed with the secret being rotated out
    es_ann = auth.mint(auth.claims_for(["ann"], "read write", 600, time.time()), private_key_pem=es_private)

    for method, template, body, allowed in USER_ROUTES:
        for credential, user in ((ann_rw, "ann"), (team, "team-9"), (es_ann, "ann"), (SHARED, "anyone")):
            status, _, raw = call(port, method, template.format(u=user), body, token=credential)
            assert status in allowed, (method, template, user, status, raw)
        for credential, user in ((ann_rw, "bob"), (ann_rw, "anne"), (team, "ann"), (es_ann, "bob")):
            status, headers, raw = call(port, method, template.format(u=user), body, token=credential)
            assert status == 403, (method, template, user, status, raw)
            assert error_of(raw) == {"code": "forbidden", "message": "this token does not grant access to this user",
                                     "field": "user_id"}
            assert 'error="insufficient_scope"' in headers["www-authenticate"]
        if method == "POST":  # writing, retracting and asking for a cycle need `write`
            status, headers, raw = call(port, method, template.format(u="ann"), body, token=ann_read)
            assert status == 403 and 'scope="write"' in headers["www-authenticate"], raw
            assert "'write'" in error_of(raw)["message"]

    admin_of_ann = token(["ann"], "read write admin")
    for method, path in ADMIN_ROUTES:
        for credential in (ann_rw, team, es_ann):
            status, headers, raw = call(port, method, path, token=credential)
            assert status == 403 and 'scope="admin"' in headers["www-authenticate"], (path, status, raw)
        if method == "GET":
            assert call(port, method, path, token=admin_of_ann)[0] == 200, path
            assert call(port, method, path, token=SHARED)[0] == 200, path

    # 401: none, expired, badly signed, a rotated-out key; never a trace, always JSON.
    expired, forged = token(["ann"], "read", ttl=-120), token(["ann"], "read", secret="f" * 40)
    for credential, says in ((None, "required"), (expired, "expired"), (forged, "signature"),
                             (token(["ann"], "read", secret="q" * 40), "signature")):
        status, headers, raw = call(port, "GET", "/v1/users/ann/beliefs", token=credential)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer"), raw
        assert error_of(raw)["code"] == "unauthorized" and says in error_of(raw)["message"]
    assert call(port, "GET", "/no/such/route", token=ann_read)[0] == 404  # any valid credential learns 404
    assert call(port, "GET", "/no/such/route", token=None)[0] == 401
    assert call(port, "GET", "/healthz", token=None)[0] == 200 and call(port, "GET", "/livez", token=None)[0] == 200


def test_an_exposed_worker_without_credentials_refuses_to_start(settings, worker):
    exposed = replace(settings, web_host="0.0.0.0")
    started = time.monotonic()
    refused = subprocess.run([sys.executable, "-m", "streams.cli", "worker"], env=settings_env(exposed),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and time.monotonic() - started < 30
    for name in ("REFLECT_WEB_HOST", "REFLECT_AUTH_SECRET", "REFLECT_AUTH_PUBLIC_KEY_FILE", "REFLECT_API_TOKEN",
                 "--insecure-no-auth"):
        assert name in refused.stderr, (name, refused.stderr)
    assert "Traceback" not in refused.stderr
    flagged = subprocess.run([sys.executable, "-m", "streams.cli", "settings", "--insecure-no-auth"],
                             env=settings_env(exposed), capture_output=True, text=True)
    assert "REFLECT_INSECURE_NO_AUTH     True" in flagged.stdout, flagged.stdout
    w = worker(replace(exposed, insecure_no_auth=True))  # knowingly open: it starts and serves
    assert w.get("/healthz")["status"] == "ok" and w.stats("ann")["episodes"] == 0


def test_a_revoked_token_is_refused_at_once_and_by_a_worker_started_later(worker, settings, tmp_path):
    env = {"REFLECT_AUTH_SECRET": SECRET, "REFLECT_API_TOKEN": SHARED}
    first = worker(env=env)
    revoked, kept = (auth.mint(auth.claims_for(["ann"], "read", 600, time.time()), SECRET) for _ in range(2))
    jti = jwt.decode(revoked, options={"verify_signature": False})["jti"]
    stats = "/v1/users/ann/stats"
    assert call(settings.web_port, "GET", stats, token=revoked)[0] == 200

    def revoke(body: dict, token: str = SHARED) -> tuple[int, dict]:
        status, _, raw = call(settings.web_port, "POST", "/v1/admin/revocations", orjson.dumps(body), token=token)
        return status, orjson.loads(raw)

    assert revoke({"jti": jti}, token=revoked)[0] == 403  # revoking needs admin
    for bad, field in (({}, "jti"), ({"jti": ""}, "jti"), ({"jti": jti, "expires_at": "soon"}, "expires_at"),
                       ({"jti": jti, "expires_at": None}, "expires_at"),
                       ({"jti": jti, "why": "leaked"}, "why")):
        status, body = revoke(bad)
        assert status == 422 and body["error"]["field"] == field, body
    status, body = revoke({"jti": jti})
    assert status == 202 and body["jti"] == jti and body["in_force_here"] is True, body
    status, _, raw = call(settings.web_port, "GET", stats, token=revoked)
    assert status == 401 and "revoked" in error_of(raw)["message"], raw
    assert call(settings.web_port, "GET", stats, token=kept)[0] == 200

    # A worker that starts later reads the revocation before it serves anything.
    first.stop()
    later = replace(settings, web_port=free_port(), data_dir=str(tmp_path / "later"))
    worker(later, env=env)
    assert call(later.web_port, "GET", stats, token=revoked)[0] == 401
    assert call(later.web_port, "GET", stats, token=kept)[0] == 200

    # `reflect token revoke` takes the token itself (its jti and exp), through the API.
    cli = subprocess.run([sys.executable, "-m", "streams.cli", "token", "revoke", kept, "--api",
                          f"http://127.0.0.1:{later.web_port}"], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "REFLECT_API_TOKEN": SHARED})
    assert cli.returncode == 0 and jwt.decode(kept, options={"verify_signature": False})["jti"] in cli.stdout, cli
    assert call(later.web_port, "GET", stats, token=kept)[0] == 401
