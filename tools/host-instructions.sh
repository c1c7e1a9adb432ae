#!/usr/bin/env bash
# The instruction counts of docs/host-cost.md, on any Linux machine (no GPU, no driver): how many
# host instructions a safe NCCL all_reduce executes beside the raw nccl-sys call, eagerly, inside
# nccl::capture and in groups of 16, and a safe NVSHMEM put (64 bytes, blocking, on a stream, to
# the PE itself) beside the raw nvshmem-sys nvshmemx_putmem_on_stream. benches/host-instructions
# runs under valgrind's callgrind against CPU stand-ins for the driver, NCCL and NVSHMEM's host
# library (tools/cpu-standins/, built into target/cpu-standins), once with 0 calls and once with
# CALLS, per path; the difference divided by CALLS is one call's instructions. The counts do not
# move from run to run, unlike timings. The stand-ins' own instructions are in both columns; the
# real driver's cuStreamIsCapturing (one per safe call, about 50 ns on the GPU machine) is not, nor
# the real nvshmem_ptr (one per safe put). `slice` is the eager call on cudarc's CudaSlice, which
# follows cudarc's event protocol (stream waits and event records) instead of a tracker; the other
# rows use the crates' own buffers. The table also counts the calls each safe call makes into
# the driver beyond the raw call's (tools/driver-calls.py), tens of nanoseconds each on the GPU
# machine: a change that adds one to a call path shows there.
#
# A second table counts what the instructions do not show: L1 cache misses per call when the
# library call in between has evicted the caller's code and data from L1, as NCCL's enqueue and
# the driver's launch behind it do on the GPU machine (tools/cpu-standins/evict.h). It runs the
# same paths under valgrind's cachegrind against stand-ins built with -DEVICT, with an L1 of
# 32 KiB of code and 48 KiB of data; each miss is a fetch from L2 (several nanoseconds) that the
# raw call does not pay.
#
#   tools/host-instructions.sh [CALLS]     (default 3200; needs valgrind, and .deps from ./dev.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-3200}
command -v valgrind >/dev/null || { echo "host-instructions: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
export GPUCOMM_PREFIX=${GPUCOMM_PREFIX:-$PWD/.deps}
include=$GPUCOMM_PREFIX/py/nvidia/cu13/include
[ -f "$include/cuda.h" ] || { echo "host-instructions: no cuda.h under $include: run ./dev.sh test once" >&2; exit 1; }
standins=target/cpu-standins
python3 tools/libcuda-stub.py "$include" "$standins" tools/cpu-standins/driver.c >/dev/null
cc -O2 -shared -fPIC -o "$standins/libnccl.so.2" -Wl,-soname,libnccl.so.2 tools/cpu-standins/nccl.c
cc -O2 -shared -fPIC -o "$standins/libnvshmem_host.so.3" -Wl,-soname,libnvshmem_host.so.3 tools/cpu-standins/nvshmem.c
mkdir -p "$standins/evict"
cc -O2 -DEVICT -shared -fPIC -o "$standins/evict/libnccl.so.2" -Wl,-soname,libnccl.so.2 tools/cpu-standins/nccl.c
cc -O2 -DEVICT -shared -fPIC -o "$standins/evict/libnvshmem_host.so.3" -Wl,-soname,libnvshmem_host.so.3 tools/cpu-standins/nvshmem.c
bin=$(cargo build --profile bundle -p examples --bench host-instructions --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "host-instructions" and msg.get("executable"):
        print(msg["executable"])')
# The -sys crates' own variables win over the real libraries that the build found.
export LD_LIBRARY_PATH=$PWD/$standins NCCL_SYS_LIBRARY=$PWD/$standins/libnccl.so.2 \
    NVSHMEM_SYS_LIBRARY=$PWD/$standins/libnvshmem_host.so.3

# The rows of both tables, and the raw and the safe path of each, as host-instructions names them.
scopes="eager slice capture group put"
paths_of() {
    case $1 in
        eager) echo raw safe ;;
        slice) echo raw slice ;;
        *) echo "$1-raw" "$1" ;;
    esac
}

# Instructions callgrind counted for `host-instructions PATH N`, and the calls into the driver
# (tools/driver-calls.py).
count() {
    local out instructions
    out=$(mktemp)
    instructions=$(valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "$1" "$2" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
    echo "$instructions" "$(python3 tools/driver-calls.py "$out")"
    rm -f "$out"
}
# Instructions per call of PATH, and driver calls per call (two decimals: a group asks per group).
per_call() {
    local none many
    none=($(count "$1" 0))
    many=($(count "$1" "$calls"))
    echo $(((many[0] - none[0]) / calls)) "$(awk -v d=$((many[1] - none[1])) -v n="$calls" 'BEGIN { printf "%.2f", d / n }')"
}

# Every path must run whole against the stand-ins: one that fails (a function the crates call that
# a stand-in lacks) would count as 0 instructions.
for scope in $scopes; do
    for path in $(paths_of "$scope"); do
        if ! "$bin" "$path" 16 >/dev/null 2>"$standins/check.err" || grep -q 'not implemented' "$standins/check.err"; then
            echo "host-instructions: path '$path' does not run against the stand-ins:" >&2
            cat "$standins/check.err" >&2
            exit 1
        fi
    done
done

echo "host instructions per 256-byte all_reduce (put: per 64-byte put), $calls calls per path, CPU stand-ins (tools/cpu-standins),"
echo "and the driver calls the safe call makes per call beyond the raw one's"
printf '  %-8s %8s %8s %9s %13s\n' scope raw safe overhead "driver calls"
for scope in $scopes; do
    read -r raw safe <<<"$(paths_of "$scope")"
    r=($(per_call "$raw"))
    s=($(per_call "$safe"))
    printf '  %-8s %8d %8d %+9d %13s\n' "$scope" "${r[0]}" "${s[0]}" $((s[0] - r[0])) \
        "$(awk -v s="${s[1]}" -v r="${r[1]}" 'BEGIN { printf "%+.2f", s - r }')"
done

# L1 code and data misses (reads and writes) cachegrind counted for `host-instructions PATH N`,
# against the evicting stand-ins.
misses() {
    local out
    out=$(mktemp)
    NCCL_SYS_LIBRARY=$PWD/$standins/evict/libnccl.so.2 NVSHMEM_SYS_LIBRARY=$PWD/$standins/evict/libnvshmem_host.so.3 \
        valgrind --tool=cachegrind --cache-sim=yes --I1=32768,8,64 --D1=49152,12,64 --LL=2097152,16,64 \
        --cachegrind-out-file="$out" "$bin" "$1" "$2" >/dev/null 2>&1
    # events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
    awk '/^summary:/ { print $3, $6 + $9 }' "$out"
    rm -f "$out"
}
# L1 code and data misses per call of PATH, over $cold calls.
misses_per_call() {
    local none many
    none=($(misses "$1" 0))
    many=($(misses "$1" "$cold"))
    echo $(((many[0] - none[0]) / cold)) $(((many[1] - none[1]) / cold))
}

cold=$((calls < 1000 ? calls : 1000))
echo
echo "L1 misses per call more than the raw call's, when the library call before it evicted L1"
echo "(tools/cpu-standins/evict.h; in groups of 16 one eviction per group), $cold calls per path"
printf '  %-8s %6s %6s\n' scope code data
for scope in $scopes; do
    read -r raw safe <<<"$(paths_of "$scope")"
    r=($(misses_per_call "$raw"))
    s=($(misses_per_call "$safe"))
    printf '  %-8s %+6d %+6d\n' "$scope" $((s[0] - r[0])) $((s[1] - r[1]))
done
