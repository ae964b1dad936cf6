//! Loom models of the ring-mesh and shared-channel protocols (`ring/mod.rs` rules 2, 3 and 5,
//! `channel/shared.rs` rules 1–3 and the close of either end).
//!
//! rtrb is not loom-instrumented, so the rings here are a minimal SPSC stand-in with rtrb's
//! memory orderings and caches (the producer publishes `tail` with Release, the consumer `head`
//! with Release, each reads the other's with Acquire, and only when its cached copy says full
//! or empty); its slots are loom cells, so the model also checks that a slot is never written
//! while read. The parker is the real `Parker`; the ring flags are the same atomics the
//! shipping code uses, accessed the same way, in the code's order (a loop spins, then
//! announces and rechecks); the channel models run the shipping `channel::shared::Side`
//! (waker slot, `waiting` and close flags) and the real `Inbox`, through which a foreign wake
//! reaches the task's loop; the held-item models and the `loom_channel_shipping_*` models run
//! the shipping `Sender` and `Receiver` themselves, their futures' polls included (their rtrb
//! ring unchecked, their wake state and `last` slot checked).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_`.

use std::cell::Cell;

use loom::{
    cell::UnsafeCell,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::*},
        Arc,
    },
    thread,
};

use crate::event_loop::{Inbox, Parker};

/// SPSC ring stand-in with rtrb 0.4's orderings and caches: each end keeps its own index and
/// a cached copy of the other's, and loads the other's index (Acquire) only when the cache
/// says full (producer) or empty (consumer), as `Producer::next_tail` and
/// `Consumer::next_head` do; `is_full` and `is_empty` are those same checks, and a push or pop
/// publishes its own index with Release. The caches are plain cells: each is touched by its
/// end's thread only (or after a `join`).
struct Ring {
    slots: Vec<UnsafeCell<u32>>,
    head: AtomicUsize,
    tail: AtomicUsize,
    /// The producer's `cached_head` and own tail (rtrb's `Producer` fields).
    p_head: Cell<usize>,
    p_tail: Cell<usize>,
    /// The consumer's own head and `cached_tail` (rtrb's `Consumer` fields).
    c_head: Cell<usize>,
    c_tail: Cell<usize>,
}

// SAFETY: one producer writes a slot before publishing `tail` (Release); the consumer reads it
// only after observing that `tail` (Acquire), and frees it by publishing `head` (Release),
// which the producer observes (Acquire) before reusing the slot. The cells of each end are
// used by that end's thread only. Test-only.
unsafe impl Sync for Ring {}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            slots: (0..cap).map(|_| UnsafeCell::new(0)).collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            p_head: Cell::new(0),
            p_tail: Cell::new(0),
            c_head: Cell::new(0),
            c_tail: Cell::new(0),
        }
    }
    /// rtrb's `Producer::next_tail`: the tail to write, or `None` when full.
    fn next_tail(&self) -> Option<usize> {
        let t = self.p_tail.get();
        if t - self.p_head.get() == self.slots.len() {
            let h = self.head.load(Acquire);
            self.p_head.set(h);
            if t - h == self.slots.len() {
                return None;
            }
        }
        Some(t)
    }
    /// rtrb's `Consumer::next_head`: the head to read, or `None` when empty.
    fn next_head(&self) -> Option<usize> {
        let h = self.c_head.get();
        if h == self.c_tail.get() {
            let t = self.tail.load(Acquire);
            self.c_tail.set(t);
            if t == h {
                return None;
            }
        }
        Some(h)
    }
    fn push(&self, v: u32) -> bool {
        let Some(t) = self.next_tail() else {
            return false;
        };
        // SAFETY: see the `Sync` impl: slot `t` is free and only the producer writes it. Loom's
        // cell checks that claim: a write racing the consumer's read fails the model.
        self.slots[t % self.slots.len()].with_mut(|p| unsafe { *p = v });
        self.tail.store(t + 1, Release);
        self.p_tail.set(t + 1);
        true
    }
    fn pop(&self) -> Option<u32> {
        let h = self.next_head()?;
        // SAFETY: see the `Sync` impl: slot `h` was published by the producer.
        let v = self.slots[h % self.slots.len()].with(|p| unsafe { *p });
        self.head.store(h + 1, Release);
        self.c_head.set(h + 1);
        Some(v)
    }
    /// The consumer's look (`LocalMesh::incoming_pending`).
    fn is_empty(&self) -> bool {
        self.next_head().is_none()
    }
    /// The producer's look (`space_freed_slow`, `prepare_park`, `has_space`).
    fn is_full(&self) -> bool {
        self.next_tail().is_none()
    }
}

/// The consumer loop of ring rules 4 and 5 and park.rs rule 1, turn by turn until `n`
/// messages arrived: a turn drains the ring (`ring::drain_ring`) and, if it took any, calls
/// `drained` once (rule 3's consumer side comes after the batch, as there); an empty turn
/// spins (`spin_for_work`: `ring::spin_news` looks at the ring with no announcement), then
/// announces, rechecks (`incoming_pending`) and sleeps, as the park decision does.
fn consume(ring: &Ring, parker: &Parker, n: usize, mut drained: impl FnMut()) -> Vec<u32> {
    let mut got = Vec::new();
    while got.len() < n {
        let before = got.len();
        while let Some(v) = ring.pop() {
            got.push(v);
        }
        if got.len() > before {
            drained();
            continue;
        }
        // Spin-before-park: `spin_news`, no announcement (a ping reaches only a loop that
        // announced sleep).
        if !ring.is_empty() {
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

/// A producer loop's idle path with a backlog or a ring-space waiter (ring rule 3): the spin
/// (`spin_news`: room in the blocked ring, no announcement), then the park decision (announce,
/// `prepare_park`: set `want_space` by swap, recheck); back to work (cancel) if space
/// appeared, else sleep until the consumer's unpark.
fn wait_for_space(ring: &Ring, want: &AtomicBool, parker: &Parker) {
    if !ring.is_full() {
        return;
    }
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
        let got = consume(&ring, &parker, 2, || {});
        producer.join().unwrap();
        assert_eq!(got, vec![0, 1]);
    });
}

/// Ring rule 3: a task facing a full ring waits for space (`ring::Reserve`: it sets
/// `want_space` by swap and rechecks `has_space`), and its loop, left with that waiter,
/// spins, announces and sets the flag again in `prepare_park` (the consumer's swap may have
/// cleared it meanwhile) before it sleeps. The consumer drains a turn's worth, then swaps the
/// flag back and unparks the producer if it was set (`drain_ring`).
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
                let mut turn = 0;
                while r2.pop().is_some() {
                    turn += 1;
                }
                if turn > 0 {
                    got += turn;
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
            // `Reserve::poll`: announce, then recheck (`has_space`).
            want.swap(true, SeqCst);
            if !ring.is_full() {
                continue;
            }
            // The task is pending: its loop's idle path.
            wait_for_space(&ring, &want, &producer_parker);
        }
        consumer.join().unwrap();
    });
}

/// A foreign waker (ring rule 3b): the waker of a foreign executor's `block_on`, which blocks
/// its thread until woken (`futures::executor::block_on` parks it on an unpark token; here a
/// token under a mutex and a condition variable).
struct Blocker {
    token: loom::sync::Mutex<bool>,
    woken: loom::sync::Condvar,
}

impl Blocker {
    /// Blocks until woken since the last call (takes the token).
    fn block(&self) {
        let mut token = self.token.lock().unwrap();
        while !*token {
            token = self.woken.wait(token).unwrap();
        }
        *token = false;
    }
}

impl std::task::Wake for Blocker {
    fn wake(self: std::sync::Arc<Self>) {
        *self.token.lock().unwrap() = true;
        self.woken.notify_one();
    }
}

/// Ring rule 3b: a task whose loop's thread is blocked in a foreign executor waits for space
/// on a full ring (`ring::join_foreign`): it adds the foreign waker to the pair's list, sets
/// `want_space` by swap, rechecks, and the thread parks until that waker unparks it; its loop
/// never turns, so the loop's ping and its waiter list wake nothing. The consumer drains,
/// swaps the flag back and, if it was set, takes the list and wakes it (`take_foreign`) as
/// well as pinging the loop. With the list not taken, the model deadlocks.
#[test]
fn loom_ring_consumer_wakes_a_foreign_waiter() {
    loom::model(|| {
        let ring = Arc::new(Ring::new(1));
        let want = Arc::new(AtomicBool::new(false));
        let foreign = Arc::new(loom::sync::Mutex::new(Vec::<std::task::Waker>::new()));
        assert!(ring.push(0), "an empty ring takes one");
        let (r2, w2, f2) = (ring.clone(), want.clone(), foreign.clone());
        let consumer = thread::spawn(move || {
            let mut got = Vec::new();
            while got.len() < 2 {
                let before = got.len();
                while let Some(v) = r2.pop() {
                    got.push(v);
                }
                if got.len() > before {
                    if w2.swap(false, SeqCst) {
                        let wakers = std::mem::take(&mut *f2.lock().unwrap());
                        for w in wakers {
                            w.wake();
                        }
                    }
                } else {
                    thread::yield_now();
                }
            }
            got
        });
        let blocker = std::sync::Arc::new(Blocker {
            token: loom::sync::Mutex::new(false),
            woken: loom::sync::Condvar::new(),
        });
        let waker = std::task::Waker::from(blocker.clone());
        loop {
            if ring.push(1) {
                break;
            }
            {
                let mut list = foreign.lock().unwrap();
                if !list.iter().any(|w| w.will_wake(&waker)) {
                    list.push(waker.clone());
                }
            }
            want.swap(true, SeqCst);
            if !ring.is_full() {
                continue;
            }
            // The foreign `block_on`: the thread sleeps until its waker is woken.
            blocker.block();
        }
        assert_eq!(consumer.join().unwrap(), vec![0, 1]);
    });
}

/// The task's waker, fired from a thread that runs no loop of the executor (the model's
/// other side): `context::route`'s foreign path, the owner's inbox and then a ping
/// (`park.rs` rule 2). A wake after the task is done is harmless, as on a loop.
struct Wake {
    inbox: Arc<Inbox<()>>,
    parker: Arc<Parker>,
}

impl std::task::Wake for Wake {
    fn wake(self: std::sync::Arc<Self>) {
        self.inbox.push(());
        self.parker.unpark();
    }
}

/// The loop of a task whose poll returned `Pending`, until the task is woken: the end of its
/// turn finds nothing runnable, the park decision announces, rechecks the inbox and sleeps
/// (`park.rs` rules 1 and 3); the turn that drains the task's wake from the inbox polls it
/// again.
fn run_until_woken(inbox: &Inbox<()>, parker: &Parker) {
    let mut spare = Vec::new();
    loop {
        if inbox.drain_into(&mut spare) > 0 {
            return;
        }
        parker.announce();
        if inbox.recheck() {
            parker.cancel();
        } else {
            parker.sleep(None);
        }
    }
}

/// Shared channel rules 1–2 on the shipping `Side` (its waker slot, `waiting` flag and close
/// flag, through `crate::sync`): the receiver's `RecvFut::poll` finds the ring empty, waits
/// (stores its waker, swaps `waiting`), rechecks, and returns `Pending`; its loop then parks
/// until the wake comes back through its inbox. The sender pushes twice and signals once, at
/// the end of its turn, or (with `close`) drops its end instead of signalling
/// (`Sender::drop`: close, wake the receiver, forget its own waker). The receiver must get
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
                drop(tx2.forget());
            } else {
                // End of the sender's turn: one signal for both pushes.
                rx2.signal();
            }
        });
        let inbox = Arc::new(Inbox::new());
        let parker = Arc::new(Parker::new().unwrap());
        let waker = std::task::Waker::from(std::sync::Arc::new(Wake {
            inbox: inbox.clone(),
            parker: parker.clone(),
        }));
        let mut got = Vec::new();
        // `Receiver::try_recv`: reads the close flag only after finding the ring empty, and
        // pops again after seeing it. `Some(Some(v))` a value, `Some(None)` closed, `None`
        // empty.
        let try_recv = || -> Option<Option<u32>> {
            if let Some(v) = ring.pop() {
                return Some(Some(v));
            }
            if tx_side.is_closed() {
                return Some(ring.pop());
            }
            None
        };
        // `recv().await` until both values came (and, with `close`, the end).
        loop {
            // `RecvFut::poll`: try, announce (`Side::wait`), recheck.
            let polled = try_recv().or_else(|| {
                rx_side.wait(&waker);
                try_recv()
            });
            match polled {
                Some(Some(v)) => {
                    got.push(v);
                    if !close && got.len() == 2 {
                        break;
                    }
                }
                Some(None) => break,
                None => run_until_woken(&inbox, &parker),
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

/// Shared channel rule 3 on the shipping `Side`, the mirror of [`channel_model`]: the sender's
/// `SendFut::poll` finds the ring full, waits (stores its waker, swaps the sender side's
/// `waiting`), rechecks (the close flag first, as `try_send`), and returns `Pending`; its loop
/// parks until the wake comes back through its inbox. The receiver pops and signals at the end
/// of its turn, or (with `close`) drops its end instead (`Receiver::drop`: close, wake the
/// sender, forget its own waker, drain). The sender must get its value in, or with `close`
/// see the channel end, without a lost wake-up.
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
                drop(rx2.forget());
                while r2.pop().is_some() {}
            } else {
                assert_eq!(r2.pop(), Some(1));
                // End of the receiver's turn: the pop is news for a waiting sender.
                tx2.signal();
            }
        });
        let inbox = Arc::new(Inbox::new());
        let parker = Arc::new(Parker::new().unwrap());
        let waker = std::task::Waker::from(std::sync::Arc::new(Wake {
            inbox: inbox.clone(),
            parker: parker.clone(),
        }));
        // `Sender::try_send`: `Some(true)` sent, `Some(false)` closed, `None` full.
        let try_send = || -> Option<bool> {
            if rx_side.is_closed() {
                return Some(false);
            }
            ring.push(2).then_some(true)
        };
        // `send(2).await`.
        let sent = loop {
            // `SendFut::poll`: try, announce (`Side::wait`), recheck.
            let polled = try_send().or_else(|| {
                tx_side.wait(&waker);
                try_send()
            });
            match polled {
                Some(sent) => break sent,
                None => run_until_woken(&inbox, &parker),
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
            // Turn 1: the first message fits; the second goes to the backlog unless the
            // consumer took the first already (`LocalMesh::push`).
            assert!(r2.push(1));
            let mut backlog = Vec::new();
            if !r2.push(2) {
                backlog.push(2u32);
            }
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
        let got = consume(&ring, &consumer_parker, 2, || {
            // Rule 3: a pop frees space; wake the producer if it waits for some.
            if want.swap(false, SeqCst) {
                producer_parker.unpark();
            }
        });
        producer.join().unwrap();
        assert_eq!(got, vec![1, 2]);
    });
}

/// Polls `fut` as a task of a loop would, until it is ready: each `Pending` ends the turn and
/// the loop parks until the task's waker (through its inbox) says it was woken.
fn drive<F: std::future::Future>(fut: F) -> F::Output {
    use std::task::{Context, Poll};
    let inbox = Arc::new(Inbox::new());
    let parker = Arc::new(Parker::new().unwrap());
    let waker = std::task::Waker::from(std::sync::Arc::new(Wake {
        inbox: inbox.clone(),
        parker: parker.clone(),
    }));
    let mut fut = std::pin::pin!(fut);
    loop {
        match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(v) => return v,
            Poll::Pending => run_until_woken(&inbox, &parker),
        }
    }
}

/// Rules 1 and the sender's close on the shipping `RecvFut::poll` (try, `Side::wait`,
/// recheck), not a copy of it: [`channel_model`] checks the same protocol over a ring whose
/// orderings loom explores, this one the poll's own code (rtrb unchecked), so a poll that
/// dropped its recheck is caught here. The sender sends two values off any loop (each one
/// signalled at once) and drops its end; the receiver's `recv().await` must get both, then
/// the end.
#[test]
fn loom_channel_shipping_recv_never_misses_a_send_or_the_close() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let (mut tx, mut rx) = crate::channel::shared::bounded::<u32>(4).unwrap();
        let sender = thread::spawn(move || {
            assert!(tx.try_send(1).is_ok());
            assert!(tx.try_send(2).is_ok());
        });
        let mut got = Vec::new();
        while let Some(v) = drive(rx.recv()) {
            got.push(v);
        }
        sender.join().unwrap();
        assert_eq!(got, vec![1, 2]);
    });
}

/// Rule 3 and the receiver's close on the shipping `SendFut::poll`: the ring (capacity 1) is
/// full; the receiver takes its value and then, with `close`, drops its end (else hands it
/// back); the sender's `send(2).await` must get its value in, or see the close, without a
/// lost wake-up. Without `close` the value is then in the ring.
fn shipping_send_model(close: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        let (mut tx, mut rx) = crate::channel::shared::bounded::<u32>(1).unwrap();
        assert!(tx.try_send(1).is_ok());
        let receiver = thread::spawn(move || {
            assert_eq!(rx.try_recv().ok(), Some(1));
            if close {
                drop(rx);
                None
            } else {
                Some(rx)
            }
        });
        let sent = drive(tx.send(2));
        // With `close` the value either got in before the close (then the receiver's drop
        // drained it) or was refused: both end the send, which is what the model checks.
        if let Some(mut rx) = receiver.join().unwrap() {
            assert!(sent.is_ok(), "the receiver is alive");
            assert_eq!(rx.try_recv().ok(), Some(2));
        }
    });
}

#[test]
fn loom_channel_shipping_send_never_misses_freed_space() {
    shipping_send_model(false);
}

#[test]
fn loom_channel_shipping_send_never_misses_the_receivers_close() {
    shipping_send_model(true);
}

/// Both ends waiting, on the shipping `SendMany` (try, announce, recheck, a second full ring
/// waits) and `RecvMany` (try, `Side::wait`, recheck): three values through a ring of one,
/// so each end waits for the other, then the sender's drop. The receiver must get all three,
/// in order, then the end (`recv_many` resolving to 0).
#[test]
fn loom_channel_shipping_send_many_and_recv_many_wait_for_each_other() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(|| {
        let (mut tx, mut rx) = crate::channel::shared::bounded::<u32>(1).unwrap();
        let sender = thread::spawn(move || {
            assert!(drive(tx.send_many([1, 2, 3])).is_ok());
        });
        let mut got = Vec::new();
        while drive(rx.recv_many(&mut got, 8)) > 0 {}
        sender.join().unwrap();
        assert_eq!(got, vec![1, 2, 3]);
    });
}

/// A value that counts its drops, for the held-item models below.
struct Counted(u32, Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, SeqCst);
    }
}

/// Leaves `v` held in `tx`, as a cancelled `send_many` does, on the shipping channel: polled
/// on a full ring, a `SendMany` peeks `v`, waits and returns `Pending`; dropped, it hands `v`
/// to the `Sender` (`Sender::hold`). If the receiver is gone by the poll, `v` comes back in
/// the `Err` and is dropped here.
fn hold(tx: &mut crate::channel::shared::Sender<Counted>, v: Counted) {
    use std::{future::Future, pin::pin, task::Context};
    let mut fut = pin!(tx.send_many(std::iter::once(v)));
    let _ = fut
        .as_mut()
        .poll(&mut Context::from_waker(std::task::Waker::noop()));
}

/// Shared channel close with a held item (`Sender::last`), on the shipping `Sender` and
/// `Receiver` (rtrb itself is not loom-instrumented: its ring runs unchecked, the wake state
/// and the `last` slot are checked): the `Sender` holds the item a cancelled `send_many` left
/// behind a full ring, and drops (close, wake the receiver, forget its waker) while the
/// receiver's `recv().await` takes the ring's item, then waits on the empty ring (its loop
/// parked until the wake comes through its inbox). The receiver must be woken and get the
/// held item after the ring's, then see the end.
#[test]
fn loom_channel_receiver_gets_the_held_item_after_the_close() {
    use std::{future::Future, pin::Pin, task::Poll};
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (mut tx, mut rx) = crate::channel::shared::bounded::<Counted>(1).unwrap();
        assert!(tx.try_send(Counted(1, drops.clone())).is_ok());
        hold(&mut tx, Counted(2, drops.clone()));
        let sender = thread::spawn(move || drop(tx));
        let inbox = Arc::new(Inbox::new());
        let parker = Arc::new(Parker::new().unwrap());
        let waker = std::task::Waker::from(std::sync::Arc::new(Wake {
            inbox: inbox.clone(),
            parker: parker.clone(),
        }));
        let mut got = Vec::new();
        loop {
            let mut fut = rx.recv();
            match Pin::new(&mut fut).poll(&mut std::task::Context::from_waker(&waker)) {
                Poll::Ready(Some(v)) => got.push(v.0),
                Poll::Ready(None) => break,
                Poll::Pending => run_until_woken(&inbox, &parker),
            }
        }
        sender.join().unwrap();
        assert_eq!(got, vec![1, 2]);
        assert_eq!(drops.load(SeqCst), 2);
    });
}

/// The held item against the receiver's drop, on the shipping channel: a `send_many` waits on
/// a full ring (its item peeked), then the receiver drops (close, then its drain, `last`
/// last) while the `send_many` is cancelled (`Sender::hold`: the item stored in `last`, then a
/// look at the receiver's close). Whichever comes second drops the item, and only once: kept
/// in `last` after the receiver's drain, it lived as long as the `Sender`. (The poll comes
/// before the receiver's drop: a send that checks the close, and then pushes into the ring
/// the receiver just drained, leaves its item there until the `Sender` drops, which no
/// read-modify-write pair covers.)
#[test]
fn loom_channel_held_item_is_dropped_with_the_receiver() {
    use std::{future::Future, task::Context};
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (mut tx, rx) = crate::channel::shared::bounded::<Counted>(1).unwrap();
        assert!(tx.try_send(Counted(1, drops.clone())).is_ok());
        {
            let mut fut = Box::pin(tx.send_many(std::iter::once(Counted(2, drops.clone()))));
            let polled = fut
                .as_mut()
                .poll(&mut Context::from_waker(std::task::Waker::noop()));
            assert!(polled.is_pending(), "the ring is full");
            let receiver = thread::spawn(move || drop(rx));
            // Cancelled: the `Sender` holds the peeked item.
            drop(fut);
            receiver.join().unwrap();
        }
        assert_eq!(
            drops.load(SeqCst),
            2,
            "an item outlived the receiver (kept by the Sender)"
        );
        drop(tx);
        assert_eq!(drops.load(SeqCst), 2, "an item was dropped twice");
    });
}
