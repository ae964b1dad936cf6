use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

/// Lets the other runnable pinned tasks of this loop run once, then resumes.
///
/// The loop runs its pinned tasks before its migratable ones within a batch (of 128 polls), so
/// a pinned task that yields in a loop lets queued migratable tasks run only when the batch
/// ends; a migratable task's yield goes behind the other migratable tasks. Cost: one re-queue at
/// the back of the loop's run queue (a thread-local push) for a pinned task; a migratable task,
/// woken during its own poll, goes to its loop's injector (a push on a shared lock-free
/// queue, where thieves can take it); no syscall.
/// A loop with nothing else runnable resumes the task at once.
#[inline]
pub fn yield_now() -> YieldNow {
    YieldNow { yielded: false }
}

/// Future of [`yield_now`].
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    // Inlined into the caller's future (another crate: a non-generic function is not, without
    // the hint): as a call it cost 17 instructions per yield (callgrind).
    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
