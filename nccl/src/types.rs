//! Element types and reduction operators.

use cudarc::driver::DeviceRepr;
use nccl_sys::{ncclDataType_t, ncclRedOp_t, Version};

mod sealed {
    pub trait Sealed {}
}

/// An element type NCCL can move and reduce. Sealed: the element size must match the NCCL data
/// type exactly, or NCCL would read and write past the buffers, so only this crate implements it.
///
/// | Rust | NCCL |
/// |---|---|
/// | `i8`, `u8` | `ncclInt8`, `ncclUint8` |
/// | `i32`, `u32` | `ncclInt32`, `ncclUint32` |
/// | `i64`, `u64` | `ncclInt64`, `ncclUint64` |
/// | `f32`, `f64` | `ncclFloat32`, `ncclFloat64` |
/// | `half::f16`, `half::bf16` (feature `f16`) | `ncclFloat16`, `ncclBfloat16` |
/// | `float8::F8E4M3`, `float8::F8E5M2` (feature `f8`, NCCL ≥ 2.24) | `ncclFloat8e4m3`, `ncclFloat8e5m2` |
///
/// There is deliberately no `bool` (no NCCL reduction means anything for it) and no `char` (4
/// bytes in Rust, and arbitrary bytes are not valid `char`s).
#[doc(alias = "ncclDataType_t")]
pub trait NcclType: DeviceRepr + sealed::Sealed + 'static {
    /// The matching NCCL data type.
    const DATA_TYPE: DataType;
    /// The first NCCL release with this data type; calls with an older loaded library fail with
    /// [`crate::Error::Unsupported`] instead of reaching NCCL.
    const SINCE: Version = OLDEST;
}

/// The oldest NCCL this crate loads: a type available since then needs no check of the loaded
/// library (the loader refused anything older).
const OLDEST: Version = Version::new(2, 18, 1);

/// An NCCL data type (`ncclDataType_t`), as a newtype over the C value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[doc(alias = "ncclDataType_t")]
pub struct DataType(pub(crate) ncclDataType_t);

impl DataType {
    /// The raw value for `nccl-sys` calls.
    pub fn raw(self) -> ncclDataType_t {
        self.0
    }
}

macro_rules! nccl_type {
    ($($t:ty => $c:ident $(since $since:expr)?),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl NcclType for $t {
            const DATA_TYPE: DataType = DataType(ncclDataType_t::$c);
            $(const SINCE: Version = $since;)?
        }
    )*};
}

nccl_type!(
    i8 => ncclInt8,
    u8 => ncclUint8,
    i32 => ncclInt32,
    u32 => ncclUint32,
    i64 => ncclInt64,
    u64 => ncclUint64,
    f32 => ncclFloat32,
    f64 => ncclFloat64,
);

#[cfg(feature = "f16")]
nccl_type!(half::f16 => ncclFloat16, half::bf16 => ncclBfloat16);

// Headers older than 2.24 have no FP8 types at all: the cfg comes from the header version that
// nccl-sys found (see build.rs).
#[cfg(all(feature = "f8", nccl_2_24))]
nccl_type!(
    float8::F8E4M3 => ncclFloat8e4m3 since Version::new(2, 24, 3),
    float8::F8E5M2 => ncclFloat8e5m2 since Version::new(2, 24, 3),
);

/// `Ok` when the loaded library knows `T`'s data type; the library is looked up only for types
/// that not every supported NCCL has.
pub(crate) fn check_loaded_type<T: NcclType>() -> crate::Result<()> {
    if T::SINCE == OLDEST {
        return Ok(());
    }
    check_type::<T>(crate::ffi::lib_version()?)
}

/// `Ok` when a library of version `loaded` knows `T`'s data type.
pub(crate) fn check_type<T: NcclType>(loaded: Version) -> crate::Result<()> {
    if T::SINCE == OLDEST {
        return Ok(());
    }
    crate::ffi::check_version(std::any::type_name::<T>(), T::SINCE, loaded)
}

/// A reduction operator (`ncclRedOp_t`): a newtype over the C value, because NCCL also hands out
/// dynamic operator ids (PreMulSum) that no closed enum could hold.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[doc(alias = "ncclRedOp_t")]
pub struct ReduceOp(pub(crate) ncclRedOp_t);

impl ReduceOp {
    /// Sum (`ncclSum`).
    #[doc(alias = "ncclSum")]
    pub const SUM: Self = Self(ncclRedOp_t::ncclSum);
    /// Product (`ncclProd`).
    #[doc(alias = "ncclProd")]
    pub const PROD: Self = Self(ncclRedOp_t::ncclProd);
    /// Maximum (`ncclMax`).
    #[doc(alias = "ncclMax")]
    pub const MAX: Self = Self(ncclRedOp_t::ncclMax);
    /// Minimum (`ncclMin`).
    #[doc(alias = "ncclMin")]
    pub const MIN: Self = Self(ncclRedOp_t::ncclMin);
    /// Average (`ncclAvg`): sum divided by the number of ranks.
    #[doc(alias = "ncclAvg")]
    pub const AVG: Self = Self(ncclRedOp_t::ncclAvg);

    /// The raw value for `nccl-sys` calls.
    pub fn raw(self) -> ncclRedOp_t {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_data_types() {
        fn size_of_nccl(t: DataType) -> usize {
            match t.0 {
                ncclDataType_t::ncclInt8 | ncclDataType_t::ncclUint8 => 1,
                #[cfg(nccl_2_24)]
                ncclDataType_t::ncclFloat8e4m3 | ncclDataType_t::ncclFloat8e5m2 => 1,
                ncclDataType_t::ncclFloat16 | ncclDataType_t::ncclBfloat16 => 2,
                ncclDataType_t::ncclInt32 | ncclDataType_t::ncclUint32 | ncclDataType_t::ncclFloat32 => 4,
                ncclDataType_t::ncclInt64 | ncclDataType_t::ncclUint64 | ncclDataType_t::ncclFloat64 => 8,
                other => panic!("unexpected {other:?}"),
            }
        }
        fn check<T: NcclType>() {
            assert_eq!(size_of::<T>(), size_of_nccl(T::DATA_TYPE), "{}", std::any::type_name::<T>());
        }
        check::<i8>();
        check::<u8>();
        check::<i32>();
        check::<u32>();
        check::<i64>();
        check::<u64>();
        check::<f32>();
        check::<f64>();
        #[cfg(feature = "f16")]
        {
            check::<half::f16>();
            check::<half::bf16>();
        }
        #[cfg(all(feature = "f8", nccl_2_24))]
        {
            check::<float8::F8E4M3>();
            check::<float8::F8E5M2>();
        }
    }

    #[test]
    fn types_newer_than_the_loaded_library_are_refused() {
        struct Fp8Like;
        impl sealed::Sealed for Fp8Like {}
        // SAFETY: test-only type, never sent to the device.
        unsafe impl DeviceRepr for Fp8Like {}
        impl NcclType for Fp8Like {
            const DATA_TYPE: DataType = DataType(ncclDataType_t::ncclUint8);
            const SINCE: Version = Version::new(2, 24, 3);
        }
        assert!(check_type::<Fp8Like>(Version::new(2, 24, 3)).is_ok());
        let err = check_type::<Fp8Like>(Version::new(2, 23, 4)).unwrap_err();
        assert!(err.to_string().ends_with("Fp8Like needs NCCL ≥ 2.24.3, but the loaded library is 2.23.4"), "{err}");
    }
}
