#!/usr/bin/env python3
"""Writes a link-time stand-in for the NVIDIA driver library: OUT_DIR/libcuda.so.

Programs built with cudarc's `dynamic-linking` (candle turns it on) link `-lcuda`. A machine without
the NVIDIA driver (CI, a build host) has no libcuda.so, so the link fails although nothing there
runs the program. This stub exports every function cuda.h declares, under the names the header's
version macros give them (cuCtxCreate_v4, cuMemAlloc_v2, …) and under the plain names, each an empty
function, with the real library's soname `libcuda.so.1`. The linker records that soname; at run
time the dynamic loader finds the driver's own libcuda.so.1 (on the GPU machine in
/usr/local/nvidia/lib64), never this file, which lives only in the build's link search path
(`.deps/candle/lib`) and is never put on LD_LIBRARY_PATH or an rpath.

Usage: libcuda-stub.py CUDA_INCLUDE_DIR OUT_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

include, out = sys.argv[1], sys.argv[2]
header = os.path.join(include, "cuda.h")
text = open(header, encoding="utf-8").read()
# Plain names, as written in the header: `CUresult CUDAAPI cuMemAlloc(`.
names = set(re.findall(r"\bCUDAAPI\s+(cu[A-Za-z0-9_]+)\s*\(", text))
# Versioned names, as the preprocessor turns them (`#define cuMemAlloc cuMemAlloc_v2`).
pre = subprocess.run(["cc", "-E", "-P", "-I", include, header], check=True, capture_output=True, text=True).stdout
names |= set(re.findall(r"\bCUresult\s+(cu[A-Za-z0-9_]+)\s*\(", pre))
if len(names) < 300:
    sys.exit(f"libcuda-stub: only {len(names)} functions found in {header}; is it NVIDIA's cuda.h?")
os.makedirs(out, exist_ok=True)
with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "libcuda_stub.c")
    with open(src, "w") as f:
        f.write("/* Link-time stand-in for libcuda.so.1: never loaded (tools/libcuda-stub.py). */\n")
        for name in sorted(names):
            f.write(f"void {name}(void) {{}}\n")
    lib = os.path.join(out, "libcuda.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", lib, "-Wl,-soname,libcuda.so.1", src], check=True)
print(f"libcuda-stub: {len(names)} functions from {header} -> {lib}")
