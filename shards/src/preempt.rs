//! CPU-time preemption: [`yield_if_due`] yields only when this worker's CPU-time tick fired (or a
//! latency class is waiting longer than its bound), so a long computation that checks it is
//! time-sliced without a hand-tuned budget. Code that never checks is unaffected.

use std::{
    future::Future,
    pin::Pin,
    sync::atomic::Ordering::Relaxed,
    task::{Context, Poll},
};

use crate::{context::with_core, sys::cputimer::DUE};

/// Yields if this loop's preemption tick has fired since the last yield, or if a task of a
/// latency class is runnable and the current task has run longer than that class's bound;
/// otherwise completes at once.
///
/// Cost when not due: one thread-local load (plus, when a latency class exists, one clock read).
/// When due: one re-queue, as [`yield_now`](crate::yield_now).
pub fn yield_if_due() -> YieldIfDue {
    YieldIfDue { yielded: false }
}

/// Future of [`yield_if_due`].
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub struct YieldIfDue {
    yielded: bool,
}

/// Whether the current task should yield now.
pub(crate) fn is_due() -> bool {
    // A load first: the common answer (not due) costs no locked instruction. A tick landing
    // between the load and the store is folded into this yield.
    let due = DUE.with(|d| {
        let due = d.load(Relaxed);
        if due {
            d.store(false, Relaxed);
        }
        due
    });
    if due {
        return true;
    }
    with_core(crate::class::latency_due).unwrap_or(false)
}

impl Future for YieldIfDue {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded || !is_due() {
            return Poll::Ready(());
        }
        self.yielded = true;
        // End the loop's batch after this poll, so due timers, rings and the inbox are served
        // before this task runs again (otherwise the batch would re-poll it at once).
        with_core(|c| c.end_batch.set(true));
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
