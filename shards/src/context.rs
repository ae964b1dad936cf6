//! The thread-local pointer to the loop running on this thread, and everything that reaches
//! the loop through it (local run queue, task registry, timers).

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    ptr,
    sync::Arc,
    task::Waker,
};

use crossbeam_deque::Worker;
use slab::Slab;

use crate::{
    event_loop::LoopShared,
    executor::ExecShared,
    ring::LocalMesh,
    task::{Runnable, TaskInfo, TaskMeta},
    timer::Timers,
};

/// A parked-or-running task the loop owns (task protocol rule 3).
///
/// The waker is an owned reference: it keeps the task allocated while it is registered. It
/// must be: async-task frees a pending task that has no waker and no handle left *without*
/// dropping its future (its `run`, `Poll::Pending` arm, then `drop_ref` → `destroy`), which would
/// leak the future and leave this entry dangling. Holding it costs one reference-count
/// increment and decrement per task.
#[derive(Debug)]
pub(crate) struct Entry {
    waker: Waker,
    /// The task's metadata in its async-task header, kept alive by `waker`.
    meta: *const TaskMeta,
}

impl Entry {
    /// Schedules the task (shutdown).
    pub(crate) fn wake(&self) {
        self.waker.wake_by_ref();
    }

    /// Name and spawn site.
    pub(crate) fn info(&self) -> &TaskInfo {
        // SAFETY: `meta` points into the header of a registered task, which this entry's own
        // waker (a reference to the task) keeps allocated for as long as the entry lives.
        unsafe { &(*self.meta).info }
    }
}

/// The loop-local half of a loop: touched only by its own thread. `!Send`, `!Sync`.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) shared: Arc<LoopShared>,
    pub(crate) exec: Arc<ExecShared>,
    pub(crate) queue: RefCell<VecDeque<Runnable>>,
    pub(crate) timers: RefCell<Timers>,
    pub(crate) registry: RefCell<Slab<Entry>>,
    pub(crate) mesh: RefCell<LocalMesh>,
    pub(crate) tasks_done: Cell<u64>,
    /// Spare units of this loop's task references, banked while it runs
    /// (`task/home.rs` rule 2): a task made or freed here takes or returns one without an
    /// atomic. Given back when the `Core` is dropped (rule 4).
    pub(crate) home_bank: Cell<usize>,
    /// [`task::cancel`](crate::task::cancel) is dropping a pinned task of another loop here (a
    /// spawn for a stopped peer that this loop's shutdown drops, `ring::evacuate`): its end is
    /// not this loop's to count, nor its registry key this loop's to remove (`task_dropped`).
    pub(crate) dropping_foreign: Cell<bool>,
    /// The I/O counts of earlier runs (this run's reactor counts from zero).
    pub(crate) io_base: (u64, u64),
    /// End (exclusive) of the block of turn stamps this loop reserved ([`TURN`]).
    pub(crate) stamps_end: Cell<u64>,
    /// End-of-turn signals registered this turn.
    pub(crate) flushes: RefCell<Vec<Arc<dyn Flush>>>,
    /// This loop's deque of migratable tasks (steal/mod.rs); `None` only while another live
    /// `Core` of the same loop holds it (none does once a run's `Core` is dropped before its
    /// leftovers' drops, which may run the loop again). Set when the `Core` is built and taken
    /// only by its drop, so no `RefCell`: the `Worker`'s methods take `&self`, and a borrow
    /// flag cost a check, an increment and a decrement at each of the loop's looks at it
    /// (twice a turn, and every poll of a spin).
    pub(crate) deque: Option<Worker<Runnable>>,
    /// A migratable task was queued this turn with eager rebalance on: ping an idle peer.
    pub(crate) nudge: Cell<bool>,
    /// The loop's last park ended by a ping for new migratable work (`steal::woke`): its
    /// next steal ignores the minimum (steal rule 3).
    pub(crate) fresh_wake: Cell<bool>,
    /// Steal rule 3: the waiver of the minimum across looks (`policy::Waiver`): one from a
    /// ping for new work that the loop's first look after it could not use, every victim
    /// still empty (the spawner pings before it queues). Kept, unlike
    /// [`fresh_wake`](Self::fresh_wake), across the next wake, for the loop's next look only.
    pub(crate) waiver: Cell<crate::steal::policy::Waiver>,
    /// Consecutive short looks per victim (steal rule 3).
    pub(crate) short_looks: RefCell<Vec<u32>>,
    /// Migratable picks so far (steal/mod.rs rule 1: the periodic injector look).
    pub(crate) local_picks: Cell<u32>,
    /// Consecutive idle ticks that found nothing (steal backoff).
    pub(crate) empty_ticks: Cell<u32>,
    /// Whether this loop has scheduling classes (class.rs): the one branch of the FIFO path.
    pub(crate) classes_active: Cell<bool>,
    /// Classes picked up so far (vs `LoopShared::class_count`).
    pub(crate) classes_seen: Cell<usize>,
    pub(crate) lanes: RefCell<crate::class::Lanes>,
    /// When the current task poll started, while classes or the watchdog need it.
    pub(crate) poll_started: Cell<Option<crate::clock::Tick>>,
    /// Metadata of the task being polled (null between polls).
    pub(crate) current: Cell<*const TaskMeta>,
    /// Migratable tasks spawned minus finished on this loop this turn (steal::flush_live).
    pub(crate) migr_delta: Cell<i64>,
    /// This turn's `spawning` flag is up (steal/mod.rs rule 4; mirrors the shared one).
    pub(crate) spawning: Cell<bool>,
    /// Set by `yield_if_due` when it yields (and by an `Interval` tick that yields before it
    /// completes): the batch ends after the current poll.
    pub(crate) end_batch: Cell<bool>,
    /// Calls that complete without a loop turn (ready epoll calls, sleeps found past their
    /// deadline, `send_to` and `submit_to` to the caller's own shard) the task being polled
    /// may still make before its next one yields (`context::coop_spend`), plus the refusals
    /// after them ([`COOP_REFUSALS`]): set to [`COOP_FRESH`] before each poll of a task by the
    /// loop (a migratable task run inline at a join, steal/mod.rs rule 6, shares the budget of
    /// the poll that joined it). Above
    /// `COOP_REFUSALS` a call spends; at or below it, each call is refused and counts down, and
    /// the last refusal refills it (`Core::coop_refuse`).
    pub(crate) coop_left: Cell<u32>,
    /// A `submit_to` polled on this loop by a pinned task waits for its reply from another
    /// shard (set when its join returns `Pending`, taken at the park decision): the loop spins
    /// up to the reply spin before it parks, so the reply needs no wake-up of its own. (A
    /// migratable caller's reply wakes it on the target's loop: nothing to spin for here.)
    pub(crate) reply_awaited: Cell<bool>,
    /// How many of those joins still wait (counted at their first waiting poll here, uncounted
    /// when they resolve or are dropped): the reply spin is due only while one does, or a
    /// reply handled before the loop ran out of work left it spinning for nothing.
    pub(crate) replies_awaited: Cell<usize>,
    /// This `Core`'s own identity (one per loop and run, never reused in the process): what a
    /// join counted in `replies_awaited` remembers, so that it takes itself off this count
    /// only. The loop's `uid` is the same in every run, and a join kept from one run to the next
    /// (returned by a `block_on`) took itself off the next run's count.
    pub(crate) id: u64,
    /// Work-first joins the task being polled may still run inline (steal/mod.rs rule 6): set
    /// before each poll of a migratable task, which the loop picks from its deque or
    /// injector only; read only while `current` names a task (never between polls), and of
    /// no use to a pinned one, whose joins run nothing inline.
    pub(crate) inline_left: Cell<u32>,
    /// Work-first joins run this turn (counted as polls at the end of the turn).
    pub(crate) inline_runs: Cell<u64>,
    /// Work-first joins nest on the stack: none starts below this address (steal/mod.rs
    /// rule 6). Set when the loop starts running; `usize::MAX` (none at all) until then.
    pub(crate) inline_floor: Cell<usize>,
    /// The stall budget (ns, 0 = watchdog off) of the current loop turn.
    pub(crate) stall_ns: Cell<u64>,
    /// Time the current poll spent in inline joins (the stall watchdog's, while armed): not
    /// the polled task's own.
    pub(crate) inline_time: Cell<std::time::Duration>,
    /// Inline joins of the current poll that overran the stall budget: reported by the loop
    /// after the poll, under their own name (the stall watchdog's, while armed).
    pub(crate) inline_stalls: RefCell<Vec<(crate::task::TaskInfo, std::time::Duration)>>,
    /// The interval (ns, 0 = off) this loop last armed its CPU-time preemption timer for, or
    /// tried to (`preempt::sync_timer` compares it with the executor's setting).
    pub(crate) preempt_ns: Cell<u64>,
    /// This loop's CPU-time preemption timer, while armed (`sys/cputimer.rs`).
    pub(crate) preempt_timer: RefCell<Option<crate::sys::cputimer::CpuTimer>>,
    /// This run's [`ShardLocal`](crate::ShardLocal) values (`shard_local.rs`), dropped by the
    /// loop's shutdown after its tasks ([`Core::drop_shard_locals`]).
    pub(crate) locals: RefCell<crate::shard_local::Table>,
    /// The loop's I/O driver, which is also its park (io/mod.rs). Declared last: dropped after
    /// the tasks' state above, it cancels and waits out what is still in flight.
    pub(crate) io: crate::io::Reactor,
}

/// Something to do once at the end of the loop turn in which it was registered: the batched
/// wake of a channel's other side.
pub(crate) trait Flush: Send + Sync + std::fmt::Debug {
    fn flush(&self);
}

thread_local! {
    /// The stamp of the loop turn running on this thread, 0 off any loop. Stamps are unique in
    /// the process for its whole life: a loop takes them in blocks of [`STAMP_BLOCK`] from
    /// [`STAMPS`] (one atomic add per block), so a stamp a channel end remembers from an old
    /// turn, of this loop or of a loop long gone, never matches a later turn.
    static TURN: Cell<u64> = const { Cell::new(0) };
}

/// Turn stamps handed out so far (the next free one); 0 is never handed out.
static STAMPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
/// Stamps a loop reserves at once: one atomic add per million turns. 2^64 stamps last centuries
/// at a billion turns a second.
const STAMP_BLOCK: u64 = 1 << 20;

/// Reserves a fresh block of turn stamps; returns its first stamp and its end.
fn reserve_stamps() -> (u64, u64) {
    let first = STAMPS.fetch_add(STAMP_BLOCK, std::sync::atomic::Ordering::Relaxed);
    (first, first + STAMP_BLOCK)
}

/// The key of a flush never registered ([`schedule_flush`]): no turn stamp (stamps count up
/// from 1 and would take centuries to get near it), and not the 0 of off any loop.
pub(crate) const NEVER_FLUSHED: u64 = u64::MAX;

/// Registers `f` to run at the end of the current loop turn, once per turn per `key` (the stamp
/// of the turn it was last registered in, [`NEVER_FLUSHED`] for never); off any loop it runs at
/// once.
///
/// Cost: one thread-local read and a compare when `f` is already registered this turn, else a
/// reference-count increment and a push. A channel's per-message path makes the check alone
/// ([`flush_scheduled`], inlined into its generic code: a GOT load and an `%fs`-relative load,
/// checked with objdump in a user's binary) and calls this only when it fails; the
/// registration stays a call. As a call the check cost ~21 instructions per message (send
/// plus recv, callgrind: 150 -> 129 per message).
#[inline]
pub(crate) fn schedule_flush(key: &mut u64, f: &Arc<dyn Flush>) {
    if flush_scheduled(*key) {
        return;
    }
    schedule_flush_slow(key, f, TURN.with(Cell::get));
}

/// Whether the flush whose key is `key` ([`schedule_flush`]) is registered in the current loop
/// turn: false off any loop. The per-message check of [`schedule_flush`], for a caller that
/// keeps the registration itself out of line.
#[inline]
pub(crate) fn flush_scheduled(key: u64) -> bool {
    // A key is only ever `NEVER_FLUSHED` or a stamp taken on a loop (never 0: the slow path
    // stores a stamp only when it registered on a loop), so an equal stamp is never the 0 of
    // off any loop, where the flush must run every time: no separate test for 0 (two
    // instructions per message per side, callgrind).
    debug_assert_ne!(key, 0);
    TURN.with(Cell::get) == key
}

/// The first registration in a turn (or the flush itself, off any loop).
#[inline(never)]
fn schedule_flush_slow(key: &mut u64, f: &Arc<dyn Flush>, stamp: u64) {
    let scheduled = stamp != 0
        && with_core(|core| {
            core.flushes.borrow_mut().push(f.clone());
        })
        .is_some();
    if scheduled {
        *key = stamp;
    } else {
        f.flush();
    }
}

impl Core {
    /// Runs and clears the end-of-turn flushes, then starts a new turn.
    pub(crate) fn run_flushes(&self) {
        self.next_turn();
        if self.flushes.borrow().is_empty() {
            // The common turn: nothing registered, no list to take, drain and put back.
            return;
        }
        let mut list = std::mem::take(&mut *self.flushes.borrow_mut());
        for f in list.drain(..) {
            f.flush();
        }
        let mut cur = self.flushes.borrow_mut();
        if cur.is_empty() {
            *cur = list;
        }
    }
}

impl Core {
    /// Sends this turn's deferred wakes now: the end-of-turn flushes (a channel's batched
    /// wake of its other side), the ring mesh's pings (a task queued or woken on another
    /// loop) and eager rebalance's nudge of an idle peer (a migratable task queued here,
    /// which a loop that blocks cannot run: `steal::nudge_idle_peer`). For a wait that
    /// returns `Pending` to a waker other than the polled task's own on a loop thread: that
    /// may be a foreign executor inside the task
    /// (`futures::executor::block_on`), which blocks the thread until it is woken, so this
    /// turn never ends; what the wait depends on (the other end of a channel, a task on
    /// another loop) then slept on for good. What the ring flush could not move for a full
    /// ring (a backlog) waits with `waker` for the consumer to make room (ring rule 3b), as
    /// the end of a turn that may never come would have retried it. Cost: what the end of the
    /// turn would have cost, earlier; a later message in the same turn registers its flush
    /// again; with a backlog left, a lock and a swap per backlogged ring. In a drop that this
    /// loop's shutdown runs, also that shutdown's handover to loops that have stopped
    /// ([`ring::wait_in_shutdown`](crate::ring::wait_in_shutdown)).
    pub(crate) fn flush_deferred(&self, waker: &Waker) {
        self.flush_deferred_on(waker, std::ptr::null());
    }

    /// [`flush_deferred`](Self::flush_deferred) for a wait on the task whose metadata is at
    /// `awaited` (null: none), which a stopping loop drops rather than keeps for the next run
    /// of a loop that has stopped ([`ring::wait_in_shutdown`](crate::ring::wait_in_shutdown)).
    pub(crate) fn flush_deferred_on(&self, waker: &Waker, awaited: *const crate::task::TaskMeta) {
        self.send_deferred();
        crate::ring::wait_backlogs_foreign(self, waker);
        crate::ring::wait_in_shutdown(self, waker, awaited);
    }

    /// [`flush_deferred`](Self::flush_deferred) without the wait for ring space: the turn's
    /// end-of-turn flushes, ring pings and eager rebalance's nudge, sent now. Also as
    /// [`off_loop`] hides the loop, and as another executor's `run()` or `block_on` called
    /// inside a task blocks this loop's thread until that executor stops. Cost: as
    /// `flush_deferred`'s, less the backlog wait (no lock or swap per backlogged ring).
    fn send_deferred(&self) {
        if self.has_flushes() {
            self.run_flushes();
        }
        crate::ring::flush(self);
        crate::steal::nudge_idle_peer(self);
    }

    /// Whether end-of-turn flushes wait for the next turn: registered while this turn's ran
    /// (a flush wakes a waker, which is user code when custom, and may send on a channel), or
    /// by the wakes of `ring::flush`. The loop takes another turn rather than park on them:
    /// parked, it left that channel's other side asleep for good.
    pub(crate) fn has_flushes(&self) -> bool {
        !self.flushes.borrow().is_empty()
    }

    /// Moves [`TURN`] to a fresh stamp: flushes registered from now on belong to a new turn.
    fn next_turn(&self) {
        let next = TURN.with(Cell::get) + 1;
        if next >= self.stamps_end.get() {
            let (first, end) = reserve_stamps();
            self.stamps_end.set(end);
            TURN.with(|t| t.set(first));
        } else {
            TURN.with(|t| t.set(next));
        }
    }

    pub(crate) fn new(shared: Arc<LoopShared>, exec: Arc<ExecShared>) -> Core {
        // The driver first: its setup may log (a failed io_uring or epoll setup), and a
        // subscriber that panics then unwinds out of here. Taken before it, the loop's deque
        // and ring ends were lost with the unwind, for this run's peers and every later run.
        let io = crate::io::Reactor::new(exec.io_driver, shared.parker.fd());
        shared.stats.io_driver.store(
            match io.kind() {
                Some(crate::io::Driver::IoUring) => 1,
                Some(crate::io::Driver::Epoll) => 2,
                None => 0,
            },
            std::sync::atomic::Ordering::Relaxed,
        );
        let deque = exec.migratable.take_worker(shared.index);
        let mut mesh = exec.mesh.take(shared.index);
        // Ring counts continue across runs (quiescence compares totals).
        mesh.sent = shared
            .stats
            .messages_sent
            .load(std::sync::atomic::Ordering::Relaxed);
        mesh.received = shared
            .stats
            .messages_received
            .load(std::sync::atomic::Ordering::Relaxed);
        mesh.handed_over = shared
            .stats
            .messages_handed_over
            .load(std::sync::atomic::Ordering::Relaxed);
        // Like the ring counts, `LoopStats` totals continue across runs.
        let stats = &shared.stats;
        let tasks_done = stats.tasks_run.load(std::sync::atomic::Ordering::Relaxed);
        let io_base = (
            stats
                .io_submitted
                .load(std::sync::atomic::Ordering::Relaxed),
            stats
                .io_completed
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let first_timer = shared
            .timer_generation
            .load(std::sync::atomic::Ordering::Relaxed);
        Core {
            io,
            mesh: RefCell::new(mesh),
            shared,
            exec,
            queue: RefCell::new(VecDeque::with_capacity(1024)),
            locals: RefCell::default(),
            timers: RefCell::new(Timers::new(first_timer)),
            registry: RefCell::new(Slab::with_capacity(1024)),
            tasks_done: Cell::new(tasks_done),
            home_bank: Cell::new(0),
            dropping_foreign: Cell::new(false),
            io_base,
            stamps_end: Cell::new(0),
            flushes: RefCell::new(Vec::new()),
            deque,
            nudge: Cell::new(false),
            fresh_wake: Cell::new(false),
            waiver: Cell::new(crate::steal::policy::Waiver::default()),
            short_looks: RefCell::new(Vec::new()),
            local_picks: Cell::new(0),
            empty_ticks: Cell::new(0),
            classes_active: Cell::new(false),
            classes_seen: Cell::new(0),
            lanes: RefCell::new(crate::class::Lanes::new()),
            poll_started: Cell::new(None),
            current: Cell::new(ptr::null()),
            migr_delta: Cell::new(0),
            spawning: Cell::new(false),
            end_batch: Cell::new(false),
            coop_left: Cell::new(COOP_FRESH),
            reply_awaited: Cell::new(false),
            replies_awaited: Cell::new(0),
            id: {
                // A counter, not a protocol: std's atomic under loom too (as `NEXT_JOB`).
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            inline_left: Cell::new(0),
            inline_runs: Cell::new(0),
            inline_floor: Cell::new(usize::MAX),
            stall_ns: Cell::new(0),
            inline_time: Cell::new(std::time::Duration::ZERO),
            inline_stalls: RefCell::new(Vec::new()),
            preempt_ns: Cell::new(0),
            preempt_timer: RefCell::new(None),
        }
    }

    pub(crate) fn index(&self) -> usize {
        self.shared.index
    }

    /// Whether `l` is the loop this `Core` runs (compared by address). Cost: a compare.
    #[inline]
    pub(crate) fn runs(&self, l: *const LoopShared) -> bool {
        ptr::eq(Arc::as_ptr(&self.shared), l)
    }

    /// Whether a pinned task waits to run here: in the FIFO, or in a class lane (re-read each
    /// time: a class created during a turn turns the lanes on mid-turn, and a task queued in
    /// one must not be left behind by a park, where no timer would end it).
    pub(crate) fn pinned_queued(&self) -> bool {
        !self.queue.borrow().is_empty()
            || (self.classes_active.get() && crate::class::any_queued(self))
    }

    /// Queues a runnable pinned task of this loop: the plain FIFO, or its class lane once the
    /// loop has classes (one branch, and a load of the task's class while it has none).
    #[inline]
    pub(crate) fn enqueue(&self, r: Runnable) {
        if self.classes_active.get() {
            crate::class::enqueue(self, r);
            return;
        }
        let class = r
            .metadata()
            .class
            .load(std::sync::atomic::Ordering::Relaxed);
        if class != 0 && class != crate::task::MIGRATABLE_CLASS {
            self.enqueue_first_class(r);
            return;
        }
        self.queue.borrow_mut().push_back(r);
    }

    /// [`enqueue`](Self::enqueue) of a task of a class while the loop has none: the loop's first
    /// class, created (from another thread, or by `Handle`) since the loop last looked, whose
    /// task arrived first. Picks the class up now; without this, that task's poll ran in the
    /// default lane.
    #[cold]
    fn enqueue_first_class(&self, r: Runnable) {
        self.sync_classes(true);
        if self.classes_active.get() {
            crate::class::enqueue(self, r);
        } else {
            self.queue.borrow_mut().push_back(r);
        }
    }

    /// Picks up classes created on this loop since it last looked: when their count moved,
    /// or at once with `force` (a task of an unknown class is being queued: its class is in
    /// the list, which the count may not show yet). Cost: a load; a lock when something is new.
    ///
    /// Classes that become active in the middle of a poll (the loop's first class, created by
    /// the running task, or by `Handle::create_class` or another shard and picked up here by
    /// a spawn into it or by `yield_if_due`) take effect within this poll: it is timed from
    /// now, and the batch ends after it. The rest of the turn would run on the flags read at
    /// its start (no class: the plain FIFO, polls untimed), so a task polled after this one
    /// could neither be picked from a lane nor see `yield_if_due` yield for a latency task
    /// (no poll start to measure): a task computing under `yield_if_due` starved a latency
    /// task for as long as it computed. Outside a poll (the turn's own look, a task queued
    /// from the inbox or a ring) the turn's batch reads the flags afresh.
    pub(crate) fn sync_classes(&self, force: bool) {
        let created = self
            .shared
            .class_count
            .load(std::sync::atomic::Ordering::Relaxed);
        if force || created != self.classes_seen.get() {
            self.classes_seen.set(created);
            let was_active = self.classes_active.get();
            let active = self.lanes.borrow_mut().sync(&self.shared);
            self.classes_active.set(active);
            if active && !was_active && !self.current.get().is_null() {
                self.classes_began_mid_poll();
            }
        }
    }

    /// See [`sync_classes`](Self::sync_classes): this poll began no later than now, and the
    /// batch ends after it; the next turn picks by lanes and times its polls.
    #[cold]
    fn classes_began_mid_poll(&self) {
        if self.poll_started.get().is_none() {
            self.poll_started.set(Some(crate::clock::Tick::now()));
        }
        self.end_batch.set(true);
    }
}

impl Core {
    /// The shutdown's end of this run's [`ShardLocal`](crate::ShardLocal) values: closes the
    /// table (a later `get` is `Err(Stopped)`) and drops them here, each under
    /// [`guarded`](crate::task::guarded) (a value's `Drop` is user code). True if there were
    /// any: what their drops did (wakes, spawns, messages) needs another pass of the shutdown.
    pub(crate) fn drop_shard_locals(&self) -> bool {
        let values = self.locals.borrow_mut().close();
        let mut any = false;
        for slot in values {
            if let crate::shard_local::Slot::Ready(v) = slot {
                any = true;
                crate::task::guarded("a ShardLocal value panicked while being dropped", || {
                    drop(v)
                });
            }
        }
        any
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // A shutdown that a panic cut short left the run's `ShardLocal` values here: dropped
        // guarded (their `Drop` is user code, and this may run while that panic unwinds,
        // where a second one aborted the process). After a full shutdown the table is empty.
        self.drop_shard_locals();
        // `task/home.rs` rule 4: this thread's current loop is no longer this `Core` (the
        // `Enter` guard that set it borrowed the `Core`), so nothing banks here after this.
        let banked = self.home_bank.replace(0);
        if banked > 0 {
            // SAFETY: the bank owns `banked` units of this loop; `self.shared` keeps it alive.
            unsafe { crate::task::release_units(Arc::as_ptr(&self.shared), banked) };
        }
        // The next run's timers start after this one's (`LoopShared::timer_generation`);
        // always stored: the shutdown left `u64::MAX` there.
        let next = self.timers.get_mut().next_generation();
        self.shared
            .timer_generation
            .store(next, std::sync::atomic::Ordering::Relaxed);
        // Ring protocol rule 1: give the ring ends back for the next run.
        let mesh = self.mesh.replace(LocalMesh::none(self.shared.index));
        self.exec.mesh.give_back(mesh, &self.exec.loops);
        if let Some(w) = self.deque.take() {
            self.exec.migratable.give_back_worker(self.shared.index, w);
        }
    }
}

thread_local! {
    static CURRENT: Cell<*const Core> = const { Cell::new(ptr::null()) };
    /// The innermost loop of this thread that [`off_loop`] hides (a list through the
    /// `Hidden` nodes on `off_loop`'s stack frames): still alive, and still the owner of its I/O
    /// driver ([`with_own_core`]). A raw pointer, so the thread-local has no destructor: I/O
    /// objects may be dropped by other thread-locals' destructors at thread exit, after a
    /// destructor of this one would have run (reading it then panicked, and the process
    /// aborted).
    static HIDDEN: Cell<*const Hidden> = const { Cell::new(ptr::null()) };
}

/// Makes `core` the current loop of this thread until the guard drops.
pub(crate) struct Enter<'a> {
    prev: *const Core,
    _core: std::marker::PhantomData<&'a Core>,
}

impl Drop for Enter<'_> {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.prev));
        TURN.with(|t| t.set(0));
    }
}

/// Whether a run of loop `shared` may start on this thread: no loop runs here, and no run of
/// `shared` is hidden here by [`off_loop`] (see [`enter`], which asks this; a caller may ask
/// before it builds the `Core` to enter). Cost: a thread-local read and a scan of the hidden
/// loops.
pub(crate) fn may_enter(shared: &Arc<LoopShared>) -> bool {
    CURRENT.with(Cell::get).is_null()
        && with_own_core(|c| Arc::ptr_eq(&c.shared, shared).then_some(())).is_none()
}

/// Enters `core`. Returns `None` if this thread already runs a loop, or if [`off_loop`] hides
/// a run of `core`'s own loop (a `LocalExecutor::block_on` re-entered from a `Drop` that a
/// sweep runs inside one of its tasks): two `Core`s of one loop on one thread took each
/// other's tasks (the loop's inbox and wakes are shared) and registry keys, and the outer run
/// waited for good for a task the inner one had finished. Cost: a scan of the hidden loops,
/// once per run.
pub(crate) fn enter(core: &Core) -> Option<Enter<'_>> {
    if !may_enter(&core.shared) {
        return None;
    }
    CURRENT.with(|c| {
        c.set(core as *const Core);
        // A fresh turn: stamps of an earlier run of this core (or of any loop) never recur.
        core.stamps_end.set(0);
        core.next_turn();
        Some(Enter {
            prev: ptr::null(),
            _core: std::marker::PhantomData,
        })
    })
}

/// Runs `f` as if this thread ran no loop: for dropping another executor's queued tasks
/// (`ExecShared::sweep`), which may happen inside a task of a running loop. Without it, those
/// tasks' drops counted as finished on the running loop (`task_dropped`), and a `Drop` that
/// spawned put its task on that unrelated loop. Restores the loop (and its turn) afterwards,
/// also on unwind. The hidden loop still owns its I/O driver: [`with_own_core`] finds it, so
/// an I/O operation dropped meanwhile is cancelled on it rather than taken for an orphan of a
/// driver that is gone (whose buffer was then freed under the kernel). New I/O started
/// meanwhile is not put on it (`io::with_running_reactor`): it would wait for the loop to turn
/// again, so it fails as off any loop. The loop's deferred wakes of this turn are sent
/// before it hides (`Core::flush_deferred`'s, less its wait for ring space). Cost: two
/// thread-local swaps and a push and pop each way, and the turn's deferred wakes sent
/// early.
pub(crate) fn off_loop<R>(f: impl FnOnce() -> R) -> R {
    struct Restore {
        current: *const Core,
        turn: u64,
        /// `HIDDEN` before this call.
        outer: *const Hidden,
    }
    impl Drop for Restore {
        fn drop(&mut self) {
            HIDDEN.with(|h| h.set(self.outer));
            CURRENT.with(|c| c.set(self.current));
            TURN.with(|t| t.set(self.turn));
        }
    }
    // The turn's deferred wakes go first: user code run hidden may block the thread on what
    // they wake (a `futures::executor::block_on` of a call sent this turn to a sleeping
    // shard, whose ring ping waits for the end of the turn), and a wait's early send
    // (`Core::flush_deferred`) cannot reach a hidden loop. Sent later, at the turn's end, the
    // block never ended.
    before_blocking_the_turn();
    let current = CURRENT.with(|c| c.replace(ptr::null()));
    let outer = HIDDEN.with(Cell::get);
    // On this frame, and declared before `_restore`, which takes it out of the list (also on
    // unwind) before it goes.
    let node = Hidden {
        core: current,
        outer,
    };
    let _restore = Restore {
        current,
        turn: TURN.with(|t| t.replace(0)),
        outer,
    };
    if !current.is_null() {
        HIDDEN.with(|h| h.set(&node));
    }
    f()
}

/// For code about to block this thread inside the running loop's turn (a hidden section,
/// another executor's run, a blocking job run inline): sends the turn's deferred wakes now
/// (`Core::send_deferred`), since the turn's end, which would send them, comes only after the
/// block, and what the block waits on may need them. Nothing off a loop. Cost: as
/// `send_deferred`'s.
pub(crate) fn before_blocking_the_turn() {
    with_core(Core::send_deferred);
}

/// What a wait polled with a foreign `waker` on this thread sends first: the running loop's
/// deferred wakes and rule 3b backlog wait (`Core::flush_deferred`), or, with no loop running,
/// for the innermost loop that [`off_loop`] hides (whose turn's wakes went as it hid), its backlogs' moves into the rings
/// and their rule 3b wait, which only that loop can do: a `futures::executor::block_on` in a
/// drop run hidden, of a call the task left in the loop's backlog (its ring full), waited for
/// good. Cost: as `flush_deferred`'s; with the loop hidden, a second thread-local read.
pub(crate) fn flush_for_foreign_wait(waker: &Waker) {
    flush_for_foreign_wait_on(waker, std::ptr::null());
}

/// [`flush_for_foreign_wait`] of a join handle of the task whose metadata is at `awaited`: in
/// a stopping loop, that task is dropped rather than kept for its loop's next run
/// ([`ring::wait_in_shutdown`](crate::ring::wait_in_shutdown)).
pub(crate) fn flush_for_foreign_wait_on(waker: &Waker, awaited: *const crate::task::TaskMeta) {
    if with_core(|c| c.flush_deferred_on(waker, awaited)).is_some() {
        return;
    }
    with_own_core(|c| {
        crate::ring::flush(c);
        crate::ring::wait_backlogs_foreign(c, waker);
        Some(())
    });
}

/// Whether [`off_loop`] hides a loop of this thread (for the I/O error's wording). Cost: a
/// thread-local read.
pub(crate) fn loop_hidden() -> bool {
    HIDDEN.with(|h| !h.get().is_null())
}

/// A loop hidden by [`off_loop`], in the `HIDDEN` list.
struct Hidden {
    core: *const Core,
    /// The next one out (hidden by an enclosing `off_loop`).
    outer: *const Hidden,
}

/// The first `Some` that `f` gives for this thread's loops: the current one, then those
/// [`off_loop`] hides (innermost first). For resources a loop owns that must reach it to be
/// released soundly whatever user code runs meanwhile (its I/O driver's operations). Cost: a
/// thread-local read; off the hot path, a scan of the hidden loops.
pub(crate) fn with_own_core<R>(mut f: impl FnMut(&Core) -> Option<R>) -> Option<R> {
    if let Some(r) = with_core(&mut f).flatten() {
        return Some(r);
    }
    let mut node = HIDDEN.with(Cell::get);
    while !node.is_null() {
        // SAFETY: `off_loop` put `node` in the list from its own stack frame and takes it out
        // (its `Restore` guard, also on unwind) before that frame goes; we are inside that
        // call, so the node is alive. Its `core` came from `CURRENT`, which pointed at a `Core`
        // alive while its `Enter` guard lives, and that guard encloses the `off_loop` call: the
        // `Core` is alive too, and used by this thread alone (it is `!Sync`). `f` may hide
        // loops itself: that only links new nodes in front of this one.
        let (core, outer) = unsafe { ((*node).core, (*node).outer) };
        // SAFETY: see above.
        if let Some(r) = f(unsafe { &*core }) {
            return Some(r);
        }
        node = outer;
    }
    None
}

/// This thread's current loop (null off any loop): the thread-local read alone, so that it
/// inlines to one `%fs`-relative load wherever it is used. Run inside `CURRENT.with`, a large
/// closure (a spawn, a wake's routing) kept `LocalKey::with` out of line, which then reached
/// the thread-local through a function pointer and spilled the closure's captures
/// (callgrind: 50 instructions per spawned task, 36 per yield).
#[inline(always)]
fn current_core() -> *const Core {
    CURRENT.with(Cell::get)
}

/// Runs `f` with this thread's current loop, if any.
#[inline]
pub(crate) fn with_core<R>(f: impl FnOnce(&Core) -> R) -> Option<R> {
    let p = current_core();
    if p.is_null() {
        None
    } else {
        // SAFETY: a non-null pointer was stored by `enter` from a `&Core` that the `Enter`
        // guard borrows; the guard resets it before that borrow ends, and only this thread
        // reads it. So the `Core` is alive for the whole call of `f` (which runs inside the
        // guard's scope, on this thread) and, being `!Sync`, used by this thread alone.
        Some(f(unsafe { &*p }))
    }
}

/// Spends one unit of the polled task's cooperative budget (`io::COOP_BUDGET`, reset before
/// each poll by the loop) on a call about to complete without a loop turn (an epoll call with
/// its fd marked ready, a sleep found past its deadline, a `send_to` to the caller's own
/// shard, which has no ring to wait on). `false` when the budget is spent: the caller must
/// yield (wake itself and return `Pending`) instead of calling; the loop's batch then ends after
/// this poll, so due timers, I/O and the inbox are served before the task runs again (a plain
/// wake re-queued it in the same batch). Off any loop (a future polled by a foreign
/// executor) there is no budget: always `true`. A foreign executor blocking inside a task's
/// poll on a loop thread spends that poll's budget; after [`COOP_REFUSALS`] refusals in the
/// same poll it gets a fresh one (see there). Cost: one thread-local read and a `Cell` update.
pub(crate) fn coop_spend() -> bool {
    with_core(Core::coop_spend).unwrap_or(true)
}

/// Calls [`coop_spend`] refuses in one poll of a task before that poll gets a fresh budget.
/// A refusal wakes the future and makes it return `Pending`, which ends the task's poll
/// unless something inside the poll polls it again at once: a foreign executor blocking in
/// the task (`futures::executor::block_on` around a read loop or a sleep loop), whose poll
/// never ends, so the budget was never reset there and every later call was refused: 100%
/// CPU and no progress, for good. A `select` over a few sources, or a `FuturesUnordered`
/// (which yields itself after two of its futures wake themselves), meets a handful of
/// refusals per poll. Refilled, not turned off: a poll over more than this many ready
/// sources at once (a `select_all`) still makes at most a budget's worth of calls per
/// this many refusals, each of which ended the poll of one of its futures.
pub(crate) const COOP_REFUSALS: u32 = 128;

/// `Core::coop_left` before each poll of a task: the budget, then the refusals.
pub(crate) const COOP_FRESH: u32 = crate::io::COOP_BUDGET + COOP_REFUSALS;

impl Core {
    /// [`coop_spend`] on this loop, for a caller that has it at hand already.
    #[inline]
    pub(crate) fn coop_spend(&self) -> bool {
        let left = self.coop_left.get();
        if left > COOP_REFUSALS {
            self.coop_left.set(left - 1);
            true
        } else {
            self.coop_refuse(left)
        }
    }

    /// [`coop_spend`] with the budget spent (`left` in `1..=COOP_REFUSALS`): refused, so
    /// each ready call in the poll yields (a task selecting over two streams must not go on
    /// with the other one); the last of [`COOP_REFUSALS`] refusals refills the budget.
    #[cold]
    fn coop_refuse(&self, left: u32) -> bool {
        self.coop_left
            .set(if left <= 1 { COOP_FRESH } else { left - 1 });
        self.end_batch.set(true);
        false
    }
}

/// Ends the loop's batch after the current poll and wakes `waker`: the caller returns
/// `Pending`, so due timers, I/O and the inbox are served before its task runs again (a plain
/// wake re-queued it in the same batch, run again before the loop looked at any of them). For
/// an operation that could go on without waiting but has held its loop long enough. Off any
/// loop, only the wake. Cost: one thread-local read and a waker call.
pub(crate) fn yield_ending_batch(waker: &std::task::Waker) {
    with_core(|c| c.end_batch.set(true));
    waker.wake_by_ref();
}

/// Runs `f` with no task marked as being polled on this thread's loop (`Core::current` null,
/// restored afterwards, also on unwind): for user code that is not the polled task's own, a
/// `JoinHandle`'s foreign waker. async-task wakes a handle's awaiter after it dropped its own
/// reference to the task that just ended, which frees that task when its handle is gone; the
/// loop still names it as current until `run` returns, and code reading `current` there
/// (`shard::set_class`, a handle's work-first join) read and wrote the freed task. Cost: two
/// thread-local reads.
pub(crate) fn outside_task<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(Option<*const TaskMeta>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(meta) = self.0 {
                // The same loop: `f` leaves this thread's current loop as it found it (loops
                // entered or hidden inside it are restored by their own guards).
                with_core(|c| c.current.set(meta));
            }
        }
    }
    let _restore = Restore(with_core(|c| c.current.replace(ptr::null())));
    f()
}

/// The executor of the current loop.
pub(crate) fn exec() -> Option<Arc<ExecShared>> {
    with_core(|c| c.exec.clone())
}

/// Task protocol rule 1: queue `runnable` locally if this thread is `owner`'s loop, on the ring
/// to `owner` if it is another loop of the same executor, else hand it back to the caller for
/// the owner's inbox.
///
/// `owner` is read before `runnable` is handed on; on the loop paths the current loop's
/// executor keeps the owner alive, on the foreign path the caller still holds `runnable`.
#[inline]
pub(crate) fn route(owner: &LoopShared, runnable: Runnable) -> Option<Runnable> {
    let p = current_core();
    if p.is_null() {
        return Some(runnable);
    }
    // SAFETY: as in `with_core`.
    route_from(unsafe { &*p }, owner, runnable)
}

/// [`route`] from `core`, this thread's current loop, already looked up by the caller.
#[inline]
pub(crate) fn route_from(core: &Core, owner: &LoopShared, runnable: Runnable) -> Option<Runnable> {
    let (owner_ptr, exec_id, index) = (owner as *const LoopShared, owner.exec_id, owner.index);
    if core.runs(owner_ptr) {
        core.enqueue(runnable);
        None
    } else if core.shared.exec_id == exec_id {
        core.mesh.borrow_mut().push(index, runnable);
        None
    } else {
        Some(runnable)
    }
}

/// Task protocol rule 1, its first case alone: queues `runnable` locally if this thread runs
/// its owner's loop (the owner is its metadata's `home`), else hands it back for [`route`].
/// Inlined into every schedule call site (see `task::schedule`): a thread-local read, a
/// pointer compare and [`Core::enqueue`].
#[inline]
pub(crate) fn enqueue_at_home(runnable: Runnable) -> Option<Runnable> {
    let p = current_core();
    if p.is_null() {
        return Some(runnable);
    }
    // SAFETY: as in `with_core`.
    let core = unsafe { &*p };
    if core.runs(crate::task::Home::as_ptr(&runnable.metadata().home)) {
        core.enqueue(runnable);
        None
    } else {
        Some(runnable)
    }
}

/// Task protocol rule 3: registers the task being polled (always on its owner's loop), whose
/// waker is `waker`; the caller (its future) calls [`task_dropped`] with the key when it is
/// dropped. The metadata pointer is the loop's `current`, set around every `Runnable::run`.
///
/// `None` off any loop or outside a run, where there is no task to register, and once a loop
/// holds `u32::MAX` parked tasks (keys are 32 bits to keep tasks small; that many tasks
/// would take over 300 GB): such a task is not tracked for quiescence or shutdown.
pub(crate) fn register_current(waker: &Waker) -> Option<u32> {
    with_core(|core| {
        let meta = core.current.get();
        debug_assert!(!meta.is_null(), "a task polled outside its loop's run step");
        if meta.is_null() {
            return None;
        }
        let mut registry = core.registry.borrow_mut();
        let entry = registry.vacant_entry();
        let key = u32::try_from(entry.key()).ok().filter(|&k| k != u32::MAX)?;
        entry.insert(Entry {
            waker: waker.clone(),
            meta,
        });
        Some(key)
    })
    .flatten()
}

/// Task protocol rule 3: the task's future was dropped (with its registry key, if it had one).
///
/// Inlined into the task's drop (generic code, built in the user's crate): a task that
/// finished in its first poll never registered (rule 3), and its end is then a thread-local
/// read, a flag check and a counter increment. Out of line, the call cost 12 instructions
/// per spawned task (callgrind). The registry removal stays a call ([`leave_registry`]).
#[inline]
pub(crate) fn task_dropped(key: Option<usize>) {
    with_core(|core| {
        if core.dropping_foreign.get() {
            // Another loop's task, dropped unrun here (`task::cancel`): not one of ours.
            return;
        }
        match key {
            Some(k) => leave_registry(core, k),
            None => core.tasks_done.set(core.tasks_done.get() + 1),
        }
    });
}

/// [`task_dropped`] for a registered task: its entry leaves, the task counts as done, and the
/// entry's waker is dropped last, after the registry's borrow ended.
#[inline(never)]
fn leave_registry(core: &Core, key: usize) {
    let entry = core.registry.borrow_mut().try_remove(key);
    core.tasks_done.set(core.tasks_done.get() + 1);
    drop(entry);
}
