//! Work-first join (steal/mod.rs rule 6): awaiting a migratable task that is still the newest
//! entry of the awaiting loop's deque runs it on the spot, inside the awaiting task's poll.
//!
//! Every executor here has stealing off, so no thief takes a child before its join: what a
//! test counts is decided by this protocol alone.

mod common;
use common::*;

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use xtc_shards::{shard, Executor, LoopStats};

/// `n` shards, oversubscribed, stealing off.
fn no_steal(n: usize) -> Executor {
    Executor::builder()
        .shards(n)
        .oversubscribe(true)
        .stealing(false)
        .build()
        .expect("build executor")
}

/// Runs `f`'s future as a migratable task (only those join inline) awaited by a pinned task on
/// shard 0 of a 1-shard executor (stealing off); returns its output and shard 0's counters
/// once `run()` is over.
fn on_shard0<T, Fut>(f: impl FnOnce() -> Fut + Send + 'static) -> (T, LoopStats)
where
    T: Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let ex = no_steal(1);
    let out = Arc::new(Mutex::new(None));
    let o = out.clone();
    ex.spawn_on(0, move || async move {
        let v = xtc_shards::spawn(f()).await.unwrap();
        *o.lock().unwrap() = Some(v);
    })
    .unwrap();
    ex.run().unwrap();
    let v = out.lock().unwrap().take().expect("the task finished");
    (v, ex.loop_stats(0).unwrap())
}

#[test]
fn awaiting_a_fresh_child_runs_it_inside_the_parents_poll() {
    let ((value, parent, child), stats) = on_shard0(|| async {
        let child = xtc_shards::spawn(async { (42, std::thread::current().id()) });
        let (v, child) = child.await.unwrap();
        (v, std::thread::current().id(), child)
    });
    assert_eq!(value, 42);
    assert_eq!(parent, child);
    assert_eq!(stats.joins_inlined, 1, "{stats:?}");
    // One poll of the parent (it never parked) and the child's, counted in `polls`; two of
    // the pinned task that awaits the parent (it does not join inline: it parks once).
    assert_eq!(stats.polls, 4, "{stats:?}");
    assert_eq!(stats.tasks_run, 3, "{stats:?}");
}

#[test]
fn a_child_below_the_top_of_the_deque_is_left_to_the_loop() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    let ((a, b), stats) = on_shard0(move || async move {
        let (oa, ob) = (o.clone(), o.clone());
        let a = xtc_shards::spawn(async move {
            oa.lock().unwrap().push("a");
            1
        });
        let b = xtc_shards::spawn(async move {
            ob.lock().unwrap().push("b");
            2
        });
        // `a` is under `b`: this join parks, and the loop runs `b` (the top) then `a`.
        let a = a.await.unwrap();
        let b = b.await.unwrap();
        (a, b)
    });
    assert_eq!((a, b), (1, 2));
    assert_eq!(*order.lock().unwrap(), ["b", "a"]);
    assert_eq!(stats.joins_inlined, 0, "{stats:?}");
}

#[test]
fn one_poll_runs_at_most_the_budget_of_joins_inline() {
    const CHILDREN: usize = 1000;
    let (sum, stats) = on_shard0(|| async {
        let mut sum = 0;
        for i in 0..CHILDREN {
            sum += xtc_shards::spawn(async move { i }).await.unwrap();
        }
        sum
    });
    assert_eq!(sum, CHILDREN * (CHILDREN - 1) / 2);
    // 128 joins per poll of the parent; the 129th parks it and the loop runs that child.
    let inlined = CHILDREN / 129 * 128 + (CHILDREN % 129).min(128);
    assert_eq!(stats.joins_inlined, inlined as u64, "{stats:?}");
}

/// A task that spawns the next link of a chain `n` long and awaits it.
fn chain(n: u32) -> Pin<Box<dyn Future<Output = u32> + Send>> {
    framed_chain::<0>(n)
}

/// [`chain`] whose every poll frame holds `SCRATCH` bytes (a buffer used before the join).
fn framed_chain<const SCRATCH: usize>(n: u32) -> Pin<Box<dyn Future<Output = u32> + Send>> {
    Box::pin(async move {
        if n == 0 {
            return 0;
        }
        if SCRATCH > 0 {
            let mut scratch = [0u8; SCRATCH];
            scratch[n as usize % SCRATCH] = 1;
            std::hint::black_box(&mut scratch);
        }
        xtc_shards::spawn(framed_chain::<SCRATCH>(n - 1))
            .await
            .unwrap()
            + 1
    })
}

#[test]
fn a_long_chain_of_joins_does_not_nest_deeper_than_the_budget() {
    // Inline joins nest: each link's poll runs the next one's. Unbounded, 20,000 nested polls
    // overflow a worker's stack (a debug build needs a few KiB per level).
    let (n, stats) = on_shard0(|| chain(20_000));
    assert_eq!(n, 20_000);
    assert!(stats.joins_inlined > 15_000, "{stats:?}");
}

#[test]
fn inline_joins_stop_nesting_before_the_stack_runs_out() {
    // 128 nested 16 KiB frames are more than a worker's 2 MiB stack: the nesting is bounded
    // by the stack it uses, not only by the number of joins.
    let (n, stats) = on_shard0(|| framed_chain::<{ 16 << 10 }>(300));
    assert_eq!(n, 300);
    assert!(stats.joins_inlined > 0, "{stats:?}");
    // The same on a thread with a small stack (a `LocalExecutor` runs on its caller's).
    let t = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            xtc_shards::LocalExecutor::new()
                .unwrap()
                .block_on(async { xtc_shards::spawn(chain(5_000)).await.unwrap() })
        })
        .unwrap();
    assert_eq!(t.join().unwrap(), 5_000);
}

/// Runs `f` after taking `depth` frames of 16 KiB off the stack.
#[inline(never)]
fn deep_in_the_stack<R>(depth: usize, f: &mut dyn FnMut() -> R) -> R {
    let mut pad = [0u8; 16 << 10];
    std::hint::black_box(&mut pad);
    let r = if depth == 0 {
        f()
    } else {
        deep_in_the_stack(depth - 1, f)
    };
    std::hint::black_box(&mut pad);
    r
}

#[test]
fn a_local_executor_started_deep_in_its_callers_stack_nests_within_what_is_left() {
    // 50 x 16 KiB of a 1 MiB stack are gone before `block_on`: a fixed allowance below the
    // loop's frame (256 KiB, or a quarter of the whole stack) would run off its end.
    let t = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| {
            deep_in_the_stack(50, &mut || {
                xtc_shards::LocalExecutor::new()
                    .unwrap()
                    .block_on(async { xtc_shards::spawn(chain(2_000)).await.unwrap() })
            })
        })
        .unwrap();
    assert_eq!(t.join().unwrap(), 2_000);
}

#[test]
fn a_child_that_panics_inline_is_a_join_error_and_the_parent_goes_on() {
    let ((err, after), stats) = on_shard0(|| async {
        let child = xtc_shards::spawn(async {
            if shard::id() == 0 {
                panic!("child panics on purpose");
            }
            7
        });
        let err = child.await.unwrap_err();
        let after = xtc_shards::spawn(async { 8 }).await.unwrap();
        (err, after)
    });
    assert!(err.is_panic(), "{err:?}");
    assert_eq!(after, 8);
    assert_eq!(stats.joins_inlined, 2, "{stats:?}");
}

#[test]
fn a_child_that_parks_inline_finishes_later_and_wakes_its_parent() {
    let (v, stats) = on_shard0(|| async {
        let child = xtc_shards::spawn(async {
            xtc_shards::time::sleep(Duration::from_millis(5)).await;
            xtc_shards::yield_now().await;
            9
        });
        child.await.unwrap()
    });
    assert_eq!(v, 9);
    assert_eq!(stats.joins_inlined, 1, "{stats:?}");
    assert_eq!(stats.timers_fired, 1, "{stats:?}");
}

#[test]
fn an_aborted_child_is_dropped_unpolled() {
    let polled = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicUsize::new(0));
    let (p, d) = (polled.clone(), dropped.clone());
    let (err, stats) = on_shard0(move || async move {
        let guard = CountDrop(d);
        let child = xtc_shards::spawn(async move {
            let _guard = guard;
            p.store(true, SeqCst);
        });
        child.abort();
        child.await.unwrap_err()
    });
    assert!(err.is_cancelled(), "{err:?}");
    assert!(!polled.load(SeqCst));
    assert_eq!(dropped.load(SeqCst), 1);
    assert_eq!(stats.joins_inlined, 0, "{stats:?}");
}

#[test]
fn after_an_inline_join_the_parents_yield_still_goes_behind_its_siblings() {
    // The parent's own wake during its poll (a yield) must go to the injector, behind the
    // deque: that needs the loop to see the parent as the running task again once the
    // child's inline poll is over. Otherwise the yield lands on top of the LIFO deque and
    // the parent runs again and again while the sibling below it never does.
    let ex = no_steal(1);
    let h = ex.handle();
    let yields = Arc::new(AtomicUsize::new(0));
    let y = yields.clone();
    ex.spawn_on(0, move || async move {
        let parent = xtc_shards::spawn(async move {
            let ran = Arc::new(AtomicBool::new(false));
            let r = ran.clone();
            drop(xtc_shards::spawn(async move { r.store(true, SeqCst) }));
            xtc_shards::spawn(async { 1 }).await.unwrap();
            while !ran.load(SeqCst) {
                if y.fetch_add(1, SeqCst) == 100_000 {
                    break;
                }
                xtc_shards::yield_now().await;
            }
            ran.load(SeqCst)
        });
        assert!(parent.await.unwrap(), "the sibling never ran");
    })
    .unwrap();
    let dog = Watchdog::new(h, HANG, "inline join then yield");
    ex.run().unwrap();
    dog.done();
    // One yield: the loop runs the sibling next, then the parent from the injector.
    assert_eq!(yields.load(SeqCst), 1);
    assert_eq!(ex.loop_stats(0).unwrap().joins_inlined, 1);
}

#[test]
fn a_pinned_task_leaves_its_migratable_child_to_the_loop_and_thieves() {
    let ex = no_steal(1);
    let out = Arc::new(Mutex::new(None));
    let o = out.clone();
    ex.spawn_on(0, move || async move {
        let v = xtc_shards::spawn(async { 3 }).await.unwrap();
        *o.lock().unwrap() = Some(v);
    })
    .unwrap();
    ex.run().unwrap();
    assert_eq!(*out.lock().unwrap(), Some(3));
    let stats = ex.loop_stats(0).unwrap();
    assert_eq!(stats.joins_inlined, 0, "{stats:?}");
    // The pinned task parked at its join and was polled again.
    assert_eq!(stats.polls, 3, "{stats:?}");
}

/// The least a stall report reads for a poll that burned `ms` milliseconds timed by `Instant`
/// (`burn`): reports are timed on the poll clock (a calibrated CPU counter, `clock.rs`), whose
/// rate may differ from `Instant`'s by a few parts per million; 1% is left for that.
fn on_poll_clock(ms: u64) -> Duration {
    Duration::from_millis(ms) * 99 / 100
}

/// Stall reports `(task name, time)`, with a 50 ms budget, of a migratable task named
/// "parent" running `body` (awaited by a pinned task) on a 1-shard executor, its counters, and
/// the parent's life as its awaiter saw it: from before its spawn to after its end, so every
/// poll of the parent, and of what it ran inline, lies within it.
fn stall_reports_of(
    body: impl Future<Output = ()> + Send + 'static,
) -> (Vec<(Option<String>, Duration)>, LoopStats, Duration) {
    let ex = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .stealing(false)
        .stall_budget(Duration::from_millis(50))
        .build()
        .unwrap();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let r = reports.clone();
    ex.set_stall_callback(0, move |rep| {
        r.lock().unwrap().push((rep.task_name.clone(), rep.took))
    })
    .unwrap();
    let life = Arc::new(Mutex::new(None));
    let l = life.clone();
    ex.spawn_on(0, move || async move {
        let t = Instant::now();
        let parent = xtc_shards::task::Builder::new().name("parent").spawn(body);
        parent.await.unwrap();
        *l.lock().unwrap() = Some(t.elapsed());
    })
    .unwrap();
    ex.run().unwrap();
    let reports = reports.lock().unwrap().clone();
    let life = life.lock().unwrap().expect("the awaiter ended");
    (reports, ex.loop_stats(0).unwrap(), life)
}

#[test]
fn the_stall_watchdog_blames_the_task_run_inline_not_its_awaiter() {
    let (reports, stats, life) = stall_reports_of(async {
        let child = xtc_shards::task::Builder::new()
            .name("child")
            .spawn(async { burn(Duration::from_millis(150)) });
        child.await.unwrap();
    });
    // The child answers for its 150 ms; its awaiter is not charged them (it may be reported
    // for time of its own only if a loaded machine kept it off its CPU for 50 ms).
    assert!(
        reports
            .iter()
            .any(|(n, t)| n.as_deref() == Some("child") && *t >= on_poll_clock(150)),
        "{reports:?}"
    );
    // The parent's and the child's reports are of separate times, all within the parent's
    // life, so they add up to no more than it however long a loaded machine kept either off
    // its CPU. Charged the child's time as well, the parent made them add up to the child's
    // time twice: more than the life, unless the loop spent as long outside any poll. The
    // reports are timed on the poll clock and the life on `Instant` (`on_poll_clock`): 1% is
    // left for the two clocks' rates (a 150 ms report once read 1.4 us over a life of the
    // same length), far below a second charge of the child's 150 ms.
    let reported: Duration = reports
        .iter()
        .filter(|(n, _)| matches!(n.as_deref(), Some("parent" | "child")))
        .map(|(_, t)| *t)
        .sum();
    assert!(
        reported <= life + life / 100,
        "{reports:?} in a life of {life:?}"
    );
    assert_eq!(stats.joins_inlined, 1);
}

/// fib(n), each level spawning `fib(n - 1)` as a migratable task and awaiting it.
fn fib(n: u64) -> Pin<Box<dyn Future<Output = u64> + Send>> {
    Box::pin(async move {
        if n < 2 {
            return n;
        }
        let child = xtc_shards::spawn(fib(n - 1));
        let b = fib(n - 2).await;
        child.await.unwrap() + b
    })
}

#[test]
fn joins_on_two_shards_with_stealing_on_give_every_answer() {
    // fork-join under theft: children are inlined, stolen, or left for the loop; each path
    // must deliver its output exactly once.
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .eager_rebalance(true)
        .build()
        .unwrap();
    let v = ex.block_on(|| fib(20)).unwrap();
    assert_eq!(v, 6765);
    let inlined: u64 = (0..2)
        .map(|i| ex.loop_stats(i).unwrap().joins_inlined)
        .sum();
    assert!(inlined > 0);
}

#[test]
fn fork_join_on_a_local_executor() {
    // A `LocalExecutor` has a deque too (and builds no topology: this one also runs under
    // scripts/miri, which checks the inline path's pointer handling).
    let ex = xtc_shards::LocalExecutor::new().unwrap();
    let (v, panicked) = ex.block_on(async {
        xtc_shards::spawn(async {
            let v = fib(10).await;
            let p = xtc_shards::spawn(async { panic!("inline child panics on purpose") }).await;
            (v, p.unwrap_err().is_panic())
        })
        .await
        .unwrap()
    });
    assert_eq!(v, 55);
    assert!(panicked);
}

/// A migratable task named `name` burning `d`, awaited.
async fn burner(name: &str, d: Duration) {
    xtc_shards::task::Builder::new()
        .name(name)
        .spawn(async move { burn(d) })
        .await
        .unwrap();
}

#[test]
fn an_inline_task_over_budget_does_not_hide_the_rest_of_the_hold() {
    // One inline task overruns alone; a hundred small ones after it hold the loop 100 ms
    // more, which is the awaiter's poll's doing.
    let (reports, _, _) = stall_reports_of(async {
        burner("big", Duration::from_millis(100)).await;
        for _ in 0..100 {
            burner("small", Duration::from_millis(1)).await;
        }
    });
    // Normally `big` (100 ms) then `parent` (the rest, 100 ms). Whoever answers for the rest
    // (small tasks too, if a loaded machine kept one off its CPU for 50 ms), at most one
    // budget of the hold may go unreported.
    assert!(
        reports
            .iter()
            .any(|(n, t)| n.as_deref() == Some("big") && *t >= on_poll_clock(100)),
        "{reports:?}"
    );
    assert!(
        reported_except(&reports, "big") >= Duration::from_millis(50),
        "{reports:?}"
    );
}

/// The time of the stall reports not named `name`.
fn reported_except(reports: &[(Option<String>, Duration)], name: &str) -> Duration {
    reports
        .iter()
        .filter(|(n, _)| n.as_deref() != Some(name))
        .map(|(_, t)| *t)
        .sum()
}

#[test]
fn an_awaiter_over_budget_itself_is_reported_with_its_inline_hold() {
    let (reports, _, _) = stall_reports_of(async {
        burn(Duration::from_millis(60));
        for _ in 0..100 {
            burner("small", Duration::from_millis(1)).await;
        }
    });
    // Normally `parent` alone, for all 160 ms: not only for its own 60.
    assert!(
        reports.iter().any(|(n, _)| n.as_deref() == Some("parent")),
        "{reports:?}"
    );
    assert!(
        reported_except(&reports, "") >= Duration::from_millis(110),
        "{reports:?}"
    );
}

#[test]
fn a_poll_that_holds_the_loop_through_many_inline_tasks_is_reported() {
    // A hundred inline tasks of 1 ms each, none near the 50 ms budget alone (unless one is
    // kept off its CPU for 49 ms): the awaiter's poll held the loop for 100 ms, and that is
    // what the watchdog reports.
    let (reports, stats, _) = stall_reports_of(async {
        for _ in 0..100 {
            xtc_shards::spawn(async { burn(Duration::from_millis(1)) })
                .await
                .unwrap();
        }
    });
    assert_eq!(stats.joins_inlined, 100);
    // Normally `parent` alone, for the whole 100 ms.
    assert!(!reports.is_empty());
    assert!(
        reported_except(&reports, "") >= Duration::from_millis(50),
        "{reports:?}"
    );
}

/// Counts a dropped stress node (`stress_node`'s `counts[1]`).
struct Dropped(Arc<[AtomicUsize; 2]>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0[1].fetch_add(1, SeqCst);
    }
}

/// What a stress tree node does (chosen by a tiny hash of its id, so the tree is the same on
/// every run and every path below is taken many times). `counts`: nodes started, dropped.
fn stress_node(
    id: u64,
    depth: u32,
    counts: Arc<[AtomicUsize; 2]>,
) -> Pin<Box<dyn Future<Output = u64> + Send>> {
    Box::pin(async move {
        counts[0].fetch_add(1, SeqCst);
        let _alive = Dropped(counts.clone());
        let h = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 59; // 0..31
        match h {
            0..=2 => xtc_shards::yield_now().await,
            3 => xtc_shards::time::sleep(Duration::from_micros(200)).await,
            // Near the root only: each panic prints its message (and a backtrace) to the log.
            4 if depth >= 4 => panic!("node {id} panics on purpose"),
            _ => {}
        }
        if depth == 0 {
            return 1;
        }
        let left = xtc_shards::spawn(stress_node(id * 2, depth - 1, counts.clone()));
        if h == 5 {
            // An aborted child counts nothing and must still be dropped. It never finishes
            // (a thief may run it before the abort), and it counts as started when it is
            // made, so both executors count it alike.
            counts[0].fetch_add(1, SeqCst);
            let alive = Dropped(counts.clone());
            let right = xtc_shards::spawn(async move {
                let _alive = alive;
                std::future::pending::<u64>().await
            });
            right.abort();
            assert!(right.await.unwrap_err().is_cancelled());
            return 1 + left.await.unwrap_or(0);
        }
        let right = xtc_shards::spawn(stress_node(id * 2 + 1, depth - 1, counts.clone()));
        // Joined newest first (inline when still on top), then the older one.
        let r = right.await.unwrap_or(0);
        let l = left.await.unwrap_or(0);
        1 + l + r
    })
}

#[test]
fn a_stress_tree_of_joins_on_four_shards_gives_the_same_answer_as_one_shard_and_leaks_nothing() {
    // Yields, sleeps, panics and aborts inside a fork-join tree of 2^13 nodes: children are
    // joined inline, stolen, or left parked, and every path must deliver exactly its output
    // (the count of the subtree that did not panic or get aborted) and drop every future.
    let count = |shards: usize| {
        let counts = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let ex = Executor::builder()
            .shards(shards)
            .oversubscribe(true)
            .eager_rebalance(true)
            .build()
            .unwrap();
        let c = counts.clone();
        let n = ex
            .block_on(
                move || async move { xtc_shards::spawn(stress_node(1, 12, c)).await.unwrap() },
            )
            .unwrap();
        let inlined: u64 = (0..shards)
            .map(|i| ex.loop_stats(i).unwrap().joins_inlined)
            .sum();
        drop(ex);
        let (started, dropped) = (counts[0].load(SeqCst), counts[1].load(SeqCst));
        assert_eq!(
            started, dropped,
            "{shards} shards: a started node was never dropped"
        );
        assert!(inlined > 0);
        (n, started)
    };
    let (one, started_one) = count(1);
    let (four, started_four) = count(4);
    // Panics and aborts cut subtrees: fewer than the 2^13 - 1 nodes count.
    assert!(one > 1000 && one < 8191, "{one}");
    assert_eq!(one, four);
    assert_eq!(started_one, started_four);
}

#[test]
fn inline_joins_count_toward_the_loop_turn_so_a_stop_is_seen_soon() {
    // A migratable task joining 10,000 tiny children one by one; the 11th calls stop(). The
    // loop sees the stop at its next turn, and a turn runs at most BATCH (128) tasks plus one
    // poll's inline budget (128): if inline runs did not count, a turn held 128 polls of 129
    // tasks each and thousands of children ran after the stop.
    let ex = no_steal(1);
    let after_stop = Arc::new(AtomicUsize::new(0));
    let stopped = Arc::new(AtomicBool::new(false));
    let (a, st) = (after_stop.clone(), stopped.clone());
    let h = ex.handle();
    drop(ex.spawn(async move {
        for i in 0..10_000 {
            let (a, st) = (a.clone(), st.clone());
            xtc_shards::spawn(async move {
                if st.load(SeqCst) {
                    a.fetch_add(1, SeqCst);
                }
                if i == 10 {
                    st.store(true, SeqCst);
                    xtc_shards::stop();
                }
            })
            .await
            .unwrap();
        }
    }));
    let dog = Watchdog::new(h, HANG, "stop during inline joins");
    let _ = ex.run();
    dog.done();
    assert!(stopped.load(SeqCst));
    let ran = after_stop.load(SeqCst);
    assert!(ran <= 256, "{ran} children ran after stop()");
}
