// A peer view carries the buffer's stream tracker, whose waits can call into NVSHMEM; NVSHMEM runs
// `NVSHMEM_THREAD_SERIALIZED`, so the view stays on the runtime's thread: it is neither `Send`
// nor `Sync`.
use nvshmem::PeerView;

fn send<T: Send>(_: T) {}

fn demo(view: PeerView<'_, u32>) {
    send(&view);
    send(view);
}

fn main() {}
