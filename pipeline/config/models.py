"""The mixture YAML's shape: frozen pydantic models, one per section.

`extra="forbid"` makes a typo an error; each `filters.<name>` mapping is validated by the
registered filter type's own Params model (filters/base.py), each `classifiers.<name>` by
its family's (filters/classifiers.py), picked by `type`. Loading (config/load.py)
turns a file into these models with errors that point at the line; checks between
sections and against the machine are in config/checks.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from filters import base as filter_base
from filters import classifiers as classifier_registry
from pipeline.config.engine import EngineSpec, with_env
from pipeline.config.extract import WEB_FORMATS, ExtractSpec, ResiliparseExtract
from pipeline.config.lines import dotted, line_of
from pipeline.config.tokenize import TokenizeSpec
from pipeline.engine.step import hash_json
from pipeline.io import fs


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # .nan and .inf: errors at their key


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


def known_embedding(v: str) -> str:
    """An embedding backend's name (a miss lists the known ones), or a local folder (a path)."""
    from filters import embeddings

    return embeddings.check_ref(v)


class _EmbeddingKMeans(Model):
    """What semantic dedup and embedding clusters share: the embedding, and the seeded sample k-means is fitted on."""

    sample: int = Field(100_000, ge=2, description="documents (a seeded hash sample) k-means is fitted on")
    model: str = Field("wordllama", description="the embedding: a backend (`curate embeddings`), or a local folder: a "
                       "sentence-transformers model, or model.onnx and tokenizer.json (relative to the YAML file)")
    max_tokens: int = Field(2048, ge=1, description="tokens of a document embedded (the rest is cut)")
    dtype: Literal["float16", "int8"] = Field("float16", description="how the embed-<source> attribute stores a vector: "
                                              "float16, or int8 with a float32 scale a row (half the bytes; cosines "
                                              "to float32 above 0.999)")
    seed: int = Field(0, description="the sample's and k-means' seed")

    @field_validator("model")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        return known_embedding(v)


class TopicClustersSpec(_EmbeddingKMeans):
    clusters: int = Field(ge=2, le=10_000, description="k-means clusters of the source's document embeddings: cells "
                          "<source>/c0 .. <source>/c<clusters-1>")


class SourceSpec(Model):
    paths: list[str] = Field(min_length=1, description="files, globs or directories; relative to the YAML file; `**` matches "
                             "any depth of folders, following symlinks except one into a folder it is inside (a loop: "
                             "skipped with a note)")
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
    topics: TopicClustersSpec | None = Field(None, description="label every kept document with its nearest of `clusters` "
                                             "k-means centroids of the source's document embeddings (topic c<k>, "
                                             "topic_score the cosine); `mixture.weights` may then weight `source/c<k>` "
                                             "and `source/c<k>/q<j>`")
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


class SemanticDedupSpec(_EmbeddingKMeans):
    threshold: float = Field(0.92, gt=0, le=1, description="cosine similarity of two documents' embeddings at which "
                             "the later one (by source priority, then id hash, or place with dedup.order) is a semantic duplicate")
    min_overlap: float | None = Field(0.55, ge=0, le=1, description="and the share of their words two documents must "
                                      "share (word-set Jaccard, estimated from 128 MinHash values): static embeddings put "
                                      "unrelated texts of one language close (docs/dedup.md has the curve); null: cosine alone")
    clusters: int | None = Field(None, ge=1, description="k-means clusters; neighbours are only looked for inside a "
                                 "cluster; default: one per `cluster_rows` documents that reach the stage, in two levels "
                                 "past what the sample fits (at most one per 20 sampled): each coarse cluster split by "
                                 "a k-means of its own sample, so k grows with the corpus (at most 100,000)")
    cluster_rows: int = Field(2_000, ge=2, description="documents a cluster holds on average, with `clusters` unset")
    max_cluster_rows: int | None = Field(50_000, ge=2, description="a cluster with more members is split by seeded "
                                         "bisection into groups of at most this many before the comparison, so its cost "
                                         "per document stays flat past 100,000 clusters; null: compare whole clusters "
                                         "(all pairs)")


class DedupSpec(Model):
    exact: ExactDedupSpec | None = Field(None, description="exact duplicates of normalised text")
    fuzzy: FuzzyDedupSpec | None = Field(None, description="near-duplicates: MinHash LSH, verified")
    paragraph: ParagraphDedupSpec | None = Field(None, description="repeated paragraphs")
    semantic: SemanticDedupSpec | None = Field(None, description="semantic duplicates: documents whose embeddings are "
                                               "within a cosine threshold, looked for inside k-means clusters")
    priority: list[str] | None = Field(None, description="source order for choosing survivors; default: YAML order")
    order: Literal["id", "place"] = Field(
        "id", description="within a source, which copy survives: id (the smallest id hash; the same however the "
        "files are laid out) or place (the first file in path order, then the first row: datatrove's rule; a dump "
        "whose files sort after the others changes no earlier decision, so adding it costs what it adds)")
    partitions: int | None = Field(None, ge=1, description="shuffle partitions, at least; more where the data needs them (4M rows, 64 MB of verify text or 5M edges a partition)")


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


def _classifier_type(v) -> str | None:
    """The family a `classifiers.<name>` value names: its `type`, else the default."""
    if isinstance(v, dict):
        return v.get("type", classifier_registry.DEFAULT_TYPE)
    return getattr(v, "type", classifier_registry.DEFAULT_TYPE)


def _classifier_union():
    """`classifiers.<name>`: the registered families' parameter models, picked by `type`
    (filters/classifiers.py; an unknown type is reported by config/load.py with the known ones)."""
    variants = tuple(Annotated[cls.Params, Tag(name)] for name, cls in classifier_registry.registry().items())
    return Annotated[Union[variants], Discriminator(_classifier_type)]  # noqa: UP007 (a tuple of variants)


if TYPE_CHECKING:  # a union the registry builds when the module loads: to a type checker, any classifier's params
    ClassifierSpec = Any
else:
    ClassifierSpec = _classifier_union()


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


PublishInclude = Literal["removed_samples", "original_texts", "eval_items"]


class PublishSpec(Model):
    dir: str = Field(description="the folder to write (relative to the YAML file; a local folder; `{name}` becomes the "
                     "mixture's name, so a copied variant publishes beside it): an HF-loadable dataset with a generated "
                     "card, as `curate publish RUN_DIR DIR` writes it, after every successful run (not after one whose input files "
                     "were cut: ledger conservation `unknown`; `curate publish --allow-unknown-loss` publishes it)")
    license: str | None = Field(None, description="the dataset's license as the hub spells it (odc-by, cc-by-4.0 ...); "
                                "null: `other`, and the card says the configuration gives none")
    pretty_name: str | None = Field(None, description="the card's title (default: the mixture's name)")
    tags: list[str] = Field(default_factory=list, description="hub tags added to curate, pretraining, data-mixture")
    copy_files: bool = Field(False, description="kept for older mixture files: the data files are always copied "
                             "(streamed, their sha256 checked against the manifest), never hard-linked to the run's")
    include: list[PublishInclude] = Field(
        default_factory=list, description="what a dataset should not hold, published anyway (each kind named; the "
        "card's first lines then say so): removed_samples (samples of removed documents and quarantined records), "
        "original_texts (sample texts as ingested, before rewriters such as PII redaction, and dedup survivors' "
        "texts), eval_items (the eval sources' documents: samples, the validation split, the eval item beside a "
        "contaminated sample, the documents decontamination removed). Default: none; `curate publish --include` "
        "overrides it")

    @field_validator("dir")
    @classmethod
    def _local(cls, v):
        if fs.is_url(v):
            raise ValueError(f"{v!r} is a URL; publish writes a local folder (upload it with `huggingface-cli upload`)")
        return v


class InputsSpec(Model):
    verify: Literal["mtime", "content"] = Field(
        "mtime", description="how an input file already ingested is known to be unchanged: mtime (its size and "
        "modification time, read from a listing: the default) or content (its size and change time, and where they "
        "moved the ingest task reads the file and compares the xxh3-128 digest of its bytes with the one its earlier "
        "shard recorded: for stores fed by tools that keep modification times, such as rsync -t, cp -p or tar)")


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
    classifiers: dict[str, ClassifierSpec] = Field(default_factory=dict, description="named quality and topic classifiers; "
                                                   "`type` picks a registered family (`curate classifiers`; default fasttext)")
    mixture: MixtureSpec = Field(default_factory=MixtureSpec, description="how kept documents become the mixture")
    samples: SamplesSpec = Field(default_factory=SamplesSpec, description="published samples of kept and removed documents")
    publish: PublishSpec | None = Field(None, description="write the run as a Hugging Face dataset folder with a "
                                        "generated dataset card at the end of every successful run")
    tokenize: TokenizeSpec | None = Field(None, description="write the mixture as trainer-ready token files too "
                                          "(tokenized/<format>/), encoded once per document shard")
    inputs: InputsSpec = Field(default_factory=InputsSpec, description="how input files are known to be unchanged "
                               "between runs")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="how steps are laid out (merge groups, fan-in, "
                               "LSH salt); never what the mixture holds; recorded in run.json, outside `config`")
    plugins: list[str] = Field(default_factory=list, description="modules (dotted import names, importable where the "
                               "run and its workers run) that each declare a `STAGE`: stages from outside Curate, "
                               "planned with the built-in ones (docs/extending.md)")
    stages: dict[str, Any] = Field(default_factory=dict, description="each plugin stage's settings, by stage name, "
                                   "checked by the model its `STAGE` names (`config`)")

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

    def __init__(self, mixture: Mixture, path: Path, lines: dict[tuple, int], raw: dict, plugin_stages: tuple = ()):
        self.mixture = mixture
        self.plugin_stages = plugin_stages  # the STAGE of each module `plugins:` names, in its order
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
        # without `engine`: how steps are laid out is not what the mixture is (run.json records it apart)
        # `inputs` only when set: a config without it hashes as before it existed
        d = self.mixture.model_dump(mode="json", serialize_as_any=True, exclude={"engine"})
        if d.get("inputs") == InputsSpec().model_dump(mode="json"):
            d.pop("inputs")
        for k in ("plugins", "stages"):  # only when used: a config without them hashes as before they existed
            if not d.get(k):
                d.pop(k, None)
        return d

    def engine(self):
        """(the `engine:` settings with the environment's overrides, {key: "VAR=value"} of
        those that came from it), read now: on the driver, when a run is planned."""
        return with_env(self.mixture.engine)

    def config_hash(self) -> str:
        return hash_json(self.canonical())
