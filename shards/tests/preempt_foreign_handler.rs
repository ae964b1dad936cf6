//! Preemption when the program already handles the tick's signal (`SIGRTMIN+1`) itself: xtc
//! keeps the program's handler and runs without the timer. Its own test binary: the handler is
//! installed once per process, so no other test may run in it.
//!
//! xtc used to replace the program's handler unseen: the program's own `SIGRTMIN+1` then went
//! to xtc's handler, and the program never saw it again.

mod common;

use std::{sync::atomic::Ordering::SeqCst, time::Duration};

use common::signals::{handler_of, install_mine, mine_addr, MINE};
use xtc_shards::Executor;

#[test]
fn preemption_keeps_a_handler_the_program_installed() {
    let sig = libc::SIGRTMIN() + 1;
    install_mine(sig);
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .preempt(Duration::from_millis(1))
        .build()
        .unwrap();
    for s in 0..2 {
        // CPU time on each worker, so an armed timer would fire (and land in `mine`).
        ex.spawn_on(s, || async { common::burn(Duration::from_millis(100)) })
            .unwrap();
    }
    ex.run().unwrap();
    assert_eq!(
        handler_of(sig),
        mine_addr(),
        "the program's SIGRTMIN+1 handler was replaced"
    );
    // No timer was armed on the workers (they would have fired into `mine` while burning).
    assert_eq!(
        MINE.load(SeqCst),
        0,
        "a preemption tick reached the program's handler"
    );
    // The program's own signal still reaches its handler.
    // SAFETY: raising a signal whose handler is `mine` runs one atomic add on this thread.
    assert_eq!(unsafe { libc::raise(sig) }, 0);
    assert_eq!(MINE.load(SeqCst), 1);
}
