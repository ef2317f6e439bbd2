"""The tokenize stage, its writing half (stage `tokens`): a `tokens-<format>` step per
format, one shard per mixture shard, gathering the ids the mixture's routing carried
(never encoding), in the mixture file's order. Publishes `tokenized/<format>/` (hard links
into the steps) and manifest.json's `tokenized`: tokenizer and its identity, vocabulary,
dtype, BOS/EOS ids, and per file its documents, tokens, bytes and sha256.
"""

from __future__ import annotations

from pipeline.engine.step import Step
from pipeline.io import atomic
from pipeline.plan.context import Context
from pipeline.plan.stage import Stage, texts
from pipeline.steps.tokenize import blends, registry, tasks
from pipeline.steps.tokenize.plan import settings


def plan(ctx: Context) -> list[Step]:
    tz = ctx.mixture.tokenize
    if tz is None:
        return []
    st = settings(ctx)
    write = ctx.mix.write
    out = []
    for fmt in tz.formats:
        if (f := registry.get(fmt)).steps is not None:  # its own steps: per-shard pieces, then a cross-shard finalize
            out += f.steps(ctx, st, tasks.write_shard, tasks.validation_shard)
            continue
        params = {"dtype": st["dtypes"][fmt], "bos_id": st["bos_id"], "eos_id": st["eos_id"],
                  "max_file_tokens": tz.max_file_tokens, "tokenizer_name": st["tokenizer"],  # a .ds.metadata names it
                  "ids": st["ids"],  # the width of the ids the encode step stored
                  **({"layout": "cells"} if tz.layout == "cells" else {}),  # only then: the mixture layout keeps its hashes
                  **({"pack": tz.pack.model_dump()} if tz.pack else {}),
                  **registry.module_of(fmt)}  # a format from outside Curate: the module its tasks import

        def shards(step, stats, fmt=fmt, params=params):
            return [{**{k: v for k, v in sp.items() if k != "describe"}, "format": fmt, "params": params,
                     "describe": f"{fmt}: {sp['describe']}"} for sp in write.shards(write, stats)]

        out.append(Step(f"tokens-{fmt}", "tokens", {"format": fmt, "params": params, "tokenizer": st["identity"]},
                        list(write.inputs), tasks.write_shard, shards=shards))
        held = ctx.step("validation")
        if held is not None:  # validation/ as token files too, under <format>/validation/
            def vshards(step, stats, fmt=fmt, params=params, held=held) -> list[tasks.TokensValidationSpec]:
                return [{"input": str(held.dir(ctx.store) / "docs" / m["held"]["file"]), "name": m["held"]["file"],
                         "format": fmt, "params": params, "tokenizer": st["tokenizer"],
                         "describe": f"{fmt}: validation/{m['held']['file']}"}
                        for m in sorted(stats[held.name].values(), key=lambda m: (m["source"], m["part"])) if m.get("held")]

            out.append(Step(f"tokens-{fmt}-validation", "tokens", {"format": fmt, "params": params, "tokenizer": st["identity"],
                                                                   "split": "validation"},
                            [held], tasks.validation_shard, shards=vshards))
    return out


def publish(ctx: Context, stats: dict) -> dict:
    if ctx.mixture.tokenize is None:
        return {}
    st = settings(ctx)
    steps = [s for s in ctx.steps if s.kind == "tokens" and registry.get(s.config["format"]).publish is None]
    pairs, body = [], {}
    for step in steps:
        fmt = step.config["format"]
        split = step.config.get("split")
        body.setdefault(fmt, {}).update({"dtype": st["dtypes"][fmt], "extensions": list(registry.get(fmt).extensions)})
        files, total = [], 0
        for i in sorted(stats[step.name]):
            m = stats[step.name][i]
            for f in m["files"]:
                for name, info in f["files"].items():
                    rel = f"{f['file'].rsplit('/', 1)[0]}/{name}"
                    pairs.append((step.dir(ctx.store) / rel, rel))
                files.append({"path": f"tokenized/{f['file']}", "documents": f["documents"], "tokens": f["tokens"],
                              "files": {n: v for n, v in f["files"].items()},
                              **{k: f[k] for k in ("cell", "mixture", "sequences", "pieces", "padding") if f.get(k) is not None}})
                total += f["tokens"]
        body.setdefault(fmt, {}).update({f"{split}_files": files, f"{split}_tokens": total} if split else
                                        {"files": files, "tokens": total})
    for fmt in ctx.mixture.tokenize.formats:  # formats that publish themselves (Levanter's caches)
        if (f := registry.get(fmt)).publish is not None:
            pairs += f.publish(ctx, stats, st, body)
    atomic.link_tree(pairs, ctx.run_dir / "tokenized")
    for fmt, b in body.items():
        f = registry.get(fmt)
        b["trainer"] = f.write_trainer(ctx, st, b) if f.write_trainer is not None else _trainer_config(ctx, fmt, b)
    return {"tokenized": {"tokenizer": st["tokenizer"], "tokenizer_identity": st["identity"], "vocab_size": st["vocab_size"],
                          "bos": st["bos"], "bos_id": st["bos_id"], "eos": st["eos"], "eos_id": st["eos_id"],
                          **({"pack": ctx.mixture.tokenize.pack.model_dump()} if ctx.mixture.tokenize.pack else {}),
                          "formats": body}}


def _trainer_config(ctx: Context, fmt: str, b: dict) -> str | None:
    if ctx.mixture.tokenize.layout == "cells":
        name, b["cells"] = blends.write(ctx.run_dir / "tokenized" / fmt, fmt, b)
        return name
    return _mixture_config(ctx, fmt, b)


def _mixture_config(ctx: Context, fmt: str, b: dict) -> str | None:
    """What a trainer reads, written beside the files (the format's `trainer`: Megatron's
    `--data-path`, OLMo's `data:` section; none for datatrove, whose dataset takes the
    folder). Per phase when the mixture has phases. Returns the file's name under
    tokenized/<format>/ (None when the format writes none)."""
    f = registry.get(fmt)
    if f.trainer is None:
        return None
    root = ctx.run_dir / "tokenized" / fmt
    phases: dict[str, list[tuple[str, int]]] = {}
    for x in b["files"]:
        rel = x["path"][len(f"tokenized/{fmt}/"):]
        phases.setdefault(rel.rsplit("/", 1)[0] if "/" in rel else "", []).append((rel, x["tokens"]))
    for phase, files in phases.items():
        text = f.trainer(root, files, b)
        atomic.write_bytes(root / phase / f.trainer_file if phase else root / f.trainer_file, text.encode())
    return f.trainer_file


STAGE = Stage("tokens", plan, publish=publish, outputs=("tokenized",), tasks=texts("tokens"), label="tokenize")
