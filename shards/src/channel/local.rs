//! A bounded multi-producer, single-consumer channel inside one shard: `!Send`, no atomics, no
//! locks (an `Rc<RefCell<..>>`). Cost: a `VecDeque` push or pop per message; a waiting side
//! stores one waker.
//!
//! # Waiting senders
//!
//! A sender that finds the channel full takes a place in a FIFO of waiters (once per
//! `send`, however often it is polled; later polls only refresh its waker). Each message the
//! receiver takes notifies the oldest waiter that is not notified yet. A notified waiter that
//! completes used the slot it was woken for; one whose `send` is dropped first (a timeout, a
//! `select!`) passes its notification on to the next waiter, so a freed slot is never lost on a
//! sender that went away. A new `send` goes behind the line: it takes a free slot at once
//! only while no sender waits, woken or not; a woken sender that sends while more slots are
//! free notifies the next waiter too. A notified sender that finds the slot taken by a
//! `try_send` goes back into the line at the place its first wait gave it (ahead of every
//! sender that began waiting after it), so waiting senders keep their order however many
//! of them lose their slots to `try_send`s at once.

use std::{
    cell::RefCell,
    collections::VecDeque,
    fmt,
    future::{poll_fn, Future},
    pin::Pin,
    rc::Rc,
    task::{Context, Poll, Waker},
};

use slab::Slab;

use super::{check_capacity, SendError, TryRecvError, TrySendError};

struct Waiter {
    waker: Waker,
    /// Woken for a freed slot it has not used yet.
    notified: bool,
    /// When it began waiting (`State::tickets`): its place in line, kept when it goes back
    /// into the line after losing its slot.
    ticket: u64,
}

struct State<T> {
    queue: VecDeque<T>,
    capacity: usize,
    rx_waker: Option<Waker>,
    /// Waiting senders, by key.
    waiters: Slab<Waiter>,
    /// Waiters not yet notified, by key and ticket, oldest first: in the order of their
    /// tickets. An entry whose waiter left (its key free, or reused by a later waiter with
    /// another ticket) stays until it reaches the front or a compaction drops it: removed at
    /// once, N waiters that all gave up (a timeout each) cost O(N²).
    line: VecDeque<(usize, u64)>,
    /// How many entries of `line` are stale (their waiter left).
    stale: usize,
    /// Tickets handed out so far, one per sender that began waiting.
    tickets: u64,
    senders: usize,
    rx_alive: bool,
}

impl<T> State<T> {
    /// A slot was freed: notifies the oldest waiting sender that is not notified yet. Returns
    /// its waker, to be woken once the state's borrow ends: taken, not cloned (a clone is
    /// user code, for a custom waker), and the sender stores a fresh one when it polls again.
    fn notify_one(&mut self) -> Option<Waker> {
        while let Some((key, ticket)) = self.line.pop_front() {
            match self.waiters.get_mut(key) {
                Some(w) if w.ticket == ticket => {
                    w.notified = true;
                    return Some(std::mem::replace(&mut w.waker, Waker::noop().clone()));
                }
                _ => self.stale -= 1,
            }
        }
        None
    }

    /// The waiters woken for a freed slot and not run yet: every waiter not in line.
    fn woken(&self) -> usize {
        self.waiters.len() - (self.line.len() - self.stale)
    }

    /// An un-notified waiter left: its entry in line goes stale. Once most of the line is
    /// stale it is compacted, so the line stays within twice the waiters in it and each
    /// departure costs O(1) amortized.
    fn forget_in_line(&mut self) {
        self.stale += 1;
        if self.stale > 32 && self.stale * 2 > self.line.len() {
            let waiters = &self.waiters;
            self.line
                .retain(|&(k, t)| waiters.get(k).is_some_and(|w| w.ticket == t));
            self.stale = 0;
        }
    }

    /// Whether a `send` may take a free slot now: waiter `key` only once woken for one (a
    /// freed slot is its own until it runs); a send not waiting yet (`None`) only while no
    /// sender waits, woken or not. Without this, a send that polled before a woken waiter ran
    /// (its wake queues it behind the tasks already queued) went first: it overtook the line,
    /// and a waiter could be passed over for as long as new sends kept coming.
    fn may_take(&self, key: Option<usize>) -> bool {
        match key.and_then(|k| self.waiters.get(k)) {
            Some(w) => w.notified,
            None => self.waiters.is_empty(),
        }
    }

    /// Waiter `key` leaves. With `pass_on`, a notification it did not use goes to the next
    /// waiter, whose waker is returned first, to be woken after the borrow; without, it was
    /// used (the value was sent) or is moot (closed), and the next waiter is notified only if
    /// a slot is still free beyond those the other woken waiters count on (new sends wait
    /// behind the line, [`may_take`](Self::may_take), so a slot freed while nobody waited in
    /// line is handed on here). The leaving waiter's own waker comes back second, to be
    /// dropped after the borrow too: its drop is user code (a custom waker owning a `Sender`
    /// whose drop borrows this state).
    fn leave(&mut self, key: usize, pass_on: bool) -> (Option<Waker>, Option<Waker>) {
        let Some(w) = self.waiters.try_remove(key) else {
            return (None, None);
        };
        let next = if !w.notified {
            self.forget_in_line();
            None
        } else if (pass_on || self.queue.len() + self.woken() < self.capacity) && self.rx_alive {
            self.notify_one()
        } else {
            None
        };
        (next, Some(w.waker))
    }
}

/// Creates a channel holding up to `capacity` values. `Err` for a capacity of 0, and for one
/// whose slots' bytes exceed `isize::MAX`. Cost: one allocation for the shared state and one
/// for the queue, up to 1,024 slots or 64 KiB up front (none up front for zero-sized values or
/// values over 64 KiB) (the queue grows as it fills, up to
/// `capacity`).
pub fn bounded<T>(capacity: usize) -> crate::Result<(Sender<T>, Receiver<T>)> {
    // Checked before anything is allocated: a capacity too large for memory is an `Err`, not
    // a capacity-overflow panic in the allocation below.
    let capacity = check_capacity::<T>(capacity)?;
    // Up to 1,024 slots and 64 KiB up front (a large `T` gets its slots as they fill).
    let slot = std::mem::size_of::<T>().max(1);
    let st = Rc::new(RefCell::new(State {
        queue: VecDeque::with_capacity(capacity.min(1024).min((64 << 10) / slot)),
        capacity,
        rx_waker: None,
        waiters: Slab::new(),
        line: VecDeque::new(),
        stale: 0,
        tickets: 0,
        senders: 1,
        rx_alive: true,
    }));
    Ok((
        Sender { st: st.clone() },
        Receiver {
            st,
            run: super::Run::default(),
        },
    ))
}

/// The sending end; `Clone` for more producers. `!Send`.
pub struct Sender<T> {
    st: Rc<RefCell<State<T>>>,
}

/// The receiving end. `!Send`.
pub struct Receiver<T> {
    st: Rc<RefCell<State<T>>>,
    /// Values received in a row without waiting ([`Run`](super::Run), as the shared
    /// channel's ends count).
    run: super::Run,
}

impl<T> Sender<T> {
    /// Sends without waiting, ahead of any sender waiting in line: `Full` gives the value back
    /// while `capacity` values are queued, `Closed` once the receiver is gone. Cost: a
    /// `RefCell` borrow and a `VecDeque` push; a wake of the receiver if it waits.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        self.push(value, None)
    }

    /// [`try_send`](Self::try_send) for a `send` (waiter `key`, or a new one: `Some(None)`),
    /// which keeps its place in line: `Full` unless [`State::may_take`] lets it take a slot.
    /// `None`: a plain `try_send`, ahead of the line.
    fn push(&self, value: T, send: Option<Option<usize>>) -> Result<(), TrySendError<T>> {
        let mut st = self.st.borrow_mut();
        if !st.rx_alive {
            return Err(TrySendError::Closed(value));
        }
        if st.queue.len() >= st.capacity || send.is_some_and(|key| !st.may_take(key)) {
            return Err(TrySendError::Full(value));
        }
        st.queue.push_back(value);
        let w = st.rx_waker.take();
        drop(st);
        if let Some(w) = w {
            // The receiver's waker, guarded: the value is sent, and a panic in someone else's
            // waker (a custom one) must not reach this sender as if its send had failed.
            crate::task::wake_guarded(w);
        }
        Ok(())
    }

    /// Sends, waiting while the channel is full (in line with the other waiting senders, see
    /// the module doc); `Err` gives the value back if the receiver is gone. Dropping the future
    /// gives up its place, and a slot it was woken for goes to the next waiter; it drops
    /// `value` too (not cancel-safe, as tokio's `send`: [`try_send`](Self::try_send) keeps it).
    /// Cost: as `try_send`; a wait adds a waker clone and a place in line (a slab entry and a
    /// queue push, which allocate only as the line grows).
    pub fn send(&self, value: T) -> SendFut<'_, T> {
        SendFut {
            tx: self,
            value: Some(value),
            key: None,
        }
    }
}

/// Future of [`Sender::send`]. Like most futures it must not be polled after it completed
/// (that panics: its value is gone, sent or given back).
#[must_use = "futures do nothing unless awaited"]
pub struct SendFut<'a, T> {
    tx: &'a Sender<T>,
    value: Option<T>,
    /// Our place among the waiters, once the channel was found full.
    key: Option<usize>,
}

impl<T> Unpin for SendFut<'_, T> {}

impl<T> Future for SendFut<'_, T> {
    type Output = Result<(), SendError<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(v) = this.value.take() else {
            // Its value was sent, or given back in an `Err`: reporting `Ok` now could be a lie.
            panic!("xtc: channel::local::SendFut polled after it completed");
        };
        let done = match this.tx.push(v, Some(this.key)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Closed(v)) => Err(SendError(v)),
            Err(TrySendError::Full(v)) => match this.wait(v, cx) {
                Some(done) => done,
                None => return Poll::Pending,
            },
        };
        // Sent (a notification, if we had one, was used) or closed: leave the line.
        if let Some(key) = this.key.take() {
            // Two statements: in one, `drop(..borrow_mut().leave(..))`, the waker would be
            // dropped before the borrow's temporary.
            let (next, own) = this.tx.st.borrow_mut().leave(key, false);
            // Woken first, guarded, as in `drop`: a free slot goes on to the next waiter.
            if let Some(w) = next {
                crate::task::wake_guarded(w);
            }
            drop(own);
        }
        Poll::Ready(done)
    }
}

impl<T> SendFut<'_, T> {
    /// The channel was full: takes (or keeps) a place among the waiting senders with
    /// `cx`'s waker and holds `v`; `None` then. A waker's clone and drop are user code (a
    /// custom waker) that may use this channel, so neither runs under the state's borrow, and
    /// a send is tried again after the clone, which may have freed a slot or closed the
    /// channel: `Some` is then the outcome.
    fn wait(&mut self, v: T, cx: &Context<'_>) -> Option<Result<(), SendError<T>>> {
        let stored = {
            let st = self.tx.st.borrow();
            self.key
                .and_then(|k| st.waiters.get(k))
                .is_some_and(|w| w.waker.will_wake(cx.waker()))
        };
        let (v, fresh) = if stored {
            (v, None)
        } else {
            let fresh = cx.waker().clone();
            match self.tx.push(v, Some(self.key)) {
                Ok(()) => return Some(Ok(())),
                Err(TrySendError::Closed(v)) => return Some(Err(SendError(v))),
                Err(TrySendError::Full(v)) => (v, Some(fresh)),
            }
        };
        self.value = Some(v);
        let mut st = self.tx.st.borrow_mut();
        let mut old = None;
        match self.key.and_then(|k| st.waiters.get_mut(k).map(|w| (k, w))) {
            Some((key, w)) => {
                if let Some(fresh) = fresh {
                    old = Some(std::mem::replace(&mut w.waker, fresh));
                }
                if w.notified {
                    // Woken, but a `try_send` took the slot: back into line, at its place.
                    // Pushed to the front, two woken waiters that both lost their slots went
                    // back in the reverse of their order (the later poll ended up first).
                    // The line is sorted by ticket (stale entries included). Cost: a search
                    // of the line and an insert, only when a `try_send` took a woken
                    // waiter's slot.
                    w.notified = false;
                    let mine = w.ticket;
                    let at = st.line.partition_point(|&(_, t)| t < mine);
                    st.line.insert(at, (key, mine));
                }
            }
            None => {
                // No place yet, so `stored` was false and `fresh` holds the clone.
                let waker = fresh.unwrap_or_else(|| Waker::noop().clone());
                let ticket = st.tickets;
                st.tickets += 1;
                let key = st.waiters.insert(Waiter {
                    waker,
                    notified: false,
                    ticket,
                });
                st.line.push_back((key, ticket));
                self.key = Some(key);
            }
        }
        drop(st);
        drop(old);
        None
    }
}

impl<T> Drop for SendFut<'_, T> {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        let (next, own) = self.tx.st.borrow_mut().leave(key, true);
        // The next waiter is woken first, guarded: its waker is another sender's (user code,
        // if custom), and a panic there, or in our own waker's drop, must not keep the
        // notification, a freed slot, from it.
        if let Some(w) = next {
            crate::task::wake_guarded(w);
        }
        drop(own);
    }
}

impl<T> fmt::Debug for SendFut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("local::SendFut")
            .field("waiting", &self.key.is_some())
            .finish()
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.st.borrow_mut().senders += 1;
        Sender {
            st: self.st.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut st = self.st.borrow_mut();
        st.senders -= 1;
        let w = if st.senders == 0 {
            st.rx_waker.take()
        } else {
            None
        };
        drop(st);
        if let Some(w) = w {
            crate::task::wake_guarded(w);
        }
    }
}

impl<T> Receiver<T> {
    /// Receives without waiting: `Empty` while nothing is queued, `Closed` once every sender
    /// is gone and the channel is empty. Cost: a `RefCell` borrow and a `VecDeque` pop; a
    /// wake of the oldest waiting sender, if one waits.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut st = self.st.borrow_mut();
        match st.queue.pop_front() {
            Some(v) => {
                let w = st.notify_one();
                drop(st);
                if let Some(w) = w {
                    // Guarded: a waiting sender's waker is user code (a custom one), and a
                    // panic in it unwound out of here and dropped `v`, received and lost.
                    crate::task::wake_guarded(w);
                }
                Ok(v)
            }
            None if st.senders == 0 => Err(TryRecvError::Closed),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Receives the next value; `None` once every sender is gone and the channel is empty.
    /// Cost: as [`try_recv`](Self::try_recv); a wait adds a waker clone (none when the stored
    /// waker already wakes this task). After 1,024 values in a row received without waiting,
    /// the next call yields first, for one loop turn, as the shared channel's does: a task
    /// that feeds its own channel (an actor sending itself its next message) would otherwise
    /// never return `Pending` and hold its loop (no other task can refill the channel while
    /// it runs, so this is the one way a receiver keeps finding values).
    pub async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| {
            // Before the receive: dropped while it yields, it took nothing.
            if self.run.yield_first(cx) {
                return Poll::Pending;
            }
            self.poll_recv(cx)
        })
        .await
    }

    /// One poll of [`recv`](Self::recv), past its budget check.
    fn poll_recv(&mut self, cx: &Context<'_>) -> Poll<Option<T>> {
        match self.try_recv() {
            Ok(v) => {
                self.run.moved(1);
                Poll::Ready(Some(v))
            }
            Err(TryRecvError::Closed) => Poll::Ready(None),
            Err(TryRecvError::Empty) => {
                let stored = self
                    .st
                    .borrow()
                    .rx_waker
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()));
                if stored {
                    self.run.waited();
                    return Poll::Pending;
                }
                // Cloned and the old one dropped outside the borrow, as in `SendFut::wait`;
                // the clone may have sent or closed, so look again before waiting.
                let fresh = cx.waker().clone();
                match self.try_recv() {
                    Ok(v) => {
                        // Moved without waiting: it counts towards the budget's run.
                        self.run.moved(1);
                        return Poll::Ready(Some(v));
                    }
                    Err(TryRecvError::Closed) => return Poll::Ready(None),
                    Err(TryRecvError::Empty) => {}
                }
                let old = self.st.borrow_mut().rx_waker.replace(fresh);
                drop(old);
                self.run.waited();
                Poll::Pending
            }
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut st = self.st.borrow_mut();
        st.rx_alive = false;
        // Every waiting sender finds the channel closed when it runs.
        st.line.clear();
        st.stale = 0;
        let wakers: Vec<Waker> = st
            .waiters
            .iter_mut()
            .map(|(_, w)| {
                w.notified = true;
                // Taken, as in `notify_one` (a notified sender's is a no-op already).
                std::mem::replace(&mut w.waker, Waker::noop().clone())
            })
            .collect();
        let mut items = std::mem::take(&mut st.queue);
        // The waker a `recv` that waited left: kept, it lived as long as the senders.
        let own = st.rx_waker.take();
        drop(st);
        // Wake first: a queued value whose `Drop` panics must not leave the senders asleep
        // (they were marked notified and left the line above, so nothing else wakes them).
        // Each guarded, for the same reason: a waker that panics (a custom one) stopped the
        // wakes of the senders after it.
        wakers.into_iter().for_each(crate::task::wake_guarded);
        // Guarded, before the values: a panic in its drop must not keep them queued.
        crate::task::drop_wakers_guarded(own);
        // Each value dropped even if one's `Drop` panics, and the first panic goes on: the
        // queue's own drop aborted the process at a second panicking value. A one-value drain
        // drops it in place and leaves the queue without it even if its `Drop` panics.
        super::drop_queued(|| {
            let queued = !items.is_empty();
            if queued {
                drop(items.drain(..1));
            }
            queued
        });
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("local::Sender")
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("local::Receiver")
    }
}
