"""The report's three kinds of bar chart as inline SVG, written directly.

report.html needs a funnel (horizontal bars), a score histogram with its threshold and
target-against-realised weights (grouped bars). Drawing them with matplotlib cost 1.4 s
per report (0.5 s of it the import): most of the wall time of a mixture variant that only
re-runs the mix. These functions write the same charts in milliseconds, byte-identical for
the same numbers, with no font or backend to configure.
"""

from __future__ import annotations

import math
from html import escape

W = 640  # width of every chart, pixels
FONT = "font-family='sans-serif' font-size='11'"


def _nice_ticks(top: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top`."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks, t = [], 0.0
    while t < top + step * 0.999:
        ticks.append(round(t, 10))
        t += step
    return ticks


def _num(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def _frame(height: int, title: str, body: list[str]) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{height}' viewBox='0 0 {W} {height}' "
            f"role='img' aria-label='{escape(title, quote=True)}'><text x='{W // 2}' y='16' text-anchor='middle' "
            f"{FONT} font-weight='bold'>{escape(title)}</text>" + "".join(body) + "</svg>")


def hbar(title: str, labels: list[str], values: list[float], xlabel: str, color: str = "#4a7fb5") -> str:
    """One horizontal bar per label, top to bottom in the order given."""
    left, right, top, row = 170, 20, 28, 22
    h = top + row * len(labels) + 40
    ticks = _nice_ticks(max(values or [0]))
    span = (W - left - right) / ticks[-1]
    body = []
    for t in ticks:
        x = left + t * span
        body.append(f"<line x1='{x:.1f}' y1='{top}' x2='{x:.1f}' y2='{top + row * len(labels)}' stroke='#ddd'/>"
                    f"<text x='{x:.1f}' y='{top + row * len(labels) + 14}' text-anchor='middle' {FONT}>{_num(t)}</text>")
    for i, (lab, v) in enumerate(zip(labels, values, strict=True)):
        y = top + i * row
        body.append(f"<text x='{left - 6}' y='{y + row * 0.65:.1f}' text-anchor='end' {FONT}>{escape(lab)}</text>"
                    f"<rect x='{left}' y='{y + 3}' width='{v * span:.1f}' height='{row - 6}' fill='{color}'>"
                    f"<title>{escape(lab)}: {v:,}</title></rect>")
    body.append(f"<text x='{left + (W - left - right) / 2:.0f}' y='{h - 6}' text-anchor='middle' {FONT}>{escape(xlabel)}</text>")
    return _frame(h, title, body)


def histogram(title: str, edges: list[float], counts: list[int], threshold: float | None, xlabel: str,
              color: str = "#7a9f5a") -> str:
    """Bars between consecutive edges, a dashed line at the threshold."""
    left, right, top, plot_h = 56, 20, 28, 150
    h = top + plot_h + 40
    lo, hi = edges[0], edges[-1]
    sx = (W - left - right) / ((hi - lo) or 1)
    ticks = _nice_ticks(max(counts or [0]))
    sy = plot_h / ticks[-1]
    base = top + plot_h
    body = []
    for t in ticks:
        y = base - t * sy
        body.append(f"<line x1='{left}' y1='{y:.1f}' x2='{W - right}' y2='{y:.1f}' stroke='#eee'/>"
                    f"<text x='{left - 4}' y='{y + 4:.1f}' text-anchor='end' {FONT}>{_num(t)}</text>")
    for a, b, c in zip(edges[:-1], edges[1:], counts, strict=True):
        if c:
            body.append(f"<rect x='{left + (a - lo) * sx:.1f}' y='{base - c * sy:.1f}' width='{max((b - a) * sx - 0.5, 0.5):.1f}' "
                        f"height='{c * sy:.1f}' fill='{color}'><title>{a:.3g}-{b:.3g}: {c:,}</title></rect>")
    for k in range(6):
        v = lo + (hi - lo) * k / 5
        body.append(f"<text x='{left + (v - lo) * sx:.1f}' y='{base + 14}' text-anchor='middle' {FONT}>{v:g}</text>")
    if threshold is not None:
        x = left + (threshold - lo) * sx
        body.append(f"<line x1='{x:.1f}' y1='{top}' x2='{x:.1f}' y2='{base}' stroke='#c33' stroke-dasharray='5,3'/>"
                    f"<text x='{x + 4:.1f}' y='{top + 10}' fill='#c33' {FONT}>threshold {threshold:.4g}</text>")
    body.append(f"<line x1='{left}' y1='{base}' x2='{W - right}' y2='{base}' stroke='#333'/>"
                f"<text x='{left + (W - left - right) / 2:.0f}' y='{h - 6}' text-anchor='middle' {FONT}>{escape(xlabel)}</text>")
    return _frame(h, title, body)


def grouped(title: str, names: list[str], series: dict[str, list[float]], colors: list[str]) -> str:
    """For each name, one bar per series side by side, with a legend."""
    left, right, top, plot_h = 56, 20, 44, 140
    h = top + plot_h + 30
    ticks = _nice_ticks(max([v for vs in series.values() for v in vs] or [0]))
    sy = plot_h / ticks[-1]
    base = top + plot_h
    group = (W - left - right) / max(len(names), 1)
    bar = group * 0.8 / max(len(series), 1)
    body = []
    for t in ticks:
        y = base - t * sy
        body.append(f"<line x1='{left}' y1='{y:.1f}' x2='{W - right}' y2='{y:.1f}' stroke='#eee'/>"
                    f"<text x='{left - 4}' y='{y + 4:.1f}' text-anchor='end' {FONT}>{t:g}</text>")
    for j, (label, color) in enumerate(zip(series, colors, strict=False)):
        x = left + j * 130
        body.append(f"<rect x='{x}' y='24' width='10' height='10' fill='{color}'/><text x='{x + 14}' y='33' {FONT}>{escape(label)}</text>")
    for i, name in enumerate(names):
        x0 = left + i * group + group * 0.1
        for j, (label, vs) in enumerate(series.items()):
            v = vs[i]
            body.append(f"<rect x='{x0 + j * bar:.1f}' y='{base - v * sy:.1f}' width='{bar - 1:.1f}' height='{v * sy:.1f}' "
                        f"fill='{colors[j % len(colors)]}'><title>{escape(name)} {escape(label)}: {v:.4g}</title></rect>")
        body.append(f"<text x='{x0 + group * 0.4:.1f}' y='{base + 14}' text-anchor='middle' {FONT}>{escape(name)}</text>")
    body.append(f"<line x1='{left}' y1='{base}' x2='{W - right}' y2='{base}' stroke='#333'/>")
    return _frame(h, title, body)
