//! UDP: [`UdpSocket`].

use std::{
    cell::RefCell,
    future::{poll_fn, Future},
    io,
    mem::MaybeUninit,
    net::SocketAddr,
    os::fd::{AsRawFd, OwnedFd, RawFd},
    pin::Pin,
    task::{ready, Context, Poll},
};

use socket2::{Domain, SockAddr, SockRef, Socket, Type};

use super::{each_addr, ip_addr, tcp::BorrowedRaw};
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
    /// branch won): their receives are kept here rather than cancelled, so a datagram the
    /// kernel already gave one is not lost; the next `recv_from` takes the oldest over (see
    /// `KeepOnDrop` for which are kept). Declared before `src`: dropped (cancelled) before the
    /// descriptor closes.
    stray: RefCell<std::collections::VecDeque<Box<dyn StrayRecv>>>,
    /// `recv_from` receives in flight: a dropped one is kept only when no other is (else the
    /// kernel may give the next datagram to the kept one while the other, already in the
    /// kernel, waits for one more: a request/response exchange would hang).
    recvs: std::cell::Cell<usize>,
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
    /// Nobody waits for it until a `recv_from` takes it over (`Op::unwait`).
    fn unwait(&self);
    /// Its completion has been reaped (it holds a datagram, or an error).
    fn is_done(&self) -> bool;
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
            // SAFETY: the kernel wrote the datagram's first `n <= bytes_total()` bytes at the
            // buffer's stable mutable pointer, where the receive was submitted
            // (`msg::submit_recv_from`; `stable_ptr` may be another view), and the completion
            // was reaped before this result.
            let got = unsafe { std::slice::from_raw_parts(buf.stable_mut_ptr(), n) };
            for (d, &b) in dst.iter_mut().zip(got) {
                d.write(b);
            }
            (n, addr)
        });
        // A user buffer's `Drop` is user code.
        crate::task::guarded("an I/O buffer panicked while being dropped", || drop(buf));
        Poll::Ready(r)
    }

    fn unwait(&self) {
        Op::unwait(self);
    }

    fn is_done(&self) -> bool {
        self.completed().is_some()
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

/// A receive a `recv_from` future waits for, counted in the socket's `recvs` until it is
/// taken ([`done`](Self::done)) or dropped. Dropped unfinished, it is kept in the socket's
/// `stray` queue if its datagram has arrived, or if it is the socket's only receive; else it
/// is cancelled (two concurrent receives: which gets a datagram is arbitrary anyway).
struct KeepOnDrop<'a, R: IntoStray> {
    socket: &'a UdpSocket,
    op: Option<R>,
}

impl<'a, R: IntoStray> KeepOnDrop<'a, R> {
    fn new(socket: &'a UdpSocket, op: R) -> Self {
        socket.recvs.set(socket.recvs.get() + 1);
        KeepOnDrop {
            socket,
            op: Some(op),
        }
    }

    /// The receive's result was taken.
    fn done(&mut self) {
        self.op = None;
        self.socket.recvs.set(self.socket.recvs.get() - 1);
    }
}

impl<R: IntoStray> Drop for KeepOnDrop<'_, R> {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else { return };
        let left = self.socket.recvs.get() - 1;
        self.socket.recvs.set(left);
        let op = op.into_stray();
        if left > 0
            || self
                .socket
                .stray
                .try_borrow()
                .map_or(true, |k| !k.is_empty())
        {
            // It can be kept only if it already holds a datagram: completions the loop has
            // not reaped yet count too.
            crate::io::reap_now();
        }
        // A receive that already holds its datagram is kept whatever else is in flight
        // (datagrams may come in any order; dropping it would lose one). One still in the
        // kernel only when it is the last, as the socket's only kept one.
        let socket = self.socket;
        let keep = |op: &dyn StrayRecv| {
            op.is_done()
                || (socket.recvs.get() == 0
                    && socket.stray.try_borrow().is_ok_and(|k| k.is_empty()))
        };
        if !keep(&*op) {
            return;
        }
        // A done receive goes behind the kept ones that are done (older datagrams) and ahead
        // of any still in the kernel: its reap, just above, woke its waker, and that drop
        // (user code) may have left a newer receive kept in the kernel, which the next
        // `recv_from` would otherwise wait on while this one held the datagram. Its waker is
        // gone, so forgetting it runs no user code.
        if op.is_done() {
            op.unwait();
            keep_done(socket, op);
            return;
        }
        // Kept as the socket's only receive, still in the kernel. Forgetting its waker drops
        // it, outside the `stray` borrow: that drop is user code, which may use this socket
        // (receives of its own, kept now: newer than this one) and may reap, completing this
        // one. Done by then, it goes first, or the next `recv_from` waited on a newer receive
        // while this one held the datagram; still in the kernel, it stays only if it is still
        // the only one.
        op.unwait();
        crate::io::reap_now();
        if op.is_done() {
            keep_done(socket, op);
        } else if let Ok(mut kept) = socket.stray.try_borrow_mut() {
            if socket.recvs.get() == 0 && kept.is_empty() {
                kept.push_back(op);
            }
        }
    }
}

/// Keeps a dropped receive that holds its datagram: behind the kept ones that are done, ahead
/// of any still in the kernel.
fn keep_done(socket: &UdpSocket, op: Box<dyn StrayRecv>) {
    if let Ok(mut kept) = socket.stray.try_borrow_mut() {
        let at = kept.iter().position(|k| !k.is_done()).unwrap_or(kept.len());
        kept.insert(at, op);
    }
}

impl UdpSocket {
    /// Binds a socket (synchronous). Port 0 picks a free port.
    pub fn bind(addr: impl std::net::ToSocketAddrs) -> io::Result<UdpSocket> {
        each_addr(addr, |a| {
            let s = Socket::new(Domain::for_address(a), Type::DGRAM.nonblocking(), None)?;
            s.bind(&a.into())?;
            Ok(s)
        })
        .map(|s| UdpSocket::new(OwnedFd::from(s)))
    }

    /// Sends `buf[..len]` as one datagram to `addr`; returns the bytes sent. Cost: one
    /// `SENDMSG` submission, or one `sendto`.
    pub async fn send_to<B: IoBuf>(&self, buf: B, addr: SocketAddr) -> BufResult<usize, B> {
        msg::send_to(&self.src, buf, addr.into()).await
    }

    fn new(fd: OwnedFd) -> UdpSocket {
        UdpSocket {
            stray: RefCell::new(std::collections::VecDeque::new()),
            recvs: std::cell::Cell::new(0),
            src: Source::new(fd),
        }
    }

    /// Receives one datagram into `buf` from its start (a `Vec`'s length becomes its size; a
    /// datagram longer than the capacity is truncated) and the sender's address. Dropping the
    /// future before it resolves loses no datagram on either driver: on io_uring the socket
    /// keeps the receive it submitted running, and the next `recv_from` takes it over. A
    /// datagram the kept receive already got comes back as it got it, truncated to the dropped
    /// buffer's capacity if that was smaller; the dropped buffer (a
    /// [`FixedBuf`](crate::io::FixedBuf) too) is held until then. A receive dropped still in
    /// the kernel while another is in flight is cancelled instead, as before. Cost:
    /// one `RECVMSG` submission, or one `recvfrom` (the socket joins the loop's epoll set
    /// once, at its first wait); a dropped receive costs a boxed handle.
    pub async fn recv_from<B: IoBufMut>(&self, buf: B) -> BufResult<(usize, SocketAddr), B> {
        let (res, buf) = self.recv_raw(buf).await;
        (res.and_then(|(n, a)| Ok((n, ip_addr(&a)?))), buf)
    }

    async fn recv_raw<B: IoBufMut>(&self, mut buf: B) -> BufResult<(usize, SockAddr), B> {
        // Each turn takes a kept receive's datagram, or receives afresh; a receive cancelled by
        // a driver's shutdown (nothing taken) starts the next turn.
        'fresh: loop {
            loop {
                let Some(stray) = self.stray.borrow_mut().pop_front() else {
                    break;
                };
                // Taken over: this future waits for it now (and gives it back if dropped too).
                let mut keep = KeepOnDrop::new(self, stray);
                let res = poll_fn(|cx| {
                    let op = keep.op.as_mut().expect("present until it completes");
                    let (ptr, len) = (buf.stable_mut_ptr(), buf.bytes_total());
                    // SAFETY: `buf` owns `len` writable bytes at its stable pointer, borrowed for
                    // this call only; as `MaybeUninit` nothing is read from them.
                    let dst = unsafe { std::slice::from_raw_parts_mut(ptr.cast(), len) };
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
                return msg::recv_from(&self.src, buf).await;
            }
            let op = match msg::submit_recv_from(&self.src, buf) {
                Ok(op) => op,
                Err((e, b)) => return (Err(e), b),
            };
            let mut keep = KeepOnDrop::new(self, op);
            let (res, (b, h)) = poll_fn(|cx| {
                Pin::new(keep.op.as_mut().expect("present until it completes")).poll(cx)
            })
            .await;
            keep.done();
            buf = b;
            if nothing_moved(res) {
                // Cancelled by the shutdown of the driver it was submitted to (this future
                // outlived its loop, uring.rs rule 5): no datagram was taken, so it is received
                // again on the current loop, as a kept receive is (above) and as epoll would.
                continue 'fresh;
            }
            let res = msg::received_from(res, &h);
            if let Ok((n, _)) = &res {
                // SAFETY: the kernel initialized the first `n <= bytes_total()` bytes.
                unsafe { buf.set_init(*n) };
            }
            return (res, buf);
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        ip_addr(&SockRef::from(&BorrowedRaw(self.src.fd())).local_addr()?)
    }

    /// Wraps a `std` socket (switched to non-blocking mode).
    pub fn from_std(s: std::net::UdpSocket) -> io::Result<UdpSocket> {
        s.set_nonblocking(true)?;
        Ok(UdpSocket::new(OwnedFd::from(s)))
    }

    /// Unwraps into a `std` socket (left non-blocking).
    pub fn into_std(self) -> std::net::UdpSocket {
        let UdpSocket { stray, src, .. } = self;
        // Cancelled before the descriptor changes hands (a datagram it already took is lost,
        // as one still in flight would be).
        drop(stray);
        std::net::UdpSocket::from(src.into_fd())
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.src.fd()
    }
}
