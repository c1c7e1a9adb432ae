//! The collectives nccl-tests measures, with its byte counts and bandwidth formulas
//! (nccl-tests 2.19.6 `src/<coll>.cu`: `GetCollByteCount`, `GetBw`; its `doc/PERFORMANCE.md`):
//! `algbw = S / t` in GB/s (1 GB = 1e9 B) with S the per-rank buffer (all-reduce, broadcast,
//! reduce, send/recv) or the total over the ranks (all-gather's output, reduce-scatter's input,
//! all-to-all's send buffer, gather's output, scatter's input), and `busbw = algbw × factor`
//! (2(n−1)/n for all-reduce, (n−1)/n for all-gather, reduce-scatter, all-to-all, gather and
//! scatter, 1 otherwise).

use serde::{Deserialize, Serialize};

/// One nccl-tests binary's collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Collective {
    /// As nccl-tests' all_reduce_perf.
    AllReduce,
    /// As all_gather_perf.
    AllGather,
    /// As reduce_scatter_perf.
    ReduceScatter,
    /// As broadcast_perf.
    Broadcast,
    /// As reduce_perf.
    Reduce,
    /// As alltoall_perf (out-of-place; NCCL ≥ 2.28.3).
    #[value(name = "alltoall", alias = "all_to_all")]
    #[serde(rename = "alltoall")]
    AllToAll,
    /// As sendrecv_perf: send to rank+1, receive from rank−1 (out-of-place).
    #[value(name = "sendrecv", alias = "send_recv")]
    #[serde(rename = "sendrecv")]
    SendRecv,
    /// As gather_perf (NCCL ≥ 2.28.3).
    Gather,
    /// As scatter_perf (NCCL ≥ 2.28.3).
    Scatter,
}

/// Element counts of one measurement, as nccl-tests sets them up for a size (`setupArgs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Elements each rank sends (its input buffer).
    pub send: usize,
    /// Elements each rank receives (its output buffer).
    pub recv: usize,
    /// The count passed to NCCL (per rank; per peer for all-to-all), printed as "count".
    pub param: usize,
}

impl Counts {
    /// The "size" column: the larger of the two buffers, in bytes.
    pub fn printed_bytes(&self, elem: usize) -> u64 {
        (self.send.max(self.recv) * elem) as u64
    }
}

impl Collective {
    /// Every collective, in nccl-tests' usual order.
    pub const ALL: [Collective; 9] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::SendRecv,
        Collective::Gather,
        Collective::Scatter,
    ];

    /// The command-line and JSON name (`all_reduce`, `alltoall`, …).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "alltoall",
            Collective::SendRecv => "sendrecv",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
        }
    }

    /// The nccl-tests program that measures it (`all_reduce_perf`).
    pub fn nccl_tests_program(self) -> String {
        format!("{}_perf", self.name())
    }

    /// The collective of an nccl-tests program name (`./build/all_reduce_perf` → all-reduce).
    pub fn from_program(program: &str) -> Option<Collective> {
        let base = program.rsplit('/').next()?.strip_suffix("_perf")?;
        Collective::ALL.into_iter().find(|c| c.name() == base)
    }

    /// True when nccl-tests prints a reduction operator for it (it prints `none` otherwise).
    pub fn reduces(self) -> bool {
        matches!(self, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce | Collective::SendRecv)
    }

    /// True when nccl-tests prints a root for it (it prints `-1` otherwise).
    pub fn rooted(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter)
    }

    /// True when the collective sends or receives one block per rank, so that its per-rank
    /// piece is rounded to 16 bytes and the bytes it moves are the total over the ranks.
    fn blockwise(self) -> bool {
        matches!(
            self,
            Collective::AllGather
                | Collective::ReduceScatter
                | Collective::AllToAll
                | Collective::Gather
                | Collective::Scatter
        )
    }

    /// Element counts for a size of `bytes` with `elem`-byte elements on `nranks` ranks. The
    /// per-rank pieces of the blockwise collectives (all-gather, reduce-scatter, all-to-all,
    /// gather, scatter) are rounded down to a multiple of 16 bytes, as nccl-tests does.
    pub fn counts(self, bytes: u64, elem: usize, nranks: usize) -> Counts {
        let count = (bytes / elem as u64) as usize;
        let align = (16 / elem).max(1);
        let piece = (count / nranks) & !(align - 1);
        match self {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce | Collective::SendRecv => {
                Counts { send: count, recv: count, param: count }
            }
            Collective::AllGather | Collective::Gather => Counts { send: piece, recv: piece * nranks, param: piece },
            Collective::ReduceScatter | Collective::Scatter => {
                Counts { send: piece * nranks, recv: piece, param: piece }
            }
            Collective::AllToAll => Counts { send: piece * nranks, recv: piece * nranks, param: piece },
        }
    }

    /// The smallest size (bytes) that gives each of `nranks` ranks at least one element of `elem`
    /// bytes: one element, or (the blockwise collectives) one 16-byte-aligned piece per rank (see
    /// [`Collective::counts`]).
    pub fn min_bytes(self, elem: usize, nranks: usize) -> u64 {
        if self.blockwise() {
            ((16 / elem).max(1) * elem * nranks) as u64
        } else {
            elem as u64
        }
    }

    /// Algorithm bandwidth in GB/s (1 GB = 1e9 B) for `param` elements of `elem` bytes moved in
    /// `seconds`: nccl-tests' bytes S (see the module docs) over the time.
    pub fn algbw(self, param: usize, elem: usize, seconds: f64, nranks: usize) -> f64 {
        let per_rank = (param * elem) as f64;
        let s = if self.blockwise() { per_rank * nranks as f64 } else { per_rank };
        if seconds > 0.0 {
            s / 1.0e9 / seconds
        } else {
            0.0
        }
    }

    /// The factor from algorithm to bus bandwidth: 2(n−1)/n for all-reduce, (n−1)/n for the
    /// blockwise collectives, 1 otherwise.
    pub fn bus_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            c if c.blockwise() => (n - 1.0) / n,
            _ => 1.0,
        }
    }
}

impl std::fmt::Display for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_follow_nccl_tests() {
        // all_gather_perf -b 8: 8 B of float on 2 ranks rounds to 0; 32 B gives 4 floats per rank.
        assert_eq!(Collective::AllGather.counts(8, 4, 2), Counts { send: 0, recv: 0, param: 0 });
        let c = Collective::AllGather.counts(32, 4, 2);
        assert_eq!(c, Counts { send: 4, recv: 8, param: 4 });
        assert_eq!(c.printed_bytes(4), 32);
        let c = Collective::ReduceScatter.counts(1 << 20, 4, 2);
        assert_eq!(c, Counts { send: 1 << 18, recv: 1 << 17, param: 1 << 17 });
        let c = Collective::AllToAll.counts(96, 4, 3);
        assert_eq!(c, Counts { send: 24, recv: 24, param: 8 });
        assert_eq!(Collective::AllReduce.counts(8, 4, 2), Counts { send: 2, recv: 2, param: 2 });
        // Doubles: 16-byte alignment is 2 elements.
        assert_eq!(Collective::AllGather.counts(48, 8, 2).param, 2);
        // int8: 16 elements.
        assert_eq!(Collective::AllGather.counts(100, 1, 2).param, 48);
        // gather_perf and scatter_perf: all-gather's and reduce-scatter's shapes, rooted.
        assert_eq!(Collective::Gather.counts(1 << 20, 4, 2), Counts { send: 1 << 17, recv: 1 << 18, param: 1 << 17 });
        assert_eq!(Collective::Scatter.counts(100, 4, 3), Counts { send: 24, recv: 8, param: 8 });
        assert!(Collective::Gather.rooted() && Collective::Scatter.rooted());
        assert!(!Collective::Gather.reduces() && !Collective::Scatter.reduces());
    }

    #[test]
    fn min_bytes_is_the_first_size_with_an_element_per_rank() {
        assert_eq!(Collective::AllGather.min_bytes(4, 2), 32);
        assert_eq!(Collective::AllToAll.min_bytes(1, 4), 64);
        assert_eq!(Collective::AllReduce.min_bytes(8, 4), 8);
        for coll in Collective::ALL {
            for elem in [1, 2, 4, 8] {
                for nranks in [1, 2, 3, 8] {
                    let min = coll.min_bytes(elem, nranks);
                    assert!(coll.counts(min, elem, nranks).param > 0, "{coll} {elem} {nranks}");
                    assert_eq!(coll.counts(min - 1, elem, nranks).param, 0, "{coll} {elem} {nranks}");
                }
            }
        }
    }

    #[test]
    fn bandwidths_follow_nccl_tests() {
        // 8 GiB all-reduce of floats on 2 ranks in 24665.8 µs: 348.25 GB/s (nccl-tests 2.19.6 on
        // 2×H200 with NCCL 2.28.9).
        let count = (8usize << 30) / 4;
        let alg = Collective::AllReduce.algbw(count, 4, 24665.8e-6, 2);
        assert!((alg - 348.25).abs() < 0.01, "{alg}");
        assert_eq!(Collective::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Collective::AllReduce.bus_factor(8), 1.75);
        // All-gather 8 GiB total output on 2 ranks in 14581.3 µs: algbw 589, busbw 294.55.
        let c = Collective::AllGather.counts(8 << 30, 4, 2);
        let alg = Collective::AllGather.algbw(c.param, 4, 14581.3e-6, 2);
        assert!((alg - 589.1).abs() < 0.1, "{alg}");
        assert!((alg * Collective::AllGather.bus_factor(2) - 294.55).abs() < 0.01);
        for c in [Collective::ReduceScatter, Collective::AllToAll, Collective::Gather, Collective::Scatter] {
            assert_eq!(c.bus_factor(4), 0.75);
        }
        // Gather of 1 MiB of floats in all on 2 ranks in 10 µs: 104.86 GB/s algbw.
        let c = Collective::Gather.counts(1 << 20, 4, 2);
        let alg = Collective::Gather.algbw(c.param, 4, 10e-6, 2);
        assert!((alg - 104.8576).abs() < 1e-6, "{alg}");
        for c in [Collective::Broadcast, Collective::Reduce, Collective::SendRecv] {
            assert_eq!(c.bus_factor(8), 1.0);
        }
        assert_eq!(Collective::SendRecv.algbw(100, 4, 0.0, 2), 0.0);
    }

    #[test]
    fn program_names() {
        assert_eq!(Collective::from_program("./build/all_reduce_perf"), Some(Collective::AllReduce));
        assert_eq!(Collective::from_program("alltoall_perf"), Some(Collective::AllToAll));
        assert_eq!(Collective::from_program("hypercube_perf"), None);
        assert_eq!(Collective::SendRecv.nccl_tests_program(), "sendrecv_perf");
        assert_eq!(Collective::from_program("scatter_perf"), Some(Collective::Scatter));
    }
}
