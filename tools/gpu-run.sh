#!/usr/bin/env bash
# The GPU bundle's runner (copied to bundle/run.sh by tools/bundle.sh). Runs on the GPU machine,
# which has no Rust toolchain: every test binary in bundle/tests, then every lesson in
# bundle/examples the way bundle/examples.tsv says (spawner, torchrun-style variables set by hand,
# mpirun, the socket transport, real torchrun with each rendezvous backend and as two agents, a
# Python peer, two ranks with their own NCCL_HOSTID for the candle lessons), and every measuring
# program in bundle/benches the same way (a quick pass: the committed figures come from
# gpu-host-cost.sh and gpu-custom-bench.sh), then the gpucomm tool's bench (a quick, checked pass
# in each way of starting its ranks). Logs go to bundle/logs; when $OUT is set (the device
# tool), the summary and a tarball of the logs are copied there. The last line is
# `N passed, N failed, N skipped` (and `, N not run (RUN_BUDGET)` when the budget cut items).
#
# A lesson or mode that needs more GPUs than the machine has is skipped and counted as skipped, with
# the reason (gpus_needed in lib.sh): a lesson's minimum comes from bundle/lessons.tsv
# (`[package.metadata.bundle.min-gpus]`); net-socket and the torchrun modes with one agent need 2
# (one rank per GPU); `torchrun-2nodes`, `split-hosts` and the Python modes need 1 (both ranks share
# GPU 0, each with its own NCCL_HOSTID, so NCCL connects them as two hosts); `mode@N` in
# examples.tsv asks for more. TORCHRUN names torchrun (default: the one on PATH, else
# /opt/torch/.venv/bin/torchrun).
#
#   bash bundle/run.sh [FILTER...]   # FILTERs: only test binaries / lessons whose name contains one
#   bash bundle/run.sh --sanitize [FILTER...]   # the compute-sanitizer mode: bundle/sanitize.sh
#                                               # (also with GPUCOMM_SANITIZE=1)
#   bash bundle/run.sh --torchrun-suites [FILTER...]   # only the test binaries, their multi-process
#                                               # tests started by real torchrun (one agent, or one
#                                               # agent per rank posing as nodes; logs in logs-torchrun)
#
# TEST_TIMEOUT (default 300) and LESSON_TIMEOUT (default 300) bound each test binary and each lesson
# process, in seconds. RUN_BUDGET (seconds, default none) bounds the whole run from within: each
# item's bound is cut to what is left, and once less than 30 s is left the remaining items are not
# started (counted as "not run", named in the summary) — use it instead of an outer `timeout`, which
# would stop this script but leave its running test and that test's ranks on the GPUs. With $OUT
# set, the summary there is kept current after every line and the log of every failure is copied
# to $OUT/failed/ at once, so a run cut short still reports what finished and why it failed.
#
# NCCL and NVSHMEM: the wheels of the machine's python3 are named explicitly (NCCL_LIB_DIR,
# NVSHMEM_LIB_DIR; bundle/lib.sh), because the dynamic loader would find the system's older
# libnccl.so.2 first; the CUDA 13 wheels' libraries go at the end of LD_LIBRARY_PATH (lib.sh: the
# candle lessons link cuBLAS, cuRAND and the CUDA runtime). Multicast must stay off: exported here,
# and passed on to every child, mpirun ranks included.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
SAFETY_VARS=(NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST)
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --sanitize ] || [ -n "${GPUCOMM_SANITIZE:-}" ]; then
    [ "${1:-}" = --sanitize ] && shift
    exec bash "$HERE/sanitize.sh" "$@"
fi
# shellcheck source=gpu-lib.sh
source "$HERE/lib.sh"
TORCHRUN=${TORCHRUN:-$(command -v torchrun || echo /opt/torch/.venv/bin/torchrun)}
LOGS=$HERE/logs
SUITES_ONLY= TAG=
if [ "${1:-}" = --torchrun-suites ]; then
    shift
    [ -x "$TORCHRUN" ] || { echo "--torchrun-suites: torchrun not found (set TORCHRUN)"; exit 1; }
    # gpucomm_tests::multi_process and multi_node_on_one_gpu start their ranks with it.
    export GPUCOMM_TEST_TORCHRUN=$TORCHRUN
    LOGS=$HERE/logs-torchrun SUITES_ONLY=1 TAG=-torchrun
fi
FILTERS=("$@")
# True when `$1` is wanted: no FILTER given, or its name contains one of them.
wanted() {
    [ ${#FILTERS[@]} -eq 0 ] && return 0
    local f
    for f in "${FILTERS[@]}"; do
        [[ "$1" == *"$f"* ]] && return 0
    done
    return 1
}
rm -rf "$LOGS"
mkdir -p "$LOGS"
# $OUT may name a folder that does not exist yet (a caller's subfolder): make it.
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; fi
export GPUCOMM_SKIP_LOG=$LOGS/skipped.txt
: >"$GPUCOMM_SKIP_LOG"
export RUST_BACKTRACE=1
passed=0 failed=0 skipped=0 not_run=0

note() {
    printf '%s\n' "$*" | tee -a "$LOGS/summary.txt"
    if [ -n "${OUT:-}" ]; then cp "$LOGS/summary.txt" "$OUT/summary$TAG.txt"; fi
}

FAILED_DIR=failed$TAG

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
    [ -e "$t" ] || continue
    name=$(basename "$t")
    wanted "$name" || continue
    log="$LOGS/$name.log"
    bound "${TEST_TIMEOUT:-300}" "$name" || continue
    timeout -k 10 "$LIMIT" "$t" --include-ignored --test-threads=1 >"$log" 2>&1
    rc=$?
    line=$(grep -E '^test result:' "$log" | tail -1)
    p=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$line")
    f=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$line")
    if [ -z "$line" ]; then
        cut=
        { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && cut=", cut at $LIMIT s$([ "$LIMIT" -lt "${TEST_TIMEOUT:-300}" ] && echo ' by RUN_BUDGET')"
        note "FAIL $name (exit $rc$cut, no test summary; see $name.log)"
        tail -5 "$log" | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
        keep_failed "$log"
        failed=$((failed + 1))
        continue
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { failed=$((failed + 1)); note "FAIL $name (exit $rc)"; }
    note "$( [ "$f" -eq 0 ] && [ "$rc" -eq 0 ] && echo ok || echo FAIL ) $name: $line"
    grep -E '^test .* FAILED$' "$log" | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
    { [ "$f" -ne 0 ] || [ "$rc" -ne 0 ]; } && keep_failed "$log"
done
skipped=$(grep -c . "$GPUCOMM_SKIP_LOG" || true)
passed=$((passed - skipped))
[ "$skipped" -gt 0 ] && sed 's/^/    skipped: /' "$GPUCOMM_SKIP_LOG" | tee -a "$LOGS/summary.txt"

# 2. Lessons and benches, each in the modes bundle/examples.tsv lists. Each run is one pass or failure; every
#    process runs under `timeout` ($T, set by `check` from LESSON_TIMEOUT and RUN_BUDGET) so that a
#    hang fails the check instead of the whole run.
T="timeout -k 10 ${LESSON_TIMEOUT:-300}"
check() {
    local name=$1 rc
    shift
    bound "${LESSON_TIMEOUT:-300}" "$name" || return 0
    # The bound of every process a mode function starts ($T), and of a program run directly.
    T="timeout -k 10 $LIMIT"
    [ "$(type -t "$1")" = function ] || set -- $T "$@"
    "$@" </dev/null >"$LOGS/$name.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        note "ok $name"
    elif [ "$rc" -eq "$SKIP" ]; then
        skipped=$((skipped + 1))
        note "skip $name: $(grep -h '^skipped: ' "$LOGS/$name.log" | tail -1 | sed 's/^skipped: //')"
    else
        failed=$((failed + 1))
        note "FAIL $name (exit $rc; see $name.log)"
        tail -5 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
        keep_failed "$LOGS/$name.log"
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

# Exit status of a mode that cannot run here; its last output line says why.
SKIP=77

have_torchrun() {
    [ -x "$TORCHRUN" ] || { echo "skipped: torchrun not found (set TORCHRUN)"; return 1; }
}

# torchrun with one agent and one rank per GPU: the default (static) rendezvous, `c10d`, or
# `--standalone`. Every rank is a client of the agent's TCPStore (TORCHELASTIC_USE_AGENT_STORE).
with_torchrun() {
    local backend=$1 port=$((20000 + RANDOM % 9000))
    shift
    have_torchrun || return $SKIP
    local rdzv=()
    case "$backend" in
        static) rdzv=(--master-addr 127.0.0.1 --master-port "$port") ;;
        c10d) rdzv=(--rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port") ;;
        standalone) rdzv=(--standalone) ;;
    esac
    $T "$TORCHRUN" "${rdzv[@]}" --nproc-per-node "$NGPU" --no-python "$@"
}

# Two torchrun agents on this machine posing as two nodes, one rank each; NCCL_HOSTID differs, so
# NCCL sees two hosts. With one GPU both ranks use GPU 0; with two, each agent gets its own as its
# device 0 (its local rank's), the other GPUs listed after it rather than hidden: NVSHMEM reaches
# a peer's memory only through a GPU it can see.
torchrun_2nodes() {
    local port=$((20000 + RANDOM % 9000)) pids=() rc=0 n
    have_torchrun || return $SKIP
    for n in 0 1; do
        NCCL_HOSTID=node$n CUDA_VISIBLE_DEVICES=$(own_gpu_first $((n % NGPU))) NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
            $T "$TORCHRUN" --nnodes 2 --node-rank $n --master-addr 127.0.0.1 --master-port "$port" \
            --nproc-per-node 1 --no-python "$@" > >(sed "s/^/[node $n] /") 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

# CUDA_VISIBLE_DEVICES with GPU $1 first, then every other GPU of the machine.
own_gpu_first() {
    local list=$1 g
    for ((g = 0; g < NGPU; g++)); do [ "$g" -ne "$1" ] && list+=",$g"; done
    echo "$list"
}

# Lesson 16: the Rust binary and examples/python/weight_sync_trainer.py in one communicator.
# python-peer: the Rust side hosts the store; python-host: the trainer does. CuPy gets the
# wheel's libnccl.so.2 preloaded (the same NCCL as the Rust side).
python_pair() {
    local who=$1 bin=$2 port=$((20000 + RANDOM % 9000)) trainer=$HERE/python/weight_sync_trainer.py rc=0
    [ -f "$trainer" ] || { echo "skipped: $trainer not in the bundle"; return $SKIP; }
    python3 -c 'import cupy, cupy.cuda.nccl, torch.distributed' 2>/dev/null \
        || { echo "skipped: python3 lacks cupy (with NCCL) or torch"; return $SKIP; }
    local gpu=$((1 % NGPU))
    local rust=(env MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" NCCL_HOSTID=server $T "$bin" --device 0)
    local py=(env MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" NCCL_HOSTID=trainer LD_PRELOAD="$NCCL_LIB_DIR/libnccl.so.2"
        $T python3 "$trainer" --device "$gpu")
    if [ "$who" = rust ]; then
        "${rust[@]}" > >(sed "s/^/[rust] /") 2>&1 &
        local first=$!
        "${py[@]}" > >(sed "s/^/[python] /") 2>&1 || rc=1
    else
        "${py[@]}" --host-store > >(sed "s/^/[python] /") 2>&1 &
        local first=$!
        "${rust[@]}" --join-store > >(sed "s/^/[rust] /") 2>&1 || rc=1
    fi
    wait "$first" || rc=1
    return $rc
}

# Multi-node path on one host: no NVLink P2P, no shared memory, so NCCL must use its network
# (socket) transport between the processes, as it would between nodes; the log must say so.
net_socket() {
    local log=$LOGS/net-socket-$(basename "$1").out
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
        $T "$@" --nproc "$NGPU" | tee "$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] && grep -qE 'via NET/Socket' "$log"
}

if [ -f "$HERE/examples.tsv" ] && [ -z "$SUITES_ONLY" ]; then
    while IFS=$'\t' read -r -a row; do
        ex=${row[0]} mode=${row[1]%@*} args=("${row[@]:2}")
        wanted "$ex" || continue
        need=$(gpus_needed "$ex" "${row[1]}")
        if [ "$need" -gt "$NGPU" ]; then
            skipped=$((skipped + 1))
            note "skip $ex-$mode: needs $need GPUs, this machine has $NGPU"
            continue
        fi
        bin=$(program "$ex")
        case "$mode" in
            single) check "$ex-single" "$bin" "${args[@]}" ;;
            spawner) check "$ex-spawner" "$bin" --nproc "$NGPU" "${args[@]}" ;;
            # Two ranks whatever the number of GPUs: each sets its own NCCL_HOSTID (sockets).
            split-hosts) check "$ex-split-hosts" "$bin" --nproc 2 --split-hosts "${args[@]}" ;;
            by-hand) check "$ex-by-hand" by_hand "$bin" "${args[@]}" ;;
            mpirun) check "$ex-mpirun" with_mpirun "$bin" "${args[@]}" ;;
            net-socket)
                check "$ex-net-socket" net_socket "$bin" "${args[@]}"
                [ -f "$LOGS/$ex-net-socket.log" ] && grep -hE 'via NET/Socket|NET/Socket : Using' "$LOGS/$ex-net-socket.log" | head -4 | sed 's/^/    /' \
                    | tee -a "$LOGS/summary.txt"
                ;;
            torchrun) check "$ex-torchrun" with_torchrun static "$bin" "${args[@]}" ;;
            torchrun-c10d) check "$ex-torchrun-c10d" with_torchrun c10d "$bin" "${args[@]}" ;;
            torchrun-standalone) check "$ex-torchrun-standalone" with_torchrun standalone "$bin" "${args[@]}" ;;
            torchrun-2nodes)
                check "$ex-torchrun-2nodes" torchrun_2nodes "$bin" "${args[@]}"
                [ -f "$LOGS/$ex-torchrun-2nodes.log" ] && grep -hE 'via NET/|nNodes' "$LOGS/$ex-torchrun-2nodes.log" | head -4 | sed 's/^/    /' \
                    | tee -a "$LOGS/summary.txt"
                ;;
            python-peer) check "$ex-python-peer" python_pair rust "$bin" "${args[@]}" ;;
            python-host) check "$ex-python-host" python_pair python "$bin" "${args[@]}" ;;
            *) note "FAIL $ex: unknown mode $mode in examples.tsv"; failed=$((failed + 1)) ;;
        esac
    done <"$HERE/examples.tsv"
fi

# 3. The gpucomm tool's bench, a quick pass with every result checked (-c 1: wrong elements make it
#    exit non-zero) in each way of starting its ranks: its spawner, mpirun, one process driving
#    every GPU (-g), and the dispatching all-reduce. The committed figures come from the scripts
#    of gpucomm/gpu (issue16.sh); this pass makes sure those scripts do not trip over the tool.
GPUCOMM_BIN=$HERE/bin/gpucomm
QUICK=(-b 8 -e 1M -f 16 -n 5 -w 2 -c 1)
if [ -x "$GPUCOMM_BIN" ] && [ -z "$SUITES_ONLY" ] && wanted gpucomm-bench; then
    check gpucomm-bench-spawner "$GPUCOMM_BIN" bench all_reduce "${QUICK[@]}" --nproc "$NGPU"
    check gpucomm-bench-alltoall-spawner "$GPUCOMM_BIN" bench alltoall "${QUICK[@]}" --nproc "$NGPU"
    check gpucomm-bench-gather-spawner "$GPUCOMM_BIN" bench gather "${QUICK[@]}" -r $((NGPU - 1)) --nproc "$NGPU"
    check gpucomm-bench-scatter-spawner "$GPUCOMM_BIN" bench scatter "${QUICK[@]}" -r $((NGPU - 1)) --nproc "$NGPU"
    check gpucomm-bench-mpirun with_mpirun "$GPUCOMM_BIN" bench all_reduce "${QUICK[@]}"
    check gpucomm-bench-group "$GPUCOMM_BIN" bench all_reduce "${QUICK[@]}" -g "$NGPU"
    check gpucomm-bench-dispatch "$GPUCOMM_BIN" bench all_reduce "${QUICK[@]}" --nproc "$NGPU" --impl dispatch
fi

note "$passed passed, $failed failed, $skipped skipped$([ "$not_run" -gt 0 ] && echo ", $not_run not run (RUN_BUDGET)")"
if [ -n "${OUT:-}" ]; then
    cp "$LOGS/summary.txt" "$OUT/summary$TAG.txt"
    tar czf "$OUT/logs$TAG.tar.gz" -C "$LOGS" .
fi
[ "$failed" -eq 0 ]
