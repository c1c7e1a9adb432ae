//! # Lesson 16 — a Python trainer and a Rust inference server in one NCCL communicator
//!
//! What it teaches:
//! * Rust and Python processes meet at a PyTorch-compatible TCPStore: this process hosts one
//!   ([`StoreServer`]) that Python's `torch.distributed.TCPStore(host, port, is_master=False)`
//!   joins, or joins one that Python hosts (`is_master=True`) with a [`StoreClient`];
//! * the side that hosts the store creates the NCCL unique id and stores it; the other reads it
//!   (Python's `TCPStore` puts `/` in front of its keys: Python's `weight-sync/nccl-id` is
//!   `/weight-sync/nccl-id` here);
//! * both then join one NCCL communicator: this process is rank 0 ([`Comm::init_rank_config`],
//!   nonblocking with a timeout, so that a trainer that never comes or dies midway ends this
//!   process with an error instead of a hang), the Python trainer
//!   (`examples/python/weight_sync_trainer.py`, CuPy's `cupy.cuda.nccl`) rank 1;
//! * the weight sync that RL frameworks (vLLM and others) run beside their own process groups:
//!   the trainer broadcasts its weights, the server checks every value and answers with a
//!   checksum and an error count (an all-reduce to which the trainer adds zeros), which the
//!   trainer checks in turn — the values are checked on both sides.
//!
//! How to run it: build it (`cargo build -p examples --example 16-python-weight-sync`),
//! then in two shells (`--device N` picks this process's GPU, default 0), with NVLink multicast
//! off in both
//! (`export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1`; each
//! side also sets these for itself before NCCL loads, and this one says so when it overrides a
//! value):
//! * this process hosts the store:
//!   `MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 target/debug/examples/16-python-weight-sync`, and
//!   `MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 python3 examples/python/weight_sync_trainer.py`;
//! * Python hosts it: `… python3 examples/python/weight_sync_trainer.py --host-store`, and
//!   `… target/debug/examples/16-python-weight-sync --join-store`.
//!
//! The trainer needs CuPy with NCCL (`pip install cupy-cuda13x`) and PyTorch (for `TCPStore`).
//! If CuPy cannot load NCCL, preload the wheel's library:
//! `LD_PRELOAD=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib/libnccl.so.2`.
//! Both processes must load the same NCCL version. On a machine with one GPU, run both on GPU 0
//! and give each its own `NCCL_HOSTID` (e.g. `NCCL_HOSTID=server` and `NCCL_HOSTID=trainer`):
//! NCCL then treats them as two hosts and connects them over sockets.
//!
//! What you should see, from this process:
//! `inference server: step 0: received 1048576 weights from the trainer, 0 wrong, checksum …`
//! for steps 0 to 2, then
//! `inference server: 3 weight syncs received and checked; the trainer says: checksums confirmed`;
//! and from the trainer, `trainer: step N: … -> ok` and
//! `trainer: 3 weight syncs, values checked on both sides`.
//!
//! **Security.** A plain TCPStore has no access control, and Python's side speaks plain
//! TCPStore: anyone who can reach `MASTER_PORT` can read the unique id (and join the
//! communicator) or overwrite it. Run this on a trusted network (the default `MASTER_ADDR` here
//! is loopback). Between Rust ranks, [`Rendezvous`](nccl::launch::Rendezvous) with a job key
//! protects the id; see the `launch` documentation.

use std::error::Error;
use std::net::ToSocketAddrs;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use nccl::launch::store::{Limits, StoreClient, StoreServer};
use nccl::{Collectives, Comm, Config, ReduceOp, UniqueId};

/// Weight syncs, and weights per sync.
const STEPS: usize = 3;
const COUNT: usize = 1 << 20;
/// This process's rank, and the trainer's (the broadcast's root).
const SERVER: usize = 0;
const TRAINER: usize = 1;
/// How long either side waits for the other: at the store, to join the communicator, and for
/// each collective.
const PATIENCE: Duration = Duration::from_secs(120);

const ID_KEY: &str = "/weight-sync/nccl-id";
const TRAINER_DONE: &str = "/weight-sync/trainer-done";
const SERVER_DONE: &str = "/weight-sync/server-done";

/// Weight `i` of sync `step`, as the trainer computes it: whole numbers below 2^24, exact in
/// f32 on both sides.
fn weight(step: usize, i: usize) -> f32 {
    ((i % 4096) + 4096 * step) as f32
}

fn main() -> ExitCode {
    // NVLink multicast stays off in this process (the lessons that go through `run_main` get
    // this from it).
    nccl::launch::safety::enforce_with_note();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let join = args.iter().any(|a| a == "--join-store");
    let device = match args.iter().position(|a| a == "--device") {
        Some(i) => {
            let value = args.get(i + 1).ok_or("--device needs a GPU number")?;
            value.parse().map_err(|e| format!("--device {value}: {e} (a GPU number is expected)"))?
        }
        None => 0,
    };
    let addr = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    let port: u16 = match std::env::var("MASTER_PORT") {
        Ok(p) => p.parse().map_err(|e| format!("MASTER_PORT={p}: {e} (a TCP port number is expected)"))?,
        Err(_) => 29517,
    };
    gpucomm_examples::cuda_devices()?;

    // 1. Meet Python at the store, and agree on the NCCL unique id.
    let (server, mut store, id) = if join {
        let mut store = StoreClient::connect(&addr, port, PATIENCE)?;
        if !store.wait(&[ID_KEY], PATIENCE)? {
            return Err(format!("the trainer stored no NCCL id at {addr}:{port} within {PATIENCE:?}").into());
        }
        let id = UniqueId::from_bytes(&store.get(ID_KEY)?)?;
        println!("inference server: joined the trainer's store at {addr}:{port} and read the NCCL id");
        (None, store, id)
    } else {
        let bind = (addr.as_str(), port).to_socket_addrs()?.next().ok_or("MASTER_ADDR resolves to no address")?;
        let server = StoreServer::bind(bind, Limits::default())?;
        let mut store = StoreClient::connect(&addr, port, PATIENCE)?;
        let id = UniqueId::new()?;
        store.set(ID_KEY, &id.to_bytes())?;
        println!("inference server: hosting the store at {}, NCCL id stored", server.local_addr());
        (Some(server), store, id)
    };

    // 2. One communicator with the trainer: this process is rank 0 of 2. Nonblocking with a
    //    timeout: a trainer that never joins (CuPy failed to import) or dies midway ends this
    //    process with `Error::Timeout` after PATIENCE, where a blocking call would wait for ever.
    let stream = CudaContext::new(device)?.default_stream();
    let config = Config::new().blocking(false).timeout(PATIENCE);
    let comm = Comm::init_rank_config(stream.clone(), &id, SERVER, 2, &config)?;

    // 3. The weight syncs: receive, check every value, report back.
    let mut weights = stream.alloc_zeros::<f32>(COUNT)?;
    for step in 0..STEPS {
        comm.broadcast_in_place(&mut weights, TRAINER)?;
        // Finished, or `Error::Timeout` (which aborts the communicator) after PATIENCE.
        comm.wait(None)?;
        let host = stream.clone_dtoh(&weights)?;
        let wrong = host.iter().enumerate().filter(|&(i, &w)| w != weight(step, i)).count();
        let checksum: f64 = host.iter().map(|&w| f64::from(w)).sum();
        println!(
            "inference server: step {step}: received {COUNT} weights from the trainer, {wrong} wrong, checksum {checksum}"
        );
        // The trainer adds zeros: what it reads back is this process's report.
        let mut report = stream.clone_htod(&[checksum, wrong as f64])?;
        comm.all_reduce_in_place(&mut report, ReduceOp::SUM)?;
        comm.wait(None)?;
        if wrong > 0 {
            return Err(format!("step {step}: {wrong} of {COUNT} weights differ from the trainer's").into());
        }
    }
    comm.finalize().map_err(|(_, e)| e)?;

    // 4. Hear the trainer's verdict, say goodbye, and keep a hosted store up until it has left.
    if !store.wait(&[TRAINER_DONE], PATIENCE)? {
        return Err("the trainer did not report within the time limit".into());
    }
    let verdict = String::from_utf8_lossy(&store.get(TRAINER_DONE)?).into_owned();
    store.set(SERVER_DONE, b"bye")?;
    if let Some(server) = server {
        let until = Instant::now() + Duration::from_secs(10);
        while server.stats().validated > 1 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    println!("inference server: {STEPS} weight syncs received and checked; the trainer says: {verdict}");
    if verdict != "checksums confirmed" {
        return Err("the trainer found the server's checksums wrong".into());
    }
    Ok(())
}
