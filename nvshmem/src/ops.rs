//! Reduction operations over a team ([`crate::Team::reduce_on_stream`]) and the element types
//! NVSHMEM defines each one on.
//!
//! NVSHMEM exports one function per (type, operation): `nvshmemx_<type>_<op>_reduce_on_stream`.
//! Each operation is a type here that implements [`ReduceOp<T>`] exactly for the element types
//! NVSHMEM has a function for, so an unsupported pair does not compile:
//!
//! | Operation | Element types |
//! |---|---|
//! | [`Sum`], [`Prod`], [`Min`], [`Max`] | `i8`, `i16`, `i32`, `i64`, `u8`, `u16`, `u32`, `u64`, `f32`, `f64`, and with feature `f16` `half::f16`, `half::bf16` |
//! | [`And`], [`Or`], [`Xor`] | `i8`, `i16`, `i32`, `i64`, `u8`, `u16`, `u32`, `u64` |
//!
//! (NVSHMEM's complex types need a build option the wheels do not set; its C-named integer
//! types map to the same Rust types as the fixed-width ones, which this crate uses.)

use cudarc::driver::sys::CUdeviceptr;
use nvshmem_sys::{cudaStream_t, nvshmem_team_t};

use crate::error::Result;
use crate::ffi::call;

mod sealed {
    pub trait Sealed {
        /// `x op x == x`: a value met twice leaves the result as it was (Min, Max, And, Or).
        const IDEMPOTENT: bool;
    }
}

/// Whether NVSHMEM may apply `Op` to a PE's value twice when one buffer is source and destination
/// without changing the result: see [`crate::Team::reduce_in_place_on_stream`].
pub(crate) const fn idempotent<T, Op: ReduceOp<T>>() -> bool {
    <Op as sealed::Sealed>::IDEMPOTENT
}

/// A reduction NVSHMEM defines on elements of type `T`. Sealed: implemented exactly for the pairs
/// NVSHMEM exports.
pub trait ReduceOp<T>: Copy + sealed::Sealed {
    /// Enqueues `nvshmemx_<T>_<op>_reduce_on_stream`.
    ///
    /// # Safety
    ///
    /// `team` is a valid team of the running NVSHMEM; `dst` and `src` are symmetric addresses of
    /// `n` elements of `T`, disjoint or the same range; `stream` is a stream of the PE's device whose
    /// context is current.
    #[doc(hidden)]
    unsafe fn reduce(
        self,
        team: nvshmem_team_t,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: usize,
        stream: cudaStream_t,
    ) -> Result<()>;
}

macro_rules! op_type {
    ($(#[$doc:meta])* $name:ident, idempotent: $idempotent:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name;
        impl sealed::Sealed for $name {
            const IDEMPOTENT: bool = $idempotent;
        }
    };
}

macro_rules! reduce {
    ($op:ident: $($t:ty => $f:ident),* $(,)?) => {$(
        impl ReduceOp<$t> for $op {
            unsafe fn reduce(
                self,
                team: nvshmem_team_t,
                dst: CUdeviceptr,
                src: CUdeviceptr,
                n: usize,
                stream: cudaStream_t,
            ) -> Result<()> {
                // SAFETY: forwarded from the trait's contract; the function is the one for `$t`.
                unsafe { call!($f(team, dst as *mut _, src as *const _, n, stream)) }
            }
        }
    )*};
}

op_type!(
    /// Reduces to the sum.
    #[doc(alias = "nvshmemx_int8_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int16_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int32_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int64_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint8_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint16_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint32_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint64_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_float_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_double_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_half_sum_reduce_on_stream")]
    #[doc(alias = "nvshmemx_bfloat16_sum_reduce_on_stream")]
    Sum, idempotent: false
);

op_type!(
    /// Reduces to the product.
    #[doc(alias = "nvshmemx_int8_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int16_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int32_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int64_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint8_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint16_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint32_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint64_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_float_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_double_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_half_prod_reduce_on_stream")]
    #[doc(alias = "nvshmemx_bfloat16_prod_reduce_on_stream")]
    Prod, idempotent: false
);

op_type!(
    /// Reduces to the minimum.
    #[doc(alias = "nvshmemx_int8_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int16_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int32_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int64_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint8_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint16_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint32_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint64_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_float_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_double_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_half_min_reduce_on_stream")]
    #[doc(alias = "nvshmemx_bfloat16_min_reduce_on_stream")]
    Min, idempotent: true
);

op_type!(
    /// Reduces to the maximum.
    #[doc(alias = "nvshmemx_int8_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int16_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int32_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int64_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint8_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint16_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint32_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint64_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_float_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_double_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_half_max_reduce_on_stream")]
    #[doc(alias = "nvshmemx_bfloat16_max_reduce_on_stream")]
    Max, idempotent: true
);

op_type!(
    /// Reduces to the bitwise AND.
    #[doc(alias = "nvshmemx_int8_and_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int16_and_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int32_and_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int64_and_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint8_and_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint16_and_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint32_and_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint64_and_reduce_on_stream")]
    And, idempotent: true
);

op_type!(
    /// Reduces to the bitwise OR.
    #[doc(alias = "nvshmemx_int8_or_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int16_or_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int32_or_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int64_or_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint8_or_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint16_or_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint32_or_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint64_or_reduce_on_stream")]
    Or, idempotent: true
);

op_type!(
    /// Reduces to the bitwise XOR.
    #[doc(alias = "nvshmemx_int8_xor_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int16_xor_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int32_xor_reduce_on_stream")]
    #[doc(alias = "nvshmemx_int64_xor_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint8_xor_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint16_xor_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint32_xor_reduce_on_stream")]
    #[doc(alias = "nvshmemx_uint64_xor_reduce_on_stream")]
    Xor, idempotent: false
);

reduce!(Sum:
    i8 => nvshmemx_int8_sum_reduce_on_stream,
    i16 => nvshmemx_int16_sum_reduce_on_stream,
    i32 => nvshmemx_int32_sum_reduce_on_stream,
    i64 => nvshmemx_int64_sum_reduce_on_stream,
    u8 => nvshmemx_uint8_sum_reduce_on_stream,
    u16 => nvshmemx_uint16_sum_reduce_on_stream,
    u32 => nvshmemx_uint32_sum_reduce_on_stream,
    u64 => nvshmemx_uint64_sum_reduce_on_stream,
    f32 => nvshmemx_float_sum_reduce_on_stream,
    f64 => nvshmemx_double_sum_reduce_on_stream,
);
#[cfg(feature = "f16")]
reduce!(Sum:
    half::f16 => nvshmemx_half_sum_reduce_on_stream,
    half::bf16 => nvshmemx_bfloat16_sum_reduce_on_stream,
);

reduce!(Prod:
    i8 => nvshmemx_int8_prod_reduce_on_stream,
    i16 => nvshmemx_int16_prod_reduce_on_stream,
    i32 => nvshmemx_int32_prod_reduce_on_stream,
    i64 => nvshmemx_int64_prod_reduce_on_stream,
    u8 => nvshmemx_uint8_prod_reduce_on_stream,
    u16 => nvshmemx_uint16_prod_reduce_on_stream,
    u32 => nvshmemx_uint32_prod_reduce_on_stream,
    u64 => nvshmemx_uint64_prod_reduce_on_stream,
    f32 => nvshmemx_float_prod_reduce_on_stream,
    f64 => nvshmemx_double_prod_reduce_on_stream,
);
#[cfg(feature = "f16")]
reduce!(Prod:
    half::f16 => nvshmemx_half_prod_reduce_on_stream,
    half::bf16 => nvshmemx_bfloat16_prod_reduce_on_stream,
);

reduce!(Min:
    i8 => nvshmemx_int8_min_reduce_on_stream,
    i16 => nvshmemx_int16_min_reduce_on_stream,
    i32 => nvshmemx_int32_min_reduce_on_stream,
    i64 => nvshmemx_int64_min_reduce_on_stream,
    u8 => nvshmemx_uint8_min_reduce_on_stream,
    u16 => nvshmemx_uint16_min_reduce_on_stream,
    u32 => nvshmemx_uint32_min_reduce_on_stream,
    u64 => nvshmemx_uint64_min_reduce_on_stream,
    f32 => nvshmemx_float_min_reduce_on_stream,
    f64 => nvshmemx_double_min_reduce_on_stream,
);
#[cfg(feature = "f16")]
reduce!(Min:
    half::f16 => nvshmemx_half_min_reduce_on_stream,
    half::bf16 => nvshmemx_bfloat16_min_reduce_on_stream,
);

reduce!(Max:
    i8 => nvshmemx_int8_max_reduce_on_stream,
    i16 => nvshmemx_int16_max_reduce_on_stream,
    i32 => nvshmemx_int32_max_reduce_on_stream,
    i64 => nvshmemx_int64_max_reduce_on_stream,
    u8 => nvshmemx_uint8_max_reduce_on_stream,
    u16 => nvshmemx_uint16_max_reduce_on_stream,
    u32 => nvshmemx_uint32_max_reduce_on_stream,
    u64 => nvshmemx_uint64_max_reduce_on_stream,
    f32 => nvshmemx_float_max_reduce_on_stream,
    f64 => nvshmemx_double_max_reduce_on_stream,
);
#[cfg(feature = "f16")]
reduce!(Max:
    half::f16 => nvshmemx_half_max_reduce_on_stream,
    half::bf16 => nvshmemx_bfloat16_max_reduce_on_stream,
);

reduce!(And:
    i8 => nvshmemx_int8_and_reduce_on_stream,
    i16 => nvshmemx_int16_and_reduce_on_stream,
    i32 => nvshmemx_int32_and_reduce_on_stream,
    i64 => nvshmemx_int64_and_reduce_on_stream,
    u8 => nvshmemx_uint8_and_reduce_on_stream,
    u16 => nvshmemx_uint16_and_reduce_on_stream,
    u32 => nvshmemx_uint32_and_reduce_on_stream,
    u64 => nvshmemx_uint64_and_reduce_on_stream,
);

reduce!(Or:
    i8 => nvshmemx_int8_or_reduce_on_stream,
    i16 => nvshmemx_int16_or_reduce_on_stream,
    i32 => nvshmemx_int32_or_reduce_on_stream,
    i64 => nvshmemx_int64_or_reduce_on_stream,
    u8 => nvshmemx_uint8_or_reduce_on_stream,
    u16 => nvshmemx_uint16_or_reduce_on_stream,
    u32 => nvshmemx_uint32_or_reduce_on_stream,
    u64 => nvshmemx_uint64_or_reduce_on_stream,
);

reduce!(Xor:
    i8 => nvshmemx_int8_xor_reduce_on_stream,
    i16 => nvshmemx_int16_xor_reduce_on_stream,
    i32 => nvshmemx_int32_xor_reduce_on_stream,
    i64 => nvshmemx_int64_xor_reduce_on_stream,
    u8 => nvshmemx_uint8_xor_reduce_on_stream,
    u16 => nvshmemx_uint16_xor_reduce_on_stream,
    u32 => nvshmemx_uint32_xor_reduce_on_stream,
    u64 => nvshmemx_uint64_xor_reduce_on_stream,
);
