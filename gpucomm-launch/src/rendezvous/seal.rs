//! What a job key protects: MACs (HMAC-SHA256) on claims, owner records and releases, and
//! authenticated encryption (ChaCha20-Poly1305) of broadcast values. Both keys are derived with
//! HKDF-SHA256 from the job key and the job's scope (a hash of its identity), so that the same
//! key used by two jobs gives each its own keys.
//!
//! Every MAC and every encryption is bound to a *label*: the store key the value is written
//! under, so that a value copied to another key (another rank's claim, another barrier's
//! release) does not verify there.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::options::JobKey;

/// Bytes of a MAC.
pub(super) const TAG_LEN: usize = 32;
/// Bytes of a ChaCha20-Poly1305 nonce.
const NONCE_LEN: usize = 12;
/// Bytes of a Poly1305 tag.
const AEAD_TAG_LEN: usize = 16;
/// Bytes sealing adds to a value.
pub(super) const SEAL_OVERHEAD: usize = NONCE_LEN + AEAD_TAG_LEN;

/// The HKDF salt: the protocol's name and version.
const SALT: &[u8] = b"gpucomm rendezvous v1";

type HmacSha256 = Hmac<Sha256>;

/// The keys derived from a job key for one job scope.
pub(super) struct Seal {
    mac_key: [u8; 32],
    aead: ChaCha20Poly1305,
}

impl Seal {
    pub(super) fn new(job_key: &JobKey, scope: &str) -> Seal {
        let hkdf = Hkdf::<Sha256>::new(Some(SALT), job_key.bytes());
        let mut mac_key = [0u8; 32];
        let mut aead_key = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's limit of 255 × 32 bytes, so expand cannot fail.
        let ok = hkdf.expand(format!("mac\0{scope}").as_bytes(), &mut mac_key).is_ok()
            && hkdf.expand(format!("aead\0{scope}").as_bytes(), &mut aead_key).is_ok();
        debug_assert!(ok);
        Seal { mac_key, aead: ChaCha20Poly1305::new(Key::from_slice(&aead_key)) }
    }

    fn mac(&self, label: &str, data: &[u8]) -> HmacSha256 {
        // HMAC accepts keys of any length: this cannot fail.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.mac_key).unwrap_or_else(|_| unreachable!());
        mac.update(&(label.len() as u64).to_le_bytes());
        mac.update(label.as_bytes());
        mac.update(data);
        mac
    }

    /// The MAC of `data` under `label`.
    pub(super) fn tag(&self, label: &str, data: &[u8]) -> [u8; TAG_LEN] {
        self.mac(label, data).finalize().into_bytes().into()
    }

    /// Whether `tag` is the MAC of `data` under `label` (compared in constant time).
    pub(super) fn verify(&self, label: &str, data: &[u8], tag: &[u8]) -> bool {
        self.mac(label, data).verify_slice(tag).is_ok()
    }

    /// `nonce ‖ ciphertext ‖ tag` of `plaintext`, bound to `label`; `nonce` must be random.
    pub(super) fn seal(&self, label: &str, plaintext: &[u8], nonce: [u8; NONCE_LEN]) -> Option<Vec<u8>> {
        let sealed = self.aead.encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad: label.as_bytes() });
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed.ok()?);
        Some(out)
    }

    /// The plaintext of a sealed value, if it was sealed under `label` with this key.
    pub(super) fn open(&self, label: &str, sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < SEAL_OVERHEAD {
            return None;
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        self.aead.decrypt(Nonce::from_slice(nonce), Payload { msg: ciphertext, aad: label.as_bytes() }).ok()
    }
}

/// A fresh random nonce.
pub(super) fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut nonce = [0u8; NONCE_LEN];
    crate::random::fill(&mut nonce)?;
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal(key: &[u8], scope: &str) -> Seal {
        Seal::new(&JobKey::new(key.to_vec()).unwrap(), scope)
    }

    #[test]
    fn macs_bind_key_scope_label_and_data() {
        let s = seal(b"0123456789abcdef", "scope-a");
        let tag = s.tag("/k/rank/1", b"claim");
        assert!(s.verify("/k/rank/1", b"claim", &tag));
        assert!(!s.verify("/k/rank/2", b"claim", &tag));
        assert!(!s.verify("/k/rank/1", b"claim!", &tag));
        assert!(!s.verify("/k/rank/1", b"claim", &tag[..31]));
        assert!(!seal(b"0123456789abcdeX", "scope-a").verify("/k/rank/1", b"claim", &tag));
        assert!(!seal(b"0123456789abcdef", "scope-b").verify("/k/rank/1", b"claim", &tag));
        // The label's length is part of the MAC: moving bytes between label and data changes it.
        assert_ne!(s.tag("ab", b"c"), s.tag("a", b"bc"));
    }

    #[test]
    fn sealed_values_open_only_with_the_same_key_and_label() {
        let s = seal(b"0123456789abcdef", "scope");
        let sealed = s.seal("/k/op0/value", b"unique id", nonce().unwrap()).unwrap();
        assert_eq!(sealed.len(), 9 + SEAL_OVERHEAD);
        assert!(!sealed.windows(9).any(|w| w == b"unique id"));
        assert_eq!(s.open("/k/op0/value", &sealed).unwrap(), b"unique id");
        assert_eq!(s.open("/k/op1/value", &sealed), None);
        assert_eq!(seal(b"another key of 16", "scope").open("/k/op0/value", &sealed), None);
        let mut flipped = sealed.clone();
        flipped[20] ^= 1;
        assert_eq!(s.open("/k/op0/value", &flipped), None);
        assert_eq!(s.open("/k/op0/value", &sealed[..SEAL_OVERHEAD - 1]), None);
        assert_ne!(s.seal("l", b"x", nonce().unwrap()), s.seal("l", b"x", nonce().unwrap()));
    }
}
