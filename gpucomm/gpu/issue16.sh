#!/usr/bin/env bash
# Every figure of issue 16 (except the host-cost table: tools/gpu-host-cost.sh), on a 2-GPU
# machine, in four parts that each fit one device command (≤ 10 minutes; about 5–7 each):
#
#   bash bundle/issue16.sh variants   # small-message variants, both tools  → variants.md
#   bash bundle/issue16.sh mpirun     # every collective, one process per GPU under mpirun, + -c 1 check
#   bash bundle/issue16.sh spawn      # every collective under gpucomm's spawner, and all_reduce with -g 2
#   bash bundle/issue16.sh dispatch   # the dispatching all-reduce vs nccl-tests' best, 8 B – 8 GiB
#
# and, on a machine with one GPU, a rehearsal of all four with one rank (small sizes, one repeat,
# a few collectives), so that the 2-GPU job does not trip over a script:
#
#   bash bundle/issue16.sh one-gpu     # about 6 minutes
#
# Each part writes into $OUT/<part>/ (OUT defaults to ./issue16-out). Back on the build machine,
# `tools/issue16-report.sh DIR...` (the parts' folders, in any order) assembles docs/bench/:
# summary.md with every goal line under mpirun and under the spawner, the per-collective tables
# and plots, variants.md and dispatch.md. Environment: REPEATS (per part: 3, 2, 2, 2).
# NVLink multicast is never requested (bench-lib.sh exports the safety variables for every run).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
part=${1:-}
ROOT=${OUT:-$PWD/issue16-out}
started=$(date +%s)
case "$part" in
    variants)
        OUT=$ROOT/variants REPEATS=${REPEATS:-3} bash "$HERE/variants.sh" ;;
    mpirun)
        OUT=$ROOT/mpirun MODES=mpirun REPEATS=${REPEATS:-2} FACTOR=8 CHECK=1 bash "$HERE/bench-vs-nccl-tests.sh" ;;
    spawn)
        OUT=$ROOT/spawn MODES="spawn g" REPEATS=${REPEATS:-2} FACTOR=8 CHECK=0 bash "$HERE/bench-vs-nccl-tests.sh" ;;
    dispatch)
        OUT=$ROOT/dispatch REPEATS=${REPEATS:-2} bash "$HERE/dispatch-vs-nccl-tests.sh" ;;
    one-gpu)
        export NEED_GPUS=1 REPEATS=1
        rc=0
        OUT=$ROOT/one-gpu/variants bash "$HERE/variants.sh" || rc=1
        OUT=$ROOT/one-gpu/bench MODES="mpirun spawn g" COLLS="all_reduce alltoall sendrecv" MAXBYTES=64M FACTOR=64 \
            CHECK=1 bash "$HERE/bench-vs-nccl-tests.sh" || rc=1
        OUT=$ROOT/one-gpu/dispatch MAXBYTES=64M LARGE=0 bash "$HERE/dispatch-vs-nccl-tests.sh" || rc=1
        (exit $rc) ;;
    *)
        sed -n '2,21p' "$0"
        exit 2 ;;
esac
rc=$?
echo "issue16 $part: exit $rc after $(($(date +%s) - started)) s"
exit "$rc"
