//! Smoke test of the raw NVSHMEM bindings on real GPUs: two processes, unique-id bootstrap through
//! `nvshmemx_hostlib_init_attr`, `nvshmem_malloc`, `nvshmemx_putmem_on_stream` to the peer, an
//! on-stream barrier, the received values checked, `nvshmem_free`, finalize. Only `nvshmem-sys`
//! calls for NVSHMEM (the id travels through the crate family's rendezvous; memory through cudarc).

use std::ffi::c_void;

use cudarc::driver::DevicePtr;
use gpucomm_launch::{Options, Rendezvous};
use gpucomm_tests::multi_process;
use nvshmem_sys::{function, nvshmemx_init_attr_t, nvshmemx_uniqueid_t, NVSHMEMX_INIT_WITH_UNIQUEID};

const COUNT: usize = 1 << 16;

fn value(sender: usize, i: usize) -> i32 {
    (sender as i32 + 1) * 1_000_000 + i as i32
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn raw_two_process_put_and_barrier() {
    multi_process("raw_two_process_put_and_barrier", 2, |info, stream| {
        let lib = nvshmem_sys::library().unwrap();
        let (rank, n) = (info.rank, info.world_size);
        let mut rdzv = Rendezvous::connect(&info, &Options::from_env().unwrap()).unwrap();
        // PE 0 creates the id; the rendezvous hands its bytes to PE 1.
        let bytes = rdzv
            .broadcast(|| {
                let mut id = nvshmemx_uniqueid_t::initializer();
                // SAFETY: fills an initialised id.
                let rc = unsafe { function!(lib, nvshmemx_get_uniqueid).unwrap()(&mut id) };
                assert_eq!(rc, 0);
                // SAFETY: the id is plain bytes (a C struct of ints and chars, no padding).
                let raw = unsafe { std::slice::from_raw_parts(&id as *const _ as *const u8, size_of_val(&id)) };
                Ok(raw.to_vec())
            })
            .unwrap();
        let mut id = nvshmemx_uniqueid_t::initializer();
        assert_eq!(bytes.len(), size_of_val(&id));
        // SAFETY: copies exactly size_of(id) bytes produced from the same type on PE 0.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), &mut id as *mut _ as *mut u8, bytes.len()) };

        stream.context().bind_to_thread().unwrap();
        let mut attr = nvshmemx_init_attr_t::initializer();
        // SAFETY: valid id and attributes; `id` outlives init.
        unsafe {
            assert_eq!(
                function!(lib, nvshmemx_set_attr_uniqueid_args).unwrap()(rank as i32, n as i32, &id, &mut attr),
                0
            );
            assert_eq!(
                function!(lib, nvshmemx_hostlib_init_attr).unwrap()(NVSHMEMX_INIT_WITH_UNIQUEID as u32, &mut attr),
                0
            );
            assert_eq!(function!(lib, nvshmem_my_pe).unwrap()() as usize, rank);
            assert_eq!(function!(lib, nvshmem_n_pes).unwrap()() as usize, n);
        }

        let bytes = COUNT * size_of::<i32>();
        // SAFETY: NVSHMEM is initialised; collective allocation of the same size on both PEs.
        let dest = unsafe { function!(lib, nvshmem_malloc).unwrap()(bytes) };
        assert!(!dest.is_null());
        let src = stream.clone_htod(&(0..COUNT).map(|i| value(rank, i)).collect::<Vec<_>>()).unwrap();
        let peer = (rank + 1) % n;
        let cu = stream.cu_stream() as nvshmem_sys::cudaStream_t;
        {
            let (src_ptr, _g) = src.device_ptr(&stream);
            // SAFETY: `dest` is a symmetric buffer of `bytes` bytes, `src` holds as many on this
            // device; `peer` is a valid PE; the stream is on this PE's device.
            unsafe {
                function!(lib, nvshmemx_putmem_on_stream).unwrap()(
                    dest,
                    src_ptr as *const c_void,
                    bytes,
                    peer as i32,
                    cu,
                );
                function!(lib, nvshmemx_barrier_all_on_stream).unwrap()(cu);
            }
        }
        stream.synchronize().unwrap();
        let mut host = vec![0i32; COUNT];
        // SAFETY: `dest` holds COUNT ints of device memory on this device, written by the put that
        // the synchronised barrier completed.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, dest as u64) }.unwrap();
        let sender = (rank + n - 1) % n;
        assert!(host.iter().enumerate().all(|(i, &v)| v == value(sender, i)), "PE {rank}: wrong data from PE {sender}");
        println!("PE {rank}: {COUNT} ints from PE {sender} correct");
        // SAFETY: collective free of the buffer from nvshmem_malloc; no work uses it any more.
        unsafe { function!(lib, nvshmem_free).unwrap()(dest) };
        // SAFETY: finalizes the NVSHMEM this process initialised.
        unsafe { function!(lib, nvshmemx_hostlib_finalize).unwrap()() };
    });
}
