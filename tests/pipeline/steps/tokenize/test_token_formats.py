"""The token-format registry (pipeline/steps/tokenize/registry.py): the built-in formats
are registered modules, and a new one is one module (docs/extending.md's toy format, this
folder's toy_token_format.py) that the tokenize stage, the manifest, the trainer config,
`verify-tokens` and `explain --token` use with no other change."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest

from pipeline import config
from pipeline.errors import UsageError
from pipeline.io import atomic
from pipeline.run import runner
from pipeline.steps.tokenize import registry
from pipeline.steps.tokenize.plan import check_formats
from pipeline.views import tokens as token_view
from tests.conftest import ROOT, small_mixture, write_yaml


def test_the_extending_doc_shows_the_toy_format_that_runs():
    doc = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert (ROOT / "tests" / "pipeline" / "steps" / "tokenize" / "toy_token_format.py").read_text() in blocks


def test_the_builtins_are_registered_and_a_miss_names_them(tmp_path, demo_corpus):
    assert [n for n in registry.names() if n != "toy"] == ["megatron", "datatrove", "memmap", "levanter"]
    assert registry.get("megatron").extensions == (".bin", ".idx") and registry.get("levanter").unit == "caches"
    assert registry.module_of("memmap") == {}  # the built-ins' specs (and hashes) name no module
    y = write_yaml(tmp_path / "m.yaml", textwrap.dedent(small_mixture(str(demo_corpus), str(tmp_path / "out")))
                   + "tokenize: {formats: [megatron, megatorn]}\n")
    with pytest.raises(UsageError, match=r"m.yaml:\d+: tokenize.formats\[1\]: 'megatorn' is not a token format; "
                                         r"registered: (toy, )?megatron, datatrove, memmap, levanter \(`curate formats`"):
        check_formats(config.load(y))


def test_a_toy_format_is_one_module(tmp_path, demo_corpus, ray_local):
    import tests.pipeline.steps.tokenize.toy_token_format as toy  # the one line: the module registers itself

    assert registry.get("toy") is toy.FORMAT

    assert registry.module_of("toy") == {"format_module": "tests.pipeline.steps.tokenize.toy_token_format"}
    y = write_yaml(tmp_path / "m.yaml", textwrap.dedent(small_mixture(str(demo_corpus), str(tmp_path / "out")))
                   + "tokenize: {formats: [toy, megatron]}\n")
    run_dir = runner.run(config.load(y), workers=2, log=lambda m: None, quiet=True)
    body = atomic.read_json(run_dir / "manifest.json")["tokenized"]["formats"]
    assert body["toy"]["dtype"] == "uint32" and body["toy"]["extensions"] == [".u32", ".lens"]
    assert body["toy"]["trainer"] == "toy-data.txt" and body["toy"]["tokens"] == body["megatron"]["tokens"] > 0
    root = run_dir / "tokenized"
    for tf, meg in zip(body["toy"]["files"], body["megatron"]["files"], strict=True):
        # the same tokens as Megatron's file of the same mixture shard, in the toy's own bytes
        u32 = np.fromfile(run_dir / f"{tf['path']}.u32", "<u4")
        assert np.array_equal(u32, np.fromfile(run_dir / f"{meg['path']}.bin", "<u2"))
        lens = [int(x) for x in (run_dir / f"{tf['path']}.lens").read_text().split()]
        assert len(lens) == tf["documents"] and sum(lens) == len(u32) == tf["tokens"]
    lines = (root / "toy" / "toy-data.txt").read_text().splitlines()
    assert [x.split()[1] for x in lines] == [str(run_dir / f"{f['path']}.u32") for f in body["toy"]["files"] if f["tokens"]]
    problems, summary = token_view.verify(run_dir, sample=20)
    assert problems == [] and summary["toy"]["tokens"] == body["toy"]["tokens"]
    first = body["toy"]["files"][0]["path"]
    at = token_view.locate(run_dir, f"{first}.u32:3")
    assert at == {**token_view.locate(run_dir, f"{body['megatron']['files'][0]['path']}.bin:3"), "file": first}
    # a broken index is the format's own check's problem
    lens_file = run_dir / f"{first}.lens"
    lens_file.unlink()  # a hard link into the step: replace it, never write through it
    lens_file.write_text("1\n")
    assert any(p == f"{first}: .lens does not tile the .u32" for p in token_view.verify(run_dir, sample=0)[0])
