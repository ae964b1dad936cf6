//! UDP: [`UdpSocket`].

use std::{
    cell::{Cell, RefCell},
    future::{poll_fn, Future},
    io,
    mem::MaybeUninit,
    net::SocketAddr,
    os::fd::{AsRawFd, OwnedFd, RawFd},
    pin::Pin,
    task::{ready, Context, Poll},
};

use socket2::{Domain, SockAddr, SockRef, Socket, Type};

use super::{each_addr, ip_addr, tcp::BorrowedRaw, IntoStdError, Unsettled};
use crate::io::{
    ops::msg::{self, RecvOp},
    source::Source,
    uring::{nothing_moved, Op},
    BufResult, Driver, IoBuf, IoBufMut,
};

/// A UDP socket on the current loop's driver. `!Send`.
#[derive(Debug)]
pub struct UdpSocket {
    /// `recv_from`s whose futures were dropped unfinished on io_uring (a `select!` whose other
    /// branch won), cancelled in place and kept here rather than dropped: each resolves to the
    /// cancellation or to the datagram the kernel gave it first, which the next `recv_from`
    /// takes over, in the kernel's order (`ops::next_kept`), so a datagram the kernel already
    /// gave one is not lost, and nothing stays armed in the kernel for a receive nobody waits
    /// for (see `KeepOnDrop`).
    /// Each with its number in the order it was first kept, so one taken by a `recv_from`
    /// that is dropped before it resolves goes back to its place, not behind younger ones.
    /// Declared before `src`: dropped (cancelled) before the descriptor closes.
    stray: RefCell<std::collections::VecDeque<(u64, Box<dyn StrayRecv>)>>,
    /// The number of the next receive kept in `stray`.
    next_stray: Cell<u64>,
    /// The `recv_from`s waiting on a receive of their own (not a kept one; on epoll, their
    /// readiness wait): a receive kept meanwhile wakes them, and a woken one takes the kept
    /// ones over first (see `ops::OwnWaiters`). Unwoken, a datagram a kept receive took waited
    /// for the next `recv_from` call while one already waited on the kernel.
    waiting: crate::io::ops::OwnWaiters,
    src: Source,
}

/// A `RECVMSG` left running by a dropped `recv_from`, whatever its buffer type.
trait StrayRecv {
    /// Polls it; when done, copies the datagram (truncated to `dst`, as a short buffer
    /// truncates any datagram) and gives its length and sender.
    fn poll_into(
        &mut self,
        cx: &mut Context<'_>,
        dst: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<(usize, SockAddr)>>;
    /// Nobody waits for it until a `recv_from` takes it over (`Op::unwait_later`): hands out
    /// the waker it forgets, for the caller to drop once the receive is kept.
    fn unwait_later(&self) -> Option<std::task::Waker>;
    /// Cancels it if still in the kernel, keeping its result (`Op::cancel_in_place`).
    fn cancel_in_place(&self);
    /// Its result once its completion was reaped (`Op::completed`): taking it is no I/O.
    fn completed(&self) -> Option<i32>;
    /// Where its reaped completion stands in its driver's order (`Op::completed_at`).
    fn completed_at(&self) -> Option<(u64, u64)>;
    /// Whether it is still in the kernel of a driver this loop cannot wait on
    /// (`ops::waits_elsewhere`).
    fn waits_elsewhere(&self) -> bool;
}

impl<B: IoBufMut> StrayRecv for RecvOp<B> {
    fn poll_into(
        &mut self,
        cx: &mut Context<'_>,
        dst: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<(usize, SockAddr)>> {
        let (res, (mut buf, h)) = ready!(Pin::new(self).poll(cx));
        let r = msg::received_from(res, &h).map(|(n, addr)| {
            let n = n.min(buf.bytes_total()).min(dst.len());
            if n > 0 {
                // SAFETY: the kernel wrote the datagram's first `n <= bytes_total()` bytes at
                // the buffer's stable mutable pointer, where the receive was submitted
                // (`msg::submit_recv_from`; `stable_ptr` may be another view), and the
                // completion was reaped before this result. Not for `n == 0`: an empty
                // buffer's pointer may be null, which no slice may have.
                let got = unsafe { std::slice::from_raw_parts(buf.stable_mut_ptr(), n) };
                for (d, &b) in dst.iter_mut().zip(got) {
                    d.write(b);
                }
            }
            (n, addr)
        });
        // A user buffer's `Drop` is user code.
        crate::task::guarded("an I/O buffer panicked while being dropped", || drop(buf));
        Poll::Ready(r)
    }

    fn unwait_later(&self) -> Option<std::task::Waker> {
        Op::unwait_later(self)
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
        crate::io::ops::waits_elsewhere(self)
    }
}

/// A datagram a `recv_from`'s own receive got after a kept receive had got an earlier one:
/// copied out and kept behind that one ([`UdpSocket::keep_behind_earlier`]), as a receive
/// that has completed.
struct Received {
    data: Vec<u8>,
    addr: SockAddr,
    /// Where the receive's completion stood in its driver's order.
    at: Option<(u64, u64)>,
}

impl StrayRecv for Received {
    fn poll_into(
        &mut self,
        _cx: &mut Context<'_>,
        dst: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<(usize, SockAddr)>> {
        let n = self.data.len().min(dst.len());
        for (d, &b) in dst.iter_mut().zip(&self.data[..n]) {
            d.write(b);
        }
        Poll::Ready(Ok((n, self.addr.clone())))
    }

    fn unwait_later(&self) -> Option<std::task::Waker> {
        None
    }

    fn cancel_in_place(&self) {}

    fn completed(&self) -> Option<i32> {
        // A datagram (`>= 0`): its length, which fits, as the receive's result did.
        Some(self.data.len() as i32)
    }

    fn completed_at(&self) -> Option<(u64, u64)> {
        self.at
    }

    fn waits_elsewhere(&self) -> bool {
        false
    }
}

impl std::fmt::Debug for dyn StrayRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StrayRecv")
    }
}

/// What a socket's `stray` slot can take: a fresh receive, or one taken over from the slot.
trait IntoStray {
    fn into_stray(self) -> Box<dyn StrayRecv>;
}

impl<B: IoBufMut> IntoStray for RecvOp<B> {
    fn into_stray(self) -> Box<dyn StrayRecv> {
        Box::new(self)
    }
}

impl IntoStray for Box<dyn StrayRecv> {
    fn into_stray(self) -> Box<dyn StrayRecv> {
        self
    }
}

/// A receive a `recv_from` future waits for until it is taken ([`done`](Self::done)) or
/// dropped. Dropped unfinished, it is cancelled in place and kept in the socket's `stray`
/// queue: it resolves to `-ECANCELED` (the next `recv_from` skips it) or to the datagram that
/// won the race, which the next `recv_from` takes. One taken from the queue goes back to its
/// place there, by its number.
struct KeepOnDrop<'a, R: IntoStray> {
    socket: &'a UdpSocket,
    op: Option<R>,
    /// Its number in `stray`, if it was taken from there.
    number: Option<u64>,
    /// Its entry in the socket's `waiting`, while it waits on a receive of its own.
    waiter: Option<u64>,
}

impl<'a, R: IntoStray> KeepOnDrop<'a, R> {
    fn new(socket: &'a UdpSocket, op: R, number: Option<u64>) -> Self {
        KeepOnDrop {
            socket,
            op: Some(op),
            number,
            waiter: None,
        }
    }

    /// The receive's result was taken.
    fn done(&mut self) {
        self.op = None;
    }
}

impl<R: IntoStray> Drop for KeepOnDrop<'_, R> {
    fn drop(&mut self) {
        if let Some(id) = self.waiter.take() {
            self.socket.waiting.leave(id);
        }
        let Some(op) = self.op.take() else { return };
        let op = op.into_stray();
        op.cancel_in_place();
        // Kept before the waker it forgets is dropped (user code, which may use this
        // socket): see `ops::keep_dropped`.
        let waker = op.unwait_later();
        crate::io::ops::keep_dropped(
            &self.socket.stray,
            &self.socket.next_stray,
            self.number,
            op,
            waker,
        );
        // The receives still waiting take it over (see `UdpSocket::waiting`).
        self.socket.waiting.wake_all();
    }
}

/// A `recv_from`'s entry in its socket's `waiting` while its epoll wait is pending: taken off
/// the list when dropped (done, or the future dropped).
struct Listed<'a> {
    waiting: &'a crate::io::ops::OwnWaiters,
    id: Option<u64>,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.waiting.leave(id);
        }
    }
}

impl UdpSocket {
    /// Binds a socket (synchronous). Port 0 picks a free port. `Err`: the resolver's error for
    /// a name that does not resolve, the last address's error (`AddrInUse`, ..), or
    /// `InvalidInput` if `addr` resolves to an empty list. Cost per
    /// address tried: a `socket` and a `bind` system call.
    pub fn bind(addr: impl std::net::ToSocketAddrs) -> io::Result<UdpSocket> {
        each_addr(addr, |a| {
            let s = Socket::new(Domain::for_address(a), Type::DGRAM.nonblocking(), None)?;
            s.bind(&a.into())?;
            Ok(s)
        })
        .map(|s| UdpSocket::new(OwnedFd::from(s)))
    }

    /// Sends `buf[..len]` as one datagram to `addr`; returns the bytes sent. A datagram larger
    /// than the protocol allows fails (`EMSGSIZE`), nothing is split. Not cancellation safe on
    /// io_uring: dropping the future after its first poll cancels its `SENDMSG`, but the
    /// kernel may send the datagram before it handles the cancel (it usually does: the cancel
    /// follows the send in one submission), so a retry after a timeout may send it twice. On
    /// epoll the send runs in the poll that returns its count, so a dropped `send_to` sent
    /// nothing. Cost: one `SENDMSG` submission with two boxes (the message header and the
    /// address), or one `sendto`.
    pub async fn send_to<B: IoBuf>(&self, buf: B, addr: SocketAddr) -> BufResult<usize, B> {
        msg::send_to(&self.src, buf, addr.into()).await
    }

    fn new(fd: OwnedFd) -> UdpSocket {
        UdpSocket {
            stray: RefCell::new(std::collections::VecDeque::new()),
            next_stray: Cell::new(0),
            waiting: Default::default(),
            src: Source::new(fd),
        }
    }

    /// Receives one datagram into `buf` from its start (a `Vec`'s length becomes the bytes
    /// copied; a datagram longer than the capacity is truncated, and as with std the count
    /// does not tell: leave room for the largest datagram expected) and the sender's address. Dropping the
    /// future before it resolves loses no datagram on either driver: on io_uring the socket
    /// cancels the receive it submitted but keeps it, and the next `recv_from` takes it over
    /// (kept ones in the order their receives completed, else by when they were first kept,
    /// so datagrams keep their order, for one receive at a time: two `recv_from`s in flight at
    /// once, as in a `select!` over both, may get them in either order on io_uring, whose
    /// kernel fills the receive armed last first).
    /// A datagram the kept receive already got (before its cancellation) comes back as it got
    /// it, truncated to the dropped buffer's capacity if that was smaller; the dropped buffer
    /// (a [`FixedBuf`](crate::io::FixedBuf) too) is held until then. One cancelled with nothing
    /// is skipped, and the datagram goes to a fresh receive, as on epoll. Cost: one `RECVMSG`
    /// submission with a boxed message header, or one `recvfrom` (the socket joins the loop's
    /// epoll set once, at its first wait); a call that waits lists a waker clone with the
    /// socket, for a receive kept meanwhile; a dropped receive costs a boxed handle (and a search
    /// of the kept ones, usually none or one, to keep them in order). Dropping the socket
    /// loses a datagram such a kept receive holds; [`into_std`](Self::into_std) refuses
    /// while one holds one.
    pub async fn recv_from<B: IoBufMut>(&self, buf: B) -> BufResult<(usize, SocketAddr), B> {
        let (res, buf) = self.recv_raw(buf).await;
        (res.and_then(|(n, a)| Ok((n, ip_addr(&a)?))), buf)
    }

    async fn recv_raw<B: IoBufMut>(&self, mut buf: B) -> BufResult<(usize, SockAddr), B> {
        // Each turn takes a kept receive's datagram, or receives afresh; a receive cancelled by
        // a driver's shutdown (nothing taken) starts the next turn.
        'fresh: loop {
            loop {
                // The one that completed first (the kernel's order), else the oldest.
                let taken = {
                    let mut kept = self.stray.borrow_mut();
                    crate::io::ops::next_kept(&kept, |s| s.completed_at())
                        .and_then(|i| kept.remove(i))
                };
                let Some((number, stray)) = taken else {
                    break;
                };
                // With this thread's loop hidden (`context::off_loop`), or none running, only
                // a receive that already completed is taken, as a stream's read and an
                // `accept` do: one still in the kernel would leave the caller waiting for a
                // loop that does not turn. It stays first in line for the next call.
                // So with a loop run while the loop of a receive still in the kernel is hidden
                // (this one runs inside its `context::off_loop` section): only that loop's
                // driver sees it end, and it does not turn until the section ends.
                if stray.completed().is_none() {
                    let no_wait = match crate::io::ops::backend() {
                        Err(e) => Some(e),
                        Ok(_) if stray.waits_elsewhere() => {
                            Some(crate::io::ops::kept_elsewhere_error("receive", "receive"))
                        }
                        Ok(_) => None,
                    };
                    if let Some(e) = no_wait {
                        let mut kept = self.stray.borrow_mut();
                        crate::io::ops::keep_in_order(
                            &mut kept,
                            &self.next_stray,
                            Some(number),
                            stray,
                        );
                        return (Err(e), buf);
                    }
                }
                // Taken over: this future waits for it now (and gives it back to its place if
                // dropped too).
                let mut keep = KeepOnDrop::new(self, stray, Some(number));
                let res = poll_fn(|cx| {
                    let op = keep.op.as_mut().expect("present until it completes");
                    let (ptr, len) = (buf.stable_mut_ptr(), buf.bytes_total());
                    let dst: &mut [MaybeUninit<u8>] = if len == 0 {
                        // An empty buffer's pointer may be null, which no slice may have.
                        &mut []
                    } else {
                        // SAFETY: `buf` owns `len` writable bytes at its stable pointer,
                        // borrowed for this call only; as `MaybeUninit` nothing is read from
                        // them.
                        unsafe { std::slice::from_raw_parts_mut(ptr.cast(), len) }
                    };
                    op.poll_into(cx, dst)
                })
                .await;
                keep.done();
                if matches!(&res, Err(e) if e.raw_os_error().is_some_and(|c| nothing_moved(-c))) {
                    continue; // received nothing: the next kept one, or a fresh receive
                }
                if let Ok((n, _)) = &res {
                    // SAFETY: `poll_into` wrote the first `n <= bytes_total()` bytes.
                    unsafe { buf.set_init(*n) };
                }
                return (res, buf);
            }
            if !matches!(crate::io::current_driver(), Some(Driver::IoUring)) {
                // Epoll (or off any loop: the error).
                if let Err(e) = crate::io::ops::backend() {
                    return (Err(e), buf);
                }
                let (ptr, len) = (buf.stable_mut_ptr(), buf.bytes_total());
                // The wait (its epoll entry) and the listing go before anything else.
                let res = {
                    let mut call = std::pin::pin!(msg::ready_recv_from(&self.src, ptr, len));
                    let mut listed = Listed {
                        waiting: &self.waiting,
                        id: None,
                    };
                    poll_fn(|cx| {
                        // Kept ones first, before the wait may take a later datagram: one
                        // kept since the last poll may hold a datagram the kernel received
                        // before the one this poll's `recvfrom` would take (its readiness
                        // reaped meanwhile), which was then handed out first.
                        if self.stray.try_borrow().is_ok_and(|kept| !kept.is_empty()) {
                            return Poll::Ready(None);
                        }
                        if let Poll::Ready(r) = call.as_mut().poll(cx) {
                            return Poll::Ready(Some(r));
                        }
                        // A receive kept meanwhile (a `recv_from` of an io_uring loop of this
                        // thread, dropped: one carried here, or one of a loop run while this one
                        // was hidden) may hold the datagram this call waits for, which the kernel
                        // then has not to wake it: listed first, then checked, as the io_uring
                        // path's own receive; the call took nothing yet, so it gives way.
                        listed.id = Some(self.waiting.wait(listed.id, cx.waker()));
                        if self.stray.try_borrow().is_ok_and(|kept| !kept.is_empty()) {
                            return Poll::Ready(None);
                        }
                        Poll::Pending
                    })
                    .await
                };
                let Some(res) = res else {
                    continue 'fresh; // the kept ones first, in order
                };
                if let Ok((n, _)) = &res {
                    // SAFETY: the kernel initialized the first `n <= bytes_total()` bytes.
                    unsafe { buf.set_init(*n) };
                }
                return (res, buf);
            }
            let op = match msg::submit_recv_from(&self.src, buf) {
                Ok(op) => op,
                Err((e, b)) => return (Err(e), b),
            };
            let mut keep = KeepOnDrop::new(self, op, None);
            // Whether this receive gave way to receives kept meanwhile: cancelled in place, it
            // resolves to the cancellation (then the kept ones are taken over, in order)
            // or to a datagram that won the race.
            let mut gave_way = false;
            // Where its completion stood in its driver's order, taken before the poll that
            // takes its result.
            let mut own_at = None;
            let (res, (b, h)) = poll_fn(|cx| {
                let op = keep.op.as_mut().expect("present until it completes");
                own_at = op.completed_at();
                let done = Pin::new(&mut *op).poll(cx);
                if done.is_ready() || gave_way {
                    return done;
                }
                // Listed first, then checked: a receive kept by the clone's user code wakes
                // the entry or is seen here.
                keep.waiter = Some(self.waiting.wait(keep.waiter, cx.waker()));
                if self.stray.try_borrow().is_ok_and(|kept| !kept.is_empty()) {
                    gave_way = true;
                    op.cancel_in_place();
                    // Its own completion wakes it from now on.
                    if let Some(id) = keep.waiter.take() {
                        self.waiting.leave(id);
                    }
                }
                Poll::Pending
            })
            .await;
            keep.done();
            drop(keep);
            buf = b;
            if nothing_moved(res) {
                // Cancelled by the shutdown of the driver it was submitted to (this future
                // outlived its loop, uring.rs rule 5), or given up by the kernel (`EAGAIN`, see
                // `nothing_moved`): no datagram was taken, so it is received again on the
                // current loop, as a kept receive is (above) and as epoll would.
                continue 'fresh;
            }
            let res = msg::received_from(res, &h);
            if let Ok((n, addr)) = &res {
                if self.keep_behind_earlier(&mut buf, *n, addr, own_at) {
                    // Behind a datagram a kept receive got first: that one comes first.
                    continue 'fresh;
                }
                // SAFETY: the kernel initialized the first `n <= bytes_total()` bytes.
                unsafe { buf.set_init(*n) };
            }
            return (res, buf);
        }
    }

    /// A `recv_from`'s own receive got a datagram of `n` bytes into `buf` from `addr`, its
    /// completion at `at` in its driver's order: if a kept receive got one before it (its
    /// completion reaped earlier), that one was received first, and this one is copied out
    /// and kept right behind the last such (`true`: the call takes the kept ones over, in
    /// order). Returned at once, it came before a datagram the kernel had received earlier
    /// (the dropped receive's, reaped while this one waited, when the next datagram reached
    /// this one before it ran). Cost: a borrow check and a scan of the kept receives
    /// (usually none).
    fn keep_behind_earlier<B: IoBufMut>(
        &self,
        buf: &mut B,
        n: usize,
        addr: &SockAddr,
        at: Option<(u64, u64)>,
    ) -> bool {
        let Some(own) = at else {
            return false;
        };
        let Ok(mut kept) = self.stray.try_borrow_mut() else {
            return false;
        };
        let Some((i, number)) = crate::io::ops::behind_earlier(
            &kept,
            own,
            |stray| stray.completed().is_some_and(|res| res >= 0),
            |stray| stray.completed_at(),
        ) else {
            return false;
        };
        let n = n.min(buf.bytes_total());
        let data = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: the kernel wrote the datagram's first `n <= bytes_total()` bytes at the
            // buffer's stable mutable pointer, where the receive was submitted, and the
            // completion was reaped before this result. Not for `n == 0`: an empty buffer's
            // pointer may be null.
            unsafe { std::slice::from_raw_parts(buf.stable_mut_ptr(), n) }.to_vec()
        };
        let received = Received {
            data,
            addr: addr.clone(),
            at,
        };
        kept.insert(i, (number, Box::new(received)));
        true
    }

    /// Connects the socket to `addr`, the first address it resolves to that connects:
    /// [`send`](Self::send) and [`recv`](Self::recv) then talk to that peer, and the kernel
    /// drops datagrams from any other address. Synchronous, as [`bind`](Self::bind) and
    /// `std`'s (a datagram socket's `connect` only records the peer; tokio's and glommio's are
    /// `async` for name resolution, which here blocks the loop as `bind`'s does: pass a
    /// literal address). Connecting again changes the peer. Cost: one `connect` system call
    /// per address tried.
    pub fn connect(&self, addr: impl std::net::ToSocketAddrs) -> io::Result<()> {
        let fd = BorrowedRaw(self.src.fd());
        let sock = SockRef::from(&fd);
        each_addr(addr, |a| sock.connect(&a.into()))
    }

    /// The connected peer's address; `NotConnected` before [`connect`](Self::connect).
    /// Cost: one `getpeername` system call.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        ip_addr(&SockRef::from(&BorrowedRaw(self.src.fd())).peer_addr()?)
    }

    /// Sends `buf[..len]` as one datagram to the connected peer; returns the bytes sent.
    /// Before [`connect`](Self::connect) it fails (`EDESTADDRREQ`); a datagram larger than the
    /// protocol allows fails (`EMSGSIZE`), nothing is split. A full send buffer makes it wait
    /// for room, an empty datagram too. Not cancellation safe on io_uring, as
    /// [`send_to`](Self::send_to): a dropped `send` may still have sent its datagram. Cost: one
    /// `SEND` submission, or one `send`.
    pub async fn send<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        crate::io::ops::rw::send_datagram(&self.src, buf).await
    }

    /// Receives one datagram from the connected peer into `buf`, as
    /// [`recv_from`](Self::recv_from) does (truncated to the buffer's capacity, and a dropped
    /// future loses no datagram), without the sender's address. Cost: as `recv_from`'s.
    pub async fn recv<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B> {
        let (res, buf) = self.recv_raw(buf).await;
        (res.map(|(n, _)| n), buf)
    }

    /// The bound address. Cost: one `getsockname` system call.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        ip_addr(&SockRef::from(&BorrowedRaw(self.src.fd())).local_addr()?)
    }

    /// Wraps a `std` socket (switched to non-blocking mode). Cost: one system call.
    pub fn from_std(s: std::net::UdpSocket) -> io::Result<UdpSocket> {
        s.set_nonblocking(true)?;
        Ok(UdpSocket::new(OwnedFd::from(s)))
    }

    /// Unwraps into a `std` socket (left non-blocking). Loses no datagram: the receives that
    /// dropped `recv_from`/`recv` futures left to this socket (io_uring; see
    /// [`recv_from`](Self::recv_from)) were cancelled then, and this waits for those
    /// cancellations to settle. If one of them lost the race and took a datagram, which
    /// cannot go back to the kernel, the socket comes back in the error
    /// ([`IntoStdError::into_inner`]): `recv_from` (it returns that datagram at once), then
    /// call `into_std` again. (Dropping it, as before, lost the datagram.) The same for an
    /// error one of them got (`ECONNREFUSED` on a connected socket), which the kernel
    /// reports once, so the `std` socket would not see it: the next `recv` returns it. The
    /// same error, with nothing lost, if a cancellation has not settled within a second. Cost: a borrow
    /// check without such receives; with one, a non-blocking reap of the loop's ring per
    /// round until its cancellation settles (usually none or one; the loop waits meanwhile).
    /// Either way, the descriptor leaves the driver as a dropped socket's does: an `epoll_ctl`
    /// on epoll once it has waited there, and on io_uring an `io_uring_enter` when this
    /// thread's loops have entries queued (which may name it).
    pub fn into_std(self) -> Result<std::net::UdpSocket, IntoStdError<UdpSocket>> {
        if let Err(why) = self.settle() {
            return Err(IntoStdError::unread(self, why));
        }
        let UdpSocket { stray, src, .. } = self;
        // Each cancelled with nothing taken: dropped before the descriptor changes hands.
        drop(stray);
        Ok(std::net::UdpSocket::from(src.into_fd()))
    }

    /// Waits (reaping the loop's ring, a second at most) until every kept receive has
    /// resolved: `Ok` if each was cancelled with nothing taken; `Unread` if one took a
    /// datagram, `Error` if one got an error (`ECONNREFUSED` after an ICMP port unreachable,
    /// which the kernel reports once: the next `recv` returns it, the `std` socket would not
    /// see it), `Pending` if one is still in the kernel after that.
    fn settle(&self) -> Result<(), Unsettled> {
        const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
        let deadline = std::time::Instant::now() + SETTLE_WAIT;
        loop {
            let (mut got, mut error, mut pending) = (false, false, false);
            {
                let Ok(kept) = self.stray.try_borrow() else {
                    return Err(Unsettled::Pending);
                };
                for (_, stray) in kept.iter() {
                    match stray.completed() {
                        Some(res) if res >= 0 => got = true,
                        Some(res) => error |= !nothing_moved(res),
                        None => pending = true,
                    }
                }
            }
            if got {
                return Err(Unsettled::Unread);
            }
            if error {
                return Err(Unsettled::Error);
            }
            if !pending {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(Unsettled::Pending);
            }
            crate::io::reap_now();
            std::thread::yield_now();
        }
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.src.fd()
    }
}

impl std::os::fd::AsFd for UdpSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.src.as_fd()
    }
}
