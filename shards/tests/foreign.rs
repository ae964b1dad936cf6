//! xtc values used outside the context they were made in: join handles, channels, timers and
//! cross-shard calls awaited, dropped or aborted on another executor, a `LocalExecutor`, a
//! plain thread or a foreign `block_on`.

mod common;
use common::*;

use std::{sync::mpsc, time::Duration};

use xtc_shards::{channel, shard, time};

/// Runs `f` on a thread and fails the test if it has not finished within `HANG`.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(HANG)
        .unwrap_or_else(|_| panic!("hung: {what}"))
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
