use std::{
    cell::Cell,
    fmt,
    future::Future,
    mem::ManuallyDrop,
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll, Wake, Waker},
};

use super::Outcome;
use super::TaskMeta;
use crate::{sync::Ordering::Relaxed, JoinError};

/// Handle to a spawned task: `.await` it for the output.
///
/// Awaiting gives `Ok(value)`, or `Err(JoinError)` if the task panicked (the panic was caught;
/// its loop went on) or was cancelled (aborted, or dropped because its executor stopped).
/// Dropping the handle detaches the task: it runs on, its output is discarded, and the waker
/// a `Pending` poll of the handle left with the task is dropped then, not kept (and woken)
/// until the task ends. Like most
/// futures it must not be polled after it completed (that panics, as tokio's does: its output
/// is gone).
///
/// The handle is `Send` when the output is, so a pinned task's result can be awaited from any
/// thread, but it is not `Sync`: [`abort`](Self::abort) takes `&self` without a lock.
/// Cost: awaiting is one poll of the async-task handle; completion wakes the awaiter once. A
/// join that waits also keeps a clone of the waiting task's waker for [`abort`](Self::abort)
/// (one small allocation and a reference-count increment at its first `Pending` poll, freed
/// when the handle goes).
/// A migratable task ([`spawn`](crate::spawn)) awaiting a migratable task that is the newest
/// one queued on its loop (not started yet, or woken since and queued there again) runs it
/// there and then, inside its own poll (a work-first join, as `rayon::join` does; at most 128
/// per poll and a bounded share of the stack, see
/// [`LoopStats::joins_inlined`](crate::LoopStats::joins_inlined)): no park, no wake-up. So polling a handle from a migratable task may run that task's code on the spot:
/// do not poll it by hand (`now_or_never`) inside a critical section the task also enters.
///
/// The task's completion wakes the awaiter inside async-task, under its abort-on-panic guard.
/// So a handle polled with any waker other than its polling task's own (a custom waker,
/// `futures::executor::block_on`'s, a `FuturesUnordered`'s) registers a wrapper instead: a
/// panic in that waker's `wake`, clone or drop is logged (`tracing`) and goes no further, and
/// the loop goes on. Such a poll on a loop thread (a `futures::executor::block_on` inside a
/// task blocks the loop until it is woken) also sends the loop turn's deferred wakes first,
/// the pings of tasks queued to other loops among them: the task awaited may be one. Cost of
/// that: one allocation per poll that returns `Pending`, and the end-of-turn flushes sent
/// early; none for a handle awaited by an xtc task itself, nor for one polled after the task
/// finished.
pub struct JoinHandle<T> {
    /// Never dropped as a field: `Drop` takes the state out and drops what it held itself.
    /// Left to the drop glue, the emptied state was dropped again by an out-of-line call on
    /// every handle (callgrind: about 16 instructions per handle).
    state: ManuallyDrop<Cell<State<T>>>,
    /// The awaiter async-task holds after this handle's last `Pending` poll of the live task,
    /// for `abort`: its first poll of the cancellation registers this one again, in place of
    /// the no-op waker. A stop may close the task between `abort`'s check and that poll, and
    /// wakes whatever is registered once it has dropped the future, so the poller's waker must
    /// be what is there (rule 5 of the task protocol): a user's waker (a `FuturesUnordered`
    /// node, which polls the handle again only when woken), or the waker of a task other than
    /// the one that aborts (a handle shared in an `Rc` on one shard: one task awaits it,
    /// another aborts it). Boxed, so the handle stays four words: a million handles in a `Vec`
    /// at five or seven words read a third slower in the spawn+join benchmark (page faults on
    /// the larger vector). See [`Awaiter`] for what each costs.
    awaiter: Cell<Option<Box<Awaiter>>>,
}

/// A live handle's flags, beside the task in [`State::Live`] (where they take no room: the
/// variant's tag needs a byte of its own anyway).
#[derive(Clone, Copy)]
struct Flags {
    /// A poll returned `Pending`, so that async-task holds a waker of the poller's as the
    /// task's awaiter: `Drop` takes it back (see `drop_held`).
    waiting: bool,
    /// A `Pending` poll keeps the polling task's own waker in `awaiter`: not for the join of
    /// a `submit_to` (`shard::AwaitReply`), which nobody else can reach to abort, and whose
    /// reply path then pays no reference count and no allocation.
    keep_own: bool,
}

/// What [`JoinHandle::abort`] registers again (see the `awaiter` field), in a box allocated at
/// a join's first `Pending` poll.
enum Awaiter {
    /// A clone of the polling task's own waker (one reference-count increment per join that
    /// waits, and its decrement at the join's `Ready` poll or when the handle goes).
    Own(Waker),
    /// The guard async-task holds for a user's waker, weakly: no second strong copy, which
    /// made a cycle of a foreign task whose waker owns its future holding this handle, and
    /// nothing to register once async-task has let it go. Costs a weak-count increment on the
    /// guard just allocated.
    Guard(std::sync::Weak<GuardedWaker>),
}

/// Where a handle is: holding the live task, or aborted (rule 5 of the task protocol). Two
/// words more than the task pointer; what only an aborted handle needs lives behind a box.
enum State<T> {
    /// The task, and the address of its metadata (async-task's fallible handle does not give
    /// it): compared with the deque's top by the work-first join (`steal/mod.rs` rule 6). The
    /// handle keeps the task's header alive, so no other task can have that address meanwhile.
    Live(
        async_task::FallibleTask<Outcome<T>, TaskMeta>,
        *const TaskMeta,
        Flags,
    ),
    Aborted(Box<Aborted<T>>),
    /// The output went to an `.await`.
    Taken,
    /// Out for a call of `abort` or `is_finished` (`with`): what a call made meanwhile sees.
    /// That can be user code: the old awaiter's `Drop`, which async-task runs when the cancel
    /// future registers its own waker (or a waker's clone or drop in `is_finished`'s poll of
    /// it); seeing `Taken`, `is_finished` there read a parked task as finished. Only an
    /// aborting handle runs user code this way, so an abort nested in it has nothing to add.
    Busy,
}

/// async-task's cancel future, boxed because its type cannot be named.
type Cancel<T> = Pin<Box<dyn Future<Output = Option<Outcome<T>>>>>;

/// An aborted handle's state.
struct Aborted<T> {
    /// async-task's cancel future while the task is not over yet: it resolves once the owner
    /// has dropped the task's future (`None`) or, if the task finished first, with its output.
    cancel: Option<Cancel<T>>,
    /// The last waker `poll` saw, for [`JoinHandle::is_finished`]'s poll of `cancel`: a
    /// user's guard only weakly (as `JoinHandle::awaiter`).
    waker: Option<Awaiter>,
    /// What came out once `cancel` resolved: the output, or `None` if it was cancelled.
    out: Option<Outcome<T>>,
    /// The task's metadata (kept alive by `cancel` while that is `Some`): a wait in a
    /// stopping loop's `Drop` passes it on (ring rule 3c), as a live handle's does.
    meta: *const TaskMeta,
}

impl Awaiter {
    /// The waker to register again: the own one, or the guard if async-task still holds it.
    fn waker(&self) -> Option<Waker> {
        match self {
            Awaiter::Own(w) => Some(w.clone()),
            Awaiter::Guard(g) => g.upgrade().map(Waker::from),
        }
    }
}

impl<T> Aborted<T> {
    /// Polls the cancellation; true once the task is over (its output, if any, in `out`).
    fn poll_over(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(cancel) = self.cancel.as_mut() else {
            return true;
        };
        match cancel.as_mut().poll(cx) {
            Poll::Ready(out) => {
                self.cancel = None;
                self.out = out;
                true
            }
            Poll::Pending => false,
        }
    }
}

// SAFETY: every field of `State<T>` is `Send` when `T` is, except the metadata address and
// the boxed `cancel` future. The address points into the header of the task this handle holds,
// alive as long as the handle; it is compared with a queued task's and read only through
// `TaskMeta`'s atomics (`steal::join_inline`), and `TaskMeta` is `Sync`, so any thread may
// hold and use it. The boxed future has one type only, the future of
// `FallibleTask::<Outcome<T>, TaskMeta>::cancel` (built in `abort`, nowhere else). That
// future holds the `FallibleTask` and nothing else, and it is `Send` when `T` is:
// `cancel_is_send` below would not compile otherwise. The box only erases a type we cannot
// name.
unsafe impl<T: Send> Send for JoinHandle<T> {}

/// Compile-time proof for the `Send` impl above: the erased cancel future is `Send` whenever
/// the output is.
#[allow(dead_code)]
fn cancel_is_send<T: Send>(
    task: async_task::FallibleTask<Outcome<T>, TaskMeta>,
) -> impl Future<Output = Option<Outcome<T>>> + Send {
    task.cancel()
}

impl<T> JoinHandle<T> {
    pub(crate) fn new(task: async_task::Task<Outcome<T>, TaskMeta>) -> Self {
        let meta: *const TaskMeta = task.metadata();
        JoinHandle {
            state: ManuallyDrop::new(Cell::new(State::Live(
                task.fallible(),
                meta,
                Flags {
                    waiting: false,
                    keep_own: true,
                },
            ))),
            awaiter: Cell::new(None),
        }
    }

    /// For a join nobody else can abort (`submit_to`'s): a `Pending` poll keeps no clone of
    /// the polling task's own waker (see `keep_own`).
    pub(crate) fn unshared(mut self) -> Self {
        if let State::Live(_, _, flags) = self.state.get_mut() {
            flags.keep_own = false;
        }
        self
    }

    /// Runs `f` on the state, taken out of the cell for the call (`Busy` meanwhile).
    fn with<R>(&self, f: impl FnOnce(&mut State<T>) -> R) -> R {
        let mut state = self.state.replace(State::Busy);
        let r = f(&mut state);
        self.state.set(state);
        r
    }

    /// Whether the task has completed (or been cancelled and its future dropped: a task
    /// cancelled by a stop is not finished while its future's `Drop` still runs). Cost: two
    /// atomic loads; after [`abort`](Self::abort), one poll of the cancellation.
    pub fn is_finished(&self) -> bool {
        self.with(|state| match state {
            State::Live(task, meta, _) => {
                // SAFETY: `meta` points into the header of the task this handle holds (see
                // `State::Live`), and `TaskMeta` is `Sync` (atomics, and fields fixed at
                // spawn).
                task.is_finished() && !unsafe { &**meta }.cancel_dropping()
            }
            State::Aborted(a) => {
                let waker = a
                    .waker
                    .as_ref()
                    .and_then(Awaiter::waker)
                    .unwrap_or_else(|| Waker::noop().clone());
                a.poll_over(&mut Context::from_waker(&waker))
            }
            State::Taken => true,
            // Asked from inside this handle's own call (see `State::Busy`): the task is not
            // over with its output taken, the only way `Taken` reads finished.
            State::Busy => false,
        })
    }
}

impl<T: 'static> JoinHandle<T> {
    /// Cancels the task: its future is dropped the next time its loop would poll it (promptly
    /// if it is parked), and awaiting this handle then gives a cancelled [`JoinError`] once
    /// that drop has happened, so whatever the task held (a borrow, a lock, a socket) is
    /// released when the `.await` returns. As in tokio, aborting a task that already finished
    /// changes nothing: awaiting gives its output. Unlike tokio, an abort from another thread
    /// that lands while the task is in its last poll reports cancelled although the future ran
    /// to completion (its side effects happened; its output is dropped): async-task closes a
    /// running task at once. Nor does an abort of a task that a stop is dropping, or has
    /// dropped: awaiting gives cancelled once that drop is over, and the waker the handle was
    /// last polled with is woken then (also when the abort lands while the stop closes the
    /// task), so a combinator that polls a handle again only when woken (`FuturesUnordered`)
    /// needs no wake of its own after the abort. A task of an executor
    /// that is not running (spawned before `run()`, or after it returned) is dropped by its
    /// next run or by the executor's drop; awaiting its handle waits until then. Cost: one
    /// async-task state update, two
    /// allocations and, for a parked task, one re-schedule on its loop; two loads for a task
    /// already over.
    pub fn abort(&self) {
        self.with(|state| {
            // `Busy`: user code inside a call of this handle got here, and only an abort under
            // way, or one done, runs user code (see `State::Busy`): nothing to add.
            let State::Live(task, meta, _) = state else {
                return;
            };
            // Over already, or being closed by a stop (`task::cancel` sets its bit before
            // async-task closes the task): left as it is, which awaits the same outcome (a
            // task it closes itself wakes the awaiter first, but one a stop is still dropping
            // wakes it only at the end of that drop).
            // SAFETY: `meta` points into the header of the task this handle holds (see
            // `State::Live`), and `TaskMeta` is `Sync` (atomics, and fields fixed at spawn).
            if task.is_finished() || unsafe { &**meta }.cancel_dropping() {
                return;
            }
            let State::Live(task, meta, _) = std::mem::replace(state, State::Taken) else {
                unreachable!("checked just above");
            };
            // The cancel future's first poll registers the waker it is given as the task's
            // awaiter, in place of the one this handle's last poll left there. A stop may
            // close the task between the check above and that poll, and then wakes whatever
            // is registered once it has dropped the future: given the no-op waker, a user's
            // waker (a `FuturesUnordered` node, which polls the handle again only when woken)
            // would never be woken. So the poll registers that same waker again (`awaiter`).
            let kept = self.awaiter.take().map(|kept| *kept);
            // Gone: async-task no longer holds it (the task ended and woke it).
            let awaiter = kept.as_ref().and_then(Awaiter::waker);
            let mut aborted = Box::new(Aborted {
                cancel: Some(Box::pin(task.cancel())),
                waker: None,
                out: None,
                meta,
            });
            // The first poll marks the task cancelled (scheduling it if it is parked, so its
            // owner drops the future) and picks up an output that was already there.
            #[cfg(test)]
            tests::between_check_and_cancel();
            let waker = awaiter.as_ref().unwrap_or(Waker::noop());
            aborted.poll_over(&mut Context::from_waker(waker));
            drop(awaiter);
            aborted.waker = kept;
            *state = State::Aborted(aborted);
        })
    }
}

/// What an `.await` of the handle gives for a task's outcome.
fn output<T>(out: Option<Outcome<T>>) -> Result<T, JoinError> {
    match out {
        None => Err(JoinError::cancelled()),
        Some(out) => match out.into_inner() {
            Ok(v) => Ok(v),
            Err(payload) => Err(JoinError::panic(*payload)),
        },
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.state.replace(State::Taken) {
            // The usual join of a task that is over (and whose future no cancel is dropping):
            // no work-first join to try, and async-task registers no waker for it, so the
            // poller's own is passed as it is (see `poll_slow`, which checks the same).
            State::Live(mut task, meta, mut flags) if over(&task, meta) => {
                match Pin::new(&mut task).poll(cx) {
                    Poll::Pending => {
                        flags.waiting = true;
                        self.state.set(State::Live(task, meta, flags));
                        Poll::Pending
                    }
                    Poll::Ready(out) => {
                        if flags.waiting {
                            // Nothing left to abort: the kept waker goes now, not with the
                            // handle (a handle kept after `.await`ing `&mut` it held its
                            // last poller's task alive).
                            self.awaiter.set(None);
                        }
                        Poll::Ready(output(out))
                    }
                }
            }
            state => self.poll_slow(state, cx),
        }
    }
}

/// Whether a handle's task is migratable: only such a task can be run inline at its join
/// (steal rule 6; `steal::join_inline` leaves this check to its caller, here). A pinned task
/// stays pinned, so the join of a cross-shard call (`submit_to`, `spawn_on`) skips the call
/// (callgrind: about 20 instructions per waiting join).
#[inline]
fn migratable(meta: &TaskMeta) -> bool {
    meta.class.load(Relaxed) == super::MIGRATABLE_CLASS
}

/// Whether the task of a live handle (`State::Live(task, meta)`) is over: finished, and its
/// future not being dropped by [`cancel`](super::cancel) right now.
#[inline]
fn over<T>(task: &async_task::FallibleTask<Outcome<T>, TaskMeta>, meta: *const TaskMeta) -> bool {
    // SAFETY: `meta` points into the header of the task this handle holds (see `State::Live`),
    // and `TaskMeta` is `Sync` (atomics, and fields fixed at spawn).
    task.is_finished() && !unsafe { &*meta }.cancel_dropping()
}

impl<T> JoinHandle<T> {
    /// [`JoinHandle::poll`] of a task not over yet (or being dropped by a cancel), of an
    /// aborted handle, or of one already polled to completion, with the state taken out of the
    /// handle. Out of line, so that the join of a finished task (most joins of short tasks)
    /// does not carry this path's frame: callgrind counted 60 instructions per join with it
    /// inline.
    #[inline(never)]
    fn poll_slow(&self, state: State<T>, cx: &mut Context<'_>) -> Poll<Result<T, JoinError>> {
        match state {
            State::Live(mut task, meta, mut flags) => {
                // SAFETY: `meta` points into the header of the task this handle holds (see
                // `State::Live`), and `TaskMeta` is `Sync` (atomics, and fields fixed at spawn).
                if !task.is_finished() && migratable(unsafe { &*meta }) {
                    // Steal rule 6: still queued on top of this loop's deque, it runs now.
                    crate::steal::join_inline(meta);
                }
                // async-task registers no waker for a task that is over; the one it may still
                // hold (and wake or drop now) was guarded when it was registered.
                // SAFETY: `meta` points into the header of the task this handle holds (see
                // `State::Live`), and `TaskMeta` is `Sync` (atomics, and fields fixed at spawn).
                let guard = if task.is_finished() && !unsafe { &*meta }.cancel_dropping() {
                    None
                } else {
                    match self.guard_or_restore(cx.waker()) {
                        Ok(guard) => guard,
                        Err(panic) => {
                            // The handle keeps its task (an unwind dropped it: cancelled).
                            self.state.set(State::Live(task, meta, flags));
                            std::panic::resume_unwind(panic)
                        }
                    }
                };
                let polled = match &guard {
                    None => Pin::new(&mut task).poll(cx),
                    Some(g) => {
                        Pin::new(&mut task).poll(&mut Context::from_waker(&Waker::from(g.clone())))
                    }
                };
                match polled {
                    Poll::Pending => {
                        flags.waiting = true;
                        self.state.set(State::Live(task, meta, flags));
                        let foreign = guard.is_some();
                        self.keep_awaiter(guard, cx.waker(), flags.keep_own);
                        if foreign {
                            // Polled for someone other than the task being polled: on a loop
                            // thread maybe a foreign executor that blocks it until woken.
                            crate::context::flush_for_foreign_wait_on(cx.waker(), meta);
                        }
                        Poll::Pending
                    }
                    Poll::Ready(out) => {
                        if flags.waiting {
                            self.awaiter.set(None); // as in `poll`
                        }
                        Poll::Ready(output(out))
                    }
                }
            }
            State::Aborted(mut a) => {
                // The waker async-task may keep (see `guard_foreign`), also kept here for
                // `is_finished`'s polls: an abort is rare, so it is made on every poll.
                let (waker, keep, foreign) = match self.guard_or_restore(cx.waker()) {
                    Ok(Some(guard)) => {
                        let weak = Arc::downgrade(&guard);
                        (Waker::from(guard), Awaiter::Guard(weak), true)
                    }
                    Ok(None) => (cx.waker().clone(), Awaiter::Own(cx.waker().clone()), false),
                    Err(panic) => {
                        self.state.set(State::Aborted(a));
                        std::panic::resume_unwind(panic)
                    }
                };
                if a.poll_over(&mut Context::from_waker(&waker)) {
                    return Poll::Ready(output(a.out.take()));
                }
                drop(waker);
                a.waker = Some(keep);
                let meta = a.meta;
                self.state.set(State::Aborted(a));
                if foreign {
                    // As for a live task: the abort queued the task on its loop to be
                    // dropped, maybe over the ring, its ping waiting for the end of the turn.
                    // `cancel` is still `Some` (not over): it keeps the header, so `meta`, alive.
                    crate::context::flush_for_foreign_wait_on(cx.waker(), meta);
                }
                Poll::Pending
            }
            // Its output went to the poll that returned `Ready`: a cancelled error now would
            // be a lie (the task finished, or its cancellation was already reported).
            State::Taken => panic!("xtc: JoinHandle polled after it completed"),
            // `poll` takes `&mut self`, and `with` holds `&self` for its whole call.
            State::Busy => unreachable!("xtc: a JoinHandle polled inside one of its own calls"),
        }
    }
}

impl<T> JoinHandle<T> {
    /// Keeps what async-task now holds as the awaiter, for `abort` (see `awaiter`): the
    /// guard, weakly, or the polling task's own waker (`own`), cloned unless the same is kept
    /// already or this join is not `keep_own` (`unshared`). The box is reused from one poll
    /// to the next.
    fn keep_awaiter(&self, guard: Option<Arc<GuardedWaker>>, own: &Waker, keep_own: bool) {
        let kept = self.awaiter.take();
        let now = match guard {
            Some(g) => Awaiter::Guard(Arc::downgrade(&g)),
            None if !keep_own => return,
            None if kept
                .as_deref()
                .is_some_and(|k| matches!(k, Awaiter::Own(w) if w.will_wake(own))) =>
            {
                return self.awaiter.set(kept);
            }
            None => Awaiter::Own(own.clone()),
        };
        let boxed = match kept {
            Some(mut b) => {
                *b = now;
                b
            }
            None => Box::new(now),
        };
        self.awaiter.set(Some(boxed));
    }

    /// [`guard_foreign`], whose clone of a foreign waker is user code that may panic: the
    /// panic comes back as `Err` (for `poll` to put its state back before it goes on to the
    /// poller; taken out, the task was dropped, so cancelled, by the unwind). No cost without
    /// a panic.
    fn guard_or_restore(&self, waker: &Waker) -> std::thread::Result<Option<Arc<GuardedWaker>>> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| guard_foreign(waker)))
    }
}

impl<T> Drop for JoinHandle<T> {
    #[inline]
    fn drop(&mut self) {
        // An awaited handle (its output taken) holds nothing: checked inline, so the usual
        // drop, right after the `.await`, is a load and a branch (out of line it was a call,
        // about 16 instructions per join, callgrind).
        if matches!(self.state.get_mut(), State::Taken) {
            return;
        }
        self.drop_held();
    }
}

impl<T> JoinHandle<T> {
    /// [`Drop`] for a handle that still holds its task (live or aborted).
    #[inline(never)]
    fn drop_held(&mut self) {
        // A live task is detached; an aborted one stays cancelled (dropping async-task's
        // handle does that); an untaken output is dropped under `Outcome`'s guard. What the
        // state held is dropped here: the field itself is `ManuallyDrop`.
        match self.state.replace(State::Taken) {
            State::Live(mut task, meta, flags) => {
                // async-task's detach leaves the awaiter a `Pending` poll registered in the
                // task until the task ends, and wakes it then: a finished poller's allocation
                // (its waker holds a reference) stayed alive as long as a long-lived child, and
                // a live one got a spurious wake. One more poll with a no-op waker puts that in
                // its place, dropping the poller's (a finished task's output comes back and is
                // dropped here, as detach would drop it). Cost: one async-task poll, only for a
                // handle that waited; none for a spawn-and-forget handle. A task a stop is
                // dropping counts as not over (`over`): its awaiter is taken back too, and the
                // end of that drop wakes nobody.
                if flags.waiting && !over(&task, meta) {
                    let _ = Pin::new(&mut task).poll(&mut Context::from_waker(Waker::noop()));
                }
                task.detach()
            }
            State::Aborted(mut aborted) => {
                // The same for an aborted handle whose cancellation is still under way: its
                // cancel future holds the task, whose drop detaches it with the last poll's
                // waker still registered (kept alive, and woken when the owner drops the
                // future). One poll with a no-op waker puts that in its place first.
                if aborted.cancel.is_some() {
                    aborted.poll_over(&mut Context::from_waker(Waker::noop()));
                }
                drop(aborted)
            }
            State::Taken | State::Busy => {}
        }
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}

/// What async-task may keep as the awaiter of a handle polled with `waker`: `None` when that is
/// `waker` itself, as for the waker of the xtc task being polled (its wake is xtc's schedule,
/// which does not panic); otherwise `waker` inside a [`GuardedWaker`]. async-task wakes, clones
/// and drops its awaiter under an abort-on-panic guard, on the loop that completes the task,
/// so a panicking user waker there aborted the process. Cost: a thread-local read and two
/// loads when it is the task's own waker; otherwise one allocation.
fn guard_foreign(waker: &Waker) -> Option<Arc<GuardedWaker>> {
    let own = crate::context::with_core(|core| polled_with_own_waker(core, waker));
    if own == Some(true) {
        return None;
    }
    Some(Arc::new(GuardedWaker(Some(waker.clone()))))
}

/// Whether `waker` is the waker of the task `core` is polling now (not a custom waker, a
/// combinator's wrapper or a foreign executor's). Cost: two loads.
pub(crate) fn polled_with_own_waker(core: &crate::context::Core, waker: &Waker) -> bool {
    let meta = core.current.get();
    !meta.is_null() && {
        let offset = *META_OFFSET.get_or_init(|| meta_offset(core));
        (waker.data() as usize).wrapping_add(offset) == meta as usize
    }
}

/// How far an async-task header's metadata lies from its start, which is the data pointer of
/// the task's wakers (`Runnable::waker`, and the waker `Runnable::run` polls with). The same
/// for every task: the header's type depends on the metadata type only. Measured once on a
/// throwaway task, so [`guard_foreign`] can tell the polling task's own waker by its address
/// (only an async-task waker of that very task has it; a wrong offset would only mean a
/// wrapper every time).
static META_OFFSET: OnceLock<usize> = OnceLock::new();

fn meta_offset(core: &crate::context::Core) -> usize {
    let meta = TaskMeta::new(
        super::TaskInfo::here(None),
        0,
        core.shared.index,
        super::Home::of_core(core),
    );
    let (runnable, task) = async_task::Builder::new()
        .metadata(meta)
        .spawn(|_: &TaskMeta| async {}, |r: super::Runnable| drop(r));
    let waker = runnable.waker();
    let offset =
        (runnable.metadata() as *const TaskMeta as usize).wrapping_sub(waker.data() as usize);
    drop(waker);
    drop(task);
    drop(runnable);
    offset
}

/// A user's waker as a handle's awaiter (see [`guard_foreign`]): its `wake` and its drop run
/// under [`guarded`](super::guarded), so a panic there is logged and goes no further, and with
/// no task current on the loop ([`outside_task`](crate::context::outside_task)): async-task
/// wakes and drops it after it may have freed the task that just ended, which the loop still
/// names as the one being polled. Cloning it is a reference-count increment, no user code.
struct GuardedWaker(Option<Waker>);

impl Wake for GuardedWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(w) = &self.0 {
            crate::context::outside_task(|| {
                super::guarded("a JoinHandle's waker panicked when woken", || {
                    w.wake_by_ref()
                })
            });
        }
    }
}

impl Drop for GuardedWaker {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            crate::context::outside_task(|| {
                super::guarded("a JoinHandle's waker panicked when dropped", || drop(w))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        cell::Cell,
        future::Future,
        pin::Pin,
        sync::{
            atomic::{AtomicUsize, Ordering::SeqCst},
            mpsc, Arc,
        },
        task::{Context, Poll, Wake, Waker},
    };

    use super::{guard_foreign, JoinHandle};
    use crate::task::{cancel, create, Home, Runnable, TaskInfo};

    std::thread_local! {
        /// Run by `JoinHandle::abort` between its check of the task and its first poll of the
        /// cancellation, once.
        static BETWEEN: Cell<Option<Box<dyn FnOnce()>>> = const { Cell::new(None) };
    }

    pub(super) fn between_check_and_cancel() {
        if let Some(f) = BETWEEN.take() {
            f()
        }
    }

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    /// A future whose drop says it started and then waits to be let go.
    struct Held {
        in_drop: mpsc::Sender<()>,
        release: mpsc::Receiver<()>,
    }

    impl Drop for Held {
        fn drop(&mut self) {
            self.in_drop.send(()).unwrap();
            self.release.recv().unwrap();
        }
    }

    /// A stop of a task, held inside the drop of the task's future: what the abort-window
    /// tests need.
    struct HeldStop {
        runnable: Runnable,
        in_drop: mpsc::Receiver<()>,
        release: mpsc::Sender<()>,
    }

    /// A parked-for-good task of the current loop whose future's drop waits to be let go, its
    /// handle, and what a stop of it needs.
    fn held_task() -> (JoinHandle<()>, HeldStop) {
        let (in_drop, in_drop_rx) = mpsc::channel();
        let (release_tx, release) = mpsc::channel();
        let held = Held { in_drop, release };
        let (runnable, handle) = crate::context::with_core(|c| {
            create(
                Home::of_core(c),
                move || async move {
                    let _held = held;
                    std::future::pending::<()>().await
                },
                TaskInfo::here(None),
                0,
            )
        })
        .unwrap();
        let stop = HeldStop {
            runnable,
            in_drop: in_drop_rx,
            release: release_tx,
        };
        (handle, stop)
    }

    impl HeldStop {
        /// Runs `abort` with a stop landing in its window: another thread drops the task's
        /// runnable, as a stopping loop does, and is inside the future's drop when the abort
        /// goes on. Returns once the stop has ended, after `between` (run when the abort has
        /// gone on, the stop still inside the drop).
        fn abort_racing(self, abort: impl FnOnce(), between: impl FnOnce()) {
            let HeldStop {
                runnable,
                in_drop,
                release,
            } = self;
            let (stopper_tx, stopper_rx) = mpsc::channel();
            BETWEEN.set(Some(Box::new(move || {
                let stopper = std::thread::spawn(move || cancel(runnable));
                in_drop.recv().unwrap();
                stopper_tx.send(stopper).unwrap();
            })));
            abort();
            assert!(
                BETWEEN.take().is_none(),
                "the abort ran its check and went on"
            );
            between();
            release.send(()).unwrap();
            stopper_rx.recv().unwrap().join().unwrap();
        }
    }

    /// A stop that closes a task while its handle's `abort` is between its check and its first
    /// poll of the cancellation wakes, once it has dropped the future, the waker the handle was
    /// last polled with (a `FuturesUnordered` node's, say): the abort registers that one again,
    /// not a no-op waker in its place (which left the poller waiting for good).
    #[test]
    fn an_abort_racing_a_stops_close_wakes_the_last_poller() {
        crate::LocalExecutor::new().unwrap().block_on(async move {
            let (mut handle, stop) = held_task();
            let count = Arc::new(Count(AtomicUsize::new(0)));
            let waker = Waker::from(count.clone());
            let polled = Pin::new(&mut handle).poll(&mut Context::from_waker(&waker));
            assert!(polled.is_pending());
            stop.abort_racing(
                || handle.abort(),
                || assert_eq!(count.0.load(SeqCst), 0, "nothing woke the poller yet"),
            );
            assert!(
                count.0.load(SeqCst) >= 1,
                "the end of the stop's drop woke the handle's last poller"
            );
            assert!(handle.await.unwrap_err().is_cancelled());
        });
    }

    /// A task X awaits a handle shared on its shard (an `Rc`), with its own waker; another
    /// task aborts it while a stop closes the task in abort's window: X is woken at the end of
    /// the stop's drop (the abort registers X's waker again, kept by the handle's last poll).
    #[test]
    fn an_abort_by_another_task_racing_a_stops_close_wakes_the_awaiting_task() {
        use std::{cell::RefCell, rc::Rc};
        let (polled, done) = crate::LocalExecutor::new().unwrap().block_on(async move {
            let (handle, stop) = held_task();
            let shared = Rc::new(RefCell::new(handle));
            let (s2, polled, done) = (
                shared.clone(),
                Rc::new(Cell::new(0)),
                Rc::new(Cell::new(false)),
            );
            let (p2, d2) = (polled.clone(), done.clone());
            let x = crate::spawn_local(async move {
                let out = std::future::poll_fn(|cx| {
                    p2.set(p2.get() + 1);
                    Pin::new(&mut *s2.borrow_mut()).poll(cx)
                })
                .await;
                d2.set(true);
                out.unwrap_err().is_cancelled()
            });
            for _ in 0..3 {
                crate::yield_now().await;
            }
            assert_eq!(polled.get(), 1, "X polled the handle once and parked");
            stop.abort_racing(|| shared.borrow().abort(), || {});
            for _ in 0..2000 {
                crate::time::sleep(std::time::Duration::from_millis(1)).await;
                if done.get() {
                    break;
                }
            }
            let out = (polled.get(), done.get());
            x.abort();
            out
        });
        assert!(
            done,
            "X (polled {polled} times) was never woken: the stop woke a no-op waker"
        );
    }

    /// A handle stays four words: a `Vec` of a million at seven words read a third slower in
    /// the spawn+join benchmark (the bigger vector's page faults), the awaiter kept for
    /// `abort` having grown it.
    #[test]
    fn a_handle_is_four_words() {
        assert_eq!(
            std::mem::size_of::<super::JoinHandle<u64>>(),
            4 * std::mem::size_of::<usize>()
        );
    }

    /// The polling task's own waker is used as it is (no allocation on a task's join), for a
    /// pinned and a migratable task alike; any other waker gets the wrapper.
    #[test]
    fn only_foreign_wakers_are_wrapped() {
        let own = || std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone()));
        crate::LocalExecutor::new().unwrap().block_on(async move {
            let w = own().await;
            assert!(guard_foreign(&w).is_none(), "the main task's own waker");
            let migratable = crate::spawn(async move {
                let w = own().await;
                guard_foreign(&w).is_none()
            });
            assert!(migratable.await.unwrap(), "a migratable task's own waker");
            let pinned = crate::spawn_local(async move {
                // Another task's waker is not this one's.
                guard_foreign(&w).is_some()
            });
            assert!(pinned.await.unwrap());
            assert!(guard_foreign(Waker::noop()).is_some());
        });
        assert!(guard_foreign(Waker::noop()).is_some(), "off any loop");
    }
}
