//! xtc::time: sleep, sleep_until, timeout, interval; timer cancellation and quiescence.

mod common;
use common::panicking_waker;

use std::{
    pin::Pin,
    sync::mpsc,
    time::{Duration, Instant},
};

use xtc_shards::{spawn_local, time, Executor, LocalExecutor};

#[test]
fn sleep_waits_at_least_its_duration() {
    LocalExecutor::new().unwrap().block_on(async {
        for ms in [0u64, 1, 5, 20] {
            let t = Instant::now();
            time::sleep(Duration::from_millis(ms)).await;
            assert!(t.elapsed() >= Duration::from_millis(ms));
        }
    });
}

/// Sleeps registered out of order, with deadlines from one shared base, complete in deadline
/// order, also when the loop comes late and finds several due at once.
#[test]
fn sleeps_fire_in_deadline_order() {
    // A sleep whose deadline already passed at its first poll completes there, in spawn order:
    // such a round (this thread descheduled past the first deadline) proves nothing, and is
    // run again.
    for _ in 0..20 {
        let (order, all_registered) = LocalExecutor::new().unwrap().block_on(async {
            let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let registered = std::rc::Rc::new(std::cell::Cell::new(0));
            let base = Instant::now() + Duration::from_millis(20);
            let mut hs = Vec::new();
            for ms in [30u64, 10, 20, 0, 15] {
                let (o, r) = (order.clone(), registered.clone());
                hs.push(spawn_local(async move {
                    let mut s = Box::pin(time::sleep_until(base + Duration::from_millis(ms)));
                    if futures::poll!(s.as_mut()).is_pending() {
                        r.set(r.get() + 1);
                        s.await;
                    }
                    o.borrow_mut().push(ms);
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
            let v = order.borrow().clone();
            (v, registered.get() == 5)
        });
        if all_registered {
            assert_eq!(order, vec![0, 10, 15, 20, 30]);
            return;
        }
        println!("a deadline passed before every sleep was registered: again");
    }
    panic!("in 20 rounds, never were all five sleeps registered before the first deadline");
}

#[test]
fn timeout_elapses_and_cancels_its_timer() {
    let ex = Executor::builder().shards(1).build().unwrap();
    let h = ex
        .spawn_on(0, || async {
            let r = time::timeout(Duration::from_millis(10), std::future::pending::<()>()).await;
            assert!(r.is_err());
            assert_eq!(r.unwrap_err().to_string(), "deadline has elapsed");
            // Pending at its first poll (which registers the timer), it completes first: its
            // hour-long timer is cancelled, and run() need not wait for it. Kept, the timer
            // holds run() for the hour, far past the hang guard, so that fails for certain.
            time::timeout(Duration::from_secs(3600), async {
                xtc_shards::yield_now().await;
                3
            })
            .await
            .unwrap()
        })
        .unwrap();
    common::run_within(&ex, common::HANG)
        .expect("cancelled timer kept run() alive")
        .unwrap();
    assert_eq!(futures::executor::block_on(h).unwrap(), 3);
}

#[test]
fn dropped_sleep_does_not_hold_quiescence() {
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .build()
        .unwrap();
    // Hour-long sleeps: a dropped one whose timer stayed would hold run() far past the hang
    // guard, so the bug fails for certain, with no race against a clock.
    ex.spawn_on(1, || async {
        let s = time::sleep(Duration::from_secs(3600));
        drop(s);
        let mut s = Box::pin(time::sleep(Duration::from_secs(3600)));
        // Register it, then drop it while pending.
        let _ = futures::poll!(s.as_mut());
        drop(s);
    })
    .unwrap();
    common::run_or_fail(ex, common::HANG, "a dropped sleep's timer held quiescence").unwrap();
}

/// Ticks come at `first + k·period` for growing `k`, never before their instant; a tick is
/// skipped only when the loop came too late for it (tokio's `MissedTickBehavior::Skip`): the
/// next tick is the first multiple after the late tick was taken, not a burst of the missed
/// ones, nor one further than that.
#[test]
fn interval_ticks_on_schedule() {
    const P: Duration = Duration::from_millis(10);
    LocalExecutor::new().unwrap().block_on(async {
        let start = Instant::now();
        let mut iv = time::interval(P);
        let first = iv.tick().await;
        assert!(first >= start && first <= Instant::now());
        let (mut k, mut asked, mut taken) = (0u32, start, Instant::now());
        while k < 5 {
            let before = Instant::now();
            let t = iv.tick().await;
            let after = Instant::now();
            let since = t.duration_since(first);
            assert_eq!(
                since.as_nanos() % P.as_nanos(),
                0,
                "off the schedule: {since:?}"
            );
            let next = u32::try_from(since.as_nanos() / P.as_nanos()).unwrap();
            assert!(next > k, "tick {next} after tick {k}");
            assert!(after >= t, "tick {next} came {:?} early", t - after);
            if next > k + 1 {
                // Skipped: the previous tick was taken after the skipped ones were due...
                assert!(
                    taken >= first + P * (next - 1),
                    "tick {} skipped while not yet due",
                    next - 1
                );
            }
            // ...and the next one is the first due after that.
            assert!(t > asked, "tick {next} was due before tick {k} was taken");
            (k, asked, taken) = (next, before, after);
        }
        assert!(start.elapsed() >= P * 5);
    });
}

#[test]
fn interval_skips_missed_ticks() {
    const P: Duration = Duration::from_millis(10);
    LocalExecutor::new().unwrap().block_on(async {
        let mut iv = time::interval(P);
        let first = iv.tick().await;
        std::thread::sleep(Duration::from_millis(35)); // block the loop past 3 ticks
        let t = iv.tick().await; // the overdue tick at +10 fires at once
        let taken = Instant::now();
        assert_eq!(t, first + P);
        // Then the first multiple after the late tick was taken (+40 unless this thread was
        // descheduled longer): the missed +20 and +30 are skipped, not fired in a burst.
        let t2 = iv.tick().await;
        let since = t2.duration_since(first);
        assert_eq!(
            since.as_nanos() % P.as_nanos(),
            0,
            "off the schedule: {since:?}"
        );
        assert!(since >= P * 4, "a missed tick fired: +{since:?}");
        assert!(
            t2 - P <= taken,
            "skipped a tick that was not due yet: +{since:?}"
        );
    });
}

/// A sleep whose deadline has passed is ready at its first poll: checked without awaiting it,
/// so a sleep that waited instead fails here rather than hanging the test.
#[test]
fn sleep_until_past_deadline_is_ready() {
    LocalExecutor::new().unwrap().block_on(async {
        let mut s = Box::pin(time::sleep_until(Instant::now() - Duration::from_millis(1)));
        assert!(
            futures::poll!(s.as_mut()).is_ready(),
            "a sleep whose deadline passed waited"
        );
    });
}

/// Sleeps whose deadlines have passed complete at once, but a loop of them lets the loop turn
/// (another task runs, a due timer fires) before it ends: such a task (a rate loop fallen
/// behind, `sleep(ZERO)` in a loop) never returned `Pending` and held its loop for good.
#[test]
fn a_loop_of_passed_sleeps_lets_the_loop_turn() {
    LocalExecutor::new().unwrap().block_on(async {
        let due = Instant::now();
        common::turns_during("passed sleeps", 1000, async |i| {
            if i % 2 == 0 {
                time::sleep(Duration::ZERO).await;
            } else {
                time::sleep_until(due).await;
            }
        })
        .await;
    });
}

/// Called by a task on shard 0 in the poll in which it starts to wait (about to return
/// `Pending`): records in `waiting` the park of shard 0 that follows (its count now, plus one),
/// which [`until_waiting_on_shard_0`] waits for.
fn mark_waiting_on_shard_0(waiting: &std::sync::atomic::AtomicU64) {
    let parks = xtc_shards::shard::handle()
        .unwrap()
        .loop_stats(0)
        .unwrap()
        .parks;
    waiting.store(parks + 1, std::sync::atomic::Ordering::SeqCst);
}

/// Inside a task on shard 1: waits until the task that called [`mark_waiting_on_shard_0`] has
/// returned `Pending`, which shard 0's next park shows (a loop does not park in the middle of
/// a poll). Only a task that waits moves to the loop that wakes it (steal rule 1): woken while
/// still in its poll, or before it started to wait, it stays on shard 0, which a sender that
/// only slept "long enough" could not rule out on a loaded machine.
async fn until_waiting_on_shard_0(waiting: &std::sync::atomic::AtomicU64) {
    let h = xtc_shards::shard::handle().unwrap();
    let waits = common::sleep_until(|| {
        let after = waiting.load(std::sync::atomic::Ordering::SeqCst);
        after != 0 && h.loop_stats(0).unwrap().parks >= after
    })
    .await;
    assert!(waits, "the task on shard 0 never started to wait");
}

/// A migratable task registers a long timeout on one loop, is woken by a sender on the other
/// loop (so it moves there, steal rule 1) and finishes there. Its timer must not keep the first
/// loop waiting: `run()` returns at quiescence, not at the deadline, an hour away (so a timer
/// left behind holds `run()` past the hang guard, for certain).
#[test]
fn a_moved_sleep_does_not_hold_quiescence_on_its_old_loop() {
    use std::sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst},
        Arc,
    };
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .build()
        .unwrap();
    let (mut tx, mut rx) = xtc_shards::channel::shared::bounded::<u32>(1).unwrap();
    let shards = Arc::new([AtomicUsize::new(9), AtomicUsize::new(9)]);
    let seen = shards.clone();
    let waiting = Arc::new(AtomicU64::new(0));
    let w = waiting.clone();
    ex.spawn_on(0, move || async move {
        // Migratable, placed on this loop (shard 0), where it registers the timeout's timer.
        let waiter = xtc_shards::spawn(async move {
            seen[0].store(xtc_shards::shard::id(), SeqCst);
            let mut got = Box::pin(time::timeout(Duration::from_secs(3600), rx.recv()));
            assert!(
                futures::poll!(got.as_mut()).is_pending(),
                "nothing sent yet"
            );
            mark_waiting_on_shard_0(&w);
            let got = got.await;
            seen[1].store(xtc_shards::shard::id(), SeqCst);
            got
        });
        assert_eq!(waiter.await.unwrap(), Ok(Some(7)));
    })
    .unwrap();
    ex.spawn_on(1, move || async move {
        until_waiting_on_shard_0(&waiting).await;
        tx.send(7).await.unwrap();
    })
    .unwrap();
    common::run_or_fail(ex, common::HANG, "the moved task's timer held its old loop").unwrap();
    let (before, after) = (shards[0].load(SeqCst), shards[1].load(SeqCst));
    assert_eq!(
        (before, after),
        (0, 1),
        "the task was meant to move from shard 0 to 1"
    );
}

/// Durations too long for an `Instant` are far-future deadlines, not panics.
#[test]
fn huge_durations_do_not_panic() {
    LocalExecutor::new().unwrap().block_on(async {
        assert_eq!(time::timeout(Duration::MAX, async { 5 }).await, Ok(5));
        let mut s = Box::pin(time::sleep(Duration::MAX));
        assert!(futures::poll!(s.as_mut()).is_pending());
        assert!(s.deadline() > Instant::now() + Duration::from_secs(86_400 * 365));
        drop(s);
        let mut every = time::interval(Duration::MAX);
        every.tick().await; // the first tick is at once
        let mut next = Box::pin(every.tick());
        assert!(futures::poll!(next.as_mut()).is_pending());
    });
}

#[test]
fn a_sleep_polled_in_one_run_still_waits_in_the_next() {
    // The first run's timers go with that run; the sleep registers again in the second one
    // instead of taking the missing timer for a fired one.
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let started = Instant::now();
    // The first run hands the polled sleep back (`block_on` takes `'static` futures).
    #[allow(clippy::async_yields_async)]
    let sleep = ex.block_on(async {
        let mut s = Box::pin(time::sleep(Duration::from_millis(300)));
        assert!(futures::poll!(s.as_mut()).is_pending());
        s
    });
    ex.block_on(sleep);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "woke after {took:?}");
}

#[test]
fn a_panicking_waker_of_a_timer_does_not_take_its_loop_down() {
    use std::{future::Future, task::Context};
    let ex = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .build()
        .unwrap();
    let after = ex
        .spawn_on(0, || async {
            let mut s = Box::pin(time::sleep(Duration::from_millis(10)));
            let waker = panicking_waker();
            assert!(s
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            // The timer fires while this task sleeps longer: the loop wakes the panicking
            // waker and must go on.
            time::sleep(Duration::from_millis(50)).await;
            drop(s);
            7
        })
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || tx.send(ex.run()).unwrap());
    let ran = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("run() hung after a waker panicked");
    runner.join().unwrap();
    ran.unwrap();
    assert_eq!(futures::executor::block_on(after).unwrap(), 7);
}

/// Waits until the task is woken, without polling anything that could register a wake-up:
/// only a waker registered earlier can end this wait.
async fn next_wake() {
    let mut first = true;
    std::future::poll_fn(|_| {
        if std::mem::take(&mut first) {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await
}

/// As in tokio, a reset sleep keeps its task's wake-up: the task is woken at the new deadline
/// (or at once, for one that passed) without polling the sleep again first, as a sleep in a
/// `FuturesUnordered` reset from another branch needs. The old reset dropped the waker: the
/// task slept forever and `run()` reported a deadlock.
#[test]
fn a_reset_sleep_wakes_its_task_without_a_new_poll() {
    for passed in [false, true] {
        let ex = common::exec(1);
        ex.spawn_on(0, move || async move {
            let mut s = Box::pin(time::sleep(Duration::from_secs(3600)));
            assert!(futures::poll!(s.as_mut()).is_pending());
            let at = if passed {
                Instant::now()
            } else {
                Instant::now() + Duration::from_millis(20)
            };
            s.as_mut().reset(at);
            next_wake().await;
            assert!(Instant::now() >= at);
            s.await;
        })
        .unwrap();
        common::run_or_fail(ex, common::HANG, "reset sleep").unwrap();
    }
}

/// The same after a migratable task moved to another loop since it polled the sleep: the old
/// loop, which holds the timer, wakes the task.
#[test]
fn a_sleep_reset_after_its_task_moved_wakes_it() {
    use std::sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc,
    };
    let ex = common::exec(2);
    let (mut tx, mut rx) = xtc_shards::channel::shared::bounded::<u32>(1).unwrap();
    let shards = Arc::new([AtomicUsize::new(9), AtomicUsize::new(9)]);
    let seen = shards.clone();
    let waiting = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let w = waiting.clone();
    ex.spawn_on(0, move || async move {
        let mover = xtc_shards::spawn(async move {
            let mut s = Box::pin(time::sleep(Duration::from_secs(3600)));
            assert!(futures::poll!(s.as_mut()).is_pending());
            seen[0].store(xtc_shards::shard::id(), SeqCst);
            // Woken from shard 1, the task moves there.
            let mut recv = Box::pin(rx.recv());
            assert!(
                futures::poll!(recv.as_mut()).is_pending(),
                "nothing sent yet"
            );
            mark_waiting_on_shard_0(&w);
            assert_eq!(recv.await, Some(7));
            seen[1].store(xtc_shards::shard::id(), SeqCst);
            s.as_mut().reset(Instant::now() + Duration::from_millis(20));
            next_wake().await;
            s.await;
        });
        mover.await.unwrap();
    })
    .unwrap();
    ex.spawn_on(1, move || async move {
        until_waiting_on_shard_0(&waiting).await;
        tx.send(7).await.unwrap();
    })
    .unwrap();
    common::run_or_fail(ex, common::HANG, "reset sleep of a moved task").unwrap();
    assert_eq!(
        (shards[0].load(SeqCst), shards[1].load(SeqCst)),
        (0, 1),
        "the task was meant to move from shard 0 to 1"
    );
}

/// A zero period, or one shorter than a loop turn, still lets the loop's other tasks run
/// between ticks. A zero period used to panic (as tokio's does), which the brief rules out for
/// user input; a tiny one never returned `Pending` (the skip of missed ticks scheduled a
/// deadline that had passed by the next poll), so the loop never ran its other task, nor saw
/// a stop. Each period runs on its own thread, so a hang fails the test.
#[test]
fn a_zero_or_tiny_period_still_lets_other_tasks_run() {
    for period in [0, 1, 10, 100, 1_000].map(Duration::from_nanos) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let seen = LocalExecutor::new().unwrap().block_on(async move {
                let other = std::rc::Rc::new(std::cell::Cell::new(0u32));
                let o = other.clone();
                let counter = spawn_local(async move {
                    for _ in 0..100 {
                        o.set(o.get() + 1);
                        xtc_shards::yield_now().await;
                    }
                });
                let mut iv = time::interval(period);
                let mut seen = Vec::new();
                for _ in 0..50 {
                    iv.tick().await;
                    seen.push(other.get());
                }
                counter.await.unwrap();
                seen
            });
            tx.send(seen).unwrap();
        });
        let seen = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("interval({period:?}) held its loop for good"));
        // Between two ticks the other task ran (until it was done): a tick that came due
        // before it was polled yielded first, one that waited let the loop run meanwhile.
        assert!(
            seen.windows(2).all(|w| w[1] > w[0] || w[0] == 100),
            "{period:?}: {seen:?}"
        );
    }
}

/// Polls `s` once, inside a task, so that its timer is registered on the current loop.
async fn register(s: &mut std::pin::Pin<Box<time::Sleep>>) {
    use std::future::Future as _;
    std::future::poll_fn(|cx| {
        assert!(s.as_mut().poll(cx).is_pending());
        std::task::Poll::Ready(())
    })
    .await;
}

/// Registers an hour-long sleep on shard 0 of a 1-shard executor, hands it to `dropper` (on its
/// own thread) and checks that `run()` returns at quiescence, within the hang guard and so long
/// before the sleep's deadline: the timer went with the sleep, wherever `dropper` dropped it.
/// A timer left behind holds `run()` for the hour, which the guard reports for certain.
fn sleep_dropped_elsewhere_does_not_hold_run(
    what: &str,
    dropper: impl FnOnce(std::sync::mpsc::Receiver<std::pin::Pin<Box<time::Sleep>>>) + Send + 'static,
) {
    let ex = common::exec(1);
    let (tx, rx) = std::sync::mpsc::channel();
    let dropper = std::thread::spawn(move || dropper(rx));
    ex.spawn_on(0, move || async move {
        let mut s = Box::pin(time::sleep(Duration::from_secs(3600)));
        register(&mut s).await;
        tx.send(s).unwrap();
    })
    .unwrap();
    common::run_or_fail(ex, common::HANG, what).unwrap();
    dropper.join().unwrap();
}

/// A sleep registered on shard 0 and dropped on a plain thread: its timer goes (the cancel is
/// sent to shard 0's inbox), so `run()` returns at quiescence. The cancel used to be skipped
/// off any loop, and `run()` waited for the dead timer's deadline.
#[test]
fn a_sleep_dropped_on_a_plain_thread_does_not_hold_run() {
    sleep_dropped_elsewhere_does_not_hold_run("a sleep dropped on a plain thread", |rx| {
        for s in rx {
            drop(s);
        }
    });
}

/// The same with the sleep dropped on a loop of another executor (a `LocalExecutor`), which
/// is a loop, but not one that may touch shard 0's timers.
#[test]
fn a_sleep_dropped_on_another_executors_loop_does_not_hold_run() {
    sleep_dropped_elsewhere_does_not_hold_run("a sleep dropped on another executor", |rx| {
        LocalExecutor::new().unwrap().block_on(async move {
            let s = rx.recv().unwrap();
            drop(s);
        })
    });
}

/// A sleep that outlives its executor is dropped later on a plain thread: nothing to cancel,
/// nothing queued, no panic. Only the last is checked: the loop a cancel could be queued on is
/// gone with the executor, and a `Handle` kept to look at its stats would keep the executor
/// alive, which is another case (`a_stop_inside_a_local_executor_is_not_kept` counts a cancel
/// taken by a live loop).
#[test]
fn a_sleep_dropped_after_its_executor_is_gone_is_harmless() {
    let out = LocalExecutor::new().unwrap().block_on(async {
        let mut s = Box::pin(time::sleep(Duration::from_secs(30)));
        register(&mut s).await;
        Some(s)
    });
    std::thread::spawn(move || drop(out)).join().unwrap();
}

/// A sleep re-polled with a new waker drops the old one after the timers' borrow: a custom
/// waker whose drop drops another registered `Sleep` of this loop borrows them again. It
/// panicked ("already borrowed").
#[test]
fn a_sleeps_replaced_waker_is_dropped_outside_the_timers_borrow() {
    use std::future::Future as _;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Wake, Waker};
    use xtc_shards::time::{sleep, Sleep};
    struct Holder {
        _other: Mutex<Option<std::pin::Pin<Box<Sleep>>>>,
    }
    impl Wake for Holder {
        fn wake(self: Arc<Self>) {}
    }
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let r = ex.block_on(async {
        xtc_shards::spawn_local(async {
            let mut other = Box::pin(sleep(Duration::from_secs(10)));
            let mut mine = Box::pin(sleep(Duration::from_secs(10)));
            std::future::poll_fn(|cx| {
                assert!(other.as_mut().poll(cx).is_pending()); // registered on this loop
                std::task::Poll::Ready(())
            })
            .await;
            let holder = Arc::new(Holder {
                _other: Mutex::new(Some(other)),
            });
            let custom = Waker::from(holder);
            assert!(mine
                .as_mut()
                .poll(&mut Context::from_waker(&custom))
                .is_pending());
            drop(custom); // the timer holds the last reference
                          // Re-polled with the task's waker: the custom one is replaced, and dropped.
            std::future::poll_fn(|cx| std::task::Poll::Ready(mine.as_mut().poll(cx).is_pending()))
                .await
        })
        .await
    });
    assert!(
        r.is_ok(),
        "the re-poll panicked: {:?}",
        r.err().and_then(|e| e.panic_message().map(str::to_string))
    );
}

thread_local! {
    /// A registered sleep of the current loop, for `dropping_waker`'s clone to drop.
    static HELD: std::cell::RefCell<Option<std::pin::Pin<Box<xtc_shards::time::Sleep>>>> =
        const { std::cell::RefCell::new(None) };
}

/// A waker whose clone is user code that drops the sleep in `HELD` (a `Sleep` of the same
/// loop, whose drop cancels its timer).
fn dropping_waker() -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable};
    fn clone(_: *const ()) -> RawWaker {
        drop(HELD.with(|h| h.borrow_mut().take()));
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    // SAFETY: every function of the vtable ignores the (null) data pointer, and does nothing
    // that a waker must not do (no wake-up is expected from this one).
    unsafe { std::task::Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

/// A sleep polled with a waker whose clone drops another sleep of this loop, first when it
/// registers its timer and then when it replaces the stored waker: the clone ran under the
/// timers' borrow, and the dropped sleep's cancel borrowed them again ("already borrowed").
#[test]
fn a_wakers_clone_that_drops_a_sleep_runs_outside_the_timers_borrow() {
    use std::future::Future as _;
    use std::task::Context;
    use xtc_shards::time::sleep;
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    ex.block_on(async {
        let hold = |mut s: std::pin::Pin<Box<xtc_shards::time::Sleep>>| {
            let waker = std::task::Waker::noop();
            assert!(s
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending());
            HELD.with(|h| *h.borrow_mut() = Some(s));
        };
        let waker = dropping_waker();
        // Registration.
        hold(Box::pin(sleep(Duration::from_secs(3600))));
        let mut mine = Box::pin(sleep(Duration::from_secs(3600)));
        assert!(mine
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()))
            .is_pending());
        let mut fresh = Box::pin(sleep(Duration::from_secs(3600)));
        assert!(fresh
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        assert!(HELD.with(|h| h.borrow().is_none()), "the clone ran");
        // Replacement of the stored (no-op) waker.
        hold(Box::pin(sleep(Duration::from_secs(3600))));
        assert!(mine
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        assert!(HELD.with(|h| h.borrow().is_none()), "the clone ran");
    });
}

/// An interval whose start lies centuries back (more missed periods than a `Duration` of
/// nanoseconds holds) still skips to the next tick after now. The skip was computed as a
/// distance from the start; it overflowed, and the second tick came 30 years later.
#[test]
fn an_interval_started_centuries_ago_ticks_within_a_period() {
    const P: Duration = Duration::from_millis(10);
    LocalExecutor::new().unwrap().block_on(async {
        let start = Instant::now() - Duration::from_secs(86_400 * 365 * 600);
        let mut iv = time::interval_at(start, P);
        // The second tick is due within a period of the first one's return: bounded by clock
        // reads on both sides of it, so a thread kept off its CPU (or Miri's pace) in between
        // cannot make a right answer look wrong.
        let before = Instant::now();
        assert_eq!(
            iv.tick().await,
            start,
            "the overdue first tick comes at once"
        );
        let after = Instant::now();
        // A hang guard only: the overflow put the second tick 30 years away.
        let second = time::timeout(common::HANG, iv.tick())
            .await
            .unwrap_or_else(|_| panic!("no second tick within {:?} (period {P:?})", common::HANG));
        assert!(
            second >= before && second <= after + P,
            "the second tick is {:?} after the first returned, not within a period",
            second.saturating_duration_since(after)
        );
    });
}

/// A sleep polled in one run of a loop and dropped in a much later run cancels nothing of that
/// run. Each run's timer generations came from a 24-bit process-wide counter, so run
/// `r + 2^24` reused run `r`'s range, and the old sleep's key matched the new run's first
/// timer: dropping it cancelled another task's sleep, which never woke. Generations now
/// continue per loop, in a `u64`. Takes about two minutes (2^24 `block_on`s), so it is not
/// part of the suite: `XTC_IO=epoll cargo test -p xtc-shards --test rt_timer -- --ignored
/// a_sleep_kept_from_a_run_2_24_runs_ago`.
#[test]
#[ignore = "about two minutes: 2^24 block_on calls"]
fn a_sleep_kept_from_a_run_2_24_runs_ago_cancels_nothing_of_a_later_run() {
    assert!(
        a_kept_sleep_dropped_later_cancels_nothing((1u64 << 24) - 1),
        "a 20 ms sleep never woke: an old run's sleep cancelled its timer"
    );
}

/// A sleep polled (its timer registered) in one `block_on` of a `LocalExecutor`, then
/// `runs_between` empty `block_on`s, then a `block_on` whose first timer is a 20 ms sleep
/// of another task, during which the old sleep is dropped: whether that sleep still woke (a
/// sleep whose timer the drop cancelled never wakes; the hang guard ends the wait).
fn a_kept_sleep_dropped_later_cancels_nothing(runs_between: u64) -> bool {
    let ex = LocalExecutor::new().unwrap();
    #[allow(clippy::async_yields_async)]
    let old = ex.block_on(async {
        let mut s = Box::pin(time::sleep(Duration::from_secs(3600)));
        assert!(futures::poll!(s.as_mut()).is_pending());
        s
    });
    for _ in 0..runs_between {
        ex.block_on(async {});
    }
    ex.block_on(async move {
        // Registers its timer (the run's first) and parks.
        let sleeper = spawn_local(time::sleep(Duration::from_millis(20)));
        xtc_shards::yield_now().await;
        drop(old);
        let limit = time::sleep(common::HANG);
        futures::pin_mut!(limit);
        matches!(
            futures::future::select(sleeper, limit).await,
            futures::future::Either::Left(_)
        )
    })
}

/// How many messages the `LocalExecutor`'s loop takes from its inbox once a sleep registered
/// there is dropped on another thread: one, the cancel that drop sends home (nothing else
/// sends to this loop's inbox meanwhile). Waited for, with the hang guard as the only bound: a
/// drop that sent no cancel leaves the count where it was. The sleep is an hour long, so it
/// cannot come due before the drop, however late a thread runs, and the drop must cancel it.
async fn cancels_sent_by_a_sleep_dropped_off_its_loop() -> u64 {
    let handle = xtc_shards::shard::handle().unwrap();
    let taken = || handle.loop_stats(0).unwrap().inbox_received;
    let before = taken();
    let mut s = Box::pin(time::sleep(Duration::from_secs(3600)));
    assert!(futures::poll!(s.as_mut()).is_pending());
    std::thread::spawn(move || drop(s)).join().unwrap();
    common::sleep_until(|| taken() > before).await;
    taken() - before
}

/// `xtc::stop()` inside a `LocalExecutor` does nothing (its `block_on` ends when its future
/// does), and leaves nothing behind: it used to set the executor's stop flag for good, so from
/// then on (that `block_on` and every later one) the loop looked stopping, and a sleep dropped
/// off the loop no longer sent its cancel: its timer stayed and fired for nothing.
#[test]
fn a_stop_inside_a_local_executor_is_not_kept() {
    let ex = LocalExecutor::new().unwrap();
    let same = ex.block_on(async {
        xtc_shards::stop();
        cancels_sent_by_a_sleep_dropped_off_its_loop().await
    });
    assert_eq!(
        same, 1,
        "a sleep dropped off the loop sent no cancel in the block_on that called stop()"
    );
    let later = ex.block_on(cancels_sent_by_a_sleep_dropped_off_its_loop());
    assert_eq!(
        later, 1,
        "a sleep dropped off the loop sent no cancel in a later block_on"
    );
}

/// A tick of a zero period already due when polled yields to the *loop*, as the docs say (a
/// loop turn per such tick): the turn ends, so a timer that came due meanwhile fires, and its
/// task runs, within a few ticks. It yielded to the run queue only: the loop went on with the
/// same batch of up to 128 polls, a tick each, before it looked at its timers (or its I/O and
/// inbox) again. Counted in ticks after the timer was seen due, not in time.
#[test]
fn a_due_tick_yields_to_the_loop_so_due_timers_fire_between_ticks() {
    LocalExecutor::new().unwrap().block_on(async {
        let mut worst = 0;
        for _ in 0..20 {
            let woke = std::rc::Rc::new(std::cell::Cell::new(false));
            let w = woke.clone();
            let deadline = Instant::now() + Duration::from_micros(200);
            let mut sleeper = Box::pin(time::sleep_until(deadline));
            if futures::poll!(sleeper.as_mut()).is_ready() {
                continue; // this thread was descheduled past the deadline: no timer to watch
            }
            let sleeper = spawn_local(async move {
                sleeper.await;
                w.set(true);
            });
            let mut iv = time::interval(Duration::ZERO);
            let mut due_at = None;
            let mut ticks = 0u64;
            while !woke.get() {
                iv.tick().await;
                ticks += 1;
                if due_at.is_none() && Instant::now() >= deadline {
                    due_at = Some(ticks);
                }
                assert!(ticks < 1_000_000, "the timer never fired");
            }
            sleeper.await.unwrap();
            if let Some(at) = due_at {
                worst = worst.max(ticks - at);
            }
        }
        assert!(
            worst <= 4,
            "a due timer waited {worst} ticks of a zero-period interval to fire"
        );
    });
}

/// A `timeout` whose future completed gives its timer up at once, not when the `Timeout` is
/// dropped: kept (a pinned `Timeout` awaited by reference, then held while the task waits on
/// something else), its hour-long timer kept the loop `WAITING`, so the task's deadlock below
/// went unreported for that hour (and the loop woke at the deadline for nothing).
#[test]
fn a_completed_timeout_releases_its_timer() {
    let ex = common::exec_with_grace(1, Duration::from_millis(200));
    ex.spawn_on(0, || async {
        // Pending at its first poll (which registers the timer), done at its second.
        let mut t = Box::pin(time::timeout(Duration::from_secs(3600), async {
            xtc_shards::yield_now().await;
            3
        }));
        assert_eq!(t.as_mut().await, Ok(3));
        // Deadlocked, still holding the completed timeout.
        std::future::pending::<()>().await;
        drop(t);
    })
    .unwrap();
    match common::run_within(&ex, Duration::from_secs(20)) {
        Some(Err(xtc_shards::Error::Deadlock { .. })) => {}
        Some(r) => panic!("expected a deadlock report, got {r:?}"),
        None => panic!("no deadlock report: the completed timeout's timer kept its loop waiting"),
    }
}

/// A sleep whose deadline has passed, polled on another loop than the one holding its timer
/// (which fired there meanwhile), sends no cancel home: there is nothing left to cancel, and
/// the cancel task cost that loop a task, and a wake-up if it was parked (the common case of a
/// migratable task woken by its timer and then stolen).
#[test]
fn a_sleep_due_when_it_moves_sends_no_cancel_home() {
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .build()
        .unwrap();
    ex.spawn_on(0, || async {
        let mut due = Box::pin(time::sleep(Duration::from_millis(1)));
        // Registers its timer on shard 0.
        assert!(futures::poll!(due.as_mut()).is_pending());
        // The timer fires meanwhile (waking this task once, for nothing).
        time::sleep(Duration::from_millis(20)).await;
        xtc_shards::shard::submit_to(1, move || due).await.unwrap();
    })
    .unwrap();
    common::run_within(&ex, common::HANG)
        .expect("run() hung")
        .unwrap();
    // Shard 0 finished its one task, and no cancel task after it.
    assert_eq!(ex.loop_stats(0).unwrap().tasks_run, 1);
}

/// A `timeout` whose future is ready at the poll where its deadline has passed gives the
/// future's output, as documented (and as tokio's does): the future is polled first. Here the
/// future registers no wake-up of its own and is ready from the deadline on, so the poll that
/// the timeout's own timer causes finds both done. A zero duration and a ready future: `Ok`.
#[test]
fn a_timeout_whose_future_is_ready_at_the_deadline_gives_its_output() {
    LocalExecutor::new().unwrap().block_on(async {
        assert_eq!(time::timeout(Duration::ZERO, async { 1 }).await, Ok(1));
        assert!(time::timeout(Duration::ZERO, std::future::pending::<()>())
            .await
            .is_err());
        let deadline = Instant::now() + Duration::from_millis(20);
        let ready_from_deadline = std::future::poll_fn(move |_| {
            if Instant::now() >= deadline {
                std::task::Poll::Ready(7)
            } else {
                std::task::Poll::Pending
            }
        });
        // The timeout's deadline is at or after `deadline` (made after it).
        let r = time::timeout(Duration::from_millis(20), ready_from_deadline).await;
        assert_eq!(r, Ok(7), "the deadline won over a ready future");
    });
}

/// The same for a sleep (here also a timeout's) dropped, not polled, on another loop after its
/// deadline passed (a `select!` whose other branch won once the task, woken by this timer, was
/// stolen; a `timeout` whose future was ready at that poll, which gives its timer up the same
/// way): nothing is left to cancel, since the home loop fires a due timer (step 3 of its turn)
/// before it runs any task of that turn, the cancel included. The drop still sent the cancel
/// task, which cost shard 0 a task and, asleep, a wake-up, and found nothing.
#[test]
fn a_due_sleep_dropped_on_another_loop_sends_no_cancel_home() {
    let ex = common::exec(2);
    ex.spawn_on(0, || async {
        let mut due = Box::pin(time::sleep(Duration::from_millis(1)));
        // Registers its timer on shard 0.
        assert!(futures::poll!(due.as_mut()).is_pending());
        // The timer fires meanwhile (waking this task once, for nothing).
        time::sleep(Duration::from_millis(20)).await;
        xtc_shards::shard::submit_to(1, move || async move { drop(due) })
            .await
            .unwrap();
        // A completed timeout whose timer fired on shard 0, given up on shard 1.
        let mut t = Box::pin(time::timeout(
            Duration::from_millis(1),
            std::future::pending::<()>(),
        ));
        assert!(futures::poll!(t.as_mut()).is_pending());
        time::sleep(Duration::from_millis(20)).await;
        xtc_shards::shard::submit_to(1, move || async move { drop(t) })
            .await
            .unwrap();
    })
    .unwrap();
    common::run_within(&ex, common::HANG)
        .expect("run() hung")
        .unwrap();
    // Shard 0 finished its one task, and no cancel task after it.
    assert_eq!(ex.loop_stats(0).unwrap().tasks_run, 1);
}

/// The fast half of `a_sleep_kept_from_a_run_2_24_runs_ago_cancels_nothing_of_a_later_run`
/// (ignored: 2^24 runs), run with the suite. A sleep polled in one run and dropped in the next
/// must not cancel the next run's first timer (same slab key): the runs' generations must not
/// overlap (a loop whose every run started at generation 0 passed the rest of the suite).
#[test]
fn a_sleep_kept_from_the_previous_run_cancels_nothing_of_this_run() {
    assert!(
        a_kept_sleep_dropped_later_cancels_nothing(0),
        "a 20 ms sleep never woke: the previous run's sleep cancelled its timer"
    );
}

/// Timers fired on loops `0..n` so far.
fn fired_total(ex: &Executor, n: usize) -> u64 {
    (0..n).map(|i| ex.loop_stats(i).unwrap().timers_fired).sum()
}

/// A block_on whose main ends while other tasks sleep: the next run starts clean, its
/// timers_fired count is exact, and a registered sleep kept from the first run and dropped
/// between runs leaves nothing for the next run: its cancel was queued into the loop's inbox and ran, an
/// unrelated task, in the next run (a timer of an ended run went with it). From the timers
/// audit of stop 49.
#[test]
// The block_on returns its pending sleep on purpose, to drop it between runs.
#[allow(clippy::async_yields_async)]
fn timers_after_block_on_end_next_run_clean() {
    let ex = common::exec(2);
    let kept = ex
        .block_on(|| async {
            let h = xtc_shards::shard::handle().unwrap();
            for s in 0..2 {
                h.spawn_on(s, || async {
                    time::sleep(Duration::from_secs(3600)).await;
                })
                .unwrap();
            }
            let mut s = Box::pin(time::sleep(Duration::from_secs(3600)));
            assert!(futures::poll!(s.as_mut()).is_pending());
            xtc_shards::yield_now().await;
            s
        })
        .unwrap();
    let fired0 = fired_total(&ex, 2);
    let run0: Vec<_> = (0..2).map(|i| ex.loop_stats(i).unwrap()).collect();
    drop(kept); // on this plain thread, between runs
    for s in 0..2 {
        ex.spawn_on(s, || async {
            for _ in 0..5 {
                time::sleep(Duration::from_millis(1)).await;
            }
        })
        .unwrap();
    }
    common::run_within(&ex, Duration::from_secs(20))
        .expect("second run hung")
        .unwrap();
    assert_eq!(
        fired_total(&ex, 2) - fired0,
        10,
        "timers_fired of the second run"
    );
    let tasks: Vec<u64> = (0..2)
        .map(|i| ex.loop_stats(i).unwrap().tasks_run - run0[i].tasks_run)
        .collect();
    let inbox: Vec<u64> = (0..2)
        .map(|i| ex.loop_stats(i).unwrap().inbox_received - run0[i].inbox_received)
        .collect();
    println!("tasks run in the 2nd run: {tasks:?}, inbox received {inbox:?}");
    assert_eq!(
        tasks,
        vec![1, 1],
        "the second run ran a task nobody spawned (a cancel of a timer of the first run)"
    );
}

/// The same for a LocalExecutor: a sleep returned by block_on and dropped outside.
#[test]
// The block_on returns its pending sleep on purpose, to drop it between runs.
#[allow(clippy::async_yields_async)]
fn local_kept_sleep_dropped_between_block_ons_leaves_no_task() {
    let ex = LocalExecutor::new().unwrap();
    let kept = ex.block_on(async {
        let mut s = Box::pin(time::sleep(Duration::from_secs(3600)));
        assert!(futures::poll!(s.as_mut()).is_pending());
        s
    });
    let h = ex.block_on(async { xtc_shards::shard::handle().unwrap() });
    let before = h.loop_stats(0).unwrap();
    drop(kept);
    ex.block_on(async {});
    let after = h.loop_stats(0).unwrap();
    println!(
        "tasks_run +{}, inbox_received +{}",
        after.tasks_run - before.tasks_run,
        after.inbox_received - before.inbox_received
    );
    assert_eq!(
        after.inbox_received - before.inbox_received,
        0,
        "a cancel for a timer of a finished block_on was queued into the next one"
    );
}

/// A sleep of a LocalExecutor's block_on, dropped on a plain thread while that block_on is
/// in its shutdown (its main future done, a parked task being dropped, the run's `Core` not
/// yet gone): a LocalExecutor never requests a stop, and `timer_generation` still read the
/// start of the run, so the cancel task went into the loop's inbox and ran, a task nobody
/// spawned, in the next block_on (from the second audit of this stop).
#[test]
fn local_sleep_dropped_off_loop_during_shutdown_leaves_no_task_for_the_next_block_on() {
    sleep_dropped_off_loop_in_a_shutdown(false);
}

/// The same for a sleep that a `Drop` creates and polls during the shutdown, after the
/// shutdown cleared the run's timers (from the third audit of this stop).
#[test]
fn a_sleep_made_in_a_shutdown_drop_and_dropped_off_the_loop_leaves_no_task() {
    sleep_dropped_off_loop_in_a_shutdown(true);
}

/// A parked task's guard, dropped by a LocalExecutor block_on's shutdown, hands a pending
/// sleep (registered in the run, or, with `made_in_drop`, made and polled in the `Drop`) to a
/// plain thread that drops it while the run's `Core` lives; the next block_on must receive
/// nothing in its inbox.
fn sleep_dropped_off_loop_in_a_shutdown(made_in_drop: bool) {
    use std::{future::Future, task::Context};
    type S = Pin<Box<time::Sleep>>;
    fn pending_sleep() -> S {
        let mut s: S = Box::pin(time::sleep(Duration::from_secs(3600)));
        let w = futures::task::noop_waker();
        assert!(s.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
        s
    }
    /// Dropped in the shutdown: hands its sleep (or a new one) to the plain thread, and waits
    /// until that dropped it.
    struct InShutdown(Option<S>, mpsc::Sender<S>, mpsc::Receiver<()>);
    impl Drop for InShutdown {
        fn drop(&mut self) {
            let s = self.0.take().unwrap_or_else(pending_sleep);
            self.1.send(s).unwrap();
            let _ = self.2.recv_timeout(Duration::from_secs(5));
        }
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let ex = LocalExecutor::new().unwrap();
        let (stx, srx) = mpsc::channel::<S>();
        let (dtx, drx) = mpsc::channel::<()>();
        let dropper = std::thread::spawn(move || {
            while let Ok(s) = srx.recv() {
                drop(s);
                let _ = dtx.send(());
            }
        });
        let h = ex.block_on(async move {
            let kept = (!made_in_drop).then(pending_sleep);
            let g = InShutdown(kept, stx, drx);
            spawn_local(async move {
                let _g = g;
                std::future::pending::<()>().await;
            });
            xtc_shards::yield_now().await;
            xtc_shards::shard::handle().unwrap()
        });
        dropper.join().unwrap();
        let before = h.loop_stats(0).unwrap();
        ex.block_on(async { time::sleep(Duration::from_millis(5)).await });
        let after = h.loop_stats(0).unwrap();
        let _ = tx.send(after.inbox_received - before.inbox_received);
    });
    let inbox = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the test hung or its thread panicked");
    assert_eq!(
        inbox, 0,
        "made in the Drop: {made_in_drop}: a cancel of a timer of the last block_on ran in the \
         next one"
    );
}
