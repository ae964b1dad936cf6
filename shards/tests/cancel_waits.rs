//! Futures that wait for ring space, channel space or a peer, dropped while they wait (a
//! timeout, a `select`, an abort, a stop): nothing runs twice, nothing that was not sent runs,
//! nothing is lost from a channel, no wake-up is lost, and `run()` returns. Written by the
//! audit of cancelled waits (stop 49), which found no defect; kept as regression tests.
mod common;
use common::*;

use std::{
    collections::HashMap,
    future::Future,
    pin::pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    task::Poll,
    time::{Duration, Instant},
};

use xtc_shards::{channel, shard, time, yield_now, Error, Executor};

fn rings(shards: usize, cap: usize) -> xtc_shards::Builder {
    Executor::builder()
        .shards(shards)
        .oversubscribe(true)
        .ring_capacity(cap)
}

/// Polls `f` up to `k` times (a loop turn between polls), then drops it.
async fn poll_then_drop<F: Future>(f: F, k: usize) -> Option<F::Output> {
    let mut f = pin!(f);
    for _ in 0..k {
        if let Poll::Ready(v) = futures::poll!(f.as_mut()) {
            return Some(v);
        }
        yield_now().await;
    }
    None
}

fn rnd(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// From shard 0: holds shard 1 in one long poll, then fills ring 0 -> 1 (capacity `cap`).
async fn fill_ring_to_busy(target: usize, cap: usize, hold: Duration) {
    shard::send_to(target, move || async move { burn(hold) })
        .await
        .unwrap();
    time::sleep(Duration::from_millis(30)).await;
    for _ in 0..cap {
        shard::send_to(target, || async {}).await.unwrap();
    }
}

/// A submit_to timed out while it waits for ring space, then the task deadlocks for real:
/// the deadlock is still reported (the stale waker only delays it until the ring drains),
/// the dropped call never runs and its closure is dropped once.
#[test]
fn a_stale_space_waiter_does_not_hide_a_deadlock() {
    for cap in [1, 2] {
        let ex = rings(2, cap)
            .deadlock_grace(Some(Duration::from_millis(200)))
            .build()
            .unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (r2, d2) = (ran.clone(), dropped.clone());
        ex.spawn_on(0, move || async move {
            fill_ring_to_busy(1, cap, Duration::from_millis(300)).await;
            let cd = CountDrop(d2);
            let r = r2.clone();
            let res = time::timeout(
                Duration::from_millis(20),
                shard::submit_to(1, move || {
                    let _cd = cd;
                    async move {
                        r.fetch_add(1, SeqCst);
                    }
                }),
            )
            .await;
            assert!(res.is_err(), "the ring was full: timed out");
            // A real deadlock: wait on a channel whose sender this task keeps.
            let (tx, mut rx) = channel::local::bounded::<u8>(1).unwrap();
            let _tx = tx;
            rx.recv().await;
        })
        .unwrap();
        let t0 = Instant::now();
        let out = run_within(&ex, Duration::from_secs(20));
        let took = t0.elapsed();
        println!("cap {cap}: {out:?} after {took:?}");
        assert!(
            matches!(out, Some(Err(Error::Deadlock { .. }))),
            "cap {cap}: {out:?}"
        );
        assert_eq!(ran.load(SeqCst), 0, "the dropped call ran");
        assert_eq!(dropped.load(SeqCst), 1, "the dropped call's closure");
    }
}

/// Many tasks on every shard send to the others through rings of 1 or 2 slots and drop their
/// calls after a random number of polls. send_to: a call ran iff it resolved Ok, once.
/// submit_to: every call ran at most once; one that resolved ran; nothing ran that was
/// not issued. run() returns.
fn exactly_once(shards: usize, cap: usize, submit: bool) {
    let ex = rings(shards, cap).build().unwrap();
    let per_task = 60u64;
    let tasks_per_shard = 6u64;
    let ran: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let ok: Arc<Mutex<Vec<u64>>> = Arc::default();
    let gave_up: Arc<Mutex<Vec<u64>>> = Arc::default();
    for s in 0..shards {
        for t in 0..tasks_per_shard {
            let (ran, ok, gave_up) = (ran.clone(), ok.clone(), gave_up.clone());
            ex.spawn_on(s, move || async move {
                let mut seed = (s as u64 + 1) * 7919 + t * 104729 + 1;
                for i in 0..per_task {
                    let id = ((s as u64) << 40) | (t << 20) | i;
                    let target = (s + 1 + (rnd(&mut seed) as usize % (shards - 1))) % shards;
                    let k = (rnd(&mut seed) % 16) as usize;
                    let r = ran.clone();
                    let work = move || async move {
                        *r.lock().unwrap().entry(id).or_insert(0) += 1;
                        id
                    };
                    let done = if submit {
                        poll_then_drop(shard::submit_to(target, work), k)
                            .await
                            .map(|v| assert_eq!(v.unwrap(), id))
                    } else {
                        poll_then_drop(shard::send_to(target, work), k)
                            .await
                            .map(|v| v.unwrap())
                    };
                    match done {
                        Some(()) => ok.lock().unwrap().push(id),
                        None => gave_up.lock().unwrap().push(id),
                    }
                }
            })
            .unwrap();
        }
    }
    let out = run_within(&ex, Duration::from_secs(30));
    assert!(matches!(out, Some(Ok(()))), "run(): {out:?}");
    let ran = ran.lock().unwrap();
    let ok = ok.lock().unwrap();
    let gave_up = gave_up.lock().unwrap();
    assert_eq!(
        ok.len() + gave_up.len(),
        (shards as u64 * tasks_per_shard * per_task) as usize
    );
    for (id, n) in ran.iter() {
        assert_eq!(*n, 1, "call {id:#x} ran {n} times");
    }
    for id in ok.iter() {
        assert!(ran.contains_key(id), "call {id:#x} resolved but never ran");
    }
    let gave_up_ran = gave_up.iter().filter(|id| ran.contains_key(id)).count();
    if !submit {
        assert_eq!(gave_up_ran, 0, "a dropped send_to ran");
    }
    assert_eq!(
        ran.len(),
        ok.len() + gave_up_ran,
        "a call ran that was never issued"
    );
    println!(
        "shards {shards} cap {cap} submit {submit}: ok {} gave up {} (of which ran {gave_up_ran})",
        ok.len(),
        gave_up.len()
    );
}

#[test]
fn exactly_once_send_to_2_shards_cap_1() {
    exactly_once(2, 1, false);
}
#[test]
fn exactly_once_submit_to_2_shards_cap_1() {
    exactly_once(2, 1, true);
}
#[test]
fn exactly_once_send_to_3_shards_cap_2() {
    exactly_once(3, 2, false);
}
#[test]
fn exactly_once_submit_to_3_shards_cap_1() {
    exactly_once(3, 1, true);
}

/// A shared channel across shards, ring of 1 or 2: the sender uses send_many over
/// iter.by_ref() and plain send, each dropped after a random number of polls and retried;
/// the receiver uses recv and recv_many, dropped the same way. Everything arrives once, in
/// order, and run() returns.
fn shared_channel_drops(shards: usize, cap: usize) {
    let ex = rings(shards, 2).build().unwrap();
    const N: u64 = 3000;
    let (mut tx, mut rx) = channel::shared::bounded::<u64>(cap).unwrap();
    let got: Arc<Mutex<Vec<u64>>> = Arc::default();
    let g = got.clone();
    ex.spawn_on(0, move || async move {
        let mut seed = 12345u64;
        let mut it = 0..N;
        let mut pending: Option<u64> = None;
        loop {
            let k = (rnd(&mut seed) % 4) as usize;
            if rnd(&mut seed) % 2 == 0 {
                let v = match pending.take().or_else(|| it.next()) {
                    Some(v) => v,
                    None => break,
                };
                match poll_then_drop(tx.send(v), k).await {
                    Some(r) => r.unwrap(),
                    // Dropped while waiting: not sent (send takes it only in a Ready poll).
                    None => pending = Some(v),
                }
            } else {
                if let Some(v) = pending.take() {
                    tx.send(v).await.unwrap();
                }
                if let Some(r) = poll_then_drop(tx.send_many(it.by_ref()), k).await {
                    r.unwrap();
                    break;
                }
            }
        }
        if let Some(v) = pending.take() {
            tx.send(v).await.unwrap();
        }
    })
    .unwrap();
    ex.spawn_on(shards - 1, move || async move {
        let mut seed = 999u64;
        let mut buf = Vec::new();
        loop {
            let k = (rnd(&mut seed) % 4) as usize;
            if rnd(&mut seed) % 2 == 0 {
                match poll_then_drop(rx.recv(), k).await {
                    Some(Some(v)) => g.lock().unwrap().push(v),
                    Some(None) => break,
                    None => {}
                }
            } else {
                buf.clear();
                match poll_then_drop(rx.recv_many(&mut buf, 3), k).await {
                    Some(0) => break,
                    Some(_) => g.lock().unwrap().extend(buf.iter().copied()),
                    None => assert!(buf.is_empty(), "a dropped recv_many took items"),
                }
            }
        }
    })
    .unwrap();
    let out = run_within(&ex, Duration::from_secs(30));
    assert!(matches!(out, Some(Ok(()))), "run(): {out:?}");
    let got = got.lock().unwrap();
    assert_eq!(got.len() as u64, N, "count");
    for (i, v) in got.iter().enumerate() {
        assert_eq!(*v, i as u64, "order / loss / duplicate at {i}");
    }
}

#[test]
fn shared_channel_dropped_waits_2_shards_cap_1() {
    shared_channel_drops(2, 1);
}
#[test]
fn shared_channel_dropped_waits_3_shards_cap_2() {
    shared_channel_drops(3, 2);
}

/// Local channel, capacity 1, four senders whose sends time out and are retried, a slow
/// receiver: every value arrives once, per-sender order holds, nobody is stranded.
#[test]
fn local_channel_senders_timing_out_lose_no_wake_up() {
    let ex = rings(2, 2).build().unwrap();
    const M: u64 = 300;
    let got: Arc<Mutex<Vec<u64>>> = Arc::default();
    let g = got.clone();
    ex.spawn_on(1, move || async move {
        let (tx, mut rx) = channel::local::bounded::<u64>(1).unwrap();
        for s in 0..4u64 {
            let tx = tx.clone();
            shard::spawn_local(async move {
                let mut seed = 77 + s;
                for i in 0..M {
                    let v = (s << 32) | i;
                    loop {
                        let k = (rnd(&mut seed) % 3) as usize;
                        if let Some(r) = poll_then_drop(tx.send(v), k).await {
                            r.unwrap();
                            break;
                        }
                    }
                }
            });
        }
        drop(tx);
        let mut seed = 5u64;
        while let Some(v) = rx.recv().await {
            g.lock().unwrap().push(v);
            if rnd(&mut seed) % 8 == 0 {
                yield_now().await;
            }
        }
    })
    .unwrap();
    let out = run_within(&ex, Duration::from_secs(30));
    assert!(matches!(out, Some(Ok(()))), "run(): {out:?}");
    let got = got.lock().unwrap();
    assert_eq!(got.len() as u64, 4 * M);
    for s in 0..4u64 {
        let mine: Vec<u64> = got
            .iter()
            .filter(|v| *v >> 32 == s)
            .map(|v| v & 0xffff_ffff)
            .collect();
        assert_eq!(mine, (0..M).collect::<Vec<_>>(), "sender {s}");
    }
}

/// The stale waker of a dropped reserve (same task) and a later one of the same task: the
/// later call runs once, and the task's allocation is not kept once it is over and the ring
/// drained (checked through the drop of what the task's output holds).
#[test]
fn a_task_that_dropped_its_reserve_and_ended_is_freed_once_the_ring_drains() {
    let ex = rings(2, 1).build().unwrap();
    let out_dropped = Arc::new(AtomicUsize::new(0));
    let o2 = out_dropped.clone();
    let ended = Arc::new(AtomicBool::new(false));
    let e2 = ended.clone();
    ex.spawn_on(0, move || async move {
        fill_ring_to_busy(1, 1, Duration::from_millis(400)).await;
        let o3 = o2.clone();
        // The task keeps its output (the handle is alive and not awaited) while the stale
        // waker holds it.
        let h = shard::spawn_local(async move {
            let r =
                time::timeout(Duration::from_millis(10), shard::submit_to(1, || async {})).await;
            assert!(r.is_err());
            CountDrop(o3)
        });
        sleep_until(|| h.is_finished()).await;
        drop(h);
        e2.store(true, SeqCst);
        // The output was dropped with the handle, whatever the waiter list held.
        assert_eq!(o2.load(SeqCst), 1);
    })
    .unwrap();
    let out = run_within(&ex, Duration::from_secs(20));
    assert!(matches!(out, Some(Ok(()))), "{out:?}");
    assert!(ended.load(SeqCst));
    assert_eq!(out_dropped.load(SeqCst), 1);
}

/// Migratable callers (stealing on), 3 oversubscribed shards, rings of 1: submit_to dropped
/// after a random number of polls; each call runs at most once and run() returns.
#[test]
fn migratable_callers_dropping_submit_to() {
    let ex = rings(3, 1).build().unwrap();
    let ran: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let ok: Arc<Mutex<Vec<u64>>> = Arc::default();
    let h = ex.handle();
    for t in 0..12u64 {
        let (ran, ok) = (ran.clone(), ok.clone());
        // Detached: the checks below count what each task did.
        drop(h.spawn(async move {
            let mut seed = t * 31 + 7;
            for i in 0..80u64 {
                let id = (t << 20) | i;
                let target = (rnd(&mut seed) % 3) as usize;
                let k = (rnd(&mut seed) % 16) as usize;
                let r = ran.clone();
                if let Some(v) = poll_then_drop(
                    shard::submit_to(target, move || async move {
                        *r.lock().unwrap().entry(id).or_insert(0) += 1;
                        id
                    }),
                    k,
                )
                .await
                {
                    assert_eq!(v.unwrap(), id);
                    ok.lock().unwrap().push(id);
                }
            }
        }));
    }
    let out = run_within(&ex, Duration::from_secs(30));
    assert!(matches!(out, Some(Ok(()))), "run(): {out:?}");
    let ran = ran.lock().unwrap();
    for (id, n) in ran.iter() {
        assert_eq!(*n, 1, "call {id:#x} ran {n} times");
    }
    for id in ok.lock().unwrap().iter() {
        assert!(ran.contains_key(id));
    }
    println!("ran {} ok {}", ran.len(), ok.lock().unwrap().len());
}

/// Handle::spawn_on from a loop into a full ring (backlog), aborted at once / after some
/// turns: each closure or future is dropped once, never run after the abort was seen as
/// cancelled, awaiting gives cancelled or the output, run() returns.
#[test]
fn aborting_cross_shard_join_handles_behind_a_full_ring() {
    let ex = rings(3, 1).build().unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let made = Arc::new(AtomicUsize::new(0));
    let (d2, m2) = (dropped.clone(), made.clone());
    let h = ex.handle();
    ex.spawn_on(0, move || async move {
        fill_ring_to_busy(1, 1, Duration::from_millis(100)).await;
        let mut seed = 3u64;
        let mut cancelled = 0;
        for i in 0..300u64 {
            let target = 1 + (i % 2) as usize;
            let cd = CountDrop(d2.clone());
            let m = m2.clone();
            let j = h
                .spawn_on(target, move || {
                    m.fetch_add(1, SeqCst);
                    async move {
                        let _cd = cd;
                        time::sleep(Duration::from_millis(1)).await;
                        i
                    }
                })
                .unwrap();
            for _ in 0..(rnd(&mut seed) % 4) {
                yield_now().await;
            }
            j.abort();
            match j.await {
                Ok(v) => assert_eq!(v, i),
                Err(e) => {
                    assert!(e.is_cancelled());
                    cancelled += 1;
                }
            }
        }
        println!("cancelled {cancelled} of 300");
    })
    .unwrap();
    let out = run_within(&ex, Duration::from_secs(30));
    assert!(matches!(out, Some(Ok(()))), "run(): {out:?}");
    assert_eq!(dropped.load(SeqCst), 300, "each call's state dropped once");
}

/// A stop while tasks on 3 shards drop and retry calls into rings of 1: run() returns, no
/// call runs twice, and after the executor is dropped every call's state was dropped once.
#[test]
fn stop_amid_dropped_waits() {
    for round in 0..4u64 {
        let ex = rings(3, 1).build().unwrap();
        let made = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let ran: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
        for s in 0..3usize {
            for t in 0..4u64 {
                let (made, dropped, ran) = (made.clone(), dropped.clone(), ran.clone());
                ex.spawn_on(s, move || async move {
                    let mut seed = round * 1000 + s as u64 * 77 + t * 13 + 1;
                    for i in 0.. {
                        let id = ((s as u64) << 40) | (t << 20) | i;
                        let target = (s + 1 + (rnd(&mut seed) % 2) as usize) % 3;
                        let k = (rnd(&mut seed) % 8) as usize;
                        made.fetch_add(1, SeqCst);
                        let cd = CountDrop(dropped.clone());
                        let r = ran.clone();
                        let work = move || {
                            let cd = cd;
                            async move {
                                let _cd = cd;
                                *r.lock().unwrap().entry(id).or_insert(0) += 1;
                                time::sleep(Duration::from_micros(200)).await;
                            }
                        };
                        if i % 2 == 0 {
                            let _ = poll_then_drop(shard::submit_to(target, work), k).await;
                        } else {
                            let _ = poll_then_drop(shard::send_to(target, work), k).await;
                        }
                    }
                })
                .unwrap();
            }
        }
        let h = ex.handle();
        let stopper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50 + round * 20));
            h.stop();
        });
        let out = run_within(&ex, Duration::from_secs(20));
        stopper.join().unwrap();
        assert!(matches!(out, Some(Ok(()))), "run(): {out:?}");
        drop(ex);
        for (id, n) in ran.lock().unwrap().iter() {
            assert_eq!(*n, 1, "call {id:#x} ran {n} times");
        }
        let (m, d) = (made.load(SeqCst), dropped.load(SeqCst));
        println!(
            "round {round}: made {m} dropped {d} ran {}",
            ran.lock().unwrap().len()
        );
        assert_eq!(m, d, "round {round}: made {m}, dropped {d}");
    }
}

/// submit_to's inside a FuturesUnordered (each polled with the combinator's waker, the
/// foreign-waker path of rule 3b), rings of 1, the whole set dropped midway; then more calls
/// awaited plainly. Each call runs at most once, the awaited ones once, run() returns.
#[test]
fn futures_unordered_of_calls_dropped_midway() {
    use futures::stream::{FuturesUnordered, StreamExt};
    for shards in [2usize, 3] {
        let ex = rings(shards, 1).build().unwrap();
        let ran: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
        let r0 = ran.clone();
        let finished = Arc::new(AtomicUsize::new(0));
        let f2 = finished.clone();
        ex.spawn_on(0, move || async move {
            for round in 0..20u64 {
                let mut set = FuturesUnordered::new();
                for i in 0..50u64 {
                    let id = (round << 20) | i;
                    let r = r0.clone();
                    let target = 1 + (i as usize % (shards - 1));
                    set.push(shard::submit_to(target, move || async move {
                        *r.lock().unwrap().entry(id).or_insert(0) += 1;
                        id
                    }));
                }
                for _ in 0..(round % 7) * 3 {
                    match set.next().await {
                        Some(v) => {
                            v.unwrap();
                        }
                        None => break,
                    }
                }
                drop(set);
            }
            for i in 0..50u64 {
                let id = (99 << 20) | i;
                let r = r0.clone();
                assert_eq!(
                    shard::submit_to(1, move || async move {
                        *r.lock().unwrap().entry(id).or_insert(0) += 1;
                        id
                    })
                    .await
                    .unwrap(),
                    id
                );
            }
            f2.fetch_add(1, SeqCst);
        })
        .unwrap();
        let out = run_within(&ex, Duration::from_secs(30));
        assert!(
            matches!(out, Some(Ok(()))),
            "shards {shards}: run(): {out:?}"
        );
        assert_eq!(finished.load(SeqCst), 1);
        let ran = ran.lock().unwrap();
        for (id, n) in ran.iter() {
            assert_eq!(*n, 1, "call {id:#x} ran {n} times");
        }
        for i in 0..50u64 {
            assert!(ran.contains_key(&((99 << 20) | i)));
        }
        println!("shards {shards}: ran {}", ran.len());
    }
}
