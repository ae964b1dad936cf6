//! Work stealing: xtc's migratable tasks beside tokio, rayon, glommio and monoio, in one run.
//!
//! Two CPUs, one shard (worker) on each. Three benchmarks:
//!
//! | benchmark | what each runtime does | reported |
//! |---|---|---|
//! | `fib` | recursive `fib(27)`, no cutoff: each level spawns `fib(n - 1)` as a task, computes `fib(n - 2)` inline, then awaits the child | ms, median of 5 runs after a warm-up |
//! | `unbalanced` | 100,000 CPU-bound tasks (2,000 rounds of arithmetic each, a few µs) all spawned from one task on shard 0, then awaited | ms, median of 5 runs after a warm-up |
//! | `idle-steal` | a 2-shard xtc executor in service mode holding one parked migratable task, for 3 s, steal backoff on and off; the same without the task as the floor | process CPU, % of one CPU |
//!
//! The runtimes:
//!
//! - **xtc**: a 2-shard `Executor` placed on the two CPUs. `fib`: `block_on` on shard 0 and
//!   `xtc::spawn` (a migratable task that the idle loop may steal) for every child, with eager
//!   rebalance on (the fork-join setting: the `block_on` task parked on shard 0 would otherwise
//!   keep that loop from stealing, as the manual says); the `xtc eager-off` column is the
//!   default, where shard 1 does nearly all the work.
//!   `unbalanced`: a task pinned to shard 0 (`spawn_on(0, ..)`) spawns every task with
//!   `xtc::spawn`, once with `stealing(true)` (the default) and once with `stealing(false)`, so
//!   the ratio of the two is what stealing buys. `idle-steal`: `service_mode(true)`, one
//!   `exec.spawn(std::future::pending())` keeping the loops on their idle tick, `steal_backoff`
//!   on and off, stopped from another thread; the `no task` column is the same executor
//!   without the parked task (its loops just park), the floor. The loops' steal counters go
//!   under the tables;
//! - **tokio**: a `multi_thread` runtime with 2 workers pinned to the two CPUs; everything runs
//!   inside one `tokio::spawn`ed task (so no work runs on the `block_on` thread), children with
//!   `tokio::spawn`;
//! - **rayon** (`fib` only): `rayon::join` on a 2-thread pool pinned to the two CPUs, the
//!   fork-join floor;
//! - **glommio**: one `LocalExecutor` with `glommio::spawn_local` on the first CPU. It cannot
//!   steal, so it uses one core: it shows what a thread-per-core runtime does without stealing;
//! - **monoio**: the same with one `FusionDriver` runtime and `monoio::spawn`;
//! - **serial** (`unbalanced` only): the same arithmetic in a plain loop on one thread, no
//!   tasks; the two-core ideal is half of it.
//!
//! One table per benchmark gives absolute numbers and ratio columns; the goals set for xtc are
//! printed under each, with whether this run met them. Only ratios mean much on a shared
//! machine. An SVG bar chart of the same numbers goes to `target/bench-steal.svg`.
//!
//! ```text
//! steal [--only fib|unbalanced|idle-steal] [--quick] [--svg PATH] [--cpus A,B]
//! ```

use std::{process::ExitCode, time::Duration};

use indicatif::{ProgressBar, ProgressStyle};
use xtc_bench::{
    allowed_cpus,
    goal::{print_goals, Goal},
    isolated, pick_cpu_pair,
    svg::Chart,
    Better, CpuUsage, Row, Table,
};

/// The benchmarks, in run order.
const BENCHES: [&str; 3] = ["fib", "unbalanced", "idle-steal"];
/// Rounds of arithmetic in one `unbalanced` task: a few microseconds.
const WORK_ITERS: u64 = 2_000;
/// Extra time the idle executor runs before the measured window, so that its start (and, after
/// the window, its stop) fall outside it.
#[cfg_attr(not(feature = "xtc"), allow(dead_code))] // used by the xtc columns only
const IDLE_MARGIN: Duration = Duration::from_millis(300);
/// `fib(27)` as measured on this machine before xtc existed: (runtime, ms).
const FIB27_BEFORE_XTC: [(&str, f64); 3] =
    [("rayon", 2.1), ("glommio 1 core", 29.0), ("tokio", 138.0)];
/// Goal: xtc's `fib` time at most this fraction of tokio's.
const GOAL_FIB_VS_TOKIO: f64 = 0.1;
/// Goal: xtc's `fib` time at most this multiple of rayon's.
const GOAL_FIB_VS_RAYON: f64 = 5.0;
/// Goal: stealing makes `unbalanced` at least this much faster on 2 cores.
const GOAL_STEAL_SPEEDUP: f64 = 1.8;
/// Goal: steal backoff cuts the idle CPU of `idle-steal` at least this many times.
const GOAL_BACKOFF_CUT: f64 = 5.0;

/// The two CPUs: shard (worker) 0 on `.0`, shard 1 on `.1`.
type Cpus = (usize, usize);

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
struct Params {
    /// `fib(n)`.
    fib_n: u32,
    /// Timed runs of `fib` and `unbalanced` (after one warm-up run); the median is reported.
    runs: usize,
    /// Tasks of one `unbalanced` run.
    tasks: u64,
    /// Measured window of `idle-steal`.
    idle: Duration,
    /// Hang guard: a run with no result by then is abandoned and reported as hung.
    deadline: Duration,
}

impl Params {
    fn full() -> Self {
        Params {
            fib_n: 27,
            runs: 5,
            tasks: 100_000,
            idle: Duration::from_secs(3),
            deadline: Duration::from_secs(60),
        }
    }

    /// A smoke run: `fib(22)`, three runs, ten times fewer tasks, a 1 s idle window.
    fn quick() -> Self {
        Params {
            fib_n: 22,
            runs: 3,
            tasks: 10_000,
            idle: Duration::from_secs(1),
            deadline: Duration::from_secs(20),
        }
    }
}

/// A measured value, plus lines that explain it (printed under the table).
#[derive(Debug)]
struct Measured<T> {
    value: T,
    notes: Vec<String>,
}

impl<T> Measured<T> {
    fn plain(value: T) -> Self {
        Measured {
            value,
            notes: Vec::new(),
        }
    }
}

/// The timed runs of `fib` or `unbalanced` (the warm-up run left out).
type RunsOut = Result<Measured<Vec<Duration>>, String>;
/// The process CPU over the `idle-steal` window.
type IdleOut = Result<Measured<CpuUsage>, String>;

/// `fib(n)` computed the plain way, to check the runtimes' answers.
fn fib_value(n: u32) -> u64 {
    let (mut a, mut b) = (0u64, 1u64);
    for _ in 0..n {
        (a, b) = (b, a + b);
    }
    a
}

/// Checks a runtime's `fib(n)`.
fn check_fib(n: u32, got: u64) -> Result<(), String> {
    let want = fib_value(n);
    if got == want {
        Ok(())
    } else {
        Err(format!("fib({n}) returned {got}, not {want}"))
    }
}

/// One `unbalanced` task's work: [`WORK_ITERS`] rounds of a linear congruential step that the
/// optimizer can neither fold nor vectorize (each round goes through `black_box`).
fn work(seed: u64) -> u64 {
    let mut x = seed;
    for i in 0..WORK_ITERS {
        x = std::hint::black_box(
            x.wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(i | 1),
        );
    }
    x
}

/// What every `unbalanced` run must add up to: the wrapping sum of `work(i)` for each task `i`.
fn checksum(tasks: u64) -> u64 {
    (0..tasks).fold(0u64, |s, i| s.wrapping_add(work(i)))
}

/// Checks the sum an `unbalanced` run got.
fn check_sum(tasks: u64, got: u64) -> Result<(), String> {
    let want = checksum_cached(tasks);
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "the {tasks} tasks summed to {got:#x}, not {want:#x}"
        ))
    }
}

/// [`checksum`], computed once per task count.
fn checksum_cached(tasks: u64) -> u64 {
    static CACHE: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, sum)) = cache.iter().find(|(n, _)| *n == tasks) {
        return sum;
    }
    let sum = checksum(tasks);
    cache.push((tasks, sum));
    sum
}

/// Runs `one` once to warm up, then `runs` more times, and returns the timed ones.
fn timed_runs<E>(
    runs: usize,
    mut one: impl FnMut() -> Result<Duration, E>,
) -> Result<Vec<Duration>, E> {
    one()?;
    (0..runs).map(|_| one()).collect()
}

/// [`timed_runs`] inside a runtime: `one()` awaited once to warm up, then `runs` more times;
/// each result goes through `check` outside the timed part.
async fn timed_runs_async<T, Fut: std::future::Future<Output = T>>(
    runs: usize,
    mut one: impl FnMut() -> Fut,
    check: impl Fn(T) -> Result<(), String>,
) -> Result<Vec<Duration>, String> {
    let mut out = Vec::with_capacity(runs);
    for i in 0..=runs {
        let t0 = std::time::Instant::now();
        let v = one().await;
        let took = t0.elapsed();
        check(v)?;
        if i > 0 {
            out.push(took);
        }
    }
    Ok(out)
}

/// `unbalanced` on a runtime whose spawn returns a plain handle of the task's `u64` (glommio,
/// monoio): the timed runs of spawning every task with `spawn`, then summing their results.
async fn unbalanced_runs<H: std::future::Future<Output = u64>>(
    p: Params,
    spawn: impl Fn(u64) -> H,
) -> Result<Vec<Duration>, String> {
    let all = || {
        let handles: Vec<H> = (0..p.tasks).map(&spawn).collect();
        async move {
            let mut sum = 0u64;
            for h in handles {
                sum = sum.wrapping_add(h.await);
            }
            sum
        }
    };
    timed_runs_async(p.runs, all, |sum| check_sum(p.tasks, sum)).await
}

/// `12.3 12.1 12.9 ms`: the timed runs in milliseconds.
fn runs_line(runs: &[Duration]) -> String {
    let ms: Vec<String> = runs
        .iter()
        .map(|d| xtc_bench::fmt_num(d.as_secs_f64() * 1e3))
        .collect();
    format!("{} ms", ms.join(" "))
}

/// The rayon fork-join floor and the serial loop.
mod floor {
    use std::time::{Duration, Instant};

    use super::{check_fib, check_sum, timed_runs, work, Cpus, Measured, Params, RunsOut};

    fn fib(n: u32) -> u64 {
        if n < 2 {
            return n as u64;
        }
        // Like the async versions: the first closure runs inline, the second is queued where
        // the other worker may steal it.
        let (b, a) = rayon::join(|| fib(n - 2), || fib(n - 1));
        a + b
    }

    /// `rayon::join` on a 2-thread pool, thread `i` pinned to CPU `i` of `cpus`.
    pub(super) fn rayon_fib(cpus: Cpus, p: Params) -> RunsOut {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .thread_name(|i| format!("steal-rayon-{i}"))
            .start_handler(move |i| {
                // Not pinned is a valid, noisier run.
                let _ = xtc_bench::pin_current_thread(if i == 0 { cpus.0 } else { cpus.1 });
            })
            .build()
            .map_err(|e| e.to_string())?;
        let n = p.fib_n;
        let runs = pool.install(|| {
            timed_runs(p.runs, || {
                let t0 = Instant::now();
                let v = fib(n);
                let took = t0.elapsed();
                check_fib(n, v).map(|()| took)
            })
        })?;
        Ok(Measured::plain(runs))
    }

    /// The tasks' work in a plain loop on the caller's thread (pinned by the harness).
    pub(super) fn serial(p: Params) -> RunsOut {
        let runs = timed_runs(p.runs, || {
            let t0 = Instant::now();
            let sum = (0..p.tasks).fold(0u64, |s, i| s.wrapping_add(work(i)));
            let took: Duration = t0.elapsed();
            check_sum(p.tasks, sum).map(|()| took)
        })?;
        Ok(Measured::plain(runs))
    }
}

/// A `multi_thread` runtime with 2 pinned workers.
mod tokio_rt {
    use std::{
        future::Future,
        pin::Pin,
        sync::atomic::{AtomicUsize, Ordering::Relaxed},
    };

    use super::{check_fib, check_sum, timed_runs_async, work, Cpus, Measured, Params, RunsOut};

    fn fib(n: u32) -> Pin<Box<dyn Future<Output = u64> + Send>> {
        Box::pin(async move {
            if n < 2 {
                return n as u64;
            }
            let child = tokio::spawn(fib(n - 1));
            let b = fib(n - 2).await;
            child.await.expect("a fib child task failed") + b
        })
    }

    /// Runs `body` as one spawned task (on a worker, not on the `block_on` thread) of a
    /// 2-worker runtime whose workers are pinned to the two CPUs.
    fn on_worker<T, F>(cpus: Cpus, body: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, String>> + Send + 'static,
    {
        let started = AtomicUsize::new(0);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .on_thread_start(move || {
                // The two workers are the first threads the runtime starts (nothing here uses
                // the blocking pool). Not pinned is a valid, noisier run.
                let cpu = if started.fetch_add(1, Relaxed) == 0 {
                    cpus.0
                } else {
                    cpus.1
                };
                let _ = xtc_bench::pin_current_thread(cpu);
            })
            .build()
            .map_err(|e| e.to_string())?;
        let main = rt.spawn(body);
        rt.block_on(main).map_err(|e| e.to_string())?
    }

    pub(super) fn fib_runs(cpus: Cpus, p: Params) -> RunsOut {
        let n = p.fib_n;
        let runs = on_worker(cpus, async move {
            timed_runs_async(p.runs, || fib(n), |v| check_fib(n, v)).await
        })?;
        Ok(Measured::plain(runs))
    }

    pub(super) fn unbalanced(cpus: Cpus, p: Params) -> RunsOut {
        let runs = on_worker(cpus, async move {
            let all = || async move {
                let handles: Vec<_> = (0..p.tasks)
                    .map(|t| tokio::spawn(async move { work(t) }))
                    .collect();
                let mut sum = 0u64;
                for h in handles {
                    sum = sum.wrapping_add(h.await.map_err(|e| e.to_string())?);
                }
                Ok::<_, String>(sum)
            };
            timed_runs_async(p.runs, all, |sum| check_sum(p.tasks, sum?)).await
        })?;
        Ok(Measured::plain(runs))
    }
}

/// One `LocalExecutor`: no stealing, one core.
mod glommio_rt {
    use std::{future::Future, pin::Pin};

    use glommio::{LocalExecutorBuilder, Placement};

    use super::{check_fib, timed_runs_async, unbalanced_runs, work, Measured, Params, RunsOut};

    fn fib(n: u32) -> Pin<Box<dyn Future<Output = u64>>> {
        Box::pin(async move {
            if n < 2 {
                return n as u64;
            }
            let child = glommio::spawn_local(fib(n - 1));
            let b = fib(n - 2).await;
            child.await + b
        })
    }

    pub(super) fn fib_runs(p: Params) -> RunsOut {
        // Unbound: the benchmark thread is already pinned by the harness.
        let ex = LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .map_err(|e| e.to_string())?;
        let n = p.fib_n;
        let runs =
            ex.run(async move { timed_runs_async(p.runs, || fib(n), |v| check_fib(n, v)).await })?;
        Ok(Measured::plain(runs))
    }

    /// Every task spawned and run on the one executor (it cannot steal).
    pub(super) fn unbalanced(p: Params) -> RunsOut {
        let ex = LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .map_err(|e| e.to_string())?;
        let runs = ex.run(async move {
            unbalanced_runs(p, |t| glommio::spawn_local(async move { work(t) })).await
        })?;
        Ok(Measured::plain(runs))
    }
}

/// One monoio runtime (`FusionDriver`): no stealing, one core, like glommio's column.
mod monoio_rt {
    use std::{future::Future, pin::Pin};

    use super::{check_fib, timed_runs_async, unbalanced_runs, work, Measured, Params, RunsOut};

    fn fib(n: u32) -> Pin<Box<dyn Future<Output = u64>>> {
        Box::pin(async move {
            if n < 2 {
                return n as u64;
            }
            let child = monoio::spawn(fib(n - 1));
            let b = fib(n - 2).await;
            child.await + b
        })
    }

    fn block_on<T>(fut: impl Future<Output = T>) -> Result<T, String> {
        let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(rt.block_on(fut))
    }

    pub(super) fn fib_runs(p: Params) -> RunsOut {
        let n = p.fib_n;
        let runs =
            block_on(
                async move { timed_runs_async(p.runs, || fib(n), |v| check_fib(n, v)).await },
            )??;
        Ok(Measured::plain(runs))
    }

    pub(super) fn unbalanced(p: Params) -> RunsOut {
        let runs = block_on(async move {
            unbalanced_runs(p, |t| monoio::spawn(async move { work(t) })).await
        })??;
        Ok(Measured::plain(runs))
    }
}

/// The xtc columns, against the `xtc` facade crate.
#[cfg(feature = "xtc")]
mod xtc_rt {
    use std::{future::Future, pin::Pin, time::Duration, time::Instant};

    use xtc_bench::CpuMeter;

    use super::{check_fib, check_sum, work, Cpus, IdleOut, Measured, Params, RunsOut};

    fn fib(n: u32) -> Pin<Box<dyn Future<Output = u64> + Send>> {
        Box::pin(async move {
            if n < 2 {
                return n as u64;
            }
            let child = xtc::spawn(fib(n - 1));
            let b = fib(n - 2).await;
            child.await.expect("a fib child task failed") + b
        })
    }

    /// A 2-shard builder placed on the two CPUs, shard 0 on `cpus.0`.
    fn builder(cpus: Cpus) -> xtc::Builder {
        xtc::Executor::builder()
            .shards(2)
            .placement(xtc::numa::Policy::Cpus(vec![cpus.0, cpus.1]))
    }

    fn build(b: xtc::Builder) -> Result<xtc::Executor, String> {
        b.build().map_err(|e| e.to_string())
    }

    /// Both loops' counters.
    fn stats(exec: &xtc::Handle) -> Result<[xtc::LoopStats; 2], String> {
        let one = |shard| exec.loop_stats(shard).map_err(|e| e.to_string());
        Ok([one(0)?, one(1)?])
    }

    /// The steal counters of both loops between two snapshots, divided by `per` (runs).
    fn steal_line(
        what: &str,
        before: &[xtc::LoopStats; 2],
        after: &[xtc::LoopStats; 2],
        per: u64,
    ) -> String {
        let mut line = format!("xtc {what}:");
        for shard in 0..2 {
            let (b, a) = (&before[shard], &after[shard]);
            let d = |f: fn(&xtc::LoopStats) -> u64| f(a).saturating_sub(f(b)) / per.max(1);
            line.push_str(&format!(
                " shard {shard}: {} polls, {} steals, {} stolen from it, {} failed steal \
                 attempts, {} parks;",
                d(|s| s.polls),
                d(|s| s.steals),
                d(|s| s.stolen_from),
                d(|s| s.steal_attempts_failed),
                d(|s| s.parks),
            ));
        }
        line.pop();
        line
    }

    /// `block_on` on shard 0; every child an `xtc::spawn`ed migratable task. `eager`: eager
    /// rebalance, without which shard 0 never steals (the parked `block_on` task is a parked
    /// pinned task, and by the manual only a fully idle loop steals).
    pub(super) fn fib_runs(cpus: Cpus, p: Params, eager: bool) -> RunsOut {
        let exec = build(builder(cpus).eager_rebalance(eager))?;
        let before = stats(&exec)?;
        let n = p.fib_n;
        let runs = exec
            .block_on(move || async move {
                let mut runs = Vec::with_capacity(p.runs);
                for i in 0..=p.runs {
                    let t0 = Instant::now();
                    let v = fib(n).await;
                    let took = t0.elapsed();
                    check_fib(n, v)?;
                    if i > 0 {
                        runs.push(took);
                    }
                }
                Ok::<_, String>(runs)
            })
            .map_err(|e| e.to_string())??;
        let after = stats(&exec)?;
        let what = format!("fib({n}), per run (warm-up included)");
        Ok(Measured {
            value: runs,
            notes: vec![steal_line(&what, &before, &after, p.runs as u64 + 1)],
        })
    }

    /// A task pinned to shard 0 spawns every task with `xtc::spawn` and awaits them all; one
    /// `run()` per timed run.
    pub(super) fn unbalanced(cpus: Cpus, p: Params, stealing: bool) -> RunsOut {
        let exec = build(builder(cpus).stealing(stealing))?;
        let one = || -> Result<Duration, String> {
            let tasks = p.tasks;
            let main = exec
                .spawn_on(0, move || async move {
                    let t0 = Instant::now();
                    let handles: Vec<_> = (0..tasks)
                        .map(|t| xtc::spawn(async move { work(t) }))
                        .collect();
                    let mut sum = 0u64;
                    for h in handles {
                        sum = sum.wrapping_add(h.await.map_err(|e| e.to_string())?);
                    }
                    Ok::<_, String>((t0.elapsed(), sum))
                })
                .map_err(|e| e.to_string())?;
            exec.run().map_err(|e| e.to_string())?;
            // `run` returned at quiescence, so the task is done and its handle ready.
            let (took, sum) = futures::executor::block_on(main).map_err(|e| e.to_string())??;
            check_sum(tasks, sum)?;
            Ok(took)
        };
        // Warm-up outside the counted window.
        one()?;
        let before = stats(&exec)?;
        let runs = (0..p.runs).map(|_| one()).collect::<Result<Vec<_>, _>>()?;
        let after = stats(&exec)?;
        let what = format!(
            "unbalanced, stealing {}, per run",
            if stealing { "on" } else { "off" }
        );
        Ok(Measured {
            value: runs,
            notes: vec![steal_line(&what, &before, &after, p.runs as u64)],
        })
    }

    /// Service mode, steal backoff `backoff`, and with `parked_task` one parked migratable task;
    /// process CPU over `window`, measured from another thread that then stops the executor.
    pub(super) fn idle(cpus: Cpus, window: Duration, backoff: bool, parked_task: bool) -> IdleOut {
        let exec = build(builder(cpus).service_mode(true).steal_backoff(backoff))?;
        // Never completes: keeps a migratable task alive, so idle loops stay on their idle tick.
        let parked = parked_task.then(|| exec.spawn(std::future::pending::<()>()));
        let handle = exec.handle();
        let watcher = std::thread::Builder::new()
            .name("steal-idle-watch".into())
            .spawn(move || {
                // Let the shards start and settle before measuring.
                std::thread::sleep(super::IDLE_MARGIN);
                let before = stats(&handle);
                let meter = CpuMeter::start();
                std::thread::sleep(window);
                let usage = meter.stop();
                let after = stats(&handle);
                handle.stop();
                Ok::<_, String>((usage, before?, after?))
            })
            .map_err(|e| format!("could not spawn a thread: {e}"))?;
        let ran = exec.run().map_err(|e| e.to_string());
        let watched = watcher.join().map_err(|p| xtc_bench::panic_message(&*p))?;
        ran?;
        let (usage, before, after) = watched?;
        // Stopped: the pending task was dropped with the run; nothing to await.
        drop(parked);
        let what = format!(
            "idle, {}, over the {:.1} s window",
            match (parked_task, backoff) {
                (false, _) => "no task",
                (true, true) => "backoff on",
                (true, false) => "backoff off",
            },
            window.as_secs_f64()
        );
        Ok(Measured {
            value: usage,
            notes: vec![steal_line(&what, &before, &after, 1)],
        })
    }
}

/// Stand-in for the xtc columns when the bench is built without its `xtc` feature.
#[cfg(not(feature = "xtc"))]
mod xtc_rt {
    use std::time::Duration;

    use super::{Cpus, IdleOut, Params, RunsOut};

    const NOT_BUILT: &str = "xtc-bench built without its `xtc` feature";

    pub(super) fn fib_runs(_: Cpus, _: Params, _: bool) -> RunsOut {
        Err(NOT_BUILT.into())
    }

    pub(super) fn unbalanced(_: Cpus, _: Params, _: bool) -> RunsOut {
        Err(NOT_BUILT.into())
    }

    pub(super) fn idle(_: Cpus, _: Duration, _: bool, _: bool) -> IdleOut {
        Err(NOT_BUILT.into())
    }
}

fn usage() -> &'static str {
    "usage: steal [--only fib|unbalanced|idle-steal] [--quick] [--svg PATH] [--cpus A,B]\n\
     \n  --only B     run one benchmark\
     \n  --quick      a smoke run: fib(22), 3 runs, 10x fewer tasks, a 1 s idle window\
     \n  --svg PATH   where to write the bar chart (default: <workspace>/target/bench-steal.svg)\
     \n  --cpus A,B   the two CPUs: shard 0 on A, shard 1 on B (default: the first two allowed)"
}

/// One benchmark's results: its own table (its columns differ from the others'), the goal
/// lines and the notes its runs left.
struct Filled {
    table: Table,
    goals: Vec<Goal>,
    notes: Vec<String>,
}

/// Keeps the notes of a run and passes its value on.
fn keep<T>(notes: &mut Vec<String>, r: Result<Measured<T>, String>) -> Result<T, String> {
    r.map(|m| {
        notes.extend(m.notes);
        m.value
    })
}

/// The median of timed runs in ms; their list goes to the notes under `label`.
fn median_ms(notes: &mut Vec<String>, label: &str, r: RunsOut) -> Result<f64, String> {
    let runs = keep(notes, r)?;
    notes.push(format!("{label} runs: {}", runs_line(&runs)));
    xtc_bench::median(&runs)
        .map(|d| d.as_secs_f64() * 1e3)
        .ok_or_else(|| "no timed run".to_string())
}

/// `fib` on xtc, tokio, rayon and glommio.
fn run_fib(cpus: Cpus, p: Params, bar: &ProgressBar) -> Filled {
    let cols = [
        "xtc",
        "tokio",
        "rayon",
        "glommio",
        "monoio",
        "xtc eager-off",
    ];
    let mut notes = Vec::new();
    let guard = p.deadline;
    let mut values = Vec::with_capacity(cols.len());
    for (i, name) in cols.iter().enumerate() {
        bar.set_message(format!("fib / {name}"));
        let r = match i {
            0 => isolated(None, guard, move || xtc_rt::fib_runs(cpus, p, true)),
            5 => isolated(None, guard, move || xtc_rt::fib_runs(cpus, p, false)),
            1 => isolated(None, guard, move || tokio_rt::fib_runs(cpus, p)),
            2 => isolated(None, guard, move || floor::rayon_fib(cpus, p)),
            3 => isolated(Some(cpus.0), guard, move || glommio_rt::fib_runs(p)),
            4 => isolated(Some(cpus.0), guard, move || monoio_rt::fib_runs(p)),
            _ => unreachable!("one arm per column"),
        };
        values.push(median_ms(&mut notes, &format!("fib / {name}"), r));
        bar.inc(1);
    }
    let mut table = Table::new(
        cols.iter().map(|s| s.to_string()).collect(),
        0,
        vec![1, 2, 3, 4],
    );
    table.push(Row {
        name: format!("fib({}) fork-join, 2 workers (glommio, monoio 1)", p.fib_n),
        unit: "ms".into(),
        better: Better::Lower,
        values,
    });
    let row = &table.rows[0];
    let goals = vec![
        Goal::ratio(
            5,
            "fib: xtc (eager_rebalance on, not the default)/tokio",
            true,
            GOAL_FIB_VS_TOKIO,
            table.ratio(row, 1),
        ),
        Goal::ratio(
            5,
            "fib: xtc (eager_rebalance on, not the default)/rayon",
            true,
            GOAL_FIB_VS_RAYON,
            table.ratio(row, 2),
        ),
    ];
    if p.fib_n == 27 {
        let before: Vec<String> = FIB27_BEFORE_XTC
            .iter()
            .map(|(rt, ms)| format!("{rt} {ms} ms"))
            .collect();
        notes.push(format!(
            "fib(27) measured on this machine before xtc existed: {}",
            before.join(", ")
        ));
    }
    Filled {
        table,
        goals,
        notes,
    }
}

/// `unbalanced` on xtc with stealing on and off, tokio, glommio and monoio (one core each: they
/// cannot steal), and the serial loop.
fn run_unbalanced(cpus: Cpus, p: Params, bar: &ProgressBar) -> Filled {
    let cols = [
        "xtc",
        "xtc no-steal",
        "tokio",
        "glommio",
        "monoio",
        "serial",
    ];
    let mut notes = Vec::new();
    let guard = p.deadline;
    // Compute the checksum once up front, outside every timed run.
    bar.set_message("unbalanced / checksum");
    let tasks = p.tasks;
    let _ = isolated(Some(cpus.0), guard, move || Ok(checksum_cached(tasks)));
    let mut values = Vec::with_capacity(cols.len());
    for (i, name) in cols.iter().enumerate() {
        bar.set_message(format!("unbalanced / {name}"));
        let r = match i {
            0 => isolated(None, guard, move || xtc_rt::unbalanced(cpus, p, true)),
            1 => isolated(None, guard, move || xtc_rt::unbalanced(cpus, p, false)),
            2 => isolated(None, guard, move || tokio_rt::unbalanced(cpus, p)),
            3 => isolated(Some(cpus.0), guard, move || glommio_rt::unbalanced(p)),
            4 => isolated(Some(cpus.0), guard, move || monoio_rt::unbalanced(p)),
            5 => isolated(Some(cpus.0), guard, move || floor::serial(p)),
            _ => unreachable!("one arm per column"),
        };
        values.push(median_ms(&mut notes, &format!("unbalanced / {name}"), r));
        bar.inc(1);
    }
    let mut table = Table::new(
        cols.iter().map(|s| s.to_string()).collect(),
        0,
        vec![1, 2, 3, 4, 5],
    );
    table.push(Row {
        name: format!(
            "{} tasks x {WORK_ITERS} rounds, all spawned on shard 0",
            p.tasks
        ),
        unit: "ms".into(),
        better: Better::Lower,
        values,
    });
    let row = &table.rows[0];
    // Speedup = no-steal time / steal time: the inverse of the xtc/xtc no-steal ratio.
    let speedup = table.ratio(row, 1).filter(|r| *r > 0.0).map(|r| 1.0 / r);
    let goals = vec![Goal::ratio(
        5,
        "unbalanced: stealing speedup (xtc no-steal/xtc)",
        false,
        GOAL_STEAL_SPEEDUP,
        speedup,
    )];
    Filled {
        table,
        goals,
        notes,
    }
}

/// `idle-steal`: xtc's idle CPU with steal backoff on and off, and the floor: the same
/// executor without the parked migratable task, whose loops have no idle tick to keep.
fn run_idle(cpus: Cpus, p: Params, bar: &ProgressBar) -> Filled {
    let cols = ["backoff on", "backoff off", "no task"];
    let mut notes = Vec::new();
    let guard = p.deadline;
    let window = p.idle;
    let mut values = Vec::with_capacity(cols.len());
    for (i, name) in cols.iter().enumerate() {
        bar.set_message(format!("idle-steal / {name}"));
        let (backoff, parked_task) = (i == 0, i < 2);
        // Not pinned: the executor pins its own loops.
        let r = isolated(None, guard, move || {
            xtc_rt::idle(cpus, window, backoff, parked_task)
        });
        values.push(keep(&mut notes, r).map(|u| u.percent_of_one_cpu()));
        bar.inc(1);
    }
    let mut table = Table::new(cols.iter().map(|s| s.to_string()).collect(), 0, vec![1, 2]);
    table.push(Row {
        name: format!(
            "xtc idle, 2 shards, 1 parked migratable task, {:.1}s",
            window.as_secs_f64()
        ),
        unit: "% of 1 CPU".into(),
        better: Better::Lower,
        values,
    });
    let row = &table.rows[0];
    // Cut = CPU with backoff off / CPU with it on: the inverse of the on/off ratio.
    let cut = table.ratio(row, 1).filter(|r| *r > 0.0).map(|r| 1.0 / r);
    let what = "idle: CPU cut by steal backoff (off/on)";
    let goals = vec![match (&row.values[0], &row.values[1]) {
        // No CPU measured at all with backoff on (under a clock tick in the window): as good
        // as it gets, not a missing value (the ratio has no finite figure).
        (Ok(on), Ok(off)) if *on == 0.0 && *off > 0.0 => Goal::judged(
            5,
            what,
            format!(">= {GOAL_BACKOFF_CUT:.2}x"),
            format!("no CPU measured with backoff on ({off:.3} % off)"),
            Some(true),
        ),
        _ => Goal::ratio(5, what, false, GOAL_BACKOFF_CUT, cut),
    }];
    Filled {
        table,
        goals,
        notes,
    }
}

/// Progress-bar steps of a benchmark.
fn steps_of(bench: &str) -> u64 {
    match bench {
        "fib" => 6,
        "unbalanced" => 6,
        "idle-steal" => 3,
        _ => unreachable!("benchmark names are checked when parsing"),
    }
}

fn main() -> ExitCode {
    let args =
        match xtc_bench::BenchArgs::parse("steal", &BENCHES, xtc_bench::CpuOption::Pair, usage()) {
            Ok(a) => a,
            Err(code) => return code,
        };
    let p = if args.quick {
        Params::quick()
    } else {
        Params::full()
    };
    let benches = args.selected(&BENCHES);
    let allowed = allowed_cpus();
    let cpus = match pick_cpu_pair(args.cpus, &allowed) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("steal: {e}");
            return ExitCode::from(2);
        }
    };

    println!("steal: work stealing, xtc beside tokio, rayon, glommio and monoio");
    println!(
        "  mode: {}   shard/worker 0 on cpu {}, 1 on cpu {}   allowed cpus: {allowed:?}",
        if args.quick {
            "quick (fib(22), 3 runs, 10x fewer tasks, 1 s idle)"
        } else {
            "full"
        },
        cpus.0,
        cpus.1,
    );
    println!("  xtc I/O driver: {}", xtc_bench::xtc_io_driver());
    println!(
        "  fib({}) and {} unbalanced tasks: median of {} runs after a warm-up; idle-steal: a {:.1} s \
         window",
        p.fib_n,
        p.tasks,
        p.runs,
        p.idle.as_secs_f64()
    );
    println!(
        "  xtc = 2-shard Executor, xtc::spawn (migratable); tokio = multi_thread, 2 workers, \
         tokio::spawn; rayon = rayon::join, 2 threads; glommio = 1 LocalExecutor, spawn_local, \
         and monoio = 1 runtime, monoio::spawn (they cannot steal: 1 core); serial = the same \
         work in a plain loop on 1 thread"
    );
    if !cfg!(feature = "xtc") {
        println!("  NOTE: built without the `xtc` feature: the xtc columns are empty");
    }

    let bar = ProgressBar::new(benches.iter().map(|b| steps_of(b)).sum());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .expect("static progress template is valid"),
    );
    let mut filled = Vec::new();
    for bench in &benches {
        filled.push(match *bench {
            "fib" => run_fib(cpus, p, &bar),
            "unbalanced" => run_unbalanced(cpus, p, &bar),
            "idle-steal" => run_idle(cpus, p, &bar),
            _ => unreachable!("benchmark names are checked when parsing"),
        });
    }
    bar.finish_and_clear();

    for f in &filled {
        println!();
        print!("{}", f.table.render());
        print_goals(&f.goals);
        for line in &f.notes {
            println!("  {line}");
        }
    }
    println!();
    println!(
        "  ratios are first-column/peer of the values: below 1 is better for the first column \
         where `better` is lower"
    );

    let chart = Chart {
        title: "xtc work stealing".into(),
        subtitle: format!(
            "{} run, shards on cpus {} and {}",
            if args.quick { "quick" } else { "full" },
            cpus.0,
            cpus.1
        ),
        panels: filled.iter().flat_map(|f| f.table.panels()).collect(),
    };
    chart.write_and_report("steal", &args.svg)
}
