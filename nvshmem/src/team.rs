//! Teams: the predefined ones, strided and 2-D splits, PE numbers within teams, and barriers,
//! syncs and collectives over a team on a stream.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, DeviceRepr};
use gpucomm_ordering::{Access, Keep, Resource, Visitor};
use nvshmem_sys::{cudaStream_t, nvshmem_team_id_t, nvshmem_team_t};

use crate::agree::DATA_WORDS;
use crate::error::{Error, Result};
use crate::ffi::{call, call_unchecked};
use crate::ops::{self, ReduceOp};
use crate::overlap::{self, Span};
use crate::quiesce;
use crate::rma::expect_len;
use crate::runtime::Admitted;
use crate::{Runtime, SymmetricMemory};

/// A set of PEs that run collectives together (`nvshmem_team_t`), borrowed from the [`Runtime`].
///
/// The predefined teams ([`Runtime::world`], [`Runtime::shared`], [`Runtime::node`]) live as long
/// as NVSHMEM; teams made by [`Team::split_strided`] and [`Team::split_2d`] are destroyed
/// (`nvshmem_team_destroy`) by [`Team::destroy`] or when dropped.
///
/// # Collective creation and destruction
///
/// Splitting is collective over the parent team and destroying is collective over the team:
/// every member must do it, in the same order relative to the team's other collectives. Before
/// NVSHMEM splits, the members compare their splits (each member puts its arguments to every
/// other and waits for theirs: no collective), and when they differ every member gets
/// [`Error::AsymmetricSplit`] and no team is made: NVSHMEM computes each member's new team from
/// that member's own arguments, and would otherwise wait for ever or give members teams that
/// share its per-team state. Splits made in different orders on different members (over teams
/// that share PEs) break the collective order itself, which nothing can compare: the members
/// wait for each other, or, with three PEs or more, one may enter NVSHMEM's split alone. Drop
/// order differs between PEs on error paths, so a team dropped while a panic unwinds is leaked
/// (with a warning through the `log` crate) instead of destroyed; otherwise, drop teams in the same
/// order on every PE, or call [`Team::destroy`]. NVSHMEM has room for `NVSHMEM_MAX_TEAMS` teams
/// (default 128, its internal ones included); a strided split beyond that fails with
/// [`Error::Status`], a 2-D split with [`Error::SplitIncomplete`].
///
/// Work queued on a stream that uses the team (a barrier, a collective) must finish before the team
/// is destroyed: `nvshmem_team_destroy` clears the team's device state before it synchronises the
/// device (3.4.5), so a queued team collective would read a destroyed team. Destroying therefore
/// first waits until the PE's device is idle, within [`Runtime::set_timeout`]; when the device
/// stays busy, [`Team::destroy`] hands the team back with [`Error::StillInUse`] and a dropped team
/// is leaked (with a warning through the `log` crate) rather than destroyed under running work.
///
/// # Collectives on several streams
///
/// NVSHMEM's collectives on a stream update the team's device state (its sync counters and psync
/// slots) without atomics, and pair up across PEs by the order of those updates: two of one PE's
/// collectives running at once, on two streams, would leave the PEs' counters apart for good. So
/// each PE's collectives on a stream — barriers, syncs, reductions, broadcasts, fcollects,
/// alltoalls, over any team, [`Runtime::barrier_all_on_stream`] and
/// [`Runtime::sync_all_on_stream`] included — run one at a time, in the order they were enqueued:
/// one enqueued on another stream than the last one waits for it (an event), and host calls that
/// run a collective on NVSHMEM's own stream ([`Runtime::barrier_all`], allocations, frees, splits)
/// wait for it too. Enqueue the collectives of teams that share PEs in the same order on every PE,
/// as blocking collectives would need. A graph with captured collectives ([`crate::capture`]) is
/// ordered the same way at each launch, as one collective, and so is a kernel launched with
/// [`crate::Kernel::launch_collective`] (the only launch whose kernel may make collectives on the
/// device).
///
/// When several PEs share one GPU without MPS ([`crate::InitStatus::LIMITED_MPG`]), NVSHMEM exits
/// the process in splits and in the barriers and collectives on a stream: this crate refuses them
/// with [`Error::NotSupportedWithLimitedMpg`] instead.
pub struct Team<'rt> {
    raw: nvshmem_team_t,
    rt: &'rt Runtime,
    my_pe: usize,
    n_pes: usize,
    /// Set by the consuming teardown once the C resource is gone: `Drop` then has nothing to do.
    /// NVSHMEM's predefined teams start released: no handle destroys them.
    released: bool,
}

impl std::fmt::Debug for Team<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team").field("raw", &self.raw).field("my_pe", &self.my_pe).field("n_pes", &self.n_pes).finish()
    }
}

impl Runtime {
    /// All PEs (`NVSHMEM_TEAM_WORLD`).
    #[doc(alias = "NVSHMEM_TEAM_WORLD")]
    pub fn world(&self) -> Result<Team<'_>> {
        Team::adopt(self, nvshmem_team_id_t::NVSHMEM_TEAM_WORLD.0, false)
    }

    /// The PEs that share memory with this one and can load/store each other's heaps
    /// (`NVSHMEM_TEAM_SHARED`).
    #[doc(alias = "NVSHMEM_TEAM_SHARED")]
    pub fn shared(&self) -> Result<Team<'_>> {
        Team::adopt(self, nvshmem_team_id_t::NVSHMEM_TEAM_SHARED.0, false)
    }

    /// The PEs on this node (`NVSHMEMX_TEAM_NODE`).
    #[doc(alias = "NVSHMEMX_TEAM_NODE")]
    pub fn node(&self) -> Result<Team<'_>> {
        Team::adopt(self, nvshmem_team_id_t::NVSHMEMX_TEAM_NODE.0, false)
    }
}

/// Converts to C's int; values were checked against a team size, which fits an int.
fn int(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// Elements per NVSHMEM call of an in-place reduction of `len` elements of `elem_size` bytes over
/// `n_pes` PEs, for an operation that is `idempotent` or not, when NVSHMEM's segmented algorithm
/// exchanges `segment` bytes with a peer per round: see [`Team::reduce_in_place_on_stream`].
fn in_place_piece(len: usize, elem_size: usize, idempotent: bool, n_pes: usize, segment: usize) -> Result<usize> {
    if n_pes <= 2 || idempotent {
        return Ok(len.max(1));
    }
    match segment / (n_pes - 1) / elem_size {
        0 => Err(Error::ReduceScratchTooSmall {
            n_pes,
            elem_size,
            needed: (n_pes - 1).saturating_mul(elem_size).saturating_mul(16),
        }),
        piece => Ok(piece),
    }
}

/// Enqueues `op` over the `len` elements of `T` at `dst` and `src`, in calls of at most `piece`
/// elements (`piece` ≥ 1; one call of none when `len` is 0).
///
/// # Safety
///
/// As [`ReduceOp::reduce`] for the whole range.
unsafe fn reduce_in_pieces<T, Op: ReduceOp<T>>(
    op: Op,
    team: nvshmem_team_t,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    piece: usize,
    stream: cudaStream_t,
) -> Result<()> {
    let mut done = 0;
    loop {
        let n = piece.min(len - done);
        // `done` elements lie inside both ranges, so the offset does not overflow.
        let offset = (done * size_of::<T>()) as CUdeviceptr;
        // SAFETY: `offset..offset + n` elements lie inside both ranges; the rest as the caller's.
        unsafe { op.reduce(team, dst + offset, src + offset, n, stream) }?;
        done += n;
        if done == len {
            return Ok(());
        }
    }
}

/// The arguments of a strided split of a team of `n_pes` PEs — the PEs `start, start + stride, …`,
/// `size` of them — as C wants them: `(start, stride, size)`. A team of one PE gets stride 1,
/// whatever `stride` was (it names no second PE, and NVSHMEM multiplies it by the parent's
/// stride). [`Error::InvalidSplit`] when the team is empty, the stride 0, a PE outside the parent
/// team, or a value past C's `int`.
fn split_args(start: usize, stride: usize, size: usize, n_pes: usize) -> Result<(i32, i32, i32)> {
    let invalid = Error::InvalidSplit { start, stride, size, n_pes };
    let c_stride = if size == 1 { 1 } else { stride };
    let last = size.checked_sub(1).and_then(|k| k.checked_mul(c_stride)).and_then(|d| d.checked_add(start));
    if stride == 0 || !matches!(last, Some(l) if l < n_pes) {
        return Err(invalid);
    }
    match (i32::try_from(start), i32::try_from(c_stride), i32::try_from(size)) {
        (Ok(start), Ok(stride), Ok(size)) => Ok((start, stride, size)),
        _ => Err(invalid),
    }
}

/// What a split's words name it: a strided split.
const STRIDED: u64 = 1;
/// What a split's words name it: a 2-D split.
const TWO_D: u64 = 2;
/// What the words after a 2-D split name: whether the member got its row and its column.
const SPLIT_2D_MADE: u64 = 3;

/// The words a member of team `parent` sends before a split of `kind` with `args` (as the caller
/// gave them), or after a 2-D split with what it got ([`SPLIT_2D_MADE`]).
fn split_words(kind: u64, args: [usize; 3], parent: nvshmem_team_t) -> [u64; DATA_WORDS] {
    // `as u64` is exact for usize on the 64-bit targets CUDA runs on; the handle is an `int`.
    [kind, args[0] as u64, args[1] as u64, args[2] as u64, u64::from(parent as u32)]
}

/// `Ok` when every member's split words (in team order) are member 0's, else
/// [`Error::AsymmetricSplit`] naming the lowest member whose words differ (another split's, of a
/// member that splits its teams in another order).
fn split_verdict(all: &[[u64; DATA_WORDS]]) -> Result<()> {
    match all.iter().position(|words| Some(words) != all.first()) {
        Some(pe) => Err(Error::AsymmetricSplit { pe }),
        None => Ok(()),
    }
}

impl<'rt> Team<'rt> {
    /// Wraps a valid team handle, reading this PE's number and the size. `owned`: a team of a
    /// split, which the handle destroys (not a predefined one).
    fn adopt(rt: &'rt Runtime, raw: nvshmem_team_t, owned: bool) -> Result<Self> {
        // SAFETY: `raw` is a valid team this PE belongs to (a predefined one, or one NVSHMEM
        // just created); both calls only read it.
        let (me, n) = unsafe { (call_unchecked!(nvshmem_team_my_pe(raw))?, call_unchecked!(nvshmem_team_n_pes(raw))?) };
        let team = Team { raw, rt, my_pe: me.max(0) as usize, n_pes: n.max(0) as usize, released: !owned };
        if me < 0 || me >= n {
            return Err(Error::InvalidPe { what: "the team PE NVSHMEM reports", pe: team.my_pe, n_pes: team.n_pes });
        }
        Ok(team)
    }

    /// This PE's number within the team (`nvshmem_team_my_pe`).
    #[doc(alias = "nvshmem_team_my_pe")]
    pub fn my_pe(&self) -> usize {
        self.my_pe
    }

    /// Number of PEs in the team (`nvshmem_team_n_pes`).
    #[doc(alias = "nvshmem_team_n_pes")]
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }

    /// The raw handle, for `nvshmem-sys` calls this crate does not wrap. It stays owned by `self`.
    pub fn as_raw(&self) -> nvshmem_team_t {
        self.raw
    }

    /// The runtime the team belongs to.
    pub fn runtime(&self) -> &'rt Runtime {
        self.rt
    }

    /// The number in team `to` of the PE that is `pe` in this team
    /// (`nvshmem_team_translate_pe`), or `None` when that PE is not a member of `to`.
    /// [`Error::InvalidPe`] when `pe` is not a PE of this team.
    #[doc(alias = "nvshmem_team_translate_pe")]
    pub fn translate_pe(&self, pe: usize, to: &Team<'_>) -> Result<Option<usize>> {
        let pe = self.check_pe("pe", pe)?;
        // SAFETY: both teams are valid handles of this runtime and `pe` is a member of `self`.
        let got = unsafe { call_unchecked!(nvshmem_team_translate_pe(self.raw, pe, to.raw)) }?;
        Ok(usize::try_from(got).ok())
    }

    fn check_pe(&self, what: &'static str, pe: usize) -> Result<i32> {
        if pe < self.n_pes {
            Ok(int(pe))
        } else {
            Err(Error::InvalidPe { what, pe, n_pes: self.n_pes })
        }
    }

    /// Makes a team of the PEs `start, start + stride, …` (`size` of them, numbered in this
    /// team) (`nvshmem_team_split_strided`). Collective over this team: every member calls it
    /// with the same arguments (compared first: [`Error::AsymmetricSplit`] on every member when
    /// they differ, and no team is made); members outside the new team get `None`.
    /// [`Error::InvalidSplit`] when the PEs do not all lie in this team.
    #[doc(alias = "nvshmem_team_split_strided")]
    pub fn split_strided(&self, start: usize, stride: usize, size: usize) -> Result<Option<Team<'rt>>> {
        self.rt.check_not_limited_mpg("nvshmem_team_split_strided")?;
        let local = split_args(start, stride, size, self.n_pes);
        let (start, stride, size) = self.agree_split(STRIDED, [start, stride, size], local)?;
        let mut new = nvshmem_team_id_t::NVSHMEM_TEAM_INVALID.0;
        // SAFETY: `self.raw` is a valid team; `split_args` checked that start, stride and size
        // describe PEs inside it, converted them to ints exactly, and passes stride 1 for a team
        // of one PE, so that NVSHMEM's product of the stride with this team's own cannot overflow;
        // every member passes the same arguments (compared above); no configuration is passed
        // (mask 0); `new` is a live local; the PE's context is current (made so before the
        // comparison, which makes no other current).
        unsafe { call!(nvshmem_team_split_strided(self.raw, start, stride, size, std::ptr::null(), 0, &mut new)) }?;
        self.child(new)
    }

    /// Splits this team into a 2-D grid with `xrange` PEs per row (`nvshmem_team_split_2d`): the
    /// first team holds this PE's row, the second its column (every PE is in one of each).
    /// Collective over this team, with the same `xrange` on every member (compared first, as for
    /// [`Team::split_strided`]); an `xrange` larger than the team is clamped to it.
    /// [`Error::ZeroXRange`] for `xrange == 0`. NVSHMEM reports success even when it could not
    /// make one of the rows or columns (`NVSHMEM_MAX_TEAMS` reached): a PE left without its row or
    /// column gets [`Error::SplitIncomplete`], and the team it did get is destroyed.
    #[doc(alias = "nvshmem_team_split_2d")]
    pub fn split_2d(&self, xrange: usize) -> Result<(Team<'rt>, Team<'rt>)> {
        self.rt.check_not_limited_mpg("nvshmem_team_split_2d")?;
        let local = if xrange == 0 { Err(Error::ZeroXRange) } else { Ok(int(xrange.min(self.n_pes))) };
        let xrange = self.agree_split(TWO_D, [xrange, 0, 0], local)?;
        // Everything the second exchange needs, before NVSHMEM splits: past the split this member
        // must send its words whatever happens, or the others wait for them.
        let members = self.members()?;
        let agreement = self.rt.agreement()?;
        let invalid = nvshmem_team_id_t::NVSHMEM_TEAM_INVALID.0;
        let (mut x, mut y) = (invalid, invalid);
        // SAFETY: `self.raw` is a valid team, `xrange` is at least 1 (NVSHMEM divides by it), fits
        // an int after clamping and is the same on every member (compared above); no
        // configurations (masks 0); both outputs are live locals; the PE's context is current
        // (made so before the comparison, which makes no other current).
        let split = unsafe {
            call!(nvshmem_team_split_2d(self.raw, xrange, std::ptr::null(), 0, &mut x, std::ptr::null(), 0, &mut y))
        };
        // Adopt both before reporting an error, so that neither leaks.
        let (row, column) = match split {
            Ok(()) => (self.child(x), self.child(y)),
            Err(e) => (Err(e), Ok(None)),
        };
        // NVSHMEM (3.4.5) logs a failed inner split and returns 0, leaving the PEs of that row or
        // column without it while the others got theirs. The members tell each other what they
        // got; unless every one got both, every one drops what it got (rows first on every PE,
        // then columns: each team that was made is destroyed by all of its members). Words that
        // are not this exchange's (a member whose splits come in another order) count as neither.
        let made = |team: &Result<Option<Team<'rt>>>| usize::from(matches!(team, Ok(Some(_))));
        let words = split_words(SPLIT_2D_MADE, [made(&row), made(&column), 0], self.raw);
        let all = agreement.team_exchange(&members, words)?;
        let ours = |w: &[u64; DATA_WORDS]| w[0] == SPLIT_2D_MADE && w[4] == words[4];
        let lacking = all.iter().position(|w| !ours(w) || w[1] == 0 || w[2] == 0);
        match (row?, column?, lacking) {
            (Some(row), Some(column), None) => Ok((row, column)),
            (row, column, lacking) => {
                drop(row);
                drop(column);
                let pe = lacking.unwrap_or(self.my_pe);
                let missing = if all.get(pe).is_some_and(|w| !ours(w) || w[1] == 0) { "row" } else { "column" };
                Err(Error::SplitIncomplete { pe, missing })
            }
        }
    }

    /// The world PE numbers of this team's members, in team order.
    fn members(&self) -> Result<Vec<usize>> {
        (0..self.n_pes).map(|pe| self.world_pe(pe)).collect()
    }

    /// Compares this member's split (`kind`, with the arguments `args` as given) with every other
    /// member's, before NVSHMEM is asked: collective over this team (puts with signals and a wait
    /// on the host, on the agreement's private stream; no collective). `local` is this member's own verdict on its arguments;
    /// the member takes part whatever it is, since the others would wait for it otherwise (equal
    /// arguments give every member the same verdict). Gives `local`'s value when every member
    /// made the same split and this member's arguments are valid; `local`'s error first, then
    /// [`Error::AsymmetricSplit`].
    fn agree_split<T>(&self, kind: u64, args: [usize; 3], local: Result<T>) -> Result<T> {
        let agreement = self.rt.agreement()?;
        let members = self.members()?;
        // Not `bind_to_thread`, here or before the split: it would first fail with an unrelated
        // error recorded in the context (by any thread), and this member would leave the others
        // waiting in the comparison or in NVSHMEM's split.
        gpucomm_ordering::make_current(self.rt.context())?;
        let all = agreement.team_exchange(&members, split_words(kind, args, self.raw))?;
        let local = local?;
        split_verdict(&all)?;
        Ok(local)
    }

    /// The world PE number of this team's PE `pe` (below `n_pes`).
    fn world_pe(&self, pe: usize) -> Result<usize> {
        let world = nvshmem_team_id_t::NVSHMEM_TEAM_WORLD.0;
        // SAFETY: both teams are valid handles of this runtime and `pe` is a member of `self`.
        let got = unsafe { call_unchecked!(nvshmem_team_translate_pe(self.raw, int(pe), world)) }?;
        usize::try_from(got).map_err(|_| Error::InvalidPe { what: "a team member's world PE", pe, n_pes: self.n_pes })
    }

    /// Waits until the PE's device is idle, within the runtime's timeout: team collectives may
    /// still be queued on any stream, and `nvshmem_team_destroy` clears the team's device state
    /// before it synchronises. Refused while a capture holds NVSHMEM's copy streams (destroying
    /// quiesces them).
    fn wait_for_device(&self) -> Result<()> {
        quiesce::host_call("destroying a team")?;
        self.rt.wait_for_device("a team (its collectives may still be queued on the PE's device)")
    }

    fn child(&self, raw: nvshmem_team_t) -> Result<Option<Team<'rt>>> {
        if raw == nvshmem_team_id_t::NVSHMEM_TEAM_INVALID.0 {
            return Ok(None);
        }
        Team::adopt(self.rt, raw, true).map(Some)
    }

    /// Destroys the team (`nvshmem_team_destroy`) once the PE's device is idle. Collective over its
    /// members (see the type's documentation). Predefined teams are not destroyed: this only drops
    /// the handle. If the device does not become idle within [`Runtime::set_timeout`]
    /// ([`Error::StillInUse`]), or NVSHMEM cannot be reached (the context cannot be bound, the
    /// function is missing), nothing is destroyed and the team comes back with the error.
    #[doc(alias = "nvshmem_team_destroy")]
    pub fn destroy(mut self) -> std::result::Result<(), (Self, Error)> {
        if self.released {
            return Ok(());
        }
        let destroyed = (|| {
            self.wait_for_device()?;
            // Not `bind_to_thread`: an error something else recorded in the context would keep
            // this member's team while the others destroy theirs.
            gpucomm_ordering::make_current(self.rt.context())?;
            // SAFETY: the team was created by a split and is destroyed once: it is marked released
            // below on success, so Drop does nothing; no queued work uses it (the device is idle);
            // if the function does not resolve, nothing is called.
            unsafe { call!(nvshmem_team_destroy(self.raw)) }
        })();
        match destroyed {
            Ok(()) => {
                self.released = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    /// Enqueues a barrier over the team on `stream` (`nvshmemx_barrier_on_stream`): when it
    /// completes, every member's earlier operations are complete and visible. Collective.
    #[doc(alias = "nvshmemx_barrier_on_stream")]
    pub fn barrier_on_stream(&self, stream: &CudaStream) -> Result<()> {
        self.rt.check_not_limited_mpg("nvshmemx_barrier_on_stream")?;
        // SAFETY: valid team; the stream is on the PE's device (checked) and its context current.
        let barrier = |raw| unsafe { call!(nvshmemx_barrier_on_stream(self.raw, raw)) };
        self.rt.quiesce_on(stream, self.resource(), true, barrier).map(drop)
    }

    /// Enqueues a synchronisation of the team on `stream` (`nvshmemx_team_sync_on_stream`): a
    /// rendezvous that completes no outstanding operations. Collective.
    #[doc(alias = "nvshmemx_team_sync_on_stream")]
    pub fn sync_on_stream(&self, stream: &CudaStream) -> Result<()> {
        self.rt.check_not_limited_mpg("nvshmemx_team_sync_on_stream")?;
        let admitted = Admitted::stream(stream, self.resource())?;
        let raw = self.rt.enqueue_on(&admitted)?;
        // SAFETY: valid team; the stream is on the PE's device (checked) and its context current.
        quiesce::collective(stream.cu_stream(), admitted.captured.then_some(stream), false, || unsafe {
            call!(nvshmemx_team_sync_on_stream(self.raw, raw))
        })
    }

    /// Reduces `src` over the team with `op` and writes the result to `dst` on every member
    /// (`nvshmemx_<type>_<op>_reduce_on_stream`): the all-reduce. Both are symmetric, of equal
    /// length, and disjoint or the same range ([`Error::Overlap`] otherwise; the same range is
    /// reduced as [`Team::reduce_in_place_on_stream`] does). Only the (type, operation) pairs
    /// NVSHMEM defines compile: see [`crate::ops`]. Collective: every member passes the same
    /// length, and either one range as both or two ranges — a reduction in place may take
    /// several NVSHMEM calls where one between two buffers takes one, and members that made
    /// different numbers of calls would leave the team's later collectives paired with the
    /// wrong ones (nothing compares them).
    pub fn reduce_on_stream<T, Op: ReduceOp<T>>(
        &self,
        op: Op,
        dst: &mut impl SymmetricMemory<T>,
        src: &impl SymmetricMemory<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.rt.check_not_limited_mpg("nvshmemx_<type>_<op>_reduce_on_stream")?;
        expect_len("destination", src.len(), dst.len())?;
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let raw = self.rt.enqueue_on(&admitted)?;
        let (s, _s) = access.read(src)?;
        let (d, _d) = access.write(dst)?;
        let bytes = src.len() * size_of::<T>();
        overlap::disjoint_or_identical(Span::new("destination", d, bytes), Span::new("source", s, bytes))?;
        let len = src.len();
        let piece = if d == s { self.in_place_piece::<T, Op>(len)? } else { len.max(1) };
        // SAFETY: both buffers are symmetric with `len` elements (checked), disjoint or the same
        // range (checked; then in pieces NVSHMEM reduces right in place); `Op::reduce` calls the C
        // function for exactly `T`; the stream is on this device, its context current.
        quiesce::collective(stream.cu_stream(), admitted.captured.then_some(stream), false, || unsafe {
            reduce_in_pieces(op, self.raw, d, s, len, piece, raw)
        })
    }

    /// [`Team::reduce_on_stream`] with one buffer as input and output.
    ///
    /// NVSHMEM (3.4.5) reduces over a team other than the world team, and large messages over the
    /// world team, with a segmented algorithm that sends a PE's source to one peer per round and
    /// reduces into the destination between rounds. With the source as destination a later round
    /// sends a partly reduced value: over three or more PEs, an operation under which a value met
    /// twice changes the result ([`Sum`](crate::ops::Sum), [`Prod`](crate::ops::Prod),
    /// [`Xor`](crate::ops::Xor)) would count values twice. That algorithm is right in place when
    /// one round reaches every peer, so such a reduction is made in NVSHMEM calls of at most
    /// `NVSHMEM_REDUCE_SCRATCH_SIZE / 16 / (n_pes − 1)` bytes each (10 KiB over 4 PEs with the
    /// default 512 KiB): right whichever algorithm NVSHMEM or NCCL picks, but one launch per
    /// piece. For large messages reduce from one buffer into another instead. With a scratch too
    /// small for one element per peer it fails with [`Error::ReduceScratchTooSmall`] (nothing is
    /// called). Collective.
    pub fn reduce_in_place_on_stream<T, Op: ReduceOp<T>>(
        &self,
        op: Op,
        buf: &mut impl SymmetricMemory<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.rt.check_not_limited_mpg("nvshmemx_<type>_<op>_reduce_on_stream")?;
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let raw = self.rt.enqueue_on(&admitted)?;
        let len = buf.len();
        let piece = self.in_place_piece::<T, Op>(len)?;
        let (p, _p) = access.write(buf)?;
        // SAFETY: one symmetric buffer of `len` elements as source and destination, which
        // OpenSHMEM reductions allow, in pieces NVSHMEM reduces right in place; otherwise as for
        // `reduce_on_stream`.
        quiesce::collective(stream.cu_stream(), admitted.captured.then_some(stream), false, || unsafe {
            reduce_in_pieces(op, self.raw, p, p, len, piece, raw)
        })
    }

    /// Elements per NVSHMEM call of a reduction of `len` elements with one buffer as source and
    /// destination (see [`Team::reduce_in_place_on_stream`]): all of them (at least 1) over one
    /// or two PEs or for an idempotent operation, otherwise what one round of NVSHMEM's segmented
    /// algorithm sends to every peer. The same on every member: it depends on the team's size,
    /// `T`, `Op` and the `NVSHMEM_REDUCE_SCRATCH_SIZE` every PE runs with.
    fn in_place_piece<T, Op: ReduceOp<T>>(&self, len: usize) -> Result<usize> {
        in_place_piece(len, size_of::<T>(), ops::idempotent::<T, Op>(), self.n_pes, self.rt.reduce_segment)
    }

    /// Copies `src` of team PE `root` into `dst` on every member (`nvshmemx_broadcastmem_on_stream`).
    /// Both symmetric, of equal length, and disjoint ([`Error::Overlap`]). Collective.
    #[doc(alias = "nvshmemx_broadcastmem_on_stream")]
    pub fn broadcast_on_stream<T: DeviceRepr>(
        &self,
        dst: &mut impl SymmetricMemory<T>,
        src: &impl SymmetricMemory<T>,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.rt.check_not_limited_mpg("nvshmemx_broadcastmem_on_stream")?;
        expect_len("destination", src.len(), dst.len())?;
        let root = self.check_pe("root", root)?;
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let raw = self.rt.enqueue_on(&admitted)?;
        let dst_bytes = dst.num_bytes();
        let (s, _s) = access.read(src)?;
        let (d, _d) = access.write(dst)?;
        overlap::disjoint(Span::new("destination", d, dst_bytes), Span::new("source", s, src.num_bytes()))?;
        let bytes = src.num_bytes();
        // SAFETY: both symmetric with `bytes` bytes (checked) and disjoint (checked); `root` is a
        // member; the stream is on this device and its context current.
        quiesce::collective(stream.cu_stream(), admitted.captured.then_some(stream), false, || unsafe {
            call!(nvshmemx_broadcastmem_on_stream(self.raw, d as *mut _, s as *const _, bytes, root, raw))
        })
    }

    /// Concatenates every member's `src` into `dst`, in team order, on every member
    /// (`nvshmemx_fcollectmem_on_stream`): `dst.len()` is `src.len() × n_pes()`, and the two are
    /// disjoint ([`Error::Overlap`]). Collective.
    #[doc(alias = "nvshmemx_fcollectmem_on_stream")]
    pub fn fcollect_on_stream<T: DeviceRepr>(
        &self,
        dst: &mut impl SymmetricMemory<T>,
        src: &impl SymmetricMemory<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.rt.check_not_limited_mpg("nvshmemx_fcollectmem_on_stream")?;
        let total = src
            .len()
            .checked_mul(self.n_pes)
            .ok_or(Error::SizeOverflow { len: src.len(), elem_size: size_of::<T>() })?;
        expect_len("destination", total, dst.len())?;
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let raw = self.rt.enqueue_on(&admitted)?;
        let dst_bytes = dst.num_bytes();
        let (s, _s) = access.read(src)?;
        let (d, _d) = access.write(dst)?;
        overlap::disjoint(Span::new("destination", d, dst_bytes), Span::new("source", s, src.num_bytes()))?;
        let bytes = src.num_bytes();
        // SAFETY: `src` holds `bytes` bytes and `dst` n_pes times as many (checked), both symmetric
        // and disjoint (checked); the stream is on this device and its context current.
        quiesce::collective(stream.cu_stream(), admitted.captured.then_some(stream), false, || unsafe {
            call!(nvshmemx_fcollectmem_on_stream(self.raw, d as *mut _, s as *const _, bytes, raw))
        })
    }

    /// Exchanges blocks: block `j` of `src` on member `i` lands in block `i` of `dst` on member `j`
    /// (`nvshmemx_alltoallmem_on_stream`). Both symmetric, of equal length, disjoint
    /// ([`Error::Overlap`]), split into `n_pes()` equal blocks. Collective.
    #[doc(alias = "nvshmemx_alltoallmem_on_stream")]
    pub fn alltoall_on_stream<T: DeviceRepr>(
        &self,
        dst: &mut impl SymmetricMemory<T>,
        src: &impl SymmetricMemory<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.rt.check_not_limited_mpg("nvshmemx_alltoallmem_on_stream")?;
        expect_len("destination", src.len(), dst.len())?;
        if src.len() % self.n_pes != 0 {
            return Err(Error::NotDivisible { what: "source", len: src.len(), parts: self.n_pes });
        }
        let block = src.num_bytes() / self.n_pes;
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let raw = self.rt.enqueue_on(&admitted)?;
        let dst_bytes = dst.num_bytes();
        let (s, _s) = access.read(src)?;
        let (d, _d) = access.write(dst)?;
        overlap::disjoint(Span::new("destination", d, dst_bytes), Span::new("source", s, src.num_bytes()))?;
        // SAFETY: both symmetric with n_pes blocks of `block` bytes (checked) and disjoint
        // (checked); the stream is on this device and its context current.
        quiesce::collective(stream.cu_stream(), admitted.captured.then_some(stream), false, || unsafe {
            call!(nvshmemx_alltoallmem_on_stream(self.raw, d as *mut _, s as *const _, block, raw))
        })
    }
}

impl Drop for Team<'_> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if std::thread::panicking() {
            log::warn!("nvshmem: team {} dropped during a panic is leaked (destroying is collective)", self.raw);
            return;
        }
        // Collectives on the team may still be queued, on streams this crate does not know: wait
        // for the device, within the runtime's timeout, and leak the team otherwise.
        if let Err(e) = self.wait_for_device() {
            return log::warn!("nvshmem: {e}; dropped team {} is leaked", self.raw);
        }
        if let Err(e) = gpucomm_ordering::make_current(self.rt.context()) {
            return log::warn!(
                "nvshmem: making the PE's context current failed ({e}); dropped team {} is leaked",
                self.raw
            );
        }
        // SAFETY: the team was created by a split and is destroyed exactly once, here; no queued
        // work uses it (the device is idle); the PE's context is current.
        if let Err(e) = unsafe { call!(nvshmem_team_destroy(self.raw)) } {
            log::warn!("nvshmem: destroying team {} failed: {e}", self.raw);
        }
    }
}

impl Team<'_> {
    /// The team as a resource a graph must keep: what a collective on it inside [`crate::capture`] records.
    pub(crate) fn resource(&self) -> Resource {
        Resource::of("team", self)
    }
}

// SAFETY: the borrow keeps the team undestroyed and in place (and its runtime running).
unsafe impl Keep for &Team<'_> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.resource(self.resource(), true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_reductions_that_would_count_a_value_twice_go_in_pieces_one_round_can_send() {
        // The default scratch (512 KiB) gives NVSHMEM 32 KiB segments.
        let segment = (1 << 19) / 2 / 8;
        assert_eq!(in_place_piece(1 << 20, 4, false, 2, segment).unwrap(), 1 << 20, "two PEs: one round");
        assert_eq!(in_place_piece(1 << 20, 4, true, 8, segment).unwrap(), 1 << 20, "min, max, and, or");
        assert_eq!(in_place_piece(0, 4, true, 8, segment).unwrap(), 1, "one call of none");
        // Three PEs: 16 KiB per call, 4096 f32s; the remainder round then reaches both peers.
        assert_eq!(in_place_piece(1 << 20, 4, false, 3, segment).unwrap(), 4096);
        assert_eq!(in_place_piece(1 << 20, 2, false, 5, segment).unwrap(), 4096, "8 KiB of u16s over 5 PEs");
        let piece = in_place_piece(1 << 20, 8, false, 7, segment).unwrap();
        assert!(piece * 8 * 6 <= segment && (piece + 1) * 8 * 6 > segment, "{piece}");
        // A scratch of 1 KiB (64-byte segments) cannot send one u64 to each of 16 peers a round.
        let err = in_place_piece(10, 8, false, 17, 1024 / 2 / 8).unwrap_err();
        assert!(matches!(err, Error::ReduceScratchTooSmall { n_pes: 17, elem_size: 8, needed: 2048 }), "{err}");
        assert_eq!(in_place_piece(10, 8, false, 17, 2048 / 2 / 8).unwrap(), 1, "exactly enough");
    }

    #[test]
    fn strided_splits_inside_the_team_pass_as_ints() {
        assert_eq!(split_args(0, 2, 2, 4).unwrap(), (0, 2, 2));
        assert_eq!(split_args(1, 1, 3, 4).unwrap(), (1, 1, 3));
        assert_eq!(split_args(0, 3, 2, 4).unwrap(), (0, 3, 2), "the last PE of the team");
    }

    #[test]
    fn a_team_of_one_pe_gets_stride_1() {
        // NVSHMEM multiplies the stride by the parent's: a huge one overflowed C's int.
        assert_eq!(split_args(3, usize::MAX, 1, 4).unwrap(), (3, 1, 1));
        assert_eq!(split_args(0, 1 << 40, 1, 4).unwrap(), (0, 1, 1));
        assert!(matches!(split_args(0, 0, 1, 4), Err(Error::InvalidSplit { stride: 0, .. })), "stride 0");
    }

    /// Audit: split arguments were not compared across the parent team, and NVSHMEM computes each
    /// member's new team from its own. Now each member's words must equal member 0's.
    #[test]
    fn members_must_make_the_same_split() {
        assert_eq!(split_words(TWO_D, [4, 0, 0], 7), [2, 4, 0, 0, 7]);
        assert_eq!(split_words(STRIDED, [0, 1, 2], 0), [1, 0, 1, 2, 0]);
        let a = split_words(STRIDED, [0, 1, 2], 0);
        assert!(split_verdict(&[a]).is_ok(), "one member");
        assert!(split_verdict(&[a, a, a]).is_ok());
        // Other arguments, on any member: the lowest that differs is named.
        let b = split_words(STRIDED, [1, 1, 1], 0);
        assert!(matches!(split_verdict(&[a, b]), Err(Error::AsymmetricSplit { pe: 1 })));
        assert!(matches!(split_verdict(&[a, a, b, b]), Err(Error::AsymmetricSplit { pe: 2 })));
        assert!(matches!(split_verdict(&[b, a, a]), Err(Error::AsymmetricSplit { pe: 1 })));
        // The same numbers in another kind of split, or over another parent.
        assert!(matches!(split_verdict(&[a, split_words(TWO_D, [0, 1, 2], 0)]), Err(Error::AsymmetricSplit { pe: 1 })));
        assert!(matches!(
            split_verdict(&[a, split_words(STRIDED, [0, 1, 2], 3)]),
            Err(Error::AsymmetricSplit { pe: 1 })
        ));
        // A member that made another kind of exchange at this step (its words after a 2-D split).
        let made = split_words(SPLIT_2D_MADE, [1, 1, 0], 0);
        assert!(matches!(split_verdict(&[a, made]), Err(Error::AsymmetricSplit { pe: 1 })));
        let e = Error::AsymmetricSplit { pe: 1 };
        assert_eq!(
            e.to_string(),
            "the members of the parent team made different team splits (member 1's differs from member 0's); no team was created on any member"
        );
    }

    #[test]
    fn splits_outside_the_team_are_refused() {
        let refused = |start, stride, size, n_pes| {
            let e = split_args(start, stride, size, n_pes).unwrap_err();
            assert!(
                matches!(e, Error::InvalidSplit { start: s, stride: t, size: z, n_pes: n } if (s, t, z, n) == (start, stride, size, n_pes)),
                "{e:?}"
            );
        };
        refused(4, 1, 1, 4);
        refused(0, 2, 3, 4);
        refused(1, usize::MAX, 2, 4);
        refused(usize::MAX, 1, 2, 4);
        refused(0, 1, 0, 4);
        refused(0, 0, 2, 4);
        // Inside a (hypothetical) team, but past C's int.
        refused(1 << 31, 1, 1, usize::MAX);
        refused(0, 1 << 31, 2, usize::MAX);
        refused(0, 1, (1 << 31) + 1, usize::MAX);
        let e = split_args(4, 1, 1, 4).unwrap_err();
        assert_eq!(e.to_string(), "team split <start 4, stride 1, size 1> does not fit a parent team of 4 PEs");
    }
}
