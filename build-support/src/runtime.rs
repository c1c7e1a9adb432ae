//! Loading NCCL or NVSHMEM at run time, and the errors both -sys crates report.
//!
//! [`Binding::load`] walks the run-time search order of [`crate::locate`] and keeps the first
//! library that loads *and* reports a version through its own table. When
//! nothing does, [`LoadError`] lists every attempt and how to fix it. [`MissingFunction`] is the
//! error for a function that the loaded library does not export, naming the version that added it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::env::Env;
use crate::locate::{Locator, RuntimeCandidate, Spec};
use crate::version::Version;

/// A loaded library's function table (`A`, the bindgen-generated struct), with where it came
/// from and its run-time version. Dereferences to the table.
pub struct Library<A> {
    api: A,
    path: PathBuf,
    place: String,
    version: Version,
    name: &'static str,
    since: fn(&str) -> Option<&'static str>,
}

impl<A> std::ops::Deref for Library<A> {
    type Target = A;
    fn deref(&self) -> &A {
        &self.api
    }
}

impl<A> Library<A> {
    /// The file (or soname) that was opened; `(linked)` for a build-time link.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The search step that found it (e.g. "`python3` wheel /…/nvidia/nccl").
    pub fn place(&self) -> &str {
        &self.place
    }

    /// The version the loaded library reports about itself.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Turns one dynamically resolved function (a field of the table) into a `Result` that names
    /// the function and the version that added it. Use through [`crate::function!`].
    #[inline]
    pub fn resolve<'a, F>(
        &self,
        field: &'a Result<F, libloading::Error>,
        function: &'static str,
    ) -> Result<&'a F, MissingFunction> {
        match field {
            Ok(f) => Ok(f),
            Err(_) => Err(self.missing(function)),
        }
    }

    /// The error for `function`, absent from this library: out of line, so that resolving a
    /// present function (every call) stays a load and a branch.
    #[cold]
    #[inline(never)]
    fn missing(&self, function: &'static str) -> MissingFunction {
        MissingFunction {
            library: self.name,
            function,
            since: (self.since)(function),
            loaded: self.version.to_string(),
        }
    }
}

/// Resolves one function of a loaded [`Library`]:
/// `function!(lib, ncclAllReduce)` is `Result<&unsafe extern "C" fn(..), MissingFunction>`.
#[macro_export]
macro_rules! function {
    ($lib:expr, $name:ident) => {{
        let lib = $lib;
        lib.resolve(&lib.$name, stringify!($name))
    }};
}

/// How to make a function table from an open library, and how to ask it its version.
pub struct Binding<A> {
    /// The library's description (search places, names).
    pub spec: &'static Spec,
    /// The directory the build found the library in (baked into the -sys crate; may be empty).
    pub build_lib_dir: &'static str,
    /// The bindgen constructor (`Nccl::from_library`).
    pub from_library: unsafe fn(libloading::Library) -> Result<A, libloading::Error>,
    /// Reads the version through the table; an `Err` rejects the candidate (e.g. a foreign library
    /// that happens to have the same file name).
    pub version: fn(&A) -> Result<Version, String>,
    /// The oldest supported release: an older library is refused at load, naming both versions.
    pub min: Version,
    /// The first library version that exports a function, when known.
    pub since: fn(&str) -> Option<&'static str>,
    /// True with the -sys crate's `link` feature: the library is already part of the process.
    pub linked: bool,
}

/// A library loaded on first use, once per process; later calls return the same table or a clone
/// of the same error. Each -sys crate holds one in a `static`.
pub struct LazyLibrary<A> {
    binding: Binding<A>,
    cell: OnceLock<Result<Library<A>, LoadError>>,
}

impl<A> LazyLibrary<A> {
    /// A library to be loaded by `binding`.
    pub const fn new(binding: Binding<A>) -> Self {
        LazyLibrary { binding, cell: OnceLock::new() }
    }

    /// Loads on first call. Once loaded, a call is a load and a branch (inlined into every
    /// function call of the safe crates); loading and a failed load's error stay out of line.
    ///
    /// # Safety
    ///
    /// As for [`Binding::load`].
    #[inline]
    pub unsafe fn get(&self) -> Result<&Library<A>, LoadError> {
        match self.cell.get() {
            Some(Ok(library)) => Ok(library),
            // SAFETY: forwarded from this function's contract.
            _ => unsafe { self.load_or_error() },
        }
    }

    /// [`LazyLibrary::get`] before the library is loaded, or when it could not be.
    ///
    /// # Safety
    ///
    /// As for [`Binding::load`].
    #[cold]
    #[inline(never)]
    unsafe fn load_or_error(&self) -> Result<&Library<A>, LoadError> {
        // SAFETY: forwarded from this function's contract.
        self.cell.get_or_init(|| unsafe { self.binding.load() }).as_ref().map_err(Clone::clone)
    }
}

impl<A> Binding<A> {
    /// Loads along the run-time search order, or from the process itself when `linked` (the
    /// -sys crate's `link` feature, where the linker already loaded the library).
    ///
    /// # Safety
    ///
    /// Loading a shared library runs its initialisers; `from_library` must be the bindgen
    /// constructor matching the library's headers. NCCL's and NVSHMEM's initialisers are sound to
    /// run from any thread.
    pub unsafe fn load(&self) -> Result<Library<A>, LoadError> {
        let make = |lib: libloading::Library| -> Result<(A, Version), String> {
            // SAFETY: forwarded from this function's contract.
            let api = unsafe { (self.from_library)(lib) }.map_err(|e| e.to_string())?;
            let version = (self.version)(&api)?;
            supported(self.spec, version, self.min)?;
            Ok((api, version))
        };
        let finish = |(api, version): (A, Version), path: PathBuf, place: String| Library {
            api,
            path,
            place,
            version,
            name: self.spec.name,
            since: self.since,
        };
        if self.linked {
            let made = make(libloading::os::unix::Library::this().into()).map_err(|error| LoadError {
                name: self.spec.name,
                attempts: vec![Attempt { place: "linked at build time".into(), path: "(this process)".into(), error }],
                vars: vec![],
                hint: self.spec.install_hint,
                docs: self.spec.docs,
                stopped_by_variable: false,
            })?;
            return Ok(finish(made, "(linked)".into(), "linked at build time".into()));
        }
        let build_dir = (!self.build_lib_dir.is_empty()).then(|| Path::new(self.build_lib_dir));
        // SAFETY: forwarded from this function's contract.
        let (made, path, place) = unsafe { open(self.spec, build_dir, make) }?;
        Ok(finish(made, path, place))
    }
}

/// `Err` (the message) for a library older than `min`, the oldest supported release, or of
/// another major version: its functions would be called through types generated from headers of
/// `min`'s major version (a `libnccl.so` that points at a future `libnccl.so.3`).
fn supported(spec: &Spec, version: Version, min: Version) -> Result<(), String> {
    if version < min {
        return Err(format!("{} {version} is older than {min}, the oldest release these bindings support", spec.name));
    }
    if version.major != min.major {
        return Err(format!(
            "{} {version} is of another major version than these bindings ({}.x): its functions may differ from \
             the headers they were generated from",
            spec.name, min.major
        ));
    }
    Ok(())
}

/// A library that [`preload`] opened and keeps loaded for the rest of the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preloaded {
    /// The file that was opened (or the soname, left to the dynamic loader).
    pub path: PathBuf,
    /// The search step that found it.
    pub place: String,
    /// The version it reports about itself.
    pub version: Version,
}

/// Opens the library of `spec` along the run-time search order that [`Binding::load`] walks
/// (`build_lib_dir` standing for the directory the -sys crate's build used), skipping candidates
/// that `version` rejects or that are older than `min`, and keeps it loaded for the rest of the
/// process without binding anything.
///
/// This is how one crate makes *another* library's `dlopen` of the soname find the copy that the
/// -sys crate of `spec` would load: glibc matches an already loaded object by its `SONAME`
/// (NVSHMEM's host library opens `libnccl.so.2` by that name for its own collectives).
///
/// # Safety
///
/// As for [`Binding::load`]; `version` receives each opened candidate and may call into it.
pub unsafe fn preload(
    spec: &'static Spec,
    build_lib_dir: Option<&Path>,
    min: Version,
    version: unsafe fn(&libloading::Library) -> Result<Version, String>,
) -> Result<Preloaded, LoadError> {
    let make = |lib: libloading::Library| -> Result<(libloading::Library, Version), String> {
        // SAFETY: forwarded from this function's contract.
        let v = unsafe { version(&lib) }?;
        supported(spec, v, min)?;
        Ok((lib, v))
    };
    // SAFETY: forwarded from this function's contract.
    let ((lib, version), path, place) = unsafe { open(spec, build_lib_dir, make) }?;
    // Kept for the life of the process: unloading would let a later dlopen of the soname find
    // another copy, which is what the caller wants to prevent.
    std::mem::forget(lib);
    Ok(Preloaded { path, place, version })
}

/// The conversions into a safe crate's error type from the failures the crate family shares: a
/// library that could not be loaded ([`LoadError`]), a function the loaded library lacks
/// ([`MissingFunction`]), a failed rendezvous (`gpucomm_launch::RendezvousError`), and a refusal
/// of the stream ordering (`gpucomm_ordering::OrderError`), whose CUDA failures become the error's
/// `Cuda` variant so that their text appears once in the chain. The type needs the variants
/// `Load(Box<LoadError>)`, `MissingFunction(Box<MissingFunction>)`,
/// `Rendezvous(Box<RendezvousError>)`, `Cuda(DriverError)` and `Ordering(OrderError)`; the crate
/// that invokes `family_error_conversions!(Error)` depends on `gpucomm-launch` and
/// `gpucomm-ordering`.
#[macro_export]
macro_rules! family_error_conversions {
    ($error:ty) => {
        impl From<$crate::runtime::LoadError> for $error {
            fn from(e: $crate::runtime::LoadError) -> Self {
                Self::Load(Box::new(e))
            }
        }

        impl From<$crate::runtime::MissingFunction> for $error {
            fn from(e: $crate::runtime::MissingFunction) -> Self {
                Self::MissingFunction(Box::new(e))
            }
        }

        impl From<::gpucomm_launch::RendezvousError> for $error {
            fn from(e: ::gpucomm_launch::RendezvousError) -> Self {
                Self::Rendezvous(Box::new(e))
            }
        }

        /// A CUDA failure while ordering is the `Cuda` variant, so that its text appears once in
        /// the chain. Cold and out of line: every `?` on an ordering result in a call path
        /// branches here only on a refusal, and the compiler then lays the refusal out of the way
        /// of the path that succeeds.
        impl From<::gpucomm_ordering::OrderError> for $error {
            #[cold]
            #[inline(never)]
            fn from(e: ::gpucomm_ordering::OrderError) -> Self {
                match e {
                    ::gpucomm_ordering::OrderError::Cuda(e) => Self::Cuda(e),
                    other => Self::Ordering(other),
                }
            }
        }
    };
}

/// Declares what every -sys crate exposes: the bindings generated into `$OUT_DIR/bindings.rs`, the
/// build facts baked in by `build::SysBuild` (`HEADER_VERSION`, `BUILD_LIB_DIR`, `INCLUDE_DIR`,
/// `CUDA_INCLUDE_DIR`), the re-exported loading types, and `pub fn library()` over a `static`
/// [`LazyLibrary`].
///
/// `sys_crate!(Nccl, NCCL, NCCL_SUPPORT, "NCCL", version_fn, since_fn, linked_probe)`: the bindgen
/// table type, the [`crate::locate::Spec`], the [`crate::version::Support`] range (its minimum is
/// enforced at load), the variable prefix the build used, the function that reads the version
/// through the table, the `since` lookup, and an `extern` function of the library that the `link`
/// feature references so the linker keeps the library.
#[macro_export]
macro_rules! sys_crate {
    ($api:ident, $spec:path, $support:path, $var:literal, $version:path, $since:path, $probe:path) => {
        #[allow(missing_docs, dead_code, clippy::all, clippy::undocumented_unsafe_blocks)]
        mod bindings {
            include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
        }

        pub use bindings::*;
        pub use $crate::function;
        pub use $crate::runtime::{Library, LoadError, MissingFunction};
        pub use $crate::version::Version;

        #[doc = concat!("Version of the ", $var, " headers the bindings were generated from, e.g. `\"2.28.9\"`.")]
        pub const HEADER_VERSION: &str = env!(concat!($var, "_SYS_HEADER_VERSION"));

        #[doc = concat!("The directory the build found the ", $var, " library in (empty for docs.rs builds); ")]
        /// tried at run time after the explicit variables.
        pub const BUILD_LIB_DIR: &str = env!(concat!($var, "_SYS_BUILD_LIB_DIR"));

        #[doc = concat!("The ", $var, " include directory the bindings were generated from (empty for docs.rs ")]
        /// builds): compile device code against these headers.
        pub const INCLUDE_DIR: &str = env!(concat!($var, "_SYS_INCLUDE_DIR"));

        /// The CUDA include directory the build used (empty for docs.rs builds).
        pub const CUDA_INCLUDE_DIR: &str = env!(concat!($var, "_SYS_CUDA_INCLUDE_DIR"));

        /// # Safety
        ///
        /// `lib` must be the library whose headers generated the table.
        unsafe fn __from_library(lib: ::libloading::Library) -> ::std::result::Result<$api, ::libloading::Error> {
            // SAFETY: forwarded from this function's contract.
            unsafe { $api::from_library(lib) }
        }

        static __LIBRARY: $crate::runtime::LazyLibrary<$api> =
            $crate::runtime::LazyLibrary::new($crate::runtime::Binding {
                spec: &$spec,
                build_lib_dir: BUILD_LIB_DIR,
                from_library: __from_library,
                version: $version,
                min: $support.min,
                since: $since,
                linked: cfg!(feature = "link"),
            });

        #[doc = concat!("The ", $var, " library, loaded on first use along the run-time search order")]
        /// (or, with the `link` feature, the copy linked into the process).
        ///
        /// Loading happens once per process; later calls return the same table or a clone of the
        /// same error. Resolve functions with [`function!`](crate::function).
        #[inline]
        pub fn library() -> ::std::result::Result<&'static $crate::runtime::Library<$api>, $crate::runtime::LoadError> {
            #[cfg(feature = "link")]
            ::std::hint::black_box($probe as *const ());
            // SAFETY: the NVIDIA libraries' initialisers only set up internal state and may run on
            // any thread; `__from_library` builds the table generated from this library's headers.
            unsafe { __LIBRARY.get() }
        }
    };
}

/// One failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The search step.
    pub place: String,
    /// What was opened.
    pub path: PathBuf,
    /// Why it was not used.
    pub error: String,
}

/// The library could not be loaded. `Display` gives the full report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// Library display name.
    pub name: &'static str,
    /// Every attempt, in order.
    pub attempts: Vec<Attempt>,
    /// Variables consulted.
    pub vars: Vec<String>,
    /// Install advice.
    pub hint: &'static str,
    /// The crate whose documentation lists the variables.
    pub docs: &'static str,
    /// True when an explicit variable stopped the search.
    pub stopped_by_variable: bool,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "could not load the {} library. Tried, in order:", self.name)?;
        for (i, a) in self.attempts.iter().enumerate() {
            writeln!(f, "  {}. {} ({}): {}", i + 1, a.path.display(), a.place, a.error)?;
        }
        if self.stopped_by_variable {
            writeln!(f, "The search stopped at a path named by a variable; fix or unset it.")?;
        }
        writeln!(f, "Variables consulted: {}", self.vars.join(", "))?;
        write!(
            f,
            "To fix: {}, or name the library with the variables above (the `{}` crate documentation lists them).",
            self.hint, self.docs
        )
    }
}

impl std::error::Error for LoadError {}

/// Opens the first candidate that loads and that `make` accepts; returns `make`'s value with the
/// path and search step.
///
/// # Safety
///
/// Loading a shared library runs its initialisers; the caller names (through `spec`) a library
/// whose initialisers are sound to run from any thread at any time.
unsafe fn open<T>(
    spec: &Spec,
    build_lib_dir: Option<&Path>,
    make: impl Fn(libloading::Library) -> Result<T, String>,
) -> Result<(T, PathBuf, String), LoadError> {
    let env = Env::running();
    let locator = Locator::new(&env);
    let mut attempts = Vec::new();
    // SAFETY: forwarded from this function's contract.
    if let Some(found) = unsafe { already_loaded(spec, &make, &mut attempts) } {
        return Ok(found);
    }
    let early = locator.runtime_candidates_early(spec, build_lib_dir);
    // SAFETY: forwarded from this function's contract.
    let mut outcome = unsafe { try_all(&early, &make, &mut attempts) };
    if let Outcome::Exhausted = outcome {
        // The last resort, and only now is Python started: the early candidates all failed.
        let late = locator.runtime_candidates_late(spec);
        // SAFETY: forwarded from this function's contract.
        outcome = unsafe { try_all(&late, &make, &mut attempts) };
    }
    match outcome {
        Outcome::Found(loaded) => Ok(loaded),
        Outcome::Stopped | Outcome::Exhausted => Err(LoadError {
            name: spec.name,
            attempts,
            vars: env.names_read(),
            hint: spec.install_hint,
            docs: spec.docs,
            stopped_by_variable: matches!(outcome, Outcome::Stopped),
        }),
    }
}

/// The copy of `spec`'s library that this process has loaded already (by another library, or by
/// Python: PyTorch's NCCL), when `make` accepts it. Opening another file by its path would put a
/// second copy in the process — glibc matches a path by file, not by soname — and a communicator
/// made by one copy, handed to the other (`BorrowedComm::from_raw_borrowed` of PyTorch's), would
/// be read with another build's layout. A copy that `make` refuses is listed among the attempts,
/// and the search goes on.
///
/// # Safety
///
/// As for [`open`].
unsafe fn already_loaded<T>(
    spec: &Spec,
    make: &impl Fn(libloading::Library) -> Result<T, String>,
    attempts: &mut Vec<Attempt>,
) -> Option<(T, PathBuf, String)> {
    const PLACE: &str = "already loaded in this process";
    for name in spec.libraries {
        let flags = libc::RTLD_LAZY | libc::RTLD_NOLOAD;
        // SAFETY: with RTLD_NOLOAD nothing new is loaded and no initialiser runs: the handle is
        // that of a library the process holds already, or the call fails.
        let Ok(lib) = (unsafe { libloading::os::unix::Library::open(Some(name), flags) }) else { continue };
        match make(lib.into()) {
            Ok(value) => return Some((value, PathBuf::from(name), PLACE.into())),
            Err(error) => attempts.push(Attempt { place: PLACE.into(), path: PathBuf::from(name), error }),
        }
    }
    None
}

enum Outcome<T> {
    Found((T, PathBuf, String)),
    /// A candidate named by a variable failed: the search ends there.
    Stopped,
    /// Every candidate failed.
    Exhausted,
}

/// Tries candidates in order.
///
/// # Safety
///
/// As for [`open`].
unsafe fn try_all<T>(
    candidates: &[RuntimeCandidate],
    make: &impl Fn(libloading::Library) -> Result<T, String>,
    attempts: &mut Vec<Attempt>,
) -> Outcome<T> {
    for c in candidates {
        if let Some(why) = &c.unavailable {
            attempts.push(Attempt { place: c.place.clone(), path: c.path.clone(), error: why.clone() });
            continue;
        }
        // SAFETY: the caller vouches for the library's initialisers (see `open`).
        let result = unsafe { libloading::Library::new(&c.path) }.map_err(|e| e.to_string()).and_then(make);
        match result {
            Ok(value) => return Outcome::Found((value, c.path.clone(), c.place.clone())),
            Err(error) => {
                attempts.push(Attempt { place: c.place.clone(), path: c.path.clone(), error });
                if c.explicit {
                    return Outcome::Stopped;
                }
            }
        }
    }
    Outcome::Exhausted
}

/// A function that the loaded library does not export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingFunction {
    /// Library display name.
    pub library: &'static str,
    /// The C function name.
    pub function: &'static str,
    /// The first library version that has it, when known.
    pub since: Option<&'static str>,
    /// The loaded library's version.
    pub loaded: String,
}

impl fmt::Display for MissingFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the loaded {} {} does not export `{}`", self.library, self.loaded, self.function)?;
        match self.since {
            Some(v) => write!(f, "; it needs {} ≥ {v}", self.library),
            None => write!(f, "; a different {} version is needed", self.library),
        }
    }
}

impl std::error::Error for MissingFunction {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locate::NCCL;

    #[test]
    fn missing_function_names_the_version() {
        let e = MissingFunction {
            library: "NCCL",
            function: "ncclCommShrink",
            since: Some("2.27.3"),
            loaded: "2.19.3".into(),
        };
        assert_eq!(e.to_string(), "the loaded NCCL 2.19.3 does not export `ncclCommShrink`; it needs NCCL ≥ 2.27.3");
    }

    /// A library every Linux process can load, described like NCCL or NVSHMEM.
    static LIBM: Spec = Spec {
        name: "libm",
        var: "GPUCOMM_PRELOAD_TEST",
        home_vars: &[],
        header: "math.h",
        libraries: &["libm.so.6"],
        wheel_dirs: &[],
        system: &[],
        install_hint: "install glibc",
        docs: "build-support",
    };

    unsafe fn fixed_version(_: &libloading::Library) -> Result<Version, String> {
        Ok(Version::new(2, 28, 9))
    }

    #[test]
    fn preload_walks_the_search_order_and_checks_the_minimum() {
        // SAFETY: libm's initialisers are trivial; `fixed_version` does not call into it.
        let got = unsafe { preload(&LIBM, None, Version::new(2, 18, 1), fixed_version) }.unwrap();
        assert_eq!(got.path, PathBuf::from("libm.so.6"));
        // Loaded by the soname, unless another test of this process loaded it first.
        let places = ["dynamic loader search path", "already loaded in this process"];
        assert!(places.iter().any(|p| got.place.starts_with(p)), "{}", got.place);
        assert_eq!(got.version, Version::new(2, 28, 9));
        // SAFETY: as above.
        let err = unsafe { preload(&LIBM, None, Version::new(3, 0, 0), fixed_version) }.unwrap_err();
        assert_eq!(err.attempts[0].place, "already loaded in this process");
        assert_eq!(err.attempts[0].error, "libm 2.28.9 is older than 3.0.0, the oldest release these bindings support");
        // A newer major version is refused too (before, anything from the minimum up was taken).
        // SAFETY: as above.
        let err = unsafe { preload(&LIBM, None, Version::new(1, 0, 0), fixed_version) }.unwrap_err();
        assert_eq!(
            err.attempts[0].error,
            "libm 2.28.9 is of another major version than these bindings (1.x): its functions may differ from the \
             headers they were generated from"
        );
    }

    /// Session 29 audit: a library the process had loaded already (PyTorch's NCCL, say) did not
    /// stop the search, which opened the file of an earlier step by its path: a second copy in
    /// the process, beside the first. Here the "build directory" holds another file of libm's
    /// soname; the copy already loaded is taken, and the other file is never mapped.
    #[test]
    fn a_copy_already_loaded_is_taken_before_any_file() {
        // What another library (PyTorch's NCCL, here libm) does first: load it by its soname.
        // SAFETY: libm's initialisers are trivial.
        let first = unsafe { libloading::Library::new("libm.so.6") }.unwrap();
        let maps = || std::fs::read_to_string("/proc/self/maps").unwrap();
        let real = maps()
            .lines()
            .find_map(|l| l.split_whitespace().nth(5).filter(|p| p.ends_with("/libm.so.6")).map(String::from))
            .expect("libm is mapped once loaded");
        let dir = std::env::temp_dir().join(format!("gpucomm-already-loaded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("libm.so.6");
        std::fs::copy(&real, &copy).unwrap();
        // SAFETY: libm's initialisers are trivial; `fixed_version` does not call into it.
        let got = unsafe { preload(&LIBM, Some(&dir), Version::new(2, 18, 1), fixed_version) }.unwrap();
        assert_eq!((got.path, got.place.as_str()), (PathBuf::from("libm.so.6"), "already loaded in this process"));
        assert!(!maps().contains(copy.to_str().unwrap()), "a second libm was mapped from {}", copy.display());
        std::fs::remove_dir_all(&dir).unwrap();
        drop(first);
    }

    #[test]
    fn load_error_lists_attempts() {
        let e = LoadError {
            name: NCCL.name,
            attempts: vec![Attempt { place: "NCCL_SYS_LIBRARY=/x".into(), path: "/x".into(), error: "no file".into() }],
            vars: vec!["NCCL_SYS_LIBRARY".into()],
            hint: NCCL.install_hint,
            docs: NCCL.docs,
            stopped_by_variable: true,
        };
        let text = e.to_string();
        assert!(text.starts_with(
            "could not load the NCCL library. Tried, in order:\n  1. /x (NCCL_SYS_LIBRARY=/x): no file\n"
        ));
        assert!(text.contains("stopped at a path named by a variable"));
        assert!(text.ends_with("(the `nccl-sys` crate documentation lists them)."), "{text}");
        assert!(!text.contains("dev.sh"), "{text}");
    }
}
