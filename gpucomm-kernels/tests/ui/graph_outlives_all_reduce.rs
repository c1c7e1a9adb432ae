// A graph that captured dispatcher calls keeps the dispatcher (its device communicator, module and
// window, which the captured kernels use): dropping it while the graph lives does not compile.
use std::sync::Arc;

use cudarc::driver::CudaStream;
use gpucomm_kernels::AllReduce;
use nccl::{MemBuffer, ReduceOp};

fn demo(ar: AllReduce<'_>, side: &Arc<CudaStream>, buf: MemBuffer<f32>) -> gpucomm_kernels::Result<()> {
    let mut graph = gpucomm_kernels::capture(side, (&ar, buf), |(ar, buf)| {
        ar.all_reduce_in_place(side, buf, ReduceOp::SUM).map(drop)
    }).map_err(|(_, e)| e)?;
    drop(ar);
    graph.launch()?;
    Ok(())
}

fn main() {}
