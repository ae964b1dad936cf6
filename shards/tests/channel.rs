//! channel::shared between shards and channel::local within one.

mod common;
use common::*;

use std::time::Duration;

use xtc_shards::{
    channel::{local, shared, SendError, TryRecvError, TrySendError},
    shard, LocalExecutor,
};

/// How long a whole pipeline run may take before it counts as hung: under heavy load (niced
/// beside CPU hogs, oversubscribed) these runs took over a minute, where they take well under
/// a second on a quiet machine.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// A three-stage pipeline 0 → 1 → 2 with tiny channels: every value arrives, in order.
#[test]
fn shared_pipeline_across_three_shards() {
    let ex = exec(3);
    let (mut a_tx, mut a_rx) = shared::bounded::<u64>(2).unwrap();
    let (mut b_tx, mut b_rx) = shared::bounded::<u64>(3).unwrap();
    const N: u64 = 20_000;
    let source = ex
        .spawn_on(0, move || async move {
            for i in 0..N {
                a_tx.send(i).await.unwrap();
            }
        })
        .unwrap();
    // Its checks come back through its handle (a task's panic is caught with it).
    let middle = ex
        .spawn_on(1, move || async move {
            let mut forwarded = 0;
            while let Some(v) = a_rx.recv().await {
                assert_eq!(shard::id(), 1);
                b_tx.send(v * 2).await.unwrap();
                forwarded += 1;
            }
            forwarded
        })
        .unwrap();
    let sink = ex
        .spawn_on(2, move || async move {
            let mut expect = 0;
            let mut sum = 0u64;
            while let Some(v) = b_rx.recv().await {
                assert_eq!(v, expect * 2, "order kept");
                expect += 1;
                sum += v;
            }
            (expect, sum)
        })
        .unwrap();
    run_within(&ex, RUN_LIMIT).expect("run() hung").unwrap();
    futures::executor::block_on(source).unwrap();
    assert_eq!(futures::executor::block_on(middle).unwrap(), N);
    let (n, sum) = futures::executor::block_on(sink).unwrap();
    assert_eq!(n, N);
    assert_eq!(sum, N * (N - 1));
}

#[test]
fn shared_send_after_receiver_dropped_gives_the_value_back() {
    let (mut tx, rx) = shared::bounded::<String>(4).unwrap();
    drop(rx);
    assert!(tx.is_closed());
    let e = futures::executor::block_on(tx.send("x".into())).unwrap_err();
    assert_eq!(e, SendError("x".to_string()));
    assert!(matches!(
        tx.try_send("y".into()),
        Err(TrySendError::Closed(_))
    ));
}

#[test]
fn shared_try_apis_and_close() {
    let (mut tx, mut rx) = shared::bounded::<u32>(1).unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.try_send(1).unwrap();
    assert!(matches!(tx.try_send(2), Err(TrySendError::Full(2))));
    assert_eq!(rx.try_recv(), Ok(1));
    tx.try_send(3).unwrap();
    drop(tx);
    assert_eq!(
        rx.try_recv(),
        Ok(3),
        "values sent before the close still arrive"
    );
    assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
    assert!(shared::bounded::<u8>(0).is_err());
}

/// The try forms' errors are errors: `?` turns them into a `Box<dyn Error + Send + Sync>` (as
/// `SendError` and std's and tokio's try errors do), with a message saying what happened. They
/// had only `Debug`, so a caller could not `?` them.
#[test]
fn try_errors_are_std_errors_with_a_message() {
    fn boxed<E: std::error::Error + Send + Sync + 'static>(e: E) -> String {
        let b: Box<dyn std::error::Error + Send + Sync> = e.into();
        b.to_string()
    }
    let (mut tx, mut rx) = shared::bounded::<u32>(1).unwrap();
    assert!(boxed(rx.try_recv().unwrap_err()).contains("empty"));
    tx.try_send(1).unwrap();
    let full = boxed(tx.try_send(2).unwrap_err());
    assert!(full.contains("full"), "{full}");
    drop(rx);
    let closed = boxed(tx.try_send(3).unwrap_err());
    assert!(closed.contains("receiver"), "{closed}");
    let (tx, mut rx) = shared::bounded::<u32>(1).unwrap();
    drop(tx);
    let closed = boxed(rx.try_recv().unwrap_err());
    assert!(closed.contains("sender"), "{closed}");
}

/// A receiver parked on an empty channel is woken by a sender on another shard, and a sender
/// parked on a full one by the receiver; dropping the sender ends the receiver's loop.
#[test]
fn shared_wakes_cross_shards_both_ways() {
    let ex = exec(2);
    let (mut tx, mut rx) = shared::bounded::<u32>(1).unwrap();
    ex.spawn_on(0, move || async move {
        for i in 0..50 {
            xtc_shards::time::sleep(Duration::from_micros(200)).await;
            tx.send(i).await.unwrap();
        }
    })
    .unwrap();
    let h = ex
        .spawn_on(1, move || async move {
            let mut got = Vec::new();
            while let Some(v) = rx.recv().await {
                got.push(v);
                if v % 10 == 0 {
                    // Let the sender fill the channel and wait for space.
                    xtc_shards::time::sleep(Duration::from_millis(2)).await;
                }
            }
            got
        })
        .unwrap();
    run_within(&ex, RUN_LIMIT).expect("run() hung").unwrap();
    assert_eq!(
        futures::executor::block_on(h).unwrap(),
        (0..50).collect::<Vec<_>>()
    );
}

/// A plain thread feeding a shard through a shared channel (the sender is off any loop).
#[test]
fn shared_from_a_plain_thread() {
    let ex = exec(1);
    let (mut tx, mut rx) = shared::bounded::<u64>(8).unwrap();
    let h = ex
        .spawn_on(0, move || async move {
            let mut n = 0;
            while rx.recv().await.is_some() {
                n += 1;
            }
            n
        })
        .unwrap();
    let t = std::thread::spawn(move || {
        futures::executor::block_on(async {
            for i in 0..10_000 {
                tx.send(i).await.unwrap();
            }
        })
    });
    // The feeding thread's wakes are what end this run.
    let dog = Watchdog::new(ex.handle(), HANG, "a receiver fed from a plain thread");
    run_within(&ex, RUN_LIMIT).expect("run() hung").unwrap();
    dog.done();
    t.join().unwrap();
    assert_eq!(futures::executor::block_on(h).unwrap(), 10_000);
}

#[test]
fn local_channel_backpressure_and_close() {
    LocalExecutor::new().unwrap().block_on(async {
        let (tx, mut rx) = local::bounded::<u32>(2).unwrap();
        let tx2 = tx.clone();
        let p1 = xtc_shards::spawn_local(async move {
            for i in 0..100 {
                tx.send(i).await.unwrap();
            }
        });
        let p2 = xtc_shards::spawn_local(async move {
            for i in 100..200 {
                tx2.send(i).await.unwrap();
            }
        });
        let mut got = Vec::new();
        while let Some(v) = rx.recv().await {
            got.push(v);
        }
        p1.await.unwrap();
        p2.await.unwrap();
        got.sort_unstable();
        assert_eq!(got, (0..200).collect::<Vec<_>>());
        assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
    });
}

#[test]
fn local_send_to_dropped_receiver() {
    LocalExecutor::new().unwrap().block_on(async {
        let (tx, rx) = local::bounded::<u8>(1).unwrap();
        drop(rx);
        assert_eq!(tx.send(5).await, Err(SendError(5)));
        assert!(local::bounded::<u8>(0).is_err());
    });
}

/// Batches across shards with a small ring: every value arrives once, in order, through
/// backpressure on the sender and waits on the receiver; then close semantics of both calls.
#[test]
fn shared_batches_across_shards_keep_order_and_close() {
    let ex = exec(2);
    let (mut tx, mut rx) = shared::bounded::<u64>(8).unwrap();
    const N: u64 = 100_000;
    ex.spawn_on(0, move || async move {
        let mut next = 0;
        while next < N {
            // Batches of uneven sizes, larger and smaller than the ring.
            let len = 1 + next % 23;
            let end = (next + len).min(N);
            tx.send_many(next..end).await.unwrap();
            next = end;
        }
    })
    .unwrap();
    let sink = ex
        .spawn_on(1, move || async move {
            let mut buf = Vec::new();
            let (mut expect, mut batches) = (0u64, 0u64);
            loop {
                buf.clear();
                let n = rx.recv_many(&mut buf, 5).await;
                if n == 0 {
                    break;
                }
                assert!(n <= 5, "at most the limit: {n}");
                assert_eq!(n, buf.len());
                for &v in &buf {
                    assert_eq!(v, expect, "order kept, nothing lost or doubled");
                    expect += 1;
                }
                batches += 1;
            }
            // Closed and drained: 0 from now on, and Closed from the try form.
            assert_eq!(rx.recv_many(&mut buf, 5).await, 0);
            assert_eq!(rx.try_recv_many(&mut buf, 5), Err(TryRecvError::Closed));
            (expect, batches)
        })
        .unwrap();
    run_within(&ex, RUN_LIMIT).expect("run() hung").unwrap();
    let (n, batches) = futures::executor::block_on(sink).unwrap();
    assert_eq!(n, N);
    assert!(batches >= N / 5, "{batches} batches of at most 5");
}

#[test]
fn shared_batch_try_forms_and_send_many_to_a_dropped_receiver() {
    LocalExecutor::new().unwrap().block_on(async {
        let (mut tx, mut rx) = shared::bounded::<u32>(4).unwrap();
        let mut buf = Vec::new();
        assert_eq!(rx.try_recv_many(&mut buf, 8), Err(TryRecvError::Empty));
        let mut items = (0..10).peekable();
        assert_eq!(tx.try_send_many(&mut items), Ok(4), "as many as fit");
        assert_eq!(tx.try_send_many(&mut items), Ok(0), "full");
        assert_eq!(items.peek(), Some(&4), "unsent items stay in the iterator");
        assert_eq!(rx.try_recv_many(&mut buf, 0), Ok(0));
        assert_eq!(rx.try_recv_many(&mut buf, 3), Ok(3));
        assert_eq!(buf, [0, 1, 2]);
        assert_eq!(tx.try_send_many(&mut items), Ok(3));
        assert_eq!(rx.try_recv_many(&mut buf, 8), Ok(4));
        assert_eq!(buf, [0, 1, 2, 3, 4, 5, 6]);
        drop(rx);
        assert!(matches!(
            tx.try_send_many(&mut items),
            Err(TrySendError::Closed(()))
        ));
        let e = tx.send_many(items).await.unwrap_err();
        assert_eq!(
            e.0.collect::<Vec<_>>(),
            vec![7, 8, 9],
            "the unsent rest comes back"
        );
        // An endless stream to a closed channel gives its rest back as the iterator (it used
        // to be collected into a Vec: a hang, then an abort).
        let e = tx.send_many(0u32..).await.unwrap_err();
        assert_eq!(e.0.take(3).collect::<Vec<_>>(), vec![0, 1, 2]);
    });
}

/// A waiting sender whose `send` is dropped (a timeout) must not take the freed slot's wake
/// with it: the next waiting sender gets it. Both sides used to wait for good here.
#[test]
fn local_a_cancelled_waiting_send_passes_the_freed_slot_on() {
    LocalExecutor::new().unwrap().block_on(async {
        let (tx, mut rx) = local::bounded::<u32>(1).unwrap();
        tx.try_send(0).unwrap();
        // A waits on the full channel, then gives up.
        let a = xtc_shards::time::timeout(Duration::from_millis(5), tx.send(1)).await;
        assert!(a.is_err(), "the channel was full: A's send must time out");
        // B waits on the full channel.
        let tx_b = tx.clone();
        let b = xtc_shards::spawn_local(async move { tx_b.send(2).await });
        xtc_shards::yield_now().await;
        // The receiver frees the slot: B must be woken and send.
        assert_eq!(rx.recv().await, Some(0));
        let got = xtc_shards::time::timeout(HANG, rx.recv()).await;
        assert_eq!(got, Ok(Some(2)), "B was never woken for the freed slot");
        b.await.unwrap().unwrap();
    });
}

/// A sender polled again while still waiting (a `join!` sibling woke its task) keeps one place
/// in line: a freed slot must not be spent on its stale second entry while another sender
/// waits.
#[test]
fn local_a_repolled_waiting_send_keeps_one_place_in_line() {
    LocalExecutor::new().unwrap().block_on(async {
        let (tx, mut rx) = local::bounded::<u32>(1).unwrap();
        tx.try_send(0).unwrap();
        let tx_a = tx.clone();
        let a = xtc_shards::spawn_local(async move {
            // The sibling wakes this task twice while the send waits: the send is re-polled.
            let send = tx_a.send(1);
            let poke = async {
                xtc_shards::yield_now().await;
                xtc_shards::yield_now().await;
            };
            let (sent, ()) = futures::join!(send, poke);
            sent
        });
        // Let A register, and be re-polled, before B waits behind it.
        for _ in 0..4 {
            xtc_shards::yield_now().await;
        }
        let tx_b = tx.clone();
        let b = xtc_shards::spawn_local(async move { tx_b.send(2).await });
        xtc_shards::yield_now().await;
        let mut got = Vec::new();
        for _ in 0..3 {
            let v = xtc_shards::time::timeout(HANG, rx.recv()).await;
            got.push(v.expect("a waiting sender was never woken").unwrap());
        }
        assert_eq!(got, vec![0, 1, 2]);
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
    });
}

/// A waker that counts its wake-ups.
struct Count(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Count {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A `recv` that waited and was dropped (a timeout), then a `recv` that waits with another
/// waker (another task): the next send wakes the new waker, not the stale one. The receiver
/// keeps the waker of its last wait for the next one (`will_wake` skips the clone), so a
/// stale one kept there would take the wake-up from the task now waiting.
#[test]
fn shared_a_recv_waiting_again_with_another_waker_gets_the_wake() {
    use std::{
        future::Future,
        pin::Pin,
        sync::{
            atomic::{AtomicUsize, Ordering::SeqCst},
            Arc,
        },
        task::{Context, Waker},
    };
    // Off any loop every push signals at once; 4 and 64 slots alike.
    for cap in [4usize, 64] {
        let (mut tx, mut rx) = shared::bounded::<u32>(cap).unwrap();
        let (old, new) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        for (w, polls) in [(&old, 1), (&new, 2)] {
            let waker = Waker::from(w.clone());
            let mut recv = rx.recv();
            for _ in 0..polls {
                let polled = Pin::new(&mut recv).poll(&mut Context::from_waker(&waker));
                assert!(polled.is_pending());
            }
        }
        tx.try_send(7).unwrap();
        assert_eq!(
            (old.0.load(SeqCst), new.0.load(SeqCst)),
            (0, 1),
            "capacity {cap}"
        );
        assert_eq!(rx.try_recv(), Ok(7));
    }
}

/// What the tests that poll a channel's futures by hand, with counting wakers, use.
mod manual {
    pub(crate) use std::{
        future::Future,
        pin::Pin,
        sync::{
            atomic::{AtomicUsize, Ordering::SeqCst},
            Arc,
        },
        task::{Context, Poll, Waker},
    };
}

/// Waiting senders that were woken for freed slots and lost them to `try_send`s go back into
/// the line in the order they first waited: the older one gets the next slot. Both went back
/// to the front of the line, one after the other, which put the later one first.
#[test]
fn local_woken_senders_that_lose_their_slots_keep_their_order() {
    use manual::*;
    for waiting in [2usize, 3] {
        let (tx, mut rx) = local::bounded::<usize>(waiting).unwrap();
        for _ in 0..waiting {
            tx.try_send(0).unwrap();
        }
        let wakes: Vec<_> = (0..waiting)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let wakers: Vec<Waker> = wakes.iter().map(|w| Waker::from(w.clone())).collect();
        let mut sends: Vec<_> = (1..=waiting).map(|i| tx.send(i)).collect();
        let poll = |i: usize, sends: &mut Vec<local::SendFut<'_, usize>>| {
            Pin::new(&mut sends[i]).poll(&mut Context::from_waker(&wakers[i]))
        };
        // Oldest first, every sender waits on the full channel.
        for i in 0..waiting {
            assert!(poll(i, &mut sends).is_pending());
        }
        // Every slot is freed (every waiter is woken), then taken by a `try_send`.
        for _ in 0..waiting {
            rx.try_recv().unwrap();
        }
        assert!(wakes.iter().all(|w| w.0.load(SeqCst) == 1));
        for _ in 0..waiting {
            tx.try_send(9).unwrap();
        }
        // The woken senders find no slot, oldest polled first, and go back into line.
        for i in 0..waiting {
            assert!(poll(i, &mut sends).is_pending());
        }
        // One slot at a time: the senders get them in the order they first waited.
        let mut got = Vec::new();
        for i in 0..waiting {
            got.push(rx.try_recv().unwrap());
            assert_eq!(
                wakes[i].0.load(SeqCst),
                2,
                "sender {i} of {waiting} not woken next"
            );
            assert!(matches!(poll(i, &mut sends), Poll::Ready(Ok(()))));
            for (j, w) in wakes.iter().enumerate().skip(i + 1) {
                assert_eq!(w.0.load(SeqCst), 1, "sender {j} woken before sender {i}");
            }
        }
        // What the receiver sees: the try_sends' values, then the senders' in order.
        got.extend(std::iter::from_fn(|| rx.try_recv().ok()));
        let mut want = vec![9; waiting];
        want.extend(1..=waiting);
        assert_eq!(got, want);
    }
}

/// Waiting senders that give up (dropped `send`s, as timeouts drop them) leave the line
/// without a search of it, and the senders that still wait get the freed slots in the order
/// they began waiting, whether few gave up or most did (which compacts the line), and when
/// later senders reuse the places the ones that left had in the waiters' table.
#[test]
fn local_senders_that_give_up_leave_the_others_their_order() {
    use manual::*;
    // (10, 4): a few give up. (200, 100): most do, and the line is compacted after later
    // senders took the leavers' places in the table.
    for (first, later) in [(10usize, 4usize), (200, 100)] {
        let (tx, mut rx) = local::bounded::<usize>(1).unwrap();
        tx.try_send(usize::MAX).unwrap();
        let total = first + later;
        let wakes: Vec<_> = (0..total)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let wakers: Vec<Waker> = wakes.iter().map(|w| Waker::from(w.clone())).collect();
        let mut sends: Vec<Option<local::SendFut<'_, usize>>> = Vec::new();
        let poll = |i: usize, sends: &mut Vec<Option<local::SendFut<'_, usize>>>| {
            let f = sends[i].as_mut().expect("a live send");
            Pin::new(f).poll(&mut Context::from_waker(&wakers[i]))
        };
        // The first senders wait, then every other one gives up.
        for i in 0..first {
            sends.push(Some(tx.send(i)));
            assert!(poll(i, &mut sends).is_pending());
        }
        for i in (0..first).step_by(2) {
            sends[i] = None;
        }
        // Later senders wait behind them (in the places the leavers had in the table), and
        // two of every three of those give up too.
        for i in first..total {
            sends.push(Some(tx.send(i)));
            assert!(poll(i, &mut sends).is_pending());
        }
        for (n, send) in sends[first..].iter_mut().enumerate() {
            if n % 3 != 0 {
                *send = None;
            }
        }
        let waiting: Vec<usize> = (0..total).filter(|&i| sends[i].is_some()).collect();
        assert_eq!(rx.try_recv(), Ok(usize::MAX));
        // One slot at a time, each to the oldest sender still waiting, and to no other.
        for (n, &i) in waiting.iter().enumerate() {
            assert_eq!(
                wakes[i].0.load(SeqCst),
                1,
                "{first}+{later}: sender {i} not woken when its turn came"
            );
            for &j in &waiting[n + 1..] {
                assert_eq!(
                    wakes[j].0.load(SeqCst),
                    0,
                    "{first}+{later}: sender {j} woken before sender {i}"
                );
            }
            assert!(matches!(poll(i, &mut sends), Poll::Ready(Ok(()))));
            assert_eq!(rx.try_recv(), Ok(i), "{first}+{later}");
        }
        assert!(rx.try_recv().is_err(), "{first}+{later}: a value too many");
        // Nobody waits now: a new send takes the free slot at once.
        assert!(tx.try_send(7).is_ok(), "{first}+{later}");
    }
}

/// A send that starts while another waits in line goes behind it: a slot freed for the
/// waiting sender, or freed beside it, is not taken by a newer `send` that polls before the
/// woken one runs (its wake queues it behind tasks already queued). It was: the newer send's
/// first attempt went ahead of the line, so a producer's values sent by successive tasks
/// (one per `send_to` message) arrived out of order, and a waiting sender could be passed
/// over again and again. With two slots freed, the waiter that sends hands the second one on.
#[test]
fn local_a_later_send_does_not_overtake_a_waiting_one() {
    LocalExecutor::new().unwrap().block_on(async {
        for cap in [1u32, 2] {
            let (tx, mut rx) = local::bounded::<u32>(cap as usize).unwrap();
            for i in 0..cap {
                tx.try_send(i).unwrap();
            }
            let tx_a = tx.clone();
            let a = xtc_shards::spawn_local(async move { tx_a.send(100).await });
            // A waits in line on the full channel.
            xtc_shards::yield_now().await;
            // B is queued to run before A's wake-up comes.
            let tx_b = tx.clone();
            let b = xtc_shards::spawn_local(async move { tx_b.send(200).await });
            for i in 0..cap {
                assert_eq!(rx.recv().await, Some(i));
            }
            if cap == 2 {
                // Both slots are free: A takes one, and B gets the other without a receive.
                let sent = xtc_shards::time::timeout(HANG, b).await;
                sent.expect("B was never woken for the second free slot")
                    .unwrap()
                    .unwrap();
                a.await.unwrap().unwrap();
                let got = (rx.try_recv(), rx.try_recv());
                assert_eq!(got, (Ok(100), Ok(200)), "capacity {cap}: B overtook A");
                continue;
            }
            let mut got = Vec::new();
            for _ in 0..2 {
                let v = xtc_shards::time::timeout(HANG, rx.recv()).await;
                got.push(v.expect("a waiting sender was never woken").unwrap());
            }
            assert_eq!(got, vec![100, 200], "capacity {cap}: B overtook A");
            a.await.unwrap().unwrap();
            b.await.unwrap().unwrap();
        }
        // With nobody waiting, a new send takes a free slot at once.
        let (tx, mut rx) = local::bounded::<u32>(2).unwrap();
        tx.send(7).await.unwrap();
        tx.send(8).await.unwrap();
        assert_eq!((rx.recv().await, rx.recv().await), (Some(7), Some(8)));
    });
}

/// Many senders through a 1-slot channel, half of them giving up early: every send that did
/// not time out is received exactly once, and nothing hangs.
#[test]
fn local_many_senders_some_cancelled_nothing_lost_nothing_stuck() {
    LocalExecutor::new().unwrap().block_on(async {
        let (tx, mut rx) = local::bounded::<u32>(1).unwrap();
        let mut senders = Vec::new();
        let gave_up = std::rc::Rc::new(std::cell::Cell::new(0));
        for i in 0..64u32 {
            let tx = tx.clone();
            let gave_up = gave_up.clone();
            senders.push(xtc_shards::spawn_local(async move {
                let patience = Duration::from_millis(if i % 2 == 0 { 1 } else { 10_000 });
                let sent = xtc_shards::time::timeout(patience, tx.send(i))
                    .await
                    .is_ok();
                gave_up.set(gave_up.get() + usize::from(!sent));
                sent
            }));
        }
        drop(tx);
        // Receive only once the impatient half (every even sender but 0, which filled the one
        // slot) gave up while waiting in line. A fixed 20 ms wait here raced their 1 ms
        // timeouts: one first polled after a long enough deschedule outlasted the wait.
        assert!(
            common::sleep_until(|| gave_up.get() == 31).await,
            "{}",
            gave_up.get()
        );
        let mut got = Vec::new();
        while let Some(v) = xtc_shards::time::timeout(HANG, rx.recv())
            .await
            .expect("stuck")
        {
            got.push(v);
        }
        let mut sent = Vec::new();
        for (i, s) in senders.into_iter().enumerate() {
            if s.await.unwrap() {
                sent.push(i as u32);
            }
        }
        got.sort_unstable();
        assert_eq!(got, sent, "received exactly the sends that completed");
        assert!(sent.iter().all(|i| i % 2 == 1 || *i < 2), "{sent:?}");
    });
}

/// Capacities whose slots cannot fit in memory are errors, not panics, on both kinds.
#[test]
fn oversized_capacities_are_errors() {
    for cap in [usize::MAX, usize::MAX / 2] {
        let Err(e) = shared::bounded::<u64>(cap) else {
            panic!("shared: a capacity of {cap} was accepted")
        };
        assert!(e.to_string().contains("capacity"), "{e}");
        let Err(e) = local::bounded::<u64>(cap) else {
            panic!("local: a capacity of {cap} was accepted")
        };
        assert!(e.to_string().contains("capacity"), "{e}");
    }
    // A zero-sized type still needs slots: counted as one byte each.
    assert!(shared::bounded::<()>(usize::MAX).is_err());
}

/// An iterator that panics part-way through a batch: the items it gave before are sent (and
/// dropped normally), none is leaked in the ring (rtrb's chunk filler left them written but
/// never published or dropped).
#[test]
fn shared_batch_with_a_panicking_iterator_leaks_nothing() {
    use std::sync::Arc;
    let token = Arc::new(());
    let (mut tx, mut rx) = shared::bounded::<Arc<()>>(8).unwrap();
    let t = token.clone();
    let mut items = (0..5)
        .map(move |i| {
            assert!(i != 2, "an iterator bug");
            t.clone()
        })
        .peekable();
    let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tx.try_send_many(&mut items)
    }));
    assert!(sent.is_err(), "the iterator's panic comes through");
    drop(items);
    assert!(rx.try_recv().is_ok());
    assert!(rx.try_recv().is_ok());
    assert_eq!(rx.try_recv().err(), Some(TryRecvError::Empty));
    assert_eq!(Arc::strong_count(&token), 1, "every item was dropped");
}

#[test]
fn a_dropped_shared_receiver_drops_what_was_queued() {
    let drops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (mut tx, rx) = shared::bounded::<CountDrop>(4).unwrap();
    tx.try_send(CountDrop(drops.clone())).unwrap();
    tx.try_send(CountDrop(drops.clone())).unwrap();
    drop(rx);
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert!(tx.is_closed());
    drop(tx);
}

#[test]
fn a_reply_sender_queued_to_a_dropped_receiver_closes_its_channel() {
    // Request/reply: the request carries the reply channel's sender; the server goes without
    // reading. The client learns it from its reply channel closing.
    let ex = exec_with_grace(2, Duration::from_millis(500));
    let (req_tx, req_rx) = shared::bounded::<shared::Sender<u32>>(4).unwrap();
    let client = ex
        .spawn_on(0, move || async move {
            let mut req_tx = req_tx;
            let (reply_tx, mut reply_rx) = shared::bounded::<u32>(1).unwrap();
            req_tx.send(reply_tx).await.unwrap();
            reply_rx.recv().await
        })
        .unwrap();
    ex.spawn_on(1, move || async move {
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        drop(req_rx);
    })
    .unwrap();
    run_or_fail(
        ex,
        Duration::from_secs(10),
        "request/reply with a server gone",
    )
    .unwrap();
    assert_eq!(futures::executor::block_on(client).unwrap(), None);
}

#[test]
fn a_panicking_waker_woken_by_a_channel_signal_does_not_stop_the_executor() {
    use std::task::Context;
    let ex = exec(2);
    let (mut tx, mut rx) = shared::bounded::<u32>(8).unwrap();
    let receiver = ex
        .spawn_on(0, move || async move {
            let waker = panicking_waker();
            {
                let mut recv = rx.recv();
                let polled = std::future::Future::poll(
                    std::pin::Pin::new(&mut recv),
                    &mut Context::from_waker(&waker),
                );
                assert!(polled.is_pending());
            }
            // Until the value is there (the send comes from shard 1 about 20 ms in); bounded by
            // the hang guard below.
            loop {
                match rx.try_recv() {
                    Err(TryRecvError::Empty) => {
                        xtc_shards::time::sleep(Duration::from_millis(5)).await;
                    }
                    got => return got,
                }
            }
        })
        .unwrap();
    let sender = ex
        .spawn_on(1, move || async move {
            xtc_shards::time::sleep(Duration::from_millis(20)).await;
            // The end-of-turn signal wakes the panicking waker from shard 1's loop.
            tx.try_send(1).unwrap();
            // Shard 1's loop goes on after that wake.
            xtc_shards::time::sleep(Duration::from_millis(200)).await;
            xtc_shards::shard::id()
        })
        .unwrap();
    run_or_fail(ex, HANG, "a panicking channel waker").unwrap();
    assert_eq!(futures::executor::block_on(sender).unwrap(), 1);
    assert_eq!(
        futures::executor::block_on(receiver).unwrap(),
        Ok(1),
        "the value was delivered"
    );
}

#[test]
#[should_panic(expected = "polled after it completed")]
fn a_send_future_polled_again_after_its_error_panics() {
    let (mut tx, rx) = shared::bounded::<u32>(1).unwrap();
    drop(rx);
    let mut send = tx.send(5);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let first = std::future::Future::poll(std::pin::Pin::new(&mut send), &mut cx);
    assert!(matches!(first, std::task::Poll::Ready(Err(_))));
    // Not `Ok(())`: the value was given back, never sent.
    let _ = std::future::Future::poll(std::pin::Pin::new(&mut send), &mut cx);
}

/// A queued value whose `Drop` panics (dropped with its receiver) does not leave a sender
/// waiting for space asleep: the close wakes it first.
#[test]
fn a_panicking_queued_value_still_lets_a_waiting_sender_see_the_close() {
    struct Boom;
    impl Drop for Boom {
        fn drop(&mut self) {
            panic!("a queued value's drop panics");
        }
    }
    let (mut tx, rx) = shared::bounded::<Option<Boom>>(1).unwrap();
    tx.try_send(Some(Boom)).unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (parked_tx, parked_rx) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || {
        // Waits: the ring is full. Its first poll returning `Pending` (its waker registered)
        // is reported, so the receiver is dropped only once the send really waits.
        let mut send = std::pin::pin!(tx.send(None));
        let mut polls = 0;
        let r = futures::executor::block_on(std::future::poll_fn(|cx| {
            let p = std::future::Future::poll(send.as_mut(), cx);
            polls += 1;
            if polls == 1 {
                parked_tx.send(p.is_pending()).unwrap();
            }
            p
        }));
        done_tx.send(r.is_err()).unwrap();
    });
    let parked = parked_rx
        .recv_timeout(HANG)
        .expect("the send was never polled");
    assert!(parked, "the send did not wait on the full channel");
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(rx)));
    assert!(dropped.is_err(), "the value's panic reaches the dropper");
    let closed = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiting sender never woke");
    assert!(closed, "the send reports the closed channel");
    sender.join().unwrap();
}

/// A queued value whose `Drop` panics does not keep the values queued behind it alive: the
/// receiver's drop drops them all (as `channel::local`'s does), and the first panic reaches the
/// dropper. They used to stay in the ring, alive as long as the `Sender`: a reply sender among
/// them kept its channel open for good.
#[test]
fn a_panicking_queued_value_does_not_keep_the_values_behind_it_alive() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    /// Counts its drop, and panics in it when asked to.
    struct V(std::sync::Arc<AtomicUsize>, bool);
    impl Drop for V {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
            if self.1 {
                panic!("a queued value's drop panics");
            }
        }
    }
    let drops = std::sync::Arc::new(AtomicUsize::new(0));
    let (mut tx, rx) = shared::bounded::<V>(4).unwrap();
    tx.try_send(V(drops.clone(), true)).unwrap();
    tx.try_send(V(drops.clone(), false)).unwrap();
    tx.try_send(V(drops.clone(), true)).unwrap();
    tx.try_send(V(drops.clone(), false)).unwrap();
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(rx)));
    assert!(dropped.is_err(), "the value's panic reaches the dropper");
    assert_eq!(drops.load(SeqCst), 4, "every queued value was dropped");
    assert!(tx.is_closed());
    drop(tx);
    assert_eq!(drops.load(SeqCst), 4, "each exactly once");
}

/// `channel::local`: dropping the receiver wakes the waiting senders before it drops the
/// queued values, so a value whose `Drop` panics does not leave them asleep for good (they
/// had been taken off the waiting line, and nothing else would wake them).
#[test]
fn local_receiver_drop_with_a_panicking_value_still_wakes_waiting_senders() {
    /// A value whose drop panics when asked to.
    struct V(bool);
    impl Drop for V {
        fn drop(&mut self) {
            if self.0 {
                panic!("a Drop bug in a queued value");
            }
        }
    }
    let res = LocalExecutor::new().unwrap().block_on(async {
        let (tx, rx) = local::bounded::<V>(1).unwrap();
        tx.try_send(V(true)).ok().unwrap();
        let tx2 = tx.clone();
        let sender = xtc_shards::spawn_local(async move { tx2.send(V(false)).await.is_err() });
        // Let the sender park on the full channel.
        xtc_shards::yield_now().await;
        xtc_shards::yield_now().await;
        // Dropped in a task of its own: the value's panic goes to that task's handle.
        let dropper = xtc_shards::spawn_local(async move { drop(rx) });
        assert!(dropper.await.is_err(), "the value's Drop panicked");
        drop(tx);
        xtc_shards::time::timeout(HANG, sender).await
    });
    match res {
        Ok(closed) => assert!(closed.unwrap(), "the send saw the close"),
        Err(_) => panic!("the waiting sender was never woken after the receiver dropped"),
    }
}

/// `channel::local`: two queued values whose `Drop` panics do not abort the process when the
/// receiver drops (as they did, the second panicking while the first unwound through the
/// queue's drop); every value is dropped and the first panic reaches the dropper, as with
/// `channel::shared`.
#[test]
fn local_receiver_drop_with_two_panicking_values_drops_all_without_abort() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    /// Counts its drop, and panics in it when asked to.
    struct V(std::rc::Rc<AtomicUsize>, bool);
    impl Drop for V {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
            if self.1 {
                panic!("a queued value's drop panics");
            }
        }
    }
    let drops = std::rc::Rc::new(AtomicUsize::new(0));
    let (tx, rx) = local::bounded::<V>(4).unwrap();
    for panics in [true, false, true, false] {
        tx.try_send(V(drops.clone(), panics)).ok().unwrap();
    }
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(rx)));
    assert!(dropped.is_err(), "the value's panic reaches the dropper");
    assert_eq!(drops.load(SeqCst), 4, "every queued value was dropped");
    drop(tx);
}

fn noop_cx() -> std::task::Context<'static> {
    std::task::Context::from_waker(std::task::Waker::noop())
}

/// A `send_many` dropped while it waits for space (the losing branch of a `select!`) loses
/// nothing: it has sent a prefix, the item it took to learn that more were coming stays in the
/// `Sender` and goes before the next send (or when the `Sender` drops, given room), and the
/// rest is still in the caller's iterator. The future used to drop that item.
#[test]
fn a_cancelled_send_many_loses_no_item() {
    use std::{future::Future, pin::Pin};
    for then_drop in [false, true] {
        let (mut tx, mut rx) = shared::bounded::<u64>(2).unwrap();
        let mut it = 0..10u64;
        {
            let mut fut = tx.send_many(it.by_ref());
            assert!(Pin::new(&mut fut).poll(&mut noop_cx()).is_pending());
        }
        let mut got = Vec::new();
        while let Ok(v) = rx.try_recv() {
            got.push(v);
        }
        assert_eq!(got, vec![0, 1]);
        assert_eq!(it.collect::<Vec<_>>(), (3..10).collect::<Vec<_>>());
        if then_drop {
            drop(tx);
            assert_eq!(rx.try_recv(), Ok(2));
            assert_eq!(rx.try_recv().err(), Some(TryRecvError::Closed));
        } else {
            tx.try_send(100).unwrap();
            assert_eq!(rx.try_recv(), Ok(2));
            assert_eq!(rx.try_recv(), Ok(100));
        }
    }
}

/// A `send_many` cancelled at a full ring leaves the item it peeked in the `Sender`; a
/// `Sender` then dropped while the ring is still full dropped that item: the receiver got the
/// ring's items, then `Closed`, one item short, though the receiver was alive and the items
/// behind it were still in the caller's iterator. It is received after the ring's items now
/// (by `recv` and `recv_many` alike), and a receiver dropped without taking it drops it once.
#[test]
fn a_held_item_is_received_after_its_sender_dropped_on_a_full_ring() {
    use std::{
        future::Future,
        pin::Pin,
        sync::{
            atomic::{AtomicUsize, Ordering::SeqCst},
            Arc,
        },
    };
    // Sends 0 and 1 into a ring of 2, peeks 2, waits; dropped: 2 is held, 3.. stay in `it`.
    let cancelled = |tx: &mut shared::Sender<u64>, it: &mut std::ops::Range<u64>| {
        let mut fut = tx.send_many(it.by_ref());
        assert!(Pin::new(&mut fut).poll(&mut noop_cx()).is_pending());
    };
    let (mut tx, mut rx) = shared::bounded::<u64>(2).unwrap();
    let mut it = 0..5u64;
    cancelled(&mut tx, &mut it);
    drop(tx);
    assert_eq!(rx.try_recv(), Ok(0));
    assert_eq!(rx.try_recv(), Ok(1));
    assert_eq!(
        rx.try_recv(),
        Ok(2),
        "the held item was lost with its Sender"
    );
    assert_eq!(rx.try_recv().err(), Some(TryRecvError::Closed));
    assert_eq!(it.collect::<Vec<_>>(), vec![3, 4]);

    // The same through recv_many, awaited.
    let (mut tx, mut rx) = shared::bounded::<u64>(2).unwrap();
    let mut it = 0..5u64;
    cancelled(&mut tx, &mut it);
    drop(tx);
    let got = futures::executor::block_on(async {
        let mut buf = Vec::new();
        while rx.recv_many(&mut buf, 8).await > 0 {}
        buf
    });
    assert_eq!(got, vec![0, 1, 2]);

    // A receiver dropped with the held item still there drops it, once.
    let drops = Arc::new(AtomicUsize::new(0));
    let (mut tx, rx) = shared::bounded::<CountDrop>(1).unwrap();
    let mut items = (0..3).map(|_| CountDrop(drops.clone()));
    {
        let mut fut = tx.send_many(items.by_ref());
        assert!(Pin::new(&mut fut).poll(&mut noop_cx()).is_pending());
    }
    drop(items);
    drop(tx);
    assert_eq!(drops.load(SeqCst), 0, "the held item went with its Sender");
    drop(rx);
    assert_eq!(
        drops.load(SeqCst),
        2,
        "the queued and the held item are dropped"
    );
}

/// The item a cancelled `send_many` left in the `Sender` is dropped when the receiver drops,
/// as the ring's items are: it stayed in the `Sender` as long as that lived (a reply
/// channel's sender in it kept that channel open), and no later send gave it back or dropped
/// it. A `send_many` cancelled after the receiver went drops its peeked item at once too.
#[test]
fn a_held_item_is_dropped_with_the_receiver_not_kept_by_the_sender() {
    use std::{
        future::Future,
        pin::Pin,
        sync::{
            atomic::{AtomicUsize, Ordering::SeqCst},
            Arc,
        },
    };
    let drops = Arc::new(AtomicUsize::new(0));
    let (mut tx, rx) = shared::bounded::<CountDrop>(1).unwrap();
    let mut items = (0..3).map(|_| CountDrop(drops.clone()));
    {
        // Sends one, peeks the second at the full ring; dropped: the second is held.
        let mut fut = tx.send_many(items.by_ref());
        assert!(Pin::new(&mut fut).poll(&mut noop_cx()).is_pending());
    }
    drop(items);
    assert_eq!(drops.load(SeqCst), 0);
    drop(rx);
    assert_eq!(
        drops.load(SeqCst),
        2,
        "the held item outlived the receiver, kept by the Sender"
    );
    // Later sends report the close and give their own value back.
    match tx.try_send(CountDrop(drops.clone())) {
        Err(TrySendError::Closed(v)) => drop(v),
        other => panic!("expected Closed, got {:?}", other.map_err(|_| ())),
    }
    assert_eq!(drops.load(SeqCst), 3);
    drop(tx);
    assert_eq!(drops.load(SeqCst), 3);

    // A `send_many` polled before the receiver went and dropped after: its peeked item is
    // not kept either.
    let drops = Arc::new(AtomicUsize::new(0));
    let (mut tx, rx) = shared::bounded::<CountDrop>(1).unwrap();
    let mut items = (0..3).map(|_| CountDrop(drops.clone()));
    {
        let mut fut = tx.send_many(items.by_ref());
        assert!(Pin::new(&mut fut).poll(&mut noop_cx()).is_pending());
        drop(rx);
        assert_eq!(drops.load(SeqCst), 1, "the queued item");
    }
    assert_eq!(drops.load(SeqCst), 2, "the peeked item went to the Sender");
    drop(items);
    drop(tx);
    assert_eq!(drops.load(SeqCst), 2);
}

/// Items that fill the ring exactly resolve at once, also from an iterator that cannot tell
/// it is finished before it is asked (a `filter` that drops the last items): no wait for the
/// receiver, which may run later in the same task.
#[test]
fn send_many_that_fills_the_ring_exactly_resolves_at_once() {
    LocalExecutor::new().unwrap().block_on(async {
        let (mut tx, mut rx) = shared::bounded::<u32>(2).unwrap();
        let sent = guard_fut(tx.send_many([1u32, 2, 3].into_iter().filter(|&x| x < 3))).await;
        assert!(sent.is_ok());
        assert_eq!(rx.try_recv(), Ok(1));
        assert_eq!(rx.try_recv(), Ok(2));
    });
}

/// Polls `fut` once: it must be ready (a hang here is the failure).
async fn guard_fut<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        std::task::Poll::Ready(v) => std::task::Poll::Ready(v),
        std::task::Poll::Pending => panic!("the send waited on a ring it had filled exactly"),
    })
    .await
}

/// The same panicking iterator with a `Copy` item: the items it gave before are sent. The
/// path for types without drop code used rtrb's chunk filler, which publishes nothing when
/// the iterator panics: they were lost.
#[test]
fn a_panicking_iterator_of_copy_items_still_sends_what_it_gave() {
    let (mut tx, mut rx) = shared::bounded::<u64>(8).unwrap();
    let mut items = (0..5u64)
        .inspect(|&i| assert!(i != 2, "an iterator bug"))
        .peekable();
    let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tx.try_send_many(&mut items)
    }));
    assert!(sent.is_err(), "the iterator's panic comes through");
    assert_eq!(rx.try_recv(), Ok(0));
    assert_eq!(rx.try_recv(), Ok(1));
    assert_eq!(rx.try_recv().err(), Some(TryRecvError::Empty));
}

/// A capacity whose slots do not fit in memory is an `Err` for the local channel too; it
/// used to allocate before checking, and panicked with a capacity overflow.
#[test]
fn a_local_channel_of_huge_slots_is_an_error_not_a_panic() {
    type Big = [u8; 1 << 60];
    let made = std::panic::catch_unwind(|| local::bounded::<Big>(16).is_err());
    assert_eq!(made.ok(), Some(true), "local::bounded panicked or accepted");
    assert!(shared::bounded::<Big>(16).is_err());
    // A capacity that fits is accepted without allocating its huge slots up front.
    let made = std::panic::catch_unwind(|| local::bounded::<Big>(2).is_ok());
    assert_eq!(made.ok(), Some(true));
}

/// A waker replaced by a later poll is dropped outside the channel's waker lock: its `Drop`
/// may be user code that touches the channel (here it owns the sender, whose drop wakes the
/// receiver's side). Dropped under the lock, this deadlocked on the lock it held.
#[test]
fn a_replaced_waker_whose_drop_closes_the_channel_does_not_deadlock() {
    use std::{
        future::Future,
        pin::Pin,
        sync::{Arc, Mutex},
        task::{Context, Poll, Wake, Waker},
    };
    struct Owns(#[allow(dead_code)] Mutex<Option<shared::Sender<u8>>>);
    impl Wake for Owns {
        fn wake(self: Arc<Self>) {}
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (tx, mut rx) = shared::bounded::<u8>(1).unwrap();
        let owner = Waker::from(Arc::new(Owns(Mutex::new(Some(tx)))));
        let mut fut = rx.recv();
        assert!(Pin::new(&mut fut)
            .poll(&mut Context::from_waker(&owner))
            .is_pending());
        // The channel now holds the only other reference to `owner`.
        drop(owner);
        let got = Pin::new(&mut fut).poll(&mut Context::from_waker(Waker::noop()));
        done_tx.send(matches!(got, Poll::Ready(None))).unwrap();
    });
    let closed = done_rx
        .recv_timeout(HANG)
        .expect("the poll that replaced the waker deadlocked");
    assert!(
        closed,
        "the sender went with the waker: the channel is closed"
    );
}

/// A `send_many` whose iterator panics (at item 3) after the item it had peeked (2) was sent,
/// then dropped (a task harness catches the panic and drops the future): nothing touches the
/// iterator again, and nothing more is sent. Its drop used to pull item 4 into the `Sender`,
/// which sent it before a later, unrelated `try_send`.
#[test]
fn a_send_many_that_panicked_does_not_pull_another_item_when_dropped() {
    let (mut tx, mut rx) = shared::bounded::<u64>(2).unwrap();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = calls.clone();
    let mut it = (0..10u64).inspect(move |&i| {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        assert!(i != 3, "an iterator bug");
    });
    {
        let mut fut = tx.send_many(it.by_ref());
        // Sends 0 and 1, peeks 2 at the full ring: waits.
        assert!(
            std::future::Future::poll(std::pin::Pin::new(&mut fut), &mut noop_cx()).is_pending()
        );
        assert_eq!(rx.try_recv(), Ok(0));
        assert_eq!(rx.try_recv(), Ok(1));
        // Sends 2, then the iterator panics on 3.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::future::Future::poll(std::pin::Pin::new(&mut fut), &mut noop_cx())
        }));
        assert!(r.is_err(), "the iterator's panic comes through");
        let before_drop = calls.load(std::sync::atomic::Ordering::SeqCst);
        drop(fut);
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::SeqCst),
            before_drop,
            "dropping a send_many that panicked called the iterator again"
        );
    }
    assert_eq!(rx.try_recv(), Ok(2));
    assert_eq!(rx.try_recv().err(), Some(TryRecvError::Empty));
    // A later unrelated send must not deliver an item the failed send_many took.
    tx.try_send(100).unwrap();
    assert_eq!(
        rx.try_recv(),
        Ok(100),
        "an item the failed send_many pulled went first"
    );
}

/// The same, with a future pinned on the stack (a foreign thread's `block_on`): the unwind
/// drops it. Its drop used to call the iterator again, which panicked again: a panic while
/// panicking, and the process aborted instead of the panic reaching `catch_unwind`.
#[test]
fn a_send_many_dropped_by_the_unwind_of_its_iterators_panic_does_not_abort() {
    let (mut tx, mut rx) = shared::bounded::<u64>(2).unwrap();
    let mut it = (0..10u64).inspect(|&i| assert!(i < 3, "an iterator bug"));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut fut = std::pin::pin!(tx.send_many(it.by_ref()));
        assert!(std::future::Future::poll(fut.as_mut(), &mut noop_cx()).is_pending());
        assert_eq!(rx.try_recv(), Ok(0));
        assert_eq!(rx.try_recv(), Ok(1));
        let _ = std::future::Future::poll(fut.as_mut(), &mut noop_cx());
    }));
    assert!(r.is_err());
}

/// `local`: a waker's clone is user code too, here one that uses the channel (a send into
/// the channel a receiver waits on, a receive from the channel a sender waits on). The
/// clone ran under the channel's borrow ("already borrowed"); now it runs outside it, and the
/// wait looks at the channel again after it: the receiver gets the value the clone sent, the
/// sender the slot the clone freed.
#[test]
fn local_a_wakers_clone_that_uses_the_channel_runs_outside_its_borrow() {
    use std::{cell::RefCell, future::Future, pin::pin, rc::Rc, task::Context};
    let (tx, mut rx) = local::bounded::<u32>(1).unwrap();
    let sender = tx.clone();
    let waker = hooked_waker(move || sender.try_send(7).unwrap());
    let got = pin!(rx.recv()).poll(&mut Context::from_waker(&waker));
    assert_eq!(got, std::task::Poll::Ready(Some(7)));

    tx.try_send(1).unwrap(); // full
    let rx = Rc::new(RefCell::new(rx));
    let receiver = rx.clone();
    let waker = hooked_waker(move || assert_eq!(receiver.borrow_mut().try_recv(), Ok(1)));
    let sent = pin!(tx.send(2)).poll(&mut Context::from_waker(&waker));
    assert!(matches!(sent, std::task::Poll::Ready(Ok(()))), "{sent:?}");
    assert_eq!(rx.borrow_mut().try_recv(), Ok(2));
}

/// `shared`: a channel's end-of-turn signal calls a waker, which is user code (a custom
/// waker); here one that sends on a second channel, whose own end-of-turn signal it registers
/// while the loop runs the first turn's signals. That registration went to the next turn's
/// list, and the loop, with nothing else to do, parked without running it: the second
/// channel's receiver, on the other shard, slept for good.
#[test]
fn shared_a_signal_registered_while_the_loop_flushes_is_not_left_behind() {
    use std::{
        future::Future,
        pin::pin,
        sync::{Arc, Mutex},
        task::{Context, Wake, Waker},
    };
    struct SendsOn(Mutex<shared::Sender<u32>>);
    impl Wake for SendsOn {
        fn wake(self: Arc<Self>) {
            self.0.lock().unwrap().try_send(42).unwrap();
        }
    }
    let ex = xtc_shards::Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .stealing(false)
        .service_mode(true)
        .build()
        .unwrap();
    // Room for more than a quarter of a ring's pushes: signals wait for the end of the turn.
    let (tx_a, mut rx_a) = shared::bounded::<u32>(64).unwrap();
    let (mut tx_b, mut rx_b) = shared::bounded::<u32>(64).unwrap();
    let got = ex
        .spawn_on(1, move || async move {
            let v = rx_a.recv().await;
            xtc_shards::stop();
            v
        })
        .unwrap();
    ex.spawn_on(0, move || async move {
        // Let shard 1's receiver wait first.
        xtc_shards::time::sleep(Duration::from_millis(20)).await;
        // `rx_b` waits with the custom waker: the signal for `tx_b`'s push wakes it.
        let sends = Arc::new(SendsOn(Mutex::new(tx_a)));
        // Kept open past the wake, which consumes the waker's reference.
        std::mem::forget(sends.clone());
        let custom = Waker::from(sends);
        assert!(pin!(rx_b.recv())
            .poll(&mut Context::from_waker(&custom))
            .is_pending());
        tx_b.send(1).await.unwrap();
        // The loop runs `tx_b`'s signal at the end of this turn; both ends stay open (a
        // close would wake `rx_b` at once, in this poll).
        std::mem::forget((tx_b, rx_b));
    })
    .unwrap();
    // In service mode nothing else (no quiescence check) wakes an idle loop.
    let run = run_or_fail(
        ex,
        Duration::from_secs(10),
        "a signal registered while flushing",
    );
    assert!(run.is_ok(), "{run:?}");
    assert_eq!(futures::executor::block_on(got).unwrap(), Some(42));
}

/// `shared`: a waker's clone that drops the last sender (user code: a custom waker owning
/// it). The clone ran under the receiving side's waker lock, and the sender's drop wakes that
/// side under the same lock: a self-deadlock. The poll runs on a helper thread, so a hang
/// fails the test through a timeout.
#[test]
fn shared_a_wakers_clone_that_drops_the_sender_runs_outside_the_sides_lock() {
    use std::{cell::RefCell, future::Future, rc::Rc, task::Context};
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (tx, mut rx) = shared::bounded::<u32>(4).unwrap();
        let tx = Rc::new(RefCell::new(Some(tx)));
        let dropper = tx.clone();
        let waker = hooked_waker(move || drop(dropper.borrow_mut().take()));
        let got = std::pin::pin!(rx.recv()).poll(&mut Context::from_waker(&waker));
        // The clone closed the channel; the announcement's recheck sees it.
        let _ = done_tx.send(got == std::task::Poll::Ready(None));
    });
    let closed = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the recv's poll deadlocked inside the waker's clone");
    assert!(closed, "the channel closed by the clone reads as closed");
}

/// A waiting send that is dropped (a timeout) drops its waker after the channel's borrow: the
/// waker's drop is user code, and this one drops a `Sender`, which borrows the channel. It
/// ran under the borrow and panicked with "already borrowed".
#[test]
fn local_a_cancelled_senders_waker_is_dropped_outside_the_borrow() {
    use std::{future::Future, pin::Pin, task::Context};
    let (tx, mut rx) = local::bounded::<u32>(1).unwrap();
    tx.try_send(0).unwrap(); // full
    let other = tx.clone();
    let waker = drop_hooked_waker(move || drop(other));
    let mut fut = Box::pin(tx.send(1));
    assert!(Pin::new(&mut fut)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    drop(waker); // the channel's waiter list holds the only clone now
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(fut)));
    assert!(
        dropped.is_ok(),
        "dropping a waiting send panicked: its waker's drop ran under the channel's borrow"
    );
    assert_eq!(rx.try_recv(), Ok(0));
    drop(tx);
    assert_eq!(
        rx.try_recv(),
        Err(TryRecvError::Closed),
        "both senders are gone"
    );
}

/// The same for a waiting send that completes: it leaves the line, and its stored waker is
/// dropped after the borrow.
#[test]
fn local_a_completed_waiting_senders_waker_is_dropped_outside_the_borrow() {
    use std::{future::Future, pin::Pin, task::Context};
    let (tx, mut rx) = local::bounded::<u32>(1).unwrap();
    tx.try_send(0).unwrap(); // full
                             // `b` waits first (a plain waker), `a` behind it with the hooked one.
    let mut b = Box::pin(tx.send(2));
    assert!(Pin::new(&mut b)
        .poll(&mut Context::from_waker(std::task::Waker::noop()))
        .is_pending());
    let other = tx.clone();
    let waker = drop_hooked_waker(move || drop(other));
    let mut a = Box::pin(tx.send(1));
    assert!(Pin::new(&mut a)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    drop(waker);
    // The freed slot is `b`'s: `a`, polled first, stays in line (a send does not overtake
    // the line); then `b` sends, the next freed slot is `a`'s, and `a` leaves the line.
    assert_eq!(rx.try_recv(), Ok(0));
    assert!(Pin::new(&mut a)
        .poll(&mut Context::from_waker(std::task::Waker::noop()))
        .is_pending());
    assert!(matches!(
        Pin::new(&mut b).poll(&mut Context::from_waker(std::task::Waker::noop())),
        std::task::Poll::Ready(Ok(()))
    ));
    assert_eq!(rx.try_recv(), Ok(2));
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Pin::new(&mut a).poll(&mut Context::from_waker(std::task::Waker::noop()))
    }));
    assert!(
        matches!(polled, Ok(std::task::Poll::Ready(Ok(())))),
        "the completing poll panicked: the waker was dropped under the channel's borrow"
    );
    drop(b);
}

/// `shared`: a signal registered while the *shutdown* runs the end-of-turn flushes (a custom
/// waker woken by one channel's signal sends on another) is run before the loop leaves. The
/// shutdown ran its flushes once per pass and left when nothing was live, so a registration
/// made by those very flushes stayed in the dropped loop's list: the other channel's receiver,
/// waiting on a plain thread, was never woken.
#[test]
fn shared_a_signal_registered_while_the_shutdown_flushes_is_not_left_behind() {
    use std::{
        future::Future,
        pin::pin,
        sync::{mpsc, Arc, Mutex},
        task::{Context, Wake, Waker},
    };
    struct SendsOn(Mutex<shared::Sender<u32>>);
    impl Wake for SendsOn {
        fn wake(self: Arc<Self>) {
            self.0.lock().unwrap().try_send(42).unwrap();
        }
    }
    /// Ends kept open until the test's end (a close would wake the receiver at once), and
    /// dropped then rather than forgotten: Miri's leak check runs on this test too.
    type Kept = Arc<Mutex<Vec<Box<dyn Send>>>>;
    /// Sends on drop (when the shutdown drops its task) without closing the channel.
    struct SendOnDrop(Option<shared::Sender<u32>>, Kept);
    impl Drop for SendOnDrop {
        fn drop(&mut self) {
            let mut tx = self.0.take().unwrap();
            tx.try_send(1).unwrap();
            // Kept open: a close would wake the receiver at once.
            self.1.lock().unwrap().push(Box::new(tx));
        }
    }
    let kept = Kept::default();
    // Room for more than a quarter of a ring's pushes: signals wait for the end of the turn.
    let (tx_a, mut rx_a) = shared::bounded::<u32>(64).unwrap();
    let (tx_b, mut rx_b) = shared::bounded::<u32>(64).unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = done_tx.send(futures::executor::block_on(rx_a.recv()));
        rx_a
    });
    // Let the plain thread's receiver wait first.
    std::thread::sleep(Duration::from_millis(50));
    let in_run = kept.clone();
    LocalExecutor::new().unwrap().block_on(async move {
        let kept = in_run;
        let sends = Arc::new(SendsOn(Mutex::new(tx_a)));
        // Kept open past the wake, which consumes the waker's reference.
        kept.lock().unwrap().push(Box::new(sends.clone()));
        let custom = Waker::from(sends);
        assert!(pin!(rx_b.recv())
            .poll(&mut Context::from_waker(&custom))
            .is_pending());
        kept.lock().unwrap().push(Box::new(rx_b));
        // Dropped by the shutdown, unfinished: its drop pushes on `tx_b`.
        let guard = SendOnDrop(Some(tx_b), kept.clone());
        drop(xtc_shards::spawn_local(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        }));
        xtc_shards::yield_now().await;
    });
    let got = done_rx.recv_timeout(HANG);
    assert_eq!(
        got,
        Ok(Some(42)),
        "the plain thread's receiver was never woken"
    );
    drop(waiter.join());
    drop(kept);
}

/// `local`: a waiting sender's waker that panics when the receiver's `try_recv` notifies it
/// (user code: a future polled with a custom waker) does not take the received value with it.
/// The value had been popped, then the wake unwound out of `try_recv` and dropped it: lost,
/// and the receiver, whose own code was fine, saw the sender's panic.
#[test]
fn local_a_waiting_senders_panicking_waker_does_not_lose_the_received_value() {
    use std::{future::Future, pin::Pin, task::Context};
    let (tx, mut rx) = local::bounded::<u32>(1).unwrap();
    tx.try_send(1).unwrap(); // full
    let waker = panicking_waker();
    let mut send = Box::pin(tx.send(2));
    assert!(Pin::new(&mut send)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rx.try_recv()));
    assert!(
        matches!(got, Ok(Ok(1))),
        "the received value was lost to the sender's panicking waker"
    );
    // The notified sender still gets the freed slot.
    assert!(matches!(
        Pin::new(&mut send).poll(&mut noop_cx()),
        std::task::Poll::Ready(Ok(()))
    ));
    assert_eq!(rx.try_recv(), Ok(2));
}

/// `local`: dropping the receiver wakes every waiting sender even if one's waker panics when
/// woken. The wakes ran in a row, so the first panic left the senders after it asleep for good
/// (taken off the line, marked notified: nothing else would wake them).
#[test]
fn local_receiver_drop_wakes_every_sender_past_a_panicking_waker() {
    use std::{
        future::Future,
        pin::Pin,
        sync::{
            atomic::{AtomicBool, Ordering::SeqCst},
            Arc,
        },
        task::{Context, Wake, Waker},
    };
    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, SeqCst);
        }
    }
    let (tx, rx) = local::bounded::<u32>(1).unwrap();
    tx.try_send(0).unwrap(); // full
    let mut first = Box::pin(tx.send(1));
    assert!(Pin::new(&mut first)
        .poll(&mut Context::from_waker(&panicking_waker()))
        .is_pending());
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let second_waker = Waker::from(flag.clone());
    let mut second = Box::pin(tx.send(2));
    assert!(Pin::new(&mut second)
        .poll(&mut Context::from_waker(&second_waker))
        .is_pending());
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(rx)));
    assert!(
        flag.0.load(SeqCst),
        "the second waiting sender was never woken by the close"
    );
    assert!(matches!(
        Pin::new(&mut second).poll(&mut noop_cx()),
        std::task::Poll::Ready(Err(_))
    ));
    assert!(matches!(
        Pin::new(&mut first).poll(&mut noop_cx()),
        std::task::Poll::Ready(Err(_))
    ));
}

/// A channel end that is dropped lets go of the waker it left in the channel (a `recv` or
/// `send` that waited, then was dropped with its end: a task cancelled, a `select!`), rather
/// than keep it until the other end goes too. The other end may live for good (a producer
/// stored in a long-lived structure), and that waker held its task's allocation (and its
/// loop's shared state) or, for a custom waker, whatever it owns: a `Sender` of another
/// channel in it kept that channel open, so its receiver never saw it close.
#[test]
fn a_dropped_end_lets_go_of_the_waker_it_left() {
    use std::{
        future::Future,
        pin::Pin,
        sync::Arc,
        task::{Context, Wake, Waker},
    };
    struct Counted;
    impl Wake for Counted {
        fn wake(self: Arc<Self>) {}
    }
    let held = |w: &Arc<Counted>| Arc::strong_count(w) - 1;

    // shared: a waiting receiver, dropped; the sender stays.
    let (tx, mut rx) = shared::bounded::<u32>(4).unwrap();
    let w = Arc::new(Counted);
    {
        let waker = Waker::from(w.clone());
        let mut recv = rx.recv();
        assert!(Pin::new(&mut recv)
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
    }
    drop(rx);
    assert_eq!(
        held(&w),
        0,
        "shared: the dropped receiver's waker is still held"
    );
    drop(tx);

    // shared: a waiting sender, dropped; the receiver stays.
    let (mut tx, rx) = shared::bounded::<u32>(1).unwrap();
    tx.try_send(0).unwrap(); // full
    let w = Arc::new(Counted);
    {
        let waker = Waker::from(w.clone());
        let mut send = tx.send(1);
        assert!(Pin::new(&mut send)
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
    }
    drop(tx);
    assert_eq!(
        held(&w),
        0,
        "shared: the dropped sender's waker is still held"
    );
    drop(rx);

    // local: a waiting receiver, dropped; a sender stays.
    let (tx, mut rx) = local::bounded::<u32>(4).unwrap();
    let w = Arc::new(Counted);
    {
        let waker = Waker::from(w.clone());
        let mut recv = Box::pin(rx.recv());
        assert!(recv
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
    }
    drop(rx);
    assert_eq!(
        held(&w),
        0,
        "local: the dropped receiver's waker is still held"
    );
    drop(tx);
}

/// A shared channel's capacity that passes the size check (its bytes fit in `isize::MAX`) but
/// that no machine can allocate (2^60 bytes: past any address space) is an `Err` saying so,
/// not an abort of the whole process: the ring is allocated up front, and its failed
/// allocation called `handle_alloc_error`.
#[test]
#[cfg_attr(
    miri,
    ignore = "Miri does not model a failed allocation (rust-lang/miri#613)"
)]
fn a_shared_capacity_no_machine_can_allocate_is_an_error_not_an_abort() {
    let Err(e) = shared::bounded::<u64>(1 << 57) else {
        panic!("a ring of 2^60 bytes was allocated")
    };
    assert!(e.to_string().contains("capacity"), "{e}");
    // Smaller rings are unaffected.
    let (mut tx, mut rx) = shared::bounded::<u64>(1 << 18).unwrap();
    tx.try_send(7).unwrap();
    assert_eq!(rx.try_recv(), Ok(7));
}

/// A `send_many` over a long iterator to a receiver that keeps up (here the iterator itself
/// drains the channel, so the ring never fills) never found the ring full, so it sent the
/// whole iterator in one poll: the loop's other tasks waited for all of it, and for an
/// endless one for good. It yields after a ring's worth per poll now.
#[test]
fn a_long_send_many_to_a_receiver_that_keeps_up_lets_other_tasks_run() {
    use std::{cell::Cell, rc::Rc};
    const LIMIT: u64 = 1_000_000;
    let ex = exec(1);
    let h = ex
        .spawn_on(0, || async {
            let (mut tx, mut rx) = shared::bounded::<u64>(8).unwrap();
            let ran = Rc::new(Cell::new(false));
            let r = ran.clone();
            drop(xtc_shards::spawn_local(async move { r.set(true) }));
            let sent = Rc::new(Cell::new(0u64));
            let s = sent.clone();
            let items = std::iter::from_fn(move || {
                while rx.try_recv().is_ok() {}
                if ran.get() || s.get() == LIMIT {
                    return None;
                }
                s.set(s.get() + 1);
                Some(s.get())
            });
            tx.send_many(items).await.unwrap();
            sent.get()
        })
        .unwrap();
    run_or_fail(ex, HANG, "send_many").unwrap();
    let sent = futures::executor::block_on(h).unwrap();
    assert!(
        sent < LIMIT,
        "the other task ran only after send_many had sent all {sent} items"
    );
}

/// The same on a ring of zero-sized values as large as an allocation may be (`bounded`
/// accepts it): the ring never fills, and a ring's worth per poll is `isize::MAX` items, so
/// an endless iterator held the loop for good (here a long one held it until its end). A
/// poll's batch has a fixed cap now, whatever the capacity.
#[test]
fn a_send_many_into_a_huge_ring_lets_other_tasks_run() {
    use std::{cell::Cell, rc::Rc};
    const LIMIT: u64 = 1 << 22;
    let ex = exec(1);
    let h = ex
        .spawn_on(0, || async {
            let (mut tx, _rx) = shared::bounded::<()>(isize::MAX as usize).unwrap();
            let ran = Rc::new(Cell::new(false));
            let r = ran.clone();
            drop(xtc_shards::spawn_local(async move { r.set(true) }));
            let sent = Rc::new(Cell::new(0u64));
            let s = sent.clone();
            let items = std::iter::from_fn(move || {
                if ran.get() || s.get() == LIMIT {
                    return None;
                }
                s.set(s.get() + 1);
                Some(())
            });
            tx.send_many(items).await.unwrap();
            sent.get()
        })
        .unwrap();
    run_or_fail(ex, HANG, "send_many into a huge ring").unwrap();
    let sent = futures::executor::block_on(h).unwrap();
    assert!(
        sent < LIMIT,
        "the other task ran only after send_many had sent all {sent} items"
    );
}

#[test]
fn shared_recv_and_send_over_a_ready_ring_let_the_loop_turn() {
    const N: usize = 4096;
    let (mut tx, mut rx) = shared::bounded::<usize>(N).unwrap();
    // Filled from another thread before the consumer starts.
    std::thread::spawn(move || {
        for i in 0..N {
            tx.try_send(i).unwrap();
        }
        tx
    })
    .join()
    .unwrap();
    LocalExecutor::new().unwrap().block_on(async move {
        turns_during("ready receives", N, async |i| {
            assert_eq!(rx.recv().await, Some(i), "in order");
        })
        .await;
    });

    let (mut tx, mut rx) = shared::bounded::<usize>(N).unwrap();
    LocalExecutor::new().unwrap().block_on(async move {
        turns_during("sends with room", N, async |i| tx.send(i).await.unwrap()).await;
    });
    for i in 0..N {
        assert_eq!(rx.try_recv(), Ok(i), "every send landed, in order");
    }

    let (mut tx, mut rx) = shared::bounded::<usize>(N).unwrap();
    for i in 0..N {
        tx.try_send(i).unwrap();
    }
    LocalExecutor::new().unwrap().block_on(async move {
        let mut next = 0;
        turns_during("ready batch receives of 8", N / 8, async |_| {
            let mut buf = Vec::new();
            assert_eq!(rx.recv_many(&mut buf, 8).await, 8);
            assert_eq!(buf, (next..next + 8).collect::<Vec<_>>(), "in order");
            next += 8;
        })
        .await;
    });
}

/// Batch sends into a ring with room, each smaller than the ring, let the loop turn
/// (`common::turns_during`), as single `send`s do: `send_many` yields after a ring's worth of items
/// in one poll, but a loop of small batches to a consumer that keeps up never reached that,
/// never returned `Pending` and held its loop (other tasks, due timers, the inbox) for as long
/// as the stream lasted. The channel's run of items moved without waiting
/// (`CHANNEL_BUDGET`) counted `send` alone.
#[test]
fn shared_send_many_of_small_batches_over_a_ready_ring_lets_the_loop_turn() {
    const N: usize = 4096;
    let (mut tx, mut rx) = shared::bounded::<usize>(N).unwrap();
    LocalExecutor::new().unwrap().block_on(async move {
        turns_during("batch sends of 8 with room", N / 8, async |i| {
            tx.send_many(i * 8..i * 8 + 8).await.unwrap()
        })
        .await;
    });
    for i in 0..N {
        assert_eq!(rx.try_recv(), Ok(i), "every send landed, in order");
    }
}

/// A task that feeds its own local channel (an actor sending itself its next message) lets
/// the loop turn (`common::turns_during`): each `recv` found the value the task had just sent, so it
/// never returned `Pending` and held its loop (every other task, due timers) for good. No
/// other task can fill a local channel while its receiver's task holds the loop, so this is
/// the way a local `recv` keeps finding values.
#[test]
fn a_local_receiver_fed_by_its_own_task_lets_the_loop_turn() {
    const N: usize = 4096;
    LocalExecutor::new().unwrap().block_on(async move {
        let (tx, mut rx) = local::bounded::<usize>(4).unwrap();
        tx.send(0).await.unwrap();
        turns_during("self-fed local receives", N, async |i| {
            assert_eq!(rx.recv().await, Some(i), "in order");
            tx.send(i + 1).await.unwrap();
        })
        .await;
    });
}

/// A plain thread and a `LocalExecutor` on two threads, each waiting on the other over two
/// shared channels of boxed values (sends, batches both ways, a close): every value arrives,
/// in order, and none leaks. The cross-thread test of the shared channel that Miri can run
/// (`scripts/miri`): the others cross shards of an `Executor`, which Miri cannot build.
#[test]
fn shared_batches_between_a_plain_thread_and_a_local_executor_keep_order() {
    const N: u64 = 60;
    let (mut tx, mut rx) = shared::bounded::<Box<u64>>(4).unwrap();
    let (mut back_tx, mut back_rx) = shared::bounded::<Box<u64>>(3).unwrap();
    // If the loop side gives up (its timeout), its ends drop and these calls fail: no hang.
    let t = std::thread::spawn(move || {
        futures::executor::block_on(async move {
            tx.send_many((0..N / 2).map(Box::new)).await.unwrap();
            for i in N / 2..N {
                tx.send(Box::new(i)).await.unwrap();
            }
            drop(tx);
            let (mut got, mut buf) = (Vec::new(), Vec::new());
            while back_rx.recv_many(&mut buf, 5).await > 0 {
                got.append(&mut buf);
            }
            got.into_iter().map(|b| *b).collect::<Vec<_>>()
        })
    });
    LocalExecutor::new().unwrap().block_on(async move {
        let echo = async {
            let (mut buf, mut n) = (Vec::new(), 0);
            loop {
                if n % 2 == 0 {
                    match rx.recv().await {
                        Some(v) => buf.push(v),
                        None => break,
                    }
                } else if rx.recv_many(&mut buf, 7).await == 0 {
                    break;
                }
                n += 1;
            }
            back_tx.send_many(buf).await.unwrap();
        };
        xtc_shards::time::timeout(HANG, echo)
            .await
            .expect("the plain thread's values arrive");
    });
    assert_eq!(t.join().unwrap(), (0..N).collect::<Vec<_>>());
}
