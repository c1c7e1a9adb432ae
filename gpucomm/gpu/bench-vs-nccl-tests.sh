#!/usr/bin/env bash
# gpucomm bench side by side with NVIDIA's nccl-tests 2.19.6, on the GPU machine.
#
#   bash gpucomm/gpu/bench-vs-nccl-tests.sh            # from the bundle: bin/gpucomm next to it or above
#   GPUCOMM=/path/to/gpucomm REPEATS=3 FACTOR=4 MODES="mpirun spawn" bash bench-vs-nccl-tests.sh
#
# Builds nccl-tests (MPI=1, and MPI=0 for the g mode) from shared/ref against the same
# libnccl.so.2 that gpucomm loads (the python3 wheel's), then, REPEATS times and interleaved (C and
# Rust alternate which goes first), runs every collective both tools have, 8 B to 8 GiB, same
# -n/-w, in the MODES asked for (default all three):
#   mpirun  one process per GPU, both tools under mpirun -np NGPU
#   spawn   one process per GPU, gpucomm through its own spawner (--nproc NGPU), nccl-tests under
#           mpirun (it has no other multi-process launcher)
#   g       one process driving every GPU (-g NGPU, both tools; G_COLLS only)
# Timing runs use -c 0 (validation does not change the timing; gpucomm validates on the host, which
# is slow at GiB sizes); with CHECK=1 (default) a short -c 1 pass of both tools checks correctness
# (#wrong must be 0). Results go to $OUT (or ./bench-out): logs/, and per mode and collective a
# Markdown table (median and spread per size, busbw ratio Rust/C, time difference, the issue's
# goals) and an SVG plot from `gpucomm compare`; summary.md collects the tables. The last line is
# `N passed, N failed`.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
read -r -a MODE_LIST <<<"${MODES:-mpirun spawn g}"
[[ " ${MODE_LIST[*]} " == *" g "* ]] && NT_MPI0=1
# shellcheck source=bench-lib.sh
source "$HERE/bench-lib.sh"
REPEATS=${REPEATS:-3}
FACTOR=${FACTOR:-4}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MAXBYTES=${MAXBYTES:-8G}
CHECK=${CHECK:-1}
read -r -a COLLS <<<"${COLLS:-all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter}"
# The one-process mode (-g NGPU) runs for these only (it takes as long again per collective).
G_COLLS=" ${G_COLLS:-all_reduce} "
note "bench-vs-nccl-tests: modes ${MODE_LIST[*]}, repeats $REPEATS, -b 8 -e $MAXBYTES -f $FACTOR -n $ITERS -w $WARMUP"

LOGS=$OUTDIR/logs
mkdir -p "$LOGS" "$OUTDIR"/bench
# Each run starts its folders empty: the C logs are appended to, and an earlier run's repeats
# (other sizes, more repeats) would join this run's medians.
for mode in "${MODE_LIST[@]}"; do
    rm -rf "${LOGS:?}/$mode" "$OUTDIR/bench/$mode"
    mkdir -p "$LOGS/$mode" "$OUTDIR/bench/$mode"
done
passed=0 failed=0
SIZES=(-b 8 -e "$MAXBYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")

# One run of one tool; records pass/fail. $1 label, $2 output file (appended for C, written for Rust), rest: command.
run() {
    local label=$1 out=$2 rc
    shift 2
    "$@" >>"$out" 2>>"$out.err"
    rc=$?
    if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); note "FAIL $label (exit $rc; see ${out#"$OUTDIR"/}.err)"; fi
}

c_run() { # mode coll rep
    local log=$LOGS/$1/$2.c.log
    case "$1" in
        mpirun | spawn) run "nccl-tests $1 $2 #$3" "$log" mpi "$NT/$2_perf" "${SIZES[@]}" -c 0 -g 1 ;;
        g) run "nccl-tests $1 $2 #$3" "$log" timeout "$RUN_TIMEOUT" "$NT0/$2_perf" "${SIZES[@]}" -c 0 -g "$NGPU" ;;
    esac
}
rust_run() { # mode coll rep
    local json=$LOGS/$1/$2.rust.$3.json
    : >"$json"
    case "$1" in
        mpirun) run "gpucomm $1 $2 #$3" "$json" mpi "$GPUCOMM" bench "$2" "${SIZES[@]}" -c 0 --json ;;
        spawn) run "gpucomm $1 $2 #$3" "$json" timeout "$RUN_TIMEOUT" "$GPUCOMM" bench "$2" "${SIZES[@]}" -c 0 --nproc "$NGPU" --json ;;
        g) run "gpucomm $1 $2 #$3" "$json" timeout "$RUN_TIMEOUT" "$GPUCOMM" bench "$2" "${SIZES[@]}" -c 0 -g "$NGPU" --json ;;
    esac
}

for ((rep = 1; rep <= REPEATS; rep++)); do
    for coll in "${COLLS[@]}"; do
        for mode in "${MODE_LIST[@]}"; do
            [ "$mode" = g ] && [[ "$G_COLLS" != *" $coll "* ]] && continue
            echo "-- rep $rep/$REPEATS $mode $coll"
            if ((rep % 2)); then c_run "$mode" "$coll" "$rep"; rust_run "$mode" "$coll" "$rep"
            else rust_run "$mode" "$coll" "$rep"; c_run "$mode" "$coll" "$rep"; fi
        done
    done
done

# Correctness: both tools with validation on, up to 64 MiB, one process per GPU.
if [ "$CHECK" = 1 ]; then
    for coll in "${COLLS[@]}"; do
        run "nccl-tests -c 1 $coll" "$LOGS/check.$coll.c.log" mpi "$NT/${coll}_perf" -b 8 -e 64M -f 8 -n 5 -w 1 -c 1 -g 1
        run "gpucomm -c 1 $coll" "$LOGS/check.$coll.rust.log" mpi "$GPUCOMM" bench "$coll" -b 8 -e 64M -f 8 -n 5 -w 1 -c 1
        grep -hE '^# Out of bounds values' "$LOGS/check.$coll.c.log" "$LOGS/check.$coll.rust.log" | sed "s/^/    $coll: /" | tee -a "$OUTDIR/summary.txt"
    done
fi

# Side-by-side tables and plots.
: >"$OUTDIR/summary.md"
for mode in "${MODE_LIST[@]}"; do
    for coll in "${COLLS[@]}"; do
        [ "$mode" = g ] && [[ "$G_COLLS" != *" $coll "* ]] && continue
        rust=("$LOGS/$mode/$coll".rust.*.json)
        md=$OUTDIR/bench/$mode/$coll.md
        if "$GPUCOMM" compare --rust "${rust[@]}" --nccl-tests "$LOGS/$mode/$coll.c.log" --plot "$OUTDIR/bench/$mode/$coll.svg" >"$md" 2>"$md.err"; then
            { echo "# mode: $mode"; cat "$md"; } >>"$OUTDIR/summary.md"
            grep -E '^- ' "$md" | sed "s/^/    $mode $coll: /" | tee -a "$OUTDIR/summary.txt"
        else
            failed=$((failed + 1)); note "FAIL compare $mode $coll: $(cat "$md.err")"
        fi
    done
done
note "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
