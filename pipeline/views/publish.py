"""`curate publish RUN_DIR OUT_DIR`: a finished run as a folder that the Hugging Face hub
and `datasets.load_dataset(OUT_DIR)` read as it is, with a dataset card written from the run.

    README.md                               the dataset card (pipeline/views/card.py): YAML front matter
                                            as the hub reads it, a body generated from the run
    data/train-XXXXX-of-YYYYY.parquet       the mixture's files, copied byte for byte (streamed; the
                                            sha256 computed while copying must be the manifest's, else
                                            the run's file was modified after the run: an error naming
                                            it). Never a hard link: the run's mixture/ and its store
                                            step are one inode, which an edit of the published copy
                                            would corrupt
    data/<phase>/train-…                    with `mixture.phases`: a config per phase, the first the default
    data/validation-XXXXX-of-YYYYY.parquet  the validation/ files of the run's train sources in the
                                            mixture's columns (same rows, same order; epoch 0, scores
                                            null): a split must have the train split's columns to load
                                            as one dataset
    samples/, report.html                   the kept documents' samples, their browser, the run's report
    curate/                                 run.json, ledger.json, manifest.json, report.json, the
                                            configuration as mixture.yaml, and files.json (every data
                                            file: rows, sha256, and the run file it came from; and every
                                            file of the folder, the marker that publish wrote it)

What a dataset should not hold is left out unless `publish.include` (or --include) names it,
and the card's first lines then say so (views/shareable.py): removed documents, texts as
ingested (before PII redaction), eval items. run.json, ledger.json, manifest.json and
report.json hold counts, reasons and configuration, no document text.

The folder is built beside OUT_DIR and renamed into place: an earlier publish is replaced
whole, but only when the folder holds nothing that publish did not write (a run directory,
a user's file): any other non-empty folder is refused. Only a run that finished (SUCCESS,
ledger balanced) is published; one whose ledger conservation is "unknown" (input files cut,
their later records neither read nor counted) only with --allow-unknown-loss, and its card
says so in its first lines.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.shards import ledger
from pipeline.views import card, shareable
from pipeline.errors import UsageError
from pipeline.io import atomic, fs, redact

COPY_THREADS = 8  # data files copied at once
MACHINE = ("host", "ray_address", "store", "workers")  # run.json's keys about where it ran, not what it made
MARK = "curate/files.json"  # a folder holding it was written by publish (and may be replaced)
LAYOUT = ("README.md", "report.html", "data", "samples", "curate")  # what a publish made before MARK listed its files


def _copy_checked(src, dst: Path, sha256: str) -> int:
    """A run's data file copied into the folder, streamed, its sha256 computed on the way and
    compared with the manifest's; returns its bytes."""
    h, n = hashlib.sha256(), 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with fs.open_read(src) as i, open(dst, "wb") as o:
        while chunk := i.read(1 << 20):
            h.update(chunk)
            o.write(chunk)
            n += len(chunk)
    if h.hexdigest() != sha256:
        raise UsageError(f"publish: {src} was modified after the run (its sha256 is {h.hexdigest()[:16]}…, the manifest "
                         f"says {sha256[:16]}…); run the mixture again to write it anew")
    return n


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


def _check_owner(out: Path, record: dict, replace: bool, run_dir) -> None:
    """A folder an earlier publish of another run wrote is not replaced unless asked: two
    mixture files with one `publish.dir`, or a `fit` proposal's, would replace each other's data."""
    if replace or not (out / MARK).is_file():
        return
    try:
        prev = atomic.read_json(out / MARK).get("run")
    except ValueError:
        prev = None
    if prev is not None and prev != record["name"]:
        raise UsageError(f"publish: {out} holds run {prev}'s published dataset, not run {record['name']}'s; give "
                         f"another folder (`publish.dir: .../{{name}}` gives each mixture its own), or replace it "
                         f"with `curate publish {run_dir} {out} --replace`")


def _check_out(out: Path, run_dir) -> None:
    if fs.is_local(run_dir) and (out.resolve() == run_dir.resolve() or run_dir.resolve() in out.resolve().parents):
        raise UsageError(f"publish: {out} is inside the run directory {run_dir}; give a folder outside it")
    if fs.is_local(run_dir) and out.resolve() in run_dir.resolve().parents:
        raise UsageError(f"publish: {out} holds the run directory {run_dir}, which publishing there would delete; "
                         "give a folder outside it")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARK).exists())):
        raise UsageError(f"publish: {out} exists and was not written by `curate publish`; give a new or empty folder "
                         "(an earlier publish there is replaced whole)")
    stray = _not_written(out) if out.is_dir() and (out / MARK).exists() else []
    if stray:
        named = [f"{x}/ (a run directory)" if (out / x / "run.json").exists() else x for x in stray[:5]]
        raise UsageError(f"publish: {out} holds what `curate publish` did not write: {', '.join(named)}"
                         f"{' …' if len(stray) > 5 else ''}; a publish replaces its folder whole, so move them out "
                         "or give another folder")


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


def _not_written(out: Path) -> list[str]:
    """The top-level entries of an earlier publish's folder holding something it did not write
    (per its marker's list of files; for a marker without one, anything outside LAYOUT)."""
    listed = atomic.read_json(out / MARK).get("written")
    listed = set(listed) if listed is not None else None
    stray = set()
    for d, dirs, names in os.walk(out):
        base = Path(d).relative_to(out)
        for name in names + [x for x in dirs if (Path(d) / x).is_symlink()]:
            rel = (base / name).as_posix()
            if (rel not in listed) if listed is not None else (rel.split("/", 1)[0] not in LAYOUT):
                stray.add(rel.split("/", 1)[0])
    return sorted(stray)


def publish(run_dir, out, license: str | None = None, pretty_name: str | None = None, copy: bool = True,
            include: list[str] | str | None = None, allow_unknown_loss: bool = False, replace: bool = False,
            lease: bool = False) -> Path:
    """Write the folder; returns its path. What is not given comes from the run's own `publish:`
    section (license, pretty_name, tags, include). The data files are always copied (`copy`
    and `publish.copy_files` are accepted for older callers and mixture files). A run whose
    input files were cut is refused unless `allow_unknown_loss` (check_unknown_loss); a folder
    another run published is refused unless `replace`. With `lease` (the command, not a run's
    own publish, which holds it already) the run directory's lease is taken while publishing:
    a run of the same directory cannot write its run.json beside the data being copied."""
    if fs.is_url(str(out)):
        raise UsageError(f"publish: {out} must be a local folder (upload it with `huggingface-cli upload` or your tool)")
    run_dir = fs.path(run_dir)
    out = Path(out).resolve()
    if not lease:
        return _publish(run_dir, out, license, pretty_name, include, allow_unknown_loss, replace)
    from pipeline.engine.lease import Leases

    leases = Leases(name="publish")
    rec = leases.acquire(run_dir / "_lease")
    if rec is not None:
        raise UsageError(f"publish: {run_dir} is being written by a run ({rec.get('name') or rec.get('run')}); "
                         "publish it when that run has finished")
    try:
        return _publish(run_dir, out, license, pretty_name, include, allow_unknown_loss, replace)
    finally:
        leases.release_all()


def _publish(run_dir, out: Path, license, pretty_name, include, allow_unknown_loss: bool, replace: bool) -> Path:
    try:
        record = atomic.read_json(run_dir / "run.json")
    except FileNotFoundError:
        raise UsageError(f"publish: {run_dir} is not a run directory (no run.json); give what `curate run` printed") from None
    spec = record["config"].get("publish") or {}
    license, pretty_name = license or spec.get("license"), pretty_name or spec.get("pretty_name")
    include = shareable.include_of(include, spec)
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
    _check_owner(out, record, replace, run_dir)
    tmp = out.with_name(f".{out.name}.publish-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(run_dir, tmp, record, led, man, license, pretty_name, include, spec.get("tags") or [])
        fs.replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write(run_dir: Path, tmp: Path, record: dict, led: dict, man: dict, license, pretty_name, include, tags) -> None:
    from pipeline.steps.mix.tasks import MIX_SCHEMA

    (tmp / "data").mkdir(parents=True)
    files: list[dict] = []
    groups: list[tuple[str | None, str, list]] = \
        [(name, f"data/{name}/", man["phases"][name]["files"]) for name in card.phase_names(record, man)] \
        or [(None, "data/", man["files"])]
    jobs = []
    for _, prefix, fl in groups:
        for i, f in enumerate(fl):
            rel = f"{prefix}train-{i:05d}-of-{len(fl):05d}.parquet"
            jobs.append((run_dir / f["path"], tmp / rel, f["sha256"]))
            files.append({"path": rel, "split": "train", "rows": f["rows"], "tokens": f.get("tokens"),
                          "sha256": f["sha256"], "from": f["path"], "from_sha256": f["sha256"],
                          **({"languages": f["languages"]} if "languages" in f else {})})
    # the copies 8 at a time: each is I/O and hashing (which releases the GIL), so they overlap
    for _ in fs.read_many(lambda job: _copy_checked(*job), jobs, threads=COPY_THREADS):
        pass
    val = [(s, v, f) for s, v in (man.get("validation") or {}).items() for f in v["files"]
           if shareable.validation_published(v.get("role"), include)]
    for i, (s, v, f) in enumerate(val):
        rel = f"data/validation-{i:05d}-of-{len(val):05d}.parquet"
        if atomic.file_digest(run_dir / f["path"])[1] != f["sha256"]:
            raise UsageError(f"publish: {run_dir / f['path']} was modified after the run (its sha256 is not the "
                             "manifest's); run the mixture again to write it anew")
        rows = _conform(run_dir / f["path"], tmp / rel, MIX_SCHEMA)
        files.append({"path": rel, "split": "validation", "source": s, "role": v.get("role"), "rows": rows,
                      "tokens": f.get("tokens"), "sha256": atomic.file_digest(tmp / rel)[1], "from": f["path"], "from_sha256": f["sha256"]})
    base = Path(record["mixture_file"]).parent if record.get("mixture_file") else None
    for name in ("run.json", "ledger.json", "manifest.json", "report.json"):
        if (run_dir / name).exists():  # what a dataset user needs, nothing of the machine (io/redact.py)
            doc = atomic.read_json(run_dir / name)
            if name == "run.json":
                doc = {k: v for k, v in doc.items() if k not in MACHINE}
                if record.get("mixture_file"):
                    doc["mixture_file"] = Path(record["mixture_file"]).name
            fs.makedirs(tmp / "curate")
            atomic.write_json(tmp / "curate" / name, redact.portable(doc, base))
    rep = atomic.read_json(tmp / "curate" / "report.json") if (tmp / "curate" / "report.json").exists() else {}
    config_yaml, as_written = _config_yaml(record)
    config_yaml = redact.portable(config_yaml, base)
    (tmp / "curate" / "mixture.yaml").write_text(config_yaml)
    if (run_dir / "report.html").exists():
        fs.copy(run_dir / "report.html", tmp / "report.html")  # counts and reasons, no document text
    samples = shareable.samples(run_dir, tmp, record, man, include)  # what a dataset may hold of samples/
    langs, unknown = _languages([f for f in files if f["split"] == "train" and f["path"].startswith(groups[0][1])], tmp)
    ctx = card.Context(run_dir=run_dir, record=record, ledger=led, manifest=man, files=files, languages=langs,
                       unknown_language_rows=unknown, config_yaml=config_yaml, config_as_written=as_written, license=license, pretty_name=pretty_name, tags=tags,
                       report=rep, samples=sorted(samples), include=include)
    (tmp / "README.md").write_text(redact.portable(card.render(ctx), base))
    written = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()) + [MARK]
    atomic.write_json(tmp / MARK, {"run": record["name"], "config_hash": record["config_hash"], "include": include,
                                   "files": files, "written": written})
