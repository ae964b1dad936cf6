//! Per-loop counters: written by the loop alone (plain loads and stores, no read-modify-write),
//! read by anyone as a lock-free snapshot. A snapshot itself makes two atomic maximums (the
//! busy and idle totals it reports, so no later snapshot reports less), on words of their own
//! that the loop never writes.

use std::time::{Duration, Instant};

use crate::sync::{
    fence, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// A snapshot of one loop's counters, from [`Handle::loop_stats`](crate::Handle::loop_stats).
/// Every count is a total over all the runs of the executor so far.
///
/// Fields are read one by one without a lock, so a snapshot taken while the loop runs may mix
/// values from adjacent loop turns. `busy` and `idle` never decrease from one snapshot to the
/// next (one taken while the loop is between updating them repeats the earlier value), so
/// `later.idle - earlier.idle` is safe. Cost of taking one: about two dozen relaxed atomic
/// loads (the busy/idle clock under a seqlock, retried while the loop updates it), two atomic
/// maximums and a clock read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoopStats {
    /// Tasks that finished on this loop (completed, panicked or were cancelled), and the
    /// migratable tasks that first parked on it and were still parked when a run ended
    /// (dropped after the loops stopped, on no loop; a migratable task dropped from a queue
    /// then, never having parked, counts nowhere). Note: the reference manual's `tasks_run`
    /// counts task *steps*; that is [`polls`](Self::polls) here.
    pub tasks_run: u64,
    /// Task polls (steps) the loop executed.
    pub polls: u64,
    /// Time the loop spent out of its idle park since it first started.
    pub busy: Duration,
    /// Time the loop spent parked, waiting for work.
    pub idle: Duration,
    /// Timers that fired on this loop.
    pub timers_fired: u64,
    /// Times the loop parked (went to sleep waiting for work or a timer).
    pub parks: u64,
    /// Messages taken from the loop's inbox (spawns and wakes from other threads), those its
    /// shutdown takes included (dropped unrun after a requested stop).
    pub inbox_received: u64,
    /// Pinned tasks alive on the loop that have parked at least once (registered there: the
    /// deadlock report's list). Not counted: a task queued that has not parked yet, and any
    /// migratable task (registered with its executor, not a loop).
    pub live_tasks: u64,
    /// Messages this loop sent to other shards over the ring mesh (spawns, `submit_to`, wakes).
    pub messages_sent: u64,
    /// Messages this loop received from other shards over the ring mesh, those a run's end
    /// took out of its rings unreceived included (dropped unrun after a stop, as its inbox's).
    pub messages_received: u64,
    /// Times a task of this loop waited for space on a full ring.
    pub ring_full_waits: u64,
    /// Wake pings this loop sent to sleeping peers for the ring mesh (messages it pushed, room
    /// it freed in a full ring). Pings for migratable work (a nudge of an idle peer, a spawn
    /// placed on a sleeping loop) and stop requests are not counted here.
    pub notifications_sent: u64,
    /// Migratable tasks this loop stole from peers.
    pub steals: u64,
    /// Migratable tasks peers stole from this loop.
    pub stolen_from: u64,
    /// Steal attempts on a victim that looked non-empty but yielded nothing.
    pub steal_attempts_failed: u64,
    /// Task polls run on the spot by a [`JoinHandle`](crate::JoinHandle) awaited in a
    /// migratable task, inside the awaiting task's poll (work-first join, `steal/mod.rs`
    /// rule 6): each saved the awaiting task a park and a wake-up. One await may run its task
    /// more than once, when the task parks and is woken back onto the top of the deque.
    /// Counted in `polls` too.
    pub joins_inlined: u64,
    /// Task polls the stall watchdog reported on this loop (as
    /// [`Handle::stall_count`](crate::Handle::stall_count), which answers 0 for a shard that
    /// does not exist where `loop_stats` gives an error).
    pub stalls: u64,
    /// I/O operations submitted (io_uring) or readiness waits armed (epoll).
    pub io_submitted: u64,
    /// I/O completions reaped (io_uring) or readiness waits that an event ended (epoll: an
    /// event no task waited for, such as the `EPOLLOUT` a socket reports as it joins the set,
    /// counts none, nor does a wait ended another way, a drop or a shutdown; so this is at most
    /// `io_submitted`).
    pub io_completed: u64,
    /// The loop's I/O driver (`None` before it first ran, or if the OS refused both).
    pub io_driver: Option<crate::io::Driver>,
}

impl LoopStats {
    /// Fraction of time spent idle, 0.0–1.0 (HPX's idle rate); 0 before the loop ever ran.
    /// Cost: a few floating-point operations.
    pub fn idle_rate(&self) -> f64 {
        // In floating point: the fields are public, and a sum of two `Duration`s can overflow.
        let (idle, busy) = (self.idle.as_secs_f64(), self.busy.as_secs_f64());
        if idle + busy == 0.0 {
            0.0
        } else {
            idle / (idle + busy)
        }
    }
}

/// The shared, atomic side of one loop's stats.
#[derive(Debug)]
pub(crate) struct StatsCell {
    base: Instant,
    pub(crate) tasks_run: AtomicU64,
    pub(crate) polls: AtomicU64,
    pub(crate) timers_fired: AtomicU64,
    pub(crate) parks: AtomicU64,
    pub(crate) inbox_received: AtomicU64,
    pub(crate) live_tasks: AtomicU64,
    pub(crate) messages_sent: AtomicU64,
    pub(crate) messages_received: AtomicU64,
    /// Of `messages_sent`, those the loop's shutdown took out of the mesh for a loop that had
    /// stopped (`ring::evacuate`): never received over a ring, so the quiescence check takes
    /// them off the sent ones. Not in [`LoopStats`].
    pub(crate) messages_handed_over: AtomicU64,
    pub(crate) ring_full_waits: AtomicU64,
    pub(crate) notifications_sent: AtomicU64,
    pub(crate) steals: AtomicU64,
    pub(crate) steal_attempts_failed: AtomicU64,
    pub(crate) joins_inlined: AtomicU64,
    pub(crate) io_submitted: AtomicU64,
    pub(crate) io_completed: AtomicU64,
    /// 0 unknown, 1 io_uring, 2 epoll.
    pub(crate) io_driver: AtomicU64,
    /// Accumulated run time of finished runs, ns.
    run_ns: AtomicU64,
    /// Accumulated idle time, ns.
    idle_ns: AtomicU64,
    /// When the current run started (ns since `base`, +1 so 0 means "not running").
    running_since: AtomicU64,
    /// When the current park started (ns since `base`, +1 so 0 means "not parked").
    parked_since: AtomicU64,
    /// Sequence of the four clock fields above (a seqlock; one writer, the loop): odd while
    /// the loop updates them. A snapshot retries until it read them all between two equal even
    /// values, so it never sees a park's end half done (the park missing, counted as busy).
    clock_seq: AtomicU64,
    /// The largest `idle` and `busy` (ns) any snapshot reported: what keeps them monotonic
    /// against the small overshoot of extrapolating a park or run still in progress.
    reported_idle: AtomicU64,
    reported_busy: AtomicU64,
}

/// Single-writer increment: a load and a store, no RMW (only the owning loop writes).
pub(crate) fn bump(a: &AtomicU64, by: u64) {
    if by != 0 {
        a.store(a.load(Relaxed) + by, Relaxed);
    }
}

impl StatsCell {
    pub(crate) fn new(base: Instant) -> StatsCell {
        StatsCell {
            base,
            tasks_run: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            timers_fired: AtomicU64::new(0),
            parks: AtomicU64::new(0),
            inbox_received: AtomicU64::new(0),
            live_tasks: AtomicU64::new(0),
            messages_sent: AtomicU64::new(0),
            messages_received: AtomicU64::new(0),
            messages_handed_over: AtomicU64::new(0),
            ring_full_waits: AtomicU64::new(0),
            notifications_sent: AtomicU64::new(0),
            steals: AtomicU64::new(0),
            steal_attempts_failed: AtomicU64::new(0),
            joins_inlined: AtomicU64::new(0),
            io_submitted: AtomicU64::new(0),
            io_completed: AtomicU64::new(0),
            io_driver: AtomicU64::new(0),
            run_ns: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            running_since: AtomicU64::new(0),
            parked_since: AtomicU64::new(0),
            clock_seq: AtomicU64::new(0),
            reported_idle: AtomicU64::new(0),
            reported_busy: AtomicU64::new(0),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64 + 1
    }

    /// Updates the clock fields under the seqlock (the loop's thread only). Cost: two
    /// stores and a fence, once per park and per run boundary.
    fn write_clock(&self, update: impl FnOnce()) {
        let seq = self.clock_seq.load(Relaxed);
        self.clock_seq.store(seq + 1, Relaxed);
        fence(Release);
        update();
        self.clock_seq.store(seq + 2, Release);
    }

    pub(crate) fn started(&self, now: Instant) {
        let now = self.ns(now);
        self.write_clock(|| self.running_since.store(now, Relaxed));
    }

    /// Ends the current run; a park still open (a panic unwound out of it) ends with it.
    pub(crate) fn stopped(&self, now: Instant) {
        let now = self.ns(now);
        self.write_clock(|| {
            let since = self.running_since.swap(0, Relaxed);
            if since != 0 {
                bump(&self.run_ns, now.saturating_sub(since));
            }
            let parked = self.parked_since.swap(0, Relaxed);
            if parked != 0 {
                bump(&self.idle_ns, now.saturating_sub(parked));
            }
        });
    }

    pub(crate) fn park_begin(&self, now: Instant) {
        bump(&self.parks, 1);
        self.park_begin_at(self.ns(now));
    }

    pub(crate) fn park_end(&self, now: Instant) {
        self.park_end_at(self.ns(now));
    }

    /// [`park_begin`](Self::park_begin) at `now` ns (+1) since `base` (the loom model's clock).
    fn park_begin_at(&self, now: u64) {
        self.write_clock(|| self.parked_since.store(now, Relaxed));
    }

    /// [`park_end`](Self::park_end) at `now` ns (+1) since `base`.
    fn park_end_at(&self, now: u64) {
        self.write_clock(|| {
            let since = self.parked_since.load(Relaxed);
            self.parked_since.store(0, Relaxed);
            bump(&self.idle_ns, now.saturating_sub(since));
        });
    }

    /// `(idle, total)` ns at `now`: a consistent read of the clock fields (seqlock), with the
    /// park or run in progress extrapolated to `now`.
    fn read_clock(&self, now: u64) -> (u64, u64) {
        loop {
            let seq = self.clock_seq.load(Acquire);
            if seq & 1 == 1 {
                crate::sync::spin_hint();
                continue;
            }
            let mut idle = self.idle_ns.load(Relaxed);
            let parked = self.parked_since.load(Relaxed);
            let mut total = self.run_ns.load(Relaxed);
            let since = self.running_since.load(Relaxed);
            fence(Acquire);
            if self.clock_seq.load(Relaxed) != seq {
                crate::sync::spin_hint();
                continue;
            }
            if parked != 0 {
                idle += now.saturating_sub(parked);
            }
            if since != 0 {
                total += now.saturating_sub(since);
            }
            return (idle, total);
        }
    }

    /// The loop's counters, with the two kept elsewhere: `stolen_from` (written by thieves)
    /// and `stalls` (the stall watchdog's count).
    pub(crate) fn snapshot(&self, stolen_from: u64, stalls: u64) -> LoopStats {
        /// `value`, or the largest one reported before if that is larger.
        fn monotonic(reported: &AtomicU64, value: u64) -> u64 {
            reported.fetch_max(value, Relaxed).max(value)
        }
        let (idle, total) = self.read_clock(self.ns(Instant::now()));
        LoopStats {
            tasks_run: self.tasks_run.load(Relaxed),
            polls: self.polls.load(Relaxed),
            busy: Duration::from_nanos(monotonic(&self.reported_busy, total.saturating_sub(idle))),
            idle: Duration::from_nanos(monotonic(&self.reported_idle, idle)),
            timers_fired: self.timers_fired.load(Relaxed),
            parks: self.parks.load(Relaxed),
            inbox_received: self.inbox_received.load(Relaxed),
            live_tasks: self.live_tasks.load(Relaxed),
            messages_sent: self.messages_sent.load(Relaxed),
            messages_received: self.messages_received.load(Relaxed),
            ring_full_waits: self.ring_full_waits.load(Relaxed),
            notifications_sent: self.notifications_sent.load(Relaxed),
            steals: self.steals.load(Relaxed),
            stolen_from,
            steal_attempts_failed: self.steal_attempts_failed.load(Relaxed),
            joins_inlined: self.joins_inlined.load(Relaxed),
            stalls,
            io_submitted: self.io_submitted.load(Relaxed),
            io_completed: self.io_completed.load(Relaxed),
            io_driver: match self.io_driver.load(Relaxed) {
                1 => Some(crate::io::Driver::IoUring),
                2 => Some(crate::io::Driver::Epoll),
                _ => None,
            },
        }
    }
}

/// Loom model of the clock seqlock: a snapshot never sees a park's end half done.
#[cfg(all(test, loom))]
mod loom_stats {
    use loom::{sync::Arc, thread};

    use super::StatsCell;

    /// The loop parks from 10 to 20 while another thread reads the clock twice at 15. Whole
    /// states give idle 0 (before), 5 (parked since 10) or 10 (after); a read between the end's
    /// two stores gave 0 after a read had seen the park: the park lost.
    #[test]
    fn loom_stats_snapshot_never_loses_a_park() {
        loom::model(|| {
            let stats = Arc::new(StatsCell::new(std::time::Instant::now()));
            let s2 = stats.clone();
            let writer = thread::spawn(move || {
                s2.park_begin_at(10);
                s2.park_end_at(20);
            });
            let (first, _) = stats.read_clock(15);
            let (second, _) = stats.read_clock(15);
            writer.join().unwrap();
            assert!([0, 5, 10].contains(&first), "torn read: {first}");
            assert!([0, 5, 10].contains(&second), "torn read: {second}");
            assert!(
                !(first > 0 && second == 0),
                "the park was lost: {first} then {second}"
            );
        });
    }
}
