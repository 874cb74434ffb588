"""Optimize a Qdrant Edge shard, as a child process of the one that owns it.

    python -m processors.optimize_shard PATH DIM lexical|dense

Edge's `optimize` holds the GIL for its whole run, so the worker runs it here
(EdgeView.optimize) while its own threads go on.
"""

from __future__ import annotations

import sys


def optimize(path: str, dim: int, lexical: bool) -> None:
    import qdrant_edge as q

    from processors.view import edge_config

    shard = q.EdgeShard.load(path, edge_config(dim, lexical))
    try:
        shard.optimize()
        shard.flush()
    finally:
        shard.close()


if __name__ == "__main__":
    optimize(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "lexical")
