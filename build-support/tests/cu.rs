//! The `.cu` kernels API end to end, with nothing but the pinned wheels (`GPUCOMM_PREFIX`, which
//! `.cargo/config.toml` points at `.deps`): real nvcc runs, real images, the generated Rust file
//! compiled and run. No GPU is involved.
//!
//! The NCCL and NVSHMEM flavours with the directories the -sys crates pass on (`DEP_*`) are tested
//! in `nccl-sys/tests/kernels.rs` and `nvshmem-sys/tests/nvcc.rs`; here the NCCL flavour finds its
//! headers by searching, as for a crate that does not depend on nccl-sys directly.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use build_support::build::cu::{CuError, Flavour, Kernels};
use build_support::emit::Emitter;
use build_support::env::Env;
use object::{Object, ObjectSymbol};

/// The wheels' prefix: `GPUCOMM_PREFIX` as Cargo sets it, else the repository's `.deps`.
fn prefix() -> String {
    std::env::var("GPUCOMM_PREFIX").unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../.deps").to_string())
}

/// A crate directory with `kernels/` and an `OUT_DIR`, as Cargo gives a build script.
struct Crate {
    dir: tempfile::TempDir,
}

impl Crate {
    fn new() -> Crate {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("out")).unwrap();
        Crate { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The variables a build script of this crate sees, plus `extra`.
    fn env(&self, extra: &[(&str, &str)]) -> Env {
        let out = self.path("out").to_str().unwrap().to_string();
        let manifest = self.dir.path().to_str().unwrap().to_string();
        let prefix = prefix();
        let mut pairs = vec![
            ("OUT_DIR", out.as_str()),
            ("CARGO_MANIFEST_DIR", manifest.as_str()),
            ("GPUCOMM_PREFIX", prefix.as_str()),
            ("CUDA_SYS_NO_PYTHON", "1"),
            ("NCCL_SYS_NO_PYTHON", "1"),
        ];
        pairs.extend_from_slice(extra);
        Env::from_pairs(None, pairs.iter().map(|&(k, v)| (k, v)))
    }
}

/// A runner that counts nvcc invocations.
fn counting() -> (Arc<AtomicUsize>, impl Fn(&mut Command) -> std::io::Result<std::process::Output> + Send + Sync + Clone)
{
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    (count, move |cmd: &mut Command| {
        c.fetch_add(1, Ordering::SeqCst);
        cmd.output()
    })
}

fn symbols(image: &[u8]) -> Vec<String> {
    let file = object::File::parse(image).expect("the image is an ELF file");
    file.symbols().filter_map(|s| s.name().ok().map(str::to_string)).collect()
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap()
}

const SCALE: &str = "#include \"common.cuh\"\n#include \"local.h\"\n\
    extern \"C\" __global__ void scale(float *x, float a, int n) {\n\
        int i = global_index();\n\
        if (i < n) x[i] *= a * LOCAL_FACTOR;\n\
    }\n";
const FILL: &str = "extern \"C\" __global__ void fill(int *x, int v) { x[threadIdx.x] = v; }\n";

/// Two plain files: both compile to cubins with their kernels; the dependency list holds the
/// included headers and Cargo is told about them and about every variable; a second run with
/// nothing changed does not start nvcc; a changed header rebuilds only the image that includes it;
/// the generated file compiles, and the program it is part of sees the images, 16-byte aligned.
#[test]
fn plain_images_dependencies_rebuilds_and_embedding() {
    let krate = Crate::new();
    let scale = krate.write("kernels/scale.cu", SCALE);
    let common = krate.write(
        "kernels/include/common.cuh",
        "#pragma once\n__device__ inline int global_index() { return blockIdx.x * blockDim.x + threadIdx.x; }\n",
    );
    let local = krate.write("kernels/local.h", "#pragma once\n#define LOCAL_FACTOR 1.0f\n");
    let fill = krate.write("kernels/fill.cu", FILL);
    let env = krate.env(&[]);
    let (count, runner) = counting();
    let build = || {
        let mut out = Emitter::new(Vec::new());
        let built = Kernels::new()
            .cuda("kernels/scale.cu")
            .cuda("kernels/fill.cu")
            .include("kernels/include")
            .runner(runner.clone())
            .build_with(&env, &mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        (built, String::from_utf8(out.into_inner()).unwrap())
    };

    let (built, cargo) = build();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert_eq!(
        built.images.iter().map(|i| (i.name.as_str(), i.rebuilt)).collect::<Vec<_>>(),
        [("SCALE", true), ("FILL", true)]
    );
    let image = std::fs::read(built.images[0].image.as_ref().unwrap()).unwrap();
    assert!(image.starts_with(b"\x7fELF"));
    assert!(symbols(&image).iter().any(|s| s == "scale"), "{:?}", symbols(&image));
    assert!(built.images[0].image.as_ref().unwrap().extension().unwrap() == "cubin");

    let cuda_runtime = canonical(&Path::new(&prefix()).join("py/nvidia/cu13/include/cuda_runtime.h"));
    let inputs = &built.images[0].inputs;
    for header in [canonical(&scale), canonical(&common), canonical(&local), cuda_runtime] {
        assert!(inputs.contains(&header), "{} missing from {inputs:?}", header.display());
        assert!(cargo.contains(&format!("cargo::rerun-if-changed={}\n", header.display())), "{cargo}");
    }
    assert!(!built.images[1].inputs.contains(&canonical(&common)));
    assert!(cargo.contains(&format!("cargo::rerun-if-changed={}\n", fill.display())), "{cargo}");
    for var in ["NVCC", "CUDA_ARCHS", "NVCC_CCBIN", "NVCC_APPEND_FLAGS", "GPUCOMM_SKIP_CU", "DOCS_RS", "CUDA_HOME"] {
        assert!(cargo.contains(&format!("cargo::rerun-if-env-changed={var}\n")), "{var} not declared:\n{cargo}");
    }

    let rust = std::fs::read_to_string(&built.rust_file).unwrap();
    assert_eq!(built.rust_file, krate.path("out/kernels.rs"));
    assert!(rust.contains("pub const ARCHS: &[u32] = &[90];\n"), "{rust}");
    assert!(rust.contains("pub const COMPILED: bool = true;\n"), "{rust}");
    assert!(
        rust.contains(&format!(
            "/// The plain CUDA image of `kernels/scale.cu`: a cubin for sm_90, for `cuModuleLoadData`.\n\
             pub static SCALE: &[u8] = &GpucommAlignedImage(*include_bytes!({:?})).0;\n",
            krate.path("out/gpucomm-cu/kernels/SCALE.cubin").to_str().unwrap()
        )),
        "{rust}"
    );
    let rust_mtime = std::fs::metadata(&built.rust_file).unwrap().modified().unwrap();

    // Nothing changed: nvcc does not run, the inputs are the same, kernels.rs is not rewritten.
    let (again, cargo_again) = build();
    assert_eq!(count.load(Ordering::SeqCst), 2, "nvcc ran again with unchanged inputs");
    assert!(again.images.iter().all(|i| !i.rebuilt));
    assert_eq!(again.images[0].inputs, built.images[0].inputs);
    assert_eq!(cargo_again, cargo);
    assert_eq!(std::fs::metadata(&built.rust_file).unwrap().modified().unwrap(), rust_mtime);

    // A header changes: only the image that includes it is rebuilt.
    std::fs::write(&common, "#pragma once\n__device__ inline int global_index() { return threadIdx.x; }\n").unwrap();
    let (third, _) = build();
    assert_eq!(count.load(Ordering::SeqCst), 3);
    assert_eq!(third.images.iter().map(|i| i.rebuilt).collect::<Vec<_>>(), [true, false]);

    // The generated file compiles into a program that sees both images.
    let lens: Vec<u64> =
        third.images.iter().map(|i| std::fs::metadata(i.image.as_ref().unwrap()).unwrap().len()).collect();
    let printed = run_with_kernels(&krate, &built.rust_file, &["SCALE", "FILL"]);
    assert_eq!(printed, format!("[90] true\nSCALE {} 0 true\nFILL {} 0 true\n", lens[0], lens[1]));
}

/// Compiles a program that `include!`s `rust_file` and prints, for each image, its length, its
/// address modulo 16 (0 when empty) and whether it starts with the ELF magic.
fn run_with_kernels(krate: &Crate, rust_file: &Path, names: &[&str]) -> String {
    let prints: String = names
        .iter()
        .map(|n| format!("    println!(\"{n} {{}} {{}} {{}}\", kernels::{n}.len(), if kernels::{n}.is_empty() {{ 0 }} else {{ kernels::{n}.as_ptr() as usize % 16 }}, kernels::{n}.starts_with(b\"\\x7fELF\"));\n"))
        .collect();
    let main = krate.write(
        "main.rs",
        &format!(
            "//! Uses the generated kernels.\n\
             /// The kernels.\n\
             pub mod kernels {{ include!({:?}); }}\n\
             fn main() {{\n    println!(\"{{:?}} {{}}\", kernels::ARCHS, kernels::COMPILED);\n{prints}}}\n",
            rust_file.to_str().unwrap()
        ),
    );
    let rustc = Path::new(env!("CARGO")).with_file_name("rustc");
    let rustc = if rustc.is_file() { rustc } else { PathBuf::from("rustc") };
    let exe = krate.path("main");
    let out = Command::new(rustc)
        .args(["--edition", "2021", "-D", "warnings", "-D", "missing_docs", "-o"])
        .arg(&exe)
        .arg(&main)
        .output()
        .unwrap();
    assert!(out.status.success(), "the generated file does not compile:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    String::from_utf8(run.stdout).unwrap()
}

/// The NCCL device API flavour in a crate that does not depend on nccl-sys (no
/// `DEP_NCCL_INCLUDE`): the headers come from the NCCL search, whose variables are declared to
/// Cargo, and the dependency list names NCCL's headers and CCCL's. (The LSA kernel built against
/// nccl-sys's own headers is in `nccl-sys/tests/kernels.rs`.)
#[test]
fn nccl_headers_found_by_search_without_dep_variables() {
    let krate = Crate::new();
    krate.write(
        "kernels/lsa_rank.cu",
        "#include <nccl_device.h>\n\
         extern \"C\" __global__ void lsa_rank(ncclDevComm dev, int *out) { *out = ncclTeamLsa(dev).rank; }\n",
    );
    let env = krate.env(&[]);
    let mut out = Emitter::new(Vec::new());
    let built = Kernels::new().nccl("kernels/lsa_rank.cu").build_with(&env, &mut out).unwrap_or_else(|e| panic!("{e}"));
    let image = &built.images[0];
    assert_eq!((image.name.as_str(), image.flavour), ("LSA_RANK", Flavour::Nccl));
    let bytes = std::fs::read(image.image.as_ref().unwrap()).unwrap();
    assert!(symbols(&bytes).iter().any(|s| s == "lsa_rank"), "{:?}", symbols(&bytes));
    let nccl_include = canonical(&Path::new(&prefix()).join("py/nvidia/nccl/include"));
    for header in ["nccl_device.h", "nccl_device/core.h", "nccl.h"] {
        assert!(image.inputs.contains(&nccl_include.join(header)), "{header} missing from {:?}", image.inputs);
    }
    assert!(image.inputs.iter().any(|p| p.to_string_lossy().contains("/include/cccl/cuda/")), "no CCCL header");
    let cargo = String::from_utf8(out.into_inner()).unwrap();
    for var in ["NCCL_HOME", "NCCL_INCLUDE_DIR", "GPUCOMM_PREFIX"] {
        assert!(cargo.contains(&format!("cargo::rerun-if-env-changed={var}\n")), "{var} not declared:\n{cargo}");
    }
}

/// A missing install, or one without what a flavour needs, is named, with where its directory
/// came from.
#[test]
fn missing_or_incomplete_installs_are_named() {
    let krate = Crate::new();
    krate.write("kernels/k.cu", FILL);
    // A prefix with the compiler wheels only: nvcc is found, NCCL is not.
    let only_cuda = krate.path("prefix/py/nvidia");
    std::fs::create_dir_all(&only_cuda).unwrap();
    std::os::unix::fs::symlink(Path::new(&prefix()).join("py/nvidia/cu13"), only_cuda.join("cu13")).unwrap();
    let env = krate.env(&[("GPUCOMM_PREFIX", krate.path("prefix").to_str().unwrap())]);
    let err = Kernels::new().nccl("kernels/k.cu").build_with(&env, &mut Emitter::new(Vec::new())).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "NCCL device API kernels need the headers of the NCCL install that nccl-sys found; none was passed on \
             (DEP_NCCL_INCLUDE is not set: the crate does not depend on nccl-sys directly) and the search found none.\n\
             NCCL not found (header nccl.h and library libnccl.so.2 or libnccl.so).\nSearched, in order:\n"
        ),
        "{text}"
    );
    assert!(text.contains("NCCL_SYS_NO_PYTHON is set"), "{text}");

    let old = krate.path("nccl-2.27/include");
    std::fs::create_dir_all(&old).unwrap();
    let env = krate.env(&[("DEP_NCCL_INCLUDE", old.to_str().unwrap())]);
    let err = Kernels::new().nccl("kernels/k.cu").build_with(&env, &mut Emitter::new(Vec::new())).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "NCCL device API kernels need {}, which is not there (the directory comes from DEP_NCCL_INCLUDE, \
             from nccl-sys) (NCCL's device API needs NCCL 2.28 or newer)",
            old.join("nccl_device.h").display()
        )
    );
    let lib = krate.path("nvshmem/lib");
    std::fs::create_dir_all(&lib).unwrap();
    let include = Path::new(&prefix()).join("py/nvidia/nvshmem/include");
    let env = krate
        .env(&[("DEP_NVSHMEM_INCLUDE", include.to_str().unwrap()), ("DEP_NVSHMEM_LIB_DIR", lib.to_str().unwrap())]);
    let err = Kernels::new().nvshmem("kernels/k.cu").build_with(&env, &mut Emitter::new(Vec::new())).unwrap_err();
    let text = err.to_string();
    let expected = format!("NVSHMEM kernels need {}, which is not there", lib.join("libnvshmem_device.a").display());
    assert!(text.starts_with(&expected), "{text}");
}

/// A syntax error: the report starts with `file:line: error:`, names the nvcc found and how, the
/// exact command line and nvcc's output; an error inside a header names the header. The build
/// script's report puts each error on a `cargo::warning` line.
#[test]
fn compile_errors_name_file_line_and_nvcc() {
    let krate = Crate::new();
    let bad = krate.write("kernels/bad.cu", "extern \"C\" __global__ void k(float *x) {\n  x[0] = 1.0f\n}\n");
    let header = krate.write("kernels/broken.cuh", "#pragma once\n__device__ int f() { return undefined_name; }\n");
    krate.write(
        "kernels/uses_header.cu",
        "#include \"broken.cuh\"\nextern \"C\" __global__ void g(int *x) { *x = f(); }\n",
    );
    let env = krate.env(&[]);
    let mut out = Emitter::new(Vec::new());
    let err = Kernels::new().cuda("kernels/bad.cu").build_with(&env, &mut out).unwrap_err();
    let CuError::Compile(compile) = &err else { panic!("not a compile error: {err}") };
    let nvcc = Path::new(&prefix()).join("py/nvidia/cu13/bin/nvcc");
    assert_eq!(compile.nvcc, nvcc);
    let text = err.to_string();
    assert!(text.starts_with(&format!("{}:3: error: expected a \";\"\n", bad.display())), "{text}");
    assert!(text.contains(&format!("\nnvcc failed on {} (exit status: 1)\n", bad.display())), "{text}");
    let cu13 = Path::new(&prefix()).join("py/nvidia/cu13");
    let via = format!("the CUDA install of project prefix (GPUCOMM_PREFIX) {}", cu13.display());
    assert_eq!(compile.found_via, via);
    assert!(text.contains(&format!("\nnvcc: {} ({via})\n", nvcc.display())), "{text}");
    assert!(text.contains(&format!("\ncommand: {} -std=c++17 ", nvcc.display())), "{text}");
    assert!(text.contains(&format!(" -cubin {} -o ", bad.display())), "{text}");
    assert!(text.contains("--- nvcc output ---\n"), "{text}");
    assert!(text.contains("1 error detected in the compilation of"), "{text}");

    err.report(&mut out);
    let cargo = String::from_utf8(out.into_inner()).unwrap();
    assert!(
        cargo.contains(&format!("cargo::warning={}:3: error: expected a \";\" (full report below)\n", bad.display())),
        "{cargo}"
    );
    // No image and no stamp were left behind for the failed file.
    assert!(
        !krate.path("out/gpucomm-cu/kernels/BAD.cubin").exists()
            && !krate.path("out/gpucomm-cu/kernels/BAD.stamp").exists()
    );

    let err =
        Kernels::new().cuda("kernels/uses_header.cu").build_with(&env, &mut Emitter::new(Vec::new())).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{}:2: error: identifier \"undefined_name\" is undefined\n", header.display())),
        "{text}"
    );
}

/// Without nvcc anywhere, the error lists every place searched and every variable consulted.
#[test]
fn missing_nvcc_lists_every_place_and_variable() {
    let krate = Crate::new();
    krate.write("kernels/fill.cu", FILL);
    let empty = krate.path("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let env = Env::from_pairs(
        None,
        [
            ("OUT_DIR", krate.path("out").to_str().unwrap()),
            ("CARGO_MANIFEST_DIR", krate.dir.path().to_str().unwrap()),
            ("CUDA_HOME", empty.to_str().unwrap()),
            ("PATH", "/nonexistent/bin"),
        ],
    );
    let mut out = Emitter::new(Vec::new());
    let err = Kernels::new().cuda("kernels/fill.cu").build_with(&env, &mut out).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "nvcc not found. Searched, in order:\n  1. NVCC: not set\n  2. the CUDA toolkit: none found \
             (CUDA_HOME, CUDA_PATH, the project prefix, the Python wheels, /usr/local/cuda)\n  \
             3. PATH (/nonexistent/bin): no nvcc in any of its directories\nVariables consulted: "
        ),
        "{text}"
    );
    let vars = text.lines().find_map(|l| l.strip_prefix("Variables consulted: ")).unwrap();
    for var in ["CUDA_HOME", "NVCC", "PATH", "CUDA_ARCHS", "GPUCOMM_SKIP_CU"] {
        assert!(vars.split(", ").any(|v| v == var), "{var} missing from {vars}");
    }
    assert!(text.contains("To fix: set NVCC to an nvcc binary"), "{text}");
    let cargo = String::from_utf8(out.into_inner()).unwrap();
    assert!(cargo.contains("cargo::rerun-if-env-changed=PATH\n"), "{cargo}");
}

/// `GPUCOMM_SKIP_CU=1` (and `DOCS_RS`): nvcc never runs, the images are empty, `COMPILED` is false,
/// a warning says so, and the generated file still compiles.
#[test]
fn skipping_gives_empty_images() {
    for var in ["GPUCOMM_SKIP_CU", "DOCS_RS"] {
        let krate = Crate::new();
        krate.write("kernels/fill.cu", FILL);
        let env = krate.env(&[(var, "1"), ("NVCC", "/nonexistent/nvcc")]);
        let (count, runner) = counting();
        let mut out = Emitter::new(Vec::new());
        let built = Kernels::new()
            .cuda("kernels/fill.cu")
            .nvshmem("kernels/not_even_there.cu")
            .runner(runner)
            .build_with(&env, &mut out)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(count.load(Ordering::SeqCst), 0);
        assert_eq!(built.skipped.as_deref(), Some(format!("{var} is set").as_str()));
        let rust = std::fs::read_to_string(&built.rust_file).unwrap();
        assert!(rust.contains("pub const COMPILED: bool = false;\n"), "{rust}");
        assert!(rust.contains("pub static FILL: &[u8] = &[];\n"), "{rust}");
        let cargo = String::from_utf8(out.into_inner()).unwrap();
        assert!(
            cargo.contains(&format!("cargo::warning=2 .cu file(s) not compiled ({var} is set): the images in ")),
            "{cargo}"
        );
        assert_eq!(
            run_with_kernels(&krate, &built.rust_file, &["FILL", "NOT_EVEN_THERE"]),
            "[90] false\nFILL 0 0 false\nNOT_EVEN_THERE 0 0 false\n"
        );
    }
}

/// Several architectures give one fatbin, and `ARCHS` lists them. (With another generated file
/// name, whose images have their own folder.)
#[test]
fn several_archs_give_a_fatbin() {
    let krate = Crate::new();
    krate.write("kernels/fill.cu", FILL);
    let env = krate.env(&[("CUDA_ARCHS", "90,80")]);
    let built = Kernels::new()
        .cuda("kernels/fill.cu")
        .rust_file("more_kernels.rs")
        .build_with(&env, &mut Emitter::new(Vec::new()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(built.rust_file, krate.path("out/more_kernels.rs"));
    let path = built.images[0].image.clone().unwrap();
    assert_eq!(path, krate.path("out/gpucomm-cu/more_kernels/FILL.fatbin"));
    // The fatbin magic, 0xBA55ED50 little-endian.
    assert!(std::fs::read(&path).unwrap().starts_with(&[0x50, 0xed, 0x55, 0xba]));
    let rust = std::fs::read_to_string(&built.rust_file).unwrap();
    assert!(rust.contains("pub const ARCHS: &[u32] = &[80, 90];\n"), "{rust}");
    assert!(rust.contains("a fatbin for sm_80, sm_90"), "{rust}");
}

/// No files: no nvcc needed (none is there), and the generated file compiles without warnings.
#[test]
fn no_files_need_no_nvcc() {
    let krate = Crate::new();
    let env = krate.env(&[("NVCC", "/nonexistent/nvcc")]);
    let built = Kernels::new().build_with(&env, &mut Emitter::new(Vec::new())).unwrap_or_else(|e| panic!("{e}"));
    assert!(built.images.is_empty() && built.skipped.is_none());
    assert_eq!(run_with_kernels(&krate, &built.rust_file, &[]), "[90] true\n");
}

/// A `.cu` file that does not exist is named before nvcc is looked for.
#[test]
fn missing_source_is_named() {
    let krate = Crate::new();
    let env = krate.env(&[]);
    let err = Kernels::new().cuda("kernels/nope.cu").build_with(&env, &mut Emitter::new(Vec::new())).unwrap_err();
    assert_eq!(err.to_string(), format!("no such .cu file: {}", krate.path("kernels/nope.cu").display()));
}
