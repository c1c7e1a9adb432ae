//! How a call uses what it touches: device memory it reads or writes ([`Use`]), the resources it
//! needs kept ([`Resource`]), and how the call is being prepared (`Mode`). The vocabulary the
//! access, capture, tracker and graph modules share, below all of them.

/// How a call uses a buffer: reads may overlap on several streams, a write excludes every other
/// use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Use {
    /// The call only reads the memory.
    Read,
    /// The call writes (and may read) the memory.
    Write,
}

/// What a call on a stream does with its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The work runs when the stream reaches it: uses are ordered now.
    Eager,
    /// The work is captured by this thread's scope: uses are recorded for the graph, whose launch
    /// orders them.
    Captured,
    /// Only the addresses are wanted (a graph listing what it keeps): nothing is ordered.
    Survey,
}

/// The element type of the buffer a use was made through, as graphs compare it (its name, size
/// and alignment): the captured calls write their own type's bytes, so a graph plans a captured
/// use only into a kept buffer of the same type. A buffer of another type at the same address
/// (swapped in through `Graph::kept_mut`, or inside the capture's closure after the captured
/// buffer was freed) would have its elements written with bytes of the use's type: `bool`s with
/// `f32` bits.
#[derive(Clone, Copy)]
pub(crate) struct ElemType(&'static ElemInfo);

/// What [`ElemType`] compares, one constant per type: a captured use carries a reference to it
/// (one word, a constant address), so that a captured call moves and compares little more than
/// before it carried a type.
pub(crate) struct ElemInfo {
    size: usize,
    align: usize,
    name: fn() -> &'static str,
}

/// The [`ElemInfo`] of each type.
trait Described {
    const INFO: &'static ElemInfo;
}

impl<T> Described for T {
    const INFO: &'static ElemInfo =
        &ElemInfo { size: size_of::<T>(), align: align_of::<T>(), name: std::any::type_name::<T> };
}

impl PartialEq for ElemType {
    /// The same constant, or (a type's constant may be copied into several parts of a program)
    /// the same size, alignment and name.
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0) || self.same_type(other)
    }
}

impl ElemType {
    /// The element type `T`.
    #[inline]
    pub(crate) fn of<T>() -> Self {
        ElemType(<T as Described>::INFO)
    }

    #[cold]
    fn same_type(&self, other: &Self) -> bool {
        let (a, b) = (self.0, other.0);
        a.size == b.size && a.align == b.align && (a.name)() == (b.name)()
    }
}

impl Eq for ElemType {}

impl std::fmt::Debug for ElemType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str((self.0.name)())
    }
}

/// Something a captured call uses besides device memory (a communicator, a team, an NVSHMEM
/// runtime, a module, a custom operator), named by its kind and the address of the Rust value:
/// a graph must keep a borrow of that very value.
#[derive(Debug, Clone, Copy, Eq)]
pub struct Resource {
    kind: &'static str,
    id: usize,
    /// Made by [`Resource::numbered`]: a graph that keeps it when captured needs it kept.
    numbered: bool,
}

impl PartialEq for Resource {
    /// Same kind, number and origin; the kinds, static strings, are compared by address before
    /// their text (a captured call compares its resources with the scope's list each time).
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.numbered == other.numbered
            && (std::ptr::eq(self.kind, other.kind) || self.kind == other.kind)
    }
}

impl Resource {
    /// The resource `value`, of kind `kind`.
    pub fn of<R: ?Sized>(kind: &'static str, value: &R) -> Self {
        Resource { kind, id: value as *const R as *const () as usize, numbered: false }
    }

    /// The resource of kind `kind` numbered `serial`, for a value that can move (a graph may own
    /// it) and must not be taken for another one later made at the same place: a registration,
    /// which NCCL's captured kernels refer to by its handle, not by its memory. The caller makes
    /// `serial` unique to that value for the life of the process ([`Resource::next_serial`]).
    /// A graph whose keep set reports it when the graph is made counts it as used by the captured
    /// calls: a launch without it (the member replaced by another registration of the same
    /// memory) is refused with [`OrderError::ResourceNotKept`](crate::OrderError::ResourceNotKept).
    pub fn numbered(kind: &'static str, serial: usize) -> Self {
        Resource { kind, id: serial, numbered: true }
    }

    /// Made by [`Resource::numbered`].
    pub(crate) fn is_numbered(&self) -> bool {
        self.numbered
    }

    /// A number no earlier call returned in this process, for [`Resource::numbered`].
    pub fn next_serial() -> usize {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// What it is.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}
