//! Shared helpers of the xtc benchmarks.
//!
//! The binaries in `src/bin/` put xtc beside tokio, glommio, monoio and a raw floor in one run and
//! print **ratios**: absolute numbers on a shared machine are noise, ratios taken in the same run
//! are the figures that count (see "What is measured" in DESIGN.md). No benchmark asserts on
//! time; they only report.
//!
//! This crate holds what the binaries share:
//!
//! - [`LatencySummary`]: median, p99 and p99.9 of an [`hdrhistogram::Histogram`], formatted;
//! - [`cpu_time`] and [`CpuMeter`]: process CPU time (user + system) from `getrusage`;
//! - [`thread_cpu_time`]: the calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`);
//! - [`Table`]: an aligned table of results with `xtc/peer` ratio columns;
//! - [`svg`]: a dependency-free SVG bar-chart writer, and [`heatmap`] one for square matrices
//!   (`c2c --matrix`);
//! - [`isolated`] and [`pin_current_thread`]: run each runtime on a fresh, optionally pinned,
//!   thread so thread-locals and panics of one runtime cannot leak into the next;
//! - [`allowed_cpus`], [`parse_cpu_pair`] and [`pick_cpu_pair`]: which CPUs to run on;
//! - [`median`]: the middle of repeated timings;
//! - [`goal`]: the issues' speed goals, judged on a run's figures in one line format that
//!   `scripts/bench` gathers into a scoreboard.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;

pub mod goal;
pub mod heatmap;
pub mod svg;

/// Percentiles of a latency histogram recorded in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Smallest sample, ns.
    pub min_ns: u64,
    /// Median, ns.
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// 99.9th percentile, ns.
    pub p999_ns: u64,
    /// Largest sample, ns.
    pub max_ns: u64,
    /// Arithmetic mean, ns.
    pub mean_ns: f64,
}

impl LatencySummary {
    /// Summarizes a histogram whose samples are nanoseconds.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        LatencySummary {
            count: h.len(),
            min_ns: h.min(),
            p50_ns: h.value_at_quantile(0.50),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
            mean_ns: h.mean(),
        }
    }

    /// One line: `n=.. min=.. p50=.. p99=.. p99.9=.. max=..`, in nanoseconds.
    pub fn line_ns(&self) -> String {
        format!(
            "n={} min={} ns p50={} ns p99={} ns p99.9={} ns max={} ns mean={:.1} ns",
            self.count,
            self.min_ns,
            self.p50_ns,
            self.p99_ns,
            self.p999_ns,
            self.max_ns,
            self.mean_ns
        )
    }

    /// One line like [`LatencySummary::line_ns`], in microseconds.
    pub fn line_us(&self) -> String {
        let us = |ns: u64| ns as f64 / 1_000.0;
        format!(
            "n={} min={:.1} us p50={:.1} us p99={:.1} us p99.9={:.1} us max={:.1} us",
            self.count,
            us(self.min_ns),
            us(self.p50_ns),
            us(self.p99_ns),
            us(self.p999_ns),
            us(self.max_ns)
        )
    }
}

/// A histogram for nanosecond latencies from 1 ns to 100 s with 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    // 3 significant digits keeps the error under 0.1 %, at about 200 KiB per histogram.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

/// Records `d` in `h` as nanoseconds, clamping into the histogram's range.
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    h.saturating_record(ns.max(1));
}

/// CPU time (user + system) consumed so far by every thread of this process, including threads
/// that have already exited.
pub fn cpu_time() -> Duration {
    let usage = rusage_self();
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Context switches (voluntary and involuntary) of every thread of this process so far,
/// including threads that have exited. An idle runtime that never wakes adds none; each
/// wake-up of a parked thread adds at least one (it blocks again after).
pub fn context_switches() -> u64 {
    let usage = rusage_self();
    (usage.ru_nvcsw + usage.ru_nivcsw) as u64
}

/// `getrusage(RUSAGE_SELF)`.
fn rusage_self() -> libc::rusage {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` points to writable memory the size of a `rusage`; `getrusage` only writes
    // into it, and RUSAGE_SELF is a valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(
        rc,
        0,
        "getrusage(RUSAGE_SELF) failed: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `getrusage` returned 0, so it filled the whole struct (and it was zeroed before).
    unsafe { usage.assume_init() }
}

/// CPU time consumed so far by the calling thread (`CLOCK_THREAD_CPUTIME_ID`), nanosecond
/// resolution.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable `timespec`; CLOCK_THREAD_CPUTIME_ID is a valid clock id.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(
        rc,
        0,
        "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed: {}",
        std::io::Error::last_os_error()
    );
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Measures the process CPU time spent over a wall-clock window.
#[derive(Debug, Clone, Copy)]
pub struct CpuMeter {
    cpu0: Duration,
    switches0: u64,
    wall0: Instant,
}

/// What a [`CpuMeter`] saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUsage {
    /// CPU time (user + system) of the whole process over the window.
    pub cpu: Duration,
    /// Wall-clock length of the window.
    pub wall: Duration,
    /// Context switches of the whole process over the window ([`context_switches`]). The
    /// thread that holds the meter and sleeps through the window adds one.
    pub switches: u64,
}

impl CpuUsage {
    /// CPU time as a percentage of one CPU over the window (200 % = two CPUs busy).
    pub fn percent_of_one_cpu(&self) -> f64 {
        if self.wall.is_zero() {
            return 0.0;
        }
        100.0 * self.cpu.as_secs_f64() / self.wall.as_secs_f64()
    }
}

impl CpuMeter {
    /// Starts the window now.
    pub fn start() -> Self {
        CpuMeter {
            cpu0: cpu_time(),
            switches0: context_switches(),
            wall0: Instant::now(),
        }
    }

    /// Ends the window now and returns the CPU and wall time it covered.
    pub fn stop(&self) -> CpuUsage {
        let cpu = cpu_time().saturating_sub(self.cpu0);
        CpuUsage {
            cpu,
            wall: self.wall0.elapsed(),
            switches: context_switches().saturating_sub(self.switches0),
        }
    }
}

/// Pins the calling thread to `cpu` (a logical CPU id). Returns false if the CPU is not in this
/// process's allowed set or pinning failed.
pub fn pin_current_thread(cpu: usize) -> bool {
    // core_affinity sets the bit with libc's CPU_SET, which panics past the set's CPU_SETSIZE
    // bits in a function that cannot unwind: the whole process aborted, `isolated` or not.
    let pinned = cpu < libc::CPU_SETSIZE as usize
        && core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
    if !pinned {
        PIN_FAILURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pinned
}

/// Threads [`pin_current_thread`] could not pin. Callers go on unpinned (a valid, noisier run);
/// [`Table::render`] says so under the table, so a run is never reported pinned when it was not.
static PIN_FAILURES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many threads could not be pinned so far (see [`pin_current_thread`]).
pub fn pin_failures() -> usize {
    PIN_FAILURES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The logical CPUs this process may run on, in increasing order (empty if they can't be read).
pub fn allowed_cpus() -> Vec<usize> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// Which CPU option a benchmark binary takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuOption {
    /// `--cpu N`: the CPU single-shard runs are pinned to.
    One,
    /// `--cpus A,B`: the two CPUs of a two-shard benchmark.
    Pair,
}

/// The command line every benchmark binary shares: `--only B`, `--quick`, `--svg PATH`, and
/// `--cpu N` or `--cpus A,B`.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// Run only this benchmark (one of the binary's names).
    pub only: Option<&'static str>,
    /// Ten times fewer iterations.
    pub quick: bool,
    /// Where the chart goes.
    pub svg: std::path::PathBuf,
    /// `--cpu N`, where taken.
    pub cpu: Option<usize>,
    /// `--cpus A,B`, where taken.
    pub cpus: Option<(usize, usize)>,
}

impl BenchArgs {
    /// Parses the process arguments of binary `name`, whose benchmarks are `benches`. On
    /// `--help` prints `usage` and gives `Err(SUCCESS)`; on a bad argument says why on stderr
    /// with `usage` and gives `Err(2)`: the caller returns that exit code.
    pub fn parse(
        name: &str,
        benches: &'static [&'static str],
        cpu_option: CpuOption,
        usage: &str,
    ) -> Result<BenchArgs, std::process::ExitCode> {
        match Self::parse_from(std::env::args().skip(1), name, benches, cpu_option) {
            Ok(a) => Ok(a),
            Err(e) if e.is_empty() => {
                println!("{usage}");
                Err(std::process::ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("{name}: {e}");
                eprintln!("{usage}");
                Err(std::process::ExitCode::from(2))
            }
        }
    }

    /// [`parse`](Self::parse) on given arguments; `Err("")` means `--help`.
    pub fn parse_from(
        args: impl IntoIterator<Item = String>,
        name: &str,
        benches: &'static [&'static str],
        cpu_option: CpuOption,
    ) -> Result<BenchArgs, String> {
        let mut out = BenchArgs {
            only: None,
            quick: false,
            svg: default_svg(name),
            cpu: None,
            cpus: None,
        };
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            match (a.as_str(), cpu_option) {
                ("--only", _) => {
                    let v = it.next().ok_or("--only needs a benchmark name")?;
                    let b = benches
                        .iter()
                        .find(|b| **b == v)
                        .ok_or_else(|| format!("--only {v}: not one of {}", benches.join("|")))?;
                    out.only = Some(b);
                }
                ("--quick", _) => out.quick = true,
                ("--svg", _) => out.svg = it.next().ok_or("--svg needs a path")?.into(),
                ("--cpu", CpuOption::One) => {
                    let v = it.next().ok_or("--cpu needs a CPU number")?;
                    out.cpu = Some(v.parse().map_err(|e| format!("--cpu {v}: {e}"))?);
                }
                ("--cpus", CpuOption::Pair) => {
                    let v = it.next().ok_or("--cpus needs a value like 0,1")?;
                    out.cpus = Some(parse_cpu_pair(&v).map_err(|e| format!("--cpus {v}: {e}"))?);
                }
                ("-h" | "--help", _) => return Err(String::new()),
                (other, _) => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(out)
    }

    /// The benchmarks to run: `--only`'s, or all of them.
    pub fn selected(&self, benches: &'static [&'static str]) -> Vec<&'static str> {
        match self.only {
            Some(b) => vec![b],
            None => benches.to_vec(),
        }
    }
}

/// Which I/O driver an xtc executor built here, with `XTC_IO` read as the benchmarks' own
/// executors read it, would run ("io_uring", "epoll"), for a benchmark's header: where
/// io_uring is unavailable xtc falls back to epoll, and its figures are then epoll's. Cost:
/// one executor built and dropped.
pub fn xtc_io_driver() -> String {
    #[cfg(feature = "xtc")]
    {
        let built = xtc::Executor::builder()
            .shards(1)
            .oversubscribe(true)
            .env()
            .and_then(|b| b.build());
        match built {
            Ok(exec) => format!("{:?}", exec.io_driver()),
            Err(e) => format!("unknown ({e})"),
        }
    }
    #[cfg(not(feature = "xtc"))]
    {
        "none (built without the `xtc` feature)".into()
    }
}

/// Where a benchmark writes its chart by default: `target/bench-NAME.svg` in the workspace.
pub fn default_svg(name: &str) -> std::path::PathBuf {
    // bench/ is one level under the workspace root.
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join(format!("bench-{name}.svg"))
}

/// Parses a pair of logical CPU ids written `A,B` (spaces allowed), as in `--cpus 0,1`.
pub fn parse_cpu_pair(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: wants two CPUs written A,B"))?;
    let cpu = |v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|e| format!("{s:?}: {v:?} is not a CPU number: {e}"))
    };
    Ok((cpu(a)?, cpu(b)?))
}

/// The two distinct CPUs a two-shard benchmark runs on: `asked` (from `--cpus A,B`) if given,
/// else the first two of `allowed`; an error that says what to do when there are not two, when
/// they are the same CPU, or when one is outside a known `allowed` set (an empty set is unknown).
pub fn pick_cpu_pair(
    asked: Option<(usize, usize)>,
    allowed: &[usize],
) -> Result<(usize, usize), String> {
    let cpus = match (asked, allowed) {
        (Some(c), _) => c,
        (None, [a, b, ..]) => (*a, *b),
        (None, _) => {
            return Err(format!(
                "needs two CPUs, one per shard, but the allowed set is {allowed:?}: \
                 run it where two CPUs are allowed"
            ))
        }
    };
    if cpus.0 == cpus.1 {
        return Err(format!(
            "--cpus {},{}: the two CPUs must differ",
            cpus.0, cpus.1
        ));
    }
    let not_allowed = |c: usize| !allowed.is_empty() && !allowed.contains(&c);
    if not_allowed(cpus.0) || not_allowed(cpus.1) {
        return Err(format!(
            "CPUs {},{} are not both in the allowed set {allowed:?}",
            cpus.0, cpus.1
        ));
    }
    Ok(cpus)
}

/// The median of `samples` (the upper middle one for an even count); `None` when empty.
pub fn median<T: Ord + Copy>(samples: &[T]) -> Option<T> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied()
}

/// Runs `f` on a fresh thread, optionally pinned to `cpu`, and returns its result; a panic comes
/// back as `Err` with the panic message, and so does a run still going after `deadline`.
///
/// Each runtime gets its own thread so that its thread-locals (current runtime, scoped TLS of the
/// executor, I/O rings) are created and destroyed with it, and one runtime's failure does not end
/// the whole comparison. The deadline is a hang guard, not a measurement: a run past it is
/// abandoned (its thread is left behind, detached) and reported as hung, so that one runtime that
/// never wakes up cannot stop the others from being measured; [`Table::render`] then warns that
/// later figures may share a CPU with it ([`abandoned_runs`]).
pub fn isolated<T, F>(cpu: Option<usize>, deadline: Duration, f: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, String> + Send + 'static,
{
    // A worker for one run: joined when dropped, so the run's thread-locals are gone before
    // the next runtime starts (unless it hung).
    Worker::start(cpu)?.run(deadline, f)
}

/// One runtime's thread for runs taken in turns with other runtimes' ([`Worker::run`]): pinned
/// once, it runs one job at a time, so the runs of several runtimes can alternate (round by
/// round) while each keeps its own warm thread (allocator caches, thread-locals); [`isolated`]
/// is a worker for one run. Dropping it ends the thread and joins it (a hung one is left
/// behind, detached).
#[derive(Debug)]
pub struct Worker<T = Duration> {
    jobs: Option<std::sync::mpsc::Sender<Job<T>>>,
    results: std::sync::mpsc::Receiver<Result<T, String>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// A run went past its deadline: the thread is left behind, and takes no more jobs.
    hung: bool,
}

type Job<T> = Box<dyn FnOnce() -> Result<T, String> + Send>;

impl<T: Send + 'static> Worker<T> {
    /// Starts the thread, pinned to `cpu` if given (unpinned is a valid, noisier run).
    pub fn start(cpu: Option<usize>) -> Result<Worker<T>, String> {
        let (jobs, rx) = std::sync::mpsc::channel::<Job<T>>();
        let (tx, results) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("xtc-bench-run".into())
            .spawn(move || {
                if let Some(cpu) = cpu {
                    let _ = pin_current_thread(cpu);
                }
                for job in rx {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                        .unwrap_or_else(|p| Err(panic_message(&*p)));
                    if tx.send(r).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| format!("could not spawn the benchmark thread: {e}"))?;
        Ok(Worker {
            jobs: Some(jobs),
            results,
            thread: Some(thread),
            hung: false,
        })
    }

    /// Runs `job` on this worker's thread and waits for its result: a panic comes back as
    /// `Err` with its message, and so does a run still going after `deadline` (the worker
    /// is then abandoned, counted in [`abandoned_runs`], and refuses later jobs).
    pub fn run(
        &mut self,
        deadline: Duration,
        job: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        if self.hung {
            return Err("an earlier run hung on this thread".to_string());
        }
        let sent = self.jobs.as_ref().map(|j| j.send(Box::new(job)));
        if !matches!(sent, Some(Ok(()))) {
            return Err("the benchmark thread is gone".to_string());
        }
        match self.results.recv_timeout(deadline) {
            Ok(r) => r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                self.hung = true;
                ABANDONED_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(format!(
                    "hung: no result after {:.0} s, run abandoned",
                    deadline.as_secs_f64()
                ))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err("the benchmark thread ended without a result".to_string())
            }
        }
    }
}

impl<T> Drop for Worker<T> {
    fn drop(&mut self) {
        // Closing the queue ends the thread's loop; a hung one is left detached.
        self.jobs.take();
        if let Some(thread) = self.thread.take().filter(|_| !self.hung) {
            let _ = thread.join();
        }
    }
}

/// Runs [`isolated`] gave up on. Their threads live on, detached, and may keep a CPU busy (a
/// busy-polling ring thread whose peer hung spins for good, on the CPU the later runs are pinned
/// to): [`Table::render`] says so under the table, so figures measured beside them are not read
/// as clean.
static ABANDONED_RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many runs [`isolated`] has abandoned so far.
pub fn abandoned_runs() -> usize {
    ABANDONED_RUNS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The message of a panic payload, as a string.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}

/// Formats a number with about four significant figures and no exponent.
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Which direction of a metric is the good one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Throughput-like: more is better.
    Higher,
    /// Latency- or cost-like: less is better.
    Lower,
    /// Goal-like: the nearer the reference value (a ratio of 1.00x), the better.
    Closer,
}

impl Better {
    /// `"higher"` or `"lower"`.
    pub fn word(self) -> &'static str {
        match self {
            Better::Higher => "higher",
            Better::Lower => "lower",
            Better::Closer => "closer",
        }
    }
}

/// One metric measured on every runtime.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured, e.g. `spawn+join`.
    pub name: String,
    /// Unit of the values, e.g. `M tasks/s`.
    pub unit: String,
    /// Which direction is good.
    pub better: Better,
    /// One result per column of the table: the value, or why there is none.
    pub values: Vec<Result<f64, String>>,
}

/// A results table: one row per metric, one column per runtime, then ratio columns
/// `base/peer` (for example `xtc/monoio`).
///
/// A ratio above 1 means the base has the larger value; whether that is good is in the `better`
/// column (higher for throughput, lower for latency and CPU).
#[derive(Debug, Clone)]
pub struct Table {
    /// Column names (runtimes), in order.
    pub columns: Vec<String>,
    /// Index into `columns` of the runtime whose ratios are printed.
    pub base: usize,
    /// Indices into `columns` of the runtimes the base is divided by, in print order.
    pub ratios_vs: Vec<usize>,
    /// The rows, in print order.
    pub rows: Vec<Row>,
}

impl Table {
    /// One chart panel per row, a bar per column (runtime).
    pub fn panels(&self) -> Vec<svg::Panel> {
        self.rows
            .iter()
            .map(|row| svg::Panel {
                title: row.name.clone(),
                unit: row.unit.clone(),
                better: row.better,
                bars: self
                    .columns
                    .iter()
                    .zip(&row.values)
                    .map(|(n, v)| (n.clone(), v.as_ref().ok().copied()))
                    .collect(),
            })
            .collect()
    }

    /// An empty table with the given runtime columns; ratios are `columns[base] / columns[i]`
    /// for each `i` in `ratios_vs`.
    pub fn new(columns: Vec<String>, base: usize, ratios_vs: Vec<usize>) -> Self {
        Table {
            columns,
            base,
            ratios_vs,
            rows: Vec::new(),
        }
    }

    /// Adds a row; `values` must have one entry per column.
    pub fn push(&mut self, row: Row) {
        assert_eq!(row.values.len(), self.columns.len(), "one value per column");
        self.rows.push(row);
    }

    /// `base / vs` for `row`, if both values exist and `vs` is not zero.
    pub fn ratio(&self, row: &Row, vs: usize) -> Option<f64> {
        let b = row.values[self.base].as_ref().ok()?;
        let v = row.values[vs].as_ref().ok()?;
        (*v != 0.0).then(|| b / v)
    }

    /// Renders the table as aligned text, followed by a note for each missing value.
    pub fn render(&self) -> String {
        let mut header = vec![
            "benchmark".to_string(),
            "unit".to_string(),
            "better".to_string(),
        ];
        header.extend(self.columns.iter().cloned());
        for &i in &self.ratios_vs {
            header.push(format!("{}/{}", self.columns[self.base], self.columns[i]));
        }
        let mut lines = vec![header];
        let mut notes = Vec::new();
        for row in &self.rows {
            let mut cells = vec![
                row.name.clone(),
                row.unit.clone(),
                row.better.word().to_string(),
            ];
            for (col, v) in row.values.iter().enumerate() {
                cells.push(match v {
                    Ok(v) => fmt_num(*v),
                    Err(why) => {
                        notes.push(format!("{} / {}: {}", row.name, self.columns[col], why));
                        "n/a".to_string()
                    }
                });
            }
            for &i in &self.ratios_vs {
                cells.push(match self.ratio(row, i) {
                    Some(r) => format!("{r:.2}x"),
                    None => "-".to_string(),
                });
            }
            lines.push(cells);
        }
        let ncol = lines[0].len();
        let widths: Vec<usize> = (0..ncol)
            .map(|c| {
                lines
                    .iter()
                    .map(|l| l[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for (n, line) in lines.iter().enumerate() {
            for (c, cell) in line.iter().enumerate() {
                if c > 0 {
                    out.push_str(" | ");
                }
                // Names left-aligned, numbers right-aligned.
                if c < 3 {
                    let _ = write!(out, "{cell:<w$}", w = widths[c]);
                } else {
                    let _ = write!(out, "{cell:>w$}", w = widths[c]);
                }
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
            if n == 0 {
                let total = widths.iter().sum::<usize>() + 3 * (ncol - 1);
                out.push_str(&"-".repeat(total));
                out.push('\n');
            }
        }
        notes.dedup();
        for note in notes {
            let _ = writeln!(out, "  n/a: {note}");
        }
        let unpinned = pin_failures();
        if unpinned > 0 {
            let _ = writeln!(
                out,
                "  WARNING: {unpinned} benchmark thread(s) could not be pinned to the CPU asked \
                 and ran unpinned: those figures are noisier than the header says"
            );
        }
        let abandoned = abandoned_runs();
        if abandoned > 0 {
            let _ = writeln!(
                out,
                "  WARNING: {abandoned} hung run(s) were abandoned with their threads still \
                 running: figures measured after them may share a CPU with those threads"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_upper_middle() {
        assert_eq!(median::<u64>(&[]), None);
        assert_eq!(median(&[7]), Some(7));
        assert_eq!(median(&[9, 1, 5, 3]), Some(5));
    }

    #[test]
    fn summary_of_known_samples() {
        let mut h = latency_histogram();
        for v in 1..=1000u64 {
            h.record(v).unwrap();
        }
        let s = LatencySummary::from_histogram(&h);
        assert_eq!(s.count, 1000);
        assert_eq!(s.p50_ns, 500);
        assert_eq!(s.p99_ns, 990);
        assert!(s.line_ns().contains("p50=500 ns"));
    }

    #[test]
    fn table_ratios_and_missing_values() {
        let mut t = Table::new(
            vec!["xtc".into(), "raw".into(), "tokio".into()],
            0,
            vec![1, 2],
        );
        t.push(Row {
            name: "spawn".into(),
            unit: "M/s".into(),
            better: Better::Higher,
            values: vec![Ok(4.0), Ok(8.0), Err("not built".into())],
        });
        let text = t.render();
        assert!(text.contains("xtc/raw"), "{text}");
        assert!(text.contains("0.50x"), "{text}");
        assert!(text.contains("n/a: spawn / tokio: not built"), "{text}");
    }

    #[test]
    fn cpu_pairs() {
        assert_eq!(parse_cpu_pair("0,1"), Ok((0, 1)));
        assert_eq!(parse_cpu_pair(" 3 , 2 "), Ok((3, 2)));
        assert!(parse_cpu_pair("0").is_err());
        assert!(parse_cpu_pair("0,x").is_err());
    }

    #[test]
    fn cpu_pair_choice() {
        assert_eq!(pick_cpu_pair(None, &[2, 5, 7]), Ok((2, 5)));
        assert_eq!(pick_cpu_pair(Some((7, 2)), &[2, 5, 7]), Ok((7, 2)));
        assert_eq!(pick_cpu_pair(Some((0, 1)), &[]), Ok((0, 1)));
        assert!(pick_cpu_pair(None, &[3]).is_err());
        assert!(pick_cpu_pair(Some((1, 1)), &[0, 1]).is_err());
        assert!(pick_cpu_pair(Some((0, 9)), &[0, 1]).is_err());
    }

    #[test]
    fn medians() {
        let ms = Duration::from_millis;
        assert_eq!(median::<Duration>(&[]), None);
        assert_eq!(median(&[ms(5), ms(1), ms(3)]), Some(ms(3)));
        assert_eq!(median(&[ms(4), ms(1), ms(3), ms(2)]), Some(ms(3)));
    }

    #[test]
    fn isolated_reports_panics() {
        let long = Duration::from_secs(600);
        let r: Result<(), String> = isolated(None, long, || panic!("boom"));
        assert_eq!(r.unwrap_err(), "panicked: boom");
        assert_eq!(isolated(None, long, || Ok(7)).unwrap(), 7);
    }

    #[test]
    fn isolated_abandons_a_hung_run() {
        let (_keep, park) = std::sync::mpsc::channel::<()>();
        let r: Result<(), String> = isolated(None, Duration::from_millis(10), move || {
            let _ = park.recv();
            Ok(())
        });
        assert!(r.unwrap_err().starts_with("hung"));
        // Its thread lives on (it may spin on the CPU every later run is pinned to): every
        // table rendered after it says so.
        let text = Table::new(vec!["xtc".into()], 0, vec![]).render();
        assert!(text.contains("abandoned"), "{text}");
    }

    /// A worker runs its jobs one at a time on one thread (thread-locals carry over from run
    /// to run); a panic comes back as `Err` and the worker goes on; a hung run is abandoned and
    /// the worker refuses what comes after it.
    #[test]
    fn a_worker_runs_jobs_on_one_thread_until_one_hangs() {
        thread_local!(static RUNS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
        let mut w = Worker::start(None).unwrap();
        let run = || {
            RUNS.with(|r| r.set(r.get() + 1));
            Ok(Duration::from_millis(u64::from(RUNS.with(|r| r.get()))))
        };
        let long = Duration::from_secs(60);
        assert_eq!(w.run(long, run), Ok(Duration::from_millis(1)));
        assert_eq!(
            w.run(long, run),
            Ok(Duration::from_millis(2)),
            "the same thread"
        );
        let e = w.run(long, || panic!("boom in a run")).unwrap_err();
        assert!(e.contains("boom in a run"), "{e}");
        assert_eq!(w.run(long, run), Ok(Duration::from_millis(3)), "it went on");
        let (_keep, park) = std::sync::mpsc::channel::<()>();
        let hung = w.run(Duration::from_millis(10), move || {
            let _ = park.recv();
            Ok(Duration::ZERO)
        });
        assert!(hung.unwrap_err().starts_with("hung"));
        assert!(w.run(long, run).unwrap_err().contains("hung"));
    }

    #[test]
    fn pinning_past_the_cpu_set_fails_instead_of_panicking() {
        // `--cpu 5000` where the allowed set cannot be read reaches this unchecked.
        let failures = pin_failures();
        let r = std::thread::spawn(|| pin_current_thread(libc::CPU_SETSIZE as usize + 976)).join();
        assert_eq!(r.ok(), Some(false), "a failed pin, not a panic");
        assert!(pin_failures() > failures, "counted, so the table warns");
    }

    #[test]
    fn cpu_time_moves_forward() {
        let m = CpuMeter::start();
        // Work until this thread's own clock says it computed 5 ms (a loaded machine may take
        // longer to get there, never less): the process's CPU time covers at least that.
        let t0 = thread_cpu_time();
        let mut x = 0u64;
        while thread_cpu_time() - t0 < Duration::from_millis(5) {
            for i in 0..10_000u64 {
                x = x.wrapping_add(std::hint::black_box(i));
            }
        }
        std::hint::black_box(x);
        let spent = thread_cpu_time() - t0;
        let u = m.stop();
        // Less a millisecond for rounding (`getrusage` gives microseconds): still some 4 ms.
        assert!(
            u.cpu >= spent.saturating_sub(Duration::from_millis(1)),
            "{u:?}, this thread alone {spent:?}"
        );
        assert!(u.percent_of_one_cpu() > 0.0, "{u:?}");
    }
}

#[cfg(test)]
mod args_tests {
    use super::*;

    fn parse(args: &[&str], opt: CpuOption) -> Result<BenchArgs, String> {
        BenchArgs::parse_from(args.iter().map(|s| s.to_string()), "t", &["a", "b"], opt)
    }

    #[test]
    fn common_options() {
        let a = parse(
            &["--only", "b", "--quick", "--cpus", "0,1"],
            CpuOption::Pair,
        )
        .unwrap();
        assert_eq!(a.only, Some("b"));
        assert!(a.quick);
        assert_eq!(a.cpus, Some((0, 1)));
        assert_eq!(a.selected(&["a", "b"]), vec!["b"]);
        assert!(a.svg.ends_with("bench-t.svg"));
        assert_eq!(
            parse(&[], CpuOption::One).unwrap().selected(&["a", "b"]),
            vec!["a", "b"]
        );
    }

    #[test]
    fn bad_options() {
        assert!(parse(&["--only", "c"], CpuOption::One).is_err());
        assert!(
            parse(&["--cpus", "0,1"], CpuOption::One).is_err(),
            "not taken here"
        );
        assert!(parse(&["--cpu", "x"], CpuOption::One).is_err());
        assert_eq!(parse(&["--help"], CpuOption::One).unwrap_err(), "");
    }
}
