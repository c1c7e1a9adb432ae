//! NVLink multicast stays off: the three variables of `gpucomm_launch::SAFETY_VARS` are put into
//! this process's environment before any NCCL or NVSHMEM library is loaded, so they hold here and
//! in every process started from here (the spawner sets them again for its ranks). A different
//! value the user had set is replaced, and reported: this tool never requests multicast.

use gpucomm_launch::SAFETY_VARS;

/// A safety variable that did not have its safe value in the user's environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overridden {
    /// The variable.
    pub name: &'static str,
    /// The user's value (`None`: unset).
    pub was: Option<String>,
    /// The value in force now.
    pub now: &'static str,
}

/// Sets the safety variables in this process; returns those that were unset or different.
///
/// Call it first thing in `main`, while the process has a single thread (setting the environment
/// while other threads read it is a data race in glibc).
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

/// The one-line warning for values the user had set differently, if any.
pub fn warning(replaced: &[Overridden]) -> Option<String> {
    let list: Vec<String> = replaced
        .iter()
        .filter_map(|o| o.was.as_ref().map(|was| format!("{}={} (was {was:?})", o.name, o.now)))
        .collect();
    if list.is_empty() {
        return None;
    }
    Some(format!("gpucomm never enables NVLink multicast: using {}", list.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warning_names_old_and_new_values() {
        assert_eq!(warning(&[]), None);
        assert_eq!(warning(&[Overridden { name: "NVSHMEM_DISABLE_NVLS", was: None, now: "1" }]), None);
        let w = warning(&[Overridden { name: "NCCL_NVLS_ENABLE", was: Some("1".into()), now: "0" }]).unwrap();
        assert_eq!(w, "gpucomm never enables NVLink multicast: using NCCL_NVLS_ENABLE=0 (was \"1\")");
    }
}
