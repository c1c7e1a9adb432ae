#!/usr/bin/env bash
# Builds the GPU bundle into bundle/ (git-ignored): every test binary of the `tests`
# package (each file in tests/tests/ is a GPU suite), every lesson (example) and measuring program
# (bench) of `examples`, the candle lessons (candle-lessons/, a workspace of its own, built
# with candle's CUDA environment: ./dev.sh bundle sets it), and the `gpucomm` tool when the
# workspace has it, all stripped, plus
# bundle/run.sh (tools/gpu-run.sh) with bundle/lib.sh and bundle/sanitize.sh, bundle/examples.tsv,
# which says how run.sh starts each lesson and bench, and bundle/lessons.tsv, what each needs (GPUs,
# sanitizer tools). Nothing here lists test, lesson or bench names: cargo's JSON output says what
# was built (lessons into bundle/examples/, benches into bundle/benches/), and their launch modes,
# minimum GPUs and sanitizer tools come from `[package.metadata.bundle]` in examples/Cargo.toml and
# candle-lessons/Cargo.toml, keyed by target name.
# Called by `./dev.sh bundle`. Prints the bundle's size and the build time.
set -euo pipefail
cd "$(dirname "$0")/.."
# Nothing here touches a GPU, but keep the safety settings in force for anything started from here.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
start=$(date +%s)
rm -rf bundle
mkdir -p bundle/tests bundle/examples bundle/benches bundle/bin

# The lessons and measuring programs, and the launch crate's store-interop example (for
# bundle/store-interop.sh) and barrier-skew (how far apart two ranks leave a barrier: no GPU).
bins=(-p examples --examples --benches -p gpucomm-launch --example store-interop --example barrier-skew)
cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; sys.exit(0 if any(p["name"]=="gpucomm" for p in json.load(sys.stdin)["packages"]) else 1)' \
    && bins+=(-p gpucomm --bins)
candle=(--manifest-path candle-lessons/Cargo.toml --target-dir target)
{
    cargo test --profile bundle --no-run --message-format=json -p tests --tests
    cargo build --profile bundle --message-format=json "${bins[@]}"
    if [ -f candle-lessons/Cargo.toml ]; then
        cargo build --profile bundle --message-format=json "${candle[@]}" --examples
    fi
} | python3 -c '
import json, os, shutil, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    kind = msg["target"]["kind"][0]
    # `--benches` also builds the binaries of each selected package as bench harnesses (kind "bin",
    # the same name): only the real program goes to bundle/bin, whichever finishes last.
    if kind == "bin" and msg["profile"]["test"]:
        continue
    folder = {"test": "tests", "example": "examples", "bench": "benches", "bin": "bin"}.get(kind)
    if folder:
        name = msg["target"]["name"]
        dest = f"bundle/{folder}/{name}"
        shutil.copy(msg["executable"], dest)
        print(f"{folder[:-1]:8} {dest}")
'
# The GPU scripts drive bundle/bin/gpucomm: make sure it is the program (it answers --version).
if [ -e bundle/bin/gpucomm ] && ! bundle/bin/gpucomm --version 2>/dev/null | grep -q '^gpucomm '; then
    echo "bundle/bin/gpucomm is not the gpucomm program (it does not answer --version)" >&2
    exit 1
fi
# How run.sh starts each lesson and bench (bundle/examples.tsv: one line per (target, mode), the
# arguments after the mode) and what each needs (bundle/lessons.tsv: one line per target, its
# minimum number of GPUs and the sanitizer tools of `run.sh --sanitize`, comma-separated), from the
# metadata of both workspaces (one JSON document per line); bundle/sanitize-args.tsv: the arguments
# the `--sanitize` mode gives a target in place of its run's (`[package.metadata.bundle.sanitize-args]`).
{
    cargo metadata --no-deps --format-version 1
    if [ -f candle-lessons/Cargo.toml ]; then
        cargo metadata --no-deps --format-version 1 --manifest-path candle-lessons/Cargo.toml
    fi
} | python3 -c '
import json, sys
lessons = ("examples", "candle-lessons")
with open("bundle/examples.tsv", "w") as runs_out, open("bundle/lessons.tsv", "w") as needs_out, \
        open("bundle/sanitize-args.tsv", "w") as sanitize_out:
    for line in sys.stdin:
        for pkg in json.loads(line)["packages"]:
            if pkg["name"] not in lessons:
                continue
            conf = (pkg.get("metadata") or {}).get("bundle") or {}
            runs, args = conf.get("runs", {}), conf.get("args", {})
            gpus, tools = conf.get("min-gpus", {}), conf.get("sanitizers", {})
            sanitize_args = conf.get("sanitize-args", {})
            programs = (t["name"] for t in pkg["targets"] if {"example", "bench"} & set(t["kind"]))
            for t in sorted(programs):
                for mode in runs.get(t, ["spawner"]):
                    runs_out.write("\t".join([t, mode] + args.get(t, [])) + "\n")
                needs_out.write("\t".join([t, str(int(gpus.get(t, 1))), ",".join(tools.get(t, ["memcheck"]))]) + "\n")
                if t in sanitize_args:
                    sanitize_out.write("\t".join([t] + sanitize_args[t]) + "\n")
'
cp tools/gpu-run.sh bundle/run.sh
cp tools/gpu-lib.sh bundle/lib.sh
cp tools/gpu-sanitize.sh bundle/sanitize.sh
cp tools/gpu-nccl-tests.sh tools/gpu-custom-bench.sh tools/custom-vs-nccl-tests.py tools/gpu-host-cost.sh \
    tools/host-cost-summary.py bundle/
cp tools/variants-table.py tools/dispatch-vs-nccl-tests.py bundle/
cp tools/gpu-candle.sh tools/candle-loss-plot.py bundle/
cp gpucomm/gpu/*.sh bundle/
# The store's interop check against PyTorch, and lesson 16's Python half.
cp gpucomm-launch/gpu/store-interop.sh gpucomm-launch/gpu/store_interop.py bundle/
mkdir -p bundle/python && cp examples/python/*.py bundle/python/
chmod +x bundle/*.sh
# The reference benchmark's source, built on the GPU machine for side-by-side runs.
if compgen -G '../shared/ref/nccl-tests-*.tar.gz' >/dev/null; then
    mkdir -p bundle/ref && cp ../shared/ref/nccl-tests-*.tar.gz bundle/ref/
fi
# The device tool carries at most 64 MiB: the bundle travels as one xz archive (the candle lessons
# alone are ~45 MiB each before compression).
mkdir -p bundle-carry
tar -cf - bundle | xz -T0 -6 >bundle-carry/bundle.tar.xz
# The first device command of a session, outside the archive that it unpacks.
cp tools/gpu-first-call.sh bundle-carry/first-call.sh
end=$(date +%s)
echo "bundle: $(du -sh bundle | cut -f1) in $(find bundle -type f | wc -l) files, carried as" \
    "bundle-carry/bundle.tar.xz ($(du -sh bundle-carry/bundle.tar.xz | cut -f1)); built in $((end - start)) s"
