// `tracked_device_ptr!` makes a type a buffer the calls accept, so the parts it is given (address,
// length, tracker) come only from the `unsafe` `Tracked::new`: safe code cannot describe memory it
// does not own.
use std::sync::Arc;

use cudarc::driver::{sys::CUdeviceptr, CudaStream};
use gpucomm_ordering::{StreamTracker, Tracked};

pub struct Forged<T> {
    tracker: StreamTracker,
    home: Arc<CudaStream>,
    _elements: std::marker::PhantomData<T>,
}

gpucomm_ordering::tracked_device_ptr!([T] Forged<T>, |b| Tracked::new(0x1000 as CUdeviceptr, 1 << 30, &b.tracker, &b.home));

fn main() {}
