//! NVLink multicast stays off: [`SAFETY_VARS`] turn it off in NCCL, NVSHMEM and PyTorch's
//! symmetric memory, and [`enforce`] puts them into this process's environment before any of
//! those libraries is loaded, so that they hold here and in every process started from here.
//!
//! On machines whose GPUs share an NVSwitch, NCCL (NVLS) and NVSHMEM use NVLink multicast by
//! default; on shared machines a multicast object left behind can take GPUs out of service. These
//! crates never request it: [`run_main`](crate::run_main) and the spawner set the variables for
//! every rank, and the `gpucomm` tool and the course's lessons do the same.

/// The variables that turn NVLink multicast off, with their safe values: they override the
/// caller's environment in every spawned rank, and [`enforce`] sets them in this process.
pub const SAFETY_VARS: [(&str, &str); 3] =
    [("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")];

/// A safety variable that did not have its safe value in the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overridden {
    /// The variable.
    pub name: &'static str,
    /// The value it had (`None`: unset).
    pub was: Option<String>,
    /// The value in force now.
    pub now: &'static str,
}

/// Sets [`SAFETY_VARS`] in this process; returns those that were unset or different.
///
/// Call it first thing in `main`, while the process has a single thread (setting the environment
/// while other threads read it is a data race in glibc), and before NCCL or NVSHMEM is loaded.
pub fn enforce() -> Vec<Overridden> {
    let mut replaced = Vec::new();
    for (name, value) in SAFETY_VARS {
        let was = std::env::var(name).ok();
        if was.as_deref() == Some(value) {
            continue;
        }
        replaced.push(Overridden { name, was, now: value });
        std::env::set_var(name, value);
    }
    replaced
}

/// [`enforce`], with the [`warning`] (if any) on stderr as a `note:` line: what
/// [`run_main`](crate::run_main) does first, for a `main` that does not go through it.
pub fn enforce_with_note() {
    if let Some(warning) = warning(&enforce()) {
        eprintln!("note: {warning}");
    }
}

/// The one-line warning for values that were set differently before [`enforce`], if any (an
/// unset variable needs no warning).
pub fn warning(replaced: &[Overridden]) -> Option<String> {
    let list: Vec<String> = replaced
        .iter()
        .filter_map(|o| o.was.as_ref().map(|was| format!("{}={} (was {was:?})", o.name, o.now)))
        .collect();
    if list.is_empty() {
        return None;
    }
    Some(format!("NVLink multicast stays off: using {}", list.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warning_names_old_and_new_values() {
        assert_eq!(warning(&[]), None);
        assert_eq!(warning(&[Overridden { name: "NVSHMEM_DISABLE_NVLS", was: None, now: "1" }]), None);
        let w = warning(&[Overridden { name: "NCCL_NVLS_ENABLE", was: Some("1".into()), now: "0" }]).unwrap();
        assert_eq!(w, "NVLink multicast stays off: using NCCL_NVLS_ENABLE=0 (was \"1\")");
    }
}
