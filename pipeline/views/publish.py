"""`curate publish RUN_DIR OUT_DIR`: a finished run as a folder that the Hugging Face hub
and `datasets.load_dataset(OUT_DIR)` read as it is, with a dataset card written from the run.

    README.md                               the dataset card (pipeline/views/card.py): YAML front matter
                                            as the hub reads it, a body generated from the run
    data/train-XXXXX-of-YYYYY.parquet       the mixture's files, hard-linked (copied across devices
                                            or from object stores, or with --copy: then bytes go
                                            through this process), never rewritten
    data/<phase>/train-…                    with `mixture.phases`: a config per phase, the first the default
    data/validation-XXXXX-of-YYYYY.parquet  the run's validation/ files in the mixture's columns
                                            (same rows, same order; epoch 0, scores null): a split
                                            must have the train split's columns to load as one dataset
    samples/, report.html                   the run's published samples, their browser, its report
    curate/                                 run.json, ledger.json, manifest.json, report.json, the
                                            configuration as mixture.yaml, and files.json (every data
                                            file: rows, sha256, and the run file it came from)

The folder is built beside OUT_DIR and renamed into place: an earlier publish is replaced
whole; any other non-empty folder is refused. Only a run that finished (SUCCESS, ledger
balanced) is published; one whose ledger conservation is "unknown" (input files cut, their
later records neither read nor counted) only with --allow-unknown-loss, and its card says so
in its first lines.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.shards import ledger
from pipeline.views import card
from pipeline.errors import UsageError
from pipeline.io import atomic, fs

MARK = "curate/files.json"  # a folder holding it was written by publish (and may be replaced)


def _place(src, dst: Path, copy: bool) -> bool:
    """A run's file into the folder, byte for byte: a hard link where the disk allows (True),
    else a copy (False)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if copy:
        fs.copy(src, dst)
        return False
    return fs.link_or_copy(src, dst)


def _conform(src, dst: Path, schema: pa.Schema) -> int:
    """A validation file rewritten in the mixture's columns, row group by row group."""
    pf = fs.parquet_file(src)
    n = 0
    with pq.ParquetWriter(dst, schema, compression="zstd") as w:
        for g in range(pf.metadata.num_row_groups):
            t = pf.read_row_group(g)
            cols = []
            for f in schema:
                if f.name in t.column_names:
                    cols.append(t.column(f.name).cast(f.type))
                elif f.name == "epoch":
                    cols.append(pa.repeat(pa.scalar(0, f.type), t.num_rows))
                else:
                    cols.append(pa.nulls(t.num_rows, f.type))
            w.write_table(pa.Table.from_arrays(cols, schema=schema))
            n += t.num_rows
    return n


def _languages(files: list[dict], folder: Path) -> tuple[dict[str, int], int]:
    """Rows per language of the mixture files (their `lang` column, as the mix tasks counted it
    into the manifest; read from the files for a run made before they did), and rows without one."""
    counts: dict[str, int] = {}
    for f in files:
        if "languages" in f:
            per = f["languages"]
        else:
            from pipeline.steps.mix.tasks import lang_counts

            per = lang_counts(pq.read_table(folder / f["path"], columns=["lang"]).column("lang"))
        for k, v in per.items():
            counts[k] = counts.get(k, 0) + v
    unknown = counts.pop("", 0)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))), unknown


def _config_yaml(record: dict) -> tuple[str, bool]:
    """The mixture file as its user wrote it (comments and all) when it still gives the run's
    configuration hash; else the configuration the run recorded, in the YAML's section order."""
    from pipeline import config

    try:
        path = Path(record["mixture_file"])
        if config.load(path).config_hash() == record["config_hash"]:
            return path.read_text(), True
    except Exception:  # moved, edited or unreadable since the run: the recorded configuration is the truth
        pass
    cfg = record["config"]
    order = [k for k in config.Mixture.model_fields if k in cfg] + [k for k in cfg if k not in config.Mixture.model_fields]
    return yaml.safe_dump({k: cfg[k] for k in order}, sort_keys=False, allow_unicode=True), False


def _check_out(out: Path, run_dir) -> None:
    if fs.is_local(run_dir) and (out.resolve() == run_dir.resolve() or run_dir.resolve() in out.resolve().parents):
        raise UsageError(f"publish: {out} is inside the run directory {run_dir}; give a folder outside it")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARK).exists())):
        raise UsageError(f"publish: {out} exists and was not written by `curate publish`; give a new or empty folder "
                         "(an earlier publish there is replaced whole)")


def unknown_loss_refusal(run_dir, led: dict, out=None) -> str:
    """Why a run whose input files were cut is not published, and the two ways on; '' for any other run."""
    files = ledger.unread_files(led)
    if not files:
        return ""
    return (f"{run_dir}: {ledger.describe_unread(files)}. Re-fetch or repair the file{'s' if len(files) > 1 else ''} and run "
            f"again, or publish the run as it is with `curate publish {run_dir} {out or 'OUT_DIR'} --allow-unknown-loss` "
            "(the dataset card then says so in its first lines)")


def check_unknown_loss(run_dir, led: dict, out, allow: bool) -> None:
    """Refuse a run with uncounted unread records (ledger conservation "unknown") unless allowed."""
    why = unknown_loss_refusal(run_dir, led, out)
    if why and not allow:
        raise UsageError(f"publish: {why}")


def publish(run_dir, out, license: str | None = None, pretty_name: str | None = None, copy: bool = False,
            allow_unknown_loss: bool = False) -> Path:
    """Write the folder; returns its path. What is not given comes from the run's own `publish:`
    section (license, pretty_name, tags, copy_files). A run whose input files were cut is
    refused unless `allow_unknown_loss` (check_unknown_loss)."""
    if fs.is_url(str(out)):
        raise UsageError(f"publish: {out} must be a local folder (upload it with `huggingface-cli upload` or your tool)")
    run_dir = fs.path(run_dir)
    out = Path(out).resolve()
    try:
        record = atomic.read_json(run_dir / "run.json")
    except FileNotFoundError:
        raise UsageError(f"publish: {run_dir} is not a run directory (no run.json); give what `curate run` printed") from None
    spec = record["config"].get("publish") or {}
    license, pretty_name = license or spec.get("license"), pretty_name or spec.get("pretty_name")
    copy = copy or spec.get("copy_files", False)
    if license is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", license):
        raise UsageError(f"publish: license {license!r} is not spelled as the hub lists licenses (lower case, e.g. "
                         "apache-2.0, cc-by-4.0, odc-by, other)")
    if record.get("status") != "SUCCESS":
        raise UsageError(f"publish: run {record.get('name')} in {run_dir} is {record.get('status')}, not SUCCESS; "
                         "finish it with `curate run` first")
    led = atomic.read_json(run_dir / "ledger.json")
    man = atomic.read_json(run_dir / "manifest.json")
    if not led.get("conservation"):
        raise UsageError(f"publish: {run_dir}/ledger.json does not balance; a run that loses documents is not published")
    check_unknown_loss(run_dir, led, out, allow_unknown_loss)
    _check_out(out, run_dir)
    tmp = out.with_name(f".{out.name}.publish-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(run_dir, tmp, record, led, man, license, pretty_name, copy, spec.get("tags") or [])
        fs.replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write(run_dir: Path, tmp: Path, record: dict, led: dict, man: dict, license, pretty_name, copy, tags) -> None:
    from pipeline.steps.mix.tasks import MIX_SCHEMA

    (tmp / "data").mkdir(parents=True)
    files: list[dict] = []
    groups = [(name, f"data/{name}/", man["phases"][name]["files"]) for name in card.phase_names(record, man)] \
        or [(None, "data/", man["files"])]
    for _, prefix, fl in groups:
        for i, f in enumerate(fl):
            rel = f"{prefix}train-{i:05d}-of-{len(fl):05d}.parquet"
            _place(run_dir / f["path"], tmp / rel, copy)
            size = (tmp / rel).stat().st_size  # a link or a byte-for-byte copy: the size tells a changed or torn file
            if f.get("bytes") is not None and size != f["bytes"]:
                raise UsageError(f"publish: {run_dir / f['path']} has {size:,} bytes, the manifest says {f['bytes']:,}: "
                                 "the run's file changed after the run; run it again")
            files.append({"path": rel, "split": "train", "rows": f["rows"], "tokens": f.get("tokens"),
                          "sha256": f["sha256"], "from": f["path"], "from_sha256": f["sha256"],
                          **({"languages": f["languages"]} if "languages" in f else {})})
    val = [(s, v, f) for s, v in (man.get("validation") or {}).items() for f in v["files"]]
    for i, (s, v, f) in enumerate(val):
        rel = f"data/validation-{i:05d}-of-{len(val):05d}.parquet"
        rows = _conform(run_dir / f["path"], tmp / rel, MIX_SCHEMA)
        files.append({"path": rel, "split": "validation", "source": s, "role": v.get("role"), "rows": rows,
                      "tokens": f.get("tokens"), "sha256": atomic.file_digest(tmp / rel)[1], "from": f["path"], "from_sha256": f["sha256"]})
    for name in ("run.json", "ledger.json", "manifest.json", "report.json"):
        if (run_dir / name).exists():
            _place(run_dir / name, tmp / "curate" / name, True)
    rep = atomic.read_json(tmp / "curate" / "report.json") if (tmp / "curate" / "report.json").exists() else {}
    config_yaml, as_written = _config_yaml(record)
    (tmp / "curate" / "mixture.yaml").write_text(config_yaml)
    if (run_dir / "report.html").exists():
        _place(run_dir / "report.html", tmp / "report.html", True)
    samples = [x["path"] for x in man.get("samples") or []]  # samples/<source>/*.jsonl and samples/index.html
    for rel in samples:
        _place(run_dir / rel, tmp / rel, True)
    langs, unknown = _languages([f for f in files if f["split"] == "train" and f["path"].startswith(groups[0][1])], tmp)
    ctx = card.Context(run_dir=run_dir, record=record, ledger=led, manifest=man, files=files, languages=langs,
                       unknown_language_rows=unknown, config_yaml=config_yaml, config_as_written=as_written, license=license, pretty_name=pretty_name, tags=tags,
                       report=rep, samples=sorted(samples))
    (tmp / "README.md").write_text(card.render(ctx))
    atomic.write_json(tmp / MARK, {"run": record["name"], "config_hash": record["config_hash"], "files": files})
