//! The safe `nvshmem` crate on real GPUs, two processes: symmetric allocation, puts and gets to
//! the peer with values checked, and the exact error for each kind of bad input.

use gpucomm_launch::{Options, Rendezvous};
use gpucomm_tests::multi_process;
use nvshmem::{Error, Runtime};

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn two_pes_put_get_and_refuse_bad_input() {
    multi_process("two_pes_put_get_and_refuse_bad_input", 2, |info, stream| {
        let mut rdzv = Rendezvous::connect(&info, &Options::from_env().unwrap()).unwrap();
        let rt = Runtime::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        let (me, n) = (rt.my_pe(), rt.n_pes());
        assert_eq!((me, n), (info.rank, 2));
        let peer = (me + 1) % n;

        let again = Runtime::from_rendezvous(stream.clone(), &mut rdzv);
        assert!(matches!(again, Err(Error::Runtime(m)) if m.contains("already initialised")), "{again:?}");

        let buf = rt.alloc::<u32>(1024).unwrap();
        assert!(buf.peer_address(peer).unwrap().is_some(), "NVLink peers are load/store reachable");
        let src = stream.clone_htod(&(0..512).map(|i| (me as u32) << 16 | i).collect::<Vec<_>>()).unwrap();
        // Write our 512 values into the upper half of the peer's buffer.
        buf.put_on_stream(512, &src, peer, &stream).unwrap();
        match buf.put_on_stream(513, &src, peer, &stream) {
            Err(Error::OutOfBounds { what: "put", got: 1025, available: 1024 }) => {}
            other => panic!("expected OutOfBounds, got {other:?}"),
        }
        match buf.put_on_stream(0, &src, 2, &stream) {
            Err(Error::InvalidPe { pe: 2, n_pes: 2, .. }) => {}
            other => panic!("expected InvalidPe, got {other:?}"),
        }
        rt.barrier_all_on_stream(&stream).unwrap();
        let local = stream.clone_dtoh(&buf).unwrap();
        let from = peer as u32; // with two PEs the sender is the peer
        assert!(local[512..].iter().enumerate().all(|(i, &v)| v == from << 16 | i as u32), "PE {me}: wrong put data");

        // Get the peer's upper half back: it holds what we put there.
        let mut back = stream.alloc_zeros::<u32>(512).unwrap();
        buf.get_on_stream(512, &mut back, peer, &stream).unwrap();
        rt.barrier_all_on_stream(&stream).unwrap();
        assert_eq!(stream.clone_dtoh(&back).unwrap(), stream.clone_dtoh(&src).unwrap());

        buf.free().unwrap();
        rt.finalize().unwrap();
        println!("PE {me}: put/get with PE {peer} correct");
    });
}
