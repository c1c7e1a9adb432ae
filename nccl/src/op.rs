//! The reduction operators a call takes: NCCL's built-in ones ([`ReduceOp`]) and custom ones
//! ([`PreMulSum`]), which NCCL creates per communicator and which this crate ties to theirs.

use std::ffi::c_void;
use std::fmt;

use gpucomm_ordering::{Access, DeviceBuffer, Guard, Keep, Resource, Visitor};
use nccl_sys::{ncclRedOp_t, ncclScalarResidence_t};

use crate::error::{Error, Result};
use crate::ffi::call;
use crate::types::check_loaded_type;
use crate::{Comm, NcclType, ReduceOp};

mod sealed {
    use super::*;

    /// A reduction operator resolved for one call: NCCL's operator id, the custom operator it
    /// comes from (which a graph capturing the call must keep), and the device scalar the call's
    /// kernels will read, if any. Public only inside this private module.
    pub struct OpUse<'b, T> {
        pub(super) raw: ncclRedOp_t,
        pub(super) custom: Option<Resource>,
        pub(super) scalar: Option<&'b dyn DeviceBuffer<T>>,
    }

    pub trait Sealed {}
}

pub(crate) use sealed::OpUse;

/// A reduction operator for elements of type `T`: a built-in [`ReduceOp`] (any communicator, any
/// type) or a [`&PreMulSum`](PreMulSum) (only its communicator and its type). Sealed.
pub trait Reduction<'b, T>: sealed::Sealed {
    /// Checks the operator against the communicator of the call. Not for use outside this crate.
    #[doc(hidden)]
    fn resolve(self, comm: &Comm) -> Result<OpUse<'b, T>>;
}

impl sealed::Sealed for ReduceOp {}

impl<'b, T> Reduction<'b, T> for ReduceOp {
    #[inline]
    fn resolve(self, _comm: &Comm) -> Result<OpUse<'b, T>> {
        Ok(OpUse { raw: self.raw(), custom: None, scalar: None })
    }
}

impl<'b, T> OpUse<'b, T> {
    /// The operator id to pass to NCCL.
    pub(crate) fn raw(&self) -> ncclRedOp_t {
        self.raw
    }

    /// The stream guard of the device scalar, which the call's kernels read: taken for reading
    /// through the call's access, so that it is ordered after earlier writes and not freed before
    /// the call has run. A no-op guard for operators without one. A custom operator is recorded as
    /// used, for a capture.
    #[inline]
    pub(crate) fn guard(&self, access: &Access<'b>) -> Result<Guard<'b>> {
        if self.custom.is_none() && self.scalar.is_none() {
            return Ok(Guard::NONE);
        }
        self.custom_guard(access)
    }

    /// [`OpUse::guard`] of a custom operator, out of line.
    #[inline(never)]
    fn custom_guard(&self, access: &Access<'b>) -> Result<Guard<'b>> {
        if let Some(custom) = self.custom {
            access.resource(custom)?;
        }
        match self.scalar {
            Some(scalar) => Ok(access.read::<T>(scalar)?.1),
            None => Ok(Guard::NONE),
        }
    }
}

/// A custom reduction operator: multiply every input element by a scalar, then sum across ranks
/// (`ncclRedOpCreatePreMulSum`). With the scalar `1 / size()` it averages; with a per-rank scalar
/// it computes a weighted sum.
///
/// NCCL creates the operator for one communicator and one data type; this type holds both (a
/// borrow of the communicator, the element type `T`), so using it with another type does not
/// compile and using it with another communicator is [`Error::ForeignOp`]. Pass it by reference
/// (`&op`) wherever a call takes an operator. It is destroyed (`ncclRedOpDestroy`) on drop, which
/// the borrow checker places after every call that uses it, in a group too.
///
/// ```no_run
/// # use nccl::{Collectives, PreMulSum};
/// # fn demo(comm: &nccl::Comm, buf: &mut cudarc::driver::CudaSlice<f32>) -> nccl::Result<()> {
/// let average = PreMulSum::host(comm, 1.0 / comm.size() as f32)?;
/// comm.all_reduce_in_place(buf, &average)?;
/// # Ok(()) }
/// ```
#[doc(alias = "ncclRedOpCreatePreMulSum")]
pub struct PreMulSum<'a, T> {
    comm: &'a Comm,
    raw: ncclRedOp_t,
    scalar: Option<&'a dyn DeviceBuffer<T>>,
    /// Set by the consuming teardown once the C resource is gone: `Drop` then has nothing to do.
    released: bool,
}

impl<T> fmt::Debug for PreMulSum<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreMulSum")
            .field("op", &self.raw.0)
            .field("comm_rank", &self.comm.rank())
            .field("scalar_on_device", &self.scalar.is_some())
            .finish()
    }
}

impl<'a, T: NcclType> PreMulSum<'a, T> {
    /// An operator with the scalar `scalar`, read once now (`ncclScalarHostImmediate`).
    #[doc(alias = "ncclRedOpCreatePreMulSum")]
    #[doc(alias = "ncclScalarHostImmediate")]
    pub fn host(comm: &'a Comm, scalar: T) -> Result<Self> {
        let mut value = scalar;
        let scalar_ptr = (&mut value as *mut T).cast::<c_void>();
        // SAFETY: NCCL reads one `T` from the pointer before returning; it points at a live local.
        let raw = unsafe { create::<T>(comm, scalar_ptr, ncclScalarResidence_t::ncclScalarHostImmediate) }?;
        Ok(PreMulSum { comm, raw, scalar: None, released: false })
    }

    /// An operator whose scalar is the single element of `scalar`, a device buffer that NCCL reads
    /// while each collective using the operator runs (`ncclScalarDevice`), so the scalar can be
    /// computed on the GPU without a copy to the host. The buffer stays borrowed as long as the
    /// operator lives, and every call using the operator orders itself after earlier writes to it
    /// on other streams.
    #[doc(alias = "ncclRedOpCreatePreMulSum")]
    #[doc(alias = "ncclScalarDevice")]
    pub fn device(comm: &'a Comm, scalar: &'a impl DeviceBuffer<T>) -> Result<Self> {
        if scalar.len() != 1 {
            return Err(Error::LengthMismatch { what: "PreMulSum scalar", expected: 1, got: scalar.len() });
        }
        comm.check_device("PreMulSum scalar", scalar.stream())?;
        let access = Access::new(comm.stream());
        let (ptr, _guard) = access.read(scalar)?;
        // SAFETY: NCCL keeps the pointer and reads one `T` from it while each collective using the
        // operator runs. It points at a one-element buffer of `T` on the communicator's device
        // (checked), borrowed for 'a, the operator's lifetime; each call using the operator takes
        // its own read access to it (`OpUse::guard`).
        let raw = unsafe { create::<T>(comm, ptr as *mut c_void, ncclScalarResidence_t::ncclScalarDevice) }?;
        Ok(PreMulSum { comm, raw, scalar: Some(scalar), released: false })
    }
}

/// `ncclRedOpCreatePreMulSum` for elements of type `T` on `comm`.
///
/// # Safety
///
/// `scalar` points at one `T`: on the host, readable until this returns, for
/// `ncclScalarHostImmediate`; on `comm`'s device, readable by every collective that uses the
/// operator until it has run, for `ncclScalarDevice`.
unsafe fn create<T: NcclType>(
    comm: &Comm,
    scalar: *mut c_void,
    residence: ncclScalarResidence_t,
) -> Result<ncclRedOp_t> {
    check_loaded_type::<T>()?;
    let mut raw = ncclRedOp_t(0);
    let c = comm.live_raw()?;
    // SAFETY: `raw` is a live out-pointer; `c` is live (checked just above); the scalar is as this
    // function's contract says, of the size of `T::DATA_TYPE` (sealed trait).
    unsafe { call!(ncclRedOpCreatePreMulSum(&mut raw, scalar, T::DATA_TYPE.raw(), residence, c), comm = c) }?;
    Ok(raw)
}

impl<'a, T> PreMulSum<'a, T> {
    /// The communicator the operator belongs to.
    pub fn comm(&self) -> &'a Comm {
        self.comm
    }

    /// Destroys the operator (`ncclRedOpDestroy`); on failure hands it back with the error.
    /// Dropping it does the same and logs a failure. After the communicator was aborted there is
    /// nothing to destroy (NCCL freed the operator with it).
    #[doc(alias = "ncclRedOpDestroy")]
    pub fn destroy(mut self) -> std::result::Result<(), (Self, Error)> {
        match self.release() {
            Ok(()) => {
                self.released = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    fn release(&self) -> Result<()> {
        let Ok(c) = self.comm.live_raw() else { return Ok(()) };
        // SAFETY: `raw` was created for `c`, which is live (checked just above); the borrow
        // checker ends every use of the operator (in a group: the group's launch) before this runs;
        // it is destroyed once (`destroy` marks the operator released, which `Drop` skips).
        unsafe { call!(ncclRedOpDestroy(self.raw, c), comm = c) }
    }
}

impl<T> Drop for PreMulSum<'_, T> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Err(e) = self.release() {
            log::warn!("nccl: destroying a PreMulSum operator failed: {e}");
        }
    }
}

impl<T> sealed::Sealed for &PreMulSum<'_, T> {}

impl<'b, 'a: 'b, T> Reduction<'b, T> for &'b PreMulSum<'a, T> {
    #[inline]
    fn resolve(self, comm: &Comm) -> Result<OpUse<'b, T>> {
        // The same `Comm` (it cannot move while the operator borrows it). Comparing handles would
        // match two aborted communicators, whose handles both read as null.
        if !std::ptr::eq(comm, self.comm) {
            return Err(Error::ForeignOp);
        }
        Ok(OpUse { raw: self.raw, custom: Some(Resource::of(KIND, self)), scalar: self.scalar })
    }
}

/// What a graph calls a custom operator.
const KIND: &str = "custom reduction operator";

// SAFETY: the borrow keeps the operator (and so its id, and its device scalar) alive.
unsafe impl<T> Keep for &PreMulSum<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.resource(Resource::of(KIND, *self), true);
    }
}
