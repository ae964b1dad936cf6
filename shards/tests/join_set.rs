//! `task::JoinSet`: outcomes in the order tasks finish, panics and cancellations as
//! `JoinError`s, `abort_all` / `shutdown` / drop cancel every task (their futures dropped),
//! `detach_all` leaves them running, handles of other shards and migratable tasks join too,
//! a dropped `join_next` loses no outcome, and `abort_all` wakes the set's current poller
//! only (no spin), each outcome coming once.
mod common;
use common::*;

use std::{
    cell::RefCell,
    rc::Rc,
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc,
    },
    task::{Context, Poll, Wake, Waker},
    time::Duration,
};

use futures::channel::oneshot;
use xtc_shards::{task::JoinSet, JoinError, LocalExecutor};

const LIMIT: Duration = Duration::from_secs(30);

fn local<T: 'static>(f: impl std::future::Future<Output = T> + 'static) -> T {
    LocalExecutor::new().expect("local executor").block_on(f)
}

/// Every outcome `set` gives until it is empty: the outputs and the errors, apart.
async fn outcomes<T: 'static>(set: &mut JoinSet<T>) -> (Vec<T>, Vec<JoinError>) {
    let (mut outputs, mut errors) = (Vec::new(), Vec::new());
    while let Some(r) = set.join_next().await {
        match r {
            Ok(v) => outputs.push(v),
            Err(e) => errors.push(e),
        }
    }
    (outputs, errors)
}

/// Tasks released one at a time in a shuffled order come out of `join_next` in that order.
#[test]
fn join_next_gives_outcomes_in_the_order_tasks_finish() {
    local(async {
        let mut set = JoinSet::new();
        let mut release = Vec::new();
        for i in 0..8u32 {
            let (tx, rx) = oneshot::channel::<()>();
            release.push(Some(tx));
            set.spawn_local(async move {
                rx.await.unwrap();
                i
            });
        }
        assert_eq!(set.len(), 8);
        for i in [5u32, 0, 7, 2, 3, 6, 1, 4] {
            release[i as usize].take().unwrap().send(()).unwrap();
            let got = set
                .join_next()
                .await
                .expect("a task left")
                .expect("no panic");
            assert_eq!(got, i);
        }
        assert!(set.is_empty());
        assert!(set.join_next().await.is_none(), "an empty set gives None");
    });
}

/// A panicking task's outcome is a panic `JoinError`; the others still give their outputs.
#[test]
fn a_panic_comes_back_as_a_join_error_and_the_rest_run_on() {
    local(async {
        let mut set = JoinSet::new();
        for i in 0..4u32 {
            set.spawn_local(async move {
                xtc_shards::yield_now().await;
                if i == 2 {
                    panic!("task 2 panics");
                }
                i
            });
        }
        let (mut ok, errors) = outcomes(&mut set).await;
        assert!(errors.iter().all(JoinError::is_panic), "{errors:?}");
        ok.sort();
        assert_eq!(ok, [0, 1, 3]);
        assert_eq!(errors.len(), 1);
    });
}

/// `abort_all` cancels every unfinished task (each future dropped once); one that had
/// finished still gives its output.
#[test]
fn abort_all_cancels_every_unfinished_task() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    local(async move {
        let mut set = JoinSet::new();
        set.spawn_local(async { 99u32 });
        for _ in 0..5 {
            let c = CountDrop(d.clone());
            set.spawn_local(async move {
                let _c = c;
                std::future::pending::<u32>().await
            });
        }
        // The first task finishes in its first poll.
        xtc_shards::yield_now().await;
        set.abort_all();
        assert_eq!(
            set.len(),
            6,
            "aborted tasks stay until their outcome is taken"
        );
        let (outputs, errors) = outcomes(&mut set).await;
        assert!(errors.iter().all(JoinError::is_cancelled), "{errors:?}");
        assert_eq!((errors.len(), outputs), (5, vec![99]));
        assert_eq!(
            d.load(SeqCst),
            5,
            "each future dropped by the time its outcome came"
        );
    });
    assert_eq!(dropped.load(SeqCst), 5);
}

/// `shutdown` returns once every task's future was dropped, and empties the set.
#[test]
fn shutdown_waits_until_every_future_is_dropped() {
    local(async {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut set = JoinSet::new();
        for _ in 0..10 {
            let c = CountDrop(dropped.clone());
            set.spawn_local(async move {
                let _c = c;
                std::future::pending::<()>().await
            });
        }
        xtc_shards::yield_now().await;
        set.shutdown().await;
        assert!(set.is_empty());
        assert_eq!(dropped.load(SeqCst), 10);
    });
}

/// Dropping the set aborts its tasks: run() then ends quiescent instead of leaving them
/// parked (a deadlock report after the grace, were they left).
#[test]
fn dropping_the_set_aborts_its_tasks() {
    let ex = exec_with_grace(2, Duration::from_secs(20));
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    ex.spawn_on(0, move || async move {
        let mut set = JoinSet::new();
        for i in 0..6 {
            let c = CountDrop(d.clone());
            let fut = async move {
                let _c = c;
                std::future::pending::<()>().await
            };
            // Pinned and migratable ones, on this shard and the other.
            match i % 3 {
                0 => set.spawn_local(fut),
                1 => set.spawn(fut),
                _ => set.insert(
                    xtc_shards::shard::handle()
                        .unwrap()
                        .spawn_on(1, move || fut)
                        .unwrap(),
                ),
            }
        }
        xtc_shards::time::sleep(Duration::from_millis(5)).await;
        drop(set);
    })
    .unwrap();
    let r = run_within(&ex, LIMIT).expect("run() hung");
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(dropped.load(SeqCst), 6);
}

/// `detach_all` empties the set and the tasks run on to the end.
#[test]
fn detach_all_leaves_the_tasks_running() {
    let ran = Rc::new(RefCell::new(0));
    let r2 = ran.clone();
    local(async move {
        let mut set = JoinSet::new();
        let (tx, rx) = oneshot::channel::<()>();
        let rx = Rc::new(RefCell::new(Some(rx)));
        for _ in 0..3 {
            let (r, rx) = (r2.clone(), rx.clone());
            set.spawn_local(async move {
                let mine = rx.borrow_mut().take();
                if let Some(rx) = mine {
                    rx.await.unwrap();
                }
                *r.borrow_mut() += 1;
            });
        }
        set.detach_all();
        assert!(set.is_empty());
        drop(set);
        tx.send(()).unwrap();
        while *r2.borrow() < 3 {
            xtc_shards::yield_now().await;
        }
    });
    assert_eq!(*ran.borrow(), 3);
}

/// Handles of tasks on every shard, pinned and migratable, join through one set.
#[test]
fn handles_from_every_shard_join_through_one_set() {
    let ex = exec(3);
    let h = ex.handle();
    let total = ex
        .block_on(move || async move {
            let mut set = JoinSet::new();
            for shard in 0..3 {
                set.insert(
                    h.spawn_on(shard, move || async move {
                        xtc_shards::yield_now().await;
                        xtc_shards::shard::id() as u64 * 10
                    })
                    .unwrap(),
                );
                set.insert(h.spawn(async move { 1u64 }));
            }
            let mut total = 0;
            while let Some(r) = set.join_next().await {
                total += r.unwrap();
            }
            total
        })
        .unwrap();
    assert_eq!(total, 3 + 30);
}

/// A `join_next` dropped before it resolved (a timeout) loses nothing: the outcome comes at
/// the next call. `try_join_next` does not wait.
#[test]
fn a_dropped_join_next_loses_no_outcome() {
    local(async {
        let mut set = JoinSet::new();
        let (tx, rx) = oneshot::channel::<u8>();
        set.spawn_local(async move { rx.await.unwrap() });
        let timed = xtc_shards::time::timeout(Duration::from_millis(2), set.join_next()).await;
        assert!(timed.is_err(), "nothing finished yet");
        assert!(set.try_join_next().is_none());
        tx.send(7).unwrap();
        xtc_shards::yield_now().await;
        xtc_shards::yield_now().await;
        let got: Option<Result<u8, JoinError>> = set.try_join_next();
        assert_eq!(got.map(|r| r.unwrap()), Some(7));
        assert!(set.is_empty());
    });
}

/// A set of `Send` outputs is `Send` (a migratable task may own one), as its handles are.
#[test]
fn a_set_of_send_outputs_is_send() {
    fn send<T: Send>() {}
    send::<JoinSet<u32>>();
    send::<xtc_shards::JoinHandle<u32>>();
}

/// A task of an executor that is not running (spawned after `run()` returned) is dropped by
/// its next run: `shutdown()` on a plain thread waits until then, then ends, the future
/// dropped (documented on `JoinSet::shutdown`).
#[test]
fn shutdown_of_tasks_of_a_stopped_executor_ends_at_its_next_run() {
    let ex = exec(1);
    ex.spawn_on(0, || async {}).unwrap();
    run_within(&ex, LIMIT).expect("run() hung").unwrap();
    let h = ex.handle();
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let (spawned_tx, spawned_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut set = JoinSet::new();
        let c = CountDrop(d);
        set.insert(
            h.spawn_on(0, move || async move {
                let _c = c;
                std::future::pending::<()>().await
            })
            .unwrap(),
        );
        spawned_tx.send(()).unwrap();
        futures::executor::block_on(set.shutdown());
        let _ = tx.send(());
    });
    spawned_rx.recv_timeout(LIMIT).unwrap();
    // Not before a run: nothing drops the task meanwhile.
    assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
    let r = run_within(&ex, LIMIT).expect("run 2 hung");
    assert!(r.is_ok(), "{r:?}");
    rx.recv_timeout(LIMIT).expect("shutdown() ended with run 2");
    waiter.join().unwrap();
    assert_eq!(dropped.load(SeqCst), 1);
}

/// A waker that counts its wakes.
struct CountWake(AtomicUsize);
impl Wake for CountWake {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// A set whose handles were polled (pending) by one task, then moved to a plain thread and
/// polled there with another waker: `abort_all` wakes the set's nodes, the new poller is woken
/// once per batch (no spin: the woken nodes return Pending once, re-registering), and every
/// outcome comes exactly once when the stopped executor's next run drops the tasks.
#[test]
fn abort_all_on_a_set_moved_between_pollers_gives_each_outcome_once_and_does_not_spin() {
    const N: usize = 16;
    let ex = exec(2);
    ex.spawn_on(0, || async {}).unwrap();
    run_within(&ex, LIMIT).expect("run() hung").unwrap();
    let h = ex.handle();
    let dropped = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for i in 0..N {
        let c = CountDrop(dropped.clone());
        set.insert(
            h.spawn_on(i % 2, move || async move {
                let _c = c;
                std::future::pending::<()>().await
            })
            .unwrap(),
        );
    }
    // First poller: every handle pending, each Entry keeps its node's waker.
    let w1 = Arc::new(CountWake(AtomicUsize::new(0)));
    let waker1 = Waker::from(w1.clone());
    assert!(set
        .join_next()
        .poll_unpin_with(&mut Context::from_waker(&waker1))
        .is_pending());
    // Moved to a second poller (another waker).
    let w2 = Arc::new(CountWake(AtomicUsize::new(0)));
    let waker2 = Waker::from(w2.clone());
    assert!(set
        .join_next()
        .poll_unpin_with(&mut Context::from_waker(&waker2))
        .is_pending());
    let before = w2.0.load(SeqCst);
    // (FuturesUnordered wakes its poller itself after a poll that polled every node.)
    let w1_before = w1.0.load(SeqCst);
    set.abort_all();
    set.abort_all();
    // The executor is not running: nothing can finish; the wakes go to the current poller.
    let woke = w2.0.load(SeqCst) - before;
    assert!(woke >= 1, "abort_all woke no poller");
    assert_eq!(w1.0.load(SeqCst), w1_before, "the stale poller was woken");
    // Poll until no more wakes arrive: a spin would keep waking.
    for round in 0..100 {
        let b = w2.0.load(SeqCst);
        assert!(set
            .join_next()
            .poll_unpin_with(&mut Context::from_waker(&waker2))
            .is_pending());
        if w2.0.load(SeqCst) == b {
            break;
        }
        assert!(round < 50, "join_next keeps waking itself (spin)");
    }
    let quiet = w2.0.load(SeqCst);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(w2.0.load(SeqCst), quiet, "woken with nothing over");
    // The next run drops the tasks: every outcome, once, cancelled.
    let t = std::thread::spawn(move || {
        let mut n = 0;
        futures::executor::block_on(async {
            while let Some(r) = set.join_next().await {
                assert!(r.unwrap_err().is_cancelled());
                n += 1;
            }
        });
        n
    });
    run_within(&ex, LIMIT).expect("run 2 hung").unwrap();
    let got = t.join().unwrap();
    assert_eq!(got, N);
    assert_eq!(dropped.load(SeqCst), N);
}

/// `abort_all` on a set whose tasks all finished (their outputs not taken yet) and on one
/// partly drained: each output exactly once, none lost or doubled.
#[test]
fn abort_all_after_finish_loses_and_doubles_nothing() {
    LocalExecutor::new().unwrap().block_on(async {
        let mut set = JoinSet::new();
        for i in 0..32u32 {
            set.spawn_local(async move {
                xtc_shards::yield_now().await;
                i
            });
        }
        // Poll once so every Entry keeps a waker, then let them all finish.
        let _ = futures::poll!(set.join_next());
        for _ in 0..8 {
            xtc_shards::yield_now().await;
        }
        let mut seen = Vec::new();
        for _ in 0..5 {
            if let Some(r) = set.join_next().await {
                seen.push(r.unwrap());
            }
        }
        set.abort_all();
        set.abort_all();
        while let Some(r) = set.join_next().await {
            seen.push(r.unwrap());
        }
        seen.sort();
        assert_eq!(seen, (0..32).collect::<Vec<_>>());
    });
}

trait PollWith: futures::Future + Unpin {
    fn poll_unpin_with(&mut self, cx: &mut Context<'_>) -> Poll<Self::Output> {
        std::pin::Pin::new(self).poll(cx)
    }
}
impl<F: futures::Future + Unpin> PollWith for F {}
