//! `connect` of a non-blocking socket.

use std::io;

use io_uring::{opcode, types};
use socket2::SockAddr;

use super::{backend, submit};
use crate::io::{
    epoll::Dir,
    source::{ready, Source},
    uring::result,
    Driver,
};

/// Connects `src` to `addr`.
pub(crate) async fn connect(src: &Source, addr: SockAddr) -> io::Result<()> {
    match backend()? {
        Driver::IoUring => {
            let fd = src.fd();
            let op = submit(Box::new(addr), |a| {
                opcode::Connect::new(types::Fd(fd), a.as_ptr().cast(), a.len()).build()
            })
            .map_err(|(e, _)| e)?;
            let (res, _addr) = op.await;
            result(res).map(drop)
        }
        Driver::Epoll => {
            // SAFETY: `addr` is a live socket address of `len()` bytes.
            let rc = unsafe { libc::connect(src.fd(), addr.as_ptr().cast(), addr.len()) };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(err);
            }
            // Writable = the handshake ended; SO_ERROR says how.
            ready(src, Dir::Write, |fd| {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                loop {
                    // SAFETY: a live local pollfd; zero timeout.
                    match unsafe { libc::poll(&mut pfd, 1, 0) } {
                        0 => return Err(io::ErrorKind::WouldBlock.into()),
                        // A failed poll is not "connected" (SO_ERROR stays 0 while the
                        // handshake runs). Interrupted: ask again (an edge already reported
                        // would not come back to a wait).
                        rc if rc < 0 => {
                            let e = io::Error::last_os_error();
                            if e.kind() != io::ErrorKind::Interrupted {
                                return Err(e);
                            }
                        }
                        _ => break,
                    }
                }
                take_error(fd)
            })
            .await
        }
    }
}

/// `SO_ERROR` of `fd`: `Ok` if none.
pub(crate) fn take_error(fd: i32) -> io::Result<()> {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `err` and `len` are live locals of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut err as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if err != 0 {
        return Err(io::Error::from_raw_os_error(err));
    }
    Ok(())
}
