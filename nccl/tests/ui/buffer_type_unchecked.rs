// cudarc's buffer traits are safe to implement, so a type can claim any length. The calls take
// only buffers whose owner promised their length with `unsafe impl DeviceMemory`.
use std::sync::Arc;

use cudarc::driver::{sys::CUdeviceptr, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use nccl::{Collectives, Comm, ReduceOp};

struct Claims {
    stream: Arc<CudaStream>,
}

impl DeviceSlice<f32> for Claims {
    fn len(&self) -> usize {
        1 << 30
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl DevicePtr<f32> for Claims {
    fn device_ptr<'a>(&'a self, _: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (0x1000, SyncOnDrop::Record(None))
    }
}

impl DevicePtrMut<f32> for Claims {
    fn device_ptr_mut<'a>(&'a mut self, _: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (0x1000, SyncOnDrop::Record(None))
    }
}

fn demo(comm: &Comm, buf: &mut Claims) -> nccl::Result<()> {
    comm.all_reduce_in_place(buf, ReduceOp::SUM)
}

fn main() {}
