//! Every call the bench makes into the `nccl` crate, in one place, so that they can follow the
//! crate's API as it grows (more collectives, a stream per call, `MemBuffer`).
//!
//! Wired today: all_reduce (out-of-place and in-place), all_gather and reduce_scatter
//! (out-of-place), broadcast (in-place), sendrecv (out-of-place, `ncclSend`/`ncclRecv` in a group).
//! Not yet: reduce, alltoall, out-of-place broadcast, in-place all_gather / reduce_scatter /
//! sendrecv (they need aliasing views or calls the crate does not have yet); [`missing`] says so.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError};
use nccl::{Comm, ReduceOp};

use super::coll::{Collective, Counts};
use super::elem::Elem;
use crate::error::{CliError, Result};

/// A stream for one GPU's bench work, on which every buffer of the bench lives.
///
/// Event tracking is off for this context: the bench allocates, fills, uses and frees each buffer
/// on this one stream, so cudarc's cross-stream events (3 waits and 2 records per call) would only
/// add host time that nccl-tests does not spend. The stream is non-blocking, like nccl-tests'.
pub fn rank_stream(ordinal: usize) -> Result<Arc<CudaStream>, DriverError> {
    let ctx = CudaContext::new(ordinal)?;
    // SAFETY: no buffer of this context exists yet, and every buffer the bench creates afterwards
    // is used on the one stream made below only (allocation, copies, NCCL calls, free), so there is
    // no cross-stream use that tracking would have to order.
    unsafe { ctx.disable_event_tracking() };
    ctx.new_stream()
}

/// Whether the bench can run `coll` out-of-place and in-place with today's `nccl` crate.
pub fn variants(coll: Collective) -> (bool, bool) {
    match coll {
        Collective::AllReduce => (true, true),
        Collective::AllGather | Collective::ReduceScatter | Collective::SendRecv => (true, false),
        Collective::Broadcast => (false, true),
        Collective::Reduce | Collective::AllToAll => (false, false),
    }
}

/// Why `coll` cannot be run at all yet, if so.
pub fn missing(coll: Collective) -> Option<&'static str> {
    match coll {
        Collective::Reduce => Some("the nccl crate has no reduce yet (ncclReduce); it comes with the crate's next collectives"),
        Collective::AllToAll => Some("the nccl crate has no all_to_all yet (ncclAlltoAll, NCCL ≥ 2.28); it comes with the crate's next collectives"),
        _ => None,
    }
}

/// One rank's send and receive buffers, each large enough for the largest size at any shift.
pub struct Buffers<T: Elem> {
    /// Input.
    pub send: CudaSlice<T>,
    /// Output (and the buffer of in-place calls).
    pub recv: CudaSlice<T>,
}

impl<T: Elem> Buffers<T> {
    /// Two zeroed buffers of `len` elements on `stream`.
    pub fn new(stream: &Arc<CudaStream>, len: usize) -> Result<Self, DriverError> {
        Ok(Buffers { send: stream.alloc_zeros(len)?, recv: stream.alloc_zeros(len)? })
    }

    /// The windows one call uses: `counts.send` / `counts.recv` elements from element `shift`.
    pub fn views(&mut self, counts: Counts, shift: usize) -> Result<(CudaView<'_, T>, CudaViewMut<'_, T>)> {
        let out_of_range = || CliError::Usage(format!("window {shift}+{counts:?} outside the bench buffers"));
        let send = self.send.try_slice(shift..shift + counts.send).ok_or_else(out_of_range)?;
        let recv = self.recv.try_slice_mut(shift..shift + counts.recv).ok_or_else(out_of_range)?;
        Ok((send, recv))
    }
}

/// What one call does.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// The collective.
    pub coll: Collective,
    /// The reduction.
    pub op: ReduceOp,
    /// Root of broadcast.
    pub root: usize,
    /// Element counts.
    pub counts: Counts,
    /// Offset of the window in the buffers, in elements.
    pub shift: usize,
    /// In-place (one buffer) or out-of-place.
    pub in_place: bool,
}

fn not_wired(call: &Call) -> CliError {
    let variant = if call.in_place { "in-place" } else { "out-of-place" };
    CliError::Collective { name: call.coll.to_string(), why: format!("{variant} is not wired into gpucomm bench yet") }
}

/// Enqueues one call on `comm` (one process per GPU).
pub fn issue<T: Elem>(comm: &Comm, call: &Call, bufs: &mut Buffers<T>) -> Result<()> {
    let (send, mut recv) = bufs.views(call.counts, call.shift)?;
    let (rank, n) = (comm.rank(), comm.size());
    Ok(match (call.coll, call.in_place) {
        (Collective::AllReduce, false) => comm.all_reduce(&send, &mut recv, call.op),
        (Collective::AllReduce, true) => comm.all_reduce_in_place(&mut recv, call.op),
        (Collective::AllGather, false) => comm.all_gather(&send, &mut recv),
        (Collective::ReduceScatter, false) => comm.reduce_scatter(&send, &mut recv, call.op),
        (Collective::Broadcast, true) => comm.broadcast_in_place(&mut recv, call.root),
        (Collective::SendRecv, false) => nccl::group(|g| {
            g.send(comm, &send, (rank + 1) % n)?;
            g.recv(comm, &mut recv, (rank + n - 1) % n)
        }),
        _ => return Err(not_wired(call)),
    }?)
}

/// Enqueues one call on every communicator of this process, in one group (`-g N`).
pub fn issue_group<T: Elem>(comms: &[Comm], call: &Call, bufs: &mut [Buffers<T>]) -> Result<()> {
    if !matches!(variants(call.coll), (true, _) if !call.in_place)
        && !matches!(variants(call.coll), (_, true) if call.in_place)
    {
        return Err(not_wired(call));
    }
    let mut views = bufs.iter_mut().map(|b| b.views(call.counts, call.shift)).collect::<Result<Vec<_>>>()?;
    let views = &mut views;
    Ok(nccl::group(move |g| {
        for (comm, (send, recv)) in comms.iter().zip(views.iter_mut()) {
            let (rank, n) = (comm.rank(), comm.size());
            match (call.coll, call.in_place) {
                (Collective::AllReduce, false) => g.all_reduce(comm, send, recv, call.op)?,
                (Collective::AllReduce, true) => g.all_reduce_in_place(comm, recv, call.op)?,
                (Collective::AllGather, false) => g.all_gather(comm, send, recv)?,
                (Collective::ReduceScatter, false) => g.reduce_scatter(comm, send, recv, call.op)?,
                (Collective::Broadcast, true) => g.broadcast_in_place(comm, recv, call.root)?,
                (Collective::SendRecv, false) => {
                    g.send(comm, send, (rank + 1) % n)?;
                    g.recv(comm, recv, (rank + n - 1) % n)?;
                }
                _ => unreachable!("refused above"),
            }
        }
        Ok(())
    })?)
}

/// Sums `values` over every rank of `comm` (the bench's averages and wrong-element totals);
/// also a barrier, since every rank waits for the result.
pub fn sum_over_ranks(comm: &Comm, values: &[f64]) -> nccl::Result<Vec<f64>> {
    let stream = comm.stream();
    let mut buf = stream.clone_htod(values)?;
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM)?;
    Ok(stream.clone_dtoh(&buf)?)
}

/// One communicator per process: rank 0's unique id reaches the others through `rendezvous`.
pub fn join(stream: Arc<CudaStream>, rendezvous: &mut gpucomm_launch::Rendezvous) -> nccl::Result<Comm> {
    Comm::from_rendezvous(stream, rendezvous)
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
    use crate::error::CliError;
    let json = |source| CliError::Json { what: "a rank's record".into(), source };
    let mut record = serde_json::to_vec(value).map_err(json)?;
    if record.len() > RECORD {
        return Err(CliError::Usage(format!("a rank's record has {} bytes, more than {RECORD}", record.len())));
    }
    record.resize(RECORD, b' ');
    let stream = comm.stream();
    let send = stream.clone_htod(&record)?;
    let mut recv = stream.alloc_zeros::<u8>(RECORD * comm.size())?;
    comm.all_gather(&send, &mut recv)?;
    let all = stream.clone_dtoh(&recv)?;
    all.chunks(RECORD).map(|r| serde_json::from_slice(r).map_err(json)).collect()
}
