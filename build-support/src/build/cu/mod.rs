//! Compiling `.cu` files into module images embedded in the crate, from `build.rs`.
//!
//! Write kernels in `.cu` files next to the Rust code; [`Kernels`] compiles each into a cubin (one
//! architecture) or fatbin (several), writes them to `OUT_DIR`, and generates `$OUT_DIR/kernels.rs`
//! with one `pub static NAME: &[u8]` per file, ready for `cuModuleLoadData`. Three flavours
//! ([`Flavour`]):
//!
//! | method | flavour | compiled with |
//! |---|---|---|
//! | [`Kernels::cuda`] | plain CUDA C++ | `nvcc -cubin` |
//! | [`Kernels::nccl`] | NCCL device API (`<nccl_device.h>`: LSA barriers, `ncclGetLsaPointer`, teams) | `nvcc -cubin -I<nccl include>`, header-only |
//! | [`Kernels::nvshmem`] | NVSHMEM device code (`<nvshmem.h>`, `nvshmem_int_p`, …) | `nvcc -rdc=true -c`, then `nvcc -dlink -cubin … libnvshmem_device.a` into one self-contained image |
//!
//! Every compilation uses `-std=c++17` with CCCL on the include path; the NCCL and NVSHMEM headers
//! and `libnvshmem_device.a` come from the install the `-sys` crate found (see
//! [Where NCCL and NVSHMEM come from](#where-nccl-and-nvshmem-come-from)). No CUDA install is
//! needed: the pinned pip wheels (`nvidia/cu13/bin/nvcc`) are enough, and nothing looks at the
//! build machine's GPU.
//!
//! # A complete example
//!
//! `Cargo.toml` of a crate with kernels in all three flavours:
//!
//! ```toml
//! [dependencies]
//! # Direct dependencies, so that their build scripts pass the install they found to ours
//! # (DEP_NCCL_INCLUDE, DEP_NVSHMEM_INCLUDE, DEP_NVSHMEM_LIB_DIR).
//! nccl-sys = "=0.1.0"
//! nvshmem-sys = "=0.1.0"
//!
//! [build-dependencies]
//! build-support = { version = "=0.1.0", features = ["build"] }
//! ```
//!
//! `build.rs`:
//!
//! ```no_run
//! use build_support::build::cu::Kernels;
//!
//! fn main() -> std::process::ExitCode {
//!     Kernels::new()
//!         .cuda("kernels/scale.cu") //                  → kernels::SCALE
//!         .nccl("kernels/lsa_all_reduce.cu") //         → kernels::LSA_ALL_REDUCE
//!         .nvshmem("kernels/ring.cu") //                → kernels::RING
//!         .include("kernels/include") //                 shared headers (`#include "common.cuh"`)
//!         .run() // compiles, writes $OUT_DIR/kernels.rs, reports errors, tells Cargo when to rerun
//! }
//! ```
//!
//! `src/lib.rs`:
//!
//! ```ignore
//! /// The crate's kernels, compiled by `build.rs` (module images for `cuModuleLoadData`).
//! pub mod kernels {
//!     include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
//! }
//!
//! // kernels::SCALE: &'static [u8]  — the image; kernels::ARCHS: &[u32] (e.g. [90]);
//! // kernels::COMPILED: bool        — false when compilation was skipped (images empty).
//! ```
//!
//! A build script that does more than compile kernels calls [`Kernels::build`] and, on error,
//! [`CuError::report`]:
//!
//! ```no_run
//! # use build_support::build::cu::Kernels;
//! # use build_support::emit::Emitter;
//! # fn main() -> std::process::ExitCode {
//! if let Err(e) = Kernels::new().cuda("kernels/scale.cu").build() {
//!     e.report(&mut Emitter::stdout());
//!     return std::process::ExitCode::FAILURE;
//! }
//! // … the rest of the build script …
//! # std::process::ExitCode::SUCCESS
//! # }
//! ```
//!
//! Kernels called from Rust are declared `extern "C" __global__` so that their names are not
//! mangled. Each `.cu` file is one image; put kernels that share helpers in one file, or the
//! helpers in headers. NVSHMEM images carry their own copy of NVSHMEM's device state: load each,
//! then call `nvshmemx_cumodule_init` on it before launching.
//!
//! # Names
//!
//! A file's constant is its stem in upper case, other characters turned into `_`
//! (`lsa-all-reduce.cu` → `LSA_ALL_REDUCE`). [`Kernels::image`] names one explicitly. Two images
//! with one name are an error.
//!
//! # Configuration
//!
//! | Variable | Meaning |
//! |---|---|
//! | `CUDA_ARCHS` | target compute capabilities, comma-separated: `90` (default, sm_90), `80,90` (a fatbin), `90a` |
//! | `NVCC` | the nvcc binary (a path, or a name looked up on `PATH`) |
//! | `CUDA_HOME`, `CUDA_PATH`, `GPUCOMM_PREFIX`, … | the CUDA search of [`crate::locate`]; nvcc is `<root>/bin/nvcc` |
//! | `NVCC_CCBIN` | nvcc's host compiler (`-ccbin`) |
//! | `NVCC_PREPEND_FLAGS`, `NVCC_APPEND_FLAGS` | read by nvcc itself; tracked, and shown in command lines |
//! | `GPUCOMM_SKIP_CU=1` | do not compile: every image is empty and `COMPILED` is `false` (also when `DOCS_RS` is set) |
//!
//! nvcc is `NVCC`, else the `bin/nvcc` of the CUDA install the search finds (for the wheels
//! `nvidia/cu13/bin/nvcc`), else `nvcc` on `PATH`. Every variable read is declared to Cargo with
//! `rerun-if-env-changed`, so changing one rebuilds.
//!
//! # Where NCCL and NVSHMEM come from
//!
//! NCCL-flavour files get `-I$DEP_NCCL_INCLUDE`; NVSHMEM-flavour files `-I$DEP_NVSHMEM_INCLUDE`
//! and `$DEP_NVSHMEM_LIB_DIR/libnvshmem_device.a`. nccl-sys and nvshmem-sys publish these through
//! their `links` metadata, and **Cargo passes `DEP_*` only to the build scripts of crates that
//! depend on the -sys crate directly** (a dependency on the safe `nccl-rs`/`nvshmem` crates is not
//! enough). Without them, the same search the -sys crates run (same variables, same order: see
//! [`crate::locate`]) runs here and finds the same install when the environment is the same. The
//! device library, headers and host library must come from one NVSHMEM release, which either way
//! they do.
//!
//! # Errors
//!
//! A failed compilation is a [`CompileError`] whose report starts with `path:line: error: …` (each
//! error nvcc gave), then names the nvcc that ran and how it was found, the exact command line and
//! nvcc's full output. [`Kernels::run`] and [`CuError::report`] print each error as a
//! `cargo::warning` and the full report on stderr, and the build fails. A missing nvcc lists every
//! place searched and every variable consulted.
//!
//! # Rebuilds
//!
//! Cargo reruns the build script when a `.cu` file, any header it includes (read from nvcc's
//! dependency output, NCCL's and NVSHMEM's included), `libnvshmem_device.a`, nvcc itself or one of
//! the variables changes. Within a run, an image whose command line and inputs are unchanged is not
//! rebuilt (a stamp next to it records them), and `kernels.rs` is rewritten only when its text
//! changes. Images are compiled in parallel, up to Cargo's `NUM_JOBS`.
//!
//! # docs.rs and builds without kernels
//!
//! With `DOCS_RS` set, or `GPUCOMM_SKIP_CU=1`, nothing is compiled: `kernels.rs` is generated with
//! empty images and `COMPILED = false`, and a warning says so. CI machines without a GPU compile
//! the real images (the pinned nvcc wheels need no GPU), which proves the kernels build.

mod embed;
mod installs;
mod stamp;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

pub use crate::build::error::{CompileError, CuError};
pub use crate::build::flavour::Flavour;

use crate::build::nvcc::{Arch, Job, Nvcc, Runner};
use crate::emit::Emitter;
use crate::env::Env;
use crate::locate::{Locator, CUDA};
use installs::Installs;

/// The file generated in `OUT_DIR` unless [`Kernels::rust_file`] says otherwise.
pub const DEFAULT_RUST_FILE: &str = "kernels.rs";

/// The subdirectory of `OUT_DIR` that holds images, objects, dependency files and stamps, in one
/// folder per generated Rust file (so that two builders in one build script never share images).
const IMAGE_DIR: &str = "gpucomm-cu";

/// Names the generated file uses itself.
const RESERVED: [&str; 2] = ["ARCHS", "COMPILED"];

/// `.cu` files to compile and embed: a builder for `build.rs` (see the [module docs](self)).
#[must_use = "nothing is compiled until `run` or `build` is called"]
pub struct Kernels {
    images: Vec<Request>,
    includes: Vec<PathBuf>,
    flags: Vec<OsString>,
    rust_file: String,
    runner: Option<Arc<dyn Runner>>,
}

struct Request {
    name: Option<String>,
    flavour: Flavour,
    source: PathBuf,
}

impl Default for Kernels {
    fn default() -> Self {
        Kernels::new()
    }
}

/// What [`Kernels::build`] produced.
#[derive(Debug, Clone)]
pub struct Built {
    /// The generated Rust file.
    pub rust_file: PathBuf,
    /// The target architectures.
    pub archs: Vec<Arch>,
    /// Why nothing was compiled (`DOCS_RS`, `GPUCOMM_SKIP_CU`), if nothing was.
    pub skipped: Option<String>,
    /// One entry per `.cu` file, in the order given.
    pub images: Vec<BuiltImage>,
}

/// One compiled (or up-to-date) image.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// The constant's name in the generated file.
    pub name: String,
    /// The flavour.
    pub flavour: Flavour,
    /// The `.cu` file (absolute).
    pub source: PathBuf,
    /// The image file (`None` when compilation was skipped).
    pub image: Option<PathBuf>,
    /// Every file the image depends on (nvcc, the `.cu` file, each header, device libraries).
    pub inputs: Vec<PathBuf>,
    /// True when nvcc ran for it in this build; false when it was up to date (or skipped).
    pub rebuilt: bool,
}

/// A requested image, named, with an absolute source path.
struct Image {
    name: String,
    flavour: Flavour,
    source: PathBuf,
}

/// One image's compilation.
struct Planned {
    image: Image,
    path: PathBuf,
    stamp: PathBuf,
    nvcc: Nvcc,
    job: Job,
}

/// One image's result.
struct Outcome {
    inputs: Vec<PathBuf>,
    warnings: Vec<String>,
    rebuilt: bool,
}

impl Kernels {
    /// No files yet; the generated file will be `$OUT_DIR/kernels.rs`.
    pub fn new() -> Self {
        Kernels { images: vec![], includes: vec![], flags: vec![], rust_file: DEFAULT_RUST_FILE.into(), runner: None }
    }

    /// Adds a plain CUDA file. Relative paths are relative to the crate (`CARGO_MANIFEST_DIR`).
    pub fn cuda(self, source: impl AsRef<Path>) -> Self {
        self.add(None, Flavour::Cuda, source.as_ref())
    }

    /// Adds a file that uses NCCL's device API (`#include <nccl_device.h>`).
    pub fn nccl(self, source: impl AsRef<Path>) -> Self {
        self.add(None, Flavour::Nccl, source.as_ref())
    }

    /// Adds a file of NVSHMEM device code (`#include <nvshmem.h>`), device-linked with
    /// `libnvshmem_device.a`.
    pub fn nvshmem(self, source: impl AsRef<Path>) -> Self {
        self.add(None, Flavour::Nvshmem, source.as_ref())
    }

    /// Adds a file with an explicit constant name.
    pub fn image(self, name: &str, flavour: Flavour, source: impl AsRef<Path>) -> Self {
        self.add(Some(name.to_string()), flavour, source.as_ref())
    }

    fn add(mut self, name: Option<String>, flavour: Flavour, source: &Path) -> Self {
        self.images.push(Request { name, flavour, source: source.to_path_buf() });
        self
    }

    /// Adds an include directory for every file (relative to the crate when relative).
    pub fn include(mut self, dir: impl AsRef<Path>) -> Self {
        self.includes.push(dir.as_ref().to_path_buf());
        self
    }

    /// Adds an nvcc flag for every file's compilation (`-lineinfo`, `-DTILE=128`, …).
    pub fn flag(mut self, flag: impl Into<OsString>) -> Self {
        self.flags.push(flag.into());
        self
    }

    /// Names the generated file in `OUT_DIR` (default [`DEFAULT_RUST_FILE`]).
    pub fn rust_file(mut self, file_name: &str) -> Self {
        self.rust_file = file_name.to_string();
        self
    }

    /// Runs nvcc through `runner` instead of starting the process directly (tests).
    pub fn runner(mut self, runner: impl Runner + 'static) -> Self {
        self.runner = Some(Arc::new(runner));
        self
    }

    /// Builds from a build script and reports: `fn main() -> ExitCode { Kernels::new()….run() }`.
    /// On error, each nvcc error becomes a `cargo::warning` and the full report goes to stderr.
    pub fn run(self) -> ExitCode {
        let mut out = Emitter::stdout();
        match self.build_with(&Env::process(), &mut out) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                e.report(&mut out);
                ExitCode::FAILURE
            }
        }
    }

    /// Builds with the process environment, writing Cargo instructions to stdout.
    pub fn build(self) -> Result<Built, CuError> {
        self.build_with(&Env::process(), &mut Emitter::stdout())
    }

    /// Builds with the variables of `env` (which needs `OUT_DIR`, and `CARGO_MANIFEST_DIR` for
    /// relative paths), writing Cargo instructions to `out`: `rerun-if-changed` for every input,
    /// `rerun-if-env-changed` for every variable read (also on error), nvcc's warnings.
    pub fn build_with<W: Write>(self, env: &Env, out: &mut Emitter<W>) -> Result<Built, CuError> {
        let result = self.build_inner(env, out);
        out.rerun_if_env_changed(env);
        result
    }

    fn build_inner<W: Write>(&self, env: &Env, out: &mut Emitter<W>) -> Result<Built, CuError> {
        let out_dir = PathBuf::from(env.cargo_var("OUT_DIR").ok_or(CuError::NoOutDir)?);
        let crate_dir = env.cargo_var("CARGO_MANIFEST_DIR").map(PathBuf::from);
        let images = self.named_images(crate_dir.as_deref())?;
        for image in &images {
            out.rerun_if_changed(&image.source);
        }
        let rust_file = out_dir.join(&self.rust_file);
        let embed = |archs: &[Arch], built: &[BuiltImage], skipped: Option<&str>| {
            embed::write_if_changed(&rust_file, &embed::rust_source(archs, built, crate_dir.as_deref(), skipped)?)
        };
        if let Some(reason) = skip_reason(env) {
            let archs = crate::build::nvcc::archs_from(env)?;
            out.warning(&format!(
                "{} .cu file(s) not compiled ({reason}): the images in {} are empty",
                images.len(),
                rust_file.display()
            ));
            let built: Vec<BuiltImage> = images.into_iter().map(|i| i.built(None, vec![], false)).collect();
            embed(&archs, &built, Some(&reason))?;
            return Ok(Built { rust_file, archs, skipped: Some(reason), images: built });
        }
        if let Some(missing) = images.iter().find(|i| !i.source.is_file()) {
            return Err(CuError::SourceMissing { path: missing.source.clone() });
        }
        if images.is_empty() {
            // Nothing to compile (kernels behind features, say): no nvcc needed.
            let archs = crate::build::nvcc::archs_from(env)?;
            embed(&archs, &[], None)?;
            return Ok(Built { rust_file, archs, skipped: None, images: vec![] });
        }

        let nvcc = self.nvcc(env, crate_dir.as_deref())?;
        let flavours: Vec<Flavour> = images.iter().map(|i| i.flavour).collect();
        let installs = Installs::resolve(env, &Locator::new(env), &flavours)?;
        let dir = out_dir.join(IMAGE_DIR).join(Path::new(&self.rust_file).file_stem().unwrap_or_default());
        std::fs::create_dir_all(&dir).map_err(|error| CuError::Io {
            action: "cannot create",
            path: dir.clone(),
            error,
        })?;
        let plans: Vec<Planned> = images.into_iter().map(|i| plan(&nvcc, &installs, &dir, i)).collect();
        let outcomes = in_parallel(&plans, jobs(env), build_one);

        let mut built = Vec::with_capacity(plans.len());
        for (plan, outcome) in plans.into_iter().zip(outcomes) {
            // The first error in the order given; a failed build script always reruns, so the
            // (long) dependency list would only bury the report in Cargo's output.
            let outcome = outcome?;
            for w in &outcome.warnings {
                out.warning(w);
            }
            built.push(plan.image.built(Some(plan.path), outcome.inputs, outcome.rebuilt));
        }
        let mut declared: BTreeSet<&Path> = built.iter().map(|i| i.source.as_path()).collect();
        for input in built.iter().flat_map(|i| &i.inputs) {
            if declared.insert(input) {
                out.rerun_if_changed(input);
            }
        }
        let archs = nvcc.archs().to_vec();
        embed(&archs, &built, None)?;
        Ok(Built { rust_file, archs, skipped: None, images: built })
    }

    /// nvcc with the builder's include directories, flags and runner.
    fn nvcc(&self, env: &Env, crate_dir: Option<&Path>) -> Result<Nvcc, CuError> {
        let cuda = Locator::new(env).find(&CUDA).ok();
        let mut nvcc = Nvcc::locate(env, cuda.as_ref())?;
        if let Some(runner) = &self.runner {
            nvcc.set_runner(runner.clone());
        }
        for dir in &self.includes {
            nvcc.include(&absolute(crate_dir, dir));
        }
        for flag in &self.flags {
            nvcc.flag(flag.clone());
        }
        Ok(nvcc)
    }

    /// The requests with their constant names and absolute sources; names checked.
    fn named_images(&self, crate_dir: Option<&Path>) -> Result<Vec<Image>, CuError> {
        let mut images: Vec<Image> = Vec::with_capacity(self.images.len());
        for r in &self.images {
            let source = absolute(crate_dir, &r.source);
            let name = r.name.clone().unwrap_or_else(|| constant_name(&source));
            if !is_identifier(&name) || RESERVED.contains(&name.as_str()) {
                return Err(CuError::InvalidName { name, source_file: source });
            }
            if let Some(first) = images.iter().find(|i| i.name == name) {
                return Err(CuError::DuplicateName { name, first: first.source.clone(), second: source });
            }
            images.push(Image { name, flavour: r.flavour, source });
        }
        Ok(images)
    }
}

impl Image {
    fn built(self, image: Option<PathBuf>, inputs: Vec<PathBuf>, rebuilt: bool) -> BuiltImage {
        BuiltImage { name: self.name, flavour: self.flavour, source: self.source, image, inputs, rebuilt }
    }
}

/// Why compilation is skipped, if it is: docs.rs, or `GPUCOMM_SKIP_CU`.
fn skip_reason(env: &Env) -> Option<String> {
    if env.get("DOCS_RS").is_some() {
        Some("DOCS_RS is set".to_string())
    } else if env.flag("GPUCOMM_SKIP_CU") {
        Some("GPUCOMM_SKIP_CU is set".to_string())
    } else {
        None
    }
}

/// The compilation of one image.
fn plan(nvcc: &Nvcc, installs: &Installs, dir: &Path, image: Image) -> Planned {
    let path = dir.join(format!("{}.{}", image.name, nvcc.image_extension()));
    let stamp = dir.join(format!("{}.stamp", image.name));
    let inputs = installs.inputs(image.flavour);
    let mut nvcc = nvcc.clone();
    if let Some(include) = inputs.include {
        nvcc.include(include);
    }
    let job = match inputs.device_lib {
        Some(lib) => nvcc.device_linked_job(&image.source, &[lib], &dir.join(format!("{}.o", image.name)), &path),
        None => nvcc.module_job(&image.source, &path),
    };
    Planned { image, path, stamp, nvcc, job }
}

/// Compiles one image unless it is up to date.
fn build_one(plan: &Planned) -> Result<Outcome, CuError> {
    let commands = plan.nvcc.describe(&plan.job);
    if let Some(inputs) = stamp::up_to_date(&plan.stamp, &plan.path, &commands) {
        return Ok(Outcome { inputs, warnings: vec![], rebuilt: false });
    }
    stamp::remove(&plan.stamp)?;
    let compiled = plan.nvcc.run(&plan.job)?;
    stamp::write(&plan.stamp, &commands, &compiled.inputs)?;
    let warnings = compiled.warnings.iter().map(ToString::to_string).collect();
    Ok(Outcome { inputs: compiled.inputs, warnings, rebuilt: true })
}

/// Runs `f` over `items` on up to `jobs` threads; results in the order of `items`.
fn in_parallel<T: Sync, R: Send>(items: &[T], jobs: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs.clamp(1, items.len().max(1)))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break mine };
                        mine.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Cargo's `NUM_JOBS`, else the machine's parallelism.
fn jobs(env: &Env) -> usize {
    env.cargo_var("NUM_JOBS")
        .and_then(|j| j.to_str()?.parse().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
}

fn absolute(crate_dir: Option<&Path>, path: &Path) -> PathBuf {
    match crate_dir {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path.to_path_buf(),
    }
}

/// `kernels/lsa-all-reduce.cu` → `LSA_ALL_REDUCE`; a leading digit gets a `_` in front.
fn constant_name(source: &Path) -> String {
    let stem = source.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name: String =
        stem.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{name}")
    } else {
        name
    }
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name != "_"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_file_stems() {
        assert_eq!(constant_name(Path::new("k/lsa-all_reduce.v2.cu")), "LSA_ALL_REDUCE_V2");
        assert_eq!(constant_name(Path::new("2shot.cu")), "_2SHOT");
        assert!(is_identifier("ONE_SHOT") && is_identifier("_2") && !is_identifier("_") && !is_identifier("a-b"));
    }

    #[test]
    fn bad_and_duplicate_names() {
        let env = Env::from_pairs(None, [("OUT_DIR", "/nonexistent/out"), ("CARGO_MANIFEST_DIR", "/c")]);
        let mut out = Emitter::new(Vec::new());
        let err = Kernels::new().cuda("a/scale.cu").nccl("b/scale.cu").build_with(&env, &mut out).unwrap_err();
        assert_eq!(
            err.to_string(),
            "two kernel images are named `SCALE`: /c/a/scale.cu and /c/b/scale.cu \
             (give one another name with `Kernels::image`)"
        );
        let err = Kernels::new().image("ARCHS", Flavour::Cuda, "x.cu").build_with(&env, &mut out).unwrap_err();
        assert!(matches!(err, CuError::InvalidName { ref name, .. } if name == "ARCHS"), "{err}");
    }

    #[test]
    fn in_parallel_keeps_order() {
        let items: Vec<u32> = (0..50).collect();
        assert_eq!(in_parallel(&items, 4, |i| i * 2), items.iter().map(|i| i * 2).collect::<Vec<_>>());
        assert!(in_parallel(&[] as &[u32], 4, |i| *i).is_empty());
    }
}
