// A graph keeps the buffers its captured calls use: dropping (freeing) one while the graph can
// still be launched does not compile.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use nccl::{Collectives, Comm, ReduceOp};

fn demo(comm: &Comm, side: &Arc<CudaStream>, mut buf: CudaSlice<f32>) -> nccl::Result<()> {
    let mut graph = nccl::capture(side, (comm, &mut buf), |(comm, buf)| {
        comm.on(side).all_reduce_in_place(*buf, ReduceOp::SUM)
    }).map_err(|(_, e)| e)?;
    drop(buf);
    graph.launch()?;
    Ok(())
}

fn main() {}
