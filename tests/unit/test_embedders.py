import numpy as np

from processors.embedders import HashingEmbedder


def test_hashing_embedder_is_deterministic_normalized_and_somewhat_semantic():
    e = HashingEmbedder()
    texts = ["the deploy failed on auth", "The deploy failed on AUTH!", "lunch was pasta", "", "!!!"]
    a, b = e.embed(texts), HashingEmbedder().embed(texts)
    assert a.shape == (5, 384) and a.dtype == np.float32
    assert np.array_equal(a, b)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert a[0] @ a[1] > 0.99 and a[0] @ a[2] < 0.3
