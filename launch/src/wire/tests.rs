use super::*;

fn samples() -> Vec<Message> {
    vec![
        Message::Hello { token: "job-1".into(), rank: 3, world_size: 8 },
        Message::Hello { token: String::new(), rank: u32::MAX, world_size: 0 },
        Message::Welcome,
        Message::Reject { reason: "token mismatch ✗".into() },
        Message::Data { seq: 7, bytes: (0..=255u8).collect() },
        Message::Data { seq: 0, bytes: vec![] },
        Message::BarrierArrive { seq: 9 },
        Message::BarrierRelease { seq: 10 },
        Message::Abort { reason: "no".into() },
    ]
}

/// A small deterministic generator (xorshift64*), so failures are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn every_message_round_trips() {
    for message in samples() {
        let payload = message.encode().unwrap();
        assert_eq!(Message::decode(&payload), Ok(message.clone()));
        let frame = message.encode_frame().unwrap();
        assert_eq!(&frame[..4], &(payload.len() as u32).to_be_bytes());
        assert_eq!(read_message(&mut &frame[..]).unwrap(), message);
    }
}

#[test]
fn header_layout_is_as_documented() {
    let payload = Message::BarrierArrive { seq: 0x0102_0304 }.encode().unwrap();
    assert_eq!(payload, b"GPCM\x00\x01\x05\x01\x02\x03\x04");
    let hello = Message::Hello { token: "ab".into(), rank: 1, world_size: 2 }.encode().unwrap();
    assert_eq!(hello, b"GPCM\x00\x01\x01\x00\x02ab\x00\x00\x00\x01\x00\x00\x00\x02");
}

#[test]
fn every_truncation_is_an_error() {
    for message in samples() {
        let payload = message.encode().unwrap();
        for cut in 0..payload.len() {
            assert!(Message::decode(&payload[..cut]).is_err(), "{message:?} cut at {cut}");
        }
        let frame = message.encode_frame().unwrap();
        for cut in 0..frame.len() {
            assert!(read_message(&mut &frame[..cut]).is_err(), "{message:?} frame cut at {cut}");
        }
    }
}

#[test]
fn precise_errors() {
    let mut payload = Message::Welcome.encode().unwrap();
    assert_eq!(Message::decode(b"GET / HTTP/1.1"), Err(WireError::BadMagic { found: *b"GET " }));
    payload[5] = 2;
    assert_eq!(Message::decode(&payload), Err(WireError::BadVersion { found: 2 }));
    payload[5] = 1;
    payload[6] = 99;
    assert_eq!(Message::decode(&payload), Err(WireError::UnknownKind { kind: 99 }));
    payload[6] = 2;
    payload.push(0);
    assert_eq!(Message::decode(&payload), Err(WireError::TrailingBytes { count: 1 }));
    let bad_utf8 = b"GPCM\x00\x01\x03\x00\x02\xff\xfe";
    assert_eq!(Message::decode(bad_utf8), Err(WireError::NotUtf8 { field: "reason" }));
    let huge_data = b"GPCM\x00\x01\x04\x00\x00\x00\x01\xff\xff\xff\xff";
    assert!(matches!(Message::decode(huge_data), Err(WireError::Truncated { field: "data", .. })));
    let message = WireError::BadMagic { found: *b"GET\x00" }.to_string();
    assert!(message.starts_with("bad magic \"GET\\x00\""), "{message}");
}

#[test]
fn oversized_frames_are_refused_without_allocating() {
    let mut frame = u32::MAX.to_be_bytes().to_vec();
    frame.extend_from_slice(b"GPCM");
    match read_message(&mut &frame[..]) {
        Err(FrameError::Malformed(WireError::FrameTooLarge { len, .. })) => assert_eq!(len, u64::from(u32::MAX)),
        other => panic!("{other:?}"),
    }
    assert!(frame_len(((MAX_PAYLOAD + 1) as u32).to_be_bytes()).is_err());
    assert_eq!(frame_len((MAX_PAYLOAD as u32).to_be_bytes()), Ok(MAX_PAYLOAD));
    let too_big = Message::Data { seq: 0, bytes: vec![0; MAX_DATA + 1] };
    assert!(matches!(too_big.encode(), Err(WireError::TooLong { field: "data", .. })));
    let largest = Message::Data { seq: 0, bytes: vec![0; MAX_DATA] }.encode_frame().unwrap();
    assert_eq!(largest.len(), 4 + MAX_PAYLOAD);
    let long_token = Message::Hello { token: "x".repeat(70_000), rank: 0, world_size: 1 };
    assert!(matches!(long_token.encode(), Err(WireError::TooLong { field: "token", .. })));
}

#[test]
fn garbage_never_panics() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let valid: Vec<Vec<u8>> = samples().iter().map(|m| m.encode().unwrap()).collect();
    for round in 0..200_000u32 {
        let len = (rng.next() % 64) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Half the inputs start with a valid header so the field parsers are exercised too.
        if round % 2 == 0 {
            let mut prefixed = b"GPCM\x00\x01".to_vec();
            prefixed.push((rng.next() % 9) as u8);
            prefixed.extend_from_slice(&bytes);
            bytes = prefixed;
        }
        let _ = Message::decode(&bytes);
        let _ = read_message(&mut &bytes[..]);
        // Flip a byte of a valid message.
        let mut flipped = valid[round as usize % valid.len()].clone();
        let at = (rng.next() as usize) % flipped.len();
        flipped[at] ^= (rng.next() as u8) | 1;
        if let Ok(message) = Message::decode(&flipped) {
            // Whatever parses must re-encode to the same bytes.
            assert_eq!(message.encode().unwrap(), flipped);
        }
    }
}
