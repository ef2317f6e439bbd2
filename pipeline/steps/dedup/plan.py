"""The dedup stage's plan: exact, fuzzy and paragraph dedup over every document shard
(plan/context.py: `doc_shards`), each kind a short chain of steps whose apply step is a
global attribute layer.

Partitions: `dedup.partitions`, or one per PARTITION_ROWS shuffle rows (documents for
exact, documents x bands for fuzzy, paragraphs for paragraph dedup), so a reduce task
holds at most about PARTITION_ROWS rows (~40 bytes each, plus the id strings).
"""

from __future__ import annotations

from collections.abc import Iterator

import itertools
import math

from pipeline.engine.step import Step, shard_name
from pipeline.io import fs
from pipeline.plan import code
from pipeline.plan.context import Context
from pipeline.shards import apply, combine, kmeans
from pipeline.steps.dedup import exact, fuzzy, paragraph, salt, semantic
from pipeline.steps.merge import merge_step, read_from
from pipeline.plan.stage import Stage, texts

PARTITION_ROWS = 4_000_000
PARAGRAPHS_PER_DOC = 8  # a planning guess: web pages have a few to a few dozen
VERIFY_TEXT_BYTES = 64 << 20  # text per fuzzy verify partition (its shingle sets take about as much again)
SEMANTIC_ROWS = 500_000  # documents per semantic reduce partition (~600 bytes each: vector, id, keys)
SEMANTIC_DOCS_PER_CLUSTER = 2_000  # default k-means clusters: one per this many documents ...
SEMANTIC_SAMPLE_PER_CLUSTER = 20  # ... and at least this many sampled documents per centroid


def outputs(stats: dict, step: Step) -> int:
    """How many shuffle outputs a decision step wrote: one per shard, or what its marker says."""
    ms = stats[step.name]
    return ms[0].get("outputs", len(ms)) if 0 in ms else len(ms)


def _partitions(cfg, rows: int) -> int:
    """`dedup.partitions` is a floor: a reducer never gets more than PARTITION_ROWS rows."""
    return max(cfg.partitions or 1, math.ceil(rows / PARTITION_ROWS))


def _describe(d: dict) -> str:
    return f"{d['source']}/{shard_name(d['part'])}"


def plan(ctx: Context) -> list[Step]:
    """The dedup steps, in order; each kind's apply step becomes a global layer (ctx.layers)."""
    dd = ctx.mixture.dedup
    if dd is None:
        return []
    m = ctx.mixture
    names = list(m.sources)
    rk = ctx.ranks()
    rank_source = sorted(rk, key=rk.get)
    common = {"ranks": rk, "partitions": dd.partitions}
    # survivors by place (the first file, then row) rather than id: carried only then, so id's hashes stay as they were
    placed = {"order": "place"} if dd.order == "place" else {}
    base = ctx.base()
    steps: list[Step] = []

    def add(step: Step) -> Step:
        steps.append(step)
        return step

    def per_doc(extra, prev):
        def shards(st, stats):  # two passes over the shards, one dict at a time: specs are yielded, not listed
            kept = sum(x["kept"] for x in ctx.doc_shards(stats, prev))  # once per step, not per shard
            return ({"doc": d, **extra(kept, d, stats), "describe": _describe(d)} for d in ctx.doc_shards(stats, prev))
        return shards

    def merged(src: Step, subs: list[str], count, split: bool = True) -> Step:
        """The merge tier after `src`'s shuffle files (pipeline/steps/merge.py)."""
        return add(merge_step(f"{src.name}-merge", src, subs, count, ctx.store, ctx.engine, split))

    def reduce_specs(map_step, mg, extra):
        def shards(st, stats):
            ms = stats[map_step.name]
            count = ms[0]["partitions"] if ms else 0
            folder, files = read_from(stats, map_step, mg, len(ms), ctx.store)
            offsets, ndocs = ctx.slot_offsets(stats)
            more = extra(stats) if callable(extra) else extra
            return [{"inputs": str(fs.path(folder) / "buckets"), "maps": files, "partition": p,
                     "offsets": offsets, "ndocs": ndocs, "sources": names, "rank_source": rank_source, **more,
                     "describe": f"partition {p}"} for p in range(count)]
        return shards

    def reducer(name: str, cfg: dict, map_step: Step, fn, extra) -> Step:
        mg = merged(map_step, ["buckets"], lambda stats: len(stats[map_step.name]))
        return add(Step(name, name, cfg, [map_step, mg], fn, shards=reduce_specs(map_step, mg, extra)))

    def apply_step(kind: str, decisions: Step, fn, columns: dict | None, prev, cfg=None, extra=None,
                   combined: Step | None = None) -> Step:
        def rest(d, stats):  # the map's rest file for this shard (pipeline/shards/combine.py)
            if combined is None:
                return {}
            n = stats[combined.name][d["k"]].get("rest", 0)
            return {"combined": True, "rest": str(combine.rest_path(combined.dir(ctx.store) / "rest", d["k"])) if n else None}

        mg = merged(decisions, ["to"], lambda stats: outputs(stats, decisions))

        def back(stats):
            folder, files = read_from(stats, decisions, mg, outputs(stats, decisions), ctx.store)
            return {"decisions": folder, "reducers": files}

        return add(Step(
            f"dedup-{kind}", f"dedup-{kind}", {"columns": columns, **(cfg or {})}, [decisions, mg], fn,
            shards=per_doc(lambda kept, d, stats: {**back(stats), "slot": d["slot"], "columns": columns, **(cfg or {}), **(extra or {}),
                                                   **rest(d, stats)},
                           prev), position_free=True, read_keyed=("layers", "decisions", "rest"),  # rest: the map's, resolved into what the read key digests
        ))

    if dd.exact:
        prev = list(ctx.layers)
        by = {} if dd.exact.key == "text" else {"key": dd.exact.key, "url_field": dd.exact.url_field,
                                                 "date_field": dd.exact.date_field}  # text keys keep their old hashes
        cfg = {"normalize": dd.exact.normalize, **by, **common, **placed}
        mp = add(Step("dedup-exact-map", "dedup-exact-map", cfg, base + prev, exact.map_shard, shards=per_doc(lambda kept, d, stats: {"normalize": dd.exact.normalize, **by,
                                                            **placed, "partitions": _partitions(dd, kept)}, prev),
                      code=code.code(None, ["python"] if by else []), position_free=True, read_keyed=("layers",)))  # crawl dates: Python's datetime.fromisoformat
        rd = reducer("dedup-exact-reduce", {**placed}, mp, exact.reduce_shard, {**({"reason": "url_duplicate_of"} if by else {}), **placed})
        ctx.add_layer(apply_step("exact", rd, apply.run_shard, exact.COLUMNS, prev, combined=mp), "dedup:exact")

    if dd.fuzzy:
        prev = list(ctx.layers)
        fz = dd.fuzzy
        params = {**fz.model_dump(mode="json"), "rows": fz.rows or fz.num_perm // fz.bands}
        # the threshold is verify's alone: a threshold edit reuses the signatures, buckets and fetched texts
        hashing = {k: v for k, v in params.items() if k != "threshold"}
        cfg = {"params": hashing, **common}
        hv = heavy_steps(ctx, add, hashing, prev, base)

        def heavy(stats, hv=hv, table=str(hv.dir(ctx.store) / salt.TABLE)) -> dict:  # when a bucket is cut (salt.py)
            m = stats[hv.name][0] if stats[hv.name] else {}
            return {"virtual": m["virtual"], "heavy": table} if m.get("virtual") else {}

        def reduce_heavy(stats, sig_name="dedup-fuzzy-signatures") -> dict:  # read by the blocks' reducers only
            h = heavy(stats)
            return {"heavy": h["heavy"], "ordinary": stats[sig_name][0]["partitions"] - h["virtual"]} if h else {}

        sig = add(Step("dedup-fuzzy-signatures", "dedup-fuzzy-signatures", cfg, base + prev + [hv],
                       fuzzy.sig_shard,
                       shards=per_doc(lambda kept, d, stats, params=hashing: {"params": params, "partitions": _partitions(
                           dd, kept * fz.bands), **heavy(stats)}, prev), position_free=True, read_keyed=("layers",)))
        bk = reducer("dedup-fuzzy-buckets", {}, sig, fuzzy.buckets_shard, reduce_heavy)
        bkm = merged(bk, ["to"], lambda stats, bk=bk: len(stats[bk.name]))

        def fetch_shards(st, stats, prev=prev, params=hashing, sig=sig, bk=bk, bkm=bkm) -> Iterator[fuzzy.FetchSpec]:
            pairs = sum(m["pairs"] for m in stats[bk.name].values())
            docs = sum(m["docs"] for m in stats[sig.name].values())
            avg = sum(m["text_bytes"] for m in stats[sig.name].values()) / max(1, docs)
            nparts = max(dd.partitions or 1, math.ceil(2 * pairs * avg / VERIFY_TEXT_BYTES))
            folder, files = read_from(stats, bk, bkm, len(stats[bk.name]), ctx.store)
            return ({"doc": d, "slot": d["slot"], "pairs": folder, "pair_files": files, "params": params,
                     "partitions": nparts, "describe": _describe(d)} for d in ctx.doc_shards(stats, prev))

        fe = add(Step("dedup-fuzzy-fetch", "dedup-fuzzy-fetch", {"params": hashing}, [bk, bkm],
                      fuzzy.fetch_shard, shards=fetch_shards, position_free=True,
                      read_keyed=("layers", "pairs")))  # its own rows' pairs: an old shard a new file adds none to links
        fem = merged(fe, ["pairs", "texts"], lambda stats, fe=fe: len(stats[fe.name]), split=True)  # texts

        def verify_shards(st, stats, fe=fe, fem=fem, params=params) -> list[fuzzy.VerifySpec]:
            folder, files = read_from(stats, fe, fem, len(stats[fe.name]), ctx.store)
            n = stats[fe.name][0]["partitions"] if stats[fe.name] else 0
            prior = fuzzy.verified_before(ctx.store, st, params, n) if n else []
            return [{"fetched": folder, "maps": files, "partition": v, "params": params, "describe": f"pair partition {v}",
                     "prior": [f"{d}/{shard_name(v)}.parquet" for d in prior]} for v in range(n)]

        vf = add(Step("dedup-fuzzy-verify", "dedup-fuzzy-verify", {"params": params}, [fe, fem],
                      fuzzy.verify_shard, shards=verify_shards))
        src_rank = [rk[s] for s in names]
        cl = add(Step("dedup-fuzzy-clusters", "dedup-fuzzy-clusters", {**placed}, [vf], fuzzy.clusters_shard, cpus=0,
                      shards=lambda st, stats, vf=vf: [{"edges": str(vf.dir(ctx.store)), "sources": names, **placed,
                                                 "src_rank": src_rank, "partitions": dd.partitions,
                                                 "verified": len(stats[vf.name]),
                                                 "edge_count": sum(m["edges"] for m in stats[vf.name].values()),
                                                 **dict(zip(("offsets", "ndocs"), ctx.slot_offsets(stats))),
                                                 "layout": {"group": ctx.engine.shuffle_group,
                                                            "fanin": ctx.engine.shuffle_fanin,
                                                            "local_edges": ctx.engine.fuzzy_local_edges},
                                                 "describe": "connected components"}]))
        cl.meta["engine"] = {"fuzzy_local_edges": ctx.engine.fuzzy_local_edges}
        ctx.add_layer(apply_step("fuzzy", cl, apply.run_shard, fuzzy.COLUMNS, prev), "dedup:fuzzy")

    if dd.paragraph:
        prev = list(ctx.layers)
        params = dd.paragraph.model_dump(mode="json")
        cfg = {"params": params, **common, **placed}
        mp = add(Step("dedup-paragraph-map", "dedup-paragraph-map", cfg, base + prev, paragraph.map_shard, shards=per_doc(lambda kept, d, stats, params=params: {"params": params, **placed, "partitions": _partitions(
                          dd, kept * PARAGRAPHS_PER_DOC)}, prev), position_free=True, read_keyed=("layers",)))
        rd = reducer("dedup-paragraph-reduce", {"params": params, **placed}, mp, paragraph.reduce_shard, {"params": params, **placed})
        ctx.add_layer(apply_step("paragraph", rd, paragraph.apply_shard, None, prev,
                                 {"params": params, "tokenizer_id": ctx.tokenizer_id}, {"tokenizer": ctx.tokenizer}, combined=mp),
                      "dedup:paragraph")
    if dd.semantic:
        semantic_steps(ctx, dd, add, per_doc, reducer, apply_step, base, placed)
    return steps


def heavy_steps(ctx: Context, add, params: dict, prev: list, base: list) -> Step:
    """sample -> heavy: the LSH buckets to cut into blocks (pipeline/steps/dedup/salt.py);
    both have no task below `salt_rows` kept documents."""
    most = ctx.engine.fuzzy_salt_rows
    smp = add(Step("dedup-fuzzy-sample", "dedup-fuzzy-sample", {"params": params, "salt_rows": most, "ranks": ctx.ranks()},
                   base + prev, salt.sample_shard, shards=lambda st, stats: sample_specs(ctx, stats, prev, params, most)))
    smp.meta["engine"] = {"fuzzy_salt_rows": most}

    def heavy_specs(st, stats):
        n = len(stats[smp.name])
        return [{"samples": str(smp.dir(ctx.store)), "files": n, "rate": salt.rate(most), "salt_rows": most,
                 "describe": "heavy buckets"}] if n else []

    hv = add(Step("dedup-fuzzy-heavy", "dedup-fuzzy-heavy", {}, [smp], salt.heavy_shard, shards=heavy_specs))
    hv.meta["may_be_empty"] = True  # planned before its lease (a count): with no task it takes none
    return hv


def sample_specs(ctx: Context, stats: dict, prev: list, params: dict, most: int):
    """A spec per GROUP document shards, yielded; none when no bucket can pass `most` rows."""
    if sum(d["kept"] for d in ctx.doc_shards(stats, prev)) <= most:
        return
    group: list[dict] = []
    for d in itertools.chain(ctx.doc_shards(stats, prev), [None]):
        if group and (d is None or len(group) == salt.GROUP):
            yield {"docs": group, "params": params, "rate": salt.rate(most),
                   "describe": f"{_describe(group[0])} and {len(group) - 1} more"}
            group = []
        if d is not None:
            group.append(d)


def semantic_steps(ctx: Context, dd, add, per_doc, reducer, apply_step, base, placed: dict) -> None:
    """sample -> centroids -> map -> reduce -> apply (pipeline/steps/dedup/semantic.py)."""
    from filters import embeddings

    prev = list(ctx.layers)
    sem = dd.semantic
    params = code.portable(sem.model_dump(mode="json"))  # a model folder by its files, not its place
    if params.get("cluster_rows") == SEMANTIC_DOCS_PER_CLUSTER:  # the default: the steps keep their earlier hashes
        params.pop("cluster_rows")
    # a threshold or overlap edit re-runs the reduce and apply only (the map's sketches do not depend on the value)
    fit = {k: v for k, v in params.items() if k not in ("threshold", "min_overlap")}
    common = {"ranks": ctx.ranks(), "partitions": dd.partitions}
    emb = [ctx.provider("embeddings", s) for s in ctx.mixture.sources]
    dim = embeddings.identity(sem.model)["dim"]

    def emb_path(d: dict) -> str:
        return str(apply.attribute_path(ctx.provider("embeddings", d["source"]).dir(ctx.store), d["source"], d["part"]))

    sample = add(Step("dedup-semantic-sample", "dedup-semantic-sample", {"params": fit, **common}, base + prev + emb,
                      kmeans.sample_shard, shards=per_doc(lambda kept, d, stats: {
                          "embedding": emb_path(d), "seed": sem.seed, "rate": sem.sample / max(1, kept)}, prev)))

    def centroid_shards(st, stats):
        kept = sum(m["rows"] for m in stats[sample.name].values())
        sampled = sum(m["sampled"] for m in stats[sample.name].values())
        k = sem.clusters or max(1, min(math.ceil(kept / sem.cluster_rows), sampled // SEMANTIC_SAMPLE_PER_CLUSTER))
        return [{"samples": str(sample.dir(ctx.store)), "shards": len(stats[sample.name]),
                 "clusters": k, "seed": sem.seed, "dim": dim, "describe": "k-means"}]

    cents = add(Step("dedup-semantic-centroids", "dedup-semantic-centroids", {"params": fit}, [sample],
                     kmeans.centroids_shard, shards=centroid_shards))

    def wanted(kept, stats) -> int:  # clusters two levels aim at (0: the coarse centroids alone)
        return 0 if sem.clusters else semantic.wanted_clusters(kept, stats[cents.name][0]["clusters"], sem.cluster_rows)

    def fine_extra(kept, d, stats):
        want = wanted(kept, stats)
        return {"embedding": emb_path(d), "centroids": stats[cents.name][0]["centroids"], "dim": dim, "seed": sem.seed,
                "rate": min(1.0, semantic.FINE_SAMPLE * want / max(1, kept)) if want else 0.0,
                "partitions": max(1, math.ceil(semantic.FINE_SAMPLE * want / semantic.FINE_ROWS))}

    fsample = add(Step("dedup-semantic-fine-sample", "dedup-semantic-fine-sample", {"params": fit, **common},
                       base + prev + emb + [cents], semantic.fine_sample_shard, shards=per_doc(fine_extra, prev),
                       position_free=True))
    fine = reducer("dedup-semantic-fine", {"params": fit}, fsample, semantic.fine_shard, {"seed": sem.seed, "dim": dim})

    def map_extra(kept, d, stats):
        k = stats[cents.name][0]["clusters"] + sum(m.get("fine", 0) for m in stats[fine.name].values())
        fine_parts = len(stats[fine.name]) if any(m.get("fine") for m in stats[fine.name].values()) else 0
        return {"embedding": emb_path(d), "centroids": stats[cents.name][0]["centroids"], "dim": dim,
                "sketch": sem.min_overlap is not None,
                **({"fine": str(fine.dir(ctx.store)), "fine_parts": fine_parts} if fine_parts else {}),
                "partitions": max(1, min(k, max(dd.partitions or 1, math.ceil(kept / SEMANTIC_ROWS))))}

    sketch = {"sketch": True} if sem.min_overlap is not None else {}  # words for min_overlap: the map alone
    mp = add(Step("dedup-semantic-map", "dedup-semantic-map", {"params": {**fit, **sketch}, **common},
                  base + prev + emb + [cents, fine],
                  semantic.map_shard, shards=per_doc(map_extra, prev), position_free=True))
    rd = reducer("dedup-semantic-reduce", {"params": params, **placed}, mp, semantic.reduce_shard, {"params": params, **placed})
    ctx.add_layer(apply_step("semantic", rd, apply.run_shard, semantic.COLUMNS, prev), "dedup:semantic")


STAGE = Stage("dedup", plan, tasks=texts("dedup-fuzzy-signatures", "dedup-fuzzy-fetch", "dedup-fuzzy-verify",
                                          "dedup-paragraph-map", "dedup-paragraph"))
