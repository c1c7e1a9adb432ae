//! Helpers shared by the test suites: finding GPUs, skipping honestly, and running one test as
//! several processes.
//!
//! GPU tests are `#[ignore]`d so that CPU-only machines (CI) report them as ignored, never as
//! passed. The GPU bundle runs them with `--include-ignored`; a test that still cannot run there
//! (too few GPUs) calls [`skip`], which records it in `$GPUCOMM_SKIP_LOG` so the bundle counts it
//! as skipped.
//!
//! The multi-process helpers start their ranks with the crate's own spawner, or, when
//! `GPUCOMM_TEST_TORCHRUN` names a `torchrun` executable, with real torchrun: one agent for
//! [`multi_process`] (`--standalone`), one agent per rank posing as a node for
//! [`multi_node_on_one_gpu`]. The ranks then rendezvous through the agent's TCPStore, as a job
//! started by a training framework does.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use gpucomm_launch::{self as launch, RankInfo};

/// The images `build.rs` compiled (the suites use the others).
#[allow(dead_code)]
mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// Keeps `stream` busy for `time` (one GPU thread that watches the GPU's clock): work enqueued on
/// it afterwards waits that long, like work behind a kernel that is stuck. Returns at once: the
/// kernel's module stays loaded for the rest of the process (one per context), because unloading
/// a module waits for the kernels it launched — which made this wait for `time` on the host, with
/// the stream idle again by the time the caller went on (and the tests that rely on a busy stream
/// observed nothing). Panics if the stream is not busy after the launch, so that a test whose
/// premise failed says so.
pub fn occupy(stream: &Arc<CudaStream>, time: Duration) {
    let busy = busy_for(stream.context());
    let ns = u64::try_from(time.as_nanos()).unwrap_or(u64::MAX);
    let mut launch = stream.launch_builder(&busy);
    launch.arg(&ns);
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: busy_for(unsigned long long ns) takes one 8-byte value, pushed above, and touches no
    // memory.
    unsafe { launch.launch(one) }.expect("launch busy_for");
    if time >= Duration::from_millis(100) {
        // SAFETY: the stream is alive (borrowed); the call only reads its state.
        let status = unsafe { cudarc::driver::sys::cuStreamQuery(stream.cu_stream()) };
        assert_eq!(
            status,
            cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY,
            "occupy: the stream is not busy right after launching {time:?} of work"
        );
    }
}

/// Takes the free memory of `stream`'s GPU with cudarc allocations until at most `leave` bytes
/// are free (or no allocation of 2 MiB succeeds), as other allocators filling a GPU would: for
/// tests of what runs out of memory. Dropping the buffers and synchronising the stream gives the
/// memory back.
pub fn fill_gpu(stream: &Arc<CudaStream>, leave: usize) -> Vec<CudaSlice<u8>> {
    let free = || stream.context().mem_get_info().expect("cuMemGetInfo").0;
    let (mut taken, mut chunk) = (Vec::new(), 8usize << 30);
    while free() > leave && chunk >= 2 << 20 {
        match stream.alloc_zeros::<u8>(chunk.min(free() - leave)) {
            Ok(buf) => {
                taken.push(buf);
                stream.synchronize().expect("synchronize");
            }
            Err(_) => chunk /= 2,
        }
    }
    taken
}

/// The `busy_for` kernel in `ctx`, loaded once per context and kept loaded (see [`occupy`]).
fn busy_for(ctx: &Arc<CudaContext>) -> CudaFunction {
    static LOADED: Mutex<Vec<(usize, CudaFunction)>> = Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    let key = ctx.cu_ctx() as usize;
    if let Some((_, f)) = loaded.iter().find(|(k, _)| *k == key) {
        return f.clone();
    }
    let module = ctx.load_module(Ptx::from_binary(kernels::PLAIN.to_vec())).expect("load the kernels");
    let f = module.load_function("busy_for").expect("busy_for");
    loaded.push((key, f.clone()));
    f
}

/// Records that `test` did not run, and why.
pub fn skip(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os("GPUCOMM_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{test}: {reason}");
        }
    }
}

/// Number of CUDA devices, 0 when there is no driver.
pub fn device_count() -> usize {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return 0;
    }
    CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)
}

/// One stream per device for the first `n` devices, or `None` after [`skip`]ping `test`.
pub fn require_gpus(test: &str, n: usize) -> Option<Vec<Arc<CudaStream>>> {
    let have = device_count();
    if have < n {
        skip(test, &format!("needs {n} GPUs, found {have}"));
        return None;
    }
    Some((0..n).map(|i| CudaContext::new(i).expect("open CUDA device").default_stream()).collect())
}

/// True in a process started by [`multi_process`].
fn is_child() -> bool {
    std::env::var_os("GPUCOMM_SPAWNED").is_some()
}

/// Runs `body` as `nproc` processes, one per GPU: the test binary re-runs itself (only `test`)
/// through the local spawner, and each child gets its rank from the launcher variables. The
/// parent fails if any child fails. Skipped (not run) with fewer GPUs than processes.
pub fn multi_process(test: &str, nproc: usize, body: impl FnOnce(RankInfo, Arc<CudaStream>)) {
    if is_child() {
        let info = child_info(test);
        let ordinal = info.device_ordinal(device_count()).expect("a GPU for this rank");
        let stream = CudaContext::new(ordinal).expect("open CUDA device").default_stream();
        body(info, stream);
        return;
    }
    let have = device_count();
    if have < nproc {
        skip(test, &format!("needs {nproc} GPUs, found {have}"));
        return;
    }
    start_ranks(test, nproc, Agents::One);
}

/// Runs `body` as `nproc` processes that all use GPU 0, each with its own `NCCL_HOSTID`, so that
/// NCCL takes them for ranks on different nodes and connects them over its network transport
/// (sockets): how one GPU tests what happens between nodes. Each child gets its rank from the
/// launcher variables. Skipped (not run) without a GPU.
pub fn multi_node_on_one_gpu(test: &str, nproc: usize, body: impl FnOnce(RankInfo, Arc<CudaStream>)) {
    if is_child() {
        let info = child_info(test);
        // Set before anything reads it: NCCL reads NCCL_HOSTID when it first needs the host's
        // identity, and no CUDA or NCCL thread exists yet; libtest's own threads only wait.
        std::env::set_var("NCCL_HOSTID", format!("gpucomm-test-node{}", info.rank));
        let stream = CudaContext::new(0).expect("open CUDA device 0").default_stream();
        body(info, stream);
        return;
    }
    if device_count() == 0 {
        skip(test, "needs a GPU, found none");
        return;
    }
    start_ranks(test, nproc, Agents::OnePerRank);
}

/// A rank's identity from the launcher variables; under torchrun it says so on stderr (which
/// launcher, run id and restart), so that a log shows who started the ranks.
fn child_info(test: &str) -> RankInfo {
    let info = RankInfo::from_env().expect("launcher variables");
    if let Some(elastic) = &info.torchelastic {
        eprintln!("{test}: rank {} of {} started by torchrun ({elastic:?})", info.rank, info.world_size);
    }
    info
}

/// How torchrun's agents are laid out when `GPUCOMM_TEST_TORCHRUN` is set.
#[derive(Clone, Copy)]
enum Agents {
    /// One agent starts every rank (`--standalone`).
    One,
    /// One agent per rank, each posing as a node (`--nnodes N --node-rank i`).
    OnePerRank,
}

/// Re-runs only `test` of this binary as `nproc` ranks, with the spawner or with torchrun, and
/// fails if any rank fails.
fn start_ranks(test: &str, nproc: usize, agents: Agents) {
    let exe = std::env::current_exe().expect("current exe");
    let args: Vec<std::ffi::OsString> =
        ["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"].iter().map(Into::into).collect();
    match std::env::var_os("GPUCOMM_TEST_TORCHRUN") {
        Some(torchrun) => under_torchrun(test, nproc, agents, torchrun.as_ref(), &exe, &args),
        None => {
            let outcome =
                launch::spawn_local(nproc, &exe, &args, &[], std::time::Duration::from_secs(5)).expect("spawn ranks");
            assert!(outcome.success(), "{test}: {:?}", outcome.first_failure);
        }
    }
}

/// Starts the ranks with real torchrun (`torchrun ... --no-python exe args`): the agents host the
/// job's TCPStore and every rank joins it as a client.
fn under_torchrun(
    test: &str,
    nproc: usize,
    agents: Agents,
    torchrun: &std::path::Path,
    exe: &std::path::Path,
    args: &[std::ffi::OsString],
) {
    use std::process::Command;
    let agent = |extra: &[String]| {
        let mut command = Command::new(torchrun);
        command.args(extra).arg("--no-python").arg(exe).args(args);
        command.env(launch::SPAWNED_VAR, "1").envs(launch::SAFETY_VARS);
        command
    };
    let mut commands = match agents {
        Agents::One => vec![agent(&["--standalone".into(), format!("--nproc-per-node={nproc}")])],
        Agents::OnePerRank => {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port for the agents' store")
                .port();
            (0..nproc)
                .map(|node| {
                    agent(&[
                        format!("--nnodes={nproc}"),
                        format!("--node-rank={node}"),
                        "--master-addr=127.0.0.1".into(),
                        format!("--master-port={port}"),
                        "--nproc-per-node=1".into(),
                    ])
                })
                .collect()
        }
    };
    let children: Vec<_> = commands
        .iter_mut()
        .map(|c| c.spawn().unwrap_or_else(|e| panic!("start {}: {e}", torchrun.display())))
        .collect();
    let failed: Vec<String> = children
        .into_iter()
        .enumerate()
        .filter_map(|(agent, mut child)| match child.wait() {
            Ok(status) if status.success() => None,
            Ok(status) => Some(format!("agent {agent}: {status}")),
            Err(e) => Some(format!("agent {agent}: {e}")),
        })
        .collect();
    assert!(failed.is_empty(), "{test} under torchrun: {failed:?}");
}
