"""The validation steps of a plan (pipeline/steps/validation.py): keys per document shard
of the train sources, one select, then a layer per document shard. Present when
`mixture.validation` is set or a source has role: eval."""

from __future__ import annotations

from pipeline.dedup.plan import doc_shards
from pipeline.executor import Step, shard_name


def add_steps(plan, base: list[Step], layers: list[Step]) -> Step | None:
    m = plan.lm.mixture
    v = m.mixture.validation
    evals = [s for s, spec in m.sources.items() if spec.role == "eval"]
    if v is None and not evals:
        return None
    train = [s for s, spec in m.sources.items() if spec.role == "train"] if v is not None else []
    prev = list(layers)
    by = "tokens" if v is not None and v.tokens is not None else "docs"
    cfg = {"seed": m.seed, "fraction": v.fraction if v else None, "tokens": v.tokens if v else None, "train": train, "eval": evals}

    def train_docs(stats):
        return [d for d in doc_shards(plan, stats, prev) if d["source"] in train]

    ks = Step("validation-keys", "validation-keys", cfg, base + prev, "pipeline.steps.validation:keys_shard",
              shards=lambda st, stats: [{"doc": d, "seed": m.seed, "by": by, "describe": f"{d['source']}/{shard_name(d['part'])}"}
                                        for d in train_docs(stats)])
    plan.steps.append(ks)

    def select_shards(st, stats):
        paths: dict[str, list[str]] = {s: [] for s in train}
        for j, d in enumerate(train_docs(stats)):
            paths[d["source"]].append(str(ks.dir(plan.store) / f"{shard_name(j)}.parquet"))
        return [{"keys": paths, "fraction": cfg["fraction"], "tokens": cfg["tokens"], "describe": "validation selection"}]

    sel = Step("validation-select", "validation-select", cfg, [ks], "pipeline.steps.validation:select_shard", shards=select_shards)
    plan.steps.append(sel)

    def apply_shards(st, stats):
        cut = stats[sel.name][0]["sources"]
        return [{"doc": d, "seed": m.seed, "role": m.sources[d["source"]].role,
                 "cutoff": (cut.get(d["source"]) or {}).get("cutoff"), "describe": f"{d['source']}/{shard_name(d['part'])}"}
                for d in doc_shards(plan, stats, prev)]  # a layer has a file for every document shard

    ap = Step("validation", "validation", cfg, base + prev + [sel], "pipeline.steps.validation:apply_shard",
              shards=apply_shards, meta={"stage": "validation"})
    plan.steps.append(ap)
    return ap
