#!/usr/bin/env python3
"""Lesson 16's Python half: a "trainer" that broadcasts its weights to a Rust inference server
over one NCCL communicator (CuPy's cupy.cuda.nccl), meeting it at a TCPStore.

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 python3 weight_sync_trainer.py [--host-store] [--device N]

Without --host-store it joins the store the Rust side hosts (TCPStore(is_master=False)) and reads
the NCCL unique id from it; with --host-store it hosts the store (is_master=True) and creates
the id. It is rank 1 of 2; the Rust side (examples/examples/16-python-weight-sync.rs) is rank 0.
Each step it broadcasts COUNT float32 weights, then reads back the server's checksum and count of
wrong values (an all-reduce to which it adds zeros) and checks them. Exits 1 on a mismatch.

Needs CuPy with NCCL and PyTorch. If CuPy cannot load NCCL, preload the NVIDIA wheel's library
(see the lesson). On a one-GPU machine, run both sides on GPU 0 with different NCCL_HOSTID
values. NVLink multicast stays off: the trainer sets NCCL_NVLS_ENABLE=0 (and NVSHMEM's and
PyTorch's switches) before NCCL is loaded; on shared GPUs it can take them out of service.

Security: TCPStore has no access control; anyone who can reach the port can read the unique id.
Use a trusted network.
"""
import argparse
import os
import sys
from datetime import timedelta

# Before CuPy loads NCCL: never NVLink multicast (the Rust side sets the same for itself).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import cupy  # noqa: E402 (after the variables above)
import torch.distributed as dist  # noqa: E402
from cupy.cuda import nccl  # noqa: E402

STEPS = 3
COUNT = 1 << 20
SERVER, TRAINER = 0, 1
PATIENCE = timedelta(seconds=120)
# torch's TCPStore adds "/" in front: the Rust side sees "/weight-sync/...".
ID_KEY = "weight-sync/nccl-id"
TRAINER_DONE = "weight-sync/trainer-done"
SERVER_DONE = "weight-sync/server-done"


def weights(step):
    """Whole numbers below 2**24: exact in float32 on both sides (the Rust side's `weight`)."""
    i = cupy.arange(COUNT, dtype=cupy.int64)
    return ((i % 4096) + 4096 * step).astype(cupy.float32)


def expected_checksum(step):
    per_block = sum(range(4096))
    blocks, rest = divmod(COUNT, 4096)
    return blocks * per_block + sum(range(rest)) + 4096 * step * COUNT


def id_bytes(uid):
    """CuPy 14 returns bytes; older versions a tuple of (signed) chars."""
    return bytes(uid) if isinstance(uid, (bytes, bytearray)) else bytes(b & 0xFF for b in uid)


def communicator(raw, rank):
    """NcclCommunicator from the 128 id bytes, in whichever form this CuPy takes."""
    try:
        return nccl.NcclCommunicator(2, raw, rank)
    except (TypeError, OverflowError, ValueError):
        return nccl.NcclCommunicator(2, tuple(b - 256 if b > 127 else b for b in raw), rank)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-store", action="store_true", help="host the TCPStore and create the NCCL id")
    parser.add_argument("--device", type=int, default=None, help="GPU (default: 1 if there are two, else 0)")
    args = parser.parse_args()
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29517"))
    device = args.device if args.device is not None else min(1, cupy.cuda.runtime.getDeviceCount() - 1)
    cupy.cuda.Device(device).use()

    if args.host_store:
        store = dist.TCPStore(addr, port, is_master=True, timeout=PATIENCE)
        raw = id_bytes(nccl.get_unique_id())
        store.set(ID_KEY, raw)
        print(f"trainer: hosting the store at {addr}:{port}, NCCL id stored", flush=True)
    else:
        store = dist.TCPStore(addr, port, is_master=False, timeout=PATIENCE)
        store.wait([ID_KEY])
        raw = store.get(ID_KEY)
        print(f"trainer: joined the inference server's store at {addr}:{port} and read the NCCL id", flush=True)
    print(f"trainer: NCCL {nccl.get_version()}, GPU {device}", flush=True)
    comm = communicator(raw, TRAINER)
    stream = cupy.cuda.get_current_stream()

    all_ok = True
    for step in range(STEPS):
        w = weights(step)
        comm.broadcast(w.data.ptr, w.data.ptr, COUNT, nccl.NCCL_FLOAT32, TRAINER, stream.ptr)
        report = cupy.zeros(2, dtype=cupy.float64)
        comm.allReduce(report.data.ptr, report.data.ptr, 2, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, stream.ptr)
        stream.synchronize()
        checksum, wrong = (float(x) for x in report.get())
        expected = expected_checksum(step)
        ok = checksum == expected and wrong == 0
        all_ok &= ok
        print(
            f"trainer: step {step}: broadcast {COUNT} weights; the server reports checksum {checksum:.0f} "
            f"(expected {expected}) and {int(wrong)} wrong -> {'ok' if ok else 'MISMATCH'}",
            flush=True,
        )
        if wrong > 0:
            # The server stops at a step where it received wrong values (it returns an error): the
            # next broadcast would wait for it for ever.
            comm.abort()
            print("trainer: stopping, since the server stops after wrong values", flush=True)
            return 1
    comm.destroy()

    store.set(TRAINER_DONE, "checksums confirmed" if all_ok else "checksum mismatch")
    store.wait([SERVER_DONE])
    if all_ok:
        print(f"trainer: {STEPS} weight syncs, values checked on both sides", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
