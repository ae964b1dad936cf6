//! CPU-time preemption: [`yield_if_due`] yields only when this worker's CPU-time tick fired (or a
//! latency class is waiting longer than its bound), so a long computation that checks it is
//! time-sliced without a hand-tuned budget. Code that never checks is unaffected.

use std::{
    future::Future,
    pin::Pin,
    sync::atomic::Ordering::Relaxed,
    task::{Context, Poll},
};

use crate::{
    context::{with_core, Core},
    sys::cputimer::{CpuTimer, DUE},
};

/// Yields if this loop's preemption tick has fired since the current poll began (a tick
/// earned before it, by another task or the loop's idle spin, is dropped as the poll starts),
/// or if a task of a
/// latency class is runnable and the current task has run longer than that class's bound (a
/// wake still on its way to the loop counts: a due timer, a message in the inbox or a ring, an
/// io_uring completion); otherwise completes at once.
///
/// Cost when not due: two thread-local reads, a load of the executor's interval and one of the
/// loop's count of classes; once the loop has classes, also a look at each class lane (a
/// borrow and a scan for the smallest latency bound) and, where a latency class exists, one
/// clock read (the TSC) and, once the task has run past that bound, a look at the loop's
/// pending wakes (inbox, rings, I/O completions) and its next timer (a second clock read, the
/// OS clock).
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
    with_core(|core| {
        // A poll that loops on `yield_if_due` never lets its loop turn: the interval set
        // meanwhile is picked up here too, or switching preemption on never reached it. So
        // are classes created for this loop meanwhile (`Handle::create_class`, or another
        // shard, whose first task arrives over the ring): never picked up, a latency class
        // waited for the whole computation.
        sync_timer(core);
        core.sync_classes(false);
        crate::class::latency_due(core)
    })
    .unwrap_or(false)
}

/// Drops a tick delivered before a poll starts, called as each poll starts: the timer counts
/// the worker's CPU time, whichever task (or the loop's own spin before parking) used it, and
/// left pending such a tick made the next task's first `yield_if_due` yield before it had
/// done any work. Dropped only after the idle spin, a task that never checks (a hog, or a
/// batch of short polls) earned ticks that cut a checking task's slice down to one unit of
/// work per turn. Only a tick already delivered: the kernel checks CPU-time timers at its
/// scheduler tick, so one earned before can still arrive just after this (rare; restarting
/// the timer per poll would cost a system call). Cost: a cell read; with preemption on, a
/// thread-local store.
pub(crate) fn forget_idle_tick(core: &Core) {
    if core.preempt_ns.get() != 0 {
        DUE.with(|d| d.store(false, Relaxed));
    }
}

/// Arms, re-arms or disarms this loop's CPU-time timer when the executor's interval
/// (`Handle::set_preempt`) differs from the one it armed: at each loop turn and each
/// `yield_if_due` that is not due, so a change reaches running loops. A `LocalExecutor`
/// arms none. Cost: a load and a compare.
pub(crate) fn sync_timer(core: &Core) {
    let want = core.exec.preempt_ns();
    if want != core.preempt_ns.get() {
        rearm(core, want);
    }
}

#[cold]
fn rearm(core: &Core, want: u64) {
    // Recorded first, failure or not: a refused timer is tried again only for a new interval,
    // not every turn (one warning per setting).
    core.preempt_ns.set(want);
    // Deleted before the new one is made (and outside the borrow: nothing here is user code,
    // but the cell is not borrowed across a system call either).
    let old = core.preempt_timer.borrow_mut().take();
    drop(old);
    // A tick the old timer delivered and no `yield_if_due` took: left set, it outlived a
    // switch to off (`forget_idle_tick` clears only while preemption is on), and the next
    // `yield_if_due` on this worker yielded, in whatever poll, however much later. Cleared
    // after the delete: by its return no tick of that timer can still arrive (a signal still
    // pending is discarded or has been handled).
    DUE.with(|d| d.store(false, Relaxed));
    if want == 0 || core.exec.is_local() {
        return;
    }
    match CpuTimer::arm(
        std::time::Duration::from_nanos(want),
        core.exec.preempt_signal(),
    ) {
        Ok(t) => *core.preempt_timer.borrow_mut() = Some(t),
        Err(e) => tracing::warn!(
            shard = core.index(),
            "xtc: could not arm the preemption timer ({e}): this worker runs without \
             preemption (yield_if_due yields only for latency classes); allow timer_create and \
             timer_settime (a seccomp filter), raise RLIMIT_SIGPENDING, or set XTC_PREEMPT=0"
        ),
    }
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
        crate::context::yield_ending_batch(cx.waker());
        Poll::Pending
    }
}
