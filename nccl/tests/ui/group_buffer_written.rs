// A buffer a group reads cannot be written (here: overwritten from the host) before the group
// has launched, even from outside the closure: the group borrows it until `group` returns.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use nccl::{Collectives, Comm};

fn demo(comm: &Comm, stream: &Arc<CudaStream>, send: &mut CudaSlice<f32>) -> nccl::Result<()> {
    nccl::group(|g| {
        g.with(comm).send(&*send, 1)?;
        stream.memcpy_htod(&[1.0f32; 4], send)?;
        Ok(())
    })
}

fn main() {}
