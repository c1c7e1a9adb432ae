// A graph keeps the communicator its captured calls use: dropping (destroying) it while the graph
// lives does not compile (NCCL's teardown would wait for the graph's persistent resources).
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nccl::{Collectives, Comm, MemBuffer, ReduceOp};

fn demo(comm: Comm, side: &Arc<CudaStream>, buf: MemBuffer<f32>) -> nccl::Result<()> {
    let mut graph = nccl::capture(side, (&comm, buf), |(comm, buf)| {
        comm.on(side).all_reduce_in_place(buf, ReduceOp::SUM)
    }).map_err(|(_, e)| e)?;
    drop(comm);
    graph.launch()?;
    Ok(())
}

fn main() {}
