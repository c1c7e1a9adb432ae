// A registration owns what it registers: a borrowed buffer could be freed while NVSHMEM still
// holds the registration (forget the registration, drop the owner), so it does not compile.
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nvshmem::Runtime;

fn demo(rt: &Runtime, stream: &Arc<CudaStream>) -> nvshmem::Result<()> {
    let mut owner = stream.alloc_zeros::<u32>(1024)?;
    let reg = rt.register(owner.slice_mut(..)).map_err(|(_, e)| e)?;
    std::mem::forget(reg);
    drop(owner);
    Ok(())
}

fn main() {}
