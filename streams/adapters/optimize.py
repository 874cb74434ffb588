"""Optimize a Qdrant Edge shard, as a child process of the one that owns it.

    python -m streams.adapters.optimize PATH DIM lexical|dense

Edge's `optimize` holds the GIL for its whole run, so the worker runs it here
(EdgeView.optimize) while its own threads go on.
"""

from __future__ import annotations

import sys


def optimize(path: str, dim: int, lexical: bool) -> None:
    import qdrant_edge as q

    from streams.adapters.view.edge import edge_config

    shard = q.EdgeShard.load(path, edge_config(dim, lexical))
    try:
        shard.optimize()
        shard.flush()
    finally:
        shard.close()


def die_with_parent() -> None:
    """A worker killed outright (SIGKILL) takes this child with it, rather than
    leave it optimizing a successor no one will swap in (Linux only)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


if __name__ == "__main__":
    die_with_parent()
    optimize(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "lexical")
