"""The static embedder: MiniLM's token vectors, built once from the wheel's model, mean-pooled."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from switchyard.classifier.embedder import STATIC_MINILM, StaticEmbedder
from switchyard.classifier.model import ArtifactError, ComplexityClassifier

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def static():
    """In the machine's cache, as `switchyard serve` and test_classifier use it: the table is built
    by whichever comes first (tens of seconds of CPU), once per machine."""
    return StaticEmbedder(num_threads=2)


def test_embeddings_are_unit_vectors_that_keep_meaning_apart(static):
    texts = [
        "What is the derivative of x squared?",
        "Differentiate the function x^2 with respect to x.",
        "Which painter made the Mona Lisa?",
        "",
    ]
    vectors = static.encode(texts)
    assert vectors.shape == (4, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors[:3], axis=1), 1.0, atol=1e-5)
    assert not vectors[3].any()  # nothing to embed
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert np.array_equal(static.encode(texts[:1]), vectors[:1])


def test_the_table_is_built_once_and_read_back(static, tmp_path_factory):
    static.encode(["warm"])
    # the folder is the machine's: `switchyard eval` keeps its prompts' embeddings beside the table
    assert (static._cache_dir / StaticEmbedder.TABLE_FILE).is_file()
    again = StaticEmbedder(cache_dir=static._cache_dir)
    assert np.array_equal(again.encode(["the same text"]), static.encode(["the same text"]))


def test_an_artifact_loads_the_embedder_it_was_trained_with(tmp_path):
    from sklearn.dummy import DummyClassifier

    head = DummyClassifier(strategy="prior").fit(np.zeros((4, 1)), [0, 1, 1, 0])
    classifier = ComplexityClassifier(head=head, metadata={"embedding_model": STATIC_MINILM, "libraries": {}})
    classifier.save(tmp_path)
    metadata = orjson.loads((tmp_path / "metadata.json").read_bytes())
    import sklearn

    metadata["libraries"] = {"scikit-learn": sklearn.__version__}
    (tmp_path / "metadata.json").write_bytes(orjson.dumps(metadata))
    assert isinstance(ComplexityClassifier.load(tmp_path).embedder, StaticEmbedder)
    metadata["embedding_model"] = "word2vec"
    (tmp_path / "metadata.json").write_bytes(orjson.dumps(metadata))
    with pytest.raises(ArtifactError, match="word2vec"):
        ComplexityClassifier.load(tmp_path)
