"""The ledger: every document of every source, counted through every stage.

Built from the shard markers (small JSON), never from the documents. Per source:

    in           records read (documents written + records quarantined)
    kept         distinct documents in the mixture (rows_out counts repeats)
    removed      by stage and reason, e.g. {"filter:len": {"too_few_chars": 12}, "mix": {"not_selected": 9},
                 "dedup:exact": {"exact_duplicate": 40}} (attributes hold each survivor's id)
    quarantined  by reason, e.g. {"invalid_json": 1}
    conservation true when in == kept + removed + quarantined; "unknown" when that holds but a file
                 was cut or unreadable (`unread_files`), so the records after the damage were
                 neither read nor counted; false when the counted records do not balance
    unread_files the files whose records could not all be read: [{"file", "error"}]
    stages       docs, chars and tokens in and out of each stage, in order; for web sources
                 the ingest stage's `skipped_records` counts WARC records that are not
                 documents (request, warcinfo, ...), and `extraction` sums the extractor's work

A run whose ledger does not balance for any source fails (exit 1); one whose only gap is
"unknown" finishes (the good records are kept) and says which files were cut, in its
summary, report, `curate runs` and card, and `curate publish` refuses it unless
--allow-unknown-loss.
"""

from __future__ import annotations


def filter_stage(name: str) -> str:
    """The stage label of a filter-step stage: `extract` for web sources' first stage
    (filters/web.py), else filter:<name in the YAML>."""
    return name if name == "extract" else f"filter:{name}"


def _sum(markers: dict[int, dict], key: str) -> int:
    return sum(int(m.get(key) or 0) for m in markers.values())


def _add(a: int | None, b: int | None) -> int | None:
    """A sum that stays unknown (None) once a part is: a filtered source's tokens before
    its last filter are never counted (pipeline/steps/filter.py)."""
    return None if a is None or b is None else a + b


def _merge_counts(into: dict, counts: dict) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


FLOWS = ("docs_in", "docs_out", "chars_in", "chars_out", "tokens_in", "tokens_out")
EXTRA = ("paragraphs_cut", "chars_cut", "docs_rewritten")  # a rewriting stage's counts


def fold(markers) -> dict[str | None, dict]:
    """A layer step's shard markers summed per source in one pass (a marker without
    `source`, of a step of one source, under None): its flows, its removals by reason and a
    rewriting stage's counts. The driver holds these sums, not the markers (a step of 10^5
    shards is ~100 MB of markers)."""
    out: dict[str | None, dict] = {}
    for m in markers:
        src = (m["source"] if m["source"] is not None else "\x00") if "source" in m else None  # "source": null is no source's
        g = out.get(src)
        if g is None:  # a rewriting stage's counts: the keys its first marker has
            g = out[src] = {**{k: 0 for k in FLOWS}, "removed": {}, "extra": {k: 0 for k in EXTRA if k in m}}
        for k in FLOWS:
            g[k] += m[k]
        _merge_counts(g["removed"], m["removed"])
        for k in g["extra"]:
            g["extra"][k] += m[k]
    return out


def of_source(folded: dict[str | None, dict], source: str) -> dict:
    """A source's part of `fold`'s sums: its own markers' and those of no source."""
    parts = [g for k, g in folded.items() if k in (source, None)]
    out = {**{k: sum(g[k] for g in parts) for k in FLOWS}, "removed": {}, "extra": {}}
    for g in parts:
        _merge_counts(out["removed"], g["removed"])
        _merge_counts(out["extra"], g["extra"])
    out["extra"] = {k: out["extra"][k] for k in EXTRA if k in out["extra"]}
    return out


def source_entry(name: str, ingest: dict[int, dict], filt: dict[int, dict] | None, filter_names: list[str],
                 mix: dict, global_stages: list[tuple[str, dict]] = (), unread_files: list[dict] = ()) -> dict:
    """`global_stages`: (stage, this source's shard markers folded: `fold`) after the
    filters (dedup kinds, quality), in order; `mix`: kept (distinct documents in the mixture), rows, tokens,
    repeats, and not_selected (down-sampled out) or excluded; `unread_files`: the files of the
    ingest shards with a `stream_error` ({"file", "error"}, run/outputs.py finds their paths)."""
    records_in = _sum(ingest, "records_in")
    quarantined: dict[str, int] = {}
    for m in ingest.values():
        _merge_counts(quarantined, m.get("quarantined") or {})
    stream_errors = [m["stream_error"] for m in ingest.values() if m.get("stream_error")]
    stages: list[dict] = [{
        "stage": "ingest", "docs_in": records_in, "docs_out": _sum(ingest, "docs_out"),
        "chars_out": _sum(ingest, "chars"), "tokens_out": None if any(m.get("tokens", 0) is None for m in ingest.values()) else _sum(ingest, "tokens"),
        "quarantined": sum(quarantined.values()),
    }]
    skipped: dict[str, int] = {}
    for m in ingest.values():
        _merge_counts(skipped, m.get("skipped_records") or {})
    if skipped:  # WARC records that are not documents (request, metadata, warcinfo ...): not in `in`
        stages[0]["skipped_records"] = dict(sorted(skipped.items()))
    extraction = _extraction(ingest)
    removed: dict[str, dict[str, int]] = {}
    for fname in filter_names if filt else []:
        agg = {"docs_in": 0, "docs_out": 0, "chars_in": 0, "chars_out": 0, "tokens_in": 0, "tokens_out": 0}
        reasons: dict[str, int] = {}
        rewritten: dict[str, int] = {}  # a rewriter's counts: documents rewritten, spans, characters ... by kind
        for m in filt.values():
            st = m["stages"][fname]
            for k in agg:
                agg[k] = _add(agg[k], st[k])
            _merge_counts(reasons, st["removed"])
            _merge_counts(rewritten, st.get("rewritten") or {})
        if reasons:
            removed[filter_stage(fname)] = dict(sorted(reasons.items()))
        stages.append({"stage": filter_stage(fname), **agg, "removed": sum(reasons.values()),
                       **({"rewritten": dict(sorted(rewritten.items()))} if rewritten else {})})
    for stage, folded in global_stages:
        agg = {k: folded[k] for k in FLOWS}
        reasons = folded["removed"]
        if reasons:
            removed[stage] = dict(sorted(reasons.items()))
        stages.append({"stage": stage, **agg, "removed": sum(reasons.values()), **folded["extra"]})
    available = stages[-1]["docs_out"] if len(stages) > 1 else stages[0]["docs_out"]
    kept = mix["kept"]
    if mix.get("excluded"):  # "excluded" (mixture.exclude), or role_eval / role_reference
        if available:  # (an eval source's documents have all gone to validation/ before the mix)
            removed["mix"] = {mix["excluded"] if isinstance(mix["excluded"], str) else "excluded": available}
    elif mix.get("not_selected"):  # a count, or counts by reason (cells no weight names)
        ns = mix["not_selected"]
        got = {k: v for k, v in (ns.items() if isinstance(ns, dict) else [("not_selected", ns)]) if v}
        if got:
            removed["mix"] = dict(sorted(got.items()))
    removed_total = sum(sum(r.values()) for r in removed.values())
    q_total = sum(quarantined.values())
    stages.append({"stage": "mix", "docs_in": available, "docs_out": kept, "rows_out": mix["rows"],
                   "repeated_rows": mix["repeats"], "tokens_out": mix["tokens"]})
    return {
        "in": records_in,
        "kept": kept,
        "removed": removed,
        "removed_total": removed_total,
        "quarantined": q_total,
        "quarantined_by_reason": dict(sorted(quarantined.items())),
        "unreadable_streams": stream_errors,
        # records after a break in a compressed stream cannot be counted: never reported as 0
        "unread_after_corruption": "unknown" if stream_errors else 0,
        "unread_files": list(unread_files) or [{"file": None, "error": e} for e in stream_errors],
        "conservation": conservation(records_in == kept + removed_total + q_total, bool(stream_errors)),
        "stages": stages,
        **({"extraction": extraction} if extraction else {}),
    }


def _extraction(ingest: dict[int, dict]) -> dict | None:
    """HTML extraction in a web source's ingest: pages, the extractor's CPU seconds (pages
    that finished), timeouts, errors, crashes and extractor restarts, summed over shards."""
    ms = [m["extract"] for m in ingest.values() if m.get("extract")]
    if not any(m["pages"] for m in ms):  # e.g. WET files: text already, no extractor ran
        return None
    out = {"extractor": ms[0]["type"]}
    for k in ("pages", "cpu_seconds", "timeouts", "errors", "crashes", "restarts"):
        out[k] = round(sum(m.get(k, 0) for m in ms), 3)
    return out


def conservation(balanced: bool, uncounted: bool) -> bool | str:
    """A source's (or the run's) conservation: False when the counted records do not balance
    (whatever else is true), "unknown" when they do but some records could not be counted,
    else True. Never test it for truth: "unknown" is a non-empty string."""
    if not balanced:
        return False
    return "unknown" if uncounted else True


def build(entries: dict[str, dict]) -> dict:
    values = [e["conservation"] for e in entries.values()]
    return {
        "sources": entries,
        "conservation": conservation(False not in values, "unknown" in values),
        "totals": {k: sum(e[k] for e in entries.values()) for k in ("in", "kept", "removed_total", "quarantined")},
    }


def imbalance(ledger: dict) -> list[str]:
    """The sources whose counted records do not balance (conservation false; "unknown" is not)."""
    return [
        f"source {s}: in={e['in']} but kept+removed+quarantined={e['kept'] + e['removed_total'] + e['quarantined']} "
        f"(kept={e['kept']}, removed={e['removed_total']}, quarantined={e['quarantined']})"
        for s, e in ledger["sources"].items() if e["conservation"] is False
    ]


def unread_files(ledger: dict) -> list[dict]:
    """Every file whose records after a cut or an unreadable start were neither read nor
    counted: [{"source", "file", "error"}] ("file" None in a ledger written before the
    paths were recorded). Also read from such ledgers, whose conservation still said true
    beside `unread_after_corruption: "unknown"`."""
    out = []
    for s, e in ledger["sources"].items():
        files = e.get("unread_files")
        if files is None and e.get("unread_after_corruption") == "unknown":
            files = [{"file": None, "error": x} for x in e.get("unreadable_streams") or [None]]
        out += [{"source": s, **f} for f in files or []]
    return out


def describe_unread(files: list[dict], limit: int = 10) -> str:
    """'2 input files were cut or could not be read (...): <file> (source s); ...' for
    messages, the summary and the report; '' when there are none."""
    if not files:
        return ""
    named = [f"{f['file'] or '(a file whose path this ledger does not record)'} (source {f['source']})" for f in files[:limit]]
    more = f"; and {len(files) - limit} more (ledger.json: unread_files)" if len(files) > limit else ""
    n = len(files)
    return (f"{n} input file{'s were' if n > 1 else ' was'} cut or could not be read, so the records after the damage were "
            f"neither read nor counted (ledger conservation: unknown): " + "; ".join(named) + more)
