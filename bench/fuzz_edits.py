"""The edit fuzzer's world: a small corpus, a mixture as a state, and the edits it takes.

A state is a JSON-able dict; `render` makes a valid mixture YAML of any state (a field that
would not fit the others is left out of the YAML, never an error), so an edit recorded as a
patch (`[(path, value), ...]`) replays on any state: that is what the minimiser relies on
(bench/fuzz_reuse.py). The corpus is a folder whose files the state names by content id
(`files`: relative path -> id), written from the library of contents `Library` builds once.

    lib = Library.build(tmp / "lib", wheel_dir)     # contents, tokenizers, eval variants
    state = base_state()
    patch, what = edit(rng, state, lib)              # a random edit: its patch and a line saying what
    state = apply(state, patch)
    lib.materialize(state, tmp / "corpus")           # the corpus files as the state names them
    yaml = render(state, tmp / "corpus", output)
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
from pathlib import Path

import orjson

KINDS = ("wiki", "web", "code")
FOLDER_GLOB = {"wiki": "wiki/*.parquet", "web": "web/*.jsonl.zst", "code": "code/*.jsonl", "extra": "extra/*.jsonl"}
FILTERS = {  # the filter instances every state defines (params edited in place)
    "english": {"type": "language", "languages": ["en"], "min_score": 0.5},
    "short": {"type": "length", "min_chars": 50},
    "long": {"type": "length", "max_chars": 60000},
    "huge": {"type": "length", "max_chars": 20000},
    "rep": {"type": "gopher_repetition"},
    "gq": {"type": "gopher_quality", "min_words": 50},
    "fw": {"type": "fineweb_quality"},
}
PARAMS = {  # filter -> param -> values an edit may set (None: the parameter off)
    "english": {"min_score": [0.3, 0.5, 0.65, 0.8]},
    "short": {"min_chars": [20, 50, 80, 200]},
    "long": {"max_chars": [1500, 5000, 60000]},
    "huge": {"max_chars": [3000, 8000, 20000]},
    "rep": {"max_dup_line_frac": [0.2, 0.3, 0.5], "max_dup_para_frac": [0.3, None]},
    "gq": {"min_words": [20, 50, 100], "min_stop_words": [1, 2, 4]},
    "fw": {"max_short_line_ratio": [0.5, 0.67, None], "min_line_punct_ratio": [0.12, 0.3]},
}
PER_LANGUAGE = [None, "fineweb2", {"fr": {"min_score": 0.3}, "default": {"min_score": 0.7}}]


def base_state() -> dict:
    return {
        "names": {"wiki": "wiki", "web": "web", "code": "code"},
        "extra": False,
        "chains": {"wiki": ["english", "short"], "web": ["rep", "gq", "long"], "code": ["huge"], "extra": ["short"]},
        "filters": copy.deepcopy(FILTERS),
        "dedup": {"exact": True, "fuzzy": 0.8, "paragraph": 5, "semantic": None, "order": "id"},
        "decon": "source", "eval": "plain",
        "clf": {"epochs": 3, "max_examples": 300, "pinned": None},
        "quality": {"mode": "buckets", "n": 2},
        "topics": None,
        "tokenize": {"tokenizer": None, "formats": ["megatron"], "eos": True},
        "tokenizer": "gpt2",
        "mix": {"cells": "buckets", "w": {"wiki": 0.4, "web": 0.4, "code": 0.2, "extra": 0.1}, "phases": False,
                "max_epochs": 3, "target": 40000, "validation": None},
        "engine": {},
        "verify": "mtime", "content_only": False,
        "files": {"wiki/a.parquet": "wiki-a", "wiki/b.parquet": "wiki-b",
                  "web/crawl-0.jsonl.zst": "web-0", "web/crawl-1.jsonl.zst": "web-1", "web/crawl-2.jsonl.zst": "web-2",
                  "code/part-0.jsonl": "code-0", "code/part-1.jsonl": "code-1",
                  "eval/he.jsonl": "eval-plain", "extra/x.jsonl": "extra-0"},
    }


def apply(state: dict, patch: list) -> dict:
    """A new state: each (path, value) of `patch` set (value None at a `files` path: the file removed)."""
    s = copy.deepcopy(state)
    for path, value in patch:
        d = s
        for k in path[:-1]:
            d = d[k]
        if value is None and path[0] == "files":
            d.pop(path[-1], None)
        else:
            d[path[-1]] = copy.deepcopy(value)
    return s


# ----- the YAML -----------------------------------------------------------------------------------

def render(state: dict, corpus: Path, lib: "Library") -> str:
    """A valid mixture YAML for any state (what would not fit is left out): its output `out`,
    beside the YAML file, the publish folder in it."""
    names, st = state["names"], state
    kinds = list(KINDS) + (["extra"] if st["extra"] else [])
    kinds = [k for k in kinds if any(f.startswith(FOLDER_GLOB[k].split("/")[0] + "/") for f in st["files"])]
    ids = {"wiki": "id_field: id, ", "code": "id_field: id, ", "extra": "id_field: id, ", "web": ""}
    chains = {k: list(st["chains"][k]) for k in kinds}
    filters = copy.deepcopy(st["filters"])
    for name, spec in filters.items():  # per_language on a filter other than the language one needs it earlier
        if spec.get("per_language") is not None and spec["type"] != "language":
            if any(name in c and ("english" not in c or c.index("english") > c.index(name)) for c in chains.values()):
                spec.pop("per_language")
    lines = ["name: NAME", "output: out", "seed: 0", f"tokenizer: {lib.tokenizer(st['tokenizer'])}", "sources:"]
    quality = st["quality"]
    web = names["web"]
    nb = quality.get("n") if quality["mode"] in ("buckets", "edges") else None
    for k in kinds:
        extra = ""
        if k == "web":
            extra += ", quality: " + _quality(quality)
            if st["topics"]:
                extra += f", topics: {{clusters: {st['topics']}, sample: 200}}"
        lines.append(f"  {names.get(k, k)}: {{paths: [\"{corpus}/{FOLDER_GLOB[k]}\"], {ids[k]}"
                     f"filters: [{', '.join(chains[k])}]{extra}}}")
    if st["decon"] != "file":  # an eval source (decontaminated against, or a dedup reference); else the file alone
        lines.append(f"  ev: {{paths: [\"{corpus}/eval/he.jsonl\"], id_field: id, role: eval}}")
    lines.append("filters:")
    for name, spec in filters.items():
        lines.append(f"  {name}: {json.dumps(spec)}")
    d = st["dedup"]
    parts = []
    if d["exact"]:
        parts.append("exact: {}")
    if d["fuzzy"] is not None:
        parts.append(f"fuzzy: {{threshold: {d['fuzzy']}}}")
    if d["paragraph"] is not None:
        parts.append(f"paragraph: {{min_chars: 50, max_occurrences: {d['paragraph']}}}")
    if d["semantic"] is not None:
        parts.append(f"semantic: {{threshold: {d['semantic']}, sample: 200}}")
    if parts:
        lines.append(f"dedup: {{order: {d['order']}, {', '.join(parts)}}}")
    if st["decon"] == "source":
        lines.append("decontaminate: {against: [ev]}")
    elif st["decon"] == "file":
        lines.append(f"decontaminate: {{against: [{{name: he, paths: [\"{corpus}/eval/he.jsonl\"], id_field: id}}]}}")
    c = st["clf"]
    if c["pinned"]:
        lines.append(f"classifiers: {{wvw: {{type: fasttext, model: \"{lib.root / c['pinned']}\"}}}}")
    else:
        lines.append(f"classifiers: {{wvw: {{type: fasttext, positive: [{names['wiki'] if 'wiki' in kinds else 'ev'}], "
                     f"negative: [{web}], max_examples_per_class: {c['max_examples']}, epochs: {c['epochs']}}}}}")
    lines += _mixture(st, kinds, nb)
    tz = st["tokenize"]
    if tz is not None:
        tok = f", tokenizer: {lib.tokenizer(tz['tokenizer'])}" if tz["tokenizer"] else ""
        formats = [f for f in tz["formats"] if not (f == "levanter" and st["mix"]["phases"])] or ["megatron"]
        lines.append(f"tokenize: {{formats: [{', '.join(formats)}], eos: {str(tz['eos']).lower()}{tok}}}")
    lines.append("samples: {kept_per_source: 8, removed_per_reason: 2}")
    lines.append("publish: {dir: \"out/_published/{name}\"}")
    if st["engine"]:
        lines.append(f"engine: {json.dumps(st['engine'])}")
    if st["verify"] != "mtime":
        lines.append(f"inputs: {{verify: {st['verify']}}}")
    return "\n".join(lines) + "\n"


def _quality(q: dict) -> str:
    if q["mode"] == "buckets":
        return f"{{classifier: wvw, buckets: {q['n']}}}"
    if q["mode"] == "edges":
        edges = [round((i + 1) / q["n"], 3) for i in range(q["n"] - 1)]
        return f"{{classifier: wvw, edges: {edges}}}"
    return f"{{classifier: wvw, keep_fraction: {q['keep']}}}"


def _mixture(st: dict, kinds: list[str], nb: int | None) -> list[str]:
    m, names = st["mix"], st["names"]
    w = {names.get(k, k): m["w"][k] for k in kinds}
    web = names["web"]
    if m["cells"] == "buckets" and nb and web in w:  # the top bucket and the rest of web apart
        share = w.pop(web)
        w[f"{web}/q{nb}"] = round(share * 0.6, 4)
        w[f"{web}/q1-q{nb - 1}" if nb > 2 else f"{web}/q1"] = round(share * 0.4, 4)
    if m["cells"] == "langs":  # language cells (the `english` filter's label) on each source whose chain has it
        for k in kinds:
            src = names.get(k, k)
            if src not in w or "english" not in st["chains"][k]:
                continue
            share = w.pop(src)
            if k == "web" and nb:  # with the quality buckets: an axis and buckets in one key
                w[f"{src}/lang=en/q{nb}"] = round(share * 0.6, 4)
                w[f"{src}/lang=en/q1-q{nb - 1}" if nb > 2 else f"{src}/lang=en/q1"] = round(share * 0.3, 4)
                w[f"{src}/lang=other"] = round(share * 0.1, 4)
            else:
                w[f"{src}/lang=en"] = round(share * 0.8, 4)
                w[f"{src}/lang=other"] = round(share * 0.2, 4)
    total = sum(w.values())
    w = {k: round(v / total, 4) for k, v in w.items()}
    last = sorted(w)[-1]
    w[last] = round(1 - sum(v for k, v in w.items() if k != last), 4)
    out = ["mixture:", "  on_shortfall: renormalize", "  shard_tokens: 15000", f"  max_epochs: {m['max_epochs']}"]
    if m["validation"]:
        out.append(f"  validation: {{fraction: {m['validation']}}}")
    if m["phases"]:
        w2 = dict(reversed(sorted(w.items())))
        tot2 = sum(w2.values())
        out.append("  phases:")
        out.append(f"    - {{name: early, target_tokens: {m['target'] // 2}, weights: {json.dumps(w)}}}")
        out.append(f"    - {{name: late, target_tokens: {m['target'] // 3}, "
                   f"weights: {json.dumps({k: round(v / tot2, 4) for k, v in w2.items()})}}}")
    else:
        out.append(f"  target_tokens: {m['target']}")
        out.append(f"  weights: {json.dumps(w)}")
    return out


# ----- the edits ----------------------------------------------------------------------------------

def _e_filter_param(rng, s, lib):
    f = rng.choice(sorted(PARAMS))
    p = rng.choice(sorted(PARAMS[f]))
    v = rng.choice(PARAMS[f][p])
    return [(("filters", f, p), v)], f"filters.{f}.{p} = {v}"


def _e_filter_chain(rng, s, lib):
    k = rng.choice(list(KINDS))
    chain = list(s["chains"][k])
    pool = [f for f in FILTERS if f not in chain]
    if chain and (not pool or rng.random() < 0.4):
        f = chain.pop(rng.randrange(len(chain)))
        what = f"{k}'s chain without {f}"
    elif len(chain) > 1 and rng.random() < 0.3:
        rng.shuffle(chain)
        what = f"{k}'s chain reordered"
    else:
        f = rng.choice(pool)
        chain.insert(rng.randrange(len(chain) + 1), f)
        what = f"{k}'s chain with {f}"
    return [(("chains", k), chain)], f"{what}: {chain}"


def _e_per_language(rng, s, lib):
    target = rng.choice(["english", "gq"])
    v = rng.choice(PER_LANGUAGE)
    if target == "gq" and isinstance(v, dict):
        v = {"fr": {"min_stop_words": 1}, "default": {"min_stop_words": 2}}
    return [(("filters", target, "per_language"), v)], f"filters.{target}.per_language = {v}"


def _e_dedup(rng, s, lib):
    kind = rng.choice(["exact", "fuzzy", "paragraph", "order", "semantic"])
    vals = {"exact": [True, False], "fuzzy": [None, 0.7, 0.8, 0.9], "paragraph": [None, 2, 5],
            "order": ["id", "place"], "semantic": [None, None, 0.9, 0.95]}[kind]
    v = rng.choice([x for x in vals if x != s["dedup"][kind]])
    return [(("dedup", kind), v)], f"dedup.{kind} = {v}"


def _e_classifier(rng, s, lib):
    r = rng.random()
    if r < 0.3:
        v = rng.choice([2, 3, 4])
        return [(("clf", "epochs"), v)], f"classifier epochs = {v}"
    if r < 0.5:
        v = rng.choice([150, 300, 1000])
        return [(("clf", "max_examples"), v)], f"classifier max_examples_per_class = {v}"
    if r < 0.8 and lib.last_model is not None:
        return [(("clf", "pinned"), lib.last_model)], f"classifier pinned to {lib.last_model}"
    return [(("clf", "pinned"), None)], "classifier trained in the run"


def _e_quality(rng, s, lib):
    mode = rng.choice(["buckets", "buckets", "edges", "keep"])
    q = {"mode": mode, "n": rng.choice([2, 3])} if mode != "keep" else {"mode": "keep", "keep": rng.choice([0.5, 0.8])}
    return [(("quality",), q)], f"web quality {q}"


def _e_topics(rng, s, lib):
    v = rng.choice([None, 2, 3])
    return [(("topics",), v)], f"web topics clusters = {v}"


def _e_tokenize(rng, s, lib):
    tz = s["tokenize"]
    r = rng.random()
    if r < 0.15:
        return [(("tokenize",), None)], "no tokenize section"
    tz = dict(tz or {"tokenizer": None, "formats": ["megatron"], "eos": True})
    if r < 0.45:
        tz["tokenizer"] = rng.choice([None, "gpt2", "bpe-a", "bpe-b"])
    elif r < 0.8:
        tz["formats"] = rng.sample(["megatron", "memmap", "datatrove", "levanter"], rng.randint(1, 2))
    else:
        tz["eos"] = not tz["eos"]
    return [(("tokenize",), tz)], f"tokenize = {tz}"


def _e_tokenizer(rng, s, lib):
    v = rng.choice([x for x in ("gpt2", "bpe-a") if x != s["tokenizer"]])
    return [(("tokenizer",), v)], f"run tokenizer = {v}"


def _e_weights(rng, s, lib):
    w = {k: round(rng.uniform(0.05, 1.0), 2) for k in ("wiki", "web", "code", "extra")}
    return [(("mix", "w"), w)], f"weights {w}"


def _e_mixture(rng, s, lib):
    what = rng.choice(["cells", "phases", "max_epochs", "target", "validation"])
    v = {"cells": ["source", "buckets", "langs"], "phases": [True, False], "max_epochs": [1, 2, 3, 5],
         "target": [20000, 40000, 60000], "validation": [None, 0.05, 0.1]}[what]
    v = rng.choice([x for x in v if x != s["mix"][what]])
    return [(("mix", what), v)], f"mixture {what} = {v}"


def _e_eval(rng, s, lib):
    if rng.random() < 0.5:
        v = rng.choice([x for x in (None, "source", "file") if x != s["decon"]])
        return [(("decon",), v)], f"decontaminate against {v}"
    v = rng.choice([x for x in ("plain", "upper", "fewer", "more") if x != s["eval"]])
    return [(("eval",), v), (("files", "eval/he.jsonl"), f"eval-{v}")], f"eval file content {v}"


def _e_source(rng, s, lib):
    r = rng.random()
    if r < 0.5:
        return [(("extra",), not s["extra"])], f"source extra {'added' if not s['extra'] else 'removed'}"
    k = rng.choice(["web", "wiki", "code"])
    new = rng.choice([x for x in (k, k + "2", "z" + k) if x != s["names"][k]])
    return [(("names", k), new)], f"source {s['names'][k]} renamed {new}"


def _e_file(rng, s, lib):
    r = rng.random()
    files = s["files"]
    if r < 0.3:  # a new file in a folder
        k = rng.choice(["web", "wiki", "code"])
        rel, cid = {"web": ("web/crawl-3.jsonl.zst", "web-3"), "wiki": ("wiki/c.parquet", "wiki-c"),
                    "code": ("code/part-2.jsonl", "code-2")}[k]
        if rel in files:
            return [(("files", rel), None)], f"file {rel} removed"
        return [(("files", rel), cid)], f"file {rel} added"
    if r < 0.5:  # a file removed (never a folder's last)
        rels = [f for f in files if sum(g.split("/")[0] == f.split("/")[0] for g in files) > 1]
        if rels:
            rel = rng.choice(sorted(rels))
            return [(("files", rel), None)], f"file {rel} removed"
    if r < 0.75:  # a file replaced: another content, another size
        rel = rng.choice(sorted(f for f in files if f.startswith(("web/", "code/"))))
        cid = files[rel]
        new = cid[:-2] if cid.endswith("-x") else cid + "-x"
        return [(("files", rel), new)], f"file {rel} replaced ({new})"
    rel = rng.choice(sorted(f for f in files if f.startswith("code/")))  # same size and mtime: content mode
    cid = files[rel].split("@")[0]
    new = (cid[:-2] if cid.endswith("-s") else cid + "-s") + "@keep"
    return [(("verify",), "content"), (("content_only",), True), (("files", rel), new)], \
        f"file {rel} replaced with the same size and mtime ({new}; inputs.verify: content)"


def _e_engine(rng, s, lib):
    key = rng.choice(["shuffle_group", "select_group", "fuzzy_local_edges", "merge_bytes", "fuzzy_salt_rows"])
    v = {"shuffle_group": [2, 4], "select_group": [2, 3], "fuzzy_local_edges": [0, 1000],
         "merge_bytes": [4096, 1 << 20], "fuzzy_salt_rows": [2, 16]}[key]
    e = dict(s["engine"])
    if key in e and rng.random() < 0.4:
        e.pop(key)
    else:
        e[key] = rng.choice(v)
    return [(("engine",), e)], f"engine {e}"


def _e_verify(rng, s, lib):
    if s["content_only"]:  # a file was replaced keeping its size and mtime: mtime mode would not see it, by design
        return [(("verify",), "content")], "inputs.verify stays content"
    v = "content" if s["verify"] == "mtime" else "mtime"
    return [(("verify",), v)], f"inputs.verify = {v}"


def _e_gc(rng, s, lib):
    return [], "gc"  # an action of the driver (fuzz_reuse.Fuzz): run directories removed, then curate gc


EDITS = {  # kind -> (weight, edit)
    "filter_param": (4, _e_filter_param), "filter_chain": (2, _e_filter_chain), "per_language": (1, _e_per_language),
    "dedup": (4, _e_dedup), "classifier": (2, _e_classifier), "quality": (1, _e_quality), "topics": (1, _e_topics),
    "tokenize": (2, _e_tokenize), "tokenizer": (1, _e_tokenizer), "weights": (2, _e_weights), "mixture": (2, _e_mixture),
    "eval": (2, _e_eval), "source": (2, _e_source), "file": (3, _e_file), "engine": (1, _e_engine),
    "verify": (1, _e_verify), "gc": (1, _e_gc),
}


def edit(rng: random.Random, state: dict, lib: "Library", kinds=None) -> tuple[str, list, str]:
    """A random edit of `state`: (its kind, its patch, what it does)."""
    names = sorted(kinds or EDITS)
    kind = rng.choices(names, [EDITS[k][0] for k in names])[0]
    patch, what = EDITS[kind][1](rng, state, lib)
    return kind, patch, what


# ----- the corpus ---------------------------------------------------------------------------------

class Library:
    """Every content a corpus file can hold (by id), the tokenizer files, and the models
    pinned so far: built once under `root` (deterministic), copied into a corpus on demand."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.last_model: str | None = None

    @classmethod
    def build(cls, root: Path, wheel_dir: Path) -> "Library":
        import pyarrow as pa
        import pyarrow.parquet as pq
        import zstandard

        from pipeline import demo_data

        lib = cls(root)
        c = lib.root / "contents"
        if (lib.root / "done").exists():
            return lib
        c.mkdir(parents=True, exist_ok=True)
        wiki = demo_data.wiki_records(demo_data.wheel(wheel_dir))
        en, fr = wiki["en"], wiki["fr"]
        for name, recs in (("wiki-a", en[:80] + fr[:15]), ("wiki-b", en[80:160] + fr[15:30]), ("wiki-c", en[160:200] + fr[30:40])):
            pq.write_table(pa.Table.from_pylist([{"id": r["id"], "text": r["text"]} for r in recs]), c / name)
        web = demo_data.web_records(en, 330)
        more = demo_data.web_records(en, 60, seed=demo_data.SEED + 1)

        def zst(recs):
            return zstandard.ZstdCompressor().compress(b"".join(orjson.dumps({"url": r["url"], "text": r["text"]}) + b"\n"
                                                                for r in recs))
        for k in range(3):
            (c / f"web-{k}").write_bytes(zst(web[k * 110:(k + 1) * 110]))
            (c / f"web-{k}-x").write_bytes(zst(web[k * 110:(k + 1) * 110 - 7] + more[:4]))
        (c / "web-3").write_bytes(zst(more[4:] + web[:5]))  # new pages and exact copies of old ones
        (c / "web-3-x").write_bytes(zst(more[10:]))
        evals = demo_data.humaneval_records(wheel_dir)[:40]
        code = [r for r in demo_data.code_records() if len(r["text"]) < 6000][:90]
        code = demo_data.plant_evals(code, evals[:30], n=4)

        def jl(recs):
            return b"".join(orjson.dumps({"id": r["path"], "text": r["text"]}) + b"\n" for r in recs)
        for k in range(3):
            part = code[k * 30:(k + 1) * 30]
            (c / f"code-{k}").write_bytes(jl(part))
            (c / f"code-{k}-x").write_bytes(jl(part[:-3]))
            (c / f"code-{k}-s").write_bytes(_same_size(jl(part)))
            (c / f"code-{k}-x-s").write_bytes(_same_size(jl(part[:-3])))
        (c / "extra-0").write_bytes(b"".join(orjson.dumps({"id": f"x{i}", "text": r["text"]}) + b"\n"
                                             for i, r in enumerate(en[300:340] + web[:6])))
        ev = [{"id": r["id"], "text": r["text"]} for r in evals[:30]]
        variants = {"plain": ev, "upper": [{**r, "text": r["text"].upper()} for r in ev], "fewer": ev[:25],
                    "more": ev + [{"id": r["id"], "text": r["text"]} for r in evals[30:]]}
        for v, recs in variants.items():
            (c / f"eval-{v}").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
        lib._tokenizers([r["text"] for r in en[:400]])
        (lib.root / "models").mkdir(exist_ok=True)
        (lib.root / "done").write_text("")
        return lib

    def _tokenizers(self, texts: list[str]) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        for name, size in (("bpe-a", 3000), ("bpe-b", 1500)):
            tok = Tokenizer(models.BPE())
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=size, special_tokens=["<|endoftext|>"], show_progress=False,
                                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
            tok.save(str(self.root / f"{name}.json"))

    def tokenizer(self, name: str | None) -> str:
        return "gpt2" if name in (None, "gpt2") else str(self.root / f"{name}.json")

    def pin(self, model: Path, n: int) -> str:
        """A copy of a run's trained model, under a name of its own: what a pinned classifier names."""
        rel = f"models/m{n}.bin"
        shutil.copyfile(model, self.root / rel)
        self.last_model = rel
        return rel

    def materialize(self, state: dict, corpus: Path) -> None:
        """The corpus folder as `state["files"]` names it: a changed file written, a gone one
        removed, an unchanged one left alone (its mtime is its fingerprint); `<id>@keep`: written
        with the size and mtime the file had (the content differs)."""
        corpus = Path(corpus)
        want = state["files"]
        have = {str(p.relative_to(corpus)): p for p in corpus.rglob("*") if p.is_file() and p.name != ".ids.json"}
        ids_file = corpus / ".ids.json"
        ids = json.loads(ids_file.read_text()) if ids_file.exists() else {}
        for rel in sorted(set(have) - set(want)):
            have[rel].unlink()
            ids.pop(rel, None)
        for rel, cid in sorted(want.items()):
            if ids.get(rel) == cid and rel in have:
                continue
            dst = corpus / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            content, _, keep = cid.partition("@")
            before = dst.stat() if dst.exists() else None
            data = (self.root / "contents" / content).read_bytes()
            if keep and before is not None and before.st_size != len(data):
                raise ValueError(f"{cid}: {len(data)} bytes, where {rel} had {before.st_size}")
            dst.write_bytes(data)
            if keep and before is not None:
                os.utime(dst, ns=(before.st_atime_ns, before.st_mtime_ns))
            ids[rel] = cid
        ids_file.write_text(json.dumps(ids))


def _same_size(data: bytes) -> bytes:
    """The same bytes but for a few letters of one record (its size, not its content, the same)."""
    lines = data.split(b"\n")
    rec = orjson.loads(lines[len(lines) // 2])
    t = rec["text"]
    i = next(j for j, ch in enumerate(t) if ch in "etaoin")
    rec["text"] = t[:i] + {"e": "a", "t": "s", "a": "e", "o": "u", "i": "o", "n": "m"}[t[i]] + t[i + 1:]
    lines[len(lines) // 2] = orjson.dumps(rec)
    out = b"\n".join(lines)
    assert len(out) == len(data)
    return out
