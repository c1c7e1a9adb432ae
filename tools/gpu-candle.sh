#!/usr/bin/env bash
# The candle lessons' runs for issue 15, on the GPU machine (copied into the bundle by
# tools/bundle.sh; run after or instead of run.sh):
#
#   bash bundle/gpu-candle.sh
#
# With one GPU: each lesson as one rank (--nproc 1) and as two ranks sharing the GPU (--nproc 2
# --split-hosts: each rank sets its own NCCL_HOSTID, NCCL connects them over sockets); the
# single-GPU reference runs of lessons 17 and 18 on their own (--reference --ranks 2); short runs of
# each lesson under compute-sanitizer's memcheck and synccheck. With two GPUs or more, also each
# lesson as two ranks on two GPUs (--nproc 2: lesson 19's LSA kernel needs NVLink peers). Then
# the loss plot (candle-loss-plot.py). Logs and the plot go to $OUT/candle (the device tool) or
# bundle/logs/candle; the summary's last line is `N passed, N failed`. CANDLE_TIMEOUT (default 300)
# bounds each run; RUN_BUDGET bounds the whole script from within, as in run.sh (use it rather
# than an outer `timeout`, which would leave a lesson's ranks on the GPUs).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
EX=$HERE/examples
LOGS=${OUT:-$HERE/logs}/candle
mkdir -p "$LOGS"
: >"$LOGS/summary.txt"
SANITIZER=${SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
# NGPU; NCCL from the wheel (not the system's older one); cuBLAS, cuRAND and the runtime from the
# CUDA 13 wheels, after the driver's own paths (CUDA_WHEEL_LIB on LD_LIBRARY_PATH).
# shellcheck source=gpu-lib.sh
source "$HERE/lib.sh"
passed=0 failed=0 not_run=0

note() { printf '%s\n' "$*" | tee -a "$LOGS/summary.txt"; }

# run NAME COMMAND...: one check, its output in NAME.log.
run() {
    local name=$1 rc
    shift
    bound "${CANDLE_TIMEOUT:-300}" "$name" || return 0
    timeout -k 10 "$LIMIT" "$@" </dev/null >"$LOGS/$name.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        note "ok $name ($*)"
    else
        failed=$((failed + 1))
        note "FAIL $name (exit $rc: $*)"
        tail -5 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
    fi
}

# A sanitizer run fails on any error it reports (--error-exitcode); its summary line is shown.
sanitize() {
    local tool=$1 lesson=$2
    shift 2
    run "sanitizer-$tool-$lesson" "$SANITIZER" --tool "$tool" --report-api-errors no --error-exitcode 1 \
        "$EX/$lesson" "$@"
    [ -f "$LOGS/sanitizer-$tool-$lesson.log" ] && grep -h 'ERROR SUMMARY' "$LOGS/sanitizer-$tool-$lesson.log" | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
}

{
    echo "GPUs: $NGPU; NCCL_LIB_DIR=$NCCL_LIB_DIR; CUDA libraries: ${CUDA_WHEEL_LIB:-none found}"
    echo "safety: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST"
} | tee "$LOGS/machine.txt"

for lesson in 17-candle-data-parallel 18-candle-sharded 19-candle-tensor-parallel; do
    n=${lesson%%-*}
    run "$n-1rank" "$EX/$lesson" --nproc 1
    run "$n-2ranks-1gpu" "$EX/$lesson" --nproc 2 --split-hosts
    [ "$NGPU" -ge 2 ] && run "$n-2gpus" "$EX/$lesson" --nproc 2
done
run 17-reference "$EX/17-candle-data-parallel" --reference --ranks 2
run 18-reference "$EX/18-candle-sharded" --reference --ranks 2

if [ -x "$SANITIZER" ]; then
    small=(--steps 4 --log-every 1 --overlap-steps 1 --batch 256 --no-reference)
    for tool in memcheck synccheck; do
        sanitize "$tool" 17-candle-data-parallel "${small[@]}"
        sanitize "$tool" 18-candle-sharded "${small[@]}"
        sanitize "$tool" 19-candle-tensor-parallel --steps 3 --blocks 2 --dim 512 --hidden 2048
    done
else
    note "no compute-sanitizer at $SANITIZER: sanitizer runs skipped"
fi

# The loss plot: the two-GPU runs when there are two GPUs, else the two ranks sharing one.
runs=()
for n in 17 18; do
    for setup in 2gpus 2ranks-1gpu; do
        if [ -f "$LOGS/$n-$setup.log" ] && grep -q 'losses agree' "$LOGS/$n-$setup.log"; then
            runs+=("lesson $n, 2 ranks ($setup)=$LOGS/$n-$setup.log")
            break
        fi
    done
done
if [ ${#runs[@]} -gt 0 ]; then
    python3 "$HERE/candle-loss-plot.py" "$LOGS/losses.svg" "${runs[@]}" | tee -a "$LOGS/summary.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { failed=$((failed + 1)); note "FAIL the loss plot (candle-loss-plot.py)"; }
fi
note "$passed passed, $failed failed$([ "$not_run" -gt 0 ] && echo ", $not_run not run (RUN_BUDGET)")"
[ "$failed" -eq 0 ]
