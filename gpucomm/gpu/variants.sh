#!/usr/bin/env bash
# Issue 16's small-message hunt, on the GPU machine: gpucomm bench and nccl-tests' all_reduce_perf,
# one process per GPU, 8 B – 256 KiB, in every variant that could explain why one is slower than the
# other — launcher and CPU placement, communicator creation, buffers, stream, barrier, the wait,
# the API, how time is taken — interleaved (the order turns round every repeat) and repeated.
#
#   bash bundle/variants.sh            # REPEATS (3), OUT; bin/gpucomm next to it or above
#   ONLY='^(c|r)\.default$' bash bundle/variants.sh   # only the variants whose name matches
#   ITERS=1000 WARMUP=50 bash bundle/variants.sh       # calls per timed block (-n; default 20, as
#                                                      # nccl-tests), warm-up calls per size (-w; 5)
#
# With -n 20 one timed block lasts ~100 µs, and on one GPU the repeats of one variant spread by up
# to 3 µs per call (docs/bench/README.md): use ITERS for differences of a few hundred ns.
# Writes $OUT/variants/<variant>.<repeat>.{log,json} and $OUT/variants.md (tools/variants-table.py):
# per variant the median time per call at each size, the mean over the sizes with its spread over
# the repeats, the difference to nccl-tests' default run, and the host time per call (gpucomm's
# cpu_us; nccl-tests' -C 1 run). About 20 runs of ~4 s per repeat.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench-lib.sh
source "$HERE/bench-lib.sh"
REPEATS=${REPEATS:-3}
LOGS=$OUTDIR/variants
# Empty at each run: an earlier run's logs would join this run's table.
rm -rf "$LOGS"
mkdir -p "$LOGS"
SIZES=(-b 8 -e 256K -f 8 -n "${ITERS:-20}" -w "${WARMUP:-5}" -c 0)
SCHED=NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE

# name | tool (c: nccl-tests, r: gpucomm) | launcher (mpirun, spawner, by-hand) | extra mpirun options | arguments
VARIANTS=(
    "c.default|c|mpirun||"
    "r.default|r|mpirun||"
    "c.cputime|c|mpirun||-C 1"
    "r.cudarc-buffers|r|mpirun||--buffers cudarc"
    "c.stream-null|c|mpirun||-y 1"
    "r.stream-null|r|mpirun||-y 1"
    "c.bind-core|c|mpirun|--bind-to core|"
    "r.bind-core|r|mpirun|--bind-to core|"
    "c.sched-off|c|mpirun|-x $SCHED=0|"
    "r.init-config-sched|r|mpirun|-x $SCHED=1|--init config"
    "c.rank0-time|c|mpirun||-a 0"
    "r.init-group|r|mpirun||--init group"
    "r.barrier-nccl|r|mpirun||--barrier nccl"
    "r.wait-poll|r|mpirun||--wait poll"
    "r.like-nccl-tests|r|mpirun|-x $SCHED=1|--init group --wait poll"
    "r.api-raw|r|mpirun||--api raw"
    "r.api-raw-cudarc|r|mpirun||--api raw --buffers cudarc"
    "r.events|r|mpirun||--events"
    "r.spawner|r|spawner||"
    "r.by-hand|r|by-hand||"
)
if [ -n "${ONLY:-}" ]; then
    kept=()
    for v in "${VARIANTS[@]}"; do [[ "${v%%|*}" =~ $ONLY ]] && kept+=("$v"); done
    VARIANTS=("${kept[@]}")
    [ "${#VARIANTS[@]}" -gt 0 ] || { echo "ONLY='$ONLY' matches no variant"; exit 2; }
fi
printf '%s\n' "${VARIANTS[@]}" >"$LOGS/variants.txt"
fails=0
one() { # variant-line repeat
    local name tool launcher mpiargs args out rc
    IFS='|' read -r name tool launcher mpiargs args <<<"$1"
    read -r -a argv <<<"$args"
    if [ "$tool" = c ]; then
        out=$LOGS/$name.$2.log
        mpi_with "$mpiargs" "$NT/all_reduce_perf" "${SIZES[@]}" -g 1 "${argv[@]}" >"$out" 2>&1
    else
        out=$LOGS/$name.$2.json
        case "$launcher" in
            mpirun) mpi_with "$mpiargs" "$GPUCOMM" bench all_reduce "${SIZES[@]}" --json "${argv[@]}" >"$out" 2>"$out.err" ;;
            spawner) timeout "$RUN_TIMEOUT" "$GPUCOMM" bench all_reduce "${SIZES[@]}" --nproc "$NGPU" --json "${argv[@]}" >"$out" 2>"$out.err" </dev/null ;;
            by-hand) by_hand "$GPUCOMM" bench all_reduce "${SIZES[@]}" --json "${argv[@]}" >"$out" 2>"$out.err" ;;
        esac
    fi
    rc=$?
    [ "$rc" -eq 0 ] || { fails=$((fails + 1)); note "FAIL $name #$2 (exit $rc; see ${out#"$OUTDIR"/})"; }
}
for ((rep = 1; rep <= REPEATS; rep++)); do
    order=("${VARIANTS[@]}")
    if ((rep % 2 == 0)); then
        order=()
        for ((i = ${#VARIANTS[@]} - 1; i >= 0; i--)); do order+=("${VARIANTS[$i]}"); done
    fi
    for v in "${order[@]}"; do
        echo "-- rep $rep/$REPEATS ${v%%|*}"
        one "$v" "$rep"
    done
done
TABLE=$HERE/variants-table.py
[ -f "$TABLE" ] || TABLE=$HERE/../../tools/variants-table.py
if python3 "$TABLE" "$LOGS" >"$OUTDIR/variants.md" 2>"$OUTDIR/variants.md.err"; then
    cat "$OUTDIR/variants.md"
else
    fails=$((fails + 1)); note "FAIL variants table: $(cat "$OUTDIR/variants.md.err")"
fi
note "variants: $fails failure(s)"
[ "$fails" -eq 0 ]
