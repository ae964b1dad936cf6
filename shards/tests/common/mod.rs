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
