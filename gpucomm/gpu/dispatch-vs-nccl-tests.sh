#!/usr/bin/env bash
# Issue 16's dispatching all-reduce against nccl-tests, on the GPU machine: gpucomm-kernels'
# AllReduce (through `gpucomm bench --impl dispatch`) on ordinary ncclMemAlloc buffers (staged
# through its window) and on its symmetric buffers (no copies), against nccl-tests 2.19.6's
# all_reduce_perf default, -R 2 (NCCL's symmetric kernels), -R 2 -D 1 and -R 2 -D 2 (nccl-tests'
# LSA kernels) — never -D 3 / -D 4, which use NVLink multicast — from 8 B to 8 GiB (factor 2),
# eagerly and replayed from CUDA graphs, one process per GPU under mpirun, interleaved, REPEATS
# times (default 2).
#
#   bash bundle/dispatch-vs-nccl-tests.sh     # OUT, REPEATS, MAXBYTES (8G), CALIBRATE (1), SWEEP (1), LARGE (1)
#
# First the dispatcher calibrates on this machine (8 B – 1 GiB, eager and graph) and saves the
# crossover table to $OUT/dispatch/table.txt, which every dispatcher run then uses (CALIBRATE=0:
# the committed table). Graph runs come in two ranges: up to 64 MiB with -G 10, above with -G 1
# (few calls, so that the GiB sizes fit the job). Writes $OUT/dispatch/*.{log,json} and
# $OUT/dispatch.md (tools/dispatch-vs-nccl-tests.py): per size and mode the dispatcher's path and
# time, the best nccl-tests variant, the issue's goals, and (SWEEP=1) the LL and two-shot kernels'
# times for three launch shapes each.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench-lib.sh
source "$HERE/bench-lib.sh"
REPEATS=${REPEATS:-2}
MAXBYTES=${MAXBYTES:-8G}
CALIBRATE=${CALIBRATE:-1}
LOGS=$OUTDIR/dispatch
# Empty at each run: an earlier run's logs would join this run's table.
rm -rf "$LOGS"
mkdir -p "$LOGS"
fails=0
fail() { fails=$((fails + 1)); note "FAIL $*"; }

TABLE=()
if [ "$CALIBRATE" = 1 ]; then
    echo "-- calibrating the dispatcher"
    # Sizes 8 B, 8 KiB, 8 MiB for the run itself; the calibration covers 8 B – 1 GiB.
    mpi "$GPUCOMM" bench all_reduce -b 8 -e 1G -f 1024 -n 5 -w 1 -c 1 --impl dispatch --calibrate \
        --save-table "$LOGS/table.txt" >"$LOGS/calibrate.log" 2>&1 || fail "calibration (see dispatch/calibrate.log)"
    [ -s "$LOGS/table.txt" ] && TABLE=(--table "$LOGS/table.txt") && cat "$LOGS/table.txt"
fi

# The three ranges: name | sizes and iterations | graph replays
RANGES=("eager|-b 8 -e $MAXBYTES -f 2 -n 20 -w 5|" "graph|-b 8 -e 64M -f 2 -n 20 -w 5|-G 10")
# LARGE=0 (a rehearsal with MAXBYTES ≤ 64M): no graph range above 64 MiB.
[ "${LARGE:-1}" = 1 ] && RANGES+=("graph-large|-b 128M -e $MAXBYTES -f 2 -n 5 -w 2|-G 1")
C_VARIANTS=("default|" "R2|-R 2" "R2D1|-R 2 -D 1" "R2D2|-R 2 -D 2")
R_VARIANTS=("nccl|--buffers nccl" "window|--buffers window")
c_run() { # variant range rep
    local name=${1%%|*} flags=${1#*|} rname=${2%%|*} rest=${2#*|}
    local sizes=${rest%%|*} graph=${rest#*|}
    # shellcheck disable=SC2086 # word lists
    mpi "$NT/all_reduce_perf" $sizes $graph -c 0 -g 1 $flags >"$LOGS/c.$name.$rname.$3.log" 2>&1 \
        || fail "nccl-tests $name $rname #$3"
}
r_run() { # variant range rep
    local name=${1%%|*} flags=${1#*|} rname=${2%%|*} rest=${2#*|}
    local sizes=${rest%%|*} graph=${rest#*|} out=$LOGS/r.$name.$rname.$3.json
    # shellcheck disable=SC2086 # word lists
    mpi "$GPUCOMM" bench all_reduce $sizes $graph -c 0 --impl dispatch $flags "${TABLE[@]}" --json >"$out" 2>"$out.err" \
        || fail "gpucomm dispatch $name $rname #$3 (see ${out#"$OUTDIR"/}.err)"
}
for ((rep = 1; rep <= REPEATS; rep++)); do
    for range in "${RANGES[@]}"; do
        for v in "${C_VARIANTS[@]}"; do
            echo "-- rep $rep/$REPEATS ${range%%|*} nccl-tests ${v%%|*}"
            if ((rep % 2)); then c_run "$v" "$range" "$rep"; fi
        done
        for v in "${R_VARIANTS[@]}"; do
            echo "-- rep $rep/$REPEATS ${range%%|*} dispatch ${v%%|*}"
            r_run "$v" "$range" "$rep"
        done
        for v in "${C_VARIANTS[@]}"; do
            if ((rep % 2 == 0)); then c_run "$v" "$range" "$rep"; fi
        done
    done
done
# Launch shapes (bytes per CTA) of the LL kernel at 8 B – 64 KiB and of the two-shot at 512 KiB –
# 8 MiB, from graphs and eagerly, once: the data for the kernels' defaults (2K and 64K).
SWEEP=${SWEEP:-1}
if [ "$SWEEP" = 1 ]; then
    for cta in 1K 2K 4K; do
        for g in "eager|" "graph|-G 10"; do
            # shellcheck disable=SC2086 # word list
            mpi "$GPUCOMM" bench all_reduce -b 8 -e 64K -f 2 -n 20 -w 5 -c 0 --impl ll --buffers window \
                --cta-bytes "$cta,8K,64K" ${g#*|} --json >"$LOGS/s.ll.$cta.${g%%|*}.json" 2>"$LOGS/s.ll.$cta.${g%%|*}.err" || fail "sweep ll $cta ${g%%|*}"
        done
    done
    for cta in 32K 64K 128K; do
        for g in "eager|" "graph|-G 10"; do
            # shellcheck disable=SC2086 # word list
            mpi "$GPUCOMM" bench all_reduce -b 512K -e 8M -f 2 -n 20 -w 5 -c 0 --impl two-shot --buffers window \
                --cta-bytes "2K,8K,$cta" ${g#*|} --json >"$LOGS/s.two-shot.$cta.${g%%|*}.json" 2>"$LOGS/s.two-shot.$cta.${g%%|*}.err" || fail "sweep two-shot $cta ${g%%|*}"
        done
    done
fi
# A correctness pass of the dispatcher on both kinds of buffers (validation on, up to 64 MiB).
for v in "${R_VARIANTS[@]}"; do
    # shellcheck disable=SC2086 # word list
    mpi "$GPUCOMM" bench all_reduce -b 8 -e 64M -f 4 -n 3 -w 1 -c 1 --impl dispatch ${v#*|} "${TABLE[@]}" \
        >"$LOGS/check.${v%%|*}.log" 2>&1 || fail "dispatch validation ${v%%|*} (see dispatch/check.${v%%|*}.log)"
    grep -h '^# Out of bounds' "$LOGS/check.${v%%|*}.log" | sed "s/^/    dispatch ${v%%|*}: /" | tee -a "$OUTDIR/summary.txt"
done
PY=$HERE/dispatch-vs-nccl-tests.py
[ -f "$PY" ] || PY=$HERE/../../tools/dispatch-vs-nccl-tests.py
if python3 "$PY" "$LOGS" >"$OUTDIR/dispatch.md" 2>"$OUTDIR/dispatch.md.err"; then
    cat "$OUTDIR/dispatch.md"
else
    fail "dispatch table: $(cat "$OUTDIR/dispatch.md.err")"
fi
note "dispatch vs nccl-tests: $fails failure(s)"
[ "$fails" -eq 0 ]
