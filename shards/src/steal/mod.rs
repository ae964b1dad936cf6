//! Migratable tasks and work stealing (invariant 2 in the crate docs).
//!
//! Eligibility is fixed at spawn: only tasks spawned with [`spawn`](crate::spawn) /
//! [`Handle::spawn`](crate::Handle::spawn) (an `Executor` derefs to its `Handle`) (`Send` futures) are ever moved. They live on
//! their loop's crossbeam-deque `Worker`, LIFO: the owner runs the newest task first, so a
//! fork-join tree is walked depth-first (a small working set; FIFO walks it breadth-first and
//! keeps most of it alive, cold in cache), while thieves take the oldest. Other loops hold its
//! `Stealer`. Policy is the
//! executor's knobs (atomics in `executor/mod.rs`'s `ExecShared`, set by `Handle`'s setters and the builder): stealing on/off, eager rebalance, steal backoff,
//! thresholds and NUMA sensitivity, all atomics read at each decision.
//!
//! # Protocol
//!
//! 1. **Where a migratable `Runnable` goes.** Scheduled on a worker loop of its executor: that
//!    loop's deque (so a task woken from a worker moves to it, for locality), except a task
//!    woken during its own poll (a yield), which goes to that loop's injector, behind the rest:
//!    on top of a LIFO deque it would run again at once and starve its siblings. Scheduled
//!    anywhere else: the injector (an MPMC queue) of the loop it last ran on, plus a wake ping
//!    by the protocol of `event_loop/park.rs`. A loop takes from its injector when its deque is
//!    empty, and first every [`INJECTOR_EVERY`] picks.
//! 2. **When a loop steals.** In its idle path, before it parks: always when fully idle (no
//!    runnable task, no parked pinned task, no timer), and with eager rebalance also when it only
//!    has parked tasks or timers. Victims are tried nearest first in the victim order of the
//!    current NUMA sensitivity (xtc-numa), taking about half of a victim's deque
//!    (`steal_batch_and_pop`), then the victim's injector.
//! 3. **Thresholds (HPX).** A victim is stolen from only if it has at least `min_tasks_to_steal`
//!    queued, unless this thief found it short but non-empty [`STARVATION_LOOKS`](policy::STARVATION_LOOKS) times in a row,
//!    or this is the thief's first steal after being woken by new work: a ping for migratable
//!    work (rule 4's spawn pings, eager rebalance's nudge), marked in the loop's `work_ping`.
//!    Other pings end a park too (a knob setter's, pinned work's, a stop's) and waive nothing:
//!    when they did, switching stealing on or setting the minimum made every idle loop steal
//!    at once from a victim below it. The waiver is spent by the first look that finds work
//!    queued at a victim: a spawner pings before it queues its task, so a thief woken at once
//!    may find every victim empty, and keeps the waiver for its next look only
//!    (`policy::Waiver`); a look that stops early (no migratable task alive) is such a look.
//!    Stealing switched off drops it, and so does a park decision that does not look (rule 2:
//!    the loop owns a timer or a parked pinned task). A spin's look for work a nudge passed
//!    over (rule 4, `nudged_before_spin`) is no wake: it takes only work at the minimum.
//! 4. **Finding work while parked.** While any migratable task is alive (the count of rule 5 is
//!    above zero), a loop holds spawns it has not counted yet (its `spawning` flag, raised at
//!    its first spawn of a turn and lowered once its batch is published), or a victim has
//!    tasks queued, an idle loop parks with a 1 ms timeout (the idle tick) and retries; with
//!    steal backoff on, consecutive empty ticks grow it to 32 ms, and any work resets it.
//!    Otherwise no migratable task is alive (the count reads low only while a batch is
//!    unpublished, and then a flag is up): the loop parks without a timeout, counted among the
//!    tickless loops. Two things end that: the count rising from zero or less (a publish or a
//!    foreign spawn pings every loop), and a loop's first spawn of a turn, which raises its
//!    flag and then pings every loop if any is tickless; the idle loop counts itself tickless
//!    before it looks at the flags, so one side always sees the other (`loom_park.rs`). A
//!    woken task needs no ping: it is alive, so the idle loops tick. With eager rebalance on,
//!    a loop that queues a migratable task also pings one idle peer at the end of its turn:
//!    the nearest in its victim order that may steal from it (`policy::nudge_target`), a
//!    loop spinning before it parks included (its spin watches `work_ping`; a spin that
//!    begins looks at its victims once, after a fence paired with the nudger's, for work whose
//!    nudge passed it over just before: `nudged_before_spin`).
//!    With eager rebalance on, too, work queued from another thread into a busy loop's
//!    injector (a wake, `Executor::spawn`) nudges that loop's nearest idle peer at once, as
//!    its ping wakes nothing.
//! 5. **Counting.** A shared count of live migratable tasks (incremented at spawn, decremented
//!    when the future is dropped; on a worker batched into one RMW per loop turn, flushed before
//!    the loop publishes an idle status) keeps quiescence exact with tasks in flight between
//!    loops: when every loop is idle every delta is flushed and the count is exact. A task
//!    joins a sharded registry (waker, name, spawn site, metadata address; the shard of the
//!    loop it parks on) the first time it parks: the registry serves the deadlock report and
//!    lets `run()` drop every parked migratable task when the executor stops (one never parked
//!    is in a queue, dropped with it), and a wait in a shutdown `Drop` surface the task it
//!    awaits ([`cancel_awaited_at_stop`], ring rule 3c), and its waker keeps a parked task's future from being freed undropped. It
//!    leaves the registry as its future starts to drop: that drop is user code, which may run
//!    the executor again and sweep the registry (a nested `LocalExecutor::block_on`). A task
//!    that finishes in its first poll never takes the registry's lock.
//! 6. **Work-first join.** Awaiting the [`JoinHandle`] of a migratable task that is the newest
//!    entry of the awaiting loop's own deque (not started yet, or woken since and queued there
//!    again; not stolen) runs it on the spot, inside the awaiting task's poll, as `rayon::join` and Cilk do: the
//!    parent skips a park, a registry entry, a wake and a second poll, and a fork-join tree is
//!    walked depth-first on the stack. Thieves still take the oldest entries, the big
//!    subtrees. Only a migratable task joins this way: a pinned task awaiting migratable work
//!    keeps serving its loop while idle peers may take that work. Bounded in time and stack:
//!    a task poll runs at most [`INLINE_BUDGET`] tasks this way (nested ones included), they
//!    count toward the loop turn's batch, and none starts deeper than [`inline_stack`] below
//!    the loop's frame; past either bound, awaits park as usual. The stall watchdog charges an inline task's time to it, and charges
//!    the task that awaited it the rest of the hold (its own time and that of inline tasks
//!    not reported by name).
//!
//! Migration idiom: a task that keeps per-shard state re-reads [`shard::id()`](crate::shard::id)
//! after each `.await`; a different value means it was stolen in between.

pub(crate) mod policy;

use std::{
    future::Future,
    panic::{catch_unwind, AssertUnwindSafe},
    pin::Pin,
    sync::{Arc, Weak},
    task::{Context, Poll, Waker},
};

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use crossbeam_utils::CachePadded;
use policy::look;
use slab::Slab;

use crate::{
    context::{with_core, Core},
    executor::ExecShared,
    stats::bump,
    sync::{fence, lock, AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Mutex, Ordering::*},
    task::{JoinHandle, Outcome, Runnable, TaskInfo, TaskMeta},
};

/// Per-loop stealing state other threads touch.
#[derive(Debug)]
pub(crate) struct StealShared {
    pub(crate) stealer: Stealer<Runnable>,
    pub(crate) injector: Injector<Runnable>,
    /// Tasks thieves took from this loop (written by thieves: an RMW per steal).
    pub(crate) stolen_from: AtomicU64,
    /// Tasks queued into `injector` from off this loop (`inject`: a wake from a thread that
    /// is not one of the executor's loops, or a spawn placed here from elsewhere), counted
    /// before the push, as an inbox counts its pushes: the quiescence check's snapshots read
    /// it (`executor/quiesce.rs`), so a migratable task woken from a plain thread while the
    /// coordinator closes on a deadlock verdict makes it take the verdict back. Cost: an RMW
    /// per such wake or spawn.
    pub(crate) injected: AtomicU64,
    /// Rule 4: this loop spawned migratable tasks this turn whose count it has not published
    /// yet (set at its first spawn of a turn, cleared by `flush_live` after publishing).
    pub(crate) spawning: CachePadded<AtomicBool>,
    /// Rule 3: a ping for new migratable work was sent to this loop since its last park
    /// decision (set before the ping by [`ping_all_for_work`] and [`nudge_idle_peer`], taken
    /// by [`woke`] as a park ends, cleared by [`forget_work_ping`], looked at by the park's
    /// recheck, [`work_pinged`]). The ping's read-modify-write on the parker's state
    /// (`SeqCst`) orders the store before the look of a loop it woke, or whose announcement
    /// came after it; set with `Release` and cleared by an `Acquire` look, so a loop that
    /// forgets it sees the work it announced.
    pub(crate) work_ping: WorkPing,
    /// Rule 4: this loop spins before it parks (`event_loop::spin_for_work`, set as the spin
    /// begins, cleared once it found work or the loop published its idle status): idle, though
    /// its status still reads BUSY, so eager rebalance's nudge may pick it; its spin watches
    /// `work_ping`. Without it the nudge passed a spinning loop over, and the spin never saw
    /// the work queued at its victim. Raised with `SeqCst`, paired with the nudger's fence
    /// ([`nudged_before_spin`]).
    pub(crate) spinning: AtomicBool,
    /// Raised (SeqCst) by this loop as a thief before it takes from a victim, lowered once
    /// what it took is in its own deque: in between the task is in no queue that the
    /// quiescence snapshot reads, which counts this as queued (`quiesce::Snapshot`).
    pub(crate) stealing: AtomicBool,
}

/// Rule 3's mark of a ping for new migratable work (`StealShared::work_ping`): its four
/// accesses, with their orderings, in one place, so the loom model of the park decision
/// (`loom_park.rs`, `loom_work_ping_*`) runs the shipping ones.
#[derive(Debug, Default)]
pub(crate) struct WorkPing(AtomicBool);

impl WorkPing {
    /// A sender, before it unparks the loop: `Release`, so a loop that takes the mark sees
    /// the work it is for.
    #[inline]
    pub(crate) fn mark(&self) {
        self.0.store(true, Release);
    }

    /// [`forget_work_ping`]'s access: a swap, not a load and a store (a second ping landing
    /// between the two was erased, and its work, not acquired by the load, went unseen by the
    /// look at the victims and by the recheck); `Acquire`, so the look that follows sees the
    /// work of the ping it takes. The plain load first keeps the common case (no ping) free
    /// of a read-modify-write.
    #[inline]
    pub(crate) fn forget(&self) {
        if self.0.load(Relaxed) {
            self.0.swap(false, Acquire);
        }
    }

    /// [`woke`]'s access: takes the mark, returning whether it was set. `Acquire`, as
    /// [`forget`](Self::forget): a ping that lands between a caller's look at the mark (the
    /// spin's) and this swap is taken here, and its work must be seen by the steal that
    /// follows.
    #[inline]
    pub(crate) fn take(&self) -> bool {
        self.0.swap(false, Acquire)
    }

    /// [`work_pinged`]'s access (the spin's and the park's recheck's look). Cost: a load.
    #[inline]
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Acquire)
    }
}

impl StealShared {
    /// Drops the `Runnable`s in this loop's injector, as many as it held when called (what a
    /// drop here pushes, or another thread meanwhile, waits for the caller's next call), and
    /// returns how many: shutdown and teardown, off any worker (migratable futures are `Send`,
    /// so any thread may). Bounded: plain threads that spawn (`Handle::spawn`) faster than
    /// the futures drop kept a drain "until empty" going for as long as they spawned, and a
    /// stopping `run()` never returned.
    pub(crate) fn drop_injected(&self) -> usize {
        let mut left = self.injector.len();
        let mut dropped = 0;
        while left > 0 {
            match self.injector.steal() {
                crossbeam_deque::Steal::Success(r) => {
                    crate::task::cancel(r);
                    dropped += 1;
                    left -= 1;
                }
                crossbeam_deque::Steal::Retry => continue,
                crossbeam_deque::Steal::Empty => break,
            }
        }
        dropped
    }
}

#[derive(Debug)]
struct MEntry {
    waker: Waker,
    info: TaskInfo,
    /// The task's metadata address (its identity while its header lives), for
    /// [`Migratable::registered_waker`].
    meta: usize,
}

/// Executor-wide migratable-task state.
#[derive(Debug)]
pub(crate) struct Migratable {
    /// Live migratable tasks (rule 5), not counting the unflushed deltas of busy loops
    /// (which is why it may dip below zero for a moment).
    pub(crate) live: CachePadded<AtomicI64>,
    /// Loops parked, or deciding to park, without an idle tick because they saw no sign of
    /// migratable work (rule 4): a loop's first spawn of a turn pings them.
    pub(crate) tickless: CachePadded<AtomicUsize>,
    /// Registry shards, by spawning loop (or round-robin slot), to spread the locks.
    registry: Vec<CachePadded<Mutex<Slab<MEntry>>>>,
    /// Loop deques, parked between runs (taken by the loop when it starts).
    workers: Vec<Mutex<Option<Worker<Runnable>>>>,
    /// Round-robin placement counter for `Executor::spawn`.
    pub(crate) next: AtomicUsize,
}

impl Migratable {
    pub(crate) fn new(n: usize) -> (Migratable, Vec<StealShared>) {
        let mut workers = Vec::with_capacity(n);
        let mut shared = Vec::with_capacity(n);
        for _ in 0..n {
            let w = Worker::new_lifo();
            shared.push(StealShared {
                stealer: w.stealer(),
                injector: Injector::new(),
                stolen_from: AtomicU64::new(0),
                injected: AtomicU64::new(0),
                spawning: CachePadded::new(AtomicBool::new(false)),
                work_ping: WorkPing::default(),
                spinning: AtomicBool::new(false),
                stealing: AtomicBool::new(false),
            });
            workers.push(Mutex::new(Some(w)));
        }
        (
            Migratable {
                live: CachePadded::new(AtomicI64::new(0)),
                tickless: CachePadded::new(AtomicUsize::new(0)),
                registry: (0..n.max(1))
                    .map(|_| CachePadded::new(Mutex::new(Slab::new())))
                    .collect(),
                workers,
                next: AtomicUsize::new(0),
            },
            shared,
        )
    }

    pub(crate) fn take_worker(&self, me: usize) -> Option<Worker<Runnable>> {
        self.workers.get(me).and_then(|w| lock(w).take())
    }

    pub(crate) fn give_back_worker(&self, me: usize, w: Worker<Runnable>) {
        if let Some(slot) = self.workers.get(me) {
            *lock(slot) = Some(w);
        }
    }

    /// One line per registered migratable task, for the deadlock report.
    pub(crate) fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.registry {
            for (_, e) in lock(r).iter() {
                let name = e.info.report_name();
                out.push(format!(
                    "migratable task '{name}' spawned at {}",
                    e.info.location
                ));
            }
        }
        out
    }

    /// Whether any migratable task is registered.
    pub(crate) fn any_registered(&self) -> bool {
        self.registry.iter().any(|r| !lock(r).is_empty())
    }

    /// The waker of the registered (parked at some point) task whose metadata is at `meta`, if
    /// it is registered: a scan of every registry shard (rare: ring rule 3c's wait,
    /// [`cancel_awaited_at_stop`]).
    fn registered_waker(&self, meta: *const TaskMeta) -> Option<Waker> {
        self.registry.iter().find_map(|r| {
            lock(r)
                .iter()
                .find(|(_, e)| e.meta == meta as usize)
                .map(|(_, e)| e.waker.clone())
        })
    }

    /// Takes the `Runnable` of the task at `meta` out of the deques parked between runs (those
    /// of loops that have stopped, or not started yet), leaving the rest in their order.
    fn take_parked(&self, meta: *const TaskMeta) -> Option<Runnable> {
        self.workers.iter().find_map(|w| {
            let w = lock(w);
            take_from_deque(w.as_ref()?, meta)
        })
    }

    /// Wakes every registered task (executor stop), so its `Runnable` surfaces to be dropped.
    pub(crate) fn wake_all(&self) {
        let wakers: Vec<Waker> = self
            .registry
            .iter()
            .flat_map(|r| {
                lock(r)
                    .iter()
                    .map(|(_, e)| e.waker.clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        for w in wakers {
            w.wake();
        }
    }

    /// Drops every queued migratable `Runnable` held by the executor (deques parked between
    /// runs) and returns how many.
    pub(crate) fn drop_parked_queues(&self) -> usize {
        let mut dropped = 0;
        for w in &self.workers {
            let taken = lock(w).take();
            if let Some(worker) = taken {
                while let Some(r) = worker.pop() {
                    crate::task::cancel(r);
                    dropped += 1;
                }
                *lock(w) = Some(worker);
            }
        }
        dropped
    }
}

/// The future of a migratable task: the user's future, panic capture, and registry membership.
struct MigrFuture<F> {
    /// Dropped first in `drop`, under `catch_unwind` (task protocol rule 4).
    fut: std::mem::ManuallyDrop<F>,
    /// This task's metadata in its async-task header (set right after the spawn); async-task
    /// drops the future before the header, so it is valid in `drop`.
    meta: *const TaskMeta,
    /// `(registry shard, key)` once the task has parked (rule 5), packed into one word
    /// (`pack_key`) to keep small tasks within glibc's fast bins (`tests/task_alloc.rs`).
    key: u64,
}

/// `MigrFuture::key` before the task has parked.
const NO_KEY: u64 = u64::MAX;

/// Packs a registry `(shard, key)`; `None` (not registered) if either does not fit 32 bits.
fn pack_key(shard: usize, key: usize) -> Option<u64> {
    let (shard, key) = (u32::try_from(shard).ok()?, u32::try_from(key).ok()?);
    let packed = (u64::from(shard) << 32) | u64::from(key);
    (packed != NO_KEY).then_some(packed)
}

fn unpack_key(packed: u64) -> Option<(usize, usize)> {
    (packed != NO_KEY).then_some(((packed >> 32) as usize, (packed & 0xffff_ffff) as usize))
}

// SAFETY: `meta` points into the task's own header, which is `Sync` (`TaskMeta` holds atomics,
// a `TaskInfo` fixed at spawn, and a `Home`, `Send + Sync` by `task/home.rs`); the future
// moves between threads with its task.
unsafe impl<F: Send> Send for MigrFuture<F> {}

impl<F: Future> Future for MigrFuture<F> {
    type Output = Outcome<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `fut` is structurally pinned: never moved out, dropped in place with `self`;
        // `meta` and `key` are plain data, moved freely.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: see above.
        let fut = unsafe { Pin::new_unchecked(&mut *this.fut) };
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Pending) => {
                // Rule 5: a task joins the registry the first time it parks; one that finishes
                // in its first poll (a fork-join leaf) never touches the registry's lock.
                if this.key == NO_KEY {
                    this.key = register_parked(this.meta, cx.waker()).unwrap_or(NO_KEY);
                }
                Poll::Pending
            }
            Ok(Poll::Ready(v)) => Poll::Ready(Outcome::new(Ok(v))),
            Err(p) => Poll::Ready(Outcome::new(Err(Box::new(p)))),
        }
    }
}

/// Rule 5: registers the parking task whose metadata is `meta` in the registry shard of the
/// loop it runs on; `None` off any loop (not reached: migratable tasks run on workers).
fn register_parked(meta: *const TaskMeta, waker: &Waker) -> Option<u64> {
    with_core(|core| {
        let reg = &core.exec.migratable.registry;
        let shard = core.index() % reg.len();
        // SAFETY: `meta` points into the header of the task being polled (set at spawn).
        let info = unsafe { &*meta }.info.clone();
        let mut reg = lock(&reg[shard]);
        let entry = reg.vacant_entry();
        let packed = pack_key(shard, entry.key())?;
        entry.insert(MEntry {
            waker: waker.clone(),
            info,
            meta: meta as usize,
        });
        Some(packed)
    })
    .flatten()
}

impl<F> MigrFuture<F> {
    /// Rule 5: takes this task out of the registry, if it parked at some point.
    fn unregister(&mut self) {
        let Some((shard, k)) = unpack_key(std::mem::replace(&mut self.key, NO_KEY)) else {
            return;
        };
        if self.meta.is_null() {
            return;
        }
        // SAFETY: see the field: the header outlives the future.
        let weak = unsafe { &*self.meta }.home.exec();
        let remove = |exec: &ExecShared| drop(lock(&exec.migratable.registry[shard]).try_remove(k));
        // On a loop of its executor (the usual case) no reference count is touched.
        let here = with_core(|core| {
            let mine = std::ptr::eq(Weak::as_ptr(weak), Arc::as_ptr(&core.exec));
            if mine {
                remove(&core.exec);
            }
            mine
        });
        if here != Some(true) {
            if let Some(exec) = weak.upgrade() {
                remove(&exec);
            }
        }
    }
}

impl<F> Drop for MigrFuture<F> {
    fn drop(&mut self) {
        // Out of the registry first: the drop of the user's future is user code, which may
        // run this executor again (a `LocalExecutor::block_on` from a `Drop`), and that run
        // ends by sweeping the parked migratable tasks until none is registered. This one,
        // its drop under way below it, stayed registered: the sweep waited for it for two
        // seconds and then warned that it "could not be dropped". A task being dropped
        // needs its entry no more (the entry's waker only served to surface it).
        let registered = unpack_key(self.key).map(|(shard, _)| shard);
        self.unregister();
        // Then the user's future, guarded where it has drop code at all (`needs_drop` is a
        // compile-time constant).
        if std::mem::needs_drop::<F>() {
            crate::task::drop_guarded(|| {
                // SAFETY: dropped in place exactly once, here; `fut` is not touched afterwards.
                // Being pinned, it is dropped where it lies, never moved.
                unsafe { std::mem::ManuallyDrop::drop(&mut self.fut) }
            });
        }
        if self.meta.is_null() {
            return;
        }
        // SAFETY: see the field: the header outlives the future.
        let weak = unsafe { &*self.meta }.home.exec();
        // Counted out after the drop, which may spawn: the task is alive until it ends.
        // On a loop of its executor (the usual case) no reference count is touched.
        let done_here = with_core(|core| {
            if !std::ptr::eq(Weak::as_ptr(weak), Arc::as_ptr(&core.exec)) {
                return false;
            }
            core.migr_delta.set(core.migr_delta.get() - 1);
            core.tasks_done.set(core.tasks_done.get() + 1);
            true
        });
        if done_here != Some(true) {
            if let Some(exec) = weak.upgrade() {
                exec.migratable.live.fetch_sub(1, SeqCst);
                if let Some(shard) = registered {
                    crate::executor::count_swept(&exec, shard);
                }
            }
        }
    }
}

/// Counts a spawned migratable task, before it is queued (so the count never misses a live
/// one): batched per loop turn on a worker (one shared RMW per turn, in [`flush_live`]),
/// directly elsewhere. Returns whether the shared count rose from zero or less; the caller
/// then pings every loop once the task is queued (rule 4).
fn count_spawn(exec: &Arc<ExecShared>) -> bool {
    with_core(|core| {
        Arc::ptr_eq(&core.exec, exec).then(|| {
            count_spawn_here(core);
            false
        })
    })
    .flatten()
    .unwrap_or_else(|| live_add_shared(exec, 1))
}

/// [`count_spawn`] on a worker of the task's executor: into this turn's batch; the turn's
/// first spawn also shows the batch to idle loops ([`show_spawning`]).
#[inline]
fn count_spawn_here(core: &Core) {
    core.migr_delta.set(core.migr_delta.get() + 1);
    if !core.spawning.get() {
        show_spawning(core);
    }
}

/// Rule 4, at a loop's first spawn of a turn: raises its `spawning` flag, which keeps idle
/// loops ticking until `flush_live` has published the batch, and pings the loops that parked
/// without a tick. The store, a `SeqCst` fence, then the load of the tickless count, against
/// the idle loop's increment of that count, its fence, then its loads of the flags
/// ([`enter_tickless`]): one of the two sees the other (`loom_park.rs`,
/// `loom_spawning_flag_*`). Cost: a store, a fence and a load per turn that spawns, plus a
/// ping of every loop when one parked without a tick.
#[cold]
fn show_spawning(core: &Core) {
    core.spawning.set(true);
    core.shared.steal.spawning.store(true, SeqCst);
    fence(SeqCst);
    if core.exec.migratable.tickless.load(SeqCst) > 0 {
        ping_all_for_work(&core.exec);
    }
}

/// Rules 3 and 4: pings every loop for new migratable work, marking each ping as such, so a
/// thief it wakes takes its first steal even from a victim below the minimum. None while
/// stealing is off: no idle loop may take the work then (the loop it is queued on got its own
/// ping, `inject`), and each spawn that raised the count from zero woke every idle loop for
/// nothing. Switching stealing on pings every loop itself.
fn ping_all_for_work(exec: &ExecShared) {
    if !exec.stealing_now() {
        return;
    }
    for l in &exec.loops {
        l.steal.work_ping.mark();
    }
    exec.unpark_all();
}

/// Adds `delta` straight to the shared count. Returns whether it rose from zero or less, when
/// idle loops parked without a tick must start looking (rule 4).
fn live_add_shared(exec: &ExecShared, delta: i64) -> bool {
    let prev = exec.migratable.live.fetch_add(delta, SeqCst);
    delta > 0 && prev <= 0
}

/// End of a loop turn (before the loop publishes an idle status): publishes this loop's
/// batched count of spawned minus finished migratable tasks (rule 5); if the count leaves
/// zero, wakes loops parked without a tick (rule 4).
pub(crate) fn flush_live(core: &Core) {
    let delta = core.migr_delta.replace(0);
    // The batch's spawns are queued by now (or already ran).
    if delta != 0 && live_add_shared(&core.exec, delta) {
        ping_all_for_work(&core.exec);
    }
    // Lowered after the count is published. A single look of an idle loop (`may_find_work`
    // reads the count, then the flags) can still fall between the two and miss this batch;
    // the count's rise from zero or less pinged every loop parked without a tick (above), and
    // a loop deciding to park meanwhile finds that ping in its recheck after announcing
    // (park.rs rule 1), so none sleeps through it (loom: `spawning_flag_model`).
    if core.spawning.replace(false) {
        core.shared.steal.spawning.store(false, SeqCst);
    }
}

/// Whether an idle loop may find migratable work to steal (rules 2 and 4): the shared count
/// says a task is alive, a loop holds spawns it has not counted yet (its `spawning` flag), or
/// one of its victims has tasks queued. The count alone can read zero or less with tasks
/// alive, for a whole turn of a busy loop whose fresh spawns are still in its batch: a thief
/// that ran some of them publishes their ends first; the spawner's flag is up meanwhile. One
/// call can still read the count before a batch is published and the flags after it, and miss
/// that batch: what keeps a loop from sleeping through it is the publishing loop's ping (see
/// [`flush_live`]) and the park's recheck, not this look. Cost: a load, one per loop, and two per victim when the count reads zero or less.
fn may_find_work(core: &Core) -> bool {
    let exec = &*core.exec;
    // In this order: the count, then the flags (see `flush_live`), then the queues.
    exec.migratable.live.load(SeqCst) > 0
        || exec.loops.iter().any(|l| l.steal.spawning.load(SeqCst))
        || exec.victims(core.index()).iter().any(|&v| {
            let vs = &exec.loops[v].steal;
            !vs.stealer.is_empty() || !vs.injector.is_empty()
        })
}

/// Builds a migratable task whose first loop is `home` (one of its executor's `loops`).
fn build<F>(
    home: &Arc<crate::event_loop::LoopShared>,
    fut: F,
    info: TaskInfo,
) -> (Runnable, async_task::Task<Outcome<F::Output>, TaskMeta>)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let fut = MigrFuture {
        fut: std::mem::ManuallyDrop::new(fut),
        meta: std::ptr::null(),
        key: NO_KEY,
    };
    async_task::Builder::new()
        .metadata(TaskMeta::new(
            info,
            crate::task::MIGRATABLE_CLASS,
            home.index,
            crate::task::Home::new(home),
        ))
        .spawn(
            move |meta: &TaskMeta| {
                let mut fut = fut;
                fut.meta = meta;
                fut
            },
            schedule,
        )
}

/// Spawns a migratable task whose first loop is `home` (protocol rule 1).
///
/// `placed`: the task was placed on `home` by the caller (`Executor::spawn`'s round-robin) and
/// starts there even when spawned on another loop's worker; otherwise it starts where it is
/// scheduled from.
pub(crate) fn spawn<F>(
    exec: &Arc<ExecShared>,
    home: usize,
    placed: bool,
    fut: F,
    info: TaskInfo,
) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let rose = count_spawn(exec);
    // Callers pass a loop index (a round-robin one taken modulo the count); an executor has
    // at least one loop.
    let home = if home < exec.loops.len() { home } else { 0 };
    let (runnable, task) = build(&exec.loops[home], fut, info);
    // On a worker of the task's executor, it stays on this loop when that is `home`, or when
    // the loop is shutting down (the spawn comes from a `Drop` its stop runs): that shutdown
    // drops it, as it drops the pinned spawns such drops send (ring::evacuate). Injected into
    // a loop that had already finished its own shutdown, it ran in the next, unrelated run.
    let here = || {
        with_core(|c| {
            Arc::ptr_eq(&c.exec, exec)
                && (c.index() == home || c.mesh.try_borrow().is_ok_and(|m| m.is_stopping()))
        }) == Some(true)
    };
    if placed && !here() {
        inject(exec, home, runnable);
    } else {
        runnable.schedule();
    }
    if rose {
        ping_all_for_work(exec);
    }
    JoinHandle::new(task)
}

/// `xtc::spawn` on `core`, a loop of the task's executor: the fork-join path. The task starts
/// on this loop (for locality), on top of its deque, where a thief or a work-first join
/// (rule 6) finds it. What [`spawn`] does, without looking up the current loop again.
pub(crate) fn spawn_here<F>(core: &Core, fut: F, info: TaskInfo) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    count_spawn_here(core);
    #[cfg(test)]
    after_spawn_counted(core);
    // `core.shared` is `core.exec.loops[core.index()]`, without the two loads and the
    // bounds check.
    let (runnable, task) = build(&core.shared, fut, info);
    // Rule 1, as `queue_here` does it, less its yield check: a task made just now is not the
    // one being polled. Inline here: out of line, the call and `queue_here`'s check cost
    // about 20 instructions per spawn (callgrind).
    let unqueued = match core.deque.as_ref() {
        Some(w) => {
            w.push(runnable);
            if core.exec.eager_rebalance() {
                core.nudge.set(true);
            }
            None
        }
        None => Some(runnable),
    };
    if let Some(r) = unqueued {
        r.schedule();
    }
    JoinHandle::new(task)
}

/// What [`after_spawn_counted`] runs, once, on the executor it names: `(executor id, hook)`.
#[cfg(test)]
type SpawnHook = (u64, Box<dyn FnOnce() + Send>);

/// Test builds only: hooks into a worker's `xtc::spawn` after the spawn was counted (and the
/// loops parked without a tick were pinged, rule 4) and before the task is queued, the window
/// in which a woken thief finds nothing yet. A list: tests run in parallel, each on its own
/// executor.
#[cfg(test)]
static AFTER_SPAWN_COUNTED: std::sync::Mutex<Vec<SpawnHook>> = std::sync::Mutex::new(Vec::new());

/// Arms `hook` for the next `xtc::spawn` on a worker of executor `exec_id` (test builds).
#[cfg(test)]
pub(crate) fn arm_after_spawn_counted(exec_id: u64, hook: Box<dyn FnOnce() + Send>) {
    AFTER_SPAWN_COUNTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((exec_id, hook));
}

#[cfg(test)]
fn after_spawn_counted(core: &Core) {
    let mut armed = AFTER_SPAWN_COUNTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(i) = armed.iter().position(|(id, _)| *id == core.shared.exec_id) {
        let (_, hook) = armed.swap_remove(i);
        drop(armed);
        hook();
    }
}

/// Rule 1 off that loop's thread: queues `r` in loop `to`'s injector and pings it. Counted
/// first (`StealShared::injected`): a wake the coordinator's closing snapshot does not see
/// comes after its decision, and the woken loop's `Status::busy` then waits for that. With
/// eager rebalance on and loop `to` busy (its ping wakes nothing), rule 4's nudge goes to an
/// idle peer, as it does for work a loop queues itself: without it the task waited for a
/// peer's idle tick (up to 32 ms with backoff) and, below `min_tasks_to_steal`, for the
/// starvation override. Cost with eager rebalance: a fence and a status load, and a ping when
/// `to` is busy.
fn inject(exec: &ExecShared, to: usize, r: Runnable) {
    let l = &exec.loops[to];
    l.steal.injected.fetch_add(1, SeqCst);
    l.steal.injector.push(r);
    l.parker.unpark();
    if exec.eager_rebalance() {
        nudge_peer_of(exec, to, true);
    }
}

/// The schedule function of migratable tasks (rule 1).
pub(crate) fn schedule(r: Runnable) {
    // Compared by address only: no reference count is touched on the worker path.
    let exec_ptr = r.metadata().home.exec().as_ptr();
    {
        let Some(r) = push_on_worker(exec_ptr, r) else {
            return;
        };
        match r.metadata().home.exec().upgrade() {
            Some(e) => {
                let last = r.metadata().last_loop().min(e.loops.len() - 1);
                inject(&e, last, r);
            }
            // The executor is gone: the future is `Send`, dropping it here is fine.
            None => crate::task::cancel(r),
        }
    }
}

/// Rule 1: on a worker of `exec`, queue `r` on its deque.
fn push_on_worker(exec: *const ExecShared, r: Runnable) -> Option<Runnable> {
    let mut r = Some(r);
    with_core(|core| {
        if std::ptr::eq(Arc::as_ptr(&core.exec), exec) {
            r = queue_here(core, r.take().expect("present"));
        }
    });
    r
}

/// Rule 1 on `core`, a worker of `r`'s executor: queues `r` on its deque (or, woken during its
/// own poll, its injector); hands `r` back if the loop has no deque.
fn queue_here(core: &Core, r: Runnable) -> Option<Runnable> {
    let Some(w) = core.deque.as_ref() else {
        return Some(r);
    };
    if std::ptr::eq(r.metadata(), core.current.get()) {
        // Woken during its own poll (a yield): behind everything else, so a task that keeps
        // yielding cannot hold the top of the LIFO deque.
        core.shared.steal.injector.push(r);
    } else {
        w.push(r);
    }
    if core.exec.eager_rebalance() {
        core.nudge.set(true);
    }
    None
}

/// The next migratable task of this loop: its deque, then its own injector.
#[inline]
pub(crate) fn next_local(core: &Core) -> Option<Runnable> {
    let w = core.deque.as_ref()?;
    let inj = &core.shared.steal.injector;
    // Rule 1: the injector first every INJECTOR_EVERY picks, so what waits there (yielders,
    // wakes from other threads) runs even while the deque never empties.
    let picks = core.local_picks.get().wrapping_add(1);
    core.local_picks.set(picks);
    // Nothing queued (most looks of a loop that runs pinned work, twice per turn): two inline
    // loads each, where the pops below are an out-of-line call and a division (callgrind:
    // about 25 instructions per look). Only this loop pushes onto `w`; a push into the
    // injector racing this look is found at the next one, as it is when it lands just after
    // the pops.
    if w.is_empty() && inj.is_empty() {
        return None;
    }
    if picks % INJECTOR_EVERY == 0 {
        if let Steal::Success(r) = inj.steal() {
            return Some(r);
        }
    }
    if let Some(r) = w.pop() {
        return Some(r);
    }
    if inj.is_empty() {
        return None;
    }
    loop {
        match inj.steal_batch_and_pop(w) {
            Steal::Success(r) => return Some(r),
            Steal::Empty => return None,
            Steal::Retry => continue,
        }
    }
}

/// Rule 6: tasks one task poll may run inline at its joins. tokio's cooperative budget is 128
/// operations for the same reason: a poll that ran this many tasks has held the loop long
/// enough.
pub(crate) const INLINE_BUDGET: u32 = 128;

/// Rule 6: the stack inline joins may use below the loop's frame at `here`, on a thread whose
/// stack is `(lowest address, size)`: a quarter of what is left below the loop, at most
/// 256 KiB, so a task run inline keeps at least three quarters of the stack it would have had
/// at the top of the loop (a `LocalExecutor` may start deep in its caller's stack). None when
/// the thread's stack is unknown or `here` is not on it (a coroutine's stack, whose size
/// nobody tells). A level costs a few hundred bytes plus the task's own poll frame (about
/// 3 KiB for a small future in a debug build). Never more than `here`.
pub(crate) fn inline_stack(here: usize, stack: Option<(usize, usize)>) -> usize {
    match stack {
        Some((low, size)) if (low..low.saturating_add(size)).contains(&here) => {
            ((here - low) / 4).min(256 << 10)
        }
        _ => 0,
    }
}

/// Rule 6: runs the migratable task whose metadata is at `child` here and now if the task
/// being polled is migratable and `child` is the newest entry of this loop's deque. Called by
/// a [`JoinHandle`] about to wait for its unfinished migratable task (the handle checks the
/// kind), which keeps `child`'s header alive.
/// Cost when it does not apply: a thread-local read and a few loads; when the deque's top is
/// another task, a pop and a push.
pub(crate) fn join_inline(child: *const TaskMeta) {
    with_core(|core| {
        let left = core.inline_left.get();
        let parent = core.current.get();
        if left == 0 || parent.is_null() || crate::sys::stack_here() < core.inline_floor.get() {
            return;
        }
        // SAFETY: `current` points into the header of the task this loop is polling (set by
        // the loop, or below, around the poll), alive for the whole poll: the user code a loop
        // runs once async-task may have freed it (an awaiter woken after async-task dropped its
        // reference: a guarded foreign waker, or a cancel) runs under
        // `context::outside_task`, with `current` null.
        let parent_meta = unsafe { &*parent };
        // A pinned task awaiting migratable work keeps serving its loop while idle peers may
        // take that work; only a migratable task (fork-join) runs its child itself. The child's
        // kind is the caller's check (`JoinHandle::poll_slow`, its only caller, calls this for
        // a migratable child alone); a pinned child would not be found anyway: pinned tasks
        // are never in the deque, and the top is compared with `child` below.
        if parent_meta.class.load(Relaxed) != crate::task::MIGRATABLE_CLASS {
            return;
        }
        let r = {
            let Some(w) = core.deque.as_ref() else {
                return;
            };
            let Some(r) = w.pop() else {
                return;
            };
            if !std::ptr::eq(r.metadata(), child) {
                // Back on top: the order is unchanged (nothing else touches the top meanwhile).
                w.push(r);
                return;
            }
            r
        };
        // Run outside the block above: the child may spawn (push) onto this deque.
        core.inline_left.set(left - 1);
        core.inline_runs.set(core.inline_runs.get() + 1);
        r.metadata().last.store(core.index() as u32, Relaxed);
        /// Puts the parent back as the polled task when the inline run ends, also if it
        /// unwinds: nothing in it unwinds today (async-task contains a future's panic, and
        /// aborts on one in a drop), but one that did would reach the parent's poll, whose
        /// own panic capture would then run with the child as `current` (a child async-task
        /// may already have freed). The store runs either way.
        struct Parent<'a>(&'a Core, *const TaskMeta);
        impl Drop for Parent<'_> {
            fn drop(&mut self) {
                self.0.current.set(self.1);
            }
        }
        let _parent = Parent(core, parent);
        core.current.set(r.metadata());
        let budget = core.stall_ns.get();
        if budget == 0 {
            r.run();
        } else {
            run_timed(core, r, budget);
        }
    });
}

/// Rule 6 with the stall watchdog armed: runs `r` inline, measuring the child's own time
/// (less its own inline joins), reported under its name after the loop's poll ends when over
/// `budget` ns. Out of line, so that the unwatched join does not carry its frame.
#[inline(never)]
fn run_timed(core: &Core, r: Runnable, budget: u64) {
    let outer = core.inline_time.replace(std::time::Duration::ZERO);
    let (start, info) = (crate::clock::Tick::now(), r.metadata().info.clone());
    r.run();
    let took = crate::clock::Tick::now().since(start);
    let own = took.saturating_sub(core.inline_time.get());
    if own > std::time::Duration::from_nanos(budget) {
        core.inline_stalls.borrow_mut().push((info, own));
    }
    core.inline_time.set(outer + took);
}

/// Local picks between two looks at the loop's own injector before its deque (rule 1); tokio
/// looks at its global queue every 61 ticks, for the same reason.
const INJECTOR_EVERY: u32 = 61;

/// Whether this loop's deque or injector holds work.
pub(crate) fn has_local(core: &Core) -> bool {
    core.deque.as_ref().is_some_and(|w| !w.is_empty()) || !core.shared.steal.injector.is_empty()
}

/// Rule 2: whether this loop steals when it runs out of runnable work: when fully idle (no
/// parked task, no timer), or with eager rebalance on whatever it owns.
pub(crate) fn would_steal(core: &Core) -> bool {
    core.exec.eager_rebalance()
        || (core.registry.borrow().is_empty() && core.timers.borrow().is_empty())
}

/// Rule 3: ends a wake's waiver, kept or fresh, where the look it was for will not come: a
/// park decision that does not look ([`would_steal`] is false), or stealing switched off
/// (switched on again, the first look stole below the minimum on a ping from before). Cost:
/// two stores.
pub(crate) fn drop_waiver(core: &Core) {
    core.fresh_wake.set(false);
    let mut waiver = core.waiver.get();
    waiver.clear();
    core.waiver.set(waiver);
}

/// Rule 2 and 3: tries the victims nearest first. Returns whether it got a task (queued on
/// this loop's deque, ready for the next turn).
pub(crate) fn try_steal(core: &Core) -> bool {
    let exec = &*core.exec;
    if !exec.stealing() {
        drop_waiver(core);
        return false;
    }
    // Rule 3: the last park ended by a ping for new migratable work (`woke`), or such a ping's
    // waiver kept from a look that found nothing. Spent by the first look that finds work
    // queued: a spawner pings (rule 4) before it queues its task, so the woken thief may look
    // first and find every victim empty; it keeps the waiver then (`policy::Waiver`), for
    // its next look only, an idle tick away (the spawner's flag is up). A look that stops
    // early below is such an empty look: one that left the waiver alone let a later look,
    // after a knob setter's ping, waive the minimum on an old wake.
    let mut waiver = core.waiver.get();
    let fresh = waiver.begin(core.fresh_wake.replace(false));
    let empty_look = |mut waiver: policy::Waiver| {
        waiver.end(false);
        core.waiver.set(waiver);
        false
    };
    if !may_find_work(core) {
        // Nothing alive and no batch unpublished: the work the wake was for is gone, and with
        // nothing alive the loop parks without a tick, so a waiver kept here served whatever
        // ping came next (pinned work, a knob setter) and let that look steal below the
        // minimum. Spent instead; a publish racing this look pings again (rule 4), as a wake
        // by new work.
        waiver.end(true);
        core.waiver.set(waiver);
        return false;
    }
    let me = core.index();
    let victims = exec.victims(me);
    if victims.is_empty() {
        return empty_look(waiver);
    }
    let Some(w) = core.deque.as_ref() else {
        return empty_look(waiver);
    };
    let min = exec.min_tasks_to_steal();
    // A steal below returns at once: what `begin` left (nothing kept) is that look's end.
    core.waiver.set(waiver);
    let mut seen_work = false;
    let mut looks = core.short_looks.borrow_mut();
    looks.resize(exec.loops.len(), 0);
    let stats = &core.shared.stats;
    for &v in victims {
        let vs = &exec.loops[v].steal;
        let queued = vs.stealer.len() + vs.injector.len();
        seen_work |= queued > 0;
        if !look(queued, min, &mut looks[v], fresh) {
            continue;
        }
        let before = w.len();
        let stealing = &core.shared.steal.stealing;
        stealing.store(true, SeqCst);
        let got = loop {
            let s = match vs.stealer.steal_batch_and_pop(w) {
                Steal::Empty => vs.injector.steal_batch_and_pop(w),
                other => other,
            };
            match s {
                Steal::Retry => continue,
                other => break other,
            }
        };
        match got {
            Steal::Success(r) => {
                #[cfg(test)]
                crate::event_loop::tests::hook(crate::event_loop::tests::At::Stolen, core);
                let n = 1 + (w.len() - before) as u64;
                bump(&stats.steals, n);
                vs.stolen_from.fetch_add(n, Relaxed);
                // Run it first: push it back at the front by running it next turn.
                w.push(r);
                stealing.store(false, SeqCst);
                return true;
            }
            _ => {
                stealing.store(false, SeqCst);
                bump(&stats.steal_attempts_failed, 1);
            }
        }
    }
    waiver.end(seen_work);
    core.waiver.set(waiver);
    false
}

/// Rule 4: the idle tick while migratable tasks exist: 1 ms, or with backoff 1 ms until four
/// ticks in a row found nothing, then doubling with each further empty one up to 32 ms. `None`: park until pinged, also for a loop that would not steal
/// on waking (it owns parked tasks or timers and eager rebalance is off): ticking there woke it
/// every millisecond for nothing.
pub(crate) fn idle_tick(core: &Core) -> Option<std::time::Duration> {
    const TICK: std::time::Duration = std::time::Duration::from_millis(1); // xtc_exec(3)
    const MAX_SHIFT: u32 = 5; // 1 ms << 5 = 32 ms, xtc_exec(3)'s cap
    let exec = &*core.exec;
    if !would_steal(core)
        || !exec.stealing()
        || exec.victims(core.index()).is_empty()
        || !may_find_work(core)
    {
        return None;
    }
    if !exec.steal_backoff() {
        return Some(TICK);
    }
    let shift = core.empty_ticks.get().saturating_sub(3).min(MAX_SHIFT);
    Some(TICK * (1 << shift))
}

/// Rule 3, as a park ends (or is called off by the recheck): whether a ping for new migratable
/// work ended it, decided now, so the loop's next steal ignores the minimum. `pinged`: a ping
/// ended the park. Decided when the loop woke, not at its steal: a thief woken by another ping
/// (pinned work) that then ran that work took a spawn's ping landing meanwhile, which woke
/// nothing, for the reason it woke, and its first steal waived the minimum.
pub(crate) fn woke(core: &Core, pinged: bool) {
    core.fresh_wake
        .set(pinged && core.shared.steal.work_ping.take());
}

/// Rule 3, at the start of each park decision, before the loop's last look at its victims:
/// forgets a work ping that came while the loop was awake (it woke nothing, and that look
/// sees its work), so a later wake by another ping does not look like one. Not in the
/// decision's recheck: a ping that lands between the two is what that recheck looks again
/// for ([`work_pinged`]), and the loop that sees it then does not sleep, as one woken by it
/// would not; the flag kept, its first steal ignores the minimum as that one's does (cleared
/// there, it waited for the starvation override, 16 idle ticks).
pub(crate) fn forget_work_ping(core: &Core) {
    core.shared.steal.work_ping.forget();
}

/// Rule 3, the park's recheck (after the announcement): whether a ping for migratable work
/// came since [`forget_work_ping`]. Such a ping that landed before the announcement wrote no
/// wake-up (the loop did not sleep yet) and the announcement cleared its mark on the parker:
/// the loop slept its whole idle tick with the work queued at its victim. Cost: a load.
pub(crate) fn work_pinged(core: &Core) -> bool {
    core.shared.steal.work_ping.is_set()
}

/// Rule 4: an idle thief about to park without a tick (no sign of work) counts itself
/// tickless, after announcing its sleep and before looking again; returns whether it did. A
/// loop that would not steal anyway (policy, or no victims) is not counted: spawns need not
/// ping it. Cost: a shared read-modify-write per tickless park, and one to leave.
pub(crate) fn enter_tickless(core: &Core) -> bool {
    let exec = &*core.exec;
    if !would_steal(core) || !exec.stealing() || exec.victims(core.index()).is_empty() {
        return false;
    }
    exec.migratable.tickless.fetch_add(1, SeqCst);
    // Pairs with the fence of `show_spawning` (loom treats `SeqCst` accesses as `AcqRel`, but
    // models fences: the fences make the argument one it checks).
    fence(SeqCst);
    true
}

/// Rule 4: held from [`enter_tickless`] until the loop woke (or decided not to sleep);
/// dropped on unwind too, so a panic in the park cannot leave the count raised (every
/// spawning turn would then ping every loop).
pub(crate) struct TicklessGuard<'a>(pub(crate) &'a Arc<ExecShared>);

impl Drop for TicklessGuard<'_> {
    fn drop(&mut self) {
        self.0.migratable.tickless.fetch_sub(1, SeqCst);
    }
}

/// End of turn with eager rebalance (rule 4): ping one idle peer, unless stealing is off: then
/// no peer may take the work, and each turn that queued a migratable task woke one for nothing.
/// A peer spinning before it parks counts as idle (`StealShared::spinning`).
pub(crate) fn nudge_idle_peer(core: &Core) {
    if !core.nudge.replace(false) {
        return;
    }
    nudge_peer_of(&core.exec, core.index(), false);
}

/// Rule 4's nudge for work queued on loop `me`: pings the nearest idle peer that may steal
/// from `me`. `only_if_busy`: not when `me` itself is idle (work queued from another thread,
/// whose ping wakes `me`, which takes it).
fn nudge_peer_of(exec: &ExecShared, me: usize, only_if_busy: bool) {
    if !exec.stealing() {
        return;
    }
    // Against `nudged_before_spin`'s fence: the task this turn queued (program order before
    // this fence) is seen by a spin that raised its flag after this turn's read below missed it.
    fence(SeqCst);
    // A loop spinning before it parks is idle (its status reads BUSY until the spin ends),
    // and its spin watches `work_ping`. The flag first: cleared (`Release`) only after the
    // loop published its idle status, so a cleared flag read here shows that status.
    let busy = |v: usize| {
        let l = &exec.loops[v];
        !l.steal.spinning.load(Acquire)
            && crate::event_loop::status::kind(l.status.load(Relaxed))
                == crate::event_loop::status::BUSY
    };
    if only_if_busy && !busy(me) {
        return;
    }
    if let Some(v) = policy::nudge_target(me, exec.loops.len(), |l| exec.victims(l), busy) {
        exec.loops[v].steal.work_ping.mark();
        exec.loops[v].parker.unpark();
    }
}

/// Rule 4, as a spin before parking begins (or, for a loop that does not spin, right after
/// it published its idle status), with eager rebalance on: whether a victim's queues
/// hold migratable work this loop may take (at least the minimum, rule 3). The partner of
/// [`nudge_idle_peer`]'s fence: the caller raised its `spinning` flag (`SeqCst`) first, so a
/// nudger that read the flag down (and the loop's status BUSY) and passed this loop over had
/// queued its work before its fence, and this look, after ours, sees it; otherwise that
/// nudger sees the flag up and pings. Without it, work queued while the loop ended its turn
/// waited out the whole spin (up to 1 s) and an idle tick. Not a wake by new work: the next
/// look applies the minimum. Taken as one (the minimum waived), every loop that went idle
/// with eager rebalance on stole below the minimum, also work its last look had just found
/// short; and ignoring the minimum here instead, a short victim ended every spin at once.
/// Cost: a fence and four loads per victim, per spin or park decision.
pub(crate) fn nudged_before_spin(core: &Core) -> bool {
    let exec = &*core.exec;
    if !exec.eager_rebalance() || !exec.stealing() {
        return false;
    }
    fence(SeqCst);
    let min = exec.min_tasks_to_steal();
    exec.victims(core.index()).iter().any(|&v| {
        let vs = &exec.loops[v].steal;
        let queued = vs.stealer.len() + vs.injector.len();
        queued > 0 && queued >= min
    })
}

/// Drops the migratable tasks queued on this loop (a requested stop): every one on its deque,
/// which only this loop fills (its drops' spawns and wakes, `queue_here`), and those its
/// injector holds now (`StealShared::drop_injected`). Plain threads keep filling the
/// injector (`Handle::spawn`): emptying it, a stop never ended while they spawned faster than
/// the loop dropped; what they push from here on is kept for the next run, or dropped by
/// `run()` (`executor::drop_migratable`) or with the executor.
///
/// This bound relies on every migratable task that another thread can wake being registered
/// (`MigrFuture::poll` registers on every `Pending`): `run()`'s rounds over the registered
/// ones then drop what such a wake pushes after this pass, so only fresh spawns, which may
/// wait for the next run, can be left in an injector. A task that parks unregistered would
/// break that.
pub(crate) fn drop_local(core: &Core) {
    drop_deque(core);
    core.shared.steal.drop_injected();
}

/// [`drop_local`] less the injector: what this loop's own code queued on its deque (at a
/// quiescent stop, what the drops of its `ShardLocal` values spawned; the injector's racing
/// spawns from other threads stay for the next run).
pub(crate) fn drop_deque(core: &Core) {
    loop {
        // Popped before the drop, which may queue here again.
        let next = core.deque.as_ref().and_then(Worker::pop);
        match next {
            Some(r) => crate::task::cancel(r),
            None => break,
        }
    }
}

/// Takes the `Runnable` of the task at `meta` out of `w`, leaving the rest in their order:
/// the caller owns `w` (a loop's own deque on its thread, or a parked one under its lock).
/// Every loop's shutdown has begun, so no thief takes from it meanwhile, but another stopping
/// loop's wait may ([`take_by_stealing`]): what that wait takes it drops, and a wait that
/// wanted it sees its handle resolve (cancelled).
fn take_from_deque(w: &Worker<Runnable>, meta: *const TaskMeta) -> Option<Runnable> {
    let mut popped = Vec::new();
    let mut found = None;
    while let Some(r) = w.pop() {
        if std::ptr::eq(r.metadata(), meta) {
            found = Some(r);
            break;
        }
        popped.push(r);
    }
    // Popped newest first: pushed back oldest first.
    for r in popped.into_iter().rev() {
        w.push(r);
    }
    found
}

/// Takes the `Runnable` of the task at `meta` out of another loop's deque through its
/// `stealer` (only a deque's own loop pops from its end): what it steals before that is
/// dropped at once, here, as that loop's shutdown would drop it (every loop's shutdown has
/// begun after a requested or deadlock stop: no loop polls these tasks again; the futures are
/// `Send`). Kept on this loop's deque instead, until this wait ended, a stolen task whose drop
/// the awaited task's drop waits for (a channel end it holds) waited for good; and nothing
/// passes back and forth between two waits. Two stopping loops, each waiting in a `Drop` on a
/// task queued on the other's deque, waited for good without this. Not a steal: no count
/// moves.
fn take_by_stealing(stealer: &Stealer<Runnable>, meta: *const TaskMeta) -> Option<Runnable> {
    loop {
        match stealer.steal() {
            Steal::Success(r) if std::ptr::eq(r.metadata(), meta) => return Some(r),
            // Dropped now, as its own loop's shutdown would have: held on this loop's deque
            // until this wait ends, a task whose drop the awaited task's drop waits for
            // (a channel end it holds) waited for good.
            Steal::Success(r) => crate::task::cancel(r),
            Steal::Retry => continue,
            Steal::Empty => return None,
        }
    }
}

/// Takes the `Runnable` of the task at `meta` out of `injector`: one pass over what it held
/// when called, the others pushed back in the order taken (behind what other threads push
/// meanwhile).
fn take_from_injector(injector: &Injector<Runnable>, meta: *const TaskMeta) -> Option<Runnable> {
    let mut left = injector.len();
    let mut found = None;
    while left > 0 {
        match injector.steal() {
            Steal::Success(r) => {
                left -= 1;
                if found.is_none() && std::ptr::eq(r.metadata(), meta) {
                    found = Some(r);
                } else {
                    injector.push(r);
                }
            }
            Steal::Retry => continue,
            Steal::Empty => break,
        }
    }
    found
}

/// Ring rule 3c for a migratable task: a drop that this loop's shutdown runs waits on the
/// join handle of the migratable task at `awaited` (of this executor), which is not over.
/// Parked, such a task was dropped only once every loop had stopped (`run()`'s
/// [`drop_migratable`](crate::executor::drop_migratable)), which waited for this drop: the
/// wait never ended. Once every loop of this run has begun its shutdown
/// (`LoopShared::shut_run`), no loop polls the task again (a stopping loop polls nothing,
/// and only loops poll migratable tasks): its one fate is to be dropped unrun, so it is
/// dropped here, its handle cancelled. While some loop has not begun its shutdown, that loop
/// may still run the task (woken in its last turns), and the task is left to it.
///
/// How: a parked task has no `Runnable`; its registry waker (rule 5) is woken here, on this
/// loop's thread, which queues it on this loop's deque (rule 1). One already queued is where
/// a wake put it: a stopping loop's deque, which that loop's shutdown drops (its own run:
/// the handle resolves), this loop's deque, an injector (a wake off any loop, into its last
/// loop's: drained by no loop once that loop has stopped), or the deque a loop gave back as
/// it stopped. All are searched (its deque, every injector, the parked deques, then the other
/// loops' deques through their stealers, except at a quiescent stop, which keeps queued tasks
/// for the next run), the task's `Runnable` taken out and dropped, the rest left in their
/// order (what is stolen before it is dropped at once, its fate at this stop). A
/// `Runnable` in flight (pushed by another thread a moment later) is found by the next poll.
/// Returns whether the wait must poll again (in 1 ms): the task was not found (left to a
/// loop, or in flight, or being dropped by another loop's shutdown).
///
/// Sound: the waker's clone (under the registry's lock) keeps the task's allocation alive,
/// and a wake of a task that is queued, running its cancel or over does nothing (async-task);
/// the `Runnable` taken is the task's only one, dropped once by [`crate::task::cancel`], the
/// same drop the sweeps would do (the future is `Send`: any thread may drop it). Cost:
/// nothing outside such a wait; in one, a load per loop, then a scan of the registry and of
/// every injector and deque.
pub(crate) fn cancel_awaited_at_stop(core: &Core, awaited: *const TaskMeta) -> bool {
    let exec = &*core.exec;
    let run = exec.run_id();
    let me = core.index();
    if exec
        .loops
        .iter()
        .enumerate()
        .any(|(i, l)| i != me && l.shut_run.load(SeqCst) != run)
    {
        return true;
    }
    if let Some(w) = exec.migratable.registered_waker(awaited) {
        // Outside the registry's lock: the wake queues the task (rule 1) on this loop's deque.
        w.wake();
    }
    let found = core
        .deque
        .as_ref()
        .and_then(|w| take_from_deque(w, awaited))
        .or_else(|| {
            exec.loops
                .iter()
                .find_map(|l| take_from_injector(&l.steal.injector, awaited))
        })
        .or_else(|| exec.migratable.take_parked(awaited))
        .or_else(|| {
            // A quiescent stop keeps what is queued for the next run.
            if exec.seen_stop_reason() == crate::executor::StopReason::Quiescent as u32 {
                return None;
            }
            exec.loops
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != me)
                .find_map(|(_, l)| take_by_stealing(&l.steal.stealer, awaited))
        });
    match found {
        Some(r) => {
            crate::task::cancel(r);
            false
        }
        None => true,
    }
}

/// Whether this loop's deque holds a task (a stopping loop's drops may queue there).
pub(crate) fn deque_queued(core: &Core) -> bool {
    core.deque.as_ref().is_some_and(|w| !w.is_empty())
}

#[cfg(test)]
mod tests {
    use super::inline_stack;

    #[test]
    fn inline_joins_get_a_quarter_of_the_stack_left_below_the_loop_at_most_256_kib() {
        let low = 0x10_0000;
        // 2 MiB thread, loop near its top: the cap.
        assert_eq!(
            inline_stack(low + (2 << 20) - 64, Some((low, 2 << 20))),
            256 << 10
        );
        // 200 KiB left below the loop: a quarter of that.
        assert_eq!(
            inline_stack(low + (200 << 10), Some((low, 2 << 20))),
            50 << 10
        );
        assert_eq!(inline_stack(low, Some((low, 2 << 20))), 0);
    }

    #[test]
    fn off_the_threads_own_stack_or_unknown_inline_joins_get_none() {
        let low = 0x10_0000;
        // A coroutine's stack above the thread's (its end is unknown) or below it.
        assert_eq!(inline_stack(low + (3 << 20), Some((low, 2 << 20))), 0);
        assert_eq!(inline_stack(low - 4096, Some((low, 2 << 20))), 0);
        assert_eq!(inline_stack(low + (2 << 20), Some((low, 2 << 20))), 0);
        assert_eq!(inline_stack(low + 4096, None), 0);
    }
}
