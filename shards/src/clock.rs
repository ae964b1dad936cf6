//! The clock of per-poll timing: what a loop reads around every task poll while scheduling
//! classes or the stall watchdog are armed (`event_loop` step 4, `class::latency_due`, steal
//! rule 6's timed inline joins).
//!
//! Both need a duration per poll, and a poll of a task that yields is some 50 ns, so the
//! clock's own cost is most of what arming them costs. `std::time::Instant::now` is a
//! `clock_gettime` through the vDSO: about 25 ns on the development VM (kvm-clock), where
//! `quanta`'s calibrated reading of the CPU's time-stamp counter, scaled to nanoseconds only
//! when a duration is taken, is about 12 ns per reading and difference (`bench/RESULTS.md`).
//! quanta reads the TSC only where the CPU says it is invariant (constant rate, not stopped
//! in idle states) and otherwise reads the OS clock itself, so the fallback is what
//! `Instant` costs. Timers, sleeps and everything a user sees as a point in time stay on
//! `Instant`: a `Tick` is only ever subtracted from another one of the same clock.
//!
//! The first reading in a process calibrates the clock (about 0.7 ms, once); it is taken
//! before the first timed poll starts, so no task is charged for it. Under Miri, which models
//! no time-stamp counter, a `Tick` is an `Instant`.

use std::time::Duration;

/// A reading of the poll clock. Only the difference of two readings means anything
/// ([`Tick::since`]). Cost of [`Tick::now`]: a TSC read (or the OS clock where the TSC is not
/// invariant) and the load of the process's calibrated clock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tick(#[cfg(not(miri))] u64, #[cfg(miri)] std::time::Instant);

#[cfg(not(miri))]
static CLOCK: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();

/// The process's calibrated clock, calibrated by the first call.
#[cfg(not(miri))]
#[inline]
fn clock() -> &'static quanta::Clock {
    CLOCK.get_or_init(quanta::Clock::new)
}

impl Tick {
    /// Now, on the poll clock.
    #[inline]
    pub(crate) fn now() -> Tick {
        #[cfg(not(miri))]
        return Tick(clock().raw());
        #[cfg(miri)]
        return Tick(std::time::Instant::now());
    }

    /// The time from `earlier` to `self`; zero if `earlier` is not earlier (two CPUs' counters
    /// may differ slightly, and a thread that is not pinned can move between them).
    #[inline]
    pub(crate) fn since(self, earlier: Tick) -> Duration {
        #[cfg(not(miri))]
        {
            if self.0 <= earlier.0 {
                return Duration::ZERO;
            }
            clock().delta(earlier.0, self.0)
        }
        #[cfg(miri)]
        self.0.saturating_duration_since(earlier.0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::Tick;

    /// A `Tick` difference measures what `Instant` measures around the same interval, within
    /// the calibration's error (5 % allowed, plus 0.2 ms for the readings themselves), and never
    /// runs backwards. Each `Tick` is read between two `Instant`s, so a thread descheduled
    /// between the readings widens the bounds instead of failing the test.
    #[test]
    fn tick_differences_agree_with_instant() {
        let (a, t0, b) = (Instant::now(), Tick::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (c, t1, d) = (Instant::now(), Tick::now(), Instant::now());
        let by_tick = t1.since(t0).as_secs_f64();
        let (shortest, longest) = (
            c.duration_since(b).as_secs_f64(),
            d.duration_since(a).as_secs_f64(),
        );
        assert!(shortest >= 0.020);
        assert!(
            by_tick >= shortest * 0.95 - 0.000_2 && by_tick <= longest * 1.05 + 0.000_2,
            "tick {by_tick} s, between the instants {shortest} to {longest} s"
        );
        assert_eq!(
            t0.since(t1),
            Duration::ZERO,
            "a later reading minus an earlier one"
        );
        assert_eq!(t0.since(t0), Duration::ZERO);
    }
}
