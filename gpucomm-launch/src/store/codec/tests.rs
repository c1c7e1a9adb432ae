//! The codec against byte strings assembled by hand from PyTorch's layout, and a seeded fuzz
//! test of the decoder.

use super::*;

/// A seeded xorshift64* generator, so that failures reproduce.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// `tcputil::sendString` / `SendBuffer::appendString`: native (little-endian) u64 length, bytes.
fn string(bytes: &[u8]) -> Vec<u8> {
    let mut out = (bytes.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(bytes);
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Each request as PyTorch's client builds it (torch/csrc/distributed/c10d/TCPStore.cpp,
/// `SendBuffer`: the query byte of `QueryType` in TCPStoreBackend.hpp, then `appendString`,
/// `appendBytes` and `appendValue<T>` fields in the order of each method).
fn torch_samples() -> Vec<(Request<'static>, Vec<u8>)> {
    vec![
        // TCPStore::validate: appendValue<uint32_t>(validationMagicNumber).
        (Request::Validate { magic: VALIDATION_MAGIC }, vec![0, 0xce, 0xf7, 0x85, 0x3c]),
        // TCPStore::set: appendString(keyPrefix_ + key), appendBytes(data).
        (Request::Set { key: b"/k", value: b"\x01\x02" }, cat(&[&[1], &string(b"/k"), &string(b"\x01\x02")])),
        // TCPStore::compareSet: key, expected, desired.
        (
            Request::CompareSet { key: b"/c", expected: b"", desired: b"v" },
            cat(&[&[2], &string(b"/c"), &string(b""), &string(b"v")]),
        ),
        // TCPStore::doGet: appendString(key).
        (Request::Get { key: b"/g" }, cat(&[&[3], &string(b"/g")])),
        // TCPStore::incrementValueBy: appendString(key), appendValue<int64_t>(delta).
        (Request::Add { key: b"init/", delta: -2 }, cat(&[&[4], &string(b"init/"), &(-2i64).to_le_bytes()])),
        // TCPStore::check: appendValue(keys.size()) (a size_t), then appendString per key.
        (
            Request::Check { keys: vec![b"/a", b"/bb"] },
            cat(&[&[5], &2u64.to_le_bytes(), &string(b"/a"), &string(b"/bb")]),
        ),
        // TCPStore::doWait: the same layout with WAIT.
        (Request::Wait { keys: vec![b"/w"] }, cat(&[&[6], &1u64.to_le_bytes(), &string(b"/w")])),
        // TCPStore::getNumKeys: the query byte alone.
        (Request::GetNumKeys, vec![7]),
        // TCPStore::deleteKey: appendString(key).
        (Request::DeleteKey { key: b"/d" }, cat(&[&[8], &string(b"/d")])),
        // TCPStore::append: appendString(key), appendBytes(data).
        (Request::Append { key: b"/p", value: b"xy" }, cat(&[&[9], &string(b"/p"), &string(b"xy")])),
        // TCPStore::multiGet: appendValue(keys.size()), appendString per key.
        (
            Request::MultiGet { keys: vec![b"/a", b""] },
            cat(&[&[10], &2u64.to_le_bytes(), &string(b"/a"), &string(b"")]),
        ),
        // TCPStore::multiSet: appendValue<int64_t>(keys.size()), then (key, value) pairs.
        (
            Request::MultiSet { pairs: vec![(b"/a", b"1"), (b"/b", b"")] },
            cat(&[&[11], &2i64.to_le_bytes(), &string(b"/a"), &string(b"1"), &string(b"/b"), &string(b"")]),
        ),
        // TCPStore::doWait's cancellation: the query byte alone.
        (Request::CancelWait, vec![12]),
        // TCPStore::ping: appendValue<uint32_t>(getpid()).
        (Request::Ping { nonce: 0x0102_0304 }, vec![13, 4, 3, 2, 1]),
    ]
}

#[test]
fn requests_match_pytorchs_bytes_both_ways() {
    let limits = Limits::default();
    for (request, bytes) in torch_samples() {
        let mut encoded = Vec::new();
        request.encode(&mut encoded);
        assert_eq!(encoded, bytes, "{request:?}");
        assert_eq!(
            decode_request(&bytes, &limits),
            Ok(Decoded::Complete { request: request.clone(), len: bytes.len() })
        );
        request.check(&limits).unwrap();
        // Followed by more bytes (the next request), the length still says where it ends.
        let mut two = bytes.clone();
        two.extend_from_slice(&[7]);
        assert_eq!(decode_request(&two, &limits), Ok(Decoded::Complete { request, len: bytes.len() }));
    }
    assert_eq!(Query::from_byte(13), Some(Query::Ping));
    assert_eq!(Query::Ping.byte(), 13);
    assert_eq!(Query::MultiSet.name(), "MULTI_SET");
}

#[test]
fn every_prefix_is_incomplete_and_says_what_it_needs() {
    let limits = Limits::default();
    for (request, bytes) in torch_samples() {
        for cut in 0..bytes.len() {
            match decode_request(&bytes[..cut], &limits) {
                Ok(Decoded::Incomplete { needed }) => {
                    assert!(needed > cut && needed <= bytes.len(), "{request:?} cut at {cut}: needs {needed}")
                }
                other => panic!("{request:?} cut at {cut}: {other:?}"),
            }
        }
    }
}

#[test]
fn announced_lengths_are_checked_before_the_bytes_arrive() {
    let limits = Limits {
        max_key_len: 16,
        max_value_len: 64,
        max_keys_per_request: 3,
        max_request_len: 200,
        ..Limits::default()
    };
    let too_long = |field: &'static str, len: u64, max: usize| Err(CodecError::TooLong { field, len, max });
    // A key length of 2^40 with nothing after it: refused at once.
    let huge_key = cat(&[&[3], &(1u64 << 40).to_le_bytes()]);
    assert_eq!(decode_request(&huge_key, &limits), too_long("key length", 1 << 40, 16));
    let huge_value = cat(&[&[1], &string(b"k"), &u64::MAX.to_le_bytes()]);
    assert_eq!(decode_request(&huge_value, &limits), too_long("value length", u64::MAX, 64));
    let many_keys = cat(&[&[6], &4u64.to_le_bytes()]);
    assert_eq!(decode_request(&many_keys, &limits), too_long("key count", 4, 3));
    // MULTI_SET's count is an int64 in PyTorch's client: a negative one is a huge count.
    let negative = cat(&[&[11], &(-1i64).to_le_bytes()]);
    assert_eq!(decode_request(&negative, &limits), too_long("key count", u64::MAX, 3));
    // Fields within their limits that add up to more than a request may hold.
    let total = cat(&[&[11], &3u64.to_le_bytes(), &string(b"a"), &string(&[0; 64]), &string(b"b"), &string(&[0; 64])]);
    assert!(matches!(
        decode_request(&total, &limits),
        Ok(Decoded::Incomplete { .. }) | Err(CodecError::TooLong { field: "request length", .. })
    ));
    let mut third = total.clone();
    third.extend_from_slice(&string(b"c"));
    third.extend_from_slice(&64u64.to_le_bytes());
    assert!(matches!(
        decode_request(&third, &limits),
        Err(CodecError::TooLong { field: "request length", max: 200, .. })
    ));
    // The client-side check refuses the same things before sending.
    let long_key = [b'k'; 17];
    let error = Request::Get { key: &long_key }.check(&limits).unwrap_err();
    assert_eq!(error.to_string(), "key length 17 is over the limit of 16");
    assert!(Request::Check { keys: vec![b"a"; 4] }.check(&limits).is_err());
}

#[test]
fn unknown_and_unserved_queries_are_errors() {
    let limits = Limits::default();
    for byte in 14..=18u8 {
        let error = decode_request(&[byte, 0, 0], &limits).unwrap_err();
        assert_eq!(error, CodecError::UnknownQuery { byte });
        assert!(error.to_string().contains("not served"), "{error}");
    }
    for byte in [19u8, 0x47, 0xff] {
        let error = decode_request(&[byte], &limits).unwrap_err();
        assert!(error.to_string().starts_with(&format!("unknown query byte {byte}")), "{error}");
    }
    assert_eq!(decode_request(&[], &limits), Ok(Decoded::Incomplete { needed: 1 }));
}

#[test]
fn reply_lengths_are_checked() {
    assert_eq!(check_reply_len(5, 5), Ok(5));
    assert!(check_reply_len(6, 5).is_err());
    assert!(check_reply_len(u64::MAX, usize::MAX).is_err() || usize::BITS == 64);
}

/// Small limits for the fuzz tests, so that random lengths cross them often.
fn fuzz_limits() -> Limits {
    Limits { max_key_len: 64, max_value_len: 256, max_keys_per_request: 8, max_request_len: 2048, ..Limits::default() }
}

/// The bytes of [`torch_samples`], the fuzz tests' seeds.
fn torch_sample_bytes() -> Vec<Vec<u8>> {
    torch_samples().into_iter().map(|(_, bytes)| bytes).collect()
}

#[test]
fn fuzzed_requests_never_panic_and_decode_consistently() {
    let limits = fuzz_limits();
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let valid = torch_sample_bytes();
    for round in 0..100_000u32 {
        let mut bytes = match round % 3 {
            // Noise after a plausible query byte.
            0 => {
                let mut b = vec![rng.below(20) as u8];
                let n = rng.below(48);
                b.extend(rng.bytes(n));
                b
            }
            // A valid request with one byte changed and maybe cut.
            1 => {
                let mut b = valid[rng.below(valid.len())].clone();
                let at = rng.below(b.len());
                b[at] ^= (rng.next() as u8) | 1;
                b.truncate(1 + rng.below(b.len()));
                b
            }
            // Small lengths and counts, so that deep fields get reached.
            _ => {
                let mut b = vec![[1u8, 2, 5, 6, 10, 11][rng.below(6)]];
                for _ in 0..rng.below(6) {
                    b.extend_from_slice(&(rng.below(5) as u64).to_le_bytes());
                    let n = rng.below(5);
                    b.extend(rng.bytes(n));
                }
                b
            }
        };
        match decode_request(&bytes, &limits) {
            Ok(Decoded::Complete { request, len }) => {
                assert!(len <= bytes.len());
                let mut again = Vec::new();
                request.encode(&mut again);
                // MULTI_SET's count may have been written as an int64: same bytes for small counts.
                assert_eq!(again, bytes[..len], "round {round}");
                request.check(&limits).unwrap();
            }
            Ok(Decoded::Incomplete { needed }) => {
                assert!(needed > bytes.len() && needed <= limits.max_request_len, "round {round}: {needed}");
                // Growing the buffer to `needed` never goes backwards.
                bytes.resize(needed, 0);
                match decode_request(&bytes, &limits) {
                    Ok(Decoded::Incomplete { needed: next }) => assert!(next > needed),
                    Ok(Decoded::Complete { .. }) | Err(_) => {}
                }
            }
            Err(_) => {}
        }
    }
}

#[test]
fn a_scan_resumed_piece_by_piece_agrees_with_decoding_from_the_start() {
    // What the server does with a request arriving in pieces: `Scan::advance` whenever the
    // buffer has grown to what the last call needed. Each call must say what decoding the
    // whole buffer from its start says (the same request end, the same error as soon, the same
    // bytes needed), and `least` must never pass the request's length.
    let limits = fuzz_limits();
    let mut rng = Rng(0x0dd5_ca75_1ece_0001);
    let valid = torch_sample_bytes();
    let (mut whole_seen, mut errors_seen) = (0, 0);
    for round in 0..20_000u32 {
        let bytes = if round % 2 == 0 {
            let mut b = valid[rng.below(valid.len())].clone();
            if rng.below(3) == 0 {
                let at = rng.below(b.len());
                b[at] ^= (rng.next() as u8) | 1;
            }
            b
        } else {
            // A list with small counts and lengths, so that every field gets reached.
            let mut b = vec![[5u8, 6, 10, 11][rng.below(4)]];
            b.extend_from_slice(&(rng.below(10) as u64).to_le_bytes());
            for _ in 0..rng.below(20) {
                b.extend_from_slice(&(rng.below(6) as u64).to_le_bytes());
                let n = rng.below(6);
                b.extend(rng.bytes(n));
            }
            b
        };
        let whole = match decode_request(&bytes, &limits) {
            Ok(Decoded::Complete { len, .. }) => Some(len),
            _ => None,
        };
        let mut scan = Scan::default();
        let (mut cut, mut needed) = (0, 1);
        loop {
            if cut >= needed {
                let scanned = scan.advance(&bytes[..cut], &limits);
                match (scanned, decode_request(&bytes[..cut], &limits)) {
                    (Ok(Scanned::Whole(len)), Ok(Decoded::Complete { len: expected, .. })) => {
                        assert_eq!(len, expected, "round {round}");
                        whole_seen += 1;
                        break;
                    }
                    (Ok(Scanned::Need { needed: n, least }), Ok(Decoded::Incomplete { needed: expected })) => {
                        assert_eq!(n, expected, "round {round}");
                        assert!(least >= n && least <= limits.max_request_len, "round {round}: {least}");
                        assert!(whole.is_none_or(|len| least <= len), "round {round}: {least} > {whole:?}");
                        needed = n;
                    }
                    (Err(error), Err(expected)) => {
                        assert_eq!(error, expected, "round {round}");
                        errors_seen += 1;
                        break;
                    }
                    (scanned, decoded) => panic!("round {round} at {cut}: {scanned:?}, decoding says {decoded:?}"),
                }
            }
            if cut == bytes.len() {
                break;
            }
            cut = (cut + 1 + rng.below(12)).min(bytes.len());
        }
    }
    assert!(whole_seen > 5000 && errors_seen > 1000, "{whole_seen} whole, {errors_seen} refused");
}

#[test]
fn a_requests_whole_length_is_known_once_the_fields_before_its_last_body_arrived() {
    // What the server's line counts for a request still arriving: a `SET`'s whole length once
    // its value's length has arrived, a `COMPARE_SET`'s once its desired value's has; never a
    // list's (its lengths come all through it), nor an invalid or unknown request's.
    let limits = Limits::default();
    let value = vec![5u8; 1000];
    let cases: Vec<(Request<'_>, Option<usize>)> = vec![
        (Request::Set { key: b"/k", value: &value }, Some(1 + 8 + 2 + 8)),
        (Request::CompareSet { key: b"/k", expected: &value, desired: &value }, Some(1 + 8 + 2 + 8 + 1000 + 8)),
        (Request::Get { key: b"/k" }, Some(1 + 8)),
        (Request::MultiSet { pairs: vec![(&b"/a"[..], &value[..]), (&b"/b"[..], &value[..])] }, None),
        (Request::Wait { keys: vec![&b"/a"[..], &b"/b"[..]] }, None),
    ];
    for (request, known_from) in cases {
        let mut bytes = Vec::new();
        request.encode(&mut bytes);
        for arrived in 0..=bytes.len() {
            let expected = known_from.filter(|&from| arrived >= from).map(|_| bytes.len());
            assert_eq!(whole_len(&bytes[..arrived], &limits), expected, "{request:?} with {arrived} bytes");
        }
    }
    assert_eq!(whole_len(&[0xee, 1, 2], &limits), None);
    let mut set = Vec::new();
    Request::Set { key: b"/k", value: &value }.encode(&mut set);
    assert_eq!(whole_len(&set[..19], &Limits { max_value_len: 999, ..Limits::default() }), None, "over the limit");
}
