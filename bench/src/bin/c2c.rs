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
//! ```text
//! c2c [--cpus A,B] [--iters N] [--quick]
//! ```
//!
//! `--iters` (default 1,000,000) round trips follow 10,000 warm-up ones; the stream sends ten
//! times as many messages. `--quick` divides both by ten. With only one CPU allowed, both threads
//! share it and yield to each other while waiting instead of spinning; the output says so.

use std::{
    hint::spin_loop,
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
/// Ring capacity for the stream phase; large enough that the producer rarely sees it full, small
/// enough to stay in L2.
const STREAM_CAP: usize = 4096;

#[derive(Debug)]
struct Args {
    cpus: Option<(usize, usize)>,
    iters: u64,
    quick: bool,
}

fn usage() -> &'static str {
    "usage: c2c [--cpus A,B] [--iters N] [--quick]\n\
     \n  --cpus A,B   the two logical CPUs to pin to (default: the first two allowed)\
     \n  --iters N    timed round trips after 10,000 warm-up ones (default 1000000)\
     \n  --quick      ten times fewer iterations"
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        cpus: None,
        iters: DEFAULT_ITERS,
        quick: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--cpus" => {
                let v = it.next().ok_or("--cpus needs a value like 0,1")?;
                let (a, b) = v.split_once(',').ok_or("--cpus wants two CPUs: A,B")?;
                let p = |s: &str| {
                    s.trim()
                        .parse::<usize>()
                        .map_err(|e| format!("--cpus {v}: {e}"))
                };
                args.cpus = Some((p(a)?, p(b)?));
            }
            "--iters" => {
                let v = it.next().ok_or("--iters needs a number")?;
                args.iters = v
                    .replace('_', "")
                    .parse()
                    .map_err(|e| format!("--iters {v}: {e}"))?;
            }
            "--quick" => args.quick = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.quick {
        args.iters = (args.iters / 10).max(1);
    }
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
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
    let args = match parse_args() {
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
