//! Loom model of the hand-over of a ring's messages between a loop that is shutting down and
//! the loop that owns the ring's consumer end (`ring/mod.rs` rules 1, 2 and 6, and the doc
//! of `ring::evacuate`). Loop A sends on ring A→B (one slot): two messages before its
//! shutdown begins (a running task's spawns; the second waits in the backlog while the ring
//! is full), one from a drop of its shutdown, and, if A drops that one itself, a fourth that
//! its drop sends in turn. Loop B, the owner of the ring's consumer end, is in one of three
//! states: stopped (its end parked in the executor's mesh), in its shutdown (it drains its
//! ring twice, then gives its end back), or not yet started (it takes its end out of the
//! mesh, drains twice, then gives it back). A runs its shutdown's passes of `evacuate` until
//! one returns that it need not come back. In every interleaving: each message is drained by
//! B, handed to B's inbox or dropped by A, exactly once, and each of those keeps the order of
//! sending; none is left in the ring or the backlog (where only the sweep at the end of the
//! run, `Mesh::drop_queued`, would find it); A hands over only what it sent before its
//! shutdown and drops only what its shutdown sent; rule 6's counts balance (sent = received
//! by B + handed over by A); and A's passes end. Two expected-fail variants each take one
//! step out and show the model catches it: A not coming back for what it left in the ring
//! of an owner that still holds its end (a message is lost), and A popping with the slot's
//! lock released (a starting owner takes no end).
//!
//! Shipping code driven: the mesh's slot type and lock (`crate::sync::Mutex` and
//! `crate::sync::lock`, as `Mesh::consumers` holds and takes them) and the owner's `Inbox`
//! (what `ring::hand_over` pushes to). Stand-ins: the ring is a minimal loom-aware SPSC ring
//! with rtrb 0.4's memory orderings and caches (rtrb is not loom-instrumented), whose
//! consumer end carries its own indices as it moves through the mesh's mutex, as rtrb's
//! `Consumer` does. The protocol functions are transcriptions, not the shipping functions,
//! which need a whole `Core` and real tasks: [`evacuate`] is `ring::evacuate` for one peer
//! (the same steps in the same order: the flush of the backlog, the consumer slot's lock held
//! while popping, the wait rule on the ring's free slots and the backlog, the split into
//! kept and dropped by the shutdown's count, the drops after the hand-over),
//! [`Sender::push`] is `LocalMesh::push`, [`Sender::flush`] is `ring::move_backlogs`,
//! [`take`] and [`give_back`] are the consumer-slot halves of `Mesh::take` and
//! `Mesh::give_back`, and [`drain`] is `ring::drain_ring`. Not modelled: the want-space flags
//! and pings (rules 3 and 5; `loom_ring.rs` checks them), the owner's parker, a poisoned owner
//! (whose messages are leaked instead), B's own sends and the loops' other rings. The models
//! are exhaustive (no preemption bound) and take a few seconds each in release.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p xtc-shards --release --lib loom_`.

use std::collections::VecDeque;

use loom::{cell::UnsafeCell, sync::Arc, thread};

use crate::{
    event_loop::Inbox,
    sync::{
        lock, AtomicUsize, Mutex,
        Ordering::{Acquire, Release},
    },
};

/// Slots of ring A→B: one, so a second message waits in the backlog (rule 2).
const CAPACITY: usize = 1;

/// Messages A sends before its shutdown begins (a running task's spawns), ids `0..EARLY`:
/// the first fills the ring, and the next waits in the backlog unless B drained the first
/// meanwhile. Kept for B (handed over) if B has stopped.
const EARLY: u32 = 2;

/// The message a drop of A's shutdown sends (id `EARLY`): dropped if B has stopped.
const LATE: u32 = EARLY;

/// The message the drop of [`LATE`] sends in turn (id `EARLY + 1`), if A is the one that
/// drops it: user code in a drop may send again, and `evacuate` then returns that its caller
/// must come back.
const RESENT: u32 = EARLY + 1;

/// Drains B's shutdown makes before it leaves (an earlier turn's, then its last).
const DRAINS: usize = 2;

/// The ring's shared part (rtrb's `RingBuffer`): the slots and the two published indices,
/// which grow without wrapping (the model never reaches a wrap).
struct Buffer {
    slots: Vec<UnsafeCell<u32>>,
    head: AtomicUsize,
    tail: AtomicUsize,
}

// SAFETY: the one producer writes a slot before it publishes `tail` (Release), and the one
// consumer reads a slot only after it observed that `tail` (Acquire); the consumer frees the
// slot by publishing `head` (Release), which the producer observes (Acquire) before it writes
// the slot again. Loom's cells check that claim: a write racing a read fails the model.
unsafe impl Sync for Buffer {}

/// A new ring of [`CAPACITY`] slots: its producer and consumer ends (`RingBuffer::new`).
fn ring() -> (Producer, Consumer) {
    let buf = Arc::new(Buffer {
        slots: (0..CAPACITY).map(|_| UnsafeCell::new(0)).collect(),
        head: AtomicUsize::new(0),
        tail: AtomicUsize::new(0),
    });
    let p = Producer {
        buf: buf.clone(),
        cached_head: 0,
        tail: 0,
    };
    let c = Consumer {
        buf,
        head: 0,
        cached_tail: 0,
    };
    (p, c)
}

/// rtrb's `Producer`: its own tail and a cached copy of the head.
struct Producer {
    buf: Arc<Buffer>,
    cached_head: usize,
    tail: usize,
}

impl Producer {
    /// rtrb's `Producer::next_tail`: loads the head (Acquire) only when the cache says full.
    fn next_tail(&mut self) -> Option<usize> {
        if self.tail - self.cached_head == CAPACITY {
            self.cached_head = self.buf.head.load(Acquire);
            if self.tail - self.cached_head == CAPACITY {
                return None;
            }
        }
        Some(self.tail)
    }

    /// rtrb's `Producer::push`: `Err` gives the message back when the ring is full.
    fn push(&mut self, r: u32) -> Result<(), u32> {
        let Some(t) = self.next_tail() else {
            return Err(r);
        };
        // SAFETY: see `Buffer`'s `Sync`: slot `t` is free, and only the producer writes it.
        self.buf.slots[t % self.buf.slots.len()].with_mut(|s| unsafe { *s = r });
        self.tail = t + 1;
        self.buf.tail.store(self.tail, Release);
        Ok(())
    }

    /// rtrb's `Producer::slots`: free slots, from a fresh load of the head (Acquire).
    fn slots(&mut self) -> usize {
        self.cached_head = self.buf.head.load(Acquire);
        CAPACITY - (self.tail - self.cached_head)
    }
}

/// rtrb's `Consumer`: its own head and a cached copy of the tail. Both travel with the end
/// when a loop parks it in the mesh or takes it from there.
struct Consumer {
    buf: Arc<Buffer>,
    head: usize,
    cached_tail: usize,
}

impl Consumer {
    /// rtrb's `Consumer::pop`: loads the tail (Acquire) only when the cache says empty.
    fn pop(&mut self) -> Option<u32> {
        if self.head == self.cached_tail {
            self.cached_tail = self.buf.tail.load(Acquire);
            if self.head == self.cached_tail {
                return None;
            }
        }
        // SAFETY: see `Buffer`'s `Sync`: slot `head` was published by the producer.
        let r = self.buf.slots[self.head % self.buf.slots.len()].with(|s| unsafe { *s });
        self.head += 1;
        self.buf.head.store(self.head, Release);
        Some(r)
    }
}

/// `Mesh::consumers[A * n + B]`: where ring A→B's consumer end is parked while B does not run.
type Slot = Mutex<Option<Consumer>>;

/// Loop A's `LocalMesh`, reduced to what ring A→B uses: its producer end, its backlog (whose
/// length is `backlogged`, there being one peer), the shutdown's count of messages sent
/// (`stopping[B]`), and the rule 6 counts.
struct Sender {
    out: Producer,
    backlog: VecDeque<u32>,
    stopping: Option<usize>,
    sent: u64,
    handed_over: u64,
    /// Model only: what A's drops dropped (`task::cancel_all`), and what the next drop sends.
    dropped: Vec<u32>,
    resend: Option<u32>,
}

impl Sender {
    /// `LocalMesh::push`: counted as sent (and as sent by the shutdown, once it began), into
    /// the ring unless the ring is full or the backlog holds anything (rule 2).
    fn push(&mut self, r: u32) {
        self.sent += 1;
        if let Some(s) = self.stopping.as_mut() {
            *s += 1;
        }
        if self.backlog.is_empty() {
            match self.out.push(r) {
                Ok(()) => return,
                Err(r) => {
                    self.backlog.push_back(r);
                    return;
                }
            }
        }
        self.backlog.push_back(r);
    }

    /// `ring::move_backlogs`: moves the backlog into the ring, in order, as far as it has room.
    fn flush(&mut self) {
        while let Some(r) = self.backlog.pop_front() {
            if let Err(r) = self.out.push(r) {
                self.backlog.push_front(r);
                break;
            }
        }
    }
}

/// The protocol as shipped, or with one step taken out (the expected-fail variants).
#[derive(Clone, Copy)]
enum Variant {
    /// As shipped.
    Shipped,
    /// For an owner that still holds its end, A comes back only for a backlog, not for what
    /// it left in the ring (for an owner that may be past its last drain).
    BacklogOnly,
    /// For an owner that has parked its end, A pops with the slot's lock released: it takes
    /// the end out under the lock, pops, and parks it again under the lock.
    PopUnlocked,
}

/// `ring::evacuate` for A's one peer B. Returns whether the caller must come back.
fn evacuate(a: &mut Sender, slot: &Slot, inbox: &Inbox<u32>, variant: Variant) -> bool {
    // `flush(core)`: its backlog step (the pings are not modelled).
    a.flush();
    let mut waits = false;
    let mut dropped = Vec::new();
    // The loop's body for `to` = B; `break 'peer` is its `continue`.
    'peer: {
        let mut moved = Vec::new();
        {
            // Held while popping: a run of B taking its end waits for it.
            let mut c = lock(slot);
            let Some(end) = c.as_mut() else {
                // The owner still holds its end: wait while anything for it is in the ring
                // (the producer's `slots`, a fresh look at the head) or the backlog.
                waits |= match variant {
                    Variant::BacklogOnly => !a.backlog.is_empty(),
                    _ => !a.backlog.is_empty() || a.out.slots() < CAPACITY,
                };
                break 'peer;
            };
            if let Variant::PopUnlocked = variant {
                let mut taken = c.take();
                drop(c);
                drain(&mut taken, &mut moved);
                give_back(slot, taken);
            } else {
                while let Some(r) = end.pop() {
                    moved.push(r);
                }
            }
        }
        let backlog = std::mem::take(&mut a.backlog);
        moved.extend(backlog);
        let late = a.stopping.as_mut().map_or(0, std::mem::take);
        let keep = moved.len().saturating_sub(late);
        a.handed_over += moved.len() as u64;
        dropped.extend(moved.drain(keep..));
        if moved.is_empty() {
            break 'peer;
        }
        // `hand_over`, less the owner's ping.
        for r in moved {
            inbox.push(r);
        }
    }
    let again = !dropped.is_empty();
    // `task::cancel_all(dropped)`: a drop is user code, which may send again.
    for r in dropped {
        a.dropped.push(r);
        if let Some(next) = a.resend.take() {
            a.push(next);
        }
    }
    waits || again || !a.backlog.is_empty()
}

/// `Mesh::take`, for ring A→B's consumer end: loop B takes it as its run starts.
fn take(slot: &Slot) -> Option<Consumer> {
    lock(slot).take()
}

/// `Mesh::give_back`, for ring A→B's consumer end: loop B parks it as its run ends.
fn give_back(slot: &Slot, end: Option<Consumer>) {
    if end.is_some() {
        *lock(slot) = end;
    }
}

/// `ring::drain_ring` on B's end: pops everything (fewer than `DRAIN_PER_RING`).
fn drain(end: &mut Option<Consumer>, got: &mut Vec<u32>) {
    if let Some(c) = end.as_mut() {
        while let Some(r) = c.pop() {
            got.push(r);
        }
    }
}

/// Where loop B, the ring's owner, is while A shuts down.
#[derive(Clone, Copy)]
enum Owner {
    /// Stopped: its end is parked in the mesh for the whole model.
    Stopped,
    /// In its shutdown, holding the end it took when its run started: it drains its ring
    /// [`DRAINS`] times (its shutdown loop's passes, the last of which found nothing else to
    /// do), then gives its end back.
    Leaving,
    /// Not started yet (`Core::new` runs after the start gate opens, so a peer may already be
    /// shutting down): it takes its end, drains [`DRAINS`] times, then gives its end back.
    Starting,
}

/// Runs A's shutdown against B in state `owner`, under the protocol `variant`, in every
/// interleaving (no preemption bound: the model is small), and checks where each message went.
fn hand_over_at_shutdown(owner: Owner, variant: Variant) {
    loom::model(move || {
        let (out, end) = ring();
        let slot = Arc::new(Mutex::new(None));
        let inbox = Arc::new(Inbox::new());
        let held = match owner {
            Owner::Stopped | Owner::Starting => {
                give_back(&slot, Some(end));
                None
            }
            Owner::Leaving => Some(end),
        };
        let b = (!matches!(owner, Owner::Stopped)).then(|| {
            let slot = slot.clone();
            thread::spawn(move || {
                let mut end = match held {
                    Some(end) => Some(end),
                    None => {
                        let end = take(&slot);
                        assert!(end.is_some(), "B started its run without its ring end");
                        end
                    }
                };
                let mut got = Vec::new();
                for _ in 0..DRAINS {
                    drain(&mut end, &mut got);
                }
                // `Core`'s drop.
                give_back(&slot, end);
                got
            })
        });
        // Loop A: messages sent while it ran, then its shutdown (`event_loop::shutdown`):
        // `begin_shutdown`, a drop that sends, and passes of `evacuate` until one says that
        // nothing needs it back.
        let mut a = Sender {
            out,
            backlog: VecDeque::new(),
            stopping: None,
            sent: 0,
            handed_over: 0,
            dropped: Vec::new(),
            resend: Some(RESENT),
        };
        for r in 0..EARLY {
            a.push(r);
        }
        // `LocalMesh::begin_shutdown`.
        a.stopping = Some(0);
        a.push(LATE);
        let mut passes = 0;
        while evacuate(&mut a, &slot, &inbox, variant) {
            passes += 1;
            assert!(passes < 20, "A's shutdown never stopped coming back");
            // The pass's other work, and `stopping_sleep`'s wait.
            thread::yield_now();
        }
        let drained = b.map_or_else(Vec::new, |b| b.join().unwrap());

        let mut left = Vec::new();
        drain(&mut take(&slot), &mut left);
        assert!(
            left.is_empty(),
            "messages {left:?} left in the ring, which no loop drains"
        );
        assert!(
            a.backlog.is_empty(),
            "messages {:?} left in A's backlog",
            a.backlog
        );
        let mut handed = Vec::new();
        inbox.drain_into(&mut handed);
        // Rule 2: each way out keeps the order of sending.
        for (way, ids) in [
            ("drained", &drained),
            ("handed over", &handed),
            ("dropped", &a.dropped),
        ] {
            assert!(ids.is_sorted(), "messages {way} out of order: {ids:?}");
        }
        let mut all: Vec<u32> = [&drained[..], &handed, &a.dropped].concat();
        all.sort_unstable();
        // `RESENT` was sent only if A dropped `LATE` (not if B drained it).
        let sent: Vec<u32> = (0..a.sent as u32).collect();
        assert_eq!(
            all, sent,
            "not each message drained ({drained:?}), handed over ({handed:?}) or dropped \
             ({:?}) exactly once",
            a.dropped
        );
        assert!(
            handed.iter().all(|&r| r < EARLY),
            "a message sent by A's shutdown was handed over: {handed:?}"
        );
        assert!(
            a.dropped.iter().all(|&r| r >= EARLY),
            "a message sent before A's shutdown was dropped: {:?}",
            a.dropped
        );
        assert_eq!(
            a.sent,
            drained.len() as u64 + a.handed_over,
            "rule 6: sent = received + handed over"
        );
    });
}

/// B stopped before A's shutdown: A takes everything out of the ring and its backlog under
/// the slot's lock, keeps for B what it sent before its shutdown, drops the rest.
#[test]
fn loom_evacuate_to_a_stopped_owner_keeps_or_drops_each_message_once() {
    hand_over_at_shutdown(Owner::Stopped, Variant::Shipped);
}

/// B in its shutdown: its drains race A's sends and passes, and A comes back until B drained
/// everything or gave its end back, then takes the rest.
#[test]
fn loom_evacuate_to_a_leaving_owner_loses_nothing() {
    hand_over_at_shutdown(Owner::Leaving, Variant::Shipped);
}

/// B not started yet: A may empty the ring while B's end is parked, and B's `take` waits for
/// that under the same lock; what A sends later B drains, or A takes after B leaves.
#[test]
fn loom_evacuate_to_a_starting_owner_loses_nothing() {
    hand_over_at_shutdown(Owner::Starting, Variant::Shipped);
}

/// With A coming back only for a backlog (not for what is in the ring) the model finds the
/// loss: B's last drain empties the ring, A moves its backlog into the ring, sees no backlog
/// and leaves, and B gives its end back without another drain. The models above are not
/// vacuous.
#[test]
#[should_panic(expected = "left in the ring")]
fn loom_evacuate_not_waiting_for_the_ring_loses_a_message() {
    hand_over_at_shutdown(Owner::Leaving, Variant::BacklogOnly);
}

/// With A popping outside the slot's lock, the model finds B starting its run without its
/// end: B's `take` came while A had the end out, so B's run receives nothing on ring A→B.
/// The lock held while popping is what makes a starting owner's `take` wait.
#[test]
#[should_panic(expected = "without its ring end")]
fn loom_evacuate_popping_outside_the_lock_takes_a_starting_owners_end() {
    hand_over_at_shutdown(Owner::Starting, Variant::PopUnlocked);
}
