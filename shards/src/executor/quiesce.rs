//! Exact quiescence and the deadlock report (invariant 8 in the crate docs), without a shared
//! counter on the spawn path.
//!
//! # Termination detection
//!
//! Each loop publishes `status = epoch << 2 | kind` (SeqCst) before it parks, and
//! `epoch + 1 | BUSY` when it wakes, before it drains its inbox (after an idle tick that found
//! nothing, the loop keeps its idle word and publishes `BUSY` just before it runs work). Two
//! takes come before `BUSY` on that path, and only queue tasks: a ring drain (every ring
//! message is a `Runnable`, queued, never handled inside the drain; its received count is
//! published at the end of that turn) and a steal (into the thief's deque, which a shutdown
//! at a quiescent stop keeps for the next run). A steal holds what it took outside every
//! queue for a moment (crossbeam's `steal_batch_and_pop` hands the task back before the
//! thief pushes it), so the thief raises `StealShared::stealing` around it and a snapshot
//! counts that as queued: a thief held off its CPU there made a woken task read as parked,
//! reported as a deadlock and dropped, under a short grace. A message can reach a ring only from a loop
//! that left idle through `BUSY`, or one that is `WAITING`, so a snapshot misses no sender.
//! Handling a ring message inside the drain, or dropping the deque at a quiescent stop, would
//! break this argument. `kind` is `EMPTY` (no live
//! task, no timer), `PARKED` (live tasks, none runnable, no timer) or `WAITING` (something will
//! wake it: a pending timer, I/O or a blocking-pool job in flight, a ring backlog, a task
//! waiting for ring space, which the consumer's drain pings without any count moving). Each inbox
//! counts messages pushed (before the push) and popped; each ring counts messages sent and
//! received.
//!
//! The coordinator (the thread in `run()`) takes a snapshot of every loop's status and inbox
//! counts, then a second one. The executor is **quiescent** when both snapshots are equal, every
//! loop is `EMPTY`, every inbox has popped all it was pushed, every ring has received all it
//! was sent, and no migratable task is alive (the live count of steal/mod.rs rule 5, which
//! covers tasks in deques and injectors). Why that is exact: a loop that
//! did anything between the two reads of its status has a new epoch, so equal snapshots mean no
//! loop ran in between; a message pushed before the first read shows up as pushed > popped; one
//! pushed after it is a fresh spawn from a foreign thread racing with the end of `run()`, which
//! stays in the inbox for the next `run()` (it is not lost). Work moves between loops only through
//! inboxes, rings (counted the same way) and the migratable deques and injectors (covered by
//! the live count), so no task can be in flight unseen.
//!
//! # Who pokes
//!
//! A loop that publishes `EMPTY` pokes the coordinator only if every other loop is already
//! `EMPTY` (a Dekker pair over the SeqCst status words, so the last loop to go `EMPTY` always
//! pokes) and service mode is off. Quiescence needs every loop `EMPTY`, and a `PARKED` or
//! `WAITING` loop becomes `EMPTY` only by running a turn and publishing `EMPTY` itself, which
//! makes it the one to poke; a poke while another loop is `PARKED` could only start a deadlock
//! check, and those come from the periodic poll below. Poking then would wake the coordinator
//! thread at every idle moment of a conversation between a loop with a parked task and an
//! empty one: once per `submit_to` round trip to a parked target (measured: 39,688 coordinator
//! wake-ups in 40,000 round trips before, 10 after). In service mode the coordinator checks
//! nothing, so no loop pokes it; switching service mode off pokes it once.
//!
//! # Deadlock
//!
//! If two equal snapshots show every loop `EMPTY` or `PARKED`, balanced inboxes and rings, no
//! task queued in any loop's injector or deque (a loop shows idle only after it took its own
//! queued work, so a queued task is about to run: woken, or stolen, while its loop was held off
//! its CPU), and
//! at least one `PARKED` loop or a live migratable task (a loop's status counts only its
//! pinned tasks), nothing inside the executor can wake the parked tasks. The coordinator checks again
//! after the grace period (a task may wait on a foreign thread); if no epoch or count moved it
//! stops the executor and `run()` returns [`Error::Deadlock`](crate::Error::Deadlock) naming
//! each task. A foreign wake of a pinned task moves its loop's inbox count; one of a migratable
//! task moves its loop's injector count (`StealShared::injected`, counted before the push), so
//! a wake that comes between the snapshots or before the decision takes it back, whether or not
//! the woken loop has published its new epoch yet, and one that came before the first snapshot
//! leaves the task queued, which reads as busy.
//! The coordinator polls for this every `grace / 2`, at least 1 ms and at most 1 s: deadlocks
//! need no prompt answer.
//! In service mode it does not poll at all; switching service mode or the grace period pokes it.

use std::time::{Duration, Instant};

use super::ExecShared;
use crate::{
    event_loop::status,
    sync::{lock, Ordering::SeqCst},
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Per loop: status, inbox pushed, inbox popped.
    loops: Vec<(u64, u64, u64)>,
    /// Ring messages sent and received, summed over loops.
    ring: (u64, u64),
    /// Live migratable tasks (steal/mod.rs rule 5).
    migratable: i64,
    /// Migratable tasks queued into the loops' injectors from off the loops (a foreign wake or
    /// spawn), summed over loops: such a wake moves no other count, so without it a task woken
    /// while the coordinator closed on a deadlock verdict was reported and dropped.
    injected: u64,
    /// Whether some loop's injector or deque holds a task. A loop that shows idle takes its
    /// own queued tasks before it sleeps, so a queued one means it is about to run (woken,
    /// or stolen, while that loop's thread was off its CPU): a migratable task woken from
    /// off the loops leaves no other trace the snapshots compare but `injected`, and a loop
    /// held off its CPU for the whole grace after it published idle made two equal snapshots
    /// of a runnable task, reported as a deadlock and dropped. (A pinned task's wake keeps
    /// its inbox unbalanced meanwhile.)
    queued: bool,
}

impl Snapshot {
    pub(crate) fn take(exec: &ExecShared) -> Snapshot {
        let mut ring = (0, 0);
        let mut injected = 0;
        let mut queued = false;
        let loops = exec
            .loops
            .iter()
            .map(|l| {
                // Status first: counts published before it are visible after it (SeqCst).
                let st = l.status.load(SeqCst);
                let (pushed, popped) = l.inbox.counts();
                injected += l.steal.injected.load(SeqCst);
                queued |= l.steal.stealing.load(SeqCst)
                    || !l.steal.injector.is_empty()
                    || !l.steal.stealer.is_empty();
                ring.1 += l.stats.messages_received.load(SeqCst);
                // Sent over a ring, less what a shutdown took out of the mesh unreceived
                // (saturating: the two are published one after the other, and a mixed read
                // only makes this snapshot unbalanced).
                ring.0 += l
                    .stats
                    .messages_sent
                    .load(SeqCst)
                    .saturating_sub(l.stats.messages_handed_over.load(SeqCst));
                (st, pushed, popped)
            })
            .collect();
        let migratable = exec.migratable.live.load(SeqCst);
        Snapshot {
            loops,
            ring,
            migratable,
            injected,
            queued,
        }
    }

    fn balanced(&self) -> bool {
        self.ring.0 == self.ring.1
            && !self.queued
            && self
                .loops
                .iter()
                .all(|&(_, pushed, popped)| pushed == popped)
    }

    fn all(&self, ok: impl Fn(u64) -> bool) -> bool {
        self.loops.iter().all(|&(st, _, _)| ok(status::kind(st)))
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Busy,
    Quiescent(Snapshot),
    MaybeDeadlocked(Snapshot),
}

pub(crate) fn check(exec: &ExecShared) -> Verdict {
    let a = Snapshot::take(exec);
    if !a.balanced() || !a.all(|k| k == status::EMPTY || k == status::PARKED) {
        return Verdict::Busy;
    }
    let b = Snapshot::take(exec);
    if a != b {
        return Verdict::Busy;
    }
    if a.migratable <= 0 && a.all(|k| k == status::EMPTY) {
        Verdict::Quiescent(a)
    } else {
        Verdict::MaybeDeadlocked(a)
    }
}

/// The coordinator: runs on the thread that called `run()` until the executor stops.
pub(crate) fn coordinate(exec: &ExecShared) {
    let mut suspect: Option<(Snapshot, Instant)> = None;
    loop {
        let grace = exec.deadlock_grace();
        // Service mode checks nothing, so it waits for a poke alone (a stop, or service mode
        // switched off): an idle service costs no periodic wake-up of this thread.
        let period = grace
            .filter(|_| !exec.service_mode())
            .map(|g| (g / 2).clamp(Duration::from_millis(1), Duration::from_secs(1)));
        {
            let mut dirty = lock(&exec.coord_dirty);
            while !*dirty && !exec.stop_requested() {
                match period {
                    None => dirty = exec.coord_cv.wait(dirty).unwrap_or_else(|p| p.into_inner()),
                    Some(p) => {
                        let (d, res) = exec
                            .coord_cv
                            .wait_timeout(dirty, p)
                            .unwrap_or_else(|p| p.into_inner());
                        dirty = d;
                        if res.timed_out() {
                            break;
                        }
                    }
                }
            }
            *dirty = false;
        }
        // `Acquire`: the stop's reason (`request_stop`, before the flag) comes before the
        // claim's drop clears it as `run()` returns, so no reason outlives its stop. In C11
        // the `SeqCst` order gives that already; loom sees it only through this edge
        // (`loom_run.rs`).
        if exec.stop.load(crate::sync::Ordering::Acquire) {
            return;
        }
        if exec.service_mode() {
            suspect = None;
            continue;
        }
        match check(exec) {
            Verdict::Busy => suspect = None,
            Verdict::Quiescent(seen) => {
                #[cfg(test)]
                if let Some(hook) = lock(&exec.before_closing).as_ref() {
                    (hook.0)();
                }
                if close(exec, &seen) {
                    return;
                }
            }
            Verdict::MaybeDeadlocked(snap) => {
                // Read again: the one read before the wait may be stale, and the setter's
                // poke that ended the wait promised a recheck with the new value.
                let Some(grace) = exec.deadlock_grace() else {
                    suspect = None;
                    continue;
                };
                match &suspect {
                    Some((s, since)) if *s == snap => {
                        if since.elapsed() >= grace {
                            #[cfg(test)]
                            if let Some(hook) = lock(&exec.before_deadlock_close).as_ref() {
                                (hook.0)();
                            }
                            // Closed as a quiescent stop is (`close`): a task woken from a
                            // foreign thread at this moment is not started and then dropped.
                            let applied = std::cell::Cell::new(grace);
                            let stopped = close_with(
                                &exec.closing,
                                // The grace switched off or raised since (its setter
                                // returned before this look) takes the verdict back too.
                                || {
                                    !exec.service_mode_now()
                                        && exec.deadlock_grace_now().is_some_and(|g| {
                                            applied.set(g);
                                            since.elapsed() >= g
                                        })
                                        && Snapshot::take(exec) == snap
                                },
                                || {
                                    exec.deadlock_grace_applied.store(
                                        applied.get().as_nanos().min(u64::MAX as u128) as u64,
                                        SeqCst,
                                    );
                                    // The migratable tasks are listed now, while they are
                                    // parked: the loops' shutdown can wake and drop some (a
                                    // dropped pinned future that held what one waited on)
                                    // before `run()` could list them. Each loop lists its
                                    // pinned tasks before its shutdown.
                                    let migratable = exec.migratable.describe();
                                    lock(&exec.deadlock_tasks).extend(migratable);
                                    exec.request_stop(super::StopReason::Deadlock);
                                },
                            );
                            if stopped {
                                return;
                            }
                            suspect = None;
                        }
                    }
                    _ => suspect = Some((snap, Instant::now())),
                }
            }
        }
    }
}

/// Closing: confirms a quiescent verdict and stops, or takes it back; `true` if it stopped.
///
/// Between the verdict's snapshots and the stop, a foreign thread can queue a task and wake a
/// loop, which would take the task and run it, only to drop it at the stop: a spawn that
/// raced the end of `run()` came back cancelled, instead of staying queued for the next run.
/// So: set `closing`, take a third snapshot, and stop only if nothing moved since `seen`;
/// otherwise clear `closing` and go on. A loop publishes its new epoch (leaving idle) and
/// then looks at `closing`, under its lock, before it runs any work (what it took before,
/// ring messages and steals, only queued tasks: see the module doc)
/// (`event_loop::Status::busy`); the coordinator sets `closing` under the lock and then reads
/// the epochs. The lock orders the two, so one side sees the other: the loop sees `closing`
/// and waits for the decision (taking nothing if it is a stop: the work stays queued), or the
/// coordinator sees the new epoch and takes the verdict back; a loop that looks after the
/// decision sees the stop flag (`loom_park.rs` checks all three).
fn close(exec: &ExecShared, seen: &Snapshot) -> bool {
    close_with(
        &exec.closing,
        // Service mode switched on since the verdict (its setter returned before this look)
        // takes the verdict back too: `run()` then waits for `stop()`.
        || !exec.service_mode_now() && Snapshot::take(exec) == *seen,
        || exec.request_stop(super::StopReason::Quiescent),
    )
}

/// The coordinator's closing flag, under a lock, and where a loop that saw it waits for the
/// decision.
#[derive(Debug, Default)]
pub(crate) struct Closing {
    /// Whether the coordinator is closing.
    flag: crate::sync::Mutex<bool>,
    decided: crate::sync::Condvar,
}

impl Closing {
    /// A loop leaving idle, after publishing its new epoch: if the coordinator is closing,
    /// waits until it decided. Returns whether it was closing. A lock rather than an atomic
    /// flag: the loop's store of its epoch and the coordinator's read of it need the two
    /// sides ordered, and a lock orders them (a store and a load of two atomics would need
    /// sequential consistency proper, which loom does not model). Cost: one uncontended lock
    /// and unlock, once per idle period.
    pub(crate) fn wait_if_closing(&self) -> bool {
        let mut closing = lock(&self.flag);
        let was = *closing;
        while *closing {
            closing = self
                .decided
                .wait(closing)
                .unwrap_or_else(|p| p.into_inner());
        }
        was
    }
}

/// [`close`]'s protocol (the part `loom_park.rs` checks): set the flag, `unchanged()` reads
/// the loops again, `stop()` stops them; the flag is cleared after the stop flag is set, and
/// waiting loops are woken, also when either closure unwinds (an xtc bug, or a `tracing`
/// subscriber that panics in a log line of the stop): left set, every loop the unwinding
/// coordinator then stopped waited for a decision for good, and `run()`, joining them,
/// hung instead of passing the panic on.
pub(crate) fn close_with(
    closing: &Closing,
    unchanged: impl FnOnce() -> bool,
    stop: impl FnOnce(),
) -> bool {
    /// Clears the flag and wakes the waiting loops when dropped, on unwind too.
    struct Decided<'a>(&'a Closing);
    impl Drop for Decided<'_> {
        fn drop(&mut self) {
            *lock(&self.0.flag) = false;
            self.0.decided.notify_all();
        }
    }
    *lock(&closing.flag) = true;
    let decided = Decided(closing);
    let stopped = unchanged();
    if stopped {
        stop();
    }
    // After the stop flag: a loop that waited reads the flag next.
    drop(decided);
    stopped
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A close whose stop unwinds still clears the flag: a loop leaving idle afterwards does
    /// not wait for a decision that never comes.
    #[test]
    fn a_close_that_unwinds_leaves_no_loop_waiting() {
        let closing = std::sync::Arc::new(Closing::default());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            close_with(&closing, || true, || panic!("a bug in the stop"))
        }));
        assert!(unwound.is_err());
        let (tx, rx) = std::sync::mpsc::channel();
        let c = closing.clone();
        // A thread of its own: a flag left set blocks it for good (a hang guard below).
        std::thread::spawn(move || tx.send(c.wait_if_closing()).unwrap());
        let was = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a loop waits for a close that unwound");
        assert!(!was, "the flag is still set after the close unwound");
    }
}
