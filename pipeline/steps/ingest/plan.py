"""The ingest stage: per source, its inputs to normalised document shards.

    scan-<source>        line counts of large compressed inputs, so they can be split
    ids-<source>, merge-ids-<source>, unique-ids-<source>
                         with id_field: ids used twice in the source (ids.py)
    ingest-<source>      inputs -> document shards (+ quarantine) (documents.py, web.py)
    merge-id-index-<source>, id-index-<source>
                         id -> (shard, row), for `curate explain --id` (idindex.py)

Both shuffles pass the merge tier (pipeline/steps/merge.py): a reducer reads at most 64
files whatever the number of shards (an empty step below 33 shards).

Publishes `quarantine/<source>/part-XXXXX.jsonl`: the records set aside, with their place
and error.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pipeline.engine.step import Step, shard_name
from pipeline.io import fs
from pipeline.io.atomic import link_tree
from pipeline.plan import code
from pipeline.plan.context import Context
from pipeline.plan.sources import fingerprint
from pipeline.steps.ingest import documents, idindex, ids, splits
from pipeline.steps.merge import merge_step, read_from
from pipeline.plan.stage import Stage, texts


def plan(ctx: Context) -> list[Step]:
    steps: list[Step] = []
    for sname, spec in ctx.mixture.sources.items():
        steps += _source(ctx, sname, spec)
    return steps


def _source(ctx: Context, sname: str, spec) -> list[Step]:
    steps = []
    verify = ctx.mixture.inputs.verify
    content = verify == "content"
    # with inputs.verify: content a split names its files without their times: those are the shard's
    # `stamp`, left out of its partial key; where a stamp moved the task reads the file and links its
    # earlier shard when the bytes are the same (verify.py)
    fdicts = [{k: v for k, v in f.to_dict().items() if not (content and k == "mtime_ns")} for f in ctx.files[sname]]
    by_path = {f.path: f for f in ctx.files[sname]}
    keyed = {"read_keyed": ("stamp",)} if content else {}

    def stamped(spec: dict, paths: list[str]) -> dict:
        if not content:
            return spec
        return {**spec, "verify": "content", "stamp": {p: fingerprint(by_path[p], verify)["ctime_ns"] for p in paths}}
    web_formats = sorted({f["format"] for f in fdicts} & {"warc", "html"})
    extract = spec.extractor(web_formats[0] if web_formats else None)
    ctx.extracts[sname] = bool(extract)
    to_scan = [f for f in fdicts if splits.needs_scan(f, spec.max_shard_bytes)]
    scan = None
    if to_scan:
        scan = Step(
            f"scan-{sname}", "scan", {"files": [fingerprint(by_path[f["path"]], verify) for f in to_scan]}, [],
            splits.scan_shard, shards=lambda st, stats: [stamped({**f, "describe": f"scan {f['path']}"}, [f["path"]])
                                                          for f in to_scan], shard_free=("files",), **keyed,
        )
        steps.append(scan)
    ing_cfg = {
        "source": sname, "files": [fingerprint(f, verify) for f in ctx.files[sname]],
        "text_field": spec.text_field, "id_field": spec.id_field, "hf_split": spec.hf_split,
        "hf_builder": spec.hf_builder, "on_bad_record": spec.on_bad_record, "max_shard_rows": spec.max_shard_rows,
        "max_shard_bytes": spec.max_shard_bytes, "max_doc_bytes": spec.max_doc_bytes, "tokenizer": ctx.tokenizer_id,
    }
    if extract:  # only web sources carry these keys: other sources' hashes stay as they were
        ing_cfg.update({"extract": extract, "html_field": spec.html_field})
    count_tokens = not (extract or spec.filters)  # a filtered source's tokens are counted by its filter step, kept documents only
    if not count_tokens:
        ing_cfg["count_tokens"] = False

    planned: dict = {}  # the last splits, and the scan counts they were planned with

    def ingest_shards(st, stats, duplicates=None):
        dups = {"duplicates": str(duplicates.dir(ctx.store)), "duplicate_files": len(stats[duplicates.name])} \
            if duplicates else {"duplicates": None}
        # the splits with an id used again (a marker without the list: every split reads the step)
        marks = list(stats[duplicates.name].values()) if duplicates else []
        with_dups = None if any("splits" not in m for m in marks) else {i for m in marks for i in m["splits"]}
        counts = {m["path"]: m["lines"] for m in stats.get(scan.name, {}).values()} if scan else {}
        key = tuple(sorted(counts.items()))
        if planned.get("key") != key:  # the ids step and the ingest step split the same files: footers read once
            planned.update(key=key, parts=splits.plan_splits(fdicts, spec.model_dump(), counts))
        parts = planned["parts"]
        common = {"source": sname, "text_field": spec.text_field, "id_field": spec.id_field,
                  "hf_split": spec.hf_split, "on_bad_record": spec.on_bad_record, "tokenizer": ctx.tokenizer,
                  "max_doc_bytes": spec.max_doc_bytes, **dups,
                  "extract": extract, "html_field": spec.html_field, "count_tokens": count_tokens}
        return [stamped({**common, **({"duplicates": None, "duplicate_files": None} if with_dups is not None and j not in with_dups
                                      else {}), "split": sp, "describe": sp["describe"]}, splits.paths(sp))
                for j, sp in enumerate(parts)]

    before = [scan] if scan else []
    shards = ingest_shards
    if spec.id_field:  # ids must be unique within the source: checked before ingest (ids.py)
        def id_shards(st, stats):
            specs = ingest_shards(st, stats)
            n = ids.partitions(len(specs) * spec.max_shard_rows)
            return [{**s, "partitions": n} for s in specs]

        idm = Step(f"ids-{sname}", "ids-map", ing_cfg, before, ids.map_shard, shards=id_shards, shard_free=("files",),
                   **keyed)
        idmg = merge_step(f"merge-ids-{sname}", idm, ["buckets"], lambda stats: len(stats[idm.name]), ctx.store, ctx.engine)

        def unique_shards(st, stats) -> list[ids.IdsReduceSpec]:
            ms = stats[idm.name]
            n = ms[0]["partitions"] if ms else 0
            folder, files = read_from(stats, idm, idmg, len(ms), ctx.store)
            return [{"source": sname, "partition": p, "maps_dir": str(idm.dir(ctx.store)), "maps": len(ms),
                     "inputs": str(fs.path(folder) / "buckets"), "files": files,
                     "on_bad_record": spec.on_bad_record, "describe": f"{sname} ids, partition {p}"} for p in range(n)]

        idr = Step(f"unique-ids-{sname}", "ids-reduce", {"on_bad_record": spec.on_bad_record}, [idm, idmg], ids.reduce_shard,
                   shards=unique_shards)
        steps += [idm, idmg, idr]
        before = before + [idr]
        shards = functools.partial(ingest_shards, duplicates=idr)

    def indexed(st, stats):  # every shard writes its part of the id index
        specs = shards(st, stats)
        n = idindex.partitions(len(specs) * spec.max_shard_rows)
        return [{**s, "index_partitions": n} for s in specs]

    # a shard's spec names its own file (with its size and mtime): the others' are left out of its key
    ing = Step(f"ingest-{sname}", "ingest", ing_cfg, before, documents.run_shard, shards=indexed,
               code=code.extract_code(extract) if extract else {}, shard_free=("files",), **keyed)  # the extractor's libraries or function

    ingm = merge_step(f"merge-id-index-{sname}", ing, ["index"], lambda stats: len(stats[ing.name]), ctx.store, ctx.engine)

    def index_shards(st, stats) -> list[idindex.IdIndexSpec]:
        ms = stats[ing.name]
        n = ms[0]["index_partitions"] if ms else 0
        folder, files = read_from(stats, ing, ingm, len(ms), ctx.store)
        return [{"inputs": str(fs.path(folder) / "index"), "files": files, "partition": p,
                 "describe": f"{sname} id index, range {p}"} for p in range(n)]

    idx = Step(f"id-index-{sname}", "id-index", {}, [ing, ingm], idindex.reduce_shard, shards=index_shards)
    ctx.ingest[sname] = ing
    ctx.declare("ingest", ing, sname)
    ctx.declare("id_index", idx, sname)
    return steps + [ing, ingm, idx]


def publish(ctx: Context, stats: dict) -> dict:
    """quarantine/<source>/part-XXXXX.jsonl: links to (or copies of) each ingest shard's quarantine file."""
    pairs: list[tuple[Path, str]] = []
    for sname, ing in ctx.ingest.items():
        for i, m in sorted(stats[ing.name].items()):
            if m.get("quarantine_file"):
                pairs.append((fs.path(m["quarantine_file"]), f"{sname}/{shard_name(i)}.jsonl"))
    link_tree(pairs, ctx.run_dir / "quarantine")
    return {}


STAGE = Stage("ingest", plan, publish=publish, outputs=("quarantine",), tasks=texts("ingest"))
