//! CUDA graphs of NCCL calls: [`capture`], this crate's entry point to the capture scope of
//! `gpucomm-ordering`, and what a graph keeps of a communicator (borrowed communicators, buffers,
//! windows and custom operators implement [`Keep`] where they are defined).

use std::sync::Arc;

use cudarc::driver::CudaStream;
use gpucomm_ordering::{Access, Captured, Keep, Resource, Visitor};

use crate::error::{Error, Result};
use crate::group::open::refuse_inside;
use crate::Comm;

/// What a graph calls a communicator.
const KIND: &str = "communicator";

/// The communicator as a resource a graph must keep, named by its abort state's allocation
/// (the address [`Comm::identity`] gives), not the `Comm`'s address: a capture's hold keeps that allocation alive,
/// so a communicator torn down inside the capture's closure and another moved to its place are
/// two resources, and a keep set that borrows the new one does not keep the old one's calls.
fn communicator(comm: &Comm) -> Resource {
    Resource::of(KIND, comm.identity_ref())
}

/// Admits a call on `comm` through `access`: refuses a capture this crate did not open (or one
/// CUDA invalidated), and inside this crate's capture scope records the communicator, which the
/// graph must keep, with a hold on it (the first time): NCCL holds the captured work from the
/// call on, before the graph is made, and until that graph is destroyed. While such holds live,
/// an abort that cannot wait for the graphs (a timeout, an [`AbortHandle`](crate::AbortHandle))
/// only stops the communicator's work and leaves freeing it to its owner's teardown, and a
/// teardown that finds one (a graph forgotten with `mem::forget`, or a teardown inside the
/// capture) abandons the communicator ([`Error::GraphForgotten`](crate::Error::GraphForgotten)):
/// NCCL's own destroy and abort would wait until every graph holding its work is destroyed.
///
/// A nonblocking communicator's calls are captured only where NCCL has `ncclCommRevoke`
/// (2.28.7, in the headers and the loaded library): an abort while graphs hold the communicator
/// stops its work with it, which also joins the background job of a call still in progress.
/// Without it the abort would stop nothing, and a call that NCCL's background thread launches
/// after this crate gave up waiting would run on buffers handed back meanwhile.
#[inline(always)]
pub(crate) fn admit_call(access: &Access<'_>, comm: &Comm) -> Result<()> {
    if access.capturing()? {
        if let Some(setting) = comm.graphs_unmixed() {
            return Err(Error::GraphMixingOff { setting });
        }
        if comm.is_nonblocking() {
            revocable()?;
        }
        access.resource_held(communicator(comm), || comm.graph_hold())?;
    }
    Ok(())
}

/// `Ok` when the loaded library has `ncclCommRevoke`.
#[cfg(nccl_2_28_7)]
fn revocable() -> Result<()> {
    crate::ffi::require(
        nccl_sys::Version::new(2, 28, 7),
        "capturing a nonblocking communicator's calls (an abort while a graph holds them stops them with ncclCommRevoke)",
    )
}

/// Headers older than `ncclCommRevoke`: refused whatever the library.
#[cfg(not(nccl_2_28_7))]
fn revocable() -> Result<()> {
    Err(Error::Unsupported {
        what: concat!(
            "capturing a nonblocking communicator's calls with this build's headers (older than NCCL 2.28.7: ",
            "rebuild against newer ones; an abort while a graph holds them stops them with ncclCommRevoke)"
        ),
        needed: nccl_sys::Version::new(2, 28, 7),
        loaded: crate::ffi::lib_version()?,
    })
}

// SAFETY: the borrow keeps the communicator alive and in place; an aborted or revoked one is
// reported closed, so that no launch reaches it.
unsafe impl Keep for &Comm {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        self.report_kept(v);
    }
}

impl Comm {
    /// Reports this communicator to a graph's visitor as a resource the graph keeps, closed once
    /// aborted or revoked (a revoke frees the pools the captured calls' host nodes write): what `&Comm` in a keep set does, and what the [`Keep`] implementation of a type
    /// that holds a `&Comm` and makes calls on it (such as gpucomm-kernels' `AllReduce`) calls,
    /// so that a graph keeping that type keeps the communicator. (A graph whose captured calls
    /// used the communicator also holds it, which aborts and teardown heed: see
    /// [`Comm::abort`] and [`Error::GraphForgotten`].)
    pub fn report_kept<'k>(&'k self, v: &mut Visitor<'k>) {
        v.resource(communicator(self), !self.is_aborted() && !self.is_revoked());
    }
}

/// Captures the NCCL calls (and cudarc work) `f` makes on `stream` into a CUDA graph that keeps
/// `keep` — the buffers, communicators and custom operators those calls use — for as long as the
/// graph lives, and whose launches are ordered like calls (`gpucomm_ordering::capture` with this
/// crate's error type; see [`gpucomm_ordering::graph`] for the rules).
///
/// * **What the graph keeps.** `keep` is any tuple, array, `Vec` or `Option` of buffers (by value,
///   `&` or `&mut`), `&Comm` (or `&BorrowedComm`), `&PreMulSum`, registered buffers (`&Registration`,
///   `&mut Registration`, or `reg.buffer_mut()`), windows (`&Window` where the calls only read
///   them; `&mut Window`, by value, or a view where they write them), and NVSHMEM's runtimes,
///   teams and symmetric buffers.
///   `f` gets it back (`&mut keep`) to make its calls; a call that uses a buffer or communicator
///   not in `keep` makes the capture fail ([`gpucomm_ordering::OrderError::NotKept`] and
///   friends), so the graph can never outlive what it uses: the compiler sees to the borrows.
/// * **Launches are ordered.** [`Graph::launch`](crate::Graph::launch) makes the stream wait for
///   earlier uses of the kept buffers on other streams, and records the launch as their last use
///   (a write where a call writes them): outputs read afterwards on any stream, and buffers freed
///   afterwards, wait for the graph.
/// * **Between launches** read outputs with [`Graph::kept`](crate::Graph::kept) and write inputs
///   with [`Graph::kept_mut`](crate::Graph::kept_mut);
///   [`Graph::into_kept`](crate::Graph::into_kept) gives everything back.
/// * Only the calls on `stream` are captured; calls on other streams inside `f` run at once. A
///   call on a stream captured by anything else — cudarc's `begin_capture` included — is refused,
///   inside or outside `f`.
///
/// A call on a communicator made with NCCL's graph mixing off (`NCCL_GRAPH_MIXING_SUPPORT=0`,
/// or the config fields of NCCL ≥ 2.29 that turn it off) is refused with
/// [`crate::Error::GraphMixingOff`]: these graphs rely on NCCL ordering eager calls after their
/// launches.
///
/// Refused with [`crate::Error::InsideGroup`] inside a [`crate::group`], which counts as a refused
/// call of that group (it then launches nothing, as for any direct call inside it); a group inside
/// `f` is fine.
///
/// Every failure hands `keep` back with the error, `Err((keep, error))`, as the registration calls
/// do with their buffer: members given by value are never lost to a refused capture. Where nothing
/// is owned, `.map_err(|(_, e)| e)?` drops the borrows.
///
/// ```no_run
/// use cudarc::driver::CudaContext;
/// use nccl::{Collectives, Comm, MemBuffer, PreMulSum};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = CudaContext::new(0)?;
/// let home = ctx.default_stream();
/// let side = ctx.new_stream()?; // the legacy default stream cannot be captured
/// let comm = Comm::init_rank(home.clone(), &nccl::UniqueId::new()?, 0, 1)?;
/// let average = PreMulSum::host(&comm, 1.0 / comm.size() as f32)?;
/// let grads = MemBuffer::from_host(&home, &[1.0f32; 1024])?;
///
/// // The graph keeps the communicator and the operator by reference, the gradients by value;
/// // the closure gets them back to make its calls.
/// let mut step = nccl::capture(&side, (&comm, &average, grads), |(comm, average, grads)| {
///     comm.on(&side).all_reduce_in_place(grads, *average)
/// })
/// // A refused capture hands the keep set back: here the gradients would come back with the error.
/// .map_err(|(_kept, e)| e)?;
///
/// for _ in 0..100 {
///     // Write an input and read an output between launches, on any stream: each launch waits
///     // for the earlier uses and is recorded as the buffers' last use.
///     home.memcpy_htod(&[1.0f32; 1024], &mut step.kept_mut().2)?;
///     step.launch()?;
///     let averaged = home.clone_dtoh(&step.kept().2)?;
///     assert_eq!(averaged[0], 1.0);
/// }
/// // `comm` and `average` are borrowed by the graph: dropping either before it does not compile.
/// let (_, _, grads) = step.into_kept();
/// drop(grads); // waits for the last launch, then frees
/// # Ok(()) }
/// ```
#[doc(alias = "cuStreamBeginCapture")]
#[doc(alias = "cuStreamEndCapture")]
pub fn capture<K: Keep>(stream: &Arc<CudaStream>, keep: K, f: impl FnOnce(&mut K) -> Result<()>) -> Captured<K, Error> {
    if let Err(e) = refuse_inside() {
        return Err((keep, e));
    }
    gpucomm_ordering::capture(stream, keep, f)
}
