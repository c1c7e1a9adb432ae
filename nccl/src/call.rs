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
    /// Whether the send and the receive buffer hold one block of the call's count per rank.
    #[inline(always)]
    fn per_rank(self) -> [bool; 2] {
        match self {
            Kind::AllGather => [false, true],
            #[cfg(nccl_2_28)]
            Kind::Gather(_) => [false, true],
            Kind::ReduceScatter(_) => [true, false],
            #[cfg(nccl_2_28)]
            Kind::Scatter(_) => [true, false],
            #[cfg(nccl_2_28)]
            Kind::AlltoAll => [true, true],
            Kind::AllReduce(_) | Kind::Broadcast(_) | Kind::Reduce(..) | Kind::Send(_) | Kind::Recv(_) => {
                [false, false]
            }
        }
    }
}

/// The ranges `(address, bytes)` of a call's send and receive buffers `(send, recv)`, of one
/// `block` of bytes each, or one per rank of `ranks` where `per_rank` says so; empty for a buffer
/// the call does not take (address 0), and for the buffer of one block per rank of a rooted call
/// off its root (`off_root`): NCCL's gather uses the receive buffer, and its scatter the send
/// buffer, on the root only.
fn sides(
    (send, recv): (CUdeviceptr, CUdeviceptr),
    block: usize,
    ranks: usize,
    per_rank: [bool; 2],
    off_root: bool,
) -> [(CUdeviceptr, usize); 2] {
    let side = |addr: CUdeviceptr, per_rank: bool| match (addr, per_rank, off_root) {
        (0, ..) | (_, true, true) => (addr, 0),
        (_, true, false) => (addr, block * ranks),
        (_, false, _) => (addr, block),
    };
    [side(send, per_rank[0]), side(recv, per_rank[1])]
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
    /// Whether the send and the receive buffer hold a block of `count` elements per rank.
    per_rank: [bool; 2],
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
            per_rank: kind.per_rank(),
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
    /// buffer) on rank `rank` of a communicator of `ranks` ranks ([`sides`]).
    pub(crate) fn spans(&self, rank: usize, ranks: usize) -> [(CUdeviceptr, usize); 2] {
        let off_root = matches!(self.entry, Entry::Rooted(_, root) if root as usize != rank);
        // The buffers exist with these sizes (the calls checked them), so no product overflows.
        let block = self.count * self.elem as usize;
        sides((self.send, self.recv), block, ranks, self.per_rank, off_root)
    }

    /// The C function's name, for errors and [`Comm::settle`].
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// True for calls NCCL carries out as sends and receives (its point-to-point planner).
    pub(crate) fn is_point_to_point(&self) -> bool {
        matches!(self.entry, Entry::Send(..) | Entry::Recv(..))
            || matches!(self.name, "ncclAlltoAll" | "ncclGather" | "ncclScatter")
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
    use super::sides;

    #[test]
    fn a_rooted_calls_buffer_of_a_block_per_rank_counts_on_the_root_only() {
        // Blocks of 16 bytes, 4 ranks: a gather's receive buffer, a scatter's send buffer.
        assert_eq!(sides((100, 200), 16, 4, [false, true], false), [(100, 16), (200, 64)], "gather on the root");
        assert_eq!(sides((100, 200), 16, 4, [false, true], true), [(100, 16), (200, 0)], "gather off the root");
        assert_eq!(sides((100, 200), 16, 4, [true, false], true), [(100, 0), (200, 16)], "scatter off the root");
        assert_eq!(sides((100, 200), 16, 4, [true, true], false), [(100, 64), (200, 64)], "all-to-all");
        // A broadcast off the root reads nothing, but its send address is its receive buffer's.
        assert_eq!(sides((200, 200), 16, 4, [false, false], true), [(200, 16), (200, 16)], "broadcast off the root");
        assert_eq!(sides((100, 0), 16, 4, [false, false], true), [(100, 16), (0, 0)], "a reduce off the root");
    }
}
