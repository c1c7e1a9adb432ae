//! Abort notices: what a rank that gives up writes under the abort key, so that the others stop
//! at once, and what a notice read there is to a rank.
//!
//! With a job key a notice is `text ‖ starts ‖ count ‖ MAC`: the random values (see `join`) of
//! the starts of the rendezvous whose ranks it is for, at most four, 16 bytes each, then their
//! count in a byte, and the MAC, bound to the abort key's name, over all of it. A notice counts
//! for a rank whose start it names. Anyone who reaches the store can read a notice and write it
//! again, also into a later run of the job (the same key and identity, so the same key names):
//! there it names another start, and does not count. A rank that finds a notice of another start
//! in place when it gives up writes one that names both (so that it still counts for the ranks
//! it was for), and a rank that gives up because of another start's claim names that start too.
//! Without a job key a notice is its text, and every notice counts.

use super::seal::{Seal, TAG_LEN};

/// Bytes of a start's random value.
const START_LEN: usize = 16;
/// The most starts a notice names.
pub(super) const MAX_STARTS: usize = 4;
/// Characters of a notice's text shown at most.
const SHOWN: usize = 1000;

/// A start's random value.
pub(super) type Start = [u8; START_LEN];

/// What a notice read from the store is to a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// For the reader's start: a rank of it gave up (without a job key: any notice).
    Counts,
    /// Written with the job key for other starts only: an earlier run's notice written again, or
    /// a rank's that had read another start's value than the reader.
    OtherStart,
    /// Without the job key's MAC: written by a process without the key.
    Unsigned,
}

/// A notice as a rank reads it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Notice {
    /// Its text as shown: no control characters, at most 1000 of them; one that does not count
    /// says why.
    pub(super) text: String,
    pub(super) verdict: Verdict,
    /// The starts a notice with the job's MAC names (empty otherwise).
    pub(super) starts: Vec<Start>,
}

/// The notice under `label` that says `text`, for the ranks of `starts` (the first
/// [`MAX_STARTS`] different ones) when the job has a key.
pub(super) fn encode(seal: Option<&Seal>, label: &str, starts: &[Start], text: &str) -> Vec<u8> {
    let mut notice = text.as_bytes().to_vec();
    if let Some(seal) = seal {
        let mut named: Vec<&Start> = Vec::with_capacity(MAX_STARTS);
        for start in starts {
            if named.len() < MAX_STARTS && !named.contains(&start) {
                named.push(start);
            }
        }
        for start in &named {
            notice.extend_from_slice(&start[..]);
        }
        notice.push(named.len() as u8);
        let tag = seal.tag(label, &notice);
        notice.extend_from_slice(&tag);
    }
    notice
}

/// A notice read from `label`, and what it is to a rank of `start` (`None`: the rank has not
/// read its start's value yet, and no signed notice counts).
pub(super) fn read(seal: Option<&Seal>, label: &str, start: Option<Start>, notice: &[u8]) -> Notice {
    let Some(seal) = seal else {
        return Notice { text: shown(notice), verdict: Verdict::Counts, starts: Vec::new() };
    };
    let Some((text, starts)) = signed(seal, label, notice) else {
        return Notice {
            text: format!(
                "an abort notice without this job's MAC (written by a process without the job key): {}",
                shown(notice)
            ),
            verdict: Verdict::Unsigned,
            starts: Vec::new(),
        };
    };
    if start.is_some_and(|start| starts.contains(&start)) {
        return Notice { text: shown(text), verdict: Verdict::Counts, starts };
    }
    Notice {
        text: format!(
            "an abort notice of another start of this job (signed with its key, but an earlier run's written              again, or a rank's that had read another start's value than this one): {}",
            shown(text)
        ),
        verdict: Verdict::OtherStart,
        starts,
    }
}

/// The text and starts of `notice`, if it carries the MAC of `label` under `seal`.
fn signed<'n>(seal: &Seal, label: &str, notice: &'n [u8]) -> Option<(&'n [u8], Vec<Start>)> {
    let (body, tag) = notice.split_at_checked(notice.len().checked_sub(TAG_LEN)?)?;
    if !seal.verify(label, body, tag) {
        return None;
    }
    let (&count, rest) = body.split_last()?;
    let count = usize::from(count);
    if count > MAX_STARTS {
        return None;
    }
    let (text, starts) = rest.split_at_checked(rest.len().checked_sub(count * START_LEN)?)?;
    let starts = starts.chunks_exact(START_LEN).map(|start| start.try_into().unwrap_or_default()).collect();
    Some((text, starts))
}

fn shown(text: &[u8]) -> String {
    String::from_utf8_lossy(text).chars().map(|c| if c.is_control() { ' ' } else { c }).take(SHOWN).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::options::JobKey;

    const LABEL: &str = "/gpucomm/v1/scope/0/abort";
    const TEXT: &str = "rank 1 (pid 2 on h): timed out";

    fn seal(key: &str) -> Seal {
        Seal::new(&JobKey::new(key.as_bytes().to_vec()).unwrap(), "scope")
    }

    #[test]
    fn a_notice_counts_for_the_ranks_of_the_starts_it_names_only() {
        let seal = seal("a job key of enough length");
        let (a, b, other) = ([7; START_LEN], [8; START_LEN], [9; START_LEN]);
        let notice = encode(Some(&seal), LABEL, &[a, b, a], TEXT);
        for start in [a, b] {
            let read = read(Some(&seal), LABEL, Some(start), &notice);
            assert_eq!(read, Notice { text: TEXT.into(), verdict: Verdict::Counts, starts: vec![a, b] });
        }
        for (reader, note) in [(Some(other), "another start"), (None, "a reader without a start")] {
            let read = read(Some(&seal), LABEL, reader, &notice);
            assert_eq!((read.verdict, read.starts), (Verdict::OtherStart, vec![a, b]), "{note}");
            assert!(read.text.starts_with("an abort notice of another start of this job"), "{}", read.text);
            assert!(read.text.ends_with(&format!(": {TEXT}")), "{}", read.text);
        }
        // A writer that knows no start: for no one.
        let none = encode(Some(&seal), LABEL, &[], TEXT);
        assert_eq!(read(Some(&seal), LABEL, Some(a), &none).verdict, Verdict::OtherStart);
        // At most four starts are named.
        let many: Vec<Start> = (0..6).map(|i| [i; START_LEN]).collect();
        let notice = encode(Some(&seal), LABEL, &many, TEXT);
        assert_eq!(read(Some(&seal), LABEL, Some(many[0]), &notice).starts, many[..MAX_STARTS]);
        assert_eq!(read(Some(&seal), LABEL, Some(many[5]), &notice).verdict, Verdict::OtherStart);
    }

    #[test]
    fn a_notice_without_the_keys_mac_does_not_count() {
        let (seal, start) = (seal("a job key of enough length"), [7; START_LEN]);
        let signed = encode(Some(&seal), LABEL, &[start], "stop");
        let flip = |at: usize| {
            let mut notice = signed.clone();
            notice[at] ^= 1;
            notice
        };
        let other_key = encode(Some(&self::seal("another job key of enough length")), LABEL, &[start], "stop");
        let other_label = encode(Some(&seal), "/gpucomm/v1/scope/1/abort", &[start], "stop");
        // A MAC over a count larger than the starts that precede it.
        let mut overcount = b"stop".to_vec();
        overcount.push(1);
        overcount.extend_from_slice(&seal.tag(LABEL, &overcount));
        for (notice, note) in [
            (b"rank 0: stop".to_vec(), "plain text"),
            (Vec::new(), "empty"),
            (signed[..TAG_LEN].to_vec(), "the MAC alone"),
            (flip(0), "text changed"),
            (flip(5), "start changed"),
            (flip(4 + START_LEN), "count changed"),
            (other_key, "another key"),
            (other_label, "another label"),
            (overcount, "a count past the notice's start"),
        ] {
            let read = read(Some(&seal), LABEL, Some(start), &notice);
            assert_eq!(read.verdict, Verdict::Unsigned, "{note}");
            assert!(read.text.starts_with("an abort notice without this job's MAC"), "{note}: {}", read.text);
        }
    }

    #[test]
    fn without_a_key_every_notice_counts_and_is_shown_clean() {
        let notice = encode(None, LABEL, &[[1; START_LEN]], "line\none");
        assert_eq!(notice, b"line\none");
        let read = read(None, LABEL, None, &notice);
        assert_eq!((read.text.as_str(), read.verdict), ("line one", Verdict::Counts));
        let long = vec![b'x'; 5000];
        assert_eq!(super::read(None, LABEL, None, &long).text.len(), SHOWN);
    }
}
