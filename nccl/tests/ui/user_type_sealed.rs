// A user type cannot claim an NCCL data type: a wrong element size would make NCCL read and
// write past the buffers, so the element trait is sealed.
use nccl::{DataType, NcclType};

#[derive(Clone, Copy)]
#[repr(C)]
struct Pair {
    a: f32,
    b: f32,
}

unsafe impl cudarc::driver::DeviceRepr for Pair {}

impl NcclType for Pair {
    const DATA_TYPE: DataType = <f32 as NcclType>::DATA_TYPE;
}

fn main() {}
