//! The doctor's report: checks in layers, each ✓ (fine), ✗ (a problem, with a one-line fix),
//! ! (worth knowing, may be a problem) or • (information), printed for people or as JSON.

use std::fmt::Write as _;

use serde::Serialize;

/// The layer a check belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    /// GPUs, links, topology, peer access (NVML, CUDA driver).
    Physical,
    /// Libraries, versions, environment.
    Software,
    /// What NCCL and NVSHMEM really do in a short run.
    Live,
}

impl Layer {
    fn title(self) -> &'static str {
        match self {
            Layer::Physical => "Physical: GPUs, NVLink, topology, peer access",
            Layer::Software => "Software: libraries, versions, environment",
            Layer::Live => "Live: one process per GPU, NCCL and NVSHMEM at work",
        }
    }
}

/// The verdict of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// ✓
    Pass,
    /// ✗ — makes the command exit non-zero.
    Fail,
    /// ! — worth a look.
    Warn,
    /// • — facts.
    Info,
}

impl Status {
    /// The mark printed before the title.
    pub fn mark(self) -> &'static str {
        match self {
            Status::Pass => "✓",
            Status::Fail => "✗",
            Status::Warn => "!",
            Status::Info => "•",
        }
    }
}

/// One line of the report, with optional detail lines and a fix.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// Its layer.
    pub layer: Layer,
    /// Its verdict.
    pub status: Status,
    /// One line.
    pub title: String,
    /// Further lines (tables, lists).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub detail: Vec<String>,
    /// What to do, for ✗ and ! checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// A check with a title and nothing else.
    pub fn new(layer: Layer, status: Status, title: impl Into<String>) -> Self {
        Check { layer, status, title: title.into(), detail: Vec::new(), fix: None }
    }

    /// A ✗ with its fix.
    pub fn fail(layer: Layer, title: impl Into<String>, fix: impl Into<String>) -> Self {
        Check::new(layer, Status::Fail, title).with_fix(fix)
    }

    /// A ! with its fix.
    pub fn warn(layer: Layer, title: impl Into<String>, fix: impl Into<String>) -> Self {
        Check::new(layer, Status::Warn, title).with_fix(fix)
    }

    /// Adds the fix line.
    pub fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    /// Adds detail lines.
    pub fn with_detail(mut self, lines: impl IntoIterator<Item = String>) -> Self {
        self.detail.extend(lines);
        self
    }
}

/// The whole report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Every check, in the order found.
    pub checks: Vec<Check>,
}

impl Report {
    /// Adds a check.
    pub fn push(&mut self, check: Check) {
        self.checks.push(check);
    }

    /// Number of ✗.
    pub fn failures(&self) -> usize {
        self.count(Status::Fail)
    }

    fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }

    /// The report for people: layers in order, each check on its line, details indented, the fix
    /// after `fix:`, and a summary line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for layer in [Layer::Physical, Layer::Software, Layer::Live] {
            let checks: Vec<&Check> = self.checks.iter().filter(|c| c.layer == layer).collect();
            if checks.is_empty() {
                continue;
            }
            let _ = writeln!(out, "{}", layer.title());
            for c in checks {
                let _ = writeln!(out, "  {} {}", c.status.mark(), c.title);
                for line in &c.detail {
                    let _ = writeln!(out, "      {line}");
                }
                if let Some(fix) = &c.fix {
                    let _ = writeln!(out, "      fix: {fix}");
                }
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "{} ✗ problem(s), {} ! warning(s), {} ✓ passed",
            self.count(Status::Fail),
            self.count(Status::Warn),
            self.count(Status::Pass)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_layers_marks_details_and_fixes() {
        let mut r = Report::default();
        r.push(Check::new(Layer::Live, Status::Pass, "NCCL uses P2P"));
        r.push(
            Check::fail(Layer::Physical, "GPU0: 16 of 18 NVLink links up", "reset the GPU")
                .with_detail(["links 3, 7 down".to_string()]),
        );
        r.push(Check::warn(Layer::Software, "two NCCL versions", "set LD_LIBRARY_PATH"));
        assert_eq!(r.failures(), 1);
        let text = r.render();
        assert_eq!(
            text,
            "Physical: GPUs, NVLink, topology, peer access\n  ✗ GPU0: 16 of 18 NVLink links up\n      links 3, 7 down\n      fix: reset the GPU\n\n\
             Software: libraries, versions, environment\n  ! two NCCL versions\n      fix: set LD_LIBRARY_PATH\n\n\
             Live: one process per GPU, NCCL and NVSHMEM at work\n  ✓ NCCL uses P2P\n\n\
             1 ✗ problem(s), 1 ! warning(s), 1 ✓ passed\n"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["checks"][1]["status"], "fail");
        assert_eq!(json["checks"][1]["fix"], "reset the GPU");
        assert!(json["checks"][0].get("fix").is_none());
    }
}
