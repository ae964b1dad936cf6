//! xtc values used outside the context they were made in: join handles, channels, timers and
//! cross-shard calls awaited, dropped or aborted on another executor, a `LocalExecutor`, a
//! plain thread or a foreign `block_on`.

mod common;
use common::*;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use xtc_shards::{channel, shard, spawn_local, time, Error, Executor, LocalExecutor};

/// Runs `f` on a thread and fails the test if it has not finished within `HANG`.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("hung: {what}"))
}

fn service(n: usize) -> Executor {
    let ex = exec(n);
    ex.set_service_mode(true);
    ex
}

/// A foreign `block_on` inside a task (blocking its loop: bad style, but it must not hang
/// when the work it waits for runs on another loop): a `Handle::submit_to` and a
/// `shard::submit_to` to another shard, asleep. The call's task went into the ring with its
/// ping left for the end of the turn, which the blocked loop never reached.
#[test]
fn a_foreign_block_on_inside_a_task_on_a_handle_call_to_another_shard() {
    let got = within("foreign block_on of a handle call", || {
        let a = exec(2);
        let h = a.handle();
        a.spawn_on(1, || async {}).unwrap();
        a.block_on(move || async move {
            // Let shard 1 go to sleep first.
            time::sleep(Duration::from_millis(50)).await;
            let a = futures::executor::block_on(h.submit_to(1, || async { shard::id() }));
            let b = futures::executor::block_on(shard::submit_to(1, || async { shard::id() }));
            (a.unwrap(), b.unwrap())
        })
        .unwrap()
    });
    assert_eq!(got, (1, 1));
}

/// The same foreign `block_on`, in a `Drop` that another executor's sweep runs with the loop
/// hidden, on the handle of a call the task sent to a sleeping shard just before: the call's
/// ring ping waits for the end of the turn, and the foreign poll's early send of it
/// (`Core::flush_deferred`) cannot reach a hidden loop, so the `block_on` hung for good. The
/// loop now sends its turn's deferred wakes as it hides. (Shard 1 might not be asleep yet,
/// and then this passes without testing anything; it cannot fail wrongly.)
#[test]
fn a_foreign_block_on_under_a_hidden_loop_of_a_call_sent_before() {
    let got = wait_on_a_call_to_a_sleeping_shard("foreign block_on under a hidden loop", |j| {
        in_a_sweep(move || futures::executor::block_on(j).unwrap())
    });
    assert_eq!(got, 1);
}

/// On shard 0 of a 2-shard executor, once shard 1 has parked: sends it a call (its ring ping
/// deferred to the end of this turn) and gives the call's handle to `wait`, in the same turn.
/// Hang-guarded ([`within`], naming `what`).
fn wait_on_a_call_to_a_sleeping_shard<T: Send + 'static>(
    what: &str,
    wait: impl FnOnce(xtc_shards::JoinHandle<usize>) -> T + Send + 'static,
) -> T {
    within(what, move || {
        let a = exec(2);
        let h = a.handle();
        a.block_on(move || async move {
            assert!(sleep_until(|| h.loop_stats(1).unwrap().parks > 0).await);
            wait(h.spawn_on(1, || async { shard::id() }).unwrap())
        })
        .unwrap()
    })
}

/// Runs `f` in the `Drop` of a task queued on another executor, never run, dropped here:
/// inside a task, that executor's sweep runs the drop with this loop hidden
/// (`context::off_loop`). Returns what `f` gave.
fn in_a_sweep<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    struct OnDrop<F: FnOnce() -> T, T>(Option<F>, mpsc::Sender<T>);
    impl<T, F: FnOnce() -> T> Drop for OnDrop<F, T> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                let _ = self.1.send(f());
            }
        }
    }
    let (tx, rx) = mpsc::channel();
    let on_drop = OnDrop(Some(f), tx);
    let other = exec(1);
    other
        .spawn_on(0, move || async move { drop(on_drop) })
        .unwrap();
    drop(other);
    rx.recv().unwrap()
}

/// The same with the call left in the hidden loop's backlog, its ring full (one slot, taken
/// by a message to shard 1, held busy until a plain thread lets it go): only that loop moves
/// its backlog into the ring, and the foreign poll's rule 3b wait (`Core::flush_deferred`)
/// could not reach it hidden, so the `block_on` waited for good.
#[test]
fn a_foreign_block_on_under_a_hidden_loop_of_a_call_left_in_the_backlog() {
    let got = wait_in_a_sweep_behind_a_full_ring(
        "foreign block_on under a hidden loop, backlog",
        |h| h.spawn_on(1, || async { shard::id() }).unwrap(),
        |j| futures::executor::block_on(j).unwrap(),
    );
    assert_eq!(got, 1);
}

/// On shard 0 of a [`ring_of_one`] executor, with ring 0 -> 1 full and shard 1 held busy:
/// `queue` queues work on shard 1 through the handle (its message goes to this loop's
/// backlog) and returns what to wait on, then `wait` waits on it in a drop that another
/// executor's sweep runs with this loop hidden ([`in_a_sweep`]); a plain thread lets shard 1
/// go 100 ms later. Hang-guarded ([`within`], naming `what`).
fn wait_in_a_sweep_behind_a_full_ring<W: Send + 'static, T: Send + 'static>(
    what: &str,
    queue: impl FnOnce(&xtc_shards::Handle) -> W + Send + 'static,
    wait: impl FnOnce(W) -> T + Send + 'static,
) -> T {
    within(what, move || {
        let ex = ring_of_one();
        let h = ex.handle();
        ex.block_on(move || async move {
            let release = hold_shard_1_with_a_full_ring().await;
            let w = queue(&h);
            in_a_sweep(move || {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(100));
                    release.store(true, SeqCst);
                });
                wait(w)
            })
        })
        .unwrap()
    })
}

/// Another executor's `block_on` inside a task, awaiting the handle of a call the task sent
/// to a sleeping shard just before: that run blocks the task's loop thread inside its turn, so
/// the call's ring ping, deferred to the turn's end, never went: the inner run reported a
/// false `Err(Deadlock)` (or, with the report off, hung). The outer loop now sends its turn's
/// deferred wakes as the inner run starts. (Shard 1 might not be asleep yet, and then this
/// passes without testing anything; it cannot fail wrongly.)
#[test]
fn another_executors_block_on_inside_a_task_of_a_call_sent_before() {
    for grace in [Some(Duration::from_secs(2)), None] {
        let got = wait_on_a_call_to_a_sleeping_shard(
            "another executor's block_on inside a task",
            move |j| {
                let b = Executor::builder()
                    .shards(1)
                    .deadlock_grace(grace)
                    .build()
                    .unwrap();
                b.block_on(move || async move { j.await.unwrap() })
            },
        );
        assert_eq!(got.unwrap(), 1, "deadlock grace {grace:?}");
    }
}

/// A 2-shard executor whose ring 0 -> 1 holds one message.
fn ring_of_one() -> Executor {
    Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .ring_capacity(1)
        .build()
        .unwrap()
}

/// From a task on shard 0: holds shard 1 busy in one poll until the flag returned is set (or
/// `HANG` passes), then fills ring 0 -> 1 (its one slot) so that it stays full until shard
/// 1's next turn.
async fn hold_shard_1_with_a_full_ring() -> Arc<std::sync::atomic::AtomicBool> {
    use std::sync::atomic::AtomicBool;
    let (started, release) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (s, r) = (started.clone(), release.clone());
    shard::send_to(1, move || async move {
        s.store(true, SeqCst);
        let t0 = Instant::now();
        while !r.load(SeqCst) && t0.elapsed() < HANG {
            std::hint::spin_loop();
        }
    })
    .await
    .unwrap();
    while !started.load(SeqCst) {
        time::sleep(Duration::from_millis(1)).await;
    }
    shard::send_to(1, || async {}).await.unwrap();
    release
}

/// The same for a shared channel end: a foreign `block_on` under a hidden loop of a receive
/// whose sender is a task the loop's task spawned behind a full ring (in its backlog) moves
/// the backlog, so the sender runs.
#[test]
fn a_foreign_block_on_under_a_hidden_loop_of_a_channel_fed_from_the_backlog() {
    let got = wait_in_a_sweep_behind_a_full_ring(
        "foreign channel recv under a hidden loop, backlog",
        |h| {
            let (mut tx, rx) = channel::shared::bounded::<u32>(4).unwrap();
            h.spawn_on(1, move || async move { tx.send(7).await.unwrap() })
                .unwrap();
            rx
        },
        |mut rx| futures::executor::block_on(rx.recv()),
    );
    assert_eq!(got, Some(7));
}

/// A foreign `block_on` inside a task of a cross-shard call whose ring is full at its first
/// poll (capacity 1, its one slot taken by a message that shard 1, held busy, has not drained):
/// `shard::submit_to` waits for ring space, `Handle::submit_to` leaves its message in the
/// loop's backlog. Either waited for the end of a loop turn (the waiters woken, the backlog
/// moved), which the blocked loop never reached, while shard 1's drain only pinged the loop,
/// not the foreign waker: the call hung for good. Shard 1 is let go from a plain thread once
/// the `block_on` has surely parked.
fn foreign_block_on_with_a_full_ring(through_handle: bool) -> usize {
    let ex = ring_of_one();
    let h = ex.handle();
    ex.block_on(move || async move {
        let release = hold_shard_1_with_a_full_ring().await;
        futures::executor::block_on(async move {
            let mut call: std::pin::Pin<Box<dyn std::future::Future<Output = _>>> =
                if through_handle {
                    Box::pin(h.submit_to(1, || async { shard::id() }))
                } else {
                    Box::pin(shard::submit_to(1, || async { shard::id() }))
                };
            assert!(
                futures::poll!(call.as_mut()).is_pending(),
                "the call completed with its ring full"
            );
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                release.store(true, SeqCst);
            });
            call.await.unwrap()
        })
    })
    .unwrap()
}

#[test]
fn a_foreign_block_on_of_a_submit_to_waiting_for_ring_space() {
    assert_eq!(
        within("foreign block_on of a submit_to, ring full", || {
            foreign_block_on_with_a_full_ring(false)
        }),
        1
    );
}

#[test]
fn a_foreign_block_on_of_a_handle_call_left_in_the_backlog() {
    assert_eq!(
        within("foreign block_on of a handle call, ring full", || {
            foreign_block_on_with_a_full_ring(true)
        }),
        1
    );
}

/// A foreign `block_on` inside a task that fills the ring to a parked shard with `send_to`s
/// and waits for room for one more: the pushes' pings wait for the end of the turn, which the
/// blocked loop never reaches, so the parked consumer never drained, and its `want_space`
/// swap, which wakes a foreign waiter, never came.
#[test]
fn a_foreign_block_on_filling_the_ring_of_a_parked_shard() {
    within(
        "foreign block_on, send_to into a parked shard's full ring",
        || {
            let ex = Executor::builder()
                .shards(2)
                .oversubscribe(true)
                .ring_capacity(2)
                .build()
                .unwrap();
            ex.block_on(move || async move {
                // Shard 1 goes idle and parks.
                time::sleep(Duration::from_millis(100)).await;
                futures::executor::block_on(async {
                    for _ in 0..4 {
                        shard::send_to(1, || async {}).await.unwrap();
                    }
                });
            })
            .unwrap()
        },
    );
}

/// A foreign `block_on` inside a task whose `send_to` waits for room behind a backlog (a
/// `Handle::submit_to` made while the ring was full): the reserve needs the backlog empty,
/// which only the end of a turn moved, so the consumer's wake found it still there and no
/// further wake came.
#[test]
fn a_foreign_block_on_of_a_send_to_behind_a_backlog() {
    let got = within("foreign block_on, send_to behind a backlog", || {
        let ex = ring_of_one();
        let h = ex.handle();
        ex.block_on(move || async move {
            // Ring 0 -> 1 full; the handle call's message goes to the backlog.
            let release = hold_shard_1_with_a_full_ring().await;
            futures::executor::block_on(async move {
                let call = h.submit_to(1, || async { shard::id() });
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(100));
                    release.store(true, SeqCst);
                });
                shard::send_to(1, || async {}).await.unwrap();
                call.await.unwrap()
            })
        })
        .unwrap()
    });
    assert_eq!(got, 1);
}

/// The same over a shared channel: a request sent from inside the foreign `block_on`, the
/// answer awaited there. The send's wake of the parked receiver waited for the end of the turn.
#[test]
fn a_foreign_block_on_inside_a_task_on_a_shared_channel_round_trip() {
    let got = within("foreign block_on over a channel", || {
        let a = exec(2);
        let (mut tx, mut rx) = channel::shared::bounded::<u32>(64).unwrap();
        let (mut btx, mut brx) = channel::shared::bounded::<u32>(64).unwrap();
        a.spawn_on(1, move || async move {
            while let Some(v) = rx.recv().await {
                btx.send(v + 1).await.unwrap();
            }
        })
        .unwrap();
        a.block_on(move || async move {
            time::sleep(Duration::from_millis(50)).await;
            futures::executor::block_on(async move {
                tx.send(1).await.unwrap();
                brx.recv().await.unwrap()
            })
        })
        .unwrap()
    });
    assert_eq!(got, 2);
}

/// A migratable task spawned and awaited inside a foreign `block_on` in a pinned task: an idle
/// peer loop takes it.
#[test]
fn a_foreign_block_on_inside_a_task_on_a_migratable_spawn() {
    let got = within("foreign block_on of a migratable spawn", || {
        let a = exec(2);
        let h = a.handle();
        a.block_on(move || async move {
            time::sleep(Duration::from_millis(50)).await;
            let x = futures::executor::block_on(xtc_shards::spawn(async { 5 })).unwrap();
            let y = futures::executor::block_on(h.spawn(async { 6 })).unwrap();
            x + y
        })
        .unwrap()
    });
    assert_eq!(got, 11);
}

/// A join handle of a pinned task of one executor awaited in a task of another, both
/// running; then of a migratable one.
#[test]
fn join_handles_awaited_in_another_executors_task() {
    within("join across executors", || {
        let a = exec(2);
        let b = exec(2);
        let pinned = a
            .spawn_on(1, || async {
                time::sleep(Duration::from_millis(30)).await;
                7
            })
            .unwrap();
        let migr = a.handle().spawn(async {
            time::sleep(Duration::from_millis(30)).await;
            8
        });
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            let got = b
                .block_on(move || async move {
                    let x = pinned.await.unwrap();
                    let y = xtc_shards::spawn(async move { migr.await.unwrap() })
                        .await
                        .unwrap();
                    (x, y)
                })
                .unwrap();
            assert_eq!(got, (7, 8));
            ra.join().unwrap().unwrap();
        });
    });
}

/// The same from a `LocalExecutor` and from a plain thread's `futures` block_on.
#[test]
fn join_handles_awaited_on_a_local_executor_and_a_plain_thread() {
    within("join from local/plain", || {
        let a = exec(2);
        let mk = |a: &Executor, v: u32| {
            a.spawn_on(1, move || async move {
                time::sleep(Duration::from_millis(20)).await;
                v
            })
            .unwrap()
        };
        let h1 = mk(&a, 1);
        let h2 = a.handle().spawn(async {
            time::sleep(Duration::from_millis(20)).await;
            2u32
        });
        let h3 = mk(&a, 3);
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            let l = s.spawn(move || {
                LocalExecutor::new()
                    .unwrap()
                    .block_on(async move { h1.await.unwrap() + h2.await.unwrap() })
            });
            let p = s.spawn(move || futures::executor::block_on(h3).unwrap());
            assert_eq!(l.join().unwrap(), 3);
            assert_eq!(p.join().unwrap(), 3);
            ra.join().unwrap().unwrap();
        });
    });
}

/// Abort from another executor's task, a local executor and a plain thread: the task is
/// dropped, the awaiting side sees cancelled, and the owner's `run()` returns.
#[test]
fn abort_from_foreign_contexts() {
    within("abort from foreign contexts", || {
        let a = exec(2);
        let dropped = Arc::new(AtomicUsize::new(0));
        let mk = |pinned: bool| {
            let d = CountDrop(dropped.clone());
            if pinned {
                a.spawn_on(1, move || async move {
                    let _d = d;
                    futures::future::pending::<()>().await
                })
                .unwrap()
            } else {
                a.handle().spawn(async move {
                    let _d = d;
                    futures::future::pending::<()>().await
                })
            }
        };
        let hs: Vec<_> = (0..6).map(|i| mk(i % 2 == 0)).collect();
        let mut hs = hs.into_iter();
        let (h0, h1, h2, h3, h4, h5) = (
            hs.next().unwrap(),
            hs.next().unwrap(),
            hs.next().unwrap(),
            hs.next().unwrap(),
            hs.next().unwrap(),
            hs.next().unwrap(),
        );
        let b = exec(1);
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            std::thread::sleep(Duration::from_millis(30));
            let r = b
                .block_on(move || async move {
                    h0.abort();
                    h1.abort();
                    (h0.await, h1.await)
                })
                .unwrap();
            assert!(r.0.unwrap_err().is_cancelled());
            assert!(r.1.unwrap_err().is_cancelled());
            let r = LocalExecutor::new().unwrap().block_on(async move {
                h2.abort();
                h3.abort();
                (h2.await, h3.await)
            });
            assert!(r.0.unwrap_err().is_cancelled());
            assert!(r.1.unwrap_err().is_cancelled());
            h4.abort();
            h5.abort();
            assert!(futures::executor::block_on(h4).unwrap_err().is_cancelled());
            assert!(futures::executor::block_on(h5).unwrap_err().is_cancelled());
            ra.join().unwrap().unwrap();
        });
        assert_eq!(dropped.load(SeqCst), 6);
    });
}

/// A handle dropped on another executor's loop, half polled (its waker registered there).
#[test]
fn a_join_handle_polled_then_dropped_on_another_executor() {
    within("polled then dropped elsewhere", || {
        let a = exec(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = std::sync::Mutex::new(rx);
        let h = a
            .spawn_on(0, move || async move {
                time::sleep(Duration::from_millis(50)).await;
                5
            })
            .unwrap();
        let b = exec(1);
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            b.block_on(move || async move {
                let mut h = h;
                let r = futures::poll!(&mut h);
                assert!(r.is_pending());
                drop(h);
            })
            .unwrap();
            drop(tx);
            let _ = rx.lock().unwrap().recv();
            ra.join().unwrap().unwrap();
        });
    });
}

/// A shared channel between a plain thread and a task, both ways, and closes from the plain
/// side while the task is parked.
#[test]
fn shared_channel_ends_on_plain_threads() {
    within("shared channel with plain threads", || {
        let a = exec(2);
        let (mut tx, mut rx) = channel::shared::bounded::<u32>(4).unwrap();
        let (mut btx, mut brx) = channel::shared::bounded::<u32>(4).unwrap();
        let h = a
            .spawn_on(1, move || async move {
                let mut n = 0;
                while let Some(v) = rx.recv().await {
                    n += v;
                    btx.send(v).await.unwrap();
                }
                n
            })
            .unwrap();
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            s.spawn(move || {
                futures::executor::block_on(async move {
                    for i in 0..100 {
                        tx.send(i).await.unwrap();
                    }
                });
            });
            let got = futures::executor::block_on(async move {
                let mut k = 0;
                while brx.recv().await.is_some() {
                    k += 1;
                }
                k
            });
            assert_eq!(got, 100);
            assert_eq!(futures::executor::block_on(h).unwrap(), (0..100).sum());
            ra.join().unwrap().unwrap();
        });
    });
}

/// A receiver parked in a task; the sender dropped unsent on a plain thread: the receiver
/// sees the close.
#[test]
fn a_sender_dropped_on_a_plain_thread_closes_a_parked_receiver() {
    within("sender dropped elsewhere", || {
        let a = exec(1);
        let (tx, mut rx) = channel::shared::bounded::<u32>(8).unwrap();
        let h = a
            .spawn_on(0, move || async move { rx.recv().await })
            .unwrap();
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            std::thread::sleep(Duration::from_millis(30));
            drop(tx);
            assert_eq!(futures::executor::block_on(h).unwrap(), None);
            ra.join().unwrap().unwrap();
        });
    });
}

/// A sleep registered on one executor's loop, then polled to completion on another's.
#[test]
fn a_sleep_moved_to_another_executor_completes_there_and_frees_the_first() {
    within("sleep moved", || {
        let a = exec(1);
        let (stx, srx) = mpsc::channel();
        a.spawn_on(0, move || async move {
            let mut s = time::sleep(Duration::from_millis(200));
            assert!(futures::poll!(&mut s).is_pending());
            stx.send(s).unwrap();
        })
        .unwrap();
        std::thread::scope(|s| {
            let t = Instant::now();
            let ra = s.spawn(|| a.run());
            let sl = srx.recv().unwrap();
            let b = exec(1);
            b.block_on(move || sl).unwrap();
            assert!(t.elapsed() >= Duration::from_millis(200));
            ra.join().unwrap().unwrap();
        });
    });
}

/// A sleep polled on a loop, then dropped on a plain thread long before its deadline: the
/// loop's run must not wait for the deadline.
#[test]
fn a_sleep_dropped_on_a_plain_thread_does_not_hold_its_loop() {
    within("sleep dropped elsewhere", || {
        let a = exec(1);
        let (stx, srx) = mpsc::channel();
        a.spawn_on(0, move || async move {
            let mut s = time::sleep(Duration::from_secs(3600));
            assert!(futures::poll!(&mut s).is_pending());
            stx.send(s).unwrap();
        })
        .unwrap();
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            let sl = srx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            drop(sl);
            ra.join().unwrap().unwrap();
        });
    });
}

/// A sleep polled off any loop panics with a message saying so.
#[test]
fn a_sleep_polled_off_any_loop_panics_clearly() {
    let r = std::panic::catch_unwind(|| {
        futures::executor::block_on(time::sleep(Duration::from_millis(1)))
    });
    let e = r.unwrap_err();
    let msg = e
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| e.downcast_ref::<String>().cloned())
        .unwrap();
    assert!(msg.contains("outside an xtc loop"), "{msg}");
}

/// `shard::submit_to` and friends polled off any loop say so.
#[test]
fn shard_calls_off_any_loop_are_off_loop_errors() {
    let r = futures::executor::block_on(shard::submit_to(0, || async { 1 }));
    assert!(matches!(r, Err(Error::OffLoop(_))), "{r:?}");
    let r = futures::executor::block_on(shard::send_to(0, || async {}));
    assert!(matches!(r, Err(Error::OffLoop(_))), "{r:?}");
    let r = futures::executor::block_on(shard::submit_to_all(|| async { 1 }));
    assert!(matches!(r.as_slice(), [Err(Error::OffLoop(_))]), "{r:?}");
}

/// A `Handle::submit_to` to the caller's own shard and to another, awaited inside a task.
#[test]
fn handle_calls_from_inside_its_own_executor() {
    within("handle reentrancy", || {
        let a = exec(2);
        let h = a.handle();
        let got = a
            .block_on(move || async move {
                let x = h.submit_to(0, || async { shard::id() }).await.unwrap();
                let y = h.submit_to(1, || async { shard::id() }).await.unwrap();
                h.send_to(0, || async {}).unwrap();
                let z = h
                    .spawn_on(0, || async { spawn_local(async { 3 }).await.unwrap() })
                    .unwrap()
                    .await
                    .unwrap();
                (x, y, z)
            })
            .unwrap();
        assert_eq!(got, (0, 1, 3));
    });
}

/// A `Handle::submit_to` of one executor awaited inside another's task and a local
/// executor's.
#[test]
fn handle_calls_from_another_executor() {
    within("handle across executors", || {
        let a = service(2);
        let ha = a.handle();
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            let b = exec(2);
            let ha2 = ha.clone();
            let got = b
                .block_on(move || async move {
                    ha2.submit_to(1, || async { shard::id() * 10 })
                        .await
                        .unwrap()
                })
                .unwrap();
            assert_eq!(got, 10);
            let ha3 = ha.clone();
            let got = LocalExecutor::new().unwrap().block_on(async move {
                ha3.submit_to(0, || async { shard::id() + 5 })
                    .await
                    .unwrap()
            });
            assert_eq!(got, 5);
            ha.stop();
            ra.join().unwrap().unwrap();
        });
    });
}

/// An executor run to completion inside a task of another (documented: `run()` may be called
/// inside another executor's task).
#[test]
fn an_executor_run_inside_another_executors_task() {
    within("nested run", || {
        let a = exec(2);
        let got = a
            .block_on(|| async {
                let b = exec(2);
                b.block_on(|| async {
                    shard::submit_to(1, || async {
                        time::sleep(Duration::from_millis(5)).await;
                        shard::id()
                    })
                    .await
                    .unwrap()
                })
                .unwrap()
            })
            .unwrap();
        assert_eq!(got, 1);
    });
}

/// A `LocalExecutor`'s `Handle`, kept past the executor: spawns are refused and calls queued
/// before its drop resolve instead of waiting for good.
#[test]
fn a_local_executors_handle_outliving_it() {
    within("local handle outliving", || {
        let l = LocalExecutor::new().unwrap();
        let h = l.block_on(async { shard::handle().unwrap() });
        let queued = h.submit_to(0, || async { 1 });
        let jh = h.spawn_on(0, || async { 2 }).unwrap();
        let spawned = h.spawn(async { 3 });
        drop(l);
        assert!(matches!(h.spawn_on(0, || async {}), Err(Error::Stopped)));
        assert!(matches!(
            futures::executor::block_on(queued),
            Err(Error::Stopped)
        ));
        assert!(futures::executor::block_on(jh).unwrap_err().is_cancelled());
        assert!(futures::executor::block_on(spawned)
            .unwrap_err()
            .is_cancelled());
        let late = h.spawn(async { 4 });
        assert!(futures::executor::block_on(late)
            .unwrap_err()
            .is_cancelled());
        assert!(matches!(
            futures::executor::block_on(h.submit_to(0, || async { 5 })),
            Err(Error::Stopped)
        ));
    });
}

/// A `LocalExecutor`'s `Handle` used from a plain thread while its `block_on` runs.
#[test]
fn a_local_executors_handle_from_a_plain_thread_while_it_runs() {
    within("local handle from plain thread", || {
        let l = LocalExecutor::new().unwrap();
        let got = l.block_on(async {
            let h = shard::handle().unwrap();
            let (tx, rx) = futures::channel::oneshot::channel();
            std::thread::spawn(move || {
                let v = futures::executor::block_on(h.submit_to(0, || async {
                    time::sleep(Duration::from_millis(5)).await;
                    shard::id() + 9
                }));
                let _ = tx.send(v);
            });
            rx.await.unwrap().unwrap()
        });
        assert_eq!(got, 9);
    });
}

/// An interval ticking on one executor's loop, moved to another executor's and ticked there,
/// then dropped on a plain thread.
#[test]
fn an_interval_moved_between_executors() {
    within("interval moved", || {
        let a = exec(1);
        let (itx, irx) = mpsc::channel();
        a.spawn_on(0, move || async move {
            let mut iv = time::interval(Duration::from_millis(10));
            iv.tick().await;
            iv.tick().await;
            // Registered for the next tick.
            assert!(futures::poll!(std::pin::pin!(iv.tick())).is_pending());
            itx.send(iv).unwrap();
        })
        .unwrap();
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            let mut iv = irx.recv().unwrap();
            let b = exec(1);
            let iv = b
                .block_on(move || async move {
                    for _ in 0..3 {
                        iv.tick().await;
                    }
                    let _ = futures::poll!(std::pin::pin!(iv.tick()));
                    iv
                })
                .unwrap();
            drop(iv);
            ra.join().unwrap().unwrap();
        });
    });
}

/// A timeout whose inner future is another executor's join handle, across the two.
#[test]
fn a_timeout_around_a_foreign_join_handle() {
    within("timeout around a foreign join", || {
        let a = exec(1);
        // Held until the timeout around it has expired: a fixed 300 ms here raced the start
        // of the other executor's 50 ms window (a second executor built meanwhile).
        let release = Arc::new(AtomicBool::new(false));
        let held = release.clone();
        let slow = a
            .spawn_on(0, move || async move {
                while !held.load(SeqCst) {
                    time::sleep(Duration::from_millis(1)).await;
                }
                1
            })
            .unwrap();
        let fast = a
            .spawn_on(0, || async {
                time::sleep(Duration::from_millis(10)).await;
                2
            })
            .unwrap();
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            let b = exec(1);
            let (r1, r2) = b
                .block_on(move || async move {
                    let r1 = time::timeout(Duration::from_millis(50), slow).await;
                    let r2 = time::timeout(Duration::from_secs(30), fast).await;
                    (r1.is_err(), r2.unwrap().unwrap())
                })
                .unwrap();
            release.store(true, SeqCst);
            assert!(r1);
            assert_eq!(r2, 2);
            ra.join().unwrap().unwrap();
        });
    });
}

/// `submit_to_all` of a migratable task that waits for ring space, then its handle awaited
/// from another executor.
#[test]
fn submit_to_all_awaited_from_elsewhere() {
    within("submit_to_all elsewhere", || {
        let a = exec(3);
        let h = a.handle().spawn(async {
            shard::submit_to_all(|| async { shard::id() })
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .sum::<usize>()
        });
        std::thread::scope(|s| {
            let ra = s.spawn(|| a.run());
            let got = LocalExecutor::new().unwrap().block_on(h).unwrap();
            assert_eq!(got, 3);
            ra.join().unwrap().unwrap();
        });
    });
}

/// I/O objects made in one `LocalExecutor`'s run and used in another's on the same thread,
/// the first still alive, then after it is gone; and off any loop.
#[test]
fn io_objects_moved_between_local_executors_of_one_thread() {
    within("io across local executors", || {
        let dir = std::env::temp_dir().join(format!("xtc-foreign-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"hello world").unwrap();
        let l1 = LocalExecutor::new().unwrap();
        let (file, listener, client, server) = l1.block_on({
            let path = path.clone();
            async move {
                let f = xtc_shards::fs::File::open(&path).await.unwrap();
                let l = xtc_shards::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                let c = xtc_shards::net::TcpStream::connect(addr).await.unwrap();
                let (s, _) = l.accept().await.unwrap();
                // A read dropped in flight (kept for the next read).
                {
                    let mut r = std::pin::pin!(s.read(vec![0u8; 16]));
                    assert!(futures::poll!(r.as_mut()).is_pending());
                }
                (f, l, c, s)
            }
        });
        // Off any loop: errors, not hangs or panics.
        let off = futures::executor::block_on(file.read_at(vec![0u8; 5], 0)).0;
        let _ = off;
        let l2 = LocalExecutor::new().unwrap();
        let (a, b, file, listener, client, server) = l2.block_on(async move {
            let (n, buf) = file.read_at(vec![0u8; 5], 0).await;
            assert_eq!(&buf[..n.unwrap()], b"hello");
            let (w, _) = client.write_all(b"ping".to_vec()).await;
            w.unwrap();
            let (n, buf) = server.read(vec![0u8; 16]).await;
            let got = buf[..n.unwrap()].to_vec();
            let addr = listener.local_addr().unwrap();
            let c2 = xtc_shards::net::TcpStream::connect(addr).await.unwrap();
            let (s2, _) = listener.accept().await.unwrap();
            drop((c2, s2));
            (got, b"ping".to_vec(), file, listener, client, server)
        });
        assert_eq!(a, b);
        drop(l1);
        let all = LocalExecutor::new().unwrap().block_on(async move {
            let (w, _) = server.write_all(b"pong".to_vec()).await;
            w.unwrap();
            let (n, buf) = client.read(vec![0u8; 16]).await;
            assert_eq!(&buf[..n.unwrap()], b"pong");
            (file, listener, client, server)
        });
        drop(all);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// A task of an executor that never runs, awaited in another executor's task (and a plain
/// thread), its `Executor` then dropped while a `Handle` lives: both awaiters see cancelled.
#[test]
fn handles_of_a_dropped_executor_awaited_elsewhere() {
    within("dropped executor's handles", || {
        let a = exec(2);
        let ha = a.handle();
        let p = a.spawn_on(1, || async { 1 }).unwrap();
        let m = ha.spawn(async { 2 });
        let q = ha.submit_to(0, || async { 3 });
        let b = service(1);
        let hb = b.handle();
        std::thread::scope(|s| {
            let rb = s.spawn(|| b.run());
            let (tx, rx) = mpsc::channel();
            hb.spawn_on(0, move || async move {
                let r = (p.await.is_err(), m.await.is_err());
                tx.send(r).unwrap();
            })
            .unwrap();
            let plain = s.spawn(move || futures::executor::block_on(q));
            std::thread::sleep(Duration::from_millis(30));
            drop(a);
            assert_eq!(rx.recv_timeout(HANG).unwrap(), (true, true));
            assert!(matches!(plain.join().unwrap(), Err(Error::Stopped)));
            hb.stop();
            rb.join().unwrap().unwrap();
        });
        assert!(matches!(ha.spawn_on(0, || async {}), Err(Error::Stopped)));
    });
}

/// An abort of a task parked on another shard, awaited inside a foreign `block_on` in a task:
/// the abort queues the task on its loop to be dropped, over the ring.
#[test]
fn a_foreign_block_on_inside_a_task_on_an_aborted_handle() {
    let got = within("foreign block_on of an aborted handle", || {
        let a = exec(2);
        let h = a.handle();
        a.block_on(move || async move {
            let t = h.spawn_on(1, futures::future::pending::<()>).unwrap();
            // Parked on shard 1, which then sleeps.
            time::sleep(Duration::from_millis(50)).await;
            t.abort();
            futures::executor::block_on(t).unwrap_err().is_cancelled()
        })
        .unwrap()
    });
    assert!(got);
}

thread_local! {
    /// Set when its shard thread exits: after that loop's `Core` gave its ring ends back.
    static GONE: std::cell::RefCell<Option<SetOnDrop>> = const { std::cell::RefCell::new(None) };
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

/// A guard held by a task on shard 0 that is still parked when the executor stops: its drop,
/// which shard 0's shutdown runs, waits until shard 1's thread has exited, then makes a
/// blocking call to shard 1 (`call`), and reports what it got.
struct CallOnDrop<F: FnOnce() -> String> {
    gone: Arc<AtomicBool>,
    call: Option<F>,
    out: mpsc::Sender<String>,
}

impl<F: FnOnce() -> String> Drop for CallOnDrop<F> {
    fn drop(&mut self) {
        block_until(|| self.gone.load(SeqCst));
        let got = (self.call.take().unwrap())();
        let _ = self.out.send(got);
    }
}

/// Runs a 2-shard executor (ring capacity 1) whose shard 1 stops at once and whose shard 0
/// stops with a parked task holding a [`CallOnDrop`] that makes `call` to the stopped shard 1.
/// The loops stop in any order; here shard 1 surely stopped first. Returns what the call got.
fn call_a_stopped_shard_from_a_shutdown_drop(
    call: impl FnOnce(xtc_shards::Handle) -> String + Send + 'static,
) -> String {
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .ring_capacity(1)
        .deadlock_grace(Some(Duration::from_millis(100)))
        .build()
        .unwrap();
    let h = ex.handle();
    let gone = Arc::new(AtomicBool::new(false));
    let g = gone.clone();
    ex.spawn_on(1, move || async move {
        GONE.with(|s| *s.borrow_mut() = Some(SetOnDrop(g)));
    })
    .unwrap();
    let (tx, rx) = mpsc::channel();
    ex.spawn_on(0, move || async move {
        let _guard = CallOnDrop {
            gone,
            call: Some(move || call(h)),
            out: tx,
        };
        std::future::pending::<()>().await;
    })
    .unwrap();
    let r = run_or_fail(ex, HANG, "a shutdown drop's call to a stopped shard");
    assert!(
        matches!(r, Err(Error::Deadlock { .. })),
        "the parked task is reported: {r:?}"
    );
    rx.recv_timeout(HANG).expect("the drop made no call")
}

/// A call made from a drop that a loop's shutdown runs, to another shard, is refused at once
/// with `Err(Stopped)`: the executor is stopping, so the call could only be dropped unrun by
/// a shutdown, and a drop that waited for that waited on it. To a shard that had already
/// stopped, the drop waited for good (only this loop's shutdown hands over or drops what it
/// sent there, once the drop returns), and two such drops each calling the other's shard did
/// too. The same for `send_to` (into a full ring), `submit_to_all` and `Handle::spawn_on`, and
/// for a call to the stopping loop's own shard (it runs nothing: that one waited for good).
#[test]
fn a_shutdown_drops_call_to_another_shard_is_refused() {
    let got = call_a_stopped_shard_from_a_shutdown_drop(|_| {
        let r = futures::executor::block_on(shard::submit_to(1, || async { 7 }));
        format!("{}", matches!(r, Err(Error::Stopped)))
    });
    assert_eq!(got, "true", "submit_to: not Err(Stopped)");
    let got = call_a_stopped_shard_from_a_shutdown_drop(|h| {
        format!(
            "{}",
            matches!(h.spawn_on(1, || async { 7 }), Err(Error::Stopped))
        )
    });
    assert_eq!(got, "true", "Handle::spawn_on: not Err(Stopped)");
    let got = call_a_stopped_shard_from_a_shutdown_drop(|h| {
        let r = futures::executor::block_on(h.submit_to(1, || async { 7 }));
        format!("{}", matches!(r, Err(Error::Stopped)))
    });
    assert_eq!(got, "true", "Handle::submit_to: not Err(Stopped)");
    // The ring holds one message: without the refusal the second send waited for room.
    let got = call_a_stopped_shard_from_a_shutdown_drop(|_| {
        let sends: Vec<_> = (0..3)
            .map(|_| futures::executor::block_on(shard::send_to(1, || async {})))
            .collect();
        format!("{}", sends.iter().all(|r| matches!(r, Err(Error::Stopped))))
    });
    assert_eq!(got, "true", "send_to: not Err(Stopped)");
    let got = call_a_stopped_shard_from_a_shutdown_drop(|_| {
        let all = futures::executor::block_on(shard::submit_to_all(|| async { shard::id() }));
        // Its own shard's call too: a stopping loop runs nothing (it waited for good).
        format!("{}", all.iter().all(|r| matches!(r, Err(Error::Stopped))))
    });
    assert_eq!(
        got, "true",
        "submit_to_all: not Err(Stopped) for every shard"
    );
    let got = call_a_stopped_shard_from_a_shutdown_drop(|h| {
        let own = futures::executor::block_on(shard::submit_to(0, || async { 7 }));
        let spawned = h.spawn_on(0, || async { 7 });
        format!(
            "{}",
            matches!(own, Err(Error::Stopped)) && matches!(spawned, Err(Error::Stopped))
        )
    });
    assert_eq!(
        got, "true",
        "a call to the stopping loop's own shard: not Err(Stopped)"
    );
}

/// A drop that a loop's shutdown runs blocks on the join handle of a call sent to shard 1
/// before that shutdown began, which shard 1 never drained: it stopped first (its thread is
/// gone). The call is kept for shard 1's next run, which cannot come while this run waits for
/// the drop: the wait drops it instead (its handle: cancelled), and the run ends.
#[test]
fn a_shutdown_drop_blocking_on_a_call_sent_before_to_a_shard_that_has_stopped() {
    let ex = exec_with_grace(2, Duration::from_millis(100));
    let h = ex.handle();
    let gone = Arc::new(AtomicBool::new(false));
    let (g, set) = (gone.clone(), Arc::new(AtomicBool::new(false)));
    let s2 = set.clone();
    ex.spawn_on(1, move || async move {
        GONE.with(|s| *s.borrow_mut() = Some(SetOnDrop(g)));
        s2.store(true, SeqCst);
    })
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let h2 = h.clone();
    ex.spawn_on(0, move || async move {
        // Shard 1's flag first (a stop before it ran dropped it: the flag never came).
        sleep_until(|| set.load(SeqCst)).await;
        // Holds this loop in one poll while the run stops and shard 1's thread exits.
        h2.stop();
        block_until(|| gone.load(SeqCst));
        let call = h2.spawn_on(1, || async { 7 }).unwrap();
        let _guard = CallOnDrop {
            gone,
            call: Some(move || {
                let r = futures::executor::block_on(call);
                format!("{}", r.is_err_and(|e| e.is_cancelled()))
            }),
            out: tx,
        };
        std::future::pending::<()>().await;
    })
    .unwrap();
    let r = run_or_fail(
        ex,
        HANG,
        "a shutdown drop's wait on a call kept for a next run",
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        rx.recv_timeout(HANG).unwrap(),
        "true",
        "not a cancelled error"
    );
}
