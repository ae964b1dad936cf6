//! Shutdown `Drop`s that block on a migratable task queued on ANOTHER loop's deque
//! (`steal::cancel_awaited_at_stop`, which takes it through that deque's stealer and drops what
//! it steals before it at once): rings of such waits on 2 and 3 shards, ended by `stop()` and
//! by a deadlock verdict, every task dropped exactly once and none carried into a second run;
//! and a stolen task whose drop the awaited task's drop waits for (held on the waiter's own
//! deque, it waited for good).
mod common;
use common::*;

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use xtc_shards::{Executor, JoinHandle};

const LIMIT: Duration = Duration::from_secs(20);

fn executor(n: usize, stealing: bool, grace: Duration) -> Arc<Executor> {
    Arc::new(
        Executor::builder()
            .shards(n)
            .oversubscribe(true)
            .stealing(stealing)
            .deadlock_grace(Some(grace))
            .build()
            .expect("build executor"),
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    Stop,
    Deadlock,
}

#[derive(Default)]
struct Counts {
    parked: AtomicUsize,
    filler_ran: AtomicUsize,
    filler_dropped: AtomicUsize,
    t_ran: AtomicUsize,
    t_dropped: AtomicUsize,
    in_wait: AtomicUsize,
}

/// Each of `n` shards has a parked pinned task whose guard (run by its shutdown) spawns
/// `fillers` migratable tasks and its own `mine` (all on its own deque), hands `mine` to the
/// shard before it in the ring, and blocks on the `mine` of the shard after it (each wait's
/// task is queued on another stopping loop's deque). `waiters`: how many shards wait (the
/// others only spawn, and hand their `mine` on).
/// Runs `ex` (detached, within [`LIMIT`]) while a thread waits until `parked()` holds and then,
/// with `stop`, stops it through `h`; gives the run's result (`None`: it hung) and what the
/// waits sent on `out` meanwhile.
fn run_stopping_once_parked(
    ex: &Arc<Executor>,
    h: xtc_shards::Handle,
    parked: impl Fn() -> bool + Send + 'static,
    stop: bool,
    out: &mpsc::Receiver<String>,
) -> (Option<xtc_shards::Result<()>>, Vec<String>) {
    let driver = std::thread::spawn(move || {
        block_until(parked);
        if stop {
            h.stop();
        }
    });
    let r = run_detached(ex.clone(), LIMIT);
    driver.join().unwrap();
    (r, out.try_iter().collect())
}

fn ring(n: usize, waiters: usize, stealing: bool, fillers: usize, end: End, rounds: usize) {
    for round in 0..rounds {
        let what = format!("n={n} waiters={waiters} stealing={stealing} fillers={fillers} end={end:?} round {round}");
        let ex = executor(
            n,
            stealing,
            if end == End::Deadlock {
                Duration::from_millis(200)
            } else {
                Duration::from_secs(30)
            },
        );
        let h = ex.handle();
        let c = Arc::new(Counts::default());
        let (out_tx, out_rx) = mpsc::channel::<String>();
        // Shard s sends its `mine` on txs[s]; shard (s + n - 1) % n receives it.
        let mut txs = Vec::new();
        let mut rxs = Vec::new();
        for _ in 0..n {
            let (t, r) = mpsc::channel::<JoinHandle<u32>>();
            txs.push(Some(t));
            rxs.push(Some(r));
        }
        let mut ends = Vec::new();
        for s in 0..n {
            let tx = txs[s].take().unwrap();
            let rx = rxs[(s + 1) % n].take().unwrap();
            ends.push(Some((tx, rx)));
        }
        let ends = Mutex::new(ends);
        for shard in 0..n {
            let (tx, rx) = ends.lock().unwrap()[shard].take().unwrap();
            let (c2, out) = (c.clone(), out_tx.clone());
            let waits = shard < waiters;
            ex.spawn_on(shard, move || async move {
                let c3 = c2.clone();
                let mut state = Some((tx, rx, out));
                let _g = OnDrop(move || {
                    let (tx, rx, out) = state.take().unwrap();
                    let c = c3.clone();
                    for _ in 0..fillers {
                        let r = c.clone();
                        let c4 = c.clone();
                        let guard = OnDrop(move || {
                            c4.filler_dropped.fetch_add(1, SeqCst);
                        });
                        drop(xtc_shards::spawn(async move {
                            let _g = guard;
                            r.filler_ran.fetch_add(1, SeqCst);
                        }));
                    }
                    let c5 = c.clone();
                    let tg = OnDrop(move || {
                        c5.t_dropped.fetch_add(1, SeqCst);
                    });
                    let c6 = c.clone();
                    let mine = xtc_shards::spawn(async move {
                        let _g = tg;
                        c6.t_ran.fetch_add(1, SeqCst);
                        9u32
                    });
                    tx.send(mine).unwrap();
                    let theirs = rx.recv_timeout(LIMIT).unwrap();
                    if waits {
                        c.in_wait.fetch_add(1, SeqCst);
                        let t0 = Instant::now();
                        let got = futures::executor::block_on(theirs);
                        let _ = out.send(format!("{got:?} after {:?}", t0.elapsed()));
                    } else {
                        drop(theirs);
                    }
                });
                c2.parked.fetch_add(1, SeqCst);
                std::future::pending::<()>().await;
            })
            .unwrap();
        }
        let c7 = c.clone();
        let (r, got) = run_stopping_once_parked(
            &ex,
            h,
            move || c7.parked.load(SeqCst) == n,
            end == End::Stop,
            &out_rx,
        );
        assert!(
            r.is_some(),
            "{what}: run() hung; waits done: {got:?}, in wait {}",
            c.in_wait.load(SeqCst)
        );
        let r = r.unwrap();
        match end {
            End::Stop => assert!(r.is_ok(), "{what}: {r:?}"),
            End::Deadlock => assert!(r.is_err(), "{what}: {r:?}"),
        }
        assert_eq!(got.len(), waiters, "{what}: {got:?}");
        // Each wait's outcome: its task cancelled, or (stealing on) its output, the task run by
        // a loop in a last turn before that loop's shutdown began.
        let ok = got.iter().filter(|g| g.starts_with("Ok(9)")).count();
        let cancelled = got.iter().filter(|g| g.contains("ancelled")).count();
        assert_eq!(ok + cancelled, waiters, "{what}: {got:?}");
        if waiters == n {
            assert_eq!(ok, c.t_ran.load(SeqCst), "{what}: {got:?}");
        }
        let spawned = n * fillers;
        assert_eq!(
            c.filler_dropped.load(SeqCst),
            spawned,
            "{what}: each filler dropped exactly once (ran {})",
            c.filler_ran.load(SeqCst)
        );
        assert_eq!(c.t_dropped.load(SeqCst), n, "{what}: each T dropped once");
        if !stealing {
            assert_eq!(c.filler_ran.load(SeqCst), 0, "{what}: a filler ran");
            assert_eq!(c.t_ran.load(SeqCst), 0, "{what}: a T ran");
            for s in 0..n {
                let st = ex.loop_stats(s).unwrap();
                assert_eq!((st.steals, st.stolen_from), (0, 0), "{what}: shard {s}");
            }
        }
        let ran_before = c.filler_ran.load(SeqCst) + c.t_ran.load(SeqCst);
        // Second run on the same executor: nothing spawned, so it must end quiescent (Ok)
        // at once; a live migratable count left high reads as a deadlock (Err), or never ends.
        let g = Arc::new(AtomicUsize::new(0));
        let g2 = g.clone();
        drop(ex.spawn(async move {
            g2.fetch_add(1, SeqCst);
        }));
        let r2 = run_detached(ex.clone(), LIMIT);
        assert!(r2.is_some(), "{what}: second run hung");
        assert!(r2.unwrap().is_ok(), "{what}: second run");
        assert_eq!(g.load(SeqCst), 1, "{what}: second run's own task");
        assert_eq!(
            c.filler_ran.load(SeqCst) + c.t_ran.load(SeqCst),
            ran_before,
            "{what}: a task of run 1 ran in run 2"
        );
    }
}

#[test]
fn two_shards_ring_stop() {
    for stealing in [false, true] {
        // Without fillers: each wait's task is the only one on the other loop's deque.
        ring(2, 2, stealing, 0, End::Stop, 5);
        ring(2, 2, stealing, 50, End::Stop, 5);
    }
}

#[test]
fn three_shards_ring_stop() {
    for stealing in [false, true] {
        ring(3, 3, stealing, 50, End::Stop, 5);
        ring(3, 2, stealing, 50, End::Stop, 5);
    }
}

#[test]
fn three_shards_ring_deadlock_end() {
    for stealing in [false, true] {
        ring(3, 3, stealing, 20, End::Deadlock, 3);
    }
}

/// Many fillers: waiters that steal from each other's deques before they reach the third (index
/// order) drop what they take, so nothing passes back and forth between them.
#[test]
fn three_shards_many_fillers() {
    ring(3, 3, false, 20_000, End::Stop, 3);
}

/// Shard 0's shutdown `Drop` waits on migratable task T;
/// T's `Drop` waits on a shared channel whose `Sender` migratable task F holds, F queued on
/// the deque of shard `f` (whose shutdown drops it once its own `Drop` returns). Shard 0's
/// wait steals F onto its OWN deque, which only its shutdown drops, after the wait:
/// - `in_flight`: T is being dropped by shard `t`'s shutdown (in no queue): the wait does not
///   find it, steals F, and polls again for good;
/// - otherwise T is still queued on shard `t` = 2 and F on shard `f` = 1: the wait steals F
///   (shard 1 comes first), then finds T and drops it: T's drop blocks on F, on shard 0's deque.
///
/// T waits on F, F on shard 0, shard 0 on T. The wait drops what it steals at once (F's fate
/// at this stop anyway): T's drop ends and the wait reads T cancelled.
fn stolen_release(in_flight: bool, stealing: bool) {
    let (t_shard, f_shard) = if in_flight { (1, 2) } else { (2, 1) };
    let what = format!("in_flight={in_flight} stealing={stealing}");
    let ex = executor(3, stealing, Duration::from_secs(30));
    let h = ex.handle();
    let parked = Arc::new(AtomicUsize::new(0));
    let t_dropping = Arc::new(AtomicUsize::new(0));
    let (out_tx, out_rx) = mpsc::channel::<String>();
    let (hand_tx, hand_rx) = mpsc::channel::<JoinHandle<u32>>();
    let (ch_tx, ch_rx) = xtc_shards::channel::shared::bounded::<u8>(1).unwrap();
    // Shard 0: the waiter.
    {
        let (p, td, out) = (parked.clone(), t_dropping.clone(), out_tx.clone());
        let mut st = Some((hand_rx, out, td));
        ex.spawn_on(0, move || async move {
            let _g = OnDrop(move || {
                let (hand_rx, out, td) = st.take().unwrap();
                let t = hand_rx.recv_timeout(LIMIT).unwrap();
                // In flight: T's drop has begun on shard 1 (T is in no queue); else F has
                // been spawned on shard 1 (10 is added then).
                let want = if in_flight { 1 } else { 10 };
                let t0 = Instant::now();
                while td.load(SeqCst) < want && t0.elapsed() < LIMIT {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let got = futures::executor::block_on(t);
                let _ = out.send(format!("{got:?}"));
            });
            p.fetch_add(1, SeqCst);
            std::future::pending::<()>().await;
        })
        .unwrap();
    }
    // Shard t: spawns T (on its own deque); T's drop waits for the channel to close.
    {
        let (p, td) = (parked.clone(), t_dropping.clone());
        let mut st = Some((hand_tx, ch_rx, td));
        ex.spawn_on(t_shard, move || async move {
            let _g = OnDrop(move || {
                let (hand_tx, ch_rx, td) = st.take().unwrap();
                let mut inner = Some((ch_rx, td));
                let tg = OnDrop(move || {
                    if let Some((mut rx, td)) = inner.take() {
                        td.fetch_add(1, SeqCst);
                        let r = park_on(rx.recv());
                        assert!(r.is_none());
                    }
                });
                let t = xtc_shards::spawn(async move {
                    let _tg = tg;
                    std::future::pending::<()>().await;
                    1u32
                });
                hand_tx.send(t).unwrap();
                if !in_flight {
                    // T stays queued here while shard 0 looks.
                    std::thread::sleep(Duration::from_millis(300));
                }
            });
            p.fetch_add(1, SeqCst);
            std::future::pending::<()>().await;
        })
        .unwrap();
    }
    // Shard f: spawns F (holding the Sender) on its deque and returns from its Drop a little
    // later (its `drop_local` then drops F).
    {
        let (p, td) = (parked.clone(), t_dropping.clone());
        let mut st = Some((ch_tx, td));
        ex.spawn_on(f_shard, move || async move {
            let _g = OnDrop(move || {
                let (ch_tx, td) = st.take().unwrap();
                drop(xtc_shards::spawn(async move {
                    let _tx = ch_tx;
                    std::future::pending::<()>().await;
                }));
                if in_flight {
                    let t0 = Instant::now();
                    while td.load(SeqCst) == 0 && t0.elapsed() < LIMIT {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    std::thread::sleep(Duration::from_millis(200));
                } else {
                    td.fetch_add(10, SeqCst);
                    std::thread::sleep(Duration::from_millis(300));
                }
            });
            p.fetch_add(1, SeqCst);
            std::future::pending::<()>().await;
        })
        .unwrap();
    }
    let p = parked.clone();
    let (r, got) = run_stopping_once_parked(&ex, h, move || p.load(SeqCst) == 3, true, &out_rx);
    assert!(
        r.is_some(),
        "{what}: run() hung: shard 0's wait holds F (which T's drop waits for); T's drop \
         began: {}; waits done: {got:?}",
        t_dropping.load(SeqCst)
    );
    assert!(r.unwrap().is_ok(), "{what}");
    assert_eq!(got.len(), 1, "{what}: {got:?}");
}

#[test]
fn a_wait_that_steals_what_the_in_flight_awaited_tasks_drop_waits_for_ends() {
    for stealing in [false, true] {
        stolen_release(true, stealing);
    }
}

#[test]
fn a_wait_that_steals_what_the_queued_awaited_tasks_drop_waits_for_ends() {
    for stealing in [false, true] {
        stolen_release(false, stealing);
    }
}

/// A blocking wait (thread park) that nests inside `futures::executor::block_on`, which
/// refuses to nest.
fn park_on<F: std::future::Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}
