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
///
/// On io_uring a submission the kernel refuses for now (`EAGAIN`, `EBUSY` from
/// `io_uring_enter` with a full submission queue) waits in the driver for its next enter
/// (`uring.rs`, rule 1), as a connect on epoll never fails that way.
///
/// On io_uring a `CONNECT` cut by its driver's shutdown (`-ECANCELED`: the future outlived its
/// loop, a `LocalExecutor::block_on` that returned while it waited) is no answer: the
/// socket's handshake goes on in the kernel, so the call goes on too, on the loop that polls
/// it now, as on epoll (see [`nothing_moved`](crate::io::uring::nothing_moved)). Connecting
/// again answers where the handshake stands: `EALREADY` while it runs (the call then waits for
/// writability and asks again), its outcome once it ended, `EISCONN` if an earlier ask
/// already took it (connected).
pub(crate) async fn connect(src: &Source, addr: SockAddr) -> io::Result<()> {
    // A connect of this call was cut by its driver's shutdown: the handshake may run.
    let mut resumed = false;
    loop {
        match backend()? {
            Driver::IoUring => {
                let fd = src.fd();
                let op = submit(Box::new(addr.clone()), |a| {
                    opcode::Connect::new(types::Fd(fd), a.as_ptr().cast(), a.len()).build()
                })
                .map_err(|(e, _)| e)?;
                let (res, _addr) = op.await;
                if res == -libc::ECANCELED {
                    resumed = true;
                    continue;
                }
                if resumed && res == -libc::EISCONN {
                    return Ok(());
                }
                if resumed && res == -libc::EALREADY {
                    // Still under way: wait for its end (writable, or an error), then ask.
                    let (res, ()) = super::poll_add(fd, libc::POLLOUT)?.await;
                    if res < 0 && res != -libc::ECANCELED {
                        return result(res).map(drop);
                    }
                    continue;
                }
                return result(res).map(drop);
            }
            Driver::Epoll => {
                // SAFETY: `addr` is a live socket address of `len()` bytes.
                let rc = unsafe { libc::connect(src.fd(), addr.as_ptr().cast(), addr.len()) };
                if rc == 0 {
                    return Ok(());
                }
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINPROGRESS) => {}
                    // Resumed from a cut io_uring `CONNECT` (above).
                    Some(libc::EALREADY) if resumed => {}
                    Some(libc::EISCONN) if resumed => return Ok(()),
                    _ => return Err(err),
                }
                // Writable = the handshake ended; SO_ERROR says how.
                return ready(src, Dir::Write, |fd| {
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
                            // handshake runs). Interrupted: ask again (an edge already
                            // reported would not come back to a wait).
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
                .await;
            }
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
