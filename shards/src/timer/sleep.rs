use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use std::sync::{Arc, Weak};

use super::TimerKey;
use crate::{context::with_core, event_loop::LoopShared};

/// Completes after `duration`. See [`sleep_until`]. A duration too long for an `Instant`
/// (`Duration::MAX`) sleeps about 30 years, as tokio's does. Cost: a clock read here, then
/// as [`sleep_until`]; nothing is registered until the first poll.
pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(super::deadline_after(Instant::now(), duration))
}

/// Completes at `deadline` (at once if it has passed). Lazy: creating it costs nothing.
///
/// "At once" is within the task's cooperative budget: a task whose sleeps keep finding their
/// deadlines passed (a rate loop whose work outlasts its period, `sleep(Duration::ZERO)` in a
/// loop) gets through 128 of them in one poll, as through 128 ready epoll calls, and then
/// yields for one loop turn, so it cannot hold its loop.
///
/// The timer lives on the loop that last polled the future (a migratable task that moves takes
/// it along), which parks until the earliest
/// deadline, so a sleep costs no CPU while it waits. Cost: a clock read, one heap insert
/// (O(log n)) and a weak reference to the loop (one uncontended atomic increment) on first
/// poll (a clock read again on a poll that finds its timer gone), one removal
/// when it fires or is dropped. Dropping the future cancels the timer, wherever it is dropped:
/// away from its loop, the cancel is sent there as a small task (none once the deadline has
/// passed: that loop fires the timer at its next turn, before it could run the cancel).
///
/// The loop fires its timers when it turns: a foreign executor that blocks the loop's thread
/// inside a task (`futures::executor::block_on(xtc::time::sleep(..))`) waits for good, as
/// tokio's timers do in the same case (cross-shard calls, join handles and shared channels
/// awaited that way do complete: their work runs on other loops). Await the sleep in the task
/// instead, or use `std::thread::sleep` where blocking the loop is meant.
///
/// # Panics
/// When polled off any xtc loop.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        deadline,
        key: None,
    }
}

/// Future of [`sleep`] and [`sleep_until`].
#[must_use = "futures do nothing unless awaited"]
pub struct Sleep {
    deadline: Instant,
    /// The loop holding the timer, weakly (a sleep must not keep a loop alive), and the key
    /// there. The loop is needed wherever the sleep is dropped or reset: off that loop, the
    /// cancel is sent to it (`cancel_elsewhere`).
    key: Option<(Weak<LoopShared>, TimerKey)>,
}

/// Whether `owner` is the loop `core` runs. A `Weak` keeps its allocation, so the address of
/// a freed loop is never another loop's.
fn is_here(core: &crate::context::Core, owner: &Weak<LoopShared>) -> bool {
    core.runs(owner.as_ptr())
}

impl Sleep {
    /// The instant this sleep completes at. Cost: a field read.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Moves the deadline. As in tokio, on the loop that holds its timer, the task that last
    /// polled the sleep keeps its wake-up: it is woken at the new deadline (at once if that has
    /// passed) without polling the sleep again first, so a sleep in a `FuturesUnordered`, reset
    /// by another branch, still wakes its task. Away from that loop (a migratable task that
    /// moved, a plain thread, another executor), the old loop cancels the timer and wakes the
    /// task at once, early: the new deadline is registered when the task next polls the
    /// sleep, so a task woken then must poll it (as `select!` and `FuturesUnordered` do) or
    /// no wake-up comes at the new deadline. Cost: a timer removal and insert (O(log n)) on
    /// the timer's loop; elsewhere, a small task sent to the old loop.
    pub fn reset(&mut self, deadline: Instant) {
        self.deadline = deadline;
        let Some((owner, k)) = self.key.take() else {
            return;
        };
        let here = with_core(|core| {
            if !is_here(core, &owner) {
                return false;
            }
            let mut timers = core.timers.borrow_mut();
            let Some(waker) = timers.cancel(k) else {
                // It fired (the task is woken already) or went with an earlier run.
                return true;
            };
            if Instant::now() < deadline {
                self.key = Some((owner.clone(), timers.insert(deadline, waker)));
            } else {
                drop(timers);
                waker.wake();
            }
            true
        });
        if here != Some(true) {
            // The old loop wakes the task, which registers the new deadline where it runs.
            cancel_elsewhere(&owner, k, true);
        }
    }

    fn cancel(&mut self) {
        if let Some((owner, k)) = self.key.take() {
            let here = with_core(|core| {
                let here = is_here(core, &owner);
                if here {
                    let waker = core.timers.borrow_mut().cancel(k);
                    drop(waker);
                }
                here
            });
            // Elsewhere, not once the deadline has passed (as `poll` does): the home loop
            // fires a due timer (step 3 of its turn) before it runs any task of that turn, so
            // the cancel task found nothing, and cost that loop a task and, if it slept, a
            // wake-up.
            if here != Some(true) && Instant::now() < self.deadline {
                cancel_elsewhere(&owner, k, false);
            }
        }
    }
}

/// Only the loop that holds a timer may touch it. A sleep dropped or reset elsewhere (a
/// migratable task that moved since it registered its sleep, a sleep sent to a plain thread or
/// to another executor's loop) sends the cancel home as a small pinned task, over the ring mesh
/// from a loop of the same executor and through the owner's inbox from anywhere else. Left
/// behind, the timer kept its loop `WAITING` until the deadline: `run()` returned that much
/// late (a 30 s `timeout` around a receive: 30 s), and the loop woke for nothing. Cost: one
/// task per such sleep, on the rare path only. With `wake` (a reset), the cancelled timer's
/// waker is woken there, so the task polls its sleep again and registers the new deadline on
/// the loop it runs on.
fn cancel_elsewhere(owner: &Weak<LoopShared>, k: TimerKey, wake: bool) {
    // A loop that is gone took its timers with it.
    let Some(home) = owner.upgrade() else {
        return;
    };
    // A timer of a run that has ended went with it (its loop stores where its generations
    // ended as the run's `Core` goes): nothing to cancel, and a task sent now would wait in
    // the loop's inbox for an unrelated later run.
    if k.generation
        < home
            .timer_generation
            .load(std::sync::atomic::Ordering::Relaxed)
    {
        return;
    }
    let Some(exec) = home.exec().upgrade() else {
        return;
    };
    if exec.stop_requested() {
        // Stopping: every loop clears its own timers in its shutdown, and a cancel sent now
        // could wait in a ring for the next run (where generations differ, so it would only
        // be wasted work).
        return;
    }
    let cancel = move || async move {
        let waker = with_core(|c| c.timers.borrow_mut().cancel(k)).flatten();
        if let (true, Some(w)) = (wake, waker) {
            w.wake();
        }
    };
    let info = crate::task::TaskInfo::here(Some(Arc::new(
        "xtc::time: cancel of a sleep dropped away from its loop".to_string(),
    )));
    drop(exec.spawn_on_open(home.index, cancel, info, 0));
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        // `None`: done. `Some((moved, k))`: pending on key `k`, on this loop; `moved` when the
        // key is new here (the loop to record then is this one).
        let registered = with_core(|core| match &self.key {
            Some((owner, k)) if is_here(core, owner) => {
                // A live timer still pending: keep the newest waker. Gone: it fired, or it
                // was registered in an earlier run of this loop, whose timers went with that
                // run (generations differ): done only if the deadline passed.
                // A waker's clone and drop are user code: neither under the borrow.
                let differs = core.timers.borrow().waker_differs(*k, cx.waker());
                match differs {
                    Ok(false) => Some((None, *k)),
                    Ok(true) => {
                        let w = cx.waker().clone();
                        let set = core.timers.borrow_mut().set_waker(*k, w);
                        match set {
                            Ok(replaced) => {
                                drop(replaced);
                                Some((None, *k))
                            }
                            // Gone while the clone ran (user code): as if found gone.
                            Err(_) if Instant::now() >= deadline => None,
                            Err(w) => Some((None, core.timers.borrow_mut().insert(deadline, w))),
                        }
                    }
                    Err(()) if Instant::now() >= deadline => None,
                    Err(()) => {
                        let w = cx.waker().clone();
                        Some((None, core.timers.borrow_mut().insert(deadline, w)))
                    }
                }
            }
            other => {
                let due = Instant::now() >= deadline;
                if let Some((owner, k)) = other {
                    // The task moved to this loop: the old timer goes (its loop cancels it),
                    // a new one is made here. Not if the deadline has passed: the old timer
                    // has fired, or fires at its loop's next turn (a spurious wake-up, which
                    // wakers allow), where a cancel cost that loop a task and, if it slept,
                    // a wake-up (a migratable task woken by its timer, then stolen).
                    if !due {
                        cancel_elsewhere(owner, *k, false);
                    }
                }
                if due {
                    None
                } else {
                    let w = cx.waker().clone();
                    let k = core.timers.borrow_mut().insert(deadline, w);
                    Some((Some(Arc::downgrade(&core.shared)), k))
                }
            }
        });
        match registered {
            None => panic!(
                "xtc::time timer (a sleep, timeout or interval) polled outside an xtc loop: \
                 await it inside a task"
            ),
            Some(None) => {
                // Due at a poll that found no timer of its own (first polled after its
                // deadline, or its timer fired): ready without a loop turn, so a task that
                // sleeps until deadlines it has fallen behind (a rate loop whose work outlasts
                // its period, or `sleep(ZERO)` in a loop) never returned `Pending` and held
                // its loop. It spends the task's budget (`context::coop_spend`, as an epoll
                // call does) and, that spent, yields once first.
                if self.key.is_none() && !crate::context::coop_spend() {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                self.key = None;
                Poll::Ready(())
            }
            Some(Some((moved, k))) => {
                if let Some(here) = moved {
                    self.key = Some((here, k));
                } else if let Some((_, key)) = &mut self.key {
                    *key = k; // same loop: its `Weak` stays
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .field("registered", &self.key.is_some())
            .finish()
    }
}

/// Runs `fut` for at most `duration`: `Err(Elapsed)` if the time runs out first (the future is
/// dropped with the `Timeout`). Each poll polls `fut` first: a future that is ready at the poll
/// where the deadline has passed (or becomes ready at once with a zero `duration`) gives
/// `Ok` with its output, as tokio's does; `Err(Elapsed)` only when `fut` is still pending at
/// a poll at or after the deadline. Cost: one timer, as [`sleep`], given up as soon as either
/// completes.
///
/// # Panics
/// When polled off any xtc loop while `fut` is pending (its timer needs a loop, as [`sleep`]'s).
pub fn timeout<F: Future>(duration: Duration, fut: F) -> Timeout<F> {
    Timeout {
        fut,
        sleep: sleep(duration),
    }
}

/// Future of [`timeout`].
#[must_use = "futures do nothing unless awaited"]
pub struct Timeout<F> {
    fut: F,
    sleep: Sleep,
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `fut` is structurally pinned (never moved out, dropped in place with `self`);
        // `sleep` is `Unpin`, so taking `&mut` to it moves nothing that is pinned.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: see above.
        let fut = unsafe { Pin::new_unchecked(&mut this.fut) };
        if let Poll::Ready(v) = fut.poll(cx) {
            // Its timer goes now, not when the `Timeout` is dropped: a completed timeout kept
            // (pinned and awaited by reference, then held) kept its loop `WAITING` until the
            // deadline, a deadlock meanwhile unreported, and woke the loop for nothing.
            this.sleep.cancel();
            return Poll::Ready(Ok(v));
        }
        match Pin::new(&mut this.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed(()))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<F> fmt::Debug for Timeout<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timeout")
            .field("deadline", &self.sleep.deadline)
            .finish()
    }
}

/// The error of a [`timeout`] that ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed(());

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}
