//! `nvshmem` teams and collectives on real GPUs, one process per GPU: strided and 2-D splits,
//! PE numbers and their translation, every reduction operation on an element type NVSHMEM defines
//! it on, broadcast from the last PE, fcollect, alltoall, barriers and syncs over teams. Values
//! are checked on every PE; bad input is refused and the PE carries on.

mod nvshmem_support;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, ValidAsZeroBits};
use gpucomm_tests::multi_process;
use nvshmem::ops::{And, Max, Min, Or, Prod, ReduceOp, Sum, Xor};
use nvshmem::{Element, Error, Runtime, Team};
use nvshmem_support::{pes, ring_still_works, start};

const LEN: usize = 4096;

/// Every member contributes `mine` in every element; every member must get `expected`.
/// Allocation is collective over the world, so every PE calls this in the same order.
fn reduce_check<T, Op>(rt: &Runtime, team: &Team<'_>, op: Op, mine: T, expected: T, stream: &Arc<CudaStream>)
where
    T: Element + ValidAsZeroBits + Copy + PartialEq + Debug,
    Op: ReduceOp<T> + Debug,
{
    let mut src = rt.alloc::<T>(LEN).unwrap();
    let mut dst = rt.alloc::<T>(LEN).unwrap();
    stream.memcpy_htod(&vec![mine; LEN], &mut src).unwrap();
    team.reduce_on_stream(op, &mut dst, &src, stream).unwrap();
    let got = stream.clone_dtoh(&dst).unwrap();
    assert!(got.iter().all(|&v| v == expected), "PE {}: {op:?} gave {:?}, expected {expected:?}", rt.my_pe(), got[0]);
    rt.barrier_all_on_stream(stream).unwrap();
    dst.free().map_err(|(_, e)| e).unwrap();
    src.free().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn teams_split_translate_and_synchronise() {
    multi_process("teams_split_translate_and_synchronise", pes(), |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let world = rt.world().unwrap();

        // The even PEs.
        let evens = world.split_strided(0, 2, n.div_ceil(2)).unwrap();
        assert_eq!(evens.is_some(), me % 2 == 0, "PE {me}");
        if let Some(t) = &evens {
            assert_eq!((t.my_pe(), t.n_pes()), (me / 2, n.div_ceil(2)));
            for k in 0..t.n_pes() {
                assert_eq!(t.translate_pe(k, &world).unwrap(), Some(2 * k));
            }
            assert_eq!(world.translate_pe(1, t).unwrap(), None, "PE 1 is odd");
            assert!(matches!(t.translate_pe(t.n_pes(), &world), Err(Error::InvalidPe { .. })));
            t.barrier_on_stream(&stream).unwrap();
            t.sync_on_stream(&stream).unwrap();
        }
        // Rows of 2 and columns: every PE is in one of each.
        let (row, column) = world.split_2d(2).unwrap();
        assert_eq!((row.my_pe(), row.n_pes()), (me % 2, 2.min(n - me / 2 * 2)), "PE {me}: row");
        assert_eq!((column.my_pe(), column.n_pes()), (me / 2, (n - me % 2).div_ceil(2)), "PE {me}: column");
        row.barrier_on_stream(&stream).unwrap();
        column.sync_on_stream(&stream).unwrap();

        // Splits that do not fit the parent are refused on every PE, before NVSHMEM.
        for (start, stride, size) in [(0, 0, 1), (n, 1, 1), (0, 1, n + 1), (1, 2, n), (0, 1, 0)] {
            match world.split_strided(start, stride, size) {
                Err(Error::InvalidSplit { n_pes, .. }) => assert_eq!(n_pes, n),
                other => panic!("<{start}, {stride}, {size}>: expected InvalidSplit, got {other:?}"),
            }
        }
        assert!(matches!(world.split_2d(0), Err(Error::ZeroXRange)));
        world.barrier_on_stream(&stream).unwrap();

        column.destroy().map_err(|(_, e)| e).unwrap();
        row.destroy().map_err(|(_, e)| e).unwrap();
        evens.map(|t| t.destroy()).transpose().map_err(|(_, e)| e).unwrap();
        // The same splits again, after destroying: teams are released.
        let again = world.split_strided(0, 1, n).unwrap().expect("every PE");
        assert_eq!((again.my_pe(), again.n_pes()), (me, n));
        drop(again);
        drop(world);
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: strided and 2-D splits, translation, barriers and syncs correct");
    });
}

/// Audit: split arguments were not compared across the parent team, and NVSHMEM computes each
/// member's new team from its own. Before: PE 0 splitting `<0, 1, 2>` while PE 1 split `<1, 1, 1>`
/// left PE 0 waiting for ever in NVSHMEM's reduction over a team PE 1 was not making (and other
/// mismatches gave members teams that share NVSHMEM's per-team state). Now the members compare
/// their splits first: both get `Error::AsymmetricSplit` within seconds and no team is made; a
/// member with invalid arguments gets its own error; then the same split works. Exactly two PEs.
#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn members_making_different_splits_are_refused() {
    multi_process("members_making_different_splits_are_refused", 2, |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let me = rt.my_pe();
        let world = rt.world().unwrap();
        let asymmetric = |what: &str, split: Result<(), Error>| match split {
            Err(Error::AsymmetricSplit { pe: 1 }) => {}
            other => panic!("PE {me}: {what}: expected AsymmetricSplit naming member 1, got {other:?}"),
        };

        let began = Instant::now();
        let split = if me == 0 { world.split_strided(0, 1, 2) } else { world.split_strided(1, 1, 1) };
        let took = began.elapsed();
        asymmetric("<0, 1, 2> against <1, 1, 1>", split.map(drop));
        assert!(took < Duration::from_secs(10), "PE {me}: the refusal took {took:?}");
        asymmetric("2-D splits with x ranges 1 and 2", world.split_2d(me + 1).map(drop));
        let split = if me == 0 { world.split_strided(0, 1, 2).map(drop) } else { world.split_2d(2).map(drop) };
        asymmetric("a strided split against a 2-D one", split);
        // Invalid arguments on PE 1 only: its own error there, the mismatch on PE 0.
        match (me, world.split_strided(if me == 0 { 0 } else { 5 }, 1, 1)) {
            (0, Err(Error::AsymmetricSplit { pe: 1 })) | (1, Err(Error::InvalidSplit { start: 5, .. })) => {}
            (_, other) => panic!("PE {me}: an invalid split on PE 1: {other:?}"),
        }

        // The same split on both members works, and so does the team it makes.
        let both = world.split_strided(0, 1, 2).unwrap().expect("both PEs are members");
        assert_eq!((both.my_pe(), both.n_pes()), (me, 2));
        both.barrier_on_stream(&stream).unwrap();
        both.destroy().map_err(|(_, e)| e).unwrap();
        ring_still_works(&rt, &stream, "after the refused splits");
        drop(world);
        rt.finalize().map_err(|(_, e)| e).unwrap();
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn collectives_over_teams() {
    multi_process("collectives_over_teams", pes(), |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let world = rt.world().unwrap();
        let pes: Vec<usize> = (0..n).collect();

        // Every operation, on a type NVSHMEM defines it on.
        reduce_check(&rt, &world, Sum, (me + 1) as f32, (n * (n + 1) / 2) as f32, &stream);
        reduce_check(&rt, &world, Prod, (me + 1) as i64, pes.iter().map(|&p| p as i64 + 1).product(), &stream);
        reduce_check(&rt, &world, Min, 100 - me as u32, 100 - (n as u32 - 1), &stream);
        reduce_check(&rt, &world, Max, me as i32 * 3 - 5, (n as i32 - 1) * 3 - 5, &stream);
        reduce_check(&rt, &world, And, !(1u64 << me), !pes.iter().fold(0u64, |m, &p| m | 1 << p), &stream);
        reduce_check(&rt, &world, Or, 1u16 << me, pes.iter().fold(0u16, |m, &p| m | 1 << p), &stream);
        reduce_check(&rt, &world, Xor, me as i8 + 1, pes.iter().fold(0i8, |x, &p| x ^ (p as i8 + 1)), &stream);
        reduce_check(&rt, &world, Sum, me as u8, pes.iter().map(|&p| p as u8).sum(), &stream);
        // Over a sub-team: rows of 2 (every PE is in one).
        let (row, column) = world.split_2d(2).unwrap();
        drop(column);
        let partner_sum: f64 = (me / 2 * 2..(me / 2 * 2 + 2).min(n)).map(|p| p as f64 * 0.5).sum();
        reduce_check(&rt, &row, Sum, me as f64 * 0.5, partner_sum, &stream);

        // In place.
        let mut buf = rt.alloc::<u32>(LEN).unwrap();
        stream.memcpy_htod(&vec![me as u32 + 10; LEN], &mut buf).unwrap();
        world.reduce_in_place_on_stream(Max, &mut buf, &stream).unwrap();
        assert!(stream.clone_dtoh(&buf).unwrap().iter().all(|&v| v == n as u32 + 9));

        // Broadcast from the last PE, into every PE's destination (its own included).
        let root = n - 1;
        let mut src = rt.alloc::<i32>(LEN).unwrap();
        let mut dst = rt.alloc::<i32>(n * LEN).unwrap();
        stream.memcpy_htod(&(0..LEN).map(|i| (me * LEN + i) as i32).collect::<Vec<_>>(), &mut src).unwrap();
        world.broadcast_on_stream(&mut dst.slice(..LEN).unwrap(), &src, root, &stream).unwrap();
        let got = stream.clone_dtoh(&dst.slice(..LEN).unwrap()).unwrap();
        assert_eq!(
            got,
            (0..LEN).map(|i| (root * LEN + i) as i32).collect::<Vec<_>>(),
            "PE {me}: broadcast from {root}"
        );

        // fcollect: block q of the result is PE q's source.
        world.fcollect_on_stream(&mut dst, &src, &stream).unwrap();
        assert_eq!(
            stream.clone_dtoh(&dst).unwrap(),
            (0..n * LEN).map(|i| i as i32).collect::<Vec<_>>(),
            "PE {me}: fcollect"
        );

        // alltoall: block j of PE i's source lands in block i of PE j's destination.
        let block = LEN / 2;
        let mut a2a_src = rt.alloc::<i32>(n * block).unwrap();
        let mut a2a_dst = rt.alloc::<i32>(n * block).unwrap();
        let mine: Vec<i32> = (0..n * block).map(|k| (me * 1000 + k / block) as i32).collect();
        stream.memcpy_htod(&mine, &mut a2a_src).unwrap();
        world.alltoall_on_stream(&mut a2a_dst, &a2a_src, &stream).unwrap();
        let expected: Vec<i32> = (0..n * block).map(|k| ((k / block) * 1000 + me) as i32).collect();
        assert_eq!(stream.clone_dtoh(&a2a_dst).unwrap(), expected, "PE {me}: alltoall");

        // Refused before NVSHMEM.
        assert!(matches!(
            world.broadcast_on_stream(&mut dst.slice(..LEN).unwrap(), &src, n, &stream),
            Err(Error::InvalidPe { what: "root", .. })
        ));
        match world.fcollect_on_stream(&mut dst.slice(..LEN).unwrap(), &src, &stream) {
            Err(Error::LengthMismatch { what: "destination", expected, got }) => {
                assert_eq!((expected, got), (n * LEN, LEN))
            }
            other => panic!("expected LengthMismatch, got {other:?}"),
        }
        let uneven = a2a_src.slice(..n * block - 1).unwrap();
        match world.alltoall_on_stream(&mut a2a_dst.slice(..n * block - 1).unwrap(), &uneven, &stream) {
            Err(Error::NotDivisible { what: "source", len, parts }) => assert_eq!((len, parts), (n * block - 1, n)),
            other => panic!("expected NotDivisible, got {other:?}"),
        }
        match world.reduce_on_stream(Sum, &mut dst, &src, &stream) {
            Err(Error::LengthMismatch { what: "destination", expected, got }) => {
                assert_eq!((expected, got), (LEN, n * LEN))
            }
            other => panic!("expected LengthMismatch, got {other:?}"),
        }
        // …and the team still works.
        reduce_check(&rt, &world, Sum, 1i32, n as i32, &stream);

        rt.barrier_all_on_stream(&stream).unwrap();
        a2a_dst.free().map_err(|(_, e)| e).unwrap();
        a2a_src.free().map_err(|(_, e)| e).unwrap();
        dst.free().map_err(|(_, e)| e).unwrap();
        src.free().map_err(|(_, e)| e).unwrap();
        buf.free().map_err(|(_, e)| e).unwrap();
        row.destroy().map_err(|(_, e)| e).unwrap();
        drop(world);
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: reductions, broadcast, fcollect and alltoall over {n} PEs correct");
    });
}

#[test]
#[ignore = "needs 3 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn in_place_reductions_over_three_pes_count_each_value_once() {
    // NVSHMEM's segmented reduction (over a team that is not the world team, or a message too
    // large for its other algorithms) sends a PE's source to one peer per round and reduces into
    // the destination between rounds. With the source as destination, a later round sent a
    // partly reduced value: over three PEs a sum of ones gave 4 and a xor lost the PE's own bit.
    // In-place sums, products and xors are now reduced in pieces that one round sends to every
    // peer.
    multi_process("in_place_reductions_over_three_pes_count_each_value_once", 3, |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let me = rt.my_pe();
        let world = rt.world().unwrap();
        // 128 KiB of u16s (no NCCL path for 16-bit integers): four of NVSHMEM's 32 KiB segments.
        let len = 1 << 16;
        let mut ones = rt.alloc::<u16>(len).unwrap();
        stream.memcpy_htod(&vec![1u16; len], &mut ones).unwrap();
        world.reduce_in_place_on_stream(Sum, &mut ones, &stream).unwrap();
        let got = stream.clone_dtoh(&ones).unwrap();
        assert!(got.iter().all(|&v| v == 3), "PE {me}: an in-place sum of ones gave {:?}", &got[..4]);
        // The same range as reduce_on_stream's source and destination (xor has no NCCL path).
        let bits = rt.alloc::<i32>(len).unwrap();
        stream.memcpy_htod(&vec![1i32 << me; len], &mut bits.as_slice()).unwrap();
        world.reduce_on_stream(Xor, &mut bits.slice(..).unwrap(), &bits.slice(..).unwrap(), &stream).unwrap();
        let got = stream.clone_dtoh(&bits).unwrap();
        assert!(got.iter().all(|&v| v == 0b111), "PE {me}: an in-place xor gave {:#b}", got[0]);
        // An odd length: the last piece is shorter.
        let odd = 3 * 4096 + 5;
        let mut prods = rt.alloc::<i64>(odd).unwrap();
        stream.memcpy_htod(&vec![me as i64 + 2; odd], &mut prods).unwrap();
        world.reduce_in_place_on_stream(Prod, &mut prods, &stream).unwrap();
        let got = stream.clone_dtoh(&prods).unwrap();
        assert!(got.iter().all(|&v| v == 2 * 3 * 4), "PE {me}: an in-place product gave {:?}", &got[odd - 4..]);

        rt.barrier_all_on_stream(&stream).unwrap();
        prods.free().map_err(|(_, e)| e).unwrap();
        bits.free().map_err(|(_, e)| e).unwrap();
        ones.free().map_err(|(_, e)| e).unwrap();
        drop(world);
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: in-place sum, xor and product over 3 PEs count each value once");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn a_2d_split_past_the_team_limit_fails_on_every_member() {
    // NVSHMEM's 2-D split logs a failed inner split and reports success: past NVSHMEM_MAX_TEAMS
    // (128 by default) the PEs left without a row or a column got `None` and the others their
    // teams. Now every member gets SplitIncomplete at the same split and keeps no team of it.
    multi_process("a_2d_split_past_the_team_limit_fails_on_every_member", pes(), |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let me = rt.my_pe();
        let world = rt.world().unwrap();
        let mut kept = Vec::new();
        let err = loop {
            match world.split_2d(1) {
                Ok(teams) => kept.push(teams),
                Err(e) => break e,
            }
            assert!(kept.len() < 200, "PE {me}: no split failed with NVSHMEM_MAX_TEAMS at its default of 128");
        };
        assert!(matches!(err, Error::SplitIncomplete { .. }), "PE {me}: expected SplitIncomplete, got {err}");
        // Every member failed at the same split: the teams they kept pair up.
        let mut count = rt.alloc::<u32>(1).unwrap();
        stream.memcpy_htod(&[kept.len() as u32], &mut count).unwrap();
        let mut most = rt.alloc::<u32>(1).unwrap();
        world.reduce_on_stream(Max, &mut most, &count, &stream).unwrap();
        world.reduce_in_place_on_stream(Min, &mut count, &stream).unwrap();
        let (least, most_got) = (stream.clone_dtoh(&count).unwrap()[0], stream.clone_dtoh(&most).unwrap()[0]);
        assert_eq!((least, most_got), (kept.len() as u32, kept.len() as u32), "PE {me}");
        // The kept teams work and are destroyed in the same order on every PE; then a split works.
        let (row, column) = kept.last().unwrap();
        row.barrier_on_stream(&stream).unwrap();
        column.sync_on_stream(&stream).unwrap();
        stream.synchronize().unwrap();
        for (row, column) in kept.into_iter().rev() {
            row.destroy().map_err(|(_, e)| e).unwrap();
            column.destroy().map_err(|(_, e)| e).unwrap();
        }
        let (row, column) = world.split_2d(1).unwrap();
        assert_eq!((row.n_pes(), column.n_pes()), (1, rt.n_pes()), "PE {me}");
        row.destroy().map_err(|(_, e)| e).unwrap();
        column.destroy().map_err(|(_, e)| e).unwrap();
        most.free().map_err(|(_, e)| e).unwrap();
        count.free().map_err(|(_, e)| e).unwrap();
        drop(world);
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: a 2-D split past the team limit failed on every PE at split {least}");
    });
}
