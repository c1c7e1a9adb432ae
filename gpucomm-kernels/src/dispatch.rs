//! The dispatching all-reduce: one object per communicator that sends each call to the fastest
//! of NCCL and this crate's kernels for its size.

use std::cell::Cell;
use std::ops::{Deref, RangeBounds};
use std::sync::Arc;

use cudarc::driver::{CudaStream, DeviceSlice};
use gpucomm_ordering::{Access, Keep, Tracked, Visitor};
use nccl::{
    Collectives, Comm, DeviceBuffer, DeviceBufferMut, MemBuffer, MemViewMut, NcclType, ReduceOp, Window, WindowFlags,
};

use crate::decide::{decide, Call, Decision, Limits};
use crate::error::{Error, Result};
use crate::fallback::Fallback;
use crate::lsa::{self, CtaBytes, Kernel, LsaKernels, Sizes, LL_MAX_BYTES};
use crate::path::Path;
use crate::table::{Mode, Table};

/// How an [`AllReduce`] is set up. Every rank must pass the same options: [`AllReduce::new`]
/// compares the staging sizes, the launch shapes and the crossover table's steps across the
/// ranks and refuses to start when they differ.
#[derive(Clone, Debug)]
pub struct Options {
    /// Use the kernels where they are faster (default `true`); `false` sends every call to NCCL.
    pub kernels: bool,
    /// The largest one-shot message in bytes (default 1 MiB; two slots of it are kept; rounded
    /// up to 4 KiB, at most [`MAX_AREA`](crate::lsa::MAX_AREA)).
    pub one_shot_max: usize,
    /// The largest staged two-shot launch in bytes (default 32 MiB; input and output regions of
    /// it are kept; larger messages take several launches; rounded up to 4 KiB, at most
    /// [`MAX_AREA`](crate::lsa::MAX_AREA)).
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
/// * **Capture-safe.** Calls enqueue work only (no synchronisation, no allocation). Inside
///   [`nccl::capture`] the table's `[graph]` section decides, and each call records what it uses,
///   as every call of the `nccl` crate does: its buffers, the communicator, and (kernel paths) the
///   kernels and their window. The keep set holds `&all_reduce` — which keeps the communicator,
///   the device communicator, the module and the window — and the buffers, so the graph cannot
///   outlive any of them (see the example below). A capture not opened through `nccl::capture`
///   (cudarc's `begin_capture`, another library's) is refused, as by every call. Every rank must
///   capture and replay the same calls in the same order, as with NCCL.
/// * **Falls back to NCCL** where the kernels cannot help: ranks that cannot reach each other by
///   loads and stores (other nodes, a network transport), more than 8 ranks, an NCCL without the
///   device API or whose device API differs from the headers the kernels were built with,
///   element types other than f32/bf16/f16, reductions other than sum, zero elements. Each call
///   returns its [`Decision`] (path and reason), and [`AllReduce::last`] repeats it.
///
/// Every rank must make the same calls with the same counts, as for any collective; the decision
/// depends only on what every rank agrees on (the table, the size, the type, capture), so all
/// ranks take the same path. Drop it on every rank once no rank launches on it any more (the
/// peers' kernels read this rank's window until then; NCCL 2.28.9 destroys the device
/// communicator and deregisters the window locally).
///
/// ```no_run
/// # fn demo(comm: &nccl::Comm, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> gpucomm_kernels::Result<()> {
/// use gpucomm_kernels::{AllReduce, Options};
/// let ar = AllReduce::new(comm, Options::default())?;
/// let send = stream.clone_htod(&[1.0f32; 1024])?;
/// let mut recv = stream.alloc_zeros::<f32>(1024)?;
/// let decision = ar.all_reduce(stream, &send, &mut recv, nccl::ReduceOp::SUM)?;
/// println!("4 KiB went {decision}"); // e.g. "ll (crossover table, eager)"
///
/// // Captured into a CUDA graph (on a stream other than the legacy default stream): the graph
/// // keeps the dispatcher and the buffers, and each launch is ordered like a call.
/// // (`gpucomm_kernels::capture` is `nccl::capture` with this crate's error type.)
/// let side = stream.context().new_stream()?;
/// let mut graph = gpucomm_kernels::capture(&side, (&ar, &send, &mut recv), |(ar, send, recv)| {
///     ar.all_reduce(&side, *send, *recv, nccl::ReduceOp::SUM).map(drop)
/// })
/// .map_err(|(_kept, e)| e)?; // a refused capture hands the keep set back with its error
/// graph.launch()?;
/// let (_, _, recv) = graph.into_kept();
/// let sums = stream.clone_dtoh(recv)?;
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
        let sizes = Sizes { one_shot: options.one_shot_max, staged: options.staged_max }.rounded();
        let local = if !options.kernels {
            Err(Fallback::Disabled)
        } else if !crate::image::COMPILED {
            Err(Fallback::NotCompiled)
        } else {
            lsa::check_team(comm)
        };
        // Whether the sizes are valid goes into the first collective step with the rest: a rank
        // that refused its options alone would leave the others waiting in it.
        let all = lsa::min_max(comm, &[u64::from(local.is_ok()), u64::from(sizes.is_ok())], ReduceOp::MIN)?;
        let sizes = sizes?;
        if all[1] == 0 {
            return Err(Error::Mismatch {
                what: "staging sizes (valid on this rank, refused on another)",
                mine: vec![1],
                smallest: vec![0],
                largest: vec![1],
            });
        }
        let everyone = all[0] == 1;
        let table = match options.table {
            Some(t) => t,
            None => Table::builtin(&comm.context().name().unwrap_or_default(), comm.size()),
        };
        let mut setup_error = None;
        let kernels = match local {
            Err(why) => Err(why),
            Ok(()) if !everyone => Err(Fallback::PeerCannot),
            Ok(()) => {
                // The ranks' kernels meet in each other's windows, CTA by CTA, and each rank picks
                // its path from the table: all of it must match.
                let sizes_and_table = [sizes.one_shot as u64, sizes.staged as u64, table.fingerprint()];
                lsa::agree(
                    comm,
                    "staging sizes, launch shapes (CTA bytes) or crossover tables",
                    &[&sizes_and_table[..], &options.cta_bytes.values()].concat(),
                )?;
                match LsaKernels::create(comm, sizes) {
                    Ok(mut k) => {
                        k.use_cta_bytes(options.cta_bytes);
                        Ok(k)
                    }
                    // Another rank's setup failed: every rank falls back (see `create`).
                    Err(Error::Unavailable(why)) => Err(why),
                    Err(e) => {
                        setup_error = Some(e.to_string());
                        Err(Fallback::SetupFailed)
                    }
                }
            }
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

    /// Collective (every rank, outside any capture): replaces the crossover table, which must be
    /// the same on every rank (whose kernels would otherwise meet different kernels or NCCL);
    /// compared across the ranks ([`Error::Mismatch`], the table in use is kept).
    pub fn set_table(&mut self, table: Table) -> Result<()> {
        lsa::agree(self.comm, "crossover tables", &[table.fingerprint()])?;
        self.table = table;
        Ok(())
    }

    /// Collective (every rank, outside any capture): sends every call to `path` (`None`: back to
    /// the table), for tests and benchmarks. A forced kernel that cannot take a call makes the
    /// call fail ([`Error::Forced`]) instead of falling back. Every rank must force the same
    /// path: compared across the ranks ([`Error::Mismatch`], nothing changed).
    pub fn force(&mut self, path: Option<Path>) -> Result<()> {
        lsa::agree(self.comm, "forced paths", &[path.map_or(0, |p| 1 + p as u64)])?;
        self.force = path;
        Ok(())
    }

    /// Forces a path every rank has already agreed on.
    pub(crate) fn restore_force(&mut self, path: Option<Path>) {
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

    /// The decision for a call on `access`'s stream: [`Mode::Graph`] inside [`nccl::capture`]'s
    /// scope; a capture opened by anything else is refused.
    fn decide_on<T: NcclType>(&self, access: &Access<'_>, count: usize, op: ReduceOp) -> Result<Decision> {
        let mode = if access.capturing()? { Mode::Graph } else { Mode::Eager };
        let d = self.plan::<T>(count, op, mode)?;
        self.last.set(Some(d));
        Ok(d)
    }

    fn lsa(&self) -> Result<&LsaKernels<'c>> {
        self.kernels.as_ref().map_err(|why| Error::Unavailable(*why))
    }

    /// All-reduces `send` into `recv` (the same length) with `op` on `stream` (a stream of the
    /// communicator's device), through the path the table picks for its size. Returns the
    /// decision. Buffers that share bytes without being the same range are [`Error::Overlap`]
    /// on every path. Inside [`nccl::capture`] the keep set must hold this dispatcher (`&ar`) and the
    /// buffers (see the [type docs](AllReduce)).
    pub fn all_reduce<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        send: &impl DeviceBuffer<T>,
        recv: &mut impl DeviceBufferMut<T>,
        op: ReduceOp,
    ) -> Result<Decision> {
        if recv.len() != send.len() {
            return Err(Error::LengthMismatch { what: "recv buffer", expected: send.len(), got: recv.len() });
        }
        let access = Access::new(stream);
        let d = self.decide_on::<T>(&access, send.len(), op)?;
        match Kernel::for_path(d.path) {
            // NCCL's check of the buffers' overlap answers as the kernels' does, so that the
            // error does not depend on the path the size picked.
            None => self.comm.on(stream).all_reduce(send, recv, op).map_err(|e| match e {
                nccl::Error::Overlap { .. } => Error::Overlap,
                e => Error::Nccl(e),
            })?,
            Some(kernel) => self.lsa()?.pair(kernel, &access, send, recv)?,
        }
        Ok(d)
    }

    /// [`AllReduce::all_reduce`] with `buf` as input and output.
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut impl DeviceBufferMut<T>,
        op: ReduceOp,
    ) -> Result<Decision> {
        let access = Access::new(stream);
        let d = self.decide_on::<T>(&access, buf.len(), op)?;
        match Kernel::for_path(d.path) {
            None => self.comm.on(stream).all_reduce_in_place(buf, op)?,
            Some(kernel) => self.lsa()?.single(kernel, &access, buf)?,
        }
        Ok(d)
    }

    /// Collective: `len` zeroed elements of `T` in a symmetric window on every rank (the same
    /// `len` and element type everywhere, checked), for [`AllReduce::all_reduce_symmetric`]: the
    /// kernels and NCCL (its symmetric-memory kernels) read and write these buffers in the peers'
    /// memory directly, without staging copies.
    pub fn alloc<T: NcclType + cudarc::driver::ValidAsZeroBits>(&self, len: usize) -> Result<SymmetricBuffer<'c, T>> {
        // The bytes, not only the count: a rank allocating bf16 where another allocates f32 would
        // have the peers' kernels address twice its buffer.
        // Whether the allocation succeeded is compared with them: a rank out of memory alone
        // would leave the others waiting in the window's registration.
        let buf = MemBuffer::<T>::zeroed(self.comm.stream(), len);
        let shape = [len as u64, size_of::<T>() as u64, T::DATA_TYPE.raw().0 as u64, u64::from(buf.is_ok())];
        let agreed = lsa::agree(
            self.comm,
            "symmetric buffer lengths (elements, element bytes, data type, allocated on every rank)",
            &shape,
        );
        let buf = buf?;
        agreed?;
        Ok(SymmetricBuffer { window: self.comm.register_window(buf, WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e)? })
    }

    /// All-reduces elements `send_at..send_at + count` of `send` into `recv_at..recv_at + count` of
    /// `recv` (buffers from [`AllReduce::alloc`]) with `op` on `stream`, without staging copies:
    /// the two-shot kernel and NCCL work in the peers' buffers directly. Returns the decision.
    ///
    /// Every rank passes the same `send_at`, `recv_at` and `count` (as NCCL's symmetric windows
    /// require, `WindowFlags::COLL_SYMMETRIC`): each rank addresses the peers' buffers with its
    /// own offsets, so ranks that differ read and write other elements of the peers' buffers
    /// than those the peers asked for (within the buffers, whose lengths are agreed: the
    /// results are wrong, not out of bounds). Nothing checks it.
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
        let access = Access::new(stream);
        let d = self.decide_on::<T>(&access, count, op)?;
        match d.path {
            // Zero elements are decided for NCCL (a no-op call that every rank makes).
            Path::TwoShot => {
                let lsa = self.lsa()?;
                // SAFETY: both buffers were allocated by `alloc`, which made every rank's the same
                // length of the same element type, and the ranges (of `count` ≥ 1 elements: zero is decided for NCCL) are
                // within it (checked above), on every rank alike.
                unsafe {
                    lsa.two_shot_windows::<T>(
                        &access,
                        Some((&send.window, send_at)),
                        (&mut recv.window, recv_at),
                        count,
                    )
                }?;
            }
            path => {
                let src = send.window.slice(rs)?;
                let mut dst = recv.window.slice_mut(rr)?;
                match Kernel::for_path(path) {
                    Some(kernel) => self.lsa()?.pair(kernel, &access, &src, &mut dst)?,
                    None => self.comm.on(stream).all_reduce(&src, &mut dst, op)?,
                }
            }
        }
        Ok(d)
    }

    /// [`AllReduce::all_reduce_symmetric`] in place, on elements `at..at + count` of `buf` (the
    /// same `at` and `count` on every rank).
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
        let access = Access::new(stream);
        let d = self.decide_on::<T>(&access, count, op)?;
        match d.path {
            Path::TwoShot => {
                let lsa = self.lsa()?;
                // SAFETY: as in `all_reduce_symmetric`; one window at one offset is the in-place
                // form of the kernel (each element is loaded and stored by one rank only).
                unsafe { lsa.two_shot_windows::<T>(&access, None, (&mut buf.window, at), count) }?;
            }
            path => {
                let mut view = buf.window.slice_mut(range)?;
                match Kernel::for_path(path) {
                    Some(kernel) => self.lsa()?.single(kernel, &access, &mut view)?,
                    None => self.comm.on(stream).all_reduce_in_place(&mut view, op)?,
                }
            }
        }
        Ok(d)
    }
}

/// A buffer in a symmetric window with the same length on every rank ([`AllReduce::alloc`]):
/// what [`AllReduce::all_reduce_symmetric`] works on without copies. It dereferences to the
/// [`Window`] (and through it to the [`MemBuffer`]) for reading; [`SymmetricBuffer::slice_mut`]
/// gives writable views. It is a device buffer itself ([`DeviceBuffer`], [`DeviceBufferMut`],
/// cudarc's traits), ordered by its memory's tracker, for copies, kernels and `nccl` calls, and a
/// keep-set member of [`nccl::capture`] (by value, `&` or `&mut`). (No `&mut` to the window or
/// its buffer is handed out, so that nothing can swap another allocation in while the peers have
/// this one mapped.)
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

// The window is its registration: captured kernels and NCCL's symmetric calls reach the memory
// through the window's handle, so graphs that keep the buffer (`&`, `&mut`) keep the window too.
gpucomm_ordering::tracked_device_ptr!(['c, T] SymmetricBuffer<'c, T>, |b| {
    let buf = b.window.buffer();
    // SAFETY: the parts are those of the window's `MemBuffer` (its address, length, tracker and
    // home stream), which the window owns and frees only after its tracker reports every use
    // finished; the buffer is never replaced (no `&mut` to it is handed out).
    unsafe { Tracked::new(buf.as_raw(), buf.len(), buf.tracker(), buf.stream()) }
}, registration |b| b.window.resource());

// SAFETY: the graph owns the buffer (and so its window and memory); it is reported writable,
// with its window.
unsafe impl<T> Keep for SymmetricBuffer<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        let window = self.window.resource();
        v.write(self);
        v.resource(window, true);
    }
}

// SAFETY: the borrow keeps the dispatcher — its communicator borrow, and its kernels' device
// communicator, module and window — alive and in place for as long as the graph holds it; an
// aborted or revoked communicator is reported closed, so that no launch reaches it. Reported in the same
// order every time (whether the kernels exist never changes).
unsafe impl Keep for &AllReduce<'_> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        let ar: &'k AllReduce<'_> = self;
        ar.comm.report_kept(v);
        if let Ok(kernels) = &ar.kernels {
            kernels.visit_members(v);
        }
    }
}

/// [`nccl::capture`] with this crate's error type: captures the calls `f` makes on `stream` —
/// [`AllReduce`] and [`LsaKernels`] calls, and every `nccl` call — into a CUDA graph that keeps
/// `keep` (`&all_reduce`, `&kernels`, buffers, communicators; see `nccl::capture` for the rules).
/// Every failure hands `keep` back with the error, `Err((keep, error))`.
#[doc(alias = "cuStreamBeginCapture")]
pub fn capture<K: Keep>(
    stream: &Arc<CudaStream>,
    keep: K,
    f: impl FnOnce(&mut K) -> Result<()>,
) -> gpucomm_ordering::Captured<K, Error> {
    gpucomm_ordering::capture(stream, keep, f)
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
