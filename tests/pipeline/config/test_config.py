"""Config errors name the file, the line, the key path, and what to do."""

from __future__ import annotations

import pytest

from pipeline import config
from pipeline.errors import UsageError
from pipeline.plan.sources import resolve_inputs
from tests.conftest import curate, write_yaml

GOOD = """
name: t
sources:
  web:
    paths: ["*.jsonl"]
    filters: [english, gopher_quality]
filters:
  english: {type: length, min_words: 3}
  gopher_quality: {type: length, max_chars: 1000}
"""


def _err(tmp_path, text) -> str:
    p = write_yaml(tmp_path / "x.yaml", text)
    with pytest.raises(UsageError) as e:
        config.load(p)
    return str(e.value).replace(str(p), "x.yaml")


def test_good_file_loads_with_defaults(tmp_path):
    lm = config.load(write_yaml(tmp_path / "x.yaml", GOOD))
    src = lm.mixture.sources["web"]
    assert src.text_field == "text" and src.on_bad_record == "quarantine" and src.id_field is None
    assert lm.mixture.filters["english"].min_words == 3
    assert lm.mixture.filters["english"].max_words is None
    assert lm.output_dir() == (tmp_path / "out" / "t").resolve()


def test_the_recorded_config_and_its_hash_carry_every_filter_parameter(tmp_path):
    a = config.load(write_yaml(tmp_path / "a.yaml", GOOD))
    b = config.load(write_yaml(tmp_path / "b.yaml", GOOD.replace("max_chars: 1000", "max_chars: 2000")))
    assert a.canonical()["filters"]["gopher_quality"] == {"type": "length", "min_chars": None, "max_chars": 1000, "min_words": None,
                                                          "max_words": None, "min_lines": None, "max_lines": None}
    assert a.config_hash() != b.config_hash()  # run.json and manifest.json tell the two runs apart


def test_unknown_key_names_line_and_allowed_keys(tmp_path):
    msg = _err(tmp_path, GOOD.replace("    paths:", "    pathz: []\n    paths:"))
    assert msg.startswith("x.yaml:4: sources.web.pathz: unknown key 'pathz'; did you mean 'paths'?; allowed keys: extract, filters, format,")


def test_unknown_filter_reference(tmp_path):
    msg = _err(tmp_path, GOOD.replace("[english, gopher_quality]", "[english, gopher_quality, gopher]"))
    assert msg == "x.yaml:5: sources.web.filters[2]: unknown filter 'gopher'; defined: english, gopher_quality"


def test_unknown_filter_type_lists_known_types(tmp_path):
    msg = _err(tmp_path, GOOD.replace("{type: length, min_words: 3}", "{type: lenght}"))
    assert msg.startswith("x.yaml:7: filters.english.type: unknown filter type 'lenght'; known types: ")
    assert "length" in msg


def test_filter_param_typo_and_bad_type(tmp_path):
    msg = _err(tmp_path, GOOD.replace("min_words: 3", "min_word: 3").replace("max_chars: 1000", "max_chars: lots"))
    assert "x.yaml:7: filters.english.min_word: unknown key 'min_word'; did you mean 'min_words'?; allowed keys: max_chars, max_lines, max_words, min_chars, min_lines, min_words, per_language, type" in msg
    assert "x.yaml:8: filters.gopher_quality.max_chars: Input should be a valid integer" in msg
    assert "(got 'lots')" in msg


def test_bad_type_in_source(tmp_path):
    msg = _err(tmp_path, GOOD.replace('paths: ["*.jsonl"]', 'paths: ["*.jsonl"]\n    max_shard_rows: -3'))
    assert msg == "x.yaml:5: sources.web.max_shard_rows: Input should be greater than or equal to 1 (got -3)"


def test_missing_required_and_every_problem_reported(tmp_path):
    msg = _err(tmp_path, "name: t\nseed: x\n")
    assert "x.yaml:1: (top level)" not in msg
    assert "sources: required key is missing" in msg
    assert "x.yaml:2: seed: Input should be a valid integer" in msg


def test_weights_must_name_sources_and_sum_to_one(tmp_path):
    msg = _err(tmp_path, GOOD + "mixture:\n  weights: {web: 0.5, code: 0.4}\n")
    assert "x.yaml:10: mixture.weights.code: code has weight 0.4 but no source named code; defined: web" in msg
    assert "x.yaml:10: mixture.weights: weights sum to 0.9, not 1; fix them or set mixture.normalize: true" in msg


def test_yaml_syntax_error_has_line(tmp_path):
    msg = _err(tmp_path, "name: t\nsources:\n  web: [a\n")
    assert msg.startswith("x.yaml:4: not valid YAML")


def test_glob_with_no_match(tmp_path):
    lm = config.load(write_yaml(tmp_path / "x.yaml", GOOD))
    with pytest.raises(UsageError) as e:
        resolve_inputs(lm)
    assert str(e.value) == f"{tmp_path / 'x.yaml'}:4: sources.web.paths[0]: '*.jsonl' matches no file (looked in {tmp_path})"


def test_directory_instead_of_files(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text('{"text": "x"}\n')
    lm = config.load(write_yaml(tmp_path / "x.yaml", GOOD.replace('"*.jsonl"', '"d"')))
    with pytest.raises(UsageError) as e:
        resolve_inputs(lm)
    assert "d is a directory; it holds a.jsonl; use a glob such as d/*.jsonl (or format: hf for a saved HF dataset)" in str(e.value).replace(str(tmp_path) + "/", "")


def test_every_contract_section_parses_and_runs(tmp_path):
    text = GOOD + """
dedup:
  exact: {}
  fuzzy: {ngram: 5, num_perm: 112, bands: 14, threshold: 0.8}
  priority: [web]
classifiers:
  wiki_vs_web: {type: fasttext, positive: [web], negative: [web]}
mixture:
  target_tokens: 1000
  weights: {web: 1.0}
samples: {kept_per_source: 5}
"""
    lm = config.load(write_yaml(tmp_path / "x.yaml", text))
    assert {"dedup", "classifiers", "mixture", "samples"} <= set(lm.canonical())  # every section parses


def test_unknown_classifier_type_names_the_key_and_lists_the_registered_types(tmp_path):
    msg = _err(tmp_path, GOOD + "classifiers:\n  q: {type: xgboost, positive: [web], negative: [web]}\n")
    assert msg == ("x.yaml:10: classifiers.q.type: unknown classifier type 'xgboost'; known types: fasttext, "
                   "embedding, regression, ensemble (`curate classifiers` lists them with their parameters)")


def test_an_embedding_classifier_names_its_embedding_and_its_probe_file(tmp_path):
    """`type: embedding`: `model` is the embedding (a backend name), `probe` a pretrained probe file."""
    msg = _err(tmp_path, GOOD + "classifiers:\n  q: {type: embedding, model: bert, positive: [web], negative: [web]}\n")
    assert msg.startswith("x.yaml:10: classifiers.q.model: unknown embedding 'bert'; known backends: wordllama")
    msg = _err(tmp_path, GOOD + "classifiers:\n  q: {type: embedding, epochs: 3, positive: [web], negative: [web]}\n")
    assert msg.startswith("x.yaml:10: classifiers.q.epochs: unknown key 'epochs'; allowed keys: c, dtype, label, labels, ")
    lm = config.load(write_yaml(tmp_path / "e.yaml", GOOD + "classifiers:\n  q: {type: embedding, positive: [web], negative: [web]}\n"))
    c = lm.mixture.classifiers["q"]
    assert (c.model, c.probe, c.pretrained, c.max_tokens) == ("wordllama", None, None, 2048)


def test_a_classifier_without_type_is_fasttext_with_every_key_of_before(tmp_path):
    lm = config.load(write_yaml(tmp_path / "x.yaml", GOOD + "classifiers:\n  q: {positive: [web], negative: [web]}\n"))
    # the classify steps hash this dump: its keys, names and defaults are those of before the registry
    assert lm.canonical()["classifiers"]["q"] == {
        "type": "fasttext", "positive": ["web"], "negative": ["web"], "labels": None, "model": None, "label": "__label__hq",
        "max_examples_per_class": 20000, "epochs": 5, "lr": 0.1, "word_ngrams": 2, "dim": 100, "min_count": 1,
        "loss": "softmax", "bucket": 200000, "lowercase": False, "seed": 0}
    msg = _err(tmp_path, GOOD + "classifiers:\n  q: {positive: [web], negative: [web], epoch: 3, dim: x}\n")
    assert msg.startswith("x.yaml:10: classifiers.q.dim: Input should be a valid integer")  # no pydantic tag in the path
    assert ("x.yaml:10: classifiers.q.epoch: unknown key 'epoch'; did you mean 'epochs'?; allowed keys: bucket, dim, "
            "epochs, label, labels, loss, lowercase, lr, max_examples_per_class, min_count, model, negative, positive, "
            "seed, type, word_ngrams") in msg


def test_dedup_errors_name_the_key(tmp_path):
    refs = GOOD + """
dedup:
  fuzzy: {num_perm: 100, bands: 14, rows: 8}
  priority: [webb]
"""
    with pytest.raises(UsageError) as e:
        config.load(write_yaml(tmp_path / "x.yaml", refs))
    msg = str(e.value)
    assert "dedup.fuzzy: bands x rows = 112 exceeds num_perm = 100" in msg
    assert "dedup.priority[0]: unknown source 'webb'; defined: web" in msg
    shape = GOOD + "dedup:\n  paragraph: {unit: sentence}\n"
    with pytest.raises(UsageError) as e:
        config.load(write_yaml(tmp_path / "y.yaml", shape))
    assert "dedup.paragraph.unit: Input should be 'paragraph' or 'line'" in str(e.value)


def test_cli_validate_exit_codes(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "hello there world"}\n')
    good = write_yaml(tmp_path / "good.yaml", GOOD)
    r = curate("validate", str(good))
    assert r.returncode == 0, r.stderr
    assert "ok (1 sources, 1 input files)" in r.stdout
    bad = write_yaml(tmp_path / "bad.yaml", GOOD.replace("gopher_quality]", "gopher]"))
    r = curate("validate", str(bad))
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: {bad}:5: sources.web.filters[1]: unknown filter 'gopher'; defined: english, gopher_quality"
    assert "Traceback" not in r.stderr


def test_nothing_read_from_inputs_or_configs_is_unpickled_or_evaluated():
    """YAML through a safe loader only; no pickle, eval or exec anywhere in the code; user
    code only through an explicit `callable:` import path (filters/adapters.py)."""
    import re

    from tests.conftest import ROOT

    offenders = []
    for p in sorted([*ROOT.glob("pipeline/**/*.py"), *ROOT.glob("filters/**/*.py")]):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\byaml\.(load|unsafe_load|full_load)\(|\bpickle\b|\bmarshal\b|(?<![\w.])(eval|exec)\(", code):
                offenders.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, offenders
    load = (ROOT / "pipeline" / "config" / "load.py").read_text()
    assert "yaml.safe_load" in load and "SafeLoader" in load


def test_negative_weights_are_refused_with_their_key(tmp_path):
    msg = _err(tmp_path, GOOD + "mixture:\n  weights: {web: 1.5, web2: -0.5}\n")
    assert "x.yaml:10: mixture.weights: weights must be >= 0; negative: web2" in msg


def test_a_filter_whose_package_is_missing_is_a_config_error_with_the_pip_line(tmp_path):
    """datatrove declares what each of its classes imports; its perplexity block needs kenlm,
    which is not installed here. A user's callable whose module is absent is caught the same way."""
    (tmp_path / "a.jsonl").write_text('{"text": "hello there world"}\n')
    y = write_yaml(tmp_path / "deps.yaml", """
        name: t
        sources:
          web: {paths: ["*.jsonl"], filters: [ppl, mine, short]}
        filters:
          ppl: {type: datatrove, class: "datatrove.pipeline.stats.perplexity_stats:CCNetPerplexityStats", args: {}}
          mine: {type: python, callable: "curate_user_rules.web:keep"}
          short: {type: length, min_words: 2}
        """)
    r = curate("validate", str(y))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        (f"error: {y}:5: filters.ppl.type: filter type 'datatrove' needs the module 'kenlm', which is not installed; "
         "pip install 'kenlm' (on every node of a cluster)"),
        (f"{y}:6: filters.mine.type: the module 'curate_user_rules.web' cannot be imported here; install the package "
         "that provides it (on every node of a cluster), or fix the import path"),
    ]


def test_nan_and_inf_are_config_errors_at_their_key(tmp_path):
    """YAML's .nan and .inf are floats: NaN weights passed every check (NaN compares false)
    and crashed the run with a traceback. Any number in the file must be finite."""
    (tmp_path / "a.jsonl").write_text('{"text": "hello there world"}\n')
    text = GOOD.replace('"*.jsonl"', '"a.jsonl"') + """\
  lang: {type: language, languages: [en], min_score: "nan"}
classifiers:
  c: {positive: [web], negative: [web], lr: -.inf}
mixture:
  weights:
    web: .nan
    web2: .inf
"""
    p = write_yaml(tmp_path / "nan.yaml", text)
    r = curate("validate", str(p))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    for line, key, got in ((9, "filters.lang.min_score", "'nan'"), (11, "classifiers.c.lr", "-inf"),
                           (14, "mixture.weights.web", "nan"), (15, "mixture.weights.web2", "inf")):
        assert f"{p}:{line}: {key}: must be a finite number, not {got}; give a number such as 0.25" in r.stderr, r.stderr


def test_recursive_aliases_alias_bombs_and_deep_nesting_are_config_errors(tmp_path):
    """YAML lets an alias name a value that contains it (loading recursed until RecursionError)
    and lets a few lines of nested aliases stand for billions of values (validation never
    ended): both are refused at their line before anything reads the document. Aliases that
    only repeat a value stay fine."""
    shared = GOOD.replace("filters: [english, gopher_quality]", "filters: &chain [english, gopher_quality]\n"
                          "  web2: {paths: ['*.jsonl'], filters: *chain}")
    lm = config.load(write_yaml(tmp_path / "ok.yaml", shared))
    assert lm.mixture.sources["web2"].filters == ["english", "gopher_quality"]
    loop = "name: t\nsources: &s\n  web: {paths: ['*.jsonl'], again: *s}\n"
    assert _err(tmp_path, loop) == ("x.yaml:3: sources.web.again: an alias to a value that contains it (anchored at line 2): "
                                    "a recursive value has no end; repeat a value, do not nest it in itself")
    assert _err(tmp_path, "name: t\nsources:\n  web: {paths: &p ['*.jsonl', *p]}\n").startswith(
        "x.yaml:3: sources.web.paths[1]: an alias to a value that contains it")
    bomb = "name: t\na0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for i in range(1, 9):
        bomb += f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n"
    bomb += "sources: {web: {paths: ['*.jsonl']}}\n"
    assert "aliases expand the file to over 100,000 values here; write the values out" in _err(tmp_path, bomb)
    assert _err(tmp_path, "name: t\nsources: " + "[" * 2000 + "]" * 2000 + "\n") == \
        "x.yaml:1: nested too deeply to read; a mixture file needs a few levels"
    p = write_yaml(tmp_path / "loop.yaml", loop)
    r = curate("validate", str(p))
    assert r.returncode == 2 and "Traceback" not in r.stderr and f"{p}:3: sources.web.again: an alias" in r.stderr


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """YAML keeps the last of two equal keys and says nothing: two sources named `web`
    validated as `ok (1 sources)`. Each mapping's keys are checked when lines are mapped."""
    twice = GOOD.replace("filters:\n  english:", "  web:\n    paths: ['*.jsonl']\nfilters:\n  english:")
    assert _err(tmp_path, twice).startswith("x.yaml:6: sources.web: given twice, at lines 3 and 6; YAML would keep")
    filters = GOOD + "  english: {type: length, min_words: 5}\n"
    assert _err(tmp_path, filters).startswith("x.yaml:9: filters.english: given twice, at lines 7 and 9")
    p = write_yaml(tmp_path / "twice.yaml", twice)
    r = curate("validate", str(p))
    assert r.returncode == 2 and "ok (" not in r.stdout and f"{p}:6: sources.web: given twice" in r.stderr


def test_symlink_loops_under_a_double_star_are_skipped_with_a_note(tmp_path):
    """glob follows a symlink to a folder it is inside until the OS's symlink limit: two
    loops made discovery exponential (it never ended). Each loop is skipped with a note;
    a symlink that makes no loop is followed, as glob does."""
    d = tmp_path / "data" / "a" / "b"
    d.mkdir(parents=True)
    (d / "x.jsonl").write_text('{"text": "one two three"}\n')
    (d.parent / "y.jsonl").write_text('{"text": "four five six"}\n')
    (d / "up").symlink_to("..")  # -> data/a
    (d / "top").symlink_to("../..")  # -> data
    (tmp_path / "data" / "elsewhere").symlink_to(d)  # no loop: followed, as glob does
    y = write_yaml(tmp_path / "m.yaml", """
        name: m
        sources:
          s: {paths: ["data/**/*.jsonl"]}
    """)
    r = curate("validate", str(y), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ok (1 sources, 2 input files)" in r.stdout
    where = f"{y}:3: sources.s.paths[0]"
    assert f"note: {where}: skipped {d}/up: a symlink to {d.parent}, a folder it is inside (a loop)" in r.stderr
    assert f"note: {where}: skipped {d}/top: a symlink to {tmp_path / 'data'}, a folder it is inside (a loop)" in r.stderr
    files = resolve_inputs(config.load(y))["s"]
    assert sorted(f.path for f in files) == [str((d / "x.jsonl").resolve()), str((d.parent / "y.jsonl").resolve())]
