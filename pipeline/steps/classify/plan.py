"""The classification steps of a plan (tasks.py says what each does).

A classifier is trained once (`classify-<name>-train`) and scores only the sources whose
`quality` names it (`classify-<name>-<source>`; a source named `train` or `examples`, the
words of the classifier's own steps, is scored by `classify-<name>-source-train`:
`score_name`); each such source then gets its own
threshold and attributes (`quality-<source>-threshold`, `quality-<source>`). The step
hashes make iteration cheap: `min_score` and `keep_fraction` are in the threshold step
only, so editing them skips training and scoring. What the model is (fastText ...) is the
classifier family's (`classifiers.<name>.type`, filters/classifiers.py): the plan asks it
for its model file's name, the options that change a score, and a pretrained model's labels;
its registered version and libraries enter the training, scoring and topic steps' hashes.
"""

from __future__ import annotations

from filters.classifiers import embeddings_of, family
from pipeline.engine.step import Step, shard_name
from pipeline.io import atomic, fs
from pipeline.plan import code
from pipeline.plan.code import portable
from pipeline.shards.apply import attribute_path
from pipeline.shards.select import select_entry
from pipeline.plan.context import Context
from pipeline.steps.classify import clusters
from pipeline.steps.classify import quality
from pipeline.steps.classify import tasks as classify
from pipeline.plan.stage import Stage, texts


def plan(ctx: Context) -> list[Step]:
    """The classifiers' steps; records each source's quality and topic steps and the topic
    labels its cells may name (ctx.add_source_layer, ctx.topic_labels)."""
    m = ctx.mixture
    used = {s: spec.quality for s, spec in m.sources.items() if spec.quality}
    topics = {s: spec.topic for s, spec in m.sources.items() if spec.topic}
    clustered = [s for s, spec in m.sources.items() if spec.topics]
    if not used and not topics and not clustered:
        return []
    base = dict(zip(m.sources, ctx.base(), strict=True))
    dedup = list(ctx.layers)
    steps: list[Step] = []
    everything = list(base.values()) + dedup
    models: dict[str, tuple[Step | None, str, str]] = {}  # classifier -> (train step, model path, model id)
    named = {q.classifier for q in list(used.values()) + list(topics.values())}
    named |= {x for n in list(named) for x in (getattr(m.classifiers[n], "members", None) or {})}  # an ensemble's members
    for cname in sorted(named, key=lambda n: (bool(getattr(m.classifiers[n], "members", None)), n)):  # members first
        c = m.classifiers[cname]
        if c.pretrained:
            models[cname] = (None, c.pretrained, atomic.file_digest(fs.path(c.pretrained))[1])
            continue
        params = c.model_dump(mode="json")
        params.pop(c.pretrained_key, None)  # None here: a pretrained model is not trained
        if c.graded:  # from an annotations file (graded.py): one train step, no examples step
            digest = atomic.file_digest(fs.path(c.annotations))[1]
            cfg = {"params": portable({k: v for k, v in params.items() if k not in ("positive", "negative", "labels", "annotations")}),
                   "annotations": digest}
            train = Step(f"classify-{cname}-train", "classify-train", cfg, [], classify.train_shard,
                         shards=lambda st, stats, cname=cname, params=params, path=c.annotations: [
                             {"name": cname, "params": params, "annotations": path,
                              "describe": f"train classifier {cname}"}], code=code.family_code(c.type))
            steps.append(train)
            models[cname] = (train, str(train.dir(ctx.store) / family(c.type).model_file), None)
            continue
        sides = {}
        for side, entries in (c.labels or {"positive": c.positive, "negative": c.negative}).items():
            names = [v for v in entries if v in m.sources]
            files = [v for v in entries if v not in m.sources]
            sides[side] = (names, files)
        digests = {f: atomic.file_digest(fs.path(f))[1] for names, files in sides.values() for f in files}
        if c.labels:  # per label: its sources and its files' digests (moving a file to another label retrains)
            cfg = {"params": portable({k: v for k, v in params.items() if k not in ("positive", "negative", "labels", "label")}),
                   "labels": {lab: names + [digests[f] for f in files] for lab, (names, files) in sides.items()}}
        else:  # the keys a binary classifier always had (without files, its steps keep their hashes)
            per_side = {side: {f: digests[f] for f in files} for side, (_, files) in sides.items()}  # which side a file is on
            cfg = {"params": portable({k: v for k, v in params.items() if k not in ("positive", "negative", "labels")}),
                   "positive": sides["positive"][0], "negative": sides["negative"][0], "files": per_side if digests else {}}

        after_members = []
        if getattr(c, "members", None):  # an ensemble: its members' models, trained above (or pretrained)
            cfg["members"] = {x: models[x][2] for x in sorted(c.members)}  # a pretrained member's digest; else its step
            after_members = [models[x][0] for x in sorted(c.members) if models[x][0] is not None]
            params = {**params, "member_models": {
                x: {"type": m.classifiers[x].type, "path": models[x][1], "label": m.classifiers[x].label,
                    "options": family(m.classifiers[x].type).options(m.classifiers[x].model_dump(mode="json"))}
                for x in sorted(c.members)}}

        def side_docs(stats, sides=sides, cap=params["max_examples_per_class"]):
            """(side, its document shards, its hash bound) for each class."""
            docs = list(ctx.doc_shards(stats, dedup))  # read once per class
            out = []
            for side, (names, _) in sides.items():
                mine = [d for d in docs if d["source"] in names]
                out.append((side, mine, classify.tau(cap, sum(d["kept"] for d in mine))))
            return out

        def example_shards(st, stats, side_docs=side_docs, seed=params["seed"]) -> list[classify.ExamplesSpec]:
            return [{"doc": d, "seed": seed, "tau": bound, "describe": f"{side} examples {d['source']}/{shard_name(d['part'])}"}
                    for side, mine, bound in side_docs(stats) for d in mine]

        # a shard's candidates are a function of its spec alone (its document shard, the seed and the
        # hash bound): a training edit (epochs, learning rate) reuses every shard of examples
        ex = Step(f"classify-{cname}-examples", "classify-examples", cfg, everything, classify.examples_shard,
                  shards=example_shards, position_free=True, shard_free=tuple(cfg))

        def train_shards(st, stats, cname=cname, params=params, sides=sides, side_docs=side_docs, ex=ex, multi=bool(c.labels),
                         digests=digests):
            spec = {"name": cname, "params": params, "describe": f"train classifier {cname}"}
            into = spec.setdefault("classes", {}) if multi else spec  # labels in order; positive/negative
            j = 0
            for side, mine, bound in side_docs(stats):
                shards = []
                for d in mine:  # the examples step's shards are the sides' shards in this order
                    shards.append({**d, "candidates": str(ex.dir(ctx.store) / f"{shard_name(j)}.parquet"),
                                   "offered": stats[ex.name][j]["candidates"]})
                    j += 1
                into[side] = {"shards": shards, "files": sides[side][1], "tau": bound,
                              "digests": {f: digests[f] for f in sides[side][1]}}
            return [spec]

        train = Step(f"classify-{cname}-train", "classify-train", cfg, [ex] + after_members, classify.train_shard,
                     shards=train_shards, code=code.family_code(c.type))
        steps += [ex, train]
        models[cname] = (train, str(train.dir(ctx.store) / family(c.type).model_file), None)

    quality_of: dict[str, Step] = {}  # source -> its quality step: what its topic step reads after
    for sname, q in used.items():
        c = m.classifiers[q.classifier]
        train, model_path, model_id = models[q.classifier]
        options = family(c.type).options(c.model_dump(mode="json"))  # fastText: lowercase

        def source_docs(stats, sname=sname):
            return (d for d in ctx.doc_shards(stats, dedup) if d["source"] == sname)

        score_cfg = {"model": model_id, "label": c.label, **portable(options)}
        vec = _vectors(ctx, sname, c)
        score = Step(
            score_name(q.classifier, sname), "classify-score", score_cfg,
            ([train] if train else []) + [base[sname]] + dedup + ([vec] if vec else []), quality.score_shard,
            shards=lambda st, stats, source_docs=source_docs, model_path=model_path, c=c, options=options, vec=vec: (
                {"doc": d, "model": model_path, "type": c.type, "label": c.label, "options": options,
                 **({"vectors": str(attribute_path(vec.dir(ctx.store), d["source"], d["part"])),
                     "vectors_ref": list(vec.meta["ref"])} if vec else {}),
                 "describe": f"{d['source']}/{shard_name(d['part'])}"} for d in source_docs(stats)),
            code=code.family_code(c.type), position_free=True, read_keyed=("layers",),
        )
        steps.append(score)

        def scores_of(stats, score=score, source_docs=source_docs):
            return [(d, str(score.dir(ctx.store) / f"{shard_name(j)}.parquet")) for j, d in enumerate(source_docs(stats))]

        thr_cfg: dict[str, object] = {"min_score": q.min_score, "keep_fraction": q.keep_fraction}
        if q.n_buckets():  # only then: a mixture without buckets keeps its step hashes
            thr_cfg.update({"buckets": q.buckets, "edges": q.edges})
        if q.max_score is not None:
            thr_cfg["max_score"] = q.max_score
        thr = Step(
            f"quality-{sname}-threshold", "quality-threshold", thr_cfg, [score], quality.threshold_shard,
            shards=lambda st, stats, scores_of=scores_of, q=q, sname=sname, score=score: [
                {"keys": str(score.dir(ctx.store) / "keys"), "shards": len(scores_of(stats)),
                 "min_score": q.min_score, "keep_fraction": q.keep_fraction, "buckets": q.buckets, "max_score": q.max_score,
                 **select_entry(ctx.engine.select_group), "describe": f"threshold of {sname}"}],
            cpus=0,  # a coordinator past engine.select_group score shards: its tree's tasks take the CPUs
        )
        thr.meta["engine"] = {"select_group": ctx.engine.select_group}
        ctx.declare("quality_threshold", thr, sname)
        steps.append(thr)
        def apply_shards(st, stats, scores_of=scores_of, thr=thr, q=q) -> list[quality.QualityApplySpec]:
            t = stats[thr.name][0]
            return [{"doc": d, "scores": p, "threshold": t["threshold"], "key": t["key"], "bucket_keys": t.get("bucket_keys"),
                     "edges": q.edges, "n_buckets": q.n_buckets(), "max_score": t.get("max_score"),
                     "describe": f"{d['source']}/{shard_name(d['part'])}"} for d, p in scores_of(stats)]

        apply = Step(f"quality-{sname}", "quality-apply", {}, [thr], quality.apply_shard, shards=apply_shards,
                     position_free=True)
        steps.append(apply)
        ctx.add_source_layer(sname, f"quality:{q.classifier}", apply, role="quality")
        quality_of[sname] = apply

    for sname, tp in topics.items():
        c = m.classifiers[tp.classifier]
        train, model_path, model_id = models[tp.classifier]
        ctx.topic_labels[sname] = list(c.labels) if c.labels else _model_labels(ctx, tp.classifier, c.pretrained, model_id)
        before = [quality_of[sname]] if sname in quality_of else []
        options = family(c.type).options(c.model_dump(mode="json"))

        vec = _vectors(ctx, sname, c)

        def topic_shards(st, stats, sname=sname, before=before, model_path=model_path, c=c, options=options, vec=vec):
            after = {sname: before} if before else None
            return ({"doc": d, "model": model_path, "type": c.type, "options": options,
                     **({"vectors": str(attribute_path(vec.dir(ctx.store), d["source"], d["part"]))} if vec else {}),
                     "describe": f"{d['source']}/{shard_name(d['part'])}"}
                    for d in ctx.doc_shards(stats, dedup, after) if d["source"] == sname)

        step = Step(f"topic-{sname}", "topic", {"model": model_id, **portable(options)},
                    ([train] if train else []) + [base[sname]] + dedup + before + ([vec] if vec else []),
                    classify.topic_shard,
                    shards=topic_shards, code=code.family_code(c.type), position_free=True)
        steps.append(step)
        ctx.add_source_layer(sname, f"topic:{tp.classifier}", step, role="topic")
    for sname in clustered:  # embedding clusters as topics (clusters.py)
        before = [quality_of[sname]] if sname in quality_of else []
        cl = clusters.steps(ctx, sname, before, dedup, base[sname])
        steps += cl
        ctx.add_source_layer(sname, "topic:clusters", cl[-1], role="topic")
    return steps


STAGE = Stage("classify", plan, tasks=texts("classify-examples", "classify-train", "classify-score", "topic"))

OWN_STEPS = ("examples", "train")  # classify-<name>-examples, classify-<name>-train


def _vectors(ctx: Context, sname: str, c) -> Step | None:
    """The embed step whose vectors classifier `c` scores `sname` from (an embedding family on
    the run's embedding, or an ensemble with such members), or None: it embeds the texts itself."""
    st = ctx.provider("embeddings", sname)
    if st is None or st.config.get("rows") != "all":  # "all" only when no later layer rewrites the texts (embed.vector_readers)
        return None
    return st if st.meta.get("ref") in embeddings_of(ctx.mixture.classifiers, c) else None


def score_name(cname: str, source: str) -> str:
    """The step that scores `source` with classifier `cname`: `classify-<cname>-<source>`,
    unless the source's name is one of the classifier's own steps' words (a source may be
    called `train`): then `classify-<cname>-source-<source>`. Names of the form
    `source-...-source-train` move up one `source-` likewise, so no two sources (and no
    source and the classifier's own steps) ever get one name, and every other source keeps
    the name it always had."""
    word = source
    while word.startswith("source-"):
        word = word[len("source-"):]
    return f"classify-{cname}-source-{source}" if word in OWN_STEPS else f"classify-{cname}-{source}"


def _model_labels(ctx: Context, cname: str, path: str, digest: str) -> list[str]:
    """A pretrained multi-class model's labels, without `__label__`: the topics cells name,
    so each must be a name a cell key can hold. Planning needs only the labels: they are kept
    by the model's sha256 (already computed for the step hash) in the user's cache, so the
    driver loads a model (which may be gigabytes) once per model, not at every plan, and
    does not keep it."""
    import json
    import re

    from filters.models import cache_dir
    from pipeline.errors import UsageError

    cache = cache_dir() / "model-labels" / f"{digest}.json"
    try:
        labels = json.loads(cache.read_text())
    except (OSError, ValueError):
        labels = family(ctx.mixture.classifiers[cname].type).labels(path)  # not kept in memory
        try:
            atomic.write_json(cache, labels)
        except OSError:  # a cache that cannot be written is simply not kept
            pass
    bad = [lab for lab in labels if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", lab) or re.fullmatch(r"q\d+", lab)]
    if bad:
        key = ctx.mixture.classifiers[cname].pretrained_key
        raise UsageError(f"{ctx.lm.where(('classifiers', cname, key))}: the model's labels {bad} cannot name a "
                         "topic cell (letters, digits, '_', '.', '-', not q<number>); retrain it with such labels")
    return labels
