//! CPU-only checks of the build and loading story: what a user sees when NCCL is missing, at build
//! time and at run time, and that the Rust view of the device-API structs matches C's.

use std::path::Path;
use std::process::Command;

use build_support::build::nvcc::Nvcc;
use build_support::env::Env;
use build_support::locate::{Locator, CUDA};

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Runs cargo on this workspace in a separate target directory (so the main build's fingerprints
/// stay intact), one such build at a time (they share that directory's compiled dependencies).
fn cargo(args: &[&str], envs: &[(&str, &std::ffi::OsStr)]) -> std::process::Output {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (subcommand, rest) = args.split_first().expect("a cargo subcommand");
    Command::new(env!("CARGO"))
        .arg(subcommand)
        .arg("--manifest-path")
        .arg(Path::new(WORKSPACE).join("Cargo.toml"))
        .args(rest)
        .env("CARGO_TARGET_DIR", Path::new(WORKSPACE).join("target/setup-checks"))
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

/// `cargo check -p nccl-sys` with `NCCL_HOME` pointing at an empty directory must stop with the
/// missing-library report (every place searched, the variables, the setup command), not a linker
/// or bindgen crash.
#[test]
fn empty_nccl_home_gives_the_missing_library_message() {
    let empty = tempfile::tempdir().unwrap();
    let out = cargo(&["check", "-q", "-p", "nccl-sys"], &[("NCCL_HOME", empty.path().as_os_str())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the build must fail:\n{stderr}");
    let home = empty.path().display();
    for needle in [
        "NCCL not found where NCCL_HOME points (header nccl.h and library libnccl.so.2 or libnccl.so).".to_string(),
        format!("1. NCCL_HOME={home}: no nccl.h in {home}/include; no libnccl.so.2 or libnccl.so in {home}/lib"),
        "Variables consulted:".to_string(),
        "To fix: pip install nvidia-nccl-cu13".to_string(),
    ] {
        assert!(stderr.contains(&needle), "missing {needle:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("panicked") && !stderr.contains("linking with"), "{stderr}");
}

/// The `link` feature links `libnccl.so.2` at build time (the wheels ship only the versioned name)
/// and `library()` then reads the functions from the process: the loading tests pass that way too,
/// with the dynamic loader pointed at the wheel's directory.
#[test]
fn link_feature_builds_and_loads_from_the_process() {
    let lib_dir = std::ffi::OsString::from(nccl_sys::BUILD_LIB_DIR);
    let out = cargo(
        &["test", "-q", "-p", "nccl-sys", "--features", "link", "--test", "load", "--", "--nocapture"],
        &[("LD_LIBRARY_PATH", &lib_dir)],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("loaded NCCL {} (", nccl_sys::HEADER_VERSION)), "{stdout}");
    assert!(stdout.contains("from (linked)"), "{stdout}");
}

/// At run time, a wrong `NCCL_SYS_LIBRARY` stops the search with a report naming it. Loading is
/// once per process, so the check runs in a child process of this test binary.
#[test]
fn wrong_library_variable_gives_the_load_report() {
    if std::env::var_os("GPUCOMM_LOAD_ERROR_CHILD").is_some() {
        let err = nccl_sys::library().err().expect("the load must fail").to_string();
        println!("{err}");
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "wrong_library_variable_gives_the_load_report", "--nocapture"])
        .env("GPUCOMM_LOAD_ERROR_CHILD", "1")
        .env("NCCL_SYS_LIBRARY", "/nonexistent/libnccl.so.2")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("could not load the NCCL library. Tried, in order:"), "{text}");
    assert!(text.contains("1. /nonexistent/libnccl.so.2 (NCCL_SYS_LIBRARY=/nonexistent/libnccl.so.2):"), "{text}");
    assert!(text.contains("The search stopped at a path named by a variable"), "{text}");
}

/// `ncclDevComm` is passed to kernels by value, so Rust's layout must be C++'s. nvcc (from the
/// pinned wheels) compiles static assertions built from Rust's sizes and alignments.
#[test]
fn device_api_structs_have_the_c_layout() {
    let env = Env::process();
    let cuda = Locator::new(&env).find(&CUDA).unwrap_or_else(|e| panic!("{e}"));
    let mut nvcc = Nvcc::locate(&env, Some(&cuda)).unwrap();
    nvcc.include(Path::new(nccl_sys::INCLUDE_DIR));
    macro_rules! asserts {
        ($($t:ident),*) => {
            [$(format!(
                "static_assert(sizeof({0}) == {1} && alignof({0}) == {2}, \"{0}: Rust has size {1}, align {2}\");\n",
                stringify!($t), size_of::<nccl_sys::$t>(), align_of::<nccl_sys::$t>()
            )),*].concat()
        };
    }
    let body = asserts!(ncclDevComm, ncclDevCommRequirements, ncclConfig_t, ncclUniqueId, ncclWindow_vidmem);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("layout.cu");
    std::fs::write(&src, format!("#include <nccl.h>\n#include <nccl_device.h>\n{body}")).unwrap();
    nvcc.check(&src, &dir.path().join("layout.o")).unwrap_or_else(|e| panic!("{e}"));
}
