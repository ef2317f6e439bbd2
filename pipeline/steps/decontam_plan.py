"""The decontamination steps of a plan: the eval index (one task), then one task per
document shard after dedup (pipeline/steps/decontam.py). The eval files' sha256 enter the
index step's hash, so editing an eval file re-runs decontamination and what follows; eval
sources (role: eval) enter through their steps' hashes. The index task reads every eval
source whole: eval sets are small (benchmarks), unlike the corpora it checks."""

from __future__ import annotations

from pipeline.config import eval_files
from pipeline.dedup.plan import doc_shards
from pipeline.executor import Step, shard_name
from pipeline.io import atomic, fs


def add_steps(plan, base: list[Step], layers: list[Step]) -> Step | None:
    """Append the decontamination steps to plan.steps; returns the attribute step (a layer)."""
    dc = plan.lm.mixture.decontaminate
    if dc is None:
        return None
    sets, sources = [], []
    for e in dc.against:
        if isinstance(e, str):  # a source with role: eval, read after its filters and dedup
            sources.append(e)
            continue
        files = [f for p in e.paths for f in eval_files(plan.lm, p)]
        sets.append({"name": e.name, "files": files, "text_fields": e.text_fields, "id_field": e.id_field,
                     "sha256": [atomic.file_digest(fs.path(f))[1] for f in files]})
    hashed = [{k: v for k, v in s.items() if k != "files"} for s in sets]  # contents, not where the files are
    prev = list(layers)

    def index_shards(st, stats):
        docs = [{"source": d["source"], "documents": d["documents"], "layers": d["layers"]}
                for d in (doc_shards(plan, stats, prev) if sources else []) if d["source"] in sources]
        return [{"sets": sets, "sources": docs, "ngram": dc.ngram, "describe": "eval index"}]

    index = Step("decontaminate-index", "decontaminate-index", {"ngram": dc.ngram, "sets": hashed, "sources": sources},
                 (base + prev) if sources else [], "pipeline.steps.decontam:index_shard", shards=index_shards)
    plan.steps.append(index)
    train = [s for s, v in plan.lm.mixture.sources.items() if v.role == "train"]
    params = {"ngram": dc.ngram, "unit": dc.unit, "min_overlap": dc.min_overlap, "min_unit_words": dc.min_unit_words,
              "train": train}  # eval and reference sources are references, never checked

    def shards(st, stats):
        return [{"doc": d, "index": str(index.dir(plan.store)), **params, "action": dc.action, "tokenizer": plan.tokenizer,
                 "describe": f"{d['source']}/{shard_name(d['part'])}"}
                for d in doc_shards(plan, stats, prev)]

    cfg = {**params, "action": dc.action, **({"tokenizer_id": plan.tokenizer_id} if dc.action == "cut" else {})}
    apply = Step("decontaminate", "decontaminate", cfg, base + prev + [index],
                 "pipeline.steps.decontam:apply_shard", shards=shards, meta={"stage": "decontaminate"})
    plan.steps.append(apply)
    return apply
