"""The default embedder, behind the embedder port (processors/ports.py).

It is a deterministic feature-hashing embedder: no network, no model
download, 25–30k texts/s on 2 cores, but weak semantics (9/30 paraphrases
found where MiniLM finds 29/30), so it serves plumbing, not belief quality.
"""

from __future__ import annotations

import re
import zlib
from typing import Sequence

import numpy as np

from processors.ports import Embedder

_TOKEN = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder:
    """Signed feature hashing of word unigrams and bigrams (crc32: stable across runs,
    unlike Python's salted hash())."""

    name = "hashing"
    batch_exact = True  # a text's vector is its own, whatever else is embedded with it

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim

    def _features(self, text: str) -> list[int]:
        words = _TOKEN.findall(text.lower())
        grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
        return [zlib.crc32(g.encode("utf-8", "surrogatepass")) for g in grams]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            hashes = np.fromiter(self._features(text), dtype=np.uint32)
            if hashes.size == 0:
                out[row, 0] = 1.0  # a text with no words still needs a valid direction
                continue
            signs = np.where(hashes & 0x80000000, -1.0, 1.0).astype(np.float32)
            np.add.at(out[row], hashes % self.dim, signs)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out /= np.where(norms == 0, 1.0, norms)
        zero = norms[:, 0] == 0
        out[zero, 0] = 1.0  # every feature cancelled out: same fallback as above
        return out


class Precomputed:
    """An embedder whose vectors for some texts were computed ahead (while the
    previous batch was handled); the other texts it embeds as it is asked."""

    def __init__(self, embedder: Embedder, vectors: dict[str, np.ndarray]) -> None:
        self.embedder, self.vectors, self.dim, self.name = embedder, dict(vectors), embedder.dim, embedder.name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if missing:
            self.vectors.update(zip(missing, self.embedder.embed(missing)))
        return np.stack([self.vectors[t] for t in texts]) if texts else self.embedder.embed(texts)


EMBEDDERS = ("hashing", "minilm", "e5-small")

# The hybrid score (cosine + BM25 share, boosted: processors/retrieval.py) a
# belief needs to answer a pattern question, per embedder (REFLECT_RECALL_MIN_SCORE
# overrides). Cosines are not comparable across models: e5's unrelated texts
# sit near 0.7 where MiniLM's sit near 0.1 (processors/README.md, "Embedders").
RECALL_MIN_SCORE = {"hashing": 0.3, "minilm": 0.3, "e5-small": 0.96}
