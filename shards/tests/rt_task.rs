//! JoinHandle: panics, abort, detach; wakes from plain threads; task names.

mod common;
use common::*;

use std::{
    cell::RefCell,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    task::Waker,
    time::Duration,
};

use xtc_shards::{spawn_local, task, Error, Executor, LocalExecutor};

#[test]
fn panic_is_contained_and_the_loop_goes_on() {
    let out = LocalExecutor::new().unwrap().block_on(async {
        let bad = spawn_local(async {
            panic!("boom in a task");
        });
        let good = spawn_local(async { 5 });
        let e = bad.await.unwrap_err();
        assert!(e.is_panic());
        assert_eq!(e.panic_message(), Some("boom in a task"));
        good.await.unwrap()
    });
    assert_eq!(out, 5);
}

#[test]
fn panic_in_spawn_on_closure_is_contained() {
    let ex = exec(2);
    let h = ex
        .spawn_on(1, || -> std::future::Ready<u32> { panic!("in make") })
        .unwrap();
    let ok = ex.spawn_on(1, || async { 1u32 }).unwrap();
    ex.run().unwrap();
    let e = futures::executor::block_on(h).unwrap_err();
    assert!(e.is_panic());
    assert_eq!(futures::executor::block_on(ok).unwrap(), 1);
}

#[test]
fn abort_drops_the_future_at_its_next_suspension() {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let d = dropped.clone();
    LocalExecutor::new().unwrap().block_on(async move {
        let h = spawn_local(async move {
            let _f = Flag(d);
            std::future::pending::<()>().await;
        });
        xtc_shards::yield_now().await; // let it start and park
        h.abort();
        xtc_shards::yield_now().await;
        let e = h.await.unwrap_err();
        assert!(e.is_cancelled());
    });
    assert!(dropped.load(SeqCst));
}

#[test]
fn abort_before_first_poll() {
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    LocalExecutor::new().unwrap().block_on(async move {
        let h = spawn_local(async move { r.store(true, SeqCst) });
        h.abort();
        assert!(h.await.unwrap_err().is_cancelled());
    });
    assert!(!ran.load(SeqCst));
}

#[test]
fn dropping_the_handle_detaches() {
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    LocalExecutor::new().unwrap().block_on(async move {
        let n3 = n2.clone();
        drop(spawn_local(async move {
            xtc_shards::time::sleep(Duration::from_millis(5)).await;
            n3.fetch_add(1, SeqCst);
        }));
        // Until the detached task is done (a fixed 30 ms wait here lost to a descheduling
        // longer than 25 ms between this task's timer and the detached one's); the hang guard
        // bounds it.
        assert!(common::sleep_until(|| n2.load(SeqCst) == 1).await);
    });
    assert_eq!(n.load(SeqCst), 1);
}

/// A handle polled `Pending` and then dropped gives back the waker it was polled with at once:
/// the poller is neither kept alive nor woken until the detached task ends (async-task's
/// detach alone kept the awaiter in the task and woke it at the end).
#[test]
fn a_dropped_handle_gives_back_the_waker_it_was_polled_with() {
    use std::future::Future;

    struct Counted(AtomicUsize);
    impl std::task::Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }
    let counted = Arc::new(Counted(AtomicUsize::new(0)));
    let waker = Waker::from(counted.clone());
    let ran = Arc::new(AtomicBool::new(false));
    let ran2 = ran.clone();
    let ran3 = ran.clone();
    let counted2 = counted.clone();
    LocalExecutor::new().unwrap().block_on(async move {
        let mut h = Box::pin(spawn_local(async move {
            xtc_shards::time::sleep(Duration::from_millis(20)).await;
            ran2.store(true, SeqCst);
        }));
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(h.as_mut().poll(&mut cx).is_pending());
        drop(waker);
        // This future's `counted2` and the test's `counted`.
        let ours = 2;
        assert!(
            Arc::strong_count(&counted2) > ours,
            "the task holds the poller's waker"
        );
        drop(h);
        assert_eq!(
            Arc::strong_count(&counted2),
            ours,
            "the dropped handle gave it back"
        );
        // Until the detached task ends (a fixed 60 ms wait here raced its 20 ms timer).
        common::sleep_until(|| ran3.load(SeqCst)).await;
    });
    assert!(ran.load(SeqCst), "the detached task ran to its end");
    assert_eq!(counted.0.load(SeqCst), 0, "its end woke nobody");
}

/// A pinned task parked on a waker that a plain std::thread fires.
#[test]
fn pinned_task_woken_from_a_plain_thread() {
    let ex = exec(2);
    let slot: Arc<Mutex<(bool, Option<Waker>)>> = Arc::new(Mutex::new((false, None)));
    let s = slot.clone();
    let h = ex
        .spawn_on(1, move || async move {
            std::future::poll_fn(|cx| {
                let mut g = s.lock().unwrap();
                if g.0 {
                    std::task::Poll::Ready(xtc_shards::shard::id())
                } else {
                    g.1 = Some(cx.waker().clone());
                    std::task::Poll::Pending
                }
            })
            .await
        })
        .unwrap();
    let s = slot.clone();
    let handle = ex.handle();
    let waker_thread = std::thread::spawn(move || {
        // Wait until the task parked, then fire its waker from this foreign thread. The waker
        // is stored inside the task's poll: a wake before that poll returned is taken by the
        // task's own loop (it reschedules the running task locally, not through the inbox), so
        // wait for the loop to park too, which it does only once the poll is over. A fixed
        // sleep was not enough under Miri (seed 4 woke it mid-poll).
        loop {
            std::thread::sleep(Duration::from_millis(20));
            if handle.loop_stats(1).unwrap().parks == 0 {
                continue;
            }
            let mut g = s.lock().unwrap();
            if let Some(w) = g.1.take() {
                g.0 = true;
                drop(g);
                w.wake();
                break;
            }
        }
    });
    let dog = Watchdog::new(ex.handle(), HANG, "a task woken from a plain thread");
    ex.run().unwrap();
    dog.done();
    waker_thread.join().unwrap();
    assert_eq!(futures::executor::block_on(h).unwrap(), 1);
    assert!(
        ex.loop_stats(1).unwrap().inbox_received >= 2,
        "spawn + remote wake"
    );
}

#[test]
fn many_concurrent_wakes_collapse_to_one_poll() {
    let ex = exec(2);
    let polls = Arc::new(AtomicUsize::new(0));
    let slot: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
    let (p, s) = (polls.clone(), slot.clone());
    ex.spawn_on(0, move || async move {
        let mut first = true;
        std::future::poll_fn(|cx| {
            p.fetch_add(1, SeqCst);
            if first {
                first = false;
                *s.lock().unwrap() = Some(cx.waker().clone());
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(())
            }
        })
        .await
    })
    .unwrap();
    let s = slot.clone();
    let t = std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(10));
        let w = s.lock().unwrap().take();
        if let Some(w) = w {
            let ts: Vec<_> = (0..8)
                .map(|_| {
                    let w = w.clone();
                    std::thread::spawn(move || w.wake())
                })
                .collect();
            ts.into_iter().for_each(|t| t.join().unwrap());
            break;
        }
    });
    let dog = Watchdog::new(ex.handle(), HANG, "a task woken from 8 threads");
    ex.run().unwrap();
    dog.done();
    t.join().unwrap();
    assert_eq!(polls.load(SeqCst), 2, "8 wakes, one re-poll");
}

#[test]
fn deadlock_report_names_the_stuck_task() {
    let ex = exec_with_grace(2, Duration::from_millis(200));
    ex.spawn_on(1, || async {
        task::Builder::new()
            .name("stuck-forever")
            .spawn_local(std::future::pending::<()>())
            .await
            .ok();
    })
    .unwrap();
    match ex.run() {
        Err(Error::Deadlock { tasks, .. }) => {
            let all = tasks.join("\n");
            assert!(all.contains("stuck-forever"), "{all}");
            assert!(all.contains("rt_task.rs"), "spawn location: {all}");
            assert!(all.contains("shard 1"), "{all}");
            assert_eq!(
                tasks.len(),
                2,
                "the stuck task and its waiting parent: {all}"
            );
        }
        other => panic!("expected a deadlock report, got {other:?}"),
    }
    let msg = format!(
        "{}",
        Error::Deadlock {
            tasks: vec!["x".into()],
            grace: std::time::Duration::from_millis(5),
        }
    );
    assert!(msg.contains("XTC_DEADLOCK_GRACE"));
    assert!(
        msg.contains("grace (5ms)"),
        "names the grace in effect: {msg}"
    );
}

/// A task name is user input: one with a line break or another control character made its
/// deadlock report entry ("one line per parked task") span several lines, so a name could
/// pass for another task's entry; a stall report's text likewise. Reports escape them.
#[test]
fn a_task_name_with_control_characters_stays_on_its_report_line() {
    let ex = exec_with_grace(2, Duration::from_millis(200));
    ex.spawn_on(1, || async {
        let pinned = task::Builder::new()
            .name("two\nlines")
            .spawn_local(std::future::pending::<()>());
        let migratable = task::Builder::new()
            .name("tab\tand\rreturn\u{2028}")
            .spawn(std::future::pending::<()>());
        let _ = futures::join!(pinned, migratable);
    })
    .unwrap();
    match ex.run() {
        Err(Error::Deadlock { tasks, .. }) => {
            let all = tasks.join(" | ");
            assert_eq!(tasks.len(), 3, "{all}");
            assert!(
                tasks.iter().all(|t| !t.chars().any(char::is_control)),
                "a report line holds a control character: {all:?}"
            );
            assert!(all.contains(r"'two\nlines'"), "{all}");
            assert!(all.contains(r"'tab\tand\rreturn\u{2028}'"), "{all}");
        }
        other => panic!("expected a deadlock report, got {other:?}"),
    }
    // A stall report's text.
    let reports = Arc::new(Mutex::new(Vec::new()));
    let r = reports.clone();
    LocalExecutor::new().unwrap().block_on(async move {
        let h = xtc_shards::shard::handle().unwrap();
        h.set_stall_callback(0, move |rep| r.lock().unwrap().push(rep.clone()))
            .unwrap();
        h.set_stall_budget(Duration::from_millis(5));
        task::Builder::new()
            .name("stall\nname")
            .spawn_local(async {
                // The budget is read once per loop turn: a sleep ends this one.
                xtc_shards::time::sleep(Duration::from_millis(1)).await;
                std::thread::sleep(Duration::from_millis(20)); // holds the loop past the budget
            })
            .await
            .unwrap();
    });
    // The named task's reports: the main task's own poll may be reported too, if a
    // descheduling of 5 ms lands in it.
    let reps: Vec<_> = reports
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.task_name.is_some())
        .cloned()
        .collect();
    assert!(!reps.is_empty(), "no stall of the named task reported");
    for rep in &reps {
        assert_eq!(
            rep.task_name.as_deref(),
            Some("stall\nname"),
            "the name as given"
        );
        let text = rep.to_string();
        assert!(!text.contains('\n'), "{text:?}");
        assert!(text.contains(r"'stall\nname'"), "{text}");
    }
}

/// The main task of `block_on` is spawned at the caller's `block_on` call: a deadlock report
/// (and a stall report) names that line, as it names a `spawn_on` call for any other task. It
/// named a line inside xtc (`executor/mod.rs`, `local.rs`), the same for every program.
#[test]
fn the_main_tasks_spawn_site_is_the_block_on_call() {
    let ex = exec_with_grace(1, Duration::from_millis(200));
    let line = line!() + 1;
    let r = ex.block_on(std::future::pending::<()>);
    match r {
        Err(Error::Deadlock { tasks, .. }) => {
            let all = tasks.join("\n");
            assert_eq!(tasks.len(), 1, "{all}");
            assert!(all.contains("'main'"), "{all}");
            assert!(
                all.contains(&format!("rt_task.rs:{line}:")),
                "the spawn site is not the block_on call (line {line}): {all}"
            );
        }
        other => panic!("expected a deadlock report, got {other:?}"),
    }
    // A LocalExecutor's main task, named in a stall report.
    let reports = Arc::new(Mutex::new(Vec::new()));
    let r = reports.clone();
    let line = line!() + 1;
    LocalExecutor::new().unwrap().block_on(async move {
        let h = xtc_shards::shard::handle().unwrap();
        h.set_stall_callback(0, move |rep| r.lock().unwrap().push(rep.clone()))
            .unwrap();
        h.set_stall_budget(Duration::from_millis(5));
        // The budget is read once per loop turn: a sleep ends this one.
        xtc_shards::time::sleep(Duration::from_millis(1)).await;
        std::thread::sleep(Duration::from_millis(20)); // holds the loop past the budget
    });
    let reps = reports.lock().unwrap().clone();
    assert!(!reps.is_empty(), "no stall reported");
    assert!(
        reps.iter()
            .all(|r| r.spawned_at.file().ends_with("rt_task.rs") && r.spawned_at.line() == line),
        "the spawn site is not the block_on call (line {line}): {reps:?}"
    );
}
#[test]
fn no_deadlock_report_within_the_grace_for_a_foreign_waker() {
    // 10 s for a wake 300 ms away: the run ends at the wake, and a loaded machine that delays
    // the waking thread past a shorter grace would fail the test for nothing.
    let ex = Executor::builder()
        .shards(1)
        .deadlock_grace(Some(Duration::from_secs(10)))
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Waker>();
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    ex.spawn_on(0, move || async move {
        let mut sent = false;
        std::future::poll_fn(|cx| {
            if d.load(SeqCst) {
                return std::task::Poll::Ready(());
            }
            if !sent {
                sent = true;
                tx.send(cx.waker().clone()).unwrap();
            }
            std::task::Poll::Pending
        })
        .await
    })
    .unwrap();
    let t = std::thread::spawn(move || {
        let w = rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        done.store(true, SeqCst);
        w.wake();
    });
    let dog = Watchdog::new(ex.handle(), HANG, "a task woken from a plain thread");
    ex.run().unwrap();
    dog.done();
    t.join().unwrap();
}

/// A short grace reports a task that nothing can wake within this test's window; the same
/// grace switched off (in the builder, and at run time) does not: only `stop()` ends those
/// runs. A `None` that were ignored would leave the 50 ms grace in force and report.
#[test]
fn deadlock_report_can_be_disabled() {
    const GRACE: Duration = Duration::from_millis(50);
    let stuck = |ex: &Executor| ex.spawn_on(0, std::future::pending::<()>).unwrap();
    // Control: the grace alone reports the stuck task (it would not in the window below if
    // the report could not come in time).
    let ex = Executor::builder()
        .shards(1)
        .deadlock_grace(Some(GRACE))
        .build()
        .unwrap();
    stuck(&ex);
    let r = run_or_fail(ex, HANG, "a stuck task under a 50 ms grace");
    assert!(matches!(r, Err(Error::Deadlock { .. })), "{r:?}");

    let in_builder = Executor::builder()
        .shards(1)
        .deadlock_grace(Some(GRACE))
        .deadlock_grace(None)
        .build()
        .unwrap();
    let at_run_time = Executor::builder()
        .shards(1)
        .deadlock_grace(Some(GRACE))
        .build()
        .unwrap();
    at_run_time.set_deadlock_grace(None);
    for (how, ex) in [("builder", in_builder), ("set_deadlock_grace", at_run_time)] {
        assert_eq!(ex.deadlock_grace(), None, "{how}");
        stuck(&ex);
        let h = ex.handle();
        // Ten graces and more: a report would come first.
        let stopper = std::thread::spawn(move || {
            std::thread::sleep(GRACE * 10);
            h.stop();
        });
        let r = run_or_fail(ex, HANG, "a run with the deadlock report off");
        assert!(r.is_ok(), "{how}: ended by stop(), not by a report: {r:?}");
        stopper.join().unwrap();
    }
}

#[test]
fn local_executor_drops_parked_migratable_tasks() {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let d = dropped.clone();
    LocalExecutor::new().unwrap().block_on(async move {
        let _h = xtc_shards::spawn(async move {
            let _f = Flag(d);
            std::future::pending::<()>().await;
        });
        xtc_shards::yield_now().await;
    });
    assert!(dropped.load(SeqCst), "the parked migratable task leaked");
}

#[test]
fn deadlock_report_resumes_when_service_mode_is_switched_off() {
    let ex = Executor::builder()
        .shards(1)
        .service_mode(true)
        .deadlock_grace(Some(Duration::from_millis(100)))
        .build()
        .unwrap();
    ex.spawn_on(0, std::future::pending::<()>).unwrap();
    let h = ex.handle();
    let t = std::thread::spawn(move || {
        // In service mode the coordinator waits for a poke alone; switching the mode off must
        // wake it, and the deadlock check must then run on its own timer again.
        std::thread::sleep(Duration::from_millis(300));
        h.set_service_mode(false);
    });
    // A switch that did not wake the coordinator would leave this run waiting for good.
    let dog = Watchdog::new(
        ex.handle(),
        HANG,
        "a run whose service mode was switched off",
    );
    let r = ex.run();
    dog.done();
    match r {
        Err(Error::Deadlock { tasks, .. }) => assert_eq!(tasks.len(), 1, "{tasks:?}"),
        other => panic!("expected a deadlock report once service mode was off, got {other:?}"),
    }
    t.join().unwrap();
}

/// A task's future whose `Drop` panics, dropped when the task is aborted: the panic is logged
/// and the loop goes on, so the run still ends at quiescence (the loop's thread used to die
/// with its status BUSY, and `run()` never returned).
/// A task future's `Drop` panics with a payload whose own drop panics again: the loop logs
/// both and goes on, and the second payload is dropped too. It was forgotten (its allocation
/// leaked, its `Drop` never ran: memcheck's "definitely lost" for each such panic).
#[test]
fn the_payload_of_a_panic_in_a_payloads_drop_is_dropped() {
    static INNER_DROPS: AtomicUsize = AtomicUsize::new(0);
    struct Inner;
    impl Drop for Inner {
        fn drop(&mut self) {
            INNER_DROPS.fetch_add(1, SeqCst);
        }
    }
    struct Outer;
    impl Drop for Outer {
        fn drop(&mut self) {
            std::panic::panic_any(Inner);
        }
    }
    struct PanicsWithOuter;
    impl Drop for PanicsWithOuter {
        fn drop(&mut self) {
            std::panic::panic_any(Outer);
        }
    }
    let out = LocalExecutor::new().unwrap().block_on(async {
        let t = spawn_local(async {
            let _p = PanicsWithOuter;
            std::future::pending::<()>().await;
        });
        xtc_shards::yield_now().await;
        t.abort();
        assert!(t.await.unwrap_err().is_cancelled());
        7
    });
    assert_eq!(out, 7, "the loop went on");
    assert_eq!(
        INNER_DROPS.load(SeqCst),
        1,
        "the payload of the panic in the payload's drop was not dropped"
    );
}

#[test]
fn a_panicking_drop_of_a_task_future_does_not_kill_the_loop() {
    struct PanicOnDrop;
    impl Drop for PanicOnDrop {
        fn drop(&mut self) {
            panic!("a Drop bug");
        }
    }
    let ex = exec(2);
    let after = Arc::new(AtomicBool::new(false));
    let a = after.clone();
    ex.spawn_on(0, move || async move {
        // Pinned and migratable, each aborted while parked.
        let pinned = xtc_shards::spawn_local(async {
            let _p = PanicOnDrop;
            std::future::pending::<()>().await;
        });
        let migratable = xtc_shards::spawn(async {
            let _p = PanicOnDrop;
            std::future::pending::<()>().await;
        });
        xtc_shards::time::sleep(Duration::from_millis(10)).await;
        pinned.abort();
        migratable.abort();
        assert!(pinned.await.unwrap_err().is_cancelled());
        assert!(migratable.await.unwrap_err().is_cancelled());
        // And one that finishes: its future (holding the value, not dropping it in its poll)
        // is dropped right after its last poll; the output stands.
        struct Holder(#[allow(dead_code)] PanicOnDrop);
        impl std::future::Future for Holder {
            type Output = u32;
            fn poll(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<u32> {
                std::task::Poll::Ready(7)
            }
        }
        let done = xtc_shards::spawn_local(Holder(PanicOnDrop));
        assert_eq!(done.await.unwrap(), 7);
        a.store(true, SeqCst);
    })
    .unwrap();
    run_or_fail(
        ex,
        Duration::from_secs(20),
        "after a task's future panicked in Drop",
    )
    .unwrap();
    assert!(
        after.load(SeqCst),
        "the loop went on after the panicking drops"
    );
}

/// An output nobody takes is dropped by the task itself: a panic in its `Drop` is contained
/// like a panic in the future's (DESIGN.md invariant 9). async-task drops it under an
/// abort-on-panic guard, so the process used to abort. Covered: a detached pinned task, a
/// detached migratable task, one aborted after it finished, and a panic payload whose own
/// `Drop` panics.
#[test]
fn an_untaken_output_whose_drop_panics_is_contained() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("a Drop bug in a task's output");
        }
    }
    let out = LocalExecutor::new().unwrap().block_on(async {
        drop(spawn_local(async { Bomb }));
        drop(xtc_shards::spawn(async { Bomb }));
        drop(spawn_local(async { std::panic::panic_any(Bomb) }));
        let finished = spawn_local(async { Bomb });
        while !finished.is_finished() {
            xtc_shards::yield_now().await;
        }
        finished.abort();
        for _ in 0..3 {
            xtc_shards::yield_now().await;
        }
        7
    });
    assert_eq!(out, 7);
}

/// As in tokio, `.await` on an aborted handle returns only once the task's future has been
/// dropped, so what the task held is released by then (and `is_finished` says false until
/// that drop). It used to return at once, with the future still alive on its loop.
#[test]
#[allow(clippy::await_holding_refcell_ref)]
fn awaiting_an_aborted_handle_waits_for_the_future_to_be_dropped() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    LocalExecutor::new().unwrap().block_on(async move {
        let cell = std::rc::Rc::new(std::cell::RefCell::new(0));
        let c = cell.clone();
        let h = spawn_local(async move {
            let _g = CountDrop(d);
            // Held across the await on purpose: the state an aborted task must release.
            let _borrow = c.borrow_mut();
            std::future::pending::<()>().await;
        });
        xtc_shards::yield_now().await; // it starts and parks
        h.abort();
        assert!(!h.is_finished(), "finished before its future was dropped");
        assert_eq!(dropped.load(SeqCst), 0);
        assert!(h.await.unwrap_err().is_cancelled());
        assert_eq!(dropped.load(SeqCst), 1);
        assert!(
            cell.try_borrow_mut().is_ok(),
            "the task's borrow outlived the await"
        );
    });
}

/// The same for a migratable task and a pinned task on another shard, aborted and awaited
/// from a plain thread: `is_finished` turns true by itself once the owner dropped the future.
#[test]
fn an_aborted_handle_on_another_thread_finishes_when_the_owner_drops_the_future() {
    let ex = exec(2);
    let dropped = Arc::new(AtomicUsize::new(0));
    let (d1, d2) = (dropped.clone(), dropped.clone());
    let pinned = ex
        .spawn_on(1, move || async move {
            let _g = CountDrop(d1);
            std::future::pending::<()>().await;
        })
        .unwrap();
    let migratable = ex.spawn(async move {
        let _g = CountDrop(d2);
        std::future::pending::<()>().await;
    });
    let h = ex.handle();
    let runner = std::thread::spawn(move || ex.run());
    while h.loop_stats(0).unwrap().polls + h.loop_stats(1).unwrap().polls < 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    pinned.abort();
    migratable.abort();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(pinned.is_finished() && migratable.is_finished()) {
        assert!(
            std::time::Instant::now() < deadline,
            "aborted tasks never finished"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(dropped.load(SeqCst), 2);
    assert!(futures::executor::block_on(pinned)
        .unwrap_err()
        .is_cancelled());
    assert!(futures::executor::block_on(migratable)
        .unwrap_err()
        .is_cancelled());
    runner.join().unwrap().unwrap();
}

/// As in tokio, aborting a task that already finished changes nothing: its output is kept.
/// It used to be discarded, the await giving a cancelled error.
#[test]
fn abort_of_a_finished_task_keeps_its_output() {
    let r = LocalExecutor::new().unwrap().block_on(async move {
        let h = spawn_local(async { 42 });
        while !h.is_finished() {
            xtc_shards::yield_now().await;
        }
        h.abort();
        h.abort(); // a second abort is a no-op too
        h.await
    });
    assert_eq!(r.unwrap(), 42);
}

/// An aborted handle dropped without being awaited: the task is still cancelled (its future
/// dropped on its loop), and the run ends.
#[test]
fn an_aborted_handle_dropped_unawaited_still_cancels() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    LocalExecutor::new().unwrap().block_on(async move {
        let h = spawn_local(async move {
            let _g = CountDrop(d);
            std::future::pending::<()>().await;
        });
        xtc_shards::yield_now().await;
        h.abort();
        drop(h);
        xtc_shards::yield_now().await;
    });
    assert_eq!(dropped.load(SeqCst), 1);
}

/// A task cancelled by a stop is not finished while its future's `Drop` still runs on its
/// loop: async-task marks it closed before it drops the future, and `is_finished()` read that
/// as finished, so code that waited for it could find the task's resources still held.
#[test]
fn is_finished_of_a_task_cancelled_by_a_stop_waits_for_its_drop() {
    struct SlowDrop(Arc<AtomicBool>, Arc<AtomicBool>);
    impl Drop for SlowDrop {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(300));
            self.1.store(true, SeqCst);
        }
    }
    let ex = exec(2);
    ex.set_service_mode(true);
    let (started, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (s, d) = (started.clone(), done.clone());
    let jh = ex
        .spawn_on(1, move || async move {
            let _slow = SlowDrop(s, d);
            std::future::pending::<()>().await;
        })
        .unwrap();
    let h = ex.handle();
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || tx.send(ex.run()).unwrap());
    while h.loop_stats(1).unwrap().polls < 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.stop();
    let t0 = std::time::Instant::now();
    while !started.load(SeqCst) {
        assert!(t0.elapsed() < HANG, "the future was never dropped");
        std::hint::spin_loop();
    }
    // The future's drop is under way on shard 1 (it takes 300 ms).
    let finished = jh.is_finished();
    let dropped = done.load(SeqCst);
    rx.recv_timeout(HANG).expect("run() hung").unwrap();
    runner.join().unwrap();
    assert!(
        !finished || dropped,
        "is_finished() was true while the task's future was still being dropped"
    );
    assert!(jh.is_finished());
    assert!(futures::executor::block_on(jh).unwrap_err().is_cancelled());
}

/// A handle polled once (its waker registered) and then aborted while a stop drops its task's
/// future: the waker is still woken when that drop ends. The abort's own poll of async-task's
/// cancel future registered a no-op waker in its place, and a task closed by the stop (not by
/// the abort) had not woken the old one first, so a poller waiting for the end (a plain thread
/// parked until woken) waited for good.
#[test]
fn aborting_a_task_a_stop_is_dropping_keeps_the_handles_waker() {
    struct SlowDrop(Arc<AtomicBool>);
    impl Drop for SlowDrop {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    struct FlagWaker(AtomicBool);
    impl std::task::Wake for FlagWaker {
        fn wake(self: Arc<Self>) {
            self.0.store(true, SeqCst);
        }
    }
    let ex = exec(2);
    ex.set_service_mode(true);
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let jh = ex
        .spawn_on(1, move || async move {
            let _slow = SlowDrop(s);
            std::future::pending::<()>().await;
        })
        .unwrap();
    let h = ex.handle();
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || tx.send(ex.run()).unwrap());
    while h.loop_stats(1).unwrap().polls < 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let flag = Arc::new(FlagWaker(AtomicBool::new(false)));
    let mut jh = Box::pin(jh);
    assert!(matches!(
        poll_caught(jh.as_mut(), &Waker::from(flag.clone())),
        Ok(true)
    ));
    h.stop();
    let t0 = std::time::Instant::now();
    while !started.load(SeqCst) {
        assert!(t0.elapsed() < HANG, "the future was never dropped");
        std::hint::spin_loop();
    }
    // The future's drop is under way on shard 1 (it takes 300 ms).
    jh.abort();
    rx.recv_timeout(HANG).expect("run() hung").unwrap();
    runner.join().unwrap();
    assert!(
        flag.0.load(SeqCst),
        "the waker of the handle's last poll was never woken"
    );
    assert!(futures::executor::block_on(jh).unwrap_err().is_cancelled());
}

/// Runs `body` in a child process (this test binary re-executed for `test` alone), and asserts
/// that the child exits successfully: for a bug that aborts the process, which would take the
/// whole test binary down.
fn in_child(test: &str, body: impl FnOnce()) {
    const ROLE: &str = "XTC_RT_TASK_CHILD";
    if std::env::var(ROLE).as_deref() == Ok(test) {
        body();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, test)
        .output()
        .expect("spawn the child test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child {test} failed: {:?}\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}",
        out.status
    );
}

/// A `JoinHandle` polled with a user's waker whose `wake` panics: the task completes on its
/// loop, which wakes that waker (inside async-task, under its abort-on-panic guard: the process
/// aborted). The panic is logged, the loop goes on, and the handle still gives the output.
#[test]
fn a_panicking_waker_of_a_join_handle_does_not_abort() {
    in_child("a_panicking_waker_of_a_join_handle_does_not_abort", || {
        let out = LocalExecutor::new().unwrap().block_on(async {
            let mut h = Box::pin(spawn_local(async {
                task::yield_now().await;
                5
            }));
            let waker = panicking_waker();
            assert!(matches!(poll_caught(h.as_mut(), &waker), Ok(true)));
            // The task completes while this one yields: its loop wakes the panicking waker.
            for _ in 0..4 {
                task::yield_now().await;
            }
            assert!(h.is_finished());
            h.await.unwrap()
        });
        assert_eq!(out, 5);
    });
}

/// The same from a plain thread of an `Executor`'s: the shard's loop wakes the panicking waker
/// and must go on (run() returns), and a handle registered with a waker whose drop panics is
/// re-polled (async-task drops the old waker under its abort-on-panic guard).
#[test]
fn a_panicking_waker_of_a_join_handle_polled_off_the_loop_does_not_abort() {
    in_child(
        "a_panicking_waker_of_a_join_handle_polled_off_the_loop_does_not_abort",
        || {
            let ex = exec(1);
            // Both tasks end once the plain thread has polled their handles.
            let go = Arc::new(AtomicBool::new(false));
            let task = |go: Arc<AtomicBool>, v: u32| {
                move || async move {
                    while !go.load(SeqCst) {
                        xtc_shards::time::sleep(Duration::from_millis(1)).await;
                    }
                    v
                }
            };
            let h = ex.spawn_on(0, task(go.clone(), 7)).unwrap();
            let d = ex.spawn_on(0, task(go.clone(), 8)).unwrap();
            let t = std::thread::spawn(move || {
                let mut h = Box::pin(h);
                assert!(matches!(
                    poll_caught(h.as_mut(), &panicking_waker()),
                    Ok(true)
                ));
                let mut d = Box::pin(d);
                // This copy is never dropped (its drop would panic here, in the test).
                let w = std::mem::ManuallyDrop::new(drop_panicking_waker());
                assert!(matches!(poll_caught(d.as_mut(), &w), Ok(true)));
                // The old waker is dropped when this poll registers a new one.
                assert!(matches!(
                    poll_caught(d.as_mut(), &Waker::noop().clone()),
                    Ok(true)
                ));
                go.store(true, SeqCst);
                while !h.is_finished() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let h = futures::executor::block_on(h).unwrap();
                (h, futures::executor::block_on(d).unwrap())
            });
            run_or_fail(ex, Duration::from_secs(20), "after a join waker panicked").unwrap();
            assert_eq!(t.join().unwrap(), (7, 8));
        },
    );
}

/// A `JoinHandle` polled with a user's waker whose clone panics: the panic reaches the poller
/// (the clone is the poller's own call), but the handle keeps its task, which runs on and
/// gives its output to the next poll, rather than being cancelled by the unwind.
#[test]
fn a_join_handle_keeps_its_task_when_the_waker_clone_panics() {
    let out = LocalExecutor::new().unwrap().block_on(async {
        let mut h = Box::pin(spawn_local(async {
            task::yield_now().await;
            5
        }));
        let waker = hooked_waker(|| panic!("a user waker panics when cloned"));
        assert!(poll_caught(h.as_mut(), &waker).is_err());
        h.await
    });
    assert_eq!(out.ok(), Some(5));
}

/// A handle polled again after it gave its output (a finished task's, or an aborted one's
/// cancellation) panics, as tokio's does and as xtc's channel futures do: its output is gone.
/// It answered a cancelled `JoinError` instead, a lie (the task ran to completion and was
/// never aborted, nor dropped by a stop) that `submit_to`-style callers map to "stopped".
#[test]
fn a_join_handle_polled_after_it_completed_panics() {
    for aborted in [false, true] {
        let again = LocalExecutor::new().unwrap().block_on(async move {
            let mut h = Box::pin(spawn_local(async { 5 }));
            if aborted {
                h.abort();
                assert!(h.as_mut().await.unwrap_err().is_cancelled());
            } else {
                assert_eq!(h.as_mut().await.unwrap(), 5);
            }
            poll_caught(h.as_mut(), Waker::noop())
        });
        let payload = again.expect_err("a second poll after the output gave an answer");
        let msg = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        assert_eq!(
            msg,
            Some("xtc: JoinHandle polled after it completed"),
            "aborted: {aborted}"
        );
    }
}

/// `JoinError`, and so `xtc::Error`, is `Send + Sync` like `std::io::Error` and tokio's
/// `JoinError`: `?` turns it into a `Box<dyn Error + Send + Sync>` (or an `anyhow::Error`), and
/// threads may share one. It held the panic payload as a `Box<dyn Any + Send>`, which is not
/// `Sync`, so neither compiled.
#[test]
fn join_error_and_error_are_send_and_sync() {
    fn boxed(e: Error) -> Box<dyn std::error::Error + Send + Sync> {
        e.into()
    }
    let e = LocalExecutor::new()
        .unwrap()
        .block_on(async { spawn_local(async { panic!("boom") }).await.unwrap_err() });
    // Shared by reference with other threads, which read the message.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| assert_eq!(e.panic_message(), Some("boom")));
        }
    });
    let b = boxed(Error::Join(e));
    assert_eq!(b.to_string(), "a task failed: task panicked: boom");
    let e = match b.downcast::<Error>().map(|b| *b) {
        Ok(Error::Join(e)) => e,
        other => panic!("not the join error: {other:?}"),
    };
    // The payload is still the panic's, to re-raise.
    let p = e.into_panic().expect("a panic");
    assert_eq!(p.downcast_ref::<&str>(), Some(&"boom"));
}

/// A user's waker that, when woken, tries `shard::set_class` (which acts on the task being
/// polled, through the loop's pointer to its metadata) and records whether it was accepted.
struct SetClassWaker {
    class: xtc_shards::Class,
    accepted: Mutex<Vec<bool>>,
}

impl std::task::Wake for SetClassWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let ok = xtc_shards::shard::set_class(self.class).is_ok();
        self.accepted.lock().unwrap().push(ok);
    }
}

/// async-task wakes a handle's awaiter after it dropped its own reference to the task; when the
/// handle is gone already (an aborted handle dropped before its task was), that frees the task
/// first. The loop still named the freed
/// task as the one being polled while the awaiter, a user's waker, ran: `shard::set_class`
/// there read and wrote the freed task's class (valgrind: an invalid read 32 bytes inside a
/// block freed by `RawTask::destroy`). A `JoinHandle`'s foreign waker is not the polled task's
/// code: it runs with no task current, so `set_class` is refused there. A live handle dropped
/// by the task itself in its last poll did the same until a dropped handle took its waker back,
/// and an aborted handle dropped first takes it back too now: neither waker is woken at all.
#[test]
fn a_join_handle_waker_woken_after_its_task_was_freed_sees_no_current_task() {
    for aborted in [false, true] {
        let accepted = LocalExecutor::new().unwrap().block_on(async move {
            let class = xtc_shards::shard::create_class(100, None).unwrap();
            let w = Arc::new(SetClassWaker {
                class,
                accepted: Mutex::new(Vec::new()),
            });
            let waker = Waker::from(w.clone());
            let slot: Rc<RefCell<Option<xtc_shards::JoinHandle<u32>>>> = Rc::default();
            let in_task = slot.clone();
            let mut h = spawn_local(async move {
                task::yield_now().await;
                // The handle goes before the task ends: its end frees the task.
                drop(in_task.borrow_mut().take());
                1u32
            });
            if aborted {
                h.abort();
            }
            // Registers the guarded user waker as the task's awaiter.
            assert!(matches!(
                poll_caught(std::pin::Pin::new(&mut h), &waker),
                Ok(true)
            ));
            if aborted {
                // Dropped at once: the task, closed, is dropped unrun and freed by its loop.
                drop(h);
            } else {
                *slot.borrow_mut() = Some(h);
            }
            drop(waker);
            for _ in 0..4 {
                task::yield_now().await;
            }
            let accepted = w.accepted.lock().unwrap().clone();
            accepted
        });
        // A handle, live or aborted, gives its waker back when dropped: nothing wakes it.
        assert_eq!(
            accepted,
            Vec::<bool>::new(),
            "aborted {aborted}: the waker ran with the freed task as the current one, or ran \
             after its handle was dropped"
        );
    }
}

/// `task::Builder::spawn_on` off any loop fails with `Error::OffLoop`, as `submit_to`,
/// `set_class` and `create_class` do there. It gave `Error::InvalidArgument` (documented as a
/// builder or knob argument out of range), so a caller telling the off-loop case apart by its
/// variant missed it.
#[test]
fn task_builder_spawn_on_off_any_loop_is_an_off_loop_error() {
    let r = task::Builder::new().name("off").spawn_on(0, || async { 1 });
    match r {
        Err(Error::OffLoop(what)) => assert!(what.contains("spawn_on"), "{what}"),
        other => panic!("not an off-loop error: {:?}", other.map(|_| ())),
    }
}

/// `?` on a `std::io::Result` inside a function returning `xtc::Result` (a task's body, a
/// server's `main`): the error converts into `Error::Io`, keeping the OS error.
#[test]
fn io_errors_convert_into_xtc_errors_with_the_question_mark() {
    fn bind_twice() -> xtc_shards::Result<()> {
        let first = std::net::TcpListener::bind("127.0.0.1:0")?;
        let _second = std::net::TcpListener::bind(first.local_addr()?)?;
        Ok(())
    }
    match bind_twice() {
        Err(xtc_shards::Error::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
        }
        other => panic!("expected Error::Io(AddrInUse), got {other:?}"),
    }
    let e = xtc_shards::Error::from(std::io::Error::from(std::io::ErrorKind::NotFound));
    assert!(e.to_string().starts_with("I/O: "), "{e}");
}

/// A `block_on` inside a task of its own `LocalExecutor` is refused (it would block the loop it
/// runs on), and the refusal leaves the running loop alone. It used to build a whole second
/// `Core` for that loop first, and only then find it could not enter: a second I/O driver set
/// up and torn down (an io_uring ring), the loop's ring ends and deque taken and given back, its
/// timer generation and driver kind stored over the running run's. Here the second ring is
/// refused (a seccomp filter on this thread, as a memlock limit could), so that driver fell
/// back to epoll: it warned that "this loop uses epoll", and the running io_uring loop's
/// `LoopStats::io_driver` said epoll from then on.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_refused_nested_block_on_leaves_the_running_loop_alone() {
    use xtc_shards::io::Driver;
    // A thread of its own: the filter stays on the thread that installs it.
    std::thread::spawn(|| {
        let ex = Rc::new(LocalExecutor::new().unwrap());
        let inner = ex.clone();
        ex.block_on(async move {
            let h = xtc_shards::shard::handle().unwrap();
            let before = h.loop_stats(0).unwrap().io_driver;
            if before != Some(Driver::IoUring) {
                println!("skipped: the loop does not run io_uring here ({before:?})");
                return;
            }
            if !deny_syscall(libc::SYS_io_uring_setup, libc::EPERM as u32) {
                println!("skipped: no seccomp filter can be installed here");
                return;
            }
            let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                inner.block_on(async {});
            }));
            let payload =
                refused.expect_err("a block_on inside its own running loop was not refused");
            let msg = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or_default();
            assert!(msg.contains("inside an xtc loop"), "{msg:?}");
            assert_eq!(
                h.loop_stats(0).unwrap().io_driver,
                before,
                "the refused block_on changed the running loop's driver kind"
            );
        });
    })
    .join()
    .unwrap();
}

/// `LoopStats::inbox_received` counts every message the loop takes from its inbox, those its
/// shutdown takes (and drops, after a requested stop) too, as `messages_received` counts what
/// that shutdown drains from the rings. Spawns queued while the loop was busy and taken by
/// its shutdown were left out: the count stayed below what the inbox had been sent.
#[test]
fn inbox_messages_a_stopping_loop_drops_count_as_received() {
    const LATE: u64 = 3;
    let ex = exec(2);
    let h = ex.handle();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    // From this thread: shard 1's inbox (one message).
    ex.spawn_on(1, move || async move {
        // While this poll holds shard 1, a plain thread queues more spawns in its inbox and
        // asks the stop: the loop's next step 1 sees the stop, and its shutdown takes them.
        std::thread::spawn(move || {
            for _ in 0..LATE {
                let r = r.clone();
                h.send_to(1, move || async move {
                    r.fetch_add(1, SeqCst);
                })
                .unwrap();
            }
            h.stop();
        })
        .join()
        .unwrap();
    })
    .unwrap();
    run_within(&ex, Duration::from_secs(60))
        .expect("run() hung: a stop with spawns in the inbox")
        .unwrap();
    // A requested stop drops what the inbox still held: none of the late spawns ran.
    assert_eq!(ran.load(SeqCst), 0);
    assert_eq!(
        ex.loop_stats(1).unwrap().inbox_received,
        1 + LATE,
        "the messages the shutdown took from the inbox were not counted"
    );
}

/// A `LocalExecutor` has no coordinator: its deadlock grace is `None` and setting it has no
/// effect (`Handle::set_deadlock_grace`, `LocalExecutor`'s docs). The getter said otherwise
/// once set: `Some(1s)`, a deadlock report promised that never comes.
#[test]
fn local_executor_deadlock_grace_stays_none() {
    LocalExecutor::new().unwrap().block_on(async {
        let h = xtc_shards::shard::handle().unwrap();
        assert_eq!(h.deadlock_grace(), None);
        h.set_deadlock_grace(Some(Duration::from_secs(1)));
        assert_eq!(
            h.deadlock_grace(),
            None,
            "a LocalExecutor reports no deadlock: its grace must read None"
        );
    });
}

/// `abort` of a parked task wakes the awaiter a foreign-waker poll left in it, inside the call:
/// user code. If that wake asks the same handle whether its task is finished, the answer is no
/// (it is parked, and still being aborted), and a nested `abort` changes nothing: awaited, the
/// handle reports cancelled as usual. (The state taken out for the call read as a finished
/// task's.)
#[test]
fn is_finished_asked_from_inside_abort_sees_a_live_task() {
    use std::{
        cell::Cell,
        future::Future,
        pin::Pin,
        sync::Arc,
        task::{Context, Wake, Waker},
    };
    thread_local! {
        /// What the next wake of a `Hooked` waker runs.
        static HOOK: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    }
    struct Hooked;
    impl Wake for Hooked {
        fn wake(self: Arc<Self>) {
            if let Some(f) = HOOK.with(|h| h.borrow_mut().take()) {
                f()
            }
        }
    }
    let (inside, joined) = LocalExecutor::new().unwrap().block_on(async {
        let mut target = spawn_local(std::future::pending::<()>());
        xtc_shards::yield_now().await; // the task runs once and parks
        let waker = Waker::from(Arc::new(Hooked));
        assert!(Pin::new(&mut target)
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        let h = Rc::new(target);
        let inside: Rc<Cell<Option<bool>>> = Rc::new(Cell::new(None));
        let (h2, inside2) = (h.clone(), inside.clone());
        HOOK.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move || {
                inside2.set(Some(h2.is_finished()));
                h2.abort();
            }))
        });
        h.abort();
        assert!(
            HOOK.with(|hook| hook.borrow_mut().take()).is_none(),
            "the abort woke the handle's last poller"
        );
        let h = Rc::into_inner(h).expect("the hook let go of its clone");
        (inside.get(), h.await)
    });
    assert_eq!(
        inside,
        Some(false),
        "asked inside abort, the parked task read as finished"
    );
    assert!(joined.unwrap_err().is_cancelled());
}

/// A `spawn_blocking` job awaited by a loop that did not start it counts in that loop's work
/// in flight, as its own jobs do: started off any loop, or in an earlier run, and awaited by
/// a task, it was counted by no running loop, and with a job longer than the deadlock grace
/// the run ended with `Err(Deadlock)`, the task dropped while the job ran on.
#[test]
fn a_spawn_blocking_job_awaited_away_from_where_it_started_is_no_deadlock() {
    let ex = || {
        Executor::builder()
            .shards(1)
            .deadlock_grace(Some(Duration::from_millis(100)))
            .build()
            .unwrap()
    };
    let slow = || {
        xtc_shards::spawn_blocking(|| {
            std::thread::sleep(Duration::from_millis(600));
            7
        })
    };
    // Started off any loop.
    let job = slow();
    let got = ex().block_on(move || async move { job.await.unwrap() });
    assert_eq!(got.unwrap(), 7, "started off any loop");
    // Started in one run, awaited in the next.
    let e = ex();
    // A future of the job, returned (not awaited) by the first run's main task.
    let job = e
        .block_on(move || async move { Some(slow()) })
        .unwrap()
        .expect("returned");
    let got = e.block_on(move || async move { job.await.unwrap() });
    assert_eq!(got.unwrap(), 7, "started in an earlier run");
}

/// Runs `f` in the `Drop` of a task queued on another executor, never run, dropped here:
/// inside a task, that executor's sweep runs the drop with this loop hidden
/// (`context::off_loop`).
fn in_a_sweep(f: impl FnOnce() + Send + 'static) {
    struct OnDrop<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for OnDrop<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    let other = common::exec(1);
    let on_drop = OnDrop(Some(f));
    other
        .spawn_on(0, move || async move { drop(on_drop) })
        .unwrap();
    drop(other);
}

/// A `spawn_blocking` job submitted while its loop is hidden (in a drop another executor's
/// sweep runs) counts in that loop's jobs in flight, so the loop waits for it, and its end
/// wakes the loop: it recorded no loop to wake, and `run()` never returned once the job ended
/// (the loop stayed parked `WAITING` with a count of zero). `nested`: the job is submitted by
/// a `LocalExecutor` run inside the hidden section and handed back unfinished; the thread's
/// job count is the one the hidden loop reads, and the job's end nudged only the nested loop,
/// gone by then. The job is dropped once it started (one dropped before is taken off the
/// queue unrun).
#[test]
fn a_spawn_blocking_job_started_under_a_hidden_loop_wakes_it_when_it_ends() {
    for nested in [false, true] {
        let ended = Arc::new(AtomicBool::new(false));
        let e = ended.clone();
        let ex = common::exec(1);
        ex.spawn_on(0, move || async move {
            in_a_sweep(move || {
                let started = Arc::new(AtomicBool::new(false));
                let s = started.clone();
                let submit = move || {
                    xtc_shards::spawn_blocking(move || {
                        s.store(true, SeqCst);
                        std::thread::sleep(Duration::from_millis(300));
                        e.store(true, SeqCst);
                    })
                };
                // In an `Option` out of the nested run, not awaited (a future returned bare
                // from an async block reads as a missing `.await`).
                let job = if nested {
                    LocalExecutor::new()
                        .unwrap()
                        .block_on(async move { Some(submit()) })
                } else {
                    Some(submit())
                };
                while !started.load(SeqCst) {
                    std::thread::yield_now();
                }
                drop(job);
            });
        })
        .unwrap();
        let ran = common::run_within(&ex, Duration::from_secs(20));
        assert!(
            matches!(ran, Some(Ok(()))),
            "nested {nested}: run() after the job ended: {ran:?} (None: hung)"
        );
        assert!(
            ended.load(SeqCst),
            "nested {nested}: run() returned before the job ended"
        );
    }
}

/// Starts a `spawn_blocking` job that runs until `release` is set, waits until a pool thread
/// runs it, and drops its future, once polled: the job is abandoned (never interrupted).
async fn abandon_a_job(release: Arc<AtomicBool>) {
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let mut job = Box::pin(xtc_shards::spawn_blocking(move || {
        s.store(true, SeqCst);
        while !release.load(SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }));
    let _ = futures::poll!(job.as_mut());
    while !started.load(SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(job);
}

/// A loop's end waits (up to a second, with a warning) for the blocking jobs it abandoned,
/// not for those of another loop of its thread: a later `LocalExecutor` on the thread waited
/// its second and warned for an earlier one's job, and so did one run inside a drop a hidden
/// loop runs (another executor's sweep) for the hidden loop's job. Warnings are counted.
#[test]
fn a_loop_waits_at_its_end_for_its_own_abandoned_jobs_only() {
    let warns = Arc::new(AtomicUsize::new(0));
    let counted = |f: &mut dyn FnMut()| {
        let before = warns.load(SeqCst);
        tracing::subscriber::with_default(count_events(tracing::Level::WARN, warns.clone()), f);
        warns.load(SeqCst) - before
    };
    let release = Arc::new(AtomicBool::new(false));
    // One after another on this thread.
    let r = release.clone();
    let first = counted(&mut || {
        LocalExecutor::new()
            .unwrap()
            .block_on(abandon_a_job(r.clone()))
    });
    assert_eq!(
        first, 1,
        "the first run waits for its own abandoned job, and warns"
    );
    let later = counted(&mut || LocalExecutor::new().unwrap().block_on(async {}));
    assert_eq!(later, 0, "a later run waited for the first one's job");
    release.store(true, SeqCst);
    // One inside the other: a run in a drop the sweep runs with the shard loop hidden.
    let release = Arc::new(AtomicBool::new(false));
    let (r, w) = (release.clone(), warns.clone());
    let nested = Arc::new(AtomicUsize::new(usize::MAX));
    let n = nested.clone();
    let ex = common::exec(1);
    ex.spawn_on(0, move || async move {
        abandon_a_job(r.clone()).await;
        let before = w.load(SeqCst);
        tracing::subscriber::with_default(count_events(tracing::Level::WARN, w.clone()), || {
            in_a_sweep(|| LocalExecutor::new().unwrap().block_on(async {}))
        });
        n.store(w.load(SeqCst) - before, SeqCst);
        r.store(true, SeqCst);
    })
    .unwrap();
    run_or_fail(ex, HANG, "a loop run inside a hidden one").unwrap();
    assert_eq!(
        nested.load(SeqCst),
        0,
        "the nested run waited for the hidden loop's job"
    );
}

/// A running `spawn_blocking` job whose awaiting task the stop drops has ended when
/// `block_on` returns, whether that task was pinned (its loop waits for it, up to a second)
/// or migratable: a migratable task left parked is dropped by `run()`'s own thread after the
/// loops stopped, and nobody waited for its job.
#[test]
fn a_stop_waits_for_the_blocking_job_of_a_dropped_migratable_task() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    for migratable in [false, true] {
        let ex = exec(2);
        let ended = Arc::new(AtomicBool::new(false));
        let e = ended.clone();
        ex.block_on(move || async move {
            let started = Arc::new(AtomicBool::new(false));
            let s = started.clone();
            let holder = async move {
                let _ = xtc_shards::spawn_blocking(move || {
                    s.store(true, SeqCst);
                    std::thread::sleep(Duration::from_millis(300));
                    e.store(true, SeqCst);
                })
                .await;
            };
            if migratable {
                drop(xtc_shards::spawn(holder));
            } else {
                drop(spawn_local(holder));
            }
            while !started.load(SeqCst) {
                xtc_shards::time::sleep(Duration::from_millis(1)).await;
            }
            // The holder parks on the job; the main task ends, and the stop drops it.
            xtc_shards::time::sleep(Duration::from_millis(20)).await;
        })
        .unwrap();
        assert!(
            ended.load(SeqCst),
            "block_on returned while the job of a dropped {} task still ran",
            if migratable { "migratable" } else { "pinned" }
        );
    }
}

/// A `spawn_blocking` job given up on while it runs (`timeout` around it) lets its loop sleep
/// until it ends, as an awaited one does: such a job is never signalled, and its end wakes
/// the loop. The loop woke every millisecond for as long as the job ran (about 500 parks here
/// against 2).
#[test]
fn a_dropped_running_spawn_blocking_job_does_not_wake_its_loop_every_millisecond() {
    let parks_with = |drop_it: bool| {
        let ex = exec(1);
        ex.spawn_on(0, move || async move {
            let job = xtc_shards::spawn_blocking(|| std::thread::sleep(Duration::from_millis(600)));
            if drop_it {
                // Dropped once the job runs: abandoned.
                let gave_up = xtc_shards::time::timeout(Duration::from_millis(50), job).await;
                assert!(gave_up.is_err(), "the job ended within 50 ms");
            } else {
                job.await.unwrap();
            }
        })
        .unwrap();
        run_within(&ex, HANG).expect("run() hung").unwrap();
        ex.loop_stats(0).unwrap().parks
    };
    let awaited = parks_with(false);
    let dropped = parks_with(true);
    assert!(
        dropped < awaited + 50,
        "parks: {awaited} with the job awaited, {dropped} with it dropped while it ran"
    );
}

/// `spawn_blocking` runs its closure on a pool thread (not the loop's), gives back its value,
/// and a panic as a `JoinError`; the loop runs its other tasks meanwhile; and a job longer
/// than the deadlock grace is work in flight, not a deadlock, where the same wait on a plain
/// thread of the program's own is reported.
#[test]
fn spawn_blocking_runs_off_the_loop_and_counts_as_work_in_flight() {
    use std::{
        sync::{
            atomic::{AtomicBool, Ordering::SeqCst},
            Arc,
        },
        time::Duration,
    };
    let exec = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .deadlock_grace(Some(Duration::from_millis(100)))
        .build()
        .unwrap();
    let out = exec
        .block_on(|| async {
            let loop_thread = std::thread::current().id();
            let (value, thread) = xtc_shards::spawn_blocking(move || {
                // Longer than the grace, with every loop idle.
                std::thread::sleep(Duration::from_millis(400));
                (7u32, std::thread::current().id())
            })
            .await
            .unwrap();
            assert_ne!(thread, loop_thread, "the closure ran on the loop's thread");
            // The loop serves other tasks while a job blocks.
            let release = Arc::new(AtomicBool::new(false));
            let r = release.clone();
            let job = xtc_shards::spawn_blocking(move || {
                while !r.load(SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                "released"
            });
            let other = xtc_shards::spawn_local(async move {
                release.store(true, SeqCst);
            });
            other.await.unwrap();
            assert_eq!(job.await.unwrap(), "released");
            let err =
                xtc_shards::spawn_blocking(|| -> u32 { panic!("test: a blocking job panics") })
                    .await
                    .unwrap_err();
            assert!(err.is_panic(), "{err}");
            value
        })
        .unwrap();
    assert_eq!(out, 7);

    // The same wait on a plain thread is invisible to the runtime: reported after the grace.
    let exec = Executor::builder()
        .shards(1)
        .deadlock_grace(Some(Duration::from_millis(100)))
        .build()
        .unwrap();
    // The thread sends only once `block_on` has returned (a fixed delay lost the race to a
    // coordinator descheduled past it on a loaded machine).
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (thread_tx, thread_rx) = std::sync::mpsc::channel();
    let r = exec.block_on(move || async move {
        let (tx, mut rx) = xtc_shards::channel::shared::bounded::<u32>(1).unwrap();
        let mut tx = tx;
        let t = std::thread::spawn(move || {
            let _ = go_rx.recv_timeout(HANG);
            let _ = tx.try_send(1);
        });
        let _ = thread_tx.send(t);
        rx.recv().await
    });
    let _ = go_tx.send(());
    if let Ok(t) = thread_rx.try_recv() {
        t.join().unwrap();
    }
    assert!(
        matches!(r, Err(xtc_shards::Error::Deadlock { .. })),
        "a plain thread's long wait: {r:?}"
    );
}

/// A running `spawn_blocking` job whose future is dropped runs to its end undisturbed: the
/// pool interrupts a dropped file operation with a signal, which user code must not see (its
/// blocking `read` returned `Interrupted` where it waited for data).
#[test]
fn a_dropped_spawn_blocking_job_is_not_interrupted() {
    use std::{
        io::{Read, Write},
        os::fd::FromRawFd,
        sync::{Arc, Mutex},
        time::Duration,
    };
    let mut fds = [0; 2];
    // SAFETY: `fds` is a live array of two descriptors for the kernel to fill.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just created and are owned by these files alone.
    let (mut reader, mut writer) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let seen = Arc::new(Mutex::new(None));
    let s = seen.clone();
    let exec = Executor::builder().shards(1).build().unwrap();
    exec.block_on(move || async move {
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st = started.clone();
        let job = xtc_shards::spawn_blocking(move || {
            st.store(true, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 4];
            let r = reader.read(&mut buf);
            *s.lock().unwrap() = Some(r.map_err(|e| e.kind()));
        });
        while !started.load(std::sync::atomic::Ordering::SeqCst) {
            xtc_shards::time::sleep(Duration::from_millis(1)).await;
        }
        // The job is in its `read`: drop its future.
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        drop(job);
    })
    .unwrap();
    // Fails (EPIPE) if the read was cut short and its job dropped the reader: the assert
    // below says why.
    let _ = writer.write_all(b"data");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "the job never ended");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        *seen.lock().unwrap(),
        Some(Ok(4)),
        "the job's read was disturbed"
    );
}

/// A task whose future's `Drop` panics, cancelled while a `tracing` subscriber that panics on
/// errors is installed: the runtime contains the drop's panic and logs it, and the log's own
/// panic is contained too. The log ran outside the containment, inside async-task's
/// abort-on-panic section for a cancelled future's drop: the process aborted.
#[test]
fn a_subscriber_that_panics_on_the_contained_panics_log_does_not_abort() {
    in_child(
        "a_subscriber_that_panics_on_the_contained_panics_log_does_not_abort",
        || {
            struct PanicsOnDrop;
            impl Drop for PanicsOnDrop {
                fn drop(&mut self) {
                    panic!("test: a future's drop panics");
                }
            }
            let out =
                tracing::subscriber::with_default(panic_on_events(tracing::Level::ERROR), || {
                    LocalExecutor::new().unwrap().block_on(async {
                        let h = spawn_local(async {
                            let _bomb = PanicsOnDrop;
                            std::future::pending::<()>().await
                        });
                        task::yield_now().await;
                        h.abort();
                        let cancelled = h.await.unwrap_err().is_cancelled();
                        (cancelled, 7)
                    })
                });
            assert_eq!(out, (true, 7));
        },
    );
}

/// Dropping an aborted handle whose task's future is not dropped yet (a parked task, whose
/// owner drops it at its next turn) drops the waker the handle's last poll left with the task:
/// it was kept alive, and woken when the owner dropped the future, as a live handle's no
/// longer is.
#[test]
fn dropping_an_aborted_handle_drops_its_last_pollers_waker() {
    struct FlagWaker(AtomicBool);
    impl std::task::Wake for FlagWaker {
        fn wake(self: Arc<Self>) {
            self.0.store(true, SeqCst);
        }
    }
    LocalExecutor::new().unwrap().block_on(async {
        let flag = Arc::new(FlagWaker(AtomicBool::new(false)));
        let mut h = Box::pin(spawn_local(std::future::pending::<()>()));
        task::yield_now().await;
        h.abort();
        let waker = Waker::from(flag.clone());
        assert!(matches!(poll_caught(h.as_mut(), &waker), Ok(true)));
        drop(waker);
        drop(h);
        // The owner (this loop) drops the cancelled future at a later turn.
        for _ in 0..4 {
            task::yield_now().await;
        }
        assert!(
            !flag.0.load(SeqCst),
            "the dropped handle's poller was woken"
        );
        assert_eq!(Arc::strong_count(&flag), 1, "the poller's waker was kept");
    });
}

/// A `spawn_blocking` job whose future was dropped while it ran leaves its result to the pool
/// thread to drop; a result whose `Drop` panics is contained there, the job ends as it should
/// (the panic unwound the pool thread before it marked the job done, so the stopping loop
/// waited its full second for the "still running" job and warned), and the pool serves the
/// next job.
#[test]
fn an_unclaimed_spawn_blocking_result_that_panics_when_dropped_is_contained() {
    struct PanicsOnDrop(Arc<AtomicBool>);
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
            panic!("test: an unclaimed result's drop panics");
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let d = dropped.clone();
    let warnings = Arc::new(AtomicUsize::new(0));
    let ex = LocalExecutor::new().unwrap();
    let next = tracing::subscriber::with_default(
        count_events(tracing::Level::WARN, warnings.clone()),
        || {
            ex.block_on(async move {
                let started = Arc::new(AtomicBool::new(false));
                let st = started.clone();
                let job = xtc_shards::spawn_blocking(move || {
                    st.store(true, SeqCst);
                    std::thread::sleep(Duration::from_millis(50));
                    PanicsOnDrop(d)
                });
                while !started.load(SeqCst) {
                    xtc_shards::time::sleep(Duration::from_millis(1)).await;
                }
                drop(job);
                // The pool's thread ends the job and drops the result; then it serves this one.
                xtc_shards::time::sleep(Duration::from_millis(100)).await;
                xtc_shards::spawn_blocking(|| 11).await.unwrap()
            })
        },
    );
    assert_eq!(next, 11);
    assert!(
        dropped.load(SeqCst),
        "the unclaimed result was never dropped"
    );
    assert_eq!(
        warnings.load(SeqCst),
        0,
        "the loop's stop found the job still running"
    );
}

/// `spawn_blocking` in migratable tasks: its future is `Send`, so `xtc::spawn` takes a task
/// that awaits it, on both shards, with stealing on; every result comes back.
#[test]
fn spawn_blocking_in_migratable_tasks() {
    fn assert_send<T: Send>(_: &T) {}
    let exec = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .eager_rebalance(true)
        .build()
        .unwrap();
    let h = exec.handle();
    let sum = exec
        .block_on(move || async move {
            let tasks: Vec<_> = (0..16u64)
                .map(|i| {
                    h.spawn(async move {
                        let job = xtc_shards::spawn_blocking(move || {
                            std::thread::sleep(Duration::from_millis(2));
                            i * 10
                        });
                        assert_send(&job);
                        let before = xtc_shards::shard::id();
                        let v = job.await.unwrap();
                        // Wherever the task was stolen to meanwhile.
                        assert!(xtc_shards::shard::id() < 2 && before < 2);
                        v
                    })
                })
                .collect();
            let mut sum = 0;
            for t in tasks {
                sum += t.await.unwrap();
            }
            sum
        })
        .unwrap();
    assert_eq!(sum, (0..16u64).map(|i| i * 10).sum::<u64>());
}

/// A hand-rolled executor's task (as in the async book): its waker owns its future.
struct Node {
    fut: Mutex<Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>>>,
}

// SAFETY: a node is only touched on the thread that made it (a `LocalExecutor`'s).
unsafe impl Send for Node {}
// SAFETY: as above.
unsafe impl Sync for Node {}

impl std::task::Wake for Node {
    fn wake(self: Arc<Self>) {}
}

/// Polls `fut` once as such a task (it must return `Pending`), then abandons it: its executor
/// is gone, only wakers hold the node. The weak reference tells whether it was freed.
fn poll_once_and_abandon(
    fut: impl std::future::Future<Output = ()> + 'static,
) -> std::sync::Weak<Node> {
    let node = Arc::new(Node {
        fut: Mutex::new(Some(Box::pin(fut))),
    });
    let waker = std::task::Waker::from(node.clone());
    let pending = {
        let mut fut = node.fut.lock().unwrap();
        fut.as_mut()
            .unwrap()
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
            .is_pending()
    };
    assert!(pending);
    Arc::downgrade(&node)
}

/// An abandoned foreign task awaiting an xtc handle is freed when the task it awaits ends:
/// the xtc task's end wakes and drops its waker, and the handle keeps that waker only
/// weakly, so it does not hold its own node alive.
#[test]
fn an_abandoned_foreign_task_is_freed_when_the_task_it_awaits_ends() {
    use std::cell::Cell;
    let freed = LocalExecutor::new().unwrap().block_on(async {
        let go = Rc::new(Cell::new(false));
        let g = go.clone();
        let h = spawn_local(async move {
            while !g.get() {
                xtc_shards::yield_now().await;
            }
        });
        let node = poll_once_and_abandon(async move {
            let _ = h.await;
        });
        go.set(true);
        for _ in 0..10 {
            xtc_shards::yield_now().await;
        }
        node.upgrade().is_none()
    });
    assert!(
        freed,
        "the node (its future and the handle in it) leaked: the handle held its waker"
    );
}

/// The same after an abort of the handle by someone else (it is shared in an `Rc`): the
/// aborted handle keeps that waker weakly too.
#[test]
fn an_abandoned_foreign_task_is_freed_after_an_abort_of_its_handle() {
    use std::cell::RefCell;
    let freed = LocalExecutor::new().unwrap().block_on(async {
        let h = Rc::new(RefCell::new(spawn_local(std::future::pending::<u32>())));
        let h2 = h.clone();
        let node = poll_once_and_abandon(async move {
            let _ = std::future::poll_fn(|cx| {
                std::future::Future::poll(std::pin::Pin::new(&mut *h2.borrow_mut()), cx)
            })
            .await;
        });
        h.borrow().abort();
        drop(h);
        for _ in 0..10 {
            xtc_shards::yield_now().await;
        }
        node.upgrade().is_none()
    });
    assert!(freed, "the node leaked: the aborted handle held its waker");
}
