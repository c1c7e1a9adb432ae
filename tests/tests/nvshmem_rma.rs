//! One-sided `nvshmem` operations on real GPUs, one process per GPU: puts and gets (blocking and
//! `_nbi`) on sub-ranges, puts with signals and signal waits, peer views read by a cudarc kernel,
//! ordering across streams with no synchronisation in the test (a cudarc kernel, an NCCL
//! all-reduce and a put on three streams, 100 times), and a put + barrier captured into a CUDA
//! graph and replayed. Values are checked on every PE; bad input is refused and the PE carries on.

mod nvshmem_support;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};
use gpucomm_tests::multi_process;
use nvshmem::{Cmp, Error, SignalOp};
use nvshmem_support::{grid, pes, plain_kernel, start, value};

const COUNT: usize = 1 << 16;

fn values(pe: usize, range: std::ops::Range<usize>) -> Vec<i32> {
    range.map(|i| value(pe, i)).collect()
}

/// A stream on another GPU than this PE's (every process sees all GPUs).
fn stream_elsewhere(device: usize) -> Arc<CudaStream> {
    let other = (device + 1) % gpucomm_tests::device_count();
    CudaContext::new(other).unwrap().default_stream()
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn puts_and_gets_on_sub_ranges_with_every_check() {
    multi_process("puts_and_gets_on_sub_ranges_with_every_check", pes(), |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let buf = rt.alloc::<i32>(2 * COUNT).unwrap();
        let src = stream.clone_htod(&values(me, 0..2 * COUNT)).unwrap();

        // First half with a blocking put from cudarc memory, second half with a non-blocking one
        // from symmetric memory, completed by the quiet its handle enqueues.
        let mut sym_src = rt.alloc::<i32>(2 * COUNT).unwrap();
        stream.memcpy_dtod(&src, &mut sym_src).unwrap();
        rt.put_on_stream(&buf.slice(..COUNT).unwrap(), &src.slice(..COUNT), next, &stream).unwrap();
        let half = sym_src.slice(COUNT..).unwrap();
        rt.put_nbi_on_stream(&buf.slice(COUNT..).unwrap(), &half, next, &stream).unwrap().quiet().unwrap();
        rt.barrier_all_on_stream(&stream).unwrap();
        assert_eq!(stream.clone_dtoh(&buf).unwrap(), values(prev, 0..2 * COUNT), "PE {me}: puts from PE {prev}");

        // The next PE's buffer holds our values: get them back, blocking into cudarc memory and
        // non-blocking into symmetric memory.
        let mut back = stream.alloc_zeros::<i32>(COUNT).unwrap();
        rt.get_on_stream(&mut back, &buf.slice(..COUNT).unwrap(), next, &stream).unwrap();
        assert_eq!(stream.clone_dtoh(&back).unwrap(), values(me, 0..COUNT), "PE {me}: get from PE {next}");
        let mut sym_back = rt.alloc_zeroed::<i32>(COUNT).unwrap();
        rt.get_nbi_on_stream(&mut sym_back, &buf.slice(COUNT..).unwrap(), next, &stream).unwrap().quiet().unwrap();
        assert_eq!(
            stream.clone_dtoh(&sym_back).unwrap(),
            values(me, COUNT..2 * COUNT),
            "PE {me}: get_nbi from PE {next}"
        );

        // Refused before NVSHMEM: ranges past the end, PEs out of range, lengths that differ,
        // streams and buffers of another GPU.
        match buf.slice(COUNT..2 * COUNT + 1) {
            Err(Error::OutOfBounds { start, end, len }) => {
                assert_eq!((start, end, len), (COUNT, 2 * COUNT + 1, 2 * COUNT))
            }
            other => panic!("expected OutOfBounds, got {other:?}"),
        }
        match rt.put_on_stream(&buf.slice(..COUNT).unwrap(), &src.slice(..COUNT), n, &stream) {
            Err(Error::InvalidPe { what: "pe", pe, n_pes }) => assert_eq!((pe, n_pes), (n, n)),
            other => panic!("expected InvalidPe, got {other:?}"),
        }
        match rt.get_on_stream(&mut back, &buf, next, &stream) {
            Err(Error::LengthMismatch { what: "local buffer", expected, got }) => {
                assert_eq!((expected, got), (2 * COUNT, COUNT))
            }
            other => panic!("expected LengthMismatch, got {other:?}"),
        }
        let elsewhere = stream_elsewhere(rt.device());
        if elsewhere.context().ordinal() != rt.device() {
            assert!(matches!(
                rt.put_on_stream(&buf, &src, next, &elsewhere),
                Err(Error::WrongDevice { what: "stream", .. })
            ));
            let foreign = elsewhere.alloc_zeros::<i32>(2 * COUNT).unwrap();
            assert!(matches!(
                rt.put_on_stream(&buf, &foreign, next, &stream),
                Err(Error::WrongDevice { what: "local buffer", .. })
            ));
            // A put issued while the other GPU's context is current binds this PE's context.
            elsewhere.context().bind_to_thread().unwrap();
            rt.barrier_all_on_stream(&stream).unwrap();
            let twice: Vec<i32> = values(me, 0..2 * COUNT).iter().map(|v| v * 2).collect();
            let src2 = stream.clone_htod(&twice).unwrap();
            elsewhere.context().bind_to_thread().unwrap();
            rt.put_on_stream(&buf, &src2, next, &stream).unwrap();
            rt.barrier_all_on_stream(&stream).unwrap();
            let expected: Vec<i32> = values(prev, 0..2 * COUNT).iter().map(|v| v * 2).collect();
            assert_eq!(stream.clone_dtoh(&buf).unwrap(), expected, "PE {me}: put with a foreign context current");
        }
        rt.barrier_all_on_stream(&stream).unwrap();
        sym_back.free().map_err(|(_, e)| e).unwrap();
        sym_src.free().map_err(|(_, e)| e).unwrap();
        buf.free().map_err(|(_, e)| e).unwrap();
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: puts and gets with PE {next} and PE {prev} correct, bad input refused");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn signals_deliver_data_in_order() {
    multi_process("signals_deliver_data_in_order", pes(), |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let data = rt.alloc::<i32>(2 * COUNT).unwrap();
        let signals = rt.alloc_zeroed::<u64>(4).unwrap();
        let sig = |k: usize| signals.slice(k..k + 1).unwrap();
        let mut src = rt.alloc::<i32>(2 * COUNT).unwrap();
        stream.memcpy_htod(&values(me, 0..2 * COUNT), &mut src).unwrap();

        // Put with a signal set to 42; the stream waits for the previous PE's signal.
        let first = data.slice(..COUNT).unwrap();
        rt.put_signal_on_stream(&first, &src.slice(..COUNT).unwrap(), &sig(0), 42, SignalOp::Set, next, &stream)
            .unwrap();
        rt.signal_wait_until_on_stream(&sig(0), Cmp::Eq, 42, &stream).unwrap();
        assert_eq!(stream.clone_dtoh(&first).unwrap(), values(prev, 0..COUNT), "PE {me}: data behind signal 0");

        // Three signal additions of 5.
        for _ in 0..3 {
            rt.signal_op_on_stream(&sig(1), 5, SignalOp::Add, next, &stream).unwrap();
        }
        rt.signal_wait_until_on_stream(&sig(1), Cmp::Ge, 15, &stream).unwrap();

        // Two non-blocking puts with signal additions, each completed by its handle's quiet; the
        // second half is complete once the signal reaches 2.
        let second = data.slice(COUNT..).unwrap();
        let (a, b) = (second.slice(..COUNT / 2).unwrap(), second.slice(COUNT / 2..).unwrap());
        let (src_a, src_b) = (src.slice(COUNT..COUNT + COUNT / 2).unwrap(), src.slice(COUNT + COUNT / 2..).unwrap());
        let pending_a = rt.put_signal_nbi_on_stream(&a, &src_a, &sig(2), 1, SignalOp::Add, next, &stream).unwrap();
        let pending_b = rt.put_signal_nbi_on_stream(&b, &src_b, &sig(2), 1, SignalOp::Add, next, &stream).unwrap();
        pending_a.quiet().unwrap();
        drop(pending_b);
        rt.signal_wait_until_on_stream(&sig(2), Cmp::Eq, 2, &stream).unwrap();
        assert_eq!(
            stream.clone_dtoh(&second).unwrap(),
            values(prev, COUNT..2 * COUNT),
            "PE {me}: data behind signal 2"
        );

        // A signal this PE sets on itself.
        rt.signal_op_on_stream(&sig(3), 7, SignalOp::Set, me, &stream).unwrap();
        rt.signal_wait_until_on_stream(&sig(3), Cmp::Ne, 0, &stream).unwrap();
        assert_eq!(stream.clone_dtoh(&signals).unwrap(), [42, 15, 2, 7], "PE {me}: signal words");

        // A signal is exactly one u64.
        match rt.signal_op_on_stream(&signals.slice(0..2).unwrap(), 1, SignalOp::Add, next, &stream) {
            Err(Error::LengthMismatch { what: "signal", expected: 1, got: 2 }) => {}
            other => panic!("expected LengthMismatch, got {other:?}"),
        }
        rt.barrier_all_on_stream(&stream).unwrap();
        src.free().map_err(|(_, e)| e).unwrap();
        signals.free().map_err(|(_, e)| e).unwrap();
        data.free().map_err(|(_, e)| e).unwrap();
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: put-with-signal, signal ops and waits correct");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn a_peer_view_is_read_by_a_cudarc_kernel() {
    multi_process("a_peer_view_is_read_by_a_cudarc_kernel", pes(), |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let next = (me + 1) % n;
        let mut buf = rt.alloc::<i32>(COUNT).unwrap();
        stream.memcpy_htod(&values(me, 0..COUNT), &mut buf).unwrap();
        rt.barrier_all_on_stream(&stream).unwrap();

        let copy = plain_kernel(stream.context(), "copy_ints");
        let read = |view: &nvshmem::PeerView<'_, i32>| {
            let mut out = stream.alloc_zeros::<i32>(view.len()).unwrap();
            let (ptr, guard) = view.device_ptr(&stream);
            let len = view.len() as i32;
            // SAFETY: copy_ints(const int *src, int *out, int n) reads and writes `n` elements,
            // which both buffers hold.
            unsafe { stream.launch_builder(&copy).arg(&ptr).arg(&mut out).arg(&len).launch(grid(32)) }.unwrap();
            drop(guard);
            stream.clone_dtoh(&out).unwrap()
        };
        let peer = buf.peer(next).unwrap().expect("NVLink peers are load/store reachable");
        assert_eq!(peer.len(), COUNT);
        assert_eq!(read(&peer), values(next, 0..COUNT), "PE {me}: PE {next}'s copy through nvshmem_ptr");
        let part = buf.slice(100..300).unwrap().peer(next).unwrap().unwrap();
        assert_eq!(read(&part), values(next, 100..300), "PE {me}: a sub-range of PE {next}'s copy");
        assert!(matches!(buf.peer(n), Err(Error::InvalidPe { what: "pe", .. })));

        // Nobody frees before everyone has read.
        rt.barrier_all_on_stream(&stream).unwrap();
        buf.free().map_err(|(_, e)| e).unwrap();
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: read PE {next}'s buffer with a cudarc kernel");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn kernel_collective_and_put_on_three_streams_need_no_synchronisation() {
    multi_process("kernel_collective_and_put_on_three_streams_need_no_synchronisation", pes(), |info, stream| {
        let ctx = stream.context().clone();
        let (mut rdzv, rt) = start(&info, &stream);
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let comm = nccl::Comm::from_rendezvous(ctx.new_stream().unwrap(), &mut rdzv).unwrap();
        let (fill_stream, put_stream) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
        let fill = plain_kernel(&ctx, "fill_slowly");
        let mut src = rt.alloc::<i32>(COUNT).unwrap();
        let dst = rt.alloc::<i32>(COUNT).unwrap();
        // About 100 µs of spinning before the kernel writes: an unordered reader sees old data.
        let spin: i64 = 200_000;
        let len = COUNT as i32;
        for rep in 0..100 {
            let base = rep * 100 + me as i32;
            {
                // A cudarc kernel writes `src` on one stream…
                let (ptr, guard) = src.device_ptr_mut(&fill_stream);
                // SAFETY: fill_slowly(int *buf, int n, int base, long long spin) writes `n`
                // elements, which `src` holds.
                unsafe { fill_stream.launch_builder(&fill).arg(&ptr).arg(&len).arg(&base).arg(&spin).launch(grid(64)) }
                    .unwrap();
                drop(guard);
            }
            // …NCCL sums it over the PEs on another…
            nccl::Collectives::all_reduce_in_place(&comm, &mut src, nccl::ReduceOp::SUM).unwrap();
            // …and NVSHMEM puts it to the next PE on a third, with no synchronisation in between.
            rt.put_on_stream(&dst, &src, next, &put_stream).unwrap();
            rt.barrier_all_on_stream(&put_stream).unwrap();
            let bases: i32 = (0..n as i32).map(|pe| rep * 100 + pe).sum();
            let got = put_stream.clone_dtoh(&dst).unwrap();
            if let Some(i) = (0..COUNT).find(|&i| got[i] != n as i32 * i as i32 + bases) {
                panic!(
                    "PE {me}, repetition {rep}: element {i} from PE {prev} is {}, expected {}",
                    got[i],
                    n as i32 * i as i32 + bases
                );
            }
        }
        rt.barrier_all_on_stream(&put_stream).unwrap();
        dst.free().map_err(|(_, e)| e).unwrap();
        src.free().map_err(|(_, e)| e).unwrap();
        comm.finalize().map_err(|(_, e)| e).unwrap();
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: 100 repetitions of kernel → all-reduce → put on three streams correct");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn a_captured_put_and_barrier_replay_correctly() {
    multi_process("a_captured_put_and_barrier_replay_correctly", pes(), |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let captured = stream.context().new_stream().unwrap();
        let src = rt.alloc::<i32>(COUNT).unwrap();
        let dst = rt.alloc::<i32>(COUNT).unwrap();

        // The graph keeps the runtime and both buffers; between launches they are written and
        // read through it.
        let mut graph = nvshmem::capture(&captured, (&rt, src, dst), |(rt, src, dst)| {
            rt.put_on_stream(dst, src, next, &captured)?;
            rt.barrier_all_on_stream(&captured)
        })
        .unwrap();

        for k in 0..3 {
            let mine: Vec<i32> = values(me, 0..COUNT).iter().map(|v| v + k).collect();
            captured.memcpy_htod(&mine, &mut graph.kept_mut().1).unwrap();
            graph.launch().unwrap();
            let expected: Vec<i32> = values(prev, 0..COUNT).iter().map(|v| v + k).collect();
            assert_eq!(captured.clone_dtoh(&graph.kept().2).unwrap(), expected, "PE {me}: replay {k}");
            // Everyone has read before the next replay overwrites.
            rt.barrier_all_on_stream(&captured).unwrap();
        }
        let (_, src, dst) = graph.into_kept();
        dst.free().map_err(|(_, e)| e).unwrap();
        src.free().map_err(|(_, e)| e).unwrap();
        rt.finalize().map_err(|(_, e)| e).unwrap();
        println!("PE {me}: a captured put + barrier replayed 3 times, correct");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn a_quiet_waits_for_no_other_streams_work() {
    // PE 0 puts non-blocking on stream A, waits on stream B for a signal that PE 1 sets only
    // after PE 0 has signalled it from A, quiets B, then completes the put (a quiet on A) and
    // signals PE 1 from A. NVSHMEM's own quiet on A waits for its copy streams only. Before, the
    // quiet chain recorded its event after the quiet on B, behind B's signal wait, and A's quiet
    // waited for that event: A waited for PE 1, which waited for A. The chain now clears the
    // copies' marks on a private stream and keeps its event there.
    multi_process("a_quiet_waits_for_no_other_streams_work", 2, |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let me = rt.my_pe();
        let flags = rt.alloc_zeroed::<u64>(2).unwrap();
        let (f0, f1) = (flags.slice(0..1).unwrap(), flags.slice(1..2).unwrap());
        let dst = rt.alloc_zeroed::<i32>(COUNT).unwrap();
        let mut src = rt.alloc::<i32>(COUNT).unwrap();
        stream.memcpy_htod(&values(me, 0..COUNT), &mut src).unwrap();
        stream.synchronize().unwrap();
        rt.barrier_all_on_stream(&stream).unwrap();
        stream.synchronize().unwrap();
        let (a, b) = (stream.context().new_stream().unwrap(), stream.context().new_stream().unwrap());
        if me == 0 {
            let put = rt.put_nbi_on_stream(&dst, &src, 1, &a).unwrap();
            rt.signal_wait_until_on_stream(&f0, Cmp::Ge, 1, &b).unwrap();
            rt.quiet_on_stream(&b).unwrap();
            put.quiet().unwrap();
            rt.signal_op_on_stream(&f1, 1, SignalOp::Set, 1, &a).unwrap();
        } else {
            rt.signal_wait_until_on_stream(&f1, Cmp::Ge, 1, &a).unwrap();
            rt.signal_op_on_stream(&f0, 1, SignalOp::Set, 0, &a).unwrap();
        }
        // Bounded: a deadlock fails the test instead of hanging it.
        let done = [a.record_event(None).unwrap(), b.record_event(None).unwrap()];
        let started = std::time::Instant::now();
        while !done.iter().all(|e| e.is_complete()) {
            assert!(started.elapsed() < std::time::Duration::from_secs(60), "PE {me}: the streams never finished");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        rt.barrier_all_on_stream(&stream).unwrap();
        if me == 1 {
            assert_eq!(stream.clone_dtoh(&dst).unwrap(), values(0, 0..COUNT), "PE 1: PE 0's put");
        }
        println!("PE {me}: the quiet on one stream waited for no other stream's signal wait");
    });
}
