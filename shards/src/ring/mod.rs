//! The SPSC ring mesh: one rtrb ring per ordered pair of shards (N·(N−1) rings), carrying task
//! `Runnable`s between worker loops (invariant 3 in the crate docs).
//!
//! Everything crossing from worker `i` to worker `j` travels on ring `i→j`: spawns
//! (`spawn_on`, `submit_to`), and wakes of `j`'s pinned tasks fired on `i` — including the wake
//! that returns a `submit_to` result, whose value sits in the async-task slot the caller already
//! holds. A cross-shard call is therefore one ring message each way and one local wake.
//!
//! # Ring protocol
//!
//! 1. **Ownership.** Ring `i→j`'s producer is owned by loop `i`'s `Core`, its consumer by loop
//!    `j`'s, both taken from the executor when the loop starts and given back when it stops.
//!    Only the owning thread touches an end, so pushes and pops need no lock; the exceptions
//!    hold the mesh's lock with the ends given back (`evacuate` and `drop_queued`, below).
//! 2. **Never drop, never reorder.** A `Runnable` for `j` is pushed on `i→j` unless that ring is
//!    full or `i`'s backlog for `j` is non-empty; then it is appended to the backlog, a
//!    loop-local FIFO that `i` moves into the ring, in order, as space frees. Wakes cannot wait,
//!    so the backlog absorbs them (at most one `Runnable` per woken task). It also takes the
//!    spawns that do not wait for space: `Handle::spawn_on`/`submit_to`/`send_to` called on a
//!    loop (unbounded then, as a `Vec` is, but in order and never dropped). Reserve waiters
//!    (rule 3) never use it: woken together for fewer free slots than they are, each checks
//!    for room again and pushes in that same poll, and those that find none wait again.
//! 3. **Backpressure for senders that can wait.** `submit_to`/`send_to` first wait for ring space
//!    ([`reserve`]): if the ring is full (or backlogged) the task parks on `i`'s waiter list for
//!    `j`, sets `want_space[i→j]` by `swap`, and rechecks the ring. The consumer `j`, after
//!    popping from `i→j`, does `want_space[i→j].swap(false)`; if it was set it unparks loop `i`,
//!    which on its next turn wakes the waiters whose ring has space. Both sides use a
//!    read-modify-write on the flag, so whichever comes second in its modification order sees the
//!    other's ring update (the same argument as `event_loop/park.rs`). A loop with waiters or a
//!    backlog rechecks ring space after announcing sleep, and looks at it while it spins before
//!    parking ([`spin_news`]: the ping reaches only a loop that announced sleep).
//!    **3b. A foreign waiter.** A task polled with a waker other than its own (a foreign
//!    executor inside it, `futures::executor::block_on`, which blocks the loop's thread until
//!    that waker is woken) cannot count on its loop's turn to end: the wait for ring space of
//!    its `submit_to`/`send_to`, and a backlog its wake or `Handle::submit_to` left when the
//!    ring was full, then slept for good. Its waker also joins the pair's foreign list in the
//!    executor's mesh ([`join_foreign`]) before `want_space` is announced, and the consumer
//!    whose swap finds the flag set takes that list and wakes it, outside its borrows, besides
//!    pinging the loop: the same two-swap argument covers it. Not covered: two loops each
//!    blocked in a foreign executor on the other's full ring. A blocked loop drains nothing
//!    (rule 4 needs turns), so neither frees the other's space, and both wait for good; one
//!    blocked loop is fine, its peer drains.
//!    **3c. A foreign waiter in a stopping loop** (a `Drop` that the loop's shutdown runs,
//!    [`wait_in_shutdown`]). New sends wait for nothing there: [`reserve`] refuses them. A
//!    wait on what was sent before (a join handle) gets, at each poll, what the shutdown does
//!    for loops that have stopped ([`evacuate`]), since the shutdown does it only once the
//!    drop returns; the awaited task itself is dropped rather than kept for a stopped loop's
//!    next run (taken from that loop's inbox, where an evacuation, this one or another
//!    loop's, or a plain thread put it), which cannot start
//!    before this run ends; while it is another loop's and not over, the wait polls again
//!    every millisecond (what keeps it wakes no one). An awaited migratable task (parked,
//!    it was dropped only once every loop had stopped) is dropped by the wait once every
//!    loop of the run has begun its shutdown, after which no loop polls it: woken through
//!    its registry entry onto this loop's deque if it is parked, taken from this loop's
//!    deque, an injector, a parked deque or another loop's deque through its stealer
//!    (`steal::cancel_awaited_at_stop`; what the stealer takes before it is dropped at once);
//!    until then the
//!    wait polls every millisecond, leaving it to a loop that may still run it. Then the waker
//!    joins the foreign list of each ring that still holds something for an owner holding its
//!    end, announces (`want_space`) and looks at the owner's slot in the mesh. The owner's
//!    drain wakes the list (3b); so does its `Mesh::give_back`, after it parks its end: a
//!    waiter that looked first is woken, one that looks later sees the end parked and polls
//!    again (`loom_shutdown_wait.rs`). Not covered, as in 3b: two stopping loops each blocked
//!    in such a drop on a channel end that a task of the other's holds.
//! 4. **Fair draining.** Each turn a loop pops at most [`DRAIN_PER_RING`] messages from each
//!    incoming ring, starting one ring further on each turn, so no peer can starve another.
//!    Draining never depends on ring space, so two loops that fill each other's rings still make
//!    progress: each drains its inbound rings, which frees the other's outbound space (while
//!    both turn; see 3b). A loop still idle (no BUSY announced at step 2, the ring looked empty)
//!    may take a message that came just after its look: nothing it queued runs before the
//!    turn announces BUSY (`event_loop::run`, the check before the batch), and its received
//!    count is published only at the end of that turn, so the coordinator reads the ring
//!    unbalanced until the new epoch is out.
//! 5. **Batched notification.** A push marks the target dirty; at the end of the turn (and before
//!    parking) the loop unparks each dirty target once (`park.rs` rule 2: a ping only if it
//!    announced sleep).
//! 6. **Counting.** Each loop publishes how many messages it has sent (ring or backlog) and
//!    received, for the quiescence check (`executor/quiesce.rs`), and how many of those it sent
//!    left the mesh unreceived at its shutdown ([`evacuate`]), which the check takes off.

use std::{
    collections::VecDeque,
    future::Future,
    pin::Pin,
    task::{Context, Poll, Waker},
};

use crossbeam_utils::CachePadded;
use rtrb::{Consumer, Producer, RingBuffer};

use crate::{
    context::{with_core, Core},
    stats::bump,
    sync::{
        lock, AtomicBool, Mutex,
        Ordering::{Relaxed, SeqCst},
    },
    task::Runnable,
};

/// Messages popped from one incoming ring per loop turn (protocol rule 4). Bounded so one busy
/// peer cannot monopolise a turn; large enough that a stream rarely waits for the next turn.
pub(crate) const DRAIN_PER_RING: usize = 256;

/// Default ring capacity (messages per ordered pair). Seastar uses 128-entry queues with
/// batching; 1024 gives bursts of submits room before backpressure.
pub const DEFAULT_RING_CAPACITY: usize = 1024;

/// Most memory the ring mesh may take ([`mesh_bytes`], allocated by `build()`): 4 GiB. 256
/// shards at the default capacity take 560 MiB.
pub(crate) const MAX_MESH_BYTES: u64 = 4 << 30;

/// Bytes a ring of the mesh costs besides its slots, rounded up: rtrb's shared state (three
/// 128-byte lines in an `Arc`), the producer and consumer ends and their slots in the
/// executor's and loops' tables, the pair's cache-padded `want_space` flag, and the
/// allocator's overhead for the aligned box and the slot array.
/// Counted so that a tiny `ring_capacity` with thousands of shards (N² rings) is refused,
/// not an out-of-memory abort.
pub(crate) const PER_RING_BYTES: u128 = 768;

/// What `build()` allocates for `n` shards' mesh and victim tables, in bytes: N·(N−1) rings
/// of `capacity` 8-byte slots plus [`PER_RING_BYTES`] each, and the executor's three N×N
/// victim tables (one per NUMA sensitivity; a shard and a distance, 16 bytes, per entry).
pub(crate) fn mesh_bytes(n: usize, capacity: usize) -> u128 {
    let (n, capacity) = (n as u128, capacity as u128);
    n * n.saturating_sub(1) * (capacity * 8 + PER_RING_BYTES) + 3 * n * n * 16
}

/// Largest ring capacity `build()` accepts: 2^20 messages, 8 MiB per ring, allocated up front
/// for each of the `N·(N−1)` rings (a larger value is far more memory than any backlog needs).
pub const MAX_RING_CAPACITY: usize = 1 << 20;

/// The executor's side of the mesh: ring ends parked between runs, and the space flags.
#[derive(Debug)]
pub(crate) struct Mesh {
    n: usize,
    capacity: usize,
    producers: Vec<Mutex<Option<Producer<Runnable>>>>,
    consumers: Vec<Mutex<Option<Consumer<Runnable>>>>,
    /// `want_space[from * n + to]`: protocol rule 3.
    want_space: Vec<CachePadded<AtomicBool>>,
    /// `foreign[from * n + to]`: wakers of foreign executors blocking loop `from`'s thread
    /// until ring `from → to` has room (rule 3b), taken by `to`'s drain with the flag.
    foreign: Vec<Mutex<Vec<Waker>>>,
}

impl Mesh {
    pub(crate) fn new(n: usize, capacity: usize) -> Mesh {
        let mut producers = Vec::with_capacity(n * n);
        let mut consumers = Vec::with_capacity(n * n);
        for from in 0..n {
            for to in 0..n {
                if from == to {
                    producers.push(Mutex::new(None));
                    consumers.push(Mutex::new(None));
                } else {
                    let (p, c) = RingBuffer::new(capacity);
                    producers.push(Mutex::new(Some(p)));
                    consumers.push(Mutex::new(Some(c)));
                }
            }
        }
        Mesh {
            n,
            capacity,
            producers,
            consumers,
            want_space: (0..n * n)
                .map(|_| CachePadded::new(AtomicBool::new(false)))
                .collect(),
            foreign: (0..n * n).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rule 1: loop `me` takes its ring ends. What an earlier run left of its rule 3 state for
    /// its outgoing rings is cleared: a `want_space` flag its last park decision set, and the
    /// wakers of foreign waits (3b) that ended some other way (a recheck found room), which
    /// stayed in the list, each keeping its `Arc` alive until a later run's consumer took them
    /// and woke them for nothing. Only code on this loop's thread sets either, and it has not
    /// run yet. Cost: per outgoing ring, one store and one lock.
    pub(crate) fn take(&self, me: usize) -> LocalMesh {
        let n = self.n;
        let mut stale = Vec::new();
        for to in 0..n {
            self.want_space(me, to).store(false, SeqCst);
            stale.append(&mut lock(self.foreign(me, to)));
        }
        // Outside the locks: a waker's drop is user code.
        crate::task::drop_wakers_guarded(stale);
        LocalMesh {
            me,
            out: (0..n)
                .map(|to| lock(&self.producers[me * n + to]).take())
                .collect(),
            inc: (0..n)
                .map(|from| lock(&self.consumers[from * n + me]).take())
                .collect(),
            backlog: (0..n).map(|_| VecDeque::new()).collect(),
            backlogged: 0,
            waiters: (0..n).map(|_| Vec::new()).collect(),
            waiting: 0,
            dirty: Vec::with_capacity(n),
            is_dirty: vec![false; n],
            sent: 0,
            received: 0,
            handed_over: 0,
            rr: 0,
            stopping: None,
        }
    }

    /// Rule 1: loop `me` gives its ring ends back. The backlog must be empty, but for a loop
    /// whose shutdown was cut short by a panic (its `Core` dropped while that panic unwinds;
    /// a second panic here aborted the process). Such a backlog's tasks are other loops'
    /// (wakes of their pinned tasks, whose futures may be `!Send`, as well as spawns): never
    /// dropped here, on this thread. Each goes to its owner's inbox, whose shutdown (under way:
    /// the panic stopped the run) takes it and drops it on the owner's thread; leaked it was,
    /// and an owner whose parked task's wake it was waited for that task for good, so `run()`
    /// never returned. Only what is for a loop that is poisoned too is leaked, with an error
    /// logged. The counts a shutdown keeps (`evacuate`) go unbalanced, which no run reads: the
    /// executor of a poisoned loop runs no more (`LoopShared::poisoned`).
    pub(crate) fn give_back(
        &self,
        mut local: LocalMesh,
        loops: &[std::sync::Arc<crate::event_loop::LoopShared>],
    ) {
        debug_assert!(
            local.backlogged == 0 || std::thread::panicking(),
            "a loop gave its ring ends back with {} backlogged messages",
            local.backlogged
        );
        if local.backlogged > 0 {
            for (to, queue) in local.backlog.iter_mut().enumerate() {
                if queue.is_empty() {
                    continue;
                }
                match loops.get(to).filter(|o| !o.poisoned.load(SeqCst)) {
                    Some(owner) => hand_over(owner, queue.drain(..)),
                    None => crate::event_loop::leak_all(queue.drain(..).collect()),
                }
            }
            local.backlogged = 0;
        }
        let n = self.n;
        let me = local.me;
        for (to, p) in local.out.into_iter().enumerate() {
            if p.is_some() {
                *lock(&self.producers[me * n + to]) = p;
            }
        }
        let mut woken = Vec::new();
        for (from, c) in local.inc.into_iter().enumerate() {
            if c.is_some() {
                *lock(&self.consumers[from * n + me]) = c;
                // Rule 3c: after the end is parked, so a waiter that joined before this looks
                // is woken here, and one that joins later sees the end parked.
                woken.append(&mut lock(self.foreign(from, me)));
            }
        }
        // Outside the locks: a waker is user code.
        for w in woken {
            crate::task::wake_guarded(w);
        }
    }

    /// Drops every message left in the rings while no loop runs, and returns how many. When a
    /// run ends the rings are empty (each loop's shutdown hands what it sent to a stopped loop
    /// over to that loop's inbox, [`evacuate`]); this is the safety net there, and the sweep
    /// when the executor goes (one holding a `Handle` would keep the executor, and so the ring
    /// holding it, alive for good). What it finds can only be fresh spawns, which own only their
    /// `Send` closures (the tasks of a stopped loop are gone, so nothing wakes them): any thread
    /// may drop them. Each counts as received by its target (`loops[to]`'s stats, from which its
    /// next run starts counting), so a later run's quiescence check still balances (rule 6).
    /// The exception is a loop whose shutdown was cut short by a panic
    /// ([`LoopShared::poisoned`](crate::event_loop::LoopShared::poisoned)): its tasks live on,
    /// so what waits for it is leaked, not dropped.
    pub(crate) fn drop_queued(
        &self,
        loops: &[std::sync::Arc<crate::event_loop::LoopShared>],
    ) -> usize {
        let mut dropped = Vec::new();
        for (slot, c) in self.consumers.iter().enumerate() {
            let mut c = lock(c);
            let Some(c) = c.as_mut() else { continue };
            let before = dropped.len();
            while let Ok(r) = c.pop() {
                dropped.push(r);
            }
            if loops[slot % self.n].poisoned.load(SeqCst) {
                // Not only spawns: wakes of the live tasks of a loop whose shutdown was cut
                // short (`LoopShared::poisoned`), which no other thread may drop.
                crate::event_loop::leak_all(dropped.split_off(before));
            }
            let n = (dropped.len() - before) as u64;
            if n > 0 {
                loops[slot % self.n]
                    .stats
                    .messages_received
                    .fetch_add(n, SeqCst);
            }
        }
        // Outside the locks: dropping a closure may spawn again (into an inbox).
        let n = dropped.len();
        crate::task::cancel_all(dropped);
        n
    }

    fn want_space(&self, from: usize, to: usize) -> &AtomicBool {
        &self.want_space[from * self.n + to]
    }

    /// Rule 3b: the foreign wakers waiting for room on ring `from → to`.
    fn foreign(&self, from: usize, to: usize) -> &Mutex<Vec<Waker>> {
        &self.foreign[from * self.n + to]
    }
}

/// One loop's ring ends and the loop-local state around them.
#[derive(Debug)]
pub(crate) struct LocalMesh {
    me: usize,
    out: Vec<Option<Producer<Runnable>>>,
    inc: Vec<Option<Consumer<Runnable>>>,
    backlog: Vec<VecDeque<Runnable>>,
    /// Total backlogged messages.
    backlogged: usize,
    /// Tasks waiting for space on `out[to]` (rule 3).
    waiters: Vec<Vec<Waker>>,
    /// Total waiters.
    waiting: usize,
    dirty: Vec<usize>,
    is_dirty: Vec<bool>,
    pub(crate) sent: u64,
    pub(crate) received: u64,
    /// Of `sent`, the messages [`evacuate`] took out of the mesh for a loop that had stopped
    /// (handed to its inbox, or dropped): the ring never counts them received. Kept apart
    /// from `sent`, which is `LoopStats::messages_sent`, a total that must not go down.
    pub(crate) handed_over: u64,
    rr: usize,
    /// Since this loop's shutdown began ([`LocalMesh::begin_shutdown`]): messages pushed per
    /// target, not yet handed over by [`evacuate`] (the drops of its tasks sending them).
    stopping: Option<Vec<usize>>,
}

impl LocalMesh {
    /// An empty mesh for a lone loop (no rings).
    pub(crate) fn none(me: usize) -> LocalMesh {
        LocalMesh {
            me,
            out: Vec::new(),
            inc: Vec::new(),
            backlog: Vec::new(),
            backlogged: 0,
            waiters: Vec::new(),
            waiting: 0,
            dirty: Vec::new(),
            is_dirty: Vec::new(),
            sent: 0,
            received: 0,
            handed_over: 0,
            rr: 0,
            stopping: None,
        }
    }

    /// This loop's shutdown begins: what it sends from now on comes from the drops of its tasks
    /// ([`evacuate`]).
    pub(crate) fn begin_shutdown(&mut self) {
        self.stopping = Some(vec![0; self.backlog.len()]);
    }

    /// Whether this loop's shutdown has begun ([`begin_shutdown`](Self::begin_shutdown)).
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.is_some()
    }

    /// Rule 2: sends `r` to loop `to`. Never fails, never blocks. Inline: its one caller is
    /// `context::route`, inside the out-of-line `task::schedule_away`, so this saves a call
    /// frame (four registers saved and restored) per cross-shard message.
    #[inline]
    pub(crate) fn push(&mut self, to: usize, r: Runnable) {
        self.sent += 1;
        if let Some(s) = self.stopping.as_mut() {
            s[to] += 1;
        }
        if !self.is_dirty[to] {
            self.is_dirty[to] = true;
            self.dirty.push(to);
        }
        if self.backlog[to].is_empty() {
            if let Some(p) = self.out[to].as_mut() {
                match p.push(r) {
                    Ok(()) => return,
                    Err(rtrb::PushError::Full(r)) => {
                        self.backlogged += 1;
                        self.backlog[to].push_back(r);
                        return;
                    }
                }
            }
        }
        self.backlogged += 1;
        self.backlog[to].push_back(r);
    }

    /// [`reserved`]: no ring to `to` to wait on, or room in it, and this loop is not stopping
    /// (then a [`reserve`] refuses the send).
    #[inline]
    fn reserved(&self, to: usize) -> bool {
        self.stopping.is_none() && (to == self.me || to >= self.out.len() || self.has_space(to))
    }

    /// Whether `to` can take a message from this loop now, without backlog.
    #[inline]
    fn has_space(&self, to: usize) -> bool {
        self.backlog[to].is_empty() && self.out[to].as_ref().is_some_and(|p| !p.is_full())
    }

    /// Whether any incoming ring holds a message.
    pub(crate) fn incoming_pending(&self) -> bool {
        self.inc
            .iter()
            .any(|c| c.as_ref().is_some_and(|c| !c.is_empty()))
    }

    /// Whether the loop has backlog or waiters that a consumer's progress would unblock.
    pub(crate) fn blocked_on_space(&self) -> bool {
        self.backlogged > 0 || self.waiting > 0
    }

    pub(crate) fn backlogged(&self) -> usize {
        self.backlogged
    }
}

/// Loop step 2 for rings: drains incoming rings into the run queue (rule 4) and signals
/// producers waiting for space (rule 3). Returns how many messages it took.
pub(crate) fn drain(core: &Core) -> usize {
    let mut guard = core.mesh.borrow_mut();
    let m = &mut *guard;
    let n = m.inc.len();
    if n == 0 {
        return 0;
    }
    let me = m.me;
    let start = m.rr;
    // Wrapped by a compare, not `%`: a division per ring and per turn (`n` is not a constant).
    m.rr = if start + 1 == n { 0 } else { start + 1 };
    let mut total = 0;
    // With classes, tasks go to their lanes after the mesh borrow ends; without, straight to
    // the FIFO (no allocation on the common path). `None` until a task goes that way: an
    // empty `Vec` left to its drop glue still cost an out-of-line call per turn (callgrind:
    // about 25 instructions per loop turn).
    let classes = core.classes_active.get();
    let mut got_all: Option<Vec<Runnable>> = None;
    // Rule 3b's wakers, woken after the borrows (user code). No allocation unless one waits.
    let mut foreign = Vec::new();
    {
        let mut q = core.queue.borrow_mut();
        // From `start` to the end, then from the first ring to `start`: two plain walks, not
        // one with a wrapped index and a bounds check per ring (callgrind: about 20
        // instructions per turn with two shards).
        let (wrapped, first) = m.inc.split_at_mut(start);
        for (k, c) in first.iter_mut().enumerate() {
            if let Some(c) = c {
                total += drain_ring(
                    core,
                    start + k,
                    me,
                    c,
                    classes,
                    &mut q,
                    &mut got_all,
                    &mut foreign,
                );
            }
        }
        for (from, c) in wrapped.iter_mut().enumerate() {
            if let Some(c) = c {
                total += drain_ring(
                    core,
                    from,
                    me,
                    c,
                    classes,
                    &mut q,
                    &mut got_all,
                    &mut foreign,
                );
            }
        }
    }
    m.received += total as u64;
    drop(guard);
    for w in foreign {
        crate::task::wake_guarded(w);
    }
    if let Some(got_all) = got_all {
        for r in got_all {
            core.enqueue(r);
        }
    }
    total
}

/// [`drain`] of ring `from → me`, consumer `c`: at most [`DRAIN_PER_RING`] messages into the
/// FIFO `q` (or into `got_all`, for `Core::enqueue` after the mesh borrow), then rule 3's
/// consumer side (rule 3b's wakers into `foreign`, for the caller to wake after its borrows).
/// Returns how many it took. Inlined into both of `drain`'s walks (as a
/// call, or a closure LLVM kept out of line, it cost more than the walks saved).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn drain_ring(
    core: &Core,
    from: usize,
    me: usize,
    c: &mut Consumer<Runnable>,
    classes: bool,
    q: &mut VecDeque<Runnable>,
    got_all: &mut Option<Vec<Runnable>>,
    foreign: &mut Vec<Waker>,
) -> usize {
    let mut got = 0;
    while got < DRAIN_PER_RING {
        match c.pop() {
            Ok(r) => {
                // A task of a class (the loop's first, created since it last looked) goes
                // through `Core::enqueue` too, which picks the class up.
                if classes || r.metadata().class.load(Relaxed) != 0 {
                    got_all.get_or_insert_with(Vec::new).push(r);
                } else {
                    q.push_back(r);
                }
                got += 1;
            }
            Err(_) => break,
        }
    }
    if got > 0 {
        // Rule 3, consumer side. The ping touches no loop-local state (no borrow held here is
        // at risk), so it goes out at once rather than through a list.
        if core.exec.mesh.want_space(from, me).swap(false, SeqCst) {
            notify(core, from);
            take_foreign(core, from, me, foreign);
        }
    }
    got
}

/// Rule 3b, consumer side: moves the foreign wakers waiting for room on ring `from → me` into
/// `out`. Out of line: it runs only when a producer announced it waits (the ring was full).
#[cold]
#[inline(never)]
fn take_foreign(core: &Core, from: usize, me: usize, out: &mut Vec<Waker>) {
    out.append(&mut lock(core.exec.mesh.foreign(from, me)));
}

/// Rule 3b, producer side: adds `waker` (once) to the foreign list of ring `me → to`; the
/// caller then announces (`want_space`) and rechecks, as for a waiter of its own. Cost: a lock,
/// a waker clone the first time.
fn join_foreign(core: &Core, me: usize, to: usize, waker: &Waker) {
    let list = core.exec.mesh.foreign(me, to);
    let known = lock(list).iter().any(|w| w.will_wake(waker));
    if !known {
        // Cloned outside the lock: a waker's clone is user code.
        let w = waker.clone();
        let dup = {
            let mut l = lock(list);
            if l.iter().any(|k| k.will_wake(&w)) {
                Some(w)
            } else {
                l.push(w);
                None
            }
        };
        drop(dup);
    }
}

/// Rule 3b for a backlog: a task polled with a foreign `waker` (see `Core::flush_deferred`)
/// after this loop moved what it could of its backlogs: for each ring whose backlog is left,
/// `waker` waits for room (the consumer wakes it), and a ring found with room meanwhile gets
/// its backlog moved now. Cost: a borrow and a load when nothing is backlogged.
pub(crate) fn wait_backlogs_foreign(core: &Core, waker: &Waker) {
    // Each round moves at least one message or ends: bounded by the backlog.
    loop {
        let (me, before, blocked) = {
            let m = core.mesh.borrow();
            if m.backlogged == 0 {
                return;
            }
            let blocked: Vec<usize> = (0..m.backlog.len())
                .filter(|&to| !m.backlog[to].is_empty())
                .collect();
            (m.me, m.backlogged, blocked)
        };
        // Rule 3 for each blocked ring, with the foreign waker (3b): join, announce, recheck.
        let mut room = false;
        for to in blocked {
            join_foreign(core, me, to, waker);
            core.exec.mesh.want_space(me, to).swap(true, SeqCst);
            room |= core.mesh.borrow().out[to]
                .as_ref()
                .is_some_and(|p| !p.is_full());
        }
        if !room {
            return;
        }
        flush(core);
        if core.mesh.borrow().backlogged >= before {
            return;
        }
    }
}

fn notify(core: &Core, to: usize) {
    if core.exec.loops[to].parker.unpark() {
        bump(&core.shared.stats.notifications_sent, 1);
    }
}

/// Loop step 5 for rings: moves backlogs into rings, wakes tasks waiting for space, and
/// sends the batched notifications (rules 2, 3, 5).
pub(crate) fn flush(core: &Core) {
    let mut m = core.mesh.borrow_mut();
    if m.inc.is_empty() {
        return;
    }
    if m.backlogged > 0 {
        move_backlogs(&mut m);
    }
    if m.waiting > 0 {
        drop(m);
        flush_waiters(core);
        return;
    }
    // No waiter to wake (the common turn): nothing can mark a ring dirty before the pings,
    // which go out under the borrow (a ping touches no loop-local state and runs no user
    // code, as in `drain`). Taking the list out and putting it back around them cost about
    // 25 instructions per turn that sent something (callgrind).
    m.ping_dirty(core);
}

/// [`flush`]'s backlog step: moves each backlog into its ring, in order, as far as the ring
/// has room (rules 2 and 5).
fn move_backlogs(m: &mut LocalMesh) {
    for to in 0..m.backlog.len() {
        let mut moved = false;
        while let Some(r) = m.backlog[to].pop_front() {
            let Some(p) = m.out[to].as_mut() else {
                m.backlog[to].push_front(r);
                break;
            };
            match p.push(r) {
                Ok(()) => {
                    m.backlogged -= 1;
                    moved = true;
                }
                Err(rtrb::PushError::Full(r)) => {
                    m.backlog[to].push_front(r);
                    break;
                }
            }
        }
        // Backlog that reached the ring is news for the consumer like a fresh push: it may
        // have parked after its last look (rule 5). Without this a consumer slept on a
        // non-empty ring while the producer only moved backlog.
        if moved && !m.is_dirty[to] {
            m.is_dirty[to] = true;
            m.dirty.push(to);
        }
    }
}

/// [`flush`] with tasks waiting for ring space (rule 3): wakes those whose ring has room,
/// then sends the batched pings (rule 5).
#[inline(never)]
fn flush_waiters(core: &Core) {
    let mut wake = Vec::new();
    {
        let mut m = core.mesh.borrow_mut();
        for to in 0..m.waiters.len() {
            if !m.waiters[to].is_empty() && m.has_space(to) {
                m.waiting -= m.waiters[to].len();
                wake.append(&mut m.waiters[to]);
            }
        }
    }
    // The waiters are woken before the pings: a waker may route a task onto one of this
    // loop's rings (a waker that wakes a task of another shard), which marks that ring dirty,
    // and its consumer must get this flush's ping. Woken after the pings, that task sat in the
    // ring of a sleeping consumer for good (rule 5), and the unbalanced message counts kept
    // `run()` from ever returning.
    for w in wake {
        crate::task::wake_guarded(w);
    }
    core.mesh.borrow_mut().ping_dirty(core);
}

impl LocalMesh {
    /// Rule 5: pings each target marked dirty since the last flush, once, and clears the
    /// marks (the list keeps its capacity for the next turn).
    fn ping_dirty(&mut self, core: &Core) {
        for &to in &self.dirty {
            self.is_dirty[to] = false;
            notify(core, to);
        }
        self.dirty.clear();
    }
}

/// A spinning loop's look at its rings (rules 3 and 5), under one borrow of the mesh: whether
/// an incoming ring holds a message, or a ring this loop holds a backlog or waiters for has
/// room again (what rule 3's ping tells a loop that announced sleep; the flush of the turn
/// the spin ends for then moves the backlog and wakes the waiters). Cost: a load per incoming
/// ring and two field reads while nothing is blocked on space (inlined into the spin: each
/// poll of a spinning loop pays it; the two looks borrowed the mesh once each).
#[inline]
pub(crate) fn spin_news(core: &Core) -> bool {
    core.mesh
        .try_borrow()
        .is_ok_and(|m| m.incoming_pending() || (m.blocked_on_space() && space_freed_slow(&m)))
}

/// [`spin_news`] once something is blocked on space: which ring has room again.
#[inline(never)]
fn space_freed_slow(m: &LocalMesh) -> bool {
    (0..m.out.len()).any(|to| {
        (!m.backlog[to].is_empty() || !m.waiters[to].is_empty())
            && m.out[to].as_ref().is_some_and(|p| !p.is_full())
    })
}

/// Moves `tasks` into `owner`'s inbox and wakes it: messages for a loop whose end of the ring
/// is gone, or going (`evacuate`, `Mesh::give_back`).
fn hand_over(owner: &crate::event_loop::LoopShared, tasks: impl IntoIterator<Item = Runnable>) {
    for r in tasks {
        owner.inbox.push(r);
    }
    owner.parker.unpark();
}

/// Before parking with a backlog or waiters: rule 3's producer side for every blocked ring.
/// Returns `true` if a ring has space again (do not park).
pub(crate) fn prepare_park(core: &Core) -> bool {
    let m = core.mesh.borrow();
    if !m.blocked_on_space() {
        return false;
    }
    let me = m.me;
    for to in 0..m.out.len() {
        if !m.backlog[to].is_empty() || !m.waiters[to].is_empty() {
            core.exec.mesh.want_space(me, to).swap(true, SeqCst);
            if m.out[to].as_ref().is_some_and(|p| !p.is_full()) {
                return true;
            }
        }
    }
    false
}

/// Shutdown: hands what this loop sent to loops that have stopped over to them, and drains
/// incoming rings into the run queue. Returns whether the caller must call again: a backlog
/// still waits for an owner that is shutting down, or the drops here ran user code that may
/// have sent more. The caller keeps looping (draining its own rings meanwhile, so two loops
/// waiting on each other both progress).
///
/// An owner of this run that has not taken its ends yet (`Mesh::take`, in `Core::new`, after
/// the start gate) has them parked in the mesh too, and is treated as one that has stopped: its
/// own shutdown then drops what was handed over, as it drops the rest of its queue.
///
/// For an owner that has stopped (its end of the ring is parked in the executor's mesh),
/// nothing will drain what this loop still has for it, the ring's content and then the
/// backlog, in that order (rule 2). What this loop sent before its own shutdown began (a
/// running task's spawns) moves to the owner's inbox for its next run, whether or not it
/// overflowed the ring: only a backlog used to move, and what fitted in the ring was dropped
/// when the run ended, so the same spawns survived or not by the ring's fill. What the drops
/// of this loop's shutdown sent (the newest messages) is dropped here, as the stopped run's
/// own tasks are, rather than run in the next, unrelated `run()`; an owner that has stopped
/// has no live task, so these are spawns, whose `Send` closures any thread may drop (but for an
/// owner whose shutdown a panic cut short, `LoopShared::poisoned`: what is left for it is
/// leaked). An owner
/// that still holds its end drains the ring in its own shutdown (dropping what it takes, as a
/// stopping loop drops its queue), and while this loop has anything for it, in the ring or a
/// backlog, the caller comes back until the owner drained it or has stopped: moved to the
/// inbox while the owner still ran, or was past its last drain, a backlog overtook the older
/// messages in the ring, or those were lost; and what this loop left in the ring of an owner
/// past its last drain was dropped unrun when the run ended (`Mesh::drop_queued`).
pub(crate) fn evacuate(core: &Core) -> bool {
    let (waits, again) = evacuate_parts(core);
    waits || again || core.mesh.borrow().backlogged() > 0
}

/// [`evacuate`]'s two reasons to come back: whether something waits for an owner that still
/// holds its end (in the ring or a backlog), and whether the evacuation ran user code (drops)
/// that may have sent more.
fn evacuate_parts(core: &Core) -> (bool, bool) {
    flush(core);
    let mesh = &core.exec.mesh;
    let mut m = core.mesh.borrow_mut();
    let me = m.me;
    let mut waits = false;
    let mut dropped = Vec::new();
    for to in 0..m.backlog.len() {
        if to == me {
            continue;
        }
        let mut moved = Vec::new();
        {
            // Held while popping: a next run of `to` taking its ends waits for it.
            let mut c = lock(&mesh.consumers[me * mesh.n + to]);
            let Some(c) = c.as_mut() else {
                // The owner still holds its end: it drains the ring in its shutdown, unless it
                // is past its last drain (leaving, its end not yet given back). So wait while
                // this loop has anything for it, in the ring too: left there, what was sent
                // before this shutdown was dropped by `run()`'s sweep (`Mesh::drop_queued`),
                // not kept for the owner's next run.
                waits |= !m.backlog[to].is_empty()
                    || m.out[to]
                        .as_ref()
                        .is_some_and(|p| p.slots() < p.buffer().capacity());
                continue;
            };
            while let Ok(r) = c.pop() {
                moved.push(r);
            }
        }
        let backlog = std::mem::take(&mut m.backlog[to]);
        m.backlogged -= backlog.len();
        moved.extend(backlog);
        // The newest ones, up to what this shutdown sent, are its drops' (the owner may have
        // taken some of those before it stopped: then all of these are).
        let late = m
            .stopping
            .as_mut()
            .map_or(0, |s| std::mem::take(&mut s[to]));
        let keep = moved.len().saturating_sub(late);
        // Each leaves the ring mesh: its push was counted as sent on the ring (rule 6), and
        // the ring will never count it received; the inbox counts a kept one from here. Counted
        // as handed over, which the quiescence check takes off the sent ones: taken off `sent`
        // itself, the published `messages_sent` went down.
        m.handed_over += moved.len() as u64;
        let owner = &core.exec.loops[to];
        if owner.poisoned.load(SeqCst) {
            // Its shutdown was cut short (`LoopShared::poisoned`; set before it gave its ring
            // ends back, so seen here): these may be wakes of its live `!Send` tasks, which no
            // other thread may drop or run.
            crate::event_loop::leak_all(moved);
            continue;
        }
        dropped.extend(moved.drain(keep..));
        if moved.is_empty() {
            continue;
        }
        hand_over(owner, moved);
    }
    let wakers: Vec<Waker> = m.waiters.iter_mut().flat_map(std::mem::take).collect();
    m.waiting = 0;
    drop(m);
    // Outside the mesh borrow: a closure's or waker's drop is user code that may send again
    // (into a ring just emptied, or a backlog): then the caller comes back for what it sent.
    let again = !dropped.is_empty() || !wakers.is_empty();
    crate::task::cancel_all(dropped);
    crate::task::drop_wakers_guarded(wakers);
    drain(core);
    (waits, again)
}

/// Rule 3c: a foreign wait (see `Core::flush_deferred`) in a drop that this loop's shutdown
/// runs, on the task at `awaited` (a join handle's; null for other waits): what the shutdown
/// does for loops that have stopped ([`evacuate`]) is done now too, that task is dropped
/// rather than kept for a stopped loop's next run ([`drop_awaited_kept`]), and the wait joins
/// the foreign list of each ring that still holds something for an owner still holding its
/// end. What sits in a ring of a loop that has stopped is drained by no thread: the shutdown
/// hands it over or drops it, but only once the drop returns, and a drop that waited for it
/// never returned, nor did `run()`. For an owner still running or shutting down, the wait
/// ends when it drains the call (and runs or drops it: the call's own wake), or when it stops
/// without draining it (past its last drain): its `Mesh::give_back` wakes the list, and the
/// next poll's evacuation hands the call over or drops it. The waker
/// joins before the announce (`want_space`, whose swap by the consumer's drain also wakes the
/// list) and before the look at the consumer's slot, which `give_back` fills before it takes
/// the list: whichever comes second sees the other. Cost outside a shutdown: a borrow and a
/// load; inside one, an evacuation, and per ring still holding something a lock, a swap and a
/// look at the consumer's slot (a second lock).
pub(crate) fn wait_in_shutdown(core: &Core, waker: &Waker, awaited: *const crate::task::TaskMeta) {
    if !core.mesh.borrow().is_stopping() {
        return;
    }
    // As the shutdown's passes: again while the drops an evacuation ran may have sent more.
    while evacuate_parts(core).1 {}
    if !awaited.is_null() && drop_awaited_kept(core, awaited) {
        // The awaited task is another loop's and not over (or a migratable task that a loop
        // may still run, or whose `Runnable` is on its way to a queue): what will end it
        // (that loop's run or shutdown) wakes this wait, but what may instead keep it for
        // that loop's next run (or leave it parked until every loop has stopped) wakes no one
        // here (a plain thread's spawn that came after that shutdown's last
        // look at its inbox, a third loop's evacuation handing it over once that loop has
        // stopped). Polled again 1 ms later (a sleep of this thread, which the drop blocks
        // anyway), as the shutdown's own wait.
        std::thread::sleep(std::time::Duration::from_millis(1));
        waker.wake_by_ref();
        return;
    }
    let mesh = &core.exec.mesh;
    let (me, left) = {
        let m = core.mesh.borrow();
        let left: Vec<usize> = (0..m.out.len())
            .filter(|&to| to != m.me && !ring_empty(&m, to))
            .collect();
        (m.me, left)
    };
    for to in left {
        join_foreign(core, me, to, waker);
        mesh.want_space(me, to).swap(true, SeqCst);
        let stopped = lock(&mesh.consumers[me * mesh.n + to]).is_some();
        if stopped || ring_empty(&core.mesh.borrow(), to) {
            // Changed since the evacuation: poll again (an evacuation of its own).
            waker.wake_by_ref();
            return;
        }
    }
}

/// The task at `awaited`, which a drop of this loop's shutdown blocks on, if an evacuation
/// (this shutdown's, the wait's own just before, another loop's) or a plain thread left it in
/// the inbox of a loop that has stopped, for that loop's next run: taken out and dropped (its
/// join handle: cancelled).
/// Kept, it waited for a run that cannot start before this one ends, which waits for the drop.
/// What an evacuation keeps for a stopped loop is a spawn, whose `Send` closure any thread may
/// drop (a stopped loop has no live task to wake). A loop still running or shutting down
/// takes its inbox itself (and drops it: the executor is stopping). A migratable task, whose
/// `Runnable` is in no inbox, is dropped here once no loop may run it any more
/// ([`crate::steal::cancel_awaited_at_stop`]). Returns whether the wait must look again: the
/// task is another healthy loop's pinned task, or a migratable task some loop may still run
/// (or whose `Runnable` is in flight), and was not found here.
fn drop_awaited_kept(core: &Core, awaited: *const crate::task::TaskMeta) -> bool {
    // SAFETY: `awaited` is the metadata of the task whose join handle is being polled, in the
    // caller's frame: the handle keeps the task's header, and so its `Home`, alive; a `Home`
    // keeps its loop's `LoopShared` alive.
    let home = unsafe { &*crate::task::Home::as_ptr(&(*awaited).home) };
    let me = core.index();
    let Some(to) = core
        .exec
        .loops
        .iter()
        .position(|l| std::ptr::eq(&**l, home))
    else {
        // Another executor's task.
        return false;
    };
    // SAFETY: as above.
    if unsafe { &*awaited }.class.load(SeqCst) == crate::task::MIGRATABLE_CLASS {
        // A migratable task, of any loop (this one's too: parked, it is in no loop's registry,
        // and this shutdown does not drop it): dropped here once no loop may run it.
        return crate::steal::cancel_awaited_at_stop(core, awaited);
    }
    if to == me || home.poisoned.load(SeqCst) {
        // This loop's own (a stopping loop runs nothing: dropped by this shutdown), or a
        // poisoned loop's, whose inbox may hold wakes of its live `!Send` tasks.
        return false;
    }
    let mesh = &core.exec.mesh;
    if lock(&mesh.consumers[me * mesh.n + to]).is_none() {
        return true;
    }
    if let Some(r) = home
        .inbox
        .take_where(|r| std::ptr::eq(r.metadata(), awaited))
    {
        // Taken from that loop's inbox, as its shutdown would have (`inbox_received`); no
        // loop of it runs now, so its single-writer count may be written here.
        crate::stats::bump(&home.stats.inbox_received, 1);
        crate::task::cancel(r);
        return false;
    }
    true
}

/// Whether this loop's ring to `to` holds nothing (or there is none).
fn ring_empty(m: &LocalMesh, to: usize) -> bool {
    m.out[to]
        .as_ref()
        .is_none_or(|p| p.slots() == p.buffer().capacity())
}

/// Whether a [`reserve`] for loop `to` would be ready now with room (rule 3): `to` can take a
/// message from this loop without backlog, or there is no ring to wait on (`to` is this loop,
/// or out of range); never once this loop's shutdown began (the reserve then refuses). Cost:
/// a borrow and three loads.
#[inline]
pub(crate) fn reserved(core: &Core, to: usize) -> bool {
    core.mesh.borrow().reserved(to)
}

/// Waits until loop `to` can take a message from this loop without backlog (rule 3), and
/// resolves to `true`; to `false` at once, sending nothing, once this loop's shutdown has
/// begun (a call from a `Drop` that the shutdown runs): the executor is stopping, so a call
/// is dropped unrun by the shutdown that finds it (this loop's own included: a stopping loop
/// runs nothing), and a `Drop` that waited for it waited on that shutdown, which may itself
/// be blocked in a `Drop` waiting on this loop's (two such calls, each to the other's shard,
/// waited for good; one to this loop's own shard, for good too).
pub(crate) fn reserve(to: usize) -> Reserve {
    Reserve { to }
}

/// Future of [`reserve`].
#[derive(Debug)]
pub(crate) struct Reserve {
    to: usize,
}

impl Future for Reserve {
    type Output = bool;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let to = self.to;
        let ready = with_core(|core| {
            let m = core.mesh.borrow();
            if m.stopping.is_some() {
                return Some(false);
            }
            if m.reserved(to) {
                return Some(true);
            }
            // One entry per task: a `Reserve` polled again while it waits (a `select!` with a
            // timer, a re-created `submit_to`) would otherwise add a waker clone per poll.
            let known = m.waiters[to].iter().any(|w| w.will_wake(cx.waker()));
            let me = m.me;
            drop(m);
            if !known {
                // Cloned outside the borrow: a waker's clone is user code (a custom waker)
                // that may send to another shard, which borrows the mesh again.
                let w = cx.waker().clone();
                let mut m = core.mesh.borrow_mut();
                m.waiters[to].push(w);
                m.waiting += 1;
            }
            if !known {
                bump(&core.shared.stats.ring_full_waits, 1);
            }
            if !crate::task::polled_with_own_waker(core, cx.waker()) {
                // Rule 3b: maybe a foreign executor that blocks this loop's thread until its
                // waker is woken, so the consumer wakes it (this loop's turn may never end),
                // and what the end of the turn would do goes now: the pings of what this turn
                // pushed (a consumer parked on a full ring drains nothing, and so swaps no
                // flag), and the backlog moves this reserve waits for (it needs the backlog
                // empty, and the consumer's wake would find it still there).
                join_foreign(core, me, to, cx.waker());
                core.flush_deferred(cx.waker());
            }
            // Rule 3: announce, then recheck.
            core.exec.mesh.want_space(me, to).swap(true, SeqCst);
            core.mesh.borrow().has_space(to).then_some(true)
        })
        .unwrap_or(Some(true));
        match ready {
            // A waker left on the list by the recheck path only costs a spurious wake.
            Some(room) => Poll::Ready(room),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        panic::AssertUnwindSafe,
        sync::{
            atomic::{AtomicBool, Ordering::SeqCst},
            Arc,
        },
    };

    use super::{LocalMesh, Mesh};
    use crate::task::{self, Home, TaskInfo};

    /// Sets its flag when dropped.
    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }

    /// Gives a loop's ring ends back when dropped, as `Core`'s drop does.
    struct GiveBack<'a>(
        &'a Mesh,
        Option<LocalMesh>,
        &'a [Arc<crate::event_loop::LoopShared>],
    );

    impl Drop for GiveBack<'_> {
        fn drop(&mut self) {
            if let Some(local) = self.1.take() {
                self.0.give_back(local, self.2);
            }
        }
    }

    /// A loop whose own code panics while it holds a backlog for another shard gives its
    /// ends back during the unwind: the backlog's task, which belongs to that other shard,
    /// is not dropped on this thread (a pinned task's future may be `!Send`). It goes to its
    /// owner's inbox, whose shutdown drops it on the owner's thread: leaked, a wake of one of
    /// the owner's parked tasks left that shutdown waiting for good. For an owner that is
    /// poisoned too, it is leaked.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "leaks the backlog's task, as it should: Miri reports leaks"
    )]
    fn a_backlog_given_back_by_a_panicking_loop_goes_to_its_owner_not_dropped_on_its_thread() {
        for owner_poisoned in [false, true] {
            let exec = crate::Executor::builder()
                .shards(2)
                .oversubscribe(true)
                .build()
                .unwrap();
            let owner = exec.handle().shared.loops[1].clone();
            owner.poisoned.store(owner_poisoned, SeqCst);
            let dropped = Arc::new(AtomicBool::new(false));
            let flag = Flag(dropped.clone());
            let (runnable, join) = task::create(
                Home::new(&owner),
                move || {
                    let _flag = flag;
                    async {}
                },
                TaskInfo::here(None),
                0,
            );
            drop(join);
            let mesh = Mesh::new(2, 4);
            let mut local = mesh.take(0);
            local.backlogged = 1;
            local.backlog[1].push_back(runnable);
            let (pushed, _) = owner.inbox.counts();
            let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let loops = exec.handle().shared.loops.clone();
                let _give_back = GiveBack(&mesh, Some(local), &loops);
                panic!("test: a loop's own code panics");
            }));
            assert!(unwound.is_err());
            assert!(
                !dropped.load(SeqCst),
                "the other shard's task was dropped on the panicking loop's thread"
            );
            let moved = owner.inbox.counts().0 - pushed;
            assert_eq!(
                moved,
                u64::from(!owner_poisoned),
                "owner poisoned: {owner_poisoned}"
            );
            // The ends are back for the next run.
            let again = mesh.take(0);
            assert!(again.out[1].is_some() && again.inc[1].is_some());
            mesh.give_back(again, &[]);
        }
    }

    /// A waker woken (or dropped) sets its flag.
    struct FlagWake(Arc<AtomicBool>, Arc<AtomicBool>);

    impl std::task::Wake for FlagWake {
        fn wake(self: Arc<Self>) {
            self.0.store(true, SeqCst);
        }
    }

    impl Drop for FlagWake {
        fn drop(&mut self) {
            self.1.store(true, SeqCst);
        }
    }

    /// Rule 3 state an earlier run left for a loop's outgoing rings (a `want_space` flag, a
    /// foreign waiter whose wait ended another way) is gone when the loop takes its ends
    /// again: the waker is dropped unwoken rather than kept alive until a later consumer's
    /// drain woke it for nothing.
    #[test]
    fn taking_the_ring_ends_clears_an_earlier_runs_space_waits() {
        let mesh = Mesh::new(2, 4);
        let (woken, dropped) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let waker = std::task::Waker::from(Arc::new(FlagWake(woken.clone(), dropped.clone())));
        mesh.foreign(0, 1).lock().unwrap().push(waker);
        mesh.want_space(0, 1).store(true, SeqCst);
        let local = mesh.take(0);
        assert!(!mesh.want_space(0, 1).load(SeqCst), "the stale flag stayed");
        assert!(
            mesh.foreign(0, 1).lock().unwrap().is_empty(),
            "the stale waiter stayed"
        );
        assert!(dropped.load(SeqCst), "the stale waker was kept alive");
        assert!(!woken.load(SeqCst), "the stale waker was woken");
        mesh.give_back(local, &[]);
    }
}
