//! TCP echo on loopback: xtc beside tokio, monoio and glommio, and xtc again on its epoll driver.
//!
//! One benchmark, `echo`: request/response over TCP on `127.0.0.1`, 128-byte messages, not
//! pipelined. Each connection writes 128 bytes, waits until all 128 have come back, checks them,
//! and starts again. It runs once with 64 connections and once with 256 (`--conns`).
//!
//! Each server runs in a **child process** of this binary (the same executable, re-run with a
//! hidden `--serve NAME --port P --shards N`), so that no runtime shares a process, an allocator
//! arena or thread-locals with the load generator or another server. The child prints `ready`
//! on stdout once every listener is bound; the parent waits for that line, runs the load, then
//! kills the child. A fresh child serves each run. The servers, `N` threads each (one per allowed
//! CPU unless `--shards` says otherwise):
//!
//! - **xtc**: an `Executor` of `N` shards in service mode, on the io_uring driver
//!   (`XTC_IO=io_uring` in the child; the other `XTC_*` knobs of the bench's environment
//!   apply too, so `XTC_SPIN_BEFORE_PARK=0 echo --servers xtc` tries a knob, while shards,
//!   placement and pinning stay the bench's). Each shard binds its own `SO_REUSEPORT` listener
//!   (`xtc::net::TcpListener::bind_reuseport`) and accepts through one shared
//!   `xtc::net::ConnBalancer`, which serves each connection on the shard with the fewest open
//!   ones (a shard that accepted more than its share hands the descriptor over, once); each
//!   connection is a task echoing with owned `Vec<u8>` buffers. With `XTC_ECHO_HASH=1` in the
//!   environment the shards serve what they accepted (the kernel's hash alone);
//! - **tokio**: a `multi_thread` runtime of `N` workers, one listener, a task per connection;
//! - **monoio**: `N` threads, each pinned to a CPU and running an `IoUringDriver` runtime with
//!   its own `SO_REUSEPORT` listener (`bind_with_config`), a task per connection;
//! - **glommio**: `N` `LocalExecutor`s with `Placement::Fixed(cpu)`, each with its own listener
//!   (glommio's `TcpListener::bind` sets `SO_REUSEPORT`), a task per connection;
//! - **xtc-epoll**: the xtc server again with `XTC_IO=epoll`;
//! - **xtc-float**: the xtc server again (io_uring) with its shards unpinned
//!   (`Builder::pin(false)`: every shard thread may run on any of the server's CPUs), to show
//!   what pinning costs when the client shares the server's CPUs;
//! - **threads**: the no-runtime reference: one `std` listener and one OS thread per
//!   connection in blocking `read`/`write_all`, the kernel's scheduler doing the multiplexing
//!   (not a limit xtc should reach: a reference for what plain threads get here).
//!
//! Every server echoes whatever one read gave it (a read may return fewer than 128 bytes; the
//! client reads until it has them all), with `TCP_NODELAY` on both ends.
//!
//! The load generator is the same for every server: one thread of the bench process running a
//! tokio `current_thread` runtime (or `--clients N` such threads, the connections dealt out
//! among them round-robin: on a machine with CPUs to spare one client thread is the bottleneck
//! and every server looks the same). It opens every connection first (the kernel's reuseport hash
//! spreads them over the server's listeners), lets them run a warm-up (0.5 s; 0.2 s with
//! `--quick`), then measures a window of `--secs` (3 s; 0.5 s with `--quick`). A round trip
//! counts when it starts and ends inside the window; its latency goes to an hdrhistogram and the
//! connection's message count goes up by one. Reported per server and connection count:
//! messages/s, p50 and p99 round-trip latency, and the slowest connection's message count over
//! the fastest's (1 = perfectly fair). Under the table: the issue's goals, one verdict line
//! each (`xtc_bench::goal`: xtc over tokio, xtc-epoll over xtc), and the CPU the server and the client spent in the window
//! (from `/proc/PID/stat` and `CLOCK_THREAD_CPUTIME_ID`). An SVG bar chart of the table goes to
//! `target/bench-echo.svg`.
//!
//! Placement: by default the servers use every allowed CPU and the client thread floats among
//! them, so on a small machine (2 CPUs) it takes CPU a server would otherwise use, and pinned
//! thread-per-core servers (xtc, monoio, glommio) cannot move out of its way while tokio's
//! workers can: the slowest connections are then those of the shard that shares its CPU with
//! the client. With `--shards N` below the number of allowed CPUs, each server child is
//! confined to the first `N` allowed CPUs (`sched_setaffinity` before its threads start; xtc's
//! shards placed on them with `Policy::Cpus`) and the client threads are pinned to the next ones
//! (one CPU each, as far as the allowed CPUs go; the others float). Only the
//! ratios, taken in the same run under the same load, mean much. Nothing here asserts on time.
//!
//! One 3-second window moves a lot on a shared 2-CPU machine (the slowest over fastest
//! connection of one xtc build read from 0.34 to 0.90 between single runs, as the kernel moved
//! the client between the server's CPUs), so `--repeat N` runs every server `N` times per
//! connection count, in turns (each server once, then again, so a slow minute falls on all of
//! them), and reports the median of each figure; ratios and goals are taken of the medians,
//! and every run's own figures are listed under the table. `scripts/bench` runs it with
//! `--repeat 3`.
//!
//! ```text
//! echo [--only echo] [--quick] [--conns 64,256] [--secs S] [--shards N] [--clients N]
//!      [--servers xtc,tokio,monoio,glommio,xtc-epoll,xtc-float,threads] [--repeat N]
//!      [--svg PATH]
//! ```

use std::{
    cell::{Cell, RefCell},
    io::{BufRead as _, Write as _},
    net::SocketAddr,
    process::{ExitCode, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use xtc_bench::{
    allowed_cpus,
    goal::{print_goals, Goal},
    isolated,
    svg::Chart,
    BenchArgs, Better, CpuOption, Row, Table,
};

/// The servers, in column order. xtc first: its ratios are printed.
const SERVERS: [&str; 7] = [
    "xtc",
    "tokio",
    "monoio",
    "glommio",
    "xtc-epoll",
    "xtc-float",
    "threads",
];
/// Column index of each server.
const XTC: usize = 0;
const TOKIO: usize = 1;
const MONOIO: usize = 2;
const GLOMMIO: usize = 3;
const XTC_EPOLL: usize = 4;
const XTC_FLOAT: usize = 5;
const THREADS: usize = 6;
/// Column indices xtc is divided by in the table, in print order. xtc-epoll over xtc is printed
/// under the table, the way round the issue states its goal.
const RATIOS_VS: [usize; 4] = [TOKIO, MONOIO, GLOMMIO, THREADS];
/// The benchmarks of this binary (one), for `--only`.
const BENCHES: [&str; 1] = ["echo"];
/// Bytes in every request and every echo.
const MSG: usize = 128;
/// Capacity of a server's read buffer: a read takes whatever has arrived, up to this.
const SERVER_BUF: usize = 1024;
/// How long the client waits past the window for connections still awaiting an echo before it
/// calls the server stalled.
const GRACE: Duration = Duration::from_secs(2);
/// How long a child has to print `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// The hidden first argument of a server child.
const SERVE: &str = "--serve";
/// Set (to anything) in the bench's environment, which the server children inherit: the xtc
/// servers accept with `SO_REUSEPORT` alone, each shard serving what the kernel's hash gave it,
/// instead of through `xtc::net::ConnBalancer`.
#[cfg_attr(not(feature = "xtc"), allow(dead_code))] // used by the xtc server only
const HASH_ENV: &str = "XTC_ECHO_HASH";
/// The range `--secs` takes: a millisecond to a day.
const MIN_SECS: f64 = 0.001;
const MAX_SECS: f64 = 86_400.0;
/// The goals the issue states, printed beside the measured ratios (reported, not asserted).
const GOAL_XTC_OVER_TOKIO: f64 = 1.2;
const GOAL_SLOWEST_OVER_FASTEST: f64 = 0.9;
const GOAL_EPOLL_OVER_URING: f64 = 0.8;

/// What one run of the load generator is asked to do.
#[derive(Debug, Clone, Copy)]
struct Load {
    conns: usize,
    warmup: Duration,
    window: Duration,
}

/// The whole command line of the parent.
#[derive(Debug)]
struct EchoArgs {
    common: BenchArgs,
    conns: Vec<usize>,
    secs: Option<f64>,
    shards: Option<usize>,
    clients: usize,
    servers: Vec<usize>,
    /// Runs of every server per connection count, interleaved; the table shows their medians.
    repeat: usize,
}

/// The most `--repeat` takes: past it a full run takes hours.
const MAX_REPEAT: usize = 50;

fn usage() -> &'static str {
    "usage: echo [--only echo] [--quick] [--conns 64,256] [--secs S] [--shards N] [--clients N]\n\
     \x20           [--servers xtc,tokio,monoio,glommio,xtc-epoll,xtc-float,threads]\n\
     \x20           [--repeat N] [--svg PATH]\n\
     \n  --only echo      run the one benchmark (there is no other)\
     \n  --quick          a smoke run: 0.5 s windows after 0.2 s of warm-up\
     \n  --conns A,B,..   connection counts, one run of every server each (default 64,256)\
     \n  --secs S         length of the measured window in seconds (default 3, 0.5 with --quick)\
     \n  --shards N       threads (shards, workers) of every server (default: one per allowed CPU)\
     \n  --clients N      load generator threads, the connections dealt out among them (default 1)\
     \n  --servers LIST   which servers to run (default: all)\
     \n  --repeat N       runs of every server per connection count, taken in turns (server by\
     \n                   server, then again), reported as their median (default 1)\
     \n  --svg PATH       where to write the bar chart (default: <workspace>/target/bench-echo.svg)"
}

/// Parses `A,B,..` of positive integers.
fn parse_list(flag: &str, v: &str) -> Result<Vec<usize>, String> {
    let list = v
        .split(',')
        .map(|s| match s.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{flag} {v}: {s:?} is not a positive integer")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if list.is_empty() {
        return Err(format!("{flag} needs at least one value"));
    }
    Ok(list)
}

/// Parses a server child's `--cpus A,B,..` (CPU numbers, 0 allowed).
fn parse_cpu_list(flag: &str, v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .map_err(|e| format!("{flag} {v}: {s:?}: {e}"))
        })
        .collect()
}

/// Takes this binary's own options out of `args` and hands the rest to [`BenchArgs`]; `Err("")`
/// means `--help`.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<EchoArgs, String> {
    let mut conns = vec![64, 256];
    let mut secs = None;
    let mut shards = None;
    let mut clients = 1;
    let mut repeat = 1;
    let mut servers: Vec<usize> = (0..SERVERS.len()).collect();
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--conns" => conns = parse_list("--conns", &value()?)?,
            "--secs" => {
                let v = value()?;
                // Bounded: past a day the window's end (`Instant` + it) and the hang guard
                // overflow and panic, and a window under a millisecond holds no round trip.
                secs = Some(
                    v.parse::<f64>()
                        .ok()
                        .filter(|s| (MIN_SECS..=MAX_SECS).contains(s))
                        .ok_or(format!(
                            "--secs {v}: wants a number of seconds from {MIN_SECS} to {MAX_SECS}"
                        ))?,
                );
            }
            "--shards" => {
                let v = value()?;
                shards = Some(parse_list("--shards", &v)?[0]);
            }
            "--clients" => {
                let v = value()?;
                clients = parse_list("--clients", &v)?[0];
            }
            "--repeat" => {
                let v = value()?;
                repeat = parse_list("--repeat", &v)?[0];
                if repeat > MAX_REPEAT {
                    return Err(format!("--repeat {v}: at most {MAX_REPEAT}"));
                }
            }
            "--servers" => {
                let v = value()?;
                servers = v
                    .split(',')
                    .map(|s| {
                        SERVERS.iter().position(|n| *n == s.trim()).ok_or(format!(
                            "--servers {v}: {s:?} is not one of {}",
                            SERVERS.join(",")
                        ))
                    })
                    .collect::<Result<_, _>>()?;
                servers.sort_unstable();
                servers.dedup();
            }
            "--cpu" => {
                return Err(
                    "--cpu is not taken: every server runs one thread per allowed CPU \
                     (see --shards)"
                        .into(),
                )
            }
            _ => rest.push(a),
        }
    }
    let common = BenchArgs::parse_from(rest, "echo", &BENCHES, CpuOption::One)?;
    Ok(EchoArgs {
        common,
        conns,
        secs,
        shards,
        clients,
        servers,
        repeat,
    })
}

// ---------------------------------------------------------------------------------------------
// The server side: what a `--serve` child runs.
// ---------------------------------------------------------------------------------------------

/// The server child: binds, says `ready` (or `error: why`) on stdout, serves until killed or
/// until its stdin closes (the parent is gone).
mod serve {
    use std::{io::Read as _, net::SocketAddr, sync::mpsc, time::Duration};

    use super::{SERVER_BUF, START_TIMEOUT};

    /// What a server thread says once: bound (with a line of detail for the parent's notes),
    /// or why it could not start.
    pub(super) type Ready = mpsc::Sender<Result<String, String>>;

    /// The CPU of server thread `i`, if the allowed set is known.
    fn cpu_of(i: usize) -> Option<usize> {
        let cpus = xtc_bench::allowed_cpus();
        (!cpus.is_empty()).then(|| cpus[i % cpus.len()])
    }

    /// Runs the child: `args` are the ones after `--serve`.
    pub(super) fn main(args: &[String]) -> std::process::ExitCode {
        match run(args) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                println!("error: {e}");
                std::process::ExitCode::FAILURE
            }
        }
    }

    fn run(args: &[String]) -> Result<(), String> {
        let bad = || format!("bad server arguments {args:?}");
        let (name, port, shards, cpus) = match args {
            [name, p, port, s, shards] if p == "--port" && s == "--shards" => {
                (name, port, shards, None)
            }
            [name, p, port, s, shards, c, cpus]
                if p == "--port" && s == "--shards" && c == "--cpus" =>
            {
                (name, port, shards, Some(cpus))
            }
            _ => return Err(bad()),
        };
        if let Some(list) = cpus {
            let list = super::parse_cpu_list("--cpus", list)?;
            confine(&list)?;
        }
        let port: u16 = port.parse().map_err(|e| format!("--port {port}: {e}"))?;
        let shards: usize = shards
            .parse()
            .map_err(|e| format!("--shards {shards}: {e}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));

        let (tx, rx) = mpsc::channel();
        let expected = match name.as_str() {
            "xtc" => xtc_srv::start(addr, shards, true, tx)?,
            "xtc-float" => xtc_srv::start(addr, shards, false, tx)?,
            "tokio" => tokio_srv::start(addr, shards, tx)?,
            "monoio" => monoio_srv::start(addr, shards, tx)?,
            "glommio" => glommio_srv::start(addr, shards, tx)?,
            "threads" => threads_srv::start(addr, tx)?,
            other => return Err(format!("no server named {other:?}")),
        };
        let mut details = Vec::new();
        for _ in 0..expected {
            match rx.recv_timeout(START_TIMEOUT) {
                Ok(Ok(d)) => details.push(d),
                Ok(Err(e)) => return Err(e),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "{} of {expected} listeners bound after {} s",
                        details.len(),
                        START_TIMEOUT.as_secs()
                    ))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err("a server thread ended before it was listening".into())
                }
            }
        }
        details.sort();
        details.dedup();
        println!("ready {}", details.join("; "));
        use std::io::Write as _;
        std::io::stdout()
            .flush()
            .map_err(|e| format!("stdout: {e}"))?;
        // Serve until killed; a server thread that fails after this shows as a failed run in the
        // client. The parent holds our stdin: when it goes, so do we.
        std::thread::Builder::new()
            .name("echo-stdin-watch".into())
            .spawn(|| {
                let mut sink = [0u8; 64];
                while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
                std::process::exit(0);
            })
            .map_err(|e| format!("could not spawn the stdin watcher: {e}"))?;
        loop {
            std::thread::park_timeout(Duration::from_secs(3600));
        }
    }

    /// Confines this process to `cpus`: called before any thread starts, so every thread of the
    /// server inherits the mask (and [`xtc_bench::allowed_cpus`] reads it back).
    fn confine(cpus: &[usize]) -> Result<(), String> {
        // SAFETY: an all-zero `cpu_set_t` is a valid, empty CPU set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &cpu in cpus {
            if cpu >= libc::CPU_SETSIZE as usize {
                return Err(format!("--cpus: cpu {cpu} is past CPU_SETSIZE"));
            }
            // SAFETY: `cpu` is below CPU_SETSIZE (checked above) and `set` is a live cpu_set_t.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        // SAFETY: `set` is a valid cpu_set_t and the size passed is its own; pid 0 is the
        // calling thread, the only one of the process at this point.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            return Err(format!(
                "sched_setaffinity({cpus:?}): {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// Spawns a named thread running `f`, reporting a failed spawn on `ready`.
    fn thread(name: String, ready: &Ready, f: impl FnOnce() + Send + 'static) {
        if let Err(e) = std::thread::Builder::new().name(name).spawn(f) {
            let _ = ready.send(Err(format!("could not spawn a server thread: {e}")));
        }
    }

    /// Raw threads, the no-runtime reference: one listener, one OS thread per connection in
    /// blocking `read`/`write_all` (the kernel's scheduler does all the multiplexing).
    mod threads_srv {
        use std::{
            io::{Read as _, Write as _},
            net::{SocketAddr, TcpListener, TcpStream},
        };

        use super::{thread, Ready, SERVER_BUF};

        fn echo(mut stream: TcpStream) {
            let _ = stream.set_nodelay(true);
            let mut buf = vec![0u8; SERVER_BUF];
            loop {
                match stream.read(&mut buf) {
                    Ok(n) if n > 0 => {
                        if stream.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                    _ => return,
                }
            }
        }

        pub(super) fn start(addr: SocketAddr, ready: Ready) -> Result<usize, String> {
            let tx = ready.clone();
            thread("echo-threads-accept".into(), &ready, move || {
                let listener = match TcpListener::bind(addr) {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = tx.send(Err(format!("bind {addr}: {e}")));
                        return;
                    }
                };
                let _ = tx.send(Ok("a thread per connection, one listener".into()));
                for (i, stream) in listener.incoming().enumerate() {
                    match stream {
                        Ok(s) => thread(format!("echo-conn-{i}"), &tx, move || echo(s)),
                        Err(e) => {
                            eprintln!("threads: accept: {e}");
                            return;
                        }
                    }
                }
            });
            Ok(1)
        }
    }

    /// xtc: one shard per thread, each with its own `SO_REUSEPORT` listener.
    #[cfg(feature = "xtc")]
    mod xtc_srv {
        use std::net::SocketAddr;

        use super::{thread, Ready, SERVER_BUF};
        use crate::HASH_ENV;

        /// Echoes one connection until it closes.
        async fn echo(stream: xtc::net::TcpStream) {
            let _ = stream.set_nodelay(true);
            let mut buf = Vec::with_capacity(SERVER_BUF);
            loop {
                let (r, b) = stream.read(buf).await;
                buf = b;
                match r {
                    Ok(n) if n > 0 => {}
                    _ => return,
                }
                let (r, b) = stream.write_all(buf).await;
                buf = b;
                if r.is_err() {
                    return;
                }
                buf.clear();
            }
        }

        /// Builds the executor on a thread of its own (`run` blocks it); every shard binds,
        /// reports, and accepts. `pin`: `Builder::pin` (off for `xtc-float`).
        pub(super) fn start(
            addr: SocketAddr,
            shards: usize,
            pin: bool,
            ready: Ready,
        ) -> Result<usize, String> {
            let tx = ready.clone();
            thread("echo-xtc".into(), &ready, move || {
                // Shard i on the i-th allowed CPU, as the pinned peers; past one shard per CPU,
                // the executor's own oversubscribed placement.
                let cpus = xtc_bench::allowed_cpus();
                // The `XTC_*` knobs of the bench's environment apply (spin-before-park, say);
                // shards, placement and pinning are the bench's.
                let builder = match xtc::Executor::builder().env() {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(format!("Builder::env: {e}")));
                        return;
                    }
                };
                let mut builder = builder.shards(shards).service_mode(true).pin(pin);
                if !cpus.is_empty() && shards <= cpus.len() {
                    builder = builder.placement(xtc::numa::Policy::Cpus(cpus[..shards].to_vec()));
                } else {
                    builder = builder.oversubscribe(true);
                }
                let exec = match builder.build() {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = tx.send(Err(format!("Executor::build: {e}")));
                        return;
                    }
                };
                let driver = exec.io_driver();
                // Connections go to the shard with the fewest open ones (xtc::net::ConnBalancer)
                // unless the parent asked for the kernel's reuseport hash alone (`XTC_ECHO_HASH`).
                let balancer = match std::env::var_os(HASH_ENV) {
                    Some(_) => None,
                    None => match xtc::net::ConnBalancer::new(shards) {
                        Ok(b) => Some(b),
                        Err(e) => {
                            let _ = tx.send(Err(format!("ConnBalancer::new: {e}")));
                            return;
                        }
                    },
                };
                for shard in 0..shards {
                    let shard_tx = tx.clone();
                    let balancer = balancer.clone();
                    let spawned = exec.spawn_on(shard, move || async move {
                        let tx = shard_tx;
                        let listener = match xtc::net::TcpListener::bind_reuseport(addr) {
                            Ok(l) => l,
                            Err(e) => {
                                let _ = tx.send(Err(format!("shard {shard}: bind {addr}: {e}")));
                                return;
                            }
                        };
                        let how = if balancer.is_some() {
                            "balanced"
                        } else {
                            "hash only"
                        };
                        let pinning = if pin { "pinned" } else { "unpinned" };
                        let _ = tx.send(Ok(format!(
                            "driver {driver}, shards {pinning}, connections {how}"
                        )));
                        if let Some(b) = balancer {
                            if let Err(e) = b.serve(listener, |s, _| echo(s)).await {
                                eprintln!("xtc shard {shard}: accept: {e}");
                            }
                            return;
                        }
                        loop {
                            match listener.accept().await {
                                Ok((stream, _)) => drop(xtc::spawn_local(echo(stream))),
                                Err(e) => {
                                    eprintln!("xtc shard {shard}: accept: {e}");
                                    return;
                                }
                            }
                        }
                    });
                    if let Err(e) = spawned {
                        let _ = tx.send(Err(format!("spawn_on({shard}): {e}")));
                        return;
                    }
                }
                if let Err(e) = exec.run() {
                    let _ = tx.send(Err(format!("Executor::run: {e}")));
                }
            });
            Ok(shards)
        }
    }

    /// Stand-in when the bench is built without its `xtc` feature (the parent does not start
    /// it then).
    #[cfg(not(feature = "xtc"))]
    mod xtc_srv {
        use std::net::SocketAddr;

        use super::Ready;

        pub(super) fn start(_: SocketAddr, _: usize, _: bool, _: Ready) -> Result<usize, String> {
            Err("xtc-bench built without its `xtc` feature".into())
        }
    }

    /// tokio: one `multi_thread` runtime, one listener, a task per connection.
    mod tokio_srv {
        use std::net::SocketAddr;

        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        use super::{thread, Ready, SERVER_BUF};

        async fn echo(mut stream: tokio::net::TcpStream) {
            let _ = stream.set_nodelay(true);
            let mut buf = vec![0u8; SERVER_BUF];
            loop {
                match stream.read(&mut buf).await {
                    Ok(n) if n > 0 => {
                        if stream.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    _ => return,
                }
            }
        }

        pub(super) fn start(
            addr: SocketAddr,
            workers: usize,
            ready: Ready,
        ) -> Result<usize, String> {
            let tx = ready.clone();
            thread("echo-tokio".into(), &ready, move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(workers)
                    .enable_io()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(format!("runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::bind(addr).await {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = tx.send(Err(format!("bind {addr}: {e}")));
                            return;
                        }
                    };
                    let _ = tx.send(Ok(format!("{workers} workers, one listener")));
                    loop {
                        match listener.accept().await {
                            Ok((stream, _)) => drop(tokio::spawn(echo(stream))),
                            Err(e) => {
                                eprintln!("tokio: accept: {e}");
                                return;
                            }
                        }
                    }
                });
            });
            Ok(1)
        }
    }

    /// monoio: a pinned `IoUringDriver` runtime per thread, each with its own listener.
    mod monoio_srv {
        use std::net::SocketAddr;

        use monoio::io::{AsyncReadRent as _, AsyncWriteRentExt as _};

        use super::{cpu_of, thread, Ready, SERVER_BUF};

        async fn echo(mut stream: monoio::net::TcpStream) {
            let _ = stream.set_nodelay(true);
            let mut buf = Vec::with_capacity(SERVER_BUF);
            loop {
                let (r, b) = stream.read(buf).await;
                buf = b;
                match r {
                    Ok(n) if n > 0 => {}
                    _ => return,
                }
                let (r, b) = stream.write_all(buf).await;
                buf = b;
                if r.is_err() {
                    return;
                }
                buf.clear();
            }
        }

        pub(super) fn start(
            addr: SocketAddr,
            threads: usize,
            ready: Ready,
        ) -> Result<usize, String> {
            for i in 0..threads {
                let tx = ready.clone();
                thread(format!("echo-monoio-{i}"), &ready, move || {
                    let cpu = cpu_of(i);
                    if let Some(cpu) = cpu {
                        let _ = xtc_bench::pin_current_thread(cpu);
                    }
                    let mut rt =
                        match monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().build() {
                            Ok(rt) => rt,
                            Err(e) => {
                                let _ = tx.send(Err(format!("IoUringDriver runtime: {e}")));
                                return;
                            }
                        };
                    rt.block_on(async move {
                        let opts = monoio::net::ListenerOpts::new().reuse_port(true);
                        let listener = match monoio::net::TcpListener::bind_with_config(addr, &opts)
                        {
                            Ok(l) => l,
                            Err(e) => {
                                let _ = tx.send(Err(format!("thread {i}: bind {addr}: {e}")));
                                return;
                            }
                        };
                        let _ = tx.send(Ok("driver io_uring, pinned".into()));
                        loop {
                            match listener.accept().await {
                                Ok((stream, _)) => drop(monoio::spawn(echo(stream))),
                                Err(e) => {
                                    eprintln!("monoio thread {i}: accept: {e}");
                                    return;
                                }
                            }
                        }
                    });
                });
            }
            Ok(threads)
        }
    }

    /// glommio: a `LocalExecutor` per CPU, each with its own (`SO_REUSEPORT`) listener.
    mod glommio_srv {
        use std::net::SocketAddr;

        use futures::{AsyncReadExt as _, AsyncWriteExt as _};
        use glommio::{LocalExecutorBuilder, Placement};

        use super::{cpu_of, thread, Ready, SERVER_BUF};

        async fn echo(mut stream: glommio::net::TcpStream) {
            let _ = stream.set_nodelay(true);
            let mut buf = vec![0u8; SERVER_BUF];
            loop {
                match stream.read(&mut buf).await {
                    Ok(n) if n > 0 => {
                        if stream.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    _ => return,
                }
            }
        }

        pub(super) fn start(
            addr: SocketAddr,
            executors: usize,
            ready: Ready,
        ) -> Result<usize, String> {
            for i in 0..executors {
                let tx = ready.clone();
                let placement = match cpu_of(i) {
                    Some(cpu) => Placement::Fixed(cpu),
                    None => Placement::Unbound,
                };
                let spawned = LocalExecutorBuilder::new(placement)
                    .name(&format!("echo-glommio-{i}"))
                    .spawn(move || async move {
                        let listener = match glommio::net::TcpListener::bind(addr) {
                            Ok(l) => l,
                            Err(e) => {
                                let _ = tx.send(Err(format!("executor {i}: bind {addr}: {e}")));
                                return;
                            }
                        };
                        let _ = tx.send(Ok("io_uring, pinned".into()));
                        loop {
                            match listener.accept().await {
                                Ok(stream) => drop(glommio::spawn_local(echo(stream)).detach()),
                                Err(e) => {
                                    eprintln!("glommio executor {i}: accept: {e}");
                                    return;
                                }
                            }
                        }
                    });
                let handle = match spawned {
                    Ok(h) => h,
                    Err(e) => return Err(format!("LocalExecutorBuilder::spawn: {e}")),
                };
                // An executor that cannot start (no io_uring, too little locked memory) only
                // says why through its join handle: wait on it and pass that on.
                let tx = ready.clone();
                thread(format!("echo-glommio-join-{i}"), &ready, move || {
                    if let Err(e) = handle.join() {
                        let _ = tx.send(Err(format!("executor {i}: {e}")));
                    }
                });
            }
            Ok(executors)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The parent side: starting a server child, and the load generator.
// ---------------------------------------------------------------------------------------------

/// Where the servers and the client run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    /// The CPUs a server child is confined to; `None`: every allowed CPU.
    server: Option<Vec<usize>>,
    /// The CPU each client thread is pinned to; `None`: unpinned, sharing the servers' CPUs.
    clients: Vec<Option<usize>>,
}

impl Placement {
    /// With fewer shards than allowed CPUs the servers get the first `shards` CPUs and the
    /// client threads the next ones, one each as far as they go (the others float); else
    /// everything shares every allowed CPU.
    fn new(shards: usize, clients: usize, allowed: &[usize]) -> Placement {
        if shards < allowed.len() {
            Placement {
                server: Some(allowed[..shards].to_vec()),
                clients: (0..clients)
                    .map(|t| allowed.get(shards + t).copied())
                    .collect(),
            }
        } else {
            Placement {
                server: None,
                clients: vec![None; clients],
            }
        }
    }
}

/// A running server child; killed (and reaped) on drop.
struct Server {
    child: std::process::Child,
    port: u16,
    /// What the child said after `ready`: its driver, threads.
    detail: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port: bound, read and released (the child binds it again at once).
fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("bind: {e}"))?;
    Ok(l.local_addr()
        .map_err(|e| format!("local_addr: {e}"))?
        .port())
}

/// Starts the child for column `server` and waits for its `ready`; `Err` says why it did not
/// start (its `error:` line, or the end of its stderr).
fn start_server(server: usize, shards: usize, place: &Placement) -> Result<Server, String> {
    let (name, xtc_io) = match server {
        XTC => ("xtc", Some("io_uring")),
        XTC_EPOLL => ("xtc", Some("epoll")),
        XTC_FLOAT => ("xtc-float", Some("io_uring")),
        s => (SERVERS[s], None),
    };
    if name.starts_with("xtc") && !cfg!(feature = "xtc") {
        return Err("xtc-bench built without its `xtc` feature".into());
    }
    let port = free_port()?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args([SERVE, name, "--port", &port.to_string(), "--shards"])
        .arg(shards.to_string())
        .args(place.server.iter().flat_map(|cpus| {
            let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
            ["--cpus".to_string(), list.join(",")]
        }))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match xtc_io {
        Some(d) => cmd.env("XTC_IO", d),
        None => cmd.env_remove("XTC_IO"),
    };

    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not start the server process: {e}"))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    // Both pipes are drained by threads so that a chatty child never blocks on them.
    let (line_tx, line_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line_tx.send(line).is_err() {
                break;
            }
        }
    });
    let err_text = Arc::new(Mutex::new(String::new()));
    let err_sink = err_text.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let mut text = err_sink.lock().unwrap_or_else(|p| p.into_inner());
            // Keep the last few lines: that is where a failure says why.
            if text.len() > 4000 {
                text.clear();
            }
            text.push_str(&line);
            text.push('\n');
        }
    });
    let mut server = Server {
        child,
        port,
        detail: String::new(),
    };
    // `why` and the last lines of the child's stderr (a panic message, a runtime's log).
    let with_stderr = |server: &mut Server, why: &str| {
        // The child is ending: give its stderr a moment to arrive.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && matches!(server.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
        let text = err_text.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let last: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = last[last.len().saturating_sub(3)..].join(" / ");
        if tail.is_empty() {
            why.to_string()
        } else {
            format!("{why}; its stderr: {tail}")
        }
    };
    let deadline = Instant::now() + START_TIMEOUT + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match line_rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(detail) = line.strip_prefix("ready") {
                    server.detail = detail.trim().to_string();
                    return Ok(server);
                }
                if let Some(why) = line.strip_prefix("error: ") {
                    return Err(with_stderr(&mut server, why));
                }
                // Anything else a runtime printed on stdout: skip it.
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(format!(
                    "no `ready` from the server after {} s",
                    (START_TIMEOUT + Duration::from_secs(5)).as_secs()
                ))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(with_stderr(
                    &mut server,
                    "the server process ended before it was ready",
                ))
            }
        }
    }
}

/// CPU time (user + system) of process `pid` so far, from `/proc/PID/stat`.
fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions; _SC_CLK_TCK is a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// What one load run measured.
#[derive(Debug)]
struct Measured {
    /// Round trips inside the window, all connections.
    msgs: u64,
    /// The window's requested length (round trips are counted only inside it).
    window: Duration,
    /// Round-trip latencies inside the window, ns.
    hist: Histogram<u64>,
    /// Round trips inside the window, per connection.
    per_conn: Vec<u64>,
    /// CPU of the server process over the window (`None` if `/proc` could not be read).
    server_cpu: Option<Duration>,
    /// CPU of the client threads over the window, summed.
    client_cpu: Duration,
}

/// The shared state of the connection loops of one client thread (one thread: plain cells).
struct Tally {
    hist: RefCell<Histogram<u64>>,
    /// Round trips inside the window, per connection of this thread (by its slot).
    per_conn: Vec<Cell<u64>>,
    errors: RefCell<Vec<String>>,
}

/// One connection (number `id` of the run, `slot` of its thread's tally): request, wait for
/// the whole echo, check it, again, until the window ends.
async fn conn_loop(
    id: usize,
    slot: usize,
    mut stream: tokio::net::TcpStream,
    start: Instant,
    end: Instant,
    tally: &Tally,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let mut msg = [0u8; MSG];
    for (k, b) in msg.iter_mut().enumerate() {
        *b = (k as u8).wrapping_mul(31) ^ (id as u8);
    }
    msg[..8].copy_from_slice(&(id as u64).to_le_bytes());
    let mut back = [0u8; MSG];
    let mut seq = 0u64;
    loop {
        msg[8..16].copy_from_slice(&seq.to_le_bytes());
        let t0 = Instant::now();
        let r = match stream.write_all(&msg).await {
            Ok(()) => stream.read_exact(&mut back).await.map(drop),
            Err(e) => Err(e),
        };
        let t1 = Instant::now();
        if let Err(e) = r {
            tally
                .errors
                .borrow_mut()
                .push(format!("connection {id}, round trip {seq}: {e}"));
            return;
        }
        if back != msg {
            tally
                .errors
                .borrow_mut()
                .push(format!("connection {id}, round trip {seq}: wrong echo"));
            return;
        }
        if t1 >= end {
            return;
        }
        if t0 >= start {
            xtc_bench::record(&mut tally.hist.borrow_mut(), t1 - t0);
            tally.per_conn[slot].set(tally.per_conn[slot].get() + 1);
        }
        seq += 1;
    }
}

/// What one client thread measured: its connections' ids with their round trips in the
/// window, their latencies, and the thread's CPU over the window.
struct Part {
    per_conn: Vec<(usize, u64)>,
    hist: Histogram<u64>,
    cpu: Duration,
}

/// One client thread: a `current_thread` runtime on the calling thread opens connections
/// `ids` to `port`, says so on `connected`, waits for the window's edges on `window` (`None`:
/// the run is off), and runs its connections through the warm-up and the window.
fn client_thread(
    port: u16,
    ids: Vec<usize>,
    conns: usize,
    connected: mpsc::Sender<Result<(), String>>,
    window: mpsc::Receiver<Option<(Instant, Instant)>>,
) -> Result<Part, String> {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let e = format!("client runtime: {e}");
            let _ = connected.send(Err(e.clone()));
            return Err(e);
        }
    };
    rt.block_on(async move {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut streams = Vec::with_capacity(ids.len());
        for &i in &ids {
            let s = match tokio::net::TcpStream::connect(addr).await {
                Ok(s) => s,
                Err(e) => {
                    let e = format!("connection {i} of {conns}: connect: {e}");
                    let _ = connected.send(Err(e.clone()));
                    return Err(e);
                }
            };
            if let Err(e) = s.set_nodelay(true) {
                let e = format!("connection {i}: TCP_NODELAY: {e}");
                let _ = connected.send(Err(e.clone()));
                return Err(e);
            }
            streams.push(s);
        }
        let _ = connected.send(Ok(()));
        let Ok(Some((start, end))) = window.recv() else {
            return Err("the run was called off (another client thread failed)".into());
        };
        let tally = Tally {
            hist: RefCell::new(xtc_bench::latency_histogram()),
            per_conn: ids.iter().map(|_| Cell::new(0)).collect(),
            errors: RefCell::new(Vec::new()),
        };
        // This thread's CPU, sampled at the window's edges.
        let meter = async {
            tokio::time::sleep_until(start.into()).await;
            let c0 = xtc_bench::thread_cpu_time();
            tokio::time::sleep_until(end.into()).await;
            xtc_bench::thread_cpu_time().saturating_sub(c0)
        };
        let loops = futures::future::join_all(
            streams
                .into_iter()
                .zip(&ids)
                .enumerate()
                .map(|(slot, (s, &id))| conn_loop(id, slot, s, start, end, &tally)),
        );
        // Unconstrained: tokio's cooperative budget would otherwise make the connections past
        // the 128th I/O of a poll wait a turn, an unfairness of the client's own; the join polls
        // every ready connection once a turn instead.
        let all = tokio::task::unconstrained(futures::future::join(loops, meter));
        let Ok((_, cpu)) = tokio::time::timeout_at((end + GRACE).into(), all).await else {
            let stalled = tally.per_conn.iter().filter(|c| c.get() == 0).count();
            return Err(format!(
                "server stalled: connections still awaiting an echo {} s after the window \
                 ({stalled} of this client thread's {} made no round trip in it)",
                GRACE.as_secs(),
                ids.len()
            ));
        };
        let errors = tally.errors.into_inner();
        if let Some(first) = errors.first() {
            return Err(format!(
                "{} connection(s) failed; first: {first}",
                errors.len()
            ));
        }
        Ok(Part {
            per_conn: ids
                .iter()
                .zip(&tally.per_conn)
                .map(|(&id, n)| (id, n.get()))
                .collect(),
            hist: tally.hist.into_inner(),
            cpu,
        })
    })
}

/// The load generator: one thread per entry of `clients` (pinned to its CPU, if any; no more
/// threads than connections), the connections dealt out among them round-robin. Once every
/// thread has opened its connections, they all run the same warm-up and window; this thread
/// samples the server's CPU at the window's edges.
fn run_load(
    port: u16,
    server_pid: u32,
    load: Load,
    clients: &[Option<usize>],
) -> Result<Measured, String> {
    let threads = clients.len().clamp(1, load.conns.max(1));
    let (connected_tx, connected_rx) = mpsc::channel();
    let mut handles = Vec::with_capacity(threads);
    let mut windows = Vec::with_capacity(threads);
    for t in 0..threads {
        let ids: Vec<usize> = (t..load.conns).step_by(threads).collect();
        let cpu = clients.get(t).copied().flatten();
        let connected = connected_tx.clone();
        let (window_tx, window_rx) = mpsc::channel();
        windows.push(window_tx);
        let conns = load.conns;
        let h = std::thread::Builder::new()
            .name(format!("echo-client-{t}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    // Not pinned is still a valid (noisier) run.
                    let _ = xtc_bench::pin_current_thread(cpu);
                }
                client_thread(port, ids, conns, connected, window_rx)
            })
            .map_err(|e| format!("could not spawn client thread {t}: {e}"))?;
        handles.push(h);
    }
    drop(connected_tx);
    // Every thread connected (or one failed: then the others are told the run is off).
    let mut failed = None;
    for _ in 0..threads {
        match connected_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failed = Some(e);
                break;
            }
            Err(_) => {
                failed = Some("a client thread ended before it connected".into());
                break;
            }
        }
    }
    let start = Instant::now() + load.warmup;
    let end = start + load.window;
    for w in &windows {
        let _ = w.send(failed.is_none().then_some((start, end)));
    }
    let server_cpu = if failed.is_none() {
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
        let s0 = process_cpu(server_pid);
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        let s1 = process_cpu(server_pid);
        s0.zip(s1).map(|(a, b)| b.saturating_sub(a))
    } else {
        None
    };
    let mut per_conn = vec![0u64; load.conns];
    let mut hist = xtc_bench::latency_histogram();
    let mut client_cpu = Duration::ZERO;
    let mut first_err = None;
    for h in handles {
        let part = h
            .join()
            .map_err(|p| format!("client thread {}", xtc_bench::panic_message(&*p)))
            .and_then(|r| r);
        match part {
            Ok(p) => {
                for (id, n) in p.per_conn {
                    per_conn[id] = n;
                }
                hist.add(&p.hist)
                    .map_err(|e| format!("merging client histograms: {e}"))?;
                client_cpu += p.cpu;
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed.or(first_err) {
        return Err(e);
    }
    Ok(Measured {
        msgs: per_conn.iter().sum(),
        window: load.window,
        hist,
        per_conn,
        server_cpu,
        client_cpu,
    })
}

/// The figures of one run, as they go into the table.
#[derive(Debug, Clone)]
struct Figures {
    k_msgs_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    slowest_over_fastest: f64,
    note: String,
}

impl Figures {
    fn of(m: &Measured, detail: &str) -> Result<Figures, String> {
        if m.msgs == 0 {
            return Err("no round trip completed inside the window".into());
        }
        let secs = m.window.as_secs_f64();
        let slowest = m.per_conn.iter().copied().min().unwrap_or(0);
        let fastest = m.per_conn.iter().copied().max().unwrap_or(0);
        let pct = |d: Duration| 100.0 * d.as_secs_f64() / secs;
        let server_cpu = match m.server_cpu {
            Some(c) => format!("{:.0} %", pct(c)),
            None => "?".into(),
        };
        Ok(Figures {
            k_msgs_per_s: m.msgs as f64 / secs / 1e3,
            p50_us: m.hist.value_at_quantile(0.50) as f64 / 1e3,
            p99_us: m.hist.value_at_quantile(0.99) as f64 / 1e3,
            slowest_over_fastest: slowest as f64 / fastest.max(1) as f64,
            note: format!(
                "{} round trips in {secs:.2} s (per connection {slowest}..{fastest}); cpu of one \
                 cpu: server {server_cpu}, client {:.0} %; {detail}",
                m.msgs,
                pct(m.client_cpu)
            ),
        })
    }
}

impl Figures {
    /// The median of each figure over the runs that succeeded (the mean of the middle two of an
    /// even count, so that a failed run biases no figure up or down); the note lists every run. `Err` of the first failure if none succeeded.
    fn median(runs: &[Result<Figures, String>]) -> Result<Figures, String> {
        let ok: Vec<&Figures> = runs.iter().filter_map(|r| r.as_ref().ok()).collect();
        if ok.is_empty() {
            return match runs.iter().find_map(|r| r.as_ref().err()) {
                Some(e) => Err(e.clone()),
                None => Err("no run".into()),
            };
        }
        if runs.len() == 1 {
            return Ok(ok[0].clone());
        }
        let med = |f: fn(&Figures) -> f64| {
            let mut v: Vec<f64> = ok.iter().map(|x| f(x)).collect();
            v.sort_by(f64::total_cmp);
            let mid = v.len() / 2;
            if v.len() % 2 == 0 {
                (v[mid - 1] + v[mid]) / 2.0
            } else {
                v[mid]
            }
        };
        let failed = runs.len() - ok.len();
        let mut note = format!(
            "median of {} runs{}:",
            ok.len(),
            if failed > 0 {
                format!(
                    " ({failed} failed: {})",
                    runs.iter()
                        .find_map(|r| r.as_ref().err())
                        .map_or("", |e| e.as_str())
                )
            } else {
                String::new()
            }
        );
        for (i, f) in ok.iter().enumerate() {
            note.push_str(&format!(
                "\n      run {}: {:.1} k msgs/s, p50 {:.1} us, p99 {:.0} us, slowest/fastest {:.3}; {}",
                i + 1,
                f.k_msgs_per_s,
                f.p50_us,
                f.p99_us,
                f.slowest_over_fastest,
                f.note
            ));
        }
        Ok(Figures {
            k_msgs_per_s: med(|f| f.k_msgs_per_s),
            p50_us: med(|f| f.p50_us),
            p99_us: med(|f| f.p99_us),
            slowest_over_fastest: med(|f| f.slowest_over_fastest),
            note,
        })
    }
}

/// Starts `server`, drives it with `load`, stops it.
fn measure(server: usize, shards: usize, place: &Placement, load: Load) -> Result<Figures, String> {
    let srv = start_server(server, shards, place)?;
    let (port, pid) = (srv.port, srv.child.id());
    let guard = load.warmup + load.window + GRACE + Duration::from_secs(30);
    let clients = place.clients.clone();
    let m = isolated(None, guard, move || run_load(port, pid, load, &clients));
    let detail = srv.detail.clone();
    drop(srv);
    Figures::of(&m?, &detail)
}

/// `a / b` as `1.23x`, or `-` when either is missing ([`ratio_of`]).
fn ratio(
    a: &Result<Figures, String>,
    b: &Result<Figures, String>,
    f: fn(&Figures) -> f64,
) -> String {
    ratio_of(a, b, f).map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// `a / b` of the figure `f`, when both exist and `b`'s is not zero.
fn ratio_of(
    a: &Result<Figures, String>,
    b: &Result<Figures, String>,
    f: fn(&Figures) -> f64,
) -> Option<f64> {
    match (a, b) {
        (Ok(a), Ok(b)) if f(b) != 0.0 => Some(f(a) / f(b)),
        _ => None,
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some(SERVE) {
        return serve::main(&argv[1..]);
    }
    let args = match parse_args(argv) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("echo: {e}");
            eprintln!("{}", usage());
            return ExitCode::from(2);
        }
    };
    let quick = args.common.quick;
    let allowed = allowed_cpus();
    let shards = args.shards.unwrap_or(allowed.len().max(1));
    let warmup = Duration::from_millis(if quick { 200 } else { 500 });
    let window = Duration::from_secs_f64(args.secs.unwrap_or(if quick { 0.5 } else { 3.0 }));

    println!(
        "echo: TCP echo on loopback, xtc beside tokio, monoio, glommio and raw threads, and xtc \
         on epoll"
    );
    println!(
        "  mode: {}   {MSG}-byte request/response (not pipelined), connections {:?}   \
         allowed cpus: {allowed:?}",
        if quick { "quick" } else { "full" },
        args.conns,
    );
    println!(
        "  every server: {shards} threads, in a child process; window {:.2} s after {:.1} s of \
         warm-up; {} (tokio current_thread) drive the connections, dealt out round-robin",
        window.as_secs_f64(),
        warmup.as_secs_f64(),
        match args.clients {
            1 => "one client thread".to_string(),
            n => format!("{n} client threads"),
        }
    );
    if args.repeat > 1 {
        println!(
            "  {} runs of every server per connection count, taken in turns (each server once, \
             then again); every figure below is the median of its runs, each ratio one of \
             medians; the runs' own figures are listed at the end",
            args.repeat
        );
    }
    println!(
        "  xtc = a shard per thread, a SO_REUSEPORT listener each, connections balanced over the \
         shards by ConnBalancer unless XTC_ECHO_HASH is set (io_uring; xtc-epoll: XTC_IO=epoll; \
         xtc-float: shards unpinned, Builder::pin(false)); tokio = multi_thread, one listener; monoio = a pinned io_uring runtime \
         per thread, glommio = a pinned LocalExecutor per thread, a SO_REUSEPORT listener each"
    );
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        let avg: Vec<&str> = load.split_whitespace().take(3).collect();
        println!(
            "  load average before the runs: {} (other work on the machine skews every column)",
            avg.join(" ")
        );
    }
    let place = Placement::new(shards, args.clients, &allowed);
    let pinned: Vec<usize> = place.clients.iter().flatten().copied().collect();
    let floating = place.clients.len() - pinned.len();
    match &place.server {
        Some(server) => println!(
            "  placement: every server confined to cpus {server:?}; client threads pinned to \
             cpus {pinned:?}{}",
            match floating {
                0 => String::new(),
                n => format!(", {n} unpinned (no cpu left for them)"),
            }
        ),
        None => println!(
            "  placement: servers on every allowed cpu, the client threads unpinned among them"
        ),
    }
    if pinned.is_empty() && allowed.len() > 1 && allowed.len() <= 4 {
        println!(
            "  NOTE: {} allowed cpus: the client takes CPU from the server (a large share on 2 \
             cores); the pinned thread-per-core servers cannot move away from it, tokio's \
             workers can. `--shards {}` gives the client a CPU of its own",
            allowed.len(),
            allowed.len().saturating_sub(1).max(1)
        );
    }
    if !cfg!(feature = "xtc") {
        println!("  NOTE: built without the `xtc` feature: the xtc columns are empty");
    }
    // The one benchmark; `--only echo` selects it.
    debug_assert_eq!(args.common.selected(&BENCHES), vec!["echo"]);

    let bar = ProgressBar::new((args.conns.len() * args.servers.len() * args.repeat) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .expect("static progress template is valid"),
    );
    // results[c][s]: connection count c, server column s.
    let mut results: Vec<Vec<Result<Figures, String>>> = Vec::new();
    for &conns in &args.conns {
        let load = Load {
            conns,
            warmup,
            window,
        };
        // In turns, so that a slow minute of the shared machine falls on every server.
        let mut runs: Vec<Vec<Result<Figures, String>>> = vec![Vec::new(); SERVERS.len()];
        for rep in 0..args.repeat {
            for &s in &args.servers {
                bar.set_message(format!(
                    "{} / {conns} conns, run {}/{}",
                    SERVERS[s],
                    rep + 1,
                    args.repeat
                ));
                runs[s].push(measure(s, shards, &place, load));
                bar.inc(1);
            }
        }
        let row: Vec<Result<Figures, String>> = runs
            .iter()
            .map(|r| {
                if r.is_empty() {
                    Err("not selected (--servers)".to_string())
                } else {
                    Figures::median(r)
                }
            })
            .collect();
        results.push(row);
    }
    bar.finish_and_clear();

    // The table's columns are the servers run; xtc's ratios where it is one of them.
    let cols = &args.servers;
    let col_of = |s: usize| cols.iter().position(|c| *c == s);
    let base = col_of(XTC).unwrap_or(0);
    let mut table = Table::new(
        cols.iter().map(|s| SERVERS[*s].to_string()).collect(),
        base,
        RATIOS_VS
            .iter()
            .filter_map(|s| col_of(*s))
            .filter(|c| *c != base)
            .collect(),
    );
    type Pick = fn(&Figures) -> f64;
    let metrics: [(&str, &str, Better, Pick); 4] = [
        ("msgs", "k msgs/s", Better::Higher, |f| f.k_msgs_per_s),
        ("p50", "us", Better::Lower, |f| f.p50_us),
        ("p99", "us", Better::Lower, |f| f.p99_us),
        ("slowest/fastest conn", "ratio", Better::Higher, |f| {
            f.slowest_over_fastest
        }),
    ];
    for (c, &conns) in args.conns.iter().enumerate() {
        for (m, (what, unit, better, pick)) in metrics.iter().enumerate() {
            table.push(Row {
                name: format!("{conns} conns {what}"),
                unit: unit.to_string(),
                better: *better,
                values: cols
                    .iter()
                    .map(|s| match &results[c][*s] {
                        Ok(f) => Ok(pick(f)),
                        // The reason once, on the first row of the group.
                        Err(e) if m == 0 => Err(e.clone()),
                        Err(_) => Err("as above".into()),
                    })
                    .collect(),
            });
        }
    }

    println!();
    let text = table.render();
    // Drop the repeats of a reason already noted on the group's first row.
    for line in text.lines().filter(|l| !l.ends_with(": as above")) {
        println!("{line}");
    }
    println!(
        "  ratios are {0}/peer of the values: above 1 is better for {0} where `better` is higher, \
         below 1 where it is lower",
        SERVERS[cols[base]]
    );
    let mut goals = Vec::new();
    for (c, &conns) in args.conns.iter().enumerate() {
        let r = &results[c];
        let (x, t, e) = (&r[XTC], &r[TOKIO], &r[XTC_EPOLL]);
        let msgs: Pick = |f| f.k_msgs_per_s;
        let p99: Pick = |f| f.p99_us;
        goals.push(Goal::ratio(
            7,
            format!("echo {conns} conns: xtc/tokio msgs/s"),
            false,
            GOAL_XTC_OVER_TOKIO,
            ratio_of(x, t, msgs),
        ));
        goals.push(Goal::ratio(
            7,
            format!("echo {conns} conns: xtc/tokio p99"),
            true,
            1.0,
            ratio_of(x, t, p99),
        ));
        goals.push(Goal::value(
            7,
            format!("echo {conns} conns: xtc slowest/fastest connection"),
            false,
            GOAL_SLOWEST_OVER_FASTEST,
            "",
            x.as_ref().ok().map(|f| f.slowest_over_fastest),
        ));
        goals.push(Goal::ratio(
            7,
            format!("echo {conns} conns: epoll/io_uring (xtc-epoll/xtc) msgs/s"),
            false,
            GOAL_EPOLL_OVER_URING,
            ratio_of(e, x, msgs),
        ));
    }
    print_goals(&goals);
    for (c, &conns) in args.conns.iter().enumerate() {
        let r = &results[c];
        let t = &r[TOKIO];
        let msgs: Pick = |f| f.k_msgs_per_s;
        let p99: Pick = |f| f.p99_us;
        // Not a goal of the issue: what unpinning the shards changes beside the client.
        if let Ok(f) = &r[XTC_FLOAT] {
            println!(
                "  {conns} conns, shards unpinned (xtc-float; not a goal): /tokio msgs/s {}, \
                 /tokio p99 {}, slowest/fastest conn {:.2}",
                ratio(&r[XTC_FLOAT], t, msgs),
                ratio(&r[XTC_FLOAT], t, p99),
                f.slowest_over_fastest,
            );
        }
    }
    println!("  runs:");
    for (c, &conns) in args.conns.iter().enumerate() {
        for &s in &args.servers {
            if let Ok(f) = &results[c][s] {
                println!("    {} / {conns} conns: {}", SERVERS[s], f.note);
            }
        }
    }

    let chart = Chart {
        title: "xtc TCP echo, 128-byte request/response on loopback".into(),
        subtitle: format!(
            "{} run, {shards} server threads, window {:.1} s, connections {:?}{}",
            if quick { "quick" } else { "full" },
            window.as_secs_f64(),
            args.conns,
            if args.repeat > 1 {
                format!(", median of {} runs each", args.repeat)
            } else {
                String::new()
            }
        ),
        panels: table.panels(),
    };
    // Flush before the chart line so that the order holds when stdout is a pipe.
    let _ = std::io::stdout().flush();
    chart.write_and_report("echo", &args.common.svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<EchoArgs, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn options() {
        let a = parse(&[
            "--quick", "--conns", "8, 16", "--secs", "0.25", "--only", "echo",
        ])
        .unwrap();
        assert!(a.common.quick);
        assert_eq!(a.conns, vec![8, 16]);
        assert_eq!(a.secs, Some(0.25));
        assert_eq!(a.servers, (0..SERVERS.len()).collect::<Vec<_>>());
        assert_eq!(a.clients, 1);
        assert_eq!(a.repeat, 1);
        let a = parse(&[
            "--servers",
            "tokio,xtc",
            "--shards",
            "3",
            "--clients",
            "4",
            "--repeat",
            "5",
        ])
        .unwrap();
        assert_eq!(a.servers, vec![XTC, TOKIO]);
        assert_eq!(a.shards, Some(3));
        assert_eq!(a.clients, 4);
        assert_eq!(a.repeat, 5);
        assert!(a.common.svg.ends_with("bench-echo.svg"));
    }

    /// Medians of each figure over the runs that worked; a lone run is itself; no run that
    /// worked is the first failure.
    #[test]
    fn median_of_runs() {
        let f = |msgs: f64, p99: f64, fair: f64| -> Result<Figures, String> {
            Ok(Figures {
                k_msgs_per_s: msgs,
                p50_us: msgs / 10.0,
                p99_us: p99,
                slowest_over_fastest: fair,
                note: String::new(),
            })
        };
        let m =
            Figures::median(&[f(3.0, 10.0, 0.9), f(1.0, 30.0, 0.1), f(2.0, 20.0, 0.5)]).unwrap();
        assert_eq!(
            (m.k_msgs_per_s, m.p50_us, m.p99_us, m.slowest_over_fastest),
            (2.0, 0.2, 20.0, 0.5)
        );
        assert!(m.note.starts_with("median of 3 runs:"), "{}", m.note);
        let m = Figures::median(&[Err("down".into()), f(4.0, 1.0, 1.0)]).unwrap();
        assert_eq!(m.k_msgs_per_s, 4.0);
        assert!(m.note.contains("1 failed: down"), "{}", m.note);
        assert_eq!(
            Figures::median(&[f(5.0, 1.0, 1.0)]).unwrap().k_msgs_per_s,
            5.0
        );
        let e = Figures::median(&[Err("a".into()), Err("b".into())]).unwrap_err();
        assert_eq!(e, "a");
    }

    #[test]
    fn bad_options() {
        assert!(parse(&["--conns", "0"]).is_err());
        assert!(parse(&["--conns", "x"]).is_err());
        assert!(parse(&["--clients", "0"]).is_err());
        assert!(parse(&["--repeat", "0"]).is_err());
        assert!(parse(&["--repeat", "51"]).is_err());
        assert!(parse(&["--secs", "-1"]).is_err());
        // Past what a `Duration` (or an `Instant` plus it) holds: an error, not a panic.
        assert!(parse(&["--secs", "1e30"]).is_err());
        assert!(parse(&["--secs", "1e15"]).is_err());
        // Rounds to a zero-length window.
        assert!(parse(&["--secs", "1e-12"]).is_err());
        assert_eq!(parse(&["--secs", "86400"]).unwrap().secs, Some(86400.0));
        assert!(parse(&["--servers", "nginx"]).is_err());
        assert!(parse(&["--only", "rtt"]).is_err());
        assert!(parse(&["--cpu", "0"]).is_err());
        assert_eq!(parse(&["--help"]).unwrap_err(), "");
    }

    #[test]
    fn placement() {
        let p = Placement::new(2, 3, &[0, 1, 2, 3]);
        assert_eq!(p.server, Some(vec![0, 1]));
        assert_eq!(p.clients, vec![Some(2), Some(3), None]);
        let p = Placement::new(2, 2, &[4, 5]);
        assert_eq!(p.server, None);
        assert_eq!(p.clients, vec![None, None]);
    }

    #[test]
    fn own_cpu_time_is_readable() {
        assert!(process_cpu(std::process::id()).is_some());
    }
}
