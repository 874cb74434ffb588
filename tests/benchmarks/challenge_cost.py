"""What the contradiction gate costs on the demo history (streams/cli/sample.py):
challenge cycles per 1,000 episodes, beside the threshold cycles of the same
run, and the verdicts. The worker's own pipelines run in-process over the
real Qdrant Edge view (tests/support/memory_worker.py) with the offline reasoner and
the default settings (threshold 15, min_episodes 50, quorum 3, 20 a day).

    python tests/benchmarks/challenge_cost.py                 # hashing embedder
    python tests/benchmarks/challenge_cost.py --embedder minilm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

# The checkout this file is in, then tests/ (support): run from any directory.
sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]


def measure(embedder_name: str = "hashing", seed: int = 7, episodes: int = 2100, **overrides) -> dict:
    from processors.embedders import HashingEmbedder
    from processors.reasoners import OfflineReasoner
    from streams.adapters.view.edge import EdgeView
    from streams.adapters.view.shared import SharedView
    from schemas import ChallengeRequested, ReflectionChallenged, ReflectionCycleCompleted, ReflectionRequested
    from streams.cli.sample import history
    from streams.producer import make_episode
    from streams.settings import Settings
    from streams.worker.pipeline.policy import Backoff
    from support.memory_worker import MemoryWorker, memory_runtime

    hist = history(seed=seed, episodes=episodes)
    events = [make_episode(hist.user_id, e.text, e.importance, episode_id=e.episode_id, occurred_at=e.occurred_at)
              for e in hist.episodes]

    async def go():
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings.load(env={}, data_dir=tmp, embedder=embedder_name, **{"challenge": "on", **overrides})
            if embedder_name == "minilm":
                from streams.adapters.minilm import MiniLMEmbedder
                embedder = MiniLMEmbedder()
            else:
                embedder = HashingEmbedder()
            view = SharedView(EdgeView(settings.view_dir, settings.view, embedder.dim))
            runtime = memory_runtime(settings, view, embedder, OfflineReasoner(), Backoff(0.001, 0.01))
            started = time.perf_counter()
            await MemoryWorker(runtime).run(events, timeout=1800)
            seconds = time.perf_counter() - started
            requests, reflections = runtime.outlets.requests.events(), runtime.outlets.reflections.events()
            beliefs = Counter(p.get("status") for _, p in view.scroll(hist.user_id, kind="reflection"))
            view.close()
            return settings, requests, reflections, beliefs, seconds

    settings, requests, reflections, beliefs, seconds = asyncio.run(go())
    challenges = [r for r in requests if isinstance(r, ChallengeRequested)]
    verdicts = [e for e in reflections if isinstance(e, ReflectionChallenged)]
    return {
        "episodes": len(events), "embedder": embedder_name, "gate_min_score": settings.challenge_min_score,
        "quorum": settings.challenge_quorum, "daily": settings.challenge_daily,
        "cycles": sum(isinstance(r, ReflectionRequested) for r in requests),
        "cycles_completed": sum(isinstance(e, ReflectionCycleCompleted) for e in reflections),
        "challenge_cycles": len(challenges),
        "challenge_cycles_per_1000_episodes": round(1000 * len(challenges) / len(events), 1),
        "challengers_per_challenge": round(sum(len(c.challenger_ids) for c in challenges) / max(1, len(challenges)), 2),
        "outcomes": dict(Counter(e.outcome for e in verdicts)),
        "verdicts": dict(Counter(e.verdict for e in verdicts if e.verdict)),
        "beliefs_by_status": dict(beliefs), "seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedder", choices=("hashing", "minilm"), default="hashing")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=2100)
    parser.add_argument("--quorum", type=int, default=None)
    parser.add_argument("--daily", type=int, default=None)
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("challenge_quorum", args.quorum), ("challenge_daily", args.daily)) if v}
    print(json.dumps(measure(args.embedder, args.seed, args.episodes, **overrides), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
