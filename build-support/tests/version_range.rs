//! The supported version ranges ([`NCCL_SUPPORT`], [`NVSHMEM_SUPPORT`]) claim no more than is built.
//!
//! For every NCCL and NVSHMEM release that `./dev.sh test` fetches (the oldest and newest of each
//! range, listed in `.deps/versions/.gpucomm-wheels`, and the GPU machine's pins in `.deps/py`):
//!
//! 1. `cargo check` of the -sys crate and its safe crate against that release's headers, reading
//!    the cfgs each build script gave from Cargo's JSON messages: they must be every minor from the
//!    range's oldest up to the header's (`nccl_2_18` alone for 2.18.1); a safe crate's build
//!    script that re-derives them must give the same, and patch-level cfgs (`nccl_2_28_7`) no
//!    newer than the header;
//! 2. `cargo test` of the -sys crate's CPU tests (`load`, and for NVSHMEM `initializers`), which load
//!    that release's library and compare the hand-written initializers with its C macros.
//!
//! Then the oldest release built must be the range's minimum and the newest one's minor the range's
//! maximum. With `--nocapture` the test prints the table of releases and cfgs.
//!
//! The builds use their own target directory (under `CARGO_TARGET_TMPDIR`), so the workspace
//! build's fingerprints stay intact, and run one at a time.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Instant;

use build_support::version::{
    nccl_header_version, nvshmem_header_version, Support, Version, NCCL_SUPPORT, NVSHMEM_SUPPORT,
};

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// One library family and the crates built against it.
struct Family {
    support: &'static Support,
    /// `nccl` / `nvshmem`: the wheel name's part and the folder under `nvidia/`.
    wheel: &'static str,
    home_var: &'static str,
    read_version: fn(&Path) -> Result<Version, String>,
    sys: &'static str,
    safe: &'static str,
    /// The -sys crate's CPU test files that load the library.
    tests: &'static [&'static str],
    /// cfgs the -sys build script sets besides the version ones, for a given header version.
    extra_cfgs: fn(Version) -> Vec<String>,
}

const NCCL: Family = Family {
    support: &NCCL_SUPPORT,
    wheel: "nccl",
    home_var: "NCCL_HOME",
    read_version: nccl_header_version,
    sys: "nccl-sys",
    safe: "nccl-rs",
    tests: &["load"],
    extra_cfgs: |_| Vec::new(),
};

const NVSHMEM: Family = Family {
    support: &NVSHMEM_SUPPORT,
    wheel: "nvshmem",
    home_var: "NVSHMEM_HOME",
    read_version: nvshmem_header_version,
    sys: "nvshmem-sys",
    safe: "nvshmem",
    tests: &["load", "initializers"],
    // Version 2 of nvshmemx_init_args_t (a cuda_device_id field) came with NVSHMEM 3.8.
    extra_cfgs: |v| if v >= Version::new(3, 8, 0) { vec!["nvshmem_init_args_v2".into()] } else { Vec::new() },
};

#[test]
fn nccl_builds_across_the_supported_range() {
    check_range(&NCCL);
}

#[test]
fn nvshmem_builds_across_the_supported_range() {
    check_range(&NVSHMEM);
}

/// A release to build against: its root (with `include/` and `lib/`) and where it came from.
struct Release {
    version: Version,
    root: PathBuf,
    /// The GPU machine's pin, which the workspace's own tests already load.
    pinned: bool,
}

/// What building against one release gave.
struct Row {
    version: Version,
    place: String,
    cfgs: Vec<String>,
    check_seconds: u64,
    /// The load test's `loaded …` line and the seconds the tests took (range ends only).
    loaded: Option<(String, u64)>,
}

fn check_range(family: &Family) {
    // Both families share the target directory; one build at a time keeps their output apart.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());

    let releases = releases(family);
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for release in &releases {
        match build_against(family, release) {
            Ok(row) => rows.push(row),
            Err(e) => problems.push(format!("{} {}: {e}", family.support.name, release.version)),
        }
    }
    print_table(family, &rows);

    let oldest = releases.first().expect("at least the pinned release").version;
    let newest = releases.last().expect("at least the pinned release").version;
    let support = family.support;
    if oldest != support.min {
        problems.push(format!("the oldest release built is {oldest}, but the range claims {}", support.min));
    }
    let max = support.max();
    if (newest.major, newest.minor) != max {
        problems.push(format!("the newest release built is {newest}, but the range claims {}.{}.x", max.0, max.1));
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n\n"));
}

/// The range's ends fetched by `./dev.sh test` and the pinned wheel, oldest first.
fn releases(family: &Family) -> Vec<Release> {
    let prefix = std::env::var_os("GPUCOMM_PREFIX").map_or_else(|| Path::new(WORKSPACE).join(".deps"), PathBuf::from);
    let stamp = prefix.join("versions/.gpucomm-wheels");
    let list = std::fs::read_to_string(&stamp).unwrap_or_else(|e| {
        panic!("cannot read {} ({e}): `./dev.sh test` (or `./dev.sh setup`) fetches the releases", stamp.display())
    });
    let wanted = format!("nvidia-{}-cu", family.wheel);
    let mut releases: Vec<Release> = list
        .lines()
        .filter(|line| line.starts_with(&wanted))
        .map(|line| {
            let (_, version) =
                line.split_once("==").unwrap_or_else(|| panic!("{}: `{line}` has no ==", stamp.display()));
            release(family, prefix.join("versions").join(format!("{}-{version}", family.wheel)), false)
        })
        .collect();
    releases.push(release(family, prefix.join("py/nvidia").join(family.wheel), true));
    releases.sort_by_key(|r| r.version);
    releases
}

fn release(family: &Family, root: PathBuf, pinned: bool) -> Release {
    let version = (family.read_version)(&root.join("include")).unwrap_or_else(|e| panic!("{e}"));
    Release { version, root, pinned }
}

fn build_against(family: &Family, release: &Release) -> Result<Row, String> {
    let started = Instant::now();
    let cfgs = check_cfgs(family, release)?;
    let check_seconds = started.elapsed().as_secs();
    let loaded = if release.pinned {
        None
    } else {
        let started = Instant::now();
        let line = load_tests(family, release)?;
        Some((line, started.elapsed().as_secs()))
    };
    Ok(Row { version: release.version, place: place(release), cfgs, check_seconds, loaded })
}

/// Checks the -sys crate and its safe crate, compares their build scripts' cfgs with the header
/// version and returns them (the -sys crate's, then the safe crate's patch-level ones). Cargo reports every build script's cfgs in its JSON
/// messages, also for builds that were already fresh.
fn check_cfgs(family: &Family, release: &Release) -> Result<Vec<String>, String> {
    let check = ["check", "--message-format=json-render-diagnostics", "-p", family.sys, "-p", family.safe];
    let out = cargo(family, release, &check)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let scripts: Vec<ScriptRun> = stdout.lines().filter_map(ScriptRun::parse).collect();
    let sys = scripts.iter().find(|s| s.package == family.sys).ok_or("no build-script message from the -sys crate")?;
    let header = sys.env("_SYS_HEADER_VERSION").ok_or("the -sys build script set no *_SYS_HEADER_VERSION")?;
    if header != release.version.to_string() {
        return Err(format!("the build used headers {header}, not {}", release.version));
    }
    let (version_cfgs, patches, extra) = classify(family.support, &sys.cfgs);
    let expected = cumulative_cfgs(family.support, release.version);
    if version_cfgs != expected {
        return Err(format!("cfgs {version_cfgs:?}, expected {expected:?}"));
    }
    let expected_extra = (family.extra_cfgs)(release.version);
    if extra != expected_extra {
        return Err(format!("other cfgs {extra:?}, expected {expected_extra:?}"));
    }
    // Patch-level cfgs (`nccl_2_28_7`: "header ≥ 2.28.7") must not exceed the header.
    let patches_fit =
        |krate: &str, patches: &[(String, Version)]| match patches.iter().find(|(_, v)| *v > release.version) {
            Some((cfg, _)) => Err(format!("{krate} sets {cfg} for headers {}", release.version)),
            None => Ok(()),
        };
    patches_fit(family.sys, &patches)?;
    let mut cfgs = sys.cfgs.clone();
    // A safe crate whose build script re-derives the minor cfgs must agree; it may add
    // patch-level ones.
    if let Some(safe) = scripts.iter().find(|s| s.package == family.safe) {
        let (minors, patches, other) = classify(family.support, &safe.cfgs);
        if !minors.is_empty() && minors != version_cfgs {
            return Err(format!("{} has cfgs {minors:?}, {} has {version_cfgs:?}", family.safe, family.sys));
        }
        patches_fit(family.safe, &patches)?;
        let own = patches.into_iter().map(|(cfg, _)| cfg).chain(other);
        cfgs.extend(own.map(|cfg| format!("{cfg} ({})", family.safe)));
    }
    Ok(cfgs)
}

/// Runs the -sys crate's CPU tests, which load this release's library; returns their
/// `loaded … from <path>` line.
fn load_tests(family: &Family, release: &Release) -> Result<String, String> {
    let mut args = vec!["test", "-p", family.sys];
    for t in family.tests {
        args.extend(["--test", t]);
    }
    args.extend(["--", "--nocapture"]);
    let out = cargo(family, release, &args)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The line may follow libtest's `test <name> ... ` on the same line (tests run in parallel).
    let loaded = stdout
        .lines()
        .find_map(|l| l.find("loaded ").map(|at| &l[at..]))
        .ok_or("the load test printed no `loaded …` line")?;
    if !loaded.contains(&release.root.display().to_string()) {
        return Err(format!("the load test loaded a library outside {}: {loaded}", release.root.display()));
    }
    Ok(loaded.to_string())
}

/// Splits cfgs into minor-version cfgs (`nccl_2_28`), patch-version cfgs (`nccl_2_28_7`, with the
/// version they stand for) and the rest, each in the order given.
fn classify(support: &Support, cfgs: &[String]) -> (Vec<String>, Vec<(String, Version)>, Vec<String>) {
    let (mut minors, mut patches, mut other) = (Vec::new(), Vec::new(), Vec::new());
    for cfg in cfgs {
        let numbers: Option<Vec<u32>> = cfg
            .strip_prefix(support.cfg_prefix)
            .and_then(|rest| rest.strip_prefix('_'))
            .and_then(|rest| rest.split('_').map(str::parse).collect::<Result<_, _>>().ok());
        match numbers.as_deref() {
            Some([_, _]) => minors.push(cfg.clone()),
            Some(&[major, minor, patch]) => patches.push((cfg.clone(), Version::new(major, minor, patch))),
            _ => other.push(cfg.clone()),
        }
    }
    (minors, patches, other)
}

/// The cfgs a header version must give: one per minor from the range's oldest up to its own,
/// spelled out here independently of [`Support::cfgs_for`].
fn cumulative_cfgs(support: &Support, v: Version) -> Vec<String> {
    assert_eq!(v.major, support.min.major, "a new major version needs this test extended");
    (support.min.minor..=v.minor).map(|minor| format!("{}_{}_{minor}", support.cfg_prefix, v.major)).collect()
}

/// Runs cargo on this workspace against `release` alone: every NCCL/NVSHMEM variable of this
/// process is dropped, only `<X>_HOME` is set. A failure carries cargo's messages.
fn cargo(family: &Family, release: &Release, args: &[&str]) -> Result<Output, String> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(WORKSPACE).args(args);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.contains("NCCL_") || name.contains("NVSHMEM_") {
            cmd.env_remove(&*name);
        }
    }
    // No debug info and no incremental state: nobody debugs these builds, and the bindings
    // change with every release, so both would only cost time (~40% of it).
    cmd.env("CARGO_TARGET_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("version-range"))
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .env("CARGO_INCREMENTAL", "0")
        .env(family.home_var, &release.root);
    let out = cmd.output().map_err(|e| format!("cannot run cargo: {e}"))?;
    if out.status.success() {
        return Ok(out);
    }
    // Test output and rendered compiler messages; JSON lines stay out.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('{')).collect();
    Err(format!("`cargo {}` failed:\n{}\n{}", args.join(" "), text.join("\n"), String::from_utf8_lossy(&out.stderr)))
}

fn place(release: &Release) -> String {
    let root = release.root.display().to_string();
    let short = root.rsplit_once("/.deps/").map_or(root.clone(), |(_, rest)| format!(".deps/{rest}"));
    format!("{short}{}", if release.pinned { " (pinned)" } else { "" })
}

fn print_table(family: &Family, rows: &[Row]) {
    let (sys, safe) = (family.sys, family.safe);
    let mut text = format!(
        "\n{} releases built (1: cargo check -p {sys} -p {safe}; 2: cargo test -p {sys} --test {}):\n",
        family.support.name,
        family.tests.join(" --test ")
    );
    let width = rows.iter().map(|r| r.place.len()).max().unwrap_or(0);
    for row in rows {
        let version = row.version.to_string();
        text.push_str(&format!("  {version:<8} {:<width$}  cfgs: {}\n", row.place, row.cfgs.join(" ")));
        let step2 = match &row.loaded {
            Some((line, seconds)) => format!("2: {seconds} s, {line}"),
            None => "2: run by the workspace's own tests".to_string(),
        };
        text.push_str(&format!("  {:<8} {:<width$}  1: {} s, {step2}\n", "", "", row.check_seconds));
    }
    println!("{text}");
}

/// The parts of a `build-script-executed` message of `cargo --message-format=json` used here.
struct ScriptRun {
    package: String,
    cfgs: Vec<String>,
    env: Vec<(String, String)>,
}

impl ScriptRun {
    fn parse(line: &str) -> Option<Self> {
        if !line.contains(r#""reason":"build-script-executed""#) {
            return None;
        }
        // `path+file:///…/nccl-sys#0.1.0`, or `path+file:///…/nccl#nccl-rs@0.1.0` when the
        // folder is not named like the package.
        let id = field(line, "package_id")?.into_string()?;
        let (path, tail) = id.rsplit_once('#')?;
        let package = match tail.split_once('@') {
            Some((name, _)) => name.to_string(),
            None => path.rsplit('/').next()?.to_string(),
        };
        let cfgs = field(line, "cfgs")?.into_strings();
        let env = field(line, "env")?
            .into_list()
            .into_iter()
            .filter_map(|pair| <[String; 2]>::try_from(pair.into_strings()).ok())
            .map(|[k, v]| (k, v))
            .collect();
        Some(ScriptRun { package, cfgs, env })
    }

    /// The value of the `rustc-env` variable whose name ends with `suffix`.
    fn env(&self, suffix: &str) -> Option<&str> {
        self.env.iter().find(|(k, _)| k.ends_with(suffix)).map(|(_, v)| v.as_str())
    }
}

/// The JSON these fields hold: strings and arrays of them. A key `"name":` cannot occur inside a
/// string value (its quotes would be escaped), so finding it by text is exact.
enum Json {
    Str(String),
    List(Vec<Json>),
}

impl Json {
    fn into_string(self) -> Option<String> {
        match self {
            Json::Str(s) => Some(s),
            Json::List(_) => None,
        }
    }

    fn into_list(self) -> Vec<Json> {
        match self {
            Json::List(items) => items,
            Json::Str(_) => Vec::new(),
        }
    }

    fn into_strings(self) -> Vec<String> {
        self.into_list().into_iter().filter_map(Json::into_string).collect()
    }
}

fn field(line: &str, key: &str) -> Option<Json> {
    let start = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    parse_value(&mut line[start..].chars().peekable())
}

fn parse_value(it: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<Json> {
    match it.next()? {
        '"' => {
            let mut s = String::new();
            loop {
                match it.next()? {
                    '"' => return Some(Json::Str(s)),
                    // Cargo's messages escape only quotes, backslashes and control characters.
                    '\\' => s.push(match it.next()? {
                        'n' => '\n',
                        't' => '\t',
                        c => c,
                    }),
                    c => s.push(c),
                }
            }
        }
        '[' => {
            let mut items = Vec::new();
            if it.peek() == Some(&']') {
                it.next();
                return Some(Json::List(items));
            }
            loop {
                items.push(parse_value(it)?);
                match it.next()? {
                    ',' => continue,
                    ']' => return Some(Json::List(items)),
                    _ => return None,
                }
            }
        }
        _ => None,
    }
}
