//! The xtc engine: pinned event loops, tasks, timers, the ring mesh, work stealing, scheduling
//! classes and the per-shard API. Users depend on the `xtc` facade, which re-exports this crate.
//!
//! # The picture
//!
//! ```text
//!    Executor (Arc-shared handle; knobs are atomics)
//!   ┌──────────────┬──────────────┬──────────────┐
//!   │ loop 0       │ loop 1       │ loop N-1     │  one OS thread each, pinned to a CPU (xtc-numa)
//!   │ run queue    │ run queue    │              │  pinned tasks, FIFO (or class lanes), !Send allowed
//!   │ steal deque  │ steal deque  │              │  migratable tasks: crossbeam-deque + injector
//!   │ timers       │ timers       │              │  binary heap (timer module)
//!   │ inbox (MPSC) │ inbox (MPSC) │              │  from other threads: spawns, wakes
//!   │ I/O driver   │ I/O driver   │              │  io_uring or epoll; the loop parks in it
//!   └──────┬───────┴──────┬───────┴──────────────┘
//!          └── SPSC ring mesh: one rtrb ring per ordered pair, N·(N−1) rings ──┘
//! ```
//!
//! Where each concern lives:
//! - [`Executor`] / [`Handle`] (`executor/`): build, run, stop, knobs, stats; the coordinator
//!   that detects quiescence and deadlock (`executor/quiesce.rs`).
//! - the loop step and shutdown (`event_loop/mod.rs`), the sleep protocol (`event_loop/park.rs`),
//!   the inbox (`event_loop/inbox.rs`).
//! - tasks and their protocol (`task/mod.rs`), on `async-task`.
//! - the SPSC ring mesh between loops and its protocol (`ring/mod.rs`); [`shard::submit_to`].
//! - migratable tasks and stealing (`steal/`): [`spawn`], [`Handle::spawn`] and the stealing
//!   knobs; scheduling classes (`class.rs`): [`shard::create_class`]; preemption
//!   (`preempt.rs`): [`yield_if_due`]; the stall watchdog (`stall.rs`): [`StallReport`].
//! - [`channel`]: `shared` (between shards) and `local`.
//! - I/O (`io/`): one driver per loop, io_uring or epoll, which is also the loop's park;
//!   [`net`] (TCP, UDP, Unix sockets) and [`fs`] (files) on top, one file per operation in
//!   `io/ops/` with both backends.
//! - [`shard`]: `id()`, `count()`, `spawn_local`, `submit_to`, `stop`; [`Sharded`] and
//!   [`ShardLocal`]: per-shard state;
//!   [`time`]: `sleep`, `timeout`, `interval`; [`LocalExecutor`]: one loop on this thread.
//!
//! # Which call to use
//!
//! | to | inside a task | from any thread (`main`, a plain thread) |
//! | --- | --- | --- |
//! | run a pinned task (may be `!Send`) here / on shard `n` | [`spawn_local`] / [`task::Builder::spawn_on`] | [`Handle::spawn_on`] (named or in a class: [`task::Builder::spawn_on_handle`]) |
//! | run a migratable task (`Send`, may be stolen) | [`spawn`] | [`Handle::spawn`] |
//! | call shard `n` and get the answer | [`shard::submit_to`] (waits for ring room) | [`Handle::submit_to`] (through the inbox) |
//! | the same on every shard | [`shard::submit_to_all`] | [`Handle::submit_to_all`] |
//! | the same, fallible, as one `Result<Vec<_>, E>` | [`shard::try_submit_to_all`] | [`Handle::try_submit_to_all`] |
//! | fire and forget on shard `n` | [`shard::send_to`] (a future: awaits ring room) | [`Handle::send_to`] (queued at once) |
//! | run blocking code and await its result | [`spawn_blocking`] | (any thread may block) |
//! | await a group of tasks as they finish, cancel them together | [`task::JoinSet`] | [`task::JoinSet::insert`] of [`Handle`] spawns, awaited in a `block_on` |
//! | hand one value back, limit holders, notify | `futures::channel::oneshot`, `async-lock`, `event-listener` (see [`channel`]: "Other ways to wait") | the same (their ends are `Send`) |
//! | stop the run | [`stop`] | [`Handle::stop`] |
//! | keep per-shard state | [`Sharded`] (`Send` values, built up front, kept across runs) or [`ShardLocal`] (any value, built on its shard at first use, dropped at the run's end) | read a `Sharded` after `run()`; reach either through [`Handle::submit_to`] while it runs |
//! | where am I | [`shard::id`], [`shard::count`], [`shard::cpu`], [`shard::numa_node`] | [`Handle::shard_count`], [`Handle::placement`] |
//!
//! Off any loop, the calls that cannot return an error panic, as tokio's spawns do:
//! [`spawn_local`], [`spawn`], [`shard::id`], `Sharded::get`, [`ShardLocal::get`] (its
//! `try_get` is `Err(OffLoop)`), [`task::JoinSet::spawn_local`] and `spawn`, and a timer when
//! it is polled.
//! Those that return a `Result` give `Err(OffLoop)` naming the `Handle` call to use. The rest
//! answer: [`shard::count`] is 0; [`shard::try_id`], [`shard::cpu`], [`shard::numa_node`] and
//! [`shard::handle`] are `None`; [`stop`] does nothing (use [`Handle::stop`]).
//!
//! # Invariants
//!
//! 1. Shared-nothing by default: a task spawned with [`spawn_local`] or [`Handle::spawn_on`]
//!    never leaves its loop and may be `!Send` (task protocol rule 1).
//! 2. Migratable is a type and a choice: only `Send` futures spawned with [`spawn`] /
//!    [`Handle::spawn`] sit on a steal deque; policy lives in the executor's knobs.
//! 3. Cross-shard traffic between running loops goes through the SPSC mesh; a full ring
//!    applies backpressure, nothing is dropped or reordered (`ring/mod.rs`). Plain threads, and
//!    a loop thread whose loop is hidden (a `Drop` of another executor's task run inside a
//!    task), reach a loop through its inbox instead: see [`Handle::send_to`] for the order.
//! 4. A sleeping loop is woken exactly when needed (`event_loop/park.rs`, loom-checked).
//! 5. Wakes are idempotent: async-task collapses concurrent wakes into one schedule.
//! 6. Knobs are atomics: `set_x` / `x()` on [`Handle`] (and so on [`Executor`]), effective at
//!    once (a loop reads the stall budget and the preemption tick at its next turn), each
//!    documented with its effect, cost and default.
//! 7. Off means a few loop-local branches: with no class and no stall budget the loop's FIFO
//!    path is unchanged (no clock read, no shared write; `class.rs`, `preempt.rs` and
//!    `event_loop/mod.rs` step 4 itemize them).
//! 8. Quiescence is exact and a deadlock is reported (`executor/quiesce.rs`).
//! 9. Errors are values ([`Error`]); a panicking task is contained ([`JoinError`]).
//! 10. I/O owns its buffers: an operation takes its buffer until the completion and gives it
//!     back ([`io::BufResult`]); dropping the future cancels the operation, or lets it finish
//!     where the kernel already took it (a write or send may land: see each method), and keeps
//!     the buffer alive until the kernel is done with it (`io/uring.rs`, rules 1–5).
//!
//! # Blocking a loop
//!
//! A loop thread that blocks (a lock, a blocking system call, `futures::executor::block_on`
//! inside a task, another executor's [`Executor::run`] or [`Executor::block_on`] called
//! inside a task) runs nothing else until it returns: its other tasks, its timers, its I/O, the
//! messages other loops send it and the room in its rings all wait, and so do the wake-ups
//! of what it already sent: a message to another shard (a [`Handle::spawn_on`] or
//! [`shard::submit_to`] from a task, a shared channel's signal) is pinged at the end of the
//! loop's turn, so a shard asleep when the sender blocked stays asleep (another executor's `run`
//! or `block_on` is the exception: it sends those pings, the turn's end-of-turn flushes and
//! eager rebalance's nudge before it blocks, though the rest of the loop's work still waits).
//! A blocking wait inside a
//! task on work the blocked loop itself must do (a [`time::sleep`], a [`spawn_local`]ed task,
//! socket I/O, [`Handle::submit_to`] its own shard, room in a full ring from another shard, a
//! migratable [`spawn`] that no peer may steal: stealing off, one shard, eager rebalance
//! off while every peer owns parked pinned tasks or timers, a NUMA sensitivity that keeps every idle peer
//! from stealing from this loop; in a `Drop` that this loop's shutdown runs, it ends
//! cancelled once every loop's shutdown has begun, see below) therefore never ends, and the deadlock report cannot see it (the loop reads as busy); the
//! stall watchdog (`XTC_STALL_BUDGET`, [`StallReport`]) names the task. A blocking wait on
//! another loop's work ends: a [`JoinHandle`], a shared channel end or a `submit_to` polled
//! with a waker other than the task's own sends the turn's deferred wakes, ring pings and
//! eager rebalance's nudge first, so the other loop is woken. In a `Drop` that a loop's
//! shutdown runs, a new call ([`shard::submit_to`], [`shard::send_to`],
//! [`shard::submit_to_all`], [`Handle::spawn_on`] and the rest) is refused at once with
//! [`Error::Stopped`], whichever shard it is for: the executor is stopping, so the call would
//! only be dropped unrun, and waiting for that waited on another loop's shutdown, which could
//! itself be blocked in a `Drop` waiting on this loop. A wait there on the join handle of a
//! pinned task of another loop (a call made earlier) ends (cancelled, if it had not run) once
//! its loop drops it, or, if that loop stops without (keeping it for its next run), within a
//! millisecond: the wait looks every millisecond and drops it there. A wait there on the join
//! handle of a migratable task (parked on any loop, or spawned by the `Drop` itself) ends
//! once its task ends, or, once every loop's shutdown has begun (no loop runs it any more),
//! cancelled within a millisecond: the wait drops it; until then it is left to the loops that
//! may still run it. Two such `Drop`s on two shards, each waiting on a channel end that a task
//! of the other's holds, still wait for good, as two loops blocked on each other do (two that
//! each wait on a migratable task queued on the other's deque do not: the wait takes it
//! through that deque's stealer, and drops the tasks it steals before it there, inside the
//! wait, so one of those whose own `Drop` blocks on something this loop's shutdown has yet to
//! drop waits for good). Only a wait on one of those does: a shared channel `send` or `recv` that completed at once leaves its wake of the other
//! end to the end of the turn, so a blocking wait on anything else after it (a `futures`
//! oneshot, std's `mpsc`) can wait for good on a loop that was never woken. Await instead of
//! blocking; run blocking code with [`spawn_blocking`] (the runtime's blocking-thread pool;
//! its loop counts as waiting on the job, however long it takes; pinned and migratable tasks
//! alike). A task that awaits a plain
//! thread of its own instead (`std::thread::spawn`, then a shared channel or a [`Handle`]
//! call) is waiting on something the runtime cannot see: once every loop has been idle for
//! the deadlock grace (`XTC_DEADLOCK_GRACE`, 5 s by default) the run ends with
//! [`Error::Deadlock`] naming that task.
//!
//! # Environment variables
//!
//! Read by [`Builder::from_env`] / [`Executor::from_env`] (and [`Builder::env`]); `XTC_IO` also
//! by [`Builder::build`] and [`LocalExecutor::new`]. A variable that is set but holds a bad
//! value is an [`Error::Env`] naming it, never a silent default (so is one of blanks only);
//! an empty or unset variable leaves the builder's value. A bool is `1`/`0`, `true`/`false`, `on`/`off` or `yes`/`no`,
//! and such words (`spread`, `epoll`, `off`) are case-insensitive; a duration is a whole number
//! with its unit, `ns`, `us` (or `µs`), `ms` or `s`: `5` is refused (5 what?), only `0` goes
//! without one.
//!
//! | variable | values | default | effect |
//! | --- | --- | --- | --- |
//! | `XTC_SHARDS` | integer | `0` | number of shards; 0 = one per allowed physical core, at most the cgroup's CPU quota rounded down, at least 1 (with a CPU list in `XTC_PLACEMENT`: one per listed CPU) |
//! | `XTC_PLACEMENT` | `compact`, `spread`, a CPU list `cpus:0,2,4` or `0-3,8` | `compact` | how shards map to CPUs (see `xtc_numa::Policy`) |
//! | `XTC_PIN` | bool | on | bind each shard thread to its placed CPU; off: to all the placement's CPUs, moved by the OS (`Builder::pin`) |
//! | `XTC_OVERSUBSCRIBE` | bool | off | allow more shards than allowed CPUs (and a CPU list that repeats a CPU), at most 64 per CPU |
//! | `XTC_SERVICE_MODE` | bool | off | `run()` returns only after `stop()` |
//! | `XTC_DEADLOCK_GRACE` | `off`, `500ms`, `5s`, `250us` (not zero) | `5s` | how long an all-parked executor waits before `run()` reports a deadlock |
//! | `XTC_RING_CAPACITY` | integer 1 ..= 1048576 | `1024` | messages per ring of the cross-shard mesh |
//! | `XTC_STEALING` | bool | on | idle loops steal migratable tasks |
//! | `XTC_EAGER_REBALANCE` | bool | off | steal even with parked pinned tasks or timers; ping an idle peer on enqueue |
//! | `XTC_STEAL_BACKOFF` | bool | off | grow the idle tick from 1 ms to 32 ms while nothing is found |
//! | `XTC_NUMA_SENSITIVITY` | `0`, `1`, `2` | `1` | HPX levels: who may steal across NUMA nodes |
//! | `XTC_MIN_TASKS_TO_STEAL` | integer | `0` | a victim needs this many queued tasks |
//! | `XTC_PREEMPT` | duration (`0`, `1ms`) | `0` | CPU-time preemption tick for `yield_if_due` |
//! | `XTC_PREEMPT_SIGNAL` | real-time signal (`SIGRTMIN+3`, `RTMIN+3`, `SIGRTMAX-1`, or its number) | `SIGRTMIN+1` | the signal of the preemption tick (see Signals below) |
//! | `XTC_INTERRUPT_SIGNAL` | real-time signal, as above | `SIGRTMIN+2` | the signal that interrupts a cancelled blocking-pool job; one per process, fixed by the first executor built (a refused build fixes nothing; a `LocalExecutor`, which reads no variable but `XTC_IO`, fixes the default if it uses the pool first) |
//! | `XTC_STALL_BUDGET` | duration (`0`, `10ms`) | `0` | stall watchdog budget of every loop |
//! | `XTC_IO` | `auto`, `io_uring` (or `uring`, `iouring`, `io-uring`), `epoll` | `auto` | I/O driver: auto probes io_uring once and falls back to epoll (see [`io`]); read by every builder unless `Builder::io_driver` is set |
//! | `XTC_REPLY_SPIN` | duration (`0`, `50us`; at most `1s`) | `50us` | how long a loop whose pinned task awaits a `submit_to` reply from another shard polls before parking: the reply then needs no wake-up of its own |
//! | `XTC_SPIN_BEFORE_PARK` | duration (`0`, `50us`, `1ms`; at most `1s`) | `20us` | how long a loop that just did work polls before parking: lower cross-shard latency for a full CPU while it spins (it yields to other threads every 64 polls) |
//!
//! # Signals
//!
//! xtc installs handlers for two real-time signals, and sends them only to its own threads:
//! `SIGRTMIN+1`, the CPU-time tick of `XTC_PREEMPT` (only when it is set), and `SIGRTMIN+2`,
//! which interrupts a blocking-pool thread whose file operation was cancelled (epoll driver).
//! A program that uses either number itself picks others for xtc: `XTC_PREEMPT_SIGNAL`
//! ([`Builder::preempt_signal`], per executor) and `XTC_INTERRUPT_SIGNAL`
//! ([`Builder::interrupt_signal`], one per process: the blocking pool is), any two distinct
//! signals from `SIGRTMIN` to `SIGRTMAX`. Neither replaces a handler the program installed
//! itself: with the tick's signal taken, a worker runs without preemption and logs the error
//! (`XTC_PREEMPT` stays without effect); with the interrupt's taken, cancelled blocking file
//! operations are not interrupted. Both handlers
//! run on the alternate signal stack where a thread has one (`SA_ONSTACK`). Workers
//! inherit their signal mask from the thread that calls `run()`; blocking-pool threads, which
//! outlive runs and are shared by every executor of the process, keep the mask of the thread
//! that started them (a loop thread of an earlier run, perhaps before the program blocked a
//! signal for `signalfd`: block it before the first run, or in `main` before any thread). A
//! handler is looked at when xtc installs it, when a worker arms its timer and before each
//! interrupt: one the program installs for the tick's signal while a worker's timer runs
//! gets the ticks until that worker re-arms, so pick another signal for xtc rather than
//! taking its own mid-run. A cancelled job is sent the interrupt again only once it took the
//! last one (a real-time signal queues, one per send, against the user's
//! `RLIMIT_SIGPENDING`). A worker unblocks
//! the tick's signal for itself when it arms its preemption timer (a caller that blocks every
//! signal for `sigwait` or `signalfd` would otherwise turn preemption off unseen). Each
//! blocking-pool thread unblocks the interrupt signal for itself when it starts, once xtc's handler is
//! installed (never at the default action, which ends the process); otherwise a cancelled
//! blocking file operation on epoll was never interrupted, and its loop waited for it. So the
//! tick's signal (with preemption on) or the interrupt's, sent to the whole process, may land
//! on a worker or a pool thread and be swallowed there. That holds for a program that blocks the
//! signal to take it through `signalfd` or `sigwait` too: blocked at its default action, the
//! signal looks free to xtc, as does one the program ignores (`SIG_IGN`, which xtc's handler
//! then replaces). A program that wants these numbers for itself should give xtc others (the
//! two variables above), or install its handlers (any handler, even one that does nothing, if
//! it reads the signal through `signalfd`) before starting xtc.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod channel;
mod class;
mod clock;
mod context;
mod error;
mod event_loop;
mod executor;
pub mod fs;
pub mod io;
mod local;
pub mod net;
mod preempt;
mod ring;
pub mod shard;
mod shard_local;
mod sharded;
mod stall;
mod stats;
mod steal;
mod sync;
mod sys;
pub mod task;
#[cfg(test)]
mod test_log;
mod timer;

pub use class::{Class, DEFAULT_SHARES};
pub use error::{Error, JoinError, Result};
pub use executor::{
    Builder, Executor, Handle, DEFAULT_DEADLOCK_GRACE, DEFAULT_REPLY_SPIN,
    DEFAULT_SPIN_BEFORE_PARK, MAX_SPIN_BEFORE_PARK,
};
pub use local::LocalExecutor;
pub use preempt::{yield_if_due, YieldIfDue};

/// More shards than any executor can have: `MAX_SHARDS_PER_CPU` on each of the 8192 CPUs
/// Linux supports at most (`CONFIG_NR_CPUS`). Per-shard tables sized by the user
/// ([`ConnBalancer::new`](net::ConnBalancer::new), [`Sharded::try_new`]) refuse a larger count:
/// it panicked (capacity overflow) or aborted the process (the allocation failed) before.
pub(crate) const MAX_SHARDS: usize = xtc_numa::MAX_SHARDS_PER_CPU * 8192;
pub use ring::{DEFAULT_RING_CAPACITY, MAX_RING_CAPACITY};
pub use shard::{send_to, spawn, spawn_local, stop, submit_to, submit_to_all};
pub use shard_local::ShardLocal;
pub use sharded::Sharded;
pub use stall::StallReport;
pub use stats::LoopStats;
pub use task::{spawn_blocking, yield_now, JoinHandle};

/// Timers: [`sleep`](time::sleep), [`sleep_until`](time::sleep_until),
/// [`timeout`](time::timeout), [`interval`](time::interval). Each timer lives on the loop that
/// polls it; a loop parks until its earliest deadline.
pub mod time {
    pub use crate::timer::{
        interval, interval_at, sleep, sleep_until, timeout, Elapsed, Interval, Sleep, Timeout,
    };
}

#[cfg(all(test, loom))]
mod loom_close;
#[cfg(all(test, loom))]
mod loom_evacuate;
#[cfg(all(test, loom))]
mod loom_home;
#[cfg(all(test, loom))]
mod loom_park;
#[cfg(all(test, loom))]
mod loom_ring;
#[cfg(all(test, loom))]
mod loom_run;
#[cfg(all(test, loom))]
mod loom_shutdown_wait;
#[cfg(all(test, loom))]
mod loom_steal_window;
