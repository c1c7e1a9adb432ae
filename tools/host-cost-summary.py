#!/usr/bin/env python3
"""The host-cost table of docs/host-cost.md from the `host-cost` bench's output.

    python3 tools/host-cost-summary.py host-cost.log [more.log ...]

The input is what bundle/gpu-host-cost.sh writes: several runs of `bundle/benches/host-cost` in one
file, each after a `host-cost run N` line, with every line prefixed by `[rank R]`. Older logs,
with one run and no paired column, are read too.

It prints a Markdown table with one row per run and rank. Each cell is the overhead of a safe call
over the raw call on `MemBuffer` (safe median - raw median) and, where the program printed it, the
median of the pairwise differences. Then, per rank and scope, it prints the median over the runs,
and the verdict of issue 16's goal: every `MemBuffer` cell at most +150 ns on every rank. The
verdict uses the per-rank medians over the runs, because one run's medians move by ~150 ns from
one run to the next (docs/host-cost.md). Only `MemBuffer` is judged: on `CudaSlice`, the safe call
also pays cudarc's own stream protocol. Last, per rank, the median raw call and the overhead as a
share of it: on these machines the overhead moves with the raw call from run to run (both slow
down together), so the share is the steadier figure for comparing two programs.
"""

import re
import statistics
import sys

GOAL_NS = 150
SCOPES = ("eager", "capture", "group")
RUN = re.compile(r"^host-cost run (\d+)")
ROW = re.compile(
    r"^(?:\[rank (\d+)\])?\s*MemBuffer\s+(eager|capture|group)\s+(\d+)\s+(\d+)\s+([+-]\d+)(?:\s+([+-]\d+))?"
)


def parse(paths):
    """{(run, rank): {scope: (overhead, paired or None, raw median)}}; runs are numbered across the
    files (a file without run headers is one run)."""
    cells = {}
    run = 0
    for path in paths:
        started = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if RUN.match(line):
                    run += 1
                    started = True
                    continue
                m = ROW.match(line)
                if m:
                    if not started:
                        run += 1
                        started = True
                    rank = int(m.group(1) or 0)
                    paired = int(m.group(6)) if m.group(6) else None
                    cells.setdefault((run, rank), {})[m.group(2)] = (int(m.group(5)), paired, int(m.group(3)))
    return cells


def main(paths):
    cells = parse(paths)
    if not cells:
        print("no MemBuffer rows found in " + ", ".join(paths))
        return 1
    print("| run | rank | eager | capture | group |")
    print("|---|---|---|---|---|")
    for (run, rank), row in sorted(cells.items()):
        shown = []
        for scope in SCOPES:
            overhead, paired, _ = row.get(scope, (None, None, None))
            if overhead is None:
                shown.append("—")
            else:
                shown.append(f"{overhead:+d}" + (f" / {paired:+d}" if paired is not None else ""))
        print(f"| {run} | {rank} | " + " | ".join(shown) + " |")
    print()
    print("Cells: overhead (safe median - raw median) / paired (median of pairwise differences), ns.")
    print()
    over = []
    ranks = sorted({rank for (_, rank) in cells})
    for rank in ranks:
        medians = []
        for scope in SCOPES:
            values = [
                row[scope][1] if row[scope][1] is not None else row[scope][0]
                for (_, r), row in cells.items()
                if r == rank and scope in row
            ]
            if not values:
                continue
            median = statistics.median(values)
            medians.append(f"{scope} {median:+.0f}")
            if median > GOAL_NS:
                over.append(f"rank {rank} {scope} {median:+.0f}")
        runs = len({run for (run, r) in cells if r == rank})
        print(
            f"rank {rank}, median over {runs} run(s) of the paired overhead (the plain overhead for runs"
            " that printed no pairs): " + ", ".join(medians)
        )
    for rank in ranks:
        shares = []
        for scope in SCOPES:
            rows = [row[scope] for (_, r), row in cells.items() if r == rank and scope in row]
            if rows:
                raw = statistics.median(raw for _, _, raw in rows)
                share = statistics.median(
                    100 * (paired if paired is not None else overhead) / raw for overhead, paired, raw in rows
                )
                shares.append(f"{scope} {share:.1f} % of {raw / 1000:.2f} µs")
        print(f"rank {rank}, the overhead as a share of the raw call (medians over the runs): " + ", ".join(shares))
    if over:
        print(f"goal (every MemBuffer cell <= +{GOAL_NS} ns on every rank): NOT met: " + "; ".join(over))
    else:
        print(f"goal (every MemBuffer cell <= +{GOAL_NS} ns on every rank): met")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[2].strip())
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
