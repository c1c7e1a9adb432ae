#!/usr/bin/env python3
"""How many calls a callgrind profile records into the CUDA driver from outside it.

    python3 tools/driver-calls.py callgrind.out

tools/host-instructions.sh runs each path under callgrind against the CPU stand-in for the driver
(target/cpu-standins/libcuda.so*) and takes the difference between a run with 0 calls and one with
N: the driver calls one safe call makes beyond the raw one (the capture query, a stream wait, an
event record...), which the instruction counts do not show and which cost tens of nanoseconds each
on the GPU machine. Prints one number: the calls from any other object into that library.
"""

import re
import sys

NAMED = re.compile(r"^(c?ob)=\((\d+)\)(?: (.*))?$")


def driver_calls(path):
    names = {}
    ob = cob = None
    total = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = NAMED.match(line.rstrip("\n"))
            if m:
                kind, ident, name = m.groups()
                if name:
                    names[ident] = name
                if kind == "ob":
                    ob = ident
                else:
                    cob = ident
                continue
            if line.startswith(("fn=", "fl=", "fi=", "fe=")):
                cob = None
                continue
            if line.startswith("calls="):
                callee = cob if cob is not None else ob
                cob = None
                if is_driver(names.get(callee, "")) and not is_driver(names.get(ob, "")):
                    total += int(line.split("=", 1)[1].split()[0])
    return total


def is_driver(name):
    return re.search(r"/libcuda\.so(\.\d+)*$", name) is not None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip())
        sys.exit(2)
    print(driver_calls(sys.argv[1]))
