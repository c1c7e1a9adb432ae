//! Copying each child's output to the parent's, one prefixed line at a time.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
#[cfg(test)]
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines longer than this are cut into pieces (so a child that never prints a newline cannot
/// make the parent buffer without bound).
const MAX_LINE: usize = 64 * 1024;

/// Where relayed lines go.
#[derive(Clone, Debug)]
pub(crate) enum Sink {
    /// The parent's standard output.
    Stdout,
    /// The parent's standard error.
    Stderr,
    /// A buffer (tests).
    #[cfg(test)]
    Buffer(Arc<Mutex<Vec<u8>>>),
    /// A buffer that takes each line only after a pause, like a terminal that drains slowly
    /// (tests).
    #[cfg(test)]
    Slow(Arc<Mutex<Vec<u8>>>, Duration),
}

impl Sink {
    /// Writes one whole line; errors (a closed terminal, a full pipe) are ignored so the child's
    /// output keeps being drained.
    fn write_line(&self, line: &[u8]) {
        match self {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                let _ = out.write_all(line).and_then(|()| out.flush());
            }
            Sink::Stderr => {
                let _ = io::stderr().lock().write_all(line);
            }
            #[cfg(test)]
            Sink::Buffer(buffer) => {
                if let Ok(mut buffer) = buffer.lock() {
                    buffer.extend_from_slice(line);
                }
            }
            #[cfg(test)]
            Sink::Slow(buffer, pause) => {
                std::thread::sleep(*pause);
                Sink::Buffer(buffer.clone()).write_line(line);
            }
        }
    }
}

/// The relay threads of one spawn: each tells when its pipe closes (by dropping its sender) and
/// counts the lines it relayed.
pub(crate) struct Relays {
    done: Sender<()>,
    finished: Receiver<()>,
    lines: Arc<AtomicU64>,
}

/// How often [`Relays::wait`] looks at the relays' progress.
const LOOK: Duration = Duration::from_millis(50);

impl Relays {
    pub(crate) fn new() -> Relays {
        let (done, finished) = mpsc::channel();
        Relays { done, finished, lines: Arc::default() }
    }

    /// Starts a thread that copies `pipe` to `sink`, putting `prefix` before every line.
    pub(crate) fn start(&self, pipe: impl Read + Send + 'static, prefix: String, sink: Sink) -> io::Result<()> {
        let (done, lines) = (self.done.clone(), self.lines.clone());
        std::thread::Builder::new().name(prefix.trim().to_string()).spawn(move || {
            copy_lines(pipe, prefix.as_bytes(), &sink, &lines);
            drop(done);
        })?;
        Ok(())
    }

    /// Waits for every relay to finish (every child's pipes closed, once the children exited)
    /// while they relay lines: gives up after `quiet` without a line relayed (a grandchild may
    /// hold a pipe open, or the parent's output may not drain), or after `limit` in all (a
    /// grandchild that keeps printing).
    pub(crate) fn wait(self, quiet: Duration, limit: Duration) {
        let Relays { done, finished, lines } = self;
        drop(done);
        let start = Instant::now();
        let (mut seen, mut progress) = (lines.load(Ordering::Relaxed), start);
        while start.elapsed() < limit {
            match finished.recv_timeout(LOOK) {
                Err(RecvTimeoutError::Timeout) => {}
                // Every sender dropped: every relay finished (nothing is ever sent).
                _ => return,
            }
            let now = lines.load(Ordering::Relaxed);
            if now != seen {
                (seen, progress) = (now, Instant::now());
            } else if progress.elapsed() >= quiet {
                return;
            }
        }
    }
}

fn copy_lines(pipe: impl Read, prefix: &[u8], sink: &Sink, lines: &AtomicU64) {
    let mut reader = BufReader::new(pipe);
    let mut line = prefix.to_vec();
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if chunk.is_empty() {
            break;
        }
        let (used, complete) = match chunk.iter().position(|&b| b == b'\n') {
            Some(newline) => (newline + 1, true),
            None => (chunk.len(), false),
        };
        line.extend_from_slice(&chunk[..used]);
        reader.consume(used);
        if complete || line.len() >= prefix.len() + MAX_LINE {
            if !complete {
                line.push(b'\n');
            }
            sink.write_line(&line);
            lines.fetch_add(1, Ordering::Relaxed);
            line.truncate(prefix.len());
        }
    }
    if line.len() > prefix.len() {
        line.push(b'\n');
        sink.write_line(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_every_line_and_ends_the_last() {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink::Buffer(buffer.clone());
        copy_lines(&b"one\ntwo\n\nlast"[..], b"[rank 3] ", &sink, &AtomicU64::new(0));
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "[rank 3] one\n[rank 3] two\n[rank 3] \n[rank 3] last\n");
    }

    #[test]
    fn long_lines_are_cut() {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let input = vec![b'x'; MAX_LINE * 2 + 10];
        copy_lines(&input[..], b"> ", &Sink::Buffer(buffer.clone()), &AtomicU64::new(0));
        let out = buffer.lock().unwrap().clone();
        let lines: Vec<&[u8]> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.starts_with(b"> ")));
        assert_eq!(lines.iter().map(|l| l.len() - 2).sum::<usize>(), input.len());
    }
}
