//! `LoopStats`: each counter counted where its doc says, once per event, readable while the
//! loop runs and after `run()` returns, and kept (summed) across runs.

mod common;
use common::*;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst},
        Arc,
    },
    time::{Duration, Instant},
};

use xtc_shards::{shard, Executor, LocalExecutor, LoopStats};

/// `n` tasks spawned on shard 0 from this thread, each yielding `k` times: `n·(k+1)` polls.
fn spawn_yielders(ex: &Executor, shard: usize, n: usize, k: usize) {
    for _ in 0..n {
        ex.spawn_on(shard, move || async move {
            for _ in 0..k {
                xtc_shards::yield_now().await;
            }
        })
        .unwrap();
    }
}

fn stats(ex: &Executor, shard: usize) -> LoopStats {
    ex.loop_stats(shard).unwrap()
}

/// `tasks_run` counts finished tasks and `polls` their steps, exactly; both, and
/// `inbox_received` (each spawn from this thread is one inbox message), are totals over every
/// run, not reset by a new one.
#[test]
fn tasks_run_polls_and_inbox_received_are_exact_and_kept_across_runs() {
    let ex = exec(1);
    for round in 1..=3u64 {
        spawn_yielders(&ex, 0, 10, 3);
        run_or_fail_ref(&ex, "yielders");
        let s = stats(&ex, 0);
        assert_eq!(s.tasks_run, 10 * round, "round {round}: {s:?}");
        assert_eq!(s.polls, 40 * round, "round {round}: {s:?}");
        assert_eq!(s.inbox_received, 10 * round, "round {round}: {s:?}");
        assert_eq!(s.live_tasks, 0, "round {round}: {s:?}");
        // Nothing crossed a ring, nothing was stolen, no timer.
        assert_eq!(
            (
                s.messages_sent,
                s.messages_received,
                s.steals,
                s.stolen_from
            ),
            (0, 0, 0, 0),
            "{s:?}"
        );
        assert_eq!(
            (
                s.steal_attempts_failed,
                s.timers_fired,
                s.joins_inlined,
                s.stalls
            ),
            (0, 0, 0, 0),
            "{s:?}"
        );
    }
}

fn run_or_fail_ref(ex: &Executor, what: &str) {
    run_within(ex, HANG)
        .unwrap_or_else(|| panic!("run() hung: {what}"))
        .unwrap();
}

/// The same for a `LocalExecutor`, whose stats are read through `shard::handle()` both inside
/// the run and after `block_on` returned; totals continue across `block_on` calls.
#[test]
fn a_local_executors_counts_are_exact_readable_after_block_on_and_kept() {
    let ex = LocalExecutor::new().unwrap();
    let mut handle = None;
    for round in 1..=2u64 {
        let (inside, h) = ex.block_on(async move {
            let mut hs = Vec::new();
            for _ in 0..5 {
                hs.push(xtc_shards::spawn_local(async {
                    xtc_shards::yield_now().await;
                    xtc_shards::yield_now().await;
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
            let h = shard::handle().unwrap();
            (h.loop_stats(0).unwrap(), h)
        });
        // Inside: counts are published at the end of each loop turn, so a task reading its
        // own loop sees them as of the last turn's end: at least the earlier runs' totals, at
        // most the 5 children more (the main task, running, had not ended).
        assert!(
            inside.tasks_run >= 6 * (round - 1) && inside.tasks_run <= 5 * round + (round - 1),
            "{inside:?}"
        );
        assert!(inside.io_driver.is_some(), "{inside:?}");
        let after = h.loop_stats(0).unwrap();
        assert_eq!(after.tasks_run, 6 * round, "round {round}: {after:?}");
        // Each child: 3 polls. The main task: 1 + one per child it waited on that was not
        // done yet (at most 5), and at least 2 (the first child had not run at its first await).
        let children = 15 * round;
        assert!(
            after.polls >= children + 2 * round && after.polls <= children + 6 * round,
            "round {round}: {after:?}"
        );
        assert_eq!(after.live_tasks, 0, "{after:?}");
        handle = Some(h);
    }
    // And frozen once the run is over.
    let h = handle.unwrap();
    let a = h.loop_stats(0).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let b = h.loop_stats(0).unwrap();
    assert_eq!(a, b, "a stopped LocalExecutor's stats moved");
}

/// `timers_fired` counts timers that fired: one per `sleep` that waited, none for a timeout
/// whose future finished first, none for a sleep already due at its first poll.
#[test]
fn timers_fired_counts_only_timers_that_fired() {
    let ex = exec(1);
    ex.spawn_on(0, || async {
        for i in 0..4 {
            xtc_shards::time::sleep(Duration::from_millis(2 + i)).await;
        }
        // Finished first: its timer is cancelled, never fires.
        let r = xtc_shards::time::timeout(Duration::from_secs(30), async { 7 }).await;
        assert_eq!(r.unwrap(), 7);
        // Due already: nothing to register.
        xtc_shards::time::sleep(Duration::ZERO).await;
    })
    .unwrap();
    run_or_fail_ref(&ex, "timers");
    let s = stats(&ex, 0);
    assert_eq!(s.timers_fired, 4, "{s:?}");
    // A second run adds to it.
    ex.spawn_on(0, || async {
        xtc_shards::time::sleep(Duration::from_millis(1)).await;
    })
    .unwrap();
    run_or_fail_ref(&ex, "timers 2");
    assert_eq!(stats(&ex, 0).timers_fired, 5);
}

/// Messages over the ring mesh balance exactly: shard 0 sends `N` fire-and-forget calls
/// to shard 1, which sends nothing back.
#[test]
fn messages_sent_and_received_balance_exactly() {
    const N: u64 = 300;
    let ex = exec(2);
    ex.spawn_on(0, || async {
        for _ in 0..N {
            shard::send_to(1, || async {}).await.unwrap();
        }
    })
    .unwrap();
    run_or_fail_ref(&ex, "send_to");
    let (s0, s1) = (stats(&ex, 0), stats(&ex, 1));
    assert_eq!(s0.messages_sent, N, "{s0:?}");
    assert_eq!(s1.messages_received, N, "{s1:?}");
    assert_eq!(s1.messages_sent, 0, "{s1:?}");
    assert_eq!(s0.messages_received, 0, "{s0:?}");
    assert_eq!(s1.tasks_run, N, "{s1:?}");
    assert_eq!(
        s1.inbox_received, 0,
        "ring messages are not inbox messages: {s1:?}"
    );
    // Each call is one poll on shard 1.
    assert_eq!(s1.polls, N, "{s1:?}");
    // Kept across runs.
    run_or_fail_ref(&ex, "empty run");
    assert_eq!(stats(&ex, 0).messages_sent, N);
    assert_eq!(stats(&ex, 1).messages_received, N);
}

/// A round trip: `submit_to` sends the call (one message) and the reply wakes the caller
/// (one message back): sent and received match per direction, and in total.
#[test]
fn submit_to_round_trips_count_one_message_each_way() {
    const N: u64 = 200;
    let ex = exec(2);
    ex.spawn_on(0, || async {
        for i in 0..N {
            assert_eq!(
                shard::submit_to(1, move || async move { i }).await.unwrap(),
                i
            );
        }
    })
    .unwrap();
    run_or_fail_ref(&ex, "submit_to");
    let (s0, s1) = (stats(&ex, 0), stats(&ex, 1));
    assert_eq!(s0.messages_sent, s1.messages_received, "{s0:?} {s1:?}");
    assert_eq!(s1.messages_sent, s0.messages_received, "{s0:?} {s1:?}");
    assert_eq!(s0.messages_sent, N, "{s0:?}");
    // The reply is a wake of the caller, sent over the ring unless the caller was polled
    // again before it (it never is: it awaits the reply): one per call.
    assert!(s1.messages_sent <= N, "{s1:?}");
}

/// `busy` and `idle` grow while the loop works and sleeps, and stop once `run()` returned:
/// two snapshots taken after it are equal (no run or park left open). (Bounds that hold on a
/// loaded machine: a descheduled thread's time counts on whichever side it was.)
#[test]
fn busy_and_idle_grow_while_running_and_freeze_after_run() {
    let ex = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .spin_before_park(Duration::ZERO)
        .build()
        .unwrap();
    ex.spawn_on(0, || async {
        burn(Duration::from_millis(60));
        xtc_shards::time::sleep(Duration::from_millis(60)).await;
    })
    .unwrap();
    let t = Instant::now();
    run_or_fail_ref(&ex, "busy idle");
    let wall = t.elapsed();
    let a = stats(&ex, 0);
    assert!(a.busy >= Duration::from_millis(60), "{a:?}");
    assert!(a.busy + a.idle >= Duration::from_millis(120), "{a:?}");
    assert!(!a.idle.is_zero() && a.parks >= 1, "{a:?}");
    assert!(
        a.busy + a.idle <= wall,
        "more time than the run took: {a:?} {wall:?}"
    );
    std::thread::sleep(Duration::from_millis(40));
    let b = stats(&ex, 0);
    assert_eq!(a, b, "stats moved after run() returned");
    // A second run adds to both, from where they were, and not the time between the runs.
    ex.spawn_on(0, || async {
        burn(Duration::from_millis(20));
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
    })
    .unwrap();
    let t = Instant::now();
    run_or_fail_ref(&ex, "busy idle 2");
    let wall = t.elapsed();
    let c = stats(&ex, 0);
    assert!(c.busy >= a.busy + Duration::from_millis(20), "{a:?} {c:?}");
    assert!(c.idle > a.idle && c.parks > a.parks, "{a:?} {c:?}");
    let added = (c.busy + c.idle) - (a.busy + a.idle);
    assert!(
        added >= Duration::from_millis(40) && added <= wall,
        "{added:?} added in a run of {wall:?}"
    );
}

/// `busy + idle` read while the loop runs stays within the wall time since the run began,
/// and never goes down between snapshots.
#[test]
fn busy_and_idle_read_while_running_are_bounded_and_monotonic() {
    let ex = exec(2);
    let h = ex.handle();
    let t0 = Instant::now();
    let bad = Arc::new(std::sync::Mutex::new(None::<String>));
    let b = bad.clone();
    ex.spawn_on(0, move || async move {
        let mut last = h.loop_stats(1).unwrap();
        for i in 0..200 {
            if i % 2 == 0 {
                shard::submit_to(1, || async { burn(Duration::from_micros(200)) })
                    .await
                    .unwrap();
            } else {
                xtc_shards::time::sleep(Duration::from_micros(300)).await;
            }
            let s = h.loop_stats(1).unwrap();
            let wall = t0.elapsed();
            if s.busy < last.busy || s.idle < last.idle || s.busy + s.idle > wall {
                *b.lock().unwrap() = Some(format!("{last:?} then {s:?} at {wall:?}"));
                return;
            }
            last = s;
        }
    })
    .unwrap();
    run_or_fail_ref(&ex, "monotonic");
    assert!(bad.lock().unwrap().is_none(), "{:?}", bad.lock().unwrap());
}

/// `live_tasks`: the tasks registered on the loop, read while it runs; 0 after `run()`.
/// Pinned tasks parked on the loop count.
#[test]
fn live_tasks_counts_parked_pinned_tasks_while_running() {
    let ex = exec(2);
    let h = ex.handle();
    let release = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(u64::MAX));
    let (r, s) = (release.clone(), seen.clone());
    ex.spawn_on(0, move || async move {
        for _ in 0..3 {
            let r = r.clone();
            h.spawn_on(1, move || async move {
                sleep_until(|| r.load(SeqCst)).await;
            })
            .unwrap();
        }
        // Shard 1's counts are published at the end of each turn: wait for the 3.
        sleep_until(|| h.loop_stats(1).unwrap().live_tasks == 3).await;
        s.store(h.loop_stats(1).unwrap().live_tasks, SeqCst);
        r.store(true, SeqCst);
    })
    .unwrap();
    run_or_fail_ref(&ex, "live");
    assert_eq!(seen.load(SeqCst), 3);
    assert_eq!(stats(&ex, 1).live_tasks, 0);
    assert_eq!(stats(&ex, 1).tasks_run, 3);
}

/// A requested stop drops what was queued unrun: the inbox messages it takes count in
/// `inbox_received` (its doc), and the dropped tasks in `tasks_run` (cancelled), as do the
/// pinned tasks still parked.
#[test]
fn a_stop_counts_the_inbox_it_drops_and_the_tasks_it_cancels() {
    let ex = exec(1);
    let h = ex.handle();
    let go = Arc::new(AtomicBool::new(false));
    let holding = Arc::new(AtomicBool::new(false));
    let (g, hd) = (go.clone(), holding.clone());
    // Two tasks that park for good.
    for _ in 0..2 {
        ex.spawn_on(0, std::future::pending::<()>).unwrap();
    }
    ex.spawn_on(0, move || async move {
        // Hold the loop while the test thread queues 5 more, then stop.
        hd.store(true, SeqCst);
        block_until(|| g.load(SeqCst));
        shard::stop();
    })
    .unwrap();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            // Until the loop holds: the third task runs.
            block_until(|| holding.load(SeqCst));
            for _ in 0..5 {
                h.spawn_on(0, || async { panic!("must not run") }).unwrap();
            }
            go.store(true, SeqCst);
        });
        run_or_fail_ref(&ex, "stop");
    });
    let s = stats(&ex, 0);
    assert_eq!(s.inbox_received, 8, "{s:?}");
    assert_eq!(s.tasks_run, 8, "3 run, 5 dropped unrun: {s:?}");
    assert_eq!(s.polls, 3, "{s:?}");
    assert_eq!(s.live_tasks, 0, "{s:?}");
}

/// `stalls` is `stall_count`, and counts each reported poll once.
#[test]
fn stalls_match_stall_count() {
    let ex = Executor::builder()
        .shards(1)
        .oversubscribe(true)
        .stall_budget(Duration::from_millis(5))
        .build()
        .unwrap();
    ex.spawn_on(0, || async {
        for _ in 0..3 {
            burn(Duration::from_millis(30));
            xtc_shards::yield_now().await;
        }
    })
    .unwrap();
    run_or_fail_ref(&ex, "stalls");
    let s = stats(&ex, 0);
    assert_eq!(s.stalls, 3, "{s:?}");
    assert_eq!(ex.stall_count(0), 3);
    assert_eq!(ex.stall_count(7), 0);
    assert!(ex.loop_stats(7).is_err());
}

// ---- stealing ----

/// Holds shard 0 (a pinned task blocking its thread) with `n` migratable tasks queued on its
/// deque; the other shards are thieves. Returns the stats of every shard.
fn steal_from_a_held_victim(shards: usize, n: usize, stealing: bool) -> Vec<LoopStats> {
    let ex = Executor::builder()
        .shards(shards)
        .oversubscribe(true)
        .stealing(stealing)
        .build()
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    ex.spawn_on(0, move || async move {
        for _ in 0..n {
            let r = r.clone();
            drop(xtc_shards::spawn(async move {
                burn(Duration::from_micros(300));
                r.fetch_add(1, SeqCst);
            }));
        }
        // Held until the thieves ran them all (a hang guard at HANG: a thief descheduled for
        // seconds on a loaded machine still takes them all), or 100 ms with stealing off.
        let t = Instant::now();
        while r.load(SeqCst) < n && t.elapsed() < HANG {
            std::thread::sleep(Duration::from_millis(1));
            if !stealing && t.elapsed() > Duration::from_millis(100) {
                break;
            }
        }
    })
    .unwrap();
    run_or_fail_ref(&ex, "held victim");
    assert_eq!(ran.load(SeqCst), n);
    (0..shards).map(|i| stats(&ex, i)).collect()
}

/// One thief, the victim held: every steal is counted once on each side, and no attempt
/// fails (the victim takes nothing back while held, and no other thief races). A count of
/// empty looks as failed attempts would show here: the thief looks again after the last task.
#[test]
fn steals_match_stolen_from_and_no_attempt_fails_without_a_race() {
    for _ in 0..3 {
        let s = steal_from_a_held_victim(2, 40, true);
        assert!(s[1].steals > 0, "{s:?}");
        assert_eq!(s[0].stolen_from, s[1].steals, "{s:?}");
        assert_eq!(s[1].stolen_from, 0, "{s:?}");
        assert_eq!(s[0].steals, 0, "{s:?}");
        // The victim was held the whole time: everything ran on the thief.
        assert_eq!(s[1].steals, 40, "{s:?}");
        assert_eq!(s[1].steal_attempts_failed, 0, "{s:?}");
        assert_eq!(s[0].steal_attempts_failed, 0, "{s:?}");
        // tasks_run counts each migratable task where it ended.
        assert_eq!(s[1].tasks_run, 40, "{s:?}");
        assert_eq!(s[0].tasks_run, 1, "{s:?}");
    }
}

/// Stealing off: nothing stolen, no attempt at all.
#[test]
fn no_steal_and_no_attempt_with_stealing_off() {
    let s = steal_from_a_held_victim(3, 20, false);
    for (i, st) in s.iter().enumerate() {
        assert_eq!(
            (st.steals, st.stolen_from, st.steal_attempts_failed),
            (0, 0, 0),
            "shard {i}: {st:?}"
        );
    }
    assert_eq!(s[0].tasks_run, 21, "{s:?}");
}

/// Several thieves racing for the same victim's tasks: the totals balance (every task stolen
/// once is counted once by its thief and once by its victim), and with many rounds some
/// thief finds a victim that looked non-empty already emptied by another (a failed attempt).
#[test]
fn racing_thieves_balance_and_count_failed_attempts() {
    let mut failed = 0;
    let t = Instant::now();
    let mut rounds = 0;
    // Rounds go on until one fails an attempt (a hang guard at HANG: real races between
    // oversubscribed thieves are rarer on a loaded machine).
    while failed == 0 && t.elapsed() < HANG {
        rounds += 1;
        let ex = Executor::builder()
            .shards(4)
            .oversubscribe(true)
            .build()
            .unwrap();
        ex.spawn_on(0, || async {
            // Bursts of one task each, so the thieves race for a single task.
            for _ in 0..200 {
                drop(xtc_shards::spawn(async { burn(Duration::from_micros(20)) }));
                burn(Duration::from_micros(100));
                xtc_shards::yield_now().await;
            }
        })
        .unwrap();
        run_or_fail_ref(&ex, "racing thieves");
        let s: Vec<LoopStats> = (0..4).map(|i| stats(&ex, i)).collect();
        let steals: u64 = s.iter().map(|s| s.steals).sum();
        let stolen: u64 = s.iter().map(|s| s.stolen_from).sum();
        assert_eq!(steals, stolen, "{s:?}");
        // A task may be stolen twice (a thief's batch stolen again from it), but only what a
        // thief took can be stolen from it again.
        let thieves_lost: u64 = s[1..].iter().map(|s| s.stolen_from).sum();
        assert!(s[0].stolen_from <= 200, "{s:?}");
        assert!(steals <= 200 + thieves_lost, "{s:?}");
        let ran: u64 = s.iter().map(|s| s.tasks_run).sum();
        assert_eq!(ran, 201, "{s:?}");
        failed += s.iter().map(|s| s.steal_attempts_failed).sum::<u64>();
    }
    eprintln!("failed attempts {failed} after {rounds} rounds");
    assert!(failed > 0, "no failed attempt in {rounds} rounds");
}

/// `Class::runs` counts the polls run in the class, exactly.
#[test]
fn class_runs_count_each_poll_in_the_class_once() {
    let ex = exec(1);
    let c = ex.create_class(0, 300, None).unwrap();
    ex.spawn_on(0, move || async move {
        let mut hs = Vec::new();
        for _ in 0..5 {
            hs.push(
                xtc_shards::task::Builder::new()
                    .class(c)
                    .spawn_local(async {
                        for _ in 0..3 {
                            xtc_shards::yield_now().await;
                        }
                    }),
            );
        }
        for h in hs {
            h.await.unwrap();
        }
    })
    .unwrap();
    run_or_fail_ref(&ex, "class runs");
    // 5 tasks of 4 polls each; the untagged main task's polls are not the class's.
    assert_eq!(c.runs(), 20, "{c:?}");
    // Kept across runs.
    ex.spawn_on(0, move || async move {
        xtc_shards::task::Builder::new()
            .class(c)
            .spawn_local(async {})
            .await
            .unwrap();
    })
    .unwrap();
    run_or_fail_ref(&ex, "class runs 2");
    assert_eq!(c.runs(), 21, "{c:?}");
}

/// `tasks_run` counts tasks "completed, panicked or cancelled". A pinned task still parked
/// when a run stops is dropped by the loop's shutdown and counted; a migratable one is
/// dropped after the loops stopped (`executor::drop_migratable`) and counted nowhere.
#[test]
fn migratable_tasks_dropped_at_a_runs_end_count_in_tasks_run() {
    let ex = exec(2);
    ex.spawn_on(0, || async {
        for _ in 0..5 {
            drop(xtc_shards::spawn(std::future::pending::<()>()));
        }
        // A pinned one too, for comparison.
        drop(xtc_shards::spawn_local(std::future::pending::<()>()));
        // Let them all park.
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        shard::stop();
    })
    .unwrap();
    run_within(&ex, HANG).expect("run() hung").unwrap();
    let total: u64 = (0..2).map(|i| ex.loop_stats(i).unwrap().tasks_run).sum();
    // 1 main + 1 pinned cancelled + 5 migratable cancelled.
    assert_eq!(total, 7, "tasks_run summed over the loops");
}

/// The same at the end of a `LocalExecutor::block_on`.
#[test]
fn a_local_executors_parked_migratable_tasks_count_in_tasks_run() {
    let ex = LocalExecutor::new().unwrap();
    let h = ex.block_on(async {
        for _ in 0..4 {
            drop(xtc_shards::spawn(std::future::pending::<()>()));
        }
        xtc_shards::yield_now().await;
        shard::handle().unwrap()
    });
    let s = h.loop_stats(0).unwrap();
    assert_eq!(s.tasks_run, 5, "main + 4 cancelled migratable tasks: {s:?}");
}

/// `io_submitted` counts readiness waits armed (epoll) and `io_completed` "readiness events
/// dispatched": every event the kernel reports counted, also one no task waited for (the
/// `EPOLLOUT` a fresh socket reports as it joins the set), so completions outnumber waits.
/// Run on both drivers (`XTC_IO=epoll` shows it).
#[test]
fn io_completed_never_exceeds_io_submitted_once_nothing_is_in_flight() {
    let ex = exec(1);
    ex.spawn_on(0, || async {
        let a = xtc_shards::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = xtc_shards::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = b.local_addr().unwrap();
        // One receive that has to wait, then the datagram it waits for.
        let t = xtc_shards::spawn_local(async move {
            let (r, _) = b.recv_from(vec![0u8; 16]).await;
            r.unwrap()
        });
        xtc_shards::time::sleep(Duration::from_millis(5)).await;
        let (r, _) = a.send_to(vec![1u8; 4], to).await;
        r.unwrap();
        assert_eq!(t.await.unwrap().0, 4);
    })
    .unwrap();
    run_within(&ex, HANG).expect("run() hung").unwrap();
    let s = ex.loop_stats(0).unwrap();
    assert!(s.io_submitted >= 1, "the receive waited: {s:?}");
    assert!(
        s.io_completed <= s.io_submitted,
        "more completions than submissions: {s:?}"
    );
}

/// A parked migratable task of a `LocalExecutor` whose drop runs the same `LocalExecutor`
/// again (a nested `block_on`, as tests/steal.rs does) while two other leftovers are still
/// parked: the nested run drops those two first (`Discarding::active_for`), counting them in
/// its sweep; counted from registry sizes before and after each sweep, the outer sweep counted
/// them again (7, not 5). Each task is counted once, by its own drop.
#[test]
fn nested_block_on_from_a_leftovers_drop_counts_each_leftover_once() {
    thread_local! {
        static EX: LocalExecutor = LocalExecutor::new().unwrap();
    }
    thread_local! {
        static RAN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    /// The first of these dropped runs the executor again; the others do nothing.
    struct RunAgain;
    impl Drop for RunAgain {
        fn drop(&mut self) {
            if !RAN.with(|r| r.replace(true)) {
                EX.with(|ex| ex.block_on(async {}));
            }
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let h = EX.with(|ex| {
            ex.block_on(async {
                let g = RunAgain;
                // The one that runs the executor again parks first: the sweep meets it first.
                drop(xtc_shards::spawn(async move {
                    let _g = g;
                    std::future::pending::<()>().await
                }));
                xtc_shards::yield_now().await;
                for _ in 0..2 {
                    let g = RunAgain;
                    drop(xtc_shards::spawn(async move {
                        let _g = g;
                        std::future::pending::<()>().await
                    }));
                }
                for _ in 0..4 {
                    xtc_shards::yield_now().await;
                }
                shard::handle().unwrap()
            })
        });
        let _ = tx.send(h.loop_stats(0).unwrap());
    });
    let s = rx.recv_timeout(HANG).expect("hung");
    // The outer main task, the nested run's main task, the three leftovers.
    assert_eq!(s.tasks_run, 5, "{s:?}");
}
