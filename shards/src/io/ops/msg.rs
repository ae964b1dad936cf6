//! Datagrams with addresses: `recv_from` (`RECVMSG` / `recvfrom`) and `send_to` (`SENDMSG` /
//! `sendto`), owned buffers. A connected socket's `send` is `rw::send_datagram`.

use std::{io, mem::MaybeUninit};

use io_uring::{opcode, types};
use socket2::SockAddr;

use super::{backend_or_give_back, cvt, submit};
use crate::io::{
    epoll::Dir,
    source::{ready, Source},
    uring::{nothing_moved, result, Op},
    BufResult, Driver, IoBuf, IoBufMut,
};

/// The kernel-visible part of a message operation, boxed so its address is stable.
pub(crate) struct MsgHdr {
    hdr: libc::msghdr,
    iov: libc::iovec,
    addr: MaybeUninit<libc::sockaddr_storage>,
}

fn boxed_hdr(ptr: *mut u8, len: usize) -> Box<MsgHdr> {
    let mut m = Box::new(MsgHdr {
        // SAFETY: an all-zero msghdr is a valid empty header.
        hdr: unsafe { std::mem::zeroed() },
        iov: libc::iovec {
            iov_base: ptr.cast(),
            iov_len: len,
        },
        addr: MaybeUninit::zeroed(),
    });
    m.hdr.msg_iov = &mut m.iov;
    m.hdr.msg_iovlen = 1;
    m.hdr.msg_name = m.addr.as_mut_ptr().cast();
    m.hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    m
}

/// Receives one datagram on epoll: a readiness future making `recvfrom` calls into the `len`
/// bytes at `ptr` (a buffer the caller owns and keeps in place until the future is done or
/// dropped; a longer datagram is truncated to it), giving its length and sender. Dropped
/// before it resolves, it took nothing (epoll.rs rule 4). The io_uring half is
/// [`submit_recv_from`].
pub(crate) fn ready_recv_from(
    src: &Source,
    ptr: *mut u8,
    len: usize,
) -> impl std::future::Future<Output = io::Result<(usize, SockAddr)>> + '_ {
    ready(src, Dir::Read, move |fd| {
        let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
        let mut alen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: `ptr` points at `len` writable bytes of a buffer the caller keeps in place
        // while this future lives; `storage` and `alen` are live locals.
        let n = cvt(unsafe {
            libc::recvfrom(
                fd,
                ptr.cast(),
                len,
                0,
                storage.as_mut_ptr().cast(),
                &mut alen,
            )
        })?;
        // SAFETY: recvfrom wrote an address of `alen` bytes.
        Ok((n as usize, unsafe {
            SockAddr::new(storage.assume_init(), alen)
        }))
    })
}

/// A submitted `RECVMSG`: its buffer and header, kept by the driver while the kernel has them.
pub(crate) type RecvOp<B> = Op<(B, Box<MsgHdr>)>;

/// Receives one datagram on io_uring: submits the `RECVMSG` into `buf` and hands back its
/// `Op` (a socket keeps one whose future was dropped unfinished: `net/udp.rs`). Its result goes
/// through [`received_from`].
pub(crate) fn submit_recv_from<B: IoBufMut>(
    src: &Source,
    mut buf: B,
) -> Result<RecvOp<B>, (io::Error, B)> {
    let fd = src.fd();
    let hdr = boxed_hdr(buf.stable_mut_ptr(), buf.bytes_total());
    submit((buf, hdr), |(_, h)| {
        opcode::RecvMsg::new(types::Fd(fd), &mut h.hdr).build()
    })
    .map_err(|(e, (b, _))| (e, b))
}

/// A completed `RECVMSG`'s result: the datagram's length (as received, at most the buffer's
/// capacity) and its sender.
pub(crate) fn received_from(res: i32, h: &MsgHdr) -> io::Result<(usize, SockAddr)> {
    result(res).map(|n| {
        // SAFETY: the kernel wrote an address of `msg_namelen` bytes (the operation completed
        // with success).
        let addr = unsafe { SockAddr::new(h.addr.assume_init(), h.hdr.msg_namelen) };
        (n as usize, addr)
    })
}

/// Sends `buf[..bytes_init()]` as one datagram to `addr`.
pub(crate) async fn send_to<B: IoBuf>(
    src: &Source,
    mut buf: B,
    mut addr: SockAddr,
) -> BufResult<usize, B> {
    // Again after a shutdown-cancelled send (`nothing_moved`), on the current loop's driver.
    loop {
        let kind = backend_or_give_back!(buf);
        match kind {
            Driver::IoUring => {
                let fd = src.fd();
                let mut hdr = boxed_hdr(buf.stable_ptr() as *mut u8, buf.bytes_init());
                let boxed = Box::new(addr);
                hdr.hdr.msg_name = boxed.as_ptr() as *mut libc::c_void;
                hdr.hdr.msg_namelen = boxed.len();
                let op = submit((buf, hdr, boxed), |(_, h, _)| {
                    opcode::SendMsg::new(types::Fd(fd), &h.hdr)
                        .flags(libc::MSG_NOSIGNAL as u32)
                        .build()
                });
                match op {
                    Ok(op) => {
                        let (res, (b, _, a)) = op.await;
                        if nothing_moved(res) {
                            // See `nothing_moved`: a datagram goes whole or not at all.
                            (buf, addr) = (b, *a);
                            continue;
                        }
                        return (result(res).map(|n| n as usize), b);
                    }
                    Err((e, (b, _, _))) => return (Err(e), b),
                }
            }
            Driver::Epoll => {
                let (ptr, len) = (buf.stable_ptr(), buf.bytes_init());
                let res = ready(src, Dir::Write, |fd| {
                    // SAFETY: `ptr` points at `len` initialized bytes of the owned buffer; `addr`
                    // is a live address of `len()` bytes.
                    cvt(unsafe {
                        libc::sendto(
                            fd,
                            ptr.cast(),
                            len,
                            libc::MSG_NOSIGNAL,
                            addr.as_ptr().cast(),
                            addr.len(),
                        )
                    })
                    .map(|n| n as usize)
                })
                .await;
                return (res, buf);
            }
        }
    }
}
