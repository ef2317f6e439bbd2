"""Parameters per detected language: any filter instance's `per_language`.

A web crawl is hundreds of languages in one source, and one set of English thresholds
removes most of the rest (FineWeb-2 fits Gopher's, C4's and FineWeb's thresholds, word
splitting and stop words per language). A filter instance takes

    per_language: {fr: {min_avg_word_length: 2}, sr_Latn: {...}, default: {...}}
    per_language: fineweb2        # FineWeb-2's table (filters/fineweb2.py), for its types
    per_language: langs.yaml      # the same mapping in a file (YAML or JSON)

and each document is filtered with its language's parameters: the instance's own, then
`default`'s, then its language's. The language is the `lang` attribute of the chain's
language filter before it (a config error when there is none; `type: language` with
`label_only: true` labels without removing); a language filter with `per_language` routes
by its own label (its `min_score` per language, FineWeb-2's `language_score`). Where a
language is written in two scripts and the mapping has `<lang>_<Script>` keys (`sr` in
Cyrillic, `sr_Latn`), the script is read off the text's letters. A batch is split once into
its languages, each group filtered by that language's instance (built once per worker),
and the results put back in row order. A removal's reason names the rule's language:
`too_few_stop_words:fr` (`:default` for a language without its own entry), so `explain`,
the samples and the report's reasons show which language's thresholds removed it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from pydantic import ValidationError

from filters import fineweb2

LANG_KEY = re.compile(r"^[a-z]{2,3}(_[A-Z][a-z]{3})?$")
SCRIPTS = {"Latn": re.compile(r"[A-Za-z\u00C0-\u024F]"), "Cyrl": re.compile(r"[\u0400-\u04FF]"),
           "Arab": re.compile(r"[\u0600-\u06FF]"), "Grek": re.compile(r"[\u0370-\u03FF]"),
           "Hebr": re.compile(r"[\u0590-\u05FF]"), "Deva": re.compile(r"[\u0900-\u097F]"),
           "Knda": re.compile(r"[\u0C80-\u0CFF]"), "Mlym": re.compile(r"[\u0D00-\u0D7F]"),
           "Taml": re.compile(r"[\u0B80-\u0BFF]"), "Telu": re.compile(r"[\u0C00-\u0C7F]")}
SCRIPT_CHARS = 2000  # the letters a script is read from


def check(params) -> None:
    """per_language as the YAML gives it (a file is read when the chain is built: its
    path is made absolute first, and checked with the other files)."""
    pl = params.per_language
    if isinstance(pl, str):
        if pl == "fineweb2":
            if params.type not in fineweb2.TYPES:
                raise ValueError(f"per_language: fineweb2 has thresholds for {', '.join(fineweb2.TYPES)}, not "
                                 f"{params.type}; give the mapping itself")
        elif not pl.endswith((".yaml", ".yml", ".json")):
            raise ValueError("per_language: a mapping {<lang>: {<param>: <value>}}, `fineweb2`, or a .yaml/.json file")
        return
    validate(params, pl)


def validate(params, mapping: dict) -> None:
    for key, over in mapping.items():
        if key != "default" and not LANG_KEY.match(str(key)):
            raise ValueError(f"per_language.{key}: a language code as lid.176 gives it (fr, pt), with a script if "
                             "needed (sr_Latn), or `default`")
        if not isinstance(over, dict):
            raise ValueError(f"per_language.{key}: a mapping of {params.type} parameters")
        if {"type", "per_language"} & set(over):
            raise ValueError(f"per_language.{key}: `type` and `per_language` are the instance's, not a language's")
        merged(params, mapping, key)


def merged(params, mapping: dict, key: str):
    """The parameters of one language (or `default`): the instance's, default's, the language's."""
    d = params.model_dump()
    d.pop("per_language", None)
    d.update(mapping.get("default", {}))
    if key != "default":
        d.update(mapping.get(key, {}))
    try:
        return type(params).model_validate(d)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"per_language.{key}.{'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def table(params) -> dict[str, dict]:
    """The language -> parameters mapping an instance's per_language names."""
    pl = params.per_language
    if pl == "fineweb2":
        return {k: fineweb2.params(params.type, e) for k, e in fineweb2.table().items()}
    if isinstance(pl, str):
        import json

        import yaml

        from pipeline.io import fs

        text = fs.path(pl).read_text(encoding="utf-8")
        got = json.loads(text) if pl.endswith(".json") else yaml.safe_load(text)
        if not isinstance(got, dict):
            raise ValueError(f"{pl}: a mapping {{<lang>: {{<param>: <value>}}, default: {{...}}}}")
        validate(params, got)
        return got
    return dict(pl)


def script_of(text: str, candidates: Sequence[str]) -> str | None:
    """The candidate script with the most letters in the text's first SCRIPT_CHARS characters."""
    head = text[:SCRIPT_CHARS]
    counts = [(len(SCRIPTS[s].findall(head)), s) for s in candidates if s in SCRIPTS]
    best = max(counts, default=(0, None))
    return best[1] if best[0] else None


class Routed:
    """A filter instance with per_language: one inner instance per language used."""

    routed = True

    def __init__(self, params, build):
        self.params, self._build = params, build
        self.table = table(params)
        self.inner: dict[str, object] = {}
        self.scripts: dict[str, list[str]] = {}
        for key in self.table:
            if "_" in key:
                lang, script = key.split("_")
                self.scripts.setdefault(lang, []).append(script)
        for lang in self.scripts:  # the bare key's script, where the table says it (fineweb2)
            s = self.table.get(lang, {}).get("_script") or fineweb2.table().get(lang, {}).get("script")
            if s and s not in self.scripts[lang]:
                self.scripts[lang].append(s)
        self.routes_by: str | None = None  # the stage whose `lang` routes (set by the filter step)

    def instance(self, key: str):
        if key not in self.inner:
            self.inner[key] = self._build(merged(self.params, self.table, key))
        return self.inner[key]

    def key(self, lang: str | None, text: str) -> str:
        if lang in self.scripts:
            s = script_of(text, self.scripts[lang])
            if s and f"{lang}_{s}" in self.table:
                return f"{lang}_{s}"
        return lang if lang is not None and lang in self.table and lang != "default" else "default"

    def apply(self, batch: pa.RecordBatch, langs: pa.Array | None = None):
        if self.params.type == "language":  # routes by its own label
            return self._language(batch)
        if langs is None:
            raise RuntimeError(f"{self.params.type} with per_language needs the chain's language filter before it")
        texts = batch.column("text").to_pylist()
        keys = [self.key(lang, t) for lang, t in zip(langs.to_pylist(), texts)]
        groups: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            groups.setdefault(k, []).append(i)
        n = batch.num_rows
        if not n:
            return self.instance("default").apply(batch)
        result = None  # the inner filters' result class (filters/base.py's FilterResult: not imported here, which imports this)
        keep = np.ones(n, bool)
        reasons: list[str | None] = [None] * n
        out_texts: list[str | None] | None = None
        parts: dict[str, list[tuple[np.ndarray, pa.Array]]] = {}
        changes: dict[str, np.ndarray] = {}
        for k, rows in sorted(groups.items()):
            ix = np.array(rows, np.int64)
            sub = batch if len(ix) == n else batch.take(pa.array(ix))
            res = self.instance(k).apply(sub)
            result = type(res)
            keep[ix] = res.keep
            for j, r in zip(rows, res.reasons):
                reasons[j] = None if r is None else f"{r}:{k}"
            for name, arr in res.scores.items():
                parts.setdefault(name, []).append((ix, arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr))
            if res.texts is not None:
                out_texts = out_texts or [None] * n
                for j, t in zip(rows, res.texts):
                    out_texts[j] = t
            for kind, per_row in (res.changes or {}).items():
                changes.setdefault(kind, np.zeros(n, np.asarray(per_row).dtype))[ix] = per_row
        scores = {}
        for name, got in parts.items():
            order = np.concatenate([ix for ix, _ in got])
            vals = pa.concat_arrays([a for _, a in got])
            if len(order) < n:  # a group without this score: nulls there
                vals = pa.concat_arrays([vals, pa.nulls(1, vals.type)])
                pos = np.full(n, len(order))
            else:
                pos = np.empty(n, np.int64)
            pos[order] = np.arange(len(order))
            scores[name] = vals.take(pa.array(pos))
        return result(keep, reasons, scores, out_texts, changes or None)

    def _language(self, batch: pa.RecordBatch):
        """The language filter: its labels from the instance's model, then each row's own
        language's `min_score` (and `languages`)."""
        base = self.instance("default")
        labelled = type(base)(base.params.model_copy(update={"label_only": True})).apply(batch)
        lang = labelled.scores["lang"].to_pylist()
        score = labelled.scores["lang_score"].to_numpy(zero_copy_only=False)
        texts = batch.column("text").to_pylist()
        keep = np.zeros(len(lang), bool)
        reasons: list[str | None] = []
        rules: dict[str, object] = {}  # key -> that language's parameters
        for i, (x, t) in enumerate(zip(lang, texts)):
            k = self.key(x, t)
            p = rules.get(k) or rules.setdefault(k, merged(self.params, self.table, k))
            wanted = p.languages is None or x in p.languages
            keep[i] = wanted and score[i] > p.min_score
            reasons.append(None if keep[i] else (f"low_language_score:{k}" if wanted else f"wrong_language:{x}"))
        return type(labelled)(keep, reasons, labelled.scores)
