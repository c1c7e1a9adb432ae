#!/usr/bin/env python3
"""The dependencies of the library crates that need a newer Rust than ours.

Reads `cargo metadata` (with the resolve) from stdin. Walks the normal and build dependencies of
the crates named on the command line, and prints each package whose `rust-version` is above the
workspace's (the first argument); exits 1 if there is any. The part of the MSRV check that needs
no second toolchain: `./dev.sh test` runs it when Rust <rust-version> cannot be installed.

    cargo metadata --format-version 1 | python3 tools/msrv-deps.py 1.88 nccl-rs nvshmem ...
"""
import json
import sys


def version(text):
    return tuple(int(part) for part in text.split(".")) + (0,) * (3 - len(text.split(".")))


def main():
    msrv, roots = version(sys.argv[1]), set(sys.argv[2:])
    meta = json.load(sys.stdin)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    todo = [pid for pid, p in packages.items() if p["name"] in roots and pid in nodes]
    seen = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for dep in nodes[pid]["deps"]:
            if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]):
                todo.append(dep["pkg"])
    newer = sorted(
        f'{packages[p]["name"]} {packages[p]["version"]} needs Rust {packages[p]["rust_version"]}'
        for p in seen
        if packages[p].get("rust_version") and version(packages[p]["rust_version"]) > msrv
    )
    for line in newer:
        print(line)
    print(f"{len(seen)} packages in the library crates' graph; {len(newer)} need a Rust newer than {sys.argv[1]}")
    return 1 if newer else 0


if __name__ == "__main__":
    sys.exit(main())
