//! Printing a run the way nccl-tests prints it (2.19.6 `src/util.cu`), column for column, so that
//! the two outputs line up and `compare` can read either.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use super::coll::Collective;
use super::results::{Measure, Row, Run};
use crate::units::float_cell;

/// One GPU of the run, as nccl-tests lists it under "# Using devices".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceLine {
    /// Rank.
    pub rank: usize,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// CUDA device ordinal.
    pub device: usize,
    /// PCI address, `0000:00:06`.
    pub pci: String,
    /// Device name.
    pub name: String,
}

/// Everything the header says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The collective.
    pub collective: Collective,
    /// NCCL header version code the tool was compiled against (`22809`).
    pub nccl_headers: u32,
    /// Loaded NCCL version code.
    pub nccl_library: u32,
    /// Threads per process (always 1).
    pub threads: usize,
    /// GPUs driven by each process.
    pub gpus_per_process: usize,
    /// Smallest size.
    pub min_bytes: u64,
    /// Largest size.
    pub max_bytes: u64,
    /// Size factor.
    pub factor: u64,
    /// Warm-up iterations.
    pub warmup: u32,
    /// Timed iterations.
    pub iters: u32,
    /// Validation on (1) or off (0).
    pub validation: u32,
    /// CUDA graph replays (0: none).
    pub graph: u32,
    /// How the ranks run, in words.
    pub mode: String,
    /// The bench's knobs in words (`default` when none is changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// NVLink SHARP (NVLS) state, in words.
    pub nvls: String,
    /// The GPUs.
    pub devices: Vec<DeviceLine>,
}

/// Writes the header: version line, parameters, devices, column titles.
pub fn write_header(out: &mut impl Write, h: &Header) -> io::Result<()> {
    writeln!(
        out,
        "# gpucomm bench version {} nccl-headers={} nccl-library={}",
        env!("CARGO_PKG_VERSION"),
        h.nccl_headers,
        h.nccl_library
    )?;
    writeln!(out, "# Collective test starting: {}", h.collective.nccl_tests_program())?;
    writeln!(
        out,
        "# nThread {} nGpus {} minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} agg iters: 1 validation: {} graph: {} unalign: 0",
        h.threads, h.gpus_per_process, h.min_bytes, h.max_bytes, h.factor, h.warmup, h.iters, h.validation, h.graph
    )?;
    writeln!(out, "# Ranks: {}", h.mode)?;
    if let Some(v) = &h.variant {
        writeln!(out, "# Variant: {v}")?;
    }
    writeln!(out, "# NVLS: {}", h.nvls)?;
    writeln!(out, "#")?;
    writeln!(out, "# Using devices")?;
    for d in &h.devices {
        writeln!(
            out,
            "#  Rank {:2} Group  0 Pid {:6} on {:>10} device {:2} [{}] {}",
            d.rank, d.pid, d.host, d.device, d.pci, d.name
        )?;
    }
    writeln!(out, "#")?;
    writeln!(
        out,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    )?;
    writeln!(
        out,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    )?;
    writeln!(
        out,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    )
}

/// Writes one result line.
pub fn write_row(out: &mut impl Write, r: &Row) -> io::Result<()> {
    write!(out, "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}", r.size, r.count, r.dtype, r.redop, r.root)?;
    for m in [&r.out_of_place, &r.in_place] {
        write!(out, "{}", measure_cells(m.as_ref()))?;
    }
    writeln!(out)
}

fn measure_cells(m: Option<&Measure>) -> String {
    match m {
        None => format!("  {:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A"),
        Some(m) => {
            let wrong = match m.wrong {
                Some(w) => format!("{:>6}", fmt_g(w as f64)),
                None => "   N/A".to_string(),
            };
            format!("  {}  {}  {}  {wrong}", float_cell(m.time_us, 7), float_cell(m.algbw, 6), float_cell(m.busbw, 6))
        }
    }
}

/// Writes the footer: wrong elements and mean bus bandwidth.
pub fn write_footer(out: &mut impl Write, run: &Run) -> io::Result<()> {
    let wrong = run.out_of_bounds.unwrap_or(0);
    writeln!(out, "# {:<20} : {} {}", "Out of bounds values", wrong, if wrong > 0 { "FAILED" } else { "OK" })?;
    writeln!(out, "# {:<20} : {} ", "Avg bus bandwidth", fmt_g(run.avg_busbw.unwrap_or(0.0)))?;
    writeln!(out, "#")?;
    writeln!(out, "# Collective test concluded: {}", run.collective.nccl_tests_program())
}

/// C's `%g`: six significant digits, trailing zeros removed.
pub fn fmt_g(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    let exponent = value.abs().log10().floor() as i32;
    if !(-4..6).contains(&exponent) {
        let s = format!("{value:.5e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let m = m.trim_end_matches('0').trim_end_matches('.');
        let e: i32 = e.parse().unwrap_or(0);
        return format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    let decimals = (5 - exponent).max(0) as usize;
    let s = format!("{value:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::nccltests;
    use crate::bench::results::Tool;

    fn sample() -> (Header, Run) {
        let header = Header {
            collective: Collective::AllReduce,
            nccl_headers: 22809,
            nccl_library: 22809,
            threads: 1,
            gpus_per_process: 1,
            min_bytes: 8,
            max_bytes: 8 << 30,
            factor: 4,
            warmup: 5,
            iters: 20,
            validation: 1,
            graph: 0,
            mode: "1 process per GPU (spawner)".into(),
            variant: None,
            nvls: "off (NCCL_NVLS_ENABLE=0)".into(),
            devices: vec![DeviceLine {
                rank: 0,
                pid: 41213,
                host: "vm".into(),
                device: 0,
                pci: "0000:00:06".into(),
                name: "NVIDIA H200".into(),
            }],
        };
        let m = |t, bw| Some(Measure { time_us: t, algbw: bw, busbw: bw, wrong: Some(0), ..Measure::default() });
        let rows = vec![
            Row {
                size: 8,
                count: 2,
                dtype: "float".into(),
                redop: "sum".into(),
                root: -1,
                out_of_place: m(10.03, 0.0),
                in_place: m(9.87, 0.0),
            },
            Row {
                size: 8 << 30,
                count: 1 << 31,
                dtype: "float".into(),
                redop: "sum".into(),
                root: -1,
                out_of_place: m(24926.3, 344.61),
                in_place: None,
            },
        ];
        let run = Run::sample(Tool::Gpucomm, rows);
        (header, run)
    }

    #[test]
    fn columns_line_up_with_nccl_tests() {
        let (header, run) = sample();
        let mut out = Vec::new();
        write_header(&mut out, &header).unwrap();
        for r in &run.rows {
            write_row(&mut out, r).unwrap();
        }
        write_footer(&mut out, &run).unwrap();
        let text = String::from_utf8(out).unwrap();
        // Byte for byte what nccl-tests prints for these values.
        assert!(text.contains(
            "\n           8             2     float     sum      -1    10.03    0.00    0.00       0     9.87    0.00    0.00       0\n"
        ), "{text}");
        assert!(text.contains("\n  8589934592    2147483648     float     sum      -1  24926.3  344.61  344.61       0      N/A     N/A     N/A     N/A\n"), "{text}");
        assert!(text.contains("\n#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong \n"), "{text}");
        assert!(
            text.contains("\n#  Rank  0 Group  0 Pid  41213 on         vm device  0 [0000:00:06] NVIDIA H200\n"),
            "{text}"
        );
        assert!(text.contains("\n# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 114.87 \n"), "{text}");
        // And the nccl-tests reader reads it back.
        let back = nccltests::parse(std::path::Path::new("x"), &text).unwrap();
        assert_eq!(back[0].tool, Tool::Gpucomm);
        assert_eq!(back[0].rows, run.rows);
        assert_eq!(back[0].nccl_version.as_deref(), Some("2.28.9"));
    }

    #[test]
    fn percent_g() {
        assert_eq!(fmt_g(113.4), "113.4");
        assert_eq!(fmt_g(348.25), "348.25");
        assert_eq!(fmt_g(0.0), "0");
        assert_eq!(fmt_g(2.0), "2");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
        assert_eq!(fmt_g(0.000012), "1.2e-05");
        assert_eq!(fmt_g(114.86999999), "114.87");
    }
}
