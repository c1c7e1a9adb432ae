// A graph keeps the symmetric buffers its captured operations use: freeing one while the graph
// can still be launched does not compile.
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nvshmem::{Runtime, Symmetric};

fn demo(rt: &Runtime, side: &Arc<CudaStream>, dst: Symmetric<'_, f32>, src: Symmetric<'_, f32>) -> nvshmem::Result<()> {
    let mut dst = dst;
    let mut graph = nvshmem::capture(side, (rt, &mut dst, &src), |(rt, dst, src)| rt.put_on_stream(*dst, *src, 0, side)).map_err(|(_, e)| e)?;
    dst.free().map_err(|(_, e)| e)?;
    graph.launch()?;
    Ok(())
}

fn main() {}
