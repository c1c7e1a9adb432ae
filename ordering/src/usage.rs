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

/// Something a captured call uses besides device memory (a communicator, a team, an NVSHMEM
/// runtime, a module, a custom operator), named by its kind and the address of the Rust value:
/// a graph must keep a borrow of that very value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    kind: &'static str,
    id: usize,
}

impl Resource {
    /// The resource `value`, of kind `kind`.
    pub fn of<R: ?Sized>(kind: &'static str, value: &R) -> Self {
        Resource { kind, id: value as *const R as *const () as usize }
    }

    /// What it is.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}
