// A registration owns its buffer: a borrowed view is refused, because a registration can be
// leaked (`mem::forget`, or a drop that cannot deregister), and the memory the view borrows could
// then be freed while NCCL still holds the registration.
use cudarc::driver::CudaSlice;
use nccl::Comm;

fn demo(comm: &Comm, mut buf: CudaSlice<f32>) -> nccl::Result<()> {
    let registration = comm.register(buf.slice_mut(0..4)).map_err(|(_, e)| e)?;
    std::mem::forget(registration);
    drop(buf);
    Ok(())
}

fn main() {}
