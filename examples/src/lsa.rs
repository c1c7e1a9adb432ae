//! The host side of the LSA all-reduce kernels in `examples/kernels/lsa_allreduce.cu`, shared by
//! lessons 14–18: creating the device communicator and the staging window once, and launching the
//! one-shot and two-shot kernels with cudarc.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use nccl::device::{DevComm, DevCommRequirements};
use nccl::{Comm, MemBuffer, NcclType, Window, WindowFlags};

use crate::bench::BoxError;
use crate::kernels;

/// CTAs of a launch at most (one LSA barrier each), and threads per CTA.
pub const MAX_CTAS: u32 = 32;
const THREADS: u32 = 512;
/// Bytes of the per-CTA call counters at the start of the staging window (see the kernel).
const CTRL_BYTES: usize = 4096;
/// The largest message of the LL one-shot kernel, and the most ranks the kernels handle.
pub const LL_MAX_BYTES: usize = 64 << 10;
const MAX_PEERS: usize = 8;
/// Bytes of one LL region (one source rank, one slot): an 8-byte pair per 4-byte word.
const LL_REGION: usize = 2 * LL_MAX_BYTES;

/// An element type the kernels are compiled for (`lsa_*_sum_<suffix>`).
pub trait Element: NcclType {
    /// The kernel name suffix.
    const SUFFIX: &'static str;
}

impl Element for f32 {
    const SUFFIX: &'static str = "f32";
}
impl Element for half::bf16 {
    const SUFFIX: &'static str = "bf16";
}
impl Element for half::f16 {
    const SUFFIX: &'static str = "f16";
}

/// The test pattern of lessons 14 and 15: rank `rank` of `n` contributes (rank + 1) × (i mod 13),
/// small integers exact in every element type, so the sum is n(n + 1)/2 × (i mod 13) bit for bit.
/// Returns this rank's input and the expected sum, `count` elements each.
pub fn pattern<T>(rank: u32, n: u32, count: usize, from: impl Fn(u32) -> T) -> (Vec<T>, Vec<T>) {
    let input = (0..count as u32).map(|i| from((rank + 1) * (i % 13))).collect();
    let expected = (0..count as u32).map(|i| from(n * (n + 1) / 2 * (i % 13))).collect();
    (input, expected)
}

/// Checks a kernel's all-reduce (`ours`) against the host reference and against `ncclAllReduce`
/// (`theirs`) on the same input, naming the first wrong element; prints the verdict.
pub fn compare<T: Element + PartialEq + std::fmt::Debug>(
    rank: usize,
    algorithm: &str,
    ours: &[T],
    expected: &[T],
    theirs: &[T],
) -> Result<(), BoxError> {
    let count = ours.len();
    if let Some(i) = (0..count).find(|&i| ours.get(i) != expected.get(i)) {
        return Err(format!(
            "rank {rank}: {} × {count}: element {i} is {:?}, expected {:?}",
            T::SUFFIX,
            ours[i],
            expected.get(i)
        )
        .into());
    }
    if ours != theirs {
        return Err(format!("rank {rank}: {} × {count}: differs from ncclAllReduce", T::SUFFIX).into());
    }
    println!(
        "rank {rank}: {algorithm} {} all-reduce of {count} elements correct (matches host and ncclAllReduce)",
        T::SUFFIX
    );
    Ok(())
}

/// The kernels and what they need on one rank: a device communicator with one LSA barrier per
/// CTA, and (for one-shot) a double-buffered staging window.
pub struct LsaAllReduce<'c> {
    comm: &'c Comm,
    dev: DevComm<'c>,
    staging: Window<'c, u8>,
    max_bytes: usize,
    /// `lsa_<algorithm>_sum_<type>` for each algorithm and type, looked up once.
    kernels: Vec<(String, CudaFunction)>,
}

impl<'c> LsaAllReduce<'c> {
    /// Collective over `comm`: creates the device communicator and a staging window for one-shot
    /// messages of up to `max_bytes` bytes, and loads the kernels.
    pub fn new(comm: &'c Comm, max_bytes: usize) -> Result<Self, BoxError> {
        let dev = DevComm::new(comm, &DevCommRequirements::default().lsa_barriers(MAX_CTAS))?;
        if dev.lsa_size() != comm.size() {
            return Err(format!(
                "every rank must reach every other by loads and stores; the LSA team has {} of {} ranks",
                dev.lsa_size(),
                comm.size()
            )
            .into());
        }
        if dev.lsa_size() > 8 {
            return Err("the kernels support LSA teams of up to 8 ranks".into());
        }
        let buf = MemBuffer::<u8>::zeroed(comm.stream(), CTRL_BYTES + 2 * max_bytes + 2 * MAX_PEERS * LL_REGION)?;
        let staging = comm.register_window(buf, WindowFlags::COLL_SYMMETRIC)?;
        let module = nccl::device::load_module(comm.context(), kernels::LSA_ALLREDUCE)?;
        let mut kernels = Vec::new();
        for algorithm in ["oneshot", "twoshot", "ll"] {
            for suffix in [f32::SUFFIX, half::bf16::SUFFIX, half::f16::SUFFIX] {
                let name = format!("lsa_{algorithm}_sum_{suffix}");
                kernels.push((name.clone(), module.load_function(&name)?));
            }
        }
        Ok(LsaAllReduce { comm, dev, staging, max_bytes, kernels })
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// The staging window's memory, which every launch uses: a graph capturing a launch keeps it
    /// (and so this whole object, its device communicator and window included).
    pub fn staging(&self) -> &MemBuffer<u8> {
        self.staging.buffer()
    }

    fn kernel<T: Element>(&self, algorithm: &str) -> Result<&CudaFunction, BoxError> {
        let wanted = |name: &str| {
            name.strip_prefix("lsa_").and_then(|n| n.strip_prefix(algorithm)).and_then(|n| n.strip_prefix("_sum_"))
                == Some(T::SUFFIX)
        };
        self.kernels
            .iter()
            .find(|(name, _)| wanted(name))
            .map(|(_, f)| f)
            .ok_or_else(|| format!("no kernel lsa_{algorithm}_sum_{}", T::SUFFIX).into())
    }

    /// The launch of a message of `bytes`: one CTA of THREADS threads per `per_cta` bytes (2 KiB for LL, 8 KiB for one-shot,
    /// 64 KiB for two-shot: enough CTAs in flight to hide NVLink latency), at most MAX_CTAS.
    fn config(bytes: usize, per_cta: usize) -> LaunchConfig {
        let ctas = bytes.div_ceil(per_cta).clamp(1, MAX_CTAS as usize) as u32;
        LaunchConfig { grid_dim: (ctas, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
    }

    /// One-shot all-reduce (sum) of `send` into `recv` on `stream`: any device buffers of the
    /// communicator's device, the same length on every rank, at most `max_bytes`.
    pub fn one_shot<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<(), BoxError> {
        let count = send.len();
        let bytes = count * size_of::<T>();
        if recv.len() != count || bytes > self.max_bytes || count == 0 {
            return Err(format!(
                "one-shot: {count} → {} elements, {bytes} of at most {} bytes",
                recv.len(),
                self.max_bytes
            )
            .into());
        }
        let kernel = self.kernel::<T>("oneshot")?;
        // The staging window is used by one launch at a time: ordered on `stream` like any buffer.
        let (_, _staging) = self.staging.buffer().device_ptr(stream);
        let (src, _read) = send.device_ptr(stream);
        let (dst, _write) = recv.device_ptr_mut(stream);
        let win = self.staging.arg();
        let (base, slot) = (0usize, self.max_bytes);
        let mut launch = stream.launch_builder(kernel);
        launch.arg(self.dev.arg()).arg(&win).arg(&base).arg(&slot).arg(&src).arg(&dst).arg(&count);
        let cfg = Self::config(bytes, 8 << 10);
        // SAFETY: the kernel takes (ncclDevComm, ncclWindow_t, size_t, size_t, const T*, T*,
        // size_t), matching the arguments pushed; `send` and `recv` hold `count` elements on this
        // device and stay borrowed (their guards alive) until the launch is enqueued; the staging
        // window holds CTRL_BYTES + 2 × max_bytes ≥ CTRL_BYTES + 2 × `bytes`; the grid has at most
        // MAX_CTAS CTAs, the LSA barriers of `dev`; every rank launches the same kernel with the
        // same count and grid (the lessons call this in lockstep on every rank).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// LL one-shot all-reduce (sum) of `send` into `recv` on `stream`, for messages of at most
    /// [`LL_MAX_BYTES`]: no barrier, data and flags in 8-byte words (see the kernel).
    pub fn ll<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<(), BoxError> {
        let count = send.len();
        let bytes = count * size_of::<T>();
        if recv.len() != count || bytes > LL_MAX_BYTES || count == 0 {
            return Err(
                format!("LL: {count} → {} elements, {bytes} of at most {LL_MAX_BYTES} bytes", recv.len()).into()
            );
        }
        let kernel = self.kernel::<T>("ll")?;
        let (_, _staging) = self.staging.buffer().device_ptr(stream);
        let (src, _read) = send.device_ptr(stream);
        let (dst, _write) = recv.device_ptr_mut(stream);
        let win = self.staging.arg();
        let (base, ll_off, region) = (0usize, CTRL_BYTES + 2 * self.max_bytes, LL_REGION);
        let mut launch = stream.launch_builder(kernel);
        launch.arg(self.dev.arg()).arg(&win).arg(&base).arg(&ll_off).arg(&region).arg(&src).arg(&dst).arg(&count);
        let cfg = Self::config(bytes, 2 << 10);
        // SAFETY: the kernel takes (ncclDevComm, ncclWindow_t, size_t, size_t, size_t, const T*,
        // T*, size_t), matching the arguments pushed; `send` and `recv` hold `count` elements on this
        // device, borrowed until the launch is enqueued; the window holds the counters at 0 and
        // 2 × MAX_PEERS regions of LL_REGION bytes from `ll_off`, each room for the 8-byte pairs of
        // LL_MAX_BYTES ≥ `bytes`; the LSA team has at most MAX_PEERS ranks (checked in `new`); every
        // rank launches the same kernel with the same count and grid.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Two-shot all-reduce (sum) of `count` elements from `send` (window, element offset
    /// `send_at`) into `recv` (window, element offset `recv_at`) on `stream`.
    pub fn two_shot<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
        send: &Window<'c, T>,
        send_at: usize,
        recv: &mut Window<'c, T>,
        recv_at: usize,
        count: usize,
    ) -> Result<(), BoxError> {
        let fits = |w: &Window<'c, T>, at: usize| at.checked_add(count).is_some_and(|end| end <= w.buffer().len());
        if count == 0 || !fits(send, send_at) || !fits(recv, recv_at) {
            return Err(format!("two-shot: {count} elements do not fit the windows at {send_at} / {recv_at}").into());
        }
        let kernel = self.kernel::<T>("twoshot")?;
        // Order the windows' memory on `stream` (their trackers), then pass the handles.
        let (_, _read) = send.buffer().device_ptr(stream);
        let (_, _write) = recv.buffer().device_ptr(stream);
        let (send_win, recv_win) = (send.arg(), recv.arg());
        let (send_off, recv_off) = (send_at * size_of::<T>(), recv_at * size_of::<T>());
        let mut launch = stream.launch_builder(kernel);
        launch.arg(self.dev.arg()).arg(&send_win).arg(&send_off).arg(&recv_win).arg(&recv_off).arg(&count);
        let bytes = count * size_of::<T>();
        let cfg = Self::config(bytes, 64 << 10);
        // SAFETY: the kernel takes (ncclDevComm, ncclWindow_t, size_t, ncclWindow_t, size_t,
        // size_t), matching the arguments pushed; both windows hold the `count` elements from the
        // given offsets on every rank (same sizes on every rank: the lessons allocate them alike),
        // are borrowed until the launch is enqueued, and were ordered on `stream` above; the grid
        // has at most MAX_CTAS CTAs; every rank launches the same kernel with the same arguments.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}
