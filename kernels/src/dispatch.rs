//! The dispatching all-reduce: one object per communicator that sends each call to the fastest
//! of NCCL and this crate's kernels for its size.

use std::cell::Cell;
use std::ops::{Deref, RangeBounds};
use std::sync::Arc;

use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use nccl::{Collectives, Comm, MemBuffer, MemViewMut, NcclType, ReduceOp, Window, WindowFlags};

use crate::decide::{decide, Call, Decision, Fallback, Limits};
use crate::error::{Error, Result};
use crate::lsa::{self, CtaBytes, LsaKernels, Sizes, LL_MAX_BYTES};
use crate::table::{Mode, Path, Table};

/// How an [`AllReduce`] is set up. Every rank must pass the same options.
#[derive(Clone, Debug)]
pub struct Options {
    /// Use the kernels where they are faster (default `true`); `false` sends every call to NCCL.
    pub kernels: bool,
    /// The largest one-shot message in bytes (default 1 MiB; two slots of it are kept).
    pub one_shot_max: usize,
    /// The largest staged two-shot launch in bytes (default 32 MiB; input and output regions of
    /// it are kept; larger messages take several launches).
    pub staged_max: usize,
    /// The crossover table; `None` (default): the committed table for this machine
    /// ([`Table::builtin`]), to be replaced by [`AllReduce::calibrate`] if wanted.
    pub table: Option<Table>,
    /// The kernels' launch shapes.
    pub cta_bytes: CtaBytes,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            kernels: true,
            one_shot_max: 1 << 20,
            staged_max: 32 << 20,
            table: None,
            cta_bytes: CtaBytes::default(),
        }
    }
}

/// A size-dispatching all-reduce for one communicator: each call goes to `ncclAllReduce` or to one
/// of this crate's kernels over NCCL's device API (LL, one-shot, two-shot), whichever a crossover
/// table says is fastest for its size, eagerly or inside a CUDA graph capture. The design follows
/// vLLM's custom all-reduce for PyTorch, with every precondition checked.
///
/// * **Created once per communicator** ([`AllReduce::new`], collective): it owns the device
///   communicator and the symmetric window the kernels stage through, and loads the kernels.
/// * **Any buffers.** [`AllReduce::all_reduce`] takes cudarc's [`CudaSlice`](cudarc::driver::CudaSlice)
///   and views (what candle's CUDA tensors hold), the `nccl` crate's [`MemBuffer`] and views, on any
///   stream of the communicator's device; buffers allocated by [`AllReduce::alloc`] are
///   exchanged without copies ([`AllReduce::all_reduce_symmetric`]).
/// * **Capture-safe.** Calls enqueue work only (no synchronisation, no allocation); inside a
///   capture the table's `[graph]` section decides. Every rank must capture and replay the same
///   calls in the same order, as with NCCL.
/// * **Falls back to NCCL** where the kernels cannot help: ranks that cannot reach each other by
///   loads and stores (other nodes, a network transport), more than 8 ranks, an NCCL without the
///   device API or whose device API differs from the headers the kernels were built with,
///   element types other than f32/bf16/f16, reductions other than sum, zero elements. Each call
///   returns its [`Decision`] (path and reason), and [`AllReduce::last`] repeats it.
///
/// Every rank must make the same calls with the same counts, as for any collective; the decision
/// depends only on what every rank agrees on (the table, the size, the type, capture), so all
/// ranks take the same path. Drop it on every rank (destroying the device communicator and the
/// window is collective).
///
/// ```no_run
/// # fn demo(comm: &nccl::Comm, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> gpucomm_kernels::Result<()> {
/// use gpucomm_kernels::{AllReduce, Options};
/// let ar = AllReduce::new(comm, Options::default())?;
/// let send = stream.clone_htod(&[1.0f32; 1024])?;
/// let mut recv = stream.alloc_zeros::<f32>(1024)?;
/// let decision = ar.all_reduce(stream, &send, &mut recv, nccl::ReduceOp::SUM)?;
/// println!("4 KiB went {decision}"); // e.g. "ll (crossover table, eager)"
/// # Ok(()) }
/// ```
pub struct AllReduce<'c> {
    comm: &'c Comm,
    kernels: std::result::Result<LsaKernels<'c>, Fallback>,
    setup_error: Option<String>,
    table: Table,
    force: Option<Path>,
    last: Cell<Option<Decision>>,
}

impl std::fmt::Debug for AllReduce<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllReduce")
            .field("rank", &self.comm.rank())
            .field("kernels", &self.kernels.as_ref().map(|_| "ready"))
            .field("table", &self.table.source())
            .field("force", &self.force)
            .finish()
    }
}

impl<'c> AllReduce<'c> {
    /// Collective over `comm` (call it on every rank, outside any capture): decides whether the
    /// kernels can be used — on every rank, or on none — and if so creates their device
    /// communicator and window. Only invalid options are an error; a communicator the kernels
    /// cannot serve gives an `AllReduce` that sends everything to NCCL and says why
    /// ([`AllReduce::fallback`]).
    pub fn new(comm: &'c Comm, options: Options) -> Result<Self> {
        let sizes = Sizes { one_shot: options.one_shot_max, staged: options.staged_max };
        let local = if !options.kernels {
            Err(Fallback::Disabled)
        } else if !crate::image::COMPILED {
            Err(Fallback::NotCompiled)
        } else {
            lsa::check_team(comm)
        };
        let everyone = lsa::min_max(comm, &[u64::from(local.is_ok())], ReduceOp::MIN)?[0] == 1;
        let mut setup_error = None;
        let kernels = match local {
            Err(why) => Err(why),
            Ok(()) if !everyone => Err(Fallback::PeerCannot),
            Ok(()) => {
                lsa::agree_sizes(comm, sizes)?;
                match LsaKernels::create(comm, sizes) {
                    Ok(mut k) => {
                        k.set_cta_bytes(options.cta_bytes);
                        Ok(k)
                    }
                    Err(e) => {
                        setup_error = Some(e.to_string());
                        Err(Fallback::SetupFailed)
                    }
                }
            }
        };
        let table = match options.table {
            Some(t) => t,
            None => Table::builtin(&comm.context().name().unwrap_or_default(), comm.size()),
        };
        Ok(AllReduce { comm, kernels, setup_error, table, force: None, last: Cell::new(None) })
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// Why every call goes to NCCL, if the kernels are off for this communicator.
    pub fn fallback(&self) -> Option<Fallback> {
        self.kernels.as_ref().err().copied()
    }

    /// The error that kept the kernels from being set up on this rank
    /// ([`Fallback::SetupFailed`]).
    pub fn setup_error(&self) -> Option<&str> {
        self.setup_error.as_deref()
    }

    /// The kernels, for calling one directly.
    pub fn kernels(&self) -> Option<&LsaKernels<'c>> {
        self.kernels.as_ref().ok()
    }

    /// The crossover table in use.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Replaces the crossover table (every rank must use the same).
    pub fn set_table(&mut self, table: Table) {
        self.table = table;
    }

    /// Sends every call to `path` (`None`: back to the table), for tests and benchmarks. A
    /// forced kernel that cannot take a call makes the call fail ([`Error::Forced`]) instead of
    /// falling back. Every rank must force the same path.
    pub fn force(&mut self, path: Option<Path>) {
        self.force = path;
    }

    /// The path every call is forced to, if any ([`AllReduce::force`]).
    pub fn forced(&self) -> Option<Path> {
        self.force
    }

    /// The decision of the last call made through this object (on this thread's calls, in
    /// order), if any.
    pub fn last(&self) -> Option<Decision> {
        self.last.get()
    }

    fn limits(&self) -> std::result::Result<Limits, Fallback> {
        match &self.kernels {
            Ok(k) => Ok(Limits {
                ll: LL_MAX_BYTES,
                one_shot: k.max_bytes(Path::OneShot),
                two_shot: k.max_bytes(Path::TwoShot) > 0,
            }),
            Err(why) => Err(*why),
        }
    }

    /// The decision for `count` elements of `T` reduced with `op` in `mode`, without making a
    /// call.
    pub fn plan<T: NcclType>(&self, count: usize, op: ReduceOp, mode: Mode) -> Result<Decision> {
        let call = Call {
            bytes: count.saturating_mul(size_of::<T>()),
            unsupported_type: lsa::suffix(T::DATA_TYPE).is_none().then(lsa::type_name::<T>),
            sum: op == ReduceOp::SUM,
            mode,
        };
        decide(self.limits(), &self.table, self.force, call)
    }

    fn decide_on<T: NcclType>(&self, stream: &Arc<CudaStream>, count: usize, op: ReduceOp) -> Result<Decision> {
        let mode = match stream.capture_status()? {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Mode::Eager,
            _ => Mode::Graph,
        };
        let d = self.plan::<T>(count, op, mode)?;
        self.last.set(Some(d));
        Ok(d)
    }

    fn lsa(&self) -> Result<&LsaKernels<'c>> {
        self.kernels.as_ref().map_err(|why| Error::Unavailable(*why))
    }

    /// All-reduces `send` into `recv` (the same length) with `op` on `stream` (a stream of the
    /// communicator's device), through the path the table picks for its size. Returns the
    /// decision.
    pub fn all_reduce<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<Decision> {
        if recv.len() != send.len() {
            return Err(Error::LengthMismatch { what: "recv buffer", expected: send.len(), got: recv.len() });
        }
        let d = self.decide_on::<T>(stream, send.len(), op)?;
        match d.path {
            Path::Nccl => self.comm.on(stream).all_reduce(send, recv, op)?,
            Path::Ll => self.lsa()?.ll(stream, send, recv)?,
            Path::OneShot => self.lsa()?.one_shot(stream, send, recv)?,
            Path::TwoShot => self.lsa()?.staged(stream, send, recv)?,
        }
        Ok(d)
    }

    /// [`AllReduce::all_reduce`] with `buf` as input and output.
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<Decision> {
        let d = self.decide_on::<T>(stream, buf.len(), op)?;
        match d.path {
            Path::Nccl => self.comm.on(stream).all_reduce_in_place(buf, op)?,
            Path::Ll => self.lsa()?.ll_in_place(stream, buf)?,
            Path::OneShot => self.lsa()?.one_shot_in_place(stream, buf)?,
            Path::TwoShot => self.lsa()?.staged_in_place(stream, buf)?,
        }
        Ok(d)
    }

    /// Collective: `len` zeroed elements of `T` in a symmetric window on every rank (the same
    /// `len` everywhere, checked), for [`AllReduce::all_reduce_symmetric`]: the kernels and NCCL
    /// (its symmetric-memory kernels) read and write these buffers in the peers' memory directly,
    /// without staging copies.
    pub fn alloc<T: NcclType + cudarc::driver::ValidAsZeroBits>(&self, len: usize) -> Result<SymmetricBuffer<'c, T>> {
        let mine = [len as u64];
        let (lo, hi) = (lsa::min_max(self.comm, &mine, ReduceOp::MIN)?, lsa::min_max(self.comm, &mine, ReduceOp::MAX)?);
        if lo != mine || hi != mine {
            return Err(Error::Calibration(format!(
                "symmetric buffers must have the same length on every rank (this rank {len}, smallest {}, largest {})",
                lo[0], hi[0]
            )));
        }
        let buf = MemBuffer::<T>::zeroed(self.comm.stream(), len)?;
        Ok(SymmetricBuffer { window: self.comm.register_window(buf, WindowFlags::COLL_SYMMETRIC)? })
    }

    /// All-reduces elements `send_at..send_at + count` of `send` into `recv_at..recv_at + count` of
    /// `recv` (buffers from [`AllReduce::alloc`]) with `op` on `stream`, without staging copies:
    /// the two-shot kernel and NCCL work in the peers' buffers directly. Returns the decision.
    pub fn all_reduce_symmetric<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        (send, send_at): (&SymmetricBuffer<'c, T>, usize),
        (recv, recv_at): (&mut SymmetricBuffer<'c, T>, usize),
        count: usize,
        op: ReduceOp,
    ) -> Result<Decision> {
        let range = |what, b: &SymmetricBuffer<'c, T>, at: usize| match at.checked_add(count) {
            Some(end) if end <= b.len() => Ok(at..end),
            _ => Err(Error::WindowRange { what, start: at, end: at.saturating_add(count), len: b.len() }),
        };
        let (rs, rr) = (range("send buffer", send, send_at)?, range("recv buffer", recv, recv_at)?);
        let d = self.decide_on::<T>(stream, count, op)?;
        if count == 0 {
            // Nothing to reduce; NCCL's zero-count call is a no-op with no buffer to view.
            return Ok(d);
        }
        match d.path {
            Path::TwoShot => {
                let lsa = self.lsa()?;
                for b in [&send.window, &recv.window] {
                    b.buffer().tracker().use_on(stream, None).map_err(nccl::Error::from)?;
                }
                // SAFETY: both buffers were allocated by `alloc`, which made every rank's the same
                // length, and the ranges are within it (checked above); they are borrowed until
                // the launch is enqueued and ordered on `stream`.
                unsafe {
                    lsa.two_shot_raw::<T>(stream, (send.window.arg(), send_at), (recv.window.arg(), recv_at), count)
                }?;
            }
            path => {
                let src = send.window.slice(rs)?;
                let mut dst = recv.window.slice_mut(rr)?;
                match path {
                    Path::Nccl => self.comm.on(stream).all_reduce(&src, &mut dst, op)?,
                    Path::Ll => self.lsa()?.ll(stream, &src, &mut dst)?,
                    _ => self.lsa()?.one_shot(stream, &src, &mut dst)?,
                }
            }
        }
        Ok(d)
    }

    /// [`AllReduce::all_reduce_symmetric`] in place, on elements `at..at + count` of `buf`.
    pub fn all_reduce_symmetric_in_place<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut SymmetricBuffer<'c, T>,
        at: usize,
        count: usize,
        op: ReduceOp,
    ) -> Result<Decision> {
        let range = match at.checked_add(count) {
            Some(end) if end <= buf.len() => at..end,
            _ => {
                return Err(Error::WindowRange {
                    what: "buffer",
                    start: at,
                    end: at.saturating_add(count),
                    len: buf.len(),
                })
            }
        };
        let d = self.decide_on::<T>(stream, count, op)?;
        if count == 0 {
            return Ok(d);
        }
        match d.path {
            Path::TwoShot => {
                let lsa = self.lsa()?;
                buf.window.buffer().tracker().use_on(stream, None).map_err(nccl::Error::from)?;
                let arg = buf.window.arg();
                // SAFETY: as in `all_reduce_symmetric`; one window at one offset is the in-place
                // form of the kernel (each element is loaded and stored by one rank only).
                unsafe { lsa.two_shot_raw::<T>(stream, (arg, at), (arg, at), count) }?;
            }
            path => {
                let mut view = buf.window.slice_mut(range)?;
                match path {
                    Path::Nccl => self.comm.on(stream).all_reduce_in_place(&mut view, op)?,
                    Path::Ll => self.lsa()?.ll_in_place(stream, &mut view)?,
                    _ => self.lsa()?.one_shot_in_place(stream, &mut view)?,
                }
            }
        }
        Ok(d)
    }
}

/// A buffer in a symmetric window with the same length on every rank ([`AllReduce::alloc`]):
/// what [`AllReduce::all_reduce_symmetric`] works on without copies. It dereferences to the
/// [`Window`] (and through it to the [`MemBuffer`]) for reading; [`SymmetricBuffer::slice_mut`]
/// gives writable views. (No `&mut` to the window or its buffer is handed out, so that nothing
/// can swap another allocation in while the peers have this one mapped.)
pub struct SymmetricBuffer<'c, T> {
    window: Window<'c, T>,
}

impl<T> std::fmt::Debug for SymmetricBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffer").field("window", &self.window).finish()
    }
}

impl<'c, T> Deref for SymmetricBuffer<'c, T> {
    type Target = Window<'c, T>;
    fn deref(&self) -> &Window<'c, T> {
        &self.window
    }
}

impl<'c, T> SymmetricBuffer<'c, T> {
    /// Elements `range`, writable (for filling the buffer, or as an ordinary cudarc buffer).
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<MemViewMut<'_, T>> {
        Ok(self.window.slice_mut(range)?)
    }

    /// Deregisters the window (collective) and gives the memory back.
    #[allow(clippy::result_large_err)]
    pub fn into_buffer(self) -> std::result::Result<MemBuffer<T>, (Window<'c, T>, nccl::Error)> {
        self.window.deregister()
    }
}
