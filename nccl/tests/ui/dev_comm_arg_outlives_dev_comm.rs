// A device communicator's kernel argument borrows it: it cannot be kept after the device
// communicator is destroyed (dropped), when NCCL has freed what it points at.
use nccl::device::{DevComm, DevCommArg, DevCommRequirements};
use nccl::Comm;

fn demo(comm: &'static Comm) -> nccl::Result<DevCommArg<'static>> {
    let dev = DevComm::new(comm, &DevCommRequirements::default().lsa_barriers(1))?;
    Ok(dev.arg())
}

fn kept_past_the_drop(comm: &Comm) -> nccl::Result<()> {
    let dev = DevComm::new(comm, &DevCommRequirements::default())?;
    let arg = dev.arg();
    drop(dev);
    println!("{arg:?}");
    Ok(())
}

fn main() {}
