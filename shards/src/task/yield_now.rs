use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

/// Lets the other runnable tasks of this loop run once, then resumes.
///
/// Cost: one re-queue at the back of the loop's run queue (a thread-local push); no syscall.
/// A loop with nothing else runnable resumes the task at once.
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

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
