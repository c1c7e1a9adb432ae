#!/usr/bin/env python3
"""The side-by-side of issue 10: the best of this project's all-reduce kernels (ours.json, written by
the custom-kernels bench, examples/benches/custom-kernels.rs) against the best of nccl-tests' all_reduce_perf variants (nccl-tests/<variant>.<mode>.log),
per size, eager and replayed from a graph. Writes custom-vs-nccl-tests.md and, when matplotlib is
available, custom-vs-nccl-tests.svg into the directory given as the only argument.

nccl-tests times are its out-of-place column (µs, host wall clock over back-to-back calls); ours use
the same method (examples/src/bench.rs)."""
import json
import os
import re
import sys

VARIANTS = {"default": "default", "R2": "-R 2", "R2D1": "-R 2 -D 1", "R2D2": "-R 2 -D 2"}


def nccl_tests(path):
    """{bytes: out-of-place µs} from one nccl-tests log."""
    out = {}
    with open(path) as f:
        for line in f:
            words = line.split()
            if len(words) >= 13 and words[0].isdigit() and words[2] == "float":
                try:
                    out[int(words[0])] = float(words[5])
                except ValueError:
                    pass
    return out


def label(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def machine(root):
    """`2×H200` from the run's `nvidia-smi -L` (gpus.txt, written by gpu-custom-bench.sh): the GPUs
    the figures came from, which a two-GPU call does not choose."""
    try:
        with open(os.path.join(root, "gpus.txt")) as f:
            names = [m.group(1) for m in (re.match(r"GPU \d+: (?:NVIDIA )?(.+?) \(UUID", l) for l in f) if m]
    except OSError:
        return "GPUs not recorded"
    if not names:
        return "GPUs not recorded"
    model = names[0].split()[0] if len(set(names)) == 1 else " + ".join(sorted(set(names)))
    return f"{len(names)}×{model}"


def main(root):
    with open(os.path.join(root, "ours.json")) as f:
        ours = json.load(f)
    where = machine(root)
    theirs = {}
    for name in VARIANTS:
        for mode in ("eager", "graph"):
            path = os.path.join(root, "nccl-tests", f"{name}.{mode}.log")
            if os.path.exists(path):
                theirs[(name, mode)] = nccl_tests(path)
    sizes = sorted({r["bytes"] for r in ours})
    lines = [f"# Custom all-reduce kernels vs nccl-tests 2.19.6 ({where}, f32 sum, µs per call)", ""]
    series = {}
    for mode in ("eager", "graph"):
        lines += [f"## {mode}", "", "| size | best ours | µs | best nccl-tests | µs | ours / NCCL | faster |",
                  "|---:|---|---:|---|---:|---:|---|"]
        for b in sizes:
            mine = [(r["us"], r["algorithm"]) for r in ours
                    if r["bytes"] == b and r["mode"] == mode and not r["algorithm"].startswith("ncclAllReduce")]
            nv = [(t[b], f"{VARIANTS[n]}" + (" -G" if m == "graph" else "")) for (n, m), t in theirs.items()
                  if m == mode and b in t]
            if not mine or not nv:
                continue
            (mu, ma), (nu, na) = min(mine), min(nv)
            series.setdefault(mode, []).append((b, mu, nu))
            lines.append(f"| {label(b)} | {ma} | {mu:.2f} | {na} | {nu:.2f} | {mu / nu:.2f} | {'ours' if mu <= nu else 'NCCL'} |")
        lines.append("")
    with open(os.path.join(root, "custom-vs-nccl-tests.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot")
        return
    fig, ax = plt.subplots(figsize=(9, 5))
    for mode, style in (("eager", "-"), ("graph", "--")):
        pts = series.get(mode, [])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o" + style, label=f"best of ours ({mode})")
        ax.plot([p[0] for p in pts], [p[2] for p in pts], "s" + style, label=f"best of nccl-tests ({mode})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("µs per all-reduce")
    ax.set_title(f"Custom all-reduce kernels vs nccl-tests, {where}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(os.path.join(root, "custom-vs-nccl-tests.svg"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
