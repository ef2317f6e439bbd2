"""`curate diff RUN_A RUN_B [--out F.parquet] [--samples N]`: what an edit changed.

The experiment loop is copy a YAML, change a weight or a threshold, run, compare. This
compares two run directories: the config (YAML keys changed, old -> new), the steps
(shared through the store, only in A, only in B), per source the documents and tokens in
the mixture and the realised weights side by side (manifest.json), the removals per stage
and reason with their delta (ledger.json), and the documents that changed fate: kept in A
and removed in B, the reverse, and removed by another stage, each with the stage
responsible (B's stage for a removal, A's for a rescue). A run whose input files were cut
(ledger conservation "unknown") is named first with those files: its counts leave out
records nobody read.

Documents are compared shard by shard: for a source whose ingest step both runs share, each
ingest shard's decisions (pipeline.shards.decisions.shard_decisions) are computed for A and for
B and compared row by row; only the changed rows are kept, written to `--out` as they come,
and a seeded sample of each kind (the N smallest hashes of seed, source and id) is kept
for `--samples`. Memory is one shard plus the samples.
"""

from __future__ import annotations

import hashlib
import heapq

import numpy as np
import orjson
import pyarrow as pa

from pipeline.shards import decisions, ledger
from pipeline.errors import UsageError
from pipeline.io import atomic, fs

KINDS = ("kept -> removed", "removed -> kept", "removed by another stage")
SCHEMA = pa.schema([("source", pa.string()), ("id", pa.string()), ("kind", pa.string()), ("stage", pa.string()),
                    ("a_status", pa.string()), ("a_stage", pa.string()), ("a_reason", pa.string()),
                    ("b_status", pa.string()), ("b_stage", pa.string()), ("b_reason", pa.string())])


def _flat(d, prefix="") -> dict:
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def config_changes(a: dict, b: dict) -> list[tuple[str, object, object]]:
    fa, fb = _flat(a), _flat(b)
    missing = object()
    out = []
    for k in sorted(set(fa) | set(fb)):
        va, vb = fa.get(k, missing), fb.get(k, missing)
        if va != vb:
            out.append((k, None if va is missing else va, None if vb is missing else vb))
    return out


def _step_names(rec: dict) -> dict[str, str]:
    """step name -> store directory name (name-hash16)."""
    return {k: v["dir"].rstrip("/").rsplit("/", 1)[-1] for k, v in rec["steps"].items()}


def _prio(seed: int, source: str, doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}\0{source}\0{doc_id}".encode(), digest_size=8).digest(), "big")


def fates(a: decisions.Run, b: decisions.Run, out=None, samples: int = 0, seed: int = 0) -> dict:
    """Documents changing fate, counted by (source, kind, stage); changed rows streamed to `out`."""
    counts: dict[tuple[str, str, str], int] = {}
    skipped: dict[str, str] = {}
    heaps: dict[str, list] = {k: [] for k in KINDS}
    writer, tmp = None, None
    if out is not None:
        tmp = atomic.tmp_path(out)
        writer = atomic.parquet_writer(tmp, SCHEMA, compression="zstd")
    compared = 0
    try:
        for source in a.all_sources:
            if source not in b.config["sources"]:
                skipped[source] = "only in A"
                continue
            ia, ib = a.step("ingest", source), b.step("ingest", source)
            if not ia or not ib or _name(ia) != _name(ib):
                skipped[source] = "its ingest step differs between the runs, so its documents are not the same rows"
                continue
            for part in a.shards(source):
                da = decisions.shard_decisions(a, source, part)
                db = decisions.shard_decisions(b, source, part)
                compared += da.num_rows
                sa, sb = np.array(da.column("status").to_pylist(), object), np.array(db.column("status").to_pylist(), object)
                ga, gb = np.array(da.column("stage").to_pylist(), object), np.array(db.column("stage").to_pylist(), object)
                kind = np.full(len(sa), None, object)
                kind[(sa == "kept") & (sb == "removed")] = KINDS[0]
                kind[(sa == "removed") & (sb == "kept")] = KINDS[1]
                kind[(sa == "removed") & (sb == "removed") & (ga != gb)] = KINDS[2]
                rows = np.flatnonzero(kind != None)  # noqa: E711 -- elementwise
                if not len(rows):
                    continue
                stage = np.where(kind[rows] == KINDS[1], ga[rows], gb[rows])
                ids = da.column("id").to_pylist()
                ra, rb = da.column("reason").to_pylist(), db.column("reason").to_pylist()
                for j, i in enumerate(rows):
                    key = (source, kind[i], stage[j])
                    counts[key] = counts.get(key, 0) + 1
                    if samples:
                        h = heaps[kind[i]]
                        item = (-_prio(seed, source, ids[i]), source, str(part), int(i), ids[i], stage[j],
                                (sa[i], ga[i], ra[i]), (sb[i], gb[i], rb[i]))
                        if len(h) < samples:
                            heapq.heappush(h, item)
                        elif item[0] > h[0][0]:
                            heapq.heapreplace(h, item)
                if writer is not None:
                    writer.write_table(pa.table({
                        "source": [source] * len(rows), "id": [ids[i] for i in rows], "kind": list(kind[rows]),
                        "stage": list(stage), "a_status": list(sa[rows]), "a_stage": list(ga[rows]),
                        "a_reason": [ra[i] for i in rows], "b_status": list(sb[rows]), "b_stage": list(gb[rows]),
                        "b_reason": [rb[i] for i in rows]}, schema=SCHEMA))
    finally:
        if writer is not None:
            writer.close()
    if tmp is not None:
        atomic.commit(tmp, out)
    picked = {k: sorted((-x[0], *x[1:]) for x in h) for k, h in heaps.items()}
    return {"counts": counts, "skipped": skipped, "compared": compared, "samples": picked}


def _config(run: decisions.Run) -> dict:
    """The run's recorded config, with each used filter's parameters as its filter step
    resolved them (runs recorded before run.json carried filter parameters kept only `type`)."""
    cfg = {**run.config, "filters": dict(run.config.get("filters") or {})}
    for source in decisions.sources_with(run.record, "filter"):
        if (d := run.role_dir("filter", source)) is not None:
            for fname, params in atomic.read_json(d / "step.json")["config"].get("filters", []):
                if fname in cfg["filters"] and not fname.startswith("_"):
                    cfg["filters"][fname] = params
    return cfg


def _name(step_rec: dict) -> str:
    return step_rec["dir"].rstrip("/").rsplit("/", 1)[-1]


def _texts(picks: list) -> list[str]:
    from pipeline.shards import view

    out = []
    for _p, _source, part, row, *_ in picks:
        t = view.read_rows(part, [], np.array([row]), ["text"])
        out.append(t.column("text")[0].as_py())
    return out


def _open(run_dir) -> decisions.Run:
    d = fs.path(run_dir)
    if not (d / "run.json").exists():
        raise UsageError(f"{run_dir}: not a run directory (no run.json); give two paths `curate run` printed, e.g. out/demo out/demo-b")
    if not (d / "manifest.json").exists():
        raise UsageError(f"{run_dir}: the run has not finished (no manifest.json); diff compares finished runs")
    return decisions.Run(d)


def diff(run_a, run_b, out=None, samples: int = 0, seed: int = 0) -> tuple[dict, str]:
    a, b = _open(run_a), _open(run_b)
    lines = [f"A: {run_a}  ({a.record['name']}, {a.record.get('mixture_file')})",
             f"B: {run_b}  ({b.record['name']}, {b.record.get('mixture_file')})", ""]
    la, lb = (atomic.read_json(r.dir / "ledger.json") for r in (a, b))
    unread = {"a": ledger.unread_files(la), "b": ledger.unread_files(lb)}  # conservation "unknown": files cut
    lines += [f"{k.upper()}: unknown loss: {ledger.describe_unread(v)}" for k, v in unread.items() if v]
    lines += [""] if any(unread.values()) else []
    changes = config_changes(_config(a), _config(b))
    lines.append(f"config: {len(changes)} keys differ")
    for k, va, vb in changes:
        lines.append(f"  {k}: {_j(va)} -> {_j(vb)}")
    sa, sb = _step_names(a.record), _step_names(b.record)
    shared = sorted(k for k in sa if sb.get(k) == sa[k])
    only_a, only_b = sorted(v for k, v in sa.items() if sb.get(k) != v), sorted(v for k, v in sb.items() if sa.get(k) != v)
    lines += ["", f"steps: {len(shared)} shared, {len(only_a)} only in A, {len(only_b)} only in B"]
    if only_a:
        lines.append("  only in A: " + ", ".join(only_a))
    if only_b:
        lines.append("  only in B: " + ", ".join(only_b))
    ma, mb = (atomic.read_json(r.dir / "manifest.json") for r in (a, b))
    lines += ["", "mixture          docs A      docs B      tokens A      tokens B   weight A  weight B  target A  target B"]
    for s in _order(ma["sources"], mb["sources"]):
        xa, xb = ma["sources"].get(s, {}), mb["sources"].get(s, {})
        lines.append(f"  {s:<12} {_n(xa.get('docs')):>9} {_n(xb.get('docs')):>11} {_n(xa.get('realized_tokens')):>13} "
                     f"{_n(xb.get('realized_tokens')):>13} {_w(xa.get('realized_weight')):>9} {_w(xb.get('realized_weight')):>9} "
                     f"{_w(xa.get('weight')):>9} {_w(xb.get('weight')):>9}")
    lines.append(f"  {'total':<12} {_n(ma['total_docs']):>9} {_n(mb['total_docs']):>11} {_n(ma['total_tokens']):>13} {_n(mb['total_tokens']):>13}")
    ca, cb = ma.get("cells") or {}, mb.get("cells") or {}
    if set(ca) | set(cb) != set(ma["sources"]) | set(mb["sources"]):  # cells other than whole sources: side by side
        width = max([14] + [len(c) for c in set(ca) | set(cb)])
        lines += ["", f"{'cells':<{width + 2}} {'docs A':>9} {'docs B':>11} {'tokens A':>13} {'tokens B':>13} {'weight A':>9} "
                      f"{'weight B':>9} {'target A':>9} {'target B':>9}"]
        for c in _order(ca, cb):
            xa, xb = ca.get(c, {}), cb.get(c, {})
            lines.append(f"  {c:<{width}} {_n(xa.get('documents')):>9} {_n(xb.get('documents')):>11} {_n(xa.get('tokens')):>13} "
                         f"{_n(xb.get('tokens')):>13} {_w(xa.get('realized_weight')):>9} {_w(xb.get('realized_weight')):>9} "
                         f"{_w(xa.get('target_weight')):>9} {_w(xb.get('target_weight')):>9}")
    removals = _removals(la, lb)
    moved = [r for r in removals if r[3] != r[4]]
    lines += ["", f"removals by stage and reason (ledger.json: {len(moved)} of {len(removals)} rows differ)",
              f"  {'source':<10} {'stage':<26} {'reason':<30} {'A':>8} {'B':>8} {'delta':>8}"]
    for src, st, rs, na, nb in moved:
        lines.append(f"  {src:<10} {st:<26} {rs:<30} {na:>8,} {nb:>8,} {nb - na:>+8,}")
    f = fates(a, b, fs.path(out) if out else None, samples, seed)
    lines += ["", f"documents changing fate ({f['compared']:,} documents compared, shard by shard)"]
    for kind in KINDS:
        rows = sorted(((src, st, n) for (src, k, st), n in f["counts"].items() if k == kind), key=lambda x: (-x[2], x[0], x[1] or ""))
        total = sum(n for *_, n in rows)
        detail = ", ".join(f"{src} {st}: {n:,}" for src, st, n in rows)
        lines.append(f"  {kind:<25} {total:>8,}" + (f"   ({detail})" if detail else ""))
    for s, why in f["skipped"].items():
        lines.append(f"  {s}: not compared ({why})")
    if out:
        lines.append(f"  written: {out} (one row per document changing fate, both decisions)")
    if samples:
        for kind in KINDS:
            picks = f["samples"][kind]
            if not picks:
                continue
            lines += ["", f"sample: {kind} ({len(picks)} of {sum(n for (_, k, _), n in f['counts'].items() if k == kind):,}, seed {seed})"]
            for p, text in zip(picks, _texts(picks), strict=True):
                _prio_, src, _part, _row, doc_id, stage, da, db = p
                lines.append(f"- {src} {doc_id}  [{stage}]  A: {_fate(da)}  B: {_fate(db)}")
                lines.append("    " + " ".join((text or "").split())[:300])
    return {"config": changes, "shared": shared, "only_a": only_a, "only_b": only_b, "removals": moved,
            "fates": {f"{src}|{k}|{st}": n for (src, k, st), n in f["counts"].items()}, "skipped": f["skipped"],
            "compared": f["compared"], "unread_files": unread}, "\n".join(lines)


def _fate(d) -> str:
    status, stage, reason = d
    return "kept" if status == "kept" else f"removed by {stage} ({reason})"


def _removals(la: dict, lb: dict) -> list[tuple]:
    """(source, stage, reason group, A, B) for every stage and reason either ledger has."""
    rows = {}
    for i, led in enumerate((la, lb)):
        for src, e in led["sources"].items():
            for st, reasons in e.get("removed", {}).items():
                for rs, n in reasons.items():
                    key = (src, st, decisions.reason_group(rs) or rs)
                    rows.setdefault(key, [0, 0])[i] += n
            for rs, n in e.get("quarantined_by_reason", {}).items():
                rows.setdefault((src, "quarantine", rs), [0, 0])[i] += n
    return [(*k, v[0], v[1]) for k, v in sorted(rows.items())]


def _order(a: dict, b: dict) -> list[str]:
    return list(a) + [s for s in b if s not in a]


def _j(v) -> str:
    return "(absent)" if v is None else orjson.dumps(v).decode()


def _n(v) -> str:
    return "-" if v is None else f"{v:,}"


def _w(v) -> str:
    return "-" if v is None else f"{v:.3f}"
