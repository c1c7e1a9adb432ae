//! The 128-byte token that lets ranks find each other.

use std::fmt;

use nccl_sys::ncclUniqueId;

use crate::error::{Error, Result};
use crate::ffi::call;

/// Identifies one communicator before it exists (`ncclUniqueId`): rank 0 creates it with
/// [`UniqueId::new`] and every other rank must receive the same 128 bytes (through
/// [`crate::launch::Rendezvous`], MPI, a file, …) before calling [`crate::Comm::init_rank`].
#[derive(Clone, Copy)]
#[doc(alias = "ncclUniqueId")]
pub struct UniqueId(pub(crate) ncclUniqueId);

impl UniqueId {
    /// Number of bytes in an id (`NCCL_UNIQUE_ID_BYTES`).
    pub const BYTES: usize = nccl_sys::NCCL_UNIQUE_ID_BYTES as usize;

    /// A fresh id (`ncclGetUniqueId`). Needs no GPU; NCCL picks the network interface that peers
    /// will connect to (see `NCCL_SOCKET_IFNAME`).
    #[doc(alias = "ncclGetUniqueId")]
    pub fn new() -> Result<Self> {
        let mut id = ncclUniqueId { internal: [0; Self::BYTES] };
        // SAFETY: ncclGetUniqueId writes one ncclUniqueId through the pointer, which points at a
        // live local of that type.
        unsafe { call!(ncclGetUniqueId(&mut id)) }?;
        Ok(Self(id))
    }

    /// The id as bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        self.0.internal.map(|c| c as u8)
    }

    /// An id received from rank 0. Fails unless `bytes` has exactly [`Self::BYTES`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bytes: &[u8; Self::BYTES] =
            bytes.try_into().map_err(|_| Error::UniqueIdLength { expected: Self::BYTES, got: bytes.len() })?;
        Ok(Self(ncclUniqueId { internal: bytes.map(|b| b as std::os::raw::c_char) }))
    }
}

impl PartialEq for UniqueId {
    fn eq(&self, other: &Self) -> bool {
        self.0.internal == other.0.internal
    }
}

impl Eq for UniqueId {}

impl fmt::Debug for UniqueId {
    /// Shows only a prefix: the id is a connection secret of sorts (address and magic).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.to_bytes();
        write!(f, "UniqueId({:02x}{:02x}{:02x}{:02x}…)", b[0], b[1], b[2], b[3])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_lengths_are_checked() {
        let mut raw = [0u8; UniqueId::BYTES];
        raw[0] = 0xab;
        raw[127] = 0xff;
        let id = UniqueId::from_bytes(&raw).unwrap();
        assert_eq!(id.to_bytes(), raw);
        assert_eq!(format!("{id:?}"), "UniqueId(ab000000…)");
        let err = UniqueId::from_bytes(&raw[..100]).unwrap_err();
        assert!(matches!(err, Error::UniqueIdLength { expected: 128, got: 100 }), "{err:?}");
        assert_eq!(err.to_string(), "a unique id has 128 bytes, got 100");
        assert!(matches!(UniqueId::from_bytes(&[0; 129]), Err(Error::UniqueIdLength { expected: 128, got: 129 })));
    }
}
