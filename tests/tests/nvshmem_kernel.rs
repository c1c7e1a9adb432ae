//! Kernels that call NVSHMEM themselves, on real GPUs, one process per GPU: a device-linked cubin
//! loaded and registered with `nvshmemx_cumodule_init`, a ring put with a plain launch, one that
//! synchronises the grid and the PEs with a collective launch, and the modules and grids that must
//! be refused (not device-linked, built for other GPUs, too many blocks to be co-resident).

mod nvshmem_support;

use gpucomm_tests::multi_process;
use nvshmem::Error;
use nvshmem_support::{grid, pes, start, value, OTHER_ARCH, PLAIN, RING};

/// PTX (compiled by the driver at load) that declares the two globals NVSHMEM reads and writes
/// when it registers a module, at sizes other than NVSHMEM's types.
const WRONG_GLOBAL_SIZES: &str = "
.version 7.8
.target sm_80
.address_size 64
.visible .global .align 4 .b8 nvshmemi_device_lib_version_d[65536];
.visible .global .align 8 .b8 nvshmemi_device_state_d[8];
";

const COUNT: usize = 1 << 16;

/// What PE `pe` sends at `i` in plain-launch round `round`.
fn round_value(pe: usize, i: usize, round: i32) -> i32 {
    value(pe, i) + round * 10_000_000
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn nvshmem_kernels_with_plain_and_collective_launches() {
    multi_process("nvshmem_kernels_with_plain_and_collective_launches", pes(), |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let prev = (me + n - 1) % n;
        let expected = |round| (0..COUNT).map(|i| round_value(prev, i, round)).collect::<Vec<_>>();

        let module = rt.load_module(RING).unwrap();
        let plain = module.kernel("ring_put_plain").unwrap();
        let synced = module.kernel("ring_put").unwrap();
        assert!(
            matches!(module.kernel("no_such_kernel"), Err(Error::KernelNotFound { name }) if name == "no_such_kernel")
        );
        let mut dst = rt.alloc_zeroed::<i32>(COUNT).unwrap();
        let len = COUNT as i32;
        let plain_round = |dst: &mut nvshmem::Symmetric<'_, i32>, round: i32| {
            let src = stream.clone_htod(&(0..COUNT).map(|i| round_value(me, i, round)).collect::<Vec<_>>()).unwrap();
            // SAFETY: ring_put_plain(int *dst, const int *src, int n) reads `n` elements of `src`
            // and writes `n` of the next PE's `dst`, which both hold.
            unsafe {
                plain.launch(grid(64), &stream, |a| {
                    a.buffer_mut(dst)?.buffer(&src)?.value(len)?;
                    Ok(())
                })
            }
            .unwrap();
            // The barrier on the stream completes the device's puts everywhere.
            rt.barrier_all_on_stream(&stream).unwrap();
            assert_eq!(stream.clone_dtoh(&*dst).unwrap(), expected(round), "PE {me}: plain launch, round {round}");
            rt.barrier_all_on_stream(&stream).unwrap();
        };
        plain_round(&mut dst, 1);

        // Lesson 11's kernel with a collective launch of as many blocks as can be resident; it
        // checks what arrived on the device.
        let most = synced.max_collective_blocks(256, 0).unwrap();
        assert!(most >= 1);
        let blocks = most.min(COUNT as u64 / 256) as u32;
        let mine = stream.clone_htod(&(0..COUNT).map(|i| value(me, i)).collect::<Vec<_>>()).unwrap();
        let mut errors = stream.alloc_zeros::<i32>(1).unwrap();
        // SAFETY: ring_put(int *inbox, const int *mine, int n, int *errors) writes `n` elements of
        // the next PE's `inbox`, reads `n` of `mine` and writes one int of `errors`.
        unsafe {
            synced.launch_collective(grid(blocks), &stream, |a| {
                a.buffer_mut(&mut dst)?.buffer(&mine)?.value(len)?.buffer_mut(&mut errors)?;
                Ok(())
            })
        }
        .unwrap();
        assert_eq!(stream.clone_dtoh(&errors).unwrap(), [0], "PE {me}: mismatches seen by the kernel");
        assert_eq!(stream.clone_dtoh(&dst).unwrap(), (0..COUNT).map(|i| value(prev, i)).collect::<Vec<_>>());

        // A grid that cannot be co-resident is refused before launching (on every PE alike).
        let too_many = u32::try_from(most + 1).unwrap();
        // SAFETY: nothing is launched (and the arguments would match).
        match unsafe { synced.launch_collective(grid(too_many), &stream, |_| Ok(())) } {
            Err(Error::GridTooLarge { blocks, per_sm, sms, threads: 256, shared_mem: 0 }) => {
                assert_eq!(blocks, most + 1);
                assert_eq!(u64::from(per_sm) * u64::from(sms), most);
            }
            other => panic!("expected GridTooLarge, got {other:?}"),
        }

        // Modules that must be refused: not device-linked with NVSHMEM, built for other GPUs
        // (a fatbin the driver rejects; a cubin whose header names another architecture).
        assert!(matches!(rt.load_module(PLAIN), Err(Error::NotNvshmemModule)));
        // A module that declares NVSHMEM's two globals at other sizes: NVSHMEM's registration
        // would copy 64 KiB of the first onto its 12-byte value on the host stack, and its device
        // state past the second. Refused before NVSHMEM sees it (audit, session 14).
        match rt.load_module(WRONG_GLOBAL_SIZES.as_bytes()) {
            Err(Error::ModuleGlobalSize { global: "nvshmemi_device_lib_version_d", size: 65536, expected: 12 }) => {}
            other => panic!("expected ModuleGlobalSize, got {other:?}"),
        }
        let device_arch = {
            use cudarc::driver::sys::CUdevice_attribute::*;
            let ctx = stream.context();
            let major = ctx.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).unwrap();
            let minor = ctx.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR).unwrap();
            (major * 10 + minor) as u32
        };
        match rt.load_module(OTHER_ARCH) {
            Err(Error::WrongArchitecture { module: None, device, arch }) => {
                assert_eq!((device, arch), (rt.device(), device_arch))
            }
            other => panic!("expected WrongArchitecture from the driver, got {other:?}"),
        }
        let mut sm80 = RING.to_vec();
        let flags_byte = if sm80[8] >= 8 { 49 } else { 48 };
        sm80[flags_byte] = 80;
        assert_eq!(nvshmem::cubin_arch(&sm80), Some(80));
        match rt.load_module(&sm80) {
            Err(Error::WrongArchitecture { module: Some(80), arch, .. }) => assert_eq!(arch, device_arch),
            other => panic!("expected WrongArchitecture from the header, got {other:?}"),
        }

        // Everything still works: one more plain round.
        rt.barrier_all_on_stream(&stream).unwrap();
        plain_round(&mut dst, 3);

        rt.barrier_all_on_stream(&stream).unwrap();
        dst.free().map_err(|(_, e)| e).unwrap();
        drop(module);
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: NVSHMEM kernels, plain and collective, correct; {most} blocks co-resident at most");
    });
}
