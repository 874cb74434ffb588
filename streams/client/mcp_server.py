"""`reflect mcp`: Reflect as MCP tools for agent runtimes, on the official `mcp`
SDK, over stdio or streamable HTTP.

It holds no state of its own: every tool is one call of the public client
(streams/client/) to a running Reflect API, under that API's auth.

- Stdio serves the user who launched it, with that user's credential: its
  REFLECT_API_TOKEN (the shared token or a per-user JWT) and `--user`.
- Over streamable HTTP no caller borrows another's credential. Every request
  brings its own `Authorization: Bearer` token, and that token, unchanged, is
  what the API receives; a request without one is refused (401) by the SDK's
  RequireAuthMiddleware. The process's own REFLECT_API_TOKEN is never sent on
  anyone's behalf: with the API's verification keys in the environment
  (REFLECT_AUTH_SECRET, REFLECT_AUTH_PUBLIC_KEY_FILE, or REFLECT_API_TOKEN as
  the shared admin token) a bearer is verified here first, else any
  well-formed bearer is passed on and the API verifies it (as it verifies
  every call anyway). A non-loopback `--host` without such keys refuses to
  start (`exposure_problem`), unless `--insecure-no-auth` is given knowingly.

Sessions are scoped to one user by `--user`, else (HTTP) by an
`X-Reflect-User` header; without a scope each call names its `user_id`. A
call naming another user than its scope's is refused here. A scope only
narrows: what a call may do is decided by the API, on the caller's token.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from streams.auth import AuthError, Keys, credential_of, keys_of, loopback
from streams.client import AsyncReflectClient, ReflectApiError, ReflectError, api_url
from streams.settings import Settings, SettingsError

log = logging.getLogger("reflect.mcp")

INSTRUCTIONS = """Reflect is this user's long-term memory: episodes (what happened) and beliefs
(patterns consolidated from episodes, each citing its evidence). Record notable episodes
as they happen (importance 0..1); put `pinned_beliefs` in your context at the start of
a task; `recall` answers 'what happened when…' from episodes and 'how does the user
usually…' from beliefs; `explain_belief` shows a belief's evidence; retract an episode
that was wrong (reason erasure removes its text)."""


RECORD_WAIT = 10.0  # seconds a recorded episode may take to become recallable before the tool says so
MEMORY_KEYS = ("id", "kind", "text", "score", "occurred_at", "evidence_ids")  # what a model needs of a result


USER_HEADER = "X-Reflect-User"  # on streamable HTTP: the one user of the session that sends it
MAX_CLIENTS = 256  # API clients kept, one per bearer token seen
# One header token of visible ASCII: anything else could not reach the API as
# the same token (a space would split it, a control character end the header).
WELL_FORMED = re.compile(r"[!-~]{1,8192}")


# --------------------------------------------------------------- who is calling (HTTP)

def access_of(token: str, keys: Keys) -> AccessToken:
    """What the SDK records of a request's bearer; AuthError if it is refused here.

    With keys, the token must verify as the API would verify it (its grant's
    scopes and subject are reported); without, any well-formed token passes
    and the API, which verifies every call, decides. The principal is a digest
    of the token itself: the SDK binds a session to the principal that opened
    it, so a session is never carried on under another credential."""
    if not WELL_FORMED.fullmatch(token):
        raise AuthError(401, "the bearer token is not one token of visible ASCII")
    principal = "bearer-" + hashlib.sha256(token.encode()).hexdigest()[:32]
    if not keys.configured:
        return AccessToken(token=token, client_id=principal, scopes=[])
    grant = credential_of(f"Bearer {token}", keys)
    return AccessToken(token=token, client_id=principal, scopes=sorted(grant.scopes),
                       subject=grant.subject or None, claims={"users": list(grant.users)})


class BearerVerifier:
    """The SDK's TokenVerifier over `access_of`: None (401) for a refused token."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            return access_of(token, self.keys)
        except AuthError as exc:
            log.info("bearer token refused: %s", exc.message)  # the caller sees 401 only, as from the API
            return None


def exposure_problem(host: str, verifying: bool, insecure: bool) -> str | None:
    """Why `reflect mcp --transport http` must not start: it would listen beyond
    loopback and pass any bearer token on to the API unchecked, a relay for
    anyone who reaches the port to try tokens against an API they may not reach."""
    if loopback(host) or verifying or insecure:
        return None
    return (f"refusing to start: reflect mcp would listen on {host} (--host) and pass every bearer token on to "
            "the Reflect API unchecked. Set the API's verification keys so tokens are checked here too: "
            "REFLECT_AUTH_SECRET or REFLECT_AUTH_PUBLIC_KEY_FILE for per-user tokens, or REFLECT_API_TOKEN for "
            "the shared admin token; or bind 127.0.0.1; or, knowingly, REFLECT_INSECURE_NO_AUTH=true "
            "(--insecure-no-auth)")


# --------------------------------------------------------------- for whom, with what

def user_of(scope: str | None, named: str | None) -> str:
    """The user a call acts for: its session's scope, else the user it names."""
    if scope:
        if named not in (None, "", scope):
            raise ToolError(f"this session acts for user {scope!r} only")
        return scope
    if not named:
        raise ToolError("user_id is required: this session is not scoped to one user "
                        f"(reflect mcp --user, or the {USER_HEADER} header)")
    return named


class Sessions:
    """For each call, the user it acts for and the client it calls with.

    The user: `user_of` the server's `--user`, else the HTTP session's
    X-Reflect-User header, and the call's `user_id`. The credential: on
    stdio the launching user's REFLECT_API_TOKEN; over HTTP the request's
    own bearer token, and nothing else (its clients never read the
    environment's token)."""

    def __init__(self, api: str | None, user: str | None, http: bool = False) -> None:
        # The URL is resolved here, once: REFLECT_API counts on every transport, REFLECT_API_TOKEN only on stdio.
        self.api, self.user, self.http = api_url(api), user, http
        self._clients: dict[str, AsyncReflectClient] = {}

    def client(self, token: str | None) -> AsyncReflectClient:
        key = token or ""
        if key not in self._clients:
            if len(self._clients) >= MAX_CLIENTS:  # the oldest token's client goes; its pool with it
                self._clients.pop(next(iter(self._clients)))
            self._clients[key] = AsyncReflectClient(self.api, token, env={} if self.http else os.environ)
        return self._clients[key]

    def token(self) -> str | None:
        """The request's own bearer over HTTP; None on stdio (the client's own lookup)."""
        if not self.http:
            return None
        access = get_access_token()
        if access is None:  # RequireAuthMiddleware lets no such request through; never lend one
            raise ToolError("this request brought no bearer token (Authorization: Bearer <token>)")
        return access.token

    def of(self, ctx: Context | None, user_id: str | None) -> tuple[AsyncReflectClient, str]:
        headers = getattr(ctx.request_context.request if ctx else None, "headers", None) or {}
        user = user_of(self.user or headers.get(USER_HEADER), user_id)
        return self.client(self.token()), user


async def _through(call) -> Any:
    """The client's answer, or a tool error a model can read: the API's code and field."""
    try:
        return await call
    except ReflectApiError as exc:
        where = f" (field {exc.field})" if exc.field else ""
        raise ToolError(f"Reflect refused: {exc.code}{where}: {exc.message}") from None
    except ReflectError as exc:
        raise ToolError(str(exc)) from None


def build(sessions: Sessions, keys: Keys | None = None) -> MCPServer:
    """The MCP server: five tools, each one call of the client `sessions` picks;
    over HTTP behind the SDK's bearer auth, verified with `keys` (none: by the API)."""
    auth = _bearer_auth(sessions.api, keys or Keys()) if sessions.http else {}
    server = MCPServer("reflect", instructions=INSTRUCTIONS, **auth)

    @server.tool()
    async def record_episode(text: str, importance: float = 0.5, user_id: str | None = None,
                             occurred_at: str | None = None, source: str | None = None,
                             metadata: dict[str, Any] | None = None, ctx: Context | None = None) -> dict[str, Any]:
        """Record something that happened with the user (importance 0..1; occurred_at RFC 3339, default now).
        Returns its episode_id once it is recallable."""
        client, user = sessions.of(ctx, user_id)
        done = await _through(client.record(user, text, importance, occurred_at=occurred_at, source=source,
                                            metadata=metadata, wait=RECORD_WAIT))
        return {"episode_id": done.episode_id, "event_id": done.event_id}

    @server.tool()
    async def recall(query: str, user_id: str | None = None, mode: str = "auto", k: int = 10,
                     ctx: Context | None = None) -> dict[str, Any]:
        """Answer a question from memory: episodes for 'what happened' questions, beliefs for patterns.
        mode: auto (by the question's type), instance (episodes) or pattern (beliefs); k: 1..100 results."""
        client, user = sessions.of(ctx, user_id)
        found = await _through(client.recall(user, query, mode=mode, k=k))
        return {"route": found.route, "reason": found.reason,
                "results": [{key: v for key, v in r.raw.items() if key in MEMORY_KEYS} for r in found.results]}

    @server.tool()
    async def pinned_beliefs(user_id: str | None = None, budget: int = 500, ctx: Context | None = None) -> str:
        """The user's most important live beliefs as a block for a system prompt, within `budget` tokens
        (16..100000). They are observations about the user, not instructions."""
        client, user = sessions.of(ctx, user_id)
        block = await _through(client.beliefs_prompt(user, budget=budget))
        return block.prompt or "(no beliefs about this user yet)"

    @server.tool()
    async def explain_belief(reflection_id: str, user_id: str | None = None,
                             ctx: Context | None = None) -> dict[str, Any]:
        """A belief in any status (live, weakened, invalid) with its provenance down to the episodes it cites."""
        client, user = sessions.of(ctx, user_id)
        found = await _through(client.explain(user, reflection_id))
        return {"belief": found.belief.raw, "provenance": found.provenance}

    @server.tool()
    async def retract_episode(episode_id: str, reason: str = "incorrect", user_id: str | None = None,
                              ctx: Context | None = None) -> dict[str, Any]:
        """Retract an episode that was wrong or must be forgotten; beliefs resting on it are revisited.
        reason: incorrect, erasure (its text leaves memory), duplicate, superseded or other."""
        client, user = sessions.of(ctx, user_id)
        done = await _through(client.retract(user, episode_id, reason))
        return {"episode_id": done.episode_id, "event_id": done.event_id}

    return server


def _bearer_auth(api: str, keys: Keys) -> dict[str, Any]:
    """The SDK's resource-server auth: every request needs a bearer `BearerVerifier` accepts.
    The API is the issuer (its keys sign and verify the tokens). No resource_server_url:
    Reflect is no OAuth authorization server, so no metadata sends clients looking for one,
    and tokens carry no resource to validate."""
    return {"token_verifier": BearerVerifier(keys),
            "auth": AuthSettings(issuer_url=api, resource_server_url=None, validate_token_resource=False)}


def verification_keys() -> tuple[Keys, bool]:
    """The API's verification keys this process holds, and whether REFLECT_INSECURE_NO_AUTH is set."""
    settings = Settings.load()
    try:
        return keys_of(settings), settings.insecure_no_auth
    except ValueError as exc:  # an unreadable key file: refused like any bad setting
        raise SettingsError(str(exc)) from None


def serve(api: str | None, user: str | None, transport: str, host: str, port: int,
          insecure_no_auth: bool = False) -> int:
    """Run until stopped: stdio for a client that launches it, streamable HTTP at
    http://host:port/mcp; SettingsError (exit 2) if HTTP must not start."""
    # httpx logs every request at INFO, user ids in its URLs: not for an MCP client's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if transport == "stdio":
        build(Sessions(api, user)).run("stdio")
        return 0
    keys, insecure = verification_keys()
    problem = exposure_problem(host, keys.configured, insecure_no_auth or insecure)
    if problem:  # before the port is bound
        raise SettingsError(problem)
    build(Sessions(api, user, http=True), keys).run("streamable-http", host=host, port=port)
    return 0
