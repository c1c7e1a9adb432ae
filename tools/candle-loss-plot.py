#!/usr/bin/env python3
"""Draws the loss curves of the candle training lessons (17, 18) beside their single-GPU runs.

Reads the logs of lesson runs (rank 0's output: the table `| step | distributed loss | single-GPU
loss | relative difference |` that each lesson prints at its end) and writes one SVG: loss against
step, log scale, each distributed run as a solid line and its single-GPU reference dashed, and the
largest relative difference in the legend. Plain SVG, no plotting library.

Usage: candle-loss-plot.py OUT.svg LABEL=LOG [LABEL=LOG ...]
  e.g. candle-loss-plot.py docs/candle/losses.svg "lesson 17, 2 GPUs=logs/17.log" "lesson 18, 2 GPUs=logs/18.log"
"""
import math
import re
import sys

ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*([0-9.eE+-]+)\s*\|\s*([0-9.eE+-]+)\s*\|\s*([0-9.eE+-]+)\s*\|\s*$")
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def read(path):
    """(step, distributed, single) rows of the last loss table in a log."""
    rows, table = [], []
    for line in open(path, encoding="utf-8", errors="replace"):
        line = re.sub(r"^\[rank \d+\] ", "", line.strip())
        m = ROW.match(line)
        if m:
            table.append((int(m[1]), float(m[2]), float(m[3])))
        elif table:
            rows, table = table, []
    return table or rows


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, runs = sys.argv[1], []
    for arg in sys.argv[2:]:
        label, _, path = arg.rpartition("=")
        rows = read(path)
        if not rows:
            sys.exit(f"{path}: no loss table found")
        runs.append((label or path, rows))
    w, h, left, right, top, bottom = 760, 440, 70, 20, 20, 50
    steps = [s for _, rows in runs for s, _, _ in rows]
    losses = [v for _, rows in runs for _, a, b in rows for v in (a, b) if v > 0]
    x0, x1 = min(steps), max(steps) or 1
    y0, y1 = math.log10(min(losses)), math.log10(max(losses))
    if y1 - y0 < 1e-9:
        y0, y1 = y0 - 0.5, y1 + 0.5
    sx = lambda s: left + (s - x0) / max(x1 - x0, 1) * (w - left - right)
    sy = lambda v: top + (y1 - math.log10(v)) / (y1 - y0) * (h - top - bottom)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
           f'<text x="{(w + left) / 2}" y="{h - 12}" text-anchor="middle">step</text>',
           f'<text x="16" y="{(h - bottom + top) / 2}" transform="rotate(-90 16 {(h - bottom + top) / 2})" '
           'text-anchor="middle">loss (log scale)</text>']
    for k in range(5):
        v = 10 ** (y0 + k * (y1 - y0) / 4)
        svg.append(f'<text x="{left - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
        s = x0 + k * (x1 - x0) / 4
        svg.append(f'<text x="{sx(s):.1f}" y="{h - bottom + 16}" text-anchor="middle">{s:.0f}</text>')
    for i, (label, rows) in enumerate(runs):
        colour = COLOURS[i % len(COLOURS)]
        worst = max(abs(a - b) / abs(b) for _, a, b in rows if b)
        for col, dash, name in ((1, "", label), (2, ' stroke-dasharray="6 4"', f"{label}: one GPU, global batch")):
            points = " ".join(f"{sx(r[0]):.1f},{sy(r[col]):.1f}" for r in rows if r[col] > 0)
            svg.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dash} points="{points}"/>')
        y = top + 16 + 34 * i
        svg.append(f'<line x1="{w - 330}" y1="{y}" x2="{w - 300}" y2="{y}" stroke="{colour}" stroke-width="2"/>')
        svg.append(f'<text x="{w - 295}" y="{y + 4}">{label} (dashed: one GPU; max rel. diff {worst:.1e})</text>')
    svg.append("</svg>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(svg) + "\n")
    print(f"{out}: {len(runs)} runs")


if __name__ == "__main__":
    main()
