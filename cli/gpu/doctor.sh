#!/usr/bin/env bash
# gpucomm doctor on the GPU machine, three ways: as the machine is, with NCCL kept off P2P and shared
# memory (the doctor must say that NCCL uses sockets although NVLink is up), and with the wheel's NCCL
# first in LD_LIBRARY_PATH (what NVSHMEM then opens for itself). Reports go to $OUT (or ./doctor-out).
#
#   GPUCOMM=/path/to/gpucomm bash cli/gpu/doctor.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
HERE=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${OUT:-$PWD/doctor-out}
mkdir -p "$OUTDIR"
GPUCOMM=${GPUCOMM:-}
for c in "$HERE/bin/gpucomm" "$HERE/../bin/gpucomm" "$HERE/../../bin/gpucomm" "$(command -v gpucomm 2>/dev/null)"; do
    [ -z "$GPUCOMM" ] && [ -n "$c" ] && [ -x "$c" ] && GPUCOMM=$c
done
[ -x "${GPUCOMM:-}" ] || { echo "gpucomm binary not found: set GPUCOMM=/path/to/gpucomm"; exit 2; }
WHEEL=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "nccl", "lib"))')
export NCCL_LIB_DIR=$WHEEL
# 1 = ✗ found (expected for the second run), anything above 1 = the doctor could not run.
d() { local name=$1 rc; shift; env "$@" "$GPUCOMM" doctor --logs "$OUTDIR/$name.logs" >"$OUTDIR/$name.txt" 2>"$OUTDIR/$name.err"; rc=$?
      "$GPUCOMM" doctor --skip-live --json >"$OUTDIR/$name.physical-software.json" 2>/dev/null
      echo "== $name: exit $rc"; cat "$OUTDIR/$name.txt"; return $((rc > 1)); }
fails=0
d doctor || fails=$((fails + 1))
d doctor-no-p2p-shm NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 || fails=$((fails + 1))
grep -q 'NVLink present but NCCL uses NET' "$OUTDIR/doctor-no-p2p-shm.txt" || { echo "the sockets verdict is missing"; fails=$((fails + 1)); }
d doctor-wheel-first LD_LIBRARY_PATH="$WHEEL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" || fails=$((fails + 1))
echo "$((4 - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
