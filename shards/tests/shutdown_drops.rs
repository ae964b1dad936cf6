//! User code that a loop's shutdown runs (the `Drop` of a parked task's guard) doing
//! cross-shard work, blocking (`futures::executor::block_on`) or not: `submit_to`, `send_to`,
//! `Handle::spawn_on` and a wait on its join handle, a shared channel's `send` (full) or
//! `recv`, `spawn_local`, a migratable `spawn`, to each shard, on 2 to 4 shards (rings of 1, 2
//! or 64 slots), stopped by `Handle::stop`, by the deadlock report or by `block_on`'s main
//! future. Each seed checks that `run()` returns, that everything tracked (tasks, call
//! closures, channel values) is dropped exactly once, and that a second `run()` of the same
//! executor runs new work across every pair of shards and ends quiescent (`Ok`).
//!
//! A call made in such a `Drop` is refused with `Err(Stopped)`, whichever shard it is for,
//! so blocking calls may go anywhere. Blocking channel waits that the docs say never end are
//! left out: cycles between two shards' drops, each blocked on a channel end that a task of
//! the other's holds (neither shutdown drops that task while its drop blocks). So a blocking
//! channel wait goes only from a lower shard to a higher one.
//!
//! Seeds: `XTC_SHUTDROP_SEEDS=a..b` (default `0..40`); `XTC_SHUTDROP_VERBOSE=1` prints each
//! plan and its log.
mod common;

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use futures::FutureExt;
use xtc_shards::{channel::shared, shard, Executor};

#[derive(Default)]
struct Counts {
    created: AtomicUsize,
    dropped: AtomicUsize,
}

/// Counted at creation and at drop: every tracked thing must go exactly once.
struct Tracker(Arc<Counts>);
impl Tracker {
    fn new(c: &Arc<Counts>) -> Tracker {
        c.created.fetch_add(1, SeqCst);
        Tracker(c.clone())
    }
}
impl Drop for Tracker {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, SeqCst);
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    SubmitTo,
    SendTo,
    SpawnOn,
    ChanSend,
    ChanRecv,
    SpawnLocal,
    XtcSpawn,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    Handle,
    Deadlock,
    BlockOn,
}

#[derive(Debug, Clone, Copy)]
struct Act {
    kind: Kind,
    to: usize,
    blocking: bool,
}

enum Res {
    None,
    Tx(shared::Sender<Tracker>),
    Rx(shared::Receiver<Tracker>),
}

/// A call's result for the log: waited for (`block_on`) when `blocking`, else polled once.
fn outcome<T: std::fmt::Debug>(
    f: impl std::future::Future<Output = xtc_shards::Result<T>>,
    blocking: bool,
) -> String {
    if blocking {
        format!(
            "{:?}",
            futures::executor::block_on(f).map_err(|e| e.to_string())
        )
    } else {
        format!("{:?}", f.now_or_never().map(|r| r.is_ok()))
    }
}

/// Held by a parked task: its drop (in the shutdown) does `acts`.
struct Guard {
    acts: Vec<(Act, Res)>,
    c: Arc<Counts>,
    log: Arc<Mutex<Vec<String>>>,
    me: usize,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let h = shard::handle();
        for (a, res) in std::mem::take(&mut self.acts) {
            let c = &self.c;
            let t0 = Instant::now();
            let out: String = match a.kind {
                Kind::SubmitTo => {
                    let tr = Tracker::new(c);
                    let f = shard::submit_to(a.to, move || async move {
                        drop(tr);
                        1
                    });
                    outcome(f, a.blocking)
                }
                Kind::SendTo => {
                    let tr = Tracker::new(c);
                    let f = shard::send_to(a.to, move || async move { drop(tr) });
                    outcome(f, a.blocking)
                }
                Kind::SpawnOn => {
                    let tr = Tracker::new(c);
                    match h
                        .as_ref()
                        .unwrap()
                        .spawn_on(a.to, move || async move { drop(tr) })
                    {
                        Ok(j) if a.blocking => {
                            format!(
                                "{:?}",
                                futures::executor::block_on(j).map_err(|e| e.is_cancelled())
                            )
                        }
                        Ok(_) => "spawned".into(),
                        Err(e) => format!("spawn_on err {e}"),
                    }
                }
                Kind::ChanSend => {
                    let Res::Tx(mut tx) = res else { unreachable!() };
                    let v = Tracker::new(c);
                    if a.blocking {
                        format!("{:?}", futures::executor::block_on(tx.send(v)).is_ok())
                    } else {
                        format!("{:?}", tx.send(v).now_or_never().map(|r| r.is_ok()))
                    }
                }
                Kind::ChanRecv => {
                    let Res::Rx(mut rx) = res else { unreachable!() };
                    if a.blocking {
                        format!("{:?}", futures::executor::block_on(rx.recv()).is_some())
                    } else {
                        format!("{:?}", rx.recv().now_or_never().map(|r| r.is_some()))
                    }
                }
                Kind::SpawnLocal => {
                    let tr = Tracker::new(c);
                    drop(shard::spawn_local(async move {
                        let _tr = tr;
                        std::future::pending::<()>().await
                    }));
                    "local".into()
                }
                Kind::XtcSpawn => {
                    let tr = Tracker::new(c);
                    drop(shard::spawn(async move {
                        let _tr = tr;
                        xtc_shards::time::sleep(Duration::from_millis(1)).await;
                    }));
                    "spawn".into()
                }
            };
            self.log.lock().unwrap().push(format!(
                "shard {} {:?} -> {out} in {:?}",
                self.me,
                a,
                t0.elapsed()
            ));
        }
    }
}

struct Plan {
    shards: usize,
    ring: usize,
    stop: Stop,
    /// Per guard task: (its shard, its acts).
    guards: Vec<(usize, Vec<Act>)>,
}

fn plan(seed: u64) -> Plan {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for _ in 0..4 {
        r.next();
    }
    let shards = 2 + r.below(3) as usize;
    let ring = [1, 2, 64][r.below(3) as usize];
    let stop = [Stop::Handle, Stop::Deadlock, Stop::BlockOn][r.below(3) as usize];
    let kinds = [
        Kind::SubmitTo,
        Kind::SendTo,
        Kind::SpawnOn,
        Kind::ChanSend,
        Kind::ChanRecv,
        Kind::SpawnLocal,
        Kind::XtcSpawn,
    ];
    let mut guards = Vec::new();
    for s in 0..shards {
        for _ in 0..1 + r.below(2) {
            let mut acts = Vec::new();
            for _ in 0..1 + r.below(3) {
                let kind = kinds[r.below(kinds.len() as u64) as usize];
                let mut to = r.below(shards as u64) as usize;
                let mut blocking = r.below(2) == 0;
                if matches!(kind, Kind::SpawnLocal | Kind::XtcSpawn) {
                    blocking = false;
                }
                if matches!(kind, Kind::ChanSend | Kind::ChanRecv) && to == s {
                    // The peer end is held by a task of another shard.
                    to = (s + 1) % shards;
                }
                if blocking && to < s && matches!(kind, Kind::ChanSend | Kind::ChanRecv) {
                    // A channel wait goes only from a lower shard to a higher one: no cycle.
                    // Calls (to any shard, this one included) are refused at once.
                    blocking = false;
                }
                acts.push(Act { kind, to, blocking });
            }
            guards.push((s, acts));
        }
    }
    Plan {
        shards,
        ring,
        stop,
        guards,
    }
}

/// Runs `f(ex)` on a thread of its own, which is leaked if it does not return in `limit`.
fn within<R: Send + 'static>(
    ex: Executor,
    limit: Duration,
    f: impl FnOnce(&Executor) -> R + Send + 'static,
) -> Option<(R, Executor)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = f(&ex);
        let _ = tx.send((r, ex));
    });
    rx.recv_timeout(limit).ok()
}

/// One seed: Err(description) on a failure.
fn one(seed: u64, verbose: bool) -> Result<(), String> {
    let p = plan(seed);
    let desc = format!(
        "seed {seed}: shards {} ring {} stop {:?} guards {:?}",
        p.shards, p.ring, p.stop, p.guards
    );
    if verbose {
        eprintln!("{desc}");
    }
    let ex = Executor::builder()
        .shards(p.shards)
        .oversubscribe(true)
        .ring_capacity(p.ring)
        .deadlock_grace(Some(Duration::from_millis(50)))
        .build()
        .unwrap();
    let c = Arc::new(Counts::default());
    let log = Arc::new(Mutex::new(Vec::new()));
    let parked = Arc::new(AtomicUsize::new(0));
    let mut spawns: Vec<(usize, Box<dyn FnOnce() -> Guard + Send>)> = Vec::new();
    // Peer ends of channels: held by plain parked tasks on their shard.
    let mut peers: Vec<(usize, Res)> = Vec::new();
    for (s, acts) in &p.guards {
        let mut with = Vec::new();
        for a in acts {
            let res = match a.kind {
                Kind::ChanSend => {
                    let (mut tx, rx) = shared::bounded::<Tracker>(1).unwrap();
                    // Full, so a send waits (for the receiver's drop).
                    tx.try_send(Tracker::new(&c)).ok().unwrap();
                    peers.push((a.to, Res::Rx(rx)));
                    Res::Tx(tx)
                }
                Kind::ChanRecv => {
                    let (tx, rx) = shared::bounded::<Tracker>(1).unwrap();
                    peers.push((a.to, Res::Tx(tx)));
                    Res::Rx(rx)
                }
                _ => Res::None,
            };
            with.push((*a, res));
        }
        let (c2, log2, me) = (c.clone(), log.clone(), *s);
        spawns.push((
            *s,
            Box::new(move || Guard {
                acts: with,
                c: c2,
                log: log2,
                me,
            }),
        ));
    }
    let n_tasks = spawns.len() + peers.len();
    let h = ex.handle();
    let mut tasks = Vec::new();
    for (s, g) in spawns {
        let (tr, parked) = (Tracker::new(&c), parked.clone());
        tasks.push((
            s,
            Box::new(move || {
                let g = g();
                Box::pin(async move {
                    let _g = g;
                    let _tr = tr;
                    parked.fetch_add(1, SeqCst);
                    std::future::pending::<()>().await
                }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>
            }) as Box<dyn FnOnce() -> _ + Send>,
        ));
    }
    for (s, res) in peers {
        let (tr, parked) = (Tracker::new(&c), parked.clone());
        tasks.push((
            s,
            Box::new(move || {
                Box::pin(async move {
                    let _res = res;
                    let _tr = tr;
                    parked.fetch_add(1, SeqCst);
                    std::future::pending::<()>().await
                }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>
            }),
        ));
    }
    let stop = p.stop;
    let pk = parked.clone();
    let run1 = within(ex, Duration::from_secs(10), move |ex| match stop {
        Stop::Handle | Stop::Deadlock => {
            for (s, t) in tasks {
                ex.spawn_on(s, t).unwrap();
            }
            if stop == Stop::Handle {
                let (h, pk) = (h.clone(), pk.clone());
                std::thread::spawn(move || {
                    common::block_until(|| pk.load(SeqCst) >= n_tasks);
                    h.stop();
                });
            }
            format!(
                "{:?}",
                ex.run()
                    .map_err(|e| e.to_string().chars().take(60).collect::<String>())
            )
        }
        Stop::BlockOn => {
            let pk2 = pk.clone();
            let r = ex.block_on(move || async move {
                let h = shard::handle().unwrap();
                for (s, t) in tasks {
                    h.spawn_on(s, t).unwrap();
                }
                common::sleep_until(|| pk2.load(SeqCst) >= n_tasks).await;
            });
            format!(
                "{:?}",
                r.map_err(|e| e.to_string().chars().take(60).collect::<String>())
            )
        }
    });
    let show_log = || log.lock().unwrap().join("\n  ");
    let Some((r1, ex)) = run1 else {
        return Err(format!(
            "{desc}\n  run 1 HUNG (parked {} of {n_tasks})\n  {}",
            parked.load(SeqCst),
            show_log()
        ));
    };
    let (cr, dr) = (c.created.load(SeqCst), c.dropped.load(SeqCst));
    if verbose {
        eprintln!("  run 1 {r1}; created {cr} dropped {dr}\n  {}", show_log());
    }
    let mut fail = Vec::new();
    if dr != cr {
        fail.push(format!("after run 1: created {cr} dropped {dr}"));
    }
    // Run 2: new work on every shard, across shards; must end quiescent, Ok.
    let c2 = Arc::new(Counts::default());
    let n = p.shards;
    for s in 0..n {
        let c2 = c2.clone();
        ex.spawn_on(s, move || async move {
            for t in 0..n {
                let tr = Tracker::new(&c2);
                let r = shard::submit_to(t, move || async move {
                    drop(tr);
                    t
                })
                .await;
                assert_eq!(r.unwrap(), t);
            }
        })
        .unwrap();
    }
    let run2 = within(ex, Duration::from_secs(10), |ex| {
        ex.run().map_err(|e| e.to_string())
    });
    match run2 {
        None => fail.push("run 2 HUNG".into()),
        Some((r2, _ex)) => {
            if r2.is_err() {
                fail.push(format!("run 2: {r2:?}"));
            }
            let (cr2, dr2) = (c2.created.load(SeqCst), c2.dropped.load(SeqCst));
            if cr2 != n * n || dr2 != cr2 {
                fail.push(format!("run 2 created {cr2} dropped {dr2}, want {}", n * n));
            }
            let (cr, dr) = (c.created.load(SeqCst), c.dropped.load(SeqCst));
            if dr != cr {
                fail.push(format!("after run 2 (run 1's): created {cr} dropped {dr}"));
            }
        }
    }
    if fail.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{desc}\n  run 1 {r1}\n  {}\n  log:\n  {}",
            fail.join("\n  "),
            show_log()
        ))
    }
}

fn seeds() -> std::ops::Range<u64> {
    let s = std::env::var("XTC_SHUTDROP_SEEDS").unwrap_or_else(|_| "0..40".into());
    let bad = || -> ! { panic!("XTC_SHUTDROP_SEEDS={s}: want a range of seeds such as 0..40") };
    let Some((a, b)) = s.split_once("..") else {
        bad()
    };
    match (a.parse(), b.parse()) {
        (Ok(a), Ok(b)) => a..b,
        _ => bad(),
    }
}

#[test]
fn soak_shutdown_drops_doing_cross_shard_work() {
    let verbose = std::env::var("XTC_SHUTDROP_VERBOSE").is_ok_and(|v| v == "1");
    let mut failed = Vec::new();
    for seed in seeds() {
        if let Err(e) = one(seed, verbose) {
            eprintln!("FAIL {e}");
            failed.push(seed);
        }
    }
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
}
