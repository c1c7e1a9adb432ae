// Symmetric elements must be valid for any bits: another PE may allocate `u8` at the same step (the
// allocation checks sizes only) and put any byte into this PE's copy, so a zeroed `bool` buffer
// does not compile.
use nvshmem::Runtime;

fn demo(rt: &Runtime) -> nvshmem::Result<()> {
    let flags = rt.alloc_zeroed::<bool>(16)?;
    flags.free().map_err(|(_, e)| e)?;
    Ok(())
}

fn main() {}
