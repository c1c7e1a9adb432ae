// A graph keeps the borrowed communicator its captured calls use (`&BorrowedComm`, which borrows
// the owner in turn): dropping the borrowed communicator while the graph lives does not compile.
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nccl::{BorrowedComm, Collectives, MemBuffer, ReduceOp};

fn demo(comm: BorrowedComm<'_>, side: &Arc<CudaStream>, buf: MemBuffer<f32>) -> nccl::Result<()> {
    let mut graph = nccl::capture(side, (&comm, buf), |(comm, buf)| {
        comm.on(side).all_reduce_in_place(buf, ReduceOp::SUM)
    }).map_err(|(_, e)| e)?;
    drop(comm);
    graph.launch()?;
    Ok(())
}

fn main() {}
