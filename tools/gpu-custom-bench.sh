#!/usr/bin/env bash
# Issue 10's side-by-side on the GPU machine: this project's custom all-reduce kernels (the
# custom-kernels bench, examples/benches/custom-kernels.rs, in bundle/benches/)
# and NVIDIA's best on the same machine in the same job — nccl-tests 2.19.6's all_reduce_perf as
# default, `-R 2` (symmetric windows: NCCL's symmetric kernels), `-R 2 -D 1` and `-R 2 -D 2`
# (nccl-tests' own LSA device-API kernels), each eagerly and replayed from a graph (`-G`), one
# process per GPU under mpirun, 8 B – 64 MiB. Never `-D 3`/`-D 4`: they use NVLink multicast.
# Logs and results go to $OUT (or ./custom-bench-out): nccl-tests logs, ours.json, and the
# comparison (custom-vs-nccl-tests.md/.svg) drawn by custom-vs-nccl-tests.py.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${OUT:-$PWD/custom-bench-out}
mkdir -p "$OUTDIR/nccl-tests"
# The GPUs the figures come from (custom-vs-nccl-tests.py names them in the table and the plot).
nvidia-smi -L >"$OUTDIR/gpus.txt" 2>/dev/null || true
NGPU=$(grep -c '^GPU' "$OUTDIR/gpus.txt" || true)
[ -n "${NCCL_LIB_DIR:-}" ] || NCCL_LIB_DIR=$(python3 -c "import nvidia, os; print(next(os.path.join(p, 'nccl/lib') for p in nvidia.__path__ if os.path.isdir(os.path.join(p, 'nccl/lib'))))")
[ -n "${NVSHMEM_LIB_DIR:-}" ] || NVSHMEM_LIB_DIR=$(python3 -c "import nvidia, os; print(next(os.path.join(p, 'nvshmem/lib') for p in nvidia.__path__ if os.path.isdir(os.path.join(p, 'nvshmem/lib'))))")
export NCCL_LIB_DIR NVSHMEM_LIB_DIR
read -r NT LIB < <(MPI=1 bash "$HERE/gpu-nccl-tests.sh" | tail -1)
[ -x "$NT/all_reduce_perf" ] || { echo "nccl-tests did not build"; exit 1; }
XS=()
for v in NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS TORCH_SYMM_MEM_DISABLE_MULTICAST NCCL_LIB_DIR NVSHMEM_LIB_DIR; do XS+=(-x "$v"); done
fails=0
for variant in "default:" "R2:-R 2" "R2D1:-R 2 -D 1" "R2D2:-R 2 -D 2"; do
    name=${variant%%:*} flags=${variant#*:}
    for mode in eager graph; do
        extra=()
        [ "$mode" = graph ] && extra=(-G 10)
        # shellcheck disable=SC2086 # $flags holds several options
        LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout -k 10 120 mpirun -np "$NGPU" --allow-run-as-root \
            --bind-to none -x LD_LIBRARY_PATH "${XS[@]}" "$NT/all_reduce_perf" -b 8 -e 64M -f 2 -g 1 -n 50 -w 10 -c 0 \
            $flags "${extra[@]}" >"$OUTDIR/nccl-tests/$name.$mode.log" 2>&1 </dev/null \
            || { echo "FAIL nccl-tests $name $mode"; fails=$((fails + 1)); }
    done
done
timeout -k 10 240 "$HERE/benches/custom-kernels" --nproc "$NGPU" --json "$OUTDIR/ours.json" >"$OUTDIR/ours.log" 2>&1 </dev/null \
    || { echo "FAIL custom-kernels"; tail -20 "$OUTDIR/ours.log"; fails=$((fails + 1)); }
python3 "$HERE/custom-vs-nccl-tests.py" "$OUTDIR" || fails=$((fails + 1))
echo "custom bench: $fails failure(s)"
[ "$fails" -eq 0 ]
