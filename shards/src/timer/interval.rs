use std::{
    future::poll_fn,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use super::{sleep_until, Sleep};

/// Ticks every `period`, the first tick at once. See [`Interval`]. A zero period (or one
/// shorter than a loop turn) ticks at most once per loop turn: a tick already due when it is
/// first polled yields to the loop first, so it cannot spin it; but a task that keeps
/// awaiting such ticks keeps its loop busy, which then never parks (a CPU at 100 %, and no
/// quiescence for `run()`). Cost: a clock read here, then as [`interval_at`].
pub fn interval(period: Duration) -> Interval {
    interval_at(Instant::now(), period)
}

/// Ticks every `period`, the first tick at `start` (a zero period: as [`interval`]). Lazy:
/// no timer is registered until the first poll. Cost: none here (no clock read, no
/// allocation); each tick as [`Interval::tick`].
pub fn interval_at(start: Instant, period: Duration) -> Interval {
    Interval {
        next: start,
        period,
        sleep: sleep_until(start),
        waited: true,
    }
}

/// A periodic timer: `tick().await` completes at `start`, `start + period`, `start + 2·period`…
///
/// Missed ticks (a loop busy for longer than a period) are skipped: the next tick is the first
/// on the schedule at or after now (one exactly at now is due, not missed), so a slow
/// consumer does not get a burst. This is tokio's
/// `MissedTickBehavior::Skip` with two differences: a tick exactly at now is due here (tokio
/// schedules the next one a period on), and any lateness skips (tokio's interval fires a tick
/// up to 5 ms late as it is). A tick that is already due when first polled (after the first
/// one) yields to the loop once before it completes, so other tasks run between ticks however
/// short the period or slow the consumer. Cost: one timer, as [`sleep`](super::sleep()), and a
/// loop turn per tick that came due before it was polled.
#[derive(Debug)]
pub struct Interval {
    next: Instant,
    period: Duration,
    sleep: Sleep,
    /// Whether this tick returned `Pending` at least once (true for the first tick, which
    /// comes at once): a tick due at its first poll yields once first.
    waited: bool,
}

impl Interval {
    /// Waits for the next tick and returns its scheduled instant (with a zero period: the
    /// instant the previous tick completed, or `start` for the first). Cost per tick: two or
    /// three clock reads (the sleep's due check, the next deadline's, and that of the next
    /// waiting poll), a field write for the next deadline (the sleep has completed, so nothing is
    /// registered to move), and at the next waiting poll a fresh timer registration on the
    /// polling loop (a heap insert, O(log n) in its live timers, and a weak reference to the
    /// loop taken and later dropped).
    ///
    /// # Panics
    /// When polled off any xtc loop (its timer needs a loop, as [`sleep`](super::sleep())'s).
    pub async fn tick(&mut self) -> Instant {
        poll_fn(|cx| self.poll_tick(cx)).await
    }

    /// Polls for the next tick. Cost: as [`tick`](Self::tick)'s per tick; a poll before the
    /// deadline costs a timer poll (no allocation).
    ///
    /// # Panics
    /// When called off any xtc loop, as [`tick`](Self::tick).
    pub fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<Instant> {
        if Pin::new(&mut self.sleep).poll(cx).is_pending() {
            self.waited = true;
            return Poll::Pending;
        }
        // Due at its first poll: wake and yield first, so other tasks run in between. Without
        // this a period shorter than a loop turn (the skip below then schedules a deadline
        // that has passed by the next poll) never returned `Pending` and held the loop for
        // good; a zero period used to panic (tokio's does). The yield ends the loop's batch
        // (as `yield_if_due`'s does), so due timers, I/O and the inbox are served before the
        // next tick: a wake alone re-queued the task in the same batch, which then ticked up
        // to 128 times before the loop looked at anything else.
        if !std::mem::replace(&mut self.waited, true) {
            crate::context::yield_ending_batch(cx.waker());
            return Poll::Pending;
        }
        self.waited = false;
        if self.period.is_zero() {
            let fired = self.next;
            self.next = Instant::now();
            return Poll::Ready(fired);
        }
        let fired = self.next;
        let next = next_tick(fired, Instant::now(), self.period);
        self.next = next;
        self.sleep.reset(next);
        Poll::Ready(fired)
    }

    /// The period. Cost: a field read.
    pub fn period(&self) -> Duration {
        self.period
    }
}

/// The tick after the one at `fired`, as seen at `now` (`period` not zero): `fired + period`,
/// or, if that has passed, the first tick on the schedule at or after `now` (the ones before
/// `now` were missed and are skipped). A tick that falls exactly on `now` is due, not missed.
fn next_tick(fired: Instant, now: Instant, period: Duration) -> Instant {
    let next = super::deadline_after(fired, period);
    if next >= now {
        return next;
    }
    // Skip the missed ticks: the next one on the schedule at or after `now`, counted from
    // `now` (from `fired`, the distance of a start centuries back overflowed a `Duration` of
    // nanoseconds, and the next tick came 30 years later). In u128 nanoseconds: a tiny period
    // after a long stall is many periods behind.
    let rem = now.duration_since(fired).as_nanos() % period.as_nanos();
    if rem == 0 {
        // `now` is on the schedule: that tick is due now.
        return now;
    }
    let rem = Duration::new((rem / 1_000_000_000) as u64, (rem % 1_000_000_000) as u32);
    super::deadline_after(now, period - rem)
}

use std::future::Future;

#[cfg(test)]
mod tests {
    use super::*;

    /// A tick that lands exactly on `now` is due, not missed: it was skipped (the comparison
    /// `next <= now` sent it to the skip, whose remainder 0 gave `now + period`).
    #[test]
    fn a_tick_exactly_at_now_is_not_skipped() {
        let p = Duration::from_millis(10);
        let t0 = Instant::now();
        // On time: the next tick is `fired + period`.
        assert_eq!(next_tick(t0, t0 + p / 2, p), t0 + p);
        // Exactly at the next tick.
        assert_eq!(next_tick(t0, t0 + p, p), t0 + p);
        // Late by whole periods: the tick at `now` is on the schedule.
        assert_eq!(next_tick(t0, t0 + 3 * p, p), t0 + 3 * p);
        // Late by a fraction: the next tick on the schedule after `now`.
        assert_eq!(next_tick(t0, t0 + p * 5 / 2, p), t0 + 3 * p);
    }
}
