use std::{future::Future, sync::Arc};

use super::{JoinHandle, TaskInfo};
use crate::Result;

/// Spawns tasks with options: a name, shown in deadlock and stall reports, and a scheduling
/// class ([`class`](Self::class)).
///
/// ```
/// # use xtc_shards as xtc;
/// # xtc::LocalExecutor::new().unwrap().block_on(async {
/// let h = xtc::task::Builder::new().name("flusher").spawn_local(async { 1 });
/// assert_eq!(h.await.unwrap(), 1);
/// # });
/// ```
#[derive(Debug, Default, Clone)]
#[must_use = "the builder must be used to spawn"]
pub struct Builder {
    name: Option<super::TaskName>,
    class: Option<crate::Class>,
}

impl Builder {
    /// A builder with no options set. Cost: none (no allocation).
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Names the task. Any text will do: the reports print control characters in it escaped
    /// (`\n`), so each task keeps its one line. Cost: two allocations per builder (the name's
    /// `String` and the `Arc` around it: a thin pointer in each task's header, where an
    /// `Arc<str>` would take two words), shared by its spawns.
    pub fn name(mut self, name: &str) -> Builder {
        self.name = Some(Arc::new(name.to_string()));
        self
    }

    /// Spawns into scheduling class `class`, which orders the pinned tasks of its own shard.
    /// [`spawn_on`](Self::spawn_on) and [`spawn_on_handle`](Self::spawn_on_handle) refuse a
    /// class of another shard or executor with an `Err`; [`spawn_local`](Self::spawn_local),
    /// which cannot fail, spawns such a task in the default lane and logs a warning, and
    /// [`spawn`](Self::spawn) (migratable: in no lane) ignores the class with a warning. Cost:
    /// none beyond the class's own.
    pub fn class(mut self, class: crate::Class) -> Builder {
        self.class = Some(class);
        self
    }

    /// The class lane to spawn a local task into: 0 (the default) unless this builder's class
    /// belongs to the current loop.
    fn class_here(&self) -> u32 {
        let Some(c) = self.class else {
            return 0;
        };
        let here = crate::context::with_core(|core| (core.index(), core.shared.exec_id));
        let why = match here {
            Some((shard, exec_id)) => match misplaced(c, shard, exec_id) {
                None => return c.id,
                Some(why) => why,
            },
            // Off any loop the spawn itself panics (or, for a call that may run off a loop,
            // fails) right after: a warning that it spawns in the default lane would be false.
            None => return 0,
        };
        tracing::warn!("task::Builder::class: {why}; spawning in the default lane");
        0
    }

    /// Like [`crate::spawn_local`], with this builder's options. Cost: `spawn_local`'s, and
    /// with a class, a check that it belongs to this loop (one comparison) and its lane's
    /// queue instead of the plain FIFO.
    ///
    /// # Panics
    /// Off any xtc loop, like [`crate::spawn_local`].
    #[track_caller]
    pub fn spawn_local<F>(self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let class = self.class_here();
        crate::shard::spawn_local_with(fut, TaskInfo::here(self.name), class)
    }

    /// Like [`crate::spawn`] (a migratable task on the current loop), with this builder's options.
    /// A class does not apply (classes order a shard's pinned tasks; a migratable task runs in
    /// no lane): one set is ignored with a warning. Cost: [`crate::spawn`]'s.
    ///
    /// # Panics
    /// Off any xtc loop.
    #[track_caller]
    pub fn spawn<F>(self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if let Some(c) = self.class {
            tracing::warn!(
                "task::Builder::spawn: class of shard {} ignored: a migratable task runs in no \
                 class lane (use spawn_local or spawn_on)",
                c.shard
            );
        }
        crate::shard::spawn_with(fut, TaskInfo::here(self.name))
    }

    /// Like [`crate::Handle::spawn_on`] on the current executor, with this builder's options.
    /// `Err(OffLoop)` off any loop (use [`spawn_on_handle`](Self::spawn_on_handle) there),
    /// `Err(InvalidShard)` for an out-of-range shard, `Err(InvalidArgument)` for a class that
    /// is not one of `shard`'s in this executor. Cost: [`Handle::spawn_on`]'s, plus a
    /// thread-local read and an `Arc` clone of the current executor.
    ///
    /// [`Handle::spawn_on`]: crate::Handle::spawn_on
    #[track_caller]
    pub fn spawn_on<F, Fut>(self, shard: usize, make: F) -> Result<JoinHandle<Fut::Output>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let info = TaskInfo::here(self.name);
        let exec =
            crate::context::exec().ok_or(crate::Error::OffLoop("xtc::task::Builder::spawn_on"))?;
        let class = class_on(self.class, &exec, shard)?;
        // As `Handle::spawn_on`, refusals included (a stopping loop's `Drop`, a poisoned shard).
        exec.spawn_on_open(shard, make, info, class)
    }

    /// Like [`Handle::spawn_on`](crate::Handle::spawn_on), with this builder's options: from
    /// any thread, `main` included, before `run()` or while it runs (a class made at start-up
    /// with [`Handle::create_class`](crate::Handle::create_class) spawns its first tasks this
    /// way). Errors as [`spawn_on`](Self::spawn_on)'s, `Err(Stopped)` as `Handle::spawn_on`'s.
    /// Cost: `Handle::spawn_on`'s, plus a comparison for a class.
    #[track_caller]
    pub fn spawn_on_handle<F, Fut>(
        self,
        handle: &crate::Handle,
        shard: usize,
        make: F,
    ) -> Result<JoinHandle<Fut::Output>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let info = TaskInfo::here(self.name);
        let class = class_on(self.class, &handle.shared, shard)?;
        handle.shared.spawn_on_open(shard, make, info, class)
    }
}

/// The lane of `class` for a task spawned on `shard` of `exec`: 0 for none; `Err` for a class
/// of another shard or executor (an out-of-range shard is left to the spawn, which refuses
/// it). A task spawned in the default lane instead, with a warning, ran unprioritised unseen
/// wherever no `tracing` subscriber was installed.
fn class_on(
    class: Option<crate::Class>,
    exec: &crate::executor::ExecShared,
    shard: usize,
) -> Result<u32> {
    let Some(c) = class else {
        return Ok(0);
    };
    let Some(target) = exec.loops.get(shard) else {
        return Ok(0);
    };
    match misplaced(c, shard, target.exec_id) {
        None => Ok(c.id),
        Some(why) => Err(crate::Error::InvalidArgument(format!(
            "task::Builder::class: {why}: create the class on the shard that runs the task \
             (Handle::create_class(shard, ..)), or spawn on the class's shard"
        ))),
    }
}

/// Why class `c` cannot order a task on `shard` of executor `exec_id`, or `None` if it can.
fn misplaced(c: crate::Class, shard: usize, exec_id: u64) -> Option<String> {
    if c.shard == shard && c.exec_id == exec_id {
        return None;
    }
    let whose = if c.exec_id != exec_id {
        " of another executor"
    } else {
        ""
    };
    Some(format!(
        "a class of shard {}{whose} for a task on shard {shard}",
        c.shard
    ))
}
