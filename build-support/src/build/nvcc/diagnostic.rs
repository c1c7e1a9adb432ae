//! nvcc's diagnostics, read from its output.
//!
//! nvcc prints three shapes, from its different stages:
//!
//! * the CUDA front end (EDG): `kern.cu(12): error: expected a ";"`, also `warning #177-D: …` and
//!   `catastrophic error: …`;
//! * the host preprocessor (gcc, clang): `kern.cu:3:10: fatal error: x.h: No such file or directory`;
//! * the tools without a source position: `ptxas error   : …`, `nvlink error   : …`,
//!   `nvcc fatal   : Unsupported gpu architecture 'compute_70'`.
//!
//! Anything else (code excerpts, carets, "N errors detected", "In file included from") is context
//! and stays in the full output only.

use std::fmt;
use std::path::PathBuf;

/// How serious a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The compilation failed because of it (`error`, `fatal error`, `catastrophic error`, `fatal`).
    Error,
    /// A warning; the compilation went on.
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// One diagnostic: where, how serious, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file it is about, as nvcc printed it (absolute when nvcc was given an absolute path).
    /// `None` for tool messages without a position (ptxas, nvlink, nvcc's driver).
    pub file: Option<PathBuf>,
    /// The 1-based line, when there is a file.
    pub line: Option<u32>,
    /// Error or warning.
    pub severity: Severity,
    /// The message; for tool messages it starts with the tool's name (`ptxas: …`).
    pub message: String,
}

/// `path:line: error: message`, or `error: ptxas: message` without a position.
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{}:{line}: {}: {}", file.display(), self.severity, self.message),
            (Some(file), None) => write!(f, "{}: {}: {}", file.display(), self.severity, self.message),
            _ => write!(f, "{}: {}", self.severity, self.message),
        }
    }
}

/// Every diagnostic in nvcc's output, in order.
pub fn parse(output: &str) -> Vec<Diagnostic> {
    output.lines().filter_map(|l| front_end(l).or_else(|| preprocessor(l)).or_else(|| tool(l))).collect()
}

/// `error`, `fatal error`, `catastrophic error`, `internal error` → Error; `warning` → Warning;
/// anything else (notes, remarks) → not a diagnostic.
fn severity(word: &str) -> Option<Severity> {
    match word.trim() {
        "warning" => Some(Severity::Warning),
        w if w == "error" || w == "fatal" || w.ends_with(" error") => Some(Severity::Error),
        _ => None,
    }
}

/// `file(12): error: message`, `file(12): warning #177-D: message`.
fn front_end(line: &str) -> Option<Diagnostic> {
    let (head, message) = line.split_once("): ").and_then(|(pos, rest)| Some((pos, rest.split_once(": ")?)))?;
    let (file, number) = head.rsplit_once('(')?;
    let line_no = number.parse().ok()?;
    let (kind, message) = message;
    let word = kind.split(" #").next()?;
    Some(Diagnostic {
        file: Some(PathBuf::from(file)),
        line: Some(line_no),
        severity: severity(word)?,
        message: message.to_string(),
    })
}

/// `file:3:10: fatal error: message` or `file:3: error: message`.
fn preprocessor(line: &str) -> Option<Diagnostic> {
    let mut parts = line.splitn(4, ':');
    let file = parts.next().filter(|f| !f.is_empty())?;
    let line_no: u32 = parts.next()?.parse().ok()?;
    let mut rest = parts.next()?;
    let mut tail = parts.next()?;
    if rest.parse::<u32>().is_ok() {
        // A column: the severity and message follow.
        (rest, tail) = tail.split_once(':')?;
    }
    Some(Diagnostic {
        file: Some(PathBuf::from(file)),
        line: Some(line_no),
        severity: severity(rest)?,
        message: tail.trim_start().to_string(),
    })
}

/// `ptxas error   : message`, `nvcc fatal   : message`.
fn tool(line: &str) -> Option<Diagnostic> {
    let (head, message) = line.split_once(" : ").or_else(|| line.split_once(": "))?;
    let mut words = head.split_whitespace();
    let tool = words.next()?;
    let word = words.next()?;
    if words.next().is_some() || !matches!(tool, "nvcc" | "ptxas" | "nvlink" | "fatbinary" | "cicc" | "cudafe++") {
        return None;
    }
    Some(Diagnostic {
        file: None,
        line: None,
        severity: severity(word)?,
        message: format!("{tool}: {}", message.trim()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_shapes() {
        let out = "\
/src/bad.cu(4): error: expected a \";\"
    }
    ^

/src/bad.cu(5): warning #177-D: variable \"x\" was declared but never referenced
/src/inc/x.cuh(7): catastrophic error: cannot open source file \"y.h\"
2 errors detected in the compilation of \"/src/bad.cu\".
In file included from /src/a.cu:1:
/src/a.h:3:10: fatal error: missing.h: No such file or directory
/src/b.cu:9: error: something
/src/b.cu:9:1: note: a note
ptxas error   : Entry function 'k' uses too much shared data (0x10000 bytes, 0xc000 max)
nvcc fatal   : Unsupported gpu architecture 'compute_70'
nvlink error   : Undefined reference to 'nvshmem_x' in '/out/ring.o'
Remark: The warnings can be suppressed with \"-diag-suppress <warning-number>\"
";
        let shown: Vec<String> = parse(out).iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "/src/bad.cu:4: error: expected a \";\"",
                "/src/bad.cu:5: warning: variable \"x\" was declared but never referenced",
                "/src/inc/x.cuh:7: error: cannot open source file \"y.h\"",
                "/src/a.h:3: error: missing.h: No such file or directory",
                "/src/b.cu:9: error: something",
                "error: ptxas: Entry function 'k' uses too much shared data (0x10000 bytes, 0xc000 max)",
                "error: nvcc: Unsupported gpu architecture 'compute_70'",
                "error: nvlink: Undefined reference to 'nvshmem_x' in '/out/ring.o'",
            ]
        );
    }

    #[test]
    fn paths_with_parentheses_and_colons_in_messages() {
        let d = &parse("/a (copy)/k.cu(12): error: no instance of \"f\" matches: (int)")[0];
        assert_eq!(d.file.as_deref(), Some(std::path::Path::new("/a (copy)/k.cu")));
        assert_eq!(d.line, Some(12));
        assert_eq!(d.message, "no instance of \"f\" matches: (int)");
    }
}
