//! Stream reads and writes with owned buffers: `recv` into a buffer's start, `send` from an
//! offset of a buffer. A registered buffer ([`FixedBuf`](crate::io::FixedBuf)) is a plain
//! buffer on a socket, on io_uring too: a `RECV` into it and a `SEND` from it with
//! `MSG_NOSIGNAL`. `WRITE_FIXED` on a socket is a `write(2)`, which raises `SIGPIPE` when the
//! peer is gone; and `READ_FIXED` on a non-blocking socket (xtc's are) answers `EAGAIN` at once
//! on kernels before 5.15, which io_uring then did not retry when data came: the read was
//! submitted again every loop turn, a loop spinning at full CPU while a connection sat idle.
//! A socket receive copies from the kernel's buffers either way, so the registration saved
//! nothing there; it serves files (`file.rs`).

use std::io;

use io_uring::{opcode, types};

use super::{backend_or_give_back, cvt, submit};
use crate::io::{
    epoll::Dir,
    source::{ready_stream, Source},
    uring::{nothing_moved, result, Op},
    BufResult, Driver, IoBuf, IoBufMut,
};

/// A socket transfer's length for io_uring: at most what one `read(2)`/`write(2)` moves
/// (`MAX_RW`), as the epoll path's `recv`/`send` are cut by the kernel. Cut to `u32::MAX`
/// instead, a buffer of 2 GiB or more failed: the kernel refuses a `RECV`/`SEND` over
/// `INT_MAX` bytes with `EINVAL` (an oversized datagram then read as a bad argument, not
/// `EMSGSIZE`).
fn clamp(n: usize) -> u32 {
    n.min(super::file::MAX_RW) as u32
}

/// Reads into `buf` from its start, up to its capacity; sets its initialized length to the
/// count read (0 = end of stream).
pub(crate) async fn recv<B: IoBufMut>(src: &Source, mut buf: B) -> BufResult<usize, B> {
    if buf.bytes_total() == 0 {
        // As `std`'s `read` of an empty slice: at once, on both drivers (io_uring would wait
        // for data, then report 0, which reads as the end of the stream).
        return (Ok(0), buf);
    }
    let kind = backend_or_give_back!(buf);
    let res = match kind {
        // Not reached from a stream's `read`, which submits its own receive on io_uring (the
        // stream keeps one whose read was dropped); here for any other caller, with the same
        // rule as `send_on`.
        Driver::IoUring => loop {
            match submit_recv(src, buf) {
                Ok(op) => {
                    let (res, b) = op.await;
                    buf = b;
                    if nothing_moved(res) {
                        // See `nothing_moved`: cancelled by a driver's shutdown, or given up
                        // by io-wq; nothing was received, so receive again on this loop.
                        continue;
                    }
                    break result(res).map(|n| n as usize);
                }
                Err((e, b)) => return (Err(e), b),
            }
        },
        Driver::Epoll => {
            let (ptr, len) = (buf.stable_mut_ptr(), buf.bytes_total());
            ready_stream(src, Dir::Read, len, |fd| {
                // SAFETY: `ptr` points at `len` writable bytes of `buf`, which we own and do not
                // touch until this future ends.
                cvt(unsafe { libc::recv(fd, ptr.cast(), len, 0) }).map(|n| n as usize)
            })
            .await
        }
    };
    if let Ok(n) = res {
        // SAFETY: the kernel initialized the first `n <= bytes_total()` bytes.
        unsafe { buf.set_init(n) };
    }
    (res, buf)
}

/// The io_uring half of [`recv`]: submits the receive into `buf` and hands back its `Op`
/// (the stream keeps one whose future was dropped unfinished: `net/stream.rs`).
pub(crate) fn submit_recv<B: IoBufMut>(src: &Source, buf: B) -> Result<Op<B>, (io::Error, B)> {
    let fd = src.fd();
    // A `RECV` for a registered buffer too (module doc).
    submit(buf, |b| {
        let (ptr, len) = (b.stable_mut_ptr(), clamp(b.bytes_total()));
        opcode::Recv::new(types::Fd(fd), ptr, len).build()
    })
}

/// Writes `buf[from..bytes_init()]` once; returns how many bytes went out.
pub(crate) async fn send<B: IoBuf>(src: &Source, buf: B, from: usize) -> BufResult<usize, B> {
    send_on(src, buf, from, false).await
}

/// Sends `buf[..bytes_init()]` as one datagram to a connected socket's peer. Unlike a stream's,
/// an empty one is a datagram, which a full socket refuses (`EAGAIN`) as any other: it waits
/// for room like any other (a stream's empty send returned that `EAGAIN` on epoll, where
/// io_uring waits).
pub(crate) async fn send_datagram<B: IoBuf>(src: &Source, buf: B) -> BufResult<usize, B> {
    send_on(src, buf, 0, true).await
}

/// [`send`], and with `datagram` [`send_datagram`]: the two differ only in an empty send on
/// epoll, which a stream makes without waiting.
async fn send_on<B: IoBuf>(
    src: &Source,
    mut buf: B,
    from: usize,
    datagram: bool,
) -> BufResult<usize, B> {
    let from = from.min(buf.bytes_init());
    loop {
        let kind = backend_or_give_back!(buf);
        match kind {
            Driver::IoUring => {
                let fd = src.fd();
                // No WRITE_FIXED for a registered buffer: on a socket it is a write(2), which
                // raises SIGPIPE at a closed peer (module doc).
                let op = submit(buf, |b| {
                    // SAFETY: `from <= bytes_init()`, so the pointer stays inside the buffer.
                    let ptr = unsafe { b.stable_ptr().add(from) };
                    let len = clamp(b.bytes_init() - from);
                    opcode::Send::new(types::Fd(fd), ptr, len)
                        .flags(libc::MSG_NOSIGNAL)
                        .build()
                });
                match op {
                    Ok(op) => {
                        // Dropped here, the `Op` is cancelled; a `SEND` that completed first,
                        // or beats the cancel, sent bytes whose count goes with the future (no
                        // one is left to report it to). The public `write` and `write_all`
                        // document it: a caller that writes the same bytes again after such a
                        // drop may send them twice.
                        let (res, b) = op.await;
                        buf = b;
                        if nothing_moved(res) {
                            // See `nothing_moved`: without `MSG_WAITALL` a send that moved
                            // bytes completes with their count.
                            continue;
                        }
                        return (result(res).map(|n| n as usize), buf);
                    }
                    Err((e, b)) => return (Err(e), b),
                }
            }
            Driver::Epoll => {
                // SAFETY: `from <= bytes_init()`.
                let ptr = unsafe { buf.stable_ptr().add(from) };
                let len = buf.bytes_init() - from;
                if len == 0 && !datagram {
                    // An empty send never waits, as on io_uring (whose `SEND` of 0 bytes the
                    // kernel answers at once: 0, or the socket's error). Through readiness it
                    // hung on a full socket: a drained write interest waits for room that an
                    // idle peer never makes.
                    // SAFETY: a zero-length send reads no byte of `ptr`.
                    let res =
                        cvt(unsafe { libc::send(src.fd(), ptr.cast(), 0, libc::MSG_NOSIGNAL) });
                    return (res.map(|n| n as usize), buf);
                }
                let res = ready_stream(src, Dir::Write, len, |fd| {
                    // SAFETY: `ptr` points at `len` initialized bytes of `buf`, which we own.
                    cvt(unsafe { libc::send(fd, ptr.cast(), len, libc::MSG_NOSIGNAL) })
                        .map(|n| n as usize)
                })
                .await;
                return (res, buf);
            }
        }
    }
}

/// Writes all of `buf[..bytes_init()]`, completing partial writes.
pub(crate) async fn send_all<B: IoBuf>(src: &Source, mut buf: B) -> BufResult<(), B> {
    let mut done = 0;
    while done < buf.bytes_init() {
        let (res, b) = send(src, buf, done).await;
        buf = b;
        match res {
            Ok(0) => {
                return (
                    Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the peer accepted no more bytes",
                    )),
                    buf,
                )
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (Err(e), buf),
        }
    }
    (Ok(()), buf)
}
