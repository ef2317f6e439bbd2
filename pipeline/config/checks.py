"""Checks a schema cannot make: references between sections, and the machine.

`check_references` (names used are defined, weights and phases make sense) runs when a
file loads. `environment(lm)` checks the file against the machine (filter files and their
packages, extractors, classifier model and example files, eval files); it is part of
`plan.sources.check`, which `curate validate` and `curate run` both call, so a file that
validates does not fail at run for a missing file.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from filters import base as filter_base
from filters import classifiers as classifier_registry
from pipeline.config.models import LoadedMixture, Mixture
from pipeline.mixing import keys as weight_keys
from pipeline.io import fs


def environment(lm: LoadedMixture) -> list[str]:
    """Every problem between the file and this machine, each naming the key and the fix."""
    return (check_filter_files(lm) + check_extractors(lm) + check_classifier_files(lm) + check_eval_files(lm)
            + check_embedding_folders(lm) + check_engine_env(lm))


def check_engine_env(lm: "LoadedMixture") -> list[str]:
    """The environment's overrides of `engine:` (CURATE_SHUFFLE_GROUP, ...) must be numbers
    it takes; `validate` sees what `run` will plan with."""
    from pipeline.errors import UsageError

    try:
        lm.engine()
    except UsageError as e:
        return [f"{lm.path}: engine: {e}"]
    return []


def check_filter_files(lm: "LoadedMixture") -> list[str]:
    """Every file a used filter reads must exist, and every module it imports must be
    installed; the message names the key and the fix."""
    from filters import models

    out = []
    used = {f for s in lm.mixture.sources.values() for f in s.filters}
    for name, params in lm.mixture.filters.items():
        if name not in used:
            continue
        out += [f"{lm.where(('filters', name, 'type'))}: {m}" for m in filter_base.missing_dependencies(params)]
        for field, value in filter_base.path_fields(params).items():
            if not Path(value).is_file():
                if field == "model" and getattr(params, "model", None) is None:
                    out.append(f"{lm.where(('filters', name))}: {models.missing_model_message('language filter', Path(value))}")
                else:
                    out.append(f"{lm.where(('filters', name, field))}: no such file: {value}")
            elif field == "per_language":  # its contents: each language's parameters valid for the type
                from filters import routing

                try:
                    routing.table(params)
                except (ValueError, OSError) as e:
                    out.append(f"{lm.where(('filters', name, 'per_language'))}: {value}: {e}")
    return out


def check_extractors(lm: "LoadedMixture") -> list[str]:
    """Every extractor a source names must import here (and on every node): a missing
    package is a config error with its pip line, not an extractor process that cannot start."""
    import importlib
    import importlib.util

    out = []
    for sname, spec in lm.mixture.sources.items():
        ex = spec.extract
        if ex is None or ex.type == "resiliparse":  # resiliparse is a dependency of curate itself
            continue
        where = lm.where(("sources", sname, "extract", "type" if ex.type == "trafilatura" else "callable"))
        if ex.type == "trafilatura":
            try:
                importlib.import_module("trafilatura")
            except ImportError as e:
                fix = "lxml_html_clean" if "lxml.html.clean" in str(e) or "lxml_html_clean" in str(e) else "trafilatura"
                out.append(f"{where}: the trafilatura extractor cannot be imported here ({e}); pip install '{fix}' "
                           "(on every node of a cluster)")
        else:
            module = ex.callable.split(":", 1)[0]
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                out.append(f"{where}: the module {module!r} cannot be imported here; install the package that provides "
                           "it (on every node of a cluster), or fix the module:function name")
    return out


def check_eval_files(lm: "LoadedMixture") -> list[str]:
    """Every eval file `decontaminate.against` names must exist (globs: at least one file)."""
    out = []
    dc = lm.mixture.decontaminate
    for i, e in enumerate(dc.against if dc else []):
        for j, p in enumerate([] if isinstance(e, str) else e.paths):
            if not eval_files(lm, p):
                out.append(f"{lm.where(('decontaminate', 'against', i, 'paths', j))}: no file matches {p}; "
                           "give JSONL (.gz, .zst) or Parquet files of eval items, relative to the YAML file")
    return out


def eval_files(lm: "LoadedMixture", pattern: str) -> list[str]:
    p = pattern if fs.is_url(pattern) or Path(pattern).is_absolute() else str(lm.base_dir / pattern)
    if fs.is_url(p):
        return [p] if fs.path(p).exists() else []
    return sorted(x for x in glob.glob(p) if Path(x).is_file())


def check_embedding_folders(lm: "LoadedMixture") -> list[str]:
    """An embedding model given as a local folder must be a sentence-transformers folder
    (modules.json) or hold model.onnx and tokenizer.json."""
    m = lm.mixture
    refs = [(("dedup", "semantic", "model"), m.dedup.semantic.model)] if m.dedup and m.dedup.semantic else []
    refs += [(("sources", s, "topics", "model"), spec.topics.model) for s, spec in m.sources.items() if spec.topics]
    refs += [(("classifiers", n, "model"), c.model) for n, c in m.classifiers.items()
             if c.pretrained_key != "model" and isinstance(getattr(c, "model", None), str)]
    out = []
    for loc, ref in refs:
        if "/" not in ref or (Path(ref) / "modules.json").is_file():  # a backend's name, or a sentence-transformers folder
            continue
        missing = [f for f in ("model.onnx", "tokenizer.json") if not (Path(ref) / f).is_file()]
        if missing:
            out.append(f"{lm.where(loc)}: {ref}: no {' or '.join(missing)} there; a local embedding model is a folder "
                       "SentenceTransformer.save wrote (modules.json), or one with model.onnx and tokenizer.json "
                       "(an ONNX export of a sentence encoder)")
    return out


def check_classifier_files(lm: "LoadedMixture") -> list[str]:
    """Model and example files of the classifiers in use must exist."""
    out = []
    used = {s.quality.classifier for s in lm.mixture.sources.values() if s.quality}
    used |= {s.topic.classifier for s in lm.mixture.sources.values() if s.topic}
    for name, c in lm.mixture.classifiers.items():
        if name not in used:
            continue
        if c.pretrained and not fs.path(c.pretrained).is_file():
            fam = classifier_registry.family(c.type)
            out.append(f"{lm.where(('classifiers', name, c.pretrained_key))}: no such model file: {c.pretrained}; point it "
                       f"at a {fam.title} {Path(fam.model_file).suffix}, or remove `{c.pretrained_key}` to train the "
                       "classifier from `positive` and `negative`")
        if c.pretrained:
            continue
        if c.graded and c.annotations and not fs.path(c.annotations).is_file():
            out.append(f"{lm.where(('classifiers', name, 'annotations'))}: no such file: {c.annotations}")
        sides = [((side,), getattr(c, side)) for side in ("positive", "negative")]
        sides += [(("labels", lab), v) for lab, v in (c.labels or {}).items()]
        for loc, values in sides:
            for i, v in enumerate(values):
                if v not in lm.mixture.sources and not fs.path(v).is_file():
                    out.append(f"{lm.where(('classifiers', name, *loc, i))}: no such file: {v}")
    return out


def check_references(m: Mixture) -> list[tuple[tuple, str]]:
    """Cross-section checks: every name used is defined, weights make sense."""
    out: list[tuple[tuple, str]] = []
    defined_filters = ", ".join(m.filters) or "(none: add a `filters` section)"
    defined_sources = ", ".join(m.sources)
    defined_cls = ", ".join(m.classifiers) or "(none: add a `classifiers` section)"
    for sname, src in m.sources.items():
        lid = False  # a language filter earlier in the chain: what routes per_language
        for i, f in enumerate(src.filters):
            if f not in m.filters:
                out.append((("sources", sname, "filters", i), f"unknown filter {f!r}; defined: {defined_filters}"))
                continue
            p = m.filters[f]
            if p.per_language is not None and p.type != "language" and not lid:
                out.append((("sources", sname, "filters", i), f"{f} has per_language, which routes each document by the "
                            "language the chain's language filter detects, but none comes before it; add one first "
                            "(type: language, label_only: true labels without removing)"))
            lid = lid or p.type == "language"
        if src.quality and src.quality.classifier not in m.classifiers:
            out.append(
                (("sources", sname, "quality", "classifier"), f"unknown classifier {src.quality.classifier!r}; defined: {defined_cls}")
            )
        if src.quality and src.quality.keep_fraction is not None and src.quality.min_score is not None:
            out.append((("sources", sname, "quality"), "set keep_fraction or min_score, not both"))
    models = {("dedup", "semantic"): (m.dedup.semantic.model, m.dedup.semantic.max_tokens, m.dedup.semantic.dtype)} \
        if m.dedup and m.dedup.semantic else {}
    for sname, src in m.sources.items():
        if src.topics and src.topic:
            out.append((("sources", sname, "topics"), "give topic (a classifier's labels) or topics (embedding clusters), "
                        "not both: a document has one topic"))
        if src.topics and src.role != "train":
            out.append((("sources", sname, "topics"), f"{sname} has role: {src.role}, which is never mixed: its documents "
                        "get no cells; remove topics"))
        if src.topics:
            models[("sources", sname, "topics")] = (src.topics.model, src.topics.max_tokens, src.topics.dtype)
    if len(set(models.values())) > 1:
        loc, first = next(iter(models.items()))
        for where, v in models.items():
            if v != first:
                out.append((where, f"model {v[0]!r} with max_tokens {v[1]} and dtype {v[2]} differs from {'.'.join(loc)} "
                            f"(model {first[0]!r}, max_tokens {first[1]}, dtype {first[2]}): a run embeds its documents "
                            "once, with one model; use the same everywhere"))
    for sname, src in m.sources.items():
        if src.topic and src.topic.classifier not in m.classifiers:
            out.append((("sources", sname, "topic", "classifier"), f"unknown classifier {src.topic.classifier!r}; defined: {defined_cls}"))
        elif src.topic and m.classifiers[src.topic.classifier].labels is None and m.classifiers[src.topic.classifier].pretrained is None \
                and not m.classifiers[src.topic.classifier].graded:
            out.append((("sources", sname, "topic", "classifier"), f"{src.topic.classifier} is a positive/negative classifier; "
                        "a topic classifier has `labels: {topic: [sources or files], ...}` (or a pretrained multi-class `model`)"))
        if src.topic and src.topic.classifier in m.classifiers and m.classifiers[src.topic.classifier].graded:
            out.append((("sources", sname, "topic", "classifier"), f"{src.topic.classifier} grades documents; a topic "
                        "classifier has `labels`: use it under `quality:` instead"))
        if src.quality and src.quality.classifier in m.classifiers and m.classifiers[src.quality.classifier].labels is not None:
            out.append((("sources", sname, "quality", "classifier"), f"{src.quality.classifier} has labels (topics); quality "
                        "needs a positive/negative classifier: use it under `topic:` instead"))
    for cname, c in m.classifiers.items():
        sides = [(("classifiers", cname, side), getattr(c, side)) for side in ("positive", "negative")]
        sides += [(("classifiers", cname, "labels", lab), v) for lab, v in (c.labels or {}).items()]
        for loc, names in sides:
            for i, s in enumerate(names):
                if s not in m.sources and not any(ch in s for ch in "/*."):
                    out.append(((*loc, i), f"unknown source {s!r}; defined: {defined_sources} "
                                "(a file path needs a '/' or an extension)"))
        for x, w in (getattr(c, "members", None) or {}).items():
            other = m.classifiers.get(x)
            if other is None:
                out.append((("classifiers", cname, "members", x), f"unknown classifier {x!r}; defined: {defined_cls}"))
            elif getattr(other, "members", None) is not None or other.labels is not None:
                out.append((("classifiers", cname, "members", x), f"{x} is {'an ensemble' if getattr(other, 'members', None) else 'a topic classifier'}; "
                            "an ensemble's members score documents: fastText, embedding probes, regressions"))
            if not w > 0:
                out.append((("classifiers", cname, "members", x), f"weight {w}: a member's weight is above 0"))
        if c.graded:
            if c.positive or c.negative or c.labels:
                out.append((("classifiers", cname), f"a {c.type} classifier learns from `annotations` (id, score, text), "
                            "not from positive, negative or labels: remove them"))
            elif c.annotations is None and c.pretrained is None:
                out.append((("classifiers", cname), f"a {c.type} classifier needs `annotations: FILE` (id, score, text "
                            f"rows) or a trained `{c.pretrained_key}:`"))
            continue
        if c.labels is not None:
            if c.positive or c.negative:
                out.append((("classifiers", cname), "give labels (a topic classifier) or positive/negative, not both"))
            if c.pretrained is not None:
                out.append((("classifiers", cname), f"give labels (to train a topic classifier) or {c.pretrained_key} (a "
                            "pretrained one, whose labels are the topics), not both"))
            for lab, v in c.labels.items():
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", lab) or re.fullmatch(r"q\d+", lab):
                    out.append((("classifiers", cname, "labels", lab), f"label {lab!r} must be letters, digits, '_', '.', '-' "
                                "and not q<number> (that names a quality bucket in a cell)"))
                if not v and c.pretrained is None:
                    out.append((("classifiers", cname, "labels", lab), "a label needs at least one source or file of examples"))
            if len(c.labels) < 2:
                out.append((("classifiers", cname, "labels"), "a topic classifier needs at least two labels"))
        elif c.pretrained is None and (not c.positive or not c.negative):
            out.append((("classifiers", cname), "a trained classifier needs both `positive` and `negative` sources (or set "
                        f"`{c.pretrained_key}:`)"))
    if m.dedup and m.dedup.priority:
        for i, s in enumerate(m.dedup.priority):
            if s not in m.sources:
                out.append((("dedup", "priority", i), f"unknown source {s!r}; defined: {defined_sources}"))
    if m.dedup and m.dedup.fuzzy:
        fz = m.dedup.fuzzy
        rows = fz.rows or (fz.num_perm // fz.bands)
        if fz.bands * rows > fz.num_perm:
            out.append((("dedup", "fuzzy"), f"bands x rows = {fz.bands * rows} exceeds num_perm = {fz.num_perm}"))
    if m.tokenizer is None:
        for key in ("weights", "sample_rates", "target_tokens", "simulate_target_tokens", "shard_tokens"):
            if getattr(m.mixture, key) is not None:
                out.append((("mixture", key), "needs token counts, but tokenizer is null; set tokenizer: gpt2 (or a tokenizer.json)"))
    for i, s in enumerate(m.mixture.exclude):
        if s not in m.sources:
            out.append((("mixture", "exclude", i), f"unknown source {s!r}; defined: {defined_sources}"))
    for i, a in enumerate(m.decontaminate.against if m.decontaminate else []):
        if isinstance(a, str) and (a not in m.sources or m.sources[a].role != "eval"):
            out.append((("decontaminate", "against", i), f"{a!r} is not a source with role: eval; name one "
                        f"({', '.join(s for s, v in m.sources.items() if v.role == 'eval') or 'none defined'}) or give "
                        "{name, paths, text_fields} for eval files"))
    w = m.mixture.weights
    if w is not None:
        out += weight_keys.problems(m)
        total = sum(w.values())
        if not m.mixture.normalize and abs(total - 1.0) > 1e-6:
            out.append((("mixture", "weights"), f"weights sum to {total:g}, not 1; fix them or set mixture.normalize: true"))
        if m.mixture.normalize and total <= 0:
            out.append((("mixture", "weights"), "weights sum to 0; give at least one source a positive weight"))
    mx = m.mixture
    out += _phase_problems(m)
    if mx.sample_rates is not None:
        out += weight_keys.problems(m, "sample_rates")
        if w is not None:
            out.append((("mixture", "sample_rates"), "give weights (token shares) or sample_rates (multiples of each cell's "
                        "kept tokens), not both"))
        for key in ("target_tokens", "simulate_target_tokens"):
            if getattr(mx, key) is not None:
                out.append((("mixture", key), f"sample_rates fix every cell's tokens, so the mixture's size; remove {key}"))
    if mx.simulate_target_tokens is not None:
        if w is None:
            out.append((("mixture", "simulate_target_tokens"), "simulated epoching needs mixture.weights (the full mixture's shares)"))
        if mx.target_tokens is None:
            out.append((("mixture", "simulate_target_tokens"), "simulated epoching needs mixture.target_tokens, the small "
                        "mixture's size (below simulate_target_tokens)"))
        elif mx.target_tokens > mx.simulate_target_tokens:
            out.append((("mixture", "simulate_target_tokens"), f"{mx.simulate_target_tokens:,} is below target_tokens "
                        f"({mx.target_tokens:,}): it is the full run's size that the small mixture simulates"))
    return out


def _phase_problems(m: Mixture) -> list[tuple[tuple, str]]:
    mx = m.mixture
    out: list[tuple[tuple, str]] = []
    if mx.phases is None:
        if mx.disjoint:
            out.append((("mixture", "disjoint"), "disjoint applies to mixture.phases; there are none"))
        return out
    for key in ("weights", "sample_rates", "target_tokens", "simulate_target_tokens"):
        if getattr(mx, key) is not None:
            out.append((("mixture", key), f"with phases, {key} goes in each phase (mixture.phases[i].{key}); remove it here"))
    seen = set()
    for i, ph in enumerate(mx.phases):
        loc = ("mixture", "phases", i)
        if ph.name in seen:
            out.append(((*loc, "name"), f"two phases are named {ph.name}; names are folders of mixture/"))
        seen.add(ph.name)
        if ph.weights is not None and ph.sample_rates is not None:
            out.append((loc, "give weights or sample_rates, not both"))
        if ph.sample_rates is not None and ph.target_tokens is not None:
            out.append(((*loc, "target_tokens"), "sample_rates fix every cell's tokens, so the phase's size; remove target_tokens"))
        for field in ("weights", "sample_rates"):
            if getattr(ph, field) is not None:
                view = m.model_copy(update={"mixture": mx.model_copy(update={"weights": None, "sample_rates": None, field: getattr(ph, field)})})
                out += [((*loc, *where[1:]), msg) for where, msg in weight_keys.problems(view, field)]
        if ph.weights is not None and not mx.normalize and abs(sum(ph.weights.values()) - 1.0) > 1e-6:
            out.append(((*loc, "weights"), f"weights sum to {sum(ph.weights.values()):g}, not 1; fix them or set mixture.normalize: true"))
    if mx.disjoint:
        keys = [set(ph.weights or {}) for ph in mx.phases]
        if any(ph.weights is None for ph in mx.phases) or any(k != keys[0] for k in keys):
            out.append((("mixture", "disjoint"), "disjoint phases must each give weights over the same cells (only the "
                        "values differ), so that each cell's documents can be shared out among them"))
    return out
