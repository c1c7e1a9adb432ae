//! Buffers made known to a communicator: local registrations (`ncclCommRegister`) and symmetric
//! windows (`ncclCommWindowRegister`), each tied to its communicator's lifetime by a borrow.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;
#[cfg(nccl_2_27)]
use std::ops::RangeBounds;

use cudarc::driver::DeviceSlice;
use gpucomm_ordering::{Access, DeviceBufferMut, Keep, PinnedMut, Resource, Visitor};

use crate::error::{Error, Result};
use crate::ffi::call;
#[cfg(nccl_2_27)]
use crate::ffi::call_unchecked;
use crate::group::open::refuse_inside;
use crate::Comm;
#[cfg(nccl_2_27)]
use crate::{MemBuffer, MemViewMut};

/// A buffer registered with a communicator (`ncclCommRegister`, NCCL ≥ 2.19.1), so that NCCL can
/// move data in and out of it directly, without copies through its internal buffers.
///
/// The registration owns the buffer and gives it back with [`Registration::deregister`]; in between
/// the buffer is read through `&*reg` ([`Deref`]) and written through
/// [`reg.buffer_mut()`](Registration::buffer_mut), like any other. There is no `&mut` to the buffer
/// itself: with one, safe code could replace the buffer (`std::mem::replace`) and free the
/// registered memory while NCCL still holds it. The registration borrows its communicator, so it
/// cannot outlive it, and it is deregistered on drop, after the wait
/// [`deregister`](Registration::deregister) makes (which a watchdog or the communicator's
/// timeout ends when a collective on the buffer hangs). A [`crate::capture`] whose calls use the
/// buffer keeps the registration (`&reg`, `&mut reg`, or `reg.buffer_mut()` in its keep set), so
/// it outlives the graph.
///
/// Registration is a collective *contract*: NCCL uses registered buffers only when every rank of
/// a call passes registered buffers, and mixing registered and unregistered buffers across ranks
/// in one call is undefined in NCCL (user guide, "User Buffer Registration"). Register the
/// corresponding buffer on every rank and use them in the same calls — the same kind of promise as
/// every rank making matching calls. (`ncclCommRegister` itself only records the buffer on this
/// rank, so it needs no group in single-process multi-GPU use.) Memory from
/// [`MemBuffer`](crate::MemBuffer) (`ncclMemAlloc`) is what NCCL registers best.
#[doc(alias = "ncclCommRegister")]
#[cfg_attr(docsrs, doc(cfg(nccl_2_19)))]
pub struct Registration<'c, T, B: DeviceBufferMut<T>> {
    comm: &'c Comm,
    handle: *mut c_void,
    /// Names this registration in the graphs that keep it ([`Resource::numbered`]).
    serial: usize,
    /// Dropped only after a successful deregistration: NCCL may still use the memory otherwise.
    buf: ManuallyDrop<B>,
    /// Set by the consuming teardown once the C resource is gone: `Drop` then has nothing to do.
    released: bool,
    _elements: PhantomData<T>,
}

impl<T, B: DeviceBufferMut<T>> fmt::Debug for Registration<'_, T, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration").field("comm", self.comm).field("handle", &self.handle).finish()
    }
}

impl Comm {
    /// Registers `buf` (any cudarc buffer on this communicator's device, or a
    /// [`MemBuffer`](crate::MemBuffer)) with this communicator (`ncclCommRegister`). See
    /// [`Registration`] for the contract across ranks.
    ///
    /// The buffer must own its memory (`'static`: a `CudaSlice`, a `MemBuffer`), not borrow it (a
    /// `CudaViewMut`, a `MemViewMut`, a [`PinnedMut`]): a registration can be leaked
    /// (`std::mem::forget`, or a drop that cannot deregister, which keeps the buffer), and a leaked
    /// view would let the memory it borrows be freed while NCCL still holds the registration.
    ///
    /// # Errors
    ///
    /// A refused registration hands the buffer back, untouched, with the error:
    /// [`Error::Aborted`] after an abort, [`Error::WrongDevice`] for a buffer on another device,
    /// [`Error::ZeroSize`] for an empty one, a CUDA error from its pending uses, or NCCL's error
    /// when `ncclCommRegister` fails (NCCL then registered nothing).
    #[doc(alias = "ncclCommRegister")]
    pub fn register<T, B: DeviceBufferMut<T> + 'static>(
        &self,
        mut buf: B,
    ) -> std::result::Result<Registration<'_, T, B>, (B, Error)> {
        match self.register_handle(&mut buf) {
            Ok(handle) => Ok(Registration {
                comm: self,
                handle,
                serial: Resource::next_serial(),
                buf: ManuallyDrop::new(buf),
                released: false,
                _elements: PhantomData,
            }),
            Err(e) => Err((buf, e)),
        }
    }

    /// Checks `buf` and registers it (`ncclCommRegister`), giving NCCL's handle; nothing is
    /// registered when it fails.
    fn register_handle<T>(&self, buf: &mut impl DeviceBufferMut<T>) -> Result<*mut c_void> {
        self.live_raw()?;
        self.check_device("buffer", buf.stream())?;
        if buf.len() == 0 {
            return Err(Error::ZeroSize { call: "ncclCommRegister" });
        }
        let bytes = buf.num_bytes();
        let mut handle: *mut c_void = std::ptr::null_mut();
        let access = Access::new(self.stream());
        let (ptr, _guard) = access.write(buf)?;
        // Taken after the buffer's own code (its stream, length and pointer), which can reach this
        // communicator (a `Comm::wait` that times out aborts it).
        let c = self.live_raw()?;
        // SAFETY: `ptr` points at `bytes` bytes of device memory on this communicator's device
        // (checked), owned by the registration until it is deregistered (the caller builds it at
        // once); `handle` is a live out-pointer; `c` is live (checked just above, after the last
        // code that could abort it).
        unsafe { call!(ncclCommRegister(c, ptr as *mut c_void, bytes, &mut handle), comm = c) }?;
        Ok(handle)
    }
}

impl<'c, T, B: DeviceBufferMut<T>> Registration<'c, T, B> {
    /// The communicator the buffer is registered with.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// NCCL's registration handle (null when NCCL skipped the registration, e.g. with
    /// `NCCL_LOCAL_REGISTER=0`).
    pub fn as_raw(&self) -> *mut c_void {
        self.handle
    }

    /// Writable access to the buffer, for calls that write it (collectives, copies, kernels):
    /// `comm.all_reduce_in_place(&mut reg.buffer_mut(), ..)`. It forwards cudarc's buffer protocol
    /// only, so the registered buffer cannot be replaced through it.
    pub fn buffer_mut(&mut self) -> PinnedMut<'_, T, B> {
        PinnedMut::new(&mut *self.buf)
    }

    /// Deregisters the buffer (`ncclCommDeregister`) once its earlier uses have finished, and
    /// gives it back. Only the buffer's own uses are waited for, bounded by the communicator's
    /// timeout ([`Error::StillInUse`] when it expires). After the communicator was aborted there
    /// is nothing to deregister (NCCL released the registration with it) and the buffer comes back
    /// at once — unless the abort could not call NCCL ([`Error::Abandoned`]: NCCL may still use
    /// the memory, which stays registered and is leaked when the registration is dropped). On
    /// failure the registration is handed back with the error.
    ///
    /// The wait is parked ([`Comm::parked`]): a [`Watchdog`](crate::Watchdog) or an
    /// [`AbortHandle`](crate::AbortHandle) may abort the communicator meanwhile, and so does a
    /// call of the communicator whose work still runs its [timeout](Comm::timeout) after it was
    /// enqueued, as in [`Comm::wait`]; the buffer then comes back as after any abort. So a
    /// collective on the buffer stuck behind a dead peer ends the wait (and a drop) by the
    /// communicator's timeout or its watchdog; with neither, the wait lasts as long as the
    /// collective does.
    #[doc(alias = "ncclCommDeregister")]
    pub fn deregister(mut self) -> std::result::Result<B, (Self, Error)> {
        match self.release() {
            Ok(()) => {
                self.released = true;
                // SAFETY: the buffer is taken once, and the registration is marked released just
                // above, so its `Drop` never touches the emptied `ManuallyDrop`.
                Ok(unsafe { ManuallyDrop::take(&mut self.buf) })
            }
            Err(e) => Err((self, e)),
        }
    }

    /// Waits for the buffer's earlier uses to finish (kernels using the registration read NCCL's
    /// state for it, which deregistering frees), then deregisters it; after an abort, nothing.
    fn release(&mut self) -> Result<()> {
        // The communicator's abort released the registration; the handle must not reach NCCL.
        if self.comm.live_raw().is_err() {
            return self.comm.released_by_nccl();
        }
        // The graph of an open capture finds what it keeps only when the closure returns: a
        // registration let go inside would not be kept for the calls captured before.
        if gpucomm_ordering::scope_open() {
            return Err(Error::ReleaseInCapture { what: "deregistering a buffer (ncclCommDeregister)" });
        }
        let quiet = quiesce(&mut *self.buf, self.comm, "a registered buffer");
        // Taken after the wait, which runs the buffer's own code (its stream tracking), and that
        // can reach this communicator (a `Comm::wait` that times out aborts it). A communicator
        // aborted before or during the wait (its timeout, a watchdog) took the registration with
        // it, whatever the wait returned.
        let c = match self.comm.live_raw() {
            Ok(c) => c,
            Err(_) => return released_after(self.comm, quiet),
        };
        quiet?;
        // SAFETY: `handle` came from ncclCommRegister on `c`, which is live (checked just above,
        // after the last code that could abort it); it is deregistered once (`deregister` marks
        // the registration released, which `Drop` skips); no work using the buffer is pending.
        unsafe { call!(ncclCommDeregister(c, self.handle), comm = c) }
    }
}

/// Waits until `buf`'s earlier uses have finished, and for nothing else, bounded by `comm`'s
/// timeout: [`Error::StillInUse`] naming `what` when it expires. The wait is parked
/// ([`Comm::wait_parked`]), so that a watchdog or an [`AbortHandle`](crate::AbortHandle) can
/// abort the communicator meanwhile ([`Error::Aborted`]), and it ends with [`Error::Timeout`],
/// having aborted the communicator, once one of its own calls is overdue — a collective on the
/// buffer stuck behind a dead peer ends the wait either way.
fn quiesce<T>(buf: &mut impl DeviceBufferMut<T>, comm: &Comm, what: &'static str) -> Result<()> {
    let timeout = comm.timeout();
    let ctx = comm.context();
    match comm.wait_parked(timeout, |bound| Ok(gpucomm_ordering::wait_for_uses(buf, ctx, bound)?))? {
        true => Ok(()),
        false => Err(Error::StillInUse { what, after: timeout.unwrap_or_default() }),
    }
}

/// The release of what was registered with `comm`, found closed after [`quiesce`] returned
/// `waited`: NCCL released it with the communicator ([`Comm::released_by_nccl`]). A timeout the
/// wait hit, which aborted the communicator, is logged: nothing else reports it.
fn released_after(comm: &Comm, waited: Result<()>) -> Result<()> {
    if let Err(e @ Error::Timeout { .. }) = waited {
        log::warn!("nccl: {e} (while a buffer's uses were awaited before deregistering it)");
    }
    comm.released_by_nccl()
}

impl<T, B: DeviceBufferMut<T>> Deref for Registration<'_, T, B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.buf
    }
}

impl<T, B: DeviceBufferMut<T>> Drop for Registration<'_, T, B> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        match self.release() {
            // SAFETY: dropped once, here; the registration is gone afterwards.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.buf) },
            // The communicator's destruction releases the registration; until then NCCL may use
            // the memory, so it is leaked.
            Err(e) => log::warn!("nccl: deregistering a dropped registration failed; its buffer is leaked: {e}"),
        }
    }
}

// SAFETY: the borrow keeps the registration, and so its buffer, alive and registered; the buffer
// is only read through it. The registration itself is reported too, by its number: a graph whose
// member was swapped for another registration of the same memory (NCCL's captured work refers to
// the first) is then stale, and refuses to launch.
unsafe impl<T, B: DeviceBufferMut<T>> Keep for &Registration<'_, T, B> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.read(&*self.buf);
        v.resource(Resource::numbered("registration", self.serial), true);
    }
}

// SAFETY: the exclusive borrow keeps the registration, and so its buffer, alive and registered; it
// is reported writable. Swapping the registration out through `Graph::kept_mut` moves its buffer
// with it, which the next launch notices (the memory is no longer kept) and refuses.
unsafe impl<T, B: DeviceBufferMut<T>> Keep for &mut Registration<'_, T, B> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.write(&mut *self.buf);
        v.resource(Resource::numbered("registration", self.serial), true);
    }
}

/// How a window is registered (`winFlags` of `ncclCommWindowRegister`).
#[cfg(nccl_2_27)]
#[cfg_attr(docsrs, doc(cfg(nccl_2_27)))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowFlags(i32);

#[cfg(nccl_2_27)]
impl WindowFlags {
    /// `NCCL_WIN_DEFAULT`: a window for NCCL's own use of the memory (zero-copy transfers).
    #[doc(alias = "NCCL_WIN_DEFAULT")]
    pub const DEFAULT: Self = WindowFlags(nccl_sys::NCCL_WIN_DEFAULT as i32);
    /// `NCCL_WIN_COLL_SYMMETRIC`: every rank registers a window of the same size and uses it at the
    /// same offsets in collectives, which lets NCCL use its symmetric-memory kernels.
    #[doc(alias = "NCCL_WIN_COLL_SYMMETRIC")]
    pub const COLL_SYMMETRIC: Self = WindowFlags(nccl_sys::NCCL_WIN_COLL_SYMMETRIC as i32);

    /// The raw value.
    pub fn raw(self) -> i32 {
        self.0
    }
}

/// A [`MemBuffer`] registered as a window of a communicator (`ncclCommWindowRegister`, NCCL ≥
/// 2.27.3): memory NCCL maps on the other ranks of the node, for its symmetric kernels and for
/// the device API (kernels that load and store peers' memory directly).
///
/// Only memory from NCCL's allocator (or CUDA VMM memory with the handle types NCCL needs, at a
/// 4096-byte aligned offset) can become a window, hence a [`MemBuffer`], whose addresses satisfy
/// that. The window owns the buffer and gives it back with [`Window::deregister`]: it is read
/// through `&*window` ([`Deref`]) and written through views ([`Window::as_view_mut`],
/// [`Window::slice_mut`]), never through a `&mut MemBuffer`, with which safe code could replace the
/// buffer and free memory that NCCL maps on every rank. The window borrows its communicator, so it
/// cannot outlive it.
///
/// Registering a window is collective: every rank of the communicator registers one (NCCL ends it
/// with a barrier). One process driving several communicators registers them all at once with
/// [`register_windows`]. Symmetric memory needs NCCL's cuMem support (`NCCL_CUMEM_ENABLE`, on by
/// default); without it NCCL falls back to a local registration or none.
#[cfg(nccl_2_27)]
#[cfg_attr(docsrs, doc(cfg(nccl_2_27)))]
#[doc(alias = "ncclCommWindowRegister")]
pub struct Window<'c, T> {
    comm: &'c Comm,
    raw: nccl_sys::ncclWindow_t,
    /// Names this window in the graphs that keep it ([`Resource::numbered`]).
    serial: usize,
    /// Dropped only after a successful deregistration: peers may have the memory mapped.
    buf: ManuallyDrop<MemBuffer<T>>,
    /// Set by the consuming teardown once the C resource is gone: `Drop` then has nothing to do.
    released: bool,
}

#[cfg(nccl_2_27)]
impl<T> fmt::Debug for Window<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window").field("comm", self.comm).field("raw", &self.raw).field("buf", &*self.buf).finish()
    }
}

#[cfg(nccl_2_27)]
impl Comm {
    /// Registers `buf` as a window of this communicator (`ncclCommWindowRegister`). Collective:
    /// every rank calls it. See [`Window`].
    ///
    /// # Errors
    ///
    /// A refused registration hands the buffer back with the error, never still registered:
    /// `None` in its place only where NCCL made the window and can no longer be asked to release it
    /// (the communicator was aborted meanwhile while graphs held its work, so NCCL keeps the window
    /// until the communicator's teardown, or it was abandoned): the buffer is then leaked, since
    /// peers may still map it. The refusals: [`Error::InsideGroup`] inside a [`crate::group`] closure (use [`register_windows`]; the
    /// refusal counts against the group like any refused direct call, so keep the buffer out of
    /// the closure's value, which a refused group drops), [`Error::Aborted`] after an abort, [`Error::WrongDevice`] for a buffer on another device,
    /// [`Error::Timeout`] when a nonblocking communicator does not settle in time (which aborts
    /// it), or NCCL's error. Where NCCL failed after making the window, it is deregistered before
    /// the buffer comes back; should that fail too, the communicator is aborted, which releases
    /// the window with it (the deregistration failure is logged).
    #[doc(alias = "ncclCommWindowRegister")]
    // The buffer comes back on failure, as fallible teardown does throughout the crate.
    #[allow(clippy::result_large_err)]
    pub fn register_window<T>(
        &self,
        buf: MemBuffer<T>,
        flags: WindowFlags,
    ) -> std::result::Result<Window<'_, T>, (Option<MemBuffer<T>>, Error)> {
        let mut window = Window::unregistered(self, buf);
        match self.register_into(&mut window, flags) {
            Ok(()) => Ok(window),
            Err(e) => Err((window.undo(), e)),
        }
    }

    /// Registers `window`'s buffer as its window, writing NCCL's handle into it.
    fn register_into<T>(&self, window: &mut Window<'_, T>, flags: WindowFlags) -> Result<()> {
        // Inside a group closure the other communicators' registrations come later: this one
        // would wait for them forever. Several communicators register through `register_windows`.
        refuse_inside()?;
        let c = self.live_raw()?;
        self.check_device("window buffer", window.buf.stream())?;
        let rc = register_raw(c, &window.buf, flags, &mut window.raw)?;
        // Outside a group a blocking communicator registers before returning; a nonblocking one
        // fills `raw` in from a background job, by the time it is ready. NCCL 2.28 answers that
        // job `ncclSuccess`, and whether the communicator is nonblocking is not certain here
        // (an adopter's word for `Comm::from_raw`, `NCCL_COMM_BLOCKING` as this crate read it):
        // wait for it to be ready in every case (one
        // `ncclCommGetAsyncError` when it already is) before `raw` is read or moved.
        self.settle("ncclCommWindowRegister", rc, self.stream(), None)?;
        self.await_ready("ncclCommWindowRegister", None)
    }
}

/// Registers one window for each (communicator, buffer) pair, in one NCCL group: how one process
/// that drives several communicators (one per GPU, [`Comm::init_all`]) registers a window on each,
/// since each registration waits for the other ranks. The windows come back in the same order.
///
/// # Errors
///
/// A refusal hands every buffer back, in order, with the first error (`None` in place of a
/// buffer NCCL keeps registered, as for [`Comm::register_window`]): [`Error::InsideGroup`]
/// inside a [`crate::group`] closure (counted against the group, as for
/// [`Comm::register_window`]), [`Error::Aborted`] or [`Error::WrongDevice`] for any pair, and
/// [`Error::MixedBlocking`] for blocking and nonblocking communicators among the pairs (NCCL
/// could not settle the group), are found before NCCL is called, so nothing is registered. When NCCL fails (or a
/// nonblocking communicator times out, which aborts it), the windows NCCL did make are
/// deregistered first, one by one in order; where deregistering one fails, its communicator is
/// aborted, which releases the window with it (the failure is logged), so that no buffer comes back
/// still registered.
#[cfg(nccl_2_27)]
#[cfg_attr(docsrs, doc(cfg(nccl_2_27)))]
#[doc(alias = "ncclCommWindowRegister")]
#[doc(alias = "ncclGroupStart")]
#[doc(alias = "ncclGroupEnd")]
// The buffers come back on failure, beside the error.
#[allow(clippy::type_complexity)]
pub fn register_windows<'c, T>(
    pairs: impl IntoIterator<Item = (&'c Comm, MemBuffer<T>)>,
    flags: WindowFlags,
) -> std::result::Result<Vec<Window<'c, T>>, (Vec<Option<MemBuffer<T>>>, Error)> {
    let mut windows: Vec<Window<'c, T>> =
        pairs.into_iter().map(|(comm, buf)| Window::unregistered(comm, buf)).collect();
    match register_all(&mut windows, flags) {
        Ok(()) => Ok(windows),
        Err(e) => Err((windows.into_iter().map(Window::undo).collect(), e)),
    }
}

/// Registers each of `windows`' buffers as its window, in one NCCL group.
#[cfg(nccl_2_27)]
fn register_all<T>(windows: &mut [Window<'_, T>], flags: WindowFlags) -> Result<()> {
    refuse_inside()?;
    // Checked before the group starts, so that a refused buffer or an aborted communicator leaves
    // no group open and no registration waiting for a rank that never comes.
    let mut handles = Vec::with_capacity(windows.len());
    for w in windows.iter() {
        handles.push(w.comm.live_raw()?);
        w.comm.check_device("window buffer", w.buf.stream())?;
    }
    // As in `crate::group`: NCCL gives the group the mode of its last communicator and, when that
    // is nonblocking, leaves the blocking members "in progress" for good (2.28.9 `group.cc`).
    if let Some(first) = windows.first() {
        if windows.iter().any(|w| w.comm.is_nonblocking() != first.comm.is_nonblocking()) {
            return Err(Error::MixedBlocking);
        }
    }
    let end = crate::ffi::resolve!(ncclGroupEnd)?;
    // SAFETY: no NCCL group is open on this thread: this crate opens NCCL groups only in its own
    // functions, which end them before returning.
    unsafe { call!(ncclGroupStart()) }?;
    let mut registered = Ok(());
    for (w, &c) in windows.iter_mut().zip(&handles) {
        // NCCL fills `w.raw` when the group ends; `windows` is borrowed until then.
        if let Err(e) = register_raw(c, &w.buf, flags, &mut w.raw) {
            registered = Err(e);
            break;
        }
    }
    // SAFETY: this thread started the group above.
    let rc = unsafe { end() };
    let mut settled = Ok(());
    for w in windows.iter() {
        // Each communicator's background job may still write its `w.raw` after a successful
        // `ncclGroupEnd` (see `Comm::register_window`): wait for every one to be ready, whatever
        // it is known as, before the windows are read, moved or given back.
        let s = w.comm.settle("ncclGroupEnd", rc, w.comm.stream(), None);
        let s = s.and_then(|()| w.comm.await_ready("ncclGroupEnd", None));
        if settled.is_ok() {
            settled = s;
        }
    }
    registered.and(settled)
}

/// Calls `ncclCommWindowRegister` on the live communicator `comm` (taken with `Comm::live_raw` by
/// the caller, with no wait since) for `buf` (on the communicator's device: checked by the
/// callers), which writes the window to `out` at once, or when the enclosing group ends or the
/// communicator settles. Returns NCCL's result code.
#[cfg(nccl_2_27)]
fn register_raw<T>(
    comm: nccl_sys::ncclComm_t,
    buf: &MemBuffer<T>,
    flags: WindowFlags,
    out: &mut nccl_sys::ncclWindow_t,
) -> Result<nccl_sys::ncclResult_t> {
    // SAFETY: the buffer is `num_bytes` bytes of ncclMemAlloc memory (4096-byte aligned, as windows
    // need) on the communicator's device, owned by the window until it is deregistered; `out` is
    // live until NCCL fills it (the caller keeps it in place until settled); `comm` is live (the
    // caller's contract) and borrowed by the window.
    unsafe {
        call_unchecked!(ncclCommWindowRegister(comm, buf.as_raw() as *mut c_void, buf.num_bytes(), out, flags.raw()))
    }
}

#[cfg(nccl_2_27)]
impl<'c, T> Window<'c, T> {
    /// `buf`, not yet registered with `comm` (a null handle), for NCCL to fill in.
    fn unregistered(comm: &'c Comm, buf: MemBuffer<T>) -> Self {
        let serial = Resource::next_serial();
        Window { comm, raw: std::ptr::null_mut(), serial, buf: ManuallyDrop::new(buf), released: false }
    }

    /// The buffer of a window whose registration failed, never still registered: a window NCCL
    /// did make is deregistered at once (the caller never had it, so nothing used it through the
    /// window); if that fails, the communicator is aborted, which releases the window with it.
    /// Deregistration is local to this rank: in NCCL 2.28.9 (`src/dev_runtime.cc`,
    /// `ncclCommWindowDeregister` → `symWindowDestroy`) it unmaps and frees without a bootstrap
    /// barrier, so undoing does not wait for peers that did not fail. `None`, the buffer leaked,
    /// when NCCL keeps the window: the communicator is closed but not released by NCCL (an abort
    /// deferred while graphs hold its work, or an abandoned one).
    fn undo(mut self) -> Option<MemBuffer<T>> {
        let held = !self.raw.is_null()
            && match self.comm.live_raw() {
                // SAFETY: `raw` came from ncclCommWindowRegister on `c`, which is live (checked
                // just above); it is deregistered once (the window is marked released below); no
                // work used the memory through the window, which never left this crate.
                Ok(c) => match unsafe { call!(ncclCommWindowDeregister(c, self.raw), comm = c) } {
                    Ok(()) => false,
                    Err(e) => {
                        log::warn!(
                            "nccl: undoing a failed window registration failed ({e}); aborting the communicator"
                        );
                        self.comm.abort_quietly();
                        true
                    }
                },
                Err(_) => true,
            };
        self.released = true;
        if held {
            if let Err(e) = self.comm.released_by_nccl() {
                log::warn!("nccl: NCCL keeps the window of a failed registration ({e}); its buffer is leaked");
                return None;
            }
        }
        // SAFETY: the buffer is taken once, and the window is marked released just above, so its
        // `Drop` never touches the emptied `ManuallyDrop`.
        Some(unsafe { ManuallyDrop::take(&mut self.buf) })
    }

    /// The communicator the window belongs to.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// NCCL's window handle (`ncclWindow_t`), for the device API and kernels. Null when NCCL
    /// registered nothing (no symmetric-memory support and local registration off). Valid while
    /// the window lives.
    pub fn as_raw(&self) -> nccl_sys::ncclWindow_t {
        self.raw
    }

    /// The window's memory.
    pub fn buffer(&self) -> &MemBuffer<T> {
        &self.buf
    }

    /// The window as the graphs that keep it name it ([`Resource::numbered`]): a type that
    /// holds a window reports it through [`DeviceMemory::registration`](gpucomm_ordering::DeviceMemory::registration),
    /// so that a graph keeping that type refuses to launch with another window swapped in.
    pub fn resource(&self) -> Resource {
        Resource::numbered("window", self.serial)
    }

    /// The whole window's memory, writable, for calls that write it (collectives, copies,
    /// kernels): `comm.all_reduce_in_place(&mut window.as_view_mut(), ..)`. A view, which cannot
    /// replace the window's buffer.
    pub fn as_view_mut(&mut self) -> MemViewMut<'_, T> {
        self.buf.as_view_mut()
    }

    /// Elements `range` of the window's memory, writable ([`MemBuffer::slice_mut`]).
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<MemViewMut<'_, T>> {
        self.buf.slice_mut(range)
    }

    /// The buffer itself, for the [`Keep`] implementations below only: it must never reach safe
    /// code, which could replace it.
    fn kept_buffer(&mut self) -> &mut MemBuffer<T> {
        &mut self.buf
    }

    /// The device address of the window's memory (the window's offset 0), for kernels.
    pub fn as_ptr(&self) -> cudarc::driver::sys::CUdeviceptr {
        self.buf.as_raw()
    }

    /// Deregisters the window (`ncclCommWindowDeregister`) once the buffer's last use has finished,
    /// and gives the buffer back. The wait is bounded by the communicator's timeout
    /// ([`Error::StillInUse`] when it expires), and parked like [`Registration::deregister`]'s: an
    /// abort meanwhile (a watchdog, an [`AbortHandle`](crate::AbortHandle), or a call of the
    /// communicator overrunning its timeout) ends it. After the communicator was aborted, NCCL
    /// released the window with it: the buffer comes back at once (not when the abort could not
    /// call NCCL: [`Error::Abandoned`], and the buffer is leaked when the window is dropped). On
    /// failure the window is handed back with the error.
    #[doc(alias = "ncclCommWindowDeregister")]
    // The buffer comes back on failure, as fallible teardown does throughout the crate.
    #[allow(clippy::result_large_err)]
    pub fn deregister(mut self) -> std::result::Result<MemBuffer<T>, (Self, Error)> {
        match self.release() {
            Ok(()) => {
                self.released = true;
                // SAFETY: the buffer is taken once, and the window is marked released just above,
                // so its `Drop` never touches the emptied `ManuallyDrop`.
                Ok(unsafe { ManuallyDrop::take(&mut self.buf) })
            }
            Err(e) => Err((self, e)),
        }
    }

    /// Waits for the buffer's uses, then deregisters the window; after an abort, or when NCCL
    /// registered nothing (a null handle), nothing.
    fn release(&mut self) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        // The communicator's abort freed the window; the handle must not reach NCCL (2.28.9 reads
        // the communicator before anything else in ncclCommWindowDeregister).
        if self.comm.live_raw().is_err() {
            return self.comm.released_by_nccl();
        }
        // As for a registration: the graph of an open capture would not keep a window let go
        // inside it, and its launches would use the freed window.
        if gpucomm_ordering::scope_open() {
            return Err(Error::ReleaseInCapture { what: "deregistering a window (ncclCommWindowDeregister)" });
        }
        // Kernels using the window read its state, which deregistering frees.
        let quiet = quiesce(&mut *self.buf, self.comm, "a window's buffer");
        // Aborted before or during the wait (its timeout, a watchdog): NCCL freed the window.
        let c = match self.comm.live_raw() {
            Ok(c) => c,
            Err(_) => return released_after(self.comm, quiet),
        };
        quiet?;
        // SAFETY: `raw` came from ncclCommWindowRegister on `c`, which is live (checked just
        // above, after the wait); it is deregistered once (`deregister` marks the window released,
        // which `Drop` skips); the buffer's last use has finished.
        unsafe { call!(ncclCommWindowDeregister(c, self.raw), comm = c) }
    }
}

#[cfg(nccl_2_27)]
impl<T> Deref for Window<'_, T> {
    type Target = MemBuffer<T>;
    fn deref(&self) -> &MemBuffer<T> {
        &self.buf
    }
}

#[cfg(nccl_2_27)]
impl<T> Drop for Window<'_, T> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        match self.release() {
            // SAFETY: dropped once, here; the window is gone afterwards.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.buf) },
            // Peers may still have the memory mapped through the window: leak it.
            Err(e) => log::warn!("nccl: deregistering a dropped window failed; its buffer is leaked: {e}"),
        }
    }
}

// SAFETY: the borrow keeps the window registered and its memory alive, and unwritable through
// this member: it is reported read. Captured calls that write the window (a collective into it, a
// kernel that records a write) need it kept writable: `&mut window`, the window by value, or a
// view from `window.as_view_mut()`.
#[cfg(nccl_2_27)]
unsafe impl<T> Keep for &Window<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.read(self.buffer());
        v.resource(self.resource(), true);
    }
}

// SAFETY: the exclusive borrow keeps the window registered and its memory alive, and no one else
// can use it while the graph lives: it is reported writable. The buffer is only handed to the
// visitor, which takes its pointer; it cannot be replaced through this member (swapping the whole
// window through `Graph::kept_mut` moves its memory out of the keep set, which the next launch
// notices and refuses). The window itself is reported too, by its number: a window deregistered
// and registered again on the same memory is another window to NCCL (its captured kernels refer
// to the first), so a graph whose member was swapped for it is stale and refuses to launch.
#[cfg(nccl_2_27)]
unsafe impl<T> Keep for &mut Window<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        let window = self.resource();
        v.write(self.kept_buffer());
        v.resource(window, true);
    }
}

// SAFETY: as for `&mut Window`: the graph owns the window (and so its registration and memory).
#[cfg(nccl_2_27)]
unsafe impl<T> Keep for Window<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        let window = self.resource();
        v.write(self.kept_buffer());
        v.resource(window, true);
    }
}
