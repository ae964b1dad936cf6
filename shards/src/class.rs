//! Scheduling classes: weighted-fair shares and latency bounds per loop (Glommio's task
//! queues, `xtc_exec(3)`'s classes).
//!
//! With no class created a loop runs its plain FIFO exactly as before: the cost is a load of
//! the task's class where a task is queued, a branch on a loop-local flag where the next one
//! is picked, and a load of the loop's class count per turn and per `yield_if_due`. Once a
//! class exists on a loop:
//!
//! 1. Every runnable task sits in a lane: its class's, or the implicit default lane (untagged
//!    tasks, [`DEFAULT_SHARES`]), so background work is never starved by always-ready classes.
//! 2. Each dispatch picks the non-empty lane with the least virtual runtime; after each poll its
//!    lane accrues `vruntime += (cost_ns * reciprocal) >> 12` with `reciprocal = (1 << 22) /
//!    shares` (Glommio's formula), so a class with 3× the shares gets about 3× the CPU.
//! 3. A lane that becomes runnable after idling starts at no less than the least virtual runtime
//!    among runnable lanes at the last pick (CFS's `min_vruntime`), so it cannot bank credit
//!    while idle and then monopolise the loop. (A task re-queued by its own running lane is not
//!    an idle lane waking up.)
//! 4. A class with a latency bound makes [`yield_if_due`](crate::yield_if_due) yield once the
//!    running task has run longer than the smallest bound among runnable latency lanes, or
//!    longer than the smallest bound of any latency class while a wake waits for the loop to
//!    turn (a due timer, the inbox, an incoming ring, an io_uring completion): its task may be
//!    of a latency class. The bound shortens the yield interval (the manual's words); it is not
//!    a priority. The next pick is still rule 2's, so a latency class that has used more than
//!    its share waits behind the lane that just yielded (which wins a tie, being lane 0 or of
//!    a lower index) until that lane's virtual runtime passes its own, as in Glommio.

use std::{
    collections::VecDeque,
    fmt,
    time::{Duration, Instant},
};

use crate::{
    context::{with_core, Core},
    event_loop::LoopShared,
    sync::{lock, AtomicU64, Ordering::Relaxed},
    task::Runnable,
    Error, Result,
};

/// Shares of the implicit default lane (untagged tasks).
pub const DEFAULT_SHARES: u32 = 100;

/// Telemetry and parameters of one class, shared with its [`Class`] handles.
#[derive(Debug)]
pub(crate) struct ClassStats {
    shares: u32,
    latency: Option<Duration>,
    runs: AtomicU64,
    vruntime: AtomicU64,
}

/// A scheduling class on one loop: a `Copy` handle for spawning into it and reading its
/// telemetry from any thread. Spawn into it with [`task::Builder::class`](crate::task::Builder::class):
/// from a task of its shard with `spawn_local`, from a task of any shard with `spawn_on`, and
/// from any thread (`main`, before `run()`) with
/// [`spawn_on_handle`](crate::task::Builder::spawn_on_handle); or move a running task into it
/// with [`shard::set_class`](crate::shard::set_class).
///
/// A class lives as long as the process (about 64 bytes): create classes once, at start-up,
/// as Glommio task queues are.
#[derive(Clone, Copy)]
pub struct Class {
    stats: &'static ClassStats,
    pub(crate) shard: usize,
    pub(crate) exec_id: u64,
    /// Lane index on its loop (1-based; 0 is the default lane).
    pub(crate) id: u32,
}

impl Class {
    /// The class's shares (1..=1000). Cost: a field read.
    pub fn shares(&self) -> u32 {
        self.stats.shares
    }

    /// The class's latency bound, if any. Cost: a field read.
    pub fn latency(&self) -> Option<Duration> {
        self.stats.latency
    }

    /// Task polls run in this class so far. Cost: a relaxed atomic load.
    pub fn runs(&self) -> u64 {
        self.stats.runs.load(Relaxed)
    }

    /// Virtual runtime accumulated in the current (or last) `run()` or `block_on` of its loop
    /// (scaled nanoseconds, rule 2): each run starts its lanes at 0, while [`runs`](Self::runs)
    /// counts on across runs. Lowered together with every lane of its loop when one nears 2^62
    /// (only differences between lanes matter). Cost: a relaxed atomic load.
    pub fn vruntime(&self) -> u64 {
        self.stats.vruntime.load(Relaxed)
    }

    /// The shard this class belongs to. Cost: a field read.
    pub fn shard(&self) -> usize {
        self.shard
    }
}

impl fmt::Debug for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Class")
            .field("shard", &self.shard)
            .field("id", &self.id)
            .field("shares", &self.shares())
            .field("latency", &self.latency())
            .field("runs", &self.runs())
            .field("vruntime", &self.vruntime())
            .finish()
    }
}

/// Every class ever created, for the life of the process (a [`Class`] is a `Copy` handle to
/// its stats, so they are never freed): held here, they stay owned when their loop's list goes
/// with its executor. Only the loop's list held them, so memcheck reported each class as
/// definitely lost once its executor was dropped (failing `--errors-for-leak-kinds=definite`
/// runs of every test that creates a class). Always `std`'s lock: a `static` one, outside
/// every loom model. Cost: one uncontended lock per class creation.
static ALL_CLASSES: std::sync::Mutex<Vec<&'static ClassStats>> = std::sync::Mutex::new(Vec::new());

/// Creates a class on `owner` (from any thread).
pub(crate) fn create(owner: &LoopShared, shares: u32, latency: Option<Duration>) -> Result<Class> {
    if !(1..=1000).contains(&shares) {
        return Err(Error::InvalidArgument(format!(
            "class shares must be 1..=1000, got {shares}"
        )));
    }
    if latency.is_some_and(|l| l.is_zero()) {
        return Err(Error::InvalidArgument(
            "a class latency bound must be positive (or None)".into(),
        ));
    }
    // The loop times its polls from the moment it sees the class, maybe inside a poll; the
    // first reading of a process calibrates the clock, which is then done here, on the
    // creating thread (`clock.rs`).
    crate::clock::prime();
    let stats: &'static ClassStats = Box::leak(Box::new(ClassStats {
        shares,
        latency,
        runs: AtomicU64::new(0),
        vruntime: AtomicU64::new(0),
    }));
    std::sync::Mutex::lock(&ALL_CLASSES)
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(stats);
    let mut list = lock(&owner.classes);
    list.push(stats);
    owner.class_count.store(list.len(), Relaxed);
    Ok(Class {
        stats,
        shard: owner.index,
        exec_id: owner.exec_id,
        id: list.len() as u32,
    })
}

struct Lane {
    queue: VecDeque<Runnable>,
    vruntime: u64,
    reciprocal: u64,
    stats: Option<&'static ClassStats>,
}

impl Lane {
    fn new(shares: u32, stats: Option<&'static ClassStats>) -> Lane {
        Lane {
            queue: VecDeque::new(),
            vruntime: 0,
            reciprocal: (1u64 << 22) / shares as u64,
            stats,
        }
    }
}

/// The loop-local lanes. Lane 0 is the default lane; its queue is the loop's plain FIFO
/// (`Core::queue`), so nothing moves when the first class appears.
pub(crate) struct Lanes {
    lanes: Vec<Lane>,
    /// The least virtual runtime among runnable lanes at the last pick (rule 3).
    clock: u64,
    /// The lane whose task is being polled: its own re-queue is not an idle lane waking up.
    running: usize,
}

impl fmt::Debug for Lanes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lanes")
            .field("classes", &(self.lanes.len().saturating_sub(1)))
            .finish_non_exhaustive()
    }
}

impl Lanes {
    pub(crate) fn new() -> Lanes {
        Lanes {
            lanes: vec![Lane::new(DEFAULT_SHARES, None)],
            clock: 0,
            running: usize::MAX,
        }
    }

    /// Picks up classes created since the last call (from any thread).
    pub(crate) fn sync(&mut self, owner: &LoopShared) -> bool {
        let list = lock(&owner.classes);
        while self.lanes.len() <= list.len() {
            let s = list[self.lanes.len() - 1];
            // A lane is adopted once per run, at 0: so is its readout, which showed the last
            // run's figure until the class's first poll of this one.
            s.vruntime.store(0, Relaxed);
            self.lanes.push(Lane::new(s.shares, Some(s)));
        }
        self.lanes.len() > 1
    }
}

/// Queues `r` in its lane (rule 1). Only called when the loop has classes.
pub(crate) fn enqueue(core: &Core, r: Runnable) {
    let class = r.metadata().class.load(Relaxed) as usize;
    let mut lanes = core.lanes.borrow_mut();
    if class >= lanes.lanes.len() && class != crate::task::MIGRATABLE_CLASS as usize {
        // A class created since the loop last looked, whose task arrived first: pick it up
        // (rare: a lock).
        lanes.sync(&core.shared);
    }
    // An id still unknown (another loop's) files under the default lane.
    let c = if class < lanes.lanes.len() { class } else { 0 };
    let was_empty = if c == 0 {
        core.queue.borrow().is_empty()
    } else {
        lanes.lanes[c].queue.is_empty()
    };
    if was_empty && lanes.running != c {
        // Rule 3: an idle lane rejoins at the clock.
        let clock = lanes.clock;
        let l = &mut lanes.lanes[c];
        if l.vruntime < clock {
            l.vruntime = clock;
            // The readout follows, or it kept the lower figure until the lane's next charge.
            if let Some(s) = l.stats {
                s.vruntime.store(clock, Relaxed);
            }
        }
    }
    if c == 0 {
        drop(lanes);
        core.queue.borrow_mut().push_back(r);
    } else {
        lanes.lanes[c].queue.push_back(r);
    }
}

/// Rule 2: the next task, from the least-vruntime non-empty lane, and that lane's index.
pub(crate) fn pick(core: &Core) -> Option<(Runnable, usize)> {
    let mut lanes = core.lanes.borrow_mut();
    let default_ready = !core.queue.borrow().is_empty();
    let mut best: Option<(u64, usize)> = default_ready.then(|| (lanes.lanes[0].vruntime, 0));
    for (i, l) in lanes.lanes.iter().enumerate().skip(1) {
        if !l.queue.is_empty() && best.is_none_or(|(v, _)| l.vruntime < v) {
            best = Some((l.vruntime, i));
        }
    }
    let (v, i) = best?;
    lanes.clock = v;
    lanes.running = i;
    let r = if i == 0 {
        drop(lanes);
        core.queue.borrow_mut().pop_front()?
    } else {
        lanes.lanes[i].queue.pop_front()?
    };
    Some((r, i))
}

/// Rule 2: charges `cost` to lane `i`.
pub(crate) fn account(core: &Core, i: usize, cost: Duration) {
    let mut lanes = core.lanes.borrow_mut();
    let cost_ns = cost.as_nanos().min(u64::MAX as u128) as u64;
    if let Some(s) = lanes.charge(i, cost_ns) {
        s.runs.store(s.runs.load(Relaxed) + 1, Relaxed);
    }
    lanes.running = usize::MAX;
}

/// Virtual runtimes are rebased (every lane and the clock lowered by the clock) once one
/// passes this. Only differences matter to `pick`, and a lane stuck at `u64::MAX` would
/// tie with every other for good, turning fair shares into lane order. At the fastest accrual
/// (1 share: 1,024 per CPU nanosecond) a lane gets here after about 52 days of CPU time.
const REBASE_AT: u64 = 1 << 62;

impl Lanes {
    /// Adds `cost_ns` of CPU time to lane `i`'s virtual runtime (rule 2), rebasing every lane
    /// when it passes [`REBASE_AT`]; returns the lane's stats, if it is a class.
    fn charge(&mut self, i: usize, cost_ns: u64) -> Option<&'static ClassStats> {
        let l = self.lanes.get_mut(i)?;
        let add = (cost_ns as u128 * l.reciprocal as u128) >> 12;
        l.vruntime = l
            .vruntime
            .saturating_add(u64::try_from(add).unwrap_or(u64::MAX));
        let (v, stats) = (l.vruntime, l.stats);
        if v >= REBASE_AT {
            // By the clock: runnable lanes are at or above it, and an idle lane below it
            // rejoins at the clock anyway (rule 3), so lowering it to 0 changes nothing.
            let base = self.clock;
            self.clock = 0;
            for l in &mut self.lanes {
                l.vruntime = l.vruntime.saturating_sub(base);
                if let Some(s) = l.stats {
                    s.vruntime.store(l.vruntime, Relaxed);
                }
            }
        } else if let Some(s) = stats {
            s.vruntime.store(v, Relaxed);
        }
        stats
    }
}

/// Whether any task waits in a class lane (for the continue-or-park decision).
pub(crate) fn any_queued(core: &Core) -> bool {
    core.lanes
        .borrow()
        .lanes
        .iter()
        .skip(1)
        .any(|l| !l.queue.is_empty())
}

/// Drops every task queued in class lanes (shutdown), on this thread.
pub(crate) fn drain(core: &Core) -> Vec<Runnable> {
    let mut lanes = core.lanes.borrow_mut();
    lanes
        .lanes
        .iter_mut()
        .skip(1)
        .flat_map(|l| l.queue.drain(..))
        .collect()
}

/// Rule 4: should the running task yield for a latency class? Yes once it has run past the
/// smallest bound among the loop's latency classes while a task of one is runnable, or while
/// a wake may be on its way to one: a due timer (a sleeper of a latency class is still in the
/// timer heap until the loop turns), a message in the inbox or an incoming ring (a task woken
/// from a plain thread or another shard), or an io_uring completion not yet reaped. Which
/// class such a wake is for is not known before the loop turns, so any counts. (Readiness on
/// the epoll driver takes a system call to see and is not looked at.)
pub(crate) fn latency_due(core: &Core) -> bool {
    if !core.classes_active.get() {
        return false;
    }
    let Some(started) = core.poll_started.get() else {
        return false;
    };
    let lanes = core.lanes.borrow();
    let mut runnable_bound = None;
    let mut any_bound = None;
    for l in lanes.lanes.iter().skip(1) {
        if let Some(b) = l.stats.and_then(|s| s.latency) {
            any_bound = Some(any_bound.map_or(b, |a: Duration| a.min(b)));
            if !l.queue.is_empty() {
                runnable_bound = Some(runnable_bound.map_or(b, |a: Duration| a.min(b)));
            }
        }
    }
    drop(lanes);
    let Some(any) = any_bound else {
        return false;
    };
    let ran = crate::clock::Tick::now().since(started);
    if runnable_bound.is_some_and(|b| ran >= b) {
        return true;
    }
    // A wake waiting for the loop to turn (`event_loop::turn_pending`): without this a task
    // woken from elsewhere waited, in or out of a latency class, until the running task
    // ended its poll.
    ran >= any && (crate::event_loop::turn_pending(core) || timer_due(core, Instant::now()))
}

/// Rule 4: whether a timer is due at `now`.
fn timer_due(core: &Core, now: Instant) -> bool {
    core.timers
        .try_borrow_mut()
        .is_ok_and(|mut t| t.next_deadline().is_some_and(|d| d <= now))
}

/// Creates a class on the current loop (see [`crate::shard::create_class`]).
pub(crate) fn create_here(shares: u32, latency: Option<Duration>) -> Result<Class> {
    let owner =
        with_core(|c| c.shared.clone()).ok_or(Error::OffLoop("xtc::shard::create_class"))?;
    let class = create(&owner, shares, latency)?;
    // Active at once on this loop, not from its next turn: the creating task may run long
    // (`Core::sync_classes`: a class that becomes active mid-poll times the poll from now and
    // ends the batch after it).
    with_core(|c| c.sync_classes(true));
    Ok(class)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vruntimes(lanes: &Lanes) -> Vec<u64> {
        lanes.lanes.iter().map(|l| l.vruntime).collect()
    }

    /// Rule 2, xtc_exec(3)'s (Glommio's) accrual exactly: `(cost_ns * ((1 << 22) / shares))
    /// >> 12`, the reciprocal truncated first (1000 shares: 4,194, not 4,194.304), so a lane
    /// accrues 1,023,925 for a millisecond, not the 1,024,000 of `cost * 1024 / shares`.
    #[test]
    fn vruntime_accrues_by_glommios_formula() {
        let mut lanes = Lanes::new();
        lanes.lanes.push(Lane::new(1000, None));
        lanes.lanes.push(Lane::new(3, None));
        lanes.charge(1, 1_000_000);
        lanes.charge(2, 1_000);
        lanes.charge(0, 1_000); // the default lane: 100 shares
        assert_eq!(vruntimes(&lanes), vec![10_239, 1_023_925, 341_333]);
        // Accrual adds up: a second charge adds the same again.
        lanes.charge(1, 1_000_000);
        assert_eq!(lanes.lanes[1].vruntime, 2 * 1_023_925);
    }

    /// Near the top of `u64` every lane is lowered by the same amount: the order and the gaps
    /// `pick` compares stay, nothing saturates.
    #[test]
    fn vruntimes_are_rebased_before_they_saturate() {
        let mut lanes = Lanes::new();
        lanes.lanes.push(Lane::new(1, None));
        lanes.lanes.push(Lane::new(1000, None));
        lanes.lanes[0].vruntime = REBASE_AT - 10_000;
        lanes.lanes[1].vruntime = REBASE_AT - 1;
        lanes.lanes[2].vruntime = REBASE_AT - 5_000;
        lanes.clock = REBASE_AT - 10_000;
        lanes.charge(1, 1); // 1 share: 1,024 per ns, over the line
        assert_eq!(vruntimes(&lanes), vec![0, 10_000 - 1 + 1024, 5_000]);
        assert_eq!(lanes.clock, 0);
        // An absurd single cost saturates instead of wrapping to a small value.
        lanes.charge(2, u64::MAX);
        assert_eq!(lanes.lanes[2].vruntime, u64::MAX);
        // Idle lanes below the clock go to 0 (they rejoin at the clock anyway).
        lanes.clock = 5_000;
        lanes.lanes[2].vruntime = REBASE_AT;
        lanes.charge(2, 0); // at the line: rebased by the clock
        assert_eq!(
            vruntimes(&lanes),
            vec![0, 10_000 - 1 + 1024 - 5_000, REBASE_AT - 5_000]
        );
    }
}
