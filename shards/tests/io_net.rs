//! Networking on both I/O drivers (io_uring and epoll): TCP echo and socket options,
//! `SO_REUSEPORT` across shards, `std` round trips, 1,000 concurrent connections, peers that go
//! away mid-read or mid-write, dropped operations whose buffers the kernel may still fill,
//! UDP, Unix sockets, the `futures::io` traits, registered buffers, and quiescence with I/O in
//! flight.
//!
//! Every test runs its body once per driver (see `io_common::cases`); with `XTC_IO` set it also
//! runs once on the builder's default choice.

mod common;
mod io_common;
use io_common::*;

use std::{
    future::Future,
    io::{self, Read as _, Write as _},
    net::{Shutdown, SocketAddr},
    os::fd::AsRawFd,
    pin::pin,
    rc::Rc,
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc,
    },
    task::{Poll, Waker},
    thread,
    time::Duration,
};

use futures::{
    future::poll_fn,
    io::{AsyncReadExt, AsyncWriteExt},
};
use xtc_shards::{
    io::{Driver, FixedBufPool, IoBuf, IoBufMut},
    net::{TcpListener, TcpStream, UdpSocket, UnixListener, UnixStream},
    shard, spawn_local, submit_to,
    time::sleep,
    Error, Executor, LocalExecutor,
};

// ---------------------------------------------------------------------------------------------
// Helpers

/// `len` bytes of a pattern that differs per `seed` (every byte checkable).
fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i.wrapping_mul(31)).wrapping_add(seed.wrapping_mul(7)) % 251) as u8)
        .collect()
}

/// Reads exactly `n` bytes with owned buffers, never more (each read's buffer holds at most
/// what is still missing); EOF before that fails the test.
async fn read_n(s: &impl Stream, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let want = (n - out.len()).min(64 * 1024);
        let (r, b) = s.read(Vec::with_capacity(want)).await;
        let k = r.expect("read");
        assert!(k > 0, "EOF after {} of {n} bytes", out.len());
        assert!(k <= want, "a read filled past the buffer's capacity");
        assert_eq!(b.len(), k, "a read sets the Vec's length to the count");
        out.extend_from_slice(&b);
    }
    out
}

/// Reads until end of stream; returns everything read.
async fn read_to_end(s: &impl Stream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        let (r, b) = s.read(buf).await;
        match r.expect("read") {
            0 => return out,
            _ => out.extend_from_slice(&b),
        }
        buf = b;
    }
}

/// Echoes until end of stream; returns the bytes echoed.
async fn echo(s: impl Stream) -> usize {
    let mut buf = Vec::with_capacity(16 * 1024);
    let mut total = 0;
    loop {
        let (r, b) = s.read(buf).await;
        let n = match r {
            Ok(0) => return total,
            Ok(n) => n,
            Err(e) => panic!("echo read: {e}"),
        };
        let (w, b) = s.write_all(b).await;
        w.expect("echo write");
        total += n;
        buf = b;
    }
}

/// A connected TCP pair on this loop: (client, server).
/// Waits for a std thread without blocking the loop.
async fn join_thread<T>(h: thread::JoinHandle<T>) -> T {
    guard("helper thread", async {
        while !h.is_finished() {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    h.join().expect("helper thread panicked")
}

/// A fresh socket path in the temp dir.
fn sock_path(tag: &str) -> std::path::PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "xtc-io-{}-{tag}-{}.sock",
        std::process::id(),
        N.fetch_add(1, SeqCst)
    ))
}

/// A simple client/server exchange on the current loop: the server echoes, the client writes
/// `msg`, half-closes and reads everything back.
async fn echo_round_trip(msg: Vec<u8>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = spawn_local(async move {
        let (s, _) = l.accept().await.unwrap();
        echo(s).await
    });
    let c = TcpStream::connect(addr).await.unwrap();
    let (w, _) = c.write_all(msg.clone()).await;
    w.unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_end(&c).await, msg);
    assert_eq!(guard("server", server).await.unwrap(), msg.len());
}

// ---------------------------------------------------------------------------------------------
// 1. TCP basics

#[test]
fn tcp_echo_on_the_default_driver() {
    // No Builder::io_driver: the environment (XTC_IO) or the probe decides.
    let exec = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .build()
        .expect("build with the default driver");
    let driver = exec.io_driver();
    println!("default driver: {driver}");
    if let Some(want) = env_driver() {
        assert_eq!(driver, want, "XTC_IO picks the driver");
    }
    exec.block_on(move || async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(driver));
        echo_round_trip(pattern(1, 100_000)).await;
    })
    .unwrap();
    let st = exec.loop_stats(0).unwrap();
    assert_eq!(st.io_driver, Some(driver));
    assert!(st.io_submitted > 0, "{st:?}");

    // A LocalExecutor follows the same default.
    let local = LocalExecutor::new().unwrap();
    local.block_on(async move {
        assert_eq!(xtc_shards::io::current_driver(), Some(driver));
        echo_round_trip(pattern(2, 10_000)).await;
    });
}

#[test]
fn tcp_echo_addresses_options_and_shutdown() {
    on_each_driver("tcp_echo_addresses_options_and_shutdown", 1, |_| async {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let laddr = l.local_addr().unwrap();
        assert_eq!(laddr.ip(), std::net::Ipv4Addr::LOCALHOST);
        assert_ne!(laddr.port(), 0, "local_addr reports the chosen port");

        let server = spawn_local(async move {
            let (s, peer) = l.accept().await.unwrap();
            assert_eq!(s.peer_addr().unwrap(), peer);
            assert_eq!(s.local_addr().unwrap(), laddr);
            // A short read first: `write` of 5 bytes, then the rest by echo.
            let (r, b) = s.read(Vec::with_capacity(5)).await;
            assert_eq!(r.unwrap(), 5);
            assert_eq!(&b[..], b"hello");
            let (w, _) = s.write(b).await;
            assert_eq!(w.unwrap(), 5);
            let n = echo(&s).await;
            // The client half-closed: answer with our own FIN.
            s.shutdown(Shutdown::Write).unwrap();
            (peer, n)
        });

        let c = TcpStream::connect(laddr).await.unwrap();
        assert_eq!(c.peer_addr().unwrap(), laddr);
        c.set_nodelay(true).unwrap();
        assert!(c.nodelay().unwrap());
        c.set_nodelay(false).unwrap();
        assert!(!c.nodelay().unwrap());
        c.set_nodelay(true).unwrap();

        let (w, _) = c.write(&b"hello"[..]).await;
        assert_eq!(w.unwrap(), 5);
        assert_eq!(read_n(&c, 5).await, b"hello");

        let big = pattern(3, 300_000);
        let (w, back) = c.write_all(big).await;
        w.unwrap();
        assert_eq!(back.len(), 300_000, "write_all gives the buffer back");
        assert_eq!(read_n(&c, 300_000).await, pattern(3, 300_000));
        let (w, _) = c.write_all("a static str").await;
        w.unwrap();
        assert_eq!(read_n(&c, 12).await, b"a static str");
        let boxed: Box<[u8]> = pattern(4, 1000).into_boxed_slice();
        let (w, _) = c.write_all(boxed).await;
        w.unwrap();
        // Box<[u8]> as a read buffer: filled from its start.
        let (r, b) = c.read(vec![0u8; 1000].into_boxed_slice()).await;
        let n = r.unwrap();
        assert!(n > 0);
        assert_eq!(&b[..n], &pattern(4, 1000)[..n]);
        assert_eq!(read_n(&c, 1000 - n).await, pattern(4, 1000)[n..]);

        c.shutdown(Shutdown::Write).unwrap();
        // After our FIN the server sees EOF, shuts down its side, and we see EOF too.
        assert!(read_to_end(&c).await.is_empty());
        let (peer, n) = guard("server", server).await.unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        assert_eq!(n, 300_000 + 12 + 1000);
    });
}

/// Answers every connection with the id of the shard that accepted it.
async fn serve_shard_id(l: TcpListener) {
    loop {
        let (s, _) = match l.accept().await {
            Ok(v) => v,
            Err(e) => panic!("accept: {e}"),
        };
        let (w, _) = s.write_all(vec![shard::id() as u8]).await;
        w.unwrap();
    }
}

/// Fills `s`'s send buffer and its peer's receive buffer (the peer never reads): writes until
/// one does not finish within 100 ms.
async fn fill_send_buffer(s: &TcpStream) {
    loop {
        match xtc_shards::time::timeout(Duration::from_millis(100), s.write(vec![7u8; 1 << 16]))
            .await
        {
            Ok((r, _)) => {
                r.unwrap();
            }
            Err(_) => return,
        }
    }
}

#[test]
fn an_empty_write_returns_at_once_even_on_a_full_socket() {
    // On epoll an empty write waited for room in the send buffer through readiness, and hung
    // for good while the peer did not read; io_uring's empty SEND returned 0 at once.
    on_each_driver(
        "an_empty_write_returns_at_once_even_on_a_full_socket",
        1,
        |driver| async move {
            let (mut a, _b) = tcp_pair().await;
            fill_send_buffer(&a).await;
            let limit = HANG; // a hang guard: an empty write answers at once
            let (r, _) = xtc_shards::time::timeout(limit, a.write(Vec::new()))
                .await
                .unwrap_or_else(|_| panic!("[{driver}] write(empty) hung on a full socket"));
            assert_eq!(r.unwrap(), 0, "[{driver}]");
            let (r, _) = xtc_shards::time::timeout(limit, a.write_all(Vec::new()))
                .await
                .unwrap_or_else(|_| panic!("[{driver}] write_all(empty) hung"));
            r.unwrap();
            let r = xtc_shards::time::timeout(limit, AsyncWriteExt::write(&mut a, &[]))
                .await
                .unwrap_or_else(|_| panic!("[{driver}] AsyncWrite::write(&[]) hung"));
            assert_eq!(r.unwrap(), 0, "[{driver}]");
        },
    );
}

/// The same behind an `AsyncWrite` send still in flight (io_uring write-behind) on a full
/// socket: an empty write, owned or through `AsyncWrite`, waited for that send, so it hung
/// while the peer did not read (on epoll those bytes sit in the socket's buffer, and an empty
/// write returns at once).
#[test]
fn an_empty_write_returns_at_once_behind_a_stuck_async_write() {
    on_each_driver(
        "an_empty_write_returns_at_once_behind_a_stuck_async_write",
        1,
        |driver| async move {
            let (mut a, _b) = tcp_pair().await;
            // Until a write does not finish within 100 ms: on io_uring each write waits for
            // the send of the one before, so the last send reported written is stuck.
            loop {
                let chunk = [7u8; 1 << 16];
                let w = AsyncWriteExt::write(&mut a, &chunk);
                match xtc_shards::time::timeout(Duration::from_millis(100), w).await {
                    Ok(r) => assert!(r.unwrap() > 0),
                    Err(_) => break,
                }
            }
            let limit = HANG; // a hang guard: an empty write answers at once
            let r = xtc_shards::time::timeout(limit, AsyncWriteExt::write(&mut a, &[]))
                .await
                .unwrap_or_else(|_| panic!("[{driver}] AsyncWrite::write(&[]) hung"));
            assert_eq!(r.unwrap(), 0, "[{driver}]");
            let (r, _) = xtc_shards::time::timeout(limit, a.write(Vec::new()))
                .await
                .unwrap_or_else(|_| panic!("[{driver}] write(empty) hung"));
            assert_eq!(r.unwrap(), 0, "[{driver}]");
            let (r, _) = xtc_shards::time::timeout(limit, a.write_all(Vec::new()))
                .await
                .unwrap_or_else(|_| panic!("[{driver}] write_all(empty) hung"));
            r.unwrap();
        },
    );
}

#[test]
fn tcp_bind_reuseport_on_two_shards_both_accept() {
    each_driver(
        "tcp_bind_reuseport_on_two_shards_both_accept",
        2,
        |b| b,
        |_, exec| {
            exec.block_on(|| async {
                let l0 = TcpListener::bind_reuseport("127.0.0.1:0").unwrap();
                let port = l0.local_addr().unwrap().port();
                // A listener without SO_REUSEPORT cannot join.
                assert!(TcpListener::bind(("127.0.0.1", port)).is_err());
                submit_to(1, move || async move {
                    let l1 = TcpListener::bind_reuseport(("127.0.0.1", port)).unwrap();
                    assert_eq!(l1.local_addr().unwrap().port(), port);
                    spawn_local(serve_shard_id(l1));
                })
                .await
                .unwrap();
                spawn_local(serve_shard_id(l0));
                let mut seen = [0usize; 2];
                for i in 0..1000 {
                    let c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                    let id = read_n(&c, 1).await[0] as usize;
                    seen[id] += 1;
                    if i >= 16 && seen.iter().all(|&n| n > 0) {
                        break;
                    }
                }
                assert!(
                    seen.iter().all(|&n| n > 0),
                    "both reuseport listeners must accept: {seen:?}"
                );
            })
            .unwrap();
        },
    );
}

/// An accept loop whose listener always has a connection waiting lets the loop turn
/// (`common::turns_during`): a flood of connects starved every other task of the shard. On
/// epoll a call that finds its fd ready returns at once; io_uring completes each operation
/// through a loop turn.
#[test]
fn an_accept_loop_with_a_full_backlog_lets_the_loop_turn() {
    const N: usize = 200;
    on_each_driver(
        "an_accept_loop_with_a_full_backlog_lets_the_loop_turn",
        1,
        |driver| async move {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            // Every client is in the backlog before the first accept (loopback completes the
            // handshake in `connect`; the backlog holds 1,024).
            let clients: Vec<_> = (0..N)
                .map(|_| std::net::TcpStream::connect(addr).unwrap())
                .collect();
            let what = format!("[{driver}] ready accepts");
            common::turns_during(&what, N, async |_| {
                let (s, _) = guard("accept", l.accept()).await.unwrap();
                drop(s);
            })
            .await;
            drop(clients);
        },
    );
}

/// A read loop over a stream whose bytes are all queued lets the loop turn
/// (`common::turns_during`): a peer that keeps a connection full starved every other task of
/// the shard (the accept loop's old fix was the accept's own; every ready call now spends the
/// task's budget).
#[test]
fn a_read_loop_over_queued_bytes_lets_the_loop_turn() {
    const N: usize = 512;
    const CHUNK: usize = 64;
    on_each_driver(
        "a_read_loop_over_queued_bytes_lets_the_loop_turn",
        1,
        |driver| async move {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = guard("accept", l.accept()).await.unwrap();
            // 32 KiB: well inside loopback's socket buffers, so this blocking write returns
            // (and a loopback write is delivered by the writing call).
            let sent = pattern(3, N * CHUNK);
            peer.write_all(&sent).unwrap();
            let mut got = Vec::with_capacity(sent.len());
            let what = format!("[{driver}] ready reads");
            common::turns_during(&what, N, async |_| {
                let (r, b) = guard("read", s.read(Vec::with_capacity(CHUNK))).await;
                assert_eq!(r.unwrap(), b.len());
                got.extend_from_slice(&b);
            })
            .await;
            assert_eq!(got, sent, "[{driver}] bytes read in order, none lost");
        },
    );
}

/// The same for owned-buffer writes into a socket with room and for `UdpSocket::recv_from`
/// over queued datagrams.
#[test]
fn write_and_datagram_loops_on_ready_sockets_let_the_loop_turn() {
    const N: usize = 200;
    on_each_driver(
        "write_and_datagram_loops_on_ready_sockets_let_the_loop_turn",
        1,
        |driver| async move {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = guard("accept", l.accept()).await.unwrap();
            // 200 writes of 64 bytes: 12.8 KiB, far inside the socket buffers.
            let what = format!("[{driver}] ready writes");
            common::turns_during(&what, N, async |i| {
                let (r, _) = guard("write", s.write_all(pattern(i, 64))).await;
                r.unwrap();
            })
            .await;
            let mut got = vec![0u8; N * 64];
            peer.read_exact(&mut got).unwrap();
            let want: Vec<u8> = (0..N).flat_map(|i| pattern(i, 64)).collect();
            assert_eq!(got, want, "[{driver}] bytes written in order");

            let u = UdpSocket::bind("127.0.0.1:0").unwrap();
            let from = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            for i in 0..N {
                from.send_to(&(i as u32).to_le_bytes(), u.local_addr().unwrap())
                    .unwrap();
            }
            let what = format!("[{driver}] ready datagram receives");
            common::turns_during(&what, N, async |i| {
                let (r, b) = guard("recv_from", u.recv_from(Vec::with_capacity(16))).await;
                let (n, _) = r.unwrap();
                assert_eq!(
                    &b[..n],
                    &(i as u32).to_le_bytes(),
                    "[{driver}] datagram order"
                );
            })
            .await;
        },
    );
}

#[test]
fn tcp_from_std_into_std_round_trip() {
    on_each_driver("tcp_from_std_into_std_round_trip", 1, |_| async {
        let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_l.local_addr().unwrap();
        let l = TcpListener::from_std(std_l).unwrap();
        assert_eq!(l.local_addr().unwrap(), addr);
        // And back and forth again: the listener still works after the round trip.
        let l = TcpListener::from_std(l.into_std().unwrap()).unwrap();

        // A std client, connected before the accept (it waits in the backlog).
        let std_c = std::net::TcpStream::connect(addr).unwrap();
        let (s, peer) = l.accept().await.unwrap();
        assert_eq!(peer, std_c.local_addr().unwrap());
        let c = TcpStream::from_std(std_c).unwrap();
        let (w, _) = c.write_all(&b"ping"[..]).await;
        w.unwrap();
        assert_eq!(read_n(&s, 4).await, b"ping");

        // Server stream out to std (non-blocking), then back.
        let std_s = s.into_std().unwrap();
        assert_eq!(std_s.peer_addr().unwrap(), peer);
        std_s.set_nonblocking(false).unwrap();
        (&std_s).write_all(b"pong").unwrap();
        assert_eq!(read_n(&c, 4).await, b"pong");
        let s = TcpStream::from_std(std_s).unwrap();
        let (w, _) = s.write_all(pattern(5, 70_000)).await;
        w.unwrap();
        assert_eq!(read_n(&c, 70_000).await, pattern(5, 70_000));

        // The client out to std: a blocking read sees what the server sends.
        let mut std_c = c.into_std().unwrap();
        std_c.set_nonblocking(false).unwrap();
        let (w, _) = s.write_all(&b"bye"[..]).await;
        w.unwrap();
        let mut got = [0u8; 3];
        std_c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"bye");
    });
}

#[test]
fn io_off_any_loop_is_an_error() {
    // Binding is synchronous and works anywhere; operations need a loop.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let err = futures::executor::block_on(TcpStream::connect(addr)).unwrap_err();
    assert!(err.to_string().contains("off any xtc loop"), "{err}");
    let err = futures::executor::block_on(l.accept()).unwrap_err();
    assert!(err.to_string().contains("off any xtc loop"), "{err}");
    assert_eq!(xtc_shards::io::current_driver(), None);
}

// ---------------------------------------------------------------------------------------------
// 2. 1,000 concurrent connections

#[test]
fn tcp_echo_1000_concurrent_connections() {
    const N: usize = 1000;
    let need = (2 * N + 200) as libc::rlim_t;
    let have = raise_nofile(need);
    if have < need {
        println!(
            "tcp_echo_1000_concurrent_connections: skipped: RLIMIT_NOFILE is {have} (hard limit \
             too low for {need} descriptors)"
        );
        return;
    }
    each_driver(
        "tcp_echo_1000_concurrent_connections",
        2,
        |b| b,
        |_, exec| {
            let accepted = Arc::new(AtomicUsize::new(0));
            let echoed = Arc::new(AtomicUsize::new(0));
            let (acc, ech) = (accepted.clone(), echoed.clone());
            let sent = exec
                .block_on(move || async move {
                    fn serve(l: TcpListener, acc: Arc<AtomicUsize>, ech: Arc<AtomicUsize>) {
                        spawn_local(async move {
                            loop {
                                let (s, _) = l.accept().await.unwrap();
                                acc.fetch_add(1, SeqCst);
                                let ech = ech.clone();
                                spawn_local(async move {
                                    let n = echo(s).await;
                                    ech.fetch_add(n, SeqCst);
                                });
                            }
                        });
                    }
                    let l0 = TcpListener::bind_reuseport("127.0.0.1:0").unwrap();
                    let addr = l0.local_addr().unwrap();
                    let (a1, e1) = (acc.clone(), ech.clone());
                    submit_to(1, move || async move {
                        serve(TcpListener::bind_reuseport(addr).unwrap(), a1, e1);
                    })
                    .await
                    .unwrap();
                    serve(l0, acc, ech);
                    let clients: Vec<_> = (0..N)
                        .map(|i| {
                            spawn_local(async move {
                                let c = TcpStream::connect(addr).await.unwrap();
                                let msg = pattern(i, 1 + (i * 37) % 5000);
                                let (w, msg) = c.write_all(msg).await;
                                w.unwrap();
                                let back = read_n(&c, msg.len()).await;
                                assert_eq!(back, msg, "connection {i}: echo differs");
                                c.shutdown(Shutdown::Write).unwrap();
                                assert!(read_to_end(&c).await.is_empty());
                                msg.len()
                            })
                        })
                        .collect();
                    let mut sent = 0;
                    for c in clients {
                        sent += guard("a client", c).await.unwrap();
                    }
                    sent
                })
                .unwrap();
            assert_eq!(accepted.load(SeqCst), N);
            // Every client read its echo back in full, so every byte was echoed (the servers'
            // tasks count theirs when they see EOF, which may still be pending for a few).
            assert!(echoed.load(SeqCst) <= sent);
            assert_eq!(
                sent,
                (0..N).map(|i| 1 + (i * 37) % 5000).sum::<usize>(),
                "bytes sent"
            );
        },
    );
}

/// A small xorshift, seeded per task.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Reads a few bytes, writes them back, closes.
async fn echo_once(s: TcpStream) {
    let (r, b) = s.read(Vec::with_capacity(64)).await;
    if matches!(r, Ok(n) if n > 0) {
        let _ = s.write_all(b).await;
    }
}

/// The accepting tasks of one shard's listener for [`churn_dropped_accepts`]: accepts cut by
/// short timeouts, raced against yields and sleeps, and in tasks aborted while accepting,
/// beside a plain accept loop that always waits.
fn serve_churn(l: TcpListener, seed: u64, accepted: Arc<AtomicUsize>) {
    let l = Rc::new(l);
    let got = move |s: TcpStream, acc: &AtomicUsize| {
        acc.fetch_add(1, SeqCst);
        spawn_local(echo_once(s));
    };
    let (l1, a1) = (l.clone(), accepted.clone());
    spawn_local(async move {
        let mut rng = Rng(0x9E37_79B9 ^ seed);
        loop {
            let d = Duration::from_micros(rng.below(500));
            if let Ok(r) = xtc_shards::time::timeout(d, l1.accept()).await {
                got(r.expect("accept").0, &a1);
            }
        }
    });
    let (l2, a2) = (l.clone(), accepted.clone());
    spawn_local(async move {
        let mut rng = Rng(0x1234_5678 ^ seed);
        loop {
            let yielded = rng.below(2) == 0;
            let pause = Duration::from_micros(rng.below(300));
            let other = std::pin::pin!(async move {
                if yielded {
                    xtc_shards::yield_now().await
                } else {
                    sleep(pause).await
                }
            });
            let accept = std::pin::pin!(l2.accept());
            if let futures::future::Either::Left((r, _)) =
                futures::future::select(accept, other).await
            {
                got(r.expect("accept").0, &a2);
            }
        }
    });
    let (l3, a3) = (l.clone(), accepted.clone());
    spawn_local(async move {
        let mut rng = Rng(0xDEAD_BEEF ^ seed);
        loop {
            let (l, acc) = (l3.clone(), a3.clone());
            // The echo is spawned in the accept's poll: an abort after it cuts no echo.
            let t = spawn_local(async move { got(l.accept().await.expect("accept").0, &acc) });
            sleep(Duration::from_micros(rng.below(400))).await;
            t.abort();
        }
    });
    spawn_local(async move {
        loop {
            got(l.accept().await.expect("accept").0, &accepted);
        }
    });
}

/// Connection churn with accepts dropped mid-flight on a 2-shard `SO_REUSEPORT` server, so
/// kept accepts (io_uring) are taken, dropped again and handed over all the time: every
/// connection of clients on plain threads (connect, send 8 bytes, read the echo, close) gets
/// its echo. `XTC_CHURN_CONNS` sets the number of connections (default 4,000) for longer
/// stress runs; a watchdog prints each loop's `LoopStats` while no connection completes.
#[test]
fn churn_dropped_accepts() {
    const CLIENTS: usize = 4;
    let total: usize = std::env::var("XTC_CHURN_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000);
    let limit = Duration::from_secs(120);
    each_driver(
        "churn_dropped_accepts",
        2,
        |b| b,
        |driver, exec| {
            let done = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let watchdog = {
                let (done, finished, handle) = (done.clone(), finished.clone(), exec.handle());
                thread::spawn(move || {
                    let mut last = (0, std::time::Instant::now());
                    while !finished.load(SeqCst) {
                        thread::sleep(Duration::from_millis(50));
                        let d = done.load(SeqCst);
                        if d != last.0 {
                            last = (d, std::time::Instant::now());
                        } else if last.1.elapsed() > Duration::from_secs(5) {
                            eprintln!(
                                "churn_dropped_accepts [{driver}] pid {}: no connection done \
                                 for {:?}, at {d} of {total}",
                                std::process::id(),
                                last.1.elapsed()
                            );
                            for i in 0..2 {
                                eprintln!("  shard {i}: {:?}", handle.loop_stats(i));
                            }
                            last.1 = std::time::Instant::now();
                        }
                    }
                })
            };
            let (d, s) = (done.clone(), stop.clone());
            let r = exec.block_on(move || async move {
                let accepted = Arc::new(AtomicUsize::new(0));
                let l0 = TcpListener::bind_reuseport("127.0.0.1:0").unwrap();
                let addr = l0.local_addr().unwrap();
                let a1 = accepted.clone();
                submit_to(1, move || async move {
                    serve_churn(TcpListener::bind_reuseport(addr).unwrap(), 1, a1);
                })
                .await
                .unwrap();
                serve_churn(l0, 0, accepted.clone());
                let clients: Vec<_> = (0..CLIENTS)
                    .map(|id| {
                        let (d, s) = (d.clone(), s.clone());
                        thread::spawn(move || {
                            for i in 0..total / CLIENTS {
                                if s.load(SeqCst) {
                                    return;
                                }
                                let mut c = std::net::TcpStream::connect(addr)
                                    .unwrap_or_else(|e| panic!("client {id}: connect {i}: {e}"));
                                c.set_read_timeout(Some(limit + Duration::from_secs(10)))
                                    .unwrap();
                                let msg = ((id << 32 | i) as u64).to_le_bytes();
                                c.write_all(&msg).unwrap();
                                let mut back = [0u8; 8];
                                match c.read_exact(&mut back) {
                                    Ok(()) => assert_eq!(back, msg, "client {id}: echo {i}"),
                                    Err(_) if s.load(SeqCst) => return,
                                    Err(e) => panic!("client {id}: connection {i}: no echo: {e}"),
                                }
                                d.fetch_add(1, SeqCst);
                            }
                        })
                    })
                    .collect();
                let start = std::time::Instant::now();
                while !clients.iter().all(|c| c.is_finished()) {
                    if start.elapsed() > limit {
                        s.store(true, SeqCst);
                        panic!(
                            "[{driver}] churn_dropped_accepts stalled: {} of {total} connections \
                             echoed after {limit:?} ({} accepted)",
                            d.load(SeqCst),
                            accepted.load(SeqCst)
                        );
                    }
                    sleep(Duration::from_millis(5)).await;
                }
                for c in clients {
                    c.join().expect("a client thread panicked");
                }
                assert_eq!(accepted.load(SeqCst), total / CLIENTS * CLIENTS);
            });
            finished.store(true, SeqCst);
            watchdog.join().unwrap();
            r.unwrap_or_else(|e| panic!("churn_dropped_accepts [{driver}]: {e}"));
            assert_eq!(done.load(SeqCst), total / CLIENTS * CLIENTS);
        },
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Peers that go away

#[test]
fn peer_disconnects_mid_read() {
    on_each_driver("peer_disconnects_mid_read", 1, |_| async {
        for rst in [false, true] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            // The server expects 2,000 bytes; the client sends half and goes away.
            let server = spawn_local(async move {
                let (s, _) = l.accept().await.unwrap();
                if rst {
                    // Unread data at the client makes its close a reset.
                    let (w, _) = s.write_all(pattern(9, 1000)).await;
                    w.unwrap();
                }
                let mut got = Vec::new();
                let mut buf = Vec::with_capacity(2000);
                loop {
                    let (r, b) = s.read(buf).await;
                    match r {
                        Ok(0) => return (got, None),
                        Ok(_) => got.extend_from_slice(&b),
                        Err(e) => return (got, Some(e)),
                    }
                    assert!(got.len() <= 1000);
                    buf = b;
                }
            });
            let c = TcpStream::connect(addr).await.unwrap();
            if rst {
                // Make sure the server's bytes arrived (unread) before we close.
                sleep(Duration::from_millis(20)).await;
            }
            let (w, _) = c.write_all(pattern(8, 1000)).await;
            w.unwrap();
            drop(c);
            let (got, err) = guard("the server's read", server).await.unwrap();
            let half = pattern(8, 1000);
            match err {
                None => assert_eq!(got, half, "EOF after all the bytes that were sent"),
                Some(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
                    assert_eq!(got[..], half[..got.len()], "a prefix, uncorrupted");
                }
            }
        }
    });
}

/// Writes to a stream whose peer closed until the write fails; returns the error.
async fn write_until_error(s: &TcpStream) -> io::Error {
    let mut buf = pattern(10, 64 * 1024);
    for _ in 0..10_000 {
        let (r, b) = s.write_all(buf).await;
        buf = b;
        if let Err(e) = r {
            return e;
        }
    }
    panic!("writes to a closed peer kept succeeding");
}

fn is_peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    )
}

#[test]
fn write_to_a_closed_peer_is_a_plain_error() {
    on_each_driver("write_to_a_closed_peer_is_a_plain_error", 1, |_| async {
        // Owned-buffer writes.
        let (c, s) = tcp_pair().await;
        drop(c);
        let e = guard("writes", write_until_error(&s)).await;
        assert!(is_peer_gone(&e), "EPIPE or ECONNRESET, got {e}");

        // The futures::io path.
        let (c, mut s) = tcp_pair().await;
        drop(c);
        let data = pattern(11, 64 * 1024);
        let e = guard("AsyncWrite", async {
            for _ in 0..10_000 {
                if let Err(e) = AsyncWriteExt::write_all(&mut s, &data).await {
                    return e;
                }
                if let Err(e) = AsyncWriteExt::flush(&mut s).await {
                    return e;
                }
            }
            panic!("AsyncWrite to a closed peer kept succeeding");
        })
        .await;
        assert!(is_peer_gone(&e), "EPIPE or ECONNRESET, got {e}");
    });
}

// ---------------------------------------------------------------------------------------------
// 4. Dropped operations whose buffers the kernel may still fill

/// Starts `fut`, polls it once with the task's waker (it must be pending), lets the loop submit
/// it and park, then drops it.
async fn poll_once_then_drop<F: Future>(fut: F) {
    let mut fut = Box::pin(fut);
    let pending = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await;
    assert!(pending, "the operation had nothing to complete with yet");
    // A park in the driver: io_uring submits the operation, epoll arms the fd.
    sleep(Duration::from_millis(2)).await;
    drop(fut);
}

/// What these two tests assert: after a read future is dropped (its 1 MiB buffer either freed
/// at once on epoll, or handed to the driver until the kernel's completion on io_uring), a
/// peer's write arrives intact in a fresh read. On epoll a dropped read never touched the
/// socket; on io_uring its receive is kept running by the stream, which hands what it got to
/// the next read. Either way every byte arrives, in order.
/// The connection keeps working and nothing crashes (under `scripts/valgrind`: no invalid
/// read or write). The `run()` variant adds that the loop's in-flight count drains: `run()`
/// reaches quiescence (a leaked operation would keep the loop waiting forever) and, on
/// io_uring, every submitted operation completed.
async fn dropped_reads_then_the_peer_writes(driver: Driver) {
    let (a, b) = tcp_pair().await;
    let mut complete = 0;
    for round in 0..50 {
        poll_once_then_drop(a.read(Vec::with_capacity(1 << 20))).await;
        let msg = pattern(round, 4096 + round);
        let (w, _) = b.write_all(msg.clone()).await;
        w.unwrap();
        // A fresh read (its own buffer) sees the data.
        let (r, got) = guard("fresh read", a.read(Vec::with_capacity(1 << 20))).await;
        let n = r.unwrap();
        assert!(n > 0);
        let mut got = got;
        // Whatever is missing is still in the socket.
        if n < msg.len() {
            got.extend(read_n(&a, msg.len() - n).await);
        }
        assert_eq!(got, msg, "round {round}: data lost or corrupted");
        complete += 1;
        // The connection still works both ways.
        let (w, _) = a.write_all(pattern(round + 1000, 100)).await;
        w.unwrap();
        assert_eq!(read_n(&b, 100).await, pattern(round + 1000, 100));
    }
    assert_eq!(complete, 50, "{driver}");

    // The same with the futures::io read path (internal buffer on io_uring).
    let (mut a, b) = tcp_pair().await;
    let mut small = [0u8; 64];
    poll_once_then_drop(AsyncReadExt::read(&mut a, &mut small)).await;
    let msg = pattern(77, 50_000);
    let (w, _) = b.write_all(msg.clone()).await;
    w.unwrap();
    let mut got = vec![0u8; msg.len()];
    guard("read_exact", a.read_exact(&mut got)).await.unwrap();
    // io_uring keeps the AsyncRead's read in flight across the dropped future, so
    // nothing is lost on either driver.
    assert_eq!(got, msg);
}

#[test]
fn dropped_read_future_then_the_peer_writes() {
    on_each_driver(
        "dropped_read_future_then_the_peer_writes",
        1,
        dropped_reads_then_the_peer_writes,
    );
}

/// The `run()` variant of [`dropped_read_future_then_the_peer_writes`].
#[test]
fn run_quiesces_after_dropped_reads() {
    each_driver(
        "run_quiesces_after_dropped_reads",
        1,
        |b| b,
        |driver, exec| {
            exec.spawn_on(0, move || dropped_reads_then_the_peer_writes(driver))
                .unwrap();
            io_common::run_or_fail(&exec, "dropped reads");
            if driver == Driver::IoUring {
                let st = exec.loop_stats(0).unwrap();
                assert_eq!(
                    st.io_submitted, st.io_completed,
                    "every io_uring operation completed: {st:?}"
                );
            }
        },
    );
}

/// Reads started and dropped while another thread writes: every read returns the next run of
/// the writer's byte sequence (no foreign, stale or skipped bytes: on io_uring a dropped read's
/// receive is kept by the stream and its bytes go to the next read), and the stream ends
/// cleanly with every byte delivered.
#[test]
fn dropped_reads_racing_a_writer_thread() {
    on_each_driver(
        "dropped_reads_racing_a_writer_thread",
        1,
        |driver| async move {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            const TOTAL: usize = 4 << 20;
            let writer = thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                let data: Vec<u8> = (0..TOTAL).map(|i| (i % 251) as u8).collect();
                for chunk in data.chunks(7919) {
                    s.write_all(chunk).unwrap();
                }
            });
            let (s, _) = l.accept().await.unwrap();
            // Position in the writer's sequence (mod 251) and bytes that reached completed reads.
            let (mut pos, mut delivered) = (0usize, 0usize);
            let mut check = |b: &[u8], round: usize| {
                // A run of the sequence: consecutive values mod 251 from some start.
                let start = b[0] as usize;
                for (k, &v) in b.iter().enumerate() {
                    assert_eq!(
                        v as usize,
                        (start + k) % 251,
                        "round {round}: corrupted at {k}"
                    );
                }
                assert_eq!(start, pos % 251, "round {round}: bytes lost [{driver}]");
                pos = start + b.len();
                delivered += b.len();
            };
            let mut buf = Vec::with_capacity(64 * 1024);
            let mut round = 0usize;
            loop {
                round += 1;
                if round % 3 == 0 {
                    // A read polled once and dropped if pending. If it completes at once, its
                    // bytes count like any read's.
                    let mut fut = pin!(s.read(Vec::with_capacity(32 * 1024)));
                    let now = poll_fn(|cx| {
                        Poll::Ready(match fut.as_mut().poll(cx) {
                            Poll::Ready(v) => Some(v),
                            Poll::Pending => None,
                        })
                    })
                    .await;
                    if let Some((r, b)) = now {
                        if r.unwrap() == 0 {
                            break;
                        }
                        check(&b, round);
                    }
                }
                let (r, b) = guard("read", s.read(buf)).await;
                if r.unwrap() == 0 {
                    break;
                }
                check(&b, round);
                buf = b;
            }
            join_thread(writer).await;
            assert_eq!(delivered, TOTAL, "[{driver}]");
        },
    );
}

/// A listener dropped after an `accept` future of it was dropped closes the connection that
/// accept had taken (io_uring keeps it for the next `accept`): the client sees end of stream
/// or a reset, never a connection nobody owns.
#[test]
fn dropped_accept_does_not_leak_the_connection() {
    on_each_driver(
        "dropped_accept_does_not_leak_the_connection",
        1,
        |_| async {
            for wait_for_completion in [true, false] {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                let mut fut = Box::pin(l.accept());
                let pending = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await;
                assert!(pending);
                sleep(Duration::from_millis(2)).await;
                let client = std::net::TcpStream::connect(addr).unwrap();
                if wait_for_completion {
                    // Let the loop reap the accept's completion before the future goes.
                    sleep(Duration::from_millis(50)).await;
                }
                drop(fut);
                drop(l);
                let reader = thread::spawn(move || {
                    client
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .unwrap();
                    let mut b = [0u8; 1];
                    (&client).read(&mut b)
                });
                // Keep the loop turning (completions of the cancelled accept) while the client reads.
                match join_thread(reader).await {
                    Ok(0) => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                    other => panic!(
                        "the accepted-then-dropped connection stayed open (leaked fd): {other:?}"
                    ),
                }
            }
        },
    );
}

/// An `accept` future dropped after the kernel took a connection for it (a `select!` or
/// `timeout` whose other branch won) loses no connection: the next `accept` gets it, as on
/// epoll, with `std` and with tokio. On io_uring the dropped accept was cancelled and the
/// connection it held closed under its client, and the next `accept` waited for good.
#[test]
fn a_dropped_accept_loses_no_connection() {
    on_each_driver(
        "a_dropped_accept_loses_no_connection",
        1,
        |driver| async move {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let mut fut = Box::pin(l.accept());
            assert!(poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await);
            let client = client_that_writes(addr, b"hello");
            sleep(Duration::from_millis(100)).await; // the loop reaps the accept's completion
            drop(fut);
            let _client = join_thread(client).await;
            let (s, _) = xtc_shards::time::timeout(HANG, l.accept())
                .await
                .unwrap_or_else(|_| panic!("[{driver}] the dropped accept's connection was lost"))
                .unwrap();
            assert_eq!(read_n(&s, 5).await, b"hello");
        },
    );
}

/// `into_std` after an `accept` future was dropped holding a connection (io_uring keeps that
/// accept for the next `accept`) loses no connection: the connection comes out of the `std`
/// listener (epoll, where the dropped accept took nothing) or, refused with the listener handed
/// back (io_uring: the connection cannot go back to the kernel's queue), out of its next
/// `accept`. `into_std` dropped the kept accept, closing the connection under its client.
#[test]
fn into_std_after_a_dropped_accept_loses_no_connection() {
    on_each_driver(
        "into_std_after_a_dropped_accept_loses_no_connection",
        1,
        |driver| async move {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let mut fut = Box::pin(l.accept());
            assert!(poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await);
            let client = client_that_writes(addr, b"hello");
            sleep(Duration::from_millis(100)).await; // the loop reaps the accept's completion
            drop(fut);
            let _client = join_thread(client).await;
            let std_l = match l.into_std() {
                Ok(std_l) => std_l,
                Err(e) => {
                    assert_eq!(driver, Driver::IoUring, "only io_uring keeps an accept");
                    let l = e.into_inner();
                    let (s, _) = xtc_shards::time::timeout(HANG, l.accept())
                        .await
                        .unwrap_or_else(|_| panic!("[{driver}] the kept connection was lost"))
                        .unwrap();
                    assert_eq!(read_n(&s, 5).await, b"hello");
                    // Nothing kept any more: it unwraps, and that listener has no connection.
                    let std_l = l.into_std().expect("nothing kept after the accept");
                    assert_eq!(
                        std_l.accept().map(drop).unwrap_err().kind(),
                        io::ErrorKind::WouldBlock
                    );
                    return;
                }
            };
            // In the `std` listener's queue (non-blocking): a hang guard.
            let deadline = std::time::Instant::now() + HANG;
            let mut s = loop {
                match std_l.accept() {
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "[{driver}] into_std lost the dropped accept's connection"
                        );
                        sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => panic!("[{driver}] accept: {e}"),
                }
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"hello");
        },
    );
}

/// A `std` client on a thread of its own that connects to `addr` and writes `msg` (join it
/// with [`join_thread`], which keeps the loop turning meanwhile).
fn client_that_writes(
    addr: SocketAddr,
    msg: &'static [u8],
) -> thread::JoinHandle<std::net::TcpStream> {
    thread::spawn(move || {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(msg).unwrap();
        c
    })
}

/// Two accepts in flight, one dropped before any client comes: the other still gets the first
/// connection (a dropped accept is cancelled, not left armed, so it cannot take the connection
/// the other waits for).
#[test]
fn an_accept_dropped_beside_another_leaves_it_the_connection() {
    on_each_driver("an_accept_dropped_beside_another", 1, |driver| async move {
        let l = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = l.local_addr().unwrap();
        let mut dropped = Box::pin(l.accept());
        assert!(poll_fn(|cx| Poll::Ready(dropped.as_mut().poll(cx).is_pending())).await);
        let l2 = l.clone();
        let waiting = spawn_local(async move { l2.accept().await.map(|(s, _)| s) });
        xtc_shards::yield_now().await; // the second accept is in the kernel too
        drop(dropped);
        let client = client_that_writes(addr, b"hi");
        let _client = join_thread(client).await;
        let s = xtc_shards::time::timeout(HANG, waiting)
            .await
            .unwrap_or_else(|_| panic!("[{driver}] the waiting accept never got the connection"))
            .unwrap()
            .unwrap();
        assert_eq!(read_n(&s, 2).await, b"hi");
    });
}

/// An `accept` dropped holding a connection (io_uring keeps it for the listener) while another
/// `accept` of the listener already waits in the kernel: the waiting one gets that connection,
/// as on epoll, where the dropped accept took nothing. The kept connection woke nobody, so it
/// waited for the next `accept` call, which the waiting one only made after yet another client
/// came: under connection churn, a client parked there for good once the others stopped.
#[test]
fn a_connection_kept_from_a_dropped_accept_reaches_an_accept_already_waiting() {
    on_each_driver(
        "kept_connection_reaches_a_waiting_accept",
        1,
        |driver| async move {
            let l = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = l.local_addr().unwrap();
            let mut dropped = Box::pin(l.accept());
            assert!(poll_fn(|cx| Poll::Ready(dropped.as_mut().poll(cx).is_pending())).await);
            let client = client_that_writes(addr, b"hi");
            let _client = join_thread(client).await;
            sleep(Duration::from_millis(100)).await; // the loop reaps the accept's completion
            let l2 = l.clone();
            let waiting = spawn_local(async move { l2.accept().await.map(|(s, _)| s) });
            xtc_shards::yield_now().await; // the second accept waits (in the kernel, on io_uring)
            drop(dropped);
            let s = xtc_shards::time::timeout(HANG, waiting)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "[{driver}] the waiting accept never got the dropped accept's connection"
                    )
                })
                .unwrap()
                .unwrap();
            assert_eq!(read_n(&s, 2).await, b"hi");
        },
    );
}

/// As above, and a second client connects before the waiting accept runs again: its
/// connection reaches the waiting accept's own `ACCEPT`, after the dropped accept's was
/// accepted and kept. Connections come out in the order the kernel accepted them: the kept
/// one first (on epoll, where the dropped accept took nothing, the waiting one gets it).
#[test]
fn a_connection_kept_from_a_dropped_accept_comes_before_a_waiting_accepts_own() {
    on_each_driver("kept_connection_comes_first", 1, |driver| async move {
        let l = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = l.local_addr().unwrap();
        let mut dropped = Box::pin(l.accept());
        assert!(poll_fn(|cx| Poll::Ready(dropped.as_mut().poll(cx).is_pending())).await);
        let first = join_thread(client_that_writes(addr, b"1")).await;
        sleep(Duration::from_millis(100)).await; // the loop reaps the accept's completion
        let l2 = l.clone();
        let waiting = spawn_local(async move { l2.accept().await.map(|(_, peer)| peer) });
        xtc_shards::yield_now().await; // the second accept waits (in the kernel, on io_uring)
        drop(dropped);
        // Before the waiting accept runs again: this reaches its own `ACCEPT`.
        let _second = std::net::TcpStream::connect(addr).unwrap();
        thread::sleep(Duration::from_millis(20));
        let peer = xtc_shards::time::timeout(HANG, waiting)
            .await
            .unwrap_or_else(|_| panic!("[{driver}] the waiting accept never finished"))
            .unwrap()
            .unwrap();
        assert_eq!(peer, first.local_addr().unwrap(), "[{driver}]");
        let (_, next) = xtc_shards::time::timeout(HANG, l.accept())
            .await
            .unwrap_or_else(|_| panic!("[{driver}] the second connection never came"))
            .unwrap();
        assert_eq!(next, _second.local_addr().unwrap(), "[{driver}]");
    });
}

/// Two accepts, each of which took a connection (the first client the first, the second
/// client the second, started while the first had completed unpolled), dropped youngest
/// first: the listener keeps both and hands the connections out in the kernel's accept
/// order, not the order they were dropped (kept in drop order, the second client came first
/// on io_uring; on epoll the second accept takes the first client at once).
#[test]
fn connections_of_accepts_dropped_in_reverse_come_in_the_order_accepted() {
    on_each_driver("connections_dropped_in_reverse", 1, |driver| async move {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut first = Box::pin(l.accept());
        assert!(poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx).is_pending())).await);
        let one = std::net::TcpStream::connect(addr).unwrap();
        sleep(Duration::from_millis(5)).await; // the first takes it
        let mut seen = Vec::new();
        let mut second = Box::pin(l.accept());
        if let Poll::Ready(r) = poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx))).await {
            assert_eq!(
                driver,
                Driver::Epoll,
                "the first accept's client was overtaken"
            );
            seen.push(r.unwrap().1);
        }
        sleep(Duration::from_millis(5)).await; // the second waits (in the kernel, on io_uring)
        let two = std::net::TcpStream::connect(addr).unwrap();
        sleep(Duration::from_millis(5)).await; // the second takes it
        drop(second);
        drop(first);
        while seen.len() < 2 {
            let (_, peer) = xtc_shards::time::timeout(HANG, l.accept())
                .await
                .unwrap_or_else(|_| panic!("[{driver}] a connection never came"))
                .unwrap();
            seen.push(peer);
        }
        assert_eq!(
            seen,
            [one.local_addr().unwrap(), two.local_addr().unwrap()],
            "[{driver}]"
        );
    });
}

/// An accept in flight when its loop's driver goes takes the first client just before (its
/// completion reaped by the shutdown); in the next `block_on` a second accept takes the next
/// client, and both are dropped, the second first. The first client comes out first: the
/// completions of the earlier driver came before any of the next one's. Only the driver of
/// the first kept accept with a known place was looked at, so the second client came first.
#[test]
fn a_connection_accepted_before_its_driver_went_comes_before_a_later_drivers() {
    type AcceptFut = std::pin::Pin<Box<dyn Future<Output = io::Result<(TcpStream, SocketAddr)>>>>;
    fn accept(l: &Rc<TcpListener>) -> AcceptFut {
        let l = l.clone();
        Box::pin(async move { l.accept().await })
    }
    let ex = LocalExecutor::new().unwrap();
    let (l, first, one) = ex.block_on(async {
        let l = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let mut first = accept(&l);
        assert!(poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx).is_pending())).await);
        sleep(Duration::from_millis(5)).await; // submitted
        let one = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(20)); // taken, reaped by the shutdown
        (l, first, one)
    });
    let (seen, two) = ex.block_on(async move {
        let mut seen = Vec::new();
        let mut second = accept(&l);
        // On epoll, where nothing was taken, the second accept takes the first client.
        if let Poll::Ready(r) = poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx))).await {
            seen.push(r.unwrap().1);
        }
        sleep(Duration::from_millis(5)).await; // the second waits
        let two = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        sleep(Duration::from_millis(5)).await; // the second takes it
        drop(second);
        drop(first);
        while seen.len() < 2 {
            let (_, peer) = xtc_shards::time::timeout(HANG, l.accept())
                .await
                .unwrap_or_else(|_| panic!("a connection never came"))
                .unwrap();
            seen.push(peer);
        }
        (seen, two)
    });
    assert_eq!(
        seen,
        [one.local_addr().unwrap(), two.local_addr().unwrap()],
        "connections came out of the kernel's accept order"
    );
}

/// A dropped accept left nothing armed for another listener of the same socket (each shard's
/// `from_std` of a `try_clone`): kept in the kernel, it took the connection the other
/// listener's accept waited for, which then waited for good.
#[test]
fn a_dropped_accept_takes_nothing_from_a_listener_sharing_its_socket() {
    on_each_driver("a_dropped_accept_shared_socket", 1, |driver| async move {
        let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_l.local_addr().unwrap();
        let a = TcpListener::from_std(std_l.try_clone().unwrap()).unwrap();
        let b = Rc::new(TcpListener::from_std(std_l).unwrap());
        assert!(
            xtc_shards::time::timeout(Duration::from_millis(20), a.accept())
                .await
                .is_err()
        );
        let b2 = b.clone();
        let waiting = spawn_local(async move { b2.accept().await.map(|(s, _)| s) });
        xtc_shards::yield_now().await;
        let client = client_that_writes(addr, b"hi");
        let _client = join_thread(client).await;
        let s = xtc_shards::time::timeout(HANG, waiting)
            .await
            .unwrap_or_else(|_| {
                panic!("[{driver}] b never got the connection: a's dropped accept took it")
            })
            .unwrap()
            .unwrap();
        assert_eq!(read_n(&s, 2).await, b"hi");
        drop(a);
    });
}

/// The waker a dropped accept forgets is dropped outside the listener's borrows: its drop is
/// user code, and this one starts another accept of the same listener ("already borrowed").
#[test]
fn a_dropped_accepts_waker_is_dropped_outside_the_listeners_borrow() {
    on_each_driver("a_dropped_accepts_waker", 1, |driver| async move {
        let l = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let l2 = l.clone();
        let waker = common::drop_hooked_waker(move || {
            let mut again = Box::pin(l2.accept());
            let _ = again
                .as_mut()
                .poll(&mut std::task::Context::from_waker(Waker::noop()));
        });
        let mut fut = Box::pin(l.accept());
        assert!(fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
            .is_pending());
        drop(waker); // the driver's slot holds the only clone now
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(fut)));
        assert!(
            dropped.is_ok(),
            "[{driver}] dropping a waiting accept panicked: its waker's drop ran under a borrow"
        );
    });
}

/// An accept dropped after its connection arrived (not reaped yet) is kept (io_uring) before
/// the waker it forgets is dropped: that drop is user code, and this one starts and drops an
/// accept of its own, which took the next connection. Kept first, that newer accept was handed
/// out first, so the next `accept`s returned two connections in the reverse of the kernel's
/// order.
#[test]
fn an_accept_kept_while_its_wakers_drop_keeps_another_stays_first() {
    on_each_driver(
        "an_accept_kept_while_its_wakers_drop",
        1,
        |driver| async move {
            let l = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = l.local_addr().unwrap();
            let l2 = l.clone();
            let waker = common::drop_hooked_waker(move || {
                let mut again = Box::pin(l2.accept());
                let _ = again
                    .as_mut()
                    .poll(&mut std::task::Context::from_waker(Waker::noop()));
            });
            let mut fut = Box::pin(l.accept());
            assert!(fut
                .as_mut()
                .poll(&mut std::task::Context::from_waker(&waker))
                .is_pending());
            drop(waker); // the driver's slot holds the only clone now
            sleep(Duration::from_millis(5)).await; // the accept reaches the kernel
            let mut one = std::net::TcpStream::connect(addr).unwrap();
            one.write_all(b"one").unwrap();
            thread::sleep(Duration::from_millis(50)); // accepted in the kernel, not reaped
            let mut two = std::net::TcpStream::connect(addr).unwrap();
            two.write_all(b"two").unwrap();
            drop(fut);
            let mut got = Vec::new();
            for _ in 0..2 {
                let (s, _) = xtc_shards::time::timeout(Duration::from_secs(60), l.accept())
                    .await
                    .expect("a connection was lost")
                    .unwrap();
                got.push(String::from_utf8(read_n(&s, 3).await).unwrap());
            }
            assert_eq!(got, ["one", "two"], "[{driver}] connections out of order");
            drop((one, two));
        },
    );
}

/// Kept accepts are handed out oldest first (io_uring keeps a dropped accept, see
/// `ops::accept`), also after an `accept` took the oldest one and was dropped before it
/// resolved: that one went back behind the younger ones, so two connections the kernel had
/// accepted in order came out of the next `accept`s swapped.
#[test]
fn an_accept_dropped_waiting_for_a_kept_one_keeps_the_kept_order() {
    on_each_driver(
        "an_accept_dropped_waiting_for_a_kept_one",
        1,
        |driver| async move {
            if driver == Driver::Epoll {
                return; // nothing is kept on epoll
            }
            // Which of two armed accepts takes which connection is the kernel's choice: the order
            // without the extra dropped accept is the reference.
            let plain = kept_pair_order(false).await;
            let popped = kept_pair_order(true).await;
            assert_eq!(
                popped, plain,
                "[{driver}] a kept accept taken and dropped again lost its place"
            );
        },
    );
}

/// Two accepts in flight take two connections ("one", then "two") and are dropped before the
/// loop reaps their completions (io_uring keeps both, in that order); with `pop`, another
/// `accept` takes the oldest kept one and is dropped while it still waits for it. Returns what
/// the next two `accept`s hand out, in order.
async fn kept_pair_order(pop: bool) -> Vec<String> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut cx = std::task::Context::from_waker(Waker::noop());
    let mut a = Box::pin(l.accept());
    let mut b = Box::pin(l.accept());
    assert!(a.as_mut().poll(&mut cx).is_pending());
    assert!(b.as_mut().poll(&mut cx).is_pending());
    xtc_shards::yield_now().await; // both in the kernel

    // No await from here to the accepts below: the loop reaps none of these completions.
    let mut one = std::net::TcpStream::connect(addr).unwrap();
    one.write_all(b"one").unwrap();
    let mut two = std::net::TcpStream::connect(addr).unwrap();
    two.write_all(b"two").unwrap();
    drop(a);
    drop(b);
    if pop {
        let mut c = Box::pin(l.accept());
        assert!(
            c.as_mut().poll(&mut cx).is_pending(),
            "the oldest kept accept's completion is not reaped yet"
        );
        drop(c);
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        let (s, _) = xtc_shards::time::timeout(Duration::from_secs(60), l.accept())
            .await
            .expect("a kept connection was lost")
            .unwrap();
        got.push(String::from_utf8(read_n(&s, 3).await).unwrap());
    }
    drop((one, two));
    got
}

// ---------------------------------------------------------------------------------------------
// 7. UDP, Unix sockets, futures::io, registered buffers

/// A `recv_from` dropped holding a datagram (io_uring keeps its receive for the socket) while
/// another `recv_from` of the socket already waits in the kernel: the waiting one gets that
/// datagram, as on epoll, where the dropped receive took nothing. The kept receive woke nobody,
/// so the datagram waited for the next `recv_from` call, which the waiting one only made after
/// yet another datagram came.
#[test]
fn a_datagram_kept_from_a_dropped_recv_from_reaches_a_recv_already_waiting() {
    on_each_driver(
        "kept_datagram_reaches_a_waiting_recv",
        1,
        |driver| async move {
            let s = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let addr = s.local_addr().unwrap();
            let mut dropped = Box::pin(s.recv_from(vec![0u8; 16]));
            assert!(poll_fn(|cx| Poll::Ready(dropped.as_mut().poll(cx).is_pending())).await);
            let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            peer.send_to(b"hi", addr).unwrap();
            sleep(Duration::from_millis(100)).await; // the loop reaps the receive's completion
            let s2 = s.clone();
            let waiting = spawn_local(async move {
                let (r, b) = s2.recv_from(vec![0u8; 16]).await;
                r.map(|(n, _)| b[..n].to_vec())
            });
            xtc_shards::yield_now().await; // the second receive waits (in the kernel, on io_uring)
            drop(dropped);
            let got = xtc_shards::time::timeout(HANG, waiting)
                .await
                .unwrap_or_else(|_| {
                    panic!("[{driver}] the waiting recv_from never got the dropped one's datagram")
                })
                .unwrap()
                .unwrap();
            assert_eq!(got, b"hi");
        },
    );
}

/// As above, and the peer sends a second datagram before the waiting `recv_from` runs again:
/// it reaches the waiting one's own receive, after the dropped one's datagram was received
/// and kept. The datagrams keep the order the kernel received them in: the kept one first.
#[test]
fn a_datagram_kept_from_a_dropped_recv_from_comes_before_a_waiting_ones_own() {
    on_each_driver("kept_datagram_comes_first", 1, |driver| async move {
        let s = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let addr = s.local_addr().unwrap();
        let mut dropped = Box::pin(s.recv_from(vec![0u8; 16]));
        assert!(poll_fn(|cx| Poll::Ready(dropped.as_mut().poll(cx).is_pending())).await);
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.send_to(b"one", addr).unwrap();
        sleep(Duration::from_millis(100)).await; // the loop reaps the receive's completion
        let s2 = s.clone();
        let waiting = spawn_local(async move {
            let (r, b) = s2.recv_from(vec![0u8; 16]).await;
            r.map(|(n, _)| b[..n].to_vec())
        });
        xtc_shards::yield_now().await; // the second receive waits (in the kernel, on io_uring)
        drop(dropped);
        // Before the waiting receive runs again: this reaches its own receive.
        peer.send_to(b"two", addr).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let first = xtc_shards::time::timeout(HANG, waiting)
            .await
            .unwrap_or_else(|_| panic!("[{driver}] the waiting recv_from never finished"))
            .unwrap()
            .unwrap();
        let (r, b) = xtc_shards::time::timeout(HANG, s.recv_from(vec![0u8; 16]))
            .await
            .unwrap_or_else(|_| panic!("[{driver}] the second datagram never came"));
        let second = b[..r.unwrap().0].to_vec();
        assert_eq!(
            (&first[..], &second[..]),
            (&b"one"[..], &b"two"[..]),
            "[{driver}]"
        );
    });
}

/// Two `recv_from`s, each of which got a datagram ("one" the first, "two" the second, started
/// while the first had completed unpolled), dropped youngest first: the socket keeps both and
/// hands their datagrams out in the order the kernel received them, not the order they were
/// dropped. Kept in drop order, the next calls got "two" then "one" on io_uring; on epoll,
/// where the first took nothing, the second gets "one" at once.
#[test]
fn datagrams_of_recv_froms_dropped_in_reverse_come_in_the_order_received() {
    on_each_driver("datagrams_dropped_in_reverse", 1, |driver| async move {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut first = Box::pin(s.recv_from(vec![0u8; 16]));
        assert!(poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx).is_pending())).await);
        peer.send_to(b"one", addr).unwrap();
        sleep(Duration::from_millis(5)).await; // the first gets "one"
        let mut seen = Vec::new();
        let mut second = Box::pin(s.recv_from(vec![0u8; 16]));
        if let Poll::Ready((r, b)) = poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx))).await {
            assert_eq!(
                driver,
                Driver::Epoll,
                "the first one's datagram was overtaken"
            );
            seen.push(b[..r.unwrap().0].to_vec());
        }
        sleep(Duration::from_millis(5)).await; // the second waits (in the kernel, on io_uring)
        peer.send_to(b"two", addr).unwrap();
        sleep(Duration::from_millis(5)).await; // the second gets "two"
        drop(second);
        drop(first);
        while seen.len() < 2 {
            let (r, b) = xtc_shards::time::timeout(HANG, s.recv_from(vec![0u8; 16]))
                .await
                .unwrap_or_else(|_| panic!("[{driver}] a datagram never came"));
            seen.push(b[..r.unwrap().0].to_vec());
        }
        assert_eq!(seen, [&b"one"[..], &b"two"[..]], "[{driver}]");
    });
}

/// The waker a dropped `recv_from` forgets (its receive kept by the socket) is dropped outside
/// the socket's borrows, and the receive that drop starts (user code) pushes out no receive
/// holding a datagram. The waker was dropped under the borrow ("already borrowed"); then,
/// fixed that way alone, the dropped receive, its datagram in the kernel but not reaped yet,
/// was cancelled (the datagram lost) and the next `recv_from` waited on the newer receive.
#[test]
fn a_recv_from_started_by_a_waker_drop_loses_no_datagram() {
    on_each_driver(
        "a_recv_from_started_by_a_waker_drop",
        1,
        |driver| async move {
            let s = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let s2 = s.clone();
            let waker = common::drop_hooked_waker(move || {
                let mut again = Box::pin(s2.recv_from(vec![0u8; 16]));
                let _ = again
                    .as_mut()
                    .poll(&mut std::task::Context::from_waker(Waker::noop()));
            });
            datagram_outlives_its_dropped_receive(driver, &s, waker, || {}).await;
        },
    );
}

/// The same when the waker's drop also reaps (it drops a receive beside another in flight):
/// the dropped receive, done by then, was queued behind the receive that code left in the
/// kernel, and the next `recv_from` waited on that one while the datagram sat behind it.
#[test]
fn a_waker_drop_that_reaps_leaves_the_datagram_first() {
    on_each_driver("a_waker_drop_that_reaps", 1, |driver| async move {
        let s = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let s2 = s.clone();
        let waker = common::drop_hooked_waker(move || {
            let cx = &mut std::task::Context::from_waker(Waker::noop());
            let mut a = Box::pin(s2.recv_from(vec![0u8; 16]));
            let _ = a.as_mut().poll(cx);
            let mut b = Box::pin(s2.recv_from(vec![0u8; 16]));
            let _ = b.as_mut().poll(cx);
            drop(b); // beside another receive in flight: reaps
            drop(a); // the last receive, still in the kernel: kept
        });
        datagram_outlives_its_dropped_receive(driver, &s, waker, || {}).await;
    });
}

/// A dropped receive completed by the reap its own drop makes (another receive is in flight)
/// wakes its waker there, and that drop (user code) drops the other receive, which is kept in
/// the kernel: the done one was queued behind it, and the next `recv_from` waited on it.
#[test]
fn a_receive_completed_by_its_own_drops_reap_stays_first() {
    on_each_driver(
        "a_receive_completed_by_its_own_drops_reap",
        1,
        |driver| async move {
            type Other =
                Rc<std::cell::RefCell<Option<std::pin::Pin<Box<dyn Future<Output = ()>>>>>>;
            let s = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let other: Other = Rc::new(std::cell::RefCell::new(None));
            let other2 = other.clone();
            let waker = common::drop_hooked_waker(move || drop(other2.borrow_mut().take()));
            let s3 = s.clone();
            let before_drop = || {
                // Another receive in flight: the drop reaps, completing the dropped one, whose
                // waker's drop drops this one.
                let mut r: std::pin::Pin<Box<dyn Future<Output = ()>>> = Box::pin(async move {
                    let _ = s3.recv_from(vec![0u8; 16]).await;
                });
                assert!(r
                    .as_mut()
                    .poll(&mut std::task::Context::from_waker(Waker::noop()))
                    .is_pending());
                *other.borrow_mut() = Some(r);
            };
            datagram_outlives_its_dropped_receive(driver, &s, waker, before_drop).await;
            assert!(other.borrow().is_none(), "the waker's drop ran");
        },
    );
}

/// Polls a `recv_from` of `s` once with `waker` (whose drop is the test's user code), lets a
/// datagram complete that receive in the kernel without the loop reaping it, runs
/// `before_drop`, drops the receive, and checks that the next `recv_from` gets the datagram.
async fn datagram_outlives_its_dropped_receive(
    driver: Driver,
    s: &UdpSocket,
    waker: Waker,
    before_drop: impl FnOnce(),
) {
    let addr = s.local_addr().unwrap();
    let mut fut = Box::pin(s.recv_from(vec![0u8; 16]));
    assert!(fut
        .as_mut()
        .poll(&mut std::task::Context::from_waker(&waker))
        .is_pending());
    drop(waker); // the driver's slot holds the only clone now
    sleep(Duration::from_millis(5)).await; // the receive reaches the kernel
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(b"one", addr).unwrap();
    thread::sleep(Duration::from_millis(50)); // completed in the kernel, not reaped
    before_drop();
    drop(fut);
    let got = xtc_shards::time::timeout(HANG, s.recv_from(vec![0u8; 16])).await;
    let Ok((r, b)) = got else {
        panic!("[{driver}] the datagram was lost, or sat behind a kept receive");
    };
    let (n, _) = r.unwrap();
    assert_eq!(&b[..n], b"one", "[{driver}]");
}

/// A `recv_from` dropped alone, its datagram ("one") taken in the kernel but not reaped, whose
/// task's waker, dropped when the receive is kept (`Op::unwait`), runs user code that starts
/// and drops another `recv_from` of the same socket: the waker was dropped before the first
/// receive was kept, so the second one (which took "two") was kept first, and the next
/// `recv_from`s handed out "two" before "one".
#[test]
fn a_recv_from_kept_while_its_wakers_drop_keeps_another_stays_first() {
    on_each_driver(
        "a_recv_from_kept_while_its_wakers_drop",
        1,
        |driver| async move {
            let s = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let addr = s.local_addr().unwrap();
            let s2 = s.clone();
            let waker = common::drop_hooked_waker(move || {
                let mut again = Box::pin(s2.recv_from(vec![0u8; 16]));
                let _ = again
                    .as_mut()
                    .poll(&mut std::task::Context::from_waker(Waker::noop()));
            });
            let mut fut = Box::pin(s.recv_from(vec![0u8; 16]));
            assert!(fut
                .as_mut()
                .poll(&mut std::task::Context::from_waker(&waker))
                .is_pending());
            drop(waker); // the driver's slot holds the only clone now
            sleep(Duration::from_millis(5)).await; // the receive reaches the kernel
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            tx.send_to(b"one", addr).unwrap();
            thread::sleep(Duration::from_millis(50)); // completed in the kernel, not reaped
            tx.send_to(b"two", addr).unwrap();
            drop(fut);
            let mut got = Vec::new();
            for _ in 0..2 {
                let (r, buf) =
                    xtc_shards::time::timeout(Duration::from_secs(60), s.recv_from(vec![0u8; 16]))
                        .await
                        .expect("a datagram was lost");
                let (n, _) = r.unwrap();
                got.push(String::from_utf8(buf[..n].to_vec()).unwrap());
            }
            assert_eq!(got, ["one", "two"], "[{driver}] datagrams out of order");
        },
    );
}

/// Kept receives are handed out oldest first (io_uring keeps a dropped `recv_from`, see
/// `net::udp`), also after a `recv_from` took the oldest one and was dropped before it
/// resolved: that one went back behind the younger ones, so two datagrams the kernel had
/// received in order came out of the next `recv_from`s swapped.
#[test]
fn a_recv_from_dropped_waiting_for_a_kept_one_keeps_the_kept_order() {
    on_each_driver(
        "a_recv_from_dropped_waiting_for_a_kept_one",
        1,
        |driver| async move {
            if driver == Driver::Epoll {
                return; // nothing is kept on epoll
            }
            // Which of two armed receives takes which datagram is the kernel's choice: the order
            // without the extra dropped receive is the reference.
            let plain = kept_datagram_order(false).await;
            let popped = kept_datagram_order(true).await;
            assert_eq!(
                popped, plain,
                "[{driver}] a kept receive taken and dropped again lost its place"
            );
        },
    );
}

/// Two receives in flight take two datagrams ("one", then "two") and are dropped before the
/// loop reaps their completions (io_uring keeps both, in that order); with `pop`, another
/// `recv_from` takes the oldest kept one and is dropped while it still waits for it. Returns
/// what the next two `recv_from`s hand out, in order.
async fn kept_datagram_order(pop: bool) -> Vec<String> {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap();
    let mut cx = std::task::Context::from_waker(Waker::noop());
    let mut a = Box::pin(s.recv_from(vec![0u8; 16]));
    let mut b = Box::pin(s.recv_from(vec![0u8; 16]));
    assert!(a.as_mut().poll(&mut cx).is_pending());
    assert!(b.as_mut().poll(&mut cx).is_pending());
    xtc_shards::yield_now().await; // both in the kernel

    // No await from here to the receives below: the loop reaps none of these completions.
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(b"one", addr).unwrap();
    tx.send_to(b"two", addr).unwrap();
    drop(a);
    drop(b);
    if pop {
        let mut c = Box::pin(s.recv_from(vec![0u8; 16]));
        assert!(
            c.as_mut().poll(&mut cx).is_pending(),
            "the oldest kept receive's completion is not reaped yet"
        );
        drop(c);
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        let (r, buf) =
            xtc_shards::time::timeout(Duration::from_secs(60), s.recv_from(vec![0u8; 16]))
                .await
                .expect("a kept datagram was lost");
        let (n, _) = r.unwrap();
        got.push(String::from_utf8(buf[..n].to_vec()).unwrap());
    }
    got
}

#[test]
fn udp_send_to_recv_from() {
    on_each_driver("udp_send_to_recv_from", 1, |_| async {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        assert_ne!(aa, ba);

        // A receive that has to wait for its datagram.
        let b2 = b.clone();
        let waiting = spawn_local(async move {
            let (r, buf) = b2.recv_from(Vec::with_capacity(2048)).await;
            let (n, from) = r.unwrap();
            assert_eq!(buf.len(), n);
            (buf, from)
        });
        sleep(Duration::from_millis(5)).await;
        let (r, _) = a.send_to(pattern(12, 1200), ba).await;
        assert_eq!(r.unwrap(), 1200);
        let (got, from) = guard("recv_from", waiting).await.unwrap();
        assert_eq!(from, aa);
        assert_eq!(got, pattern(12, 1200));

        // Replies and many datagrams, boundaries kept.
        for i in 0..100 {
            let (r, _) = b.send_to(pattern(i, 10 + i), aa).await;
            assert_eq!(r.unwrap(), 10 + i);
        }
        for i in 0..100 {
            let (r, buf) = guard("recv", a.recv_from(Vec::with_capacity(512))).await;
            let (n, from) = r.unwrap();
            assert_eq!(from, ba);
            assert_eq!(n, 10 + i);
            assert_eq!(buf, pattern(i, 10 + i));
        }

        // A datagram longer than the buffer is truncated to it.
        let (r, _) = a.send_to(&b"0123456789"[..], ba).await;
        r.unwrap();
        let (r, buf) = b.recv_from(Vec::with_capacity(4)).await;
        assert_eq!(r.unwrap().0, 4);
        assert_eq!(&buf[..], b"0123");
    });
}

/// A connected UDP socket: `send` and `recv` talk to its peer only, `peer_addr` names it, and
/// a dropped `recv` loses no datagram.
#[test]
fn udp_connect_send_recv() {
    on_each_driver("udp_connect_send_recv", 1, |driver| async move {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let other = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());

        // Unconnected: no peer, and `send` has nowhere to go.
        let e = a.peer_addr().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotConnected, "[{driver}] {e}");
        let (r, _) = a.send(&b"nowhere"[..]).await;
        assert_eq!(
            r.unwrap_err().raw_os_error(),
            Some(libc::EDESTADDRREQ),
            "[{driver}]"
        );

        a.connect(ba).unwrap();
        b.connect(aa).unwrap();
        assert_eq!(a.peer_addr().unwrap(), ba);
        assert_eq!(b.peer_addr().unwrap(), aa);
        // An address that resolves to nothing is an error, not a panic.
        assert!(a
            .connect(Vec::<std::net::SocketAddr>::new().as_slice())
            .is_err());
        assert_eq!(
            a.peer_addr().unwrap(),
            ba,
            "a failed connect keeps the peer"
        );

        // A datagram from an address b is not connected to is dropped by the kernel: b's
        // next datagram is a's.
        let (r, _) = other.send_to(&b"stranger"[..], ba).await;
        r.unwrap();
        for i in 0..20 {
            let (r, _) = a.send(pattern(i, 100 + i)).await;
            assert_eq!(r.unwrap(), 100 + i);
        }
        for i in 0..20 {
            let (r, buf) = guard("recv", b.recv(Vec::with_capacity(512))).await;
            assert_eq!(r.unwrap(), 100 + i, "[{driver}]");
            assert_eq!(buf, pattern(i, 100 + i), "[{driver}]");
        }

        // A receive dropped while it waited (a timeout won) loses nothing: the datagram sent
        // after it still arrives, whole, at the next `recv`.
        let gave_up =
            xtc_shards::time::timeout(Duration::from_millis(20), b.recv(vec![0u8; 64])).await;
        assert!(gave_up.is_err(), "[{driver}] nothing was sent yet");
        let (r, _) = a.send(&b"after the drop"[..]).await;
        r.unwrap();
        let (r, buf) = guard("recv after a dropped one", b.recv(Vec::with_capacity(64))).await;
        assert_eq!(&buf[..r.unwrap()], b"after the drop", "[{driver}]");

        // Replies go the other way; an empty datagram is a datagram.
        let (r, _) = b.send(Vec::new()).await;
        assert_eq!(r.unwrap(), 0);
        let (r, _) = guard("empty datagram", a.recv(Vec::with_capacity(8))).await;
        assert_eq!(r.unwrap(), 0);
    });
}

/// An empty datagram on a socket whose send buffer is full waits for room, as any datagram
/// does (and as on io_uring, whose `SEND` the kernel parks until the socket is writable). On
/// epoll the connected `send` took a stream's shortcut for an empty buffer (a plain `send(2)`
/// that never waits) and returned `WouldBlock` from an `await`. Loopback UDP never fills its
/// send buffer (the kernel drops a datagram's charge as it hands it over), so the datagram
/// socket here is a Unix one wrapped by `from_std`, whose `send` takes the same path.
#[test]
fn an_empty_datagram_on_a_full_socket_waits_for_room() {
    on_each_driver(
        "an_empty_datagram_on_a_full_socket_waits_for_room",
        1,
        |driver| async move {
            let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            let mut queued = 0;
            while a.send(b"").is_ok() {
                queued += 1;
            }
            let s = UdpSocket::from_std(std::net::UdpSocket::from(std::os::fd::OwnedFd::from(a)))
                .unwrap();
            let mut send = Box::pin(s.send(Vec::new()));
            if let Poll::Ready((r, _)) = poll_fn(|cx| Poll::Ready(send.as_mut().poll(cx))).await {
                panic!("[{driver}] an empty send on a full socket did not wait: {r:?}");
            }
            // Only now does the peer drain the socket: the waiting send gets room.
            let reader = thread::spawn(move || {
                let mut buf = [0u8; 8];
                for _ in 0..=queued {
                    assert_eq!(b.recv(&mut buf).unwrap(), 0);
                }
                b
            });
            let (r, _) = guard("the empty send", send).await;
            assert_eq!(r.unwrap(), 0, "[{driver}]");
            drop(join_thread(reader).await);
        },
    );
}

/// Many receives waiting on one UDP socket at once (a server with a task per expected
/// request): each gets a datagram, never `WouldBlock`. io_uring wakes every receive armed on
/// the socket for each datagram, and after 128 wake-ups that found nothing (another receive
/// took the datagram) it gives up polling and completes the receive with `-EAGAIN` (the
/// socket is non-blocking), which reached the caller as an error where epoll waits on.
#[test]
fn many_receives_waiting_on_one_udp_socket_all_get_a_datagram() {
    on_each_driver(
        "many_receives_waiting_on_one_udp_socket",
        1,
        |driver| async move {
            // Well above the kernel's 128 retries of a polled operation.
            const N: usize = 300;
            let rx = Rc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let addr = rx.local_addr().unwrap();
            let results = Rc::new(std::cell::RefCell::new(Vec::new()));
            for _ in 0..N {
                let (rx, results) = (rx.clone(), results.clone());
                spawn_local(async move {
                    let (r, _) = rx.recv_from(Vec::with_capacity(16)).await;
                    results
                        .borrow_mut()
                        .push(r.map(|(n, _)| n).map_err(|e| e.to_string()));
                });
            }
            sleep(Duration::from_millis(10)).await; // every receive armed
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            for i in 0..N {
                let (r, _) = tx.send_to(pattern(i, 8), addr).await;
                assert_eq!(r.unwrap(), 8);
                // One at a time, each taken before the next is sent: the socket's receive
                // buffer never fills (a full one drops datagrams, as UDP may).
                guard("a receive completes", async {
                    while results.borrow().len() <= i {
                        xtc_shards::yield_now().await;
                    }
                })
                .await;
            }
            let results = results.borrow();
            let failed: Vec<_> = results.iter().filter(|r| r.is_err()).collect();
            assert!(
                failed.is_empty(),
                "[{driver}] {} of {N} receives failed: {:?}",
                failed.len(),
                failed.first()
            );
            assert!(results.iter().all(|r| *r == Ok(8)), "[{driver}]");
        },
    );
}

/// TCP urgent data: a read stops short at the urgent mark, with the bytes behind it queued.
/// On epoll that short read cleared the ready bit, and the bytes behind the mark waited for an
/// edge that never came (any peer could stall a connection with one `MSG_OOB` byte).
#[test]
fn tcp_read_past_the_urgent_mark() {
    on_each_driver("tcp_read_past_the_urgent_mark", 1, |driver| async move {
        let (c, s) = tcp_pair().await;
        let cfd = c.as_raw_fd();
        let send = |b: &[u8], flags: i32| {
            // SAFETY: `b` is a live slice; `cfd` is open while `c` lives.
            let n = unsafe { libc::send(cfd, b.as_ptr().cast(), b.len(), flags) };
            assert_eq!(n, b.len() as isize);
        };
        // A first, short read leaves the read bit clear, so the next read waits and adds the
        // socket to the epoll set: the edge it then gets is the last one.
        send(b"a", 0);
        let (r, b) = s.read(Vec::with_capacity(100)).await;
        assert_eq!((r.unwrap(), &b[..]), (1, &b"a"[..]));
        send(b"hello", 0);
        send(b"x", libc::MSG_OOB);
        send(b"world", 0);
        sleep(Duration::from_millis(50)).await;
        let mut got = Vec::new();
        while got.len() < 10 {
            let Ok((r, b)) = xtc_shards::time::timeout(HANG, s.read(Vec::with_capacity(100))).await
            else {
                panic!(
                    "[{driver}] a read hung with bytes queued behind the urgent mark (got {:?})",
                    String::from_utf8_lossy(&got)
                );
            };
            assert!(r.unwrap() > 0, "[{driver}] end of stream");
            got.extend_from_slice(&b);
        }
        assert_eq!(got, b"helloworld", "[{driver}]");
    });
}

/// A Unix stream: a message carrying descriptors (`SCM_RIGHTS`) ends a read short, with the
/// bytes sent after it queued. On epoll the short read cleared the ready bit and the next
/// read hung, through the owned `read` and through `AsyncRead` alike.
#[test]
fn unix_read_past_a_message_with_descriptors() {
    on_each_driver(
        "unix_read_past_a_message_with_descriptors",
        1,
        |driver| async move {
            for trait_side in [false, true] {
                let (a, mut b) = UnixStream::pair().unwrap();
                // As in the TCP test: a short first read, so the next one waits for its edge.
                let (w, _) = a.write(&b"a"[..]).await;
                w.unwrap();
                let (r, got) = b.read(Vec::with_capacity(100)).await;
                assert_eq!((r.unwrap(), &got[..]), (1, &b"a"[..]));
                send_with_a_descriptor(a.as_raw_fd(), b"ab");
                let (w, _) = a.write(&b"cd"[..]).await;
                assert_eq!(w.unwrap(), 2);
                let mut got = Vec::new();
                while got.len() < 4 {
                    let mut piece = [0u8; 100];
                    let read = async {
                        if trait_side {
                            AsyncReadExt::read(&mut b, &mut piece).await.unwrap()
                        } else {
                            let (r, buf) = b.read(Vec::with_capacity(100)).await;
                            let n = r.unwrap();
                            piece[..n].copy_from_slice(&buf);
                            n
                        }
                    };
                    let Ok(n) = xtc_shards::time::timeout(HANG, read).await else {
                        panic!(
                            "[{driver}] a read (AsyncRead: {trait_side}) hung with bytes queued \
                         behind a message with descriptors (got {:?})",
                            String::from_utf8_lossy(&got)
                        );
                    };
                    assert!(n > 0, "[{driver}] end of stream");
                    got.extend_from_slice(&piece[..n]);
                }
                assert_eq!(got, b"abcd", "[{driver}] AsyncRead: {trait_side}");
            }
        },
    );
}

/// Sends `data` on the Unix socket `fd` with one descriptor (stdin's) attached.
fn send_with_a_descriptor(fd: std::os::fd::RawFd, data: &[u8]) {
    let mut data = data.to_vec();
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: an all-zero msghdr is a valid empty header; every pointer set below points at a
    // live local (`iov`, `cbuf`, `data`) that outlives the `sendmsg` call, and the control
    // message fits in `cbuf` (its size is CMSG_SPACE of one descriptor).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cm = libc::CMSG_FIRSTHDR(&msg);
        (*cm).cmsg_level = libc::SOL_SOCKET;
        (*cm).cmsg_type = libc::SCM_RIGHTS;
        (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<i32>(), 0);
        assert_eq!(libc::sendmsg(fd, &msg, 0), data.len() as isize);
    }
}

#[test]
fn unix_listener_stream_and_pair() {
    on_each_driver("unix_listener_stream_and_pair", 1, |_| async {
        let path = sock_path("unix");
        let l = UnixListener::bind(&path).unwrap();
        assert!(UnixListener::bind(&path).is_err(), "the path exists now");
        assert_eq!(l.local_addr().unwrap().as_pathname(), Some(path.as_path()));
        // Through std and back, still listening on the same socket.
        let l = UnixListener::from_std(l.into_std().unwrap()).unwrap();
        let server = spawn_local(async move {
            let s = l.accept().await.unwrap();
            echo(s).await
        });
        let c = UnixStream::connect(&path).await.unwrap();
        assert_eq!(c.peer_addr().unwrap().as_pathname(), Some(path.as_path()));
        assert!(c.local_addr().unwrap().is_unnamed());
        let msg = pattern(13, 200_000);
        let (w, _) = c.write_all(msg.clone()).await;
        w.unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_end(&c).await, msg);
        assert_eq!(guard("unix server", server).await.unwrap(), msg.len());
        std::fs::remove_file(&path).unwrap();

        // A connection to a path nobody listens on fails.
        assert!(UnixStream::connect(&path).await.is_err());

        let (a, b) = UnixStream::pair().unwrap();
        let (w, _) = a.write(&b"left"[..]).await;
        assert_eq!(w.unwrap(), 4);
        assert_eq!(read_n(&b, 4).await, b"left");
        let (w, _) = b.write_all(pattern(14, 100_000)).await;
        w.unwrap();
        assert_eq!(read_n(&a, 100_000).await, pattern(14, 100_000));

        // std round trip.
        let a = UnixStream::from_std(a.into_std().unwrap()).unwrap();
        let (w, _) = a.write_all(&b"again"[..]).await;
        w.unwrap();
        assert_eq!(read_n(&b, 5).await, b"again");
        drop(a);
        assert!(read_to_end(&b).await.is_empty());
    });
}

/// A Unix stream's write waiting for room fails with `BrokenPipe` once its own write half is
/// shut down, as a blocking `write` does, on both drivers. A Unix socket reports no readiness
/// for that (its poll has no `EPOLLOUT` for a shut write half, unlike TCP's), so on epoll the
/// write waited for good for room the peer never made.
#[test]
fn a_waiting_unix_write_fails_once_its_write_half_shuts() {
    on_each_driver(
        "a_waiting_unix_write_fails_once_its_write_half_shuts",
        1,
        |_| async {
            let (mine, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
            mine.set_nonblocking(true).unwrap();
            loop {
                match (&mine).write(&[0u8; 64 * 1024]) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("filling the socket: {e}"),
                }
            }
            let a = UnixStream::from_std(mine).unwrap();
            let mut write = pin!(a.write(vec![1u8; 64 * 1024]));
            poll_fn(|cx| {
                assert!(write.as_mut().poll(cx).is_pending(), "the socket is full");
                Poll::Ready(())
            })
            .await;
            a.shutdown(Shutdown::Write).unwrap();
            let (r, _) = guard("a write behind a shut write half", write).await;
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        },
    );
}

/// A Unix stream's write waiting for room fails with `BrokenPipe` once the peer shuts its read
/// side, as a blocking `write` does and as io_uring's does, by the owned API and by
/// `AsyncWrite` alike. A Unix socket reports no event for that (the peer's queue stays full,
/// so no `EPOLLOUT`, and no hang-up until the peer closes): on epoll the write waited until
/// the peer closed, for good with a peer that keeps its end open.
#[test]
fn a_waiting_unix_write_fails_once_the_peer_shuts_its_read_side() {
    on_each_driver(
        "a_waiting_unix_write_fails_once_the_peer_shuts_its_read_side",
        1,
        |driver| async move {
            let full_pair = || {
                let (mine, peer) = std::os::unix::net::UnixStream::pair().unwrap();
                mine.set_nonblocking(true).unwrap();
                loop {
                    match (&mine).write(&[0u8; 64 * 1024]) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("filling the socket: {e}"),
                    }
                }
                (UnixStream::from_std(mine).unwrap(), peer)
            };
            let limit = Duration::from_secs(10);

            // Owned write.
            let (a, peer) = full_pair();
            let mut write = pin!(a.write(vec![1u8; 64 * 1024]));
            poll_fn(|cx| {
                assert!(write.as_mut().poll(cx).is_pending(), "the socket is full");
                Poll::Ready(())
            })
            .await;
            peer.shutdown(Shutdown::Read).unwrap();
            let (r, _) = xtc_shards::time::timeout(limit, write)
                .await
                .unwrap_or_else(|_| panic!("[{driver}] an owned write hung"));
            assert_eq!(
                r.unwrap_err().kind(),
                io::ErrorKind::BrokenPipe,
                "[{driver}]"
            );
            drop(peer);

            // AsyncWrite (on io_uring the write is taken behind, and the flush waits).
            let (mut a, peer) = full_pair();
            let a = &mut a;
            let mut write = pin!(async move {
                AsyncWriteExt::write_all(a, &[2u8; 64 * 1024]).await?;
                AsyncWriteExt::flush(a).await
            });
            poll_fn(|cx| {
                assert!(write.as_mut().poll(cx).is_pending(), "the socket is full");
                Poll::Ready(())
            })
            .await;
            peer.shutdown(Shutdown::Read).unwrap();
            let r = xtc_shards::time::timeout(limit, write)
                .await
                .unwrap_or_else(|_| panic!("[{driver}] an AsyncWrite write hung"));
            assert_eq!(
                r.unwrap_err().kind(),
                io::ErrorKind::BrokenPipe,
                "[{driver}]"
            );
        },
    );
}

/// A write after `AsyncWriteExt::close` of a Unix stream fails with `BrokenPipe` at once, as
/// after `shutdown(Shutdown::Write)`, on both drivers (on io_uring `AsyncWrite` reports it at the
/// flush). On epoll `close` shut the write half without marking it so, and a Unix socket
/// reports no readiness for that: with its send buffer full, the write waited for good for
/// room the peer never made.
#[test]
fn a_unix_write_after_close_fails_instead_of_waiting() {
    on_each_driver(
        "a_unix_write_after_close_fails_instead_of_waiting",
        1,
        |driver| async move {
            let (mine, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
            mine.set_nonblocking(true).unwrap();
            loop {
                match (&mine).write(&[0u8; 64 * 1024]) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("filling the socket: {e}"),
                }
            }
            let mut a = UnixStream::from_std(mine).unwrap();
            // A write that finds the socket full, and is given up.
            {
                let mut write = pin!(a.write(vec![1u8; 64 * 1024]));
                poll_fn(|cx| {
                    assert!(write.as_mut().poll(cx).is_pending(), "the socket is full");
                    Poll::Ready(())
                })
                .await;
            }
            guard("close", AsyncWriteExt::close(&mut a)).await.unwrap();
            let limit = Duration::from_secs(10);
            let (r, _) = xtc_shards::time::timeout(limit, a.write(vec![2u8; 1]))
                .await
                .unwrap_or_else(|_| panic!("[{driver}] an owned write after close hung"));
            assert_eq!(
                r.unwrap_err().kind(),
                io::ErrorKind::BrokenPipe,
                "[{driver}]"
            );
            let r = xtc_shards::time::timeout(limit, async {
                AsyncWriteExt::write_all(&mut a, b"x").await?;
                AsyncWriteExt::flush(&mut a).await
            })
            .await
            .unwrap_or_else(|_| panic!("[{driver}] an AsyncWrite write after close hung"));
            assert_eq!(
                r.unwrap_err().kind(),
                io::ErrorKind::BrokenPipe,
                "[{driver}]"
            );
        },
    );
}

/// `AsyncWrite` after the write half is shut (`close`, or `shutdown(Write)`) fails with
/// `BrokenPipe` at once on both drivers, as on epoll and in `std`. On io_uring the write-behind
/// copy reported the bytes written, and only a later flush said otherwise: a stream dropped
/// then, as code written for tokio does, lost them without any error.
#[test]
fn an_async_write_after_the_write_half_shuts_is_refused() {
    on_each_driver(
        "an_async_write_after_the_write_half_shuts_is_refused",
        1,
        |driver| async move {
            let (mut a, _b) = tcp_pair().await;
            guard("close", AsyncWriteExt::close(&mut a)).await.unwrap();
            let r = guard("write", AsyncWriteExt::write(&mut a, b"late")).await;
            assert_eq!(
                r.map_err(|e| e.kind()),
                Err(io::ErrorKind::BrokenPipe),
                "[{driver}] after close"
            );
            let (mut u, _v) = UnixStream::pair().unwrap();
            u.shutdown(Shutdown::Both).unwrap();
            let r = guard("write", AsyncWriteExt::write(&mut u, b"late")).await;
            assert_eq!(
                r.map_err(|e| e.kind()),
                Err(io::ErrorKind::BrokenPipe),
                "[{driver}] after shutdown"
            );
        },
    );
}

/// 1 MiB through `futures::io::{AsyncWriteExt::write_all, AsyncReadExt::read_exact}` in both
/// directions at once, on a TCP connection and a Unix pair.
#[test]
fn async_read_write_one_mib() {
    on_each_driver("async_read_write_one_mib", 1, |_| async {
        const LEN: usize = 1 << 20;
        async fn both_ways<S>(mut a: S, mut b: S)
        where
            S: futures::io::AsyncRead + futures::io::AsyncWrite + Unpin + 'static,
        {
            let ab = pattern(15, LEN);
            let writer = spawn_local(async move {
                a.write_all(&pattern(15, LEN)).await.unwrap();
                a.flush().await.unwrap();
                // Then read what b sends back, in small pieces.
                let mut got = Vec::with_capacity(LEN);
                let mut piece = [0u8; 1000];
                while got.len() < LEN {
                    let n = a.read(&mut piece).await.unwrap();
                    assert!(n > 0, "EOF after {}", got.len());
                    got.extend_from_slice(&piece[..n]);
                }
                a.close().await.unwrap();
                got
            });
            let mut got = vec![0u8; LEN];
            b.read_exact(&mut got).await.unwrap();
            assert!(got == ab, "a → b corrupted");
            b.write_all(&pattern(16, LEN)).await.unwrap();
            b.flush().await.unwrap();
            let back = guard("writer", writer).await.unwrap();
            assert!(back == pattern(16, LEN), "b → a corrupted");
            // a closed its write half: b reads EOF.
            let mut rest = Vec::new();
            b.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        }
        let (c, s) = tcp_pair().await;
        guard("tcp", both_ways(c, s)).await;
        let (a, b) = UnixStream::pair().unwrap();
        guard("unix", both_ways(a, b)).await;
    });
}

#[test]
fn fixed_buf_pool_on_a_socket() {
    on_each_driver("fixed_buf_pool_on_a_socket", 1, |driver| async move {
        let pool = FixedBufPool::register(4, 4096).unwrap();
        assert_eq!(pool.is_registered(), driver == Driver::IoUring);
        assert_eq!(pool.buf_size(), 4096);
        // io_uring allows one registered set per ring.
        match (driver, FixedBufPool::register(1, 64)) {
            (Driver::IoUring, Err(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}")
            }
            (Driver::IoUring, Ok(_)) => panic!("a second registration on one io_uring"),
            (Driver::Epoll, r) => drop(r.expect("plain buffers on epoll")),
        }
        assert!(FixedBufPool::register(0, 64).is_err());

        let (a, b) = UnixStream::pair().unwrap();
        let (c, s) = tcp_pair().await;

        // A fixed read that waits for its data, then a fixed write that provides it.
        let b = Rc::new(b);
        let b2 = b.clone();
        let rpool = pool.clone();
        let reader = spawn_local(async move {
            let buf = rpool.take().unwrap();
            assert_eq!(buf.capacity(), 4096);
            let (r, buf) = b2.read(buf).await;
            let n = r.unwrap();
            assert_eq!(buf.len(), n);
            buf.to_vec()
        });
        sleep(Duration::from_millis(5)).await;
        let mut wb = pool.take().unwrap();
        assert!(wb.is_empty());
        assert_eq!(wb.put_slice(b"fixed hello"), 11);
        let (w, wb) = a.write_all(wb).await;
        w.unwrap();
        assert_eq!(&wb[..], b"fixed hello");
        assert_eq!(guard("fixed read", reader).await.unwrap(), b"fixed hello");

        // A full buffer over TCP, checked byte by byte.
        let mut wb = wb;
        wb.clear();
        let big = pattern(17, 10_000);
        assert_eq!(wb.put_slice(&big), 4096, "put_slice copies what fits");
        assert_eq!(wb.put_slice(&big), 0);
        let (w, wb) = c.write_all(wb).await;
        w.unwrap();
        let mut got = Vec::new();
        let mut rb = pool.take().unwrap();
        while got.len() < 4096 {
            let (r, b) = s.read(rb).await;
            assert!(r.unwrap() > 0);
            got.extend_from_slice(&b);
            rb = b;
        }
        assert_eq!(got, big[..4096]);

        // Four buffers: with two out (wb, rb) two more can be taken, then none.
        let t1 = pool.take().unwrap();
        let t2 = pool.take().unwrap();
        assert!(pool.take().is_none());
        drop(t1);
        assert!(pool.take().is_some());
        drop((t2, wb, rb));

        // Dropping the pool (and its buffers) unregisters: a new pool can register.
        drop(pool);
        let again = FixedBufPool::register(2, 128).unwrap();
        assert_eq!(again.is_registered(), driver == Driver::IoUring);
    });
}

// ---------------------------------------------------------------------------------------------
// 9. Quiescence with I/O in flight

#[test]
fn run_with_a_task_in_accept_is_not_a_deadlock() {
    each_driver(
        "run_with_a_task_in_accept_is_not_a_deadlock",
        1,
        |b| b.deadlock_grace(Some(Duration::from_millis(200))),
        |driver, exec| {
            exec.spawn_on(0, || async {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let r = l.accept().await;
                panic!("nobody connects, yet accept returned {:?}", r.map(|v| v.1));
            })
            .unwrap();
            let h = exec.handle();
            let stopper = thread::spawn(move || {
                thread::sleep(Duration::from_secs(1));
                h.stop();
            });
            let r = exec.run();
            stopper.join().unwrap();
            assert!(
                r.is_ok(),
                "{driver}: a task blocked in accept is not deadlocked: {r:?}"
            );

            // Control: the same grace reports a task that nothing can wake.
            exec.spawn_on(0, futures::future::pending::<()>).unwrap();
            let h = exec.handle();
            let stopper = thread::spawn(move || {
                thread::sleep(HANG);
                h.stop();
            });
            match exec.run() {
                Err(Error::Deadlock { .. }) => {}
                other => panic!("{driver}: expected a deadlock report, got {other:?}"),
            }
            drop(stopper);
        },
    );
}

#[test]
fn run_ends_when_an_accepted_connection_finishes_the_task() {
    each_driver(
        "run_ends_when_an_accepted_connection_finishes_the_task",
        2,
        |b| b.deadlock_grace(Some(Duration::from_millis(200))),
        |driver, exec| {
            let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
            let got = Arc::new(AtomicUsize::new(0));
            let got2 = got.clone();
            exec.spawn_on(1, move || async move {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                tx.send(l.local_addr().unwrap()).unwrap();
                let (s, _) = l.accept().await.unwrap();
                got2.store(read_to_end(&s).await.len(), SeqCst);
            })
            .unwrap();
            let client = thread::spawn(move || {
                let addr = rx.recv().unwrap();
                // Well past the deadlock grace: only the in-flight accept keeps run() going.
                thread::sleep(Duration::from_millis(700));
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.write_all(&pattern(18, 5000)).unwrap();
            });
            io_common::run_or_fail(&exec, "accept then read");
            client.join().unwrap();
            assert_eq!(got.load(SeqCst), 5000, "{driver}");
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Descriptors and buffered bytes across drops, conversions and shutdowns; more TCP

/// An operation dropped in the same loop turn as its socket, whose descriptor number the next
/// socket reuses at once: its queued entry (and a write-behind `AsyncWrite` send) must not reach
/// the new socket, stealing or injecting bytes. Each attempt checks the new pair's first bytes.
#[test]
fn a_closed_descriptor_number_reused_at_once_gets_no_stale_operation() {
    on_each_driver(
        "a_closed_descriptor_number_reused_at_once_gets_no_stale_operation",
        1,
        |driver| async move {
            let mut reused = 0;
            for attempt in 0..200 {
                let (mut a, _keep) = UnixStream::pair().unwrap();
                let old = a.as_raw_fd();
                if attempt % 2 == 0 {
                    // A read polled once and dropped in this turn.
                    let mut fut = Box::pin(a.read(Vec::with_capacity(64)));
                    let pending =
                        poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await;
                    assert!(pending);
                } else {
                    // A write-behind send (io_uring) reported done at once.
                    let n = AsyncWriteExt::write(&mut a, b"STALE!").await.unwrap();
                    assert_eq!(n, 6);
                }
                drop(a);
                // The lowest free descriptors: most often `old` is one of them.
                let (x, y) = std::os::unix::net::UnixStream::pair().unwrap();
                if x.as_raw_fd() == old || y.as_raw_fd() == old {
                    reused += 1;
                }
                (&x).write_all(b"MARK").unwrap();
                (&y).write_all(b"MARK").unwrap();
                let (x, y) = (
                    UnixStream::from_std(x).unwrap(),
                    UnixStream::from_std(y).unwrap(),
                );
                for s in [&x, &y] {
                    let got = xtc_shards::time::timeout(Duration::from_secs(10), read_n(s, 4))
                        .await
                        .unwrap_or_else(|_| {
                            panic!("{driver} attempt {attempt}: the new socket's bytes were taken")
                        });
                    assert_eq!(got, b"MARK", "{driver} attempt {attempt}: foreign bytes");
                }
            }
            println!("{driver}: the descriptor number was reused at once in {reused}/200 attempts");
        },
    );
}

#[test]
fn tcp_connect_to_a_closed_port_is_refused() {
    on_each_driver("tcp_connect_to_a_closed_port_is_refused", 1, |_| async {
        // A port that was just free: bind, note, close.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = guard("connect", TcpStream::connect(("127.0.0.1", port)))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        // And the loop carries on: a good connection right after.
        echo_round_trip(pattern(19, 1000)).await;
    });
}

/// One stream used by two tasks at once (an `Rc`): a reader and a writer, in both directions,
/// with enough data that both directions wait for the peer at the same time (on epoll one
/// registration armed for reading and writing together).
#[test]
fn tcp_full_duplex_from_two_tasks_per_stream() {
    on_each_driver("tcp_full_duplex_from_two_tasks_per_stream", 1, |_| async {
        const LEN: usize = 4 << 20;
        let (c, s) = tcp_pair().await;
        let (c, s) = (Rc::new(c), Rc::new(s));
        let mut tasks = Vec::new();
        for (me, peer, seed) in [(c.clone(), s.clone(), 20), (s.clone(), c.clone(), 21)] {
            // `me` writes LEN bytes of `seed`; `peer` reads them.
            tasks.push(spawn_local(async move {
                let mut off = 0;
                while off < LEN {
                    let chunk = pattern(seed + off, 100_000.min(LEN - off));
                    let n = chunk.len();
                    let (w, _) = me.write_all(chunk).await;
                    w.unwrap();
                    off += n;
                }
                0usize
            }));
            tasks.push(spawn_local(async move {
                let mut off = 0;
                while off < LEN {
                    let n = 100_000.min(LEN - off);
                    assert_eq!(read_n(&*peer, n).await, pattern(seed + off, n));
                    off += n;
                }
                off
            }));
        }
        let mut read = 0;
        for t in tasks {
            read += guard("full duplex", t).await.unwrap();
        }
        assert_eq!(read, 2 * LEN);
    });
}

/// A connection accepted on shard 0 and served on shard 1: `into_std`, send, `from_std`.
#[test]
fn tcp_stream_handed_to_another_shard() {
    each_driver(
        "tcp_stream_handed_to_another_shard",
        2,
        |b| b,
        |_, exec| {
            exec.block_on(|| async {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                let client = spawn_local(async move {
                    let c = TcpStream::connect(addr).await.unwrap();
                    let (w, _) = c.write_all(pattern(22, 50_000)).await;
                    w.unwrap();
                    c.shutdown(Shutdown::Write).unwrap();
                    read_to_end(&c).await
                });
                let (s, _) = l.accept().await.unwrap();
                // Used here first, so it has a registration on this loop (epoll).
                let first = read_n(&s, 10).await;
                let std_s = s.into_std().unwrap();
                let served = submit_to(1, move || async move {
                    assert_eq!(shard::id(), 1);
                    let s = TcpStream::from_std(std_s).unwrap();
                    let (w, _) = s.write_all(first).await;
                    w.unwrap();
                    echo(s).await
                })
                .await
                .unwrap();
                assert_eq!(served, 50_000 - 10);
                assert_eq!(guard("client", client).await.unwrap(), pattern(22, 50_000));
            })
            .unwrap();
        },
    );
}

/// Bytes the `futures::io` read path has taken from the kernel are not lost when the stream
/// is unwrapped with `into_std` (say, to hand it to another shard after reading a header).
#[test]
fn async_read_then_into_std_loses_no_bytes() {
    on_each_driver("async_read_then_into_std_loses_no_bytes", 1, |_| async {
        for head_len in [1usize, 100, 5000] {
            let (mut c, s) = tcp_pair().await;
            let msg = pattern(23 + head_len, 20_000);
            let (w, _) = s.write_all(msg.clone()).await;
            w.unwrap();
            let mut head = vec![0u8; head_len];
            AsyncReadExt::read_exact(&mut c, &mut head).await.unwrap();
            assert_eq!(head[..], msg[..head_len]);
            let c = TcpStream::from_std(c.into_std().unwrap()).unwrap();
            let rest = xtc_shards::time::timeout(
                Duration::from_secs(10),
                read_n(&c, msg.len() - head_len),
            )
            .await
            .unwrap_or_else(|_| panic!("bytes after a {head_len}-byte head were lost"));
            assert_eq!(rest, msg[head_len..]);
        }
    });
}

/// `AsyncWrite` followed by the inherent `shutdown(Write)` (no flush, as with std or tokio):
/// the bytes precede the end of stream on both drivers (io_uring sends them behind the write
/// call, so the shutdown has to submit them first).
#[test]
fn async_write_then_shutdown_delivers_the_bytes() {
    on_each_driver(
        "async_write_then_shutdown_delivers_the_bytes",
        1,
        |_| async {
            let (mut a, b) = UnixStream::pair().unwrap();
            AsyncWriteExt::write_all(&mut a, b"hello").await.unwrap();
            a.shutdown(Shutdown::Write).unwrap();
            assert_eq!(guard("read", read_to_end(&b)).await, b"hello");

            let (mut c, s) = tcp_pair().await;
            AsyncWriteExt::write_all(&mut c, &pattern(24, 30_000))
                .await
                .unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            assert_eq!(guard("read", read_to_end(&s)).await, pattern(24, 30_000));
        },
    );
}

/// A shutdown that would overtake `AsyncWrite` bytes the kernel has not taken yet (io_uring
/// write-behind into a full socket buffer) is refused with `WouldBlock`; after a flush it
/// succeeds, and the reader gets every byte `AsyncWrite` reported written, then the end.
#[test]
fn shutdown_refused_while_async_write_bytes_are_in_flight() {
    on_each_driver(
        "shutdown_refused_while_async_write_bytes_are_in_flight",
        1,
        |driver| async move {
            let (mut a, b) = UnixStream::pair().unwrap();
            let chunk = pattern(25, 64 * 1024);
            let mut written = Vec::new();
            // Write until the socket buffer (the peer reads nothing yet) pushes back: a write
            // that has not finished after 50 ms is given up (it took no bytes).
            for _ in 0..10_000 {
                let write = AsyncWriteExt::write(&mut a, &chunk);
                match xtc_shards::time::timeout(Duration::from_millis(50), write).await {
                    Ok(n) => written.extend_from_slice(&chunk[..n.unwrap()]),
                    Err(_) => break,
                }
            }
            assert!(!written.is_empty() && written.len() < 10_000 * chunk.len());
            let shut = a.shutdown(Shutdown::Write);
            if driver == Driver::IoUring {
                // The last write's bytes sit behind the full buffer.
                let e = shut.expect_err("a shutdown overtaking unsent AsyncWrite bytes");
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
                let b = Rc::new(b);
                let reader = spawn_local({
                    let b = b.clone();
                    async move { read_to_end(&*b).await }
                });
                guard("flush", AsyncWriteExt::flush(&mut a)).await.unwrap();
                a.shutdown(Shutdown::Write).unwrap();
                assert_eq!(guard("read", reader).await.unwrap(), written);
            } else {
                // epoll writes straight from the caller's slice: nothing is left behind.
                shut.unwrap();
                assert_eq!(guard("read", read_to_end(&b)).await, written);
            }
        },
    );
}

/// `ConnBalancer`: 3 shards (oversubscribed here), each accepting on its own `SO_REUSEPORT`
/// listener; 30 connections held open end up 10 per shard whatever the kernel's hash did, each
/// served on the shard the balancer counted it on, and every count goes back to 0 when the
/// clients hang up.
#[test]
fn conn_balancer_evens_out_open_connections() {
    use xtc_shards::net::ConnBalancer;
    assert!(ConnBalancer::new(0).is_err());
    each_driver(
        "conn_balancer_evens_out_open_connections",
        3,
        |b| b.oversubscribe(true),
        |_, exec| {
            let bal = ConnBalancer::new(3).unwrap();
            let inner = bal.clone();
            exec.block_on(move || async move {
                let bal = inner;
                let l0 = TcpListener::bind_reuseport("127.0.0.1:0").unwrap();
                let port = l0.local_addr().unwrap().port();
                // Each connection is told the shard that serves it, then echoes until EOF.
                let handler = |s: TcpStream, _peer: SocketAddr| async move {
                    let (w, _) = s.write_all(vec![shard::id() as u8]).await;
                    w.unwrap();
                    echo(s).await;
                };
                // A balancer made for another shard count is refused at once.
                let wrong = ConnBalancer::new(5).unwrap();
                let e = wrong
                    .serve(TcpListener::bind("127.0.0.1:0").unwrap(), handler)
                    .await
                    .unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                for shard_ix in 1..3 {
                    let bal = bal.clone();
                    submit_to(shard_ix, move || async move {
                        let l = TcpListener::bind_reuseport(("127.0.0.1", port)).unwrap();
                        spawn_local(async move { bal.serve(l, handler).await.unwrap() });
                    })
                    .await
                    .unwrap();
                }
                {
                    let bal = bal.clone();
                    spawn_local(async move { bal.serve(l0, handler).await.unwrap() });
                }
                let mut conns = Vec::new();
                let mut served = [0usize; 3];
                for _ in 0..30 {
                    let c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                    let id = guard("shard id", read_n(&c, 1)).await[0] as usize;
                    served[id] += 1;
                    conns.push(c);
                }
                assert_eq!(served, [10, 10, 10], "connections per serving shard");
                assert_eq!(bal.open_connections(), vec![10, 10, 10]);
                // Every connection works on the shard it was handed to.
                for (i, c) in conns.iter().enumerate() {
                    let msg = pattern(i, 100);
                    let (w, _) = c.write_all(msg.clone()).await;
                    w.unwrap();
                    assert_eq!(guard("echo", read_n(c, 100)).await, msg);
                }
                drop(conns);
                guard("counts back to zero", async {
                    while bal.open_connections() != vec![0, 0, 0] {
                        sleep(Duration::from_millis(1)).await;
                    }
                })
                .await;
            })
            .unwrap();
        },
    );
}

/// A connected UDP socket whose send draws an ICMP "port unreachable": the error is reported
/// once (`ConnectionRefused`), and the socket then waits like any other. On epoll the error
/// event used to leave a sticky "closed" bit that made every later receive retry `EAGAIN` in
/// a loop without ever yielding: the shard spun at 100 % and none of its tasks ran again.
#[test]
fn udp_error_is_reported_once_then_the_socket_waits() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        on_each_driver("udp_error_is_reported_once", 1, |_| async {
            let gone = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let gone_addr = gone.local_addr().unwrap();
            drop(gone); // nobody listens there now
            let std_sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            std_sock.connect(gone_addr).unwrap();
            let s = Rc::new(UdpSocket::from_std(std_sock).unwrap());
            // A receive waits (the socket joins the driver) when the error arrives.
            let s2 = s.clone();
            let first = spawn_local(async move {
                let (r, _) = s2.recv_from(Vec::with_capacity(64)).await;
                r.map(|(n, _)| n).map_err(|e| e.kind())
            });
            sleep(Duration::from_millis(5)).await;
            let (sent, _) = s.send_to(vec![7u8; 8], gone_addr).await;
            sent.unwrap();
            let got = guard("first recv", first).await.unwrap();
            assert_eq!(got, Err(io::ErrorKind::ConnectionRefused));
            // Nothing more will come: the next receive must wait (its timer can fire only if
            // the loop is not stuck retrying it).
            let next = xtc_shards::time::timeout(
                Duration::from_millis(50),
                s.recv_from(Vec::with_capacity(64)),
            )
            .await;
            assert!(next.is_err(), "a receive on a silent socket completed");
        });
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the test hung: a receive after the socket error spun its loop");
}

/// `futures::io` writes and owned writes mixed on one stream keep their order at the peer, and
/// so do reads: on io_uring an `AsyncWrite` is sent behind the caller's back, and an owned
/// `write_all` used to go out while the rest of a short write-behind send was still to come
/// (the peer got `head[..k] body head[k..]`).
#[test]
fn mixed_trait_and_owned_io_keep_the_byte_order() {
    on_each_driver(
        "mixed_trait_and_owned_io_keep_the_byte_order",
        1,
        |_| async {
            let (a, b) = UnixStream::pair().unwrap();
            // A small send buffer makes the 64 KiB write-behind send come back short.
            small_sndbuf(a.as_raw_fd());
            let head = pattern(40, 64 * 1024);
            let body = pattern(41, 64 * 1024);
            let b = b.into_std().unwrap();
            let peer = thread::spawn(move || {
                let mut b = b;
                b.set_nonblocking(false).unwrap();
                // Read slowly at first, so the sender's buffer fills.
                thread::sleep(Duration::from_millis(50));
                let mut all = Vec::new();
                b.read_to_end(&mut all).unwrap();
                all
            });
            let mut a = a;
            AsyncWriteExt::write_all(&mut a, &head).await.unwrap(); // write-behind on io_uring
            let (r, _) = Stream::write_all(&a, body.clone()).await; // owned
            r.unwrap();
            AsyncWriteExt::close(&mut a).await.unwrap();
            drop(a);
            let got = guard("peer", async {
                loop {
                    if peer.is_finished() {
                        break peer.join().unwrap();
                    }
                    sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
            assert_eq!(got.len(), head.len() + body.len());
            assert!(
                got[..head.len()] == head[..],
                "the head arrived out of order"
            );
            assert!(
                got[head.len()..] == body[..],
                "the body arrived out of order"
            );
        },
    );
}

/// An `AsyncRead` dropped while its read is in flight (io_uring) keeps what that read takes;
/// the next owned `read` gets those bytes first instead of waiting for more.
#[test]
fn an_owned_read_after_a_dropped_trait_read_gets_its_bytes() {
    on_each_driver("an_owned_read_after_a_dropped_trait_read", 1, |_| async {
        let (a, b) = UnixStream::pair().unwrap();
        let mut a = a;
        let mut small = [0u8; 16];
        let dropped = xtc_shards::time::timeout(
            Duration::from_millis(10),
            AsyncReadExt::read(&mut a, &mut small),
        )
        .await;
        assert!(dropped.is_err(), "nothing was sent yet");
        let (w, _) = Stream::write_all(&b, b"hello".to_vec()).await;
        w.unwrap();
        let (r, buf) = guard("owned read", Stream::read(&a, Vec::with_capacity(64))).await;
        assert_eq!(r.unwrap(), 5);
        assert_eq!(&buf[..], b"hello");
    });
}

/// A stream may outlive its loop (returned from `block_on`) with an operation that completed
/// but was never polled: the driver's shutdown does not wait for it (it used to wait its full
/// one-second grace for the slot to go, and then log a false "did not complete": an error
/// event, which this test counts instead of timing the shutdown).
#[test]
fn a_completed_operation_outliving_its_loop_does_not_stall_the_shutdown() {
    let errors = Arc::new(AtomicUsize::new(0));
    let (a, b) = tracing::subscriber::with_default(
        common::count_events(tracing::Level::ERROR, errors.clone()),
        || {
            tracing::error!("a probe: the counter sees this thread's errors");
            assert_eq!(errors.load(SeqCst), 1, "the error counter is not installed");
            LocalExecutor::new().unwrap().block_on(async {
                let (mut a, b) = UnixStream::pair().unwrap();
                // On io_uring: a write-behind send, completed by the kernel, never polled again.
                AsyncWriteExt::write(&mut a, b"x").await.unwrap();
                sleep(Duration::from_millis(20)).await;
                (a, b)
            })
        },
    );
    let mut b = b.into_std().unwrap();
    let mut got = [0u8; 1];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"x");
    drop(a);
    assert_eq!(
        errors.load(SeqCst),
        1,
        "the driver's shutdown logged an error: it waited for an operation the kernel had \
         finished"
    );
}

/// Two receives of one task waiting on the same socket: dropping one must leave the other
/// registered (on epoll both shared one waker entry, and the drop removed it: the survivor was
/// never woken, only found by a later poll for another reason).
#[test]
fn dropping_one_of_two_waiting_receives_of_a_task_keeps_the_other() {
    on_each_driver("dropping_one_of_two_waiting_receives", 1, |_| async {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let at = s.local_addr().unwrap();
        // The datagram comes later, from another task.
        let sender = spawn_local(async move {
            sleep(Duration::from_millis(20)).await;
            let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
            let (sent, _) = peer.send_to(b"ping".to_vec(), at).await;
            sent.unwrap();
        });
        let mut first = Some(Box::pin(s.recv_from(Vec::with_capacity(64))));
        let mut second = Box::pin(s.recv_from(Vec::with_capacity(64)));
        let mut started = false;
        let t0 = std::time::Instant::now();
        // Polls both once, drops the first, and from then on polls the second only when this
        // task is woken: nothing else re-polls (and so re-registers) it.
        let survivor = poll_fn(|cx| {
            if !started {
                started = true;
                let f = first.as_mut().expect("first poll");
                assert!(f.as_mut().poll(cx).is_pending());
                assert!(second.as_mut().poll(cx).is_pending());
                first = None;
                return Poll::Pending;
            }
            second.as_mut().poll(cx)
        });
        // The timeout's own wake would re-poll (and so rescue) it: count that as the failure
        // (a hang guard: the datagram's wake comes at once).
        let (r, buf) = xtc_shards::time::timeout(HANG, survivor)
            .await
            .unwrap_or_else(|_| panic!("the surviving receive was not woken by its datagram"));
        assert!(
            t0.elapsed() < HANG,
            "the surviving receive was rescued by its timeout, not woken by its datagram"
        );
        assert_eq!(r.unwrap().0, 4);
        assert_eq!(&buf[..], b"ping");
        sender.await.unwrap();
    });
}

/// A handler that panics when called, for a connection served on the accepting shard: the
/// panic stays in that connection's task and the balancer goes on accepting (it used to call
/// the handler in the accept loop itself, so the panic ended `serve`).
#[test]
fn conn_balancer_survives_a_handler_that_panics_when_called() {
    use xtc_shards::net::ConnBalancer;
    on_each_driver("conn_balancer_survives_a_panicking_handler", 1, |_| async {
        let bal = ConnBalancer::new(1).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // The first call panics before it returns a future; later ones echo.
        let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let handler = move |s: TcpStream, _peer: SocketAddr| {
            assert!(!first.swap(false, SeqCst), "a handler bug");
            async move {
                echo(s).await;
            }
        };
        let serving = spawn_local(async move { bal.serve(l, handler).await });
        let c1 = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        // The panicking call's connection is dropped with its task: EOF.
        assert_eq!(guard("eof", read_n_or_eof(&c1)).await, 0);
        let c2 = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (w, _) = c2.write_all(b"still here".to_vec()).await;
        w.unwrap();
        assert_eq!(guard("echo", read_n(&c2, 10)).await, b"still here");
        assert!(
            !serving.is_finished(),
            "serve ended after the handler panicked"
        );
        serving.abort();
    });
}

/// `ConnBalancer::serve` dropped (aborted, a `select!`, a timeout) while it waits for room in
/// the ring to the shard it chose for a connection it has accepted: that connection is served
/// on the accepting shard, as those handed over before the drop still are. It was closed
/// without a word: its client, connected and accepted, read end of stream.
#[test]
fn a_conn_balancer_dropped_while_it_waits_for_ring_room_serves_the_accepted_connection() {
    use xtc_shards::net::ConnBalancer;
    each_driver(
        "a_conn_balancer_dropped_waiting_for_ring_room",
        2,
        |b| b.oversubscribe(true).ring_capacity(1),
        |_, exec| {
            let h = exec.handle();
            exec.block_on(move || async move {
                let bal = ConnBalancer::new(2).unwrap();
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let port = l.local_addr().unwrap().port();
                // Each connection is told the shard that serves it, then echoes until EOF.
                let handler = |s: TcpStream, _peer: SocketAddr| async move {
                    let (w, _) = s.write_all(vec![shard::id() as u8]).await;
                    w.unwrap();
                    echo(s).await;
                };
                let serving = {
                    let bal = bal.clone();
                    spawn_local(async move { bal.serve(l, handler).await })
                };
                // The first connection stays here (a tie) and open: the next one goes to
                // shard 1, which serves fewer.
                let c1 = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                assert_eq!(guard("first", read_n(&c1, 1)).await, [0]);
                // Shard 1 held in a poll, and the ring to it (one slot) full.
                let (started, release) = (
                    Arc::new(std::sync::atomic::AtomicBool::new(false)),
                    Arc::new(std::sync::atomic::AtomicBool::new(false)),
                );
                let (s, r) = (started.clone(), release.clone());
                shard::send_to(1, move || async move {
                    s.store(true, SeqCst);
                    while !r.load(SeqCst) {
                        thread::yield_now();
                    }
                })
                .await
                .unwrap();
                guard("shard 1 held", async {
                    while !started.load(SeqCst) {
                        sleep(Duration::from_millis(1)).await;
                    }
                })
                .await;
                shard::send_to(1, || async {}).await.unwrap();
                let waits = h.loop_stats(0).unwrap().ring_full_waits;
                // Accepted, and the acceptor waits for room to hand it to shard 1.
                let c2 = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                guard("the acceptor waits for room", async {
                    while h.loop_stats(0).unwrap().ring_full_waits == waits {
                        sleep(Duration::from_millis(1)).await;
                    }
                })
                .await;
                serving.abort();
                assert!(serving.await.is_err(), "serve ended by itself");
                release.store(true, SeqCst);
                let mut id = vec![0u8; 1];
                let n = guard("a byte or EOF", async {
                    let (r, b) = c2.read(Vec::with_capacity(1)).await;
                    id = b;
                    r.unwrap_or(0)
                })
                .await;
                assert_eq!(n, 1, "the accepted connection was closed unserved");
                assert_eq!(id, [0], "served on the accepting shard");
                let (w, _) = c2.write_all(b"ping".to_vec()).await;
                w.unwrap();
                assert_eq!(guard("echo", read_n(&c2, 4)).await, b"ping");
                drop((c1, c2));
                guard("counts back to zero", async {
                    while bal.open_connections() != vec![0, 0] {
                        sleep(Duration::from_millis(1)).await;
                    }
                })
                .await;
            })
            .unwrap();
        },
    );
}

/// Reads until the peer closes or one byte arrives; the count read (0 at end of stream).
async fn read_n_or_eof(c: &TcpStream) -> usize {
    let (r, _) = c.read(Vec::with_capacity(1)).await;
    r.unwrap_or(0)
}

#[test]
fn a_fixed_buffer_comes_back_empty_from_its_pool() {
    on_each_driver(
        "a_fixed_buffer_comes_back_empty_from_its_pool",
        1,
        |_| async {
            let pool = FixedBufPool::register(1, 64).unwrap();
            let mut b = pool.take().unwrap();
            assert_eq!(b.put_slice(b"one client's bytes"), 18);
            drop(b);
            // The one buffer again: empty, with its whole capacity to fill.
            let mut b = pool.take().unwrap();
            assert!(b.is_empty(), "reused buffer holds {:?}", &b[..]);
            assert_eq!(b.put_slice(&[7; 64]), 64);
        },
    );
}

/// A pool kept past the `block_on` that registered it: its driver closed, and with it the
/// registration, so `is_registered` says false from then on (it said true), its buffers work
/// as plain ones, and the next run's loop can register a pool of its own.
#[test]
fn a_pool_kept_past_its_driver_is_no_longer_registered() {
    let ex = LocalExecutor::new().unwrap();
    let (pool, driver) = ex.block_on(async {
        let pool = FixedBufPool::register(2, 64).unwrap();
        let driver = xtc_shards::io::current_driver();
        assert_eq!(pool.is_registered(), driver == Some(Driver::IoUring));
        (pool, driver)
    });
    println!("a_pool_kept_past_its_driver_is_no_longer_registered: {driver:?}");
    ex.block_on(async move {
        assert!(
            !pool.is_registered(),
            "the driver that registered the pool is gone, and its registration with it"
        );
        let again = FixedBufPool::register(1, 64).unwrap();
        assert_eq!(again.is_registered(), driver == Some(Driver::IoUring));
        assert!(!pool.is_registered());
        // Its buffers still carry bytes (as plain buffers).
        let (a, b) = UnixStream::pair().unwrap();
        let mut w = pool.take().unwrap();
        assert_eq!(w.put_slice(b"plain"), 5);
        let (r, _) = a.write_all(w).await;
        r.unwrap();
        let (r, got) = guard(
            "read into a kept pool's buffer",
            b.read(pool.take().unwrap()),
        )
        .await;
        assert_eq!(r.unwrap(), 5);
        assert_eq!(&got[..], b"plain");
    });
}

/// A stream dropped right after `AsyncWrite` reported bytes written (no flush, as code written
/// for tokio does) still delivers them: io_uring's send in flight behind the write call is left
/// to finish, not cancelled.
#[test]
fn async_write_then_drop_delivers_every_byte_reported_written() {
    on_each_driver("async_write_then_drop_delivers", 1, |driver| async move {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // Read nothing until the client has written and dropped its end.
            thread::sleep(Duration::from_millis(300));
            let mut all = Vec::new();
            s.read_to_end(&mut all).unwrap();
            all
        });
        let mut c = TcpStream::connect(addr).await.unwrap();
        // Fill the socket buffers, so the next write's bytes wait behind them.
        let chunk = [7u8; 65536];
        let mut before = 0usize;
        loop {
            // SAFETY: `chunk` is live for the call.
            let n = unsafe {
                libc::send(
                    c.as_raw_fd(),
                    chunk.as_ptr().cast(),
                    chunk.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                break;
            }
            before += n as usize;
        }
        AsyncWriteExt::write_all(&mut c, b"TAIL").await.unwrap();
        drop(c);
        let all = guard("server", async {
            while !server.is_finished() {
                sleep(Duration::from_millis(5)).await;
            }
            server.join().unwrap()
        })
        .await;
        assert_eq!(
            all.len(),
            before + 4,
            "{driver}: bytes reported written were lost"
        );
        assert!(all.ends_with(b"TAIL"));
    });
}

/// The send a dropped stream leaves behind (above) does not hold `run()` when nobody reads:
/// the run ends at quiescence, and the send goes with the loop.
#[test]
fn run_is_not_held_by_a_send_a_dropped_stream_left() {
    each_driver(
        "run_is_not_held_by_a_send",
        1,
        |b| b,
        |driver, ex| {
            let (mine, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
            ex.spawn_on(0, move || async move {
                let mut s = UnixStream::from_std(mine).unwrap();
                let chunk = pattern(26, 64 * 1024);
                // Until the buffer is full: the last write's bytes wait in a send in flight.
                for _ in 0..1_000 {
                    let write = AsyncWriteExt::write(&mut s, &chunk);
                    if xtc_shards::time::timeout(Duration::from_millis(50), write)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                drop(s);
            })
            .unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let runner = thread::spawn(move || tx.send(ex.run()).unwrap());
            let ran = rx.recv_timeout(Duration::from_secs(20));
            drop(theirs);
            runner.join().unwrap();
            ran.unwrap_or_else(|_| panic!("{driver}: run() waited on a detached send"))
                .unwrap();
        },
    );
}

/// The state column of `/proc/net/tcp` for the IPv4 socket `local` → `remote` (`01`
/// ESTABLISHED, `04` FIN_WAIT1, ...), if listed.
fn tcp_state(local: u16, remote: u16) -> Option<String> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let port = |s: &str| u16::from_str_radix(s.rsplit(':').next()?, 16).ok();
        (port(f.get(1)?)? == local && port(f.get(2)?)? == remote).then(|| f[3].to_string())
    })
}

/// A send detached by a dropped stream whose peer never reads is cancelled after the detach
/// limit (10 s), so the socket closes (FIN queued): it does not live, with its buffers, until
/// the peer reads.
#[test]
fn a_detached_send_to_a_peer_that_never_reads_expires() {
    each_driver(
        "a_detached_send_expires",
        1,
        |b| b,
        |driver, ex| {
            if driver != Driver::IoUring {
                return; // epoll writes from the caller's slice: nothing is left behind.
            }
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let (addr_tx, addr_rx) = std::sync::mpsc::channel::<SocketAddr>();
            let client = thread::spawn(move || {
                let c = std::net::TcpStream::connect(addr_rx.recv().unwrap()).unwrap();
                let _ = done_rx.recv_timeout(Duration::from_secs(60));
                drop(c);
            });
            let states = ex
                .block_on(move || async move {
                    let l = TcpListener::bind("127.0.0.1:0").unwrap();
                    let port = l.local_addr().unwrap().port();
                    addr_tx.send(l.local_addr().unwrap()).unwrap();
                    let (mut s, peer) = l.accept().await.unwrap();
                    let chunk = [b'.'; 65536];
                    // SAFETY: `chunk` is live for each call.
                    while unsafe {
                        libc::send(
                            s.as_raw_fd(),
                            chunk.as_ptr().cast(),
                            chunk.len(),
                            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                        )
                    } >= 0
                    {}
                    // Reported written at once: its send waits behind the full buffer.
                    AsyncWriteExt::write_all(&mut s, b"response").await.unwrap();
                    drop(s);
                    sleep(Duration::from_millis(500)).await;
                    let early = tcp_state(port, peer.port());
                    let started = std::time::Instant::now();
                    let mut late = early.clone();
                    while late.as_deref() == Some("01")
                        && started.elapsed() < Duration::from_secs(20)
                    {
                        sleep(Duration::from_millis(250)).await;
                        late = tcp_state(port, peer.port());
                    }
                    (early, late)
                })
                .unwrap();
            drop(done_tx);
            client.join().unwrap();
            assert_eq!(states.0.as_deref(), Some("01"), "the send was left to run");
            assert_ne!(
                states.1.as_deref(),
                Some("01"),
                "still ESTABLISHED after 20 s"
            );
        },
    );
}

/// A user buffer whose `Drop` panics once armed.
struct PanicOnDrop(Vec<u8>, Arc<std::sync::atomic::AtomicBool>);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if self.1.load(SeqCst) {
            panic!("a user buffer's drop panics");
        }
    }
}

// SAFETY: the Vec's heap block is stable while the value lives; it is never grown.
unsafe impl IoBuf for PanicOnDrop {
    fn stable_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.0.len()
    }
    fn bytes_total(&self) -> usize {
        self.0.capacity()
    }
}

// SAFETY: as above; `set_init` stays within the capacity.
unsafe impl IoBufMut for PanicOnDrop {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: the caller initialized `n <= capacity` bytes.
        unsafe { self.0.set_len(n) }
    }
}

/// io_uring frees an abandoned read's buffer when the kernel is done with it, in the loop's
/// own code: a user buffer whose `Drop` panics must not take the loop down.
#[test]
fn a_panicking_buffer_dropped_by_the_driver_does_not_take_its_loop_down() {
    each_driver(
        "a_panicking_buffer_dropped_by_the_driver",
        1,
        |b| b,
        |driver, ex| {
            if driver != Driver::IoUring {
                return; // epoll's buffers are dropped by their futures, in task code.
            }
            let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
            let after = ex
                .spawn_on(0, move || async move {
                    let s = UnixStream::from_std(a).unwrap();
                    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let buf = PanicOnDrop(Vec::with_capacity(64), armed.clone());
                    let read = s.read(buf);
                    // Nothing to read: the read is abandoned, and the driver keeps its buffer until
                    // the cancellation completes.
                    let gave_up = xtc_shards::time::timeout(Duration::from_millis(20), read).await;
                    assert!(gave_up.is_err());
                    armed.store(true, SeqCst);
                    sleep(Duration::from_millis(50)).await;
                    7
                })
                .unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let runner = thread::spawn(move || tx.send(ex.run()).unwrap());
            let ran = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("run() hung");
            runner.join().unwrap();
            ran.unwrap();
            assert_eq!(futures::executor::block_on(after).unwrap(), 7);
        },
    );
}

/// A detached send that completes takes its expiry timer with it: the loop, idle after that,
/// is not woken when the limit (10 s) would have passed.
#[test]
fn a_detached_send_that_completes_leaves_no_timer_behind() {
    each_driver(
        "a_detached_send_that_completes",
        1,
        |b| b.deadlock_grace(None),
        |driver, ex| {
            if driver != Driver::IoUring {
                return;
            }
            let h = ex.handle();
            let (addr_tx, addr_rx) = std::sync::mpsc::channel::<SocketAddr>();
            let (mut go_tx, mut go_rx) = xtc_shards::channel::shared::bounded::<()>(1).unwrap();
            let client = thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(addr_rx.recv().unwrap()).unwrap();
                let mut got = Vec::new();
                c.read_to_end(&mut got).unwrap();
                assert_eq!(got, b"hello");
                thread::sleep(Duration::from_secs(1));
                let before = h.loop_stats(0).unwrap().parks;
                thread::sleep(Duration::from_millis(10_500));
                let after = h.loop_stats(0).unwrap().parks;
                go_tx.try_send(()).unwrap();
                (before, after)
            });
            ex.block_on(move || async move {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                addr_tx.send(l.local_addr().unwrap()).unwrap();
                let (mut s, _) = l.accept().await.unwrap();
                AsyncWriteExt::write_all(&mut s, b"hello").await.unwrap();
                drop(s); // its send is not even submitted yet: detached
                drop(l);
                go_rx.recv().await;
            })
            .unwrap();
            let (before, after) = client.join().unwrap();
            assert_eq!(before, after, "the idle loop woke while nothing was due");
        },
    );
}

/// Bytes `AsyncWrite` reported written are delivered when the executor stops while their send
/// still waits for a slow peer. On io_uring the send is detached when the stream drops, and
/// the driver's shutdown cancelled it at once: the peer got only what fitted in the socket
/// buffers, with no error anywhere. It now gets a grace to finish first.
#[test]
fn bytes_reported_written_survive_the_executor_stopping() {
    each_driver(
        "bytes_reported_written_survive_the_executor_stopping",
        1,
        |b| b,
        |driver, ex| {
            let (addr_tx, addr_rx) = std::sync::mpsc::channel::<SocketAddr>();
            let client = thread::spawn(move || {
                // A small receive window, set before the handshake, and a slow reader that
                // starts once the server side has stopped.
                let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                sock.set_recv_buffer_size(4096).unwrap();
                sock.connect(&addr_rx.recv().unwrap().into()).unwrap();
                let mut c = std::net::TcpStream::from(sock);
                thread::sleep(Duration::from_millis(300));
                let mut got = Vec::new();
                c.read_to_end(&mut got).unwrap();
                got
            });
            let sent = ex
                .block_on(move || async move {
                    let l = TcpListener::bind("127.0.0.1:0").unwrap();
                    addr_tx.send(l.local_addr().unwrap()).unwrap();
                    let (mut s, _) = l.accept().await.unwrap();
                    small_sndbuf(s.as_raw_fd());
                    // More than the socket buffers hold: the send waits for the reader.
                    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
                    let n = AsyncWriteExt::write(&mut s, &data).await.unwrap();
                    data[..n].to_vec()
                })
                .unwrap();
            drop(ex);
            let got = client.join().unwrap();
            assert_eq!(
                got.len(),
                sent.len(),
                "[{driver}] the peer got {} of the {} bytes reported written",
                got.len(),
                sent.len()
            );
            assert!(got == sent, "[{driver}] the bytes differ");
        },
    );
}

/// Shrinks `fd`'s send buffer so that a 64 KiB send waits for the peer.
fn small_sndbuf(fd: i32) {
    let small: libc::c_int = 4096;
    // SAFETY: a plain setsockopt on a descriptor the caller owns, with a live int argument.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&raw const small).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt(SO_SNDBUF)");
}

/// A task holding a stream whose `AsyncWrite` send completed (and was never polled again),
/// waiting for something nothing will deliver, is deadlocked like the same task without the
/// stream. On io_uring the unpolled send's slot counted as I/O in flight, so the loop never
/// looked parked and `run()` waited for the stopper instead of reporting.
#[test]
fn run_reports_a_deadlock_behind_a_finished_write_behind_send() {
    each_driver(
        "run_reports_a_deadlock_behind_a_finished_write_behind_send",
        1,
        |b| b.deadlock_grace(Some(Duration::from_millis(200))),
        |driver, exec| {
            exec.spawn_on(0, || async {
                let (mut a, b) = UnixStream::pair().unwrap();
                AsyncWriteExt::write(&mut a, b"x").await.unwrap();
                sleep(Duration::from_millis(20)).await; // the send completes and is reaped
                let _keep = (a, b);
                futures::future::pending::<()>().await;
            })
            .unwrap();
            let h = exec.handle();
            let stopper = thread::spawn(move || {
                thread::sleep(HANG);
                h.stop();
            });
            let r = exec.run();
            assert!(
                matches!(r, Err(Error::Deadlock { .. })),
                "{driver}: expected a deadlock report, got {r:?}"
            );
            drop(stopper);
        },
    );
}

/// Two tasks start an owned `write_all` on one shared stream while an `AsyncWrite` send is
/// still in flight: both wait for that send, and both must be woken when it completes. The
/// send's `Op` kept one waker, the last poller's, so the first writer slept forever.
#[test]
fn two_owned_writers_behind_one_write_behind_send_both_finish() {
    on_each_driver(
        "two_owned_writers_behind_one_write_behind_send_both_finish",
        1,
        |driver| async move {
            if driver != Driver::IoUring {
                return; // write-behind is io_uring's: on epoll the first write waits for the peer
            }
            let (a, b) = UnixStream::pair().unwrap();
            small_sndbuf(a.as_raw_fd());
            let head = pattern(7, 64 * 1024);
            let mut a = a;
            // Reported written at once (io_uring); the send waits for the peer.
            AsyncWriteExt::write_all(&mut a, &head).await.unwrap();
            let a = Rc::new(a);
            let writer = |bytes: &'static [u8]| {
                let a = a.clone();
                spawn_local(async move { Stream::write_all(&*a, bytes.to_vec()).await.0 })
            };
            let (w1, w2) = (writer(b"one"), writer(b"two"));
            sleep(Duration::from_millis(50)).await; // both wait for the send
            let reader = spawn_local(async move { read_n(&b, 64 * 1024 + 6).await });
            guard("first writer", w1).await.unwrap().unwrap();
            guard("second writer", w2).await.unwrap().unwrap();
            let got = guard("reader", reader).await.unwrap();
            assert_eq!(&got[..64 * 1024], &head[..]);
            let tail = &got[64 * 1024..];
            assert!(tail == b"onetwo" || tail == b"twoone", "tail {tail:?}");
        },
    );
}

/// The read side of the test above: two owned `read`s wait behind the receive of a dropped
/// `AsyncRead` future; both must be woken, one gets the bytes that receive took, the other
/// the next ones.
#[test]
fn two_owned_readers_behind_one_dropped_async_read_both_finish() {
    on_each_driver(
        "two_owned_readers_behind_one_dropped_async_read_both_finish",
        1,
        |_| async move {
            let (a, mut b) = UnixStream::pair().unwrap();
            let mut scratch = [0u8; 16];
            // Polled once and dropped: on io_uring its receive stays in flight.
            let polled = futures::FutureExt::now_or_never(AsyncReadExt::read(&mut b, &mut scratch));
            assert!(polled.is_none(), "nothing was sent yet");
            let b = Rc::new(b);
            let reader = || {
                let b = b.clone();
                spawn_local(async move {
                    let (r, buf) = Stream::read(&*b, Vec::with_capacity(16)).await;
                    r.map(|_| buf)
                })
            };
            let (r1, r2) = (reader(), reader());
            sleep(Duration::from_millis(20)).await; // both wait
            a.write_all(b"first".to_vec()).await.0.unwrap();
            sleep(Duration::from_millis(20)).await;
            a.write_all(b"second".to_vec()).await.0.unwrap();
            let mut got = vec![
                guard("first reader", r1).await.unwrap().unwrap(),
                guard("second reader", r2).await.unwrap().unwrap(),
            ];
            got.sort();
            assert_eq!(got, vec![b"first".to_vec(), b"second".to_vec()]);
        },
    );
}

/// The waiters behind a stream's shared operation are bounded: 100 reads that each wait
/// once behind a dropped `AsyncRead` receive, then go away, leave at most 32 wakers (and so
/// tasks) held by the stream. They were all kept until the receive completed.
#[test]
fn waiters_behind_a_shared_op_are_bounded() {
    on_each_driver(
        "waiters_behind_a_shared_op_are_bounded",
        1,
        |driver| async move {
            if driver != Driver::IoUring {
                return; // the receive left in flight is io_uring's
            }
            struct W;
            impl std::task::Wake for W {
                fn wake(self: Arc<Self>) {}
            }
            let (_a, mut b) = UnixStream::pair().unwrap();
            let mut scratch = [0u8; 16];
            let polled = futures::FutureExt::now_or_never(AsyncReadExt::read(&mut b, &mut scratch));
            assert!(polled.is_none(), "nothing was sent");
            let wakers: Vec<Arc<W>> = (0..100).map(|_| Arc::new(W)).collect();
            for w in &wakers {
                let waker = Waker::from(w.clone());
                let mut cx = std::task::Context::from_waker(&waker);
                let mut read = pin!(Stream::read(&b, Vec::with_capacity(16)));
                assert!(read.as_mut().poll(&mut cx).is_pending());
            }
            let held = wakers.iter().filter(|w| Arc::strong_count(w) > 1).count();
            assert!(held <= 32, "{held} wakers held");
        },
    );
}

/// `accept` on a socket that is not a stream socket fails with `EOPNOTSUPP` (accept(2)), an
/// error of the listener itself: `accept` reports it rather than retry it forever (a commit
/// had put it among the connection errors to skip). On epoll the retry never yields, so the accept runs on a thread of
/// its own and a hang is caught by the receive's timeout.
#[test]
fn accept_on_a_datagram_socket_reports_its_error() {
    use xtc_shards::io::DriverChoice;
    let mut failed = Vec::new();
    for choice in [DriverChoice::IoUring, DriverChoice::Epoll] {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let exec = match xtc_shards::Executor::builder()
                .shards(1)
                .oversubscribe(true)
                .io_driver(choice)
                .build()
            {
                Ok(e) => e,
                Err(e) => {
                    let _ = tx.send(Ok(format!("skipped: {e}")));
                    return;
                }
            };
            let r = exec
                .block_on(|| async {
                    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                    let l = std::net::TcpListener::from(std::os::fd::OwnedFd::from(udp));
                    let l = xtc_shards::net::TcpListener::from_std(l).unwrap();
                    match xtc_shards::time::timeout(Duration::from_secs(3), l.accept()).await {
                        Ok(Ok(_)) => Err("accepted a connection".to_string()),
                        Ok(Err(e)) => Ok(format!("accept failed: {e}")),
                        Err(_) => Err("accept retried its error for 3 s".to_string()),
                    }
                })
                .unwrap();
            let _ = tx.send(r);
        });
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(msg)) => println!("{choice:?}: {msg}"),
            Ok(Err(msg)) => failed.push(format!("{choice:?}: {msg}")),
            Err(_) => failed.push(format!(
                "{choice:?}: accept spun without yielding (the loop hung)"
            )),
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// The same with the listener's loop gone (a listener returned from `LocalExecutor::block_on`):
/// its driver's shutdown left the kept accept's connection for the listener, and off any loop
/// `into_std` refuses for it while `accept` fails (no loop), so the listener can never be
/// unwrapped: the connection is only ever closed with it.
#[test]
fn into_std_off_the_loop_after_a_dropped_accept_can_unwrap() {
    use std::io::Write as _;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (l, client) = ex.block_on(async {
        if xtc_shards::io::current_driver() != Some(Driver::IoUring) {
            return (None, None);
        }
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut fut = Box::pin(l.accept());
        assert!(poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await);
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"hello").unwrap();
        sleep(Duration::from_millis(100)).await; // the loop reaps the accept's completion
        drop(fut);
        (Some(l), Some(c))
    });
    drop(ex);
    let (Some(l), Some(_client)) = (l, client) else {
        return;
    };
    let l = match l.into_std() {
        Ok(_) => return, // nothing kept: unwrapped
        Err(e) => e.into_inner(),
    };
    let accepted = futures::executor::block_on(l.accept());
    assert!(
        accepted.is_ok() || l.into_std().is_ok(),
        "off the loop, into_std refuses and accept fails ({:?}): the listener is stuck",
        accepted.err()
    );
}

/// A stream send whose future is forgotten (`mem::forget`, safe code) after its first poll,
/// and then its stream dropped: the send must not go out on whatever socket next takes the
/// descriptor's number. On io_uring the `SEND` entry named the descriptor by number only and
/// sat in the submission queue until the end of the turn: the stream's drop closed the
/// number, a `std` connect made in the same turn took it, and the stray bytes went to that
/// connection's peer (the same race `io_fs.rs` checks for files). On epoll the send is made in
/// the poll, on the stream's own socket.
#[test]
fn a_forgotten_send_does_not_go_out_on_a_socket_made_after_its_streams_drop() {
    on_each_driver(
        "a_forgotten_send_does_not_go_out_elsewhere",
        1,
        |driver| async move {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            // Other tests' threads open descriptors too: retried until the victim took the
            // dropped stream's number (at the first try, nearly always).
            for attempt in 0.. {
                assert!(attempt < 50, "{driver}: the number was never reused");
                let a = guard("connect", TcpStream::connect(addr)).await.unwrap();
                let (_peer_a, _) = listener.accept().unwrap();
                let number = a.as_raw_fd();
                let mut write = Box::pin(a.write(b"stray".to_vec()));
                // One poll (queued on io_uring, sent at once on epoll), then forgotten.
                let _ = futures::FutureExt::now_or_never(write.as_mut());
                common::forget(write);
                drop(a);
                // Takes the lowest free number: the dropped stream's, if that was closed.
                let victim = std::net::TcpStream::connect(addr).unwrap();
                let (mut peer, _) = listener.accept().unwrap();
                let reused = victim.as_raw_fd() == number;
                // Let the loop turn (and submit what it queued), and the send land if it does.
                for _ in 0..5 {
                    sleep(Duration::from_millis(5)).await;
                }
                drop(victim);
                let mut got = Vec::new();
                peer.set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                peer.read_to_end(&mut got).unwrap();
                assert_eq!(
                    got, b"",
                    "{driver}: a forgotten send went out on a socket made after its stream \
                     was dropped"
                );
                if reused {
                    break;
                }
            }
        },
    );
}

/// `len` bytes of anonymous memory, zero and never committed up front (`MAP_NORESERVE`): a
/// buffer of several GiB that costs only the pages the kernel touches, whatever the machine's
/// overcommit policy.
struct Mapped {
    ptr: *mut u8,
    len: usize,
    /// Bytes counted as data: all of them for a write (zero pages are initialized memory),
    /// what a read returned for a read.
    init: usize,
}

impl Mapped {
    fn new(len: usize, init: bool) -> Mapped {
        // SAFETY: a fresh private anonymous mapping; no pointer argument is read.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap of {len} bytes");
        Mapped {
            ptr: ptr.cast(),
            len,
            init: if init { len } else { 0 },
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: the mapping stays at `ptr` until the value is dropped, whatever moves the value;
// its `len` bytes are readable and zero-initialized.
unsafe impl IoBuf for Mapped {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn bytes_init(&self) -> usize {
        self.init
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

// SAFETY: as above; the mapping is writable, and `set_init` stays within it.
unsafe impl IoBufMut for Mapped {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    unsafe fn set_init(&mut self, n: usize) {
        self.init = n;
    }
}

/// A stream read into, or a write from, a buffer of 2 GiB or more does what one `read(2)` or
/// `write(2)` does (at most `MAX_RW_COUNT` bytes) on both drivers, as with `std`. On io_uring
/// the length went into the `RECV`/`SEND` as is (cut to `u32::MAX`), and the kernel refuses a
/// socket transfer over `INT_MAX` bytes: `EINVAL` for the read and for the write, where epoll
/// read the bytes waiting and wrote what fitted; a connected UDP socket's oversized datagram
/// got `EINVAL` instead of `EMSGSIZE`.
#[test]
fn socket_io_with_a_buffer_of_2_gib_or_more_moves_bytes_on_both_drivers() {
    on_each_driver(
        "socket_io_with_a_buffer_of_2_gib_or_more",
        1,
        |driver| async move {
            const BIG: usize = 3 << 30;
            let (c, s) = tcp_pair().await;
            let (x, y) = UnixStream::pair().unwrap();
            for len in [1usize << 31, BIG] {
                let (r, _) = c.write_all(b"hello".to_vec()).await;
                r.unwrap();
                let (r, b) = s.read(Mapped::new(len, false)).await;
                assert_eq!(
                    r.unwrap_or_else(|e| panic!("[{driver}] tcp read of {len}: {e}")),
                    5
                );
                // SAFETY: the read initialized the first `b.init` (5) bytes of the mapping.
                let got = unsafe { std::slice::from_raw_parts(b.ptr, b.init) };
                assert_eq!(got, b"hello");
                let (r, _) = y.write_all(b"hello".to_vec()).await;
                r.unwrap();
                let (r, _) = x.read(Mapped::new(len, false)).await;
                assert_eq!(
                    r.unwrap_or_else(|e| panic!("[{driver}] unix read of {len}: {e}")),
                    5
                );
            }
            // A write takes what the socket buffer holds, as std's does.
            let (r, _) = c.write(Mapped::new(BIG, true)).await;
            let n = r.unwrap_or_else(|e| panic!("[{driver}] tcp write of {BIG}: {e}"));
            assert!(n > 0 && n < BIG, "[{driver}] {n}");
            let (r, _) = x.write(Mapped::new(BIG, true)).await;
            let n = r.unwrap_or_else(|e| panic!("[{driver}] unix write of {BIG}: {e}"));
            assert!(n > 0 && n < BIG, "[{driver}] {n}");
            // A datagram too large for UDP is EMSGSIZE, connected or not, as from std.
            let u = UdpSocket::bind("127.0.0.1:0").unwrap();
            let to = u.local_addr().unwrap();
            let (r, _) = u.send_to(Mapped::new(BIG, true), to).await;
            assert_eq!(
                r.unwrap_err().raw_os_error(),
                Some(libc::EMSGSIZE),
                "[{driver}]"
            );
            u.connect(to).unwrap();
            let (r, _) = u.send(Mapped::new(BIG, true)).await;
            assert_eq!(
                r.unwrap_err().raw_os_error(),
                Some(libc::EMSGSIZE),
                "[{driver}]"
            );
        },
    );
}

/// A busy loop reaps its driver every 32 polls within a turn (`io::REAP_EVERY`), not only at
/// the turn's start: a read whose data is there is served while another task keeps the loop
/// busy, within about 32 of that task's polls rather than after the turn's 128. The spinner
/// yields each poll, which re-queues it without ending the batch, so the count its poll
/// reaches when the reader resumes is the same every run: about 32 with the mid-turn reap,
/// at least 126 without it.
#[test]
fn a_busy_loop_reaps_its_driver_within_a_turn() {
    on_each_driver(
        "a_busy_loop_reaps_its_driver_within_a_turn",
        1,
        |driver| async move {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            let b = UnixStream::from_std(b).unwrap();
            let polls = Rc::new(std::cell::Cell::new(0u32));
            let seen = Rc::new(std::cell::Cell::new(None));
            let reader = spawn_local({
                let (polls, seen) = (polls.clone(), seen.clone());
                async move {
                    let (r, buf) = b.read(Vec::with_capacity(1)).await;
                    assert_eq!(r.unwrap(), 1);
                    assert_eq!(buf, b"x");
                    seen.set(Some(polls.get()));
                }
            });
            let spinner = spawn_local({
                let (polls, seen) = (polls.clone(), seen.clone());
                async move {
                    while seen.get().is_none() && polls.get() < 1_000 {
                        polls.set(polls.get() + 1);
                        if polls.get() == 2 {
                            // The reader has polled (it was spawned first): data for it now.
                            (&a).write_all(b"x").unwrap();
                        }
                        xtc_shards::yield_now().await;
                    }
                }
            });
            reader.await.unwrap();
            spinner.await.unwrap();
            let at = seen.get().unwrap();
            assert!(
                at < 64,
                "[{driver}] the read was served at the spinner's poll {at}: the busy loop reaped \
             its driver only at the next turn"
            );
        },
    );
}

/// `bind`'s documented error kinds: `AddrInUse` for a port another socket holds (a
/// `SO_REUSEPORT` bind too, when the holder did not set it), `InvalidInput` for an address
/// list that is empty. Synchronous, and allowed off any loop.
#[test]
fn bind_errors_have_the_kinds_the_docs_name() {
    use std::io::ErrorKind::{AddrInUse, InvalidInput};
    let none: &[std::net::SocketAddr] = &[];

    let held = xtc_shards::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    let e = xtc_shards::net::TcpListener::bind(addr).unwrap_err();
    assert_eq!(e.kind(), AddrInUse, "{e}");
    let e = xtc_shards::net::TcpListener::bind_reuseport(addr).unwrap_err();
    assert_eq!(e.kind(), AddrInUse, "{e}");
    let e = xtc_shards::net::TcpListener::bind(none).unwrap_err();
    assert_eq!(e.kind(), InvalidInput, "{e}");

    let held = xtc_shards::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    let e = xtc_shards::net::UdpSocket::bind(addr).unwrap_err();
    assert_eq!(e.kind(), AddrInUse, "{e}");
    let e = xtc_shards::net::UdpSocket::bind(none).unwrap_err();
    assert_eq!(e.kind(), InvalidInput, "{e}");
}

/// `set_linger(Some(ZERO))` makes a close a reset the peer reads as `ConnectionReset` (what a
/// proxy passes on for a cut stream); `None` is the default close, a clean end of stream; a
/// nonzero linger, which would hold the loop's thread in `close`, is refused.
#[test]
fn linger_zero_closes_with_a_reset() {
    on_each_driver("linger_zero_closes_with_a_reset", 1, |_| async move {
        let (a, b) = io_common::tcp_pair().await;
        assert_eq!(a.linger().unwrap(), None, "the default close");
        let e = a.set_linger(Some(Duration::from_secs(1))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert_eq!(
            a.linger().unwrap(),
            None,
            "a refused linger changes nothing"
        );
        a.set_linger(Some(Duration::ZERO)).unwrap();
        assert_eq!(a.linger().unwrap(), Some(Duration::ZERO));
        drop(a);
        let (r, _) = b.read(Vec::with_capacity(16)).await;
        assert_eq!(
            r.map_err(|e| e.kind()),
            Err(io::ErrorKind::ConnectionReset),
            "a linger-0 close reads as a reset"
        );

        let (a, b) = io_common::tcp_pair().await;
        a.set_linger(Some(Duration::ZERO)).unwrap();
        a.set_linger(None).unwrap();
        assert_eq!(a.linger().unwrap(), None);
        drop(a);
        let (r, _) = b.read(Vec::with_capacity(16)).await;
        assert_eq!(r.unwrap(), 0, "the default close is a clean end of stream");
    });
}

/// `AsyncWriteExt::close` is idempotent on TCP, as a second `shutdown(Write)` of std's stream
/// is while the connection lives: a second close, and a close after both sides closed, are
/// `Ok`. The second shut down the socket again, which TCP refuses with `ENOTCONN`
/// (`NotConnected`) once the connection has ended. From the `futures::io` audit.
#[test]
fn a_tcp_close_again_is_ok() {
    on_each_driver("a_tcp_close_again_is_ok", 1, |driver| async move {
        let (mut c, mut s) = tcp_pair().await;
        AsyncWriteExt::write_all(&mut c, b"hello").await.unwrap();
        AsyncWriteExt::close(&mut c).await.unwrap();
        AsyncWriteExt::close(&mut c)
            .await
            .unwrap_or_else(|e| panic!("[{driver}] a second close: {e}"));
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello", "[{driver}]");
        // The server answers after the half-close, and closes: the connection ends.
        AsyncWriteExt::write_all(&mut s, b"world").await.unwrap();
        AsyncWriteExt::close(&mut s).await.unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"world", "[{driver}]");
        sleep(Duration::from_millis(20)).await;
        for (who, st) in [("client", &mut c), ("server", &mut s)] {
            AsyncWriteExt::close(st)
                .await
                .unwrap_or_else(|e| panic!("[{driver}] the {who}'s close once both closed: {e}"));
        }
        // A write after close still fails.
        let w = async {
            AsyncWriteExt::write_all(&mut c, b"x").await?;
            AsyncWriteExt::flush(&mut c).await
        };
        assert!(w.await.is_err(), "[{driver}] a write after close");
    });
}

/// `bind_reuseport` on a port a plain socket holds: `AddrInUse`, and the message says what
/// holds it and what to do (the kernel's "Address already in use" alone read as if sharing
/// had failed). A plain `bind` keeps the OS error as it is.
#[test]
fn bind_reuseport_on_a_port_a_plain_socket_holds_says_so() {
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = plain.local_addr().unwrap();
    let e = TcpListener::bind_reuseport(addr).expect_err("the port is held");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    let msg = e.to_string();
    assert!(
        msg.contains(&addr.to_string()) && msg.contains("SO_REUSEPORT"),
        "message: {msg}"
    );
    let e = TcpListener::bind(addr).expect_err("the port is held");
    assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE), "{e}");
    // Two `bind_reuseport`s still share a port.
    let a = TcpListener::bind_reuseport("127.0.0.1:0").unwrap();
    let b = TcpListener::bind_reuseport(a.local_addr().unwrap());
    assert!(b.is_ok(), "{:?}", b.err());
}

/// `bind_reuseport_many`: every shard's listener is bound before `run()`, on one port (port 0
/// resolved by the first), so clients that connect before any loop runs are all served once
/// the shards accept; a `count` of 0 and a port a plain socket holds are errors.
#[test]
fn listeners_bound_before_run_serve_clients_that_came_early() {
    const CLIENTS: usize = 12;
    each_driver(
        "listeners_bound_before_run",
        3,
        |b| b.service_mode(true),
        |driver, ex| {
            let listeners = TcpListener::bind_reuseport_many("127.0.0.1:0", 3).unwrap();
            let addr = listeners[0].local_addr().unwrap();
            assert!(listeners.iter().all(|l| l.local_addr().unwrap() == addr));
            // Connected and written before any loop runs: they wait in the backlogs.
            let mut early: Vec<std::net::TcpStream> = (0..CLIENTS)
                .map(|i| {
                    let mut c = std::net::TcpStream::connect(addr).unwrap();
                    c.write_all(&[i as u8]).unwrap();
                    c
                })
                .collect();
            for (shard, l) in listeners.into_iter().enumerate() {
                ex.spawn_on(shard, move || async move {
                    let l = TcpListener::from_std(l).unwrap();
                    loop {
                        let (s, _) = l.accept().await.unwrap();
                        xtc_shards::spawn_local(async move {
                            let (r, buf) = s.read(vec![0u8; 1]).await;
                            assert_eq!(r.unwrap(), 1);
                            let (w, _) = s.write_all(vec![buf[0], shard as u8]).await;
                            w.unwrap();
                        });
                    }
                })
                .unwrap();
            }
            let h = ex.handle();
            let reader = thread::spawn(move || {
                let replies: Vec<[u8; 2]> = early
                    .iter_mut()
                    .map(|c| {
                        c.set_read_timeout(Some(HANG)).unwrap();
                        let mut got = [0u8; 2];
                        c.read_exact(&mut got).unwrap();
                        got
                    })
                    .collect();
                h.stop();
                replies
            });
            ex.run().unwrap();
            let replies = reader.join().unwrap();
            for (i, r) in replies.iter().enumerate() {
                assert_eq!(
                    r[0] as usize, i,
                    "[{driver}] client {i} got another's reply"
                );
                assert!(
                    (r[1] as usize) < 3,
                    "[{driver}] a reply from shard {}",
                    r[1]
                );
            }
        },
    );
    // A count no executor has: refused before any allocation (`1 << 40` aborted the process
    // on a failed allocation, `usize::MAX` panicked on the capacity).
    for count in [0, (64 * 8192) + 1, 1 << 40, usize::MAX] {
        let e = TcpListener::bind_reuseport_many("127.0.0.1:0", count).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{count}: {e}");
    }
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let e = TcpListener::bind_reuseport_many(plain.local_addr().unwrap(), 2).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
}
