"""A view swapped under reads (a rebuild, a compaction): the episodes
published before and during the swap, and everything a reader sees, which
must be the same after it."""

from __future__ import annotations

from streams.producer import Publisher

TEXTS = ["the auth deploy failed: token {n} expired", "logs first, then retry the job {n}",
         "revert of PR {n}: auth middleware broke login", "a failing test for bug {n} before the fix"]


async def publish_rounds(settings, users, n):
    """`n` episodes of each user, round by round, from four texts."""
    async with Publisher(settings) as p:
        for i in range(n):
            for user in users:
                await p.publish_episode(user, TEXTS[i % 4].format(n=i), 0.8, episode_id=f"{user}-{i}", wait=False)
        await p.flush()


def snapshot(w, users):
    """Everything a reader can see of these users."""
    seen = {}
    for user in users:
        beliefs = [{k: v for k, v in b.items() if k != "pinned_score"}  # it decays with the clock
                   for b in w.get(f"/v1/users/{user}/beliefs?limit=1000")["beliefs"]]
        explained = [w.get(f"/v1/users/{user}/reflections/{b['reflection_id']}") for b in beliefs]
        stats = {k: v for k, v in w.stats(user).items() if k in ("episodes", "retracted", "reflections")}
        seen[user] = {"beliefs": beliefs, "explained": explained, "stats": stats,
                      "episode": w.get(f"/v1/users/{user}/episodes/{user}-3")}
    return seen
