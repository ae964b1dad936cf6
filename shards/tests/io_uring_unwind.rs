//! A panic that unwinds out of the io_uring driver's shutdown (a tracing subscriber that
//! panics on the driver's own error log: user code) must not free buffers the kernel still
//! holds. Its own binary: the test installs a seccomp filter on its thread. From the io_uring
//! driver audit of stop 49.

mod common;

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        mpsc, Arc,
    },
    time::Duration,
};

/// A receive the kernel holds (its cancel refused: a seccomp filter installed after it was
/// submitted makes every submitting `io_uring_enter` fail with `EAGAIN`), its stream dropped
/// so the driver keeps its buffer (`Ignored`). The driver's shutdown waits its second, then
/// logs "did not complete at shutdown" at ERROR before it leaks the buffers; a subscriber
/// that panics on that event unwinds out of `Uring::drop` before the leak, and the drop glue
/// frees the `ops` slab: the buffer of a receive still armed in the kernel is freed.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_panic_out_of_the_drivers_shutdown_frees_no_buffer_the_kernel_holds() {
    use std::future::Future;
    use std::task::Poll;
    use xtc_shards::net::UnixStream;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        let out = tracing::subscriber::with_default(
            common::panic_on_events(tracing::Level::ERROR),
            || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    ex.block_on(async move {
                        if xtc_shards::io::current_driver() != Some(xtc_shards::io::Driver::IoUring)
                        {
                            return None;
                        }
                        let (a, b) = UnixStream::pair().unwrap();
                        let mut read = Box::pin(a.read(common::Counted(Vec::with_capacity(64), d)));
                        let pending = std::future::poll_fn(|cx| {
                            Poll::Ready(read.as_mut().poll(cx).is_pending())
                        })
                        .await;
                        assert!(pending);
                        // The receive reaches the kernel at the end of this turn.
                        xtc_shards::time::sleep(Duration::from_millis(10)).await;
                        if !common::deny_uring_submit(libc::EAGAIN as u32) {
                            return None;
                        }
                        // The stream keeps the receive; its drop abandons it (cancel refused).
                        drop(read);
                        drop(a);
                        Some(b)
                    })
                }))
            },
        );
        let skipped = matches!(out, Ok(None));
        let panicked = out.is_err();
        // Keep the peer open: the receive stays armed.
        std::mem::forget(out);
        let _ = tx.send((skipped, panicked, drops.load(SeqCst)));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok((true, _, _)) => println!("no seccomp or no io_uring here; skipped"),
        Ok((false, panicked, dropped)) => {
            println!("the shutdown's error log panicked: {panicked}");
            assert_eq!(
                dropped, 0,
                "the buffer of a receive still armed in the kernel was freed (panic out of \
                 the driver's shutdown: {panicked})"
            );
        }
        Err(_) => panic!("the test hung, or its thread panicked"),
    }
}
