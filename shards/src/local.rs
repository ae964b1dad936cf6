//! [`LocalExecutor`]: one loop on the calling thread.

use std::{future::Future, marker::PhantomData, panic::resume_unwind, sync::Arc};

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
/// Neither `Send` nor `Sync`, like glommio's `LocalExecutor` and tokio's `LocalRuntime`: its
/// loop runs on the thread that made it, only. Two threads running `block_on` on one executor
/// at once would each take the same loop for their own (a `!Send` task of one polled on the
/// other), and a `Sharded<T>` reference returned from a `block_on` on one thread would alias
/// the one the loop hands out on another. So neither of these compiles:
///
/// ```compile_fail
/// # use xtc_shards as xtc;
/// let ex = xtc::LocalExecutor::new().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| ex.block_on(async {}));
///     s.spawn(|| ex.block_on(async {}));
/// });
/// ```
///
/// ```compile_fail
/// # use xtc_shards as xtc;
/// let ex = xtc::LocalExecutor::new().unwrap();
/// std::thread::spawn(move || ex.block_on(async {}));
/// ```
#[derive(Debug)]
pub struct LocalExecutor {
    shared: Arc<ExecShared>,
    /// `!Send` and `!Sync` (see above).
    _one_thread: PhantomData<*const ()>,
}

impl LocalExecutor {
    /// A new loop. `Err` if `XTC_IO` holds a bad value ([`Error::Env`](crate::Error::Env)) or
    /// forces an io_uring this kernel refuses, or if the OS refuses an eventfd. The other
    /// `XTC_*` variables are [`Builder`](crate::Builder)'s and not read here.
    pub fn new() -> Result<LocalExecutor> {
        let config = Config {
            io_driver: crate::executor::resolve_io(None)?,
            local: true,
            ..Config::default()
        };
        Ok(LocalExecutor {
            shared: ExecShared::new_arc(1, &config)?,
            _one_thread: PhantomData,
        })
    }

    /// Runs `fut` (and the tasks it spawns) until `fut` completes, then drops the tasks still
    /// alive and returns its output. A panic in `fut` is re-raised here; panics in spawned tasks
    /// go to their `JoinHandle`s. [`xtc::stop`](crate::stop) (or a `Handle`'s `stop`) inside
    /// it does nothing, as in glommio, whose `LocalExecutor::run` also ends only with its future:
    /// end the future to end the run. No stop carries over to a later `block_on`.
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
        // Migratable tasks spawned here (`xtc::spawn`) that are still parked: dropped too. What
        // their drops spawn through a `Handle` is refused, as `Executor::run`'s are
        // (`Discarding`): queued, it ran in the next, unrelated `block_on`.
        {
            let _discarding = crate::executor::Discarding::enter(&self.shared);
            crate::executor::drop_migratable(&self.shared);
        }
        match futures_lite::future::block_on(main) {
            Ok(v) => v,
            Err(e) => match e.into_panic() {
                Some(p) => resume_unwind(p),
                None => unreachable!("the main task is only cancelled by shutdown, after it ended"),
            },
        }
    }
}

impl Drop for LocalExecutor {
    /// Closes the executor as `Executor`'s drop does: a `Handle` spawning afterwards gets
    /// `Err(Stopped)` (its task would never run), and tasks queued for this loop and never run
    /// (spawned through a `Handle` after `block_on` returned) are freed: one holding a
    /// `Handle` would otherwise keep the executor, and itself, alive for good.
    fn drop(&mut self) {
        self.shared.close();
    }
}
