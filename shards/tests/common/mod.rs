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
