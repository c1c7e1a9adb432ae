//! The token that lets PEs bootstrap without MPI or a launcher plugin.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use nvshmem_sys::nvshmemx_uniqueid_t;

use crate::error::{Error, Result};
use crate::ffi::{resolve, Returned};
use crate::lifecycle;

/// True once this process asked NVSHMEM for a unique id. `nvshmemx_get_uniqueid` loads NVSHMEM's
/// unique-id bootstrap plugin and leaves it loaded; NVSHMEM's loader then reuses that plugin for
/// whatever bootstrap starts it next (3.4.5 `bootstrap_loader.cpp`: the plugin handle is opened
/// only while none is loaded), and the unique-id plugin dereferences the unique-id arguments that
/// the other bootstraps do not pass (a null pointer). So after an id, only the unique-id bootstrap
/// may start NVSHMEM.
///
/// The mutex also makes making an id and starting NVSHMEM exclusive: [`UniqueId::new`] holds it
/// across its call, and a start holds it from its check of the flag until NVSHMEM has started, so
/// no id can load the plugin between a start's check and its `nvshmemx_hostlib_init_attr`. Neither
/// calls the other while holding it. It also serialises the calls that read or write NVSHMEM's
/// process state from any thread (NVSHMEM runs at `NVSHMEM_THREAD_SERIALIZED`): finalising
/// holds it across `nvshmemx_hostlib_finalize`, and [`crate::init_status`] across its read.
static UNIQUE_ID_PLUGIN: Mutex<bool> = Mutex::new(false);

/// The flag of [`UNIQUE_ID_PLUGIN`], locked: hold it from the check of the flag until NVSHMEM has
/// started.
pub(crate) fn plugin() -> MutexGuard<'static, bool> {
    // A panic while it was held left a valid bool (set before NVSHMEM is called): still usable.
    UNIQUE_ID_PLUGIN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Identifies one NVSHMEM job before it starts (`nvshmemx_uniqueid_t`): PE 0 creates it with
/// [`UniqueId::new`] and every other PE must receive the same bytes before
/// [`crate::Runtime::init`].
#[derive(Clone, Copy)]
#[doc(alias = "nvshmemx_uniqueid_t")]
pub struct UniqueId(pub(crate) nvshmemx_uniqueid_t);

impl UniqueId {
    /// Number of bytes in an id (the whole versioned struct).
    pub const BYTES: usize = std::mem::size_of::<nvshmemx_uniqueid_t>();

    /// A fresh id (`nvshmemx_get_uniqueid`); needs no GPU. The bootstrap listens on the interface
    /// chosen by `NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME` (default: the first usable one).
    ///
    /// It loads NVSHMEM's unique-id bootstrap plugin, which stays loaded: in this process NVSHMEM
    /// can then only start with [`Bootstrap::UniqueId`](crate::Bootstrap::UniqueId) (see
    /// [`Error::BootstrapAfterUniqueId`]). While another thread starts NVSHMEM, it waits until the
    /// start has finished; while a [`Runtime`](crate::Runtime) runs in this process it is refused
    /// ([`Error::UniqueIdWhileRunning`]: NVSHMEM would redo its bootstrap's set-up under the running
    /// bootstrap), before NVSHMEM is called.
    #[doc(alias = "nvshmemx_get_uniqueid")]
    pub fn new() -> Result<Self> {
        let mut plugin = plugin();
        // Stable while `plugin` is held: a start changes it under that lock.
        if lifecycle::running() {
            return Err(Error::UniqueIdWhileRunning);
        }
        // Resolved first: a library that does not load, or lacks the function, loads no plugin,
        // and must not make later starts refuse other bootstraps for one.
        let get_uniqueid = resolve!(nvshmemx_get_uniqueid)?;
        // The plugin is (about to be) loaded in this process; no start is between its check and
        // NVSHMEM's start while `plugin` is held.
        *plugin = true;
        let mut id = nvshmemx_uniqueid_t::initializer();
        // SAFETY: `id` is an initialised id (version word set), which the call fills in.
        unsafe { get_uniqueid(&mut id) }.checked("nvshmemx_get_uniqueid")?;
        Ok(Self(id))
    }

    /// The id as bytes (version word in native byte order, then the contents), to send to the
    /// other PEs.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::BYTES);
        out.extend_from_slice(&self.0.version.to_ne_bytes());
        out.extend(self.0.internal.iter().map(|&c| c as u8));
        out
    }

    /// An id received from PE 0. Fails unless `bytes` has exactly [`Self::BYTES`] bytes and the
    /// version word matches this library's headers.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() != Self::BYTES {
            return Err(Error::UniqueIdLength { expected: Self::BYTES, got: bytes.len() });
        }
        let mut id = nvshmemx_uniqueid_t::initializer();
        let (version, internal) = bytes.split_at(4);
        let version = i32::from_ne_bytes([version[0], version[1], version[2], version[3]]);
        if version != id.version {
            return Err(Error::UniqueIdVersion { expected: id.version, got: version });
        }
        for (dst, &src) in id.internal.iter_mut().zip(internal) {
            *dst = src as std::os::raw::c_char;
        }
        Ok(Self(id))
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId(version {:#x}, …)", self.0.version)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The tests that make ids, one at a time: one of them pretends that a runtime runs.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A start holds the flag's lock from its check until NVSHMEM has started: an id made
    /// meanwhile on another thread waits, so it cannot load the unique-id plugin in between.
    #[test]
    fn an_id_waits_for_a_start_in_progress() {
        let _serial = serial();
        let start = plugin();
        // Made without a GPU; whether NVSHMEM loads here does not matter, only when it is asked.
        let made = std::thread::spawn(UniqueId::new);
        std::thread::sleep(Duration::from_millis(200));
        assert!(!made.is_finished(), "an id was made while a start held the lock");
        drop(start);
        let made = made.join().unwrap();
        // The plugin is marked loaded exactly when NVSHMEM was called: not when the library did
        // not load or lacks the function (before, the flag was set first, and a later start with
        // another bootstrap was refused for a plugin that was never loaded).
        let reached = !matches!(made, Err(Error::Load(_) | Error::MissingFunction(_)));
        assert_eq!(*plugin(), reached, "{made:?}");
    }

    /// Audit: `nvshmemx_get_uniqueid` redoes the unique-id bootstrap's set-up (its options and
    /// debug flag, rewritten without a lock) under a running bootstrap, from any thread. Now an id
    /// is refused while NVSHMEM runs, before NVSHMEM is loaded or called (so without a GPU or the
    /// library here), and the refusal marks no plugin as loaded.
    #[test]
    fn an_id_is_refused_while_nvshmem_runs() {
        let _serial = serial();
        let loaded = *plugin();
        lifecycle::pretend_running(true);
        let made = UniqueId::new();
        lifecycle::pretend_running(false);
        assert!(matches!(made, Err(Error::UniqueIdWhileRunning)), "{made:?}");
        assert_eq!(*plugin(), loaded, "a refused id changed the plugin flag");
    }

    #[test]
    fn bytes_round_trip_and_are_checked() {
        let mut id = nvshmemx_uniqueid_t::initializer();
        id.internal[0] = 5;
        id.internal[123] = -1;
        let bytes = UniqueId(id).to_bytes();
        assert_eq!(bytes.len(), 128);
        let back = UniqueId::from_bytes(&bytes).unwrap();
        assert_eq!(back.to_bytes(), bytes);
        assert!(matches!(UniqueId::from_bytes(&bytes[..127]), Err(Error::UniqueIdLength { expected: 128, got: 127 })));
        let mut wrong = bytes.clone();
        wrong[2] ^= 1;
        let err = UniqueId::from_bytes(&wrong).unwrap_err();
        assert!(
            matches!(err, Error::UniqueIdVersion { expected, got } if expected == id.version && got == expected ^ (1 << 16))
        );
        assert!(err.to_string().contains("does not match this build's"), "{err}");
    }
}
