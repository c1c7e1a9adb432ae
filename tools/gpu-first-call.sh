#!/usr/bin/env bash
# A device command that unpacks the bundle and runs, within one bound, first the tests a session
# wants to see before anything else, then the bundle's runner. `./dev.sh bundle` copies it next to
# the archive (bundle-carry/first-call.sh), so a session whose machine starts late has it ready:
#
#   run(carry=["bundle-carry"], command="LIMIT=560 EXPLORE='nvshmem_soundness:global_capture,global_mode
#       capture_and_ordering:keeps_memory' bash bundle-carry/first-call.sh")
#
# EXPLORE: space-separated `TEST_BINARY:FILTER[,FILTER...]` items, each run alone with
# `--include-ignored --test-threads=1` (bounded by EXPLORE_TIMEOUT, default 240 s); its log is
# $OUT/explore-TEST_BINARY.log, and the lines the tests print for the log are shown.
# FILTERS: passed to bundle/run.sh (`none`: skip the runner). LIMIT (default 560 s): the whole
# command's bound; the runner gets what the explored tests leave (RUN_BUDGET).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# Everything comes from the environment: an argument (a filter meant for the runner) would be
# ignored and the whole runner run instead, as happened once.
if [ $# -gt 0 ]; then
    echo "first-call.sh takes no arguments (got: $*): set FILTERS=\"...\" for the runner" >&2
    exit 2
fi
LIMIT=${LIMIT:-560}
SECONDS=0
tar xJf bundle-carry/bundle.tar.xz
OUT=${OUT:-$PWD/bundle/out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpus.txt"
for item in $EXPLORE; do
    binary=${item%%:*}
    filters=${item#*:}
    log=$OUT/explore-$binary.log
    (
        HERE=$PWD/bundle
        source bundle/lib.sh
        timeout "${EXPLORE_TIMEOUT:-240}" "bundle/tests/$binary" --include-ignored --test-threads=1 ${filters//,/ }
        echo "$binary rc=$?"
    ) >"$log" 2>&1
    grep -E "during the other thread|^test |test result|rc=" "$log" | tail -40
done
echo "explored in $SECONDS s"
if [ "${FILTERS:-}" != none ]; then
    RUN_BUDGET=$((LIMIT - SECONDS)) bash bundle/run.sh $FILTERS >"$OUT/run.log" 2>&1
    echo "run.sh rc=$?"
    tail -30 "$OUT/run.log"
fi
