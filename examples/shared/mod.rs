//! What the example servers (`echo`, `kv`, `proxy`, `queue`) share: their flags, one `SO_REUSEPORT` listener per
//! shard behind a `ConnBalancer`, and the clients that drive a server and check its replies.

use std::{
    cell::Cell,
    error::Error,
    future::Future,
    net::SocketAddr,
    panic::AssertUnwindSafe,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, OnceLock,
    },
    time::Instant,
};

use futures::FutureExt as _;
use xtc::net::{ConnBalancer, TcpListener, TcpStream};

/// Shows xtc's log (warnings and errors by default; `RUST_LOG` sets it, e.g. `RUST_LOG=xtc=debug`)
/// on stderr: the runtime logs what a server operator needs to see, such as accept backing off
/// because the process ran out of descriptors ("raise RLIMIT_NOFILE"). Without a subscriber
/// those lines go nowhere. Cost: once, at start.
pub(crate) fn logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Err only if a subscriber is already installed (a test): that one stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

mod print;
pub(crate) use print::{err, out};

/// The flags: `--addr A --clients N` and one for the work each client does.
pub(crate) struct Args {
    pub(crate) addr: SocketAddr,
    pub(crate) clients: usize,
    pub(crate) per_client: usize,
    /// `--help` or `-h` was given: print the usage, run nothing.
    pub(crate) help: bool,
}

/// Parses the command line. `per_flag` names the work per client (`per_default` without it);
/// serving only (no `--clients`) and no `--addr` listens on `127.0.0.1:default_port`. With
/// `--help` (or `-h`) it prints the usage on stdout and exits with success.
pub(crate) fn parse(per_flag: &str, per_default: usize, default_port: u16) -> Result<Args, String> {
    let a = parse_from(args()?, per_flag, per_default, default_port)?;
    if a.help {
        let program = std::env::args_os()
            .next()
            .map(std::path::PathBuf::from)
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "example".into());
        out(format_args!(
            "{}",
            usage(&program, per_flag, per_default, default_port)
        ));
        std::process::exit(0);
    }
    Ok(a)
}

/// The command line's arguments after the program name, each as a `String`: an argument that
/// is not valid UTF-8 is an error naming it (`std::env::args` panicked on one).
pub(crate) fn args() -> Result<Vec<String>, String> {
    strings(std::env::args_os().skip(1))
}

/// [`args`] of `args`.
fn strings(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Vec<String>, String> {
    args.into_iter()
        .map(|a| {
            a.into_string()
                .map_err(|a| format!("the argument {a:?} is not valid UTF-8"))
        })
        .collect()
}

/// The text `--help` prints.
fn usage(program: &str, per_flag: &str, per_default: usize, default_port: u16) -> String {
    let per = format!("{per_flag} K");
    format!(
        "usage: {program} [--addr A] [--clients N] [{per}]\n\
         \n  --addr A      address to serve (default 127.0.0.1:{default_port}; with --clients,\
         \n                a free port on 127.0.0.1)\
         \n  --clients N   also run N clients against the server, check every reply, print\
         \n                per-shard stats and exit (default 0: serve until Ctrl-C)\
         \n  {per:<13} work per client (default {per_default})\
         \n  -h, --help    print this and exit\n\
         \nXTC_SHARDS sets the shard count, XTC_IO=epoll|io_uring the I/O driver and RUST_LOG the\
         \nlog level (default warn); see the xtc crate docs for every XTC_* variable."
    )
}

/// [`parse`] of `args` (without the program name).
fn parse_from(
    args: impl IntoIterator<Item = String>,
    per_flag: &str,
    per_default: usize,
    default_port: u16,
) -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.1:0".parse().expect("literal address"),
        clients: 0,
        per_client: per_default,
        help: false,
    };
    let mut addr_given = false;
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        if matches!(flag.as_str(), "--help" | "-h") {
            a.help = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"));
        // The errors say what the flag takes: std's alone ("invalid digit found in string",
        // "invalid socket address syntax") did not.
        let number = |v: Result<String, String>| -> Result<usize, String> {
            let v = v?;
            v.parse()
                .map_err(|e| format!("{flag} takes a whole number such as 1000, not {v:?} ({e})"))
        };
        match flag.as_str() {
            "--addr" => {
                let v = value?;
                a.addr = v.parse().map_err(|e| {
                    format!("--addr takes an IP address and port such as 127.0.0.1:7000 or [::1]:7000, not {v:?} ({e})")
                })?;
                addr_given = true;
            }
            "--clients" => a.clients = number(value)?,
            f if f == per_flag => a.per_client = number(value)?,
            other => {
                return Err(format!(
                    "unknown flag {other}; flags: --addr A --clients N {per_flag} K (--help \
                     says more)"
                ))
            }
        }
    }
    if a.clients == 0 && !addr_given {
        a.addr.set_port(default_port);
    }
    // The examples count the requests of all clients (kv: about 4 per unit of work): refuse
    // values whose total does not fit a counter rather than overflow at the end of the run.
    if a.clients
        .checked_mul(a.per_client)
        .and_then(|n| n.checked_mul(8))
        .is_none()
    {
        return Err(format!(
            "--clients {} x {per_flag} {} is more work than a counter holds; use smaller values",
            a.clients, a.per_client
        ));
    }
    Ok(a)
}

/// An executor from the environment (`XTC_SHARDS`, `XTC_IO`, ...), in service mode: it runs
/// until a stop. It may oversubscribe the CPUs (so `XTC_SHARDS=3` runs on two) unless
/// `XTC_OVERSUBSCRIBE=0` says otherwise: that default is set before the environment is read,
/// not after, which had overridden an explicit `XTC_OVERSUBSCRIBE=0`.
pub(crate) fn executor() -> xtc::Result<xtc::Executor> {
    xtc::Executor::builder()
        .oversubscribe(true)
        .env()?
        .service_mode(true)
        .build()
}

/// A server [`listen`] started: the address it serves, and the failure of a shard that could
/// not listen or accept.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    failure: Arc<OnceLock<String>>,
}

impl Server {
    /// `Err` with the first shard's failure, if one failed (which stopped the executor): check
    /// it once `run()` has returned, or a server that never served exits as a success.
    pub(crate) fn check(&self) -> Result<(), Box<dyn Error>> {
        match self.failure.get() {
            Some(e) => Err(e.clone().into()),
            None => Ok(()),
        }
    }
}

/// Has every shard of `exec` serve `addr` with `handler`: one `SO_REUSEPORT` listener per
/// shard, each connection handled on the shard with the fewest open ones. Port 0 picks a free
/// port; the address served is in the `Server` returned. Every listener is bound before this
/// returns (`TcpListener::bind_reuseport_many`), so a bind error comes back here and a client
/// that connects as soon as the address is printed waits in the backlog until `run()`; bound
/// by each shard once it ran, such a client was refused. A shard that cannot accept stops the
/// executor, and [`Server::check`] then says why.
pub(crate) fn listen<H, Fut>(
    exec: &xtc::Executor,
    addr: SocketAddr,
    handler: H,
) -> Result<Server, Box<dyn Error>>
where
    H: Fn(TcpStream, SocketAddr) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    serve_on(exec, claim(addr)?, handler)
}

/// The address to serve for `addr`: bound once without `SO_REUSEPORT` and let go, so that
/// port 0 becomes a free port, and a port that another server holds is refused here. Bound
/// only by the shards' `SO_REUSEPORT` listeners, a port that another process (a second copy of
/// the example, say) served with `SO_REUSEPORT` too was joined without a word, the kernel
/// splitting the connections between the two. An error names the address: alone, "Cannot
/// assign requested address" did not say which.
fn claim(addr: SocketAddr) -> Result<SocketAddr, String> {
    // A busy port is tried again for a second: a server that has just exited on io_uring may
    // hold its listeners a moment longer (the kernel tears its ring down, and the accepts in
    // it, after the process ends), and a restart at once was refused.
    let deadline = Instant::now() + std::time::Duration::from_secs(1);
    let bound = loop {
        match std::net::TcpListener::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => break r,
        }
    };
    bound.and_then(|l| l.local_addr()).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                ": another program serves that port; stop it or pick another --addr"
            }
            std::io::ErrorKind::AddrNotAvailable => {
                ": no interface of this machine has that address; give one it has \
                     (127.0.0.1, 0.0.0.0 for all, or see `ip addr`)"
            }
            _ => "",
        };
        format!("bind {addr}: {e}{hint}")
    })
}

/// [`listen`] on `addr` as it is, without [`claim`]ing it first.
fn serve_on<H, Fut>(
    exec: &xtc::Executor,
    addr: SocketAddr,
    handler: H,
) -> Result<Server, Box<dyn Error>>
where
    H: Fn(TcpStream, SocketAddr) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let balancer = ConnBalancer::new(exec.shard_count())?;
    let failure = Arc::new(OnceLock::new());
    // Every shard's listener bound now, before `run()`: the address is served (a client that
    // connects early waits in the backlog) once this returns and the caller prints it, and a
    // bind error comes back here.
    let listeners = TcpListener::bind_reuseport_many(addr, exec.shard_count())
        .map_err(|e| format!("bind {addr}: {e}"))?;
    for (shard, listener) in listeners.into_iter().enumerate() {
        let (balancer, handler) = (balancer.clone(), handler.clone());
        let failure = failure.clone();
        exec.spawn_on(shard, move || async move {
            let fail = |what: String| {
                err(format_args!("{what}"));
                let _ = failure.set(what);
                xtc::stop();
            };
            let listener = match TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => return fail(format!("shard {shard}: listen on {addr}: {e}")),
            };
            if let Err(e) = balancer.serve(listener, handler).await {
                fail(format!("shard {shard}: accept: {e}"));
            }
        })?;
    }
    Ok(Server { addr, failure })
}

/// Makes sure this process may open the descriptors that `clients` connections to its own
/// server take: `per_client` each (two for a client's end and the server's; a proxy's four
/// add its connection upstream and the upstream's end), a few per shard (its listener,
/// io_uring or epoll, eventfd) and some for the process. A soft `RLIMIT_NOFILE` below that is
/// raised to it where the hard limit allows; `Err` says what to do where it does not. Without
/// the room, the clients' connections used every descriptor, the server's accept failed with
/// EMFILE and backed off until descriptors freed up, and none did (the connected clients
/// waited for its replies): the run hung.
pub(crate) fn room_for(clients: usize, per_client: usize, shards: usize) -> Result<(), String> {
    // The shards' own descriptors and the process's, besides the clients'.
    let fixed = shards.saturating_mul(4).saturating_add(64);
    let need = clients.saturating_mul(per_client).saturating_add(fixed);
    let need = libc::rlim_t::try_from(need).unwrap_or(libc::RLIM_INFINITY);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through the pointer, which is valid and exclusive
    // for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Ok(()); // no limit to read: run, and let the server's warnings tell
    }
    let fits = |l: libc::rlim_t| l == libc::RLIM_INFINITY || l >= need;
    if fits(limit.rlim_cur) {
        return Ok(());
    }
    if fits(limit.rlim_max) {
        let raised = libc::rlimit {
            rlim_cur: need,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one `rlimit` through the pointer, valid for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(());
        }
    }
    // The most clients the hard limit leaves room for: raising the soft limit to it is all a
    // process may do without privilege, so `ulimit -n` of more than it is no advice.
    let most = |l: libc::rlim_t| {
        (usize::try_from(l).unwrap_or(usize::MAX)).saturating_sub(fixed) / per_client.max(1)
    };
    let advice = if need == libc::RLIM_INFINITY {
        format!("use fewer clients (at most {})", most(limit.rlim_max))
    } else if fits(limit.rlim_max) {
        format!("raise it with `ulimit -n {need}` or use fewer clients")
    } else {
        format!(
            "use at most {} clients, or raise the hard limit (as root, `ulimit -Hn {need}`, \
             or the `nofile` limit in /etc/security/limits.conf)",
            most(limit.rlim_max)
        )
    };
    Err(format!(
        "--clients {clients} needs about {need} file descriptors ({per_client} per client, as \
         the clients and the server run in this process), over this process's limit of {} \
         (hard limit {}): {advice}",
        limit.rlim_cur, limit.rlim_max
    ))
}

/// Makes sure `clients` connections to one address can each get a local port: every client
/// connects from its own port of the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), and past its size the extra clients' connects
/// failed one by one ("Cannot assign requested address"). `Ok` where the range cannot be read.
fn ports_for(clients: usize) -> Result<(), String> {
    let Ok(range) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return Ok(());
    };
    let mut ends = range.split_whitespace().map(str::parse::<usize>);
    let (Some(Ok(lo)), Some(Ok(hi))) = (ends.next(), ends.next()) else {
        return Ok(());
    };
    let ports = hi.saturating_add(1).saturating_sub(lo);
    if clients <= ports {
        return Ok(());
    }
    Err(format!(
        "--clients {clients} needs a local port each, and the kernel's ephemeral range \
         ({lo}-{hi}, net.ipv4.ip_local_port_range) has {ports}: use at most {ports} clients, or \
         widen the range (as root, `sysctl net.ipv4.ip_local_port_range=\"1024 65535\"`)"
    ))
}

/// How long one client of [`drive`] may go without progress (a [`Progress::add`]), and its
/// final check may take, before it counts as failed: a server that stops answering fails the
/// run instead of hanging it. Measured on progress, not on the whole run: a deadline on the
/// whole run failed long healthy runs (`--rounds 8000000`) and blamed the server.
const CLIENT_STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// A client's count of the work it has done (round trips, requests, bytes), which [`drive`]
/// reads: to tell a stalled client from a slow one, and for the total it returns, from which
/// the examples print their rates (work done, not work asked for: with clients failing, the
/// requested total overstated the rate). Cost per [`add`](Self::add): a cell update and a
/// relaxed atomic add on a counter all clients share.
#[derive(Clone)]
pub(crate) struct Progress {
    mine: Rc<Cell<u64>>,
    total: Arc<AtomicU64>,
}

impl Progress {
    /// Counts `n` more units of work done.
    pub(crate) fn add(&self, n: u64) {
        self.mine.set(self.mine.get() + n);
        self.total.fetch_add(n, Ordering::Relaxed);
    }
}

/// What [`drive`] measured.
pub(crate) struct Driven {
    /// Clients that failed (an error, a stall or a panic), those the executor stopped before
    /// they finished included (a server shard that failed stops it).
    pub(crate) failed: u64,
    /// The final check (`last`) failed, hung or panicked.
    pub(crate) check_failed: bool,
    /// Seconds from the first client's start to the run's end.
    pub(crate) secs: f64,
    /// The units of work the clients reported done ([`Progress`]).
    pub(crate) done: u64,
}

impl Driven {
    /// `Err` naming what failed: clients, the final check, or both.
    pub(crate) fn verdict(&self) -> Result<(), Box<dyn Error>> {
        let clients = |n: u64| match n {
            1 => "1 client failed".to_string(),
            n => format!("{n} clients failed"),
        };
        match (self.failed, self.check_failed) {
            (0, false) => Ok(()),
            (0, true) => Err("the final check failed".into()),
            (n, false) => Err(clients(n).into()),
            (n, true) => Err(format!("{}, and the final check failed", clients(n)).into()),
        }
    }
}

/// Runs `clients` clients on `exec` (pinned tasks spread over the shards), `client(id,
/// progress)` each, which counts its work on `progress`; the last one to finish runs `last()`
/// (a check of the server's state) and stops the executor. A client that reports no progress
/// for [`CLIENT_STALL`] fails. `Err` before any client starts if the process may not open the
/// descriptors they need, `per_client` each (see [`room_for`]).
pub(crate) fn drive<C, CF, L, LF>(
    exec: &xtc::Executor,
    clients: usize,
    per_client: usize,
    client: C,
    last: L,
) -> Result<Driven, Box<dyn Error>>
where
    C: Fn(usize, Progress) -> CF + Clone + Send + 'static,
    CF: Future<Output = std::io::Result<()>> + 'static,
    L: Fn() -> LF + Clone + Send + 'static,
    LF: Future<Output = Result<(), String>> + 'static,
{
    room_for(clients, per_client, exec.shard_count())?;
    ports_for(clients)?;
    let left = Arc::new(AtomicUsize::new(clients));
    let failed = Arc::new(AtomicU64::new(0));
    let check_failed = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    for id in 0..clients {
        let (left, failed, total) = (left.clone(), failed.clone(), total.clone());
        let check_failed = check_failed.clone();
        let (client, last) = (client.clone(), last.clone());
        exec.spawn_on(id % exec.shard_count(), move || async move {
            let progress = Progress {
                mine: Rc::new(Cell::new(0)),
                total,
            };
            // A panic in the client's code is a failed client: caught here, so that the count
            // below still goes down (past it, the run waited for that client for good).
            let mut work =
                std::pin::pin!(AssertUnwindSafe(client(id, progress.clone())).catch_unwind());
            // A server that stops answering fails the run instead of hanging it: the client
            // fails once a whole `CLIENT_STALL` passes without progress.
            let ended = loop {
                let seen = progress.mine.get();
                match xtc::time::timeout(CLIENT_STALL, work.as_mut()).await {
                    Ok(r) => break Some(r),
                    Err(_) if progress.mine.get() == seen => break None,
                    Err(_) => {}
                }
            };
            match ended {
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => {
                    err(format_args!("client {id}: {e}"));
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                Some(Err(panic)) => {
                    err(format_args!(
                        "client {id} panicked: {}",
                        panic_message(&*panic)
                    ));
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    err(format_args!(
                        "client {id}: no progress for {} s: the server stopped answering",
                        CLIENT_STALL.as_secs()
                    ));
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                let check = AssertUnwindSafe(last()).catch_unwind();
                let done = match xtc::time::timeout(CLIENT_STALL, check).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(panic)) => Err(format!(
                        "the final check panicked: {}",
                        panic_message(&*panic)
                    )),
                    Err(_) => Err("the final check hung".into()),
                };
                if let Err(e) = done {
                    err(format_args!("{e}"));
                    check_failed.store(true, Ordering::Relaxed);
                }
                xtc::stop();
            }
        })?;
    }
    exec.run()?;
    let unfinished = left.load(Ordering::Acquire) as u64;
    if unfinished > 0 {
        err(format_args!(
            "{unfinished} clients did not finish: the executor stopped first"
        ));
    }
    Ok(Driven {
        failed: failed.load(Ordering::Relaxed) + unfinished,
        check_failed: check_failed.load(Ordering::Relaxed),
        secs: t0.elapsed().as_secs_f64(),
        done: total.load(Ordering::Relaxed),
    })
}

/// Prints each shard's I/O and scheduling counts after a run: tasks, I/O operations submitted
/// and completed, polls, parks and idle share.
pub(crate) fn shard_stats(exec: &xtc::Executor) -> xtc::Result<()> {
    for shard in 0..exec.shard_count() {
        let s = exec.loop_stats(shard)?;
        out(format_args!(
            "shard {shard}: {} tasks, {} I/O submitted, {} completed, {} polls, {} parks, idle {:.0}%",
            s.tasks_run,
            s.io_submitted,
            s.io_completed,
            s.polls,
            s.parks,
            100.0 * s.idle_rate()
        ));
    }
    Ok(())
}

/// The text of a caught panic's payload (a `&str` or `String` message), or a placeholder.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a payload that is not a message)")
}

/// What `main` returns for `result`: an error is printed as its message (xtc's errors include
/// their causes), where a `Result` returned from `main` is printed through `Debug`, which for
/// errors other than xtc's writes their fields.
pub(crate) fn exit_code(result: Result<(), Box<dyn Error>>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Not `eprintln!`, which panics (exit 101) on a closed stderr (`2>&1 | head`).
            err(format_args!("error: {e}"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An executor of `shards` shards in service mode (oversubscribed past the machine's CPUs),
/// as the examples' servers run; for tests.
#[cfg(test)]
pub(crate) fn service_exec(shards: usize) -> xtc::Executor {
    xtc::Executor::builder()
        .shards(shards)
        .service_mode(true)
        .oversubscribe(true)
        .build()
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work whose request count overflows a counter is refused at parse time: the examples
    /// multiplied the flags at the end of the run and overflowed there (a panic in a debug
    /// build, a wrong rate in release).
    #[test]
    fn flags_whose_total_overflows_are_refused() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let huge = usize::MAX.to_string();
        let err = parse_from(
            args(&["--clients", "4", "--rounds", &huge]),
            "--rounds",
            1,
            7,
        )
        .err()
        .expect("refused");
        assert!(err.contains("--rounds"), "{err}");
        let a = parse_from(
            args(&["--clients", "4", "--rounds", "10"]),
            "--rounds",
            1,
            7,
        )
        .unwrap();
        assert_eq!((a.clients, a.per_client), (4, 10));
    }

    /// Clients that need more descriptors than `RLIMIT_NOFILE` allows are refused before the
    /// run, and a soft limit below the need is raised to it where the hard limit allows. The
    /// clients and the server share the process: once the clients' connections had used every
    /// descriptor, the server's accept failed with EMFILE and backed off until descriptors
    /// freed up, which never happened (the connected clients waited for its replies), so the
    /// example hung. Run in a child process under `ulimit`, so the lowered limit stays there.
    #[test]
    fn more_clients_than_descriptors_are_refused_not_hung() {
        const CHILD: &str = "XTC_EXAMPLE_NOFILE_CHILD";
        let name = "shared::tests::more_clients_than_descriptors_are_refused_not_hung";
        if let Some(mode) = std::env::var_os(CHILD) {
            let exec = service_exec(2);
            let server = listen(&exec, "127.0.0.1:0".parse().unwrap(), |s, _| async move {
                let _ = s.write_all(b"x".to_vec()).await;
            })
            .unwrap();
            let addr = server.addr;
            let result = drive(
                &exec,
                100,
                2,
                move |_, _| async move {
                    let s = TcpStream::connect(addr).await?;
                    let (n, _) = s.read(Vec::with_capacity(1)).await;
                    n.map(drop)
                },
                || async { Ok(()) },
            );
            match (mode.to_str(), result) {
                // The hard limit leaves no room: the advice is a count that fits, not a
                // `ulimit -n` the process may not raise itself to.
                (Some("hard"), Err(e)) if e.to_string().contains("use at most") => {}
                (Some("soft"), Ok(Driven { failed: 0, .. })) => {}
                (mode, r) => panic!("{mode:?}: unexpected {:?}", r.map(|d| d.failed)),
            }
            return;
        }
        // `ulimit -n` sets the soft and the hard limit, `-S` the soft one alone (raising it
        // needs a hard limit with room for the 100 clients).
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` through the pointer, valid for the call.
        let hard_room = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0
            && (limit.rlim_max == libc::RLIM_INFINITY || limit.rlim_max >= 1024);
        let modes = [("hard", "ulimit -n 64"), ("soft", "ulimit -S -n 64")];
        for (mode, ulimit) in modes.into_iter().take(if hard_room { 2 } else { 1 }) {
            let mut child = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{ulimit} && exec \"$0\" \"$@\""))
                .arg(std::env::current_exe().unwrap())
                .args([name, "--exact", "--nocapture", "--test-threads", "1"])
                .env(CHILD, mode)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            // Read on a thread of its own, so that the child never waits on a full pipe.
            let mut pipe = child.stdout.take().unwrap();
            let stdout = std::thread::spawn(move || {
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
                text
            });
            let deadline = Instant::now() + std::time::Duration::from_secs(60);
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("{mode}: the run hung");
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            };
            let stdout = stdout.join().unwrap();
            assert_child_ran(mode, name, status, &stdout, "");
        }
    }

    /// A child test run (`mode`, re-running test `name`) succeeded and ran that test: a name
    /// filter that matched nothing would succeed with no test run. `more`: output to show
    /// beside its stdout on failure.
    fn assert_child_ran(
        mode: &str,
        name: &str,
        status: std::process::ExitStatus,
        stdout: &str,
        more: &str,
    ) {
        assert!(status.success(), "{mode}: {status}: {stdout}{more}");
        assert!(
            stdout.contains("test result: ok. 1 passed"),
            "{mode}: the child did not run {name}: {stdout}{more}"
        );
    }

    /// `XTC_OVERSUBSCRIBE=0` is honoured: more shards than allowed CPUs is then an error. The
    /// examples' own default (oversubscription allowed) was set after reading the environment
    /// and overrode it. Run in a child process, so the variables stay there.
    #[test]
    fn xtc_oversubscribe_0_is_honoured() {
        const CHILD: &str = "XTC_EXAMPLE_OVERSUB_CHILD";
        let name = "shared::tests::xtc_oversubscribe_0_is_honoured";
        if let Some(mode) = std::env::var_os(CHILD) {
            let result = executor().map(|e| e.shard_count());
            match (mode.to_str(), result) {
                (Some("0"), Err(e)) if e.to_string().contains("XTC_OVERSUBSCRIBE=0") => {}
                (Some("default"), Ok(_)) => {}
                (mode, r) => panic!("{mode:?}: unexpected {r:?}"),
            }
            return;
        }
        // The CPUs this process may run on (not `available_parallelism`, which a cgroup
        // quota can lower below them).
        // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity writes at most its size
        // through the pointer, valid for the call, and CPU_COUNT reads it.
        let cpus = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
                0
            );
            libc::CPU_COUNT(&set) as usize
        };
        for (mode, oversubscribe) in [("0", Some("0")), ("default", None)] {
            let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
            cmd.args([name, "--exact", "--nocapture", "--test-threads", "1"])
                .env(CHILD, mode)
                .env("XTC_SHARDS", (cpus + 1).to_string());
            match oversubscribe {
                Some(v) => cmd.env("XTC_OVERSUBSCRIBE", v),
                None => cmd.env_remove("XTC_OVERSUBSCRIBE"),
            };
            let out = cmd.output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_child_ran(mode, name, out.status, &stdout, &stderr);
        }
    }

    /// The address `listen` returns is served once it returns: the servers print "echo server
    /// on ADDR (Ctrl-C to stop)" right after `listen`, before `exec.run()`, and a client (or
    /// script) that connected on that line was refused while the shards bound their
    /// listeners only once they ran.
    #[test]
    fn the_address_is_served_when_listen_returns() {
        let exec = service_exec(2);
        let server = listen(&exec, "127.0.0.1:0".parse().unwrap(), |_, _| async {}).unwrap();
        // What a script does on the banner line (printed before `run()`): connect at once.
        let r = std::net::TcpStream::connect(server.addr);
        assert!(
            r.is_ok(),
            "connect to {} right after listen: {r:?}",
            server.addr
        );
    }

    /// An address no interface holds (port 0, so `listen` binds it up front) fails with a
    /// message naming it: "Cannot assign requested address (os error 99)" alone named nothing.
    #[test]
    fn an_address_that_cannot_be_bound_is_named() {
        let exec = service_exec(1);
        // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): no interface of a test machine holds it.
        let err = listen(&exec, "192.0.2.1:0".parse().unwrap(), |_, _| async {})
            .err()
            .expect("refused");
        assert!(err.to_string().starts_with("bind 192.0.2.1:0: "), "{err}");
        assert!(
            err.to_string()
                .contains("no interface of this machine has that address"),
            "{err}"
        );
    }

    /// Runs `drive` on a thread of its own and waits for it at most a minute: a run that
    /// hangs fails the test instead of holding the suite.
    fn drive_within_a_minute<C, CF, L, LF>(clients: usize, client: C, last: L) -> Driven
    where
        C: Fn(usize, Progress) -> CF + Clone + Send + 'static,
        CF: Future<Output = std::io::Result<()>> + 'static,
        L: Fn() -> LF + Clone + Send + 'static,
        LF: Future<Output = Result<(), String>> + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let exec = service_exec(2);
            let driven = drive(&exec, clients, 1, client, last).map_err(|e| e.to_string());
            let _ = tx.send(driven);
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the run hung")
            .expect("drive refused to run")
    }

    /// A client whose code panics is a failed client, and the run ends: the panic unwound
    /// past the count of clients still running, the last one never saw it reach zero, and the
    /// run waited for good (so did any failure while stderr was a closed pipe, where the
    /// report's `eprintln!` panicked).
    #[test]
    fn a_client_that_panics_is_a_failed_client_not_a_hung_run() {
        let driven = drive_within_a_minute(
            3,
            |id, progress| async move {
                if id == 1 {
                    panic!("test: client 1 panics");
                }
                progress.add(1);
                Ok(())
            },
            || async { Ok(()) },
        );
        assert_eq!(
            (driven.failed, driven.check_failed, driven.done),
            (1, false, 2)
        );
        assert_eq!(driven.verdict().unwrap_err().to_string(), "1 client failed");
    }

    /// A final check that fails, or panics, is reported as the check, not as a failed client.
    #[test]
    fn a_failed_final_check_is_not_a_failed_client() {
        let driven = drive_within_a_minute(
            2,
            |_, _| async { Ok(()) },
            || async { Err("test: the count is off".to_string()) },
        );
        assert_eq!((driven.failed, driven.check_failed), (0, true));
        assert_eq!(
            driven.verdict().unwrap_err().to_string(),
            "the final check failed"
        );
        let driven = drive_within_a_minute(
            2,
            |_, _| async { Err(std::io::Error::other("test: a client fails")) },
            || async { panic!("test: the check panics") },
        );
        assert_eq!((driven.failed, driven.check_failed), (2, true));
        assert_eq!(
            driven.verdict().unwrap_err().to_string(),
            "2 clients failed, and the final check failed"
        );
    }

    /// More clients than the ephemeral port range has ports are refused before they start,
    /// with the range named; a count within it passes.
    #[test]
    fn more_clients_than_local_ports_are_refused() {
        let Ok(range) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
            return; // nothing to check against
        };
        let v: Vec<usize> = range
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let ports = v[1] + 1 - v[0];
        assert_eq!(ports_for(ports), Ok(()));
        let e = ports_for(ports + 1).unwrap_err();
        assert!(e.contains(&format!("use at most {ports} clients")), "{e}");
    }

    /// A client count no descriptor limit can hold is told a count that fits: it was told to
    /// run `ulimit -n 18446744073709551615`.
    #[test]
    fn a_client_count_past_any_limit_is_told_one_that_fits() {
        let e = room_for(usize::MAX, 2, 1).expect_err("no limit holds that many");
        assert!(e.contains("use fewer clients (at most "), "{e}");
        assert!(!e.contains("ulimit -n 18446744073709551615"), "{e}");
    }

    /// Serving only, the default port applies when no `--addr` is given; an `--addr` with port 0
    /// (any free port, which the server prints) is kept. It was replaced by the default port,
    /// so `--addr 127.0.0.1:0` failed where that port was taken.
    #[test]
    fn an_explicit_port_0_is_kept() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = parse_from(args(&[]), "--rounds", 1, 7).unwrap();
        assert_eq!(a.addr.to_string(), "127.0.0.1:7");
        let a = parse_from(args(&["--addr", "127.0.0.2:0"]), "--rounds", 1, 7).unwrap();
        assert_eq!(a.addr.to_string(), "127.0.0.2:0");
        let a = parse_from(args(&["--clients", "2"]), "--rounds", 1, 7).unwrap();
        assert_eq!(a.addr.port(), 0, "clients run against a free port");
    }

    /// `--help` (or `-h`) anywhere on the command line asks for the usage, not a run: it was
    /// refused as an unknown flag, so a new user learnt the flags only from the error.
    #[test]
    fn help_is_a_flag() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for a in [&["--help"][..], &["-h"], &["--clients", "2", "--help"]] {
            let parsed = parse_from(args(a), "--rounds", 1, 7);
            assert!(
                parsed.as_ref().is_ok_and(|p| p.help),
                "{a:?}: {:?}",
                parsed.err()
            );
        }
        let a = parse_from(args(&["--clients", "2"]), "--rounds", 1, 7).unwrap();
        assert!(!a.help);
        let text = usage("echo", "--rounds", 1000, 7000);
        for flag in [
            "--addr",
            "--clients",
            "--rounds",
            "--help",
            "7000",
            "XTC_SHARDS",
        ] {
            assert!(text.contains(flag), "{flag} missing from {text}");
        }
    }

    /// A server whose shards cannot bind (the port is taken by a socket without
    /// `SO_REUSEPORT`) fails the run: `check` says why, and the clients the stop cut off count
    /// as failed. The shards' stop ended `run()` with the clients dropped, and the example
    /// printed "0 failed" (and a round-trip rate) and exited with success.
    #[test]
    fn a_server_that_cannot_bind_fails_the_run() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let exec = service_exec(2);
        // Past `claim`, which refuses a taken port up front (see the test below): the
        // shards' listeners are bound before `serve_on` returns, so it fails at once.
        let err = serve_on(&exec, addr, |_, _| async {})
            .err()
            .expect("the bind failure is reported");
        assert!(err.to_string().contains("bind"), "{err}");
        drop(taken);
    }

    /// A port that another server holds with `SO_REUSEPORT` (as every shard of these examples
    /// binds it) is refused with a message, before any shard serves: the shards' own
    /// `SO_REUSEPORT` binds succeeded, so a second server on a busy port ran without a word
    /// and the kernel split the connections between the two.
    #[test]
    fn a_port_another_server_holds_is_refused() {
        let other = xtc::LocalExecutor::new().unwrap().block_on(async {
            let l = TcpListener::bind_reuseport("127.0.0.1:0").expect("bind");
            l.into_std().ok().expect("no accept pending")
        });
        let addr = other.local_addr().unwrap();
        let exec = service_exec(1);
        let err = listen(&exec, addr, |_, _| async {}).err().expect("refused");
        assert!(err.to_string().contains("another program"), "{err}");
    }

    /// A bad value's error says what the flag takes: "--clients: invalid digit found in
    /// string" and "--addr: invalid socket address syntax" (for `localhost:7000`) did not.
    #[test]
    fn a_bad_value_says_what_the_flag_takes() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let err = parse_from(args(&["--clients", "-3"]), "--rounds", 1, 7)
            .err()
            .expect("refused");
        assert!(
            err.contains("whole number") && err.contains("\"-3\""),
            "{err}"
        );
        let err = parse_from(args(&["--addr", "localhost:7000"]), "--rounds", 1, 7)
            .err()
            .expect("refused");
        assert!(
            err.contains("127.0.0.1:7000") && err.contains("localhost"),
            "{err}"
        );
    }

    /// The rate's count is the work the clients did, not the work asked for: one client
    /// reports its work and fails halfway, and `drive` returns what was done. The examples
    /// divided the requested total by the time, so failed clients still counted in full.
    #[test]
    fn drive_counts_the_work_done() {
        let exec = service_exec(1);
        let d = drive(
            &exec,
            2,
            0,
            |id, progress| async move {
                progress.add(10);
                if id == 1 {
                    return Err(std::io::Error::other("gave up halfway"));
                }
                progress.add(10);
                Ok(())
            },
            || async { Ok(()) },
        )
        .unwrap();
        assert_eq!((d.failed, d.done), (1, 30));
    }

    /// A command-line argument that is not valid UTF-8 is an error naming it: the examples
    /// read `std::env::args`, which panics on one (exit 101). (Tested on the conversion: the
    /// test harness itself panics on such an argument.)
    #[test]
    fn a_non_utf8_argument_is_an_error() {
        use std::os::unix::ffi::OsStringExt as _;
        let ok = strings(["--clients".into(), "2".into()]).unwrap();
        assert_eq!(ok, ["--clients", "2"]);
        let bad = std::ffi::OsString::from_vec(b"\xff".to_vec());
        let e = strings(["--addr".into(), bad]).expect_err("refused");
        assert!(e.contains("not valid UTF-8") && e.contains("xFF"), "{e}");
    }
}
