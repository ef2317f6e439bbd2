"""Issue 51, item 2: a model that gives a NaN vector for one text (an fp16 or quantised ONNX
export overflowing). The embed step refuses the shard naming the document; k-means and
semantic dedup refuse a non-finite vector written otherwise, instead of putting every
document in cluster 0 or keeping exact copies."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filters import embeddings
from pipeline.engine.step import ShardOutput
from pipeline.errors import InputError
from pipeline.shards import kmeans
from pipeline.steps import embed

DIM = 4


class NanOnOverflow(embeddings.EmbeddingBackend):
    """A test backend: a unit vector a text, NaN for a text holding 'overflow'."""

    def load(self, folder):
        return None

    def identity(self, model):
        return {"backend": "nan-on-overflow", "model": "nan-on-overflow", "dim": DIM, "files": {}}

    def embed(self, handle, texts, max_tokens):
        v = np.tile(np.eye(DIM, dtype=np.float32)[0], (len(texts), 1))
        for i, t in enumerate(texts):
            if "overflow" in t:
                v[i] = np.nan
        return v


@pytest.fixture
def nan_backend():
    """The test backend, registered for the test only (other tests list the registry)."""
    embeddings.register_backend("nan-on-overflow", version="1")(NanOnOverflow)
    embeddings.backend.cache_clear()
    yield
    embeddings.BACKENDS.types.pop("nan-on-overflow", None)
    embeddings.backend.cache_clear()
    embeddings.loaded.cache_clear() if hasattr(embeddings.loaded, "cache_clear") else None


def test_the_embed_step_names_the_document_whose_vector_is_not_finite(tmp_path, nan_backend):
    docs = tmp_path / "part-00000.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["fine", "an overflow here", "fine too"]}), docs)
    with pytest.raises(embeddings.NonFiniteEmbedding) as e:
        embeddings.embed("nan-on-overflow", ["x", "overflow"])
    assert e.value.rows == [1]
    spec = {"doc": {"documents": str(docs), "layers": [], "source": "web", "part": 0},
            "embedding": {"model": "nan-on-overflow", "dim": DIM, "max_tokens": 64}}
    with pytest.raises(InputError, match=r"part-00000.parquet: document\(s\) b \(row 1\): .*non-finite.*float32 export"):
        embed.embed_shard(spec, ShardOutput(str(tmp_path / "out"), 0))
    assert not list((tmp_path / "out").rglob("*.parquet"))  # nothing written for the shard


def test_k_means_and_semantic_dedup_refuse_a_non_finite_vector():
    x = np.eye(DIM, dtype=np.float16)
    x[2] = np.nan
    col = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), DIM)
    with pytest.raises(ValueError, match="non-finite embedding"):
        kmeans.vectors(col)


def test_semantic_dedup_reads_no_non_finite_vector(tmp_path):
    docs = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"]}), docs)
    x = np.eye(DIM, dtype=np.float16)[:2].copy()
    x[1] = np.inf
    emb = tmp_path / "emb.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "embedding": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), DIM)}), emb)
    with pytest.raises(ValueError, match="document 'b' has a non-finite embedding"):
        kmeans.kept({"documents": str(docs), "layers": []}, str(emb))
