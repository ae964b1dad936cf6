//! The per-shard API for code running inside a task: who am I, how many are we, spawn here.
//!
//! `shard::id()` is 0-based and `shard::count()` sizes per-core state; a standalone
//! [`LocalExecutor`](crate::LocalExecutor) is shard 0 of 1 (DESIGN.md invariant 1).

use std::future::Future;

use crate::{
    context::{self, with_core},
    executor::{Handle, StopReason},
    task::{self, JoinHandle, TaskInfo},
};

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

/// A [`Handle`] to the caller's executor, or `None` off any loop.
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
    spawn_local_with(fut, TaskInfo::here(None))
}

pub(crate) fn spawn_local_with<F>(fut: F, info: TaskInfo) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let owner = with_core(|c| c.shared.clone()).expect(
        "xtc::spawn_local called off any xtc loop: call it inside a task, or use Handle::spawn_on",
    );
    task::spawn_raw(owner, move || fut, info)
}

/// Stops the caller's executor, as [`Handle::stop`]: `run()` returns once every loop has dropped
/// its tasks. Off any loop, and inside a [`LocalExecutor`](crate::LocalExecutor) (whose
/// `block_on` ends when its future does), it does nothing.
pub fn stop() {
    with_core(|c| c.exec.request_stop(StopReason::Requested));
}
