//! The `gpucomm` binary on a machine without GPUs (CI): help, every command-line error path and
//! its exit status, `compare` end to end, and the doctor's report when no driver is installed
//! (with no secret of the environment in it).

use std::path::Path;
use std::process::{Command, Output};

fn gpucomm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpucomm")).args(args).env_remove("NCCL_NVLS_ENABLE").output().expect("run gpucomm")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `args`, expects exit status `code` and `needle` in stderr.
fn fails_with(args: &[&str], code: i32, needle: &str) {
    let out = gpucomm(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: expected {needle:?} in:\n{err}");
}

/// True when the NVIDIA driver is installed here (then the no-driver expectations do not hold).
fn driver_present() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

#[test]
fn help_reads_well() {
    let out = gpucomm(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for word in ["doctor", "bench", "compare", "NCCL_NVLS_ENABLE=0"] {
        assert!(help.contains(word), "{word} not in --help:\n{help}");
    }
    assert!(!help.contains("__doctor-worker"), "internal subcommands stay hidden");
    let bench = text(&gpucomm(&["bench", "--help"]).stdout);
    for word in [
        "-b, --minbytes <SIZE>",
        "-e, --maxbytes <SIZE>",
        "-f, --stepfactor",
        "-n, --iters",
        "-w, --warmup_iters",
        "-c, --check",
        "-g, --ngpus",
        "--nproc",
        "--plot",
        "--compare",
        "2(n−1)/n",
    ] {
        assert!(bench.contains(word), "{word} not in bench --help:\n{bench}");
    }
    // The warm-up doubles from -b to -e, as nccl-tests' does; it does not visit every -f step.
    assert!(bench.contains("Warm-up iterations at each of -b, 2·-b, 4·-b … up to -e"), "{bench}");
    assert!(!bench.contains("over every size"), "{bench}");
    let doctor = text(&gpucomm(&["doctor", "--help"]).stdout);
    assert!(doctor.contains("--skip-live") && doctor.contains("Exit status"), "{doctor}");
}

#[test]
fn bench_command_line_errors() {
    fails_with(&["bench", "-b", "8X"], 2, "error: -b \"8X\": unknown unit: use K, M, G or T");
    fails_with(&["bench", "-e", "lots"], 2, "error: -e \"lots\": expected a number");
    fails_with(&["bench", "-b", "1M", "-e", "1K"], 2, "error: invalid size range: -b 1048576 is larger than -e 1024");
    fails_with(&["bench", "-b", "0"], 2, "-b must be at least 1 byte");
    fails_with(&["bench", "hypercube"], 2, "invalid value 'hypercube'");
    fails_with(&["bench", "-d", "float128"], 2, "error: -d \"float128\": expected int8, uint8");
    fails_with(&["bench", "-o", "xor"], 2, "error: -o \"xor\": expected sum, prod, max, min or avg");
    fails_with(
        &["bench", "-o", "mulsum"],
        2,
        "error: -o \"mulsum\": PreMulSum (nccl-tests' mulsum) is not wired into gpucomm bench yet: use sum, prod, \
         max, min or avg\n",
    );
    fails_with(&["bench", "-f", "1"], 2, "invalid value '1' for '--stepfactor");
    fails_with(&["bench", "-n", "0"], 2, "invalid value '0' for '--iters");
    fails_with(&["bench", "-c", "2"], 2, "invalid value '2' for '--check");
    fails_with(&["bench", "-g", "2", "--nproc", "2"], 2, "cannot be used with");
    fails_with(
        &["bench", "--compare", "/nonexistent/all_reduce.log"],
        2,
        "error: cannot read nccl-tests log /nonexistent/all_reduce.log: ",
    );
    fails_with(
        &["bench", "--plot", "/nonexistent/dir/busbw.svg"],
        2,
        "error: cannot write plot /nonexistent/dir/busbw.svg: ",
    );
    // Checked before any GPU work, for the rank count -g gives.
    fails_with(
        &["bench", "all_gather", "-b", "8", "-e", "32", "-g", "4"],
        2,
        "error: invalid size range: no size from -b 8 to -e 32 (8, 16, 32 bytes) gives each of 4 ranks one float \
         element for all_gather: the smallest that does is 64 bytes; raise -e\n",
    );
    // So is the root of a rooted collective.
    for ranks in [&["--nproc", "2"][..], &["-g", "2"]] {
        let args = [&["bench", "broadcast", "-r", "5"][..], ranks].concat();
        fails_with(&args, 2, "error: -r 5: broadcast needs a root among the 2 ranks (0 to 1)\n");
    }
    // The measurement knobs are checked before any GPU work.
    fails_with(&["bench", "alltoall", "--api", "raw"], 2, "error: --api raw runs all_reduce only, not alltoall");
    fails_with(&["bench", "broadcast", "--impl", "ll"], 2, "error: --impl runs all_reduce only, not broadcast");
    fails_with(
        &["bench", "--api", "raw", "--impl", "dispatch"],
        2,
        "--api raw calls ncclAllReduce: it cannot run --impl",
    );
    fails_with(&["bench", "-G", "5", "-y", "1"], 2, "the legacy default stream (-y 1) cannot be captured");
    fails_with(&["bench", "-G", "5", "-g", "2"], 2, "error: -G needs one process per GPU");
    fails_with(
        &["bench", "--cta-bytes", "2K,8K"],
        2,
        "--cta-bytes \"2K,8K\": three sizes above 0, LL,ONE_SHOT,TWO_SHOT",
    );
    fails_with(&["bench", "--buffers", "pinned"], 2, "invalid value 'pinned' for '--buffers");
    fails_with(
        &["bench", "--table", "/nonexistent/table.txt"],
        2,
        "error: cannot read crossover table /nonexistent/table.txt: ",
    );
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table.txt");
    std::fs::write(&table, "[eager]\nll <= 4K\n").unwrap();
    fails_with(&["bench", "--table", table.to_str().unwrap()], 2, "must have no limit");
}

#[test]
fn compare_log_of_another_collective_is_refused_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ag.log");
    std::fs::write(&log, "# Collective test starting: all_gather_perf\n          32             4     float    none      -1    13.05    0.00    0.00       0    13.00    0.00    0.00       0\n").unwrap();
    fails_with(&["bench", "--compare", log.to_str().unwrap()], 2, "no all_reduce run in it (it has all_gather)");
    std::fs::write(&log, "nothing useful\n").unwrap();
    fails_with(&["bench", "--compare", log.to_str().unwrap()], 2, "no nccl-tests results found");
}

#[test]
fn bench_compare_with_another_setup_is_refused_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("c.log");
    std::fs::write(&log, C_LOG).unwrap();
    let log = log.to_str().unwrap();
    let same = "run both tools with the same rank count (-g, --nproc or the launcher's), data type (-d), operator \
                (-o) and root (-r)\n";
    fails_with(
        &["bench", "--compare", log, "-g", "4"],
        2,
        &format!("error: cannot compare all_reduce: the runs differ in rank count (gpucomm: 4; nccl-tests: 2); {same}"),
    );
    fails_with(
        &["bench", "--compare", log, "-g", "2", "-d", "half", "-o", "max"],
        2,
        &format!(
            "error: cannot compare all_reduce: the runs differ in data type (gpucomm: half; nccl-tests: float), \
             reduction operator (gpucomm: max; nccl-tests: sum); {same}"
        ),
    );
}

#[test]
fn safety_variables_are_enforced_and_reported() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpucomm"))
        .args(["bench", "-b", "8X"])
        .env("NCCL_NVLS_ENABLE", "1")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(err.contains("note: NVLink multicast stays off: using NCCL_NVLS_ENABLE=0 (was \"1\")"), "{err}");
}

const C_LOG: &str = "\
# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#  Rank  0 Group  0 Pid  41213 on         vm device  0 [0000:00:06] NVIDIA H200
#  Rank  1 Group  0 Pid  41214 on         vm device  1 [0000:00:07] NVIDIA H200
           8             2     float     sum      -1    10.03    0.00    0.00       0     9.87    0.00    0.00       0
  8589934592    2147483648     float     sum      -1  24926.3  344.61  344.61       0  24902.1  344.95  344.95       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 172.39 
# Collective test concluded: all_reduce_perf
";

const RUST_TABLE: &str = "\
# gpucomm bench version 0.1.0 nccl-headers=22809 nccl-library=22809
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#  Rank  0 Group  0 Pid  41215 on         vm device  0 [0000:00:06] NVIDIA H200
#  Rank  1 Group  0 Pid  41216 on         vm device  1 [0000:00:07] NVIDIA H200
           8             2     float     sum      -1     9.90    0.00    0.00       0     9.80    0.00    0.00       0
  8589934592    2147483648     float     sum      -1  24900.0  344.97  344.97       0  24890.0  345.12  345.12       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 172.5 
# Collective test concluded: all_reduce_perf
";

#[test]
fn compare_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let (c, r, svg) = (dir.path().join("c.log"), dir.path().join("r.txt"), dir.path().join("busbw.svg"));
    std::fs::write(&c, C_LOG).unwrap();
    std::fs::write(&r, RUST_TABLE).unwrap();
    let out = gpucomm(&[
        "compare",
        "--rust",
        r.to_str().unwrap(),
        "--nccl-tests",
        c.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let table = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        table.contains(
            "## all_reduce: gpucomm (1 run(s), 2 ranks, NCCL 2.28.9) vs nccl-tests (1 run(s), 2 ranks, NCCL 2.28.9)"
        ),
        "{table}"
    );
    assert!(table.contains("| 8 GiB | 24900.00 | 24926.30 | -26.30 | 344.97 | 344.61 | 1.001 |"), "{table}");
    assert!(table.contains("### in-place"), "{table}");
    assert!(table.contains("goal ≥ 0.99: met"), "{table}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("nccl-tests (C)"));
    let out = gpucomm(&["compare", "--json", "--rust", r.to_str().unwrap(), "--nccl-tests", c.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("compare --json is JSON");
    assert_eq!(v[0]["collective"], "all_reduce");
    assert_eq!(v[0]["out_of_place"][1]["size"], 8u64 << 30);
    // Nothing in common.
    std::fs::write(&c, C_LOG.replace("all_reduce_perf", "all_gather_perf")).unwrap();
    let out = gpucomm(&["compare", "--rust", r.to_str().unwrap(), "--nccl-tests", c.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no collective appears in both"));
    fails_with(
        &["compare", "--rust", "/nonexistent.json", "--nccl-tests", c.to_str().unwrap()],
        2,
        "cannot read gpucomm bench result /nonexistent.json",
    );
    fails_with(&["compare", "--nccl-tests", c.to_str().unwrap()], 2, "--rust <FILE>");
}

#[test]
fn compare_refuses_other_setups_and_withholds_goals_without_a_rank_count() {
    let dir = tempfile::tempdir().unwrap();
    let (c, r) = (dir.path().join("c.log"), dir.path().join("r.txt"));
    std::fs::write(&r, RUST_TABLE).unwrap();
    let args = ["compare", "--rust", r.to_str().unwrap(), "--nccl-tests", c.to_str().unwrap()];
    std::fs::write(&c, C_LOG.replace("float", " half")).unwrap();
    fails_with(
        &args,
        2,
        "error: cannot compare all_reduce: the runs differ in data type (gpucomm: float; nccl-tests: half); run both \
         tools with the same rank count",
    );
    let without_ranks: String = C_LOG.lines().filter(|l| !l.starts_with("#  Rank")).map(|l| format!("{l}\n")).collect();
    std::fs::write(&c, without_ranks).unwrap();
    let out = gpucomm(&args);
    let (table, err) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{err}");
    let warning = "the nccl-tests output does not state its rank count (no '#  Rank' lines), so the runs may differ \
                   in it: goals not judged";
    assert_eq!(err, format!("warning: {warning}\n"));
    assert!(table.contains("vs nccl-tests (1 run(s), ? ranks, NCCL 2.28.9)"), "{table}");
    assert!(table.contains(&format!("\n- {warning}\n")), "{table}");
    assert!(!table.contains("goal ≥") && !table.contains("goal ≤"), "{table}");
}

#[test]
fn doctor_without_a_driver_says_so_and_fails() {
    if driver_present() {
        eprintln!("SKIPPED: an NVIDIA driver is installed here; this test covers machines without one");
        return;
    }
    let out = gpucomm(&["doctor"]);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("✗ NVML unavailable: "), "{report}");
    assert!(report.contains("fix: install the NVIDIA driver (it ships libnvidia-ml.so.1)"), "{report}");
    assert!(report.contains("✗ no CUDA driver: libcuda.so.1 cannot be loaded"), "{report}");
    assert!(report.contains("live layer skipped: it needs 2 GPUs, CUDA sees 0"), "{report}");
    assert!(text(&out.stderr).contains("error: doctor found"), "{}", text(&out.stderr));
    let out = gpucomm(&["doctor", "--json", "--skip-live"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor --json is JSON");
    let checks = v["checks"].as_array().unwrap();
    let nvml = checks.iter().find(|c| c["title"].as_str().unwrap().starts_with("NVML unavailable")).unwrap();
    assert_eq!((nvml["layer"].as_str(), nvml["status"].as_str()), (Some("physical"), Some("fail")));
    assert!(nvml["fix"].as_str().unwrap().contains("libnvidia-ml.so.1"));
    assert!(v["failures"].as_u64().unwrap() >= 2);
    // Only the variables the doctor reasons about: not PATH, HOME or the like.
    let env = v["facts"]["software"]["env"].as_array().unwrap();
    let names: Vec<&str> = env.iter().map(|pair| pair[0].as_str().unwrap()).collect();
    assert!(!names.iter().any(|n| ["PATH", "HOME", "USER", "PWD"].contains(n)), "{names:?}");
    // The figures' places exist even when there is nothing to put in them.
    assert_eq!(v["facts"]["limits"], serde_json::Value::Null);
    assert_eq!(v["facts"]["bandwidth"], serde_json::json!([]));
    assert_eq!(v["facts"]["nvlink_error_growth"], serde_json::Value::Null);
    assert_eq!(v["facts"]["nvlink_far_ends"], serde_json::json!([]));
    // --json-out: the text report on stdout and the same run's JSON in the file.
    let dir = std::env::temp_dir().join(format!("gpucomm-doctor-json-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("doctor.json");
    let out = gpucomm(&["doctor", "--skip-live", "--json-out", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("✗ NVML unavailable: "), "{}", text(&out.stdout));
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).expect("JSON in the file");
    assert_eq!(written["failures"], v["failures"]);
    assert_eq!(written["facts"]["bandwidth"], serde_json::json!([]));
    std::fs::remove_dir_all(&dir).unwrap();
    let missing = dir.join("no-such-folder").join("doctor.json");
    let out = gpucomm(&["doctor", "--skip-live", "--json-out", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot write the JSON report (--json-out)"), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("✗ NVML unavailable: "), "the report comes first: {}", text(&out.stdout));
    fails_with(&["doctor", "--nproc", "1"], 2, "invalid value '1' for '--nproc");
}

#[test]
fn bench_without_a_driver_is_a_failed_run_that_points_at_the_doctor() {
    if driver_present() {
        fails_with(&["bench", "-g", "4096"], 2, "error: -g 4096 needs 4096 GPUs, CUDA sees");
        eprintln!("SKIPPED: an NVIDIA driver is installed here; the rest covers machines without one");
        return;
    }
    let no_driver = "error: no CUDA driver: libcuda.so.1 could not be loaded (libcuda.so.1: cannot open shared \
                     object file: No such file or directory); run `gpucomm doctor`\n";
    for args in [&["bench", "-b", "8", "-e", "8"][..], &["bench", "-g", "4096"], &["bench", "--nproc", "2", "--json"]] {
        let out = gpucomm(args);
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        assert_eq!(text(&out.stderr), no_driver, "{args:?}");
        assert_eq!(text(&out.stdout), "", "{args:?}");
    }
}

/// Secret values the environment of the doctor test holds.
const SECRETS: [(&str, &str); 3] = [
    ("GPUCOMM_JOB_KEY", "job-key-0123456789abcdef"),
    ("MY_API_TOKEN", "api-token-fedcba9876"),
    ("NCCL_PLUGIN_TOKEN", "plugin-token-55aa"),
];

#[test]
fn doctor_reports_carry_no_secrets() {
    for json in [true, false] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpucomm"));
        cmd.args(["doctor", "--skip-live"]).env("NCCL_DEBUG", "INFO");
        if json {
            cmd.arg("--json");
        }
        for (name, value) in SECRETS {
            cmd.env(name, value);
        }
        let out = cmd.output().unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        for (_, value) in SECRETS {
            assert!(!stdout.contains(value) && !stderr.contains(value), "{value} shown:\n{stdout}\n{stderr}");
        }
        if json {
            let v: serde_json::Value = serde_json::from_str(&stdout).expect("doctor --json is JSON");
            let env = v["facts"]["software"]["env"].as_array().unwrap();
            let pair = |n: &str, v: &str| serde_json::json!([n, v]);
            assert!(env.contains(&pair("NCCL_DEBUG", "INFO")), "{env:?}");
            assert!(env.contains(&pair("GPUCOMM_JOB_KEY", "<redacted, 24 bytes>")), "{env:?}");
            assert!(env.contains(&pair("NCCL_PLUGIN_TOKEN", "<redacted, 17 bytes>")), "{env:?}");
            assert!(!env.iter().any(|p| p[0] == "MY_API_TOKEN"), "not a variable the doctor reasons about: {env:?}");
        } else {
            assert!(stdout.contains("\n      NCCL_DEBUG=INFO — NCCL log level INFO\n"), "{stdout}");
            assert!(stdout.contains("\n      NCCL_PLUGIN_TOKEN=<redacted, 17 bytes> — set (not one"), "{stdout}");
        }
    }
}

#[test]
fn doctor_names_the_variable_that_stopped_the_nccl_search() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpucomm"))
        .args(["doctor", "--skip-live"])
        .env("NCCL_LIB_DIR", d)
        .output()
        .unwrap();
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("\n  ✗ NCCL could not be loaded\n"), "{report}");
    assert!(
        report.contains(&format!("\n      fix: NCCL_LIB_DIR={d} holds no libnccl.so.2: fix or unset it\n")),
        "{report}"
    );
    // The check's own fix line (the loader's report above it has install advice of its own).
    assert!(!report.contains("\n      fix: pip install nvidia-nccl"), "{report}");
}

#[test]
fn doctor_tells_python_without_wheels_from_python_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("python3");
    std::fs::write(&python, "#!/bin/sh\necho \"GPUCOMM_PY_ERROR=ModuleNotFoundError: No module named 'nvidia'\"\n")
        .unwrap();
    let mut perms = std::fs::metadata(&python).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&python, perms).unwrap();
    let run = |python: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_gpucomm"))
            .args(["doctor", "--skip-live"])
            .env("NCCL_SYS_PYTHON", python)
            .output();
        text(&out.unwrap().stdout)
    };
    let p = python.to_str().unwrap();
    let report = run(p);
    assert!(
        report.contains(&format!("\n  • no NVIDIA wheels in {p} (ModuleNotFoundError: No module named 'nvidia')\n")),
        "{report}"
    );
    assert!(!report.contains("Python wheels not searched"), "{report}");
    let report = run("/nonexistent/python3");
    assert!(report.contains("\n  • Python wheels not searched: could not run `/nonexistent/python3`: "), "{report}");
    // NVSHMEM's copies are searched with NVSHMEM's interpreter, as nvshmem-sys asks it.
    let out = Command::new(env!("CARGO_BIN_EXE_gpucomm"))
        .args(["doctor", "--skip-live"])
        .env("NCCL_SYS_PYTHON", p)
        .env("NVSHMEM_SYS_PYTHON", "/nonexistent/nvshmem-python3")
        .output();
    let report = text(&out.unwrap().stdout);
    assert!(report.contains(&format!("\n  • no NVIDIA wheels in {p} (")), "{report}");
    assert!(
        report.contains("\n  • Python wheels not searched: could not run `/nonexistent/nvshmem-python3`: "),
        "{report}"
    );
}

#[test]
fn doctor_lists_the_loaded_nvshmem_among_its_copies() {
    let out = gpucomm(&["doctor", "--skip-live", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor --json is JSON");
    let Some(loaded) = v["facts"]["software"]["nvshmem"].get("Ok") else {
        eprintln!("SKIPPED: no NVSHMEM loads here");
        return;
    };
    let real = std::fs::canonicalize(loaded["path"].as_str().unwrap()).unwrap();
    let copies = v["facts"]["software"]["nvshmem_copies"].as_array().unwrap();
    let copy = copies.iter().find(|c| c["path"] == real.to_str().unwrap()).unwrap_or_else(|| panic!("{copies:?}"));
    assert_eq!(copy["version"], loaded["version"]);
}

#[test]
fn probe_reports_a_missing_library_as_json() {
    let out = gpucomm(&["__probe-nccl", "/nonexistent/libnccl.so.2"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["path"].is_null());
    assert!(v["error"].as_str().unwrap().contains("/nonexistent/libnccl.so.2"));
}
