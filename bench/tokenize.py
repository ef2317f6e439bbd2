"""Tokenization speed per core, side by side on the same documents and the same tokenizer
(GPT-2 from the offline files, EOS after every document), on the five kinds of text of
bench/textkinds.py:

- **floor**: the tokenizer's own encode (tiktoken `encode_ordinary` over the texts, one
  thread), no files; and tiktoken's batch encode (`encode_ordinary_batch`, one thread),
  which is slower (a thread-pool task a text): the loop is the floor held to;
- **Curate**: `tokenize-<source>`'s task (`encode_shard`: the ids of a document shard into
  its Parquet attribute) then a `tokens-megatron` write of the same documents
  (`formats.write`), the two halves a run does;
- **datatrove** 0.10.1: `DocumentTokenizer` (HF `tokenizers` `encode_batch`, `.ds` files,
  no shuffling), on a `tokenizer.json` built from the same files;
- **dolma** 1.2.1 (`dolma tokens`, Rust), one process, from `.jsonl.gz`, if a Python with
  dolma is given (`--dolma-python`: dolma pins old boto3, so it lives in its own venv).

Every figure is CPU seconds (the process's, all its threads; dolma's from its child's
rusage, less its CPU on a one-document input: its command's start), so a tool that uses more
threads is not counted faster: MB of text per CPU second and tokens per CPU second. Token
counts are compared, and a difference is printed.

    python -m bench.tokenize [--docs 2000] [--repeat 3] [--dolma-python /tmp/dolmaenv/bin/python]

Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _cpu() -> float:
    return time.process_time()


def floor(texts: list[str]) -> tuple[float, int]:
    from pipeline.plan import tokens

    enc = tokens.load("gpt2")
    c = _cpu()
    n = sum(len(enc.encode_ordinary(t)) + 1 for t in texts)
    return _cpu() - c, n


def floor_batch(texts: list[str]) -> tuple[float, int]:
    """tiktoken's own batch encode (`encode_ordinary_batch`, one thread): its thread pool
    runs a task a text, so it is slower than the loop above, which is the floor we hold to."""
    from pipeline.plan import tokens

    enc = tokens.load("gpt2")
    c = _cpu()
    n = sum(len(x) + 1 for x in enc.encode_ordinary_batch(texts, num_threads=1))
    return _cpu() - c, n


def curate(texts: list[str], tmp: Path) -> tuple[float, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.engine.step import ShardOutput
    from pipeline.steps.tokenize import formats
    from pipeline.steps.tokenize.tasks import encode_shard, ids_dtype, unpack_ids, with_specials

    doc = tmp / "doc.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(len(texts))], "text": texts}), doc)
    dtype = ids_dtype(50257)
    c = _cpu()
    encode_shard({"doc": {"documents": str(doc), "layers": []}, "tokenizer": "gpt2", "ids": dtype.str},
                 ShardOutput(str(tmp / "enc"), 0))
    t = pq.read_table(tmp / "enc" / "part-00000.parquet")
    offs, vals = unpack_ids(t.column("tokens"), dtype)
    ids, lengths = with_specials(offs, vals, None, 50256)  # as write_shard adds them
    res = formats.write("megatron", tmp / "out" / "part-00000", ids, lengths, "uint16", "gpt2")
    return _cpu() - c, res["tokens"]


def datatrove(texts: list[str], tmp: Path, tokenizer_json: str) -> tuple[float, int]:
    from datatrove.data import Document
    from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer

    items = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    step = DocumentTokenizer(str(tmp / "dt"), tokenizer_name_or_path=tokenizer_json, eos_token="<|endoftext|>",
                             shuffle_documents=False)
    step.tokenizer  # noqa: B018 -- loaded before the clock starts, as Curate's is
    c = _cpu()
    step.run(iter(items))
    cpu = _cpu() - c
    return cpu, (tmp / "dt" / "00000_unshuffled.ds").stat().st_size // 2


def dolma_tokenizer(python: str, tmp: Path) -> str:
    """The same GPT-2 as a tokenizer.json written by dolma's own `tokenizers` (1.2.1 pins
    <= 0.19.1, which cannot read the newer format)."""
    from pipeline.plan import tokens

    data = tokens._gpt2_files()
    path = tmp / "gpt2-dolma.json"
    subprocess.run([python, "-c", "import sys; from tokenizers import ByteLevelBPETokenizer; "
                    "ByteLevelBPETokenizer(sys.argv[1], sys.argv[2]).save(sys.argv[3])",
                    str(data / "encoder.json"), str(data / "vocab.bpe"), str(path)], check=True)
    return str(path)


def dolma(texts: list[str], tmp: Path, tokenizer_json: str, python: str) -> tuple[float, int] | None:
    src = tmp / "dolma-in" / "documents"
    src.mkdir(parents=True)
    with gzip.open(src / "part-0.jsonl.gz", "wt") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": str(i), "text": t, "source": "bench"}) + "\n")
    dolma_bin = str(Path(python).parent / "dolma")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([dolma_bin, "tokens", "--documents", str(src / "*.jsonl.gz"), "--destination", str(tmp / "dolma-out"),
                        "--tokenizer.name_or_path", tokenizer_json, "--tokenizer.eos_token_id", "50256",
                        "--tokenizer.pad_token_id", "50256", "--processes", "1", "--dtype", "uint16",
                        "--work_dir.input", str(tmp / "dw-in"), "--work_dir.output", str(tmp / "dw-out")],
                       capture_output=True, text=True, env={**os.environ, "RAYON_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        print(f"dolma tokens failed: {r.stderr[-1500:]}", file=sys.stderr)
        return None
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    n = sum(p.stat().st_size for p in (tmp / "dolma-out").rglob("*.npy")) // 2
    return cpu, n


def _tokenizer_json(tmp: Path) -> str:
    from tokenizers import ByteLevelBPETokenizer

    from pipeline.plan import tokens

    data = tokens._gpt2_files()
    path = tmp / "gpt2.json"
    ByteLevelBPETokenizer(str(data / "encoder.json"), str(data / "vocab.bpe")).save(str(path))
    return str(path)


def main(argv=None) -> None:
    from bench import textkinds

    ap = argparse.ArgumentParser(prog="python -m bench.tokenize", description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=2000, help="documents of each kind (default 2,000)")
    ap.add_argument("--dolma-python", help="a Python with dolma 1.2.1 installed (its venv's bin/python)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each tool on each kind; the least CPU is kept (default 3)")
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="curate-tokbench-"))
    try:
        tj = _tokenizer_json(root)
        tjd = dolma_tokenizer(a.dolma_python, root) if a.dolma_python else None
        fixed = 0.0
        if tjd:  # its command's start (imports, a worker process) on one short document: not per document
            (root / "warm").mkdir()
            fixed = (dolma(["x"], root / "warm", tjd, a.dolma_python) or (0.0, 0))[0]
            print(f"dolma tokens on one document: {fixed:.2f} CPU s, subtracted from its figures")
        rows = []
        for kind, texts in textkinds.build(a.docs).items():
            mb = sum(len(t.encode()) for t in texts) / 1e6
            res = {}
            for name, fn in (("floor", lambda d: floor(texts)), ("batch encode", lambda d: floor_batch(texts)),
                             ("Curate", lambda d: curate(texts, d)),
                             ("datatrove", lambda d: datatrove(texts, d, tj)),
                             ("dolma", (lambda d: dolma(texts, d, tjd, a.dolma_python)) if a.dolma_python else None)):
                if fn is None:
                    continue
                for r in range(a.repeat):  # the least CPU of the repeats: noise only ever adds
                    d = root / kind.replace(" ", "_") / f"{name}-{r}"
                    d.mkdir(parents=True)
                    out = fn(d)
                    if out is not None and name == "dolma":
                        out = (max(1e-6, out[0] - fixed), out[1])
                    if out is not None and (name not in res or out[0] < res[name][0]):
                        res[name] = out
                    shutil.rmtree(d, ignore_errors=True)
            rows.append((kind, len(texts), mb, res))
            print(f"{kind}: " + ", ".join(f"{k} {mb / v[0]:.2f} MB/s ({v[1]:,} tokens)" for k, v in res.items()), flush=True)
        names = [n for n in ("floor", "batch encode", "Curate", "datatrove", "dolma") if any(n in r[3] for r in rows)]
        print("\nMB of text per CPU second (tokens per CPU second), GPT-2, EOS after every document:\n")
        print("| kind | docs | MB | " + " | ".join(names) + " | Curate / floor | Curate / batch encode | Curate / datatrove |"
              + (" Curate / dolma |" if "dolma" in names else ""))
        print("| --- | ---: | ---: | " + " | ".join("---:" for _ in names) + " | ---: | ---: | ---: |" + (" ---: |" if "dolma" in names else ""))
        for kind, n, mb, res in rows:
            cells = [f"{mb / res[k][0]:.2f} ({res[k][1] / res[k][0] / 1e6:.2f} M)" if k in res else "-" for k in names]
            ratio = lambda k: f"{(mb / res['Curate'][0]) / (mb / res[k][0]):.2f}×" if k in res else "-"  # noqa: E731
            print(f"| {kind} | {n:,} | {mb:.1f} | " + " | ".join(cells) + f" | {ratio('floor')} | {ratio('batch encode')} | {ratio('datatrove')} |"
                  + (f" {ratio('dolma')} |" if "dolma" in names else ""))
            counts = {k: v[1] for k, v in res.items()}
            if len(set(counts.values())) > 1:
                print(f"  (token counts differ: {counts})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
