//! The safe `nccl` crate on real GPUs: creating communicators (arguments checked, groups refused)
//! and a first all-reduce through the rendezvous. The collectives themselves are checked in
//! `nccl_collectives.rs`.

use gpucomm_launch::{Options, Rendezvous};
use gpucomm_tests::{multi_process, require_gpus};
use nccl::{group, Collectives, Comm, Error, ReduceOp};

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn init_rank_checks_its_arguments() {
    let Some(streams) = require_gpus("init_rank_checks_its_arguments", 1) else { return };
    let id = nccl::UniqueId::new().unwrap();
    let err = Comm::init_rank(streams[0].clone(), &id, 3, 2).unwrap_err();
    assert_eq!(err.to_string(), "rank 3 is out of range for 2 ranks");
    let err = Comm::init_rank(streams[0].clone(), &id, 0, 0).unwrap_err();
    assert!(err.to_string().contains("nranks must be between 1 and"), "{err}");
    let twice = Comm::init_all(&[streams[0].clone(), streams[0].clone()]).unwrap_err();
    assert!(twice.to_string().contains("two streams are on CUDA device 0"), "{twice}");
    // Creation inside a group would only be recorded until the group ends.
    let inside = group(|_| Comm::init_rank(streams[0].clone(), &id, 0, 1).map(drop));
    assert!(matches!(inside, Err(Error::InsideGroup)), "{inside:?}");
    // A one-rank communicator works, and finalize inside a group hands it back: refused with
    // InsideGroup, the communicator in the error, which the closure's value carries out. The
    // refusal does not stop the group (counted, it made the group fail with GroupRefused and drop
    // that value, communicator included), so the group returns the value.
    let comm = Comm::init_rank(streams[0].clone(), &nccl::UniqueId::new().unwrap(), 0, 1).unwrap();
    let comm = match group(|_| Ok(comm.finalize())) {
        Ok(Err((comm, Error::InsideGroup))) => comm,
        Ok(Ok(())) => panic!("finalize ran inside a group"),
        Ok(Err((_, e))) => panic!("expected InsideGroup, got {e}"),
        Err(e) => panic!("the group failed ({e}) and dropped the communicator"),
    };
    // Handed back intact: it still reduces, then finalizes.
    let mut buf = streams[0].clone_htod(&[2.0f32; 8]).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    assert_eq!(streams[0].clone_dtoh(&buf).unwrap(), [2.0f32; 8]);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn two_processes_all_reduce_through_the_rendezvous() {
    multi_process("two_processes_all_reduce_through_the_rendezvous", 2, |info, stream| {
        let mut rdzv = Rendezvous::connect(&info, &Options::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        assert_eq!((comm.rank(), comm.size()), (info.rank, 2));
        let mut buf = stream.clone_htod(&vec![(info.rank + 1) as i64; 4096]).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
        assert!(stream.clone_dtoh(&buf).unwrap().iter().all(|&v| v == 3));
        comm.finalize().map_err(|(_, e)| e).unwrap();
        println!("rank {}: all-reduce of 4096 i64 correct", info.rank);
    });
}
