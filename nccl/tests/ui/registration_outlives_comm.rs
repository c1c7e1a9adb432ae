// A registration borrows its communicator: the communicator cannot be finalized (or dropped)
// while a buffer is still registered with it.
use cudarc::driver::CudaSlice;
use nccl::Comm;

fn demo(comm: Comm, buf: CudaSlice<f32>) -> nccl::Result<CudaSlice<f32>> {
    let registration = comm.register(buf).map_err(|(_, e)| e)?;
    comm.finalize().map_err(|(_, e)| e)?;
    Ok(registration.deregister().map_err(|(_, e)| e)?)
}

fn main() {}
