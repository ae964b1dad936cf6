//! Single-shard benchmarks: xtc beside a raw floor, tokio, glommio, monoio and bare async-task, in
//! one run.
//!
//! | benchmark | what each runtime does | reported |
//! |---|---|---|
//! | `spawn` | spawn 1,000,000 trivial local tasks, then await every handle | M tasks/s (median of 5 runs after a warm-up) |
//! | `yield` | 1,000 tasks each `yield_now` 1,000 times, checked to interleave | M yield switches/s (median of 5 runs after a warm-up) |
//! | `sleep` | 2,000 sequential `sleep(1ms)`, overshoot past 1 ms (a sleep that returns early makes the column `n/a`) | p50 and p99 in µs |
//! | `idle`  | an idle two-thread runtime for 3 s | process CPU, % of one CPU; context switches of the process in the window (the meter's own sleep is one) |
//!
//! Each runtime runs on a fresh thread (pinned to one CPU for the single-shard benchmarks), so
//! one runtime's thread-locals and failures never reach the next. The runtimes:
//!
//! - **xtc**: `LocalExecutor` + `spawn_local` + `yield_now` + `time::sleep`; for `idle`, a 2-shard
//!   `Executor` in service mode with nothing to do;
//! - **raw**: the floor. For `spawn`/`yield`, the least an executor can do: tasks (one `Rc`
//!   allocation each) in a `VecDeque`, a task re-queued whenever it returns `Pending`, no wakers
//!   at all. For `sleep`, `std::thread::sleep`. For `idle`, two threads in `std::thread::sleep`;
//! - **tokio**: `current_thread` runtime + `LocalSet` + `spawn_local` + `tokio::task::yield_now`;
//!   for `idle`, a `multi_thread` runtime with 2 workers;
//! - **glommio**: `LocalExecutor` + `glommio::spawn_local` + `executor().yield_now()` (an
//!   unconditional re-schedule; `yield_if_needed` would not yield at all here); for `idle`, two
//!   `LocalExecutor`s each awaiting a sleep;
//! - **monoio**: `FusionDriver` runtime with the timer + `monoio::spawn` + a self-waking yield
//!   future; for `idle`, two runtimes each sleeping.
//! - **async-task**: a second floor for `spawn`/`yield`: xtc's task crate on a bare `VecDeque` of
//!   `Runnable`s, its wakers real (a wake pushes the task back), no runtime around it. It costs
//!   what xtc's tasks cost without xtc's loop, registry and stats, so `xtc/async-task` is what
//!   xtc's own layers cost, and `async-task/monoio` how far the task crate alone is from monoio's
//!   hand-written task. No figure for `sleep` and `idle` (no timer, no threads).
//!
//! `yield` counts every yield and checks that nine in ten let another task run before the
//! yielding one resumed; a runtime whose yields do not switch tasks gets `n/a` with the reason. monoio does
//! not: a task that wakes itself while it runs goes to the front of its queue and is polled
//! again at once, so its self-waking yield measures re-polls of one task, not switches.
//!
//! The table gives absolute numbers and `xtc/peer` ratios; only the ratios mean much on a shared
//! machine. An SVG bar chart of the same numbers goes to `target/bench-local.svg`.
//!
//! ```text
//! local [--only spawn|yield|sleep|idle] [--quick] [--svg PATH] [--cpu N]
//! ```

use std::{
    cell::Cell,
    future::Future,
    pin::Pin,
    process::ExitCode,
    task::{Context, Poll},
    time::Duration,
};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use xtc_bench::{
    allowed_cpus,
    goal::{print_goals, Goal},
    isolated,
    svg::Chart,
    Better, CpuUsage, LatencySummary, Row, Table,
};

/// The runtimes, in column order. xtc first: its ratios are printed.
const RUNTIMES: [&str; 6] = ["xtc", "raw", "tokio", "glommio", "monoio", "async-task"];
/// Column indices of `RUNTIMES` that xtc is divided by, in print order.
const RATIOS_VS: [usize; 5] = [4, 2, 3, 1, 5];
/// Column indices of the runtimes the goals read.
const XTC: usize = 0;
const TOKIO: usize = 2;
const MONOIO: usize = 4;
/// The benchmarks, in run order.
const BENCHES: [&str; 4] = ["spawn", "yield", "sleep", "idle"];
/// How long one asked sleep lasts.
const SLEEP: Duration = Duration::from_millis(1);
/// Extra time idle runtimes stay alive past the measured window, so that their start and
/// teardown fall outside it.
const IDLE_MARGIN: Duration = Duration::from_millis(300);

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
struct Params {
    spawn_tasks: usize,
    yield_tasks: usize,
    yields_per_task: usize,
    sleeps: usize,
    idle: Duration,
    /// Hang guard: a run with no result by then is abandoned and reported as hung.
    deadline: Duration,
}

impl Params {
    fn full() -> Self {
        Params {
            spawn_tasks: 1_000_000,
            yield_tasks: 1_000,
            yields_per_task: 1_000,
            sleeps: 2_000,
            idle: Duration::from_secs(3),
            deadline: Duration::from_secs(60),
        }
    }

    /// Ten times fewer iterations (and a ten times shorter idle window): a smoke run.
    fn quick() -> Self {
        Params {
            spawn_tasks: 100_000,
            yield_tasks: 1_000,
            yields_per_task: 100,
            sleeps: 200,
            idle: Duration::from_millis(300),
            deadline: Duration::from_secs(15),
        }
    }
}

fn usage() -> &'static str {
    "usage: local [--only spawn|yield|sleep|idle] [--quick] [--svg PATH] [--cpu N]\n\
     \n  --only B     run one benchmark\
     \n  --quick      ten times fewer iterations (smoke run)\
     \n  --svg PATH   where to write the bar chart (default: <workspace>/target/bench-local.svg)\
     \n  --cpu N      CPU to pin the single-shard runs to (default: the first allowed one)"
}

/// A future that wakes itself and returns `Pending` exactly once: an unconditional yield to the
/// scheduler, for runtimes without one of their own.
#[derive(Debug, Default)]
struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            Poll::Ready(())
        } else {
            self.yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

thread_local! {
    /// Yields done so far by the `yield` benchmark's tasks in this run (each runtime runs on a
    /// fresh thread; its runs reset the count).
    static YIELD_STEPS: Cell<u64> = const { Cell::new(0) };
    /// Yields after which another task had yielded since this task's previous one: switches.
    static SWITCHED: Cell<u64> = const { Cell::new(0) };
}

/// One yield of a `yield` benchmark task done; `last` is the count after this task's previous
/// one (every runtime's tasks count the same way).
fn yielded(last: &mut u64) {
    let now = YIELD_STEPS.with(Cell::get);
    if now != *last {
        SWITCHED.with(|c| c.set(c.get() + 1));
    }
    YIELD_STEPS.with(|c| c.set(now + 1));
    *last = now + 1;
}

/// A `yield` benchmark task starts: the yield count now.
fn yield_task_start() -> u64 {
    YIELD_STEPS.with(Cell::get)
}

/// After a `yield` run: `Err` unless nine yields in ten let another task run before the
/// yielding one resumed, so a `yield_now` that does not give the CPU away (or only now and
/// then) cannot post a fast, meaningless figure.
fn check_interleaved(p: Params) -> Result<(), String> {
    let steps = YIELD_STEPS.with(Cell::get);
    let switched = SWITCHED.with(Cell::get);
    let want = (p.yield_tasks * p.yields_per_task) as u64;
    if steps != want {
        return Err(format!("{steps} yields counted, {want} expected"));
    }
    if switched * 10 < steps * 9 {
        return Err(format!(
            "only {switched} of {steps} yields let another task run first: the runtime \
             polled the self-woken task again before the others (monoio queues it at the \
             front), so this is no task-switch rate"
        ));
    }
    Ok(())
}

/// Checks the spawn+join workload's answer: the sum of the `n` tasks' outputs, each its
/// index, so a runtime whose handles resolved without running their tasks (or ran one twice)
/// fails instead of looking fast. Not timed.
fn check_spawn_sum(n: usize, sum: u64) -> Result<(), String> {
    let n = n as u64;
    let want = n * n.saturating_sub(1) / 2;
    if sum == want {
        Ok(())
    } else {
        Err(format!(
            "spawn+join: the tasks' outputs summed to {sum}, not {want}"
        ))
    }
}

fn yield_now() -> YieldNow {
    YieldNow::default()
}

/// The `spawn` workload of the two floors, whose handles resolve to the task's output itself:
/// `p.spawn_tasks` trivial tasks spawned with `$spawn`, each returning its index, then each
/// awaited; the future's output is the time both took and the sum of the outputs
/// ([`check_spawn_sum`]). A macro, not a generic function: each floor's `spawn` is generic
/// over the task's future, whose type (an `async` block's) a function could not name.
macro_rules! spawn_join_floor {
    ($p:expr, $spawn:ident) => {{
        let n = $p.spawn_tasks;
        async move {
            let mut handles = Vec::with_capacity(n);
            let t0 = std::time::Instant::now();
            for i in 0..n as u64 {
                handles.push($spawn(async move { i }));
            }
            let mut sum = 0;
            for h in handles {
                sum += h.await;
            }
            (t0.elapsed(), sum)
        }
    }};
}

/// The `yield` workload of the two floors (see [`spawn_join_floor`]): `p.yield_tasks` tasks
/// spawned with `$spawn`, each yielding `p.yields_per_task` times and counting its yields,
/// then each awaited; the future's output is the time both took.
macro_rules! yields_floor {
    ($p:expr, $spawn:ident) => {{
        let p: Params = $p;
        async move {
            let mut handles = Vec::with_capacity(p.yield_tasks);
            let t0 = std::time::Instant::now();
            for _ in 0..p.yield_tasks {
                handles.push($spawn(async move {
                    let mut last = super::yield_task_start();
                    for _ in 0..p.yields_per_task {
                        super::yield_now().await;
                        super::yielded(&mut last);
                    }
                }));
            }
            for h in handles {
                h.await;
            }
            t0.elapsed()
        }
    }};
}

/// Records the overshoot of one `sleep(SLEEP)` that took `took`; `Err` if it returned before
/// `SLEEP` had passed, so that a runtime whose timers fire early gets `n/a` with the reason
/// instead of a perfect overshoot of 0.
fn record_overshoot(h: &mut Histogram<u64>, took: Duration) -> Result<(), String> {
    if took < SLEEP {
        return Err(format!(
            "sleep({SLEEP:?}) returned after {took:?}: early, so no overshoot to measure"
        ));
    }
    xtc_bench::record(h, took - SLEEP);
    Ok(())
}

/// An idle thread's word to [`idle_pair`] that its runtime is up: [`Ready::signal`], once.
/// Dropped unsignalled (the runtime could not start: no io_uring, too little locked memory; or
/// the thread panicked), it says so instead, so that the harness stops waiting for the thread
/// and reports its error rather than hanging until the run is abandoned.
struct Ready(Option<std::sync::mpsc::Sender<bool>>);

impl Ready {
    /// The runtime is up. Returns at once.
    fn signal(mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(true);
        }
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(false);
        }
    }
}

/// Runs two idle "shards" (threads), each running `body(ready, hold)` which must signal `ready`
/// once its runtime is up and then stay idle for `hold`; measures process CPU over `window`,
/// which opens [`IDLE_MARGIN`] after both are ready (as xtc's and tokio's idle runs wait
/// before theirs), so that what a runtime does between its signal and its first park (arming
/// its timer, blocking: a context switch) falls outside it. A thread whose runtime fails to
/// start gives its error at once, and no window is measured.
fn idle_pair<F>(window: Duration, body: F) -> Result<CpuUsage, String>
where
    F: Fn(Ready, Duration) -> Result<(), String> + Send + Sync + 'static,
{
    use std::sync::{mpsc, Arc};
    let (ready_tx, ready_rx) = mpsc::channel();
    let body = Arc::new(body);
    let hold = IDLE_MARGIN + window + IDLE_MARGIN;
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let ready = Ready(Some(ready_tx.clone()));
            let body = Arc::clone(&body);
            std::thread::spawn(move || body(ready, hold))
        })
        .collect();
    drop(ready_tx);
    // Every `Ready` says true or false exactly once, so this takes two messages at most.
    let up = (0..2).all(|_| ready_rx.recv() == Ok(true));
    let usage = up.then(|| {
        std::thread::sleep(IDLE_MARGIN);
        let meter = xtc_bench::CpuMeter::start();
        std::thread::sleep(window);
        meter.stop()
    });
    for t in threads {
        t.join().map_err(|p| xtc_bench::panic_message(&*p))??;
    }
    usage.ok_or_else(|| "an idle thread ended without starting its runtime".to_string())
}

/// The floor: the least a single-threaded executor can do.
mod raw {
    use std::{
        cell::RefCell,
        collections::VecDeque,
        future::Future,
        pin::Pin,
        rc::Rc,
        task::{Context, Poll, Waker},
        time::{Duration, Instant},
    };

    use hdrhistogram::Histogram;

    use super::{idle_pair, record_overshoot, Params, SLEEP};
    use xtc_bench::CpuUsage;

    /// What the run queue holds: a type-erased task.
    type Task = Rc<dyn Run>;

    /// A task's one allocation: its future until it completes, then its output until joined.
    enum Stage<F: Future> {
        Running(F),
        Done(F::Output),
        Joined,
    }

    /// The type-erased face of a `RefCell<Stage<F>>` that the run queue polls.
    trait Run {
        /// Polls the future once; `Ready` once it has completed.
        fn run(&self, cx: &mut Context<'_>) -> Poll<()>;
    }

    impl<F: Future> Run for RefCell<Stage<F>> {
        fn run(&self, cx: &mut Context<'_>) -> Poll<()> {
            let mut stage = self.borrow_mut();
            let Stage::Running(fut) = &mut *stage else {
                return Poll::Ready(());
            };
            // SAFETY: the future lives inside the task's `Rc` allocation and is never moved out
            // of it: the stage is only overwritten below, which drops the future in place, after
            // it returned `Ready`. So it stays at this address until it is dropped.
            let fut = unsafe { Pin::new_unchecked(fut) };
            match fut.poll(cx) {
                Poll::Ready(v) => {
                    *stage = Stage::Done(v);
                    Poll::Ready(())
                }
                Poll::Pending => Poll::Pending,
            }
        }
    }

    thread_local! {
        /// Run queue of the executor on this thread.
        static QUEUE: RefCell<VecDeque<Task>> = const { RefCell::new(VecDeque::new()) };
    }

    /// The joining end of a spawned task: ready once the task has run to completion.
    struct JoinHandle<F: Future>(Rc<RefCell<Stage<F>>>);

    impl<F: Future> JoinHandle<F> {
        fn take(&self) -> Option<F::Output> {
            let mut stage = self.0.borrow_mut();
            // Looked at before it is moved: moving a stage that still holds its future out and
            // back copies the whole future twice, and `block_on` checks its main task before
            // every poll of any task.
            if !matches!(*stage, Stage::Done(_)) {
                return None;
            }
            match std::mem::replace(&mut *stage, Stage::Joined) {
                Stage::Done(v) => Some(v),
                _ => unreachable!("matched `Done` just above"),
            }
        }
    }

    impl<F: Future> Future for JoinHandle<F> {
        type Output = F::Output;

        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<F::Output> {
            match self.take() {
                Some(v) => Poll::Ready(v),
                None => Poll::Pending,
            }
        }
    }

    /// One allocation per task, shared by the run queue and the handle.
    fn spawn<F: Future + 'static>(fut: F) -> JoinHandle<F> {
        let task = Rc::new(RefCell::new(Stage::Running(fut)));
        let run: Task = task.clone();
        QUEUE.with(|q| q.borrow_mut().push_back(run));
        JoinHandle(task)
    }

    /// Polls the queue round-robin until `main` is done; a `Pending` task goes to the back.
    fn block_on<F: Future + 'static>(main: F) -> F::Output {
        // The executor re-polls every pending task anyway, so the waker does nothing. It is
        // `Waker::noop`, not an `Arc`-backed one, whose `wake_by_ref` clones and drops the
        // `Arc`: two atomic read-modify-writes per yield that a floor should not pay.
        let mut cx = Context::from_waker(Waker::noop());
        let main = spawn(main);
        loop {
            if let Some(v) = main.take() {
                QUEUE.with(|q| q.borrow_mut().clear());
                return v;
            }
            let Some(task) = QUEUE.with(|q| q.borrow_mut().pop_front()) else {
                unreachable!("the main task is queued until it completes");
            };
            if task.run(&mut cx).is_pending() {
                QUEUE.with(|q| q.borrow_mut().push_back(task));
            }
        }
    }

    pub(super) fn spawn_join(p: Params) -> Result<Duration, String> {
        let (took, sum) = block_on(spawn_join_floor!(p, spawn));
        super::check_spawn_sum(p.spawn_tasks, sum).map(|()| took)
    }

    pub(super) fn yields(p: Params) -> Result<Duration, String> {
        Ok(block_on(yields_floor!(p, spawn)))
    }

    /// `std::thread::sleep`: the operating system's own overshoot, under every runtime's. On a
    /// thread of its own whose timer slack is 1 µs, as xtc's shard threads set theirs: at the
    /// default 50 µs `nanosleep` wakes up to 50 µs late by design, a handicap the io_uring
    /// timeouts beside it do not have, so this was no floor.
    pub(super) fn sleeps(p: Params) -> Result<Histogram<u64>, String> {
        std::thread::spawn(move || {
            // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory of ours.
            let rc =
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong, 0, 0, 0) };
            if rc != 0 {
                return Err(format!(
                    "PR_SET_TIMERSLACK: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let mut h = xtc_bench::latency_histogram();
            for _ in 0..p.sleeps {
                let t0 = Instant::now();
                std::thread::sleep(SLEEP);
                record_overshoot(&mut h, t0.elapsed())?;
            }
            Ok(h)
        })
        .join()
        .map_err(|_| "the sleeping thread panicked".to_string())?
    }

    pub(super) fn idle(window: Duration) -> Result<CpuUsage, String> {
        idle_pair(window, |ready, hold| {
            ready.signal();
            std::thread::sleep(hold);
            Ok(())
        })
    }
}

/// A second floor: async-task, the task crate under xtc's tasks, on a bare run queue. The same
/// allocation, reference counting, wakers and join protocol as xtc's tasks, and nothing of a
/// runtime around them (no loop, no registry, no stats, no I/O): what xtc's `spawn` and `yield`
/// would cost if its own layers were free. Its tasks wake themselves into a thread-local
/// `VecDeque` of `Runnable`s, which `block_on` runs in order until the main task is done.
mod async_task_floor {
    use std::{
        cell::RefCell,
        collections::VecDeque,
        future::Future,
        pin::Pin,
        task::{Context, Poll, Waker},
        time::Duration,
    };

    use hdrhistogram::Histogram;

    use super::Params;
    use xtc_bench::CpuUsage;

    /// Why `sleep` and `idle` have no figure in this column.
    const NO_RUNTIME: &str = "async-task alone has no timer and no threads to idle";

    thread_local! {
        /// Run queue of the executor on this thread.
        static QUEUE: RefCell<VecDeque<async_task::Runnable>> =
            const { RefCell::new(VecDeque::new()) };
    }

    /// Every task's schedule function: the back of this thread's queue. Every waker in these
    /// benchmarks is woken on the thread that runs its task.
    fn schedule(r: async_task::Runnable) {
        QUEUE.with(|q| q.borrow_mut().push_back(r));
    }

    /// One allocation per task (async-task's), queued at once.
    fn spawn<F>(fut: F) -> async_task::Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (runnable, task) = async_task::spawn(fut, schedule);
        runnable.schedule();
        task
    }

    /// Runs queued tasks in order until `main` has finished; `Err` if the queue empties first
    /// (a task waiting on a waker nobody will wake: a hang, not a figure).
    fn block_on<F>(main: F) -> Result<F::Output, String>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let mut main = spawn(main);
        while !main.is_finished() {
            let Some(r) = QUEUE.with(|q| q.borrow_mut().pop_front()) else {
                return Err("the run queue emptied before the main task finished".into());
            };
            r.run();
        }
        // Tasks still queued are dropped (cancelled) here, on their thread.
        let left = QUEUE.with(|q| std::mem::take(&mut *q.borrow_mut()));
        drop(left);
        match Pin::new(&mut main).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => Ok(v),
            Poll::Pending => Err("the main task finished without an output".into()),
        }
    }

    pub(super) fn spawn_join(p: Params) -> Result<Duration, String> {
        let (took, sum) = block_on(spawn_join_floor!(p, spawn))?;
        super::check_spawn_sum(p.spawn_tasks, sum).map(|()| took)
    }

    pub(super) fn yields(p: Params) -> Result<Duration, String> {
        block_on(yields_floor!(p, spawn))
    }

    pub(super) fn sleeps(_: Params) -> Result<Histogram<u64>, String> {
        Err(NO_RUNTIME.into())
    }

    pub(super) fn idle(_: Duration) -> Result<CpuUsage, String> {
        Err(NO_RUNTIME.into())
    }
}

mod tokio_rt {
    use std::time::{Duration, Instant};

    use hdrhistogram::Histogram;
    use tokio::{runtime::Builder, task::LocalSet};

    use super::{record_overshoot, Params, SLEEP};
    use xtc_bench::CpuUsage;

    fn local<T>(fut: impl std::future::Future<Output = T>) -> Result<T, String> {
        let rt = Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(LocalSet::new().block_on(&rt, fut))
    }

    pub(super) fn spawn_join(p: Params) -> Result<Duration, String> {
        local(async move {
            let mut handles = Vec::with_capacity(p.spawn_tasks);
            let t0 = Instant::now();
            for i in 0..p.spawn_tasks as u64 {
                handles.push(tokio::task::spawn_local(async move { i }));
            }
            let mut sum = 0;
            for h in handles {
                sum += h.await.map_err(|e| e.to_string())?;
            }
            let took = t0.elapsed();
            super::check_spawn_sum(p.spawn_tasks, sum).map(|()| took)
        })?
    }

    pub(super) fn yields(p: Params) -> Result<Duration, String> {
        local(async move {
            let mut handles = Vec::with_capacity(p.yield_tasks);
            let t0 = Instant::now();
            for _ in 0..p.yield_tasks {
                handles.push(tokio::task::spawn_local(async move {
                    let mut last = super::yield_task_start();
                    for _ in 0..p.yields_per_task {
                        tokio::task::yield_now().await;
                        super::yielded(&mut last);
                    }
                }));
            }
            for h in handles {
                h.await.map_err(|e| e.to_string())?;
            }
            Ok(t0.elapsed())
        })?
    }

    pub(super) fn sleeps(p: Params) -> Result<Histogram<u64>, String> {
        local(async move {
            let mut h = xtc_bench::latency_histogram();
            for _ in 0..p.sleeps {
                let t0 = Instant::now();
                tokio::time::sleep(SLEEP).await;
                record_overshoot(&mut h, t0.elapsed())?;
            }
            Ok(h)
        })?
    }

    /// A `multi_thread` runtime with 2 workers and nothing to do.
    pub(super) fn idle(window: Duration) -> Result<CpuUsage, String> {
        let rt = Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .map_err(|e| e.to_string())?;
        // Let the workers start and park before measuring, as long as every idle run does.
        rt.block_on(async { tokio::time::sleep(super::IDLE_MARGIN).await });
        let meter = xtc_bench::CpuMeter::start();
        std::thread::sleep(window);
        let usage = meter.stop();
        drop(rt);
        Ok(usage)
    }
}

mod glommio_rt {
    use std::time::{Duration, Instant};

    use glommio::{LocalExecutor, LocalExecutorBuilder, Placement};
    use hdrhistogram::Histogram;

    use super::{idle_pair, record_overshoot, Params, SLEEP};
    use xtc_bench::CpuUsage;

    fn executor() -> Result<LocalExecutor, String> {
        // Unbound: the benchmark thread is already pinned by the harness, like every runtime's.
        LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .map_err(|e| e.to_string())
    }

    pub(super) fn spawn_join(p: Params) -> Result<Duration, String> {
        executor()?.run(async move {
            let mut handles = Vec::with_capacity(p.spawn_tasks);
            let t0 = Instant::now();
            for i in 0..p.spawn_tasks as u64 {
                handles.push(glommio::spawn_local(async move { i }));
            }
            let mut sum = 0;
            for h in handles {
                sum += h.await;
            }
            let took = t0.elapsed();
            super::check_spawn_sum(p.spawn_tasks, sum).map(|()| took)
        })
    }

    pub(super) fn yields(p: Params) -> Result<Duration, String> {
        Ok(executor()?.run(async move {
            let mut handles = Vec::with_capacity(p.yield_tasks);
            let t0 = Instant::now();
            for _ in 0..p.yield_tasks {
                handles.push(glommio::spawn_local(async move {
                    let mut last = super::yield_task_start();
                    for _ in 0..p.yields_per_task {
                        // Unconditional: `yield_if_needed` only yields when the task queue's
                        // time slice is used up.
                        glommio::executor().yield_now().await;
                        super::yielded(&mut last);
                    }
                }));
            }
            for h in handles {
                h.await;
            }
            t0.elapsed()
        }))
    }

    pub(super) fn sleeps(p: Params) -> Result<Histogram<u64>, String> {
        executor()?.run(async move {
            let mut h = xtc_bench::latency_histogram();
            for _ in 0..p.sleeps {
                let t0 = Instant::now();
                glommio::timer::sleep(SLEEP).await;
                record_overshoot(&mut h, t0.elapsed())?;
            }
            Ok(h)
        })
    }

    /// Two `LocalExecutor`s, each awaiting one long sleep.
    pub(super) fn idle(window: Duration) -> Result<CpuUsage, String> {
        idle_pair(window, |ready, hold| {
            let ex = executor()?;
            ex.run(async move {
                ready.signal();
                glommio::timer::sleep(hold).await;
            });
            Ok(())
        })
    }
}

mod monoio_rt {
    use std::time::{Duration, Instant};

    use hdrhistogram::Histogram;

    use super::{idle_pair, record_overshoot, yield_now, Params, SLEEP};
    use xtc_bench::CpuUsage;

    fn block_on<T>(fut: impl std::future::Future<Output = T>) -> Result<T, String> {
        let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(rt.block_on(fut))
    }

    pub(super) fn spawn_join(p: Params) -> Result<Duration, String> {
        block_on(async move {
            let mut handles = Vec::with_capacity(p.spawn_tasks);
            let t0 = Instant::now();
            for i in 0..p.spawn_tasks as u64 {
                handles.push(monoio::spawn(async move { i }));
            }
            let mut sum = 0;
            for h in handles {
                sum += h.await;
            }
            let took = t0.elapsed();
            super::check_spawn_sum(p.spawn_tasks, sum).map(|()| took)
        })?
    }

    pub(super) fn yields(p: Params) -> Result<Duration, String> {
        block_on(async move {
            let mut handles = Vec::with_capacity(p.yield_tasks);
            let t0 = Instant::now();
            for _ in 0..p.yield_tasks {
                handles.push(monoio::spawn(async move {
                    let mut last = super::yield_task_start();
                    for _ in 0..p.yields_per_task {
                        yield_now().await;
                        super::yielded(&mut last);
                    }
                }));
            }
            for h in handles {
                h.await;
            }
            t0.elapsed()
        })
    }

    pub(super) fn sleeps(p: Params) -> Result<Histogram<u64>, String> {
        block_on(async move {
            let mut h = xtc_bench::latency_histogram();
            for _ in 0..p.sleeps {
                let t0 = Instant::now();
                monoio::time::sleep(SLEEP).await;
                record_overshoot(&mut h, t0.elapsed())?;
            }
            Ok(h)
        })?
    }

    /// Two runtimes on two threads, each sleeping.
    pub(super) fn idle(window: Duration) -> Result<CpuUsage, String> {
        idle_pair(window, |ready, hold| {
            block_on(async move {
                ready.signal();
                monoio::time::sleep(hold).await;
            })
        })
    }
}

/// The xtc column, against the `xtc` facade crate.
#[cfg(feature = "xtc")]
mod xtc_rt {
    use std::time::{Duration, Instant};

    use hdrhistogram::Histogram;

    use super::{record_overshoot, Params, SLEEP};
    use xtc_bench::CpuUsage;

    fn block_on<T: 'static>(
        fut: impl std::future::Future<Output = T> + 'static,
    ) -> Result<T, String> {
        let ex = xtc::LocalExecutor::new().map_err(|e| e.to_string())?;
        Ok(ex.block_on(fut))
    }

    pub(super) fn spawn_join(p: Params) -> Result<Duration, String> {
        block_on(async move {
            let mut handles = Vec::with_capacity(p.spawn_tasks);
            let t0 = Instant::now();
            for i in 0..p.spawn_tasks as u64 {
                handles.push(xtc::spawn_local(async move { i }));
            }
            let mut sum = 0;
            for h in handles {
                sum += h.await.map_err(|e| e.to_string())?;
            }
            let took = t0.elapsed();
            super::check_spawn_sum(p.spawn_tasks, sum).map(|()| took)
        })?
    }

    pub(super) fn yields(p: Params) -> Result<Duration, String> {
        block_on(async move {
            let mut handles = Vec::with_capacity(p.yield_tasks);
            let t0 = Instant::now();
            for _ in 0..p.yield_tasks {
                handles.push(xtc::spawn_local(async move {
                    let mut last = super::yield_task_start();
                    for _ in 0..p.yields_per_task {
                        xtc::yield_now().await;
                        super::yielded(&mut last);
                    }
                }));
            }
            for h in handles {
                h.await.map_err(|e| e.to_string())?;
            }
            Ok(t0.elapsed())
        })?
    }

    pub(super) fn sleeps(p: Params) -> Result<Histogram<u64>, String> {
        block_on(async move {
            let mut h = xtc_bench::latency_histogram();
            for _ in 0..p.sleeps {
                let t0 = Instant::now();
                xtc::time::sleep(SLEEP).await;
                record_overshoot(&mut h, t0.elapsed())?;
            }
            Ok(h)
        })?
    }

    /// A 2-shard `Executor` in service mode with nothing to do, stopped from another thread.
    pub(super) fn idle(window: Duration) -> Result<CpuUsage, String> {
        let exec = xtc::Executor::builder()
            .shards(2)
            .oversubscribe(true)
            .build()
            .map_err(|e| e.to_string())?;
        exec.set_service_mode(true);
        let handle = exec.handle();
        let stopper = std::thread::spawn(move || {
            // Let the shards start and park before measuring.
            std::thread::sleep(super::IDLE_MARGIN);
            let meter = xtc_bench::CpuMeter::start();
            std::thread::sleep(window);
            let usage = meter.stop();
            handle.stop();
            usage
        });
        let ran = exec.run().map_err(|e| e.to_string());
        let usage = stopper.join().map_err(|p| xtc_bench::panic_message(&*p))?;
        ran.map(|()| usage)
    }
}

/// Stand-in for the xtc column when the bench is built without its `xtc` feature.
#[cfg(not(feature = "xtc"))]
mod xtc_rt {
    use std::time::Duration;

    use hdrhistogram::Histogram;

    use super::Params;
    use xtc_bench::CpuUsage;

    const NOT_BUILT: &str = "xtc-bench built without its `xtc` feature";

    pub(super) fn spawn_join(_: Params) -> Result<Duration, String> {
        Err(NOT_BUILT.into())
    }

    pub(super) fn yields(_: Params) -> Result<Duration, String> {
        Err(NOT_BUILT.into())
    }

    pub(super) fn sleeps(_: Params) -> Result<Histogram<u64>, String> {
        Err(NOT_BUILT.into())
    }

    pub(super) fn idle(_: Duration) -> Result<CpuUsage, String> {
        Err(NOT_BUILT.into())
    }
}

/// Runs benchmark `bench` on runtime column `rt`; returns the table rows' values for it.
/// Timed runs of `spawn` and `yield`, after one warm-up run on the same fresh thread; the
/// median is reported, as `steal` and `sched` report theirs. The warm-up leaves the heap a
/// million tasks' worth of freed memory, which the timed runs reuse as a long-running program
/// would: a single cold run measured mostly the kernel faulting fresh pages in (xtc's
/// spawn+join: 169 ms cold, 92 ms warm, in `sched`'s runs), and that for every runtime.
const RUNS: usize = 5;

/// The median of a runtime's timed runs (every run but the first, a warm-up), and all of them.
fn median_of(all: Vec<Duration>) -> (Duration, Vec<Duration>) {
    let mut timed = all[1..].to_vec();
    timed.sort();
    (timed[RUNS / 2], all)
}

/// One run of benchmark `bench` ("spawn" or "yield") on runtime `rt`: its time.
fn one_run(
    bench: &str,
    rt: usize,
    p: Params,
) -> impl FnOnce() -> Result<Duration, String> + Send + 'static {
    let spawn = bench == "spawn";
    let f = if spawn {
        [
            xtc_rt::spawn_join,
            raw::spawn_join,
            tokio_rt::spawn_join,
            glommio_rt::spawn_join,
            monoio_rt::spawn_join,
            async_task_floor::spawn_join,
        ][rt]
    } else {
        [
            xtc_rt::yields,
            raw::yields,
            tokio_rt::yields,
            glommio_rt::yields,
            monoio_rt::yields,
            async_task_floor::yields,
        ][rt]
    };
    move || {
        if spawn {
            return f(p);
        }
        // Counted per run: every run on this thread adds to the same counters.
        YIELD_STEPS.with(|c| c.set(0));
        SWITCHED.with(|c| c.set(0));
        let took = f(p)?;
        check_interleaved(p)?;
        Ok(took)
    }
}

/// Runs benchmark `bench` ("spawn" or "yield") on every runtime in turns: a warm-up round,
/// then [`RUNS`] rounds, each runtime once per round on a thread of its own, pinned to `cpu`
/// ([`xtc_bench::Worker`]). The VM's speed moves within minutes; measured one runtime after
/// the other, a slow stretch fell on one runtime's runs alone (monoio's spawn+join read 96 ms
/// in one run and 137 ms two minutes later). Per runtime: the median of its timed runs and
/// every run, or why it has none.
#[allow(clippy::type_complexity)]
fn in_turns(
    bench: &str,
    p: Params,
    cpu: Option<usize>,
) -> Vec<Result<(Duration, Vec<Duration>), String>> {
    let mut workers: Vec<Result<xtc_bench::Worker, String>> = RUNTIMES
        .iter()
        .map(|_| xtc_bench::Worker::start(cpu))
        .collect();
    let mut runs: Vec<Result<Vec<Duration>, String>> = vec![Ok(Vec::new()); RUNTIMES.len()];
    for _ in 0..=RUNS {
        for (rt, worker) in workers.iter_mut().enumerate() {
            let (Ok(w), Ok(done)) = (worker, &mut runs[rt]) else {
                continue;
            };
            match w.run(p.deadline, one_run(bench, rt, p)) {
                Ok(d) => done.push(d),
                Err(e) => runs[rt] = Err(e),
            }
        }
    }
    workers
        .into_iter()
        .zip(runs)
        .map(|(w, r)| {
            w?;
            r.map(median_of)
        })
        .collect()
}

/// The median of [`in_turns`]; its runs go to `notes`.
fn note_runs(
    r: Result<(Duration, Vec<Duration>), String>,
    bench: &str,
    rt: usize,
    notes: &mut Vec<String>,
) -> Result<Duration, String> {
    let (median, all) = r?;
    let ms: Vec<String> = all
        .iter()
        .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
        .collect();
    notes.push(format!(
        "{bench} / {} runs, in turns with the other runtimes, the first a warm-up: {} ms",
        RUNTIMES[rt],
        ms.join(" ")
    ));
    Ok(median)
}

/// Benchmarks "sleep" and "idle" on runtime `rt`, on a thread of their own ([`isolated`]): the
/// values of their rows.
fn run_one(bench: &str, rt: usize, p: Params, cpu: Option<usize>) -> Vec<Result<f64, String>> {
    match bench {
        "sleep" => {
            let f = [
                xtc_rt::sleeps,
                raw::sleeps,
                tokio_rt::sleeps,
                glommio_rt::sleeps,
                monoio_rt::sleeps,
                async_task_floor::sleeps,
            ][rt];
            let s = isolated(cpu, p.deadline, move || {
                f(p).map(|h| LatencySummary::from_histogram(&h))
            });
            let us = |ns: u64| ns as f64 / 1e3;
            vec![s.clone().map(|s| us(s.p50_ns)), s.map(|s| us(s.p99_ns))]
        }
        "idle" => {
            let f = [
                xtc_rt::idle,
                raw::idle,
                tokio_rt::idle,
                glommio_rt::idle,
                monoio_rt::idle,
                async_task_floor::idle,
            ][rt];
            // Not pinned: the runtime's two threads must be free to sit on two CPUs.
            let u = isolated(None, p.deadline, move || f(p.idle));
            vec![
                u.clone().map(|u| u.percent_of_one_cpu()),
                u.map(|u| u.switches as f64),
            ]
        }
        _ => unreachable!(
            "spawn and yield run in turns (`in_turns`); names are checked when parsing"
        ),
    }
}

/// The table rows (name, unit, better) that benchmark `bench` fills, in order.
fn rows_of(bench: &str, p: Params) -> Vec<(String, &'static str, Better)> {
    match bench {
        "spawn" => vec![(
            format!("spawn+join {}", p.spawn_tasks),
            "M tasks/s",
            Better::Higher,
        )],
        "yield" => vec![(
            format!("yield {}x{}", p.yield_tasks, p.yields_per_task),
            "M switches/s",
            Better::Higher,
        )],
        "sleep" => vec![
            (
                format!("sleep(1ms) x{} overshoot p50", p.sleeps),
                "us",
                Better::Lower,
            ),
            (
                format!("sleep(1ms) x{} overshoot p99", p.sleeps),
                "us",
                Better::Lower,
            ),
        ],
        "idle" => vec![
            (
                format!("idle 2 threads {:.1}s", p.idle.as_secs_f64()),
                "% of 1 CPU",
                Better::Lower,
            ),
            (
                format!("idle 2 threads {:.1}s", p.idle.as_secs_f64()),
                "ctx switches",
                Better::Lower,
            ),
        ],
        _ => unreachable!("benchmark names are checked when parsing"),
    }
}

/// How far apart two runtimes' idle CPU figures may be and still count as the same: in the
/// 3 s window no runtime thread wakes (one context switch each, the meter's own sleep), and the
/// process's CPU there still read 0.002 % to 0.020 % of a CPU from run to run, for every
/// runtime alike (the meter's cost, not the runtime's). 0.01 % is 0.3 ms in the window, a
/// thirteenth of one 4 ms clock tick.
const IDLE_SAME_PCT: f64 = 0.01;

/// Issue 3's "idle CPU no more than tokio's": met when xtc's threads woke no more often than
/// tokio's in the window (context switches) and its CPU is at most tokio's plus
/// [`IDLE_SAME_PCT`]. `cpu` is the `% of 1 CPU` idle row; the switches row follows it.
fn idle_vs_tokio(table: &Table, cpu: &Row) -> Goal {
    const WHAT: &str = "idle 2-shard executor (no task): xtc, no more than tokio";
    let target = format!("<= tokio's CPU + {IDLE_SAME_PCT} % and context switches");
    let switches = table
        .rows
        .iter()
        .find(|r| r.name == cpu.name && r.unit == "ctx switches");
    let pick = |r: &Row, c: usize| r.values[c].as_ref().ok().copied();
    match (
        pick(cpu, XTC),
        pick(cpu, TOKIO),
        switches.and_then(|r| pick(r, XTC)),
        switches.and_then(|r| pick(r, TOKIO)),
    ) {
        (Some(x), Some(t), Some(xs), Some(ts)) => Goal::judged(
            3,
            WHAT,
            target,
            format!("{x:.3} % vs {t:.3} %, {xs:.0} vs {ts:.0} context switches"),
            Some(xs <= ts && x <= t + IDLE_SAME_PCT),
        ),
        _ => Goal::judged(3, WHAT, target, "n/a: a value is missing", None),
    }
}

/// Issue 3's goals: spawn+join >= 1.5x monoio, yield switches >= 1.3x monoio, `sleep(1ms)`
/// overshoot p99 at most 200 us, an idle 2-shard executor at most 1 % of one CPU and no more than
/// tokio's ([`idle_vs_tokio`]). Judged on the rows this run filled (none for a benchmark left out with `--only`).
fn goals(table: &Table) -> Vec<Goal> {
    let mut goals = Vec::new();
    for row in &table.rows {
        let xtc = row.values[XTC].as_ref().ok().copied();
        if row.name.starts_with("spawn+join") {
            goals.push(Goal::ratio(
                3,
                "spawn+join: xtc/monoio",
                false,
                1.5,
                table.ratio(row, MONOIO),
            ));
        } else if row.name.starts_with("yield") {
            let mut goal = Goal::ratio(
                3,
                "yield switches: xtc/monoio",
                false,
                1.3,
                table.ratio(row, MONOIO),
            );
            // monoio's yields are no task switches here (`check_interleaved`): no figure, and
            // the reason's first clause says why (the rest is in the table's notes).
            if let Err(why) = &row.values[MONOIO] {
                goal.measured = format!("n/a: monoio: {}", why.split(':').next().unwrap_or(why));
            }
            goals.push(goal);
        } else if row.name.starts_with("sleep") && row.name.ends_with("p99") {
            goals.push(Goal::value(
                3,
                "sleep(1ms) overshoot p99: xtc (on an idle machine)",
                true,
                200.0,
                "us",
                xtc,
            ));
        } else if row.name.starts_with("idle") && row.unit.starts_with('%') {
            goals.push(Goal::value(
                3,
                "idle 2-shard executor (no task): xtc",
                true,
                1.0,
                "% of 1 CPU",
                xtc,
            ));
            goals.push(idle_vs_tokio(table, row));
        }
    }
    goals
}

fn main() -> ExitCode {
    let args =
        match xtc_bench::BenchArgs::parse("local", &BENCHES, xtc_bench::CpuOption::One, usage()) {
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
    let cpu = args.cpu.or_else(|| allowed.first().copied());
    if let Some(c) = cpu.filter(|c| !allowed.is_empty() && !allowed.contains(c)) {
        eprintln!("local: --cpu {c} is not in the allowed set {allowed:?}");
        return ExitCode::from(2);
    }

    println!(
        "local: single-shard benchmarks, xtc beside a raw floor, tokio, glommio, monoio and bare \
         async-task"
    );
    println!(
        "  mode: {}   single-shard runs pinned to cpu {}   allowed cpus: {allowed:?}",
        if args.quick {
            "quick (10x fewer iterations)"
        } else {
            "full"
        },
        cpu.map_or("none".to_string(), |c| c.to_string()),
    );
    println!("  xtc I/O driver: {}", xtc_bench::xtc_io_driver());
    println!(
        "  raw = the floor: spawn/yield on a VecDeque of tasks (one Rc each) re-polled on Pending (no \
         wakers); sleep = std::thread::sleep; idle = 2 threads in std::thread::sleep"
    );
    println!(
        "  async-task = xtc's task crate alone: spawn/yield on a VecDeque of async-task Runnables \
         with real wakers, no runtime around them (xtc/async-task = what xtc's own layers cost)"
    );
    if !cfg!(feature = "xtc") {
        println!("  NOTE: built without the `xtc` feature: the xtc column is empty");
    }

    let bar = ProgressBar::new((benches.len() * RUNTIMES.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .expect("static progress template is valid"),
    );
    let mut table = Table::new(
        RUNTIMES.iter().map(|s| s.to_string()).collect(),
        0,
        RATIOS_VS.to_vec(),
    );
    let mut notes = Vec::new();
    for bench in &benches {
        let specs = rows_of(bench, p);
        let mut values: Vec<Vec<Result<f64, String>>> = vec![Vec::new(); specs.len()];
        if matches!(*bench, "spawn" | "yield") {
            bar.set_message(format!("{bench} / every runtime in turns"));
            let n = if *bench == "spawn" {
                p.spawn_tasks
            } else {
                p.yield_tasks * p.yields_per_task
            };
            for (rt, r) in in_turns(bench, p, cpu).into_iter().enumerate() {
                let per_sec = |d: Duration| n as f64 / d.as_secs_f64() / 1e6;
                values[0].push(note_runs(r, bench, rt, &mut notes).map(per_sec));
            }
            bar.inc(RUNTIMES.len() as u64);
        } else {
            for (rt, name) in RUNTIMES.iter().enumerate() {
                bar.set_message(format!("{bench} / {name}"));
                for (i, v) in run_one(bench, rt, p, cpu).into_iter().enumerate() {
                    values[i].push(v);
                }
                bar.inc(1);
            }
        }
        for ((name, unit, better), values) in specs.into_iter().zip(values) {
            table.push(Row {
                name,
                unit: unit.to_string(),
                better,
                values,
            });
        }
    }
    bar.finish_and_clear();

    println!();
    print!("{}", table.render());
    println!(
        "  ratios are xtc/peer of the values: above 1 is better for xtc where `better` is higher, \
         below 1 where it is lower"
    );
    print_goals(&goals(&table));
    for n in &notes {
        println!("  {n}");
    }

    let chart = Chart {
        title: "xtc local benchmarks".into(),
        subtitle: format!(
            "{} run, one shard pinned to cpu {}; raw = floor",
            if args.quick { "quick" } else { "full" },
            cpu.map_or("none".to_string(), |c| c.to_string())
        ),
        panels: table.panels(),
    };
    chart.write_and_report("local", &args.svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of the rows `goals` reads, every column filled from `vals` (xtc, raw, tokio,
    /// glommio, monoio; the async-task column, which no goal reads, takes raw's),
    /// `monoio_yield` in monoio's yield cell.
    fn table_of(vals: [f64; 5], monoio_yield: Result<f64, String>) -> Table {
        let p = Params::quick();
        let mut t = Table::new(RUNTIMES.iter().map(|s| s.to_string()).collect(), 0, vec![4]);
        for bench in BENCHES {
            for (name, unit, better) in rows_of(bench, p) {
                let mut values: Vec<Result<f64, String>> = vals.iter().map(|v| Ok(*v)).collect();
                values.push(Ok(vals[1]));
                if bench == "yield" {
                    values[MONOIO] = monoio_yield.clone();
                }
                t.push(Row {
                    name,
                    unit: unit.into(),
                    better,
                    values,
                });
            }
        }
        t
    }

    #[test]
    fn goals_judge_each_row_of_issue_3() {
        let g = goals(&table_of(
            [3.0, 4.0, 1.0, 1.0, 2.0],
            Err("only 0 of 9: x".into()),
        ));
        let line = |what: &str| {
            g.iter()
                .find(|g| g.what.starts_with(what))
                .unwrap_or_else(|| panic!("no goal {what}: {g:?}"))
        };
        // 3 / 2 = 1.5: the bound meets it.
        assert_eq!(line("spawn+join").met, Some(true));
        assert_eq!(line("yield").met, None, "monoio's yields are no switches");
        assert_eq!(line("yield").measured, "n/a: monoio: only 0 of 9");
        // Every value 3.0: p99 3 us under 200, idle 3 % over 1 %, and over tokio's 1 %.
        assert_eq!(line("sleep").met, Some(true));
        assert_eq!(
            line("idle 2-shard executor (no task): xtc").met,
            Some(false)
        );
        // 3 % against tokio's 1 %, the same switches: more than the noise allows.
        assert_eq!(
            line("idle 2-shard executor (no task): xtc, no more").met,
            Some(false)
        );
        assert_eq!(
            g.len(),
            5,
            "one goal per row of issue 3, two for idle: {g:?}"
        );

        let slow = goals(&table_of([1.0, 4.0, 2.0, 1.0, 2.0], Ok(2.0)));
        assert_eq!(slow[0].met, Some(false), "0.5x monoio: {:?}", slow[0]);
        assert_eq!(
            slow[1].met,
            Some(false),
            "a monoio figure is judged: {:?}",
            slow[1]
        );
        assert_eq!(
            slow[4].met,
            Some(true),
            "1 % under tokio's 2 %: {:?}",
            slow[4]
        );
    }

    /// The idle comparison with tokio: CPU within the meter's noise of tokio's counts as the
    /// same; a wake-up more than tokio's counts as more, whatever the CPU reads.
    #[test]
    fn idle_against_tokio_allows_the_meters_noise_but_no_extra_wake_up() {
        fn cpu(t: &mut Table) -> &mut Row {
            t.rows.iter_mut().find(|r| r.unit.starts_with('%')).unwrap()
        }
        let idle = |t: &Table| goals(t).pop().expect("the idle goal is the last");
        let mut t = table_of([1.0; 5], Ok(1.0));
        // 0.020 % against tokio's 0.015 %: 0.005 % apart, under IDLE_SAME_PCT.
        cpu(&mut t).values[XTC] = Ok(0.020);
        cpu(&mut t).values[TOKIO] = Ok(0.015);
        assert_eq!(idle(&t).met, Some(true), "{:?}", idle(&t));
        assert!(idle(&t).measured.contains("1 vs 1 context switches"));
        // 0.030 % against 0.015 %: beyond the noise.
        cpu(&mut t).values[XTC] = Ok(0.030);
        assert_eq!(idle(&t).met, Some(false), "{:?}", idle(&t));
        // Back within the noise, but one more wake-up than tokio.
        cpu(&mut t).values[XTC] = Ok(0.020);
        let switches = t
            .rows
            .iter_mut()
            .find(|r| r.unit == "ctx switches")
            .unwrap();
        switches.values[XTC] = Ok(2.0);
        assert_eq!(idle(&t).met, Some(false), "{:?}", idle(&t));
    }

    /// `idle_pair` under a hang guard: `Err` from the guard if it never returned.
    fn guarded<F>(body: F) -> Result<Result<CpuUsage, String>, String>
    where
        F: Fn(Ready, Duration) -> Result<(), String> + Send + Sync + 'static,
    {
        isolated(None, Duration::from_secs(30), move || {
            Ok(idle_pair(Duration::from_millis(10), body))
        })
    }

    #[test]
    fn idle_pair_reports_a_runtime_that_cannot_start() {
        // As glommio's `make()` fails under a small RLIMIT_MEMLOCK: before its thread is ready.
        let r = guarded(|_ready, _hold| Err("MemLockLimit".to_string()));
        assert_eq!(r, Ok(Err("MemLockLimit".to_string())));
    }

    #[test]
    fn idle_pair_reports_one_failed_thread_beside_a_ready_one() {
        let started = std::sync::atomic::AtomicUsize::new(0);
        let r = guarded(move |ready, hold| {
            if started.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                panic!("no io_uring");
            }
            ready.signal();
            std::thread::sleep(hold);
            Ok(())
        });
        assert_eq!(r, Ok(Err("panicked: no io_uring".to_string())));
    }

    #[test]
    fn an_early_sleep_is_an_error_not_a_perfect_overshoot() {
        let mut h = xtc_bench::latency_histogram();
        let early = record_overshoot(&mut h, SLEEP - Duration::from_micros(1));
        assert!(early.unwrap_err().contains("early"));
        assert_eq!(h.len(), 0, "nothing recorded for an early sleep");
        record_overshoot(&mut h, SLEEP + Duration::from_micros(7)).unwrap();
        assert_eq!(h.len(), 1);
        assert!(h.equivalent(LatencySummary::from_histogram(&h).p50_ns, 7_000));
    }

    #[test]
    fn idle_pair_leaves_the_start_of_the_runtimes_out_of_the_window() {
        // The window measures the whole process, where this binary's other tests run beside
        // this one and would count too: the check runs alone, in a child process of this
        // test binary.
        const CHILD: &str = "XTC_BENCH_IDLE_WINDOW_CHILD";
        let name = "tests::idle_pair_leaves_the_start_of_the_runtimes_out_of_the_window";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--nocapture", "--test-threads", "1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{}: {stdout}{stderr}", out.status);
            // A filter that matched nothing would pass with no test run.
            assert!(
                stdout.contains("test result: ok. 1 passed"),
                "the child did not run {name}: {stdout}{stderr}"
            );
            return;
        }
        // Work a runtime does right after its signal (its first park) is no idle cost.
        let r = guarded(|ready, hold| {
            ready.signal();
            let t0 = std::time::Instant::now();
            while t0.elapsed() < Duration::from_millis(50) {
                std::hint::spin_loop();
            }
            std::thread::sleep(hold);
            Ok(())
        });
        let usage = r.unwrap().unwrap();
        assert!(usage.cpu < Duration::from_millis(5), "{usage:?}");
    }

    #[test]
    fn idle_pair_measures_when_both_are_up() {
        let r = guarded(|ready, hold| {
            ready.signal();
            std::thread::sleep(hold);
            Ok(())
        });
        let usage = r.unwrap().unwrap();
        assert!(usage.wall >= Duration::from_millis(10), "{usage:?}");
    }
}
