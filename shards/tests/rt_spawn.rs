//! spawn_on, run, block_on, shard::id/count, stop, service mode.

mod common;
use common::*;

use std::{
    cell::Cell,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use xtc_shards::{shard, spawn_local, Error, Executor};

#[test]
fn spawn_on_before_run_runs_on_that_shard() {
    let ex = exec(2);
    let seen = Arc::new(Mutex::new(Vec::new()));
    for i in 0..2 {
        let seen = seen.clone();
        ex.spawn_on(i, move || async move {
            seen.lock().unwrap().push((i, shard::id(), shard::count()));
        })
        .unwrap();
    }
    ex.run().unwrap();
    let mut v = seen.lock().unwrap().clone();
    v.sort();
    assert_eq!(v, vec![(0, 0, 2), (1, 1, 2)]);
}

#[test]
fn shard_id_on_four_oversubscribed_shards() {
    let ex = exec(4);
    let seen = Arc::new(Mutex::new(Vec::new()));
    for i in 0..4 {
        let seen = seen.clone();
        ex.spawn_on(i, move || async move {
            let before = shard::id();
            for _ in 0..100 {
                xtc_shards::yield_now().await;
            }
            seen.lock()
                .unwrap()
                .push((i, before, shard::id(), shard::count()));
        })
        .unwrap();
    }
    ex.run().unwrap();
    let mut v = seen.lock().unwrap().clone();
    v.sort();
    assert_eq!(v, (0..4).map(|i| (i, i, i, 4)).collect::<Vec<_>>());
}

#[test]
fn out_of_range_shard_is_an_error() {
    let ex = exec(2);
    match ex.spawn_on(2, || async {}) {
        Err(Error::InvalidShard { shard: 2, count: 2 }) => {}
        other => panic!("expected InvalidShard, got {other:?}"),
    }
    assert!(matches!(ex.loop_stats(5), Err(Error::InvalidShard { .. })));
}

#[test]
fn shard_api_off_loop() {
    assert_eq!(shard::try_id(), None);
    assert_eq!(shard::count(), 0);
    let r = std::panic::catch_unwind(shard::id);
    let msg = r.unwrap_err();
    let msg = msg
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(msg.contains("off any xtc loop"), "{msg}");
}

#[test]
fn not_send_future_and_local_tasks() {
    let ex = exec(2);
    let total = Arc::new(AtomicUsize::new(0));
    let t = total.clone();
    ex.spawn_on(1, move || async move {
        // Rc is !Send: fine, the future is built and stays on shard 1.
        let counter = Rc::new(Cell::new(0));
        let mut hs = Vec::new();
        for _ in 0..100 {
            let c = counter.clone();
            hs.push(spawn_local(async move {
                xtc_shards::yield_now().await;
                c.set(c.get() + 1);
                shard::id()
            }));
        }
        for h in hs {
            assert_eq!(h.await.unwrap(), 1);
        }
        t.store(counter.get(), SeqCst);
    })
    .unwrap();
    ex.run().unwrap();
    assert_eq!(total.load(SeqCst), 100);
    let st = ex.loop_stats(1).unwrap();
    assert_eq!(st.tasks_run, 101);
    assert!(st.polls >= 201, "{st:?}");
    assert_eq!(st.live_tasks, 0);
}

#[test]
fn block_on_returns_main_output_and_drops_the_rest() {
    let ex = exec(2);
    let dropped = Arc::new(AtomicUsize::new(0));
    struct Canary(Arc<AtomicUsize>);
    impl Drop for Canary {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
    let d = dropped.clone();
    let started = Arc::new(AtomicUsize::new(0));
    let v = ex
        .block_on(move || async move {
            // A task on the other shard that would run forever.
            let h = shard::handle().unwrap();
            let s = started.clone();
            h.spawn_on(1, move || async move {
                let _c = Canary(d);
                s.store(1, SeqCst);
                std::future::pending::<()>().await;
            })
            .unwrap();
            // Wait until it really runs (a spawn still in flight is dropped unbuilt).
            while started.load(SeqCst) == 0 {
                xtc_shards::time::sleep(Duration::from_millis(1)).await;
            }
            7 * 6
        })
        .unwrap();
    assert_eq!(v, 42);
    assert_eq!(dropped.load(SeqCst), 1, "the parked task was dropped");
}

#[test]
fn run_waits_for_pending_timers() {
    let ex = exec(2);
    let start = Instant::now();
    ex.spawn_on(0, || async {
        xtc_shards::time::sleep(Duration::from_millis(60)).await;
    })
    .unwrap();
    ex.run().unwrap();
    assert!(start.elapsed() >= Duration::from_millis(60));
    assert_eq!(ex.loop_stats(0).unwrap().timers_fired, 1);
}

#[test]
fn service_mode_runs_until_stop_from_another_thread() {
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .service_mode(true)
        .build()
        .unwrap();
    assert!(ex.service_mode());
    let h = ex.handle();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        // Still running: work spawned now runs.
        let r2 = r.clone();
        let j = h
            .spawn_on(1, move || async move {
                r2.fetch_add(1, SeqCst);
            })
            .unwrap();
        futures::executor::block_on(j).unwrap();
        h.stop();
    });
    let start = Instant::now();
    let dog = Watchdog::new(
        ex.handle(),
        HANG,
        "a service run stopped from another thread",
    );
    ex.run().unwrap();
    dog.done();
    assert!(start.elapsed() >= Duration::from_millis(150));
    assert_eq!(ran.load(SeqCst), 1);
    stopper.join().unwrap();
}

#[test]
fn service_mode_can_be_switched_off_while_running() {
    let ex = exec(2);
    ex.set_service_mode(true);
    let h = ex.handle();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        h.set_service_mode(false);
    });
    let dog = Watchdog::new(
        ex.handle(),
        HANG,
        "a run whose service mode was switched off",
    );
    ex.run().unwrap();
    dog.done();
    assert!(!ex.service_mode());
    t.join().unwrap();
}

/// Parks a task on shard 0 that holds `guard(ran)`, stops the executor from shard 1 after
/// 50 ms (so the stop's shutdown drops the guard), then runs again with nothing to do: what the
/// guard's `Drop` spawned (each such task adds one to `ran`) must run in neither run, and the
/// next run must still end at quiescence (dropped messages count as received).
fn stop_with_a_parked_guard_then_run_again<G: Send + 'static>(
    guard: impl FnOnce(Arc<AtomicUsize>) -> G + Send + 'static,
) {
    let ran = Arc::new(AtomicUsize::new(0));
    let ex = exec(2);
    let h = ex.handle();
    let r = ran.clone();
    let (held, hd) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let hd2 = hd.clone();
    ex.spawn_on(0, move || async move {
        let _g = guard(r);
        hd2.store(true, SeqCst);
        std::future::pending::<()>().await
    })
    .unwrap();
    let h2 = held.clone();
    ex.spawn_on(1, move || async move {
        // Once the task holds its guard, not after a fixed 50 ms: stopped before its first
        // poll, the task was dropped without ever making the guard, and the test checked
        // nothing.
        stop_once(&h, &hd).await;
        h2.store(true, SeqCst);
    })
    .unwrap();
    let first = run_within(&ex, HANG).expect("run() hung: the stopped run");
    assert!(
        held.load(SeqCst),
        "the stop came before the task held its guard"
    );
    assert_eq!(ran.load(SeqCst), 0, "the spawn ran during the stopped run");
    first.unwrap();
    run_within(&ex, HANG)
        .expect("run() hung: the next run")
        .unwrap();
    assert_eq!(
        ran.load(SeqCst),
        0,
        "a spawn of the stopped run ran in the next run"
    );
}

/// A task's `Drop` during a stop's shutdown that spawns on a loop which already finished its
/// own: the spawn went into the ring to that loop and stayed there, so it ran in the next,
/// unrelated `run()` (or not, by which loop finished first). It is dropped with the stopped
/// run's tasks now, and the next run still finds quiescence.
#[test]
fn a_spawn_from_a_drop_during_a_stop_does_not_run_in_the_next_run() {
    struct SpawnOnDrop(Arc<AtomicUsize>);
    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            let r = self.0.clone();
            if let Some(h) = shard::handle() {
                let _ = h.spawn_on(1, move || async move {
                    r.fetch_add(1, SeqCst);
                });
            }
        }
    }
    stop_with_a_parked_guard_then_run_again(SpawnOnDrop);
}

/// The same with a migratable spawn (`Handle::spawn`, round-robin): it went into the
/// injector of the next loop, which had already finished its shutdown (held up here by the
/// drop's sleep), and ran in the next, unrelated `run()`. It stays on the stopping loop now,
/// which drops it.
#[test]
fn a_migratable_spawn_from_a_drop_during_a_stop_does_not_run_in_the_next_run() {
    struct SpawnOnDrop(Arc<AtomicUsize>);
    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            // Shard 1 finishes its shutdown meanwhile.
            std::thread::sleep(Duration::from_millis(100));
            if let Some(h) = shard::handle() {
                // Round-robin: some go to shard 1.
                for _ in 0..4 {
                    let r = self.0.clone();
                    drop(h.spawn(async move {
                        r.fetch_add(1, SeqCst);
                    }));
                }
            }
        }
    }
    stop_with_a_parked_guard_then_run_again(SpawnOnDrop);
}

/// A parked migratable task is dropped after the loops stop, on the thread in `run()`; a
/// `Drop` of its that spawns through a `Handle` it holds (a pinned task, a migratable one) put
/// the pinned one in an inbox, and it ran in the next, unrelated `run()`. Such spawns are
/// refused now, as those of the drops a stopping loop runs are dropped.
#[test]
fn a_spawn_from_the_drop_of_a_parked_migratable_task_at_a_stop_does_not_run_later() {
    struct SpawnOnDrop(Arc<AtomicUsize>, xtc_shards::Handle);
    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            let r = self.0.clone();
            let _ = self.1.spawn_on(0, move || async move {
                r.fetch_add(1, SeqCst);
            });
            let r = self.0.clone();
            drop(self.1.spawn(async move {
                r.fetch_add(1, SeqCst);
            }));
        }
    }
    let ran = Arc::new(AtomicUsize::new(0));
    let ex = exec(2);
    run_stopped_holding(&ex, SpawnOnDrop(ran.clone(), ex.handle()));
    assert_eq!(ran.load(SeqCst), 0, "the spawn ran during the stopped run");
    run_within(&ex, HANG)
        .expect("run() hung: the next run")
        .unwrap();
    assert_eq!(
        ran.load(SeqCst),
        0,
        "a spawn of the stopped run ran in the next run"
    );
}

/// A link of a chain of drops that spawn again: dropping one spawns a migratable task (through
/// its `Handle`) holding the next, until `dropped` reaches `links`.
struct Respawn {
    handle: xtc_shards::Handle,
    links: usize,
    dropped: Arc<AtomicUsize>,
}

impl Respawn {
    fn chain(handle: xtc_shards::Handle, links: usize, dropped: Arc<AtomicUsize>) -> Respawn {
        Respawn {
            handle,
            links,
            dropped,
        }
    }
}

impl Drop for Respawn {
    fn drop(&mut self) {
        if self.dropped.fetch_add(1, SeqCst) < self.links {
            let g = Respawn::chain(self.handle.clone(), self.links, self.dropped.clone());
            drop(self.handle.spawn(async move {
                let _g = g;
            }));
        }
    }
}

/// A parked migratable task dropped after a stop, on the thread in `run()`, whose `Drop`
/// spawns another through a `Handle`, whose drop spawns again, 100,000 deep: each spawn is
/// dropped in turn (refused, `Discarding`) without recursing. `Handle::spawn` dropped the
/// injectors from inside the spawn, so each link ran its successor's drop on its own stack
/// frame, and the chain overflowed the stack.
#[test]
fn a_chain_of_respawning_drops_of_a_stopped_run_is_dropped_flat() {
    let n = Arc::new(AtomicUsize::new(0));
    let ex = exec(2);
    run_stopped_holding(&ex, Respawn::chain(ex.handle(), 100_000, n.clone()));
    assert_eq!(n.load(SeqCst), 100_001, "part of the chain was left");
}

/// Runs `ex` with a parked migratable task holding `g` until a task stops the run (once the
/// migratable task was polled: a fixed 50 ms let a slow machine stop the run first, and `g`
/// was then dropped with a queued task, not a parked one), so `g` is dropped with the stopped
/// run's leftovers.
fn run_stopped_holding(ex: &Executor, g: impl Send + 'static) {
    let h = ex.handle();
    let polled = Arc::new(AtomicBool::new(false));
    let p = polled.clone();
    ex.spawn(async move {
        let _g = g;
        p.store(true, SeqCst);
        std::future::pending::<()>().await
    });
    ex.spawn_on(1, move || async move { stop_once(&h, &polled).await })
        .unwrap();
    run_within(ex, HANG)
        .expect("run() hung: the stopped run")
        .unwrap();
}

/// Stops `h`'s run once `flag` is set (checked every millisecond; a hang guard after
/// [`HANG`], which the caller's assertions then report).
async fn stop_once(h: &xtc_shards::Handle, flag: &AtomicBool) {
    sleep_until(|| flag.load(SeqCst)).await;
    h.stop();
}

#[test]
fn stop_inside_a_task_drops_the_rest() {
    let ex = exec(2);
    let h = ex
        .spawn_on(1, || async {
            std::future::pending::<()>().await;
        })
        .unwrap();
    ex.spawn_on(0, || async {
        xtc_shards::time::sleep(Duration::from_millis(10)).await;
        xtc_shards::stop();
    })
    .unwrap();
    ex.run().unwrap();
    let e = futures::executor::block_on(h).unwrap_err();
    assert!(e.is_cancelled());
}

#[test]
fn executor_runs_again_after_run_returns() {
    let ex = exec(2);
    for round in 0..3 {
        let j = ex
            .spawn_on(round % 2, move || async move { round * 2 })
            .unwrap();
        ex.run().unwrap();
        assert_eq!(futures::executor::block_on(j).unwrap(), round * 2);
    }
}

/// Starts a service-mode `run()` of `ex` on another thread and returns once it is observably
/// running (a task queued before it has run), with a receiver for its result.
fn start_a_service_run(ex: &Arc<Executor>) -> std::sync::mpsc::Receiver<xtc_shards::Result<()>> {
    ex.set_service_mode(true);
    let (started_tx, started) = std::sync::mpsc::channel();
    ex.spawn_on(0, move || async move { started_tx.send(()).unwrap() })
        .unwrap();
    let (done_tx, done) = std::sync::mpsc::channel();
    let e2 = ex.clone();
    std::thread::spawn(move || done_tx.send(e2.run()).unwrap());
    started
        .recv_timeout(HANG)
        .expect("the first run never started");
    done
}

#[test]
fn concurrent_run_is_refused() {
    let ex = Arc::new(exec(1));
    let first = start_a_service_run(&ex);
    // Were it not refused, this run would wait for a stop (service mode): the watchdog's.
    let dog = Watchdog::new(ex.handle(), HANG, "a second run() next to a running one");
    let second = ex.run();
    dog.done();
    assert!(matches!(second, Err(Error::AlreadyRunning)), "{second:?}");
    ex.stop();
    first
        .recv_timeout(HANG)
        .expect("the first run did not end at stop()")
        .unwrap();
}

/// `run()` or `block_on()` called from inside one of the executor's own tasks is refused
/// (the run it would start is the one the task runs in), and the error says so and what to
/// do there: it said only "call run()/block_on() from one thread at a time", which the caller,
/// alone on its thread, already did.
#[test]
fn run_or_block_on_inside_its_own_task_is_refused_with_what_to_do() {
    let ex = Arc::new(exec(2));
    let inner = ex.clone();
    let (run, block_on) = ex
        .block_on(move || async move {
            let run = inner.run();
            let block_on = inner.block_on(|| async { 1 });
            (run, block_on)
        })
        .unwrap();
    for r in [run, block_on.map(drop)] {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::AlreadyRunning), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("inside one of its own tasks") && msg.contains(".await"),
            "{msg}"
        );
    }
}

/// `block_on` during another thread's `run()` is refused before its main task exists: queued,
/// that task would run inside the other run and stop it when it ended.
#[test]
fn block_on_during_a_run_is_refused_and_leaves_that_run_alone() {
    let ex = Arc::new(exec(1));
    let first = start_a_service_run(&ex);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let dog = Watchdog::new(ex.handle(), HANG, "a block_on next to a running run()");
    let out = ex.block_on(move || async move {
        r.fetch_add(1, SeqCst);
    });
    dog.done();
    assert!(matches!(out, Err(Error::AlreadyRunning)), "{out:?}");
    // The service run goes on: it still runs new work, and only `stop` ends it.
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        first.try_recv().is_err(),
        "the refused block_on stopped the other run"
    );
    let h = ex.handle();
    let j = h.spawn_on(0, || async { shard::id() }).unwrap();
    assert_eq!(futures::executor::block_on(j).unwrap(), 0);
    ex.stop();
    first
        .recv_timeout(HANG)
        .expect("the first run did not end at stop()")
        .unwrap();
    assert_eq!(ran.load(SeqCst), 0, "the refused main future never ran");
}

#[test]
fn spawn_on_from_a_task_to_another_shard() {
    let ex = exec(3);
    let out = ex
        .block_on(|| async {
            let h = shard::handle().unwrap();
            let mut hs = Vec::new();
            for i in 0..3 {
                hs.push(
                    h.spawn_on(i, move || async move { shard::id() * 10 })
                        .unwrap(),
                );
            }
            let mut v = Vec::new();
            for h in hs {
                v.push(h.await.unwrap());
            }
            v
        })
        .unwrap();
    assert_eq!(out, vec![0, 10, 20]);
}

/// An idle loop reports idle time: shard 1, with nothing to do, parks and stays parked while
/// shard 0 sleeps 100 ms. Shard 1's rate is read over that sleep, between two snapshots taken
/// from shard 0's task once shard 1's idle time has begun to count: over the whole run it
/// included the busy time of its thread's start (before its first park) and of its stop,
/// which a loaded machine can stretch to as long as the run itself.
#[test]
fn idle_loops_report_idle_time() {
    let ex = exec(2);
    let h = ex.handle();
    let span = ex
        .spawn_on(0, move || async move {
            sleep_until(|| !h.loop_stats(1).unwrap().idle.is_zero()).await;
            let before = h.loop_stats(1).unwrap();
            xtc_shards::time::sleep(Duration::from_millis(100)).await;
            (before, h.loop_stats(1).unwrap())
        })
        .unwrap();
    ex.run().unwrap();
    let (before, after) = futures::executor::block_on(span).unwrap();
    let mut s1 = xtc_shards::LoopStats::default();
    s1.idle = after.idle.saturating_sub(before.idle);
    s1.busy = after.busy.saturating_sub(before.busy);
    let s0 = ex.loop_stats(0).unwrap();
    assert!(s0.idle >= Duration::from_millis(50), "{s0:?}");
    assert!(
        s1.idle_rate() > 0.5,
        "shard 1 over shard 0's sleep: {before:?} -> {after:?}"
    );
    assert!(s0.parks >= 1);
}

/// A loop's shutdown counts in its run's time (busy + idle): the drops of its tasks run user
/// code, which may take long. Here shard 1's one task, parked, holds a guard whose drop sleeps
/// 300 ms; the stop comes 50 ms into the run, so shard 1's shutdown alone takes 300 ms of wall
/// time. The run clock stopped when the loop step returned, before the shutdown: busy + idle
/// stayed near 50 ms (review P: 300 ms of shutdown counted nowhere).
#[test]
fn a_loops_shutdown_counts_in_its_busy_time() {
    struct SlowDrop;
    impl Drop for SlowDrop {
        fn drop(&mut self) {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    let ex = exec(2);
    let h = ex.handle();
    ex.spawn_on(1, || async {
        let _guard = SlowDrop;
        std::future::pending::<()>().await;
    })
    .unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        h.stop();
    });
    ex.run().unwrap();
    let s1 = ex.loop_stats(1).unwrap();
    assert!(
        s1.busy + s1.idle >= Duration::from_millis(300),
        "shard 1's 300 ms shutdown is missing from its run time: {s1:?}"
    );
    assert!(s1.busy >= Duration::from_millis(300), "{s1:?}");
}

/// `idle_rate` of any `LoopStats` a program builds (its fields are public: a sum or a
/// difference of snapshots, or saturated values) is a rate, never a panic: it added the two
/// `Duration`s, which overflowed.
#[test]
fn idle_rate_of_huge_durations_does_not_panic() {
    let mut s = xtc_shards::LoopStats::default();
    assert_eq!(s.idle_rate(), 0.0);
    s.busy = Duration::MAX;
    s.idle = Duration::MAX;
    let rate = std::panic::catch_unwind(|| s.idle_rate()).expect("idle_rate panicked");
    assert!((rate - 0.5).abs() < 1e-9, "{rate}");
    s.busy = Duration::ZERO;
    assert_eq!(s.idle_rate(), 1.0);
}

/// Snapshots taken from another thread while a loop parks and wakes thousands of times:
/// `idle` and `busy` never go backwards (a snapshot between the two stores of a park's end
/// used to miss the whole park, so `later.idle - earlier.idle` could panic). The task sleeps
/// until the loop parked 2,000 times and 1,000 snapshots were taken, not for 300 ms (about
/// 3,500 parks on an idle machine): on a loaded one each wake-up can take milliseconds, fewer
/// than the 100 parks asked for, and the snapshotting thread can be off its CPU for most of a
/// fixed span.
#[test]
fn busy_and_idle_never_go_backwards() {
    use std::sync::atomic::AtomicU64;
    const PARKS: u64 = 2000;
    const SNAPSHOTS: u64 = 1000;
    let ex = Arc::new(exec(1));
    ex.set_spin_before_park(Duration::ZERO);
    let seen = Arc::new(AtomicU64::new(0));
    let (h, s) = (ex.handle(), seen.clone());
    ex.spawn_on(0, move || async move {
        let limit = Instant::now() + HANG;
        while (h.loop_stats(0).unwrap().parks < PARKS || s.load(SeqCst) < SNAPSHOTS)
            && Instant::now() < limit
        {
            xtc_shards::time::sleep(Duration::from_micros(20)).await;
        }
    })
    .unwrap();
    let e2 = ex.clone();
    // A run that never ended would keep the snapshot loop below going for ever.
    let dog = Watchdog::new(ex.handle(), HANG * 2, "a task awaiting 2,000 parks");
    let runner = std::thread::spawn(move || e2.run());
    let mut last = ex.loop_stats(0).unwrap();
    let mut ended = false;
    while !ended {
        // One more once the run is over: the task saw the 2,000th park, which this thread,
        // descheduled, may not have seen yet.
        ended = runner.is_finished();
        let s = ex.loop_stats(0).unwrap();
        assert!(
            s.idle >= last.idle,
            "idle went back: {:?} -> {:?}",
            last.idle,
            s.idle
        );
        assert!(
            s.busy >= last.busy,
            "busy went back: {:?} -> {:?}",
            last.busy,
            s.busy
        );
        last = s;
        seen.fetch_add(1, SeqCst);
    }
    runner.join().unwrap().unwrap();
    dog.done();
    let seen = seen.load(SeqCst);
    assert!(
        seen >= SNAPSHOTS,
        "too few snapshots to mean anything: {seen}"
    );
    assert!(
        last.parks >= PARKS,
        "the loop parked only {} times",
        last.parks
    );
}

/// A loop that panics (here a tracing subscriber that panics on the stall watchdog's
/// warning, in the loop's step) ends its run all the same: its busy time stops counting. The
/// run's start stayed recorded, so `busy` went on growing after `block_on` (or `run()`, whose
/// worker catches such a panic) had returned, and the next run's start overwrote it.
#[test]
fn busy_time_stops_counting_when_a_loop_panics() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let h = ex.block_on(async { shard::handle().expect("on a loop") });
    h.set_stall_budget(Duration::from_millis(1));
    let ran = tracing::subscriber::with_default(panic_on_events(tracing::Level::WARN), || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ex.block_on(async {
                // Over the budget: the poll's end reports it, and the report panics.
                burn(Duration::from_millis(5));
                xtc_shards::yield_now().await;
            })
        }))
    });
    assert!(ran.is_err(), "the loop did not panic");
    h.set_stall_budget(Duration::ZERO);
    let before = h.loop_stats(0).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let after = h.loop_stats(0).unwrap();
    assert_eq!(
        after.busy, before.busy,
        "busy time went on counting after the run had ended"
    );
}

/// A `LocalExecutor` whose loop panics (as above) drops the run's tasks, on its thread,
/// before the panic leaves `block_on`, as a shard's worker does for its loop. `block_on` let
/// the panic through at once: a task parked in that run stayed alive, its handle unresolved,
/// until a later, unrelated `block_on` on the executor dropped it (or never, if none came
/// and the executor was kept).
#[test]
fn a_local_executor_whose_loop_panics_still_drops_its_tasks() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let h = ex.block_on(async { shard::handle().expect("on a loop") });
    h.set_stall_budget(Duration::from_millis(1));
    let dropped = Arc::new(AtomicUsize::new(0));
    let parked = Rc::new(Cell::new(None));
    let (d, p) = (dropped.clone(), parked.clone());
    let ran = tracing::subscriber::with_default(panic_on_events(tracing::Level::WARN), || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ex.block_on(async move {
                let guard = DropCount(d);
                p.set(Some(spawn_local(async move {
                    let _guard = guard;
                    std::future::pending::<()>().await
                })));
                // The task parks, then an overlong poll's report panics.
                xtc_shards::yield_now().await;
                burn(Duration::from_millis(5));
                xtc_shards::yield_now().await;
            })
        }))
    });
    assert!(ran.is_err(), "the loop did not panic");
    assert_eq!(
        dropped.load(SeqCst),
        1,
        "the parked task outlived its run's end"
    );
    let handle = parked.take().expect("the task was spawned");
    assert!(handle.is_finished(), "its handle is unresolved");
    assert!(futures::executor::block_on(handle)
        .unwrap_err()
        .is_cancelled());
}

/// Counts its drops: what a leaked task would never do.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

#[test]
fn tasks_of_an_executor_dropped_without_running_are_freed() {
    let dropped = Arc::new(AtomicUsize::new(0));
    {
        let ex = exec(2);
        for i in 0..2 {
            let pinned = DropCount(dropped.clone());
            ex.spawn_on(i, move || async move { drop(pinned) }).unwrap();
            let migratable = DropCount(dropped.clone());
            drop(ex.spawn(async move { drop(migratable) }));
        }
        // `ex` is dropped here without `run`: the queued tasks go with it.
    }
    assert_eq!(
        dropped.load(SeqCst),
        4,
        "every queued task's state was dropped"
    );
}

#[test]
fn a_queued_task_holding_a_handle_is_freed_with_its_executor() {
    let dropped = Arc::new(AtomicUsize::new(0));
    {
        let ex = exec(2);
        let handle = ex.handle();
        let guard = DropCount(dropped.clone());
        ex.spawn_on(1, move || async move {
            let _keep = (handle, guard);
        })
        .unwrap();
    }
    assert_eq!(
        dropped.load(SeqCst),
        1,
        "the task and the handle it held were dropped"
    );
}

/// A stall callback holding a `Handle` (to stop the executor on a stall, say) is freed with its
/// executor, and the executor with it: the callback sat in the loops the handle keeps alive, a
/// cycle, so the whole executor (its rings, its eventfds) leaked once it was dropped.
#[test]
fn a_stall_callback_holding_a_handle_is_freed_with_its_executor() {
    let dropped = Arc::new(AtomicUsize::new(0));
    {
        let ex = exec(2);
        for shard in 0..2 {
            let handle = ex.handle();
            let guard = DropCount(dropped.clone());
            ex.set_stall_callback(shard, move |_| {
                let _keep = &guard;
                handle.stop();
            })
            .unwrap();
        }
    }
    assert_eq!(
        dropped.load(SeqCst),
        2,
        "the callbacks and the handles they held were dropped"
    );
    // One installed through a handle after the executor is gone is dropped at once.
    let h = exec(1).handle();
    let (h2, guard) = (h.clone(), DropCount(dropped.clone()));
    h.set_stall_callback(0, move |_| {
        let _keep = (&h2, &guard);
    })
    .unwrap();
    drop(h);
    assert_eq!(
        dropped.load(SeqCst),
        3,
        "a callback installed after the drop was kept"
    );
}

/// A stopping loop's `Drop` code spawns onto a loop that has already shut down: the spawn waits
/// in their ring. Holding a `Handle`, it kept the executor (and the ring) alive for good; it was
/// then freed with the executor, and now already when the run ends, with the stopped run's
/// other tasks.
#[test]
fn a_spawn_left_in_a_ring_at_stop_is_freed_with_its_executor() {
    /// Set when shard 1's shutdown drops its parked task: shard 1 is then leaving.
    struct Flag(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    struct SpawnOnDrop(
        Option<xtc_shards::Handle>,
        Arc<AtomicUsize>,
        Arc<std::sync::atomic::AtomicBool>,
    );
    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            // Let shard 1 finish its shutdown first: wait until it dropped its parked task,
            // then a little more for it to give back its ring ends.
            let t0 = Instant::now();
            while !self.2.load(SeqCst) {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "shard 1 never stopped"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(100));
            let handle = self.0.take().expect("dropped once");
            let keep = (handle.clone(), DropCount(self.1.clone()));
            // From shard 0's thread: this goes over ring 0 -> 1.
            handle
                .spawn_on(1, move || async move {
                    let _keep = keep;
                })
                .unwrap();
        }
    }
    let dropped = Arc::new(AtomicUsize::new(0));
    {
        let ex = exec(2);
        let one_left = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let guard = SpawnOnDrop(Some(ex.handle()), dropped.clone(), one_left.clone());
        ex.spawn_on(0, move || async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        })
        .unwrap();
        let flag = Flag(one_left);
        ex.spawn_on(1, move || async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        })
        .unwrap();
        let out = ex.block_on(|| async {
            xtc_shards::time::sleep(Duration::from_millis(10)).await;
            shard::count()
        });
        assert_eq!(out.unwrap(), 2);
        assert_eq!(
            dropped.load(SeqCst),
            1,
            "the spawn left in the ring, and the handle it held, were dropped when the run ended"
        );
    }
    assert_eq!(dropped.load(SeqCst), 1, "dropped once");
}

/// The same for a `LocalExecutor`: a task queued through a `Handle` after `block_on` returned,
/// holding that `Handle`, is freed when the executor goes.
#[test]
fn a_queued_task_holding_a_handle_is_freed_with_its_local_executor() {
    let dropped = Arc::new(AtomicUsize::new(0));
    {
        let ex = xtc_shards::LocalExecutor::new().unwrap();
        let handle = ex.block_on(async { shard::handle().expect("on a loop") });
        let guard = DropCount(dropped.clone());
        let keep = handle.clone();
        handle
            .spawn_on(0, move || async move {
                let _keep = (keep, guard);
            })
            .unwrap();
        drop(handle);
        assert_eq!(dropped.load(SeqCst), 0, "queued, never run");
    }
    assert_eq!(dropped.load(SeqCst), 1, "freed with its LocalExecutor");
}

/// `Executor::spawn` (through a `Handle`) places round-robin even when called on a worker:
/// it used to start every task on the calling worker's own deque.
#[test]
fn handle_spawn_on_a_worker_places_round_robin() {
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .stealing(false)
        .build()
        .unwrap();
    let h = ex.handle();
    let firsts = ex
        .block_on(move || async move {
            let mut handles = Vec::new();
            for _ in 0..8 {
                handles.push(h.spawn(async { shard::id() }));
            }
            let mut firsts = Vec::new();
            for j in handles {
                firsts.push(j.await.unwrap());
            }
            firsts
        })
        .unwrap();
    let on_one = firsts.iter().filter(|&&s| s == 1).count();
    assert_eq!(
        on_one, 4,
        "with stealing off, half start on shard 1: {firsts:?}"
    );
}

/// Voluntary context switches of the calling thread so far: how often it blocked and was woken.
fn voluntary_switches() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("procfs");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc/thread-self/status")
}

/// The thread in `run()` is the coordinator; it must not be woken each time a loop with
/// nothing left goes idle while another loop still owns a parked task (quiesce.rs, "Who
/// pokes"): that was one wake-up per round trip to a parked target.
#[test]
fn round_trips_to_a_parked_target_do_not_wake_the_coordinator() {
    const TRIPS: usize = 2_000;
    let ex = exec(2);
    // Every idle moment parks: the target goes EMPTY after each answer while shard 0's main
    // task is parked awaiting it.
    ex.set_spin_before_park(Duration::ZERO);
    let before = voluntary_switches();
    let sum = ex
        .block_on(|| async {
            let mut sum = 0;
            for i in 0..TRIPS {
                sum += shard::submit_to(1, move || async move { i }).await.unwrap();
            }
            sum
        })
        .unwrap();
    let woken = voluntary_switches() - before;
    assert_eq!(sum, TRIPS * (TRIPS - 1) / 2);
    // The coordinator's own periodic deadlock poll (every second) and the final stop remain.
    assert!(
        woken < (TRIPS / 10) as u64,
        "the coordinator was woken {woken} times for {TRIPS} round trips"
    );
}

/// In service mode the coordinator checks nothing, so loops going idle must not wake it.
#[test]
fn loops_going_idle_in_service_mode_do_not_wake_the_coordinator() {
    const TASKS: usize = 200;
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .service_mode(true)
        .spin_before_park(Duration::ZERO)
        .build()
        .unwrap();
    let h = ex.handle();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let feeder = std::thread::spawn(move || {
        for i in 0..TASKS {
            let r = r.clone();
            let j = h
                .spawn_on(i % 2, move || async move {
                    r.fetch_add(1, SeqCst);
                })
                .unwrap();
            // Each task ends before the next starts: both loops go EMPTY every time.
            futures::executor::block_on(j).unwrap();
        }
        h.stop();
    });
    // On its own thread, which the watchdog's does not wake unless it fires.
    let dog = Watchdog::new(ex.handle(), HANG, "a service run fed from another thread");
    let before = voluntary_switches();
    ex.run().unwrap();
    let woken = voluntary_switches() - before;
    dog.done();
    feeder.join().unwrap();
    assert_eq!(ran.load(SeqCst), TASKS);
    assert!(
        woken < (TASKS / 10) as u64,
        "the coordinator was woken {woken} times by {TASKS} idle moments in service mode"
    );
}

/// Durations beyond u64 nanoseconds saturate instead of wrapping to something small (a grace
/// of ~585 years read back as 0.29 s, a spin as 0). A spin-before-park that long is refused
/// by `build()` and clamped by the setter (`MAX_SPIN_BEFORE_PARK`): a spinning loop is busy,
/// so it kept `run()`, and the deadlock report, from ever ending (from a review).
#[test]
fn huge_knob_durations_saturate() {
    let huge = Duration::new(18_446_744_073, 709_551_616); // 2^64 ns
    let ex = Executor::builder()
        .shards(1)
        .deadlock_grace(Some(huge))
        .build()
        .unwrap();
    assert!(ex.deadlock_grace().unwrap() > Duration::from_secs(86_400 * 365 * 100));
    let e = Executor::builder()
        .shards(1)
        .spin_before_park(huge)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("spin_before_park"), "{e}");
    ex.set_spin_before_park(huge);
    assert_eq!(ex.spin_before_park(), xtc_shards::MAX_SPIN_BEFORE_PARK);
    let e = Executor::builder()
        .shards(1)
        .reply_spin(huge)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("reply_spin"), "{e}");
    ex.set_reply_spin(huge);
    assert_eq!(ex.reply_spin(), xtc_shards::MAX_SPIN_BEFORE_PARK);
    // The longest accepted spin still lets a run end.
    let ex = Executor::builder()
        .shards(1)
        .spin_before_park(xtc_shards::MAX_SPIN_BEFORE_PARK)
        .build()
        .unwrap();
    ex.spawn_on(0, || async {}).unwrap();
    run_within(&ex, Duration::from_secs(20))
        .expect("run() hung with the longest spin-before-park")
        .unwrap();
}

#[test]
fn loop_stats_count_over_every_run() {
    let ex = exec(1);
    for round in 1..=2u64 {
        for _ in 0..10 {
            ex.spawn_on(0, || async {}).unwrap();
        }
        ex.run().unwrap();
        let s = ex.loop_stats(0).unwrap();
        assert_eq!(s.tasks_run, 10 * round, "round {round}: {s:?}");
        assert!(s.polls >= 10 * round, "round {round}: {s:?}");
    }
}

#[test]
fn a_stop_asked_between_runs_ends_the_next_run_only() {
    let ex = exec(1);
    let h = ex.handle();
    h.stop();
    let dropped = ex.spawn_on(0, || async { 1 }).unwrap();
    run_or_fail_keep(&ex, "a run after a stop asked while idle");
    let r = futures::executor::block_on(dropped);
    assert!(
        r.is_err_and(|e| e.is_cancelled()),
        "the latched stop drops the queued task"
    );
    // The stop was consumed: the following run runs its task to quiescence.
    let kept = ex.spawn_on(0, || async { 2 }).unwrap();
    run_or_fail_keep(&ex, "the run after that");
    assert_eq!(futures::executor::block_on(kept).unwrap(), 2);
}

/// Runs `ex` to its end on this thread (keeping it for later runs), failing the test if it
/// has not ended within [`HANG`]: the watchdog then stops it, so the test fails instead of
/// hanging.
fn run_or_fail_keep(ex: &Executor, what: &str) {
    let dog = Watchdog::new(ex.handle(), HANG, what);
    ex.run().unwrap();
    dog.done();
}

/// Once the `Executor` is dropped no run can come: a `Handle` refuses pinned spawns and
/// `submit_to` with `Err(Stopped)`, and a migratable spawn is dropped at once (its handle
/// reports cancelled). They used to be queued for good: the `submit_to` future never resolved,
/// and a queued closure holding a `Handle` kept the whole executor alive (leaked).
#[test]
fn a_handle_after_its_executor_is_dropped_queues_nothing() {
    let ex = exec(2);
    let h = ex.handle();
    drop(ex);
    handle_of_a_dropped_executor_queues_nothing(h);
}

/// The same for a `LocalExecutor`, whose drop did not close it: the spawn was accepted into
/// the inbox of a loop that would never run again (its `JoinHandle` never resolved), and the
/// task, holding a `Handle`, leaked with the executor.
#[test]
fn a_handle_after_its_local_executor_is_dropped_queues_nothing() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let h = ex.block_on(async { shard::handle().unwrap() });
    drop(ex);
    handle_of_a_dropped_executor_queues_nothing(h);
}

fn handle_of_a_dropped_executor_queues_nothing(h: xtc_shards::Handle) {
    let last = h.shard_count() - 1;
    let drops = Arc::new(AtomicUsize::new(0));
    let guard = CountDrop(drops.clone());
    let keep = h.clone();
    let r = h.spawn_on(0, move || {
        let _keep = (keep, guard);
        async {}
    });
    assert!(matches!(r, Err(Error::Stopped)), "{r:?}");
    assert_eq!(drops.load(SeqCst), 1, "the refused closure was dropped");
    let got = futures::executor::block_on(h.submit_to(last, || async { 7 }));
    assert!(matches!(got, Err(Error::Stopped)), "{got:?}");
    let guard = CountDrop(drops.clone());
    let keep = h.clone();
    let j = h.spawn(async move {
        let _keep = (keep, guard);
    });
    assert_eq!(
        drops.load(SeqCst),
        2,
        "the migratable task was dropped at once"
    );
    let e = futures::executor::block_on(j).unwrap_err();
    assert!(e.is_cancelled(), "{e:?}");
}

/// An executor dropped with a never-run migratable task whose drop spawns another through a
/// `Handle`, a thousand deep: each respawn is dropped in turn by the sweep's loop. The sweep
/// after the `Executor`'s drop recursed into itself and overflowed the stack.
#[test]
fn a_chain_of_respawning_drops_at_executor_drop_is_swept_flat() {
    assert_eq!(links_dropped_with_the_executor(1, 100_000), 100_001);
}

/// How many links of a `Respawn` chain of `links` are dropped when an executor of `shards`
/// loops is dropped with its first link in a never-run migratable task.
fn links_dropped_with_the_executor(shards: usize, links: usize) -> usize {
    let ex = exec(shards);
    let n = Arc::new(AtomicUsize::new(0));
    let g = Respawn::chain(ex.handle(), links, n.clone());
    drop(ex.handle().spawn(async move {
        let _g = g;
    }));
    drop(ex);
    n.load(SeqCst)
}

/// The same chain over two loops: `Handle::spawn` places round robin, so each respawn lands in
/// the other loop's injector, and the sweep's rounds (one pass over the loops each) drop two
/// links a round. They stopped after 8 rounds: the rest of the chain stayed queued, its last
/// task holding a `Handle`, and leaked with the executor in that cycle.
#[test]
fn a_chain_of_respawning_drops_across_loops_at_executor_drop_is_swept_whole() {
    assert_eq!(
        links_dropped_with_the_executor(2, 100),
        101,
        "part of the chain was left queued"
    );
}

/// Each shard thread's affinity, by shard, from inside its loop.
fn shard_affinities(ex: &Executor) -> Vec<Vec<usize>> {
    let seen = Arc::new(Mutex::new(vec![Vec::new(); ex.shard_count()]));
    for i in 0..ex.shard_count() {
        let seen = seen.clone();
        ex.spawn_on(i, move || async move {
            seen.lock().unwrap()[shard::id()] = affinity();
        })
        .unwrap();
    }
    ex.run().unwrap();
    let v = seen.lock().unwrap().clone();
    v
}

/// `pin(true)` (the default): each shard thread on its placed CPU alone. `pin(false)`: every
/// shard thread on all the placement's CPUs, oversubscribed shards included.
#[test]
fn pin_binds_each_shard_to_its_cpu_or_all_to_the_placements() {
    let ex = exec(4);
    assert!(ex.is_pinned());
    let cpus = ex.placement().cpus().to_vec();
    let pinned = shard_affinities(&ex);
    for (shard, got) in pinned.iter().enumerate() {
        assert_eq!(got, &vec![cpus[shard]], "shard {shard} pinned");
    }

    let ex = Executor::builder()
        .shards(4)
        .oversubscribe(true)
        .pin(false)
        .build()
        .unwrap();
    assert!(!ex.is_pinned());
    let mut all = ex.placement().cpus().to_vec();
    all.sort_unstable();
    all.dedup();
    for (shard, got) in shard_affinities(&ex).iter().enumerate() {
        assert_eq!(got, &all, "shard {shard} floating");
    }
}

/// On a topology that is not this machine's (synthetic or XML) no shard thread is pinned
/// (`Builder::topology`): `is_pinned` says so. It answered the builder's `pin` setting, on by
/// default, so it said pinned while every thread ran where the caller's affinity let it.
#[test]
fn is_pinned_is_false_on_a_synthetic_topology() {
    let topo = xtc_numa::Topology::synthetic("pack:1 core:2 pu:1").unwrap();
    let ex = Executor::builder()
        .shards(2)
        .topology(topo)
        .build()
        .unwrap();
    let mine = affinity();
    for (shard, got) in shard_affinities(&ex).iter().enumerate() {
        assert_eq!(
            got, &mine,
            "shard {shard} kept the caller's affinity: not pinned"
        );
    }
    assert!(!ex.is_pinned(), "no thread was pinned");
}

/// A waker whose drop panics, stored by a sleep of a task parked at the stop, does not kill
/// the loop's thread: the loop drops its timers' wakers at shutdown, and did so unguarded, so
/// the thread died halfway through its shutdown and `run()` reported an internal error.
#[test]
fn a_panicking_waker_drop_at_stop_does_not_kill_the_loop() {
    let ex = exec(2);
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    // Whether shard 1's task stored the waker. A fixed 20 ms sleep stood for this, which a
    // loaded machine outlasts (shard 1's thread not yet running): the stop then dropped the
    // task unbuilt, and 'the parked task was dropped' failed with nothing wrong.
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a = armed.clone();
    ex.spawn_on(1, move || async move {
        let _c = CountDrop(d);
        let mut s = Box::pin(xtc_shards::time::sleep(Duration::from_secs(30)));
        let w = drop_panicking_waker();
        assert!(poll_caught(s.as_mut(), &w).unwrap(), "pending");
        std::mem::forget(w);
        a.store(true, SeqCst);
        std::future::pending::<()>().await;
    })
    .unwrap();
    ex.spawn_on(0, move || async move {
        sleep_until(|| armed.load(SeqCst)).await;
        xtc_shards::stop();
    })
    .unwrap();
    let dog = Watchdog::new(ex.handle(), HANG, "a stop with a panicking waker drop");
    let r = ex.run();
    dog.done();
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(dropped.load(SeqCst), 1, "the parked task was dropped");
}

/// An executor dropped inside a task of another one frees its queued tasks without counting
/// them as run on the loop that happens to run the drop: they counted there
/// (`LoopStats::tasks_run` 11 instead of 1 here).
#[test]
fn another_executors_queued_tasks_dropped_on_a_loop_do_not_count_there() {
    let a = exec(1);
    a.spawn_on(0, || async {
        let b = exec(1);
        for _ in 0..10 {
            b.spawn_on(0, || async {}).unwrap();
        }
        drop(b);
    })
    .unwrap();
    let dog = Watchdog::new(a.handle(), HANG, "a run dropping another executor");
    a.run().unwrap();
    dog.done();
    let st = a.loop_stats(0).unwrap();
    assert_eq!(st.tasks_run, 1, "{st:?}");
}

/// Panics in its `Drop` (what a stall callback captured).
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("a stall callback's captured state panicked in its drop");
    }
}

/// A stall callback whose captured state panics when dropped does not keep the executor from
/// dropping the other loops' callbacks: that panic unwound out of the `Executor`'s drop, and
/// the callback of loop 1, holding a `Handle`, kept the whole executor alive in a cycle.
#[test]
fn a_stall_callback_whose_drop_panics_does_not_leak_the_others() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let ex = exec(2);
    let bomb = PanicOnDrop;
    ex.set_stall_callback(0, move |_| {
        let _keep = &bomb;
    })
    .unwrap();
    let (handle, guard) = (ex.handle(), DropCount(dropped.clone()));
    ex.set_stall_callback(1, move |_| {
        let _keep = (&handle, &guard);
    })
    .unwrap();
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(ex)));
    assert!(
        out.is_ok(),
        "the callback's panic unwound out of the executor's drop"
    );
    assert_eq!(
        dropped.load(SeqCst),
        1,
        "loop 1's callback (and the executor it kept alive) leaked"
    );
}

/// The `Drop` of a parked migratable task of executor A, run by A's `run()` after its loops
/// stopped, runs executor B (a nested `run()`), whose own stop drops B's parked task on this
/// same thread; that task's `Drop` spawns on A. It is a spawn from A's stopped run's drops, as
/// much as one made by the outer `Drop` itself: refused. B's marker replaced A's, so it was
/// accepted and ran in A's next, unrelated run.
#[test]
fn a_spawn_on_a_from_a_nested_run_inside_a_discarding_drop_of_a_is_refused() {
    /// Spawns on A when dropped; records whether the spawn was accepted.
    struct SpawnOnA(Arc<AtomicUsize>, xtc_shards::Handle, Arc<AtomicUsize>);
    impl Drop for SpawnOnA {
        fn drop(&mut self) {
            let r = self.0.clone();
            if self
                .1
                .spawn_on(0, move || async move {
                    r.fetch_add(1, SeqCst);
                })
                .is_ok()
            {
                self.2.fetch_add(1, SeqCst);
            }
        }
    }
    /// Runs B (until its own stop) when dropped, on the dropping thread.
    struct RunB(Option<Executor>);
    impl Drop for RunB {
        fn drop(&mut self) {
            // On this thread (the outer `run_within` guards against a hang).
            let b = self.0.take().expect("present");
            b.run().unwrap();
        }
    }
    let ran = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = exec(2);
    let b = exec(2);
    // Each executor stops once its migratable task has been polled (parked): a fixed 20 ms
    // sleep stood for that, which a loaded machine outlasts. A task not yet polled at the
    // stop is dropped by a stopping loop instead, on that loop's thread (B's: its spawn on A
    // is then one from an unrelated thread, accepted, and runs in A's next run).
    let (b_parked, a_parked) = (
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let spawn_on_a = SpawnOnA(ran.clone(), a.handle(), accepted.clone());
    let p = b_parked.clone();
    b.spawn(async move {
        let _g = spawn_on_a;
        p.store(true, SeqCst);
        std::future::pending::<()>().await
    });
    let (hb, f) = (b.handle(), b_parked.clone());
    b.spawn_on(1, move || async move { stop_once(&hb, &f).await })
        .unwrap();
    let run_b = RunB(Some(b));
    let p = a_parked.clone();
    a.spawn(async move {
        let _g = run_b;
        p.store(true, SeqCst);
        std::future::pending::<()>().await
    });
    let (ha, f) = (a.handle(), a_parked.clone());
    a.spawn_on(1, move || async move { stop_once(&ha, &f).await })
        .unwrap();
    run_within(&a, HANG)
        .expect("run() hung: A's stopped run")
        .unwrap();
    run_within(&a, HANG)
        .expect("run() hung: A's next run")
        .unwrap();
    assert_eq!(
        (accepted.load(SeqCst), ran.load(SeqCst)),
        (0, 0),
        "a spawn from A's stopped run's drops (in a nested run) was accepted / ran later"
    );
}

/// The same for a `LocalExecutor`: a parked migratable task is dropped after its loop stopped,
/// on the thread in `block_on` (`drop_migratable`); a `Drop` of its that spawns through a
/// `Handle` is refused, as the spawns of the drops its loop's shutdown runs are dropped. It
/// waited in the inbox and ran in the next, unrelated `block_on`.
#[test]
fn a_spawn_from_the_drop_of_a_parked_migratable_task_of_a_local_executor_does_not_run_later() {
    struct SpawnOnDrop(Arc<AtomicUsize>, xtc_shards::Handle);
    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            let r = self.0.clone();
            let _ = self.1.spawn_on(0, move || async move {
                r.fetch_add(1, SeqCst);
            });
        }
    }
    let ran = Arc::new(AtomicUsize::new(0));
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let r = ran.clone();
    ex.block_on(async move {
        let g = SpawnOnDrop(r, shard::handle().expect("on a loop"));
        drop(xtc_shards::spawn(async move {
            let _g = g;
            std::future::pending::<()>().await
        }));
        // Let it start and park.
        xtc_shards::time::sleep(Duration::from_millis(5)).await;
    });
    assert_eq!(
        ran.load(SeqCst),
        0,
        "the spawn ran during the first block_on"
    );
    ex.block_on(async {
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
    });
    assert_eq!(
        ran.load(SeqCst),
        0,
        "a spawn of the first block_on's drops ran in the next one"
    );
}

/// A `Drop` of a parked migratable task that `LocalExecutor::block_on` drops after its loop
/// stopped runs the same `LocalExecutor` again (a nested `block_on`, through a thread-local
/// runtime: a `Drop` that finishes its work synchronously). That nested run is live: a spawn
/// through a `Handle` in it is one of its own tasks, not one of the stopped run's drops, and
/// runs. The stopped run's `Discarding` marker stayed listed during it, so the spawn was
/// refused (`Err(Stopped)`).
#[test]
fn a_nested_block_on_of_the_same_local_executor_in_its_own_post_stop_drop_accepts_spawns() {
    type Out = Arc<Mutex<Option<Result<u32, String>>>>;
    thread_local! {
        static EX: xtc_shards::LocalExecutor = xtc_shards::LocalExecutor::new().unwrap();
    }
    struct BlockOnAgain(Out);
    impl Drop for BlockOnAgain {
        fn drop(&mut self) {
            let got = EX.with(|ex| {
                ex.block_on(async {
                    let h = shard::handle().expect("on a loop");
                    match h.spawn_on(0, || async { 7u32 }) {
                        Ok(j) => j.await.map_err(|e| format!("join: {e}")),
                        Err(e) => Err(format!("spawn_on: {e}")),
                    }
                })
            });
            *self.0.lock().unwrap() = Some(got);
        }
    }
    let out = Out::default();
    let o = out.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        EX.with(|ex| {
            ex.block_on(async move {
                let g = BlockOnAgain(o);
                drop(xtc_shards::spawn(async move {
                    let _g = g;
                    std::future::pending::<()>().await
                }));
                // Let it start and park.
                xtc_shards::time::sleep(Duration::from_millis(5)).await;
            })
        });
        let _ = tx.send(());
    });
    rx.recv_timeout(HANG).expect("block_on hung (or panicked)");
    let got = out.lock().unwrap().take().expect("the guard ran");
    assert_eq!(got, Ok(7), "a spawn in a live nested block_on was refused");
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

/// Records loop 0's published `messages_sent` when dropped.
struct SentWhenDropped(xtc_shards::Handle, Arc<Mutex<Option<u64>>>);

impl Drop for SentWhenDropped {
    fn drop(&mut self) {
        *self.1.lock().unwrap() = Some(self.0.loop_stats(0).unwrap().messages_sent);
    }
}

thread_local! {
    /// Set on shard 1's thread: dropped when that thread exits, after its loop has stopped
    /// and handed its ring ends back.
    static AT_THREAD_EXIT: std::cell::RefCell<Option<SetOnDrop>> =
        const { std::cell::RefCell::new(None) };
}

/// `messages_sent` is a total and never goes down. A loop's shutdown that handed what it had
/// sent over the ring to a loop already stopped over to that loop's inbox took those messages
/// off its published count (the balance the quiescence check needs), so a snapshot taken
/// after the run read less than one taken during it, and `later - earlier` underflowed.
#[test]
fn messages_sent_never_goes_down_when_a_stop_hands_ring_messages_over() {
    let ex = exec(2);
    let h = ex.handle();
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (g1, a1) = (gone.clone(), armed.clone());
    ex.spawn_on(1, move || async move {
        AT_THREAD_EXIT.with(|t| *t.borrow_mut() = Some(SetOnDrop(g1)));
        a1.store(true, SeqCst);
    })
    .unwrap();
    let during = Arc::new(Mutex::new(None));
    let d = during.clone();
    ex.spawn_on(0, move || async move {
        // Dropped by this loop's shutdown, after it handed the ring's content over.
        let snap = SentWhenDropped(h.clone(), d);
        spawn_local(async move {
            let _snap = snap;
            std::future::pending::<()>().await;
        });
        // Shard 1 has run its task: stopped before that (a fixed 1 ms here, which a loaded
        // machine outlasted), it dropped the task unrun and the wait below never ended.
        assert!(
            sleep_until(|| armed.load(SeqCst)).await,
            "shard 1 never ran its task"
        );
        h.stop();
        let limit = Instant::now() + HANG;
        while !gone.load(SeqCst) {
            assert!(Instant::now() < limit, "shard 1 never stopped");
            std::thread::yield_now();
        }
        // Over the ring to a loop that has stopped: handed over to its inbox at shutdown.
        for _ in 0..3 {
            h.spawn_on(1, || async {}).unwrap();
        }
    })
    .unwrap();
    run_or_fail_keep(&ex, "a stop with ring messages for a stopped loop");
    let during = during.lock().unwrap().expect("the parked task was dropped");
    let after = ex.loop_stats(0).unwrap().messages_sent;
    assert_eq!(during, 3, "the three spawns were counted as sent");
    assert!(
        after >= during,
        "messages_sent went down from {during} to {after}"
    );
    // The handed-over spawns run in the next run, which still ends (quiescence balances).
    run_or_fail_keep(&ex, "the run after");
    assert_eq!(ex.loop_stats(1).unwrap().tasks_run, 4);
}

/// Spawns a migratable task holding `1` on `0`'s executor when dropped; its handle goes to `2`.
struct SpawnOnDrop(
    xtc_shards::Handle,
    Option<CountDrop>,
    Arc<Mutex<Option<xtc_shards::JoinHandle<()>>>>,
);

impl Drop for SpawnOnDrop {
    fn drop(&mut self) {
        let guard = self.1.take();
        let j = self.0.spawn(async move {
            let _g = guard;
        });
        *self.2.lock().unwrap() = Some(j);
    }
}

/// A migratable spawn through the `Handle` of an executor already dropped is dropped at once,
/// also from the `Drop` of a task that another executor's drop sweeps. The sweeping thread
/// skipped the drop of what it had just queued for any executor (a guard against a sweep
/// recursing into itself, meant for the executor being swept): the task stayed in the dropped
/// executor's injector, its handle never resolved, and, holding a `Handle`, it leaked with
/// that executor.
#[test]
fn a_spawn_on_a_dropped_executor_from_a_drop_another_executors_drop_sweeps_is_dropped() {
    let b = exec(1);
    let hb = b.handle();
    drop(b);
    let drops = Arc::new(AtomicUsize::new(0));
    let handle = Arc::new(Mutex::new(None));
    let a = exec(1);
    let g = SpawnOnDrop(hb.clone(), Some(CountDrop(drops.clone())), handle.clone());
    a.spawn_on(0, move || {
        let _g = g;
        async {}
    })
    .unwrap();
    // A never-run task: swept (dropped) here, and its guard spawns on `b`.
    drop(a);
    assert_eq!(
        drops.load(SeqCst),
        1,
        "the task spawned on b was not dropped"
    );
    let j = handle.lock().unwrap().take().expect("the guard spawned");
    assert!(j.is_finished(), "its handle does not resolve");
    let e = futures::executor::block_on(j).unwrap_err();
    assert!(e.is_cancelled(), "{e:?}");
    drop(hb);
}

/// A spawn onto a peer that has stopped, made by a `Drop` that this loop's shutdown runs, is
/// dropped here, unrun (`ring::evacuate`): it counted as a task finished on this loop
/// (`LoopStats::tasks_run` 2 instead of 1), though it was the peer's and never ran here.
#[test]
fn a_peers_spawn_dropped_by_this_loops_shutdown_does_not_count_here() {
    use std::sync::atomic::AtomicBool;
    /// Sets its flag when dropped.
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    /// Spawns on shard 1 once shard 1 has dropped its task (and then had time to leave).
    struct SpawnOnDrop(Arc<AtomicBool>);
    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            let until = Instant::now() + Duration::from_secs(5);
            while !self.0.load(SeqCst) && Instant::now() < until {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(50));
            let h = shard::handle().unwrap();
            let _ = h.spawn_on(1, || async {});
        }
    }
    let ex = exec(2);
    let gone = Arc::new(AtomicBool::new(false));
    let g = gone.clone();
    ex.spawn_on(1, move || async move {
        let _flag = Flag(g);
        std::future::pending::<()>().await;
    })
    .unwrap();
    ex.spawn_on(0, move || async move {
        let _spawn = SpawnOnDrop(gone);
        // Shard 1's task is parked by now (a yield lets the other loop start).
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        shard::stop();
        std::future::pending::<()>().await;
    })
    .unwrap();
    run_within(&ex, HANG)
        .expect("run() hung: a spawn made by a shutdown's drop")
        .unwrap();
    let s0 = ex.loop_stats(0).unwrap();
    assert_eq!(s0.tasks_run, 1, "shard 0 ran one task: {s0:?}");
}

/// A `LocalExecutor`'s knobs, as its docs state them: it neither spins before parking nor
/// spins for replies (one loop: no peer to converse with), and it has no deadlock report (no
/// coordinator). The `Handle` docs stated 20 µs, 50 µs and 5 s as every executor's defaults,
/// and the `LocalExecutor` docs said nothing of it.
#[test]
fn local_executor_knobs_start_as_documented() {
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (spin, reply, grace) = ex.block_on(async {
        let h = xtc_shards::shard::handle().unwrap();
        (h.spin_before_park(), h.reply_spin(), h.deadlock_grace())
    });
    assert_eq!(spin, std::time::Duration::ZERO);
    assert_eq!(reply, std::time::Duration::ZERO);
    assert_eq!(grace, None);
}

/// Where a seccomp filter (systemd's `SystemCallFilter=~@resources`, a sandbox) refuses
/// `sched_setaffinity` with `EPERM`: a pinned run fails with an error that says to turn
/// pinning off, and a run with pinning off works, its shards left on the CPUs they inherited
/// (all allowed ones). Both failed before with "check the CPU is online and in this process's
/// cpuset": no executor on the real machine could run there at all.
#[cfg(target_arch = "x86_64")]
#[test]
fn pinning_refused_by_seccomp_is_reported_and_pin_false_still_runs() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mine = affinity();
        if !deny_syscall(libc::SYS_sched_setaffinity, libc::EPERM as u32) {
            let _ = tx.send(None);
            return;
        }
        let pinned = Executor::builder().shards(1).build().unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        pinned
            .spawn_on(0, move || async move {
                r.fetch_add(1, SeqCst);
            })
            .unwrap();
        let refused = run_within(&pinned, HANG).map(|r| r.map_err(|e| e.to_string()));
        let floating = Executor::builder().shards(1).pin(false).build().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        floating
            .spawn_on(0, move || async move {
                *s.lock().unwrap() = affinity();
            })
            .unwrap();
        let floated = run_within(&floating, HANG).map(|r| r.map_err(|e| e.to_string()));
        let seen = seen.lock().unwrap().clone();
        let _ = tx.send(Some((refused, ran.load(SeqCst), floated, seen, mine)));
    });
    let Some((refused, ran, floated, seen, mine)) =
        rx.recv_timeout(HANG * 3).expect("the runs hung")
    else {
        println!("no seccomp here; skipped");
        return;
    };
    let e = refused.expect("the pinned run hung").unwrap_err();
    assert!(
        e.contains("pin(false)") && e.contains("XTC_PIN=0"),
        "the error says to turn pinning off: {e}"
    );
    assert_eq!(ran, 0, "a run that failed to start runs nothing");
    assert_eq!(floated.expect("the floating run hung"), Ok(()));
    assert_eq!(seen, mine, "the shard kept the CPUs it inherited");
}

/// Dropped slowly (a 200 µs sleep), counting its drop: the body of the spawns below, which a
/// stopping loop drops more slowly than foreign threads make them.
struct SlowDrop(Arc<AtomicUsize>);

impl Drop for SlowDrop {
    fn drop(&mut self) {
        std::thread::sleep(Duration::from_micros(200));
        self.0.fetch_add(1, SeqCst);
    }
}

/// Three plain threads spawn (pinned with `spawn_on`, or migratable with `spawn`) in a tight
/// loop, each spawn's closure or future holding a [`SlowDrop`], while a
/// fourth thread stops the service run. The stopping loops' shutdown drained the inbox (and
/// the injector) until it found it empty, which the spawners never let happen, and so did
/// `run()`'s drop of a parked migratable task (and the drain that a spawn from its `Drop`
/// starts): `run()` never returned while they spawned. It returns now; every spawn that raced the stop was dropped
/// (its handle reports cancelled) or kept for the next run, which runs it; nothing leaks.
fn a_stop_ends_while_plain_threads_keep_spawning(migratable: bool) {
    // Spawns made but not dropped yet, at most: the spawners keep up with the drops without
    // queueing without bound (the old code's endless drain would fill the memory). One shard,
    // so none of them waits on a loop that has left already (which holds them all up).
    const OUTSTANDING: usize = 256;
    let ex = exec(1);
    ex.set_service_mode(true);
    let dropped = Arc::new(AtomicUsize::new(0));
    let spawned = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(std::sync::atomic::AtomicBool::new(true));
    /// Spawns a migratable [`SlowDrop`] through its `Handle` when dropped.
    struct Respawn(xtc_shards::Handle, Arc<AtomicUsize>, Arc<AtomicUsize>);
    impl Drop for Respawn {
        fn drop(&mut self) {
            self.2.fetch_add(1, SeqCst);
            let g = SlowDrop(self.1.clone());
            drop(self.0.spawn(async move { drop(g) }));
        }
    }
    // A migratable task parked through the stop: `run()` drops it after the loops stopped,
    // draining the injectors the spawners fill, and its drop's spawn drains them again.
    let parked = migratable.then(|| {
        let g = SlowDrop(dropped.clone());
        let again = Respawn(ex.handle(), dropped.clone(), spawned.clone());
        spawned.fetch_add(1, SeqCst);
        ex.spawn(async move {
            let _g = (g, again);
            std::future::pending::<()>().await
        })
    });
    // The spawners give up after this, so a hang fails the test instead of blocking it.
    let give_up = Instant::now() + Duration::from_secs(25);
    let spawners: Vec<_> = (0..3)
        .map(|_| {
            let (h, dropped, spawned, go) =
                (ex.handle(), dropped.clone(), spawned.clone(), go.clone());
            std::thread::spawn(move || {
                let mut handles = Vec::new();
                while go.load(SeqCst) && Instant::now() < give_up {
                    if spawned.load(SeqCst).saturating_sub(dropped.load(SeqCst)) >= OUTSTANDING {
                        std::thread::yield_now();
                        continue;
                    }
                    spawned.fetch_add(1, SeqCst);
                    let g = SlowDrop(dropped.clone());
                    if migratable {
                        handles.push(h.spawn(async move { drop(g) }));
                    } else {
                        let j = h.spawn_on(0, move || async move { drop(g) });
                        handles.push(j.expect("the executor is alive"));
                    }
                }
                handles
            })
        })
        .collect();
    let h = ex.handle();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        h.stop();
    });
    let ran = run_within(&ex, Duration::from_secs(20));
    go.store(false, SeqCst);
    stopper.join().unwrap();
    let handles: Vec<_> = spawners
        .into_iter()
        .flat_map(|s| s.join().unwrap())
        .collect();
    ran.expect("run() hung: a stop while plain threads kept spawning")
        .unwrap();
    // What the stop kept runs in the next run (to quiescence now).
    ex.set_service_mode(false);
    run_within(&ex, HANG)
        .expect("run() hung: the run after the stop")
        .unwrap();
    drop(ex);
    let mut outcomes = (0, 0);
    for j in handles.into_iter().chain(parked) {
        assert!(j.is_finished(), "a handle was left unresolved");
        match futures::executor::block_on(j) {
            Ok(()) => outcomes.0 += 1,
            Err(e) => {
                assert!(e.is_cancelled(), "{e:?}");
                outcomes.1 += 1;
            }
        }
    }
    assert_eq!(
        dropped.load(SeqCst),
        spawned.load(SeqCst),
        "a spawn leaked (ran, cancelled: {outcomes:?})"
    );
}

#[test]
fn a_stop_ends_while_plain_threads_keep_spawning_pinned_tasks() {
    a_stop_ends_while_plain_threads_keep_spawning(false);
}

#[test]
fn a_stop_ends_while_plain_threads_keep_spawning_migratable_tasks() {
    a_stop_ends_while_plain_threads_keep_spawning(true);
}

/// Marks the executor whose shard 1 [`PanicOnTaggedShard`] makes panic, through a knob no other
/// test sets to these values (`min_tasks_to_steal`): at the trace event saying its loop started,
/// or at any warning or error on it.
const PANIC_AT_LOOP_START: usize = 0x5EED_0001;
const PANIC_AT_WARNINGS: usize = 0x5EED_0002;

/// A process-wide subscriber (a shard thread has no thread-local one) that panics only on shard
/// 1 of an executor tagged as above: as a subscriber that panics would, on that one thread.
struct PanicOnTaggedShard;

impl PanicOnTaggedShard {
    fn install() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            tracing::subscriber::set_global_default(PanicOnTaggedShard)
                .expect("no other global subscriber in this test binary");
        });
    }
}

impl tracing::Subscriber for PanicOnTaggedShard {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.is_event()
            && (*m.level() <= tracing::Level::WARN
                || m.file().is_some_and(|f| f.ends_with("executor/mod.rs")))
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        if shard::try_id() != Some(1) {
            return;
        }
        let Some(tag) = shard::handle().map(|h| h.min_tasks_to_steal()) else {
            return;
        };
        let mut message = Message(String::new());
        event.record(&mut message);
        let panics = match tag {
            PANIC_AT_LOOP_START => message.0 == "shard loop started",
            PANIC_AT_WARNINGS => *event.metadata().level() <= tracing::Level::WARN,
            _ => false,
        };
        if panics {
            panic!(
                "planted: the subscriber panics on shard 1's event {:?}",
                message.0
            );
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// After a run whose shard 1 thread died, the executor runs again: both loops run, and a call
/// crosses the rings both ways.
fn runs_again_after_a_dead_shard_thread(ex: &Executor) {
    ex.set_min_tasks_to_steal(0);
    let j = ex
        .spawn_on(1, || async {
            shard::submit_to(0, || async { shard::id() + 7 })
                .await
                .unwrap()
        })
        .unwrap();
    run_within(ex, HANG)
        .expect("run() hung: the run after the dead shard thread")
        .unwrap();
    assert_eq!(futures::executor::block_on(j).unwrap(), 7);
}

/// A shard thread that dies after the start gate opened but before its loop's guarded part
/// (a panic in the tracing subscriber handling its "shard loop started" event: planted here)
/// stops the run, so `run()` returns and reports it. It waited for good: that loop never ran,
/// its status stayed BUSY, so the executor never looked quiescent, and nothing asked a stop.
#[test]
fn a_shard_thread_dying_before_its_loop_runs_stops_the_run() {
    PanicOnTaggedShard::install();
    let ex = exec(2);
    ex.set_min_tasks_to_steal(PANIC_AT_LOOP_START);
    for s in 0..2 {
        ex.spawn_on(s, || async {}).unwrap();
    }
    let ran = run_within(&ex, Duration::from_secs(30))
        .expect("run() hung: shard 1's thread died before its loop ran");
    // Reported as what it is (it read "invalid argument: a shard thread panicked ..."), with
    // where to find the panic's message.
    assert!(
        matches!(ran, Err(Error::ShardPanicked(_))),
        "the dead shard thread was not reported as such: {ran:?}"
    );
    let msg = ran.unwrap_err().to_string();
    assert!(msg.contains("log"), "{msg}");
    runs_again_after_a_dead_shard_thread(&ex);
}

/// A loop that panics (here the subscriber panics on the loop's stall warning) stops the run
/// even if logging that panic panics too (the same subscriber, on the error event). The
/// worker logged before it asked the stop: that second panic left the thread without asking
/// it, and `run()` waited for good on a loop that was gone.
#[test]
fn a_shard_loop_panic_whose_error_log_panics_still_stops_the_run() {
    PanicOnTaggedShard::install();
    let ex = exec(2);
    ex.set_min_tasks_to_steal(PANIC_AT_WARNINGS);
    ex.set_loop_stall_budget(1, Duration::from_millis(1))
        .unwrap();
    ex.spawn_on(0, || xtc_shards::time::sleep(Duration::from_millis(10)))
        .unwrap();
    ex.spawn_on(1, || async {
        // Over the budget: the poll's end reports it, and the report panics.
        burn(Duration::from_millis(5));
        xtc_shards::yield_now().await;
    })
    .unwrap();
    let ran = run_within(&ex, Duration::from_secs(30))
        .expect("run() hung: shard 1's loop panicked, and so did its error log");
    assert!(
        matches!(ran, Err(Error::ShardPanicked(_))),
        "the loop's panic was not reported as such: {ran:?}"
    );
    ex.set_loop_stall_budget(1, Duration::ZERO).unwrap();
    runs_again_after_a_dead_shard_thread(&ex);
}

/// A class created through a `Handle` after its `Executor` was dropped is refused, as a
/// `spawn_on` is: it was made (its memory never freed) for no run to use.
#[test]
fn create_class_after_the_executor_dropped_is_stopped() {
    let ex = exec(1);
    let h = ex.handle();
    assert!(h.create_class(0, 100, None).is_ok(), "while it lives");
    drop(ex);
    assert!(
        matches!(h.create_class(0, 100, None), Err(Error::Stopped)),
        "after the drop"
    );
}

/// Every shard thread runs with a 1 µs timer slack (`sys::set_timer_slack_ns`), not the
/// default 50 µs, so a loop parked until a timer deadline wakes within microseconds of it:
/// the `sleep(1ms)` overshoot goal rests on it. Read back with `PR_GET_TIMERSLACK` on each
/// shard of an oversubscribed executor.
#[test]
fn shard_threads_run_with_a_one_microsecond_timer_slack() {
    // xtc goes on without the lower slack where `prctl` is refused (a seccomp filter): there
    // is nothing to check then.
    // SAFETY: PR_GET_TIMERSLACK and PR_SET_TIMERSLACK take one integer argument at most and
    // touch no memory of ours; the test thread's own slack is set back to what it was.
    let refused = unsafe {
        let mine = libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0);
        mine < 0 || libc::prctl(libc::PR_SET_TIMERSLACK, mine as libc::c_ulong, 0, 0, 0) != 0
    };
    if refused {
        println!("prctl(PR_SET_TIMERSLACK) is refused here: skipped");
        return;
    }
    let ex = Executor::builder()
        .shards(3)
        .oversubscribe(true)
        .build()
        .unwrap();
    let slacks = ex
        .block_on(|| async {
            xtc_shards::shard::submit_to_all(|| async {
                // SAFETY: PR_GET_TIMERSLACK takes no argument, touches no memory of ours and
                // returns the calling thread's slack in nanoseconds.
                unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) }
            })
            .await
        })
        .unwrap();
    let slacks: Vec<i32> = slacks.into_iter().map(|s| s.unwrap()).collect();
    assert_eq!(
        slacks,
        vec![1_000; 3],
        "each shard thread's timer slack, in ns"
    );
}

/// Inside a task, `shard::cpu()` and `shard::numa_node()` read the current shard's entry of
/// the executor's placement, which a `Handle` gives too (from any thread); on a two-socket,
/// four-node synthetic topology with `spread`, consecutive shards alternate between the
/// sockets, so both answers vary. Off any loop, and in a `LocalExecutor`, all are `None`.
#[test]
fn a_task_reads_its_shards_cpu_and_numa_node() {
    let topo = xtc_numa::Topology::synthetic("pack:2 numa:2 core:4 pu:2").unwrap();
    let ex = Executor::builder()
        .shards(8)
        .oversubscribe(true)
        .placement(xtc_numa::Policy::Spread)
        .topology(topo)
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    for i in 0..ex.shard_count() {
        let seen = seen.clone();
        ex.spawn_on(i, move || async move {
            seen.lock()
                .unwrap()
                .push((shard::id(), shard::cpu(), shard::numa_node()));
        })
        .unwrap();
    }
    ex.run().unwrap();
    let placement = ex
        .handle()
        .placement()
        .cloned()
        .expect("an Executor's handle");
    assert_eq!(placement.cpus(), ex.placement().cpus());
    let mut seen = std::mem::take(&mut *seen.lock().unwrap());
    seen.sort();
    let want: Vec<_> = (0..8)
        .map(|s| (s, placement.cpu(s), placement.numa_node(s)))
        .collect();
    assert_eq!(seen, want);
    let nodes: std::collections::BTreeSet<_> = seen.iter().map(|&(_, _, n)| n).collect();
    assert!(
        nodes.len() > 1 && !nodes.contains(&None),
        "every shard has a node, and they differ: {seen:?}"
    );
    assert_eq!((shard::cpu(), shard::numa_node()), (None, None));
    let local = xtc_shards::LocalExecutor::new().unwrap();
    assert_eq!(
        local.block_on(async {
            let placed = shard::handle().expect("on a loop").placement().is_some();
            (shard::cpu(), shard::numa_node(), placed)
        }),
        (None, None, false)
    );
}
