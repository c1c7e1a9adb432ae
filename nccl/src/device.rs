//! The host side of NCCL's device API (NCCL ≥ 2.28): device communicators that custom CUDA
//! kernels take by value, the requirements they are created with, and teams.
//!
//! A kernel written against `nccl_device.h` (LSA barriers, `ncclGetLsaPointer`, GIN) needs an
//! `ncclDevComm` and symmetric [windows](crate::Window). [`DevComm::new`] creates the device
//! communicator from typed [`DevCommRequirements`]; [`DevComm::arg`] and
//! [`Window::arg`](crate::Window::arg) are the values a cudarc launch builder takes
//! (`let dev = dev_comm.arg(); builder.arg(&dev)`), each borrowing what it stands for. The device
//! communicator borrows its [`Comm`], so it cannot outlive it, and is destroyed only after every
//! kernel queued on the communicator's device has finished. [`load_module`] loads the kernels.
//!
//! NVLink multicast (NVLS, "multimem") is never requested: [`DevCommRequirements::lsa_multimem`]
//! exists so that code written for other machines gets a clear refusal instead of silently losing
//! the feature. GIN (GPU-initiated networking) needs a GIN-capable network; asking for it on a
//! machine without one is an [`Error::GinUnavailable`].
//!
//! # Header and library layouts
//!
//! The device API passes structs between this crate (laid out by the headers it was compiled
//! against) and the library: the requirements in, the device communicator out. Their layouts
//! changed twice — in 2.28.7 (`barrierCount` inserted before `lsaBarrierCount`, GIN fields added to
//! `ncclDevComm`) and in 2.29.2 (versioned structs, which NCCL translates from older versions and
//! refuses from newer ones) — and NCCL checks nothing before 2.29.2: headers of one 2.28 layout
//! with a library of the other make NCCL read the wrong field as the LSA barrier count and write
//! a device communicator larger than the one this crate holds. [`DevComm::new`] therefore refuses
//! any header/library pair whose layouts differ, naming both versions
//! ([`Error::DeviceApiLayout`]), before NCCL sees a struct.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, DeviceRepr};
use gpucomm_ordering::ModuleImage;
use nccl_sys::{
    ncclDevComm, ncclDevCommRequirements, ncclDevResourceHandle_t, ncclDevResourceRequirements, ncclTeam_t,
};

use crate::error::{Error, Result};
use crate::ffi::{call, call_unchecked, require};
use crate::group::open::refuse_inside;
use crate::{Comm, Version};

/// The first NCCL release with the device API.
const DEVICE_API: Version = Version::new(2, 28, 3);

/// How a release lays out the device-API structs (`ncclDevCommRequirements`,
/// `ncclDevResourceRequirements`, `ncclDevComm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// No version fields: NCCL takes the bytes as its own layout, whatever the caller's.
    Unversioned,
    /// `size`, `magic` and `version` lead the requirements: NCCL translates the layout of the
    /// version given there, and refuses a version newer than itself.
    Versioned,
}

/// Every device-API layout, by the first release that has it, from NVIDIA/nccl's
/// `src/include/nccl_device/core.h` and `impl/comm__types.h` at each release tag:
///
/// * 2.28.3: requirements `{resource list, team list, lsaMultimem, lsaBarrierCount}`.
/// * 2.28.7: `barrierCount` inserted before `lsaBarrierCount`, then `railGinBarrierCount`, the
///   LLA2A and GIN counts; `ncclDevResourceRequirements` and `ncclDevComm` grow GIN fields.
/// * 2.29.2: the versioned structs (`NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER` becomes mandatory).
const LAYOUTS: [(Version, Layout); 3] = [
    (Version::new(2, 28, 3), Layout::Unversioned),
    (Version::new(2, 28, 7), Layout::Unversioned),
    (Version::new(2, 29, 2), Layout::Versioned),
];

/// `Ok` when code compiled against NCCL `header` headers can pass device-API structs to the
/// library `library`; otherwise [`Error::DeviceApiLayout`] naming both and the difference. What
/// [`DevComm::new`] checks first, for crates that compile device code against the headers
/// (gpucomm-kernels) to check before they launch it.
#[doc(alias = "ncclDevCommCreate")]
pub fn check_layouts(header: Version, library: Version) -> Result<()> {
    let era = |v: Version| LAYOUTS.iter().rposition(|(first, _)| *first <= v);
    let refuse = |reason| Err(Error::DeviceApiLayout { header, library, reason });
    match (era(header), era(library)) {
        (Some(h), Some(l)) => match (LAYOUTS[h].1, LAYOUTS[l].1) {
            (Layout::Unversioned, Layout::Unversioned) if h == l => Ok(()),
            (Layout::Unversioned, Layout::Unversioned) => refuse(
                "NCCL 2.28.7 inserted barrierCount before lsaBarrierCount and grew ncclDevComm by \
                its GIN fields, so NCCL would take another field for the LSA barrier count and write \
                past the device communicator; use headers and a library both older than 2.28.7, or \
                both from 2.28.7 on",
            ),
            (Layout::Unversioned, Layout::Versioned) => refuse(
                "NCCL ≥ 2.29.2 requires the version fields (size, magic, version) that headers \
                older than 2.29.2 lack, and refuses the call; build against the library's headers",
            ),
            (Layout::Versioned, _) if library < header => refuse(
                "the library is older than the headers and cannot read their structs; load a \
                library at least as new as the headers",
            ),
            (Layout::Versioned, _) => Ok(()),
        },
        _ => refuse("one of them predates the device API (NCCL 2.28.3)"),
    }
}

/// `NCCL_GIN_MAX_CONTEXTS` (`nccl_device/gin/gin_device_host_common.h`, 4 in 2.28 to 2.32): up to
/// 2.29 a GIN barrier takes one 4-byte word per context.
const GIN_MAX_CONTEXTS: u64 = 4;
/// NCCL hands out a resource buffer as a 32-bit handle counting 128-byte units from the start of
/// the device communicator's resource window, and aligns each buffer to at least that.
const RESOURCE_UNIT: u64 = 128;
/// The largest resource-buffer alignment accepted.
const MAX_RESOURCE_ALIGN: usize = 1 << 30;

/// The sizes of the teams NCCL sizes a device communicator's barriers by.
#[derive(Clone, Copy, Debug)]
struct TeamSizes {
    world: u64,
    lsa: u64,
    rail: u64,
}

impl TeamSizes {
    /// `comm`'s teams. A size outside `1..=comm.size()` — what `ncclTeamLsa` and `ncclTeamRail`
    /// answer (a zeroed team) when NCCL's device-API setup fails, which `ncclDevCommCreate` then
    /// tries again — counts as the communicator's size, the most either team can have.
    fn of(comm: &Comm) -> Result<Self> {
        let world = comm.size();
        let bound = |size: usize| if (1..=world).contains(&size) { size } else { world } as u64;
        Ok(TeamSizes { world: world as u64, lsa: bound(comm.team_lsa()?.size), rail: bound(comm.team_rail()?.size) })
    }
}

/// A group of ranks as the device API sees it (`ncclTeam`): `size` ranks, this rank's index in it,
/// and the stride between consecutive members' world ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(alias = "ncclTeam")]
#[doc(alias = "ncclTeam_t")]
pub struct Team {
    /// Number of ranks (`nRanks`).
    pub size: usize,
    /// This rank's index in the team (`rank`).
    pub rank: usize,
    /// Distance between consecutive members in world ranks (`stride`).
    pub stride: usize,
}

impl From<ncclTeam_t> for Team {
    fn from(t: ncclTeam_t) -> Self {
        let n = |v: i32| usize::try_from(v).unwrap_or(0);
        Team { size: n(t.nRanks), rank: n(t.rank), stride: n(t.stride) }
    }
}

impl Team {
    /// The C struct, or [`Error::InvalidTeam`] when a field (public, so any value) does not fit a
    /// C int.
    fn raw(self) -> Result<ncclTeam_t> {
        let int = |v: usize| i32::try_from(v).map_err(|_| self.invalid("a field is larger than a C int"));
        Ok(ncclTeam_t { nRanks: int(self.size)?, rank: int(self.rank)?, stride: int(self.stride)? })
    }

    /// [`Error::InvalidTeam`] for this team.
    fn invalid(self, reason: &'static str) -> Error {
        Error::InvalidTeam { size: self.size, rank: self.rank, stride: self.stride, reason }
    }
}

/// A buffer NCCL allocates for a kernel inside the device communicator's resource window
/// (`ncclDevResourceRequirements`); its handle is [`DevComm::resource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(alias = "ncclDevResourceRequirements")]
pub struct ResourceBuffer {
    /// Bytes.
    pub size: usize,
    /// Alignment in bytes: a power of two, at most 1 GiB.
    pub align: usize,
}

/// GIN (GPU-initiated networking) requirements. Only meaningful with a GIN-capable network
/// (InfiniBand with GPUDirect); elsewhere [`DevComm::new`] returns [`Error::GinUnavailable`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GinRequirements {
    /// Fail instead of silently creating a communicator without GIN (`ginForceEnable`).
    pub force: bool,
    /// Contexts hinted (`ginContextCount`).
    pub contexts: u32,
    /// Signals, numbered from 0 (`ginSignalCount`).
    pub signals: u32,
    /// Counters, numbered from 0 (`ginCounterCount`).
    pub counters: u32,
    /// Barriers over the rail team (`railGinBarrierCount`).
    pub rail_barriers: u32,
}

/// What a [`DevComm`] must provide (`ncclDevCommRequirements`). Start from
/// [`DevCommRequirements::default`] (nothing) and ask for what your kernels use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[doc(alias = "ncclDevCommRequirements")]
#[doc(alias = "NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER")]
pub struct DevCommRequirements {
    lsa_barriers: u32,
    barriers: u32,
    lla2a: Option<(u32, u32)>,
    gin: Option<GinRequirements>,
    multimem: bool,
    resources: Vec<ResourceBuffer>,
}

impl DevCommRequirements {
    /// LSA barriers (`lsaBarrierCount`): one per CTA that opens an `ncclLsaBarrierSession` with a
    /// distinct index.
    pub fn lsa_barriers(mut self, count: u32) -> Self {
        self.lsa_barriers = count;
        self
    }

    /// World barriers (`barrierCount`).
    pub fn barriers(mut self, count: u32) -> Self {
        self.barriers = count;
        self
    }

    /// Low-latency all-to-all blocks and slots over the LSA team (`lsaLLA2ABlockCount`,
    /// `lsaLLA2ASlotCount`).
    pub fn lla2a(mut self, blocks: u32, slots: u32) -> Self {
        self.lla2a = Some((blocks, slots));
        self
    }

    /// GIN resources (see [`GinRequirements`]).
    pub fn gin(mut self, gin: GinRequirements) -> Self {
        self.gin = Some(gin);
        self
    }

    /// NVLink multicast on the LSA team (`lsaMultimem`). **Always refused** by [`DevComm::new`]
    /// with [`Error::MulticastRefused`]: multicast can take shared GPUs out of service, and this
    /// crate never requests it.
    pub fn lsa_multimem(mut self, on: bool) -> Self {
        self.multimem = on;
        self
    }

    /// A resource buffer for the kernels; its handle is [`DevComm::resource`] with the index in the
    /// order of these calls.
    pub fn resource_buffer(mut self, buffer: ResourceBuffer) -> Self {
        self.resources.push(buffer);
        self
    }

    /// `Ok` when what NCCL (2.28.3 to 2.32) derives from these requirements on a communicator
    /// with `teams` fits the C types it computes it in — NCCL checks none of it, and a signed
    /// `int` that overflows is undefined behaviour in C. Recomputed in checked `u64`, for every
    /// release's layout at once:
    ///
    /// * an LSA barrier (`lsaBarrierCount`, and `barrierCount`'s LSA half) takes
    ///   `(3 + LSA team size) × 4` bytes, a product NCCL forms in an `int`
    ///   ([`Error::RequirementTooLarge`]);
    /// * a GIN barrier (`railGinBarrierCount`, and `barrierCount`'s GIN half) takes
    ///   `NCCL_GIN_MAX_CONTEXTS` (4) words up to 2.29, counted in an `int`, and from 2.30 one GIN
    ///   signal per member of its team (the rail team; for `barrierCount` also the world);
    ///   NCCL adds up the signals, with `ginSignalCount`, in an `int`, and multiplies the sum by the
    ///   GIN contexts (at most 4 up to 2.29, the `ginContextCount` hint from 2.30) in another
    ///   ([`Error::RequirementTooLarge`]);
    /// * the resource buffers, NCCL's barrier buffers first, are laid out one after the other,
    ///   each at its alignment (a power of two, at least 128 bytes; at most 1 GiB accepted here,
    ///   [`Error::InvalidAlignment`]), and each gets the 32-bit handle `offset / 128`, computed in
    ///   `size_t` and truncated: the window must end within `u32::MAX × 128` bytes
    ///   ([`Error::ResourceWindowTooLarge`]).
    fn check_sizes(&self, teams: TeamSizes) -> Result<()> {
        let gin = self.gin.unwrap_or_default();
        let int = |what: &'static str, value: u32, derived: Option<u64>| {
            derived.filter(|&d| d <= i32::MAX as u64).ok_or(Error::RequirementTooLarge { what, value })
        };
        // The team sizes are at most the communicator's, an int: no overflow before the products.
        let lsa_barrier_bytes =
            |what, n: u32| int(what, n, (3 + teams.lsa).checked_mul(u64::from(n)).and_then(|b| b.checked_mul(4)));
        let lsa = lsa_barrier_bytes("LSA barriers", self.lsa_barriers)?;
        let hybrid_lsa = lsa_barrier_bytes("barriers", self.barriers)?;
        // The words of a GIN barrier are counted in an int, then multiplied by 4 in size_t.
        let gin_barrier_bytes = |what, n: u32| int(what, n, Some(u64::from(n) * GIN_MAX_CONTEXTS)).map(|w| w * 4);
        let rail_gin = gin_barrier_bytes("rail GIN barriers", gin.rail_barriers)?;
        let hybrid_gin = gin_barrier_bytes("barriers", self.barriers)?;
        let signals_of = |what, n: u32, team: u64| int(what, n, u64::from(n).checked_mul(team));
        // Each term fits an int, so the sum fits a u64.
        let signals = u64::from(gin.signals)
            + signals_of("rail GIN barriers", gin.rail_barriers, teams.rail)?
            + signals_of("barriers", self.barriers, teams.rail)?
            + signals_of("barriers", self.barriers, teams.world)?;
        let contexts = u64::from(gin.contexts).max(GIN_MAX_CONTEXTS);
        let total = u32::try_from(signals).unwrap_or(u32::MAX);
        int("GIN signals in all (those requested and the barriers')", total, signals.checked_mul(contexts))?;

        let place = |end: u64, size: u64, align: u64| end.checked_next_multiple_of(align)?.checked_add(size);
        let limit = u64::from(u32::MAX) * RESOURCE_UNIT;
        // NCCL's own buffers come first (those of every release: at least its end), each at most
        // an int (checked above): no overflow.
        let own = [rail_gin, lsa, hybrid_gin, hybrid_lsa];
        let mut end = own.into_iter().fold(0u64, |end, size| end.next_multiple_of(RESOURCE_UNIT) + size);
        for (index, buf) in self.resources.iter().enumerate() {
            if !buf.align.is_power_of_two() || buf.align > MAX_RESOURCE_ALIGN {
                return Err(Error::InvalidAlignment { align: buf.align });
            }
            let align = (buf.align as u64).max(RESOURCE_UNIT);
            end = place(end, buf.size as u64, align).filter(|&e| e <= limit).ok_or(Error::ResourceWindowTooLarge {
                index,
                size: buf.size,
                align: buf.align,
            })?;
        }
        Ok(())
    }

    /// The C struct, as `NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER` of the compiled headers leaves
    /// it, with these requirements and `resources` linked in (their handles are written to
    /// `handles`).
    fn to_raw(
        &self,
        resources: &mut [ncclDevResourceRequirements],
        handles: &mut [ncclDevResourceHandle_t],
    ) -> Result<ncclDevCommRequirements> {
        let int =
            |what: &'static str, v: u32| i32::try_from(v).map_err(|_| Error::RequirementTooLarge { what, value: v });
        // NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER: all zero in 2.28; from 2.29.2 the version fields
        // and non-zero defaults below. (`ginCustomStride`, default 1 in 2.32, is read only for
        // NCCL_GIN_CONNECTION_CUSTOM_STRIDE, which this crate never sets.)
        // SAFETY: the struct is plain data (pointers, ints, bools, C enums whose zero is a valid
        // value, `NONE`); all-zero is the 2.28 initializer and the base of the later ones.
        let mut raw: ncclDevCommRequirements = unsafe { std::mem::zeroed() };
        #[cfg(nccl_2_29)]
        {
            raw.size = size_of::<ncclDevCommRequirements>();
            raw.magic = crate::comm::API_MAGIC;
            raw.version = nccl_sys::NCCL_VERSION_CODE;
            raw.ginContextCount = 4;
        }
        #[cfg(nccl_2_30)]
        {
            raw.ginTrafficClass = crate::comm::UNDEF_INT;
        }
        #[cfg(nccl_2_30_7)]
        {
            raw.ginStrongSignalsRequired = true;
            raw.ginVaSignalsRequired = true;
        }
        raw.lsaBarrierCount = int("LSA barriers", self.lsa_barriers)?;
        raw.barrierCount = int("barriers", self.barriers)?;
        if let Some((blocks, slots)) = self.lla2a {
            raw.lsaLLA2ABlockCount = int("LLA2A blocks", blocks)?;
            raw.lsaLLA2ASlotCount = int("LLA2A slots", slots)?;
        }
        if let Some(g) = self.gin {
            raw.ginForceEnable = g.force;
            raw.ginContextCount = int("GIN contexts", g.contexts)?;
            raw.ginSignalCount = int("GIN signals", g.signals)?;
            raw.ginCounterCount = int("GIN counters", g.counters)?;
            raw.railGinBarrierCount = int("rail GIN barriers", g.rail_barriers)?;
        }
        let mut next: *mut ncclDevResourceRequirements = std::ptr::null_mut();
        for ((req, handle), buf) in resources.iter_mut().zip(handles.iter_mut()).zip(&self.resources).rev() {
            // SAFETY: plain data; all-zero means "no GIN signals or counters".
            *req = unsafe { std::mem::zeroed() };
            req.bufferSize = buf.size;
            req.bufferAlign = buf.align;
            req.outBufferHandle = handle;
            req.next = next;
            next = req;
        }
        raw.resourceRequirementsList = next;
        Ok(raw)
    }
}

/// A device communicator (`ncclDevComm`): what kernels written against `nccl_device.h` receive by
/// value ([`DevComm::arg`]). Created collectively from a [`Comm`], which it borrows.
///
/// Dropping it destroys it (`ncclDevCommDestroy`, which, unlike the creation, is local: in NCCL
/// 2.28.9 it deregisters this rank's resource window and frees its GIN signals and counters, with
/// no other rank taking part) after waiting for all work queued on the communicator's device, so
/// no kernel that still uses it can be running. That wait is bounded by the communicator's
/// [timeout](Comm::timeout): when it expires (a kernel stuck on another stream of the device), the
/// device communicator is kept, not destroyed, and NCCL frees it with the communicator. After the
/// communicator was aborted there is nothing left to destroy: NCCL freed it with the
/// communicator. [`DevComm::destroy`] does the same and tells the outcome.
#[doc(alias = "ncclDevComm")]
#[doc(alias = "ncclDevComm_t")]
pub struct DevComm<'comm> {
    raw: ncclDevComm,
    comm: &'comm Comm,
    resources: Vec<ncclDevResourceHandle_t>,
    /// Set once there is nothing left to destroy: destroyed (or handed to `ncclDevCommDestroy`,
    /// whether or not it succeeded), or freed by NCCL with the aborted communicator.
    spent: bool,
}

/// The value a kernel takes as its `ncclDevComm` parameter, borrowed from a [`DevComm`]
/// ([`DevComm::arg`]) so that it cannot outlive it: pass a reference to a cudarc launch builder
/// (`let dev = dev_comm.arg(); builder.arg(&dev)`). It has the C layout of `ncclDevComm` (checked
/// against the headers at build time).
#[repr(transparent)]
#[derive(Clone, Copy)]
#[doc(alias = "ncclDevComm")]
pub struct DevCommArg<'d> {
    raw: ncclDevComm,
    _dev: PhantomData<&'d ()>,
}

// SAFETY: `DevCommArg` is `#[repr(transparent)]` over bindgen's `ncclDevComm` (the marker is
// zero-sized), whose layout bindgen asserts equal to C's; kernels take it by value, so its bytes
// are copied as they are.
unsafe impl DeviceRepr for DevCommArg<'_> {}

impl fmt::Debug for DevCommArg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevCommArg")
            .field("rank", &self.raw.rank)
            .field("nRanks", &self.raw.nRanks)
            .field("lsaRank", &self.raw.lsaRank)
            .field("lsaSize", &self.raw.lsaSize)
            .finish()
    }
}

impl fmt::Debug for DevComm<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevComm").field("arg", &self.arg()).field("resources", &self.resources).finish()
    }
}

impl<'comm> DevComm<'comm> {
    /// Creates the device communicator (`ncclDevCommCreate`, NCCL ≥ 2.28.3). Collective: every
    /// rank calls it with the same requirements. Refused before NCCL is called: inside a
    /// [`group`](crate::group) ([`Error::InsideGroup`]: NCCL would create it only when the group
    /// ends, after this call returned), NVLink multicast ([`Error::MulticastRefused`]), headers
    /// and a library whose device-API structs differ ([`Error::DeviceApiLayout`], see the module
    /// docs), and requirements from which NCCL would compute sizes that overflow its C types
    /// ([`Error::RequirementTooLarge`], [`Error::ResourceWindowTooLarge`],
    /// [`Error::InvalidAlignment`]; the team sizes they depend on come from `ncclTeamLsa` and
    /// `ncclTeamRail`). A GIN request that NCCL cannot satisfy is [`Error::GinUnavailable`]. On a
    /// nonblocking communicator NCCL creates it in the background: the call waits for it, bounded
    /// by the communicator's timeout.
    #[doc(alias = "ncclDevCommCreate")]
    pub fn new(comm: &'comm Comm, reqs: &DevCommRequirements) -> Result<Self> {
        refuse_inside()?;
        if reqs.multimem {
            return Err(Error::MulticastRefused);
        }
        require(DEVICE_API, "the device API (ncclDevCommCreate)")?;
        check_layouts(crate::header_version(), crate::ffi::lib_version()?)?;
        let n = reqs.resources.len();
        // SAFETY: plain data, overwritten in `to_raw`.
        let mut resources = vec![unsafe { std::mem::zeroed::<ncclDevResourceRequirements>() }; n];
        let mut handles = vec![0; n];
        let raw_reqs = reqs.to_raw(&mut resources, &mut handles)?;
        reqs.check_sizes(TeamSizes::of(comm)?)?;
        let raw = comm.live_raw()?;
        comm.context().bind_to_thread()?;
        // NCCL writes the device communicator (and the resource handles) when its group task runs:
        // at once, or from a background thread for a nonblocking communicator. Heap slots keep
        // the addresses stable, and are leaked if that may still happen after this returns.
        // SAFETY: plain data; NCCL fills it.
        let mut dev: Box<ncclDevComm> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `raw` is live (checked above; nothing in between can abort it) and its context
        // current; NCCL deep-copies `raw_reqs` and the resource list (`resources`) during the call;
        // `dev` and `handles` stay allocated until NCCL has written them (below).
        let rc = unsafe { call_unchecked!(ncclDevCommCreate(raw, &raw_reqs, &mut *dev)) }?;
        // NCCL 2.28 answers `ncclSuccess` while a nonblocking communicator's background job still
        // writes `dev`, and `comm.is_nonblocking()` can be wrong (an adopter's word for
        // `Comm::from_raw`, `NCCL_COMM_BLOCKING` as this crate read it): wait for the communicator to be ready whatever it is known as
        // (one `ncclCommGetAsyncError` for a ready one) before `dev` is read and freed.
        let done = comm.complete("ncclDevCommCreate", rc).and_then(|()| comm.await_ready("ncclDevCommCreate", None));
        let failed = match done {
            Ok(()) => return Ok(DevComm { raw: *dev, comm, resources: handles, spent: false }),
            Err(e) => e,
        };
        if matches!(rc, nccl_sys::ncclResult_t::ncclInProgress | nccl_sys::ncclResult_t::ncclSuccess) {
            // The background task may still write both (a timeout aborted the communicator;
            // NCCL 2.28 answers a nonblocking communicator's creation `ncclSuccess` while it runs).
            std::mem::forget(dev);
            std::mem::forget(handles);
        }
        match failed {
            Error::Nccl { code, detail, .. } if reqs.gin.is_some() => Err(Error::GinUnavailable { code, detail }),
            e => Err(e),
        }
    }

    /// The kernel argument (`ncclDevComm` by value), valid while the device communicator lives.
    pub fn arg(&self) -> DevCommArg<'_> {
        DevCommArg { raw: self.raw, _dev: PhantomData }
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.raw.rank as usize
    }

    /// This rank's index in its LSA team (the ranks it can load from and store to directly).
    pub fn lsa_rank(&self) -> usize {
        self.raw.lsaRank as usize
    }

    /// Size of the LSA team.
    pub fn lsa_size(&self) -> usize {
        self.raw.lsaSize as usize
    }

    /// GIN contexts NCCL actually created (0 without a GIN-capable network).
    pub fn gin_contexts(&self) -> usize {
        // uint8_t in the 2.28.9 headers, uint32_t in 2.32.3: both widen losslessly.
        self.raw.ginContextCount as usize
    }

    /// The handle of resource buffer `index` (in the order of
    /// [`DevCommRequirements::resource_buffer`]), for `ncclGetResourceBuffer` in kernels.
    pub fn resource(&self, index: usize) -> Option<u32> {
        self.resources.get(index).copied()
    }

    /// The communicator it was created from.
    pub fn comm(&self) -> &'comm Comm {
        self.comm
    }
}

impl DevComm<'_> {
    /// Destroys the device communicator (`ncclDevCommDestroy`) once no kernel of the device runs,
    /// waiting for the device within the communicator's timeout: what dropping it does, with the
    /// outcome. Refused, and handed back with the error, inside a capture scope
    /// ([`Error::ReleaseInCapture`]: a wait for the device would invalidate the capture), when
    /// the device stays busy past the timeout ([`Error::StillInUse`]: a kernel that received it
    /// may be spinning behind a dead peer), or when that wait fails: destroy it again later, or
    /// drop it, which tries once more and otherwise keeps it until NCCL frees it with the
    /// communicator. When `ncclDevCommDestroy` itself fails the error comes back with a device
    /// communicator that is spent: NCCL may have freed part of it, so neither dropping it nor
    /// destroying it again calls NCCL. After an abort there is nothing to destroy (NCCL frees it
    /// with the communicator, at once or when a deferred abort is carried out): `Ok`.
    #[doc(alias = "ncclDevCommDestroy")]
    // The device communicator comes back on failure, as fallible teardown does throughout the family.
    #[allow(clippy::result_large_err)]
    pub fn destroy(mut self) -> std::result::Result<(), (Self, Error)> {
        match self.release() {
            // Spent: its drop calls nothing.
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }

    /// [`DevComm::destroy`]'s work; marks the device communicator spent before NCCL is called.
    fn release(&mut self) -> Result<()> {
        if self.spent {
            return Ok(());
        }
        // After an abort NCCL freed the device communicator with the communicator (or will).
        if self.comm.live_raw().is_err() {
            self.spent = true;
            return Ok(());
        }
        // A wait for the device inside a capture scope would invalidate the capture.
        if gpucomm_ordering::scope_open() {
            return Err(Error::ReleaseInCapture { what: "a DevComm" });
        }
        // No kernel that received this device communicator may still run when it is destroyed;
        // kernels are launched by the caller on streams this crate does not know, hence the whole
        // device, within the communicator's timeout.
        let timeout = self.comm.timeout();
        if !gpucomm_ordering::device_idle_within(self.comm.context(), timeout)? {
            return Err(Error::StillInUse { what: "a DevComm", after: timeout.unwrap_or_default() });
        }
        self.spent = true;
        let Ok(raw) = self.comm.live_raw() else { return Ok(()) };
        // SAFETY: `raw` is live (checked just above, and only this thread can abort it) and the
        // device communicator was created from it; no kernel that received it is still running (the
        // device is idle); it is marked spent, so NCCL never gets it again.
        unsafe { call!(ncclDevCommDestroy(raw, &self.raw), comm = raw) }
    }
}

impl Drop for DevComm<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            log::warn!(
                "nccl: dropping a DevComm: {e}; what is left of it stays until NCCL frees it with the communicator"
            );
        }
    }
}

/// The value a kernel takes as an `ncclWindow_t` parameter, borrowed from a
/// [`Window`](crate::Window) ([`Window::arg`](crate::Window::arg)) so that it cannot outlive it.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct WindowArg<'w> {
    raw: nccl_sys::ncclWindow_t,
    _window: PhantomData<&'w ()>,
}

// SAFETY: `#[repr(transparent)]` over `ncclWindow_t`, a pointer to NCCL's device-visible window
// descriptor, which kernels take by value.
unsafe impl DeviceRepr for WindowArg<'_> {}

impl<T> crate::Window<'_, T> {
    /// The kernel argument for this window (`ncclWindow_t` by value), valid while the window
    /// lives.
    pub fn arg(&self) -> WindowArg<'_> {
        WindowArg { raw: self.as_raw(), _window: PhantomData }
    }
}

/// Loads a module of kernels (a cubin or fat binary, e.g. one that
/// `build_support::build` compiled and the crate embedded, or PTX text) on `ctx`'s device
/// (`cuModuleLoadData`), after checking the image, before the driver sees it:
///
/// * that it is a complete cubin, fat binary or PTX text ([`Error::ModuleImage`] otherwise): the
///   driver takes no length and finds the image's end from its contents, so it would read past
///   the end of a truncated one (see [`gpucomm_ordering::ModuleImage`]);
/// * that a cubin was built for that GPU: one for another architecture is [`Error::KernelImage`]
///   naming both, instead of the driver's `CUDA_ERROR_NO_BINARY_FOR_GPU`.
#[doc(alias = "cuModuleLoadData")]
pub fn load_module(ctx: &Arc<CudaContext>, image: &[u8]) -> Result<Arc<CudaModule>> {
    let checked = ModuleImage::new(image)?;
    let (major, minor) = ctx.compute_capability()?;
    build_support::cubin::check_arch(image, major as u32, minor as u32)
        .map_err(|reason| Error::KernelImage { reason })?;
    Ok(ctx.load_module(cudarc::nvrtc::Ptx::from_binary(checked.into_bytes()))?)
}

impl Comm {
    /// All ranks of the communicator as a team (`ncclTeamWorld`).
    #[doc(alias = "ncclTeamWorld")]
    pub fn team_world(&self) -> Result<Team> {
        require(DEVICE_API, "ncclTeamWorld")?;
        let raw = self.live_raw()?;
        // SAFETY: `raw` is live (checked just above); the function only reads it.
        Ok(unsafe { call_unchecked!(ncclTeamWorld(raw)) }?.into())
    }

    /// The ranks this one can reach with loads and stores (NVLink/P2P; `ncclTeamLsa`).
    #[doc(alias = "ncclTeamLsa")]
    pub fn team_lsa(&self) -> Result<Team> {
        require(DEVICE_API, "ncclTeamLsa")?;
        let raw = self.live_raw()?;
        // SAFETY: `raw` is live (checked just above); the function only reads it.
        Ok(unsafe { call_unchecked!(ncclTeamLsa(raw)) }?.into())
    }

    /// The ranks with this rank's LSA index in the other LSA teams (`ncclTeamRail`).
    #[doc(alias = "ncclTeamRail")]
    pub fn team_rail(&self) -> Result<Team> {
        require(DEVICE_API, "ncclTeamRail")?;
        let raw = self.live_raw()?;
        // SAFETY: `raw` is live (checked just above); the function only reads it.
        Ok(unsafe { call_unchecked!(ncclTeamRail(raw)) }?.into())
    }

    /// The world rank of member `rank` of `team` (`ncclTeamRankToWorld`).
    #[doc(alias = "ncclTeamRankToWorld")]
    pub fn team_rank_to_world(&self, team: Team, rank: usize) -> Result<usize> {
        self.team_rank(team, rank, |raw, t, r| {
            // SAFETY: `raw` is live (`team_rank` took it with `live_raw`), `t` a team NCCL
            // described, `r` checked in range.
            unsafe { call_unchecked!(ncclTeamRankToWorld(raw, t, r)) }
        })
    }

    /// The LSA-team index of member `rank` of `team` (`ncclTeamRankToLsa`).
    #[doc(alias = "ncclTeamRankToLsa")]
    pub fn team_rank_to_lsa(&self, team: Team, rank: usize) -> Result<usize> {
        self.team_rank(team, rank, |raw, t, r| {
            // SAFETY: `raw` is live (`team_rank` took it with `live_raw`), `t` a team NCCL
            // described, `r` checked in range.
            unsafe { call_unchecked!(ncclTeamRankToLsa(raw, t, r)) }
        })
    }

    fn team_rank(
        &self,
        team: Team,
        rank: usize,
        f: impl FnOnce(nccl_sys::ncclComm_t, ncclTeam_t, i32) -> Result<i32>,
    ) -> Result<usize> {
        require(DEVICE_API, "team rank translation")?;
        if rank >= team.size {
            return Err(Error::InvalidRank { what: "team rank", rank, size: team.size });
        }
        let (t, r) = translation(team, rank, self.size())?;
        let out = f(self.live_raw()?, t, r)?;
        usize::try_from(out).map_err(|_| Error::InvalidRank { what: "translated rank", rank, size: team.size })
    }
}

/// The C arguments for translating member `rank` (below `team.size`) of `team` on a communicator
/// of `comm_size` ranks. NCCL computes `base + (rank - team.rank) * team.stride` in C ints, `base`
/// being this rank's world or LSA index (below `comm_size`): refused with [`Error::InvalidTeam`]
/// where that could overflow (undefined behaviour in C), as it can only for a team NCCL did not
/// describe.
fn translation(team: Team, rank: usize, comm_size: usize) -> Result<(ncclTeam_t, i32)> {
    let t = team.raw()?;
    // Below `team.size`, which fits (checked by `raw`).
    let r = i32::try_from(rank).map_err(|_| team.invalid("the rank is larger than a C int"))?;
    // Each factor is below 2^32 in magnitude: no overflow in i64.
    let delta = (i64::from(r) - i64::from(t.rank)) * i64::from(t.stride);
    let largest_base = i64::try_from(comm_size.saturating_sub(1)).unwrap_or(i64::MAX);
    if delta < i64::from(i32::MIN) || delta.saturating_add(largest_base) > i64::from(i32::MAX) {
        return Err(team.invalid("translating the rank overflows a C int"));
    }
    Ok((t, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teams_are_checked_before_nccl() {
        let team = Team { size: 8, rank: 3, stride: 4 };
        let (t, r) = translation(team, 5, 32).unwrap();
        assert_eq!((t.nRanks, t.rank, t.stride, r), (8, 3, 4, 5));
        // Fields that do not fit a C int.
        for bad in [
            Team { size: 1 << 31, rank: 0, stride: 1 },
            Team { size: 2, rank: usize::MAX, stride: 1 },
            Team { size: 2, rank: 0, stride: 1 << 40 },
        ] {
            let err = translation(bad, 1, 2).unwrap_err();
            assert!(matches!(err, Error::InvalidTeam { reason: "a field is larger than a C int", .. }), "{err}");
        }
        // Ints that fit, but whose translation would overflow in C.
        let wide = Team { size: 4, rank: 0, stride: i32::MAX as usize };
        let err = translation(wide, 3, 2).unwrap_err();
        assert!(matches!(err, Error::InvalidTeam { reason: "translating the rank overflows a C int", .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "team of 4 ranks (this rank 0, stride 2147483647) cannot be passed to NCCL: translating the rank overflows a C int"
        );
        let below = Team { size: 4, rank: 3, stride: i32::MAX as usize };
        assert!(translation(below, 0, 2).is_err());
        // The extremes that still fit: base + (1 - 0) * (i32::MAX - 1) with base ≤ 1.
        assert!(translation(Team { size: 2, rank: 0, stride: i32::MAX as usize - 1 }, 1, 2).is_ok());
        assert!(translation(Team { size: 2, rank: 0, stride: i32::MAX as usize - 1 }, 1, 3).is_err());
    }

    #[test]
    fn requirements_become_the_c_struct() {
        let reqs = DevCommRequirements::default()
            .lsa_barriers(16)
            .lla2a(2, 64)
            .resource_buffer(ResourceBuffer { size: 4096, align: 256 })
            .resource_buffer(ResourceBuffer { size: 64, align: 16 });
        // SAFETY: plain data, overwritten.
        let mut res = vec![unsafe { std::mem::zeroed::<ncclDevResourceRequirements>() }; 2];
        let mut handles = vec![0; 2];
        let raw = reqs.to_raw(&mut res, &mut handles).unwrap();
        assert_eq!((raw.lsaBarrierCount, raw.lsaLLA2ABlockCount, raw.lsaLLA2ASlotCount), (16, 2, 64));
        assert!(!raw.lsaMultimem && !raw.ginForceEnable);
        // From 2.29.2 the struct carries its size, NCCL's magic and the headers' version, as
        // NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER sets them (NCCL refuses it otherwise).
        #[cfg(nccl_2_29)]
        {
            assert_eq!((raw.size, raw.magic), (size_of::<ncclDevCommRequirements>(), 0xcafe_beef));
            assert_eq!((raw.version, raw.ginContextCount), (nccl_sys::NCCL_VERSION_CODE, 4));
        }
        #[cfg(nccl_2_30_7)]
        assert!(raw.ginStrongSignalsRequired && raw.ginVaSignalsRequired);
        // The list is in the order given, each entry pointing at its handle.
        assert_eq!(raw.resourceRequirementsList, &mut res[0] as *mut _);
        assert_eq!((res[0].bufferSize, res[0].bufferAlign, res[0].next), (4096, 256, &mut res[1] as *mut _));
        assert_eq!((res[1].bufferSize, res[1].next), (64, std::ptr::null_mut()));
        assert_eq!(res[1].outBufferHandle, &mut handles[1] as *mut _);
    }

    #[test]
    fn header_and_library_layouts_must_match() {
        let v = Version::new;
        // The GPU machine's pins, and the same layout on both sides.
        for (header, library) in [
            (v(2, 28, 9), v(2, 28, 9)),
            (v(2, 28, 7), v(2, 28, 9)),
            (v(2, 28, 3), v(2, 28, 3)),
            (v(2, 29, 2), v(2, 30, 7)),
            (v(2, 32, 3), v(2, 32, 3)),
        ] {
            assert!(check_layouts(header, library).is_ok(), "{header} / {library}");
        }
        // The pinned headers with the machine's system library: NCCL 2.28.3 would read
        // `barrierCount` (0) as the LSA barrier count.
        let err = check_layouts(v(2, 28, 9), v(2, 28, 3)).unwrap_err();
        assert!(err.to_string().starts_with("the NCCL headers this crate was built with (2.28.9) and the loaded library (2.28.3) lay out the device-API structs differently: NCCL 2.28.7 inserted barrierCount"), "{err}");
        assert!(matches!(check_layouts(v(2, 28, 3), v(2, 28, 7)), Err(Error::DeviceApiLayout { .. })));
        // Unversioned structs on a library that requires the version fields.
        let err = check_layouts(v(2, 28, 9), v(2, 29, 2)).unwrap_err();
        assert!(err.to_string().contains("requires the version fields"), "{err}");
        // Versioned headers need a library at least as new.
        let err = check_layouts(v(2, 30, 7), v(2, 29, 7)).unwrap_err();
        assert!(err.to_string().contains("older than the headers"), "{err}");
        assert!(check_layouts(v(2, 30, 7), v(2, 28, 9)).is_err());
        assert!(check_layouts(v(2, 27, 7), v(2, 28, 9)).is_err());
    }

    #[test]
    fn bad_requirements_are_refused_before_nccl() {
        let too_many = DevCommRequirements::default().lsa_barriers(u32::MAX);
        let err = too_many.to_raw(&mut [], &mut []).unwrap_err();
        assert!(matches!(err, Error::RequirementTooLarge { what: "LSA barriers", value: u32::MAX }), "{err}");
        let teams = TeamSizes { world: 8, lsa: 8, rail: 1 };
        for align in [0, 3, 96, 1 << 31] {
            let odd = DevCommRequirements::default().resource_buffer(ResourceBuffer { size: 8, align });
            assert!(
                matches!(odd.check_sizes(teams), Err(Error::InvalidAlignment { align: a }) if a == align),
                "{align}"
            );
        }
        let most = DevCommRequirements::default().resource_buffer(ResourceBuffer { size: 8, align: 1 << 30 });
        assert!(most.check_sizes(teams).is_ok());
    }

    /// What NCCL computes in C ints from the requirements (undefined behaviour when it overflows)
    /// and the resource handles it truncates to 32 bits are refused; usual sizes pass.
    #[test]
    fn sizes_nccl_derives_must_fit_its_c_types() {
        let (one, node) = (TeamSizes { world: 1, lsa: 1, rail: 1 }, TeamSizes { world: 16, lsa: 8, rail: 2 });
        let usual = DevCommRequirements::default()
            .lsa_barriers(128)
            .barriers(32)
            .gin(GinRequirements { force: false, contexts: 4, signals: 1024, counters: 64, rail_barriers: 32 })
            .resource_buffer(ResourceBuffer { size: 4096, align: 256 })
            .resource_buffer(ResourceBuffer { size: 1 << 30, align: 1 << 20 });
        assert!(usual.check_sizes(node).is_ok());
        // NCCL's barrier buffers come before the requested ones.
        let after_barriers = |n| {
            DevCommRequirements::default()
                .lsa_barriers(n)
                .resource_buffer(ResourceBuffer { size: (u32::MAX as usize) * 128 - 127, align: 128 })
        };
        assert!(after_barriers(0).check_sizes(one).is_ok());
        assert!(matches!(after_barriers(1).check_sizes(one), Err(Error::ResourceWindowTooLarge { index: 0, .. })));
        assert!(DevCommRequirements::default().check_sizes(one).is_ok());

        // (3 × n + n × LSA size) × 4 bytes in an int: 2^30 barriers overflow on any team.
        let err = DevCommRequirements::default().lsa_barriers(1 << 30).check_sizes(one).unwrap_err();
        assert!(matches!(err, Error::RequirementTooLarge { what: "LSA barriers", value: 0x4000_0000 }), "{err}");
        assert_eq!(err.to_string(), "LSA barriers = 1073741824 is more than NCCL accepts");
        // With one rank per LSA team that is 16 bytes a barrier: 2^27 − 1 barriers fit, 2^27 do not.
        assert!(DevCommRequirements::default().lsa_barriers((1 << 27) - 1).check_sizes(one).is_ok());
        let err = DevCommRequirements::default().lsa_barriers(1 << 27).check_sizes(one).unwrap_err();
        assert!(matches!(err, Error::RequirementTooLarge { what: "LSA barriers", .. }), "{err}");
        // The LSA team's size counts: 2^26 barriers fit 1 rank, not 8 ((3 + 8) × 4 × 2^26 > 2^31).
        let lsa = DevCommRequirements::default().lsa_barriers(1 << 26);
        assert!(lsa.check_sizes(one).is_ok());
        assert!(matches!(lsa.check_sizes(node), Err(Error::RequirementTooLarge { what: "LSA barriers", .. })));
        // `barrierCount` makes LSA barriers too.
        let err = DevCommRequirements::default().barriers(1 << 30).check_sizes(one).unwrap_err();
        assert!(matches!(err, Error::RequirementTooLarge { what: "barriers", value: 0x4000_0000 }), "{err}");

        // GIN barriers: n × NCCL_GIN_MAX_CONTEXTS words in an int, and one signal per rail member.
        let rail = |n| DevCommRequirements::default().gin(GinRequirements { rail_barriers: n, ..Default::default() });
        assert!(rail((1 << 29) - 1).check_sizes(one).is_ok());
        let err = rail(1 << 29).check_sizes(one).unwrap_err();
        assert!(matches!(err, Error::RequirementTooLarge { what: "rail GIN barriers", .. }), "{err}");
        let wide = TeamSizes { world: 1 << 20, lsa: 1, rail: 1 << 20 };
        assert!(matches!(
            rail(1 << 12).check_sizes(wide),
            Err(Error::RequirementTooLarge { what: "rail GIN barriers", value: 4096 })
        ));
        // Signals add up in an int, and are multiplied by the contexts in another.
        let signals = |signals, contexts| {
            DevCommRequirements::default().gin(GinRequirements { signals, contexts, ..Default::default() })
        };
        assert!(signals((1 << 29) - 1, 4).check_sizes(one).is_ok());
        let err = signals(1 << 29, 4).check_sizes(one).unwrap_err();
        assert_eq!(
            err.to_string(),
            "GIN signals in all (those requested and the barriers') = 536870912 is more than NCCL accepts"
        );
        assert!(matches!(
            signals(1 << 20, 1 << 11).check_sizes(one),
            Err(Error::RequirementTooLarge { value: 0x10_0000, .. })
        ));
        // The barriers' signals count: 2^17 barriers over 2^12 ranks (rail and world) have 2^30.
        let many = TeamSizes { world: 1 << 12, lsa: 1, rail: 1 << 12 };
        let err = DevCommRequirements::default().barriers(1 << 17).check_sizes(many).unwrap_err();
        assert!(matches!(err, Error::RequirementTooLarge { value: 0x4000_0000, .. }), "{err}");

        // Resource buffers: a sum that overflows, and one whose handle would not fit 32 bits.
        let err = DevCommRequirements::default()
            .resource_buffer(ResourceBuffer { size: usize::MAX - 127, align: 128 })
            .resource_buffer(ResourceBuffer { size: 256, align: 128 })
            .check_sizes(one)
            .unwrap_err();
        assert!(
            matches!(err, Error::ResourceWindowTooLarge { index: 0, size, align: 128 } if size == usize::MAX - 127),
            "{err}"
        );
        let window = (u32::MAX as usize) * 128;
        let buffers = |first| {
            DevCommRequirements::default()
                .resource_buffer(ResourceBuffer { size: first, align: 128 })
                .resource_buffer(ResourceBuffer { size: 256, align: 128 })
        };
        // The second buffer starts at the next multiple of 128 bytes.
        assert!(buffers(window - 256).check_sizes(one).is_ok());
        let err = buffers(window - 255).check_sizes(one).unwrap_err();
        assert!(matches!(err, Error::ResourceWindowTooLarge { index: 1, size: 256, align: 128 }), "{err}");
        assert_eq!(
            err.to_string(),
            "resource buffer 1 (256 bytes aligned to 128) ends past the 549755813760 bytes that NCCL's 32-bit \
             resource handles (in 128-byte units) can address, counting the buffers before it and NCCL's own"
        );
    }
}
