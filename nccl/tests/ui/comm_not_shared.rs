// A communicator is `Send` but not `Sync`: NCCL allows one thread at a time to use it, so a
// `&Comm` cannot reach another thread.
fn share(comm: &nccl::Comm) {
    std::thread::scope(|s| {
        s.spawn(|| comm.rank());
    });
}

fn main() {}
