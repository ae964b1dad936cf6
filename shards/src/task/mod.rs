//! Tasks: allocation, reference counting and wakers come from `async-task`; this module adds
//! what a thread-per-core runtime needs around it.
//!
//! # Task protocol
//!
//! 1. **Owner.** Every task has exactly one owning loop, fixed at spawn. Its `schedule` function
//!    (see `schedule`) puts the `Runnable` on the owner's local run queue when called on the
//!    owner's thread, on the SPSC ring to the owner when called on another loop of the same
//!    executor (`ring/mod.rs`), and otherwise pushes it into the owner's inbox and unparks the
//!    owner (`event_loop/park.rs`, rule 2). A `Runnable` is therefore only ever run on its
//!    owner's thread, and dropped there too once its future was polled; this is what makes
//!    `spawn_unchecked` with a `!Send` future sound. Only a task never polled, whose future is
//!    still the `Send` closure of rule 2, is dropped elsewhere: one sent to a loop that has
//!    stopped (`ring::evacuate`), or left queued when no loop runs (`ExecShared::drop_queued`).
//! 2. **Lazy construction.** `spawn_on(i, f)` spawns a `TaskFuture` holding the `Send` closure;
//!    the closure is called on its first poll, on loop `i`, so the future it builds may be `!Send`.
//!    Until that poll the task owns only the closure, which may be dropped on any thread.
//! 3. **Registry.** The first time a task's poll returns `Pending` it registers itself in its
//!    owner's registry (a slab of waker + metadata pointer) and it removes itself when its future
//!    is dropped, which rule 1 puts on the owner's thread. A task that is runnable or running is
//!    in a queue or on the CPU, never unaccounted; one that finishes in its first poll never
//!    touches the registry. The registry is the owner's live-task count (quiescence), the
//!    list the deadlock report prints, and how a stopping loop reaches parked tasks: it wakes each
//!    one and drops the `Runnable` instead of running it, so every future is dropped on its own
//!    thread and no task leaks.
//! 4. **Panics.** The poll of the user's future runs under `catch_unwind`; a panic completes the
//!    task with the payload, which the [`JoinHandle`] turns into a [`JoinError`](crate::JoinError).
//!    Dropping the user's future (finished, cancelled, or at stop) runs under `catch_unwind`
//!    too (`drop_guarded`): a panicking `Drop` is logged and the loop goes on.
//! 5. **Handles.** Dropping a `JoinHandle` detaches the task; [`JoinHandle::abort`] starts
//!    async-task's cancellation, which marks the task closed: its future is dropped the next
//!    time the owner would poll it (at once if it is parked: async-task schedules it once more
//!    for that). The handle keeps the cancellation and resolves only after that drop, as in
//!    tokio, or with the output if the task had already finished. The cancellation's first
//!    poll registers, as the task's awaiter, the waker the handle's last `Pending` poll left
//!    there (kept by the handle: a clone of a polling task's own waker, a user's waker
//!    weakly), not a no-op waker: a stop that closes the task between the abort's check and
//!    that poll wakes the awaiter only after dropping the future, and the poller (a
//!    `FuturesUnordered` node, or a task awaiting a handle that another task aborts) polls
//!    again only when woken.
//!
//! Cost on the local path: one allocation per task and the async-task state updates; a task that
//! parks adds one waker clone and one slab insert, once (rule 3; one that finishes in its first
//! poll registers nothing); a local wake is a thread-local push, no shared atomic.

mod blocking;
mod builder;
pub(crate) mod home;
mod join;
mod join_set;
mod yield_now;

pub use blocking::{spawn_blocking, SpawnBlocking};
pub use builder::Builder;
pub(crate) use home::{release_units, Home};
pub(crate) use join::polled_with_own_waker;
pub use join::JoinHandle;
pub use join_set::{JoinNext, JoinSet};
pub use yield_now::{yield_now, YieldNow};

use std::{
    future::Future,
    mem::ManuallyDrop,
    panic::{catch_unwind, AssertUnwindSafe, Location},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use crate::sync::{
    AtomicU32,
    Ordering::{Acquire, Relaxed, Release},
};

/// What a task's output slot holds: the value, or the panic that ended it.
///
/// Dropped under [`guarded`] when nobody takes it (a detached task, or one aborted after it
/// finished): async-task drops an untaken output inside `Runnable::run` (or where the last
/// handle goes) under its abort-on-panic guard, so a value whose `Drop` panics aborted the
/// whole process (invariant 9 in the crate docs). Same size as the `Result` it holds; an output
/// without drop code costs one check.
pub(crate) struct Outcome<T>(ManuallyDrop<Result<T, Panic>>);

impl<T> Outcome<T> {
    pub(crate) fn new(result: Result<T, Panic>) -> Self {
        Outcome(ManuallyDrop::new(result))
    }

    /// Takes the result out; its drop is then the taker's business.
    pub(crate) fn into_inner(self) -> Result<T, Panic> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped (it is `ManuallyDrop`), so the value is taken once
        // and `Outcome::drop` does not run on the emptied slot.
        unsafe { ManuallyDrop::take(&mut this.0) }
    }
}

impl<T> Drop for Outcome<T> {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and nothing reads the slot afterwards.
        let result = unsafe { ManuallyDrop::take(&mut self.0) };
        if std::mem::needs_drop::<T>() || result.is_err() {
            guarded("a task's output panicked while being dropped", || {
                drop(result)
            });
        }
    }
}

/// A caught panic's payload, boxed once more so that it is one word: the output slot of a task
/// with a small output (`()`, an integer) is then one word too, where `Box<dyn Any>` would make
/// it two (`tests/task_alloc.rs`). Panics are rare; the extra allocation is theirs alone.
pub(crate) type Panic = Box<Box<dyn std::any::Any + Send + 'static>>;

/// The `async-task` runnable type used everywhere in xtc.
pub(crate) type Runnable = async_task::Runnable<TaskMeta>;

/// Per-task metadata, in the async-task header (stable address for the task's life): what the
/// loop needs to know about a `Runnable` before running it.
#[derive(Debug)]
pub(crate) struct TaskMeta {
    /// Name and spawn site (deadlock and stall reports).
    pub(crate) info: TaskInfo,
    /// Scheduling class on the owning loop (`class.rs`); 0 = the default lane.
    pub(crate) class: AtomicU32,
    /// Migratable tasks: the loop it last ran on (steal/mod.rs rule 1; read it with
    /// [`last_loop`](Self::last_loop)). Its top bit, [`CANCEL_DROPPING`], is set while
    /// [`cancel`] drops the task's future (any task). 32 bits, like `class`, so the two share
    /// one word: the header is what keeps a trivial task within glibc's fast bins
    /// (`tests/task_alloc.rs`).
    pub(crate) last: AtomicU32,
    /// The task's home loop. Pinned tasks: their owner, where [`schedule`] sends them.
    /// Migratable tasks: the loop they were spawned on, whose `LoopShared::exec` (a weak
    /// reference, so parked tasks do not keep a dropped executor alive) leads to their
    /// executor in `steal::schedule`; its count is a line of that loop's, not one every loop
    /// writes, and a task made and freed on that loop touches it not at all ([`Home`], in
    /// `task/home.rs`). Which kind a task is, its schedule function knows. Kept here rather than
    /// captured by the schedule closure so that closure is zero-sized: async-task then skips
    /// the temporary waker (a reference-count increment and decrement) it otherwise takes
    /// around every schedule call.
    pub(crate) home: Home,
}

/// The bit of `TaskMeta::last` set while [`cancel`] drops a task's future. Only the holder of
/// a task's `Runnable` writes `last`, so a plain load and store set and clear it.
const CANCEL_DROPPING: u32 = 1 << 31;

impl TaskMeta {
    /// The loop a migratable task last ran on (its home loop's index for a pinned task).
    pub(crate) fn last_loop(&self) -> usize {
        (self.last.load(Relaxed) & !CANCEL_DROPPING) as usize
    }

    fn set_cancel_dropping(&self, on: bool) {
        let last = self.last.load(Relaxed);
        let last = if on {
            last | CANCEL_DROPPING
        } else {
            last & !CANCEL_DROPPING
        };
        self.last.store(last, Release);
    }

    /// Whether [`cancel`] is dropping the task's future right now: async-task marks a task
    /// closed before it drops the future, so [`JoinHandle::is_finished`] asks this too. Cost:
    /// one load (inlined: it is on every join's path, in the user's crate).
    #[inline]
    pub(crate) fn cancel_dropping(&self) -> bool {
        self.last.load(Acquire) & CANCEL_DROPPING != 0
    }

    pub(crate) fn new(info: TaskInfo, class: u32, last: usize, home: Home) -> TaskMeta {
        TaskMeta {
            info,
            class: AtomicU32::new(class),
            // Shard indices are bounded by the CPU count; u32 holds any real one.
            last: AtomicU32::new(last as u32),
            home,
        }
    }
}

/// `TaskMeta::class` of a migratable task: it has no class (classes are lanes of one loop's
/// pinned queue; a migratable task runs from deques), and `shard::set_class` refuses it.
pub(crate) const MIGRATABLE_CLASS: u32 = u32::MAX;

/// A task's name: one thin pointer (an `Arc<str>` would be two words in every task header).
pub(crate) type TaskName = Arc<String>;

/// Name and spawn site, in the task's metadata (deadlock and stall reports).
#[derive(Clone, Debug)]
pub(crate) struct TaskInfo {
    name: Option<TaskName>,
    pub(crate) location: &'static Location<'static>,
}

impl TaskInfo {
    #[track_caller]
    pub(crate) fn here(name: Option<TaskName>) -> TaskInfo {
        TaskInfo {
            name,
            location: Location::caller(),
        }
    }

    /// The task's name, if it was given one.
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref().map(String::as_str)
    }

    /// The name as the deadlock and stall reports print it: [`report_name`] of it, or
    /// `<unnamed>`.
    pub(crate) fn report_name(&self) -> std::borrow::Cow<'_, str> {
        report_name(self.name())
    }
}

/// A task name as a report prints it (`<unnamed>` for none): control characters and the
/// Unicode line and paragraph separators escaped (`\n`, `\t`, `\u{1b}`, `\u{2028}`). A name
/// is user input, and a line break in one made a deadlock report entry, one line per parked
/// task, span several lines (so a name could pass for another task's entry). Cost: a scan of
/// the name; an allocation only for a name that holds such a character.
pub(crate) fn report_name(name: Option<&str>) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    let Some(name) = name else {
        return Cow::Borrowed("<unnamed>");
    };
    let breaks = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if !name.chars().any(breaks) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        if breaks(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

enum Stage<F, Fut> {
    Init(F),
    Running(Fut),
    Done,
}

/// The future async-task runs: lazy construction, registry membership and panic capture
/// (rules 2–4 above) around the user's future. It holds no pointer to its own metadata: the
/// loop polling it has that as `Core::current`.
pub(crate) struct TaskFuture<F, Fut> {
    stage: Stage<F, Fut>,
    /// Registry key; `NOT_REGISTERED` until the first poll. 32 bits: with the stage of a small
    /// future it fits one word (`tests/task_alloc.rs`); see `context::register_current`.
    key: u32,
}

const NOT_REGISTERED: u32 = u32::MAX;

impl<F, Fut> TaskFuture<F, Fut>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    pub(crate) fn new(make: F) -> Self {
        TaskFuture {
            stage: Stage::Init(make),
            key: NOT_REGISTERED,
        }
    }
}

impl<F, Fut> Future for TaskFuture<F, Fut>
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    type Output = Outcome<Fut::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `stage` is structurally pinned: the `Running` future is never moved out; it is
        // only polled through a re-pinned reference and dropped in place (by assignment below).
        // The other fields are plain data that we move freely.
        let this = unsafe { self.get_unchecked_mut() };
        if matches!(this.stage, Stage::Init(_)) {
            let Stage::Init(make) = std::mem::replace(&mut this.stage, Stage::Done) else {
                unreachable!("checked just above");
            };
            match catch_unwind(AssertUnwindSafe(make)) {
                Ok(fut) => this.stage = Stage::Running(fut),
                Err(payload) => return Poll::Ready(Outcome::new(Err(Box::new(payload)))),
            }
        }
        let Stage::Running(fut) = &mut this.stage else {
            // async-task never polls a completed future again.
            return Poll::Pending;
        };
        // SAFETY: see above: `fut` lives inside the pinned `TaskFuture` and is not moved.
        let fut = unsafe { Pin::new_unchecked(fut) };
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Pending) => {
                // Rule 3: a task joins the registry the first time it parks; one that finishes
                // in its first poll never touches it.
                if this.key == NOT_REGISTERED {
                    this.key =
                        crate::context::register_current(cx.waker()).unwrap_or(NOT_REGISTERED);
                }
                Poll::Pending
            }
            Ok(Poll::Ready(v)) => {
                // Drop the user's future inside this poll, under this crate's guard (rule 4).
                // async-task drops this wrapper right after the poll, before it publishes the
                // output, and `Drop` below would drop the future then, guarded the same way:
                // this only makes the stage `Done` from here on.
                set_done(&mut this.stage);
                Poll::Ready(Outcome::new(Ok(v)))
            }
            Err(payload) => {
                set_done(&mut this.stage);
                Poll::Ready(Outcome::new(Err(Box::new(payload))))
            }
        }
    }
}

impl<F, Fut> Drop for TaskFuture<F, Fut> {
    fn drop(&mut self) {
        // Drop the user's future before leaving the registry, so wakes it fires while dropping
        // still find a live loop (rule 3).
        set_done(&mut self.stage);
        crate::context::task_dropped((self.key != NOT_REGISTERED).then_some(self.key as usize));
    }
}

/// Drops what a task's stage holds (rule 4), guarded only where there is drop code to run:
/// for a future without any (`needs_drop` is a compile-time constant) this is a plain store.
fn set_done<F, Fut>(stage: &mut Stage<F, Fut>) {
    if std::mem::needs_drop::<Stage<F, Fut>>() {
        drop_guarded(|| *stage = Stage::Done);
    } else {
        *stage = Stage::Done;
    }
}

/// Drops a task's future (what `drop` does) under `catch_unwind`: a panic in user `Drop` code
/// is logged and goes no further. Unguarded, a drop inside the poll (a future that finished,
/// dropped from `Runnable::run`) unwound out of the loop: the loop's thread died with its
/// status BUSY, and `run()` never returned (rule 4); and async-task drops a cancelled
/// future from `Runnable`'s own drop under its `abort_on_panic`, so a panic there aborted
/// the process.
pub(crate) fn drop_guarded(drop: impl FnOnce()) {
    guarded("a task's future panicked while being dropped", drop);
}

/// Wakes `waker` under `catch_unwind`, for the loop's own wake-ups (timers, I/O completions,
/// ring space, the blocking pool): a waker is user code when a future was polled with a
/// custom one, and a panic in it unwound out of the loop, whose status stayed BUSY so `run()`
/// never returned (invariant 9 in the crate docs). Logged and dropped instead. Costs nothing
/// extra when the wake does not panic (a landing pad, no work on the normal path).
pub(crate) fn wake_guarded(waker: std::task::Waker) {
    guarded("a waker panicked when woken", || waker.wake());
}

/// Drops wakers the loop held for parked tasks (its timers, ring-space waiters) at shutdown,
/// each under [`guarded`]: a waker's drop is user code when a future was polled with a custom
/// waker, and a panic there killed the loop's thread halfway through its shutdown.
pub(crate) fn drop_wakers_guarded(wakers: impl IntoIterator<Item = std::task::Waker>) {
    for w in wakers {
        guarded("a waker panicked when dropped", || drop(w));
    }
}

/// Runs `f`; a panic is logged as `what` and goes no further. The payload is dropped under
/// `catch_unwind` too, since its own drop could panic ([`drop_payload`]). (Forgetting every
/// payload leaked one allocation per contained panic; Miri reported it, `scripts/miri`.) So is
/// the log line: a `tracing` subscriber is user code, and one that panicked on the error
/// unwound out of here, inside async-task's abort-on-panic sections (a future's or an
/// output's drop: the process aborted) or out of a loop's shutdown halfway. Such a panic
/// is dropped unlogged; `guarded` never unwinds.
pub(crate) fn guarded(what: &str, f: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
        let logged = catch_unwind(AssertUnwindSafe(|| {
            let msg = crate::error::payload_message(&*payload).unwrap_or("a non-string payload");
            tracing::error!("xtc: {what} (ignored): {msg}");
        }));
        if let Err(subscriber) = logged {
            drop_payload(subscriber);
        }
        drop_payload(payload);
    }
}

/// Drops a caught panic's payload under `catch_unwind`: a payload is user code (`panic_any`
/// of a value whose `Drop` panics), and that second panic would unwind out of the loop. The
/// payload of such a panic is dropped the same way, and so on, up to [`PAYLOAD_DROPS`] deep;
/// only a payload past that is forgotten (a chain of payloads that each panic when dropped
/// need not end). Forgetting the second one leaked it (memcheck: definitely lost) and skipped
/// its `Drop`, though it is nearly always a plain message that drops cleanly. Cost: a landing
/// pad.
pub(crate) fn drop_payload(payload: Box<dyn std::any::Any + Send>) {
    let mut payload = payload;
    for _ in 0..PAYLOAD_DROPS {
        match catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            Ok(()) => return,
            Err(again) => payload = again,
        }
    }
    std::mem::forget(payload);
}

/// How many payloads in a row [`drop_payload`] drops when each one's drop panics.
const PAYLOAD_DROPS: usize = 8;

/// Drops `r` instead of running it (a stop, a sweep of what is queued): async-task cancels the
/// task and drops its future here. While that drop runs the task's [`JoinHandle`] is not
/// finished: async-task marks the task closed first, which `is_finished` read as finished
/// while the future's `Drop` (a lock, a socket it releases) still ran; as for an aborted
/// handle, and as in tokio, finished means dropped. Every site that drops a `Runnable` goes
/// through here (but a loop's queues dropped by an unwind, a bug in xtc the run reports as
/// `ShardPanicked`). The drop runs with no task marked as polled on this loop
/// (`context::outside_task`): it is the cancelled task's code, not the polled one's, and a
/// cancel can come inside a poll (a wake whose migratable task's executor is gone, dropped by
/// `steal::schedule`), even after async-task freed the task that poll ran (it wakes an
/// awaiter after dropping its own reference): `shard::set_class` in such a `Drop` wrote to
/// that task, or to freed memory. Cost: a waker clone and drop (two reference-count updates,
/// so the header outlives the drop), two stores and four thread-local reads; never on the path
/// of a task that runs.
pub(crate) fn cancel(r: Runnable) {
    crate::context::outside_task(|| cancel_here(r))
}

/// [`cancel`], with no task current.
fn cancel_here(r: Runnable) {
    let keep = r.waker();
    let meta: *const TaskMeta = r.metadata();
    // A pinned task of another loop dropped on this one (a spawn for a stopped peer that this
    // loop's shutdown drops, `ring::evacuate`) is not this loop's: its drop counted as a task
    // that finished here (`LoopStats::tasks_run`), and a registry key of its own loop would
    // have been taken out of this one's registry (`context::task_dropped`). A migratable
    // task's end is counted by its executor, not its loop (`steal/mod.rs`).
    let home = Home::as_ptr(&r.metadata().home);
    let pinned = r.metadata().class.load(Relaxed) != MIGRATABLE_CLASS;
    let foreign = crate::context::with_core(|c| {
        let foreign = pinned && !c.runs(home);
        c.dropping_foreign.replace(foreign)
    });
    /// Restores the loop's `dropping_foreign` (also on unwind; the flag of an outer cancel
    /// that this one's drop code nested in).
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(outer) = self.0 {
                crate::context::with_core(|c| c.dropping_foreign.set(outer));
            }
        }
    }
    let _restore = Restore(foreign);
    // SAFETY: `meta` points into the header of `r`'s task, which `keep` (a reference) keeps
    // alive until after the last use below; `TaskMeta` is `Sync` (atomics, and fields fixed at spawn), and only the
    // holder of the `Runnable` (this function, until the drop) writes `last`.
    unsafe { (*meta).set_cancel_dropping(true) };
    drop(r);
    // SAFETY: as above; the `Runnable` is gone, and no other holder exists to write `last`
    // (a wake of a closed task schedules nothing).
    unsafe { (*meta).set_cancel_dropping(false) };
    drop(keep);
}

/// [`cancel`] for each of `rs`.
pub(crate) fn cancel_all(rs: impl IntoIterator<Item = Runnable>) {
    rs.into_iter().for_each(cancel);
}

/// The schedule function of a pinned task, owned by its home loop (rule 1).
///
/// Inline: async-task calls it from code generic over the future, built in the user's crate,
/// where a call to this crate stays a call without the hint. The usual case, a wake on the
/// owner's own loop (a yield, a local channel), is the thread-local queue push
/// ([`context::enqueue_at_home`](crate::context::enqueue_at_home)); anything else goes to
/// [`schedule_away`], out of line. As a call it cost about 10 instructions per yield
/// (callgrind).
#[inline]
pub(crate) fn schedule(runnable: Runnable) {
    if let Some(runnable) = crate::context::enqueue_at_home(runnable) {
        schedule_away(runnable);
    }
}

/// [`schedule`] off the owner's loop: the ring to the owner from another loop of its
/// executor, else the owner's inbox and a wake ping.
#[inline(never)]
fn schedule_away(runnable: Runnable) {
    // SAFETY: the pointer comes from the `Home` in this task's metadata, which keeps the loop
    // alive while we hold `runnable`; `route` reads what it needs before it hands `runnable`
    // on. Once it handed it on, to a ring of the owner's executor, the task may end at once,
    // and then what keeps the owner alive for the rest of the call is this loop's executor,
    // which holds every one of its loops (`context::route`); otherwise `route` hands
    // `runnable` back, and the `Home` keeps it alive again.
    let owner_ref = unsafe { &*Home::as_ptr(&runnable.metadata().home) };
    if let Some(runnable) = crate::context::route(owner_ref, runnable) {
        // Foreign thread: we hold the runnable again, so its metadata is alive; the clone
        // keeps the loop alive past the push (its task may finish at once).
        let owner = Home::arc(&runnable.metadata().home);
        owner.inbox.push(runnable);
        owner.parker.unpark();
    }
}

/// Creates a task owned by `home`'s loop whose future is built by `make` on its first poll, and
/// schedules it. The caller guarantees `make` may run on that loop's thread.
pub(crate) fn spawn_raw<F, Fut>(
    home: Home,
    make: F,
    info: TaskInfo,
    class: u32,
) -> JoinHandle<Fut::Output>
where
    F: FnOnce() -> Fut + 'static,
    Fut: Future + 'static,
    Fut::Output: 'static,
{
    let (runnable, handle) = create(home, make, info, class);
    runnable.schedule();
    handle
}

/// [`spawn_raw`] without the scheduling: the caller queues the `Runnable` (on `owner`'s
/// thread, or through [`schedule`]). Inline, with async-task's `spawn_unchecked` in it:
/// `spawn_local` then builds the task in its own frame. Left to LLVM, `spawn_unchecked` (or
/// `create` itself) stayed a second frame per spawn (callgrind: 12 instructions per task).
#[inline]
pub(crate) fn create<F, Fut>(
    home: Home,
    make: F,
    info: TaskInfo,
    class: u32,
) -> (Runnable, JoinHandle<Fut::Output>)
where
    F: FnOnce() -> Fut + 'static,
    Fut: Future + 'static,
    Fut::Output: 'static,
{
    let fut = TaskFuture::new(make);
    let index = home.index;
    // SAFETY: async-task's conditions for `spawn_unchecked`:
    // - The future is `'static`.
    // - It may be `!Send`: by rule 1 its `Runnable` is run only on the owner's thread, which
    //   is the thread `make` and the future it builds were meant for, and dropped there once
    //   polled. Before the first poll the future holds only `make`; callers on other threads
    //   pass a `Send` `make`, and only such a task, never polled, is dropped off the owner's
    //   thread (rule 1: a stopped owner's ring, or the sweep of a stopped executor's queues;
    //   a `spawn_local` task is queued on its own loop, and dropped by it). The exception is
    //   a loop whose shutdown a panic cut short (a bug in xtc): its polled tasks outlive it,
    //   so it is poisoned, and whatever is routed to it later is leaked, never run or dropped
    //   elsewhere, and its executor runs no more (`LoopShared::poisoned`).
    // - The schedule function is `Send + Sync + 'static`, so wakers may go anywhere.
    let (runnable, task) = unsafe {
        async_task::Builder::new()
            .metadata(TaskMeta::new(info, class, index, home))
            .spawn_unchecked(move |_: &TaskMeta| fut, schedule)
    };
    (runnable, JoinHandle::new(task))
}

#[cfg(test)]
mod tests {
    use std::{cell::Cell, rc::Rc};

    use super::{cancel, create, Home, TaskInfo};

    /// The `Drop` of a task cancelled inside another task's poll is not that task's code:
    /// `shard::set_class` there is refused (no task current), where it acted on the polled
    /// task (or, after async-task freed it, on freed memory).
    #[test]
    fn a_task_cancelled_inside_a_poll_drops_with_no_task_current() {
        struct Probe(Rc<Cell<Option<bool>>>, crate::Class);
        impl Drop for Probe {
            fn drop(&mut self) {
                self.0.set(Some(crate::shard::set_class(self.1).is_ok()));
            }
        }
        crate::LocalExecutor::new().unwrap().block_on(async {
            let class = crate::shard::create_class(100, None).unwrap();
            // This poll's own task may change its class.
            assert!(crate::shard::set_class(class).is_ok());
            let seen = Rc::new(Cell::new(None));
            let probe = Probe(seen.clone(), class);
            let (r, handle) = crate::context::with_core(|c| {
                create(
                    Home::of_core(c),
                    move || async move { drop(probe) },
                    TaskInfo::here(None),
                    0,
                )
            })
            .unwrap();
            cancel(r);
            assert_eq!(
                seen.get(),
                Some(false),
                "set_class in a cancelled task's drop"
            );
            assert!(handle.await.unwrap_err().is_cancelled());
            // Still this task's, after the cancel.
            assert!(crate::shard::set_class(class).is_ok());
        });
    }
}
