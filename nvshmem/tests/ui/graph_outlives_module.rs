// A graph keeps the module whose kernels it launches: unloading the module while the graph lives
// does not compile.
use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig};
use nvshmem::Runtime;

fn demo(rt: &Runtime, side: &Arc<CudaStream>, image: &[u8]) -> nvshmem::Result<()> {
    let module = rt.load_module(image)?;
    let kernel = module.kernel("k")?;
    let cfg = LaunchConfig::for_num_elems(1);
    let mut graph = nvshmem::capture(side, (&module,), |_| {
        // SAFETY: (not the point of this test) a kernel without parameters.
        unsafe { kernel.launch(cfg, side, |_| Ok(())) }
    }).map_err(|(_, e)| e)?;
    drop(module);
    graph.launch()?;
    Ok(())
}

fn main() {}
