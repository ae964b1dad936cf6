//! [`spawn_blocking`]: blocking code on the runtime's blocking-thread pool.

use std::{
    any::Any,
    fmt,
    future::Future,
    panic::{catch_unwind, AssertUnwindSafe},
    pin::Pin,
    task::{Context, Poll},
};

use crate::{io::blocking, JoinError};

type Caught<T> = Result<T, Box<dyn Any + Send + 'static>>;

/// Runs `f` on the blocking-thread pool (the one `xtc::fs` uses on the epoll driver) and
/// returns a future of its result, as tokio's and Glommio's `spawn_blocking` do: the way to
/// call blocking code (a blocking library, a long computation, a `std::fs` call) from a task
/// without stalling its loop. A panic in `f` comes back as a [`JoinError`] (`is_panic`).
///
/// While the job has not ended, its loop counts as waiting on it, as on I/O in flight: the
/// executor is not quiescent and no deadlock is reported, however long `f` takes. (A task that
/// awaits a plain `std::thread` of its own, through a channel, is reported as deadlocked once
/// the executor has been idle for the deadlock grace, `XTC_DEADLOCK_GRACE`, 5 s by default.)
///
/// Pool threads are shared by every executor of the process and run on the allowed CPUs of
/// every executor built so far; a job that changes its own thread's state (its CPU affinity,
/// its signal mask) leaves it changed for the later jobs that thread runs: restore it before
/// returning.
///
/// Dropping the future cancels a job not started yet (it never runs); one already running
/// runs to its end, and its result is dropped (the pool sends no signal into user code), and
/// the loop that was running when the future was dropped, if it stops meanwhile, waits up to
/// a second for such a job before it returns (no loop waits for a future dropped off any loop
/// or in another executor's sweep, but `run()`'s own drop of the migratable tasks it left
/// parked waits for theirs). Where a pool thread cannot be started (a process or cgroup
/// thread limit) while the pool has no thread at all, `f` runs on the calling thread, inside
/// this call, blocking its loop for as long as it takes (logged as a warning).
///
/// Works on and off a loop, in pinned and migratable tasks alike: the future is `Send` when
/// `T` is, so a migratable task ([`spawn`](crate::spawn)) may await it and be stolen
/// meanwhile. Until the job ends it counts in the work of the loop that called this (none when
/// called off any loop), wherever the awaiting task has moved, and of each loop that polls this
/// future while it waits, so no loop that waits on it reads as idle.
///
/// Cost: a boxed job and two small shared allocations (its result slot and its control
/// block), a lock of the pool's queue, and a thread start when no pool thread is idle (up to
/// 512 threads, each exiting after 10 s without work); each poll while the job runs, a lock
/// of its result slot (two, and a waker clone, when the waker changed) and, on a loop, one of
/// its control block; the result's wake-up reaches the loop through its inbox.
pub fn spawn_blocking<F, T>(f: F) -> SpawnBlocking<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    SpawnBlocking {
        job: blocking::run_uninterrupted(move || Ok(catch_unwind(AssertUnwindSafe(f)))),
    }
}

/// The future of [`spawn_blocking`]: the closure's return value, or its panic as a
/// [`JoinError`].
#[must_use = "futures do nothing unless awaited; dropped, the job is cancelled if not started"]
pub struct SpawnBlocking<T> {
    job: blocking::Blocking<Caught<T>>,
}

// SAFETY: `blocking::Blocking` is `!Send` only by a marker, which keeps a file operation's
// future on its loop (with the descriptor it serves). Its fields are an
// `Arc<Mutex<Slot<io::Result<Caught<T>>>>>` (`Send` when `T` is: `Caught`'s payload is `Send`),
// an `Arc` of a control block (a `Mutex` of plain data), an id and a flag, and polling or
// dropping it from any thread touches only those and the current thread's own thread-locals
// (its list of abandoned jobs). The job's count in its loop's work is an `Arc` the job took
// at submission, held until the job ends, whichever thread the future is on by then. A job
// of `spawn_blocking` is never sent the pool's interrupt signal (`run_uninterrupted`), the
// one thing a cancel aims at a particular thread.
unsafe impl<T: Send> Send for SpawnBlocking<T> {}

impl<T> Future for SpawnBlocking<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.job).poll(cx).map(|r| match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(payload)) => Err(JoinError::panic(payload)),
            // The pool reports an error only for a job it skipped (cancelled, which takes
            // dropping this future) or one whose closure panicked, which the closure catches.
            Err(_) => Err(JoinError::cancelled()),
        })
    }
}

impl<T> fmt::Debug for SpawnBlocking<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpawnBlocking").finish_non_exhaustive()
    }
}
