//! NVSHMEM's non-blocking copies and the calls that complete them (quiets and barriers), kept in
//! order across streams and captures.
//!
//! A `_nbi` operation on a stream hands its copy to one of NVSHMEM's internal streams and marks
//! that internal stream. A quiet or a barrier on *any* stream makes that stream wait for the marked
//! internal streams, then clears every mark (`nvshmemi_quiesce_internal_streams`, NVSHMEM 3.x). So
//! a quiet on stream B completes, for NVSHMEM, an operation issued on stream A, and a later quiet
//! on A — the one [`crate::Pending`] and the buffer's tracker enqueue — waits for nothing. Three
//! rules keep every quiescing call meaning what the crate says it means (all of it is
//! process-global, as NVSHMEM's marks are):
//!
//! - **Chained quiescing calls.** A quiescing call that may clear marks (a `_nbi` operation was
//!   issued since the last one) first clears them with a quiet on a private stream, which records
//!   an event after itself, and every later quiescing call on another stream waits for that event
//!   first. Chained like this, a quiet on any stream completes everything issued before it, on
//!   every stream, and waits for no other user stream's work: an event recorded after a quiet on
//!   a user stream would make every later quiet elsewhere wait for that stream's earlier work
//!   too (a signal wait there that a peer satisfies only after this PE's next quiet on another
//!   stream: a deadlock across PEs that NVSHMEM's own quiet, which waits for its copy streams
//!   only, does not have).
//! - **Captures start clean.** A quiet captured into a graph clears the marks when it is captured,
//!   but waits only when (and if) the graph is launched. Before the first NVSHMEM operation of a
//!   capture that could clear marks, eager copies still marked are completed on a private stream,
//!   chained like any quiescing call.
//! - **Captured copies own the internal streams.** A `_nbi` operation captured into a graph joins
//!   NVSHMEM's internal streams to that capture until it ends. Until then every other NVSHMEM
//!   call that uses them (a `_nbi` operation or quiescing call outside that capture, the host
//!   barrier, a team split or destroy; allocations and frees, through NVSHMEM's own barrier)
//!   is refused with [`Error::CopyStreamsCaptured`].
//!
//! A quiet captured for an operation issued outside the capture does not complete that operation
//! for its buffer's tracker ([`crate::Pending`] checks whether its quiet was captured). What a graph's
//! quiet or barrier completes when it runs is what was captured before it: an eager `_nbi`
//! operation issued before the launch must be quieted eagerly for a peer to rely on the graph's
//! barrier (its local buffer stays protected by its tracker either way).
//!
//! The crate's only quiescing calls on a stream are `nvshmemx_quiet_on_stream`,
//! `nvshmemx_barrier_all_on_stream` and `nvshmemx_barrier_on_stream`; NVSHMEM's host calls that
//! quiesce (`nvshmem_barrier_all`, allocation, free, team split and destroy) synchronise the
//! internal streams on the host, so what they clear has finished.
//!
//! # The collective chain
//!
//! NVSHMEM's collectives on a stream (barriers, syncs, reductions, broadcasts, fcollects,
//! alltoalls) update per-team device state — the team's sync counters, its psync slots — with
//! plain reads and writes from one kernel at a time, and pair up across PEs by the order those
//! updates happen in. Two collectives of one PE running at once on two streams lose an increment,
//! and the PEs' counters drift apart for good (later collectives wait for ever or pass early). The
//! host calls that run a collective on NVSHMEM's own stream (the host barrier, and the barriers
//! and reductions inside allocation, free and team split) are no different. So every eager
//! collective this crate enqueues (the user's, and the zeroing barrier of an allocation on the
//! private stream of [`crate::agree`]) goes through [`collective`]: it waits for an event
//! recorded after the last collective enqueued on another stream, and records that event after
//! itself. Each PE's collectives then run one at a time in the order they were enqueued, which
//! means that collectives over teams that share PEs must be enqueued in the same order on every
//! PE, as blocking collectives would need. Host calls that make a collective wait for that event
//! on the host first ([`host_collective`]); allocation, free and team split wait so once their
//! exchange of words, which makes no collective, has ended ([`collectives_finished`]), and team
//! destroy and finalize wait for the whole device.
//!
//! Collectives captured into a graph cannot wait for an eager event inside the capture; the graph
//! joins the chain instead ([`gpucomm_ordering::join_launches`]): each launch of a graph with a
//! collective waits for the last eager collective on another stream, and is recorded as the last
//! one. A kernel launched with [`crate::Kernel::launch_collective`] counts as one collective (the
//! kernels that make collectives on the device; [`crate::Kernel::launch`]'s contract rules them
//! out).

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{result, sys, CudaStream, DriverError};
use gpucomm_ordering::OrderError;

use crate::error::{Error, Result};
use crate::ffi::call;

/// The chain's state (see the module docs), set up by [`start`].
struct Chain {
    /// A private stream, never captured: eager copies are completed on it before a capture.
    flush: sys::CUstream,
    /// Recorded after the last quiescing call that may have cleared marks.
    event: sys::CUevent,
    /// The stream (its handle, only compared) `event` was last recorded on; `None` before.
    last: Option<usize>,
    /// NVSHMEM may hold marks: a `_nbi` operation was issued since the last quiescing call.
    marked: bool,
    /// The stream whose capture holds `_nbi` copies, and with them NVSHMEM's internal streams.
    captured: Option<Arc<CudaStream>>,
    /// Recorded after the last eager collective enqueued (see the module docs).
    collective: sys::CUevent,
    /// The stream (its handle, only compared) `collective` was last recorded on; `None` before the
    /// first, and once every collective enqueued so far is known to have finished.
    collective_on: Option<usize>,
    /// Why the chain is broken: a quiescing call that cleared marks, or a collective, could
    /// neither be recorded nor waited for, so later calls can no longer be ordered after it. Every
    /// later call is refused.
    broken: Option<DriverError>,
}

// SAFETY: the stream and event handles are plain driver handles of the PE's context, usable from
// any thread whose current context is the PE's (every call that enqueues or waits binds it first;
// other host calls only query the holder's capture state); the mutex makes one thread at a time
// use them.
unsafe impl Send for Chain {}

static CHAIN: Mutex<Option<Chain>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<Chain>> {
    CHAIN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` on the chain, unless it is broken.
fn with_live_chain<R>(f: impl FnOnce(&mut Chain) -> Result<R>) -> Result<R> {
    let mut guard = lock();
    let chain = guard.as_mut().ok_or(Error::Finalized)?;
    if let Some(e) = chain.broken {
        return Err(e.into());
    }
    f(chain)
}

/// Runs `f` on the chain, refusing (with [`Error::CopyStreamsCaptured`]) a call on `stream`
/// (`None`: a host call) while another stream's capture holds NVSHMEM's internal streams.
fn with_chain<R>(stream: Option<sys::CUstream>, f: impl FnOnce(&mut Chain) -> Result<R>) -> Result<R> {
    with_live_chain(|chain| held_elsewhere(chain, stream).and_then(|()| f(chain)))
}

/// `Ok` unless another stream's capture than `stream`'s holds NVSHMEM's internal streams (see
/// [`with_chain`]); forgets a holder whose capture ended.
fn held_elsewhere(chain: &mut Chain, stream: Option<sys::CUstream>) -> Result<()> {
    if let Some(holder) = &chain.captured {
        if !gpucomm_ordering::is_capturing(holder)? {
            chain.release_capture();
        } else if stream != Some(holder.cu_stream()) {
            return Err(Error::CopyStreamsCaptured { stream: holder.cu_stream() as usize });
        }
    }
    Ok(())
}

impl Chain {
    /// Forgets the capture that held NVSHMEM's internal streams: it ended. Its copies were
    /// quieted inside it (the capture scope makes sure), but they count as marked: one chained
    /// record too many costs nothing.
    fn release_capture(&mut self) {
        self.captured = None;
        self.marked = true;
    }

    /// Enqueues the quiescing call `call` on `stream` (not being captured), chained: after the
    /// last quiescing call that may have cleared marks, and recorded as the last one when it may
    /// clear marks itself. On any stream but the private one, marks are first cleared there
    /// ([`Chain::flush`]), so that `call` clears none and the event stays on the private stream.
    fn chained(&mut self, stream: sys::CUstream, call: impl FnOnce() -> Result<()>) -> Result<()> {
        if stream != self.flush {
            self.flush()?;
        }
        let key = stream as usize;
        if self.last.is_some_and(|last| last != key) {
            // SAFETY: the stream is alive (the caller's) and not being captured, the event is the
            // chain's and was recorded; the PE's context is current (the callers bind it).
            unsafe { result::stream::wait_event(stream, self.event, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }?;
        }
        call()?;
        if self.marked {
            // SAFETY: as above.
            if let Err(e) = unsafe { result::event::record(self.event, stream) } {
                // NVSHMEM has forgotten its marks and later quiets cannot be chained to this one:
                // wait for it here, so that what it completes has finished; if even that fails,
                // nothing can be ordered after it any more.
                // SAFETY: as above; a host wait.
                if let Err(waited) = unsafe { result::stream::synchronize(stream) } {
                    self.broken = Some(waited);
                }
                return Err(e.into());
            }
            self.last = Some(key);
            self.marked = false;
        }
        Ok(())
    }

    /// Makes `stream` (not being captured) wait for the last eager collective, when that was
    /// enqueued on another stream.
    fn after_collectives(&self, stream: sys::CUstream) -> Result<()> {
        if self.collective_on.is_some_and(|on| on != stream as usize) {
            // SAFETY: the stream is alive (the caller's) and not being captured, the event is the
            // chain's and was recorded; the PE's context is current (the callers bind it).
            unsafe {
                result::stream::wait_event(stream, self.collective, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            }?;
        }
        Ok(())
    }

    /// Records `stream`, on which a collective was just enqueued (after
    /// [`Chain::after_collectives`]), as the last collective's. When the event cannot be
    /// recorded, the collective is waited for on the host instead (it follows every earlier
    /// collective, so then none is left to wait for); when even that fails, the chain is broken.
    fn collective_done(&mut self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: as in `after_collectives`.
        let Err(e) = (unsafe { result::event::record(self.collective, stream) }) else {
            self.collective_on = Some(stream as usize);
            return Ok(());
        };
        // SAFETY: as above; a host wait.
        match unsafe { result::stream::synchronize(stream) } {
            Ok(()) => {
                log::warn!("nvshmem: recording a collective failed ({e}); it was waited for instead");
                self.collective_on = None;
                Ok(())
            }
            Err(waited) => {
                self.broken = Some(waited);
                Err(e.into())
            }
        }
    }

    /// Completes, eagerly on the private stream, the copies NVSHMEM may still have marked: before
    /// a capture's first operation that could clear the marks, and before every eager quiescing
    /// call on another stream ([`Chain::chained`]).
    fn flush(&mut self) -> Result<()> {
        if self.marked {
            let flush = self.flush;
            // SAFETY: NVSHMEM is running (the chain exists between `start` and `stop`), the
            // private stream is alive and never captured, and the PE's context is current.
            self.chained(flush, || unsafe { call!(nvshmemx_quiet_on_stream(flush as nvshmem_sys::cudaStream_t)) })?;
        }
        Ok(())
    }
}

/// Sets the chain up for NVSHMEM, which has just started on the current context.
pub(crate) fn start() -> Result<()> {
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
    let event = result::event::create(flags)?;
    let made = result::event::create(flags).and_then(|collective| {
        match result::stream::create(result::stream::StreamKind::NonBlocking) {
            Ok(flush) => Ok((collective, flush)),
            Err(e) => {
                // SAFETY: the event was just created and nothing else has it.
                let _ = unsafe { result::event::destroy(collective) };
                Err(e)
            }
        }
    });
    let (collective, flush) = match made {
        Ok(made) => made,
        Err(e) => {
            // SAFETY: the event was just created and nothing else has it.
            let _ = unsafe { result::event::destroy(event) };
            return Err(e.into());
        }
    };
    *lock() = Some(Chain {
        flush,
        event,
        last: None,
        marked: false,
        captured: None,
        collective,
        collective_on: None,
        broken: None,
    });
    Ok(())
}

/// Tears the chain down: NVSHMEM is about to be finalised and the device is idle.
pub(crate) fn stop() {
    if let Some(chain) = lock().take() {
        // SAFETY: both were created by `start`, nothing uses them any more (the device is idle,
        // and the chain is gone), and they are destroyed once, here.
        unsafe {
            for event in [chain.event, chain.collective] {
                if let Err(e) = result::event::destroy(event) {
                    log::warn!("nvshmem: destroying an event of the quiet chain failed: {e}");
                }
            }
            if let Err(e) = result::stream::destroy(chain.flush) {
                log::warn!("nvshmem: destroying the quiet chain's stream failed: {e}");
            }
        }
    }
}

/// Issues a `_nbi` operation on `stream` with `issue`. The stream is admitted by the caller
/// ([`crate::runtime::Admitted`]): `captured` when this thread's capture scope captures it, else
/// not captured at all.
pub(crate) fn nonblocking(stream: &Arc<CudaStream>, captured: bool, issue: impl FnOnce() -> Result<()>) -> Result<()> {
    with_chain(Some(stream.cu_stream()), |chain| {
        if captured {
            chain.flush()?;
            issue()?;
            if chain.captured.replace(stream.clone()).is_none() {
                // The hold ends with this capture, on every path out of its scope (whichever
                // crate's `capture` opened it, a panic included): found only later, a new
                // capture of the same stream would pass for this one, and its first quiescing
                // call would skip the flush that NVSHMEM's internal streams need.
                let held = stream.clone();
                let _ = gpucomm_ordering::after_scope(Box::new(move || capture_ended(&held)));
            }
        } else {
            issue()?;
            chain.marked = true;
        }
        Ok(())
    })
}

/// Enqueues a quiescing call on `stream` with `call`; `captured` as for [`nonblocking`] (or as
/// [`gpucomm_ordering::capturing`] found it).
pub(crate) fn quiescing(stream: sys::CUstream, captured: bool, call: impl FnOnce() -> Result<()>) -> Result<()> {
    with_chain(Some(stream), |chain| {
        if captured {
            chain.flush()?;
            call()
        } else {
            chain.chained(stream, call)
        }
    })
}

/// Enqueues the collective `call` on `stream` (see the module docs): after the last eager
/// collective, when that was enqueued on another stream, and recorded as the last one. A barrier
/// (`quiesces`) also goes through the quiet chain, as [`quiescing`] does. `captured` is the
/// stream when this thread's capture scope captures it (as [`crate::runtime::Admitted`] or
/// [`gpucomm_ordering::capturing`] found it): a captured collective is not chained, and the
/// graph's launches join the chain instead ([`graph_launch`]). Only a barrier, which uses
/// NVSHMEM's internal streams, is refused while another stream's capture holds them. When the
/// collective was enqueued but cannot be ordered before later ones (its event could neither be
/// recorded nor waited for), the error says so and every later call is refused.
pub(crate) fn collective(
    stream: sys::CUstream,
    captured: Option<&CudaStream>,
    quiesces: bool,
    call: impl FnOnce() -> Result<()>,
) -> Result<()> {
    with_live_chain(|chain| {
        if quiesces {
            held_elsewhere(chain, Some(stream))?;
        }
        if let Some(captured) = captured {
            if quiesces {
                chain.flush()?;
            }
            gpucomm_ordering::join_launches(captured, graph_launch);
            return call();
        }
        chain.after_collectives(stream)?;
        if quiesces {
            chain.chained(stream, call)?;
        } else {
            call()?;
        }
        chain.collective_done(stream)
    })
}

/// The chain's [`gpucomm_ordering::LaunchChain`]: a graph with a captured collective is launched
/// on `stream` after the last eager collective (when that was enqueued on another stream), and
/// recorded as the last one, under the chain's lock, as an eager collective is.
fn graph_launch(
    stream: &CudaStream,
    launch: &mut dyn FnMut() -> std::result::Result<(), OrderError>,
) -> std::result::Result<(), OrderError> {
    let mut launched = Ok(());
    let chained = gpucomm_ordering::make_current(stream.context()).map_err(Error::from).and_then(|()| {
        with_live_chain(|chain| {
            chain.after_collectives(stream.cu_stream())?;
            launched = launch();
            if launched.is_ok() {
                chain.collective_done(stream.cu_stream())?;
            }
            Ok(())
        })
    });
    launched?;
    chained.map_err(|e| OrderError::LaunchChain(e.to_string()))
}

/// [`host_call`] for a host call that makes a collective on NVSHMEM's own stream (the host
/// barrier): refused the same way, and then waits on the host until the last eager collective
/// (see the module docs) has finished. The PE's context must be current.
pub(crate) fn host_collective(what: &'static str) -> Result<()> {
    host_call(what)?;
    collectives_finished()
}

/// Waits on the host until the collectives enqueued on streams so far have finished: before a
/// host call that makes a collective of its own inside NVSHMEM (its host barrier, an allocation's
/// or a free's), which would otherwise run beside them with the same per-team state.
pub(crate) fn collectives_finished() -> Result<()> {
    with_chain(None, |chain| {
        if chain.collective_on.is_some() {
            // SAFETY: the event is the chain's and was recorded (on a stream of the PE's context);
            // a host wait.
            unsafe { result::event::synchronize(chain.collective) }?;
            chain.collective_on = None;
        }
        Ok(())
    })
}

/// Refuses a host call that quiesces NVSHMEM (and waits on the host): with
/// [`Error::CopyStreamsCaptured`] while a capture holds its internal streams, and with
/// [`Error::HostCallInCapture`] while this thread has a capture scope open (CUDA refuses the
/// host waits inside, and NVSHMEM exits the process on that refusal).
///
/// The refusal is this PE's alone: for a collective call (an allocation, a free, a team split,
/// the host barrier) the other PEs wait inside the same call until this one makes it again,
/// after its capture.
pub(crate) fn host_call(what: &'static str) -> Result<()> {
    with_chain(None, |_| Ok(()))?;
    if gpucomm_ordering::scope_open() {
        return Err(Error::HostCallInCapture { what });
    }
    Ok(())
}

/// This thread's capture interaction mode relaxed, for a host call of NVSHMEM's that copies or
/// waits synchronously inside: another thread's capture in CUDA's global mode (PyTorch's default)
/// makes CUDA refuse those copies and waits on this thread, a refused call also invalidates that
/// other thread's capture, and NVSHMEM exits the process on such a refusal. Relaxed, allocating
/// (zeroed or not), the host barrier (session 23), freeing and unregistering (session 26) went
/// through on one H100 with NVSHMEM 3.4.5 and left the other capture whole. Loading a module is
/// refused by CUDA anyway meanwhile (`cuModuleLoadData`), before NVSHMEM is called. Not for what
/// waits for the whole device first (destroying or dropping a team, dropping a module,
/// finalising, starting): that wait conflicts with any capture, relaxed or not (CUDA refused it
/// both ways, with an error, and invalidated the other capture both ways; session 26), and once
/// it has passed no capture was running for the mode to matter. Not for
/// team splits: relaxed, a split reached NVSHMEM, whose team set-up CUDA refused inside, and
/// NVSHMEM exited; in the default mode this crate's own copies before it are expected to fail
/// first, with an error (not run).
/// Best effort, so that changing the mode never makes a collective call fail on one PE alone:
/// `None` when the mode could not be changed. The caller keeps the guard for the whole call.
pub(crate) fn relaxed_host() -> Option<gpucomm_ordering::RelaxedMode> {
    gpucomm_ordering::relax().ok()
}

/// Forgets the capture of `stream` if it ended: run once the capture scope of a captured
/// non-blocking operation closed ([`nonblocking`], through `gpucomm_ordering::after_scope`).
pub(crate) fn capture_ended(stream: &CudaStream) {
    if let Some(chain) = lock().as_mut() {
        let holds = chain.captured.as_ref().is_some_and(|s| s.cu_stream() == stream.cu_stream());
        if holds && gpucomm_ordering::is_capturing(stream).is_ok_and(|capturing| !capturing) {
            chain.release_capture();
        }
    }
}
