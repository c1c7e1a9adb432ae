//! Where a bench run goes as it happens: printed (table or, at the end, JSON), or — in a rank
//! started by `gpucomm bench`'s own spawner — written as JSON lines to a file the parent reads,
//! so that the parent prints a clean table instead of `[rank 0]`-prefixed lines.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::results::{Row, Run};
use super::table::{self, Header};
use crate::error::{CliError, Result};
use crate::progress::Progress;
use crate::units::human_bytes;

/// The variable that tells a spawned rank 0 where to write its events.
pub const EVENTS_VAR: &str = "GPUCOMM_BENCH_EVENTS";

/// One step of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Parameters and devices, before any row.
    Header(Header),
    /// One measured size.
    Row(Row),
    /// The whole run, at the end.
    Done(Run),
}

/// Receives events.
pub trait Sink {
    /// Handles one event.
    fn event(&mut self, e: Event) -> Result<()>;
}

/// Prints the table as rows arrive (or nothing until the end with `--json`), and keeps what the
/// final report needs.
pub struct Printer {
    json: bool,
    /// With `--json` nothing is printed until the end: a progress line shows the sizes done.
    progress: Option<Progress>,
    /// The header, once seen.
    pub header: Option<Header>,
    /// The run, once done.
    pub run: Option<Run>,
}

impl Printer {
    /// A printer for the table (`json == false`) or for one JSON document at the end.
    pub fn new(json: bool) -> Self {
        Printer { json, progress: None, header: None, run: None }
    }
}

fn stdout_error(e: std::io::Error) -> CliError {
    CliError::Io { what: "writing to", path: PathBuf::from("standard output"), source: e }
}

impl Sink for Printer {
    fn event(&mut self, e: Event) -> Result<()> {
        let mut out = std::io::stdout().lock();
        match e {
            Event::Header(h) => {
                if self.json {
                    let sizes =
                        std::iter::successors(Some(h.min_bytes), |s| s.checked_mul(h.factor).filter(|n| *n > *s))
                            .take_while(|s| *s <= h.max_bytes)
                            .count();
                    self.progress = Some(Progress::new(format!("bench {}", h.collective), sizes));
                } else {
                    table::write_header(&mut out, &h).map_err(stdout_error)?;
                }
                self.header = Some(h);
            }
            Event::Row(r) => match (self.json, self.progress.as_mut()) {
                (_, Some(p)) => p.step(&human_bytes(r.size)),
                (false, None) => table::write_row(&mut out, &r).map_err(stdout_error)?,
                (true, None) => {}
            },
            Event::Done(run) => {
                if let Some(p) = self.progress.take() {
                    p.finish();
                }
                if !self.json {
                    table::write_footer(&mut out, &run).map_err(stdout_error)?;
                }
                self.run = Some(run);
            }
        }
        out.flush().map_err(stdout_error)
    }
}

/// Writes events as JSON lines (a spawned rank 0).
pub struct EventFile {
    file: File,
    path: PathBuf,
}

impl EventFile {
    /// Creates `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).map_err(|source| CliError::Io { what: "creating", path: path.into(), source })?;
        Ok(EventFile { file, path: path.into() })
    }
}

impl Sink for EventFile {
    fn event(&mut self, e: Event) -> Result<()> {
        let line =
            serde_json::to_string(&e).map_err(|source| CliError::Json { what: "a bench event".into(), source })?;
        writeln!(self.file, "{line}").and_then(|()| self.file.flush()).map_err(|source| CliError::Io {
            what: "writing",
            path: self.path.clone(),
            source,
        })
    }
}

/// Follows an event file that another process is writing, handing complete lines to `sink`.
pub struct Follower {
    reader: Option<BufReader<File>>,
    path: PathBuf,
    partial: String,
}

impl Follower {
    /// Follows `path` (which may not exist yet).
    pub fn new(path: &Path) -> Self {
        Follower { reader: None, path: path.into(), partial: String::new() }
    }

    /// Hands every complete new line to `sink`.
    pub fn poll(&mut self, sink: &mut dyn Sink) -> Result<()> {
        if self.reader.is_none() {
            match File::open(&self.path) {
                Ok(f) => self.reader = Some(BufReader::new(f)),
                Err(_) => return Ok(()),
            }
        }
        let Some(reader) = self.reader.as_mut() else { return Ok(()) };
        loop {
            let n = reader.read_line(&mut self.partial).map_err(|source| CliError::Io {
                what: "reading",
                path: self.path.clone(),
                source,
            })?;
            if n == 0 || !self.partial.ends_with('\n') {
                return Ok(());
            }
            let line = std::mem::take(&mut self.partial);
            let event = serde_json::from_str(line.trim_end())
                .map_err(|source| CliError::Json { what: format!("bench event {:?}", line.trim_end()), source })?;
            sink.event(event)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::Measure;

    struct Keep(Vec<Event>);
    impl Sink for Keep {
        fn event(&mut self, e: Event) -> Result<()> {
            self.0.push(e);
            Ok(())
        }
    }

    #[test]
    fn events_travel_through_a_file_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut follower = Follower::new(&path);
        let mut keep = Keep(Vec::new());
        follower.poll(&mut keep).unwrap();
        assert!(keep.0.is_empty(), "a file that does not exist yet is no error");
        let mut writer = EventFile::create(&path).unwrap();
        let row = Row {
            size: 8,
            count: 2,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: Some(Measure { time_us: 9.5, algbw: 0.0, busbw: 0.0, wrong: Some(0), ..Measure::default() }),
            in_place: None,
        };
        writer.event(Event::Row(row.clone())).unwrap();
        follower.poll(&mut keep).unwrap();
        assert!(matches!(&keep.0[..], [Event::Row(r)] if *r == row));
        // Half a line is kept until the rest arrives.
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        write!(f, "{{\"event\":\"row\",").unwrap();
        f.flush().unwrap();
        follower.poll(&mut keep).unwrap();
        assert_eq!(keep.0.len(), 1);
        let rest = serde_json::to_string(&Event::Row(row)).unwrap();
        writeln!(f, "{}", &rest["{\"event\":\"row\",".len()..]).unwrap();
        follower.poll(&mut keep).unwrap();
        assert_eq!(keep.0.len(), 2);
    }
}
