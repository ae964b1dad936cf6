//! Preemption when the program changes the tick's signal (`SIGRTMIN+1`) disposition after
//! xtc installed its handler: each arm looks at the disposition again. Its own test binary:
//! the signal's disposition is process-wide, so no other test may run in it.
//!
//! xtc decided once per process and then armed timers for good: a handler the program
//! installed after an earlier run received every tick of the later runs' workers (contrary to
//! "a handler the program installed itself is kept, and the workers then run without the
//! timer"), and a disposition reset to the default made the first tick end the process.

mod common;
use common::signals::{handler_of, mine_addr, set_handler, MINE};

use std::{sync::atomic::Ordering::SeqCst, time::Duration};

use xtc_shards::{yield_if_due, Executor};

/// Runs one shard with 1 ms preemption and a task that burns CPU for `ms` milliseconds,
/// checking `yield_if_due` as it goes; returns how often it yielded.
fn burn_with_preemption(ms: u64) -> u64 {
    let ex = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .preempt(Duration::from_millis(1))
        .build()
        .unwrap();
    let h = ex
        .spawn_on(0, move || async move {
            let mut yields = 0;
            for _ in 0..ms * 10 {
                common::burn(Duration::from_micros(100));
                let mut f = yield_if_due();
                if futures::poll!(&mut f).is_pending() {
                    yields += 1;
                    f.await;
                }
            }
            yields
        })
        .unwrap();
    common::run_or_fail(ex, common::HANG, "a CPU-bound task under preemption").unwrap();
    futures::executor::block_on(h).unwrap()
}

#[test]
fn preemption_follows_the_programs_later_changes_to_the_signal() {
    let sig = libc::SIGRTMIN() + 1;
    // A first run installs xtc's handler.
    assert!(burn_with_preemption(50) > 0, "preemption works at first");

    // The program takes the signal for itself afterwards: xtc's later timers must not tick
    // into its handler.
    set_handler(sig, mine_addr());
    assert_eq!(burn_with_preemption(100), 0, "no timer: no yields");
    assert_eq!(
        handler_of(sig),
        mine_addr(),
        "the program's SIGRTMIN+1 handler was replaced"
    );
    assert_eq!(
        MINE.load(SeqCst),
        0,
        "preemption ticks reached the handler the program installed after xtc's"
    );

    // The program gives the signal back (the default action, which ends the process): the
    // next run installs xtc's handler again rather than arm a timer that kills the process.
    set_handler(sig, libc::SIG_DFL);
    assert!(
        burn_with_preemption(50) > 0,
        "preemption works again once the signal is free"
    );
    assert_eq!(MINE.load(SeqCst), 0);
}
