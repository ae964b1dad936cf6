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
        mpsc, Arc, Mutex,
    },
    task::Waker,
    time::{Duration, Instant},
};

use xtc_shards::{Executor, JoinHandle};

const LIMIT: Duration = Duration::from_secs(20);

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
/// handle it is handed (`abort`: after aborting it) and reports the outcome.
fn spawn_waiter(
    ex: &Executor,
    handle_rx: mpsc::Receiver<JoinHandle<u32>>,
    out_tx: mpsc::Sender<String>,
    in_drop: Arc<AtomicBool>,
    parked: Arc<AtomicUsize>,
    abort: bool,
) {
    ex.spawn_on(0, move || async move {
        let mut out = Some(out_tx);
        let mut hr = Some(handle_rx);
        let _g = OnDrop(move || {
            let j = hr.take().unwrap().recv_timeout(LIMIT).unwrap();
            in_drop.store(true, SeqCst);
            if abort {
                j.abort();
            }
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
            parked_task_waited_in_a_shutdown_drop(from, stealing, false);
        }
    }
}

/// Shard `from` spawns T, a migratable task that parks for good (its future counts its
/// drop); shard 0's shutdown Drop blocks on T's handle (`abort`: after aborting T). The wait
/// ends, T cancelled and its future dropped once.
fn parked_task_waited_in_a_shutdown_drop(from: usize, stealing: bool, abort: bool) {
    let what = format!("from={from} stealing={stealing} abort={abort}");
    let ex = executor(2, stealing);
    let h = ex.handle();
    let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<u32>>();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let parked = Arc::new(AtomicUsize::new(0));
    let t_dropped = Arc::new(AtomicUsize::new(0));
    let in_drop = Arc::new(AtomicBool::new(false));
    spawn_waiter(&ex, handle_rx, out_tx, in_drop, parked.clone(), abort);
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
        "{what}: run() hung: shard 0's shutdown Drop waits for good on a parked migratable task \
         (T dropped {} times)",
        t_dropped.load(SeqCst)
    );
    assert!(r.unwrap().is_ok());
    let got = out_rx.recv_timeout(LIMIT).unwrap();
    assert!(
        got.contains("Cancelled") || got.contains("cancelled"),
        "{what}: the awaited task: {got}"
    );
    assert_eq!(t_dropped.load(SeqCst), 1, "{what}: T's future dropped once");
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
    left_to_a_running_loop(&executor(2, false), "one run");
}

/// One run of [`shutdown_drop_leaves_a_migratable_task_to_a_loop_that_still_runs_it`] on
/// `ex`.
fn left_to_a_running_loop(ex: &Arc<Executor>, what: &str) {
    let h = ex.handle();
    let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<u32>>();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let parked = Arc::new(AtomicUsize::new(0));
    let in_drop = Arc::new(AtomicBool::new(false));
    let long_poll = Arc::new(AtomicBool::new(false));
    spawn_waiter(
        ex,
        handle_rx,
        out_tx,
        in_drop.clone(),
        parked.clone(),
        false,
    );
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
    assert!(r.is_some(), "{what}: run() hung");
    let got = out_rx.recv_timeout(LIMIT).unwrap();
    assert_eq!(
        got, "Ok(42)",
        "{what}: the awaited task, left to shard 1 which ran it"
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

/// Run 2 on the same executor: a pinned and a migratable task; it ends (quiescent) with its
/// task run (a count left off by the first run would keep it going until the hang limit).
fn second_run_is_quiescent(ex: &Arc<Executor>, what: &str) {
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    ex.spawn_on(1, move || async move {
        let j = xtc_shards::spawn(async { 3u32 });
        assert_eq!(j.await.unwrap(), 3);
        d.fetch_add(1, SeqCst);
    })
    .unwrap();
    let t = Instant::now();
    let r = run_detached(ex.clone(), LIMIT).unwrap_or_else(|| panic!("{what}: run 2 hung"));
    assert!(r.is_ok(), "{what}: run 2: {r:?}");
    assert_eq!(done.load(SeqCst), 1, "{what}: run 2's task");
    assert!(
        cfg!(miri) || t.elapsed() < LIMIT / 2,
        "{what}: run 2 took {:?} (counts off?)",
        t.elapsed()
    );
}

/// `JoinHandle::abort()` then a blocking wait on the handle, in a Drop that shard 0's
/// shutdown runs (the usual "abort and wait for its cleanup" guard), on a PARKED migratable
/// task. It hung: the aborted handle's wait passed no task to the shutdown wait (the audit of this
/// stop's commits).
#[test]
fn abort_then_wait_in_a_shutdown_drop_on_a_parked_migratable_task() {
    for from in [1usize, 0] {
        parked_task_waited_in_a_shutdown_drop(from, false, true);
    }
}

/// Plain threads wake the awaited task T over and over while the executor stops (its
/// `Runnable` in flight between injectors, deques and drops): T's future is dropped exactly
/// once, run() returns, and a second run ends quiescent.
#[test]
fn plain_thread_wakes_race_the_wait_in_a_shutdown_drop() {
    for round in 0..30 {
        let stealing = round % 2 == 0;
        let ex = executor(3, stealing);
        let h = ex.handle();
        let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<u32>>();
        let (out_tx, out_rx) = mpsc::channel::<String>();
        let parked = Arc::new(AtomicUsize::new(0));
        let t_dropped = Arc::new(AtomicUsize::new(0));
        let waker: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
        let p0 = parked.clone();
        ex.spawn_on(0, move || async move {
            let mut out = Some(out_tx);
            let mut hr = Some(handle_rx);
            let _g = OnDrop(move || {
                let j = hr.take().unwrap().recv_timeout(LIMIT).unwrap();
                let r = futures::executor::block_on(j);
                let _ = out.take().unwrap().send(format!("{r:?}"));
            });
            p0.fetch_add(1, SeqCst);
            std::future::pending::<()>().await;
        })
        .unwrap();
        let (p, d, w) = (parked.clone(), t_dropped.clone(), waker.clone());
        ex.spawn_on(2, move || async move {
            let p2 = p.clone();
            let t = xtc_shards::spawn(async move {
                let _c = CountDrop(d);
                p2.fetch_add(1, SeqCst);
                std::future::poll_fn(|cx| {
                    *w.lock().unwrap() = Some(cx.waker().clone());
                    std::task::Poll::<()>::Pending
                })
                .await;
                7u32
            });
            handle_tx.send(t).unwrap();
        })
        .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let wakers: Vec<_> = (0..2)
            .map(|_| {
                let (w, d, stop) = (waker.clone(), t_dropped.clone(), stop.clone());
                std::thread::spawn(move || {
                    let t = Instant::now();
                    while d.load(SeqCst) == 0 && !stop.load(SeqCst) && t.elapsed() < LIMIT {
                        let w = w.lock().unwrap().clone();
                        if let Some(w) = w {
                            w.wake();
                        }
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let driver = std::thread::spawn(move || {
            block_until(|| parked.load(SeqCst) >= 2);
            std::thread::sleep(Duration::from_millis(round % 5));
            h.stop();
        });
        let r = run_detached(ex.clone(), LIMIT);
        stop.store(true, SeqCst);
        driver.join().unwrap();
        for w in wakers {
            w.join().unwrap();
        }
        assert!(r.is_some(), "round {round}: run() hung");
        assert!(r.unwrap().is_ok());
        let got = out_rx.recv_timeout(LIMIT).unwrap();
        assert!(got.contains("ancelled"), "round {round}: {got}");
        assert_eq!(t_dropped.load(SeqCst), 1, "round {round}: T dropped once");
        *waker.lock().unwrap() = None;
        second_run_is_quiescent(&ex, &format!("round {round}"));
    }
}

/// While shard 0's Drop polls every millisecond (T sits on shard 1's deque, shard 1 busy in
/// a Drop of its own for a while), the wait scans every injector (steal, push back) as plain
/// threads spawn into them: no task is lost or run twice; every future is dropped exactly
/// once by the time the executor is gone; a second run ends quiescent.
#[test]
fn injector_scans_race_plain_thread_spawns() {
    for round in 0..6 {
        let ex = executor(3, false);
        let h = ex.handle();
        let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<u32>>();
        let (out_tx, out_rx) = mpsc::channel::<String>();
        let parked = Arc::new(AtomicUsize::new(0));
        let t_dropped = Arc::new(AtomicUsize::new(0));
        let p0 = parked.clone();
        ex.spawn_on(0, move || async move {
            let mut out = Some(out_tx);
            let mut hr = Some(handle_rx);
            let _g = OnDrop(move || {
                let j = hr.take().unwrap().recv_timeout(LIMIT).unwrap();
                let r = futures::executor::block_on(j);
                let _ = out.take().unwrap().send(format!("{r:?}"));
            });
            p0.fetch_add(1, SeqCst);
            std::future::pending::<()>().await;
        })
        .unwrap();
        // Shard 1: T awaits a oneshot whose sender a parked task of shard 1 holds; that task's
        // guard (shard 1's shutdown) drops the sender (T woken onto shard 1's deque), then
        // holds shard 1 for 300 ms.
        let (p, d) = (parked.clone(), t_dropped.clone());
        ex.spawn_on(1, move || async move {
            let (tx, rx) = futures::channel::oneshot::channel::<()>();
            let p2 = p.clone();
            let t = xtc_shards::spawn(async move {
                let _c = CountDrop(d);
                p2.fetch_add(1, SeqCst);
                let _ = rx.await;
                std::future::pending::<()>().await;
                7u32
            });
            handle_tx.send(t).unwrap();
            let mut tx = Some(tx);
            let _g = OnDrop(move || {
                drop(tx.take());
                std::thread::sleep(Duration::from_millis(300));
            });
            p.fetch_add(1, SeqCst);
            std::future::pending::<()>().await;
        })
        .unwrap();
        let spawned = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let stop_spawning = Arc::new(AtomicBool::new(false));
        let spawners: Vec<_> = (0..2)
            .map(|_| {
                let (h, s, r, d, stop) = (
                    ex.handle(),
                    spawned.clone(),
                    ran.clone(),
                    dropped.clone(),
                    stop_spawning.clone(),
                );
                std::thread::spawn(move || {
                    while !stop.load(SeqCst) {
                        let (r, d) = (r.clone(), d.clone());
                        s.fetch_add(1, SeqCst);
                        let c = CountDrop(d);
                        drop(h.spawn(async move {
                            let _c = c;
                            r.fetch_add(1, SeqCst);
                        }));
                        std::thread::sleep(Duration::from_micros(50));
                    }
                })
            })
            .collect();
        let driver = std::thread::spawn(move || {
            block_until(|| parked.load(SeqCst) == 3);
            h.stop();
        });
        let r = run_detached(ex.clone(), LIMIT);
        driver.join().unwrap();
        stop_spawning.store(true, SeqCst);
        for s in spawners {
            s.join().unwrap();
        }
        assert!(r.is_some(), "round {round}: run() hung");
        assert!(r.unwrap().is_ok());
        let got = out_rx.recv_timeout(LIMIT).unwrap();
        assert!(got.contains("ancelled"), "round {round}: {got}");
        assert_eq!(t_dropped.load(SeqCst), 1, "round {round}: T dropped once");
        let after1 = (spawned.load(SeqCst), ran.load(SeqCst), dropped.load(SeqCst));
        second_run_is_quiescent(&ex, &format!("round {round}"));
        let after2 = (spawned.load(SeqCst), ran.load(SeqCst), dropped.load(SeqCst));
        println!(
            "round {round}: (spawned, ran, dropped) after run 1 {after1:?}, after run 2 {after2:?}"
        );
        let (s, rn) = (spawned.load(SeqCst), ran.load(SeqCst));
        block_until(|| Arc::strong_count(&ex) == 1);
        drop(ex);
        let dr = dropped.load(SeqCst);
        println!("round {round}: spawned {s} ran {rn} dropped {dr}");
        assert!(rn <= s, "round {round}: ran {rn} > spawned {s}");
        assert_eq!(dr, s, "round {round}: futures dropped {dr} != spawned {s}");
    }
}

/// The stamp is per run: the "left to a loop that still runs it" case, twice on one
/// executor (run 2 must not read run 1's stamps as stopping).
#[test]
fn left_to_a_running_loop_in_a_second_run_too() {
    let ex = executor(2, false);
    for run in ["run 1", "run 2"] {
        left_to_a_running_loop(&ex, run);
    }
}
