//! Per-loop timers and the `xtc::time` API.
//!
//! Structure: a binary min-heap of `(deadline, key, generation)` over a slab of entries
//! (waker, generation). Insert and fire are O(log n), cancel is amortised O(1) (the slab
//! entry is removed; its heap node is skipped when it surfaces, or dropped by a rebuild once
//! such nodes outnumber the live timers). A hashed wheel would make insert O(1) but
//! costs a tick granularity and a scan of empty slots; with the loop parking precisely until the
//! heap's earliest deadline (its I/O driver's wait, `io_uring_enter` with a timeout or
//! `epoll_pwait2`, takes nanoseconds) the heap gives exact deadlines, and
//! `sleep(1ms)` overshoot is dominated by the thread wake-up, not the structure
//! (`scripts/bench --only sleep`). One exception: where `epoll_pwait2` is missing (kernels
//! before 5.11) or refused (a seccomp filter), the epoll driver waits with `epoll_wait`, in
//! whole milliseconds rounded up, so there a timer is never early but may be up to 1 ms late
//! (a `sleep(100µs)` lasts at least 1 ms; `io/epoll.rs`).

mod interval;
mod sleep;

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    task::Waker,
    time::{Duration, Instant},
};

pub use interval::{interval, interval_at, Interval};
use slab::Slab;
pub use sleep::{sleep, sleep_until, timeout, Elapsed, Sleep, Timeout};

#[derive(Debug)]
struct TimerEntry {
    waker: Waker,
    generation: u64,
}

/// One loop's timers. Loop-local.
#[derive(Debug)]
pub(crate) struct Timers {
    /// `(deadline, generation, slab key)`: ties break by generation, which counts up per
    /// loop, so timers due at the same instant fire in the order they were registered (the
    /// slab hands back freed keys last-freed-first).
    heap: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    entries: Slab<TimerEntry>,
    next_generation: u64,
}

/// Identifies a registered timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimerKey {
    key: usize,
    generation: u64,
}

impl Timers {
    /// Timers of one loop run whose generations start at `first`: the loop's
    /// `LoopShared::timer_generation`, where the previous run left off.
    pub(crate) fn new(first: u64) -> Timers {
        Timers {
            heap: BinaryHeap::new(),
            entries: Slab::new(),
            next_generation: first,
        }
    }

    /// The generation the next timer would get: where the loop's next run starts.
    pub(crate) fn next_generation(&self) -> u64 {
        self.next_generation
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn insert(&mut self, deadline: Instant, waker: Waker) -> TimerKey {
        let generation = self.next_generation;
        self.next_generation += 1;
        let key = self.entries.insert(TimerEntry { waker, generation });
        self.heap.push(Reverse((deadline, generation, key)));
        TimerKey { key, generation }
    }

    /// Whether a live timer's waker is not `waker` (so [`set_waker`](Self::set_waker) should
    /// store a clone); `Err(())` if the timer already fired. Runs no user code (`will_wake`
    /// compares pointers): a waker's clone and drop are user code (a custom waker) that may
    /// drop a sleep of this loop, which borrows the timers again, so the caller clones and
    /// drops outside its borrow.
    pub(crate) fn waker_differs(&self, t: TimerKey, waker: &Waker) -> Result<bool, ()> {
        match self.entries.get(t.key) {
            Some(e) if e.generation == t.generation => Ok(!e.waker.will_wake(waker)),
            _ => Err(()),
        }
    }

    /// Stores `waker` (cloned by the caller outside any borrow) in a live timer and returns
    /// the one it replaces, for the caller to drop after the borrow; `Err` gives `waker` back
    /// if the timer is gone.
    pub(crate) fn set_waker(&mut self, t: TimerKey, waker: Waker) -> Result<Waker, Waker> {
        match self.entries.get_mut(t.key) {
            Some(e) if e.generation == t.generation => Ok(std::mem::replace(&mut e.waker, waker)),
            _ => Err(waker),
        }
    }

    pub(crate) fn cancel(&mut self, t: TimerKey) -> Option<Waker> {
        match self.entries.get(t.key) {
            Some(e) if e.generation == t.generation => {
                let waker = self.entries.remove(t.key).waker;
                self.compact();
                Some(waker)
            }
            _ => None,
        }
    }

    /// Drops the heap nodes of cancelled timers once they outnumber the live ones (and a few
    /// dozen): otherwise every `timeout` that finished early, or `Sleep::reset`, would leave a
    /// node until its deadline surfaced (a 30 s request timeout at 100k requests/s: 3 million
    /// nodes). The rebuild is O(n) and runs after at least n/2 cancels: amortised O(1) each.
    fn compact(&mut self) {
        if self.heap.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.heap.retain(|Reverse((_, generation, key))| {
                entries
                    .get(*key)
                    .is_some_and(|e| e.generation == *generation)
            });
        }
    }

    /// The earliest live deadline, discarding cancelled heap nodes on the way.
    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((when, generation, key))) = self.heap.peek().copied() {
            match self.entries.get(key) {
                Some(e) if e.generation == generation => return Some(when),
                _ => {
                    self.heap.pop();
                }
            }
        }
        None
    }

    /// Removes every timer due at `now` and pushes its waker onto `out`.
    pub(crate) fn expire(&mut self, now: Instant, out: &mut Vec<Waker>) {
        while let Some(Reverse((when, generation, key))) = self.heap.peek().copied() {
            if when > now {
                break;
            }
            self.heap.pop();
            if let Some(e) = self.entries.get(key) {
                if e.generation == generation {
                    out.push(self.entries.remove(key).waker);
                }
            }
        }
    }

    /// Drops every timer (loop shutdown).
    pub(crate) fn clear(&mut self) -> Vec<Waker> {
        self.heap.clear();
        self.entries.drain().map(|e| e.waker).collect()
    }
}

/// About 30 years: what stands in for a deadline too far to name ([`deadline_after`]), and
/// the longest a loop parks at a time ([`park_timeout`]).
const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `t + d`, or an instant about 30 years from now where that overflows (`Duration::MAX`):
/// a deadline nobody waits for, rather than a panic on user input.
pub(crate) fn deadline_after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).unwrap_or_else(|| {
        let now = Instant::now();
        now.checked_add(FAR).unwrap_or(now)
    })
}

/// How long a loop may park given its next deadline: `None` waits for a wake ping only. At
/// most [`FAR`]: a deadline thousands of years out (`sleep(Duration::from_secs(1 << 40))`,
/// which `Instant` holds) gave a park timeout past the kernel's `ktime` range (about 292
/// years), and a kernel whose io_uring wait adds its timeout to the clock without saturating
/// would time out at once, every park, and spin. Not reproduced on the 6.18 kernel here; a
/// loop parked 30 years wakes once and parks again. Cost: a compare.
pub(crate) fn park_timeout(next: Option<Instant>, now: Instant) -> Option<Duration> {
    next.map(|d| d.saturating_duration_since(now).min(FAR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_park_lasts_at_most_thirty_years() {
        let now = Instant::now();
        let far = now + Duration::from_secs(1 << 40);
        assert_eq!(park_timeout(Some(far), now), Some(FAR));
        let soon = now + Duration::from_millis(5);
        assert_eq!(
            park_timeout(Some(soon), now),
            Some(Duration::from_millis(5))
        );
        assert_eq!(park_timeout(None, now), None);
        let stand_in = deadline_after(now, Duration::MAX) - now;
        assert!(stand_in >= FAR && stand_in < FAR + Duration::from_secs(1));
    }

    /// Timers due at the same instant fire in the order they were registered, also when the
    /// slab hands back freed keys (last freed first): the heap broke ties on the key, and
    /// after a cancel sleepers of one deadline woke in reverse.
    #[test]
    fn timers_due_together_fire_in_registration_order() {
        struct W;
        impl std::task::Wake for W {
            fn wake(self: std::sync::Arc<Self>) {}
        }
        let mut t = Timers::new(0);
        let now = Instant::now();
        // Free keys 0..8, the last freed handed back first.
        let early: Vec<_> = (0..8)
            .map(|_| t.insert(now, Waker::noop().clone()))
            .collect();
        for k in early {
            assert!(t.cancel(k).is_some());
        }
        let wakers: Vec<Waker> = (0..12)
            .map(|_| Waker::from(std::sync::Arc::new(W)))
            .collect();
        let due = now + Duration::from_millis(1);
        for w in &wakers {
            t.insert(due, w.clone());
        }
        let mut out = Vec::new();
        t.expire(due, &mut out);
        assert_eq!(out.len(), wakers.len());
        for (i, (got, want)) in out.iter().zip(&wakers).enumerate() {
            assert!(
                got.will_wake(want),
                "the timer registered {i}th fired out of order"
            );
        }
    }

    #[test]
    fn cancelled_timers_do_not_pile_up_in_the_heap() {
        let mut t = Timers::new(0);
        let now = Instant::now();
        // A live timer due first keeps the cancelled ones from surfacing.
        let live = t.insert(now + Duration::from_secs(1), Waker::noop().clone());
        for _ in 0..100_000 {
            let k = t.insert(now + Duration::from_secs(3600), Waker::noop().clone());
            assert!(t.cancel(k).is_some());
        }
        assert!(
            t.heap.len() <= 2 * t.entries.len() + 65,
            "{} nodes",
            t.heap.len()
        );
        assert_eq!(t.next_deadline(), Some(now + Duration::from_secs(1)));
        // The survivors still fire in order.
        let later = t.insert(now + Duration::from_secs(2), Waker::noop().clone());
        let mut out = Vec::new();
        t.expire(now + Duration::from_secs(1), &mut out);
        assert_eq!(out.len(), 1);
        assert!(t.cancel(live).is_none(), "fired");
        assert!(t.cancel(later).is_some());
        assert!(t.is_empty());
    }
}
