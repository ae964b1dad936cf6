//! The stall watchdog: reports a task poll that kept its loop longer than the loop's budget.
//!
//! The check sits at the end of every task poll in the loop step: one clock read (the poll
//! clock of `clock.rs`, a time-stamp counter read where the CPU and the kernel trust it) and a
//! compare when a budget is armed, one branch on a value read once per turn when not. No
//! watcher thread, no signal. With no callback installed the report is logged with
//! `tracing::warn!` (install a `tracing` subscriber, e.g. `tracing-subscriber`'s `fmt`, to see
//! it on stderr). The report names the task (its name and spawn site) and how long it held the
//! loop; it has no backtrace: the check runs after the poll returned, when a backtrace shows
//! only the loop's own reporting code, never where the task spent its time (Glommio's detector
//! takes one from a signal during the stall, which the manual's design rules out).

use std::{fmt, panic::Location, sync::Arc, time::Duration};

use crate::{
    event_loop::LoopShared,
    stats::bump,
    sync::{lock, Mutex},
    task::TaskInfo,
};

/// What a stall callback receives.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StallReport {
    /// The loop that stalled.
    pub shard: usize,
    /// The task's name, if it was given one (`task::Builder::name`), as given (the report's
    /// `Display` escapes its control characters, so the report stays on one line).
    pub task_name: Option<String>,
    /// Where the task was spawned.
    pub spawned_at: &'static Location<'static>,
    /// The budget in force.
    pub budget: Duration,
    /// How long the poll ran.
    pub took: Duration,
}

impl fmt::Display for StallReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shard {}: task '{}' (spawned at {}) ran {:?} without yielding, over the {:?} stall budget",
            self.shard,
            crate::task::report_name(self.task_name.as_deref()),
            self.spawned_at,
            self.took,
            self.budget
        )
    }
}

/// A stall callback.
pub(crate) type StallCallback = Arc<dyn Fn(&StallReport) + Send + Sync + 'static>;

/// Per-loop watchdog settings, shared.
pub(crate) struct StallShared {
    /// Budget in ns; 0 = off.
    pub(crate) budget_ns: crate::sync::AtomicU64,
    pub(crate) callback: Mutex<Option<StallCallback>>,
    pub(crate) count: crate::sync::AtomicU64,
}

impl fmt::Debug for StallShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StallShared")
            .field("budget_ns", &self.budget_ns)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl StallShared {
    pub(crate) fn new() -> StallShared {
        StallShared {
            budget_ns: crate::sync::AtomicU64::new(0),
            callback: Mutex::new(None),
            count: crate::sync::AtomicU64::new(0),
        }
    }
}

/// Reports a stall of `took` by the task `info` on `shared`'s loop.
pub(crate) fn report(shared: &LoopShared, info: &TaskInfo, budget: Duration, took: Duration) {
    bump(&shared.stall.count, 1);
    let report = StallReport {
        shard: shared.index,
        task_name: info.name().map(str::to_string),
        spawned_at: info.location,
        budget,
        took,
    };
    let cb = lock(&shared.stall.callback).clone();
    match cb {
        Some(cb) => {
            // The callback runs on the loop's thread between two polls: a panic in it must not
            // unwind the loop (its status would stay BUSY and `run()` would wait for ever).
            // Its payload too, whose drop is user code as well (`task::drop_payload`).
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(&report)));
            if let Err(payload) = ran {
                tracing::error!("xtc stall callback panicked (the loop goes on): {report}");
                crate::task::drop_payload(payload);
            }
            // This clone is the last one when the callback was replaced meanwhile (by itself,
            // or from another thread during the call): its drop runs what the closure captured,
            // user code too.
            crate::task::guarded("a stall callback panicked while being dropped", || drop(cb));
        }
        None => tracing::warn!("xtc stall: {report}"),
    }
}
