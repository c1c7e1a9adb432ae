//! Library versions: read from the headers a build compiles against, compared with the supported
//! range, and turned into cumulative `cfg`s (`nccl_2_28` means "NCCL ≥ 2.28").
//!
//! The supported ranges live here; the -sys crates, the safe crates' build scripts and the run-time
//! loader read them from [`NCCL_SUPPORT`] and [`NVSHMEM_SUPPORT`]. `./dev.sh` fetches the releases at
//! both ends, and this crate's `tests/version_range.rs` builds against them and checks that they are
//! these ranges' ends, so a range cannot claim more than was built.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// A `major.minor.patch` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Patch number.
    pub patch: u32,
}

impl Version {
    /// Builds a version.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version { major, minor, patch }
    }

    /// NCCL's integer encoding (`ncclGetVersion`, `NCCL_VERSION_CODE`): `X*10000 + Y*100 + Z` since
    /// 2.9, `X*1000 + Y*100 + Z` before.
    pub fn from_nccl_code(code: i64) -> Option<Self> {
        let code = u32::try_from(code).ok()?;
        if code >= 20900 {
            Some(Version::new(code / 10000, (code % 10000) / 100, code % 100))
        } else if code >= 1000 {
            Some(Version::new(code / 1000, (code % 1000) / 100, code % 100))
        } else {
            None
        }
    }

    /// The same encoding as [`Self::from_nccl_code`], for versions ≥ 2.9 (and NVSHMEM's
    /// `NVSHMEM_VENDOR_VERSION`, which uses it too).
    pub fn code(&self) -> u32 {
        self.major * 10000 + self.minor * 100 + self.patch
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl std::str::FromStr for Version {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.trim().split('.').collect();
        let num = |i: usize| -> Result<u32, String> {
            parts.get(i).unwrap_or(&"0").parse().map_err(|_| format!("bad version `{s}`"))
        };
        if parts.is_empty() || parts.len() > 3 {
            return Err(format!("bad version `{s}`"));
        }
        Ok(Version::new(num(0)?, num(1)?, num(2)?))
    }
}

/// The versions a crate family supports, and the cfg names derived from them.
#[derive(Debug)]
pub struct Support {
    /// Library name for messages.
    pub name: &'static str,
    /// cfg prefix: `nccl` → `nccl_2_28`.
    pub cfg_prefix: &'static str,
    /// Oldest supported version.
    pub min: Version,
    /// Every (major, minor) that gets a cfg, oldest first; the last is the newest known
    /// ([`Support::max`]).
    pub minors: &'static [(u32, u32)],
    /// Variable that lets a newer header through.
    pub skip_var: &'static str,
}

/// NCCL 2.18.1 … 2.32.x (what each release brought is in NCCL's release notes). The repository's `tests/version_range.rs` builds against both ends (2.18.1 and 2.32.3, the newest
/// release) and fails when the releases it builds stop being this range's ends.
pub const NCCL_SUPPORT: Support = Support {
    name: "NCCL",
    cfg_prefix: "nccl",
    min: Version::new(2, 18, 1),
    minors: &[
        (2, 18),
        (2, 19),
        (2, 20),
        (2, 21),
        (2, 22),
        (2, 23),
        (2, 24),
        (2, 25),
        (2, 26),
        (2, 27),
        (2, 28),
        (2, 29),
        (2, 30),
        (2, 31),
        (2, 32),
    ],
    skip_var: "NCCL_SYS_SKIP_VERSION_CHECK",
};

/// NVSHMEM 3.3.9 … 3.8.x (`nvshmem_host.h` and the `hostlib` entry points). Both ends (3.3.9 and
/// 3.8.0) are built by `tests/version_range.rs`, as for NCCL.
pub const NVSHMEM_SUPPORT: Support = Support {
    name: "NVSHMEM",
    cfg_prefix: "nvshmem",
    min: Version::new(3, 3, 9),
    minors: &[(3, 3), (3, 4), (3, 5), (3, 6), (3, 7), (3, 8)],
    skip_var: "NVSHMEM_SYS_SKIP_VERSION_CHECK",
};

impl Support {
    /// The newest major.minor whose headers are known (the last of [`Support::minors`]); newer
    /// headers need the skip variable.
    pub const fn max(&self) -> (u32, u32) {
        match self.minors.last() {
            Some(&newest) => newest,
            None => panic!("a Support table lists at least one minor version"),
        }
    }

    /// The cfg name for one minor version.
    pub fn cfg_name(&self, major: u32, minor: u32) -> String {
        format!("{}_{major}_{minor}", self.cfg_prefix)
    }

    /// Every cfg this family may set (for `rustc-check-cfg`).
    pub fn all_cfgs(&self) -> Vec<String> {
        self.minors.iter().map(|&(a, b)| self.cfg_name(a, b)).collect()
    }

    /// The cfgs that hold for `v` (cumulative: all minors ≤ v).
    pub fn cfgs_for(&self, v: Version) -> Vec<String> {
        self.minors.iter().filter(|&&(a, b)| (a, b) <= (v.major, v.minor)).map(|&(a, b)| self.cfg_name(a, b)).collect()
    }

    /// Checks `v` against the range; `skip` lets a newer version through (never an older one).
    pub fn check(&self, v: Version, skip: bool) -> Result<(), String> {
        let max = self.max();
        let newest = format!("{}.{}", max.0, max.1);
        if v < self.min {
            return Err(format!(
                "{} {v} is older than the oldest supported version {}; supported: {} … {newest}.x",
                self.name, self.min, self.min
            ));
        }
        if (v.major, v.minor) > max && !skip {
            return Err(format!(
                "{} {v} is newer than the newest known version {newest}.x; supported: {} … {newest}.x. \
                 Set {}=1 to build anyway (new features stay unavailable until this crate knows them)",
                self.name, self.min, self.skip_var
            ));
        }
        Ok(())
    }
}

/// Collects `#define NAME VALUE` lines (object-like macros; the value is the rest of the line).
pub fn scan_defines(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim_start();
        let Some(rest) = line.strip_prefix('#') else { continue };
        let Some(rest) = rest.trim_start().strip_prefix("define") else { continue };
        if !rest.starts_with(char::is_whitespace) {
            continue;
        }
        let mut it = rest.trim_start().splitn(2, char::is_whitespace);
        let (Some(name), value) = (it.next(), it.next()) else { continue };
        if name.contains('(') {
            continue;
        }
        let value = value.unwrap_or("").split("//").next().unwrap_or("").trim();
        out.insert(name.to_string(), value.to_string());
    }
    out
}

fn define_num(defines: &BTreeMap<String, String>, name: &str, file: &Path) -> Result<u32, String> {
    let raw = defines.get(name).ok_or_else(|| format!("{} has no #define {name}", file.display()))?;
    raw.trim_matches(|c| c == '(' || c == ')')
        .parse()
        .map_err(|_| format!("{}: #define {name} {raw} is not a number", file.display()))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// NCCL's version from `<include>/nccl.h` (`NCCL_MAJOR`, `NCCL_MINOR`, `NCCL_PATCH`).
pub fn nccl_header_version(include_dir: &Path) -> Result<Version, String> {
    let file = include_dir.join("nccl.h");
    let d = scan_defines(&read(&file)?);
    Ok(Version::new(
        define_num(&d, "NCCL_MAJOR", &file)?,
        define_num(&d, "NCCL_MINOR", &file)?,
        define_num(&d, "NCCL_PATCH", &file)?,
    ))
}

/// NVSHMEM's vendor version (`NVSHMEM_VENDOR_{MAJOR,MINOR,PATCH}_VERSION`), from the first of the
/// headers that defines it (`non_abi/nvshmem_version.h` in 3.x wheels).
pub fn nvshmem_header_version(include_dir: &Path) -> Result<Version, String> {
    let files = ["non_abi/nvshmem_version.h", "nvshmem_version.h", "device_host_transport/nvshmem_constants.h"];
    for rel in files {
        let file = include_dir.join(rel);
        if !file.is_file() {
            continue;
        }
        let d = scan_defines(&read(&file)?);
        if d.contains_key("NVSHMEM_VENDOR_MAJOR_VERSION") {
            return Ok(Version::new(
                define_num(&d, "NVSHMEM_VENDOR_MAJOR_VERSION", &file)?,
                define_num(&d, "NVSHMEM_VENDOR_MINOR_VERSION", &file)?,
                define_num(&d, "NVSHMEM_VENDOR_PATCH_VERSION", &file)?,
            ));
        }
    }
    Err(format!("no NVSHMEM_VENDOR_MAJOR_VERSION in {} under {}", files.join(", "), include_dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defines_are_scanned() {
        let d = scan_defines(
            "#define NCCL_MAJOR 2\n#  define NCCL_MINOR 28 // c\n#define F(x) x\n#define EMPTY\n#defineX 1\n",
        );
        assert_eq!(d.get("NCCL_MAJOR").unwrap(), "2");
        assert_eq!(d.get("NCCL_MINOR").unwrap(), "28");
        assert_eq!(d.get("EMPTY").unwrap(), "");
        assert!(!d.contains_key("F(x)") && !d.contains_key("F") && !d.contains_key("X"));
    }

    #[test]
    fn nccl_codes_decode_both_encodings() {
        assert_eq!(Version::from_nccl_code(22809), Some(Version::new(2, 28, 9)));
        assert_eq!(Version::from_nccl_code(2708), Some(Version::new(2, 7, 8)));
        assert_eq!(Version::from_nccl_code(-1), None);
        assert_eq!(Version::new(2, 28, 9).code(), 22809);
        assert_eq!("3.4.5".parse::<Version>().unwrap(), Version::new(3, 4, 5));
        assert_eq!("2.28".parse::<Version>().unwrap(), Version::new(2, 28, 0));
        assert!("x.1".parse::<Version>().is_err());
    }

    #[test]
    fn cfgs_are_cumulative_and_ranges_checked() {
        let cfgs = NCCL_SUPPORT.cfgs_for(Version::new(2, 28, 9));
        assert_eq!(cfgs.first().unwrap(), "nccl_2_18");
        assert_eq!(cfgs.last().unwrap(), "nccl_2_28");
        assert_eq!(cfgs.len(), 11);
        assert!(NCCL_SUPPORT.check(Version::new(2, 28, 9), false).is_ok());
        let old = NCCL_SUPPORT.check(Version::new(2, 17, 1), true).unwrap_err();
        assert!(old.contains("older than the oldest supported version 2.18.1"), "{old}");
        let new = NCCL_SUPPORT.check(Version::new(2, 40, 0), false).unwrap_err();
        assert!(new.contains("NCCL_SYS_SKIP_VERSION_CHECK=1"), "{new}");
        assert!(NCCL_SUPPORT.check(Version::new(2, 40, 0), true).is_ok());
        assert_eq!(NVSHMEM_SUPPORT.cfgs_for(Version::new(3, 4, 5)), ["nvshmem_3_3", "nvshmem_3_4"]);
        // The newest known minor is the table's last, and the range check uses it.
        assert_eq!((NCCL_SUPPORT.max(), NVSHMEM_SUPPORT.max()), ((2, 32), (3, 8)));
        assert!(NCCL_SUPPORT.check(Version::new(2, 32, 99), false).is_ok());
        assert!(NCCL_SUPPORT.check(Version::new(2, 33, 0), false).is_err());
    }

    #[test]
    fn header_versions_are_read_from_files() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("nccl.h"),
            "#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 9\n",
        )
        .unwrap();
        assert_eq!(nccl_header_version(tmp.path()).unwrap(), Version::new(2, 28, 9));
        std::fs::create_dir_all(tmp.path().join("non_abi")).unwrap();
        std::fs::write(
            tmp.path().join("non_abi/nvshmem_version.h"),
            "#define NVSHMEM_VENDOR_MAJOR_VERSION 3\n#define NVSHMEM_VENDOR_MINOR_VERSION 4\n#define NVSHMEM_VENDOR_PATCH_VERSION 5\n",
        )
        .unwrap();
        assert_eq!(nvshmem_header_version(tmp.path()).unwrap(), Version::new(3, 4, 5));
        let err = nvshmem_header_version(&tmp.path().join("nope")).unwrap_err();
        assert!(err.contains("no NVSHMEM_VENDOR_MAJOR_VERSION"), "{err}");
    }
}
