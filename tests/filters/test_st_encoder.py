"""The sentence-transformers embedding backend: a model folder as SentenceTransformer.save
writes it (modules.json, the Pooling module's config, sentence_bert_config.json, the
tokenizer, its ONNX export under onnx/), here a tiny one the test builds (a token table as
one Gather node, a word-level tokenizer that adds [CLS] and [SEP]); run through onnxruntime,
no torch. Skipped where onnxruntime is not installed."""

from __future__ import annotations

import json

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from filters import embeddings  # noqa: E402
from pipeline import config  # noqa: E402
from pipeline.config import checks  # noqa: E402
from tests.conftest import write_yaml  # noqa: E402

WORDS = ["[UNK]", "[CLS]", "[SEP]", "court", "judge", "verdict", "oven", "flour", "sugar", "bake", "the"]
DIM = 6
CLS, SEP = 1, 2


def _folder(root, name: str, pooling: dict, modules_extra: list | None = None, export: bool = True, max_seq: int = 4):
    from onnx import TensorProto, helper, numpy_helper
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    d = root / name
    (d / "1_Pooling").mkdir(parents=True)
    table = np.random.default_rng(1).normal(size=(len(WORDS), DIM)).astype(np.float32)
    if export:
        (d / "onnx").mkdir()
        graph = helper.make_graph(
            [helper.make_node("Gather", ["table", "input_ids"], ["token_embeddings"])], "tiny",
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
             helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
            [helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT, ["batch", "seq", DIM])],
            [numpy_helper.from_array(table, "table")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        onnx.save(model, str(d / "onnx" / "model.onnx"))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)])
    tok.save(str(d / "tokenizer.json"))
    mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            *(modules_extra or []),
            {"idx": 9, "name": "9", "path": "9_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (d / "modules.json").write_text(json.dumps(mods))
    (d / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": DIM, **pooling}))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq, "do_lower_case": False}))
    return d, table


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return np.divide(v, n, out=np.zeros_like(v), where=n > 0)


def test_a_folder_is_run_as_its_modules_say_mean_pooled_and_truncated_with_its_specials(tmp_path):
    d, table = _folder(tmp_path, "mean-st", {"pooling_mode_mean_tokens": True})
    assert embeddings.resolve(str(d)) == ("sentence-transformers", str(d))
    texts = ["the judge", "oven flour sugar bake bake", "", "court"]
    got = embeddings.embed(str(d), texts, max_tokens=512)
    # max_seq_length 4 with [CLS] and [SEP] kept: two words of the second text
    ids = [[CLS, 10, 4, SEP], [CLS, 6, 7, SEP], [CLS, SEP], [CLS, 3, SEP]]
    want = _unit(np.array([table[i].mean(axis=0) for i in ids], np.float32))
    assert got.shape == (4, DIM) and np.abs(got - want).max() < 1e-6
    # max_tokens below the folder's own cap wins
    got3 = embeddings.embed(str(d), ["oven flour sugar"], max_tokens=3)
    assert np.abs(got3 - _unit(table[[CLS, 6, SEP]].mean(axis=0, keepdims=True))).max() < 1e-6
    ident = embeddings.identity(str(d))
    assert ident["backend"] == "sentence-transformers" and ident["dim"] == DIM and ident["model"] == "mean-st"
    assert {"modules.json", "1_Pooling/config.json", "onnx/model.onnx", "tokenizer.json"} <= set(ident["files"])


def test_several_pooling_modes_are_concatenated_in_the_librarys_order(tmp_path):
    d, table = _folder(tmp_path, "cls-max-st", {"pooling_mode_cls_token": True, "pooling_mode_max_tokens": True})
    got = embeddings.embed(str(d), ["court oven"], max_tokens=512)
    rows = table[[CLS, 3, 6, SEP]]
    want = _unit(np.concatenate([table[CLS], rows.max(axis=0)])[None, :])
    assert got.shape == (1, 2 * DIM) and np.abs(got - want).max() < 1e-6
    assert embeddings.identity(str(d))["dim"] == 2 * DIM


def test_a_module_it_cannot_run_or_a_missing_export_is_an_error_saying_what_to_do(tmp_path):
    d, _ = _folder(tmp_path, "dense-st", {"pooling_mode_mean_tokens": True},
                   modules_extra=[{"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}])
    with pytest.raises(ValueError, match=r"module 2 \(sentence_transformers.models.Dense\).*pip install 'curate\[sentence-transformers\]'"):
        embeddings.embed(str(d), ["court"])
    w, _ = _folder(tmp_path, "weighted-st", {"pooling_mode_weightedmean_tokens": True})
    with pytest.raises(ValueError, match="weightedmean_tokens"):
        embeddings.embed(str(w), ["court"])
    import importlib.util

    if importlib.util.find_spec("sentence_transformers") is None:  # with the library, the folder would load through it
        n, _ = _folder(tmp_path, "no-export-st", {"pooling_mode_mean_tokens": True}, export=False)
        with pytest.raises(ImportError, match=r"no ONNX export.*backend='onnx'"):
            embeddings.embed(str(n), ["court"])


def test_the_config_takes_a_sentence_transformers_folder_relative_to_the_yaml(tmp_path):
    d, _ = _folder(tmp_path, "st-model", {"pooling_mode_mean_tokens": True})
    (tmp_path / "p.jsonl").write_text('{"id": "a", "text": "x"}\n')
    y = write_yaml(tmp_path / "m.yaml", f"""
        name: t
        sources:
          p: {{paths: ["{tmp_path}/p.jsonl"], id_field: id}}
        dedup:
          semantic: {{model: ./st-model}}
    """)
    lm = config.load(y)
    assert lm.mixture.dedup.semantic.model == str(d)
    assert checks.check_embedding_folders(lm) == []  # no model.onnx at its root: still a model


def test_modules_json_types_are_matched_by_their_whole_path(tmp_path):
    """Issue 51, item 11: a module typed `anypkg.Transformer` is refused (the library would import
    anypkg), with the file and what is accepted named; only sentence_transformers' own paths run."""
    d, _ = _folder(tmp_path, "foreign-st", {"pooling_mode_mean_tokens": True})
    mods = json.loads((d / "modules.json").read_text())
    mods[0]["type"] = "anypkg.Transformer"
    (d / "modules.json").write_text(json.dumps(mods))
    with pytest.raises(ValueError, match=r"modules.json: module '0' has type 'anypkg.Transformer'.*never names code"):
        embeddings.embed(str(d), ["court"])
