//! The byte-stream half shared by [`TcpStream`](super::TcpStream) and
//! [`UnixStream`](super::UnixStream): owned-buffer reads and writes, and the `futures::io`
//! traits through an internal buffer.
//!
//! `AsyncRead` on io_uring reads into an internal buffer of up to 256 KiB (the kernel needs
//! memory that outlives the poll), never more than the caller's slice asks for, and copies
//! out; on epoll it reads straight into the caller's slice (after any bytes the receives of an
//! io_uring loop of this thread took for the stream before that loop went). So no bytes wait
//! in the internal buffer after a read returns, except those of a read whose future was
//! dropped before its data arrived and whose next read asked for less.
//! An owned `read` whose future is dropped unfinished on io_uring leaves its receive running,
//! kept by the stream (`PollState::stray`), and its bytes go to the internal buffer for the
//! next read: dropping a read loses nothing on either driver (epoll reads in the poll). Its
//! buffer (a `FixedBuf` too) is held until then. A read dropped while another owned read of
//! the same stream is in flight (or behind another kept one) is not left running (the other
//! one, already in the kernel, would otherwise wait while the kept one took the bytes): it is
//! cancelled in place and kept all the same, so bytes that reached it before the cancel go
//! to the next read too; a read already waiting on a receive of its own is woken to take
//! them first (else they waited for yet another read). `into_std` cancels kept reads (and
//! the `AsyncRead` receive in flight) and waits for them to settle; if one took bytes, or
//! bytes wait in the internal buffer, or one got an error (a reset) no read has reported, it
//! refuses (`IntoStdError`, the stream given back) rather than lose them: the next read
//! returns them.
//! `AsyncWrite` on io_uring copies the caller's bytes into an internal buffer and reports them
//! written at once (write-behind, like a `BufWriter` of one write); the next write (of at
//! least one byte: an empty one returns at once, as on epoll), `flush` or `close` waits for
//! it and reports its error, and a `shutdown` of the write half that would overtake it is
//! refused with `WouldBlock`; once the write half is shut, a write fails with `EPIPE` at once,
//! as on epoll. On epoll it writes straight from the slice, after the bytes
//! such a send left unsent when its io_uring loop went (`PollState::unsent`). `into_std`
//! refuses (`IntoStdError`, the stream given back) while such a send is in flight, bytes it
//! left are unsent, or its error is unreported, and leaves the send running: `flush` first.
//! It does not wait for the send itself: that may wait for good on a peer that does not read,
//! and `into_std` is synchronous, on the loop.
//!
//! The two APIs can be mixed on one stream and keep the byte order: an owned `write` or
//! `write_all` of at least one byte first waits for the `AsyncWrite` bytes still being sent
//! (and reports their error), and an owned `read` first returns bytes an `AsyncRead` already
//! took from the kernel (a dropped read's, or waits for that read). Without this, io_uring
//! could put a `write_all` ahead of the rest of a short write-behind send at the peer.

use std::{
    cell::RefCell,
    future::{poll_fn, Future},
    io,
    net::Shutdown,
    os::fd::OwnedFd,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll, Wake, Waker},
};

use io_uring::{opcode, types};

use super::Unsettled;
use crate::io::{
    epoll::Dir,
    ops::{self, rw},
    source::{short, Source},
    uring::{self, nothing_moved, result, Op},
    BufResult, IoBuf, IoBufMut, Reactor,
};
use crate::sync::{lock, Mutex};

/// Most bytes one receive of the `AsyncRead` path takes on io_uring (never more than the
/// caller's slice holds). Each receive is a `Pending` and a loop turn, and futures'
/// `read_to_end` zero-fills its whole spare capacity again after every `Pending`: at 8 KiB a
/// receive, reading a 4 MiB body took 521 of them (epoll, which reads straight into the
/// caller's slice: 20), and the zero-filling grew with the square of the body.
const READ_MAX: usize = 256 * 1024;
/// Capacity of the internal read buffer kept between receives: a larger one, left by a large
/// read, is given back at the next receive that needs less, so a stream that once read a big
/// body does not hold `READ_MAX` for its life.
const READ_KEEP: usize = 16 * 1024;
/// Most bytes one `poll_write` takes on io_uring (bounds the internal copy).
const WRITE_BUF: usize = 64 * 1024;
/// Capacity of the internal write buffer kept once its bytes are flushed: a larger one, left
/// by a large write, is given back at the `flush` or `close` that waited
/// for it, so an idle stream that once wrote a big body does not hold `WRITE_BUF` for its life.
const WRITE_KEEP: usize = 16 * 1024;

/// The `futures::io` side's state on io_uring.
///
/// Dropped with its stream, a send in flight is detached, not cancelled: `poll_write`
/// reported its bytes written, as a kernel socket buffer would have taken them (tokio, and
/// this stream on epoll), so code that drops a stream without `flush`/`close` still delivers
/// them, on Linux 5.19 and later (and 5.10 and 5.15 stable kernels with the backport): the send asks the kernel to finish a short send itself
/// (`MSG_WAITALL`), which older kernels ignore on a send, and a detached send completed short
/// loses the rest (logged as a warning: flush before dropping there). The send holds its own reference to the socket, which closes after it; a peer that
/// does not take them within `uring::DETACH_LIMIT_SECS` (10 s) gets them cancelled, and the
/// socket closes then (a slower reader sees the stream end early: flush before dropping where
/// every byte must arrive whatever the peer's pace). `into_std` refuses while such a send (or
/// an unsent rest, or a failed send's unreported error) is left, and leaves it running, for a
/// `flush` to wait for: the descriptor lives on, and neither cancelling the send (the bytes
/// were reported written) nor letting it finish behind the new owner's back (after its bytes)
/// would do.
#[derive(Debug, Default)]
struct PollState {
    /// The stream's descriptor (owned by its `Source`, which outlives this state: it is
    /// dropped after it), for a send restarted at drop; `None` only in a state not yet given
    /// one (a default-built state never restarts a send on descriptor 0).
    fd: Option<i32>,
    reading: Option<Op<Vec<u8>>>,
    /// Owned `read`s whose futures were dropped before they took their result (a `select!`
    /// whose other branch won), in the order the socket gave them their bytes (`order_stray`;
    /// one that finished before its drop is kept as what it brought, [`Received`]): each
    /// receive is kept here instead of dropped, and what it read goes to `rbuf`, where the
    /// next read (owned or `AsyncRead`) finds it first. Dropping it instead lost those bytes from the middle of the stream (the epoll
    /// driver, which reads in the poll, never had them taken). Kept only on io_uring. Left
    /// running only when it is the only one and no other owned receive is in flight on the
    /// stream: the kernel may hand the next bytes to a kept one while that other read, already
    /// in the kernel, waits for more (a request/response exchange would hang), so then it is
    /// cancelled in place (`Op::cancel_in_place`) and kept all the same: it resolves to the
    /// cancellation, which the next read skips, or to the bytes that reached it before the
    /// kernel handled the cancel (dropped, its completion was discarded, and they were lost).
    /// Either way the owned reads waiting on receives of their own are woken to take it over
    /// (`StreamIo::own_waiting`).
    stray: std::collections::VecDeque<Box<dyn StrayRead>>,
    /// An error (`-errno`) taken out of a kept receive without a read to report it (an
    /// `into_std` settling the receives, `settle_step`), for the next read to report once the
    /// unread bytes before it are taken. A receive that had finished when its read was
    /// dropped is kept in `stray` instead (`Received`), its error in its place in the order.
    read_error: Option<i32>,
    /// Where the newest completion whose bytes a kept read put in `rbuf` stands in its
    /// driver's order of completions (`Op::completed_at`), while those bytes are unread:
    /// an owned read whose own receive completed after it puts its bytes behind them
    /// ([`StreamIo::queue_behind_kept`]). `None` when unknown.
    kept_at: Option<(u64, u64)>,
    rbuf: Vec<u8>,
    rpos: usize,
    writing: Option<Op<Vec<u8>>>,
    wsent: usize,
    /// Bytes a write-behind send reported written but left unsent from `wsent` on, when the
    /// stream serves an epoll loop after its io_uring loop went (its shutdown cut the send, a
    /// `LocalExecutor` made after `XTC_IO` changed), or when the rest of a cut or short send
    /// could not be submitted again (`drain`): sent on epoll by plain sends first
    /// ([`StreamIo::poll_unsent`]; a read starts them without waiting,
    /// [`StreamIo::push_unsent`]), or on io_uring as a write-behind send again (`drain`, and
    /// a read's `resume_write_behind`).
    unsent: Option<Vec<u8>>,
    wbuf: Vec<u8>,
    /// The tasks waiting for `reading` (created at the first wait).
    read_waiters: Option<Waiters>,
    /// The tasks waiting for `writing` (created at the first wait).
    write_waiters: Option<Waiters>,
}

/// What a poll of the stream's shared operations leaves for its caller to do once the
/// stream's state is no longer borrowed ([`After::finish`]), because both run user code,
/// which may use the stream again (read it, shut it down) and would find its `RefCell`
/// borrowed (a panic) if run under it: drop a user buffer the call is done with (its `Drop`),
/// and list the task's waker with the operation's waiters (a waker's clone, for a custom
/// waker).
#[derive(Default)]
struct After {
    /// The buffers of kept receives that resolved in this poll.
    spent: Vec<Box<dyn std::any::Any>>,
    listing: Option<Listing>,
    /// The owned waiter entry ([`Owned::id`]) the task was found listed under.
    entry: Option<u64>,
}

impl After {
    /// Runs `poll`, which uses the stream's state and leaves in its `After` what must wait
    /// for the end of that use, then finishes that: every poll of a shared operation goes
    /// through here. Returns the poll's result and the owned waiter entry it left the task
    /// under (see [`finish`](Self::finish)).
    fn around<R>(
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut Context<'_>, &mut After) -> R,
    ) -> (R, Option<u64>) {
        let mut after = After::default();
        let r = poll(cx, &mut after);
        let entry = after.finish(cx);
        (r, entry)
    }

    /// Runs what the poll left; call it only outside every borrow of the stream's state.
    /// Returns the owned waiter entry the task is listed under, if it waits in an owned call
    /// and was not woken instead ([`BehindWait::note`] counts on it).
    fn finish(self, cx: &Context<'_>) -> Option<u64> {
        for buf in self.spent {
            // A user buffer's `Drop` is user code, here possibly in another task's poll.
            crate::task::guarded("an I/O buffer panicked while being dropped", || drop(buf));
        }
        match self.listing {
            Some(listing) => listing.finish(cx),
            None => self.entry,
        }
    }
}

/// A task to add to a [`WaiterList`] after the borrow ([`After`]): the list, whether it is the
/// `futures::io` side's waiter, and the list's wake count before the operation was polled.
struct Listing {
    list: Arc<WaiterList>,
    trait_side: bool,
    epoch: u64,
}

impl Listing {
    /// Lists `cx`'s waker, cloned with no lock or borrow held, and returns the owned entry it
    /// is listed under. The clone may have completed the operation (user code that reaps the
    /// driver), whose wake then found the task not listed yet: a changed wake count says so,
    /// and the task is woken to poll again rather than listed.
    fn finish(self, cx: &Context<'_>) -> Option<u64> {
        let fresh = cx.waker().clone();
        let mut listed = lock(&self.list.0);
        if listed.wakes != self.epoch {
            drop(listed);
            drop(fresh);
            cx.waker().wake_by_ref();
            return None;
        }
        let (replaced, entry) = if self.trait_side {
            // The `futures::io` side has `&mut self`: one waiter at a time, whose latest waker
            // replaces the last (a combinator may hand a new one to every poll).
            (listed.trait_side.replace(fresh), None)
        } else if let Some(o) = listed.owned.iter().find(|o| o.waker.will_wake(&fresh)) {
            // Listed meanwhile (the clone polled another call of this task).
            (Some(fresh), Some(o.id))
        } else {
            let id = listed.next_id;
            listed.next_id += 1;
            listed.owned.push(Owned {
                id,
                waker: fresh,
                waits: 0,
            });
            (None, Some(id))
        };
        drop(listed);
        // After the lock: a waker's drop is user code too.
        drop(replaced);
        entry
    }
}

/// An owned receive left running by a dropped `read` (see `PollState::stray`), whatever its
/// buffer type.
trait StrayRead {
    /// Polls it; when it is done, appends what it read to `out`, puts its buffer in `after`
    /// (for the caller to drop after its borrow of the stream's state ends) and gives the
    /// kernel's result.
    fn poll_into(
        &mut self,
        waiters: &mut Option<Waiters>,
        cx: &mut Context<'_>,
        trait_side: bool,
        out: &mut Vec<u8>,
        after: &mut After,
    ) -> Poll<i32>;
    /// Nobody waits for it any more ([`Op::unwait`]).
    fn unwait(&self);
    /// Cancels it if still in the kernel, keeping its result ([`Op::cancel_in_place`]).
    fn cancel_in_place(&self);
    /// Its result, once its completion has been reaped ([`Op::completed`]).
    fn completed(&self) -> Option<i32>;
    /// Where its reaped completion stands in its driver's order ([`Op::completed_at`]).
    fn completed_at(&self) -> Option<(u64, u64)>;
    /// Whether it is still in the kernel of a driver this loop cannot wait on
    /// ([`uring::driver_elsewhere`]).
    fn waits_elsewhere(&self) -> bool;
}

impl<B: IoBufMut> StrayRead for Op<B> {
    fn poll_into(
        &mut self,
        waiters: &mut Option<Waiters>,
        cx: &mut Context<'_>,
        trait_side: bool,
        out: &mut Vec<u8>,
        after: &mut After,
    ) -> Poll<i32> {
        let (res, mut buf) = ready!(poll_shared(self, waiters, cx, trait_side, after));
        if res > 0 {
            let n = (res as usize).min(buf.bytes_total());
            // SAFETY: the kernel wrote the first `n <= bytes_total()` bytes at the buffer's
            // stable mutable pointer, where the receive was submitted (`rw::submit_recv`, from
            // the buffer's start; `stable_ptr` may be another view), and its completion was
            // reaped before this result came back.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(buf.stable_mut_ptr(), n) });
        }
        // Not dropped here: the caller holds the stream's state borrowed (`poll_read_behind`
        // mutably), and the buffer's `Drop` (user code) may read that stream.
        after.spent.push(Box::new(buf));
        Poll::Ready(res)
    }

    fn unwait(&self) {
        Op::unwait(self);
    }

    fn cancel_in_place(&self) {
        Op::cancel_in_place(self);
    }

    fn completed(&self) -> Option<i32> {
        Op::completed(self)
    }

    fn completed_at(&self) -> Option<(u64, u64)> {
        Op::completed_at(self)
    }

    fn waits_elsewhere(&self) -> bool {
        uring::driver_elsewhere(self.driver_id()) && Op::completed(self).is_none()
    }
}

impl std::fmt::Debug for dyn StrayRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StrayRead")
    }
}

/// An owned `read`'s receive while its future waits for it; dropped unfinished, it gives the
/// receive to its stream (`PollState::stray`).
///
/// While it waits it is listed in the stream's `own_waiting`: a read dropped beside it keeps
/// its receive (or the bytes that receive took) for the stream and wakes it, and, woken, it
/// gives way to them (see [`StreamIo::own_waiting`]).
struct OwnedRecv<'a, B: IoBufMut> {
    io: &'a StreamIo,
    op: Option<Op<B>>,
    /// Its entry in the stream's `own_waiting`, while it waits.
    waiter: Option<u64>,
    /// Whether it gave way to what a dropped read kept: cancelled in place, it resolves to
    /// the cancellation (the read then takes the kept bytes first) or to bytes that won the
    /// race.
    gave_way: bool,
}

impl<'a, B: IoBufMut> OwnedRecv<'a, B> {
    /// Counts `op` among the stream's owned receives in flight until it is taken or dropped.
    fn new(io: &'a StreamIo, op: Op<B>) -> Self {
        io.owned_reads.set(io.owned_reads.get() + 1);
        OwnedRecv {
            io,
            op: Some(op),
            waiter: None,
            gave_way: false,
        }
    }

    /// Takes its entry off the stream's `own_waiting`, if it has one.
    fn leave(&mut self) {
        if let Some(id) = self.waiter.take() {
            self.io.own_waiting.leave(id);
        }
    }
}

impl<B: IoBufMut> Future for OwnedRecv<'_, B> {
    /// The result, the buffer, and where the completion stood in its driver's order
    /// ([`Op::completed_at`]).
    type Output = (i32, B, Option<(u64, u64)>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let op = this.op.as_mut().expect("polled after it completed");
        // Before the poll takes the result (and with it the slot).
        let at = op.completed_at();
        let Poll::Ready((res, buf)) = Pin::new(&mut *op).poll(cx) else {
            if !this.gave_way {
                // Listed first, then checked: a read kept by the clone's user code wakes the
                // entry or is seen here.
                this.waiter = Some(this.io.own_waiting.wait(this.waiter, cx.waker()));
                if this.io.kept_reads() {
                    this.gave_way = true;
                    op.cancel_in_place();
                    // Its own completion wakes it from now on.
                    this.leave();
                }
            }
            return Poll::Pending;
        };
        this.leave();
        this.op = None;
        this.io.owned_reads.set(this.io.owned_reads.get() - 1);
        Poll::Ready((res, buf, at))
    }
}

impl<B: IoBufMut> Drop for OwnedRecv<'_, B> {
    fn drop(&mut self) {
        self.leave();
        let Some(op) = self.op.take() else { return };
        // Outside the `RefCell`, so the count stays right whatever happens below.
        let others = self.io.owned_reads.get() - 1;
        self.io.owned_reads.set(others);
        let running = {
            let Ok(st) = self.io.poll.try_borrow() else {
                // Borrowed: this drop runs inside a stream call (a buffer's `Drop` under
                // `poll_reading`); the receive is cancelled (the `Op`'s own drop).
                return;
            };
            st.stray.is_empty() && others == 0
        };
        if !running {
            // Not left running: another owned read is in flight (running, this one could take
            // the bytes that one waits for), or other kept reads are pending (two reads of one
            // stream shared through an `Rc`, both dropped). If it has finished, what it
            // brought is kept (`take_finished`). Completions the loop has not reaped yet
            // count too.
            crate::io::reap_now();
            if op.completed().is_some() {
                self.take_finished(op);
                // The reads still waiting on receives of their own take its bytes over (see
                // `StreamIo::own_waiting`).
                self.io.own_waiting.wake_all();
                return;
            }
            // Still in the kernel: cancelled in place and kept all the same. Bytes that reach
            // the socket before the kernel handles the cancel still go to this receive (the
            // cancel loses that race), and a plain drop discarded its completion with them,
            // from the middle of the stream. The next read takes them (two concurrent reads'
            // bytes come in an arbitrary order anyway), or skips the cancellation. Outside the
            // borrow: the submission may reap, which runs user code.
            op.cancel_in_place();
        }
        // Nobody waits for it until the next read: it must not keep the loop from quiescence,
        // nor wake the task that dropped it. The waker it forgets is dropped only once the
        // receive is kept: its drop is user code, which may read this stream (and then waits
        // behind the kept receive). Dropped before, that code could start and keep a read of
        // its own, which then came before this one.
        let waker = op.unwait_later();
        if let Ok(mut st) = self.io.poll.try_borrow_mut() {
            st.stray.push_back(Box::new(op));
        }
        drop(waker);
        // The reads still waiting on receives of their own take it over (see
        // `StreamIo::own_waiting`).
        self.io.own_waiting.wake_all();
    }
}

impl<B: IoBufMut> OwnedRecv<'_, B> {
    /// A dropped receive whose completion was reaped: what it brought (its bytes, or its
    /// result) is kept in `stray` ([`Received`]), handed out in the order the socket gave the
    /// kept receives their bytes (`order_stray`), and its buffer is dropped now. Put in
    /// `rbuf` at once, its bytes went ahead of those of a kept receive that took earlier
    /// bytes (dropped after it, or kept behind one still in the kernel).
    fn take_finished(&self, mut op: Op<B>) {
        // Taking a completed result runs no user code; the buffer's `Drop` (user code, which
        // may use this stream) runs after the poll state is whole again.
        let mut noop = Context::from_waker(Waker::noop());
        let at = op.completed_at();
        let Poll::Ready((res, mut buf)) = Pin::new(&mut op).poll(&mut noop) else {
            return;
        };
        if let Ok(mut st) = self.io.poll.try_borrow_mut() {
            let mut bytes = Vec::new();
            if res > 0 {
                let n = (res as usize).min(buf.bytes_total());
                // SAFETY: as in `StrayRead::poll_into`: the kernel wrote these `n` bytes at the
                // stable mutable pointer, and the completion was reaped.
                let got = unsafe { std::slice::from_raw_parts(buf.stable_mut_ptr(), n) };
                bytes.extend_from_slice(got);
            }
            st.stray.push_back(Box::new(Received { res, bytes, at }));
        }
        crate::task::guarded("an I/O buffer panicked while being dropped", || drop(buf));
    }
}

/// A kept receive whose completion was reaped when its `read` was dropped: its result, the
/// bytes it brought, and where its completion stands in its driver's order.
struct Received {
    res: i32,
    bytes: Vec<u8>,
    at: Option<(u64, u64)>,
}

impl StrayRead for Received {
    fn poll_into(
        &mut self,
        _waiters: &mut Option<Waiters>,
        _cx: &mut Context<'_>,
        _trait_side: bool,
        out: &mut Vec<u8>,
        _after: &mut After,
    ) -> Poll<i32> {
        out.append(&mut self.bytes);
        Poll::Ready(self.res)
    }

    fn unwait(&self) {}

    fn cancel_in_place(&self) {}

    fn completed(&self) -> Option<i32> {
        Some(self.res)
    }

    fn completed_at(&self) -> Option<(u64, u64)> {
        self.at
    }

    fn waits_elsewhere(&self) -> bool {
        false
    }
}

/// The wait of an owned call for the stream's shared operation ahead of it: a `read` for the
/// bytes read behind it (a kept receive's, or an `AsyncRead`'s read in flight), a `write` for
/// the write-behind send. While it waits it counts on its task's entry in that side's waiter
/// list ([`Owned`]); when it stops (dropped, or done), it gives the count back, and when that
/// leaves the list empty the operation goes back to nobody-waits ([`Op::unwait`]), so that it
/// does not count as I/O in flight for a waiter that is gone.
///
/// Counted, because the futures of one task share one waker and so one entry: a wait that
/// left its entry when polled with a new waker (moved to another task, or a combinator's
/// waker) took it away from a sibling still waiting under the old one, which the operation's
/// completion then never woke. A count taken before the list's last wake is void (the wake
/// cleared the entry); the wait counts again at its next pending poll.
struct BehindWait<'a> {
    io: &'a StreamIo,
    /// The write side's list (`writing`), else the read side's (`stray`, `reading`).
    write: bool,
    /// The entry this wait counts on ([`Owned::id`]), and the list's wake count when it
    /// counted.
    counted: Option<(u64, u64)>,
}

impl<'a> BehindWait<'a> {
    fn new(io: &'a StreamIo, write: bool) -> Self {
        BehindWait {
            io,
            write,
            counted: None,
        }
    }

    /// This side's waiter list, if the stream's state can be borrowed (not inside a stream
    /// call) and the list exists.
    fn with_list<R>(&self, f: impl FnOnce(&PollState, &WaiterList) -> R) -> Option<R> {
        let st = self.io.poll.try_borrow().ok()?;
        let waiters = if self.write {
            &st.write_waiters
        } else {
            &st.read_waiters
        };
        let list = waiters.as_ref()?.list.clone();
        Some(f(&st, &list))
    }

    /// After a poll of the wait: while it waits, counts on `entry`, the owned entry the poll
    /// listed the task under ([`After::finish`]), giving back a count on another entry. No
    /// waker is cloned here, so no user code runs between the listing and the count.
    fn note<T>(&mut self, polled: &Poll<T>, entry: Option<u64>, cx: &Context<'_>) {
        if polled.is_ready() {
            return;
        }
        // `None`: the poll woke the task instead of listing it (`Listing::finish`).
        let Some(entry) = entry else {
            return;
        };
        let old = self.counted.take();
        let (gone, counted, found) = self
            .with_list(|st, list| {
                let mut listed = lock(&list.0);
                let now = listed.wakes;
                if old == Some((entry, now)) {
                    return (None, old, true);
                }
                let gone = old.and_then(|(id, at)| uncount(&mut listed, id, at));
                let found = match listed.owned.iter_mut().find(|o| o.id == entry) {
                    Some(o) => {
                        o.waits += 1;
                        true
                    }
                    None => false,
                };
                let empty = release_if_empty(&mut listed, st, self.write);
                debug_assert!(!(found && empty));
                (gone, found.then_some((entry, now)), found)
            })
            .unwrap_or((None, None, false));
        self.counted = counted;
        // After the lock and the borrow: dropping a waker is user code.
        drop(gone);
        if !found {
            // The entry went between the listing and now (another call's wait, run by user
            // code in this poll, gave back the entry's last count): poll again, and list
            // anew. At most one extra poll: the next one finds its entry.
            cx.waker().wake_by_ref();
        }
    }

    /// The wait is over (its result taken), or abandoned (dropped): gives its count back; if
    /// that leaves the list empty, the operation goes back to nobody-waits.
    fn release(&mut self) {
        let Some((id, at)) = self.counted.take() else {
            return;
        };
        let gone = self
            .with_list(|st, list| {
                let mut listed = lock(&list.0);
                let gone = uncount(&mut listed, id, at);
                release_if_empty(&mut listed, st, self.write);
                gone
            })
            .flatten();
        // After the stream's borrow: a waker's drop is user code (a custom waker owning a
        // read of this stream, which is kept only if it can borrow the stream's state).
        drop(gone);
    }
}

/// Gives back one count on entry `id`, taken at wake count `at` (void if the list was woken
/// since); returns the entry if that was its last count, to be dropped after the lock.
fn uncount(listed: &mut Listed, id: u64, at: u64) -> Option<Owned> {
    if at != listed.wakes {
        return None;
    }
    let i = listed.owned.iter().position(|o| o.id == id)?;
    let entry = &mut listed.owned[i];
    entry.waits = entry.waits.saturating_sub(1);
    (entry.waits == 0).then(|| listed.owned.swap_remove(i))
}

/// If nobody is listed any more, the side's operation goes back to nobody-waits (it stops
/// counting as I/O in flight), and the wake count moves: a task whose listing is still to
/// come (`Listing::finish`, after its poll; this may be its waker's clone) must not join a
/// list nothing will wake; the changed count sends it to poll again, which waits on the
/// operation anew. Returns whether the list was empty.
fn release_if_empty(listed: &mut Listed, st: &PollState, write: bool) -> bool {
    if !(listed.owned.is_empty() && listed.trait_side.is_none()) {
        return false;
    }
    listed.wakes += 1;
    if write {
        if let Some(op) = st.writing.as_ref() {
            op.unwait();
        }
    } else {
        for stray in &st.stray {
            stray.unwait();
        }
        if let Some(op) = st.reading.as_ref() {
            op.unwait();
        }
    }
    true
}

impl Drop for BehindWait<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Everyone waiting for the stream's shared operations (`reading`, `writing`). An `Op` keeps
/// one waker, the last poller's, but with `&self` owned calls several tasks may wait for the
/// same send or receive (the stream shared through an `Rc`, an owned call waiting behind the
/// `futures::io` side): the operation is polled with this list's own waker, which wakes them
/// all. One entry per waker (task): an owned read that stops waiting removes its entry
/// (`BehindWait`); an `AsyncRead` or a write that stops waiting stays listed, its task kept
/// alive, until the operation completes (no cap: a capped list that woke everyone to start
/// again made 33 waiting tasks re-list and overflow it forever, a spin).
/// Cost: one allocation per stream and side at its first wait, a lock and a `will_wake` scan
/// of the list per wait (the lock is never contended: the stream is `!Send`; `Waker` needs
/// `Sync`).
#[derive(Debug)]
struct Waiters {
    list: Arc<WaiterList>,
    /// A `Waker` of `list`, kept so that re-polls hand the operation the same waker.
    waker: Waker,
}

#[derive(Debug, Default)]
struct WaiterList(Mutex<Listed>);

/// An owned waiter's entry in a [`WaiterList`]: a task's waker, and how many of its owned
/// calls' waits rely on it (the futures of one task share one waker). The last wait to stop
/// relying on it removes it; a wake of the list clears every entry (and so every count).
#[derive(Debug)]
struct Owned {
    /// Unique in its list: how a wait finds the entry it counted on again (its waker's
    /// clones need not be `will_wake`-equal to the listed one).
    id: u64,
    waker: Waker,
    waits: usize,
}

/// The wakers a [`WaiterList`] wakes.
#[derive(Debug, Default)]
struct Listed {
    /// Owned calls (`&self`), one entry per waker (task), counting the waits that rely on it
    /// ([`BehindWait`]).
    owned: Vec<Owned>,
    /// The `futures::io` side's one waiter (it has `&mut self`), its latest waker.
    trait_side: Option<Waker>,
    /// How many times the list was woken ([`Listing`]).
    wakes: u64,
    /// The next [`Owned::id`].
    next_id: u64,
}

impl Wake for WaiterList {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let (owned, trait_side) = {
            let mut listed = lock(&self.0);
            listed.wakes += 1;
            (std::mem::take(&mut listed.owned), listed.trait_side.take())
        };
        wake_each(owned.into_iter().map(|o| o.waker).chain(trait_side));
    }
}

/// Wakes each of `wakers`, outside any lock, each guarded on its own: one panicking waker
/// must not leave the others asleep (the driver guards a list's waker only as a whole).
fn wake_each(wakers: impl IntoIterator<Item = Waker>) {
    for w in wakers {
        crate::task::wake_guarded(w);
    }
}

/// Polls a shared operation of `waiters`' stream for the task of `cx` (see [`Waiters`]).
/// Pending, a task not listed yet is left in `after` to be listed once the caller's borrow of
/// the stream's state ends ([`Listing`]): listing clones its waker, which is user code.
fn poll_shared<T: 'static>(
    op: &mut Op<T>,
    waiters: &mut Option<Waiters>,
    cx: &mut Context<'_>,
    trait_side: bool,
    after: &mut After,
) -> Poll<(i32, T)> {
    let w = waiters.get_or_insert_with(|| {
        let list = Arc::new(WaiterList::default());
        Waiters {
            waker: Waker::from(list.clone()),
            list,
        }
    });
    // Read before the poll: a completion after it, until the task is listed, changes it.
    let epoch = lock(&w.list.0).wakes;
    let r = Pin::new(op).poll(&mut Context::from_waker(&w.waker));
    if r.is_pending() {
        // Nothing but pointer compares under the lock (`will_wake`).
        let listed = {
            let listed = lock(&w.list.0);
            if trait_side {
                listed
                    .trait_side
                    .as_ref()
                    .is_some_and(|l| l.will_wake(cx.waker()))
            } else {
                after.entry = listed
                    .owned
                    .iter()
                    .find(|l| l.waker.will_wake(cx.waker()))
                    .map(|l| l.id);
                after.entry.is_some()
            }
        };
        if !listed {
            after.listing = Some(Listing {
                list: w.list.clone(),
                trait_side,
                epoch,
            });
        }
    }
    r
}

#[derive(Debug)]
pub(crate) struct StreamIo {
    // Dropped before `src`: in-flight operations are cancelled before the fd closes. In a
    // `RefCell` so the owned operations (`&self`) can wait for it; the `futures::io` side has
    // `&mut self` and uses `get_mut`, and never holds a borrow across a suspension.
    poll: RefCell<PollState>,
    /// Owned receives in flight (submitted by `read`, neither taken nor dropped yet); a
    /// dropped one is kept running (`PollState::stray`) only when it is the last, else
    /// cancelled in place and kept. A `Cell` beside the
    /// `RefCell`, so that a drop inside a stream call, which cannot borrow it, still counts.
    owned_reads: std::cell::Cell<usize>,
    /// Whether this stream shut its write half (`shutdown` of `Write` or `Both`, `close`):
    /// `AsyncWrite` on io_uring then refuses bytes with `EPIPE` at once, as the kernel does on
    /// epoll, instead of reporting them written and failing only at the next flush (a stream
    /// dropped before that lost them with no error). A `Cell` beside the `RefCell`, so that a
    /// shutdown inside a stream call, which cannot borrow it, still counts.
    write_shut: std::cell::Cell<bool>,
    /// The owned reads waiting on a receive of their own (`OwnedRecv`, not behind a kept
    /// one): a read dropped beside them (its receive kept in `PollState::stray`, or the bytes
    /// it took put in `rbuf`) wakes them, and a woken one that finds reads kept
    /// ([`kept_reads`](Self::kept_reads)) cancels its own receive in place and, once that
    /// resolved with nothing, takes what they kept first, as the next read would (see
    /// `ops::OwnWaiters`). Unwoken, bytes a kept read took waited for the next read call
    /// while one already waited on the kernel for more: a peer that sent one request and
    /// waited for the reply hung.
    own_waiting: ops::OwnWaiters,
    /// The epoll waiter ids of the `futures::io` side, one per driver it waited in, as
    /// `(driver id, waiter id)` (none until its first wait): it has `&mut self`, so one waiter
    /// per direction, whose re-polls with a new waker (a combinator making one per attempt)
    /// replace its entry instead of adding one each. Per driver: ids are unique only within
    /// their driver, and one kept from the first driver for the stream's life could be the
    /// id a later driver (a loop run while the first was hidden, or a later `LocalExecutor`)
    /// gave an owned operation's wait on this stream, which then took over this side's entry,
    /// and its drop removed it: that waiter was never woken.
    trait_ids: RefCell<Vec<(u64, u64)>>,
    pub(crate) src: Source,
}

enum Kind {
    Uring,
    Epoll,
}

/// The running loop's driver kind, for a call that starts I/O (not a hidden loop's:
/// `io::with_running_reactor`).
fn kind() -> io::Result<Kind> {
    crate::io::with_running_reactor(|r| {
        Ok(match r {
            Reactor::Uring(_) => Kind::Uring,
            _ => Kind::Epoll,
        })
    })
}

fn start_send(fd: i32, buf: Vec<u8>, from: usize) -> io::Result<Op<Vec<u8>>> {
    submit_send(fd, buf, from).map_err(|(e, _)| e)
}

/// [`start_send`], giving the buffer back with the error.
fn submit_send(fd: i32, buf: Vec<u8>, from: usize) -> Result<Op<Vec<u8>>, (io::Error, Vec<u8>)> {
    ops::submit(buf, |b| {
        // SAFETY: `from < len`, so the pointer stays inside the buffer.
        let ptr = unsafe { b.as_ptr().add(from) };
        opcode::Send::new(types::Fd(fd), ptr, (b.len() - from) as u32)
            // MSG_WAITALL: the kernel completes a short send itself (io_uring, Linux 5.19+), so a
            // detached send (see `PollState`) delivers all of its bytes; older kernels ignore it
            // on a send, and `drain` resubmits the rest.
            .flags(libc::MSG_NOSIGNAL | libc::MSG_WAITALL)
            .build()
    })
}

/// Where a finished write-behind send that started at offset `wsent` of its `len`-byte buffer
/// resumes, if the rest must be sent: at `wsent` after a shutdown's cancel (nothing moved),
/// further on after a short send. `None`: all sent, failed, or no progress (an error for
/// `drain`).
fn resume_at(res: i32, wsent: usize, len: usize) -> Option<usize> {
    let from = if nothing_moved(res) {
        wsent
    } else if res > 0 {
        wsent + res as usize
    } else {
        return None;
    };
    (from < len).then_some(from)
}

impl Drop for PollState {
    fn drop(&mut self) {
        if let (Some(buf), Some(fd)) = (self.unsent.take(), self.fd) {
            // Sent detached on an io_uring loop; on epoll it cannot be, and is lost.
            let left = buf.len().saturating_sub(self.wsent);
            match start_send(fd, buf, self.wsent) {
                Ok(rest) => rest.detach_send(left),
                Err(e) => lost_at_drop(left, &e),
            }
            return;
        }
        let Some(mut op) = self.writing.take() else {
            return;
        };
        if op.completed().is_none() {
            // It sends its buffer from `wsent` on.
            let left = op.data().map_or(0, |b| b.len().saturating_sub(self.wsent));
            op.detach_send(left);
            return;
        }
        // Over already, with its result not taken. A stream that outlived its loop's driver
        // may find its send cancelled by that driver's shutdown (`ECANCELED`: nothing moved;
        // uring.rs rule 5) or short: the rest is sent now from the loop the stream is dropped
        // on, detached like any send at drop. Off an io_uring loop it cannot be, and is lost.
        let mut noop = Context::from_waker(Waker::noop());
        let Poll::Ready((res, buf)) = Pin::new(&mut op).poll(&mut noop) else {
            return;
        };
        if let (Some(from), Some(fd)) = (resume_at(res, self.wsent, buf.len()), self.fd) {
            let left = buf.len().saturating_sub(from);
            match start_send(fd, buf, from) {
                Ok(rest) => rest.detach_send(left),
                Err(e) => lost_at_drop(left, &e),
            }
        }
    }
}

/// Logs the bytes a dropped stream reported written and could not send (dropped where no
/// io_uring loop can take its send: on an epoll loop, or off any loop), so the loss is not
/// silent.
fn lost_at_drop(bytes: usize, e: &io::Error) {
    tracing::warn!(
        "xtc: a stream dropped with {bytes} bytes reported written still unsent lost them ({e}); \
         flush (or close) a stream before dropping it off its io_uring loop"
    );
}

impl StreamIo {
    pub(crate) fn new(fd: OwnedFd) -> StreamIo {
        StreamIo::on(Source::new(fd))
    }

    /// A Unix-domain stream's (`Source::unix_stream`).
    pub(crate) fn new_unix(fd: OwnedFd) -> StreamIo {
        StreamIo::on(Source::unix_stream(fd))
    }

    fn on(src: Source) -> StreamIo {
        let fd = src.fd();
        StreamIo {
            poll: RefCell::new({
                let mut st = PollState::default();
                st.fd = Some(fd);
                st
            }),
            owned_reads: std::cell::Cell::new(0),
            write_shut: std::cell::Cell::new(false),
            own_waiting: ops::OwnWaiters::default(),
            trait_ids: RefCell::new(Vec::new()),
            src,
        }
    }

    /// Whether a dropped read left something for the next read to take first: a receive kept
    /// in `stray`, unread bytes or an unreported error. `false` while the state is borrowed
    /// (inside a stream call). Cost: a borrow check.
    fn kept_reads(&self) -> bool {
        self.poll.try_borrow().is_ok_and(|st| {
            !st.stray.is_empty() || st.rpos < st.rbuf.len() || st.read_error.is_some()
        })
    }

    /// One `futures::io` call on epoll, straight on the caller's `len` bytes: `syscall` while
    /// the direction is ready, else a wait under the stream's trait-side registration. `Err`
    /// if the loop's driver is not epoll.
    fn poll_trait_epoll(
        &self,
        dir: Dir,
        cx: &mut Context<'_>,
        len: usize,
        syscall: &mut impl FnMut(i32) -> io::Result<usize>,
    ) -> io::Result<Poll<io::Result<usize>>> {
        // A wait on the running loop only (not a hidden one, which would never wake it).
        crate::io::with_running_reactor(|r| match r {
            Reactor::Epoll(e) => {
                let id = self.trait_registration(e);
                Ok(self
                    .src
                    .poll_ready(e, dir, cx, syscall, |&n| short(n, len), id))
            }
            _ => Err(io::Error::other("xtc: driver changed")),
        })
    }

    /// The `futures::io` side's epoll waiter id in `e` ([`StreamIo::trait_ids`]), taken at
    /// its first use there. Cost: a scan of a list that is one long but for a stream used on
    /// several loops of its thread.
    fn trait_registration(&self, e: &crate::io::epoll::Epoll) -> u64 {
        let mut ids = self.trait_ids.borrow_mut();
        if let Some(&(_, id)) = ids.iter().find(|&&(driver, _)| driver == e.id()) {
            return id;
        }
        // A driver not met before: those that are gone are forgotten.
        ids.retain(|&(driver, _)| crate::io::source::reachable(driver));
        let id = e.new_registration();
        ids.push((e.id(), id));
        id
    }

    /// Unwraps into the descriptor. Bytes `AsyncWrite` reported written and not sent yet, and
    /// received bytes no read has returned yet, are lost: call
    /// [`settle_writes`](Self::settle_writes) and [`settle_reads`](Self::settle_reads) first.
    pub(crate) fn into_fd(self) -> OwnedFd {
        let StreamIo { poll, src, .. } = self;
        let mut poll = poll.into_inner();
        // After `settle_writes`, a send left here has finished, every byte sent. Taken out, not
        // left to the state's drop, which would send what one left unsent detached, behind
        // the new owner's back (after its bytes).
        drop(poll.writing.take());
        drop(poll.unsent.take());
        drop(poll);
        src.into_fd()
    }

    /// Before the descriptor changes hands: `Ok` if no received byte, and no error a receive
    /// got, would be lost. Receives still in the kernel (a kept one, an `AsyncRead`'s) are
    /// cancelled in place and waited for (reaping the loop's ring, a second at most:
    /// `Pending` after that); the bytes any of them took go to the internal buffer, where
    /// the next read finds them, as do unread bytes already there: `Unread`. An error one of
    /// them got (a reset), or one a dropped read's receive stashed, waits for the next read
    /// too (`read_error`): `Error`, since the kernel reports a socket error once, and the
    /// descriptor's next owner would read a clean end of stream instead. Runs no user code
    /// under the state's borrow (a kept read's buffer is dropped after it). Cost: a borrow
    /// and three checks without such receives, bytes or error.
    pub(crate) fn settle_reads(&self) -> Result<(), Unsettled> {
        const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
        let deadline = std::time::Instant::now() + SETTLE_WAIT;
        let mut cancelled = false;
        loop {
            let mut after = After::default();
            let r = {
                let Ok(mut st) = self.poll.try_borrow_mut() else {
                    return Err(Unsettled::Pending);
                };
                Self::settle_step(&mut st, &mut cancelled, &mut after)
            };
            // A kept read's buffer's `Drop` is user code: run outside the borrow. (Nothing
            // is listed: only completed receives are polled, with a no-op waker.)
            for buf in after.spent {
                crate::task::guarded("an I/O buffer panicked while being dropped", || drop(buf));
            }
            match r {
                Some(r) => return r,
                None if std::time::Instant::now() >= deadline => return Err(Unsettled::Pending),
                None => {
                    crate::io::reap_now();
                    std::thread::yield_now();
                }
            }
        }
    }

    /// One round of [`settle_reads`](Self::settle_reads): `None` while a receive is still in
    /// the kernel.
    fn settle_step(
        st: &mut PollState,
        cancelled: &mut bool,
        after: &mut After,
    ) -> Option<Result<(), Unsettled>> {
        // What is left once no receive is: an error waits for the next read.
        let settled = |st: &PollState| match st.read_error {
            Some(_) => Err(Unsettled::Error),
            None => Ok(()),
        };
        if st.rpos < st.rbuf.len() {
            return Some(Err(Unsettled::Unread));
        }
        if st.stray.is_empty() && st.reading.is_none() {
            return Some(settled(st));
        }
        if !std::mem::replace(cancelled, true) {
            for stray in &st.stray {
                stray.cancel_in_place();
            }
            if let Some(op) = &st.reading {
                op.cancel_in_place();
            }
        }
        let in_kernel = st.stray.iter().any(|s| s.completed().is_none())
            || st
                .reading
                .as_ref()
                .is_some_and(|op| op.completed().is_none());
        if in_kernel {
            return None;
        }
        // All reaped: each resolves at once; the bytes of the first that took any land in
        // `rbuf` (`poll_reading`), ahead of the later ones, which stay kept.
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            match poll_reading(st, &mut cx, false, after) {
                Poll::Pending => return None,
                Poll::Ready(None) => return Some(settled(st)),
                Poll::Ready(Some(Ok(_))) if st.rpos < st.rbuf.len() => {
                    return Some(Err(Unsettled::Unread))
                }
                // The end of the stream: nothing to lose (the next owner reads it too).
                Poll::Ready(Some(Ok(_))) => {}
                // An error is the socket's, which the kernel reported once: kept for the next
                // read, and the descriptor stays (`settled`).
                Poll::Ready(Some(Err(e))) => {
                    if st.read_error.is_none() {
                        st.read_error = e.raw_os_error().map(|c| -c);
                    }
                }
            }
        }
    }

    pub(crate) async fn read<B: IoBufMut>(&self, mut buf: B) -> BufResult<usize, B> {
        if buf.bytes_total() == 0 {
            // As `std`: at once (`rw::recv`), and without waiting for a read behind.
            return (Ok(0), buf);
        }
        let no_wait = match kind() {
            Err(e) => Some(e),
            // On a loop run while the loop of a receive it would wait for is hidden: as below.
            Ok(_)
                if self
                    .poll
                    .try_borrow()
                    .is_ok_and(|st| receive_elsewhere(&st)) =>
            {
                Some(elsewhere_error("receive", "read"))
            }
            Ok(_) => None,
        };
        if let Some(e) = no_wait {
            // This thread's loop is hidden (`context::off_loop`), or there is none: bytes a
            // receive already brought are handed out, but a receive still in the kernel (a
            // kept one, an `AsyncRead`'s) is not waited for: that loop does not turn until
            // the section ends, and the wait never ended (new I/O fails at once then).
            if !self.poll.try_borrow().is_ok_and(|st| already_received(&st)) {
                return (Err(e), buf);
            }
        }
        loop {
            // Bytes an `AsyncRead` (or a dropped owned read) already took from the kernel come
            // first (module doc).
            let mut wait = BehindWait::new(self, false);
            let taken = poll_fn(|cx| {
                let (r, entry) = self.poll_read_behind(cx, &mut buf);
                wait.note(&r, entry, cx);
                r
            })
            .await;
            wait.release();
            match taken {
                Ok(None) => {}
                Ok(Some(n)) => return (Ok(n), buf),
                Err(e) => return (Err(e), buf),
            }
            if !matches!(kind(), Ok(Kind::Uring)) {
                // On epoll, with a request a cut write-behind left unsent sent meanwhile
                // (`push_unsent`).
                let mut recv = std::pin::pin!(rw::recv(&self.src, buf));
                return poll_fn(|cx| {
                    self.push_unsent(cx);
                    recv.as_mut().poll(cx)
                })
                .await;
            }
            self.resume_write_behind();
            let op = match rw::submit_recv(&self.src, buf) {
                Ok(op) => op,
                Err((e, buf)) => return (Err(e), buf),
            };
            let (res, b, at) = OwnedRecv::new(self, op).await;
            buf = b;
            if nothing_moved(res) {
                // See `nothing_moved`: read again, as a kept read is (`poll_reading`).
                continue;
            }
            if self.queue_behind_kept(&mut buf, res, at) {
                // Behind bytes a dropped read kept, which were received before them: handed
                // out from `rbuf`, in order (`poll_read_behind`), and an end of stream or an
                // error after them (kept in `stray`).
                continue;
            }
            let r = result(res).map(|n| n as usize);
            if let Ok(n) = r {
                // SAFETY: the kernel initialized the first `n <= bytes_total()` bytes.
                unsafe { buf.set_init(n) };
            }
            return (r, buf);
        }
    }

    /// An owned read's own receive completed with `res` (bytes in `buf`, the end of the
    /// stream, or an error; not a cancellation), its completion at `at` in its driver's
    /// order: if a dropped read kept bytes whose receive completed before it (in `rbuf`, or a
    /// kept receive reaped earlier, which go there first), those were received first, and
    /// this result goes behind them: its bytes to `rbuf`, an end of stream or an error to
    /// `stray` (as a [`Received`] at `at`); `true`, and the read hands out from `rbuf`.
    /// Returned at once, bytes came before bytes the peer had sent earlier (the dropped
    /// read's completed while this one waited, and the peer's next bytes reached this one
    /// before it ran), and an end of stream or a reset before the bytes sent ahead of it.
    /// Bytes of a kept receive that completed after these stay behind them. Cost: a borrow
    /// check and a comparison when nothing is kept.
    fn queue_behind_kept<B: IoBufMut>(
        &self,
        buf: &mut B,
        res: i32,
        at: Option<(u64, u64)>,
    ) -> bool {
        let Some(own) = at else {
            return false;
        };
        // By (driver id, place): bytes an earlier driver of the thread reaped came first too
        // (compared within this read's driver only, "pong" came before an earlier driver's
        // "ping").
        let earlier = |a: Option<(u64, u64)>| a.is_some_and(|a| a < own);
        let mut after = After::default();
        let queued = {
            let Ok(mut st) = self.poll.try_borrow_mut() else {
                return false;
            };
            let st = &mut *st;
            // Kept receives that completed with bytes before this one: theirs first, in
            // `rbuf`, past those that moved nothing (each resolves at once; nothing is
            // listed).
            let mut noop = Context::from_waker(Waker::noop());
            order_stray(st);
            while let Some(stray) = st.stray.front() {
                let at = stray.completed_at();
                if !earlier(at) {
                    break;
                }
                match stray.completed() {
                    Some(res) if res > 0 => {
                        st.rbuf.drain(..st.rpos);
                        st.rpos = 0;
                        note_kept(st, at);
                    }
                    // One that moved nothing (a cancellation) is skipped, as a read skips it:
                    // the kept bytes behind it were still received before these.
                    Some(res) if nothing_moved(res) => {}
                    _ => break,
                }
                let Some(stray) = st.stray.front_mut() else {
                    break;
                };
                let r = stray.poll_into(
                    &mut st.read_waiters,
                    &mut noop,
                    false,
                    &mut st.rbuf,
                    &mut after,
                );
                debug_assert!(r.is_ready(), "a completed receive resolves");
                st.stray.pop_front();
            }
            if st.rpos < st.rbuf.len() && earlier(st.kept_at) && res <= 0 {
                // Nothing to append: the end of the stream or the error waits in `stray`,
                // where a read finds it once `rbuf` is drained (`order_stray` puts it by
                // `at`, behind the kept results before it).
                st.stray.push_back(Box::new(Received {
                    res,
                    bytes: Vec::new(),
                    at,
                }));
                true
            } else if st.rpos < st.rbuf.len() && earlier(st.kept_at) {
                st.rbuf.drain(..st.rpos);
                st.rpos = 0;
                let n = (res as usize).min(buf.bytes_total());
                // SAFETY: the kernel wrote the first `n <= bytes_total()` bytes at the
                // buffer's stable mutable pointer, where the receive was submitted
                // (`rw::submit_recv`), and its completion was reaped before this result.
                let got = unsafe { std::slice::from_raw_parts(buf.stable_mut_ptr(), n) };
                st.rbuf.extend_from_slice(got);
                st.kept_at = at;
                true
            } else {
                false
            }
        };
        // A kept read's buffer's `Drop` is user code: run outside the borrow.
        for b in after.spent {
            crate::task::guarded("an I/O buffer panicked while being dropped", || drop(b));
        }
        queued
    }

    pub(crate) async fn write<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        // An empty write sends nothing that could overtake `AsyncWrite` bytes: it does not
        // wait for them (that wait hung on a full socket whose peer never reads), as on epoll.
        if buf.bytes_init() > 0 {
            if let Err(e) = self.wait_write_behind().await {
                return (Err(e), buf);
            }
        }
        rw::send(&self.src, buf, 0).await
    }

    pub(crate) async fn write_all<B: IoBuf>(&self, buf: B) -> BufResult<(), B> {
        if buf.bytes_init() == 0 {
            // Nothing to send (see `write`).
            return (Ok(()), buf);
        }
        if let Err(e) = self.wait_write_behind().await {
            return (Err(e), buf);
        }
        rw::send_all(&self.src, buf).await
    }

    /// Owned writes: waits for the `AsyncWrite` bytes still being sent, leaving the waiter
    /// list if dropped meanwhile (`BehindWait`).
    async fn wait_write_behind(&self) -> io::Result<()> {
        let mut wait = BehindWait::new(self, true);
        let r = poll_fn(|cx| {
            let (r, entry) = self.poll_write_behind(cx);
            wait.note(&r, entry, cx);
            r
        })
        .await;
        wait.release();
        r
    }

    /// Owned writes: waits for the `AsyncWrite` bytes still being sent (io_uring write-behind).
    /// Pending, with the waiter entry the task is listed under (`BehindWait::note`). Cost when
    /// there are none: a `RefCell` borrow and a check.
    fn poll_write_behind(&self, cx: &mut Context<'_>) -> (Poll<io::Result<()>>, Option<u64>) {
        // Only a stream with a send of its own left (rare on epoll) looks up the driver: this
        // runs before every owned write.
        let leftover = {
            let st = self.poll.borrow();
            st.unsent.is_some() || st.writing.is_some()
        };
        if leftover && matches!(kind(), Ok(Kind::Epoll)) {
            // Waiting on the socket's readiness, not on the waiter list: no entry.
            match self.poll_unsent(cx, false) {
                Poll::Ready(Ok(())) => {}
                other => return (other, None),
            }
        }
        let fd = self.src.fd();
        After::around(cx, |cx, after| {
            let mut st = self.poll.borrow_mut();
            // Bytes an epoll loop left unsent (`PollState::unsent`) count as much as a send
            // in flight: back on io_uring, `drain` submits them first. Looking at `writing`
            // alone, an owned write went out ahead of them.
            if st.writing.is_none() && st.unsent.is_none() {
                return Poll::Ready(Ok(()));
            }
            if let Err(e) = off_loop_drain(&st) {
                return Poll::Ready(Err(e));
            }
            drain(fd, &mut st, cx, false, after)
        })
    }

    /// Owned reads: copies into `buf` what an `AsyncRead` took from the kernel and did not hand
    /// out (waiting for its read still in flight first): `Ok(Some(n))` for `n` bytes taken, or
    /// `Ok(Some(0))` for an end of stream a receive already brought; `Ok(None)` when there is
    /// nothing, so the caller reads from the kernel (so does a zero-capacity `buf`). Pending,
    /// with the waiter entry the task is listed under (`BehindWait::note`).
    fn poll_read_behind<B: IoBufMut>(
        &self,
        cx: &mut Context<'_>,
        buf: &mut B,
    ) -> (Poll<io::Result<Option<usize>>>, Option<u64>) {
        // Finished after the borrow: a kept read's buffer may read this stream in its
        // `Drop`, and a custom waker's clone may use it.
        After::around(cx, |cx, after| {
            Self::read_behind(&mut self.poll.borrow_mut(), cx, buf, after)
        })
    }

    /// [`poll_read_behind`](Self::poll_read_behind) on the borrowed state; what must wait for
    /// the borrow's end goes to `after`.
    fn read_behind<B: IoBufMut>(
        st: &mut PollState,
        cx: &mut Context<'_>,
        buf: &mut B,
        after: &mut After,
    ) -> Poll<io::Result<Option<usize>>> {
        // Unread bytes first: a read in flight (a kept one, an `AsyncRead`'s) can only bring
        // later ones, and may never complete.
        if st.rpos == st.rbuf.len() {
            // A stashed error comes after the bytes of a kept receive, which were received
            // before it.
            if st.stray.is_empty() {
                if let Some(e) = st.read_error.take() {
                    return Poll::Ready(Err(io::Error::from_raw_os_error(-e)));
                }
            }
            match ready!(poll_reading(st, cx, false, after)) {
                // An end of stream a receive already brought: taken, as bytes are. Reported
                // as "nothing behind", the caller read afresh: one receive more on a running
                // loop (the end is sticky), but an error with the loop hidden, where only
                // what was already received may be handed out.
                Some(Ok(0)) => return Poll::Ready(Ok(Some(0))),
                Some(r) => {
                    r?;
                }
                // Only kept receives that moved nothing were taken: an error stashed behind
                // them is next.
                None if st.stray.is_empty() => {
                    if let Some(e) = st.read_error.take() {
                        return Poll::Ready(Err(io::Error::from_raw_os_error(-e)));
                    }
                }
                None => {}
            }
        }
        let left = st.rbuf.len() - st.rpos;
        let n = left.min(buf.bytes_total());
        if n > 0 {
            // SAFETY: `buf` has room for `bytes_total() >= n` writable bytes at its stable
            // pointer; `rbuf[rpos..rpos + n]` is initialized; the two do not overlap (`buf` is
            // the caller's, `rbuf` ours). `set_init(n)`: the first `n` bytes were just written.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    st.rbuf.as_ptr().add(st.rpos),
                    buf.stable_mut_ptr(),
                    n,
                );
                buf.set_init(n);
            }
            st.rpos += n;
            return Poll::Ready(Ok(Some(n)));
        }
        Poll::Ready(Ok(None))
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        if how != Shutdown::Read {
            self.check_write_behind()?;
        }
        let how = match how {
            Shutdown::Read => libc::SHUT_RD,
            Shutdown::Write => libc::SHUT_WR,
            Shutdown::Both => libc::SHUT_RDWR,
        };
        // SAFETY: plain syscall on our open descriptor.
        ops::cvt(unsafe { libc::shutdown(self.src.fd(), how) })?;
        if how != libc::SHUT_RD {
            self.write_shut.set(true);
            // A Unix stream reports no readiness for its shut write half (TCP's is reported,
            // and marking it changes nothing there): on epoll a write waiting for room (or
            // a later one on a full socket) waited for good; it is woken to fail with
            // `BrokenPipe`, as a blocking one does. Here, so `shutdown` and `close` both do it.
            self.src.shut(Dir::Write);
        }
        Ok(())
    }

    /// Before a FIN: bytes `AsyncWrite` reported written but the kernel has not taken yet
    /// (io_uring write-behind) would be lost behind it, so they are submitted, the driver is
    /// reaped, and if the send is still in flight or came back short, the shutdown is refused
    /// with `WouldBlock` (nothing is sent, nothing is lost; `flush` or `close` waits for them).
    /// A failed send is reported by the next flush, write or close; the shutdown itself loses
    /// nothing more.
    fn check_write_behind(&self) -> io::Result<()> {
        match self.write_behind() {
            WriteBehind::Held => Err(unsent_error()),
            WriteBehind::Clear | WriteBehind::Failed => Ok(()),
        }
    }

    /// Before the descriptor changes hands (`into_std`): `true` if no byte `AsyncWrite`
    /// reported written is still to be sent, and no failed send's error is still to be
    /// reported ([`write_behind`](Self::write_behind)). Else nothing is touched: the send
    /// runs on (not cancelled: the caller was told those bytes were written), for `flush` to
    /// wait for and report. Not waited for here: a send may wait for good on a peer that does
    /// not read, and this runs on the loop.
    pub(crate) fn settle_writes(&self) -> bool {
        matches!(self.write_behind(), WriteBehind::Clear)
    }

    /// Where the write-behind send stands: the send is submitted and the driver reaped
    /// first (when a loop runs), so one the kernel has finished counts as such. Runs no user
    /// code under the state's borrow. Cost: a borrow and two checks with no send left.
    fn write_behind(&self) -> WriteBehind {
        {
            let Ok(st) = self.poll.try_borrow() else {
                // Borrowed: inside a stream call (user code under it); nothing is certain.
                return WriteBehind::Held;
            };
            if st.unsent.is_some() {
                return WriteBehind::Held;
            }
            if st.writing.is_none() {
                return WriteBehind::Clear;
            }
        }
        // Outside the borrow: the reap drops the buffers of cancelled operations and wakes
        // tasks, user code that may use this stream (a buffer whose `Drop` reads it). Off any
        // loop there is nothing to reap, and no error: the send's driver is gone and left its
        // result to it (`Op::completed` finds it).
        let _ = crate::io::with_reactor(|r| {
            r.submit();
            r.reap();
            Ok(())
        });
        // Looked at anew: that user code may have taken the send (an owned write waiting for
        // it), which then reported its outcome, and nothing is left behind.
        let Ok(st) = self.poll.try_borrow() else {
            return WriteBehind::Held;
        };
        if st.unsent.is_some() {
            return WriteBehind::Held;
        }
        let Some(op) = st.writing.as_ref() else {
            return WriteBehind::Clear;
        };
        match op.completed() {
            // Nothing sent: `drain` sends it again.
            Some(res) if nothing_moved(res) => WriteBehind::Held,
            Some(res) if res < 0 => WriteBehind::Failed,
            Some(n) if op.data().is_some_and(|b| st.wsent + n as usize >= b.len()) => {
                WriteBehind::Clear
            }
            // Short (`drain` sends the rest), or still in the kernel.
            _ => WriteBehind::Held,
        }
    }

    /// On epoll (the caller checked): sends what a write-behind send of a gone io_uring loop
    /// left unsent ([`PollState::unsent`]), taking over such a send first, by readiness under
    /// the `futures::io` side's registration, or, for an owned call (`trait_side` false),
    /// [`epoll::ANON`](crate::io::epoll::ANON) (its waker stays registered until the socket's
    /// next writable event if the call is dropped). `Ready(Ok)` once nothing is left. No borrow
    /// of the state is held while the waker is registered (user code), and the bytes stay in
    /// the state meanwhile, so a write that code starts goes after them. Cost when nothing is
    /// left: a `RefCell` borrow and a check.
    fn poll_unsent(&self, cx: &mut Context<'_>, trait_side: bool) -> Poll<io::Result<()>> {
        self.send_unsent(cx, trait_side, false)
    }

    /// Before a read waits on epoll: starts sending what a write-behind send of a gone io_uring
    /// loop left unsent (`poll_unsent`), without waiting for it, as `resume_write_behind` does
    /// on io_uring: the read may wait for the answer to those bytes (a request). Unsent, the
    /// read and its peer waited for each other for good. The task waits for writability too
    /// (under [`ANON`](crate::io::epoll::ANON): the `futures::io` side's registration is the
    /// `AsyncWrite` waiter's, which another task may be), so the rest goes out as the socket
    /// drains while the read waits. A failed send stays unsent, for the next write, flush or
    /// close to report. Cost when nothing is left: a `RefCell` borrow and a check.
    fn push_unsent(&self, cx: &mut Context<'_>) {
        let pending = self
            .poll
            .try_borrow()
            .is_ok_and(|st| st.unsent.is_some() || st.writing.is_some());
        if pending && matches!(kind(), Ok(Kind::Epoll)) {
            let _ = self.send_unsent(cx, false, true);
        }
    }

    /// [`poll_unsent`](Self::poll_unsent); `keep_failed`: a send that fails leaves the bytes
    /// unsent and reports nothing ([`push_unsent`](Self::push_unsent)).
    fn send_unsent(
        &self,
        cx: &mut Context<'_>,
        trait_side: bool,
        keep_failed: bool,
    ) -> Poll<io::Result<()>> {
        loop {
            {
                let mut st = self.poll.borrow_mut();
                let st = &mut *st;
                if st.unsent.is_none() {
                    let resume = st.writing.as_ref().and_then(|op| {
                        let (res, buf) = (op.completed()?, op.data()?);
                        resume_at(res, st.wsent, buf.len())
                    });
                    if let Some(from) = resume {
                        // Completed: taking its result runs no user code and needs no waker.
                        if let Some(mut op) = st.writing.take() {
                            let mut noop = Context::from_waker(Waker::noop());
                            match Pin::new(&mut op).poll(&mut noop) {
                                Poll::Ready((_, buf)) => {
                                    st.wsent = from;
                                    st.unsent = Some(buf);
                                }
                                Poll::Pending => {
                                    debug_assert!(false, "a completed send resolves");
                                    st.writing = Some(op);
                                }
                            }
                        }
                    }
                }
                match st.unsent.as_ref() {
                    Some(buf) if st.wsent < buf.len() => {}
                    Some(_) => {
                        // All sent.
                        st.wbuf = st.unsent.take().unwrap_or_default();
                        st.wbuf.clear();
                        return Poll::Ready(Ok(()));
                    }
                    None => return Poll::Ready(Ok(())),
                }
            }
            // The bytes stay in the state while the waker may be registered (its clone is user
            // code, which may start an owned write: taken out, they were not there for it to
            // wait for, and it went ahead of them). Sent from there, `wsent` moved at once,
            // with no user code in between; `None`: nothing left (such user code sent it).
            let mut send = |fd: i32| -> io::Result<Option<(usize, usize)>> {
                let mut st = self.poll.borrow_mut();
                let st = &mut *st;
                let Some(buf) = st.unsent.as_ref() else {
                    return Ok(None);
                };
                let rest = &buf[st.wsent.min(buf.len())..];
                if rest.is_empty() {
                    return Ok(None);
                }
                // SAFETY: `rest` is `len` initialized bytes of the state's buffer, borrowed
                // for this call.
                let n = ops::cvt(unsafe {
                    libc::send(fd, rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL)
                })? as usize;
                let len = rest.len();
                st.wsent += n;
                Ok(Some((n, len)))
            };
            let r = crate::io::with_running_reactor(|r| match r {
                Reactor::Epoll(e) => {
                    let id = if trait_side {
                        self.trait_registration(e)
                    } else {
                        crate::io::epoll::ANON
                    };
                    Ok(self.src.poll_ready(
                        e,
                        Dir::Write,
                        cx,
                        &mut send,
                        |sent| sent.is_some_and(|(n, len)| short(n, len)),
                        id,
                    ))
                }
                _ => Err(io::Error::other("xtc: driver changed")),
            });
            match r {
                // Some sent (`wsent` moved), or nothing left: look again.
                Ok(Poll::Ready(Ok(Some((n, _))))) if n > 0 => {}
                Ok(Poll::Ready(Ok(None))) => {}
                Ok(Poll::Pending) => return Poll::Pending,
                Ok(Poll::Ready(Err(_) | Ok(Some(_)))) if keep_failed => {
                    return Poll::Ready(Ok(()));
                }
                // An error, or no progress (reported once, as `drain` reports a failed send):
                // the bytes are given up.
                Ok(Poll::Ready(r)) => {
                    let mut st = self.poll.borrow_mut();
                    if let Some(buf) = st.unsent.take() {
                        st.wbuf = buf;
                        st.wbuf.clear();
                    }
                    return Poll::Ready(match r {
                        Ok(_) => Err(io::ErrorKind::WriteZero.into()),
                        Err(e) => Err(e),
                    });
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    pub(crate) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        if out.is_empty() {
            // At once on both drivers (epoll waited for data first).
            return Poll::Ready(Ok(0));
        }
        let kind = match kind() {
            Ok(kind) => kind,
            // This thread's loop is hidden (`context::off_loop`): no new I/O, but bytes a
            // receive already brought (io_uring: in `rbuf`, or a reaped completion) are no
            // I/O at all, and are handed out as before.
            Err(e) => {
                if !already_received(self.poll.get_mut()) {
                    return Poll::Ready(Err(e));
                }
                return After::around(cx, |cx, after| {
                    self.poll_read_uring(cx, out, after, Some(e))
                })
                .0;
            }
        };
        match kind {
            Kind::Epoll => {
                // A stream kept from an io_uring loop of this thread that has gone (a
                // `LocalExecutor` made after `XTC_IO` changed): what its receives took (unread
                // in `rbuf`, or completions its driver left) comes before the socket's next
                // bytes, as for the owned `read`. Straight to the socket, they were lost.
                if already_received(self.poll.get_mut()) {
                    let (taken, _) = After::around(cx, |cx, after| {
                        take_received(self.poll.get_mut(), cx, out, after)
                    });
                    if let Some(r) = taken {
                        return Poll::Ready(r);
                    }
                }
                // On a loop run while the io_uring loop of a receive still in the kernel is
                // hidden: that receive takes the socket's next bytes, which only its own
                // loop's driver hands out, after the section; read here, the bytes after
                // them overtook them. As on an io_uring loop: only what already arrived.
                if receive_elsewhere(self.poll.get_mut()) {
                    return Poll::Ready(Err(elsewhere_error("receive", "read")));
                }
                // A request a cut write-behind left unsent goes out before the read waits
                // for its answer.
                self.push_unsent(cx);
                let (ptr, len) = (out.as_mut_ptr(), out.len());
                self.poll_trait_epoll(Dir::Read, cx, len, &mut |fd| {
                    // SAFETY: `ptr` points at the caller's `len` writable bytes, borrowed for
                    // this call.
                    ops::cvt(unsafe { libc::recv(fd, ptr.cast(), len, 0) }).map(|n| n as usize)
                })?
            }
            Kind::Uring => {
                self.resume_write_behind();
                // On a loop run while the loop of the receive it would wait for is hidden: only
                // what already arrived, as with that loop hidden and none running.
                let no_new = receive_elsewhere(self.poll.get_mut())
                    .then(|| elsewhere_error("receive", "read"));
                After::around(cx, |cx, after| self.poll_read_uring(cx, out, after, no_new)).0
            }
        }
    }

    /// `poll_read` on io_uring; what must wait for the end of its use of the state goes to
    /// `after`. `no_new`: this thread's loop is hidden, and this error is the answer where a
    /// new receive would be submitted.
    fn poll_read_uring(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut [u8],
        after: &mut After,
        mut no_new: Option<io::Error>,
    ) -> Poll<io::Result<usize>> {
        loop {
            let st = self.poll.get_mut();
            if st.rpos < st.rbuf.len() {
                let n = out.len().min(st.rbuf.len() - st.rpos);
                out[..n].copy_from_slice(&st.rbuf[st.rpos..st.rpos + n]);
                st.rpos += n;
                return Poll::Ready(Ok(n));
            }
            if st.stray.is_empty() {
                if let Some(e) = st.read_error.take() {
                    return Poll::Ready(Err(io::Error::from_raw_os_error(-e)));
                }
            }
            // With the loop hidden, only a receive that already completed is taken: one still
            // in the kernel would leave the task waiting for a loop that does not turn.
            if no_new.is_some() && !already_received(st) {
                return Poll::Ready(Err(no_new.take().expect("checked")));
            }
            if let Some(r) = ready!(poll_reading(st, cx, true, after)) {
                match r {
                    Ok(0) => return Poll::Ready(Ok(0)),
                    Ok(_) => continue,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if out.is_empty() {
                return Poll::Ready(Ok(0));
            }
            if let Some(e) = no_new.take() {
                return Poll::Ready(Err(e));
            }
            let mut buf = std::mem::take(&mut st.rbuf);
            buf.clear();
            // `rpos` indexes `rbuf`, now empty (also if the submit below fails and gives
            // it back): an owned `read` must not copy from a stale position.
            st.rpos = 0;
            // No read-ahead past what the caller asked for: bytes left in `rbuf` would make
            // `into_std` refuse until a read took them.
            let want = out.len().min(READ_MAX);
            if buf.capacity() > want.max(READ_KEEP) {
                buf = Vec::new();
            }
            buf.reserve(want);
            let fd = self.src.fd();
            match ops::submit(buf, |b| {
                opcode::Recv::new(types::Fd(fd), b.as_mut_ptr(), want as u32).build()
            }) {
                Ok(op) => st.reading = Some(op),
                Err((e, buf)) => {
                    st.rbuf = buf;
                    return Poll::Ready(Err(e));
                }
            }
        }
    }

    /// Before a read waits (io_uring, on the running loop): a write-behind send that stopped
    /// before the end of its buffer with nobody waiting for it, cancelled by the shutdown of
    /// the driver it ran on (a stream returned from `LocalExecutor::block_on`) or short (a
    /// kernel that ignores `MSG_WAITALL` on a send), is started again for the rest, as `drain`
    /// would. Only `flush`, `close` or the next write did that, so a read for the answer to
    /// bytes reported written waited for good while the peer waited for those bytes (epoll has
    /// them in the socket already). A send still in flight, or one that finished (all sent,
    /// or failed: its error is for the next flush, write or close), is left as it is. A
    /// restart that cannot be submitted keeps the send's result for `drain` to report. Cost
    /// when no send stopped: a `RefCell` borrow and a check (a slab lookup while one is in
    /// flight).
    fn resume_write_behind(&self) {
        let fd = self.src.fd();
        let Ok(mut st) = self.poll.try_borrow_mut() else {
            return;
        };
        let st = &mut *st;
        let Some(op) = st.writing.as_mut() else {
            // Left unsent by an epoll loop (`PollState::unsent`): sent again as a write-behind
            // send, from a copy, as below; a submission that fails leaves it for `drain`.
            if let Some(buf) = st.unsent.as_ref() {
                match start_send(fd, buf[st.wsent..].to_vec(), 0) {
                    Ok(rest) => {
                        st.wbuf = st.unsent.take().unwrap_or_default();
                        st.wbuf.clear();
                        st.wsent = 0;
                        st.writing = Some(rest);
                    }
                    Err(e) => tracing::debug!("xtc: resuming unsent bytes failed: {e}"),
                }
            }
            return;
        };
        let (Some(res), Some(buf)) = (op.completed(), op.data()) else {
            return;
        };
        let Some(from) = resume_at(res, st.wsent, buf.len()) else {
            return;
        };
        // The rest goes out from a copy, submitted before the old send's result is taken:
        // if the submission fails, that send stays as it is, for `drain` to resume or report.
        let rest = match start_send(fd, buf[from..].to_vec(), 0) {
            Ok(rest) => rest,
            Err(e) => {
                tracing::debug!("xtc: resuming a write-behind send failed: {e}");
                return;
            }
        };
        // Completed: taking its result runs no user code and needs no waker. Whoever was
        // listed for it was woken by its completion (or belonged to the loop that is gone),
        // and finds the new send on its next poll (`drain`).
        let mut noop = Context::from_waker(Waker::noop());
        let old = Pin::new(op).poll(&mut noop);
        debug_assert!(old.is_ready(), "a completed send resolves");
        st.wsent = 0;
        st.writing = Some(rest);
    }

    /// Waits for the write in flight (io_uring), completing partial sends.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if matches!(kind(), Ok(Kind::Epoll)) {
            ready!(self.poll_unsent(cx, true))?;
        }
        let fd = self.src.fd();
        let st = self.poll.get_mut();
        if st.writing.is_some() || st.unsent.is_some() {
            // Unsent bytes too: off any loop, `drain` could not submit them, and they were
            // dropped with the failed submission.
            off_loop_drain(st)?;
        }
        After::around(cx, |cx, after| drain(fd, st, cx, true, after)).0
    }

    pub(crate) fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match kind()? {
            Kind::Epoll => {
                if data.is_empty() {
                    // As on io_uring (below) and as `poll_read` of an empty slice: at once. A
                    // readiness wait hung on a full socket whose peer never reads.
                    return Poll::Ready(Ok(0));
                }
                // After what an io_uring write-behind left unsent (`PollState::unsent`), and
                // its error.
                ready!(self.poll_drain(cx))?;
                let (ptr, len) = (data.as_ptr(), data.len());
                self.poll_trait_epoll(Dir::Write, cx, len, &mut |fd| {
                    // SAFETY: `ptr` points at the caller's `len` bytes, borrowed for this call.
                    ops::cvt(unsafe { libc::send(fd, ptr.cast(), len, libc::MSG_NOSIGNAL) })
                        .map(|n| n as usize)
                })?
            }
            Kind::Uring => {
                if data.is_empty() {
                    // At once, as on epoll: not behind the write-behind send, whose bytes
                    // count as in the socket's buffer (on a full socket whose peer never reads
                    // that wait never ended; `flush` reports that send).
                    return Poll::Ready(Ok(0));
                }
                ready!(self.poll_drain(cx))?;
                if self.write_shut.get() {
                    // The kernel would refuse them (`EPIPE`, as on epoll): not reported
                    // written, to fail only at the next flush, or never if that never comes.
                    return Poll::Ready(Err(io::Error::from_raw_os_error(libc::EPIPE)));
                }
                let n = data.len().min(WRITE_BUF);
                let fd = self.src.fd();
                let st = self.poll.get_mut();
                let mut buf = std::mem::take(&mut st.wbuf);
                buf.clear();
                buf.extend_from_slice(&data[..n]);
                st.wsent = 0;
                st.writing = Some(start_send(fd, buf, 0)?);
                Poll::Ready(Ok(n))
            }
        }
    }

    pub(crate) fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = ready!(self.poll_drain(cx));
        shed_wbuf(self.poll.get_mut());
        Poll::Ready(r)
    }

    pub(crate) fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = ready!(self.poll_drain(cx));
        shed_wbuf(self.poll.get_mut());
        r?;
        if self.write_shut.get() {
            // Shut already (an earlier `close` or `shutdown`): done, as the first one said.
            // Shut again, TCP refused it with `ENOTCONN` once the connection had ended.
            return Poll::Ready(Ok(()));
        }
        Poll::Ready(self.shutdown(Shutdown::Write))
    }
}

/// Gives back a write buffer larger than [`WRITE_KEEP`] once no send uses it.
fn shed_wbuf(st: &mut PollState) {
    if st.writing.is_none() && st.unsent.is_none() && st.wbuf.capacity() > WRITE_KEEP {
        st.wbuf = Vec::new();
    }
}

/// `shutdown`'s refusal to overtake bytes `AsyncWrite` reported written.
fn unsent_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::WouldBlock,
        "xtc: bytes written through AsyncWrite are still being sent; \
         await flush() (or use close(), which flushes and shuts down) before shutdown()",
    )
}

/// Where a stream's write-behind send stands ([`StreamIo::write_behind`]).
enum WriteBehind {
    /// No byte reported written is left to send (none was, or its send finished).
    Clear,
    /// Its send failed, with an error the next flush, write or close reports.
    Failed,
    /// Bytes reported written are still to be sent: a send in flight, one that came back
    /// short or was cut (`drain` sends the rest), or bytes an epoll loop took over
    /// (`PollState::unsent`).
    Held,
}

/// Before `drain` (a flush, a close, an owned write) of `st`'s write-behind send: with this
/// thread's loop hidden (`context::off_loop`), or none running, a send still in the kernel,
/// or one to be resumed (new I/O), gives that loop's error at once and stays for a later
/// flush: waiting for it waited for a loop that does not turn until the section ends (a drop
/// that flushed hung for good). One that completed for good is taken as on the loop. So is a
/// send still in the kernel of a hidden loop's driver on a loop run inside the section (its
/// own error then: `uring::driver_elsewhere`). Cost on a running loop: a thread-local read,
/// and one more while a send is in flight.
fn off_loop_drain(st: &PollState) -> io::Result<()> {
    let e = match kind() {
        Err(e) => e,
        // On a loop run while the send's own loop is hidden (a swept drop's
        // `LocalExecutor::block_on`): that send ends only when its loop turns again, after the
        // section, so it is that loop's error, at once, and the send stays for a flush there.
        // Waited for, the flush hung for good (the section waited for it).
        Ok(_)
            if st.writing.as_ref().is_some_and(|op| {
                uring::driver_elsewhere(op.driver_id()) && op.completed().is_none()
            }) =>
        {
            elsewhere_error("write-behind send", "flush")
        }
        Ok(_) => return Ok(()),
    };
    let settled = st.unsent.is_none()
        && st
            .writing
            .as_ref()
            .is_none_or(|op| match (op.completed(), op.data()) {
                (Some(res), Some(buf)) => resume_at(res, st.wsent, buf.len()).is_none(),
                _ => false,
            });
    if settled {
        Ok(())
    } else {
        Err(e)
    }
}

/// The error of a call on a loop run while this thread's loop that runs the stream's `what`
/// is hidden (a swept drop's `LocalExecutor::block_on`): that loop's driver is reaped only
/// once it turns again, after the section, so waiting for it from here waited for good (the
/// section waited for the call). `to_do`: the call to make on the stream's own loop.
fn elsewhere_error(what: &str, to_do: &str) -> io::Error {
    io::Error::other(format!(
        "xtc: this stream's {what} runs on the I/O driver of a loop of this thread that is \
         hidden while an executor frees its tasks, and cannot be waited for from a loop run \
         meanwhile; {to_do} the stream on its own loop"
    ))
}

/// Whether a read of `st` would wait for a receive still in the kernel of a driver this
/// loop cannot wait on (`uring::driver_elsewhere`: a kept receive, or the `AsyncRead`
/// receive, started on a loop now hidden). Cost: a thread-local read per receive in flight.
fn receive_elsewhere(st: &PollState) -> bool {
    st.stray.iter().any(|s| s.waits_elsewhere())
        || st
            .reading
            .as_ref()
            .is_some_and(|op| uring::driver_elsewhere(op.driver_id()) && op.completed().is_none())
}

/// Puts the kept receives of `st` in the order the socket gave them their bytes: those whose
/// completion was reaped first, by where it stands in their driver's order
/// (`Op::completed_at`, kept once the driver is gone), then those still in the kernel (which
/// get bytes, if any, only after every reaped one), in the order they were kept. A read takes
/// them from the front. Kept in the order they were dropped, two reads that took "ping" and
/// "pong", dropped youngest first, handed out "pong" "ping", and a kept receive that completed
/// behind one still in the kernel waited for it. Completions of different drivers go by the
/// driver's id: a stream moves to a loop made after the one it leaves (`next_driver_id`
/// counts up). Cost: nothing while fewer than two are kept.
fn order_stray(st: &mut PollState) {
    if st.stray.len() < 2 {
        return;
    }
    st.stray
        .make_contiguous()
        .sort_by_key(|s| (s.completed().is_none(), s.completed_at().unwrap_or((0, 0))));
}

/// Bytes of a kept read whose completion stood at `at` in its driver's order are about to be
/// appended to `st.rbuf`: `kept_at` becomes the newest such place (unknown if either is).
fn note_kept(st: &mut PollState, at: Option<(u64, u64)>) {
    st.kept_at = if st.rpos == st.rbuf.len() {
        at
    } else {
        match (st.kept_at, at) {
            (Some((d, p)), Some((e, q))) if d == e => Some((d, p.max(q))),
            _ => None,
        }
    };
}

/// Whether a read of `st` has something to hand out without a receive still in the kernel:
/// unread bytes, a stashed error it reports now, or, for the receive [`poll_reading`] takes
/// next (a kept one first), a completion already reaped.
fn already_received(st: &PollState) -> bool {
    if st.rpos < st.rbuf.len() {
        return true;
    }
    // Kept reads first, those reaped ahead of those still in the kernel (`order_stray`): one
    // that moved nothing is skipped.
    let mut in_kernel = false;
    for stray in &st.stray {
        match stray.completed() {
            None => in_kernel = true,
            Some(res) if nothing_moved(res) => {}
            Some(_) => return true,
        }
    }
    if in_kernel {
        return false;
    }
    st.read_error.is_some()
        || st
            .reading
            .as_ref()
            .is_some_and(|op| op.completed().is_some())
}

/// `poll_read` on a loop that starts no receive of the stream's own (epoll): hands out what
/// receives already brought (see [`already_received`]), in order; `None` once there is
/// nothing left, for the caller to read the socket. What must wait for the end of the use of
/// `st` goes to `after`.
fn take_received(
    st: &mut PollState,
    cx: &mut Context<'_>,
    out: &mut [u8],
    after: &mut After,
) -> Option<io::Result<usize>> {
    loop {
        if st.rpos < st.rbuf.len() {
            let n = out.len().min(st.rbuf.len() - st.rpos);
            out[..n].copy_from_slice(&st.rbuf[st.rpos..st.rpos + n]);
            st.rpos += n;
            return Some(Ok(n));
        }
        if st.stray.is_empty() {
            if let Some(e) = st.read_error.take() {
                return Some(Err(io::Error::from_raw_os_error(-e)));
            }
        }
        if !already_received(st) {
            return None;
        }
        // A reaped completion: ready at once, so no task is listed.
        match poll_reading(st, cx, true, after) {
            Poll::Ready(Some(Ok(0))) => return Some(Ok(0)),
            // Its bytes are in `rbuf` now, or it moved nothing (cancelled by its driver's
            // shutdown): look again.
            Poll::Ready(Some(Ok(_)) | None) => {}
            Poll::Ready(Some(Err(e))) => return Some(Err(e)),
            Poll::Pending => {
                debug_assert!(false, "a completed receive resolves");
                return None;
            }
        }
    }
}

/// Completes the `AsyncRead` receive in flight (io_uring), if any: its bytes land in `rbuf`.
/// `Ready(None)`: none was in flight; `Ready(Some(r))`: it finished with `r`. A kept read's
/// buffer, and a task to list, go to `after`, for the caller to finish once it no longer
/// borrows `st`'s stream.
fn poll_reading(
    st: &mut PollState,
    cx: &mut Context<'_>,
    trait_side: bool,
    after: &mut After,
) -> Poll<Option<io::Result<u32>>> {
    order_stray(st);
    while let Some(stray) = st.stray.front_mut() {
        // Its bytes go after those still unread in `rbuf` (none, in practice: a read starts
        // only once `rbuf` is drained).
        st.rbuf.drain(..st.rpos);
        st.rpos = 0;
        let at = stray.completed_at();
        let res =
            ready!(stray.poll_into(&mut st.read_waiters, cx, trait_side, &mut st.rbuf, after));
        st.stray.pop_front();
        if res > 0 {
            // `rbuf` held no unread byte (drained above): these are all it holds.
            st.kept_at = at;
        }
        if nothing_moved(res) {
            continue; // the next kept one, else the caller reads afresh
        }
        return Poll::Ready(Some(result(res)));
    }
    let Some(op) = st.reading.as_mut() else {
        return Poll::Ready(None);
    };
    let (res, mut got) = ready!(poll_shared(op, &mut st.read_waiters, cx, trait_side, after));
    st.reading = None;
    st.kept_at = None;
    if nothing_moved(res) {
        got.clear();
        st.rbuf = got;
        st.rpos = 0;
        return Poll::Ready(None);
    }
    let r = result(res);
    if let Ok(n) = r {
        // SAFETY: the kernel initialized `n <= capacity` bytes.
        unsafe { got.set_len(n as usize) };
    }
    st.rbuf = got;
    st.rpos = 0;
    Poll::Ready(Some(r))
}

/// Waits for the `AsyncWrite` send in flight (io_uring), completing partial sends; its error,
/// or a send that made no progress, is the result. A task to list goes to `after`.
fn drain(
    fd: i32,
    st: &mut PollState,
    cx: &mut Context<'_>,
    trait_side: bool,
    after: &mut After,
) -> Poll<io::Result<()>> {
    loop {
        if let Some(buf) = st.unsent.take() {
            // Left by an epoll loop (see `PollState::unsent`): a write-behind send again. Kept
            // unsent if it cannot be submitted (reported written, they are not to be lost).
            match submit_send(fd, buf, st.wsent) {
                Ok(op) => st.writing = Some(op),
                Err((e, buf)) => {
                    st.unsent = Some(buf);
                    return Poll::Ready(Err(e));
                }
            }
        }
        let Some(op) = st.writing.as_mut() else {
            break;
        };
        let (res, buf) = ready!(poll_shared(
            op,
            &mut st.write_waiters,
            cx,
            trait_side,
            after
        ));
        st.writing = None;
        if let Some(from) = resume_at(res, st.wsent, buf.len()) {
            st.wsent = from;
            // Kept unsent if the rest cannot be submitted, as above: dropped with the failed
            // submission, bytes reported written were lost, and the next flush reported
            // success.
            match submit_send(fd, buf, from) {
                Ok(op) => st.writing = Some(op),
                Err((e, buf)) => {
                    st.unsent = Some(buf);
                    return Poll::Ready(Err(e));
                }
            }
            continue;
        }
        match result(res) {
            Ok(n) => {
                st.wsent += n as usize;
                let short = st.wsent < buf.len();
                st.wbuf = buf;
                st.wbuf.clear();
                if short {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
            }
            Err(e) => {
                st.wbuf = buf;
                st.wbuf.clear();
                return Poll::Ready(Err(e));
            }
        }
    }
    Poll::Ready(Ok(()))
}

/// Implements the `futures::io` traits for a type with a `StreamIo` field named `io`.
macro_rules! impl_async_io {
    ($t:ty) => {
        /// `futures::io` reads. Cost: on io_uring one `RECV` into an internal buffer (at most
        /// 256 KiB, never more than asked) whenever it is empty, plus a copy out; on epoll one
        /// `recv` straight into the caller's slice. Mixes with the owned calls in byte order.
        ///
        /// A read given up before it is ready (a `timeout` or a lost `select!` branch around
        /// `AsyncReadExt::read`) loses nothing: its receive stays in flight and the next read
        /// takes what it got. Until then it counts as I/O the loop waits on, so `run()` does not
        /// end at quiescence, nor report a deadlock, while a stream left in that state lives
        /// (say, kept in a pool): read again, or drop the stream, to end it. The owned
        /// [`read`](Self::read) has no such effect: dropped, its receive runs on, kept by
        /// the stream for the next read, but nothing waits on it.
        impl futures_io::AsyncRead for $t {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut [u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                self.get_mut().io.poll_read(cx, buf)
            }
        }

        /// `futures::io` writes. Cost: on io_uring a copy of up to 64 KiB into an internal
        /// buffer and one `SEND`, reported written at once (write-behind: the next write,
        /// `flush` or `close` waits for it and reports its error); on epoll one `send` straight
        /// from the caller's slice.
        ///
        /// Bytes reported written are sent: dropped without `flush` or `close`, the stream
        /// leaves its last send to finish on its own (on io_uring detached, cancelled if the
        /// peer takes nothing for 10 s; flush first where every byte must arrive whatever the
        /// peer's pace). A write or flush given up while it waits for room keeps its send in
        /// flight, which, as a given-up read does, keeps `run()` from ending at quiescence
        /// while the stream lives. `close` flushes and then shuts the write half; closing
        /// again is `Ok`. On io_uring, a reset by the peer while a send waits for room fails
        /// that send's writer (`BrokenPipe`), and a read pending at the same time may see a
        /// plain end of stream (`Ok(0)`) rather than `ConnectionReset`: the kernel's
        /// completion of the whole send (`MSG_WAITALL`, which the drop above needs) takes the
        /// reset's error. Where a cut stream must not read as complete, frame the data (a
        /// length or an end marker) or check the writer's result.
        impl futures_io::AsyncWrite for $t {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                self.get_mut().io.poll_write(cx, buf)
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                self.get_mut().io.poll_flush(cx)
            }

            fn poll_close(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                self.get_mut().io.poll_close(cx)
            }
        }
    };
}
pub(crate) use impl_async_io;
