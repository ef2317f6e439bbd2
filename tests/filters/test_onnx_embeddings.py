"""The onnx embedding backend: a local folder with model.onnx and tokenizer.json (a user's
export of a sentence encoder), here a tiny model the test builds (a token embedding table
as one Gather node) and a word-level tokenizer; skipped where onnxruntime is not installed."""

from __future__ import annotations

import re

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from filters import classifiers, embeddings  # noqa: E402
from filters.embedding_family import EmbeddingParams  # noqa: E402
from pipeline import config  # noqa: E402
from pipeline.config import checks  # noqa: E402
from tests.conftest import write_yaml  # noqa: E402

WORDS = ["[UNK]", "court", "judge", "verdict", "appeal", "oven", "flour", "sugar", "bake", "the", "a"]
DIM = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from onnx import TensorProto, helper, numpy_helper
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path_factory.mktemp("tiny") / "tiny-encoder"
    d.mkdir()
    rng = np.random.default_rng(0)
    table = rng.normal(size=(len(WORDS), DIM)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["last_hidden_state"])], "tiny",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", DIM])],
        [numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(d / "model.onnx"))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    return d, table


def test_a_local_onnx_model_gives_mean_pooled_unit_vectors_of_its_token_outputs(folder):
    d, table = folder
    texts = ["the judge", "oven flour sugar bake bake", "", "court court court court verdict"]
    got = embeddings.embed(str(d), texts, max_tokens=4)
    ids = [[9, 2], [5, 6, 7, 8], [], [1, 1, 1, 1]]  # the last text cut at 4 tokens
    want = np.array([table[i].mean(axis=0) if i else np.zeros(DIM) for i in ids], np.float32)
    n = np.linalg.norm(want, axis=1, keepdims=True)
    want = np.divide(want, n, out=np.zeros_like(want), where=n > 0)
    assert got.shape == (4, DIM) and np.abs(got - want).max() < 1e-6
    ident = embeddings.identity(str(d))
    assert ident["backend"] == "onnx" and ident["model"] == "tiny-encoder" and ident["dim"] == DIM
    assert set(ident["files"]) == {"model.onnx", "tokenizer.json"}


def test_a_probe_trains_on_a_local_model_and_the_config_resolves_its_folder(folder, tmp_path):
    d, _ = folder
    fam = classifiers.family("embedding")
    ex = [("__label__hq" if i % 2 else "negative", "court judge verdict appeal" if i % 2 else "oven flour sugar bake")
          for i in range(40)]
    params = EmbeddingParams(model=str(d), positive=["p"], negative=["n"]).model_dump(mode="json")
    model = fam.train(ex, params, 0, tmp_path / "probe.json")
    assert model["embedding"]["ref"] == str(d)
    s = fam.score(fam.load(str(tmp_path / "probe.json")), ["court judge verdict", "oven flour sugar"], "__label__hq", {})
    assert s[0] > 0.5 > s[1]
    (tmp_path / "p.jsonl").write_text('{"id": "a", "text": "x"}\n')
    rel = write_yaml(d.parent / "m.yaml", f"""
        name: t
        sources:
          p: {{paths: ["{tmp_path}/p.jsonl"], id_field: id}}
        dedup:
          semantic: {{model: ./tiny-encoder}}
    """)
    assert config.load(rel).mixture.dedup.semantic.model == str(d)  # relative to the YAML file
    bad = write_yaml(tmp_path / "b.yaml", rel.read_text().replace("./tiny-encoder", "./nothing-here"))
    problems = checks.environment(config.load(bad))
    assert len(problems) == 1 and re.search(r"b.yaml:5: dedup.semantic.model: .*/nothing-here: no model.onnx or "
                                            r"tokenizer.json there", problems[0])


def test_a_model_folder_enters_step_hashes_by_its_files_not_its_place(folder, tmp_path):
    import shutil

    from pipeline.plan.code import portable

    d, _ = folder
    moved = shutil.copytree(d, tmp_path / "elsewhere")
    assert portable({"model": str(d), "c": 1}) == portable({"model": str(moved), "c": 1})
    assert portable({"model": str(d)})["model"].startswith("onnx:model.onnx=")
    (moved / "tokenizer.json").write_text((moved / "tokenizer.json").read_text().replace('"bake"', '"cake"'))
    embeddings.identity.cache_clear()
    assert portable({"model": str(d)}) != portable({"model": str(moved)})  # other bytes, another hash
    assert portable({"model": "wordllama"}) == {"model": "wordllama"}


def test_external_weights_are_in_the_identity_and_onnxruntime_in_the_versions(folder, tmp_path):
    """Issue 51, item 10: weights in `model.onnx_data` (ONNX external data) name the model too:
    other bytes there, another identity, so a probe trained on the old weights fails its check.
    The step records onnxruntime's version."""
    import shutil

    from filters.st_encoder import SentenceTransformersBackend

    d, _ = folder
    moved = shutil.copytree(d, tmp_path / "external")
    (moved / "model.onnx_data").write_bytes(b"\0" * 64)
    embeddings.identity.cache_clear()
    a = embeddings.identity(str(moved))
    assert "model.onnx_data" in a["files"]
    (moved / "model.onnx_data").write_bytes(b"\1" * 64)
    embeddings.identity.cache_clear()
    assert embeddings.identity(str(moved))["files"] != a["files"]
    assert "onnxruntime" in embeddings.BACKENDS.get("onnx").libraries
    assert {"onnxruntime", "sentence_transformers"} <= set(SentenceTransformersBackend.libraries)
