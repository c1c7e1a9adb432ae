//! The rendezvous wire format.
//!
//! Every message travels in a **frame**: a 4-byte big-endian payload length, then the payload.
//! Payloads are at most [`MAX_PAYLOAD`] (1 MiB); a larger announced length is an error before
//! anything is allocated.
//!
//! A **payload** starts with a common header:
//!
//! | Bytes | Field |
//! |---|---|
//! | 4 | magic `b"GPCM"` ([`MAGIC`]) |
//! | 2 | protocol version, big-endian u16 ([`VERSION`], currently 1) |
//! | 1 | message kind |
//!
//! followed by the kind's fields (integers big-endian; strings are a u16 byte length then UTF-8):
//!
//! | Kind | Message | Direction | Fields |
//! |---|---|---|---|
//! | 1 | `Hello` | client → rank 0 | token (string), rank u32, world size u32 |
//! | 2 | `Welcome` | rank 0 → client | none (sent once every rank has joined) |
//! | 3 | `Reject` | rank 0 → client | reason (string) |
//! | 4 | `Data` | rank 0 → client | sequence u32, byte length u32, bytes |
//! | 5 | `BarrierArrive` | client → rank 0 | sequence u32 |
//! | 6 | `BarrierRelease` | rank 0 → client | sequence u32 |
//! | 7 | `Abort` | rank 0 → client | reason (string) |
//!
//! Bytes after the last field are an error. Sequence numbers count the collective operations
//! (broadcasts and barriers together) from 0, so ranks that call them in different orders are
//! caught. [`Message::decode`] is total: any byte string gives a message or a [`WireError`].

use std::fmt;
use std::io::{self, Read};

/// The first four payload bytes of every message.
pub const MAGIC: [u8; 4] = *b"GPCM";
/// The protocol version this build speaks.
pub const VERSION: u16 = 1;
/// The largest payload a frame may carry.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// The largest byte string one broadcast may carry (the payload limit less the `Data` header).
pub const MAX_DATA: usize = MAX_PAYLOAD - HEADER_LEN - 8;

const HEADER_LEN: usize = 7;

/// One rendezvous message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A client introduces itself.
    Hello {
        /// The job token; must match rank 0's.
        token: String,
        /// The client's rank.
        rank: u32,
        /// The world size the client was started with.
        world_size: u32,
    },
    /// Every rank has joined.
    Welcome,
    /// Rank 0 turns the client away.
    Reject {
        /// Why, for the client's error message.
        reason: String,
    },
    /// The bytes of one broadcast.
    Data {
        /// The operation's sequence number.
        seq: u32,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// A client reached a barrier.
    BarrierArrive {
        /// The operation's sequence number.
        seq: u32,
    },
    /// Every rank reached the barrier.
    BarrierRelease {
        /// The operation's sequence number.
        seq: u32,
    },
    /// Rank 0 gave up after the rendezvous (for example, it could not produce broadcast data).
    Abort {
        /// Why, for the client's error message.
        reason: String,
    },
}

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => 1,
            Message::Welcome => 2,
            Message::Reject { .. } => 3,
            Message::Data { .. } => 4,
            Message::BarrierArrive { .. } => 5,
            Message::BarrierRelease { .. } => 6,
            Message::Abort { .. } => 7,
        }
    }

    /// A short name of the message kind, for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Welcome => "welcome",
            Message::Reject { .. } => "reject",
            Message::Data { .. } => "broadcast data",
            Message::BarrierArrive { .. } => "barrier arrival",
            Message::BarrierRelease { .. } => "barrier release",
            Message::Abort { .. } => "abort",
        }
    }

    /// The payload (without the frame's length prefix).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(32);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_be_bytes());
        out.push(self.kind());
        match self {
            Message::Hello { token, rank, world_size } => {
                put_str(&mut out, "token", token)?;
                out.extend_from_slice(&rank.to_be_bytes());
                out.extend_from_slice(&world_size.to_be_bytes());
            }
            Message::Welcome => {}
            Message::Reject { reason } | Message::Abort { reason } => put_str(&mut out, "reason", reason)?,
            Message::Data { seq, bytes } => {
                let len = u32::try_from(bytes.len())
                    .ok()
                    .filter(|_| bytes.len() <= MAX_DATA)
                    .ok_or(WireError::TooLong { field: "data", len: bytes.len(), max: MAX_DATA })?;
                out.extend_from_slice(&seq.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(bytes);
            }
            Message::BarrierArrive { seq } | Message::BarrierRelease { seq } => {
                out.extend_from_slice(&seq.to_be_bytes());
            }
        }
        Ok(out)
    }

    /// The whole frame: length prefix and payload.
    pub fn encode_frame(&self) -> Result<Vec<u8>, WireError> {
        let payload = self.encode()?;
        // `encode` keeps payloads within MAX_PAYLOAD, which fits in a u32.
        let len = u32::try_from(payload.len())
            .map_err(|_| WireError::FrameTooLarge { len: payload.len() as u64, max: MAX_PAYLOAD })?;
        let mut frame = Vec::with_capacity(4 + payload.len());
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&payload);
        Ok(frame)
    }

    /// Parses one payload.
    pub fn decode(payload: &[u8]) -> Result<Message, WireError> {
        let mut r = Cursor { bytes: payload, pos: 0 };
        let magic = r.take("magic", 4)?;
        if magic != MAGIC {
            let mut found = [0u8; 4];
            found.copy_from_slice(magic);
            return Err(WireError::BadMagic { found });
        }
        let version = r.u16("version")?;
        if version != VERSION {
            return Err(WireError::BadVersion { found: version });
        }
        let kind = r.u8("kind")?;
        let message = match kind {
            1 => Message::Hello { token: r.string("token")?, rank: r.u32("rank")?, world_size: r.u32("world size")? },
            2 => Message::Welcome,
            3 => Message::Reject { reason: r.string("reason")? },
            4 => {
                let seq = r.u32("sequence")?;
                let len = r.u32("data length")? as usize;
                Message::Data { seq, bytes: r.take("data", len)?.to_vec() }
            }
            5 => Message::BarrierArrive { seq: r.u32("sequence")? },
            6 => Message::BarrierRelease { seq: r.u32("sequence")? },
            7 => Message::Abort { reason: r.string("reason")? },
            other => return Err(WireError::UnknownKind { kind: other }),
        };
        let rest = payload.len() - r.pos;
        if rest > 0 {
            return Err(WireError::TrailingBytes { count: rest });
        }
        Ok(message)
    }
}

fn put_str(out: &mut Vec<u8>, field: &'static str, value: &str) -> Result<(), WireError> {
    let len = u16::try_from(value.len()).map_err(|_| WireError::TooLong {
        field,
        len: value.len(),
        max: usize::from(u16::MAX),
    })?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value.as_bytes());
    Ok(())
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], WireError> {
        let available = self.bytes.len() - self.pos;
        if n > available {
            return Err(WireError::Truncated { field, needed: n, available });
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(field, N)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    fn string(&mut self, field: &'static str) -> Result<String, WireError> {
        let len = usize::from(self.u16(field)?);
        let bytes = self.take(field, len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| WireError::NotUtf8 { field })
    }
}

/// A payload or frame that does not follow the [wire format](self).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The payload ends inside a field.
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Bytes it needs.
        needed: usize,
        /// Bytes left.
        available: usize,
    },
    /// The payload does not start with [`MAGIC`].
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// The peer speaks another protocol version.
    BadVersion {
        /// Its version.
        found: u16,
    },
    /// An unknown message kind.
    UnknownKind {
        /// The kind byte.
        kind: u8,
    },
    /// A string field is not UTF-8.
    NotUtf8 {
        /// The field.
        field: &'static str,
    },
    /// Bytes after the message's last field.
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// A frame announces a payload above [`MAX_PAYLOAD`].
    FrameTooLarge {
        /// The announced length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A value is too long to encode.
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated { field, needed, available } => {
                write!(f, "message truncated in its {field} field ({needed} bytes needed, {available} left)")
            }
            WireError::BadMagic { found } => write!(
                f,
                "bad magic \"{}\" (expected \"GPCM\"): the peer does not speak the gpucomm rendezvous protocol",
                found.escape_ascii()
            ),
            WireError::BadVersion { found } => write!(
                f,
                "protocol version {found}, but this build speaks version {VERSION}: the ranks run different \
                 gpucomm versions (a stale binary?)"
            ),
            WireError::UnknownKind { kind } => write!(f, "unknown message kind {kind}"),
            WireError::NotUtf8 { field } => write!(f, "the {field} field is not UTF-8"),
            WireError::TrailingBytes { count } => write!(f, "{count} unexpected bytes after the message"),
            WireError::FrameTooLarge { len, max } => {
                write!(f, "frame announces {len} bytes, more than the {max}-byte limit")
            }
            WireError::TooLong { field, len, max } => {
                write!(f, "the {field} field is {len} bytes long, more than the {max}-byte limit")
            }
        }
    }
}

impl std::error::Error for WireError {}

/// Why a frame could not be read from a stream.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The stream ended or was reset (`detail` says how).
    Closed(String),
    /// The read timeout passed.
    TimedOut,
    /// The bytes are not a valid frame or message.
    Malformed(WireError),
    /// Another I/O error.
    Io(io::Error),
}

impl From<io::Error> for FrameError {
    fn from(error: io::Error) -> Self {
        match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => FrameError::TimedOut,
            io::ErrorKind::UnexpectedEof => FrameError::Closed("connection closed (EOF)".to_string()),
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected => FrameError::Closed(format!("connection lost: {error}")),
            _ => FrameError::Io(error),
        }
    }
}

/// The announced payload length of a frame whose first 4 bytes are `prefix`, checked against
/// [`MAX_PAYLOAD`].
pub(crate) fn frame_len(prefix: [u8; 4]) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(prefix);
    match usize::try_from(len) {
        Ok(len) if len <= MAX_PAYLOAD => Ok(len),
        _ => Err(WireError::FrameTooLarge { len: u64::from(len), max: MAX_PAYLOAD }),
    }
}

/// Reads one frame and decodes its message.
pub(crate) fn read_message(stream: &mut impl Read) -> Result<Message, FrameError> {
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix)?;
    let len = frame_len(prefix).map_err(FrameError::Malformed)?;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload)?;
    Message::decode(&payload).map_err(FrameError::Malformed)
}

#[cfg(test)]
mod tests;
