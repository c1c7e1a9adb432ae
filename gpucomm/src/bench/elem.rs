//! Data types (`-d`) and reduction operators (`-o`), with the host arithmetic that validation
//! (`-c 1`) needs to predict each result.

use cudarc::driver::ValidAsZeroBits;
use half::{bf16, f16};
use nccl::{NcclType, ReduceOp};

use crate::error::CliError;

/// The reduction operators nccl-tests names, but `mulsum` (PreMulSum): the nccl crate has it
/// (`nccl::PreMulSum`), but the bench's calls, validation and graph captures do not carry a
/// per-communicator operator yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `sum`
    Sum,
    /// `prod`
    Prod,
    /// `max`
    Max,
    /// `min`
    Min,
    /// `avg`
    Avg,
}

impl Op {
    /// Parses `-o`.
    pub fn parse(text: &str) -> Result<Op, CliError> {
        Ok(match text {
            "sum" => Op::Sum,
            "prod" => Op::Prod,
            "max" => Op::Max,
            "min" => Op::Min,
            "avg" => Op::Avg,
            "mulsum" => {
                return Err(CliError::BadChoice {
                    what: "-o",
                    value: text.into(),
                    why: "PreMulSum (nccl-tests' mulsum) is not wired into gpucomm bench yet: use sum, prod, max, \
                          min or avg"
                        .into(),
                })
            }
            _ => {
                return Err(CliError::BadChoice {
                    what: "-o",
                    value: text.into(),
                    why: "expected sum, prod, max, min or avg".into(),
                })
            }
        })
    }

    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Max => "max",
            Op::Min => "min",
            Op::Avg => "avg",
        }
    }

    /// NCCL's operator.
    pub fn nccl(self) -> ReduceOp {
        match self {
            Op::Sum => ReduceOp::SUM,
            Op::Prod => ReduceOp::PROD,
            Op::Max => ReduceOp::MAX,
            Op::Min => ReduceOp::MIN,
            Op::Avg => ReduceOp::AVG,
        }
    }
}

/// The data types, by nccl-tests' names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// `int8`
    I8,
    /// `uint8`
    U8,
    /// `int32`
    I32,
    /// `uint32`
    U32,
    /// `int64`
    I64,
    /// `uint64`
    U64,
    /// `half`
    F16,
    /// `bfloat16`
    Bf16,
    /// `float`
    F32,
    /// `double`
    F64,
}

impl DType {
    /// nccl-tests' name (the "type" column), as [`Elem::NAME`] of its element type.
    pub fn name(self) -> &'static str {
        match self {
            DType::I8 => i8::NAME,
            DType::U8 => u8::NAME,
            DType::I32 => i32::NAME,
            DType::U32 => u32::NAME,
            DType::I64 => i64::NAME,
            DType::U64 => u64::NAME,
            DType::F16 => f16::NAME,
            DType::Bf16 => bf16::NAME,
            DType::F32 => f32::NAME,
            DType::F64 => f64::NAME,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 => size_of::<i8>(),
            DType::U8 => size_of::<u8>(),
            DType::I32 => size_of::<i32>(),
            DType::U32 => size_of::<u32>(),
            DType::I64 => size_of::<i64>(),
            DType::U64 => size_of::<u64>(),
            DType::F16 => size_of::<f16>(),
            DType::Bf16 => size_of::<bf16>(),
            DType::F32 => size_of::<f32>(),
            DType::F64 => size_of::<f64>(),
        }
    }

    /// Parses `-d` (nccl-tests' names, and the usual aliases).
    pub fn parse(text: &str) -> Result<DType, CliError> {
        Ok(match text {
            "int8" | "char" => DType::I8,
            "uint8" => DType::U8,
            "int32" | "int" => DType::I32,
            "uint32" => DType::U32,
            "int64" => DType::I64,
            "uint64" => DType::U64,
            "half" | "float16" | "fp16" => DType::F16,
            "bfloat16" | "bf16" => DType::Bf16,
            "float" | "float32" | "fp32" => DType::F32,
            "double" | "float64" | "fp64" => DType::F64,
            "f8e4m3" | "f8e5m2" => {
                return Err(CliError::BadChoice {
                    what: "-d",
                    value: text.into(),
                    why: "FP8 is not wired into gpucomm bench yet".into(),
                })
            }
            _ => {
                return Err(CliError::BadChoice {
                    what: "-d",
                    value: text.into(),
                    why: "expected int8, uint8, int32, uint32, int64, uint64, half, bfloat16, float or double".into(),
                })
            }
        })
    }
}

/// An element the bench can move, fill and check.
pub trait Elem:
    NcclType + ValidAsZeroBits + Copy + PartialEq + Send + Sync + std::fmt::Debug + Unpin + 'static
{
    /// nccl-tests' name.
    const NAME: &'static str;
    /// The test pattern: small whole numbers, exact in every type.
    fn pattern(rank: usize, index: usize) -> Self;
    /// `a op b` as NCCL computes it (integers wrap).
    fn combine(op: Op, a: Self, b: Self) -> Self;
    /// `sum / n` for the average.
    fn divide(sum: Self, n: usize) -> Self;
    /// True when `got` is `want` within the type's rounding.
    fn close(got: Self, want: Self) -> bool;
}

macro_rules! int_elem {
    ($($t:ty => $name:literal),*) => {$(
        impl Elem for $t {
            const NAME: &'static str = $name;
            fn pattern(rank: usize, index: usize) -> Self {
                ((rank + index) % 3 + 1) as $t
            }
            fn combine(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::Sum | Op::Avg => a.wrapping_add(b),
                    Op::Prod => a.wrapping_mul(b),
                    Op::Max => a.max(b),
                    Op::Min => a.min(b),
                }
            }
            fn divide(sum: Self, n: usize) -> Self {
                sum / (n as $t)
            }
            fn close(got: Self, want: Self) -> bool {
                got == want
            }
        }
    )*};
}

int_elem!(i8 => "int8", u8 => "uint8", i32 => "int32", u32 => "uint32", i64 => "int64", u64 => "uint64");

macro_rules! float_elem {
    ($($t:ty => $name:literal, $tol:expr, $from:expr, $to:expr);*) => {$(
        impl Elem for $t {
            const NAME: &'static str = $name;
            fn pattern(rank: usize, index: usize) -> Self {
                $from(((rank + index) % 3 + 1) as f64)
            }
            fn combine(op: Op, a: Self, b: Self) -> Self {
                let (x, y): (f64, f64) = ($to(a), $to(b));
                $from(match op {
                    Op::Sum | Op::Avg => x + y,
                    Op::Prod => x * y,
                    Op::Max => x.max(y),
                    Op::Min => x.min(y),
                })
            }
            fn divide(sum: Self, n: usize) -> Self {
                $from($to(sum) / n as f64)
            }
            fn close(got: Self, want: Self) -> bool {
                let (g, w): (f64, f64) = ($to(got), $to(want));
                (g - w).abs() <= $tol * w.abs().max(1.0)
            }
        }
    )*};
}

float_elem!(
    f32 => "float", 1e-5, |v: f64| v as f32, |v: f32| v as f64;
    f64 => "double", 1e-12, |v: f64| v, |v: f64| v;
    f16 => "half", 1e-2, f16::from_f64, f16::to_f64;
    bf16 => "bfloat16", 2e-2, bf16::from_f64, bf16::to_f64
);

/// The value rank `rank` holds at `index` after an all-reduce-like combination of every rank's
/// pattern at `index` (`src_index` picks which pattern element each rank contributes).
pub fn reduced<T: Elem>(op: Op, nranks: usize, src_index: usize) -> T {
    let mut acc = T::pattern(0, src_index);
    for q in 1..nranks {
        acc = T::combine(op, acc, T::pattern(q, src_index));
    }
    if op == Op::Avg {
        T::divide(acc, nranks)
    } else {
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_ones_are_refused() {
        assert_eq!(DType::parse("float").unwrap(), DType::F32);
        assert_eq!(DType::parse("bfloat16").unwrap(), DType::Bf16);
        assert_eq!(DType::parse("fp64").unwrap(), DType::F64);
        let e = DType::parse("float128").unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_USAGE);
        assert!(e.to_string().starts_with("-d \"float128\": expected int8"), "{e}");
        assert!(DType::parse("f8e4m3").unwrap_err().to_string().contains("FP8 is not wired"));
        assert_eq!(Op::parse("max").unwrap().name(), "max");
        assert_eq!(
            Op::parse("mulsum").unwrap_err().to_string(),
            "-o \"mulsum\": PreMulSum (nccl-tests' mulsum) is not wired into gpucomm bench yet: use sum, prod, \
             max, min or avg"
        );
        assert_eq!((DType::Bf16.name(), DType::Bf16.size()), ("bfloat16", 2));
        assert_eq!((DType::U64.name(), DType::U64.size()), ("uint64", 8));
        assert_eq!(Op::parse("xor").unwrap_err().to_string(), "-o \"xor\": expected sum, prod, max, min or avg");
    }

    #[test]
    fn predictions_match_nccl_arithmetic() {
        // Ranks 0..3 at index 0 hold 1, 2, 3, 1.
        assert_eq!(reduced::<f32>(Op::Sum, 4, 0), 7.0);
        assert_eq!(reduced::<f32>(Op::Prod, 4, 0), 6.0);
        assert_eq!(reduced::<i32>(Op::Max, 4, 0), 3);
        assert_eq!(reduced::<u8>(Op::Min, 4, 0), 1);
        assert_eq!(reduced::<i32>(Op::Avg, 4, 0), 1, "integer average truncates");
        assert_eq!(reduced::<f64>(Op::Avg, 4, 0), 1.75);
        // int8 products wrap: 3^8 over 8 ranks at index 2 (values 3,1,2,3,1,2,3,1) = 3*1*2*3*1*2*3*1 = 108.
        assert_eq!(reduced::<i8>(Op::Prod, 8, 2), 108);
        let wrapped = (0..16).fold(1i8, |acc, q| acc.wrapping_mul(((q + 2) % 3 + 1) as i8));
        assert_eq!(reduced::<i8>(Op::Prod, 16, 2), wrapped, "wraps like the GPU");
        assert!(f16::close(f16::from_f64(6562.0), f16::from_f64(6561.0)));
        assert!(!f32::close(7.1, 7.0));
    }
}
