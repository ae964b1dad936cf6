//! xtc::time: sleep, sleep_until, timeout, interval; timer cancellation and quiescence.

use std::time::{Duration, Instant};

use xtc_shards::{spawn_local, time, Executor, LocalExecutor};

#[test]
fn sleep_waits_at_least_its_duration() {
    LocalExecutor::new().unwrap().block_on(async {
        for ms in [0u64, 1, 5, 20] {
            let t = Instant::now();
            time::sleep(Duration::from_millis(ms)).await;
            assert!(t.elapsed() >= Duration::from_millis(ms));
        }
    });
}

#[test]
fn sleeps_fire_in_deadline_order() {
    let order = LocalExecutor::new().unwrap().block_on(async {
        let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut hs = Vec::new();
        for ms in [30u64, 10, 20, 0, 15] {
            let o = order.clone();
            hs.push(spawn_local(async move {
                time::sleep(Duration::from_millis(ms)).await;
                o.borrow_mut().push(ms);
            }));
        }
        for h in hs {
            h.await.unwrap();
        }
        let v = order.borrow().clone();
        v
    });
    assert_eq!(order, vec![0, 10, 15, 20, 30]);
}

#[test]
fn timeout_elapses_and_cancels_its_timer() {
    let ex = Executor::builder().shards(1).build().unwrap();
    let t0 = Instant::now();
    let h = ex
        .spawn_on(0, || async {
            let r = time::timeout(Duration::from_millis(10), std::future::pending::<()>()).await;
            assert!(r.is_err());
            assert_eq!(r.unwrap_err().to_string(), "deadline has elapsed");
            // Completes first: its 10 s timer is cancelled, and run() need not wait for it.
            time::timeout(Duration::from_secs(10), async { 3 })
                .await
                .unwrap()
        })
        .unwrap();
    ex.run().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "cancelled timer kept run() alive"
    );
    assert_eq!(futures::executor::block_on(h).unwrap(), 3);
}

#[test]
fn dropped_sleep_does_not_hold_quiescence() {
    let ex = Executor::builder()
        .shards(2)
        .oversubscribe(true)
        .build()
        .unwrap();
    ex.spawn_on(1, || async {
        let s = time::sleep(Duration::from_secs(30));
        drop(s);
        let mut s = Box::pin(time::sleep(Duration::from_secs(30)));
        // Register it, then drop it while pending.
        let _ = futures::poll!(s.as_mut());
        drop(s);
    })
    .unwrap();
    let t0 = Instant::now();
    ex.run().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn interval_ticks_on_schedule() {
    LocalExecutor::new().unwrap().block_on(async {
        let start = Instant::now();
        let mut iv = time::interval(Duration::from_millis(10));
        let first = iv.tick().await;
        assert!(first <= Instant::now());
        let mut last = first;
        for n in 1..=5u32 {
            let t = iv.tick().await;
            assert_eq!(t, first + Duration::from_millis(10) * n);
            assert!(Instant::now() >= t);
            last = t;
        }
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(last, first + Duration::from_millis(50));
    });
}

#[test]
fn interval_skips_missed_ticks() {
    LocalExecutor::new().unwrap().block_on(async {
        let mut iv = time::interval(Duration::from_millis(10));
        let first = iv.tick().await;
        std::thread::sleep(Duration::from_millis(35)); // block the loop past 3 ticks
        let t = iv.tick().await; // the overdue tick at +10 fires at once
        assert_eq!(t, first + Duration::from_millis(10));
        let t2 = iv.tick().await; // then the next future multiple: +40
        assert_eq!(t2, first + Duration::from_millis(40));
    });
}

#[test]
fn sleep_until_past_deadline_is_ready() {
    LocalExecutor::new().unwrap().block_on(async {
        time::sleep_until(Instant::now() - Duration::from_millis(1)).await;
    });
}
