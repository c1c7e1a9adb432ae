# Sourced by the GPU bundle's runners (bundle/run.sh, bundle/sanitize.sh; copied to bundle/lib.sh
# by tools/bundle.sh); $HERE is the bundle's folder. It sets NCCL_LIB_DIR / NVSHMEM_LIB_DIR to the
# wheels of the machine's python3 (the dynamic loader would find the system's older libnccl.so.2
# first), appends the CUDA 13 wheels' libraries to LD_LIBRARY_PATH, sets NGPU, finds each lesson's
# or bench's binary and says what each needs (bundle/lessons.tsv). Multicast stays off here too.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

wheel_dir() {
    python3 -c "import nvidia, os, sys
for p in nvidia.__path__:
    d = os.path.join(p, sys.argv[1], 'lib')
    if os.path.isdir(d): print(d); break" "$1" 2>/dev/null
}
[ -n "${NCCL_LIB_DIR:-}" ] || { NCCL_LIB_DIR=$(wheel_dir nccl) && export NCCL_LIB_DIR; }
[ -n "${NVSHMEM_LIB_DIR:-}" ] || { NVSHMEM_LIB_DIR=$(wheel_dir nvshmem) && export NVSHMEM_LIB_DIR; }
# The candle lessons link cuBLAS, cuRAND and the CUDA runtime (candle's `dynamic-linking`): the
# machine's CUDA 13 wheels have them (after the driver's own paths, which provide libcuda.so.1).
CUDA_WHEEL_LIB=$(wheel_dir cu13)
[ -n "$CUDA_WHEEL_LIB" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDA_WHEEL_LIB

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -ge 1 ] || NGPU=1

# The binary of lesson or bench $1: bundle/examples/$1 (lessons), else bundle/benches/$1 (the
# measuring programs).
program() {
    if [ -e "$HERE/examples/$1" ]; then echo "$HERE/examples/$1"; else echo "$HERE/benches/$1"; fi
}

# Column $2 of lesson $1 in bundle/lessons.tsv (2: minimum GPUs, 3: sanitizer tools).
lesson_field() {
    awk -F'\t' -v l="$1" -v c="$2" '$1 == l { print $c }' "$HERE/lessons.tsv" 2>/dev/null
}

# GPUs that lesson $1 needs in launch mode $2 (`mode` or `mode@N`): the largest of the lesson's
# minimum ([package.metadata.bundle.min-gpus]), the mode's own (net-socket and one-agent torchrun
# put one rank on each GPU; split-hosts, torchrun-2nodes and the Python modes run both ranks on one
# GPU) and N.
gpus_needed() {
    local n mode=${2%@*} asked=1
    [[ "${2:-}" == *@* ]] && asked=${2#*@}
    n=$(lesson_field "$1" 2)
    n=${n:-1}
    case "$mode" in
        net-socket | torchrun | torchrun-c10d | torchrun-standalone) [ "$n" -ge 2 ] || n=2 ;;
    esac
    [ "$asked" -gt "$n" ] && n=$asked
    echo "$n"
}

# Keeps the log $1 of a failure where the device tool brings it back ($OUT/$FAILED_DIR), at once:
# a command cut short still returns why its items failed.
keep_failed() {
    if [ -n "${OUT:-}" ] && [ -f "$1" ]; then mkdir -p "$OUT/${FAILED_DIR:-failed}" && cp "$1" "$OUT/${FAILED_DIR:-failed}/"; fi
}

# Sets LIMIT, the bound in seconds for the next item, whose own bound is $1: cut to what RUN_BUDGET
# (seconds since the script began, none when unset) leaves, `$3` seconds (default 10) kept for the
# kill's grace; fails, counting the item (named $2) in not_run and noting it, when less than 20 s
# would be left. Called directly, not in $(…): it counts and notes in the calling shell, whose
# `note` it uses.
bound() {
    LIMIT=$1
    [ -z "${RUN_BUDGET:-}" ] && return 0
    local left=$((RUN_BUDGET - SECONDS - ${3:-10}))
    if [ "$left" -lt 20 ]; then
        not_run=$((${not_run:-0} + 1))
        note "not run $2: RUN_BUDGET=$RUN_BUDGET s spent"
        return 1
    fi
    [ "$left" -lt "$LIMIT" ] && LIMIT=$left
    return 0
}
