//! Cross-shard messaging: xtc beside a raw ring floor, tokio, glommio and monoio, in one run.
//!
//! Two CPUs, one "shard" on each. Two benchmarks:
//!
//! | benchmark | what each runtime does | reported |
//! |---|---|---|
//! | `rtt` | 20,000 timed round trips (after 1,000 warm-up) from CPU A to CPU B and back; 2,000 for the "target asleep" rows | p50 and p99 in ns |
//! | `stream` | 10,000,000 `u64` messages one way, producer on CPU A, consumer on CPU B | M msgs/s, median of 3 runs |
//! | `stream` (batched row) | the same with batch calls: xtc `send_many` of 256 / `recv_many` of up to 1,024, tokio `reserve_many` of 256 / `recv_many` of up to 1,024, raw chunked rtrb; glommio and monoio have none | M msgs/s, median of 3 runs |
//!
//! The runtimes:
//!
//! - **xtc**: a 2-shard `Executor` placed on the two CPUs. `rtt`: the main task on shard 0 awaits
//!   `xtc::shard::submit_to(1, ..)` in a loop: with `spin_before_park` and `reply_spin` 0 (both
//!   idle loops park: the reply wakes the caller as the request woke the target), with
//!   `spin_before_park` 0 and the default reply spin (`xtc::DEFAULT_REPLY_SPIN`, 50 µs: the
//!   target parks, the caller polls for the reply up to 50 µs before it parks; the rows
//!   "target parks, xtc caller spins" give beside it glommio's better figure of two, its
//!   caller parking or spinning as long before it parks (its target parks either way), and
//!   tokio's and monoio's parked figures, as they have no such knob), and with 50 ms of both (both loops spin between round trips instead of
//!   parking). Back to back, a target that has just answered may still be on its way to sleep
//!   when the next request comes (the caller, spinning, answers within a microsecond or two),
//!   so the "target parks" pair is a conversation's figure; the "target asleep" pair makes a
//!   tenth as many round trips with the caller pausing 500 µs (a thread sleep, the same for
//!   every runtime) before each, so the target has parked for good and every round trip pays
//!   its real wake-up (xtc with the default reply spin, glommio the better of its caller
//!   parking and spinning as long; the raw floor, tokio and monoio as in the parked rows). `stream`: `xtc::channel::shared::bounded` with the executor's default
//!   spin-before-park (`xtc::DEFAULT_SPIN_BEFORE_PARK`, 20 µs after a busy turn), the sender task
//!   spawned on shard 0 and the receiver on shard 1. The loops' ring and wake counters are printed
//!   under the table: they explain the figures;
//! - **raw**: the floor. Two pinned threads busy-polling `rtrb` rings (as `c2c` does): a ring
//!   pair for the spinning `rtt` rows, single `push`/`pop` for `stream`, and for the batched
//!   row chunks as xtc's (`write_chunk_uninit` of 256 once that much room is free,
//!   `read_chunk` of all that is queued). In the parked `rtt` rows the
//!   floor is two pinned threads that each block in `read(2)` on an eventfd until the other
//!   writes it: the two wake-ups every runtime whose idle loops park pays per round trip, with
//!   no channel or task around them; in the "target parks" rows, the target thread blocks on
//!   its eventfd while the pinger spins on an atomic for the answer (one wake-up);
//! - **tokio**: two `current_thread` runtimes on two pinned threads, `tokio::sync::mpsc`
//!   channels. No spin knob: it has no value in the spinning rows;
//! - **glommio**: two `LocalExecutor`s with `Placement::Fixed(cpu)`, `shared_channel` channels;
//!   `rtt` once by default, once with `spin_before_park(50 ms)` on both executors, and in the
//!   rows where xtc's caller spins for its reply, both by default and with the pinger's
//!   executor alone spinning as long (`spin_before_park(50 µs)`; the target's parks), the
//!   better kept; `stream` with the same
//!   20 µs spin-before-park as xtc's loops;
//! - **monoio**: two `FusionDriver` runtimes on two pinned threads, `flume` channels (async and
//!   cross-thread, usable from any runtime). No spin knob.
//!
//! Every channel of `stream` holds 1,024 messages; `rtt` channels hold one. The stream rate is
//! measured on the consumer from its first message to its last, so runtime start-up is not in
//! it; each stream column is the median of 3 runs (its runs' rates are printed under the
//! table), and the single-message row's runs are taken in turns across the runtimes, so a slow
//! minute of a shared machine lands on every column. The table gives absolute numbers and `xtc/peer` ratios; only the ratios mean much on a
//! shared machine. An SVG bar chart of the same numbers goes to `target/bench-mesh.svg`.
//!
//! ```text
//! mesh [--only rtt|stream] [--quick] [--svg PATH] [--cpus A,B]
//! ```

use std::{process::ExitCode, time::Duration};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use xtc_bench::{
    allowed_cpus,
    goal::{print_goals, Goal},
    isolated,
    svg::Chart,
    Better, LatencySummary, Row, Table,
};

/// The runtimes, in column order. xtc first: its ratios are printed.
const RUNTIMES: [&str; 5] = ["xtc", "raw", "tokio", "glommio", "monoio"];
/// Column indices of `RUNTIMES` that xtc is divided by, in print order.
const RATIOS_VS: [usize; 4] = [4, 2, 3, 1];
/// Column index of each runtime.
const XTC: usize = 0;
const RAW: usize = 1;
const TOKIO: usize = 2;
const GLOMMIO: usize = 3;
const MONOIO: usize = 4;
/// The benchmarks, in run order.
const BENCHES: [&str; 2] = ["rtt", "stream"];
/// Spin-before-park of the spinning round-trip runs (xtc and glommio).
const SPIN: Duration = Duration::from_millis(50);

/// What the two CPUs share in hwloc's view ("same core", "shared L3", ...), or why that is
/// unknown.
fn pair_level(cpus: Cpus) -> String {
    #[cfg(feature = "xtc")]
    {
        match xtc::numa::Topology::detect() {
            Ok(t) => t.level(cpus.0, cpus.1).map_or_else(
                || "unknown (a cpu hwloc does not list)".into(),
                |l| l.to_string(),
            ),
            Err(e) => format!("unknown ({e})"),
        }
    }
    #[cfg(not(feature = "xtc"))]
    {
        let _ = cpus;
        "unknown (built without the `xtc` feature, which brings hwloc)".into()
    }
}

/// Runs of each of the spinning row's goal pair (xtc, raw), taken in turns (`run_rtt`).
const RTT_TURNS: usize = 3;
/// Spin-before-park of both loops in the stream runs, xtc's and glommio's alike: xtc's
/// default (`xtc::DEFAULT_SPIN_BEFORE_PARK`), given to glommio too so neither side of the
/// comparison parks between bursts where the other would spin.
const STREAM_SPIN: Duration = Duration::from_micros(20);
/// Capacity of every channel in the stream benchmark: xtc's default ring capacity, and small
/// enough to stay in L2 for a `u64` payload.
const STREAM_CAP: usize = 1024;
/// Items per `send_many` in the batched stream row: a quarter of the ring, so the consumer
/// drains one batch while the producer writes the next.
const STREAM_BATCH: usize = STREAM_CAP / 4;

/// The two CPUs: the sender (pinger, producer) runs on `.0`, the echo / consumer on `.1`.
type Cpus = (usize, usize);

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
struct Params {
    rtt_warmup: u64,
    rtt_iters: u64,
    /// Pause of the caller before each round trip (zero: back to back): long enough, the
    /// target has gone to sleep for good by the next message.
    gap: Duration,
    stream_msgs: u64,
    /// Hang guard: a run with no result by then is abandoned and reported as hung.
    deadline: Duration,
}

impl Params {
    fn full() -> Self {
        Params {
            rtt_warmup: 1_000,
            rtt_iters: 20_000,
            gap: Duration::ZERO,
            stream_msgs: 10_000_000,
            deadline: Duration::from_secs(60),
        }
    }

    /// Ten times fewer iterations: a smoke run.
    fn quick() -> Self {
        Params {
            rtt_warmup: 100,
            rtt_iters: 2_000,
            gap: Duration::ZERO,
            stream_msgs: 1_000_000,
            deadline: Duration::from_secs(20),
        }
    }

    /// Round trips made in all, warm-up included.
    fn rtt_total(&self) -> u64 {
        self.rtt_warmup + self.rtt_iters
    }

    /// The "target asleep" rows: a tenth of the round trips, each after [`ASLEEP_GAP`].
    fn asleep(self) -> Self {
        Params {
            rtt_warmup: (self.rtt_warmup / 10).max(10),
            rtt_iters: (self.rtt_iters / 10).max(100),
            gap: ASLEEP_GAP,
            ..self
        }
    }
}

/// The caller's pause before each round trip of the "target asleep" rows: the target loop
/// has long parked (its spin-before-park is 20 µs at most here, its OS thread blocked), so
/// every round trip pays a real wake-up of it. Back to back, a target that has just answered
/// may still be on its way to sleep when the next message comes.
const ASLEEP_GAP: Duration = Duration::from_micros(500);

/// The caller's pause before a round trip ([`Params::gap`]): a plain thread sleep, the same
/// for every runtime (the caller's own wake-up from it is not timed).
fn pause(p: Params) {
    if !p.gap.is_zero() {
        std::thread::sleep(p.gap);
    }
}

/// A caller's spin for its reply, for the peers without a knob of their own: `try_recv` in a
/// busy loop for up to `limit` (none when zero), as xtc's reply spin polls for its answer
/// before its loop parks. `None`: nothing came, the caller waits (parks) as usual.
fn spin_recv<T>(limit: Duration, mut try_recv: impl FnMut() -> Option<T>) -> Option<T> {
    if limit.is_zero() {
        return None;
    }
    let start = std::time::Instant::now();
    loop {
        // The clock is read once per 64 looks, as the answer is looked for on each.
        for _ in 0..64 {
            if let Some(v) = try_recv() {
                return Some(v);
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= limit {
            return None;
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

/// What one stream run gives: the time from the consumer's first message to its last.
type StreamOut = Result<Measured<Duration>, String>;
/// What one round-trip run gives: the histogram of the timed round trips, in ns.
type RttOut = Result<Measured<Histogram<u64>>, String>;

/// Stream runs per column (each on a fresh channel and fresh threads); the median is reported.
/// One run per column read the single-message xtc/raw ratio anywhere from 0.26x to 0.62x from
/// one bench run to the next.
const STREAM_RUNS: usize = 3;

/// The rate of a stream run of `msgs` messages that took `d` from the first to the last: the
/// clock starts at the first message, so `msgs - 1` arrived inside it. M msgs/s.
fn stream_rate(msgs: u64, d: Duration) -> f64 {
    msgs.saturating_sub(1) as f64 / d.as_secs_f64() / 1e6
}

/// Runs `one` `runs` times and keeps the median time; the notes are the last run's, plus a line
/// `label runs: ..` with every run's rate. The first failure ends it.
fn median_stream(label: &str, msgs: u64, runs: usize, one: impl Fn() -> StreamOut) -> StreamOut {
    let mut took = Vec::with_capacity(runs);
    let mut notes = Vec::new();
    for _ in 0..runs {
        let m = one()?;
        took.push(m.value);
        notes = m.notes;
    }
    let rates: Vec<String> = took
        .iter()
        .map(|d| xtc_bench::fmt_num(stream_rate(msgs, *d)))
        .collect();
    notes.push(format!("{label} runs: {} M msgs/s", rates.join(" ")));
    let value = xtc_bench::median(&took).ok_or_else(|| format!("{label}: no run"))?;
    Ok(Measured { value, notes })
}

/// Records round trip `i` (of `p.rtt_total()`) unless it is a warm-up one.
fn record_rtt(h: &mut Histogram<u64>, p: Params, i: u64, took: Duration) {
    if i >= p.rtt_warmup {
        xtc_bench::record(h, took);
    }
}

/// Checks the echo of round trip `i`.
fn check_echo(i: u64, v: u64) -> Result<(), String> {
    if v == i {
        Ok(())
    } else {
        Err(format!("round trip {i}: echo returned {v}"))
    }
}

/// Checks that message `v` arrived where `next` was expected.
/// [`check_order`] over a received batch, which it empties; `next` moves past it.
fn check_batch(next: &mut u64, buf: &mut Vec<u64>) -> Result<(), String> {
    for v in buf.drain(..) {
        check_order(*next, v)?;
        *next += 1;
    }
    Ok(())
}

fn check_order(next: u64, v: u64) -> Result<(), String> {
    if v == next {
        Ok(())
    } else {
        Err(format!(
            "stream: message {v} arrived where {next} was expected"
        ))
    }
}

/// Consumer-side stream clock: started at the first message, read at the last.
#[derive(Debug, Default)]
struct StreamClock {
    t0: Option<std::time::Instant>,
}

impl StreamClock {
    /// Called on every message received.
    #[inline]
    fn tick(&mut self) {
        if self.t0.is_none() {
            self.t0 = Some(std::time::Instant::now());
        }
    }

    /// Time since the first message; an error if none came.
    fn took(&self) -> Result<Duration, String> {
        self.t0
            .map(|t| t.elapsed())
            .ok_or_else(|| "stream: no message arrived".to_string())
    }
}

/// Runs `side` on a fresh thread pinned to `cpu`; for the second side of a two-thread run.
fn spawn_pinned<T, F>(
    name: &str,
    cpu: usize,
    side: F,
) -> Result<std::thread::JoinHandle<Result<T, String>>, String>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, String> + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if !xtc_bench::pin_current_thread(cpu) {
                return Err(format!("could not pin a benchmark thread to cpu {cpu}"));
            }
            side()
        })
        .map_err(|e| format!("could not spawn a thread: {e}"))
}

/// Joins a thread from [`spawn_pinned`], turning a panic into `Err`.
fn join<T>(t: std::thread::JoinHandle<Result<T, String>>) -> Result<T, String> {
    t.join().map_err(|p| xtc_bench::panic_message(&*p))?
}

/// The floor: two pinned threads busy-polling rtrb rings.
mod raw {
    use std::{hint::spin_loop, time::Instant};

    use rtrb::RingBuffer;

    use super::{
        check_echo, check_order, join, pause, record_rtt, spawn_pinned, Cpus, Measured, Params,
        RttOut, StreamClock, StreamOut, STREAM_BATCH, STREAM_CAP,
    };

    /// A ring pair of one slot each; the caller's thread (pinned to `cpus.0`) pings.
    pub(super) fn rtt(cpus: Cpus, p: Params) -> RttOut {
        let (mut ping_tx, mut ping_rx) = RingBuffer::<u64>::new(1);
        let (mut pong_tx, mut pong_rx) = RingBuffer::<u64>::new(1);
        let total = p.rtt_total();
        let echo = spawn_pinned("mesh-raw-echo", cpus.1, move || {
            for _ in 0..total {
                let v = loop {
                    match ping_rx.pop() {
                        Ok(v) => break v,
                        Err(_) if ping_rx.is_abandoned() => return Err("pinger gone".into()),
                        Err(_) => spin_loop(),
                    }
                };
                while pong_tx.push(v).is_err() {
                    spin_loop();
                }
            }
            Ok(())
        })?;
        let mut h = xtc_bench::latency_histogram();
        for i in 0..total {
            pause(p);
            let t0 = Instant::now();
            while ping_tx.push(i).is_err() {
                spin_loop();
            }
            let v = loop {
                match pong_rx.pop() {
                    Ok(v) => break v,
                    Err(_) if pong_rx.is_abandoned() => return Err("echo thread gone".into()),
                    Err(_) => spin_loop(),
                }
            };
            record_rtt(&mut h, p, i, t0.elapsed());
            check_echo(i, v)?;
        }
        join(echo)?;
        Ok(Measured::plain(h))
    }

    /// The floor of a round trip whose both ends sleep between messages: two pinned threads,
    /// each blocked in `read(2)` on its own eventfd until the other writes it, the value
    /// riding in the eventfd counter. Any runtime whose idle loops park pays these two
    /// wake-ups (the caller's and the target's) per round trip; no channel or task is in it.
    pub(super) fn rtt_parked(cpus: Cpus, p: Params) -> RttOut {
        let ping = std::sync::Arc::new(EventFd::new()?);
        let pong = std::sync::Arc::new(EventFd::new()?);
        let total = p.rtt_total();
        let (ping_rx, pong_tx) = (ping.clone(), pong.clone());
        let echo = spawn_pinned("mesh-raw-parked-echo", cpus.1, move || {
            for _ in 0..total {
                let v = ping_rx.wait()?;
                pong_tx.signal(v)?;
            }
            Ok(())
        })?;
        let mut h = xtc_bench::latency_histogram();
        // The values travel as `i + 1`: an eventfd counter of 0 reads as "nothing yet".
        for i in 0..total {
            pause(p);
            let t0 = Instant::now();
            ping.signal(i + 1)?;
            let v = pong.wait()?;
            record_rtt(&mut h, p, i, t0.elapsed());
            check_echo(i, v - 1)?;
        }
        join(echo)?;
        Ok(Measured::plain(h))
    }

    /// The floor of a round trip whose target sleeps between messages while the caller spins
    /// for the answer (xtc's reply spin): the echo thread blocks in `read(2)` on an eventfd,
    /// the pinger writes it and then spins on an atomic the echo thread stores the value in.
    /// One wake-up per round trip, the target's.
    pub(super) fn rtt_target_parked(cpus: Cpus, p: Params) -> RttOut {
        use std::sync::{
            atomic::{AtomicU64, Ordering::Acquire, Ordering::Release},
            Arc,
        };
        let ping = Arc::new(EventFd::new()?);
        let pong = Arc::new(AtomicU64::new(0));
        let total = p.rtt_total();
        let (ping_rx, pong_tx) = (ping.clone(), pong.clone());
        let echo = spawn_pinned("mesh-raw-target-parked-echo", cpus.1, move || {
            for _ in 0..total {
                let v = ping_rx.wait()?;
                pong_tx.store(v, Release);
            }
            Ok(())
        })?;
        let mut h = xtc_bench::latency_histogram();
        // The values travel as `i + 1`: an eventfd counter of 0 reads as "nothing yet".
        for i in 0..total {
            pause(p);
            let t0 = Instant::now();
            ping.signal(i + 1)?;
            let v = loop {
                let v = pong.load(Acquire);
                if v == i + 1 {
                    break v;
                }
                spin_loop();
            };
            record_rtt(&mut h, p, i, t0.elapsed());
            check_echo(i, v - 1)?;
        }
        join(echo)?;
        Ok(Measured::plain(h))
    }

    /// A blocking eventfd, closed on drop.
    struct EventFd(i32);

    impl EventFd {
        fn new() -> Result<EventFd, String> {
            // SAFETY: a plain system call with no pointer arguments.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            if fd < 0 {
                return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
            }
            Ok(EventFd(fd))
        }

        /// Blocks until the counter is non-zero, then takes it.
        fn wait(&self) -> Result<u64, String> {
            let mut v = 0u64;
            loop {
                // SAFETY: `v` is a live, writable 8-byte buffer for the whole call.
                let n = unsafe { libc::read(self.0, (&raw mut v).cast(), 8) };
                if n == 8 {
                    return Ok(v);
                }
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(format!("eventfd read: {e}"));
                }
            }
        }

        /// Adds `v` (non-zero) to the counter, waking a blocked reader.
        fn signal(&self, v: u64) -> Result<(), String> {
            // SAFETY: `v` is a live, readable 8-byte buffer for the whole call.
            let n = unsafe { libc::write(self.0, (&raw const v).cast(), 8) };
            if n == 8 {
                Ok(())
            } else {
                Err(format!(
                    "eventfd write: {}",
                    std::io::Error::last_os_error()
                ))
            }
        }
    }

    impl Drop for EventFd {
        fn drop(&mut self) {
            // SAFETY: `self.0` is an eventfd this value owns.
            unsafe { libc::close(self.0) };
        }
    }

    /// Single pushes on `cpus.0`, single pops on the caller's thread (pinned to `cpus.1`).
    pub(super) fn stream(cpus: Cpus, p: Params) -> StreamOut {
        let (mut tx, mut rx) = RingBuffer::<u64>::new(STREAM_CAP);
        let msgs = p.stream_msgs;
        let producer = spawn_pinned("mesh-raw-producer", cpus.0, move || {
            for i in 0..msgs {
                while tx.push(i).is_err() {
                    spin_loop();
                }
            }
            Ok(())
        })?;
        let mut clock = StreamClock::default();
        let mut next = 0;
        while next < msgs {
            match rx.pop() {
                Ok(v) => {
                    clock.tick();
                    check_order(next, v)?;
                    next += 1;
                }
                Err(_) if rx.is_abandoned() && rx.is_empty() => {
                    return Err("producer gone early".into())
                }
                Err(_) => spin_loop(),
            }
        }
        let took = clock.took()?;
        join(producer)?;
        Ok(Measured::plain(took))
    }

    /// Like [`stream`], in chunks as xtc's batched row moves them: the producer writes
    /// `STREAM_BATCH` messages at once as soon as that much room is free, the consumer reads
    /// everything queued (`write_chunk_uninit` / `read_chunk`), so the ring's indices are
    /// touched once per chunk. Writing whatever room there is instead (one slot, often) made
    /// the indices cross between the cores in tiny chunks: a floor slower than xtc.
    pub(super) fn stream_chunked(cpus: Cpus, p: Params) -> StreamOut {
        let (mut tx, mut rx) = RingBuffer::<u64>::new(STREAM_CAP);
        let msgs = p.stream_msgs;
        let producer = spawn_pinned("mesh-raw-producer", cpus.0, move || {
            let mut next = 0;
            while next < msgs {
                let n = STREAM_BATCH.min((msgs - next) as usize);
                if tx.slots() < n {
                    spin_loop();
                    continue;
                }
                let chunk = tx
                    .write_chunk_uninit(n)
                    .map_err(|e| format!("write_chunk_uninit({n}): {e}"))?;
                next += chunk.fill_from_iter(next..) as u64;
            }
            Ok(())
        })?;
        let mut clock = StreamClock::default();
        let mut next = 0;
        while next < msgs {
            let n = rx.slots();
            if n == 0 {
                if rx.is_abandoned() && rx.is_empty() {
                    return Err("producer gone early".into());
                }
                spin_loop();
                continue;
            }
            clock.tick();
            let chunk = rx
                .read_chunk(n)
                .map_err(|e| format!("read_chunk({n}): {e}"))?;
            let (a, b) = chunk.as_slices();
            for &v in a.iter().chain(b) {
                check_order(next, v)?;
                next += 1;
            }
            chunk.commit_all();
        }
        let took = clock.took()?;
        join(producer)?;
        Ok(Measured::plain(took))
    }
}

/// Two `current_thread` runtimes on two pinned threads, `tokio::sync::mpsc` channels.
mod tokio_rt {
    use std::{
        future::Future,
        time::{Duration, Instant},
    };

    use tokio::sync::mpsc;

    use super::{
        check_batch, check_echo, check_order, join, pause, record_rtt, spawn_pinned, spin_recv,
        Cpus, Measured, Params, RttOut, StreamClock, StreamOut, STREAM_BATCH, STREAM_CAP,
    };

    fn block_on<T>(fut: impl Future<Output = T>) -> Result<T, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(rt.block_on(fut))
    }

    /// The caller's thread (pinned to `cpus.0`) pings; it spins for each answer up to
    /// `caller_spin` before it parks (`spin_recv`).
    pub(super) fn rtt(cpus: Cpus, p: Params, caller_spin: Duration) -> RttOut {
        let (ping_tx, mut ping_rx) = mpsc::channel::<u64>(1);
        let (pong_tx, mut pong_rx) = mpsc::channel::<u64>(1);
        let echo = spawn_pinned("mesh-tokio-echo", cpus.1, move || {
            block_on(async move {
                while let Some(v) = ping_rx.recv().await {
                    if pong_tx.send(v).await.is_err() {
                        break;
                    }
                }
            })
        })?;
        let h = block_on(async move {
            let mut h = xtc_bench::latency_histogram();
            for i in 0..p.rtt_total() {
                pause(p);
                let t0 = Instant::now();
                ping_tx.send(i).await.map_err(|_| "echo side closed")?;
                let v = match spin_recv(caller_spin, || pong_rx.try_recv().ok()) {
                    Some(v) => v,
                    None => pong_rx.recv().await.ok_or("echo side closed")?,
                };
                record_rtt(&mut h, p, i, t0.elapsed());
                check_echo(i, v)?;
            }
            Ok::<_, String>(h)
        })??;
        join(echo)?;
        Ok(Measured::plain(h))
    }

    /// Producer on `cpus.0`, consumer on the caller's thread (pinned to `cpus.1`). `batched`:
    /// the producer reserves `STREAM_BATCH` slots at a time with `reserve_many` (one wait on
    /// the channel's semaphore per batch, as xtc's `send_many`) and sends through the permits,
    /// the consumer takes up to `STREAM_CAP` at a time with `recv_many`.
    pub(super) fn stream(cpus: Cpus, p: Params, batched: bool) -> StreamOut {
        let (tx, mut rx) = mpsc::channel::<u64>(STREAM_CAP);
        let msgs = p.stream_msgs;
        let producer = spawn_pinned("mesh-tokio-producer", cpus.0, move || {
            block_on(async move {
                let mut next = 0;
                while next < msgs {
                    if batched {
                        let end = (next + STREAM_BATCH as u64).min(msgs);
                        let permits = tx
                            .reserve_many((end - next) as usize)
                            .await
                            .map_err(|_| "consumer gone")?;
                        for (permit, v) in permits.zip(next..end) {
                            permit.send(v);
                        }
                        next = end;
                    } else {
                        tx.send(next).await.map_err(|_| "consumer gone")?;
                        next += 1;
                    }
                }
                Ok::<_, String>(())
            })?
        })?;
        let took = block_on(async move {
            let mut clock = StreamClock::default();
            let mut next = 0;
            let mut buf = Vec::with_capacity(STREAM_CAP);
            if batched {
                while rx.recv_many(&mut buf, STREAM_CAP).await > 0 {
                    clock.tick();
                    check_batch(&mut next, &mut buf)?;
                }
            } else {
                // One message at a time, as the other runtimes' consumers.
                while let Some(v) = rx.recv().await {
                    clock.tick();
                    check_order(next, v)?;
                    next += 1;
                }
            }
            if next != msgs {
                return Err(format!("stream: {next} of {msgs} messages arrived"));
            }
            clock.took()
        })??;
        join(producer)?;
        Ok(Measured::plain(took))
    }
}

/// Two `LocalExecutor`s pinned with `Placement::Fixed`, `shared_channel` channels.
mod glommio_rt {
    use std::time::{Duration, Instant};

    use glommio::{channels::shared_channel, LocalExecutorBuilder, Placement};

    use super::{
        check_echo, check_order, pause, record_rtt, Cpus, Measured, Params, RttOut, StreamClock,
        StreamOut, STREAM_CAP, STREAM_SPIN,
    };

    fn builder(name: &str, cpu: usize, spin: Duration) -> LocalExecutorBuilder {
        let b = LocalExecutorBuilder::new(Placement::Fixed(cpu)).name(name);
        if spin.is_zero() {
            b
        } else {
            b.spin_before_park(spin)
        }
    }

    /// The round trip with `spin` before park on both executors.
    pub(super) fn rtt(cpus: Cpus, p: Params, spin: Duration) -> RttOut {
        rtt_spins(cpus, p, spin, spin)
    }

    /// The round trip with the echo (target) executor spinning `echo_spin` before it parks
    /// and the pinger (caller) `ping_spin`: with only the caller spinning, glommio's
    /// counterpart of xtc's reply spin (a target that parks, a caller that polls for the
    /// answer).
    pub(super) fn rtt_spins(
        cpus: Cpus,
        p: Params,
        echo_spin: Duration,
        ping_spin: Duration,
    ) -> RttOut {
        let (ping_tx, ping_rx) = shared_channel::new_bounded::<u64>(1);
        let (pong_tx, pong_rx) = shared_channel::new_bounded::<u64>(1);
        let echo = builder("mesh-glommio-echo", cpus.1, echo_spin)
            .spawn(move || async move {
                let rx = ping_rx.connect().await;
                let tx = pong_tx.connect().await;
                while let Some(v) = rx.recv().await {
                    if tx.send(v).await.is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        let pinger = builder("mesh-glommio-ping", cpus.0, ping_spin)
            .spawn(move || async move {
                let tx = ping_tx.connect().await;
                let rx = pong_rx.connect().await;
                let mut h = xtc_bench::latency_histogram();
                for i in 0..p.rtt_total() {
                    pause(p);
                    let t0 = Instant::now();
                    tx.send(i).await.map_err(|_| "echo side closed")?;
                    let v = rx.recv().await.ok_or("echo side closed")?;
                    record_rtt(&mut h, p, i, t0.elapsed());
                    check_echo(i, v)?;
                }
                Ok::<_, String>(h)
            })
            .map_err(|e| e.to_string())?;
        let h = pinger.join().map_err(|e| e.to_string())??;
        echo.join().map_err(|e| e.to_string())?;
        Ok(Measured::plain(h))
    }

    pub(super) fn stream(cpus: Cpus, p: Params) -> StreamOut {
        let (tx, rx) = shared_channel::new_bounded::<u64>(STREAM_CAP);
        let msgs = p.stream_msgs;
        let producer = builder("mesh-glommio-producer", cpus.0, STREAM_SPIN)
            .spawn(move || async move {
                let tx = tx.connect().await;
                for i in 0..msgs {
                    tx.send(i).await.map_err(|_| "consumer gone")?;
                }
                Ok::<_, String>(())
            })
            .map_err(|e| e.to_string())?;
        let consumer = builder("mesh-glommio-consumer", cpus.1, STREAM_SPIN)
            .spawn(move || async move {
                let rx = rx.connect().await;
                let mut clock = StreamClock::default();
                let mut next = 0;
                while let Some(v) = rx.recv().await {
                    clock.tick();
                    check_order(next, v)?;
                    next += 1;
                }
                if next != msgs {
                    return Err(format!("stream: {next} of {msgs} messages arrived"));
                }
                clock.took()
            })
            .map_err(|e| e.to_string())?;
        let took = consumer.join().map_err(|e| e.to_string())??;
        producer.join().map_err(|e| e.to_string())??;
        Ok(Measured::plain(took))
    }
}

/// Two `FusionDriver` runtimes on two pinned threads, `flume` channels.
mod monoio_rt {
    use std::{
        future::Future,
        time::{Duration, Instant},
    };

    use super::{
        check_echo, check_order, join, pause, record_rtt, spawn_pinned, spin_recv, Cpus, Measured,
        Params, RttOut, StreamClock, StreamOut, STREAM_CAP,
    };

    fn block_on<T>(fut: impl Future<Output = T>) -> Result<T, String> {
        let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(rt.block_on(fut))
    }

    /// The caller's thread (pinned to `cpus.0`) pings; it spins for each answer up to
    /// `caller_spin` before it parks (`spin_recv`).
    pub(super) fn rtt(cpus: Cpus, p: Params, caller_spin: Duration) -> RttOut {
        let (ping_tx, ping_rx) = flume::bounded::<u64>(1);
        let (pong_tx, pong_rx) = flume::bounded::<u64>(1);
        let echo = spawn_pinned("mesh-monoio-echo", cpus.1, move || {
            block_on(async move {
                while let Ok(v) = ping_rx.recv_async().await {
                    if pong_tx.send_async(v).await.is_err() {
                        break;
                    }
                }
            })
        })?;
        let h = block_on(async move {
            let mut h = xtc_bench::latency_histogram();
            for i in 0..p.rtt_total() {
                pause(p);
                let t0 = Instant::now();
                ping_tx
                    .send_async(i)
                    .await
                    .map_err(|_| "echo side closed")?;
                let v = match spin_recv(caller_spin, || pong_rx.try_recv().ok()) {
                    Some(v) => v,
                    None => pong_rx.recv_async().await.map_err(|_| "echo side closed")?,
                };
                record_rtt(&mut h, p, i, t0.elapsed());
                check_echo(i, v)?;
            }
            Ok::<_, String>(h)
        })??;
        join(echo)?;
        Ok(Measured::plain(h))
    }

    /// Producer on `cpus.0`, consumer on the caller's thread (pinned to `cpus.1`).
    pub(super) fn stream(cpus: Cpus, p: Params) -> StreamOut {
        let (tx, rx) = flume::bounded::<u64>(STREAM_CAP);
        let msgs = p.stream_msgs;
        let producer = spawn_pinned("mesh-monoio-producer", cpus.0, move || {
            block_on(async move {
                for i in 0..msgs {
                    tx.send_async(i).await.map_err(|_| "consumer gone")?;
                }
                Ok::<_, String>(())
            })?
        })?;
        let took = block_on(async move {
            let mut clock = StreamClock::default();
            let mut next = 0;
            while let Ok(v) = rx.recv_async().await {
                clock.tick();
                check_order(next, v)?;
                next += 1;
            }
            if next != msgs {
                return Err(format!("stream: {next} of {msgs} messages arrived"));
            }
            clock.took()
        })??;
        join(producer)?;
        Ok(Measured::plain(took))
    }
}

/// The xtc column, against the `xtc` facade crate.
#[cfg(feature = "xtc")]
mod xtc_rt {
    use std::time::{Duration, Instant};

    use super::{
        check_batch, check_echo, check_order, pause, record_rtt, Cpus, Measured, Params, RttOut,
        StreamClock, StreamOut, STREAM_BATCH, STREAM_CAP, STREAM_SPIN,
    };

    /// A 2-shard executor on the two CPUs, shard 0 on `cpus.0`, with `spin` as both its
    /// spin-before-park and its reply spin.
    fn executor(cpus: Cpus, spin: Duration) -> Result<xtc::Executor, String> {
        xtc::Executor::builder()
            .shards(2)
            .placement(xtc::numa::Policy::Cpus(vec![cpus.0, cpus.1]))
            .spin_before_park(spin)
            .reply_spin(spin)
            .build()
            .map_err(|e| e.to_string())
    }

    /// The ring and wake counters of both loops, per `per` operations (round trips, messages).
    fn counters(exec: &xtc::Executor, what: &str, per: u64) -> Result<String, String> {
        let mut line = format!("xtc {what}:");
        for shard in 0..2 {
            let s = exec.loop_stats(shard).map_err(|e| e.to_string())?;
            let per_op = |n: u64| n as f64 / per.max(1) as f64;
            line.push_str(&format!(
                " shard {shard}: {} ring msgs sent ({:.3}/op), {} wake pings ({:.3}/op), \
                 {} ring-full waits, {} parks;",
                s.messages_sent,
                per_op(s.messages_sent),
                s.notifications_sent,
                per_op(s.notifications_sent),
                s.ring_full_waits,
                s.parks,
            ));
        }
        line.pop();
        Ok(line)
    }

    /// The executor's default reply spin (the "target parks" rows).
    pub(super) const REPLY_SPIN: Duration = xtc::DEFAULT_REPLY_SPIN;

    /// The main task on shard 0 awaits `submit_to(1, ..)` in a loop; `reply_spin` replaces
    /// the executor's reply spin when given.
    pub(super) fn rtt(
        cpus: Cpus,
        p: Params,
        spin: Duration,
        reply_spin: Option<Duration>,
    ) -> RttOut {
        let exec = executor(cpus, spin)?;
        if let Some(r) = reply_spin {
            exec.set_reply_spin(r);
        }
        let h = exec
            .block_on(move || async move {
                let mut h = xtc_bench::latency_histogram();
                for i in 0..p.rtt_total() {
                    pause(p);
                    let t0 = Instant::now();
                    let v = xtc::shard::submit_to(1, move || async move { i })
                        .await
                        .map_err(|e| e.to_string())?;
                    record_rtt(&mut h, p, i, t0.elapsed());
                    check_echo(i, v)?;
                }
                Ok::<_, String>(h)
            })
            .map_err(|e| e.to_string())??;
        let what = if spin.is_zero() {
            format!(
                "rtt, target parks, caller's reply spin {} us",
                exec.reply_spin().as_micros()
            )
        } else {
            format!("rtt, spin {} ms", spin.as_millis())
        };
        Ok(Measured {
            value: h,
            notes: vec![counters(&exec, &what, p.rtt_total())?],
        })
    }

    /// `xtc::channel::shared::bounded`: sender task on shard 0, receiver task on shard 1.
    /// `batched`: the producer sends `STREAM_BATCH` at a time with `send_many`, the consumer
    /// takes up to `STREAM_CAP` at a time with `recv_many`; else one `send`/`recv` each.
    pub(super) fn stream(cpus: Cpus, p: Params, batched: bool) -> StreamOut {
        let exec = executor(cpus, STREAM_SPIN)?;
        let (mut tx, mut rx) =
            xtc::channel::shared::bounded::<u64>(STREAM_CAP).map_err(|e| e.to_string())?;
        let msgs = p.stream_msgs;
        let producer = exec
            .spawn_on(0, move || async move {
                let mut next = 0;
                while next < msgs {
                    if batched {
                        let end = (next + STREAM_BATCH as u64).min(msgs);
                        tx.send_many(next..end).await.map_err(|_| "consumer gone")?;
                        next = end;
                    } else {
                        tx.send(next).await.map_err(|_| "consumer gone")?;
                        next += 1;
                    }
                }
                Ok::<_, String>(())
            })
            .map_err(|e| e.to_string())?;
        let consumer = exec
            .spawn_on(1, move || async move {
                let mut clock = StreamClock::default();
                let mut next = 0;
                let mut buf = Vec::with_capacity(STREAM_CAP);
                if batched {
                    while rx.recv_many(&mut buf, STREAM_CAP).await > 0 {
                        clock.tick();
                        check_batch(&mut next, &mut buf)?;
                    }
                } else {
                    // One message at a time, as the other runtimes' consumers.
                    while let Some(v) = rx.recv().await {
                        clock.tick();
                        check_order(next, v)?;
                        next += 1;
                    }
                }
                if next != msgs {
                    return Err(format!("stream: {next} of {msgs} messages arrived"));
                }
                clock.took()
            })
            .map_err(|e| e.to_string())?;
        exec.run().map_err(|e| e.to_string())?;
        // `run` returned at quiescence, so both tasks are done and their handles ready.
        let took = futures::executor::block_on(consumer).map_err(|e| e.to_string())??;
        futures::executor::block_on(producer).map_err(|e| e.to_string())??;
        let what = if batched { "stream batched" } else { "stream" };
        Ok(Measured {
            value: took,
            notes: vec![counters(&exec, what, msgs)?],
        })
    }
}

/// Stand-in for the xtc column when the bench is built without its `xtc` feature.
#[cfg(not(feature = "xtc"))]
mod xtc_rt {
    use std::time::Duration;

    use super::{Cpus, Params, RttOut, StreamOut};

    const NOT_BUILT: &str = "xtc-bench built without its `xtc` feature";

    /// xtc's default reply spin, for the row label.
    pub(super) const REPLY_SPIN: Duration = Duration::from_micros(50);

    pub(super) fn rtt(_: Cpus, _: Params, _: Duration, _: Option<Duration>) -> RttOut {
        Err(NOT_BUILT.into())
    }

    pub(super) fn stream(_: Cpus, _: Params, _: bool) -> StreamOut {
        Err(NOT_BUILT.into())
    }
}

fn usage() -> &'static str {
    "usage: mesh [--only rtt|stream] [--quick] [--svg PATH] [--cpus A,B]\n\
     \n  --only B     run one benchmark\
     \n  --quick      ten times fewer iterations (smoke run)\
     \n  --svg PATH   where to write the bar chart (default: <workspace>/target/bench-mesh.svg)\
     \n  --cpus A,B   the two CPUs: sender on A, receiver on B (default: the first two allowed)"
}

/// The table rows of one benchmark, and the notes its runs left.
struct Filled {
    rows: Vec<Row>,
    notes: Vec<String>,
}

/// Keeps the notes of a run and passes its value on.
fn keep<T>(notes: &mut Vec<String>, r: Result<Measured<T>, String>) -> Result<T, String> {
    r.map(|m| {
        notes.extend(m.notes);
        m.value
    })
}

/// Of a column's runs (taken in turns with another column's), the one of median p50; the
/// p50 of each is noted under the table.
fn median_run(
    notes: &mut Vec<String>,
    column: &str,
    runs: Vec<Result<LatencySummary, String>>,
) -> Result<LatencySummary, String> {
    let mut ok: Vec<LatencySummary> = runs
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .cloned()
        .collect();
    if ok.is_empty() {
        return runs
            .into_iter()
            .next()
            .unwrap_or_else(|| Err(format!("{column}: no run")));
    }
    ok.sort_by_key(|s| s.p50_ns);
    notes.push(format!(
        "{column} runs (in turns): p50 {} ns; the median run is shown",
        ok.iter()
            .map(|s| s.p50_ns.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(ok.swap_remove((ok.len() - 1) / 2))
}

/// Of one runtime's two ways through a row (its caller parking, or spinning for the reply),
/// the one with the lower p50 (or the one that ran), noted under the table.
fn better_of(
    notes: &mut Vec<String>,
    runtime: &str,
    row: &str,
    parks: Result<LatencySummary, String>,
    spins: Result<LatencySummary, String>,
) -> Result<LatencySummary, String> {
    let p50 = |r: &Result<LatencySummary, String>| r.as_ref().ok().map(|s| s.p50_ns);
    notes.push(format!(
        "{runtime}, {row}: p50 {} with its caller parking, {} with it spinning; the lower is shown",
        p50(&parks).map_or("n/a".into(), |v| format!("{v} ns")),
        p50(&spins).map_or("n/a".into(), |v| format!("{v} ns")),
    ));
    match (p50(&parks), p50(&spins)) {
        (Some(a), Some(b)) if b < a => spins,
        (Some(_), _) => parks,
        _ => spins,
    }
}

/// Runs every runtime's round trips: a parked row pair (p50, p99) and a spinning one.
fn run_rtt(cpus: Cpus, p: Params, bar: &ProgressBar) -> Filled {
    let mut notes = Vec::new();
    // Which of glommio's two ways each row shows (`better_of`), noted after the runs' notes.
    let mut choices = Vec::new();
    // `pin`: the harness thread's CPU, for runtimes whose pinger runs on it; the others pin
    // their own threads.
    let mut run = |label: &str, pin: Option<usize>, f: Box<dyn FnOnce() -> RttOut + Send>| {
        bar.set_message(format!("rtt / {label}"));
        let r = isolated(pin, p.deadline, f);
        bar.inc(1);
        keep(&mut notes, r).map(|h| LatencySummary::from_histogram(&h))
    };
    let xtc_park = run(
        "xtc",
        None,
        Box::new(move || xtc_rt::rtt(cpus, p, Duration::ZERO, None)),
    );
    let xtc_reply_spin = run(
        "xtc reply spin",
        None,
        Box::new(move || xtc_rt::rtt(cpus, p, Duration::ZERO, Some(xtc_rt::REPLY_SPIN))),
    );
    // The spinning row's goal pair, xtc and the raw floor, in turns (`RTT_TURNS` runs each,
    // the run of median p50 kept): the floor's figure moves with where the VM puts the two
    // vCPUs (69 to 541 ns across runs here), and one run of each, seconds apart, could
    // judge xtc against a floor taken on another placement.
    let mut xtc_spins = Vec::new();
    let mut raws = Vec::new();
    for _ in 0..RTT_TURNS {
        xtc_spins.push(run(
            "xtc spin",
            None,
            Box::new(move || xtc_rt::rtt(cpus, p, SPIN, None)),
        ));
        raws.push(run(
            "raw",
            Some(cpus.0),
            Box::new(move || raw::rtt(cpus, p)),
        ));
    }
    // Noted with glommio's choices, after the runs' own notes (`run` holds `notes`).
    let xtc_spin = median_run(&mut choices, "xtc, spin", xtc_spins);
    let raw = median_run(&mut choices, "raw, spin", raws);
    let raw_parked = run(
        "raw parked",
        Some(cpus.0),
        Box::new(move || raw::rtt_parked(cpus, p)),
    );
    let raw_target_parked = run(
        "raw target parked",
        Some(cpus.0),
        Box::new(move || raw::rtt_target_parked(cpus, p)),
    );
    let tokio = run(
        "tokio",
        Some(cpus.0),
        Box::new(move || tokio_rt::rtt(cpus, p, Duration::ZERO)),
    );
    // tokio's and monoio's counterparts of xtc's reply spin (they have no knob): the caller
    // spins on `try_recv` as long before it awaits (`spin_recv`).
    let tokio_caller_spin = run(
        "tokio caller spin",
        Some(cpus.0),
        Box::new(move || tokio_rt::rtt(cpus, p, xtc_rt::REPLY_SPIN)),
    );
    let glommio_park = run(
        "glommio",
        None,
        Box::new(move || glommio_rt::rtt(cpus, p, Duration::ZERO)),
    );
    let glommio_spin = run(
        "glommio spin",
        None,
        Box::new(move || glommio_rt::rtt(cpus, p, SPIN)),
    );
    // glommio's counterpart of xtc's reply spin: its target parks, its caller spins as long
    // before it parks. Without it, the rows where xtc's caller spins set xtc's one wake-up
    // per round trip beside glommio's two.
    let glommio_caller_spin = run(
        "glommio caller spin",
        None,
        Box::new(move || glommio_rt::rtt_spins(cpus, p, Duration::ZERO, xtc_rt::REPLY_SPIN)),
    );
    let monoio = run(
        "monoio",
        Some(cpus.0),
        Box::new(move || monoio_rt::rtt(cpus, p, Duration::ZERO)),
    );
    let monoio_caller_spin = run(
        "monoio caller spin",
        Some(cpus.0),
        Box::new(move || monoio_rt::rtt(cpus, p, xtc_rt::REPLY_SPIN)),
    );
    // The same, the caller pausing before each round trip so the target is asleep for good.
    let pa = p.asleep();
    let xtc_asleep = run(
        "xtc, target asleep",
        None,
        Box::new(move || xtc_rt::rtt(cpus, pa, Duration::ZERO, Some(xtc_rt::REPLY_SPIN))),
    );
    let raw_asleep = run(
        "raw, target asleep",
        Some(cpus.0),
        Box::new(move || raw::rtt_target_parked(cpus, pa)),
    );
    // Each peer both ways, its caller parking and spinning for the reply (the better kept:
    // glommio's caller spin did not always help).
    type Job = Box<dyn FnOnce() -> RttOut + Send>;
    let mut both_ways = |rt: &str, pin: Option<usize>, parks: Job, spins: Job| {
        let parks = run(&format!("{rt}, target asleep, caller parks"), pin, parks);
        let spins = run(&format!("{rt}, target asleep, caller spins"), pin, spins);
        (parks, spins)
    };
    let (tokio_parks, tokio_spins) = both_ways(
        "tokio",
        Some(cpus.0),
        Box::new(move || tokio_rt::rtt(cpus, pa, Duration::ZERO)),
        Box::new(move || tokio_rt::rtt(cpus, pa, xtc_rt::REPLY_SPIN)),
    );
    let (glommio_parks, glommio_spins) = both_ways(
        "glommio",
        None,
        Box::new(move || glommio_rt::rtt(cpus, pa, Duration::ZERO)),
        Box::new(move || glommio_rt::rtt_spins(cpus, pa, Duration::ZERO, xtc_rt::REPLY_SPIN)),
    );
    let (monoio_parks, monoio_spins) = both_ways(
        "monoio",
        Some(cpus.0),
        Box::new(move || monoio_rt::rtt(cpus, pa, Duration::ZERO)),
        Box::new(move || monoio_rt::rtt(cpus, pa, xtc_rt::REPLY_SPIN)),
    );
    let mut asleep_of =
        |rt, parks, spins| better_of(&mut choices, rt, "target asleep", parks, spins);
    let asleep = [
        xtc_asleep,
        raw_asleep,
        asleep_of("tokio", tokio_parks, tokio_spins),
        asleep_of("glommio", glommio_parks, glommio_spins),
        asleep_of("monoio", monoio_parks, monoio_spins),
    ];

    let glommio_target_parks = better_of(
        &mut choices,
        "glommio",
        "target parks",
        glommio_park.clone(),
        glommio_caller_spin,
    );
    let tokio_target_parks = better_of(
        &mut choices,
        "tokio",
        "target parks",
        tokio.clone(),
        tokio_caller_spin,
    );
    let monoio_target_parks = better_of(
        &mut choices,
        "monoio",
        "target parks",
        monoio.clone(),
        monoio_caller_spin,
    );
    let no_knob: Result<LatencySummary, String> =
        Err("no spin-before-park knob (it is in the parked row only)".into());
    // Beside xtc's reply spin, each peer's better of parking and its caller spinning as long
    // (glommio's knob; tokio's and monoio's `try_recv` spin): every caller may spin, every
    // target parks, so no column pays two wake-ups where another pays one. The raw floor is
    // the one-wake-up pair (the pinger spins for the answer).
    let target_parks = [
        xtc_reply_spin,
        raw_target_parked,
        tokio_target_parks,
        glommio_target_parks,
        monoio_target_parks,
    ];
    let parked = [xtc_park, raw_parked, tokio, glommio_park, monoio];
    let spinning = [xtc_spin, raw, no_knob.clone(), glommio_spin, no_knob];
    let spin_label = format!("spin {}ms", SPIN.as_millis());
    let reply_label = format!(
        "target parks, caller spins <={}us for reply (peers: better of caller spin, park)",
        xtc_rt::REPLY_SPIN.as_micros()
    );
    let asleep_label = format!(
        "target asleep ({}us pause before each), caller spins for reply (peers: better of caller spin, park)",
        ASLEEP_GAP.as_micros()
    );
    let mut rows = Vec::new();
    for (label, set, iters) in [
        ("idle loops park", &parked, p.rtt_iters),
        (reply_label.as_str(), &target_parks, p.rtt_iters),
        (asleep_label.as_str(), &asleep, pa.rtt_iters),
        (spin_label.as_str(), &spinning, p.rtt_iters),
    ] {
        for q in ["p50", "p99"] {
            let pick = |s: &LatencySummary| if q == "p50" { s.p50_ns } else { s.p99_ns };
            rows.push(Row {
                name: format!("rtt x{iters} {q}, {label}"),
                unit: "ns".into(),
                better: Better::Lower,
                values: set
                    .iter()
                    .map(|s| s.as_ref().map(|s| pick(s) as f64).map_err(Clone::clone))
                    .collect(),
            });
        }
    }
    notes.extend(choices);
    Filled { rows, notes }
}

/// Runs every runtime's one-way stream, one message at a time, then the batched row (whose raw
/// floor, chunked, also gets a note).
fn run_stream(cpus: Cpus, p: Params, bar: &ProgressBar) -> Filled {
    let mut notes = Vec::new();
    let guard = p.deadline;
    let msgs = p.stream_msgs;
    let rate = |d: Duration| stream_rate(msgs, d);
    // `STREAM_RUNS` runs on one harness thread, the median kept.
    let median = |label: &'static str, one: fn(Cpus, Params) -> StreamOut| {
        move || median_stream(label, msgs, STREAM_RUNS, || one(cpus, p))
    };
    // The single-message row, whose ratios are judged: its runs are taken in turns (xtc, raw,
    // tokio, glommio, monoio, then again), not a column's runs in a block, so a slow minute of
    // the shared machine lands on every column rather than on one (the raw floor alone read
    // 99.7 to 158.3 M msgs/s within one run). Each side pins itself, or runs on the harness
    // thread pinned to the consumer's CPU.
    /// A column's label, the CPU its harness thread is pinned to, and one run.
    type Single = (&'static str, Option<usize>, fn(Cpus, Params) -> StreamOut);
    let singles: [Single; 5] = [
        ("stream / xtc", None, |c, p| xtc_rt::stream(c, p, false)),
        ("stream / raw", Some(cpus.1), raw::stream),
        ("stream / tokio", Some(cpus.1), |c, p| {
            tokio_rt::stream(c, p, false)
        }),
        ("stream / glommio", None, glommio_rt::stream),
        ("stream / monoio", Some(cpus.1), monoio_rt::stream),
    ];
    debug_assert_eq!(singles.len(), RUNTIMES.len());
    let mut took: Vec<Vec<Duration>> = vec![Vec::new(); singles.len()];
    let mut last_notes: Vec<Vec<String>> = vec![Vec::new(); singles.len()];
    let mut failed: Vec<Option<String>> = vec![None; singles.len()];
    for round in 0..STREAM_RUNS {
        for (rt, &(label, pin, one)) in singles.iter().enumerate() {
            bar.set_message(format!("{label} ({}/{STREAM_RUNS})", round + 1));
            if failed[rt].is_none() {
                match isolated(pin, guard, move || one(cpus, p)) {
                    Ok(m) => {
                        took[rt].push(m.value);
                        last_notes[rt] = m.notes;
                    }
                    Err(e) => failed[rt] = Some(e),
                }
            }
            bar.inc(1);
        }
    }
    let mut values: Vec<Result<f64, String>> = Vec::with_capacity(singles.len());
    for (rt, &(label, _, _)) in singles.iter().enumerate() {
        let r = match failed[rt].take() {
            Some(e) => Err(e),
            None => {
                let rates: Vec<String> = took[rt]
                    .iter()
                    .map(|d| xtc_bench::fmt_num(stream_rate(msgs, *d)))
                    .collect();
                let mut n = std::mem::take(&mut last_notes[rt]);
                n.push(format!(
                    "{label} runs, in turns: {} M msgs/s",
                    rates.join(" ")
                ));
                xtc_bench::median(&took[rt])
                    .map(|value| Measured { value, notes: n })
                    .ok_or_else(|| format!("{label}: no run"))
            }
        };
        values.push(keep(&mut notes, r).map(rate));
    }
    bar.set_message("stream / raw chunked");
    let chunked = isolated(
        Some(cpus.1),
        guard,
        median("stream / raw chunked", raw::stream_chunked),
    );
    bar.inc(1);
    let chunked = keep(&mut notes, chunked).map(rate);
    // The batched row: xtc's send_many/recv_many, tokio's reserve_many/recv_many, raw chunked;
    // glommio's and monoio's channels have no batch calls.
    bar.set_message("stream batched / xtc");
    let xtc_batched = isolated(
        None,
        guard,
        median("stream batched / xtc", |c, p| xtc_rt::stream(c, p, true)),
    );
    bar.inc(1);
    bar.set_message("stream batched / tokio");
    let tokio_batched = isolated(
        Some(cpus.1),
        guard,
        median("stream batched / tokio", |c, p| {
            tokio_rt::stream(c, p, true)
        }),
    );
    bar.inc(1);
    let mut batched: Vec<Result<f64, String>> = RUNTIMES
        .iter()
        .map(|_| Err("no batch calls on this channel".to_string()))
        .collect();
    batched[XTC] = keep(&mut notes, xtc_batched).map(rate);
    batched[RAW] = chunked.clone();
    batched[TOKIO] = keep(&mut notes, tokio_batched).map(rate);
    notes.push(chunked_note(&chunked, &batched[XTC]));
    notes.push(format!(
        "stream waits: xtc and glommio spin {} us before parking (xtc's default, given to \
         glommio); tokio and monoio have no such knob and park when the channel is empty, so \
         their stream columns may pay wake-ups the spinning ones do not (no goal reads them)",
        STREAM_SPIN.as_micros()
    ));
    Filled {
        rows: vec![
            Row {
                name: format!("stream {} u64, cap {STREAM_CAP}", p.stream_msgs),
                unit: "M msgs/s".into(),
                better: Better::Higher,
                values,
            },
            Row {
                name: format!("stream batched, send {STREAM_BATCH} / recv <= {STREAM_CAP}"),
                unit: "M msgs/s".into(),
                better: Better::Higher,
                values: batched,
            },
        ],
        notes,
    }
}

/// The note on the raw chunked floor: its rate, and xtc's batched rate over it (the floor of
/// the batched row: one-message-at-a-time xtc over a chunked floor would compare two rows).
fn chunked_note(chunked: &Result<f64, String>, xtc_batched: &Result<f64, String>) -> String {
    match chunked {
        Ok(r) => format!(
            "raw chunked (rtrb write_chunk_uninit of {STREAM_BATCH}, read_chunk of up to \
             {STREAM_CAP}): {} M msgs/s; xtc batched/raw chunked {}",
            xtc_bench::fmt_num(*r),
            match xtc_batched {
                Ok(x) if *r != 0.0 => format!("{:.2}x", x / r),
                _ => "-".into(),
            }
        ),
        Err(e) => format!("raw chunked: n/a: {e}"),
    }
}

/// Progress-bar steps of a benchmark.
fn steps_of(bench: &str) -> u64 {
    match bench {
        "rtt" => 18 + 2 * RTT_TURNS as u64,
        "stream" => (RUNTIMES.len() * STREAM_RUNS) as u64 + 3,
        _ => unreachable!("benchmark names are checked when parsing"),
    }
}

/// Issue 4's goals: the `submit_to` round trip at most 2x the raw floor with the target
/// spinning and at most 0.8x the best peer with it asleep (p50 both), and the one-message
/// stream at least 3x glommio and half of raw rtrb. Judged on the rows this run filled.
fn goals(table: &Table) -> Vec<Goal> {
    const PEERS: [usize; 3] = [TOKIO, GLOMMIO, MONOIO];
    let mut goals = Vec::new();
    for row in &table.rows {
        if row.name.contains(" p50, spin ") {
            goals.push(Goal::ratio(
                4,
                "submit_to round trip p50, target spinning: xtc/raw",
                true,
                2.0,
                table.ratio(row, RAW),
            ));
        } else if row.name.contains(" p50, target asleep") {
            // The best peer: the lowest p50 among tokio, glommio and monoio.
            let best = PEERS
                .iter()
                .filter_map(|&c| row.values[c].as_ref().ok().map(|v| (c, *v)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            goals.push(Goal::ratio(
                4,
                format!(
                    "submit_to round trip p50, target asleep, every caller spinning for its \
                     reply or parking, the better kept: xtc/best peer ({})",
                    best.map_or("none", |(c, _)| RUNTIMES[c])
                ),
                true,
                0.8,
                best.and_then(|(c, _)| table.ratio(row, c)),
            ));
        } else if row.name.starts_with("stream ") && !row.name.starts_with("stream batched") {
            goals.push(Goal::ratio(
                4,
                "stream, one message per call: xtc/glommio",
                false,
                3.0,
                table.ratio(row, GLOMMIO),
            ));
            goals.push(Goal::ratio(
                4,
                "stream, one message per call: xtc/raw rtrb",
                false,
                0.5,
                table.ratio(row, RAW),
            ));
        }
    }
    goals
}

fn main() -> ExitCode {
    let args =
        match xtc_bench::BenchArgs::parse("mesh", &BENCHES, xtc_bench::CpuOption::Pair, usage()) {
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
    let cpus = match xtc_bench::pick_cpu_pair(args.cpus, &allowed) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mesh: {e}");
            return ExitCode::from(2);
        }
    };

    println!("mesh: cross-shard messaging, xtc beside a raw floor, tokio, glommio and monoio");
    println!(
        "  mode: {}   sender on cpu {}, receiver on cpu {}   allowed cpus: {allowed:?}",
        if args.quick {
            "quick (10x fewer iterations)"
        } else {
            "full"
        },
        cpus.0,
        cpus.1,
    );
    println!("  xtc I/O driver: {}", xtc_bench::xtc_io_driver());
    println!(
        "  rtt: {} timed round trips after {} warm-up; stream: {} u64 one way, channels of \
         {STREAM_CAP}, median of {STREAM_RUNS} runs",
        p.rtt_iters, p.rtt_warmup, p.stream_msgs
    );
    println!(
        "  xtc = submit_to (rtt) and channel::shared (stream) on a 2-shard Executor; raw = the floor: \
         rtrb rings between two busy-polling threads (\"idle loops park\" rows: two threads \
         blocking on eventfds, the cost of two wake-ups; \"target parks\" rows: the target \
         blocks on an eventfd, the caller spins for the answer, one wake-up); tokio = mpsc, glommio = \
         shared_channel, monoio = flume"
    );
    println!(
        "  the two cpus share: {} (hwloc; the spinning floor reads tens of ns on one core's two \
         threads, hundreds across cores)",
        pair_level(cpus)
    );
    if !cfg!(feature = "xtc") {
        println!("  NOTE: built without the `xtc` feature: the xtc column is empty");
    }

    let bar = ProgressBar::new(benches.iter().map(|b| steps_of(b)).sum());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .expect("static progress template is valid"),
    );
    let mut table = Table::new(
        RUNTIMES.iter().map(|s| s.to_string()).collect(),
        XTC,
        RATIOS_VS.to_vec(),
    );
    let mut notes = Vec::new();
    for bench in &benches {
        let filled = match *bench {
            "rtt" => run_rtt(cpus, p, &bar),
            "stream" => run_stream(cpus, p, &bar),
            _ => unreachable!("benchmark names are checked when parsing"),
        };
        for row in filled.rows {
            table.push(row);
        }
        notes.extend(filled.notes);
    }
    bar.finish_and_clear();

    println!();
    print!("{}", table.render());
    println!(
        "  ratios are xtc/peer of the values: above 1 is better for xtc where `better` is higher, \
         below 1 where it is lower"
    );
    print_goals(&goals(&table));
    for note in &notes {
        println!("  {note}");
    }

    let chart = Chart {
        title: "xtc cross-shard messaging".into(),
        subtitle: format!(
            "{} run, cpu {} -> cpu {}; raw = rtrb floor",
            if args.quick { "quick" } else { "full" },
            cpus.0,
            cpus.1
        ),
        panels: table.panels(),
    };
    chart.write_and_report("mesh", &args.svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_judge_the_rows_of_issue_4() {
        let mut t = Table::new(
            RUNTIMES.iter().map(|s| s.to_string()).collect(),
            XTC,
            vec![1],
        );
        let mut row = |name: &str, better, vals: [Result<f64, String>; 5]| {
            t.push(Row {
                name: name.into(),
                unit: "x".into(),
                better,
                values: vals.to_vec(),
            })
        };
        // Names as `run_rtt` and `run_stream` write them; p99 and batched rows set no goal.
        row(
            "rtt x10 p50, spin 50ms",
            Better::Lower,
            [
                Ok(300.0),
                Ok(100.0),
                Err("no knob".into()),
                Ok(1.0),
                Ok(1.0),
            ],
        );
        row(
            "rtt x10 p99, spin 50ms",
            Better::Lower,
            [Ok(1.0), Ok(1.0), Ok(1.0), Ok(1.0), Ok(1.0)],
        );
        row(
            "rtt x10 p50, target asleep (500us pause before each), xtc caller spins for reply",
            Better::Lower,
            [Ok(20.0), Ok(18.0), Ok(50.0), Ok(60.0), Ok(40.0)],
        );
        row(
            "stream 100 u64, cap 1024",
            Better::Higher,
            [Ok(90.0), Ok(200.0), Ok(5.0), Ok(20.0), Ok(4.0)],
        );
        row(
            "stream batched, send 256 / recv <= 1024",
            Better::Higher,
            [Ok(1.0), Ok(1.0), Ok(1.0), Ok(1.0), Ok(1.0)],
        );
        let g = goals(&t);
        let v: Vec<(&str, Option<bool>)> = g.iter().map(|g| (g.measured.as_str(), g.met)).collect();
        assert_eq!(
            v,
            [
                ("3.00x", Some(false)),
                ("0.50x", Some(true)),
                ("4.50x", Some(true)),
                ("0.45x", Some(false)),
            ],
            "{g:?}"
        );
        assert!(
            g[1].what.ends_with("(monoio)"),
            "the best peer is the lowest p50 of tokio, glommio, monoio: {}",
            g[1].what
        );
    }

    #[test]
    fn a_stream_column_is_the_median_of_its_runs() {
        let ms = Duration::from_millis;
        let left = std::cell::RefCell::new(vec![ms(30), ms(10), ms(20)]);
        let one = || -> StreamOut {
            let took = left.borrow_mut().pop().ok_or("called once too often")?;
            Ok(Measured {
                value: took,
                notes: vec![format!("counters after {took:?}")],
            })
        };
        let m = median_stream("stream / t", 1_000_001, 3, one).unwrap();
        assert_eq!(m.value, ms(20), "the median, not the last or the first run");
        assert!(left.borrow().is_empty(), "every run made");
        assert_eq!(m.notes[0], "counters after 30ms", "the last run's notes");
        assert_eq!(m.notes[1], "stream / t runs: 50.00 100.0 33.33 M msgs/s");
        let failing = || -> StreamOut { Err("hung".into()) };
        assert_eq!(
            median_stream("stream / t", 10, 3, failing).unwrap_err(),
            "hung"
        );
    }

    #[test]
    fn chunked_note_divides_the_batched_xtc_rate() {
        let note = chunked_note(&Ok(400.0), &Ok(200.0));
        assert!(note.contains("xtc batched/raw chunked 0.50x"), "{note}");
        assert!(chunked_note(&Ok(400.0), &Err("hung".into())).ends_with("chunked -"));
        assert_eq!(
            chunked_note(&Err("hung".into()), &Ok(1.0)),
            "raw chunked: n/a: hung"
        );
    }
}
