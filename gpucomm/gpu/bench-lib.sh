# Sourced by the side-by-side scripts of gpucomm/gpu/ (bench-vs-nccl-tests.sh, variants.sh,
# dispatch-vs-nccl-tests.sh; copied next to them into the bundle). It exports the safety
# variables, finds the gpucomm binary and the nccl-tests builder, names the NCCL both tools load
# (the python3 wheel's), builds nccl-tests (MPI=1, and MPI=0 when NT_MPI0=1), and defines:
#   NGPU, GPUCOMM, OUTDIR, LOGS_ROOT, NT (MPI=1 build), NT0 (MPI=0 build, if asked), LIB
#   mpi ARGS...          mpirun -np $NGPU with the safety variables and libraries passed on
#   mpi_with "MPIARGS" ARGS...  the same with extra mpirun options (e.g. "--bind-to core -x V=1")
#   by_hand ARGS...      $NGPU processes started with torchrun-style variables (no launcher)
#   note TEXT            prints TEXT and appends it to $OUTDIR/summary.txt
# The caller sets HERE (its own folder) and may set OUT, NEED_GPUS (default 2).
# NVLink multicast must never be requested: exported here and passed to every rank.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
SAFETY_VARS=(NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST)

OUTDIR=${OUT:-$PWD/bench-out}
mkdir -p "$OUTDIR"
note() { printf '%s\n' "$*" | tee -a "$OUTDIR/summary.txt"; }

BUILDER=
for c in "$HERE/gpu-nccl-tests.sh" "$HERE/../../tools/gpu-nccl-tests.sh"; do
    [ -z "$BUILDER" ] && [ -f "$c" ] && BUILDER=$c
done
GPUCOMM=${GPUCOMM:-}
for c in "$HERE/bin/gpucomm" "$HERE/../bin/gpucomm" "$HERE/../../bin/gpucomm" "$HERE/../../target/release/gpucomm" "$(command -v gpucomm 2>/dev/null)"; do
    [ -z "$GPUCOMM" ] && [ -n "$c" ] && [ -x "$c" ] && GPUCOMM=$c
done
[ -x "${GPUCOMM:-}" ] || { echo "gpucomm binary not found: set GPUCOMM=/path/to/gpucomm"; exit 2; }
[ -n "$BUILDER" ] || { echo "gpu-nccl-tests.sh (the nccl-tests builder) not found next to this script"; exit 2; }
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -ge "${NEED_GPUS:-2}" ] || { echo "needs ${NEED_GPUS:-2} or more GPUs, found $NGPU"; exit 2; }

# One NCCL for both tools: the python3 wheel's (the system's older libnccl.so.2 is in the ldconfig
# cache); the builder links nccl-tests against it and names a folder to put first on the library path.
SP=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))') && [ -n "$SP" ] \
    || { echo "python3 has no NVIDIA wheels (import nvidia failed): install nvidia-nccl-cu13"; exit 2; }
WHEEL=$SP/nvidia/nccl/lib
export NCCL_LIB_DIR=$WHEEL
[ -d "$SP/nvidia/nvshmem/lib" ] && export NVSHMEM_LIB_DIR=$SP/nvidia/nvshmem/lib

# Build nccl-tests (about 40 s each; reused when the machine still has it), in parallel.
mkdir -p "$OUTDIR/logs"
MPI=1 bash "$BUILDER" >"$OUTDIR/logs/nccl-tests-build-mpi1.log" 2>&1 & b1=$!
b0=
[ "${NT_MPI0:-0}" = 1 ] && { MPI=0 bash "$BUILDER" >"$OUTDIR/logs/nccl-tests-build-mpi0.log" 2>&1 & b0=$!; }
built=1
wait $b1 || built=0
[ -n "$b0" ] && { wait "$b0" || built=0; }
if [ "$built" -ne 1 ]; then
    note "FAIL building nccl-tests (see logs/nccl-tests-build-mpi*.log)"
    tail -20 "$OUTDIR"/logs/nccl-tests-build-mpi*.log
    exit 1
fi
read -r NT LIB < <(tail -1 "$OUTDIR/logs/nccl-tests-build-mpi1.log")
NT0=
[ -n "$b0" ] && read -r NT0 _ < <(tail -1 "$OUTDIR/logs/nccl-tests-build-mpi0.log")
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

XS=()
for v in "${SAFETY_VARS[@]}" PATH LD_LIBRARY_PATH NCCL_LIB_DIR NVSHMEM_LIB_DIR; do XS+=(-x "$v"); done
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
mpi() { timeout -k 10 "$RUN_TIMEOUT" mpirun -np "$NGPU" --allow-run-as-root --bind-to none "${XS[@]}" "$@" </dev/null; }
# $1: extra mpirun options (word-split), then the command. Options after --bind-to none override it.
mpi_with() {
    local extra=$1
    shift
    # shellcheck disable=SC2086 # $extra holds several options
    timeout -k 10 "$RUN_TIMEOUT" mpirun -np "$NGPU" --allow-run-as-root --bind-to none $extra "${XS[@]}" "$@" </dev/null
}
# NGPU processes with torchrun-style variables, as `RANK=… WORLD_SIZE=… prog &` by hand: rank 0's
# output on stdout, the others' on stderr.
by_hand() {
    local port=$((29500 + RANDOM % 2000)) pids=() rc=0 r
    for ((r = NGPU - 1; r >= 0; r--)); do
        if [ "$r" -eq 0 ]; then
            RANK=$r WORLD_SIZE=$NGPU LOCAL_RANK=$r LOCAL_WORLD_SIZE=$NGPU MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                timeout "$RUN_TIMEOUT" "$@" </dev/null &
        else
            RANK=$r WORLD_SIZE=$NGPU LOCAL_RANK=$r LOCAL_WORLD_SIZE=$NGPU MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                timeout "$RUN_TIMEOUT" "$@" </dev/null >&2 &
        fi
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    return "$rc"
}

{
    echo "== $(date -u +%FT%TZ) $(basename "$0"): $NGPU GPUs"
    nvidia-smi -L
    echo "gpucomm: $GPUCOMM ($("$GPUCOMM" --version))"
    echo "nccl-tests: $NT (MPI=1)${NT0:+, $NT0 (MPI=0)}"
    echo "NCCL for both: $WHEEL"
    echo "safety: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST"
} | tee -a "$OUTDIR/summary.txt"
