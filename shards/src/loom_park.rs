//! Loom models of the sleep protocol (`event_loop/park.rs`) over the real `Inbox` and `Parker`:
//! no interleaving of announce/recheck/sleep against push/unpark loses a wake-up. A lost wake-up
//! shows as a loom deadlock (the loop blocked forever on its ping).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_`.

use loom::{sync::Arc, thread};

use crate::event_loop::{Inbox, Parker};

/// The loop's side: consume `expected` messages, parking by rules 1 and 3 when it finds none,
/// after the spin-before-park's look (`spin_for_work`: `Inbox::is_pending`, a plain load, with
/// no announcement).
fn consume(inbox: &Inbox<u32>, parker: &Parker, expected: usize) -> Vec<u32> {
    let mut got = Vec::new();
    let mut spare = Vec::new();
    while got.len() < expected {
        if inbox.drain_into(&mut spare) > 0 {
            got.append(&mut spare);
            continue;
        }
        if inbox.is_pending() {
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
    // `SeqCst` loads, as `steal::may_find_work` (under `steal::idle_tick`) does; the
    // announcement's swap is what orders them against the spawn's ping.
    use loom::sync::atomic::{AtomicI64, Ordering::SeqCst};
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
            if live.load(SeqCst) > 0 {
                break;
            }
            parker.announce();
            if live.load(SeqCst) > 0 {
                parker.cancel();
                continue;
            }
            parker.sleep(None);
        }
        spawner.join().unwrap();
    });
}

/// Steal rule 4 against an idle loop, over the shipping `Parker`: a busy loop spawns (its +1
/// still in its unpublished batch, so only its `spawning` flag shows it) while another loop
/// publishes a finish that takes the count from 1 to 0; then the task is queued (a spawn's
/// push, or a later wake of it), and the busy loop's turn ends (`flush_live`: the count, then
/// the flag down) only if `flush`. The idle loop looks as `steal::may_find_work` does (the
/// count, the flags, the queue; `SeqCst`, the queue Acquire as crossbeam's `is_empty`), ticks
/// while it sees a sign of work, and otherwise announces, counts itself tickless
/// (`steal::enter_tickless`; after looking again when `counts_late`, the broken order),
/// looks again and sleeps. A lost wake-up shows as a loom deadlock.
fn spawning_flag_model(counts_late: bool, flush: bool) {
    use loom::sync::atomic::{fence, AtomicBool, AtomicI64, AtomicUsize, Ordering::*};
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let count = Arc::new(AtomicI64::new(1));
        let flag = Arc::new(AtomicBool::new(false));
        let tickless = Arc::new(AtomicUsize::new(0));
        let queued = Arc::new(AtomicUsize::new(0));
        let parker = Arc::new(Parker::new().unwrap());
        let spawner = {
            let (count, flag, tickless, queued, parker) = (
                count.clone(),
                flag.clone(),
                tickless.clone(),
                queued.clone(),
                parker.clone(),
            );
            thread::spawn(move || {
                // `show_spawning`.
                flag.store(true, SeqCst);
                fence(SeqCst);
                if tickless.load(SeqCst) > 0 {
                    parker.unpark();
                }
                queued.store(1, Release);
                if flush {
                    // `flush_live` of the batch (+1), then the flag down.
                    if count.fetch_add(1, SeqCst) <= 0 {
                        parker.unpark();
                    }
                    flag.store(false, SeqCst);
                }
            })
        };
        let finisher = {
            let count = count.clone();
            thread::spawn(move || {
                count.fetch_add(-1, SeqCst);
            })
        };
        let look = || {
            let c = count.load(SeqCst);
            let f = flag.load(SeqCst);
            (c > 0 || f, queued.load(Acquire) > 0)
        };
        loop {
            let (sign, found) = look();
            if found {
                break; // it steals
            }
            if sign {
                thread::yield_now(); // an idle tick
                continue;
            }
            parker.announce();
            if !counts_late {
                tickless.fetch_add(1, SeqCst);
                fence(SeqCst);
            }
            let (sign, found) = look();
            if sign || found {
                parker.cancel();
                if !counts_late {
                    tickless.fetch_sub(1, SeqCst);
                }
                continue;
            }
            if counts_late {
                tickless.fetch_add(1, SeqCst);
                fence(SeqCst);
            }
            parker.sleep(None);
            tickless.fetch_sub(1, SeqCst);
        }
        spawner.join().unwrap();
        finisher.join().unwrap();
    });
}

/// A loop's first spawn of a turn is seen by an idle loop, or pings it, while a finish
/// published elsewhere takes the count to zero.
#[test]
fn loom_spawning_flag_is_seen_or_pings() {
    spawning_flag_model(false, false);
}

/// The same with the spawner's turn ending meanwhile: the flag goes down only after the count
/// took the batch.
#[test]
fn loom_spawning_flag_down_after_the_count() {
    spawning_flag_model(false, true);
}

/// The broken order (count itself tickless only after the last look): loom must report the
/// lost wake-up, which shows the models above can fail. Loom's deadlock panic aborts the
/// process during cleanup (so no `should_panic`): the model runs in a child test process,
/// whose failure and message are checked here.
#[test]
fn loom_counting_tickless_late_loses_the_wakeup() {
    model_loses_a_wakeup("loom_park::loom_model_counting_tickless_late");
}

/// Runs the ignored loom `model` in a child test process (loom's deadlock panic aborts the
/// process during cleanup, so no `should_panic`) and checks that loom reported a thread asleep
/// for good.
fn model_loses_a_wakeup(model: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            model,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("deadlock; threads"),
        "loom found no lost wake-up in {model} (status {}):\n{stderr}",
        out.status
    );
}

/// Run by `loom_counting_tickless_late_loses_the_wakeup` in a child process.
#[test]
#[ignore = "expected to fail: run by loom_counting_tickless_late_loses_the_wakeup"]
fn loom_model_counting_tickless_late() {
    spawning_flag_model(true, false);
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

/// Quiescence (`executor/quiesce.rs`) against a foreign push into an idle loop's inbox, over
/// the shipping `Inbox` counts, `Status` and `close_with`: a loop that kept its idle status
/// after an idle tick (event loop step 2) publishes BUSY before it drains, and the coordinator
/// takes `check`'s two snapshots (status, then the inbox counts, as `Snapshot::take`) and,
/// on a quiescent verdict, `close`'s third. The stop must never come while the loop runs what
/// it took (a verdict of quiescence with a task in flight), and the message is run or stays
/// queued for the next run, never lost. With `drain_first` the loop drains before publishing
/// BUSY (the broken order), which the model must catch.
fn quiescence_vs_inbox_model(drain_first: bool) {
    use crate::{
        event_loop::{status, Inbox, Status},
        executor::quiesce::{close_with, Closing},
        sync::{AtomicBool, AtomicU64, Ordering::SeqCst},
    };
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let word = Arc::new(AtomicU64::new(0));
        let closing = Arc::new(Closing::default());
        let stop = Arc::new(AtomicBool::new(false));
        let inbox = Arc::new(Inbox::<u32>::new());
        // The loop went idle (EMPTY, epoch 0) and kept that status through an idle tick.
        let _ = Status::new(&word, &closing, &stop).idle(status::EMPTY);
        let sender = {
            let inbox = inbox.clone();
            thread::spawn(move || inbox.push(7))
        };
        let looper = {
            let (word, closing, stop, inbox) =
                (word.clone(), closing.clone(), stop.clone(), inbox.clone());
            thread::spawn(move || {
                let mut st = Status::new(&word, &closing, &stop);
                let mut idle = true;
                let mut spare = Vec::new();
                let mut ran = 0;
                // Two turns, each after an idle tick that kept the status when idle.
                for _ in 0..2 {
                    // Step 1.
                    if stop.load(SeqCst) {
                        break;
                    }
                    // Step 2.
                    if drain_first && inbox.drain_into(&mut spare) > 0 {
                        idle = false;
                        if st.busy() {
                            // Stopping: what it took is dropped unrun.
                            break;
                        }
                    } else if idle && inbox.is_pending() {
                        idle = false;
                        if st.busy() {
                            continue;
                        }
                    }
                    if !idle && (!spare.is_empty() || inbox.drain_into(&mut spare) > 0) {
                        // Step 4: the task runs; a quiescent stop must not have been decided.
                        assert!(
                            !stop.load(SeqCst),
                            "the loop took a task and a quiescent stop was decided while it ran"
                        );
                        ran += spare.len();
                        spare.clear();
                    }
                    if !idle {
                        let _ = st.idle(status::EMPTY);
                        idle = true;
                    }
                }
                assert!(
                    spare.is_empty(),
                    "the loop took a message and the stop dropped it"
                );
                ran
            })
        };
        // The coordinator: `check`, then `close`.
        let snap = || {
            let st = word.load(SeqCst);
            let (pushed, popped) = inbox.counts();
            (st, pushed, popped)
        };
        let a = snap();
        let quiescent = status::kind(a.0) == status::EMPTY && a.1 == a.2 && snap() == a;
        let stopped =
            quiescent && close_with(&closing, || snap() == a, || stop.store(true, SeqCst));
        sender.join().unwrap();
        let ran = looper.join().unwrap();
        let mut left = Vec::new();
        inbox.drain_into(&mut left);
        assert_eq!(
            ran + left.len(),
            1,
            "the message was lost (stopped: {stopped})"
        );
    });
}

/// The inbox's pop count and the status word never let the coordinator stop a loop that took
/// a foreign push (event loop step 2: BUSY first, then the drain).
#[test]
fn loom_quiescence_never_stops_a_loop_running_inbox_work() {
    quiescence_vs_inbox_model(false);
}

/// The broken order (drain while the status still reads idle): the model must catch it.
#[test]
#[should_panic(expected = "the loop took")]
fn loom_quiescence_draining_before_busy_is_caught() {
    quiescence_vs_inbox_model(true);
}

/// The whole idle cycle of one loop against a foreign push and the coordinator, over the
/// shipping `Inbox`, `Parker`, `Status` and `close_with`: the loop publishes EMPTY, announces,
/// rechecks (the inbox, the stop flag) and sleeps, and after waking publishes BUSY (which
/// waits out a closing coordinator) before its step 1 and its drain. The coordinator takes
/// `check`'s snapshots and closes on a quiescent verdict, which sets the stop flag and then
/// pings the loop unconditionally (`request_stop`); otherwise it leaves the loop alone, which
/// ends once it ran the message. No wake-up is lost (the push's nor the stop's: a loom
/// deadlock otherwise), a quiescent stop never comes while the loop runs what it took, and
/// the message is run or stays queued, never lost.
#[test]
fn loom_idle_cycle_against_a_push_and_the_stop() {
    use crate::{
        event_loop::{status, Inbox, Status},
        executor::quiesce::{close_with, Closing},
        sync::{
            AtomicBool, AtomicU64,
            Ordering::{Relaxed, SeqCst},
        },
    };
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let word = Arc::new(AtomicU64::new(0));
        let closing = Arc::new(Closing::default());
        let stop = Arc::new(AtomicBool::new(false));
        let quiescent_stop = Arc::new(AtomicBool::new(false));
        let inbox = Arc::new(Inbox::<u32>::new());
        let parker = Arc::new(Parker::new().unwrap());
        let sender = {
            let (inbox, parker) = (inbox.clone(), parker.clone());
            thread::spawn(move || {
                inbox.push(7);
                parker.unpark();
            })
        };
        let looper = {
            let (word, closing, stop, quiescent_stop, inbox, parker) = (
                word.clone(),
                closing.clone(),
                stop.clone(),
                quiescent_stop.clone(),
                inbox.clone(),
                parker.clone(),
            );
            thread::spawn(move || {
                // BUSY at epoch 0, as `restart_status` leaves it.
                let mut st = Status::new(&word, &closing, &stop);
                let mut spare = Vec::new();
                let mut ran = 0;
                loop {
                    // Step 1 (`stop_requested`); the model ends once the message ran.
                    if stop.load(Relaxed) || ran > 0 {
                        break;
                    }
                    // Steps 2 and 4.
                    if inbox.drain_into(&mut spare) > 0 {
                        assert!(
                            !quiescent_stop.load(SeqCst),
                            "the loop took a task and a quiescent stop was decided while it ran"
                        );
                        ran += spare.len();
                        spare.clear();
                        continue;
                    }
                    // Step 6: the spin's look (`spin_for_work`), then the idle status.
                    if inbox.is_pending() {
                        continue;
                    }
                    let _ = st.idle(status::EMPTY);
                    parker.announce();
                    if inbox.recheck() || stop.load(Relaxed) {
                        parker.cancel();
                    } else {
                        parker.sleep(None);
                    }
                    // Step 1 comes next either way.
                    let _ = st.busy();
                }
                ran
            })
        };
        // The coordinator: `check`, then `close`.
        let snap = || {
            let st = word.load(SeqCst);
            let (pushed, popped) = inbox.counts();
            (st, pushed, popped)
        };
        let a = snap();
        let quiescent = status::kind(a.0) == status::EMPTY && a.1 == a.2 && snap() == a;
        let _ = quiescent
            && close_with(
                &closing,
                || snap() == a,
                || {
                    quiescent_stop.store(true, SeqCst);
                    stop.store(true, SeqCst);
                    parker.force_unpark();
                },
            );
        sender.join().unwrap();
        let ran = looper.join().unwrap();
        let mut left = Vec::new();
        inbox.drain_into(&mut left);
        assert_eq!(ran + left.len(), 1, "the message was lost");
    });
}

/// Steal rule 1 off a loop's thread (`steal::inject`): a plain thread queues a migratable
/// task in the loop's injector, then pings it (`park.rs` rule 2). The loop's recheck after
/// announcing is `steal::has_local`, `Injector::is_empty`: plain `SeqCst` loads of the head and
/// tail, no read-modify-write (the state word's RMWs carry the argument). The injector is a
/// stand-in with crossbeam-deque 0.8's orderings on one block: a push claims its slot by a CAS
/// on `tail` (`SeqCst`/`Acquire`) and then marks it written (`fetch_or(WRITE, Release)`); a steal
/// loads `head` (Acquire), fences (`SeqCst`), loads `tail` (Relaxed), claims by a CAS on `head`
/// and waits for the slot's `WRITE` (Acquire). Two spawners, so the claims contend.
#[test]
fn loom_injected_task_is_seen_or_pings() {
    use loom::{
        cell::UnsafeCell,
        sync::atomic::{fence, AtomicUsize, Ordering::*},
    };
    const WRITE: usize = 1;
    struct Injector {
        head: AtomicUsize,
        tail: AtomicUsize,
        state: [AtomicUsize; 2],
        slots: [UnsafeCell<u32>; 2],
    }
    // SAFETY: a slot is written once, by the push that claimed it by CAS, before its `WRITE`
    // mark (Release); it is read once, by the steal that claimed it, after seeing the mark
    // (Acquire). Test-only.
    unsafe impl Sync for Injector {}
    impl Injector {
        fn push(&self, v: u32) {
            let mut t = self.tail.load(Acquire);
            while let Err(now) = self.tail.compare_exchange(t, t + 1, SeqCst, Acquire) {
                t = now;
            }
            // SAFETY: see the `Sync` impl.
            self.slots[t].with_mut(|p| unsafe { *p = v });
            self.state[t].fetch_or(WRITE, Release);
        }
        fn is_empty(&self) -> bool {
            let h = self.head.load(SeqCst);
            let t = self.tail.load(SeqCst);
            h == t
        }
        fn steal(&self) -> Option<u32> {
            let h = self.head.load(Acquire);
            fence(SeqCst);
            if self.tail.load(Relaxed) == h {
                return None;
            }
            if self
                .head
                .compare_exchange(h, h + 1, SeqCst, Acquire)
                .is_err()
            {
                return None; // `Steal::Retry`: the next turn looks again.
            }
            while self.state[h].load(Acquire) & WRITE == 0 {
                crate::sync::spin_hint();
            }
            // SAFETY: see the `Sync` impl.
            Some(self.slots[h].with(|p| unsafe { *p }))
        }
    }
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let inj = Arc::new(Injector {
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            state: [AtomicUsize::new(0), AtomicUsize::new(0)],
            slots: [UnsafeCell::new(0), UnsafeCell::new(0)],
        });
        let parker = Arc::new(Parker::new().unwrap());
        let spawners: Vec<_> = (0..2u32)
            .map(|n| {
                let (inj, parker) = (inj.clone(), parker.clone());
                thread::spawn(move || {
                    inj.push(n);
                    parker.unpark();
                })
            })
            .collect();
        let mut got = Vec::new();
        while got.len() < 2 {
            // Step 4: `next_local`, the deque (empty here) then the injector.
            if let Some(v) = inj.steal() {
                got.push(v);
                continue;
            }
            // The spin's look (`spin_for_work`: `has_local`), then the park decision.
            if !inj.is_empty() {
                continue;
            }
            parker.announce();
            if !inj.is_empty() {
                parker.cancel();
                continue;
            }
            parker.sleep(None);
        }
        for s in spawners {
            s.join().unwrap();
        }
        got.sort_unstable();
        assert_eq!(got, vec![0, 1]);
    });
}

/// Steal rule 3 against the park decision (event loop step 6), over the shipping `WorkPing`
/// and `Parker`: a busy loop queues a migratable task and, at the end of its turn, pings an
/// idle thief for it (eager rebalance's `nudge_idle_peer`, or a spawn's `ping_all_for_work`:
/// the mark, then `unpark`). The thief's decision, in the code's order: `forget_work_ping`
/// (a ping that came while it was awake woke nothing; the nudger starts only after it here,
/// so every ping of the model is one the decision must not lose), `try_steal` (the one task is
/// below the minimum, so only a thief woken by new work takes it: `fresh_wake`), with `spin`
/// the spin's look (`spin_for_work`: `work_pinged`, then `woke`), then the announcement and
/// the recheck (a migratable task is alive, so the loop ticks, and with a tick the recheck
/// looks at `work_pinged`; without it when `!recheck`, the order before commit 27531a9),
/// then the sleep, which stands for the idle tick (up to 32 ms with backoff): a loom deadlock
/// is a thief that slept its tick with the ping's work queued at its victim.
///
/// With `idle_turn`, the decision's first turn is an idle tick's, which keeps the loop's idle
/// status, so a nudger picks the loop and may ping before step 6 starts; step 6 then takes a
/// ping as a wake by new work (`take_in_idle_turn`, the code since the audit of
/// 2026-12-07), or forgets it as one that came while the loop was busy (the code before).
fn work_ping_model(spin: bool, recheck: bool, idle_turn: bool, take_in_idle_turn: bool) {
    use loom::sync::atomic::{AtomicUsize, Ordering::*};

    use crate::steal::WorkPing;
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let queued = Arc::new(AtomicUsize::new(0));
        let ping = Arc::new(WorkPing::default());
        let parker = Arc::new(Parker::new().unwrap());
        let mut nudger = None;
        // `Core::fresh_wake`.
        let mut fresh = false;
        let mut idle = idle_turn;
        loop {
            if idle && nudger.is_none() {
                let (queued, ping, parker) = (queued.clone(), ping.clone(), parker.clone());
                nudger = Some(thread::spawn(move || {
                    queued.store(1, Release);
                    ping.mark();
                    parker.unpark();
                }));
            }
            // Step 6's start.
            if std::mem::take(&mut idle) && take_in_idle_turn {
                // `woke(core, true)` on a ping that is set.
                if ping.is_set() {
                    fresh = ping.take();
                }
            } else {
                ping.forget();
            }
            if nudger.is_none() {
                let (queued, ping, parker) = (queued.clone(), ping.clone(), parker.clone());
                nudger = Some(thread::spawn(move || {
                    // The task on the nudger's deque (published with `Release`, as
                    // crossbeam's `Worker::push`), then the end of its turn.
                    queued.store(1, Release);
                    ping.mark();
                    parker.unpark();
                }));
            }
            // `try_steal`: `should_steal` with a minimum above the one task queued.
            if std::mem::take(&mut fresh) && queued.load(Acquire) > 0 {
                break;
            }
            if spin && ping.is_set() {
                // `spin_for_work` ends on the ping, taken as `woke(core, true)`.
                fresh = ping.take();
                continue;
            }
            parker.announce();
            if recheck && ping.is_set() {
                parker.cancel();
                fresh = ping.take();
                continue;
            }
            let pinged = parker.sleep(None);
            // `woke(core, pinged)`.
            fresh = pinged && ping.take();
        }
        nudger.unwrap().join().unwrap();
    });
}

/// A nudge (or a spawn's ping) that lands anywhere in the thief's park decision is taken as a
/// wake by new work: the thief steals the task below the minimum without sleeping its tick.
#[test]
fn loom_work_ping_lands_in_the_park_decision() {
    work_ping_model(false, true, false, true);
}

/// A nudge that lands in an idle tick's turn (the loop's status still idle), before or in the
/// park decision, is not lost.
#[test]
fn loom_work_ping_in_an_idle_ticks_turn_is_not_lost() {
    work_ping_model(false, true, true, true);
}

/// The same turn forgetting the ping as one that came while the loop was busy (before the
/// audit of 2026-12-07): loom must report the thief asleep on its tick. In a child process.
#[test]
fn loom_work_ping_forgotten_in_an_idle_ticks_turn_loses_the_wakeup() {
    model_loses_a_wakeup("loom_park::loom_model_work_ping_forgotten_in_an_idle_ticks_turn");
}

/// Run by `loom_work_ping_forgotten_in_an_idle_ticks_turn_loses_the_wakeup` in a child process.
#[test]
#[ignore = "expected to fail: run by loom_work_ping_forgotten_in_an_idle_ticks_turn_loses_the_wakeup"]
fn loom_model_work_ping_forgotten_in_an_idle_ticks_turn() {
    work_ping_model(false, true, true, false);
}

/// The same with the spin before the park, which ends on the ping (commit 5e2212c).
#[test]
fn loom_work_ping_ends_the_spin_or_the_park() {
    work_ping_model(true, true, false, true);
}

/// The recheck without its look at `work_pinged` (before commit 27531a9): loom must report
/// the thief asleep on its tick, which shows the models above can fail. In a child process, as
/// `loom_counting_tickless_late_loses_the_wakeup` (loom's deadlock panic aborts).
#[test]
fn loom_work_ping_without_the_recheck_loses_the_wakeup() {
    model_loses_a_wakeup("loom_park::loom_model_work_ping_without_the_recheck");
}

/// Run by `loom_work_ping_without_the_recheck_loses_the_wakeup` in a child process.
#[test]
#[ignore = "expected to fail: run by loom_work_ping_without_the_recheck_loses_the_wakeup"]
fn loom_model_work_ping_without_the_recheck() {
    work_ping_model(true, false, false, true);
}

/// Shutdown's wait (`event_loop::shutdown`, `stopping_sleep`) over the shipping `Inbox` and
/// `Parker`: the stopping loop counts the pushes begun so far (`inbox_before`, which includes
/// a push in flight: `Inbox::push` counts before it queues) and, while it has not taken that
/// many, drains, or announces, rechecks the inbox and sleeps. The sleep's 1 ms timeout is
/// never what ends the wait for a push in flight: without it (loom has none) the push's ping
/// or the recheck does.
#[test]
fn loom_stopping_wait_takes_a_push_in_flight() {
    loom::model(|| {
        let inbox = Arc::new(Inbox::new());
        let parker = Arc::new(Parker::new().unwrap());
        let sender = {
            let (inbox, parker) = (inbox.clone(), parker.clone());
            thread::spawn(move || {
                inbox.push(7u32);
                parker.unpark();
            })
        };
        let before = inbox.pushed();
        let mut spare = Vec::new();
        let mut took = 0;
        while !inbox.popped_at_least(before) {
            if inbox.drain_into(&mut spare) > 0 {
                took += spare.len();
                spare.clear();
                continue;
            }
            parker.announce();
            if inbox.recheck() {
                parker.cancel();
            } else {
                parker.sleep(None);
            }
        }
        sender.join().unwrap();
        assert_eq!(
            took as u64, before,
            "the wait ended before the push in flight came in"
        );
    });
}
