//! [`JoinSet`]: a group of tasks of one output type, awaited in the order they finish and
//! cancelled together (tokio's `JoinSet`), for the shape a per-shard server has: every
//! connection task of this shard, aborted at once at shutdown or waited for in a graceful drain.
//!
//! Built on `futures`' `FuturesUnordered` over [`JoinHandle`]s rather than by hand: it already
//! polls only the handles whose tasks woke it (an intrusive ready queue), which is what makes
//! [`JoinSet::join_next`] cost the finished tasks, not the whole set.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use futures_util::stream::{FuturesUnordered, Stream};

use crate::{JoinError, JoinHandle};

/// Tasks of one output type: spawn into it or [`insert`](Self::insert) any [`JoinHandle`]
/// (pinned or migratable, of any shard), then take outcomes with
/// [`join_next`](Self::join_next) as the tasks finish, in that order.
///
/// Dropping the set aborts every task still in it (as tokio's does; a plain `JoinHandle`
/// detaches instead): their futures are dropped the next time their loops would poll them.
/// [`detach_all`](Self::detach_all) lets them run on instead. `!Send` when `T` is not.
///
/// ```
/// use xtc_shards::{task::JoinSet, LocalExecutor};
///
/// let sum = LocalExecutor::new()?.block_on(async {
///     let mut set = JoinSet::new();
///     for i in 1..=10u64 {
///         set.spawn_local(async move {
///             xtc_shards::time::sleep(std::time::Duration::from_millis(10 - i)).await;
///             i
///         });
///     }
///     let mut sum = 0;
///     while let Some(r) = set.join_next().await {
///         sum += r.expect("no task panicked");
///     }
///     sum
/// });
/// assert_eq!(sum, 55);
/// # Ok::<(), xtc_shards::Error>(())
/// ```
pub struct JoinSet<T: 'static> {
    tasks: FuturesUnordered<JoinHandle<T>>,
}

impl<T: 'static> Default for JoinSet<T> {
    fn default() -> Self {
        JoinSet {
            tasks: FuturesUnordered::new(),
        }
    }
}

impl<T: 'static> JoinSet<T> {
    /// An empty set. Cost: two small allocations (`FuturesUnordered`'s ready queue and its stub
    /// node).
    pub fn new() -> Self {
        Self::default()
    }

    /// Tasks in the set (finished ones whose outcome was not taken yet included). Cost: a
    /// field read.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the set holds no task. Cost: a field read.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Adds a task spawned elsewhere ([`Handle::spawn_on`](crate::Handle::spawn_on),
    /// [`spawn`](crate::spawn), a [`Builder`](crate::task::Builder) spawn, ..). Cost: one
    /// allocation (the set's node for it) and a few atomic updates (linking it, queueing its
    /// first poll).
    pub fn insert(&mut self, task: JoinHandle<T>) {
        self.tasks.push(task);
    }

    /// Spawns `fut` as a pinned task on the current shard ([`spawn_local`](crate::spawn_local))
    /// and adds it. Cost: the spawn's, and [`insert`](Self::insert)'s.
    ///
    /// # Panics
    /// Off any xtc loop, as `spawn_local`.
    #[track_caller]
    pub fn spawn_local<F>(&mut self, fut: F)
    where
        F: Future<Output = T> + 'static,
    {
        self.insert(crate::spawn_local(fut));
    }

    /// Spawns `fut` as a migratable task on the current shard ([`spawn`](crate::spawn)) and
    /// adds it. Cost: the spawn's, and [`insert`](Self::insert)'s.
    ///
    /// # Panics
    /// Off any xtc loop, as `spawn` (there, insert what
    /// [`Handle::spawn`](crate::Handle::spawn) returns).
    #[track_caller]
    pub fn spawn<F>(&mut self, fut: F)
    where
        F: Future<Output = T> + Send + 'static,
        T: Send,
    {
        self.insert(crate::spawn(fut));
    }

    /// The outcome of the next task to finish (its output, or a [`JoinError`] for a panic or
    /// a cancellation), taken out of the set; `None` once the set is empty. Cancel-safe:
    /// dropping the future before it resolves loses no outcome. Cost per call: a poll of each
    /// task handle woken since the last call (not of the whole set), and the freeing of the
    /// finished one's node; a handle that stays pending wraps the set's waker (one allocation,
    /// as under any combinator: it is not the polling task's own waker, plus the small box in
    /// which the handle keeps it for [`JoinHandle::abort`]).
    ///
    /// On an empty set it is ready at once with `None`, as tokio's is: in a `select` with
    /// another wait (an accept), leave it out while [`is_empty`](Self::is_empty), or the loop
    /// spins (tokio users write `Some(r) = set.join_next()` in `select!` for this). Taking
    /// outcomes with [`try_join_next`](Self::try_join_next) after each accept, as the README's
    /// drain recipe does, needs no `select` at all.
    pub fn join_next(&mut self) -> JoinNext<'_, T> {
        JoinNext { set: self }
    }

    /// As [`join_next`](Self::join_next), without waiting: `None` if no task has finished yet
    /// (or the set is empty). Cost: as one poll of `join_next`.
    pub fn try_join_next(&mut self) -> Option<Result<T, JoinError>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(&mut self.tasks).poll_next(&mut cx) {
            Poll::Ready(out) => out,
            Poll::Pending => None,
        }
    }

    /// Aborts every task in the set ([`JoinHandle::abort`]); they stay in it, and
    /// [`join_next`](Self::join_next) gives each one's outcome (cancelled, or its output if it
    /// had finished). A task of an executor that is not running (spawned before `run()` or
    /// after it returned) is dropped by its next run or by the executor's drop: its outcome
    /// waits until then. Cost: one abort per task.
    pub fn abort_all(&self) {
        // A handle's abort leaves the set's node waker registered in its task (also when a
        // stop closes the task meanwhile), so the node is woken when the outcome is there.
        self.tasks.iter().for_each(JoinHandle::abort);
    }

    /// Aborts every task and waits until each is over (its future dropped, so what it held is
    /// released), emptying the set; outcomes are dropped. Each task's loop drops it: for a
    /// task of an executor that is not running (spawned before `run()` or after it returned)
    /// that is at its next run or the executor's drop, and this waits until then. Cost:
    /// [`abort_all`](Self::abort_all) and a [`join_next`](Self::join_next) per task.
    pub async fn shutdown(&mut self) {
        self.abort_all();
        while self.join_next().await.is_some() {}
    }

    /// Empties the set, leaving its tasks to run on, detached (as dropped `JoinHandle`s).
    /// Cost: one node freed per task.
    pub fn detach_all(&mut self) {
        // `FuturesUnordered::clear` drops the handles: a handle's drop detaches its task.
        self.tasks.clear();
    }
}

impl<T: 'static> Drop for JoinSet<T> {
    /// Aborts every task still in the set; see [`JoinSet`]. Cost: an
    /// [`abort`](JoinHandle::abort) per task not over yet.
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl<T: 'static> fmt::Debug for JoinSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinSet")
            .field("len", &self.tasks.len())
            .finish()
    }
}

/// The future of [`JoinSet::join_next`].
#[must_use = "futures do nothing unless polled"]
pub struct JoinNext<'a, T: 'static> {
    set: &'a mut JoinSet<T>,
}

impl<T: 'static> Future for JoinNext<'_, T> {
    type Output = Option<Result<T, JoinError>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.set.tasks).poll_next(cx)
    }
}

impl<T: 'static> fmt::Debug for JoinNext<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinNext")
            .field("len", &self.set.tasks.len())
            .finish()
    }
}
