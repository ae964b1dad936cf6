//! Per-loop timers and the `xtc::time` API.
//!
//! Structure: a binary min-heap of `(deadline, key, generation)` over a slab of entries
//! (deadline, waker, generation). Insert and fire are O(log n), cancel is O(1) (the slab entry is
//! removed; its heap node is skipped when it surfaces). A hashed wheel would make insert O(1) but
//! costs a tick granularity and a scan of empty slots; with the loop parking precisely until the
//! heap's earliest deadline (ppoll has nanosecond resolution) the heap gives exact deadlines, and
//! `sleep(1ms)` overshoot is dominated by the thread wake-up, not the structure
//! (`scripts/bench -- --only sleep`).

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
    heap: BinaryHeap<Reverse<(Instant, usize, u64)>>,
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
    pub(crate) fn new() -> Timers {
        Timers {
            heap: BinaryHeap::new(),
            entries: Slab::new(),
            next_generation: fresh_generations(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn insert(&mut self, deadline: Instant, waker: Waker) -> TimerKey {
        let generation = self.next_generation;
        self.next_generation += 1;
        let key = self.entries.insert(TimerEntry { waker, generation });
        self.heap.push(Reverse((deadline, key, generation)));
        TimerKey { key, generation }
    }

    /// Replaces the waker of a live timer; `false` if it already fired.
    pub(crate) fn update(&mut self, t: TimerKey, waker: &Waker) -> bool {
        match self.entries.get_mut(t.key) {
            Some(e) if e.generation == t.generation => {
                if !e.waker.will_wake(waker) {
                    e.waker = waker.clone();
                }
                true
            }
            _ => false,
        }
    }

    pub(crate) fn cancel(&mut self, t: TimerKey) -> Option<Waker> {
        match self.entries.get(t.key) {
            Some(e) if e.generation == t.generation => Some(self.entries.remove(t.key).waker),
            _ => None,
        }
    }

    /// The earliest live deadline, discarding cancelled heap nodes on the way.
    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((when, key, generation))) = self.heap.peek().copied() {
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
        while let Some(Reverse((when, key, generation))) = self.heap.peek().copied() {
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

/// The first generation of a new `Timers` (a new loop run): each run takes its own range, the
/// top 24 bits, from a process-wide counter, so a `TimerKey` of an earlier run (a cancel sent
/// home by a moved sleep that only arrives in the next run) matches no timer of a later one.
/// Each range holds 2^40 timers.
fn fresh_generations() -> u64 {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xFF_FFFF;
    run << 40
}

/// `t + d`, or an instant about 30 years from now where that overflows (`Duration::MAX`):
/// a deadline nobody waits for, rather than a panic on user input.
pub(crate) fn deadline_after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).unwrap_or_else(|| {
        const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
        let now = Instant::now();
        now.checked_add(FAR).unwrap_or(now)
    })
}

/// How long a loop may park given its next deadline: `None` waits for a wake ping only.
pub(crate) fn park_timeout(next: Option<Instant>, now: Instant) -> Option<Duration> {
    next.map(|d| d.saturating_duration_since(now))
}
