//! Standard output kept for the JSON document of a `--json` run.
//!
//! NCCL writes its log to standard output (`NCCL_DEBUG=INFO`), and so may any library the process
//! loads. A `--json` run therefore moves the original standard output to a private descriptor
//! before NCCL is loaded, writes only the final document there, and points descriptor 1 at
//! standard error, so that every other write to it (NCCL's log, cudarc, stray prints) ends up on
//! standard error.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::FromRawFd;
use std::path::PathBuf;

use crate::error::{CliError, Result};

/// The original standard output, private to the final JSON document.
pub struct JsonStdout {
    /// A duplicate of descriptor 1 as it was, close-on-exec (ranks and probes never inherit it).
    file: File,
}

/// An error on standard output, as the `CliError` the commands report.
fn stdout_error(what: &'static str, source: io::Error) -> CliError {
    CliError::Io { what, path: PathBuf::from("standard output"), source }
}

impl JsonStdout {
    /// Keeps the current standard output for the document, then points descriptor 1 at standard
    /// error. Call it before anything can load NCCL.
    pub fn reserve() -> Result<JsonStdout> {
        // Whatever Rust buffered for descriptor 1 belongs before the switch.
        io::stdout().flush().map_err(|e| stdout_error("flushing", e))?;
        // SAFETY: F_DUPFD_CLOEXEC only adds a descriptor (the lowest free one from 3) to this
        // process's table, sharing descriptor 1's open file, with close-on-exec set atomically
        // (no other thread can fork and exec between the copy and the flag).
        let fd = unsafe { libc::fcntl(libc::STDOUT_FILENO, libc::F_DUPFD_CLOEXEC, 3) };
        if fd < 0 {
            return Err(stdout_error("keeping", io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created above and nothing else refers to it: the File owns it and
        // closes it once.
        let file = unsafe { File::from_raw_fd(fd) };
        // SAFETY: dup2 replaces descriptor 1 with a copy of descriptor 2; both are the process's
        // standard descriptors, which stay open for its whole life, and Rust's stdout handle
        // writes to descriptor 1 by number, so it follows.
        if unsafe { libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) } < 0 {
            return Err(stdout_error("redirecting", io::Error::last_os_error()));
        }
        Ok(JsonStdout { file })
    }

    /// Writes `doc`, pretty-printed, and a newline to the original standard output.
    pub fn write(mut self, doc: &serde_json::Value) -> Result<()> {
        writeln!(self.file, "{doc:#}").and_then(|()| self.file.flush()).map_err(|e| stdout_error("writing to", e))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// Set in the child process that runs the body of [`only_the_document_reaches_stdout`].
    const CHILD: &str = "GPUCOMM_TEST_JSON_STDOUT_CHILD";

    /// What the child writes to descriptor 1 after the switch, every way it can.
    const NOISE: [&str; 2] = ["noise through println", "noise written to descriptor 1"];

    #[test]
    fn only_the_document_reaches_stdout() {
        if std::env::var_os(CHILD).is_some() {
            let out = JsonStdout::reserve().unwrap();
            // SAFETY: F_GETFD reads the flags of a descriptor this process owns.
            let flags = unsafe { libc::fcntl(out.file.as_raw_fd(), libc::F_GETFD) };
            assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC, "the kept descriptor is close-on-exec");
            println!("{}", NOISE[0]);
            let raw = format!("{}\n", NOISE[1]);
            // SAFETY: writes the bytes of a live string to descriptor 1, as a C library would.
            let n = unsafe { libc::write(libc::STDOUT_FILENO, raw.as_ptr().cast(), raw.len()) };
            assert_eq!(n, raw.len() as isize);
            out.write(&serde_json::json!({ "run": 1 })).unwrap();
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let child = std::process::Command::new(exe)
            .args(["--exact", "json_stdout::tests::only_the_document_reaches_stdout", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let (stdout, stderr) =
            (String::from_utf8_lossy(&child.stdout).into_owned(), String::from_utf8_lossy(&child.stderr).into_owned());
        assert!(child.status.success(), "child failed:\n{stdout}\n{stderr}");
        // libtest announces the test before it runs; from the switch on, only the document.
        assert!(stdout.ends_with("{\n  \"run\": 1\n}\n"), "{stdout:?}");
        for noise in NOISE {
            assert!(!stdout.contains(noise), "{noise:?} reached stdout: {stdout:?}");
            assert!(stderr.contains(noise), "{noise:?} not on stderr: {stderr:?}");
        }
        assert!(stderr.contains("test result: ok"), "libtest's own later output follows descriptor 1: {stderr:?}");
    }
}
