//! `accept`: a connection from a listening socket, non-blocking and close-on-exec.

use std::{
    io,
    mem::MaybeUninit,
    os::fd::{FromRawFd, OwnedFd},
};

use io_uring::{opcode, types};
use socket2::SockAddr;

use super::{backend, cvt, submit};
use crate::io::{
    epoll::Dir,
    source::{ready, Source},
    uring::{nothing_moved, result},
    Driver,
};

const FLAGS: libc::c_int = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;

/// Accepts one connection: its descriptor and the peer's address.
pub(crate) async fn accept(src: &Source) -> io::Result<(OwnedFd, SockAddr)> {
    // Again after a shutdown-cancelled accept (`nothing_moved`), on the current loop's driver.
    loop {
        match backend()? {
            Driver::IoUring => {
                // Zeroed, not uninit: the kernel writes only the address's own length (16 or 28
                // bytes), and `assume_init` below reads the whole storage.
                let storage: Box<(MaybeUninit<libc::sockaddr_storage>, libc::socklen_t)> =
                    Box::new((
                        MaybeUninit::zeroed(),
                        std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
                    ));
                let fd = src.fd();
                let op = submit(storage, |s| {
                    opcode::Accept::new(types::Fd(fd), s.0.as_mut_ptr().cast(), &mut s.1)
                        .flags(FLAGS)
                        .build()
                })
                .map(|op| op.result_is_fd())
                .map_err(|(e, _)| e)?;
                let (res, storage) = op.await;
                if nothing_moved(res) {
                    // See `nothing_moved`: an accept that took a connection completes with it.
                    continue;
                }
                let fd = result(res)?;
                // SAFETY: the kernel returned a fresh descriptor that we now own.
                let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
                // SAFETY: `storage.0` was zeroed (every byte initialized, a valid `sockaddr_storage`)
                // and the kernel wrote a socket address of `storage.1` bytes over its start.
                let addr = unsafe { SockAddr::new(storage.0.assume_init(), storage.1) };
                return Ok((fd, addr));
            }
            Driver::Epoll => {
                return ready(src, Dir::Read, |fd| {
                    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
                    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                    // SAFETY: `storage` and `len` are live locals sized for any address.
                    let nfd = cvt(unsafe {
                        libc::accept4(fd, storage.as_mut_ptr().cast(), &mut len, FLAGS)
                    })?;
                    // SAFETY: accept4 returned a fresh descriptor that we now own, and wrote an
                    // address of `len` bytes.
                    Ok(unsafe {
                        (
                            OwnedFd::from_raw_fd(nfd),
                            SockAddr::new(storage.assume_init(), len),
                        )
                    })
                })
                .await;
            }
        }
    }
}
