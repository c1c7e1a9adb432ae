#!/usr/bin/env bash
# gpucomm doctor on the GPU machine, three ways: as the machine is (the bandwidth lines as a share
# of the link's limit), with NCCL kept off P2P and shared memory (the doctor must say that NCCL uses
# sockets although NVLink is up, and flag the bandwidth below 50 % naming that cause), and with the
# wheel's NCCL first in LD_LIBRARY_PATH (what NVSHMEM then opens for itself). Reports go to $OUT
# (or ./doctor-out). With one GPU the live layer cannot run: only the first run is made (physical and
# software layers), and the other two are counted as skipped.
#
#   GPUCOMM=/path/to/gpucomm bash gpucomm/gpu/doctor.sh
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
# One doctor run: the text report in $name.txt and the same run's JSON (every figure) in
# $name.json. 1 = ✗ found (expected for the second run), anything above 1 = the doctor could not
# run (124: it ran past its bound of DOCTOR_TIMEOUT seconds, default 190, so that the three runs
# fit one device command). The logs folder is emptied first, so that a retry in the same $OUT
# reads no earlier run's results.
d() { local name=$1 rc; shift; rm -rf "$OUTDIR/$name.logs"
      timeout -k 10 "${DOCTOR_TIMEOUT:-190}" env "$@" "$GPUCOMM" doctor --logs "$OUTDIR/$name.logs" \
          --json-out "$OUTDIR/$name.json" >"$OUTDIR/$name.txt" 2>"$OUTDIR/$name.err"; rc=$?
      echo "== $name: exit $rc"; cat "$OUTDIR/$name.txt"; return $((rc > 1)); }
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
passed=0 fails=0 skipped=0
expect() { if grep -qE "$2" "$OUTDIR/$1.txt"; then passed=$((passed + 1)); else echo "missing in $1.txt: $3"; fails=$((fails + 1)); fi; }
# A Python expression over the run's JSON document `j` that must hold.
expect_json() {
    if python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' \
        "$OUTDIR/$1.json" "$2" 2>/dev/null; then passed=$((passed + 1)); else echo "missing in $1.json: $3"; fails=$((fails + 1)); fi
}
if d doctor; then passed=$((passed + 1)); else fails=$((fails + 1)); fi
if [ "$NGPU" -lt 2 ]; then
    expect doctor 'live layer skipped: it needs 2 GPUs' "the one-GPU line of the live layer"
    echo "skipped: doctor-no-p2p-shm and doctor-wheel-first (the live layer needs 2 GPUs; this machine has $NGPU)"
    skipped=2
else
    expect doctor 'NCCL all-reduce bus bandwidth [0-9]+ GB/s at .* = [0-9]+ % of [0-9]+ GB/s' "the all-reduce bandwidth as a share of the link"
    expect doctor 'NVLink error counters (did not grow|grew) during the live load' "the counters' growth under load"
    expect_json doctor 'len(j["facts"]["bandwidth"]) > 0 and j["facts"]["nvlink_error_growth"] is not None' \
        "the bandwidth verdicts and the counters' growth in the JSON"
    expect_json doctor 'j["facts"]["nvlink_far_ends"] and all(e["direct"] or e["through_topology"] for e in j["facts"]["nvlink_far_ends"])' \
        "each GPU's NVLink far end named as a GPU in the JSON"
    if d doctor-no-p2p-shm NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1; then passed=$((passed + 1)); else fails=$((fails + 1)); fi
    expect doctor-no-p2p-shm 'NVLink present but NCCL uses NET' "the sockets verdict"
    expect doctor-no-p2p-shm 'bus bandwidth .* below 50 % of the link: NCCL uses NET' "the low-bandwidth flag with its cause"
    if d doctor-wheel-first LD_LIBRARY_PATH="$WHEEL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; then passed=$((passed + 1)); else fails=$((fails + 1)); fi
fi
echo "$passed passed, $fails failed, $skipped skipped"
[ "$fails" -eq 0 ]
