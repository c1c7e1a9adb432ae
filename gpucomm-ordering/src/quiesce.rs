//! Waiting, with a bound, for the work that teardown must not overtake: the queued uses of one
//! buffer (before it is deregistered or given back), or everything on a device (before a library
//! that synchronises the whole device itself is torn down).
//!
//! Teardown that waits for a whole stream or a whole device hangs on work it has nothing to do
//! with — an NCCL kernel spinning for a dead peer on the same stream is enough. [`wait_for_uses`]
//! waits for one buffer's uses only, on a private stream; both functions take a bound, and say
//! when it expired instead of blocking forever.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, CudaContext, CudaEvent, CudaStream, DriverError};

use crate::{access, Access, DeviceBufferMut, OrderError};

/// Waits until every use of `buf` enqueued so far has finished — on whatever stream — and for
/// nothing else. A private stream of `ctx` waits for the buffer's uses through the same protocol
/// every call uses ([`Access::write`]: cudarc's events, or the buffer's
/// [`StreamTracker`](crate::StreamTracker)), then only that stream is waited for. When cudarc does
/// not manage synchronisation (one stream per context), its buffers are used on their own stream
/// only, so the buffer's own stream takes the private stream's place: a new stream would count as
/// the context's second one without the device-wide synchronisation cudarc makes at that switch,
/// and cudarc would then trust events that its buffers never recorded.
///
/// `Ok(true)` once the uses have finished, `Ok(false)` when `timeout` expired first (the uses are
/// then still running: the caller must keep the buffer, and whatever a library holds of it).
/// Without a timeout it blocks until they finish.
///
/// An error that something else recorded in `ctx` (a failed cudarc guard, `record_err` on any
/// thread) is set aside for the wait and recorded again after it: cudarc's checks on the way would
/// fail on it, and take it, and a release waiting here would keep (leak) its buffer for an error
/// that is not its own.
pub fn wait_for_uses<T>(
    buf: &mut (impl DeviceBufferMut<T> + ?Sized),
    ctx: &Arc<CudaContext>,
    timeout: Option<Duration>,
) -> Result<bool, OrderError> {
    let aside = ctx.check_err();
    let waited = (|| {
        let waiter = if ctx.is_managing_stream_synchronization() { private_stream(ctx)? } else { buf.stream().clone() };
        {
            let access = Access::new(&waiter);
            let _guard = access.write(buf)?;
        }
        let done = waiter.record_event(None)?;
        Ok(wait_event(&done, timeout)?)
    })();
    if let Err(e) = aside {
        ctx.record_err::<()>(Err(e));
    }
    waited
}

/// A new stream of `ctx` that waits for nothing: forked from the ordering crate's clean helper
/// stream, which never gets any work or wait, because `CudaContext::new_stream` synchronises the
/// whole device the first time a context gets a second stream — the very wait this module
/// avoids. Not from the idle helper stream: the waits of captured calls' pointers land there, and
/// a fork would wait for the work those buffers last did (an NCCL kernel stuck for a dead peer).
/// The stream is owned: it is destroyed when the last reference goes (a buffer's tracker may
/// keep naming it as the stream of the buffer's last use), after its work.
fn private_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>, DriverError> {
    access::helpers(ctx)?.clean.fork()
}

/// Waits until all work on `ctx`'s device has finished (`cuCtxSynchronize`), for at most
/// `timeout`: `Ok(false)` when it expired first. Without a timeout it blocks.
///
/// The driver has no bounded device-wide wait, so with a timeout the synchronisation runs on a
/// helper thread, which is left behind (blocked until the device is idle) when the bound expires.
/// A helper thread that cannot be started counts as an expired bound.
///
/// An error recorded in `ctx` by something else (a failed cudarc guard, `record_err` on any
/// thread) neither fails the wait nor is taken: cudarc's `CudaContext::synchronize` would first
/// return that error and clear it, and a teardown would then give up on an idle device (leaving
/// the other ranks waiting in their collective teardown) and its owner never see it.
pub fn device_idle_within(ctx: &Arc<CudaContext>, timeout: Option<Duration>) -> Result<bool, DriverError> {
    let Some(timeout) = timeout else {
        synchronize_device(ctx)?;
        return Ok(true);
    };
    let (tx, rx) = mpsc::channel();
    let waited = ctx.clone();
    let spawned = std::thread::Builder::new()
        .name("gpucomm-device-wait".into())
        .spawn(move || tx.send(synchronize_device(&waited)));
    if spawned.is_err() {
        return Ok(false);
    }
    match rx.recv_timeout(timeout) {
        Ok(synchronized) => synchronized.map(|()| true),
        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => Ok(false),
    }
}

/// `cuCtxSynchronize` on `ctx`, made current on this thread without looking at its recorded error.
pub(crate) fn synchronize_device(ctx: &CudaContext) -> Result<(), DriverError> {
    crate::context::make_current(ctx)?;
    result::ctx::synchronize()
}

/// Waits for `event`: blocking without a timeout, polling with one.
fn wait_event(event: &CudaEvent, timeout: Option<Duration>) -> Result<bool, DriverError> {
    let Some(timeout) = timeout else {
        event.synchronize()?;
        return Ok(true);
    };
    let deadline = Instant::now().checked_add(timeout);
    let mut pause = Duration::from_micros(20);
    loop {
        if event.try_is_complete()? {
            return Ok(true);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}
