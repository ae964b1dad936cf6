//! A program that uses `SIGRTMIN+2` itself gives the blocking pool's interrupt another signal
//! (`Builder::interrupt_signal`): a dropped file operation blocked in the pool (epoll driver) is
//! interrupted with that one, and the program's handler keeps its signal and gets nothing. Its
//! own test binary: the interrupt signal and the handlers are process-wide.
//!
//! Before the setting existed, such a program's cancelled blocking operations were never
//! interrupted: a dropped `open` of a FIFO no reader came to held `run()` for good.

mod common;

use std::sync::atomic::Ordering::SeqCst;

use common::signals::{handler_of, install_mine, mine_addr, MINE};
use xtc_shards::{io::DriverChoice, Executor};

#[test]
fn a_dropped_blocking_open_is_interrupted_with_the_signal_the_program_picked() {
    let theirs = libc::SIGRTMIN() + 2;
    let ours = libc::SIGRTMIN() + 4;
    install_mine(theirs);
    let ex = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .io_driver(DriverChoice::Epoll)
        .interrupt_signal(ours)
        .build()
        .unwrap();
    assert_eq!(ex.interrupt_signal(), ours);
    common::drop_a_fifo_open(ex, "xtc-pool-interrupt", "theirs")
        .unwrap()
        .unwrap();
    assert_ne!(handler_of(ours), libc::SIG_DFL, "xtc's interrupt handler");
    assert_eq!(
        handler_of(theirs),
        mine_addr(),
        "the program's SIGRTMIN+2 handler was replaced"
    );
    assert_eq!(
        MINE.load(SeqCst),
        0,
        "an interrupt reached the program's handler"
    );
}
