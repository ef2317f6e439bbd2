"""What a person sees while a run runs: one line per stage, not one per step.

A run is some 70 steps; a person watching wants to know which stage is running, how far it
is, how fast and how long is left. The executor reports step events it already counts
(start with its shards, a shard done with its documents, finish, a note for a failure, a
retry or a reused step); they are folded into the run's stages, each step under the one its
stage declares (`Step.stage`, from `Stage.label`: ingest, filter, embed, dedup, decontaminate,
validation, classify, tokenize, mix, samples, and any stage a plugin adds):

- `live` (stdout or stderr is a terminal): rich's live display, one line per stage with
  its bar over shards, documents/s, elapsed and ETA; a finished stage stays as one line
  with its time and counts; notes (failures, retries) print above it. Steps with no shard
  to compute are not shown.
- `text` (CI, `ray job submit` logs, a file): a line when a stage ends, and a progress line
  every `TEXT_EVERY` seconds while something runs: a few lines for a whole run.
- `json` (`--log-format json`): JSON lines, each with `event`, `stage`, `step`,
  `shards_done`, `shards_total`, `docs`, `docs_per_s`, `eta_s`, `elapsed_s` (a step's
  start and end, and its progress at most every `JSON_EVERY` seconds).
- `verbose`: a line per step start, progress and end (what runs printed before).
- `quiet`: nothing (errors and the summary still print).

No work is added on the hot path: an update is a few additions, and a line or a redraw
happens at most a few times a second (rich refreshes on its own thread, 4 times a second).
"""

from __future__ import annotations

import io
import json
import sys
import time

TEXT_EVERY = 30.0
JSON_EVERY = 2.0
MODES = ("live", "text", "json", "verbose", "quiet")


def mode_for(log_format: str = "text", quiet: bool = False, verbose: bool = False, stream=sys.stderr) -> str:
    if quiet:
        return "quiet"
    if log_format == "json":
        return "json"
    if verbose:
        return "verbose"
    return "live" if stream.isatty() else "text"


class _Stage:
    """A stage's shards (summed over its steps) and documents (its busiest step's: a stage's
    steps pass the same documents along, so their sum would count each several times)."""

    def __init__(self, name: str):
        self.name = name
        self.expected: set[str] = set()
        self.finished: set[str] = set()
        self.total = self.done = self.done0 = 0
        self.step_docs: dict[str, list[int]] = {}  # step -> [docs, docs already done when it started]
        self.t0: float | None = None
        self.seconds = 0.0

    @property
    def docs(self) -> int:
        return max((d for d, _ in self.step_docs.values()), default=0)

    def rate(self) -> float:
        new = max((d - d0 for d, d0 in self.step_docs.values()), default=0)
        return new / max(time.time() - self.t0, 1e-6) if self.t0 else 0.0

    def eta(self) -> float | None:
        new = self.done - self.done0
        if not new or self.t0 is None:
            return None
        return (time.time() - self.t0) / new * (self.total - self.done)


class Progress:
    """Step events folded into stages, shown as `mode` says (live, text, json, verbose, quiet)."""

    def __init__(self, stream=sys.stderr, quiet: bool = False, mode: str | None = None, console=None):
        self.stream = stream
        self.mode = mode or ("quiet" if quiet else "verbose")
        self.quiet = self.mode == "quiet"
        self.stages: dict[str, _Stage] = {}
        self.shown: dict[str, str] = {}  # step -> the stage it shows under (expect)
        self.steps: dict[str, dict] = {}
        self.last_print = 0.0
        self._live = None
        self._console = console  # a rich Console (tests record one); default: one on `stream`

    # ---- what the executor calls
    def expect(self, steps: dict[str, str]) -> None:
        """The steps this run computes (the others are done), each with the stage it shows
        under: a stage ends when all of its have."""
        self.shown.update(steps)
        for name in steps:
            self._stage(name).expected.add(name)

    def start(self, name: str, total: int, done: int, docs: int):
        st = self._stage(name)
        self.steps[name] = {"total": total, "done": done, "done0": done, "docs": docs, "docs0": docs, "t0": time.time()}
        if st.t0 is None:
            st.t0 = time.time()
        st.total += total
        st.done += done
        st.done0 += done
        st.step_docs[name] = [docs, docs]
        if self.mode == "verbose":
            self._print(f"[{name}] {total} shards ({done} already done)")
        elif self.mode == "json":
            self._json("step_start", name)
        elif self.mode == "live" and total > done:
            self._show(st)

    def update(self, name: str, docs: int):
        s, st = self.steps[name], self._stage(name)
        s["done"] += 1
        s["docs"] += docs
        st.done += 1
        st.step_docs[name][0] += docs
        if self.mode == "live":
            self._show(st)
            return
        now = time.time()
        if self.mode == "verbose":
            if now - self.last_print > 5 or s["done"] == s["total"]:
                self.last_print = now
                el = max(now - s["t0"], 1e-6)
                new = s["done"] - s["done0"]
                eta = el / new * (s["total"] - s["done"]) if new else None
                left = f", ETA {eta:.0f}s" if eta is not None and s["done"] < s["total"] else ""
                self._print(f"[{name}] {s['done']}/{s['total']} shards, {s['docs']:,} docs, "
                            f"{(s['docs'] - s['docs0']) / el:,.0f} docs/s{left}")
        elif self.mode == "json":
            if now - s.get("last", 0) >= JSON_EVERY or s["done"] == s["total"]:
                s["last"] = now
                self._json("progress", name)
        elif self.mode == "text" and now - self.last_print >= TEXT_EVERY:
            self.last_print = now
            running = [x for x in self.stages.values() if x.t0 is not None and x.finished != x.expected and x.total]
            self._print("[progress] " + "; ".join(
                f"{x.name} {x.done}/{x.total} shards, {x.rate():,.0f} docs/s"
                + (f", ETA {x.eta():.0f}s" if x.eta() is not None else "") for x in running))

    def note(self, line: str):
        if self.quiet:
            return
        if self.mode == "json":
            print(json.dumps({"event": "note", "message": line}), file=self.stream, flush=True)
        elif self._live is not None:
            self._live.console.print(line, markup=False, highlight=False)
        else:
            self._print(line)

    def finish(self, name: str, seconds: float):
        st = self._stage(name)
        st.finished.add(name)
        s = self.steps.get(name, {})
        if self.mode == "verbose":
            self._print(f"[{name}] done: {s.get('docs', 0):,} docs in {seconds:.1f}s")
        elif self.mode == "json":
            self._json("step_end", name, seconds=round(seconds, 3))
        if st.finished >= st.expected:
            st.seconds = time.time() - (st.t0 or time.time())
            if self.mode == "text" and st.total:
                self._print(f"[{st.name}] done: {st.total:,} shards ({st.done0:,} reused), {st.docs:,} docs, {st.seconds:.1f}s")
            elif self.mode == "live":
                self._show(st)

    def snapshot(self, width: int = 120) -> str:
        """The live display as it stands, as text (one line a shown stage)."""
        if self._live is None:
            return ""
        from rich.console import Console

        c = Console(file=io.StringIO(), width=width, record=True)
        c.print(self._live.get_renderable())
        return c.export_text()

    def close(self):
        if self._live is not None:
            self._live.stop()
            self._live = None

    # ---- inside
    def _stage(self, name: str) -> _Stage:
        stage = self.shown.get(name, "other")
        if stage not in self.stages:
            self.stages[stage] = _Stage(stage)
        return self.stages[stage]

    def _print(self, line: str):
        print(line, file=self.stream, flush=True)

    def _json(self, event: str, name: str, **extra):
        s = self.steps.get(name, {})
        el = max(time.time() - s.get("t0", time.time()), 1e-6)
        new = s.get("done", 0) - s.get("done0", 0)
        eta = el / new * (s["total"] - s["done"]) if new else None
        print(json.dumps({"event": event, "stage": self.shown.get(name, "other"), "step": name, "shards_done": s.get("done", 0),
                          "shards_total": s.get("total", 0), "docs": s.get("docs", 0),
                          "docs_per_s": round((s.get("docs", 0) - s.get("docs0", 0)) / el, 1),
                          "eta_s": None if eta is None else round(eta, 1), "elapsed_s": round(el, 3), **extra}),
              file=self.stream, flush=True)

    def _show(self, st: _Stage):
        """The stage's line in the live display (rich Progress, one task a stage)."""
        if self._live is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bars, TextColumn, \
                TimeElapsedColumn, TimeRemainingColumn

            console = self._console or Console(file=self.stream)
            self._live = Bars(TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                              TextColumn("shards {task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                              console=console, refresh_per_second=4, transient=False)
            self._live.start()
            self._tasks: dict[str, object] = {}
        if st.name not in self._tasks:
            self._tasks[st.name] = self._live.add_task(st.name, total=st.total, completed=st.done, rate="")
        done = st.finished >= st.expected
        rate = f"{st.docs:,} docs" + (f" in {st.seconds:.1f}s" if done else f", {st.rate():,.0f} docs/s")
        self._live.update(self._tasks[st.name], total=max(st.total, 1), completed=st.done, rate=rate,
                          description=st.name + (" done" if done else ""))
