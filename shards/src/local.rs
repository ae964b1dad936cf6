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
/// Unlike an [`Executor`](crate::Executor) it has no coordinator: no deadlock report (a
/// `block_on` whose future waits for something that can never come waits forever; the
/// deadlock grace of its [`Handle`](crate::Handle), from [`shard::handle`](crate::shard::handle),
/// is `None` and setting it has no effect), and its loop parks at once when it runs out of
/// work (spin-before-park and reply spin start at 0; its `Handle` can set them).
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
    pub(crate) shared: Arc<ExecShared>,
    /// `!Send` and `!Sync` (see above).
    _one_thread: PhantomData<*const ()>,
}

impl LocalExecutor {
    /// A new loop. `Err` if `XTC_IO` holds a bad value ([`Error::Env`](crate::Error::Env)) or
    /// forces an io_uring this kernel refuses, or if the OS refuses an eventfd. The other
    /// `XTC_*` variables are [`Builder`](crate::Builder)'s and not read here. Cost: the
    /// loop's allocations, one eventfd and, unless the driver is epoll, the process's one
    /// io_uring probe (cached); no thread is started. The I/O driver itself is set up by each
    /// `block_on`.
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
    /// end the future to end the run. No stop carries over to a later `block_on`. Run again
    /// from the `Drop` of a task its previous run left behind, it first drops the rest of
    /// them, unpolled: they never run on in it.
    ///
    /// # Panics
    /// If called on a thread that already runs an xtc loop (inside a task): blocking there
    /// would stall every task of that loop. So does a `block_on` of this executor re-entered
    /// while its own run is in progress (from a `Drop` that another executor's sweep runs in
    /// one of its tasks). A panic out of the loop itself, outside any task (user code xtc
    /// does not guard, such as a panicking `tracing` subscriber), is re-raised here once the
    /// run's tasks have been dropped. If the loop's shutdown itself panicked (a bug in xtc),
    /// the tasks it left alive are leaked, never polled or dropped elsewhere, and every later
    /// `block_on` of this executor panics, saying to build a new one.
    ///
    /// `fut` runs as the loop's main task, spawned here, at the caller's `block_on` call (the
    /// spawn site a stall report names).
    ///
    /// Cost per call: one task allocation for `fut`, the run's loop-local state (its queues,
    /// timer heap and registry), a small node on this thread's list of executors whose
    /// leftovers are being dropped (while the run's end drops them), and the loop's I/O driver (an io_uring or an epoll instance) set up when the run starts
    /// and closed when it ends; the thread parks in that driver whenever the loop runs out of
    /// work.
    #[track_caller]
    pub fn block_on<F>(&self, fut: F) -> F::Output
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        // Refused before anything is set up: a `Core` made first (as `context::enter`, which
        // refuses too, needs one) set up a second I/O driver for the running loop, took and gave
        // back its ring ends and deque, and stored its timer generation and driver kind over
        // the running run's (a second io_uring refused fell back to epoll, and the running
        // loop's `LoopStats::io_driver` said epoll). `enter` asks the same.
        if !context::may_enter(&self.shared.loops[0]) {
            panic!("{NESTED}");
        }
        // Tasks a shutdown cut short left alive (`LoopShared::poisoned`) may be `!Send` and
        // keep registry keys of that run: polled here, one ended by taking another task's
        // entry out of the new run's registry.
        if self.shared.loops[0]
            .poisoned
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            panic!("{POISONED}");
        }
        // Run again from a `Drop` of its own stopped run's leftovers (a nested `block_on`):
        // the rest of those leftovers go first, still as that run's (their drops' `Handle`
        // spawns refused). Its sweep woke them all to surface them, so they sat in the loop's
        // injector, and this run polled them: a leftover ran on after its run had ended.
        if crate::executor::Discarding::active_for(&self.shared) {
            crate::executor::drop_migratable(&self.shared);
        }
        // Then this run is live, and what it spawns through a `Handle` is its own.
        let live = crate::executor::Discarding::live(&self.shared);
        let core = Core::new(self.shared.loops[0].clone(), self.shared.clone());
        let enter = context::enter(&core).expect(NESTED);
        let main = task::spawn_raw(
            task::Home::of_core(&core),
            move || fut,
            TaskInfo::here(None),
            0,
        );
        // A panic out of the loop step (a bug in xtc, or user code xtc does not guard, such as
        // a tracing subscriber handling a stall warning) still shuts the loop down, as a shard's
        // worker does (tasks dropped on this thread, counts published), before it is re-raised
        // below: let through at once, it left the run's parked tasks alive and their handles
        // unresolved until a later `block_on` dropped them.
        // Busy + idle from here until the shutdown below has ended (or a panic unwinds).
        let clock = event_loop::RunClock::start(&core.shared.stats);
        // Dropped before `core` (declared after it): a shutdown cut short poisons the loop.
        let mut shut = crate::executor::ShutdownGuard {
            shared: &core.shared,
            done: false,
        };
        let looped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            event_loop::run(&core, false, &|| main.is_finished())
        }));
        if looped.is_err() {
            core.current.set(std::ptr::null());
            let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                event_loop::shutdown(&core, false)
            }));
            shut.done = closed.is_ok();
            if closed.is_err() {
                tracing::error!("xtc: a LocalExecutor's loop panicked, and so did its shutdown");
            }
        } else {
            event_loop::shutdown(&core, false);
            shut.done = true;
        }
        drop(shut);
        drop(clock);
        drop(enter);
        drop(live);
        // The run is over: its `Core` gives the loop's deque back, and where its timer
        // generations ended, before the drops below run user code, which may run this loop
        // again (a nested `block_on`, from a leftover's `Drop`). Kept alive until the end,
        // the outer `Core` still held the deque: the nested run had none, so a task it
        // spawned with `xtc::spawn` sat in the injector, never run, and the loop spun on it
        // for good; and the nested run's timers reused the outer run's generations. (After
        // `live`, as before: what its driver's drop spawns through a `Handle` is treated as
        // it was at the end.)
        drop(core);
        // Migratable tasks spawned here (`xtc::spawn`) that are still parked: dropped too. What
        // their drops spawn through a `Handle` is refused, as `Executor::run`'s are
        // (`Discarding`): queued, it ran in the next, unrelated `block_on`.
        {
            let _discarding = crate::executor::Discarding::enter(&self.shared);
            crate::executor::drop_migratable(&self.shared);
        }
        if let Err(payload) = looped {
            resume_unwind(payload);
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

/// The panic of a `block_on` called where it may not run (see its `# Panics`).
const NESTED: &str = "LocalExecutor::block_on called inside an xtc loop: spawn the future instead";

/// The panic of a `block_on` of an executor whose loop is poisoned (see its `# Panics`).
const POISONED: &str = "LocalExecutor::block_on: an earlier run's shutdown panicked (a bug in \
                        xtc), leaving tasks tied to it alive; this executor cannot run again: \
                        build a new one";

impl Drop for LocalExecutor {
    /// Closes the executor as `Executor`'s drop does: a `Handle` spawning afterwards gets
    /// `Err(Stopped)` (its task would never run), and tasks queued for this loop and never run
    /// (spawned through a `Handle` after `block_on` returned) are freed: one holding a
    /// `Handle` would otherwise keep the executor, and itself, alive for good. Cost: as
    /// `Executor`'s drop, for one loop: a few sweeps of its inbox, deque and parked lists under
    /// their locks, and the drops of what they find.
    fn drop(&mut self) {
        self.shared.close();
    }
}

#[cfg(test)]
mod tests {
    use std::{
        cell::RefCell,
        sync::{mpsc, Arc},
        task::Waker,
        time::Duration,
    };

    use super::LocalExecutor;

    thread_local! {
        static EXEC: LocalExecutor = LocalExecutor::new().unwrap();
        /// The waker of a task of the outer `block_on`, parked in it.
        static PARKED: RefCell<Option<Waker>> = const { RefCell::new(None) };
        static NESTED: RefCell<Option<String>> = const { RefCell::new(None) };
    }

    /// Runs `EXEC.block_on` from a `Drop`, as a sweep of another executor (`off_loop`) runs it.
    struct Reenter;
    impl Drop for Reenter {
        fn drop(&mut self) {
            let r = std::panic::catch_unwind(|| {
                EXEC.with(|ex| {
                    ex.block_on(async {
                        // Wakes the outer run's parked task: its loop is this one too, so the
                        // task came here, to the nested run's queue.
                        if let Some(w) = PARKED.with(|p| p.borrow_mut().take()) {
                            w.wake();
                        }
                        for _ in 0..4 {
                            crate::yield_now().await;
                        }
                    })
                })
            });
            let msg = r.err().map(|p| {
                crate::error::payload_message(&*p)
                    .unwrap_or("?")
                    .to_string()
            });
            NESTED.with(|n| *n.borrow_mut() = msg.or(Some(String::new())));
        }
    }

    /// A `LocalExecutor::block_on` re-entered while its own loop runs, hidden by `off_loop`
    /// (a task dropped another executor, whose sweep dropped a closure that called it through
    /// a thread-local): two `Core`s of one loop on one thread took each other's tasks and
    /// registry keys, and the outer run never ended. Refused like a `block_on` inside a task.
    #[test]
    fn block_on_reentered_through_off_loop_is_refused() {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            EXEC.with(|ex| {
                ex.block_on(async {
                    // A task parked in this run's registry, woken by the nested run.
                    let parked = crate::spawn_local(async {
                        let mut first = true;
                        std::future::poll_fn(|cx| {
                            if std::mem::take(&mut first) {
                                PARKED.with(|p| *p.borrow_mut() = Some(cx.waker().clone()));
                                std::task::Poll::Pending
                            } else {
                                std::task::Poll::Ready(())
                            }
                        })
                        .await
                    });
                    crate::yield_now().await;
                    let other = crate::Executor::builder().shards(1).build().unwrap();
                    let guard = Arc::new(Reenter);
                    other
                        .spawn_on(0, move || {
                            let _g = guard;
                            async {}
                        })
                        .unwrap();
                    drop(other);
                    parked.abort();
                });
            });
            let _ = tx.send(NESTED.with(|n| n.borrow_mut().take()));
        });
        let nested = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the outer block_on never returned");
        let msg = nested.expect("the nested block_on ran");
        assert!(
            msg.contains("inside an xtc loop"),
            "the nested block_on was not refused: {msg:?}"
        );
    }

    /// A `block_on` whose loop's shutdown panics (planted: a bug in xtc) leaves a polled,
    /// parked `!Send` task alive. A wake from another thread routes it to the loop's inbox:
    /// the sweep of the last `Handle`'s drop, on that thread, dropped its future there, and a
    /// later `block_on` polled it with a registry key of the old run (its end took another
    /// task's entry). Now the loop is poisoned: the task is leaked, and `block_on` refuses.
    #[test]
    #[cfg_attr(miri, ignore = "leaks the task, as it should: Miri reports leaks")]
    fn a_shutdown_cut_short_leaks_the_runs_tasks_and_refuses_later_runs() {
        use std::{
            sync::{atomic::Ordering::SeqCst, Mutex},
            task::{Poll, Waker},
            thread::ThreadId,
        };
        /// Records where it is dropped; `!Send` (its `Rc`), as a pinned task's state may be.
        struct Probe(
            Arc<Mutex<Option<ThreadId>>>,
            #[allow(dead_code)] std::rc::Rc<()>,
        );
        impl Drop for Probe {
            fn drop(&mut self) {
                *self.0.lock().unwrap() = Some(std::thread::current().id());
            }
        }
        let ex = LocalExecutor::new().unwrap();
        let slot: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
        let dropped_on: Arc<Mutex<Option<ThreadId>>> = Arc::new(Mutex::new(None));
        ex.shared.panic_shutdown.store(0, SeqCst);
        let (s, d) = (slot.clone(), dropped_on.clone());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ex.block_on(async move {
                drop(crate::spawn_local(async move {
                    let _p = Probe(d, std::rc::Rc::new(()));
                    std::future::poll_fn(|cx| {
                        *s.lock().unwrap() = Some(cx.waker().clone());
                        Poll::<()>::Pending
                    })
                    .await;
                }));
                crate::yield_now().await;
                crate::yield_now().await;
            })
        }));
        ex.shared.panic_shutdown.store(usize::MAX, SeqCst);
        assert!(r.is_err(), "the planted shutdown panic");
        assert!(
            dropped_on.lock().unwrap().is_none(),
            "the parked task lives on"
        );
        let again =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ex.block_on(async {})));
        let msg = again.map_err(|p| crate::error::payload_message(&*p).map(str::to_owned));
        assert!(
            matches!(&msg, Err(Some(m)) if m.contains("cannot run again")),
            "a later block_on was not refused: {msg:?}"
        );
        let handle = ex.shared.clone();
        drop(ex);
        let other = std::thread::spawn(move || {
            slot.lock().unwrap().take().expect("parked").wake();
            drop(handle);
            std::thread::current().id()
        })
        .join()
        .unwrap();
        assert_ne!(
            *dropped_on.lock().unwrap(),
            Some(other),
            "the task's !Send future was dropped on another thread"
        );
    }
}
