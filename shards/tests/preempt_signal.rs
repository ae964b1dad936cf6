//! A program that uses `SIGRTMIN+1` itself gives xtc's preemption tick another signal
//! (`Builder::preempt_signal`): preemption works, and the program's own handler keeps its
//! signal and gets no tick. Its own test binary: signal handlers are process-wide.
//!
//! Before the setting existed, such a program could only run without preemption (xtc keeps a
//! handler the program installed, `preempt_foreign_handler.rs`), or lose its process-directed
//! `SIGRTMIN+1`s to the workers, which unblock the tick's signal.

mod common;

use std::{sync::atomic::Ordering::SeqCst, time::Duration};

use common::signals::{handler_of, install_mine, mine_addr, MINE};
use xtc_shards::Executor;

#[test]
fn preemption_on_a_signal_the_program_picked() {
    let program = libc::SIGRTMIN() + 1;
    let tick = libc::SIGRTMIN() + 3;
    install_mine(program);
    assert_eq!(handler_of(tick), libc::SIG_DFL);
    let ex = Executor::builder()
        .shards(1)
        .preempt(Duration::from_millis(1))
        .preempt_signal(tick)
        .build()
        .unwrap();
    assert_eq!(ex.preempt_signal(), tick);
    let yields = common::yields_until(ex, 3, Duration::from_secs(2));
    assert!(
        yields >= 3,
        "preempt 1 ms on SIGRTMIN+3, 2 s of CPU: {yields} yields"
    );
    assert_ne!(handler_of(tick), libc::SIG_DFL, "xtc's tick handler");
    assert_eq!(
        handler_of(program),
        mine_addr(),
        "the program's SIGRTMIN+1 handler was replaced"
    );
    assert_eq!(MINE.load(SeqCst), 0, "a tick reached the program's handler");
    // SAFETY: raising a signal whose handler is `mine` runs one atomic add on this thread.
    assert_eq!(unsafe { libc::raise(program) }, 0);
    assert_eq!(MINE.load(SeqCst), 1);
}
