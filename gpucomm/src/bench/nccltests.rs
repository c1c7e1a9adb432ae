//! Reading nccl-tests output (2.19.6 `src/util.cu`: `writeDeviceReport`, `writeResultHeader`,
//! `writeBenchmarkLine*`, `writeResultFooter`). One log may hold several runs (repeats appended to
//! one file); each `# Collective test starting:` line begins one. Lines tagged by `mpirun
//! --tag-output` (`[1,0]<stdout>:`) are read too.

use std::path::Path;

use super::coll::Collective;
use super::results::{Measure, Row, Run, Tool};
use crate::error::{CliError, Result};

/// Parses every run in `text`; `path` names the file in errors.
pub fn parse(path: &Path, text: &str) -> Result<Vec<Run>> {
    let mut runs: Vec<Run> = Vec::new();
    let mut version: Option<String> = None;
    let mut tool = Tool::NcclTests;
    let mut current: Option<Partial> = None;
    for (number, raw) in text.lines().enumerate() {
        let line = strip_mpirun_tag(raw).trim_end();
        let bad =
            |why: String| CliError::BadInput { path: path.to_path_buf(), why: format!("line {}: {why}", number + 1) };
        if let Some((producer, rest)) = version_line(line) {
            tool = producer;
            version = rest.split_whitespace().find_map(|w| w.strip_prefix("nccl-library=")).and_then(version_of_code);
        } else if let Some(program) = line.strip_prefix("# Collective test starting:") {
            finish(&mut runs, current.take());
            let program = program.trim();
            let collective = Collective::from_program(program)
                .ok_or_else(|| bad(format!("{program} is not a collective gpucomm knows")))?;
            current = Some(Partial::new(tool, collective, version.clone()));
        } else if let Some(p) = current.as_mut() {
            p.line(line).map_err(bad)?;
        }
    }
    finish(&mut runs, current);
    if runs.is_empty() {
        return Err(CliError::BadInput {
            path: path.to_path_buf(),
            why: "no nccl-tests results found (expected a '# Collective test starting:' line and a table)".into(),
        });
    }
    Ok(runs)
}

/// The first header line: nccl-tests' `# nccl-tests version …`, or the same line of
/// `gpucomm bench` (`# gpucomm bench version …`), which prints the same table.
fn version_line(line: &str) -> Option<(Tool, &str)> {
    if let Some(rest) = line.strip_prefix("# nccl-tests version ") {
        Some((Tool::NcclTests, rest))
    } else {
        line.strip_prefix("# gpucomm bench version ").map(|rest| (Tool::Gpucomm, rest))
    }
}

/// `22809` → `2.28.9`.
fn version_of_code(code: &str) -> Option<String> {
    let code: u32 = code.parse().ok()?;
    Some(format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100))
}

/// `[1,0]<stdout>:text` → `text`.
fn strip_mpirun_tag(line: &str) -> &str {
    if line.starts_with('[') {
        if let Some((tag, rest)) = line.split_once("]<stdout>:") {
            if tag[1..].split(',').all(|p| p.chars().all(|c| c.is_ascii_digit())) {
                return rest;
            }
        }
    }
    line
}

struct Partial {
    run: Run,
    ranks_listed: usize,
    per_process: Option<usize>,
}

impl Partial {
    fn new(tool: Tool, collective: Collective, nccl_version: Option<String>) -> Self {
        Partial {
            run: Run {
                tool,
                collective,
                nranks: None,
                nccl_version,
                mode: None,
                variant: None,
                warmup: None,
                iters: None,
                rows: Vec::new(),
                avg_busbw: None,
                out_of_bounds: None,
            },
            ranks_listed: 0,
            per_process: None,
        }
    }

    fn line(&mut self, line: &str) -> std::result::Result<(), String> {
        if let Some(rest) = line.strip_prefix("# nThread ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let after = |key: &str| words.iter().position(|w| *w == key).and_then(|i| words.get(i + 1));
            let threads: usize = words.first().and_then(|w| w.parse().ok()).unwrap_or(1);
            let gpus: usize = after("nGpus").and_then(|w| w.parse().ok()).unwrap_or(1);
            let per_process =
                threads.checked_mul(gpus).ok_or_else(|| format!("nThread {threads} nGpus {gpus}: too many"))?;
            self.per_process = Some(per_process);
            self.run.mode = Some(format!("nThread {threads} nGpus {gpus}"));
            self.run.warmup = find_after(&words, "warmup", 1);
            // "warmup iters: 5 iters: 20 agg iters: 1": the plain "iters:".
            self.run.iters = words
                .windows(3)
                .find(|w| w[1] == "iters:" && w[0] != "warmup" && w[0] != "agg")
                .and_then(|w| w[2].parse().ok());
        } else if line.starts_with("#  Rank ") {
            self.ranks_listed += 1;
        } else if let Some(rest) = line.strip_prefix("# Out of bounds values") {
            self.run.out_of_bounds =
                rest.trim_start_matches([' ', ':']).split_whitespace().next().and_then(|w| w.parse().ok());
        } else if let Some(rest) = line.strip_prefix("# Avg bus bandwidth") {
            self.run.avg_busbw =
                rest.trim_start_matches([' ', ':']).split_whitespace().next().and_then(|w| w.parse().ok());
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            if let Some(row) = parse_row(line)? {
                self.run.rows.push(row);
            }
        }
        Ok(())
    }
}

/// `warmup iters: 5` → 5 (the value `skip` words after `key`).
fn find_after(words: &[&str], key: &str, skip: usize) -> Option<u32> {
    let i = words.iter().position(|w| *w == key)?;
    words.get(i + skip + 1)?.parse().ok()
}

fn finish(runs: &mut Vec<Run>, partial: Option<Partial>) {
    if let Some(mut p) = partial {
        if p.run.rows.is_empty() {
            return;
        }
        // Rank 0 lists every rank's GPU (with MPI too). Without those lines the rank count is
        // unknown: "nGpus" counts one process's GPUs only.
        p.run.nranks = (p.ranks_listed > 0).then(|| p.ranks_listed.max(p.per_process.unwrap_or(1)));
        runs.push(p.run);
    }
}

/// A table line: size, count, type, redop, root, then time/algbw/busbw/#wrong out-of-place and
/// in-place. Other non-comment lines (warnings NCCL printed to stdout) are skipped.
fn parse_row(line: &str) -> std::result::Result<Option<Row>, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some(size) = words.first().and_then(|w| w.parse::<u64>().ok()) else { return Ok(None) };
    if words.len() != 13 && words.len() != 9 {
        return Err(format!("a result line has {} fields, expected 13 (or 9): {line:?}", words.len()));
    }
    let count = words[1].parse().map_err(|_| format!("bad count {:?}", words[1]))?;
    let root = words[4].parse().map_err(|_| format!("bad root {:?}", words[4]))?;
    let measure = |w: &[&str]| -> std::result::Result<Option<Measure>, String> {
        if w[0] == "N/A" {
            return Ok(None);
        }
        let num = |s: &str| s.parse::<f64>().map_err(|_| format!("bad number {s:?} in {line:?}"));
        let wrong = match w[3] {
            "N/A" => None,
            s => Some(num(s)? as u64),
        };
        Ok(Some(Measure { time_us: num(w[0])?, algbw: num(w[1])?, busbw: num(w[2])?, wrong, ..Measure::default() }))
    };
    let out_of_place = measure(&words[5..9])?;
    let in_place = if words.len() == 13 { measure(&words[9..13])? } else { None };
    Ok(Some(Row {
        size,
        count,
        dtype: words[2].to_string(),
        redop: words[3].to_string(),
        root,
        out_of_place,
        in_place,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of an nccl-tests 2.19.6 log (`mpirun -np 2 … all_reduce_perf -b 8 -e 8G -f 4 -g 1`
    /// under `--tag-output`), with figures measured on 2×H200 with NCCL 2.28.9.
    const MPI_LOG: &str = "\
[1,0]<stdout>:# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809
[1,0]<stdout>:# Collective test starting: all_reduce_perf
[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
[1,0]<stdout>:#
[1,0]<stdout>:# Using devices
[1,0]<stdout>:#  Rank  0 Group  0 Pid  41213 on         vm device  0 [0000:00:06] NVIDIA H200
[1,0]<stdout>:#  Rank  1 Group  0 Pid  41214 on         vm device  1 [0000:00:07] NVIDIA H200
[1,0]<stdout>:#
[1,0]<stdout>:#                                                              out-of-place                       in-place          
[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong 
[1,0]<stdout>:#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         
[1,0]<stdout>:           8             2     float     sum      -1    10.03    0.00    0.00       0     9.87    0.00    0.00       0
[1,0]<stdout>:        2048           512     float     sum      -1     9.75    0.21    0.21       0     9.70    0.21    0.21       0
[1,0]<stdout>:  8589934592    2147483648     float     sum      -1  24926.3  344.61  344.61       0  24902.1  344.95  344.95       0
[1,0]<stdout>:# Out of bounds values : 0 OK
[1,0]<stdout>:# Avg bus bandwidth    : 115.003 
[1,0]<stdout>:#
[1,0]<stdout>:# Collective test concluded: all_reduce_perf
";

    /// Session 29 audit: thread and GPU counts from the log were multiplied unchecked (a panic in
    /// a debug build, a silent 0 in a release one).
    #[test]
    fn counts_too_large_to_multiply_are_an_error() {
        let log = MPI_LOG.replace("# nThread 1 nGpus 1", "# nThread 4294967296 nGpus 4294967296");
        let e = parse(Path::new("c.log"), &log).unwrap_err().to_string();
        assert!(e.contains("nThread 4294967296 nGpus 4294967296: too many"), "{e}");
    }

    #[test]
    fn reads_an_mpirun_log() {
        let runs = parse(Path::new("c.log"), MPI_LOG).unwrap();
        assert_eq!(runs.len(), 1);
        let run = &runs[0];
        assert_eq!(run.collective, Collective::AllReduce);
        assert_eq!(run.nranks, Some(2));
        assert_eq!(run.nccl_version.as_deref(), Some("2.28.9"));
        assert_eq!((run.warmup, run.iters), (Some(5), Some(20)));
        assert_eq!(run.out_of_bounds, Some(0));
        assert_eq!(run.avg_busbw, Some(115.003));
        assert_eq!(run.rows.len(), 3);
        let last = &run.rows[2];
        assert_eq!(
            (last.size, last.count, last.dtype.as_str(), last.redop.as_str(), last.root),
            (8 << 30, 1 << 31, "float", "sum", -1)
        );
        assert_eq!(
            last.out_of_place,
            Some(Measure { time_us: 24926.3, algbw: 344.61, busbw: 344.61, wrong: Some(0), ..Measure::default() })
        );
        assert_eq!(last.in_place.as_ref().unwrap().busbw, 344.95);
    }

    #[test]
    fn reads_repeated_single_process_runs_and_na_columns() {
        let one = "\
# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22803
# Collective test starting: sendrecv_perf
# nThread 1 nGpus 2 minBytes 8 maxBytes 128 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#  Rank  0 Group  0 Pid  41213 on         vm device  0 [0000:00:06] NVIDIA H200
#  Rank  1 Group  0 Pid  41213 on         vm device  1 [0000:00:07] NVIDIA H200
           8             2     float     sum      -1    15.01    0.00    0.00       0    14.90    0.00    0.00     N/A
NCCL WARN something printed on stdout
         128            32     float     sum      -1    15.10    0.01    0.01       0    15.00    0.01    0.01     N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.005 
# Collective test concluded: sendrecv_perf
";
        let text = format!("{one}{one}");
        let runs = parse(Path::new("c.log"), &text).unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[1].collective, Collective::SendRecv);
        assert_eq!(runs[1].nranks, Some(2), "one process listing two GPUs");
        assert_eq!(runs[1].nccl_version.as_deref(), Some("2.28.3"));
        assert_eq!(runs[1].rows[0].in_place.as_ref().unwrap().wrong, None);
    }

    #[test]
    fn a_log_without_rank_lines_has_an_unknown_rank_count() {
        let text: String = MPI_LOG.lines().filter(|l| !l.contains("#  Rank")).map(|l| format!("{l}\n")).collect();
        let runs = parse(Path::new("c.log"), &text).unwrap();
        assert_eq!(runs[0].nranks, None);
    }

    #[test]
    fn unusable_logs_are_clear_errors() {
        let e = parse(Path::new("empty.log"), "hello\n").unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_USAGE);
        assert!(e.to_string().starts_with("empty.log: no nccl-tests results found"), "{e}");
        let e = parse(Path::new("h.log"), "# Collective test starting: hypercube_perf\n").unwrap_err();
        assert_eq!(e.to_string(), "h.log: line 1: hypercube_perf is not a collective gpucomm knows");
        let broken = "# Collective test starting: all_reduce_perf\n 8 2 float sum -1 10.0 0.00\n";
        let e = parse(Path::new("b.log"), broken).unwrap_err();
        assert!(e.to_string().starts_with("b.log: line 2: a result line has 7 fields"), "{e}");
    }
}
