"""Document embeddings (filters/embeddings.py) and the embedding probe family
(filters/embedding_family.py): WordLlama's shipped weights, no download, its own vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from filters import classifiers, embeddings
from filters.embedding_family import EmbeddingParams
from pipeline.errors import InputError
from tests.conftest import curate

TEXTS = [
    "The cat sat on the mat. " * 30,
    "Quantum chromodynamics is the theory of the strong interaction between quarks and gluons.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Die Katze sitzt auf der Matte und schaut aus dem Fenster.",
    "日本語のテキストです。東京は日本の首都です。",
    "BUY NOW!!! cheap pills $$$ click here click here",
    "",
]


def _wordllama():
    import wordllama
    from wordllama import WordLlama

    return WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)


def test_wordllama_vectors_are_wordllamas_own_mean_pooled_ones():
    ours = embeddings.embed("wordllama", TEXTS)
    with np.errstate(invalid="ignore"):  # WordLlama divides the empty text's zero vector by its zero norm
        theirs = np.nan_to_num(_wordllama().embed(TEXTS, norm=True))
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 256)
    assert np.abs(ours - theirs).max() < 1e-5
    assert np.allclose(np.linalg.norm(ours[:-1], axis=1), 1.0, atol=1e-5) and not ours[-1].any()  # empty: zeros


def test_max_tokens_cuts_a_document_to_its_first_tokens():
    head = "Rivers carry sediment from the mountains to the sea."
    tail = " Compilers translate source code into machine instructions." * 200
    n = len(embeddings.loaded("wordllama")[0].encode(head, add_special_tokens=False).ids)
    cut, alone, whole = embeddings.embed("wordllama", [head + tail, head, head + tail], max_tokens=n)[[0, 1]].tolist() + \
        [embeddings.embed("wordllama", [head + tail])[0].tolist()]
    assert np.allclose(cut, alone, atol=1e-6) and not np.allclose(whole, alone, atol=1e-2)


def test_batches_by_characters_give_the_same_vectors(monkeypatch):
    one = embeddings.embed("wordllama", TEXTS * 3)
    monkeypatch.setattr(embeddings, "BATCH_CHARS", 100)  # every text a batch of its own, or nearly
    assert np.array_equal(embeddings.embed("wordllama", TEXTS * 3), one)
    assert embeddings.embed("wordllama", []).shape == (0, 256)


def test_the_model_loads_once_per_process_and_names_its_files():
    embeddings.loaded("wordllama")
    before = embeddings.loaded.cache_info().hits
    embeddings.embed("wordllama", TEXTS[:2])
    embeddings.embed("wordllama", TEXTS[2:4])
    assert embeddings.loaded.cache_info().hits == before + 2 and embeddings.loaded.cache_info().currsize >= 1
    ident = embeddings.identity("wordllama")
    assert ident["dim"] == 256 and set(ident["files"]) == {"weights", "tokenizer"}
    assert all(len(h) == 64 for h in ident["files"].values())


def test_an_unknown_backend_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown embedding backend type 'bert'; known types: wordllama, onnx, sentence-transformers \(`curate embeddings`"):
        embeddings.backend("bert")
    with pytest.raises(ValidationError, match=r"unknown embedding 'bert'; known backends: wordllama, onnx, sentence-transformers"):
        EmbeddingParams(model="bert", positive=["a"], negative=["b"])
    r = curate("embeddings")
    assert r.returncode == 0 and r.stdout.startswith("wordllama (v1): WordLlama's static token embeddings")


def _examples(rng, n=60):
    topics = {"cooking": "recipe oven flour butter bake sugar dough pan simmer garlic onion salt".split(),
              "sport": "football goal match team player score league coach referee stadium season win".split(),
              "law": "court judge appeal statute contract plaintiff verdict counsel jury ruling clause".split()}
    return [(lab, " ".join(rng.choice(w, 12))) for _ in range(n) for lab, w in topics.items()]


def test_the_probe_trains_scores_and_predicts_topics_and_rewrites_the_same_bytes(tmp_path):
    fam = classifiers.family("embedding")
    params = EmbeddingParams(labels={"cooking": [], "sport": [], "law": []}).model_dump(mode="json")
    ex = _examples(np.random.default_rng(0))
    model = fam.train(ex, params, 0, tmp_path / fam.model_file)
    probe = tmp_path / "probe.json"
    assert probe.is_file() and fam.labels(str(probe)) == ["cooking", "law", "sport"]
    texts = ["Preheat the oven and whisk the eggs with the sugar.", "The striker scored twice before half time.",
             "The judge dismissed the appeal and upheld the verdict."]
    opts = fam.options(params)
    assert opts == {"embedding": "wordllama", "max_tokens": 2048, "dtype": "float16"}
    top, prob = fam.predict(model, texts, opts)
    assert top == ["cooking", "sport", "law"] and prob.dtype == np.float32 and (prob > 0.5).all()
    s = fam.score(fam.load(str(probe)), texts, "sport", opts)
    assert s.dtype == np.float32 and s[1] > 0.5 > max(s[0], s[2])
    assert fam.evaluate_topics(model, texts, ["cooking", "sport", "law"], ["cooking", "sport", "law"], opts)["accuracy"] == 1.0
    fam.train(ex, params, 0, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == probe.read_bytes()  # same sample, same seed: same bytes
    assert fam.score(model, [], "sport", opts).shape == (0,) and fam.predict(model, [], opts)[0] == []
    with pytest.raises(ValueError, match=r"the probe's classes are \['cooking', 'law', 'sport'\], not '__label__hq'"):
        fam.score(model, texts, "__label__hq", opts)


def test_a_binary_probe_separates_its_classes(tmp_path):
    fam = classifiers.family("embedding")
    params = EmbeddingParams(positive=["p"], negative=["n"]).model_dump(mode="json")
    ex = [("__label__hq" if lab == "law" else fam.negative_label, t) for lab, t in _examples(np.random.default_rng(1))]
    model = fam.train(ex, params, 0, tmp_path / fam.model_file)
    ev = fam.evaluate(model, ["The court ruled on the contract clause.", "Bake the dough in a hot oven."],
                      np.array([True, False]), "__label__hq", fam.options(params))
    assert ev["roc_auc"] == 1.0 and ev["f1"] == 1.0


def test_a_probe_of_another_embedding_or_not_a_probe_is_a_clear_error(tmp_path):
    fam = classifiers.family("embedding")
    params = EmbeddingParams(positive=["p"], negative=["n"]).model_dump(mode="json")
    ex = [("__label__hq" if lab == "law" else fam.negative_label, t) for lab, t in _examples(np.random.default_rng(2), 20)]
    fam.train(ex, params, 0, tmp_path / fam.model_file)
    raw = orjson.loads((tmp_path / "probe.json").read_bytes())
    raw["embedding"]["files"]["weights"] = "0" * 64
    (tmp_path / "other.json").write_bytes(orjson.dumps(raw))
    with pytest.raises(InputError, match=r"other.json was trained on embeddings of l2_supercat .* train it again \(remove `probe`\)"):
        fam.load(str(tmp_path / "other.json"))
    (tmp_path / "junk.json").write_bytes(b"{}")
    with pytest.raises(InputError, match=r"junk.json is not a probe of the embedding family"):
        fam.load(str(tmp_path / "junk.json"))


def test_embeddings_probes_and_heads_need_no_network(tmp_path):
    """In a network namespace with no interfaces up: WordLlama's weights come from its wheel, and
    the probe and the regression head train and score offline."""
    import subprocess
    import sys

    code = (
        "import socket\n"
        "try:\n    socket.create_connection(('pypi.org', 443), timeout=3); print('NETWORK')\n"
        "except OSError:\n    print('no network')\n"
        "from filters import classifiers, embeddings\n"
        "from filters.embedding_family import EmbeddingParams\n"
        "from filters.regression_family import RegressionParams\n"
        "print(embeddings.embed('wordllama', ['a cat', 'ein Hund']).shape)\n"
        "ex = [('__label__hq' if i % 2 else 'negative', ('court judge verdict ' if i % 2 else 'oven flour sugar ') * (i % 5 + 1))"
        " for i in range(40)]\n"
        f"p = classifiers.family('embedding').train(ex, EmbeddingParams(positive=['p'], negative=['n']).model_dump(mode='json'), 0, '{tmp_path}/probe.json')\n"
        "g = [(float(i % 5), 'word ' * (i % 5 + 1)) for i in range(40)]\n"
        f"h = classifiers.family('regression').train(g, RegressionParams(annotations='a').model_dump(mode='json'), 0, '{tmp_path}/head.json')\n"
        "print(p['classes'], h['head'])\n"
    )
    r = subprocess.run(["unshare", "-n", sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["no network", "(2, 256)", "['__label__hq', 'negative'] ridge"]


def test_an_int8_attribute_holds_half_the_bytes_and_a_head_scores_it_as_it_scores_the_text(tmp_path):
    """`dtype: int8`: the embed step writes int8 vectors with a float32 scale a row; read
    back (scaled) they are what `embeddings.stored(..., "int8")` gives, so a probe trained
    with `dtype: int8` scores the attribute exactly as it scores the texts; cosines to the
    float32 vectors stay within 0.01."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.engine.step import ShardOutput
    from pipeline.shards import kmeans
    from pipeline.steps.classify.tasks import stored_vectors
    from pipeline.steps.embed import embed_shard

    rng = np.random.default_rng(3)
    ex = _examples(rng)
    texts = [t for _, t in ex][:120] + [""]
    doc = tmp_path / "doc.parquet"
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts}), doc)
    sizes = {}
    for dtype in ("float16", "int8"):
        spec = {"doc": {"source": "s", "part": 0, "documents": str(doc), "layers": []}, "every_row": True,
                "embedding": {"model": "wordllama", "max_tokens": 2048, "dim": 256, "dtype": dtype}}
        embed_shard(spec, ShardOutput(str(tmp_path / dtype), 0))
        path = next((tmp_path / dtype).rglob("*.parquet"))
        sizes[dtype] = path.stat().st_size
    t = pq.read_table(path)
    assert t.schema.field("embedding").type == pa.list_(pa.int8(), 256) and t.schema.field("embedding_scale").type == pa.float32()
    x = stored_vectors(str(path))
    assert x.dtype == np.float32 and np.array_equal(x, embeddings.stored("wordllama", texts, 2048, "int8"))
    full = embeddings.embed("wordllama", texts)
    cos = np.einsum("ij,ij->i", kmeans.unit(x[:-1]), full[:-1])
    assert cos.min() > 0.99 and not x[-1].any()  # the empty text: the zero vector, scale 0
    col, _ = kmeans.read_vectors(str(path), float16=True)
    assert col.type == pa.list_(pa.float16(), 256)  # as the k-means steps carry it
    assert sizes["int8"] < 0.75 * sizes["float16"]
    print(f"\nint8 attribute {sizes['int8']:,} bytes against float16 {sizes['float16']:,}; cosine to float32 >= {cos.min():.5f}")
    fam = classifiers.family("embedding")
    params = EmbeddingParams(labels={"cooking": [], "sport": [], "law": []}, dtype="int8").model_dump(mode="json")
    model = fam.train(ex, params, 0, tmp_path / fam.model_file)
    opts = fam.options(params)
    assert opts["dtype"] == "int8" and model["dtype"] == "int8"
    assert np.array_equal(fam.score_vectors(model, x, "law", opts), fam.score(model, texts, "law", opts))


def test_a_head_scores_only_vectors_of_the_dtype_it_was_trained_on():
    with pytest.raises(ValueError, match=r"trained on int8 vectors, the run stores float16 ones: set the classifier's `dtype: int8`"):
        embeddings.check_dtype({"dtype": "int8"}, {"dtype": "float16"})
    embeddings.check_dtype({}, {"dtype": "float16"})  # a head from before int8: float16
    embeddings.check_dtype({"dtype": "int8"}, {})  # scored from texts without options: as trained
