#!/usr/bin/env bash
# Builds NVIDIA's nccl-tests (the reference benchmark, shipped as bundle/ref/nccl-tests-*.tar.gz by
# tools/bundle.sh from ../shared/ref) on the GPU machine, against the same NCCL the bundle loads
# (the python3 wheel's libnccl.so.2, or $NCCL_LIB_DIR): with Open MPI (MPI=1, the default) for one
# process per GPU under mpirun, or without (MPI=0) for one process driving every GPU (-g N).
# Idempotent: a second call reuses the build. The tarball is found in $REF, bundle/ref or the
# checkout's ../shared/ref. Its last line is "BUILD_DIR LIB_DIR": put LIB_DIR (symlinks to the wheel's
# libnccl.so.2) first on LD_LIBRARY_PATH, or the binaries load the system's NCCL.
#
#   read -r dir lib < <(bash bundle/gpu-nccl-tests.sh | tail -1)
#   LD_LIBRARY_PATH=$lib mpirun -np 2 --allow-run-as-root -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE=0 ... \
#       "$dir/all_reduce_perf" -b 8 -e 64M -f 2 -g 1
set -euo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
MPI=${MPI:-1}
tarball=$(ls "${REF:-/nonexistent}"/nccl-tests-*.tar.gz "$HERE"/ref/nccl-tests-*.tar.gz "$HERE"/../../shared/ref/nccl-tests-*.tar.gz 2>/dev/null | head -1 || true)
[ -n "$tarball" ] || { echo "no nccl-tests tarball (set REF to the folder holding nccl-tests-*.tar.gz)" >&2; exit 2; }
work=${NCCL_TESTS_WORK:-/tmp/gpucomm-nccl-tests}/mpi$MPI
build=$work/nccl-tests/build
# A stamp written after a whole build: a build cut short (on a warm machine) is made again.
if [ ! -f "$work/built" ]; then
    lib=${NCCL_LIB_DIR:-$(python3 -c "import nvidia, os; print(next(os.path.join(p, 'nccl/lib') for p in nvidia.__path__ if os.path.isdir(os.path.join(p, 'nccl/lib'))))")}
    inc=$(dirname "$lib")/include
    mkdir -p "$work/home/lib"
    ln -sfn "$inc" "$work/home/include"
    ln -sf "$lib/libnccl.so.2" "$work/home/lib/libnccl.so"
    ln -sf "$lib/libnccl.so.2" "$work/home/lib/libnccl.so.2"
    tar xzf "$tarball" -C "$work"
    mpi=/usr/lib/x86_64-linux-gnu/openmpi
    make -C "$work/nccl-tests" -j"$(nproc)" MPI="$MPI" MPI_HOME="$mpi" NCCL_HOME="$work/home" CUDA_HOME=/usr/local/cuda \
        NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$work/build.log" 2>&1 \
        || { tail -20 "$work/build.log" >&2; exit 1; }
    touch "$work/built"
fi
echo "$build $work/home/lib"
