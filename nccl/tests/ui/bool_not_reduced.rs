// NCCL has no data type for `bool`, and no reduction means anything for it.
use cudarc::driver::CudaSlice;
use nccl::{Collectives, ReduceOp};

fn demo(comm: &nccl::Comm, buf: &mut CudaSlice<bool>) -> nccl::Result<()> {
    comm.all_reduce_in_place(buf, ReduceOp::MAX)
}

fn main() {}
