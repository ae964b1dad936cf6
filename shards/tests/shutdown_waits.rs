//! Waits in the `Drop`s that a loop's shutdown runs, on the join handles of calls that another
//! loop may keep for its next run (ring rule 3c, `ring::drop_awaited_kept`); timers dropped
//! across loops at a stop; and the next run after such a stop ending quiescent.
mod common;
use common::*;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use std::future::Future;
use xtc_shards::{shard, time, Error, Executor, JoinHandle};

const LIMIT: Duration = Duration::from_secs(20);

/// A value carried without being awaited.
struct Held<T>(#[allow(dead_code)] T);

/// A thread-local slot whose value runs its closure when the thread exits.
type Slot = std::cell::RefCell<Option<OnDrop<Box<dyn FnMut()>>>>;

/// A plain thread spawns U on shard 1 while shard 1's shutdown is under way (after the count
/// its shutdown drains up to), and hands U's join handle to a Drop that shard 0's shutdown
/// runs. The Drop polls while shard 1 still holds its ring ends (so `drop_awaited_kept` does
/// nothing), then shard 1 finishes its shutdown without draining U: U is kept in shard 1's
/// inbox for the next run, and nothing wakes the Drop's wait again. lib.rs says the wait ends
/// "once its loop drops it, or, for a loop that has already stopped, at once".
#[test]
fn shutdown_drop_waiting_on_a_spawn_kept_for_the_next_run_after_its_poll() {
    let ex = Arc::new(exec_with_grace(2, Duration::from_millis(100)));
    let h = ex.handle();
    let (s1_in_drop_tx, s1_in_drop_rx) = mpsc::channel::<()>();
    let (go1_tx, go1_rx) = mpsc::channel::<()>();
    let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<u32>>();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let parked = Arc::new(AtomicUsize::new(0));
    // Shard 1: a parked task whose Drop holds shard 1 in its shutdown until told.
    let p1 = parked.clone();
    ex.spawn_on(1, move || async move {
        let _g = OnDrop(move || {
            let _ = s1_in_drop_tx.send(());
            let _ = go1_rx.recv_timeout(LIMIT);
        });
        p1.fetch_add(1, SeqCst);
        std::future::pending::<()>().await;
    })
    .unwrap();
    // Shard 0: a parked task whose Drop blocks on the handle it is given.
    let p0 = parked.clone();
    ex.spawn_on(0, move || async move {
        let mut out = Some(out_tx);
        let mut hr = Some(handle_rx);
        let _g = OnDrop(move || {
            let j = hr.take().unwrap().recv_timeout(LIMIT).unwrap();
            let r = futures::executor::block_on(j);
            let _ = out
                .take()
                .unwrap()
                .send(format!("{:?}", r.map_err(|e| e.is_cancelled())));
        });
        p0.fetch_add(1, SeqCst);
        std::future::pending::<()>().await;
    })
    .unwrap();
    // The plain thread.
    let driver = std::thread::spawn(move || {
        block_until(|| parked.load(SeqCst) == 2);
        h.stop();
        s1_in_drop_rx.recv_timeout(LIMIT).unwrap();
        // Shard 1's shutdown is under way: pushed after its `inbox_before`.
        let u = h.spawn_on(1, || async { 7u32 }).unwrap();
        handle_tx.send(u).unwrap();
        // Shard 0's Drop polls meanwhile (shard 1 holds its ends).
        std::thread::sleep(Duration::from_millis(300));
        go1_tx.send(()).unwrap();
    });
    let r = run_detached(ex.clone(), LIMIT);
    driver.join().unwrap();
    assert!(
        r.is_some(),
        "run() hung: shard 0's shutdown Drop waits for good on a spawn kept for shard 1's next run"
    );
    let got = out_rx.recv_timeout(LIMIT).unwrap();
    assert_eq!(got, "Err(true)", "the awaited spawn: not cancelled");
}

/// Three shards, no plain thread: shard 2's task (in a long poll while the run stops) spawns
/// U on shard 1 after shard 1 stopped and hands its handle to shard 0's Drop, which polls
/// before shard 2's shutdown evacuates U into shard 1's inbox (kept: sent before that
/// shutdown). Nothing wakes shard 0's wait again.
#[test]
fn shutdown_drop_waiting_on_a_call_a_third_loop_hands_to_a_stopped_loop() {
    thread_local! {
        static GONE: Slot =
            const { std::cell::RefCell::new(None) };
    }
    let ex = Arc::new(
        Executor::builder()
            .shards(3)
            .oversubscribe(true)
            .deadlock_grace(Some(Duration::from_millis(100)))
            .build()
            .unwrap(),
    );
    let h = ex.handle();
    let gone = Arc::new(AtomicBool::new(false));
    let g = gone.clone();
    ex.spawn_on(1, move || async move {
        GONE.with(|s| *s.borrow_mut() = Some(OnDrop(Box::new(move || g.store(true, SeqCst)))));
    })
    .unwrap();
    let (handle_tx, handle_rx) = mpsc::channel::<JoinHandle<u32>>();
    let (polled_tx, polled_rx) = mpsc::channel::<()>();
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let in_drop = Arc::new(AtomicBool::new(false));
    let d0 = in_drop.clone();
    ex.spawn_on(0, move || async move {
        let mut out = Some(out_tx);
        let mut hr = Some(handle_rx);
        let mut polled = Some(polled_tx);
        let _g = OnDrop(move || {
            d0.store(true, SeqCst);
            let j = hr.take().unwrap().recv_timeout(LIMIT).unwrap();
            let mut j = Box::pin(j);
            let mut tx = polled.take();
            // Blocks on the handle; tells shard 2 once the first poll returned Pending.
            let r = futures::executor::block_on(futures::future::poll_fn(|cx| {
                let p = j.as_mut().poll(cx);
                if p.is_pending() {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
                p
            }));
            let _ = out
                .take()
                .unwrap()
                .send(format!("{:?}", r.map_err(|e| e.is_cancelled())));
        });
        std::future::pending::<()>().await;
    })
    .unwrap();
    let h2 = h.clone();
    let g2 = gone.clone();
    ex.spawn_on(2, move || async move {
        // Let shard 0's task park first.
        time::sleep(Duration::from_millis(20)).await;
        h2.stop();
        // A long poll: shard 1 stops meanwhile, shard 0 enters its Drop.
        block_until(|| g2.load(SeqCst) && in_drop.load(SeqCst));
        let u = h2.spawn_on(1, || async { 7u32 }).unwrap(); // into ring 2->1
        handle_tx.send(u).unwrap();
        let _ = polled_rx.recv_timeout(LIMIT);
        // Then this loop's shutdown evacuates ring 2->1 (U sent before it: kept).
    })
    .unwrap();
    let r = run_detached(ex.clone(), LIMIT);
    assert!(
        r.is_some(),
        "run() hung: shard 0's shutdown Drop waits for good on a call shard 2 hands to stopped shard 1"
    );
    let got = out_rx.recv_timeout(LIMIT).unwrap();
    assert_eq!(got, "Err(true)", "the awaited call: not cancelled");
}

/// A sleep registered on shard 1, held by a parked task of shard 0 and dropped in shard 0's
/// shutdown (its cancel would cross loops while the executor stops). Then a second run must
/// end quiescent at once (no timer entry of the first run keeps shard 1 waiting).
#[test]
fn a_sleep_of_shard_1_dropped_in_shard_0s_shutdown_leaves_nothing_for_the_next_run() {
    for stop_by in ["stop"] {
        let ex = Arc::new(exec_with_grace(2, Duration::from_millis(100)));
        let h = ex.handle();
        let dropped = Arc::new(AtomicBool::new(false));
        let d = dropped.clone();
        let h2 = h.clone();
        ex.spawn_on(0, move || async move {
            // The sleep, polled once on shard 1 (its timer registered there), comes back in a
            // wrapper: held here, never awaited.
            let s = shard::submit_to(1, || async {
                let mut s = Box::pin(time::sleep(Duration::from_secs(3600)));
                assert!(futures::poll!(&mut s).is_pending());
                Held(s)
            })
            .await
            .unwrap();
            let _g = OnDrop(move || d.store(true, SeqCst));
            // Held here, pending forever (the sleep itself is not awaited here).
            let _s = s;
            if stop_by == "stop" {
                h2.stop();
            }
            std::future::pending::<()>().await;
        })
        .unwrap();
        let t = Instant::now();
        let r = run_detached(ex.clone(), LIMIT).expect("run 1 hung");
        assert!(dropped.load(SeqCst), "{stop_by}: not dropped");
        if stop_by == "stop" {
            assert!(r.is_ok(), "{r:?}");
        } else {
            assert!(matches!(r, Err(Error::Deadlock { .. })), "{r:?}");
        }
        let s1 = ex.loop_stats(1).unwrap();
        // Run 2: a timer on each shard, then quiescent.
        for i in 0..2 {
            ex.spawn_on(i, || time::sleep(Duration::from_millis(5)))
                .unwrap();
        }
        let t2 = Instant::now();
        let r2 = run_detached(ex.clone(), LIMIT).expect("run 2 hung");
        assert!(r2.is_ok(), "{stop_by}: run 2: {r2:?}");
        assert!(
            t2.elapsed() < LIMIT / 2,
            "{stop_by}: run 2 took {:?}",
            t2.elapsed()
        );
        let _ = (t, s1);
    }
}

/// The same with the sleep's task on shard 1 moved: a migratable task registers a sleep on
/// one loop, and a shutdown drops it on another (its home's cancel would cross loops).
#[test]
fn a_migratable_sleep_dropped_at_a_stop_then_a_quiescent_run() {
    for round in 0..5 {
        let ex = Arc::new(exec_with_grace(2, Duration::from_millis(100)));
        let h = ex.handle();
        let started = Arc::new(AtomicUsize::new(0));
        for _ in 0..4 {
            let st = started.clone();
            h.spawn(async move {
                st.fetch_add(1, SeqCst);
                time::sleep(Duration::from_secs(3600)).await;
            });
        }
        let st = started.clone();
        let h2 = h.clone();
        ex.spawn_on(0, move || async move {
            while st.load(SeqCst) < 4 {
                time::sleep(Duration::from_millis(1)).await;
            }
            h2.stop();
        })
        .unwrap();
        let r = run_detached(ex.clone(), LIMIT).expect("run 1 hung");
        assert!(r.is_ok(), "{round}: {r:?}");
        ex.spawn_on(1, || time::sleep(Duration::from_millis(5)))
            .unwrap();
        let t2 = Instant::now();
        let r2 = run_detached(ex.clone(), LIMIT).expect("run 2 hung");
        assert!(r2.is_ok(), "{round}: run 2: {r2:?}");
        assert!(
            t2.elapsed() < LIMIT / 2,
            "{round}: run 2 took {:?}",
            t2.elapsed()
        );
    }
}

/// A migratable spawn (`Handle::spawn`, `xtc::spawn`) from a Drop that a loop's shutdown runs:
/// not refused (spawn_on is). Where does it go: dropped, or run in the next, unrelated run?
#[test]
fn a_migratable_spawn_from_a_shutdown_drop() {
    for via_handle in [true, false] {
        let ex = Arc::new(exec_with_grace(2, Duration::from_millis(100)));
        let h = ex.handle();
        let ran = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (r2, d2, h2) = (ran.clone(), dropped.clone(), h.clone());
        ex.spawn_on(0, move || async move {
            let mut hh = Some(h2.clone());
            let _g = OnDrop(move || {
                for _ in 0..4 {
                    let r = r2.clone();
                    let d = OnDrop({
                        let d2 = d2.clone();
                        move || {
                            d2.fetch_add(1, SeqCst);
                        }
                    });
                    let fut = async move {
                        let _d = d;
                        r.fetch_add(1, SeqCst);
                    };
                    if via_handle {
                        drop(hh.as_ref().unwrap().spawn(fut));
                    } else {
                        drop(xtc_shards::spawn(fut));
                    }
                }
                hh.take();
            });
            h2.stop();
            std::future::pending::<()>().await;
        })
        .unwrap();
        let r = run_detached(ex.clone(), LIMIT).expect("run 1 hung");
        assert!(r.is_ok(), "{r:?}");
        let after1 = (ran.load(SeqCst), dropped.load(SeqCst));
        ex.spawn_on(1, || async {}).unwrap();
        let r = run_detached(ex.clone(), LIMIT).expect("run 2 hung");
        assert!(r.is_ok(), "{r:?}");
        let after2 = (ran.load(SeqCst), dropped.load(SeqCst));
        println!("via_handle={via_handle}: after run 1 (ran, dropped) = {after1:?}, after run 2 = {after2:?}");
        assert_eq!(after2.0, 0, "via_handle={via_handle}: a shutdown drop's migratable spawn ran in the next run: {after1:?} {after2:?}");
    }
}

thread_local! {
    static GONE1: Slot =
        const { std::cell::RefCell::new(None) };
}

/// foreign.rs's scenario (a shutdown Drop's wait takes the awaited call out of stopped shard
/// 1's inbox, `Inbox::take_where`), then a second run: it must end quiescent at once (the
/// inbox's pushed/popped and the rings' sent/received/handed_over balance).
#[test]
fn after_take_where_the_next_run_is_quiescent() {
    for round in 0..10 {
        let ex = Arc::new(exec_with_grace(2, Duration::from_millis(100)));
        let h = ex.handle();
        let gone = Arc::new(AtomicBool::new(false));
        let g = gone.clone();
        let gone2 = gone.clone();
        let set = Arc::new(AtomicBool::new(false));
        let set2 = set.clone();
        ex.spawn_on(1, move || async move {
            GONE1.with(|s| *s.borrow_mut() = Some(OnDrop(Box::new(move || g.store(true, SeqCst)))));
            set2.store(true, SeqCst);
        })
        .unwrap();
        let (tx, rx) = mpsc::channel();
        let h2 = h.clone();
        ex.spawn_on(0, move || async move {
            while !set.load(SeqCst) {
                time::sleep(Duration::from_millis(1)).await;
            }
            h2.stop();
            block_until(|| gone.load(SeqCst));
            let call = h2.spawn_on(1, || async { 7 }).unwrap();
            let mut call = Some(call);
            let _g = OnDrop(move || {
                eprintln!("drop start on {:?}", std::thread::current().name());
                let r = futures::executor::block_on(call.take().unwrap());
                eprintln!("drop end");
                let _ = tx.send(r.is_err_and(|e| e.is_cancelled()));
            });
            std::future::pending::<()>().await;
        })
        .unwrap();
        let r = run_detached(ex.clone(), Duration::from_secs(5));
        if r.is_none() {
            panic!(
                "run 1 hung; drop result: {:?}; gone {}",
                rx.try_recv(),
                gone2.load(SeqCst)
            );
        }
        let r = r.unwrap();
        assert!(r.is_ok(), "{r:?}");
        assert!(rx.recv_timeout(LIMIT).unwrap(), "not cancelled");
        let s1 = ex.loop_stats(1).unwrap();
        let s0 = ex.loop_stats(0).unwrap();
        // Run 2: cross traffic, then it must end quiescent quickly.
        let h3 = h.clone();
        ex.spawn_on(0, move || async move {
            for _ in 0..10 {
                shard::submit_to(1, || async { 1 }).await.unwrap();
            }
            drop(h3);
        })
        .unwrap();
        h.spawn_on(1, || async {}).unwrap();
        let t = Instant::now();
        let r2 = run_detached(ex.clone(), LIMIT).expect("run 2 hung");
        assert!(r2.is_ok(), "round {round}: run 2: {r2:?}");
        // A run whose counts did not balance ends only by the hang limit; an interpreter
        // (Miri) takes seconds over what takes microseconds here, so it checks the rest only.
        assert!(
            cfg!(miri) || t.elapsed() < LIMIT / 2,
            "run 2 took {:?}",
            t.elapsed()
        );
        let t1 = ex.loop_stats(1).unwrap();
        println!(
            "round {round}: run1 s0 sent {} s1 recv {} inbox1 {} | run2 s1 inbox {} recv {}",
            s0.messages_sent,
            s1.messages_received,
            s1.inbox_received,
            t1.inbox_received,
            t1.messages_received
        );
    }
}
