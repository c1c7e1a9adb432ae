// NCCL requires one thread to issue all operations of a group: a group member cannot be handed
// to another thread.
use cudarc::driver::CudaSlice;
use nccl::{Collectives, Comm, ReduceOp};

fn demo(comm: &Comm, buf: &mut CudaSlice<f32>) -> nccl::Result<()> {
    nccl::group(|g| {
        let member = g.with(comm);
        std::thread::scope(|s| {
            s.spawn(move || member.all_reduce_in_place(buf, ReduceOp::SUM));
        });
        Ok(())
    })
}

fn main() {}
