//! The epoll driver's blocking pool when the program changes the interrupt signal's
//! (`SIGRTMIN+2`) disposition after xtc installed its handler: each interrupt looks at the
//! disposition again. Its own test binary: the disposition is process-wide, so no other test
//! may run in it.
//!
//! xtc decided once per process and then sent the signal for good: a handler the program
//! installed after an earlier run got the interrupts of the later runs' cancels (contrary to
//! "with `SIGRTMIN+2` taken, cancelled blocking file operations are not interrupted"), and a
//! disposition reset to the default made the next cancel end the process.

mod common;
use common::signals::{handler_of, mine_addr, set_handler, MINE};

use std::{os::unix::fs::OpenOptionsExt, sync::atomic::Ordering::SeqCst, time::Duration};

use xtc_shards::{fs::OpenOptions, io::DriverChoice, Executor};

/// A fresh FIFO path in the temp dir.
fn fifo(tag: &str) -> std::path::PathBuf {
    common::fifo("xtc-pool-handler", tag)
}

/// A one-shard executor on the epoll driver (whose file operations go to the blocking pool).
fn epoll_exec() -> Executor {
    Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .io_driver(DriverChoice::Epoll)
        .build()
        .unwrap()
}

/// Opens the FIFO at `p` for reading and closes it, which lets a writer's blocked `open` end.
/// Not blocking: a reader's open of a FIFO returns at once with `O_NONBLOCK`.
fn open_reader(p: &std::path::Path) {
    drop(
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(p)
            .unwrap(),
    );
}

/// One epoll run whose task drops an `open` for writing of a FIFO nobody reads (a pool job
/// blocked in `open(2)`, cancelled), then lets it end by opening the FIFO for reading (so a
/// job that was not interrupted ends too, and `run()` returns either way).
fn dropped_fifo_open(tag: &str) {
    let path = fifo(tag);
    let ex = epoll_exec();
    let p = path.clone();
    ex.spawn_on(0, move || async move {
        common::give_up_opening_fifo(&p).await;
        xtc_shards::time::sleep(Duration::from_millis(50)).await;
        open_reader(&p);
    })
    .unwrap();
    common::run_or_fail(ex, common::HANG, "a dropped FIFO open").unwrap();
    let _ = std::fs::remove_file(&path);
}

/// A waker that counts nothing: its `Arc`'s strong count says who holds it.
struct Held;
impl std::task::Wake for Held {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// One epoll run whose task polls an `open` of a FIFO nobody reads once, with a waker of its
/// own, and drops it while the pool job is still blocked in `open(2)` (with `SIGRTMIN+2` the
/// program's, nothing interrupts it): the future's drop must let go of the waker at once. The
/// job's slot kept it until the job ended, which an uninterruptible job may never do, and
/// with it the task that dropped the future. The run then ends the job as
/// [`dropped_fifo_open`] does.
fn dropped_open_lets_its_waker_go(tag: &str) {
    use std::{
        future::Future,
        sync::Arc,
        task::{Context, Waker},
    };
    let path = fifo(tag);
    let ex = epoll_exec();
    let p = path.clone();
    ex.spawn_on(0, move || async move {
        let held = Arc::new(Held);
        let waker = Waker::from(held.clone());
        let mut o = OpenOptions::new();
        o.write(true);
        let mut open = Box::pin(o.open(&p));
        assert!(
            open.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending(),
            "nobody reads the FIFO: the open waits"
        );
        drop(waker);
        // Time for a pool thread to take the job into `open(2)`: a job dropped before it
        // starts is skipped, and ends at once.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            Arc::strong_count(&held),
            2,
            "the waiting open holds its waker"
        );
        drop(open);
        assert_eq!(
            Arc::strong_count(&held),
            1,
            "a dropped open kept its waker while its job went on"
        );
        open_reader(&p);
    })
    .unwrap();
    common::run_or_fail(ex, common::HANG, "a dropped FIFO open's waker").unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn interrupts_follow_the_programs_later_changes_to_the_signal() {
    let sig = libc::SIGRTMIN() + 2;
    // A first run installs xtc's handler.
    dropped_fifo_open("first");

    // The program takes the signal for itself afterwards: xtc must not signal into its
    // handler.
    set_handler(sig, mine_addr());
    dropped_fifo_open("theirs");
    dropped_open_lets_its_waker_go("theirs-waker");
    assert_eq!(
        handler_of(sig),
        mine_addr(),
        "the program's SIGRTMIN+2 handler was replaced"
    );
    assert_eq!(
        MINE.load(SeqCst),
        0,
        "xtc's interrupt reached the handler the program installed after xtc's"
    );

    // The program gives the signal back (the default action, which ends the process): the
    // next cancel installs xtc's handler again rather than signal a thread to death.
    set_handler(sig, libc::SIG_DFL);
    dropped_fifo_open("default");
    assert_eq!(MINE.load(SeqCst), 0);
}
