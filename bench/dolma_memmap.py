"""Curate's memmap token files against Dolma's own writer, byte for byte.

Curate writes `tokenized/memmap/part-XXXXX.npy` (+ `.csv.gz`) to be what `dolma tokens`
writes (OLMo's memmap datasets read both). This feeds each file's documents, in the file's
order, with their texts from the mixture file, to `dolma tokens` (Rust tokenizer, its
`MemmapWriter`), on the same GPT-2 vocabulary with EOS appended, one process, a ring of one
file and a batch (its local shuffle) of one document (so Dolma keeps the order it reads), then compares:

- the `.npy` bytes (the whole file);
- each csv row's start, end and id (Dolma's 4th and 5th columns are its input file and line,
  Curate's the source and the row in the mixture file: named, not compared).

Dolma strips each text's surrounding whitespace before encoding (`row_text.strip()` in its
`tokenize_file`) and skips texts that are then empty; Curate encodes the mixture's text as it
is, so that every document decodes back to it. Where a document's tokens differ, the file is
not equal: the documents that differ are counted, and how many of them equal tiktoken's
tokens of the stripped text plus EOS (the strip alone explains them).

    python -m bench.dolma_memmap RUN_DIR --dolma-python /tmp/dolmaenv/bin/python [--files 2]

`dolma` 1.2.1 pins numpy<2 and old boto3, so it lives in its own venv:
`python3 -m venv /tmp/dolmaenv && /tmp/dolmaenv/bin/pip install dolma==1.2.1`.
Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench.tokenize import dolma_tokenizer


def _rows(csv_gz: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(gzip.decompress(csv_gz.read_bytes()).decode())))


def compare(run: Path, npy: Path, python: str, tok: str, tmp: Path) -> dict:
    ours = _rows(npy.with_name(npy.name[: -len(".npy")] + ".csv.gz"))
    mixture = pq.read_table(run / "mixture" / npy.with_suffix(".parquet").name, columns=["id", "text"])
    texts, ids = mixture.column("text").to_pylist(), mixture.column("id").to_pylist()
    src = tmp / "in" / "documents"
    src.mkdir(parents=True)
    with gzip.open(src / "part.jsonl.gz", "wt") as f:
        for start, end, doc_id, source, row in ours:
            assert ids[int(row)] == doc_id, f"{npy.name}: row {row} of the mixture file is not {doc_id}"
            f.write(json.dumps({"id": doc_id, "text": texts[int(row)], "source": source}) + "\n")
    out = tmp / "out"
    r = subprocess.run([str(Path(python).parent / "dolma"), "tokens", "--documents", str(src / "*.jsonl.gz"),
                        "--destination", str(out), "--tokenizer.name_or_path", tok,
                        "--tokenizer.eos_token_id", "50256", "--tokenizer.pad_token_id", "50256",
                        "--processes", "1", "--ring_size", "1", "--batch_size", "1", "--dtype", "uint16",
                        "--max_size", str(1 << 40),
                        "--work_dir.input", str(tmp / "wi"), "--work_dir.output", str(tmp / "wo")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"dolma tokens failed: {r.stderr[-2000:]}")
    got = sorted(out.rglob("*.npy"))
    assert len(got) == 1, f"dolma wrote {len(got)} files: {got}"
    theirs_rows = _rows(got[0].with_name(got[0].name[: -len(".npy")] + ".csv.gz"))
    a, b = npy.read_bytes(), got[0].read_bytes()
    same_meta = [(x[0], x[1], x[2]) for x in ours] == [(y[0], y[1], y[2]) for y in theirs_rows]
    differ = stripped = 0
    if a != b:  # which documents' tokens differ, and whether Dolma's strip() of the text explains it
        from pipeline.plan import tokens

        enc = tokens.load("gpt2")
        x, y = np.frombuffer(a, "<u2"), np.frombuffer(b, "<u2")
        for (s0, e0, _, _, row), (s1, e1, *_) in zip(ours, theirs_rows):
            theirs = y[int(s1):int(e1)]
            if not np.array_equal(x[int(s0):int(e0)], theirs):
                differ += 1
                stripped += enc.encode_ordinary(texts[int(row)].strip()) + [50256] == theirs.tolist()
    return {"file": npy.name, "documents": len(ours), "tokens": len(a) // 2, "npy_equal": a == b,
            "ids_in_order": [x[2] for x in ours] == [y[2] for y in theirs_rows],
            "csv_start_end_id_equal": same_meta, "documents_differing": differ, "differing_by_strip": stripped,
            "dolma_csv_columns": theirs_rows[0][3:] if theirs_rows else None}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run directory with tokenized/memmap/ (e.g. out/demo after make demo)")
    ap.add_argument("--dolma-python", required=True, help="a Python with dolma 1.2.1 installed")
    ap.add_argument("--files", type=int, default=None, help="compare the first N files only")
    a = ap.parse_args(argv)
    files = sorted((a.run / "tokenized" / "memmap").glob("part-*.npy"))[: a.files]
    if not files:
        sys.exit(f"{a.run}/tokenized/memmap has no part-*.npy: run a mixture with tokenize: {{formats: [memmap]}}")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tok = dolma_tokenizer(a.dolma_python, Path(d))
        for i, f in enumerate(files):
            rows.append(compare(a.run, f, a.dolma_python, tok, Path(d) / f"f{i}"))
            print(rows[-1], flush=True)
    yn = {True: "yes", False: "no"}
    print("\n| file | documents | tokens | .npy bytes equal | csv start, end, id equal | ids in the same order | "
          "documents whose tokens differ | of which Dolma's strip() explains |")
    print("| --- | ---: | ---: | --- | --- | --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['file']} | {r['documents']:,} | {r['tokens']:,} | {yn[r['npy_equal']]} | "
              f"{yn[r['csv_start_end_id_equal']]} | {yn[r['ids_in_order']]} | {r['documents_differing']} | "
              f"{r['differing_by_strip']} |")


if __name__ == "__main__":
    main()
