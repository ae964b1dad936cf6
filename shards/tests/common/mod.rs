//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use xtc_shards::Executor;

/// An executor of `n` shards, oversubscribed so any `n` runs on a 2-CPU machine.
pub fn exec(n: usize) -> Executor {
    Executor::builder()
        .shards(n)
        .oversubscribe(true)
        .build()
        .expect("build executor")
}

/// Spins the CPU for `d` (a CPU-bound task body).
pub fn burn(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Runs `ex` on another thread and waits at most `limit` for `run()` to return: a hang fails
/// the test (naming `what`) instead of blocking the suite.
pub fn run_or_fail(ex: Executor, limit: Duration, what: &str) -> xtc_shards::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || tx.send(ex.run()).unwrap());
    let ran = rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("run() hung: {what}"));
    runner.join().unwrap();
    ran
}

/// Adds one to its counter when dropped (did a value go, and only once?).
pub struct CountDrop(pub std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for CountDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A waker whose `wake` panics: user code, as when a future is polled with a custom waker.
pub fn panicking_waker() -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    fn clone(p: *const ()) -> RawWaker {
        RawWaker::new(p, &VTABLE)
    }
    fn wake(_: *const ()) {
        panic!("a user waker panics");
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake, noop);
    // SAFETY: the vtable's functions never dereference the (null) data pointer.
    unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}
