"""A mixture's budget, as pure maths: per cell a target and epochs, priorities and
cutoffs, phases and their share of one order. No I/O: the plan calls it with the kept
tokens the markers count, and the mix tasks with the selection it made.

Budget: a source's target is weight x target_tokens. With more kept tokens than that, the
documents are taken in priority order, priority = hash(seed, source, id, 0), until the
target is met (the last one overshoots by less than one document). With fewer, every
document is repeated for each whole epoch and the partial epoch takes documents in
priority order hash(seed, source, id, epoch). A source may not need more than its
`max_epochs`; then `on_shortfall: error` stops before anything is written, with a table,
and `renormalize` caps that source and gives the rest of target_tokens to the others in
proportion to their weights. Without weights, every kept document is taken once; with
weights and no target_tokens, the largest target that needs no repetition.
"""

from __future__ import annotations

import math

import numpy as np
import xxhash

from pipeline.errors import RunError


def priority(seed: int, source: str, ids: list[str], epoch: int) -> np.ndarray:
    return np.array([xxhash.xxh3_64_intdigest(f"{seed}:{source}:{i}:{epoch}") for i in ids], np.uint64)


def order_key(seed: int, source: str, ids: list[str], epoch: int) -> np.ndarray:
    return np.array([xxhash.xxh3_64_intdigest(f"order:{seed}:{source}:{i}:{epoch}") for i in ids], np.uint64)


# ---------------------------------------------------------------- budget (small, exact)


def budget(avail: dict[str, int], weights: dict[str, float] | None, target: int | None, max_epochs: dict[str, float | None],
           on_shortfall: str) -> dict[str, dict]:
    """Per cell (a source, or a range of its quality buckets: pipeline/mixing/cells.py): target
    tokens and the epochs that need. Raises RunError on a shortfall with `on_shortfall: error`."""
    if weights is None:
        if target is None:  # every kept document once, whatever the token counts
            return {s: {"weight": None, "target": a, "epochs": 1.0, "all": True} for s, a in avail.items()}
        total = sum(avail.values()) or 1
        weights = {s: a / total for s, a in avail.items()}
    w = {s: weights.get(s, 0.0) for s in avail}
    if target is None:  # the largest target that repeats nothing; an empty weighted cell is a shortfall below
        full = sum(w[s] for s in avail if w[s] > 0 and avail[s] > 0)  # (renormalize: its share goes to the others)
        target = int(min((avail[s] * full / w[s] for s in avail if w[s] > 0 and avail[s] > 0), default=0))
    # an empty cell can give nothing, whatever its max_epochs
    cap = {s: (max_epochs.get(s) * avail[s] if max_epochs.get(s) is not None else math.inf) if avail[s] else 0 for s in avail}
    want = {s: w[s] * target for s in avail}
    short = {s for s in avail if want[s] > cap[s] + 1e-9 or (want[s] > 0 and avail[s] == 0)}
    if short and on_shortfall == "error":
        width = max([14] + [len(s) for s in avail])
        rows = [f"  {'cell':<{width}} {'weight':>7} {'target':>14} {'available':>14} {'epochs needed':>14} {'max_epochs':>11}"]
        for s in avail:
            need = want[s] / avail[s] if avail[s] else math.inf
            me = max_epochs.get(s)
            rows.append(f"  {s:<{width}} {w[s]:>7.3f} {want[s]:>14,.0f} {avail[s]:>14,} {need:>14.2f} {me if me is not None else '-':>11}"
                        + ("  <- short" if s in short else ""))
        raise RunError("mixture: not enough tokens for the weights within max_epochs; nothing was written\n" + "\n".join(rows)
                       + "\nlower target_tokens or that cell's weight, raise max_epochs, or set mixture.on_shortfall: renormalize")
    fixed: dict[str, float] = {}
    while True:  # water-filling: capped sources take their cap, the rest share what is left
        free = [s for s in avail if s not in fixed]
        left = target - sum(fixed.values())
        wsum = sum(w[s] for s in free)
        newly = {s for s in free if wsum > 0 and w[s] * left / wsum > cap[s] + 1e-9}
        if not newly:
            break
        for s in newly:
            fixed[s] = cap[s]
    out = {}
    for s in avail:
        t = fixed[s] if s in fixed else (w[s] * left / wsum if wsum > 0 else 0.0)
        out[s] = {"weight": w[s], "target": int(round(t)), "epochs": (t / avail[s]) if avail[s] else 0.0,
                  "capped": s in fixed}
    return out


def split_epochs(target: int, avail: int) -> tuple[int, int]:
    """(whole epochs, tokens wanted from the partial epoch)."""
    if avail <= 0 or target <= 0:
        return 0, 0
    whole = target // avail
    return int(whole), int(target - whole * avail)


def cell_budget(avail: dict[str, int], weights: dict[str, float] | None, target: int | None,
                max_epochs: dict[str, float | None], on_shortfall: str, sample_rates: dict[str, float] | None = None,
                simulate: int | None = None) -> dict[str, dict]:
    """`budget` with the mixture's other two ways to say what it wants.

    sample_rates (Dolma's): a cell's target is rate x its kept tokens (2.5: every document
    2.5 times; 0.3: the 30% first in priority order); the mixture's size is their sum.
    simulate (Marin's simulated epoching): the budget of a `simulate`-token mixture gives
    each cell its epochs e; the `target`-token mixture then draws each cell's documents
    from a pool of its first (priority order) avail x target/simulate tokens, repeated e
    times, so a small ablation repeats data as often as the full run would."""
    if sample_rates is not None:
        return _rates_budget(avail, sample_rates, max_epochs, on_shortfall)
    if simulate is None:
        return budget(avail, weights, target, max_epochs, on_shortfall)
    full = budget(avail, weights, simulate, max_epochs, on_shortfall)
    if target is None:
        raise RunError("mixture.simulate_target_tokens needs mixture.target_tokens: the size of the small mixture")
    scale = target / simulate
    out = {}
    for c, e in full.items():
        small = int(round(e["target"] * scale))
        out[c] = {**e, "target": small, "simulated_target": e["target"],
                  "pool_tokens": int(math.ceil(avail[c] * scale)) if small > 0 else 0}
    return out


def _rates_budget(avail: dict[str, int], sample_rates: dict[str, float], max_epochs: dict[str, float | None],
                  on_shortfall: str) -> dict[str, dict]:
    """Per cell: rate x its kept tokens; a rate above the cell's max_epochs is a shortfall
    (error, or capped at max_epochs with `renormalize`: rates are absolute, nothing moves)."""
    sr = {c: sample_rates.get(c, 0.0) for c in avail}
    short = [c for c in avail if max_epochs.get(c) is not None and sr[c] > max_epochs[c] + 1e-9 and avail[c]]
    if short and on_shortfall == "error":
        rows = [f"  {c}: sample rate {sr[c]:g} > max_epochs {max_epochs[c]:g}" for c in short]
        raise RunError("mixture: sample rates above max_epochs; nothing was written\n" + "\n".join(rows)
                       + "\nlower those rates, raise max_epochs, or set mixture.on_shortfall: renormalize (caps them)")
    rate = {c: (min(sr[c], float(max_epochs[c] or 0)) if c in short else sr[c]) for c in avail}  # short: a cap is set
    target = {c: int(round(rate[c] * avail[c])) for c in avail}
    total = sum(target.values()) or 1
    return {c: {"weight": target[c] / total, "target": target[c], "epochs": rate[c] if avail[c] else 0.0,
                "capped": c in short} for c in avail}


# ---------------------------------------------------------------- token-weighted cutoff


def by_phase(cl: list[dict]) -> list[list[dict]]:
    """A source's cells of every phase, grouped by phase, in order."""
    out: dict = {}
    for c in cl:
        out.setdefault(c.get("phase"), []).append(c)
    return list(out.values())


def phase_selections(marker: dict) -> list[tuple[str | None, dict, int]]:
    """(phase name, its selection, its first output partition) of a mix-select marker; a
    mixture without phases is one unnamed phase, the marker itself."""
    if "phases" not in marker:
        return [(None, marker, 0)]
    out, offset = [], 0
    for name, sel in marker["phases"].items():
        out.append((name, sel, offset))
        offset += sel["n_shards"]
    return out


def source_selection(marker: dict, source: str) -> dict | None:
    """The part of a mix-select marker that decides `source`'s documents: each phase's
    output partitions and its cells of that source, each cut to what decides
    (`deciding`). A task that reads one source's choices names this in its spec, so a
    weight another source's cells take, or a count that moved with new documents, does not
    change its key (engine/reuse.py)."""
    def part(ph: dict) -> dict:
        return {"n_shards": ph["n_shards"], "sources": {k: {"cells": [deciding(c) for c in source_cells(v)]}
                                                        for k, v in ph["sources"].items() if k == source}}
    if "phases" in marker:
        return {"phases": {name: part(ph) for name, ph in marker["phases"].items()}}
    return part(marker)


# what decides a cell's documents: which documents it holds, which (document, epoch) it takes
DECIDES = ("name", "source", "topic", "lo", "hi", "lang", "axis", "value", "others", "axes",
           "seed", "whole_epochs", "cutoff", "after_cutoff", "pool_cutoff", "priority_epoch")


def deciding(c: dict) -> dict:
    """A cell of a selection cut to what decides its documents: its membership, its epochs
    and cutoffs, and the reason a document it leaves out gets (`why_not`); not its counts
    (available, target, rows, tokens), which move with every new document while the
    choice of an old one need not."""
    return {**{k: c[k] for k in DECIDES if k in c}, "why_not": not_selected_reason(c)}


def share_out(budgets: list[dict], avail: dict[str, int], names: list[str]) -> None:
    """Disjoint phases: each cell's priority order (epoch 0) is cut into consecutive token
    ranges, phase after phase; a phase's documents are those in its range. Raises RunError
    when the phases together need more of a cell than it has (disjoint phases repeat nothing)."""
    short = []
    for c in budgets[0]:
        lo = 0
        for b in budgets:
            b[c]["range"] = [lo, lo + b[c]["target"]]
            lo += b[c]["target"]
        for b in budgets:
            b[c]["shared_total"] = lo
        if lo > avail[c]:
            short.append(f"  {c}: the phases need {lo:,} tokens, it has {avail[c]:,} ("
                         + ", ".join(f"{n} {b[c]['target']:,}" for n, b in zip(names, budgets, strict=True)) + ")")
    if short:
        raise RunError("mixture: disjoint phases would repeat documents; nothing was written\n" + "\n".join(short)
                       + "\nlower the phases' target_tokens or those cells' weights, or set disjoint: false")


def source_cells(entry: dict) -> list[dict]:
    """A source's cells in a selection (a selection made before cells: the source is one)."""
    return entry.get("cells") or [{**entry, "lo": None, "hi": None, "name": None}]


def not_selected_reason(c: dict, phased: bool = False) -> str:
    """The mix stage's reason for a kept document of this cell that the mixture leaves out.
    With phases a cell's weight differs from phase to phase: the plain `not_selected`."""
    if phased:
        return "not_selected"
    if "why_not" in c:  # a cell cut to what decides (`deciding`)
        return c["why_not"]
    if c.get("named") is False or ((c.get("lo") is not None or c.get("topic") is not None) and not c.get("target")):
        return f"cell_weight_0:{c['name']}"
    return "not_selected"


def cell_epochs(c: dict, seed: int, source: str, ids: list[str]) -> list[tuple[int, np.ndarray | None]]:
    """(epoch, chosen mask, None = all) for documents of one cell: every whole epoch (of
    the simulated pool, when there is one), and the partial epoch's documents whose
    priority is within the cell's cutoff."""
    pool = p0 = None
    seed = c.get("seed", seed)
    if c.get("pool_cutoff") is not None and ids:
        p0 = priority(seed, source, ids, 0)
        pool = p0 <= np.uint64(int(c["pool_cutoff"]))
    out = [(e, pool) for e in range(c["whole_epochs"])]
    if c["cutoff"] is not None and ids:
        pe = c.get("priority_epoch", c["whole_epochs"])
        p = p0 if (p0 is not None and pe == 0) else priority(seed, source, ids, pe)
        mask = p <= np.uint64(int(c["cutoff"]))
        if c.get("after_cutoff") is not None:  # a disjoint phase: its range of the cell's order
            mask &= p > np.uint64(int(c["after_cutoff"]))
        out.append((c["whole_epochs"], mask))
    return out


def key_epoch(b: dict, avail: int) -> int | None:
    """The epoch whose priorities a cell's selection needs keys of (None: it takes whole epochs only)."""
    if b.get("range") is not None:  # disjoint phases: ranges of epoch 0's order, keyed if any phase takes some
        return 0 if b.get("shared_total", 0) > 0 else None
    if b.get("all") or b["target"] <= 0:
        return None
    if b.get("pool_tokens") is not None:  # simulated: the pool and the partial epoch are prefixes of epoch 0's order
        whole, partial = split_epochs(b["target"], min(b["pool_tokens"], avail))
        return 0 if (b["pool_tokens"] < avail or partial > 0) else None
    whole, partial = split_epochs(b["target"], avail)
    return whole if partial > 0 else None


def selected_sources(marker: dict) -> list[str]:
    """The sources a mix-select marker chooses documents of, in any phase."""
    phases = marker["phases"].values() if "phases" in marker else [marker]
    return sorted({s for ph in phases for s in ph["sources"]})
