"""Progress of long work: one line per step, tqdm bars on a terminal, plain periodic lines
in job logs (docs/s and an ETA either way)."""

from __future__ import annotations

import sys
import time


class Progress:
    """One line per step: tqdm bars on a terminal, plain periodic lines in job logs."""

    def __init__(self, stream=sys.stderr, quiet: bool = False):
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty() and not quiet
        self.bars: dict[str, object] = {}
        self.state: dict[str, dict] = {}
        self.last_print = 0.0

    def start(self, name: str, total: int, done: int, docs: int):
        self.state[name] = {"total": total, "done": done, "done0": done, "docs": docs, "t0": time.time(), "docs0": docs}
        if self.quiet:
            return
        if self.tty:
            from tqdm import tqdm

            self.bars[name] = tqdm(total=total, initial=done, desc=name, unit="shard", file=self.stream, leave=True, dynamic_ncols=True)
        else:
            print(f"[{name}] {total} shards ({done} already done)", file=self.stream, flush=True)

    def update(self, name: str, docs: int):
        s = self.state[name]
        s["done"] += 1
        s["docs"] += docs
        elapsed = max(time.time() - s["t0"], 1e-6)
        rate = (s["docs"] - s["docs0"]) / elapsed
        new_shards = s["done"] - s.get("done0", 0)
        eta = elapsed / new_shards * (s["total"] - s["done"]) if new_shards else None
        if self.quiet:
            return
        if self.tty:
            bar = self.bars[name]
            bar.set_postfix_str(f"{s['docs']:,} docs, {rate:,.0f} docs/s", refresh=False)
            bar.update(1)
        elif time.time() - self.last_print > 5 or s["done"] == s["total"]:
            self.last_print = time.time()
            left = f", ETA {eta:.0f}s" if eta is not None and s["done"] < s["total"] else ""
            print(f"[{name}] {s['done']}/{s['total']} shards, {s['docs']:,} docs, {rate:,.0f} docs/s{left}", file=self.stream, flush=True)

    def note(self, line: str):
        if not self.quiet:
            print(line, file=self.stream, flush=True)

    def finish(self, name: str, seconds: float):
        if self.tty and name in self.bars:
            self.bars.pop(name).close()
        s = self.state.get(name, {})
        if self.quiet:
            return
        print(f"[{name}] done: {s.get('docs', 0):,} docs in {seconds:.1f}s", file=self.stream, flush=True)
