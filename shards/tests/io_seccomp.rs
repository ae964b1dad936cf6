//! The epoll driver where a seccomp filter refuses `epoll_pwait2` (syscall 441 on x86_64):
//! with `ENOSYS` (a kernel before 5.11) and with `EPERM` (systemd's `SystemCallFilter=`, older
//! container profiles), it must fall back to `epoll_wait`. The filter applies to the thread
//! that installs it and the threads it starts, so it stays inside each test.

mod common;

use std::{
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

use xtc_shards::{io::DriverChoice, net::UdpSocket, Executor};

/// Makes `epoll_pwait2` fail with `errno` on this thread and the threads it starts; `false`
/// if this machine does not let the process install a filter (the test then skips).
#[cfg(target_arch = "x86_64")]
fn deny_epoll_pwait2(errno: u32) -> bool {
    common::deny_syscall(libc::SYS_epoll_pwait2, errno)
}

/// A UDP receive that waits for its datagram, on a forced-epoll executor started from a
/// thread whose `epoll_pwait2` fails with `errno`.
#[cfg(target_arch = "x86_64")]
fn udp_wait_with_pwait2_failing(errno: i32) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        if !deny_epoll_pwait2(errno as u32) {
            let _ = tx.send(None);
            return;
        }
        let exec = Executor::builder()
            .shards(1)
            .io_driver(DriverChoice::Epoll)
            .build()
            .unwrap();
        let got = Arc::new(Mutex::new(None));
        let g = got.clone();
        exec.spawn_on(0, move || async move {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let addr = sock.local_addr().unwrap();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                s.send_to(b"hello", addr).unwrap();
            });
            let (r, buf) = sock.recv_from(Vec::with_capacity(64)).await;
            r.unwrap();
            *g.lock().unwrap() = Some(buf);
        })
        .unwrap();
        let r = exec.run();
        let got = got.lock().unwrap().take();
        let _ = tx.send(Some((r.is_ok(), got)));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(None) => println!("errno {errno}: no seccomp here; skipped"),
        Ok(Some((ok, got))) => {
            assert!(ok, "errno {errno}: run() failed");
            assert_eq!(got.as_deref(), Some(&b"hello"[..]), "errno {errno}");
        }
        Err(_) => panic!("errno {errno}: the loop never saw the datagram within 20 s"),
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn epoll_falls_back_when_pwait2_is_refused_with_enosys() {
    udp_wait_with_pwait2_failing(libc::ENOSYS);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn epoll_falls_back_when_pwait2_is_refused_with_eperm() {
    udp_wait_with_pwait2_failing(libc::EPERM);
}

/// A stream dropped while `io_uring_enter` fails to submit (here a seccomp filter; in the
/// field `EAGAIN`/`EBUSY` under memory pressure) leaves its receive, and that receive's
/// cancel, queued, naming the descriptor by number. The descriptor used to close anyway: the
/// next socket took its number, and the next enter (the loop's park) started the receive
/// there, which took that socket's bytes and threw them away. The number must stay taken
/// until the entries naming it are submitted.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_stream_dropped_while_submits_fail_does_not_lend_its_number_to_queued_entries() {
    use std::{future::Future, io::Write, os::fd::AsRawFd, task::Poll};
    use xtc_shards::net::UnixStream;
    let got = with_failing_submits(|| async {
        let (a, _a_peer) = UnixStream::pair().unwrap();
        let old = a.as_raw_fd();
        let mut read = Box::pin(a.read(Vec::with_capacity(64)));
        let pending =
            std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx).is_pending())).await;
        assert!(pending, "nothing was sent");
        drop(read); // kept by the stream, its receive queued
        drop(a); // the cancel queued too: neither submitted
        let (b, mut b_peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let reused = b.as_raw_fd() == old;
        b_peer.write_all(b"hello").unwrap();
        let b = UnixStream::from_std(b).unwrap();
        // The loop parks: what is queued is submitted.
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        // Under the 60 s bound on the whole child, so a hang is reported as this read's.
        let got =
            xtc_shards::time::timeout(Duration::from_secs(30), b.read(Vec::with_capacity(64)))
                .await;
        (reused, got.map(|(r, buf)| (r.ok(), buf)).ok())
    });
    if let Some((reused, got)) = got {
        assert_eq!(
            got,
            Some((Some(5), b"hello".to_vec())),
            "the new socket's bytes went to a stale receive (its number reused: {reused})"
        );
    }
}

/// Accepts started while `io_uring_enter` fails to submit (here a seccomp filter; in the field
/// `EAGAIN` under memory pressure, `EBUSY` with completions backed up) back off and go on, as
/// at the descriptor limit: more accepts than the submission queue holds (256) fill it in
/// one go, and the next one's submit, which must enter first, fails. That accept returned the
/// enter's `EAGAIN` (`WouldBlock`, from an `.await`), and a server's accept loop (a
/// `ConnBalancer::serve`) ended on it.
#[cfg(target_arch = "x86_64")]
#[test]
fn accepts_whose_submits_fail_back_off_and_go_on() {
    use std::{cell::RefCell, rc::Rc};
    use xtc_shards::net::TcpListener;
    const ACCEPTS: usize = 300;
    let got = with_failing_submits(|| async {
        let l = Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = l.local_addr().unwrap();
        let results = Rc::new(RefCell::new(Vec::new()));
        for _ in 0..ACCEPTS {
            let (l, results) = (l.clone(), results.clone());
            drop(xtc_shards::spawn_local(async move {
                let r = l.accept().await.map(|_| ());
                results.borrow_mut().push(r.map_err(|e| e.to_string()));
            }));
        }
        // Every accept has been polled (its submit made or failed) before a client comes.
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        let clients = std::thread::spawn(move || {
            (0..ACCEPTS)
                .map(|_| std::net::TcpStream::connect(addr).unwrap())
                .collect::<Vec<_>>()
        });
        let tally = tally(&results, ACCEPTS).await;
        let _clients = clients.join().unwrap();
        tally
    });
    if let Some((done, n, failed, first)) = got {
        assert_eq!(
            failed, 0,
            "{failed} of {n} accepts failed instead of backing off (first: {first:?})"
        );
        assert!(done, "only {n} of {ACCEPTS} accepts got their connection");
    }
}

/// Connects started while `io_uring_enter` fails to submit (see
/// `accepts_whose_submits_fail_back_off_and_go_on`) wait and go on, as on epoll, where a TCP
/// connect never answers `EAGAIN`: more connects than the submission queue holds fill it in
/// one go, and the next one's submit, which must enter first, fails. That connect failed with
/// the enter's `EAGAIN` (`WouldBlock` out of an `.await`, for a peer that was listening).
#[cfg(target_arch = "x86_64")]
#[test]
fn connects_whose_submits_fail_wait_and_go_on() {
    use std::{cell::RefCell, rc::Rc};
    use xtc_shards::net::TcpStream;
    const CONNECTS: usize = 300;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts every connection, and keeps it until the test ends.
    let acceptor = std::thread::spawn(move || {
        (0..CONNECTS)
            .map(|_| listener.accept().unwrap().0)
            .collect::<Vec<_>>()
    });
    let got = std::panic::catch_unwind(|| {
        with_failing_submits(move || async move {
            let results = Rc::new(RefCell::new(Vec::new()));
            for _ in 0..CONNECTS {
                let results = results.clone();
                drop(xtc_shards::spawn_local(async move {
                    let r = TcpStream::connect(addr).await.map(drop);
                    results.borrow_mut().push(r.map_err(|e| e.to_string()));
                }));
            }
            tally(&results, CONNECTS).await
        })
    });
    // Unblocks the acceptor if connects failed.
    for _ in 0..CONNECTS {
        let _ = std::net::TcpStream::connect(addr);
    }
    drop(acceptor.join());
    if let Some((done, n, failed, first)) = got.unwrap_or_else(|p| std::panic::resume_unwind(p)) {
        assert_eq!(
            failed, 0,
            "{failed} of {n} connects failed instead of waiting (first: {first:?})"
        );
        assert!(done, "only {n} of {CONNECTS} connects finished");
    }
}

/// Waits (up to 20 s) until `results` holds `want` results; then whether all came, how many
/// did, how many are errors, and the first error.
async fn tally<T>(
    results: &std::cell::RefCell<Vec<Result<T, String>>>,
    want: usize,
) -> (bool, usize, usize, Option<String>) {
    let done = xtc_shards::time::timeout(Duration::from_secs(20), async {
        while results.borrow().len() < want {
            xtc_shards::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    let results = results.borrow();
    let mut failed = results.iter().filter_map(|r| r.as_ref().err());
    let first = failed.next().cloned();
    let n = failed.count() + usize::from(first.is_some());
    (done.is_ok(), results.len(), n, first)
}

/// Runs `body` in `block_on` on a one-shard io_uring executor started from a thread whose
/// submit-only `io_uring_enter` calls fail with `EAGAIN` (see
/// `a_stream_dropped_while_submits_fail_does_not_lend_its_number_to_queued_entries`); `None`
/// if this machine has no seccomp or no io_uring (the test then skips).
#[cfg(target_arch = "x86_64")]
fn with_failing_submits<R: Send + 'static, F: std::future::Future<Output = R> + 'static>(
    body: impl FnOnce() -> F + Send + 'static,
) -> Option<R> {
    with_denied_enters(common::deny_uring_submit_without_wait, move |exec| {
        exec.block_on(body).expect("the test task failed")
    })
}

/// Runs `f` with a one-shard io_uring executor, on a thread where `deny(EAGAIN)` installed a
/// seccomp filter on `io_uring_enter`; `None` if it could not (no seccomp) or the executor has
/// no io_uring (the test then skips). Panics if `f` does not return within 60 s.
#[cfg(target_arch = "x86_64")]
fn with_denied_enters<R: Send + 'static>(
    deny: fn(u32) -> bool,
    f: impl FnOnce(&Executor) -> R + Send + 'static,
) -> Option<R> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        if !deny(libc::EAGAIN as u32) {
            let _ = tx.send(None);
            return;
        }
        let exec = match Executor::builder()
            .shards(1)
            .io_driver(DriverChoice::IoUring)
            .build()
        {
            Ok(exec) => exec,
            Err(e) => {
                println!("no io_uring here ({e}); skipped");
                let _ = tx.send(None);
                return;
            }
        };
        let _ = tx.send(Some(f(&exec)));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(None) => {
            println!("no seccomp or no io_uring here; skipped");
            None
        }
        Ok(Some(r)) => Some(r),
        Err(_) => panic!("the test hung, or its thread panicked"),
    }
}

/// Stream reads, stream writes and datagram sends started while `io_uring_enter` fails to
/// submit: more than the submission queue holds (256) in one turn, so the next one's submit,
/// which must enter first, fails. Each returned that `EAGAIN` (`WouldBlock` out of an
/// `.await`, which on epoll never happens); accept and connect alone backed off. The driver
/// now keeps what does not fit for its next successful enter.
#[cfg(target_arch = "x86_64")]
#[test]
fn reads_writes_and_sends_whose_submits_fail_wait_and_go_on() {
    use std::{cell::RefCell, rc::Rc};
    use xtc_shards::net::UnixStream;
    const N: usize = 300;
    let got = with_failing_submits(|| async {
        let results: Rc<RefCell<Vec<Result<usize, String>>>> = Rc::default();
        let mut peers = Vec::new();
        for _ in 0..N {
            let (a, b) = UnixStream::pair().unwrap();
            let results = results.clone();
            drop(xtc_shards::spawn_local(async move {
                let (r, _) = a.read(Vec::with_capacity(8)).await;
                results.borrow_mut().push(r.map_err(|e| e.to_string()));
            }));
            peers.push(b);
        }
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        // Writes from the peers, all in one turn: each read gets its byte.
        for b in peers.drain(..) {
            let results = results.clone();
            drop(xtc_shards::spawn_local(async move {
                let (r, _) = b.write(b"x".to_vec()).await;
                results.borrow_mut().push(r.map_err(|e| e.to_string()));
            }));
        }
        // Datagrams, all in one turn.
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let tx = Rc::new(xtc_shards::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        for _ in 0..N {
            let (tx, results) = (tx.clone(), results.clone());
            drop(xtc_shards::spawn_local(async move {
                let (r, _) = tx.send_to(b"d".to_vec(), to).await;
                results.borrow_mut().push(r.map_err(|e| e.to_string()));
            }));
        }
        tally(&results, 3 * N).await
    });
    if let Some((done, n, failed, first)) = got {
        assert_eq!(
            failed, 0,
            "{failed} of {n} operations failed instead of waiting (first: {first:?})"
        );
        assert!(done, "only {n} of {} operations finished", 3 * N);
    }
}

/// Reads dropped in one turn while `io_uring_enter` fails to submit: each drop queues an
/// `AsyncCancel`, more than the submission queue holds. The push of the 257th failed and was
/// only logged: that receive stayed armed in the kernel for good, holding its socket open
/// after the stream's drop (its peer never saw the end of the stream) and counting as I/O in
/// flight. Every peer must see the end of its stream.
#[cfg(target_arch = "x86_64")]
#[test]
fn cancels_queued_while_submits_fail_are_not_lost() {
    use std::{future::Future, io::Read, os::unix::net::UnixStream as StdStream, task::Poll};
    use xtc_shards::net::UnixStream;
    const N: usize = 400;
    let got = with_failing_submits(|| async {
        let mut peers: Vec<StdStream> = Vec::new();
        let mut streams = Vec::new();
        for _ in 0..N {
            let (a, b) = StdStream::pair().unwrap();
            streams.push(UnixStream::from_std(a).unwrap());
            peers.push(b);
        }
        // Every read waits in the kernel (started in two batches, each submitted by a park),
        // then all are dropped in one turn.
        let mut batches = Vec::new();
        for half in streams.chunks(N / 2) {
            let mut reads = Box::pin(futures::future::join_all(
                half.iter().map(|s| s.read(Vec::with_capacity(8))),
            ));
            let pending =
                std::future::poll_fn(|cx| Poll::Ready(reads.as_mut().poll(cx).is_pending())).await;
            assert!(pending, "nothing was sent");
            xtc_shards::time::sleep(Duration::from_millis(20)).await;
            batches.push(reads);
        }
        drop(batches);
        drop(streams);
        // The loop parks meanwhile (what is queued is submitted): each peer sees the end.
        let checker = std::thread::spawn(move || {
            // Under the 60 s bound on the whole child, so a hang is reported as this check's.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            peers
                .into_iter()
                .map(|mut p| {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    p.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                        .unwrap();
                    let mut b = [0u8; 8];
                    matches!(p.read(&mut b), Ok(0))
                })
                .filter(|&eof| !eof)
                .count()
        });
        while !checker.is_finished() {
            xtc_shards::time::sleep(Duration::from_millis(5)).await;
        }
        checker.join().unwrap()
    });
    if let Some(open) = got {
        assert_eq!(
            open, 0,
            "{open} of {N} sockets stayed open after their drop"
        );
    }
}

/// A stream converted with `into_std` while `io_uring_enter` fails to submit, with the `SEND`
/// of a dropped write still queued (naming the descriptor by number) behind its cancel: the
/// descriptor went to its new owner all the same (`Source::into_fd` ignored the failed
/// submit), which closed it; the next socket took the number, and the loop's next enter
/// sent the dropped write's bytes to that socket's peer.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_stream_given_up_while_submits_fail_does_not_lend_its_number_to_queued_entries() {
    use std::{future::Future, io::Read, os::fd::AsRawFd, task::Poll};
    use xtc_shards::net::UnixStream;
    let got = with_failing_submits(|| async {
        let (a, mut a_peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = UnixStream::from_std(a).unwrap();
        let old = a.as_raw_fd();
        let mut write = Box::pin(a.write(b"secret".to_vec()));
        let pending =
            std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx).is_pending())).await;
        assert!(pending, "the write was submitted at once");
        drop(write); // its SEND and the SEND's cancel queued: neither submitted
        let a = a.into_std().map_err(|_| "into_std refused").unwrap();
        drop(a); // the new owner closes it
        let (b, mut b_peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let reused = b.as_raw_fd() == old;
        // The loop parks: what is queued is submitted.
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        b_peer.set_nonblocking(true).unwrap();
        a_peer.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 16];
        let stray = b_peer.read(&mut buf).ok();
        let to_a = a_peer.read(&mut buf).ok();
        drop(b);
        (reused, stray, to_a)
    });
    if let Some((reused, stray, to_a)) = got {
        assert_eq!(
            stray, None,
            "the dropped write's bytes went to the socket that took its number \
             (reused: {reused}; its own peer read {to_a:?})"
        );
    }
}

/// Submits refused for now (`EAGAIN`, `EBUSY`) while entries wait in the driver: nothing
/// failed (the driver keeps them for its next enter, rule 1's overflow), yet each loop turn's
/// submit, each dropped operation's cancel and each park logged a warning ("io_uring submit
/// failed"), a flood of one line per turn for as long as the kernel refuses, about an
/// ordinary condition the driver handles. Only a submit that really failed warns.
#[cfg(target_arch = "x86_64")]
#[test]
fn submits_refused_for_now_log_no_warning() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use xtc_shards::net::UnixStream;
    const N: usize = 300;
    let got = with_failing_submits(|| async {
        let warnings = Arc::new(AtomicUsize::new(0));
        let _counting = tracing::subscriber::set_default(common::count_events(
            tracing::Level::WARN,
            warnings.clone(),
        ));
        let mut pairs = Vec::new();
        let mut reads = Vec::new();
        for _ in 0..N {
            let (a, b) = UnixStream::pair().unwrap();
            let a = std::rc::Rc::new(a);
            let reader = a.clone();
            reads.push(xtc_shards::spawn_local(async move {
                reader.read(Vec::with_capacity(8)).await.0.is_ok()
            }));
            pairs.push((a, b));
        }
        // Every read queued (more than the submission ring holds), then a few turns.
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        for (_, b) in &pairs {
            b.write(b"x".to_vec()).await.0.unwrap();
        }
        let mut read = 0;
        for r in reads {
            read += usize::from(r.await.unwrap());
        }
        (read, warnings.load(SeqCst))
    });
    if let Some((read, warnings)) = got {
        assert_eq!(read, N, "reads failed");
        assert_eq!(
            warnings, 0,
            "{warnings} warnings logged for submits the kernel refused for now"
        );
    }
}

/// A park whose `io_uring_enter` the kernel refuses (`EAGAIN`: it could not allocate requests
/// for the entries queued; it returns before waiting) did not wait at all: the loop went
/// round again at once, a spin at full CPU for as long as the kernel refused (here, while
/// the wake-ping read cannot be submitted, through a 30 ms sleep). It now waits for
/// completions without submitting, at most `PING_RETRY` (1 ms), then tries again. The count
/// has a wide margin: a spin parks tens of thousands of times in that sleep, a bounded wait
/// about 30 times, whatever the machine's load.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_park_whose_submit_is_refused_still_waits() {
    let parks = with_denied_enters(common::deny_uring_submit, |exec| {
        exec.block_on(|| xtc_shards::time::sleep(Duration::from_millis(5)))
            .unwrap();
        let before = exec.loop_stats(0).unwrap().parks;
        exec.block_on(|| xtc_shards::time::sleep(Duration::from_millis(30)))
            .unwrap();
        exec.loop_stats(0).unwrap().parks - before
    });
    if let Some(parks) = parks {
        assert!(
            parks < 3_000,
            "{parks} parks in a 30 ms sleep: a refused park spins instead of waiting"
        );
    }
}

/// Reads started while the kernel refuses every submission (`EAGAIN`), more than the
/// submission ring holds, then dropped, and the loop's driver dropped: none of them ever
/// reached the kernel (queued in the ring, or in the driver's overflow behind it), nor did
/// their cancels or the wake-ping read. The driver's shutdown took them for operations the
/// kernel held: it waited its full second for them, then leaked every buffer (and logged an
/// error). Entries the kernel never consumed are now settled at once as cancelled, their
/// data freed.
#[cfg(target_arch = "x86_64")]
#[test]
fn operations_never_submitted_are_freed_at_shutdown() {
    use std::{
        future::Future,
        sync::atomic::{AtomicUsize, Ordering::SeqCst},
        task::Poll,
    };
    use xtc_shards::net::UnixStream;
    const N: usize = 300;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        if !common::deny_uring_submit(libc::EAGAIN as u32) {
            let _ = tx.send(None);
            return;
        }
        let drops = Arc::new(AtomicUsize::new(0));
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        let d = drops.clone();
        let kept = ex.block_on(async move {
            if xtc_shards::io::current_driver() != Some(xtc_shards::io::Driver::IoUring) {
                return None;
            }
            let mut pairs = Vec::new();
            for _ in 0..N {
                pairs.push(UnixStream::pair().unwrap());
            }
            let mut reads: Vec<_> = pairs
                .iter()
                .map(|(a, _)| Box::pin(a.read(common::Counted(Vec::with_capacity(8), d.clone()))))
                .collect();
            for r in &mut reads {
                let pending =
                    std::future::poll_fn(|cx| Poll::Ready(r.as_mut().poll(cx).is_pending())).await;
                assert!(pending, "nothing was sent");
            }
            drop(reads);
            Some(pairs)
        });
        let Some(pairs) = kept else {
            let _ = tx.send(None);
            return;
        };
        drop(ex);
        // The streams keep their reads (a read future dropped leaves its receive running):
        // each goes with its stream, its `Op` outliving the driver.
        drop(pairs);
        let _ = tx.send(Some(drops.load(SeqCst)));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(None) => println!("no seccomp or no io_uring here; skipped"),
        Ok(Some(dropped)) => assert_eq!(
            dropped,
            N,
            "{} of {N} buffers of reads the kernel never saw were leaked at shutdown",
            N - dropped
        ),
        Err(_) => panic!("the test hung, or its thread panicked"),
    }
}

/// How many of this process's descriptors are open on `path`; 0 where the file was never made
/// (a skipped run: no io_uring, as under `XTC_IO=epoll`).
#[cfg(target_arch = "x86_64")]
fn open_on(path: &std::path::Path) -> usize {
    let Ok(path) = std::fs::canonicalize(path) else {
        return 0;
    };
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| *l == path)
        .count()
}

/// A `File::close` still awaited when its `block_on` returns, its `CLOSE` entry queued while
/// the kernel refuses every submission (`EAGAIN`), so the driver's shutdown ends it as
/// cancelled: nothing was closed, and awaited later (here off any loop) it must still close
/// the file. It failed with that `ECANCELED`, and the descriptor, taken out of the `File`
/// for the entry, stayed open for good: nobody held it any more.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_close_cut_by_its_drivers_shutdown_still_closes_the_file() {
    use std::{future::Future, pin::Pin, task::Poll};
    type Close = Pin<Box<dyn Future<Output = std::io::Result<()>>>>;
    let path = std::env::temp_dir().join(format!("xtc-seccomp-close-{}", std::process::id()));
    let (tx, rx) = mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        let kept = ex.block_on(async move {
            if xtc_shards::io::current_driver() != Some(xtc_shards::io::Driver::IoUring) {
                return None;
            }
            let f = xtc_shards::fs::File::create(&p).await.unwrap();
            if !common::deny_uring_submit(libc::EAGAIN as u32) {
                return None;
            }
            let mut close: Close = Box::pin(f.close());
            let pending =
                std::future::poll_fn(|cx| Poll::Ready(close.as_mut().poll(cx).is_pending())).await;
            assert!(pending, "a close whose entry cannot be submitted ended");
            Some(close)
        });
        let Some(close) = kept else {
            let _ = tx.send(None);
            return;
        };
        drop(ex);
        let _ = tx.send(Some(futures::executor::block_on(close)));
    });
    let r = rx.recv_timeout(Duration::from_secs(60));
    let left = open_on(&path);
    let _ = std::fs::remove_file(&path);
    match r {
        Ok(None) => println!("no seccomp or no io_uring here; skipped"),
        Ok(Some(r)) => {
            r.expect("a close awaited after its driver's shutdown");
            assert_eq!(left, 0, "the file is still open");
        }
        Err(_) => panic!("the test hung, or its thread panicked"),
    }
}

/// A `File::close` future dropped unfinished, its `CLOSE` entry queued while the kernel
/// refuses every submission (`EAGAIN`): the dropped close lets its `CLOSE` run on
/// (`Op::detach`), but the driver's shutdown ends that entry as cancelled (rule 5: never
/// consumed), so nothing closed the file. The descriptor, taken out of the `File` for the
/// entry, stayed open for good: the detached operation's data was freed, and nobody held the
/// number any more. The driver now closes it, as the close does when it sees the `ECANCELED`.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_dropped_close_cut_by_its_drivers_shutdown_still_closes_the_file() {
    use std::{future::Future, task::Poll};
    let path =
        std::env::temp_dir().join(format!("xtc-seccomp-dropped-close-{}", std::process::id()));
    let (tx, rx) = mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        let ran = ex.block_on(async move {
            if xtc_shards::io::current_driver() != Some(xtc_shards::io::Driver::IoUring) {
                return false;
            }
            let f = xtc_shards::fs::File::create(&p).await.unwrap();
            if !common::deny_uring_submit(libc::EAGAIN as u32) {
                return false;
            }
            let mut close = Box::pin(f.close());
            let pending =
                std::future::poll_fn(|cx| Poll::Ready(close.as_mut().poll(cx).is_pending())).await;
            assert!(pending, "a close whose entry cannot be submitted ended");
            // Dropped: its `CLOSE` is left to run.
            drop(close);
            true
        });
        drop(ex);
        let _ = tx.send(ran);
    });
    let r = rx.recv_timeout(Duration::from_secs(60));
    let left = open_on(&path);
    let _ = std::fs::remove_file(&path);
    match r {
        Ok(false) => println!("no seccomp or no io_uring here; skipped"),
        Ok(true) => assert_eq!(left, 0, "the file is still open"),
        Err(_) => panic!("the test hung, or its thread panicked"),
    }
}

/// Bytes `AsyncWrite` reported written whose send its driver's shutdown cut (its entry queued
/// while the kernel refused every submission, here with `EPERM`), flushed on the next
/// `block_on` while the send cannot be submitted again (the submission ring is full and the
/// kernel still refuses): the flush fails, and the bytes must stay, for a later flush. They
/// were dropped with the failed submission: the next flush reported success, and the peer
/// never got them.
#[cfg(target_arch = "x86_64")]
#[test]
fn bytes_a_failed_resubmission_could_not_send_are_kept() {
    use futures::io::AsyncWriteExt;
    use std::{future::Future, task::Poll};
    use xtc_shards::net::{TcpStream, UnixStream};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut got);
        got
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let std_s = std::net::TcpStream::connect(addr).unwrap();
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        let kept = ex.block_on(async move {
            if xtc_shards::io::current_driver() != Some(xtc_shards::io::Driver::IoUring) {
                return None;
            }
            let mut s = TcpStream::from_std(std_s).unwrap();
            if !common::deny_uring_submit(libc::EPERM as u32) {
                return None;
            }
            // Reported written; its send queued, never submitted.
            assert_eq!(AsyncWriteExt::write(&mut s, b"hello").await.unwrap(), 5);
            Some(s)
        });
        let Some(s) = kept else {
            let _ = tx.send(None);
            return;
        };
        let (first, second, s) = ex.block_on(async move {
            let mut s = s;
            // Fill the submission ring: entries queue until it is full, and a push into a
            // full ring whose submit fails (`EPERM`) fails.
            let mut pairs = Vec::new();
            for _ in 0..300 {
                pairs.push(UnixStream::pair().unwrap());
            }
            let mut reads: Vec<_> = pairs
                .iter()
                .map(|(a, _)| Box::pin(a.read(Vec::with_capacity(8))))
                .collect();
            for r in &mut reads {
                let _ =
                    std::future::poll_fn(|cx| Poll::Ready(r.as_mut().poll(cx).is_pending())).await;
            }
            let first = std::future::poll_fn(|cx| {
                Poll::Ready(futures::io::AsyncWrite::poll_flush(
                    std::pin::Pin::new(&mut s),
                    cx,
                ))
            })
            .await;
            let second = std::future::poll_fn(|cx| {
                Poll::Ready(futures::io::AsyncWrite::poll_flush(
                    std::pin::Pin::new(&mut s),
                    cx,
                ))
            })
            .await;
            drop(reads);
            (first, second, s)
        });
        drop(s);
        let _ = tx.send(Some((first, second)));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(None) => {
            println!("no seccomp or no io_uring here; skipped");
            drop(peer);
        }
        Ok(Some((first, second))) => {
            let got = peer.join().unwrap();
            assert!(
                !matches!(first, Poll::Ready(Ok(()))),
                "a flush whose send could not be submitted succeeded"
            );
            assert!(
                got == b"hello" || !matches!(second, Poll::Ready(Ok(()))),
                "a later flush succeeded (after {first:?}), yet the peer never got the bytes \
                 reported written (it got {got:?})"
            );
        }
        Err(_) => panic!("the test hung, or its thread panicked"),
    }
}
