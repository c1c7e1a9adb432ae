//! Sizes on the command line (`8`, `8K`, `1.5M`, `8G`, as nccl-tests reads them) and in reports.

use crate::error::CliError;

const KIB: u64 = 1 << 10;

/// Parses a byte count the way nccl-tests' `-b`/`-e` do: a number, optionally followed by `K`, `M`
/// or `G` (powers of 1024, either case), optionally followed by `B` or `iB` (either case). A whole
/// number is read exactly; `flag` names the option in the error.
pub fn parse_size(flag: &'static str, text: &str) -> Result<u64, CliError> {
    let bad = |why: &str| CliError::BadSize { flag, value: text.to_string(), why: why.to_string() };
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    if number.is_empty() {
        return Err(bad("expected a number such as 8, 8K, 8M or 8G"));
    }
    let value: f64 = number.parse().map_err(|_| bad("not a number"))?;
    let unit = unit.trim();
    let unit = ["iB", "ib", "B", "b"].iter().find_map(|s| unit.strip_suffix(s)).unwrap_or(unit);
    let scale = match unit {
        "" => 1,
        "K" | "k" => KIB,
        "M" | "m" => KIB * KIB,
        "G" | "g" => KIB * KIB * KIB,
        "T" | "t" => KIB * KIB * KIB * KIB,
        _ => return Err(bad("unknown unit: use K, M, G or T (powers of 1024)")),
    };
    // A whole number, scaled exactly: as an `f64`, 2^53 + 1 bytes would round to 2^53.
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(scale).ok_or_else(|| bad("too large"));
    }
    let bytes = value * scale as f64;
    if !(bytes.is_finite() && bytes < u64::MAX as f64) {
        return Err(bad("too large"));
    }
    if bytes.fract() != 0.0 {
        return Err(bad("not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// A byte count for people: `8 B`, `2 KiB`, `1.5 MiB`, `8 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Formats `value` in `width` characters the way nccl-tests does (`getFloatStr`): two decimals if
/// they fit, then one, then none, then scientific notation.
pub fn float_cell(value: f64, width: usize) -> String {
    for decimals in [2, 1, 0] {
        let s = format!("{value:>width$.decimals$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = if width >= 7 { format!("{value:.1e}") } else { format!("{value:.0e}") };
    // C prints a two-digit exponent with a sign (1.2e+07); Rust prints 1.2e7.
    let s = match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    };
    format!("{s:>width$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("-b", "8").unwrap(), 8);
        assert_eq!(parse_size("-b", "8K").unwrap(), 8192);
        assert_eq!(parse_size("-b", "8k").unwrap(), 8192);
        assert_eq!(parse_size("-b", "8M").unwrap(), 8 << 20);
        assert_eq!(parse_size("-e", "8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("-e", "1.5M").unwrap(), 3 << 19);
        assert_eq!(parse_size("-e", "64MB").unwrap(), 64 << 20);
        assert_eq!(parse_size("-e", "64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("-e", " 2 G ").unwrap(), 2 << 30);
        // Session 29 audit: a lowercase `b` was refused, and whole numbers past 2^53 were rounded.
        assert_eq!(parse_size("-b", "8kb").unwrap(), 8192);
        assert_eq!(parse_size("-b", "8mib").unwrap(), 8 << 20);
        assert_eq!(parse_size("-b", "9007199254740993").unwrap(), 9_007_199_254_740_993);
        assert!(parse_size("-e", "18446744073709551615K").is_err());
    }

    #[test]
    fn bad_sizes_say_why() {
        for (text, why) in [
            ("", "expected a number"),
            ("K", "expected a number"),
            ("-8", "expected a number"),
            ("8X", "unknown unit"),
            ("1.2.3", "not a number"),
            ("0.3", "not a whole number"),
            ("99999999999T", "too large"),
        ] {
            let e = parse_size("-b", text).unwrap_err().to_string();
            assert!(e.starts_with(&format!("-b {text:?}: ")), "{e}");
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(8), "8 B");
        assert_eq!(human_bytes(2048), "2 KiB");
        assert_eq!(human_bytes(3 << 19), "1.5 MiB");
        assert_eq!(human_bytes(8 << 30), "8 GiB");
    }

    #[test]
    fn cells_shrink_like_get_float_str() {
        assert_eq!(float_cell(15.04, 7), "  15.04");
        assert_eq!(float_cell(24665.8, 7), "24665.8");
        assert_eq!(float_cell(1234567.0, 7), "1234567");
        assert_eq!(float_cell(12345678.0, 7), "1.2e+07");
        assert_eq!(float_cell(348.25, 6), "348.25");
        assert_eq!(float_cell(0.0, 6), "  0.00");
    }
}
