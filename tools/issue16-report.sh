#!/usr/bin/env bash
# Assembles docs/bench/ from the parts of gpucomm/gpu/issue16.sh (run on the GPU machine; pass their
# output folders, e.g. the device tool's files_at for each part):
#
#   bash tools/issue16-report.sh /path/to/mpirun /path/to/spawn /path/to/variants /path/to/dispatch
#
# docs/bench/summary.md: the mpirun part's tables, then the spawner's (and -g 2's);
# docs/bench/<mode>/<collective>.{md,svg}; docs/bench/variants.md; docs/bench/dispatch.md and
# dispatch-table.txt, and the measured crossover table into gpucomm-kernels/tables/h200-2.txt (the
# dispatcher's committed table). Prints what it copied and every goal line.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$#" -ge 1 ] || { sed -n '2,10p' "$0"; exit 2; }
docs=docs/bench
mkdir -p "$docs"
summaries=()
for d in "$@"; do
    [ -d "$d" ] || { echo "not a folder: $d"; exit 2; }
    if [ -f "$d/summary.md" ] && [ -d "$d/bench" ]; then
        summaries+=("$d/summary.md")
        for mode_dir in "$d"/bench/*/; do
            mode=$(basename "$mode_dir")
            mkdir -p "$docs/$mode"
            cp "$mode_dir"/*.md "$mode_dir"/*.svg "$docs/$mode/" 2>/dev/null || true
            echo "copied $docs/$mode/"
        done
    fi
    [ -f "$d/variants.md" ] && cp "$d/variants.md" "$docs/variants.md" && echo "copied $docs/variants.md"
    if [ -f "$d/dispatch.md" ]; then
        cp "$d/dispatch.md" "$docs/dispatch.md" && echo "copied $docs/dispatch.md"
        # The committed table is the H200 one (gpucomm-kernels/src/table.rs): a calibration on other GPUs
        # (a two-GPU call may land on H100s) goes to docs only.
        gpu=$(sed -n 's/^gpu: *//p' "$d/dispatch/table.txt" 2>/dev/null | head -1)
        if [ -s "$d/dispatch/table.txt" ] && [[ "$gpu" != *H200* ]]; then
            cp "$d/dispatch/table.txt" "$docs/dispatch-table.txt"
            echo "gpucomm-kernels/tables/h200-2.txt left as it is: the calibration ran on ${gpu:-an unnamed GPU}, not an H200"
        elif [ -s "$d/dispatch/table.txt" ]; then
            cp "$d/dispatch/table.txt" "$docs/dispatch-table.txt"
            {
                echo "# Crossovers of the dispatching all-reduce (gpucomm-kernels), calibrated on the GPU machine by"
                echo "# gpucomm/gpu/issue16.sh dispatch (gpucomm bench --impl dispatch --calibrate), $(date -u +%F)."
                cat "$d/dispatch/table.txt"
            } >gpucomm-kernels/tables/h200-2.txt
            echo "wrote gpucomm-kernels/tables/h200-2.txt from the calibration"
        fi
    fi
done
if [ "${#summaries[@]}" -gt 0 ]; then
    # mpirun first, then the spawner's part.
    mapfile -t ordered < <(for s in "${summaries[@]}"; do grep -q '^# mode: mpirun' "$s" && echo "$s"; done
                           for s in "${summaries[@]}"; do grep -q '^# mode: mpirun' "$s" || echo "$s"; done)
    cat "${ordered[@]}" >"$docs/summary.md"
    echo "wrote $docs/summary.md from ${ordered[*]}"
fi
echo "goal lines:"
grep -hE '^(- |# mode)' "$docs/summary.md" "$docs/dispatch.md" 2>/dev/null | sed 's/^/  /' || true
grep -hE '^nccl-tests. default mean|^Largest gains' "$docs/variants.md" 2>/dev/null | sed 's/^/  /' || true
