"""The tokenize stage, its encoding half: a `tokenize-<source>` step per mixed source, one
shard per document shard, writing each kept document's token ids once.

Kept means kept by the filters and every global layer (dedup, decontamination, the
validation hold-out), whose text is the mixture's (paragraph dedup and the filters'
rewrites applied). The quality and topic classifiers and everything in `mixture:` are not
inputs: a weights, phase, cell or quality edit re-encodes nothing, and the mixture's
routing gathers the ids with the texts (pipeline/steps/mix/plan.py). The writers are the
`tokens` stage (write.py).

    tokenize:
      formats: [megatron, datatrove]
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline.engine.step import Step
from pipeline.errors import UsageError
from pipeline.plan import tokens
from pipeline.plan.context import Context
from pipeline.plan.stage import Stage, texts
from pipeline.steps.tokenize import formats, registry, tasks


def check_formats(lm) -> None:
    """Every `tokenize.formats` entry a registered format (registry.py), else a UsageError
    at its line naming the registered ones (`curate validate` and every plan call it)."""
    tz = lm.mixture.tokenize
    for i, f in enumerate(tz.formats if tz is not None else []):
        try:
            registry.get(f)
        except KeyError as e:
            raise UsageError(f"{lm.where(('tokenize', 'formats', i))}: {e.args[0]}") from None


def settings(ctx: Context) -> dict:
    return settings_of(ctx.lm, ctx.tokenizer)


def settings_of(lm, run_tokenizer: str | None) -> dict:
    """The resolved tokenizer, its identity, vocabulary, specials and each format's dtype;
    a UsageError naming the YAML key where they do not fit (`curate validate` and every plan
    call it). `run_tokenizer`: the run's `tokenizer`, resolved."""
    tz = lm.mixture.tokenize
    spec = tokens.check(tz.tokenizer, lm.base_dir) if tz.tokenizer else run_tokenizer
    if spec is None:
        raise UsageError(f"{lm.where(('tokenize',))}: needs a tokenizer; set `tokenize.tokenizer` or the run's "
                         "`tokenizer` (gpt2 or a tokenizer.json)")
    vocab = tokens.vocab_size(spec)
    eos = tokens.end_of_text(spec) if tz.eos else None
    if tz.eos and eos is None:
        raise UsageError(f"{lm.where(('tokenize', 'eos'))}: the tokenizer has no end-of-text token "
                         f"({', '.join(tokens.END_OF_TEXT)}); set eos: false or give a tokenizer that has one")
    if tz.pack is not None and eos is None:
        raise UsageError(f"{lm.where(('tokenize', 'pack'))}: packing pads sequences with the end-of-text token; "
                         "set eos: true (with a tokenizer that has one) or remove pack")
    bos = None
    if tz.bos is not None:
        bos = tokens.special_id(spec, tz.bos)
        if bos is None:
            raise UsageError(f"{lm.where(('tokenize', 'bos'))}: {tz.bos!r} is not a token of the tokenizer")
    for key, token in (("eos", eos[0] if eos else None), ("bos", tz.bos)):
        if token is not None and tokens.special_as_text(spec, token):
            raise UsageError(f"{lm.where(('tokenize', 'tokenizer' if tz.tokenizer else key))}: the tokenizer's model "
                             f"encodes the text {token!r} as its special token (id {tokens.special_id(spec, token)}), so a "
                             f"document holding that text would hold a false document boundary in the token files; use a "
                             f"tokenizer whose vocabulary has {token!r} only as an added special token (BPE or unigram), "
                             f"or set {key}: {'false' if key == 'eos' else 'null'}")
    check_formats(lm)
    dtypes = {}
    for f in tz.formats:
        try:
            dtypes[f] = formats.dtype_for(f, tz.dtype, vocab)
        except ValueError as e:
            raise UsageError(f"{lm.where(('tokenize', 'dtype'))}: {f}: {e}") from None
    return {"tokenizer": spec, "identity": tokens.identity(spec), "vocab_size": vocab, "eos_id": eos[1] if eos else None,
            "eos": eos[0] if eos else None, "bos_id": bos, "bos": tz.bos, "dtypes": dtypes,
            "ids": tasks.ids_dtype(vocab).str}  # the encoded attribute's width


def plan(ctx: Context) -> list[Step]:
    if ctx.mixture.tokenize is None:
        return []
    st = settings(ctx)
    layers = list(ctx.layers)
    mixed = [s for s in ctx.mixture.sources if s not in ctx.mixture.excluded()]
    out = []
    for sname in mixed:
        def shards(step, stats, sname=sname) -> Iterator[tasks.EncodeSpec]:
            return ({"doc": d, "tokenizer": st["tokenizer"], "ids": st["ids"], "describe": f"{sname} shard {d['part']}"}
                    for d in ctx.doc_shards(stats, layers) if d["source"] == sname)

        step = Step(f"tokenize-{sname}", "tokenize", {"source": sname, "tokenizer": st["identity"]}, ctx.base() + layers,
                    tasks.encode_shard, shards=shards, position_free=True,
                    read_keyed=("layers",))
        ctx.provide("token_ids", step, sname)
        out.append(step)
    return out


STAGE = Stage("tokenize", plan, tasks=texts("tokenize"))
