"""Live reads beside a busy neighbour: what slows recall p95 during a replay
(docs/decisions/0020-side-worker-autogroup-nice-19.md).

    python tests/benchmarks/read_neighbours.py [--seed 7] [--reads 300] [--rounds 1] [--replays 2]

One worker on an embedded noida-db holds streams/cli/sample.py's history (2,100
episodes, MiniLM). Each sample: recall p95 over HTTP beside a neighbour,
against reads alone just before it.

* Synthetic neighbours (`--rounds`), started for the purpose and killed
  after: a `SCHED_IDLE` spin on two processes, a MiniLM loop, an fsync loop
  and a matrix product in the worker's session, and the spin in a session
  of its own, as it is and with its autogroup at nice 19.
* A replay's side worker (`--replays` pairs): its autogroup set back to
  nice 0 once it started, then left at nice 19 as `background` makes it
  (streams/cli/main.py); each replay runs to its end, read all along.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1]),
                str(Path(__file__).resolve().parents[2])]

from replay_lab import Reads, p95, publish, reads_alone, settings_for, settled  # noqa: E402
from streams.broker import EmbeddedBroker  # noqa: E402
from streams.cli.sample import history  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402
from suite_figures import figure, print_scenario  # noqa: E402
from support.harness import Worker, wait_for  # noqa: E402

IDLE = f"import os, sys\nsys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n" \
       "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
GROUP_19 = "open('/proc/self/autogroup', 'w').write('19')\n"
SPIN = "os.fork()\nwhile True: pass"  # two processes, one a core: as busy as a side worker's threads
# name: (the neighbour's code, whether it runs in a session of its own)
READ_FOR = 8.0  # seconds of reads beside a synthetic neighbour
NEIGHBOURS = {
    "idle spin": (IDLE + SPIN, False),
    "idle MiniLM": (IDLE + "from streams.adapters.minilm import MiniLMEmbedder\ne = MiniLMEmbedder()\n"
                    "t = ['the user wanted the logs of the failed job %d first' % i for i in range(64)]\n"
                    "while True: e.embed(t)", False),
    "idle fsync": (IDLE + "f = open(sys.argv[1], 'wb')\n"
                   "while True:\n    f.write(os.urandom(1 << 16)); f.flush(); os.fsync(f.fileno())", False),
    "idle matrix product": (IDLE + "import numpy as np\na = np.random.rand(2000, 2000).astype('float32')\n"
                            "while True: a @ a", False),
    "idle spin, own session": (IDLE + SPIN, True),
    "idle spin, own session at nice 19": (IDLE + GROUP_19 + SPIN, True),
}


def beside(worker: Worker, user: str, reads: int, neighbour) -> tuple[float, float]:
    """Recall p95 alone, then while `neighbour()` runs (it returns when its work is done)."""
    alone = p95(reads_alone(worker, user, reads))
    with Reads(worker, user) as during:
        neighbour()
    return alone, p95(during.ms)


def synthetic(code: str, own_session: bool, tmp: str):
    def run() -> None:
        # A group of its own to be killed as one (a spin's fork too); a session of its own only where
        # said: a session is an autogroup.
        neighbour = subprocess.Popen([sys.executable, "-c", code, str(Path(tmp) / "fsync.dat")],
                                     start_new_session=own_session, process_group=None if own_session else 0)
        try:
            time.sleep(READ_FOR)  # how long the neighbour runs: a duration measured, not a synchronization
        finally:
            os.killpg(neighbour.pid, signal.SIGKILL)
            neighbour.wait()
    return run


def side_worker(worker: Worker, name: str, nice: int):
    def run() -> None:
        client = worker.client
        client.start_replay(name)
        group = Path(f"/proc/{wait_for(lambda: client.replay(name).get('pid'), 60, 'its pid')}/autogroup")
        wait_for(lambda: group.read_text().strip().endswith("nice 19"), 60, "the side worker backgrounded")
        group.write_text(str(nice))
        wait_for(lambda: client.replay(name)["state"] != "running", 3600, f"replay {name}", every=0.5)
        client.drop_replay(name)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the synthetic neighbours")
    parser.add_argument("--replays", type=int, default=2, help="pairs of replays, side group at nice 0 then 19")
    args = parser.parse_args()
    figures = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(kind="noida") as broker:
        hist = history(seed=args.seed, episodes=2100)
        settings = settings_for(broker.url, Path(tmp) / "data", "minilm")
        asyncio.run(ensure_topics(settings))
        worker = Worker(settings, Path(tmp) / "worker.log", {}).start(timeout=180)
        try:
            asyncio.run(publish(settings, hist))
            wait_for(lambda: settled(worker, hist.user_id, len(hist.episodes)), 1800, "settled", every=0.5)
            samples = [(f"round {n}: beside {name}", synthetic(code, own, tmp))
                       for n in range(args.rounds) for name, (code, own) in NEIGHBOURS.items()]
            samples += [(f"pair {n}: during a replay, side group at nice {nice}",
                         side_worker(worker, f"r{n}-{nice}", nice))
                        for n in range(args.replays) for nice in (0, 19)]
            for label, neighbour in samples:
                alone, during = beside(worker, hist.user_id, args.reads, neighbour)
                figures.append(figure(f"recall p95 {label}", during, "ms", "alone just before", alone))
        finally:
            worker.stop(timeout=60)
    print_scenario(f"Reads beside a neighbour (seed {args.seed}, {args.reads} reads alone a sample)",
                   {"figures": figures, "targets": []})


if __name__ == "__main__":
    main()
