//! `ShardLocal<T>`: a `!Send` value per shard, built there at first use, dropped by the loop's
//! shutdown after its tasks, built again by the next run.

mod common;
use common::*;

use std::{
    cell::{Cell, RefCell},
    rc::Rc,
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    thread::ThreadId,
};

use xtc_shards::{shard, spawn_local, Error, LocalExecutor, ShardLocal};

/// Per drop: the shard, whether it ran on the thread that built the value, and what the shard
/// API said there.
type DropLog = Arc<Mutex<Vec<(usize, bool, Option<usize>)>>>;

/// A `!Send` value that records, when dropped, where it was built and dropped.
struct Probe {
    shard: usize,
    built_on: ThreadId,
    log: DropLog,
    _not_send: Rc<()>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        // (shard, dropped on the thread that built it, what the shard API says there)
        self.log.lock().unwrap().push((
            self.shard,
            std::thread::current().id() == self.built_on,
            shard::try_id(),
        ));
    }
}

/// Each shard builds its own value once per run, on its own thread, and the loop's shutdown
/// drops it there (the shard API still answering) before `run()` returns; the next run builds
/// it again.
#[test]
fn one_value_per_shard_and_run_built_and_dropped_on_its_shard() {
    let builds = Arc::new(AtomicUsize::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let (b, l) = (builds.clone(), log.clone());
    let local: &'static ShardLocal<Probe> = Box::leak(Box::new(ShardLocal::from_fn(move |s| {
        b.fetch_add(1, SeqCst);
        Probe {
            shard: s,
            built_on: std::thread::current().id(),
            log: l.clone(),
            _not_send: Rc::new(()),
        }
    })));
    let ex = exec(3);
    for run in 1..=2 {
        for i in 0..3 {
            ex.spawn_on(i, move || async move {
                // The same value at each use in one run, the shard's own.
                let a = local.get();
                xtc_shards::yield_now().await;
                let b = local.get();
                assert!(Rc::ptr_eq(&a, &b));
                assert_eq!(a.shard, shard::id());
            })
            .unwrap();
        }
        ex.run().unwrap();
        assert_eq!(builds.load(SeqCst), 3 * run, "one build per shard and run");
        let mut dropped = std::mem::take(&mut *log.lock().unwrap());
        dropped.sort();
        assert_eq!(
            dropped,
            vec![(0, true, Some(0)), (1, true, Some(1)), (2, true, Some(2))],
            "each value dropped by its own shard's loop, before run() returned"
        );
    }
}

/// A task's `Drop` that runs in the shutdown still finds the value (the values go after the
/// tasks), and the value's own `Drop` sees what that task left in it.
#[test]
fn a_tasks_drop_at_shutdown_still_reaches_the_value() {
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    struct Registry(RefCell<Vec<u32>>);
    impl Drop for Registry {
        fn drop(&mut self) {
            SEEN.store(self.0.borrow().len() + 100, SeqCst);
        }
    }
    static REG: ShardLocal<Registry> = ShardLocal::new(|_| Registry(RefCell::new(Vec::new())));
    struct Conn(u32);
    impl Drop for Conn {
        fn drop(&mut self) {
            // A connection takes itself out of its shard's registry.
            let reg = REG.get();
            reg.0.borrow_mut().retain(|c| *c != self.0);
        }
    }
    let ex = exec(1);
    ex.block_on(|| async {
        for c in 0..3 {
            REG.get().0.borrow_mut().push(c);
            // Parked for good: dropped by the shutdown at the end of block_on.
            spawn_local(async move {
                let _conn = Conn(c);
                std::future::pending::<()>().await
            });
        }
        xtc_shards::yield_now().await;
        assert_eq!(REG.get().0.borrow().len(), 3);
    })
    .unwrap();
    assert_eq!(
        SEEN.load(SeqCst),
        100,
        "every connection's Drop took itself out before the registry went"
    );
}

/// Off any loop: `try_get` is `Err(OffLoop)` naming what to use, `get` panics with it.
#[test]
fn off_any_loop_is_an_error() {
    static L: ShardLocal<u32> = ShardLocal::new(|s| s as u32);
    let err = L.try_get().unwrap_err();
    assert!(matches!(err, Error::OffLoop(_)), "{err:#?}");
    assert!(err.to_string().contains("Handle::submit_to"), "{err}");
    let panic = std::panic::catch_unwind(|| L.get()).unwrap_err();
    let msg = panic.downcast_ref::<String>().unwrap();
    assert!(msg.contains("needs to run inside a task"), "{msg}");
}

/// An initializer that panics reaches the task; nothing is kept, and the next use builds
/// again. One that uses its own `ShardLocal` panics with a message saying so.
#[test]
fn initializer_panics_and_self_use() {
    static TRIES: AtomicUsize = AtomicUsize::new(0);
    static FLAKY: ShardLocal<usize> = ShardLocal::new(|_| {
        if TRIES.fetch_add(1, SeqCst) == 0 {
            panic!("the first build fails");
        }
        7
    });
    static SELF_USE: ShardLocal<usize> = ShardLocal::new(|_| *SELF_USE.get() + 1);
    LocalExecutor::new().unwrap().block_on(async {
        let first = spawn_local(async { *FLAKY.get() }).await;
        assert!(first.unwrap_err().is_panic());
        assert_eq!(*FLAKY.get(), 7, "built again after the failed build");
        assert_eq!(TRIES.load(SeqCst), 2);
        let err = spawn_local(async { *SELF_USE.get() }).await.unwrap_err();
        let msg = err.into_panic().expect("a panic's payload");
        let msg = msg.downcast_ref::<&str>().copied().unwrap_or_default();
        assert!(msg.contains("used the same ShardLocal"), "{msg}");
    });
}

/// Per `LocalExecutor::block_on`: a value is built in a run and dropped at its end, not kept
/// on the thread for the next one (as a `thread_local!` would be).
#[test]
fn a_local_executor_builds_per_block_on() {
    thread_local! {
        static DROPS: Cell<usize> = const { Cell::new(0) };
    }
    struct Counted;
    impl Drop for Counted {
        fn drop(&mut self) {
            DROPS.with(|d| d.set(d.get() + 1));
        }
    }
    static C: ShardLocal<Counted> = ShardLocal::new(|_| Counted);
    let ex = LocalExecutor::new().unwrap();
    for n in 1..=2 {
        ex.block_on(async {
            let _ = C.get();
        });
        assert_eq!(DROPS.with(Cell::get), n);
    }
}

/// After the shutdown dropped the values, a value's `Drop` that asks for another
/// `ShardLocal` gets `Err(Stopped)`; the drop goes on and the run ends.
#[test]
fn a_values_drop_finds_the_others_gone() {
    static ANSWER: Mutex<Option<String>> = Mutex::new(None);
    struct AsksOther;
    impl Drop for AsksOther {
        fn drop(&mut self) {
            let r = OTHER.try_get().map(|v| *v);
            *ANSWER.lock().unwrap() = Some(match r {
                Err(e) => format!("{e:#?}"),
                Ok(v) => format!("Ok({v})"),
            });
        }
    }
    static ASKS: ShardLocal<AsksOther> = ShardLocal::new(|_| AsksOther);
    static OTHER: ShardLocal<u8> = ShardLocal::new(|_| 1);
    LocalExecutor::new().unwrap().block_on(async {
        let _ = ASKS.get();
    });
    let answer = ANSWER.lock().unwrap().clone().unwrap();
    assert!(answer.starts_with("xtc::Error::Stopped"), "{answer}");
}

/// A migratable task parked at the run's end is dropped after every loop stopped, off any
/// loop: its `Drop` gets `Err(OffLoop)` (documented), while a pinned task's gets the value.
#[test]
fn a_parked_migratable_tasks_drop_runs_off_any_loop() {
    static ANSWERS: Mutex<Vec<(bool, bool)>> = Mutex::new(Vec::new());
    static REG: ShardLocal<u8> = ShardLocal::new(|_| 1);
    struct Conn(bool);
    impl Drop for Conn {
        fn drop(&mut self) {
            let got = REG.try_get();
            let off = matches!(got, Err(Error::OffLoop(_)));
            ANSWERS.lock().unwrap().push((self.0, got.is_ok() || !off));
        }
    }
    exec(1)
        .block_on(|| async {
            let _ = REG.get();
            spawn_local(async {
                let _c = Conn(true);
                std::future::pending::<()>().await
            });
            xtc_shards::spawn(async {
                let _c = Conn(false);
                std::future::pending::<()>().await
            });
            xtc_shards::yield_now().await;
        })
        .unwrap();
    let mut answers = ANSWERS.lock().unwrap().clone();
    answers.sort();
    // (pinned, found the value): the migratable one got OffLoop, the pinned one the value.
    assert_eq!(answers, vec![(false, false), (true, true)]);
}

/// At a quiescent stop, what a value's `Drop` spawns on its loop is dropped by that stop (as
/// at a requested one), not run by the next `run()`.
#[test]
fn a_values_drop_spawns_are_dropped_at_a_quiescent_stop() {
    static RAN: AtomicUsize = AtomicUsize::new(0);
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    struct Flag;
    impl Drop for Flag {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, SeqCst);
        }
    }
    struct Spawner;
    impl Drop for Spawner {
        fn drop(&mut self) {
            let f = Flag;
            drop(spawn_local(async move {
                let _f = f;
                RAN.fetch_add(1, SeqCst);
            }));
            let f = Flag;
            drop(xtc_shards::spawn(async move {
                let _f = f;
                RAN.fetch_add(10, SeqCst);
            }));
        }
    }
    static S: ShardLocal<Spawner> = ShardLocal::new(|_| Spawner);
    let ex = exec(2);
    ex.spawn_on(0, || async {
        let _ = S.get();
    })
    .unwrap();
    ex.run().unwrap();
    assert_eq!((RAN.load(SeqCst), DROPPED.load(SeqCst)), (0, 2));
    ex.run().unwrap();
    assert_eq!(
        RAN.load(SeqCst),
        0,
        "a spawn of the first run's value drop ran in the second run"
    );
}
