//! Raw core-to-core baseline: what crossing between two CPUs costs with nothing else in the way.
//!
//! Two threads, pinned to two CPUs, exchange a `u64` over a pair of `rtrb` rings by busy-polling:
//!
//! 1. **round trip**: the pinger pushes a number and spins until the echo comes back; each round
//!    trip is timed and recorded in an hdrhistogram (p50 / p99 / p99.9 in ns);
//! 2. **one-way stream**: one thread pushes numbers one at a time, the other pops them one at a
//!    time; reported as messages per second.
//!
//! This is the floor under any runtime's cross-shard message: xtc's `submit_to` rides the same
//! kind of ring, so its latency is judged against this number.
//!
//! With `--matrix` it measures the round trip of **one cache line** between every pair of CPUs
//! instead (all allowed ones, or a `--cpus` list such as `0-7,16-23`): no ring, no clock read
//! per round trip, the line on a page of its own that the row's CPU touches first, so it lives
//! in that CPU's NUMA node's memory whatever pair ran before (see [`line_round_trips`]). The
//! pairs are measured in [`PASSES`] passes, each in its own shuffled order, so a noisy stretch
//! or a drifting clock frequency spreads over the matrix instead of marking a block of it. It
//! orders the CPUs by package, NUMA node and core from the hwloc topology, prints the matrix of
//! medians and a summary per level of the machine the pair shares (`same core`: SMT siblings,
//! `shared L3`, `same NUMA node`, `same package`, `machine`: across packages), and draws it as
//! an SVG heatmap with lines between NUMA nodes: the picture of a host's NUMA effects.
//!
//! ```text
//! c2c [--cpus A,B] [--iters N] [--quick]
//! c2c --matrix [--cpus LIST] [--iters N] [--quick] [--svg PATH]
//! ```
//!
//! `--iters` (default 1,000,000) round trips follow 10,000 warm-up ones; the stream sends ten
//! times as many messages. `--quick` divides both by ten. With only one CPU allowed, both threads
//! share it and yield to each other while waiting instead of spinning; the output says so.
//! In matrix mode `--iters` counts per pair, over all passes (default 100,000: about 15 to 70 ms
//! a pair, so 120 pairs of 16 CPUs take a few seconds and 8,128 pairs of 128 CPUs several
//! minutes), a progress bar shows the pairs done (a line per pass where stderr is no terminal),
//! and the heatmap goes to `target/bench-c2c-matrix.svg` unless `--svg` says otherwise (checked
//! before anything is measured). It needs two allowed CPUs.

use std::{
    hint::spin_loop,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use rtrb::RingBuffer;
use xtc_bench::{
    allowed_cpus, latency_histogram, pin_current_thread, pin_failures, record, LatencySummary,
};

const WARMUP: u64 = 10_000;
const DEFAULT_ITERS: u64 = 1_000_000;
/// Timed round trips per pair in `--matrix` mode: a hundredth of a second or so per pair.
const DEFAULT_MATRIX_ITERS: u64 = 100_000;
/// Ring capacity for the stream phase; large enough that the producer rarely sees it full, small
/// enough to stay in L2.
const STREAM_CAP: usize = 4096;

#[derive(Debug)]
struct Args {
    cpus: Option<(usize, usize)>,
    /// `--matrix`: every pair of these CPUs (empty: every allowed one).
    matrix: Option<Vec<usize>>,
    iters: u64,
    quick: bool,
    svg: PathBuf,
}

fn usage() -> &'static str {
    "usage: c2c [--cpus A,B] [--iters N] [--quick]\n\
     \x20      c2c --matrix [--cpus LIST] [--iters N] [--quick] [--svg PATH]\n\
     \n  --cpus A,B   the two logical CPUs to pin to (default: the first two allowed)\
     \n  --iters N    timed round trips after 10,000 warm-up ones (default 1000000; per pair\
     \n               with --matrix, default 100000)\
     \n  --quick      ten times fewer iterations\
     \n  --matrix     round trips between every pair of CPUs, as a table and an SVG heatmap\
     \n  --cpus LIST  with --matrix: the CPUs, e.g. 0-7,16-23 (default: every allowed one)\
     \n  --svg PATH   with --matrix: where the heatmap goes (default target/bench-c2c-matrix.svg)"
}

/// Parses a CPU list such as `0-3,8,10-11` into sorted, distinct ids.
fn parse_cpu_list(v: &str) -> Result<Vec<usize>, String> {
    // Checked before a range is expanded (`0-100000000000` would allocate for every id in
    // it): no CPU at or past CPU_SETSIZE can be pinned to.
    let num = |s: &str| {
        let cpu = s
            .trim()
            .parse::<usize>()
            .map_err(|e| format!("--cpus {v}: {s:?} is not a CPU number: {e}"))?;
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(format!(
                "--cpus {v}: CPU {cpu} is past CPU_SETSIZE ({}): no thread can be pinned to it",
                libc::CPU_SETSIZE
            ));
        }
        Ok(cpu)
    };
    let mut cpus = Vec::new();
    for part in v.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("--cpus {v}: the range {a}-{b} runs backwards"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

fn parse_args() -> Result<Args, String> {
    parse_args_from(std::env::args().skip(1))
}

/// [`parse_args`] on given arguments; `Err("")` means `--help`.
fn parse_args_from(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        cpus: None,
        matrix: None,
        iters: DEFAULT_ITERS,
        quick: false,
        svg: xtc_bench::default_svg("c2c-matrix"),
    };
    let (mut cpus, mut iters, mut svg) = (None, None, None);
    let mut it = argv.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--cpus" => cpus = Some(it.next().ok_or("--cpus needs a value like 0,1")?),
            "--iters" => {
                let v = it.next().ok_or("--iters needs a number")?;
                iters = Some(
                    v.replace('_', "")
                        .parse()
                        .map_err(|e| format!("--iters {v}: {e}"))?,
                );
            }
            "--quick" => args.quick = true,
            "--matrix" => args.matrix = Some(Vec::new()),
            "--svg" => svg = Some(PathBuf::from(it.next().ok_or("--svg needs a path")?)),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match (&mut args.matrix, cpus) {
        (Some(list), Some(v)) => *list = parse_cpu_list(&v)?,
        (None, Some(v)) => {
            args.cpus = Some(xtc_bench::parse_cpu_pair(&v).map_err(|e| format!("--cpus {v}: {e}"))?)
        }
        (_, None) => {}
    }
    if args.matrix.is_some() {
        args.iters = iters.unwrap_or(DEFAULT_MATRIX_ITERS);
    } else {
        if svg.is_some() {
            return Err("--svg goes with --matrix (the pair mode draws nothing)".into());
        }
        args.iters = iters.unwrap_or(DEFAULT_ITERS);
    }
    args.svg = svg.unwrap_or(args.svg);
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if args.quick {
        args.iters = (args.iters / 10).max(1);
    }
    // The warm-up is added to it and the stream sends ten times as many: both must fit a u64,
    // or they wrap (to a run that times nothing, and a stream that never ends).
    if args.iters.checked_mul(10).is_none() || args.iters.checked_add(WARMUP).is_none() {
        return Err(format!(
            "--iters {}: too many (at most {})",
            args.iters,
            u64::MAX / 10
        ));
    }
    Ok(args)
}

/// How a waiting thread passes time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Spin on the ring: each thread owns a CPU.
    Spin,
    /// Yield the CPU: both threads share one CPU, so spinning would only burn the other's slice.
    Yield,
}

impl Wait {
    #[inline]
    fn pause(self) {
        match self {
            Wait::Spin => spin_loop(),
            Wait::Yield => std::thread::yield_now(),
        }
    }
}

/// Passes over every pair in `--matrix` mode, each with a share of `--iters`: a cell is the
/// median of its passes.
const PASSES: usize = 3;

/// Batches of a pair's round trips in one pass, each timed as a whole: a round trip is a batch's
/// time over its count, and the pass's figure is the median batch.
const BATCHES: u64 = 8;

/// An anonymous page of its own for the ping-pong line, unmapped on drop. Mapped fresh for each
/// pair (the allocator would hand back memory some earlier pair's thread touched first) and
/// touched first by the thread that maps it, so the kernel places it on that thread's node.
struct Page(*mut u8);

impl Page {
    const LEN: usize = 4096;

    fn map() -> Page {
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing; no
        // pointer is passed in.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            p != libc::MAP_FAILED,
            "c2c: mmap of one page failed: {}",
            std::io::Error::last_os_error()
        );
        let page = Page(p.cast());
        // The first touch, on this thread's CPU: the page's node is decided here.
        page.line().store(0, std::sync::atomic::Ordering::SeqCst);
        page
    }

    /// The line the two threads pass back and forth.
    fn line(&self) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: the page is mapped, readable, writable, page-aligned (so aligned for a u64)
        // and lives as long as `self`; it is only ever accessed as this one atomic.
        unsafe { &*self.0.cast::<std::sync::atomic::AtomicU64>() }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: `self.0` is the start of the `LEN`-byte mapping `map` made, unmapped once;
        // no reference from `line` outlives `self`.
        unsafe { libc::munmap(self.0.cast(), Self::LEN) };
    }
}

// SAFETY: the page is shared between the two threads only through the atomic in it.
unsafe impl Sync for Page {}
// SAFETY: as above; the mapping is process-wide, not tied to the thread that made it.
unsafe impl Send for Page {}

/// One cache line's round trip between `cpus.0` (the pinger, which maps and first touches the
/// line's page, so it lives on that CPU's node) and `cpus.1` (the echoer): the pinger writes an
/// odd number and spins until the echoer has written the next even one. After [`WARMUP`] round
/// trips, `iters` of them in [`BATCHES`] batches, each timed as a whole (no clock read between
/// round trips); returns the median batch's nanoseconds per round trip.
fn line_round_trips(cpus: (usize, usize), iters: u64) -> f64 {
    use std::sync::atomic::Ordering::{Acquire, Release};
    pin_current_thread(cpus.0);
    let page = Arc::new(Page::map());
    let batch = (iters / BATCHES).max(1);
    let total = WARMUP + batch * BATCHES;
    let echo_page = Arc::clone(&page);
    let echo = std::thread::spawn(move || {
        pin_current_thread(cpus.1);
        let line = echo_page.line();
        for i in 0..total {
            while line.load(Acquire) != 2 * i + 1 {
                spin_loop();
            }
            line.store(2 * i + 2, Release);
        }
    });
    let line = page.line();
    let trip = |i: u64| {
        line.store(2 * i + 1, Release);
        while line.load(Acquire) != 2 * i + 2 {
            spin_loop();
        }
    };
    for i in 0..WARMUP {
        trip(i);
    }
    let mut per_trip: Vec<f64> = (0..BATCHES)
        .map(|b| {
            let from = WARMUP + b * batch;
            let t0 = Instant::now();
            for i in from..from + batch {
                trip(i);
            }
            t0.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    echo.join().expect("echo thread panicked");
    per_trip.sort_by(f64::total_cmp);
    per_trip[per_trip.len() / 2]
}

/// Round trips: returns the histogram summary of `iters` timed round trips.
fn round_trips(cpus: (usize, usize), pin: bool, iters: u64, wait: Wait) -> LatencySummary {
    let (mut ping_tx, mut ping_rx) = RingBuffer::<u64>::new(1);
    let (mut pong_tx, mut pong_rx) = RingBuffer::<u64>::new(1);
    let total = WARMUP + iters;
    let echo = std::thread::spawn(move || {
        if pin {
            pin_current_thread(cpus.1);
        }
        let mut seen = 0;
        while seen < total {
            match ping_rx.pop() {
                Ok(v) => {
                    while pong_tx.push(v).is_err() {
                        wait.pause();
                    }
                    seen += 1;
                }
                Err(_) => wait.pause(),
            }
        }
    });
    if pin {
        pin_current_thread(cpus.0);
    }
    let mut hist = latency_histogram();
    for i in 0..total {
        let t0 = Instant::now();
        while ping_tx.push(i).is_err() {
            wait.pause();
        }
        let v = loop {
            match pong_rx.pop() {
                Ok(v) => break v,
                Err(_) => wait.pause(),
            }
        };
        let rtt = t0.elapsed();
        assert_eq!(v, i, "c2c: the echo of {i} came back as {v}");
        if i >= WARMUP {
            record(&mut hist, rtt);
        }
    }
    echo.join().expect("echo thread panicked");
    assert_eq!(
        hist.len(),
        iters,
        "c2c: {iters} round trips asked, {} timed",
        hist.len()
    );
    LatencySummary::from_histogram(&hist)
}

/// One-way stream: `msgs` single pushes on one CPU, single pops on the other. Returns the time
/// from the common start to the last pop.
fn stream(cpus: (usize, usize), pin: bool, msgs: u64, wait: Wait) -> Duration {
    let (mut tx, mut rx) = RingBuffer::<u64>::new(STREAM_CAP);
    let start = Arc::new(Barrier::new(2));
    let start2 = Arc::clone(&start);
    let producer = std::thread::spawn(move || {
        if pin {
            pin_current_thread(cpus.0);
        }
        start2.wait();
        for i in 0..msgs {
            while tx.push(i).is_err() {
                wait.pause();
            }
        }
    });
    if pin {
        pin_current_thread(cpus.1);
    }
    start.wait();
    let t0 = Instant::now();
    let mut next = 0;
    while next < msgs {
        match rx.pop() {
            Ok(v) => {
                assert_eq!(v, next, "c2c: message {next} arrived as {v}");
                next += 1;
            }
            Err(_) => wait.pause(),
        }
    }
    let elapsed = t0.elapsed();
    producer.join().expect("producer thread panicked");
    elapsed
}

fn main() -> ExitCode {
    let mut args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if e.is_empty() {
                println!("{}", usage());
                return ExitCode::SUCCESS;
            }
            eprintln!("c2c: {e}");
            eprintln!("{}", usage());
            return ExitCode::from(2);
        }
    };
    let allowed = allowed_cpus();
    if let Some(list) = args.matrix.take() {
        return match matrix::run(list, &allowed, &args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("c2c: {e}");
                ExitCode::from(2)
            }
        };
    }
    // `pin`: whether the threads are pinned at all (not when the allowed CPUs are unknown).
    let pin = args.cpus.is_some() || !allowed.is_empty();
    let (cpus, wait, note) = match (args.cpus, allowed.as_slice()) {
        (Some((a, b)), _) if a == b => (
            (a, b),
            Wait::Yield,
            "both threads on one CPU (asked): waiting threads yield instead of spinning, \
                 so this measures context switches, not a core-to-core crossing",
        ),
        (Some(pair), _) => ((pair.0, pair.1), Wait::Spin, ""),
        (None, [a, b, ..]) => ((*a, *b), Wait::Spin, ""),
        (None, [a]) => (
            (*a, *a),
            Wait::Yield,
            "only 1 CPU is available: both threads run on it and yield instead of spinning, \
             so this measures context switches, not a core-to-core crossing",
        ),
        (None, []) => (
            (0, 0),
            Wait::Yield,
            "the allowed CPUs could not be read: threads are not pinned and yield while waiting",
        ),
    };
    if !allowed.is_empty() && (!allowed.contains(&cpus.0) || !allowed.contains(&cpus.1)) {
        eprintln!(
            "c2c: CPUs {},{} are not both in the allowed set {allowed:?}",
            cpus.0, cpus.1
        );
        return ExitCode::from(2);
    }

    let how = match wait {
        Wait::Spin => "busy-polling",
        Wait::Yield => "yielding while waiting",
    };
    println!("c2c: raw core-to-core baseline (rtrb ring pair, {how})");
    println!("  cpus: {} <-> {}   allowed: {allowed:?}", cpus.0, cpus.1);
    if !note.is_empty() {
        println!("  NOTE: {note}");
    }
    println!("  round trips: {} timed after {WARMUP} warm-up", args.iters);
    let rtt = round_trips(cpus, pin, args.iters, wait);
    println!(
        "  round trip  p50 {} ns   p99 {} ns   p99.9 {} ns   (min {} ns, max {} ns, mean {:.1} ns)",
        rtt.p50_ns, rtt.p99_ns, rtt.p999_ns, rtt.min_ns, rtt.max_ns, rtt.mean_ns
    );
    println!("  one-way (half round trip) p50 ~{} ns", rtt.p50_ns / 2);

    let msgs = args.iters * 10;
    let took = stream(cpus, pin, msgs, wait);
    let rate = msgs as f64 / took.as_secs_f64();
    println!(
        "  stream  {msgs} msgs in {:.1} ms: {:.2} M msgs/s ({:.1} ns/msg), cpu {} -> cpu {}",
        took.as_secs_f64() * 1e3,
        rate / 1e6,
        took.as_nanos() as f64 / msgs as f64,
        cpus.0,
        cpus.1
    );
    // A thread that could not be pinned ran wherever the kernel put it: the CPUs printed
    // above are then a request, not what ran.
    let unpinned = pin_failures();
    if unpinned > 0 {
        println!(
            "  WARNING: {unpinned} thread(s) could not be pinned: the figures are from unpinned threads"
        );
    }
    ExitCode::SUCCESS
}

/// `--matrix`: the round trip between every pair of CPUs, grouped by the topology.
mod matrix {
    use std::process::ExitCode;

    use indicatif::{ProgressBar, ProgressStyle};
    use xtc_bench::{heatmap::Heatmap, median, pin_failures, svg::report_written};

    use super::{line_round_trips, Args, PASSES, WARMUP};

    /// Where a CPU sits in the machine, as far as hwloc says (all `None` without it).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
    pub(super) struct Place {
        pub(super) package: Option<usize>,
        pub(super) numa: Option<usize>,
        pub(super) core: Option<usize>,
    }

    /// The topology's view of the measured CPUs: each one's place, and the level of the
    /// machine a pair shares (`None` when hwloc could not be read or the `xtc` feature, which
    /// brings xtc-numa, is off).
    struct View {
        places: Vec<Place>,
        #[cfg(feature = "xtc")]
        topo: Option<xtc::numa::Topology>,
    }

    impl View {
        fn of(cpus: &[usize]) -> View {
            #[cfg(feature = "xtc")]
            {
                match xtc::numa::Topology::detect() {
                    Ok(t) => View {
                        places: cpus
                            .iter()
                            .map(|&c| Place {
                                package: t.package_of(c),
                                numa: t.numa_node_of(c),
                                core: t.core_of(c),
                            })
                            .collect(),
                        topo: Some(t),
                    },
                    Err(e) => {
                        println!(
                            "  NOTE: the topology could not be read ({e}): CPUs are not grouped"
                        );
                        View {
                            places: vec![Place::default(); cpus.len()],
                            topo: None,
                        }
                    }
                }
            }
            #[cfg(not(feature = "xtc"))]
            {
                println!(
                    "  NOTE: built without the xtc feature (no topology): CPUs are not grouped"
                );
                View {
                    places: vec![Place::default(); cpus.len()],
                }
            }
        }

        /// What two CPUs share, in words, or `None` without a topology.
        fn shared(&self, a: usize, b: usize) -> Option<String> {
            #[cfg(feature = "xtc")]
            {
                self.topo.as_ref()?.level(a, b).map(|l| l.to_string())
            }
            #[cfg(not(feature = "xtc"))]
            {
                let _ = (a, b);
                None
            }
        }
    }

    /// CPUs in the order the matrix shows them: by package, NUMA node, core, then id, so a
    /// node's CPUs are neighbours and SMT siblings sit side by side.
    pub(super) fn order(cpus: &[usize], places: &[Place]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..cpus.len()).collect();
        idx.sort_by_key(|&i| (places[i], cpus[i]));
        idx
    }

    pub(super) fn run(
        list: Vec<usize>,
        allowed: &[usize],
        args: &Args,
    ) -> Result<ExitCode, String> {
        let cpus = if list.is_empty() {
            allowed.to_vec()
        } else {
            list
        };
        if let Some(c) = cpus
            .iter()
            .find(|c| !allowed.is_empty() && !allowed.contains(c))
        {
            return Err(format!(
                "--matrix: CPU {c} is not in the allowed set {allowed:?}: pick CPUs from it"
            ));
        }
        if cpus.len() < 2 {
            return Err(format!(
                "--matrix needs at least two CPUs, and has {cpus:?} (allowed: {allowed:?}): \
                 run it where two CPUs are allowed, or give them with --cpus"
            ));
        }
        // Refused now, not after the whole run: a path that cannot be written.
        std::fs::File::create(&args.svg)
            .map_err(|e| format!("--svg {}: cannot write it: {e}", args.svg.display()))?;
        println!(
            "c2c --matrix: one cache line's round trip between every pair of CPUs (busy-polling; \
             the line on a fresh page first touched by the row's CPU, so in its node's memory)"
        );
        let per_pass = (args.iters / PASSES as u64).max(1);
        println!(
            "  cpus: {cpus:?}   {PASSES} passes over the pairs, each in its own shuffled order, \
             {per_pass} timed round trips per pair and pass after {WARMUP} warm-up"
        );
        let view = View::of(&cpus);
        let shown = order(&cpus, &view.places);
        let n = cpus.len();
        let mut pairs: Vec<(usize, usize)> = (0..n)
            .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
            .collect();
        let bar = ProgressBar::new((pairs.len() * PASSES) as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} pairs {msg} [{elapsed}<{eta}]")
                .expect("static progress template is valid"),
        );
        // Where stderr is no terminal (`| tee`, `nohup`) the bar draws nothing: a line per pass.
        let plain = !std::io::IsTerminal::is_terminal(&std::io::stderr());
        let started = std::time::Instant::now();
        // Each pair's figure per pass, in `shown` order (upper triangle).
        let mut passes = vec![Vec::with_capacity(PASSES); n * n];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for pass in 0..PASSES {
            shuffle(&mut pairs, &mut seed);
            for &(i, j) in &pairs {
                let (a, b) = (cpus[shown[i]], cpus[shown[j]]);
                bar.set_message(format!("pass {}: cpu {a} <-> cpu {b}", pass + 1));
                passes[i * n + j].push(line_round_trips((a, b), per_pass));
                bar.inc(1);
            }
            if plain {
                eprintln!(
                    "c2c --matrix: pass {}/{PASSES} done, {} pairs, {:.0} s so far",
                    pass + 1,
                    pairs.len(),
                    started.elapsed().as_secs_f64()
                );
            }
        }
        bar.finish_and_clear();
        // The median pass per pair, mirrored: what a line costs does not depend on who starts.
        let mut p50 = vec![None; n * n];
        for &(i, j) in &pairs {
            let mut v = std::mem::take(&mut passes[i * n + j]);
            v.sort_by(f64::total_cmp);
            let m = v[v.len() / 2].round() as u64;
            p50[i * n + j] = Some(m);
            p50[j * n + i] = Some(m);
        }

        println!(
            "\n  cache-line round trip, ns, the median of {PASSES} passes (row and column: the \
             pair's CPUs; measured from the one with the lower position here, whose node holds \
             the line)"
        );
        let width = 7;
        let mut head = format!("  {:>width$}", "cpu");
        for &i in &shown {
            head.push_str(&format!(" {:>width$}", cpus[i]));
        }
        println!("{head}");
        for (r, &i) in shown.iter().enumerate() {
            let mut line = format!("  {:>width$}", cpus[i]);
            for c in 0..n {
                match p50[r * n + c] {
                    Some(v) => line.push_str(&format!(" {v:>width$}")),
                    None => line.push_str(&format!(" {:>width$}", "-")),
                }
            }
            println!("{line}");
        }

        // What a pair shares (SMT siblings, an L3, a node, nothing) against what it costs.
        let mut by_level: Vec<(String, Vec<u64>)> = Vec::new();
        for r in 0..n {
            for c in r + 1..n {
                let Some(level) = view.shared(cpus[shown[r]], cpus[shown[c]]) else {
                    continue;
                };
                let m = p50[r * n + c].unwrap_or(0);
                match by_level.iter_mut().find(|(l, _)| *l == level) {
                    Some((_, ms)) => ms.push(m),
                    None => by_level.push((level, vec![m])),
                }
            }
        }
        if !by_level.is_empty() {
            by_level.sort_by_key(|(_, ms)| median(ms));
            println!(
                "\n  by what the pair shares (`same core`: SMT siblings; `machine`: across \
                 packages), median over its pairs, nearest first:"
            );
            for (level, ms) in &by_level {
                let (lo, hi) = (ms.iter().min().copied(), ms.iter().max().copied());
                println!(
                    "    {level:<16} {:>6} pairs   {} ns ({}..{})",
                    ms.len(),
                    median(ms).unwrap_or(0),
                    lo.unwrap_or(0),
                    hi.unwrap_or(0),
                );
            }
        }
        let unpinned = pin_failures();
        if unpinned > 0 {
            println!(
                "  WARNING: {unpinned} thread(s) could not be pinned: the figures are from unpinned threads"
            );
        }

        // One id per shown CPU from its place (none at all where no CPU has one).
        let per_cpu = |of: fn(&Place) -> Option<usize>| -> Vec<usize> {
            if view.places.iter().any(|p| of(p).is_some()) {
                shown
                    .iter()
                    .map(|&i| of(&view.places[i]).unwrap_or(usize::MAX))
                    .collect()
            } else {
                Vec::new()
            }
        };
        let labels = shown
            .iter()
            .map(|&i| match view.places[i].numa {
                Some(node) => format!("{} (n{node})", cpus[i]),
                None => cpus[i].to_string(),
            })
            .collect();
        let map = Heatmap {
            title: "c2c: core-to-core cache-line round trip".into(),
            subtitle: format!(
                "one line, busy-polling, median of {PASSES} shuffled passes of {per_pass} round \
                 trips per pair; thin lines between NUMA nodes, thick between packages"
            ),
            unit: "ns".into(),
            labels,
            groups: per_cpu(|p| p.numa),
            supergroups: per_cpu(|p| p.package),
            values: p50.iter().map(|v| v.map(|v| v as f64)).collect(),
        };
        Ok(report_written("c2c", &args.svg, map.write(&args.svg)))
    }

    /// Fisher-Yates with xorshift64: a pass's order, the same for every run.
    fn shuffle(pairs: &mut [(usize, usize)], seed: &mut u64) {
        for k in (1..pairs.len()).rev() {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            pairs.swap(k, (*seed % (k as u64 + 1)) as usize);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_shuffled_pass_holds_every_pair_once() {
            let mut pairs: Vec<(usize, usize)> = (0..6)
                .flat_map(|i| (i + 1..6).map(move |j| (i, j)))
                .collect();
            let want = pairs.clone();
            let mut seed = 1;
            shuffle(&mut pairs, &mut seed);
            let first = pairs.clone();
            assert_ne!(first, want, "15 pairs left in order");
            shuffle(&mut pairs, &mut seed);
            assert_ne!(pairs, first, "two passes, one order");
            pairs.sort_unstable();
            assert_eq!(pairs, want);
        }

        #[test]
        fn nodes_come_together_and_siblings_side_by_side() {
            let p = |numa, core| Place {
                package: Some(0),
                numa: Some(numa),
                core: Some(core),
            };
            // CPUs 0..4: node of each alternates, as on hosts that number CPUs round-robin.
            let cpus = [0, 1, 2, 3];
            let places = [p(0, 0), p(1, 2), p(0, 1), p(1, 2)];
            let shown: Vec<usize> = order(&cpus, &places).iter().map(|&i| cpus[i]).collect();
            assert_eq!(shown, [0, 2, 1, 3]);
            // Without a topology: by id.
            let shown = order(&[5, 1, 3], &[Place::default(); 3]);
            assert_eq!(shown, [1, 2, 0]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_args_from, parse_cpu_list, Args};

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args_from(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn iteration_counts_that_overflow_are_refused() {
        // `WARMUP + iters` and the stream's `iters * 10` wrapped: 9,999 untimed round trips
        // reported as p50 0 ns, then a stream of 2^64 - 10 messages that never ended.
        assert!(parse(&["--iters", "18446744073709551615"]).is_err());
        assert!(parse(&["--iters", "1844674407370955162"]).is_err());
        assert_eq!(parse(&["--iters", "1000"]).unwrap().iters, 1000);
        // Zero is refused with --quick too (it became 1).
        assert!(parse(&["--iters", "0", "--quick"]).is_err());
        assert_eq!(parse(&["--iters", "5", "--quick"]).unwrap().iters, 1);
    }

    #[test]
    fn cpu_lists_past_the_cpu_set_are_refused_before_they_are_expanded() {
        // `0-100000000000` allocated 800 GB and aborted; no CPU at or past CPU_SETSIZE can be
        // pinned to anyway.
        assert!(parse_cpu_list("0-100000000000")
            .unwrap_err()
            .contains("CPU_SETSIZE"));
        assert!(parse_cpu_list("1024").is_err());
        assert!(parse(&["--matrix", "--cpus", "0-100000000000"]).is_err());
        assert_eq!(parse_cpu_list("1022-1023").unwrap(), [1022, 1023]);
    }

    #[test]
    fn cpu_lists_take_ranges_and_singles_sorted_without_repeats() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11").unwrap(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpu_list("3,1,1-2").unwrap(), [1, 2, 3]);
        assert!(parse_cpu_list("4-2").unwrap_err().contains("backwards"));
        assert!(parse_cpu_list("0,x").unwrap_err().contains("\"x\""));
        assert!(parse_cpu_list("").is_err());
    }
}
