//! [`Options`]: the rendezvous's time limit, job identity override, job key and store.

use std::fmt;
use std::time::Duration;

use super::RendezvousError;
use crate::deadline::secs;
use crate::store::Limits;

/// The variable holding the rendezvous timeout in seconds (fractions allowed).
pub const TIMEOUT_VAR: &str = "GPUCOMM_RENDEZVOUS_TIMEOUT";

/// The variable holding the secret job key (see [`JobKey`]).
pub const JOB_KEY_VAR: &str = "GPUCOMM_JOB_KEY";

/// The variable choosing the store (see [`StoreMode`]): `auto`, `rank0` or `external`.
pub const STORE_VAR: &str = "GPUCOMM_STORE";

/// The timeout when [`TIMEOUT_VAR`] is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The shortest timeout accepted.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// The longest timeout accepted (7 days).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The shortest job key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;

/// Where the ranks meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreMode {
    /// Under torchrun with `TORCHELASTIC_USE_AGENT_STORE=True`, the agent's store (every rank is
    /// a client); otherwise [`StoreMode::Rank0`]. The default (`GPUCOMM_STORE=auto`).
    #[default]
    Auto,
    /// Rank 0 hosts a [`StoreServer`](crate::store::StoreServer) at `MASTER_ADDR:MASTER_PORT`
    /// and every rank, rank 0 included, is its client (`GPUCOMM_STORE=rank0`).
    Rank0,
    /// Someone else hosts a TCPStore at `MASTER_ADDR:MASTER_PORT` — a Python process with
    /// `torch.distributed.TCPStore(host, port, is_master=True)`, a long-lived service — and every
    /// rank is its client (`GPUCOMM_STORE=external`).
    External,
}

/// The secret that protects a rendezvous (`GPUCOMM_JOB_KEY`): with it, claims and barrier
/// releases carry a MAC and broadcast values are encrypted, so a process without the key can
/// neither read a unique id nor take a rank's place. At least [`MIN_KEY_LEN`] bytes; give every
/// rank of the job the same random string. Never printed: its `Debug` shows `JobKey(..)`.
#[derive(Clone, PartialEq, Eq)]
pub struct JobKey(Vec<u8>);

impl JobKey {
    /// A key from its bytes; fails (without showing them) when shorter than [`MIN_KEY_LEN`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<JobKey, RendezvousError> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            // Set, but to nothing: most likely a key file that could not be read
            // (`GPUCOMM_JOB_KEY=$(cat ~/.job-key)`), which must not run the job unprotected.
            return Err(RendezvousError::BadOptions {
                detail: format!(
                    "{JOB_KEY_VAR} is set but empty (a key file that could not be read?): set it to at least \
                     {MIN_KEY_LEN} random bytes, or unset it to run without a key"
                ),
            });
        }
        if bytes.len() < MIN_KEY_LEN {
            return Err(RendezvousError::BadOptions {
                detail: format!(
                    "{JOB_KEY_VAR} is {} bytes long; use at least {MIN_KEY_LEN} random bytes, e.g. the output of \
                     `openssl rand -hex 32`",
                    bytes.len()
                ),
            });
        }
        Ok(JobKey(bytes))
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobKey(..)")
    }
}

/// How a [`Rendezvous`](super::Rendezvous) behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The bound on every wait (joining, each broadcast, each barrier), from
    /// [`MIN_TIMEOUT`] to [`MAX_TIMEOUT`]. Default 60 s.
    pub timeout: Duration,
    /// Replaces [`RankInfo::job_identity`](crate::RankInfo::job_identity) when not empty.
    pub token: String,
    /// The secret job key; `None`: the rendezvous is unprotected (see the crate's security
    /// section).
    pub job_key: Option<JobKey>,
    /// Where the ranks meet.
    pub store: StoreMode,
    /// The limits of the store rank 0 hosts ([`StoreMode::Rank0`]) and of every rank's client.
    ///
    /// **Large jobs.** Every rank keeps one connection to rank 0's store for the whole
    /// rendezvous, and a few keys in it, so rank 0 hosts its store with these limits raised to
    /// what the world size needs (never lowered): `max_connections` to at least world size + 64,
    /// `max_store_keys` to at least 6 × world size + 1024, `max_store_bytes` to at least
    /// 1.5 KiB × world size + 8 MiB. The others stay as set, `max_per_peer` (default 256) among
    /// them: the ranks of one node all connect from its one address, so a node that starts more
    /// ranks than that needs it raised, on rank 0. The bound on the memory the store holds for
    /// connections ([`Limits::buffered_bound`]) grows with `max_connections`, by 8 KiB a rank
    /// with the defaults.
    ///
    /// Rank 0 also needs a file descriptor for every rank's connection: when its soft
    /// `RLIMIT_NOFILE` leaves no room for them and 64 more, it raises it (within the hard limit)
    /// to room for `max_connections`; when even the hard limit leaves no room for one connection
    /// per rank, [`Rendezvous::connect`](super::Rendezvous::connect) fails at once with
    /// [`RendezvousError::TooFewDescriptors`], which says how far to raise it (`ulimit -n`).
    pub store_limits: Limits,
    /// Which rendezvous of the job this is. `None` (the default): this process's rendezvous
    /// for this job and rank are counted from 0, and an attempt that fails does not count, so
    /// the n-th [`Rendezvous::connect`](super::Rendezvous::connect) to succeed on every rank
    /// is the same rendezvous when each rank makes them in the same order. Set it when that is
    /// not so.
    pub instance: Option<u64>,
}

/// A variable's value as text, invalid bytes replaced.
fn lossy(value: std::ffi::OsString) -> String {
    value.to_string_lossy().into_owned()
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: DEFAULT_TIMEOUT,
            token: String::new(),
            job_key: None,
            store: StoreMode::Auto,
            store_limits: Limits::default(),
            instance: None,
        }
    }
}

impl Options {
    /// The defaults, with `GPUCOMM_RENDEZVOUS_TIMEOUT` (seconds), `GPUCOMM_JOB_KEY` and
    /// `GPUCOMM_STORE` when set. A malformed value is an error naming the variable.
    pub fn from_env() -> Result<Options, RendezvousError> {
        Options::from_os_vars(|name| std::env::var_os(name))
    }

    /// Like [`Options::from_env`], with the variables as the operating system gives them, from
    /// `lookup`: the job key is taken byte for byte (a key that is not UTF-8 text keeps every
    /// byte: read as text, each invalid byte would become one replacement character, and keys
    /// that differ only there would be one key).
    pub fn from_os_vars(lookup: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<Options, RendezvousError> {
        use std::os::unix::ffi::OsStringExt;
        let mut options = Options::from_vars(|name| (name != JOB_KEY_VAR).then(|| lookup(name)).flatten().map(lossy))?;
        if let Some(key) = lookup(JOB_KEY_VAR) {
            options.job_key = Some(JobKey::new(key.into_vec())?);
        }
        Ok(options)
    }

    /// Like [`Options::from_env`], with the variables given by `lookup`.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Options, RendezvousError> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let mut options = Options::default();
        if let Some(value) = get(TIMEOUT_VAR) {
            options.timeout = parse_timeout(&value).ok_or_else(|| RendezvousError::BadOptions {
                detail: format!(
                    "{TIMEOUT_VAR}={value} is not valid: expected a number of seconds from {} to {}",
                    secs(MIN_TIMEOUT),
                    secs(MAX_TIMEOUT)
                ),
            })?;
        }
        if let Some(key) = lookup(JOB_KEY_VAR) {
            options.job_key = Some(JobKey::new(key.into_bytes())?);
        }
        if let Some(mode) = get(STORE_VAR) {
            options.store = match mode.to_ascii_lowercase().as_str() {
                "auto" => StoreMode::Auto,
                "rank0" => StoreMode::Rank0,
                "external" => StoreMode::External,
                _ => {
                    return Err(RendezvousError::BadOptions {
                        detail: format!("{STORE_VAR}={mode} is not valid: expected auto, rank0 or external"),
                    })
                }
            };
        }
        Ok(options)
    }

    /// These options with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Options {
        self.timeout = timeout;
        self
    }

    /// These options with another job identity.
    pub fn with_token(mut self, token: impl Into<String>) -> Options {
        self.token = token.into();
        self
    }

    /// These options with a job key.
    pub fn with_job_key(mut self, key: JobKey) -> Options {
        self.job_key = Some(key);
        self
    }

    /// These options with another store.
    pub fn with_store(mut self, store: StoreMode) -> Options {
        self.store = store;
        self
    }

    /// Checks what a caller may have set directly.
    pub(super) fn check(&self) -> Result<(), RendezvousError> {
        if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&self.timeout) {
            return Err(RendezvousError::BadOptions {
                detail: format!(
                    "Options::timeout of {:?} is out of range: it must be from {} to {}",
                    self.timeout,
                    secs(MIN_TIMEOUT),
                    secs(MAX_TIMEOUT)
                ),
            });
        }
        Ok(())
    }
}

/// Seconds as a finite number within [`MIN_TIMEOUT`]..=[`MAX_TIMEOUT`].
fn parse_timeout(value: &str) -> Option<Duration> {
    let secs: f64 = value.parse().ok()?;
    let limit = secs.is_finite() && secs >= MIN_TIMEOUT.as_secs_f64() && secs <= MAX_TIMEOUT.as_secs_f64();
    limit.then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    use super::*;

    fn key_of(bytes: &[u8]) -> Result<Option<JobKey>, RendezvousError> {
        Options::from_os_vars(|name| (name == JOB_KEY_VAR).then(|| OsString::from_vec(bytes.to_vec())))
            .map(|o| o.job_key)
    }

    #[test]
    fn a_key_that_is_not_utf8_keeps_every_byte() {
        // Read as text, both would be sixteen U+FFFD (48 bytes): one key, and a short key of
        // six such bytes would pass the length check as 18 bytes.
        let a = key_of(&[0xff; 16]).unwrap().unwrap();
        let b = key_of(&[0xfe; 16]).unwrap().unwrap();
        assert_eq!(a.bytes(), [0xff; 16]);
        assert_ne!(a.bytes(), b.bytes());
        let e = key_of(&[0xff; 6]).unwrap_err().to_string();
        assert!(e.contains("GPUCOMM_JOB_KEY is 6 bytes long"), "{e}");
    }

    /// Session 29 audit: a key set to nothing — `GPUCOMM_JOB_KEY=$(cat ~/.job-key)` with the file
    /// missing on every node — ran the job with no key, and said nothing. Now it is refused; only
    /// an unset variable means no key.
    #[test]
    fn a_key_set_to_nothing_is_refused() {
        let e = key_of(b"").unwrap_err().to_string();
        assert!(e.contains("GPUCOMM_JOB_KEY is set but empty"), "{e}");
        let e = Options::from_vars(|name| (name == JOB_KEY_VAR).then(String::new)).unwrap_err().to_string();
        assert!(e.contains("unset it to run without a key"), "{e}");
        assert!(Options::from_os_vars(|_| None).unwrap().job_key.is_none());
    }
}
