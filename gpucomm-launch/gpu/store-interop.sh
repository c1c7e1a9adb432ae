#!/usr/bin/env bash
# gpucomm's TCPStore against PyTorch's, both ways (gpucomm-launch/gpu/store_interop.py), with the
# store-interop example built into the bundle. Runs on the GPU machine (python3 with torch; no
# GPU is touched). Last line: `store interop: N passed, N failed, N skipped`.
#
#   bash bundle/store-interop.sh [PATH/TO/store-interop]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:-$HERE/examples/store-interop}
[ -x "$BIN" ] || { echo "store-interop binary not found at $BIN (build the bundle, or pass its path)"; exit 2; }
timeout -k 10 300 python3 -u "$HERE/store_interop.py" "$BIN" 2>&1 | tee "${OUT:-/tmp}/store-interop.log"
exit "${PIPESTATUS[0]}"
