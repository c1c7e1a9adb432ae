//! Kernels that use NVSHMEM device calls: loading a device-linked module, registering it with
//! NVSHMEM, and launching its kernels (plainly, or collectively with every block co-resident).
//!
//! NVSHMEM device code must be compiled with relocatable device code and device-linked against
//! `libnvshmem_device.a` into one self-contained image:
//!
//! ```text
//! nvcc -arch=sm_90 -rdc=true -c kern.cu -o kern.o -I$NVSHMEM/include
//! nvcc -arch=sm_90 -dlink -cubin kern.o $NVSHMEM/lib/libnvshmem_device.a -o kern.cubin
//! ```
//!
//! (`build_support::build::nvcc::Nvcc::device_linked_module` does both from a build
//! script.) [`Runtime::load_module`] loads the image into the PE's context, refuses one that is
//! truncated or corrupt, was not device-linked or was built for another GPU, and runs
//! `nvshmemx_cumodule_init` on it, which points the module's copy of NVSHMEM's device state at the
//! running library. The kernels are `extern "C" __global__` functions found by name with
//! [`Module::kernel`].

use std::ffi::{c_void, CString};
use std::ptr::NonNull;
use std::sync::Arc;

use build_support::cubin;
use cudarc::driver::sys::{self, CUdevice_attribute, CUfunction, CUmodule};
use cudarc::driver::{result, CudaStream, DeviceRepr, DriverError, LaunchConfig};
use gpucomm_ordering::{Access, DeviceBuffer, DeviceBufferMut, Guard, Keep, ModuleImage, Resource, Visitor};

use crate::error::{Error, Result};
use nvshmem_sys::{nvshmemi_device_host_state_t, nvshmemi_version_t};

use crate::ffi::call;
use crate::quiesce;
use crate::runtime::Admitted;
use crate::Runtime;

/// The global that `libnvshmem_device.a` defines in every module device-linked against it.
const DEVICE_LIB_VERSION: &str = "nvshmemi_device_lib_version_d";
/// The global that `nvshmemx_cumodule_init` writes the PE's device state into.
const DEVICE_STATE: &str = "nvshmemi_device_state_d";

/// A module of kernels that use NVSHMEM device calls, loaded into the PE's context and
/// registered with NVSHMEM (`nvshmemx_cumodule_init`). Dropping it waits for the device (its
/// kernels may run on any stream), within [`Runtime::set_timeout`], then unregisters
/// (`nvshmemx_cumodule_finalize`) and unloads it; when the device does not become idle in time,
/// the module stays loaded (with a warning) rather than be unloaded under a running kernel; it
/// also stays loaded when unregistering fails (NVSHMEM may still hold the address of its device
/// state, and would write there once the module's memory is freed). So it does, without waiting,
/// when it is dropped while this thread has a capture scope open ([`crate::capture`]): a wait for
/// the device there would break the capture (CUDA refuses host waits inside it), and NVSHMEM can
/// exit the process when a call of its own is refused so.
#[doc(alias = "nvshmemx_cumodule_finalize")]
#[doc(alias = "cuModuleUnload")]
pub struct Module<'rt> {
    raw: NonNull<sys::CUmod_st>,
    rt: &'rt Runtime,
    /// Set once `nvshmemx_cumodule_init` succeeded: only then is there something to finalize.
    registered: bool,
}

impl std::fmt::Debug for Module<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module").field("raw", &self.raw).finish()
    }
}

impl Runtime {
    /// Loads a module image (a cubin from `nvcc -dlink -cubin`, or a fatbin) into the PE's
    /// context and registers it with NVSHMEM (`nvshmemx_cumodule_init`).
    ///
    /// Refused with [`Error::ModuleImage`] when the image is not a complete cubin, fat binary or
    /// PTX text (checked before the driver sees it: `cuModuleLoadData` takes no length, and would
    /// read past the end of a truncated image; see [`gpucomm_ordering::ModuleImage`]), with
    /// [`Error::WrongArchitecture`] when the cubin was built for a GPU this device cannot run
    /// (checked from its header before loading, and from the driver's
    /// `CUDA_ERROR_NO_BINARY_FOR_GPU`), with [`Error::NotNvshmemModule`] when it was not
    /// device-linked against NVSHMEM's device library, and with [`Error::ModuleGlobalSize`] when
    /// the globals NVSHMEM reads and writes do not have the sizes of this NVSHMEM's types. Refused with [`Error::HostCallInCapture`]
    /// while this thread has a capture scope open ([`crate::capture`]), and with
    /// [`Error::CopyStreamsCaptured`] while a capture holds NVSHMEM's copy streams:
    /// `nvshmemx_cumodule_init` makes a synchronous copy, which CUDA refuses inside a capture, and
    /// NVSHMEM exits the process on that refusal.
    ///
    /// Loading waits for the whole device: `nvshmemx_cumodule_init` ends with
    /// `cudaDeviceSynchronize`, so work queued anywhere on the PE's device (on any stream, by any
    /// library) holds it up. So that stuck work (a kernel waiting for a dead peer) does not hold it
    /// up for ever, the device is first waited for within [`Runtime::set_timeout`], and the load
    /// refused with [`Error::StillInUse`] (nothing loaded) when it is not idle in time; work that
    /// other threads enqueue between that wait and NVSHMEM's is still waited for without bound.
    ///
    /// When `nvshmemx_cumodule_init` fails, NVSHMEM may already hold the address of the module's
    /// device state: the module is unregistered (`nvshmemx_cumodule_finalize`) before it is
    /// unloaded, and stays loaded, with a warning, when that fails too.
    #[doc(alias = "nvshmemx_cumodule_init")]
    #[doc(alias = "cuModuleLoadData")]
    pub fn load_module(&self, image: &[u8]) -> Result<Module<'_>> {
        let checked = ModuleImage::new(image)?;
        quiesce::host_call("loading a module (nvshmemx_cumodule_init)")?;
        let _relaxed = quiesce::relaxed_host();
        let ctx = self.context();
        let major = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let arch = (major.max(0) * 10 + minor.max(0)) as u32;
        let module_arch = cubin::cubin_arch(image);
        let wrong = || Error::WrongArchitecture { module: module_arch, device: self.device(), arch };
        if module_arch.is_some_and(|m| !cubin::runs_on(m, arch)) {
            return Err(wrong());
        }
        ctx.bind_to_thread()?;
        // `nvshmemx_cumodule_init` ends with `cudaDeviceSynchronize`, which waits without bound:
        // wait for the device within the runtime's timeout first, before anything is loaded.
        self.wait_for_device("the PE's device (loading a module waits for all of its work)")?;
        // SAFETY: `checked` is a cubin or fat binary whose parts lie within its bytes, or
        // NUL-terminated PTX text (`ModuleImage::new`), alive until after the call; the PE's
        // context is current.
        let raw = match unsafe { result::module::load_data(checked.as_ptr()) } {
            Ok(raw) => raw,
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_NO_BINARY_FOR_GPU)) => return Err(wrong()),
            Err(e) => return Err(e.into()),
        };
        let raw = NonNull::new(raw).ok_or(Error::Cuda(DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_HANDLE)))?;
        // From here on, dropping `module` unloads it.
        let mut module = Module { raw, rt: self, registered: false };
        // NVSHMEM copies the version global, whatever its size, into a value of its own type on
        // the host stack, and its device state, at its own size, into the state global: a module
        // whose globals have other sizes (PTX that declares them, say) would overflow one or the
        // other.
        let sizes = [
            (DEVICE_LIB_VERSION, size_of::<nvshmemi_version_t>()),
            (DEVICE_STATE, size_of::<nvshmemi_device_host_state_t>()),
        ];
        for (global, expected) in sizes {
            let size = module.global_size(global)?.ok_or(Error::NotNvshmemModule)?;
            if size != expected {
                return Err(Error::ModuleGlobalSize { global, size, expected });
            }
        }
        // NVSHMEM refuses a device library of another major version, or of a newer minor one,
        // than the host library's (`nvshmemi_is_version_compatible`), but then fails finalising
        // too, which would leave the module loaded for good: refused here first.
        let library = self.info().version;
        match module.device_lib_version()? {
            Some(device) if device.major == library.major && device.minor <= library.minor => {}
            device => return Err(Error::ModuleVersion { device, library }),
        }
        // SAFETY: NVSHMEM is initialised; the module is live, loaded in the current context, and
        // its two globals that NVSHMEM reads and writes have the sizes of the host library's
        // types (checked).
        if let Err(e) = unsafe { call!(nvshmemx_cumodule_init(module.as_raw() as nvshmem_sys::CUmodule)) } {
            // NVSHMEM 3.4.5's `nvshmemi_cuobject_init_common` registers the module's state address,
            // then updates the device state and synchronises the device, and returns a failure of
            // either with the address still registered: every later update of NVSHMEM's device
            // state would copy into the module's memory once it is unloaded. Finalising
            // unregisters it (where init failed before registering it, finalising finds nothing
            // and changes nothing, but fails as well). When finalising fails, whether NVSHMEM still
            // holds the address is unknown, and the module stays loaded.
            if let Err(fe) = module.finalize() {
                log::warn!(
                    "nvshmem: nvshmemx_cumodule_init failed ({e}), and so did nvshmemx_cumodule_finalize ({fe}): \
                     NVSHMEM may still update the module's device state, so the module stays loaded"
                );
                std::mem::forget(module);
            }
            return Err(e);
        }
        module.registered = true;
        Ok(module)
    }
}

impl<'rt> Module<'rt> {
    /// The size of the module's global `name`, `None` when it has none.
    fn global_size(&self, name: &str) -> Result<Option<usize>> {
        let name = CString::new(name).map_err(|_| Error::NotNvshmemModule)?;
        // SAFETY: live module; the name is NUL-terminated.
        match unsafe { result::module::get_global(self.as_raw(), name) } {
            Ok((_, size)) => Ok(Some(size)),
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_FOUND)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The NVSHMEM version of the device library the module was linked with
    /// (`nvshmemi_device_lib_version_d`, whose size was checked); `None` when a part is negative.
    fn device_lib_version(&self) -> Result<Option<nvshmem_sys::Version>> {
        let name = CString::new(DEVICE_LIB_VERSION).map_err(|_| Error::NotNvshmemModule)?;
        // SAFETY: live module; the name is NUL-terminated.
        let (ptr, _) = unsafe { result::module::get_global(self.as_raw(), name) }?;
        let mut parts = [0i32; 3];
        // SAFETY: the global is an `nvshmemi_version_t` (three ints, its size checked by the
        // caller) in device memory of the current context; `parts` is as long.
        unsafe { result::memcpy_dtoh_sync(&mut parts, ptr) }?;
        let [major, minor, patch] = parts.map(u32::try_from);
        Ok(match (major, minor, patch) {
            (Ok(major), Ok(minor), Ok(patch)) => Some(nvshmem_sys::Version::new(major, minor, patch)),
            _ => None,
        })
    }

    /// Unregisters the module from NVSHMEM (`nvshmemx_cumodule_finalize`): NVSHMEM forgets the
    /// address of the module's device state and no longer updates it. The PE's context must be
    /// current.
    fn finalize(&self) -> Result<()> {
        // SAFETY: NVSHMEM is initialised (the runtime is borrowed); the module is live and loaded
        // in the current context (the callers'). NVSHMEM looks up the module's state global and
        // removes its address from the ones it updates (NVSHMEM 3.4.5 `unregister_state_ptr`); an
        // address it does not hold is left alone, and the call fails.
        unsafe { call!(nvshmemx_cumodule_finalize(self.as_raw() as nvshmem_sys::CUmodule)) }
    }

    /// The raw module handle, for driver calls this crate does not wrap. It stays owned by `self`.
    pub fn as_raw(&self) -> CUmodule {
        self.raw.as_ptr()
    }

    /// The `extern "C" __global__` function `name` (`cuModuleGetFunction`).
    #[doc(alias = "cuModuleGetFunction")]
    pub fn kernel(&self, name: &str) -> Result<Kernel<'_, 'rt>> {
        let missing = || Error::KernelNotFound { name: name.to_string() };
        let c_name = CString::new(name).map_err(|_| missing())?;
        // SAFETY: live module; the name is NUL-terminated.
        match unsafe { result::module::get_function(self.as_raw(), c_name) } {
            Ok(raw) => Ok(Kernel { raw, module: self }),
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_FOUND)) => Err(missing()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A kernel of it may be stuck behind a dead peer, the likely cause of the panic; the
            // wait below could last for ever (as the runtime and teams, it is left as it is).
            return log::warn!("nvshmem: a module dropped while panicking stays loaded");
        }
        if gpucomm_ordering::scope_open() {
            return log::warn!(
                "nvshmem: a module dropped inside a capture stays loaded (waiting for the device there would break \
                 the capture)"
            );
        }
        let ctx = self.rt.context();
        // Kernels of the module may still be running, on streams this crate does not know: wait
        // for the device, within the runtime's timeout, and keep the module loaded otherwise.
        if let Err(e) = self.rt.wait_for_device("a module (its kernels may still run on the PE's device)") {
            return log::warn!("nvshmem: {e}; a dropped module stays loaded");
        }
        // Not `bind_to_thread`, which would fail with (and take) an error something else recorded
        // in the context, and keep the module loaded for it.
        if let Err(e) = gpucomm_ordering::make_current(ctx) {
            return log::warn!("nvshmem: making the PE's context current failed ({e}); a dropped module stays loaded");
        }
        // The context is current (made so above) and no kernel runs (the device is idle).
        if self.registered {
            if let Err(e) = self.finalize() {
                // NVSHMEM may still hold the module's state address, and would copy its device
                // state into the module's memory once unloaded.
                return log::warn!("nvshmem: nvshmemx_cumodule_finalize failed ({e}); a dropped module stays loaded");
            }
        }
        // SAFETY: the module is live and nothing runs in it any more; it is unloaded once.
        if let Err(e) = unsafe { result::module::unload(self.as_raw()) } {
            log::warn!("nvshmem: unloading a module failed: {e}");
        }
    }
}

impl Module<'_> {
    /// The module as a resource a graph must keep: what a launch of its kernels inside [`crate::capture`] records.
    pub(crate) fn resource(&self) -> Resource {
        Resource::of("module", self)
    }
}

// SAFETY: the borrow keeps the module loaded and in place (and its runtime running).
unsafe impl Keep for &Module<'_> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.resource(self.resource(), true);
    }
}

/// A kernel of a [`Module`].
pub struct Kernel<'m, 'rt> {
    raw: CUfunction,
    module: &'m Module<'rt>,
}

impl std::fmt::Debug for Kernel<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("raw", &self.raw).finish()
    }
}

/// The arguments of one kernel launch, in the kernel's parameter order. Buffers are taken through
/// [`gpucomm_ordering::Access`], so the launch is ordered after their earlier uses on other
/// streams (and, inside [`crate::capture`], recorded for the graph); values are copied.
pub struct KernelArgs<'s, 'b> {
    access: &'s Access<'b>,
    words: Vec<u64>,
    starts: Vec<usize>,
    guards: Vec<Guard<'s>>,
}

impl<'s, 'b: 's> KernelArgs<'s, 'b> {
    /// A device buffer the kernel reads (its address is passed).
    pub fn buffer<T>(&mut self, buf: &'b impl DeviceBuffer<T>) -> Result<&mut Self> {
        let (ptr, guard) = self.access.read(buf)?;
        guard.keep_in(&mut self.guards);
        self.value(ptr)
    }

    /// A device buffer the kernel writes (its address is passed).
    pub fn buffer_mut<T>(&mut self, buf: &'b mut impl DeviceBufferMut<T>) -> Result<&mut Self> {
        let (ptr, guard) = self.access.write(buf)?;
        guard.keep_in(&mut self.guards);
        self.value(ptr)
    }

    /// A value passed by copy. Its alignment must be at most 8 bytes ([`Error::KernelArgument`]).
    pub fn value<V: DeviceRepr>(&mut self, value: V) -> Result<&mut Self> {
        let (size, align) = (size_of::<V>(), align_of::<V>());
        if align > 8 {
            return Err(Error::KernelArgument { size, align });
        }
        let start = self.words.len();
        self.words.resize(start + size.div_ceil(8).max(1), 0);
        // SAFETY: the destination has room for `size` bytes from `start` (just resized) and is
        // 8-byte aligned, which is enough for `V`; `V: DeviceRepr` is plain data the kernel reads
        // by copy.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &value as *const V as *const u8,
                self.words.as_mut_ptr().add(start) as *mut u8,
                size,
            )
        };
        self.starts.push(start);
        Ok(self)
    }
}

impl<'rt> Kernel<'_, 'rt> {
    /// The raw function handle. It stays valid while the module is loaded.
    pub fn as_raw(&self) -> CUfunction {
        self.raw
    }

    /// How many blocks of `threads` threads with `shared_mem` bytes of dynamic shared memory can
    /// be resident on the device at once (`cuOccupancyMaxActiveBlocksPerMultiprocessor` × SMs):
    /// the largest grid [`Kernel::launch_collective`] accepts.
    #[doc(alias = "nvshmemx_collective_launch_query_gridsize")]
    #[doc(alias = "cuOccupancyMaxActiveBlocksPerMultiprocessor")]
    pub fn max_collective_blocks(&self, threads: u32, shared_mem: u32) -> Result<u64> {
        let (per_sm, sms) = self.residency(threads, shared_mem)?;
        Ok(u64::from(per_sm) * u64::from(sms))
    }

    fn residency(&self, threads: u32, shared_mem: u32) -> Result<(u32, u32)> {
        let ctx = self.module.rt.context();
        ctx.bind_to_thread()?;
        let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let mut per_sm = 0;
        let threads_int = i32::try_from(threads).unwrap_or(i32::MAX);
        // SAFETY: live function of a loaded module; the out-pointer is a live local.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, self.raw, threads_int, shared_mem as usize)
        }
        .result()?;
        Ok((per_sm.max(0) as u32, sms.max(0) as u32))
    }

    /// Launches the kernel on `stream` (`cuLaunchKernel`) with the arguments `args` pushes.
    /// Fine for kernels whose blocks do not wait for each other or for other PEs; kernels that
    /// do (device-side barriers, waits, collectives) need [`Kernel::launch_collective`].
    ///
    /// # Safety
    ///
    /// The arguments must match the kernel's parameters in number, order and type, and the
    /// kernel must stay within the buffers it is given (as for any CUDA kernel launch). Besides:
    ///
    /// - the kernel makes no NVSHMEM collective (barrier, sync, reduction, broadcast, fcollect,
    ///   alltoall, over any team): those update the team's device state without atomics, and
    ///   only [`Kernel::launch_collective`] orders them with the PE's other collectives (see
    ///   [`crate::Team`]);
    /// - a buffer passed read-only ([`KernelArgs::buffer`]) is only read by the kernel, on every
    ///   PE it reaches; one it writes, here or remotely, is passed writable;
    /// - addresses the kernel hands to NVSHMEM's remote operations (puts, gets, atomics, signals)
    ///   are symmetric memory, as NVSHMEM requires;
    /// - the kernel completes (`nvshmem_quiet`) the non-blocking operations it starts before it
    ///   ends: the buffers' ordering takes the kernel's end as the end of every use it made, so
    ///   a copy still in flight afterwards could meet a reuse or a free of its memory.
    #[doc(alias = "cuLaunchKernel")]
    pub unsafe fn launch<'b>(
        &self,
        cfg: LaunchConfig,
        stream: &'b Arc<CudaStream>,
        args: impl FnOnce(&mut KernelArgs<'_, 'b>) -> Result<()>,
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.launch_with(false, cfg, stream, args) }
    }

    /// Launches the kernel cooperatively (`cuLaunchCooperativeKernel`) after checking that all
    /// its blocks can be resident at once ([`Error::GridTooLarge`] otherwise, see
    /// [`Kernel::max_collective_blocks`]): what kernels that synchronise across blocks or PEs need,
    /// and what `nvshmemx_collective_launch` does for runtime-API kernels. Every PE launches it.
    /// The launch counts as one of the PE's collectives (see [`crate::Team`]): it waits for the
    /// last collective enqueued on another stream, later ones wait for it, and a graph that
    /// captures it joins that order at each launch.
    ///
    /// # Safety
    ///
    /// As for [`Kernel::launch`], except that the kernel may make NVSHMEM collectives.
    #[doc(alias = "nvshmemx_collective_launch")]
    #[doc(alias = "cuLaunchCooperativeKernel")]
    pub unsafe fn launch_collective<'b>(
        &self,
        cfg: LaunchConfig,
        stream: &'b Arc<CudaStream>,
        args: impl FnOnce(&mut KernelArgs<'_, 'b>) -> Result<()>,
    ) -> Result<()> {
        let rt = self.module.rt;
        let cooperative = rt.context().attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)?;
        if cooperative == 0 {
            return Err(Error::CooperativeUnsupported { device: rt.device() });
        }
        let (gx, gy, gz) = cfg.grid_dim;
        let blocks = u64::from(gx) * u64::from(gy) * u64::from(gz);
        let (bx, by, bz) = cfg.block_dim;
        let threads = bx.saturating_mul(by).saturating_mul(bz);
        let (per_sm, sms) = self.residency(threads, cfg.shared_mem_bytes)?;
        if blocks > u64::from(per_sm) * u64::from(sms) {
            return Err(Error::GridTooLarge { blocks, per_sm, sms, threads, shared_mem: cfg.shared_mem_bytes });
        }
        // SAFETY: forwarded from this function's contract; the grid fits (checked).
        unsafe { self.launch_with(true, cfg, stream, args) }
    }

    /// # Safety
    ///
    /// As for [`Kernel::launch`].
    unsafe fn launch_with<'b>(
        &self,
        cooperative: bool,
        cfg: LaunchConfig,
        stream: &'b Arc<CudaStream>,
        args: impl FnOnce(&mut KernelArgs<'_, 'b>) -> Result<()>,
    ) -> Result<()> {
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.module.resource())?;
        self.module.rt.enqueue_on(&admitted)?;
        let mut pushed = KernelArgs { access: &access, words: Vec::new(), starts: Vec::new(), guards: Vec::new() };
        args(&mut pushed)?;
        // The closure may have begun a capture of the stream (cudarc's `begin_capture` is safe):
        // its graph would keep neither the buffers nor the module.
        access.recheck()?;
        let base = pushed.words.as_mut_ptr();
        // SAFETY: every start indexes into `words`, which is no longer resized.
        let mut params: Vec<*mut c_void> =
            pushed.starts.iter().map(|&i| unsafe { base.add(i) } as *mut c_void).collect();
        let mut launch = || {
            let launch = if cooperative { result::launch_cooperative_kernel } else { result::launch_kernel };
            // SAFETY: the function is live (its module is borrowed); `params` points at one value
            // per kernel parameter (the caller's contract), alive until after the call; the
            // stream is on the PE's device and its context current.
            Ok(unsafe {
                launch(self.raw, cfg.grid_dim, cfg.block_dim, cfg.shared_mem_bytes, stream.cu_stream(), &mut params)
            }?)
        };
        if cooperative {
            quiesce::collective(stream.cu_stream(), admitted.captured.then_some(&**stream), false, launch)?;
        } else {
            launch()?;
        }
        // The guards record the buffers' use now that the kernel is enqueued.
        drop(pushed);
        Ok(())
    }
}
