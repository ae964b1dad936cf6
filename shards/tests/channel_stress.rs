//! Channel stress under cancellation, stops and plain threads (from a review): every value arrives once and in order, or is dropped exactly once.

mod common;
use common::*;

use std::time::Duration;

use xtc_shards::{
    channel::{local, shared},
    time::timeout,
    LocalExecutor,
};

fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Cross-shard stream with cancelled `recv`/`recv_many`/`send_many` waits: every value arrives
/// once, in order, and the close is seen after the last one.
#[test]
fn shared_stream_with_cancelled_waits_keeps_every_value_in_order() {
    // Rings under 8 slots signal every message at once; from 8 on a side signals the other
    // every `capacity / 4` messages and at the end of its loop turn (shared.rs, rule 3), and
    // those rings take the cancelled waits through the deferred path.
    for (cap, same) in [
        (1usize, false),
        (2, false),
        (3, true),
        (7, false),
        (5, true),
        (8, false),
        (9, true),
        (16, false),
        (64, true),
    ] {
        let ex = exec(2);
        let (mut tx, mut rx) = shared::bounded::<u64>(cap).unwrap();
        const N: u64 = 20_000;
        let rx_shard = if same { 0 } else { 1 };
        let p = ex
            .spawn_on(0, move || async move {
                let mut seed = 0x9e3779b97f4a7c15u64;
                let mut it = 0..N;
                let mut next_single = None::<u64>;
                loop {
                    if let Some(v) = next_single.take() {
                        tx.send(v).await.unwrap();
                        continue;
                    }
                    match rng(&mut seed) % 4 {
                        0 => match it.next() {
                            Some(v) => next_single = Some(v),
                            None => break,
                        },
                        1 => {
                            let k = (rng(&mut seed) % 9) as usize;
                            let _ = timeout(
                                Duration::from_micros(rng(&mut seed) % 300),
                                tx.send_many(it.by_ref().take(k)),
                            )
                            .await;
                            if it.is_empty() {
                                break;
                            }
                        }
                        2 => {
                            let _ = timeout(
                                Duration::from_micros(rng(&mut seed) % 300),
                                tx.send_many(it.by_ref()),
                            )
                            .await;
                            if it.is_empty() {
                                break;
                            }
                        }
                        _ => xtc_shards::yield_now().await,
                    }
                }
                // An item a cancelled batch left in the Sender goes through an empty batch.
                tx.send_many(std::iter::empty()).await.unwrap();
            })
            .unwrap();
        let c = ex
            .spawn_on(rx_shard, move || async move {
                let mut seed = 0x1234_5678_9abc_def1u64;
                let mut expect = 0u64;
                let mut buf = Vec::new();
                loop {
                    match rng(&mut seed) % 3 {
                        0 => match timeout(Duration::from_micros(rng(&mut seed) % 200), rx.recv())
                            .await
                        {
                            Ok(Some(v)) => {
                                assert_eq!(v, expect);
                                expect += 1;
                            }
                            Ok(None) => break,
                            Err(_) => {}
                        },
                        1 => {
                            buf.clear();
                            let lim = 1 + (rng(&mut seed) % 10) as usize;
                            match timeout(
                                Duration::from_micros(rng(&mut seed) % 200),
                                rx.recv_many(&mut buf, lim),
                            )
                            .await
                            {
                                Ok(0) => break,
                                Ok(n) => {
                                    assert!(n <= lim);
                                    for &v in &buf {
                                        assert_eq!(v, expect);
                                        expect += 1;
                                    }
                                }
                                Err(_) => assert!(buf.is_empty()),
                            }
                        }
                        _ => match rx.recv().await {
                            Some(v) => {
                                assert_eq!(v, expect);
                                expect += 1;
                            }
                            None => break,
                        },
                    }
                }
                expect
            })
            .unwrap();
        run_or_fail(ex, HANG, &format!("cap {cap} same {same}")).unwrap();
        futures::executor::block_on(p).unwrap();
        assert_eq!(futures::executor::block_on(c).unwrap(), N, "cap {cap}");
    }
}

/// Local channel: many senders, some cancelled by timeouts, a slow receiver. Nothing stuck,
/// nothing lost beyond the values of cancelled sends.
#[test]
fn local_many_senders_with_timeouts_and_try_send_barging() {
    LocalExecutor::new().unwrap().block_on(async {
        let (tx, mut rx) = local::bounded::<(usize, u64)>(2).unwrap();
        let sent = std::rc::Rc::new(std::cell::RefCell::new(vec![0u64; 8]));
        let mut hs = Vec::new();
        for id in 0..8usize {
            let tx = tx.clone();
            let sent = sent.clone();
            hs.push(xtc_shards::spawn_local(async move {
                let mut seed = 77 + id as u64 * 1000;
                for i in 0..500u64 {
                    match rng(&mut seed) % 3 {
                        0 => {
                            if timeout(
                                Duration::from_micros(rng(&mut seed) % 100),
                                tx.send((id, i)),
                            )
                            .await
                            .is_ok()
                            {
                                sent.borrow_mut()[id] += 1;
                            }
                        }
                        1 => {
                            if tx.try_send((id, i)).is_ok() {
                                sent.borrow_mut()[id] += 1;
                            } else {
                                xtc_shards::yield_now().await;
                            }
                        }
                        _ => {
                            tx.send((id, i)).await.unwrap();
                            sent.borrow_mut()[id] += 1;
                        }
                    }
                }
            }));
        }
        drop(tx);
        let mut got = vec![0u64; 8];
        let mut last = [None::<u64>; 8];
        let mut seed = 5u64;
        while let Some((id, i)) = rx.recv().await {
            if let Some(l) = last[id] {
                assert!(i > l, "order per sender");
            }
            last[id] = Some(i);
            got[id] += 1;
            if rng(&mut seed) % 4 == 0 {
                xtc_shards::yield_now().await;
            }
        }
        for h in hs {
            h.await.unwrap();
        }
        assert_eq!(got, *sent.borrow());
    });
}

/// Stopping the executor mid-stream (full ring, a sender waiting, a cancelled batch's held
/// item) drops every value exactly once.
#[test]
fn stopping_mid_stream_drops_every_value_once() {
    use std::sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc,
    };
    for cap in [1usize, 4, 64] {
        let made = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        {
            let ex = exec(2);
            let (mut tx, mut rx) = shared::bounded::<CountDrop>(cap).unwrap();
            let (m, d) = (made.clone(), dropped.clone());
            let _p = ex
                .spawn_on(0, move || async move {
                    let mk = || {
                        m.fetch_add(1, SeqCst);
                        CountDrop(d.clone())
                    };
                    loop {
                        let mut it = (0..10).map(|_| mk());
                        let _ = timeout(Duration::from_micros(50), tx.send_many(it.by_ref())).await;
                        drop(it);
                        if tx.send(mk()).await.is_err() {
                            break;
                        }
                    }
                })
                .unwrap();
            let h = ex.handle();
            let _c = ex
                .spawn_on(1, move || async move {
                    for i in 0..2000 {
                        let _ = rx.recv().await;
                        if i % 7 == 0 {
                            xtc_shards::time::sleep(Duration::from_micros(100)).await;
                        }
                    }
                    h.stop();
                    std::future::pending::<()>().await;
                })
                .unwrap();
            run_or_fail(ex, HANG, "stop mid stream").unwrap();
        }
        assert_eq!(made.load(SeqCst), dropped.load(SeqCst), "cap {cap}");
    }
}

/// A sender on a plain thread and a receiver on a loop, and the reverse.
#[test]
fn shared_plain_thread_both_directions() {
    for cap in [1usize, 3, 16] {
        let ex = exec(2);
        let (mut tx, mut rx) = shared::bounded::<u64>(cap).unwrap();
        let (mut tx2, mut rx2) = shared::bounded::<u64>(cap).unwrap();
        const N: u64 = 50_000;
        let c = ex
            .spawn_on(1, move || async move {
                let mut n = 0;
                while let Some(v) = rx.recv().await {
                    assert_eq!(v, n);
                    n += 1;
                    tx2.send(v).await.unwrap();
                }
                n
            })
            .unwrap();
        let t = std::thread::spawn(move || {
            futures::executor::block_on(async move {
                for i in 0..N {
                    tx.send(i).await.unwrap();
                }
            })
        });
        let t2 = std::thread::spawn(move || {
            futures::executor::block_on(async move {
                let mut n = 0;
                while let Some(v) = rx2.recv().await {
                    assert_eq!(v, n);
                    n += 1;
                }
                n
            })
        });
        run_or_fail(ex, HANG, "plain threads").unwrap();
        t.join().unwrap();
        assert_eq!(t2.join().unwrap(), N);
        assert_eq!(futures::executor::block_on(c).unwrap(), N);
    }
}

/// Capacities at the limits: a ring of zero-sized values as large as an allocation may be,
/// one beyond (an `Err`, not a panic), and 0 (an `Err`).
#[test]
fn zst_and_extreme_capacities() {
    let (mut tx, mut rx) = shared::bounded::<()>(isize::MAX as usize).unwrap();
    for _ in 0..1000 {
        tx.try_send(()).unwrap();
    }
    for _ in 0..1000 {
        rx.try_recv().unwrap();
    }
    assert!(shared::bounded::<()>(usize::MAX).is_err());
    assert!(local::bounded::<()>(usize::MAX).is_err());
    let (ltx, mut lrx) = local::bounded::<()>(isize::MAX as usize).unwrap();
    ltx.try_send(()).unwrap();
    lrx.try_recv().unwrap();
    assert!(shared::bounded::<u8>(0).is_err());
    assert!(local::bounded::<u8>(0).is_err());
}
