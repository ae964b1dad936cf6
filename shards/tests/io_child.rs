//! I/O tests that change process-wide state, each run in a child process (this binary
//! re-executed with `--exact <test>` and `XTC_TEST_CHILD=<role>`; the parent checks its exit
//! status):
//!
//! * `accept` under `RLIMIT_NOFILE` = 64 backs off on `EMFILE` without crashing or spinning,
//!   and accepts the pending connections once descriptors free up; a server that stays at the
//!   limit, each accept taking the one descriptor just freed, logs one warning, not one per
//!   connection;
//! * a seccomp filter that denies `io_uring_setup` (as Docker's default profile does) makes the
//!   auto choice fall back to epoll, which serves connections, while a forced io_uring is an
//!   error that names io_uring;
//! * with `SIGPIPE` at its default action (which kills), writes to a peer that went away are
//!   plain errors;
//! * a blocking-pool thread of a program that blocks every signal takes `SIGRTMIN+2` only
//!   with xtc's handler installed (its default action ends the process);
//! * with epoll denied too, a loop has no I/O driver: I/O calls fail with an error that says
//!   so, and timers and tasks still run;
//! * a connection an io_uring loop's dropped accept took is handed out by the listener's next
//!   `accept` on an epoll loop (`XTC_IO` changed between two `LocalExecutor`s);
//! * so are the bytes an io_uring loop's receives took for a stream, by `AsyncRead` there, and
//!   the bytes a write-behind send left unsent, by the next flush or write there, and by a
//!   read (there, or back on io_uring), which may wait for their answer;
//! * a file `open` io_uring cannot run (no kernel worker can start, `RLIMIT_NPROC`) fails
//!   with the kernel's `ECANCELED` instead of starting again for good;
//! * on epoll, a file read where no blocking-pool thread can start runs on the loop's thread,
//!   and an idle pool thread exits after its idle time (10 s);
//! * `write_all_at` past `RLIMIT_FSIZE` goes on after the short write at the right offset and
//!   ends with the kernel's `EFBIG`;
//! * a `FixedBufPool` io_uring refuses under `RLIMIT_MEMLOCK` says what the kernel counted (every
//!   page a buffer touches) and the limit it met.
//!
//! Each body runs on both drivers (except where io_uring is denied on purpose).

mod common;
mod io_common;
use io_common::*;

use std::{
    cell::Cell,
    future::Future as _,
    io::{self, Read as _, Write as _},
    net::Shutdown,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, Ordering::SeqCst},
        Arc,
    },
    time::Duration,
};

use futures::io::AsyncWriteExt;
use xtc_shards::{
    io::{Driver, DriverChoice, FixedBufPool},
    net::{TcpListener, TcpStream, UnixStream},
    shard, spawn_local,
    time::sleep,
    Executor, LocalExecutor,
};

// ---------------------------------------------------------------------------------------------
// accept under RLIMIT_NOFILE = 64

#[test]
fn child_accept_backs_off_at_the_descriptor_limit() {
    const ROLE: &str = "rlimit";
    if !is_child(ROLE) {
        run_child("child_accept_backs_off_at_the_descriptor_limit", ROLE, &[]);
        return;
    }
    lower_nofile(64);
    each_driver(
        "rlimit",
        1,
        |b| b,
        |driver, exec| {
            exec.block_on(move || async move {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                // Fill the descriptor table with connections that wait in the backlog.
                let mut clients = Vec::new();
                loop {
                    match std::net::TcpStream::connect(addr) {
                        Ok(c) => clients.push(c),
                        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                        Err(e) => panic!("connect: {e}"),
                    }
                    assert!(clients.len() < 64, "RLIMIT_NOFILE did not apply");
                }
                let n = clients.len();
                println!("{driver}: {n} connections fill the table");
                assert!(n >= 20, "too few descriptors left to test with: {n}");

                let accepted = Rc::new(Cell::new(0usize));
                let acc = accepted.clone();
                let server = spawn_local(async move {
                    loop {
                        let (s, _) = l.accept().await.expect("accept gave up");
                        acc.set(acc.get() + 1);
                        // Closed at once: each accepted connection frees its descriptor again.
                        drop(s);
                    }
                });

                // accept fails with EMFILE: the server stays alive, backing off.
                let stats = || shard::handle().unwrap().loop_stats(0).unwrap();
                let before = stats();
                sleep(Duration::from_millis(400)).await;
                let after = stats();
                assert_eq!(
                    accepted.get(),
                    0,
                    "no descriptor was free, yet accept succeeded"
                );
                assert!(!server.is_finished(), "the accept loop ended at EMFILE");
                // Back-off (1 ms doubling to 100 ms) polls the task about ten times in this
                // window; a spinning accept loop would poll it without bound.
                let polls = after.polls - before.polls;
                println!("{driver}: {polls} polls while out of descriptors");
                assert!(
                    polls < 1000,
                    "{driver}: accept spins at EMFILE ({polls} polls)"
                );

                // Ten clients go away: descriptors free up, and every pending connection
                // (including the ten closed ones) gets accepted.
                clients.truncate(n - 10);
                guard("the pending connections", async {
                    while accepted.get() < n {
                        sleep(Duration::from_millis(5)).await;
                    }
                })
                .await;
                assert_eq!(accepted.get(), n);
                // The server's side of each was closed: the remaining clients see EOF.
                for mut c in clients {
                    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let mut b = [0u8; 1];
                    match c.read(&mut b) {
                        Ok(0) => {}
                        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                        other => panic!("{driver}: the accepted connection stayed open: {other:?}"),
                    }
                }
                server.abort();
            })
            .unwrap();
        },
    );
}

/// A server that stays at the descriptor limit, each accept taking the one descriptor a client
/// just freed and the next accept meeting `EMFILE` again, is in one episode of exhaustion:
/// it logs one warning, not one per connection. Each `accept` call began its own episode, so
/// a server at its limit under churn logged a warning for every connection it accepted (a
/// log flood of up to a thousand lines a second per listener, with the 1 ms first pause). An
/// accept that finds a descriptor free ends the episode: the next one is warned about again.
#[test]
fn child_accept_warns_once_while_it_stays_at_the_descriptor_limit() {
    const ROLE: &str = "rlimit-warn";
    const TEST: &str = "child_accept_warns_once_while_it_stays_at_the_descriptor_limit";
    if !is_child(ROLE) {
        // One child per driver: each is a `LocalExecutor` on the test's own thread, where the
        // warning counter is installed.
        for driver in ["io_uring", "epoll"] {
            run_child(TEST, ROLE, &[("XTC_IO", driver)]);
        }
        return;
    }
    lower_nofile(64);
    let warnings = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tracing::subscriber::with_default(
        common::count_events(tracing::Level::WARN, warnings.clone()),
        || {
            tracing::warn!("a probe: the counter sees this thread's warnings");
            assert_eq!(warnings.load(SeqCst), 1, "the counter is not installed");
            let ex = match LocalExecutor::new() {
                Ok(ex) => ex,
                Err(e) => panic!("LocalExecutor: {e}"),
            };
            let seen = warnings.clone();
            ex.block_on(async move {
                let driver = xtc_shards::io::current_driver().expect("a driver");
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                // Fill the descriptor table with connections that wait in the backlog.
                let mut clients = Vec::new();
                loop {
                    match std::net::TcpStream::connect(addr) {
                        Ok(c) => clients.push(c),
                        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                        Err(e) => panic!("connect: {e}"),
                    }
                    assert!(clients.len() < 64, "RLIMIT_NOFILE did not apply");
                }
                assert!(
                    clients.len() >= 20,
                    "too few descriptors: {}",
                    clients.len()
                );
                // The server keeps every connection it accepts: each takes the descriptor a
                // client freed, and the table is full again for its next accept.
                let accepted = Rc::new(Cell::new(0usize));
                let acc = accepted.clone();
                let server = spawn_local(async move {
                    let mut held = Vec::new();
                    loop {
                        let (s, _) = l.accept().await.expect("accept gave up");
                        held.push(s);
                        acc.set(acc.get() + 1);
                    }
                });
                const ROUNDS: usize = 6;
                for round in 1..=ROUNDS {
                    // Let the server meet the full table (its accept backs off), then free one
                    // descriptor for it.
                    sleep(Duration::from_millis(20)).await;
                    drop(clients.pop());
                    guard("the connection a freed descriptor lets in", async {
                        while accepted.get() < round {
                            sleep(Duration::from_millis(1)).await;
                        }
                    })
                    .await;
                }
                sleep(Duration::from_millis(20)).await;
                assert!(!server.is_finished(), "the accept loop ended at EMFILE");
                println!(
                    "{driver}: {} warnings over {ROUNDS} connections accepted at the limit",
                    seen.load(SeqCst) - 1
                );
                assert_eq!(seen.load(SeqCst), 2, "{driver}: one warning per episode");
                // Three descriptors free at once: the accepts after the first find room at
                // their first try (the episode is over), until the table is full again: a
                // new episode, warned about again.
                clients.truncate(clients.len() - 3);
                guard("the warning of the next episode", async {
                    while accepted.get() < ROUNDS + 3 || seen.load(SeqCst) < 3 {
                        sleep(Duration::from_millis(1)).await;
                    }
                })
                .await;
                server.abort();
            });
        },
    );
    assert_eq!(
        warnings.load(SeqCst),
        3,
        "each episode at the descriptor limit logs one warning (plus the probe)"
    );
}

// ---------------------------------------------------------------------------------------------
// seccomp: io_uring_setup denied

/// `AUDIT_ARCH_X86_64` (`EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

/// Installs a seccomp filter on this thread (inherited by the threads it starts) that makes
/// `io_uring_setup` fail with `EPERM` and allows everything else; checks it is in force.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn deny_io_uring_setup() {
    deny_syscalls(&[libc::SYS_io_uring_setup as u32]);
    // SAFETY: io_uring_setup with a null params pointer fails before touching memory (EFAULT),
    // or with EPERM from the filter, which is what we check.
    let rc = unsafe { libc::syscall(libc::SYS_io_uring_setup, 8, std::ptr::null_mut::<u8>()) };
    assert_eq!(rc, -1);
    assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
}

/// Installs a seccomp filter on this thread (inherited by the threads it starts afterwards)
/// that fails the x86_64 system calls `nrs` with `EPERM` and allows everything else.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn deny_syscalls(nrs: &[u32]) {
    fn stmt(code: u32, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        }
    }
    fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        }
    }
    let arch = std::mem::offset_of!(libc::seccomp_data, arch) as u32;
    let nr = std::mem::offset_of!(libc::seccomp_data, nr) as u32;
    let ret_eperm = libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA);
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let mut prog = vec![
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, arch),
        // Another ABI: allow (only x86_64 system call numbers are matched below).
        jump(jeq, AUDIT_ARCH_X86_64, 1, 0),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, nr),
    ];
    for &n in nrs {
        // Match: fall through to the EPERM return; else skip it.
        prog.push(jump(jeq, n, 0, 1));
        prog.push(stmt(libc::BPF_RET | libc::BPF_K, ret_eperm));
    }
    prog.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW));
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: plain prctl with integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_NO_NEW_PRIVS: {}", io::Error::last_os_error());
    // SAFETY: `fprog` points at `prog`, a live buffer of `len` instructions; the kernel copies
    // the program during the call.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &fprog as *const libc::sock_fprog,
            0,
            0,
        )
    };
    assert_eq!(rc, 0, "PR_SET_SECCOMP: {}", io::Error::last_os_error());
}

/// An echo exchange over TCP on the current loop.
async fn echo_once() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = spawn_local(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut buf = Vec::with_capacity(4096);
        loop {
            let (r, b) = s.read(buf).await;
            if r.unwrap() == 0 {
                break;
            }
            let (w, b) = s.write_all(b).await;
            w.unwrap();
            buf = b;
        }
    });
    let c = TcpStream::connect(addr).await.unwrap();
    let msg: Vec<u8> = (0..100_000).map(|i| (i % 249) as u8).collect();
    let (w, _) = c.write_all(msg.clone()).await;
    w.unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    let mut buf = Vec::with_capacity(65536);
    loop {
        let (r, b) = c.read(buf).await;
        if r.unwrap() == 0 {
            break;
        }
        got.extend_from_slice(&b);
        buf = b;
    }
    assert!(got == msg, "echo differs");
    guard("server", server).await.unwrap();
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn child_seccomp_denied_io_uring_falls_back_to_epoll() {
    const ROLE: &str = "seccomp";
    if !is_child(ROLE) {
        run_child(
            "child_seccomp_denied_io_uring_falls_back_to_epoll",
            ROLE,
            &[],
        );
        return;
    }
    deny_io_uring_setup();

    // Auto, explicitly and as the default (the child runs without XTC_IO).
    for exec in [
        Executor::builder()
            .shards(2)
            .oversubscribe(true)
            .io_driver(DriverChoice::Auto)
            .build()
            .unwrap(),
        Executor::builder()
            .shards(1)
            .oversubscribe(true)
            .build()
            .unwrap(),
    ] {
        assert_eq!(exec.io_driver(), Driver::Epoll);
        exec.block_on(|| async {
            assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
            echo_once().await;
        })
        .unwrap();
        assert_eq!(exec.loop_stats(0).unwrap().io_driver, Some(Driver::Epoll));
    }
    LocalExecutor::new().unwrap().block_on(async {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
        echo_once().await;
    });

    // Forcing io_uring is an error that says why.
    let e = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .io_driver(DriverChoice::IoUring)
        .build()
        .unwrap_err();
    let msg = e.to_string();
    println!("forced io_uring: {msg}");
    assert!(msg.contains("io_uring"), "{msg}");
    assert!(msg.contains("io_uring_setup"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// SIGPIPE at its default action

#[test]
fn child_writes_to_a_gone_peer_raise_no_sigpipe() {
    const ROLE: &str = "sigpipe";
    if !is_child(ROLE) {
        run_child("child_writes_to_a_gone_peer_raise_no_sigpipe", ROLE, &[]);
        return;
    }
    // The Rust runtime ignores SIGPIPE; put back the default action, which kills the process.
    // SAFETY: plain signal(2) call with a valid disposition.
    let prev = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    assert_ne!(prev, libc::SIG_ERR);
    each_driver(
        "sigpipe",
        1,
        |b| b,
        |driver, exec| {
            exec.block_on(move || async move {
                fn gone(e: &io::Error) -> bool {
                    matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    )
                }
                // TCP, owned buffers.
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
                let (s, _) = l.accept().await.unwrap();
                drop(c);
                let mut buf = vec![7u8; 65536];
                let mut err = None;
                for _ in 0..10_000 {
                    let (r, b) = s.write_all(buf).await;
                    buf = b;
                    if let Err(e) = r {
                        err = Some(e);
                        break;
                    }
                }
                let e = err.expect("writes to a closed peer kept succeeding");
                assert!(gone(&e), "{driver}: {e}");

                // Unix stream, owned buffers and futures::io.
                for use_async in [false, true] {
                    let (a, b) = UnixStream::pair().unwrap();
                    drop(b);
                    let e = if use_async {
                        let mut a = a;
                        let mut err = None;
                        for _ in 0..100 {
                            let r = match AsyncWriteExt::write_all(&mut a, &[1u8; 4096]).await {
                                Ok(()) => AsyncWriteExt::flush(&mut a).await,
                                Err(e) => Err(e),
                            };
                            if let Err(e) = r {
                                err = Some(e);
                                break;
                            }
                        }
                        err.expect("AsyncWrite to a closed peer kept succeeding")
                    } else {
                        let (r, _) = a.write_all(vec![1u8; 4096]).await;
                        r.expect_err("a write to a closed Unix peer succeeded")
                    };
                    assert!(gone(&e), "{driver}: {e}");
                }
                // TCP with a registered buffer (io_uring: a fixed buffer must not turn the send
                // into a write(2), which raises SIGPIPE).
                let pool = FixedBufPool::register(1, 65536).unwrap();
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
                let (s, _) = l.accept().await.unwrap();
                drop(c);
                let mut fb = pool.take().unwrap();
                fb.put_slice(&[3u8; 65536]);
                let mut err = None;
                for _ in 0..10_000 {
                    let (r, b) = s.write_all(fb).await;
                    fb = b;
                    if let Err(e) = r {
                        err = Some(e);
                        break;
                    }
                }
                let e = err.expect("fixed-buffer writes to a closed peer kept succeeding");
                assert!(gone(&e), "{driver}: {e}");

                // Still alive: the loop keeps working.
                let (x, y) = UnixStream::pair().unwrap();
                let (w, _) = x.write_all(&b"alive"[..]).await;
                w.unwrap();
                let (r, b) = y.read(Vec::with_capacity(8)).await;
                assert_eq!(r.unwrap(), 5);
                assert_eq!(&b[..], b"alive");
            })
            .unwrap();
        },
    );
    // A std write without MSG_NOSIGNAL would kill us here; only xtc's paths are under test.
    let _ = std::io::stdout().flush();
}

// ---------------------------------------------------------------------------------------------
// Neither io_uring nor epoll

/// Installs a filter that fails `io_uring_setup`, `epoll_create` and `epoll_create1` with
/// `EPERM`.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn deny_io_uring_and_epoll() {
    deny_syscalls(&[
        libc::SYS_io_uring_setup as u32,
        libc::SYS_epoll_create as u32,
        libc::SYS_epoll_create1 as u32,
    ]);
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn child_no_io_driver_at_all_fails_io_cleanly() {
    const ROLE: &str = "no-driver";
    if !is_child(ROLE) {
        run_child("child_no_io_driver_at_all_fails_io_cleanly", ROLE, &[]);
        return;
    }
    deny_io_uring_and_epoll();
    let exec = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .build()
        .unwrap();
    exec.block_on(|| async {
        assert_eq!(xtc_shards::io::current_driver(), None);
        // Timers still work (the loop parks on its eventfd).
        sleep(Duration::from_millis(5)).await;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no I/O driver"), "{e}");
        let e = xtc_shards::fs::read("/proc/self/stat").await.unwrap_err();
        assert!(e.to_string().contains("no I/O driver"), "{e}");
        // A cross-shard-style wake through the inbox still reaches the parked loop.
        let h = spawn_local(async { 7 });
        assert_eq!(h.await.unwrap(), 7);
    })
    .unwrap();
    assert_eq!(exec.loop_stats(0).unwrap().io_driver, None);
}

// ---------------------------------------------------------------------------------------------
// a kept accept's connection, handed out on an epoll loop

/// A waker that records that it was woken.
struct Woken(AtomicBool);

impl futures::task::ArcWake for Woken {
    fn wake_by_ref(this: &Arc<Self>) {
        this.0.store(true, SeqCst);
    }
}

/// An `accept` future dropped on an io_uring loop after the kernel took a connection for it
/// (the listener keeps that accept, see `ops::accept`) loses no connection when the listener
/// serves an epoll loop next (a `LocalExecutor` made after `XTC_IO` changed): `into_std`
/// refuses there too, and its `accept` returns that connection. The epoll path waited for a
/// new connection instead, and the kept one stayed with the listener until it closed, under
/// its client.
#[test]
fn child_a_kept_accept_is_handed_out_on_an_epoll_loop() {
    const ROLE: &str = "kept-to-epoll";
    if !is_child(ROLE) {
        run_child(
            "child_a_kept_accept_is_handed_out_on_an_epoll_loop",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let uring = match LocalExecutor::new() {
        Ok(ex) => ex,
        Err(e) => {
            println!("skipped: io_uring unavailable here: {e}");
            return;
        }
    };
    let l = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
    let addr = l.local_addr().unwrap();
    let l1 = l.clone();
    let client = uring.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::IoUring));
        // Polled once with a waker that only records its wake: the loop reaping the accept's
        // completion wakes it, and the future is dropped then, unpolled, holding the
        // connection (which the listener keeps).
        let woken = Arc::new(Woken(AtomicBool::new(false)));
        let waker = futures::task::waker(woken.clone());
        let mut accept = Box::pin(l1.accept());
        let poll = accept
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker));
        assert!(poll.is_pending());
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        client.write_all(b"kept").unwrap();
        while !woken.0.load(SeqCst) {
            sleep(Duration::from_millis(1)).await;
        }
        drop(accept);
        client
    });
    drop(uring);
    std::env::set_var("XTC_IO", "epoll");
    let epoll = LocalExecutor::new().unwrap();
    let got = epoll.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
        // `into_std` refuses here too (closing the listener would close the kept connection
        // under its client), and says to accept first.
        let l = Rc::try_unwrap(l).expect("the io_uring run's clone is gone");
        let err = l
            .into_std()
            .expect_err("into_std on epoll closed a connection a kept accept took");
        assert!(err.to_string().contains("accept it"), "{err}");
        let l = err.into_inner();
        let (s, _) = xtc_shards::time::timeout(HANG, l.accept())
            .await
            .expect("the kept accept's connection was lost on the epoll loop")
            .unwrap();
        let (n, b) = s.read(Vec::with_capacity(4)).await;
        n.unwrap();
        l.into_std()
            .expect("nothing is kept once the connection was accepted");
        b
    });
    assert_eq!(got, b"kept");
    drop(client);
}

// ---------------------------------------------------------------------------------------------
// a file read into a huge buffer under RLIMIT_AS

/// `read_at` into a `Vec` with 4 GiB of capacity, under an address-space limit that leaves
/// room for that buffer plus 3 GiB: it reads the file, on both drivers. On epoll the pool job
/// allocated a second buffer of the whole capacity (4 GiB) to read into, though one `pread`
/// moves at most about 2 GiB; that allocation failed and aborted the process.
#[test]
fn child_a_file_read_into_a_huge_buffer_does_not_abort() {
    const ROLE: &str = "huge-read";
    if !is_child(ROLE) {
        // Heuristic overcommit refuses one allocation larger than memory and swap together:
        // on a smaller machine the buffer itself cannot be had, whatever the driver does.
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kib = |key| kib_field(&meminfo, key).unwrap_or(0);
        let room = (kib("MemTotal:") + kib("SwapTotal:")) << 10;
        if room < (5 << 30) {
            eprintln!(
                "WARNING: child_a_file_read_into_a_huge_buffer_does_not_abort not run: memory \
                 and swap ({} MiB) are below the 4 GiB buffer it allocates and 1 GiB more",
                room >> 20
            );
            return;
        }
        run_child(
            "child_a_file_read_into_a_huge_buffer_does_not_abort",
            ROLE,
            &[],
        );
        return;
    }
    const CAP: usize = 4 << 30;
    let path = std::env::temp_dir().join(format!("xtc-io-child-huge-{}", std::process::id()));
    std::fs::write(&path, b"0123456789").unwrap();
    each_driver(
        "huge-read",
        1,
        |b| b,
        |driver, exec| {
            let p = path.clone();
            exec.block_on(move || async move {
                // Now, with the loop and its driver up: the limit is the address space in use
                // plus the buffer and 3 GiB.
                let status = std::fs::read_to_string("/proc/self/status").unwrap();
                let vm_kib = kib_field(&status, "VmSize:").expect("VmSize in /proc/self/status");
                let limit = (vm_kib << 10) + CAP as u64 + (3 << 30);
                let rl = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: libc::RLIM_INFINITY,
                };
                // SAFETY: a plain system call with a live struct.
                assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
                let f = xtc_shards::fs::File::open(&p).await.unwrap();
                let (r, buf) = f.read_at(Vec::with_capacity(CAP), 0).await;
                assert_eq!(r.unwrap(), 10, "{driver}");
                assert_eq!(buf, b"0123456789");
                drop(buf);
                let rl = libc::rlimit {
                    rlim_cur: libc::RLIM_INFINITY,
                    rlim_max: libc::RLIM_INFINITY,
                };
                // SAFETY: as above.
                assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
            })
            .unwrap_or_else(|e| panic!("[{driver}]: {e}"));
        },
    );
    std::fs::remove_file(&path).unwrap();
}

/// The value of a `/proc` line such as `VmSize:   1234 kB` (`key` with its colon), in KiB.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Makes this child process one in which no thread may start: `RLIMIT_NPROC` of 1, below the
/// threads it has, after dropping to `nobody` if it is root (whom the limit does not bind).
fn no_thread_may_start() {
    // SAFETY: plain system calls; the process is this test's child, alone.
    unsafe {
        if libc::geteuid() == 0 {
            assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
            assert_eq!(libc::setgid(65534), 0);
            assert_eq!(libc::setuid(65534), 0);
        }
        let rl = libc::rlimit {
            rlim_cur: 1,
            rlim_max: 1,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NPROC, &rl), 0);
    }
}

/// An idle blocking-pool thread exits after 10 s without work (`IDLE_EXIT`), not at once and
/// not never: a file operation on epoll starts one; it is still there 5 s later, and gone
/// within 30 s. Its own process: the pool is process-wide.
#[test]
fn child_an_idle_pool_thread_exits_after_its_idle_time() {
    const ROLE: &str = "pool-idle-exit";
    if !is_child(ROLE) {
        run_child(
            "child_an_idle_pool_thread_exits_after_its_idle_time",
            ROLE,
            &[("XTC_IO", "epoll")],
        );
        return;
    }
    let exec = LocalExecutor::new().unwrap();
    let got = exec.block_on(async {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
        xtc_shards::fs::read("/proc/self/stat").await
    });
    assert!(!got.unwrap().is_empty());
    let started = std::time::Instant::now();
    assert!(
        !common::threads_named("xtc-blocking").is_empty(),
        "the read ran on no pool thread"
    );
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !common::threads_named("xtc-blocking").is_empty(),
        "the pool thread exited within 5 s of idling (its idle time is 10 s)"
    );
    while !common::threads_named("xtc-blocking").is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "an idle pool thread still lives after 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// On epoll, where no blocking-pool thread can start (a thread limit: `RLIMIT_NPROC` here, a
/// cgroup's `pids.max` in a container) and the pool has none, a file operation runs on the
/// loop's own thread instead of waiting in the queue for a thread that never comes (its
/// future would never resolve, and the loop never go quiescent).
#[test]
fn child_a_file_read_runs_on_the_loop_when_no_pool_thread_can_start() {
    const ROLE: &str = "no-pool-thread";
    if !is_child(ROLE) {
        run_child(
            "child_a_file_read_runs_on_the_loop_when_no_pool_thread_can_start",
            ROLE,
            &[("XTC_IO", "epoll")],
        );
        return;
    }
    let path = std::env::temp_dir().join(format!("xtc-io-child-no-pool-{}", std::process::id()));
    std::fs::write(&path, b"read on the loop").unwrap();
    // Readable by `nobody`, whom the process becomes below, and removable by it (its own, in
    // the sticky temp dir).
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    // SAFETY: a plain system call (a no-op but for root).
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    }
    let exec = LocalExecutor::new().unwrap();
    let p = path.clone();
    let got = exec.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
        no_thread_may_start();
        let started = std::thread::Builder::new().spawn(|| {});
        assert!(
            started.is_err(),
            "a thread could still start: nothing is tested"
        );
        xtc_shards::time::timeout(Duration::from_secs(10), xtc_shards::fs::read(&p)).await
    });
    let _ = std::fs::remove_file(&path);
    let read = got.expect("the read waited for a pool thread that cannot start");
    assert_eq!(read.unwrap(), b"read on the loop");
    assert!(
        common::threads_named("xtc-blocking").is_empty(),
        "a pool thread started after all"
    );
}

/// `write_all_at` past the file-size limit (`RLIMIT_FSIZE`, `SIGXFSZ` ignored): the first
/// write comes back short, at the limit, and the rest goes on at the offset after it, where
/// the kernel refuses it with `EFBIG`, on both drivers. A continuation at the first write's
/// offset instead of after the bytes written would rewrite them (within the limit) and answer
/// `Ok`; a short write taken as complete would answer `Ok` too.
#[test]
fn child_write_all_at_goes_on_after_a_short_write() {
    const ROLE: &str = "short-write";
    if !is_child(ROLE) {
        run_child("child_write_all_at_goes_on_after_a_short_write", ROLE, &[]);
        return;
    }
    const LIMIT: usize = 10_000;
    // SAFETY: plain system calls on live locals; ignoring SIGXFSZ makes a write past the
    // limit fail with EFBIG instead of ending the process. The hard limit stays as it is
    // (raising it needs a capability).
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut rl), 0);
        assert!(
            rl.rlim_max >= LIMIT as u64,
            "a hard file-size limit below the test's"
        );
        rl.rlim_cur = LIMIT as u64;
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &rl), 0);
    }
    each_driver(
        "short-write",
        1,
        |b| b,
        |driver, exec| {
            let path = std::env::temp_dir().join(format!(
                "xtc-io-child-short-write-{}-{driver}",
                std::process::id()
            ));
            let p = path.clone();
            exec.block_on(move || async move {
                let f = xtc_shards::fs::File::create(&p).await.unwrap();
                let (r, buf) = f.write_all_at(vec![7u8; 2 * LIMIT], 0).await;
                let e = r.expect_err("a write past the file-size limit succeeded");
                assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "[{driver}] {e}");
                assert_eq!(buf.len(), 2 * LIMIT, "the buffer comes back whole");
                f.close().await.unwrap();
            })
            .unwrap_or_else(|e| panic!("[{driver}]: {e}"));
            let got = std::fs::read(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            assert_eq!(got.len(), LIMIT, "[{driver}] the file's length");
            assert!(got.iter().all(|&b| b == 7), "[{driver}] the file's bytes");
        },
    );
}

// ---------------------------------------------------------------------------------------------
// a blocking-pool thread unblocks SIGRTMIN+2 only with xtc's handler installed

/// A program that takes its signals with `signalfd` or `sigwait` blocks them all and leaves
/// their actions at the default, which for a real-time signal ends the process. A pool thread
/// unblocked `SIGRTMIN+2` as it started, before xtc had installed its handler (that happens
/// at the first read or write of a pipe, or the first cancel): a job that is neither (an
/// `open`) left a thread on which that signal, routed there by the kernel as to the only
/// thread that takes it, killed the process. Here it is sent to that thread directly.
#[test]
fn child_a_pool_thread_takes_its_interrupt_signal_only_with_the_handler_installed() {
    const ROLE: &str = "pool-sigdfl";
    if !is_child(ROLE) {
        run_child(
            "child_a_pool_thread_takes_its_interrupt_signal_only_with_the_handler_installed",
            ROLE,
            &[],
        );
        return;
    }
    let path = std::env::temp_dir().join(format!("xtc-io-child-sigdfl-{}", std::process::id()));
    std::fs::write(&path, b"x").unwrap();
    let p = path.clone();
    std::thread::spawn(move || {
        // SAFETY: a local set filled by `sigfillset`; only this thread's mask changes.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        }
        let exec = Executor::builder()
            .shards(1)
            .oversubscribe(true)
            .io_driver(DriverChoice::Epoll)
            .build()
            .unwrap();
        exec.block_on(move || async move {
            // A pool job that is no pipe read or write: it installs no handler.
            drop(xtc_shards::fs::File::open(&p).await.unwrap());
        })
        .unwrap();
    })
    .join()
    .unwrap();
    let pool = common::threads_named("xtc-blocking");
    assert!(!pool.is_empty(), "the open ran on a pool thread");
    for tid in pool {
        // SAFETY: plain system calls; `tid` is a thread of this process (an idle pool thread
        // lives for 10 s).
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGRTMIN() + 2) };
    }
    std::thread::sleep(Duration::from_millis(200));
    std::fs::remove_file(&path).unwrap();
}

// ---------------------------------------------------------------------------------------------
// a stream kept from an io_uring loop for an epoll one

/// Polls `fut` once (it must be pending), lets the loop submit it, then drops it.
async fn poll_once_then_drop<F: std::future::Future>(fut: F) {
    let mut fut = Box::pin(fut);
    let pending =
        futures::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx).is_pending()))
            .await;
    assert!(pending, "the operation had nothing to complete with yet");
    sleep(Duration::from_millis(2)).await;
    drop(fut);
}

/// Bytes an io_uring loop's receive took for a stream (a dropped owned read's kept receive,
/// an `AsyncRead`'s receive in flight) are handed out first by `AsyncRead` on the epoll loop
/// the stream serves next (a `LocalExecutor` made after `XTC_IO` changed), as the owned
/// `read` does there. The epoll `poll_read` went straight to the socket: those bytes were
/// lost, and the read returned the ones sent after them.
#[test]
fn child_bytes_an_io_uring_receive_took_are_read_first_on_an_epoll_loop() {
    use futures::io::AsyncReadExt;
    const ROLE: &str = "received-to-epoll";
    if !is_child(ROLE) {
        run_child(
            "child_bytes_an_io_uring_receive_took_are_read_first_on_an_epoll_loop",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let uring = match LocalExecutor::new() {
        Ok(ex) => ex,
        Err(e) => {
            println!("skipped: io_uring unavailable here: {e}");
            return;
        }
    };
    let streams = uring.block_on(async {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::IoUring));
        let (a, b) = UnixStream::pair().unwrap();
        // A dropped owned read: its receive is kept by the stream.
        poll_once_then_drop(a.read(Vec::with_capacity(16))).await;
        let (mut c, d) = UnixStream::pair().unwrap();
        // A dropped `AsyncRead`: its receive stays in flight.
        let mut tmp = [0u8; 16];
        poll_once_then_drop(AsyncReadExt::read(&mut c, &mut tmp)).await;
        for s in [&b, &d] {
            let (r, _) = s.write_all(b"first".to_vec()).await;
            r.unwrap();
        }
        // Both receives complete and are reaped.
        sleep(Duration::from_millis(50)).await;
        (a, b, c, d)
    });
    drop(uring);
    std::env::set_var("XTC_IO", "epoll");
    let epoll = LocalExecutor::new().unwrap();
    let got = epoll.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
        let (mut a, b, mut c, d) = streams;
        let mut got = Vec::new();
        for (s, peer) in [(&mut a, &b), (&mut c, &d)] {
            let (r, _) = peer.write_all(b"second".to_vec()).await;
            r.unwrap();
            let mut tmp = [0u8; 5];
            let n = xtc_shards::time::timeout(HANG, AsyncReadExt::read(s, &mut tmp))
                .await
                .expect("AsyncRead on the epoll loop hung")
                .unwrap();
            got.push(String::from_utf8_lossy(&tmp[..n]).into_owned());
        }
        got
    });
    assert_eq!(
        got,
        ["first", "first"],
        "bytes received on io_uring were lost"
    );
}

/// Bytes `AsyncWrite` reported written on an io_uring loop whose send that loop's shutdown cut
/// (the socket was full) reach the peer, in order and once, when the stream serves an epoll
/// loop next (a `LocalExecutor` made after `XTC_IO` changed): `flush` sends them, a later
/// write goes after them, and `shutdown(Write)` waits for them. The epoll `flush` failed
/// ("this loop has no io_uring") and dropped them, and `poll_write` sent ahead of them.
#[test]
fn child_a_write_behind_cut_on_io_uring_is_sent_on_an_epoll_loop() {
    use futures::io::AsyncWriteExt;
    const ROLE: &str = "write-behind-to-epoll";
    if !is_child(ROLE) {
        run_child(
            "child_a_write_behind_cut_on_io_uring_is_sent_on_an_epoll_loop",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let Some((mut a, b, filled)) = cut_write_behind() else {
        return;
    };
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        b.read_to_end(&mut all).unwrap();
        all
    });
    std::env::set_var("XTC_IO", "epoll");
    let epoll = LocalExecutor::new().unwrap();
    epoll.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
        let written = xtc_shards::time::timeout(HANG, async {
            AsyncWriteExt::write_all(&mut a, b"more").await?;
            AsyncWriteExt::flush(&mut a).await?;
            let (r, _) = a.write_all(b"owned".to_vec()).await;
            r?;
            AsyncWriteExt::close(&mut a).await
        })
        .await
        .expect("the writes on the epoll loop hung");
        written.unwrap_or_else(|e| panic!("writing on the epoll loop: {e}"));
    });
    let all = reader.join().unwrap();
    assert_eq!(all.len(), filled + 13, "bytes lost or sent twice");
    assert!(all[..filled].iter().all(|&x| x == 0));
    assert_eq!(&all[filled..], b"tailmoreowned");
}

/// On an epoll loop, an owned write first sends what a cut write-behind left unsent
/// (`PollState::unsent`); with the socket full it registers its waker, whose clone is user
/// code: here one that makes room, reaps the driver (a `shutdown` of another such stream),
/// and polls an owned write of its own once. The unsent bytes were out of the stream's state
/// while the waker was cloned, so that write found nothing ahead of it and went out before
/// them: the peer read `X` ahead of `tail`, the bytes reported written first.
#[test]
fn child_a_write_in_a_wakers_clone_does_not_overtake_unsent_bytes() {
    const ROLE: &str = "unsent-order-clone";
    if !is_child(ROLE) {
        run_child(
            "child_a_write_in_a_wakers_clone_does_not_overtake_unsent_bytes",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let Some(mut pairs) = cut_write_behinds(2) else {
        return;
    };
    let (c, _c_peer, _) = pairs.pop().unwrap();
    let (a, a_peer, _) = pairs.pop().unwrap();
    let mut a_peer = a_peer.into_std().unwrap();
    std::env::set_var("XTC_IO", "epoll");
    let epoll = LocalExecutor::new().unwrap();
    let mut a_peer = epoll.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
        let a = Rc::new(a);
        let mut w = Box::pin(a.write_all(b"Y".to_vec()));
        // Takes the cut send over, finds the socket full and waits (the descriptor joins
        // the epoll set).
        let noop = std::task::Waker::noop();
        let first = w.as_mut().poll(&mut std::task::Context::from_waker(noop));
        assert!(first.is_pending(), "the socket is full");
        let user = a.clone();
        let waker = clone_hooked_waker(move || {
            // Room for the unsent bytes...
            a_peer.set_nonblocking(true).unwrap();
            let mut sink = [0u8; 65536];
            while a_peer.read(&mut sink).is_ok_and(|n| n > 0) {}
            // ...seen by the driver (`c`'s shutdown is refused, bytes behind, but reaps)...
            let _ = c.shutdown(Shutdown::Write);
            // ...and a write of the waker's own.
            let mut x = Box::pin(user.write(b"X".to_vec()));
            let _ = x.as_mut().poll(&mut std::task::Context::from_waker(noop));
            a_peer
        });
        let second = w.as_mut().poll(&mut std::task::Context::from_waker(&waker));
        let a_peer = take_hook_result();
        let (r, _) = xtc_shards::time::timeout(HANG, async {
            match second {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => w.await,
            }
        })
        .await
        .expect("the owned write hung");
        r.unwrap();
        drop(a);
        a_peer
    });
    drop(epoll);
    a_peer.set_nonblocking(false).unwrap();
    let mut rest = Vec::new();
    a_peer.read_to_end(&mut rest).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&rest),
        "tailXY",
        "the bytes reported written first must reach the peer first"
    );
}

thread_local! {
    /// What [`clone_hooked_waker`]'s hook returned.
    static HOOK_RESULT: std::cell::RefCell<Option<std::os::unix::net::UnixStream>> =
        const { std::cell::RefCell::new(None) };
    /// What the next clone of a [`clone_hooked_waker`] runs.
    static CLONE_HOOK: std::cell::RefCell<Option<Box<dyn FnOnce() -> std::os::unix::net::UnixStream>>> =
        const { std::cell::RefCell::new(None) };
}

/// A no-op waker whose next clone runs `hook` (once), keeping what it returns for
/// [`take_hook_result`].
fn clone_hooked_waker(
    hook: impl FnOnce() -> std::os::unix::net::UnixStream + 'static,
) -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    fn clone(p: *const ()) -> RawWaker {
        if let Some(hook) = CLONE_HOOK.with(|h| h.borrow_mut().take()) {
            let r = hook();
            HOOK_RESULT.with(|h| *h.borrow_mut() = Some(r));
        }
        RawWaker::new(p, &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    CLONE_HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    // SAFETY: the vtable's functions never dereference the (null) data pointer.
    unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

/// What the hook of a [`clone_hooked_waker`] returned; panics if it did not run.
fn take_hook_result() -> std::os::unix::net::UnixStream {
    HOOK_RESULT
        .with(|h| h.borrow_mut().take())
        .expect("the waker's clone ran its hook")
}

/// On an io_uring `LocalExecutor` (the process's `XTC_IO`): `n` Unix stream pairs, each
/// with its first end's socket full (`fill`, the bytes returned) and its `AsyncWrite` having
/// reported `b"tail"` written, the write-behind send still waiting for room when the
/// executor is dropped (which cuts it). `None` (skipped) where io_uring is unavailable.
fn cut_write_behinds(n: usize) -> Option<Vec<(UnixStream, UnixStream, usize)>> {
    let uring = match LocalExecutor::new() {
        Ok(ex) => ex,
        Err(e) => {
            println!("skipped: io_uring unavailable here: {e}");
            return None;
        }
    };
    let pairs = uring.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::IoUring));
        let mut pairs = Vec::new();
        for _ in 0..n {
            let (mut a, b) = UnixStream::pair().unwrap();
            let filled = fill(&a);
            // Reported written at once (write-behind); its send waits for room, which never
            // comes in this run.
            assert_eq!(AsyncWriteExt::write(&mut a, b"tail").await.unwrap(), 4);
            pairs.push((a, b, filled));
        }
        pairs
    });
    drop(uring);
    Some(pairs)
}

/// [`cut_write_behinds`] of one pair.
fn cut_write_behind() -> Option<(UnixStream, UnixStream, usize)> {
    cut_write_behinds(1)?.pop()
}

/// `into_std` after a write-behind cut on io_uring became `unsent` on an epoll loop: it
/// refuses, saying to flush, there and back on an io_uring loop, and loses none of those
/// bytes; after a flush it unwraps, and the std stream's bytes come after them. It discarded
/// them (bytes reported written, never sent). Sending them instead at the stream's drop, back
/// on an io_uring loop, put them behind the std stream's back, after its bytes.
#[test]
fn child_into_std_refuses_for_unsent_bytes_until_flushed() {
    const ROLE: &str = "into-std-unsent";
    if !is_child(ROLE) {
        run_child(
            "child_into_std_refuses_for_unsent_bytes_until_flushed",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let Some((mut a, b, filled)) = cut_write_behind() else {
        return;
    };
    std::env::set_var("XTC_IO", "epoll");
    let epoll = LocalExecutor::new().unwrap();
    let a = epoll.block_on(async move {
        // The flush takes the cut send over (the socket is still full): it waits, and is
        // given up.
        let flushed =
            xtc_shards::time::timeout(Duration::from_millis(20), AsyncWriteExt::flush(&mut a))
                .await;
        assert!(flushed.is_err(), "the flush finished with the socket full");
        let e = a
            .into_std()
            .expect_err("into_std on epoll unwrapped with bytes reported written unsent");
        assert!(e.to_string().contains("flush()"), "{e}");
        e.into_inner()
    });
    drop(epoll);
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    std::env::set_var("XTC_IO", "io_uring");
    let uring = LocalExecutor::new().unwrap();
    let all = uring.block_on(async move {
        let mut a = a
            .into_std()
            .map(drop)
            .expect_err("into_std on io_uring unwrapped with bytes reported written unsent")
            .into_inner();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            b.read_to_end(&mut all).unwrap();
            all
        });
        xtc_shards::time::timeout(HANG, AsyncWriteExt::flush(&mut a))
            .await
            .expect("the flush hung")
            .unwrap();
        let mut s = a.into_std().unwrap();
        s.set_nonblocking(false).unwrap();
        s.write_all(b"X").unwrap();
        drop(s);
        reader.join().unwrap()
    });
    assert!(all[..filled].iter().all(|&x| x == 0));
    assert_eq!(
        &all[filled..],
        b"tailX",
        "bytes reported written lost, or sent behind the std stream's back"
    );
}

/// Bytes a cut write-behind left unsent that an epoll loop took over (`PollState::unsent`, its
/// flush given up with the socket full), back on an io_uring loop: an owned `write_all` made
/// first goes after them, as a `flush` would send them. The owned write looked only for a
/// send in flight, found none (the bytes were unsent, not submitted), and went out ahead of
/// bytes reported written before it: the peer read `owned` before `tail`.
#[test]
fn child_an_owned_write_back_on_io_uring_goes_after_what_an_epoll_loop_left_unsent() {
    const ROLE: &str = "owned-write-after-unsent-uring";
    if !is_child(ROLE) {
        run_child(
            "child_an_owned_write_back_on_io_uring_goes_after_what_an_epoll_loop_left_unsent",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let Some((mut a, b, filled)) = cut_write_behind() else {
        return;
    };
    std::env::set_var("XTC_IO", "epoll");
    let epoll = LocalExecutor::new().unwrap();
    let a = epoll.block_on(async move {
        // The flush takes the cut send over (the socket is still full): it waits, and is
        // given up, the bytes left unsent.
        let flushed =
            xtc_shards::time::timeout(Duration::from_millis(20), AsyncWriteExt::flush(&mut a))
                .await;
        assert!(flushed.is_err(), "the flush finished with the socket full");
        a
    });
    drop(epoll);
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        b.read_to_end(&mut all).unwrap();
        all
    });
    std::env::set_var("XTC_IO", "io_uring");
    let uring = LocalExecutor::new().unwrap();
    uring.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::IoUring));
        let mut a = a;
        let written = xtc_shards::time::timeout(HANG, async {
            let (r, _) = a.write_all(b"owned".to_vec()).await;
            r?;
            AsyncWriteExt::close(&mut a).await
        })
        .await
        .expect("the writes on the io_uring loop hung");
        written.unwrap_or_else(|e| panic!("writing on the io_uring loop: {e}"));
    });
    let all = reader.join().unwrap();
    assert_eq!(all.len(), filled + 9, "bytes lost or sent twice");
    assert!(all[..filled].iter().all(|&x| x == 0));
    assert_eq!(
        String::from_utf8_lossy(&all[filled..]),
        "tailowned",
        "the bytes reported written first must reach the peer first"
    );
}

/// Bytes a cut write-behind left unsent that an epoll loop took over (`PollState::unsent`),
/// flushed off any loop (between two `LocalExecutor`s): the flush fails, there being no loop
/// to send them on, and keeps them for the next flush on a loop. It took them out to submit
/// them as a write-behind send, and the failed submission dropped them: bytes reported
/// written, never sent, and the next flush found nothing to do.
#[test]
fn child_a_flush_off_any_loop_keeps_what_an_epoll_loop_left_unsent() {
    const ROLE: &str = "flush-off-loop-unsent";
    if !is_child(ROLE) {
        run_child(
            "child_a_flush_off_any_loop_keeps_what_an_epoll_loop_left_unsent",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let Some((mut a, b, filled)) = cut_write_behind() else {
        return;
    };
    std::env::set_var("XTC_IO", "epoll");
    let epoll = LocalExecutor::new().unwrap();
    let mut a = epoll.block_on(async move {
        let flushed =
            xtc_shards::time::timeout(Duration::from_millis(20), AsyncWriteExt::flush(&mut a))
                .await;
        assert!(flushed.is_err(), "the flush finished with the socket full");
        a
    });
    drop(epoll);
    let off = futures::executor::block_on(AsyncWriteExt::flush(&mut a));
    assert!(off.is_err(), "a flush off any loop sent the bytes");
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        b.read_to_end(&mut all).unwrap();
        all
    });
    std::env::set_var("XTC_IO", "io_uring");
    let uring = LocalExecutor::new().unwrap();
    uring.block_on(async move {
        xtc_shards::time::timeout(HANG, AsyncWriteExt::close(&mut a))
            .await
            .expect("the close hung")
            .unwrap_or_else(|e| panic!("close on the io_uring loop: {e}"));
    });
    let all = reader.join().unwrap();
    assert!(all[..filled].iter().all(|&x| x == 0));
    assert_eq!(
        String::from_utf8_lossy(&all[filled..]),
        "tail",
        "bytes reported written were lost by a flush off any loop"
    );
}

/// Each pair's peer waits for the request (`filled` bytes and `b"tail"`) and answers `b"ok"`;
/// on a fresh `LocalExecutor` of driver `io` (`XTC_IO` set to it), an `AsyncRead` on the
/// first stream and an owned read on the second must get that answer, which they get only if
/// the bytes a cut write-behind left were sent before they waited. Nothing is sent twice: the
/// closes after them send nothing more (the peers check what they read).
fn reads_get_their_answers(
    pairs: Vec<(UnixStream, UnixStream, usize)>,
    io: &'static str,
    want: Driver,
) {
    use futures::io::AsyncReadExt;
    let mut peers = Vec::new();
    let mut streams = Vec::new();
    for (a, b, filled) in pairs {
        peers.push(answer_after(b, filled + 4, b"tail", b"ok"));
        streams.push(a);
    }
    std::env::set_var("XTC_IO", io);
    let ex = LocalExecutor::new().unwrap();
    ex.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(want));
        let mut owned = streams.pop().unwrap();
        let mut traits = streams.pop().unwrap();
        let mut tmp = [0u8; 2];
        let n = xtc_shards::time::timeout(HANG, AsyncReadExt::read(&mut traits, &mut tmp))
            .await
            .unwrap_or_else(|_| {
                panic!("AsyncRead on {io} waited for an answer to bytes never sent")
            })
            .unwrap();
        assert_eq!(&tmp[..n], b"ok");
        let (r, got) = xtc_shards::time::timeout(HANG, owned.read(Vec::with_capacity(2)))
            .await
            .unwrap_or_else(|_| {
                panic!("an owned read on {io} waited for an answer to bytes never sent")
            });
        assert_eq!(r.unwrap(), 2);
        assert_eq!(got, b"ok");
        for s in [&mut traits, &mut owned] {
            AsyncWriteExt::close(s).await.unwrap();
        }
    });
    for p in peers {
        p.join().unwrap();
    }
}

/// A peer that reads `expect` bytes (checking they end with `tail`), then answers `reply`
/// and reads on to the end: a request/response exchange over `b`.
fn answer_after(
    b: UnixStream,
    expect: usize,
    tail: &'static [u8],
    reply: &'static [u8],
) -> std::thread::JoinHandle<()> {
    let mut b = b.into_std().unwrap();
    b.set_nonblocking(false).unwrap();
    std::thread::spawn(move || {
        let mut got = vec![0u8; expect];
        b.read_exact(&mut got).unwrap();
        assert!(got.ends_with(tail), "the request came in the wrong order");
        b.write_all(reply).unwrap();
        let mut rest = Vec::new();
        let _ = b.read_to_end(&mut rest);
    })
}

/// Bytes `AsyncWrite` reported written on an io_uring loop whose send that loop's shutdown
/// cut (the socket was full) reach the peer when the stream next only reads, on an epoll
/// loop (a `LocalExecutor` made after `XTC_IO` changed), by `AsyncRead` or an owned `read`:
/// a request whose answer the read waits for, as on io_uring (`resume_write_behind`). On
/// epoll only a write, flush or close sent them, so the read and the peer waited for each
/// other for good.
#[test]
fn child_a_read_on_an_epoll_loop_sends_what_a_cut_write_behind_left() {
    const ROLE: &str = "read-sends-unsent-epoll";
    if !is_child(ROLE) {
        run_child(
            "child_a_read_on_an_epoll_loop_sends_what_a_cut_write_behind_left",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let Some(pairs) = cut_write_behinds(2) else {
        return;
    };
    reads_get_their_answers(pairs, "epoll", Driver::Epoll);
}

/// Bytes a cut write-behind left unsent that an epoll loop took over (`PollState::unsent`,
/// its flush given up with the socket full) are sent by a read when the stream is back on
/// an io_uring loop, as a cut send is there (`resume_write_behind`): the read may wait for
/// their answer. Only a write, flush or close resubmitted them, so the read and its peer
/// waited for each other for good.
#[test]
fn child_a_read_back_on_io_uring_sends_what_an_epoll_loop_left_unsent() {
    const ROLE: &str = "read-sends-unsent-uring";
    if !is_child(ROLE) {
        run_child(
            "child_a_read_back_on_io_uring_sends_what_an_epoll_loop_left_unsent",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let Some(pairs) = cut_write_behinds(2) else {
        return;
    };
    std::env::set_var("XTC_IO", "epoll");
    let epoll = LocalExecutor::new().unwrap();
    let pairs = epoll.block_on(async move {
        let mut pairs = pairs;
        for (a, _, _) in &mut pairs {
            // The flush takes the cut send over (the socket is still full): it waits, and is
            // given up.
            let flushed =
                xtc_shards::time::timeout(Duration::from_millis(20), AsyncWriteExt::flush(a)).await;
            assert!(flushed.is_err(), "the flush finished with the socket full");
        }
        pairs
    });
    drop(epoll);
    reads_get_their_answers(pairs, "io_uring", Driver::IoUring);
}

/// A stream's `AsyncRead` waits on one epoll loop (its waiter id taken from that loop's
/// driver), then the stream goes to a later epoll loop of this thread (a second
/// `LocalExecutor`), where a task waits through `AsyncRead` again and an owned `read` of the
/// same stream is polled once and dropped: the task must still be woken by the data that
/// comes next. Waiter ids are unique only within one driver, and the `AsyncRead` side kept
/// the first driver's for good: the owned read's fresh id in the second driver was the same
/// number, so it took the task's entry over (one id, one entry) and its drop removed it: the
/// task waited for good.
#[test]
fn an_async_read_wait_on_a_later_loop_survives_an_owned_read_dropped_there() {
    const TEST: &str = "an_async_read_wait_on_a_later_loop_survives_an_owned_read_dropped_there";
    if !is_child("trait_id_later_loop") {
        run_child(TEST, "trait_id_later_loop", &[("XTC_IO", "epoll")]);
        return;
    }
    use std::{cell::RefCell, pin::pin, task::Poll};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        wait.recv().unwrap();
        s.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(3000));
    });
    let first = LocalExecutor::new().unwrap();
    let s = first.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
        let mut s = TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap();
        // Waits on this loop (nothing has come): the `AsyncRead` side's waiter id is taken.
        let mut b = [0u8; 8];
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let polled = futures::io::AsyncRead::poll_read(std::pin::Pin::new(&mut s), &mut cx, &mut b);
        assert!(polled.is_pending());
        s
    });
    drop(first);
    let second = LocalExecutor::new().unwrap();
    let got = second.block_on(async move {
        let s = Rc::new(RefCell::new(s));
        let s2 = s.clone();
        // A task waits through `AsyncRead`, borrowing the stream only while it polls.
        let reader = xtc_shards::spawn_local(async move {
            let mut b = [0u8; 8];
            let n = std::future::poll_fn(|cx| {
                futures::io::AsyncRead::poll_read(
                    std::pin::Pin::new(&mut *s2.borrow_mut()),
                    cx,
                    &mut b,
                )
            })
            .await;
            n.map(|n| b[..n].to_vec())
        });
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        {
            // An owned read of the same stream, polled once and dropped.
            let st = s.borrow();
            let mut read = pin!(st.read(Vec::with_capacity(8)));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(matches!(read.as_mut().poll(&mut cx), Poll::Pending));
        }
        go.send(()).unwrap();
        xtc_shards::time::timeout(HANG, reader).await
    });
    peer.join().unwrap();
    match got {
        Ok(Ok(Ok(b))) => assert_eq!(b, b"x"),
        other => panic!("the AsyncRead waiter: {other:?} (Err(Elapsed): never woken)"),
    }
}

thread_local! {
    /// What the clone of [`flag_waker`] runs, once.
    static ON_CLONE: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Set by a wake of [`flag_waker`].
static FLAG_WOKEN: AtomicBool = AtomicBool::new(false);

/// A waker whose next clone runs `hook` (user code inside `Waker::clone`) and whose wake sets
/// [`FLAG_WOKEN`].
fn flag_waker(hook: impl FnOnce() + 'static) -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    fn clone(p: *const ()) -> RawWaker {
        if let Some(hook) = ON_CLONE.with(|h| h.borrow_mut().take()) {
            hook();
        }
        RawWaker::new(p, &VTABLE)
    }
    fn wake(_: *const ()) {
        FLAG_WOKEN.store(true, SeqCst);
    }
    fn drop_it(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake, drop_it);
    ON_CLONE.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    // SAFETY: the vtable's functions never dereference the (null) data pointer.
    unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

thread_local! {
    static BEHIND: std::cell::RefCell<Option<TcpStream>> = const { std::cell::RefCell::new(None) };
    static PEER: std::cell::RefCell<Option<std::net::TcpStream>> =
        const { std::cell::RefCell::new(None) };
}

/// An owned read on epoll, polled again with a new waker whose clone (user code) makes the
/// read's data arrive and reaps the loop's epoll driver (`shutdown` of another stream, which
/// carries a write-behind send from an earlier io_uring loop, reaps to see whether that send
/// finished): the event that data brings is dispatched between the read's failed readiness
/// check and the listing of its new waker, and must not be lost. It set the ready bit and
/// woke the waker listed before (the first poll's), and the new waker was listed after it for
/// an event that never came: the read waited for good with its data there. (io_uring, for the
/// earlier loop, is skipped where the kernel refuses it.)
#[test]
fn a_readiness_event_dispatched_while_a_waker_is_cloned_is_not_lost() {
    const TEST: &str = "a_readiness_event_dispatched_while_a_waker_is_cloned_is_not_lost";
    if !is_child("event_during_clone") {
        run_child(TEST, "event_during_clone", &[]);
        return;
    }
    use std::{pin::pin, task::Poll};
    let lb = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr_b = lb.local_addr().unwrap();
    std::env::set_var("XTC_IO", "io_uring");
    let Ok(uring) = LocalExecutor::new() else {
        println!("skipped: no io_uring");
        return;
    };
    // A stream with a write-behind send (`AsyncWrite` on io_uring), kept for the epoll loop.
    let b = uring.block_on(async move {
        let mut b = TcpStream::from_std(std::net::TcpStream::connect(addr_b).unwrap()).unwrap();
        AsyncWriteExt::write(&mut b, b"z").await.unwrap();
        b
    });
    drop(uring);
    let (_peer_b, _) = lb.accept().unwrap();
    BEHIND.with(|s| *s.borrow_mut() = Some(b));
    std::env::set_var("XTC_IO", "epoll");
    let epoll = LocalExecutor::new().unwrap();
    let (pending, woken_or_read) = epoll.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(Driver::Epoll));
        let la = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a =
            TcpStream::from_std(std::net::TcpStream::connect(la.local_addr().unwrap()).unwrap())
                .unwrap();
        let (peer_a, _) = la.accept().unwrap();
        PEER.with(|p| *p.borrow_mut() = Some(peer_a));
        let mut read = pin!(a.read(Vec::with_capacity(8)));
        // Waits (the descriptor joins the epoll set), with a no-op waker.
        let noop = std::task::Waker::noop();
        assert!(read
            .as_mut()
            .poll(&mut std::task::Context::from_waker(noop))
            .is_pending());
        // Polled again with a new waker, whose clone brings the data and reaps the driver.
        let waker = flag_waker(|| {
            PEER.with(|p| p.borrow_mut().as_mut().unwrap().write_all(b"y").unwrap());
            let b = BEHIND.with(|s| s.borrow_mut().take()).unwrap();
            let _ = b.shutdown(Shutdown::Write);
            BEHIND.with(|s| *s.borrow_mut() = Some(b));
        });
        let polled = read
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker));
        if let Poll::Ready((r, _)) = polled {
            return (false, r.is_ok_and(|n| n == 1));
        }
        // Pending: the new waker must be woken (the data is there).
        for _ in 0..100 {
            if FLAG_WOKEN.load(SeqCst) {
                break;
            }
            xtc_shards::time::sleep(Duration::from_millis(10)).await;
        }
        (true, FLAG_WOKEN.load(SeqCst))
    });
    BEHIND.with(|s| s.borrow_mut().take());
    assert!(
        woken_or_read,
        "the read (pending: {pending}) was neither done nor woken: the event was lost"
    );
}

/// A stream dropped on an epoll loop with bytes reported written still unsent (the rest of a
/// write-behind cut on io_uring) cannot send them there: they are lost, as documented, and
/// the loss is logged once (a warning saying to flush first), not silent.
#[test]
fn child_a_stream_dropped_with_unsent_bytes_on_epoll_warns() {
    const ROLE: &str = "drop-unsent-warns";
    if !is_child(ROLE) {
        run_child(
            "child_a_stream_dropped_with_unsent_bytes_on_epoll_warns",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let Some((mut a, _b, _filled)) = cut_write_behind() else {
        return;
    };
    let warnings = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tracing::subscriber::with_default(
        common::count_events(tracing::Level::WARN, warnings.clone()),
        || {
            std::env::set_var("XTC_IO", "epoll");
            let epoll = LocalExecutor::new().unwrap();
            epoll.block_on(async move {
                // The epoll loop takes the cut send's bytes over as unsent; the socket stays
                // full, so the flush cannot finish.
                let flushed = xtc_shards::time::timeout(
                    Duration::from_millis(20),
                    AsyncWriteExt::flush(&mut a),
                )
                .await;
                assert!(flushed.is_err(), "the flush finished with the socket full");
                drop(a);
            });
        },
    );
    assert_eq!(
        warnings.load(SeqCst),
        1,
        "the lost bytes were not logged once"
    );
}

// ---------------------------------------------------------------------------------------------
// file operations when io_uring cannot start a kernel worker

/// With no io_uring kernel worker (io-wq) to run it and none that can be started (a thread
/// limit: `RLIMIT_NPROC` here, a cgroup's `pids.max` in a container), the kernel cancels a
/// file operation that must block (`-ECANCELED`): `open` goes to a worker (`IOSQE_ASYNC`).
/// File operations took every `ECANCELED` for the cut of a driver's shutdown and started
/// again, each try cancelled the same way: the call never ended, its task busy for good.
/// The error is returned now (only an `Op` that outlived its driver starts again).
#[test]
fn child_a_file_open_io_uring_cannot_run_fails_instead_of_retrying_for_good() {
    const ROLE: &str = "no-io-worker";
    if !is_child(ROLE) {
        run_child(
            "child_a_file_open_io_uring_cannot_run_fails_instead_of_retrying_for_good",
            ROLE,
            &[("XTC_IO", "io_uring")],
        );
        return;
    }
    let exec = match LocalExecutor::new() {
        Ok(exec) => exec,
        Err(e) => {
            println!("no io_uring here ({e}); skipped");
            return;
        }
    };
    let got = exec.block_on(async {
        no_thread_may_start();
        xtc_shards::time::timeout(
            Duration::from_secs(10),
            xtc_shards::fs::File::open("/proc/self/stat"),
        )
        .await
        .map(|r| r.map(drop).map_err(|e| e.to_string()))
    });
    println!("open: {got:?}");
    assert!(
        got.is_ok(),
        "the open never ended: it started again and again"
    );
}

// ---------------------------------------------------------------------------------------------
// registered buffers under RLIMIT_MEMLOCK

/// The kernel pins every page a registered buffer touches, whole, and counts them against
/// `RLIMIT_MEMLOCK` (without `CAP_IPC_LOCK`): a pool of small buffers far under the limit in
/// bytes (512 x 64 bytes, 32 KiB, under 1 MiB) is refused. The error only named the limit,
/// which the pool seemed to fit many times over; it now says what the kernel counted and the
/// limit it met, so the caller can size the pool (or the limit).
#[test]
fn child_a_fixed_buf_pool_over_the_memlock_limit_says_what_the_kernel_counts() {
    const ROLE: &str = "memlock";
    if !is_child(ROLE) {
        run_child(
            "child_a_fixed_buf_pool_over_the_memlock_limit_says_what_the_kernel_counts",
            ROLE,
            &[],
        );
        return;
    }
    // Before any ring exists: io_uring decides at a ring's setup whether it accounts.
    // SAFETY: plain system calls; the process is this test's child, alone.
    unsafe {
        let rl = libc::rlimit {
            rlim_cur: 1 << 20,
            rlim_max: 1 << 20,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &rl), 0);
        // Not root, whose CAP_IPC_LOCK lifts the limit: `nobody` then.
        if libc::geteuid() == 0 {
            assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
            assert_eq!(libc::setgid(65534), 0);
            assert_eq!(libc::setuid(65534), 0);
        }
    }
    on_each_driver("memlock", 1, |driver| async move {
        match (driver, FixedBufPool::register(512, 64)) {
            (Driver::Epoll, r) => assert!(!r.expect("plain buffers on epoll").is_registered()),
            (_, Ok(_)) => println!("registered: this process may lock memory; nothing to check"),
            (_, Err(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::OutOfMemory, "{e}");
                let msg = e.to_string();
                println!("{msg}");
                assert!(msg.contains("RLIMIT_MEMLOCK"), "{msg}");
                assert!(msg.contains("1048576 bytes"), "names the limit: {msg}");
                assert!(msg.contains(" pages ("), "names what was counted: {msg}");
            }
        }
    });
}

/// A cgroup of this test's own under the cgroup v1 `cpu` hierarchy (or a v2 tree whose new
/// groups get the `cpu` controller), with a CPU quota of `quota_us` per 100 ms; `None` where
/// none can be made here (not root, a container, no such controller).
fn quota_cgroup(quota_us: u64) -> Option<std::path::PathBuf> {
    let name = format!("xtc-test-quota-{}", std::process::id());
    for v1 in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
        let dir = std::path::Path::new(v1).join(&name);
        if std::fs::create_dir(&dir).is_ok() {
            if std::fs::write(dir.join("cpu.cfs_quota_us"), quota_us.to_string()).is_ok() {
                return Some(dir);
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
    let dir = std::path::Path::new("/sys/fs/cgroup").join(&name);
    let controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").ok()?;
    if !controllers.split_whitespace().any(|c| c == "cpu") || std::fs::create_dir(&dir).is_err() {
        return None;
    }
    if std::fs::write(dir.join("cpu.max"), format!("{quota_us} 100000")).is_ok() {
        return Some(dir);
    }
    let _ = std::fs::remove_dir(&dir);
    None
}

/// With no shard count given, an executor has no more shards than its cgroup's CPU quota
/// allows, rounded up: half a CPU of quota, one shard, on a machine where the default is more.
/// (It had one shard per allowed core, all pinned and all throttled by the one quota.) Needs
/// a cgroup it can make (root, not in a container): skipped with a warning elsewhere.
#[test]
fn child_the_default_shard_count_follows_a_cgroup_cpu_quota() {
    const ROLE: &str = "cpu-quota";
    if is_child(ROLE) {
        let dir = std::env::var("XTC_TEST_CGROUP").expect("the cgroup to join");
        std::fs::write(
            std::path::Path::new(&dir).join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .expect("join the cgroup");
        let quota = Executor::builder().build().unwrap();
        assert_eq!(quota.shard_count(), 1, "under half a CPU of quota");
        let asked = Executor::builder().shards(2).build().unwrap();
        assert_eq!(asked.shard_count(), 2, "a count asked for is kept");
        return;
    }
    let default = Executor::builder().build().unwrap().shard_count();
    if default < 2 {
        eprintln!("WARNING: the cgroup quota test not run: the default is {default} shard here");
        return;
    }
    let Some(dir) = quota_cgroup(50_000) else {
        eprintln!("WARNING: the cgroup quota test not run: no cgroup with a CPU quota can be made");
        return;
    };
    let dir_s = dir.to_string_lossy().into_owned();
    let outcome = std::panic::catch_unwind(|| {
        run_child(
            "child_the_default_shard_count_follows_a_cgroup_cpu_quota",
            ROLE,
            &[("XTC_TEST_CGROUP", &dir_s)],
        )
    });
    // The child has exited: the group is empty and goes.
    if let Err(e) = std::fs::remove_dir(&dir) {
        eprintln!(
            "WARNING: the test's cgroup {} is left behind: {e}",
            dir.display()
        );
    }
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

/// `spawn_blocking`'s fallback when no pool thread can start (and the pool has none) runs the
/// job on the loop's thread, inside its turn: the turn's deferred wakes go first, so a job
/// that waits on another shard, fed by a call sent to it (asleep) just before, ends. Its ping
/// waited for the end of the turn, and the job waited for good (here: its 10 s timeout).
#[test]
fn child_an_inline_blocking_job_waiting_on_a_call_sent_before() {
    const ROLE: &str = "inline-job";
    if !is_child(ROLE) {
        let io = std::env::var("XTC_IO").unwrap_or_default();
        run_child(
            "child_an_inline_blocking_job_waiting_on_a_call_sent_before",
            ROLE,
            &[("XTC_IO", if io.is_empty() { "auto" } else { &io })],
        );
        return;
    }
    let exec = common::exec(2);
    let got = exec
        .block_on(|| async {
            // Shard 1 parks (no migratable task: no idle tick).
            sleep(Duration::from_millis(100)).await;
            no_thread_may_start();
            assert!(
                std::thread::Builder::new().spawn(|| {}).is_err(),
                "a thread could still start: nothing is tested"
            );
            let (tx, rx) = std::sync::mpsc::channel();
            // Sent into the ring; its ping to the parked shard 1 waits for the turn's end.
            shard::send_to(1, move || async move {
                let _ = tx.send(5);
            })
            .await
            .unwrap();
            // No pool thread can start and the pool has none: the job runs here, inline.
            xtc_shards::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(10))).await
        })
        .unwrap();
    assert_eq!(
        got.unwrap(),
        Ok(5),
        "the inline job waited on shard 1, which was never pinged"
    );
}
