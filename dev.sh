#!/usr/bin/env bash
# Developer entry point. Every command first runs `setup`, which is idempotent (a second run is a
# fast no-op) and installs what a fresh Debian machine lacks:
#   - Debian packages: libclang-dev (bindgen), g++ (nvcc's host compiler, C layout checks),
#     python3 + pip (to fetch NVIDIA's wheels), ca-certificates; Rust (rustup) if cargo is missing;
#   - the NVIDIA wheels pinned to the GPU machine's versions, into the git-ignored project-local
#     prefix .deps/py (no CUDA install needed; no GPU needed);
#   - for `test` and `setup` also the oldest and newest supported NCCL and NVSHMEM releases
#     (headers and shared libraries only), into .deps/versions: the version-range test compiles
#     the -sys crates against each;
#   - for `test`, `lint`, `bundle` and `setup` also what candle needs to build (the candle
#     lessons and the framework probe): cuBLAS, cuRAND and NVRTC wheels and a link-time
#     libcuda.so stub, into .deps/candle (see setup_candle).
#
#   ./dev.sh run      set up, then run the first tutorial example (versions, GPUs, a small all-reduce)
#   ./dev.sh test     set up, then run every test (CPU-only machines skip GPU tests, counted as ignored);
#                     without arguments also check the library crates with the minimum supported Rust
#                     (rust-version, installed with rustup), build the candle lessons, run the framework
#                     probe, package
#   ./dev.sh lint     rustfmt check, clippy and rustdoc with warnings denied
#   ./dev.sh setup    only install the dependencies
#   ./dev.sh bundle   build the GPU bundle (bundle/, with bundle/run.sh); see CONTRIBUTING.md
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
PREFIX=$ROOT/.deps
WHEELS=(
    nvidia-nccl-cu13==2.28.9
    nvidia-nvshmem-cu13==3.4.5
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
    nvidia-cuda-crt==13.0.88
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
)
# The ends of the supported ranges (build_support::version): the oldest and the newest
# release the package index offers. build-support/tests/version_range.rs builds and loads the -sys
# crates against each (and against the pins above) and checks that these ends are the ranges'.
RANGE_WHEELS=(
    nvidia-nccl-cu12==2.18.1
    nvidia-nccl-cu13==2.32.3
    nvidia-nvshmem-cu12==3.3.9
    nvidia-nvshmem-cu13==3.8.0
)

# What candle (candle-lessons/, probes/frameworks/) links besides the driver: the CUDA 13.0 wheels
# the GPU machine's cuda-toolkit 13.0.2 pins (`cuda-toolkit[cublas,curand,nvrtc]==13.0.2`).
CANDLE_WHEELS=(
    nvidia-cublas==13.1.0.3
    nvidia-curand==10.4.0.35
    nvidia-cuda-nvrtc==13.0.88
)

say() { printf 'dev.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root to run: $* (install these packages, or run as root)"; fi
}

have_libclang() {
    # bindgen needs libclang itself and clang's resource headers (stddef.h, …). libclang-cpp, which
    # some images carry without the rest, is not enough.
    { compgen -G '/usr/lib/llvm-*/lib/libclang.so*' || compgen -G '/usr/lib/*/libclang-[0-9]*.so*' \
        || [ -n "${LIBCLANG_PATH:-}" ]; } >/dev/null \
        && compgen -G '/usr/lib/llvm-*/lib/clang/*/include/stddef.h' >/dev/null
}

setup_system() {
    local pkgs=()
    have_libclang || pkgs+=(libclang-dev)
    command -v c++ >/dev/null || pkgs+=(g++)
    command -v cc >/dev/null || pkgs+=(gcc)
    command -v python3 >/dev/null || pkgs+=(python3)
    python3 -m pip --version >/dev/null 2>&1 || pkgs+=(python3-pip)
    [ -e /etc/ssl/certs/ca-certificates.crt ] || pkgs+=(ca-certificates)
    [ ${#pkgs[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "missing ${pkgs[*]} and no apt-get to install them"
    say "installing Debian packages: ${pkgs[*]}"
    local log; log=$(mktemp)
    if ! { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; } >"$log" 2>&1; then
        die "apt-get could not install ${pkgs[*]}: $(grep -E '^(E|W):' "$log" | head -1 || tail -1 "$log")"
    fi
    rm -f "$log"
}

setup_rust() {
    command -v cargo >/dev/null && return 0
    [ -x "$HOME/.cargo/bin/cargo" ] && { export PATH="$HOME/.cargo/bin:$PATH"; return 0; }
    command -v curl >/dev/null || as_root apt-get install -y -qq curl >/dev/null
    say "installing the Rust toolchain with rustup"
    curl -sSf https://sh.rustup.rs | sh -s -- -y -q --profile minimal --component clippy,rustfmt >/dev/null \
        || die "could not install Rust with rustup (https://rustup.rs)"
    export PATH="$HOME/.cargo/bin:$PATH"
}

setup_wheels() {
    local stamp=$PREFIX/py/.gpucomm-wheels want
    want=$(printf '%s\n' "${WHEELS[@]}")
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
    say "installing the pinned NVIDIA wheels into .deps/py (about 370 MB download)"
    rm -rf "$PREFIX/py"
    mkdir -p "$PREFIX"
    local log; log=$(mktemp)
    if ! python3 -m pip install --disable-pip-version-check --no-input -q --no-deps --target "$PREFIX/py" "${WHEELS[@]}" >"$log" 2>&1; then
        local why; why=$(grep -E 'ERROR|Error|error' "$log" | tail -1)
        rm -rf "$PREFIX/py"
        die "could not install the NVIDIA wheels from the package index: ${why:-$(tail -1 "$log")} (network access to PyPI, or PIP_INDEX_URL, is needed)"
    fi
    rm -f "$log"
    printf '%s\n' "${WHEELS[@]}" >"$stamp"
}

# Each RANGE_WHEELS entry nvidia-<lib>-cuNN==<version> becomes .deps/versions/<lib>-<version> with
# the wheel's include/ and its shared libraries (lib/*.so*: the library the loader opens, NVSHMEM's
# bootstrap plugins next to it); device libraries and the wheel itself are not kept. One wheel at a
# time, without pip's cache, so at most one wheel (~300 MB) lies on disk besides the result.
setup_range_wheels() {
    local dir=$PREFIX/versions want
    want=$(printf '%s\n' "${RANGE_WHEELS[@]}")
    [ -f "$dir/.gpucomm-wheels" ] && [ "$(cat "$dir/.gpucomm-wheels")" = "$want" ] && return 0
    say "fetching the oldest and newest supported NCCL/NVSHMEM releases into .deps/versions (about 820 MB download)"
    rm -rf "$dir"
    mkdir -p "$dir"
    local wheel tmp log
    tmp=$(mktemp -d)
    log=$tmp/pip.log
    for wheel in "${RANGE_WHEELS[@]}"; do
        if ! python3 -m pip download --disable-pip-version-check --no-input -q --no-deps --no-cache-dir \
            --only-binary=:all: -d "$tmp/whl" "$wheel" >"$log" 2>&1; then
            local why; why=$(grep -E 'ERROR|Error|error' "$log" | tail -1)
            rm -rf "$tmp" "$dir"
            die "could not download $wheel: ${why:-$(tail -1 "$log")} (network access to PyPI, or PIP_INDEX_URL, is needed)"
        fi
        python3 - "$tmp"/whl/*.whl "$dir" <<'PY' || { rm -rf "$tmp" "$dir"; die "could not unpack $wheel"; }
import fnmatch, os, re, shutil, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
lib, version = re.match(r"nvidia_(nccl|nvshmem)_cu\d+-([^-]+)-", os.path.basename(wheel)).groups()
root, out = f"nvidia/{lib}/", os.path.join(dest, f"{lib}-{version}")
with zipfile.ZipFile(wheel) as z:
    for member in z.infolist():
        rel = member.filename[len(root):] if member.filename.startswith(root) else None
        if member.is_dir() or not rel or rel.endswith("__init__.py"):
            continue
        if rel.startswith("include/") or fnmatch.fnmatch(rel, "lib/*.so*"):
            os.makedirs(os.path.dirname(os.path.join(out, rel)), exist_ok=True)
            with z.open(member) as src, open(os.path.join(out, rel), "wb") as dst:
                shutil.copyfileobj(src, dst)
PY
        rm -rf "$tmp/whl"
    done
    rm -rf "$tmp"
    printf '%s\n' "${RANGE_WHEELS[@]}" >"$dir/.gpucomm-wheels"
}

# candle turns on cudarc's `dynamic-linking`: its programs link -lcuda -lcublas -lcublasLt -lcurand
# -lnvrtc (and candle-kernels -lcudart) at build time, and candle-kernels' build script compiles
# .cu files with nvcc. .deps/candle/lib gets the unversioned names the linker looks for, as
# symlinks to the wheels' versioned libraries (the runtime's from .deps/py), and libcuda.so: a stub
# generated from cuda.h (tools/libcuda-stub.py), soname libcuda.so.1, for machines without the
# driver. It is only on the link search path (CUDA_TOOLKIT_ROOT_DIR, which cudarc's build script
# reads), never on a run-time path: on the GPU machine the driver's libcuda.so.1 is loaded.
setup_candle() {
    local dir=$PREFIX/candle want
    want=$(printf '%s\n' "${CANDLE_WHEELS[@]}")
    if ! { [ -f "$dir/.gpucomm-wheels" ] && [ "$(cat "$dir/.gpucomm-wheels")" = "$want" ]; }; then
        say "installing the wheels candle links (cuBLAS, cuRAND, NVRTC) into .deps/candle (about 600 MB download)"
        rm -rf "$dir"
        mkdir -p "$dir"
        local log; log=$(mktemp)
        if ! python3 -m pip install --disable-pip-version-check --no-input -q --no-deps --target "$dir/py" "${CANDLE_WHEELS[@]}" >"$log" 2>&1; then
            local why; why=$(grep -E 'ERROR|Error|error' "$log" | tail -1)
            rm -rf "$dir"
            die "could not install candle's CUDA wheels: ${why:-$(tail -1 "$log")}"
        fi
        rm -f "$log"
        printf '%s\n' "${CANDLE_WHEELS[@]}" >"$dir/.gpucomm-wheels"
    fi
    local lib=$dir/lib cu=$PREFIX/py/nvidia/cu13
    [ -f "$lib/libcuda.so" ] && return 0
    mkdir -p "$lib"
    local so name
    for so in "$dir"/py/nvidia/cu13/lib/lib{cublas,cublasLt,curand,nvrtc}.so.* "$cu"/lib/libcudart.so.*; do
        name=$(basename "$so"); name=${name%%.so*}.so
        [ -e "$lib/$name" ] || ln -s "$so" "$lib/$name"
    done
    python3 tools/libcuda-stub.py "$cu/include" "$lib" >/dev/null || die "could not generate the libcuda.so link stub"
}

# The environment candle's build needs (exported for the cargo commands that build candle).
candle_env() {
    local cu=$PREFIX/py/nvidia/cu13
    export CUDA_TOOLKIT_ROOT_DIR=$PREFIX/candle   # cudarc's link search: $CUDA_TOOLKIT_ROOT_DIR/lib
    export NVCC=$cu/bin/nvcc                       # candle-kernels' nvcc
    export CUDA_COMPUTE_CAP=90                     # the GPU machine's H200; nothing probes nvidia-smi
    # The wheel's nvcc does not find its own headers (nvcc.profile expects a toolkit layout).
    export NVCC_APPEND_FLAGS="-I$cu/include -isystem $cu/include/cccl"
    export PATH=$cu/bin:$PATH
}

# The candle lessons: a workspace of their own (see candle-lessons/Cargo.toml), built into the
# same target/ directory. $1: test or lint.
candle_lessons() (
    candle_env
    local manifest=(--manifest-path candle-lessons/Cargo.toml --target-dir target)
    case $1 in
        test)
            # Builds the lessons (what the GPU bundle carries) and runs the library's CPU tests.
            # Their binary needs only the CUDA runtime library (candle-kernels links it), the real
            # one from the runtime wheel; nothing in them touches the driver or loads libcuda.
            cargo build "${manifest[@]}" --examples
            LD_LIBRARY_PATH="$PREFIX/py/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                cargo test "${manifest[@]}" --lib
            # The integration tests run candle ops on the CPU, but a binary with candle's CUDA
            # backend needs libcuda.so.1 to load: the link stub stands in (no CUDA function runs).
            local stub=$PREFIX/candle/cpu-only
            mkdir -p "$stub" && ln -sf ../lib/libcuda.so "$stub/libcuda.so.1"
            LD_LIBRARY_PATH="$stub:$PREFIX/candle/py/nvidia/cu13/lib:$PREFIX/py/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                cargo test "${manifest[@]}" --tests
            ;;
        lint)
            cargo fmt "${manifest[0]}" "${manifest[1]}" -- --check
            cargo clippy "${manifest[@]}" --all-targets -- -D warnings
            RUSTDOCFLAGS="-D warnings" cargo doc "${manifest[@]}" --no-deps -q
            ;;
    esac
)

# The framework compatibility check (probes/frameworks/): our library crates must build inside a
# candle project (candle-core / candle-nn 0.11.1, `cuda`) and inside a burn project (burn-cuda
# 0.22.1), each with ONE cudarc, and pass `cargo check`; it prints the cudarc features each graph
# resolved. Two graphs, not one: candle and burn cannot share a program (candle turns on cudarc's
# `dynamic-linking`, and burn's cubecl-cuda calls functions only `dynamic-loading` has).
frameworks_probe() (
    candle_env
    local manifest=(--manifest-path probes/frameworks/Cargo.toml) framework program versions
    for framework in candle burn; do
        # `-i cudarc` fails if two versions of cudarc are in the graph; build dependencies too.
        program=$(cargo tree "${manifest[@]}" --features "$framework" -e normal -i cudarc --depth 0 -f '{p} [{f}]')
        versions=$(cargo tree "${manifest[@]}" --features "$framework" -e normal,build -f '{p}' --prefix none \
            | grep '^cudarc ' | awk '{print $1, $2}' | sort -u)
        [ "$(printf '%s\n' "$versions" | wc -l)" = 1 ] || die "frameworks probe ($framework): several cudarc versions: $versions"
        say "frameworks probe: our crates + $framework: one cudarc: $program"
        # burn-cuda 0.22.1's build scripts (cubecl-llvm, tracel-llvm-bundler) download a prebuilt
        # LLVM from the internet, which this machine and CI cannot reach (package registries only).
        # DOCS_RS=1 is those scripts' documented switch to skip it, as on docs.rs; for our -sys
        # crates it means the committed bindings snapshots. `cargo check` links nothing: it
        # type-checks the crates together, which is the point.
        if [ "$framework" = burn ]; then
            DOCS_RS=1 cargo check "${manifest[@]}" --features "$framework" --target-dir target
        else
            cargo check "${manifest[@]}" --features "$framework" --target-dir target
        fi
        say "frameworks probe: our crates + $framework: cargo check passed"
    done
)

# Every published crate packaged as crates.io would take it and compiled from its .crate (`cargo
# package` verifies each against the packages of the others): what `cargo publish` would upload
# builds, build-script inputs (the bindings snapshots, ...) included. The library crates leave
# cudarc's CUDA version to the program, and a package is built alone: name the GPU machine's.
package() {
    local unpublished ours home=${CARGO_HOME:-$HOME/.cargo}
    unpublished=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys
print(" ".join("--exclude " + p["name"] for p in json.load(sys.stdin)["packages"] if p.get("publish") == []))')
    # Verification builds each package against the others' new .crate files through a local
    # registry. Cargo takes a registry crate of a given version as immutable: it never refreshes
    # its unpacked copy ($CARGO_HOME/registry/src/-<hash>/) nor rebuilds its artifacts (target/),
    # so a second run would check against the first run's sources. Drop both for our crates.
    ours=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys
print(" ".join(p["name"] + "-" + p["version"] for p in json.load(sys.stdin)["packages"] if p.get("publish") != []))')
    for dir in $ours; do
        rm -rf "$home"/registry/src/-*/"$dir" target/debug/.fingerprint/"${dir%-*}"-*
    done
    # shellcheck disable=SC2086 # one word per flag
    CUDARC_CUDA_VERSION=13000 cargo package --workspace $unpublished --allow-dirty
}

# The minimum supported Rust version (workspace.package.rust-version): the published library
# crates are checked with that toolchain, which rustup installs once (minimal profile). Where it
# cannot be fetched (a machine that reaches package registries only), the check says so and falls
# back to what needs no second toolchain: no dependency of the library crates asks for a newer
# Rust (tools/msrv-deps.py); clippy's incompatible_msrv lint, in `lint`, checks the code's uses of
# the standard library against rust-version.
msrv() {
    local version libs=(build-support nccl-sys nvshmem-sys nccl-rs nvshmem gpucomm-ordering
        gpucomm-launch gpucomm-kernels)
    version=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml | head -1)
    [ -n "$version" ] || die "no rust-version in Cargo.toml"
    cargo metadata --format-version 1 | python3 tools/msrv-deps.py "$version" "${libs[@]}" \
        || die "MSRV: dependencies of the library crates need a Rust newer than $version (above)"
    if ! rustup toolchain list 2>/dev/null | grep -q "^$version-" \
        && ! timeout 600 rustup toolchain install "$version" --profile minimal >/dev/null 2>&1; then
        say "MSRV: Rust $version cannot be installed here (no rustup, or no access to its releases):" \
            "checked the dependencies' rust-version only, not the code with Rust $version"
        return 0
    fi
    say "MSRV: checking the library crates with Rust $version"
    local packages=()
    for lib in "${libs[@]}"; do packages+=(-p "$lib"); done
    CUDARC_CUDA_VERSION=13000 cargo "+$version" check --target-dir target/msrv "${packages[@]}"
}

setup() {
    setup_system
    setup_rust
    setup_wheels
    export GPUCOMM_PREFIX=$PREFIX
}

bundle() {
    setup
    setup_candle
    candle_env
    bash tools/bundle.sh
}

cmd=${1:-}
shift || true
case "$cmd" in
    setup) setup; setup_range_wheels; setup_candle ;;
    run) setup; exec cargo run -q -p examples --example 01-hello -- "$@" ;;
    test)
        setup
        setup_range_wheels
        setup_candle
        cargo test --workspace "$@"
        # The whole run (no test filter): also the MSRV check, the candle lessons, the framework
        # probe, packaging.
        if [ $# -eq 0 ]; then
            msrv
            candle_lessons test
            frameworks_probe
            package
        fi
        ;;
    lint)
        setup
        setup_candle
        cargo fmt --all -- --check
        cargo clippy --workspace --all-targets -- -D warnings
        RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q
        candle_lessons lint
        ;;
    bundle) bundle ;;
    *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
