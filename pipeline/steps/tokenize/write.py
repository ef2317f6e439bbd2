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
from pipeline.plan.stage import Stage
from pipeline.steps.tokenize import formats, tasks
from pipeline.steps.tokenize.plan import settings


def plan(ctx: Context) -> list[Step]:
    tz = ctx.mixture.tokenize
    if tz is None:
        return []
    st = settings(ctx)
    write = ctx.mix.write
    out = []
    for fmt in tz.formats:
        params = {"dtype": st["dtypes"][fmt], "bos_id": st["bos_id"], "eos_id": st["eos_id"],
                  "max_file_tokens": tz.max_file_tokens, "tokenizer_name": _name(st["tokenizer"])}

        def shards(step, stats, fmt=fmt, params=params):
            return [{**{k: v for k, v in sp.items() if k != "describe"}, "format": fmt, "params": params,
                     "describe": f"{fmt}: {sp['describe']}"} for sp in write.shards(write, stats)]

        out.append(Step(f"tokens-{fmt}", "tokens", {"format": fmt, "params": params, "tokenizer": st["identity"]},
                        list(write.inputs), tasks.write_shard, shards=shards))
    return out


def _name(spec: str) -> str:
    """What a .ds.metadata calls the tokenizer: `gpt2`, or the tokenizer.json's path."""
    return spec


def publish(ctx: Context, stats: dict) -> dict:
    if ctx.mixture.tokenize is None:
        return {}
    st = settings(ctx)
    steps = [s for s in ctx.steps if s.kind == "tokens"]
    pairs, body = [], {}
    for step in steps:
        fmt = step.config["format"]
        files, total = [], 0
        for i in sorted(stats[step.name]):
            m = stats[step.name][i]
            for f in m["files"]:
                for name, info in f["files"].items():
                    rel = f"{f['file'].rsplit('/', 1)[0]}/{name}"
                    pairs.append((step.dir(ctx.store) / rel, rel))
                files.append({"path": f"tokenized/{f['file']}", "documents": f["documents"], "tokens": f["tokens"],
                              "files": {n: v for n, v in f["files"].items()}})
                total += f["tokens"]
        body[fmt] = {"dtype": st["dtypes"][fmt], "files": files, "tokens": total,
                     "extensions": list(formats.EXTENSIONS[fmt])}
    atomic.link_tree(pairs, ctx.run_dir / "tokenized")
    return {"tokenized": {"tokenizer": st["tokenizer"], "tokenizer_identity": st["identity"], "vocab_size": st["vocab_size"],
                          "bos": st["bos"], "bos_id": st["bos_id"], "eos": st["eos"], "eos_id": st["eos_id"], "formats": body}}


STAGE = Stage("tokens", plan, publish=publish)
