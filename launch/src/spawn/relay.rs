//! Copying each child's output to the parent's, one prefixed line at a time.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc::Sender;
#[cfg(test)]
use std::sync::{Arc, Mutex};

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
        }
    }
}

/// Starts a thread that copies `pipe` to `sink`, putting `prefix` before every line, and sends
/// on `done` (by dropping it) when the pipe closes.
pub(crate) fn start(pipe: impl Read + Send + 'static, prefix: String, sink: Sink, done: Sender<()>) -> io::Result<()> {
    std::thread::Builder::new().name(prefix.trim().to_string()).spawn(move || {
        copy_lines(pipe, prefix.as_bytes(), &sink);
        drop(done);
    })?;
    Ok(())
}

fn copy_lines(pipe: impl Read, prefix: &[u8], sink: &Sink) {
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
        copy_lines(&b"one\ntwo\n\nlast"[..], b"[rank 3] ", &sink);
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "[rank 3] one\n[rank 3] two\n[rank 3] \n[rank 3] last\n");
    }

    #[test]
    fn long_lines_are_cut() {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let input = vec![b'x'; MAX_LINE * 2 + 10];
        copy_lines(&input[..], b"> ", &Sink::Buffer(buffer.clone()));
        let out = buffer.lock().unwrap().clone();
        let lines: Vec<&[u8]> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.starts_with(b"> ")));
        assert_eq!(lines.iter().map(|l| l.len() - 2).sum::<usize>(), input.len());
    }
}
