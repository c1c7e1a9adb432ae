//! Crossover tables: which path an all-reduce of a given size takes, eagerly and inside a CUDA
//! graph capture.
//!
//! A table is plain text, so that a measured one can be committed, read back and diffed:
//!
//! ```text
//! # comments start with '#'
//! source: 2×H200 (NV18), NCCL 2.28.9, docs/bench/dispatch.md
//! gpu: H200
//! ranks: 2
//! [eager]
//! ll <= 64K
//! one-shot <= 512K
//! two-shot <= 32M
//! nccl
//! [graph]
//! ll <= 64K
//! one-shot <= 1M
//! two-shot
//! ```
//!
//! Each section lists steps in increasing size: `path <= size` takes every message of at most
//! `size` bytes not taken by an earlier step, and the last step (a path alone) takes every larger
//! one. Sizes are bytes, or K/M/G (binary). A table without `[graph]` uses its `[eager]` steps for
//! captured calls too; `source`, `gpu` and `ranks` are optional (`gpu` and `ranks` say which
//! machines a built-in table is for). [`Table::to_text`] writes what [`Table::parse`] reads.

use std::fmt;

pub use crate::path::Path;

use crate::error::{Error, Result};

/// Calls made eagerly, or recorded into a CUDA graph (whose replays cost no host time per call,
/// which moves the crossovers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Enqueued directly.
    Eager,
    /// Captured into a CUDA graph.
    Graph,
}

impl Mode {
    /// `eager` or `graph`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Graph => "graph",
        }
    }
}

/// One step of a section: `path` for messages up to `upto` bytes (every larger one for `None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The largest message of this step in bytes; `None` for the last step.
    pub upto: Option<u64>,
    /// The path.
    pub path: Path,
}

/// The crossovers of the dispatching all-reduce: for eager and for captured calls, the path of
/// each message size (see the [module docs](self) for the text form).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    eager: Vec<Step>,
    graph: Vec<Step>,
    source: String,
    gpu: Option<String>,
    ranks: Option<usize>,
}

/// The table measured on 2×H200 (NVLink), committed with the crate.
const H200_2: &str = include_str!("../tables/h200-2.txt");

impl Table {
    /// A number that differs between tables whose steps differ (FNV-1a over both sections'
    /// steps): what the ranks compare to make sure they pick the same paths.
    pub(crate) fn fingerprint(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |value: u64| {
            for byte in value.to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        for (section, steps) in [&self.eager, &self.graph].into_iter().enumerate() {
            eat(section as u64);
            for step in steps {
                eat(step.upto.unwrap_or(u64::MAX));
                eat(Path::ALL.iter().position(|&p| p == step.path).unwrap_or(Path::ALL.len()) as u64);
            }
        }
        hash
    }

    /// Reads a table from its text form.
    pub fn parse(text: &str) -> Result<Table> {
        let mut eager = Vec::new();
        let mut graph = Vec::new();
        let (mut source, mut gpu, mut ranks) = (None, None, None);
        let mut section: Option<Mode> = None;
        let mut seen_graph = false;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            let at = i + 1;
            let bad = |reason: String| Error::Table { line: at, reason };
            if line.is_empty() {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = Some(match name.trim() {
                    "eager" if eager.is_empty() => Mode::Eager,
                    "graph" if !seen_graph => {
                        seen_graph = true;
                        Mode::Graph
                    }
                    "eager" | "graph" => return Err(bad(format!("section [{name}] appears twice"))),
                    other => return Err(bad(format!("unknown section [{other}] (eager, graph)"))),
                });
                continue;
            }
            if let Some((key, value)) = line.split_once(':') {
                let value = value.trim().to_string();
                match key.trim() {
                    "source" => source = Some(value),
                    "gpu" => gpu = Some(value),
                    "ranks" => ranks = Some(value.parse().map_err(|_| bad(format!("ranks: {value:?} is no number")))?),
                    other => return Err(bad(format!("unknown key {other:?} (source, gpu, ranks)"))),
                }
                continue;
            }
            let steps = match section {
                Some(Mode::Eager) => &mut eager,
                Some(Mode::Graph) => &mut graph,
                None => return Err(bad("a step before the first [eager] or [graph] section".into())),
            };
            steps.push(parse_step(line).map_err(bad)?);
        }
        if eager.is_empty() {
            return Err(Error::Table { line: 0, reason: "no [eager] section with steps".into() });
        }
        if seen_graph && graph.is_empty() {
            return Err(Error::Table { line: 0, reason: "an empty [graph] section".into() });
        }
        if graph.is_empty() {
            graph = eager.clone();
        }
        let mut t = Table::new(eager, graph, source.unwrap_or_else(|| "unnamed table".into()))?;
        (t.gpu, t.ranks) = (gpu, ranks);
        Ok(t)
    }

    /// A table from its steps (each list as in the text form: increasing limits, the last step
    /// without one).
    pub fn new(eager: Vec<Step>, graph: Vec<Step>, source: impl Into<String>) -> Result<Table> {
        for (mode, steps) in [(Mode::Eager, &eager), (Mode::Graph, &graph)] {
            check_steps(steps)
                .map_err(|reason| Error::Table { line: 0, reason: format!("[{}]: {reason}", mode.name()) })?;
        }
        Ok(Table { eager, graph, source: source.into(), gpu: None, ranks: None })
    }

    /// Every message through NCCL.
    pub fn nccl_only() -> Table {
        let all = vec![Step { upto: None, path: Path::Nccl }];
        Table { eager: all.clone(), graph: all, source: "NCCL only".into(), gpu: None, ranks: None }
    }

    /// The committed table for this machine — a GPU whose name contains the table's `gpu` and a
    /// communicator of its `ranks` — or else the 2×H200 table (the only one measured so far),
    /// whose [`Table::source`] then says that it was measured elsewhere. Calibrate
    /// ([`crate::AllReduce::calibrate`]) on other machines.
    pub fn builtin(gpu_name: &str, ranks: usize) -> Table {
        let mut t = Table::parse(H200_2).expect("the committed table parses (unit-tested)");
        let matches = t.gpu.as_deref().is_some_and(|g| gpu_name.contains(g)) && t.ranks == Some(ranks);
        if !matches {
            t.source = format!("{} — measured on another machine ({gpu_name}, {ranks} ranks here)", t.source);
        }
        t
    }

    /// Where the table comes from (its `source:` line, or what made it).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The steps for `mode`.
    pub fn steps(&self, mode: Mode) -> &[Step] {
        match mode {
            Mode::Eager => &self.eager,
            Mode::Graph => &self.graph,
        }
    }

    /// The path for a message of `bytes` in `mode`.
    pub fn choose(&self, bytes: u64, mode: Mode) -> Path {
        let steps = self.steps(mode);
        steps.iter().find(|s| s.upto.is_none_or(|u| bytes <= u)).map_or(Path::Nccl, |s| s.path)
    }

    /// The table in its text form (which [`Table::parse`] reads back).
    pub fn to_text(&self) -> String {
        let mut out = format!("source: {}\n", self.source.replace('\n', " "));
        if let Some(g) = &self.gpu {
            out += &format!("gpu: {g}\n");
        }
        if let Some(r) = self.ranks {
            out += &format!("ranks: {r}\n");
        }
        for mode in [Mode::Eager, Mode::Graph] {
            out += &format!("[{}]\n", mode.name());
            for s in self.steps(mode) {
                match s.upto {
                    Some(u) => out += &format!("{} <= {}\n", s.path, size_text(u)),
                    None => out += &format!("{}\n", s.path),
                }
            }
        }
        out
    }

    /// The table that picks, at each measured size, the fastest path: `eager` and `graph` hold
    /// `(bytes, path, µs)` measurements (several paths per size; sizes in any order). Between two
    /// measured sizes the smaller one's winner is kept; above the largest, its winner. A mode
    /// without measurements falls back to NCCL.
    pub fn from_measurements(
        eager: &[(u64, Path, f64)],
        graph: &[(u64, Path, f64)],
        source: impl Into<String>,
    ) -> Table {
        Table {
            eager: fastest_steps(eager),
            graph: fastest_steps(graph),
            source: source.into(),
            gpu: None,
            ranks: None,
        }
    }

    /// The same table, marked as made for GPUs named like `gpu` in communicators of `ranks`.
    pub fn for_machine(mut self, gpu: impl Into<String>, ranks: usize) -> Table {
        self.gpu = Some(gpu.into());
        self.ranks = Some(ranks);
        self
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

fn parse_step(line: &str) -> Result<Step, String> {
    let (path, upto) = match line.split_once("<=") {
        Some((p, s)) => (p.trim(), Some(parse_size(s.trim())?)),
        None => (line, None),
    };
    let path = Path::parse(path).ok_or_else(|| format!("unknown path {path:?} (nccl, ll, one-shot, two-shot)"))?;
    Ok(Step { upto, path })
}

/// Increasing limits, and exactly the last step without one.
fn check_steps(steps: &[Step]) -> Result<(), String> {
    let Some(last) = steps.last() else { return Err("no steps".into()) };
    if last.upto.is_some() {
        return Err(format!(
            "the last step ({} <= …) must have no limit: say which path takes larger messages",
            last.path
        ));
    }
    let mut prev = None;
    for s in &steps[..steps.len() - 1] {
        let Some(u) = s.upto else {
            return Err(format!("only the last step may have no limit ({} has none)", s.path));
        };
        if prev.is_some_and(|p| u <= p) {
            return Err(format!(
                "limits must increase ({} <= {} after {})",
                s.path,
                size_text(u),
                size_text(prev.unwrap_or(0))
            ));
        }
        prev = Some(u);
    }
    Ok(())
}

/// `64K` → 65536; binary K/M/G, or plain bytes.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| format!("{s:?} is no size (bytes, or a number with K, M or G)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("{s:?} is too large"))
}

/// 65536 → `64K`: the largest binary unit that divides the size.
pub(crate) fn size_text(bytes: u64) -> String {
    for (shift, unit) in [(30, 'G'), (20, 'M'), (10, 'K')] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

fn fastest_steps(measured: &[(u64, Path, f64)]) -> Vec<Step> {
    let mut sizes: Vec<u64> = measured.iter().map(|m| m.0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let winner = |size: u64| {
        measured
            .iter()
            .filter(|m| m.0 == size && m.2.is_finite())
            .min_by(|a, b| a.2.total_cmp(&b.2).then(a.1.cmp(&b.1)))
            .map(|m| m.1)
    };
    let mut steps: Vec<Step> = Vec::new();
    for size in sizes {
        let Some(path) = winner(size) else { continue };
        match steps.last_mut() {
            Some(last) if last.path == path => last.upto = Some(size),
            _ => steps.push(Step { upto: Some(size), path }),
        }
    }
    match steps.last_mut() {
        Some(last) => last.upto = None,
        None => steps.push(Step { upto: None, path: Path::Nccl }),
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# a test table\nsource: test\ngpu: H200\nranks: 2\n[eager]\nll <= 64K\none-shot <= 512K # comment\ntwo-shot <= 32M\nnccl\n[graph]\nll <= 64K\ntwo-shot\n";

    #[test]
    fn a_table_parses_and_chooses_by_size_and_mode() {
        let t = Table::parse(SAMPLE).unwrap();
        assert_eq!(t.source(), "test");
        let e = |b| t.choose(b, Mode::Eager);
        assert_eq!(
            [e(8), e(64 << 10), e((64 << 10) + 1), e(512 << 10), e(1 << 20), e(32 << 20), e((32 << 20) + 4)],
            [Path::Ll, Path::Ll, Path::OneShot, Path::OneShot, Path::TwoShot, Path::TwoShot, Path::Nccl]
        );
        assert_eq!(t.choose(1 << 20, Mode::Graph), Path::TwoShot);
        assert_eq!(t.choose(8 << 30, Mode::Graph), Path::TwoShot);
    }

    #[test]
    fn the_text_form_round_trips() {
        let t = Table::parse(SAMPLE).unwrap();
        let again = Table::parse(&t.to_text()).unwrap();
        assert_eq!(t, again);
        assert!(t.to_text().contains("one-shot <= 512K\n"), "{}", t.to_text());
    }

    #[test]
    fn without_a_graph_section_captured_calls_use_the_eager_steps() {
        let t = Table::parse("[eager]\nll <= 4K\nnccl\n").unwrap();
        assert_eq!(t.steps(Mode::Graph), t.steps(Mode::Eager));
        assert_eq!(t.source(), "unnamed table");
    }

    #[test]
    fn bad_tables_are_refused_with_the_line() {
        let err = |text: &str| Table::parse(text).unwrap_err().to_string();
        assert_eq!(err("[eager]\nll <= 4K\n"), "crossover table, line 0: [eager]: the last step (ll <= …) must have no limit: say which path takes larger messages");
        assert_eq!(
            err("[eager]\nll <= 4K\none-shot <= 4K\nnccl\n"),
            "crossover table, line 0: [eager]: limits must increase (one-shot <= 4K after 4K)"
        );
        assert_eq!(
            err("[eager]\nll\nnccl\n"),
            "crossover table, line 0: [eager]: only the last step may have no limit (ll has none)"
        );
        assert_eq!(
            err("[eager]\nfast <= 4K\nnccl\n"),
            "crossover table, line 2: unknown path \"fast\" (nccl, ll, one-shot, two-shot)"
        );
        assert_eq!(
            err("[eager]\nll <= 4Q\nnccl\n"),
            "crossover table, line 2: \"4Q\" is no size (bytes, or a number with K, M or G)"
        );
        assert_eq!(err("ll <= 4K\n"), "crossover table, line 1: a step before the first [eager] or [graph] section");
        assert_eq!(err("[eager]\nnccl\n[eager]\nnccl\n"), "crossover table, line 3: section [eager] appears twice");
        assert_eq!(err("[fast]\n"), "crossover table, line 1: unknown section [fast] (eager, graph)");
        assert_eq!(
            err("speed: 3\n[eager]\nnccl\n"),
            "crossover table, line 1: unknown key \"speed\" (source, gpu, ranks)"
        );
        assert_eq!(err("[graph]\nnccl\n"), "crossover table, line 0: no [eager] section with steps");
        assert_eq!(err("[eager]\nnccl\n[graph]\n"), "crossover table, line 0: an empty [graph] section");
    }

    #[test]
    fn sizes_read_and_write_in_binary_units() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("3m").unwrap(), 3 << 20);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert!(parse_size("99999999999G").is_err());
        assert_eq!(
            [size_text(8), size_text(64 << 10), size_text(1536), size_text(3 << 20), size_text(8 << 30)],
            ["8", "64K", "1536", "3M", "8G"]
        );
    }

    #[test]
    fn measurements_become_steps_of_the_fastest_path() {
        let m = [
            (8, Path::Nccl, 6.0),
            (8, Path::Ll, 3.0),
            (64 << 10, Path::Ll, 3.5),
            (64 << 10, Path::OneShot, 5.0),
            (1 << 20, Path::OneShot, 9.9),
            (1 << 20, Path::TwoShot, 9.6),
            (1 << 20, Path::Nccl, f64::NAN),
            (64 << 20, Path::TwoShot, 210.0),
            (64 << 20, Path::Nccl, 240.0),
        ];
        let t = Table::from_measurements(&m, &[], "measured");
        assert_eq!(
            t.steps(Mode::Eager),
            [Step { upto: Some(64 << 10), path: Path::Ll }, Step { upto: None, path: Path::TwoShot }]
        );
        assert_eq!(t.steps(Mode::Graph), [Step { upto: None, path: Path::Nccl }]);
        // What it writes parses back into the same table.
        assert_eq!(Table::parse(&t.to_text()).unwrap(), t);
    }

    #[test]
    fn the_committed_table_parses_and_names_its_machine() {
        let t = Table::builtin("NVIDIA H200", 2);
        assert!(!t.source().contains("another machine"), "{}", t.source());
        let other = Table::builtin("NVIDIA A100-SXM4-80GB", 8);
        assert!(other.source().contains("measured on another machine (NVIDIA A100-SXM4-80GB, 8 ranks here)"));
        assert_eq!(t.steps(Mode::Eager), other.steps(Mode::Eager));
    }

    #[test]
    fn tables_with_other_steps_have_other_fingerprints() {
        // What AllReduce::new compares across the ranks: the steps, not the names.
        let h200 = Table::builtin("NVIDIA H200", 2);
        let elsewhere = Table::builtin("NVIDIA A100-SXM4-80GB", 8);
        assert_eq!(h200.fingerprint(), elsewhere.fingerprint(), "same steps, other machine names");
        assert_ne!(h200.fingerprint(), Table::nccl_only().fingerprint());
        let one = |path| Table::new(vec![Step { upto: None, path }], vec![Step { upto: None, path }], "x").unwrap();
        assert_ne!(one(Path::Ll).fingerprint(), one(Path::OneShot).fingerprint());
        let eager_only =
            Table::new(vec![Step { upto: None, path: Path::Ll }], vec![Step { upto: None, path: Path::Nccl }], "x");
        assert_ne!(eager_only.unwrap().fingerprint(), one(Path::Ll).fingerprint(), "the graph section counts");
    }

    #[test]
    fn path_names_round_trip() {
        for p in Path::ALL {
            assert_eq!(Path::parse(p.name()), Some(p));
        }
        assert_eq!(Path::parse("LL"), None);
        assert!(!Path::Nccl.is_kernel() && Path::TwoShot.is_kernel());
    }
}
