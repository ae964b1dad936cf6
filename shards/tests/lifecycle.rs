//! The executor's lifecycle under races: runs again and again while plain threads spawn and stop,
//! stops racing the start of a run, `run` racing `block_on`, Handles racing the executor's drop,
//! deadlock stops and re-runs. Every accepted spawn ends exactly once; nothing hangs.
mod common;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        Arc,
    },
    time::{Duration, Instant},
};

use common::*;
use xtc_shards::{Error, Executor};

/// Counts a closure's fate: `ran` when its future ran, `gone` whenever it is dropped.
struct Token {
    gone: Arc<AtomicUsize>,
}
impl Drop for Token {
    fn drop(&mut self) {
        self.gone.fetch_add(1, SeqCst);
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// One round: `run()` must return `Ok` within 20 s.
fn run_round(ex: &Executor, i: usize) {
    match run_within(ex, Duration::from_secs(20)) {
        Some(Ok(())) => {}
        Some(Err(e)) => panic!("round {i}: run() failed: {e}"),
        None => panic!("round {i}: run() hung"),
    }
}

/// After the churn: runs until nothing is queued (a kept stop may end the first at once),
/// drops the executor, and checks that every accepted spawn ended exactly once (run, or
/// dropped with its handle cancelled). Returns how many ran and how many were cancelled.
fn settle_and_check(
    ex: Executor,
    handles: Vec<xtc_shards::JoinHandle<()>>,
    spawned: &AtomicUsize,
    ran: &AtomicUsize,
    gone: &AtomicUsize,
) -> (usize, usize) {
    for k in 0..3 {
        run_round(&ex, 1000 + k);
    }
    drop(ex);
    let (mut ok, mut cancelled) = (0, 0);
    for j in handles {
        assert!(
            j.is_finished(),
            "a handle left unresolved after the executor's drop"
        );
        match futures::executor::block_on(j) {
            Ok(()) => ok += 1,
            Err(e) if e.is_cancelled() => cancelled += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    let (s, r, g) = (spawned.load(SeqCst), ran.load(SeqCst), gone.load(SeqCst));
    eprintln!("spawned {s}, ran {r}, gone {g}, ok {ok}, cancelled {cancelled}");
    assert_eq!(g, s, "a task's closure or future was never dropped (leak)");
    assert_eq!(
        r, ok,
        "a task ran but its handle says otherwise, or the reverse"
    );
    (ok, cancelled)
}

/// What the churn tests share: the counts of spawns and their fates, and the plain threads
/// that spawn and stop while the test's own thread runs the executor.
struct Churn {
    spawned: Arc<AtomicUsize>,
    ran: Arc<AtomicUsize>,
    gone: Arc<AtomicUsize>,
    go: Arc<AtomicBool>,
    give_up: Instant,
}

impl Churn {
    fn new() -> Churn {
        Churn {
            spawned: Arc::default(),
            ran: Arc::default(),
            gone: Arc::default(),
            go: Arc::new(AtomicBool::new(true)),
            give_up: Instant::now() + Duration::from_secs(15),
        }
    }

    /// Two plain threads (seeds salted with `salt`) that spawn with `spawn(handle, random,
    /// ran, token)` until told to stop, each giving back its join handles.
    fn spawners<F>(
        &self,
        ex: &Executor,
        salt: u64,
        spawn: F,
    ) -> Vec<std::thread::JoinHandle<Vec<xtc_shards::JoinHandle<()>>>>
    where
        F: Fn(&xtc_shards::Handle, u64, Arc<AtomicUsize>, Token) -> xtc_shards::JoinHandle<()>
            + Clone
            + Send
            + 'static,
    {
        (0..2u64)
            .map(|t| {
                let (h, spawned, ran, gone, go) = (
                    ex.handle(),
                    self.spawned.clone(),
                    self.ran.clone(),
                    self.gone.clone(),
                    self.go.clone(),
                );
                let (give_up, spawn) = (self.give_up, spawn.clone());
                std::thread::spawn(move || {
                    let mut hs = Vec::new();
                    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (t + salt);
                    while go.load(SeqCst) && Instant::now() < give_up {
                        let r = xorshift(&mut seed);
                        let tok = Token { gone: gone.clone() };
                        spawned.fetch_add(1, SeqCst);
                        hs.push(spawn(&h, r, ran.clone(), tok));
                    }
                    hs
                })
            })
            .collect()
    }

    /// A plain thread that stops the executor at random moments, up to `max_us` apart;
    /// returns how many stops it asked for.
    fn stopper(&self, ex: &Executor, seed: u64, max_us: u64) -> std::thread::JoinHandle<usize> {
        let (h, go, give_up) = (ex.handle(), self.go.clone(), self.give_up);
        std::thread::spawn(move || {
            let mut seed = seed;
            let mut n = 0;
            while go.load(SeqCst) && Instant::now() < give_up {
                std::thread::sleep(Duration::from_micros(xorshift(&mut seed) % max_us));
                h.stop();
                n += 1;
            }
            n
        })
    }

    /// Ends the spawners and the stopper, and checks every spawn's fate
    /// ([`settle_and_check`]): (ran, cancelled).
    fn finish(
        &self,
        ex: Executor,
        spawners: Vec<std::thread::JoinHandle<Vec<xtc_shards::JoinHandle<()>>>>,
        stopper: std::thread::JoinHandle<usize>,
    ) -> (usize, usize) {
        self.go.store(false, SeqCst);
        let stops = stopper.join().unwrap();
        let handles: Vec<_> = spawners
            .into_iter()
            .flat_map(|s| s.join().unwrap())
            .collect();
        eprintln!("stops {stops}");
        settle_and_check(ex, handles, &self.spawned, &self.ran, &self.gone)
    }
}

/// Plain threads spawn (pinned and migratable) and stop at random, while this thread runs
/// the executor over and over. Every accepted spawn ends exactly once: run, or dropped (its
/// handle cancelled), by the last run or the executor's drop. No run errs or hangs.
fn churn(shards: usize, migratable: bool, rounds: usize) {
    let ex = exec_with_grace(shards, Duration::from_secs(30));
    let c = Churn::new();
    let spawners = c.spawners(&ex, 1, move |h, r, ran, tok| {
        let job = if migratable && r & 1 == 0 {
            h.spawn(async move {
                let _t = tok;
                ran.fetch_add(1, SeqCst);
            })
        } else {
            let shard = (r as usize >> 1) % h.shard_count();
            match h.spawn_on(shard, move || async move {
                let _t = tok;
                ran.fetch_add(1, SeqCst);
            }) {
                Ok(j) => j,
                Err(e) => panic!("spawn_on refused while the executor lives: {e}"),
            }
        };
        if r % 64 == 0 {
            std::thread::sleep(Duration::from_micros(r % 300));
        }
        job
    });
    let stopper = c.stopper(&ex, 12345, 2000);
    for i in 0..rounds {
        run_round(&ex, i);
    }
    let (ok, cancelled) = c.finish(ex, spawners, stopper);
    assert_eq!(ok + cancelled, c.spawned.load(SeqCst));
}

#[test]
fn churn_pinned_two_shards() {
    churn(2, false, 300);
}

#[test]
fn churn_mixed_two_shards() {
    churn(2, true, 300);
}

#[test]
fn churn_mixed_three_shards() {
    churn(3, true, 200);
}

/// Service mode: a run returns only after a stop. A stop from another thread racing the
/// start of `run()` (before, at the claim, during the start gate) must end that run.
#[test]
fn a_stop_racing_the_start_of_a_service_run_is_never_lost() {
    let ex = exec(2);
    ex.set_service_mode(true);
    let mut seed = 777u64;
    for i in 0..300 {
        let h = ex.handle();
        let delay = xorshift(&mut seed) % 400;
        let t = std::thread::spawn(move || {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_micros(delay) {
                std::hint::spin_loop();
            }
            h.stop();
        });
        match run_within(&ex, Duration::from_secs(20)) {
            Some(Ok(())) => {}
            Some(Err(e)) => panic!("round {i}: {e}"),
            None => panic!("round {i}: a stop racing the start was lost (run() hung)"),
        }
        t.join().unwrap();
    }
}

/// Two threads call `run()` and `block_on` at once, many times: exactly one of any
/// overlapping pair runs; the others get `AlreadyRunning`; nothing hangs.
#[test]
fn concurrent_run_and_block_on_race() {
    let ex = Arc::new(exec(2));
    let mut refused = 0;
    for i in 0..200 {
        let e2 = ex.clone();
        let b = std::thread::spawn(move || e2.block_on(|| async { 7 }));
        let r = ex.run();
        let bo = b.join().unwrap();
        match (&r, &bo) {
            (Ok(()), Ok(7)) => {}
            (Err(Error::AlreadyRunning), Ok(7)) | (Ok(()), Err(Error::AlreadyRunning)) => {
                refused += 1
            }
            _ => panic!("round {i}: run {r:?}, block_on {bo:?}"),
        }
    }
    eprintln!("refused {refused}");
}

/// A `block_on` whose main task stops the run, then `run()`: the next run is not stopped by
/// the main task's stop (it was consumed).
#[test]
fn block_on_then_run_runs_to_quiescence() {
    let ex = exec(2);
    for _ in 0..50 {
        let v = ex.block_on(|| async { 1 }).unwrap();
        assert_eq!(v, 1);
        let j = ex.spawn_on(1, || async { 2 }).unwrap();
        run_within(&ex, Duration::from_secs(20))
            .expect("hung")
            .unwrap();
        assert_eq!(
            futures::executor::block_on(j).unwrap(),
            2,
            "the run after block_on was stopped"
        );
    }
}

/// Plain threads keep using Handles while the Executor is dropped: each accepted spawn
/// resolves, nothing panics.
#[test]
fn handles_racing_the_executors_drop() {
    for round in 0..100 {
        let ex = exec(2);
        let gone = Arc::new(AtomicUsize::new(0));
        let spawned = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(AtomicBool::new(true));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (h, gone, spawned, go) =
                    (ex.handle(), gone.clone(), spawned.clone(), go.clone());
                std::thread::spawn(move || {
                    let mut hs = Vec::new();
                    let mut subs = Vec::new();
                    while go.load(SeqCst) {
                        let tok = Token { gone: gone.clone() };
                        spawned.fetch_add(1, SeqCst);
                        if t == 0 {
                            match h.spawn_on(1, move || async move { drop(tok) }) {
                                Ok(j) => hs.push(j),
                                Err(Error::Stopped) => {}
                                Err(e) => panic!("{e}"),
                            }
                        } else {
                            hs.push(h.spawn(async move { drop(tok) }));
                            let tok2 = Token { gone: gone.clone() };
                            spawned.fetch_add(1, SeqCst);
                            subs.push(h.submit_to(0, move || async move { drop(tok2) }));
                        }
                        h.stop();
                        let _ = h.loop_stats(0).unwrap();
                        h.set_deadlock_grace(Some(Duration::from_secs(1)));
                    }
                    (hs, subs)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_micros(200 + (round % 7) * 100));
        if round % 2 == 0 {
            let _ = run_within(&ex, Duration::from_secs(20)).expect("hung");
        }
        drop(ex);
        std::thread::sleep(Duration::from_micros(300));
        go.store(false, SeqCst);
        let joined: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for (kind, (hs, subs)) in joined.into_iter().enumerate() {
            let n = hs.len();
            let un: Vec<usize> = hs
                .iter()
                .enumerate()
                .filter(|(_, j)| !j.is_finished())
                .map(|(i, _)| i)
                .collect();
            let un_n = un.len();
            if !un.is_empty() {
                std::thread::sleep(Duration::from_millis(500));
                let still: Vec<usize> = un
                    .iter()
                    .copied()
                    .filter(|&i| !hs[i].is_finished())
                    .collect();
                panic!("round {round}: thread kind {} ({}): unresolved after the drop: {} of {n}; after 500 ms: {}; gone {} spawned {}",
                    kind, if kind == 0 {"spawn_on(1)"} else {"spawn"}, un_n, still.len(), gone.load(SeqCst), spawned.load(SeqCst));
            }
            for s in subs {
                let r = futures::executor::block_on(async {
                    futures::future::select(
                        Box::pin(s),
                        Box::pin(async {
                            std::thread::sleep(Duration::from_millis(1));
                        }),
                    )
                    .await
                });
                match r {
                    futures::future::Either::Left((Ok(()), _))
                    | futures::future::Either::Left((Err(Error::Stopped), _)) => {}
                    futures::future::Either::Left((Err(e), _)) => panic!("{e}"),
                    futures::future::Either::Right(_) => {
                        panic!("round {round}: a submit_to never resolved after the drop")
                    }
                }
            }
        }
        assert_eq!(
            gone.load(SeqCst),
            spawned.load(SeqCst),
            "round {round}: leak"
        );
    }
}

#[allow(dead_code)]
fn _unused(_: Executor) {}

/// A task body that parks in various ways: timers, cross-shard calls, migratable children.
async fn busy_body(r: u64, ran: Arc<AtomicUsize>, tok: Token) {
    let _t = tok;
    match r % 6 {
        0 => {}
        1 => {
            for _ in 0..(r % 5) {
                xtc_shards::yield_now().await;
            }
        }
        2 => xtc_shards::time::sleep(Duration::from_micros(r % 3000)).await,
        3 => {
            let to = (r as usize / 7) % xtc_shards::shard::count();
            let _ = xtc_shards::submit_to(to, move || async move {
                xtc_shards::time::sleep(Duration::from_micros(r % 500)).await;
            })
            .await;
        }
        4 => {
            let j = xtc_shards::spawn(async move {
                xtc_shards::time::sleep(Duration::from_micros(r % 700)).await;
                xtc_shards::yield_now().await;
            });
            let _ = j.await;
        }
        _ => {
            let (tx, rx) = futures::channel::oneshot::channel::<()>();
            let h = xtc_shards::shard::handle().unwrap();
            let _ = h.spawn_on(
                (r as usize / 3) % xtc_shards::shard::count(),
                move || async move {
                    xtc_shards::time::sleep(Duration::from_micros(r % 900)).await;
                    let _ = tx.send(());
                },
            );
            let _ = rx.await;
        }
    }
    ran.fetch_add(1, SeqCst);
}

fn churn_parked(shards: usize, rounds: usize, block_on_too: bool) {
    let ex = exec_with_grace(shards, Duration::from_secs(30));
    let c = Churn::new();
    let spawners = c.spawners(&ex, 11, |h, r, ran, tok| {
        let job = if r & 1 == 0 {
            h.spawn(busy_body(r >> 1, ran, tok))
        } else {
            let shard = (r as usize >> 1) % h.shard_count();
            h.spawn_on(shard, move || busy_body(r >> 3, ran, tok))
                .expect("alive")
        };
        std::thread::sleep(Duration::from_micros(r % 50));
        job
    });
    let stopper = c.stopper(&ex, 4242, 15000);
    let mut seed = 99u64;
    for i in 0..rounds {
        if block_on_too && xorshift(&mut seed) % 3 == 0 {
            let r = std::thread::scope(|s| {
                let (tx, rx) = std::sync::mpsc::channel();
                let exr = &ex;
                s.spawn(move || {
                    let _ = tx.send(exr.block_on(|| async {
                        xtc_shards::time::sleep(Duration::from_micros(200)).await;
                        5
                    }));
                });
                match rx.recv_timeout(Duration::from_secs(20)) {
                    Ok(r) => r,
                    Err(_) => {
                        ex.stop();
                        panic!("round {i}: block_on hung")
                    }
                }
            });
            match r {
                Ok(5) | Err(Error::Stopped) => {}
                other => panic!("round {i}: block_on gave {other:?}"),
            }
            continue;
        }
        run_round(&ex, i);
    }
    c.finish(ex, spawners, stopper);
}

#[test]
fn churn_parked_two_shards() {
    churn_parked(2, 150, false);
}

#[test]
fn churn_parked_three_shards_with_block_on() {
    churn_parked(3, 150, true);
}

/// Deadlocked runs, stops and normal runs interleaved: each deadlock report names only the
/// task parked in that run; the run after it runs normally.
#[test]
fn deadlock_stop_rerun_cycle() {
    let ex = exec_with_grace(2, Duration::from_millis(20));
    let h = ex.handle();
    let go = Arc::new(AtomicBool::new(true));
    let g2 = go.clone();
    let stopper = std::thread::spawn(move || {
        let mut seed = 31337u64;
        while g2.load(SeqCst) {
            std::thread::sleep(Duration::from_micros(xorshift(&mut seed) % 40_000));
            h.stop();
        }
    });
    let (mut dl, mut ok) = (0, 0);
    for i in 0..60 {
        let shard = i % 2;
        let parked = if i % 2 == 0 {
            ex.spawn_on(shard, || async { std::future::pending::<()>().await })
                .unwrap()
        } else {
            ex.spawn(async { std::future::pending::<()>().await })
        };
        let done = ex.spawn_on(1 - shard, || async { 3 }).unwrap();
        match run_within(&ex, Duration::from_secs(20)) {
            Some(Ok(())) => ok += 1,
            Some(Err(Error::Deadlock { tasks, .. })) => {
                dl += 1;
                assert_eq!(tasks.len(), 1, "round {i}: {tasks:?}");
            }
            Some(Err(e)) => panic!("round {i}: {e}"),
            None => panic!("round {i}: hung"),
        }
        assert!(
            parked.is_finished(),
            "round {i}: the parked task outlived its run"
        );
        drop(done);
    }
    go.store(false, SeqCst);
    stopper.join().unwrap();
    eprintln!("deadlocks {dl}, stopped {ok}");
}

/// The `grace` an `Err(Deadlock)` reports is the one the coordinator applied, not one a `Drop`
/// that the shutdown ran set afterwards (it read "0ns" after such a `Drop` switched the grace
/// off; found by the Handle audit of stop 49).
#[test]
fn deadlock_error_reports_the_grace_that_was_applied() {
    let ex = exec_with_grace(3, Duration::from_millis(50));
    let h = ex.handle();
    ex.spawn_on(1, move || async move {
        let _g = OnDrop(move || h.set_deadlock_grace(None));
        std::future::pending::<()>().await;
    })
    .unwrap();
    match run_within(&ex, Duration::from_secs(20)).expect("run() hung") {
        Err(Error::Deadlock { grace, .. }) => assert_eq!(
            grace,
            Duration::from_millis(50),
            "the report names a grace that was not the one applied"
        ),
        other => panic!("{other:?}"),
    }
}
