//! [`LocalExecutor`]: one loop on the calling thread.

use std::{cell::Cell, future::Future, marker::PhantomData, panic::resume_unwind, sync::Arc};

use crate::{
    context::{self, Core},
    event_loop,
    executor::{Config, ExecShared},
    task::{self, TaskInfo},
    Result,
};

/// A standalone single loop that runs on the thread calling [`block_on`](Self::block_on).
/// Inside it the shard API answers shard 0 of 1, so shared-nothing code runs unchanged.
/// The thread is not pinned.
///
/// ```
/// # use xtc_shards as xtc;
/// let v = xtc::LocalExecutor::new()?.block_on(async {
///     let h = xtc::spawn_local(async { xtc::shard::id() + 41 });
///     h.await.unwrap() + xtc::shard::count()
/// });
/// assert_eq!(v, 42);
/// # Ok::<(), xtc::Error>(())
/// ```
///
/// `Send` (build it on one thread, run it on another) but not `Sync`: two threads running
/// `block_on` on one `LocalExecutor` at once would each take the same loop for their own, and
/// a `!Send` task of one could then be polled on the other. So this does not compile:
///
/// ```compile_fail
/// # use xtc_shards as xtc;
/// let ex = xtc::LocalExecutor::new().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| ex.block_on(async {}));
///     s.spawn(|| ex.block_on(async {}));
/// });
/// ```
#[derive(Debug)]
pub struct LocalExecutor {
    shared: Arc<ExecShared>,
    /// `!Sync` (see above); `Cell<()>` is `Send`, so the executor still is.
    _not_sync: PhantomData<Cell<()>>,
}

impl LocalExecutor {
    /// A new loop. `Err` only if the OS refuses an eventfd.
    pub fn new() -> Result<LocalExecutor> {
        let config = Config {
            io_driver: crate::executor::resolve_io(None)?,
            ..Config::default()
        };
        Ok(LocalExecutor {
            shared: ExecShared::new_arc(1, &config)?,
            _not_sync: PhantomData,
        })
    }

    /// Runs `fut` (and the tasks it spawns) until `fut` completes, then drops the tasks still
    /// alive and returns its output. A panic in `fut` is re-raised here; panics in spawned tasks
    /// go to their `JoinHandle`s.
    ///
    /// # Panics
    /// If called on a thread that already runs an xtc loop (inside a task): blocking there
    /// would stall every task of that loop.
    pub fn block_on<F>(&self, fut: F) -> F::Output
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let core = Core::new(self.shared.loops[0].clone(), self.shared.clone());
        let enter = context::enter(&core)
            .expect("LocalExecutor::block_on called inside an xtc loop: spawn the future instead");
        let main = task::spawn_raw(core.shared.clone(), move || fut, TaskInfo::here(None), 0);
        event_loop::run(&core, false, &|| main.is_finished());
        event_loop::shutdown(&core, false);
        drop(enter);
        // Migratable tasks spawned here (`xtc::spawn`) that are still parked: dropped too.
        crate::executor::drop_migratable(&self.shared);
        match futures_lite::future::block_on(main) {
            Ok(v) => v,
            Err(e) => match e.into_panic() {
                Some(p) => resume_unwind(p),
                None => unreachable!("the main task is only cancelled by shutdown, after it ended"),
            },
        }
    }
}
