// A buffer a graph keeps through a shared borrow cannot be written (or swapped out) while the
// graph lives; write inputs through `Graph::kept_mut` on a buffer given by value or `&mut`.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use nccl::{Collectives, Comm, ReduceOp};

fn demo(comm: &Comm, side: &Arc<CudaStream>, send: CudaSlice<f32>, recv: CudaSlice<f32>) -> nccl::Result<()> {
    let mut send = send;
    let mut graph = nccl::capture(side, (comm, &send, recv), |(comm, send, recv)| {
        comm.on(side).all_reduce(*send, recv, ReduceOp::SUM)
    }).map_err(|(_, e)| e)?;
    side.memcpy_htod(&[1.0f32; 4], &mut send)?;
    graph.launch()?;
    Ok(())
}

fn main() {}
