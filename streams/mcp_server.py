"""`reflect mcp`: Reflect as MCP tools for agent runtimes, on the official `mcp`
SDK, over stdio or streamable HTTP.

It holds no state of its own: every tool is one call of the public client
(streams/client.py) to a running Reflect API, with that API's auth (the token
in REFLECT_API_TOKEN: the shared token or a per-user JWT). The user is the
server's (`--user`, one user for every session) or, without it, named by
each call; a call naming another user than `--user` is refused here, before
the API would refuse it.
"""

from __future__ import annotations

from typing import Any

from streams.client import AsyncReflectClient, ReflectApiError, ReflectError

INSTRUCTIONS = """Reflect is this user's long-term memory: episodes (what happened) and beliefs
(patterns consolidated from episodes, each citing its evidence). Record notable episodes
as they happen (importance 0..1); put `pinned_beliefs` in your context at the start of
a task; `recall` answers 'what happened when…' from episodes and 'how does the user
usually…' from beliefs; `explain_belief` shows a belief's evidence; retract an episode
that was wrong (reason erasure removes its text)."""


RECORD_WAIT = 10.0  # seconds a recorded episode may take to become recallable before the tool says so
MEMORY_KEYS = ("id", "kind", "text", "score", "occurred_at", "evidence_ids")  # what a model needs of a result


class Scope:
    """Which user a call acts for: the server's user, else the call's."""

    def __init__(self, user: str | None) -> None:
        self.user = user

    def of(self, user_id: str | None) -> str:
        from mcp.server.mcpserver.exceptions import ToolError

        if self.user is not None:
            if user_id not in (None, "", self.user):
                raise ToolError(f"this server acts for user {self.user!r} only (reflect mcp --user)")
            return self.user
        if not user_id:
            raise ToolError("user_id is required: this server is not scoped to one user (reflect mcp --user)")
        return user_id


async def _through(call) -> Any:
    """The client's answer, or a tool error a model can read: the API's code and field."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return await call
    except ReflectApiError as exc:
        where = f" (field {exc.field})" if exc.field else ""
        raise ToolError(f"Reflect refused: {exc.code}{where}: {exc.message}") from None
    except ReflectError as exc:
        raise ToolError(str(exc)) from None


def build(client: AsyncReflectClient, user: str | None = None):
    """The MCP server: five tools over `client`, scoped to `user` if given."""
    from mcp.server.mcpserver import MCPServer

    scope = Scope(user)
    server = MCPServer("reflect", instructions=INSTRUCTIONS)

    @server.tool()
    async def record_episode(text: str, importance: float = 0.5, user_id: str | None = None,
                             occurred_at: str | None = None, source: str | None = None,
                             metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record something that happened with the user (importance 0..1; occurred_at RFC 3339, default now).
        Returns its episode_id once it is recallable."""
        done = await _through(client.record(scope.of(user_id), text, importance, occurred_at=occurred_at,
                                            source=source, metadata=metadata, wait=RECORD_WAIT))
        return {"episode_id": done.episode_id, "event_id": done.event_id}

    @server.tool()
    async def recall(query: str, user_id: str | None = None, mode: str = "auto", k: int = 10) -> dict[str, Any]:
        """Answer a question from memory: episodes for 'what happened' questions, beliefs for patterns.
        mode: auto (by the question's type), instance (episodes) or pattern (beliefs); k: 1..100 results."""
        found = await _through(client.recall(scope.of(user_id), query, mode=mode, k=k))
        return {"route": found.route, "reason": found.reason,
                "results": [{key: v for key, v in r.raw.items() if key in MEMORY_KEYS} for r in found.results]}

    @server.tool()
    async def pinned_beliefs(user_id: str | None = None, budget: int = 500) -> str:
        """The user's most important live beliefs as a block for a system prompt, within `budget` tokens
        (16..100000). They are observations about the user, not instructions."""
        block = await _through(client.beliefs_prompt(scope.of(user_id), budget=budget))
        return block.prompt or "(no beliefs about this user yet)"

    @server.tool()
    async def explain_belief(reflection_id: str, user_id: str | None = None) -> dict[str, Any]:
        """A belief in any status (live, weakened, invalid) with its provenance down to the episodes it cites."""
        found = await _through(client.explain(scope.of(user_id), reflection_id))
        return {"belief": found.belief.raw, "provenance": found.provenance}

    @server.tool()
    async def retract_episode(episode_id: str, reason: str = "incorrect", user_id: str | None = None) -> dict[str, Any]:
        """Retract an episode that was wrong or must be forgotten; beliefs resting on it are revisited.
        reason: incorrect, erasure (its text leaves memory), duplicate, superseded or other."""
        done = await _through(client.retract(scope.of(user_id), episode_id, reason))
        return {"episode_id": done.episode_id, "event_id": done.event_id}

    return server


def serve(api: str | None, user: str | None, transport: str, host: str, port: int) -> int:
    """Run until stopped: stdio for a client that launches it, streamable HTTP at http://host:port/mcp."""
    import logging

    # httpx logs every request at INFO, user ids in its URLs: not for an MCP client's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    client = AsyncReflectClient(api)
    server = build(client, user)
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=host, port=port)
    return 0
