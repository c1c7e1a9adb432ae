#!/usr/bin/env python3
"""Issue 16's variant table: reads the runs of gpucomm/gpu/variants.sh (a folder with variants.txt and
<variant>.<repeat>.log for nccl-tests, <variant>.<repeat>.json for gpucomm bench) and prints, as
Markdown, per variant the median out-of-place time per call at each size, the mean over the sizes
with its spread over the repeats, the difference to nccl-tests' default run (of the medians, and
paired: repeat by repeat, since the repeats of one variant drift with the machine more than the
variants differ) and the host time per call. Usage: variants-table.py DIR > variants.md"""
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
    runs = {}  # variant -> {repeat: results}
    for name, tool, *_ in variants:
        ext = "log" if tool == "c" else "json"
        per = {}
        for path in glob.glob(os.path.join(root, f"{name}.*.{ext}")):
            rep = os.path.basename(path)[len(name) + 1:-len(ext) - 1]  # <name>.<rep>.<ext>
            if not rep.isdigit():
                continue
            try:
                result = nccl_tests(path) if tool == "c" else gpucomm(path)
            except (ValueError, KeyError, json.JSONDecodeError):
                continue
            if result:
                per[int(rep)] = result
        runs[name] = per
    # The sizes every run has.
    all_runs = [set(r) for per in runs.values() for r in per.values()]
    sizes = sorted(set.intersection(*all_runs)) if all_runs else []
    if not sizes:
        sys.exit("no results found in " + root)

    def median(name, size, col):
        vals = [r[size][col] for r in runs.get(name, {}).values() if size in r and r[size][col] is not None]
        return statistics.median(vals) if vals else None

    def per_repeat(name, col=0):
        """{repeat: the mean over the sizes}."""
        out = {}
        for rep, r in runs.get(name, {}).items():  # a variant left out by ONLY has none
            vals = [r[s][col] for s in sizes if s in r and r[s][col] is not None]
            if len(vals) == len(sizes):
                out[rep] = sum(vals) / len(vals)
        return out

    def means(name, col=0):
        return list(per_repeat(name, col).values())

    def paired(name):
        """Per repeat that both have: this variant's mean minus nccl-tests' default's."""
        mine, base = per_repeat(name), per_repeat("c.default")
        return [mine[k] - base[k] for k in sorted(mine) if k in base]

    base = means("c.default")
    base_mean = statistics.median(base) if base else None
    c_host = means("c.cputime")
    shown = [s for s in sizes if s in (8, 512, 4096, 32768, 262144)] or sizes
    n_rep = max((len(p) for p in runs.values()), default=0)
    print("# Small-message variants: gpucomm bench vs nccl-tests 2.19.6 (all_reduce, f32 sum, one process per GPU)")
    print()
    print(f"Medians over up to {n_rep} repeats, interleaved (gpucomm/gpu/variants.sh). Times are µs per call, out of place; "
          f"**mean** is the mean over {label(sizes[0])} – {label(sizes[-1])} (median over repeats, [min–max] of the "
          "repeats); **Δ** is that mean minus nccl-tests' default run's; **Δ paired** is the median over the repeats of "
          "the same difference taken within each repeat (the two runs minutes apart at most), [min–max]; **host** is "
          "the host time per call up to the last call's return (gpucomm's cpu_us; nccl-tests' -C 1 run for its "
          "default). The verdicts below use Δ paired.")
    print()
    print("| variant | tool | launcher | what differs | " + " | ".join(label(s) for s in shown)
          + " | mean [min–max] | Δ vs C default | Δ paired [min–max] | in-place mean | host µs |")
    print("|---|---|---|---|" + "---:|" * len(shown) + "---:|---:|---:|---:|---:|")
    rows = []
    for name, tool, launcher, mpiargs, args in variants:
        if not runs[name]:
            print(f"| {name} | {'nccl-tests' if tool == 'c' else 'gpucomm'} | {launcher} | {(mpiargs + ' ' + args).strip() or '—'} | "
                  + " | ".join("—" for _ in shown) + " | no result | | | | |")
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
        pd = paired(name)
        pd_mid = statistics.median(pd) if pd else None
        pd_cell = f"{pd_mid:+.2f} [{min(pd):+.2f}–{max(pd):+.2f}]" if pd else "—"
        host_cell = f"{statistics.median(host):.2f}" if host else "—"
        ip_cell = f"{statistics.median(ip):.2f}" if ip else "—"
        what = (mpiargs + " " + args).strip() or "—"
        print(f"| {name} | {'nccl-tests' if tool == 'c' else 'gpucomm'} | {launcher} | `{what}` | " + " | ".join(cells)
              + f" | {spread} | {delta} | {pd_cell} | {ip_cell} | {host_cell} |")
        if pd_mid is not None:
            rows.append((name, tool, pd_mid))
    print()
    if base_mean is not None:
        close = [n for n, t, d in rows if t == "r" and d <= 0.3]
        print(f"nccl-tests' default mean: {base_mean:.2f} µs. gpucomm variants within +0.3 µs of it, paired (the issue's goal): "
              + (", ".join(close) if close else "none") + ".")
        r_default = next((d for n, t, d in rows if n == "r.default"), None)
        if r_default is not None:
            moved = sorted(((d - r_default, n) for n, t, d in rows if t == "r" and n != "r.default"))
            print("Largest gains over gpucomm's default: " + ", ".join(f"{n} {d:+.2f} µs" for d, n in moved[:3]) + ".")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
