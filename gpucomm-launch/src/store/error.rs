//! [`StoreError`]: what can go wrong talking to a store.

use std::fmt;
use std::io;
use std::time::Duration;

use super::codec::CodecError;
use crate::deadline::secs;

/// A [`StoreClient`](super::StoreClient) operation failed. Messages name the store's address
/// and the operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The host name does not resolve (not retried: a typo does not fix itself).
    Resolve {
        /// The host as given.
        host: String,
        /// The resolver's error.
        error: String,
    },
    /// No store answered before the deadline (connection refused, reset or silent).
    Unreachable {
        /// `host:port`.
        addr: String,
        /// How long the client tried.
        waited: Duration,
        /// The last failure.
        last_error: String,
    },
    /// An operation did not finish before its deadline.
    TimedOut {
        /// The store's address.
        addr: String,
        /// The operation (`GET`, `WAIT`, …).
        op: &'static str,
        /// The operation's time limit.
        waited: Duration,
    },
    /// The store closed the connection (it exited, or refused a request over its limits).
    Closed {
        /// The store's address.
        addr: String,
        /// The operation.
        op: &'static str,
        /// How the connection ended.
        detail: String,
    },
    /// The store sent something the protocol does not allow (another service on the port?).
    Protocol {
        /// The store's address.
        addr: String,
        /// The operation.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// A request over the client's [`Limits`](super::Limits); nothing was sent.
    Refused {
        /// The operation.
        op: &'static str,
        /// Which limit.
        error: CodecError,
    },
    /// An earlier operation failed in the middle of a message, so requests and replies are out
    /// of step; connect again.
    Broken {
        /// The store's address.
        addr: String,
    },
    /// Another I/O error.
    Io {
        /// The store's address.
        addr: String,
        /// The operation.
        op: &'static str,
        /// The OS error.
        error: io::Error,
    },
}

impl StoreError {
    /// True for a timeout of an operation ([`StoreError::TimedOut`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, StoreError::TimedOut { .. })
    }

    /// True when the store closed the connection ([`StoreError::Closed`]).
    pub fn is_closed(&self) -> bool {
        matches!(self, StoreError::Closed { .. })
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Resolve { host, error } => write!(f, "cannot resolve the store's host {host:?}: {error}"),
            StoreError::Unreachable { addr, waited, last_error } => {
                write!(f, "no store answered at {addr} within {} (last error: {last_error})", secs(*waited))
            }
            StoreError::TimedOut { addr, op, waited } => {
                write!(f, "{op} on the store at {addr} did not finish within {}", secs(*waited))
            }
            StoreError::Closed { addr, op, detail } => write!(
                f,
                "the store at {addr} closed the connection during {op} ({detail}): it exited, or refused a request \
                 over its limits"
            ),
            StoreError::Protocol { addr, op, detail } => write!(
                f,
                "the store at {addr} answered {op} with something TCPStore does not send ({detail}); is another \
                 service on that port?"
            ),
            StoreError::Refused { op, error } => write!(f, "{op} not sent: {error}"),
            StoreError::Broken { addr } => write!(
                f,
                "the connection to the store at {addr} is out of step after an earlier failure; connect again"
            ),
            StoreError::Io { addr, op, error } => write!(f, "{op} on the store at {addr}: {error}"),
        }
    }
}

impl std::error::Error for StoreError {}
