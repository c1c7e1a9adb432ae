// A registration's buffer cannot be swapped out while it is registered (issue 19, finding 5): with
// the old `DerefMut`, `mem::swap` moved the registered memory into `other`, which the caller could
// then drop (freeing memory NCCL still holds) while the registration described a buffer it never
// registered. Writes go through `reg.buffer_mut()`, which holds the buffer in place.
use cudarc::driver::CudaSlice;
use nccl::Comm;

fn demo(comm: &Comm, buf: CudaSlice<f32>, mut other: CudaSlice<f32>) -> nccl::Result<()> {
    let mut registration = comm.register(buf).map_err(|(_, e)| e)?;
    std::mem::swap(&mut *registration, &mut other);
    drop(other);
    Ok(())
}

fn main() {}
