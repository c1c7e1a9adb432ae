//! The `nvshmem` runtime on real GPUs, one process per GPU: identity, what the library reports,
//! the NCCL that NVSHMEM uses (the same as `nccl-sys`'s), the predefined teams, a second runtime
//! refused, allocations refused before NVSHMEM sees them, local registration — and the process
//! keeps working after every refusal.

mod nvshmem_support;

use std::path::Path;

use gpucomm_tests::multi_process;
use nvshmem::{Bootstrap, Error, InitStatus, NcclUse, Runtime, UniqueId};
use nvshmem_support::{pes, ring_still_works as still_works, start};

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn identity_info_and_the_nccl_nvshmem_uses() {
    multi_process("identity_info_and_the_nccl_nvshmem_uses", pes(), |info, stream| {
        assert_eq!(nvshmem::init_status().unwrap(), InitStatus::NOT_INITIALIZED);
        let (_rdzv, rt) = start(&info, &stream);
        let (me, n) = (rt.my_pe(), rt.n_pes());
        assert_eq!(rt.init_status().unwrap(), InitStatus::IS_INITIALIZED);
        let about = rt.info();
        assert_eq!(about.version, nvshmem::version().unwrap());
        let v = about.version;
        assert_eq!(about.name, format!("NVSHMEM v{}.{}.{}", v.major, v.minor, v.patch));
        assert_eq!(about.spec_version, (1, 3));
        assert!(about.heap.dynamic, "x86 defaults to the CUDA-VMM heap");

        // NVSHMEM's collectives use the very NCCL that nccl-sys loads: one NCCL in the process.
        let nccl = nccl_sys::library().unwrap();
        match &about.nccl {
            NcclUse::Loaded { path, version } => {
                assert_eq!(*version, nccl.version(), "NVSHMEM got NCCL {version}, nccl-sys {}", nccl.version());
                let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
                assert_eq!(
                    canonical(path),
                    canonical(nccl.path()),
                    "NVSHMEM: {}, nccl-sys: {}",
                    path.display(),
                    nccl.path().display()
                );
            }
            other => panic!("PE {me}: NVSHMEM should use NCCL, got {other:?}"),
        }

        // The predefined teams: all PEs of this single machine.
        let world = rt.world().unwrap();
        assert_eq!((world.my_pe(), world.n_pes()), (me, n));
        let node = rt.node().unwrap();
        assert_eq!((node.my_pe(), node.n_pes()), (me, n));
        let shared = rt.shared().unwrap();
        assert!(shared.my_pe() < shared.n_pes() && shared.n_pes() <= n, "{shared:?}");
        println!(
            "PE {me}: {} ({:?}), NCCL {}, shared team of {}",
            about.name,
            about.spec_version,
            about.nccl,
            shared.n_pes()
        );
        drop((world, node, shared));
        // An id that is never used: NVSHMEM is not reached.
        let mut bytes = nvshmem::sys::nvshmemx_uniqueid_t::initializer().version.to_ne_bytes().to_vec();
        bytes.resize(UniqueId::BYTES, 0);
        let id = UniqueId::from_bytes(&bytes).unwrap();
        rt.finalize().map_err(|(_, e)| e).unwrap();
        // A finalised process cannot start NVSHMEM again.
        assert!(matches!(Runtime::init(stream.clone(), &id, 0, 1), Err(Error::Finalized)));
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn bad_input_is_refused_and_the_process_keeps_working() {
    multi_process("bad_input_is_refused_and_the_process_keeps_working", pes(), |info, stream| {
        let (mut rdzv, rt) = start(&info, &stream);
        let me = rt.my_pe();

        // A second runtime: refused before the rendezvous, and without disturbing the first.
        assert!(matches!(Runtime::from_rendezvous(stream.clone(), &mut rdzv), Err(Error::AlreadyInitialized)));
        assert!(matches!(
            Runtime::with_bootstrap(stream.clone(), Bootstrap::Environment),
            Err(Error::AlreadyInitialized)
        ));
        still_works(&rt, &stream, "after a second runtime");

        // Allocations NVSHMEM must not see: zero bytes, overflowing sizes, bad alignments, more
        // than the heap's limit.
        assert!(matches!(rt.alloc::<u64>(0), Err(Error::ZeroSize { len: 0, elem_size: 8 })));
        assert!(matches!(rt.alloc::<u64>(usize::MAX), Err(Error::SizeOverflow { .. })));
        assert!(matches!(rt.alloc_aligned::<u32>(16, 3), Err(Error::InvalidAlignment { align: 3, min: 4 })));
        assert!(matches!(rt.alloc_aligned::<u64>(16, 4), Err(Error::InvalidAlignment { align: 4, min: 8 })));
        let heap = rt.info().heap;
        let limit = heap.limit;
        match rt.alloc::<u8>(limit + 1) {
            Err(Error::HeapExhausted { bytes, in_use: 0, reserved, limit: l, .. }) => {
                assert_eq!((bytes, reserved, l), ((limit + 1).next_multiple_of(heap.granularity), heap.reserved, limit))
            }
            other => panic!("PE {me}: expected HeapExhausted, got {other:?}"),
        }
        if heap.dynamic {
            assert!(heap.granularity >= 2 << 20 && heap.granularity.is_power_of_two(), "{heap:?}");
            assert!(heap.reserved > 0 && heap.reserved % heap.granularity == 0, "NVSHMEM's own buffers: {heap:?}");
            // All the limit leaves after NVSHMEM's own buffers: NVSHMEM would fail at `mapped +
            // step >= size` and tear the heap down, so the crate refuses it.
            match rt.alloc::<u8>(limit - heap.reserved) {
                Err(Error::HeapExhausted { bytes, .. }) => {
                    assert_eq!(bytes, (limit - heap.reserved).next_multiple_of(heap.granularity))
                }
                other => panic!("PE {me}: expected HeapExhausted for the whole rest of the heap, got {other:?}"),
            }
        }
        still_works(&rt, &stream, "after refused allocations");

        // Aligned and zeroed allocations work.
        let aligned = rt.alloc_aligned::<f32>(1000, 1 << 16).unwrap();
        assert_eq!(aligned.device_address() % (1 << 16), 0);
        let zeroed = rt.alloc_zeroed::<u64>(4096).unwrap();
        assert!(stream.clone_dtoh(&zeroed).unwrap().iter().all(|&v| v == 0));
        zeroed.free().map_err(|(_, e)| e).unwrap();
        aligned.free().map_err(|(_, e)| e).unwrap();

        // Registration of local memory: refused when empty or on another GPU, else registered.
        let mut local = stream.alloc_zeros::<u8>(1 << 20).unwrap();
        // A refusal hands the buffer back, contents intact.
        let registered = rt.register(local).map_err(|(_, e)| e).unwrap();
        assert_eq!(registered.num_bytes(), 1 << 20);
        local = registered.unregister().map_err(|(_, e)| e).unwrap();
        drop(local);
        // Only owned buffers register (a borrowed view could be freed under a leaked registration).
        let (empty, e) = rt.register(stream.null::<u8>().unwrap()).expect_err("an empty registration");
        assert!(matches!(e, Error::ZeroSize { len: 0, .. }), "{e}");
        assert_eq!(empty.len(), 0);
        let other_device = (rt.device() + 1) % gpucomm_tests::device_count();
        if other_device != rt.device() {
            let elsewhere = cudarc::driver::CudaContext::new(other_device).unwrap().default_stream();
            let foreign = elsewhere.clone_htod(&[7u8; 64]).unwrap();
            let (foreign, e) = rt.register(foreign).expect_err("a registration of another GPU's buffer");
            assert!(matches!(e, Error::WrongDevice { what: "buffer", .. }), "{e}");
            assert_eq!(elsewhere.clone_dtoh(&foreign).unwrap(), vec![7u8; 64], "the refused buffer");
        }
        still_works(&rt, &stream, "after registration");
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: every bad input refused, runtime kept working");
    });
}
