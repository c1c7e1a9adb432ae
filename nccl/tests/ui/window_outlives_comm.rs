// A window borrows its communicator: it cannot be kept after the communicator is gone.
use nccl::{Comm, MemBuffer, Window, WindowFlags};

fn demo(stream: std::sync::Arc<cudarc::driver::CudaStream>) -> nccl::Result<Window<'static, f32>> {
    let comm = Comm::init_rank(stream.clone(), &nccl::UniqueId::new()?, 0, 1)?;
    let buf = MemBuffer::<f32>::zeroed(&stream, 1024)?;
    comm.register_window(buf, WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e)
}

fn main() {}
