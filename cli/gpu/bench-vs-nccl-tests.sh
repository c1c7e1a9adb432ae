#!/usr/bin/env bash
# gpucomm bench side by side with NVIDIA's nccl-tests 2.19.6, on the GPU machine.
#
#   bash cli/gpu/bench-vs-nccl-tests.sh            # from the bundle: bin/gpucomm next to it or above
#   GPUCOMM=/path/to/gpucomm REPEATS=3 FACTOR=4 bash bench-vs-nccl-tests.sh
#
# Builds nccl-tests (MPI=1 and MPI=0) from shared/ref against the same libnccl.so.2 that gpucomm loads (the
# python3 wheel's), then, REPEATS times and interleaved (C and Rust alternate which goes first), runs
# every collective both tools have, 8 B to 8 GiB, same -n/-w, in two modes:
#   mpirun  one process per GPU (mpirun -np NGPU, both tools)
#   g       one process driving every GPU (-g NGPU, both tools)
# Timing runs use -c 0 (validation does not change the timing; gpucomm validates on the host, which
# is slow at GiB sizes); a short -c 1 pass of both tools checks correctness (#wrong must be 0).
# Results go to $OUT (or ./bench-out): logs/, and per mode and collective a Markdown table (median
# and spread per size, busbw ratio Rust/C, time difference, the issue's goals) and an SVG plot from
# `gpucomm compare`; summary.md collects the tables. The last line is `N passed, N failed`.
set -uo pipefail
# NVLink multicast must never be requested: exported here and passed to every rank.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
SAFETY_VARS=(NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST)

HERE=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${OUT:-$PWD/bench-out}
REPEATS=${REPEATS:-3}
FACTOR=${FACTOR:-4}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MAXBYTES=${MAXBYTES:-8G}
read -r -a COLLS <<<"${COLLS:-all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv}"
# The one-process mode (-g NGPU) runs for these only (it takes as long again per collective).
G_COLLS=" ${G_COLLS:-all_reduce} "
BUILDER=
for c in "$HERE/gpu-nccl-tests.sh" "$HERE/../../tools/gpu-nccl-tests.sh"; do
    [ -z "$BUILDER" ] && [ -f "$c" ] && BUILDER=$c
done
GPUCOMM=${GPUCOMM:-}
for c in "$HERE/bin/gpucomm" "$HERE/../bin/gpucomm" "$HERE/../../bin/gpucomm" "$(command -v gpucomm 2>/dev/null)"; do
    [ -z "$GPUCOMM" ] && [ -n "$c" ] && [ -x "$c" ] && GPUCOMM=$c
done
[ -x "${GPUCOMM:-}" ] || { echo "gpucomm binary not found: set GPUCOMM=/path/to/gpucomm"; exit 2; }
[ -n "$BUILDER" ] || { echo "gpu-nccl-tests.sh (the nccl-tests builder) not found next to this script"; exit 2; }
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -ge 2 ] || { echo "needs 2 or more GPUs, found $NGPU"; exit 2; }

LOGS=$OUTDIR/logs
mkdir -p "$LOGS"/{mpirun,g} "$OUTDIR"/bench/{mpirun,g}
passed=0 failed=0
note() { printf '%s\n' "$*" | tee -a "$OUTDIR/summary.txt"; }

# One NCCL for both tools: the python3 wheel's (the system's older libnccl.so.2 is in the ldconfig
# cache); the builder links nccl-tests against it and names a folder to put first on the library path.
SP=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')
WHEEL=$SP/nvidia/nccl/lib
export NCCL_LIB_DIR=$WHEEL
[ -d "$SP/nvidia/nvshmem/lib" ] && export NVSHMEM_LIB_DIR=$SP/nvidia/nvshmem/lib

{
    echo "== $(date -u +%FT%TZ) gpucomm vs nccl-tests: $NGPU GPUs, repeats $REPEATS, -b 8 -e $MAXBYTES -f $FACTOR -n $ITERS -w $WARMUP"
    nvidia-smi -L
    echo "gpucomm: $GPUCOMM ($("$GPUCOMM" --version))"
    echo "NCCL for both: $WHEEL"
    echo "safety: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST"
} | tee "$OUTDIR/summary.txt"

# Build nccl-tests twice in parallel (about 40 s): MPI=1 for the mpirun runs, MPI=0 for -g (as
# gpu-machine.md §3's baseline was built).
MPI=1 bash "$BUILDER" >"$LOGS/nccl-tests-build-mpi1.log" 2>&1 & b1=$!
MPI=0 bash "$BUILDER" >"$LOGS/nccl-tests-build-mpi0.log" 2>&1 & b0=$!
ok=1
wait $b1 || ok=0
wait $b0 || ok=0
if [ "$ok" -ne 1 ]; then
    note "FAIL building nccl-tests (see logs/nccl-tests-build-mpi*.log)"
    tail -20 "$LOGS"/nccl-tests-build-mpi*.log
    note "0 passed, 1 failed"
    exit 1
fi
read -r NT LIB < <(tail -1 "$LOGS/nccl-tests-build-mpi1.log")
read -r NT0 _ < <(tail -1 "$LOGS/nccl-tests-build-mpi0.log")
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

XS=()
for v in "${SAFETY_VARS[@]}" PATH LD_LIBRARY_PATH NCCL_LIB_DIR NVSHMEM_LIB_DIR; do XS+=(-x "$v"); done
mpi() { timeout 900 mpirun -np "$NGPU" --allow-run-as-root --bind-to none "${XS[@]}" "$@"; }
SIZES=(-b 8 -e "$MAXBYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")

# One run of one tool; records pass/fail. $1 label, $2 output file (appended for C, written for Rust), rest: command.
run() {
    local label=$1 out=$2 rc
    shift 2
    "$@" >>"$out" 2>>"$out.err"
    rc=$?
    if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); note "FAIL $label (exit $rc; see ${out#$OUTDIR/}.err)"; fi
}

c_run() { # mode coll rep
    local log=$LOGS/$1/$2.c.log
    if [ "$1" = mpirun ]; then run "nccl-tests $1 $2 #$3" "$log" mpi "$NT/$2_perf" "${SIZES[@]}" -c 0 -g 1
    else run "nccl-tests $1 $2 #$3" "$log" timeout 900 "$NT0/$2_perf" "${SIZES[@]}" -c 0 -g "$NGPU"; fi
}
rust_run() { # mode coll rep
    local json=$LOGS/$1/$2.rust.$3.json
    : >"$json"
    if [ "$1" = mpirun ]; then run "gpucomm $1 $2 #$3" "$json" mpi "$GPUCOMM" bench "$2" "${SIZES[@]}" -c 0 --json
    else run "gpucomm $1 $2 #$3" "$json" timeout 900 "$GPUCOMM" bench "$2" "${SIZES[@]}" -c 0 -g "$NGPU" --json; fi
}

for ((rep = 1; rep <= REPEATS; rep++)); do
    for coll in "${COLLS[@]}"; do
        for mode in mpirun g; do
            [ "$mode" = g ] && [[ "$G_COLLS" != *" $coll "* ]] && continue
            echo "-- rep $rep/$REPEATS $mode $coll"
            if ((rep % 2)); then c_run "$mode" "$coll" "$rep"; rust_run "$mode" "$coll" "$rep"
            else rust_run "$mode" "$coll" "$rep"; c_run "$mode" "$coll" "$rep"; fi
        done
    done
done

# Correctness: both tools with validation on, up to 64 MiB, one process per GPU.
for coll in "${COLLS[@]}"; do
    run "nccl-tests -c 1 $coll" "$LOGS/check.$coll.c.log" mpi "$NT/${coll}_perf" -b 8 -e 64M -f 8 -n 5 -w 1 -c 1 -g 1
    run "gpucomm -c 1 $coll" "$LOGS/check.$coll.rust.log" mpi "$GPUCOMM" bench "$coll" -b 8 -e 64M -f 8 -n 5 -w 1 -c 1
    grep -hE '^# Out of bounds values' "$LOGS/check.$coll.c.log" "$LOGS/check.$coll.rust.log" | sed "s/^/    $coll: /" | tee -a "$OUTDIR/summary.txt"
done

# Side-by-side tables and plots.
: >"$OUTDIR/summary.md"
for mode in mpirun g; do
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
