//! Communicator options (`ncclConfig_t`), with every field the compiled header has.
//!
//! NCCL copies `min(config.size, its own sizeof)` bytes and ignores fields newer than the library
//! (`parseCommConfig` in NCCL's `src/init.cc`), so a field set for a library too old for it would
//! be dropped without a word. [`Config`] therefore checks every field that was set against the
//! version of the loaded library, and refuses the ones it is too old for ([`Error::Unsupported`]).
//! Fields the compiled header lacks do not exist here at all (cfg-gated on the header version).

use std::ffi::{c_int, CString};
use std::mem::{align_of, offset_of, size_of};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nccl_sys::{ncclConfig_t, Version};

use crate::error::{Error, Result};
use crate::ffi::check_version;

/// What a new communicator takes from the config it was created with, besides NCCL's own fields.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(super) nonblocking: bool,
    pub(super) timeout: Option<Duration>,
    pub(super) strings: Option<Arc<ConfigStrings>>,
    pub(super) sharing: Sharing,
    /// What turned off NCCL's support for eager calls while a graph launch of the communicator is
    /// outstanding (see [`Error::GraphMixingOff`]); `None` at NCCL's default.
    pub(super) graphs_unmixed: Option<Unmixed>,
}

/// What turned off NCCL's graph mixing for a communicator (see [`Error::GraphMixingOff`]): one
/// byte in the communicator, whose size frameworks' enums feel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unmixed {
    /// `NCCL_GRAPH_MIXING_SUPPORT=0`.
    Env,
    /// `graphUsageMode` 0 or 1.
    #[cfg(nccl_2_29)]
    UsageMode,
    /// `graphStreamOrdering` 0.
    #[cfg(nccl_2_30_5)]
    StreamOrdering,
}

impl Unmixed {
    /// The variable or config field, as [`Error::GraphMixingOff`] names it.
    pub(crate) fn setting(self) -> &'static str {
        match self {
            Unmixed::Env => "NCCL_GRAPH_MIXING_SUPPORT=0",
            #[cfg(nccl_2_29)]
            Unmixed::UsageMode => "Config::graph_usage_mode 0 or 1",
            #[cfg(nccl_2_30_5)]
            Unmixed::StreamOrdering => "Config::graph_stream_ordering(0)",
        }
    }
}

impl Settings {
    /// Leaks the config's strings: for a child that NCCL may still be making after the call that
    /// asked for it gave up waiting (the child's job reads `commName`, and the child keeps the
    /// pointer). A few bytes per such failure.
    pub(super) fn leak_strings(self) {
        if let Some(strings) = self.strings {
            std::mem::forget(strings);
        }
    }

    /// For a communicator made elsewhere, whose config this crate cannot see: of the mode the
    /// caller states, no timeout, and counted as sharing its resources with the communicators
    /// made from it.
    pub(super) fn unknown(nonblocking: bool) -> Self {
        Settings {
            nonblocking,
            timeout: None,
            strings: None,
            sharing: Sharing { split: true, shrink: true },
            graphs_unmixed: env_unmixes_graphs(),
        }
    }
}

/// Whether the communicators split (`split`) or shrunk (`shrink`) from a communicator share its
/// resources, as its config set NCCL's `splitShare` and `shrinkShare` (inherited by a child made
/// without a config). NCCL forbids calls on communicators that share resources from two threads
/// at once, and an abort of one stops the others' work (they share its abort flag).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sharing {
    split: bool,
    shrink: bool,
}

impl Sharing {
    /// Whether a split made now shares resources: `NCCL_COMM_SPLIT_SHARE_RESOURCES` when set (NCCL
    /// lets it override the config; by now NCCL has copied its configuration files into the
    /// environment), else the config.
    pub(super) fn split_now(self) -> bool {
        env_may_share(std::env::var("NCCL_COMM_SPLIT_SHARE_RESOURCES").ok().as_deref()).unwrap_or(self.split)
    }

    /// As [`Sharing::split_now`], for a shrink (`NCCL_COMM_SHRINK_SHARE_RESOURCES`).
    pub(super) fn shrink_now(self) -> bool {
        env_may_share(std::env::var("NCCL_COMM_SHRINK_SHARE_RESOURCES").ok().as_deref()).unwrap_or(self.shrink)
    }
}

/// `NCCL_CONFIG_UNDEF_INT`: "not set, use NCCL's default".
pub(crate) const UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_API_MAGIC`, which NCCL checks to know the struct was initialised.
pub(crate) const MAGIC: u32 = 0xcafe_beef;

/// Options for a new communicator: NCCL's `ncclConfig_t` fields, plus this crate's
/// [timeout](Config::timeout).
///
/// Start from [`Config::new`] (every field "undefined", as `NCCL_CONFIG_INITIALIZER` leaves it:
/// NCCL picks its default, which environment variables such as `NCCL_CGA_CLUSTER_SIZE` may
/// change) and set what you need. Only the fields the compiled `nccl.h` has exist; setting one that
/// the *loaded* library is too old to read makes creation fail with
/// [`Error::Unsupported`] (NCCL would ignore it silently). NCCL itself validates the
/// values (an `Err` with `ncclInvalidArgument` from the creating call).
///
/// ```no_run
/// use std::time::Duration;
/// # fn demo(stream: std::sync::Arc<cudarc::driver::CudaStream>, id: &nccl::UniqueId) -> nccl::Result<()> {
/// let config = nccl::Config::new().blocking(false).max_ctas(16).timeout(Duration::from_secs(30));
/// let comm = nccl::Comm::init_rank_config(stream, id, 0, 1, &config)?;
/// # Ok(()) }
/// ```
///
/// On machines whose GPUs others share, keep `NCCL_NVLS_ENABLE=0` set: the NVLS fields
/// ([`nvls_ctas`](Config::nvls_ctas), `nvlsHostMode`) only size or steer NVLink SHARP, which that
/// variable turns off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[doc(alias = "ncclConfig_t")]
#[doc(alias = "NCCL_CONFIG_INITIALIZER")]
pub struct Config {
    ints: Ints,
    net_name: Option<String>,
    #[cfg(nccl_2_27)]
    comm_name: Option<String>,
    timeout: Option<Duration>,
}

/// The strings a config hands to NCCL. NCCL copies `netName` but keeps a pointer to `commName`
/// (and copies that pointer into children split with an inherited config), so the communicator
/// holds these for as long as it lives.
#[derive(Debug)]
pub(crate) struct ConfigStrings {
    net_name: Option<CString>,
    #[cfg(nccl_2_27)]
    comm_name: Option<CString>,
}

/// A `ncclConfig_t` ready for a creating call, with the strings its pointers point into.
#[derive(Debug)]
pub(crate) struct RawConfig {
    raw: ncclConfig_t,
    strings: Arc<ConfigStrings>,
}

impl RawConfig {
    /// The pointer for `ncclCommInitRankConfig` and friends (NCCL reads the struct during the
    /// call; the strings live in `strings`).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut ncclConfig_t {
        &mut self.raw
    }

    /// The strings, for the communicator to keep.
    pub(crate) fn strings(&self) -> Arc<ConfigStrings> {
        self.strings.clone()
    }
}

/// One builder method and one `int` field per entry: the C field, the first release whose library
/// reads it, the method, and how its argument becomes the C value.
macro_rules! int_fields {
    ($(
        $(#[doc = $doc:literal])+
        $(#[cfg($cfg:meta)])?
        $c:ident since ($a:literal, $b:literal, $p:literal): fn $method:ident($arg:ident: $ty:ty) => $value:expr;
    )+) => {
        /// The `int` fields that were set, as C values (checked to fit when the config is used).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[allow(non_snake_case)]
        struct Ints {
            $( $(#[cfg($cfg)])? $c: Option<i64>, )+
        }

        impl Config {
            $(
                $(#[doc = $doc])+
                #[doc = ""]
                #[doc = concat!("C field `", stringify!($c), "`; read by NCCL ≥ ", $a, ".", $b, ".", $p, ".")]
                $(#[cfg($cfg)])?
                $(#[cfg_attr(docsrs, doc(cfg($cfg)))])?
                pub fn $method(mut self, $arg: $ty) -> Self {
                    self.ints.$c = Some($value);
                    self
                }
            )+
        }

        impl Ints {
            /// Writes every set field into `raw`, refusing those `loaded` is too old for.
            fn apply(&self, raw: &mut ncclConfig_t, loaded: Version) -> Result<()> {
                $(
                    $(#[cfg($cfg)])?
                    if let Some(value) = self.$c {
                        check_version(concat!("config field ", stringify!($c)), Version::new($a, $b, $p), loaded)?;
                        raw.$c = int_field(stringify!($c), value)?;
                    }
                )+
                Ok(())
            }

            /// Every field with its first release, for tests and the size check.
            #[cfg(test)]
            const FIELDS: &'static [(&'static str, Version)] = &[
                $( $(#[cfg($cfg)])? (stringify!($c), Version::new($a, $b, $p)), )+
            ];
        }

        /// `NCCL_CONFIG_INITIALIZER`, hand-written (bindgen cannot translate it): size, magic,
        /// version, and every other field "undefined".
        fn initializer() -> ncclConfig_t {
            // Functional update from zero only so that a header newer than this crate knows (let
            // through by NCCL_SYS_SKIP_VERSION_CHECK) still builds: `size` then stops before the
            // unknown fields, and NCCL leaves them at its defaults. For known headers every field
            // is listed (the `known_fields_cover_the_header_struct` test checks it).
            #[allow(clippy::needless_update)]
            ncclConfig_t {
                size: known_size(),
                magic: MAGIC,
                version: nccl_sys::NCCL_VERSION_CODE,
                netName: std::ptr::null(),
                #[cfg(nccl_2_27)]
                commName: std::ptr::null(),
                $( $(#[cfg($cfg)])? $c: UNDEF_INT, )+
                // SAFETY: ncclConfig_t is plain C data (integers and pointers); all zeros is a
                // valid value of it.
                ..unsafe { std::mem::zeroed() }
            }
        }

        /// The bytes of `ncclConfig_t` up to the end of the last field this crate knows, rounded up
        /// to the struct's alignment: `sizeof(ncclConfig_t)` for every header it knows.
        const fn known_size() -> usize {
            let mut end = offset_of!(ncclConfig_t, netName) + size_of::<*const i8>();
            #[cfg(nccl_2_27)]
            {
                end = max(end, offset_of!(ncclConfig_t, commName) + size_of::<*const i8>());
            }
            $(
                $(#[cfg($cfg)])?
                {
                    end = max(end, offset_of!(ncclConfig_t, $c) + size_of::<c_int>());
                }
            )+
            let align = align_of::<ncclConfig_t>();
            let rounded = end.div_ceil(align) * align;
            if rounded < size_of::<ncclConfig_t>() { rounded } else { size_of::<ncclConfig_t>() }
        }
    };
}

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

int_fields! {
    /// Blocking (`true`, NCCL's default) or nonblocking (`false`) communicator. Nonblocking
    /// communicators never block the host inside NCCL: calls NCCL answers with "in progress" are
    /// polled to completion by this crate, a [timeout](Config::timeout) can bound every wait, and
    /// an [`AbortHandle`](crate::AbortHandle) can abort them from a watchdog thread.
    /// `NCCL_COMM_BLOCKING=0` or `1` in the environment (or in an NCCL config file) overrides this
    /// in NCCL; with `0` this crate counts the communicator as nonblocking too.
    blocking since (2, 14, 3): fn blocking(on: bool) => i64::from(on);
    /// CGA cluster size of NCCL's kernels, 0–8 (NCCL's default: 4 on sm90 and newer).
    cgaClusterSize since (2, 17, 1): fn cga_cluster_size(size: u32) => i64::from(size);
    /// Fewest CTAs (thread blocks) NCCL's kernels use (default 1).
    minCTAs since (2, 17, 1): fn min_ctas(ctas: u32) => i64::from(ctas);
    /// Most CTAs NCCL's kernels use (default and maximum 32, or 64 on newer releases).
    maxCTAs since (2, 17, 1): fn max_ctas(ctas: u32) => i64::from(ctas);
    /// Whether communicators split from this one share its resources (default `false`). Such
    /// communicators must never be used from two threads at once: [`Comm::split`](crate::Comm::split)
    /// makes them only after the unsafe [`Comm::allow_shared_resources`](crate::Comm::allow_shared_resources).
    splitShare since (2, 18, 1): fn split_share(on: bool) => i64::from(on);
    /// Network traffic class (InfiniBand service level / socket priority, network-specific).
    #[cfg(nccl_2_26)]
    trafficClass since (2, 26, 2): fn traffic_class(class: u32) => i64::from(class);
    /// Whether NCCL may use CollNet (IB SHARP) for this communicator (default `false`).
    #[cfg(nccl_2_27)]
    collnetEnable since (2, 27, 3): fn collnet_enable(on: bool) => i64::from(on);
    /// How many CTAs NCCL spends on communication ([`CtaPolicy`]).
    #[cfg(nccl_2_27)]
    CTAPolicy since (2, 27, 3): fn cta_policy(policy: CtaPolicy) => i64::from(policy.0);
    /// Whether communicators shrunk from this one share its resources (default `false`; ignored
    /// with [`ShrinkFlags::ABORT`](crate::ShrinkFlags::ABORT)). As for
    /// [`split_share`](Config::split_share), [`Comm::shrink`](crate::Comm::shrink) makes them only
    /// after the unsafe [`Comm::allow_shared_resources`](crate::Comm::allow_shared_resources).
    #[cfg(nccl_2_27)]
    shrinkShare since (2, 27, 3): fn shrink_share(on: bool) => i64::from(on);
    /// CTAs for NVLS (NVLink SHARP) kernels. Sizing only: NVLS itself stays off where
    /// `NCCL_NVLS_ENABLE=0` (keep it so on shared machines).
    #[cfg(nccl_2_27)]
    nvlsCTAs since (2, 27, 3): fn nvls_ctas(ctas: u32) => i64::from(ctas);
    /// Network channels per peer.
    #[cfg(nccl_2_28)]
    nChannelsPerNetPeer since (2, 28, 3): fn n_channels_per_net_peer(channels: u32) => i64::from(channels);
    /// NVLink-utilisation-centric scheduling (default `false`).
    #[cfg(nccl_2_28)]
    nvlinkCentricSched since (2, 28, 3): fn nvlink_centric_sched(on: bool) => i64::from(on);
    /// How the communicator is used with CUDA graphs: 0 never, 1 a single graph, 2 mixed (NCCL's
    /// default). With 0 or 1 NCCL no longer orders eager calls after a graph's launch, on which
    /// [`crate::capture`]'s graphs rely: calls on such a communicator are not captured
    /// ([`Error::GraphMixingOff`]).
    #[cfg(nccl_2_29)]
    graphUsageMode since (2, 29, 2): fn graph_usage_mode(mode: u32) => i64::from(mode);
    /// Number of RMA contexts (one-sided operations).
    #[cfg(nccl_2_29)]
    numRmaCtx since (2, 29, 2): fn num_rma_ctx(contexts: u32) => i64::from(contexts);
    /// Most point-to-point peers in flight at once.
    #[cfg(nccl_2_30)]
    maxP2pPeers since (2, 30, 3): fn max_p2p_peers(peers: u32) => i64::from(peers);
    /// Capture-time serialisation of graph streams (0 is valid only with `graph_usage_mode` 0
    /// or 1, and likewise keeps the communicator's calls out of captures:
    /// [`Error::GraphMixingOff`]).
    #[cfg(nccl_2_30_5)]
    graphStreamOrdering since (2, 30, 5): fn graph_stream_ordering(mode: u32) => i64::from(mode);
    /// Implicit launch order of operations.
    #[cfg(nccl_2_31)]
    launchOrderImplicit since (2, 31, 0): fn launch_order_implicit(on: bool) => i64::from(on);
    /// RMA signals per context.
    #[cfg(nccl_2_31)]
    numRmaSig since (2, 31, 0): fn num_rma_sig(signals: u32) => i64::from(signals);
    /// Set up RMA resources eagerly at creation.
    #[cfg(nccl_2_31)]
    rmaEagerInit since (2, 31, 0): fn rma_eager_init(on: bool) => i64::from(on);
    /// Host Compute Fabric Transport mode (the C value; see NCCL's documentation).
    #[cfg(nccl_2_31_1)]
    hostCftMode since (2, 31, 1): fn host_cft_mode(mode: i32) => i64::from(mode);
    /// Host NVLS component selection (the C value; see NCCL's documentation). NVLS stays off
    /// where `NCCL_NVLS_ENABLE=0`: keep that set on shared machines.
    #[cfg(nccl_2_32)]
    nvlsHostMode since (2, 32, 0): fn nvls_host_mode(mode: i32) => i64::from(mode);
}

/// The C value of one `int` field.
fn int_field(field: &'static str, value: i64) -> Result<c_int> {
    c_int::try_from(value).map_err(|_| Error::TooLarge { what: field, value: value.unsigned_abs() })
}

fn c_string(field: &'static str, value: &Option<String>) -> Result<Option<CString>> {
    value.as_deref().map(|s| CString::new(s).map_err(|_| Error::NulInString { field })).transpose()
}

/// How many CTAs NCCL spends on communication (`ncclConfig_t.CTAPolicy`, `NCCL_CTA_POLICY_*`).
#[cfg(nccl_2_27)]
#[cfg_attr(docsrs, doc(cfg(nccl_2_27)))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtaPolicy(i32);

#[cfg(nccl_2_27)]
impl CtaPolicy {
    /// NCCL's default (`NCCL_CTA_POLICY_DEFAULT`).
    #[doc(alias = "NCCL_CTA_POLICY_DEFAULT")]
    pub const DEFAULT: Self = Self(nccl_sys::NCCL_CTA_POLICY_DEFAULT as i32);
    /// Fewer CTAs, leaving SMs to compute (`NCCL_CTA_POLICY_EFFICIENCY`).
    #[doc(alias = "NCCL_CTA_POLICY_EFFICIENCY")]
    pub const EFFICIENCY: Self = Self(nccl_sys::NCCL_CTA_POLICY_EFFICIENCY as i32);
    /// No CTAs where NCCL can use copy engines instead (`NCCL_CTA_POLICY_ZERO`, NCCL ≥ 2.28; needs
    /// symmetric windows).
    #[doc(alias = "NCCL_CTA_POLICY_ZERO")]
    #[cfg(nccl_2_28)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_28)))]
    pub const ZERO: Self = Self(nccl_sys::NCCL_CTA_POLICY_ZERO as i32);
}

impl Config {
    /// Every field undefined (NCCL's defaults), no timeout: what `NCCL_CONFIG_INITIALIZER` gives.
    #[doc(alias = "NCCL_CONFIG_INITIALIZER")]
    pub fn new() -> Self {
        Self::default()
    }

    /// Forces the network module (`"IB"`, `"Socket"`, a plugin's name); the creating call fails
    /// if NCCL has no such network.
    ///
    /// C field `netName`; read by NCCL ≥ 2.17.1.
    pub fn net_name(mut self, name: impl Into<String>) -> Self {
        self.net_name = Some(name.into());
        self
    }

    /// A name for the communicator in NCCL's logs and profiler.
    ///
    /// C field `commName`; read by NCCL ≥ 2.27.3.
    #[cfg(nccl_2_27)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_27)))]
    pub fn comm_name(mut self, name: impl Into<String>) -> Self {
        self.comm_name = Some(name.into());
        self
    }

    /// This crate's timeout for the communicator (not an NCCL field): a call NCCL does not
    /// complete, or whose enqueued work does not finish, within `timeout` aborts the communicator
    /// and returns [`Error::Timeout`]. See [`Comm::set_timeout`](crate::Comm::set_timeout), which
    /// changes it later, and the [`Comm`](crate::Comm) docs. Pair it with `blocking(false)`: a
    /// blocking NCCL call cannot be interrupted.
    ///
    /// It bounds the creation too: every rank must have joined within `timeout`. Where creation
    /// may take longer (many ranks, slow start-up), create without a timeout and call
    /// [`Comm::set_timeout`](crate::Comm::set_timeout) afterwards, or bound the creation on its own
    /// with [`PendingComm::wait`](crate::PendingComm::wait).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The `ncclConfig_t` for a creating call, checked against the loaded library's version.
    pub(crate) fn to_raw(&self, loaded: Version) -> Result<RawConfig> {
        let mut raw = initializer();
        self.ints.apply(&mut raw, loaded)?;
        let strings = Arc::new(ConfigStrings {
            net_name: c_string("netName", &self.net_name)?,
            #[cfg(nccl_2_27)]
            comm_name: c_string("commName", &self.comm_name)?,
        });
        if let Some(name) = &strings.net_name {
            check_version("config field netName", Version::new(2, 17, 1), loaded)?;
            raw.netName = name.as_ptr();
        }
        #[cfg(nccl_2_27)]
        if let Some(name) = &strings.comm_name {
            check_version("config field commName", Version::new(2, 27, 3), loaded)?;
            raw.commName = name.as_ptr();
        }
        Ok(RawConfig { raw, strings })
    }

    /// What a communicator created with this config keeps on this crate's side. Nonblocking when
    /// the config says so, or when `NCCL_COMM_BLOCKING` reads as 0 ([`comm_blocking_env`]): NCCL
    /// then makes the communicator nonblocking whatever the config says. Call it once NCCL has
    /// created a communicator in this process (after the creating call returns).
    pub(crate) fn settings(&self, strings: Option<Arc<ConfigStrings>>) -> Settings {
        let nonblocking = self.ints.blocking == Some(0) || set_to_zero(comm_blocking_env());
        #[cfg(nccl_2_27)]
        let shrink = self.ints.shrinkShare == Some(1);
        #[cfg(not(nccl_2_27))]
        let shrink = false;
        let sharing = Sharing { split: self.ints.splitShare == Some(1), shrink };
        // The variable first: with it at 0 NCCL's mixing is off whatever the config says.
        let graphs_unmixed = env_unmixes_graphs().or_else(|| self.unmixed_graphs());
        Settings { nonblocking, timeout: self.timeout, strings, sharing, graphs_unmixed }
    }

    /// The field of this config that turns off NCCL's graph mixing, if one does: `graphUsageMode`
    /// 0 (no graphs) or 1 (one graph, no eager calls beside its launches), or
    /// `graphStreamOrdering` 0 (valid only with those).
    fn unmixed_graphs(&self) -> Option<Unmixed> {
        #[cfg(nccl_2_29)]
        if matches!(self.ints.graphUsageMode, Some(0 | 1)) {
            return Some(Unmixed::UsageMode);
        }
        #[cfg(nccl_2_30_5)]
        if self.ints.graphStreamOrdering == Some(0) {
            return Some(Unmixed::StreamOrdering);
        }
        None
    }
}

/// `NCCL_COMM_BLOCKING` as NCCL's default environment plugin reads it (a plugin of its own,
/// `NCCL_ENV_PLUGIN`, may answer from elsewhere; a creating call that answers "in progress"
/// proves the mode anyway): once per process (NCCL caches the number it read), after
/// NCCL has copied its config file's settings (`NCCL_CONF_FILE`, else `~/.nccl.conf`, then
/// `/etc/nccl.conf`) into the environment where the variable is not set (`setenv` without
/// overwriting, before its first read of any variable). Read here once too, the first time a
/// communicator's creating call has returned, by which time NCCL read it, so that both see the
/// same value: a variable changed later changes neither. A value that is not UTF-8 is read up to
/// its first byte that is not, as NCCL's `strtoll` stops at its first non-digit.
fn comm_blocking_env() -> Option<&'static str> {
    static VALUE: OnceLock<Option<String>> = OnceLock::new();
    read_once(&VALUE, "NCCL_COMM_BLOCKING")
}

/// The variable `name` as `cell` first read it (`None` when unset; lossy where not UTF-8).
fn read_once(cell: &'static OnceLock<Option<String>>, name: &str) -> Option<&'static str> {
    cell.get_or_init(|| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())).as_deref()
}

/// `Some(Unmixed::Env)` when `NCCL_GRAPH_MIXING_SUPPORT` turns NCCL's graph mixing off: NCCL
/// reads it once per process (`NCCL_PARAM`, with `strtoll`; a config file's value counts as for
/// [`comm_blocking_env`]), and so does this crate, the first time a communicator's creating
/// call has returned.
fn env_unmixes_graphs() -> Option<Unmixed> {
    static VALUE: OnceLock<Option<String>> = OnceLock::new();
    set_to_zero(read_once(&VALUE, "NCCL_GRAPH_MIXING_SUPPORT")).then_some(Unmixed::Env)
}

/// True when a variable whose value is `value` is set to something NCCL reads as 0 (an empty one
/// leaves NCCL's default).
///
/// `NCCL_COMM_BLOCKING` so set makes NCCL create nonblocking communicators whatever the config
/// says: NCCL reads it with `strtoll(value, NULL, 0)` (leading white space, a sign, a `0x` or `0`
/// prefix, as many digits as there are, 0 when there are none) and overrides the config's
/// `blocking` when the number is 0 or 1 (`envConfigOverride` in NCCL's `src/init.cc`). Only 0 is
/// taken into account: counting a communicator that is really blocking as nonblocking costs
/// polls, while the converse would trust results NCCL gives before it is done.
fn set_to_zero(value: Option<&str>) -> bool {
    value.filter(|v| !v.is_empty()).is_some_and(reads_as_zero)
}

/// What `NCCL_COMM_SPLIT_SHARE_RESOURCES` or `NCCL_COMM_SHRINK_SHARE_RESOURCES` (`value`) makes
/// of the config's sharing field: `None` when unset or empty (the config decides), otherwise
/// whether communicators may share resources. Any value that does not read as 0 counts as sharing
/// (NCCL shares on 1): counting a communicator as sharing only makes this crate ask for a promise
/// it did not need, while the converse would skip one it needs.
fn env_may_share(value: Option<&str>) -> Option<bool> {
    value.filter(|v| !v.is_empty()).map(|v| !reads_as_zero(v))
}

/// True when NCCL reads `value` as 0: it parses with `strtoll(value, NULL, 0)` (leading white
/// space, a sign, a `0x` or `0` prefix, as many digits as there are, 0 when there are none).
fn reads_as_zero(value: &str) -> bool {
    let value = value.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let value = value.strip_prefix(['+', '-']).unwrap_or(value);
    let hex = value.strip_prefix("0x").or_else(|| value.strip_prefix("0X"));
    let (radix, digits) = match hex {
        Some(rest) if rest.starts_with(|c: char| c.is_ascii_hexdigit()) => (16, rest),
        _ if value.starts_with('0') => (8, value),
        _ => (10, value),
    };
    // The number is 0 exactly when every digit read is a zero (or none is read). "-0" is 0 too.
    digits.chars().take_while(|c| c.is_digit(radix)).all(|c| c == '0')
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOADED: Version = Version::new(2, 28, 9);

    #[test]
    fn the_initializer_matches_nccl_config_initializer() {
        let raw = Config::new().to_raw(LOADED).unwrap().raw;
        assert_eq!(raw.size, size_of::<ncclConfig_t>());
        assert_eq!(raw.magic, 0xcafebeef);
        assert_eq!(raw.version, nccl_sys::NCCL_VERSION_CODE);
        assert_eq!(raw.blocking, i32::MIN);
        assert_eq!(raw.cgaClusterSize, i32::MIN);
        assert!(raw.netName.is_null());
        #[cfg(nccl_2_27)]
        assert!(raw.commName.is_null());
        #[cfg(nccl_2_28)]
        assert_eq!(raw.nvlinkCentricSched, i32::MIN);
    }

    #[test]
    fn sharing_comes_from_the_config_unless_the_environment_says() {
        let set = Config::new().split_share(true).settings(None).sharing;
        assert!(set.split && !set.shrink);
        assert_eq!(Config::new().settings(None).sharing, Sharing::default(), "NCCL's default: no sharing");
        assert_eq!(Config::new().split_share(false).settings(None).sharing, Sharing::default());
        for nonblocking in [false, true] {
            let adopted = Settings::unknown(nonblocking);
            assert_eq!(adopted.sharing, Sharing { split: true, shrink: true }, "an adopted communicator");
            assert_eq!(adopted.nonblocking, nonblocking, "of the mode its caller stated");
        }
        // The environment wins, and any value that does not read as 0 counts as sharing.
        assert_eq!(env_may_share(None), None);
        assert_eq!(env_may_share(Some("")), None);
        for on in ["1", " 1", "0x1", "2", "-1", "yes"] {
            assert_eq!(env_may_share(Some(on)), Some(!reads_as_zero(on)), "{on:?}");
        }
        assert_eq!(env_may_share(Some("1")), Some(true));
        assert_eq!(env_may_share(Some("0")), Some(false));
        assert_eq!(env_may_share(Some("0x0")), Some(false));
        // strtoll reads no digits in "yes": NCCL takes it for 0.
        assert_eq!(env_may_share(Some("yes")), Some(false));
    }

    #[test]
    fn known_fields_cover_the_header_struct() {
        // A field the header has and this crate does not know would leave `size` short.
        assert_eq!(known_size(), size_of::<ncclConfig_t>(), "ncclConfig_t has fields this crate does not know");
        assert!(Ints::FIELDS.iter().any(|(name, _)| *name == "blocking"));
    }

    #[test]
    fn set_fields_reach_the_struct() {
        let config = Config::new().blocking(false).min_ctas(2).max_ctas(16).split_share(true).net_name("Socket");
        let raw = config.to_raw(LOADED).unwrap();
        assert_eq!((raw.raw.blocking, raw.raw.minCTAs, raw.raw.maxCTAs, raw.raw.splitShare), (0, 2, 16, 1));
        // SAFETY: the pointer points into `raw.strings`, alive here.
        let net = unsafe { std::ffi::CStr::from_ptr(raw.raw.netName) };
        assert_eq!(net.to_str().unwrap(), "Socket");
        assert!(config.settings(None).nonblocking);
        if std::env::var_os("NCCL_COMM_BLOCKING").is_none() {
            assert!(!Config::new().blocking(true).settings(None).nonblocking);
        }
    }

    #[test]
    fn nccl_comm_blocking_0_counts_as_nonblocking() {
        // What NCCL's strtoll reads as 0: the communicator is nonblocking whatever the config says.
        for zero in ["0", "00", " 0", "+0", "-0", "0x0", "0x", "0abc", "false", "no", "08"] {
            assert!(set_to_zero(Some(zero)), "{zero:?}");
        }
        // Unset, empty (NCCL's default), 1 (blocking) and other numbers (ignored by NCCL).
        for other in [None, Some(""), Some("1"), Some(" 1"), Some("0x1"), Some("01"), Some("2"), Some("-1"), Some("10")]
        {
            assert!(!set_to_zero(other), "{other:?}");
        }
    }

    #[test]
    fn graph_mixing_is_off_where_the_config_or_environment_turns_it_off() {
        // NCCL's defaults leave it on. (The variable is read once per process: only checked
        // where the test's environment leaves it unset.)
        if std::env::var_os("NCCL_GRAPH_MIXING_SUPPORT").is_none() {
            assert_eq!(Config::new().settings(None).graphs_unmixed, None);
            assert_eq!(Settings::unknown(true).graphs_unmixed, None);
        }
        #[cfg(nccl_2_29)]
        {
            for mode in [0, 1] {
                let settings = Config::new().graph_usage_mode(mode).settings(None);
                assert_eq!(settings.graphs_unmixed.map(Unmixed::setting), Some("Config::graph_usage_mode 0 or 1"));
            }
            assert_eq!(Config::new().graph_usage_mode(2).unmixed_graphs(), None);
        }
        #[cfg(nccl_2_30_5)]
        assert_eq!(
            Config::new().graph_stream_ordering(0).unmixed_graphs().map(Unmixed::setting),
            Some("Config::graph_stream_ordering(0)")
        );
    }

    #[cfg(nccl_2_27)]
    #[test]
    fn fields_newer_than_the_loaded_library_are_refused() {
        let config = Config::new().comm_name("trainer").cta_policy(CtaPolicy::EFFICIENCY);
        let err = config.to_raw(Version::new(2, 26, 6)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Unsupported { what: "config field CTAPolicy", needed, loaded }
                    if needed == Version::new(2, 27, 3) && loaded == Version::new(2, 26, 6)
            ),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "config field CTAPolicy needs NCCL ≥ 2.27.3, but the loaded library is 2.26.6");
        let err = Config::new().comm_name("trainer").to_raw(Version::new(2, 27, 2)).unwrap_err();
        assert_eq!(err.to_string(), "config field commName needs NCCL ≥ 2.27.3, but the loaded library is 2.27.2");
        // The same config is fine for a library that reads the fields.
        let raw = config.to_raw(Version::new(2, 27, 3)).unwrap();
        assert_eq!(raw.raw.CTAPolicy, 1);
    }

    #[cfg(nccl_2_26)]
    #[test]
    fn traffic_class_needs_2_26_2() {
        let err = Config::new().traffic_class(3).to_raw(Version::new(2, 25, 1)).unwrap_err();
        assert!(matches!(err, Error::Unsupported { what: "config field trafficClass", .. }), "{err:?}");
        // Unset fields are never checked: an empty config works with the oldest library.
        Config::new().to_raw(Version::new(2, 18, 1)).unwrap();
    }

    #[test]
    fn values_and_strings_are_checked() {
        let err = Config::new().max_ctas(u32::MAX).to_raw(LOADED).unwrap_err();
        assert!(matches!(err, Error::TooLarge { what: "maxCTAs", value: 4294967295 }), "{err:?}");
        let err = Config::new().net_name("So\0cket").to_raw(LOADED).unwrap_err();
        assert!(matches!(err, Error::NulInString { field: "netName" }), "{err:?}");
        assert_eq!(err.to_string(), "config field netName contains a NUL byte");
    }

    #[test]
    fn every_field_names_a_release_the_crate_supports_or_older() {
        for (name, since) in Ints::FIELDS {
            assert!(*since <= Version::new(2, 32, 99), "{name}");
        }
    }
}
