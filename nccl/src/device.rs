//! The host side of NCCL's device API (NCCL ≥ 2.28): device communicators that custom CUDA
//! kernels take by value, the requirements they are created with, and teams.
//!
//! A kernel written against `nccl_device.h` (LSA barriers, `ncclGetLsaPointer`, GIN) needs an
//! `ncclDevComm` and symmetric [windows](crate::Window). [`DevComm::new`] creates the device
//! communicator from typed [`DevCommRequirements`]; [`DevComm::arg`] and
//! [`Window::arg`](crate::Window::arg) are the values a cudarc launch builder takes
//! (`builder.arg(dev_comm.arg())`). The device communicator borrows its [`Comm`], so it cannot
//! outlive it, and is destroyed only after every kernel queued on the communicator's device has
//! finished.
//!
//! NVLink multicast (NVLS, "multimem") is never requested: [`DevCommRequirements::lsa_multimem`]
//! exists so that code written for other machines gets a clear refusal instead of silently losing
//! the feature. GIN (GPU-initiated networking) needs a GIN-capable network; asking for it on a
//! machine without one is an [`Error::GinUnavailable`].

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, DeviceRepr};
use nccl_sys::{
    ncclDevComm, ncclDevCommRequirements, ncclDevResourceHandle_t, ncclDevResourceRequirements, ncclTeam_t,
};

use crate::error::{call, Error, Result};
use crate::Comm;

/// The first NCCL release with the device API.
const DEVICE_API: crate::Version = crate::Version::new(2, 28, 3);

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
    fn raw(self) -> ncclTeam_t {
        // Teams only come from NCCL, whose fields are ints.
        ncclTeam_t { nRanks: self.size as i32, rank: self.rank as i32, stride: self.stride as i32 }
    }
}

/// A buffer NCCL allocates for a kernel inside the device communicator's resource window
/// (`ncclDevResourceRequirements`); its handle is [`DevComm::resource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceBuffer {
    /// Bytes.
    pub size: usize,
    /// Alignment in bytes (a power of two).
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

    /// The C struct, with `resources` linked in (their handles are written to `handles`).
    fn to_raw(
        &self,
        resources: &mut [ncclDevResourceRequirements],
        handles: &mut [ncclDevResourceHandle_t],
    ) -> Result<ncclDevCommRequirements> {
        let int =
            |what: &'static str, v: u32| i32::try_from(v).map_err(|_| Error::RequirementTooLarge { what, value: v });
        // NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER (2.28: all zero; from 2.29 the initializer has
        // non-zero GIN defaults, which only matter when GIN is requested).
        // SAFETY: the struct is plain data (pointers, ints, bools); all-zero is its 2.28 initializer.
        let mut raw: ncclDevCommRequirements = unsafe { std::mem::zeroed() };
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
            if !buf.align.is_power_of_two() {
                return Err(Error::ResourceAlignment { align: buf.align });
            }
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
/// value. Created collectively from a [`Comm`], which it borrows.
///
/// Dropping it destroys it (`ncclDevCommDestroy`, collective like its creation: drop it on every
/// rank in the same order) after waiting for all work queued on the communicator's device, so no
/// kernel that still uses it can be running.
#[doc(alias = "ncclDevComm")]
#[doc(alias = "ncclDevComm_t")]
pub struct DevComm<'comm> {
    arg: DevCommArg,
    comm: &'comm Comm,
    resources: Vec<ncclDevResourceHandle_t>,
}

/// The value a kernel takes as its `ncclDevComm` parameter; borrow it from [`DevComm::arg`] and
/// pass it to a cudarc launch builder (`.arg(dev_comm.arg())`). It has the C layout of
/// `ncclDevComm` (checked against the headers at build time).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct DevCommArg(ncclDevComm);

// SAFETY: `DevCommArg` is `#[repr(transparent)]` over bindgen's `ncclDevComm`, whose layout
// bindgen asserts equal to C's; kernels take it by value, so its bytes are copied as they are.
unsafe impl DeviceRepr for DevCommArg {}

impl fmt::Debug for DevCommArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevCommArg")
            .field("rank", &self.0.rank)
            .field("nRanks", &self.0.nRanks)
            .field("lsaRank", &self.0.lsaRank)
            .field("lsaSize", &self.0.lsaSize)
            .finish()
    }
}

impl fmt::Debug for DevComm<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevComm").field("arg", &self.arg).field("resources", &self.resources).finish()
    }
}

impl<'comm> DevComm<'comm> {
    /// Creates the device communicator (`ncclDevCommCreate`, NCCL ≥ 2.28.3). Collective: every
    /// rank calls it with the same requirements. Refuses NVLink multicast
    /// ([`Error::MulticastRefused`]) before calling NCCL; a GIN request that NCCL cannot satisfy is
    /// [`Error::GinUnavailable`].
    #[doc(alias = "ncclDevCommCreate")]
    pub fn new(comm: &'comm Comm, reqs: &DevCommRequirements) -> Result<Self> {
        if reqs.multimem {
            return Err(Error::MulticastRefused);
        }
        crate::error::require(DEVICE_API, "the device API (ncclDevCommCreate)")?;
        let n = reqs.resources.len();
        // SAFETY: plain data, overwritten in `to_raw`.
        let mut resources = vec![unsafe { std::mem::zeroed::<ncclDevResourceRequirements>() }; n];
        let mut handles = vec![0; n];
        let raw_reqs = reqs.to_raw(&mut resources, &mut handles)?;
        comm.context().bind_to_thread()?;
        let raw = comm.as_raw();
        // SAFETY: plain data; NCCL fills it.
        let mut dev: ncclDevComm = unsafe { std::mem::zeroed() };
        // SAFETY: `raw` is a live communicator; `raw_reqs` and the resource list it points to
        // (`resources`, whose out-handles point into `handles`) live until the call returns;
        // `dev` is a valid out-pointer.
        let created = unsafe { call!(ncclDevCommCreate(raw, &raw_reqs, &mut dev), comm = raw) };
        match created {
            Ok(()) => Ok(DevComm { arg: DevCommArg(dev), comm, resources: handles }),
            Err(Error::Nccl { code, detail, .. }) if reqs.gin.is_some() => Err(Error::GinUnavailable { code, detail }),
            Err(e) => Err(e),
        }
    }

    /// The kernel argument (`ncclDevComm` by value).
    pub fn arg(&self) -> &DevCommArg {
        &self.arg
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.arg.0.rank as usize
    }

    /// This rank's index in its LSA team (the ranks it can load from and store to directly).
    pub fn lsa_rank(&self) -> usize {
        self.arg.0.lsaRank as usize
    }

    /// Size of the LSA team.
    pub fn lsa_size(&self) -> usize {
        self.arg.0.lsaSize as usize
    }

    /// GIN contexts NCCL actually created (0 without a GIN-capable network).
    pub fn gin_contexts(&self) -> usize {
        // uint8_t in the 2.28.9 headers, uint32_t in 2.32.3: both widen losslessly.
        self.arg.0.ginContextCount as usize
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

impl Drop for DevComm<'_> {
    fn drop(&mut self) {
        // No kernel that received this device communicator may still run when it is destroyed.
        if let Err(e) = self.comm.context().synchronize() {
            log::warn!("nccl: waiting for kernels before destroying a DevComm failed ({e}); destroying it anyway");
        }
        let raw = self.comm.as_raw();
        // SAFETY: `raw` is the live communicator the device communicator was created from (the
        // borrow guarantees it), and the device communicator is not used after this.
        if let Err(e) = unsafe { call!(ncclDevCommDestroy(raw, &self.arg.0), comm = raw) } {
            log::warn!("nccl: ncclDevCommDestroy failed: {e}");
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
/// `gpucomm_build_support::build` compiled and the crate embedded) on `ctx`'s device, after
/// checking that a cubin was built for that GPU: a cubin for another architecture is
/// [`Error::KernelImage`] naming both, instead of the driver's `CUDA_ERROR_NO_BINARY_FOR_GPU`.
pub fn load_module(ctx: &Arc<CudaContext>, image: &[u8]) -> Result<Arc<CudaModule>> {
    let (major, minor) = ctx.compute_capability()?;
    gpucomm_build_support::cubin::check_arch(image, major as u32, minor as u32)
        .map_err(|reason| Error::KernelImage { reason })?;
    Ok(ctx.load_module(cudarc::nvrtc::Ptx::from_binary(image.to_vec()))?)
}

impl Comm {
    /// All ranks of the communicator as a team (`ncclTeamWorld`).
    #[doc(alias = "ncclTeamWorld")]
    pub fn team_world(&self) -> Result<Team> {
        crate::error::require(DEVICE_API, "ncclTeamWorld")?;
        let raw = self.as_raw();
        // SAFETY: `raw` is live; the function only reads it.
        Ok(unsafe { crate::error::resolve!(ncclTeamWorld)?(raw) }.into())
    }

    /// The ranks this one can reach with loads and stores (NVLink/P2P; `ncclTeamLsa`).
    #[doc(alias = "ncclTeamLsa")]
    pub fn team_lsa(&self) -> Result<Team> {
        crate::error::require(DEVICE_API, "ncclTeamLsa")?;
        let raw = self.as_raw();
        // SAFETY: `raw` is live; the function only reads it.
        Ok(unsafe { crate::error::resolve!(ncclTeamLsa)?(raw) }.into())
    }

    /// The ranks with this rank's LSA index in the other LSA teams (`ncclTeamRail`).
    #[doc(alias = "ncclTeamRail")]
    pub fn team_rail(&self) -> Result<Team> {
        crate::error::require(DEVICE_API, "ncclTeamRail")?;
        let raw = self.as_raw();
        // SAFETY: `raw` is live; the function only reads it.
        Ok(unsafe { crate::error::resolve!(ncclTeamRail)?(raw) }.into())
    }

    /// The world rank of member `rank` of `team` (`ncclTeamRankToWorld`).
    #[doc(alias = "ncclTeamRankToWorld")]
    pub fn team_rank_to_world(&self, team: Team, rank: usize) -> Result<usize> {
        self.team_rank(team, rank, |raw, t, r| {
            // SAFETY: `raw` is live, `t` a team NCCL described, `r` checked in range.
            Ok(unsafe { crate::error::resolve!(ncclTeamRankToWorld)?(raw, t, r) })
        })
    }

    /// The LSA-team index of member `rank` of `team` (`ncclTeamRankToLsa`).
    #[doc(alias = "ncclTeamRankToLsa")]
    pub fn team_rank_to_lsa(&self, team: Team, rank: usize) -> Result<usize> {
        self.team_rank(team, rank, |raw, t, r| {
            // SAFETY: `raw` is live, `t` a team NCCL described, `r` checked in range.
            Ok(unsafe { crate::error::resolve!(ncclTeamRankToLsa)?(raw, t, r) })
        })
    }

    fn team_rank(
        &self,
        team: Team,
        rank: usize,
        f: impl FnOnce(nccl_sys::ncclComm_t, ncclTeam_t, i32) -> Result<i32>,
    ) -> Result<usize> {
        crate::error::require(DEVICE_API, "team rank translation")?;
        if rank >= team.size {
            return Err(Error::InvalidRank { what: "team rank", rank, size: team.size });
        }
        let out = f(self.as_raw(), team.raw(), rank as i32)?;
        usize::try_from(out).map_err(|_| Error::InvalidRank { what: "translated rank", rank, size: team.size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // The list is in the order given, each entry pointing at its handle.
        assert_eq!(raw.resourceRequirementsList, &mut res[0] as *mut _);
        assert_eq!((res[0].bufferSize, res[0].bufferAlign, res[0].next), (4096, 256, &mut res[1] as *mut _));
        assert_eq!((res[1].bufferSize, res[1].next), (64, std::ptr::null_mut()));
        assert_eq!(res[1].outBufferHandle, &mut handles[1] as *mut _);
    }

    #[test]
    fn bad_requirements_are_refused_before_nccl() {
        let too_many = DevCommRequirements::default().lsa_barriers(u32::MAX);
        // SAFETY: plain data.
        let err = too_many.to_raw(&mut [], &mut []).unwrap_err();
        assert!(matches!(err, Error::RequirementTooLarge { what: "LSA barriers", .. }), "{err}");
        let odd = DevCommRequirements::default().resource_buffer(ResourceBuffer { size: 8, align: 3 });
        // SAFETY: plain data, overwritten.
        let mut res = vec![unsafe { std::mem::zeroed::<ncclDevResourceRequirements>() }; 1];
        let err = odd.to_raw(&mut res, &mut [0]).unwrap_err();
        assert!(matches!(err, Error::ResourceAlignment { align: 3 }), "{err}");
    }
}
