"""The mixture YAML as frozen, typed config, with errors that point at the line.

Loading has three passes, each reporting every problem it finds, not only the first:
1. YAML is parsed with its node marks, so any key path maps back to a line.
2. pydantic validates shapes and types (`extra="forbid"`: a typo is an error); each
   `filters.<name>` mapping is validated by the registered type's own Params model.
3. References between sections are checked (filters, classifiers, sources, weights).
Globs are checked by `resolve_inputs` (pipeline/io/discover.py), used by `validate` and `run`.

An error reads `mixtures/x.yaml:12: sources.web.filters[2]: unknown filter 'gopher';
defined: english, gopher_quality`.

Sections whose steps are later capabilities (weighted mixtures, samples)
parse and validate now; `unimplemented()` names them so `run` refuses clearly rather
than skipping them silently.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from filters import base as filter_base
from pipeline.errors import NotImplementedYet, UsageError
from pipeline.io import fs


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QualitySpec(Model):
    classifier: str = Field(description="name of a classifier defined under `classifiers`")
    keep_fraction: float | None = Field(None, gt=0, le=1, description="keep this top fraction by score")
    min_score: float | None = Field(None, ge=0, le=1, description="keep documents scoring at least this")
    max_score: float | None = Field(None, ge=0, le=1, description="keep documents scoring at most this (a safety classifier, "
                                    "e.g. a toxicity model's positive label: drop what scores above)")
    buckets: int | None = Field(None, ge=2, le=1000, description="label every document with its exact quantile bucket of "
                                "the score within its source (1 = lowest scores .. N = highest; sizes differ by at most one "
                                "document), over the documents that reach the quality stage; `mixture.weights` may then "
                                "weight `source/q<k>` or `source/q<a>-q<b>`")
    edges: list[float] | None = Field(None, min_length=1, description="score edges instead of quantiles: bucket k holds "
                                      "scores in [edges[k-2], edges[k-1]) (ascending, between 0 and 1)")

    @model_validator(mode="after")
    def _buckets(self):
        if self.buckets is not None and self.edges is not None:
            raise ValueError("give buckets (quantiles) or edges (score cut points), not both")
        if self.edges is not None:
            e = self.edges
            if any(not 0 < x < 1 for x in e) or any(a >= b for a, b in zip(e, e[1:])):
                raise ValueError(f"edges must be strictly ascending and between 0 and 1; got {e}")
        return self

    def n_buckets(self) -> int | None:
        return self.buckets if self.buckets is not None else (len(self.edges) + 1 if self.edges is not None else None)


class TopicSpec(Model):
    classifier: str = Field(description="name of a classifier under `classifiers` with `labels` (or a pretrained "
                            "multi-class `model`)")


class _ExtractBase(Model):
    timeout: float = Field(5.0, gt=0, description="CPU seconds one page may take; a page over it is quarantined as "
                           "extract_timeout (a wall-clock guard of 4x this + 10 s catches pages that hang without computing)")
    max_memory_mb: int = Field(2048, ge=256, description="address space of the extractor process; a page that needs more "
                               "is quarantined (extract_error: MemoryError, or extract_crash) and the shard goes on")


class ResiliparseExtract(_ExtractBase):
    """resiliparse's extract_plain_text (the default; as DCLM): fast, main-content heuristics."""

    type: Literal["resiliparse"] = "resiliparse"
    main_content: bool = Field(True, description="keep only the main content (drop navigation, headers, footers)")
    preserve_formatting: bool = Field(True, description="keep line breaks, paragraphs and lists")
    list_bullets: bool = Field(True, description="bullets and numbers for list items")
    alt_texts: bool = Field(False, description="keep images' alternative texts")
    links: bool = Field(False, description="keep link targets")
    form_fields: bool = Field(False, description="keep form fields")
    noscript: bool = Field(False, description="keep <noscript> content")
    comments: bool = Field(False, description="treat comment sections as main content")
    skip_elements: list[str] | None = Field(None, description="CSS selectors of elements to drop")


class TrafilaturaExtract(_ExtractBase):
    """trafilatura.extract (as FineWeb and datatrove); its cross-page `deduplicate` cache is not offered: results would
    depend on which pages a worker saw before (paragraph dedup does that across the corpus)."""

    type: Literal["trafilatura"] = "trafilatura"
    favor_precision: bool = Field(True, description="less text, more surely main content (as FineWeb)")
    favor_recall: bool = Field(False, description="more text, less surely main content")
    include_comments: bool = Field(False, description="keep comment sections")
    include_tables: bool = Field(True, description="keep tables' text")
    include_images: bool = Field(False, description="keep image descriptions")
    include_links: bool = Field(False, description="keep link targets")
    include_formatting: bool = Field(False, description="keep bold/italic markup")


class PythonExtract(_ExtractBase):
    """Your own function, run in the same sandbox with the same time limit."""

    type: Literal["python"] = "python"
    callable: str = Field(description="module:function taking the page's HTML (str) and returning its text")


ExtractSpec = Annotated[ResiliparseExtract | TrafilaturaExtract | PythonExtract, Field(discriminator="type")]
WEB_FORMATS = ("warc", "html")


class SourceSpec(Model):
    paths: list[str] = Field(min_length=1, description="files, globs or directories; relative to the YAML file")
    format: Literal["jsonl", "parquet", "hf", "warc", "html"] | None = Field(
        None, description="inferred from the file name when omitted (.jsonl/.json[.gz|.zst], .parquet, a saved HF "
        "dataset directory, .warc[.gz] (WET too), .html/.htm)"
    )
    extract: ExtractSpec | None = Field(
        None, description="HTML to text for warc and html sources and for `html_field`: resiliparse (the default, as "
        "DCLM), trafilatura (as FineWeb) or python, with their options and a per-page time limit")
    html_field: str | None = Field(None, description="jsonl/parquet/hf: the field holding raw HTML, extracted into the "
                                   "document's text (text_field is then not read)")
    text_field: str = Field("text", description="the field holding the document text")
    id_field: str | None = Field(None, description="the field holding a stable id; a content hash is used when omitted")
    hf_split: str | None = Field(None, description="for a saved DatasetDict: which split to read")
    hf_builder: str | None = Field(
        None, description="read the matched files through datasets.load_dataset(hf_builder, data_files=...), "
        "streaming: csv, json, text, parquet, ...; implies format: hf")
    filters: list[str] = Field(default_factory=list, description="names from the `filters` section, applied in order")
    role: Literal["train", "eval", "reference"] = Field(
        "train", description="train: mixed; eval: filtered and deduplicated, never mixed, a decontamination reference "
        "(`decontaminate.against`); reference: only a dedup reference (train documents that duplicate it are removed, "
        "it emits nothing). Dedup never removes an eval or reference document in favour of a train one")
    quality: QualitySpec | None = Field(None, description="score with a classifier and keep the best")
    topic: TopicSpec | None = Field(None, description="label every kept document with a multi-class classifier's top "
                                    "label (topic, topic_score); `mixture.weights` may then weight `source/<topic>` "
                                    "and `source/<topic>/q<k>`")
    on_bad_record: Literal["quarantine", "fail"] = Field(
        "quarantine", description="quarantine: keep going and record file, line and error; fail: stop at the first bad record"
    )
    max_shard_rows: int = Field(50_000, ge=1, description="split inputs into shards of at most this many records")
    max_shard_bytes: int = Field(64 << 20, ge=1 << 10, description="split uncompressed JSONL into byte ranges of about this size")
    max_epochs: float | None = Field(None, gt=0, description="this source's cap on repetition in the mixture (overrides mixture.max_epochs)")
    max_doc_bytes: int = Field(64 << 20, ge=1, description="a record larger than this (UTF-8 bytes of the JSONL line "
                               "or of the text) is quarantined as too_large instead of risking a worker's memory")

    @model_validator(mode="after")
    def _web(self):
        if self.format in WEB_FORMATS and self.id_field:
            raise ValueError(f"id_field does not apply to format {self.format}: documents get a content id, and the "
                             "WARC-Record-ID (warc) or file name (html) is kept as source_id; remove id_field")
        if self.format in WEB_FORMATS and self.html_field:
            raise ValueError(f"html_field is for jsonl, parquet and hf sources holding HTML in a field; a {self.format} "
                             "source is HTML already: remove html_field")
        if self.extract is not None and self.html_field is None and self.format not in WEB_FORMATS + (None,):
            raise ValueError(f"extract needs HTML: set html_field to the field holding it (format {self.format})")
        return self

    def extractor(self, fmt: str | None = None) -> dict | None:
        """The extraction spec in force for files of format `fmt`: None for text sources."""
        if self.html_field is None and (fmt or self.format) not in WEB_FORMATS:
            return None
        return (self.extract or ResiliparseExtract()).model_dump(mode="json")


Normalize = list[Literal["whitespace", "case", "punctuation", "digits"]]


class ExactDedupSpec(Model):
    key: Literal["text", "url"] = Field(
        "text", description="text: documents with the same normalised text; url: documents with the same URL (re-crawls "
        "of a page), keeping the latest crawl date")
    url_field: str = Field("url", description="key url: the metadata field holding the URL")
    date_field: str = Field("crawl_date", description="key url: the metadata field holding the crawl date (ISO 8601); "
                            "undated documents lose to dated ones")
    normalize: Normalize = Field(
        default_factory=lambda: ["whitespace", "case"],
        description="what to fold before hashing: whitespace (runs to one space), case, punctuation (to spaces), "
        "digits (numbers to 0), as datatrove's simplify_text")


class FuzzyDedupSpec(Model):
    ngram: int = Field(5, ge=1, description="word n-gram shingle size")
    num_perm: int = Field(112, ge=1, description="MinHash permutations")
    bands: int = Field(14, ge=1, description="LSH bands")
    rows: int | None = Field(None, ge=1, description="rows per band; default num_perm // bands")
    threshold: float = Field(0.8, gt=0, le=1, description="Jaccard similarity at which documents are near-duplicates")
    seed: int = Field(0, description="MinHash seed")
    verify: bool = Field(True, description="check every candidate pair's true Jaccard similarity before removing")
    normalize: Normalize = Field(
        default_factory=lambda: ["case", "punctuation", "digits"],
        description="what to fold before shingling (words are split on whitespace either way)")


class ParagraphDedupSpec(Model):
    min_chars: int = Field(50, ge=0, description="paragraphs shorter than this are never removed")
    max_occurrences: int = Field(5, ge=1, description="a paragraph seen more often than this is removed after its first occurrences")
    unit: Literal["paragraph", "line"] = Field("paragraph", description="paragraphs are split on blank lines, lines on newlines")
    min_doc_chars: int = Field(0, ge=0, description="a document left shorter than this after cuts is removed (empty ones always are)")


class DedupSpec(Model):
    exact: ExactDedupSpec | None = Field(None, description="exact duplicates of normalised text")
    fuzzy: FuzzyDedupSpec | None = Field(None, description="near-duplicates: MinHash LSH, verified")
    paragraph: ParagraphDedupSpec | None = Field(None, description="repeated paragraphs")
    priority: list[str] | None = Field(None, description="source order for choosing survivors; default: YAML order")
    partitions: int | None = Field(None, ge=1, description="shuffle partitions; default: from the number of documents")


class EvalSetSpec(Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the eval set's name, as reasons and the report give it")
    paths: list[str] = Field(min_length=1, description="JSONL (.gz, .zst) or Parquet files of eval items; relative to the YAML file")
    text_fields: list[str] = Field(["text"], min_length=1, description="fields joined (one per line) into an item's text, e.g. [question, choices, answer]")
    id_field: str | None = Field(None, description="the item's id; default: <file name>:<line or row>")


class DecontaminateSpec(Model):
    against: list[EvalSetSpec | str] = Field(min_length=1, description="the eval sets no training document may contain: "
                                             "files ({name, paths, text_fields, id_field}) or the names of sources with role: eval")
    ngram: int = Field(13, ge=3, le=64, description="n-gram length in words (lowercased word tokens: runs of letters, digits, '_')")
    unit: Literal["paragraph", "document"] = Field("paragraph", description="what is compared with each eval item: each paragraph (split on blank lines) or the whole document")
    min_overlap: float = Field(0.5, gt=0, le=1, description="a unit is contaminated when this share of its n-grams is found in one eval item")
    min_unit_words: int | None = Field(None, ge=1, description="units with fewer words are not checked; default: ngram")
    action: Literal["remove", "cut"] = Field("remove", description="remove a contaminated document, or cut its contaminated "
                                             "units (a document left empty is removed)")


class ClassifierSpec(Model):
    type: Literal["fasttext"] = Field("fasttext", description="the classifier kind")
    positive: list[str] = Field(default_factory=list, description="sources (after their filters and dedup) or files "
                                "(.txt a line each, .jsonl with `text`, .parquet; relative to the YAML file) of positive examples")
    negative: list[str] = Field(default_factory=list, description="sources or files of negative examples")
    labels: dict[str, list[str]] | None = Field(None, description="a multi-class (topic) classifier instead of positive/"
                                                "negative: label -> the sources or files of its examples")
    model: str | None = Field(None, description="a pretrained fastText model file (relative to the YAML file) instead of training")
    label: str = Field("__label__hq", description="the positive label")
    max_examples_per_class: int = Field(20_000, ge=1, description="cap on training examples per class")
    epochs: int = Field(5, ge=1, description="fastText epochs")
    lr: float = Field(0.1, gt=0, description="fastText learning rate")
    word_ngrams: int = Field(2, ge=1, description="fastText word n-grams")
    dim: int = Field(100, ge=1, description="fastText vector size")
    min_count: int = Field(1, ge=1, description="fastText minimum word count")
    loss: Literal["softmax", "hs", "ns", "ova"] = Field("softmax", description="fastText loss")
    bucket: int = Field(200_000, ge=1, description="fastText hash buckets for word n-grams (model size: bucket x dim x 4 bytes)")
    lowercase: bool = Field(False, description="lowercase text before training and scoring")
    seed: int = Field(0, description="sampling seed")


class ValidationSpec(Model):
    fraction: float | None = Field(None, gt=0, lt=1, description="share of each train source's documents held out")
    tokens: int | None = Field(None, ge=1, description="tokens held out of each train source (instead of fraction)")

    @model_validator(mode="after")
    def _one(self):
        if (self.fraction is None) == (self.tokens is None):
            raise ValueError("give exactly one of fraction (a share of documents) or tokens")
        return self


class PhaseSpec(Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the phase's folder: mixture/<name>/")
    target_tokens: int | None = Field(None, ge=1, description="tokens of this phase")
    weights: dict[str, float] | None = Field(None, description="token shares of this phase per cell (as mixture.weights)")
    sample_rates: dict[str, float] | None = Field(None, description="instead of weights: multiples of each cell's kept tokens")

    @field_validator("weights", "sample_rates")
    @classmethod
    def _non_negative(cls, v):
        if v is not None and any(w < 0 for w in v.values()):
            raise ValueError(f"must be >= 0; negative: {', '.join(k for k, w in v.items() if w < 0)}")
        return v


class MixtureSpec(Model):
    target_tokens: int | None = Field(None, ge=1, description="tokens in the final mixture; default: with weights, the most "
                                      "that repeats no source; without, every kept token")
    weights: dict[str, float] | None = Field(None, description="token shares of the final mixture per cell: a source (web), "
                                             "a quality bucket (web/q5) or a range of buckets (web/q3-q4, with "
                                             "sources.<s>.quality.buckets); sum to 1; what no key names gets 0; "
                                             "default: every kept document once")
    sample_rates: dict[str, float] | None = Field(None, description="instead of weights, Dolma's way: per cell, the multiple "
                                                  "of its kept tokens to take (0.3: the first 30% in priority order; 2.5: every "
                                                  "document 2.5 times); what no key names gets 0; the mixture's size is the sum")
    simulate_target_tokens: int | None = Field(None, ge=1, description="simulated epoching: draw a mixture of target_tokens "
                                               "whose every cell is repeated as often as in a mixture of this many tokens "
                                               "(each cell from a pool of its first target/simulate share of documents)")
    exclude: list[str] = Field(default_factory=list, description="sources processed (filters, dedup, classifiers) but left out of the mixture")
    normalize: bool = Field(False, description="scale weights to sum to 1 instead of rejecting them")
    max_epochs: float | None = Field(None, gt=0, description="no cell (a source, or its weighted buckets) is repeated more than this")
    on_shortfall: Literal["error", "renormalize"] = Field("error", description="when a source cannot fill its share")
    shard_tokens: int | None = Field(None, ge=1, description="tokens per mixture shard (shards are filled by hash: sizes vary by a few %)")
    shard_rows: int = Field(100_000, ge=1, description="rows per mixture Parquet shard, when shard_tokens is not set")
    validation: ValidationSpec | None = Field(None, description="a held-out share of every train source, chosen by a seeded "
                                              "hash of the id after dedup and decontamination, written to validation/; never mixed")
    phases: list[PhaseSpec] | None = Field(None, min_length=1, description="training phases drawn from the same kept "
                                           "documents, each with its own target_tokens and weights (or sample_rates), "
                                           "written to mixture/<name>/; instead of the top-level weights")
    disjoint: bool = Field(False, description="with phases: no document in two phases (each cell's priority order is "
                           "shared out among the phases in order; they must weigh the same cells and repeat nothing)")

    @field_validator("weights", "sample_rates")
    @classmethod
    def _non_negative(cls, v):
        if v is not None:
            bad = [k for k, w in v.items() if w < 0]
            if bad:
                raise ValueError(f"weights must be >= 0; negative: {', '.join(bad)}")
        return v


class SamplesSpec(Model):
    kept_per_source: int = Field(50, ge=0, description="kept documents published per source")
    removed_per_reason: int = Field(10, ge=0, description="removed documents published per (source, stage, reason)")


class PublishSpec(Model):
    dir: str = Field(description="the folder to write (relative to the YAML file; a local folder; `{name}` becomes the "
                     "mixture's name, so a copied variant publishes beside it): an HF-loadable dataset with a generated "
                     "card, as `curate publish RUN_DIR DIR` writes it, after every successful run")
    license: str | None = Field(None, description="the dataset's license as the hub spells it (odc-by, cc-by-4.0 ...); "
                                "null: `other`, and the card says the configuration gives none")
    pretty_name: str | None = Field(None, description="the card's title (default: the mixture's name)")
    tags: list[str] = Field(default_factory=list, description="hub tags added to curate, pretraining, data-mixture")
    copy_files: bool = Field(False, description="copy the mixture files instead of hard-linking them")

    @field_validator("dir")
    @classmethod
    def _local(cls, v):
        if fs.is_url(v):
            raise ValueError(f"{v!r} is a URL; publish writes a local folder (upload it with `huggingface-cli upload`)")
        return v


class Mixture(Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the run directory is <output>/<name>")
    output: str = Field("out", description="where run directories go; relative to the YAML file")
    store: str | None = Field(None, description="where finished steps are kept, by hash, shared by every mixture file "
                                                "that names the same store (default: <output>/_store); relative to the YAML file")
    seed: int = Field(0, description="seed of every sampled or shuffled choice")
    tokenizer: str | None = Field("gpt2", description="gpt2 (offline BPE), a path to a tokenizer.json, or null for no token counts")
    sources: dict[str, SourceSpec] = Field(min_length=1, description="named input corpora")
    filters: dict[str, filter_base.FilterParams] = Field(
        default_factory=dict, description="named filter instances; `type` picks a registered filter (`curate filters`)")
    dedup: DedupSpec | None = Field(None, description="deduplication across all sources")
    decontaminate: DecontaminateSpec | None = Field(None, description="remove documents that contain eval items (after dedup, before quality)")
    classifiers: dict[str, ClassifierSpec] = Field(default_factory=dict, description="named quality classifiers")
    mixture: MixtureSpec = Field(default_factory=MixtureSpec, description="how kept documents become the mixture")
    samples: SamplesSpec = Field(default_factory=SamplesSpec, description="published samples of kept and removed documents")
    publish: PublishSpec | None = Field(None, description="write the run as a Hugging Face dataset folder with a "
                                        "generated dataset card at the end of every successful run")

    def excluded(self) -> set[str]:
        """Sources left out of the mixture: `mixture.exclude` and every eval or reference source."""
        return set(self.mixture.exclude) | {s for s, v in self.sources.items() if v.role != "train"}

    @field_validator("filters")
    @classmethod
    def _filter_names(cls, v):
        if "extract" in v:
            raise ValueError("the filter name 'extract' is reserved for the extraction stage of web sources; rename it")
        return v

    @field_validator("sources")
    @classmethod
    def _source_names(cls, v):
        for k in v:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", k):
                raise ValueError(f"source name {k!r} must be letters, digits, '_', '.', '-'")
        return v


class LoadedMixture:
    """A validated mixture plus where it came from (for paths and error lines)."""

    def __init__(self, mixture: Mixture, path: Path, lines: dict[tuple, int], raw: dict):
        self.mixture = mixture
        self.path = path
        self.base_dir = path.parent.resolve()
        self.lines = lines
        self.raw = raw

    def where(self, loc: tuple) -> str:
        return f"{self.path}:{line_of(self.lines, loc)}: {dotted(loc)}"

    def output_dir(self, override: str | None = None) -> Path:
        target = override or self.mixture.output
        if fs.is_url(target):  # s3://bucket/runs, file:///data/runs ...: used as written
            return fs.path(target.rstrip("/")) / self.mixture.name
        out = Path(target)
        if not out.is_absolute():
            out = (Path.cwd() if override else self.base_dir) / out
        return (out / self.mixture.name).resolve()

    def publish_dir(self) -> Path | None:
        p = self.mixture.publish
        if p is None:
            return None
        out = Path(p.dir.replace("{name}", self.mixture.name))
        return (out if out.is_absolute() else self.base_dir / out).resolve()

    def store_dir(self, override: str | None = None):
        """The step store: `store:`, or `_store` beside the run directories (a run name
        cannot start with '_', so no run directory is ever the store)."""
        target = self.mixture.store
        if target is None:
            return self.output_dir(override).parent / "_store"
        if fs.is_url(target):
            return fs.path(target.rstrip("/"))
        out = Path(target)
        return (out if out.is_absolute() else self.base_dir / out).resolve()

    def canonical(self) -> dict:
        # serialize_as_any: each filter with its own parameters, not only the base model's `type`
        return self.mixture.model_dump(mode="json", serialize_as_any=True)

    def config_hash(self) -> str:
        return hash_json(self.canonical())


def hash_json(obj: Any) -> str:
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()


# ---------------------------------------------------------------- YAML with lines


def _walk(node: yaml.Node, loc: tuple, out: dict[tuple, int]) -> None:
    out.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            out[loc + (key,)] = k.start_mark.line + 1
            _walk(v, loc + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[loc + (i,)] = v.start_mark.line + 1
            _walk(v, loc + (i,), out)


def line_of(lines: dict[tuple, int], loc: tuple) -> int:
    loc = tuple(loc)
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def dotted(loc: tuple) -> str:
    s = ""
    for part in loc:
        s += f"[{part}]" if isinstance(part, int) else (f".{part}" if s else str(part))
    return s or "(top level)"


# ---------------------------------------------------------------- loading


def _allowed_keys(loc: tuple, raw: dict) -> list[str]:
    """The keys the model at `loc` accepts, for 'unknown key' messages."""
    if len(loc) == 2 and loc[0] == "filters":
        spec = (raw.get("filters") or {}).get(loc[1])
        try:
            return sorted(f.alias or n for n, f in filter_base.filter_class(spec["type"]).Params.model_fields.items())
        except (KeyError, TypeError):
            return []
    model: Any = Mixture
    for part in loc:
        if isinstance(model, tuple):  # ("dict", value model): `part` is a name the user chose
            model = model[1]
        elif isinstance(model, type) and issubclass(model, BaseModel) and part in model.model_fields:
            model = _unwrap(model.model_fields[part].annotation)
        else:
            return []
    if isinstance(model, type) and issubclass(model, BaseModel):
        return sorted(model.model_fields)
    return []


def _unwrap(ann: Any) -> Any:
    """The model behind an annotation: `X | None` -> X, `dict[str, X]` -> ("dict", X)."""
    import types
    import typing

    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        return next(_unwrap(a) for a in typing.get_args(ann) if a is not type(None))
    if origin is dict:
        return ("dict", _unwrap(typing.get_args(ann)[1]))
    return ann


def _format_pydantic(err: dict, loc: tuple, raw: dict) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        import difflib

        allowed = _allowed_keys(loc[:-1], raw)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"unknown key {loc[-1]!r}{guess}{hint}"
    if kind == "missing":
        return "required key is missing"
    msg = err["msg"]
    if kind == "value_error":  # our validators' own words say what is wrong and what to do
        return msg.removeprefix("Value error, ")
    if "input" in err and kind not in ("model_type", "dict_type"):
        inp = err["input"]
        shown = repr(inp) if not isinstance(inp, (dict, list)) else type(inp).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        msg += f" (got {shown})"
    return msg


def _errors_from_pydantic(exc: ValidationError, prefix: tuple, raw: dict) -> list[tuple[tuple, str]]:
    out = []
    for err in exc.errors():
        loc = prefix + tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        out.append((loc, _format_pydantic(err, loc, raw)))
    return out


def load(path: str | Path) -> LoadedMixture:
    """Parse and validate a mixture YAML; raise UsageError listing every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such mixture file; see mixtures/ for examples") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read the mixture file: {e}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"{mark.line + 1}" if mark else "1"
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(f"{path}:{line}: not valid YAML: {problem}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}:1: the mixture file must be a mapping with at least `name` and `sources`")
    lines: dict[tuple, int] = {}
    if node is not None:
        _walk(node, (), lines)

    problems: list[tuple[tuple, str]] = []
    data = dict(raw)
    parsed_filters = {}
    raw_filters = raw.get("filters") or {}
    if isinstance(raw_filters, dict):
        for fname, spec in raw_filters.items():
            try:
                parsed_filters[fname] = filter_base.parse_params(spec)
            except KeyError as e:
                problems.append((("filters", fname, "type"), e.args[0]))
            except ValidationError as e:
                problems.extend(_errors_from_pydantic(e, ("filters", fname), raw))
        data["filters"] = parsed_filters
    mixture = None
    try:
        mixture = Mixture.model_validate(data)
    except ValidationError as e:
        problems.extend(
            p for p in _errors_from_pydantic(e, (), raw) if not (p[0][:1] == ("filters",) and len(p[0]) > 2)
        )
    if mixture is not None and not problems:
        problems.extend(check_references(mixture))
        mixture = _resolve_filter_paths(mixture, path.parent.resolve())
        mixture = _resolve_classifier_paths(mixture, path.parent.resolve())
    if problems:
        raise UsageError(format_problems(path, lines, problems))
    return LoadedMixture(mixture, path, lines, raw)


def _resolve_classifier_paths(m: Mixture, base: Path) -> Mixture:
    """Classifier model files and example files are relative to the YAML file."""
    fixed = {}
    for name, c in m.classifiers.items():
        def absolute(v: str) -> str:
            return v if v in m.sources or "://" in v or Path(v).is_absolute() else str((base / v).resolve())
        fixed[name] = c.model_copy(update={"positive": [absolute(v) for v in c.positive],
                                           "negative": [absolute(v) for v in c.negative],
                                           "labels": {k: [absolute(v) for v in vs] for k, vs in c.labels.items()}
                                           if c.labels is not None else None,
                                           "model": absolute(c.model) if c.model else None})
    return m.model_copy(update={"classifiers": fixed})


def _resolve_filter_paths(m: Mixture, base: Path) -> Mixture:
    """File parameters of filters (`is_path`) are relative to the YAML file: make them absolute."""
    fixed = {}
    for name, params in m.filters.items():
        update = {}
        for field in filter_base.path_fields(params):
            value = getattr(params, field, None)
            if isinstance(value, str) and "://" not in value and not Path(value).is_absolute():
                update[field] = str((base / value).resolve())
        fixed[name] = params.model_copy(update=update) if update else params
    return m.model_copy(update={"filters": fixed})


def check_filter_files(lm: "LoadedMixture") -> list[str]:
    """Every file a used filter reads must exist, and every module it imports must be
    installed; the message names the key and the fix."""
    from filters import models

    out = []
    used = {f for s in lm.mixture.sources.values() for f in s.filters}
    for name, params in lm.mixture.filters.items():
        if name not in used:
            continue
        out += [f"{lm.where(('filters', name, 'type'))}: {m}" for m in filter_base.missing_dependencies(params)]
        for field, value in filter_base.path_fields(params).items():
            if not Path(value).is_file():
                if field == "model" and getattr(params, "model", None) is None:
                    out.append(f"{lm.where(('filters', name))}: {models.missing_model_message('language filter', Path(value))}")
                else:
                    out.append(f"{lm.where(('filters', name, field))}: no such file: {value}")
    return out


def check_extractors(lm: "LoadedMixture") -> list[str]:
    """Every extractor a source names must import here (and on every node): a missing
    package is a config error with its pip line, not an extractor process that cannot start."""
    import importlib
    import importlib.util

    out = []
    for sname, spec in lm.mixture.sources.items():
        ex = spec.extract
        if ex is None or ex.type == "resiliparse":  # resiliparse is a dependency of curate itself
            continue
        where = lm.where(("sources", sname, "extract", "type" if ex.type == "trafilatura" else "callable"))
        if ex.type == "trafilatura":
            try:
                importlib.import_module("trafilatura")
            except ImportError as e:
                fix = "lxml_html_clean" if "lxml.html.clean" in str(e) or "lxml_html_clean" in str(e) else "trafilatura"
                out.append(f"{where}: the trafilatura extractor cannot be imported here ({e}); pip install '{fix}' "
                           "(on every node of a cluster)")
        else:
            module = ex.callable.split(":", 1)[0]
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                out.append(f"{where}: the module {module!r} cannot be imported here; install the package that provides "
                           "it (on every node of a cluster), or fix the module:function name")
    return out


def check_eval_files(lm: "LoadedMixture") -> list[str]:
    """Every eval file `decontaminate.against` names must exist (globs: at least one file)."""
    out = []
    dc = lm.mixture.decontaminate
    for i, e in enumerate(dc.against if dc else []):
        for j, p in enumerate([] if isinstance(e, str) else e.paths):
            if not eval_files(lm, p):
                out.append(f"{lm.where(('decontaminate', 'against', i, 'paths', j))}: no file matches {p}; "
                           "give JSONL (.gz, .zst) or Parquet files of eval items, relative to the YAML file")
    return out


def eval_files(lm: "LoadedMixture", pattern: str) -> list[str]:
    import glob

    p = pattern if fs.is_url(pattern) or Path(pattern).is_absolute() else str(lm.base_dir / pattern)
    if fs.is_url(p):
        return [p] if fs.path(p).exists() else []
    return sorted(x for x in glob.glob(p) if Path(x).is_file())


def check_classifier_files(lm: "LoadedMixture") -> list[str]:
    """Model and example files of the classifiers in use must exist."""
    out = []
    used = {s.quality.classifier for s in lm.mixture.sources.values() if s.quality}
    used |= {s.topic.classifier for s in lm.mixture.sources.values() if s.topic}
    for name, c in lm.mixture.classifiers.items():
        if name not in used:
            continue
        if c.model and not fs.path(c.model).is_file():
            out.append(f"{lm.where(('classifiers', name, 'model'))}: no such model file: {c.model}; point it at a "
                       "fastText .bin, or remove `model` to train the classifier from `positive` and `negative`")
        if c.model:
            continue
        sides = [((side,), getattr(c, side)) for side in ("positive", "negative")]
        sides += [(("labels", lab), v) for lab, v in (c.labels or {}).items()]
        for loc, values in sides:
            for i, v in enumerate(values):
                if v not in lm.mixture.sources and not fs.path(v).is_file():
                    out.append(f"{lm.where(('classifiers', name, *loc, i))}: no such file: {v}")
    return out


def format_problems(path: Path, lines: dict, problems: list[tuple[tuple, str]]) -> str:
    problems = sorted(set(problems), key=lambda p: (line_of(lines, p[0]), dotted(p[0])))
    return "\n".join(f"{path}:{line_of(lines, loc)}: {dotted(loc)}: {msg}" for loc, msg in problems)


def check_references(m: Mixture) -> list[tuple[tuple, str]]:
    """Cross-section checks: every name used is defined, weights make sense."""
    out: list[tuple[tuple, str]] = []
    defined_filters = ", ".join(m.filters) or "(none: add a `filters` section)"
    defined_sources = ", ".join(m.sources)
    defined_cls = ", ".join(m.classifiers) or "(none: add a `classifiers` section)"
    for sname, src in m.sources.items():
        for i, f in enumerate(src.filters):
            if f not in m.filters:
                out.append((("sources", sname, "filters", i), f"unknown filter {f!r}; defined: {defined_filters}"))
        if src.quality and src.quality.classifier not in m.classifiers:
            out.append(
                (("sources", sname, "quality", "classifier"), f"unknown classifier {src.quality.classifier!r}; defined: {defined_cls}")
            )
        if src.quality and src.quality.keep_fraction is not None and src.quality.min_score is not None:
            out.append((("sources", sname, "quality"), "set keep_fraction or min_score, not both"))
    for sname, src in m.sources.items():
        if src.topic and src.topic.classifier not in m.classifiers:
            out.append((("sources", sname, "topic", "classifier"), f"unknown classifier {src.topic.classifier!r}; defined: {defined_cls}"))
        elif src.topic and m.classifiers[src.topic.classifier].labels is None and m.classifiers[src.topic.classifier].model is None:
            out.append((("sources", sname, "topic", "classifier"), f"{src.topic.classifier} is a positive/negative classifier; "
                        "a topic classifier has `labels: {topic: [sources or files], ...}` (or a pretrained multi-class `model`)"))
        if src.quality and src.quality.classifier in m.classifiers and m.classifiers[src.quality.classifier].labels is not None:
            out.append((("sources", sname, "quality", "classifier"), f"{src.quality.classifier} has labels (topics); quality "
                        "needs a positive/negative classifier: use it under `topic:` instead"))
    for cname, c in m.classifiers.items():
        sides = [(("classifiers", cname, side), getattr(c, side)) for side in ("positive", "negative")]
        sides += [(("classifiers", cname, "labels", lab), v) for lab, v in (c.labels or {}).items()]
        for loc, names in sides:
            for i, s in enumerate(names):
                if s not in m.sources and not any(ch in s for ch in "/*."):
                    out.append(((*loc, i), f"unknown source {s!r}; defined: {defined_sources} "
                                "(a file path needs a '/' or an extension)"))
        if c.labels is not None:
            if c.positive or c.negative:
                out.append((("classifiers", cname), "give labels (a topic classifier) or positive/negative, not both"))
            if c.model is not None:
                out.append((("classifiers", cname), "give labels (to train a topic classifier) or model (a pretrained "
                            "one, whose labels are the topics), not both"))
            for lab, v in c.labels.items():
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", lab) or re.fullmatch(r"q\d+", lab):
                    out.append((("classifiers", cname, "labels", lab), f"label {lab!r} must be letters, digits, '_', '.', '-' "
                                "and not q<number> (that names a quality bucket in a cell)"))
                if not v and c.model is None:
                    out.append((("classifiers", cname, "labels", lab), "a label needs at least one source or file of examples"))
            if len(c.labels) < 2:
                out.append((("classifiers", cname, "labels"), "a topic classifier needs at least two labels"))
        elif c.model is None and (not c.positive or not c.negative):
            out.append((("classifiers", cname), "a trained classifier needs both `positive` and `negative` sources (or set `model:`)"))
    if m.dedup and m.dedup.priority:
        for i, s in enumerate(m.dedup.priority):
            if s not in m.sources:
                out.append((("dedup", "priority", i), f"unknown source {s!r}; defined: {defined_sources}"))
    if m.dedup and m.dedup.fuzzy:
        fz = m.dedup.fuzzy
        rows = fz.rows or (fz.num_perm // fz.bands)
        if fz.bands * rows > fz.num_perm:
            out.append((("dedup", "fuzzy"), f"bands x rows = {fz.bands * rows} exceeds num_perm = {fz.num_perm}"))
    if m.tokenizer is None:
        for key in ("weights", "sample_rates", "target_tokens", "simulate_target_tokens", "shard_tokens"):
            if getattr(m.mixture, key) is not None:
                out.append((("mixture", key), "needs token counts, but tokenizer is null; set tokenizer: gpt2 (or a tokenizer.json)"))
    for i, s in enumerate(m.mixture.exclude):
        if s not in m.sources:
            out.append((("mixture", "exclude", i), f"unknown source {s!r}; defined: {defined_sources}"))
    for i, a in enumerate(m.decontaminate.against if m.decontaminate else []):
        if isinstance(a, str) and (a not in m.sources or m.sources[a].role != "eval"):
            out.append((("decontaminate", "against", i), f"{a!r} is not a source with role: eval; name one "
                        f"({', '.join(s for s, v in m.sources.items() if v.role == 'eval') or 'none defined'}) or give "
                        "{name, paths, text_fields} for eval files"))
    w = m.mixture.weights
    if w is not None:
        from pipeline import cells

        out += cells.problems(m)
        total = sum(w.values())
        if not m.mixture.normalize and abs(total - 1.0) > 1e-6:
            out.append((("mixture", "weights"), f"weights sum to {total:g}, not 1; fix them or set mixture.normalize: true"))
        if m.mixture.normalize and total <= 0:
            out.append((("mixture", "weights"), "weights sum to 0; give at least one source a positive weight"))
    mx = m.mixture
    out += _phase_problems(m)
    if mx.sample_rates is not None:
        from pipeline import cells

        out += cells.problems(m, "sample_rates")
        if w is not None:
            out.append((("mixture", "sample_rates"), "give weights (token shares) or sample_rates (multiples of each cell's "
                        "kept tokens), not both"))
        for key in ("target_tokens", "simulate_target_tokens"):
            if getattr(mx, key) is not None:
                out.append((("mixture", key), f"sample_rates fix every cell's tokens, so the mixture's size; remove {key}"))
    if mx.simulate_target_tokens is not None:
        if w is None:
            out.append((("mixture", "simulate_target_tokens"), "simulated epoching needs mixture.weights (the full mixture's shares)"))
        if mx.target_tokens is None:
            out.append((("mixture", "simulate_target_tokens"), "simulated epoching needs mixture.target_tokens, the small "
                        "mixture's size (below simulate_target_tokens)"))
        elif mx.target_tokens > mx.simulate_target_tokens:
            out.append((("mixture", "simulate_target_tokens"), f"{mx.simulate_target_tokens:,} is below target_tokens "
                        f"({mx.target_tokens:,}): it is the full run's size that the small mixture simulates"))
    return out


def _phase_problems(m: Mixture) -> list[tuple[tuple, str]]:
    from pipeline import cells

    mx = m.mixture
    out: list[tuple[tuple, str]] = []
    if mx.phases is None:
        if mx.disjoint:
            out.append((("mixture", "disjoint"), "disjoint applies to mixture.phases; there are none"))
        return out
    for key in ("weights", "sample_rates", "target_tokens", "simulate_target_tokens"):
        if getattr(mx, key) is not None:
            out.append((("mixture", key), f"with phases, {key} goes in each phase (mixture.phases[i].{key}); remove it here"))
    seen = set()
    for i, ph in enumerate(mx.phases):
        loc = ("mixture", "phases", i)
        if ph.name in seen:
            out.append(((*loc, "name"), f"two phases are named {ph.name}; names are folders of mixture/"))
        seen.add(ph.name)
        if ph.weights is not None and ph.sample_rates is not None:
            out.append((loc, "give weights or sample_rates, not both"))
        if ph.sample_rates is not None and ph.target_tokens is not None:
            out.append(((*loc, "target_tokens"), "sample_rates fix every cell's tokens, so the phase's size; remove target_tokens"))
        for field in ("weights", "sample_rates"):
            if getattr(ph, field) is not None:
                view = m.model_copy(update={"mixture": mx.model_copy(update={"weights": None, "sample_rates": None, field: getattr(ph, field)})})
                out += [((*loc, *where[1:]), msg) for where, msg in cells.problems(view, field)]
        if ph.weights is not None and not mx.normalize and abs(sum(ph.weights.values()) - 1.0) > 1e-6:
            out.append(((*loc, "weights"), f"weights sum to {sum(ph.weights.values()):g}, not 1; fix them or set mixture.normalize: true"))
    if mx.disjoint:
        keys = [set(ph.weights or {}) for ph in mx.phases]
        if any(ph.weights is None for ph in mx.phases) or any(k != keys[0] for k in keys):
            out.append((("mixture", "disjoint"), "disjoint phases must each give weights over the same cells (only the "
                        "values differ), so that each cell's documents can be shared out among them"))
    return out


def unimplemented(lm: LoadedMixture) -> list[NotImplementedYet]:
    """Config keys that parse but whose steps are later capabilities: none at the moment;
    `run` and `plan` still ask, so a new section can be refused clearly, not skipped."""
    return []


# ---------------------------------------------------------------- docs from the models


def _type_name(ann: Any) -> str:
    import types
    import typing

    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin in (typing.Union, types.UnionType):
        named = " or ".join(_type_name(a) for a in args if a is not type(None))
        return named + (" or null" if type(None) in args else "")
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[1])}"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "mapping"
    return getattr(ann, "__name__", str(ann))


def reference_markdown() -> str:
    """The README's YAML key table, generated from the models' fields and descriptions."""
    import typing

    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]

    def walk(model: type[BaseModel], prefix: str, skip: tuple = ()):
        for name, f in model.model_fields.items():
            if name in skip:
                continue
            key = f"{prefix}{name}"
            value = None if f.is_required() else f.get_default(call_default_factory=True)
            default = "required" if f.is_required() else ("see below" if isinstance(value, BaseModel) else repr(value))
            desc = (f.description or "").replace("|", "/")
            rows.append(f"| `{key}` | {_type_name(f.annotation)} | {default} | {desc} |")
            args = typing.get_args(f.annotation)
            variants = _variants(f.annotation)
            if variants:  # a union picked by `type`: each variant's own keys under extract.<type>
                rows[-1] = rows[-1].replace(_type_name(f.annotation), "mapping or null", 1)
                for m in variants:
                    t = m.model_fields["type"].default
                    doc = " ".join((m.__doc__ or "").split()).replace("|", "/")
                    rows.append(f"| `{key}` with `type: {t}` | | | {doc} |")
                    walk(m, f"{key}.", skip=("type",))
                continue
            if typing.get_origin(f.annotation) is dict:
                if isinstance(args[1], type) and issubclass(args[1], BaseModel) and args[1] is not filter_base.FilterParams:
                    walk(args[1], f"{key}.<name>.")
                continue
            for m in args or (f.annotation,):
                if isinstance(m, type) and issubclass(m, BaseModel):
                    walk(m, f"{key}.")

    walk(Mixture, "")
    return "\n".join(rows)


def _variants(ann) -> list[type[BaseModel]]:
    """The models of a discriminated union (`X | Y` under Annotated), optional or not."""
    import typing

    if typing.get_origin(ann) is typing.Union or type(ann).__name__ == "UnionType":
        inner = [a for a in typing.get_args(ann) if a is not type(None)]
        ann = inner[0] if len(inner) == 1 else ann
    if typing.get_origin(ann) is typing.Annotated:
        ms = [m for m in typing.get_args(typing.get_args(ann)[0]) if isinstance(m, type) and issubclass(m, BaseModel)]
        return ms if len(ms) > 1 else []
    return []
