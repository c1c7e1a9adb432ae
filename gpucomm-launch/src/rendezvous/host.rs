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
use crate::store::{Limits, StoreClient, StoreError, StoreServer};

/// How long a client waits before asking again when it reached a store that still serves rank
/// 0's previous rendezvous, or one that closed the connection before saying whose it is.
const STALE_PAUSE: Duration = Duration::from_millis(50);

/// Connections rank 0's store takes beyond one per rank: a rank's reconnection while its first
/// connection is still being closed, PyTorch clients of the job, strangers.
const SPARE_CONNECTIONS: usize = 64;
/// Keys one rank has in rank 0's store at most, with one to spare: its claim, rank 0's welcome of
/// it (with a job key, until the first barrier), its acknowledgement, and its arrivals at two
/// barriers (a rank may arrive at the next one before rank 0 has deleted the arrivals at the
/// last).
const STORE_KEYS_PER_RANK: usize = 6;
/// Keys beyond the ranks' own: the owner record, the start's random value, the completion, the
/// abort notice, barrier releases and broadcast values.
const SPARE_STORE_KEYS: usize = 1024;
/// Bytes of keys and values one rank has in rank 0's store, rounded up from at most 1369: a
/// claim (a key of up to 62 bytes, a record of up to 870), a welcome (65 + 32), an
/// acknowledgement (62 + 40) and two arrivals (87 + 32 each); see the test
/// `a_ranks_keys_fit_its_share_of_the_store`.
const STORE_BYTES_PER_RANK: usize = 1536;
/// Bytes beyond the ranks' own: room for eight broadcasts of the largest size between two
/// barriers, and the few keys of the whole job.
const SPARE_STORE_BYTES: usize = 8 << 20;
/// Descriptors rank 0's store uses besides one per connection: its listener, the two ends of its
/// waker, and rank 0's own client connection.
const OWN_DESCRIPTORS: usize = 4;

/// Binds the master port (see [`listen`]) and starts a store whose owner record says which job,
/// world size and rendezvous it serves, with limits that fit the world size ([`limits_for`]),
/// once this process may open a descriptor for every connection ([`ensure_descriptors`]);
/// returns it with the address rank 0 reaches it at. With a job key the store also holds this
/// start's random value (`start`, see `join`) from the first, so that no client can meet the
/// store without it.
pub(super) fn serve(plan: &Plan, start: Option<[u8; 16]>) -> Result<(StoreServer, SocketAddr), RendezvousError> {
    let world_size = plan.info.world_size;
    let limits = limits_for(world_size, &plan.options.store_limits);
    ensure_descriptors(world_size, limits.max_connections)?;
    let (listener, own) = listen(&plan.master)?;
    let mut owner = Owner {
        scope: plan.scope.hash.clone(),
        source: plan.scope.source.clone(),
        world_size: world_size as u32,
        instance: plan.instance,
        tag: None,
    };
    let record = owner.encode(plan.seal.as_ref(), Keys::OWNER);
    let mut initial = vec![(Keys::OWNER.as_bytes().to_vec(), record)];
    if let Some(start) = start {
        let key = Keys::new(&plan.scope.hash, plan.instance).start();
        initial.push((key.into_bytes(), start.to_vec()));
    }
    let server = StoreServer::start(listener, limits, initial)
        .map_err(|error| RendezvousError::Io { context: "rank 0: starting the store".into(), error })?;
    let port = server.local_addr().port();
    Ok((server, SocketAddr::new(own, port)))
}

/// The limits of rank 0's store for `world_size` ranks: `configured`, with `max_connections`,
/// `max_store_keys` and `max_store_bytes` raised to what the ranks hold (each rank keeps one
/// connection open for the whole rendezvous, and a connection that used the store, as a rank's
/// does from its claim on, is never evicted), never lowered. The others, `max_per_peer` among them, stay as configured.
fn limits_for(world_size: usize, configured: &Limits) -> Limits {
    let per_rank = |each: usize, spare: usize| world_size.saturating_mul(each).saturating_add(spare);
    Limits {
        max_connections: configured.max_connections.max(per_rank(1, SPARE_CONNECTIONS)),
        max_store_keys: configured.max_store_keys.max(per_rank(STORE_KEYS_PER_RANK, SPARE_STORE_KEYS)),
        max_store_bytes: configured.max_store_bytes.max(per_rank(STORE_BYTES_PER_RANK, SPARE_STORE_BYTES)),
        ..configured.clone()
    }
}

/// What rank 0 does about its file descriptor limit (`RLIMIT_NOFILE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Descriptors {
    /// The soft limit leaves room for every rank's connection and [`SPARE_CONNECTIONS`] more.
    Enough,
    /// Raise the soft limit to this, room for `max_connections` or as much as the hard limit
    /// allows (which is enough for every rank's connection).
    Raise(libc::rlim_t),
    /// Even the hard limit has no room for every rank's connection: at least this many
    /// descriptors are needed.
    TooFew(libc::rlim_t),
}

/// What to do about the limits `soft` and `hard` when `open` descriptors are open, for a store of
/// `world_size` ranks that takes at most `max_connections`.
fn plan_descriptors(
    open: usize,
    world_size: usize,
    max_connections: usize,
    soft: libc::rlim_t,
    hard: libc::rlim_t,
) -> Descriptors {
    let count = |connections: usize| {
        let n = open.saturating_add(connections).saturating_add(OWN_DESCRIPTORS);
        libc::rlim_t::try_from(n).unwrap_or(libc::rlim_t::MAX)
    };
    let needed = count(world_size);
    if soft >= count(world_size.saturating_add(SPARE_CONNECTIONS)) {
        Descriptors::Enough
    } else if hard < needed {
        Descriptors::TooFew(needed)
    } else {
        let target = count(max_connections).min(hard);
        if target > soft {
            Descriptors::Raise(target)
        } else {
            Descriptors::Enough
        }
    }
}

/// Descriptors this process has open: the entries of `/proc/self/fd` (`/dev/fd` where there is
/// no `/proc`), the one that reads them included; 0 when neither can be read.
fn open_descriptors() -> usize {
    ["/proc/self/fd", "/dev/fd"].into_iter().find_map(|dir| std::fs::read_dir(dir).ok()).map_or(0, Iterator::count)
}

/// Makes sure rank 0 can hold a descriptor for every rank's connection to its store: raises the
/// soft `RLIMIT_NOFILE` (within the hard limit) when it leaves no room for them, and fails at once
/// when the hard limit does not either (rather than after the join's timeout, with ranks turned
/// away).
fn ensure_descriptors(world_size: usize, max_connections: usize) -> Result<(), RendezvousError> {
    let open = open_descriptors();
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes one `rlimit`, and `limit` is a live local of that type.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        let error = io::Error::last_os_error();
        return Err(RendezvousError::Io { context: "rank 0: reading its file descriptor limit".into(), error });
    }
    let soft = limit.rlim_cur;
    match plan_descriptors(open, world_size, max_connections, soft, limit.rlim_max) {
        Descriptors::Enough => Ok(()),
        Descriptors::TooFew(needed) => {
            Err(RendezvousError::TooFewDescriptors { world_size, needed, hard_limit: limit.rlim_max, open })
        }
        Descriptors::Raise(target) => {
            limit.rlim_cur = target;
            // SAFETY: setrlimit(2) reads one `rlimit`, and `limit` is a live local of that type.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            // Where the raise is refused (a system cap below the hard limit), the soft limit may
            // still be enough for the ranks' own connections.
            match plan_descriptors(open, world_size, world_size, soft, soft) {
                Descriptors::TooFew(needed) => Err(RendezvousError::Io {
                    context: format!(
                        "rank 0 needs {needed} file descriptors for the store of {world_size} ranks, and raising \
                        its soft limit (RLIMIT_NOFILE) from {soft} to {target} failed; start it with a higher \
                        limit (`ulimit -n {target}`)"
                    ),
                    error,
                }),
                _ => Ok(()),
            }
        }
    }
}

/// Binds `MASTER_ADDR` when it is an IP address of this machine (so `127.0.0.1` keeps the store
/// local), or every interface: `0.0.0.0` (`::` for an IPv6 address) when it is an address this
/// machine does not have (as behind NAT), and both IPv6 and IPv4 when it is a host name, since
/// the other ranks may resolve it to addresses of either family (IPv4 only where this machine
/// has no IPv6). A loopback name (`localhost`, `*.localhost`: [`loopback_name`]) is bound on the
/// loopback address it resolves to, IPv4 first (the clients try each address of the name), so
/// that a job meant to stay on this machine is not served to the network. Returns the listener
/// and the address rank 0 reaches it at.
fn listen(master: &Master) -> Result<(TcpListener, IpAddr), RendezvousError> {
    let port = master.port;
    let bare = master.addr.trim_start_matches('[').trim_end_matches(']');
    if let Some(ip) = loopback_name(bare, port) {
        return Ok((bind(SocketAddr::new(ip, port))?, ip));
    }
    let Some(ip) = bare.parse::<IpAddr>().ok().or_else(|| ipv4_other_form(bare).map(IpAddr::V4)) else {
        let listener = match dual_stack(port) {
            Ok(listener) => listener,
            // This machine has no IPv6.
            Err(error) if matches!(error.raw_os_error(), Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)) => {
                bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))?
            }
            Err(error) => {
                return Err(RendezvousError::Bind {
                    addr: SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
                    error,
                })
            }
        };
        // Through the IPv4 side, which works also where IPv6 has no loopback address.
        return Ok((listener, IpAddr::V4(Ipv4Addr::LOCALHOST)));
    };
    let any = match ip {
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let listener = match TcpListener::bind(SocketAddr::new(ip, port)) {
        Err(error) if error.kind() == io::ErrorKind::AddrNotAvailable && ip != any => bind(SocketAddr::new(any, port))?,
        bound => bound.map_err(|error| RendezvousError::Bind { addr: SocketAddr::new(ip, port), error })?,
    };
    let wildcard = listener.local_addr().map_or(true, |bound| bound.ip().is_unspecified());
    let own = match ip {
        IpAddr::V4(_) if wildcard => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) if wildcard => IpAddr::V6(Ipv6Addr::LOCALHOST),
        _ => ip,
    };
    Ok((listener, own))
}

/// The loopback address to serve a loopback host name on: `localhost`, a name under `localhost.`
/// (RFC 6761 keeps them on the machine), `localhost.localdomain`, `ip6-localhost` or
/// `ip6-loopback`, when every address it resolves to is a loopback address (IPv4 first). Other
/// names get `None`, even where they resolve to loopback here: Debian maps the machine's own name
/// to `127.0.1.1`, which the other nodes of a job resolve to the machine's network address.
fn loopback_name(name: &str, port: u16) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let local = name == "localhost"
        || name.ends_with(".localhost")
        || matches!(name.as_str(), "localhost.localdomain" | "ip6-localhost" | "ip6-loopback");
    if !local {
        return None;
    }
    let ips: Vec<IpAddr> = (name.as_str(), port).to_socket_addrs().ok()?.map(|a| a.ip()).collect();
    if ips.is_empty() || !ips.iter().all(IpAddr::is_loopback) {
        return None;
    }
    ips.iter().find(|ip| ip.is_ipv4()).or(ips.first()).copied()
}

/// An IPv4 address written in one of the other numeric forms that the C resolver reads as one
/// (`inet_aton`: one to four parts, each decimal, octal after a leading `0` or hexadecimal after
/// `0x`, the last filling the bytes left: `127.1`, `2130706433`, `0x7f.0.0.1`, `127.0.0.01`), which
/// Rust's parser refuses. The other ranks' resolver reads them as that address, so rank 0 must
/// too: taken for a host name, `127.1` was served on every interface.
fn ipv4_other_form(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let mut value: u32 = 0;
    for (i, part) in parts.iter().enumerate() {
        let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            Some(hex) => (hex, 16),
            None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
            None => (*part, 10),
        };
        if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        let number = u32::from_str_radix(digits, radix).ok()?;
        let last = i + 1 == parts.len();
        // The last part fills the bytes the earlier ones left; each earlier part is one byte.
        let bits = if last { 32 - 8 * i as u32 } else { 8 };
        if bits < 32 && number >> bits != 0 {
            return None;
        }
        value |= if last { number } else { number << (24 - 8 * i as u32) };
    }
    Some(Ipv4Addr::from(value))
}

fn bind(addr: SocketAddr) -> Result<TcpListener, RendezvousError> {
    TcpListener::bind(addr).map_err(|error| RendezvousError::Bind { addr, error })
}

/// A listener on `[::]:port` that takes IPv4 connections too (`IPV6_V6ONLY` off, whatever the
/// system's default), with `SO_REUSEADDR` as `TcpListener::bind` sets it.
fn dual_stack(port: u16) -> io::Result<TcpListener> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let check = |rc: libc::c_int| if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) };
    // SAFETY: socket(2) takes no pointers.
    let raw = check(unsafe { libc::socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a descriptor socket(2) just returned, which nothing else owns; `fd`
    // closes it on every path.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let set = |level, name, value: libc::c_int| {
        // SAFETY: the value points to a live `c_int` of the length passed; the descriptor is
        // open (owned by `fd`).
        check(unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                name,
                (&raw const value).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
    };
    set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
    set(libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    let addr = libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: port.to_be(),
        sin6_flowinfo: 0,
        sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
        sin6_scope_id: 0,
    };
    let len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    // SAFETY: `addr` is a live `sockaddr_in6` of the length passed; the descriptor is open.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
    // SAFETY: the descriptor is an open, bound socket.
    check(unsafe { libc::listen(fd.as_raw_fd(), libc::SOMAXCONN) })?;
    Ok(TcpListener::from(fd))
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

#[cfg(test)]
mod tests {
    use std::net::TcpStream;

    use super::super::process::Claimant;
    use super::super::process::Identity;
    use super::super::record::Claim;
    use super::super::seal::{Seal, TAG_LEN};
    use super::*;
    use crate::rendezvous::JobKey;
    use crate::MAX_WORLD_SIZE;

    #[test]
    fn a_ranks_keys_fit_its_share_of_the_store() {
        // The longest of everything: the scope hash (16 hex digits), the instance and the
        // operation number (20 digits each), the rank (7), host, address and boot id (cut to 255
        // bytes), and a MAC on every value.
        let keys = Keys::new("0123456789abcdef", u64::MAX);
        let rank = MAX_WORLD_SIZE - 1;
        let seal = Seal::new(&JobKey::new(vec![7; 32]).unwrap(), "0123456789abcdef");
        let who = Claimant {
            host: "h".repeat(300),
            pid: u32::MAX,
            addr: "a".repeat(300),
            id: Identity { boot: "b".repeat(300), pidns: u64::MAX, started: u64::MAX },
        };
        let mut claim = Claim {
            rank: rank as u32,
            world_size: MAX_WORLD_SIZE as u32,
            who,
            nonce: [1; 16],
            start: [2; 16],
            tag: None,
        };
        let label = keys.claim(rank);
        let claim_len = claim.encode(Some(&seal), &label).len();
        assert_eq!((label.len(), claim_len), (62, 870));
        let welcome = keys.welcome(rank).len() + TAG_LEN;
        let acknowledgement = keys.done(rank).len() + 8 + TAG_LEN;
        let arrival = keys.arrive(u64::MAX, rank).len() + TAG_LEN;
        assert_eq!((welcome, acknowledgement, arrival), (97, 102, 119));
        let total = label.len() + claim_len + welcome + acknowledgement + 2 * arrival;
        assert_eq!(total, 1369);
        assert!(total <= STORE_BYTES_PER_RANK);
    }

    #[test]
    fn the_store_limits_grow_with_the_world_size_and_never_shrink() {
        let defaults = Limits::default();
        // Small jobs keep the defaults.
        assert_eq!(limits_for(8, &defaults), defaults);
        let big = limits_for(1025, &defaults);
        assert_eq!(big, Limits { max_connections: 1089, ..defaults.clone() });
        let huge = limits_for(MAX_WORLD_SIZE, &defaults);
        let (keys, bytes) = (6_292_480, 1_619_001_344);
        assert_eq!(
            huge,
            Limits { max_connections: 1_048_640, max_store_keys: keys, max_store_bytes: bytes, ..defaults.clone() }
        );
        // What the user set higher stays, and so does every other limit.
        let mine = Limits {
            max_connections: 5000,
            max_store_keys: 10_000_000,
            max_store_bytes: 1 << 34,
            max_per_peer: 3,
            max_pending: 7,
            ..defaults.clone()
        };
        assert_eq!(limits_for(1025, &mine), mine);
        let lower = Limits { max_connections: 10, max_store_keys: 10, max_store_bytes: 10, ..defaults };
        assert_eq!(
            limits_for(2000, &lower),
            Limits { max_connections: 2064, max_store_keys: 13_024, max_store_bytes: 11_460_608, ..lower.clone() }
        );
    }

    #[test]
    fn the_descriptor_limit_is_raised_when_the_ranks_need_it() {
        // 20 open, 1025 ranks, a store of at most 1089 connections: 1049 needed at least, 1113
        // for every connection the store takes.
        let plan = |soft, hard| plan_descriptors(20, 1025, 1089, soft, hard);
        assert_eq!(plan(1024, 1024), Descriptors::TooFew(1049));
        assert_eq!(plan(1024, 1048), Descriptors::TooFew(1049));
        assert_eq!(plan(1024, 1049), Descriptors::Raise(1049));
        assert_eq!(plan(1024, 524_288), Descriptors::Raise(1113));
        assert_eq!(plan(1024, libc::RLIM_INFINITY), Descriptors::Raise(1113));
        // Room for every rank and 64 more: left alone.
        assert_eq!(plan(1113, 1113), Descriptors::Enough);
        assert_eq!(plan(1112, 2000), Descriptors::Raise(1113));
        assert_eq!(plan(libc::RLIM_INFINITY, libc::RLIM_INFINITY), Descriptors::Enough);
        // Short of the spare connections, but the hard limit allows no more: go on.
        assert_eq!(plan(1100, 1100), Descriptors::Enough);
        // A small job under a low limit is left alone; the default 1024 connections do not
        // count as needed.
        assert_eq!(plan_descriptors(20, 8, 1024, 1024, 1024), Descriptors::Enough);
        assert_eq!(plan_descriptors(20, 8, 1024, 80, 4096), Descriptors::Raise(1048));
    }

    fn master(addr: &str) -> Master {
        Master { addr: addr.into(), port: 0 }
    }

    fn reaches(ip: IpAddr, port: u16) -> bool {
        TcpStream::connect_timeout(&SocketAddr::new(ip, port), Duration::from_secs(2)).is_ok()
    }

    /// This machine's own name, where it resolves.
    fn own_name() -> Option<String> {
        use std::net::ToSocketAddrs;
        let mut buf = [0u8; 256];
        // SAFETY: the pointer and length describe `buf`, which lives across the call.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|&b| b == 0)?;
        let name = std::str::from_utf8(&buf[..end]).ok()?.to_string();
        let resolves = (name.as_str(), 0).to_socket_addrs().is_ok_and(|mut a| a.next().is_some());
        (rc == 0 && !name.is_empty() && loopback_name(&name, 0).is_none() && resolves).then_some(name)
    }

    #[test]
    fn a_host_name_is_served_on_both_families() {
        // The other ranks may resolve the name to IPv6 addresses only: an IPv4 wildcard would
        // refuse them. (Even where the name resolves to 127.0.1.1 here, as Debian's does: other
        // nodes resolve it to the network address.)
        let Some(name) = own_name() else {
            eprintln!("this machine's name does not resolve: the test did not run");
            return;
        };
        let (listener, own) = listen(&master(&name)).unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(own, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(reaches(own, port));
        if TcpListener::bind("[::1]:0").is_ok() {
            assert_eq!(listener.local_addr().unwrap().ip(), IpAddr::V6(Ipv6Addr::UNSPECIFIED));
            assert!(reaches(IpAddr::V6(Ipv6Addr::LOCALHOST), port));
        } else {
            assert_eq!(listener.local_addr().unwrap().ip(), IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            eprintln!("this machine has no IPv6 loopback: the IPv6 half of this test did not run");
        }
    }

    #[test]
    fn localhost_is_served_on_loopback_only() {
        // A job told MASTER_ADDR=localhost means to stay on this machine: nothing on the network
        // may reach its store.
        let (listener, own) = listen(&master("localhost")).unwrap();
        let bound = listener.local_addr().unwrap();
        assert!(bound.ip().is_loopback(), "bound {bound}");
        assert_eq!(own, bound.ip());
        assert!(reaches(own, bound.port()));
        let (listener, _) = listen(&master("LocalHost.")).unwrap();
        assert!(listener.local_addr().unwrap().ip().is_loopback());
        assert_eq!(loopback_name("db.example.com", 0), None);
        assert_eq!(loopback_name("localhostx", 0), None);
    }

    /// Session 29 audit: `MASTER_ADDR=127.1` (or `2130706433`, `127.0.0.01`), which the other
    /// ranks' resolver reads as 127.0.0.1, was taken for a host name and served on every
    /// interface. Now every numeric form the C resolver reads is that address here too.
    #[test]
    fn a_loopback_address_in_another_numeric_form_is_served_on_loopback_only() {
        for form in ["127.1", "2130706433", "127.0.0.01", "0x7f.0.0.1", "0177.0.1"] {
            assert_eq!(ipv4_other_form(form), Some(Ipv4Addr::LOCALHOST), "{form}");
            let (listener, own) = listen(&master(form)).unwrap();
            let bound = listener.local_addr().unwrap();
            assert_eq!(bound.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST), "{form}: bound {bound}");
            assert_eq!(own, IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        assert_eq!(ipv4_other_form("10.1.2"), Some(Ipv4Addr::new(10, 1, 0, 2)));
        assert_eq!(ipv4_other_form("1.2.3.4"), Some(Ipv4Addr::new(1, 2, 3, 4)));
        for name in ["node7", "127.1.x", "256.1", "1.2.3.4.5", "127..1", "", "09", "+1", "1.65536.0", "0x"] {
            assert_eq!(ipv4_other_form(name), None, "{name}");
        }
    }

    #[test]
    fn an_address_of_this_machine_is_bound_as_given_and_another_on_every_interface() {
        let (listener, own) = listen(&master("127.0.0.1")).unwrap();
        assert_eq!(listener.local_addr().unwrap().ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(own, IpAddr::V4(Ipv4Addr::LOCALHOST));
        // 192.0.2.1 is reserved for documentation: no machine has it (as behind NAT).
        let (listener, own) = listen(&master("192.0.2.1")).unwrap();
        assert_eq!(listener.local_addr().unwrap().ip(), IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        assert_eq!(own, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(reaches(own, listener.local_addr().unwrap().port()));
    }
}
