#!/usr/bin/env bash
# The GPU bundle's compute-sanitizer mode (copied to bundle/sanitize.sh by tools/bundle.sh; also
# `bash bundle/run.sh --sanitize [FILTER...]`, or GPUCOMM_SANITIZE=1 bash bundle/run.sh). Every
# test binary in bundle/tests and every lesson and bench in bundle/examples and bundle/benches runs
# under compute-sanitizer's memcheck; the lessons that launch their own kernels run under synccheck
# too (the tools per lesson are in bundle/lessons.tsv, from `[package.metadata.bundle.sanitizers]`
# in examples/Cargo.toml and candle-lessons/Cargo.toml).
# One (binary, tool) pair is one run: it passes when the program succeeds and the sanitizer
# counted 0 errors in every process. Per run it prints the errors found; then a summary line
# `sanitizer: R runs, E errors (memcheck E1, synccheck E2)` and, last,
# `N passed, N failed, N skipped` (and `, N not run (RUN_BUDGET)` when the budget cut runs).
#
#   bash bundle/sanitize.sh [FILTER...]   # only binaries / lessons whose name contains a FILTER
#
# Each lesson runs once, in its spawner (or single-process) row of bundle/examples.tsv, with one
# rank per GPU: the other launch modes start the same code. A lesson that needs more GPUs than the
# machine has is skipped (counted, with the reason); tests that need more GPUs skip themselves
# (listed under their binary). A lesson with no single-process or spawner row (16, whose ranks
# are Python processes) is skipped and counted, saying so. A target with arguments in
# bundle/sanitize-args.tsv (`[package.metadata.bundle.sanitize-args]`: a few small steps of the
# candle lessons, fewer repetitions of a bench) gets those instead of its row's. SANITIZE_TIMEOUT
# (default 420) bounds each run, in seconds; a run cut short fails (nvshmem_soundness takes about
# 330 s under memcheck on one H200; on two GPUs split it with SANITIZE_TEST_ARGS). RUN_BUDGET bounds
# the whole mode from within, as in run.sh (runs cut to what is left, the rest named as not run):
# use it, not an outer `timeout`, which would leave the sanitizer and its ranks on the GPUs. Logs go
# to bundle/logs-sanitize; with $OUT set, the summary is kept current there
# (sanitize-summary.txt), each failed run's log is copied to $OUT/sanitize-failed/ at once, and the
# logs end up in $OUT/sanitize-logs.tar.gz. Slow: 30-60 s per lesson with one rank; run it in parts
# with FILTERs when a command's time is bounded.
# SANITIZE_TEST_ARGS (split on spaces) is passed to every test binary after its own arguments:
# test-name filters and `--skip NAME`, to run one long binary (nvshmem_soundness: about 50 s per
# test under memcheck) in parts.
#
# compute-sanitizer's options, and why:
# * --target-processes all: the spawner (`--nproc N`) and the tests' multi-process helper start
#   child processes; every one of them is checked and prints its own ERROR SUMMARY (summed here).
# * --report-api-errors no: NCCL probes the driver with CUDA calls that fail on purpose (about 240
#   per communicator, e.g. peer-access probing in p2p.cc) and handles them; they are not memory
#   errors, and this mode is about memory and synchronisation. Memory errors are all reported.
# * --launch-timeout 120: a child process may take longer than the default 10 s to reach CUDA
#   under the sanitizer (NCCL's and NVSHMEM's setup).
# Nothing is suppressed or filtered: every `ERROR SUMMARY: N errors` line counts. Known ways for a
# correct program to be reported, none seen so far on this project's binaries: NCCL may read user
# buffers in 16-byte units past a size that is not a multiple of 16 (github.com/NVIDIA/nccl/issues/265);
# a lesson with a timeout (06) may time out earlier when the sanitizer slows its collectives.
# Multicast stays off (exported below and inherited by every child).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=gpu-lib.sh
source "$HERE/lib.sh"
FILTERS=("$@")
LOGS=$HERE/logs-sanitize
rm -rf "$LOGS"
mkdir -p "$LOGS"
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; fi
export RUST_BACKTRACE=1
SANITIZER=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
[ -x "$SANITIZER" ] || SANITIZER=$(command -v compute-sanitizer || true)
passed=0 failed=0 skipped=0 runs=0 not_run=0
declare -A errors_by_tool=([memcheck]=0 [synccheck]=0)
FAILED_DIR=sanitize-failed

note() {
    printf '%s\n' "$*" | tee -a "$LOGS/summary.txt"
    if [ -n "${OUT:-}" ]; then cp "$LOGS/summary.txt" "$OUT/sanitize-summary.txt"; fi
}

wanted() {
    local f
    [ "${#FILTERS[@]}" -eq 0 ] && return 0
    for f in "${FILTERS[@]}"; do [[ "$1" == *"$f"* ]] && return 0; done
    return 1
}

if [ -z "$SANITIZER" ]; then
    note "compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)"
    note "0 passed, 1 failed, 0 skipped"
    exit 1
fi
{
    echo "== machine"
    nvidia-smi -L 2>&1
    echo "GPUs: $NGPU"
    echo "compute-sanitizer: $SANITIZER ($("$SANITIZER" --version 2>&1 | grep -i version | head -1))"
    echo "NCCL_LIB_DIR=$NCCL_LIB_DIR"
    echo "NVSHMEM_LIB_DIR=$NVSHMEM_LIB_DIR"
    echo "safety: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST"
} | tee "$LOGS/machine.txt"

# One run: `sanitize NAME TOOL COMMAND...`. Passes when the command exits 0 and every process's
# ERROR SUMMARY says 0 errors; prints the first errors of a failed one.
sanitize() {
    local name=$1 tool=$2 log rc counts errs procs
    shift 2
    log="$LOGS/$name.$tool.log"
    bound "${SANITIZE_TIMEOUT:-420}" "$name ($tool)" 30 || return 0
    timeout -k 20 "$LIMIT" "$SANITIZER" --tool "$tool" --target-processes all \
        --report-api-errors no --launch-timeout 120 "$@" </dev/null >"$log" 2>&1
    rc=$?
    runs=$((runs + 1))
    counts=$(grep -oE 'ERROR SUMMARY: [0-9]+ error' "$log" | grep -oE '[0-9]+')
    procs=$(grep -c . <<<"$counts")
    errs=$(awk '{ s += $1 } END { print s + 0 }' <<<"$counts")
    errors_by_tool[$tool]=$((${errors_by_tool[$tool]:-0} + errs))
    local what="$tool: $errs errors in $procs process(es)"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        what="$tool: cut short after $LIMIT s ($errs errors so far)"
    elif [ "$procs" -eq 0 ]; then
        what="$tool: no ERROR SUMMARY (the sanitizer did not finish)"
    fi
    if [ "$rc" -eq 0 ] && [ "$procs" -gt 0 ] && [ "$errs" -eq 0 ]; then
        passed=$((passed + 1))
        note "ok $name — $what"
    else
        failed=$((failed + 1))
        note "FAIL $name — $what, exit $rc (see logs-sanitize/$name.$tool.log)"
        { grep -E '^=+ +(Invalid|Barrier|Divergent|Program hit|Malloc|Race|Uninitialized|Error)' "$log" | sort | uniq -c | head -8
          tail -3 "$log"; } | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
        keep_failed "$log"
    fi
}

# 1. Test binaries, memcheck, one test at a time.
for t in "$HERE"/tests/*; do
    [ -e "$t" ] || continue
    name=$(basename "$t")
    wanted "$name" || continue
    export GPUCOMM_SKIP_LOG=$LOGS/$name.skipped.txt
    : >"$GPUCOMM_SKIP_LOG"
    # shellcheck disable=SC2086 # test names and --skip flags, split on purpose
    sanitize "$name" memcheck "$t" --include-ignored --test-threads=1 ${SANITIZE_TEST_ARGS:-}
    [ -f "$LOGS/$name.memcheck.log" ] && grep -E '^test result:' "$LOGS/$name.memcheck.log" | tail -1 | sed 's/^/    /' | tee -a "$LOGS/summary.txt"
    sed 's/^/    skipped inside: /' "$GPUCOMM_SKIP_LOG" | tee -a "$LOGS/summary.txt"
done
unset GPUCOMM_SKIP_LOG

# 2. Lessons and benches, once each, under each of their tools.
declare -A done_lesson=()
if [ -f "$HERE/examples.tsv" ]; then
    while IFS=$'\t' read -r -a row; do
        ex=${row[0]} mode=${row[1]%@*} args=("${row[@]:2}")
        wanted "$ex" || continue
        [ -z "${done_lesson[$ex]:-}" ] || continue
        # The sanitizer's own arguments for this target, if any, in place of the row's.
        own=$(awk -F'\t' -v ex="$ex" '$1 == ex' "$HERE/sanitize-args.tsv" 2>/dev/null)
        if [ -n "$own" ]; then
            IFS=$'\t' read -r -a args <<<"$own"
            args=("${args[@]:1}")
        fi
        case "$mode" in
            single) cmd=("$(program "$ex")" "${args[@]}") ;;
            spawner) cmd=("$(program "$ex")" --nproc "$NGPU" "${args[@]}") ;;
            *) continue ;;
        esac
        done_lesson[$ex]=1
        need=$(gpus_needed "$ex" "${row[1]}")
        if [ "$need" -gt "$NGPU" ]; then
            skipped=$((skipped + 1))
            note "skip $ex: needs $need GPUs, this machine has $NGPU"
            continue
        fi
        tools=$(lesson_field "$ex" 3)
        for tool in ${tools//,/ }; do
            sanitize "$ex" "$tool" "${cmd[@]}"
        done
    done <"$HERE/examples.tsv"
    # Lessons whose every row starts ranks some other way (Python peers): said, and counted.
    while IFS=$'\t' read -r -a row; do
        ex=${row[0]}
        wanted "$ex" || continue
        [ -z "${done_lesson[$ex]:-}" ] || continue
        done_lesson[$ex]=1
        modes=$(awk -F'\t' -v ex="$ex" '$1 == ex { printf "%s%s", sep, $2; sep = ", " }' "$HERE/examples.tsv")
        skipped=$((skipped + 1))
        note "skip $ex: its rows ($modes) start ranks outside a Rust spawner; this mode runs single-process and spawner rows"
    done <"$HERE/examples.tsv"
fi

total=0
by_tool=()
for tool in "${!errors_by_tool[@]}"; do
    total=$((total + errors_by_tool[$tool]))
    by_tool+=("$tool ${errors_by_tool[$tool]}")
done
note "sanitizer: $runs runs, $total errors ($(IFS=,; sorted=$(printf '%s\n' "${by_tool[@]}" | sort | paste -sd, -); echo "${sorted//,/, }"))"
note "$passed passed, $failed failed, $skipped skipped$([ "$not_run" -gt 0 ] && echo ", $not_run not run (RUN_BUDGET)")"
if [ -n "${OUT:-}" ]; then
    cp "$LOGS/summary.txt" "$OUT/sanitize-summary.txt"
    tar czf "$OUT/sanitize-logs.tar.gz" -C "$LOGS" .
fi
[ "$failed" -eq 0 ]
