"""A learned router: is a question about one event (instance) or a habit (pattern)?

Logistic regression over the question's embedding plus the regex cues of
`cues.classify` as extra features, trained on a labeled set kept as data
(processors/data/router_queries.tsv). Pure numpy, deterministic (full-batch
gradient descent from zeros). When the model is unsure, the caller answers
both ways ranked together, so a wrong guess costs no recall.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from processors.cues import GENERAL, INSTANCE_CUES, PATTERN_CUES, cues_in

DATA = Path(__file__).resolve().parent / "data" / "router_queries.tsv"
UNSURE = 0.2  # |p(pattern) − 0.5| below this: answer both ways


def labeled(path: Path = DATA) -> list[tuple[str, str]]:
    rows = [line.rstrip("\n").split("\t") for line in path.read_text().splitlines()
            if line and not line.startswith("#")]
    return [(label, text) for label, text in rows]


def cue_features(questions: Sequence[str]) -> np.ndarray:
    """The regex cues' weights (instance, pattern) and the general-question flag, scaled to ~0..1."""
    rows = []
    for q in questions:
        text = q.lower()
        rows.append([sum(w for _, w in cues_in(text, INSTANCE_CUES)) / 4,
                     sum(w for _, w in cues_in(text, PATTERN_CUES)) / 4,
                     1.0 if GENERAL.search(text) else 0.0])
    return np.asarray(rows, dtype=np.float32)


@dataclass(frozen=True)
class Router:
    weights: np.ndarray
    bias: float

    def p_pattern(self, features: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-(features @ self.weights + self.bias)))


def features(embedder, questions: Sequence[str], vectors=None) -> np.ndarray:
    vectors = embedder.embed(list(questions)) if vectors is None else np.atleast_2d(vectors)
    return np.hstack([vectors, cue_features(questions)])


def train(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 600, rate: float = 2.0) -> Router:
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(x @ w + b)))
        w -= rate * (x.T @ (p - y) / len(y) + l2 * w)
        b -= rate * float(np.mean(p - y))
    return Router(w, b)


_TRAINED: dict[tuple[str, int], Router] = {}
_TRAINING = threading.Lock()


def trained(embedder) -> Router:
    """The router for this embedder, trained on first use (a second or so with
    MiniLM; the worker does it at start). Keyed by the embedder's name and
    dimension: embedders are deterministic, so one of each kind is enough."""
    key = (embedder.name, embedder.dim)
    with _TRAINING:
        if key not in _TRAINED:
            rows = labeled()
            _TRAINED[key] = train(features(embedder, [q for q, _ in rows]),
                                  np.array([r == "pattern" for _, r in rows], dtype=float))
        return _TRAINED[key]


def route(embedder, question: str, vector=None) -> tuple[str, str]:
    """("instance" | "pattern" | "both", why)."""
    p = float(trained(embedder).p_pattern(features(embedder, [question], vector))[0])
    if abs(p - 0.5) < UNSURE:
        return "both", f"router unsure (p(pattern) {p:.2f}): both ways, ranked together"
    kind = "pattern" if p > 0.5 else "instance"
    return kind, f"router: {kind} (p(pattern) {p:.2f})"


def accuracy(router: Router, x: np.ndarray, labels: Sequence[str]) -> float:
    guess = np.where(router.p_pattern(x) > 0.5, "pattern", "instance")
    return float(np.mean(guess == np.asarray(labels)))


