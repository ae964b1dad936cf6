//! The epoll driver's blocking pool in a program that blocks its signals: a dropped file
//! operation is still interrupted. Runs on both drivers (see `io_common::cases`). Its own test
//! binary: the pool is process-wide, and its threads must be started here, from a thread with
//! every signal blocked, not reused from another test.

mod common;
mod io_common;
use io_common::*;

use std::time::Duration;

use xtc_shards::fs::OpenOptions;

/// A fresh FIFO path in the temp dir.
fn fifo(tag: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("xtc-io-pool-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain system call with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    path
}

/// A program that takes its signals with `signalfd` or `sigwait` blocks them all before it
/// starts any thread; the executor's threads, and the blocking pool's threads they start,
/// inherit that mask. A dropped `open` of a FIFO that no reader comes to must still be
/// interrupted, so that `run()` returns: on epoll the pool thread kept the cancel's signal
/// blocked, stayed in `open(2)` for good, and `run()` never returned.
#[test]
fn a_dropped_blocking_open_is_interrupted_when_the_program_blocks_signals() {
    use std::os::unix::fs::OpenOptionsExt;
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
                let path = fifo(&format!("masked-{driver}"));
                let p = path.clone();
                exec.spawn_on(0, move || async move {
                    let mut o = OpenOptions::new();
                    o.write(true);
                    let open = xtc_shards::time::timeout(Duration::from_millis(50), o.open(&p));
                    assert!(open.await.is_err(), "nobody reads the FIFO: the open waits");
                })
                .unwrap();
                let (tx, rx) = std::sync::mpsc::channel();
                let handle = exec.handle();
                let returned = std::thread::scope(|s| {
                    s.spawn(|| tx.send(exec.run()).unwrap());
                    let r = rx.recv_timeout(Duration::from_secs(10));
                    if r.is_err() {
                        // Release the blocked open (a reader comes), so the test ends.
                        handle.stop();
                        let _reader = std::fs::OpenOptions::new()
                            .read(true)
                            .custom_flags(libc::O_NONBLOCK)
                            .open(&path);
                        let _ = rx.recv_timeout(HANG);
                    }
                    r
                });
                let _ = std::fs::remove_file(&path);
                returned
                    .unwrap_or_else(|_| panic!("{driver}: run() hung on the dropped open"))
                    .unwrap();
            },
        );
    })
    .join()
    .unwrap();
}
