"""What a user's last reflection cycle made, or why it made nothing, for
`GET …/stats` (a manual cycle answers 202 before it runs: its outcome is told
there, and in full by its ReflectionCycleCompleted on the reflections topic)."""

from __future__ import annotations

from collections import Counter
from typing import Any


def nothing_reason(completed) -> str:
    """Why a cycle created and reinforced no belief, in a sentence."""
    if completed.outcome == "refused":  # the guard's own words: a budget or the breaker
        return f"the cycle was refused: {completed.error}"
    if completed.outcome in ("failed", "unavailable"):
        # The error's kind only: its message may quote the model, whose answer rests on episodes an
        # erasure must reach, and this note outlives them in a changelog (the log has it, sealed).
        return f"the cycle was {completed.outcome}: {str(completed.error).split(':', 1)[0]}"
    if not completed.questions:
        return "its window held nothing to ask about: too few episodes since the user's last cycle"
    if completed.dropped:
        reasons = Counter(d["reason"] for d in completed.drops).most_common(3)
        return f"every insight ({completed.dropped}) was dropped: " + "; ".join(
            f"{reason} ({n})" for reason, n in reasons)
    return "the reasoner found no insight its evidence supports"


def summary(completed) -> dict[str, Any]:
    """The stats' `last_cycle`: counts, and `why_nothing` when it made nothing."""
    made = completed.kept + (completed.reinforced or 0)
    out = {"cycle_id": completed.cycle_id, "why": completed.why, "outcome": completed.outcome,
           "created": completed.kept, "reinforced": completed.reinforced or 0, "dropped": completed.dropped}
    return out if made else {**out, "why_nothing": nothing_reason(completed)}
