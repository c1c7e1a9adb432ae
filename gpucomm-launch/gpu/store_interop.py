#!/usr/bin/env python3
"""gpucomm's TCPStore against PyTorch's, both ways; needs PyTorch, no GPU.

    python3 store_interop.py PATH/TO/store-interop

1. PyTorch's client (`TCPStore(host, port, is_master=False)`) against gpucomm's server
   (`store-interop serve`): set, get, add, compare_set, check, wait (also one that times out),
   multi_set/multi_get, delete_key, num_keys, append.
2. gpucomm's client (`store-interop client`) against PyTorch's server
   (`TCPStore(..., is_master=True)`), once with `use_libuv=True` (the default backend) and once
   with `use_libuv=False` (the older one, when this PyTorch still has it), each side checking
   what the other wrote.

Prints one line per check and, last, `store interop: N passed, N failed, N skipped`; exits 1 if
anything failed.
"""
import socket
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

BIN = sys.argv[1] if len(sys.argv) > 1 else "store-interop"
TIMEOUT = timedelta(seconds=10)
results = {"passed": 0, "failed": 0, "skipped": 0}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(what, got, expected):
    if got == expected:
        print(f"  ok {what}: {got!r}")
        return True
    print(f"  FAILED {what}: got {got!r}, expected {expected!r}")
    raise AssertionError(what)


def section(name, body):
    print(f"== {name}")
    try:
        outcome = body()
    except Exception as error:  # noqa: BLE001 - every failure is reported and counted
        print(f"FAIL {name}: {type(error).__name__}: {error}")
        results["failed"] += 1
        return
    if outcome == "skipped":
        results["skipped"] += 1
    else:
        print(f"ok {name}")
        results["passed"] += 1


def torch_client_vs_gpucomm_server():
    port = free_port()
    server = subprocess.Popen([BIN, "serve", str(port), "60"], stdout=subprocess.PIPE, text=True)
    try:
        print("  " + server.stdout.readline().strip())
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
        store.set("a", "1")
        check("set/get", store.get("a"), b"1")
        check("add", store.add("n", 5), 5)
        check("add again", store.add("n", -2), 3)
        check("get of an added key", store.get("n"), b"3")
        check("compare_set on a missing key", store.compare_set("c", "", "first"), b"first")
        check("compare_set, key present, empty expected", store.compare_set("c", "", "second"), b"first")
        check("compare_set with the right expected", store.compare_set("c", "first", "third"), b"third")
        check("check of present keys", store.check(["a", "n"]), True)
        check("check with a missing key", store.check(["a", "missing"]), False)
        store.wait(["a", "c"])
        check("wait for present keys", True, True)
        started = time.monotonic()
        try:
            store.wait(["missing"], timedelta(milliseconds=300))
            timed_out = False
        except Exception:  # noqa: BLE001 - PyTorch raises its store error on a wait timeout
            timed_out = True
        check("wait that times out (CANCEL_WAIT)", (timed_out, time.monotonic() - started < 5), (True, True))
        check("the connection is in step after the cancel", store.get("c"), b"third")
        store.multi_set(["m1", "m2"], ["x", ""])
        check("multi_set/multi_get", store.multi_get(["m1", "m2", "a"]), [b"x", b"", b"1"])
        store.append("p", "ab")
        store.append("p", "cd")
        check("append", store.get("p"), b"abcd")
        check("num_keys", store.num_keys(), 6)
        check("delete_key", store.delete_key("m1"), True)
        check("delete_key of a missing key", store.delete_key("m1"), False)
        check("num_keys after delete", store.num_keys(), 5)
        store.set("interop/stop", "1")
        out, _ = server.communicate(timeout=20)
        print("  " + out.strip().replace("\n", "\n  "))
        check("server exit status", server.returncode, 0)
    finally:
        if server.poll() is None:
            server.kill()


def gpucomm_client_vs_torch_server(use_libuv):
    port = free_port()
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=TIMEOUT, use_libuv=use_libuv)
    except Exception as error:  # noqa: BLE001 - an older or newer PyTorch may lack a backend
        print(f"  skipped: this PyTorch cannot start a TCPStore with use_libuv={use_libuv}: {error}")
        return "skipped"
    backend = getattr(store, "libuvBackend", "unknown")
    print(f"  PyTorch server started, libuvBackend={backend}")
    if backend is not use_libuv and backend != "unknown":
        print(f"  skipped: asked for use_libuv={use_libuv}, PyTorch started libuvBackend={backend}")
        return "skipped"
    store.set("py/greeting", b"hello from python")
    run = subprocess.run([BIN, "client", "127.0.0.1", str(port)], capture_output=True, text=True, timeout=60)
    print("  " + run.stdout.strip().replace("\n", "\n  "))
    if run.returncode != 0:
        print("  " + run.stderr.strip())
    check("gpucomm client exit status", run.returncode, 0)
    check("Python reads the key Rust set", store.get("rust/greeting"), b"hello from rust")
    check("Python reads the counter Rust added to", store.get("rust/counter"), b"42")
    check("Python reads the value Rust compare-set", store.get("rust/cas"), b"v3")
    return None


if __name__ == "__main__":
    print(f"torch {torch.__version__}, store-interop at {BIN}")
    section("PyTorch TCPStore client vs gpucomm StoreServer", torch_client_vs_gpucomm_server)
    section("gpucomm StoreClient vs PyTorch TCPStore server (use_libuv=True)", lambda: gpucomm_client_vs_torch_server(True))
    section("gpucomm StoreClient vs PyTorch TCPStore server (use_libuv=False)", lambda: gpucomm_client_vs_torch_server(False))
    print(f"store interop: {results['passed']} passed, {results['failed']} failed, {results['skipped']} skipped")
    sys.exit(1 if results["failed"] else 0)
