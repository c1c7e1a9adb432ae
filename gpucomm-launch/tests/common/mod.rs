//! Helpers of the rendezvous tests: ranks as threads on loopback, ports found free at run time,
//! and TCP proxies that record or slow down what a store sends.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use gpucomm_launch::store::StoreClient;
use gpucomm_launch::{
    JobIdentity, JobKey, Launcher, Master, Options, RankInfo, Rendezvous, RendezvousError, StoreMode,
};
use sha2::{Digest, Sha256};

pub const SECOND: Duration = Duration::from_secs(1);

/// This process's resident memory, in bytes (`VmRSS` of /proc/self/status).
pub fn resident() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Rank `rank` of `world_size` with the job identity `token` (give each test its own).
pub fn info(rank: usize, world_size: usize, port: u16, token: &str) -> RankInfo {
    let mut info = RankInfo::single();
    info.rank = rank;
    info.world_size = world_size;
    info.local_rank = rank;
    info.local_world_size = world_size;
    info.master = Some(Master { addr: "127.0.0.1".into(), port });
    info.launcher = Launcher::Torchrun;
    info.job_identity = Some(JobIdentity { value: token.into(), source: "GPUCOMM_JOB_TOKEN" });
    info
}

/// Rank `rank` of `world_size` as torchrun starts it under its agent's store at
/// `127.0.0.1:port`, read from the variables torchrun sets (with `GPUCOMM_JOB_TOKEN=token` when
/// given).
pub fn torchrun_worker(
    rank: usize,
    world_size: usize,
    port: u16,
    run_id: &str,
    restart_count: u32,
    token: Option<&str>,
) -> RankInfo {
    let mut vars = vec![
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world_size.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", world_size.to_string()),
        ("GROUP_RANK", "0".into()),
        ("ROLE_RANK", rank.to_string()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("TORCHELASTIC_RUN_ID", run_id.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", restart_count.to_string()),
        ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
    ];
    vars.extend(token.map(|t| ("GPUCOMM_JOB_TOKEN", t.to_string())));
    RankInfo::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone())).unwrap()
}

pub fn options(seconds: f64) -> Options {
    Options::default().with_timeout(Duration::from_secs_f64(seconds))
}

pub fn keyed(seconds: f64, key: &str) -> Options {
    options(seconds).with_job_key(JobKey::new(key.as_bytes().to_vec()).unwrap())
}

pub fn external(seconds: f64) -> Options {
    options(seconds).with_store(StoreMode::External)
}

/// Runs `then` on a rendezvous of rank `info.rank`, on a thread of its own.
pub fn spawn<T: Send + 'static>(
    info: RankInfo,
    options: Options,
    then: impl FnOnce(Rendezvous) -> Result<T, RendezvousError> + Send + 'static,
) -> thread::JoinHandle<Result<T, RendezvousError>> {
    thread::spawn(move || Rendezvous::connect(&info, &options).and_then(then))
}

/// 128 bytes that differ from run to run, as a unique id would.
pub fn make_id() -> Result<Vec<u8>, String> {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u8;
    Ok((0..128u32).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect())
}

/// The store key prefix of a job's `instance`-th rendezvous, as the crate documents it: a
/// hash of the identity, so a test (or an attacker: the identity is no secret) can compute it.
pub fn prefix(token: &str, instance: u64) -> String {
    let digest = Sha256::new().chain_update(b"gpucomm job scope\0").chain_update(token.as_bytes()).finalize();
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("/gpucomm/v1/{hash}/{instance}")
}

/// A claim record without a MAC, in the documented layout (what a process without the key can
/// write).
pub fn forged_claim(rank: u32, world_size: u32, host: &str, addr: &str) -> Vec<u8> {
    let mut bytes = b"gpcm2C".to_vec();
    for v in [rank, world_size, 999] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    for text in [host, addr] {
        bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
    }
    // The nonce, the start's random value (zeros: what a claim without a key carries), then the
    // holder's boot id, PID namespace and start time (none).
    bytes.extend_from_slice(&[7; 16]);
    bytes.extend_from_slice(&[0; 16]);
    bytes.extend_from_slice(&[0; 2 + 8 + 8]);
    bytes.push(0);
    bytes
}

/// A client of the store at `port`, retrying until it is up.
pub fn store_client(port: u16) -> StoreClient {
    StoreClient::connect("127.0.0.1", port, 10 * SECOND).unwrap()
}

/// Waits until `cond` holds (at most 10 s).
pub fn until(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + 10 * SECOND;
    while !cond() {
        assert!(Instant::now() < deadline, "condition not met within 10 s");
        thread::sleep(Duration::from_millis(10));
    }
}

/// A TCP proxy in front of a store: records every byte the store sends, and, once `trickle`
/// is set, passes them on one byte every 1.5 s (under a 2 s deadline, so that a timeout of each
/// read never fires; the whole of any reply takes longer than twice the deadline).
pub struct Proxy {
    pub port: u16,
    pub from_store: Arc<Mutex<Vec<u8>>>,
    pub trickle: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(store_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let from_store = Arc::new(Mutex::new(Vec::new()));
        let trickle = Arc::new(AtomicBool::new(false));
        let (record, slow) = (from_store.clone(), trickle.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(store) = TcpStream::connect(("127.0.0.1", store_port)) else { continue };
                let _ = client.set_nodelay(true);
                let _ = store.set_nodelay(true);
                pipe(client.try_clone().unwrap(), store.try_clone().unwrap(), None, None);
                pipe(store, client, Some(record.clone()), Some(slow.clone()));
            }
        });
        Proxy { port, from_store, trickle }
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, record: Option<Arc<Mutex<Vec<u8>>>>, slow: Option<Arc<AtomicBool>>) {
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(record) = &record {
                record.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            if slow.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
                for byte in &buf[..n] {
                    thread::sleep(Duration::from_millis(1500));
                    if to.write_all(&[*byte]).is_err() {
                        return;
                    }
                }
            } else if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
