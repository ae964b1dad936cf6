//! A bounded single-producer, single-consumer channel between shards (like Glommio's
//! `shared_channel`), on an rtrb ring. For fan-in, give each producer its own channel.
//!
//! # Many tasks of one shard, one channel
//!
//! A [`Sender`] is one producer ([`send`](Sender::send) takes `&mut self`). Tasks of one shard
//! that all produce into the same channel share it behind an async mutex, such as
//! `futures::lock::Mutex` in an `Rc`: a `RefCell`'s borrow, held across a `send` that waits
//! for room, panics at the next task's send. Cost: per send, taking and giving back the lock
//! (an atomic read-modify-write each, uncontended); a task that waits for it parks until the
//! holder's send is in the ring. A task that sends several values in a row holds the lock over
//! all of them to keep them together. The channel closes when the last `Rc` goes.
//!
//! ```
//! use std::rc::Rc;
//! use xtc_shards::{channel::shared, spawn_local, Executor};
//!
//! let exec = Executor::builder().shards(2).oversubscribe(true).build()?;
//! let (tx, mut rx) = shared::bounded::<u64>(8)?;
//! let producers = exec.spawn_on(0, move || async move {
//!     let tx = Rc::new(futures::lock::Mutex::new(tx));
//!     let tasks: Vec<_> = (0..4u64)
//!         .map(|t| {
//!             let tx = tx.clone();
//!             spawn_local(async move {
//!                 for i in 0..100 {
//!                     // The guard lives for this one send.
//!                     tx.lock().await.send(t * 1_000 + i).await.expect("receiver alive");
//!                 }
//!             })
//!         })
//!         .collect();
//!     for t in tasks {
//!         t.await.expect("producer ran");
//!     }
//! })?;
//! let consumer = exec.spawn_on(1, move || async move {
//!     let (mut n, mut sum) = (0u64, 0u64);
//!     while let Some(v) = rx.recv().await {
//!         n += 1;
//!         sum += v;
//!     }
//!     (n, sum)
//! })?;
//! exec.run()?;
//! let (n, sum) = exec.block_on(move || async move {
//!     producers.await?;
//!     consumer.await
//! })??;
//! assert_eq!((n, sum), (400, (0..4u64).map(|t| t * 100_000 + 4_950).sum()));
//! # Ok::<(), xtc_shards::Error>(())
//! ```
//!
//! # Wake protocol
//!
//! Each side has a waker slot (a mutex, taken when that side is about to wait, and when the
//! other side signals it or closes) and a `waiting` flag.
//!
//! 1. A receiver that finds the ring empty stores its waker, swaps `rx_waiting` to `true`, then
//!    rechecks the ring (and the closed flag) before returning `Pending`.
//! 2. A sender pushes without any read-modify-write. At the end of each loop turn in which it
//!    pushed (at once off any loop), and after every `capacity / 4` pushes so a long burst
//!    overlaps with the receiver instead of alternating with it, it swaps `rx_waiting` to
//!    `false` and, if it was `true`, wakes the stored waker.
//! 3. The sender side mirrors it for a full ring (`tx_waiting`, signalled by the receiver at the
//!    end of each turn in which it popped and after every `capacity / 4` pops).
//!
//! Both sides touch the flag by read-modify-write, so of the two swaps the later one in the flag's
//! modification order either sees `true` (and wakes) or synchronizes with the earlier one, whose
//! side's ring update (push or pop) it then sees on the recheck. No wake-up is lost, and a stream
//! costs one swap per side per loop turn (plus the end-of-turn registration's reference count,
//! an increment and a decrement), plus one swap per `capacity / 4` messages, rather than one
//! per message (a ring of fewer than 8 slots signals every message, one of 8 to 11 every second).
//! Off any loop there is no turn: every push or pop swaps. A side that waits with a waker other
//! than its task's own (a foreign executor blocking inside the task, whose turn then never
//! ends) first sends the turn's deferred signals and ring pings (`Core::flush_deferred`).
//! A side that did not wait leaves its signal to the end of the turn (or to the countdown):
//! a task that, after a `send` or `recv` that completed at once, blocks its loop on anything
//! but an xtc future (a `futures` oneshot inside `futures::executor::block_on`, std's
//! `mpsc::Receiver::recv`, a lock) keeps the other side from being woken by it, as it keeps
//! the rest of its loop's work waiting (crate docs, "Blocking a loop"). Checking the waker on
//! every completed call would cost the per-message path a thread-local read.
//! Closing (dropping an end) sets a flag and wakes the other side at once.
//!
//! The batch calls ([`Sender::send_many`], [`Receiver::recv_many`] and their `try_` forms) move
//! a chunk of the ring at once and follow the same rules, counting a batch of `n` as `n`
//! pushes or pops.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
};

use rtrb::{Consumer, Producer, RingBuffer};

use super::{check_capacity, Run, SendError, TryRecvError, TrySendError};
use crate::{
    context::{self, Flush},
    sync::{lock, AtomicBool, Mutex, Ordering::SeqCst},
};

/// Keeps what it holds on cache lines of its own (128 bytes: two lines, for the adjacent-line
/// prefetcher), so that a flag one side writes does not evict what the other side reads on
/// every message.
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[derive(Debug)]
pub(crate) struct Side {
    /// Written when this side waits and when the other side signals (about once per turn).
    waker: Padded<Mutex<Option<Waker>>>,
    waiting: AtomicBool,
    /// Read by the other side on every message; written once, when this side's end drops.
    closed: Padded<AtomicBool>,
}

impl Side {
    pub(crate) fn new() -> Side {
        Side {
            waker: Padded(Mutex::new(None)),
            waiting: AtomicBool::new(false),
            closed: Padded(AtomicBool::new(false)),
        }
    }

    /// Rules 1 and 3, first half: park this side's waker and announce.
    pub(crate) fn wait(&self, waker: &Waker) {
        let stored = lock(&self.waker)
            .as_ref()
            .is_some_and(|w| w.will_wake(waker));
        let old = if stored {
            None
        } else {
            // Cloned, and the replaced one dropped, outside the lock: a waker's clone and
            // drop are user code when a future was polled with a custom waker, and may touch
            // this channel (drop its other end, which wakes this side under this lock).
            // Whatever the clone did, the caller's recheck after this announcement sees.
            let fresh = waker.clone();
            lock(&self.waker).replace(fresh)
        };
        self.waiting.swap(true, SeqCst);
        drop(old);
        // Woken by someone other than the task being polled (a foreign executor blocking
        // inside it): this turn's deferred wakes go now, or the side that would wake this one
        // may never have been woken itself (`Core::flush_deferred`); with no loop running,
        // a hidden loop's backlog moves (`context::flush_for_foreign_wait`).
        let own = context::with_core(|core| crate::task::polled_with_own_waker(core, waker));
        if own != Some(true) {
            context::flush_for_foreign_wait(waker);
        }
    }

    /// Rule 2: wake this side if it announced it waits.
    pub(crate) fn signal(&self) {
        if self.waiting.swap(false, SeqCst) {
            let w = lock(&self.waker).take();
            if let Some(w) = w {
                // Guarded: at the end of a turn this runs in the loop's own code, and a
                // future polled with a custom waker makes the waker user code.
                crate::task::wake_guarded(w);
                // The wake of a task on another loop rides the ring mesh, whose pings go out
                // at the end of the turn; a channel mid-burst wants the peer now, so it can
                // drain while this side goes on filling.
                context::with_core(crate::ring::flush);
            }
        }
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, SeqCst);
    }

    /// Whether this side's end was dropped. Cost: one load. Inlined: the generic per-message
    /// paths call it, and as a call it cost 7.5 instructions per message, send plus receive
    /// (callgrind, `channel::shared` stream of 2 M `u64`: 117 -> 110 per message).
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    /// This side's end is gone: takes the waker its last wait left (nobody waits here any
    /// more), for the caller to drop outside the lock. Left in place, it lived as long as the
    /// other end, holding its task (or, for a custom waker, whatever that owns).
    pub(crate) fn forget(&self) -> Option<Waker> {
        self.waiting.swap(false, SeqCst);
        lock(&self.waker).take()
    }

    /// Wakes unconditionally (closing).
    pub(crate) fn wake_now(&self) {
        self.waiting.swap(false, SeqCst);
        let w = lock(&self.waker).take();
        if let Some(w) = w {
            crate::task::wake_guarded(w);
        }
    }
}

#[derive(Debug)]
struct Chan {
    /// The receiver's side: woken by the sender.
    rx: Side,
    /// The sender's side: woken by the receiver.
    tx: Side,
}

/// End-of-turn signal for whichever side pushed or popped this turn (rules 2 and 3).
#[derive(Debug)]
struct SignalRx(Arc<Chan>);
impl Flush for SignalRx {
    fn flush(&self) {
        self.0.rx.signal();
    }
}

#[derive(Debug)]
struct SignalTx(Arc<Chan>);
impl Flush for SignalTx {
    fn flush(&self) {
        self.0.tx.signal();
    }
}

/// Creates a channel holding up to `capacity` values. `Err` for a capacity of 0, for one
/// whose slots' bytes exceed `isize::MAX`, and for a ring over 1 MiB the allocator refuses
/// (it is allocated up front; a smaller ring the allocator refuses aborts, as `Vec` does).
/// Cost: six allocations: the ring's `capacity` slots (none for a zero-sized `T`), rtrb's
/// shared head and tail, the two ends' wake state, each end's end-of-turn signal, and the slot
/// for the item a cancelled `send_many` leaves (held back by the sender, delivered after the
/// ring's items); a ring over 1 MiB is
/// allocated and freed once more first.
pub fn bounded<T: Send>(capacity: usize) -> crate::Result<(Sender<T>, Receiver<T>)> {
    let capacity = check_capacity::<T>(capacity)?;
    let bytes = capacity.saturating_mul(std::mem::size_of::<T>());
    // rtrb allocates with `Vec::with_capacity`, whose failure aborts the process: a large
    // ring is first tried fallibly, so a capacity the machine cannot hold is an `Err`.
    // Smaller rings skip the probe (an extra allocation per channel where failure is not
    // plausible).
    if bytes > PROBE_ABOVE && Vec::<T>::new().try_reserve_exact(capacity).is_err() {
        return Err(crate::Error::InvalidArgument(format!(
            "a channel capacity of {capacity} slots ({bytes} bytes) could not be allocated: \
             use a smaller capacity"
        )));
    }
    let (p, c) = RingBuffer::new(capacity);
    let chan = Arc::new(Chan {
        rx: Side::new(),
        tx: Side::new(),
    });
    let last = Arc::new(Mutex::new(None));
    Ok((
        Sender {
            ring: p,
            signaller: Signaller::new(Arc::new(SignalRx(chan.clone())), capacity),
            chan: chan.clone(),
            held: false,
            last: last.clone(),
            run: Run::default(),
        },
        Receiver {
            ring: c,
            signaller: Signaller::new(Arc::new(SignalTx(chan.clone())), capacity),
            chan,
            last,
            run: Run::default(),
        },
    ))
}

/// Rings of more bytes than this are allocated fallibly once before the real allocation
/// ([`bounded`]).
const PROBE_ABOVE: usize = 1 << 20;

/// One end's half of rules 2 and 3: when to signal the other side after it moved messages.
struct Signaller {
    /// This end's end-of-turn signal (`context::schedule_flush`).
    signal: Arc<dyn Flush>,
    /// The turn stamp of the last registration of `signal` (`context::NEVER_FLUSHED` before
    /// the first).
    flush_key: u64,
    /// Messages still to move before the next early signal, less one: it counts down from
    /// `every - 1`, and the move that takes it below zero signals.
    left: usize,
    /// Messages between early signals within one turn.
    every: usize,
}

impl Signaller {
    /// Pushes (or pops) between early signals within one turn: a quarter of the ring, so the
    /// other side is woken while three quarters of slack remain. Measured on the 1,024-slot
    /// stream (`mesh --only stream`, 5 runs each): an eighth ~75 M msgs/s, a quarter ~95, a
    /// half ~92; a smaller step wakes a waiting side for shorter bursts.
    fn new(signal: Arc<dyn Flush>, capacity: usize) -> Signaller {
        let every = (capacity / 4).max(1);
        Signaller {
            signal,
            flush_key: context::NEVER_FLUSHED,
            left: every - 1,
            every,
        }
    }

    /// After `n` pushes (or pops): signal the other side now every `capacity / 4`, else at the
    /// end of the turn. Inlined into the generic callers (the per-message path): as a call it
    /// cost 8 instructions per message per side under callgrind.
    #[inline]
    fn moved(&mut self, n: usize) {
        // A countdown rather than a count compared with `every`, and a batch of any size cannot
        // overflow it. Counting down to a borrow (from `every - 1`) rather than to zero, and
        // storing before the test, leaves one test, the borrow of the subtraction: a `sub` on
        // memory and a branch, where `n >= left` before `left -= n` cost a load, a compare, a
        // branch, a decrement and a store (callgrind, two-shard stream of `u64`: 102 -> 95
        // per message, send plus receive, with the calls below out of line).
        let (left, spent) = self.left.overflowing_sub(n);
        self.left = left;
        if spent {
            self.early();
        } else if !context::flush_scheduled(self.flush_key) {
            self.register();
        }
    }

    /// The countdown ran out: signal the other side now and count down again. Out of line, as
    /// [`register`](Self::register): an inlined call's arguments were computed on the
    /// per-message path.
    #[cold]
    #[inline(never)]
    fn early(&mut self) {
        self.left = self.every - 1;
        self.signal.flush();
    }

    /// The first message of a turn: register the end-of-turn signal (at once off any loop).
    #[cold]
    #[inline(never)]
    fn register(&mut self) {
        context::schedule_flush(&mut self.flush_key, &self.signal);
    }
}

/// The sending end. `Send`, not `Clone`: exactly one producer.
// `repr(C)` with the signaller first: its address is the `Sender`'s, so the per-message path
// computes no argument for the signaller's out-of-line calls (`Signaller::moved`).
#[repr(C)]
pub struct Sender<T> {
    signaller: Signaller,
    ring: Producer<T>,
    chan: Arc<Chan>,
    /// Whether a cancelled [`SendMany`] left an item in [`last`](Self::last): it goes before
    /// anything sent after it. Still set after the receiver's drop emptied `last` (then there
    /// is nothing to send: `send_held` finds the slot empty). A plain flag, so the per-message
    /// path takes no lock.
    held: bool,
    /// The item a cancelled [`SendMany`] had taken from its iterator (to learn that more were
    /// coming) but not sent ([`held`](Self::held)). Shared with the receiver: if this `Sender`
    /// drops first, the receiver takes it after the ring's items (it is the newest item:
    /// nothing is sent while one is held; dropped with the ring full, it was lost though the
    /// receiver was alive); if the receiver drops first, it drops it with the ring's items
    /// (kept in the `Sender`, it lived as long as that, and a reply channel's sender in it
    /// kept that channel open). Boxed, so the shared slot stays small for a large `T` (the box
    /// is made on that rare path only). Not in `Chan`, which is not generic (its end-of-turn
    /// signals are `'static` trait objects, and a channel's `T` need not be `'static`).
    last: Arc<Mutex<Option<Box<T>>>>,
    /// Items sent in a row without waiting ([`Run`]).
    run: Run,
}

/// The receiving end. `Send`, not `Clone`: exactly one consumer.
// `repr(C)`, the signaller first: as `Sender`.
#[repr(C)]
pub struct Receiver<T> {
    signaller: Signaller,
    ring: Consumer<T>,
    chan: Arc<Chan>,
    /// The item a cancelled `send_many` left (`Sender::last`): taken after the ring's items
    /// once the `Sender` is gone, dropped with them if this end drops first.
    last: Arc<Mutex<Option<Box<T>>>>,
    /// Items received in a row without waiting ([`Run`]).
    run: Run,
}

impl<T> Sender<T> {
    /// Sends `value`, waiting while the channel is full. `Err` gives the value back if the
    /// receiver is gone. `Ok` means the value is in the channel, not that it will be received
    /// (as in tokio): a send racing the `Receiver`'s drop may land after the receiver's last
    /// drain, and the value then stays in the ring until this `Sender` drops. Not cancel-safe,
    /// as tokio's `send`: dropping the future while it waits
    /// drops `value` (to keep it, use [`try_send`](Self::try_send), or
    /// [`send_many`](Self::send_many) over `iter.by_ref()`, which keeps what it has not sent).
    /// Cost: a ring push; an atomic read-modify-write only once per turn and per
    /// `capacity / 4` sends (rule 2; every send off any loop). A wait for room adds a lock
    /// (two, and a waker clone, when the waker changed), a check of whether the waker is the
    /// task's own, and a swap (rule 3); with a waker that is not the task's own (a foreign
    /// executor's, or a combinator's that gives each future its own: `FuturesUnordered`,
    /// `join_all` of more than 30, `buffer_unordered`), also this turn's deferred flushes at
    /// once, pings to other loops included, as [`recv`](Receiver::recv)'s. After 1,024 items sent in a
    /// row without waiting (here and by [`send_many`](Self::send_many)), the next send yields
    /// first, for one loop turn, so a receiver that keeps up cannot let this task hold its loop.
    pub fn send(&mut self, value: T) -> SendFut<'_, T> {
        SendFut {
            pending: Some((self, value)),
        }
    }

    /// Sends without waiting: `Full` gives the value back while the ring has no free slot,
    /// `Closed` once the receiver is gone. Cost: a load of the receiver's closed flag, a ring
    /// push and a check of this turn's signal registration (rule 2).
    // Inlined, as are `try_recv`, `pushed` and `popped`: as calls they cost 29 instructions per
    // message, send plus receive (callgrind, `channel::shared` stream: 123 -> 94 per message).
    #[inline]
    pub fn try_send(&mut self, value: T) -> Result<(), TrySendError<T>> {
        if self.chan.rx.is_closed() {
            return Err(TrySendError::Closed(value));
        }
        if self.held && !self.send_held() {
            return Err(TrySendError::Full(value));
        }
        match self.ring.push(value) {
            Ok(()) => {
                self.pushed(1);
                Ok(())
            }
            Err(rtrb::PushError::Full(v)) => Err(TrySendError::Full(v)),
        }
    }

    /// Pushes the item a cancelled `send_many` left (`held`, in `last`) if the ring has room;
    /// returns whether none is left (a receiver that dropped took it).
    #[cold]
    fn send_held(&mut self) -> bool {
        if self.ring.is_full() {
            return false;
        }
        let v = lock(&self.last).take();
        self.held = false;
        let Some(v) = v else {
            return true;
        };
        // The producer alone fills the ring: the room seen above is still there.
        match self.ring.push(*v) {
            Ok(()) => {
                self.pushed(1);
                true
            }
            Err(rtrb::PushError::Full(v)) => {
                let old = lock(&self.last).replace(Box::new(v));
                self.held = true;
                drop(old);
                false
            }
        }
    }

    /// Keeps `v`, which a cancelled `send_many` took from its iterator, for the next send
    /// (`held`); dropped at once if the receiver is gone, as the ring's items were.
    #[cold]
    fn hold(&mut self, v: T) {
        // Empty before: nothing is peeked while one is held. Nothing of `T` is dropped under
        // the lock (its `Drop` may use this channel).
        let old = lock(&self.last).replace(Box::new(v));
        self.held = true;
        // Checked after the store: a receiver that closed later takes it in its drop (its
        // close comes before its look at `last`); one that closed earlier may have looked
        // already, so it is taken back and dropped here.
        let gone = if self.chan.rx.is_closed() {
            self.held = false;
            lock(&self.last).take()
        } else {
            None
        };
        drop(old);
        drop(gone);
    }

    /// Rule 2's bookkeeping after `n` pushes.
    #[inline]
    fn pushed(&mut self, n: usize) {
        self.signaller.moved(n);
    }

    /// Pushes as many items of `items` as the ring has room for, in order, without waiting,
    /// and returns how many: 0 when it is full (or `items` is empty). Items not pushed stay in
    /// `items`. `Err(TrySendError::Closed(()))` if the receiver is gone (nothing is taken from `items` then).
    ///
    /// Cost: one chunk reservation and one publish of the ring's tail for the whole batch, and
    /// the per-turn signal bookkeeping once, where [`try_send`](Self::try_send) pays each per
    /// message.
    #[inline]
    pub fn try_send_many<I: Iterator<Item = T>>(
        &mut self,
        items: &mut std::iter::Peekable<I>,
    ) -> Result<usize, TrySendError<()>> {
        self.send_up_to(items, usize::MAX)
    }

    /// [`try_send_many`](Self::try_send_many), pushing at most `max` items (the held one
    /// aside): a poll of [`SendMany`] stops at its budget even on a ring whose free space is
    /// larger.
    fn send_up_to<I: Iterator<Item = T>>(
        &mut self,
        items: &mut std::iter::Peekable<I>,
        max: usize,
    ) -> Result<usize, TrySendError<()>> {
        if self.chan.rx.is_closed() {
            return Err(TrySendError::Closed(()));
        }
        if self.held && !self.send_held() {
            return Ok(0);
        }
        let free = self.ring.slots().min(max);
        if free == 0 || items.peek().is_none() {
            return Ok(0);
        }
        let mut chunk = self
            .ring
            .write_chunk_uninit(free)
            .expect("the producer alone fills the ring, so its free slots stay free");
        // Filled by hand rather than with rtrb's `fill_from_iter`: if the iterator panics,
        // the items it already gave must be published (sent), not left written in slots that
        // nobody reads or drops (rtrb's chunk has no `Drop`), so the count is committed, and
        // the receiver signalled, on unwind too.
        let mut n = 0;
        let filled = {
            let (first, second) = chunk.as_mut_slices();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for slot in first.iter_mut().chain(second.iter_mut()) {
                    let Some(v) = items.next() else { break };
                    slot.write(v);
                    n += 1;
                }
            }))
        };
        // SAFETY: the first `n` slots of the chunk were written just above (in order, first
        // slice then second), and no more than the chunk holds.
        unsafe { chunk.commit(n) };
        if n > 0 {
            self.pushed(n);
        }
        if let Err(panic) = filled {
            std::panic::resume_unwind(panic);
        }
        Ok(n)
    }

    /// Sends every item of `items`, in order, waiting for ring space as [`send`](Self::send)
    /// does (backpressure), in batches as large as the free space. Resolves once the last
    /// item is in the ring. If the receiver goes away, the items not yet sent come back in the
    /// [`SendError`], as the iterator itself (the next item first): `items` may be endless,
    /// and the caller decides whether to collect the rest. As with [`send`](Self::send), `Ok`
    /// and "sent" mean in the ring, not received: the close is looked at before each batch,
    /// so a `Receiver` dropped while a batch is written (from another thread, or by the
    /// iterator's own `next`) leaves up to a ring's worth of items in the ring, counted as
    /// sent, until this `Sender` drops them (an rtrb producer cannot take items back).
    /// After a ring's worth of items (at
    /// most 65,536, whatever the capacity) in one poll it yields to the loop's other tasks
    /// (and is polled again at once), so a long or endless iterator to a receiver that keeps
    /// up does not hold its loop. Its items count toward the 1,024 in a row after which the
    /// next send yields for one loop turn first (as [`send`](Self::send)'s), so a loop of small
    /// batches does not hold it either.
    ///
    /// Cancel safety: a `send_many(iter.by_ref())` dropped while it waits (a `select!` with a
    /// timer) has sent a prefix and left the other items in `iter`, but for the one it took
    /// to learn that more were coming: that one stays in the `Sender` and goes first, before
    /// anything sent after it (or, if the `Sender` drops first, after what the ring holds);
    /// if the receiver drops first, or had already, it is dropped as the ring's items are.
    /// The receiver cannot see it before then: a consumer that waits for that very item before
    /// it answers the sender waits for good unless the sender sends again (an empty
    /// `try_send_many` pushes it) or drops its end.
    ///
    /// Cost per batch: as [`try_send_many`](Self::try_send_many); a stream sent this way costs
    /// a fraction of per-message `send`s (see `mesh`'s batched stream row in bench/).
    pub fn send_many<I: IntoIterator<Item = T>>(
        &mut self,
        items: I,
    ) -> SendMany<'_, T, I::IntoIter> {
        SendMany {
            tx: self,
            items: Some(items.into_iter().peekable()),
            peeked: false,
        }
    }

    /// Whether the receiver is gone. Cost: one atomic load.
    pub fn is_closed(&self) -> bool {
        self.chan.rx.is_closed()
    }
}

/// Future of [`Sender::send`]. Like most futures it must not be polled after it completed
/// (that panics: its value is gone, sent or given back).
#[must_use = "futures do nothing unless awaited"]
pub struct SendFut<'a, T> {
    /// The sender and the value, until the send completes (sent, or given back in an `Err`).
    /// One `Option` over both, whose `None` is the reference's niche: completing writes one
    /// word, where a separate `Option<T>` beside the sender also stored its discriminant on
    /// every send (callgrind, two-shard stream of `u64`: one instruction per message).
    pending: Option<(&'a mut Sender<T>, T)>,
}

impl<T> Unpin for SendFut<'_, T> {}

impl<T> Future for SendFut<'_, T> {
    type Output = Result<(), SendError<T>>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some((tx, value)) = this.pending.take() else {
            // Its value was sent, or given back in an `Err`: reporting `Ok` now could be a lie.
            panic!("xtc: channel::shared::SendFut polled after it completed");
        };
        if tx.run.yield_first(cx) {
            // Before the send: dropped while it yields, it sent nothing.
            this.pending = Some((tx, value));
            return Poll::Pending;
        }
        let value = match tx.try_send(value) {
            Ok(()) => {
                tx.run.moved(1);
                return Poll::Ready(Ok(()));
            }
            Err(TrySendError::Closed(v)) => return Poll::Ready(Err(SendError(v))),
            Err(TrySendError::Full(v)) => v,
        };
        // Rule 3: announce, then recheck.
        tx.chan.tx.wait(cx.waker());
        match tx.try_send(value) {
            Ok(()) => {
                // In on the recheck, without waiting: it counts towards the budget's run (a
                // stream that always won the recheck never yielded).
                tx.run.moved(1);
                Poll::Ready(Ok(()))
            }
            Err(TrySendError::Closed(v)) => Poll::Ready(Err(SendError(v))),
            Err(TrySendError::Full(v)) => {
                tx.run.waited();
                this.pending = Some((tx, v));
                Poll::Pending
            }
        }
    }
}

/// The most items a poll of [`SendMany`] sends before it yields: a ring's worth, up to this.
/// Above the rings of the benchmarks (1,024 slots), so their batches are unchanged.
const SEND_MANY_BUDGET: usize = 1 << 16;

/// Future of [`Sender::send_many`].
#[must_use = "futures do nothing unless awaited"]
pub struct SendMany<'a, T, I: Iterator<Item = T>> {
    tx: &'a mut Sender<T>,
    /// `None` once the future has given the rest back.
    items: Option<std::iter::Peekable<I>>,
    /// The last poll returned `Pending` holding an item it peeked at a full ring: if the
    /// future is dropped, that item goes to the slot the ends share (`Sender::last`, marked
    /// by `Sender::held`).
    peeked: bool,
}

impl<T, I: Iterator<Item = T>> Unpin for SendMany<'_, T, I> {}

impl<T, I: Iterator<Item = T>> Future for SendMany<'_, T, I> {
    type Output = Result<(), SendError<std::iter::Peekable<I>>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        // Before the send, as `SendFut` does: dropped while it yields, it sent nothing more
        // (an item an earlier poll peeked stays marked, for the drop).
        if this.items.is_some() && this.tx.run.yield_first(cx) {
            return Poll::Pending;
        }
        let mut announced = false;
        // Items sent by this poll: after a ring's worth (at most `SEND_MANY_BUDGET`) it yields
        // (waking itself at once), so an endless iterator to a receiver that keeps up cannot
        // hold its loop for good. Without the cap, a huge ring (zero-sized values, up to
        // `isize::MAX` slots) never filled, and one poll, one chunk even, never ended.
        let mut sent = 0;
        let budget = this.tx.ring.buffer().capacity().min(SEND_MANY_BUDGET);
        loop {
            let Some(items) = this.items.as_mut() else {
                // It gave its items back in an `Err`: reporting success now would be a lie.
                panic!("xtc: channel::shared::SendMany polled after it completed with an error");
            };
            // An item peeked in an earlier round is the first `try_send_many` sends, before it
            // asks the iterator for more (which may panic), unless the ring is still full; then
            // it is marked peeked again below, before any user code runs. A poll that unwinds
            // therefore never leaves `peeked` set for an item already sent (the drop would
            // pull a fresh one from an iterator that just panicked).
            this.peeked = false;
            // `sent < budget` here: it never asks for 0 (which would read as a full ring).
            let Ok(n) = this.tx.send_up_to(items, budget - sent) else {
                let mut rest = this.items.take().expect("present: borrowed just above");
                // Closed. Everything may have been sent already (the last items filled the
                // ring exactly, and the receiver went before the end was known).
                if rest.peek().is_none() {
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(SendError(rest)));
            };
            if n > 0 {
                announced = false;
                sent += n;
                // Counted in the end's run, as `send`'s items are: a loop of small batches
                // to a receiver that keeps up never reaches this poll's own budget below.
                this.tx.run.moved(n);
                if sent < budget {
                    continue;
                }
            }
            // Full, finished, or a ring's worth sent by this poll. An item a cancelled send
            // left comes first: while the `Sender` still holds one, nothing is peeked (it
            // could hold only one).
            if !this.tx.held && items.peek().is_none() {
                return Poll::Ready(Ok(()));
            }
            // An item sits peeked in `items` (unless the `Sender` holds one): from here on, a
            // drop (a cancel, or the unwind of a waker's panic) hands it to the `Sender`.
            this.peeked = !this.tx.held;
            if n > 0 {
                // A ring's worth sent by this poll, to a receiver that keeps up: the loop's
                // other tasks get their turn (an endless iterator held the loop for good), and
                // this future is polled again right after them.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // Full. Rule 3: announce, then recheck (the next round of the loop); a second
            // full ring after the announcement waits.
            if announced {
                // Waits: the run of items sent without waiting starts over.
                this.tx.run.waited();
                return Poll::Pending;
            }
            this.tx.chan.tx.wait(cx.waker());
            announced = true;
        }
    }
}

impl<T, I: Iterator<Item = T>> Drop for SendMany<'_, T, I> {
    fn drop(&mut self) {
        // Dropped while it waited: the item it peeked is neither sent nor back in the
        // caller's iterator; the `Sender` keeps it for its next send.
        if std::mem::take(&mut self.peeked) {
            if let Some(v) = self.items.as_mut().and_then(Iterator::next) {
                self.tx.hold(v);
            }
        }
    }
}

impl<T, I: Iterator<Item = T>> fmt::Debug for SendMany<'_, T, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendMany")
    }
}

impl<T> Receiver<T> {
    /// Receives the next value, waiting while the channel is empty; `None` once the sender is
    /// gone and everything it sent was received. Cost: a ring pop, as
    /// [`try_recv`](Self::try_recv); a wait adds a lock (two, and a waker clone, when
    /// the waker changed), a check of whether the waker is the task's own, and a swap (rule
    /// 1); with a waker that is not the task's own (a foreign executor's, or a combinator's
    /// that gives each future its own: `FuturesUnordered`, `join_all` of more than 30,
    /// `buffer_unordered`), the wait also runs this turn's deferred flushes at once (the
    /// rings' pings to other loops, a nudge of an idle peer), so that a side this wait depends
    /// on is not left unwoken. After 1,024 items in a row received without waiting (here and by
    /// [`recv_many`](Self::recv_many)), the next call yields first, for one loop turn, so a
    /// sender that keeps the ring from emptying cannot let this task hold its loop.
    pub fn recv(&mut self) -> RecvFut<'_, T> {
        RecvFut { rx: self }
    }

    /// Receives without waiting: `Empty` while nothing is queued, `Closed` once the sender is
    /// gone and everything it sent was received. Cost: a ring pop and a check of this turn's
    /// signal registration (rule 3); on an empty ring, a load of the sender's closed flag.
    #[inline]
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        match self.ring.pop() {
            Ok(v) => {
                self.popped(1);
                Ok(v)
            }
            Err(_) => {
                if self.chan.tx.is_closed() {
                    // Everything pushed before the close is visible now, and so is the item
                    // the `Sender` left for after them.
                    match self.ring.pop() {
                        Ok(v) => Ok(v),
                        Err(_) => self.take_last().ok_or(TryRecvError::Closed),
                    }
                } else {
                    Err(TryRecvError::Empty)
                }
            }
        }
    }

    /// The item a cancelled `send_many` of a dropped `Sender` left (held back, after the
    /// ring's items), once the sender is gone and the ring drained.
    #[cold]
    fn take_last(&mut self) -> Option<T> {
        let last = lock(&self.last).take();
        last.map(|v| *v)
    }

    /// Rule 3's bookkeeping after `n` pops.
    #[inline]
    fn popped(&mut self, n: usize) {
        self.signaller.moved(n);
    }

    /// Moves up to `limit` queued messages, oldest first, to the end of `buf` without waiting
    /// and returns how many. `Err(Empty)` when nothing is queued (or `limit` is 0: `Ok(0)`),
    /// `Err(Closed)` when nothing is queued and the sender is gone.
    ///
    /// Cost: one chunk read and one publish of the ring's head for the whole batch, and the
    /// per-turn signal bookkeeping once, where [`try_recv`](Self::try_recv) pays each per
    /// message; plus `buf`'s growth, if it has no room.
    pub fn try_recv_many(&mut self, buf: &mut Vec<T>, limit: usize) -> Result<usize, TryRecvError> {
        if limit == 0 {
            return Ok(0);
        }
        let mut queued = self.ring.slots();
        if queued == 0 {
            if !self.chan.tx.is_closed() {
                return Err(TryRecvError::Empty);
            }
            // Everything pushed before the close is visible now, and so is the item the
            // `Sender` left for after them.
            queued = self.ring.slots();
            if queued == 0 {
                return match self.take_last() {
                    Some(v) => {
                        buf.push(v);
                        Ok(1)
                    }
                    None => Err(TryRecvError::Closed),
                };
            }
        }
        let n = queued.min(limit);
        let chunk = self
            .ring
            .read_chunk(n)
            .expect("the consumer alone drains the ring, so its queued slots stay queued");
        // The iterator pops as it goes and publishes the new head when dropped.
        buf.extend(chunk);
        self.popped(n);
        Ok(n)
    }

    /// Receives up to `limit` messages into `buf` (appended, oldest first), waiting until at
    /// least one is queued, as tokio's `mpsc::Receiver::recv_many` does. Resolves to how many;
    /// 0 only when `limit` is 0 or the channel is closed and drained.
    ///
    /// Cost per batch: as [`try_recv_many`](Self::try_recv_many). Once 1,024 items were
    /// received in a row without waiting, the next call yields first, for one loop turn (as
    /// [`recv`](Self::recv)).
    pub fn recv_many<'a>(&'a mut self, buf: &'a mut Vec<T>, limit: usize) -> RecvMany<'a, T> {
        RecvMany {
            rx: self,
            buf,
            limit,
        }
    }
}

/// Future of [`Receiver::recv`].
#[must_use = "futures do nothing unless awaited"]
pub struct RecvFut<'a, T> {
    rx: &'a mut Receiver<T>,
}

impl<T> Future for RecvFut<'_, T> {
    type Output = Option<T>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let rx = &mut *self.rx;
        if rx.run.yield_first(cx) {
            return Poll::Pending;
        }
        match rx.try_recv() {
            Ok(v) => {
                rx.run.moved(1);
                return Poll::Ready(Some(v));
            }
            Err(TryRecvError::Closed) => return Poll::Ready(None),
            Err(TryRecvError::Empty) => {}
        }
        // Rule 1: announce, then recheck.
        rx.chan.rx.wait(cx.waker());
        match rx.try_recv() {
            Ok(v) => {
                // Taken on the recheck, without waiting: it counts towards the run.
                rx.run.moved(1);
                Poll::Ready(Some(v))
            }
            Err(TryRecvError::Closed) => Poll::Ready(None),
            Err(TryRecvError::Empty) => {
                rx.run.waited();
                Poll::Pending
            }
        }
    }
}

/// Future of [`Receiver::recv_many`].
#[must_use = "futures do nothing unless awaited"]
pub struct RecvMany<'a, T> {
    rx: &'a mut Receiver<T>,
    buf: &'a mut Vec<T>,
    limit: usize,
}

impl<T> Future for RecvMany<'_, T> {
    type Output = usize;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
        let this = &mut *self;
        if this.rx.run.yield_first(cx) {
            return Poll::Pending;
        }
        match this.rx.try_recv_many(this.buf, this.limit) {
            Ok(n) => {
                this.rx.run.moved(n);
                return Poll::Ready(n);
            }
            Err(TryRecvError::Closed) => return Poll::Ready(0),
            Err(TryRecvError::Empty) => {}
        }
        // Rule 1: announce, then recheck.
        this.rx.chan.rx.wait(cx.waker());
        match this.rx.try_recv_many(this.buf, this.limit) {
            Ok(n) => {
                // Taken on the recheck, without waiting: they count towards the run.
                this.rx.run.moved(n);
                Poll::Ready(n)
            }
            Err(TryRecvError::Closed) => Poll::Ready(0),
            Err(TryRecvError::Empty) => {
                this.rx.run.waited();
                Poll::Pending
            }
        }
    }
}

impl<T> fmt::Debug for RecvMany<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RecvMany")
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        // An item a cancelled `send_many` left stays in `last`, stored before the close, which
        // the receiver reads before it looks there: it takes it after what the ring holds.
        self.chan.tx.close();
        self.chan.rx.wake_now();
        // The waker a `send` that waited left: guarded, as a drop of user code in a `Drop`.
        crate::task::drop_wakers_guarded(self.chan.tx.forget());
    }
}

impl<T> Drop for Receiver<T> {
    /// Closes the channel and drops what is queued, as `channel::local` and tokio do: left in
    /// the ring, the values lived as long as the `Sender` (rtrb frees its slots with its last
    /// end), and a value holding the sender of a reply channel kept that channel open for
    /// good, so whoever awaited the reply never saw it close. A send racing the close may
    /// still land after the drain; its value goes with the `Sender`. The item a cancelled
    /// `send_many` left (the one item the sender holds back) is dropped last, whether or not the `Sender` is still
    /// alive. A value whose `Drop`
    /// panics does not stop the drain: every value is dropped, then the first panic goes on.
    /// Cost: an atomic store and a wake of a waiting sender, then the drops of the values
    /// still in the ring (one pop each).
    fn drop(&mut self) {
        self.chan.rx.close();
        // Wake first: a value whose `Drop` panics must not leave a waiting sender asleep.
        self.chan.tx.wake_now();
        // The waker a `recv` that waited left, before the values (whose `Drop` may panic).
        // Guarded: a panic in that drop must not keep the values below queued.
        crate::task::drop_wakers_guarded(self.chan.rx.forget());
        // Each value dropped even if one's `Drop` panics: a panic that stopped the drain left
        // the values behind it alive as long as the `Sender` (a reply sender among them kept
        // its channel open), and a second such value then panicked in the `Sender`'s drop.
        // rtrb's `commit` drops the slot in place and marks it read even if that panics.
        let ring = &mut self.ring;
        let last = &self.last;
        super::drop_queued(|| match ring.read_chunk(1) {
            Ok(one) => {
                one.commit_all();
                true
            }
            Err(_) => {
                // Taken out of the lock first: its `Drop` is user code (it may hold a
                // `Sender` of this channel, whose drop takes the lock).
                let v = lock(last).take();
                v.is_some()
            }
        });
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("shared::Sender")
            .field("free", &self.ring.slots())
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("shared::Receiver")
            .field("queued", &self.ring.slots())
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for SendFut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendFut")
    }
}

impl<T> fmt::Debug for RecvFut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RecvFut")
    }
}
