// A buffer given to a group cannot be moved away (here: to another owner) while the group is open.
use cudarc::driver::CudaSlice;
use nccl::{Collectives, Comm};

fn demo(comm: &Comm, send: CudaSlice<f32>, keep: &mut Vec<CudaSlice<f32>>) -> nccl::Result<()> {
    nccl::group(|g| {
        g.with(comm).send(&send, 1)?;
        keep.push(send);
        Ok(())
    })
}

fn main() {}
