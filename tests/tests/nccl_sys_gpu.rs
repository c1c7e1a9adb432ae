//! Smoke test of the raw bindings on real GPUs: `ncclCommInitAll` over two GPUs in one process and
//! one grouped `ncclAllReduce` of known values, checked on both ranks. Only `nccl-sys` calls (plus
//! cudarc for memory), so a failure here is a binding problem, not a safe-layer one.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::{DevicePtr, DevicePtrMut};
use gpucomm_tests::require_gpus;
use nccl_sys::{function, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

const COUNT: usize = 1 << 20;

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn raw_init_all_and_grouped_all_reduce() {
    let Some(streams) = require_gpus("raw_init_all_and_grouped_all_reduce", 2) else { return };
    let lib = nccl_sys::library().unwrap();
    println!("NCCL {} from {}", lib.version(), lib.path().display());
    let ok = ncclResult_t::ncclSuccess;

    let mut comms: [ncclComm_t; 2] = [ptr::null_mut(); 2];
    let devs = [0i32, 1];
    streams[0].context().bind_to_thread().unwrap();
    // SAFETY: room for two communicators, two distinct device ordinals.
    assert_eq!(unsafe { function!(lib, ncclCommInitAll).unwrap()(comms.as_mut_ptr(), 2, devs.as_ptr()) }, ok);

    // Rank r contributes r + 1 everywhere, so every element of the sum is 3.
    let sends: Vec<_> =
        streams.iter().enumerate().map(|(r, s)| s.clone_htod(&vec![(r + 1) as f32; COUNT]).unwrap()).collect();
    let mut recvs: Vec<_> = streams.iter().map(|s| s.alloc_zeros::<f32>(COUNT).unwrap()).collect();
    let all_reduce = function!(lib, ncclAllReduce).unwrap();
    // SAFETY: a group issued from this thread; every buffer holds COUNT floats on its rank's device
    // and outlives the stream synchronisation below.
    unsafe {
        assert_eq!(function!(lib, ncclGroupStart).unwrap()(), ok);
        for r in 0..2 {
            let (src, _s) = sends[r].device_ptr(&streams[r]);
            let (dst, _d) = recvs[r].device_ptr_mut(&streams[r]);
            let stream = streams[r].cu_stream() as nccl_sys::cudaStream_t;
            let rc = all_reduce(
                src as *const c_void,
                dst as *mut c_void,
                COUNT,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                comms[r],
                stream,
            );
            assert_eq!(rc, ok);
        }
        assert_eq!(function!(lib, ncclGroupEnd).unwrap()(), ok);
    }
    for (r, s) in streams.iter().enumerate() {
        let host = s.clone_dtoh(&recvs[r]).unwrap();
        assert!(host.iter().all(|&v| v == 3.0), "rank {r}: first wrong value {:?}", host.iter().find(|&&v| v != 3.0));
        println!("rank {r}: {COUNT} elements all 3.0");
    }
    for c in comms {
        // SAFETY: each communicator is live and destroyed once.
        assert_eq!(unsafe { function!(lib, ncclCommDestroy).unwrap()(c) }, ok);
    }
    drop(recvs);
}
