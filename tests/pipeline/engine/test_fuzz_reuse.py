"""Reuse is never stale (issue 69): after an edit, an incremental run in a shared store gives
the bytes of a fresh run, every output compared (bench/fuzz_reuse.py says which).

The two stale outputs a review found, each as the edit that showed it, then the seeded
fuzzer: 20 random edits of every kind, each checked against a fresh run, then two variants run
at once in the shared store (the other 20 are in test_fuzz_reuse_more.py: the halves run in
parallel). Runs are in this process, every step inline.
"""

from __future__ import annotations

import json
import os

import pytest

from bench import fuzz_edits as fe
from bench import fuzz_reuse as fr
from pipeline.engine.step import read_markers

pytestmark = pytest.mark.e2e  # runs the pipeline (inline: no Ray)
SEED = int(os.environ.get("CURATE_FUZZ_SEED", "69"))


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    from tests.conftest import WHEEL_DIR

    return fe.Library.build(tmp_path_factory.mktemp("fuzz-lib"), WHEEL_DIR)


def _route(f: fr.Fuzz, name: str) -> dict:
    steps = json.loads((f.shared / "out" / name / "run.json").read_text())["steps"]
    return steps["mix-route"]


def test_a_tokenizer_change_gives_the_new_tokenizers_token_files(lib, tmp_path):
    """`tokenize.tokenizer` changed to a 3,000-token BPE, the run's own tokenizer left gpt2: the
    route's partial key once left out its `tokens` (the ids file's path, dropped with the layer
    counts), so the routes were linked from the gpt2 run and the token files were gpt2's."""
    f = fr.Fuzz(tmp_path, lib)
    f.first()
    f.n = 1
    assert f.check("tokenize", [(("tokenize", "tokenizer"), "bpe-a")], "tokenize.tokenizer = bpe-a") is None
    route = _route(f, "main")
    assert route["computed"] == route["shards"], route  # every route reads other ids: none linked


def test_adding_a_tokenize_section_to_a_store_that_ran_without_one(lib, tmp_path):
    """It failed with `Field "tokens" does not exist in schema` in tokens-megatron: the routes
    written without token ids were linked into a run that writes token files."""
    f = fr.Fuzz(tmp_path, lib, state=fe.apply(fe.base_state(), [(("tokenize",), None)]))
    f.first()
    f.n = 1
    assert f.check("tokenize", [(("tokenize",), {"tokenizer": None, "formats": ["megatron"], "eos": True})],
                   "a tokenize section") is None


def test_the_samples_show_an_eval_files_new_text(lib, tmp_path):
    """`against:` an eval file upper-cased: decontamination folds case, so no decision moves,
    and the samples merge (its spec named no eval file) was linked with the old text beside
    each contaminated document."""
    f = fr.Fuzz(tmp_path, lib, state=fe.apply(fe.base_state(), [(("decon",), "file")]))
    f.first()
    f.n = 1
    assert f.check("eval", [(("eval",), "upper"), (("files", "eval/he.jsonl"), "eval-upper")], "eval file upper-cased") is None
    removed = [json.loads(x) for x in (f.shared / "out" / "main" / "samples" / "code" / "removed.jsonl").read_text().splitlines()]
    items = [r["eval_item"]["text"] for r in removed if "eval_item" in r]
    assert items and all(t == t.upper() for t in items)


def test_a_file_replaced_keeping_its_size_and_mtime_is_read_again_in_content_mode(lib, tmp_path):
    """`inputs.verify: content`: the file's change time moved, so its ingest shard reads it,
    digests its bytes and, unlike the earlier shard's, computes; a file whose change time
    moved with the same bytes links its earlier shard. mtime mode never reads it again (by
    design: it is what content mode is for)."""
    f = fr.Fuzz(tmp_path, lib, state=fe.apply(fe.base_state(), [(("verify",), "content")]))
    f.first()
    f.n = 1
    assert f.check("file", [(("files", "code/part-1.jsonl"), "code-1-s@keep")], "same size and mtime") is None
    steps = json.loads((f.shared / "out" / "main" / "run.json").read_text())["steps"]
    assert (steps["ingest-code"]["computed"], steps["ingest-code"]["reused"]) == (1, 1), steps["ingest-code"]
    assert json.loads((f.shared / "out" / "main" / "run.json").read_text())["inputs_verify"] == "content"
    p = f.corpus / "code" / "part-0.jsonl"
    st = p.stat()
    p.write_bytes(p.read_bytes())  # the same bytes: its change time moves
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    f.n = 2
    assert f.check("weights", [(("mix", "w", "code"), 0.25)], "a weights edit") is None
    steps = json.loads((f.shared / "out" / "main" / "run.json").read_text())["steps"]
    ms = read_markers(f.shared / "out" / "_store" / "steps" / steps["ingest-code"]["dir"].split("/")[-1])
    assert sorted(("linked_from" in m, "reused_from" in m) for m in ms.values()) == [(False, True), (True, False)], ms
    assert all(m["read_key"].startswith("content:") for m in ms.values())


HALF = 20  # edits a half of the suite's fuzzing makes: 40 a CI run, in two files that run in parallel


def test_random_edits_and_concurrent_variants_give_the_bytes_of_a_fresh_run(lib, tmp_path):
    """Random edits, a round of every kind in a random order then more, each compared with a
    fresh run, then two variants run at once in the shared store (two `curate run` processes):
    the first half of the suite's seeded fuzzing (the second: test_fuzz_reuse_more.py; `python
    -m bench.fuzz_reuse` runs 500)."""
    check_random_edits(lib, tmp_path, SEED)


def check_random_edits(lib, tmp_path, seed: int) -> None:
    res = fr.fuzz(HALF, seed, tmp_path, None, concurrent_every=HALF, lib=lib, stop_at_first=True)
    assert res["differences"] == 0, json.dumps(res["found"], indent=1, default=str)
    assert res["edits"] == HALF and res["kinds"]["concurrent"] == 2
    assert set(res["kinds"]) == set(fe.EDITS) | {"concurrent"}  # every kind of edit at least once


def test_levanter_caches_with_a_tokenizer_json(lib, tmp_path):
    """The fuzzer's first find: a Levanter cache with a tokenizer.json put 10^30 (a Hugging
    Face tokenizer's max length when it has none) in its step's config, and every such run
    failed hashing it (`Integer exceeds 64-bit range`)."""
    f = fr.Fuzz(tmp_path, lib, state=fe.apply(fe.base_state(), [(("tokenize",), {"tokenizer": "bpe-a", "formats": ["levanter"], "eos": True})]))
    f.first()
    ledger = next((f.shared / "out" / "main" / "tokenized" / "levanter").rglob("shard_ledger.json"))
    assert json.loads(ledger.read_text())["metadata"]["preprocessor_metadata"]["max_length"] == int(1e30)
    f.n = 1
    assert f.check("tokenize", [(("tokenize", "tokenizer"), "bpe-b")], "another tokenizer.json") is None


def test_a_section_removed_removes_its_folder_from_the_run_directory(lib, tmp_path):
    """The fuzzer's second find: a mixture run again in place without its `tokenize:` (or its
    validation split) kept the earlier run's tokenized/ (validation/) in its run directory,
    files no fresh run has. Each stage declares the folders it publishes (Stage.outputs)."""
    f = fr.Fuzz(tmp_path, lib, state=fe.apply(fe.base_state(), [(("mix", "validation"), 0.1)]))
    f.first()
    run = f.shared / "out" / "main"
    assert (run / "tokenized" / "megatron").is_dir() and (run / "validation").is_dir()
    f.n = 1
    assert f.check("tokenize", [(("tokenize",), None), (("mix", "validation"), None)], "no tokenize, no validation") is None
    assert not (run / "tokenized").exists()
    assert {p.parent.name for p in (run / "validation").rglob("*.parquet")} == {"ev"}  # the eval source's items only


def test_a_levanter_validation_cache_follows_its_pieces_bytes(lib, tmp_path):
    """The fuzzer's fourth find (seed 70, edit 17): with Levanter caches, an eval file upper-cased
    changed the held-out pieces' token counts, and the validation cache's offsets chunk was
    linked with the old ends. Its spec named each piece by its stem (the path without
    `.docs.parquet`), which matched no file, and a shard's key digested it as an empty folder:
    now a chunk names the files it reads, and a path that is no file and holds none keys by
    itself."""
    f = fr.Fuzz(tmp_path, lib, state=fe.apply(fe.base_state(), [(("tokenize",), {"tokenizer": None, "formats": ["levanter"], "eos": True})]))
    f.first()
    assert (f.shared / "out" / "main" / "tokenized" / "levanter" / "validation").is_dir()
    f.n = 1
    assert f.check("eval", [(("eval",), "upper"), (("files", "eval/he.jsonl"), "eval-upper")], "eval file upper-cased") is None
