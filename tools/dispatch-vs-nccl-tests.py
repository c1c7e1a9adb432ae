#!/usr/bin/env python3
"""Issue 16's dispatcher table: reads the runs of gpucomm/gpu/dispatch-vs-nccl-tests.sh (a folder with
c.<variant>.<range>.<repeat>.log from nccl-tests and r.<buffers>.<range>.<repeat>.json from
`gpucomm bench --impl dispatch`) and prints, as Markdown, per mode (eager, graph) and size the
dispatching all-reduce's time and path on ordinary buffers and on its symmetric buffers, the best
nccl-tests variant, their ratio, and the issue's goals. Usage: dispatch-vs-nccl-tests.py DIR"""
import glob
import json
import os
import re
import statistics
import sys

VARIANTS = {"default": "default", "R2": "-R 2", "R2D1": "-R 2 -D 1", "R2D2": "-R 2 -D 2"}
BUFFERS = {"nccl": "any buffers (staged)", "window": "symmetric buffers"}


def nccl_tests(path):
    out = {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if len(w) >= 13 and w[0].isdigit():
                try:
                    out[int(w[0])] = float(w[5])
                except ValueError:
                    pass
    return out


def gpucomm(path):
    with open(path) as f:
        text = f.read()
    doc = json.loads(text[text.index("{"):])
    return {r["size"]: (r["out_of_place"]["time_us"], r["out_of_place"].get("path") or "?")
            for r in doc["run"]["rows"] if r.get("out_of_place")}


def label(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def mode_of(range_name):
    return "eager" if range_name == "eager" else "graph"


def main(root):
    c = {}  # (variant, mode) -> {size: [µs]}
    for path in glob.glob(os.path.join(root, "c.*.log")):
        m = re.match(r"c\.(\w+)\.([\w-]+)\.(\d+)\.log$", os.path.basename(path))
        if not m or m.group(1) not in VARIANTS:
            continue
        for size, us in nccl_tests(path).items():
            c.setdefault((m.group(1), mode_of(m.group(2))), {}).setdefault(size, []).append(us)
    r = {}  # (buffers, mode) -> {size: [(µs, path)]}
    for path in glob.glob(os.path.join(root, "r.*.json")):
        m = re.match(r"r\.(\w+)\.([\w-]+)\.(\d+)\.json$", os.path.basename(path))
        if not m or m.group(1) not in BUFFERS:
            continue
        try:
            rows = gpucomm(path)
        except (ValueError, KeyError, json.JSONDecodeError):
            continue
        for size, (us, p) in rows.items():
            r.setdefault((m.group(1), mode_of(m.group(2))), {}).setdefault(size, []).append((us, p))
    if not c or not r:
        sys.exit(f"no results in {root} (nccl-tests: {len(c)}, dispatcher: {len(r)})")
    print("# The dispatching all-reduce (gpucomm-kernels) vs the best of nccl-tests 2.19.6's variants")
    print()
    print("f32 sum, one process per GPU under mpirun, µs per call (out of place; median over the repeats). "
          "nccl-tests variants: default, -R 2, -R 2 -D 1, -R 2 -D 2 (never -D 3/-D 4: NVLink multicast). "
          "ratio = dispatcher time / best nccl-tests time (< 1: the dispatcher is faster; busbw ratio = 1 / ratio). "
          "Graph: -G 10 up to 64 MiB, -G 1 above.")
    table = os.path.join(root, "table.txt")
    if os.path.exists(table):
        with open(table) as f:
            src = next((l.split(":", 1)[1].strip() for l in f if l.startswith("source:")), "?")
        print(f"Crossover table: `table.txt` ({src}).")
    goals = []
    for mode in ("eager", "graph"):
        sizes = sorted({s for (v, md), t in c.items() if md == mode for s in t})
        print()
        print(f"## {mode}")
        print()
        head = "| size | best nccl-tests | µs |"
        for b, name in BUFFERS.items():
            head += f" dispatch, {name}: path | µs | ratio |"
        print(head)
        print("|---:|---|---:|" + "---|---:|---:|" * len(BUFFERS))
        for s in sizes:
            best = min(((statistics.median(t[s]), VARIANTS[v]) for (v, md), t in c.items() if md == mode and s in t),
                       default=None)
            if best is None:
                continue
            line = f"| {label(s)} | {best[1]} | {best[0]:.2f} |"
            for b in BUFFERS:
                runs = r.get((b, mode), {}).get(s)
                if not runs:
                    line += " — | — | — |"
                    continue
                us = statistics.median(x[0] for x in runs)
                paths = "/".join(sorted({x[1] for x in runs}))
                ratio = us / best[0]
                line += f" {paths} | {us:.2f} | {ratio:.3f} |"
                goals.append((b, mode, s, us, best[0], ratio))
            print(line)
    print()
    print("## Goals")
    print()
    for b, name in BUFFERS.items():
        mine = [g for g in goals if g[0] == b]
        if not mine:
            continue
        slower = [g for g in mine if g[5] > 1.0]
        worst = max(mine, key=lambda g: g[5])
        print(f"- {name}: never slower than nccl-tests' best: "
              + ("met" if not slower else f"NOT met at {len(slower)} of {len(mine)} sizes (worst {worst[5]:.3f} at "
                 f"{label(worst[2])} {worst[1]})"))
        big = [g for g in mine if g[2] >= 1 << 30]
        if big:
            low = min(big, key=lambda g: 1 / g[5])
            print(f"- {name}: busbw ≥ 1.05 × nccl-tests' best from 1 GiB up: lowest {1 / low[5]:.3f} at {label(low[2])} "
                  f"{low[1]} — {'met' if 1 / low[5] >= 1.05 else 'NOT met'}")
        small = [g for g in mine if g[1] == "graph" and g[2] <= 64 << 10]
        if small:
            top = max(small, key=lambda g: g[3])
            print(f"- {name}: ≤ 3.0 µs from a graph up to 64 KiB: largest {top[3]:.2f} µs at {label(top[2])} — "
                  f"{'met' if top[3] <= 3.0 else 'NOT met'}")


def sweep(root):
    """The launch-shape sweep (s.<kernel>.<bytes per CTA>.<mode>.json), if it ran."""
    runs = {}
    for path in glob.glob(os.path.join(root, "s.*.json")):
        m = re.match(r"s\.([\w-]+)\.(\w+)\.(eager|graph)\.json$", os.path.basename(path))
        if not m:
            continue
        try:
            runs[(m.group(1), m.group(2), m.group(3))] = gpucomm(path)
        except (ValueError, KeyError, json.JSONDecodeError):
            continue
    if not runs:
        return
    print()
    print("## Launch shapes (bytes of message per CTA; symmetric buffers, µs per call, one run)")
    for kernel in sorted({k for k, _, _ in runs}):
        ctas = sorted({c for k, c, _ in runs if k == kernel}, key=lambda c: int(c.rstrip("K")))
        for mode in ("eager", "graph"):
            sizes = sorted({s for (k, c, md), t in runs.items() if k == kernel and md == mode for s in t})
            if not sizes:
                continue
            print()
            print(f"{kernel}, {mode}:")
            print()
            print("| size | " + " | ".join(f"{c} per CTA" for c in ctas) + " |")
            print("|---:|" + "---:|" * len(ctas))
            for s in sizes:
                cells = []
                for c in ctas:
                    t = runs.get((kernel, c, mode), {}).get(s)
                    cells.append(f"{t[0]:.2f}" if t else "—")
                print(f"| {label(s)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
    sweep(sys.argv[1] if len(sys.argv) > 1 else ".")
