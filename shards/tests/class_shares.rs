//! Class share ratios, in a test binary of their own: the accounting charges wall time per
//! poll, so other tests' threads competing for the two CPUs would skew it. The checks run
//! one after the other in one test for the same reason.

mod common;
use std::{
    cell::Cell,
    io::Write,
    rc::Rc,
    time::{Duration, Instant},
};

use common::*;
use xtc_shards::{shard, task, LocalExecutor};

#[test]
fn class_shares() {
    shares_split_the_cpu_in_proportion();
    default_lane_is_not_starved();
    migratable_work_is_not_charged_to_the_default_lane();
    shares_split_time_not_polls();
}

/// 300:100 shares where the larger class's polls cost a third as much (10 µs against 30 µs):
/// time splits 3:1, so polls split 9:1. A scheduler that charged each poll a fixed cost (or
/// counted polls, not time) reads 3:1 here.
fn shares_split_time_not_polls() {
    unpreempted_runs("300:100 shares, polls of 10 us vs 30 us", || {
        let (a, b) = measure_shares_costs(Duration::from_micros(10), Duration::from_micros(30));
        let ratio = a as f64 / b as f64;
        (
            (7.0..=11.0).contains(&ratio),
            format!("{ratio:.2} ({a} vs {b})"),
        )
    });
}

/// Polls of a 300-share class whose polls burn `hi_cost` and of a 100-share one burning
/// `lo_cost`, both always runnable on one loop, once 12,000 polls ran between them.
fn measure_shares_costs(hi_cost: Duration, lo_cost: Duration) -> (u64, u64) {
    LocalExecutor::new().unwrap().block_on(async move {
        let hi = shard::create_class(300, None).unwrap();
        let lo = shard::create_class(100, None).unwrap();
        let stop = Rc::new(Cell::new(false));
        let spawn_in = |c, cost, stop: Rc<Cell<bool>>| {
            task::Builder::new().class(c).spawn_local(async move {
                while !stop.get() {
                    burn(cost);
                    xtc_shards::yield_now().await;
                }
            })
        };
        let h1 = spawn_in(hi, hi_cost, stop.clone());
        let h2 = spawn_in(lo, lo_cost, stop.clone());
        while hi.runs() + lo.runs() < 12_000 {
            xtc_shards::time::sleep(Duration::from_millis(1)).await;
        }
        stop.set(true);
        h1.await.unwrap();
        h2.await.unwrap();
        (hi.runs(), lo.runs())
    })
}

/// Two always-runnable classes, 300 and 100 shares, equal cost per poll: polls split ~3:1,
/// within 10 % (a scheduler that ignores shares reads 1:1, one that inverts them 1:3).
fn shares_split_the_cpu_in_proportion() {
    unpreempted_runs("300:100 shares", || {
        let (a, b) = measure_shares();
        let ratio = a as f64 / b as f64;
        (
            (2.7..=3.3).contains(&ratio),
            format!("{ratio:.2} ({a} vs {b})"),
        )
    });
}

/// Runs `measure` (whether a run met the check, and what it read) until a run that counts
/// meets it, and fails if the runs that count all miss.
///
/// The accounting charges wall time, so a poll during which the OS preempted the thread (a
/// loaded machine) is charged for the preemption too: a timeslice, hundreds of polls' worth.
/// The scheduler then splits the charged time as it should, but the poll counts the checks
/// compare drift (the 3:1 of [`shares_split_the_cpu_in_proportion`] towards 1:1, the larger
/// class drawing more of the rare huge charges): with other tests' builds on the two CPUs, its
/// runs read 1.5 to 2.6, and pinned to one CPU beside a CPU hog 0.98 to 2.70, where equal
/// shares read 0.85 to 1.16. A run whose thread was preempted more than [`MAX_PREEMPTIONS`]
/// times (`ru_nivcsw`), or was off the CPU for more than [`MAX_LOST`] in all (one long
/// preemption is enough: a thread with a small CPU share, niced or in a busy cgroup, loses 10
/// to 30 ms at a time, and a run preempted 9 times read 35 default-lane polls against 2,000),
/// is therefore not counted.
///
/// A counted run that meets the check passes; five runs, if one of them counted and none met
/// the check, fail (a regression misses in every run that counts). While no run has counted,
/// the runs go on for up to [`UNPREEMPTED_WITHIN`], as load comes and goes. If none counted
/// even then, the check passes unmeasured and says so where it is seen: a passing test's
/// `eprintln!` goes to the harness's capture, so such a pass used to be silent. It does not
/// fail there: beside two CPU hogs, a minute of runs of the 3:1 check had none that counted
/// (33 to 154 preemptions each), so failing would fail CI whenever its machine is busy; and
/// preempted runs cannot decide instead, as the ranges above overlap. A regression still fails
/// every run on a machine quiet enough to measure, and a loaded run never reads as a measured
/// pass.
fn unpreempted_runs(what: &str, mut measure: impl FnMut() -> (bool, String)) {
    let start = Instant::now();
    let mut seen = Vec::new();
    let mut counted = 0;
    while seen.len() < 5 || (counted == 0 && start.elapsed() < UNPREEMPTED_WITHIN) {
        let before = involuntary_switches();
        let (wall, cpu) = (Instant::now(), thread_cpu_time());
        let (met, read) = measure();
        // The runs keep the thread busy: wall time it did not run is time it was off the CPU.
        let lost = wall.elapsed().saturating_sub(thread_cpu_time() - cpu);
        let preempted = involuntary_switches() - before;
        if preempted > MAX_PREEMPTIONS || lost > MAX_LOST {
            seen.push(format!(
                "{read} (preempted {preempted} times, {lost:.1?} off the CPU: not counted)"
            ));
            continue;
        }
        if met {
            return;
        }
        counted += 1;
        seen.push(read);
    }
    assert_eq!(counted, 0, "{what}: no counted run met the check: {seen:?}");
    // Straight to the process's stderr: `eprintln!` in a passing test goes to the harness's
    // capture and is never shown.
    let _ = std::io::stderr().write_all(
        format!(
            "class_shares: WARNING: {what} NOT MEASURED: all {} runs in {:.1?} were preempted \
             more than {MAX_PREEMPTIONS} times or off the CPU more than {MAX_LOST:?} (a loaded \
             machine); passing unmeasured; the first: {:?}\n",
            seen.len(),
            start.elapsed(),
            &seen[..5]
        )
        .as_bytes(),
    );
}

/// Preemptions of the measuring thread up to which a run counts: under load, runs of
/// [`shares_split_the_cpu_in_proportion`] with up to about 15 read 2.94 to 3.04, and ones with
/// 20 to 145 read 2.37 to 3.90.
const MAX_PREEMPTIONS: i64 = 10;

/// Time off the CPU (wall time less the thread's CPU time) up to which a run counts: a
/// quiet run loses well under a millisecond; one timeslice lost is 4 ms at HZ=250.
const MAX_LOST: Duration = Duration::from_millis(3);

/// How long [`unpreempted_runs`] keeps measuring while every run was preempted.
const UNPREEMPTED_WITHIN: Duration = Duration::from_secs(10);

/// Times this thread was preempted so far (`getrusage(RUSAGE_THREAD).ru_nivcsw`).
fn involuntary_switches() -> i64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value we pass and keeps no
    // pointer to it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is valid on Linux since 2.6.26.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    usage.ru_nivcsw
}

/// One run of [`shares_split_the_cpu_in_proportion`]: the two classes' poll counts.
fn measure_shares() -> (u64, u64) {
    LocalExecutor::new().unwrap().block_on(async {
        let hi = shard::create_class(300, None).unwrap();
        let lo = shard::create_class(100, None).unwrap();
        let stop = Rc::new(Cell::new(false));
        let spawn_in = |c, stop: Rc<Cell<bool>>| {
            task::Builder::new().class(c).spawn_local(async move {
                while !stop.get() {
                    burn(Duration::from_micros(20));
                    xtc_shards::yield_now().await;
                }
            })
        };
        let h1 = spawn_in(hi, stop.clone());
        let h2 = spawn_in(lo, stop.clone());
        // Main is untagged (default lane); it checks progress in polls, not time.
        while hi.runs() + lo.runs() < 12_000 {
            xtc_shards::time::sleep(Duration::from_millis(1)).await;
        }
        stop.set(true);
        h1.await.unwrap();
        h2.await.unwrap();
        assert_eq!(hi.shares(), 300);
        assert!(hi.vruntime() > 0 && lo.vruntime() > 0);
        (hi.runs(), lo.runs())
    })
}

/// An always-runnable 1000-share class does not starve untagged tasks (default lane, 100): with
/// the main task also in the default lane, they get at least a twentieth of the class's polls.
/// Preempted runs are not counted ([`unpreempted_runs`]): a timeslice charged to the default
/// lane costs it hundreds of its polls.
fn default_lane_is_not_starved() {
    unpreempted_runs("1000-share class beside the default lane", || {
        let (class_runs, default_runs) = measure_default_lane();
        (
            default_runs * 20 >= class_runs,
            format!("default {default_runs} vs class {class_runs}"),
        )
    });
}

/// One run of [`default_lane_is_not_starved`]: the class's polls and the untagged task's.
fn measure_default_lane() -> (u64, u64) {
    LocalExecutor::new().unwrap().block_on(async {
        let big = shard::create_class(1000, None).unwrap();
        let stop = Rc::new(Cell::new(false));
        let s = stop.clone();
        let h = task::Builder::new().class(big).spawn_local(async move {
            while !s.get() {
                burn(Duration::from_micros(20));
                xtc_shards::yield_now().await;
            }
        });
        let untagged = Rc::new(Cell::new(0u64));
        let (u, s) = (untagged.clone(), stop.clone());
        let h2 = xtc_shards::spawn_local(async move {
            while !s.get() {
                burn(Duration::from_micros(20));
                u.set(u.get() + 1);
                xtc_shards::yield_now().await;
            }
        });
        while big.runs() < 3_000 {
            xtc_shards::yield_now().await;
        }
        stop.set(true);
        h.await.unwrap();
        h2.await.unwrap();
        (big.runs(), untagged.get())
    })
}

#[test]
fn set_class_refuses_a_migratable_task() {
    // Classes are lanes of one loop's pinned queue; a migratable task runs outside them, so
    // agreeing to move it would be a silent no-op.
    let ex = exec(1);
    let got = ex
        .block_on(|| async {
            let class = shard::create_class(500, None).unwrap();
            let from_migratable = xtc_shards::spawn(async move { shard::set_class(class) })
                .await
                .unwrap();
            let from_pinned = xtc_shards::spawn_local(async move { shard::set_class(class) })
                .await
                .unwrap();
            (from_migratable, from_pinned)
        })
        .unwrap();
    assert!(
        matches!(&got.0, Err(xtc_shards::Error::InvalidArgument(m)) if m.contains("pinned")),
        "{:?}",
        got.0
    );
    got.1.unwrap();
}

/// A class and the default lane, 100 shares each, both always runnable, beside a migratable
/// task that computes 3 ms per poll: the two lanes still split their polls about evenly. A
/// migratable task belongs to no lane; its CPU time was charged to the default lane, whose
/// untagged tasks then got a few percent of the class's polls (about 1:10; at least 1:2 is
/// required). Preempted runs are not counted ([`unpreempted_runs`]): a timeslice charged to
/// either lane moves the split by hundreds of polls.
fn migratable_work_is_not_charged_to_the_default_lane() {
    unpreempted_runs("class and default lane beside migratable work", || {
        let (class_runs, default_runs) = measure_beside_migratable();
        (
            default_runs * 2 >= class_runs,
            format!("default lane {default_runs} polls vs class {class_runs}"),
        )
    });
}

/// One run of [`migratable_work_is_not_charged_to_the_default_lane`]: the class's polls and
/// the default lane's.
fn measure_beside_migratable() -> (u64, u64) {
    LocalExecutor::new().unwrap().block_on(async {
        let class = shard::create_class(100, None).unwrap();
        let stop = Rc::new(Cell::new(false));
        let s = stop.clone();
        let hc = task::Builder::new().class(class).spawn_local(async move {
            let mut n = 0u64;
            while n < 2_000 {
                burn(Duration::from_micros(10));
                n += 1;
                xtc_shards::yield_now().await;
            }
            s.set(true);
            n
        });
        let untagged = Rc::new(Cell::new(0u64));
        let (u, s) = (untagged.clone(), stop.clone());
        let hd = xtc_shards::spawn_local(async move {
            while !s.get() {
                burn(Duration::from_micros(10));
                u.set(u.get() + 1);
                xtc_shards::yield_now().await;
            }
        });
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = done.clone();
        let hm = xtc_shards::spawn(async move {
            while !d.load(std::sync::atomic::Ordering::Relaxed) {
                burn(Duration::from_millis(3));
                xtc_shards::yield_now().await;
            }
        });
        let c = hc.await.unwrap();
        hd.await.unwrap();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        hm.await.unwrap();
        (c, untagged.get())
    })
}
