//! One NCCL communication call, checked and ready to issue: the single place that calls NCCL's
//! collectives and point-to-point functions.
//!
//! Every method of [`crate::Collectives`] checks its arguments, takes its buffers' pointers, and
//! produces a [`Call`]: a plain, copyable description (function, pointers, count, data type,
//! operator, root or peer, communicator, stream). A direct call issues it at once; a
//! [`crate::group`] records it and issues all of its calls between `ncclGroupStart` and
//! `ncclGroupEnd`, after its closure has returned. Either way [`Call::issue`] is the only code that
//! passes buffer pointers to NCCL.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use cudarc::driver::{sys::CUdeviceptr, CudaStream};
use nccl_sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use crate::error::Result;
use crate::types::check_loaded_type;
use crate::{Comm, NcclType};

/// `ncclAllReduce`, `ncclReduceScatter`: (send, recv, count, type, op, comm, stream).
type ReducingFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
/// `ncclReduce`: (send, recv, count, type, op, root, comm, stream).
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
/// `ncclBroadcast`, `ncclGather`, `ncclScatter`: (send, recv, count, type, root, comm, stream).
type RootedFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
/// `ncclAllGather`, `ncclAlltoAll`: (send, recv, count, type, comm, stream).
type PlainFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclComm_t, cudaStream_t) -> ncclResult_t;
/// `ncclSend`: (send, count, type, peer, comm, stream).
type SendFn =
    unsafe extern "C" fn(*const c_void, usize, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;
/// `ncclRecv`: (recv, count, type, peer, comm, stream).
type RecvFn = unsafe extern "C" fn(*mut c_void, usize, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> ncclResult_t;

/// The NCCL function of a call, resolved in the loaded library, with the arguments only its
/// shape has. Functions of the same C signature share a shape.
#[derive(Clone, Copy)]
enum Entry {
    Reducing(ReducingFn, ncclRedOp_t),
    Reduce(ReduceFn, ncclRedOp_t, c_int),
    Rooted(RootedFn, c_int),
    Plain(PlainFn),
    Send(SendFn, c_int),
    Recv(RecvFn, c_int),
}

/// `ncclX` as a function of type `$ty` (the compiler checks it against the bindgen signature),
/// wrapped with `make`, giving `(name, entry)`. Resolved in the loaded library at its first call
/// and kept in a `static` of its own, so that later calls read one word instead of the library's
/// table; a function the library lacks is [`crate::Error::MissingFunction`], naming the version
/// that added it.
macro_rules! entry {
    ($name:ident: $ty:ty, $make:expr) => {{
        static RESOLVED: OnceLock<$ty> = OnceLock::new();
        let f: $ty = match RESOLVED.get() {
            Some(&f) => f,
            None => {
                let f: $ty = *::nccl_sys::function!(crate::ffi::lib()?, $name)?;
                // Another thread may have stored the same function first.
                let _ = RESOLVED.set(f);
                f
            }
        };
        (stringify!($name), $make(f))
    }};
}

/// A call's send and receive buffer addresses, as taken through its `Access` (0 for a buffer the
/// function does not use).
pub(crate) type Buffers = (CUdeviceptr, CUdeviceptr);

/// Which NCCL function a call goes to, with its operator, root or peer (all already checked).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    AllReduce(ncclRedOp_t),
    Broadcast(c_int),
    Reduce(ncclRedOp_t, c_int),
    AllGather,
    ReduceScatter(ncclRedOp_t),
    #[cfg(nccl_2_28)]
    AlltoAll,
    #[cfg(nccl_2_28)]
    Gather(c_int),
    #[cfg(nccl_2_28)]
    Scatter(c_int),
    Send(c_int),
    Recv(c_int),
}

impl Kind {
    /// The layout of the call's two buffers, as NCCL's header describes it, and how NCCL plans
    /// it: the one table both overlap checks (a call's own, [`Shape::in_place_rule`], and a
    /// group's, [`Shape::sides`]) and a simulated group's refusal ([`Shape::point_to_point`])
    /// derive from.
    #[inline(always)]
    pub(crate) fn shape(self) -> Shape {
        let coll = |per_rank, root, in_place| Shape { per_rank, root, in_place, point_to_point: false };
        let p2p = |per_rank, root, in_place| Shape { per_rank, root, in_place, point_to_point: true };
        match self {
            Kind::AllReduce(_) => coll([false, false], None, true),
            Kind::Broadcast(root) | Kind::Reduce(_, root) => coll([false, false], Some(root), true),
            Kind::AllGather => coll([false, true], None, true),
            Kind::ReduceScatter(_) => coll([true, false], None, true),
            #[cfg(nccl_2_28)]
            Kind::Gather(root) => p2p([false, true], Some(root), true),
            #[cfg(nccl_2_28)]
            Kind::Scatter(root) => p2p([true, false], Some(root), true),
            #[cfg(nccl_2_28)]
            Kind::AlltoAll => p2p([true, true], None, false),
            Kind::Send(_) | Kind::Recv(_) => p2p([false, false], None, false),
        }
    }
}

/// How a call's send and receive buffers are laid out ([`Kind::shape`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Whether the send and the receive buffer hold one block of the call's count per rank (the
    /// other holds one block).
    per_rank: [bool; 2],
    /// The root of a rooted call. Off it, NCCL uses neither a gather's receive buffer nor a
    /// scatter's send buffer: the buffer of one block per rank.
    root: Option<c_int>,
    /// Whether NCCL has an in-place form of the call (the buffers may then meet in one way).
    in_place: bool,
    /// Whether NCCL carries the call out as sends and receives (its point-to-point planner).
    point_to_point: bool,
}

impl Shape {
    /// Whether NCCL carries the call out as sends and receives (its point-to-point planner),
    /// which a simulated group cannot plan.
    pub(crate) fn point_to_point(self) -> bool {
        self.point_to_point
    }

    /// Whether `rank` is not the root of a rooted call.
    #[inline]
    fn off_root(self, rank: usize) -> bool {
        self.root.is_some_and(|root| root as usize != rank)
    }

    /// The ranges `(address, bytes)` of a call's send and receive buffers `(send, recv)` on rank
    /// `rank` of `ranks`: one `block` of bytes each, or one per rank where `per_rank` says so;
    /// empty for a buffer the call does not take (address 0), and for the buffer of one block per
    /// rank of a rooted call off its root.
    #[inline]
    pub(crate) fn sides(
        self,
        (send, recv): (CUdeviceptr, CUdeviceptr),
        block: usize,
        rank: usize,
        ranks: usize,
    ) -> [(CUdeviceptr, usize); 2] {
        let off_root = self.off_root(rank);
        let side = |addr: CUdeviceptr, per_rank: bool| match (addr, per_rank, off_root) {
            (0, ..) | (_, true, true) => (addr, 0),
            (_, true, false) => (addr, block * ranks),
            (_, false, _) => (addr, block),
        };
        [side(send, self.per_rank[0]), side(recv, self.per_rank[1])]
    }

    /// NCCL's in-place rule for the call on `rank`, as its header words it, and whether send and
    /// receive ranges `(address, bytes)` that share bytes follow it: the same address where both
    /// buffers hold one block; where one holds a block per rank, the other at this rank's block
    /// of it (the root's, for a rooted call: off the root, NCCL does not use that buffer, so any
    /// overlap is its in-place form); never for a call without one.
    #[cold]
    pub(crate) fn in_place_rule(
        self,
        rank: usize,
        (s, send_bytes): (u64, usize),
        (r, recv_bytes): (u64, usize),
    ) -> (&'static str, bool) {
        let at = |base: u64, block: usize| rank.checked_mul(block).and_then(|o| base.checked_add(o as u64));
        let off_root = self.off_root(rank);
        match (self.in_place, self.per_rank, self.root.is_some()) {
            (false, ..) | (_, [true, true], _) => ("none", false),
            (true, [false, false], _) => ("sendbuff == recvbuff", s == r),
            (true, [false, true], false) => ("sendbuff == recvbuff + rank × sendcount", Some(s) == at(r, send_bytes)),
            (true, [false, true], true) => {
                ("sendbuff == recvbuff + root × sendcount", off_root || Some(s) == at(r, send_bytes))
            }
            (true, [true, false], false) => ("recvbuff == sendbuff + rank × recvcount", Some(r) == at(s, recv_bytes)),
            (true, [true, false], true) => {
                ("recvbuff == sendbuff + root × recvcount", off_root || Some(r) == at(s, recv_bytes))
            }
        }
    }
}

/// One NCCL call, every argument checked: what [`Call::issue`] passes to NCCL. Copyable, so a
/// group can record it and issue it later; the buffers it points to are kept borrowed (and their
/// stream guards kept) by whoever holds it until the call has been settled.
#[derive(Clone, Copy)]
pub(crate) struct Call {
    name: &'static str,
    entry: Entry,
    send: CUdeviceptr,
    recv: CUdeviceptr,
    count: usize,
    dtype: ncclDataType_t,
    /// Bytes per element.
    elem: u32,
    /// The layout of the two buffers.
    shape: Shape,
    comm: ncclComm_t,
    stream: cudaStream_t,
}

impl Call {
    /// Resolves the function for `kind` on elements of type `T` (refusing a type the loaded
    /// library does not know, and an aborted communicator), for `count` elements on `comm`,
    /// enqueued on `stream`. A count of zero is a call like any other, which NCCL treats as a
    /// no-op; every rank must still make it, as any call. The buffer pointers are added with
    /// [`Call::set_buffers`] once taken.
    #[inline(always)]
    pub(crate) fn new<T: NcclType>(kind: Kind, count: usize, comm: &Comm, stream: &CudaStream) -> Result<Self> {
        let (name, entry) = match kind {
            Kind::AllReduce(op) => entry!(ncclAllReduce: ReducingFn, |f| Entry::Reducing(f, op)),
            Kind::ReduceScatter(op) => entry!(ncclReduceScatter: ReducingFn, |f| Entry::Reducing(f, op)),
            Kind::Reduce(op, root) => entry!(ncclReduce: ReduceFn, |f| Entry::Reduce(f, op, root)),
            Kind::Broadcast(root) => entry!(ncclBroadcast: RootedFn, |f| Entry::Rooted(f, root)),
            #[cfg(nccl_2_28)]
            Kind::Gather(root) => entry!(ncclGather: RootedFn, |f| Entry::Rooted(f, root)),
            #[cfg(nccl_2_28)]
            Kind::Scatter(root) => entry!(ncclScatter: RootedFn, |f| Entry::Rooted(f, root)),
            Kind::AllGather => entry!(ncclAllGather: PlainFn, Entry::Plain),
            #[cfg(nccl_2_28)]
            Kind::AlltoAll => entry!(ncclAlltoAll: PlainFn, Entry::Plain),
            Kind::Send(peer) => entry!(ncclSend: SendFn, |f| Entry::Send(f, peer)),
            Kind::Recv(peer) => entry!(ncclRecv: RecvFn, |f| Entry::Recv(f, peer)),
        };
        check_loaded_type::<T>()?;
        Ok(Call {
            name,
            entry,
            send: 0,
            recv: 0,
            count,
            dtype: T::DATA_TYPE.raw(),
            elem: size_of::<T>() as u32,
            shape: kind.shape(),
            comm: comm.live_raw()?,
            stream: stream.cu_stream() as cudaStream_t,
        })
    }

    /// Sets the buffers' device addresses (0 for a buffer the function does not use).
    #[inline]
    pub(crate) fn set_buffers(&mut self, (send, recv): Buffers) {
        (self.send, self.recv) = (send, recv);
    }

    /// The ranges `(address, bytes)` the call reads (its send buffer) and writes (its receive
    /// buffer) on rank `rank` of a communicator of `ranks` ranks ([`Shape::sides`]).
    #[inline]
    pub(crate) fn spans(&self, rank: usize, ranks: usize) -> [(CUdeviceptr, usize); 2] {
        // The buffers exist with these sizes (the calls checked them), so no product overflows.
        let block = self.count * self.elem as usize;
        self.shape.sides((self.send, self.recv), block, rank, ranks)
    }

    /// The C function's name, for errors and [`Comm::settle`].
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// True for calls NCCL carries out as sends and receives ([`Shape::point_to_point`]).
    pub(crate) fn is_point_to_point(&self) -> bool {
        self.shape.point_to_point()
    }

    /// The communicator the call goes to.
    pub(crate) fn comm(&self) -> ncclComm_t {
        self.comm
    }

    /// What a flight recorder keeps of the call: element count, data type, the peer (send, recv)
    /// or root (rooted calls) as `("peer" | "root", rank)`, and the stream.
    pub(crate) fn describe(&self) -> (usize, ncclDataType_t, Option<(&'static str, c_int)>, cudaStream_t) {
        let rank = match self.entry {
            Entry::Send(_, peer) | Entry::Recv(_, peer) => Some(("peer", peer)),
            Entry::Reduce(_, _, root) | Entry::Rooted(_, root) => Some(("root", root)),
            Entry::Reducing(..) | Entry::Plain(_) => None,
        };
        (self.count, self.dtype, rank, self.stream)
    }

    /// Hands the call to NCCL and returns its result code. Outside a group NCCL has enqueued the
    /// work when this returns; inside one it has recorded it until `ncclGroupEnd`.
    ///
    /// # Safety
    ///
    /// The call must have been built by one of [`crate::Collectives`]' methods, whose checks make
    /// every pointer valid for the count, type and rank the call names, on the communicator's
    /// device (trusting each buffer's [`DeviceMemory`](crate::DeviceMemory) promise); the buffers
    /// must stay borrowed, and their stream guards kept, until the call is settled (after
    /// `ncclGroupEnd` in a group); the communicator must still be live — not aborted since the
    /// call was built, which code run in between (the buffers' own, through `take`) can do: a
    /// direct call checks again right before issuing (`Plan::submit`), a group at launch (see
    /// `Group::launch`). If the stream is being
    /// captured, it must be by the capture scope of `gpucomm-ordering`, whose graph keeps the
    /// buffers and the communicator (taking the pointers through an `Access` ensures both).
    #[inline(always)]
    pub(crate) unsafe fn issue(&self) -> ncclResult_t {
        let (send, recv) = (self.send as *const c_void, self.recv as *mut c_void);
        let (n, t, c, s) = (self.count, self.dtype, self.comm, self.stream);
        // SAFETY: forwarded from this function's contract; each function gets the arguments of its
        // C signature (the `Entry` shapes are the bindgen signatures, checked by the compiler).
        unsafe {
            match self.entry {
                Entry::Reducing(f, op) => f(send, recv, n, t, op, c, s),
                Entry::Reduce(f, op, root) => f(send, recv, n, t, op, root, c, s),
                Entry::Rooted(f, root) => f(send, recv, n, t, root, c, s),
                Entry::Plain(f) => f(send, recv, n, t, c, s),
                Entry::Send(f, peer) => f(send, n, t, peer, c, s),
                Entry::Recv(f, peer) => f(recv, n, t, peer, c, s),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Kind;

    #[test]
    #[cfg(nccl_2_28)]
    fn a_rooted_calls_buffer_of_a_block_per_rank_counts_on_the_root_only() {
        // Blocks of 16 bytes, 4 ranks, this rank 1: a gather's receive buffer, a scatter's send
        // buffer.
        let sides = |kind: Kind, buffers| kind.shape().sides(buffers, 16, 1, 4);
        assert_eq!(sides(Kind::Gather(1), (100, 200)), [(100, 16), (200, 64)], "gather on the root");
        assert_eq!(sides(Kind::Gather(0), (100, 200)), [(100, 16), (200, 0)], "gather off the root");
        assert_eq!(sides(Kind::Scatter(3), (100, 200)), [(100, 0), (200, 16)], "scatter off the root");
        assert_eq!(sides(Kind::AlltoAll, (100, 200)), [(100, 64), (200, 64)], "all-to-all");
        assert_eq!(sides(Kind::AllGather, (100, 200)), [(100, 16), (200, 64)], "all-gather");
        // A broadcast off the root reads nothing, but its send address is its receive buffer's.
        assert_eq!(sides(Kind::Broadcast(0), (200, 200)), [(200, 16), (200, 16)], "broadcast off the root");
        assert_eq!(
            sides(Kind::Reduce(nccl_sys::ncclRedOp_t(0), 0), (100, 0)),
            [(100, 16), (0, 0)],
            "a reduce off the root"
        );
    }
}
