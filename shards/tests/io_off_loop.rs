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
/// 100 ms), waiting for the result there (up to 3 s), directly or on a `LocalExecutor` of its
/// own (`nested`).
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
                xtc_shards::time::timeout(Duration::from_secs(3), read_from(addr))
                    .await
                    .ok()
            })
        } else {
            poll_until(Duration::from_secs(3), read_from(addr))
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
    let b = Executor::builder().shards(1).build().unwrap();
    let guard = ReadOnDrop {
        addr,
        nested,
        out: out.clone(),
    };
    b.spawn_on(0, move || {
        let _g = guard;
        async {}
    })
    .unwrap();
    drop(b); // frees the queued task off the loop (`context::off_loop`)
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
            let t = Instant::now();
            match read_in_a_swept_drop(false) {
                Err(e) if e.contains("off any xtc loop") => {}
                other => panic!("[{driver}] a read off the loop: {other:?}"),
            }
            assert!(t.elapsed() < Duration::from_secs(2), "[{driver}] it waited");
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
