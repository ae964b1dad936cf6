//! The clock of per-poll timing: what a loop reads around every task poll while scheduling
//! classes or the stall watchdog are armed (`event_loop` step 4, `class::latency_due`, steal
//! rule 6's timed inline joins).
//!
//! Both need a duration per poll, and a poll of a task that yields is some 50 ns, so the
//! clock's own cost is most of what arming them costs. `std::time::Instant::now` is a
//! `clock_gettime` through the vDSO: about 25 ns on the development VM (whose kernel keeps the TSC as its clocksource), where
//! `quanta`'s calibrated reading of the CPU's time-stamp counter, scaled to nanoseconds only
//! when a duration is taken, is about 12 ns per reading and difference (`bench/RESULTS.md`).
//! quanta reads the TSC only where the CPU says it is invariant (constant rate, not stopped
//! in idle states), and xtc only where, on x86, the kernel also keeps the TSC as its own
//! clocksource (`/sys/devices/system/clocksource/clocksource0/current_clocksource`): a kernel
//! that found the counters of its CPUs out of step, or a hypervisor that moves them, switches
//! to another clocksource, and a thread that is not pinned could then read a poll as longer
//! than it was and report a stall that was not one. Otherwise, and under Miri (which models no
//! time-stamp counter), the poll clock is `Instant`, at `Instant`'s cost. Timers, sleeps and
//! everything a user sees as a point in time stay on `Instant`: a `Tick` is only ever
//! subtracted from another one of the same clock.
//!
//! The first reading in a process picks the source and calibrates the counter: 0.6 to 0.8 ms
//! on the development VM, up to quanta's deadline of 200 ms on a host too busy for its
//! measurement to settle; once per process. [`prime`] takes it where a loop would otherwise
//! take it in the middle of a poll: class creation calls it before the class exists, on the
//! creating thread (a plain thread for `Handle::create_class`; inside its own poll for a task
//! calling `shard::create_class`, which is then that call's cost, charged to no class). The
//! stall watchdog's budget takes effect at a turn's start, so its first reading is outside
//! any poll, and no task is charged for the calibration either way.
//!
//! The source is picked once: a kernel that later marks the TSC unstable (its clocksource
//! watchdog, after a VM's live migration, say) is not followed, and poll durations may then
//! be misread (a false stall report, a class charged wrongly; a negative difference reads as
//! zero). A thread that made `rdtsc` fault (`prctl(PR_SET_TSC, PR_TSC_SIGSEGV)`) gets SIGSEGV at
//! its first timed poll where the TSC is used.

use std::{sync::OnceLock, time::Duration, time::Instant};

/// A reading of the poll clock. Only the difference of two readings means anything
/// ([`Tick::since`]). Cost of [`Tick::now`]: a TSC read (or `Instant::now` where the TSC is
/// not trusted, see the module doc), the load of the process's source and a branch on it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tick(u64);

/// Where the poll clock's readings come from, chosen once per process.
#[derive(Debug)]
enum Source {
    /// quanta's calibrated counter: readings are counter ticks.
    Counter(quanta::Clock),
    /// The OS clock: readings are nanoseconds since `Instant`'s base.
    Os(Instant),
}

static SOURCE: OnceLock<Source> = OnceLock::new();

/// The process's source, picked (and the counter calibrated) by the first call.
#[inline]
fn source() -> &'static Source {
    SOURCE.get_or_init(Source::pick)
}

/// Picks the source and calibrates the counter now, if no reading was taken yet (see the
/// module doc). Cost: the calibration once per process (about 0.7 ms), then one load.
pub(crate) fn prime() {
    source();
}

impl Source {
    /// The counter where quanta and the kernel both trust it, else the OS clock.
    fn pick() -> Source {
        #[cfg(not(miri))]
        {
            let kernels = std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .ok();
            if counter_trusted(cfg!(target_arch = "x86_64"), kernels.as_deref()) {
                return Source::Counter(quanta::Clock::new());
            }
            tracing::debug!(
                "xtc: the kernel's clocksource is {:?}, not the TSC: classes and the stall \
                 watchdog time polls with the OS clock",
                kernels.as_deref().map(str::trim)
            );
        }
        Source::Os(Instant::now())
    }

    #[inline]
    fn now(&self) -> Tick {
        match self {
            Source::Counter(c) => Tick(c.raw()),
            // Nanoseconds fit a `u64` for 584 years of a process.
            Source::Os(base) => Tick(base.elapsed().as_nanos() as u64),
        }
    }

    #[inline]
    fn since(&self, later: Tick, earlier: Tick) -> Duration {
        if later.0 <= earlier.0 {
            return Duration::ZERO;
        }
        match self {
            Source::Counter(c) => c.delta(earlier.0, later.0),
            Source::Os(_) => Duration::from_nanos(later.0 - earlier.0),
        }
    }
}

/// Whether the counter may time polls: always off x86 (quanta's own checks decide: on aarch64
/// the architected counter, which keeps one rate on every CPU); on x86 unless the kernel's
/// clocksource is readable and is not `tsc`. Without sysfs (a container that hides it) the
/// CPU's invariant-TSC flag, which quanta checks, decides alone.
fn counter_trusted(x86: bool, kernels_clocksource: Option<&str>) -> bool {
    !x86 || kernels_clocksource.is_none_or(|s| s.trim() == "tsc")
}

impl Tick {
    /// Now, on the poll clock.
    #[inline]
    pub(crate) fn now() -> Tick {
        source().now()
    }

    /// The time from `earlier` to `self`; zero if `earlier` is not earlier (two CPUs' counters
    /// may differ slightly, and a thread that is not pinned can move between them).
    #[inline]
    pub(crate) fn since(self, earlier: Tick) -> Duration {
        source().since(self, earlier)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{counter_trusted, Source, Tick};

    /// Differences of `source`'s readings measure what `Instant` measures around the same
    /// interval, within a calibration's error (5 % allowed, plus 0.2 ms for the readings
    /// themselves), and never run backwards. Each reading is taken between two `Instant`s, so a
    /// thread descheduled between them widens the bounds instead of failing the test.
    fn agrees_with_instant(source: &Source) {
        let (a, t0, b) = (Instant::now(), source.now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (c, t1, d) = (Instant::now(), source.now(), Instant::now());
        let by_tick = source.since(t1, t0).as_secs_f64();
        let (shortest, longest) = (
            c.duration_since(b).as_secs_f64(),
            d.duration_since(a).as_secs_f64(),
        );
        assert!(shortest >= 0.020);
        assert!(
            by_tick >= shortest * 0.95 - 0.000_2 && by_tick <= longest * 1.05 + 0.000_2,
            "{source:?}: tick {by_tick} s, between the instants {shortest} to {longest} s"
        );
        assert_eq!(
            source.since(t0, t1),
            Duration::ZERO,
            "{source:?}: an earlier reading minus a later one"
        );
        assert_eq!(source.since(t0, t0), Duration::ZERO);
    }

    /// The process's source, whichever it picked, and each of the two explicitly (the counter
    /// only where xtc would pick it: on a host whose kernel found the CPUs' counters out of
    /// step, an unpinned thread can read them so, and xtc reads the OS clock there).
    #[test]
    fn tick_differences_agree_with_instant() {
        let (t0, t1) = (Tick::now(), Tick::now());
        assert_eq!(t0.since(t1), Duration::ZERO);
        agrees_with_instant(super::source());
        agrees_with_instant(&Source::Os(Instant::now()));
        #[cfg(not(miri))]
        if matches!(super::source(), Source::Counter(_)) {
            agrees_with_instant(&Source::Counter(quanta::Clock::new()));
        }
    }

    /// The counter is trusted off x86, and on x86 unless the kernel names another clocksource.
    #[test]
    fn the_counter_follows_the_kernels_clocksource_on_x86() {
        assert!(counter_trusted(true, Some("tsc\n")));
        assert!(
            counter_trusted(true, None),
            "no sysfs: the CPU's flag decides"
        );
        assert!(!counter_trusted(true, Some("kvm-clock\n")));
        assert!(!counter_trusted(true, Some("hpet")));
        assert!(counter_trusted(false, Some("arch_sys_counter\n")));
    }
}
