"""The dataset card of a published run: README.md with the hub's YAML front matter and a
body generated from the run's own files; no sentence is written per run by hand.

Every figure comes from ledger.json, manifest.json, report.json, run.json or a classifier's
eval.json, printed as it is there (integers with thousands separators, shares as recorded),
so a test can check the card field by field. What the run does not know, the card says it
does not know: no license in the YAML is `license: other` with a note; languages are those
of the mixture's `lang` column (the language filter's labels), with the rows that have none.
When the folder holds more than a dataset should (`publish.include`: removed documents,
texts as ingested, eval items), the card's first lines under the title say so (_opted_in).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from filters.classifiers import DEFAULT_TYPE
from filters.classifiers import family as classifier_family
from pipeline.shards import ledger
from pipeline.views import report
from pipeline.io import atomic, fs

SIZES = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
         (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B"),
         (10_000_000_000, "1B<n<10B"), (100_000_000_000, "10B<n<100B"), (1_000_000_000_000, "100B<n<1T")]


@dataclass
class Context:
    run_dir: Path
    record: dict
    ledger: dict
    manifest: dict
    files: list[dict]
    languages: dict[str, int]
    unknown_language_rows: int
    config_yaml: str = ""
    config_as_written: bool = False
    license: str | None = None
    pretty_name: str | None = None
    tags: list[str] = field(default_factory=list)
    report: dict = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)
    include: list[str] = field(default_factory=list)  # publish.include: what a dataset should not hold, published


def phase_names(record: dict, manifest: dict) -> list[str]:
    """The mixture's phases in the YAML's order (manifest.json sorts its keys)."""
    have = manifest.get("phases") or {}
    order = [p["name"] for p in (record["config"].get("mixture") or {}).get("phases") or []]
    return [n for n in order if n in have] + sorted(n for n in have if n not in order)


def size_category(n: int) -> str:
    return next((c for limit, c in SIZES if n < limit), "n>1T")


def tokens_after_filters(entry: dict) -> int | None:
    """A source's tokens once ingested and filtered (its ledger entry): the first point at
    which a filtered source's tokens are counted (pipeline/steps/filter.py)."""
    last = [st for st in entry["stages"] if st["stage"] == "ingest" or st["stage"].startswith("filter:")]
    return last[-1].get("tokens_out") if last else None


def _n(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " if i == 0 else " ---: " for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(_n(v).replace("|", "\\|").replace("\r", " ").replace("\n", " ") for v in r) + " |" for r in rows]
    return out + [""]


def front_matter(c: Context) -> dict:
    m = c.manifest
    phases = phase_names(c.record, m)
    val = any(f["split"] == "validation" for f in c.files)

    def files_of(prefix: str) -> list[dict]:
        out = [{"split": "train", "path": f"{prefix}train-*"}]
        return out + ([{"split": "validation", "path": "data/validation-*"}] if val else [])

    configs = ([{"config_name": p, "data_files": files_of(f"data/{p}/"), **({"default": True} if i == 0 else {})}
                for i, p in enumerate(phases)] or [{"config_name": "default", "data_files": files_of("data/")}])
    rows = m["phases"][phases[0]]["total_docs"] if phases else m["total_docs"]
    fm = {"configs": configs, "license": c.license or "other"}
    if not c.license:
        fm["license_name"] = "not-stated"
    codes = [k for k in c.languages if re.fullmatch(r"[a-z]{2,3}", k)]  # ISO 639-1/3, as the hub checks them
    if codes:
        fm["language"] = codes
    fm.update({"size_categories": [size_category(rows)], "task_categories": ["text-generation"],
               "pretty_name": c.pretty_name or c.record["name"],
               "tags": ["curate", "pretraining", "data-mixture", *[t for t in c.tags if t not in ("curate", "pretraining", "data-mixture")]]})
    return fm


def _when(t) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if t else "unknown"


def _eval(c: Context, name: str) -> dict | None:
    st = c.record["steps"].get(f"classify-{name}-train")
    if not st:
        return None
    p = fs.join(c.run_dir, st["dir"]) / "eval.json"
    return atomic.read_json(p) if p.exists() else None


def _intro(c: Context) -> str:
    rec, man, cfg = c.record, c.manifest, c.record["config"]
    used = [s for s, v in man["sources"].items() if v and v.get("realized_tokens")]
    toks = (f"**{_n(man['total_tokens'])} tokens** (counted with `{cfg.get('tokenizer')}`)" if cfg.get("tokenizer")
            else "tokens not counted (`tokenizer: null`)")
    phases = phase_names(rec, man)
    where = (f" in {len(phases)} training phases (the default configuration, `{phases[0]}`, has "
             f"{_n(man['phases'][phases[0]]['total_docs'])} rows)" if phases else "")
    return (f"A pretraining data mixture of **{_n(man['total_docs'])} rows** and {toks}{where}, from {len(used)} sources, "
            f"made by Curate {rec.get('curate_version')} (run `{rec['name']}`, configuration `{rec['config_hash'][:12]}`, "
            f"finished {_when(rec.get('finished'))}). Everything below is generated from the run's ledger, manifest and "
            "report; `curate/` holds those files.")


def _unknown_loss(c: Context) -> list[str]:
    """The card's first lines when input files were cut (published with --allow-unknown-loss)."""
    files = ledger.unread_files(c.ledger)
    if not files:
        return []
    n = len(files)
    return [f"**Unknown loss: {n} input file{'s were' if n > 1 else ' was'} cut or could not be read, so the records after the "
            "damage were neither read nor counted (ledger conservation: unknown): this dataset may lack documents that the "
            "counts below do not show. Published with `--allow-unknown-loss`.** Files: "
            + "; ".join(f"`{f['file'] or '(path not recorded)'}` (source `{f['source']}`)" for f in files) + ".", ""]


def _accounted(led: dict) -> str:
    if not ledger.unread_files(led):
        return "Every document is accounted for: in = kept + removed + quarantined for every source"
    return ("Every document read is accounted for: in = kept + removed + quarantined for every source; the records after the "
            "damage in the input files named at the top were neither read nor counted")


INCLUDED = {
    "removed_samples": "documents the run removed (`samples/*/removed.jsonl`: filtered and deduplicated documents, "
                       "quarantined records)",
    "original_texts": "texts as ingested (a sample's `original`, before rewriters such as PII redaction, and dedup "
                      "survivors' texts)",
    "eval_items": "eval items (the eval sources' documents in `samples/` and the validation split, and the documents "
                  "decontamination removed): benchmark data, which must not be trained on",
}
WITHHELD = {
    "removed_samples": "removed documents",
    "original_texts": "texts as ingested (before rewriters such as PII redaction)",
    "eval_items": "eval items",
}


def _opted_in(c: Context) -> list[str]:
    """The card's first lines when the folder holds what a dataset should not (publish.include)."""
    if not c.include:
        return []
    risks = {"removed_samples": "content the filters removed", "original_texts": "personal data that redaction replaced",
             "eval_items": "benchmark items"}
    return [f"> **Not only a dataset**: published because the run asked for them (`publish.include: "
            f"[{', '.join(c.include)}]`), this folder also holds {'; '.join(INCLUDED[k] for k in c.include)}. They may "
            f"carry {', '.join(risks[k] for k in c.include)}: review them before you upload the folder.", ""]


def render(c: Context) -> str:
    rec, led, man, cfg = c.record, c.ledger, c.manifest, c.record["config"]
    name = c.pretty_name or rec["name"]
    val = [f for f in c.files if f["split"] == "validation"]
    mixed = {s: v for s, v in man["sources"].items() if v}
    L = ["---", yaml.safe_dump(front_matter(c), sort_keys=False, allow_unicode=True).rstrip(), "---", "",
         f"# {name}", "",
         *_unknown_loss(c),
         *_opted_in(c),
         _intro(c), "",
         "## Loading", "", "```python", "from datasets import load_dataset", "",
         "ds = load_dataset(\"path/to/this/folder\")  # or the hub repository it is uploaded to",
         "```", ""]
    phases = phase_names(rec, man)
    if phases:
        L += [f"The mixture has training phases, one configuration each (`{'`, `'.join(phases)}`; the first is the default): "
              f"`load_dataset(folder, \"{phases[-1]}\")`.", ""]
    L += ["Columns: `id`, `text`, `source`, `source_id` (input file and line or row), `n_tokens`, `epoch` (0 the first time a "
          "document appears; a repeated document appears again with the next epoch), `quality_score`, `quality_bucket`, "
          "`topic`, `topic_score`, `lang` (null where the source has no such stage).", ""]

    L += ["## Sources", ""]
    L += _table(["source", "role", "documents in", "kept", "removed", "quarantined", "tokens after filters", "tokens in the mixture"],
                [[s, cfg["sources"][s].get("role", "train"), e["in"], e["kept"], e["removed_total"], e["quarantined"],
                  tokens_after_filters(e), (man["sources"].get(s) or {}).get("realized_tokens", 0)]
                 for s, e in led["sources"].items()])
    L += [f"{_accounted(led)} (ledger conservation: {_n(led['conservation'])}). Inputs: " + "; ".join(
        f"`{s}` {', '.join(f'`{p}`' for p in v['paths'])}" for s, v in cfg["sources"].items()) + ".", ""]

    L += ["## Filters and removals", ""]
    for s, v in cfg["sources"].items():
        if v.get("filters"):
            L.append(f"- `{s}`: " + " → ".join(f"`{f}` ({_params(cfg['filters'].get(f, {}))})" for f in v["filters"]))
    L += ["", "Documents removed, by stage and reason:", ""]
    L += _table(["source", "stage", "reason", "documents"],
                [[s, st, r, n] for s, e in led["sources"].items() for st, rs in e["removed"].items() for r, n in rs.items()])
    rw = [[s, st, k, n] for s, e in led["sources"].items() for st, v in report._rewritten(e["stages"]).items() for k, n in v.items()]
    if rw:
        L += ["Text changed in the documents kept (rewriters, paragraph dedup, decontamination's cuts):", ""]
        L += _table(["source", "stage", "change", "count"], rw)

    if cfg.get("dedup"):
        d = cfg["dedup"]
        parts = []
        if d.get("exact"):
            ex = d["exact"]
            parts.append(f"exact (the same URL in `{ex.get('url_field')}`, the latest `{ex.get('date_field')}` kept)"
                         if ex.get("key") == "url" else
                         f"exact (the same text after folding {', '.join(ex.get('normalize') or []) or 'nothing'})")
        if d.get("fuzzy"):
            fz = d["fuzzy"]
            parts.append(f"near-duplicate (MinHash over {fz['ngram']}-grams, {fz['num_perm']} permutations in {fz['bands']} bands, "
                         f"Jaccard ≥ {fz['threshold']}, {'every candidate verified' if fz.get('verify') else 'not verified'})")
        if d.get("paragraph"):
            parts.append(f"paragraph (a paragraph of ≥ {d['paragraph']['min_chars']} characters seen more than "
                         f"{d['paragraph']['max_occurrences']} times is cut)")
        order = d.get("priority") or list(cfg["sources"])
        L += ["## Deduplication", "", "Across all sources: " + "; ".join(parts) + ". A duplicate group keeps the document of the "
              f"source first in {'`dedup.priority`' if d.get('priority') else 'the YAML'} ({', '.join(order)}), then the smallest id.", ""]
        L += _table(["source", "stage", "documents removed"],
                    [[s, st, sum(rs.values())] for s, e in led["sources"].items() for st, rs in e["removed"].items()
                     if st.startswith("dedup:")])

    if cfg.get("classifiers"):
        L += ["## Classifiers", ""]
        for cn, cv in cfg["classifiers"].items():
            ev = _eval(c, cn)
            used = [s for s, v in cfg["sources"].items() if (v.get("quality") or {}).get("classifier") == cn
                    or (v.get("topic") or {}).get("classifier") == cn]
            fam = classifier_family(cv.get("type") or DEFAULT_TYPE)
            pre = cv.get(fam.Params.pretrained_key)
            how = (f"pretrained model `{pre}`" if pre else
                   f"{fam.title} trained in the run: labels {', '.join(f'`{k}` ← {_names(v)}' for k, v in cv['labels'].items())}"
                   if cv.get("labels") else
                   f"{fam.title} trained in the run from the graded annotations `{Path(cv['annotations']).name}`"
                   if cv.get("annotations") else
                   f"{fam.title} trained in the run: positive {_names(cv.get('positive'))}, negative {_names(cv.get('negative'))}")
            L += [f"- `{cn}` ({how}), used by {', '.join(f'`{u}`' for u in used) or 'no source'}."]
            if ev and "roc_auc" in ev:
                ex = ev.get("examples", {})
                L += ["", *_table(["classifier", "train examples (pos + neg)", "held-out examples", "ROC AUC", "F1 at 0.5",
                                   "precision", "recall"],
                                  [[cn, f"{_n(ex.get('train', {}).get('positive'))} + {_n(ex.get('train', {}).get('negative'))}",
                                    f"{_n(ev.get('positives'))} + {_n(ev.get('negatives'))}", ev["roc_auc"], ev["f1"],
                                    ev["precision"], ev["recall"]]])]
            elif ev and "spearman" in ev:
                ex = ev.get("examples", {})
                L += ["", *_table(["classifier", "train annotations", "held-out annotations", "Spearman", "Pearson", "MAE"],
                                  [[cn, _n(ex.get("train")), _n(ex.get("validation")), ev["spearman"], ev["pearson"],
                                    ev["mae"]]])]
            elif ev and "labels" in ev:
                L += ["", *_table(["label", "precision", "recall", "F1", "held-out support"],
                                  [[k, v.get("precision"), v.get("recall"), v.get("f1"), v.get("support")]
                                   for k, v in ev["labels"].items()])]
        L.append("")

    L += ["## Mixture", "", (f"Target {_n(man.get('target_tokens'))} tokens; weights are token shares." if man.get("target_tokens")
                             else "Weights are token shares; the phases below give the targets."), ""]
    L += _table(["source", "target weight", "realised weight", "target tokens", "tokens", "rows", "distinct documents", "epochs"],
                [[s, v["weight"], v["realized_weight"], v["target_tokens"], v["realized_tokens"], v["docs"],
                  v.get("distinct_docs"), v["epochs"]] for s, v in mixed.items()])
    cells = man.get("cells") or {}
    if cells and any(k not in mixed for k in cells):
        L += ["Cells (a source, or a range of its quality buckets or topics):", ""]
        L += _table(["cell", "target weight", "realised weight", "tokens", "rows", "distinct documents", "epochs"],
                    [[k, v["target_weight"], v["realized_weight"], v["tokens"], v["documents"], v["distinct_documents"],
                      v["epochs"]] for k, v in cells.items()])
    for pn in phases:
        ph = man["phases"][pn]
        L += [f"Phase `{pn}`: {_n(ph['total_docs'])} rows, {_n(ph['total_tokens'])} tokens (target {_n(ph['target_tokens'])}).", ""]
        L += _table(["cell", "target weight", "realised weight", "tokens", "rows", "distinct documents", "epochs"],
                    [[k, v["target_weight"], v["realized_weight"], v["tokens"], v["documents"], v["distinct_documents"],
                      v["epochs"]] for k, v in ph["cells"].items()])

    shown = {f.get("source") for f in val}
    held = [s for s, v in (man.get("validation") or {}).items() if s not in shown and v.get("docs")]
    if val or held:
        roles = {man["validation"][s].get("role") for s in shown}
        what = []
        if "train" in roles:
            what.append("held-out documents (a seeded share of each train source, after dedup and decontamination, never mixed)")
        if roles - {"train"}:
            what.append("the documents of the run's eval sources (benchmarks it decontaminates against, never mixed)")
        L += ["## Validation split", ""]
        if val:
            L += ["The `validation` split holds " + " and ".join(what) + ", in the mixture's columns.", ""]
            L += _table(["source", "role", "documents", "tokens"],
                        [[s, v.get("role"), v["docs"], v["tokens"]] for s, v in man["validation"].items() if s in shown])
        if held:
            L += [f"Not published: the validation documents of {', '.join(f'`{s}`' for s in held)}, eval items that a "
                  "published copy would spread into future crawls; `publish.include: [eval_items]` publishes them.", ""]
    con = (c.report or {}).get("contamination")
    if con:
        cut = (cfg.get("decontaminate") or {}).get("action") == "cut"
        L += ["## Contamination", "", ("The parts of documents containing an eval item were cut out" if cut else
                                       "Documents containing an eval item were removed") + " (`decontaminate`); what was found:", ""]
        L += _table(["eval set", "items", "items found in the corpus", "share"],
                    [[es, v["items"], v["items_found"], v["share_found"]] for es, v in con["eval_sets"].items()])
        L += _table(["source", "eval set", "documents cut" if cut else "documents removed"],
                    [[s, es, v["documents"]] for s, sets in con["by_source"].items() for es, v in sets.items()])

    L += ["## Files", ""]
    L += _table(["file", "split", "rows", "tokens", "sha256"], [[f["path"], f["split"], f["rows"], f.get("tokens"), f["sha256"]]
                                                                 for f in c.files])
    L += ["The train files are copies of the run's mixture files, byte for byte (their sha256, checked while copying, is "
          "the manifest's); the validation files hold the run's `validation/` rows of the sources above in the mixture's "
          "columns. `curate/files.json` maps each to the run file it came from.", ""]

    reused = [k for k, v in rec["steps"].items() if not v.get("computed")]
    commit = rec.get("curate_commit")
    L += ["## How it was made", "",
          f"- Curate {rec.get('curate_version')}, "
          + (f"commit `{commit.removesuffix('+dirty')}`" + (" with uncommitted changes" if commit.endswith("+dirty") else "")
             if commit else "an installed copy (no git checkout)") + "; "
          + ", ".join(f"{k} {v}" for k, v in (rec.get("versions") or {}).items() if k != "curate") + ".",
          f"- The mixture file `{Path(rec.get('mixture_file') or '').name}`"
          + (f", in a repository at commit `{rec['git_commit']}`." if rec.get("git_commit") else " (not in a git repository)."),
          f"- Run `{rec['name']}` ({rec.get('run_id')}): started {_when(rec.get('started'))}, finished {_when(rec.get('finished'))}, "
          f"{rec.get('seconds')} s; seed {cfg.get('seed')}. "
          + (f"{len(reused)} of {len(rec['steps'])} steps were reused from earlier runs, found by the hash of their "
             "configuration and inputs (not of Curate's code); the version above is this run's." if reused else
             "Every step was computed in this run."), "",
          ("The mixture file as written (`curate/mixture.yaml`; it still gives the run's configuration hash):"
           if c.config_as_written else "The configuration as the run recorded it, every default spelled out "
           "(`curate/mixture.yaml`; the mixture file has changed or moved since):"), "", _fence(c.config_yaml) + "yaml",
          c.config_yaml.rstrip(), _fence(c.config_yaml), "",
          "Every step, by the hash of its configuration and inputs:", ""]
    L += _table(["step", "hash", "shards", "computed in this run", "reused by content"],
                [[k, v["hash"], v.get("shards"), v.get("computed", 0), v.get("reused", 0)] for k, v in rec["steps"].items()])

    L += ["## Samples and report", ""]
    if c.samples:
        kinds = (["removed, with their stage and reason"] if "removed_samples" in c.include else []) \
            + (["a rewritten document beside its text as ingested"] if "original_texts" in c.include else [])
        L += ["- [samples/index.html](samples/index.html): sample documents kept in the mixture, as they are there, with "
              "their scores" + "".join(f"; {k}" for k in kinds) + "; the same records as JSONL: "
              + (", ".join(f"[{p}]({p})" for p in c.samples if p.endswith(".jsonl")) or "none") + "."]
    withheld = [WITHHELD[k] for k in WITHHELD if k not in c.include]
    if withheld:
        L += [f"- Not published: {', '.join(withheld)}. The run directory's `samples/` has them; `publish.include` "
              "(or `curate publish --include`) publishes them, and the card then says so first."]
    L += ["- [report.html](report.html): the funnel per source, removals, quality buckets, the mixture, contamination.",
          "- [curate/ledger.json](curate/ledger.json), [curate/manifest.json](curate/manifest.json), "
          "[curate/run.json](curate/run.json): the run's own record.", ""]

    L += ["## What this card does not know", ""]
    if not c.license:
        L.append("- **License**: the configuration gives none (`publish.license` or `curate publish --license`), so the card "
                 "says `other`; the licenses of the inputs apply (sources and their paths under Sources above).")
    lid = [s for s, v in cfg["sources"].items() if any((cfg["filters"].get(f) or {}).get("type") == "language" for f in v.get("filters") or [])]
    total = sum(c.languages.values()) + c.unknown_language_rows
    L.append(f"- **Languages**: from language ID on {', '.join(f'`{s}`' for s in lid) or 'no source'}: "
             + (", ".join(f"{k} {_n(v)} rows" for k, v in c.languages.items()) or "none")
             + f"; {_n(c.unknown_language_rows)} of {_n(total)} rows come from sources without language ID and have no language.")
    other = [k for k in c.languages if not re.fullmatch(r"[a-z]{2,3}", k)]
    if other:
        L.append(f"- Language labels that are not ISO 639 codes are left out of the front matter: {', '.join(other)}.")
    return "\n".join(L) + "\n"


def _names(xs) -> str:
    return ", ".join(f"`{x}`" for x in xs or []) or "none"


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`, so nothing in it closes the block."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _params(p: dict) -> str:
    """A filter's type and the parameters the configuration sets away from their defaults."""
    from filters import base

    try:
        keep = base.parse_params(p).model_dump(mode="json", exclude_defaults=True, by_alias=True)
    except Exception:  # a type this Curate no longer knows: what the run recorded
        keep = dict(p)
    keep.pop("type", None)
    return p.get("type", "?") + (" {" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in keep.items()) + "}" if keep else "")
