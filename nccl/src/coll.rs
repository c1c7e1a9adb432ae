//! Every NCCL communication call — collectives and point-to-point — written once, for every
//! target: a communicator on its own stream, [`crate::Comm::on`] another stream, or a [`crate::Member`]
//! of a [`crate::group`].
//!
//! Each method checks what NCCL does not (buffer lengths, × the number of ranks where the call
//! needs it, overflow, roots and peers, the device of every buffer and of the stream,
//! the element type against the loaded library, a custom operator against the communicator),
//! builds a [`Call`], and hands it to its target, which takes the buffers' pointers through
//! [`gpucomm_ordering::Access`] and issues or records it.

use gpucomm_ordering::range;
use gpucomm_ordering::{Access, DeviceBuffer, DeviceBufferMut, Guard};

use crate::call::{Call, Kind};
use crate::error::{Error, Result};
use crate::op::{OpUse, Reduction};
use crate::target::{Plan, Target};
use crate::NcclType;

/// The root of a rooted call, as this rank sees it: either this rank, with the buffer only the
/// root uses, or another rank (and no buffer).
///
/// ```no_run
/// # use nccl::{Collectives, Root, ReduceOp};
/// # fn demo(comm: &nccl::Comm, send: &cudarc::driver::CudaSlice<f32>, recv: &mut cudarc::driver::CudaSlice<f32>) -> nccl::Result<()> {
/// let root = 1;
/// // Only the root has a receive buffer; the others name the root.
/// comm.reduce(send, if comm.rank() == root { Root::Here(recv) } else { Root::Rank(root) }, ReduceOp::SUM)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum Root<B> {
    /// This rank is the root; the buffer only the root uses.
    Here(B),
    /// Another rank is the root. Naming this rank is [`Error::RootWithoutBuffer`].
    Rank(usize),
}

impl<B> Root<B> {
    /// The root's rank as NCCL takes it, and the buffer when this rank is the root.
    fn resolve(self, plan: &Plan<'_, '_>, call: &'static str) -> Result<(i32, Option<B>)> {
        match self {
            Root::Here(buf) => plan.check_rank("root", plan.comm.rank()).map(|r| (r, Some(buf))),
            Root::Rank(rank) if rank == plan.comm.rank() => Err(Error::RootWithoutBuffer { call, rank }),
            Root::Rank(rank) => plan.check_rank("root", rank).map(|r| (r, None)),
        }
    }
}

fn expect_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::LengthMismatch { what, expected, got })
    }
}

/// `count × ranks`, the length of a buffer holding one block per rank.
fn times(what: &'static str, count: usize, ranks: usize) -> Result<usize> {
    count.checked_mul(ranks).ok_or(Error::CountOverflow { what, count, factor: ranks })
}

/// The block length when `len` elements are split into one block per rank.
fn blocks(what: &'static str, len: usize, ranks: usize) -> Result<usize> {
    if len.is_multiple_of(ranks) {
        Ok(len / ranks)
    } else {
        Err(Error::NotDivisible { what, len, parts: ranks })
    }
}

/// This rank's block of an in-place buffer of `len` elements of `T`, one block per rank of
/// `comm`: the block's element count and its byte offset (the block lies inside a buffer that
/// exists, so the offset cannot overflow).
fn own_block<T>(comm: &crate::Comm, len: usize) -> Result<(usize, u64)> {
    let count = blocks("buffer", len, comm.size())?;
    Ok((count, (comm.rank() * count * size_of::<T>()) as u64))
}

/// A guard for a buffer the call does not use.
fn unused<'b>() -> Guard<'b> {
    Guard::NONE
}

/// The guard of the operator's device scalar, if any.
#[inline]
fn op_guard<'b, T>(op: &Option<OpUse<'b, T>>, access: &Access<'b>) -> Result<Guard<'b>> {
    match op {
        Some(op) => op.guard(access),
        None => Ok(unused()),
    }
}

/// `Ok` unless a call's send range (`s`, `send_len` elements of `T`) and receive range (`r`,
/// `recv_len` elements) share bytes in another way than NCCL's in-place form of `kind`. Views
/// taken through `&self` (NVSHMEM's `Symmetric::slice`, a peer view of this PE, a framework's
/// tensors) can name the same memory, which the borrows of `&send` and `&mut recv` cannot see,
/// and NCCL would then read bytes it has already overwritten.
#[inline]
fn apart<T>(
    call: &'static str,
    kind: Kind,
    rank: usize,
    (s, send_len): (u64, usize),
    (r, recv_len): (u64, usize),
) -> Result<()> {
    let (send_bytes, recv_bytes) = (send_len * size_of::<T>(), recv_len * size_of::<T>());
    if range::share_a_byte((s, send_bytes), (r, recv_bytes)) {
        in_place_form(call, kind, rank, (s, send_bytes), (r, recv_bytes))
    } else {
        Ok(())
    }
}

/// `Ok` when overlapping send and receive ranges (address, bytes) are NCCL's in-place form of
/// `kind` for `rank`, the form the `_in_place` methods pass; [`Error::Overlap`] otherwise.
#[cold]
fn in_place_form(call: &'static str, kind: Kind, rank: usize, send: (u64, usize), recv: (u64, usize)) -> Result<()> {
    match kind.shape().in_place_rule(rank, send, recv) {
        (_, true) => Ok(()),
        (rule, false) => Err(Error::Overlap { call, in_place: rule }),
    }
}

/// The end of every call with a send and a receive buffer (lengths already checked): both on the
/// communicator's device, then `kind` over `count` elements from `send` to `recv`, whose ranges
/// must not overlap but in NCCL's in-place form.
#[inline]
fn two_buffers<'b, T: NcclType>(
    p: Plan<'_, 'b>,
    kind: Kind,
    count: usize,
    send: &'b impl DeviceBuffer<T>,
    recv: &'b mut impl DeviceBufferMut<T>,
    op: Option<OpUse<'b, T>>,
) -> Result<()> {
    p.check_device("send buffer", send)?;
    p.check_device("recv buffer", &*recv)?;
    let call = Call::new::<T>(kind, count, p.comm, p.stream)?;
    let (name, rank, lens) = (call.name(), p.comm.rank(), (send.len(), recv.len()));
    p.submit(call, |a, kept: &mut [_; 3]| {
        let (s, gs) = a.read(send)?;
        kept[0] = gs;
        let (r, gr) = a.write(recv)?;
        kept[1] = gr;
        apart::<T>(name, kind, rank, (s, lens.0), (r, lens.1))?;
        kept[2] = op_guard(&op, a)?;
        Ok((s, r))
    })
}

/// The end of every in-place call: `buf` on the communicator's device, then `kind` over `count`
/// elements, reading at `send` bytes into `buf` and writing at `recv` bytes into it (`None`: no
/// receive buffer, passed to NCCL as null).
fn one_buffer<'b, T: NcclType>(
    p: Plan<'_, 'b>,
    kind: Kind,
    count: usize,
    buf: &'b mut impl DeviceBufferMut<T>,
    (send, recv): (u64, Option<u64>),
    op: Option<OpUse<'b, T>>,
) -> Result<()> {
    p.check_device("buffer", &*buf)?;
    let call = Call::new::<T>(kind, count, p.comm, p.stream)?;
    p.submit(call, |a, kept| {
        let (b, g) = a.write(buf)?;
        *kept = [g, op_guard(&op, a)?];
        Ok((b + send, recv.map_or(0, |r| b + r)))
    })
}

/// NCCL's communication calls, on every kind of target: a [`Comm`](crate::Comm) (its own
/// stream), [`Comm::on`](crate::Comm::on) (another stream of its device), and a
/// [`Member`](crate::Member) of a [`group`](crate::group) (recorded, launched when the group
/// ends). Bring it into scope with `use nccl::Collectives;` (or `use nccl::prelude::*;`).
///
/// Buffers are [`DeviceBuffer`] (read) / [`DeviceBufferMut`] (written) types: cudarc's
/// [`CudaSlice`](cudarc::driver::CudaSlice) and its views, this crate's
/// [`MemBuffer`](crate::MemBuffer) (the recommended type: see its documentation) and views,
/// `nvshmem`'s symmetric buffers, and any type whose owner promised its length and ordering with
/// `unsafe impl` [`DeviceMemory`](crate::DeviceMemory) (a framework's tensor). Their pointers are
/// taken through [`gpucomm_ordering::Access`], so every call is ordered after earlier uses of its
/// buffers on other streams. Inside [`crate::capture`] calls are captured into the graph; on a
/// stream captured by anything else they are refused. Every buffer, and the stream, must be on the
/// communicator's device. Buffers of zero elements are accepted: NCCL does nothing with them. A
/// send and a receive buffer that share bytes (views of one buffer taken through `&self`, such as
/// `nvshmem`'s `Symmetric::slice`) are refused, [`Error::Overlap`](crate::Error::Overlap), unless
/// they are NCCL's in-place form of the call (prefer the `_in_place` methods).
///
/// Each method returns once NCCL has enqueued the work (direct calls) or recorded the call (in a
/// group). A refused call has no effect on any buffer and leaves the communicator usable. Every
/// rank must make the same calls in the same order, with matching counts.
///
/// The buffers are borrowed for `'b`: the call for direct targets, the whole group for a
/// [`Member`](crate::Member), so that no buffer can be moved, freed or written before NCCL has
/// enqueued the work that uses it.
///
/// Sealed: implemented by this crate's targets only.
pub trait Collectives<'b>: Target<'b> {
    /// Reduces `send` across all ranks with `op` into `recv` on every rank (`ncclAllReduce`).
    /// Both buffers have the same length.
    #[doc(alias = "ncclAllReduce")]
    fn all_reduce<T: NcclType>(
        self,
        send: &'b impl DeviceBuffer<T>,
        recv: &'b mut impl DeviceBufferMut<T>,
        op: impl Reduction<'b, T>,
    ) -> Result<()> {
        self.dispatch(|p| {
            expect_len("recv buffer", send.len(), recv.len())?;
            let op = op.resolve(p.comm)?;
            two_buffers(p, Kind::AllReduce(op.raw()), send.len(), send, recv, Some(op))
        })
    }

    /// [`all_reduce`](Self::all_reduce) with `buf` as both input and output.
    #[doc(alias = "ncclAllReduce")]
    fn all_reduce_in_place<T: NcclType>(
        self,
        buf: &'b mut impl DeviceBufferMut<T>,
        op: impl Reduction<'b, T>,
    ) -> Result<()> {
        self.dispatch(|p| {
            let op = op.resolve(p.comm)?;
            one_buffer(p, Kind::AllReduce(op.raw()), buf.len(), buf, (0, Some(0)), Some(op))
        })
    }

    /// Copies the root's `send` into `recv` on every rank (`ncclBroadcast`). The root passes
    /// `Root::Here(&send)` (of `recv`'s length), the others `Root::Rank(root)`.
    #[doc(alias = "ncclBroadcast")]
    fn broadcast<T: NcclType>(
        self,
        send: Root<&'b dyn DeviceBuffer<T>>,
        recv: &'b mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.dispatch(|p| {
            let (root, send) = send.resolve(&p, "ncclBroadcast")?;
            if let Some(send) = send {
                expect_len("recv buffer", send.len(), recv.len())?;
                p.check_device("send buffer", send)?;
            }
            p.check_device("recv buffer", &*recv)?;
            let kind = Kind::Broadcast(root);
            let call = Call::new::<T>(kind, recv.len(), p.comm, p.stream)?;
            let (name, rank, len) = (call.name(), p.comm.rank(), recv.len());
            p.submit(call, |a, kept| {
                let (r, gr) = a.write(recv)?;
                // Off the root NCCL does not read the send buffer; passing the receive buffer
                // there is what the in-place `ncclBcast` does.
                let (s, gs) = match send {
                    Some(send) => {
                        let (s, gs) = a.read::<T>(send)?;
                        apart::<T>(name, kind, rank, (s, len), (r, len))?;
                        (s, gs)
                    }
                    None => (r, unused()),
                };
                *kept = [gs, gr];
                Ok((s, r))
            })
        })
    }

    /// Copies the root's `buf` into `buf` on every other rank (`ncclBroadcast` in place, as the
    /// deprecated `ncclBcast`). Every rank passes a buffer of the same length.
    #[doc(alias = "ncclBroadcast")]
    #[doc(alias = "ncclBcast")]
    fn broadcast_in_place<T: NcclType>(self, buf: &'b mut impl DeviceBufferMut<T>, root: usize) -> Result<()> {
        self.dispatch(|p| {
            let root = p.check_rank("root", root)?;
            one_buffer(p, Kind::Broadcast(root), buf.len(), buf, (0, Some(0)), None)
        })
    }

    /// Reduces `send` across all ranks with `op` into the root's receive buffer (`ncclReduce`).
    /// The root passes `Root::Here(&mut recv)` (of `send`'s length), the others
    /// `Root::Rank(root)`.
    #[doc(alias = "ncclReduce")]
    fn reduce<T: NcclType>(
        self,
        send: &'b impl DeviceBuffer<T>,
        recv: Root<&'b mut dyn DeviceBufferMut<T>>,
        op: impl Reduction<'b, T>,
    ) -> Result<()> {
        self.dispatch(|p| {
            let (root, recv) = recv.resolve(&p, "ncclReduce")?;
            if let Some(recv) = &recv {
                expect_len("recv buffer", send.len(), recv.len())?;
                p.check_device("recv buffer", &**recv)?;
            }
            p.check_device("send buffer", send)?;
            let op = op.resolve(p.comm)?;
            let kind = Kind::Reduce(op.raw(), root);
            let call = Call::new::<T>(kind, send.len(), p.comm, p.stream)?;
            let (name, rank) = (call.name(), p.comm.rank());
            p.submit(call, |a, kept| {
                let (s, gs) = a.read(send)?;
                // NCCL: "recvbuff may be NULL on all calls except for root device".
                let (r, gr) = match recv {
                    Some(recv) => a.write::<T>(recv)?,
                    None => (0, unused()),
                };
                if r != 0 {
                    apart::<T>(name, kind, rank, (s, send.len()), (r, send.len()))?;
                }
                *kept = [gs, gr, op.guard(a)?];
                Ok((s, r))
            })
        })
    }

    /// [`reduce`](Self::reduce) with `buf` as input on every rank and as output on the root
    /// (`ncclReduce` in place). Other ranks' buffers are only read.
    #[doc(alias = "ncclReduce")]
    fn reduce_in_place<T: NcclType>(
        self,
        buf: &'b mut impl DeviceBufferMut<T>,
        op: impl Reduction<'b, T>,
        root: usize,
    ) -> Result<()> {
        self.dispatch(|p| {
            let root_rank = p.check_rank("root", root)?;
            let op = op.resolve(p.comm)?;
            // Off the root, NCCL takes a null receive buffer: the buffer is only read there.
            let recv = (root == p.comm.rank()).then_some(0);
            one_buffer(p, Kind::Reduce(op.raw(), root_rank), buf.len(), buf, (0, recv), Some(op))
        })
    }

    /// Gathers every rank's `send` into `recv`, ordered by rank (`ncclAllGather`): `recv` holds
    /// `send.len() × size()` elements.
    #[doc(alias = "ncclAllGather")]
    fn all_gather<T: NcclType>(
        self,
        send: &'b impl DeviceBuffer<T>,
        recv: &'b mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.dispatch(|p| {
            expect_len("recv buffer", times("send buffer", send.len(), p.comm.size())?, recv.len())?;
            two_buffers(p, Kind::AllGather, send.len(), send, recv, None)
        })
    }

    /// [`all_gather`](Self::all_gather) in place: `buf` holds one block per rank, and this rank's
    /// contribution is its own block, `buf[rank × n .. (rank + 1) × n]` with `n = buf.len() /
    /// size()` (NCCL's rule `sendbuff == recvbuff + rank × sendcount`).
    #[doc(alias = "ncclAllGather")]
    fn all_gather_in_place<T: NcclType>(self, buf: &'b mut impl DeviceBufferMut<T>) -> Result<()> {
        self.dispatch(|p| {
            let (count, own) = own_block::<T>(p.comm, buf.len())?;
            one_buffer(p, Kind::AllGather, count, buf, (own, Some(0)), None)
        })
    }

    /// Reduces `send` across all ranks with `op` and leaves block `rank()` of the result in
    /// `recv` (`ncclReduceScatter`): `send` holds `recv.len() × size()` elements.
    #[doc(alias = "ncclReduceScatter")]
    fn reduce_scatter<T: NcclType>(
        self,
        send: &'b impl DeviceBuffer<T>,
        recv: &'b mut impl DeviceBufferMut<T>,
        op: impl Reduction<'b, T>,
    ) -> Result<()> {
        self.dispatch(|p| {
            expect_len("send buffer", times("recv buffer", recv.len(), p.comm.size())?, send.len())?;
            let op = op.resolve(p.comm)?;
            two_buffers(p, Kind::ReduceScatter(op.raw()), recv.len(), send, recv, Some(op))
        })
    }

    /// [`reduce_scatter`](Self::reduce_scatter) in place: `buf` holds one block per rank, and
    /// this rank's block of the result is left in its own block, `buf[rank × n .. (rank + 1) ×
    /// n]` with `n = buf.len() / size()` (NCCL's rule `recvbuff == sendbuff + rank ×
    /// recvcount`); the other blocks are unspecified afterwards.
    #[doc(alias = "ncclReduceScatter")]
    fn reduce_scatter_in_place<T: NcclType>(
        self,
        buf: &'b mut impl DeviceBufferMut<T>,
        op: impl Reduction<'b, T>,
    ) -> Result<()> {
        self.dispatch(|p| {
            let (count, own) = own_block::<T>(p.comm, buf.len())?;
            let op = op.resolve(p.comm)?;
            one_buffer(p, Kind::ReduceScatter(op.raw()), count, buf, (0, Some(own)), Some(op))
        })
    }

    /// Sends block `j` of `send` to rank `j` and receives rank `i`'s block for this rank into
    /// block `i` of `recv` (`ncclAlltoAll`, NCCL ≥ 2.28.3). Both buffers hold one block per rank
    /// (the same length, a multiple of `size()`).
    #[cfg(nccl_2_28)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_28)))]
    #[doc(alias = "ncclAlltoAll")]
    fn all_to_all<T: NcclType>(
        self,
        send: &'b impl DeviceBuffer<T>,
        recv: &'b mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.dispatch(|p| {
            expect_len("recv buffer", send.len(), recv.len())?;
            let count = blocks("send buffer", send.len(), p.comm.size())?;
            two_buffers(p, Kind::AlltoAll, count, send, recv, None)
        })
    }

    /// Gathers every rank's `send` into the root's `recv`, ordered by rank (`ncclGather`, NCCL ≥
    /// 2.28.3). Every rank passes a `recv` of `send.len() × size()` elements; NCCL writes only
    /// the root's. (Other ranks need one too: with symmetric windows NCCL's copy-engine path
    /// addresses the root's buffer through each rank's own.)
    #[cfg(nccl_2_28)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_28)))]
    #[doc(alias = "ncclGather")]
    fn gather<T: NcclType>(
        self,
        send: &'b impl DeviceBuffer<T>,
        recv: &'b mut impl DeviceBufferMut<T>,
        root: usize,
    ) -> Result<()> {
        self.dispatch(|p| {
            let root = p.check_rank("root", root)?;
            expect_len("recv buffer", times("send buffer", send.len(), p.comm.size())?, recv.len())?;
            two_buffers(p, Kind::Gather(root), send.len(), send, recv, None)
        })
    }

    /// Sends block `i` of the root's `send` to rank `i`'s `recv` (`ncclScatter`, NCCL ≥ 2.28.3).
    /// Every rank passes a `send` of `recv.len() × size()` elements; NCCL reads only the root's
    /// (see [`gather`](Self::gather) for why the others need one).
    #[cfg(nccl_2_28)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_28)))]
    #[doc(alias = "ncclScatter")]
    fn scatter<T: NcclType>(
        self,
        send: &'b impl DeviceBuffer<T>,
        recv: &'b mut impl DeviceBufferMut<T>,
        root: usize,
    ) -> Result<()> {
        self.dispatch(|p| {
            let root = p.check_rank("root", root)?;
            expect_len("send buffer", times("recv buffer", recv.len(), p.comm.size())?, send.len())?;
            two_buffers(p, Kind::Scatter(root), recv.len(), send, recv, None)
        })
    }

    /// [`gather`](Self::gather) in place: every rank passes `buf` of one block per rank, its
    /// contribution in its own block, `buf[rank × n .. (rank + 1) × n]` with `n = buf.len() /
    /// size()` (NCCL's rule `sendbuff == recvbuff + rank × sendcount`); the root's `buf` receives
    /// every block, the others' are left as they were.
    #[cfg(nccl_2_28)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_28)))]
    #[doc(alias = "ncclGather")]
    fn gather_in_place<T: NcclType>(self, buf: &'b mut impl DeviceBufferMut<T>, root: usize) -> Result<()> {
        self.dispatch(|p| {
            let root = p.check_rank("root", root)?;
            let (count, own) = own_block::<T>(p.comm, buf.len())?;
            one_buffer(p, Kind::Gather(root), count, buf, (own, Some(0)), None)
        })
    }

    /// [`scatter`](Self::scatter) in place: every rank passes `buf` of one block per rank; block
    /// `i` of the root's `buf` lands in block `i` of rank `i`'s, `buf[i × n .. (i + 1) × n]` with
    /// `n = buf.len() / size()` (NCCL's rule `recvbuff == sendbuff + rank × recvcount`); the
    /// other blocks are left as they were.
    #[cfg(nccl_2_28)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_28)))]
    #[doc(alias = "ncclScatter")]
    fn scatter_in_place<T: NcclType>(self, buf: &'b mut impl DeviceBufferMut<T>, root: usize) -> Result<()> {
        self.dispatch(|p| {
            let root = p.check_rank("root", root)?;
            let (count, own) = own_block::<T>(p.comm, buf.len())?;
            one_buffer(p, Kind::Scatter(root), count, buf, (0, Some(own)), None)
        })
    }

    /// Sends `buf` to `peer` (`ncclSend`), which must post a matching [`recv`](Self::recv) of the
    /// same length and type. A direct send blocks the stream until the peer receives; pair sends
    /// with receives in a [`group`](crate::group) (rings, exchanges) or they deadlock.
    #[doc(alias = "ncclSend")]
    fn send<T: NcclType>(self, buf: &'b impl DeviceBuffer<T>, peer: usize) -> Result<()> {
        self.dispatch(|p| {
            let peer = p.check_rank("peer", peer)?;
            p.check_device("send buffer", buf)?;
            let call = Call::new::<T>(Kind::Send(peer), buf.len(), p.comm, p.stream)?;
            p.submit(call, |a, kept| {
                let (s, g) = a.read(buf)?;
                *kept = [g];
                Ok((s, 0))
            })
        })
    }

    /// Receives `buf.len()` elements from `peer` into `buf` (`ncclRecv`); the peer must post a
    /// matching [`send`](Self::send).
    #[doc(alias = "ncclRecv")]
    fn recv<T: NcclType>(self, buf: &'b mut impl DeviceBufferMut<T>, peer: usize) -> Result<()> {
        self.dispatch(|p| {
            let peer = p.check_rank("peer", peer)?;
            p.check_device("recv buffer", &*buf)?;
            let call = Call::new::<T>(Kind::Recv(peer), buf.len(), p.comm, p.stream)?;
            p.submit(call, |a, kept| {
                let (r, g) = a.write(buf)?;
                *kept = [g];
                Ok((0, r))
            })
        })
    }
}

impl<'b, X: Target<'b>> Collectives<'b> for X {}

#[cfg(test)]
mod tests {
    use nccl_sys::ncclRedOp_t;

    use super::{apart, Kind};
    use crate::Error;

    fn rule(r: crate::Result<()>) -> Option<&'static str> {
        match r {
            Ok(()) => None,
            Err(Error::Overlap { in_place, .. }) => Some(in_place),
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn only_nccls_in_place_forms_may_overlap() {
        let sum = ncclRedOp_t(0);
        // Rank 1 of blocks of 4 f32 (16 bytes), buffers at 1000 and up.
        let ar = |s, r| rule(apart::<f32>("ncclAllReduce", Kind::AllReduce(sum), 1, (s, 4), (r, 4)));
        assert_eq!(ar(1000, 1016), None, "apart");
        assert_eq!(ar(1000, 1000), None, "in place");
        assert_eq!(ar(1000, 1004), Some("sendbuff == recvbuff"));
        let ag = |s, r| rule(apart::<f32>("ncclAllGather", Kind::AllGather, 1, (s, 4), (r, 8)));
        assert_eq!(ag(1016, 1000), None, "own block of the receive buffer");
        assert_eq!(ag(1000, 1000), Some("sendbuff == recvbuff + rank × sendcount"), "rank 0's block");
        let rs = |s, r| rule(apart::<f32>("ncclReduceScatter", Kind::ReduceScatter(sum), 1, (s, 8), (r, 4)));
        assert_eq!(rs(1000, 1016), None, "own block of the send buffer");
        assert_eq!(rs(1000, 1008), Some("recvbuff == sendbuff + rank × recvcount"));
        #[cfg(nccl_2_28)]
        {
            // Rank 1 of 2: off the root a gather does not use its receive buffer, nor a scatter
            // its send buffer; on the root the rule names the root's block.
            let gather = |root, s, r| rule(apart::<f32>("ncclGather", Kind::Gather(root), 1, (s, 4), (r, 8)));
            assert_eq!(gather(0, 1000, 1000), None, "off the root");
            assert_eq!(gather(1, 1016, 1000), None, "the root's own block");
            assert_eq!(gather(1, 1000, 1000), Some("sendbuff == recvbuff + root × sendcount"));
            let scatter = |root, s, r| rule(apart::<f32>("ncclScatter", Kind::Scatter(root), 1, (s, 8), (r, 4)));
            assert_eq!(scatter(0, 1000, 1004), None, "off the root");
            assert_eq!(scatter(1, 1000, 1016), None, "the root's own block");
            assert_eq!(scatter(1, 1000, 1004), Some("recvbuff == sendbuff + root × recvcount"));
        }
        let p2p = rule(apart::<f32>("ncclSend", Kind::Send(0), 1, (1000, 4), (1000, 4)));
        assert_eq!(p2p, Some("none"));
        // An offset past the address space is no in-place form.
        let far = rule(apart::<u8>("ncclAllGather", Kind::AllGather, 3, (u64::MAX - 1, 1), (u64::MAX - 2, 3)));
        assert_eq!(far, Some("sendbuff == recvbuff + rank × sendcount"));
    }
}
