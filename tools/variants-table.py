#!/usr/bin/env python3
"""Issue 16's variant table: reads the runs of cli/gpu/variants.sh (a folder with variants.txt and
<variant>.<repeat>.log for nccl-tests, <variant>.<repeat>.json for gpucomm bench) and prints, as
Markdown, per variant the median out-of-place time per call at each size, the mean over the sizes
with its spread over the repeats, the difference to nccl-tests' default run and the host time per
call. Usage: variants-table.py DIR > variants.md"""
import glob
import json
import os
import statistics
import sys


def nccl_tests(path):
    """{bytes: (out-of-place µs, in-place µs)} from one nccl-tests log."""
    out = {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if len(w) >= 13 and w[0].isdigit():
                try:
                    out[int(w[0])] = (float(w[5]), float(w[9]))
                except ValueError:
                    pass
    return out


def gpucomm(path):
    """{bytes: (out-of-place µs, in-place µs, host µs)} from one `gpucomm bench --json` document."""
    with open(path) as f:
        text = f.read()
    doc = json.loads(text[text.index("{"):])
    out = {}
    for row in doc["run"]["rows"]:
        o, i = row.get("out_of_place") or {}, row.get("in_place") or {}
        out[row["size"]] = (o.get("time_us"), i.get("time_us"), o.get("cpu_us"))
    return out


def label(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def main(root):
    with open(os.path.join(root, "variants.txt")) as f:
        variants = [line.rstrip("\n").split("|") for line in f if line.strip()]
    runs = {}
    for name, tool, *_ in variants:
        ext = "log" if tool == "c" else "json"
        per = []
        for path in sorted(glob.glob(os.path.join(root, f"{name}.*.{ext}"))):
            try:
                per.append(nccl_tests(path) if tool == "c" else gpucomm(path))
            except (ValueError, KeyError, json.JSONDecodeError):
                continue
            if not per[-1]:
                per.pop()
        runs[name] = per
    # The sizes every run has.
    all_runs = [set(r) for per in runs.values() for r in per]
    sizes = sorted(set.intersection(*all_runs)) if all_runs else []
    if not sizes:
        sys.exit("no results found in " + root)

    def median(name, size, col):
        vals = [r[size][col] for r in runs[name] if size in r and r[size][col] is not None]
        return statistics.median(vals) if vals else None

    def means(name, col=0):
        """Per repeat: the mean over the sizes."""
        out = []
        for r in runs[name]:
            vals = [r[s][col] for s in sizes if s in r and r[s][col] is not None]
            if len(vals) == len(sizes):
                out.append(sum(vals) / len(vals))
        return out

    base = means("c.default")
    base_mean = statistics.median(base) if base else None
    c_host = means("c.cputime")
    shown = [s for s in sizes if s in (8, 512, 4096, 32768, 262144)] or sizes
    n_rep = max((len(p) for p in runs.values()), default=0)
    print("# Small-message variants: gpucomm bench vs nccl-tests 2.19.6 (all_reduce, f32 sum, one process per GPU)")
    print()
    print(f"Medians over up to {n_rep} repeats, interleaved (cli/gpu/variants.sh). Times are µs per call, out of place; "
          f"**mean** is the mean over {label(sizes[0])} – {label(sizes[-1])} (median over repeats, [min–max] of the "
          "repeats); **Δ** is that mean minus nccl-tests' default run's; **host** is the host time per call up to the "
          "last call's return (gpucomm's cpu_us; nccl-tests' -C 1 run for its default).")
    print()
    print("| variant | tool | launcher | what differs | " + " | ".join(label(s) for s in shown)
          + " | mean [min–max] | Δ vs C default | in-place mean | host µs |")
    print("|---|---|---|---|" + "---:|" * len(shown) + "---:|---:|---:|---:|")
    rows = []
    for name, tool, launcher, mpiargs, args in variants:
        if not runs[name]:
            print(f"| {name} | {'nccl-tests' if tool == 'c' else 'gpucomm'} | {launcher} | {(mpiargs + ' ' + args).strip() or '—'} | "
                  + " | ".join("—" for _ in shown) + " | no result | | | |")
            continue
        m = means(name)
        mean = statistics.median(m) if m else None
        ip = means(name, 1)
        if tool == "r":
            host = means(name, 2)
        else:
            host = c_host if name == "c.default" else []
        cells = [f"{median(name, s, 0):.2f}" if median(name, s, 0) is not None else "—" for s in shown]
        spread = f"{mean:.2f} [{min(m):.2f}–{max(m):.2f}]" if m else "—"
        delta = f"{mean - base_mean:+.2f}" if (mean is not None and base_mean is not None) else "—"
        host_cell = f"{statistics.median(host):.2f}" if host else "—"
        ip_cell = f"{statistics.median(ip):.2f}" if ip else "—"
        what = (mpiargs + " " + args).strip() or "—"
        print(f"| {name} | {'nccl-tests' if tool == 'c' else 'gpucomm'} | {launcher} | `{what}` | " + " | ".join(cells)
              + f" | {spread} | {delta} | {ip_cell} | {host_cell} |")
        if mean is not None:
            rows.append((name, tool, mean))
    print()
    if base_mean is not None:
        close = [n for n, t, mean in rows if t == "r" and mean - base_mean <= 0.3]
        print(f"nccl-tests' default mean: {base_mean:.2f} µs. gpucomm variants within +0.3 µs of it (the issue's goal): "
              + (", ".join(close) if close else "none") + ".")
        r_default = next((mean for n, t, mean in rows if n == "r.default"), None)
        if r_default is not None:
            moved = sorted(((mean - r_default, n) for n, t, mean in rows if t == "r" and n != "r.default"))
            print("Largest gains over gpucomm's default: " + ", ".join(f"{n} {d:+.2f} µs" for d, n in moved[:3]) + ".")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
