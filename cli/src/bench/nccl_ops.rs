//! Every call the bench makes into the `nccl` crate, in one place, so that they can follow the
//! crate's API as it grows (more collectives, a stream per call, `MemBuffer`).
//!
//! Every collective the bench knows, out of place and in place where NCCL has both: all_reduce,
//! broadcast, reduce, all_gather, reduce_scatter, alltoall (out of place), sendrecv (out of place,
//! `ncclSend`/`ncclRecv` in a group).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError};
use nccl::{Collectives, Comm, DeviceBuffer, DeviceBufferMut, ReduceOp, Root};

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

/// Whether the bench can run `coll` out-of-place and in-place: every collective has both, except
/// all-to-all and sendrecv, which NCCL has only out of place.
pub fn variants(coll: Collective) -> (bool, bool) {
    match coll {
        Collective::AllToAll | Collective::SendRecv => (true, false),
        _ => (true, true),
    }
}

/// Why `coll` cannot be run at all, if so: all-to-all needs a loaded NCCL ≥ 2.28.3.
pub fn missing(coll: Collective) -> Option<String> {
    let loaded = nccl::version().ok()?;
    (coll == Collective::AllToAll && loaded < nccl::Version::new(2, 28, 3))
        .then(|| format!("ncclAlltoAll needs NCCL ≥ 2.28.3; the loaded library is {loaded}"))
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

    /// The windows one call uses: `counts.send` / `counts.recv` elements from element `shift`
    /// (out of place), or one window of the larger of the two in the receive buffer (in place,
    /// as nccl-tests does: all-gather's input is the rank's block of its output, reduce-scatter's
    /// output the rank's block of its input).
    pub fn views(
        &mut self,
        counts: Counts,
        shift: usize,
        in_place: bool,
    ) -> Result<(CudaView<'_, T>, CudaViewMut<'_, T>)> {
        let out_of_range = || CliError::Usage(format!("window {shift}+{counts:?} outside the bench buffers"));
        let (send_len, recv_len) =
            if in_place { (0, counts.send.max(counts.recv)) } else { (counts.send, counts.recv) };
        let send = self.send.try_slice(shift..shift + send_len).ok_or_else(out_of_range)?;
        let recv = self.recv.try_slice_mut(shift..shift + recv_len).ok_or_else(out_of_range)?;
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
    /// Root of broadcast and reduce.
    pub root: usize,
    /// Element counts.
    pub counts: Counts,
    /// Offset of the window in the buffers, in elements.
    pub shift: usize,
    /// In-place (one buffer) or out-of-place.
    pub in_place: bool,
}

/// Issues one call on `target` (a communicator, or a member of a group; `here` says whether this
/// rank is the root): the one place that maps the bench's collectives to the `nccl` crate. Sendrecv is a send to rank + 1 and a receive from
/// rank − 1, which NCCL needs in one group: `pair` issues them together.
fn one<'b, C: Collectives<'b>, T: Elem>(
    target: C,
    here: bool,
    call: &Call,
    send: &'b CudaView<'_, T>,
    recv: &'b mut CudaViewMut<'_, T>,
    pair: impl FnOnce(&'b CudaView<'_, T>, &'b mut CudaViewMut<'_, T>) -> nccl::Result<()>,
) -> nccl::Result<()> {
    let (op, root) = (call.op, call.root);
    match (call.coll, call.in_place) {
        (Collective::AllReduce, false) => target.all_reduce(send, recv, op),
        (Collective::AllReduce, true) => target.all_reduce_in_place(recv, op),
        (Collective::Broadcast, false) => {
            let from: Root<&dyn DeviceBuffer<T>> = if here { Root::Here(send) } else { Root::Rank(root) };
            target.broadcast(from, recv)
        }
        (Collective::Broadcast, true) => target.broadcast_in_place(recv, root),
        (Collective::Reduce, false) => {
            let to: Root<&mut dyn DeviceBufferMut<T>> = if here { Root::Here(recv) } else { Root::Rank(root) };
            target.reduce(send, to, op)
        }
        (Collective::Reduce, true) => target.reduce_in_place(recv, op, root),
        (Collective::AllGather, false) => target.all_gather(send, recv),
        (Collective::AllGather, true) => target.all_gather_in_place(recv),
        (Collective::ReduceScatter, false) => target.reduce_scatter(send, recv, op),
        (Collective::ReduceScatter, true) => target.reduce_scatter_in_place(recv, op),
        (Collective::AllToAll, false) => target.all_to_all(send, recv),
        (Collective::SendRecv, false) => pair(send, recv),
        _ => unreachable!("variants() refuses the rest before any call"),
    }
}

/// Enqueues one call on `comm` (one process per GPU).
pub fn issue<T: Elem>(comm: &Comm, call: &Call, bufs: &mut Buffers<T>) -> Result<()> {
    let (send, mut recv) = bufs.views(call.counts, call.shift, call.in_place)?;
    let (rank, n) = (comm.rank(), comm.size());
    Ok(one(comm, rank == call.root, call, &send, &mut recv, |send, recv| {
        nccl::group(|g| {
            g.with(comm).send(send, (rank + 1) % n)?;
            g.with(comm).recv(recv, (rank + n - 1) % n)
        })
    })?)
}

/// Enqueues one call on every communicator of this process, in one group (`-g N`).
pub fn issue_group<T: Elem>(comms: &[Comm], call: &Call, bufs: &mut [Buffers<T>]) -> Result<()> {
    let mut views =
        bufs.iter_mut().map(|b| b.views(call.counts, call.shift, call.in_place)).collect::<Result<Vec<_>>>()?;
    Ok(nccl::group(|g| {
        for (comm, (send, recv)) in comms.iter().zip(views.iter_mut()) {
            let (rank, n) = (comm.rank(), comm.size());
            let member = g.with(comm);
            one(member, rank == call.root, call, send, recv, |send, recv| {
                member.send(send, (rank + 1) % n)?;
                member.recv(recv, (rank + n - 1) % n)
            })?;
        }
        Ok(())
    })?)
}

/// Sums `values` over every rank of `comm` (the bench's averages and wrong-element totals) in
/// `scratch` (as long as `values`); also a barrier, since every rank waits for the result.
pub fn sum_over_ranks(comm: &Comm, values: &[f64], scratch: &mut CudaSlice<f64>) -> nccl::Result<Vec<f64>> {
    let stream = comm.stream();
    stream.memcpy_htod(values, scratch)?;
    comm.all_reduce_in_place(scratch, ReduceOp::SUM)?;
    Ok(stream.clone_dtoh(scratch)?)
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
