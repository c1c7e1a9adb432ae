//! Environment variables that change which path NCCL (or NVSHMEM) takes, and what each one's
//! current value does.

/// True for a value NCCL reads as "on" (a non-zero integer).
fn on(value: &str) -> bool {
    value.trim().parse::<i64>().is_ok_and(|v| v != 0)
}

/// What `name=value` does, for the variables the doctor knows; `None` for others.
pub fn meaning(name: &str, value: &str) -> Option<String> {
    let v = value.trim();
    Some(match name {
        "NCCL_P2P_DISABLE" if on(v) => {
            "CUDA P2P (NVLink or PCIe peer access) is off: NCCL goes through SHM or the network".into()
        }
        "NCCL_P2P_DISABLE" => "P2P allowed (the default)".into(),
        "NCCL_P2P_LEVEL" => match v.to_ascii_uppercase().as_str() {
            "LOC" | "0" => "P2P never used".into(),
            level => format!("P2P only between GPUs whose path is at most {level} (NVL, PIX, PXB, PHB, SYS)"),
        },
        "NCCL_SHM_DISABLE" if on(v) => {
            "shared-memory transport off: ranks on one node that cannot use P2P talk over the network".into()
        }
        "NCCL_SHM_DISABLE" => "shared memory allowed (the default)".into(),
        "NCCL_IB_DISABLE" if on(v) => "InfiniBand/RoCE off: NCCL's network transport is TCP sockets".into(),
        "NCCL_IB_DISABLE" => "InfiniBand/RoCE allowed (the default)".into(),
        "NCCL_NET" => format!("network transport forced to {v:?} (IB, Socket, or a plugin's name)"),
        "NCCL_NET_PLUGIN" => format!("network plugin library {v:?} (\"none\" uses only NCCL's own)"),
        "NCCL_SOCKET_IFNAME" => format!("bootstrap and socket traffic use network interfaces {v:?}"),
        "NCCL_ALGO" if v.to_ascii_uppercase().contains("NVLS") && !v.starts_with('^') => {
            format!(
                "algorithms restricted to {v:?} — this asks for NVLink multicast (NVLS); never set it on shared GPUs"
            )
        }
        "NCCL_ALGO" => format!("algorithms restricted to {v:?} (Ring, Tree, CollNet*, NVLS*, PAT; ^X excludes)"),
        "NCCL_PROTO" => format!("protocols restricted to {v:?} (LL, LL128, Simple; ^X excludes)"),
        "NCCL_NVLS_ENABLE" if v == "0" => "NVLink SHARP (multicast) off".into(),
        "NCCL_NVLS_ENABLE" => {
            "NVLink SHARP (multicast) allowed or forced — gpucomm sets it to 0 for its own processes".into()
        }
        "NCCL_CUMEM_ENABLE" if v == "0" => {
            "cuMem off: P2P buffers shared through legacy CUDA IPC (P2P/IPC), no symmetric memory".into()
        }
        "NCCL_CUMEM_ENABLE" => "cuMem on (P2P/CUMEM; the default since NCCL 2.19)".into(),
        "NCCL_P2P_USE_CUDA_MEMCPY" if on(v) => "P2P copies through the copy engines (P2P/…/CE)".into(),
        "NCCL_P2P_DIRECT_DISABLE" if on(v) => "GPUs of one process do not use each other's pointers directly".into(),
        "NCCL_P2P_READ_ENABLE" => format!("P2P read mode {}", if on(v) { "on" } else { "off" }),
        "NCCL_HOSTID" => format!(
            "host id {v:?}: ranks with different host ids count as different nodes and connect over the network"
        ),
        "NCCL_COLLNET_ENABLE" => format!("CollNet (IB SHARP) {}", if on(v) { "on" } else { "off" }),
        "NCCL_MIN_NCHANNELS" | "NCCL_MAX_NCHANNELS" | "NCCL_MIN_CTAS" | "NCCL_MAX_CTAS" => {
            format!("channel (CTA) count bounded to {v}: fewer channels, less bandwidth")
        }
        "NCCL_NTHREADS" => format!("{v} threads per CTA"),
        "NCCL_BUFFSIZE" => format!("{v}-byte buffers per channel and protocol"),
        "NCCL_TOPO_FILE" => format!("topology read from {v:?} instead of detected"),
        "NCCL_GRAPH_FILE" => format!("channel graphs read from {v:?} instead of searched"),
        "NCCL_RUNTIME_CONNECT" if v == "0" => "all connections made at init instead of at first use".into(),
        "NCCL_COMM_ID" => format!("bootstrap root fixed at {v:?}"),
        "NCCL_IGNORE_DISABLED_P2P" => "NCCL does not warn when P2P is disabled between connected GPUs".into(),
        "NCCL_DEBUG" => format!("NCCL log level {v}"),
        "NCCL_DEBUG_SUBSYS" => format!("NCCL log subsystems {v}"),
        "NCCL_DEBUG_FILE" => format!("NCCL log written to {v:?}"),
        "NCCL_SYS_LIBRARY" | "NCCL_LIB_DIR" | "NCCL_HOME" => format!("gpucomm-rs loads NCCL from {v:?} first"),
        "NVSHMEM_SYS_LIBRARY" | "NVSHMEM_LIB_DIR" | "NVSHMEM_HOME" => {
            format!("gpucomm-rs loads NVSHMEM from {v:?} first")
        }
        "NVSHMEM_DISABLE_NVLS" if on(v) => "NVSHMEM multicast off".into(),
        "NVSHMEM_DISABLE_NVLS" => {
            "NVSHMEM may use NVLink multicast — gpucomm sets it to 1 for its own processes".into()
        }
        "NVSHMEM_DISABLE_P2P" if on(v) => "NVSHMEM P2P off: peers are not load/store reachable".into(),
        "NVSHMEM_DISABLE_NCCL" if on(v) => "NVSHMEM does not load NCCL for its collectives".into(),
        "NVSHMEM_DISABLE_CUDA_VMM" if on(v) => "NVSHMEM uses the static heap instead of CUDA VMM".into(),
        "NVSHMEM_SYMMETRIC_SIZE" => format!("symmetric heap of {v}"),
        "NVSHMEM_REMOTE_TRANSPORT" => format!("NVSHMEM's network transport is {v:?}"),
        "NVSHMEM_BOOTSTRAP" => format!("NVSHMEM bootstraps through {v:?}"),
        "NVSHMEM_DEBUG" => format!("NVSHMEM log level {v}"),
        "TORCH_SYMM_MEM_DISABLE_MULTICAST" if on(v) => "PyTorch symmetric memory does not use multicast".into(),
        "LD_LIBRARY_PATH" => "the dynamic loader searches it before the ldconfig cache for libnccl.so.2 and \
                              libnvshmem_host.so.3 (programs linked with them, PyTorch, NVSHMEM's own dlopen of \
                              libnccl.so.2); gpucomm-rs gets there only after X_SYS_LIBRARY, X_LIB_DIR, X_HOME, the \
                              directory its build used and GPUCOMM_PREFIX (X = NCCL, NVSHMEM) found nothing"
            .into(),
        "LD_PRELOAD" => "loaded into every process first (an NCCL here wins over every other)".into(),
        "CUDA_VISIBLE_DEVICES" => format!("only GPUs {v} are visible to CUDA (and renumbered from 0)"),
        "CUDA_DEVICE_ORDER" => format!("CUDA numbers GPUs in {v} order"),
        _ => return None,
    })
}

/// True for variables the doctor lists whatever their value.
fn listed(name: &str) -> bool {
    name.starts_with("NCCL_")
        || name.starts_with("NVSHMEM_")
        || name.starts_with("TORCH_SYMM_MEM_")
        || meaning(name, "").is_some()
}

/// The variables `gpucomm-launch` reads to find a job's ranks (torchrun, Open MPI, MPICH's PMI,
/// Slurm), which `gpucomm bench` and the doctor's live layer follow.
const LAUNCHER_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "PMI_RANK",
    "PMI_SIZE",
    "PMI_FD",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "SLURM_PROCID",
    "SLURM_NODEID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_GPUS_PER_TASK",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_NODELIST",
];

/// Words that mark a variable's value as a secret (case-insensitive): its value is never shown.
const SECRET_WORDS: [&str; 5] = ["KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"];

/// True for the variables the doctor reasons about, the only ones its report carries: those it
/// lists ([`relevant`]), every `CUDA_*` and `GPUCOMM_*` variable, and the launcher variables.
pub fn kept(name: &str) -> bool {
    listed(name) || name.starts_with("CUDA_") || name.starts_with("GPUCOMM_") || LAUNCHER_VARS.contains(&name)
}

/// `value` as a report may show it: `<redacted, N bytes>` when `name` marks it as a secret
/// (`GPUCOMM_JOB_KEY`, `…_TOKEN`, `…_PASSWORD`, …), else unchanged.
pub fn shown(name: &str, value: String) -> String {
    let upper = name.to_ascii_uppercase();
    if SECRET_WORDS.iter().any(|w| upper.contains(w)) {
        format!("<redacted, {} bytes>", value.len())
    } else {
        value
    }
}

/// The variables of `vars` worth showing, sorted, with what each does (or a note that the doctor
/// does not know it).
pub fn relevant(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = vars
        .into_iter()
        .filter(|(n, _)| listed(n))
        .map(|(n, v)| {
            let m = meaning(&n, &v)
                .unwrap_or_else(|| "set (not one the doctor explains; see the NCCL/NVSHMEM environment docs)".into());
            (n, v, m)
        })
        .collect();
    out.sort();
    out
}

/// Why NCCL would not use P2P or SHM between GPUs of one node, from the environment, as
/// `NAME=value (meaning)` phrases.
pub fn transport_reasons(get: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut say = |name: &str, value: String| {
        if let Some(m) = meaning(name, &value) {
            out.push(format!("{name}={value} ({m})"));
        }
    };
    for name in ["NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"] {
        if let Some(v) = get(name).filter(|v| on(v)) {
            say(name, v);
        }
    }
    if let Some(v) = get("NCCL_P2P_LEVEL") {
        say("NCCL_P2P_LEVEL", v);
    }
    for name in ["NCCL_HOSTID", "NCCL_NET", "NCCL_TOPO_FILE", "NCCL_GRAPH_FILE"] {
        if let Some(v) = get(name) {
            say(name, v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meanings_follow_values() {
        assert!(meaning("NCCL_P2P_DISABLE", "1").unwrap().starts_with("CUDA P2P"));
        assert_eq!(meaning("NCCL_P2P_DISABLE", "0").unwrap(), "P2P allowed (the default)");
        assert!(meaning("NCCL_ALGO", "Ring,NVLS").unwrap().contains("multicast"));
        assert!(!meaning("NCCL_ALGO", "^NVLS").unwrap().contains("multicast"));
        assert_eq!(meaning("NCCL_NVLS_ENABLE", "0").unwrap(), "NVLink SHARP (multicast) off");
        assert_eq!(meaning("HOME", "/root"), None);
        // gpucomm's own loader reaches LD_LIBRARY_PATH only at the soname step, after these.
        let ld = meaning("LD_LIBRARY_PATH", "/opt/nccl/lib").unwrap();
        let order = ["X_SYS_LIBRARY", "X_LIB_DIR", "X_HOME", "the directory its build used", "GPUCOMM_PREFIX"];
        let at: Vec<usize> = order.iter().map(|w| ld.find(w).unwrap_or_else(|| panic!("{w} not in {ld:?}"))).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{ld}");
        assert!(ld.starts_with("the dynamic loader searches it before the ldconfig cache"), "{ld}");
    }

    #[test]
    fn relevant_lists_nccl_and_nvshmem_vars_and_unknown_ones() {
        let vars = [
            ("HOME", "/root"),
            ("NCCL_SHM_DISABLE", "1"),
            ("NCCL_FOO", "x"),
            ("CUDA_VISIBLE_DEVICES", "1,0"),
            ("NVSHMEM_DISABLE_NVLS", "1"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()));
        let r = relevant(vars);
        let names: Vec<&str> = r.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["CUDA_VISIBLE_DEVICES", "NCCL_FOO", "NCCL_SHM_DISABLE", "NVSHMEM_DISABLE_NVLS"]);
        assert!(r[1].2.starts_with("set (not one the doctor explains"));
    }

    #[test]
    fn only_the_variables_the_doctor_reasons_about_are_kept() {
        for name in [
            "NCCL_DEBUG",
            "NVSHMEM_BOOTSTRAP",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "CUDA_HOME",
            "LD_LIBRARY_PATH",
            "LD_PRELOAD",
            "GPUCOMM_JOB_KEY",
            "MASTER_PORT",
            "OMPI_COMM_WORLD_RANK",
            "SLURM_PROCID",
        ] {
            assert!(kept(name), "{name}");
        }
        for name in ["HOME", "PATH", "MY_API_TOKEN", "AWS_SECRET_ACCESS_KEY", "SLURM_JOB_ACCOUNT", "RANKING"] {
            assert!(!kept(name), "{name}");
        }
    }

    #[test]
    fn secret_values_are_redacted_with_their_length() {
        assert_eq!(shown("GPUCOMM_JOB_KEY", "0123456789abcdef".into()), "<redacted, 16 bytes>");
        assert_eq!(shown("NCCL_IB_Token", "t".into()), "<redacted, 1 bytes>");
        assert_eq!(shown("MY_SECRET", String::new()), "<redacted, 0 bytes>");
        assert_eq!(shown("DB_PASSWORD", "pw".into()), "<redacted, 2 bytes>");
        assert_eq!(shown("GCP_CREDENTIALS", "{}".into()), "<redacted, 2 bytes>");
        assert_eq!(shown("NCCL_DEBUG", "INFO".into()), "INFO");
    }

    #[test]
    fn reasons_for_leaving_p2p() {
        let env = |n: &str| match n {
            "NCCL_P2P_DISABLE" => Some("1".to_string()),
            "NCCL_SHM_DISABLE" => Some("1".to_string()),
            _ => None,
        };
        let r = transport_reasons(env);
        assert_eq!(r.len(), 2);
        assert!(r[0].starts_with("NCCL_P2P_DISABLE=1 (CUDA P2P"));
        assert!(r[1].starts_with("NCCL_SHM_DISABLE=1 (shared-memory transport off"));
        assert!(transport_reasons(|_| None).is_empty());
        assert_eq!(transport_reasons(|n| (n == "NCCL_P2P_DISABLE").then(|| "0".into())), Vec::<String>::new());
    }
}
