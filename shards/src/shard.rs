//! The per-shard API for code running inside a task: who am I, how many are we, spawn here.
//!
//! `shard::id()` is 0-based and `shard::count()` sizes per-core state; a standalone
//! [`LocalExecutor`](crate::LocalExecutor) is shard 0 of 1 (invariant 1 in the crate docs).

use std::future::Future;

use crate::{
    context::{self, with_core},
    executor::{Handle, StopReason},
    ring,
    task::{self, JoinHandle, TaskInfo},
    Error, JoinError, Result,
};

/// Maps a cross-shard task's outcome to the `submit_to` result.
pub(crate) fn join_result<T>(r: std::result::Result<T, JoinError>) -> Result<T> {
    match r {
        Ok(v) => Ok(v),
        Err(e) if e.is_cancelled() => Err(Error::Stopped),
        Err(e) => Err(Error::Join(e)),
    }
}

/// Runs `make()`'s future on shard `shard` and resolves to its output (Seastar's
/// `submit_to`). The closure is `Send` and is called on `shard`, so the future it returns may be
/// `!Send`; the output travels back with the wake of the awaiting task, over the reverse ring.
///
/// On the caller's own shard it runs as a local task, without a ring. If the ring to `shard`
/// is full the caller waits for space first (backpressure). Nothing is sent before the first
/// poll, nor while the call waits for ring space; once sent, dropping the future (a
/// [`timeout`](crate::time::timeout) around it, a `select!`) does not cancel the call: the
/// closure still runs on `shard`, and its output is dropped. `Err(InvalidShard)` for an
/// out-of-range shard, `Err(Join)` if the closure or its future panicked (the target loop goes
/// on), `Err(Stopped)` if the executor stopped before it completed, and at once, nothing sent,
/// from a `Drop` that this loop's shutdown runs (to any shard: see "Blocking a loop" in the
/// crate docs), `Err(OffLoop)` off any loop (use [`Handle::submit_to`] there).
///
/// Cost: one task allocation, one ring message each way and one local wake; no lock. Shared
/// atomics: the rings' own indices, the task's state (async-task), and a reference to the
/// target loop taken and given back (its task's home: a counter every sender to that loop
/// updates; none for a call to the caller's own shard, `task/home.rs`); plus a wake ping only
/// if the target sleeps.
#[track_caller]
pub fn submit_to<F, Fut>(shard: usize, make: F) -> impl Future<Output = Result<Fut::Output>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    let info = TaskInfo::here(None);
    async move {
        let owner = reserve_on(shard, "xtc::shard::submit_to").await?;
        let (join, remote) = spawn_call(owner, shard, make, info);
        join_result(AwaitReply::new(join, remote).await)
    }
}

/// Creates the task of a call to loop `shard` (`owner`) and queues it as its schedule function
/// would (task protocol rule 1: the ring to `owner`, or its backlog, from another loop of its
/// executor; the local queue on `owner` itself; `owner`'s inbox from anywhere else), under one
/// look-up of the current loop, which also tells whether the call leaves this shard (the
/// second value). `Runnable::schedule` took async-task's vtable call into the same schedule
/// function, which looked the current loop up twice more (callgrind: about 40 instructions
/// per `submit_to`). Inline, as `task::create` in it is: built into the caller's future.
#[inline]
fn spawn_call<F, Fut>(
    owner: task::Home,
    shard: usize,
    make: F,
    info: TaskInfo,
) -> (JoinHandle<Fut::Output>, bool)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    let (runnable, join) = task::create(owner, make, info, 0);
    let mut queued = Some(runnable);
    let remote = with_core(|c| {
        let runnable = queued.take()?;
        // SAFETY: the pointer comes from the `Home` in this task's metadata, which keeps the
        // loop alive while we hold `runnable`; `route_from` reads what it needs before it
        // hands `runnable` on (as in `task::schedule_away`). The reference outlives that hand
        // over (it is `route_from`'s argument for the whole call): on the paths that hand the
        // task on, this loop is one of the owner's executor's (`c.exec.loops` holds the
        // owner's `Arc` for the whole run, `context.rs`), and on the others it is handed back.
        let owner = unsafe { &*task::Home::as_ptr(&runnable.metadata().home) };
        // A loop of another executor (a future polled by hand there) hands it back.
        queued = context::route_from(c, owner, runnable);
        Some(c.index() != shard)
    })
    .flatten();
    if let Some(runnable) = queued {
        // Off any loop, or on another executor's: the owner's inbox and a wake ping.
        runnable.schedule();
    }
    (join, remote.unwrap_or(false))
}

/// The join of a cross-shard call: while it waits in a pinned task, that task polls for the
/// reply itself for up to the reply spin, as long as its loop has no other pinned task to run
/// (each poll: two loads of the call's task header, a clock read and a self-wake), and then
/// the polling loop knows a reply is on its way and spins for it up to the reply spin before
/// it parks ([`Handle::set_reply_spin`](crate::Handle::set_reply_spin)); a migratable
/// caller's reply wakes it on the target's loop instead. Cost: a thread-local read and a load
/// per `Pending` poll of a remote call (and two writes for a pinned caller, one more when it
/// resolves or is dropped); none for a call to the caller's own shard.
struct AwaitReply<T> {
    join: JoinHandle<T>,
    remote: bool,
    /// The loop run (`Core::id`) whose `Core::replies_awaited` counts this join, from its
    /// first waiting poll in a pinned task until it resolves or is dropped.
    counted_on: Option<u64>,
    /// A pinned caller polls for the reply itself until then (the reply spin from its first
    /// waiting poll), while its loop has no other pinned task to run: it sees the call's task
    /// complete one cache-line transfer after the target marks it so, where the reply's
    /// wake-up took four more (the caller task's header on the target, the ring's tail and
    /// slot, the header back): a spinning round trip went from about 1.1 µs to 0.85 µs on the
    /// development VM. `Some(None)`: spun out, or other work came (the loop's own reply spin,
    /// `event_loop` step 6, takes over once it runs out of work).
    spin_until: Option<Option<std::time::Instant>>,
}

impl<T> AwaitReply<T> {
    fn new(join: JoinHandle<T>, remote: bool) -> Self {
        AwaitReply {
            join: join.unshared(),
            remote,
            counted_on: None,
            spin_until: None,
        }
    }

    /// Takes this join off the count of the loop run that counted it. Off that run (the
    /// future moved to another loop, or is dropped off any loop, or in a later run of the same
    /// loop) there is nothing to take it from: that run's count then stays high, which only
    /// lets a later waiting poll there spin as it did before the count existed.
    fn uncount(&mut self) {
        if let Some(id) = self.counted_on.take() {
            with_core(|c| {
                if c.id == id {
                    c.replies_awaited
                        .set(c.replies_awaited.get().saturating_sub(1));
                }
            });
        }
    }
}

impl<T> Future for AwaitReply<T> {
    type Output = std::result::Result<T, JoinError>;

    #[inline]
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        // Polling for the reply: `is_finished` only loads (a poll of the join would write the
        // task's header while the target runs it; this handle is never aborted), and the task
        // goes to the back of its loop's queue.
        if let Some(Some(until)) = this.spin_until {
            if !this.join.is_finished() {
                let alone = with_core(|c| !c.pinned_queued()).unwrap_or(false);
                if alone && std::time::Instant::now() < until {
                    cx.waker().wake_by_ref();
                    return std::task::Poll::Pending;
                }
                // Spun out, or other tasks wait to run: wait for the reply's wake-up (the
                // join below registers this poll's waker), with the loop's own reply spin.
                this.spin_until = Some(None);
            }
        }
        let out = std::pin::Pin::new(&mut this.join).poll(cx);
        if !this.remote {
            return out;
        }
        if out.is_ready() {
            // Answered: its loop no longer spins for it (event_loop::reply_spin_due).
            this.uncount();
            return out;
        }
        // Read at the park decision of the loop polling now, where a pinned caller's reply
        // comes back (over the ring from the target). A migratable caller's does not: the
        // target's loop wakes it onto its own deque (steal/mod.rs rule 1), so its loop would
        // spin for nothing (up to the whole reply spin, after every such poll).
        let counted = &mut this.counted_on;
        let spin = &mut this.spin_until;
        let spinning = with_core(|c| {
            let meta = c.current.get();
            // SAFETY: `current` points to the metadata of the task this loop is polling (set
            // by the loop around the poll, null between polls), whose header is alive for the
            // whole poll.
            let pinned = !meta.is_null()
                && unsafe { &*meta }.class.load(crate::sync::Ordering::Relaxed)
                    != task::MIGRATABLE_CLASS;
            if !pinned {
                return false;
            }
            c.reply_awaited.set(true);
            if counted.is_none() {
                c.replies_awaited.set(c.replies_awaited.get() + 1);
                *counted = Some(c.id);
            }
            if spin.is_none() {
                // The first waiting poll of a task polled with its own waker (not a foreign
                // executor blocking inside it, which the self-wake would spin) starts the spin.
                let reply_spin = c.exec.reply_spin();
                *spin = Some(
                    (!reply_spin.is_zero() && task::polled_with_own_waker(c, cx.waker()))
                        .then(|| std::time::Instant::now() + reply_spin),
                );
                if let Some(Some(_)) = spin {
                    // The call's ring ping (a sleeping target's wake-up) goes now, not at the
                    // end of this turn: the loop's batch would poll this task up to 128 times
                    // first, which delayed the wake-up of a parked target by some 20 µs.
                    ring::flush(c);
                    return true;
                }
            }
            false
        })
        .unwrap_or(false);
        if spinning {
            cx.waker().wake_by_ref();
        }
        out
    }
}

impl<T> Drop for AwaitReply<T> {
    fn drop(&mut self) {
        // Given up while it waited (a timeout, a `select!`): nothing to spin for any more.
        self.uncount();
    }
}

/// The target loop of a cross-shard call from the current loop, once its ring has space
/// (ring protocol rule 3; no ring to the caller's own shard).
pub(crate) async fn reserve_on(shard: usize, what: &'static str) -> Result<task::Home> {
    // The target loop is looked up under the borrow: cloning the executor's `Arc` here would
    // be a read-modify-write on a count every loop writes, once per message. A ring with room
    // now is looked at under the same borrow: the wait future would be ready at its first poll
    // (it checks the same, with nothing in between), and polled as one it cost about 40
    // instructions per call (callgrind).
    //
    // A call that need not wait (to the caller's own shard, which has no ring to wait on, or
    // into a ring with room) is ready at once: it spends the task's cooperative budget
    // (`context::coop_spend`) and, that spent, yields once first. A `send_to` loop to its own
    // shard, or to one that drains its ring faster than this task fills it, never returned
    // `Pending` and held its loop for good (to its own shard, the tasks it queued never ran,
    // and piled up).
    let (owner, wait, spent) = with_core(|c| {
        c.exec.shard(shard).map(|o| {
            let wait = !ring::reserved(c, shard);
            (task::Home::new(o), wait, !wait && !c.coop_spend())
        })
    })
    .ok_or_else(|| Error::OffLoop(what))??;
    if spent {
        // The batch ends after this poll (`coop_spend` saw to it).
        crate::yield_now().await;
    }
    // After a yield, the room may have gone meanwhile: looked at again (ready at once while
    // there is room, and for the own shard). Refused in a stopping loop (`ring::reserve`).
    if (wait || spent) && !ring::reserve(shard).await {
        return Err(Error::Stopped);
    }
    Ok(owner)
}

/// Runs `make` on every shard (the closure is cloned once per shard) and collects the outputs
/// in shard order (Seastar's `invoke_on_all`). The calls run concurrently; dropping the
/// future does not cancel those already sent (as [`submit_to`]). Off any loop the result is a
/// single `Err(OffLoop)`. Cost: a [`submit_to`] per shard (the caller's own shard runs its call
/// locally, without a ring), a clone of `make` each, and the output `Vec`.
#[track_caller]
pub fn submit_to_all<F, Fut>(make: F) -> impl Future<Output = Vec<Result<Fut::Output>>>
where
    F: FnOnce() -> Fut + Clone + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    let info = TaskInfo::here(None);
    async move {
        let Some(exec) = with_core(|c| c.exec.clone()) else {
            return vec![Err(Error::OffLoop("xtc::shard::submit_to_all"))];
        };
        // No shard index is kept across the waits: a migratable caller may be stolen while it
        // waits for ring space and send the rest from its new shard. `reserve` is ready at once
        // for the shard it runs on, and `spawn_call` tells at queueing time whether the call
        // leaves it (for the reply spin).
        let mut handles = Vec::with_capacity(exec.loops.len());
        for (i, owner) in exec.loops.iter().enumerate() {
            if !ring::reserve(i).await {
                // Refused in a stopping loop (`ring::reserve`).
                handles.push(None);
                continue;
            }
            let (join, remote) = spawn_call(task::Home::new(owner), i, make.clone(), info.clone());
            handles.push(Some(AwaitReply::new(join, remote)));
        }
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(match h {
                Some(h) => join_result(h.await),
                None => Err(Error::Stopped),
            });
        }
        out
    }
}

/// [`submit_to_all`] of a fallible call, flattened: `Ok` with every shard's value in shard
/// order, or the first failure in shard order, the call's own error or xtc's converted by
/// `E: From<xtc::Error>` (which `xtc::Error` itself, `std::io::Error`, `anyhow::Error` and
/// `Box<dyn Error + Send + Sync>` are). As Seastar's `invoke_on_all`, it resolves only once
/// every call has finished (or failed), also when an early one failed, so after the `.await`
/// no call is still running; a later shard's value is then dropped. Off any loop it is
/// `Err(OffLoop)`, converted. Cost: [`submit_to_all`]'s.
///
/// ```
/// # use xtc_shards as xtc;
/// let exec = xtc::Executor::builder().shards(2).oversubscribe(true).build()?;
/// let lens = exec.block_on(|| async {
///     // Each shard's part, read where it lives; `?` takes an io::Error or an xtc::Error.
///     xtc::shard::try_submit_to_all(|| async {
///         std::io::Result::Ok(xtc::shard::id() * 10)
///     })
///     .await
/// })?;
/// assert_eq!(lens?, vec![0, 10]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[track_caller]
pub fn try_submit_to_all<F, Fut, T, E>(
    make: F,
) -> impl Future<Output = std::result::Result<Vec<T>, E>>
where
    F: FnOnce() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = std::result::Result<T, E>> + 'static,
    T: Send + 'static,
    E: From<Error> + Send + 'static,
{
    let all = submit_to_all(make);
    async move {
        // Off any loop, named as this call (`submit_to_all` would name itself).
        if with_core(|_| ()).is_none() {
            return Err(Error::OffLoop("xtc::shard::try_submit_to_all").into());
        }
        first_failure(all.await)
    }
}

/// The values of `all` in order, or its first failure, xtc's converted into `E`.
pub(crate) fn first_failure<T, E: From<Error>>(
    all: Vec<Result<std::result::Result<T, E>>>,
) -> std::result::Result<Vec<T>, E> {
    all.into_iter().map(|r| r.map_err(E::from)?).collect()
}

/// Fire-and-forget: sends `make` to run on `shard` and resolves once the message is enqueued
/// (after waiting for ring space if the ring is full), not when it has run.
/// `Err(InvalidShard)` for an out-of-range shard, `Err(OffLoop)` off any loop (use
/// [`Handle::send_to`] there), `Err(Stopped)` at once, nothing sent, from a `Drop` that this
/// loop's shutdown runs (as [`submit_to`]); nothing else: a panic on the target is caught there
/// and not reported, and a closure the executor's stop drops unrun is not reported either. Cost: as
/// [`submit_to`]'s, less the reply. A call that finds room (or sends to its own shard)
/// resolves without a loop turn; after 128 such calls in one poll of the task, the next one
/// yields for one turn first, so a loop of sends cannot hold its loop.
///
/// # Ordering
/// Messages from one shard to another start in the order they were sent (one ring per
/// ordered pair, FIFO), as with [`submit_to`]. Nothing more is promised: not between what
/// different shards send, not between these ring messages and what a plain thread sends
/// through [`Handle::send_to`] (the target's inbox), and not for a migratable task that
/// moves between two sends (stolen, or woken from another loop, which it then runs on: its
/// sends leave from two shards), not across a stop (what the stop drops unrun is gone, while
/// a later send, made after the target stopped, is kept for its next run), and not between calls
/// spawned into different scheduling classes on the target (`task::Builder::class`: each class
/// is a lane of its own, picked by its shares, so a later call in one class may start before an
/// earlier one in another). A protocol that needs order across those awaits each
/// [`submit_to`] before sending the next.
#[track_caller]
pub fn send_to<F, Fut>(shard: usize, make: F) -> impl Future<Output = Result<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    let info = TaskInfo::here(None);
    async move {
        let owner = reserve_on(shard, "xtc::shard::send_to").await?;
        drop(spawn_call(owner, shard, make, info));
        Ok(())
    }
}

/// The 0-based index of the shard the caller runs on. Cost: one thread-local read.
///
/// # Panics
/// Off any xtc loop (a plain thread): use [`try_id`] there.
pub fn id() -> usize {
    try_id().expect(
        "xtc::shard::id() called off any xtc loop: call it inside a task, or use shard::try_id()",
    )
}

/// The index of the caller's shard, or `None` off any loop. Cost: one thread-local read.
pub fn try_id() -> Option<usize> {
    with_core(|c| c.index())
}

/// The number of shards of the caller's executor (1 in a `LocalExecutor`), or 0 off any loop.
/// Cost: one thread-local read.
pub fn count() -> usize {
    with_core(|c| c.exec.loops.len()).unwrap_or(0)
}

/// The CPU (OS index) the caller's shard was placed on (`Executor::placement`): the one its
/// thread is pinned to, or the one it would be with `pin(false)` or on a synthetic or XML
/// topology, where nothing is pinned. `None` off any loop and in a `LocalExecutor`, which
/// places nothing. Cost: one thread-local read and a slice lookup.
pub fn cpu() -> Option<usize> {
    with_core(|c| c.exec.placement.as_ref()?.cpu(c.index())).flatten()
}

/// The NUMA node (hwloc's logical index) of the caller's shard's CPU, to keep per-node state
/// or route work to a shard of the same node (`Handle::placement` gives every shard's).
/// `None` off any loop, in a `LocalExecutor`, and where the topology has no NUMA information
/// for that CPU. Cost: one thread-local read and a slice lookup.
pub fn numa_node() -> Option<usize> {
    with_core(|c| c.exec.placement.as_ref()?.numa_node(c.index())).flatten()
}

/// A [`Handle`] to the caller's executor, or `None` off any loop. Cost: one thread-local read
/// and an `Arc` clone (an atomic increment on a count every loop shares).
pub fn handle() -> Option<Handle> {
    context::exec().map(|shared| Handle { shared })
}

/// Spawns a pinned task on the current shard. The future may be `!Send`; it never leaves
/// this shard. Cost: one allocation and a thread-local queue push; no atomic shared with
/// another core.
///
/// # Panics
/// Off any xtc loop (there is no shard to put the task on).
#[track_caller]
pub fn spawn_local<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    spawn_local_with(fut, TaskInfo::here(None), 0)
}

/// [`spawn_local`] with a name and spawn site, into scheduling class `class` (0: default).
pub(crate) fn spawn_local_with<F>(fut: F, info: TaskInfo, class: u32) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    // On the owner's thread by construction: the runnable goes straight onto this loop's queue
    // (what `task::schedule` would route it to, without its thread-local lookup).
    with_core(|c| {
        let (runnable, handle) = task::create(task::Home::of_core(c), move || fut, info, class);
        c.enqueue(runnable);
        handle
    })
    .expect(
        "xtc::spawn_local called off any xtc loop: call it inside a task, or use Handle::spawn_on",
    )
}

/// Spawns a **migratable** task on the current loop (for locality); idle loops may steal it.
/// The future must be `Send`. Re-read [`id()`] after an `.await` to notice a move. Cost: one
/// allocation and a push on this loop's deque (no atomic read-modify-write: the live-task
/// count is settled once per loop turn); the turn's first spawn also raises this loop's
/// `spawning` flag (a store and a fence) and pings the loops that sleep without an idle tick;
/// with eager rebalance on, a nudge of an idle peer at the end of the turn; the first time
/// the task parks, a registry insert under a per-shard lock.
///
/// When a run stops, a migratable task queued on a loop is dropped on that loop, but one that
/// is parked is dropped off any loop, on the thread in `run()` (the loops have stopped): its
/// future's `Drop` must not need a loop (no `spawn_local`, no `shard::id()`; `try_id()` tells).
///
/// # Panics
/// Off any xtc loop (use [`Handle::spawn`] there).
#[track_caller]
pub fn spawn<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    spawn_with(fut, TaskInfo::here(None))
}

pub(crate) fn spawn_with<F>(fut: F, info: TaskInfo) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    // Spawned under the borrow of the current loop: cloning the executor's `Arc` would be a
    // read-modify-write on a count every loop writes, once per spawn.
    with_core(move |c| crate::steal::spawn_here(c, fut, info))
        .expect("xtc::spawn called off any xtc loop: call it inside a task, or use Handle::spawn")
}

/// Creates a scheduling class on the current loop: `shares` 1..=1000 (a class with 3× the
/// shares of another gets about 3× the CPU when both are always runnable), and an optional
/// latency bound: while a task of the class is runnable, [`yield_if_due`](crate::yield_if_due)
/// tells a task that has run that long to yield. The bound shortens the yield interval; it is
/// not a priority: the next task is still picked by virtual runtime, so a latency class that
/// has used more than its share of the CPU waits for its turn by shares. `Err` for
/// shares out of range, a zero bound, or off any loop. Cost: one allocation of about 64 bytes
/// for the life of the process, a process-wide lock and the loop's class-list lock; once a
/// loop has a class, each of its task polls costs one clock read (a time-stamp counter read
/// where the CPU and the kernel trust it, about 12 ns with the difference; else a
/// `clock_gettime`) and the class's accounting.
pub fn create_class(shares: u32, latency: Option<std::time::Duration>) -> Result<crate::Class> {
    crate::class::create_here(shares, latency)
}

/// Moves the calling task into class `class` (it takes effect from the task's next wake).
/// `Err` off any loop, for a class of another loop (another shard, or another executor's), or
/// in a migratable task (classes order one loop's pinned tasks). Cost: a thread-local read and
/// an atomic store in the task's header.
pub fn set_class(class: crate::Class) -> Result<()> {
    with_core(|c| {
        if class.exec_id != c.shared.exec_id {
            return Err(Error::InvalidArgument(format!(
                "set_class: the class belongs to shard {} of another executor; create it on \
                 this one (shard::create_class here, or this executor's Handle::create_class)",
                class.shard
            )));
        }
        if class.shard != c.index() {
            return Err(Error::InvalidArgument(format!(
                "set_class: the class belongs to shard {}, this task runs on shard {}",
                class.shard,
                c.index()
            )));
        }
        let meta = c.current.get();
        if meta.is_null() {
            return Err(Error::OffLoop(
                "xtc::shard::set_class (outside a task poll)",
            ));
        }
        // SAFETY: `current` points to the metadata of the task being polled on this thread,
        // set by the loop right before its poll and cleared right after; code the loop runs
        // once async-task may have freed that task (an awaiter woken after async-task dropped
        // its reference: a guarded foreign waker, or a cancel) runs under
        // `context::outside_task`, which makes it null.
        let slot = &unsafe { &*meta }.class;
        if slot.load(crate::sync::Ordering::Relaxed) == crate::task::MIGRATABLE_CLASS {
            return Err(Error::InvalidArgument(
                "set_class: classes are for pinned tasks (spawn_local, spawn_on); a migratable \
                 task (xtc::spawn) runs from the steal deques, outside every class"
                    .into(),
            ));
        }
        slot.store(class.id, crate::sync::Ordering::Relaxed);
        Ok(())
    })
    .unwrap_or(Err(Error::OffLoop("xtc::shard::set_class")))
}

/// Stops the caller's executor, as [`Handle::stop`]: `run()` returns once every loop has dropped
/// its tasks. Off any loop, and inside a [`LocalExecutor`](crate::LocalExecutor) (whose
/// `block_on` ends when its future does), it does nothing, and leaves nothing set for a later
/// `block_on`. Cost: as [`Handle::stop`]'s: an eventfd write per loop, and a lock and condvar
/// notify for the coordinator.
pub fn stop() {
    with_core(|c| c.exec.request_stop(StopReason::Requested));
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            atomic::{AtomicBool, Ordering::SeqCst},
            Arc,
        },
        time::Duration,
    };

    use futures_lite::future::poll_once;

    use crate::context::with_core;

    /// A `submit_to` to shard 1 whose closure answers `v` once `go` is set.
    fn call_answering_once<T: Send + 'static>(
        go: &Arc<AtomicBool>,
        v: T,
    ) -> impl std::future::Future<Output = crate::Result<T>> {
        let g = go.clone();
        super::submit_to(1, move || async move {
            while !g.load(SeqCst) {
                crate::time::sleep(Duration::from_millis(1)).await;
            }
            v
        })
    }

    /// Polls a `submit_to` to shard 1 once (its closure waits for the returned flag, so the
    /// poll finds no reply) and tells whether that poll asked this loop to spin for the reply.
    async fn one_pending_call_asks_for_a_spin() -> (bool, Arc<AtomicBool>) {
        let go = Arc::new(AtomicBool::new(false));
        let call = call_answering_once(&go, ());
        let mut call = std::pin::pin!(call);
        with_core(|c| c.reply_awaited.set(false));
        assert!(poll_once(call.as_mut()).await.is_none(), "no reply yet");
        let asked = with_core(|c| c.reply_awaited.replace(false)).unwrap();
        go.store(true, SeqCst);
        call.await.unwrap();
        (asked, go)
    }

    /// A pinned task whose `submit_to` join waited (flagging its loop for the reply spin) and
    /// then got its reply before the loop ran out of work (other tasks kept it busy) awaits
    /// nothing any more: the loop must not spin for that reply at its next park decision. It
    /// did: the flag stayed up, so the loop spun the whole reply spin (up to 1 s) for a reply
    /// it had already handled (the spin ends only when something new arrives).
    #[test]
    fn a_reply_handled_before_the_loop_idles_leaves_no_reply_spin_due() {
        let exec = crate::Executor::builder()
            .shards(2)
            .oversubscribe(true)
            .build()
            .unwrap();
        let (due_while_waiting, due_after) = exec
            .block_on(|| async {
                let go = Arc::new(AtomicBool::new(false));
                let call = call_answering_once(&go, 7);
                let mut call = std::pin::pin!(call);
                assert!(poll_once(call.as_mut()).await.is_none(), "no reply yet");
                // Another call still waits: a spin for it is due (then taken).
                let due_while_waiting = with_core(crate::event_loop::reply_spin_due).unwrap();
                assert!(poll_once(call.as_mut()).await.is_none(), "no reply yet");
                go.store(true, SeqCst);
                // Busy until the reply is in: each yield requeues this task, so the loop
                // reaches no park decision in between.
                let out = loop {
                    if let Some(out) = poll_once(call.as_mut()).await {
                        break out;
                    }
                    crate::yield_now().await;
                };
                assert_eq!(out.unwrap(), 7);
                let due_after = with_core(crate::event_loop::reply_spin_due).unwrap();
                (due_while_waiting, due_after)
            })
            .unwrap();
        assert!(due_while_waiting, "a waiting call asked for no reply spin");
        assert!(
            !due_after,
            "the loop would spin for a reply it has already handled"
        );
    }

    /// A migratable task awaiting a `submit_to` reply is woken onto the target's loop (steal
    /// rule 1), not the one it polled on: that loop has no reply to spin for. It used to spin
    /// the whole reply spin (up to 1 s) after every such poll, for nothing. A pinned caller's
    /// reply does come back to its loop, which spins for it.
    #[test]
    fn only_a_pinned_caller_makes_its_loop_spin_for_the_reply() {
        let exec = crate::Executor::builder()
            .shards(2)
            .oversubscribe(true)
            .build()
            .unwrap();
        // The migratable caller stays on shard 0 until the reply moves it.
        exec.set_stealing(false);
        let (pinned, migratable) = exec
            .block_on(|| async {
                let (pinned, _) = one_pending_call_asks_for_a_spin().await;
                let migratable = super::spawn(async {
                    assert_eq!(super::id(), 0);
                    one_pending_call_asks_for_a_spin().await.0
                })
                .await
                .unwrap();
                (pinned, migratable)
            })
            .unwrap();
        assert!(pinned, "a pinned caller's loop did not spin for its reply");
        assert!(
            !migratable,
            "a migratable caller's loop spun for a reply that goes to the target's loop"
        );
    }
}
