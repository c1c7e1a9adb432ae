//! One benchmark run as data: what `gpucomm bench --json` writes, what an nccl-tests log parses
//! into, and what `compare` and `--plot` read.

use serde::{Deserialize, Serialize};

use super::coll::Collective;

/// Time and bandwidths of one size, out-of-place or in-place.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measure {
    /// Mean time of one call (µs): host wall clock over back-to-back calls, averaged over ranks.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw: f64,
    /// Bus bandwidth, GB/s.
    pub busbw: f64,
    /// Wrong elements found by validation; `None` when not checked.
    pub wrong: Option<u64>,
    /// Host time per iteration up to the return of the last call (nccl-tests' -C 1 "cputime":
    /// per call, except with -G, where it is the graph launches' host time over -n), µs, averaged
    /// over ranks; `None` for nccl-tests logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_us: Option<f64>,
    /// CUDA-event time per call on the stream (`gpucomm bench --events`), µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_us: Option<f64>,
    /// The path gpucomm-kernels' dispatcher took (`--impl`), e.g. `ll`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The "size" column (bytes).
    pub size: u64,
    /// The "count" column (elements passed to NCCL).
    pub count: u64,
    /// Data type name as nccl-tests prints it (`float`).
    #[serde(rename = "type")]
    pub dtype: String,
    /// Reduction operator name (`sum`, or `none`).
    pub redop: String,
    /// Root rank, or -1.
    pub root: i64,
    /// Out-of-place result; `None` when this variant was not run.
    pub out_of_place: Option<Measure>,
    /// In-place result; `None` when this variant was not run.
    pub in_place: Option<Measure>,
}

/// Which program produced a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tool {
    /// `gpucomm bench`.
    Gpucomm,
    /// NVIDIA's nccl-tests.
    NcclTests,
}

impl std::fmt::Display for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tool::Gpucomm => "gpucomm",
            Tool::NcclTests => "nccl-tests",
        })
    }
}

/// A whole run of one collective over a range of sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The program.
    pub tool: Tool,
    /// The collective.
    pub collective: Collective,
    /// Number of ranks (GPUs); `None` when an nccl-tests log does not say (it has no `#  Rank`
    /// lines).
    pub nranks: Option<usize>,
    /// The loaded NCCL (`2.28.9`), when known.
    pub nccl_version: Option<String>,
    /// How the ranks were run (`1 process per GPU (spawner)`, `-g 2`, …), when known.
    pub mode: Option<String>,
    /// gpucomm bench's knobs in words (`default`, `buffers=cudarc barrier=nccl`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Warm-up iterations.
    pub warmup: Option<u32>,
    /// Timed iterations per size.
    pub iters: Option<u32>,
    /// The rows, smallest size first.
    pub rows: Vec<Row>,
    /// Mean bus bandwidth over every out-of-place and in-place measurement (nccl-tests' "Avg bus
    /// bandwidth").
    pub avg_busbw: Option<f64>,
    /// Total wrong elements ("Out of bounds values"), when validated.
    pub out_of_bounds: Option<u64>,
}

impl Run {
    /// nccl-tests' "Avg bus bandwidth": the mean of every bus bandwidth printed.
    pub fn mean_busbw(rows: &[Row]) -> f64 {
        let all: Vec<f64> =
            rows.iter().flat_map(|r| [&r.out_of_place, &r.in_place]).flatten().map(|m| m.busbw).collect();
        if all.is_empty() {
            0.0
        } else {
            all.iter().sum::<f64>() / all.len() as f64
        }
    }
}

#[cfg(test)]
impl Run {
    /// An all-reduce run of 2 ranks on NCCL 2.28.9 with these rows (tests).
    pub fn sample(tool: Tool, rows: Vec<Row>) -> Run {
        Run {
            tool,
            collective: Collective::AllReduce,
            nranks: Some(2),
            nccl_version: Some("2.28.9".into()),
            mode: None,
            variant: None,
            warmup: Some(5),
            iters: Some(20),
            avg_busbw: Some(Run::mean_busbw(&rows)),
            rows,
            out_of_bounds: Some(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_counts_rows_of_count_zero() {
        let row = |size, count, busbw| Row {
            size,
            count,
            dtype: "float".into(),
            redop: "none".into(),
            root: -1,
            out_of_place: Some(Measure { time_us: 10.0, busbw, ..Measure::default() }),
            in_place: Some(Measure { time_us: 10.0, busbw, ..Measure::default() }),
        };
        // all_gather -b 8 -e 32 on 2 ranks: 8 and 16 bytes give count 0 (busbw 0), as nccl-tests
        // prints them; its "Avg bus bandwidth" divides by every printed measurement.
        let rows = [row(0, 0, 0.0), row(0, 0, 0.0), row(32, 4, 3.0)];
        assert_eq!(Run::mean_busbw(&rows), 1.0);
        assert_eq!(Run::mean_busbw(&[]), 0.0);
    }
}
