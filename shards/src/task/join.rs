use std::{
    cell::Cell,
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll, Waker},
};

use super::Outcome;
use super::TaskMeta;
use crate::JoinError;

/// Handle to a spawned task: `.await` it for the output.
///
/// Awaiting gives `Ok(value)`, or `Err(JoinError)` if the task panicked (the panic was caught;
/// its loop went on) or was cancelled (aborted, or dropped because its executor stopped).
/// Dropping the handle detaches the task: it runs on, its output is discarded.
///
/// The handle is `Send` when the output is, so a pinned task's result can be awaited from any
/// thread, but it is not `Sync`: [`abort`](Self::abort) takes `&self` without a lock.
/// Cost: awaiting is one poll of the async-task handle; completion wakes the awaiter once.
/// A migratable task ([`spawn`](crate::spawn)) awaiting a migratable task that is the newest
/// one queued on its loop (not started yet, or woken since and queued there again) runs it
/// there and then, inside its own poll (a work-first join, as `rayon::join` does; at most 128
/// per poll and a bounded share of the stack, see
/// [`LoopStats::joins_inlined`](crate::LoopStats::joins_inlined)): no park, no wake-up. So polling a handle from a migratable task may run that task's code on the spot:
/// do not poll it by hand (`now_or_never`) inside a critical section the task also enters.
///
/// Limit: the task's completion wakes the awaiter inside async-task, under its abort-on-panic
/// guard, so awaiting a handle from a future polled with a custom waker that panics when
/// woken aborts the process (xtc's own wakers and those of mainstream executors never panic).
pub struct JoinHandle<T> {
    state: Cell<State<T>>,
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
    ),
    Aborted(Box<Aborted<T>>),
    /// The output went to an `.await` (or the state is out for a moment, see `with`).
    Taken,
}

/// async-task's cancel future, boxed because its type cannot be named.
type Cancel<T> = Pin<Box<dyn Future<Output = Option<Outcome<T>>>>>;

/// An aborted handle's state.
struct Aborted<T> {
    /// async-task's cancel future while the task is not over yet: it resolves once the owner
    /// has dropped the task's future (`None`) or, if the task finished first, with its output.
    cancel: Option<Cancel<T>>,
    /// The last waker `poll` saw, for [`JoinHandle::is_finished`]'s poll of `cancel`.
    waker: Option<Waker>,
    /// What came out once `cancel` resolved: the output, or `None` if it was cancelled.
    out: Option<Outcome<T>>,
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
            state: Cell::new(State::Live(task.fallible(), meta)),
        }
    }

    /// Runs `f` on the state, taken out of the cell for the call.
    fn with<R>(&self, f: impl FnOnce(&mut State<T>) -> R) -> R {
        let mut state = self.state.replace(State::Taken);
        let r = f(&mut state);
        self.state.set(state);
        r
    }

    /// Whether the task has completed (or been cancelled and its future dropped: a task
    /// cancelled by a stop is not finished while its future's `Drop` still runs). Cost: two
    /// atomic loads; after [`abort`](Self::abort), one poll of the cancellation.
    pub fn is_finished(&self) -> bool {
        self.with(|state| match state {
            // SAFETY: `meta` points into the header of the task this handle holds (see
            // `State::Live`), and `TaskMeta`'s fields are atomics.
            State::Live(task, meta) => task.is_finished() && !unsafe { &**meta }.cancel_dropping(),
            State::Aborted(a) => {
                let waker = a.waker.clone().unwrap_or_else(|| Waker::noop().clone());
                a.poll_over(&mut Context::from_waker(&waker))
            }
            State::Taken => true,
        })
    }
}

impl<T: 'static> JoinHandle<T> {
    /// Cancels the task: its future is dropped the next time its loop would poll it (promptly
    /// if it is parked), and awaiting this handle then gives a cancelled [`JoinError`] once
    /// that drop has happened, so whatever the task held (a borrow, a lock, a socket) is
    /// released when the `.await` returns. As in tokio, aborting a task that already finished
    /// changes nothing: awaiting gives its output. Cost: one async-task state update, two
    /// allocations and, for a parked task, one re-schedule on its loop.
    pub fn abort(&self) {
        self.with(|state| {
            if !matches!(state, State::Live(..)) {
                return;
            }
            let State::Live(task, _) = std::mem::replace(state, State::Taken) else {
                unreachable!("checked just above");
            };
            let mut aborted = Box::new(Aborted {
                cancel: Some(Box::pin(task.cancel())),
                waker: None,
                out: None,
            });
            // The first poll marks the task cancelled (scheduling it if it is parked, so its
            // owner drops the future) and picks up an output that was already there.
            aborted.poll_over(&mut Context::from_waker(Waker::noop()));
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
            State::Live(mut task, meta) => {
                if !task.is_finished() {
                    // Steal rule 6: still queued on top of this loop's deque, it runs now.
                    crate::steal::join_inline(meta);
                }
                match Pin::new(&mut task).poll(cx) {
                    Poll::Pending => {
                        self.state.set(State::Live(task, meta));
                        Poll::Pending
                    }
                    Poll::Ready(out) => Poll::Ready(output(out)),
                }
            }
            State::Aborted(mut a) => {
                if a.poll_over(cx) {
                    return Poll::Ready(output(a.out.take()));
                }
                if !a.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    a.waker = Some(cx.waker().clone());
                }
                self.state.set(State::Aborted(a));
                Poll::Pending
            }
            State::Taken => Poll::Ready(Err(JoinError::cancelled())),
        }
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        // A live task is detached; an aborted one stays cancelled (dropping async-task's
        // handle does that); an untaken output is dropped under `Outcome`'s guard.
        if let State::Live(task, _) = self.state.replace(State::Taken) {
            task.detach();
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
