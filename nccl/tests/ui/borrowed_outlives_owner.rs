// A borrowed communicator cannot outlive the owner it was borrowed from: the owner could destroy
// the communicator while it is still in use.
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nccl::BorrowedComm;

struct Owner {
    raw: nccl::sys::ncclComm_t,
}

fn demo(stream: Arc<CudaStream>) -> nccl::Result<BorrowedComm<'static>> {
    let owner = Owner { raw: std::ptr::null_mut() };
    // SAFETY: (this program must not compile)
    let comm = unsafe { BorrowedComm::from_raw_borrowed(owner.raw, stream, &owner) }?;
    Ok(comm)
}

fn main() {}
