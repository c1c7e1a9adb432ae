//! [`StoreMode::Rank0`](super::StoreMode::Rank0): rank 0 hosts the store, with an owner record
//! that tells clients whose store it is, and the clients check it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::time::Duration;

use super::plan::{connect_error, Keys, Plan};
use super::record::{verified, Owner, Printable};
use super::RendezvousError;
use crate::deadline::Deadline;
use crate::env::Master;
use crate::store::{StoreClient, StoreError, StoreServer};

/// How long a client waits before asking again when it reached a store that still serves rank
/// 0's previous rendezvous, or one that closed the connection before saying whose it is.
const STALE_PAUSE: Duration = Duration::from_millis(50);

/// Binds the master port (see [`listen`]) and starts a store whose owner record says which job,
/// world size and rendezvous it serves.
pub(super) fn serve(plan: &Plan) -> Result<StoreServer, RendezvousError> {
    let listener = listen(&plan.master)?;
    let mut owner = Owner {
        scope: plan.scope.hash.clone(),
        source: plan.scope.source.clone(),
        world_size: plan.info.world_size as u32,
        instance: plan.instance,
        tag: None,
    };
    let record = owner.encode(plan.seal.as_ref(), Keys::OWNER);
    let initial = vec![(Keys::OWNER.as_bytes().to_vec(), record)];
    StoreServer::start(listener, plan.options.store_limits.clone(), initial)
        .map_err(|error| RendezvousError::Io { context: "rank 0: starting the store".into(), error })
}

/// Binds `MASTER_ADDR` when it is an IP address of this machine (so `127.0.0.1` keeps the store
/// local); every interface (`0.0.0.0`, or `::` for an IPv6 address) when it is a host name or an
/// address this machine does not have (as behind NAT).
fn listen(master: &Master) -> Result<TcpListener, RendezvousError> {
    let port = master.port;
    let ip = master.addr.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
    let any = match ip {
        Some(IpAddr::V6(_)) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
        _ => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
    };
    let addr = ip.map_or(any, |ip| SocketAddr::new(ip, port));
    match TcpListener::bind(addr) {
        Ok(listener) => Ok(listener),
        Err(error) if error.kind() == io::ErrorKind::AddrNotAvailable && addr != any => {
            TcpListener::bind(any).map_err(|error| RendezvousError::Bind { addr: any, error })
        }
        Err(error) => Err(RendezvousError::Bind { addr, error }),
    }
}

/// Where rank 0 reaches its own store: the bound address, loopback for a wildcard.
pub(super) fn loopback(bound: SocketAddr) -> SocketAddr {
    match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), bound.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), bound.port()),
        _ => bound,
    }
}

/// Connects to rank 0's store and checks that it is this job's and serves this rendezvous;
/// waits (reconnecting) while it still serves rank 0's previous one, or closes the connection
/// before saying whose it is (what rank 0's previous store does once its last client is done).
pub(super) fn join(plan: &Plan) -> Result<StoreClient, RendezvousError> {
    let (master, deadline, instance) = (&plan.master, plan.deadline, plan.instance);
    loop {
        let limits = plan.options.store_limits.clone();
        let mut client = StoreClient::connect_by(&master.addr, master.port, deadline, plan.options.timeout, limits)
            .map_err(|e| connect_error(master, e))?;
        let not_yet = match check_owner(&mut client, plan)? {
            Owned::Ours => return Ok(client),
            Owned::Earlier(theirs) => wrong(
                master,
                format!(
                    "still serves rank 0's rendezvous #{theirs}, and this process waits for #{instance}: rank 0 did \
                     not start this rendezvous in time"
                ),
            ),
            Owned::Closed(error) => error,
        };
        drop(client);
        if deadline.passed() {
            return Err(not_yet);
        }
        std::thread::sleep(STALE_PAUSE);
    }
}

enum Owned {
    Ours,
    /// Rank 0's earlier rendezvous (its store is still up, waiting for slow clients).
    Earlier(u64),
    /// The store closed the connection before it said whose it is: rank 0's earlier store
    /// shutting down, or rank 0 gone (then the next connection is refused).
    Closed(RendezvousError),
}

fn wrong(master: &Master, detail: String) -> RendezvousError {
    RendezvousError::WrongStore { master: master.clone(), detail }
}

fn check_owner(client: &mut StoreClient, plan: &Plan) -> Result<Owned, RendezvousError> {
    let (master, scope, deadline, instance) = (&plan.master, &plan.scope, plan.deadline, plan.instance);
    let (world_size, seal) = (plan.info.world_size, plan.seal.as_ref());
    let during = "checking whose store it is";
    let store_error =
        |error| RendezvousError::Store { master: master.clone(), during: during.into(), error: Box::new(error) };
    let record = match read_owner(client, deadline) {
        Ok(record) => record,
        Err(error) if error.is_closed() => return Ok(Owned::Closed(store_error(error))),
        Err(error) => return Err(store_error(error)),
    };
    let Some(record) = record else {
        return Err(wrong(
            master,
            "is not a gpucomm rank 0's store (it has no owner record). If torchrun's agent hosts it, \
             TORCHELASTIC_USE_AGENT_STORE=True is missing from this process's environment; to join a store that \
             someone else hosts (a Python TCPStore(is_master=True)), set GPUCOMM_STORE=external"
                .to_string(),
        ));
    };
    let Some((owner, body)) = Owner::decode(&record) else {
        return Err(wrong(master, "has an owner record this version cannot read (another gpucomm version?)".into()));
    };
    if owner.scope != scope.hash {
        return Err(wrong(
            master,
            format!(
                "belongs to another job: its identity comes from {} (hash {}), this process's from {} (hash {}). Two \
                 jobs use the same MASTER_ADDR:MASTER_PORT: give each job its own port{}",
                Printable(&owner.source),
                Printable(&owner.scope),
                scope.source,
                scope.hash,
                scope.hint()
            ),
        ));
    }
    if owner.world_size as usize != world_size {
        return Err(wrong(
            master,
            format!(
                "serves a job of world size {}, and this process was started with world size {world_size}; start \
                 every rank with the same world size{}",
                owner.world_size,
                scope.hint()
            ),
        ));
    }
    match (seal.is_some(), owner.tag.is_some()) {
        (true, false) => {
            return Err(wrong(
                master,
                "serves a job without GPUCOMM_JOB_KEY, and this process has one: give every rank the same key".into(),
            ))
        }
        (false, true) => {
            return Err(wrong(
                master,
                "serves a job with GPUCOMM_JOB_KEY, and this process has none: give every rank the same key".into(),
            ))
        }
        _ => {}
    }
    if verified(seal, Keys::OWNER, body, owner.tag.as_ref()) == Some(false) {
        return Err(wrong(
            master,
            "has an owner record that is not signed with this process's GPUCOMM_JOB_KEY: rank 0 has another key, \
             or the record was forged"
                .into(),
        ));
    }
    match owner.instance.cmp(&instance) {
        std::cmp::Ordering::Equal => Ok(Owned::Ours),
        std::cmp::Ordering::Less => Ok(Owned::Earlier(owner.instance)),
        std::cmp::Ordering::Greater => Err(wrong(
            master,
            format!(
                "serves rank 0's rendezvous #{}, and this process is at #{instance}: rank 0 has moved past the \
                 rendezvous this process was meant to join (it came too late, or its process made fewer \
                 Rendezvous::connect calls than rank 0's)",
                owner.instance
            ),
        )),
    }
}

/// The store's owner record; `None` when it has none.
fn read_owner(client: &mut StoreClient, deadline: Deadline) -> Result<Option<Vec<u8>>, StoreError> {
    if !client.check_by(&[Keys::OWNER], deadline)? {
        return Ok(None);
    }
    client.get_by(Keys::OWNER, deadline).map(Some)
}
