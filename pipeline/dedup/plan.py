"""The dedup steps of a plan, and the document shards they work on.

A *document shard* is one ingest shard of one source with its layers: the attribute files
of the stages before (its source's filters, then earlier dedup kinds). Every dedup step
that works per document shard lists them in the same global order, so shard index k is
the same (source, shard) in every step.

Partitions: `dedup.partitions`, or one per PARTITION_ROWS shuffle rows (documents for
exact, documents x bands for fuzzy, paragraphs for paragraph dedup), so a reduce task
holds at most about PARTITION_ROWS rows (~40 bytes each, plus the id strings).
"""

from __future__ import annotations

import math

from pipeline.dedup import combine, exact, fuzzy
from pipeline.dedup.apply import attribute_path
from pipeline.executor import Step, shard_name

PARTITION_ROWS = 4_000_000
SHUFFLE_VERSION = "2"  # map outputs as .data + .index files (pipeline/dedup/shuffle.py)
COMBINE_VERSION = "3"  # exact and paragraph maps send each key's first holders only (pipeline/dedup/combine.py)
PARAGRAPHS_PER_DOC = 8  # a planning guess: web pages have a few to a few dozen
VERIFY_TEXT_BYTES = 64 << 20  # text per fuzzy verify partition (its shingle sets take about as much again)


def ranks(mixture) -> dict[str, int]:
    """Source priority for survivors: eval and reference sources before every train source
    (a train copy of an eval item goes, never the item), then `dedup.priority`, then YAML order."""
    prio = list((mixture.dedup.priority if mixture.dedup else None) or [])
    order = prio + [s for s in mixture.sources if s not in prio]
    order = [s for s in order if mixture.sources[s].role != "train"] + [s for s in order if mixture.sources[s].role == "train"]
    return {s: i for i, s in enumerate(order)}


def doc_shards(plan, stats: dict, layers: list[Step], after: dict[str, list[Step]] | None = None) -> list[dict]:
    """Every document shard, with the attribute files of its filters, of the global `layers`
    and of its source's steps in `after` (per-source steps after dedup: quality, topic)."""
    m = plan.lm.mixture
    rk = ranks(m)
    out = []
    for si, sname in enumerate(m.sources):
        ing = plan.ingest[sname]
        flt = plan.filter.get(sname)
        lasts = (after or {}).get(sname) or []
        for j, i in enumerate(sorted(stats[ing.name])):
            paths, kept, tokens = [], stats[ing.name][i]["docs_out"], stats[ing.name][i]["tokens"]
            if flt:
                paths.append(str(flt.dir(plan.store) / f"{shard_name(i)}.parquet"))
                mk = stats[flt.name][i]
                kept = mk["docs_out"]
                tokens = mk["stages"][list(mk["stages"])[-1]]["tokens_out"] if mk["stages"] else tokens
            for st in layers:
                paths.append(str(attribute_path(st.dir(plan.store), sname, i)))
                kept, tokens = stats[st.name][len(out)]["docs_out"], stats[st.name][len(out)]["tokens_out"]
            extra = {}
            for last in lasts:
                paths.append(str(attribute_path(last.dir(plan.store), sname, i)))
                mk = stats[last.name][j]
                kept, tokens = mk["docs_out"], mk["tokens_out"]
                if "bucket_docs" in mk:  # kept documents and tokens per quality bucket
                    extra.update({"bucket_docs": mk["bucket_docs"], "bucket_tokens": mk["bucket_tokens"]})
                if "groups" in mk:  # ... per (topic, bucket)
                    extra["groups"] = mk["groups"]
            out.append({"source": sname, "src": si, "rank": rk[sname], "part": i, "index": j, "k": len(out),
                        "documents": str(ing.dir(plan.store) / f"{shard_name(i)}.parquet"),
                        "layers": paths, "kept": kept, "tokens": tokens, **extra})
    return out


def shard_offsets(plan, stats: dict) -> tuple[list[int], int]:
    """Per source (YAML order), the global number of its first document shard; and the
    number of document shards. Decisions are shuffled back to shard k = offset + shard."""
    offsets, total = [], 0
    for sname in plan.lm.mixture.sources:
        offsets.append(total)
        total += len(stats[plan.ingest[sname].name])
    return offsets, total


def outputs(stats: dict, step: Step) -> int:
    """How many shuffle outputs a decision step wrote: one per shard, or what its marker says."""
    ms = stats[step.name]
    return ms[0].get("outputs", len(ms)) if 0 in ms else len(ms)


def _partitions(cfg, rows: int) -> int:
    return cfg.partitions or max(1, math.ceil(rows / PARTITION_ROWS))


def _describe(d: dict) -> str:
    return f"{d['source']}/{shard_name(d['part'])}"


def add_steps(plan, base: list[Step]) -> list[Step]:
    """Append the dedup steps to plan.steps; returns the attribute steps, in order."""
    dd = plan.lm.mixture.dedup
    if dd is None:
        return []
    m = plan.lm.mixture
    names = list(m.sources)
    rk = ranks(m)
    rank_source = sorted(rk, key=rk.get)
    common = {"ranks": rk, "partitions": dd.partitions}
    layers: list[Step] = []

    def add(step: Step) -> Step:
        plan.steps.append(step)
        return step

    def per_doc(extra, prev):
        def shards(st, stats):
            docs = doc_shards(plan, stats, prev)
            kept = sum(x["kept"] for x in docs)  # once per step, not per shard
            return [{"doc": d, **extra(kept, d, stats), "describe": _describe(d)} for d in docs]
        return shards

    def reduce_specs(map_step, extra):
        def shards(st, stats):
            ms = stats[map_step.name]
            count = ms[0]["partitions"] if ms else 0
            offsets, ndocs = shard_offsets(plan, stats)
            return [{"inputs": str(map_step.dir(plan.store) / "buckets"), "maps": len(ms), "partition": p,
                     "offsets": offsets, "ndocs": ndocs, "sources": names, "rank_source": rank_source, **extra,
                     "describe": f"partition {p}"} for p in range(count)]
        return shards

    def apply_step(kind: str, decisions: Step, fn: str, columns: dict | None, prev, cfg=None, extra=None,
                   combined: Step | None = None) -> Step:
        def rest(d, stats):  # the map's rest file for this shard (pipeline/dedup/combine.py)
            if combined is None:
                return {}
            n = stats[combined.name][d["k"]].get("rest", 0)
            return {"combined": True, "rest": str(combine.rest_path(combined.dir(plan.store) / "rest", d["k"])) if n else None}

        return add(Step(
            f"dedup-{kind}", f"dedup-{kind}", {"columns": columns, **(cfg or {})}, [decisions], fn,
            shards=per_doc(lambda kept, d, stats: {"decisions": str(decisions.dir(plan.store)), "columns": columns,
                                                   "reducers": outputs(stats, decisions), **(cfg or {}), **(extra or {}),
                                                   **rest(d, stats)},
                           prev),
        ))

    if dd.exact:
        prev = list(layers)
        by = {} if dd.exact.key == "text" else {"key": dd.exact.key, "url_field": dd.exact.url_field,
                                                 "date_field": dd.exact.date_field}  # text keys keep their old hashes
        cfg = {"normalize": dd.exact.normalize, **by, **common}
        mp = add(Step("dedup-exact-map", "dedup-exact-map", cfg, base + prev, "pipeline.dedup.exact:map_shard",
                      version=COMBINE_VERSION, shards=per_doc(lambda kept, d, stats: {"normalize": dd.exact.normalize, **by,
                                                            "partitions": _partitions(dd, kept)}, prev)))
        rd = add(Step("dedup-exact-reduce", "dedup-exact-reduce", {}, [mp], "pipeline.dedup.exact:reduce_shard",
                      shards=reduce_specs(mp, {"reason": "url_duplicate_of"} if by else {})))
        layers.append(apply_step("exact", rd, "pipeline.dedup.apply:run_shard", exact.COLUMNS, prev, combined=mp))

    if dd.fuzzy:
        prev = list(layers)
        fz = dd.fuzzy
        params = {**fz.model_dump(mode="json"), "rows": fz.rows or fz.num_perm // fz.bands}
        cfg = {"params": params, **common}
        sig = add(Step("dedup-fuzzy-signatures", "dedup-fuzzy-signatures", cfg, base + prev,
                       "pipeline.dedup.fuzzy:sig_shard", version=SHUFFLE_VERSION,
                       shards=per_doc(lambda kept, d, stats, params=params: {"params": params, "partitions": _partitions(
                           dd, kept * fz.bands)}, prev)))
        bk = add(Step("dedup-fuzzy-buckets", "dedup-fuzzy-buckets", {}, [sig], "pipeline.dedup.fuzzy:buckets_shard",
                      version="2", shards=reduce_specs(sig, {})))

        def fetch_shards(st, stats, prev=prev, params=params, sig=sig, bk=bk):
            pairs = sum(m["pairs"] for m in stats[bk.name].values())
            docs = sum(m["docs"] for m in stats[sig.name].values())
            avg = sum(m["text_bytes"] for m in stats[sig.name].values()) / max(1, docs)
            nparts = dd.partitions or max(1, math.ceil(2 * pairs * avg / VERIFY_TEXT_BYTES))
            return [{"doc": d, "pairs": str(bk.dir(plan.store)), "pair_files": len(stats[bk.name]), "params": params,
                     "partitions": nparts, "describe": _describe(d)} for d in doc_shards(plan, stats, prev)]

        fe = add(Step("dedup-fuzzy-fetch", "dedup-fuzzy-fetch", {"params": params}, [bk],
                      "pipeline.dedup.fuzzy:fetch_shard", shards=fetch_shards))
        vf = add(Step("dedup-fuzzy-verify", "dedup-fuzzy-verify", {"params": params}, [fe],
                      "pipeline.dedup.fuzzy:verify_shard",
                      shards=lambda st, stats, fe=fe, params=params: [
                          {"fetched": str(fe.dir(plan.store)), "maps": len(stats[fe.name]), "partition": v,
                           "params": params, "describe": f"pair partition {v}"}
                          for v in range(stats[fe.name][0]["partitions"] if stats[fe.name] else 0)]))
        src_rank = [rk[s] for s in names]
        cl = add(Step("dedup-fuzzy-clusters", "dedup-fuzzy-clusters", {}, [vf], "pipeline.dedup.fuzzy:clusters_shard", cpus=0,
                      shards=lambda st, stats, vf=vf: [{"edges": str(vf.dir(plan.store)), "sources": names,
                                                 "src_rank": src_rank, "partitions": dd.partitions,
                                                 "verified": len(stats[vf.name]),
                                                 "edge_count": sum(m["edges"] for m in stats[vf.name].values()),
                                                 **dict(zip(("offsets", "ndocs"), shard_offsets(plan, stats))),
                                                 "describe": "connected components"}]))
        layers.append(apply_step("fuzzy", cl, "pipeline.dedup.apply:run_shard", fuzzy.COLUMNS, prev))

    if dd.paragraph:
        prev = list(layers)
        params = dd.paragraph.model_dump(mode="json")
        cfg = {"params": params, **common}
        mp = add(Step("dedup-paragraph-map", "dedup-paragraph-map", cfg, base + prev, "pipeline.dedup.paragraph:map_shard",
                      version=COMBINE_VERSION, shards=per_doc(lambda kept, d, stats, params=params: {"params": params, "partitions": _partitions(
                          dd, kept * PARAGRAPHS_PER_DOC)}, prev)))
        rd = add(Step("dedup-paragraph-reduce", "dedup-paragraph-reduce", {"params": params}, [mp],
                      "pipeline.dedup.paragraph:reduce_shard", shards=reduce_specs(mp, {"params": params})))
        layers.append(apply_step("paragraph", rd, "pipeline.dedup.paragraph:apply_shard", None, prev,
                                 {"params": params, "tokenizer_id": plan.tokenizer_id}, {"tokenizer": plan.tokenizer}, combined=mp))
    return layers
