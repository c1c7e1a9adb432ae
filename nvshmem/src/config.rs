//! The few NVSHMEM variables this crate reads itself, parsed exactly as NVSHMEM parses them
//! (3.4.5 `env_defs_internal.h`), so that both sides agree on what they mean.

/// A boolean option: NVSHMEM treats a set variable as true unless it starts with `0`, `n`/`N` or
/// `f`/`F` (an empty value is true).
pub(crate) fn flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| parse_flag(&v.to_string_lossy()))
}

fn parse_flag(value: &str) -> bool {
    !value.starts_with(['0', 'n', 'N', 'f', 'F'])
}

/// A size option such as `NVSHMEM_SYMMETRIC_SIZE`: a number with an optional `k`/`m`/`g`/`t`
/// suffix (powers of 1024). `None` when unset; `Some(None)` when set but unreadable (NVSHMEM then
/// fails to initialise).
pub(crate) fn size(name: &str) -> Option<Option<usize>> {
    std::env::var(name).ok().map(|v| parse_size(&v))
}

fn parse_size(value: &str) -> Option<usize> {
    let value = value.trim();
    let (number, shift) = match value.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_lowercase() {
                'k' => 10,
                'm' => 20,
                'g' => 30,
                't' => 40,
                _ => return None,
            };
            (&value[..i], shift)
        }
        _ => (value, 0),
    };
    let n: f64 = number.parse().ok().filter(|n: &f64| *n >= 0.0)?;
    let bytes = (n * (1u64 << shift) as f64).ceil();
    (bytes <= usize::MAX as f64).then_some(bytes as usize)
}

/// A string option, `None` when unset.
pub(crate) fn string(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_nvshmem() {
        for yes in ["1", "y", "true", "", "on"] {
            assert!(parse_flag(yes), "{yes:?}");
        }
        for no in ["0", "n", "No", "false", "F"] {
            assert!(!parse_flag(no), "{no:?}");
        }
    }

    #[test]
    fn sizes_follow_nvshmem() {
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("1.5k"), Some(1536));
        assert_eq!(parse_size("256G"), Some(256 << 30));
        assert_eq!(parse_size("1x"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size(""), None);
    }
}
