"""`reflect mcp`: Reflect as MCP tools for agent runtimes, on the official `mcp`
SDK, over stdio or streamable HTTP.

It holds no state of its own: every tool is one call of the public client
(streams/client.py) to a running Reflect API, under that API's auth. Stdio
serves the user who launched it: its REFLECT_API_TOKEN (the shared token or
a per-user JWT) and `--user`. Over streamable HTTP each session may bring its
own: an `Authorization: Bearer` header is passed on to the API, and an
`X-Reflect-User` header scopes the session to one user. Without a scope,
each call names its `user_id`; a call naming another user than its scope's
is refused here, before the API would refuse it.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from streams.client import AsyncReflectClient, ReflectApiError, ReflectError

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


class Sessions:
    """For each call, the user it acts for and the client it calls with.

    The user: the server's (`--user`), else the HTTP session's X-Reflect-User
    header, else the call's `user_id`; a call naming another is refused. The
    credential: the HTTP request's own bearer token, passed on to the API,
    else the server's REFLECT_API_TOKEN (stdio: the launching user's)."""

    def __init__(self, api: str | None, user: str | None) -> None:
        self.api, self.user = api, user
        self._clients: dict[str, AsyncReflectClient] = {}

    def client(self, token: str | None) -> AsyncReflectClient:
        key = token or ""
        if key not in self._clients:
            if len(self._clients) >= MAX_CLIENTS:  # the oldest token's client goes; its pool with it
                self._clients.pop(next(iter(self._clients)))
            self._clients[key] = AsyncReflectClient(self.api, token)
        return self._clients[key]

    def of(self, ctx: Context | None, user_id: str | None) -> tuple[AsyncReflectClient, str]:
        headers = getattr(ctx.request_context.request if ctx else None, "headers", None) or {}
        fixed = self.user or headers.get(USER_HEADER)
        if fixed:
            if user_id not in (None, "", fixed):
                raise ToolError(f"this session acts for user {fixed!r} only")
            user_id = fixed
        if not user_id:
            raise ToolError("user_id is required: this session is not scoped to one user "
                            f"(reflect mcp --user, or the {USER_HEADER} header)")
        bearer = headers.get("authorization", "")
        return self.client(bearer[7:].strip() if bearer[:7].lower() == "bearer " else None), user_id


async def _through(call) -> Any:
    """The client's answer, or a tool error a model can read: the API's code and field."""
    try:
        return await call
    except ReflectApiError as exc:
        where = f" (field {exc.field})" if exc.field else ""
        raise ToolError(f"Reflect refused: {exc.code}{where}: {exc.message}") from None
    except ReflectError as exc:
        raise ToolError(str(exc)) from None


def build(sessions: Sessions) -> MCPServer:
    """The MCP server: five tools, each one call of the client `sessions` picks."""
    server = MCPServer("reflect", instructions=INSTRUCTIONS)

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


def serve(api: str | None, user: str | None, transport: str, host: str, port: int) -> int:
    """Run until stopped: stdio for a client that launches it, streamable HTTP at http://host:port/mcp."""
    import logging

    # httpx logs every request at INFO, user ids in its URLs: not for an MCP client's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    server = build(Sessions(api, user))
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=host, port=port)
    return 0
