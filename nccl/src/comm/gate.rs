//! NCCL's host nodes in captured graphs, behind a gate that a revoke closes.
//!
//! A captured NCCL call whose plan has proxy work (network and other proxy transports) puts a
//! host node before its kernel: NCCL's callback that writes the call's operations into the
//! proxy's pools and wakes the proxy. `ncclCommRevoke` stops the proxy and unmaps those pools
//! (`ncclProxyStop`), but a graph launch enqueued before the revoke (queued behind other work, or
//! a graph of several calls whose first kernel hung and is stopped by the revoke) still runs its
//! later host nodes afterwards, into the unmapped pools.
//!
//! So when a capture that holds a communicator ends ([`gpucomm_ordering::Hold::captured`]), every
//! host node of the graph whose function lies in the loaded NCCL library is rewritten to call
//! [`gated`] instead, with a [`Gated`] that names NCCL's function, its argument and the graph's
//! [`Gate`]. The gate is registered with each communicator the graph holds ([`Gates`]), which
//! closes it before revoking. A host node that runs after that skips NCCL's callback; its kernel
//! then finds no proxy work, as any call after a revoke, and waits until the communicator is
//! aborted or destroyed (NCCL's teardown sets the abort flag that ends it). The [`Gated`] values
//! are owned by a CUDA user object retained by the graph, so they live as long as any launch of
//! it, past the graph's destruction.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockWriteGuard, TryLockError, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::{sys, DriverError};

/// How long closing the gates waits for host nodes inside NCCL's callback (which takes
/// microseconds unless the proxy is stuck).
pub(crate) const HOST_NODE_WAIT: Duration = Duration::from_secs(1);

/// Whether the NCCL host nodes of one graph may still call NCCL: open until a communicator the
/// graph holds is revoked.
#[derive(Debug)]
pub(crate) struct Gate {
    open: RwLock<bool>,
}

impl Gate {
    fn new() -> Self {
        Gate { open: RwLock::new(true) }
    }

    /// The gate, for closing, once no host node runs NCCL's callback behind it (each holds it
    /// open while the callback runs); `None` while one does.
    fn try_lock(&self) -> Option<RwLockWriteGuard<'_, bool>> {
        match self.open.try_write() {
            Ok(open) => Some(open),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// The gates of the graphs that hold one communicator's work (held weakly: a graph's gate goes
/// with its last launch).
#[derive(Debug, Default)]
pub(crate) struct Gates(Mutex<Vec<Weak<Gate>>>);

impl Gates {
    /// Adds `gate`, forgetting the gates that are gone.
    fn add(&self, gate: &Arc<Gate>) {
        let mut gates = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        gates.retain(|g| g.strong_count() > 0);
        if !gates.iter().any(|g| std::ptr::eq(g.as_ptr(), Arc::as_ptr(gate))) {
            gates.push(Arc::downgrade(gate));
        }
    }

    /// Closes every gate, so that from now on no host node of a graph holding this
    /// communicator calls NCCL: called before `ncclCommRevoke`. A host node inside NCCL's
    /// callback holds its gate open; one that is still inside after `within` (NCCL's callback
    /// waits for room in the proxy's pools, which a stuck proxy may never make) leaves every
    /// gate open and gives `false`: the communicator must not be revoked then.
    pub(crate) fn close(&self, within: Duration) -> bool {
        let mut gates = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        gates.retain(|g| g.strong_count() > 0);
        let live: Vec<Arc<Gate>> = gates.iter().filter_map(Weak::upgrade).collect();
        let start = Instant::now();
        let mut closing = Vec::with_capacity(live.len());
        for gate in &live {
            loop {
                if let Some(open) = gate.try_lock() {
                    closing.push(open);
                    break;
                }
                if start.elapsed() >= within {
                    return false;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        for mut open in closing {
            *open = false;
        }
        gates.clear();
        true
    }
}

/// One rewritten host node: NCCL's callback and its argument, and the graph's gate.
pub(crate) struct Gated {
    run: sys::CUhostFn,
    data: *mut c_void,
    gate: Arc<Gate>,
}

// SAFETY: `data` is NCCL's argument for `run`, which CUDA hands to whichever thread runs the
// host node; this type only carries it there, as the graph node did.
unsafe impl Send for Gated {}
// SAFETY: as above; `data` is never dereferenced here, only passed to `run`.
unsafe impl Sync for Gated {}

/// The host function of a rewritten node: runs NCCL's callback while the gate is open.
///
/// # Safety
///
/// `gated` points at a live [`Gated`] (the graph's user object owns it while any launch runs).
pub(crate) unsafe extern "C" fn gated(gated: *mut c_void) {
    // SAFETY: the caller's contract: a live `Gated`, only read here.
    let gated = unsafe { &*(gated as *const Gated) };
    let open = gated.gate.open.read().unwrap_or_else(PoisonError::into_inner);
    if *open {
        if let Some(run) = gated.run {
            // SAFETY: NCCL's own callback with the argument NCCL captured for it, run where the
            // graph ran it; the gate is open (held so until it returns), so no revoke has
            // stopped the proxy it feeds.
            unsafe { run(gated.data) };
        }
    }
}

/// Gates the NCCL host nodes of `graph` (and of its child graphs) for a communicator whose gates
/// are `gates`: nodes already gated (by another communicator the graph holds) keep their gate,
/// which `gates` adds. `in_nccl` tells NCCL's functions from others (which are left alone).
pub(crate) fn gate_host_nodes(
    graph: sys::CUgraph,
    gates: &Gates,
    in_nccl: impl Fn(*const c_void) -> bool,
) -> Result<(), DriverError> {
    let mut nodes = Vec::new();
    host_nodes(graph, &mut nodes)?;
    let mut gate = None;
    let mut wrap = Vec::new();
    for (node, params) in nodes {
        match params.fn_ {
            Some(f) if std::ptr::fn_addr_eq(f, gated as unsafe extern "C" fn(*mut c_void)) => {
                // SAFETY: a node whose function is `gated` was rewritten by this module, with a
                // `Gated` owned by a user object this graph retains.
                let existing = unsafe { &*(params.userData as *const Gated) };
                gate.get_or_insert_with(|| existing.gate.clone());
            }
            Some(f) if in_nccl(f as *const c_void) => wrap.push((node, params)),
            _ => {}
        }
    }
    let gate = gate.unwrap_or_else(|| Arc::new(Gate::new()));
    gates.add(&gate);
    if wrap.is_empty() {
        return Ok(());
    }
    // A boxed slice: its elements stay where they are while the box moves.
    let owned: Box<[Gated]> =
        wrap.iter().map(|(_, p)| Gated { run: p.fn_, data: p.userData, gate: gate.clone() }).collect();
    let targets: Vec<*mut c_void> = owned.iter().map(|g| g as *const Gated as *mut c_void).collect();
    retain_in(graph, owned)?;
    for ((node, _), data) in wrap.iter().zip(targets) {
        let params = sys::CUDA_HOST_NODE_PARAMS { fn_: Some(gated), userData: data };
        // SAFETY: `node` is a host node of the live graph, not yet instantiated; `data` is a
        // `Gated` owned by a user object the graph now retains, so it lives as long as any launch.
        unsafe { sys::cuGraphHostNodeSetParams(*node, &params) }.result()?;
    }
    Ok(())
}

/// Every host node of `graph` and of its child graphs, with its parameters.
fn host_nodes(
    graph: sys::CUgraph,
    out: &mut Vec<(sys::CUgraphNode, sys::CUDA_HOST_NODE_PARAMS)>,
) -> Result<(), DriverError> {
    use sys::CUgraphNodeType::{CU_GRAPH_NODE_TYPE_GRAPH, CU_GRAPH_NODE_TYPE_HOST};
    let mut count = 0;
    // SAFETY: `graph` is alive (the caller's); a null array asks for the count only.
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) }.result()?;
    if count == 0 {
        // CUDA refuses a second call with an array and a count of 0 (see gpucomm-ordering).
        return Ok(());
    }
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: the array holds `count` nodes; CUDA writes at most that many and says how many.
    unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }.result()?;
    nodes.truncate(count);
    for node in nodes {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` is a node of the live graph; CUDA writes its type.
        unsafe { sys::cuGraphNodeGetType(node, &mut kind) }.result()?;
        if kind == CU_GRAPH_NODE_TYPE_HOST {
            let mut params = sys::CUDA_HOST_NODE_PARAMS { fn_: None, userData: std::ptr::null_mut() };
            // SAFETY: `node` is a host node of the live graph; CUDA writes its parameters.
            unsafe { sys::cuGraphHostNodeGetParams(node, &mut params) }.result()?;
            out.push((node, params));
        } else if kind == CU_GRAPH_NODE_TYPE_GRAPH {
            let mut child = std::ptr::null_mut();
            // SAFETY: `node` is a child-graph node of the live graph; CUDA writes the embedded
            // graph (not a copy: changes to it are the node's), which the node owns.
            unsafe { sys::cuGraphChildGraphNodeGetGraph(node, &mut child) }.result()?;
            host_nodes(child, out)?;
        }
    }
    Ok(())
}

/// Hands `owned` to a CUDA user object that `graph` retains (and every executable graph made
/// from it, until its last launch completes): the values live as long as any launch of the graph.
fn retain_in(graph: sys::CUgraph, owned: Box<[Gated]>) -> Result<(), DriverError> {
    /// The user object's destructor: drops the values.
    unsafe extern "C" fn release(owned: *mut c_void) {
        // SAFETY: `owned` is the box `retain_in` leaked into the user object, which CUDA
        // destroys once.
        drop(unsafe { Box::from_raw(owned as *mut Box<[Gated]>) });
    }
    let owned = Box::into_raw(Box::new(owned)) as *mut c_void;
    let mut object = std::ptr::null_mut();
    let flags = sys::CUuserObject_flags_enum::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32;
    // SAFETY: `release` frees `owned` and calls no CUDA function; one reference, which the graph
    // takes over below.
    if let Err(e) = unsafe { sys::cuUserObjectCreate(&mut object, owned, Some(release), 1, flags) }.result() {
        // SAFETY: CUDA did not take `owned`: it is still this function's.
        unsafe { release(owned) };
        return Err(e);
    }
    let flags = sys::CUuserObjectRetain_flags_enum::CU_GRAPH_USER_OBJECT_MOVE as u32;
    // SAFETY: `graph` is alive and `object` holds the one reference this moves into it.
    let retained = unsafe { sys::cuGraphRetainUserObject(graph, object, 1, flags) }.result();
    if retained.is_err() {
        // SAFETY: the reference was not moved: dropping it destroys the object (and `owned`).
        let _ = unsafe { sys::cuUserObjectRelease(object, 1) };
    }
    retained
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RAN: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn count(data: *mut c_void) {
        RAN.fetch_add(data as usize, Ordering::SeqCst);
    }

    #[test]
    fn a_gated_host_function_runs_until_a_revoke_closes_the_gates() {
        let gates = Gates::default();
        let gate = Arc::new(Gate::new());
        gates.add(&gate);
        gates.add(&gate);
        assert_eq!(gates.0.lock().unwrap().len(), 1, "a gate is registered once");
        let node = Gated { run: Some(count), data: 5 as *mut c_void, gate: gate.clone() };
        let data = &node as *const Gated as *mut c_void;
        // SAFETY: `data` is a live `Gated`.
        unsafe { gated(data) };
        assert_eq!(RAN.load(Ordering::SeqCst), 5, "open: NCCL's callback runs with its argument");
        {
            let _inside = gate.open.read().unwrap();
            assert!(!gates.close(Duration::from_millis(20)), "closed while a host node runs NCCL's callback");
        }
        // SAFETY: as above.
        unsafe { gated(data) };
        assert_eq!(RAN.load(Ordering::SeqCst), 10, "a close that gave up left the gate open");
        assert!(gates.close(Duration::from_millis(20)));
        // SAFETY: as above.
        unsafe { gated(data) };
        assert_eq!(RAN.load(Ordering::SeqCst), 10, "closed: the callback is skipped");
        assert!(gates.0.lock().unwrap().is_empty());
    }

    #[test]
    fn gates_that_are_gone_are_forgotten() {
        let gates = Gates::default();
        drop({
            let gone = Arc::new(Gate::new());
            gates.add(&gone);
            gone
        });
        let live = Arc::new(Gate::new());
        gates.add(&live);
        assert_eq!(gates.0.lock().unwrap().len(), 1);
        assert!(gates.close(Duration::ZERO));
        assert!(!*live.open.read().unwrap());
    }
}
