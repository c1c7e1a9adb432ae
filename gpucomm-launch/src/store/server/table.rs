//! The store's contents, with the caps on their number and size.

use std::collections::HashMap;

use crate::store::Limits;

/// Why a change to the table was refused (the connection that asked is closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refusal {
    /// A cap on keys, bytes or a value's length would be passed.
    Full(String),
    /// `ADD` on a value that is not a decimal integer.
    NotANumber,
    /// `ADD` beyond the i64 range.
    Overflow,
}

impl Refusal {
    pub(super) fn describe(&self) -> String {
        match self {
            Refusal::Full(what) => what.clone(),
            Refusal::NotANumber => "ADD on a value that is not a decimal integer".into(),
            Refusal::Overflow => "ADD beyond the 64-bit integer range".into(),
        }
    }
}

pub(super) struct Table {
    map: HashMap<Vec<u8>, Vec<u8>>,
    bytes: usize,
    max_bytes: usize,
    max_keys: usize,
    max_value: usize,
}

impl Table {
    pub(super) fn new(limits: &Limits) -> Table {
        Table {
            map: HashMap::new(),
            bytes: 0,
            max_bytes: limits.max_store_bytes,
            max_keys: limits.max_store_keys,
            max_value: limits.max_value_len,
        }
    }

    pub(super) fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.map.get(key).map(Vec::as_slice)
    }

    pub(super) fn contains(&self, key: &[u8]) -> bool {
        self.map.contains_key(key)
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes of keys and values held.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Stores `value` under `key` if the caps allow it.
    pub(super) fn set(&mut self, key: &[u8], value: Vec<u8>) -> Result<(), Refusal> {
        self.check_value_len(value.len())?;
        let old = self.map.get(key).map(|old| key.len() + old.len());
        if old.is_none() && self.map.len() >= self.max_keys {
            return Err(Refusal::Full(format!("the store holds its limit of {} keys", self.max_keys)));
        }
        let bytes = self.bytes - old.unwrap_or(0) + key.len() + value.len();
        if bytes > self.max_bytes {
            return Err(Refusal::Full(format!(
                "the store would hold {bytes} bytes, over its limit of {}",
                self.max_bytes
            )));
        }
        self.bytes = bytes;
        self.map.insert(key.to_vec(), value);
        Ok(())
    }

    /// The length of [`Table::compare_set`]'s reply, without changing anything: known before the
    /// swap, so that a reply that must wait for room waits before the store changes.
    pub(super) fn compare_set_reply_len(&self, key: &[u8], expected: &[u8], desired: &[u8]) -> usize {
        match self.map.get(key) {
            None if expected.is_empty() => desired.len(),
            None => expected.len(),
            Some(current) if current.as_slice() == expected => desired.len(),
            Some(current) => current.len(),
        }
    }

    /// PyTorch's compare-and-set: returns the reply (the value afterwards; `expected` when the
    /// key is missing and `expected` is not empty).
    pub(super) fn compare_set(&mut self, key: &[u8], expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, Refusal> {
        match self.map.get(key) {
            None if expected.is_empty() => {
                self.set(key, desired.to_vec())?;
                Ok(desired.to_vec())
            }
            None => Ok(expected.to_vec()),
            Some(current) if current.as_slice() == expected => {
                self.set(key, desired.to_vec())?;
                Ok(desired.to_vec())
            }
            Some(current) => Ok(current.clone()),
        }
    }

    /// Adds `delta` to the decimal integer under `key` (0 when missing); returns the sum.
    pub(super) fn add(&mut self, key: &[u8], delta: i64) -> Result<i64, Refusal> {
        let current = match self.map.get(key) {
            None => 0,
            Some(value) => parse_decimal(value).ok_or(Refusal::NotANumber)?,
        };
        let sum = current.checked_add(delta).ok_or(Refusal::Overflow)?;
        self.set(key, sum.to_string().into_bytes())?;
        Ok(sum)
    }

    fn check_value_len(&self, len: usize) -> Result<(), Refusal> {
        if len > self.max_value {
            return Err(Refusal::Full(format!("a value of {len} bytes is over the limit of {}", self.max_value)));
        }
        Ok(())
    }

    /// Appends `value` to the value under `key` (creating it), in place: before, each `APPEND`
    /// copied the whole value, so 20-byte requests appending nothing to a 1 MiB value cost the
    /// server a 1 MiB copy each. The value grows by at least an eighth of its length at a time
    /// (so a byte appended moves about eight bytes on average), which it may hold unused (at
    /// most an eighth of `max_value_len` beyond what the store counts).
    pub(super) fn append(&mut self, key: &[u8], value: &[u8]) -> Result<(), Refusal> {
        let Some(old) = self.map.get(key) else { return self.set(key, value.to_vec()) };
        self.check_value_len(old.len() + value.len())?;
        let bytes = self.bytes + value.len();
        if bytes > self.max_bytes {
            return Err(Refusal::Full(format!(
                "the store would hold {bytes} bytes, over its limit of {}",
                self.max_bytes
            )));
        }
        let max_value = self.max_value;
        let Some(old) = self.map.get_mut(key) else { return Ok(()) };
        if old.capacity() - old.len() < value.len() {
            let grow = value.len().max(old.len() / 8).min(max_value - old.len());
            old.reserve_exact(grow);
        }
        old.extend_from_slice(value);
        self.bytes = bytes;
        Ok(())
    }

    /// Removes `key`; true if it existed.
    pub(super) fn delete(&mut self, key: &[u8]) -> bool {
        match self.map.remove(key) {
            Some(value) => {
                self.bytes -= key.len() + value.len();
                true
            }
            None => false,
        }
    }
}

/// An optionally signed decimal integer, surrounding whitespace allowed (what PyTorch's
/// `std::stoll` accepts from its own `ADD`s).
fn parse_decimal(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Table {
        Table::new(&Limits { max_store_bytes: 32, max_store_keys: 2, max_value_len: 16, ..Limits::default() })
    }

    #[test]
    fn caps_on_keys_bytes_and_values() {
        let mut t = small();
        t.set(b"a", b"12345".to_vec()).unwrap();
        t.set(b"b", b"1".to_vec()).unwrap();
        assert_eq!((t.len(), t.bytes()), (2, 8));
        assert!(matches!(t.set(b"c", vec![]), Err(Refusal::Full(m)) if m.contains("limit of 2 keys")));
        // Replacing a value does not add a key; the byte count follows.
        t.set(b"a", vec![0; 16]).unwrap();
        assert_eq!(t.bytes(), 19);
        assert!(matches!(t.set(b"a", vec![0; 17]), Err(Refusal::Full(m)) if m.contains("17 bytes")));
        t.delete(b"b");
        t.set(b"bb", vec![0; 13]).unwrap();
        assert_eq!(t.bytes(), 32);
        assert!(matches!(t.append(b"bb", b"x"), Err(Refusal::Full(m)) if m.contains("33 bytes")));
        assert_eq!(t.get(b"bb").map(<[u8]>::len), Some(13));
    }

    #[test]
    fn append_grows_the_value_in_place() {
        // Before: each APPEND copied the whole value into a new one (20-byte requests appending
        // nothing to a 1 MiB value cost a 1 MiB copy each).
        const HALF: usize = 1 << 19;
        let mut t = Table::new(&Limits::default());
        t.set(b"v", vec![1; HALF]).unwrap();
        let before = (t.get(b"v").unwrap().as_ptr(), t.bytes());
        t.append(b"v", b"").unwrap();
        assert_eq!((t.get(b"v").unwrap().as_ptr(), t.bytes()), before, "appending nothing moved the value");
        // Growing makes room for an eighth more: the next appends move nothing.
        t.append(b"v", b"ab").unwrap();
        let grown = t.get(b"v").unwrap().as_ptr();
        for _ in 0..1000 {
            t.append(b"v", b"c").unwrap();
        }
        assert_eq!(t.get(b"v").unwrap().as_ptr(), grown);
        assert_eq!(t.bytes(), 1 + HALF + 1002);
        let value = t.get(b"v").unwrap();
        assert_eq!((value.len(), &value[HALF..HALF + 3]), (HALF + 1002, &b"abc"[..]));
        // A missing key is created; the value limit holds.
        t.append(b"new", b"x").unwrap();
        assert_eq!(t.get(b"new"), Some(&b"x"[..]));
        let err = t.append(b"v", &vec![0; HALF]).unwrap_err();
        assert!(matches!(err, Refusal::Full(m) if m.contains("over the limit of 1048576")));
        assert_eq!(t.get(b"v").unwrap().len(), HALF + 1002);
        // Up to the limit exactly.
        t.append(b"v", &vec![0; HALF - 1002]).unwrap();
        assert_eq!(t.get(b"v").unwrap().len(), 1 << 20);
    }

    #[test]
    fn compare_set_reply_len_is_the_length_of_compare_sets_reply() {
        let mut t = Table::new(&Limits::default());
        for (expected, desired) in
            [(&b"x"[..], &b"yy"[..]), (b"", b"v1"), (b"", b"v22"), (b"v1", b"v333"), (b"no", b"")]
        {
            let len = t.compare_set_reply_len(b"k", expected, desired);
            assert_eq!(t.compare_set(b"k", expected, desired).unwrap().len(), len, "{expected:?} {desired:?}");
        }
    }

    #[test]
    fn compare_set_and_add_follow_pytorch() {
        let mut t = Table::new(&Limits::default());
        assert_eq!(t.compare_set(b"k", b"x", b"y").unwrap(), b"x");
        assert!(!t.contains(b"k"));
        assert_eq!(t.compare_set(b"k", b"", b"v1").unwrap(), b"v1");
        assert_eq!(t.compare_set(b"k", b"", b"v2").unwrap(), b"v1");
        assert_eq!(t.compare_set(b"k", b"v1", b"v3").unwrap(), b"v3");
        assert_eq!(t.add(b"n", 5).unwrap(), 5);
        assert_eq!(t.add(b"n", -7).unwrap(), -2);
        assert_eq!(t.get(b"n"), Some(&b"-2"[..]));
        assert_eq!(t.add(b"k", 1), Err(Refusal::NotANumber));
        t.set(b"n", i64::MAX.to_string().into_bytes()).unwrap();
        assert_eq!(t.add(b"n", 1), Err(Refusal::Overflow));
    }
}
