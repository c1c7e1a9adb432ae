//! A one-line progress display on stderr, shown only when stderr is a terminal (logs and pipes
//! stay clean).

use std::io::{IsTerminal, Write};
use std::time::Instant;

/// Progress of a long step: `label  [#####.....]  3/8  12 s  what`.
pub struct Progress {
    label: String,
    total: usize,
    done: usize,
    started: Instant,
    shown: bool,
}

impl Progress {
    /// A display for `total` steps.
    pub fn new(label: impl Into<String>, total: usize) -> Self {
        Progress {
            label: label.into(),
            total,
            done: 0,
            started: Instant::now(),
            shown: std::io::stderr().is_terminal(),
        }
    }

    /// Marks one more step done, now working on `what`.
    pub fn step(&mut self, what: &str) {
        self.done = (self.done + 1).min(self.total);
        self.draw(what);
    }

    /// Shows `what` without counting a step.
    pub fn note(&mut self, what: &str) {
        self.draw(what);
    }

    fn draw(&self, what: &str) {
        if !self.shown {
            return;
        }
        let line = render(&self.label, self.done, self.total, self.started.elapsed().as_secs(), what);
        let _ = write!(std::io::stderr().lock(), "\r\x1b[2K{line}");
    }

    /// Clears the line.
    pub fn finish(self) {
        if self.shown {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
        }
    }
}

fn render(label: &str, done: usize, total: usize, secs: u64, what: &str) -> String {
    const WIDTH: usize = 20;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
    format!("{label}  [{}{}]  {done}/{total}  {secs} s  {what}", "#".repeat(filled), ".".repeat(WIDTH - filled))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bar() {
        assert_eq!(super::render("bench", 5, 10, 3, "1 MiB"), "bench  [##########..........]  5/10  3 s  1 MiB");
        assert_eq!(super::render("x", 0, 0, 0, ""), "x  [####################]  0/0  0 s  ");
    }
}
