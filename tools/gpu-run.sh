#!/usr/bin/env bash
# The GPU bundle's runner (copied to bundle/run.sh by tools/bundle.sh). Runs on the GPU machine,
# which has no Rust toolchain: every GPU test binary, then the tutorial examples under each
# launcher (spawner, torchrun-style variables set by hand, mpirun), then the multi-node path
# simulated on one host (NCCL's socket transport). Logs go to bundle/logs; when $OUT is set (the
# device tool), they are also packed into $OUT/logs.tar.gz next to $OUT/summary.txt. The last line
# is `N passed, N failed, N skipped`.
#
# NCCL and NVSHMEM are found at run time through python3's NVIDIA wheels (see nccl-sys docs), so
# nothing needs to be configured on the machine. Multicast must stay off: exported here, and
# passed on to every child, mpirun ranks included.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
SAFETY_VARS=(NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST)
HERE=$(cd "$(dirname "$0")" && pwd)
LOGS=$HERE/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
export GPUCOMM_SKIP_LOG=$LOGS/skipped.txt
: >"$GPUCOMM_SKIP_LOG"
export RUST_BACKTRACE=1
passed=0 failed=0 skipped=0

note() { printf '%s\n' "$*" | tee -a "$LOGS/summary.txt"; }

{
    echo "== machine"
    nvidia-smi -L 2>&1
    python3 - <<'PY' 2>&1
import nvidia, os
for p in nvidia.__path__:
    for sub in ("nccl/lib", "nvshmem/lib"):
        d = os.path.join(p, sub)
        if os.path.isdir(d):
            print(d, sorted(os.listdir(d))[:3])
PY
    echo "safety: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST"
} | tee "$LOGS/machine.txt"

# 1. Test binaries, one test at a time (they share the GPUs). A test that cannot run here writes
#    its name to $GPUCOMM_SKIP_LOG; it is counted as skipped, not passed.
for t in "$HERE"/tests/*; do
    name=$(basename "$t")
    log="$LOGS/$name.log"
    timeout 600 "$t" --include-ignored --test-threads=1 >"$log" 2>&1
    rc=$?
    line=$(grep -E '^test result:' "$log" | tail -1)
    p=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$line")
    f=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$line")
    if [ -z "$line" ]; then
        note "FAIL $name (exit $rc, no test summary; see $name.log)"
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

# 2. Examples under every launcher. Each check is one pass or failure; every process runs under
#    `timeout` so that a hang fails the check instead of the whole run.
T="timeout 300"
check() {
    local name=$1 rc
    shift
    "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        note "ok $name"
    else
        failed=$((failed + 1))
        note "FAIL $name (exit $rc; see $name.log)"
        tail -5 "$LOGS/$name.log" | sed 's/^/    /'
    fi
}

# Two processes with torchrun-style variables set by hand, as a user would in two shells.
by_hand() {
    local port=$((20000 + RANDOM % 9000)) pids=() rc=0
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port $T "$@" \
            > >(sed "s/^/[rank $r] /") 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

with_mpirun() {
    command -v mpirun >/dev/null || { echo "mpirun not installed"; return 3; }
    local xs=()
    for v in "${SAFETY_VARS[@]}" PATH LD_LIBRARY_PATH RUST_BACKTRACE; do xs+=(-x "$v"); done
    $T mpirun -np 2 --allow-run-as-root --bind-to none --tag-output "${xs[@]}" "$@"
}

# Multi-node path on one host: no NVLink P2P, no shared memory, so NCCL must use its network
# (socket) transport between the two processes, as it would between nodes.
net_path() {
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET $T "$@" \
        | tee "$LOGS/ex02-net-socket.out"
    [ "${PIPESTATUS[0]}" -eq 0 ] && grep -qE 'via NET/Socket' "$LOGS/ex02-net-socket.out"
}

EX=$HERE/examples
check ex01-hello $T "$EX/01-hello"
check ex02-spawner $T "$EX/02-all-reduce" --nproc 2
check ex02-by-hand by_hand "$EX/02-all-reduce"
check ex02-mpirun with_mpirun "$EX/02-all-reduce"
check ex03-spawner $T "$EX/03-nvshmem-put" --nproc 2
check ex03-by-hand by_hand "$EX/03-nvshmem-put"
check ex03-mpirun with_mpirun "$EX/03-nvshmem-put"
check ex02-net-socket net_path "$EX/02-all-reduce" --nproc 2
grep -hE 'via NET/Socket|NET/Socket : Using' "$LOGS/ex02-net-socket.log" | head -4 | sed 's/^/    /' | tee -a "$LOGS/summary.txt"

note "$passed passed, $failed failed, $skipped skipped"
if [ -n "${OUT:-}" ]; then
    cp "$LOGS/summary.txt" "$OUT/summary.txt"
    tar czf "$OUT/logs.tar.gz" -C "$LOGS" .
fi
[ "$failed" -eq 0 ]
