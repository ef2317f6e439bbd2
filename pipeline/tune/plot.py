"""fit.svg: the surrogate's cross-validated predictions against the observed metric, and
each cell's partial effect around the proposal. Plain SVG text: no plotting library."""

from __future__ import annotations

from html import escape

import numpy as np

W, H, PAD = 300, 220, 40


def _scale(v, lo, hi, a, b):
    return a + (b - a) * ((v - lo) / (hi - lo) if hi > lo else 0.5)


def _panel(x0: float, y0: float, title: str, xs: list, ys: list, line: bool, xlabel: str, ylabel: str,
           diagonal: bool = False) -> list[str]:
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    lo_x, hi_x = float(xs.min()), float(xs.max())
    lo_y, hi_y = float(ys.min()), float(ys.max())
    if diagonal:
        lo_x = lo_y = min(lo_x, lo_y)
        hi_x = hi_y = max(hi_x, hi_y)
    px = [_scale(v, lo_x, hi_x, x0 + PAD, x0 + W - 10) for v in xs]
    py = [_scale(v, lo_y, hi_y, y0 + H - PAD, y0 + 20) for v in ys]
    out = [f'<text x="{x0 + W / 2}" y="{y0 + 14}" text-anchor="middle" font-size="12">{escape(title)}</text>',
           f'<rect x="{x0 + PAD}" y="{y0 + 20}" width="{W - PAD - 10}" height="{H - PAD - 20}" fill="none" stroke="#999"/>',
           f'<text x="{x0 + W / 2}" y="{y0 + H - 8}" text-anchor="middle" font-size="10">{escape(xlabel)} '
           f'[{lo_x:.3g}, {hi_x:.3g}]</text>',
           f'<text x="{x0 + 10}" y="{y0 + H / 2}" font-size="10" transform="rotate(-90 {x0 + 10} {y0 + H / 2})" '
           f'text-anchor="middle">{escape(ylabel)} [{lo_y:.3g}, {hi_y:.3g}]</text>']
    if diagonal:
        out.append(f'<line x1="{x0 + PAD}" y1="{y0 + H - PAD}" x2="{x0 + W - 10}" y2="{y0 + 20}" stroke="#ccc"/>')
    if line:
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py, strict=True))
        out.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>')
    else:
        out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="#1f77b4"/>' for a, b in zip(px, py, strict=True)]
    return out


def svg(observed, predicted, rho: float, metric: str, model: str, cols: list[str], curves: dict) -> str:
    per_row = 3
    n = 1 + len(curves)
    rows = (n + per_row - 1) // per_row
    parts = _panel(0, 0, f"{model}: out-of-fold prediction (Spearman {rho:.2f})", observed, predicted, False,
                   f"observed {metric}", "predicted", diagonal=True)
    for k, c in enumerate(cols):
        xs, ys = curves[c]
        i = k + 1
        parts += _panel((i % per_row) * W, (i // per_row) * H, f"{c}: partial effect", xs, ys, True, "weight",
                        f"predicted {metric}")
    body = "\n".join(parts)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{per_row * W}" height="{rows * H}" '
            f'font-family="sans-serif">\n{body}\n</svg>\n')
