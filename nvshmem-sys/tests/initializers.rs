//! The hand-written initializers must equal NVSHMEM's C macros, field by field. A small C++
//! program is compiled (with the system `c++`) against the same headers the bindings came from and
//! prints every field; the Rust side prints the same fields and the two texts must match.

use nvshmem_sys::{nvshmemx_init_attr_t, nvshmemx_uniqueid_t};
use std::mem::size_of;
use std::process::Command;

const PROGRAM: &str = r#"
#include <nvshmem_host.h>
#include <cstdio>
int main() {
    nvshmemx_init_attr_t a = NVSHMEMX_INIT_ATTR_INITIALIZER;
    nvshmemx_uniqueid_t u = NVSHMEMX_UNIQUEID_INITIALIZER;
    printf("attr size=%zu version=%d mpi_comm=%p\n", sizeof a, a.version, a.mpi_comm);
    printf("args version=%d\n", a.args.version);
    printf("uid_args version=%d id=%p myrank=%d nranks=%d\n", a.args.uid_args.version,
           (void *)a.args.uid_args.id, a.args.uid_args.myrank, a.args.uid_args.nranks);
    int nonzero = 0;
    for (size_t i = 0; i < sizeof a.args.content; i++) nonzero |= a.args.content[i];
    printf("args content nonzero=%d\n", nonzero);
    nonzero = 0;
    for (size_t i = 0; i < sizeof u.internal; i++) nonzero |= u.internal[i];
    printf("uniqueid size=%zu version=%d nonzero=%d\n", sizeof u, u.version, nonzero);
    return 0;
}
"#;

fn rust_side() -> String {
    let a = nvshmemx_init_attr_t::initializer();
    let u = nvshmemx_uniqueid_t::initializer();
    let ptr = |p: *const ()| if p.is_null() { "(nil)".to_string() } else { format!("{p:p}") };
    let nonzero = |bytes: &[std::os::raw::c_char]| bytes.iter().any(|&b| b != 0) as i32;
    format!(
        "attr size={} version={} mpi_comm={}\nargs version={}\nuid_args version={} id={} myrank={} nranks={}\n\
         args content nonzero={}\nuniqueid size={} version={} nonzero={}\n",
        size_of::<nvshmemx_init_attr_t>(),
        a.version,
        ptr(a.mpi_comm as *const ()),
        a.args.version,
        a.args.uid_args.version,
        ptr(a.args.uid_args.id as *const ()),
        a.args.uid_args.myrank,
        a.args.uid_args.nranks,
        nonzero(&a.args.content),
        size_of::<nvshmemx_uniqueid_t>(),
        u.version,
        nonzero(&u.internal),
    )
}

#[test]
fn initializers_match_the_c_macros() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("init.cpp");
    let exe = dir.path().join("init");
    std::fs::write(&src, PROGRAM).unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let status = Command::new(&cxx)
        .args(["-std=c++17", "-I", nvshmem_sys::INCLUDE_DIR, "-I", nvshmem_sys::CUDA_INCLUDE_DIR])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cxx}: {e}"));
    assert!(status.success(), "{cxx} failed to compile the initializer probe");
    let c_side = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    assert_eq!(rust_side(), c_side);
    assert!(c_side.contains("myrank=-1 nranks=-1"), "{c_side}");
}
