#!/usr/bin/env bash
# The GPU bundle's runner (copied to bundle/run.sh by tools/bundle.sh). Runs on the GPU machine,
# which has no Rust toolchain: every test binary in bundle/tests, then every lesson in
# bundle/examples the way bundle/examples.tsv says (spawner, torchrun-style variables set by hand,
# mpirun, the socket transport). Logs go to bundle/logs; when $OUT is set (the device tool), the
# summary and a tarball of the logs are copied there. The last line is
# `N passed, N failed, N skipped`.
#
#   bash bundle/run.sh [FILTER]   # FILTER: only tests binaries / lessons whose name contains it
#
# TEST_TIMEOUT (default 600) and LESSON_TIMEOUT (default 300) bound each test binary and each
# lesson process, in seconds. With $OUT set, the summary there is kept current after every line,
# so a run cut short still reports what finished.
#
# NCCL and NVSHMEM: the wheels of the machine's python3 are named explicitly (NCCL_LIB_DIR,
# NVSHMEM_LIB_DIR), because the dynamic loader would find the system's older libnccl.so.2 first.
# Multicast must stay off: exported here, and passed on to every child, mpirun ranks included.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
SAFETY_VARS=(NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST)
FILTER=${1:-}
HERE=$(cd "$(dirname "$0")" && pwd)
LOGS=$HERE/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
export GPUCOMM_SKIP_LOG=$LOGS/skipped.txt
: >"$GPUCOMM_SKIP_LOG"
export RUST_BACKTRACE=1
passed=0 failed=0 skipped=0
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -ge 1 ] || NGPU=1

note() {
    printf '%s\n' "$*" | tee -a "$LOGS/summary.txt"
    if [ -n "${OUT:-}" ]; then cp "$LOGS/summary.txt" "$OUT/summary.txt"; fi
}

wheel_dir() {
    python3 -c "import nvidia, os, sys
for p in nvidia.__path__:
    d = os.path.join(p, sys.argv[1], 'lib')
    if os.path.isdir(d): print(d); break" "$1" 2>/dev/null
}
[ -n "${NCCL_LIB_DIR:-}" ] || { NCCL_LIB_DIR=$(wheel_dir nccl) && export NCCL_LIB_DIR; }
[ -n "${NVSHMEM_LIB_DIR:-}" ] || { NVSHMEM_LIB_DIR=$(wheel_dir nvshmem) && export NVSHMEM_LIB_DIR; }
# The candle lessons link cuBLAS, cuRAND and the CUDA runtime (candle's `dynamic-linking`): the
# machine's CUDA 13 wheels have them (after the driver's own paths, which provide libcuda.so.1).
CUDA_WHEEL_LIB=$(wheel_dir cu13)
[ -n "$CUDA_WHEEL_LIB" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDA_WHEEL_LIB

{
    echo "== machine"
    nvidia-smi -L 2>&1
    echo "GPUs: $NGPU"
    echo "NCCL_LIB_DIR=$NCCL_LIB_DIR"
    echo "NVSHMEM_LIB_DIR=$NVSHMEM_LIB_DIR"
    echo "CUDA libraries of the candle lessons: ${CUDA_WHEEL_LIB:-(no cu13 wheel found)}"
    echo "safety: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST"
} | tee "$LOGS/machine.txt"

# 1. Test binaries, one test at a time (they share the GPUs). A test that cannot run here writes
#    its name to $GPUCOMM_SKIP_LOG; it is counted as skipped, not passed.
for t in "$HERE"/tests/*; do
    name=$(basename "$t")
    [[ "$name" == *"$FILTER"* ]] || continue
    log="$LOGS/$name.log"
    timeout "${TEST_TIMEOUT:-600}" "$t" --include-ignored --test-threads=1 >"$log" 2>&1
    rc=$?
    line=$(grep -E '^test result:' "$log" | tail -1)
    p=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$line")
    f=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$line")
    if [ -z "$line" ]; then
        note "FAIL $name (exit $rc, no test summary; see $name.log)"
        tail -5 "$log" | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
        failed=$((failed + 1))
        continue
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { failed=$((failed + 1)); note "FAIL $name (exit $rc)"; }
    note "$( [ "$f" -eq 0 ] && [ "$rc" -eq 0 ] && echo ok || echo FAIL ) $name: $line"
    grep -E '^test .* FAILED$' "$log" | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
done
skipped=$(grep -c . "$GPUCOMM_SKIP_LOG" || true)
passed=$((passed - skipped))
[ "$skipped" -gt 0 ] && sed 's/^/    skipped: /' "$GPUCOMM_SKIP_LOG" | tee -a "$LOGS/summary.txt"

# 2. Lessons, each in the modes bundle/examples.tsv lists. Each run is one pass or failure; every
#    process runs under `timeout` so that a hang fails the check instead of the whole run.
T="timeout ${LESSON_TIMEOUT:-300}"
check() {
    local name=$1 rc
    shift
    "$@" </dev/null >"$LOGS/$name.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        note "ok $name"
    else
        failed=$((failed + 1))
        note "FAIL $name (exit $rc; see $name.log)"
        tail -5 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
    fi
}

# One process per GPU with torchrun-style variables set by hand, as a user would in N shells.
by_hand() {
    local port=$((20000 + RANDOM % 9000)) pids=() rc=0 r
    for ((r = 0; r < NGPU; r++)); do
        RANK=$r WORLD_SIZE=$NGPU LOCAL_RANK=$r LOCAL_WORLD_SIZE=$NGPU MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            $T "$@" > >(sed "s/^/[rank $r] /") 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

with_mpirun() {
    command -v mpirun >/dev/null || { echo "mpirun not installed"; return 3; }
    local xs=() v
    for v in "${SAFETY_VARS[@]}" PATH LD_LIBRARY_PATH RUST_BACKTRACE NCCL_LIB_DIR NVSHMEM_LIB_DIR; do xs+=(-x "$v"); done
    $T mpirun -np "$NGPU" --allow-run-as-root --bind-to none --tag-output "${xs[@]}" "$@"
}

# Multi-node path on one host: no NVLink P2P, no shared memory, so NCCL must use its network
# (socket) transport between the processes, as it would between nodes; the log must say so.
net_socket() {
    local log=$LOGS/net-socket-$(basename "$1").out
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
        $T "$@" --nproc "$NGPU" | tee "$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] && grep -qE 'via NET/Socket' "$log"
}

if [ -f "$HERE/examples.tsv" ]; then
    while IFS=$'\t' read -r -a row; do
        ex=${row[0]} mode=${row[1]} args=("${row[@]:2}")
        [[ "$ex" == *"$FILTER"* ]] || continue
        bin=$HERE/examples/$ex
        case "$mode" in
            single) check "$ex-single" $T "$bin" "${args[@]}" ;;
            spawner) check "$ex-spawner" $T "$bin" --nproc "$NGPU" "${args[@]}" ;;
            # Two ranks whatever the number of GPUs: each sets its own NCCL_HOSTID (sockets).
            split-hosts) check "$ex-split-hosts" $T "$bin" --nproc 2 --split-hosts "${args[@]}" ;;
            by-hand) check "$ex-by-hand" by_hand "$bin" "${args[@]}" ;;
            mpirun) check "$ex-mpirun" with_mpirun "$bin" "${args[@]}" ;;
            net-socket)
                check "$ex-net-socket" net_socket "$bin" "${args[@]}"
                grep -hE 'via NET/Socket|NET/Socket : Using' "$LOGS/$ex-net-socket.log" | head -4 | sed 's/^/    /' \
                    | tee -a "$LOGS/summary.txt"
                ;;
            *) note "FAIL $ex: unknown mode $mode in examples.tsv"; failed=$((failed + 1)) ;;
        esac
    done <"$HERE/examples.tsv"
fi

note "$passed passed, $failed failed, $skipped skipped"
if [ -n "${OUT:-}" ]; then
    cp "$LOGS/summary.txt" "$OUT/summary.txt"
    tar czf "$OUT/logs.tar.gz" -C "$LOGS" .
fi
[ "$failed" -eq 0 ]
