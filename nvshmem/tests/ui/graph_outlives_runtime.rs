// A graph keeps the NVSHMEM runtime its captured operations use: finalising NVSHMEM while the
// graph lives does not compile.
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nvshmem::Runtime;

fn demo(rt: Runtime, side: &Arc<CudaStream>) -> nvshmem::Result<()> {
    let mut graph = nvshmem::capture(side, (&rt,), |(rt,)| rt.barrier_all_on_stream(side)).map_err(|(_, e)| e)?;
    rt.finalize().map_err(|(_, e)| e)?;
    graph.launch()?;
    Ok(())
}

fn main() {}
