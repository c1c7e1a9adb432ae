// A PreMulSum operator is created for one data type: using it with another does not compile.
use cudarc::driver::CudaSlice;
use nccl::{Collectives, PreMulSum};

fn demo(comm: &nccl::Comm, buf: &mut CudaSlice<f64>) -> nccl::Result<()> {
    let half = PreMulSum::host(comm, 0.5f32)?;
    comm.all_reduce_in_place(buf, &half)
}

fn main() {}
