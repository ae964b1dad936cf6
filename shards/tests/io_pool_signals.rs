//! The epoll driver's blocking pool in a program that blocks its signals: a dropped file
//! operation is still interrupted. Runs on both drivers (see `io_common::cases`). Its own test
//! binary: the pool is process-wide, and its threads must be started here, from a thread with
//! every signal blocked, not reused from another test.

mod common;
mod io_common;
use io_common::*;

/// A program that takes its signals with `signalfd` or `sigwait` blocks them all before it
/// starts any thread; the executor's threads, and the blocking pool's threads they start,
/// inherit that mask. A dropped `open` of a FIFO that no reader comes to must still be
/// interrupted, so that `run()` returns: on epoll the pool thread kept the cancel's signal
/// blocked, stayed in `open(2)` for good, and `run()` never returned.
#[test]
fn a_dropped_blocking_open_is_interrupted_when_the_program_blocks_signals() {
    std::thread::spawn(|| {
        // SAFETY: a local set filled by `sigfillset`; only this thread's mask changes.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        }
        each_driver(
            "blocked_signals_dropped_open",
            1,
            |b| b,
            |driver, exec| {
                common::drop_a_fifo_open(exec, "xtc-io-pool", &format!("masked-{driver}"))
                    .unwrap_or_else(|e| panic!("{driver}: {e}"))
                    .unwrap();
            },
        );
    })
    .join()
    .unwrap();
}
