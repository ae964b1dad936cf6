//! I/O started while `context::off_loop` hides this thread's loop: inside the drop of a task
//! swept from an executor dropped in a task of another one (`Executor`'s drop frees the tasks
//! queued and never run, "as if this thread ran no loop"). Such I/O used to be submitted to
//! the hidden loop's driver, which does not turn until the section ends, so a drop that waited
//! for it waited for good; now it fails at once with the off-loop error, as on a thread
//! without a loop, and a loop run inside the section (`LocalExecutor::block_on`) does its own
//! I/O. Every test runs once per driver (see `io_common::cases`).

mod io_common;
use io_common::*;

use std::{
    future::Future,
    io::{self, Write as _},
    net::SocketAddr,
    pin::pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use xtc_shards::{net::TcpStream, Executor, LocalExecutor};

/// Builds an executor, queues on it a task that owns `guard`, and drops the executor here: its
/// drop frees the never-run task with this thread's loop hidden (`context::off_loop`), so
/// `guard`'s `Drop` runs off the loop.
fn drop_off_the_loop<G: Send + 'static>(guard: G) {
    let b = Executor::builder().shards(1).build().unwrap();
    b.spawn_on(0, move || {
        let _g = guard;
        async {}
    })
    .unwrap();
    drop(b);
}

/// A hang guard for a wait inside a task that `run_or_fail` runs (itself bounded by [`HANG`]):
/// shorter than that, so a wait that hangs fails with the test's own message, not as a run
/// that hung.
const INNER_HANG: Duration = Duration::from_secs(30);

/// What a drop's I/O came to.
type Outcome = Arc<Mutex<Option<Result<(), String>>>>;

/// Polls `fut` on this thread (busy, 1 ms apart) until it resolves or `limit` passes (`None`).
fn poll_until<F: Future>(limit: Duration, fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    let deadline = Instant::now() + limit;
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Connects to `addr` when dropped and reads from the connection (whose peer writes after
/// 100 ms), waiting for the result there (at most [`HANG`], a hang guard), directly or on a
/// `LocalExecutor` of its own (`nested`).
struct ReadOnDrop {
    addr: SocketAddr,
    nested: bool,
    out: Outcome,
}

/// Reads the first bytes of a new connection to `addr`, on the current loop's driver.
async fn read_from(addr: SocketAddr) -> io::Result<Vec<u8>> {
    let s = TcpStream::from_std(std::net::TcpStream::connect(addr)?)?;
    let (r, buf) = s.read(Vec::with_capacity(8)).await;
    r.map(|_| buf)
}

impl Drop for ReadOnDrop {
    fn drop(&mut self) {
        let addr = self.addr;
        let r = if self.nested {
            LocalExecutor::new().unwrap().block_on(async move {
                xtc_shards::time::timeout(HANG, read_from(addr)).await.ok()
            })
        } else {
            poll_until(HANG, read_from(addr))
        };
        *self.out.lock().unwrap() = Some(match r {
            None => Err("hung: the read never resolved".into()),
            Some(Ok(b)) if b == b"hi" => Ok(()),
            Some(Ok(b)) => Err(format!("read {b:?}")),
            Some(Err(e)) => Err(e.to_string()),
        });
    }
}

/// Drops, inside a task of the current loop, an executor holding a queued task that owns a
/// `ReadOnDrop`; returns what its read came to.
fn read_in_a_swept_drop(nested: bool) -> Result<(), String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    // The peer: writes after 100 ms, and keeps the connection until the reader is done.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let _ = s.write_all(b"hi");
        let _ = done_rx.recv_timeout(Duration::from_secs(10));
    });
    let out = Outcome::default();
    let guard = ReadOnDrop {
        addr,
        nested,
        out: out.clone(),
    };
    drop_off_the_loop(guard);
    let _ = done_tx.send(());
    peer.join().unwrap();
    let r = out.lock().unwrap().take();
    r.expect("the queued task was dropped")
}

/// New I/O with this thread's loop hidden fails at once, as off any loop, instead of waiting
/// on the hidden loop's driver, which does not turn meanwhile.
#[test]
fn io_started_while_the_loop_is_hidden_fails_at_once() {
    on_each_driver(
        "io_started_while_the_loop_is_hidden",
        1,
        |driver| async move {
            // A read that waited on the hidden driver would never resolve: the hang guard
            // turns that into "hung", which fails the match, so no clock is needed here.
            match read_in_a_swept_drop(false) {
                Err(e) if e.contains("off any xtc loop") => {}
                other => panic!("[{driver}] a read off the loop: {other:?}"),
            }
        },
    );
}

/// A loop run inside the section does its own I/O, on its own driver.
#[test]
fn io_on_a_loop_run_while_another_is_hidden_completes() {
    on_each_driver(
        "io_on_a_loop_run_while_another_is_hidden",
        1,
        |driver| async move {
            if let Err(e) = read_in_a_swept_drop(true) {
                panic!("[{driver}] a read on the inner loop: {e}");
            }
        },
    );
}

thread_local! {
    /// A stream the running task leaves for a swept drop of this thread to read.
    static LEFT: std::cell::RefCell<Option<TcpStream>> = const { std::cell::RefCell::new(None) };
}

/// Reads, once and without waiting, from the stream in `LEFT` when dropped.
struct ReadBufferedOnDrop {
    out: Arc<Mutex<Option<io::Result<Vec<u8>>>>>,
}

impl Drop for ReadBufferedOnDrop {
    fn drop(&mut self) {
        let Some(mut s) = LEFT.with(|l| l.borrow_mut().take()) else {
            return;
        };
        let mut buf = [0u8; 8];
        let mut cx = Context::from_waker(Waker::noop());
        let r = match futures::io::AsyncRead::poll_read(
            std::pin::Pin::new(&mut s),
            &mut cx,
            &mut buf,
        ) {
            Poll::Ready(r) => r.map(|n| buf[..n].to_vec()),
            Poll::Pending => Err(io::Error::other("pending")),
        };
        *self.out.lock().unwrap() = Some(r);
    }
}

/// Bytes an `AsyncRead` already took from the kernel (io_uring: in the stream's own buffer)
/// are handed out under `off_loop` too: that is no new I/O, and the old code returned them.
#[test]
fn bytes_already_received_are_read_while_the_loop_is_hidden() {
    on_each_driver("bytes_already_received_off_loop", 1, |driver| async move {
        use futures::io::AsyncReadExt;
        use xtc_shards::io::Driver;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"hello").unwrap();
            std::thread::sleep(Duration::from_millis(500));
        });
        let mut s = TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap();
        // io_uring: an 8-byte read, left pending (its receive in the stream's own buffer)...
        // (Not on epoll, which reads at once: had "hello" arrived, this read would take it.)
        if driver == Driver::IoUring {
            let mut eight = [0u8; 8];
            let first = std::future::poll_fn(|cx| {
                Poll::Ready(futures::io::AsyncRead::poll_read(
                    std::pin::Pin::new(&mut s),
                    cx,
                    &mut eight,
                ))
            })
            .await;
            assert!(first.is_pending(), "submitted at the end of the turn");
        }
        xtc_shards::time::sleep(Duration::from_millis(100)).await;
        // ... then a 2-byte one takes the first two of the five it received.
        let mut two = [0u8; 2];
        s.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"he");
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        let out = Arc::new(Mutex::new(None));
        let guard = ReadBufferedOnDrop { out: out.clone() };
        drop_off_the_loop(guard);
        let r = out.lock().unwrap().take().expect("the guard ran");
        LEFT.with(|l| l.borrow_mut().take());
        peer.join().unwrap();
        if driver == Driver::IoUring {
            // "llo" is in the stream's buffer already (the first read asked for 8 bytes).
            assert_eq!(r.ok().as_deref(), Some(&b"llo"[..]), "[{driver}]");
        }
    });
}

/// Bytes a kept receive brought (an owned `read` dropped while pending, whose receive the
/// stream keeps and which completed since) are received already too: an `AsyncRead` with the
/// loop hidden hands them out, as it does those of its own receive, instead of failing.
#[test]
fn bytes_a_kept_receive_brought_are_read_while_the_loop_is_hidden() {
    on_each_driver("kept_receive_off_loop", 1, |driver| async move {
        use xtc_shards::io::Driver;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            wait.recv().unwrap();
            s.write_all(b"hello").unwrap();
            std::thread::sleep(Duration::from_millis(500));
        });
        let s = TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap();
        let h = xtc_shards::shard::handle().unwrap();
        let reaped = || h.loop_stats(0).unwrap().io_completed;
        let before = reaped();
        {
            // An owned read, polled once and dropped: io_uring keeps its receive.
            let mut read = pin!(s.read(Vec::with_capacity(8)));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(read.as_mut().poll(&mut cx).is_pending());
        }
        go.send(()).unwrap();
        if driver == Driver::IoUring {
            // The kept receive completes with the five bytes, and the loop reaps it: the one
            // operation in flight, so the loop's count of reaped completions moves. Waited
            // for, not slept on: the peer and the kernel may take their time.
            let t = Instant::now();
            while reaped() == before && t.elapsed() < HANG {
                xtc_shards::time::sleep(Duration::from_millis(1)).await;
            }
            assert!(
                reaped() > before,
                "[{driver}] the kept receive never completed"
            );
        }
        // (On epoll nothing is kept, and what the read below finds is not checked.)
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        let out = Arc::new(Mutex::new(None));
        let guard = ReadBufferedOnDrop { out: out.clone() };
        drop_off_the_loop(guard);
        let r = out.lock().unwrap().take().expect("the guard ran");
        LEFT.with(|l| l.borrow_mut().take());
        peer.join().unwrap();
        if driver == Driver::IoUring {
            assert_eq!(r.ok().as_deref(), Some(&b"hello"[..]), "[{driver}]");
        }
    });
}

/// What a swept drop's call on the stream in `LEFT` came to: `None` if it was still pending
/// after 500 ms of polling (it waits for the hidden loop, which does not turn meanwhile).
type Polled = Arc<Mutex<Option<Option<io::Result<()>>>>>;

/// A call on a stream, as a boxed future borrowing it.
type StreamCall =
    fn(&mut TcpStream) -> std::pin::Pin<Box<dyn Future<Output = io::Result<()>> + '_>>;

/// Runs `call` on the stream in `LEFT` in the drop of a task swept from an executor dropped
/// here (`context::off_loop` hides this thread's loop meanwhile); returns what it came to.
fn call_in_a_swept_drop(call: StreamCall) -> Option<io::Result<()>> {
    struct CallOnDrop {
        call: StreamCall,
        out: Polled,
    }
    impl Drop for CallOnDrop {
        fn drop(&mut self) {
            let Some(mut s) = LEFT.with(|l| l.borrow_mut().take()) else {
                return;
            };
            let r = poll_until(Duration::from_millis(500), (self.call)(&mut s));
            LEFT.with(|l| *l.borrow_mut() = Some(s));
            *self.out.lock().unwrap() = Some(r);
        }
    }
    let out = Polled::default();
    let guard = CallOnDrop {
        call,
        out: out.clone(),
    };
    drop_off_the_loop(guard);
    let r = out.lock().unwrap().take();
    r.expect("the guard ran")
}

/// An owned `read` with the loop hidden, on a stream whose kept receive (an owned read
/// dropped while pending) is still in the kernel: it fails at once as off any loop, as any
/// new I/O does then, rather than waiting for that receive on the hidden loop, which does not
/// turn until the section ends (a drop that blocked on it hung for good).
#[test]
fn an_owned_read_behind_a_kept_receive_fails_at_once_while_the_loop_is_hidden() {
    on_each_driver(
        "owned_read_behind_kept_receive_off_loop",
        1,
        |driver| async move {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let (done, wait) = std::sync::mpsc::channel::<()>();
            let peer = std::thread::spawn(move || {
                let (_s, _) = l.accept().unwrap();
                let _ = wait.recv_timeout(Duration::from_secs(10)); // writes nothing
            });
            let s = TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap();
            {
                // An owned read, polled once and dropped: io_uring keeps its receive.
                let mut read = pin!(s.read(Vec::with_capacity(8)));
                let mut cx = Context::from_waker(Waker::noop());
                assert!(read.as_mut().poll(&mut cx).is_pending());
            }
            xtc_shards::time::sleep(Duration::from_millis(20)).await; // submitted
            LEFT.with(|l| *l.borrow_mut() = Some(s));
            let r = call_in_a_swept_drop(|s| {
                Box::pin(async move {
                    let (r, _) = s.read(Vec::with_capacity(8)).await;
                    r.map(drop)
                })
            });
            LEFT.with(|l| l.borrow_mut().take());
            let _ = done.send(());
            peer.join().unwrap();
            match r {
                Some(Err(e)) if e.to_string().contains("off any xtc loop") => {}
                other => panic!("[{driver}] an owned read off the loop: {other:?}"),
            }
        },
    );
}

/// A stream connected to a plain thread's socket that reads nothing, and closes its end once
/// told to (or after 10 s, a hang guard): the stream, the word to close, the thread.
fn a_peer_that_waits() -> (
    TcpStream,
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (close, closing) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let _ = closing.recv_timeout(Duration::from_secs(10));
        drop(s);
    });
    let s = TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap();
    (s, close, peer)
}

/// An end of stream a kept receive already brought (an owned read dropped while pending on
/// io_uring, whose receive completed with 0 when the peer closed) is handed out with the loop
/// hidden as bytes are: `read` returns `Ok(0)`. It was taken as "nothing received", and the
/// fresh receive that followed failed as off any loop. On epoll nothing was received (a
/// dropped read takes nothing), so the read fails as off any loop there.
#[test]
fn an_end_of_stream_a_kept_receive_brought_is_read_while_the_loop_is_hidden() {
    on_each_driver("eof_behind_kept_receive_off_loop", 1, |driver| async move {
        use xtc_shards::io::Driver;
        let (s, close, peer) = a_peer_that_waits();
        {
            // An owned read, polled once and dropped: io_uring keeps its receive.
            let mut read = pin!(s.read(Vec::with_capacity(8)));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(read.as_mut().poll(&mut cx).is_pending());
        }
        xtc_shards::time::sleep(Duration::from_millis(20)).await; // submitted
        let _ = close.send(()); // the end of stream
        peer.join().unwrap();
        xtc_shards::time::sleep(Duration::from_millis(50)).await; // completed with 0, reaped
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        let r = call_in_a_swept_drop(|s| {
            Box::pin(async move {
                let (r, _) = s.read(Vec::with_capacity(8)).await;
                r.map(|n| assert_eq!(n, 0, "bytes after the end"))
            })
        });
        LEFT.with(|l| l.borrow_mut().take());
        match (driver, r) {
            (Driver::IoUring, Some(Ok(()))) => {}
            (Driver::Epoll, Some(Err(e))) if e.to_string().contains("off any xtc loop") => {}
            (_, other) => panic!("[{driver}] a read of a received end off the loop: {other:?}"),
        }
    });
}

/// `flush` with the loop hidden, on a stream whose write-behind send (io_uring) waits for
/// room in a full socket: it fails at once as off any loop, leaving the send to a later
/// flush, rather than waiting for the hidden loop. On epoll there is nothing to flush.
#[test]
fn a_flush_behind_a_send_in_flight_fails_at_once_while_the_loop_is_hidden() {
    on_each_driver("flush_behind_send_off_loop", 1, |driver| async move {
        use futures::io::AsyncWriteExt;
        use xtc_shards::io::Driver;
        let (mut s, done, peer) = a_peer_that_waits();
        // Fill the socket, then one more write: on io_uring reported written at once, its send
        // waiting for room; on epoll it waits itself, and times out unwritten.
        let chunk = vec![0u8; 64 * 1024];
        loop {
            match xtc_shards::time::timeout(
                Duration::from_millis(100),
                AsyncWriteExt::write(&mut s, &chunk),
            )
            .await
            {
                Ok(w) => assert!(w.unwrap() > 0),
                Err(_) => break, // epoll: the socket is full
            }
            // io_uring: the send behind the write stays in flight once the socket is full.
            if driver == Driver::IoUring
                && xtc_shards::time::timeout(
                    Duration::from_millis(50),
                    AsyncWriteExt::flush(&mut s),
                )
                .await
                .is_err()
            {
                break;
            }
        }
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        let r = call_in_a_swept_drop(|s| Box::pin(futures::io::AsyncWriteExt::flush(s)));
        LEFT.with(|l| l.borrow_mut().take());
        let _ = done.send(());
        peer.join().unwrap();
        match r {
            Some(Err(e))
                if driver == Driver::IoUring && e.to_string().contains("off any xtc loop") => {}
            Some(Ok(())) if driver == Driver::Epoll => {}
            other => panic!("[{driver}] a flush off the loop: {other:?}"),
        }
    });
}

/// A stream that waited on this thread's loop, then is read on a loop run inside a section
/// that hides it (a swept drop's `LocalExecutor::block_on`), then waits on the first loop
/// again: that wait works. On epoll the descriptor was still in the first loop's epoll set
/// under its first registration, which the stream had forgotten for the inner loop's, so
/// registering it anew failed with `EEXIST` ("File exists") and the read with it. (The inner
/// `LocalExecutor` follows `XTC_IO`: the epoll case meets the bug with `XTC_IO=epoll`.)
#[test]
fn a_stream_read_on_an_inner_loop_waits_on_its_outer_loop_again() {
    on_each_driver("stream_back_on_outer_loop", 1, |driver| async move {
        use xtc_shards::io::Driver;
        if driver == Driver::IoUring {
            // The kept receive of the first read would be the inner read's to wait for, on
            // the hidden driver, so it fails at once there (see
            // `a_read_on_an_inner_loop_does_not_wait_for_a_receive_of_the_hidden_loop`):
            // epoll only here.
            return;
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (go_a, wait_a) = std::sync::mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            wait_a.recv().unwrap();
            s.write_all(b"a").unwrap();
            wait.recv().unwrap();
            // After the outer read has found nothing and waits.
            std::thread::sleep(Duration::from_millis(200));
            s.write_all(b"b").unwrap();
            std::thread::sleep(Duration::from_millis(500));
        });
        let s = TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap();
        {
            // Waits on this loop (its descriptor joins this loop's epoll set), then dropped.
            let mut read = pin!(s.read(Vec::with_capacity(8)));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(read.as_mut().poll(&mut cx).is_pending());
        }
        go_a.send(()).unwrap();
        xtc_shards::time::sleep(Duration::from_millis(50)).await; // "a" arrives
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        struct ReadOnAnInnerLoop(Arc<Mutex<Option<io::Result<Vec<u8>>>>>);
        impl Drop for ReadOnAnInnerLoop {
            fn drop(&mut self) {
                let s = LEFT.with(|l| l.borrow_mut().take()).expect("left");
                let (r, s) = LocalExecutor::new().unwrap().block_on(async move {
                    let (r, buf) = s.read(Vec::with_capacity(8)).await;
                    (r.map(|n| buf[..n].to_vec()), s)
                });
                LEFT.with(|l| *l.borrow_mut() = Some(s));
                *self.0.lock().unwrap() = Some(r);
            }
        }
        let out = Arc::new(Mutex::new(None));
        let reader = ReadOnAnInnerLoop(out.clone());
        drop_off_the_loop(reader);
        let r = out.lock().unwrap().take().expect("the guard ran");
        assert_eq!(r.unwrap(), b"a", "[{driver}] inner read");
        let s = LEFT.with(|l| l.borrow_mut().take()).expect("put back");
        go.send(()).unwrap();
        let (r, buf) = guard(
            "read on the outer loop again",
            s.read(Vec::with_capacity(8)),
        )
        .await;
        let n = r.unwrap_or_else(|e| panic!("[{driver}] read on the outer loop again: {e}"));
        assert_eq!(&buf[..n], b"b");
        peer.join().unwrap();
    });
}

thread_local! {
    static SHARED: std::cell::RefCell<Option<std::rc::Rc<TcpStream>>> =
        const { std::cell::RefCell::new(None) };
}

/// A task of the outer loop waits to read a stream; a loop run while the outer one is hidden
/// (a swept drop's `LocalExecutor::block_on`) uses the stream; then another wait on the outer
/// loop registers the descriptor there anew (epoll: `EPOLL_CTL_MOD` to a new slot). The first
/// task's wait, left in the old slot, must still be woken by the data that comes next: the
/// old slot no longer gets the descriptor's events, so it waited for good. (The inner
/// `LocalExecutor` follows `XTC_IO`: the epoll case meets it with `XTC_IO=epoll`.)
#[test]
fn a_wait_left_on_the_outer_loop_is_woken_after_the_stream_registers_there_anew() {
    on_each_driver("stale_slot_waiter", 1, |driver| async move {
        use std::rc::Rc;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            wait.recv().unwrap();
            s.write_all(b"late").unwrap();
            // Takes what the inner loop wrote, then holds the connection open.
            std::thread::sleep(Duration::from_millis(3000));
        });
        let s = Rc::new(TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap());
        // The waiting task: its read waits on this loop (epoll: the first slot).
        let done = Rc::new(std::cell::Cell::new(None::<io::Result<usize>>));
        let (s1, d1) = (s.clone(), done.clone());
        xtc_shards::spawn_local(async move {
            let (r, _buf) = s1.read(Vec::with_capacity(8)).await;
            d1.set(Some(r));
        });
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        // A loop run while this one is hidden writes to the stream (epoll: its own slot).
        SHARED.with(|l| *l.borrow_mut() = Some(s.clone()));
        struct WriteOnAnInnerLoop(Arc<Mutex<Option<io::Result<()>>>>);
        impl Drop for WriteOnAnInnerLoop {
            fn drop(&mut self) {
                let s = SHARED.with(|l| l.borrow_mut().take()).expect("left");
                let r = LocalExecutor::new().unwrap().block_on(async move {
                    let (r, _) = s.write_all(b"x".to_vec()).await;
                    r
                });
                *self.0.lock().unwrap() = Some(r);
            }
        }
        let out = Arc::new(Mutex::new(None));
        let writer = WriteOnAnInnerLoop(out.clone());
        drop_off_the_loop(writer);
        out.lock().unwrap().take().expect("the guard ran").unwrap();
        {
            // Another wait on this loop, given up at once (epoll: a new slot, `MOD`).
            let mut read = pin!(s.read(Vec::with_capacity(8)));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(read.as_mut().poll(&mut cx).is_pending());
        }
        go.send(()).unwrap();
        // A hang guard: the loop ends as soon as the read is seen done.
        let deadline = Instant::now() + HANG;
        while done.take().map(|r| done.set(Some(r))).is_none() && Instant::now() < deadline {
            xtc_shards::time::sleep(Duration::from_millis(10)).await;
        }
        match done.take() {
            Some(Ok(4)) => {}
            other => panic!("[{driver}] the first task's read: {other:?} (None: never woken)"),
        }
        peer.join().unwrap();
    });
}

/// Writes a byte to the stream in `SHARED` when dropped, on a `LocalExecutor` of its own.
struct WriteOnAnInnerLoop(Arc<Mutex<Option<io::Result<()>>>>);

impl Drop for WriteOnAnInnerLoop {
    fn drop(&mut self) {
        let s = SHARED.with(|l| l.borrow_mut().take()).expect("left");
        let r = LocalExecutor::new().unwrap().block_on(async move {
            let (r, _) = s.write_all(b"x".to_vec()).await;
            r
        });
        *self.0.lock().unwrap() = Some(r);
    }
}

/// A read waits on this loop, its stream is then used on a loop run while this one is hidden
/// (a swept drop's `LocalExecutor::block_on`), and the read is dropped, then the stream: the
/// loop must not keep the read's wait as I/O in flight. On epoll the read's future removed
/// its waker from the slot its stream named at the drop, the inner loop's, not from the one
/// it waited in: its entry stayed in this loop's slot, counted as a wait for good, so the loop
/// never went idle and `run()` never returned. Both loops run epoll here (a child process
/// with `XTC_IO=epoll`).
#[test]
fn a_read_dropped_after_its_stream_was_used_on_an_inner_loop_leaves_no_wait_behind() {
    const TEST: &str =
        "a_read_dropped_after_its_stream_was_used_on_an_inner_loop_leaves_no_wait_behind";
    if !is_child("stale_wait") {
        run_child(TEST, "stale_wait", &[("XTC_IO", "epoll")]);
        return;
    }
    let exec = Executor::builder().shards(1).build().unwrap();
    assert_eq!(exec.io_driver(), xtc_shards::io::Driver::Epoll);
    exec.spawn_on(0, || async {
        use std::rc::Rc;
        let (std_s, peer) = silent_peer();
        let s = Rc::new(TcpStream::from_std(std_s).unwrap());
        {
            // Waits on this loop.
            let mut read = pin!(s.read(Vec::with_capacity(8)));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(read.as_mut().poll(&mut cx).is_pending());
            // The stream is used on a loop run while this one is hidden.
            SHARED.with(|l| *l.borrow_mut() = Some(s.clone()));
            let out = Arc::new(Mutex::new(None));
            drop_off_the_loop(WriteOnAnInnerLoop(out.clone()));
            out.lock().unwrap().take().expect("the guard ran").unwrap();
            // The read is dropped here.
        }
        drop(s);
        peer.join().unwrap();
    })
    .unwrap();
    run_or_fail(&exec, "a run whose one task ended");
}

thread_local! {
    static KEPT: std::cell::RefCell<Option<TcpStream>> = const { std::cell::RefCell::new(None) };
}

/// Writes a byte to the stream in `KEPT` when dropped, on a `LocalExecutor` of its own, and
/// puts the stream back.
struct WriteKeptOnAnInnerLoop(Arc<Mutex<Option<io::Result<()>>>>);

impl Drop for WriteKeptOnAnInnerLoop {
    fn drop(&mut self) {
        let s = KEPT.with(|l| l.borrow_mut().take()).expect("left");
        let (r, s) = LocalExecutor::new().unwrap().block_on(async move {
            let (r, _) = s.write_all(b"x".to_vec()).await;
            (r, s)
        });
        KEPT.with(|l| *l.borrow_mut() = Some(s));
        *self.0.lock().unwrap() = Some(r);
    }
}

/// A stream's `AsyncRead` waits on this loop (its waker stays registered until the next
/// event or the stream's close), the stream is then used on a loop run while this one is
/// hidden (a swept drop's `LocalExecutor::block_on`), and dropped: its close must take the
/// wait with it. On epoll the stream forgot this loop's slot for the inner loop's, and its
/// close deregistered only that one: the wait stayed in this loop's slot, counted as I/O in
/// flight for good, so the loop never went idle and `run()` never returned. Both loops run
/// epoll here (a child process with `XTC_IO=epoll`).
#[test]
fn a_stream_used_on_an_inner_loop_takes_its_waits_here_with_it_when_closed() {
    const TEST: &str = "a_stream_used_on_an_inner_loop_takes_its_waits_here_with_it_when_closed";
    if !is_child("stale_slot") {
        run_child(TEST, "stale_slot", &[("XTC_IO", "epoll")]);
        return;
    }
    let exec = Executor::builder().shards(1).build().unwrap();
    assert_eq!(exec.io_driver(), xtc_shards::io::Driver::Epoll);
    exec.spawn_on(0, || async {
        let (std_s, peer) = silent_peer();
        let mut s = TcpStream::from_std(std_s).unwrap();
        // Waits on this loop.
        let mut cx = Context::from_waker(Waker::noop());
        let mut b = [0u8; 8];
        let polled = futures::io::AsyncRead::poll_read(std::pin::Pin::new(&mut s), &mut cx, &mut b);
        assert!(polled.is_pending());
        // The stream is used on a loop run while this one is hidden.
        KEPT.with(|l| *l.borrow_mut() = Some(s));
        let out = Arc::new(Mutex::new(None));
        drop_off_the_loop(WriteKeptOnAnInnerLoop(out.clone()));
        out.lock().unwrap().take().expect("the guard ran").unwrap();
        drop(KEPT.with(|l| l.borrow_mut().take()).expect("put back"));
        peer.join().unwrap();
    })
    .unwrap();
    run_or_fail(&exec, "a run whose one task ended");
}

thread_local! {
    static FIXED: std::cell::RefCell<Option<xtc_shards::io::FixedBuf>> =
        const { std::cell::RefCell::new(None) };
}

/// Writes the buffer in `FIXED` to a new file at `path` when dropped, on a `LocalExecutor` of
/// its own; records what the write came to.
struct WriteFixedOnAnInnerLoop(std::path::PathBuf, Arc<Mutex<Option<io::Result<usize>>>>);

impl Drop for WriteFixedOnAnInnerLoop {
    fn drop(&mut self) {
        let buf = FIXED.with(|b| b.borrow_mut().take()).expect("left");
        let path = self.0.clone();
        let r = LocalExecutor::new().unwrap().block_on(async move {
            if xtc_shards::io::current_driver() != Some(xtc_shards::io::Driver::IoUring) {
                return None;
            }
            let f = match xtc_shards::fs::File::create(&path).await {
                Ok(f) => f,
                Err(e) => return Some(Err(e)),
            };
            Some(f.write_at(buf, 0).await.0)
        });
        *self.1.lock().unwrap() = r;
    }
}

/// A buffer of a `FixedBufPool` registered with this loop's io_uring, written on a loop run
/// while this one is hidden (a swept drop's `LocalExecutor::block_on`): the inner loop's ring
/// has no such registration, so the write must be a plain one. `fixed_index` looked for the
/// pool's driver among every loop of the thread, found the hidden one, and the inner loop
/// submitted a `WRITE_FIXED` naming a buffer its ring never registered: the write failed
/// (`EFAULT`) instead of writing.
#[test]
fn a_fixed_buffer_written_on_a_loop_run_inside_its_own_is_a_plain_write_there() {
    on_each_driver("fixed_buf_inner_loop", 1, |driver| async move {
        if driver != xtc_shards::io::Driver::IoUring {
            return; // registered buffers are io_uring's
        }
        let pool = xtc_shards::io::FixedBufPool::register(1, 64).unwrap();
        assert!(pool.is_registered());
        let mut buf = pool.take().unwrap();
        assert_eq!(buf.put_slice(b"fixed"), 5);
        FIXED.with(|b| *b.borrow_mut() = Some(buf));
        let path = std::env::temp_dir().join(format!("xtc-fixed-inner-{}", std::process::id()));
        let out = Arc::new(Mutex::new(None));
        drop_off_the_loop(WriteFixedOnAnInnerLoop(path.clone(), out.clone()));
        let r = out.lock().unwrap().take();
        let written = std::fs::read(&path);
        let _ = std::fs::remove_file(&path);
        match r {
            None => println!("skipped: the inner loop does not run io_uring"),
            Some(r) => {
                assert_eq!(r.unwrap(), 5, "the write on the inner loop");
                assert_eq!(written.unwrap(), b"fixed");
            }
        }
        drop(pool);
    });
}

/// A boxed read of a stream, kept between the loops that poll it.
type KeptRead = std::pin::Pin<Box<dyn Future<Output = io::Result<usize>>>>;

thread_local! {
    static READ: std::cell::RefCell<Option<KeptRead>> = const { std::cell::RefCell::new(None) };
    static STREAM: std::cell::RefCell<Option<std::rc::Rc<TcpStream>>> =
        const { std::cell::RefCell::new(None) };
}

/// Polls the read in `READ` once on a `LocalExecutor` of its own (it waits there too, on
/// epoll), and puts it back. `Some(pending)`.
struct PollReadOnAnInnerLoop(Arc<Mutex<Option<bool>>>);

impl Drop for PollReadOnAnInnerLoop {
    fn drop(&mut self) {
        let mut read = READ.with(|r| r.borrow_mut().take()).expect("left");
        let (pending, read) = LocalExecutor::new().unwrap().block_on(async move {
            let pending =
                std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx).is_pending())).await;
            (pending, read)
        });
        READ.with(|r| *r.borrow_mut() = Some(read));
        *self.0.lock().unwrap() = Some(pending);
    }
}

/// One read future waits on this loop (epoll), then is polled on a loop run while this one is
/// hidden (a swept drop's `LocalExecutor::block_on`, on the driver `XTC_IO` picks), then is
/// dropped here, its stream kept: the loop must not keep the read's first wait as I/O in
/// flight. The future took a registration in the inner loop's driver (epoll), or finished
/// there (io_uring, where it only tries its call), and forgot the one it had here, whose entry
/// stayed in this loop's slot (nothing removed it: the drop looked for the inner driver, gone,
/// or for nothing), counted as a wait for as long as the stream lived, so `run()` never
/// returned. The outer loop runs epoll, the inner one epoll (`XTC_IO=epoll`) or the default
/// (io_uring where the kernel has it), each in a child process.
fn read_polled_on_an_inner_loop(test: &str, role: &str, env: &[(&str, &str)]) {
    if !is_child(role) {
        run_child(test, role, env);
        return;
    }
    let exec = Executor::builder()
        .shards(1)
        .io_driver(xtc_shards::io::DriverChoice::Epoll)
        .build()
        .unwrap();
    assert_eq!(exec.io_driver(), xtc_shards::io::Driver::Epoll);
    exec.spawn_on(0, || async {
        use std::rc::Rc;
        let (std_s, peer) = silent_peer();
        let s = Rc::new(TcpStream::from_std(std_s).unwrap());
        let s2 = s.clone();
        let mut read: KeptRead = Box::pin(async move { s2.read(Vec::with_capacity(8)).await.0 });
        // Waits on this loop.
        let mut cx = Context::from_waker(Waker::noop());
        assert!(read.as_mut().poll(&mut cx).is_pending());
        // Polled again on a loop run while this one is hidden.
        READ.with(|r| *r.borrow_mut() = Some(read));
        let out = Arc::new(Mutex::new(None));
        drop_off_the_loop(PollReadOnAnInnerLoop(out.clone()));
        assert!(out.lock().unwrap().take().is_some(), "the guard ran");
        // Dropped here; the stream lives on (past this task, until the thread ends).
        drop(READ.with(|r| r.borrow_mut().take()));
        STREAM.with(|k| *k.borrow_mut() = Some(s));
        drop(peer);
    })
    .unwrap();
    run_or_fail(&exec, "a run whose one task ended");
}

#[test]
fn a_read_polled_on_an_inner_loop_leaves_no_wait_on_its_outer_loop() {
    read_polled_on_an_inner_loop(
        "a_read_polled_on_an_inner_loop_leaves_no_wait_on_its_outer_loop",
        "repolled_wait",
        &[("XTC_IO", "epoll")],
    );
}

#[test]
fn a_read_polled_on_an_inner_default_loop_leaves_no_wait_on_its_outer_epoll_loop() {
    read_polled_on_an_inner_loop(
        "a_read_polled_on_an_inner_default_loop_leaves_no_wait_on_its_outer_epoll_loop",
        "repolled_wait_default",
        &[],
    );
}

/// Awaits the read in `READ` on a `LocalExecutor` of its own ([`INNER_HANG`] at most, a hang
/// guard); records what it came to (`None`: timed out).
struct AwaitReadOnAnInnerLoop(Arc<Mutex<Option<Option<io::Result<usize>>>>>);

impl Drop for AwaitReadOnAnInnerLoop {
    fn drop(&mut self) {
        let read = READ.with(|r| r.borrow_mut().take()).expect("left");
        let inner = match LocalExecutor::new() {
            Ok(l) => l,
            Err(e) => {
                println!("skipped: no inner loop ({e})");
                return;
            }
        };
        let r = inner.block_on(async move {
            if xtc_shards::io::current_driver() != Some(xtc_shards::io::Driver::IoUring) {
                println!("skipped: the inner loop does not run io_uring");
                return None;
            }
            Some(xtc_shards::time::timeout(INNER_HANG, read).await.ok())
        });
        if let Some(r) = r {
            *self.0.lock().unwrap() = Some(r);
        }
    }
}

/// A read future waits on this loop (epoll), then is awaited on an io_uring loop run while
/// this one is hidden (a swept drop's `LocalExecutor::block_on`), before its data has come:
/// it must wait there for the data. It tried its call once on the io_uring loop and returned
/// that call's `EAGAIN` (`WouldBlock`) to the caller, who had asked to wait. The outer loop
/// runs epoll, the inner one io_uring (`XTC_IO=io_uring`, skipped where the kernel refuses
/// it), in a child process.
#[test]
fn a_read_awaited_on_an_inner_io_uring_loop_waits_for_its_data() {
    const TEST: &str = "a_read_awaited_on_an_inner_io_uring_loop_waits_for_its_data";
    if !is_child("await_on_uring") {
        run_child(TEST, "await_on_uring", &[("XTC_IO", "io_uring")]);
        return;
    }
    let exec = Executor::builder()
        .shards(1)
        .io_driver(xtc_shards::io::DriverChoice::Epoll)
        .build()
        .unwrap();
    assert_eq!(exec.io_driver(), xtc_shards::io::Driver::Epoll);
    // What the read came to, checked after the run (a panic in the task would not fail it).
    let verdict = Arc::new(Mutex::new(None::<Result<(), String>>));
    let v = verdict.clone();
    exec.spawn_on(0, move || async move {
        use std::rc::Rc;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        // Writes once the inner loop awaits the read (after a pause), then holds on.
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            wait.recv().unwrap();
            std::thread::sleep(Duration::from_millis(200));
            s.write_all(b"hi").unwrap();
            std::thread::sleep(Duration::from_millis(3000));
        });
        let s = Rc::new(TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap());
        let s2 = s.clone();
        let mut read: KeptRead = Box::pin(async move {
            let (r, buf) = s2.read(Vec::with_capacity(8)).await;
            r.inspect(|&n| assert_eq!(&buf[..n], b"hi"))
        });
        // Waits on this loop.
        let mut cx = Context::from_waker(Waker::noop());
        assert!(read.as_mut().poll(&mut cx).is_pending());
        READ.with(|r| *r.borrow_mut() = Some(read));
        go.send(()).unwrap();
        let out = Arc::new(Mutex::new(None));
        drop_off_the_loop(AwaitReadOnAnInnerLoop(out.clone()));
        let r = out.lock().unwrap().take();
        drop(s);
        peer.join().unwrap();
        *v.lock().unwrap() = Some(match r {
            None | Some(Some(Ok(2))) => Ok(()), // None: skipped
            Some(other) => Err(format!("{other:?} (None: timed out)")),
        });
    })
    .unwrap();
    run_or_fail(&exec, "a run whose one task ended");
    let r = verdict.lock().unwrap().take().expect("the task ran");
    if let Err(e) = r {
        panic!("the read on the inner loop: {e}");
    }
}

/// A loopback connection to a silent peer (no event wakes a read) that lives until the
/// stream closes: the client end, and the peer's thread.
fn silent_peer() -> (std::net::TcpStream, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 16];
        while std::io::Read::read(&mut s, &mut b).is_ok_and(|n| n > 0) {}
    });
    (std::net::TcpStream::connect(addr).unwrap(), peer)
}

/// Flushes the stream in `LEFT` when dropped, on a `LocalExecutor` of its own (at most
/// [`HANG`], a hang guard), and puts it back; records what the flush came to (`None`: timed
/// out).
struct FlushOnAnInnerLoop(Arc<Mutex<Option<Option<io::Result<()>>>>>);

impl Drop for FlushOnAnInnerLoop {
    fn drop(&mut self) {
        let mut s = LEFT.with(|l| l.borrow_mut().take()).expect("left");
        let (r, s) = LocalExecutor::new().unwrap().block_on(async move {
            let r = xtc_shards::time::timeout(HANG, futures::io::AsyncWriteExt::flush(&mut s))
                .await
                .ok();
            (r, s)
        });
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        *self.0.lock().unwrap() = Some(r);
    }
}

/// Bytes `AsyncWrite` reported written on this loop (io_uring: a write-behind send on this
/// loop's driver), then a `flush` of the stream on a loop run while this one is hidden (a
/// swept drop's `LocalExecutor::block_on`): the flush must not wait for a send only this
/// loop's driver can see end, which does not turn until the section ends. It waited for
/// good (here: until its timeout), as a flush with no loop running would have, had it not
/// failed at once; it now fails at once the same way, the send left to a flush here. On epoll
/// the bytes are in the socket already.
#[test]
fn a_flush_on_an_inner_loop_does_not_wait_for_a_send_of_the_hidden_loop() {
    on_each_driver("flush_on_inner_loop", 1, |driver| async move {
        use futures::io::AsyncWriteExt;
        use xtc_shards::io::Driver;
        let (std_s, peer) = silent_peer();
        let mut s = TcpStream::from_std(std_s).unwrap();
        // Reported written at once on io_uring, its send queued on this loop's driver.
        assert_eq!(AsyncWriteExt::write(&mut s, b"hello").await.unwrap(), 5);
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        let out = Arc::new(Mutex::new(None));
        drop_off_the_loop(FlushOnAnInnerLoop(out.clone()));
        let r = out.lock().unwrap().take().expect("the guard ran");
        let mut s = LEFT.with(|l| l.borrow_mut().take()).expect("put back");
        match r {
            None => panic!("[{driver}] the flush on the inner loop hung"),
            Some(Ok(())) => {}
            Some(Err(e)) if driver == Driver::IoUring => {
                assert!(e.to_string().contains("hidden"), "[{driver}] {e}")
            }
            Some(Err(e)) => panic!("[{driver}] the flush on the inner loop: {e}"),
        }
        // Back on this loop, the send is seen through.
        guard("a flush on the outer loop", AsyncWriteExt::flush(&mut s))
            .await
            .unwrap();
        drop(s);
        peer.join().unwrap();
    });
}

/// Reads the stream in `LEFT` through `AsyncRead` when dropped, on a `LocalExecutor` of its
/// own ([`INNER_HANG`] at most, a hang guard), and puts it back; records what the read came to
/// (`None`: timed out).
struct AsyncReadOnAnInnerLoop(Arc<Mutex<Option<InnerRead>>>);

/// What a read on an inner loop came to (`None`: timed out).
type InnerRead = Option<io::Result<Vec<u8>>>;

impl Drop for AsyncReadOnAnInnerLoop {
    fn drop(&mut self) {
        let mut s = LEFT.with(|l| l.borrow_mut().take()).expect("left");
        let (r, s) = LocalExecutor::new().unwrap().block_on(async move {
            let mut b = [0u8; 8];
            let r = xtc_shards::time::timeout(
                INNER_HANG,
                futures::io::AsyncReadExt::read(&mut s, &mut b),
            )
            .await
            .ok()
            .map(|r| r.map(|n| b[..n].to_vec()));
            (r, s)
        });
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        *self.0.lock().unwrap() = Some(r);
    }
}

/// An `AsyncRead` whose receive (io_uring) started on this loop, then a read of the stream on
/// a loop run while this one is hidden (a swept drop's `LocalExecutor::block_on`), before the
/// data has come: the inner read must not wait for that receive, which only this loop's
/// driver sees end, and that does not turn until the section ends. It waited for good (here:
/// until its timeout), though the data came meanwhile; it now fails at once, as with no loop
/// running, and the receive's bytes go to the next read here. On epoll the inner loop reads
/// the socket itself.
#[test]
fn a_read_on_an_inner_loop_does_not_wait_for_a_receive_of_the_hidden_loop() {
    on_each_driver("read_on_inner_loop", 1, |driver| async move {
        use futures::io::AsyncReadExt;
        use xtc_shards::io::Driver;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            wait.recv().unwrap();
            // While the inner read waits.
            std::thread::sleep(Duration::from_millis(100));
            s.write_all(b"hi").unwrap();
            let _ = wait.recv_timeout(Duration::from_secs(10));
        });
        let mut s = TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap();
        {
            // The `AsyncRead` receive starts on this loop (io_uring).
            let mut b = [0u8; 8];
            let mut cx = Context::from_waker(Waker::noop());
            let polled =
                futures::io::AsyncRead::poll_read(std::pin::Pin::new(&mut s), &mut cx, &mut b);
            assert!(polled.is_pending(), "nothing was sent");
        }
        xtc_shards::time::sleep(Duration::from_millis(20)).await; // submitted
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        go.send(()).unwrap();
        let out = Arc::new(Mutex::new(None));
        drop_off_the_loop(AsyncReadOnAnInnerLoop(out.clone()));
        let r = out.lock().unwrap().take().expect("the guard ran");
        let mut s = LEFT.with(|l| l.borrow_mut().take()).expect("put back");
        let inner_got = match r {
            None => panic!("[{driver}] the read on the inner loop hung"),
            Some(Ok(b)) => b,
            Some(Err(e)) if driver == Driver::IoUring => {
                assert!(e.to_string().contains("hidden"), "[{driver}] {e}");
                Vec::new()
            }
            Some(Err(e)) => panic!("[{driver}] the read on the inner loop: {e}"),
        };
        if inner_got.is_empty() {
            // Back on this loop, the receive's bytes are read.
            let mut b = [0u8; 8];
            let n = guard(
                "a read on the outer loop",
                AsyncReadExt::read(&mut s, &mut b),
            )
            .await
            .unwrap();
            assert_eq!(&b[..n], b"hi", "[{driver}]");
        } else {
            assert_eq!(inner_got, b"hi", "[{driver}]");
        }
        drop(go);
        drop(s);
        peer.join().unwrap();
    });
}

thread_local! {
    /// A listener the running task leaves for a swept drop of this thread to accept on.
    static LISTENER: std::cell::RefCell<Option<xtc_shards::net::TcpListener>> =
        const { std::cell::RefCell::new(None) };
    /// A UDP socket the running task leaves for a swept drop of this thread to receive on.
    static SOCKET: std::cell::RefCell<Option<xtc_shards::net::UdpSocket>> =
        const { std::cell::RefCell::new(None) };
}

/// What a call on an inner loop came to: `None` if it timed out (the [`HANG`] guard), else `Ok`
/// or the error's text.
type InnerCall = Arc<Mutex<Option<Option<Result<(), String>>>>>;

/// Accepts on the listener in `LISTENER` when dropped, on a `LocalExecutor` of its own (at
/// most [`HANG`], a hang guard), and puts it back.
struct AcceptOnAnInnerLoop(InnerCall);

impl Drop for AcceptOnAnInnerLoop {
    fn drop(&mut self) {
        let l = LISTENER.with(|l| l.borrow_mut().take()).expect("left");
        let (r, l) = LocalExecutor::new().unwrap().block_on(async move {
            let r = xtc_shards::time::timeout(HANG, l.accept())
                .await
                .ok()
                .map(|r| r.map(drop).map_err(|e| e.to_string()));
            (r, l)
        });
        LISTENER.with(|s| *s.borrow_mut() = Some(l));
        *self.0.lock().unwrap() = Some(r);
    }
}

/// An accept dropped unfinished on this loop (io_uring keeps it, cancelled in place, its
/// completion not reaped yet), then an accept of the listener on a loop run while this one
/// is hidden (a swept drop's `LocalExecutor::block_on`), a client connecting meanwhile: the
/// inner accept took the kept one over and waited for it on this loop's driver, which is
/// reaped only once this loop turns again, after the section: it hung (here: until its
/// timeout). It now fails at once, as a stream's read does, and the client is accepted back
/// here. On epoll nothing is kept, and the inner loop accepts the client itself.
#[test]
fn an_accept_on_an_inner_loop_does_not_wait_for_a_kept_accept_of_the_hidden_loop() {
    on_each_driver("accept_on_inner_loop", 1, |driver| async move {
        use xtc_shards::io::Driver;
        let l = xtc_shards::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        {
            // Polled once and dropped: io_uring keeps its `ACCEPT`, cancelled in place.
            let mut accept = pin!(l.accept());
            let mut cx = Context::from_waker(Waker::noop());
            assert!(accept.as_mut().poll(&mut cx).is_pending());
        }
        // A client, while the inner accept waits.
        let client = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let c = std::net::TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_secs(4));
            drop(c);
        });
        LISTENER.with(|s| *s.borrow_mut() = Some(l));
        let out = InnerCall::default();
        drop_off_the_loop(AcceptOnAnInnerLoop(out.clone()));
        let r = out.lock().unwrap().take().expect("the guard ran");
        let l = LISTENER.with(|s| s.borrow_mut().take()).expect("put back");
        match r {
            None => panic!("[{driver}] the accept on the inner loop hung"),
            Some(Ok(())) => {}
            Some(Err(e)) if driver == Driver::IoUring => {
                assert!(e.contains("hidden"), "[{driver}] {e}");
                // Back on this loop, the client is accepted.
                guard("an accept on the outer loop", l.accept())
                    .await
                    .unwrap();
            }
            Some(Err(e)) => panic!("[{driver}] the accept on the inner loop: {e}"),
        }
        drop(l);
        client.join().unwrap();
    });
}

/// Receives on the socket in `SOCKET` when dropped, on a `LocalExecutor` of its own (at most
/// [`HANG`], a hang guard), and puts it back.
struct RecvOnAnInnerLoop(InnerCall);

impl Drop for RecvOnAnInnerLoop {
    fn drop(&mut self) {
        let s = SOCKET.with(|s| s.borrow_mut().take()).expect("left");
        let (r, s) = LocalExecutor::new().unwrap().block_on(async move {
            let r = xtc_shards::time::timeout(HANG, s.recv_from(Vec::with_capacity(8)))
                .await
                .ok()
                .map(|(r, buf)| match r {
                    Ok((n, _)) if &buf[..n] == b"one" => Ok(()),
                    Ok((n, _)) => Err(format!("received {:?}", &buf[..n])),
                    Err(e) => Err(e.to_string()),
                });
            (r, s)
        });
        SOCKET.with(|k| *k.borrow_mut() = Some(s));
        *self.0.lock().unwrap() = Some(r);
    }
}

/// A `recv_from` dropped unfinished on this loop (io_uring keeps its receive, cancelled in
/// place, its completion not reaped yet), then a `recv_from` on a loop run while this one is
/// hidden, a datagram arriving meanwhile: the inner receive took the kept one over and waited
/// for it on this loop's driver, which does not turn until the section ends: it hung (here:
/// until its timeout). It now fails at once, as a stream's read does, and the datagram is
/// received back here. On epoll nothing is kept, and the inner loop receives it itself.
#[test]
fn a_recv_on_an_inner_loop_does_not_wait_for_a_kept_receive_of_the_hidden_loop() {
    on_each_driver("recv_on_inner_loop", 1, |driver| async move {
        use xtc_shards::io::Driver;
        let s = xtc_shards::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        {
            // Polled once and dropped: io_uring keeps its receive, cancelled in place.
            let mut recv = pin!(s.recv_from(Vec::with_capacity(8)));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(recv.as_mut().poll(&mut cx).is_pending());
        }
        // A datagram, while the inner receive waits.
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            u.send_to(b"one", addr).unwrap();
        });
        SOCKET.with(|k| *k.borrow_mut() = Some(s));
        let out = InnerCall::default();
        drop_off_the_loop(RecvOnAnInnerLoop(out.clone()));
        let r = out.lock().unwrap().take().expect("the guard ran");
        let s = SOCKET.with(|k| k.borrow_mut().take()).expect("put back");
        sender.join().unwrap();
        match r {
            None => panic!("[{driver}] the receive on the inner loop hung"),
            Some(Ok(())) => {}
            Some(Err(e)) if driver == Driver::IoUring => {
                assert!(e.contains("hidden"), "[{driver}] {e}");
                // Back on this loop, the datagram is received.
                let (r, buf) = guard(
                    "a receive on the outer loop",
                    s.recv_from(Vec::with_capacity(8)),
                )
                .await;
                let (n, _) = r.unwrap();
                assert_eq!(&buf[..n], b"one", "[{driver}]");
            }
            Some(Err(e)) => panic!("[{driver}] the receive on the inner loop: {e}"),
        }
    });
}

/// An `AsyncRead` whose receive (io_uring) started on this loop, then an `AsyncRead` of the
/// stream on an epoll loop run while this one is hidden (a swept drop's
/// `LocalExecutor::block_on`, `XTC_IO=epoll`), the peer writing "A", then "B": the receive
/// still armed in the kernel takes "A" for the hidden driver, which hands it out only once
/// this loop turns again, so the inner read, straight from the socket, got "B" first, and
/// the stream's bytes came out of order ("BA"). It now fails at once, as on an inner io_uring
/// loop, and both bytes are read here in order. In a child process (the outer loop runs
/// io_uring, skipped where the kernel refuses it; the inner one epoll).
#[test]
fn an_epoll_read_on_an_inner_loop_does_not_overtake_a_receive_of_the_hidden_loop() {
    const TEST: &str =
        "an_epoll_read_on_an_inner_loop_does_not_overtake_a_receive_of_the_hidden_loop";
    if !is_child("epoll_read_on_inner_loop") {
        run_child(TEST, "epoll_read_on_inner_loop", &[("XTC_IO", "epoll")]);
        return;
    }
    let Ok(exec) = Executor::builder()
        .shards(1)
        .io_driver(xtc_shards::io::DriverChoice::IoUring)
        .build()
    else {
        println!("skipped: no io_uring here");
        return;
    };
    let verdict = Arc::new(Mutex::new(None::<Result<(), String>>));
    let v = verdict.clone();
    exec.spawn_on(0, move || async move {
        use futures::io::AsyncReadExt;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            wait.recv().unwrap();
            // While the inner read waits.
            std::thread::sleep(Duration::from_millis(100));
            s.write_all(b"A").unwrap();
            std::thread::sleep(Duration::from_millis(300));
            s.write_all(b"B").unwrap();
            let _ = wait.recv_timeout(Duration::from_secs(10));
        });
        let mut s = TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap()).unwrap();
        {
            // The `AsyncRead` receive starts on this loop (io_uring).
            let mut b = [0u8; 8];
            let mut cx = Context::from_waker(Waker::noop());
            let polled =
                futures::io::AsyncRead::poll_read(std::pin::Pin::new(&mut s), &mut cx, &mut b);
            assert!(polled.is_pending(), "nothing was sent");
        }
        xtc_shards::time::sleep(Duration::from_millis(20)).await; // submitted
        LEFT.with(|l| *l.borrow_mut() = Some(s));
        go.send(()).unwrap();
        let out = Arc::new(Mutex::new(None));
        drop_off_the_loop(AsyncReadOnAnInnerLoop(out.clone()));
        let r = out.lock().unwrap().take().expect("the guard ran");
        let mut s = LEFT.with(|l| l.borrow_mut().take()).expect("put back");
        let mut got = match r {
            None => Vec::new(), // timed out: judged by what follows
            Some(Ok(b)) => b,
            Some(Err(e)) if e.to_string().contains("hidden") => Vec::new(),
            Some(Err(e)) => panic!("the read on the inner loop: {e}"),
        };
        // Back on this loop, the rest.
        while got.len() < 2 {
            let mut b = [0u8; 8];
            let n = guard(
                "a read on the outer loop",
                AsyncReadExt::read(&mut s, &mut b),
            )
            .await
            .unwrap();
            assert!(n > 0, "end of stream after {got:?}");
            got.extend_from_slice(&b[..n]);
        }
        drop(go);
        drop(s);
        peer.join().unwrap();
        *v.lock().unwrap() = Some(if got == b"AB" {
            Ok(())
        } else {
            Err(format!(
                "the stream's bytes came as {:?}",
                String::from_utf8_lossy(&got)
            ))
        });
    })
    .unwrap();
    run_or_fail(&exec, "a run whose one task ended");
    let r = verdict.lock().unwrap().take().expect("the task ran");
    if let Err(e) = r {
        panic!("{e}");
    }
}

thread_local! {
    static UNIX: std::cell::RefCell<Option<std::rc::Rc<xtc_shards::net::UnixStream>>> =
        const { std::cell::RefCell::new(None) };
}

/// Writes a byte to the Unix stream in `UNIX` when dropped, on a `LocalExecutor` of its own
/// ([`INNER_HANG`] at most, a hang guard); with `peer` set, the write waits for room until a
/// thread shuts that peer's read side. Records what the write came to (`None`: timed out).
struct WriteUnixOnAnInnerLoop {
    peer: Option<Arc<std::os::unix::net::UnixStream>>,
    out: Arc<Mutex<Option<Option<io::Result<usize>>>>>,
}

impl Drop for WriteUnixOnAnInnerLoop {
    fn drop(&mut self) {
        let s = UNIX.with(|l| l.borrow_mut().take()).expect("left");
        let shutter = self.peer.take().map(|peer| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                peer.shutdown(std::net::Shutdown::Read).unwrap();
            })
        });
        let r = LocalExecutor::new().unwrap().block_on(async move {
            xtc_shards::time::timeout(INNER_HANG, s.write(b"x".to_vec()))
                .await
                .ok()
                .map(|(r, _)| r)
        });
        if let Some(t) = shutter {
            t.join().unwrap();
        }
        *self.out.lock().unwrap() = Some(r);
    }
}

/// A Unix stream's write waits for room on this loop when its peer shuts its read side, which
/// the kernel reports to no poll: the write's recheck timer must still wake it to fail with
/// `EPIPE`. Meanwhile the stream is written on a loop run while this one is hidden (a swept
/// drop's `LocalExecutor::block_on`): there the write fails at once, or waits and fails by
/// that loop's own recheck. The stream kept one recheck timer, for the driver it waited in
/// last: the inner loop's wait replaced this loop's timer, and a write ending there dropped
/// it, judging by the inner driver's waiters, so the write waiting here waited for good. Both
/// loops run epoll here (a child process with `XTC_IO=epoll`).
#[test]
fn a_unix_write_waiting_here_is_rechecked_after_the_stream_was_written_on_an_inner_loop() {
    const TEST: &str =
        "a_unix_write_waiting_here_is_rechecked_after_the_stream_was_written_on_an_inner_loop";
    if !is_child("unix_recheck") {
        run_child(TEST, "unix_recheck", &[("XTC_IO", "epoll")]);
        return;
    }
    let exec = Executor::builder().shards(1).build().unwrap();
    assert_eq!(exec.io_driver(), xtc_shards::io::Driver::Epoll);
    let verdict = Arc::new(Mutex::new(None::<Result<(), String>>));
    let v = verdict.clone();
    exec.spawn_on(0, move || async move {
        use std::rc::Rc;
        let mut failures = Vec::new();
        for inner_waits in [false, true] {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            let a = Rc::new(xtc_shards::net::UnixStream::from_std(a).unwrap());
            let b = Arc::new(b);
            fill(&*a);
            // Waits for room on this loop, its recheck timer armed here.
            let done = Rc::new(std::cell::Cell::new(None::<io::Result<usize>>));
            let (a1, d1) = (a.clone(), done.clone());
            xtc_shards::spawn_local(async move {
                let (r, _) = a1.write(vec![1u8; 4096]).await;
                d1.set(Some(r));
            });
            // Long enough for its rechecks to space out: this loop's next one is due well
            // after the inner loop below has run (a timer dropped elsewhere after its
            // deadline is not cancelled, and its recheck came anyway).
            xtc_shards::time::sleep(Duration::from_millis(700)).await;
            assert!(done.take().is_none(), "the write found room");
            if !inner_waits {
                // No event for this on `a`: its writes fail with `EPIPE` from now on.
                b.shutdown(std::net::Shutdown::Read).unwrap();
            }
            UNIX.with(|l| *l.borrow_mut() = Some(a.clone()));
            let out = Arc::new(Mutex::new(None));
            drop_off_the_loop(WriteUnixOnAnInnerLoop {
                peer: inner_waits.then(|| b.clone()),
                out: out.clone(),
            });
            match out.lock().unwrap().take().expect("the guard ran") {
                Some(Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => {}
                other => failures.push(format!(
                    "inner_waits={inner_waits}: the inner loop's write: {other:?}"
                )),
            }
            // The write waiting here must fail too, at one of its next rechecks. A loaded
            // machine only delays those; the bound is a hang guard, for a write never woken.
            let deadline = Instant::now() + INNER_HANG;
            while done.take().map(|r| done.set(Some(r))).is_none() && Instant::now() < deadline {
                xtc_shards::time::sleep(Duration::from_millis(10)).await;
            }
            match done.take() {
                Some(Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => {}
                other => failures.push(format!(
                    "inner_waits={inner_waits}: the write waiting on the outer loop: {other:?} \
                     (None: never woken)"
                )),
            }
        }
        *v.lock().unwrap() = Some(if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("; "))
        });
    })
    .unwrap();
    run_or_fail(&exec, "a run whose one task ended");
    let r = verdict.lock().unwrap().take().expect("the task ran");
    if let Err(e) = r {
        panic!("{e}");
    }
}

thread_local! {
    static UDP: std::cell::RefCell<Option<std::rc::Rc<xtc_shards::net::UdpSocket>>> =
        const { std::cell::RefCell::new(None) };
}

/// On a `LocalExecutor` of its own (io_uring, by `XTC_IO`) when dropped: a `recv_from` of the
/// socket in `UDP` gets the datagram "one", reaped but not polled, and is dropped, so the
/// socket keeps it; then, if `.1`, the datagram "two" is sent to the socket (left in its
/// receive queue). Records `Err` if that loop is not io_uring.
struct KeepADatagramOnAnInnerLoop(Arc<Mutex<Option<Result<(), String>>>>, bool);

impl Drop for KeepADatagramOnAnInnerLoop {
    fn drop(&mut self) {
        let s = UDP.with(|l| l.borrow_mut().take()).expect("left");
        let then_two = self.1;
        let r = match LocalExecutor::new() {
            Err(e) => Err(format!("no LocalExecutor: {e}")),
            Ok(ex) => ex.block_on(async move {
                let driver = xtc_shards::io::current_driver();
                if driver != Some(xtc_shards::io::Driver::IoUring) {
                    return Err(format!("the inner loop runs {driver:?}"));
                }
                let addr = s.local_addr().unwrap();
                let mut f = Box::pin(s.recv_from(Vec::with_capacity(64)));
                let mut cx = Context::from_waker(Waker::noop());
                assert!(f.as_mut().poll(&mut cx).is_pending());
                xtc_shards::time::sleep(Duration::from_millis(5)).await; // in the kernel
                let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                peer.send_to(b"one", addr).unwrap();
                xtc_shards::time::sleep(Duration::from_millis(20)).await; // received, reaped
                drop(f); // kept, holding "one"
                if then_two {
                    peer.send_to(b"two", addr).unwrap(); // in the socket's queue
                }
                Ok(())
            }),
        };
        *self.0.lock().unwrap() = Some(r);
    }
}

/// A `recv_from` waits on this epoll loop; meanwhile a loop run while this one is hidden (a
/// swept drop's `LocalExecutor::block_on`, io_uring) keeps a dropped `recv_from`'s receive,
/// which took the datagram "one", and ends. The waiting `recv_from` must hand "one" out: the
/// kernel has no datagram left to wake it. Its epoll wait joined none of the socket's waiters
/// that a kept receive wakes, nor looked at the kept ones again, so it waited for good (or
/// for the next datagram, which came out before "one"). A child process with `XTC_IO=io_uring`
/// (the inner loop), the outer loop forced to epoll.
#[test]
fn a_recv_from_waiting_on_epoll_takes_a_datagram_kept_meanwhile() {
    recv_from_waiting_on_epoll_behind_a_kept_datagram(
        "a_recv_from_waiting_on_epoll_takes_a_datagram_kept_meanwhile",
        "udp_kept_on_epoll",
        false,
    );
}

/// As above, but a second datagram, "two", reaches the socket's queue after "one" was kept,
/// and this loop turns (its epoll wait reports the socket readable) before the waiting
/// `recv_from` is polled again: it must still hand out "one" first, then "two". Its epoll
/// wait was polled before it looked at the kept receives, so it took "two" from the kernel
/// and handed it out ahead of "one", which the kernel had received first.
#[test]
fn a_recv_from_waiting_on_epoll_hands_out_a_kept_datagram_before_a_later_one() {
    recv_from_waiting_on_epoll_behind_a_kept_datagram(
        "a_recv_from_waiting_on_epoll_hands_out_a_kept_datagram_before_a_later_one",
        "udp_kept_first_on_epoll",
        true,
    );
}

/// The two tests above: `then_two`, a second datagram queued after the kept one and a loop
/// turn before the waiting `recv_from` is polled again, which must then get "one", and the
/// next call "two".
fn recv_from_waiting_on_epoll_behind_a_kept_datagram(test: &str, tag: &str, then_two: bool) {
    if !is_child(tag) {
        let uring = Executor::builder()
            .shards(1)
            .io_driver(xtc_shards::io::DriverChoice::IoUring)
            .build();
        if let Err(e) = uring {
            println!("{test}: skipped, io_uring unavailable here: {e}");
            return;
        }
        drop(uring);
        run_child(test, tag, &[("XTC_IO", "io_uring")]);
        return;
    }
    let exec = Executor::builder()
        .shards(1)
        .io_driver(xtc_shards::io::DriverChoice::Epoll)
        .build()
        .unwrap();
    let verdict = Arc::new(Mutex::new(None::<Result<(), String>>));
    let v = verdict.clone();
    exec.spawn_on(0, move || async move {
        let s = std::rc::Rc::new(xtc_shards::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let mut waiting = pin!(s.recv_from(Vec::with_capacity(64)));
        {
            let mut cx = Context::from_waker(Waker::noop());
            assert!(waiting.as_mut().poll(&mut cx).is_pending());
        }
        UDP.with(|l| *l.borrow_mut() = Some(s.clone()));
        let out = Arc::new(Mutex::new(None));
        drop_off_the_loop(KeepADatagramOnAnInnerLoop(out.clone(), then_two));
        let kept = out.lock().unwrap().take().expect("the guard ran");
        if then_two {
            // This loop turns: its epoll wait reports the socket readable ("two" is queued).
            xtc_shards::time::sleep(Duration::from_millis(20)).await;
        }
        let r = match kept {
            Err(e) => Err(format!("the inner loop: {e}")),
            Ok(()) => match xtc_shards::time::timeout(INNER_HANG, waiting).await {
                Ok((Ok((n, _)), b)) if b[..n] == *b"one" && !then_two => Ok(()),
                Ok((Ok((n, _)), b)) if b[..n] == *b"one" => {
                    let next = s.recv_from(Vec::with_capacity(64));
                    match xtc_shards::time::timeout(INNER_HANG, next).await {
                        Ok((Ok((n, _)), b)) if b[..n] == *b"two" => Ok(()),
                        Ok((r, b)) => Err(format!("the next recv_from: {r:?}, {b:?}")),
                        Err(_) => Err("the next recv_from never got \"two\"".into()),
                    }
                }
                Ok((r, b)) => Err(format!(
                    "the waiting recv_from (\"one\" expected first): {r:?}, {:?}",
                    String::from_utf8_lossy(&b)
                )),
                Err(_) => Err("the waiting recv_from never took the kept \"one\"".into()),
            },
        };
        *v.lock().unwrap() = Some(r);
    })
    .unwrap();
    run_or_fail(&exec, "a run whose one task ended");
    let r = verdict.lock().unwrap().take().expect("the task ran");
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// Calls `into_std` on the listener in `LISTENER` when dropped: directly (in the hidden
/// section a sweep runs it in), or on a `LocalExecutor` run there (`nested`). Puts the listener
/// back, and what the call came to in `out`.
struct IntoStdOnDrop {
    nested: bool,
    out: Outcome,
}

impl Drop for IntoStdOnDrop {
    fn drop(&mut self) {
        use xtc_shards::net::TcpListener;
        let l = LISTENER
            .with(|l| l.borrow_mut().take())
            .expect("left there");
        let call = move |l: TcpListener| match l.into_std() {
            Ok(std) => (Ok(()), TcpListener::from_std(std).unwrap()),
            Err(e) => (Err(format!("{e}")), e.into_inner()),
        };
        let (r, l) = if self.nested {
            LocalExecutor::new()
                .unwrap()
                .block_on(async move { call(l) })
        } else {
            call(l)
        };
        LISTENER.with(|s| *s.borrow_mut() = Some(l));
        *self.out.lock().unwrap() = Some(r);
    }
}

/// A listener whose dropped accept io_uring keeps (cancelled in place), handed to `std` in a
/// swept drop, directly or on a loop run inside the hidden section: `into_std` reaps the
/// drivers to see the cancel settle, and on the inner loop it reaped only that loop's, never
/// the hidden one whose accept it waited for, so it busy-waited its second and refused,
/// though the kernel had answered the cancel at once. (On epoll no accept is kept.)
#[test]
fn into_std_on_an_inner_loop_settles_a_kept_accept_of_the_hidden_loop() {
    for nested in [false, true] {
        on_each_driver("into_std_inner", 1, move |driver| async move {
            let l = xtc_shards::net::TcpListener::bind("127.0.0.1:0").unwrap();
            {
                let mut accept = pin!(l.accept());
                let mut cx = Context::from_waker(Waker::noop());
                assert!(accept.as_mut().poll(&mut cx).is_pending());
            }
            LISTENER.with(|s| *s.borrow_mut() = Some(l));
            let out = Outcome::default();
            drop_off_the_loop(IntoStdOnDrop {
                nested,
                out: out.clone(),
            });
            let r = out.lock().unwrap().take().expect("the drop ran");
            drop(LISTENER.with(|s| s.borrow_mut().take()));
            assert!(
                r.is_ok(),
                "[{driver}] nested {nested}: into_std refused: {r:?}"
            );
        });
    }
}
