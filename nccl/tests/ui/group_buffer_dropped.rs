// A buffer given to a group cannot be dropped (freed) before the group has launched its calls.
use cudarc::driver::CudaSlice;
use nccl::{Collectives, Comm, ReduceOp};

fn demo(comm: &Comm, mut buf: CudaSlice<f32>) -> nccl::Result<()> {
    nccl::group(|g| {
        g.with(comm).all_reduce_in_place(&mut buf, ReduceOp::SUM)?;
        drop(buf);
        Ok(())
    })
}

fn main() {}
