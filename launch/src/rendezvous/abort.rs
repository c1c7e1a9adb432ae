//! Abort notices: what a rank that gives up writes under the abort key, so that the others stop
//! at once, and what a notice read there is to a rank.
//!
//! With a job key a notice is `text ‖ start ‖ MAC`: the MAC, bound to the abort key's name,
//! covers the text and the random value of the start of the rendezvous the writer took part in
//! (see `join`). Anyone who reaches the store can read a notice and write it again, also into
//! a later run of the job (the same key and identity, so the same key names): such a notice is of
//! another start there, and does not count. Without a job key a notice is its text, and every
//! notice counts.

use super::seal::{Seal, TAG_LEN};

/// Bytes of a start's random value.
const START_LEN: usize = 16;
/// Characters of a notice's text shown at most.
const SHOWN: usize = 1000;

/// What a notice read from the store is to a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// A rank of the reader's start gave up (without a job key: any notice).
    Counts,
    /// Written with the job key for another start: an earlier run's notice written again, or a
    /// rank's that had not read the start's value yet (or the reader has not).
    OtherStart,
    /// Without the job key's MAC: written by a process without the key.
    Unsigned,
}

/// The notice under `label` that says `text`, for the ranks of `start` when the job has a key
/// (`None`, not read yet: a notice that counts for no start).
pub(super) fn encode(seal: Option<&Seal>, label: &str, start: Option<[u8; START_LEN]>, text: &str) -> Vec<u8> {
    let mut notice = text.as_bytes().to_vec();
    if let Some(seal) = seal {
        notice.extend_from_slice(&start.unwrap_or_default());
        let tag = seal.tag(label, &notice);
        notice.extend_from_slice(&tag);
    }
    notice
}

/// A notice read from `label`: its text as shown (no control characters, at most 1000 of them;
/// one that does not count says why) and what it is to a rank of `start` (`None`: the rank has
/// not read its start's value yet, and no signed notice counts).
pub(super) fn read(
    seal: Option<&Seal>,
    label: &str,
    start: Option<[u8; START_LEN]>,
    notice: &[u8],
) -> (String, Verdict) {
    let Some(seal) = seal else { return (shown(notice), Verdict::Counts) };
    let signed = notice.len().checked_sub(TAG_LEN).filter(|&body| body >= START_LEN).and_then(|body| {
        let (body, tag) = notice.split_at(body);
        seal.verify(label, body, tag).then(|| body.split_at(body.len() - START_LEN))
    });
    match signed {
        Some((text, of)) if start.is_some_and(|start| start == of) => (shown(text), Verdict::Counts),
        Some((text, _)) => (
            format!(
                "an abort notice of another start of this job (signed with its key, but an earlier run's \
                 written again, or a rank's that had not read this start's value): {}",
                shown(text)
            ),
            Verdict::OtherStart,
        ),
        None => (
            format!(
                "an abort notice without this job's MAC (written by a process without the job key): {}",
                shown(notice)
            ),
            Verdict::Unsigned,
        ),
    }
}

fn shown(text: &[u8]) -> String {
    String::from_utf8_lossy(text).chars().map(|c| if c.is_control() { ' ' } else { c }).take(SHOWN).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::options::JobKey;

    const LABEL: &str = "/gpucomm/v1/scope/0/abort";

    fn seal(key: &str) -> Seal {
        Seal::new(&JobKey::new(key.as_bytes().to_vec()).unwrap(), "scope")
    }

    #[test]
    fn a_notice_counts_for_the_ranks_of_its_start_only() {
        let (seal, start, other) = (seal("a job key of enough length"), [7; START_LEN], [8; START_LEN]);
        let notice = encode(Some(&seal), LABEL, Some(start), "rank 1 (pid 2 on h): timed out");
        assert_eq!(
            read(Some(&seal), LABEL, Some(start), &notice),
            ("rank 1 (pid 2 on h): timed out".into(), Verdict::Counts)
        );
        for (reader, note) in [(Some(other), "another start"), (None, "a reader without a start")] {
            let (text, verdict) = read(Some(&seal), LABEL, reader, &notice);
            assert_eq!(verdict, Verdict::OtherStart, "{note}");
            assert!(text.starts_with("an abort notice of another start of this job"), "{text}");
            assert!(text.ends_with(": rank 1 (pid 2 on h): timed out"), "{text}");
        }
        // A writer that had not read the start: counts for no start.
        let early = encode(Some(&seal), LABEL, None, "rank 1: no start");
        assert_eq!(read(Some(&seal), LABEL, Some(start), &early).1, Verdict::OtherStart);
    }

    #[test]
    fn a_notice_without_the_keys_mac_does_not_count() {
        let (seal, start) = (seal("a job key of enough length"), [7; START_LEN]);
        let signed = encode(Some(&seal), LABEL, Some(start), "stop");
        let mut flipped = signed.clone();
        flipped[0] ^= 1;
        let mut new_start = signed.clone();
        new_start[4] ^= 1;
        let other_key = encode(Some(&self::seal("another job key of enough length")), LABEL, Some(start), "stop");
        let other_label = encode(Some(&seal), "/gpucomm/v1/scope/1/abort", Some(start), "stop");
        for (notice, note) in [
            (&b"rank 0: stop"[..], "plain text"),
            (&b""[..], "empty"),
            (&signed[..TAG_LEN + START_LEN - 1], "too short"),
            (&flipped, "text changed"),
            (&new_start, "start changed"),
            (&other_key, "another key"),
            (&other_label, "another label"),
        ] {
            let (text, verdict) = read(Some(&seal), LABEL, Some(start), notice);
            assert_eq!(verdict, Verdict::Unsigned, "{note}");
            assert!(text.starts_with("an abort notice without this job's MAC"), "{note}: {text}");
        }
    }

    #[test]
    fn without_a_key_every_notice_counts_and_is_shown_clean() {
        let notice = encode(None, LABEL, Some([1; START_LEN]), "line\none");
        assert_eq!(notice, b"line\none");
        assert_eq!(read(None, LABEL, None, &notice), ("line one".into(), Verdict::Counts));
        let long = vec![b'x'; 5000];
        assert_eq!(read(None, LABEL, None, &long).0.len(), SHOWN);
    }
}
