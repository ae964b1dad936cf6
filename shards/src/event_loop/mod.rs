//! The event loop: one pinned OS thread running one shard.
//!
//! # The loop step
//!
//! Each turn of [`run`]:
//! 1. stop check (one relaxed load of the executor's stop flag);
//! 2. drain the inbox (one SeqCst load when empty; one lock and a vector swap otherwise) and
//!    the incoming rings (`ring/mod.rs`, fairly across peers);
//! 3. reap the I/O driver (io/mod.rs: submit what the last turn queued, dispatch completions;
//!    no system call on io_uring when nothing was queued and the kernel flags no completion
//!    work pending, none on epoll while nothing waits),
//!    then fire due timers (only when the loop has any: one clock read);
//! 4. run up to [`BATCH`] runnable tasks (a migratable one first after a turn that ran none,
//!    then pinned ones FIFO or by class, then migratable ones from the LIFO deque and the
//!    injector), reaping the driver again every `io::REAP_EVERY` polls (tasks run inline at
//!    joins, steal/mod.rs rule 6, count too);
//! 5. end of turn: the registered flushes, the ring flush (backlogs, waiters, pings), the
//!    migratable count, eager rebalance's nudge;
//! 6. if nothing is runnable and the inbox is empty: try to steal, spin before parking, publish
//!    the loop's status for quiescence detection (`executor/quiesce.rs`), then park *in the I/O
//!    driver* until an I/O event, the next timer deadline or a wake ping (the ping's eventfd is
//!    registered in the driver), by the announce → recheck → sleep protocol of
//!    [`park`].
//!
//! ARCHITECTURE.md's "The loop step" has each step's costs and conditions.
//!
//! A loop that stops (stop request, quiescence, deadlock, end of `block_on`) runs [`shutdown`]:
//! it wakes every registered task and drops the `Runnable` instead of running it, until its
//! registry is empty, so every future is dropped on its own thread (task protocol rule 3).

pub(crate) mod inbox;
pub(crate) mod park;

use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
pub(crate) use inbox::Inbox;
pub(crate) use park::Parker;

use crate::{
    clock::Tick,
    context::Core,
    ring,
    stats::{bump, StatsCell},
    steal::{self, StealShared},
    sync::{
        AtomicU64,
        Ordering::{Relaxed, Release, SeqCst},
    },
    task::Runnable,
    timer,
};

/// Tasks run per turn before the loop looks at its inbox and timers again. A trade between
/// throughput (fewer checks) and how promptly a busy loop answers its peers; 128 keeps a turn of
/// trivial tasks under ~10 µs. (No source: chosen by the spawn and yield benchmarks.)
pub(crate) const BATCH: usize = 128;

/// Loop status kinds, the low two bits of [`LoopShared::status`].
pub(crate) mod status {
    /// Working, or about to.
    pub(crate) const BUSY: u64 = 0;
    /// Idle with no registered pinned task, no timer, no I/O in flight and nothing waiting
    /// for ring space (parked migratable tasks are in no loop's registry: quiescence also
    /// reads the executor's count of live migratable tasks).
    pub(crate) const EMPTY: u64 = 1;
    /// Idle with live tasks, all parked, and no timer.
    pub(crate) const PARKED: u64 = 2;
    /// Idle until a timer, an I/O completion or ring space.
    pub(crate) const WAITING: u64 = 3;

    pub(crate) fn kind(s: u64) -> u64 {
        s & 3
    }
}

/// The half of a loop other threads may touch. Fields written by different parties sit on
/// separate cache lines.
#[derive(Debug)]
pub(crate) struct LoopShared {
    pub(crate) index: usize,
    /// Which executor this loop belongs to (task routing, `context::route`).
    pub(crate) exec_id: u64,
    /// Written by every sender.
    pub(crate) inbox: CachePadded<Inbox<Runnable>>,
    /// Written by the loop (announce) and by senders (notify).
    pub(crate) parker: CachePadded<Parker>,
    /// `epoch << 2 | kind`, written by the loop, read by the coordinator.
    pub(crate) status: CachePadded<AtomicU64>,
    /// Written by the loop only.
    pub(crate) stats: StatsCell,
    /// Deque stealer and injector of migratable tasks (steal/mod.rs).
    pub(crate) steal: StealShared,
    /// Scheduling classes created on this loop, append-only (class.rs).
    pub(crate) classes: crate::sync::Mutex<Vec<&'static crate::class::ClassStats>>,
    /// How many classes `classes` holds, read once per turn.
    pub(crate) class_count: crate::sync::AtomicUsize,
    /// Stall watchdog settings and count (stall.rs).
    pub(crate) stall: crate::stall::StallShared,
    /// The next timer generation of this loop's next run: each run's `Timers` starts here and
    /// hands its own next one back when it ends (`Core`'s drop), so a `TimerKey` kept from an
    /// earlier run (a sleep polled in one `block_on`, dropped in a later one) matches no timer
    /// of a later run. A `u64` counted per loop does not wrap. Touched by the loop only, twice
    /// per run.
    pub(crate) timer_generation: AtomicU64,
    /// Units of task references to this loop (`task/home.rs`): while above zero, they hold one
    /// strong count of this loop's `Arc` together. Written when a task is made or freed off
    /// this loop, and once per refill of the loop's bank.
    pub(crate) task_refs: crate::sync::AtomicUsize,
    /// The executor, weakly (set once by `ExecShared::new_arc`): how a migratable task, whose
    /// metadata holds its spawn loop, reaches its executor (steal/mod.rs rule 1).
    exec: std::sync::OnceLock<std::sync::Weak<crate::executor::ExecShared>>,
    /// Set (for good) when a run's shutdown of this loop was cut short by a panic (a bug in
    /// xtc): tasks of the loop that had no `Runnable` then were not dropped on the loop's
    /// thread, and their futures may be `!Send`. From then on what is routed to this loop (a
    /// wake of such a task, through its inbox or a ring) is leaked, never polled or dropped
    /// on another thread, and the executor refuses to run again (`Executor::run`). Written
    /// once by the loop's worker before its `Core` goes; read by the sweeps that would drop
    /// the loop's messages.
    pub(crate) poisoned: crate::sync::AtomicBool,
    /// The run (`ExecShared::run_id`) in which this loop's shutdown last began, 0 before any:
    /// stored first thing in [`shutdown`], after which this loop polls no task in that run.
    /// Read by a wait in a drop that another loop's shutdown runs, on a migratable task that
    /// no loop may run any more once every loop's shutdown has begun
    /// (`steal::cancel_awaited_at_stop`, ring rule 3c). A run id, not a flag: a loop yet to
    /// start in a later run never reads as stopping from the earlier run's stamp.
    pub(crate) shut_run: AtomicU64,
}

/// A poisoned loop's inbox is leaked with it: dropped here, a wake of one of its `!Send`
/// tasks dropped that task's future on whichever thread freed the executor.
impl Drop for LoopShared {
    fn drop(&mut self) {
        if self.poisoned.load(std::sync::atomic::Ordering::SeqCst) {
            let mut queued = Vec::new();
            self.inbox.drain_into(&mut queued);
            leak_all(queued);
        }
    }
}

/// Leaks what was routed to a poisoned loop ([`LoopShared::poisoned`]), with an error logged:
/// no thread may drop it but the loop's own, which is gone.
pub(crate) fn leak_all(tasks: Vec<Runnable>) {
    if tasks.is_empty() {
        return;
    }
    tracing::error!(
        tasks = tasks.len(),
        "xtc: tasks routed to a loop whose shutdown panicked are leaked, not dropped (their \
         futures may be tied to that loop's thread)"
    );
    for r in tasks {
        std::mem::forget(r);
    }
}

impl LoopShared {
    /// An identity no other loop of the process ever has, not even after this one is freed
    /// (its executor's id is never reused, and shard indices stay below 2^20): what
    /// `Sharded<T>` keys its slots on. Never 0.
    pub(crate) fn uid(&self) -> u64 {
        ((self.exec_id << 20) | self.index as u64) + 1
    }
}

/// `LoopShared::uid`'s bound, checked where it would break: every build makes a victim order,
/// which refuses more than `MAX_VICTIM_SHARDS` shards, so indices stay below 2^20. Raising
/// that cap past it would let two loops share a uid, and `Sharded<T>` one slot between two
/// threads (a data race); this stops the build instead.
const _: () = assert!(xtc_numa::MAX_VICTIM_SHARDS < 1 << 20);

impl LoopShared {
    pub(crate) fn new(
        index: usize,
        exec_id: u64,
        base: Instant,
        steal: StealShared,
    ) -> std::io::Result<LoopShared> {
        Ok(LoopShared {
            steal,
            classes: crate::sync::Mutex::new(Vec::new()),
            class_count: crate::sync::AtomicUsize::new(0),
            stall: crate::stall::StallShared::new(),
            index,
            exec_id,
            inbox: CachePadded::new(Inbox::new()),
            parker: CachePadded::new(Parker::new()?),
            status: CachePadded::new(AtomicU64::new(status::BUSY)),
            stats: StatsCell::new(base),
            timer_generation: AtomicU64::new(0),
            task_refs: crate::sync::AtomicUsize::new(0),
            exec: std::sync::OnceLock::new(),
            poisoned: crate::sync::AtomicBool::new(false),
            shut_run: AtomicU64::new(0),
        })
    }

    /// The executor this loop belongs to, weakly; a dangling `Weak` before `set_exec`.
    /// Cost: one atomic load. Inline: every migratable task's drop and schedule call it,
    /// from code generic over the future and so built in the user's crate.
    #[inline]
    pub(crate) fn exec(&self) -> &std::sync::Weak<crate::executor::ExecShared> {
        static NONE: std::sync::Weak<crate::executor::ExecShared> = std::sync::Weak::new();
        self.exec.get().unwrap_or(&NONE)
    }

    /// Records the executor this loop belongs to (once; later calls are ignored).
    pub(crate) fn set_exec(&self, exec: std::sync::Weak<crate::executor::ExecShared>) {
        let _ = self.exec.set(exec);
    }
}

/// The loop's side of its status word (`executor/quiesce.rs`): `epoch << 2 | kind`, SeqCst.
pub(crate) struct Status<'a> {
    word: &'a AtomicU64,
    /// The executor's `closing` flag (`executor/quiesce.rs`, `close`).
    closing: &'a crate::executor::quiesce::Closing,
    /// The executor's stop flag.
    stop: &'a crate::sync::AtomicBool,
    epoch: u64,
    /// The last idle value published, to poke the coordinator only on a change.
    published: u64,
    /// Whether the word still shows an idle kind (set by `idle`, cleared by `busy`).
    idle: bool,
}

/// Publishes BUSY in a fresh epoch on a loop's status word, before a run starts its threads
/// (`Executor::run`). Epochs go on from the last run's, so no snapshot of this run equals one
/// of the last.
pub(crate) fn restart_status(word: &AtomicU64) {
    let epoch = (word.load(SeqCst) >> 2) + 1;
    word.store(epoch << 2 | status::BUSY, SeqCst);
}

impl<'a> Status<'a> {
    /// Takes over `word` as `restart_status` left it: BUSY, at its epoch.
    pub(crate) fn new(
        word: &'a AtomicU64,
        closing: &'a crate::executor::quiesce::Closing,
        stop: &'a crate::sync::AtomicBool,
    ) -> Status<'a> {
        Status {
            word,
            closing,
            stop,
            epoch: word.load(SeqCst) >> 2,
            published: u64::MAX,
            idle: false,
        }
    }

    fn is_idle(&self) -> bool {
        self.idle
    }

    /// The loop is (about to be) working: a new epoch, so the coordinator's snapshots differ.
    /// If the coordinator is closing (confirming a quiescent stop), waits for its decision
    /// (a few microseconds). Returns `true` if the executor is stopping (by that decision, or
    /// one made since this turn's step 1): the caller then takes no work and goes to step 1
    /// (`executor/quiesce.rs`, `close`). Cost: one SeqCst store, an uncontended lock and
    /// unlock, and one load, once per idle period.
    #[must_use]
    pub(crate) fn busy(&mut self) -> bool {
        self.idle = false;
        self.epoch += 1;
        self.word.store(self.epoch << 2 | status::BUSY, SeqCst);
        self.closing.wait_if_closing();
        // A stop decided after this turn's step 1 (while we waited, or before the check
        // above, whose lock then came after the coordinator's and so sees its stop flag).
        self.stop.load(SeqCst)
    }

    /// The loop is going idle with `kind`; returns whether that changed the published value.
    pub(crate) fn idle(&mut self, kind: u64) -> bool {
        let st = self.epoch << 2 | kind;
        self.word.store(st, SeqCst);
        self.idle = true;
        let changed = st != self.published;
        self.published = st;
        changed
    }
}

/// Why a loop's `run` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The executor asked it to stop.
    Stopped,
    /// `done()` became true.
    Done,
}

/// Runs `core` on this thread (which must have entered it) until the executor's stop flag is set
/// or `done()` returns true.
pub(crate) fn run(core: &Core, stop_aware: bool, done: &dyn Fn() -> bool) -> Exit {
    let shared = &*core.shared;
    let exec = &*core.exec;
    let mut spare: Vec<Runnable> = Vec::new();
    let mut wakers = Vec::new();
    let mut status = Status::new(&shared.status, &exec.closing, &exec.stop);
    // Whether the last turn ran a migratable task (step 4's first pick).
    let mut migratable_ran = false;
    // Steal rule 6: work-first joins nest on the stack below this frame, within an allowance.
    let here = crate::sys::stack_here();
    let allowance = steal::inline_stack(here, crate::sys::thread_stack());
    core.inline_floor.set(here - allowance);
    // The run's clock (busy + idle) is the caller's `RunClock`, which spans the shutdown too.
    let exit = loop {
        // Step 1.
        if stop_aware && exec.stop_requested() {
            break Exit::Stopped;
        }
        if done() {
            break Exit::Done;
        }
        // Step 2. After an idle tick that kept the idle status, announce BUSY before taking
        // anything (executor/quiesce.rs: the status must change before the counts do).
        if status.is_idle()
            && (shared.inbox.is_pending() || core.mesh.borrow().incoming_pending())
            && status.busy()
        {
            // The coordinator was closing: step 1 sees whether it stopped.
            continue;
        }
        // The inbox publishes its pop count as it drains: still idle here means nothing was
        // pending a moment ago, and a push racing in now waits for the next turn, whose check
        // above announces BUSY first (the ring counts are published at the end of the turn).
        if !status.is_idle() && shared.inbox.drain_into(&mut spare) > 0 {
            bump(&shared.stats.inbox_received, spare.len() as u64);
            for r in spare.drain(..) {
                core.enqueue(r);
            }
        }
        ring::drain(core);
        // Classes created since the last turn (possibly from another thread). A task of a
        // class newer than this look that arrived above picks the class up as it is queued
        // (`Core::enqueue`).
        core.sync_classes(false);
        // Step 3.
        core.io.reap();
        if !core.timers.borrow().is_empty() {
            core.timers.borrow_mut().expire(Instant::now(), &mut wakers);
            bump(&shared.stats.timers_fired, wakers.len() as u64);
            for w in wakers.drain(..) {
                crate::task::wake_guarded(w);
            }
        }
        // Step 4. Pinned tasks first (FIFO, or by class once the loop has classes), then
        // migratable ones (deque, then own injector). The stall watchdog and class accounting
        // need a clock read per poll; with neither armed the path is the plain FIFO.
        let budget = shared.stall.budget_ns.load(Relaxed);
        core.stall_ns.set(budget);
        // `Handle::set_preempt` reaches running loops (one load a turn).
        crate::preempt::sync_timer(core);
        let classes = core.classes_active.get();
        let timed = budget != 0 || classes;
        let mut ran = 0;
        // Each pick: the runnable, its class lane, and whether it is migratable.
        let migratable = || {
            steal::next_local(core).map(|m| {
                // Steal protocol rule 1: where a migratable task last ran.
                m.metadata().last.store(shared.index as u32, Relaxed);
                // Steal rule 6: the work-first joins its poll may run (a pinned task's joins
                // run nothing inline, so its polls leave the count alone).
                core.inline_left.set(steal::INLINE_BUDGET);
                (m, 0, true)
            })
        };
        let pinned = || {
            if classes {
                crate::class::pick(core).map(|(r, lane)| (r, lane, false))
            } else {
                core.queue.borrow_mut().pop_front().map(|r| (r, 0, false))
            }
        };
        // A turn that ran no migratable task makes the next one start with one, if any:
        // pinned tasks that keep yielding (or ping-pong on a local channel) keep the FIFO from
        // ever being empty, and starved the deque for good (a thief comes only if a peer is
        // idle). Only then: a migratable task that ends every turn (`yield_if_due`) would
        // otherwise be the first pick of every turn and starve the pinned ones instead.
        if status.is_idle() && (core.pinned_queued() || steal::has_local(core)) && status.busy() {
            // Work that arrived without a ping while the loop kept its idle status after an
            // idle tick (a migratable task pushed into our injector by a foreign thread, a
            // timer): the new epoch is published before running it, or the coordinator could
            // take this turn for the idle one it saw, and this loop's next EMPTY would look
            // unchanged and poke nobody (quiesce.rs). The coordinator was closing: step 1
            // sees whether it stopped.
            continue;
        }
        // Read after the busy check above, which may wait for the coordinator's decision: that
        // wait is not the first poll's time (a false stall report, a class charged for it).
        let mut t0 = if timed { Some(Tick::now()) } else { None };
        let first_migratable = !std::mem::take(&mut migratable_ran);
        // Tasks run inline at joins (steal rule 6, `inline_runs`) count toward the batch and
        // the reap interval like the loop's own polls: a turn runs at most BATCH tasks plus
        // one poll's inline budget before it looks at timers, I/O, the inbox and stop again.
        let mut reap_at = crate::io::REAP_EVERY;
        // `ran` plus the inline runs so far, updated after each poll (only a poll runs tasks
        // inline, so the count moves nowhere else).
        let mut polled = core.inline_runs.get() as usize;
        while polled < BATCH {
            if status.is_idle() {
                // Nothing was queued when the batch began; what came since waits for the next
                // turn, which publishes the new epoch (above) before it runs anything.
                break;
            }
            let first = if ran == 0 && first_migratable {
                migratable()
            } else {
                None
            };
            let Some((r, lane, is_migratable)) = first.or_else(pinned).or_else(migratable) else {
                break;
            };
            migratable_ran |= is_migratable;
            let meta: *const crate::task::TaskMeta = r.metadata();
            core.current.set(meta);
            core.coop_left.set(crate::context::COOP_FRESH);
            // A preemption tick earned before this poll (another task's, or the loop's own
            // spin) is not this task's to yield for.
            crate::preempt::forget_idle_tick(core);
            core.poll_started.set(t0);
            if let Some(start) = t0 {
                // The metadata is needed after `run`, when the task may be gone: keep a copy
                // of the info only while the watchdog is armed.
                let info = (budget != 0).then(|| r.metadata().info.clone());
                r.run();
                // The task may be gone (a detached task that finished is freed inside `run`):
                // nothing below (the stall callback is user code) may see it as current.
                core.current.set(std::ptr::null());
                let now = Tick::now();
                let held = now.since(start);
                // Inline joins' time is their tasks' (steal rule 6), not this one's.
                let cost = held.saturating_sub(core.inline_time.replace(Duration::ZERO));
                t0 = Some(now);
                // A migratable task belongs to no lane (classes order pinned tasks only):
                // charged to lane 0, its CPU time starved the untagged pinned tasks.
                if classes && !is_migratable {
                    crate::class::account(core, lane, cost);
                }
                if let Some(info) = info {
                    let budget = Duration::from_nanos(budget);
                    // An inline task over budget alone makes the whole poll over budget too.
                    if held > budget && report_stalls(core, &info, budget, held) {
                        // The report's own time (a callback, a log line) is nobody's poll:
                        // charged to the next one, it made that one look stalled too.
                        t0 = Some(Tick::now());
                    }
                }
            } else {
                r.run();
            }
            core.current.set(std::ptr::null());
            ran += 1;
            polled = ran + core.inline_runs.get() as usize;
            if polled >= reap_at {
                reap_at = polled + crate::io::REAP_EVERY;
                core.io.reap();
                if t0.is_some() {
                    // Nor is the reap's (the wakes it dispatches) the next poll's.
                    t0 = Some(Tick::now());
                }
                if !classes && core.classes_active.get() {
                    // A wake the reap dispatched switched classes on (a task of a class this
                    // loop had not picked up yet): the rest of this batch would run classless
                    // and untimed, `yield_if_due` blind to a runnable latency task.
                    core.end_batch.set(false);
                    break;
                }
            }
            if core.end_batch.replace(false) {
                break;
            }
        }
        let worked = ran > 0;
        if worked {
            core.empty_ticks.set(0);
            core.io.submit();
        }
        // Step 5.
        core.run_flushes();
        ring::flush(core);
        steal::flush_live(core);
        steal::nudge_idle_peer(core);
        let full = ran + core.inline_runs.get() as usize >= BATCH;
        publish_counts(core, ran as u64);
        if full
            || core.pinned_queued()
            || shared.inbox.is_pending()
            || steal::has_local(core)
            || core.has_flushes()
            || done()
        {
            continue;
        }
        // Step 6.
        if core.mesh.borrow().incoming_pending() {
            continue;
        }
        // Steal rule 3: a work ping that came while the loop was awake woke nothing (the
        // steal below looks at every victim anyway); one that lands from here on is one the
        // recheck below looks for.
        if status.is_idle() {
            #[cfg(test)]
            tests::hook(tests::At::Forget, core);
            // An idle tick's turn kept the idle status, so a nudger picked this loop as idle:
            // its ping is a wake by new work, not one that came while the loop was busy.
            // Forgotten, the nudged task waited for the 16-look starvation override (rule 3).
            if steal::work_pinged(core) {
                steal::woke(core, true);
            }
        } else {
            steal::forget_work_ping(core);
        }
        #[cfg(test)]
        tests::hook(tests::At::Steal, core);
        if !steal::would_steal(core) {
            steal::drop_waiver(core);
        } else if steal::try_steal(core) {
            core.empty_ticks.set(0);
            // Step 1 comes next either way (a closing coordinator may have stopped).
            let _ = status.busy();
            continue;
        }
        #[cfg(test)]
        if !status.is_idle() && !worked {
            tests::hook(tests::At::Look, core);
        }
        // Spin-before-park only after a turn that did work: a loop in a conversation with a
        // peer gets the answer without a wake-up, an idle loop (woken by a tick that found
        // nothing) parks at once.
        let mut spin = if worked {
            exec.spin_before_park()
        } else {
            Duration::ZERO
        };
        // A pinned task here awaits a cross-shard reply (flagged by a poll of this turn or of
        // one just before that took another turn, and not answered since): with its target
        // asleep, the reply's own wake-up would double the round trip (Handle::set_reply_spin).
        if reply_spin_due(core) {
            spin = spin.max(exec.reply_spin());
        }
        let spun = !spin.is_zero();
        // A preemption tick the spin's CPU time earned is dropped when the next poll starts.
        let found = spun && spin_for_work(core, spin);
        if found {
            continue;
        }
        // A task waiting for ring space (`ring::reserve`) is woken once the consumer drains
        // the ring, which it does whatever its tasks do, and that drain's ping moves no count
        // the quiescence check reads: as `PARKED`, a loop whose thread was slow to take that
        // ping (or paused before its recheck found the room) looked deadlocked.
        let kind = {
            if !core.timers.borrow().is_empty()
                || core.mesh.borrow().blocked_on_space()
                || core.io.in_flight() > 0
            {
                status::WAITING
            } else if core.registry.borrow().is_empty() {
                status::EMPTY
            } else {
                status::PARKED
            }
        };
        let went_empty = status.idle(kind) && kind == status::EMPTY;
        if spun {
            // After the idle status: a nudger that finds the flag down sees that status
            // (`steal::nudge_idle_peer`), so it picks this loop either way.
            shared.steal.spinning.store(false, Release);
        } else if steal::nudged_before_spin(core) {
            // No spin looked after the idle status: a nudger that read this loop BUSY (before
            // the idle status above) and passed it over had queued its work before its fence;
            // this look, after ours, sees it. Without it, the loop slept a whole idle tick
            // (up to 32 ms with backoff) with that work queued.
            let _ = status.busy();
            continue;
        }
        if went_empty && stop_aware {
            exec.loop_went_empty(shared.index);
        }
        let now = Instant::now();
        let next = core.timers.borrow_mut().next_deadline();
        let mut timeout = timer::park_timeout(next, now);
        let mut tick_driven = false;
        let tick = steal::idle_tick(core);
        if let Some(tick) = tick {
            tick_driven = timeout.is_none_or(|t| t > tick);
            timeout = Some(timeout.map_or(tick, |t| t.min(tick)));
        }
        let mut idle_tick_only = false;
        if timeout != Some(Duration::ZERO) {
            #[cfg(test)]
            tests::hook(tests::At::Announce, core);
            shared.parker.announce();
            // Steal rule 4: a thief parking without a tick counts itself first, then looks
            // again (below), so a spawn either sees it counted and pings, or is seen.
            let tickless = (tick.is_none() && steal::enter_tickless(core))
                .then(|| steal::TicklessGuard(&core.exec));
            // Rule 1 of park.rs: recheck every source after announcing (rings: ring/mod.rs
            // rules 3 and 5).
            if shared.inbox.recheck()
                || core.mesh.borrow().incoming_pending()
                || steal::has_local(core)
                || ring::prepare_park(core)
                || (stop_aware && exec.stop_requested())
                // The first migratable spawn (or a knob switched on or changed) pings every
                // loop, but a ping that lands between the tick decision above and the
                // announcement is swapped away by it: decide again if the tick is not the one
                // chosen (loom_park.rs, count leaving zero; a steal knob such as backoff
                // turned off, whose loop slept out its old tick, up to 32 ms).
                || steal::idle_tick(core) != tick
                // A ping for migratable work (eager rebalance's nudge, a spawn's ping) that
                // landed after the steal above but before the announcement (which swapped it
                // away): the nudger picked this loop as idle once its status was published, and
                // the loop slept a whole idle tick (up to 32 ms with backoff) with the work
                // queued at its victim. (Without a tick the look above sees that work.)
                || (tick.is_some() && steal::work_pinged(core))
            {
                shared.parker.cancel();
                drop(tickless);
                // Steal rule 3: a spawn's ping that came in the window counts as a wake by
                // new work (its `work_ping` kept), as it would have had the loop slept first.
                steal::woke(core, true);
            } else {
                shared.stats.park_begin(now);
                let mut events = 0;
                let pinged = shared.parker.sleep_in(
                    |t, ping| {
                        let (pinged, drained, n) = core.io.park(t, ping);
                        events = n;
                        (pinged, drained)
                    },
                    timeout,
                );
                shared.stats.park_end(Instant::now());
                drop(tickless);
                // Steal rules 3 and 4: woken by work, or an idle tick that found nothing yet.
                steal::woke(core, pinged);
                if !pinged {
                    core.empty_ticks
                        .set(core.empty_ticks.get().saturating_add(1));
                    // An idle tick with nothing new in sight is not activity: keep the status,
                    // so the quiescence and deadlock checks see a stable loop (a steal that
                    // then succeeds publishes BUSY itself, above).
                    idle_tick_only = tick_driven
                        && events == 0
                        && !shared.inbox.is_pending()
                        && !core.mesh.borrow().incoming_pending()
                        && !steal::has_local(core);
                }
            }
        }
        if !idle_tick_only {
            // Step 1 comes next either way (a closing coordinator may have stopped).
            let _ = status.busy();
        }
    };
    exit
}

/// A loop's run in its stats (busy + idle time), from [`start`](Self::start) until dropped
/// (`StatsCell::stopped`), which ends it however the run ends: held by the worker (and by
/// `LocalExecutor::block_on`) across [`run`] and [`shutdown`], so the shutdown's time (its
/// drops of every task, which run user code, and its waits for in-flight wakes and pool jobs)
/// counts as busy, as the docs of `LoopStats::busy` say. Kept inside `run`, the clock stopped
/// before the shutdown, whose time then counted nowhere; and a loop that panicked (its worker
/// catches the panic and still shuts the loop down) kept its run open, its busy time growing
/// after `run()` returned, until the next run's start overwrote it.
pub(crate) struct RunClock<'a>(&'a StatsCell);

impl<'a> RunClock<'a> {
    /// Starts the loop's run clock.
    pub(crate) fn start(stats: &'a StatsCell) -> RunClock<'a> {
        stats.started(Instant::now());
        RunClock(stats)
    }
}

impl Drop for RunClock<'_> {
    fn drop(&mut self) {
        self.0.stopped(Instant::now());
    }
}

/// The park decision's question about the reply spin (the flag is taken: answered once per
/// waiting poll): did a pinned task's `submit_to` join wait here since the last park decision,
/// and does one still wait? A join whose reply came in while other work kept the loop busy
/// awaits nothing: spun for, its reply could not end the spin, which ran its whole length.
pub(crate) fn reply_spin_due(core: &Core) -> bool {
    core.reply_awaited.replace(false) && core.replies_awaited.get() > 0
}

/// Whether a wake or a message waits for this loop's next turn in a source a sender fills
/// without pinging a loop that is awake: the inbox, an incoming ring, io_uring's completion
/// queue. Loads only, no system call (epoll readiness is not seen). Cost: three loads.
pub(crate) fn turn_pending(core: &Core) -> bool {
    core.shared.inbox.is_pending()
        || core.mesh.try_borrow().is_ok_and(|m| m.incoming_pending())
        || core.io.has_completions()
}

/// Spin-before-park: polls the loop's sources for up to `spin` before it parks, yielding the
/// CPU (`sched_yield`) after every 64 polls. Returns whether work arrived or a timer fell due. Costs a full CPU for
/// the spin time of every idle period, unless another thread wants it.
///
/// The sources are those a sender fills without pinging a loop that has not announced sleep
/// (park.rs rule 2): the inbox, the rings, the I/O driver (io_uring's completion queue; on
/// epoll, readiness, looked up every 64 polls), the injector of migratable tasks (a plain
/// thread's `Handle::spawn`, or its wake of a migratable task that last ran here), room
/// in a full ring this loop's backlog or ring-space waiters wait on (ring rule 3), and, for a
/// loop that would steal, a ping for new migratable work (steal rule 4's spawn pings:
/// `work_ping`), which only a loop that announced sleep gets as a wake-up; its work sits at a
/// victim, which the next turn's steal looks at, the ping counting as a wake by new work
/// (steal rule 3), as in the park's recheck; eager rebalance's nudge marks it too, since a
/// spinning loop counts as idle for it (`StealShared::spinning`, raised here). Work from a
/// source missed here waits out the whole spin (up to 1 s).
///
/// The clock and the next timer are first read after [`SPIN_FIRST_POLLS`] polls, which is
/// when the spin's time starts: a spin that finds its work sooner, as a loop in a
/// conversation with a peer usually does, reads no clock (it read one as it began, at each
/// end of a turn that worked: a `clock_gettime` on the way to the first poll). So a spin
/// lasts up to that many polls longer than `spin` (well under a microsecond).
// Out of line: it runs once per idle period, and a profile then tells the spin (time spent
// waiting) from the loop turn (work).
#[inline(never)]
fn spin_for_work(core: &Core, spin: Duration) -> bool {
    // Eager rebalance may nudge this loop while it spins (steal rule 4). Lowered here once work
    // came, else by the caller after it published the loop's idle status.
    let spinning = &core.shared.steal.spinning;
    spinning.store(true, SeqCst);
    // A nudger may have passed this loop over just before the flag went up.
    let found = steal::nudged_before_spin(core) || spin_until_work(core, spin);
    if found {
        spinning.store(false, Relaxed);
    }
    found
}

/// [`spin_for_work`]'s spin.
#[inline(always)]
fn spin_until_work(core: &Core, spin: Duration) -> bool {
    // The deadline and the next timer, from the first look at the clock on.
    let mut until: Option<(Instant, Option<Instant>)> = None;
    let mut polls = SPIN_FIRST_POLLS;
    loop {
        for _ in 0..polls {
            // `turn_pending`'s sources and the rest, the rings' two looks under one borrow.
            if core.shared.inbox.is_pending()
                || ring::spin_news(core)
                || core.io.has_completions()
                || steal::has_local(core)
            {
                return true;
            }
            if steal::work_pinged(core) && steal::would_steal(core) {
                // Taken as the park's recheck takes it: the next turn's first steal ignores
                // the minimum, as that of a loop the ping woke would.
                steal::woke(core, true);
                return true;
            }
            std::hint::spin_loop();
        }
        // epoll has no completion queue in shared memory to look at: readiness takes a system
        // call (`epoll_wait(0)`, only while a task waits on the driver), made here at the
        // pace of the yield below. The events it dispatches wake their tasks onto this loop.
        if core.io.kind() == Some(crate::io::Driver::Epoll) && core.io.reap() > 0 {
            return true;
        }
        let now = Instant::now();
        let (deadline, next_timer) =
            *until.get_or_insert_with(|| (now + spin, core.timers.borrow_mut().next_deadline()));
        if now >= deadline || next_timer.is_some_and(|t| now >= t) || core.exec.stop_requested() {
            return next_timer.is_some_and(|t| now >= t);
        }
        if polls == SPIN_FIRST_POLLS {
            // The first look at the clock only: the yields come every 64 polls from here.
            polls = 64;
            continue;
        }
        // Give the CPU to any thread that shares it (a client on the same core, another
        // process), then go on spinning: a spin that keeps the CPU from the thread that would
        // produce the awaited work only delays it. With nothing else runnable this costs a
        // system call every ~64 polls (measured: echo with its client on the server's cores
        // went from 0.57x to 0.78x tokio's rate, p99 from 9.2 ms to 4.1 ms, at an earlier stop).
        std::thread::yield_now();
    }
}

/// Polls of a spin before its first look at the clock ([`spin_for_work`]): more than a peer's
/// answer in a conversation usually takes (a few hundred nanoseconds), few enough that the
/// spin's time is hardly longer than asked.
const SPIN_FIRST_POLLS: u32 = 16;

/// The stall watchdog's reports for one poll that held the loop for `held` (its own time and
/// that of the tasks it ran inline, steal rule 6): first the inline tasks that overran the
/// budget by their own time, then the polled task for the rest of the hold if that rest
/// overran it (its own time, or many inline tasks none of which overran alone). Returns
/// whether anything was reported.
#[cold]
#[inline(never)]
fn report_stalls(
    core: &Core,
    info: &crate::task::TaskInfo,
    budget: Duration,
    held: Duration,
) -> bool {
    let inline = std::mem::take(&mut *core.inline_stalls.borrow_mut());
    let mut rest = held;
    for (info, took) in &inline {
        crate::stall::report(&core.shared, info, budget, *took);
        rest = rest.saturating_sub(*took);
    }
    if rest > budget {
        crate::stall::report(&core.shared, info, budget, rest);
    }
    !inline.is_empty() || rest > budget
}

fn publish_counts(core: &Core, polls: u64) {
    let stats = &core.shared.stats;
    let inlined = core.inline_runs.replace(0);
    bump(&stats.polls, polls + inlined);
    bump(&stats.joins_inlined, inlined);
    {
        let m = core.mesh.borrow();
        stats
            .messages_sent
            .store(m.sent, crate::sync::Ordering::Relaxed);
        stats
            .messages_received
            .store(m.received, crate::sync::Ordering::Relaxed);
        stats
            .messages_handed_over
            .store(m.handed_over, crate::sync::Ordering::Relaxed);
    }
    stats
        .tasks_run
        .store(core.tasks_done.get(), crate::sync::Ordering::Relaxed);
    stats.live_tasks.store(
        core.registry.borrow().len() as u64,
        crate::sync::Ordering::Relaxed,
    );
    let (sub, done) = core.io.counts();
    stats
        .io_submitted
        .store(core.io_base.0 + sub, crate::sync::Ordering::Relaxed);
    stats
        .io_completed
        .store(core.io_base.1 + done, crate::sync::Ordering::Relaxed);
}

/// Drops every task this loop owns, on this thread (task protocol rule 3). With `keep_inbox`,
/// messages still in the inbox that are not needed to finish that (fresh spawns, which own only
/// their `Send` closure) are left for a later `run()`, and so are migratable tasks still queued
/// (fresh spawns too, at a quiescent stop). Without it, what was queued when this shutdown
/// began is dropped; spawns that other threads make meanwhile (into the inbox or the
/// injector) are dropped or left for the next run, as spawns made after `run()` returned are:
/// a drain that waited for an empty inbox never ended while they spawned faster than the loop
/// dropped.
pub(crate) fn shutdown(core: &Core, keep_inbox: bool) {
    // First: from here this loop polls no task in this run (a planted panic below included,
    // which poisons it). A drop that another loop's shutdown runs may wait on a migratable
    // task until every loop has this (`steal::cancel_awaited_at_stop`).
    core.shared.shut_run.store(core.exec.run_id(), SeqCst);
    #[cfg(test)]
    if core.exec.panic_shutdown.load(SeqCst) == core.index() {
        panic!("planted: shard {}'s shutdown panics", core.index());
    }
    let shared = &*core.shared;
    // Counted before the push: every message pushed before this point, in flight included,
    // is among the first `inbox_before` the loop takes. Once no task is registered, whatever
    // comes later is a fresh spawn from another thread, which may wait for the next run: a
    // registered task's entry leaves only as its `Runnable` is dropped here, so a wake of one
    // fired elsewhere has arrived before the registry can read empty.
    let inbox_before = shared.inbox.pushed();
    // What the drops below send to loops that have stopped is dropped, not kept for their
    // next run (ring::evacuate).
    core.mesh.borrow_mut().begin_shutdown();
    // Waking schedules onto our own queue (task protocol rule 1) and never touches the registry.
    for (_, e) in core.registry.borrow().iter() {
        e.wake();
    }
    // Entries leave the registry as the `Runnable`s below are dropped.
    let timer_wakers = core.timers.borrow_mut().clear();
    // The run's timers are gone: from here a sleep of this run dropped off the loop sends no
    // cancel (`timer/sleep.rs`, `cancel_elsewhere`), which would wait in the inbox for the
    // next run (a `LocalExecutor` never requests a stop), also one a `Drop` later in this
    // shutdown registers (its timer goes with the `Core`): every generation reads as ended
    // until `Core::drop` stores where the next run's start.
    shared
        .timer_generation
        .store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
    crate::task::drop_wakers_guarded(timer_wakers);
    // Runnables of other loops' tasks go home; ours in the rings come in.
    core.run_flushes();
    let _ = ring::evacuate(core);
    let mut spare = Vec::new();
    // Set once the run's `ShardLocal` values are dropped: user code then ran at a quiescent
    // stop too, and what it spawned on this loop's deque is this run's, not a racing foreign
    // spawn for the next one.
    let mut locals_dropped = false;
    loop {
        let mut dropped = 0;
        loop {
            let next = core.queue.borrow_mut().pop_front();
            match next {
                Some(r) => {
                    crate::task::cancel(r);
                    dropped += 1;
                }
                None => break,
            }
        }
        // At a quiescent stop (`keep_inbox`) every migratable task still queued is a fresh
        // spawn from a foreign thread racing the end of `run()` (none was alive when the
        // coordinator decided): it stays in the injector or deque for the next run, as a
        // pinned spawn stays in the inbox. Any that also parked is dropped with the registered
        // ones after the loops stop (`executor::drop_migratable`).
        if !keep_inbox {
            steal::drop_local(core);
        } else if locals_dropped {
            steal::drop_deque(core);
        }
        steal::flush_live(core);
        crate::task::cancel_all(crate::class::drain(core));
        // Dropping futures may have sent wakes to other loops (into rings, or into the backlog
        // of a full ring) and registered end-of-turn signals: deliver them before this loop
        // may leave. A backlog left behind would be dropped with the ring ends, on this
        // thread, and its tasks' owners would wait for them forever
        // (`tests/ring_submit.rs`, a_wake_sent_while_stopping_into_a_full_ring_reaches_its_loop).
        core.run_flushes();
        // What we have for a loop still shutting down (in its ring or a backlog) waits for
        // that loop to drain it or to stop, and what the evacuation's drops sent needs another
        // pass (ring::evacuate): we keep draining our own rings meanwhile.
        let evacuate_again = ring::evacuate(core);
        // The deque only: the injector's fresh spawns from other threads need not wait
        // (`steal::drop_local`), and this loop's drops queue on its deque.
        let queued =
            core.pinned_queued() || ((!keep_inbox || locals_dropped) && steal::deque_queued(core));
        if queued {
            // The evacuation drained our incoming rings: drop what came in.
            continue;
        }
        if core.has_flushes() {
            // Signals registered while the flushes above ran (a channel's signal woke a
            // custom waker that sent on another channel): the next pass runs them. Left in
            // the list, they went with the loop, and that channel's receiver slept for good.
            continue;
        }
        let live = core.registry.borrow().len();
        if live == 0
            && !evacuate_again
            && (keep_inbox || shared.inbox.popped_at_least(inbox_before))
        {
            // Every task is gone: the run's `ShardLocal` values go last (task drops may have
            // used them), and what their drops sent or woke gets another pass.
            if core.drop_shard_locals() {
                locals_dropped = true;
                continue;
            }
            break;
        }
        if shared.inbox.drain_into(&mut spare) > 0 {
            // Taken from the inbox like a turn's messages (`LoopStats::inbox_received`), as
            // the rings' drain below counts what it takes in `messages_received`.
            bump(&shared.stats.inbox_received, spare.len() as u64);
            core.queue.borrow_mut().extend(spare.drain(..));
            continue;
        }
        if ring::drain(core) > 0 {
            continue;
        }
        if dropped == 0 {
            // A wake fired on another thread is on its way to the inbox (its task is already
            // scheduled, so our wake above was a no-op), or a backlog waits for room in a ring
            // of a loop still shutting down (whose drain then pings us, ring rule 3), or what we
            // left in such a ring waits for its drain or its leaving (seen by the next pass,
            // within the 1 ms below): wait.
            shared.parker.announce();
            if shared.inbox.recheck()
                || core.mesh.borrow().incoming_pending()
                || ring::prepare_park(core)
            {
                shared.parker.cancel();
            } else {
                stopping_sleep(core, Duration::from_millis(1));
            }
        }
    }
    // Blocking-pool jobs of dropped file operations (epoll driver) still writing: the loop
    // leaves once they end, or after a second, as an io_uring driver's drop waits for its
    // operations.
    crate::io::blocking::settle(core.id);
    // Futures dropped after the last flush above (a class lane's, evacuated wakes') may have
    // spawned: publish that batch too, and lower the loop's `spawning` flag (steal rule 4).
    // Left out, the count stayed one low into the next run, which could end as quiescent with
    // a migratable task parked, and the flag kept idle loops ticking.
    steal::flush_live(core);
    publish_counts(core, 0);
}

/// Shutdown's wait, after the loop announced its sleep: until a wake ping or `timeout`.
/// Returns whether a ping ended it. In the I/O driver, as the loop parks: on io_uring the
/// driver's standing read of the ping's eventfd takes a ping as soon as this thread leaves a
/// system call (its completion work runs then), and a plain wait on the eventfd then saw
/// nothing and ran its full timeout, the ping's completion left unreaped.
fn stopping_sleep(core: &Core, timeout: Duration) -> bool {
    core.shared.parker.sleep_in(
        |t, ping| {
            let (pinged, drained, _) = core.io.park(t, ping);
            (pinged, drained)
        },
        Some(timeout),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::{context::with_core, Executor, MAX_SPIN_BEFORE_PARK};

    /// What [`hook`] runs, once, on the loop it names: `(executor id, shard, hook)`.
    type Hook = (u64, usize, Box<dyn FnOnce(&super::Core) + Send>);

    /// Where in a loop's park decision (step 6) a test's hook runs, on the loop's thread.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(crate) enum At {
        /// At the start of step 6 of a turn that kept the idle status (an idle tick's turn),
        /// before its work ping is looked at.
        Forget,
        /// Right before the park decision's steal.
        Steal,
        /// After the steal's look of a busy turn that ran nothing (no spin follows).
        Look,
        /// After the loop published its idle status and before it announces its sleep (the
        /// window a ping cannot reach).
        Announce,
        /// In a steal that succeeded, before the thief pushes what it took into its deque (the
        /// task is in no queue then: `steal::try_steal`).
        Stolen,
    }

    /// The armed hooks, each with its point. A list, not one slot: the tests that arm them run
    /// in parallel, each on its own executor, and one slot let a test's hook overwrite
    /// another's before that one's loop reached it.
    static ARMED: std::sync::Mutex<Vec<(At, Hook)>> = std::sync::Mutex::new(Vec::new());

    /// Arms `hook` for the next time the loop it names reaches `at`.
    fn arm_at(at: At, hook: Hook) {
        ARMED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((at, hook));
    }

    /// Arms `hook` for the next park decision (before the announcement) of the loop it names.
    fn arm(hook: Hook) {
        arm_at(At::Announce, hook);
    }

    /// Runs, once, the hook armed for `at` that names this loop, if any (test builds only).
    pub(crate) fn hook(at: At, core: &super::Core) {
        let mut armed = ARMED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = armed.iter().position(|(point, (exec, shard, _))| {
            *point == at && *exec == core.shared.exec_id && *shard == core.index()
        });
        if let Some(i) = mine {
            let (_, (_, _, hook)) = armed.swap_remove(i);
            // Unlocked first: a hook may arm the next one.
            drop(armed);
            hook(core);
        }
    }

    /// A nudge that reaches an idle loop in its idle tick's turn (its status still idle, so
    /// the nudger picks it) wakes it as new work would: it was erased as a ping that came
    /// while the loop was busy, and the thief took the nudged task only at the starvation
    /// override (16 looks). From an audit.
    #[test]
    fn a_nudge_landing_in_an_idle_ticks_turn_is_not_lost() {
        use std::{
            sync::{
                atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
                Arc,
            },
            time::Duration,
        };
        let (exec, exec_id) = eager_executor(true);
        let h = exec.handle();
        let in_window = Arc::new(AtomicBool::new(false));
        let parks_then = Arc::new(AtomicU64::new(u64::MAX));
        let (shard, parks_at_run, before) = exec
            .block_on(move || async move {
                let keeper = keeper_on_shard_0().await;
                crate::time::sleep(Duration::from_millis(5)).await;
                let (w, p) = (in_window.clone(), parks_then.clone());
                arm_at(
                    At::Forget,
                    (
                        exec_id,
                        1,
                        Box::new(move |core: &super::Core| {
                            p.store(core.shared.stats.parks.load(SeqCst), SeqCst);
                            w.store(true, SeqCst);
                            // Until the nudge marked this loop (it reads its status idle).
                            assert!(hold_until(|| crate::steal::work_pinged(core)), "no nudge");
                        }),
                    ),
                );
                assert!(
                    hold_until(|| in_window.load(SeqCst)),
                    "shard 1 never ticked"
                );
                let ms = Duration::from_millis;
                let (shard, parks, _) = nudged_child(h, ms(1), ms(3), || {}).await;
                keeper.abort();
                (shard, parks, parks_then.load(SeqCst))
            })
            .unwrap();
        assert_stolen_without_a_park(shard, parks_at_run, before);
    }

    /// From a task on shard 0 (a keeper alive there): spawns a migratable child and holds
    /// shard 0 from its next turn on, so that only a thief runs the child: a timer due `due`
    /// from now, whose waker runs `on_hold` and then waits (at that turn's step 3) until the
    /// child ran; this thread waits `wait` first, so that timer is due by the time this turn
    /// ends. Pinned work fills the rest of this turn's batch: the child stays queued, and the
    /// turn's end nudges an idle peer. Returns the shard that ran the child, shard 1's park
    /// count then, and the time from the spawn.
    async fn nudged_child(
        h: crate::Handle,
        due: std::time::Duration,
        wait: std::time::Duration,
        on_hold: impl Fn() + Send + Sync + 'static,
    ) -> (usize, u64, std::time::Duration) {
        use std::{
            future::Future,
            sync::{
                atomic::{AtomicBool, Ordering::SeqCst},
                Arc,
            },
            task::{Context, Wake, Waker},
        };
        struct Hold<F> {
            on_hold: F,
            child_ran: Arc<AtomicBool>,
        }
        impl<F: Fn() + Send + Sync + 'static> Wake for Hold<F> {
            fn wake(self: Arc<Self>) {
                (self.on_hold)();
                hold_until(|| self.child_ran.load(SeqCst));
            }
        }
        let child_ran = Arc::new(AtomicBool::new(false));
        let waker = Waker::from(Arc::new(Hold {
            on_hold,
            child_ran: child_ran.clone(),
        }));
        let timer = loop {
            let mut timer = Box::pin(crate::time::sleep(due));
            // (Already due if this thread was held up that long since: try again.)
            if timer
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
            {
                break timer;
            }
        };
        std::thread::sleep(wait);
        let t0 = std::time::Instant::now();
        let child = crate::spawn(async move {
            let parks = h.loop_stats(1).unwrap().parks;
            child_ran.store(true, SeqCst);
            (crate::shard::id(), parks, t0.elapsed())
        });
        for _ in 0..super::BATCH {
            drop(crate::shard::spawn_local(async {}));
        }
        let ran = child.await.unwrap();
        drop(timer);
        ran
    }

    /// Eager rebalance's nudge that reads a peer's status BUSY between that peer's look at
    /// its victims and its idle status, in a turn that ran nothing (so it does not spin), is
    /// not lost: the peer looks again after its idle status (`nudged_before_spin`). It slept
    /// a whole idle tick (32.6 ms with backoff) with the work queued at its victim. From an
    /// audit.
    #[test]
    fn a_nudge_passing_over_a_peer_that_ran_nothing_is_not_lost() {
        use std::{
            sync::{
                atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
                Arc,
            },
            time::Duration,
        };
        let (exec, exec_id) = two_shards(|b| b.eager_rebalance(true).steal_backoff(true));
        let h = exec.handle();
        let (in_window, nudged) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let parks_then = Arc::new(AtomicU64::new(u64::MAX));
        let (shard, parks_at_run, before, took) = exec
            .block_on(move || async move {
                let keeper = keeper_on_shard_0().await;
                // Long enough for shard 1's backoff to reach 32 ms.
                crate::time::sleep(Duration::from_millis(200)).await;
                let (w, n, p) = (in_window.clone(), nudged.clone(), parks_then.clone());
                arm_at(
                    At::Look,
                    (
                        exec_id,
                        1,
                        Box::new(move |core: &super::Core| {
                            p.store(core.shared.stats.parks.load(SeqCst), SeqCst);
                            w.store(true, SeqCst);
                            hold_until(|| n.load(SeqCst));
                        }),
                    ),
                );
                // A knob setter's ping: shard 1 takes a busy turn that runs nothing.
                h.set_min_tasks_to_steal(0);
                assert!(
                    hold_until(|| in_window.load(SeqCst)),
                    "shard 1 never looked"
                );
                let ms = Duration::from_millis;
                let (shard, parks, took) =
                    nudged_child(h, ms(1), ms(3), move || nudged.store(true, SeqCst)).await;
                keeper.abort();
                (shard, parks, parks_then.load(SeqCst), took)
            })
            .unwrap();
        assert_eq!(shard, 1, "shard 1 did not steal the child");
        assert_eq!(
            parks_at_run, before,
            "the nudge was lost: shard 1 parked {} more time(s) ({took:?}) before it stole the child",
            parks_at_run - before
        );
    }

    /// Steal rule 3. A thief woken by a spawn's ping whose look stops early (the task
    /// already ran and ended: no migratable task alive) keeps the waiver "for its next look,
    /// an idle tick away"; but with nothing alive it parks without a tick, so that next look
    /// comes after whatever wakes it next: here pinned work (a `spawn_on`), which rule 3 says
    /// waives nothing, and the thief took a task queued meanwhile below the minimum at once.
    /// Such a look now spends the waiver. From an audit.
    #[test]
    fn a_kept_waiver_does_not_survive_a_tickless_park() {
        use std::sync::{
            atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
            Arc,
        };
        let (exec, exec_id) = two_shards(|b| b.min_tasks_to_steal(1000));
        let h = exec.handle();
        let looked = Arc::new(AtomicBool::new(false));
        let (parks_idle, parks_run, shard) = exec
            .block_on(move || async move {
                let shared = h.shared.clone();
                // Shard 1 parked without a tick (nothing migratable alive).
                wait_until(|| shared.migratable.tickless.load(SeqCst) == 1).await;
                crate::time::sleep(std::time::Duration::from_millis(5)).await;
                assert_eq!(shared.migratable.tickless.load(SeqCst), 1);
                let l = looked.clone();
                arm_at(
                    At::Steal,
                    (
                        exec_id,
                        1,
                        Box::new(move |core: &super::Core| {
                            assert!(core.fresh_wake.get(), "woken by the spawn's ping");
                            // Until the child ran and ended and shard 0's turn published it.
                            let ex = core.exec.clone();
                            assert!(hold_until(|| ex.migratable.live.load(SeqCst) <= 0
                                && ex.loops.iter().all(|l| !l.steal.spawning.load(SeqCst))));
                            l.store(true, SeqCst);
                        }),
                    ),
                );
                // The spawn pings shard 1 (tickless) as a wake by new work; the child runs
                // here and ends within this turn.
                crate::spawn(async {}).await.unwrap();
                // This turn ends (its batch published); shard 1 looks, finds nothing alive.
                wait_until(|| looked.load(SeqCst)).await;
                wait_until(|| shared.migratable.tickless.load(SeqCst) == 1).await;
                // Pinned work wakes shard 1; it runs until a child is queued here.
                let queued = Arc::new(AtomicBool::new(false));
                let idle_at = Arc::new(AtomicU64::new(u64::MAX));
                let started = Arc::new(AtomicBool::new(false));
                let (q, ia, hh, st) = (queued.clone(), idle_at.clone(), h.clone(), started.clone());
                drop(h.spawn_on(1, move || async move {
                    st.store(true, SeqCst);
                    hold_until(|| q.load(SeqCst));
                    ia.store(hh.loop_stats(1).unwrap().parks, SeqCst);
                }));
                // Shard 1 awake on that task (not tickless): the spawn below pings nobody.
                wait_until(|| started.load(SeqCst)).await;
                assert_eq!(shared.migratable.tickless.load(SeqCst), 0);
                let done = Arc::new(AtomicBool::new(false));
                let (d, hh) = (done.clone(), h.clone());
                let child = crate::spawn(async move {
                    d.store(true, SeqCst);
                    (hh.loop_stats(1).unwrap().parks, crate::shard::id())
                });
                queued.store(true, SeqCst);
                // Busy until another loop took the child.
                hold_until(|| done.load(SeqCst));
                let (parks, shard) = child.await.unwrap();
                (idle_at.load(SeqCst), parks, shard)
            })
            .unwrap();
        assert_eq!(shard, 1, "nobody stole the child");
        assert!(
            parks_run - parks_idle >= 10,
            "stolen after {} parks of the thief: a waiver kept from a wake long gone",
            parks_run - parks_idle
        );
    }

    /// Eager rebalance's nudge lands on an idle peer after that peer published its idle status
    /// (so the nudger picks it) but before it announced its sleep: the nudge's `unpark` sees a
    /// loop not yet sleeping and writes no ping, and the announcement clears what it set. The
    /// peer's recheck looked at its own queues only, so it slept a whole idle tick (up to
    /// 32 ms with steal backoff) with the nudged work queued at its victim. Counted by parks,
    /// not timed: the thief must steal the work without parking once more.
    #[test]
    fn a_nudge_that_lands_before_the_thief_announces_its_sleep_is_not_lost() {
        use std::{
            sync::{
                atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
                Arc,
            },
            time::Duration,
        };
        let (exec, exec_id) = two_shards(|b| b.eager_rebalance(true));
        let h = exec.handle();
        let (in_window, nudged) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        // Shard 1's parks as it entered the window, then as the child ran (and where).
        let parks_then = Arc::new(AtomicU64::new(u64::MAX));
        let (shard, parks_at_run, before) = exec
            .block_on(move || async move {
                // A migratable task alive (parked on a timer): shard 1 parks with an idle
                // tick, whose recheck does not look at its victims' queues.
                let keeper = keeper_on_shard_0().await;
                crate::time::sleep(Duration::from_millis(5)).await;
                let (w, n, p) = (in_window.clone(), nudged.clone(), parks_then.clone());
                arm((
                    exec_id,
                    1,
                    Box::new(move |core: &super::Core| {
                        p.store(core.shared.stats.parks.load(SeqCst), SeqCst);
                        w.store(true, SeqCst);
                        hold_until(|| n.load(SeqCst));
                    }),
                ));
                assert!(
                    hold_until(|| in_window.load(SeqCst)),
                    "shard 1 never parked"
                );
                // A timer due at the next turn's step 3, whose waker holds shard 0 there.
                let ms = Duration::from_millis;
                // (When shard 0 holds, the nudge went out at the end of the turn before.)
                let (shard, parks, _) =
                    nudged_child(h, ms(20), ms(30), move || nudged.store(true, SeqCst)).await;
                keeper.abort();
                (shard, parks, parks_then.load(SeqCst))
            })
            .unwrap();
        assert_stolen_without_a_park(shard, parks_at_run, before);
    }

    /// The check of the nudge tests: shard 1 stole the child (it ran on `shard`) without
    /// parking again between the nudge (`before`: its parks then) and the run (`parks_at_run`).
    fn assert_stolen_without_a_park(shard: usize, parks_at_run: u64, before: u64) {
        assert_eq!(shard, 1, "shard 1 did not steal the child");
        assert_eq!(
            parks_at_run,
            before,
            "the nudge was lost: shard 1 parked {} more time(s) before it stole the child",
            parks_at_run - before
        );
    }

    /// Waits (sleeping 100 µs at a time) until `done()`, for at most 10 s; returns `done()`.
    /// For a hook that holds a loop in its park decision until another thread acted.
    fn hold_until(done: impl Fn() -> bool) -> bool {
        let t = std::time::Instant::now();
        while !done() {
            if t.elapsed() > std::time::Duration::from_secs(10) {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        true
    }

    /// Shard 1 of an executor, held in its next park decision, idle, until a work ping (a
    /// nudge) marked it ([`arm`](Self::arm)). A nudge passes a busy loop over, so a test that
    /// counts parks to see a nudge must not send it while the peer happens to be in an idle
    /// tick's turn.
    struct NudgeWindow {
        /// Set as shard 1 entered the window.
        entered: std::sync::Arc<std::sync::atomic::AtomicBool>,
        /// Shard 1's park count as it entered the window.
        parks: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl NudgeWindow {
        /// Arms the hook for shard 1 of executor `exec_id`.
        fn arm(exec_id: u64) -> NudgeWindow {
            use std::sync::{atomic::Ordering::SeqCst, Arc};
            let w = NudgeWindow {
                entered: Arc::default(),
                parks: Arc::default(),
            };
            let (entered, parks) = (w.entered.clone(), w.parks.clone());
            arm((
                exec_id,
                1,
                Box::new(move |core: &super::Core| {
                    parks.store(core.shared.stats.parks.load(SeqCst), SeqCst);
                    entered.store(true, SeqCst);
                    hold_until(|| crate::steal::work_pinged(core));
                }),
            ));
            w
        }

        /// Waits until shard 1 is in the window (a hang guard after 10 s fails the test).
        fn wait_entered(&self) {
            let entered = || self.entered.load(std::sync::atomic::Ordering::SeqCst);
            assert!(hold_until(entered), "shard 1 never parked");
        }

        /// Checks that shard 1 ran `what` on its first turn after the window: `shard` and
        /// `parks_at_run` are where it ran and shard 1's park count then.
        fn assert_stolen_at_once(&self, what: &str, shard: usize, parks_at_run: u64) {
            let before = self.parks.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(shard, 1, "the idle loop never stole {what}");
            assert_eq!(
                parks_at_run,
                before,
                "no nudge: shard 1 parked {} more time(s) before it stole {what}",
                parks_at_run - before
            );
        }
    }

    /// Two shards with eager rebalance on and a steal minimum no queue here reaches (only a
    /// nudged thief's first steal, or the starvation override, takes a task), stealing as
    /// given; and the executor's id (for [`arm`]).
    /// A migratable task woken from a plain thread and stolen by an idle loop is in no queue
    /// between the steal and the thief's push: a thief held off its CPU there (the hook) for
    /// longer than the deadlock grace made the coordinator read every loop idle, the task
    /// parked, and report a deadlock, dropping the woken task. The thief raises
    /// `StealShared::stealing` around the steal, which the snapshot counts as queued. From
    /// the deadlock-report audit.
    #[test]
    fn a_task_in_a_thiefs_hands_is_not_reported_as_a_deadlock() {
        use std::{
            sync::{
                atomic::{AtomicBool, Ordering::SeqCst},
                mpsc, Arc,
            },
            task::{Poll, Waker},
            time::Duration,
        };
        let (exec, exec_id) = two_shards(|b| {
            b.min_tasks_to_steal(1)
                .steal_backoff(false)
                .deadlock_grace(Some(Duration::from_millis(50)))
        });
        let (wtx, wrx) = mpsc::channel::<Waker>();
        let woken = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicBool::new(false));
        // Shard 0 busy (set as its busy loop begins), and shard 1 in the steal's window.
        let (busy, stolen) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (w2, d) = (woken.clone(), done.clone());
        let (b0, s0) = (busy.clone(), stolen.clone());
        exec.spawn_on(0, move || async move {
            // Migratable, parked on shard 0 with its waker on a plain thread.
            let m = crate::task::Builder::new().name("woken").spawn(async move {
                let mut sent = false;
                std::future::poll_fn(|cx| {
                    if w2.load(SeqCst) {
                        return Poll::Ready(());
                    }
                    if !sent {
                        sent = true;
                        wtx.send(cx.waker().clone()).unwrap();
                    }
                    Poll::Pending
                })
                .await;
                d.store(true, SeqCst);
            });
            // Shard 0 busy when the wake comes (its injector), so idle shard 1 steals it.
            // Busy from before the wake until shard 1 took the task (not a fixed 100 ms, which
            // a plain thread held off its CPU on a loaded machine could miss).
            crate::time::sleep(Duration::from_millis(20)).await;
            b0.store(true, SeqCst);
            let start = std::time::Instant::now();
            while !s0.load(SeqCst) && start.elapsed() < Duration::from_secs(20) {
                std::hint::spin_loop();
            }
            let _ = m.await;
        })
        .unwrap();
        /// Holds shard 1's first steal after the wake in the window; a steal before the wake
        /// (the task taken at its spawn) passes, the hook armed again for the next one.
        fn hold_the_woken_steal(
            exec_id: u64,
            woken: Arc<AtomicBool>,
            stolen: Arc<AtomicBool>,
            held: Arc<AtomicBool>,
        ) {
            arm_at(
                At::Stolen,
                (
                    exec_id,
                    1,
                    Box::new(move |_core: &super::Core| {
                        if !woken.load(SeqCst) {
                            return hold_the_woken_steal(exec_id, woken, stolen, held);
                        }
                        stolen.store(true, SeqCst);
                        // Held in the window for many graces: every other loop goes idle.
                        std::thread::sleep(Duration::from_millis(400));
                        held.store(true, SeqCst);
                    }),
                ),
            );
        }
        hold_the_woken_steal(exec_id, woken.clone(), stolen, held.clone());
        let waker = std::thread::spawn(move || {
            let w = wrx.recv().unwrap();
            let t = std::time::Instant::now();
            while !busy.load(SeqCst) && t.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(1));
            }
            woken.store(true, SeqCst);
            w.wake();
        });
        let out = exec.run();
        waker.join().unwrap();
        assert!(held.load(SeqCst), "shard 1 did not steal the woken task");
        assert!(
            out.is_ok() && done.load(SeqCst),
            "a woken task in a thief's hands was reported: {out:?}"
        );
    }

    fn eager_executor(stealing: bool) -> (Executor, u64) {
        two_shards(|b| {
            b.eager_rebalance(true)
                .stealing(stealing)
                .min_tasks_to_steal(1000)
        })
    }

    /// A 2-shard executor (oversubscribed, so it runs on any machine) with `knobs` applied, and
    /// its id (for [`arm`]).
    fn two_shards(knobs: impl FnOnce(crate::Builder) -> crate::Builder) -> (Executor, u64) {
        let exec = knobs(Executor::builder().shards(2).oversubscribe(true))
            .build()
            .unwrap();
        let id = exec.handle().shared.loops[1].exec_id;
        (exec, id)
    }

    /// Eager rebalance's nudge for a migratable task spawned by a loop that then blocks inside
    /// a task (`futures::executor::block_on` of the child's handle): the loop's turn never
    /// ends, so its end-of-turn nudge never went, and the idle peer found the child only by its
    /// idle ticks, with the minimum above the queue only at the starvation override (16
    /// ticks). The handle, polled with a foreign waker, sends the turn's deferred wakes, the
    /// nudge among them. The peer is held in its park decision, idle, until its nudge came
    /// ([`NudgeWindow`]: an integration test failed once in CI with the peer caught in an idle
    /// tick's turn). Counted by parks, not timed.
    #[test]
    fn a_foreign_block_on_of_a_migratable_spawn_nudges_an_idle_peer() {
        use std::time::Duration;
        let (exec, exec_id) = eager_executor(true);
        let h = exec.handle();
        let (window, shard, parks_at_run) = exec
            .block_on(move || async move {
                // A migratable task alive: shard 1 ticks, and the child's spawn below sends no
                // first-spawn ping (which would count as a wake by new work).
                let keeper = keeper_on_shard_0().await;
                crate::time::sleep(Duration::from_millis(5)).await;
                let window = NudgeWindow::arm(exec_id);
                window.wait_entered();
                let child =
                    crate::spawn(
                        async move { (crate::shard::id(), h.loop_stats(1).unwrap().parks) },
                    );
                let (shard, parks) = futures::executor::block_on(child).unwrap();
                keeper.abort();
                (window, shard, parks)
            })
            .unwrap();
        window.assert_stolen_at_once("the child", shard, parks_at_run);
    }

    /// xtc_exec(3): "a migratable task woken from elsewhere goes to its last loop"; woken from
    /// a plain thread it goes to that loop's injector, here the loop is busy in a long poll: an
    /// idle peer must be nudged, and a nudged thief's first steal ignores
    /// `min_tasks_to_steal`. Not nudged, the idle loop found the task only by its idle ticks,
    /// and with the minimum above the queue it waited for the starvation override (16 ticks).
    /// The peer is held in its park decision, idle, until its nudge came ([`NudgeWindow`]).
    /// Counted by parks, not timed.
    #[test]
    fn a_task_woken_from_a_plain_thread_into_a_busy_loop_nudges_an_idle_peer() {
        use std::{
            sync::{
                atomic::{AtomicBool, Ordering::SeqCst},
                Arc,
            },
            time::Duration,
        };
        let (exec, exec_id) = eager_executor(false);
        let h = exec.handle();
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        let (parked, done) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (window, shard, parks_at_run) = exec
            .block_on(move || async move {
                let (hh, pk, d) = (h.clone(), parked.clone(), done.clone());
                let sleeper = crate::spawn(async move {
                    pk.store(true, SeqCst);
                    rx.await.unwrap();
                    let parks = hh.loop_stats(1).unwrap().parks;
                    d.store(true, SeqCst);
                    (crate::shard::id(), parks)
                });
                wait_until(|| parked.load(SeqCst)).await;
                // The sleeper last ran here (stealing was off); shard 1 ticks (a migratable
                // task is alive).
                h.set_stealing(true);
                crate::time::sleep(Duration::from_millis(5)).await;
                let window = NudgeWindow::arm(exec_id);
                // A long poll from here on: this loop takes nothing from its injector.
                window.wait_entered();
                let waker = std::thread::spawn(move || tx.send(()).unwrap());
                hold_until(|| done.load(SeqCst));
                waker.join().unwrap();
                let (shard, parks) = sleeper.await.unwrap();
                (window, shard, parks)
            })
            .unwrap();
        window.assert_stolen_at_once("the woken task", shard, parks_at_run);
    }

    /// Steal rule 3 when a spawn's ping outruns its task: the spawner pings the loops parked
    /// without a tick (rule 4) before it queues the task, so a thief the ping woke can look
    /// at its victims before the task is there. That first look found nothing and spent the
    /// waiver; the task, below `min_tasks_to_steal`, then waited for the starvation override
    /// (16 idle ticks). CI saw it once (`tests/steal.rs`, `a_spawn_ping_still_waives_...`,
    /// under load). Here the spawner is held in that window until the thief has looked and
    /// come back to its park decision; counted in parks, not timed.
    #[test]
    fn a_spawn_ping_that_outruns_its_task_keeps_the_thiefs_waiver() {
        use std::sync::{
            atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
            Arc,
        };
        let (exec, exec_id) = two_shards(|b| b.min_tasks_to_steal(1000));
        let h = exec.handle();
        // Shard 1's park count as it decided to park before the spawn, and as the child ran.
        let first = Arc::new(AtomicU64::new(u64::MAX));
        let back = Arc::new(AtomicBool::new(false));
        // The child is queued: shard 1's look after its empty one waits for it, so a spawner
        // descheduled for longer than the idle tick does not spend the kept waiver on a
        // second empty look (the waiver lasts one look).
        let queued = Arc::new(AtomicBool::new(false));
        let (f, b, q) = (first.clone(), back.clone(), queued.clone());
        arm((
            exec_id,
            1,
            Box::new(move |core: &super::Core| {
                f.store(core.shared.stats.parks.load(SeqCst), SeqCst);
                // Its next park decision: after the ping woke it and it looked.
                arm((
                    core.shared.exec_id,
                    1,
                    Box::new(move |core: &super::Core| {
                        arm_at(
                            At::Steal,
                            (
                                core.shared.exec_id,
                                1,
                                Box::new(move |_: &super::Core| {
                                    assert!(hold_until(|| q.load(SeqCst)), "never queued");
                                }),
                            ),
                        );
                        b.store(true, SeqCst)
                    }),
                ));
            }),
        ));
        let (shard, parks_at_run, before) = exec
            .block_on(move || async move {
                // Shard 1 asleep in the park it decided on (parked without a tick: no
                // migratable task exists yet).
                let asleep = || {
                    let p = first.load(SeqCst);
                    p != u64::MAX && h.loop_stats(1).unwrap().parks > p
                };
                assert!(hold_until(asleep), "shard 1 never parked");
                let back2 = back.clone();
                crate::steal::arm_after_spawn_counted(
                    exec_id,
                    Box::new(move || {
                        // The ping went out; the task is not queued yet.
                        assert!(
                            hold_until(|| back2.load(SeqCst)),
                            "the ping did not wake shard 1"
                        );
                    }),
                );
                let ran = Arc::new(AtomicBool::new(false));
                let (r, hh) = (ran.clone(), h.clone());
                let child = crate::spawn(async move {
                    r.store(true, SeqCst);
                    (crate::shard::id(), hh.loop_stats(1).unwrap().parks)
                });
                queued.store(true, SeqCst);
                // Shard 0 stays busy (it would run the child itself when it awaits it).
                hold_until(|| ran.load(SeqCst));
                let (shard, parks) = child.await.unwrap();
                (shard, parks, first.load(SeqCst))
            })
            .unwrap();
        assert_eq!(shard, 1, "shard 1 never stole the child");
        // The park the ping ended, then at most the idle tick it parked on after its empty look.
        assert!(
            parks_at_run - before <= 2,
            "shard 1 parked {} times before it stole the child: its waiver was spent on the \
             empty look",
            parks_at_run - before
        );
    }

    /// Steal rule 3: a park decision that does not look (rule 2: the loop owns a timer and a
    /// parked task, eager rebalance off) ends a kept waiver. It lasted until the loop next
    /// looked, however much later, and that look stole below `min_tasks_to_steal` on a wake
    /// long gone. Shard 1 keeps a waiver at one decision while its task sleeps (as a thief
    /// whose look after a work ping found nothing does), is woken by pinned work, and the
    /// waiver is read at its next decision, the timer still pending.
    #[test]
    fn a_park_decision_that_does_not_look_ends_a_kept_waiver() {
        use std::sync::{
            atomic::{AtomicU8, Ordering::SeqCst},
            Arc,
        };
        let (exec, exec_id) = two_shards(|b| b.min_tasks_to_steal(1000));
        let h = exec.handle();
        // 0: not yet; 1: kept at the first decision; 2 / 3: the second decision read it
        // kept / gone.
        let state = Arc::new(AtomicU8::new(0));
        let s = state.clone();
        let seen = exec
            .block_on(move || async move {
                let sleeper = h
                    .spawn_on(1, move || async move {
                        arm((
                            exec_id,
                            1,
                            Box::new(move |core: &super::Core| {
                                assert!(!crate::steal::would_steal(core), "the sleeper is parked");
                                let mut w = core.waiver.get();
                                w.begin(true);
                                w.end(false);
                                core.waiver.set(w);
                                s.store(1, SeqCst);
                                arm((
                                    exec_id,
                                    1,
                                    Box::new(move |core: &super::Core| {
                                        assert!(!crate::steal::would_steal(core));
                                        let kept = core.waiver.get().begin(false);
                                        s.store(if kept { 2 } else { 3 }, SeqCst);
                                    }),
                                ));
                            }),
                        ));
                        crate::time::sleep(std::time::Duration::from_secs(2)).await;
                    })
                    .unwrap();
                // Awaited, not held: the spawn's ring ping leaves at the end of this turn.
                let until = |at_least: u8| {
                    let state = state.clone();
                    async move {
                        for _ in 0..10_000 {
                            if state.load(SeqCst) >= at_least {
                                return true;
                            }
                            crate::time::sleep(std::time::Duration::from_millis(1)).await;
                        }
                        false
                    }
                };
                assert!(until(1).await, "no first decision");
                // Pinned work wakes shard 1; its next decision still owns the sleeper.
                h.spawn_on(1, || async {}).unwrap().await.unwrap();
                assert!(until(2).await, "no second decision");
                let seen = state.load(SeqCst);
                sleeper.abort();
                let _ = sleeper.await;
                seen
            })
            .unwrap();
        assert_eq!(
            seen, 3,
            "the waiver outlived a park decision that did not look"
        );
    }

    /// A 2-shard executor with steal backoff on, and its id (for [`arm`]).
    fn backoff_executor() -> (Executor, u64) {
        two_shards(|b| b.steal_backoff(true))
    }

    /// From a task on shard 0: a migratable task alive and parked on shard 0's timer, so that
    /// shard 1, owning nothing, parks on an idle tick (steal rule 4). Spawned on shard 0, it
    /// may be stolen by shard 1 before shard 0 runs it (the spawn pings idle loops; on a loaded
    /// machine shard 0's thread may wait meanwhile), and on shard 1 its timer made that loop
    /// park without an idle tick: the tests using it failed now and then under CI's parallel
    /// tests. Such a keeper is aborted and another spawned.
    async fn keeper_on_shard_0() -> crate::JoinHandle<()> {
        use std::sync::{
            atomic::{AtomicUsize, Ordering::SeqCst},
            Arc,
        };
        for _ in 0..100 {
            let at = Arc::new(AtomicUsize::new(usize::MAX));
            let a = at.clone();
            let keeper = crate::spawn(async move {
                a.store(crate::shard::id(), SeqCst);
                crate::time::sleep(std::time::Duration::from_secs(3600)).await;
            });
            wait_until(|| at.load(SeqCst) != usize::MAX).await;
            if at.load(SeqCst) == 0 {
                return keeper;
            }
            keeper.abort();
        }
        panic!("every keeper of 100 was stolen by shard 1 before shard 0 ran it");
    }

    /// Sleeps 5 ms at a time until `done()`, or for at most 10 s (a hang guard; the caller's
    /// assertions say what was missed).
    async fn wait_until(done: impl Fn() -> bool) {
        let t0 = std::time::Instant::now();
        while !done() && t0.elapsed() < std::time::Duration::from_secs(10) {
            crate::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// A steal knob changed while a loop decides its park: `set_steal_backoff(false)` lands
    /// after the loop picked its idle tick (grown by backoff) and before it announces its
    /// sleep, which swaps the knob's wake away. The recheck looked for a tick only where the
    /// loop had none, so the loop slept out its old tick (up to 32 ms) before the knob took
    /// effect. Counted by parks, not timed: the next park decision must come without a park.
    #[test]
    fn a_knob_changed_before_the_announcement_redecides_the_idle_tick() {
        use std::{
            sync::{
                atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
                Arc, Mutex,
            },
            time::Duration,
        };
        let (exec, exec_id) = backoff_executor();
        let h = exec.handle();
        // Shard 1's parks at the first and second hooked decisions, and its tick at the first.
        let (first, second) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let tick_then = Arc::new(Mutex::new(None));
        let done = Arc::new(AtomicBool::new(false));
        let (f, s, t, d) = (
            first.clone(),
            second.clone(),
            tick_then.clone(),
            done.clone(),
        );
        exec.block_on(move || async move {
            // A migratable task alive (parked on shard 0's timer): shard 1 parks on an idle
            // tick, which backoff grows while nothing is found.
            let keeper = keeper_on_shard_0().await;
            wait_until(|| h.loop_stats(1).unwrap().parks >= 12).await;
            let hh = h.clone();
            arm((
                exec_id,
                1,
                Box::new(move |core: &super::Core| {
                    *t.lock().unwrap() = crate::steal::idle_tick(core);
                    f.store(core.shared.stats.parks.load(SeqCst), SeqCst);
                    hh.set_steal_backoff(false);
                    arm((
                        exec_id,
                        1,
                        Box::new(move |core: &super::Core| {
                            s.store(core.shared.stats.parks.load(SeqCst), SeqCst);
                            d.store(true, SeqCst);
                        }),
                    ));
                }),
            ));
            wait_until(|| done.load(SeqCst)).await;
            keeper.abort();
        })
        .unwrap();
        let tick = tick_then
            .lock()
            .unwrap()
            .expect("shard 1 parked without an idle tick");
        assert!(
            tick > Duration::from_millis(1),
            "backoff had not grown shard 1's tick yet ({tick:?})"
        );
        assert_eq!(
            second.load(SeqCst),
            first.load(SeqCst),
            "shard 1 slept out its old {tick:?} tick before re-reading the knob"
        );
    }

    /// xtc_exec(3)'s steal backoff: an idle worker's poll timeout grows "from 1 ms toward a
    /// 32 ms cap" and "any real work resets it immediately". Read at two park decisions of
    /// shard 1 (ticking while a migratable task sleeps): after many empty ticks the tick is the
    /// cap, not more; after a pinned task ran there, the next decision's tick is 1 ms again.
    #[test]
    fn steal_backoff_caps_the_idle_tick_at_32_ms_and_work_resets_it() {
        use std::{
            sync::{
                atomic::{AtomicBool, Ordering::SeqCst},
                Arc, Mutex,
            },
            time::Duration,
        };
        let (exec, exec_id) = backoff_executor();
        let h = exec.handle();
        // Shard 1's idle tick at a park decision after many empty ticks, then at the first
        // park decision after it ran a task.
        let (grown, after_work) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
        let (g, a) = (grown.clone(), after_work.clone());
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        exec.block_on(move || async move {
            let keeper = keeper_on_shard_0().await;
            // 1, 1, 1, 1, 2, 4, 8, 16, 32, 32, ...: well past the cap after 16 parks.
            wait_until(|| h.loop_stats(1).unwrap().parks >= 16).await;
            let seen = Arc::new(AtomicBool::new(false));
            let s = seen.clone();
            arm((
                exec_id,
                1,
                Box::new(move |core: &super::Core| {
                    *g.lock().unwrap() = Some(crate::steal::idle_tick(core));
                    s.store(true, SeqCst);
                }),
            ));
            wait_until(|| seen.load(SeqCst)).await;
            // Real work on shard 1: the task arms the hook for the park decision that ends
            // the turn it ran in.
            h.spawn_on(1, move || async move {
                arm((
                    exec_id,
                    1,
                    Box::new(move |core: &super::Core| {
                        *a.lock().unwrap() = Some(crate::steal::idle_tick(core));
                        d.store(true, SeqCst);
                    }),
                ));
            })
            .unwrap()
            .await
            .unwrap();
            wait_until(|| done.load(SeqCst)).await;
            keeper.abort();
        })
        .unwrap();
        let grown = grown.lock().unwrap().expect("shard 1 never decided a park");
        assert_eq!(
            grown,
            Some(Duration::from_millis(32)),
            "after 16 empty ticks the idle tick is the 32 ms cap"
        );
        let after = after_work
            .lock()
            .unwrap()
            .expect("shard 1 never parked after its work");
        assert_eq!(
            after,
            Some(Duration::from_millis(1)),
            "work did not reset the backed-off idle tick"
        );
    }

    /// A migratable task queued from a plain thread lands in the loop's injector, with a wake
    /// ping only for a loop that announced sleep: a spinning loop must see it itself. The spin
    /// (a reply spin or spin-before-park, up to 1 s) looked at the inbox, the rings and the
    /// I/O driver only, so the task waited out the whole spin.
    #[test]
    fn a_spin_ends_when_a_plain_thread_queues_a_migratable_task() {
        let exec = Executor::builder()
            .shards(1)
            .oversubscribe(true)
            .build()
            .unwrap();
        let h = exec.handle();
        let seen = exec
            .block_on(move || async move {
                let task = std::thread::spawn(move || h.spawn(async {}))
                    .join()
                    .unwrap();
                let seen = with_core(|c| super::spin_for_work(c, MAX_SPIN_BEFORE_PARK)).unwrap();
                task.await.unwrap();
                seen
            })
            .unwrap();
        assert!(seen, "the spin did not see the queued task");
    }

    /// A one-shard executor on `driver`.
    fn one_shard_on(driver: crate::io::DriverChoice) -> Executor {
        Executor::builder()
            .shards(1)
            .oversubscribe(true)
            .io_driver(driver)
            .build()
            .unwrap()
    }

    /// Shutdown's wait ends on a wake ping on either driver. On io_uring the driver keeps a
    /// read of the ping's eventfd in the kernel, which takes a ping written after the
    /// announcement as soon as the loop's thread leaves a system call (completion work runs
    /// then): a plain wait on the eventfd then saw nothing and ran its full timeout (1 ms a
    /// pass at shutdown; here 5 s, and the test fails) with the ping reaped by nobody.
    #[test]
    fn the_stopping_wait_ends_on_a_ping_the_driver_took() {
        for driver in [
            crate::io::DriverChoice::Epoll,
            crate::io::DriverChoice::Auto,
        ] {
            let exec = one_shard_on(driver);
            let pinged = exec
                .block_on(|| async {
                    with_core(|c| {
                        // The ping's read in the kernel, as after any park of the loop.
                        let _ = c.io.park(Some(std::time::Duration::ZERO), &|_| false);
                        c.shared.parker.announce();
                        // A sender's ping: on io_uring the read takes it as this call returns.
                        assert!(c.shared.parker.unpark());
                        super::stopping_sleep(c, std::time::Duration::from_secs(5))
                    })
                    .unwrap()
                })
                .unwrap();
            assert!(pinged, "{driver:?}: the wait missed the ping");
        }
    }

    /// A plain thread's spawn raises the count of live migratable tasks from zero and pings
    /// every loop for new work (steal rule 4), marking each loop's `work_ping`; the ping
    /// reaches only loops that announced sleep. A loop that would steal and spins meanwhile
    /// must see the mark itself: the spin (a reply spin or spin-before-park, up to 1 s) did
    /// not look at it, so the work queued at its victim waited out the whole spin.
    #[test]
    fn a_spin_ends_when_a_spawn_pings_for_migratable_work() {
        let exec = Executor::builder()
            .shards(2)
            .oversubscribe(true)
            .build()
            .unwrap();
        let h = exec.handle();
        let seen = exec
            .block_on(move || async move {
                crate::shard::submit_to(1, move || async move {
                    // The first `Handle::spawn` goes to loop 0's injector (round robin from
                    // 0): a victim's queue, which this loop's spin does not watch.
                    let task = std::thread::spawn(move || h.spawn(async {}))
                        .join()
                        .unwrap();
                    let seen = with_core(|c| {
                        assert!(!super::steal::has_local(c), "the task was queued here");
                        assert!(super::steal::would_steal(c));
                        super::spin_for_work(c, MAX_SPIN_BEFORE_PARK)
                    })
                    .unwrap();
                    task.await.unwrap();
                    seen
                })
                .await
                .unwrap()
            })
            .unwrap();
        assert!(seen, "the spin did not see the ping for migratable work");
    }

    /// Eager rebalance's nudge goes to the nearest idle peer that may steal: a loop spinning
    /// before it parks (spin-before-park or the reply spin, up to 1 s) is idle, but its status
    /// still reads BUSY, so the nudge passed it over, and its spin, which watches its own
    /// queues and its `work_ping` only, never saw the work queued at its victim: with no other
    /// peer, nobody was nudged, and the work waited out the whole spin (and an idle tick).
    #[test]
    fn a_spin_ends_when_eager_rebalance_nudges_the_spinning_loop() {
        use std::{
            sync::{
                atomic::{AtomicBool, Ordering::SeqCst},
                Arc,
            },
            time::{Duration, Instant},
        };
        // A spin that ends before the spawner saw it begin (it found other work: a wake or a
        // ping left from the set-up on a loaded machine) checks nothing: tried again.
        for attempt in 0.. {
            assert!(attempt < 5, "shard 1's spin never lasted until the spawn");
            let (exec, _) = two_shards(|b| b.eager_rebalance(true));
            let h = exec.handle();
            let out = exec
                .block_on(move || async move {
                    // A migratable task alive: the child's spawn below raises the live count
                    // from one, which pings nobody (a count rising from zero pings every loop).
                    let keeper = keeper_on_shard_0().await;
                    crate::time::sleep(Duration::from_millis(5)).await;
                    let hh = h.clone();
                    let out = crate::shard::submit_to(1, move || async move {
                        let spin_over = Arc::new(AtomicBool::new(false));
                        let over = spin_over.clone();
                        let spawner = std::thread::spawn(move || {
                            // Once shard 1 spins: shard 0 queues a migratable task on its own
                            // deque, and its turn's end nudges an idle peer.
                            let limit = Instant::now() + Duration::from_secs(60);
                            loop {
                                if hh.shared.loops[1].steal.spinning.load(SeqCst) {
                                    break;
                                }
                                if over.load(SeqCst) {
                                    return None;
                                }
                                assert!(Instant::now() < limit, "shard 1 never spun");
                                std::thread::yield_now();
                            }
                            Some(
                                hh.spawn_on(0, || async {
                                    crate::spawn(async {}).await.unwrap();
                                })
                                .unwrap(),
                            )
                        });
                        let (seen, diag) = with_core(|c| {
                            assert!(super::steal::would_steal(c));
                            // Nothing queued at the victim before the spin (a keeper aborted
                            // on a loaded machine leaves its cancel queued there for a
                            // moment): the spin would end at once on it.
                            let victim = &c.exec.loops[0].steal;
                            assert!(
                                hold_until(|| victim.stealer.len() + victim.injector.len() == 0),
                                "shard 0's queues never emptied"
                            );
                            let diag = format!(
                                "before the spin: nudged_before_spin {} inbox {} completions {} \
                                 local {} work_pinged {}",
                                super::steal::nudged_before_spin(c),
                                c.shared.inbox.is_pending(),
                                c.io.has_completions(),
                                super::steal::has_local(c),
                                super::steal::work_pinged(c),
                            );
                            // Longer than any real spin: the nudge comes from another
                            // thread (shard 0, woken by the spawner thread's spawn), which a
                            // loaded machine can hold off a CPU for most of a second. A spin
                            // that missed the nudge runs to its end either way.
                            (super::spin_for_work(c, Duration::from_secs(10)), diag)
                        })
                        .unwrap();
                        spin_over.store(true, SeqCst);
                        match spawner.join().unwrap() {
                            Some(j) => {
                                j.await.unwrap();
                                Some(seen)
                            }
                            None => {
                                eprintln!("spin ended before the spawn ({seen}); {diag}");
                                None
                            }
                        }
                    })
                    .await
                    .unwrap();
                    keeper.abort();
                    out
                })
                .unwrap();
            if let Some(seen) = out {
                assert!(
                    seen,
                    "the spinning loop was not nudged for the migratable work"
                );
                return;
            }
        }
    }

    /// The nudge comes at the end of the turn that queued the work; a loop whose spin began in
    /// between (its flag still down when the turn queued, so a nudger reading it then would
    /// pass it over) must see that work as its spin begins, not when a nudge comes: here the
    /// spawning turn holds its loop until the spin returns (or 30 s: shard 1's thread, which
    /// must reach the spin and return from it meanwhile, may be slow to run on a loaded
    /// machine), and the spin, which watched only `work_ping`, waited for that turn's end.
    #[test]
    fn a_spin_beginning_after_migratable_work_was_queued_sees_it() {
        use std::{
            sync::{
                atomic::{AtomicBool, Ordering::SeqCst},
                Arc,
            },
            time::{Duration, Instant},
        };
        let (exec, _) = two_shards(|b| b.eager_rebalance(true));
        let h = exec.handle();
        let (spin_ok, turn_ended_first) = exec
            .block_on(move || async move {
                // Alive throughout: the spawn below raises the live count from one, which
                // pings nobody (a count rising from zero pings every loop).
                let keeper = keeper_on_shard_0().await;
                crate::time::sleep(Duration::from_millis(5)).await;
                let (queued, spun) = (
                    Arc::new(AtomicBool::new(false)),
                    Arc::new(AtomicBool::new(false)),
                );
                let (q, s) = (queued.clone(), spun.clone());
                // Shard 0 queues a migratable task on its deque, then holds its turn.
                let holder = h
                    .spawn_on(0, move || async move {
                        let child = crate::spawn(async {});
                        q.store(true, SeqCst);
                        let limit = Instant::now() + Duration::from_secs(30);
                        while !s.load(SeqCst) && Instant::now() < limit {
                            std::thread::yield_now();
                        }
                        let ended_first = !s.load(SeqCst);
                        child.await.unwrap();
                        ended_first
                    })
                    .unwrap();
                let seen = crate::shard::submit_to(1, move || async move {
                    let limit = Instant::now() + Duration::from_secs(60);
                    while !queued.load(SeqCst) {
                        assert!(Instant::now() < limit, "shard 0 never queued its task");
                        std::thread::yield_now();
                    }
                    let seen = with_core(|c| super::spin_for_work(c, MAX_SPIN_BEFORE_PARK));
                    spun.store(true, SeqCst);
                    seen.unwrap()
                })
                .await
                .unwrap();
                let ended_first = holder.await.unwrap();
                keeper.abort();
                (seen, ended_first)
            })
            .unwrap();
        assert!(spin_ok, "the spin did not end on the queued work");
        assert!(
            !turn_ended_first,
            "the spin saw the work only once the spawning turn ended (its nudge)"
        );
    }

    /// A task waits for room in a full ring (ring rule 3) while its loop spins: the consumer's
    /// drain tells the producer through `want_space`, whose ping reaches only a loop that
    /// announced sleep, so the spin must see the room itself. It waited out the whole spin.
    #[test]
    fn a_spin_ends_when_a_full_ring_a_task_waits_on_gets_room() {
        use std::sync::{
            atomic::{AtomicBool, Ordering::SeqCst},
            Arc,
        };
        let exec = Executor::builder()
            .shards(2)
            .oversubscribe(true)
            .ring_capacity(1)
            .build()
            .unwrap();
        let h = exec.handle();
        let seen = exec
            .block_on(move || async move {
                // Shard 1 is held in a poll, so the ring to it stays full.
                let (started, release) = (
                    Arc::new(AtomicBool::new(false)),
                    Arc::new(AtomicBool::new(false)),
                );
                let (s, r) = (started.clone(), release.clone());
                crate::shard::send_to(1, move || async move {
                    s.store(true, SeqCst);
                    while !r.load(SeqCst) {
                        std::thread::yield_now();
                    }
                })
                .await
                .unwrap();
                while !started.load(SeqCst) {
                    crate::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                crate::shard::send_to(1, || async {}).await.unwrap();
                // A sender waiting for room (the ring's one slot is taken).
                let sender = crate::shard::spawn_local(async {
                    crate::shard::send_to(1, || async {}).await.unwrap();
                });
                crate::yield_now().await;
                assert_eq!(h.loop_stats(0).unwrap().ring_full_waits, 1);
                release.store(true, SeqCst);
                // Shard 1 drains the ring (room for the sender), then we spin.
                let limit = std::time::Instant::now() + std::time::Duration::from_secs(60);
                while h.loop_stats(1).unwrap().messages_received < 2 {
                    assert!(std::time::Instant::now() < limit, "shard 1 did not drain");
                    std::thread::yield_now();
                }
                let seen = with_core(|c| super::spin_for_work(c, MAX_SPIN_BEFORE_PARK)).unwrap();
                sender.await.unwrap();
                seen
            })
            .unwrap();
        assert!(seen, "the spin did not see the room in the ring");
    }

    /// A socket a task waits on becomes readable while its loop spins: the spin ends (on
    /// either driver), as it does for a ring message. On epoll it looked at io_uring's
    /// completion queue only, so readiness waited out the whole spin (up to 1 s).
    #[test]
    fn a_spin_ends_when_a_socket_a_task_waits_on_becomes_ready() {
        use std::io::Write;
        for driver in [
            crate::io::DriverChoice::Epoll,
            crate::io::DriverChoice::Auto,
        ] {
            let exec = one_shard_on(driver);
            let seen = exec
                .block_on(|| async {
                    let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
                    let a = crate::net::UnixStream::from_std(a).unwrap();
                    let reader = crate::shard::spawn_local(async move {
                        let (n, _) = a.read(vec![0u8; 8]).await;
                        n.unwrap()
                    });
                    // The reader runs first and waits for data.
                    crate::yield_now().await;
                    b.write_all(b"x").unwrap();
                    let seen = with_core(|c| {
                        // As the loop does at the end of a turn that worked, before it spins.
                        c.io.submit();
                        super::spin_for_work(c, MAX_SPIN_BEFORE_PARK)
                    })
                    .unwrap();
                    assert_eq!(reader.await.unwrap(), 1);
                    seen
                })
                .unwrap();
            assert!(seen, "{driver:?}: the spin did not see the socket's data");
        }
    }

    /// A task woken from a plain thread while its loop, which had published its idle status,
    /// is held off its CPU for longer than the deadlock grace (the hook stands for the OS not
    /// running that thread: it holds the loop until the coordinator decides, or 2 s), is no
    /// deadlock. A pinned task's wake sits in the inbox, pushed > popped; a migratable task's
    /// sits in the injector, which the snapshots compared only for equality, so the
    /// coordinator reported the runnable task as deadlocked and dropped it.
    fn held_loop_with_a_woken_task(migratable: bool) -> (crate::Result<()>, bool) {
        use std::{
            sync::{
                atomic::{AtomicBool, Ordering::SeqCst},
                Arc,
            },
            task::Poll,
            time::Duration,
        };
        let (exec, exec_id) = two_shards(|b| {
            b.stealing(false)
                .deadlock_grace(Some(Duration::from_millis(50)))
        });
        let held = Arc::new(AtomicBool::new(false));
        let woken = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<std::task::Waker>();
        let (h2, w2, d2) = (held.clone(), woken.clone(), done.clone());
        let body = async move {
            let mut first = true;
            std::future::poll_fn(move |cx| {
                if w2.load(SeqCst) {
                    return Poll::Ready(());
                }
                if first {
                    first = false;
                    let h = h2.clone();
                    arm_at(
                        At::Announce,
                        (
                            exec_id,
                            crate::shard::id(),
                            Box::new(move |core: &super::Core| {
                                h.store(true, SeqCst);
                                let t = std::time::Instant::now();
                                while !core.exec.stop_requested()
                                    && t.elapsed() < Duration::from_secs(2)
                                {
                                    std::thread::sleep(Duration::from_millis(1));
                                }
                            }),
                        ),
                    );
                    tx.send(cx.waker().clone()).unwrap();
                }
                Poll::Pending
            })
            .await;
            d2.store(true, SeqCst);
        };
        let _join = if migratable {
            exec.spawn(body)
        } else {
            exec.spawn_on(0, move || body).unwrap()
        };
        let waker_thread = std::thread::spawn(move || {
            let w = rx.recv().unwrap();
            assert!(hold_until(|| held.load(SeqCst)), "the loop never parked");
            woken.store(true, SeqCst);
            w.wake();
        });
        let r = exec.run();
        waker_thread.join().unwrap();
        (r, done.load(SeqCst))
    }

    #[test]
    fn a_task_woken_on_a_loop_held_after_it_showed_idle_is_no_deadlock() {
        for migratable in [false, true] {
            let (r, done) = held_loop_with_a_woken_task(migratable);
            assert!(
                r.is_ok() && done,
                "migratable {migratable}: {r:?}, done: {done}"
            );
        }
    }
}
