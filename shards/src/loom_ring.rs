//! Loom models of the ring-mesh and shared-channel protocols (`ring/mod.rs` rules 2, 3 and 5,
//! `channel/shared.rs` rules 1–3 and the close of either end).
//!
//! rtrb is not loom-instrumented, so the rings here are a minimal SPSC stand-in with rtrb's
//! memory orderings (the producer publishes `tail` with Release, the consumer `head` with
//! Release, each reads the other's with Acquire); its slots are loom cells, so the model also
//! checks that a slot is never written while read. The parker is the real `Parker`; the ring
//! flags are the same atomics the shipping code uses, accessed the same way; the channel models
//! run the shipping `channel::shared::Side` (waker slot, `waiting` and close flags).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_`.

use loom::{
    cell::UnsafeCell,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::*},
        Arc,
    },
    thread,
};

use crate::event_loop::Parker;

/// SPSC ring stand-in with rtrb's orderings.
struct Ring {
    slots: Vec<UnsafeCell<u32>>,
    head: AtomicUsize,
    tail: AtomicUsize,
}

// SAFETY: one producer writes a slot before publishing `tail` (Release); the consumer reads it
// only after observing that `tail` (Acquire), and frees it by publishing `head` (Release),
// which the producer observes (Acquire) before reusing the slot. Test-only.
unsafe impl Sync for Ring {}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            slots: (0..cap).map(|_| UnsafeCell::new(0)).collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }
    fn push(&self, v: u32) -> bool {
        let t = self.tail.load(Relaxed);
        if t - self.head.load(Acquire) == self.slots.len() {
            return false;
        }
        // SAFETY: see the `Sync` impl: slot `t` is free and only the producer writes it. Loom's
        // cell checks that claim: a write racing the consumer's read fails the model.
        self.slots[t % self.slots.len()].with_mut(|p| unsafe { *p = v });
        self.tail.store(t + 1, Release);
        true
    }
    fn pop(&self) -> Option<u32> {
        let h = self.head.load(Relaxed);
        if self.tail.load(Acquire) == h {
            return None;
        }
        // SAFETY: see the `Sync` impl: slot `h` was published by the producer.
        let v = self.slots[h % self.slots.len()].with(|p| unsafe { *p });
        self.head.store(h + 1, Release);
        Some(v)
    }
    fn is_empty(&self) -> bool {
        self.tail.load(Acquire) == self.head.load(Relaxed)
    }
    fn is_full(&self) -> bool {
        self.tail.load(Relaxed) - self.head.load(Acquire) == self.slots.len()
    }
}

/// The consumer loop of ring rule 5 and park.rs rule 1: pops until `n` messages arrived
/// (calling `popped` after each), and when the ring is empty announces, rechecks and sleeps.
fn consume(ring: &Ring, parker: &Parker, n: usize, mut popped: impl FnMut(u32)) -> Vec<u32> {
    let mut got = Vec::new();
    while got.len() < n {
        if let Some(v) = ring.pop() {
            got.push(v);
            popped(v);
            continue;
        }
        parker.announce();
        if !ring.is_empty() {
            parker.cancel();
            continue;
        }
        parker.sleep(None);
    }
    got
}

/// The producer's park of ring rule 3 on a full ring: announce, set `want_space` by swap,
/// recheck; back to work (cancel) if space appeared, else sleep until the consumer's unpark.
fn wait_for_space(ring: &Ring, want: &AtomicBool, parker: &Parker) {
    parker.announce();
    want.swap(true, SeqCst);
    if !ring.is_full() {
        parker.cancel();
        return;
    }
    parker.sleep(None);
}

/// Ring rule 5 + park.rs: a producer loop pushes then unparks; the consumer loop announces,
/// rechecks its incoming ring, sleeps. Every message is received.
#[test]
fn loom_ring_push_wakes_parked_consumer() {
    loom::model(|| {
        let ring = Arc::new(Ring::new(2));
        let parker = Arc::new(Parker::new().unwrap());
        let (r2, p2) = (ring.clone(), parker.clone());
        let producer = thread::spawn(move || {
            for v in 0..2 {
                assert!(r2.push(v));
            }
            // Batched: one notification after both pushes.
            p2.unpark();
        });
        let got = consume(&ring, &parker, 2, |_| {});
        producer.join().unwrap();
        assert_eq!(got, vec![0, 1]);
    });
}

/// Ring rule 3: a producer facing a full ring sets `want_space` (swap) and rechecks; the
/// consumer pops, then swaps the flag back and unparks the producer if it was set.
#[test]
fn loom_ring_backpressure_wakes_waiting_producer() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let ring = Arc::new(Ring::new(1));
        let want = Arc::new(AtomicBool::new(false));
        let producer_parker = Arc::new(Parker::new().unwrap());
        let (r2, w2, pp2) = (ring.clone(), want.clone(), producer_parker.clone());
        let consumer = thread::spawn(move || {
            let mut got = 0;
            while got < 2 {
                if r2.pop().is_some() {
                    got += 1;
                    if w2.swap(false, SeqCst) {
                        pp2.unpark();
                    }
                } else {
                    thread::yield_now();
                }
            }
        });
        let mut sent = 0;
        while sent < 2 {
            if ring.push(sent) {
                sent += 1;
                continue;
            }
            wait_for_space(&ring, &want, &producer_parker);
        }
        consumer.join().unwrap();
    });
}

/// The task's waker: it unparks the receiver's parker, which stands for the receiver's loop
/// (a waker woken after the receiver is done is harmless, as on a loop).
struct Unpark(Arc<Parker>);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// Shared channel rules 1–2 on the shipping `Side` (its waker slot, `waiting` flag and close
/// flag, through `crate::sync`): the receiver finds the ring empty, waits (stores its waker,
/// swaps `waiting`), rechecks, and parks; the sender pushes twice and signals once, at the end
/// of its turn, or (with `close`) drops its end instead of signalling. The receiver must get
/// both values, and with `close` also see the channel end, without a lost wake-up.
fn channel_model(close: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        use crate::channel::shared::Side;
        let ring = Arc::new(Ring::new(4));
        // The receiver's side (signalled by the sender) and the sender's (closed by its drop).
        let rx_side = Arc::new(Side::new());
        let tx_side = Arc::new(Side::new());
        let (r2, rx2, tx2) = (ring.clone(), rx_side.clone(), tx_side.clone());
        let sender = thread::spawn(move || {
            assert!(r2.push(1));
            assert!(r2.push(2));
            if close {
                // `Sender::drop`.
                tx2.close();
                rx2.wake_now();
            } else {
                // End of the sender's turn: one signal for both pushes.
                rx2.signal();
            }
        });
        let parker = Arc::new(Parker::new().unwrap());
        let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(parker.clone())));
        let mut got = Vec::new();
        // `RecvFut::poll` as a loop: try, wait, recheck, park until woken. `try_recv` reads
        // the close flag only after finding the ring empty, and pops again after seeing it.
        let try_recv = |got: &mut Vec<u32>| -> Option<bool> {
            if let Some(v) = ring.pop() {
                got.push(v);
                return Some(false);
            }
            if tx_side.is_closed() {
                return Some(match ring.pop() {
                    Some(v) => {
                        got.push(v);
                        false
                    }
                    None => true,
                });
            }
            None
        };
        loop {
            match try_recv(&mut got) {
                Some(true) => break,
                Some(false) if !close && got.len() == 2 => break,
                Some(false) => continue,
                None => {}
            }
            // The loop's park protocol around the poll's own announce and recheck.
            parker.announce();
            rx_side.wait(&waker);
            match try_recv(&mut got) {
                None => {
                    parker.sleep(None);
                }
                done => {
                    parker.cancel();
                    match done {
                        Some(true) => break,
                        _ if !close && got.len() == 2 => break,
                        _ => continue,
                    }
                }
            }
        }
        sender.join().unwrap();
        assert_eq!(got, vec![1, 2]);
    });
}

#[test]
fn loom_channel_receiver_never_misses_a_send() {
    channel_model(false);
}

#[test]
fn loom_channel_receiver_never_misses_the_close() {
    channel_model(true);
}

/// Shared channel rule 3 on the shipping `Side`, the mirror of [`channel_model`]: the sender
/// finds the ring full, waits (stores its waker, swaps the sender side's `waiting`), rechecks
/// (the close flag first, as `try_send`), and parks; the receiver pops and signals at the end
/// of its turn, or (with `close`) drops its end instead (`Receiver::drop`: close, wake the
/// sender, drain). The sender must get its value in, or with `close` see the channel end,
/// without a lost wake-up.
fn channel_space_model(close: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        use crate::channel::shared::Side;
        let ring = Arc::new(Ring::new(1));
        assert!(ring.push(1));
        // The receiver's side (closed by its drop) and the sender's (signalled by the receiver).
        let rx_side = Arc::new(Side::new());
        let tx_side = Arc::new(Side::new());
        let (r2, rx2, tx2) = (ring.clone(), rx_side.clone(), tx_side.clone());
        let receiver = thread::spawn(move || {
            if close {
                rx2.close();
                tx2.wake_now();
                while r2.pop().is_some() {}
            } else {
                assert_eq!(r2.pop(), Some(1));
                // End of the receiver's turn: the pop is news for a waiting sender.
                tx2.signal();
            }
        });
        let parker = Arc::new(Parker::new().unwrap());
        let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(parker.clone())));
        // `Sender::try_send`: `Some(true)` sent, `Some(false)` closed, `None` full.
        let try_send = || -> Option<bool> {
            if rx_side.is_closed() {
                return Some(false);
            }
            ring.push(2).then_some(true)
        };
        // `SendFut::poll` as a loop: try, wait, recheck, park until woken.
        let sent = loop {
            if let Some(sent) = try_send() {
                break sent;
            }
            parker.announce();
            tx_side.wait(&waker);
            match try_send() {
                None => {
                    parker.sleep(None);
                }
                Some(sent) => {
                    parker.cancel();
                    break sent;
                }
            }
        };
        receiver.join().unwrap();
        if !close {
            assert!(sent);
            assert_eq!(ring.pop(), Some(2));
        }
    });
}

#[test]
fn loom_channel_sender_never_misses_freed_space() {
    channel_space_model(false);
}

#[test]
fn loom_channel_sender_never_misses_the_receivers_close() {
    channel_space_model(true);
}

/// Ring rules 2, 3 and 5 together: a wake that finds the ring full goes to the producer's
/// backlog. The producer parks by rule 3 (announce, set `want_space`, recheck), the consumer's
/// pop unparks it, and its next turn moves the backlog into the ring and, having pushed, pings
/// the consumer (rule 5), which may have parked meanwhile. Loom finds the consumer asleep on a
/// non-empty ring without that last ping (the bug fixed in `ring::flush`), and also when the
/// parker went back to `RUNNING` by a plain store (the ping for the move coalesces into the
/// one for the first push, and the store cut the consumer off from the producer's `fetch_or`:
/// `event_loop/park.rs` rule 3).
#[test]
fn loom_ring_backlog_moved_into_the_ring_wakes_the_consumer() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let ring = Arc::new(Ring::new(1));
        let want = Arc::new(AtomicBool::new(false));
        let producer_parker = Arc::new(Parker::new().unwrap());
        let consumer_parker = Arc::new(Parker::new().unwrap());
        let (r2, w2, pp2, cp2) = (
            ring.clone(),
            want.clone(),
            producer_parker.clone(),
            consumer_parker.clone(),
        );
        let producer = thread::spawn(move || {
            // Turn 1: the first message fits, the second goes to the backlog.
            assert!(r2.push(1));
            let mut backlog = vec![2u32];
            // End of turn 1: the ring got a push, so the consumer is pinged.
            cp2.unpark();
            while !backlog.is_empty() {
                // A later turn's flush: move the backlog into the ring as space allows.
                if r2.push(backlog[0]) {
                    backlog.remove(0);
                    // Rule 5: the moved message is news for the consumer.
                    cp2.unpark();
                    continue;
                }
                // Park with a backlog (rule 3).
                wait_for_space(&r2, &w2, &pp2);
            }
        });
        let got = consume(&ring, &consumer_parker, 2, |_| {
            // Rule 3: a pop frees space; wake the producer if it waits for some.
            if want.swap(false, SeqCst) {
                producer_parker.unpark();
            }
        });
        producer.join().unwrap();
        assert_eq!(got, vec![1, 2]);
    });
}
