//! The records the ranks leave in the store: claims of ranks, the store's owner, and the values
//! of broadcasts and releases, each with a MAC or sealed when the job has a key.
//!
//! A record is a magic (`gpcm2`; `gpcm1` before claims named their holder's process, session 24),
//! a kind byte, fields (u8, u32 and u64 little-endian; strings as
//! a u16 length and bytes), then a MAC flag (0 or 1) and, with 1, the 32-byte MAC of everything
//! before the flag under the record's label (its store key). Decoding is total: any bytes give a
//! record or `None`.

use std::fmt;

use super::process::{Claimant, Identity};
use super::seal::{Seal, TAG_LEN};

const MAGIC: &[u8; 5] = b"gpcm2";
/// What every version's magic begins with; a digit follows.
const FAMILY: &[u8; 4] = b"gpcm";
const CLAIM: u8 = b'C';
const OWNER: u8 = b'O';
/// Strings longer than this are cut when written (a host name is at most 255 bytes).
const MAX_TEXT: usize = 255;

// Here rather than beside the type: the host and address are text read from the store.
impl fmt::Display for Claimant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} on {} ({})", self.pid, Printable(&self.host), Printable(&self.addr))
    }
}

/// A text read from a record, for messages: anyone who reaches the store can write a record, so
/// control characters (line breaks, terminal escapes) are shown as `?` and the text is cut to
/// [`MAX_TEXT`] characters, as a text this crate writes is.
pub(super) struct Printable<'a>(pub(super) &'a str);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars().take(MAX_TEXT) {
            fmt::Write::write_char(f, if c.is_control() { '?' } else { c })?;
        }
        Ok(())
    }
}

/// A rank's claim: who holds the rank, with which world size and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claim {
    pub(super) rank: u32,
    pub(super) world_size: u32,
    pub(super) who: Claimant,
    /// Random, so that two claims by the same process never look alike.
    pub(super) nonce: [u8; 16],
    /// Rank 0's random value for the start of the rendezvous the claim was made in (zeros
    /// without a job key): under the MAC, it tells a claim of this start from one kept from an
    /// earlier run (the same key and identity) and written again.
    pub(super) start: [u8; 16],
    pub(super) tag: Option<[u8; TAG_LEN]>,
}

/// The owner of a store rank 0 hosts ([`StoreMode::Rank0`]): the job it serves. An external
/// store has no owner record.
///
/// [`StoreMode::Rank0`]: super::StoreMode::Rank0
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Owner {
    /// A hash of the job's identity (never the identity itself).
    pub(super) scope: String,
    /// Where the identity came from (variable names).
    pub(super) source: String,
    pub(super) world_size: u32,
    /// Which rendezvous of rank 0's process this store serves (0 for an external store).
    pub(super) instance: u64,
    pub(super) tag: Option<[u8; TAG_LEN]>,
}

/// The magic of a record in another version of this format (written by another build of this
/// crate), and this build's, for messages: `None` for this version's records and for bytes that
/// are no record of any version.
pub(super) fn other_version(value: &[u8]) -> Option<(String, String)> {
    let magic = value.get(..MAGIC.len())?;
    let versioned = magic.starts_with(FAMILY) && magic[FAMILY.len()].is_ascii_digit();
    let text = |m: &[u8]| String::from_utf8_lossy(m).into_owned();
    (versioned && magic != MAGIC).then(|| (text(magic), text(MAGIC)))
}

/// Writes fields.
struct Writer(Vec<u8>);

impl Writer {
    fn new(kind: u8) -> Writer {
        let mut bytes = MAGIC.to_vec();
        bytes.push(kind);
        Writer(bytes)
    }

    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn text(&mut self, s: &str) {
        let mut end = s.len().min(MAX_TEXT);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.0.extend_from_slice(&(end as u16).to_le_bytes());
        self.0.extend_from_slice(&s.as_bytes()[..end]);
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    /// The body, then its MAC under `label` when there is a seal.
    fn finish(self, seal: Option<&Seal>, label: &str) -> (Vec<u8>, Option<[u8; TAG_LEN]>) {
        let tag = seal.map(|s| s.tag(label, &self.0));
        let mut bytes = self.0;
        match tag {
            Some(tag) => {
                bytes.push(1);
                bytes.extend_from_slice(&tag);
            }
            None => bytes.push(0),
        }
        (bytes, tag)
    }
}

/// Reads fields; every method returns `None` past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], kind: u8) -> Option<Reader<'a>> {
        let mut r = Reader { bytes, pos: 0 };
        (r.take(MAGIC.len())? == MAGIC && r.take(1)? == [kind]).then_some(r)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(out)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn text(&mut self) -> Option<String> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().ok()?);
        String::from_utf8(self.take(usize::from(len))?.to_vec()).ok()
    }

    /// The MAC flag and MAC; the record must end there.
    fn finish(mut self) -> Option<Option<[u8; TAG_LEN]>> {
        let tag = match self.take(1)? {
            [0] => None,
            [1] => Some(self.take(TAG_LEN)?.try_into().ok()?),
            _ => return None,
        };
        (self.pos == self.bytes.len()).then_some(tag)
    }

    /// The bytes the MAC covers, once the fields are read.
    fn body(&self) -> &'a [u8] {
        &self.bytes[..self.pos]
    }
}

impl Claim {
    /// Encodes the claim, with a MAC under `label` (the claim's key) when there is a seal.
    pub(super) fn encode(&mut self, seal: Option<&Seal>, label: &str) -> Vec<u8> {
        let mut w = Writer::new(CLAIM);
        w.u32(self.rank);
        w.u32(self.world_size);
        w.u32(self.who.pid);
        w.text(&self.who.host);
        w.text(&self.who.addr);
        w.raw(&self.nonce);
        w.raw(&self.start);
        w.text(&self.who.id.boot);
        w.u64(self.who.id.pidns);
        w.u64(self.who.id.started);
        let (bytes, tag) = w.finish(seal, label);
        self.tag = tag;
        bytes
    }

    /// The claim in `value`, read from `label`, when it carries the MAC of `seal`'s key (never
    /// without a seal).
    pub(super) fn signed(value: &[u8], seal: Option<&Seal>, label: &str) -> Option<Claim> {
        let (claim, body) = Claim::decode(value)?;
        (verified(seal, label, body, claim.tag.as_ref()) == Some(true)).then_some(claim)
    }

    /// A claim and the bytes its MAC covers.
    pub(super) fn decode(bytes: &[u8]) -> Option<(Claim, &[u8])> {
        let mut r = Reader::new(bytes, CLAIM)?;
        let (rank, world_size, pid) = (r.u32()?, r.u32()?, r.u32()?);
        let (host, addr) = (r.text()?, r.text()?);
        let nonce = r.take(16)?.try_into().ok()?;
        let start = r.take(16)?.try_into().ok()?;
        let id = Identity { boot: r.text()?, pidns: r.u64()?, started: r.u64()? };
        let body = r.body();
        let tag = r.finish()?;
        Some((Claim { rank, world_size, who: Claimant { host, pid, addr, id }, nonce, start, tag }, body))
    }
}

impl Owner {
    /// Encodes the record, with a MAC under `label` when there is a seal.
    pub(super) fn encode(&mut self, seal: Option<&Seal>, label: &str) -> Vec<u8> {
        let mut w = Writer::new(OWNER);
        w.text(&self.scope);
        w.text(&self.source);
        w.u32(self.world_size);
        w.u64(self.instance);
        let (bytes, tag) = w.finish(seal, label);
        self.tag = tag;
        bytes
    }

    /// A record and the bytes its MAC covers.
    pub(super) fn decode(bytes: &[u8]) -> Option<(Owner, &[u8])> {
        let mut r = Reader::new(bytes, OWNER)?;
        let (scope, source) = (r.text()?, r.text()?);
        let (world_size, instance) = (r.u32()?, r.u64()?);
        let body = r.body();
        let tag = r.finish()?;
        Some((Owner { scope, source, world_size, instance, tag }, body))
    }
}

/// Whether a record's MAC matches this process's key: `Some(true)` valid, `Some(false)` made
/// without this key, `None` when this process has no key.
pub(super) fn verified(seal: Option<&Seal>, label: &str, body: &[u8], tag: Option<&[u8; TAG_LEN]>) -> Option<bool> {
    let seal = seal?;
    Some(tag.is_some_and(|tag| seal.verify(label, body, tag)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::options::JobKey;
    use crate::store::codec::tests::Rng;

    #[test]
    fn a_record_of_another_version_is_told_from_bytes_of_no_record() {
        let ours = claim().encode(None, "l");
        assert_eq!(other_version(&ours), None);
        let mut older = ours.clone();
        older[..5].copy_from_slice(b"gpcm1");
        assert!(Claim::decode(&older).is_none());
        assert_eq!(other_version(&older), Some(("gpcm1".into(), "gpcm2".into())));
        for stranger in [&b"gpcmX C"[..], b"gpcm", b"", b"hello world"] {
            assert_eq!(other_version(stranger), None, "{stranger:?}");
        }
    }

    fn claim() -> Claim {
        Claim {
            rank: 3,
            world_size: 8,
            who: Claimant {
                host: "node-7".into(),
                pid: 4242,
                addr: "10.0.0.7:5555".into(),
                id: Identity { boot: "b".into(), pidns: 5, started: 6 },
            },
            nonce: [9; 16],
            start: [4; 16],
            tag: None,
        }
    }

    fn seal() -> Seal {
        Seal::new(&JobKey::new(b"0123456789abcdef".to_vec()).unwrap(), "scope")
    }

    #[test]
    fn claims_round_trip_and_their_macs_bind_the_label() {
        let mut plain = claim();
        let bytes = plain.encode(None, "/x/rank/3");
        let (decoded, body) = Claim::decode(&bytes).unwrap();
        assert_eq!(decoded, plain);
        assert_eq!(verified(None, "/x/rank/3", body, decoded.tag.as_ref()), None);
        assert_eq!(verified(Some(&seal()), "/x/rank/3", body, decoded.tag.as_ref()), Some(false));
        let mut signed = claim();
        let bytes = signed.encode(Some(&seal()), "/x/rank/3");
        let (decoded, body) = Claim::decode(&bytes).unwrap();
        assert_eq!(decoded.tag, signed.tag);
        assert_eq!(verified(Some(&seal()), "/x/rank/3", body, decoded.tag.as_ref()), Some(true));
        assert_eq!(verified(Some(&seal()), "/x/rank/4", body, decoded.tag.as_ref()), Some(false));
        // The start's value is under the MAC: a claim cannot be moved to another start; nor is
        // its holder's identity (what tells whether it still runs) to be changed.
        let identity = 2 + signed.who.id.boot.len() + 8 + 8;
        for (at, changed) in [(body.len() - identity - 1, "start"), (body.len() - 1, "identity")] {
            let mut moved = bytes.clone();
            moved[at] ^= 1;
            let (decoded, body) = Claim::decode(&moved).unwrap();
            assert_eq!(
                (decoded.start[15] != 4, decoded.who.id.started != 6),
                (changed == "start", changed == "identity")
            );
            assert_eq!(verified(Some(&seal()), "/x/rank/3", body, decoded.tag.as_ref()), Some(false), "{changed}");
        }
        let (decoded, _) = Claim::decode(&bytes).unwrap();
        assert_eq!(decoded.who.to_string(), "pid 4242 on node-7 (10.0.0.7:5555)");
    }

    #[test]
    fn owners_round_trip() {
        let mut owner =
            Owner { scope: "ab12".into(), source: "GPUCOMM_JOB_TOKEN".into(), world_size: 2, instance: 7, tag: None };
        let bytes = owner.encode(Some(&seal()), "/gpucomm/v1/owner");
        let (decoded, body) = Owner::decode(&bytes).unwrap();
        assert_eq!(decoded, owner);
        assert_eq!(verified(Some(&seal()), "/gpucomm/v1/owner", body, decoded.tag.as_ref()), Some(true));
        assert!(Claim::decode(&bytes).is_none());
    }

    #[test]
    fn texts_from_the_store_are_shown_without_control_characters() {
        let mut c = claim();
        c.who.host = format!("evil\n[rank 0] all good\x1b[2J{}", "x".repeat(400));
        c.who.addr = "\r6.6.6.6:666".into();
        let shown = c.who.to_string();
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.starts_with("pid 4242 on evil?[rank 0] all good?[2J"), "{shown:?}");
        assert!(shown.ends_with(" (?6.6.6.6:666)"), "{shown:?}");
        assert!(shown.len() < 300, "{} characters", shown.len());
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        let mut c = claim();
        c.who.host = "é".repeat(200);
        let (decoded, _) = Claim::decode(&c.encode(None, "l")).unwrap();
        assert_eq!(decoded.who.host, "é".repeat(127));
    }

    #[test]
    fn fuzzed_records_never_panic() {
        let mut rng = Rng(0x0dd_ba11_c0ff_ee00);
        let valid = [claim().encode(Some(&seal()), "l"), claim().encode(None, "l"), {
            let mut o = Owner { scope: "s".into(), source: "x".into(), world_size: 1, instance: 0, tag: None };
            o.encode(None, "l")
        }];
        for round in 0..50_000 {
            let bytes = if round % 2 == 0 {
                let mut b = valid[rng.below(valid.len())].clone();
                let at = rng.below(b.len());
                b[at] ^= (rng.next() as u8) | 1;
                b.truncate(rng.below(b.len() + 1));
                b
            } else {
                let mut b = MAGIC.to_vec();
                b.push(if rng.below(2) == 0 { b'C' } else { b'O' });
                let n = rng.below(80);
                b.extend(rng.bytes(n));
                b
            };
            if let Some((c, body)) = Claim::decode(&bytes) {
                assert!(body.len() < bytes.len());
                let _ = verified(Some(&seal()), "l", body, c.tag.as_ref());
            }
            if let Some((o, body)) = Owner::decode(&bytes) {
                assert!(body.len() < bytes.len() && o.scope.len() <= u16::MAX as usize);
            }
        }
    }
}
