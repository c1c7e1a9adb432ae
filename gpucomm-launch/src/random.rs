//! Random bytes from the operating system, for job keys, tokens and nonces.

use std::fs::File;
use std::io::{self, Read};

/// Fills `buf` with random bytes from the kernel: `getrandom(2)`, which needs no file
/// descriptor (so it works when a flood of connections has used them all up), or
/// `/dev/urandom` where that call does not exist. There is no weaker fallback: a caller that
/// cannot get random bytes fails.
pub(crate) fn fill(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: getrandom(2) writes at most `rest.len()` bytes into `rest`, a live, exclusively
        // borrowed slice, and keeps no pointer to it.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(n) {
            Ok(n) => filled += n,
            Err(_) => {
                let error = io::Error::last_os_error();
                match error.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::ENOSYS) => return File::open("/dev/urandom")?.read_exact(rest),
                    _ => return Err(error),
                }
            }
        }
    }
    Ok(())
}

/// `bytes` random bytes as lowercase hex digits.
pub(crate) fn hex(bytes: usize) -> io::Result<String> {
    let mut raw = vec![0u8; bytes];
    fill(&mut raw)?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_bytes_differ() {
        let (a, b) = (super::hex(16).unwrap(), super::hex(16).unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
