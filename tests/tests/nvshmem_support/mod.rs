//! What the nvshmem suites share: how many PEs to run, starting a runtime, and the kernels that
//! `build.rs` compiled. Included by each `nvshmem_*.rs` suite with `mod nvshmem_support;`.
#![allow(dead_code)]

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;
use gpucomm_launch::{Options, RankInfo, Rendezvous};
use nvshmem::Runtime;

/// The images `build.rs` compiled.
mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// Plain kernels: `copy_ints(const int *src, int *out, int n)`,
/// `fill_slowly(int *buf, int n, int base, long long spin)`.
pub const PLAIN: &[u8] = kernels::PLAIN;
/// NVSHMEM kernels, device-linked: lesson 11's `ring_put(int *inbox, const int *mine, int n,
/// int *errors)` (collective launch) and `ring_put_plain(int *dst, const int *src, int n)`.
pub const RING: &[u8] = kernels::NVSHMEM_KERNELS;
/// The plain kernels for other GPUs only (sm_80 and sm_100, no PTX).
pub const OTHER_ARCH: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/other_arch.fatbin"));

/// PEs per test: every GPU of the machine, at least 2.
pub fn pes() -> usize {
    gpucomm_tests::device_count().max(2)
}

/// Starts NVSHMEM on this rank through the rendezvous, which stays usable for other ids.
pub fn start(info: &RankInfo, stream: &Arc<CudaStream>) -> (Rendezvous, Runtime) {
    let mut rdzv = Rendezvous::connect(info, &Options::from_env().unwrap()).unwrap();
    let rt = Runtime::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
    assert_eq!((rt.my_pe(), rt.n_pes()), (info.rank, info.world_size));
    (rdzv, rt)
}

/// A kernel of the plain module, loaded through cudarc.
pub fn plain_kernel(ctx: &Arc<CudaContext>, name: &str) -> CudaFunction {
    ctx.load_module(Ptx::from_binary(PLAIN.to_vec())).unwrap().load_function(name).unwrap()
}

/// A one-dimensional launch of `blocks` blocks of 256 threads.
pub fn grid(blocks: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// The value PE `pe` writes at index `i`.
pub fn value(pe: usize, i: usize) -> i32 {
    (pe as i32 + 1) * 1_000_000 + i as i32
}

/// A put to the next PE and a barrier, checked: the runtime still works, and the symmetric heaps
/// are in step (a buffer allocated now, put by each PE into the next one's, holds the previous
/// PE's values on every PE).
pub fn ring_still_works(rt: &Runtime, stream: &Arc<CudaStream>, what: &str) {
    let (me, n) = (rt.my_pe(), rt.n_pes());
    let buf = rt.alloc::<i32>(1000).unwrap();
    let src = stream.clone_htod(&(0..1000).map(|i| value(me, i)).collect::<Vec<_>>()).unwrap();
    rt.put_on_stream(&buf, &src, (me + 1) % n, stream).unwrap();
    rt.barrier_all_on_stream(stream).unwrap();
    let prev = (me + n - 1) % n;
    assert_eq!(stream.clone_dtoh(&buf).unwrap(), (0..1000).map(|i| value(prev, i)).collect::<Vec<_>>(), "{what}");
    buf.free().map_err(|(_, e)| e).unwrap();
}
