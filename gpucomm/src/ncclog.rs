//! Reading NCCL's own log (`NCCL_DEBUG=INFO`, NCCL 2.18–2.28 formats, from NVIDIA/nccl
//! `src/debug.cc`, `src/transport/{p2p,shm,net}.cc`, `src/init.cc`, `src/enqueue.cc`,
//! `src/plugin/net.cc`, `src/transport/nvls.cc`): which transport each channel uses between which
//! ranks, which algorithm and protocol each call got, the network, GIN, NVLS, the environment
//! NCCL saw, its warnings.
//!
//! A line looks like `host:pid:tid [cudaDev] NCCL INFO <message>`; only the message matters here.

use std::collections::BTreeSet;

use serde::Serialize;

/// How two ranks are connected on one channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Transport {
    /// CUDA peer-to-peer (NVLink or PCIe): buffers mapped with cuMem, legacy IPC, or plain pointers
    /// within one process.
    P2p,
    /// Host shared memory.
    Shm,
    /// A network plugin (`NET/Socket`, `NET/IB`, …).
    Net,
    /// IB SHARP / CollNet.
    CollNet,
}

impl Transport {
    /// Short name as NCCL prints it.
    pub fn name(self) -> &'static str {
        match self {
            Transport::P2p => "P2P",
            Transport::Shm => "SHM",
            Transport::Net => "NET",
            Transport::CollNet => "COLLNET",
        }
    }
}

/// One `Channel … via …` line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Connection {
    /// Channel number.
    pub channel: u32,
    /// Sending rank.
    pub from_rank: usize,
    /// Sending rank's device (NVML index).
    pub from_dev: usize,
    /// Receiving rank.
    pub to_rank: usize,
    /// Receiving rank's device (NVML index).
    pub to_dev: usize,
    /// The transport family.
    pub transport: Transport,
    /// Everything after `via` (`P2P/CUMEM/read`, `SHM/direct/direct`, `NET/Socket/0`).
    pub detail: String,
}

/// One tuning decision (`NCCL_DEBUG_SUBSYS` with `TUNING`; printed by rank 0 for every call).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tuning {
    /// `AllReduce`, `Broadcast`, … (`SendRecv` calls are not tuned).
    pub function: String,
    /// Bytes of the call.
    pub bytes: u64,
    /// `Ring`, `Tree`, `NVLS`, `CollNetDirect`, `PAT`, or the kernel name of a symmetric kernel.
    pub algorithm: String,
    /// `LL`, `LL128`, `Simple` (empty for symmetric kernels).
    pub protocol: String,
}

/// The channel counts NCCL settled on (`N coll channels, … p2p channels per peer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Channels {
    /// Collective channels.
    pub coll: u32,
    /// NVLS channels (0 with NVLS off).
    pub nvls: u32,
    /// Point-to-point channels.
    pub p2p: u32,
}

/// What one or more NCCL logs say.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NcclLog {
    /// `NCCL version …` lines (more than one distinct value: two libraries wrote here).
    pub versions: BTreeSet<String>,
    /// Every channel connection.
    pub connections: Vec<Connection>,
    /// Channel counts, from the first communicator.
    pub channels: Option<Channels>,
    /// Tuning decisions, in order.
    pub tuning: Vec<Tuning>,
    /// `Using network …`.
    pub network: Option<String>,
    /// `Assigned GIN plugin …`.
    pub gin_plugin: Option<String>,
    /// `NET/IB : No device found.`
    pub ib_absent: bool,
    /// `NVLS multicast support is [not ]available`.
    pub nvls_available: Option<bool>,
    /// `NAME set by environment to VALUE`, as NCCL read them (a secret's value redacted, as
    /// [`crate::doctor::envvars::shown`] shows it).
    pub environment: Vec<(String, String)>,
    /// `P2P is disabled between connected GPUs …` and similar notes on P2P.
    pub p2p_notes: Vec<String>,
    /// `NCCL WARN` messages.
    pub warnings: Vec<String>,
}

impl NcclLog {
    /// Reads `text`, adding to what was read before (one log per rank).
    pub fn read(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(at) = line.find("NCCL version ") {
                let v = line[at + "NCCL version ".len()..].split_whitespace().next().unwrap_or("");
                if !v.is_empty() {
                    self.versions.insert(v.to_string());
                }
                continue;
            }
            if let Some((_, warn)) = line.split_once(" NCCL WARN ") {
                self.warnings.push(warn.trim().to_string());
                continue;
            }
            let Some((_, msg)) = line.split_once(" NCCL INFO ") else { continue };
            self.message(msg.trim());
        }
    }

    fn message(&mut self, msg: &str) {
        if let Some(c) = parse_connection(msg) {
            self.connections.push(c);
        } else if let Some(t) = parse_tuning(msg) {
            self.tuning.push(t);
        } else if let Some(c) = parse_channels(msg) {
            self.channels.get_or_insert(c);
        } else if let Some(net) = msg.strip_prefix("Using network ") {
            self.network.get_or_insert_with(|| net.trim().to_string());
        } else if let Some(gin) = msg.strip_prefix("Assigned GIN plugin ") {
            self.gin_plugin.get_or_insert_with(|| gin.trim_end_matches(" to comm").to_string());
        } else if msg.starts_with("NET/IB : No device found") {
            self.ib_absent = true;
        } else if let Some(rest) = msg.strip_prefix("NVLS multicast support is ") {
            self.nvls_available.get_or_insert(!rest.starts_with("not "));
        } else if let Some((name, value)) = msg.split_once(" set by environment to ") {
            // Kept as a report shows it: a secret's value redacted, as in the doctor's own list.
            let (name, value) = (name.trim(), value.trim().trim_end_matches('.').to_string());
            let pair = (name.to_string(), crate::doctor::envvars::shown(name, value));
            if !self.environment.contains(&pair) {
                self.environment.push(pair);
            }
        } else if msg.starts_with("P2P is disabled") || msg.starts_with("P2P plugin") {
            self.p2p_notes.push(msg.to_string());
        }
    }

    /// The distinct transports seen between the devices `a` and `b`, either direction, with the
    /// details (`P2P/CUMEM/read`), sorted.
    pub fn transports_between(&self, a: usize, b: usize) -> Vec<(Transport, String)> {
        let set: BTreeSet<(Transport, String)> = self
            .connections
            .iter()
            .filter(|c| (c.from_dev, c.to_dev) == (a, b) || (c.from_dev, c.to_dev) == (b, a))
            .map(|c| (c.transport, c.detail.clone()))
            .collect();
        set.into_iter().collect()
    }

    /// For each NCCL function (`AllReduce`), the `(algorithm, protocol)` pairs chosen, with the
    /// smallest and largest size each was chosen for, in size order.
    pub fn choices(&self, function: &str) -> Vec<(String, String, u64, u64)> {
        let mut out: Vec<(String, String, u64, u64)> = Vec::new();
        let mut calls: Vec<&Tuning> = self.tuning.iter().filter(|t| t.function == function).collect();
        calls.sort_by_key(|t| t.bytes);
        for t in calls {
            match out.iter_mut().find(|(a, p, _, _)| *a == t.algorithm && *p == t.protocol) {
                Some(entry) => {
                    entry.2 = entry.2.min(t.bytes);
                    entry.3 = entry.3.max(t.bytes);
                }
                None => out.push((t.algorithm.clone(), t.protocol.clone(), t.bytes, t.bytes)),
            }
        }
        out
    }
}

/// `Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`, `Channel 01 : 0[0] -> 1[1] via SHM/direct/direct`,
/// `Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0`.
fn parse_connection(msg: &str) -> Option<Connection> {
    let rest = msg.strip_prefix("Channel ")?;
    let (head, tail) = rest.split_once(" : ")?;
    let channel: u32 = head.split('/').next()?.trim().parse().ok()?;
    let (pair, via) = tail.split_once(" via ")?;
    let (from, to) = pair.split_once(" -> ")?;
    let to = to.split_whitespace().next()?; // drop "[send]" / "[receive]"
    let (from_rank, from_dev) = rank_dev(from.trim())?;
    let (to_rank, to_dev) = rank_dev(to)?;
    let detail = via.trim().to_string();
    let transport = match detail.split('/').next()? {
        "P2P" => Transport::P2p,
        "SHM" => Transport::Shm,
        "NET" => Transport::Net,
        "COLLNET" => Transport::CollNet,
        _ => return None,
    };
    Some(Connection { channel, from_rank, from_dev, to_rank, to_dev, transport, detail })
}

/// `3[1]` → (3, 1).
fn rank_dev(s: &str) -> Option<(usize, usize)> {
    let (rank, dev) = s.strip_suffix(']')?.split_once('[')?;
    Some((rank.parse().ok()?, dev.parse().ok()?))
}

/// `AllReduce: 1048576 Bytes -> Algo Ring proto LL128 channel{Lo..Hi}={0..15}` and
/// `AllReduce [Symmetric]: 1024 Bytes -> Kernel AllReduce_AGxLL_R nchannels 2 …`.
fn parse_tuning(msg: &str) -> Option<Tuning> {
    let (function, rest) = msg.split_once(": ")?;
    let (bytes, decision) = rest.split_once(" Bytes -> ")?;
    let bytes = bytes.trim().parse().ok()?;
    let words: Vec<&str> = decision.split_whitespace().collect();
    let after = |key: &str| words.iter().position(|w| w.eq_ignore_ascii_case(key)).and_then(|i| words.get(i + 1));
    let (algorithm, protocol) = match (after("Algo"), after("Kernel")) {
        (Some(a), _) => (a.to_string(), after("proto")?.to_string()),
        (None, Some(k)) => (format!("symmetric kernel {k}"), String::new()),
        (None, None) => return None,
    };
    let function = function.trim_end_matches(" [Symmetric]").trim().to_string();
    Some(Tuning { function, bytes, algorithm, protocol })
}

/// `2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer`.
fn parse_channels(msg: &str) -> Option<Channels> {
    let mut coll = None;
    let mut nvls = None;
    let mut p2p = None;
    for part in msg.split(", ") {
        let (n, what) = part.split_once(' ')?;
        let n: u32 = n.parse().ok()?;
        match what {
            "coll channels" => coll = Some(n),
            "nvls channels" => nvls = Some(n),
            "p2p channels" => p2p = Some(n),
            _ => {}
        }
    }
    Some(Channels { coll: coll?, nvls: nvls.unwrap_or(0), p2p: p2p.unwrap_or(0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks on two NVLink-connected H200s, one process each (NCCL 2.28 formats).
    const NVLINK: &str = "\
vm:41213:41213 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:41213:41213 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm:41213:41290 [0] NCCL INFO Using network Socket
vm:41213:41290 [0] NCCL INFO NET/IB : No device found.
vm:41213:41290 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>
vm:41213:41290 [0] NCCL INFO NVLS multicast support is not available on dev 0 (NVLS_NCHANNELS 0)
vm:41213:41290 [0] NCCL INFO Channel 00/24 :    0   1
vm:41213:41290 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
vm:41213:41291 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
vm:41213:41291 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
vm:41214:41292 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
vm:41213:41213 [0] NCCL INFO AllReduce: 8 Bytes -> Algo Ring proto LL channel{Lo..Hi}={0..0}
vm:41213:41213 [0] NCCL INFO AllReduce: 65536 Bytes -> Algo Ring proto LL channel{Lo..Hi}={0..3}
vm:41213:41213 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo Ring proto LL128 channel{Lo..Hi}={0..15}
vm:41213:41213 [0] NCCL INFO AllReduce: 268435456 Bytes -> Algo Ring proto Simple channel{Lo..Hi}={0..23}
vm:41213:41213 [0] NCCL INFO AllReduce [Symmetric]: 4096 Bytes -> Kernel AllReduce_AGxLL_R nchannels 2 nthreads 512 nWorks 1
";

    /// The same job with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: sockets, and an older SHM line format.
    const SOCKETS: &str = "\
vm:51000:51000 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:51000:51000 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1.
vm:51000:51000 [0] NCCL INFO NCCL_SHM_DISABLE set by environment to 1.
vm:51000:51050 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0
vm:51000:51050 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0
vm:51000:51050 [0] NCCL INFO Channel 02 : 0[0] -> 1[1] via SHM/direct/direct
vm:51000:51050 [0] NCCL INFO Channel 03/1 : 0[0] -> 1[1] via P2P/IPC/read
vm:51000:51050 [0] NCCL INFO Channel 04/0 : 2[2] -> 3[3] [send] via NET/IB/0/GDRDMA
vm:51000:51050 [0] NCCL INFO Assigned GIN plugin IB to comm
vm:51000:51050 [0] misc/socket.cc:50 NCCL WARN socket timeout
";

    #[test]
    fn transports_per_pair() {
        let mut log = NcclLog::default();
        log.read(NVLINK);
        assert_eq!(log.versions.iter().collect::<Vec<_>>(), ["2.28.9+cuda13.0"]);
        assert_eq!(log.connections.len(), 3, "the ring line 'Channel 00/24 :    0   1' is not a connection");
        assert_eq!(log.transports_between(0, 1), [(Transport::P2p, "P2P/CUMEM/read".to_string())]);
        assert_eq!(log.transports_between(1, 0), log.transports_between(0, 1));
        assert!(log.transports_between(0, 2).is_empty());
        assert_eq!(log.channels, Some(Channels { coll: 24, nvls: 0, p2p: 32 }));
        assert_eq!(log.network.as_deref(), Some("Socket"));
        assert!(log.ib_absent);
        assert_eq!(log.gin_plugin, None);
        assert_eq!(log.nvls_available, Some(false));
        assert_eq!(log.environment, [("NCCL_NVLS_ENABLE".to_string(), "0".to_string())]);
    }

    #[test]
    fn algorithms_and_protocols() {
        let mut log = NcclLog::default();
        log.read(NVLINK);
        let c = log.choices("AllReduce");
        assert_eq!(
            c,
            [
                ("Ring".to_string(), "LL".to_string(), 8, 65536),
                ("symmetric kernel AllReduce_AGxLL_R".to_string(), String::new(), 4096, 4096),
                ("Ring".to_string(), "LL128".to_string(), 1 << 20, 1 << 20),
                ("Ring".to_string(), "Simple".to_string(), 1 << 28, 1 << 28),
            ]
        );
        // Older releases print upper-case names.
        let t = parse_tuning("AllReduce: 1024 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}").unwrap();
        assert_eq!((t.algorithm.as_str(), t.protocol.as_str()), ("RING", "LL"));
    }

    #[test]
    fn sockets_shm_ipc_ib_and_warnings() {
        let mut log = NcclLog::default();
        log.read(SOCKETS);
        let t = log.transports_between(0, 1);
        assert_eq!(
            t,
            [
                (Transport::P2p, "P2P/IPC/read".to_string()),
                (Transport::Shm, "SHM/direct/direct".to_string()),
                (Transport::Net, "NET/Socket/0".to_string()),
            ]
        );
        assert_eq!(log.transports_between(2, 3), [(Transport::Net, "NET/IB/0/GDRDMA".to_string())]);
        assert_eq!(log.gin_plugin.as_deref(), Some("IB"));
        assert_eq!(log.warnings, ["socket timeout"]);
        assert!(log.environment.contains(&("NCCL_P2P_DISABLE".to_string(), "1".to_string())));
    }

    /// Session 29 audit: the variables NCCL logged went into `doctor --json` as logged, a
    /// secret's value included, while the doctor's own list redacted it.
    #[test]
    fn a_secret_nccl_logged_is_redacted() {
        let mut log = NcclLog::default();
        log.read("h:1:1 [0] NCCL INFO NCCL_IB_PKEY set by environment to 7.\nh:1:1 [0] NCCL INFO NCCL_FOO_TOKEN set by environment to s3cret.\n");
        assert_eq!(
            log.environment,
            [
                ("NCCL_IB_PKEY".to_string(), "<redacted, 1 bytes>".to_string()),
                ("NCCL_FOO_TOKEN".to_string(), "<redacted, 6 bytes>".to_string())
            ]
        );
    }

    #[test]
    fn two_libraries_in_one_log() {
        let mut log = NcclLog::default();
        log.read(NVLINK);
        log.read("vm:41213:41213 [0] NCCL INFO NCCL version 2.28.3+cuda13.0\n");
        assert_eq!(log.versions.len(), 2);
    }
}
