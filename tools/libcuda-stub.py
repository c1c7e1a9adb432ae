#!/usr/bin/env python3
"""Writes a stand-in for the NVIDIA driver library: OUT_DIR/libcuda.so, soname libcuda.so.1.

Two uses:

* **Link time** (no third argument). Programs built with cudarc's `dynamic-linking` (candle turns it
  on) link `-lcuda`. A machine without the NVIDIA driver (CI, a build host) has no libcuda.so, so the
  link fails although nothing there runs the program. The linker records the soname; at run time the
  dynamic loader finds the driver's own libcuda.so.1 (on the GPU machine in
  /usr/local/nvidia/lib64), never this file, which lives only in the build's link search path
  (`.deps/candle/lib`) and is never put on LD_LIBRARY_PATH or an rpath.
* **Run time on a CPU** (third argument: a C file that implements some functions, e.g.
  tools/cpu-standins/driver.c). tools/host-instructions.sh loads the result in place of the driver
  to count the crates' host instructions under callgrind.

The library exports every function cuda.h declares, under the names the header's version macros
give them (cuCtxCreate_v4, cuMemAlloc_v2, …) and under the plain names. Those the C file does not
implement return CUDA_ERROR_NOT_SUPPORTED and name themselves on stderr.

Usage: libcuda-stub.py CUDA_INCLUDE_DIR OUT_DIR [IMPLEMENTED.c]
"""
import os
import re
import subprocess
import sys
import tempfile

include, out = sys.argv[1], sys.argv[2]
implemented = open(sys.argv[3], encoding="utf-8").read() if len(sys.argv) > 3 else ""
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
        f.write("/* Stand-in for libcuda.so.1, written by tools/libcuda-stub.py. */\n#include <stdio.h>\n")
        f.write(implemented)
        defined = set(re.findall(r"\bCUresult\s+(cu[A-Za-z0-9_]+)\s*\(", implemented))
        for name in sorted(names - defined):
            f.write(f'int {name}(void) {{ fputs("driver stand-in: {name} is not implemented\\n", stderr); return 801; }}\n')
    lib = os.path.join(out, "libcuda.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, "-Wl,-soname,libcuda.so.1", src], check=True)
print(f"libcuda-stub: {len(names)} functions from {header} -> {lib}")
