#!/usr/bin/env bash
# Builds the GPU bundle: every GPU test binary and example, stripped, into bundle/ (git-ignored),
# with bundle/run.sh (a copy of tools/gpu-run.sh) that runs them on the GPU machine.
# Called by `./dev.sh bundle`. Prints the bundle's size and the build time.
set -euo pipefail
cd "$(dirname "$0")/.."
# Nothing here touches a GPU, but keep the safety settings in force for anything started from here.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
start=$(date +%s)
rm -rf bundle
mkdir -p bundle/tests bundle/examples

# Test binaries: the GPU suites of the tests crate and the library-loading tests of the -sys
# crates (the latter check that the GPU machine's wheels are found through python3).
cargo test --profile bundle --no-run --message-format=json -p gpucomm-tests -p nccl-sys -p nvshmem-sys --tests 2>/dev/null \
    | python3 -c '
import json, sys, shutil, os
# workspace folder -> test targets to keep (None: all)
wanted = {
    "tests": {"nccl_sys_gpu", "nvshmem_sys_gpu", "nccl_gpu", "nvshmem_gpu"},
    "nccl-sys": {"load"},
    "nvshmem-sys": {"load"},
}
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    pkg = os.path.basename(os.path.dirname(msg["manifest_path"]))
    name = msg["target"]["name"]
    if name in wanted.get(pkg, set()):
        dest = f"bundle/tests/{pkg}--{name}"
        shutil.copy(msg["executable"], dest)
        print("test binary:", dest)
'
cargo build --profile bundle -q -p gpucomm-examples --examples
for f in examples/*.rs; do
    name=$(basename "$f" .rs)
    cp "target/bundle/examples/$name" bundle/examples/
done
cp tools/gpu-run.sh bundle/run.sh
chmod +x bundle/run.sh
end=$(date +%s)
echo "bundle: $(du -sh bundle | cut -f1) in $(find bundle -type f | wc -l) files; built in $((end - start)) s"
