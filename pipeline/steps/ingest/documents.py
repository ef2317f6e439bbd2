"""Ingest: one input split in, one normalised document shard out.

Every record becomes a row of `part-XXXXX.parquet` with the columns

    id, text, source, source_id, metadata (JSON of the other fields), n_chars, n_tokens

(n_tokens null for a source with filters: its filter step counts the documents it keeps,
since a tokenizer is ~80% of ingest's CPU and a crawl's filters drop most of its pages)

or, when it cannot be read, a line of `quarantine/part-XXXXX.jsonl` with its file, line
(or row), byte offset, error and an excerpt. `on_bad_record: fail` stops at the first bad
record with `path:line: what is wrong; what to do` instead.

Ids: the record's own id when `id_field` is set; otherwise the xxh3-128 hash of the
record's place (file relative to its glob's fixed prefix, and line or row) and its text.
`source_id` keeps the original id, or that place. The same input gives the same ids on
any machine and any worker count, and no two records of a source share one: with
`id_field`, the unique-ids step (ids.py) runs first and every later use of an id is
quarantined as `duplicate_id`.

Blank lines in JSONL are not records and are not counted.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.plan import tokens
from pipeline.shards import shuffle
from pipeline.errors import InputError
from pipeline.engine.step import task
from pipeline.io import atomic, readers
from pipeline.io.faults import transient
from pipeline.io.readers import StreamError
from pipeline.shards.documents import DOC_SCHEMA, content_id
from pipeline.steps.ingest import idindex, web

FLUSH_DOCS = 4096
FLUSH_BYTES = 32 << 20
EXCERPT = 200


# ---------------------------------------------------------------- the shard task


class IngestSpec(TypedDict):
    """An `ingest-<source>` shard (steps/ingest/plan.py `ingest_shards`): one split of the source's inputs."""

    source: str
    text_field: str
    id_field: str | None
    hf_split: str | None  # for a saved DatasetDict: which split to read
    on_bad_record: str  # quarantine or fail
    tokenizer: str | None  # what documents are counted with (plan/tokens.py)
    max_doc_bytes: int
    duplicates: str | None  # the unique-ids step's folder (with id_field), else None
    duplicate_files: NotRequired[int | None]  # its shard count; None when this split has no id used again
    extract: dict | None  # a web source's extractor spec (config `extractor`)
    html_field: str | None
    count_tokens: bool  # False for a filtered or web source: its filter step counts the kept documents
    split: dict  # steps/ingest/splits.py: the file and the part of it read
    index_partitions: NotRequired[int]  # the id index's partitions (steps/ingest/idindex.py)
    describe: str
    verify: NotRequired[str]  # content: the split's files digested and compared with the earlier shard's (verify.py)
    stamp: NotRequired[dict[str, int]]  # with it, each file's change time (left out of the partial key)


def _duplicates(spec: IngestSpec, out) -> dict[int, tuple[str, str]]:
    """line or row -> (id, place of its first use), from the unique-ids step (ids.py)."""
    if not spec.get("duplicates"):
        return {}
    t = shuffle.decisions(spec["duplicates"], out.index, spec["duplicate_files"])
    if t is None:
        return {}
    return {r: (i, f) for r, i, f in zip(t.column("row").to_pylist(), t.column("id").to_pylist(), t.column("first").to_pylist())}


class IdSink:
    """Ingest's parsing with a sink that keeps only the id and place of every record that
    would become a document (the ids map step); bad records are ingest's to report."""

    keep_fields = False

    def __init__(self, spec: dict):
        self.spec = spec
        self.source = spec["source"]
        self.stats: dict = {}
        self.ids: list[str] = []
        self.locs: list[int] = []

    def duplicate(self, loc: int) -> None:  # what the ids steps are here to find
        return None

    def add(self, id_: str, text: str, source_id: str, meta: str | None, loc: int):
        self.ids.append(id_)
        self.locs.append(loc)

    def bad(self, *args, **kwargs):
        pass


class _Shard:
    """Accumulates documents and quarantine records; streams them to temporary files."""

    keep_fields = True

    def __init__(self, spec: dict, out):
        self.spec = spec
        self.source = spec["source"]
        self.tokenizer = spec["tokenizer"]
        self.final = out.path(".parquet")
        self.dest = atomic.Out(self.final)
        self.writer = self.dest.parquet(DOC_SCHEMA, compression="zstd")
        self.out = out
        self.qfile = None  # opened at the first bad record
        self.dups = _duplicates(spec, out)
        self.cols: dict[str, list] = {"id": [], "text": [], "source_id": [], "metadata": []}
        self.pending_bytes = 0
        self.stats = {"records_in": 0, "docs_out": 0, "chars": 0, "tokens": 0 if spec.get("count_tokens", True) else None, "quarantined": {}, "stream_error": None}
        self.hashes: list[np.ndarray] = []  # of the ids, for the id index (steps/ingest/idindex.py)

    def duplicate(self, loc: int) -> str | None:
        """The quarantine message when this record's id was used earlier in the source."""
        if loc not in self.dups:
            return None
        id_, first = self.dups[loc]
        return (f"id {id_!r} is already used at {first} (that record is kept); ids must be unique within a source: "
                f"fix the data, or drop sources.{self.source}.id_field to give every record a content id")

    def add(self, id_: str, text: str, source_id: str, meta: str | None, loc: int):
        self.stats["records_in"] += 1
        c = self.cols
        c["id"].append(id_)
        c["text"].append(text)
        c["source_id"].append(source_id)
        c["metadata"].append(meta)
        self.pending_bytes += len(text)
        if len(c["id"]) >= FLUSH_DOCS or self.pending_bytes >= FLUSH_BYTES:
            self.flush()

    def bad(self, reason: str, error: str, file: dict, line: int | None = None, row: int | None = None,
            offset: int | None = None, raw: bytes | str | None = None, **extra):
        if self.spec["on_bad_record"] == "fail":
            place = f"{file['path']}:{line}" if line is not None else f"{file['path']} row {row}" if row is not None else file["path"]
            raise InputError(
                f"{place}: {error}; fix the record, or set sources.{self.source}.on_bad_record: quarantine to set it aside"
            )
        self.stats["records_in"] += 1
        q = self.stats["quarantined"]
        q[reason] = q.get(reason, 0) + 1
        if isinstance(raw, bytes):
            raw = raw[: EXCERPT * 4].decode("utf-8", "replace")
        if self.qfile is None:
            self.qfinal = self.out.path(".jsonl", "quarantine")
            self.qdest = atomic.Out(self.qfinal)
            self.qfile = self.qdest.open()
        rec = {"source": self.source, "file": file["path"], "line": line, "row": row, "offset": offset,
               "reason": reason, "error": error, "excerpt": (raw or "")[:EXCERPT], **extra}
        self.qfile.write(orjson.dumps(rec) + b"\n")

    def flush(self):
        c = self.cols
        if not c["id"]:
            return
        texts = c["text"]
        n_chars = [len(t) for t in texts]
        n_tok = tokens.count(self.tokenizer, texts) if self.spec.get("count_tokens", True) else None
        table = pa.table(
            {
                "id": pa.array(c["id"], pa.string()),
                "text": pa.array(texts, pa.string()),
                "source": pa.array([self.source] * len(texts), pa.string()),
                "source_id": pa.array(c["source_id"], pa.string()),
                "metadata": pa.array(c["metadata"], pa.string()),
                "n_chars": pa.array(n_chars, pa.int64()),
                "n_tokens": pa.array(n_tok, pa.int64()) if n_tok is not None else pa.nulls(len(texts), pa.int64()),
            },
            schema=DOC_SCHEMA,
        )
        self.writer.write_table(table, row_group_size=len(texts))
        self.hashes.append(idindex.id_hash(c["id"]))
        self.stats["docs_out"] += len(texts)
        self.stats["chars"] += sum(n_chars)
        if self.stats["tokens"] is not None:  # else the filter step counts the documents it keeps: unknown here
            self.stats["tokens"] += sum(n_tok or [])
        for v in c.values():
            v.clear()
        self.pending_bytes = 0

    def close(self) -> dict:
        self.flush()
        self.writer.close()
        if "index_partitions" in self.spec:  # before the shard: a committed shard has its index
            h = np.concatenate(self.hashes) if self.hashes else np.zeros(0, np.uint64)
            idindex.write_map(h, self.out.dir, self.out.index, self.spec["index_partitions"])
            self.stats["index_partitions"] = self.spec["index_partitions"]
        self.dest.commit()
        if self.qfile is not None:
            self.qdest.commit()
            self.stats["quarantine_file"] = str(self.qfinal)
        self.stats["rows"] = self.stats["records_in"]
        return self.stats

    def abort(self):
        self.writer.close()
        self.dest.discard()
        if self.qfile is not None:
            self.qdest.discard()


def parse(shard, split: dict) -> None:
    """Every record of one split into `shard` (a _Shard, or an IdSink)."""
    f = split["file"]
    if "files" in split:
        web.ingest_html_files(shard, split)
        return
    if f.get("unreadable"):  # found at discovery; `fail` stopped there
        shard.stats["stream_error"] = f"cannot open: {f['unreadable']}"
        shard.bad("unreadable_file", f"the file cannot be read ({f['unreadable']}); its records could not be read or "
                  "counted; give the user running curate read access (e.g. chmod a+r) and run again", f, unread_records="unknown")
        return
    if split.get("error"):
        shard.stats["stream_error"] = split["error"]
        shard.bad("corrupt_file", f"not a readable {f['format']} file ({split['error']}); its records could not be read "
                  "or counted; re-fetch or repair the file", f, unread_records="unknown")
        return
    if f["format"] == "warc":
        web.ingest_warc(shard, split)
    elif f["format"] == "jsonl":
        _ingest_jsonl(shard, split)
    else:
        _ingest_arrow(shard, split, f["format"])


@task(version="2")
def run_shard(spec: IngestSpec, out) -> dict:
    from pipeline.steps.ingest import splits, verify

    rk, same = verify.verified(spec, out, splits.paths(spec["split"]))  # inputs.verify: content
    if same is not None:
        return same
    shard = _Shard(spec, out)
    try:
        parse(shard, spec["split"])
        return {**shard.close(), **verify.recorded(rk)}
    except BaseException:
        shard.abort()
        raise


def _ingest_jsonl(shard: _Shard, split: dict):
    fx = web.FieldExtraction(shard) if shard.spec.get("html_field") else None
    try:
        _jsonl_records(shard, split, fx)
    finally:
        if fx is not None:
            fx.close()


def _text_key(shard) -> tuple[str, str]:
    """The field read as the document (the HTML when html_field is set) and its YAML key."""
    hf = shard.spec.get("html_field")
    return (hf, "html_field") if hf else (shard.spec["text_field"], "text_field")


def _jsonl_records(shard: _Shard, split: dict, fx):
    f = split["file"]
    (tf, key), idf = _text_key(shard), shard.spec["id_field"]
    limit = shard.spec["max_doc_bytes"]
    rel = f["rel"]
    for item in readers.iter_lines(f["path"], f["compression"], split, max_line=limit):
        if isinstance(item, StreamError):
            shard.stats["stream_error"] = item.message
            shard.bad("corrupt_stream", f"the compressed stream is unreadable from here on ({item.message}); "
                      "the records after this point could not be read or counted; re-fetch or repair the file",
                      f, line=item.line_no, offset=item.offset, unread_records="unknown")
            return
        line_no, offset, raw = item
        if not isinstance(raw, readers.LongLine) and not raw.strip():
            continue
        if isinstance(raw, readers.LongLine):  # read through, never held whole
            shard.bad("too_large", f"the record has {raw.size:,} bytes, over sources.{shard.source}.max_doc_bytes "
                      f"({limit:,}); raise the limit or drop the record", f, line_no, offset=offset, raw=raw.head)
            continue
        try:
            rec = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as u:
                shard.bad("invalid_utf8", f"invalid UTF-8 at byte {u.start} of the line", f, line_no, offset=offset, raw=raw)
                continue
            shard.bad("invalid_json", f"invalid JSON: {e}", f, line_no, offset=offset, raw=raw)
            continue
        if not isinstance(rec, dict):
            shard.bad("not_an_object", f"the line is a JSON {type(rec).__name__}, not an object", f, line_no, offset=offset, raw=raw)
            continue
        text = rec.pop(tf, _MISSING)
        if text is _MISSING:
            keys = ", ".join(list(rec)[:12]) or "(none)"
            shard.bad("missing_text", f"no field {tf!r}; fields present: {keys}; set sources.{shard.source}.{key}",
                      f, line_no, offset=offset, raw=raw)
            continue
        if not isinstance(text, str):
            shard.bad("text_not_string", f"field {tf!r} is {_jtype(text)}, not a string", f, line_no, offset=offset, raw=raw)
            continue
        place = f"{rel}:{line_no}"
        if idf is not None:
            rid = rec.pop(idf, None)
            if rid is None or isinstance(rid, (dict, list)) or rid == "":
                shard.bad("missing_id", f"field {idf!r} is missing or not a scalar", f, line_no, offset=offset, raw=raw)
                continue
            id_ = source_id = str(rid)
            dup = shard.duplicate(line_no)
            if dup:
                shard.bad("duplicate_id", dup, f, line_no, offset=offset, raw=raw)
                continue
        if fx is not None:  # html_field: the page's text (only for records that will be documents)
            text, skip = fx.text(text, f, {"line": line_no, "offset": offset}, rec.get("url"))
            if text is None:
                continue
            if skip:
                rec["extraction"] = skip
        if idf is None:
            source_id, id_ = place, content_id(place, text)
        meta = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS, default=str).decode() if rec and shard.keep_fields else None
        shard.add(id_, text, source_id, meta, line_no)


_MISSING = object()


def _jtype(v) -> str:
    return {type(None): "null", bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
        type(v), type(v).__name__
    )


def _ingest_arrow(shard: _Shard, split: dict, fmt: str):
    fx = web.FieldExtraction(shard) if shard.spec.get("html_field") else None
    try:
        _arrow_records(shard, split, fmt, fx)
    finally:
        if fx is not None:
            fx.close()


def _arrow_records(shard: _Shard, split: dict, fmt: str, fx):
    f = split["file"]
    (tf, key), idf = _text_key(shard), shard.spec["id_field"]
    if fmt == "parquet":
        batches = readers.iter_parquet(f["path"], split, None, FLUSH_DOCS)
    elif split.get("hf_builder"):
        batches = readers.iter_hf_files(f["path"], split["hf_builder"], FLUSH_DOCS)
    else:
        batches = readers.iter_hf(f["path"], shard.spec.get("hf_split"), split, FLUSH_DOCS)
    limit = shard.spec["max_doc_bytes"]
    state = {"row": split.get("first_row", 0)}
    for first_row, batch in _guarded(batches, state):
        names = batch.schema.names
        problem = None  # a file-level problem: every row of the batch is set aside with it (or the run stops)
        if tf not in names:
            problem = ("missing_text", f"no column {tf!r}; columns: {', '.join(names)}; set sources.{shard.source}.{key}")
        elif idf is not None and idf not in names:
            problem = ("missing_id", f"no column {idf!r} (id_field); columns: {', '.join(names)}; set sources.{shard.source}.id_field")
        elif not (pa.types.is_string(batch.column(tf).type) or pa.types.is_large_string(batch.column(tf).type)):
            problem = ("text_not_string", (f"column {tf!r} has type {batch.column(tf).type}, not string; "
                                           f"set sources.{shard.source}.{key} to the text column"))
        if problem:
            for i in range(batch.num_rows):
                shard.bad(*problem, f, row=first_row + i)
            continue
        col = batch.column(tf)
        big = pc.greater(pc.binary_length(col), limit).to_pylist()
        texts = col.to_pylist()
        ids = batch.column(idf).to_pylist() if idf is not None else None
        others = [n for n in names if n not in (tf, idf)]
        metas = batch.select(others).to_pylist() if others and shard.keep_fields else None
        for i, text in enumerate(texts):
            row = first_row + i
            if text is None:
                shard.bad("text_not_string", f"column {tf!r} is null at row {row}", f, row=row)
                continue
            if big[i]:
                shard.bad("too_large", f"the text has {len(text.encode()):,} bytes, over sources.{shard.source}.max_doc_bytes "
                          f"({limit:,}); raise the limit or drop the record", f, row=row, raw=text[:EXCERPT])
                continue
            place = f"{f['rel']}#{row}"
            if ids is not None:
                rid = ids[i]
                if rid is None or rid == "":
                    shard.bad("missing_id", f"column {idf!r} is null at row {row}", f, row=row, raw=text)
                    continue
                id_ = source_id = str(rid)
                dup = shard.duplicate(row)
                if dup:
                    shard.bad("duplicate_id", dup, f, row=row, raw=text)
                    continue
            if fx is not None:
                m = metas[i] if metas else {}
                text, skip = fx.text(text, f, {"row": row}, m.get("url"))
                if text is None:
                    continue
                if skip:
                    m["extraction"] = skip
                    metas = metas or [{} for _ in texts]
                    metas[i] = m
            if ids is None:
                source_id, id_ = place, content_id(place, text)
            meta = orjson.dumps(metas[i], option=orjson.OPT_SORT_KEYS, default=str).decode() if metas and metas[i] else None
            shard.add(id_, text, source_id, meta, row)
    if "error" in state:
        shard.stats["stream_error"] = state["error"]
        shard.bad("corrupt_file", f"the file is unreadable from row {state['row']} on ({state['error']}); the rows after "
                  "it could not be read or counted; re-fetch or repair the file", f, row=state["row"], unread_records="unknown")


def _guarded(batches, state: dict):
    """The batches until the first read error, which lands in state["error"]; state["row"]
    is then the first row not read."""
    it = iter(batches)
    while True:
        try:
            first_row, batch = next(it)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as e:
            if transient(e):  # a passing fault of the store, not a damaged file: the shard tries again
                raise
            state["error"] = f"{type(e).__name__}: {e}"
            return
        state["row"] = first_row + batch.num_rows
        yield first_row, batch
