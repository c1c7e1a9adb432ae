// A window's buffer cannot be taken out while the window holds it (issue 19, finding 5): through a
// `&mut MemBuffer`, `mem::replace` would hand the registered memory out to be freed while NCCL maps
// it on every rank, and the window's length would describe another buffer. (With the old
// `DerefMut`, this compiled.) Writes go through views (`window.as_view_mut()`), which hold the
// buffer in place.
use nccl::{Comm, MemBuffer, WindowFlags};

fn demo(comm: &Comm, other: MemBuffer<f32>) -> nccl::Result<()> {
    let buf = MemBuffer::<f32>::zeroed(comm.stream(), 1024)?;
    let mut window = comm.register_window(buf, WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e)?;
    let registered = std::mem::replace(&mut *window, other);
    registered.free().map_err(|(_, e)| e)?;
    Ok(())
}

fn main() {}
