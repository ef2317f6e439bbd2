"""What a published folder may hold of a run's samples, and what it holds only when the user
opts in (`publish.include`, `curate publish --include`).

A run's samples/ serve the person curating: removed documents beside their reasons, a
rewritten text beside its text as ingested, the eval item a document was removed for. A
dataset uploaded from the published folder must not carry those: the text as ingested is
what PII redaction replaced, removed documents are the content the filters dropped, and
eval items republished spread benchmark contamination into future crawls. So publish keeps,
by default, only what a dataset may contain: the kept documents of train sources as they
are in the mixture (after rewriters). Each other kind is published only when named:

    removed_samples   samples/<source>/removed.jsonl: removed documents and quarantined records
    original_texts    a sample's `original` (its text as ingested) and a dedup survivor's text
    eval_items        the eval sources' samples and validation split, a contaminated sample's
                      eval item, the documents decontamination removed or that duplicate an
                      eval item, and (with original_texts) the ingested text of those it cut

The run directory's own samples/ are left as they are; samples/index.html is written again
from the records published.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import orjson

from pipeline.config.models import PublishInclude
from pipeline.errors import UsageError
from pipeline.io import atomic, html

KINDS: tuple[str, ...] = get_args(PublishInclude)


def include_of(given, spec: dict) -> list[str]:
    """The kinds published: `given` (a list, or the CLI's comma-separated text; "" or "none":
    nothing), else the run's `publish.include`; in KINDS' order."""
    if given is None:
        given = spec.get("include") or []
    if isinstance(given, str):
        given = [] if given.strip().lower() in ("", "none") else [x.strip() for x in given.split(",") if x.strip()]
    bad = [x for x in given if x not in KINDS]
    if bad:
        raise UsageError(f"publish: --include {', '.join(bad)} is not a kind publish knows; name some of "
                         f"{', '.join(KINDS)} separated by commas (or none)")
    return [k for k in KINDS if k in given]


def _from_eval(stages) -> bool:
    return any(str(s).startswith("decontaminate") for s in stages or [])


def record(r: dict, include: list[str], eval_sources: set[str]) -> dict | None:
    """The sample record as published, or None when it is not published at all."""
    evals = "eval_items" in include
    if r.get("status") != "kept" and "removed_samples" not in include:
        return None
    if not evals and ((r.get("stage") or "").startswith("decontaminate") or "eval_item" in r
                      or (r.get("survivor") or {}).get("source") in eval_sources):
        return None  # its text holds an eval item, or duplicates one
    r = dict(r)
    if "original" in r and ("original_texts" not in include or (not evals and _from_eval(r.get("rewritten_by")))):
        del r["original"]  # kept or cut text as ingested: before PII redaction, or with the eval item cut out
    if "survivor" in r and "original_texts" not in include:
        r["survivor"] = {k: v for k, v in r["survivor"].items() if k != "text"}  # read as ingested
    return r


def samples(run_dir: Path, tmp: Path, record_: dict, man: dict, include: list[str]) -> list[str]:
    """Write the published samples/ into `tmp` (the folder being built); returns their paths."""
    roles = {s: (v or {}).get("role", "train") for s, v in record_["config"]["sources"].items()}
    evals = {s for s, r in roles.items() if r == "eval"}
    written, records = [], []
    for entry in man.get("samples") or []:
        rel = entry["path"]
        parts = rel.split("/")
        if len(parts) != 3 or not rel.endswith(".jsonl"):
            continue  # samples/index.html: written again below from what is published
        source, name = parts[1], parts[2]
        if roles.get(source) == "eval" and "eval_items" not in include:
            continue
        if name == "removed.jsonl" and "removed_samples" not in include:
            continue
        kept = [x for x in (record(orjson.loads(line), include, evals) for line in (run_dir / rel).read_bytes().splitlines()) if x]
        atomic.write_bytes(tmp / rel, b"".join(orjson.dumps(x) + b"\n" for x in kept))
        written.append(rel)
        records += kept
    if written or man.get("samples"):
        note = (f"{len(records):,} sample documents of run {record_['name']}, chosen by a seeded hash: the kept documents "
                "as they are in the mixture" + "".join(f"; {k.replace('_', ' ')} (publish.include)" for k in include))
        atomic.write_bytes(tmp / "samples" / "index.html",
                           html.viewer(f"Samples of {record_['name']}", records, note).encode("utf-8"))
        written.append("samples/index.html")
    return written


def validation_published(role: str | None, include: list[str]) -> bool:
    """Whether a validation source's files go into the published validation split."""
    return (role or "train") == "train" or "eval_items" in include
