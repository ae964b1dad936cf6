//! A `Drop` that a loop's shutdown runs, blocked (`futures::executor::block_on`) on the join
//! handle of a MIGRATABLE task that is parked (ring rule 3c, `steal::cancel_awaited_at_stop`):
//! once every loop of the run has begun its shutdown no loop will poll that task again, so the
//! wait takes it and drops it (the handle: cancelled), as the pinned case's wait does. Before,
//! parked migratable tasks were dropped only once every loop had stopped, and `run()` hung.
//! And the other side: while a loop that may still run the task has not begun its shutdown,
//! the wait leaves the task to it.
mod common;
use common::*;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        mpsc, Arc,
    },
    time::Duration,
};

use xtc_shards::{Executor, JoinHandle};

const LIMIT: Duration = Duration::from_secs(20);

/// Runs `ex` on a detached thread; `None` if `run()` has not returned within `limit` (the
/// thread is leaked: a run blocked in a shutdown Drop cannot be stopped, and `run_within`'s
/// scoped thread would block the test for good).
fn run_detached(ex: Arc<Executor>, limit: Duration) -> Option<xtc_shards::Result<()>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = ex.run();
        let _ = tx.send(r);
    });
    rx.recv_timeout(limit).ok()
}

/// Runs its closure when dropped.
struct OnDrop<F: FnMut()>(F);
impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

fn executor(n: usize, stealing: bool) -> Arc<Executor> {
    Arc::new(
        Executor::builder()
            .shards(n)
            .oversubscribe(true)
            .stealing(stealing)
            .deadlock_grace(Some(Duration::from_secs(30)))
            .build()
            .expect("build executor"),
    )
}

/// Shard 0's parked task, whose guard (dropped by shard 0's shutdown) blocks on the join
/// handle it is handed and reports the outcome.
fn spawn_waiter(
    ex: &Executor,
    handle_rx: mpsc::Receiver<JoinHandle<u32>>,
    out_tx: mpsc::Sender<String>,
    in_drop: Arc<AtomicBool>,
    parked: Arc<AtomicUsize>,
) {
    ex.spawn_on(0, move || async move {
        let mut out = Some(out_tx);
        let mut hr = Some(handle_rx);
        let _g = OnDrop(move || {
            let j = hr.take().unwrap().recv_timeout(LIMIT).unwrap();
            in_drop.store(true, SeqCst);
            let r = futures::executor::block_on(j);
            let _ = out.take().unwrap().send(format!("{r:?}"));
        });
        parked.fetch_add(1, SeqCst);
        std::future::pending::<()>().await;
    })
    .unwrap();
}

/// The documented hang: shard `from` spawns a migratable task T that parks for good (its
/// future counts its drop); shard 0's shutdown Drop blocks on T's handle. With 2 shards, T
/// spawned on shard 1 (parked there, or on shard 0 if stolen) and on shard 0 itself; stealing
/// on and off.
#[test]
fn shutdown_drop_waiting_on_a_parked_migratable_task_ends_cancelled() {
    for from in [1usize, 0] {
        for stealing in [false, true] {
            let ex = executor(2, stealing);
            let h = ex.handle();
            let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<u32>>();
            let (out_tx, out_rx) = mpsc::channel::<String>();
            let parked = Arc::new(AtomicUsize::new(0));
            let t_dropped = Arc::new(AtomicUsize::new(0));
            spawn_waiter(
                &ex,
                handle_rx,
                out_tx,
                Arc::new(AtomicBool::new(false)),
                parked.clone(),
            );
            let (p, d) = (parked.clone(), t_dropped.clone());
            ex.spawn_on(from, move || async move {
                let p2 = p.clone();
                let t = xtc_shards::spawn(async move {
                    let _c = CountDrop(d);
                    p2.fetch_add(1, SeqCst);
                    std::future::pending::<()>().await;
                    7u32
                });
                handle_tx.send(t).unwrap();
            })
            .unwrap();
            let driver = std::thread::spawn(move || {
                block_until(|| parked.load(SeqCst) == 2);
                // T has parked: registered, no `Runnable` anywhere.
                std::thread::sleep(Duration::from_millis(20));
                h.stop();
            });
            let r = run_detached(ex.clone(), LIMIT);
            driver.join().unwrap();
            assert!(
                r.is_some(),
                "from={from} stealing={stealing}: run() hung: shard 0's shutdown Drop waits for \
                 good on a parked migratable task"
            );
            assert!(r.unwrap().is_ok());
            let got = out_rx.recv_timeout(LIMIT).unwrap();
            assert!(
                got.contains("Cancelled") || got.contains("cancelled"),
                "from={from} stealing={stealing}: the awaited task: {got}"
            );
            assert_eq!(t_dropped.load(SeqCst), 1, "T's future dropped once");
        }
    }
}

/// T parked on shard 1, woken from a plain thread after shard 1 has stopped: its `Runnable`
/// sits in shard 1's injector (its last loop), which no loop drains any more; shard 0's
/// shutdown Drop then blocks on T's handle.
#[test]
fn shutdown_drop_waiting_on_a_migratable_task_woken_into_a_stopped_loops_injector() {
    let ex = executor(2, false);
    let h = ex.handle();
    let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<u32>>();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let (wake_tx, wake_rx) = futures::channel::oneshot::channel::<()>();
    let (s1_gone_tx, s1_gone_rx) = mpsc::channel::<()>();
    let (woken_tx, woken_rx) = mpsc::channel::<()>();
    let parked = Arc::new(AtomicUsize::new(0));
    let t_dropped = Arc::new(AtomicUsize::new(0));
    // Shard 0's waiter: first waits until shard 1 has stopped and T was woken.
    let p0 = parked.clone();
    ex.spawn_on(0, move || async move {
        let mut out = Some(out_tx);
        let mut hr = Some(handle_rx);
        let _g = OnDrop(move || {
            woken_rx.recv_timeout(LIMIT).unwrap();
            let j = hr.take().unwrap().recv_timeout(LIMIT).unwrap();
            let r = futures::executor::block_on(j);
            let _ = out.take().unwrap().send(format!("{r:?}"));
        });
        p0.fetch_add(1, SeqCst);
        std::future::pending::<()>().await;
    })
    .unwrap();
    // Shard 1: spawns T (stealing off: T stays on shard 1), and a parked task whose guard tells
    // when shard 1's shutdown ran it.
    let (p, d) = (parked.clone(), t_dropped.clone());
    ex.spawn_on(1, move || async move {
        let p2 = p.clone();
        let t = xtc_shards::spawn(async move {
            let _c = CountDrop(d);
            p2.fetch_add(1, SeqCst);
            let _ = wake_rx.await;
            std::future::pending::<()>().await;
            7u32
        });
        handle_tx.send(t).unwrap();
        let _g = OnDrop(move || {
            let _ = s1_gone_tx.send(());
        });
        p.fetch_add(1, SeqCst);
        std::future::pending::<()>().await;
    })
    .unwrap();
    let driver = std::thread::spawn(move || {
        block_until(|| parked.load(SeqCst) == 3);
        h.stop();
        s1_gone_rx.recv_timeout(LIMIT).unwrap();
        // Shard 1's shutdown is past its drops: let it finish and give its ends back.
        std::thread::sleep(Duration::from_millis(200));
        // T's wake off any loop: into the injector of its last loop, shard 1.
        let _ = wake_tx.send(());
        woken_tx.send(()).unwrap();
    });
    let r = run_detached(ex.clone(), LIMIT);
    driver.join().unwrap();
    assert!(
        r.is_some(),
        "run() hung: shard 0's shutdown Drop waits for good on a migratable task queued in a \
         stopped loop's injector"
    );
    let got = out_rx.recv_timeout(LIMIT).unwrap();
    assert!(got.contains("ancelled"), "the awaited task: {got}");
    assert_eq!(t_dropped.load(SeqCst), 1, "T's future dropped once");
}

/// The invariant the fix keeps: T parked on shard 1 while shard 1 still runs (a long poll of
/// another task there, begun before the stop), which then wakes T and runs it in the same
/// turn. Shard 0's shutdown Drop, blocked on T's handle meanwhile, must get T's output, not a
/// cancellation: shard 1 had not begun its shutdown, so T was left to it.
#[test]
fn shutdown_drop_leaves_a_migratable_task_to_a_loop_that_still_runs_it() {
    let ex = executor(2, false);
    let h = ex.handle();
    let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<u32>>();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let parked = Arc::new(AtomicUsize::new(0));
    let in_drop = Arc::new(AtomicBool::new(false));
    let long_poll = Arc::new(AtomicBool::new(false));
    spawn_waiter(&ex, handle_rx, out_tx, in_drop.clone(), parked.clone());
    let (p, lp) = (parked.clone(), long_poll.clone());
    ex.spawn_on(1, move || async move {
        let (wake_tx, wake_rx) = futures::channel::oneshot::channel::<()>();
        let p2 = p.clone();
        let t = xtc_shards::spawn(async move {
            p2.fetch_add(1, SeqCst);
            let _ = wake_rx.await;
            42u32
        });
        handle_tx.send(t).unwrap();
        // Let T park first.
        xtc_shards::time::sleep(Duration::from_millis(50)).await;
        p.fetch_add(1, SeqCst);
        // The long poll: holds shard 1 (its turn) until shard 0's Drop waits, and a while.
        lp.store(true, SeqCst);
        block_until(|| in_drop.load(SeqCst));
        std::thread::sleep(Duration::from_millis(100));
        // Woken here, T is queued on shard 1's deque and runs in this turn.
        let _ = wake_tx.send(());
        std::future::pending::<()>().await;
    })
    .unwrap();
    let driver = std::thread::spawn(move || {
        block_until(|| long_poll.load(SeqCst));
        h.stop();
    });
    let r = run_detached(ex.clone(), LIMIT);
    driver.join().unwrap();
    assert!(r.is_some(), "run() hung");
    let got = out_rx.recv_timeout(LIMIT).unwrap();
    assert_eq!(
        got, "Ok(42)",
        "the awaited task, left to shard 1 which ran it"
    );
}

/// A migratable task spawned by the Drop itself (queued on the stopping loop's own deque,
/// where no loop will run it: lib.rs "a migratable spawn ... in a `Drop` that this loop's
/// shutdown runs") and awaited there: cancelled once every loop's shutdown has begun.
#[test]
fn shutdown_drop_waiting_on_its_own_migratable_spawn_ends_cancelled() {
    for stealing in [false, true] {
        let ex = executor(2, stealing);
        let h = ex.handle();
        let (out_tx, out_rx) = mpsc::channel::<String>();
        let parked = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        let (p, r2) = (parked.clone(), ran.clone());
        ex.spawn_on(0, move || async move {
            let mut out = Some(out_tx);
            let mut r = Some(r2);
            let _g = OnDrop(move || {
                let r = r.take().unwrap();
                let j = xtc_shards::spawn(async move {
                    r.fetch_add(1, SeqCst);
                    5u32
                });
                let got = futures::executor::block_on(j);
                let _ = out.take().unwrap().send(format!("{got:?}"));
            });
            p.fetch_add(1, SeqCst);
            std::future::pending::<()>().await;
        })
        .unwrap();
        let driver = std::thread::spawn(move || {
            block_until(|| parked.load(SeqCst) == 1);
            h.stop();
        });
        let r = run_detached(ex.clone(), LIMIT);
        driver.join().unwrap();
        assert!(
            r.is_some(),
            "stealing={stealing}: run() hung: a shutdown Drop waits on its own migratable spawn"
        );
        let got = out_rx.recv_timeout(LIMIT).unwrap();
        // With stealing on, shard 1 may steal and run it in a last turn before it sees the
        // stop: then its output, and it ran once.
        let ok = (got.contains("ancelled") && ran.load(SeqCst) == 0)
            || (stealing && got == "Ok(5)" && ran.load(SeqCst) == 1);
        assert!(ok, "stealing={stealing}: {got}, ran {}", ran.load(SeqCst));
    }
}

/// A `LocalExecutor` (one loop): its shutdown drops the main future's leftover task, whose
/// guard blocks on the handle of a migratable task parked on that same loop.
#[test]
fn local_executor_shutdown_drop_waiting_on_a_parked_migratable_task() {
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        ex.block_on(async move {
            let t = xtc_shards::spawn(async {
                std::future::pending::<()>().await;
                1u32
            });
            let mut t = Some(t);
            let mut out = Some(out_tx);
            drop(xtc_shards::spawn_local(async move {
                let _g = OnDrop(move || {
                    let got = futures::executor::block_on(t.take().unwrap());
                    let _ = out.take().unwrap().send(format!("{got:?}"));
                });
                std::future::pending::<()>().await;
            }));
            // Let both park.
            xtc_shards::time::sleep(Duration::from_millis(20)).await;
        });
        let _ = done_tx.send(());
    });
    assert!(
        done_rx.recv_timeout(LIMIT).is_ok(),
        "LocalExecutor::block_on hung: its shutdown Drop waits on a parked migratable task"
    );
    let got = out_rx.recv_timeout(LIMIT).unwrap();
    assert!(got.contains("ancelled"), "{got}");
}
