// NCCL has no data type for `char` (4 bytes in Rust, and arbitrary bytes are not valid `char`s).
use cudarc::driver::CudaSlice;
use nccl::Collectives;

fn demo(comm: &nccl::Comm, buf: &CudaSlice<char>) -> nccl::Result<()> {
    comm.send(buf, 1)
}

fn main() {}
