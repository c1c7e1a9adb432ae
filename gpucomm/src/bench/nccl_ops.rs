//! Every call the bench makes into the `nccl` crate (and, for its variants, into `nccl-sys` and
//! gpucomm-kernels), in one place, so that they can follow the crate's API as it grows.
//!
//! Every collective the bench knows, out of place and in place where NCCL has both: all_reduce,
//! broadcast, reduce, all_gather, reduce_scatter, gather, scatter, alltoall (out of place),
//! sendrecv (out of place, `ncclSend`/`ncclRecv` in a group).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError};
use gpucomm_kernels::SymmetricBuffer;
use gpucomm_ordering::{Keep, Visitor};
use nccl::{
    Collectives, Comm, Config, DeviceBuffer, DeviceBufferMut, MemBuffer, MemView, MemViewMut, ReduceOp, Root, UniqueId,
    Window, WindowFlags,
};
use nccl_sys::{ncclComm_t, ncclResult_t};

use super::coll::{Collective, Counts};
use super::elem::Elem;
use crate::cli::{Init, Memory};
use crate::error::{CliError, Result};

/// A stream for one GPU's bench work, on which every buffer of the bench lives: a non-blocking
/// stream of its own, as nccl-tests makes, or (`null`) the legacy default stream (nccl-tests' -y 1).
///
/// Event tracking is off for this context: the bench allocates, fills, uses and frees each buffer
/// on this one stream, so cudarc's cross-stream events (3 waits and 2 records per call) would only
/// add host time that nccl-tests does not spend.
pub fn rank_stream(ordinal: usize, null: bool) -> Result<Arc<CudaStream>, DriverError> {
    let ctx = CudaContext::new(ordinal)?;
    // SAFETY: no buffer of this context exists yet, and every buffer the bench creates afterwards
    // is used on the one stream made below only (allocation, copies, NCCL calls, free), so there is
    // no cross-stream use that tracking would have to order.
    unsafe { ctx.disable_event_tracking() };
    if null {
        Ok(ctx.default_stream())
    } else {
        ctx.new_stream()
    }
}

/// Whether the bench can run `coll` out-of-place and in-place: every collective has both, except
/// all-to-all and sendrecv, which NCCL has only out of place (nccl-tests runs them in place too,
/// with the input and output in one buffer, but checks no data there: its sources say it does
/// not support them).
pub fn variants(coll: Collective) -> (bool, bool) {
    match coll {
        Collective::AllToAll | Collective::SendRecv => (true, false),
        _ => (true, true),
    }
}

/// Why `coll` cannot be run at all, if so: all-to-all, gather and scatter need a loaded NCCL ≥
/// 2.28.3.
pub fn missing(coll: Collective) -> Option<String> {
    let loaded = nccl::version().ok()?;
    let function = match coll {
        Collective::AllToAll => "ncclAlltoAll",
        Collective::Gather => "ncclGather",
        Collective::Scatter => "ncclScatter",
        _ => return None,
    };
    (loaded < nccl::Version::new(2, 28, 3))
        .then(|| format!("{function} needs NCCL ≥ 2.28.3; the loaded library is {loaded}"))
}

/// One buffer of the bench, from one of the allocators it can compare.
pub enum Mem<'c, T: Elem> {
    /// cudarc's stream-ordered pool.
    Cudarc(CudaSlice<T>),
    /// `ncclMemAlloc`.
    Nccl(MemBuffer<T>),
    /// `ncclMemAlloc` registered as a symmetric window.
    Window(Window<'c, T>),
    /// A symmetric buffer of the dispatching all-reduce (its zero-copy path).
    Symmetric(SymmetricBuffer<'c, T>),
}

/// The views one call uses: cudarc's, or the nccl crate's (for every kind of NCCL memory).
pub enum Views<'a, T> {
    /// Views of cudarc buffers (`None`: no separate input, in place).
    Cuda(Option<CudaView<'a, T>>, CudaViewMut<'a, T>),
    /// Views of `ncclMemAlloc` memory.
    Nccl(Option<MemView<'a, T>>, MemViewMut<'a, T>),
}

impl<T: Elem> Mem<'_, T> {
    fn len(&self) -> usize {
        match self {
            Mem::Cudarc(b) => b.len(),
            Mem::Nccl(b) => b.len(),
            Mem::Window(w) => w.len(),
            Mem::Symmetric(s) => s.len(),
        }
    }

    /// The device address, for raw calls (valid while the buffer lives).
    fn address(&self, stream: &Arc<CudaStream>) -> u64 {
        match self {
            Mem::Cudarc(b) => b.device_ptr(stream).0,
            Mem::Nccl(b) => b.as_raw(),
            Mem::Window(w) => w.buffer().as_raw(),
            Mem::Symmetric(s) => s.buffer().as_raw(),
        }
    }
}

// SAFETY: each variant owns its buffer, whose own `Keep` reports it (writable: the graph owns it).
unsafe impl<T: Elem> Keep for Mem<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        match self {
            Mem::Cudarc(b) => b.visit(v),
            Mem::Nccl(b) => b.visit(v),
            Mem::Window(w) => w.visit(v),
            Mem::Symmetric(s) => s.visit(v),
        }
    }
}

// SAFETY: both buffers are owned, and reported by their own `Keep`, always in this order.
unsafe impl<T: Elem> Keep for Buffers<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        self.send.visit(v);
        self.recv.visit(v);
    }
}

/// One rank's send and receive buffers, each large enough for the largest size at any shift.
pub struct Buffers<'c, T: Elem> {
    /// Input.
    pub send: Mem<'c, T>,
    /// Output (and the buffer of in-place calls).
    pub recv: Mem<'c, T>,
}

impl<'c, T: Elem> Buffers<'c, T> {
    /// Two zeroed buffers of `len` elements on `stream`, from `memory` (`Window`: registered on
    /// `comm`, collectively).
    pub fn new(memory: Memory, stream: &Arc<CudaStream>, comm: &'c Comm, len: usize) -> Result<Self> {
        let nccl_mem = || MemBuffer::<T>::zeroed(stream, len);
        Ok(match memory {
            Memory::Cudarc => {
                Buffers { send: Mem::Cudarc(stream.alloc_zeros(len)?), recv: Mem::Cudarc(stream.alloc_zeros(len)?) }
            }
            Memory::Nccl => Buffers { send: Mem::Nccl(nccl_mem()?), recv: Mem::Nccl(nccl_mem()?) },
            Memory::Window => {
                let send = comm.register_window(nccl_mem()?, WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e)?;
                let recv = comm.register_window(nccl_mem()?, WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e)?;
                Buffers { send: Mem::Window(send), recv: Mem::Window(recv) }
            }
        })
    }

    /// Windows for every communicator of this process at once (`-g N` with `--buffers window`).
    pub fn windows(comms: &'c [Comm], len: usize) -> Result<Vec<Self>> {
        let make = || -> Result<Vec<Window<'c, T>>> {
            let bufs = comms.iter().map(|c| MemBuffer::<T>::zeroed(c.stream(), len)).collect::<Result<Vec<_>, _>>()?;
            Ok(nccl::register_windows(comms.iter().zip(bufs), WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e)?)
        };
        let (sends, recvs) = (make()?, make()?);
        Ok(sends.into_iter().zip(recvs).map(|(s, r)| Buffers { send: Mem::Window(s), recv: Mem::Window(r) }).collect())
    }

    /// Buffers of the dispatching all-reduce (symmetric, the same length on every rank).
    pub fn symmetric(ar: &gpucomm_kernels::AllReduce<'c>, len: usize) -> Result<Self> {
        Ok(Buffers { send: Mem::Symmetric(ar.alloc(len)?), recv: Mem::Symmetric(ar.alloc(len)?) })
    }

    /// The number of elements of each buffer.
    pub fn len(&self) -> usize {
        self.send.len()
    }

    /// The base addresses of send and receive buffer, for raw calls.
    pub fn addresses(&self, stream: &Arc<CudaStream>) -> (u64, u64) {
        (self.send.address(stream), self.recv.address(stream))
    }

    /// The element ranges one call uses: `counts.send` / `counts.recv` elements from element
    /// `shift` (out of place), or one range of the larger of the two in the receive buffer (in
    /// place, as nccl-tests does: all-gather's input is the rank's block of its output,
    /// reduce-scatter's output the rank's block of its input). Empty for a call of count 0, which
    /// nccl-tests makes for sizes too small for one element per rank (NCCL does nothing).
    pub fn ranges(
        &self,
        counts: Counts,
        shift: usize,
        in_place: bool,
    ) -> Result<(std::ops::Range<usize>, std::ops::Range<usize>)> {
        let (send_len, recv_len) =
            if in_place { (0, counts.send.max(counts.recv)) } else { (counts.send, counts.recv) };
        let (s, r) = (shift..shift + send_len, shift..shift + recv_len);
        if s.end > self.send.len() || r.end > self.recv.len() {
            return Err(CliError::RunFailed(format!("window {shift}+{counts:?} outside the bench buffers")));
        }
        Ok((s, r))
    }

    /// Copies `host` into the send (`send`) or receive buffer from element `at`.
    pub fn write(&mut self, stream: &Arc<CudaStream>, send: bool, at: usize, host: &[T]) -> Result<()> {
        let m = if send { &mut self.send } else { &mut self.recv };
        let r = at..at + host.len();
        match m {
            Mem::Cudarc(b) => {
                let mut v =
                    b.try_slice_mut(r).ok_or_else(|| CliError::RunFailed("write outside the bench buffers".into()))?;
                stream.memcpy_htod(host, &mut v)?
            }
            m => stream.memcpy_htod(host, &mut nccl_view_mut(m, r)?)?,
        }
        Ok(())
    }

    /// Zeroes elements `r` of the receive buffer.
    pub fn zero_recv(&mut self, stream: &Arc<CudaStream>, r: std::ops::Range<usize>) -> Result<()> {
        match &mut self.recv {
            Mem::Cudarc(b) => {
                let mut v =
                    b.try_slice_mut(r).ok_or_else(|| CliError::RunFailed("write outside the bench buffers".into()))?;
                stream.memset_zeros(&mut v)?
            }
            m => stream.memset_zeros(&mut nccl_view_mut(m, r)?)?,
        }
        Ok(())
    }

    /// Elements `r` of the receive buffer, copied to the host.
    pub fn read_recv(&mut self, stream: &Arc<CudaStream>, r: std::ops::Range<usize>) -> Result<Vec<T>> {
        Ok(match &self.recv {
            Mem::Cudarc(b) => stream.clone_dtoh(
                &b.try_slice(r).ok_or_else(|| CliError::RunFailed("read outside the bench buffers".into()))?,
            )?,
            m => stream.clone_dtoh(&nccl_view(m, r)?)?,
        })
    }

    /// The views of one call (see [`Buffers::ranges`]).
    pub fn views(&mut self, counts: Counts, shift: usize, in_place: bool) -> Result<Views<'_, T>> {
        let (s, r) = self.ranges(counts, shift, in_place)?;
        let outside = || CliError::RunFailed(format!("window {shift}+{counts:?} outside the bench buffers"));
        let send = (!in_place).then_some(s);
        Ok(match (&self.send, &mut self.recv) {
            (Mem::Cudarc(sb), Mem::Cudarc(rb)) => {
                let sv = send.map(|s| sb.try_slice(s).ok_or_else(outside)).transpose()?;
                Views::Cuda(sv, rb.try_slice_mut(r).ok_or_else(outside)?)
            }
            (sb, rb) => {
                let sv = send.map(|s| nccl_view(sb, s)).transpose()?;
                Views::Nccl(sv, nccl_view_mut(rb, r)?)
            }
        })
    }
}

fn nccl_view<'a, T: Elem>(m: &'a Mem<'_, T>, r: std::ops::Range<usize>) -> Result<MemView<'a, T>> {
    Ok(match m {
        Mem::Nccl(b) => b.slice(r)?,
        Mem::Window(w) => w.slice(r)?,
        Mem::Symmetric(s) => s.slice(r)?,
        Mem::Cudarc(_) => return Err(CliError::RunFailed("mixed buffer kinds".into())),
    })
}

fn nccl_view_mut<'a, T: Elem>(m: &'a mut Mem<'_, T>, r: std::ops::Range<usize>) -> Result<MemViewMut<'a, T>> {
    Ok(match m {
        Mem::Nccl(b) => b.slice_mut(r)?,
        Mem::Window(w) => w.slice_mut(r)?,
        Mem::Symmetric(s) => s.slice_mut(r)?,
        Mem::Cudarc(_) => return Err(CliError::RunFailed("mixed buffer kinds".into())),
    })
}

/// What one call does.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// The collective.
    pub coll: Collective,
    /// The reduction.
    pub op: ReduceOp,
    /// Root of broadcast, reduce, gather and scatter.
    pub root: usize,
    /// Element counts.
    pub counts: Counts,
    /// Offset of the window in the buffers, in elements.
    pub shift: usize,
    /// In-place (one buffer) or out-of-place.
    pub in_place: bool,
}

/// Issues one call on `target` (a communicator on a stream, or a member of a group; `here` says
/// whether this rank is the root): the one place that maps the bench's collectives to the `nccl`
/// crate. Sendrecv is a send to rank + 1 and a receive from rank − 1, which NCCL needs in one
/// group: `pair` issues them together. `send` is `None` in place.
fn one<'b, C: Collectives<'b>, T: Elem, S: DeviceBuffer<T>, R: DeviceBufferMut<T>>(
    target: C,
    here: bool,
    call: &Call,
    send: Option<&'b S>,
    recv: &'b mut R,
    pair: impl FnOnce(&'b S, &'b mut R) -> nccl::Result<()>,
) -> nccl::Result<()> {
    let (op, root) = (call.op, call.root);
    match (call.coll, send) {
        (Collective::AllReduce, Some(send)) => target.all_reduce(send, recv, op),
        (Collective::AllReduce, None) => target.all_reduce_in_place(recv, op),
        (Collective::Broadcast, Some(send)) => {
            let from: Root<&dyn DeviceBuffer<T>> = if here { Root::Here(send) } else { Root::Rank(root) };
            target.broadcast(from, recv)
        }
        (Collective::Broadcast, None) => target.broadcast_in_place(recv, root),
        (Collective::Reduce, Some(send)) => {
            let to: Root<&mut dyn DeviceBufferMut<T>> = if here { Root::Here(recv) } else { Root::Rank(root) };
            target.reduce(send, to, op)
        }
        (Collective::Reduce, None) => target.reduce_in_place(recv, op, root),
        (Collective::AllGather, Some(send)) => target.all_gather(send, recv),
        (Collective::AllGather, None) => target.all_gather_in_place(recv),
        (Collective::ReduceScatter, Some(send)) => target.reduce_scatter(send, recv, op),
        (Collective::ReduceScatter, None) => target.reduce_scatter_in_place(recv, op),
        (Collective::AllToAll, Some(send)) => target.all_to_all(send, recv),
        (Collective::Gather, Some(send)) => target.gather(send, recv, root),
        (Collective::Gather, None) => target.gather_in_place(recv, root),
        (Collective::Scatter, Some(send)) => target.scatter(send, recv, root),
        (Collective::Scatter, None) => target.scatter_in_place(recv, root),
        (Collective::SendRecv, Some(send)) => pair(send, recv),
        _ => unreachable!("variants() refuses the rest before any call"),
    }
}

/// Enqueues one call on `comm`, on `stream` (one process per GPU).
pub fn issue<T: Elem>(comm: &Comm, stream: &Arc<CudaStream>, call: &Call, bufs: &mut Buffers<'_, T>) -> Result<()> {
    let here = comm.rank() == call.root;
    let target = comm.on(stream);
    fn sendrecv<'b, T: Elem, S: DeviceBuffer<T>, R: DeviceBufferMut<T>>(
        comm: &'b Comm,
        stream: &'b Arc<CudaStream>,
        send: &'b S,
        recv: &'b mut R,
    ) -> nccl::Result<()> {
        let (rank, n) = (comm.rank(), comm.size());
        nccl::group(|g| {
            g.with(comm).on(stream).send(send, (rank + 1) % n)?;
            g.with(comm).on(stream).recv(recv, (rank + n - 1) % n)
        })
    }
    match bufs.views(call.counts, call.shift, call.in_place)? {
        Views::Cuda(send, mut recv) => {
            one(target, here, call, send.as_ref(), &mut recv, |s, r| sendrecv(comm, stream, s, r))?
        }
        Views::Nccl(send, mut recv) => {
            one(target, here, call, send.as_ref(), &mut recv, |s, r| sendrecv(comm, stream, s, r))?
        }
    }
    Ok(())
}

/// Enqueues one call on every communicator of this process, in one group (`-g N`).
pub fn issue_group<T: Elem>(comms: &[Comm], call: &Call, bufs: &mut [Buffers<'_, T>]) -> Result<()> {
    let mut cuda = Vec::new();
    let mut mem = Vec::new();
    for b in bufs.iter_mut() {
        match b.views(call.counts, call.shift, call.in_place)? {
            Views::Cuda(s, r) => cuda.push((s, r)),
            Views::Nccl(s, r) => mem.push((s, r)),
        }
    }
    if cuda.is_empty() {
        group_views(comms, call, &mut mem)
    } else {
        group_views(comms, call, &mut cuda)
    }
}

fn group_views<T: Elem, S: DeviceBuffer<T>, R: DeviceBufferMut<T>>(
    comms: &[Comm],
    call: &Call,
    views: &mut [(Option<S>, R)],
) -> Result<()> {
    Ok(nccl::group(|g| {
        for (comm, (send, recv)) in comms.iter().zip(views.iter_mut()) {
            let (rank, n) = (comm.rank(), comm.size());
            let member = g.with(comm);
            one(member, rank == call.root, call, send.as_ref(), recv, |send, recv| {
                member.send(send, (rank + 1) % n)?;
                member.recv(recv, (rank + n - 1) % n)
            })?;
        }
        Ok(())
    })?)
}

/// `ncclAllReduce` through `nccl-sys`, without the safe crate (`--api raw`): what a C program
/// pays (plus one atomic load per call: the communicator's handle is taken with
/// [`Comm::live_raw`] each time, so that an aborted communicator is never passed to NCCL).
pub struct RawAllReduce {
    f: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        nccl_sys::ncclDataType_t,
        nccl_sys::ncclRedOp_t,
        ncclComm_t,
        nccl_sys::cudaStream_t,
    ) -> ncclResult_t,
    stream: nccl_sys::cudaStream_t,
    send: u64,
    recv: u64,
    len: usize,
}

impl RawAllReduce {
    /// The raw entry point on `stream` with `bufs`' base addresses.
    pub fn new<T: Elem>(stream: &Arc<CudaStream>, bufs: &Buffers<'_, T>) -> Result<Self> {
        let lib = nccl_sys::library().map_err(nccl::Error::from)?;
        let f = *nccl_sys::function!(lib, ncclAllReduce).map_err(nccl::Error::from)?;
        let (send, recv) = bufs.addresses(stream);
        Ok(RawAllReduce { f, stream: stream.cu_stream() as _, send, recv, len: bufs.len() })
    }

    /// One raw all-reduce (sum) of `count` elements of `T` at element `shift` (`in_place`: in
    /// the receive buffer) on `comm` (the communicator this was made for).
    pub fn call<T: Elem>(&self, comm: &Comm, count: usize, shift: usize, in_place: bool, op: ReduceOp) -> Result<()> {
        if shift + count > self.len {
            return Err(CliError::RunFailed(format!("raw call {shift}+{count} outside the bench buffers")));
        }
        let raw = comm.live_raw()?;
        let at = |base: u64| base + (shift * size_of::<T>()) as u64;
        let send = if in_place { at(self.recv) } else { at(self.send) };
        // SAFETY: both addresses lie in buffers of `len` ≥ shift + count elements of T on the
        // communicator's device that live as long as the bench (the Buffers this was made from);
        // the communicator is live (`live_raw`, just above) and so is the stream; T's data type
        // matches its size.
        let rc = unsafe {
            (self.f)(
                send as *const c_void,
                at(self.recv) as *mut c_void,
                count,
                T::DATA_TYPE.raw(),
                op.raw(),
                raw,
                self.stream,
            )
        };
        if rc != ncclResult_t::ncclSuccess {
            return Err(CliError::RunFailed(format!("raw ncclAllReduce returned {}", rc.0)));
        }
        Ok(())
    }
}

/// Waits for `stream` as nccl-tests' `testStreamSynchronize` does: `cuStreamQuery` in a loop,
/// asking NCCL for an asynchronous error while the stream is busy, and yielding the CPU between
/// polls.
pub fn wait_polling(comm: &Comm, stream: &Arc<CudaStream>) -> Result<()> {
    stream.context().bind_to_thread()?;
    loop {
        // SAFETY: the stream is live (held by the Arc) and its context current.
        let rc = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
        match rc {
            sys::CUresult::CUDA_SUCCESS => return Ok(()),
            sys::CUresult::CUDA_ERROR_NOT_READY => {
                comm.async_error()?;
                std::thread::yield_now();
            }
            other => return Err(CliError::Cuda(DriverError(other))),
        }
    }
}

/// Sums `values` over every rank of `comm` (the bench's averages and wrong-element totals) in
/// the first `values.len()` elements of `scratch`; also a barrier, since every rank waits for the
/// result. More values than `scratch` holds is an error, not a panic.
pub fn sum_over_ranks(comm: &Comm, values: &[f64], scratch: &mut CudaSlice<f64>) -> Result<Vec<f64>> {
    let held = scratch.len();
    let mut part = scratch.try_slice_mut(..values.len()).ok_or_else(|| {
        CliError::RunFailed(format!("internal: a sum over the ranks of {} values, in scratch for {held}", values.len()))
    })?;
    let stream = comm.stream();
    stream.memcpy_htod(values, &mut part)?;
    comm.all_reduce_in_place(&mut part, ReduceOp::SUM)?;
    Ok(stream.clone_dtoh(&part)?)
}

/// One communicator per process: rank 0's unique id reaches the others through `rendezvous`, and
/// the communicator is created as `init` says.
pub fn join(stream: Arc<CudaStream>, rendezvous: &mut gpucomm_launch::Rendezvous, init: Init) -> Result<Comm> {
    match init {
        Init::Rank => Ok(Comm::from_rendezvous(stream, rendezvous)?),
        Init::Config => Ok(Comm::from_rendezvous_config(stream, rendezvous, &Config::new())?),
        Init::Group => {
            let bytes =
                rendezvous.broadcast(|| UniqueId::new().map(|id| id.to_bytes().to_vec()).map_err(|e| e.to_string()))?;
            let id = UniqueId::from_bytes(&bytes)?;
            let lib = nccl_sys::library().map_err(nccl::Error::from)?;
            let start = *nccl_sys::function!(lib, ncclGroupStart).map_err(nccl::Error::from)?;
            let end = *nccl_sys::function!(lib, ncclGroupEnd).map_err(nccl::Error::from)?;
            let init_rank = *nccl_sys::function!(lib, ncclCommInitRank).map_err(nccl::Error::from)?;
            let raw_id = nccl_sys::ncclUniqueId { internal: id.to_bytes().map(|b| b as std::os::raw::c_char) };
            stream.context().bind_to_thread()?;
            let mut raw: ncclComm_t = std::ptr::null_mut();
            let (n, rank) = (rendezvous.world_size() as i32, rendezvous.rank() as i32);
            // SAFETY: a group bracket on this thread around one ncclCommInitRank, whose out-pointer
            // is a live local and whose arguments come from the rendezvous (rank < n); the
            // stream's context is current, so NCCL creates the communicator on its device.
            let rcs = unsafe { [start(), init_rank(&mut raw, n, raw_id, rank), end()] };
            if let Some(rc) = rcs.iter().find(|rc| **rc != ncclResult_t::ncclSuccess) {
                return Err(CliError::RunFailed(format!("ncclCommInitRank in a group returned {}", rc.0)));
            }
            // SAFETY: `raw` is the live, ready communicator just created, owned by nothing else
            // and used from this thread only; blocking (made without a config: with
            // `NCCL_COMM_BLOCKING=0` NCCL's group end answers "in progress", refused above).
            Ok(unsafe { Comm::from_raw(raw, stream) }?)
        }
    }
}

/// One communicator per stream, all in this process (`ncclCommInitAll`).
pub fn init_all(streams: &[Arc<CudaStream>]) -> nccl::Result<Vec<Comm>> {
    Comm::init_all(streams)
}

/// Finalizes communicators, reporting the first failure.
pub fn finalize(comms: Vec<Comm>) -> nccl::Result<()> {
    let mut first = Ok(());
    for c in comms {
        if let Err((c, e)) = c.finalize() {
            let _ = c.abort();
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

/// The size of one rank's record in [`gather_json`].
const RECORD: usize = 1024;

/// Every rank's `value`, in rank order, exchanged as JSON through an all-gather of fixed-size
/// records (NCCL is the only all-to-all channel a launched job is sure to have).
pub fn gather_json<V: serde::Serialize + serde::de::DeserializeOwned>(
    comm: &Comm,
    value: &V,
) -> crate::error::Result<Vec<V>> {
    let json = |source| CliError::Json { what: "a rank's record".into(), source };
    let mut record = serde_json::to_vec(value).map_err(json)?;
    if record.len() > RECORD {
        return Err(CliError::RunFailed(format!("a rank's record has {} bytes, more than {RECORD}", record.len())));
    }
    record.resize(RECORD, b' ');
    let stream = comm.stream();
    let send = stream.clone_htod(&record)?;
    let mut recv = stream.alloc_zeros::<u8>(RECORD * comm.size())?;
    comm.all_gather(&send, &mut recv)?;
    let all = stream.clone_dtoh(&recv)?;
    all.chunks(RECORD).map(|r| serde_json::from_slice(r).map_err(json)).collect()
}
