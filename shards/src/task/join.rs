use std::{
    cell::Cell,
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
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
///
/// Limit: the task's completion wakes the awaiter inside async-task, under its abort-on-panic
/// guard, so awaiting a handle from a future polled with a custom waker that panics when
/// woken aborts the process (xtc's own wakers and those of mainstream executors never panic).
pub struct JoinHandle<T> {
    task: Cell<Option<async_task::FallibleTask<Outcome<T>, TaskMeta>>>,
}

impl<T> JoinHandle<T> {
    pub(crate) fn new(task: async_task::Task<Outcome<T>, TaskMeta>) -> Self {
        JoinHandle {
            task: Cell::new(Some(task.fallible())),
        }
    }

    /// Cancels the task: its future is dropped the next time its loop would poll it (promptly
    /// if it is parked), and awaiting this handle then gives a cancelled [`JoinError`]. If the
    /// task had already finished, its output is discarded. Cost: one async-task state update and,
    /// for a parked task, one re-schedule on its loop.
    pub fn abort(&self) {
        // Dropping an async-task handle that is not detached cancels its task.
        drop(self.task.take());
    }

    /// Whether the task has completed (or been cancelled). Cost: one atomic load.
    pub fn is_finished(&self) -> bool {
        let task = self.task.take();
        let done = task.as_ref().is_none_or(|t| t.is_finished());
        self.task.set(task);
        done
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(mut task) = self.task.take() else {
            return Poll::Ready(Err(JoinError::cancelled()));
        };
        match Pin::new(&mut task).poll(cx) {
            Poll::Pending => {
                self.task.set(Some(task));
                Poll::Pending
            }
            Poll::Ready(None) => Poll::Ready(Err(JoinError::cancelled())),
            Poll::Ready(Some(out)) => Poll::Ready(match out.into_inner() {
                Ok(v) => Ok(v),
                Err(payload) => Err(JoinError::panic(*payload)),
            }),
        }
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
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
