//! Side by side: gpucomm bench against nccl-tests, per size: median time and bus bandwidth over
//! repeated runs with their spread, the bus-bandwidth ratio Rust/C and the time difference, and
//! the two goals (ratio ≥ 0.99 from 1 MiB up, time ≤ C + 0.3 µs below).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::coll::Collective;
use super::engine::Spec;
use super::nccltests;
use super::plot::{self, Curve};
use super::results::{Measure, Row, Run};
use crate::cli::CompareArgs;
use crate::error::{CliError, Result};
use crate::units::human_bytes;

/// From this size up, the bandwidth goal applies; below it, the time goal.
const LARGE: u64 = 1 << 20;
/// Bandwidth goal: Rust/C bus bandwidth at least this from [`LARGE`] up.
const RATIO_GOAL: f64 = 0.99;
/// Time goal: Rust at most this many µs slower below [`LARGE`].
const TIME_GOAL_US: f64 = 0.3;

/// The nccl-tests runs of `coll` in the log at `path`.
pub fn read_nccl_tests(path: &Path, coll: Collective) -> Result<Vec<Run>> {
    let text = CliError::read_input("nccl-tests log", path)?;
    let runs = nccltests::parse(path, &text)?;
    let found: Vec<String> = runs.iter().map(|r| r.collective.to_string()).collect();
    let runs: Vec<Run> = runs.into_iter().filter(|r| r.collective == coll).collect();
    if runs.is_empty() {
        return Err(CliError::BadInput {
            path: path.into(),
            why: format!("no {coll} run in it (it has {})", found.join(", ")),
        });
    }
    Ok(runs)
}

/// gpucomm runs from `path`: the `--json` document (or a bare run), or the printed table.
pub fn read_gpucomm(path: &Path) -> Result<Vec<Run>> {
    let text = CliError::read_input("gpucomm bench result", path)?;
    if text.trim_start().starts_with('{') {
        let bad = |e: serde_json::Error| CliError::BadInput {
            path: path.into(),
            why: format!("not a gpucomm bench --json result: {e}"),
        };
        let v: serde_json::Value = serde_json::from_str(&text).map_err(bad)?;
        let run = v.get("run").cloned().unwrap_or(v);
        return Ok(vec![serde_json::from_value(run).map_err(bad)?]);
    }
    nccltests::parse(path, &text)
}

/// What a set of runs was measured with, as both tools print it: the rank count, and each row's
/// data type, reduction operator and root. Two sets compare only when these are one and the same.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Setup {
    /// The rank counts the runs state.
    ranks: BTreeSet<usize>,
    /// How many runs do not state their rank count.
    ranks_unknown: usize,
    /// The "type" column's values.
    dtypes: BTreeSet<String>,
    /// The "redop" column's values.
    redops: BTreeSet<String>,
    /// The "root" column's values.
    roots: BTreeSet<i64>,
}

/// A field's values for a message: `float`, `float, half`, `—` for none.
fn listed<T: ToString>(values: &BTreeSet<T>) -> String {
    if values.is_empty() {
        return "—".into();
    }
    values.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

/// `what (gpucomm: …; nccl-tests: …)`.
fn describe<T: ToString>(what: &str, rust: &BTreeSet<T>, c: &BTreeSet<T>) -> String {
    format!("{what} (gpucomm: {}; nccl-tests: {})", listed(rust), listed(c))
}

/// [`describe`] when the two sides are not one and the same single value.
fn difference<T: Ord + ToString>(what: &str, rust: &BTreeSet<T>, c: &BTreeSet<T>) -> Option<String> {
    (rust != c || rust.len() != 1).then(|| describe(what, rust, c))
}

impl Setup {
    /// The setup of `runs`.
    pub fn of(runs: &[Run]) -> Setup {
        let mut s = Setup::default();
        for run in runs {
            match run.nranks {
                Some(n) => {
                    s.ranks.insert(n);
                }
                None => s.ranks_unknown += 1,
            }
            for row in &run.rows {
                s.dtypes.insert(row.dtype.clone());
                s.redops.insert(row.redop.clone());
                s.roots.insert(row.root);
            }
        }
        s
    }

    /// The setup `gpucomm bench` will print for `spec` on `nranks` ranks.
    pub fn planned(spec: &Spec, nranks: usize) -> Setup {
        Setup {
            ranks: BTreeSet::from([nranks]),
            ranks_unknown: 0,
            dtypes: BTreeSet::from([spec.dtype.name().to_string()]),
            redops: BTreeSet::from([spec.redop_column().to_string()]),
            roots: BTreeSet::from([spec.root_column()]),
        }
    }

    /// Checks that gpucomm's runs (`self`) and nccl-tests' (`c`) of `coll` were measured alike:
    /// an error names every field that differs (between the tools, or among one tool's runs).
    /// Where a side does not state its rank count, only the stated ones are compared and the
    /// answer is a warning that the goals cannot be judged.
    pub fn check(&self, c: &Setup, coll: Collective) -> Result<Option<String>> {
        let ranks = if self.ranks.is_empty() || c.ranks.is_empty() {
            // One side states none: only a disagreement among one side's own runs shows.
            (self.ranks.len() > 1 || c.ranks.len() > 1).then(|| describe("rank count", &self.ranks, &c.ranks))
        } else {
            difference("rank count", &self.ranks, &c.ranks)
        };
        let differ: Vec<String> = [
            ranks,
            difference("data type", &self.dtypes, &c.dtypes),
            difference("reduction operator", &self.redops, &c.redops),
            difference("root", &self.roots, &c.roots),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !differ.is_empty() {
            return Err(CliError::Usage(format!(
                "cannot compare {coll}: the runs differ in {}; run both tools with the same rank count (-g, \
                 --nproc or the launcher's), data type (-d), operator (-o) and root (-r)",
                differ.join(", ")
            )));
        }
        let unstated: Vec<&str> = [("gpucomm", self.ranks_unknown), ("nccl-tests", c.ranks_unknown)]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(tool, _)| tool)
            .collect();
        Ok((!unstated.is_empty()).then(|| {
            format!(
                "the {} output does not state its rank count (no '#  Rank' lines), so the runs may differ in it: \
                 goals not judged",
                unstated.join(" and ")
            )
        }))
    }
}

/// Median, smallest and largest of some values.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Stat {
    /// The median (mean of the middle two for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Stat {
    fn of(mut v: Vec<f64>) -> Option<Stat> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Stat { median, min: v[0], max: v[n - 1] })
    }

    fn cell(&self, runs: usize) -> String {
        if runs > 1 {
            format!("{:.2} [{:.2}–{:.2}]", self.median, self.min, self.max)
        } else {
            format!("{:.2}", self.median)
        }
    }
}

/// One tool at one size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Side {
    /// Runs that had this size.
    pub runs: usize,
    /// Time, µs.
    pub time_us: Stat,
    /// Bus bandwidth, GB/s.
    pub busbw: Stat,
}

impl Side {
    fn of<'a>(measures: impl Iterator<Item = &'a Measure>) -> Option<Side> {
        let m: Vec<&Measure> = measures.collect();
        Some(Side {
            runs: m.len(),
            time_us: Stat::of(m.iter().map(|m| m.time_us).collect())?,
            busbw: Stat::of(m.iter().map(|m| m.busbw).collect())?,
        })
    }
}

/// One line of the comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Line {
    /// Size (bytes).
    pub size: u64,
    /// gpucomm.
    pub rust: Option<Side>,
    /// nccl-tests.
    pub c: Option<Side>,
    /// Median time difference Rust − C, µs.
    pub dt_us: Option<f64>,
    /// Median bus bandwidth ratio Rust / C.
    pub ratio: Option<f64>,
}

/// Both tools on one collective.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// The collective.
    pub collective: Collective,
    /// gpucomm runs read.
    pub rust_runs: usize,
    /// nccl-tests runs read.
    pub c_runs: usize,
    /// Ranks (gpucomm, nccl-tests), where stated.
    pub nranks: (Option<usize>, Option<usize>),
    /// Why the goals are not judged (a side does not state its rank count), if so.
    pub warning: Option<String>,
    /// NCCL versions (gpucomm, nccl-tests).
    pub nccl: (Option<String>, Option<String>),
    /// Out-of-place lines.
    pub out_of_place: Vec<Line>,
    /// In-place lines.
    pub in_place: Vec<Line>,
}

fn lines(rust: &[Run], c: &[Run], pick: fn(&Row) -> Option<&Measure>) -> Vec<Line> {
    let mut sizes: Vec<u64> = rust.iter().chain(c).flat_map(|r| r.rows.iter().map(|row| row.size)).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let side = |runs: &[Run], size: u64| {
        Side::of(runs.iter().flat_map(|r| r.rows.iter()).filter(|row| row.size == size).filter_map(pick))
    };
    sizes
        .into_iter()
        .map(|size| {
            let (r, cc) = (side(rust, size), side(c, size));
            let dt_us = match (&r, &cc) {
                (Some(r), Some(c)) => Some(r.time_us.median - c.time_us.median),
                _ => None,
            };
            let ratio = match (&r, &cc) {
                (Some(r), Some(c)) if c.busbw.median > 0.0 => Some(r.busbw.median / c.busbw.median),
                _ => None,
            };
            Line { size, rust: r, c: cc, dt_us, ratio }
        })
        .filter(|l| l.rust.is_some() || l.c.is_some())
        .collect()
}

impl Comparison {
    /// Compares the `coll` runs of both sets; refuses runs measured with different rank counts,
    /// data types, operators or roots ([`Setup::check`]).
    pub fn new(coll: Collective, rust: &[Run], c: &[Run]) -> Result<Comparison> {
        let rust: Vec<Run> = rust.iter().filter(|r| r.collective == coll).cloned().collect();
        let c: Vec<Run> = c.iter().filter(|r| r.collective == coll).cloned().collect();
        let (rust_setup, c_setup) = (Setup::of(&rust), Setup::of(&c));
        let warning = rust_setup.check(&c_setup, coll)?;
        Ok(Comparison {
            collective: coll,
            rust_runs: rust.len(),
            c_runs: c.len(),
            nranks: (rust_setup.ranks.first().copied(), c_setup.ranks.first().copied()),
            warning,
            nccl: (rust.first().and_then(|r| r.nccl_version.clone()), c.first().and_then(|r| r.nccl_version.clone())),
            out_of_place: lines(&rust, &c, |r| r.out_of_place.as_ref()),
            in_place: lines(&rust, &c, |r| r.in_place.as_ref()),
        })
    }

    /// The goals' verdicts on `lines`.
    fn goals(lines: &[Line]) -> Vec<String> {
        let mut out = Vec::new();
        let big: Vec<(u64, f64)> =
            lines.iter().filter(|l| l.size >= LARGE).filter_map(|l| Some((l.size, l.ratio?))).collect();
        if let Some(&(size, worst)) = big.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
            let met = if worst >= RATIO_GOAL { "met" } else { "NOT met" };
            out.push(format!(
                "busbw ratio Rust/C from 1 MiB up: lowest {worst:.3} (at {}) — goal ≥ {RATIO_GOAL}: {met}",
                human_bytes(size)
            ));
        }
        let small: Vec<(u64, f64)> =
            lines.iter().filter(|l| l.size < LARGE).filter_map(|l| Some((l.size, l.dt_us?))).collect();
        if let Some(&(size, worst)) = small.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
            let met = if worst <= TIME_GOAL_US { "met" } else { "NOT met" };
            out.push(format!(
                "time Rust − C below 1 MiB: largest {worst:+.2} µs (at {}) — goal ≤ +{TIME_GOAL_US} µs: {met}",
                human_bytes(size)
            ));
        }
        out
    }

    /// The comparison as Markdown tables, one per variant, with the goals under each.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let ranks = |n: Option<usize>| n.map_or("?".to_string(), |n| n.to_string());
        let _ = writeln!(
            s,
            "## {}: gpucomm ({} run(s), {} ranks, NCCL {}) vs nccl-tests ({} run(s), {} ranks, NCCL {})",
            self.collective,
            self.rust_runs,
            ranks(self.nranks.0),
            self.nccl.0.as_deref().unwrap_or("?"),
            self.c_runs,
            ranks(self.nranks.1),
            self.nccl.1.as_deref().unwrap_or("?")
        );
        for (name, lines) in [("out-of-place", &self.out_of_place), ("in-place", &self.in_place)] {
            if lines.iter().all(|l| l.rust.is_none() || l.c.is_none()) {
                continue;
            }
            let _ = writeln!(s, "\n### {name} (median [min–max] over runs)\n");
            let _ = writeln!(
                s,
                "| size | Rust time (µs) | C time (µs) | Δt (µs) | Rust busbw (GB/s) | C busbw (GB/s) | ratio |"
            );
            let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|");
            for l in lines.iter() {
                let side = |x: &Option<Side>, f: fn(&Side) -> String| x.as_ref().map_or("—".to_string(), f);
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    human_bytes(l.size),
                    side(&l.rust, |x| x.time_us.cell(x.runs)),
                    side(&l.c, |x| x.time_us.cell(x.runs)),
                    l.dt_us.map_or("—".into(), |d| format!("{d:+.2}")),
                    side(&l.rust, |x| x.busbw.cell(x.runs)),
                    side(&l.c, |x| x.busbw.cell(x.runs)),
                    l.ratio.map_or("—".into(), |r| format!("{r:.3}")),
                );
            }
            s.push('\n');
            match &self.warning {
                Some(w) => {
                    let _ = writeln!(s, "- {w}");
                }
                None => {
                    for g in Self::goals(lines) {
                        let _ = writeln!(s, "- {g}");
                    }
                }
            }
        }
        s
    }

    /// Both curves (medians) and their ratio, into an SVG file: out-of-place, or in-place when
    /// only that variant has both tools (broadcast).
    pub fn plot(&self, path: &Path) -> Result<()> {
        let both = |lines: &[Line]| lines.iter().any(|l| l.rust.is_some() && l.c.is_some());
        let (variant, lines) = if both(&self.out_of_place) || !both(&self.in_place) {
            ("out-of-place", &self.out_of_place)
        } else {
            ("in-place", &self.in_place)
        };
        let curve = |label: &str, pick: fn(&Line) -> Option<f64>| Curve {
            label: label.to_string(),
            points: lines.iter().filter(|l| l.size > 0).filter_map(|l| Some((l.size as f64, pick(l)?))).collect(),
        };
        let curves = [
            curve("gpucomm (Rust)", |l| Some(l.rust.as_ref()?.busbw.median)),
            curve("nccl-tests (C)", |l| Some(l.c.as_ref()?.busbw.median)),
        ];
        let ratio = curve("busbw ratio Rust/C", |l| l.ratio);
        let ranks = self.nranks.0.or(self.nranks.1).map_or("?".to_string(), |n| n.to_string());
        let title = format!("{} {variant} bus bandwidth, {ranks} ranks", self.collective);
        plot::draw(path, &title, &curves, (!ratio.points.is_empty()).then_some(&ratio))
    }
}

/// `out.svg` for one collective, `out-all_reduce.svg` when there are several.
fn plot_path(path: &Path, coll: Collective, several: bool) -> PathBuf {
    if !several {
        return path.to_path_buf();
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let ext = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    path.with_file_name(format!("{stem}-{coll}{ext}"))
}

/// `gpucomm compare`.
pub fn run(args: &CompareArgs) -> Result<()> {
    let mut rust = Vec::new();
    for p in &args.rust {
        rust.extend(read_gpucomm(p)?);
    }
    let mut c = Vec::new();
    for p in &args.c {
        let text = CliError::read_input("nccl-tests log", p)?;
        c.extend(nccltests::parse(p, &text)?);
    }
    let mut colls: Vec<Collective> =
        rust.iter().map(|r| r.collective).filter(|k| c.iter().any(|r| r.collective == *k)).collect();
    colls.sort_by_key(|k| k.name());
    colls.dedup();
    if colls.is_empty() {
        return Err(CliError::Usage(
            "no collective appears in both the gpucomm results and the nccl-tests logs".into(),
        ));
    }
    if let Some(p) = &args.plot {
        plot::check_writable(&plot_path(p, colls[0], colls.len() > 1))?;
    }
    let comparisons: Vec<Comparison> = colls.iter().map(|&k| Comparison::new(k, &rust, &c)).collect::<Result<_>>()?;
    for w in comparisons.iter().filter_map(|cmp| cmp.warning.as_ref()) {
        eprintln!("warning: {w}");
    }
    if args.json {
        let doc = serde_json::to_string_pretty(&comparisons)
            .map_err(|source| CliError::Json { what: "the comparison".into(), source })?;
        println!("{doc}");
    } else {
        for cmp in &comparisons {
            println!("{}", cmp.markdown());
        }
    }
    if let Some(p) = &args.plot {
        for cmp in &comparisons {
            cmp.plot(&plot_path(p, cmp.collective, comparisons.len() > 1))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::elem::{DType, Op};
    use crate::bench::results::Tool;

    fn run(tool: Tool, rows: &[(u64, f64, f64)]) -> Run {
        let rows = rows
            .iter()
            .map(|&(size, t, bw)| Row {
                size,
                count: size / 4,
                dtype: "float".into(),
                redop: "sum".into(),
                root: -1,
                out_of_place: Some(Measure { time_us: t, algbw: bw, busbw: bw, wrong: Some(0), ..Measure::default() }),
                in_place: None,
            })
            .collect();
        Run::sample(tool, rows)
    }

    #[test]
    fn medians_spread_ratio_and_goals() {
        let rust = [
            run(Tool::Gpucomm, &[(8, 10.0, 0.0), (8 << 30, 24700.0, 347.8)]),
            run(Tool::Gpucomm, &[(8, 10.4, 0.0), (8 << 30, 24650.0, 348.4)]),
            run(Tool::Gpucomm, &[(8, 9.6, 0.0), (8 << 30, 24660.0, 348.3)]),
        ];
        let c = [run(Tool::NcclTests, &[(8, 10.03, 0.0), (8 << 30, 24665.8, 348.25)])];
        let cmp = Comparison::new(Collective::AllReduce, &rust, &c).unwrap();
        assert_eq!((cmp.rust_runs, cmp.c_runs), (3, 1));
        let small = &cmp.out_of_place[0];
        assert_eq!(small.rust.as_ref().unwrap().time_us, Stat { median: 10.0, min: 9.6, max: 10.4 });
        assert!((small.dt_us.unwrap() + 0.03).abs() < 1e-9);
        assert_eq!(small.ratio, None, "no ratio against 0 GB/s");
        let big = &cmp.out_of_place[1];
        assert!((big.ratio.unwrap() - 348.3 / 348.25).abs() < 1e-12);
        let md = cmp.markdown();
        assert!(md.contains("| 8 B | 10.00 [9.60–10.40] | 10.03 | -0.03 | 0.00 [0.00–0.00] | 0.00 | — |"), "{md}");
        assert!(md.contains("| 8 GiB | 24660.00 [24650.00–24700.00] | 24665.80 | -5.80 |"), "{md}");
        assert!(md.contains("- busbw ratio Rust/C from 1 MiB up: lowest 1.000 (at 8 GiB) — goal ≥ 0.99: met"), "{md}");
        assert!(md.contains("- time Rust − C below 1 MiB: largest -0.03 µs (at 8 B) — goal ≤ +0.3 µs: met"), "{md}");
        assert!(!md.contains("### in-place"), "no in-place table without in-place data");
    }

    #[test]
    fn goals_not_met_are_said_so() {
        let rust = [run(Tool::Gpucomm, &[(8, 11.0, 0.0), (1 << 20, 30.0, 60.0)])];
        let c = [run(Tool::NcclTests, &[(8, 10.0, 0.0), (1 << 20, 29.0, 70.0)])];
        let md = Comparison::new(Collective::AllReduce, &rust, &c).unwrap().markdown();
        assert!(md.contains("lowest 0.857 (at 1 MiB) — goal ≥ 0.99: NOT met"), "{md}");
        assert!(md.contains("largest +1.00 µs (at 8 B) — goal ≤ +0.3 µs: NOT met"), "{md}");
    }

    /// The fix every refusal ends with.
    const SAME: &str = "run both tools with the same rank count (-g, --nproc or the launcher's), data type (-d), \
                        operator (-o) and root (-r)";

    #[test]
    fn runs_of_another_rank_count_are_refused() {
        let rust = [run(Tool::Gpucomm, &[(8, 10.0, 0.0), (1 << 20, 30.0, 60.0)])];
        let mut c = run(Tool::NcclTests, &[(8, 10.0, 0.0), (1 << 20, 29.0, 70.0)]);
        c.nranks = Some(4);
        let e = Comparison::new(Collective::AllReduce, &rust, &[c]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("cannot compare all_reduce: the runs differ in rank count (gpucomm: 2; nccl-tests: 4); {SAME}")
        );
        assert_eq!(e.exit_code(), crate::error::EXIT_USAGE);
    }

    #[test]
    fn runs_of_another_type_operator_or_root_are_refused() {
        let rust = [run(Tool::Gpucomm, &[(8, 10.0, 0.0)])];
        let mut c = run(Tool::NcclTests, &[(8, 10.0, 0.0)]);
        c.rows[0].dtype = "half".into();
        c.rows[0].redop = "max".into();
        c.rows[0].root = 1;
        let e = Comparison::new(Collective::AllReduce, &rust, &[c]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "cannot compare all_reduce: the runs differ in data type (gpucomm: float; nccl-tests: half), \
                 reduction operator (gpucomm: sum; nccl-tests: max), root (gpucomm: -1; nccl-tests: 1); {SAME}"
            )
        );
        // One tool's runs that differ among themselves (nccl-tests -d all) are refused too.
        let mut half = run(Tool::Gpucomm, &[(8, 10.0, 0.0)]);
        half.rows[0].dtype = "half".into();
        let both = [rust[0].clone(), half];
        let e = Comparison::new(Collective::AllReduce, &both, &[run(Tool::NcclTests, &[(8, 10.0, 0.0)])]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("cannot compare all_reduce: the runs differ in data type (gpucomm: float, half; nccl-tests: float); {SAME}")
        );
    }

    #[test]
    fn an_unstated_rank_count_withholds_the_goals() {
        let rust = [run(Tool::Gpucomm, &[(8, 11.0, 0.0), (1 << 20, 30.0, 60.0)])];
        let mut c = run(Tool::NcclTests, &[(8, 10.0, 0.0), (1 << 20, 29.0, 70.0)]);
        c.nranks = None;
        let cmp = Comparison::new(Collective::AllReduce, &rust, &[c]).unwrap();
        let warning = "the nccl-tests output does not state its rank count (no '#  Rank' lines), so the runs may \
                       differ in it: goals not judged";
        assert_eq!(cmp.warning.as_deref(), Some(warning));
        assert_eq!(cmp.nranks, (Some(2), None));
        let md = cmp.markdown();
        assert!(md.contains("vs nccl-tests (1 run(s), ? ranks, NCCL 2.28.9)"), "{md}");
        assert!(md.contains(&format!("- {warning}")), "{md}");
        assert!(!md.contains("goal ≥") && !md.contains("goal ≤"), "{md}");
    }

    #[test]
    fn the_planned_run_is_checked_against_the_reference() {
        let spec = |dtype| Spec {
            coll: Collective::AllReduce,
            dtype,
            op: Op::Sum,
            root: 0,
            min: 8,
            max: 8,
            factor: 2,
            warmup: 1,
            iters: 1,
            check: true,
            knobs: crate::cli::Knobs::default(),
        };
        let c = Setup::of(&[run(Tool::NcclTests, &[(8, 10.0, 0.0)])]);
        assert_eq!(Setup::planned(&spec(DType::F32), 2).check(&c, Collective::AllReduce).unwrap(), None);
        let e = Setup::planned(&spec(DType::Bf16), 8).check(&c, Collective::AllReduce).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "cannot compare all_reduce: the runs differ in rank count (gpucomm: 8; nccl-tests: 2), data type \
                 (gpucomm: bfloat16; nccl-tests: float); {SAME}"
            )
        );
    }

    #[test]
    fn inputs_are_read_or_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.log");
        let e = read_nccl_tests(&missing, Collective::AllReduce).unwrap_err();
        assert!(e.to_string().starts_with(&format!("cannot read nccl-tests log {}: ", missing.display())), "{e}");
        assert_eq!(e.exit_code(), crate::error::EXIT_USAGE);
        let log = dir.path().join("ag.log");
        std::fs::write(&log, "# Collective test starting: all_gather_perf\n          32             4     float    none      -1    13.05    0.00    0.00       0    13.00    0.00    0.00       0\n").unwrap();
        let e = read_nccl_tests(&log, Collective::AllReduce).unwrap_err();
        assert!(e.to_string().ends_with("no all_reduce run in it (it has all_gather)"), "{e}");
        let json = dir.path().join("r.json");
        let r = run(Tool::Gpucomm, &[(8, 10.0, 0.0)]);
        std::fs::write(&json, serde_json::json!({ "header": null, "run": r }).to_string()).unwrap();
        assert_eq!(read_gpucomm(&json).unwrap(), [r]);
        std::fs::write(&json, "{\"run\": 3}").unwrap();
        assert!(read_gpucomm(&json).unwrap_err().to_string().contains("not a gpucomm bench --json result"));
    }

    #[test]
    fn one_plot_per_collective_when_there_are_several() {
        assert_eq!(plot_path(Path::new("d/busbw.svg"), Collective::SendRecv, false), PathBuf::from("d/busbw.svg"));
        assert_eq!(
            plot_path(Path::new("d/busbw.svg"), Collective::SendRecv, true),
            PathBuf::from("d/busbw-sendrecv.svg")
        );
    }
}
