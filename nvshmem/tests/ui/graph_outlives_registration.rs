// A graph keeps the registration whose buffer its captured operations use (the registration owns
// the buffer): unregistering it while the graph can still be launched does not compile.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use nvshmem::{Runtime, Symmetric};

fn demo(rt: &Runtime, side: &Arc<CudaStream>, dst: Symmetric<'_, f32>, src: CudaSlice<f32>) -> nvshmem::Result<()> {
    let reg = rt.register(src).map_err(|(_, e)| e)?;
    let mut graph = nvshmem::capture(side, (rt, dst, &reg), |(rt, dst, reg)| rt.put_on_stream(dst, &***reg, 0, side)).map_err(|(_, e)| e)?;
    let src = reg.unregister().map_err(|(_, e)| e)?;
    graph.launch()?;
    drop(src);
    Ok(())
}

fn main() {}
