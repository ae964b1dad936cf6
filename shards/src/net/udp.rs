//! UDP: [`UdpSocket`].

use std::{
    io,
    net::SocketAddr,
    os::fd::{AsRawFd, OwnedFd, RawFd},
};

use socket2::{Domain, SockRef, Socket, Type};

use super::{each_addr, ip_addr, tcp::BorrowedRaw};
use crate::io::{ops::msg, source::Source, BufResult, IoBuf, IoBufMut};

/// A UDP socket on the current loop's driver. `!Send`.
#[derive(Debug)]
pub struct UdpSocket {
    src: Source,
}

impl UdpSocket {
    /// Binds a socket (synchronous). Port 0 picks a free port.
    pub fn bind(addr: impl std::net::ToSocketAddrs) -> io::Result<UdpSocket> {
        each_addr(addr, |a| {
            let s = Socket::new(Domain::for_address(a), Type::DGRAM.nonblocking(), None)?;
            s.bind(&a.into())?;
            Ok(s)
        })
        .map(|s| UdpSocket {
            src: Source::new(OwnedFd::from(s)),
        })
    }

    /// Sends `buf[..len]` as one datagram to `addr`; returns the bytes sent. Cost: one
    /// `SENDMSG` submission, or one `sendto`.
    pub async fn send_to<B: IoBuf>(&self, buf: B, addr: SocketAddr) -> BufResult<usize, B> {
        msg::send_to(&self.src, buf, addr.into()).await
    }

    /// Receives one datagram into `buf` from its start (a `Vec`'s length becomes its size; a
    /// datagram longer than the capacity is truncated) and the sender's address. Cost: one
    /// `RECVMSG` submission, or one `recvfrom` plus an `epoll_ctl` when none is waiting.
    pub async fn recv_from<B: IoBufMut>(&self, buf: B) -> BufResult<(usize, SocketAddr), B> {
        let (res, buf) = msg::recv_from(&self.src, buf).await;
        (res.and_then(|(n, a)| Ok((n, ip_addr(&a)?))), buf)
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        ip_addr(&SockRef::from(&BorrowedRaw(self.src.fd())).local_addr()?)
    }

    /// Wraps a `std` socket (switched to non-blocking mode).
    pub fn from_std(s: std::net::UdpSocket) -> io::Result<UdpSocket> {
        s.set_nonblocking(true)?;
        Ok(UdpSocket {
            src: Source::new(OwnedFd::from(s)),
        })
    }

    /// Unwraps into a `std` socket (left non-blocking).
    pub fn into_std(self) -> std::net::UdpSocket {
        std::net::UdpSocket::from(self.src.into_fd())
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.src.fd()
    }
}
