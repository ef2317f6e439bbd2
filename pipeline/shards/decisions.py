"""Every document's fate, shard by shard, from the step outputs: the rows behind
`curate samples`, `curate explain --all`, the published samples and the report.

For one ingest shard of a source, `shard_decisions` joins the document shard with its
layers (filter attributes, each dedup kind's, the quality attributes) and the mixture
selection, and returns one row per document:

    source, id, source_id, status (kept | removed), stage, reason, scores (JSON),
    survivor_source, survivor_id, survivor_gid (dedup removals), n_tokens, text (optional)

`stage` is the stage that removed the document (filter:<name>, dedup:<kind>,
quality:<classifier>, mix), null when kept. Nothing here holds more than one shard.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.mixing import cells
from pipeline.io import atomic, fs
from pipeline.mixing import budget
from pipeline.shards.ledger import filter_stage
from pipeline.shards import view

DEDUP = ("exact", "fuzzy", "paragraph")


class Run:
    """A finished run directory: its record, config and where each stage's files are."""

    def __init__(self, run_dir: Path):
        self.dir = fs.path(run_dir)
        self.record = atomic.read_json(self.dir / "run.json")
        self.steps = self.record["steps"]
        self.config = self.record["config"]
        self.seed = self.config["seed"]
        sel = self.step("selection")
        self.selection = atomic.read_json(fs.join(self.dir, sel["dir"]) / "_markers" / "part-00000.json") if sel else None
        mixed = self.record.get("mix_sources")
        if mixed is None and sel:  # a run recorded before run.json named them: the step's file (lists every shard)
            mixed = atomic.read_json(fs.join(self.dir, sel["dir"]) / "step.json")["config"]["sources"]
        self.sources = mixed if mixed is not None else list(self.config["sources"])
        self.all_sources = [s for s in self._yaml_order()]

    def _yaml_order(self) -> list[str]:
        names = list(self.config["sources"])
        known = [s for s in self.sources if s in names]
        return known + [s for s in names if s not in known]

    def step_dir(self, name: str | None) -> Path | None:
        st = self.steps.get(name) if name else None
        return fs.join(self.dir, st["dir"]) if st else None

    def step(self, role: str, source: str | None = None) -> dict | None:
        """run.json's entry of the step with this role (of this source), or None."""
        name = role_of(self.record, role, source)
        return self.steps.get(name) if name else None

    def role_dir(self, role: str, source: str | None = None) -> Path | None:
        return self.step_dir(role_of(self.record, role, source))

    def shards(self, source: str) -> list[Path]:
        d = self.role_dir("ingest", source)
        return sorted(d.glob("part-*.parquet")) if d else []

    def layers(self, source: str, part: Path) -> list[tuple[str, Path]]:
        """(stage label, attribute file) in stage order: the filter step's file is the
        document shard's name, every later layer's is under the source's folder."""
        return [(stage, self.step_dir(name) / part.name if stage == "filter" else self.step_dir(name) / source / part.name)
                for stage, name in layer_names(self.record, source)]

    def role(self, source: str) -> str:
        return self.config["sources"][source].get("role", "train")


class OneShard:
    """What one document shard's decisions read, carried in a task's spec instead of the run
    directory (whose run.json every variant rewrites): the seed, the source's role, its part
    of the mixture's selection (budget.source_selection) and its layer files in deciding
    order. A task whose spec names these is keyed by their content (engine/reuse.py), so a
    variant that changes none of them links the shard's output instead of computing it.

        fate = OneShard(seed=0, role="train", selection=sel, layers=[("filter", ".../part-00003.parquet")])
        t = shard_decisions(fate, "web", part)
    """

    def __init__(self, seed: int, role: str, selection: dict | None, layers: list):
        self.seed, self._role, self.selection = seed, role, selection
        self._layers = [(label, fs.path(p)) for label, p in layers]

    def layers(self, source: str, part: Path) -> list[tuple[str, Path]]:
        return self._layers

    def role(self, source: str) -> str:
        return self._role


def role_of(record: dict, role: str, source: str | None = None) -> str | None:
    """The step name of `role` (of `source`) in a run's record: its `roles`, which the
    stages declare (pipeline/plan/context.py `roles`); for a run from before that record,
    the name the stage gave it then."""
    roles = record.get("roles")
    if roles is not None:
        return (roles["sources"].get(source) or {} if source else roles["run"]).get(role)
    name = _LEGACY[role].format(source=source)
    return name if name in record["steps"] else None


def sources_with(record: dict, role: str) -> list[str]:
    """The sources that have a step of `role` (every mixed or eval source has `ingest`)."""
    if record.get("roles") is not None:
        return [s for s, r in record["roles"]["sources"].items() if role in r]
    return [s for s in record["config"]["sources"] if role_of(record, role, s)]


# the step names of the roles before run.json recorded them (runs of older versions)
_LEGACY = {"ingest": "ingest-{source}", "id_index": "id-index-{source}", "filter": "filter-{source}",
           "quality": "quality-{source}", "quality_threshold": "quality-{source}-threshold", "topic": "topic-{source}",
           "selection": "mix-select", "decontaminate": "decontaminate", "decontaminate_index": "decontaminate-index"}


def layer_names(record: dict, source: str) -> list[tuple[str, str]]:
    """(ledger stage, step name) of a source's layers in deciding order, as run.json records
    them; for a run from before that record, the stages there were then, by step name."""
    if "layers" in record:
        return [(stage, name) for stage, name in record["layers"].get(source, [])]
    steps, cfg = record["steps"], record["config"]["sources"][source]
    out = [("filter", name)] if (name := role_of(record, "filter", source)) else []
    out += [(f"dedup:{kind}", f"dedup-{kind}") for kind in DEDUP if f"dedup-{kind}" in steps]
    out += [(name, name) for name in ("decontaminate", "validation") if name in steps]
    for kind in ("quality", "topic"):
        if name := role_of(record, kind, source):
            out.append((f"{kind}:{(cfg.get(kind) or {}).get('classifier')}", name))
    return out


# layer columns shard_decisions never reads (explain shows them): a read key of the decisions leaves them out
UNREAD = ("cluster", "cluster_size")


def reason_group(reason: str | None) -> str | None:
    """A reason without its per-document detail: exact_duplicate_of:<id> -> exact_duplicate_of
    (semantic_duplicate_of:<id> (cosine=...) -> semantic_duplicate_of),
    quality_below:0.08 (score=0.01) -> quality_below:0.08."""
    if reason is None:
        return None
    head, sep, _ = reason.partition(":")
    if sep and head.endswith("_of"):  # <kind>_of:<survivor id> (...): exact, near, url and semantic duplicates
        return head
    if reason.startswith("contaminated:"):  # contaminated:<eval set>:<item> (overlap=..) -> contaminated:<eval set>
        return ":".join(reason.split(":", 2)[:2])
    return reason.split(" (", 1)[0]


def shard_decisions(run: Run | OneShard, source: str, part: Path, with_text: bool = False, score_rows=None,
                    tables: dict | None = None) -> pa.Table:
    """Every row's fate in one document shard: status, stage, reason, scores (JSON), the
    survivor of a dedup removal, n_tokens (and text). `score_rows`: only these rows get their
    scores (the others null): a filter chain's scores are a dict entry per row and score,
    most of this function's time, and the samples want a few rows' (None: every row's).
    `tables`: a dict the files read are kept in, for a second call on the same shard (the
    samples' picks: once for every row's fate, once for the picks' scores)."""
    cols = ["id", "source_id", "n_tokens"] + (["text", "metadata"] if with_text else [])
    tables = {} if tables is None else tables

    def read(path, columns) -> pa.Table:
        key = (str(path), tuple(columns))
        if key not in tables:
            tables[key] = fs.read_table(path, columns=columns)
        return tables[key]
    docs = read(part, cols)
    n = docs.num_rows
    status = np.array(["kept"] * n, dtype=object)
    stage = np.array([None] * n, dtype=object)
    reason = np.array([None] * n, dtype=object)
    surv_src = np.array([None] * n, dtype=object)
    surv_id = np.array([None] * n, dtype=object)
    surv_gid = np.array([None] * n, dtype=object)
    scores: list[dict] = [{} for _ in range(n)]
    buckets = topics = None  # quality buckets and topics, when the source has them
    rewritten_by: list[list[str] | None] = [None] * n  # the stages (filters by name) that changed a row's text
    layers = run.layers(source, part)
    n_tokens = docs.column("n_tokens")
    scored = list(range(n)) if score_rows is None else sorted(score_rows)
    at = pa.array(scored, pa.int64())

    def values(t: pa.Table, c: str) -> list:
        """(row, value) of column c at the rows that get scores."""
        col = t.column(c)
        return list(zip(scored, (col if score_rows is None else col.take(at)).to_pylist()))
    selected = budget.phase_selections(run.selection) if run.selection else []
    first = selected[0][1]["sources"].get(source) if selected else None
    axes = cells.source_axes(budget.source_cells(first)) if first else []  # the source's mixture axes, if any
    axis_values: dict[str, np.ndarray] = {}  # each axis's value per row
    for label, path in layers:
        if ("names", str(path)) not in tables:
            tables[("names", str(path))] = fs.parquet_schema(path).names
        names = tables[("names", str(path))]
        # a layer's rewritten texts are read only when wanted (they are most of its bytes)
        t = read(path, names if with_text else [c for c in names if c != "text"])
        if "n_tokens" in names:  # a layer's counts: a filtered source's are first counted by its filter step
            n_tokens = pc.coalesce(t.column("n_tokens"), n_tokens)
        if "rewritten_by" in names or "n_chars" in names:
            c = t.column("rewritten_by" if "rewritten_by" in names else "n_chars")
            set_ = pc.is_valid(c) if c.type != pa.string() else pc.and_(pc.is_valid(c), pc.not_equal(c, ""))
            for i in np.flatnonzero(set_.to_numpy(zero_copy_only=False)).tolist():  # the rewritten rows only
                v = c[i].as_py()
                rewritten_by[i] = (rewritten_by[i] or []) + (v.split(",") if isinstance(v, str) else [label])
        # removed here and still kept before: numpy over the rows, Python over those rows only
        gone = np.flatnonzero((t.column("keep").fill_null(True).to_numpy(zero_copy_only=False) == False)  # noqa: E712
                              & (status == "kept"))
        if len(gone):
            rs = t.column("reason").take(pa.array(gone)).to_pylist()
            stg = t.column("stage").take(pa.array(gone)).to_pylist() if label == "filter" else None
            for j, i in enumerate(gone.tolist()):
                status[i] = "removed"
                stage[i] = filter_stage(stg[j]) if stg is not None else label
                reason[i] = rs[j]
        if label == "filter":
            lang_cols = [c for c in names if c.endswith(".lang")]
            if lang_cols and "lang" in axes:  # the chain's first language filter: language cells
                axis_values["lang"] = np.array(t.column(lang_cols[0]).to_pylist(), dtype=object)
            for c in names:
                if "." in c:
                    for i, v in values(t, c):
                        if v is not None:
                            scores[i][c] = v
        if "duplicate_of" in names:
            dup = np.flatnonzero(pc.is_valid(t.column("duplicate_of")).to_numpy(zero_copy_only=False))
            if len(dup):
                at_dup = pa.array(dup)
                surv_src[dup] = t.column("duplicate_of_source").take(at_dup).to_pylist()
                surv_id[dup] = t.column("duplicate_of").take(at_dup).to_pylist()
            if "duplicate_of_gid" in names:  # where the survivor is (runs before this column: looked up by id)
                g = t.column("duplicate_of_gid")
                has = np.flatnonzero(pc.is_valid(g).to_numpy(zero_copy_only=False))
                if len(has):
                    surv_gid[has] = g.take(pa.array(has)).to_pylist()
        if "jaccard" in names:
            for i, v in values(t, "jaccard"):
                if v is not None:
                    scores[i]["jaccard"] = v
        if label.startswith("quality:"):
            for i, v in values(t, "score"):
                if v is not None:
                    scores[i]["quality_score"] = round(v, 6)
            if "bucket" in names:
                buckets = t.column("bucket").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
                for i in scored:
                    if buckets[i] >= 1:
                        scores[i]["quality_bucket"] = int(buckets[i])
        for axis in axes:
            if axis != "lang" and axis in names and label != "filter":  # a stage's axis: its layer's column
                got = axis_values[axis] = np.array(t.column(axis).cast(pa.string()).to_pylist(), dtype=object)
                for i in scored:
                    if got[i] is not None:
                        scores[i][axis] = got[i]
        if label.startswith("topic:"):
            topics = np.array(t.column("topic").to_pylist(), dtype=object)
            for i, p in values(t, "topic_score"):
                if topics[i] is not None:
                    scores[i]["topic"], scores[i]["topic_score"] = topics[i], round(p, 6)
        if with_text and "text" in names:  # rewritten text (c4 rewrite, paragraph cuts)
            new = t.column("text").to_pylist()
            docs = docs.set_column(docs.schema.get_field_index("text"), "text",
                                   pa.array([x if x is not None else o for x, o in zip(new, docs.column("text").to_pylist(), strict=True)], pa.string()))
    # the mixture's choice among the documents still kept
    phases = budget.phase_selections(run.selection) if run.selection else []
    sel = phases[0][1]["sources"].get(source) if phases else None
    kept_idx = [i for i in range(n) if status[i] == "kept"]
    if run.selection is not None and kept_idx:
        ids = docs.column("id").to_pylist()
        if sel is None:
            chosen = np.zeros(len(kept_idx), bool)
            role = run.role(source)
            why = "excluded" if role == "train" else f"role_{role}"
        else:  # chosen in any phase; a reason per cell with one phase
            chosen = np.zeros(len(kept_idx), bool)
            why = np.array(["not_selected"] * len(kept_idx), dtype=object)
            for name, ph, _ in phases:
                cl = budget.source_cells(ph["sources"][source])
                where = cells.index(cl, None if buckets is None else buckets[kept_idx], len(kept_idx),
                                    None if topics is None else topics[kept_idx],
                                    {a: v[kept_idx] for a, v in axis_values.items()} or None)
                for pos, c in enumerate(cl):
                    inside = np.flatnonzero(where == pos)
                    why[inside] = budget.not_selected_reason(c, phased=name is not None)
                    for _, mask in budget.cell_epochs(c, run.seed, source, [ids[kept_idx[j]] for j in inside]):
                        chosen[inside if mask is None else inside[mask]] = True
        for j, i in enumerate(kept_idx):
            if not chosen[j]:
                status[i], stage[i], reason[i] = "removed", "mix", why if isinstance(why, str) else why[j]
    out = {
        "source": pa.array([source] * n, pa.string()), "id": docs.column("id"), "source_id": docs.column("source_id"),
        "status": pa.array(list(status), pa.string()), "stage": pa.array(list(stage), pa.string()),
        "reason": pa.array(list(reason), pa.string()),
        "scores": pa.array([orjson.dumps(s).decode() if s else None for s in scores], pa.string()),
        "survivor_source": pa.array(list(surv_src), pa.string()), "survivor_id": pa.array(list(surv_id), pa.string()),
        "survivor_gid": pa.array(list(surv_gid), pa.int64()), "n_tokens": n_tokens,
        "rewritten_by": pa.array(rewritten_by, pa.list_(pa.string())),
    }
    if with_text:
        out["text"] = docs.column("text")
        out["url"] = pa.array([_url(m) for m in docs.column("metadata").to_pylist()], pa.string())
    return pa.table(out)


def _url(meta: str | None) -> str | None:
    """A web document's URL (metadata `url`), shown beside its text in samples."""
    if not meta or '"url"' not in meta:
        return None
    u = orjson.loads(meta).get("url")
    return u if isinstance(u, str) else None


def quarantined(run: Run, source: str) -> list[dict]:
    """The source's quarantined records, read from its ingest step (the run publishes them
    to <run>/quarantine only at its end, after the samples steps have read them)."""
    ing = run.role_dir("ingest", source)
    q = ing / "quarantine" if ing else None
    files = sorted(q.glob("*.jsonl")) if q and q.is_dir() else []
    return [row for f in files for row in _quarantine_rows(f, source)]


def quarantined_shard(run: Run, source: str, shard: int) -> list[dict]:
    """The quarantined records of one ingest shard."""
    ing = run.role_dir("ingest", source)
    f = ing / "quarantine" / f"part-{shard:05d}.jsonl" if ing else None
    return _quarantine_rows(f, source) if f is not None and f.exists() else []


def _quarantine_rows(f: Path, source: str) -> list[dict]:
    out = []
    for line in f.read_bytes().splitlines():
        r = orjson.loads(line)
        place = f"{r['file']}:{r['line']}" if r.get("line") is not None else f"{r['file']}#{r.get('row')}"
        out.append({"source": source, "id": None, "source_id": place,
                    "status": "quarantined", "stage": "ingest", "reason": r["reason"], "scores": None,
                    "survivor_source": None, "survivor_id": None, "n_tokens": None, "error": r["error"],
                    **({"url": r["url"]} if r.get("url") else {})})
    return out


def find_texts(run: Run, wanted: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """Texts of some documents by (source, id), scanning id columns shard by shard."""
    out = {}
    for source, ids in wanted.items():
        if not ids:
            continue
        for part in run.shards(source):
            col = fs.read_table(part, columns=["id"]).column("id").to_pylist()
            rows = [i for i, x in enumerate(col) if x in ids]
            if rows:
                t = view.read_rows(str(part), [], np.array(rows), ["id", "text"])
                for i, x in zip(t.column("id").to_pylist(), t.column("text").to_pylist(), strict=True):
                    out[(source, i)] = x
    return out
