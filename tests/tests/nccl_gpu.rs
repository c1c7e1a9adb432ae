//! The safe `nccl` crate on real GPUs: values received on each rank for every collective, and the
//! exact error for each kind of bad input (after which the communicator still works).

use cudarc::driver::{CudaSlice, CudaStream};
use gpucomm_launch::{Options, Rendezvous};
use gpucomm_tests::{multi_process, require_gpus};
use nccl::{group, Collectives, Comm, Error, ReduceOp};
use std::sync::Arc;

fn upload(streams: &[Arc<CudaStream>], f: impl Fn(usize) -> Vec<f32>) -> Vec<CudaSlice<f32>> {
    streams.iter().enumerate().map(|(r, s)| s.clone_htod(&f(r)).unwrap()).collect()
}

fn download(comms: &[Comm], bufs: &[CudaSlice<f32>]) -> Vec<Vec<f32>> {
    comms.iter().zip(bufs).map(|(c, b)| c.stream().clone_dtoh(b).unwrap()).collect()
}

fn two_comms(test: &str) -> Option<Vec<Comm>> {
    let streams = require_gpus(test, 2)?;
    Some(Comm::init_all(&streams).unwrap())
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn collectives_deliver_the_right_values_on_each_rank() {
    let Some(comms) = two_comms("collectives_deliver_the_right_values_on_each_rank") else { return };
    assert_eq!((comms[0].rank(), comms[1].rank(), comms[0].size()), (0, 1, 2));
    let streams: Vec<_> = comms.iter().map(|c| c.stream().clone()).collect();
    let n = 1000;

    // all-reduce: rank r sends r*10 + i → sum 10 + 2i.
    let sends = upload(&streams, |r| (0..n).map(|i| (r * 10 + i) as f32).collect());
    let mut recvs = upload(&streams, |_| vec![0.0; n]);
    group(|g| {
        for ((c, s), r) in comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            g.with(c).all_reduce(s, r, ReduceOp::SUM)?;
        }
        Ok(())
    })
    .unwrap();
    for out in download(&comms, &recvs) {
        assert_eq!(out, (0..n).map(|i| (10 + 2 * i) as f32).collect::<Vec<_>>());
    }

    // all-gather: rank r contributes [r; n] → [0…0, 1…1].
    let sends = upload(&streams, |r| vec![r as f32; n]);
    let mut gathered = upload(&streams, |_| vec![-1.0; 2 * n]);
    group(|g| {
        for ((c, s), r) in comms.iter().zip(&sends).zip(gathered.iter_mut()) {
            g.with(c).all_gather(s, r)?;
        }
        Ok(())
    })
    .unwrap();
    for out in download(&comms, &gathered) {
        assert!(out[..n].iter().all(|&v| v == 0.0) && out[n..].iter().all(|&v| v == 1.0));
    }

    // reduce-scatter with max: rank r sends i + r over 2n → rank k gets block k of (i + 1).
    let sends = upload(&streams, |r| (0..2 * n).map(|i| (i + r) as f32).collect());
    let mut blocks = upload(&streams, |_| vec![0.0; n]);
    group(|g| {
        for ((c, s), r) in comms.iter().zip(&sends).zip(blocks.iter_mut()) {
            g.with(c).reduce_scatter(s, r, ReduceOp::MAX)?;
        }
        Ok(())
    })
    .unwrap();
    for (k, out) in download(&comms, &blocks).into_iter().enumerate() {
        assert_eq!(out, (0..n).map(|i| (k * n + i + 1) as f32).collect::<Vec<_>>(), "rank {k}");
    }

    // broadcast from rank 1, in place.
    let mut bufs = upload(&streams, |r| vec![(r * 7) as f32; n]);
    group(|g| {
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            g.with(c).broadcast_in_place(b, 1)?;
        }
        Ok(())
    })
    .unwrap();
    for out in download(&comms, &bufs) {
        assert!(out.iter().all(|&v| v == 7.0));
    }

    // send/recv exchange: each rank sends its rank number to the other.
    let sends = upload(&streams, |r| vec![r as f32 + 100.0; n]);
    let mut got = upload(&streams, |_| vec![0.0; n]);
    group(|g| {
        for (r, ((c, s), d)) in comms.iter().zip(&sends).zip(got.iter_mut()).enumerate() {
            g.with(c).send(s, 1 - r)?;
            g.with(c).recv(d, 1 - r)?;
        }
        Ok(())
    })
    .unwrap();
    for (r, out) in download(&comms, &got).into_iter().enumerate() {
        assert!(out.iter().all(|&v| v == (1 - r) as f32 + 100.0), "rank {r}");
    }
    for c in comms {
        c.finalize().map_err(|(_, e)| e).unwrap();
    }
}

/// One process, two GPUs: an in-place sum of `rank + 1` in type `T`, which must give exactly 3.
fn sum_is_three<T: nccl::NcclType + Copy>(comms: &[Comm], from_f32: fn(f32) -> T, to_f32: fn(T) -> f32) {
    let mut bufs: Vec<_> =
        comms.iter().map(|c| c.stream().clone_htod(&vec![from_f32((c.rank() + 1) as f32); 4096]).unwrap()).collect();
    group(|g| {
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            g.with(c).all_reduce_in_place(b, ReduceOp::SUM)?;
        }
        Ok(())
    })
    .unwrap();
    for (c, b) in comms.iter().zip(&bufs) {
        let host = c.stream().clone_dtoh(b).unwrap();
        assert!(host.iter().all(|&v| to_f32(v) == 3.0), "{}: rank {}", std::any::type_name::<T>(), c.rank());
    }
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn reduced_precision_types_all_reduce() {
    let Some(comms) = two_comms("reduced_precision_types_all_reduce") else { return };
    sum_is_three(&comms, half::f16::from_f32, half::f16::to_f32);
    sum_is_three(&comms, half::bf16::from_f32, half::bf16::to_f32);
    sum_is_three(&comms, float8::F8E4M3::from_f32, |v| v.to_f32());
    sum_is_three(&comms, float8::F8E5M2::from_f32, |v| v.to_f32());
    sum_is_three(&comms, |v| v as i8, |v| v as f32);
    sum_is_three(&comms, |v| v as u64, |v| v as f32);
    sum_is_three(&comms, |v| v as f64, |v| v as f32);
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn bad_arguments_are_refused_and_lose_nothing() {
    let Some(comms) = two_comms("bad_arguments_are_refused_and_lose_nothing") else { return };
    let s0 = comms[0].stream().clone();
    let s1 = comms[1].stream().clone();
    let send = s0.clone_htod(&[1.0f32; 8]).unwrap();
    let mut short = s0.clone_htod(&[5.0f32; 4]).unwrap();
    match comms[0].all_reduce(&send, &mut short, ReduceOp::SUM) {
        Err(Error::LengthMismatch { what: "recv buffer", expected: 8, got: 4 }) => {}
        other => panic!("expected LengthMismatch, got {other:?}"),
    }
    assert_eq!(s0.clone_dtoh(&short).unwrap(), [5.0; 4], "a refused call must not touch the buffer");

    let mut gathered = s0.alloc_zeros::<f32>(15).unwrap();
    match comms[0].all_gather(&send, &mut gathered) {
        Err(Error::LengthMismatch { expected: 16, got: 15, .. }) => {}
        other => panic!("expected LengthMismatch, got {other:?}"),
    }
    let mut on_other_device = s1.alloc_zeros::<f32>(8).unwrap();
    match comms[0].all_reduce(&send, &mut on_other_device, ReduceOp::SUM) {
        Err(Error::WrongDevice { what: "recv buffer", expected: 0, got: 1 }) => {}
        other => panic!("expected WrongDevice, got {other:?}"),
    }
    let mut buf = s0.alloc_zeros::<f32>(8).unwrap();
    match comms[0].broadcast_in_place(&mut buf, 2) {
        Err(Error::InvalidRank { what: "root", rank: 2, size: 2 }) => {}
        other => panic!("expected InvalidRank, got {other:?}"),
    }
    // Inside a group, the direct API is refused: it would release its buffers before the launch.
    let inside = group(|_g| comms[0].all_reduce_in_place(&mut buf, ReduceOp::SUM));
    assert!(matches!(inside, Err(Error::InsideGroup)), "{inside:?}");
    assert!(matches!(group(|_| group(|_| Ok(()))), Err(Error::InsideGroup)));

    // Nothing was lost: both communicators still work.
    let mut bufs = vec![s0.clone_htod(&[2.0f32; 8]).unwrap(), s1.clone_htod(&[3.0f32; 8]).unwrap()];
    group(|g| {
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            g.with(c).all_reduce_in_place(b, ReduceOp::PROD)?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(download(&comms, &bufs), [[6.0; 8], [6.0; 8]]);
    for c in &comms {
        c.async_error().unwrap();
    }
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
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
    // A one-rank communicator works, and finalize inside a group hands it back.
    let comm = Comm::init_rank(streams[0].clone(), &nccl::UniqueId::new().unwrap(), 0, 1).unwrap();
    let comm = match group(|_| Ok(comm.finalize())).unwrap() {
        Err((comm, Error::InsideGroup)) => comm,
        other => panic!("expected the communicator back with InsideGroup, got {:?}", other.err()),
    };
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
