//! Loom models of the sleep protocol (`event_loop/park.rs`) over the real `Inbox` and `Parker`:
//! no interleaving of announce/recheck/sleep against push/unpark loses a wake-up. A lost wake-up
//! shows as a loom deadlock (the loop blocked forever on its ping).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_`.

use loom::{sync::Arc, thread};

use crate::event_loop::{Inbox, Parker};

/// The loop's side: consume `expected` messages, parking by rules 1 and 3 when it finds none.
fn consume(inbox: &Inbox<u32>, parker: &Parker, expected: usize) -> Vec<u32> {
    let mut got = Vec::new();
    let mut spare = Vec::new();
    while got.len() < expected {
        if inbox.drain_into(&mut spare) > 0 {
            got.append(&mut spare);
            continue;
        }
        parker.announce();
        if inbox.recheck() {
            parker.cancel();
            continue;
        }
        parker.sleep(None);
    }
    got
}

#[test]
fn loom_one_sender_no_lost_wakeup() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new());
        let parker = Arc::new(Parker::new().unwrap());
        let (i2, p2) = (inbox.clone(), parker.clone());
        let sender = thread::spawn(move || {
            i2.push(7);
            p2.unpark();
        });
        let got = consume(&inbox, &parker, 1);
        sender.join().unwrap();
        assert_eq!(got, vec![7]);
        assert_eq!(inbox.counts(), (1, 1));
    });
}

#[test]
fn loom_two_senders_no_lost_wakeup() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let inbox = Arc::new(Inbox::new());
        let parker = Arc::new(Parker::new().unwrap());
        let senders: Vec<_> = (0..2u32)
            .map(|n| {
                let (i, p) = (inbox.clone(), parker.clone());
                thread::spawn(move || {
                    i.push(n);
                    p.unpark();
                })
            })
            .collect();
        let mut got = consume(&inbox, &parker, 2);
        for s in senders {
            s.join().unwrap();
        }
        got.sort_unstable();
        assert_eq!(got, vec![0, 1]);
    });
}

#[test]
fn loom_sender_sends_twice_across_a_sleep() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let inbox = Arc::new(Inbox::new());
        let parker = Arc::new(Parker::new().unwrap());
        let (i2, p2) = (inbox.clone(), parker.clone());
        let sender = thread::spawn(move || {
            for n in 0..2u32 {
                i2.push(n);
                p2.unpark();
            }
        });
        let got = consume(&inbox, &parker, 2);
        sender.join().unwrap();
        assert_eq!(got, vec![0, 1], "per-sender order kept");
    });
}

/// Steal rule 4: the spawn that makes the live-migratable count leave zero pings every loop
/// (`fetch_add`, then `unpark`). A loop that decided "no idle tick" (count 0) before that
/// ping and announced after it has the NOTIFIED bit swapped away: it must see the count in
/// its recheck after the announcement, or it sleeps with no timeout while migratable work
/// waits on a busy peer (the event loop's recheck calls `steal::idle_tick` again).
#[test]
fn loom_count_leaving_zero_is_seen_or_pings() {
    // Relaxed loads, as `steal::idle_tick` does: the announcement's swap orders them.
    use loom::sync::atomic::{
        AtomicI64,
        Ordering::{Relaxed, SeqCst},
    };
    loom::model(|| {
        let live = Arc::new(AtomicI64::new(0));
        let parker = Arc::new(Parker::new().unwrap());
        let (l2, p2) = (live.clone(), parker.clone());
        let spawner = thread::spawn(move || {
            l2.fetch_add(1, SeqCst);
            p2.unpark();
        });
        // The loop: until it would tick (count above zero).
        loop {
            if live.load(Relaxed) > 0 {
                break;
            }
            parker.announce();
            if live.load(Relaxed) > 0 {
                parker.cancel();
                continue;
            }
            parker.sleep(None);
        }
        spawner.join().unwrap();
    });
}

/// How a migratable spawn orders its push, its look at the live count and its ping.
#[derive(Clone, Copy)]
enum SpawnOrder {
    /// `steal::after_queueing`: push, `SeqCst` fence, then load the count; ping if it reads
    /// zero or less.
    Shipping,
    /// Before f5313c4: decide and ping, then push.
    PingBeforePush,
    /// f5313c4: decide from the count, push, then ping if the decision said so.
    DecideBeforePush,
}

/// Steal rule 4 against an idle loop. The live count starts at `live`; above zero, another
/// loop publishes a finish (−1, as `flush_live` does) meanwhile. The spawner's own +1 is in
/// its unpublished batch, so the count never shows it: the idle loop's signs of work are the
/// count above zero and the victim's queue. `queued` stands for the deque (crossbeam's push
/// is a Release store of its back index). The idle loop looks as `steal::may_find_work`
/// does (the count, `SeqCst`; a fence; the queue), ticks while the count is above zero, and
/// otherwise announces, looks again and sleeps.
fn spawn_against_an_idle_loop(order: SpawnOrder, live: i64) {
    use loom::sync::atomic::{fence, AtomicI64, AtomicUsize, Ordering::*};
    loom::model(move || {
        let count = Arc::new(AtomicI64::new(live));
        let queued = Arc::new(AtomicUsize::new(0));
        let parker = Arc::new(Parker::new().unwrap());
        let (c2, q2, p2) = (count.clone(), queued.clone(), parker.clone());
        let spawner = thread::spawn(move || match order {
            SpawnOrder::Shipping => {
                q2.store(1, Release);
                fence(SeqCst);
                if c2.load(Relaxed) <= 0 {
                    p2.unpark();
                }
            }
            SpawnOrder::PingBeforePush => {
                if c2.load(Relaxed) <= 0 {
                    p2.unpark();
                }
                q2.store(1, Release);
            }
            SpawnOrder::DecideBeforePush => {
                let due = c2.load(Relaxed) <= 0;
                q2.store(1, Release);
                if due {
                    p2.unpark();
                }
            }
        });
        let finisher = (live > 0).then(|| {
            let c3 = count.clone();
            thread::spawn(move || {
                c3.fetch_add(-1, SeqCst);
            })
        });
        let look = || {
            let l = count.load(SeqCst);
            fence(SeqCst);
            (l, queued.load(Acquire))
        };
        loop {
            let (l, q) = look();
            if q > 0 {
                break; // it steals
            }
            if l > 0 {
                thread::yield_now(); // an idle tick
                continue;
            }
            parker.announce();
            let (l, q) = look();
            if q > 0 || l > 0 {
                parker.cancel();
                continue;
            }
            parker.sleep(None);
        }
        spawner.join().unwrap();
        if let Some(f) = finisher {
            f.join().unwrap();
        }
    });
}

/// The count stays at zero (the spawner's turn also finished a stolen child): only the ping
/// and the queue tell the idle loop.
#[test]
fn loom_spawn_pings_after_the_push() {
    spawn_against_an_idle_loop(SpawnOrder::Shipping, 0);
}

/// The count drops to zero between the spawner's decision and its push.
#[test]
fn loom_spawn_decides_after_the_push() {
    spawn_against_an_idle_loop(SpawnOrder::Shipping, 1);
}

/// The two earlier orders, each in the scenario that breaks it: loom must report a lost
/// wake-up (a deadlock), which shows the models above can fail. Loom's deadlock panic aborts
/// the process during cleanup (so no `should_panic`): each model runs in a child test
/// process, whose failure and message are checked here.
#[test]
fn loom_earlier_spawn_orders_lose_the_wakeup() {
    for model in [
        "loom_park::loom_model_ping_before_the_push",
        "loom_park::loom_model_decide_before_the_push",
    ] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .arg(model)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("deadlock; threads"),
            "loom found no lost wake-up in {model} (status {}):\n{stderr}",
            out.status
        );
    }
}

/// Run by `loom_earlier_spawn_orders_lose_the_wakeup` in a child process.
#[test]
#[ignore = "expected to fail: run by loom_earlier_spawn_orders_lose_the_wakeup"]
fn loom_model_ping_before_the_push() {
    spawn_against_an_idle_loop(SpawnOrder::PingBeforePush, 0);
}

/// Run by `loom_earlier_spawn_orders_lose_the_wakeup` in a child process.
#[test]
#[ignore = "expected to fail: run by loom_earlier_spawn_orders_lose_the_wakeup"]
fn loom_model_decide_before_the_push() {
    spawn_against_an_idle_loop(SpawnOrder::DecideBeforePush, 1);
}

/// Closing (`executor/quiesce.rs`, `close`), over the shipping `Status::busy` and
/// `close_with`: a loop that leaves idle (a foreign spawn woke it) races the coordinator
/// confirming the quiescent verdict it took while that loop was idle. The loop must never take
/// work that the stop then drops: either the coordinator sees the loop's new epoch and takes
/// its verdict back, or the loop sees `closing`, waits for the decision, and finds the stop
/// at step 1 before taking anything.
#[test]
fn loom_closing_never_stops_a_loop_that_took_work() {
    use crate::{
        event_loop::{status, Status},
        executor::quiesce::{close_with, Closing},
        sync::{AtomicBool, AtomicU64, Ordering::SeqCst},
    };
    loom::model(|| {
        let word = Arc::new(AtomicU64::new(0));
        let closing = Arc::new(Closing::default());
        let stop = Arc::new(AtomicBool::new(false));
        // The loop went idle (EMPTY, epoch 0); the verdict saw that.
        let _ = Status::new(&word, &closing, &stop).idle(status::EMPTY);
        let seen = word.load(SeqCst);
        let (w2, c2, s2) = (word.clone(), closing.clone(), stop.clone());
        let looper = thread::spawn(move || {
            let mut st = Status::new(&w2, &c2, &s2);
            // `true`: stopping, step 1 comes next; `false`: this turn takes the work.
            !st.busy()
        });
        let stopped = close_with(
            &closing,
            || word.load(SeqCst) == seen,
            || stop.store(true, SeqCst),
        );
        let took = looper.join().unwrap();
        assert!(
            !(took && stopped),
            "the loop took work and the quiescent stop then dropped it"
        );
    });
}
